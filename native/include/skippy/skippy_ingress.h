/*
 * skippy_ingress.h — shared-memory native ingress, llama.cpp adapter, ggml device enumeration,
 * introspection and test emitters.
 *
 * Data flow: a producer (llama.cpp hook or a Skippy runtime reporter) calls a C function of this
 * library -> validate -> copy into an owned skippy_native_fact_v1 -> push into one of three lanes
 * of an ingress region that lives in caller-provided SHARED memory -> the host process, which maps
 * the same memory, pulls with skippy_ingress_wait/skippy_ingress_drain.
 *
 * Producer-path guarantees (everything reachable from skippy_trampoline_v1 and the
 * skippy_llama_* callbacks): no allocation, no lock, no waiting, no formatting, no I/O. The only
 * syscall is one futex wake when, and only when, the host sleeps in skippy_ingress_wait. A full
 * lane or a contended progress slot drops the record and counts it.
 *
 * Crash behaviour: facts published before a producer process died stay drainable. A producer
 * killed between claiming a ring slot and publishing it leaves that lane stalled at the slot
 * (one region per engine lifetime keeps this contained); a producer killed inside a progress
 * slot's try-lock leaves that slot (or, during a key insert, new progress keys) contended.
 *
 * The region is position independent (offsets, never pointers): host and engine map it at
 * different addresses. Atomics are C11 lock-free 32/64-bit atomics on the shared mapping.
 */
#ifndef SKIPPY_INGRESS_H
#define SKIPPY_INGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "skippy/skippy_event.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SKIPPY_INGRESS_ABI_VERSION 1u

/* Defaults used when a config field is 0. Capacities are rounded up to a power of two. */
#define SKIPPY_INGRESS_DEFAULT_TERMINAL_CAPACITY 1024u
#define SKIPPY_INGRESS_DEFAULT_DIAGNOSTIC_CAPACITY 1024u
#define SKIPPY_INGRESS_DEFAULT_PROGRESS_SLOTS 64u
#define SKIPPY_INGRESS_DEFAULT_DEBUG_BYTES 65536u
/* Upper bounds that keep a region reasonable (config above them is rejected). */
#define SKIPPY_INGRESS_MAX_CAPACITY (1u << 20)
#define SKIPPY_INGRESS_MAX_DEBUG_BYTES (1u << 26)
/* One captured debug-log message is bounded to this many bytes (the rest is counted dropped). */
#define SKIPPY_DEBUG_MAX_MESSAGE_BYTES 1024u

typedef struct skippy_ingress_config_v1 {
    uint32_t struct_size;         /*  0 */
    uint32_t terminal_capacity;   /*  4  records; 0 = default */
    uint32_t diagnostic_capacity; /*  8  records; 0 = default */
    uint32_t progress_slots;      /* 12  distinct (operation_id, kind) keys; 0 = default */
    uint32_t debug_bytes;         /* 16  debug-log byte ring; 0 = default */
    uint32_t reserved;            /* 20 */
} skippy_ingress_config_v1;

_Static_assert(sizeof(skippy_ingress_config_v1) == 24, "config size");

/* ---- lanes (service classes) ---- */
typedef enum skippy_lane {
    SKIPPY_LANE_TERMINAL = 0,   /* terminal and state-transition facts */
    SKIPPY_LANE_PROGRESS = 1,   /* latest value per (operation_id, kind), coalesced: a value
                                 * not strictly greater than the key's last stored value (drained
                                 * or not, while the key keeps its slot) is suppressed; drained
                                 * keys are evicted for new keys when no slot is free */
    SKIPPY_LANE_DIAGNOSTIC = 2, /* 400-402 and unknown categories/kinds; droppable */
    SKIPPY_LANE_COUNT = 3
} skippy_lane;

/* ---- fact flags ---- */
#define SKIPPY_FACT_HAS_SUMMARIES (1u << 0)    /* producer struct_size >= 144 */
#define SKIPPY_FACT_DETAIL_TRUNCATED (1u << 1) /* detail_len > detail bytes copied */
#define SKIPPY_FACT_UNKNOWN_KIND (1u << 2)     /* category or kind outside the known sets */
#define SKIPPY_FACT_LARGER_STRUCT (1u << 3)    /* producer struct_size > 144; known fields only */

