/*
 * skippy_event.h — the Skippy runtime event ABI, version 1.
 *
 * This is the reference layout (see skippy-facts.md, "Native event ABI"): a record produced by a
 * real patched Skippy runtime must be accepted by our trampoline unchanged. Fields are
 * append-only; every offset and both sizes are pinned with _Static_assert below, and the Python
 * binding re-checks them against skippy_abi_fields() at load time.
 *
 * Reader contract: accept any struct_size >= SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE, read only the
 * fields that lie inside struct_size, treat the numeric-summary extension as absent (not zero)
 * when struct_size < SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE, reject detail_len over 1 MiB, copy at
 * most a bounded number of detail bytes. detail_ptr is borrowed, not NUL-terminated, and valid
 * only for the duration of the callback.
 */
#ifndef SKIPPY_EVENT_H
#define SKIPPY_EVENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define SKIPPY_API __attribute__((visibility("default")))
#else
#define SKIPPY_API
#endif

#define SKIPPY_RUNTIME_EVENT_ABI_VERSION 1u
#define SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE 112u
#define SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE 144u
/* Largest detail_len a reader accepts (1 MiB) and the bytes it copies at most. */
#define SKIPPY_RUNTIME_EVENT_MAX_DETAIL_LEN (1024u * 1024u)
#define SKIPPY_RUNTIME_EVENT_DETAIL_COPY_BYTES 256u

typedef struct skippy_runtime_event_v1 {
    uint32_t abi_version;       /*   0 */
    uint32_t struct_size;       /*   4 */
    uint32_t category;          /*   8  skippy_category */
    uint32_t kind;              /*  12  skippy_kind */
    uint32_t emitter;           /*  16  skippy_emitter */
    uint32_t reserved0;         /*  20 */
    uint64_t sequence;          /*  24  per operation, starts at 1 */
    uint64_t timestamp_mono_ns; /*  32 */
    uint64_t model_id;          /*  40 */
    uint64_t stage_id;          /*  48 */
    uint64_t session_id;        /*  56 */
    uint64_t progress_current;  /*  64 */
    uint64_t progress_total;    /*  72 */
    uint32_t progress_unit;     /*  80  skippy_progress_unit */
    uint32_t failure_code;      /*  84  skippy_failure_code */
    int32_t status;             /*  88  skippy_status */
    uint32_t reserved1;         /*  92 */
    const char *detail_ptr;     /*  96  borrowed, not NUL-terminated */
    uint64_t detail_len;        /* 104 */
    /* ---- append-only extension: read only when struct_size >= 144 ---- */
    uint64_t numeric_summary_0; /* 112 */
    uint64_t numeric_summary_1; /* 120 */
    uint64_t numeric_summary_2; /* 128 */
    uint64_t numeric_summary_3; /* 136 */
} skippy_runtime_event_v1;

_Static_assert(sizeof(void *) == 8, "the Skippy event ABI is defined for 64-bit targets");
_Static_assert(offsetof(skippy_runtime_event_v1, abi_version) == 0, "abi_version");
_Static_assert(offsetof(skippy_runtime_event_v1, struct_size) == 4, "struct_size");
_Static_assert(offsetof(skippy_runtime_event_v1, category) == 8, "category");
_Static_assert(offsetof(skippy_runtime_event_v1, kind) == 12, "kind");
_Static_assert(offsetof(skippy_runtime_event_v1, emitter) == 16, "emitter");
_Static_assert(offsetof(skippy_runtime_event_v1, reserved0) == 20, "reserved0");
_Static_assert(offsetof(skippy_runtime_event_v1, sequence) == 24, "sequence");
_Static_assert(offsetof(skippy_runtime_event_v1, timestamp_mono_ns) == 32, "timestamp_mono_ns");
_Static_assert(offsetof(skippy_runtime_event_v1, model_id) == 40, "model_id");
_Static_assert(offsetof(skippy_runtime_event_v1, stage_id) == 48, "stage_id");
_Static_assert(offsetof(skippy_runtime_event_v1, session_id) == 56, "session_id");
_Static_assert(offsetof(skippy_runtime_event_v1, progress_current) == 64, "progress_current");
_Static_assert(offsetof(skippy_runtime_event_v1, progress_total) == 72, "progress_total");
_Static_assert(offsetof(skippy_runtime_event_v1, progress_unit) == 80, "progress_unit");
_Static_assert(offsetof(skippy_runtime_event_v1, failure_code) == 84, "failure_code");
_Static_assert(offsetof(skippy_runtime_event_v1, status) == 88, "status");
_Static_assert(offsetof(skippy_runtime_event_v1, reserved1) == 92, "reserved1");
_Static_assert(offsetof(skippy_runtime_event_v1, detail_ptr) == 96, "detail_ptr");
_Static_assert(offsetof(skippy_runtime_event_v1, detail_len) == 104, "detail_len");
_Static_assert(offsetof(skippy_runtime_event_v1, numeric_summary_0) == 112, "numeric_summary_0");
_Static_assert(offsetof(skippy_runtime_event_v1, numeric_summary_1) == 120, "numeric_summary_1");
_Static_assert(offsetof(skippy_runtime_event_v1, numeric_summary_2) == 128, "numeric_summary_2");
_Static_assert(offsetof(skippy_runtime_event_v1, numeric_summary_3) == 136, "numeric_summary_3");
_Static_assert(offsetof(skippy_runtime_event_v1, numeric_summary_0) ==
                   SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE,
               "the extension starts at the base size");
