/*
 * skippy_internal.h — private layout of the shared ingress region and of the process-local
 * adapter. Nothing here is exported; the region layout is versioned by SKIPPY_INGRESS_ABI_VERSION
 * and validated by skippy_ingress_attach (magic, version, header size, offsets, sizes).
 */
#ifndef SKIPPY_INTERNAL_H
#define SKIPPY_INTERNAL_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "skippy/skippy_event.h"
#include "skippy/skippy_ingress.h"

/* Shared-memory atomics must not fall back to libatomic's process-local locks. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free");

#define SKIPPY_CACHE_LINE 64u
#define SKIPPY_INGRESS_MAGIC 0x31474e4950594b53ull /* "SKYPING1" little endian */

/* A slot of the terminal and diagnostic rings: a Vyukov bounded queue cell. */
typedef struct skippy_ring_slot {
    _Atomic uint64_t seq; /* == position: free for that position; == position + 1: published */
    uint64_t pad;
    skippy_native_fact_v1 fact;
} skippy_ring_slot;

/* A progress slot: the latest value for one (operation_id, kind) key.
 * - `lock`: producer-only try-lock. A producer that finds it taken drops its value and counts
 *   progress_contended; the consumer never takes it, so draining never blocks a producer.
 *   Keying a slot for a new (operation_id, kind) also holds the region's progress_insert_lock,
 *   so one key never occupies two slots.
 * - `state`: (generation << 1) | pending. Whoever clears the pending bit of generation g with a
 *   CAS owns the fate of value g: the consumer (drained) or the next producer (coalesced). A
 *   producer rewrites `fact` only while the bit is clear and publishes with a release store, so
 *   a consumer copy that raced with a rewrite always fails its CAS and is discarded. */
typedef struct skippy_progress_slot {
    _Atomic uint32_t lock;
    _Atomic uint32_t key_kind; /* 0: slot never keyed (progress kinds are never 0) */
    _Atomic uint64_t key_operation;
    _Atomic uint64_t state;
    uint64_t last_value;        /* protected by `lock` */
    skippy_native_fact_v1 fact; /* written under `lock` while not pending */
} skippy_progress_slot;

typedef struct skippy_lane_counters {
    _Atomic uint64_t accepted;
    _Atomic uint64_t drained;
    _Atomic uint64_t dropped_full;
    _Atomic uint64_t coalesced;
} skippy_lane_counters;

typedef struct skippy_ring_ctl {
    alignas(SKIPPY_CACHE_LINE) _Atomic uint64_t tail; /* producers: next position to claim */
    alignas(SKIPPY_CACHE_LINE) _Atomic uint64_t head; /* consumer: next position to take */
} skippy_ring_ctl;

/* The header at offset 0 of the shared region. */
typedef struct skippy_region {
    /* immutable after init (magic is written last, with release) */
    _Atomic uint64_t magic;
    uint32_t abi_version;
    uint32_t header_size;
    uint64_t region_size;
    uint32_t terminal_capacity;
    uint32_t diagnostic_capacity;
    uint32_t progress_slots;
    uint32_t debug_bytes;
    uint32_t ring_slot_size;
    uint32_t progress_slot_size;
    uint64_t terminal_offset;
    uint64_t diagnostic_offset;
    uint64_t progress_offset;
    uint64_t debug_offset;

    /* control words */
    alignas(SKIPPY_CACHE_LINE) _Atomic uint32_t closed;
    _Atomic uint32_t wake_seq; /* futex word: bumped by a waking producer and by close */
    _Atomic uint32_t sleeper;  /* 1 while the host is (about to be) asleep in wait */
    uint32_t pad0;
    _Atomic uint64_t cancel_operation_id;
    alignas(SKIPPY_CACHE_LINE) _Atomic uint64_t ingress_sequence;
    /* progress-table key insertion try-lock (producers only; contended -> counted drop) */
    alignas(SKIPPY_CACHE_LINE) _Atomic uint32_t progress_insert_lock;

    skippy_ring_ctl terminal_ctl;
    skippy_ring_ctl diagnostic_ctl;

    /* debug byte ring: records [u32 commit word = (len << 1) | 1][len bytes], 4-byte aligned */
    alignas(SKIPPY_CACHE_LINE) _Atomic uint64_t debug_head; /* producers reserve */
    alignas(SKIPPY_CACHE_LINE) _Atomic uint64_t debug_tail; /* consumer frees */

    alignas(SKIPPY_CACHE_LINE) skippy_lane_counters lanes[SKIPPY_LANE_COUNT];
    alignas(SKIPPY_CACHE_LINE) _Atomic uint64_t suppressed_regression;
    _Atomic uint64_t progress_contended;
    _Atomic uint64_t rejected_abi_version;
    _Atomic uint64_t rejected_struct_size;
    _Atomic uint64_t rejected_detail;
    _Atomic uint64_t rejected_discriminant;
    _Atomic uint64_t rejected_closed;
    _Atomic uint64_t unknown_kind;
    _Atomic uint64_t detail_truncated;
    alignas(SKIPPY_CACHE_LINE) _Atomic uint64_t log_messages_by_level[6];
    _Atomic uint64_t debug_lines_captured;
    _Atomic uint64_t debug_bytes_dropped;
} skippy_region;

