/*
 * ingress.c — the shared-memory region: layout, lanes, counters, wait/drain, debug byte ring.
 *
 * Terminal and diagnostic lanes are bounded MPSC rings (Vyukov bounded queue: per-slot sequence
 * numbers, CAS on the tail; a full ring is counted and the record dropped, never waited on).
 * The progress lane is a table of latest-value slots keyed by (operation_id, kind).
 * Nothing on a producer path allocates, locks, waits, formats or does I/O; the only syscall is a
 * futex wake when the host announced it is asleep (sleeper flag exchanged to 0: one wake per
 * sleep).
 */
#include <errno.h>
#include <stdlib.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "skippy_internal.h"

#define RELAXED memory_order_relaxed
#define ACQUIRE memory_order_acquire
#define RELEASE memory_order_release
#define ACQ_REL memory_order_acq_rel
#define SEQ_CST memory_order_seq_cst

#define DEBUG_MIN_BYTES 64u
/* How far past the capture bound a message is scanned to count its dropped bytes. */
#define DEBUG_DROP_SCAN_BYTES 65536u

typedef struct skippy_layout {
    uint32_t terminal_capacity;
    uint32_t diagnostic_capacity;
    uint32_t progress_slots;
    uint32_t debug_bytes;
    uint64_t terminal_offset;
    uint64_t diagnostic_offset;
    uint64_t progress_offset;
    uint64_t debug_offset;
    uint64_t region_size;
} skippy_layout;

