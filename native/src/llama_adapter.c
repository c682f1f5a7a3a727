/*
 * llama_adapter.c — the engine-side adapter: operation scopes and the llama.cpp hooks.
 *
 * llama_model_params.progress_callback, llama_log_set's callback and the context abort callback
 * point straight at the functions below with the adapter as user_data. They run on llama.cpp's
 * threads, so they follow the producer-path rules: no allocation, lock, formatting or I/O (the
 * opt-in test delay is the only sleep, and it is off by default).
 *
 * Scope guarantee: a callback enters an in-flight section (per epoch parity) before reading the
 * active operation; skippy_operation_end clears the operation, flips the epoch and waits until
 * the old parity's sections have left. After it returns no fact stamped with that operation is
 * pushed, and the llama.cpp hooks (which need a scope) push nothing.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "skippy_internal.h"

#define SEQ_CST memory_order_seq_cst
#define RELAXED memory_order_relaxed

uint64_t skippy_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t skippy_adapter_enter(skippy_adapter_t *a, uint32_t *token) {
    uint32_t parity = atomic_load_explicit(&a->epoch, SEQ_CST) & 1u;
    atomic_fetch_add_explicit(&a->in_flight[parity], 1, SEQ_CST);
    *token = parity;
    return atomic_load_explicit(&a->active_operation, SEQ_CST);
}

void skippy_adapter_leave(skippy_adapter_t *a, uint32_t token) {
    atomic_fetch_sub_explicit(&a->in_flight[token & 1u], 1, memory_order_release);
}

static void wait_parity_idle(skippy_adapter_t *a, uint32_t parity) {
    for (unsigned spins = 0; atomic_load_explicit(&a->in_flight[parity], SEQ_CST) != 0; spins++) {
        if (spins > 64) sched_yield();
    }
}

/* Waits for every callback that entered before this call. Not a producer path. */
static void quiesce(skippy_adapter_t *a) {
    uint32_t old = atomic_fetch_add_explicit(&a->epoch, 1, SEQ_CST) & 1u;
    wait_parity_idle(a, old);
}

SKIPPY_API skippy_adapter_t *skippy_adapter_create(skippy_ingress_t *ingress, uint32_t flags) {
    if (ingress == NULL) return NULL;
    skippy_adapter_t *a = calloc(1, sizeof(*a));
    if (a == NULL) return NULL;
    a->ingress = ingress;
    a->flags = flags;
    atomic_init(&a->progress_delay_us, 0);
    atomic_init(&a->active_operation, 0);
    atomic_init(&a->active_model, 0);
    atomic_init(&a->sequence, 0);
    atomic_init(&a->last_progress, -1);
    atomic_init(&a->device_reported, 0);
    atomic_init(&a->epoch, 0);
    atomic_init(&a->in_flight[0], 0);
    atomic_init(&a->in_flight[1], 0);
    return a;
}

SKIPPY_API void skippy_adapter_destroy(skippy_adapter_t *a) {
    if (a == NULL) return;
    atomic_store_explicit(&a->active_operation, 0, SEQ_CST);
    quiesce(a);
    quiesce(a); /* both parities: unscoped callbacks (log, raw reporter) are in flight too */
    free(a);
}

SKIPPY_API void skippy_adapter_reporter(skippy_adapter_t *a, skippy_runtime_event_reporter_v1 *out) {
    if (out == NULL) return;
    out->abi_version = SKIPPY_RUNTIME_EVENT_ABI_VERSION;
    out->struct_size = (uint32_t)sizeof(*out);
    out->callback = a != NULL ? skippy_trampoline_v1 : NULL;
    out->user_data = a;
}

SKIPPY_API void skippy_adapter_set_test_progress_delay_us(skippy_adapter_t *a, uint32_t delay_us) {
    if (a != NULL) atomic_store_explicit(&a->progress_delay_us, delay_us, RELAXED);
}

SKIPPY_API int32_t skippy_operation_begin(skippy_adapter_t *a, uint64_t operation_id,
                                          uint64_t model_id) {
    if (a == NULL || operation_id == 0) return SKIPPY_STATUS_INVALID_ARGUMENT;
    if (atomic_load_explicit(&a->active_operation, SEQ_CST) != 0)
        return SKIPPY_STATUS_INVALID_ARGUMENT;
    /* Per-operation state is reset before the operation becomes visible to callbacks. */
    atomic_store_explicit(&a->active_model, model_id, RELAXED);
    atomic_store_explicit(&a->sequence, 0, RELAXED);
    atomic_store_explicit(&a->last_progress, -1, RELAXED);
    atomic_store_explicit(&a->device_reported, 0, RELAXED);
    uint64_t expected = 0;
    if (!atomic_compare_exchange_strong_explicit(&a->active_operation, &expected, operation_id,
                                                 SEQ_CST, SEQ_CST))
        return SKIPPY_STATUS_INVALID_ARGUMENT;
    return SKIPPY_STATUS_OK;
}