_Static_assert(sizeof(skippy_runtime_event_v1) == SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE,
               "full size");

typedef void (*skippy_runtime_event_callback_v1)(const skippy_runtime_event_v1 *event,
                                                 void *user_data);

/* NULL reporter or NULL callback: no events. struct_size smaller than known: invalid argument.
 * Unknown abi_version: unsupported. */
typedef struct skippy_runtime_event_reporter_v1 {
    uint32_t abi_version;                      /*  0 */
    uint32_t struct_size;                      /*  4 */
    skippy_runtime_event_callback_v1 callback; /*  8 */
    void *user_data;                           /* 16 */
} skippy_runtime_event_reporter_v1;

_Static_assert(offsetof(skippy_runtime_event_reporter_v1, abi_version) == 0, "abi_version");
_Static_assert(offsetof(skippy_runtime_event_reporter_v1, struct_size) == 4, "struct_size");
_Static_assert(offsetof(skippy_runtime_event_reporter_v1, callback) == 8, "callback");
_Static_assert(offsetof(skippy_runtime_event_reporter_v1, user_data) == 16, "user_data");
_Static_assert(sizeof(skippy_runtime_event_reporter_v1) == 24, "reporter size");

/* ---- discriminants (explicit values; the wire contract) ---- */

typedef enum skippy_category {
    SKIPPY_CATEGORY_MODEL_OPEN = 1,
    SKIPPY_CATEGORY_BACKEND = 2,
    SKIPPY_CATEGORY_SESSION = 3,
    SKIPPY_CATEGORY_KV = 4,
    SKIPPY_CATEGORY_WARNING = 5,
    SKIPPY_CATEGORY_DEVICE = 6,
    SKIPPY_CATEGORY_DIAGNOSTIC = 7,
    SKIPPY_CATEGORY_UNLOAD = 8
} skippy_category;

