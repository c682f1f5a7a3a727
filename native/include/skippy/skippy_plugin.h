/*
 * skippy_plugin.h — the Skippy serving plugin ABI, version 1.
 *
 * A serving plugin observes each generation's authoritative lifecycle (begin, committed tokens,
 * proposal outcomes, finish with a receipt, abort) and may propose the next tokens of a request
 * (a speculative draft the engine verifies). A plugin is a shared library exporting ONE symbol:
 *
 *     int32_t skippy_plugin_init_v1(uint32_t host_abi_version, skippy_plugin_v1 *out,
 *                                   size_t out_size);
 *
 * which fills `out` (a vtable: name, opaque state, callbacks) and returns a skippy_plugin_status.
 *
 * Where it runs: never in the engine. The host loads the library in a sidecar process of its own
 * (`python -m skippyctl.plugins.sidecar`), so a plugin that crashes costs its own process only;
 * the engine counts it, restarts it for new requests and disables it after repeated failures.
 *
 * Rules (the same as the event ABI, skippy_event.h):
 * - every boundary struct starts with `struct_size` (and `abi_version` where a version is
 *   negotiated: the vtable and the receipt); fields are append-only: a reader reads only the
 *   fields inside struct_size, a writer sets struct_size to the size it filled;
 * - every callback returns an explicit integer status (skippy_plugin_status); nothing may throw,
 *   longjmp or abort across the boundary (no C++ exceptions; an `extern "C"` C++ plugin catches
 *   everything itself);
 * - every pointer a callback receives is BORROWED: valid only for the duration of that call;
 *   a plugin copies what it keeps;
 * - the host calls a plugin from ONE thread, one callback at a time, so a plugin needs no lock
 *   of its own; callbacks should return quickly (lifecycle callbacks are delivered from a
 *   bounded queue: a slow plugin makes observations wait or be dropped, never inference);
 * - a NULL callback is "not implemented": the host skips it (a NULL `propose` never proposes).
 *
 * Activation: after init and before any other callback, the host calls `activate` once per
 * plugin process (a restarted sidecar is activated again) with the model it serves and the
 * operator's configuration for it (`load --plugin-config`). `activate` is an append-only
 * extension of the vtable: the host calls it only when the plugin's `struct_size` covers it
 * (>= SKIPPY_PLUGIN_V1_SIZE); a plugin built against the first, 80-byte vtable
 * (SKIPPY_PLUGIN_V1_BASE_SIZE) keeps working and is never called it. A status other than OK
 * from `activate` is a load failure: the model serves without the plugin.
 *
 * Outcomes: after the engine verified a proposal of the plugin, `outcome` says how it went
 * (kind FULL_ACCEPT, FIRST_MISMATCH, or STOPPED when the request ended inside the window);
 * the last window's outcome comes before `finish`/`abort`. A proposal the engine did not
 * verify is an outcome of kind DISCARDED with a discard reason (deadline exceeded, invalid
 * token count, invalid token id, position mismatch, execution failed). A discard is counted,
 * never a failure of the plugin: only a crash, an error status and a protocol error are.
 * The kind and reason fields are an append-only extension of the outcome struct (read them
 * only when its struct_size covers them); discards are sent only to a plugin whose vtable
 * covers `activate` (built against this header), so an older plugin sees verified windows only.
 *
 * Identity: requests and sessions are opaque u64 ids, stable for the plugin process' lifetime
 * (a session id is the same for every request of that session). They carry no prompt-derived
 * value. Token ids are llama.cpp token ids (int32); they reach the plugin and nothing else.
 *
 * The committed stream: for each request, the tokens the engine generated and committed, in
 * order, indexed from 0 (index 0 = the first generated token; the prompt comes with `begin`).
 * The host guarantees the plugin sees it contiguous, prefix-consistent and complete: the union
 * of `commit` runs, the `pending` runs of proposal queries and the `suffix` of `finish`, by
 * their `start` index, is every committed token exactly once, in order (each run starts where
 * the previous one ended). A request ended by `abort` gets no suffix. A request the host could
 * not `begin` (its queue was full) is never mentioned to the plugin at all.
 */
