/*
 * fault_plugin.c — serving plugins that misbehave, for tests/plugins (skippy_plugin.h, ABI v1).
 * One file, built once per mode with -DFAULT_MODE=...:
 *   FAULT_SLEEP   (1): propose sleeps FAULT_SLEEP_MS (env, default 200 ms) past any deadline
 *   FAULT_GARBAGE (2): propose answers token ids >= n_vocab, negative ids, or more than capacity
 *   FAULT_CRASH   (3): propose raises SIGSEGV
 *   FAULT_ERROR   (4): propose and commit return SKIPPY_PLUGIN_ERROR
 *   FAULT_OLD_ABI (5): init refuses the host's ABI version (SKIPPY_PLUGIN_UNSUPPORTED)
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "skippy/skippy_plugin.h"

#define FAULT_SLEEP 1
#define FAULT_GARBAGE 2
#define FAULT_CRASH 3
#define FAULT_ERROR 4
#define FAULT_OLD_ABI 5

#ifndef FAULT_MODE
#error "build with -DFAULT_MODE=<1..5>"
#endif

static unsigned g_calls;

static int32_t on_commit(void *state, const skippy_plugin_ids_v1 *ids,
                         const skippy_plugin_tokens_v1 *tokens) {
    (void)state, (void)ids, (void)tokens;
    return FAULT_MODE == FAULT_ERROR ? SKIPPY_PLUGIN_ERROR : SKIPPY_PLUGIN_OK;
}

static int32_t on_propose(void *state, const skippy_plugin_ids_v1 *ids,
                          skippy_plugin_query_v1 *query) {
    (void)state, (void)ids;
    g_calls++;
#if FAULT_MODE == FAULT_SLEEP
    const char *ms_text = getenv("FAULT_SLEEP_MS");
    long ms = ms_text != NULL ? atol(ms_text) : 200;
    struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    query->out_ids[0] = 1;
    query->out_count = 1;
    return SKIPPY_PLUGIN_OK;
#elif FAULT_MODE == FAULT_GARBAGE
    switch (g_calls % 3) {
    case 0: /* beyond any vocabulary */
        query->out_ids[0] = 0x7fffffff;
        query->out_count = 1;
        break;
    case 1: /* negative */
        query->out_ids[0] = -5;
        query->out_count = 1;
        break;
    default: /* more than the buffer holds (the host must not read past it) */
        query->out_count = query->capacity + 7;
        break;
    }
    return SKIPPY_PLUGIN_OK;
#elif FAULT_MODE == FAULT_CRASH
    (void)query;
    raise(SIGSEGV);
    return SKIPPY_PLUGIN_OK;
#else
    (void)query;
    return SKIPPY_PLUGIN_ERROR;
#endif
}

SKIPPY_PLUGIN_EXPORT int32_t skippy_plugin_init_v1(uint32_t host_abi_version,
                                                   skippy_plugin_v1 *out, size_t out_size) {
#if FAULT_MODE == FAULT_OLD_ABI
    (void)out, (void)out_size, (void)host_abi_version;
    (void)on_commit, (void)on_propose;
    return SKIPPY_PLUGIN_UNSUPPORTED;
#else
    if (host_abi_version != SKIPPY_PLUGIN_ABI_VERSION) return SKIPPY_PLUGIN_UNSUPPORTED;
    /* The first, 80-byte vtable (no activate): a plugin built before the extension, which the
     * host must keep serving and never call past its struct_size. */
    if (out == NULL || out_size < SKIPPY_PLUGIN_V1_BASE_SIZE) return SKIPPY_PLUGIN_INVALID_ARGUMENT;
    memset(out, 0, SKIPPY_PLUGIN_V1_BASE_SIZE);
    out->abi_version = SKIPPY_PLUGIN_ABI_VERSION;
    out->struct_size = SKIPPY_PLUGIN_V1_BASE_SIZE;
    out->name = "fault";
    out->commit = on_commit;
    out->propose = on_propose;
    return SKIPPY_PLUGIN_OK;
#endif
}
