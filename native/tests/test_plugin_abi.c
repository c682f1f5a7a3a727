/*
 * test_plugin_abi.c — the serving plugin ABI (skippy_plugin.h) driven from C under ASan + UBSan,
 * with the example C plugin (examples/plugins/c/ngram_plugin.c) compiled into this binary.
 *
 * What only C can check: the header's _Static_asserts compile here; skippy_plugin_init_v1
 * refuses another ABI version and a short vtable without writing a byte; the vtable it fills
 * has its abi_version/struct_size; every buffer the host lends (prompt, runs, out_ids, the
 * receipt) is heap-allocated to its exact size and freed right after the call, so a plugin that
 * writes past `capacity`, reads past a run or a receipt's struct_size, or keeps a borrowed
 * pointer trips ASan; and the requests left in flight are freed by destroy (LeakSanitizer).
 * Built and run by `make -C native test`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "skippy/skippy_plugin.h"

_Static_assert(sizeof(skippy_plugin_v1) == SKIPPY_PLUGIN_V1_SIZE, "vtable");
_Static_assert(SKIPPY_PLUGIN_ABI_VERSION == 1u, "ABI version 1");

#include "check.h"

/* A borrowed token buffer: exactly `count` ids on the heap (NULL for none). */
static int32_t *lend(const int32_t *ids, size_t count) {
    if (count == 0) return NULL;
    int32_t *copy = malloc(count * sizeof(int32_t));
    if (copy == NULL) {
        perror("malloc");
        exit(2);
    }
    memcpy(copy, ids, count * sizeof(int32_t));
    return copy;
}

static skippy_plugin_ids_v1 ids_of(uint64_t request) {
    skippy_plugin_ids_v1 ids = {sizeof(ids), 0, request, 0};
    return ids;
}

/* The plugin's vtable, from an exactly sized heap block (a write past it trips ASan). */
static skippy_plugin_v1 *load_plugin(void) {
    skippy_plugin_v1 *vt = malloc(sizeof(*vt));
    if (vt == NULL) exit(2);
    memset(vt, 0, sizeof(*vt));
    int32_t status = skippy_plugin_init_v1(SKIPPY_PLUGIN_ABI_VERSION, vt, sizeof(*vt));
    CHECK_EQ(status, SKIPPY_PLUGIN_OK);
    return vt;
}

static void unload_plugin(skippy_plugin_v1 *vt) {
    if (vt->destroy != NULL) vt->destroy(vt->state);
    free(vt);
}

static int32_t begin(skippy_plugin_v1 *vt, uint64_t request, const int32_t *prompt,
                     size_t count, uint64_t reused) {
    skippy_plugin_ids_v1 ids = ids_of(request);
    int32_t *lent = lend(prompt, count);
    skippy_plugin_begin_v1 b = {sizeof(b), 0, lent, count, reused};
    int32_t status = vt->begin(vt->state, &ids, &b);
    free(lent); /* borrowed for the call only */
    return status;
}

static int32_t commit(skippy_plugin_v1 *vt, uint64_t request, uint64_t start,
                      const int32_t *tokens, size_t count) {
    skippy_plugin_ids_v1 ids = ids_of(request);
    int32_t *lent = lend(tokens, count);
    skippy_plugin_tokens_v1 run = {start, lent, count};
    int32_t status = vt->commit(vt->state, &ids, &run);
    free(lent);
    return status;
}

/* A query with `capacity` out slots on the heap; the proposal is copied to `out` (at least
 * `capacity` entries) and its count returned in *out_count. */
static int32_t propose(skippy_plugin_v1 *vt, uint64_t request, uint32_t capacity,
                       uint64_t pending_start, const int32_t *pending, size_t pending_count,
                       int32_t *out, uint32_t *out_count) {
    skippy_plugin_ids_v1 ids = ids_of(request);
    int32_t *lent = lend(pending, pending_count);
    int32_t *slots = malloc(capacity * sizeof(int32_t));
    if (slots == NULL) exit(2);
    skippy_plugin_query_v1 q;
    memset(&q, 0, sizeof(q));
    q.struct_size = sizeof(q);
    q.capacity = capacity;
    q.deadline_mono_ns = UINT64_MAX;
    q.pending.start = pending_start;
    q.pending.ids = lent;
    q.pending.count = pending_count;
    q.out_ids = slots;
    int32_t status = vt->propose(vt->state, &ids, &q);
    CHECK(q.out_count <= capacity);
    *out_count = q.out_count;
    memcpy(out, slots, (q.out_count <= capacity ? q.out_count : capacity) * sizeof(int32_t));
    free(slots);
    free(lent);
    return status;
}