static bool is_pow2(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

static bool compute_layout(uint32_t terminal, uint32_t diagnostic, uint32_t progress,
                           uint32_t debug, skippy_layout *out) {
    if (terminal == 0) terminal = SKIPPY_INGRESS_DEFAULT_TERMINAL_CAPACITY;
    if (diagnostic == 0) diagnostic = SKIPPY_INGRESS_DEFAULT_DIAGNOSTIC_CAPACITY;
    if (progress == 0) progress = SKIPPY_INGRESS_DEFAULT_PROGRESS_SLOTS;
    if (debug == 0) debug = SKIPPY_INGRESS_DEFAULT_DEBUG_BYTES;
    if (!is_pow2(terminal) || !is_pow2(diagnostic) || !is_pow2(progress) || !is_pow2(debug))
        return false;
    if (terminal > SKIPPY_INGRESS_MAX_CAPACITY || diagnostic > SKIPPY_INGRESS_MAX_CAPACITY ||
        progress > SKIPPY_INGRESS_MAX_CAPACITY || debug > SKIPPY_INGRESS_MAX_DEBUG_BYTES ||
        debug < DEBUG_MIN_BYTES)
        return false;
    out->terminal_capacity = terminal;
    out->diagnostic_capacity = diagnostic;
    out->progress_slots = progress;
    out->debug_bytes = debug;
    uint64_t off = align_up(sizeof(skippy_region), SKIPPY_CACHE_LINE);
    out->terminal_offset = off;
    off = align_up(off + (uint64_t)terminal * sizeof(skippy_ring_slot), SKIPPY_CACHE_LINE);
    out->diagnostic_offset = off;
    off = align_up(off + (uint64_t)diagnostic * sizeof(skippy_ring_slot), SKIPPY_CACHE_LINE);
    out->progress_offset = off;
    off = align_up(off + (uint64_t)progress * sizeof(skippy_progress_slot), SKIPPY_CACHE_LINE);
    out->debug_offset = off;
    off = align_up(off + debug, SKIPPY_CACHE_LINE);
    out->region_size = off;
    return true;
}

static bool layout_from_config(const skippy_ingress_config_v1 *config, skippy_layout *out) {
    if (config == NULL) return compute_layout(0, 0, 0, 0, out);
    if (config->struct_size < sizeof(skippy_ingress_config_v1)) return false;
    return compute_layout(config->terminal_capacity, config->diagnostic_capacity,
                          config->progress_slots, config->debug_bytes, out);
}

static skippy_ring_slot *ring_slots(skippy_ingress_t *ing, uint64_t offset) {
    return (skippy_ring_slot *)(void *)((char *)ing->region + offset);
}

static skippy_progress_slot *progress_slots(skippy_ingress_t *ing) {
    return (skippy_progress_slot *)(void *)((char *)ing->region + ing->progress_offset);
}

static unsigned char *debug_bytes(skippy_ingress_t *ing) {
    return (unsigned char *)ing->region + ing->debug_offset;
}

/* The process-local handle: allocated at init/attach only (never on a producer path). */
static skippy_ingress_t *make_handle(skippy_region *region, const skippy_layout *layout) {
    skippy_ingress_t *ing = calloc(1, sizeof(*ing));
    if (ing == NULL) return NULL;
    ing->region = region;
    ing->region_size = layout->region_size;
    ing->terminal_capacity = layout->terminal_capacity;
    ing->diagnostic_capacity = layout->diagnostic_capacity;
    ing->progress_slots = layout->progress_slots;
    ing->debug_bytes = layout->debug_bytes;
    ing->terminal_offset = layout->terminal_offset;
    ing->diagnostic_offset = layout->diagnostic_offset;
    ing->progress_offset = layout->progress_offset;
    ing->debug_offset = layout->debug_offset;
    return ing;
}

SKIPPY_API size_t skippy_ingress_required_size(const skippy_ingress_config_v1 *config) {
    skippy_layout layout;
    if (!layout_from_config(config, &layout)) return 0;
    return (size_t)layout.region_size;
}

SKIPPY_API skippy_ingress_t *skippy_ingress_init(void *mem, size_t size,
                                                 const skippy_ingress_config_v1 *config) {
    skippy_layout layout;
    if (mem == NULL || ((uintptr_t)mem % SKIPPY_CACHE_LINE) != 0) return NULL;
    if (!layout_from_config(config, &layout) || size < layout.region_size) return NULL;
    memset(mem, 0, (size_t)layout.region_size);
    skippy_region *region = mem;
    region->abi_version = SKIPPY_INGRESS_ABI_VERSION;
    region->header_size = (uint32_t)sizeof(skippy_region);
    region->region_size = layout.region_size;
    region->terminal_capacity = layout.terminal_capacity;
    region->diagnostic_capacity = layout.diagnostic_capacity;
    region->progress_slots = layout.progress_slots;
    region->debug_bytes = layout.debug_bytes;
    region->ring_slot_size = (uint32_t)sizeof(skippy_ring_slot);
    region->progress_slot_size = (uint32_t)sizeof(skippy_progress_slot);
    region->terminal_offset = layout.terminal_offset;
    region->diagnostic_offset = layout.diagnostic_offset;
    region->progress_offset = layout.progress_offset;
    region->debug_offset = layout.debug_offset;
    skippy_ingress_t *ing = make_handle(region, &layout);
    if (ing == NULL) return NULL;
    skippy_ring_slot *slots = ring_slots(ing, ing->terminal_offset);
    for (uint32_t i = 0; i < ing->terminal_capacity; i++)
        atomic_store_explicit(&slots[i].seq, i, RELAXED);
    slots = ring_slots(ing, ing->diagnostic_offset);
    for (uint32_t i = 0; i < ing->diagnostic_capacity; i++)
        atomic_store_explicit(&slots[i].seq, i, RELAXED);
    atomic_store_explicit(&region->magic, SKIPPY_INGRESS_MAGIC, RELEASE);
    return ing;
}

SKIPPY_API skippy_ingress_t *skippy_ingress_attach(void *mem, size_t size) {
    if (mem == NULL || ((uintptr_t)mem % SKIPPY_CACHE_LINE) != 0) return NULL;
    if (size < sizeof(skippy_region)) return NULL;
    skippy_region *region = mem;
    if (atomic_load_explicit(&region->magic, ACQUIRE) != SKIPPY_INGRESS_MAGIC) return NULL;
    if (region->abi_version != SKIPPY_INGRESS_ABI_VERSION) return NULL;
    if (region->header_size != sizeof(skippy_region)) return NULL;
    if (region->ring_slot_size != sizeof(skippy_ring_slot) ||
        region->progress_slot_size != sizeof(skippy_progress_slot))
        return NULL;
    /* Recompute the layout from the capacities and require the header to agree: the handle
     * keeps this validated copy and never trusts the shared header again. */
    skippy_layout layout;
    if (!compute_layout(region->terminal_capacity, region->diagnostic_capacity,
                        region->progress_slots, region->debug_bytes, &layout))
        return NULL;
    if (layout.region_size != region->region_size ||
        layout.terminal_offset != region->terminal_offset ||
        layout.diagnostic_offset != region->diagnostic_offset ||
        layout.progress_offset != region->progress_offset ||
        layout.debug_offset != region->debug_offset)
        return NULL;
    if (size < layout.region_size) return NULL;
    return make_handle(region, &layout);
}

SKIPPY_API void skippy_ingress_detach(skippy_ingress_t *ing) { free(ing); }

/* ---- wake / wait ---- */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *timeout) {
    /* Not FUTEX_PRIVATE_FLAG: the word lives in a MAP_SHARED mapping used by two processes. */
    return syscall(SYS_futex, (uint32_t *)addr, op, val, timeout, NULL, 0);
}

