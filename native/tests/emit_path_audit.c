/*
 * emit_path_audit.c — measures, instead of claiming, that the native emit path allocates nothing
 * and takes no lock (issue 6, benchmark 1).
 *
 * The ingress, trampoline and adapter sources are linked into this program statically, built
 * WITHOUT sanitizers (ASan replaces malloc) and with the optimisation of the real build. While a
 * producer thread is inside its measured region (a thread-local flag, set around the emits only)
 * every call to these is counted, per thread:
 *   - allocator: malloc, calloc, realloc, free, aligned_alloc, posix_memalign, memalign, valloc,
 *     pvalloc. They are DEFINED here (forwarding to glibc's __libc_* entry points), so calls from
 *     inside libc are counted too, not only calls from our objects.
 *   - locks and waits: pthread_mutex_{lock,trylock,timedlock}, pthread_rwlock_*lock,
 *     pthread_spin_{lock,trylock}, sem_{wait,trywait,timedwait}, pthread_cond_{wait,timedwait},
 *     and futex waits made through syscall(); sleeps and yields: nanosleep, clock_nanosleep,
 *     usleep, sched_yield. These are wrapped with the linker's --wrap (see the Makefile), which
 *     catches every call made from our objects; libc-internal locks (lll_lock) are not visible
 *     to --wrap, so the voluntary context switches of each producer thread are reported too.
 *   - syscall(): futex wakes are counted apart (the documented one syscall of the path: a wake,
 *     only when the host sleeps in skippy_ingress_wait); any other syscall() is a failure.
 *
 * Each run starts 1, 2 or 4 producer threads that each make --records calls through the real
 * entry points (skippy_trampoline_v1 and the skippy_llama_* callbacks), cycling over every path:
 * accept (terminal, diagnostic, progress, drained concurrently by a host thread that waits on
 * the futex like the pipeline does), full-lane drop, progress coalescing, progress table full,
 * regression suppression, contended progress key insert and slot, every reject reason, a closed
 * region, unknown kind, truncated detail, base-size and larger structs, cancel via the progress
 * and abort callbacks, log counting and the debug byte ring (accepted, truncated, ring full).
 * After the run each path's own counter must be non-zero, so a path that silently stopped being
 * exercised fails the audit instead of passing vacuously.
 *
 * Before the runs a self-check calls malloc, free, strdup (which allocates inside libc),
 * pthread_mutex_lock, a futex wait and sched_yield inside a measured region and requires exactly
 * those counts, so the counters are known to fire; those counts are then excluded.
 *
 * Output: one JSON line on stdout. Exit status: 0 all counts zero; 1 a forbidden call was
 * counted on the path; 2 the audit itself is broken (self-check, path coverage, atomics, setup).
 *
 * Built with -DAUDIT_INJECT_REGRESSION (and --wrap=skippy_ingress_push) it injects a malloc/free
 * and a mutex lock into every push: `make test` requires that build to exit 1.
 */
#include <errno.h>
#include <linux/futex.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "skippy/skippy_event.h"
#include "skippy/skippy_ingress.h"
#include "skippy_internal.h"

/* ---- lock-free atomics ----
 * A C11 atomic that is not lock-free is implemented by libatomic with a process-local lock: a
 * hidden lock on the path, and a broken one in shared memory. uint64_t is `unsigned long` here,
 * so LONG is checked as well as LLONG; the run-time check below covers the exact objects. This
 * program is also linked without -latomic, so any libatomic call would not even link. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free");
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2, "long atomics must be lock-free");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "long long atomics must be lock-free");
_Static_assert(ATOMIC_POINTER_LOCK_FREE == 2, "pointer atomics must be lock-free");
_Static_assert(__atomic_always_lock_free(sizeof(uint64_t), 0), "uint64_t atomics lock-free");
_Static_assert(__atomic_always_lock_free(sizeof(uint32_t), 0), "uint32_t atomics lock-free");

/* ---- counters ---- */

enum counter {
    C_MALLOC,
    C_CALLOC,
    C_REALLOC,
    C_FREE,
    C_ALIGNED_ALLOC,
    C_POSIX_MEMALIGN,
    C_MEMALIGN,
    C_VALLOC,
    C_PVALLOC,
    C_MUTEX_LOCK,
    C_MUTEX_TRYLOCK,
    C_MUTEX_TIMEDLOCK,
    C_RWLOCK_RDLOCK,
    C_RWLOCK_WRLOCK,
    C_RWLOCK_TRYRDLOCK,
    C_RWLOCK_TRYWRLOCK,
    C_RWLOCK_TIMEDRDLOCK,
    C_RWLOCK_TIMEDWRLOCK,
    C_SPIN_LOCK,
    C_SPIN_TRYLOCK,
    C_SEM_WAIT,
    C_SEM_TRYWAIT,
    C_SEM_TIMEDWAIT,
    C_COND_WAIT,
    C_COND_TIMEDWAIT,
    C_FUTEX_WAIT,
    C_NANOSLEEP,
    C_CLOCK_NANOSLEEP,
    C_USLEEP,
    C_SCHED_YIELD,
    C_FUTEX_WAKE,
    C_OTHER_SYSCALL,
    C_COUNT
};

enum counter_class { K_ALLOC, K_LOCK, K_SLEEP, K_WAKE, K_SYSCALL };

static const char *const counter_names[C_COUNT] = {
    "malloc",
    "calloc",
    "realloc",
    "free",
    "aligned_alloc",
    "posix_memalign",
    "memalign",
    "valloc",
    "pvalloc",
    "pthread_mutex_lock",
    "pthread_mutex_trylock",
    "pthread_mutex_timedlock",
    "pthread_rwlock_rdlock",
    "pthread_rwlock_wrlock",
    "pthread_rwlock_tryrdlock",
    "pthread_rwlock_trywrlock",
    "pthread_rwlock_timedrdlock",
    "pthread_rwlock_timedwrlock",
    "pthread_spin_lock",
    "pthread_spin_trylock",
    "sem_wait",
    "sem_trywait",
    "sem_timedwait",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "futex_wait",
    "nanosleep",
    "clock_nanosleep",
    "usleep",
    "sched_yield",
    "futex_wake",
    "other_syscall",
};