#ifndef SKIPPY_PLUGIN_H
#define SKIPPY_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define SKIPPY_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define SKIPPY_PLUGIN_EXPORT
#endif

#define SKIPPY_PLUGIN_ABI_VERSION 1u
/* The entry point's name, for dlsym. */
#define SKIPPY_PLUGIN_INIT_SYMBOL "skippy_plugin_init_v1"
/* Sizes of the version-1 structs (each pinned below). A struct that grew keeps its first size
 * as *_BASE_SIZE: a reader accepts any struct_size from it up and reads only what is inside. */
#define SKIPPY_PLUGIN_V1_BASE_SIZE 80u
#define SKIPPY_PLUGIN_V1_SIZE 88u
#define SKIPPY_PLUGIN_IDS_V1_SIZE 24u
#define SKIPPY_PLUGIN_TOKENS_V1_SIZE 24u
#define SKIPPY_PLUGIN_BEGIN_V1_SIZE 32u
#define SKIPPY_PLUGIN_QUERY_V1_SIZE 56u
#define SKIPPY_PLUGIN_OUTCOME_V1_BASE_SIZE 16u
#define SKIPPY_PLUGIN_OUTCOME_V1_SIZE 24u
#define SKIPPY_PLUGIN_RECEIPT_V1_SIZE 112u
#define SKIPPY_PLUGIN_ACTIVATION_V1_SIZE 64u

/* ---- status codes (explicit values; the wire contract) ---- */

typedef enum skippy_plugin_status {
    SKIPPY_PLUGIN_OK = 0,               /* done (propose: out_count tokens proposed, may be 0) */
    SKIPPY_PLUGIN_NO_PROPOSAL = 1,      /* propose only: nothing to propose this time */
    SKIPPY_PLUGIN_ERROR = 2,            /* the plugin failed; counted as a failure */
    SKIPPY_PLUGIN_INVALID_ARGUMENT = 3, /* an argument the plugin cannot use; a failure */
    SKIPPY_PLUGIN_UNSUPPORTED = 4       /* init: the host's ABI version is not one it speaks */
} skippy_plugin_status;

/* Why generation stopped (finish's receipt.stop_reason). */
typedef enum skippy_plugin_stop_reason {
    SKIPPY_PLUGIN_STOP_UNKNOWN = 0,
    SKIPPY_PLUGIN_STOP_EOS = 1,         /* an end-of-generation token */
    SKIPPY_PLUGIN_STOP_STRING = 2,      /* a stop string matched (never named) */
    SKIPPY_PLUGIN_STOP_LENGTH = 3,      /* max_tokens or the context */
    SKIPPY_PLUGIN_STOP_CANCELLED = 4,
    SKIPPY_PLUGIN_STOP_TIMEOUT = 5,
    SKIPPY_PLUGIN_STOP_ERROR = 6
} skippy_plugin_stop_reason;

/* Why a request was aborted (abort's reason): it ended without a finish. */
typedef enum skippy_plugin_abort_reason {
    SKIPPY_PLUGIN_ABORT_UNKNOWN = 0,
    SKIPPY_PLUGIN_ABORT_CANCELLED = 1,
    SKIPPY_PLUGIN_ABORT_TIMEOUT = 2,
    SKIPPY_PLUGIN_ABORT_ERROR = 3,
    SKIPPY_PLUGIN_ABORT_SHUTDOWN = 4,   /* the engine is unloading or shutting down */
    SKIPPY_PLUGIN_ABORT_RESTARTED = 5   /* reserved: the host restarted the plugin */
} skippy_plugin_abort_reason;

/* How a proposal of the plugin ended (outcome.kind; 0 in a 16-byte outcome: not said). */
typedef enum skippy_plugin_outcome_kind {
    SKIPPY_PLUGIN_OUTCOME_UNKNOWN = 0,
    SKIPPY_PLUGIN_OUTCOME_FULL_ACCEPT = 1,    /* every proposed token was committed */
    SKIPPY_PLUGIN_OUTCOME_FIRST_MISMATCH = 2, /* committed up to the first mismatch */
    SKIPPY_PLUGIN_OUTCOME_STOPPED = 3,        /* the request stopped inside the window
                                                 (end of generation, stop string, max tokens) */
    SKIPPY_PLUGIN_OUTCOME_DISCARDED = 4       /* never verified: see discard_reason */
} skippy_plugin_outcome_kind;

