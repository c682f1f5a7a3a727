/*
 * test_native.c — what only C can check: the _Static_asserts compile, no read beyond
 * struct_size (guard page), ring conservation under 4 pthreads with a concurrent consumer,
 * progress coalescing, rejects, no callback after operation end, cross-process wake.
 * Built with -fsanitize=address,undefined by `make -C native test`.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "skippy/skippy_event.h"
#include "skippy/skippy_ingress.h"
#include "skippy_internal.h" /* only to scribble the shared header in one test */

/* The headers' _Static_asserts are compiled here too; a few cross-checks on top. */
_Static_assert(sizeof(skippy_runtime_event_v1) == SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE, "full");
_Static_assert(offsetof(skippy_runtime_event_v1, numeric_summary_0) ==
                   SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE,
               "base");
_Static_assert(sizeof(skippy_runtime_event_reporter_v1) == 24, "reporter");
_Static_assert(sizeof(skippy_native_fact_v1) == 448, "fact");
_Static_assert(SKIPPY_FEATURE_RUNTIME_EVENTS == 0x1000000ull, "feature bit 24");
_Static_assert(SKIPPY_FEATURE_UNLOAD_EVENTS == (1ull << 36), "feature bit 36");

#include "check.h"

typedef struct region {
    void *mem;
    size_t size;
    skippy_ingress_t *ingress;
} region;