static enum counter_class class_of(int c) {
    if (c <= C_PVALLOC) return K_ALLOC;
    if (c <= C_FUTEX_WAIT) return K_LOCK;
    if (c <= C_SCHED_YIELD) return K_SLEEP;
    if (c == C_FUTEX_WAKE) return K_WAKE;
    return K_SYSCALL;
}

/* Local-exec TLS of the executable: reading it never allocates, even from inside malloc. */
static _Thread_local int tl_measuring;
static _Thread_local uint64_t tl_counts[C_COUNT];

static inline void hit(enum counter c) {
    if (tl_measuring) tl_counts[c]++;
}

static void measure_begin(void) {
    memset(tl_counts, 0, sizeof(tl_counts));
    atomic_signal_fence(memory_order_seq_cst);
    tl_measuring = 1;
    atomic_signal_fence(memory_order_seq_cst);
}

static void measure_end(uint64_t out[C_COUNT]) {
    atomic_signal_fence(memory_order_seq_cst);
    tl_measuring = 0;
    atomic_signal_fence(memory_order_seq_cst);
    memcpy(out, tl_counts, sizeof(tl_counts));
}

static uint64_t class_total(const uint64_t counts[C_COUNT], enum counter_class k) {
    uint64_t total = 0;
    for (int c = 0; c < C_COUNT; c++)
        if (class_of(c) == k) total += counts[c];
    return total;
}

/* ---- allocator: defined in the executable, so libc's own calls land here too ---- */

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t alignment, size_t size);

void *malloc(size_t size) {
    hit(C_MALLOC);
    return __libc_malloc(size);
}

void *calloc(size_t n, size_t size) {
    hit(C_CALLOC);
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t size) {
    hit(C_REALLOC);
    return __libc_realloc(p, size);
}

void free(void *p) {
    hit(C_FREE);
    __libc_free(p);
}

void *aligned_alloc(size_t alignment, size_t size) {
    hit(C_ALIGNED_ALLOC);
    return __libc_memalign(alignment, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    hit(C_POSIX_MEMALIGN);
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment % sizeof(void *) != 0)
        return EINVAL;
    int saved = errno;
    void *p = __libc_memalign(alignment, size);
    errno = saved;
    if (p == NULL) return ENOMEM;
    *out = p;
    return 0;
}

void *memalign(size_t alignment, size_t size) {
    hit(C_MEMALIGN);
    return __libc_memalign(alignment, size);
}

void *valloc(size_t size) {
    hit(C_VALLOC);
    return __libc_memalign((size_t)sysconf(_SC_PAGESIZE), size);
}

void *pvalloc(size_t size) {
    hit(C_PVALLOC);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return __libc_memalign(page, (size + page - 1) & ~(page - 1));
}

/* ---- locks, waits and syscall(): -Wl,--wrap=<name> (calls from our objects) ---- */

#define WRAP0(ret, name, counter)                                                           \
    ret __real_##name(void);                                                                \
    ret __wrap_##name(void);                                                                \
    ret __wrap_##name(void) {                                                               \
        hit(counter);                                                                       \
        return __real_##name();                                                             \
    }
#define WRAP1(ret, name, counter, t1)                                                       \
    ret __real_##name(t1 a1);                                                               \
    ret __wrap_##name(t1 a1);                                                               \
    ret __wrap_##name(t1 a1) {                                                              \
        hit(counter);                                                                       \
        return __real_##name(a1);                                                           \
    }
#define WRAP2(ret, name, counter, t1, t2)                                                   \
    ret __real_##name(t1 a1, t2 a2);                                                        \
    ret __wrap_##name(t1 a1, t2 a2);                                                        \
    ret __wrap_##name(t1 a1, t2 a2) {                                                       \
        hit(counter);                                                                       \
        return __real_##name(a1, a2);                                                       \
    }
#define WRAP3(ret, name, counter, t1, t2, t3)                                               \
    ret __real_##name(t1 a1, t2 a2, t3 a3);                                                 \
    ret __wrap_##name(t1 a1, t2 a2, t3 a3);                                                 \
    ret __wrap_##name(t1 a1, t2 a2, t3 a3) {                                                \
        hit(counter);                                                                       \
        return __real_##name(a1, a2, a3);                                                   \
    }

typedef const struct timespec *timespec_in;

WRAP1(int, pthread_mutex_lock, C_MUTEX_LOCK, pthread_mutex_t *)
WRAP1(int, pthread_mutex_trylock, C_MUTEX_TRYLOCK, pthread_mutex_t *)
WRAP2(int, pthread_mutex_timedlock, C_MUTEX_TIMEDLOCK, pthread_mutex_t *, timespec_in)
WRAP1(int, pthread_rwlock_rdlock, C_RWLOCK_RDLOCK, pthread_rwlock_t *)
WRAP1(int, pthread_rwlock_wrlock, C_RWLOCK_WRLOCK, pthread_rwlock_t *)
WRAP1(int, pthread_rwlock_tryrdlock, C_RWLOCK_TRYRDLOCK, pthread_rwlock_t *)
WRAP1(int, pthread_rwlock_trywrlock, C_RWLOCK_TRYWRLOCK, pthread_rwlock_t *)
WRAP2(int, pthread_rwlock_timedrdlock, C_RWLOCK_TIMEDRDLOCK, pthread_rwlock_t *, timespec_in)
WRAP2(int, pthread_rwlock_timedwrlock, C_RWLOCK_TIMEDWRLOCK, pthread_rwlock_t *, timespec_in)
WRAP1(int, pthread_spin_lock, C_SPIN_LOCK, pthread_spinlock_t *)
WRAP1(int, pthread_spin_trylock, C_SPIN_TRYLOCK, pthread_spinlock_t *)
WRAP1(int, sem_wait, C_SEM_WAIT, sem_t *)
WRAP1(int, sem_trywait, C_SEM_TRYWAIT, sem_t *)
WRAP2(int, sem_timedwait, C_SEM_TIMEDWAIT, sem_t *, timespec_in)
WRAP2(int, pthread_cond_wait, C_COND_WAIT, pthread_cond_t *, pthread_mutex_t *)
WRAP3(int, pthread_cond_timedwait, C_COND_TIMEDWAIT, pthread_cond_t *, pthread_mutex_t *,
      timespec_in)