static void wake_host(skippy_ingress_t *ing) {
    /* Pairs with the fence in wait: either the host sees our record before sleeping, or we see
     * its sleeper flag here. */
    atomic_thread_fence(SEQ_CST);
    if (atomic_load_explicit(&ing->region->sleeper, RELAXED) == 0) return;
    if (atomic_exchange_explicit(&ing->region->sleeper, 0, ACQ_REL) == 0) return;
    atomic_fetch_add_explicit(&ing->region->wake_seq, 1, RELEASE);
    futex(&ing->region->wake_seq, FUTEX_WAKE, INT_MAX, NULL);
}

static bool ring_has_pending(skippy_ingress_t *ing, const skippy_ring_ctl *ctl, uint64_t offset,
                             uint32_t capacity) {
    uint64_t head = atomic_load_explicit(&ctl->head, RELAXED);
    skippy_ring_slot *slot = &ring_slots(ing, offset)[head & (capacity - 1)];
    return atomic_load_explicit(&slot->seq, ACQUIRE) == head + 1;
}

static bool has_pending(skippy_ingress_t *ing) {
    if (ring_has_pending(ing, &ing->region->terminal_ctl, ing->terminal_offset, ing->terminal_capacity))
        return true;
    if (ring_has_pending(ing, &ing->region->diagnostic_ctl, ing->diagnostic_offset,
                         ing->diagnostic_capacity))
        return true;
    skippy_progress_slot *slots = progress_slots(ing);
    for (uint32_t i = 0; i < ing->progress_slots; i++)
        if (atomic_load_explicit(&slots[i].state, ACQUIRE) & 1u) return true;
    return false;
}

SKIPPY_API int skippy_ingress_wait(skippy_ingress_t *ing, uint32_t timeout_ms) {
    if (ing == NULL) return -1;
    uint64_t deadline = skippy_monotonic_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        if (has_pending(ing)) return 1;
        if (atomic_load_explicit(&ing->region->closed, ACQUIRE)) return -1;
        uint32_t seq = atomic_load_explicit(&ing->region->wake_seq, ACQUIRE);
        atomic_store_explicit(&ing->region->sleeper, 1, SEQ_CST);
        atomic_thread_fence(SEQ_CST);
        if (has_pending(ing) || atomic_load_explicit(&ing->region->closed, SEQ_CST)) {
            atomic_store_explicit(&ing->region->sleeper, 0, RELAXED);
            continue;
        }
        uint64_t now = skippy_monotonic_ns();
        if (now >= deadline) {
            atomic_store_explicit(&ing->region->sleeper, 0, RELAXED);
            return 0;
        }
        uint64_t left = deadline - now;
        struct timespec ts = {.tv_sec = (time_t)(left / 1000000000ull),
                              .tv_nsec = (long)(left % 1000000000ull)};
        futex(&ing->region->wake_seq, FUTEX_WAIT, seq, &ts); /* EAGAIN/EINTR/ETIMEDOUT: re-check */
        atomic_store_explicit(&ing->region->sleeper, 0, RELAXED);
    }
}

SKIPPY_API void skippy_ingress_close(skippy_ingress_t *ing) {
    if (ing == NULL) return;
    atomic_store_explicit(&ing->region->closed, 1, SEQ_CST);
    atomic_fetch_add_explicit(&ing->region->wake_seq, 1, SEQ_CST);
    futex(&ing->region->wake_seq, FUTEX_WAKE, INT_MAX, NULL);
}