static region region_new(uint32_t terminal, uint32_t diagnostic, uint32_t progress,
                         uint32_t debug) {
    skippy_ingress_config_v1 cfg = {sizeof(cfg), terminal, diagnostic, progress, debug, 0};
    region r;
    r.size = skippy_ingress_required_size(&cfg);
    /* MAP_SHARED so a forked child writes into the very same pages. */
    r.mem = mmap(NULL, r.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (r.mem == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    r.ingress = skippy_ingress_init(r.mem, r.size, &cfg);
    if (r.ingress == NULL) {
        fprintf(stderr, "skippy_ingress_init failed\n");
        exit(2);
    }
    return r;
}

static void region_free(region *r) {
    skippy_ingress_detach(r->ingress);
    munmap(r->mem, r->size);
}

static skippy_runtime_event_v1 make_event(uint32_t category, uint32_t kind) {
    skippy_runtime_event_v1 ev;
    memset(&ev, 0, sizeof(ev));
    ev.abi_version = SKIPPY_RUNTIME_EVENT_ABI_VERSION;
    ev.struct_size = SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE;
    ev.category = category;
    ev.kind = kind;
    return ev;
}

static skippy_ingress_stats_v1 stats_of(skippy_ingress_t *ing) {
    skippy_ingress_stats_v1 s;
    skippy_ingress_stats(ing, &s);
    return s;
}

static uint64_t sum_accepted(const skippy_ingress_stats_v1 *s) {
    return s->lanes[0].accepted + s->lanes[1].accepted + s->lanes[2].accepted;
}

static uint64_t sum_rejected(const skippy_ingress_stats_v1 *s) {
    return s->rejected_abi_version + s->rejected_struct_size + s->rejected_detail +
           s->rejected_discriminant + s->rejected_closed;
}

static void check_lane_conservation(const skippy_ingress_stats_v1 *s) {
    for (int l = 0; l < SKIPPY_LANE_COUNT; l++)
        CHECK_EQ(s->lanes[l].accepted,
                 s->lanes[l].drained + s->lanes[l].dropped_full + s->lanes[l].coalesced);
}

static size_t drain_all(skippy_ingress_t *ing, skippy_native_fact_v1 *buf, size_t cap) {
    size_t total = 0, n;
    while ((n = skippy_ingress_drain(ing, buf, cap)) > 0) total += n;
    return total;
}

static void test_init_attach(void) {
    region r = region_new(0, 0, 0, 0);
    skippy_ingress_t *second = skippy_ingress_attach(r.mem, r.size);
    CHECK(second != NULL && second != r.ingress);
    skippy_ingress_detach(second);
    CHECK(skippy_ingress_attach(r.mem, r.size - 1) == NULL);
    CHECK(skippy_ingress_attach((char *)r.mem + 64, r.size - 64) == NULL);
    skippy_ingress_config_v1 bad = {sizeof(bad), 1000, 0, 0, 0, 0}; /* not a power of two */
    CHECK_EQ(skippy_ingress_required_size(&bad), 0);
    skippy_ingress_config_v1 short_cfg = {8, 0, 0, 0, 0, 0};
    CHECK_EQ(skippy_ingress_required_size(&short_cfg), 0);
    CHECK(skippy_ingress_required_size(NULL) > 0);
    CHECK_EQ(skippy_native_abi_version(), 1);
    CHECK_EQ(skippy_ingress_abi_version(), 1);
    CHECK_EQ(skippy_native_features(),
             SKIPPY_FEATURE_RUNTIME_EVENTS | SKIPPY_FEATURE_RUNTIME_EVENT_REPORTER |
                 SKIPPY_FEATURE_DEVICE_EVENTS | SKIPPY_FEATURE_DIAGNOSTIC_EVENTS);
    size_t count = 0;
    const skippy_abi_field_v1 *fields = skippy_abi_fields(&count);
    CHECK(count > 50);
    CHECK(strcmp(fields[0].struct_name, "skippy_runtime_event_v1") == 0);
    CHECK_EQ(fields[0].size, 144);
    region_free(&r);
}

static void test_accept_and_copy(void) {
    region r = region_new(0, 0, 0, 0);
    skippy_adapter_t *a = skippy_adapter_create(r.ingress, 0);
    skippy_runtime_event_reporter_v1 rep;
    skippy_adapter_reporter(a, &rep);
    CHECK(rep.callback == skippy_trampoline_v1 && rep.user_data == a && rep.struct_size == 24);

    char detail[1000];
    memset(detail, 'x', sizeof(detail));
    skippy_runtime_event_v1 ev = make_event(SKIPPY_CATEGORY_MODEL_OPEN,
                                            SKIPPY_KIND_MODEL_OPEN_STARTED);
    ev.detail_ptr = detail;
    ev.detail_len = sizeof(detail);
    ev.numeric_summary_2 = 77;
    CHECK_EQ(skippy_operation_begin(a, 42, 7), SKIPPY_STATUS_OK);
    CHECK_EQ(skippy_operation_begin(a, 43, 7), SKIPPY_STATUS_INVALID_ARGUMENT);
    rep.callback(&ev, rep.user_data);
    skippy_operation_end(a);

    skippy_native_fact_v1 out[4];
    CHECK_EQ(skippy_ingress_drain(r.ingress, out, 4), 1);
    CHECK_EQ(out[0].lane, SKIPPY_LANE_TERMINAL);
    CHECK_EQ(out[0].operation_id, 42);
    CHECK_EQ(out[0].ingress_sequence, 1);
    CHECK_EQ(out[0].detail_copied_len, 256);
    CHECK(out[0].flags == (SKIPPY_FACT_HAS_SUMMARIES | SKIPPY_FACT_DETAIL_TRUNCATED));
    CHECK(out[0].event.detail_ptr == NULL);
    CHECK_EQ(out[0].event.detail_len, 1000);
    CHECK_EQ(out[0].event.numeric_summary_2, 77);
    CHECK_EQ(stats_of(r.ingress).detail_truncated, 1);
    skippy_adapter_destroy(a);
    region_free(&r);
}

/* A 112-byte event placed right before a PROT_NONE page: any read past struct_size faults. */
static void test_no_read_beyond_struct_size(void) {
    region r = region_new(0, 0, 0, 0);
    skippy_adapter_t *a = skippy_adapter_create(r.ingress, 0);
    long page = sysconf(_SC_PAGESIZE);
    char *pages = mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(pages != MAP_FAILED);
    CHECK(mprotect(pages + page, (size_t)page, PROT_NONE) == 0);
    skippy_runtime_event_v1 ev = make_event(SKIPPY_CATEGORY_KV, SKIPPY_KIND_KV_INITIALIZED);
    ev.struct_size = SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE;
    char *at = pages + page - SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE;
    memcpy(at, &ev, SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE);
    skippy_test_emit_raw(a, at);
    /* 8-byte event header only (struct_size 111: rejected after reading 8 bytes) */
    ev.struct_size = 111;
    memcpy(pages + page - 8, &ev, 8);
    skippy_test_emit_raw(a, pages + page - 8);
    /* unaligned producer buffer */
    ev.struct_size = SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE;
    memcpy(pages + 1, &ev, SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE);
    skippy_test_emit_raw(a, pages + 1);

    skippy_native_fact_v1 out[4];
    CHECK_EQ(skippy_ingress_drain(r.ingress, out, 4), 2);
    CHECK_EQ(out[0].flags & SKIPPY_FACT_HAS_SUMMARIES, 0);
    CHECK_EQ(out[0].source_struct_size, 112);
    CHECK_EQ(stats_of(r.ingress).rejected_struct_size, 1);
    munmap(pages, (size_t)page * 2);
    skippy_adapter_destroy(a);
    region_free(&r);
}

static void test_rejects(void) {
    region r = region_new(0, 0, 0, 0);
    skippy_adapter_t *a = skippy_adapter_create(r.ingress, 0);
    skippy_runtime_event_v1 ev = make_event(SKIPPY_CATEGORY_MODEL_OPEN, 1);
    ev.abi_version = 2;
    skippy_trampoline_v1(&ev, a);
    ev = make_event(SKIPPY_CATEGORY_MODEL_OPEN, 1);
    ev.struct_size = 111;
    skippy_trampoline_v1(&ev, a);
    skippy_trampoline_v1(NULL, a);
    ev = make_event(SKIPPY_CATEGORY_MODEL_OPEN, 1);
    ev.detail_len = SKIPPY_RUNTIME_EVENT_MAX_DETAIL_LEN + 1;
    ev.detail_ptr = "x";
    skippy_trampoline_v1(&ev, a);
    ev.detail_len = 4;
    ev.detail_ptr = NULL;
    skippy_trampoline_v1(&ev, a);
    ev = make_event(0, 1);
    skippy_trampoline_v1(&ev, a);
    ev = make_event(SKIPPY_CATEGORY_MODEL_OPEN, 9999);
    skippy_trampoline_v1(&ev, a);
    skippy_trampoline_v1(&ev, NULL); /* no adapter: nothing to count into, no crash */

    skippy_ingress_stats_v1 s = stats_of(r.ingress);
    CHECK_EQ(s.rejected_abi_version, 1);
    CHECK_EQ(s.rejected_struct_size, 2);
    CHECK_EQ(s.rejected_detail, 2);
    CHECK_EQ(s.rejected_discriminant, 1);
    CHECK_EQ(s.unknown_kind, 1);
    CHECK_EQ(s.lanes[SKIPPY_LANE_DIAGNOSTIC].accepted, 1);

    skippy_ingress_close(r.ingress);
    skippy_trampoline_v1(&ev, a);
    CHECK_EQ(stats_of(r.ingress).rejected_closed, 1);
    CHECK_EQ(skippy_ingress_wait(r.ingress, 1000), 1); /* closed, but a fact is pending */
    skippy_native_fact_v1 out[2];
    CHECK_EQ(skippy_ingress_drain(r.ingress, out, 2), 1);
    CHECK(out[0].flags & SKIPPY_FACT_UNKNOWN_KIND);
    CHECK_EQ(skippy_ingress_wait(r.ingress, 1000), -1);
    skippy_adapter_destroy(a);
    region_free(&r);
}

static void test_progress_coalescing(void) {
    region r = region_new(0, 0, 4, 0);
    skippy_adapter_t *a = skippy_adapter_create(r.ingress, 0);
    CHECK_EQ(skippy_operation_begin(a, 5, 0), SKIPPY_STATUS_OK);
    skippy_runtime_event_v1 ev = make_event(SKIPPY_CATEGORY_MODEL_OPEN,
                                            SKIPPY_KIND_MODEL_OPEN_PROGRESS);
    for (uint64_t v = 1; v <= 1000; v++) {
        ev.progress_current = v;
        skippy_trampoline_v1(&ev, a);
    }
    ev.progress_current = 500; /* regression */
    skippy_trampoline_v1(&ev, a);
    ev.progress_current = 1000; /* duplicate */
    skippy_trampoline_v1(&ev, a);
    skippy_native_fact_v1 out[8];
    CHECK_EQ(skippy_ingress_drain(r.ingress, out, 8), 1);
    CHECK_EQ(out[0].event.progress_current, 1000);
    CHECK_EQ(out[0].coalesced_count, 999);
    CHECK_EQ(out[0].lane, SKIPPY_LANE_PROGRESS);
    skippy_ingress_stats_v1 s = stats_of(r.ingress);
    CHECK_EQ(s.lanes[SKIPPY_LANE_PROGRESS].accepted, 1000);
    CHECK_EQ(s.lanes[SKIPPY_LANE_PROGRESS].coalesced, 999);
    CHECK_EQ(s.lanes[SKIPPY_LANE_PROGRESS].drained, 1);
    CHECK_EQ(s.suppressed_regression, 2);
    /* drained keys still suppress regressions while they keep their slot */
    ev.progress_current = 999;
    skippy_trampoline_v1(&ev, a);
    CHECK_EQ(stats_of(r.ingress).suppressed_regression, 3);
    skippy_operation_end(a);

    /* 4 slots: 4 distinct keys fit, the 5th is dropped while all are pending */
    for (uint64_t op = 10; op < 15; op++) {
        CHECK_EQ(skippy_operation_begin(a, op, 0), SKIPPY_STATUS_OK);
        ev.progress_current = 1;
        skippy_trampoline_v1(&ev, a);
        skippy_operation_end(a);
    }
    s = stats_of(r.ingress);
    CHECK_EQ(s.lanes[SKIPPY_LANE_PROGRESS].dropped_full, 1);
    CHECK_EQ(drain_all(r.ingress, out, 8), 4);
    /* drained slots are reused for new keys */
    CHECK_EQ(skippy_operation_begin(a, 99, 0), SKIPPY_STATUS_OK);
    skippy_trampoline_v1(&ev, a);
    skippy_operation_end(a);
    CHECK_EQ(drain_all(r.ingress, out, 8), 1);
    CHECK_EQ(out[0].operation_id, 99);
    s = stats_of(r.ingress);
    check_lane_conservation(&s);
    skippy_adapter_destroy(a);
    region_free(&r);
}

static void test_diagnostic_full_terminal_unaffected(void) {
    region r = region_new(16, 8, 0, 0);
    skippy_adapter_t *a = skippy_adapter_create(r.ingress, 0);
    skippy_runtime_event_v1 ev = make_event(SKIPPY_CATEGORY_DIAGNOSTIC,
                                            SKIPPY_KIND_DIAGNOSTIC_WARNING_RAISED);
    for (int i = 0; i < 20; i++) skippy_trampoline_v1(&ev, a);
    ev = make_event(SKIPPY_CATEGORY_UNLOAD, SKIPPY_KIND_UNLOAD_COMPLETED);
    skippy_trampoline_v1(&ev, a);
    skippy_ingress_stats_v1 s = stats_of(r.ingress);
    CHECK_EQ(s.lanes[SKIPPY_LANE_DIAGNOSTIC].dropped_full, 12);
    CHECK_EQ(s.lanes[SKIPPY_LANE_TERMINAL].dropped_full, 0);
    skippy_native_fact_v1 out[32];
    CHECK_EQ(drain_all(r.ingress, out, 32), 9);
    s = stats_of(r.ingress);
    check_lane_conservation(&s);
    skippy_adapter_destroy(a);
    region_free(&r);
}

static void run_conservation(uint32_t mode, uint32_t kind, uint32_t terminal_capacity) {
    region r = region_new(terminal_capacity, 64, 64, 0);
    skippy_adapter_t *a = skippy_adapter_create(r.ingress, 0);
    const uint64_t per_thread = 50000;
    skippy_test_producers_t *p = skippy_test_producers_start(a, 4, per_thread, kind, mode);
    CHECK(p != NULL);
    static skippy_native_fact_v1 buf[256];
    uint64_t drained = 0;
    uint64_t last_progress[4] = {0, 0, 0, 0};
    int ordered = 1;
    int finishing = 0;
    for (;;) {
        if (!finishing && skippy_test_producers_done(p)) finishing = 1; /* then drain the rest */
        if (!finishing && skippy_ingress_wait(r.ingress, 100) != 1) continue;
        size_t n = skippy_ingress_drain(r.ingress, buf, 256);
        if (finishing && n == 0) break;
        for (size_t i = 0; i < n; i++) {
            if (buf[i].lane == SKIPPY_LANE_PROGRESS) {
                uint64_t t = buf[i].event.stage_id;
                if (buf[i].event.progress_current <= last_progress[t]) ordered = 0;
                last_progress[t] = buf[i].event.progress_current;
            }
        }
        drained += n;
    }
    skippy_test_producer_report_v1 rep;
    skippy_test_producers_join(p, &rep);
    skippy_ingress_stats_v1 s = stats_of(r.ingress);
    CHECK_EQ(rep.records_attempted, 4 * per_thread);
    check_lane_conservation(&s);
    CHECK_EQ(s.lanes[0].drained + s.lanes[1].drained + s.lanes[2].drained, drained);
    CHECK_EQ(sum_accepted(&s) + sum_rejected(&s) + s.suppressed_regression +
                 s.progress_contended,
             4 * per_thread);
    CHECK(ordered);
    if (mode == SKIPPY_TEST_MODE_PROGRESS_PER_THREAD) {
        for (int t = 0; t < 4; t++) CHECK_EQ(last_progress[t], per_thread);
        /* one producer per key and the consumer never locks: the only contention possible is
         * on inserting the 4 new keys at the same moment (that value is dropped, counted) */
        CHECK(s.progress_contended <= 4);
    }
    printf("  mode %u kind %u: attempted %llu drained %llu dropped %llu coalesced %llu "
           "p50 %llu ns p99 %llu ns max %llu ns\n",
           mode, kind, (unsigned long long)rep.records_attempted, (unsigned long long)drained,
           (unsigned long long)(s.lanes[0].dropped_full + s.lanes[1].dropped_full +
                                s.lanes[2].dropped_full),
           (unsigned long long)s.lanes[1].coalesced, (unsigned long long)rep.latency_p50_ns,
           (unsigned long long)rep.latency_p99_ns, (unsigned long long)rep.latency_max_ns);
    skippy_adapter_destroy(a);
    region_free(&r);
}

/* Many producers pushing the SAME new progress key at once must never key two slots. */
static void test_same_new_key_from_many_threads_uses_one_slot(void) {
    for (int round = 0; round < 200; round++) {
        region r = region_new(0, 0, 8, 0);
        skippy_adapter_t *a = skippy_adapter_create(r.ingress, 0);
        skippy_test_producers_t *p =
            skippy_test_producers_start(a, 4, 50, SKIPPY_KIND_MODEL_OPEN_PROGRESS, 0);
        skippy_test_producer_report_v1 rep;
        skippy_test_producers_join(p, &rep);
        skippy_native_fact_v1 out[16];
        CHECK_EQ(drain_all(r.ingress, out, 16), 1);
        skippy_ingress_stats_v1 s = stats_of(r.ingress);
        CHECK_EQ(sum_accepted(&s) + s.suppressed_regression + s.progress_contended, 200);
        check_lane_conservation(&s);
        skippy_adapter_destroy(a);
        region_free(&r);
        if (g_failures) break;
    }
}

static void test_conservation_4_threads(void) {
    run_conservation(SKIPPY_TEST_MODE_TRAMPOLINE, SKIPPY_KIND_MODEL_OPEN_STARTED, 1024);
    run_conservation(SKIPPY_TEST_MODE_TRAMPOLINE, SKIPPY_KIND_MODEL_OPEN_STARTED, 16);
    run_conservation(SKIPPY_TEST_MODE_PROGRESS_PER_THREAD, 0, 1024);
    run_conservation(SKIPPY_TEST_MODE_TRAMPOLINE, SKIPPY_KIND_MODEL_OPEN_PROGRESS, 1024);
}

static void test_no_push_after_operation_end(void) {
    region r = region_new(0, 0, 0, 0);
    skippy_adapter_t *a = skippy_adapter_create(r.ingress, 0);
    skippy_test_producers_t *p =
        skippy_test_producers_start(a, 2, 0, 0, SKIPPY_TEST_MODE_LLAMA_PROGRESS);
    CHECK(p != NULL);
    static skippy_native_fact_v1 buf[256];
    for (uint64_t op = 1; op <= 50; op++) {
        CHECK_EQ(skippy_operation_begin(a, op, 0), SKIPPY_STATUS_OK);
        /* wait until the operation produced something */
        int seen = 0;
        while (!seen) {
            if (skippy_ingress_wait(r.ingress, 1000) != 1) break;
            size_t n = skippy_ingress_drain(r.ingress, buf, 256);
            for (size_t i = 0; i < n; i++) {
                CHECK(buf[i].operation_id == op);
                if (buf[i].operation_id == op) seen = 1;
            }
        }
        CHECK(seen);
        skippy_operation_end(a);
        drain_all(r.ingress, buf, 256);
        /* the producers keep calling the progress callback; nothing may arrive now */
        uint64_t before = skippy_test_producers_attempts(p);
        while (skippy_test_producers_attempts(p) < before + 20000) {
        }
        CHECK_EQ(skippy_ingress_drain(r.ingress, buf, 256), 0);
    }
    skippy_test_producers_stop(p);
    skippy_test_producers_join(p, NULL);
    skippy_ingress_stats_v1 s = stats_of(r.ingress);
    check_lane_conservation(&s);
    skippy_adapter_destroy(a);
    region_free(&r);
}

static void test_llama_hooks_without_llama(void) {
    region r = region_new(0, 0, 0, 256);
    skippy_adapter_t *a = skippy_adapter_create(r.ingress, SKIPPY_ADAPTER_CAPTURE_DEBUG_LOG);
    /* ggml is not resolved in this binary */
    CHECK_EQ(skippy_devices_list(NULL, 0, &(size_t){0}), SKIPPY_STATUS_UNSUPPORTED);
    CHECK_EQ(skippy_model_load_begin(a, 7, 3), SKIPPY_STATUS_OK);
    CHECK(skippy_llama_progress_callback(0.0f, a));
    CHECK(skippy_llama_progress_callback(0.0f, a));    /* not greater: nothing */
    CHECK(skippy_llama_progress_callback(0.4996f, a)); /* 500 */
    CHECK(skippy_llama_progress_callback(2.0f, a));    /* clamped to 1000 */
    CHECK_EQ(skippy_model_load_report_device(a, 0), SKIPPY_STATUS_UNSUPPORTED);
    CHECK(!skippy_llama_abort_callback(a));
    skippy_ingress_request_cancel(r.ingress, 7);
    CHECK(skippy_llama_abort_callback(a));
    CHECK(!skippy_llama_progress_callback(1.0f, a));
    skippy_model_load_end(a, SKIPPY_STATUS_ERROR, SKIPPY_FAILURE_CANCELLED);
    CHECK(skippy_llama_progress_callback(0.5f, a)); /* no scope: continue, push nothing */
    CHECK(!skippy_llama_abort_callback(a));

    skippy_native_fact_v1 out[16];
    size_t n = drain_all(r.ingress, out, 16);
    CHECK_EQ(n, 3); /* STARTED, FAILED_HANDLED (terminal), then PROGRESS 1000 (coalesced) */
    CHECK_EQ(out[0].event.kind, SKIPPY_KIND_MODEL_OPEN_STARTED);
    CHECK_EQ(out[0].event.sequence, 1);
    CHECK_EQ(out[0].event.model_id, 3);
    CHECK_EQ(out[1].event.kind, SKIPPY_KIND_MODEL_OPEN_FAILED_HANDLED);
    CHECK_EQ(out[1].event.status, SKIPPY_STATUS_ERROR);
    CHECK_EQ(out[1].event.failure_code, SKIPPY_FAILURE_CANCELLED);
    CHECK_EQ(out[1].event.sequence, 5);
    CHECK_EQ(out[2].event.kind, SKIPPY_KIND_MODEL_OPEN_PROGRESS);
    CHECK_EQ(out[2].event.progress_current, 1000);
    CHECK_EQ(out[2].event.progress_unit, SKIPPY_PROGRESS_UNIT_STEPS);
    CHECK_EQ(out[2].event.sequence, 4);
    CHECK_EQ(out[2].coalesced_count, 2);

    /* log callback: counted by level, raw text in the debug ring only */
    skippy_llama_log_callback(2, "hello\n", a);
    skippy_llama_log_callback(4, "boom\n", a);
    skippy_llama_log_callback(99, "odd\n", a);
    char big[300];
    memset(big, 'y', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    skippy_llama_log_callback(1, big, a); /* 124-byte bound for a 256-byte ring */
    skippy_ingress_stats_v1 s = stats_of(r.ingress);
    CHECK_EQ(s.log_messages_by_level[2], 1);
    CHECK_EQ(s.log_messages_by_level[4], 1);
    CHECK_EQ(s.log_messages_by_level[0], 1);
    CHECK_EQ(s.log_messages_by_level[1], 1);
    CHECK_EQ(s.debug_lines_captured, 4);
    CHECK_EQ(s.debug_bytes_dropped, 299 - 123); /* 123 bytes + a closing newline kept */
    char text[512];
    size_t len = skippy_ingress_debug_read(r.ingress, text, sizeof(text));
    CHECK_EQ(len, 6 + 5 + 4 + 124);
    CHECK(memcmp(text, "hello\nboom\nodd\n", 15) == 0);
    CHECK(text[15] == 'y' && text[15 + 122] == 'y' && text[15 + 123] == '\n');
    /* wrap around the 256-byte ring many times */
    for (int i = 0; i < 200; i++) {
        skippy_llama_log_callback(2, "0123456789abcdefghij\n", a);
        len = skippy_ingress_debug_read(r.ingress, text, sizeof(text));
        CHECK_EQ(len, 21);
    }
    skippy_adapter_destroy(a);
    region_free(&r);
}

/* A peer that scribbles the shared header (wild write, buggy engine) cannot move the host's
 * bounds: the handle keeps its own validated layout. ASan would flag any stray read. */
static void test_scribbled_header_cannot_move_host_bounds(void) {
    region r = region_new(16, 16, 4, 256);
    skippy_adapter_t *a = skippy_adapter_create(r.ingress, SKIPPY_ADAPTER_CAPTURE_DEBUG_LOG);
    skippy_runtime_event_v1 ev = make_event(SKIPPY_CATEGORY_MODEL_OPEN, 1);
    skippy_trampoline_v1(&ev, a);
    skippy_llama_log_callback(2, "line\n", a);
    skippy_region *shared = r.mem;
    shared->terminal_capacity = 1u << 30;
    shared->terminal_offset = 1ull << 40;
    shared->progress_slots = 1u << 30;
    shared->debug_offset = 1ull << 40;
    shared->debug_bytes = 1u << 30;
    skippy_native_fact_v1 out[32];
    CHECK_EQ(skippy_ingress_wait(r.ingress, 0), 1);
    CHECK_EQ(drain_all(r.ingress, out, 32), 1);
    /* a corrupt debug commit word is dropped, not followed */
    unsigned char *debug = (unsigned char *)r.mem + r.ingress->debug_offset;
    uint32_t huge = (1u << 30) | 1u;
    uint64_t tail = atomic_load(&shared->debug_tail);
    memcpy(debug + (tail & 255u), &huge, 4);
    char text[2048];
    CHECK_EQ(skippy_ingress_debug_read(r.ingress, text, sizeof(text)), 0);
    /* an engine attaching now sees a corrupt region and refuses it */
    CHECK(skippy_ingress_attach(r.mem, r.size) == NULL);
    skippy_adapter_destroy(a);
    region_free(&r);
}

/* A forked child attaches to the same MAP_SHARED pages and wakes the parent's futex wait. */
static void test_cross_process_wake(void) {
    region r = region_new(0, 0, 0, 0);
    pid_t pid = fork();
    if (pid == 0) {
        skippy_ingress_t *ing = skippy_ingress_attach(r.mem, r.size);
        if (ing == NULL) _exit(3);
        skippy_adapter_t *a = skippy_adapter_create(ing, 0);
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL); /* let the parent fall asleep first */
        skippy_runtime_event_v1 ev = make_event(SKIPPY_CATEGORY_MODEL_OPEN, 1);
        for (int i = 0; i < 10; i++) skippy_trampoline_v1(&ev, a);
        skippy_adapter_destroy(a);
        skippy_ingress_detach(ing);
        _exit(0);
    }
    uint64_t t0 = (uint64_t)time(NULL);
    int rc = skippy_ingress_wait(r.ingress, 10000);
    CHECK_EQ(rc, 1);
    CHECK((uint64_t)time(NULL) - t0 < 5);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    static skippy_native_fact_v1 out[16];
    CHECK_EQ(drain_all(r.ingress, out, 16), 10);
    CHECK_EQ(skippy_ingress_wait(r.ingress, 10), 0);
    region_free(&r);
}

int main(void) {
    static const struct named_test tests[] = {
        {"init_attach", test_init_attach},
        {"accept_and_copy", test_accept_and_copy},
        {"no_read_beyond_struct_size", test_no_read_beyond_struct_size},
        {"rejects", test_rejects},
        {"progress_coalescing", test_progress_coalescing},
        {"diagnostic_full_terminal_unaffected", test_diagnostic_full_terminal_unaffected},
        {"same_new_key_from_many_threads_uses_one_slot",
         test_same_new_key_from_many_threads_uses_one_slot},
        {"conservation_4_threads", test_conservation_4_threads},
        {"no_push_after_operation_end", test_no_push_after_operation_end},
        {"llama_hooks_without_llama", test_llama_hooks_without_llama},
        {"scribbled_header_cannot_move_host_bounds", test_scribbled_header_cannot_move_host_bounds},
        {"cross_process_wake", test_cross_process_wake},
    };
    return run_tests(tests, sizeof(tests) / sizeof(tests[0]));
}