/* Why a proposal was discarded unverified (outcome.discard_reason with kind DISCARDED). */
typedef enum skippy_plugin_discard_reason {
    SKIPPY_PLUGIN_DISCARD_NONE = 0,
    SKIPPY_PLUGIN_DISCARD_DEADLINE_EXCEEDED = 1,   /* the answer missed the query's deadline */
    SKIPPY_PLUGIN_DISCARD_INVALID_TOKEN_COUNT = 2, /* more tokens than the query's capacity */
    SKIPPY_PLUGIN_DISCARD_INVALID_TOKEN_ID = 3,    /* an id outside the model's vocabulary */
    SKIPPY_PLUGIN_DISCARD_POSITION_MISMATCH = 4,   /* it no longer follows the committed text */
    SKIPPY_PLUGIN_DISCARD_EXECUTION_FAILED = 5     /* the step that would verify it failed */
} skippy_plugin_discard_reason;

/* How the model speculates (activation.spec_mode: `load --spec`). */
typedef enum skippy_plugin_spec_mode {
    SKIPPY_PLUGIN_SPEC_UNKNOWN = 0,
    SKIPPY_PLUGIN_SPEC_OFF = 1,
    SKIPPY_PLUGIN_SPEC_NGRAM = 2,
    SKIPPY_PLUGIN_SPEC_PLUGIN = 3,  /* the plugins' proposals are verified */
    SKIPPY_PLUGIN_SPEC_DRAFT = 4,
    SKIPPY_PLUGIN_SPEC_AUTO = 5
} skippy_plugin_spec_mode;

/* skippy_plugin_ids_v1.flags */
#define SKIPPY_PLUGIN_IDS_HAS_SESSION (1u << 0)

/* ---- structs ---- */

/* Who a callback is about. */
typedef struct skippy_plugin_ids_v1 {
    uint32_t struct_size; /*  0  sizeof(skippy_plugin_ids_v1) */
    uint32_t flags;       /*  4  SKIPPY_PLUGIN_IDS_* bits */
    uint64_t request_id;  /*  8  opaque, unique per request for the plugin process' lifetime */
    uint64_t session_id;  /* 16  opaque; meaningful only with SKIPPY_PLUGIN_IDS_HAS_SESSION */
} skippy_plugin_ids_v1;

/* A contiguous run of a request's committed tokens: ids[0] is committed token `start`. */
typedef struct skippy_plugin_tokens_v1 {
    uint64_t start;       /*  0  index in the committed stream of ids[0] */
    const int32_t *ids;   /*  8  borrowed; NULL when count is 0 */
    uint64_t count;       /* 16  may be 0 */
} skippy_plugin_tokens_v1;

/* begin: a generation starts (its prompt is known, nothing is committed yet). */
typedef struct skippy_plugin_begin_v1 {
    uint32_t struct_size;     /*  0  sizeof(skippy_plugin_begin_v1) */
    uint32_t reserved;        /*  4  0 */
    const int32_t *prompt;    /*  8  borrowed; the whole prompt, reused part included */
    uint64_t prompt_count;    /* 16 */
    uint64_t reused_count;    /* 24  leading prompt tokens whose KV was already there */
} skippy_plugin_begin_v1;

/* propose: the engine wants up to `capacity` draft tokens to verify after the committed ones.
 * `pending` are the tokens committed since the previous boundary that the plugin has not been
 * given yet (start = the index the plugin expects next; count may be 0): the plugin applies
 * them exactly as a commit BEFORE it proposes, so its view is exact. It writes at most
 * `capacity` token ids to out_ids, sets out_count and returns SKIPPY_PLUGIN_OK (or
 * NO_PROPOSAL). An answer after deadline_mono_ns (CLOCK_MONOTONIC, ns) is discarded by the
 * host, so a plugin may skip work once it is past. out_count > capacity is a failure. */