SKIPPY_API void skippy_operation_end(skippy_adapter_t *a) {
    if (a == NULL) return;
    atomic_store_explicit(&a->active_operation, 0, SEQ_CST);
    quiesce(a);
}

typedef struct emit_args {
    uint32_t category; /* 0: MODEL_OPEN */
    uint32_t kind;
    uint64_t progress_current;
    uint64_t progress_total;
    uint32_t progress_unit;
    uint32_t failure_code;
    int32_t status;
    const char *detail;
    uint64_t detail_len;
    uint64_t summary[4];
} emit_args;

/* Builds a full-size event (MODEL_OPEN unless args say) and ingests it. Call inside an in-flight
 * section. */
static void emit(skippy_adapter_t *a, uint64_t operation_id, const emit_args *args) {
    skippy_runtime_event_v1 ev;
    memset(&ev, 0, sizeof(ev));
    ev.abi_version = SKIPPY_RUNTIME_EVENT_ABI_VERSION;
    ev.struct_size = SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE;
    ev.category = args->category != 0 ? args->category : SKIPPY_CATEGORY_MODEL_OPEN;
    ev.kind = args->kind;
    ev.emitter = SKIPPY_EMITTER_OPEN_THREAD;
    ev.sequence = atomic_fetch_add_explicit(&a->sequence, 1, RELAXED) + 1;
    ev.timestamp_mono_ns = skippy_monotonic_ns();
    ev.model_id = atomic_load_explicit(&a->active_model, RELAXED);
    ev.progress_current = args->progress_current;
    ev.progress_total = args->progress_total;
    ev.progress_unit = args->progress_unit;
    ev.failure_code = args->failure_code;
    ev.status = args->status;
    ev.detail_ptr = args->detail;
    ev.detail_len = args->detail_len;
    ev.numeric_summary_0 = args->summary[0];
    ev.numeric_summary_1 = args->summary[1];
    ev.numeric_summary_2 = args->summary[2];
    ev.numeric_summary_3 = args->summary[3];
    skippy_ingest_event(a->ingress, &ev, operation_id);
}

SKIPPY_API int32_t skippy_model_load_begin(skippy_adapter_t *a, uint64_t operation_id,
                                           uint64_t model_id) {
    int32_t status = skippy_operation_begin(a, operation_id, model_id);
    if (status != SKIPPY_STATUS_OK) return status;
    uint32_t token;
    uint64_t op = skippy_adapter_enter(a, &token);
    if (op != 0) {
        emit_args args = {.kind = SKIPPY_KIND_MODEL_OPEN_STARTED};
        emit(a, op, &args);
    }
    skippy_adapter_leave(a, token);
    return SKIPPY_STATUS_OK;
}

static void test_delay(skippy_adapter_t *a) {
    uint32_t us = atomic_load_explicit(&a->progress_delay_us, RELAXED);
    if (us == 0) return;
    struct timespec ts = {.tv_sec = us / 1000000u, .tv_nsec = (long)(us % 1000000u) * 1000L};
    nanosleep(&ts, NULL);
}

SKIPPY_API bool skippy_llama_progress_callback(float progress, void *user_data) {
    skippy_adapter_t *a = user_data;
    if (a == NULL) return true;
    test_delay(a);
    bool keep_going = true;
    uint32_t token;
    uint64_t op = skippy_adapter_enter(a, &token);
    if (op != 0) {
        if (skippy_ingress_cancel_word(a->ingress) == op) {
            keep_going = false;
        } else {
            float p = progress;
            if (!(p >= 0.0f)) p = 0.0f; /* also NaN */
            if (p > 1.0f) p = 1.0f;
            int64_t steps = (int64_t)(p * 1000.0f + 0.5f);
            int64_t last = atomic_load_explicit(&a->last_progress, RELAXED);
            /* CAS so concurrent callers never emit the same step twice */
            while (steps > last) {
                if (atomic_compare_exchange_weak_explicit(&a->last_progress, &last, steps, RELAXED,
                                                          RELAXED)) {
                    emit_args args = {.kind = SKIPPY_KIND_MODEL_OPEN_PROGRESS,
                                      .progress_current = (uint64_t)steps,
                                      .progress_total = 1000,
                                      .progress_unit = SKIPPY_PROGRESS_UNIT_STEPS};
                    emit(a, op, &args);
                    break;
                }
            }
        }
    }
    skippy_adapter_leave(a, token);
    return keep_going;
}