SKIPPY_API void skippy_ingress_request_cancel(skippy_ingress_t *ing, uint64_t operation_id) {
    if (ing == NULL) return;
    atomic_store_explicit(&ing->region->cancel_operation_id, operation_id, RELEASE);
}

bool skippy_ingress_is_closed(const skippy_ingress_t *ing) {
    return atomic_load_explicit(&ing->region->closed, ACQUIRE) != 0;
}

uint64_t skippy_ingress_cancel_word(const skippy_ingress_t *ing) {
    return atomic_load_explicit(&ing->region->cancel_operation_id, ACQUIRE);
}

uint64_t skippy_ingress_next_sequence(skippy_ingress_t *ing) {
    return atomic_fetch_add_explicit(&ing->region->ingress_sequence, 1, RELAXED) + 1;
}

void skippy_ingress_count_reject(skippy_ingress_t *ing, enum skippy_reject_reason reason) {
    _Atomic uint64_t *counter;
    switch (reason) {
    case SKIPPY_REJECT_ABI_VERSION: counter = &ing->region->rejected_abi_version; break;
    case SKIPPY_REJECT_STRUCT_SIZE: counter = &ing->region->rejected_struct_size; break;
    case SKIPPY_REJECT_DETAIL: counter = &ing->region->rejected_detail; break;
    case SKIPPY_REJECT_DISCRIMINANT: counter = &ing->region->rejected_discriminant; break;
    case SKIPPY_REJECT_CLOSED: counter = &ing->region->rejected_closed; break;
    default: counter = &ing->region->rejected_discriminant; break;
    }
    atomic_fetch_add_explicit(counter, 1, RELAXED);
}

/* ---- terminal / diagnostic rings ---- */

static bool ring_push(skippy_ingress_t *ing, skippy_ring_ctl *ctl, uint64_t offset,
                      uint32_t capacity, const skippy_native_fact_v1 *fact) {
    skippy_ring_slot *slots = ring_slots(ing, offset);
    uint64_t mask = capacity - 1;
    uint64_t pos = atomic_load_explicit(&ctl->tail, RELAXED);
    for (;;) {
        skippy_ring_slot *slot = &slots[pos & mask];
        uint64_t seq = atomic_load_explicit(&slot->seq, ACQUIRE);
        int64_t diff = (int64_t)(seq - pos);
        if (diff == 0) {
            /* A failed CAS reloads pos: another producer claimed it; retry (lock-free). */
            if (atomic_compare_exchange_weak_explicit(&ctl->tail, &pos, pos + 1, RELAXED,
                                                      RELAXED)) {
                memcpy(&slot->fact, fact, sizeof(*fact));
                atomic_store_explicit(&slot->seq, pos + 1, RELEASE);
                return true;
            }
        } else if (diff < 0) {
            return false; /* the slot still holds last lap's record: full */
        } else {
            pos = atomic_load_explicit(&ctl->tail, RELAXED);
        }
    }
}

static size_t ring_drain(skippy_ingress_t *ing, skippy_ring_ctl *ctl, uint64_t offset,
                         uint32_t capacity, skippy_native_fact_v1 *out, size_t max) {
    skippy_ring_slot *slots = ring_slots(ing, offset);
    uint64_t mask = capacity - 1;
    uint64_t pos = atomic_load_explicit(&ctl->head, RELAXED);
    size_t n = 0;
    while (n < max) {
        skippy_ring_slot *slot = &slots[pos & mask];
        if (atomic_load_explicit(&slot->seq, ACQUIRE) != pos + 1) break;
        memcpy(&out[n], &slot->fact, sizeof(out[n]));
        atomic_store_explicit(&slot->seq, pos + capacity, RELEASE);
        pos++;
        n++;
    }
    atomic_store_explicit(&ctl->head, pos, RELEASE);
    return n;
}

/* ---- progress table ---- */

static bool slot_try_lock(skippy_progress_slot *slot) {
    if (atomic_load_explicit(&slot->lock, RELAXED) != 0) return false;
    uint32_t expected = 0;
    return atomic_compare_exchange_strong_explicit(&slot->lock, &expected, 1, ACQUIRE, RELAXED);
}

