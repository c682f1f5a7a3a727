/*
 * ngram_plugin.c — an example serving plugin (skippy_plugin.h, ABI v1): prompt lookup decoding.
 *
 * For each request it keeps the history (prompt + committed tokens). A proposal query first
 * applies its pending run (as the ABI requires), then looks for the latest earlier occurrence of
 * the history's last NGRAM_MAX..NGRAM_MIN tokens and proposes what followed it (continued
 * cyclically when the match is so recent that its continuation runs into the present).
 *
 * It is built against the whole v1 vtable (activate included) but works with a host that offers
 * only the first 80 bytes (SKIPPY_PLUGIN_V1_BASE_SIZE): it fills what the host has room for.
 *
 * When SKIPPY_PLUGIN_RECORD names a file, it appends one line per stream event it saw, so a
 * test can check the stream is contiguous, prefix-consistent and complete:
 *     activate <model_id> <n_vocab> <n_ctx_per_lane> <lanes> <spec_mode> <config_len> <config>
 *     begin <request> <prompt_count> <reused>
 *     commit|pending|suffix <request> <start> <count> <id> <id> ...
 *     outcome <request> <kind> <discard_reason> <proposed> <accepted>
 *     finish <request> <generated_tokens> | abort <request> <reason>
 * (token ids go into that file: it is the plugin's own output, for tests.)
 *
 * Build: cc -std=c11 -O2 -Wall -Wextra -fPIC -shared -fvisibility=hidden \
 *            -I../../../native/include -o ngram_plugin.so ngram_plugin.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skippy/skippy_plugin.h"

#define NGRAM_MIN 2
#define NGRAM_MAX 4

typedef struct request {
    uint64_t id;
    int32_t *history;
    size_t len, cap;
    uint64_t next_index; /* committed tokens seen so far */
    size_t prompt_len;
    struct request *next;
} request;

typedef struct plugin_state {
    request *requests;
    FILE *record;
} plugin_state;