SKIPPY_API int32_t skippy_model_load_report_device(skippy_adapter_t *a, int32_t n_gpu_layers) {
    if (a == NULL) return SKIPPY_STATUS_INVALID_ARGUMENT;
    if (atomic_load_explicit(&a->active_operation, SEQ_CST) == 0)
        return SKIPPY_STATUS_INVALID_ARGUMENT;
    skippy_selected_device dev;
    int32_t status = skippy_ggml_select_device(n_gpu_layers, &dev);
    if (status != SKIPPY_STATUS_OK) return status;
    uint32_t token;
    uint64_t op = skippy_adapter_enter(a, &token);
    if (op == 0) {
        status = SKIPPY_STATUS_INVALID_ARGUMENT;
    } else if (atomic_exchange_explicit(&a->device_reported, 1, SEQ_CST) != 0) {
        status = SKIPPY_STATUS_ERROR;
    } else {
        emit_args args = {.kind = SKIPPY_KIND_MODEL_OPEN_BACKEND_DEVICE_SELECTED,
                          .detail = dev.name,
                          .detail_len = strnlen(dev.name, sizeof(dev.name)),
                          .summary = {dev.memory_free, dev.memory_total, dev.type, 0}};
        emit(a, op, &args);
    }
    skippy_adapter_leave(a, token);
    return status;
}

SKIPPY_API void skippy_model_load_end(skippy_adapter_t *a, int32_t status, uint32_t failure_code) {
    if (a == NULL) return;
    uint32_t token;
    uint64_t op = skippy_adapter_enter(a, &token);
    if (op != 0) {
        emit_args args = {.kind = status == SKIPPY_STATUS_OK ? SKIPPY_KIND_MODEL_OPEN_FINISHED
                                                             : SKIPPY_KIND_MODEL_OPEN_FAILED_HANDLED,
                          .status = status,
                          .failure_code = failure_code};
        emit(a, op, &args);
    }
    skippy_adapter_leave(a, token);
    if (op != 0) skippy_operation_end(a);
}

SKIPPY_API void skippy_llama_log_callback(int level, const char *text, void *user_data) {
    skippy_adapter_t *a = user_data;
    if (a == NULL) return;
    uint32_t token;
    (void)skippy_adapter_enter(a, &token);
    skippy_ingress_count_log(a->ingress, level);
    if (a->flags & SKIPPY_ADAPTER_CAPTURE_DEBUG_LOG) skippy_ingress_debug_write(a->ingress, text);
    skippy_adapter_leave(a, token);
}

SKIPPY_API bool skippy_llama_abort_callback(void *user_data) {
    skippy_adapter_t *a = user_data;
    if (a == NULL) return false;
    uint32_t token;
    uint64_t op = skippy_adapter_enter(a, &token);
    bool abort_now = op != 0 && skippy_ingress_cancel_word(a->ingress) == op;
    skippy_adapter_leave(a, token);
    return abort_now;
}

/* ggml's abort hook carries no user data and is process-wide: the one adapter it reports to. */
static _Atomic(skippy_adapter_t *) fatal_adapter;

/* Runs once, on the thread that failed, just before ggml calls abort(): the fact goes into the
 * shared ring (which outlives the process) with no allocation or lock, so the host learns why
 * its engine is about to end. */
static void on_ggml_abort(const char *message) {
    skippy_adapter_t *a = atomic_load_explicit(&fatal_adapter, SEQ_CST);
    if (a != NULL) {
        uint32_t token;
        uint64_t op = skippy_adapter_enter(a, &token);
        emit_args args = {.category = SKIPPY_CATEGORY_DIAGNOSTIC,
                          .kind = SKIPPY_KIND_DIAGNOSTIC_FATAL_FAILURE,
                          .status = SKIPPY_STATUS_ERROR,
                          .failure_code = op != 0 ? SKIPPY_FAILURE_MODEL_ERROR
                                                  : SKIPPY_FAILURE_INTERNAL_ERROR};
        emit(a, op, &args);
        skippy_adapter_leave(a, token);
    }
    /* What ggml prints without a hook, for whoever reads the engine's stderr. */
    if (message != NULL) fprintf(stderr, "%s\n", message);
}

SKIPPY_API int32_t skippy_adapter_install_fatal_hook(skippy_adapter_t *a) {
    if (a == NULL) return SKIPPY_STATUS_INVALID_ARGUMENT;
    skippy_ggml_set_abort_fn set = skippy_ggml_abort_setter();
    if (set == NULL) return SKIPPY_STATUS_UNSUPPORTED;
    atomic_store_explicit(&fatal_adapter, a, SEQ_CST);
    (void)set(on_ggml_abort);
    return SKIPPY_STATUS_OK;
}

SKIPPY_API void skippy_adapter_remove_fatal_hook(void) {
    skippy_ggml_set_abort_fn set = skippy_ggml_abort_setter();
    if (set != NULL) (void)set(NULL);
    atomic_store_explicit(&fatal_adapter, NULL, SEQ_CST);
}
