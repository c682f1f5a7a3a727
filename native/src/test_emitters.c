/*
 * test_emitters.c — inject arbitrary events and run C producer threads, for ABI tests, stress
 * tests and benchmarks. Everything is allocated in skippy_test_producers_start; the threads only
 * emit and record each emit's latency into a per-thread fixed histogram.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "skippy_internal.h"

/* Latency histogram: values < 64 ns exact, then 16 linear sub-buckets per power of two up to
 * 2^40 ns (about 18 minutes); larger values land in the last bucket (the max is kept exactly). */
#define HIST_LINEAR 64u
#define HIST_SUB 16u
#define HIST_MAX_EXP 40u
#define HIST_BUCKETS (HIST_LINEAR + (HIST_MAX_EXP - 6u + 1u) * HIST_SUB)

typedef struct producer_thread {
    struct skippy_test_producers *owner;
    uint32_t index;
    skippy_adapter_t *own_adapter; /* SKIPPY_TEST_MODE_PROGRESS_PER_THREAD */
    _Atomic uint64_t attempts;
    uint64_t max_ns;
    uint64_t hist[HIST_BUCKETS];
} producer_thread;

struct skippy_test_producers {
    skippy_adapter_t *adapter;
    uint32_t threads;
    uint32_t started;
    uint64_t records;
    uint32_t kind;
    uint32_t mode;
    uint64_t start_ns;
    _Atomic uint64_t end_ns;
    _Atomic uint32_t stop;
    _Atomic uint32_t done;
    pthread_t *tids;
    producer_thread *ctx;
};

static uint32_t bucket_of(uint64_t v) {
    if (v < HIST_LINEAR) return (uint32_t)v;
    uint32_t e = 63u - (uint32_t)__builtin_clzll(v);
    if (e > HIST_MAX_EXP) return HIST_BUCKETS - 1u;
    uint32_t sub = (uint32_t)(v >> (e - 4u)) & (HIST_SUB - 1u);
    return HIST_LINEAR + (e - 6u) * HIST_SUB + sub;
}

static uint64_t bucket_upper(uint32_t b) {
    if (b < HIST_LINEAR) return b;
    uint32_t e = (b - HIST_LINEAR) / HIST_SUB + 6u;
    uint64_t sub = (b - HIST_LINEAR) % HIST_SUB;
    uint64_t width = 1ull << (e - 4u);
    return (1ull << e) + sub * width + width - 1u;
}

static uint32_t category_for_kind(uint32_t kind) {
    if (kind >= 1 && kind <= 104) return SKIPPY_CATEGORY_MODEL_OPEN;
    if (kind >= 200 && kind <= 204) return SKIPPY_CATEGORY_KV;
    if (kind >= 300 && kind <= 308) return SKIPPY_CATEGORY_DEVICE;
    if (kind >= 500 && kind <= 504) return SKIPPY_CATEGORY_UNLOAD;
    return SKIPPY_CATEGORY_DIAGNOSTIC;
}

SKIPPY_API void skippy_test_emit_raw(skippy_adapter_t *adapter, const void *bytes) {
    skippy_trampoline_v1((const skippy_runtime_event_v1 *)bytes, adapter);
}

static void *producer_main(void *arg) {
    producer_thread *t = arg;
    struct skippy_test_producers *p = t->owner;
    skippy_runtime_event_v1 ev;
    memset(&ev, 0, sizeof(ev));
    ev.abi_version = SKIPPY_RUNTIME_EVENT_ABI_VERSION;
    ev.struct_size = SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE;
    ev.emitter = SKIPPY_EMITTER_WORKER_THREAD;
    ev.stage_id = t->index;
    ev.progress_total = p->records;
    ev.progress_unit = SKIPPY_PROGRESS_UNIT_ITEMS;
    skippy_adapter_t *target = p->adapter;
    if (p->mode == SKIPPY_TEST_MODE_PROGRESS_PER_THREAD) {
        ev.category = SKIPPY_CATEGORY_MODEL_OPEN;
        ev.kind = SKIPPY_KIND_MODEL_OPEN_PROGRESS;
        target = t->own_adapter;
    } else {
        ev.category = category_for_kind(p->kind);
        ev.kind = p->kind;
    }
    for (uint64_t i = 0; p->records == 0 || i < p->records; i++) {
        if (atomic_load_explicit(&p->stop, memory_order_relaxed)) break;
        ev.sequence = i + 1;
        ev.progress_current = i + 1;
        uint64_t t0 = skippy_monotonic_ns();
        if (p->mode == SKIPPY_TEST_MODE_LLAMA_PROGRESS) {
            skippy_llama_progress_callback((float)((i % 1000u) + 1u) / 1000.0f, target);
        } else {
            ev.timestamp_mono_ns = t0;
            skippy_trampoline_v1(&ev, target);
        }
        uint64_t dt = skippy_monotonic_ns() - t0;
        t->hist[bucket_of(dt)]++;
        if (dt > t->max_ns) t->max_ns = dt;
        atomic_store_explicit(&t->attempts, i + 1, memory_order_relaxed);
    }
    uint64_t now = skippy_monotonic_ns();
    uint64_t end = atomic_load_explicit(&p->end_ns, memory_order_relaxed);
    while (now > end && !atomic_compare_exchange_weak_explicit(&p->end_ns, &end, now,
                                                               memory_order_relaxed,
                                                               memory_order_relaxed)) {
    }
    atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    return NULL;
}

