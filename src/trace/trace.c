/* trace.c — the trace's record store: create / free / clear / counts (public), the producers'
 * appends and the step timer (trace.h). Output lives in trace_write.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/timer.h"
#include "core/status.h"
#include "trace/trace_impl.h"

/* ---- storage ----------------------------------------------------------------------------- */

/* Makes room for `need` more elements of `elem` bytes in *p (holding *n of *cap). Doubles the
 * capacity so appends cost O(1) amortized; false on overflow or allocation failure (then *p is
 * untouched). */
static bool reserve(void **p, size_t *cap, size_t n, size_t need, size_t elem) {
    size_t want, bytes;
    if (loom__add_overflow_size(n, need, &want)) return false;
    if (want <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < want) {
        if (loom__mul_overflow_size(c, 2, &c)) return false;
    }
    if (loom__mul_overflow_size(c, elem, &bytes)) return false;
    void *grown = loom__realloc(*p, bytes);
    if (!grown) return false;
    *p = grown;
    *cap = c;
    return true;
}

/* The index of name in the dictionary, adding it when new; false when it cannot be added. */
static bool intern(loom_trace *t, const char *name, uint32_t *out) {
    for (size_t i = 0; i < t->n_names; i++) {
        if (strcmp(t->names[i], name) == 0) {
            *out = (uint32_t)i;
            return true;
        }
    }
    if (t->n_names >= UINT32_MAX) return false;
    if (!reserve((void **)&t->names, &t->cap_names, t->n_names, 1, sizeof *t->names)) return false;
    size_t len = strlen(name);
    char *copy = loom__malloc(len + 1);
    if (!copy) return false;
    memcpy(copy, name, len + 1);
    t->names[t->n_names] = copy;
    *out = (uint32_t)t->n_names++;
    return true;
}

/* ---- public: lifetime and counts --------------------------------------------------------- */

loom_status loom_trace_create(loom_trace **out) {
    loom__clear_error();
    LOOM_CHECK_ARG(out != NULL);
    loom_trace *t = loom__calloc(1, sizeof *t);
    LOOM_RETURN_IF(!t, LOOM_ERR_OUT_OF_MEMORY, "trace: out of memory");
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        free(t);
        return loom__fail(LOOM_ERR_INTERNAL, "trace: cannot create its mutex");
    }
    *out = t;
    return LOOM_OK;
}

void loom_trace_free(loom_trace *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_names; i++) free(t->names[i]);
    free(t->names);
    free(t->steps);
    free(t->phases);
    free(t->tokens);
    free(t->bytes);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

void loom_trace_clear(loom_trace *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->n_steps = t->n_phases = t->n_tokens = t->n_bytes = 0;
    t->dropped = 0;
    t->clears++;
    pthread_mutex_unlock(&t->mu);
}

size_t loom_trace_count(const loom_trace *t) {
    if (!t) return 0;
    pthread_mutex_lock(loom__trace_mu(t));
    size_t n = t->n_tokens;
    pthread_mutex_unlock(loom__trace_mu(t));
    return n;
}

loom_status loom_trace_get_info(const loom_trace *t, loom_trace_info *out) {
    loom__clear_error();
    LOOM_CHECK_ARG(t != NULL && out != NULL);
    loom_trace_info info = {.size = sizeof info};
    pthread_mutex_lock(loom__trace_mu(t));
    info.n_steps = t->n_steps;
    info.n_tokens = t->n_tokens;
    info.n_dropped = t->dropped;
    pthread_mutex_unlock(loom__trace_mu(t));
    return loom__abi_result_out(out, &info, sizeof info, LOOM__ABI_END(loom_trace_info, n_dropped),
                                "trace_info");
}

/* ---- producers --------------------------------------------------------------------------- */

static loom_status check_step(const loom__trace_step *s) {
    LOOM_RETURN_IF(s->n_phases < 1 || s->n_phases > LOOM__TRACE_MAX_PHASES || !s->phases,
                   LOOM_ERR_INVALID_ARG, "trace: step %lld has %d phases (1..%d allowed)",
                   (long long)s->step, s->n_phases, LOOM__TRACE_MAX_PHASES);
    int64_t at = s->start_ns;
    for (int32_t i = 0; i < s->n_phases; i++) {
        const loom__trace_phase *p = &s->phases[i];
        LOOM_RETURN_IF(!p->name || !p->name[0], LOOM_ERR_INVALID_ARG,
                       "trace: step %lld: phase %d has no name", (long long)s->step, i);
        LOOM_RETURN_IF(p->start_ns != at || p->end_ns < p->start_ns, LOOM_ERR_INVALID_ARG,
                       "trace: step %lld: phase '%s' [%lld, %lld] does not continue at %lld",
                       (long long)s->step, p->name, (long long)p->start_ns, (long long)p->end_ns,
                       (long long)at);
        at = p->end_ns;
    }
    LOOM_RETURN_IF(at != s->end_ns, LOOM_ERR_INVALID_ARG,
                   "trace: step %lld: phases end at %lld, the step at %lld", (long long)s->step,
                   (long long)at, (long long)s->end_ns);
    return LOOM_OK;
}

static loom_status dropped(loom_trace *t, const char *what) {
    t->dropped++;
    pthread_mutex_unlock(&t->mu);
    return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "trace: out of memory; a %s record was dropped",
                      what);
}