static skippy_plugin_receipt_v1 *receipt_new(uint64_t generated) {
    skippy_plugin_receipt_v1 *r = calloc(1, sizeof(*r));
    if (r == NULL) exit(2);
    r->abi_version = SKIPPY_PLUGIN_ABI_VERSION;
    r->struct_size = sizeof(*r);
    r->stop_reason = SKIPPY_PLUGIN_STOP_LENGTH;
    r->generated_tokens = generated;
    return r;
}

static void test_init_refuses_without_writing(void) {
    unsigned char canary[sizeof(skippy_plugin_v1)];
    skippy_plugin_v1 vt;
    memset(&vt, 0xAB, sizeof(vt));
    memcpy(canary, &vt, sizeof(vt));
    CHECK_EQ(skippy_plugin_init_v1(2u, &vt, sizeof(vt)), SKIPPY_PLUGIN_UNSUPPORTED);
    CHECK(memcmp(&vt, canary, sizeof(vt)) == 0);
    CHECK_EQ(skippy_plugin_init_v1(SKIPPY_PLUGIN_ABI_VERSION, NULL, sizeof(vt)),
             SKIPPY_PLUGIN_INVALID_ARGUMENT);
    /* A host with a shorter vtable than the first v1: refused, nothing written past its size. */
    size_t short_size = SKIPPY_PLUGIN_V1_BASE_SIZE - 8;
    skippy_plugin_v1 *small = malloc(short_size);
    if (small == NULL) exit(2);
    memset(small, 0xAB, short_size);
    CHECK_EQ(skippy_plugin_init_v1(SKIPPY_PLUGIN_ABI_VERSION, small, short_size),
             SKIPPY_PLUGIN_INVALID_ARGUMENT);
    CHECK(memcmp(small, canary, short_size) == 0);
    free(small);
}

static void test_a_host_with_the_first_vtable_gets_80_bytes(void) {
    /* A host built before activate offers 80 bytes: the plugin fills exactly those (ASan trips
     * on a write past the heap block) and says so in struct_size. */
    skippy_plugin_v1 *old = malloc(SKIPPY_PLUGIN_V1_BASE_SIZE);
    if (old == NULL) exit(2);
    memset(old, 0, SKIPPY_PLUGIN_V1_BASE_SIZE);
    CHECK_EQ(skippy_plugin_init_v1(SKIPPY_PLUGIN_ABI_VERSION, old, SKIPPY_PLUGIN_V1_BASE_SIZE),
             SKIPPY_PLUGIN_OK);
    CHECK_EQ(old->struct_size, SKIPPY_PLUGIN_V1_BASE_SIZE);
    CHECK(old->begin != NULL && old->destroy != NULL);
    old->destroy(old->state);
    free(old);
}

static void test_activate_takes_the_model_and_refuses_a_bad_config(void) {
    skippy_plugin_v1 *vt = load_plugin();
    CHECK_EQ(vt->struct_size, SKIPPY_PLUGIN_V1_SIZE);
    CHECK(vt->activate != NULL);
    skippy_plugin_activation_v1 *a = malloc(sizeof(*a));
    if (a == NULL) exit(2);
    memset(a, 0, sizeof(*a));
    a->struct_size = sizeof(*a);
    a->spec_mode = SKIPPY_PLUGIN_SPEC_PLUGIN;
    a->model_id = "tiny";
    a->config = "k=v";
    a->config_len = 3;
    a->n_vocab = 100;
    a->n_ctx_per_lane = 512;
    a->lanes = 4;
    a->proposal_deadline_ns = 8000000;
    CHECK_EQ(vt->activate(vt->state, a), SKIPPY_PLUGIN_OK);
    a->config = "refuse";
    a->config_len = 6;
    CHECK_EQ(vt->activate(vt->state, a), SKIPPY_PLUGIN_INVALID_ARGUMENT);
    free(a);
    unload_plugin(vt);
}