/* The owned record the host drains. `event` is a full 144-byte copy: the extension fields are
 * zero and SKIPPY_FACT_HAS_SUMMARIES is clear when the producer's struct was shorter; detail_ptr
 * is always NULL and detail_len is the producer's length; the copied bytes are in `detail`. */
typedef struct skippy_native_fact_v1 {
    uint32_t struct_size;          /*   0 */
    uint32_t lane;                 /*   4  skippy_lane */
    uint32_t flags;                /*   8  SKIPPY_FACT_* */
    uint32_t source_struct_size;   /*  12  the producer's struct_size */
    uint64_t operation_id;         /*  16  stamped from the adapter's scope; 0 when none */
    uint64_t ingress_sequence;     /*  24  per ingress region, in acceptance order, from 1 */
    uint64_t coalesced_count;      /*  32  undrained progress values this record replaced */
    skippy_runtime_event_v1 event; /*  40 */
    uint32_t detail_copied_len;    /* 184 */
    uint32_t reserved;             /* 188 */
    uint8_t detail[SKIPPY_RUNTIME_EVENT_DETAIL_COPY_BYTES]; /* 192 */
} skippy_native_fact_v1;

_Static_assert(offsetof(skippy_native_fact_v1, event) == 40, "fact.event");
_Static_assert(offsetof(skippy_native_fact_v1, detail_copied_len) == 184, "fact.detail_copied_len");
_Static_assert(offsetof(skippy_native_fact_v1, detail) == 192, "fact.detail");
_Static_assert(sizeof(skippy_native_fact_v1) == 448, "fact size");

typedef struct skippy_lane_stats_v1 {
    uint64_t accepted;     /* passed validation and were offered to the lane */
    uint64_t drained;      /* handed to the host by skippy_ingress_drain */
    uint64_t dropped_full; /* lane full (ring full / no free progress slot) */
    uint64_t coalesced;    /* undrained values replaced by a newer value of the same key */
} skippy_lane_stats_v1;

_Static_assert(sizeof(skippy_lane_stats_v1) == 32, "lane stats size");

/* Conservation (exact once no producer runs and after a final drain, when pending == 0):
 *   per lane: accepted == drained + dropped_full + coalesced + pending
 *   attempts == sum(accepted) + sum(rejected_*) + suppressed_regression + progress_contended
 * unknown_kind and detail_truncated are sub-counts of accepted. */
typedef struct skippy_ingress_stats_v1 {
    uint32_t struct_size;                    /*   0 */
    uint32_t reserved;                       /*   4 */
    skippy_lane_stats_v1 lanes[SKIPPY_LANE_COUNT]; /*   8 */
    uint64_t suppressed_regression;          /* 104 */
    uint64_t progress_contended;             /* 112 */
    uint64_t rejected_abi_version;           /* 120 */
    uint64_t rejected_struct_size;           /* 128  includes a NULL event */
    uint64_t rejected_detail;                /* 136 */
    uint64_t rejected_discriminant;          /* 144 */
    uint64_t rejected_closed;                /* 152 */
    uint64_t unknown_kind;                   /* 160 */
    uint64_t detail_truncated;               /* 168 */
    uint64_t log_messages_by_level[6];       /* 176  ggml_log_level NONE,DEBUG,INFO,WARN,ERROR,CONT;
                                                     out-of-range levels count as NONE */
    uint64_t debug_lines_captured;           /* 224 */
    uint64_t debug_bytes_dropped;            /* 232 */
} skippy_ingress_stats_v1;

_Static_assert(offsetof(skippy_ingress_stats_v1, lanes) == 8, "stats.lanes");
_Static_assert(offsetof(skippy_ingress_stats_v1, suppressed_regression) == 104, "stats.suppressed");
_Static_assert(offsetof(skippy_ingress_stats_v1, log_messages_by_level) == 176, "stats.log");
_Static_assert(sizeof(skippy_ingress_stats_v1) == 240, "stats size");

/* Opaque, process-local handle onto one mapping of a region: the mapping's address plus a
 * private, validated copy of the layout (bounds never come from shared memory afterwards, so a
 * peer that scribbles the shared header cannot make this process read outside its mapping).
 * Release it with skippy_ingress_detach before unmapping. */
typedef struct skippy_ingress skippy_ingress_t;
/* Opaque, process-local engine adapter (operation scope, progress state). */
typedef struct skippy_adapter skippy_adapter_t;

