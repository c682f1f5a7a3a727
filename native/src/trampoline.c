/*
 * trampoline.c — the reporter callback: validate a borrowed skippy_runtime_event_v1, copy it into
 * an owned skippy_native_fact_v1, stamp the operation, push it into its lane.
 *
 * Reads the first 8 bytes (abi_version, struct_size), then nothing beyond struct_size, then at
 * most SKIPPY_RUNTIME_EVENT_DETAIL_COPY_BYTES detail bytes. All reads go through memcpy so an
 * unaligned producer buffer is fine. No allocation, lock, formatting or I/O.
 */
#include <string.h>

#include "skippy_internal.h"

static bool kind_is_known(uint32_t kind) {
    return (kind >= 1 && kind <= 5) || (kind >= 100 && kind <= 104) ||
           (kind >= 200 && kind <= 204) || (kind >= 300 && kind <= 308) ||
           (kind >= 400 && kind <= 404) || (kind >= 500 && kind <= 504);
}

uint32_t skippy_lane_for(uint32_t category, uint32_t kind, bool *unknown) {
    bool known = category >= SKIPPY_CATEGORY_MODEL_OPEN && category <= SKIPPY_CATEGORY_UNLOAD &&
                 kind_is_known(kind);
    *unknown = !known;
    if (!known) return SKIPPY_LANE_DIAGNOSTIC;
    if (kind == SKIPPY_KIND_MODEL_OPEN_PROGRESS) return SKIPPY_LANE_PROGRESS;
    if (kind >= SKIPPY_KIND_DIAGNOSTIC_WARNING_RAISED &&
        kind <= SKIPPY_KIND_DIAGNOSTIC_RECOVERABLE_FAILURE)
        return SKIPPY_LANE_DIAGNOSTIC;
    return SKIPPY_LANE_TERMINAL;
}

void skippy_ingest_event(skippy_ingress_t *ing, const skippy_runtime_event_v1 *event,
                         uint64_t operation_id) {
    if (ing == NULL) return;
    if (skippy_ingress_is_closed(ing)) {
        skippy_ingress_count_reject(ing, SKIPPY_REJECT_CLOSED);
        return;
    }
    if (event == NULL) {
        skippy_ingress_count_reject(ing, SKIPPY_REJECT_STRUCT_SIZE);
        return;
    }
    uint32_t header[2];
    memcpy(header, event, sizeof(header));
    if (header[0] != SKIPPY_RUNTIME_EVENT_ABI_VERSION) {
        skippy_ingress_count_reject(ing, SKIPPY_REJECT_ABI_VERSION);
        return;
    }
    uint32_t size = header[1];
    if (size < SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE) {
        skippy_ingress_count_reject(ing, SKIPPY_REJECT_STRUCT_SIZE);
        return;
    }

    skippy_native_fact_v1 fact;
    memset(&fact, 0, sizeof(fact));
    uint32_t known = size < SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE ? size
                                                              : SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE;
    memcpy(&fact.event, event, known);
    const skippy_runtime_event_v1 *ev = &fact.event;

    if (ev->detail_len > SKIPPY_RUNTIME_EVENT_MAX_DETAIL_LEN ||
        (ev->detail_len != 0 && ev->detail_ptr == NULL)) {
        skippy_ingress_count_reject(ing, SKIPPY_REJECT_DETAIL);
        return;
    }
    if (ev->category == 0) {
        skippy_ingress_count_reject(ing, SKIPPY_REJECT_DISCRIMINANT);
        return;
    }

    uint32_t flags = 0;
    if (size >= SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE) flags |= SKIPPY_FACT_HAS_SUMMARIES;
    if (size > SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE) flags |= SKIPPY_FACT_LARGER_STRUCT;

    uint64_t copy = ev->detail_len;
    if (copy > SKIPPY_RUNTIME_EVENT_DETAIL_COPY_BYTES) {
        copy = SKIPPY_RUNTIME_EVENT_DETAIL_COPY_BYTES;
        flags |= SKIPPY_FACT_DETAIL_TRUNCATED;
    }
    if (copy != 0) memcpy(fact.detail, ev->detail_ptr, (size_t)copy);
    fact.detail_copied_len = (uint32_t)copy;
    fact.event.detail_ptr = NULL; /* borrowed pointers never leave the callback */

    bool unknown;
    fact.lane = skippy_lane_for(ev->category, ev->kind, &unknown);
    if (unknown) flags |= SKIPPY_FACT_UNKNOWN_KIND;

    fact.struct_size = (uint32_t)sizeof(fact);
    fact.flags = flags;
    fact.source_struct_size = size;
    fact.operation_id = operation_id;
    fact.ingress_sequence = skippy_ingress_next_sequence(ing);

    if (unknown) atomic_fetch_add_explicit(&ing->region->unknown_kind, 1, memory_order_relaxed);
    if (flags & SKIPPY_FACT_DETAIL_TRUNCATED)
        atomic_fetch_add_explicit(&ing->region->detail_truncated, 1, memory_order_relaxed);
    skippy_ingress_push(ing, &fact);
}

SKIPPY_API void skippy_trampoline_v1(const skippy_runtime_event_v1 *event, void *user_data) {
    skippy_adapter_t *adapter = user_data;
    if (adapter == NULL) return;
    uint32_t token;
    uint64_t operation_id = skippy_adapter_enter(adapter, &token);
    skippy_ingest_event(adapter->ingress, event, operation_id);
    skippy_adapter_leave(adapter, token);
}