typedef struct skippy_plugin_query_v1 {
    uint32_t struct_size;             /*  0  sizeof(skippy_plugin_query_v1) */
    uint32_t capacity;                /*  4  entries of out_ids; >= 1 */
    uint64_t deadline_mono_ns;        /*  8  CLOCK_MONOTONIC */
    skippy_plugin_tokens_v1 pending;  /* 16  committed tokens since the previous boundary */
    int32_t *out_ids;                 /* 40  caller-provided, `capacity` entries, borrowed */
    uint32_t out_count;               /* 48  written by the plugin; 0 on entry */
    uint32_t reserved;                /* 52  0 */
} skippy_plugin_query_v1;

/* outcome: how the engine's verification of the plugin's last proposal for a request went, or
 * that it was discarded unverified. `kind` and `discard_reason` are an append-only extension:
 * present when struct_size >= SKIPPY_PLUGIN_OUTCOME_V1_SIZE. */
typedef struct skippy_plugin_outcome_v1 {
    uint32_t struct_size;    /*  0  sizeof(skippy_plugin_outcome_v1) */
    uint32_t proposed;       /*  4  tokens verified (a discard: tokens proposed, 0 if unknown) */
    uint32_t accepted;       /*  8  committed (they also arrive as committed tokens) */
    uint32_t rejected;       /* 12  proposed - accepted */
    uint32_t kind;           /* 16  skippy_plugin_outcome_kind */
    uint32_t discard_reason; /* 20  skippy_plugin_discard_reason (kind DISCARDED), else NONE */
} skippy_plugin_outcome_v1;

/* activate: the model the plugin serves and the operator's configuration for it. Every
 * pointer is borrowed for the call. No path: model_id is the model's alias or its file's
 * basename. */
typedef struct skippy_plugin_activation_v1 {
    uint32_t struct_size;          /*  0  sizeof(skippy_plugin_activation_v1) */
    uint32_t spec_mode;            /*  4  skippy_plugin_spec_mode */
    const char *model_id;          /*  8  NUL-terminated */
    const char *config;            /* 16  NUL-terminated, `load --plugin-config`; "" if none */
    uint64_t config_len;           /* 24  bytes of config before its NUL */
    uint64_t n_vocab;              /* 32  token ids are 0 <= id < n_vocab */
    uint64_t n_ctx_per_lane;       /* 40  tokens of context each lane (sequence) has */
    uint32_t lanes;                /* 48  parallel sequences the engine serves */
    uint32_t reserved;             /* 52  0 */
    uint64_t proposal_deadline_ns; /* 56  how long a step waits for a proposal (relative) */
} skippy_plugin_activation_v1;

/* finish: the request's generation receipt. A timing that does not apply is NaN. */
typedef struct skippy_plugin_receipt_v1 {
    uint32_t abi_version;     /*   0  SKIPPY_PLUGIN_ABI_VERSION */
    uint32_t struct_size;     /*   4  sizeof(skippy_plugin_receipt_v1) */
    uint32_t stop_reason;     /*   8  skippy_plugin_stop_reason */
    uint32_t reserved;        /*  12  0 */
    uint64_t prompt_tokens;   /*  16 */
    uint64_t reused_tokens;   /*  24  prompt tokens whose KV was already there */
    uint64_t generated_tokens;/*  32  without an end-of-generation token */
    double queue_ms;          /*  40  the engine's wait: reached the engine -> prefill began */
    double prefill_ms;        /*  48 */
    double ttft_ms;           /*  56  time to first token */
    double decode_ms;         /*  64  first to last sampled token */
    uint64_t spec_proposed;   /*  72  draft tokens verified (all proposers) */
    uint64_t spec_accepted;   /*  80  of them committed */
    uint64_t spec_rejected;   /*  88  proposed - accepted */
    uint64_t spec_late;       /*  96  proposals that came after their deadline */
    uint64_t spec_discarded;  /* 104  run-ahead tokens dropped unexecuted */
} skippy_plugin_receipt_v1;

/* Callbacks. `state` is the vtable's state. Every one returns a skippy_plugin_status. */
typedef int32_t (*skippy_plugin_begin_fn)(void *state, const skippy_plugin_ids_v1 *ids,
                                          const skippy_plugin_begin_v1 *begin);