static void slot_unlock(skippy_progress_slot *slot) {
    atomic_store_explicit(&slot->lock, 0, RELEASE);
}

/* Stores a new value into a slot the caller holds the lock of. */
static void slot_store(skippy_ingress_t *ing, skippy_progress_slot *slot,
                       const skippy_native_fact_v1 *fact) {
    skippy_lane_counters *lane = &ing->region->lanes[SKIPPY_LANE_PROGRESS];
    uint64_t state = atomic_load_explicit(&slot->state, ACQUIRE);
    uint64_t carried = 0;
    if (state & 1u) {
        /* Race the consumer for the undrained value: winning it means it is coalesced. */
        if (atomic_compare_exchange_strong_explicit(&slot->state, &state, state & ~1ull, ACQ_REL,
                                                    ACQUIRE)) {
            atomic_fetch_add_explicit(&lane->coalesced, 1, RELAXED);
            carried = slot->fact.coalesced_count + 1;
            state &= ~1ull;
        }
        /* else the consumer took it; `state` now holds the drained (not pending) word */
    }
    memcpy(&slot->fact, fact, sizeof(*fact));
    slot->fact.coalesced_count = carried;
    slot->last_value = fact->event.progress_current;
    uint64_t generation = (state >> 1) + 1;
    atomic_store_explicit(&slot->state, (generation << 1) | 1u, RELEASE);
}

static bool slot_has_key(skippy_progress_slot *slot, uint64_t op, uint32_t kind) {
    return atomic_load_explicit(&slot->key_kind, ACQUIRE) == kind &&
           atomic_load_explicit(&slot->key_operation, ACQUIRE) == op;
}

/* Updates the slot that holds this key; `slot` is locked by the caller. */
static bool update_keyed_slot(skippy_ingress_t *ing, skippy_progress_slot *slot,
                              const skippy_native_fact_v1 *fact) {
    if (fact->event.progress_current <= slot->last_value) {
        atomic_fetch_add_explicit(&ing->region->suppressed_regression, 1, RELAXED);
        return false;
    }
    atomic_fetch_add_explicit(&ing->region->lanes[SKIPPY_LANE_PROGRESS].accepted, 1, RELAXED);
    slot_store(ing, slot, fact);
    return true;
}

typedef enum { KEY_ABSENT, KEY_STORED, KEY_DROPPED } key_result;

/* Finds the slot keyed (op, kind) and updates it. */
static key_result update_existing_key(skippy_ingress_t *ing, const skippy_native_fact_v1 *fact) {
    skippy_progress_slot *slots = progress_slots(ing);
    uint64_t op = fact->operation_id;
    uint32_t kind = fact->event.kind;
    for (uint32_t i = 0; i < ing->progress_slots; i++) {
        skippy_progress_slot *slot = &slots[i];
        if (!slot_has_key(slot, op, kind)) continue;
        if (!slot_try_lock(slot)) {
            atomic_fetch_add_explicit(&ing->region->progress_contended, 1, RELAXED);
            return KEY_DROPPED;
        }
        if (!slot_has_key(slot, op, kind)) { /* evicted under us: the key is absent now */
            slot_unlock(slot);
            return KEY_ABSENT;
        }
        bool stored = update_keyed_slot(ing, slot, fact);
        slot_unlock(slot);
        return stored ? KEY_STORED : KEY_DROPPED;
    }
    return KEY_ABSENT;
}