loom_status loom__trace_add_step(loom_trace *t, const loom__trace_step *s) {
    LOOM_CHECK_ARG(t != NULL && s != NULL);
    LOOM_TRY(check_step(s));
    uint32_t ids[LOOM__TRACE_MAX_PHASES];
    pthread_mutex_lock(&t->mu);
    for (int32_t i = 0; i < s->n_phases; i++) {
        if (!intern(t, s->phases[i].name, &ids[i])) return dropped(t, "step");
    }
    size_t np = (size_t)s->n_phases;
    if (!reserve((void **)&t->steps, &t->cap_steps, t->n_steps, 1, sizeof *t->steps) ||
        !reserve((void **)&t->phases, &t->cap_phases, t->n_phases, np, sizeof *t->phases))
        return dropped(t, "step");
    for (size_t i = 0; i < np; i++) {
        t->phases[t->n_phases + i] = (loom__trace_phase_rec){
            .start_ns = s->phases[i].start_ns, .end_ns = s->phases[i].end_ns, .name = ids[i]};
    }
    t->steps[t->n_steps++] = (loom__trace_step_rec){
        .step = s->step,
        .start_ns = s->start_ns,
        .end_ns = s->end_ns,
        .n_seqs = s->n_seqs,
        .n_tokens = s->n_tokens,
        .first_phase = t->n_phases,
        .n_phases = s->n_phases,
    };
    t->n_phases += np;
    pthread_mutex_unlock(&t->mu);
    return LOOM_OK;
}

loom_status loom__trace_add_token(loom_trace *t, const loom__trace_token *k) {
    LOOM_CHECK_ARG(t != NULL && k != NULL && (k->piece != NULL || k->piece_len == 0));
    pthread_mutex_lock(&t->mu);
    if (!reserve((void **)&t->tokens, &t->cap_tokens, t->n_tokens, 1, sizeof *t->tokens) ||
        !reserve((void **)&t->bytes, &t->cap_bytes, t->n_bytes, k->piece_len, 1))
        return dropped(t, "token");
    if (k->piece_len > 0) memcpy(t->bytes + t->n_bytes, k->piece, k->piece_len);
    t->tokens[t->n_tokens++] = (loom__trace_token_rec){
        .request = k->request,
        .step = k->step,
        .t_ns = k->t_ns,
        .since_arrival_ns = k->since_arrival_ns,
        .piece_off = t->n_bytes,
        .piece_len = k->piece_len,
        .sample = k->sample,
        .pos = k->pos,
        .token = k->token,
        .logprob_raw = k->logprob_raw,
        .logprob_final = k->logprob_final,
        .entropy = k->entropy,
        .entropy_final = k->entropy_final,
        .varentropy = k->varentropy,
        .temperature = k->temperature,
    };
    t->n_bytes += k->piece_len;
    pthread_mutex_unlock(&t->mu);
    return LOOM_OK;
}

/* ---- step timer -------------------------------------------------------------------------- */

void loom__trace_step_begin(loom__trace_timer *tm, int64_t step, int64_t now_ns) {
    tm->step = step;
    tm->start_ns = tm->mark_ns = now_ns;
    tm->n_phases = 0;
}

void loom__trace_step_phase(loom__trace_timer *tm, const char *name, int64_t now_ns) {
    if (now_ns < tm->mark_ns) now_ns = tm->mark_ns;
    if (tm->n_phases == LOOM__TRACE_MAX_PHASES) {
        loom__trace_phase *last = &tm->phases[LOOM__TRACE_MAX_PHASES - 1];
        last->name = "other";
        last->end_ns = now_ns;
    } else {
        tm->phases[tm->n_phases++] = (loom__trace_phase){name, tm->mark_ns, now_ns};
    }
    tm->mark_ns = now_ns;
}

loom_status loom__trace_step_end(loom_trace *t, loom__trace_timer *tm, const char *name,
                                 int64_t now_ns, int32_t n_seqs, int32_t n_tokens) {
    loom__trace_step_phase(tm, name, now_ns);
    if (!t) return LOOM_OK;
    loom__trace_step s = {
        .step = tm->step,
        .start_ns = tm->start_ns,
        .end_ns = tm->mark_ns,
        .n_seqs = n_seqs,
        .n_tokens = n_tokens,
        .phases = tm->phases,
        .n_phases = tm->n_phases,
    };
    return loom__trace_add_step(t, &s);
}

/* ---- forward-pass layer groups ------------------------------------------------------------ */

void loom__trace_layers_init(loom__trace_layers *ln, int32_t n_layer) {
    memset(ln, 0, sizeof *ln);
    if (n_layer < 1) n_layer = 1;
    ln->every = (n_layer + LOOM__TRACE_LAYER_GROUPS - 1) / LOOM__TRACE_LAYER_GROUPS;
    ln->n_groups = (n_layer + ln->every - 1) / ln->every; /* <= LOOM__TRACE_LAYER_GROUPS */
    for (int32_t g = 0; g < ln->n_groups; g++) {
        int32_t first = g * ln->every;
        int32_t last = first + ln->every - 1 < n_layer - 1 ? first + ln->every - 1 : n_layer - 1;
        snprintf(ln->names[g], sizeof ln->names[g], "forward.layers %d-%d", (int)first, (int)last);
    }
}

void loom__trace_on_layers(void *user, int32_t first_layer, int32_t last_layer) {
    (void)last_layer;
    const loom__trace_layer_hook *h = user;
    int32_t g = first_layer / h->layers->every;
    if (g < 0) g = 0;
    if (g >= h->layers->n_groups) g = h->layers->n_groups - 1;
    loom__trace_step_phase(h->tm, h->layers->names[g], loom__now_ns());
}