WRAP2(int, nanosleep, C_NANOSLEEP, timespec_in, struct timespec *)
WRAP1(int, usleep, C_USLEEP, useconds_t)
WRAP0(int, sched_yield, C_SCHED_YIELD)

int __real_clock_nanosleep(clockid_t clock, int flags, timespec_in req, struct timespec *rem);
int __wrap_clock_nanosleep(clockid_t clock, int flags, timespec_in req, struct timespec *rem);
int __wrap_clock_nanosleep(clockid_t clock, int flags, timespec_in req, struct timespec *rem) {
    hit(C_CLOCK_NANOSLEEP);
    return __real_clock_nanosleep(clock, flags, req, rem);
}

/* syscall() is variadic; every caller in native/ passes six arguments, and on the x86-64 and
 * AArch64 ABIs reading six longs back is how libc's own syscall() forwards them. */
long __real_syscall(long number, ...);
long __wrap_syscall(long number, ...);
long __wrap_syscall(long number, ...) {
    va_list ap;
    va_start(ap, number);
    long a[6];
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    if (number == SYS_futex) {
        int op = (int)a[1] & FUTEX_CMD_MASK;
        bool wake = op == FUTEX_WAKE || op == FUTEX_WAKE_OP || op == FUTEX_WAKE_BITSET ||
                    op == FUTEX_REQUEUE || op == FUTEX_CMP_REQUEUE;
        hit(wake ? C_FUTEX_WAKE : C_FUTEX_WAIT);
    } else {
        hit(C_OTHER_SYSCALL);
    }
    return __real_syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* Keeps the self-check's allocation from being optimised away. */
static void *volatile g_sink;

#ifdef AUDIT_INJECT_REGRESSION
/* A deliberately broken push (--wrap=skippy_ingress_push): what a regression would look like. */
void __real_skippy_ingress_push(skippy_ingress_t *ingress, const skippy_native_fact_v1 *fact);
void __wrap_skippy_ingress_push(skippy_ingress_t *ingress, const skippy_native_fact_v1 *fact);
void __wrap_skippy_ingress_push(skippy_ingress_t *ingress, const skippy_native_fact_v1 *fact) {
    static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
    void *scratch = malloc(sizeof(*fact));
    g_sink = scratch;
    pthread_mutex_lock(&mutex);
    __real_skippy_ingress_push(ingress, fact);
    pthread_mutex_unlock(&mutex);
    free(scratch);
}
#endif

/* ---- regions and adapters ---- */

typedef struct region {
    void *mem;
    size_t size;
    skippy_ingress_t *ingress;
} region;

static void die(const char *what) {
    fprintf(stderr, "emit_path_audit: setup failed: %s\n", what);
    exit(2);
}

static region region_new(uint32_t terminal, uint32_t diagnostic, uint32_t progress,
                         uint32_t debug) {
    skippy_ingress_config_v1 cfg = {sizeof(cfg), terminal, diagnostic, progress, debug, 0};
    region r;
    r.size = skippy_ingress_required_size(&cfg);
    if (r.size == 0) die("skippy_ingress_required_size");
    /* MAP_SHARED like the real host/engine mapping (shared futex word); init pre-faults it. */
    r.mem = mmap(NULL, r.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (r.mem == MAP_FAILED) die("mmap");
    r.ingress = skippy_ingress_init(r.mem, r.size, &cfg);
    if (r.ingress == NULL) die("skippy_ingress_init");
    return r;
}

static void region_free(region *r) {
    skippy_ingress_detach(r->ingress);
    munmap(r->mem, r->size);
}

static skippy_adapter_t *adapter_new(region *r, uint32_t flags, uint64_t operation_id) {
    skippy_adapter_t *a = skippy_adapter_create(r->ingress, flags);
    if (a == NULL) die("skippy_adapter_create");
    if (operation_id != 0 && skippy_operation_begin(a, operation_id, 7) != SKIPPY_STATUS_OK)
        die("skippy_operation_begin");
    return a;
}

static void adapter_free(skippy_adapter_t *a) {
    skippy_operation_end(a);
    skippy_adapter_destroy(a);
}

static skippy_progress_slot *progress_slot_at(skippy_ingress_t *ing, uint32_t i) {
    return (skippy_progress_slot *)(void *)((char *)ing->region + ing->progress_offset) + i;
}

/* ---- the paths ---- */

#define MAX_THREADS 4u
#define DRAINED_KEYS 4u /* per thread, over DRAINED_PROGRESS_SLOTS: eviction of drained keys */
#define FULL_KEYS 3u    /* per thread, over the 1 free slot of the full region: table full */
#define DRAINED_PROGRESS_SLOTS 4u
#define FULL_PROGRESS_SLOTS 2u
#define LONG_LOG_BYTES 1500u /* > SKIPPY_DEBUG_MAX_MESSAGE_BYTES: truncated, counted dropped */
#define DETAIL_BYTES 600u    /* > SKIPPY_RUNTIME_EVENT_DETAIL_COPY_BYTES: truncated */
/* Fewest calls per thread with which every path below is reached whatever the scheduling: each
 * path's counter is then required to be non-zero. */
#define MIN_RECORDS 1000u

#define OP_SHARED 0x1000u
#define OP_CANCELLED 0x2000u
#define OP_REGRESSION 0x3000u
#define OP_SLOT_LOCKED 0x4000u
#define OP_INSERT_LOCKED 0x5000u
#define OP_PER_THREAD(kind, thread, key) (0x10000u + (kind) * 0x1000u + (thread) * 0x10u + (key))

enum emit_case {
    CASE_TERMINAL,             /* drained: terminal lane accept */
    CASE_TERMINAL_BASE_SIZE,   /* drained: a 112-byte producer struct */
    CASE_TERMINAL_LARGER,      /* drained: a 200-byte producer struct */
    CASE_TERMINAL_UNSCOPED,    /* drained: an adapter without an operation scope */
    CASE_DIAGNOSTIC_DETAIL,    /* drained: diagnostic accept, detail truncated */
    CASE_UNKNOWN_KIND,         /* drained: unknown category/kind -> diagnostic lane */
    CASE_PROGRESS_DRAINED,     /* drained: new keys, updates, eviction of drained keys */
    CASE_LLAMA_PROGRESS,       /* drained: skippy_llama_progress_callback */
    CASE_LLAMA_CANCELLED,      /* drained: progress callback with the cancel word set */
    CASE_ABORT_CANCELLED,      /* drained: skippy_llama_abort_callback -> true */
    CASE_ABORT_LIVE,           /* drained: skippy_llama_abort_callback -> false */
    CASE_LOG_CAPTURED,         /* drained: log callback, debug ring capture */
    CASE_LOG_LONG,             /* drained: log callback, message truncated */
    CASE_REJECT_NULL,          /* drained: NULL event */
    CASE_REJECT_ABI,           /* drained: unknown abi_version */
    CASE_REJECT_SIZE,          /* drained: struct_size below the base size */
    CASE_REJECT_DETAIL_LEN,    /* drained: detail_len above the maximum */
    CASE_REJECT_DETAIL_PTR,    /* drained: detail_len without detail_ptr */
    CASE_REJECT_CATEGORY,      /* drained: category 0 */
    CASE_TERMINAL_FULL,        /* full: terminal ring full -> dropped */
    CASE_DIAGNOSTIC_FULL,      /* full: diagnostic ring full -> dropped */
    CASE_PROGRESS_COALESCED,   /* full: undrained value replaced (coalesced) / table full */
    CASE_PROGRESS_REGRESSION,  /* full: value not above the key's last -> suppressed */
    CASE_LOG_RING_FULL,        /* full: debug byte ring never read -> bytes dropped */
    CASE_REJECT_CLOSED,        /* closed region */
    CASE_CONTENDED_INSERT,     /* insert try-lock held -> progress_contended */
    CASE_CONTENDED_SLOT,       /* slot try-lock held -> progress_contended */
    CASE_COUNT
};

typedef struct world {
    region drained;        /* a host thread waits on the futex and drains it, like the pipeline */
    region full;           /* never drained: full rings, coalescing, full table, full debug ring */
    region closed;         /* closed before the run */
    region insert_locked;  /* progress_insert_lock held for the whole run */
    region slot_locked;    /* the slot of (OP_SLOT_LOCKED, PROGRESS) held for the whole run */
    skippy_adapter_t *drained_shared;   /* scope OP_SHARED, debug log capture */
    skippy_adapter_t *drained_unscoped; /* no scope */
    skippy_adapter_t *full_shared;      /* scope OP_SHARED, debug log capture */
    skippy_adapter_t *closed_shared;
    skippy_adapter_t *regression_owner; /* keyed OP_REGRESSION in `full` before the run */
    skippy_adapter_t *slot_owner;       /* keyed OP_SLOT_LOCKED in `slot_locked` */
    _Atomic uint32_t stop_host;
    pthread_barrier_t start;
} world;

typedef struct producer {
    world *w;
    uint32_t index;
    uint64_t records;
    skippy_adapter_t *drained_keys[DRAINED_KEYS];
    skippy_adapter_t *full_keys[FULL_KEYS];
    skippy_adapter_t *llama;
    skippy_adapter_t *cancelled;
    skippy_adapter_t *regression;
    skippy_adapter_t *insert_locked;
    skippy_adapter_t *slot_locked;
    uint64_t counts[C_COUNT];
    uint64_t cancel_returned;     /* progress callback returned false */
    uint64_t abort_returned_true; /* abort callback returned true */
    long voluntary_switches;
} producer;

static char g_detail[DETAIL_BYTES];
static char g_long_log[LONG_LOG_BYTES + 1];

static skippy_runtime_event_v1 event_of(uint32_t category, uint32_t kind, uint64_t value) {
    skippy_runtime_event_v1 ev;
    memset(&ev, 0, sizeof(ev));
    ev.abi_version = SKIPPY_RUNTIME_EVENT_ABI_VERSION;
    ev.struct_size = SKIPPY_RUNTIME_EVENT_V1_FULL_SIZE;
    ev.category = category;
    ev.kind = kind;
    ev.emitter = SKIPPY_EMITTER_WORKER_THREAD;
    ev.sequence = value;
    ev.progress_current = value;
    ev.progress_total = UINT64_MAX;
    ev.progress_unit = SKIPPY_PROGRESS_UNIT_ITEMS;
    return ev;
}

static void trampoline(skippy_adapter_t *a, uint32_t category, uint32_t kind, uint64_t value) {
    skippy_runtime_event_v1 ev = event_of(category, kind, value);
    skippy_trampoline_v1(&ev, a);
}

/* One call through a real entry point; `i` is the producer's call number (from 0). */
static void emit_one(producer *p, enum emit_case c, uint64_t i) {
    world *w = p->w;
    uint64_t value = i + 1;
    uint64_t round = i / CASE_COUNT;
    skippy_runtime_event_v1 ev = event_of(SKIPPY_CATEGORY_MODEL_OPEN,
                                          SKIPPY_KIND_MODEL_OPEN_FINISHED, value);
    switch (c) {
    case CASE_TERMINAL:
        skippy_trampoline_v1(&ev, w->drained_shared);
        break;
    case CASE_TERMINAL_BASE_SIZE:
        ev.struct_size = SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE;
        skippy_trampoline_v1(&ev, w->drained_shared);
        break;
    case CASE_TERMINAL_LARGER: {
        _Alignas(8) unsigned char bigger[200];
        memset(bigger, 0xab, sizeof(bigger));
        ev.struct_size = (uint32_t)sizeof(bigger);
        memcpy(bigger, &ev, sizeof(ev));
        skippy_trampoline_v1((const skippy_runtime_event_v1 *)(const void *)bigger,
                             w->drained_shared);
        break;
    }
    case CASE_TERMINAL_UNSCOPED:
        skippy_trampoline_v1(&ev, w->drained_unscoped);
        break;
    case CASE_DIAGNOSTIC_DETAIL:
        ev = event_of(SKIPPY_CATEGORY_DIAGNOSTIC, SKIPPY_KIND_DIAGNOSTIC_WARNING_RAISED, value);
        ev.detail_ptr = g_detail;
        ev.detail_len = sizeof(g_detail);
        skippy_trampoline_v1(&ev, w->drained_shared);
        break;
    case CASE_UNKNOWN_KIND:
        trampoline(w->drained_shared, 99, 9999, value);
        break;
    case CASE_PROGRESS_DRAINED:
        trampoline(p->drained_keys[round % DRAINED_KEYS], SKIPPY_CATEGORY_MODEL_OPEN,
                   SKIPPY_KIND_MODEL_OPEN_PROGRESS, value);
        break;
    case CASE_LLAMA_PROGRESS:
        (void)skippy_llama_progress_callback((float)(round % 1000u + 1u) / 1000.0f, p->llama);
        break;
    case CASE_LLAMA_CANCELLED:
        if (!skippy_llama_progress_callback(0.5f, p->cancelled)) p->cancel_returned++;
        break;
    case CASE_ABORT_CANCELLED:
        if (skippy_llama_abort_callback(p->cancelled)) p->abort_returned_true++;
        break;
    case CASE_ABORT_LIVE:
        if (skippy_llama_abort_callback(p->llama)) p->abort_returned_true++;
        break;
    case CASE_LOG_CAPTURED:
        skippy_llama_log_callback((int)(round % 7u), "llama_model_loader: a log line\n",
                                  w->drained_shared);
        break;
    case CASE_LOG_LONG:
        skippy_llama_log_callback(1, g_long_log, w->drained_shared);
        break;
    case CASE_REJECT_NULL:
        skippy_trampoline_v1(NULL, w->drained_shared);
        break;
    case CASE_REJECT_ABI:
        ev.abi_version = 2;
        skippy_trampoline_v1(&ev, w->drained_shared);
        break;
    case CASE_REJECT_SIZE:
        ev.struct_size = SKIPPY_RUNTIME_EVENT_V1_BASE_SIZE - 8;
        skippy_trampoline_v1(&ev, w->drained_shared);
        break;
    case CASE_REJECT_DETAIL_LEN:
        ev.detail_ptr = g_detail;
        ev.detail_len = SKIPPY_RUNTIME_EVENT_MAX_DETAIL_LEN + 1ull;
        skippy_trampoline_v1(&ev, w->drained_shared);
        break;
    case CASE_REJECT_DETAIL_PTR:
        ev.detail_len = 16;
        skippy_trampoline_v1(&ev, w->drained_shared);
        break;
    case CASE_REJECT_CATEGORY:
        ev.category = 0;
        skippy_trampoline_v1(&ev, w->drained_shared);
        break;
    case CASE_TERMINAL_FULL:
        skippy_trampoline_v1(&ev, w->full_shared);
        break;
    case CASE_DIAGNOSTIC_FULL:
        trampoline(w->full_shared, SKIPPY_CATEGORY_DIAGNOSTIC,
                   SKIPPY_KIND_DIAGNOSTIC_RECOVERABLE_FAILURE, value);
        break;
    case CASE_PROGRESS_COALESCED:
        trampoline(p->full_keys[round % FULL_KEYS], SKIPPY_CATEGORY_MODEL_OPEN,
                   SKIPPY_KIND_MODEL_OPEN_PROGRESS, value);
        break;
    case CASE_PROGRESS_REGRESSION:
        trampoline(p->regression, SKIPPY_CATEGORY_MODEL_OPEN, SKIPPY_KIND_MODEL_OPEN_PROGRESS,
                   value);
        break;
    case CASE_LOG_RING_FULL:
        skippy_llama_log_callback(3, "a line nobody reads\n", w->full_shared);
        break;
    case CASE_REJECT_CLOSED:
        skippy_trampoline_v1(&ev, w->closed_shared);
        break;
    case CASE_CONTENDED_INSERT:
        trampoline(p->insert_locked, SKIPPY_CATEGORY_MODEL_OPEN, SKIPPY_KIND_MODEL_OPEN_PROGRESS,
                   value);
        break;
    case CASE_CONTENDED_SLOT:
        trampoline(p->slot_locked, SKIPPY_CATEGORY_MODEL_OPEN, SKIPPY_KIND_MODEL_OPEN_PROGRESS,
                   value);
        break;
    case CASE_COUNT:
        break;
    }
}

static long voluntary_switches(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0) return -1;
    return ru.ru_nvcsw;
}

static void *producer_main(void *arg) {
    producer *p = arg;
    pthread_barrier_wait(&p->w->start);
    long switches_before = voluntary_switches();
    uint32_t start = p->index * 7u; /* threads walk the cases out of phase */
    measure_begin();
    for (uint64_t i = 0; i < p->records; i++)
        emit_one(p, (enum emit_case)((i + start) % CASE_COUNT), i);
    measure_end(p->counts);
    p->voluntary_switches = voluntary_switches() - switches_before;
    return NULL;
}

/* The host: wait on the futex, drain facts and the debug ring, like the pipeline thread. */
static void *host_main(void *arg) {
    world *w = arg;
    static skippy_native_fact_v1 facts[256];
    static char text[65536];
    for (;;) {
        bool stopping = atomic_load_explicit(&w->stop_host, memory_order_acquire) != 0;
        (void)skippy_ingress_wait(w->drained.ingress, 5);
        size_t n = skippy_ingress_drain(w->drained.ingress, facts, 256);
        size_t t = skippy_ingress_debug_read(w->drained.ingress, text, sizeof(text));
        if (stopping && n == 0 && t == 0) return NULL;
    }
}

/* ---- one run ---- */

typedef struct path_check {
    const char *name;
    uint64_t value;
} path_check;

#define MAX_PATHS 32

typedef struct run_result {
    uint32_t threads;
    uint64_t emits;
    uint64_t counts[C_COUNT];
    long voluntary_switches;
    path_check paths[MAX_PATHS];
    int path_count;
    int atomics_checked;
    bool atomics_lock_free;
} run_result;

static void add_path(run_result *r, const char *name, uint64_t value) {
    if (r->path_count < MAX_PATHS) r->paths[r->path_count++] = (path_check){name, value};
}

/* Run-time lock-freedom of the exact atomic objects the path touches. */
#define CHECK_LOCK_FREE(obj)                                                                \
    do {                                                                                    \
        r->atomics_checked++;                                                               \
        if (!atomic_is_lock_free(obj)) {                                                    \
            fprintf(stderr, "emit_path_audit: not lock-free: %s\n", #obj);                  \
            r->atomics_lock_free = false;                                                   \
        }                                                                                   \
    } while (0)

static void check_atomics(world *w, run_result *r) {
    skippy_region *reg = w->drained.ingress->region;
    skippy_adapter_t *a = w->drained_shared;
    skippy_progress_slot *slot = progress_slot_at(w->drained.ingress, 0);
    skippy_ring_slot *ring = (skippy_ring_slot *)(void *)((char *)reg +
                                                          w->drained.ingress->terminal_offset);
    r->atomics_lock_free = true;
    CHECK_LOCK_FREE(&reg->closed);
    CHECK_LOCK_FREE(&reg->sleeper);
    CHECK_LOCK_FREE(&reg->wake_seq);
    CHECK_LOCK_FREE(&reg->cancel_operation_id);
    CHECK_LOCK_FREE(&reg->ingress_sequence);
    CHECK_LOCK_FREE(&reg->progress_insert_lock);
    CHECK_LOCK_FREE(&reg->terminal_ctl.tail);
    CHECK_LOCK_FREE(&reg->debug_head);
    CHECK_LOCK_FREE(&reg->lanes[0].accepted);
    CHECK_LOCK_FREE(&reg->log_messages_by_level[0]);
    CHECK_LOCK_FREE(&ring->seq);
    CHECK_LOCK_FREE(&slot->lock);
    CHECK_LOCK_FREE(&slot->key_kind);
    CHECK_LOCK_FREE(&slot->key_operation);
    CHECK_LOCK_FREE(&slot->state);
    CHECK_LOCK_FREE(&a->progress_delay_us);
    CHECK_LOCK_FREE(&a->active_operation);
    CHECK_LOCK_FREE(&a->sequence);
    CHECK_LOCK_FREE(&a->last_progress);
    CHECK_LOCK_FREE(&a->epoch);
    CHECK_LOCK_FREE(&a->in_flight[0]);
}

static skippy_ingress_stats_v1 stats_of(region *r) {
    skippy_ingress_stats_v1 s;
    skippy_ingress_stats(r->ingress, &s);
    return s;
}

static void run(uint32_t threads, uint64_t records, run_result *out) {
    memset(out, 0, sizeof(*out));
    out->threads = threads;
    world *w = calloc(1, sizeof(*w));
    producer *ps = calloc(threads, sizeof(*ps));
    if (w == NULL || ps == NULL) die("calloc");
    w->drained = region_new(1024, 1024, DRAINED_PROGRESS_SLOTS, 65536);
    /* Small enough that MIN_RECORDS calls per thread fill every lane of it deterministically. */
    w->full = region_new(16, 16, FULL_PROGRESS_SLOTS, 256);
    w->closed = region_new(64, 64, 4, 4096);
    w->insert_locked = region_new(64, 64, 4, 4096);
    w->slot_locked = region_new(64, 64, 4, 4096);

    w->drained_shared = adapter_new(&w->drained, SKIPPY_ADAPTER_CAPTURE_DEBUG_LOG, OP_SHARED);
    w->drained_unscoped = adapter_new(&w->drained, 0, 0);
    w->full_shared = adapter_new(&w->full, SKIPPY_ADAPTER_CAPTURE_DEBUG_LOG, OP_SHARED);
    w->closed_shared = adapter_new(&w->closed, 0, OP_SHARED);
    skippy_ingress_close(w->closed.ingress);
    skippy_ingress_request_cancel(w->drained.ingress, OP_CANCELLED);

    /* The regression key holds one of the full region's two slots with a value no producer
     * reaches, undrained, so it is never evicted: every later value of it is suppressed. */
    w->regression_owner = adapter_new(&w->full, 0, OP_REGRESSION);
    trampoline(w->regression_owner, SKIPPY_CATEGORY_MODEL_OPEN, SKIPPY_KIND_MODEL_OPEN_PROGRESS,
               UINT64_MAX - 1);
    /* Contended paths, forced: hold the insert try-lock, and the slot try-lock of a keyed slot. */
    atomic_store(&w->insert_locked.ingress->region->progress_insert_lock, 1);
    w->slot_owner = adapter_new(&w->slot_locked, 0, OP_SLOT_LOCKED);
    trampoline(w->slot_owner, SKIPPY_CATEGORY_MODEL_OPEN, SKIPPY_KIND_MODEL_OPEN_PROGRESS, 1);
    bool slot_found = false;
    for (uint32_t i = 0; i < w->slot_locked.ingress->progress_slots; i++) {
        skippy_progress_slot *slot = progress_slot_at(w->slot_locked.ingress, i);
        if (atomic_load(&slot->key_operation) == OP_SLOT_LOCKED) {
            atomic_store(&slot->lock, 1);
            slot_found = true;
        }
    }
    if (!slot_found) die("keyed slot for the contended-slot path");

    for (uint32_t t = 0; t < threads; t++) {
        producer *p = &ps[t];
        p->w = w;
        p->index = t;
        p->records = records;
        for (uint32_t k = 0; k < DRAINED_KEYS; k++)
            p->drained_keys[k] = adapter_new(&w->drained, 0, OP_PER_THREAD(1u, t, k));
        for (uint32_t k = 0; k < FULL_KEYS; k++)
            p->full_keys[k] = adapter_new(&w->full, 0, OP_PER_THREAD(2u, t, k));
        p->llama = adapter_new(&w->drained, 0, OP_PER_THREAD(3u, t, 0u));
        p->cancelled = adapter_new(&w->drained, 0, OP_CANCELLED);
        p->regression = adapter_new(&w->full, 0, OP_REGRESSION);
        p->insert_locked = adapter_new(&w->insert_locked, 0, OP_INSERT_LOCKED + t);
        p->slot_locked = adapter_new(&w->slot_locked, 0, OP_SLOT_LOCKED);
    }
    check_atomics(w, out);

    if (pthread_barrier_init(&w->start, NULL, threads + 1) != 0) die("pthread_barrier_init");
    pthread_t host;
    pthread_t tids[MAX_THREADS];
    if (pthread_create(&host, NULL, host_main, w) != 0) die("pthread_create host");
    for (uint32_t t = 0; t < threads; t++)
        if (pthread_create(&tids[t], NULL, producer_main, &ps[t]) != 0) die("pthread_create");
    pthread_barrier_wait(&w->start);
    for (uint32_t t = 0; t < threads; t++) pthread_join(tids[t], NULL);
    atomic_store_explicit(&w->stop_host, 1, memory_order_release);
    pthread_join(host, NULL);
    pthread_barrier_destroy(&w->start);

    uint64_t cancel_returned = 0, abort_true = 0;
    for (uint32_t t = 0; t < threads; t++) {
        for (int c = 0; c < C_COUNT; c++) out->counts[c] += ps[t].counts[c];
        out->emits += ps[t].records;
        out->voluntary_switches += ps[t].voluntary_switches;
        cancel_returned += ps[t].cancel_returned;
        abort_true += ps[t].abort_returned_true;
    }

    skippy_ingress_stats_v1 d = stats_of(&w->drained), f = stats_of(&w->full);
    skippy_ingress_stats_v1 c = stats_of(&w->closed), il = stats_of(&w->insert_locked);
    skippy_ingress_stats_v1 sl = stats_of(&w->slot_locked);
    uint64_t logs = 0;
    for (int i = 0; i < 6; i++) logs += d.log_messages_by_level[i];
    add_path(out, "terminal_accepted", d.lanes[SKIPPY_LANE_TERMINAL].accepted);
    add_path(out, "terminal_drained", d.lanes[SKIPPY_LANE_TERMINAL].drained);
    add_path(out, "diagnostic_accepted", d.lanes[SKIPPY_LANE_DIAGNOSTIC].accepted);
    add_path(out, "diagnostic_drained", d.lanes[SKIPPY_LANE_DIAGNOSTIC].drained);
    add_path(out, "progress_accepted", d.lanes[SKIPPY_LANE_PROGRESS].accepted);
    add_path(out, "progress_drained", d.lanes[SKIPPY_LANE_PROGRESS].drained);
    add_path(out, "unknown_kind", d.unknown_kind);
    add_path(out, "detail_truncated", d.detail_truncated);
    add_path(out, "rejected_abi_version", d.rejected_abi_version);
    add_path(out, "rejected_struct_size", d.rejected_struct_size);
    add_path(out, "rejected_detail", d.rejected_detail);
    add_path(out, "rejected_discriminant", d.rejected_discriminant);
    add_path(out, "log_messages", logs);
    add_path(out, "debug_lines_captured", d.debug_lines_captured);
    add_path(out, "debug_bytes_dropped_truncated", d.debug_bytes_dropped);
    add_path(out, "llama_progress_cancelled", cancel_returned);
    add_path(out, "llama_abort_true", abort_true);
    add_path(out, "terminal_dropped_full", f.lanes[SKIPPY_LANE_TERMINAL].dropped_full);
    add_path(out, "diagnostic_dropped_full", f.lanes[SKIPPY_LANE_DIAGNOSTIC].dropped_full);
    add_path(out, "progress_coalesced", f.lanes[SKIPPY_LANE_PROGRESS].coalesced);
    add_path(out, "progress_dropped_full", f.lanes[SKIPPY_LANE_PROGRESS].dropped_full);
    add_path(out, "suppressed_regression", f.suppressed_regression);
    add_path(out, "debug_bytes_dropped_ring_full", f.debug_bytes_dropped);
    add_path(out, "rejected_closed", c.rejected_closed);
    add_path(out, "progress_contended_insert", il.progress_contended);
    add_path(out, "progress_contended_slot", sl.progress_contended);

    for (uint32_t t = 0; t < threads; t++) {
        producer *p = &ps[t];
        for (uint32_t k = 0; k < DRAINED_KEYS; k++) adapter_free(p->drained_keys[k]);
        for (uint32_t k = 0; k < FULL_KEYS; k++) adapter_free(p->full_keys[k]);
        adapter_free(p->llama);
        adapter_free(p->cancelled);
        adapter_free(p->regression);
        adapter_free(p->insert_locked);
        adapter_free(p->slot_locked);
    }
    adapter_free(w->drained_shared);
    adapter_free(w->drained_unscoped);
    adapter_free(w->full_shared);
    adapter_free(w->closed_shared);
    adapter_free(w->regression_owner);
    adapter_free(w->slot_owner);
    region_free(&w->drained);
    region_free(&w->full);
    region_free(&w->closed);
    region_free(&w->insert_locked);
    region_free(&w->slot_locked);
    free(ps);
    free(w);
}

/* ---- self-check: the counters fire, from our code and from inside libc ---- */

typedef struct self_check {
    uint64_t counts[C_COUNT];
    bool ok;
} self_check;

static void *self_check_main(void *arg) {
    self_check *sc = arg;
    const char *volatile source = "a string libc copies with its own malloc";
    pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
    uint32_t word = 0;
    measure_begin();
    void *p = malloc(24); /* 1 malloc */
    g_sink = p;
    free(p);                       /* 1 free */
    char *copy = strdup(source);   /* 1 malloc, made inside libc */
    g_sink = copy;
    free(copy);                    /* 1 free */
    pthread_mutex_lock(&mutex);    /* 1 lock */
    pthread_mutex_unlock(&mutex);
    /* A futex wait that returns at once (EAGAIN: the word is not 1): 1 futex wait. */
    (void)syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 1u, NULL, NULL, 0);
    sched_yield(); /* 1 sleep/yield */
    measure_end(sc->counts);
    void *outside = malloc(24); /* outside the region: not counted */
    g_sink = outside;
    free(outside);
    sc->ok = sc->counts[C_MALLOC] == 2 && sc->counts[C_FREE] == 2 &&
             class_total(sc->counts, K_ALLOC) == 4 && sc->counts[C_MUTEX_LOCK] == 1 &&
             sc->counts[C_FUTEX_WAIT] == 1 && class_total(sc->counts, K_LOCK) == 2 &&
             sc->counts[C_SCHED_YIELD] == 1 && class_total(sc->counts, K_SLEEP) == 1 &&
             class_total(sc->counts, K_WAKE) == 0 && class_total(sc->counts, K_SYSCALL) == 0;
    return NULL;
}

/* ---- output ---- */

static void print_counts(const uint64_t counts[C_COUNT]) {
    printf("{");
    for (int c = 0; c < C_COUNT; c++)
        printf("%s\"%s\":%llu", c ? "," : "", counter_names[c], (unsigned long long)counts[c]);
    printf("}");
}

static bool run_clean(const run_result *r) {
    return class_total(r->counts, K_ALLOC) == 0 && class_total(r->counts, K_LOCK) == 0 &&
           class_total(r->counts, K_SLEEP) == 0 && class_total(r->counts, K_SYSCALL) == 0;
}

static int missing_paths(const run_result *r) {
    int missing = 0;
    for (int i = 0; i < r->path_count; i++) missing += r->paths[i].value == 0;
    return missing;
}

static void print_run(const run_result *r) {
    printf("{\"threads\":%u,\"emits\":%llu,\"allocations\":%llu,\"lock_acquisitions\":%llu,"
           "\"sleeps\":%llu,\"other_syscalls\":%llu,\"futex_wakes\":%llu,"
           "\"voluntary_context_switches\":%ld,\"zero\":%s,\"atomics_checked\":%d,"
           "\"atomics_lock_free\":%s,\"counts\":",
           r->threads, (unsigned long long)r->emits,
           (unsigned long long)class_total(r->counts, K_ALLOC),
           (unsigned long long)class_total(r->counts, K_LOCK),
           (unsigned long long)class_total(r->counts, K_SLEEP),
           (unsigned long long)class_total(r->counts, K_SYSCALL),
           (unsigned long long)class_total(r->counts, K_WAKE), r->voluntary_switches,
           run_clean(r) ? "true" : "false", r->atomics_checked,
           r->atomics_lock_free ? "true" : "false");
    print_counts(r->counts);
    printf(",\"paths\":{");
    for (int i = 0; i < r->path_count; i++)
        printf("%s\"%s\":%llu", i ? "," : "", r->paths[i].name,
               (unsigned long long)r->paths[i].value);
    printf("},\"paths_missing\":[");
    int printed = 0;
    for (int i = 0; i < r->path_count; i++)
        if (r->paths[i].value == 0) printf("%s\"%s\"", printed++ ? "," : "", r->paths[i].name);
    printf("]}");
}

static void usage(void) {
    fprintf(stderr, "usage: emit_path_audit [--records N]   (calls per producer thread, >= %u)\n",
            MIN_RECORDS);
    exit(2);
}

int main(int argc, char **argv) {
    uint64_t records = 1000000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--records") == 0 && i + 1 < argc) {
            char *end;
            records = strtoull(argv[++i], &end, 10);
            if (*end != '\0' || records < MIN_RECORDS) usage();
        } else {
            usage();
        }
    }
    memset(g_detail, 'd', sizeof(g_detail));
    memset(g_long_log, 'l', LONG_LOG_BYTES);
    g_long_log[LONG_LOG_BYTES - 1] = '\n';

    self_check sc;
    memset(&sc, 0, sizeof(sc));
    pthread_t checker;
    if (pthread_create(&checker, NULL, self_check_main, &sc) != 0) die("pthread_create");
    pthread_join(checker, NULL);

    static const uint32_t thread_counts[] = {1, 2, 4};
    run_result results[3];
    for (int i = 0; i < 3; i++) run(thread_counts[i], records, &results[i]);

    bool clean = true, broken = !sc.ok;
    for (int i = 0; i < 3; i++) {
        clean = clean && run_clean(&results[i]);
        broken = broken || missing_paths(&results[i]) != 0 || !results[i].atomics_lock_free;
    }

    printf("{\"audit\":\"native_emit_path\",\"version\":1,\"records_per_thread\":%llu,"
           "\"paths_per_thread\":%d,\"self_check\":{\"ok\":%s,\"allocations\":%llu,"
           "\"lock_acquisitions\":%llu,\"sleeps\":%llu,\"counts\":",
           (unsigned long long)records, (int)CASE_COUNT, sc.ok ? "true" : "false",
           (unsigned long long)class_total(sc.counts, K_ALLOC),
           (unsigned long long)class_total(sc.counts, K_LOCK),
           (unsigned long long)class_total(sc.counts, K_SLEEP));
    print_counts(sc.counts);
    printf("},\"runs\":[");
    for (int i = 0; i < 3; i++) {
        if (i) printf(",");
        print_run(&results[i]);
    }
    printf("],\"zero\":%s,\"ok\":%s}\n", clean ? "true" : "false",
           clean && !broken ? "true" : "false");
    fflush(stdout);

    if (!sc.ok) fprintf(stderr, "emit_path_audit: self-check failed: the counters do not fire\n");
    for (int i = 0; i < 3; i++) {
        if (missing_paths(&results[i]) != 0)
            fprintf(stderr, "emit_path_audit: %u threads: a path was not exercised\n",
                    results[i].threads);
        if (!run_clean(&results[i]))
            fprintf(stderr,
                    "emit_path_audit: %u threads: %llu allocator calls, %llu lock acquisitions, "
                    "%llu sleeps, %llu other syscalls on the emit path (must be 0)\n",
                    results[i].threads,
                    (unsigned long long)class_total(results[i].counts, K_ALLOC),
                    (unsigned long long)class_total(results[i].counts, K_LOCK),
                    (unsigned long long)class_total(results[i].counts, K_SLEEP),
                    (unsigned long long)class_total(results[i].counts, K_SYSCALL));
    }
    if (broken) return 2;
    return clean ? 0 : 1;
}