/* Returns true when the value was stored (pending, to be announced to a sleeping host). */
static bool progress_push(skippy_ingress_t *ing, const skippy_native_fact_v1 *fact) {
    key_result found = update_existing_key(ing, fact);
    if (found != KEY_ABSENT) return found == KEY_STORED;

    /* A new key. Inserters are serialised by a try-lock so that two producers pushing the same
     * new key at once cannot key two slots; a contended insert drops this value (counted). */
    skippy_region *region = ing->region;
    uint32_t unlocked = 0;
    if (atomic_load_explicit(&region->progress_insert_lock, RELAXED) != 0 ||
        !atomic_compare_exchange_strong_explicit(&region->progress_insert_lock, &unlocked, 1,
                                                 ACQUIRE, RELAXED)) {
        atomic_fetch_add_explicit(&region->progress_contended, 1, RELAXED);
        return false;
    }
    found = update_existing_key(ing, fact); /* inserted by the previous lock holder? */
    if (found != KEY_ABSENT) {
        atomic_store_explicit(&region->progress_insert_lock, 0, RELEASE);
        return found == KEY_STORED;
    }
    atomic_fetch_add_explicit(&region->lanes[SKIPPY_LANE_PROGRESS].accepted, 1, RELAXED);
    skippy_progress_slot *slots = progress_slots(ing);
    bool stored = false;
    /* pass 0: a never-keyed slot; pass 1: a keyed slot whose value was drained (evicted) */
    for (int pass = 0; pass < 2 && !stored; pass++) {
        for (uint32_t i = 0; i < ing->progress_slots && !stored; i++) {
            skippy_progress_slot *slot = &slots[i];
            if (pass == 0 && atomic_load_explicit(&slot->key_kind, RELAXED) != 0) continue;
            if (pass == 1 && (atomic_load_explicit(&slot->state, RELAXED) & 1u)) continue;
            if (!slot_try_lock(slot)) continue;
            bool usable = pass == 0 ? atomic_load_explicit(&slot->key_kind, RELAXED) == 0
                                    : (atomic_load_explicit(&slot->state, ACQUIRE) & 1u) == 0;
            if (usable) {
                atomic_store_explicit(&slot->key_operation, fact->operation_id, RELAXED);
                atomic_store_explicit(&slot->key_kind, fact->event.kind, RELEASE);
                slot_store(ing, slot, fact);
                stored = true;
            }
            slot_unlock(slot);
        }
    }
    atomic_store_explicit(&region->progress_insert_lock, 0, RELEASE);
    if (!stored)
        atomic_fetch_add_explicit(&region->lanes[SKIPPY_LANE_PROGRESS].dropped_full, 1, RELAXED);
    return stored;
}

static size_t progress_drain(skippy_ingress_t *ing, skippy_native_fact_v1 *out, size_t max) {
    skippy_progress_slot *slots = progress_slots(ing);
    size_t n = 0;
    for (uint32_t i = 0; i < ing->progress_slots && n < max; i++) {
        skippy_progress_slot *slot = &slots[i];
        /* Bounded retries: a producer rewriting the slot wins; the value stays for next time. */
        for (int attempt = 0; attempt < 8; attempt++) {
            uint64_t state = atomic_load_explicit(&slot->state, ACQUIRE);
            if ((state & 1u) == 0) break;
            memcpy(&out[n], &slot->fact, sizeof(out[n]));
            if (atomic_compare_exchange_strong_explicit(&slot->state, &state, state & ~1ull,
                                                        ACQ_REL, ACQUIRE)) {
                n++;
                break;
            }
        }
    }
    return n;
}

void skippy_ingress_push(skippy_ingress_t *ing, const skippy_native_fact_v1 *fact) {
    bool stored;
    switch (fact->lane) {
    case SKIPPY_LANE_PROGRESS:
        stored = progress_push(ing, fact);
        break;
    case SKIPPY_LANE_TERMINAL:
        atomic_fetch_add_explicit(&ing->region->lanes[SKIPPY_LANE_TERMINAL].accepted, 1, RELAXED);
        stored = ring_push(ing, &ing->region->terminal_ctl, ing->terminal_offset, ing->terminal_capacity,
                           fact);
        if (!stored)
            atomic_fetch_add_explicit(&ing->region->lanes[SKIPPY_LANE_TERMINAL].dropped_full, 1, RELAXED);
        break;
    default:
        atomic_fetch_add_explicit(&ing->region->lanes[SKIPPY_LANE_DIAGNOSTIC].accepted, 1, RELAXED);
        stored = ring_push(ing, &ing->region->diagnostic_ctl, ing->diagnostic_offset,
                           ing->diagnostic_capacity, fact);
        if (!stored)
            atomic_fetch_add_explicit(&ing->region->lanes[SKIPPY_LANE_DIAGNOSTIC].dropped_full, 1,
                                      RELAXED);
        break;
    }
    if (stored) wake_host(ing);
}