/* Process-local handle (skippy_ingress_t): the base of this process's mapping plus a private,
 * validated copy of the layout. Bounds never come from shared memory after init/attach, so a
 * peer that scribbles the shared header cannot make this process read outside its mapping. */
struct skippy_ingress {
    skippy_region *region;
    uint64_t region_size;
    uint32_t terminal_capacity;
    uint32_t diagnostic_capacity;
    uint32_t progress_slots;
    uint32_t debug_bytes;
    uint64_t terminal_offset;
    uint64_t diagnostic_offset;
    uint64_t progress_offset;
    uint64_t debug_offset;
};

/* Process-local engine adapter. */
struct skippy_adapter {
    skippy_ingress_t *ingress;
    uint32_t flags;
    _Atomic uint32_t progress_delay_us;
    _Atomic uint64_t active_operation; /* 0: no scope */
    _Atomic uint64_t active_model;
    _Atomic uint64_t sequence;     /* last event sequence used in the active operation */
    _Atomic int64_t last_progress; /* last emitted STEPS value; -1 before the first */
    _Atomic uint32_t device_reported;
    /* Callbacks in flight, by epoch parity: operation_end flips the epoch and waits only for the
     * old parity, so a stream of new callbacks can never starve it. */
    _Atomic uint32_t epoch;
    _Atomic uint32_t in_flight[2];
};

enum skippy_reject_reason {
    SKIPPY_REJECT_ABI_VERSION,
    SKIPPY_REJECT_STRUCT_SIZE,
    SKIPPY_REJECT_DETAIL,
    SKIPPY_REJECT_DISCRIMINANT,
    SKIPPY_REJECT_CLOSED
};

/* ---- ingress.c ---- */
/* Next ingress sequence number (from 1). */
uint64_t skippy_ingress_next_sequence(skippy_ingress_t *ingress);
/* Pushes a fully built fact into lane fact->lane and does the counting (accepted, dropped_full,
 * coalesced, suppressed_regression, progress_contended). Never blocks; wakes a sleeping host. */
void skippy_ingress_push(skippy_ingress_t *ingress, const skippy_native_fact_v1 *fact);
void skippy_ingress_count_reject(skippy_ingress_t *ingress, enum skippy_reject_reason reason);
void skippy_ingress_count_log(skippy_ingress_t *ingress, int level);
void skippy_ingress_debug_write(skippy_ingress_t *ingress, const char *text);
bool skippy_ingress_is_closed(const skippy_ingress_t *ingress);
uint64_t skippy_ingress_cancel_word(const skippy_ingress_t *ingress);

/* ---- trampoline.c ---- */
/* Validates, copies and pushes one event stamped with operation_id. Reads the first 8 bytes,
 * then nothing beyond event->struct_size. */
void skippy_ingest_event(skippy_ingress_t *ingress, const skippy_runtime_event_v1 *event,
                         uint64_t operation_id);
/* Lane for a (category, kind); *unknown set when either is outside the known sets. */
uint32_t skippy_lane_for(uint32_t category, uint32_t kind, bool *unknown);

/* ---- llama_adapter.c ---- */
uint64_t skippy_monotonic_ns(void);
/* In-flight section of a callback: enter returns the active operation id (0: none) and a token
 * for leave; every enter must be paired with a leave. skippy_operation_end waits for every
 * section that could have seen the ended operation. */
uint64_t skippy_adapter_enter(skippy_adapter_t *adapter, uint32_t *token);
void skippy_adapter_leave(skippy_adapter_t *adapter, uint32_t token);

/* ---- ggml_devices.c ---- */
typedef struct skippy_selected_device {
    char name[64];
    uint32_t type;
    uint64_t memory_free;
    uint64_t memory_total;
} skippy_selected_device;
/* OK, UNSUPPORTED when ggml is unresolved, ERROR when no device matched. */
int32_t skippy_ggml_select_device(int32_t n_gpu_layers, skippy_selected_device *out);
/* ggml_set_abort_callback of the resolved ggml (NULL when unresolved or absent). */
typedef void (*skippy_ggml_abort_hook)(const char *error_message);
typedef skippy_ggml_abort_hook (*skippy_ggml_set_abort_fn)(skippy_ggml_abort_hook callback);
skippy_ggml_set_abort_fn skippy_ggml_abort_setter(void);

#endif /* SKIPPY_INTERNAL_H */