/* canonical committed tokens, contiguous with what the plugin saw before */
typedef int32_t (*skippy_plugin_commit_fn)(void *state, const skippy_plugin_ids_v1 *ids,
                                           const skippy_plugin_tokens_v1 *tokens);
typedef int32_t (*skippy_plugin_propose_fn)(void *state, const skippy_plugin_ids_v1 *ids,
                                            skippy_plugin_query_v1 *query);
typedef int32_t (*skippy_plugin_outcome_fn)(void *state, const skippy_plugin_ids_v1 *ids,
                                            const skippy_plugin_outcome_v1 *outcome);
/* the final committed suffix (everything not given before; count may be 0), then the receipt;
 * the last callback for the request */
typedef int32_t (*skippy_plugin_finish_fn)(void *state, const skippy_plugin_ids_v1 *ids,
                                           const skippy_plugin_tokens_v1 *suffix,
                                           const skippy_plugin_receipt_v1 *receipt);
/* the request ended without a finish (skippy_plugin_abort_reason); the last callback for it */
typedef int32_t (*skippy_plugin_abort_fn)(void *state, const skippy_plugin_ids_v1 *ids,
                                          uint32_t reason);
/* the plugin is unloaded: free `state`. Called once, last; never after a crash. */
typedef void (*skippy_plugin_destroy_fn)(void *state);
/* the model and its configuration (see Activation above); once, before any other callback */
typedef int32_t (*skippy_plugin_activate_fn)(void *state,
                                             const skippy_plugin_activation_v1 *activation);

/* The vtable skippy_plugin_init_v1 fills. The host zeroes it and sets nothing else first. */
typedef struct skippy_plugin_v1 {
    uint32_t abi_version;             /*  0  SKIPPY_PLUGIN_ABI_VERSION the plugin implements */
    uint32_t struct_size;             /*  4  bytes the plugin filled (>= *_V1_BASE_SIZE) */
    const char *name;                 /*  8  NUL-terminated, static, short, for diagnostics */
    void *state;                      /* 16  opaque, passed to every callback */
    skippy_plugin_begin_fn begin;     /* 24 */
    skippy_plugin_commit_fn commit;   /* 32 */
    skippy_plugin_propose_fn propose; /* 40 */
    skippy_plugin_outcome_fn outcome; /* 48 */
    skippy_plugin_finish_fn finish;   /* 56 */
    skippy_plugin_abort_fn abort;     /* 64 */
    skippy_plugin_destroy_fn destroy; /* 72 */
    skippy_plugin_activate_fn activate; /* 80  extension: called when struct_size >= 88 */
} skippy_plugin_v1;

/* The entry point. host_abi_version: the ABI the host speaks (SKIPPY_PLUGIN_ABI_VERSION);
 * a plugin that does not speak it returns SKIPPY_PLUGIN_UNSUPPORTED. out_size: the bytes at
 * `out` (a plugin writes at most that many and sets struct_size to what it filled; smaller than
 * SKIPPY_PLUGIN_V1_BASE_SIZE: SKIPPY_PLUGIN_INVALID_ARGUMENT). Returns SKIPPY_PLUGIN_OK with `out` filled, or an error
 * status (the host then unloads the library without calling anything else). */
typedef int32_t (*skippy_plugin_init_v1_fn)(uint32_t host_abi_version, skippy_plugin_v1 *out,
                                            size_t out_size);
SKIPPY_PLUGIN_EXPORT int32_t skippy_plugin_init_v1(uint32_t host_abi_version,
                                                   skippy_plugin_v1 *out, size_t out_size);

/* ---- layout pins ---- */

_Static_assert(sizeof(void *) == 8, "the Skippy plugin ABI is defined for 64-bit targets");
_Static_assert(sizeof(double) == 8, "double is IEEE-754 binary64");