SKIPPY_API size_t skippy_ingress_drain(skippy_ingress_t *ing, skippy_native_fact_v1 *out,
                                       size_t max) {
    if (ing == NULL || out == NULL || max == 0) return 0;
    size_t n = ring_drain(ing, &ing->region->terminal_ctl, ing->terminal_offset, ing->terminal_capacity,
                          out, max);
    atomic_fetch_add_explicit(&ing->region->lanes[SKIPPY_LANE_TERMINAL].drained, n, RELAXED);
    size_t p = progress_drain(ing, out + n, max - n);
    atomic_fetch_add_explicit(&ing->region->lanes[SKIPPY_LANE_PROGRESS].drained, p, RELAXED);
    n += p;
    size_t d = ring_drain(ing, &ing->region->diagnostic_ctl, ing->diagnostic_offset,
                          ing->diagnostic_capacity, out + n, max - n);
    atomic_fetch_add_explicit(&ing->region->lanes[SKIPPY_LANE_DIAGNOSTIC].drained, d, RELAXED);
    return n + d;
}

SKIPPY_API void skippy_ingress_stats(const skippy_ingress_t *cing, skippy_ingress_stats_v1 *out) {
    if (out == NULL) return;
    memset(out, 0, sizeof(*out));
    out->struct_size = (uint32_t)sizeof(*out);
    if (cing == NULL) return;
    skippy_ingress_t *ing = (skippy_ingress_t *)cing; /* atomic loads need a non-const object */
    for (int l = 0; l < SKIPPY_LANE_COUNT; l++) {
        out->lanes[l].accepted = atomic_load_explicit(&ing->region->lanes[l].accepted, RELAXED);
        out->lanes[l].drained = atomic_load_explicit(&ing->region->lanes[l].drained, RELAXED);
        out->lanes[l].dropped_full = atomic_load_explicit(&ing->region->lanes[l].dropped_full, RELAXED);
        out->lanes[l].coalesced = atomic_load_explicit(&ing->region->lanes[l].coalesced, RELAXED);
    }
    out->suppressed_regression = atomic_load_explicit(&ing->region->suppressed_regression, RELAXED);
    out->progress_contended = atomic_load_explicit(&ing->region->progress_contended, RELAXED);
    out->rejected_abi_version = atomic_load_explicit(&ing->region->rejected_abi_version, RELAXED);
    out->rejected_struct_size = atomic_load_explicit(&ing->region->rejected_struct_size, RELAXED);
    out->rejected_detail = atomic_load_explicit(&ing->region->rejected_detail, RELAXED);
    out->rejected_discriminant = atomic_load_explicit(&ing->region->rejected_discriminant, RELAXED);
    out->rejected_closed = atomic_load_explicit(&ing->region->rejected_closed, RELAXED);
    out->unknown_kind = atomic_load_explicit(&ing->region->unknown_kind, RELAXED);
    out->detail_truncated = atomic_load_explicit(&ing->region->detail_truncated, RELAXED);
    for (int i = 0; i < 6; i++)
        out->log_messages_by_level[i] =
            atomic_load_explicit(&ing->region->log_messages_by_level[i], RELAXED);
    out->debug_lines_captured = atomic_load_explicit(&ing->region->debug_lines_captured, RELAXED);
    out->debug_bytes_dropped = atomic_load_explicit(&ing->region->debug_bytes_dropped, RELAXED);
}

/* ---- log counting and the debug byte ring ---- */

void skippy_ingress_count_log(skippy_ingress_t *ing, int level) {
    int index = (level >= 0 && level < 6) ? level : 0;
    atomic_fetch_add_explicit(&ing->region->log_messages_by_level[index], 1, RELAXED);
}

static _Atomic uint32_t *debug_word(skippy_ingress_t *ing, uint64_t pos) {
    return (_Atomic uint32_t *)(void *)(debug_bytes(ing) + (pos & (ing->debug_bytes - 1)));
}

static void debug_copy_in(skippy_ingress_t *ing, uint64_t pos, const char *src, size_t len) {
    size_t cap = ing->debug_bytes;
    size_t at = (size_t)(pos & (cap - 1));
    size_t first = len < cap - at ? len : cap - at;
    memcpy(debug_bytes(ing) + at, src, first);
    if (len > first) memcpy(debug_bytes(ing), src + first, len - first);
}