/* ---- host side ---- */

/* Bytes of shared memory a region with this config needs (0 if the config is invalid).
 * NULL config = all defaults. */
SKIPPY_API size_t skippy_ingress_required_size(const skippy_ingress_config_v1 *config);
/* Initialise a region (64-byte aligned, at least required_size bytes; it is zeroed first) and
 * return a handle onto it. NULL on bad input. */
SKIPPY_API skippy_ingress_t *skippy_ingress_init(void *mem, size_t size,
                                                 const skippy_ingress_config_v1 *config);
/* Engine side: validate magic, version, layout and size of an initialised region and return a
 * handle onto this mapping of it. NULL if bad. */
SKIPPY_API skippy_ingress_t *skippy_ingress_attach(void *mem, size_t size);
/* Frees this process's handle (destroy adapters created on it first). The region, its facts
 * and every other process's handle are untouched. */
SKIPPY_API void skippy_ingress_detach(skippy_ingress_t *ingress);
/* 1 when facts are pending (also after close, so the host can drain the rest), 0 on timeout,
 * -1 when closed and nothing is pending. Sleeps on a shared (cross-process) futex. */
SKIPPY_API int skippy_ingress_wait(skippy_ingress_t *ingress, uint32_t timeout_ms);
/* Single consumer. Terminal lane first, then progress slots, then the diagnostic lane. */
SKIPPY_API size_t skippy_ingress_drain(skippy_ingress_t *ingress, skippy_native_fact_v1 *out,
                                       size_t max);
SKIPPY_API void skippy_ingress_stats(const skippy_ingress_t *ingress, skippy_ingress_stats_v1 *out);
/* Marks the region closed (producers then count rejected_closed) and wakes waiters. */
SKIPPY_API void skippy_ingress_close(skippy_ingress_t *ingress);
/* Sets the shared cancel word read by the progress/abort callbacks (0 clears it). */
SKIPPY_API void skippy_ingress_request_cancel(skippy_ingress_t *ingress, uint64_t operation_id);
/* Drains the opt-in debug-log byte ring: whole captured messages, concatenated (llama.cpp lines
 * end in '\n'; a message truncated to SKIPPY_DEBUG_MAX_MESSAGE_BYTES keeps a closing '\n').
 * Returns the bytes written; a message that does not fit stays for the next call, so pass
 * cap >= SKIPPY_DEBUG_MAX_MESSAGE_BYTES to always make progress. */
SKIPPY_API size_t skippy_ingress_debug_read(skippy_ingress_t *ingress, char *out, size_t cap);

/* ---- engine side: adapter and trampoline ---- */

#define SKIPPY_ADAPTER_CAPTURE_DEBUG_LOG (1u << 0)

/* Allocates (the only allocation of the engine side). NULL on bad arguments. */
SKIPPY_API skippy_adapter_t *skippy_adapter_create(skippy_ingress_t *ingress, uint32_t flags);
/* Ends any active scope, waits for in-flight callbacks, frees. Unhook llama.cpp callbacks
 * (llama_log_set(NULL, NULL)) BEFORE destroying an adapter they point at. */
SKIPPY_API void skippy_adapter_destroy(skippy_adapter_t *adapter);
/* Fills a reporter {abi 1, 24, skippy_trampoline_v1, adapter}. */
SKIPPY_API void skippy_adapter_reporter(skippy_adapter_t *adapter,
                                        skippy_runtime_event_reporter_v1 *out);
/* The reporter callback. user_data is a skippy_adapter_t*. */
SKIPPY_API void skippy_trampoline_v1(const skippy_runtime_event_v1 *event, void *user_data);

/* Operation scope. begin: SKIPPY_STATUS_INVALID_ARGUMENT when operation_id is 0 or a scope is
 * already active. After end returns, no callback pushes a fact stamped with that operation and
 * the llama.cpp hooks push nothing at all. Per-operation event sequence starts at 1. */
SKIPPY_API int32_t skippy_operation_begin(skippy_adapter_t *adapter, uint64_t operation_id,
                                          uint64_t model_id);
SKIPPY_API void skippy_operation_end(skippy_adapter_t *adapter);

/* Model load = operation begin + MODEL_OPEN STARTED. */
SKIPPY_API int32_t skippy_model_load_begin(skippy_adapter_t *adapter, uint64_t operation_id,
                                           uint64_t model_id);