_Static_assert(offsetof(skippy_plugin_ids_v1, struct_size) == 0, "ids.struct_size");
_Static_assert(offsetof(skippy_plugin_ids_v1, flags) == 4, "ids.flags");
_Static_assert(offsetof(skippy_plugin_ids_v1, request_id) == 8, "ids.request_id");
_Static_assert(offsetof(skippy_plugin_ids_v1, session_id) == 16, "ids.session_id");
_Static_assert(sizeof(skippy_plugin_ids_v1) == SKIPPY_PLUGIN_IDS_V1_SIZE, "ids size");

_Static_assert(offsetof(skippy_plugin_tokens_v1, start) == 0, "tokens.start");
_Static_assert(offsetof(skippy_plugin_tokens_v1, ids) == 8, "tokens.ids");
_Static_assert(offsetof(skippy_plugin_tokens_v1, count) == 16, "tokens.count");
_Static_assert(sizeof(skippy_plugin_tokens_v1) == SKIPPY_PLUGIN_TOKENS_V1_SIZE, "tokens size");

_Static_assert(offsetof(skippy_plugin_begin_v1, struct_size) == 0, "begin.struct_size");
_Static_assert(offsetof(skippy_plugin_begin_v1, reserved) == 4, "begin.reserved");
_Static_assert(offsetof(skippy_plugin_begin_v1, prompt) == 8, "begin.prompt");
_Static_assert(offsetof(skippy_plugin_begin_v1, prompt_count) == 16, "begin.prompt_count");
_Static_assert(offsetof(skippy_plugin_begin_v1, reused_count) == 24, "begin.reused_count");
_Static_assert(sizeof(skippy_plugin_begin_v1) == SKIPPY_PLUGIN_BEGIN_V1_SIZE, "begin size");

_Static_assert(offsetof(skippy_plugin_query_v1, struct_size) == 0, "query.struct_size");
_Static_assert(offsetof(skippy_plugin_query_v1, capacity) == 4, "query.capacity");
_Static_assert(offsetof(skippy_plugin_query_v1, deadline_mono_ns) == 8, "query.deadline");
_Static_assert(offsetof(skippy_plugin_query_v1, pending) == 16, "query.pending");
_Static_assert(offsetof(skippy_plugin_query_v1, out_ids) == 40, "query.out_ids");
_Static_assert(offsetof(skippy_plugin_query_v1, out_count) == 48, "query.out_count");
_Static_assert(offsetof(skippy_plugin_query_v1, reserved) == 52, "query.reserved");
_Static_assert(sizeof(skippy_plugin_query_v1) == SKIPPY_PLUGIN_QUERY_V1_SIZE, "query size");

_Static_assert(offsetof(skippy_plugin_outcome_v1, struct_size) == 0, "outcome.struct_size");
_Static_assert(offsetof(skippy_plugin_outcome_v1, proposed) == 4, "outcome.proposed");
_Static_assert(offsetof(skippy_plugin_outcome_v1, accepted) == 8, "outcome.accepted");
_Static_assert(offsetof(skippy_plugin_outcome_v1, rejected) == 12, "outcome.rejected");
_Static_assert(offsetof(skippy_plugin_outcome_v1, kind) == SKIPPY_PLUGIN_OUTCOME_V1_BASE_SIZE,
               "outcome.kind: the extension starts where the first outcome ended");
_Static_assert(offsetof(skippy_plugin_outcome_v1, discard_reason) == 20, "outcome.reason");
_Static_assert(sizeof(skippy_plugin_outcome_v1) == SKIPPY_PLUGIN_OUTCOME_V1_SIZE,
               "outcome size");

_Static_assert(offsetof(skippy_plugin_activation_v1, struct_size) == 0, "activation.size");
_Static_assert(offsetof(skippy_plugin_activation_v1, spec_mode) == 4, "activation.spec_mode");
_Static_assert(offsetof(skippy_plugin_activation_v1, model_id) == 8, "activation.model_id");
_Static_assert(offsetof(skippy_plugin_activation_v1, config) == 16, "activation.config");
_Static_assert(offsetof(skippy_plugin_activation_v1, config_len) == 24, "activation.config_len");
_Static_assert(offsetof(skippy_plugin_activation_v1, n_vocab) == 32, "activation.n_vocab");
_Static_assert(offsetof(skippy_plugin_activation_v1, n_ctx_per_lane) == 40, "activation.n_ctx");
_Static_assert(offsetof(skippy_plugin_activation_v1, lanes) == 48, "activation.lanes");
_Static_assert(offsetof(skippy_plugin_activation_v1, reserved) == 52, "activation.reserved");
_Static_assert(offsetof(skippy_plugin_activation_v1, proposal_deadline_ns) == 56,
               "activation.proposal_deadline_ns");