static void test_vtable_is_versioned_and_complete(void) {
    skippy_plugin_v1 *vt = load_plugin();
    CHECK_EQ(vt->abi_version, SKIPPY_PLUGIN_ABI_VERSION);
    CHECK(vt->struct_size >= SKIPPY_PLUGIN_V1_BASE_SIZE && vt->struct_size <= sizeof(*vt));
    CHECK(vt->name != NULL && strcmp(vt->name, "ngram") == 0);
    CHECK(vt->begin != NULL && vt->commit != NULL && vt->propose != NULL);
    CHECK(vt->finish != NULL && vt->abort != NULL && vt->destroy != NULL);
    /* outcome is optional: NULL means "not implemented", and the host skips it. */
    unload_plugin(vt);
}

static void test_one_request_through_the_whole_lifecycle(void) {
    skippy_plugin_v1 *vt = load_plugin();
    const int32_t prompt[] = {7, 10, 11, 12, 13, 10, 11};
    CHECK_EQ(begin(vt, 1, prompt, 7, 3), SKIPPY_PLUGIN_OK);
    const int32_t first[] = {12};
    CHECK_EQ(commit(vt, 1, 0, first, 1), SKIPPY_PLUGIN_OK);
    int32_t out[64];
    uint32_t count = 0;
    /* History 7 10 11 12 13 10 11 12 + pending 13: the cycle 10 11 12 13 goes on. */
    const int32_t pending[] = {13};
    CHECK_EQ(propose(vt, 1, 6, 1, pending, 1, out, &count), SKIPPY_PLUGIN_OK);
    CHECK_EQ(count, 6);
    const int32_t expected[] = {10, 11, 12, 13, 10, 11};
    CHECK(memcmp(out, expected, sizeof(expected)) == 0);
    /* Capacity is a hard bound: 1 slot, and 64 (the cyclic continuation fills exactly 64). */
    CHECK_EQ(propose(vt, 1, 1, 2, NULL, 0, out, &count), SKIPPY_PLUGIN_OK);
    CHECK_EQ(count, 1);
    CHECK_EQ(out[0], 10);
    CHECK_EQ(propose(vt, 1, 64, 2, NULL, 0, out, &count), SKIPPY_PLUGIN_OK);
    CHECK_EQ(count, 64);
    CHECK_EQ(out[63], 13);
    if (vt->outcome != NULL) {
        skippy_plugin_ids_v1 ids = ids_of(1);
        skippy_plugin_outcome_v1 o = {sizeof(o), 6, 4, 2, SKIPPY_PLUGIN_OUTCOME_FIRST_MISMATCH,
                                      SKIPPY_PLUGIN_DISCARD_NONE};
        CHECK_EQ(vt->outcome(vt->state, &ids, &o), SKIPPY_PLUGIN_OK);
        /* An outcome from a host that knows only its first 16 bytes: read no further. */
        skippy_plugin_outcome_v1 *old = malloc(SKIPPY_PLUGIN_OUTCOME_V1_BASE_SIZE);
        if (old == NULL) exit(2);
        memcpy(old, &o, SKIPPY_PLUGIN_OUTCOME_V1_BASE_SIZE);
        old->struct_size = SKIPPY_PLUGIN_OUTCOME_V1_BASE_SIZE;
        CHECK_EQ(vt->outcome(vt->state, &ids, old), SKIPPY_PLUGIN_OK);
        free(old);
    }
    /* A run that does not start where the stream stands is refused, and changes nothing. */
    const int32_t stray[] = {99};
    CHECK_EQ(commit(vt, 1, 5, stray, 1), SKIPPY_PLUGIN_INVALID_ARGUMENT);
    CHECK_EQ(commit(vt, 1, 1, stray, 1), SKIPPY_PLUGIN_INVALID_ARGUMENT); /* overlaps */
    const int32_t more[] = {10, 11};
    CHECK_EQ(commit(vt, 1, 2, more, 2), SKIPPY_PLUGIN_OK);
    skippy_plugin_ids_v1 ids = ids_of(1);
    const int32_t tail[] = {12, 13, 10};
    int32_t *lent = lend(tail, 3);
    skippy_plugin_tokens_v1 suffix = {4, lent, 3};
    skippy_plugin_receipt_v1 *receipt = receipt_new(7);
    CHECK_EQ(vt->finish(vt->state, &ids, &suffix, receipt), SKIPPY_PLUGIN_OK);
    free(receipt);
    free(lent);
    /* finish was the last call: the request is gone (its history freed). */
    CHECK_EQ(commit(vt, 1, 7, first, 1), SKIPPY_PLUGIN_INVALID_ARGUMENT);
    unload_plugin(vt);
}