/* llama_model_params.progress_callback; user_data is the adapter. Emits MODEL_OPEN PROGRESS
 * {round(clamp(p)*1000), 1000, STEPS} only when strictly greater than the last emitted value.
 * Returns false (llama.cpp aborts the load) when the shared cancel word equals the active
 * operation id. */
SKIPPY_API bool skippy_llama_progress_callback(float progress, void *user_data);
/* BACKEND_DEVICE_SELECTED at most once per operation: first GPU/IGPU device when
 * n_gpu_layers != 0 and one exists, else the CPU device. detail = device name, summaries:
 * 0 = memory free, 1 = memory total, 2 = ggml device type. UNSUPPORTED when ggml is not
 * resolved (skippy_ggml_resolve), INVALID_ARGUMENT without an active scope, ERROR if already
 * reported in this operation. */
SKIPPY_API int32_t skippy_model_load_report_device(skippy_adapter_t *adapter, int32_t n_gpu_layers);
/* FINISHED (status OK) or FAILED_HANDLED with the same status/failure code, then scope end. */
SKIPPY_API void skippy_model_load_end(skippy_adapter_t *adapter, int32_t status,
                                      uint32_t failure_code);
/* ggml_log_callback (level is enum ggml_log_level). Counts by level; copies raw text into the
 * debug ring only with SKIPPY_ADAPTER_CAPTURE_DEBUG_LOG. Never parses, never prints. */
SKIPPY_API void skippy_llama_log_callback(int level, const char *text, void *user_data);
/* ggml_abort_callback: true when the shared cancel word equals the active operation id. */
SKIPPY_API bool skippy_llama_abort_callback(void *user_data);
/* ggml's fatal-error hook (ggml_set_abort_callback, process-wide): from now on, a ggml_abort
 * (a failed GGML_ASSERT, GGML_ABORT) in this process first pushes DIAGNOSTIC FATAL_FAILURE into
 * the adapter's ring — failure code MODEL_ERROR inside an operation (a load), INTERNAL_ERROR
 * outside one (serving) — and writes ggml's message to stderr, as ggml does without a hook;
 * then ggml aborts the process. ggml's message (source paths, asserted text) never enters the
 * ring. One adapter per process: a later call replaces an earlier one. UNSUPPORTED when ggml is
 * not resolved (skippy_ggml_resolve) or has no abort hook. Destroy the adapter only after
 * skippy_adapter_remove_fatal_hook. */
SKIPPY_API int32_t skippy_adapter_install_fatal_hook(skippy_adapter_t *adapter);
/* Puts ggml's own fatal-error behaviour back (no hook). */
SKIPPY_API void skippy_adapter_remove_fatal_hook(void);
/* Test hook: sleep this long in every progress callback (0 = off, the default). */
SKIPPY_API void skippy_adapter_set_test_progress_delay_us(skippy_adapter_t *adapter,
                                                          uint32_t delay_us);

/* ---- ggml device enumeration (symbols resolved at run time; no link-time dependency) ---- */

/* enum ggml_backend_dev_type as declared by the ggml-backend.h that llama-cpp-python 0.3.36
 * vendors (IGPU sits between GPU and ACCEL there). */
typedef enum skippy_ggml_device_type {
    SKIPPY_GGML_DEVICE_TYPE_CPU = 0,
    SKIPPY_GGML_DEVICE_TYPE_GPU = 1,
    SKIPPY_GGML_DEVICE_TYPE_IGPU = 2,
    SKIPPY_GGML_DEVICE_TYPE_ACCEL = 3,
    SKIPPY_GGML_DEVICE_TYPE_META = 4
} skippy_ggml_device_type;

typedef struct skippy_device_info_v1 {
    uint32_t struct_size;  /*  0 */
    uint32_t type;         /*  4  skippy_ggml_device_type */
    uint64_t memory_free;  /*  8 */
    uint64_t memory_total; /* 16 */
    char name[64];         /* 24  NUL-terminated, truncated */
    char description[128]; /* 88  NUL-terminated, truncated */
} skippy_device_info_v1;

_Static_assert(sizeof(skippy_device_info_v1) == 216, "device info size");

/* dlopen each path (RTLD_NOLOAD first, then RTLD_NOW) and take every ggml symbol from the first
 * library that has it. OK when all symbols resolved, UNSUPPORTED otherwise. Call before use. */
