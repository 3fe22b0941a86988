/* engine_generate.c — loom_engine_generate: one request submitted and stepped to its end on the
 * calling thread, its text and tokens collected into a library-allocated loom_generation. The
 * steps are ordinary engine steps: other queued requests run beside it and their events go to
 * the caller's callback. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "engine/engine.h"

/* The output being collected; grown geometrically (a generation's length is not known ahead:
 * stop strings and end-of-generation tokens end it early). */
typedef struct collect {
    char *text;
    size_t text_len, text_cap;
    loom_token *tokens;
    size_t n_tokens, tokens_cap;
} collect;

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64, bytes;
    while (c < need) {
        if (loom__mul_overflow_size(c, 2, &c)) return false;
    }
    if (loom__mul_overflow_size(c, elem, &bytes)) return false;
    void *q = loom__realloc(*p, bytes);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* Appends a TOKEN event of the request; false when memory runs out. */
static bool collect_token(collect *c, const loom_event *ev) {
    size_t need;
    if (loom__add_overflow_size(c->text_len, ev->text_len, &need) ||
        loom__add_overflow_size(need, 1, &need)) /* room for the final NUL */
        return false;
    if (!grow((void **)&c->text, &c->text_cap, need, 1) ||
        !grow((void **)&c->tokens, &c->tokens_cap, c->n_tokens + 1, sizeof *c->tokens))
        return false;
    if (ev->text_len > 0) memcpy(c->text + c->text_len, ev->text, ev->text_len);
    c->text_len += ev->text_len;
    c->tokens[c->n_tokens++] = ev->token;
    return true;
}

void loom_generation_free(loom_generation *g) {
    if (!g) return;
    free(g->text);
    free(g->tokens);
    free(g);
}

/* Builds the result from what was collected (taking its arrays). */
static loom_status finish(collect *c, loom_request_id id, const loom_event *ev,
                          loom_generation **out) {
    loom_generation *g = loom__calloc(1, sizeof *g);
    LOOM_RETURN_IF(!g, LOOM_ERR_OUT_OF_MEMORY, "engine_generate: out of memory");
    if (!c->text && !grow((void **)&c->text, &c->text_cap, 1, 1)) {
        free(g);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "engine_generate: out of memory");
    }
    c->text[c->text_len] = '\0';
    g->id = id;
    g->text = c->text;
    g->text_len = c->text_len;
    g->tokens = c->tokens; /* NULL when no token was produced (n_tokens 0) */
    g->n_tokens = c->n_tokens;
    g->reason = ev->reason;
    g->cached_tokens = ev->cached_tokens;
    c->text = NULL;
    c->tokens = NULL;
    *out = g;
    return LOOM_OK;
}

loom_status loom_engine_generate(loom_engine *e, const loom_request_params *req,
                                 loom_event_fn on_event, void *user_data, loom_generation **out) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL && req != NULL && out != NULL);
    LOOM_RETURN_IF(e->has_thread, LOOM_ERR_BUSY,
                   "engine_generate: the engine steps on its own thread (background mode)");
    loom_request_params p;
    loom_sampler_params sampler;
    LOOM_TRY(loom__request_params_in(req, &p, &sampler));
    LOOM_RETURN_IF(p.n != 1, LOOM_ERR_INVALID_ARG,
                   "engine_generate: n = %d; it returns one sample (submit n > 1 with "
                   "loom_engine_submit and step)",
                   p.n);
    loom_request_id id = 0;
    LOOM_TRY(loom_engine_submit(e, &p, &id));

    collect c = {0};
    loom_status st = LOOM_OK;
    const loom_event *end = NULL; /* the request's FINISHED or FAILED event */
    while (!end && st == LOOM_OK) {
        st = loom__engine_step(e);
        if (st != LOOM_OK) break;
        for (size_t k = 0; k < e->n_events; k++) {
            const loom_event *ev = &e->events[k];
            if (on_event) on_event(ev, user_data);
            if (ev->id != id || st != LOOM_OK) continue;
            if (ev->kind == LOOM_EVENT_TOKEN) {
                if (!collect_token(&c, ev))
                    st = loom__fail(LOOM_ERR_OUT_OF_MEMORY,
                                    "engine_generate: out of memory for the output of request "
                                    "%llu",
                                    (unsigned long long)id);
            } else if (!end) {
                end = ev; /* the rest of the step's events still go to on_event */
            }
        }
        /* A request the engine has forgotten without an event would loop forever. */
        if (!end && st == LOOM_OK && !loom_engine_has_work(e))
            st = loom__fail(LOOM_ERR_INTERNAL, "engine_generate: request %llu vanished",
                            (unsigned long long)id);
    }
    if (st == LOOM_OK && end->kind == LOOM_EVENT_FAILED) {
        /* The step's own message, if it left one, most likely says why (it ran here). */
        char why[512];
        snprintf(why, sizeof why, "%s", loom_last_error());
        st = loom__fail(end->status, "engine_generate: request %llu failed: %s%s%s",
                        (unsigned long long)id, loom_status_str(end->status),
                        why[0] ? "; the step reported: " : "", why);
    } else if (st == LOOM_OK) {
        st = finish(&c, id, end, out);
    } else if (!end) {
        /* Not finished: stop it (it ends at the next step), keeping this error's message. */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", loom_last_error());
        (void)loom_engine_cancel(e, id);
        (void)loom__fail(st, "%s", msg);
    }
    free(c.text);
    free(c.tokens);
    return st;
}