static void test_nothing_to_propose_and_an_old_receipt(void) {
    skippy_plugin_v1 *vt = load_plugin();
    const int32_t prompt[] = {1, 2, 3};
    CHECK_EQ(begin(vt, 5, prompt, 3, 0), SKIPPY_PLUGIN_OK);
    int32_t out[4];
    uint32_t count = 99;
    CHECK_EQ(propose(vt, 5, 4, 0, NULL, 0, out, &count), SKIPPY_PLUGIN_NO_PROPOSAL);
    CHECK_EQ(count, 0);
    /* A receipt from a host that knows only its first 12 bytes: the plugin reads no further. */
    size_t old_size = 12;
    skippy_plugin_receipt_v1 *old = malloc(old_size);
    if (old == NULL) exit(2);
    memset(old, 0, old_size);
    old->abi_version = SKIPPY_PLUGIN_ABI_VERSION;
    old->struct_size = (uint32_t)old_size;
    skippy_plugin_ids_v1 ids = ids_of(5);
    skippy_plugin_tokens_v1 empty = {0, NULL, 0};
    CHECK_EQ(vt->finish(vt->state, &ids, &empty, old), SKIPPY_PLUGIN_OK);
    free(old);
    unload_plugin(vt);
}

static void test_abort_and_destroy_free_every_request(void) {
    skippy_plugin_v1 *vt = load_plugin();
    const int32_t prompt[] = {4, 5, 4, 5, 4};
    for (uint64_t request = 10; request < 14; request++)
        CHECK_EQ(begin(vt, request, prompt, 5, 0), SKIPPY_PLUGIN_OK);
    skippy_plugin_ids_v1 ids = ids_of(10);
    CHECK_EQ(vt->abort(vt->state, &ids, SKIPPY_PLUGIN_ABORT_CANCELLED), SKIPPY_PLUGIN_OK);
    CHECK_EQ(commit(vt, 10, 0, prompt, 1), SKIPPY_PLUGIN_INVALID_ARGUMENT); /* gone */
    /* A begin again for a live id starts it over (no leak of the old history). */
    CHECK_EQ(begin(vt, 11, prompt, 5, 0), SKIPPY_PLUGIN_OK);
    /* 11, 12 and 13 are still in flight: destroy frees them (LeakSanitizer checks at exit). */
    unload_plugin(vt);
}

static void test_the_record_file_sees_the_stream(void) {
    char path[] = "/tmp/skippy-plugin-record-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    setenv("SKIPPY_PLUGIN_RECORD", path, 1);
    skippy_plugin_v1 *vt = load_plugin();
    unsetenv("SKIPPY_PLUGIN_RECORD");
    const int32_t prompt[] = {1, 2};
    CHECK_EQ(begin(vt, 3, prompt, 2, 1), SKIPPY_PLUGIN_OK);
    const int32_t run[] = {8, 9};
    CHECK_EQ(commit(vt, 3, 0, run, 2), SKIPPY_PLUGIN_OK);
    skippy_plugin_ids_v1 ids = ids_of(3);
    CHECK_EQ(vt->abort(vt->state, &ids, SKIPPY_PLUGIN_ABORT_TIMEOUT), SKIPPY_PLUGIN_OK);
    unload_plugin(vt); /* closes the record file */
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f != NULL) {
        char text[256] = {0};
        size_t n = fread(text, 1, sizeof(text) - 1, f);
        fclose(f);
        CHECK(n > 0);
        CHECK(strcmp(text, "begin 3 2 1\ncommit 3 0 2 8 9\nabort 3 2\n") == 0);
    }
    unlink(path);
}

int main(void) {
    static const struct named_test tests[] = {
        {"init_refuses_without_writing", test_init_refuses_without_writing},
        {"vtable_is_versioned_and_complete", test_vtable_is_versioned_and_complete},
        {"a_host_with_the_first_vtable_gets_80_bytes",
         test_a_host_with_the_first_vtable_gets_80_bytes},
        {"activate_takes_the_model_and_refuses_a_bad_config",
         test_activate_takes_the_model_and_refuses_a_bad_config},
        {"one_request_through_the_whole_lifecycle", test_one_request_through_the_whole_lifecycle},
        {"nothing_to_propose_and_an_old_receipt", test_nothing_to_propose_and_an_old_receipt},
        {"abort_and_destroy_free_every_request", test_abort_and_destroy_free_every_request},
        {"the_record_file_sees_the_stream", test_the_record_file_sees_the_stream},
    };
    return run_tests(tests, sizeof(tests) / sizeof(tests[0]));
}