_Static_assert(sizeof(skippy_plugin_activation_v1) == SKIPPY_PLUGIN_ACTIVATION_V1_SIZE,
               "activation size");

_Static_assert(offsetof(skippy_plugin_receipt_v1, abi_version) == 0, "receipt.abi_version");
_Static_assert(offsetof(skippy_plugin_receipt_v1, struct_size) == 4, "receipt.struct_size");
_Static_assert(offsetof(skippy_plugin_receipt_v1, stop_reason) == 8, "receipt.stop_reason");
_Static_assert(offsetof(skippy_plugin_receipt_v1, reserved) == 12, "receipt.reserved");
_Static_assert(offsetof(skippy_plugin_receipt_v1, prompt_tokens) == 16, "receipt.prompt");
_Static_assert(offsetof(skippy_plugin_receipt_v1, reused_tokens) == 24, "receipt.reused");
_Static_assert(offsetof(skippy_plugin_receipt_v1, generated_tokens) == 32, "receipt.generated");
_Static_assert(offsetof(skippy_plugin_receipt_v1, queue_ms) == 40, "receipt.queue_ms");
_Static_assert(offsetof(skippy_plugin_receipt_v1, prefill_ms) == 48, "receipt.prefill_ms");
_Static_assert(offsetof(skippy_plugin_receipt_v1, ttft_ms) == 56, "receipt.ttft_ms");
_Static_assert(offsetof(skippy_plugin_receipt_v1, decode_ms) == 64, "receipt.decode_ms");
_Static_assert(offsetof(skippy_plugin_receipt_v1, spec_proposed) == 72, "receipt.proposed");
_Static_assert(offsetof(skippy_plugin_receipt_v1, spec_accepted) == 80, "receipt.accepted");
_Static_assert(offsetof(skippy_plugin_receipt_v1, spec_rejected) == 88, "receipt.rejected");
_Static_assert(offsetof(skippy_plugin_receipt_v1, spec_late) == 96, "receipt.late");
_Static_assert(offsetof(skippy_plugin_receipt_v1, spec_discarded) == 104, "receipt.discarded");
_Static_assert(sizeof(skippy_plugin_receipt_v1) == SKIPPY_PLUGIN_RECEIPT_V1_SIZE,
               "receipt size");

_Static_assert(offsetof(skippy_plugin_v1, abi_version) == 0, "plugin.abi_version");
_Static_assert(offsetof(skippy_plugin_v1, struct_size) == 4, "plugin.struct_size");
_Static_assert(offsetof(skippy_plugin_v1, name) == 8, "plugin.name");
_Static_assert(offsetof(skippy_plugin_v1, state) == 16, "plugin.state");
_Static_assert(offsetof(skippy_plugin_v1, begin) == 24, "plugin.begin");
_Static_assert(offsetof(skippy_plugin_v1, commit) == 32, "plugin.commit");
_Static_assert(offsetof(skippy_plugin_v1, propose) == 40, "plugin.propose");
_Static_assert(offsetof(skippy_plugin_v1, outcome) == 48, "plugin.outcome");
_Static_assert(offsetof(skippy_plugin_v1, finish) == 56, "plugin.finish");
_Static_assert(offsetof(skippy_plugin_v1, abort) == 64, "plugin.abort");
_Static_assert(offsetof(skippy_plugin_v1, destroy) == 72, "plugin.destroy");
_Static_assert(offsetof(skippy_plugin_v1, activate) == SKIPPY_PLUGIN_V1_BASE_SIZE,
               "plugin.activate: the extension starts where the first vtable ended");
_Static_assert(sizeof(skippy_plugin_v1) == SKIPPY_PLUGIN_V1_SIZE, "plugin size");

#ifdef __cplusplus
}
#endif

#endif /* SKIPPY_PLUGIN_H */