static void debug_copy_out(skippy_ingress_t *ing, uint64_t pos, char *dst, size_t len) {
    size_t cap = ing->debug_bytes;
    size_t at = (size_t)(pos & (cap - 1));
    size_t first = len < cap - at ? len : cap - at;
    memcpy(dst, debug_bytes(ing) + at, first);
    if (len > first) memcpy(dst + first, debug_bytes(ing), len - first);
}

static void debug_zero(skippy_ingress_t *ing, uint64_t pos, size_t len) {
    size_t cap = ing->debug_bytes;
    size_t at = (size_t)(pos & (cap - 1));
    size_t first = len < cap - at ? len : cap - at;
    memset(debug_bytes(ing) + at, 0, first);
    if (len > first) memset(debug_bytes(ing), 0, len - first);
}

void skippy_ingress_debug_write(skippy_ingress_t *ing, const char *text) {
    if (text == NULL) return;
    size_t bound = ing->debug_bytes / 2 - 4;
    if (bound > SKIPPY_DEBUG_MAX_MESSAGE_BYTES) bound = SKIPPY_DEBUG_MAX_MESSAGE_BYTES;
    size_t len = strnlen(text, bound);
    bool truncated = false;
    if (len == bound) {
        size_t full = strnlen(text, DEBUG_DROP_SCAN_BYTES);
        if (full > len) {
            /* Keep the line structure: a truncated message still ends the line. */
            truncated = true;
            atomic_fetch_add_explicit(&ing->region->debug_bytes_dropped, full - (len - 1), RELAXED);
        }
    }
    uint64_t record = 4 + align_up(len, 4);
    uint64_t head = atomic_load_explicit(&ing->region->debug_head, RELAXED);
    for (;;) {
        uint64_t tail = atomic_load_explicit(&ing->region->debug_tail, ACQUIRE);
        if (head + record - tail > ing->debug_bytes) {
            atomic_fetch_add_explicit(&ing->region->debug_bytes_dropped, len, RELAXED);
            return;
        }
        if (atomic_compare_exchange_weak_explicit(&ing->region->debug_head, &head, head + record, RELAXED,
                                                  RELAXED))
            break;
    }
    if (truncated) {
        debug_copy_in(ing, head + 4, text, len - 1);
        debug_copy_in(ing, head + 4 + len - 1, "\n", 1);
    } else {
        debug_copy_in(ing, head + 4, text, len);
    }
    atomic_store_explicit(debug_word(ing, head), (uint32_t)((len << 1) | 1u), RELEASE);
    atomic_fetch_add_explicit(&ing->region->debug_lines_captured, 1, RELAXED);
    wake_host(ing);
}

SKIPPY_API size_t skippy_ingress_debug_read(skippy_ingress_t *ing, char *out, size_t cap) {
    if (ing == NULL || out == NULL) return 0;
    uint64_t tail = atomic_load_explicit(&ing->region->debug_tail, RELAXED);
    uint64_t head = atomic_load_explicit(&ing->region->debug_head, ACQUIRE);
    size_t written = 0;
    while (tail < head) {
        uint32_t word = atomic_load_explicit(debug_word(ing, tail), ACQUIRE);
        if ((word & 1u) == 0) break; /* reserved but not committed yet */
        size_t len = word >> 1;
        if (len > ing->debug_bytes - 4 || tail + 4 + len > head) {
            /* Corrupt commit word (a peer scribbled the ring): drop everything up to head. */
            debug_zero(ing, tail, (size_t)(head - tail < ing->debug_bytes ? head - tail
                                                                            : ing->debug_bytes));
            tail = head;
            break;
        }
        if (written + len > cap) break;
        debug_copy_out(ing, tail + 4, out + written, len);
        written += len;
        uint64_t record = 4 + align_up(len, 4);
        /* Zero the record so a later lap never mistakes stale bytes for a commit word. */
        debug_zero(ing, tail, (size_t)record);
        tail += record;
    }
    atomic_store_explicit(&ing->region->debug_tail, tail, RELEASE);
    return written;
}