SKIPPY_API int32_t skippy_ggml_resolve(const char *const *library_paths, size_t count);
/* *count = devices available; min(max, *count) entries written. BUFFER_TOO_SMALL when max was
 * smaller than the device count (entries still written), UNSUPPORTED when unresolved. */
SKIPPY_API int32_t skippy_devices_list(skippy_device_info_v1 *out, size_t max, size_t *count);
/* Backend registry names ("CPU", "RPC", ...), same count/status rules as skippy_devices_list. */
SKIPPY_API int32_t skippy_backends_list(char (*names)[64], size_t max, size_t *count);

/* ---- introspection ---- */

typedef struct skippy_abi_field_v1 {
    const char *struct_name;
    const char *field_name; /* "" = the row carries sizeof(struct) in `size` */
    uint32_t offset;
    uint32_t size;
} skippy_abi_field_v1;

SKIPPY_API uint32_t skippy_native_abi_version(void);
SKIPPY_API uint32_t skippy_ingress_abi_version(void);
SKIPPY_API uint64_t skippy_native_features(void);
SKIPPY_API const skippy_abi_field_v1 *skippy_abi_fields(size_t *count);

/* ---- test emitters (tests and benchmarks only) ---- */

/* Calls skippy_trampoline_v1((const skippy_runtime_event_v1 *)bytes, adapter). The caller
 * guarantees the buffer holds at least max(8, struct_size) bytes. */
SKIPPY_API void skippy_test_emit_raw(skippy_adapter_t *adapter, const void *bytes);

typedef enum skippy_test_producer_mode {
    /* every thread emits `kind` (MODEL_OPEN category) through skippy_trampoline_v1 of the given
     * adapter; the operation id comes from the adapter's scope */
    SKIPPY_TEST_MODE_TRAMPOLINE = 0,
    /* every thread emits strictly increasing MODEL_OPEN PROGRESS on its own key: a private
     * adapter per thread with operation id (1 << 48) + thread index + 1 */
    SKIPPY_TEST_MODE_PROGRESS_PER_THREAD = 1,
    /* every thread calls skippy_llama_progress_callback(adapter) with p cycling over
     * 0.001..1.0 in 0.001 steps: what llama.cpp does during a load */
    SKIPPY_TEST_MODE_LLAMA_PROGRESS = 2
} skippy_test_producer_mode;

typedef struct skippy_test_producers skippy_test_producers_t;

typedef struct skippy_test_producer_report_v1 {
    uint32_t struct_size;       /*  0 */
    uint32_t threads;           /*  4 */
    uint64_t records_attempted; /*  8  emits performed (all threads) */
    uint64_t elapsed_ns;        /* 16  start to last thread done */
    uint64_t latency_p50_ns;    /* 24  per emit, upper bound of the histogram bucket */
    uint64_t latency_p99_ns;    /* 32 */
    uint64_t latency_max_ns;    /* 40  exact */
} skippy_test_producer_report_v1;

_Static_assert(sizeof(skippy_test_producer_report_v1) == 48, "producer report size");

/* records_per_thread == 0 means "until skippy_test_producers_stop". NULL on bad arguments. */
SKIPPY_API skippy_test_producers_t *skippy_test_producers_start(skippy_adapter_t *adapter,
                                                                uint32_t threads,
                                                                uint64_t records_per_thread,
                                                                uint32_t kind,
                                                                uint32_t progress_mode);
SKIPPY_API int skippy_test_producers_done(skippy_test_producers_t *producers);
/* Emits performed so far by all threads (for synchronising absence checks). */
SKIPPY_API uint64_t skippy_test_producers_attempts(skippy_test_producers_t *producers);
/* Asks the threads to stop after their current emit. */
SKIPPY_API void skippy_test_producers_stop(skippy_test_producers_t *producers);
/* Joins, fills the report (may be NULL), frees the handle. */
SKIPPY_API void skippy_test_producers_join(skippy_test_producers_t *producers,
                                           skippy_test_producer_report_v1 *out);
/* Meant to be called through ctypes.PyDLL (GIL held): sleeps in 100 us steps until the
 * producers are done or timeout_ms passed; 1 if they finished. */
SKIPPY_API int skippy_test_hold_gil_until_producers_done(skippy_test_producers_t *producers,
                                                         uint32_t timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* SKIPPY_INGRESS_H */