typedef enum skippy_kind {
    /* model open (per-call reporter family) */
    SKIPPY_KIND_MODEL_OPEN_STARTED = 1,
    SKIPPY_KIND_MODEL_OPEN_PROGRESS = 2,
    SKIPPY_KIND_MODEL_OPEN_BACKEND_DEVICE_SELECTED = 3,
    SKIPPY_KIND_MODEL_OPEN_FINISHED = 4,
    SKIPPY_KIND_MODEL_OPEN_FAILED_HANDLED = 5,
    /* model load v2 */
    SKIPPY_KIND_MODEL_LOAD_PHASE_CHANGED = 100,
    SKIPPY_KIND_MODEL_LOAD_MEMORY_ALLOCATED = 101,
    SKIPPY_KIND_MODEL_LOAD_TENSORS_OFFLOADED = 102,
    SKIPPY_KIND_MODEL_LOAD_TOKENIZER_READY = 103,
    SKIPPY_KIND_MODEL_LOAD_AUX_COMPONENT_READY = 104,
    /* KV */
    SKIPPY_KIND_KV_INITIALIZED = 200,
    SKIPPY_KIND_KV_PRESSURE_CROSSED = 201,
    SKIPPY_KIND_KV_PRESSURE_CLEARED = 202,
    SKIPPY_KIND_KV_APPROACHING_CAPACITY = 203,
    SKIPPY_KIND_KV_CAPACITY_EXHAUSTED = 204,
    /* device */
    SKIPPY_KIND_DEVICE_BACKEND_INITIALIZED = 300,
    SKIPPY_KIND_DEVICE_READY = 301,
    SKIPPY_KIND_DEVICE_DEGRADED = 302,
    SKIPPY_KIND_DEVICE_UNAVAILABLE = 303,
    SKIPPY_KIND_DEVICE_RECOVERED = 304,
    SKIPPY_KIND_DEVICE_LOST = 305,
    SKIPPY_KIND_DEVICE_RESOURCE_ALLOCATED = 306,
    SKIPPY_KIND_DEVICE_OUT_OF_MEMORY = 307,
    SKIPPY_KIND_DEVICE_FALLBACK_ACTIVATED = 308,
    /* diagnostic */
    SKIPPY_KIND_DIAGNOSTIC_WARNING_RAISED = 400,
    SKIPPY_KIND_DIAGNOSTIC_WARNING_CLEARED = 401,
    SKIPPY_KIND_DIAGNOSTIC_RECOVERABLE_FAILURE = 402,
    SKIPPY_KIND_DIAGNOSTIC_FATAL_FAILURE = 403,
    SKIPPY_KIND_DIAGNOSTIC_INVARIANT_VIOLATION = 404,
    /* unload */
    SKIPPY_KIND_UNLOAD_STARTED = 500,
    SKIPPY_KIND_UNLOAD_COMPLETED = 501,
    SKIPPY_KIND_UNLOAD_FAILED = 502,
    SKIPPY_KIND_UNLOAD_FORCED = 503,
    SKIPPY_KIND_UNLOAD_SESSION_DRAINING = 504
} skippy_kind;

typedef enum skippy_emitter {
    SKIPPY_EMITTER_UNKNOWN = 0,
    SKIPPY_EMITTER_OPEN_THREAD = 1,
    SKIPPY_EMITTER_WORKER_THREAD = 2
} skippy_emitter;

typedef enum skippy_progress_unit {
    SKIPPY_PROGRESS_UNIT_NONE = 0,
    SKIPPY_PROGRESS_UNIT_BYTES = 1,
    SKIPPY_PROGRESS_UNIT_ITEMS = 2,
    SKIPPY_PROGRESS_UNIT_TENSORS = 3,
    SKIPPY_PROGRESS_UNIT_STEPS = 4
} skippy_progress_unit;

typedef enum skippy_failure_code {
    SKIPPY_FAILURE_NONE = 0,
    SKIPPY_FAILURE_INVALID_ARGUMENT = 1,
    SKIPPY_FAILURE_IO_ERROR = 2,
    SKIPPY_FAILURE_MODEL_ERROR = 3,
    SKIPPY_FAILURE_RUNTIME_ERROR = 4,
    SKIPPY_FAILURE_BACKEND_ERROR = 5,
    SKIPPY_FAILURE_CANCELLED = 6,
    SKIPPY_FAILURE_INTERNAL_ERROR = 7
} skippy_failure_code;

typedef enum skippy_status {
    SKIPPY_STATUS_OK = 0,
    SKIPPY_STATUS_ERROR = 1,
    SKIPPY_STATUS_INVALID_ARGUMENT = 2,
    SKIPPY_STATUS_UNSUPPORTED = 3,
    SKIPPY_STATUS_BUFFER_TOO_SMALL = 4,
    SKIPPY_STATUS_IO_ERROR = 5,
    SKIPPY_STATUS_MODEL_ERROR = 6,
    SKIPPY_STATUS_RUNTIME_ERROR = 7
} skippy_status;

/* ---- feature bits (u64 mask). Unknown high bits disable nothing. ---- */
#define SKIPPY_FEATURE_RUNTIME_EVENTS (1ull << 24)         /* per-call model-open reporter */
#define SKIPPY_FEATURE_RUNTIME_EVENT_REPORTER (1ull << 31) /* process-global reporter */
#define SKIPPY_FEATURE_MODEL_LOAD_EVENTS_V2 (1ull << 32)
#define SKIPPY_FEATURE_KV_EVENTS (1ull << 33)
#define SKIPPY_FEATURE_DEVICE_EVENTS (1ull << 34)
#define SKIPPY_FEATURE_DIAGNOSTIC_EVENTS (1ull << 35)
#define SKIPPY_FEATURE_UNLOAD_EVENTS (1ull << 36)

#ifdef __cplusplus
}
#endif

#endif /* SKIPPY_EVENT_H */