static void producers_free(struct skippy_test_producers *p) {
    if (p->ctx != NULL) {
        for (uint32_t i = 0; i < p->threads; i++) {
            if (p->ctx[i].own_adapter != NULL) {
                skippy_operation_end(p->ctx[i].own_adapter);
                skippy_adapter_destroy(p->ctx[i].own_adapter);
            }
        }
    }
    free(p->ctx);
    free(p->tids);
    free(p);
}

SKIPPY_API skippy_test_producers_t *skippy_test_producers_start(skippy_adapter_t *adapter,
                                                                uint32_t threads,
                                                                uint64_t records_per_thread,
                                                                uint32_t kind,
                                                                uint32_t progress_mode) {
    if (adapter == NULL || threads == 0 || threads > 256 ||
        progress_mode > SKIPPY_TEST_MODE_LLAMA_PROGRESS)
        return NULL;
    struct skippy_test_producers *p = calloc(1, sizeof(*p));
    if (p == NULL) return NULL;
    p->adapter = adapter;
    p->threads = threads;
    p->records = records_per_thread;
    p->kind = kind;
    p->mode = progress_mode;
    p->tids = calloc(threads, sizeof(*p->tids));
    p->ctx = calloc(threads, sizeof(*p->ctx));
    if (p->tids == NULL || p->ctx == NULL) {
        producers_free(p);
        return NULL;
    }
    for (uint32_t i = 0; i < threads; i++) {
        p->ctx[i].owner = p;
        p->ctx[i].index = i;
        if (progress_mode == SKIPPY_TEST_MODE_PROGRESS_PER_THREAD) {
            p->ctx[i].own_adapter = skippy_adapter_create(adapter->ingress, 0);
            if (p->ctx[i].own_adapter == NULL ||
                skippy_operation_begin(p->ctx[i].own_adapter, (1ull << 48) + i + 1, 0) !=
                    SKIPPY_STATUS_OK) {
                producers_free(p);
                return NULL;
            }
        }
    }
    p->start_ns = skippy_monotonic_ns();
    for (uint32_t i = 0; i < threads; i++) {
        if (pthread_create(&p->tids[i], NULL, producer_main, &p->ctx[i]) != 0) {
            atomic_store(&p->stop, 1);
            for (uint32_t j = 0; j < p->started; j++) pthread_join(p->tids[j], NULL);
            producers_free(p);
            return NULL;
        }
        p->started++;
    }
    return p;
}

SKIPPY_API int skippy_test_producers_done(skippy_test_producers_t *p) {
    if (p == NULL) return 1;
    return atomic_load_explicit(&p->done, memory_order_acquire) == p->threads;
}

SKIPPY_API uint64_t skippy_test_producers_attempts(skippy_test_producers_t *p) {
    if (p == NULL) return 0;
    uint64_t total = 0;
    for (uint32_t i = 0; i < p->threads; i++)
        total += atomic_load_explicit(&p->ctx[i].attempts, memory_order_relaxed);
    return total;
}

SKIPPY_API void skippy_test_producers_stop(skippy_test_producers_t *p) {
    if (p != NULL) atomic_store_explicit(&p->stop, 1, memory_order_relaxed);
}

static uint64_t percentile(const uint64_t *hist, uint64_t total, uint64_t per_mille) {
    if (total == 0) return 0;
    uint64_t rank = (total * per_mille + 999u) / 1000u; /* ceil, 1-based */
    if (rank == 0) rank = 1;
    uint64_t seen = 0;
    for (uint32_t b = 0; b < HIST_BUCKETS; b++) {
        seen += hist[b];
        if (seen >= rank) return bucket_upper(b);
    }
    return bucket_upper(HIST_BUCKETS - 1u);
}

SKIPPY_API void skippy_test_producers_join(skippy_test_producers_t *p,
                                           skippy_test_producer_report_v1 *out) {
    if (p == NULL) return;
    for (uint32_t i = 0; i < p->started; i++) pthread_join(p->tids[i], NULL);
    if (out != NULL) {
        uint64_t *merged = calloc(HIST_BUCKETS, sizeof(uint64_t)); /* join: not a producer path */
        uint64_t total = 0, max_ns = 0;
        for (uint32_t i = 0; i < p->threads; i++) {
            for (uint32_t b = 0; merged != NULL && b < HIST_BUCKETS; b++)
                merged[b] += p->ctx[i].hist[b];
            total += atomic_load_explicit(&p->ctx[i].attempts, memory_order_relaxed);
            if (p->ctx[i].max_ns > max_ns) max_ns = p->ctx[i].max_ns;
        }
        memset(out, 0, sizeof(*out));
        out->struct_size = (uint32_t)sizeof(*out);
        out->threads = p->threads;
        out->records_attempted = total;
        uint64_t end = atomic_load_explicit(&p->end_ns, memory_order_relaxed);
        out->elapsed_ns = end > p->start_ns ? end - p->start_ns : 0;
        if (merged != NULL) {
            out->latency_p50_ns = percentile(merged, total, 500);
            out->latency_p99_ns = percentile(merged, total, 990);
        }
        out->latency_max_ns = max_ns;
        free(merged);
    }
    producers_free(p);
}

SKIPPY_API int skippy_test_hold_gil_until_producers_done(skippy_test_producers_t *p,
                                                         uint32_t timeout_ms) {
    uint64_t deadline = skippy_monotonic_ns() + (uint64_t)timeout_ms * 1000000ull;
    struct timespec step = {.tv_sec = 0, .tv_nsec = 100000L};
    for (;;) {
        if (skippy_test_producers_done(p)) return 1;
        if (skippy_monotonic_ns() >= deadline) return 0;
        nanosleep(&step, NULL);
    }
}