static request *find(plugin_state *s, uint64_t id) {
    for (request *r = s->requests; r != NULL; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

static void drop(plugin_state *s, uint64_t id) {
    for (request **link = &s->requests; *link != NULL; link = &(*link)->next) {
        if ((*link)->id == id) {
            request *r = *link;
            *link = r->next;
            free(r->history);
            free(r);
            return;
        }
    }
}

static int append(request *r, const int32_t *ids, uint64_t count) {
    if (count == 0) return 0;
    if (r->len + count > r->cap) {
        size_t cap = r->cap ? r->cap : 256;
        while (cap < r->len + count) cap *= 2;
        int32_t *grown = realloc(r->history, cap * sizeof(int32_t));
        if (grown == NULL) return -1;
        r->history = grown;
        r->cap = cap;
    }
    memcpy(r->history + r->len, ids, count * sizeof(int32_t));
    r->len += count;
    return 0;
}

static void record_run(plugin_state *s, const char *what, uint64_t request_id,
                       const skippy_plugin_tokens_v1 *t) {
    if (s->record == NULL) return;
    fprintf(s->record, "%s %llu %llu %llu", what, (unsigned long long)request_id,
            (unsigned long long)t->start, (unsigned long long)t->count);
    for (uint64_t i = 0; i < t->count; i++) fprintf(s->record, " %d", (int)t->ids[i]);
    fputc('\n', s->record);
    fflush(s->record);
}

/* Apply a run of committed tokens; a run that does not continue the stream is refused. */
static int32_t apply(plugin_state *s, const skippy_plugin_ids_v1 *ids, const char *what,
                     const skippy_plugin_tokens_v1 *t) {
    request *r = find(s, ids->request_id);
    if (r == NULL || t->start != r->next_index || (t->count > 0 && t->ids == NULL))
        return SKIPPY_PLUGIN_INVALID_ARGUMENT;
    record_run(s, what, ids->request_id, t);
    if (append(r, t->ids, t->count) != 0) return SKIPPY_PLUGIN_ERROR;
    r->next_index += t->count;
    return SKIPPY_PLUGIN_OK;
}

static int32_t on_begin(void *state, const skippy_plugin_ids_v1 *ids,
                        const skippy_plugin_begin_v1 *begin) {
    plugin_state *s = state;
    drop(s, ids->request_id);
    request *r = calloc(1, sizeof(*r));
    if (r == NULL) return SKIPPY_PLUGIN_ERROR;
    r->id = ids->request_id;
    r->next = s->requests;
    s->requests = r;
    if (append(r, begin->prompt, begin->prompt_count) != 0) return SKIPPY_PLUGIN_ERROR;
    r->prompt_len = r->len;
    if (s->record != NULL) {
        fprintf(s->record, "begin %llu %llu %llu\n", (unsigned long long)ids->request_id,
                (unsigned long long)begin->prompt_count, (unsigned long long)begin->reused_count);
        fflush(s->record);
    }
    return SKIPPY_PLUGIN_OK;
}

static int32_t on_commit(void *state, const skippy_plugin_ids_v1 *ids,
                         const skippy_plugin_tokens_v1 *tokens) {
    return apply(state, ids, "commit", tokens);
}

static int32_t on_propose(void *state, const skippy_plugin_ids_v1 *ids,
                          skippy_plugin_query_v1 *query) {
    plugin_state *s = state;
    int32_t status = apply(s, ids, "pending", &query->pending);
    if (status != SKIPPY_PLUGIN_OK) return status;
    request *r = find(s, ids->request_id);
    const int32_t *h = r->history;
    size_t size = r->len;
    for (size_t n = size < NGRAM_MAX ? size : NGRAM_MAX; n >= NGRAM_MIN; n--) {
        const int32_t *suffix = h + size - n;
        /* the latest earlier occurrence, one that has a following token */
        for (size_t at = size - n; at-- > 0;) {
            if (memcmp(h + at, suffix, n * sizeof(int32_t)) != 0) continue;
            size_t from = at + n, period = size - from;
            uint32_t out = 0;
            while (out < query->capacity) {
                size_t k = from + out;
                query->out_ids[out] = k < size ? h[k] : query->out_ids[out - period];
                out++;
            }
            query->out_count = out;
            return SKIPPY_PLUGIN_OK;
        }
    }
    return SKIPPY_PLUGIN_NO_PROPOSAL;
}

static int32_t on_activate(void *state, const skippy_plugin_activation_v1 *activation) {
    plugin_state *s = state;
    if (activation == NULL || activation->struct_size < SKIPPY_PLUGIN_ACTIVATION_V1_SIZE)
        return SKIPPY_PLUGIN_INVALID_ARGUMENT;
    /* A configuration this plugin cannot take is refused: the model serves without it. */
    if (activation->config != NULL && strcmp(activation->config, "refuse") == 0)
        return SKIPPY_PLUGIN_INVALID_ARGUMENT;
    if (s->record != NULL) {
        fprintf(s->record, "activate %s %llu %llu %u %u %llu %s\n",
                activation->model_id != NULL ? activation->model_id : "",
                (unsigned long long)activation->n_vocab,
                (unsigned long long)activation->n_ctx_per_lane, activation->lanes,
                activation->spec_mode, (unsigned long long)activation->config_len,
                activation->config != NULL ? activation->config : "");
        fflush(s->record);
    }
    return SKIPPY_PLUGIN_OK;
}

static int32_t on_outcome(void *state, const skippy_plugin_ids_v1 *ids,
                          const skippy_plugin_outcome_v1 *outcome) {
    plugin_state *s = state;
    /* kind and discard_reason exist only in an outcome that is large enough */
    uint32_t kind = outcome->struct_size >= SKIPPY_PLUGIN_OUTCOME_V1_SIZE ? outcome->kind : 0;
    uint32_t reason =
        outcome->struct_size >= SKIPPY_PLUGIN_OUTCOME_V1_SIZE ? outcome->discard_reason : 0;
    if (s->record != NULL) {
        fprintf(s->record, "outcome %llu %u %u %u %u\n", (unsigned long long)ids->request_id,
                kind, reason, outcome->proposed, outcome->accepted);
        fflush(s->record);
    }
    return SKIPPY_PLUGIN_OK;
}

static int32_t on_finish(void *state, const skippy_plugin_ids_v1 *ids,
                         const skippy_plugin_tokens_v1 *suffix,
                         const skippy_plugin_receipt_v1 *receipt) {
    plugin_state *s = state;
    int32_t status = apply(s, ids, "suffix", suffix);
    if (s->record != NULL) {
        fprintf(s->record, "finish %llu %llu\n", (unsigned long long)ids->request_id,
                (unsigned long long)(receipt->struct_size >= SKIPPY_PLUGIN_RECEIPT_V1_SIZE
                                         ? receipt->generated_tokens
                                         : 0));
        fflush(s->record);
    }
    drop(s, ids->request_id);
    return status;
}

static int32_t on_abort(void *state, const skippy_plugin_ids_v1 *ids, uint32_t reason) {
    plugin_state *s = state;
    if (s->record != NULL) {
        fprintf(s->record, "abort %llu %u\n", (unsigned long long)ids->request_id, reason);
        fflush(s->record);
    }
    drop(s, ids->request_id);
    return SKIPPY_PLUGIN_OK;
}

static void on_destroy(void *state) {
    plugin_state *s = state;
    while (s->requests != NULL) drop(s, s->requests->id);
    if (s->record != NULL) fclose(s->record);
    free(s);
}

SKIPPY_PLUGIN_EXPORT int32_t skippy_plugin_init_v1(uint32_t host_abi_version,
                                                   skippy_plugin_v1 *out, size_t out_size) {
    if (host_abi_version != SKIPPY_PLUGIN_ABI_VERSION) return SKIPPY_PLUGIN_UNSUPPORTED;
    if (out == NULL || out_size < SKIPPY_PLUGIN_V1_BASE_SIZE) return SKIPPY_PLUGIN_INVALID_ARGUMENT;
    /* Fill what the host has room for: the whole vtable, or its first 80 bytes for a host that
     * predates activate (it then never calls it). */
    size_t size = out_size < sizeof(skippy_plugin_v1) ? SKIPPY_PLUGIN_V1_BASE_SIZE
                                                      : sizeof(skippy_plugin_v1);
    plugin_state *s = calloc(1, sizeof(*s));
    if (s == NULL) return SKIPPY_PLUGIN_ERROR;
    const char *path = getenv("SKIPPY_PLUGIN_RECORD");
    if (path != NULL && *path != '\0') s->record = fopen(path, "a");
    skippy_plugin_v1 vt;
    memset(&vt, 0, sizeof(vt));
    vt.abi_version = SKIPPY_PLUGIN_ABI_VERSION;
    vt.struct_size = (uint32_t)size;
    vt.name = "ngram";
    vt.state = s;
    vt.begin = on_begin;
    vt.commit = on_commit;
    vt.propose = on_propose;
    vt.outcome = on_outcome;
    vt.finish = on_finish;
    vt.abort = on_abort;
    vt.destroy = on_destroy;
    vt.activate = on_activate;
    memcpy(out, &vt, size);
    return SKIPPY_PLUGIN_OK;
}
