/* sample.c — the minimal sampler: greedy, or top-k → top-p → temperature → a draw from a
 * counter-based RNG. The order follows llama.cpp's default chain (filters on the model's own
 * distribution, temperature last), so the same settings mean the same thing in both. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "sample/rng.h"

loom_sampler_params loom_sampler_default_params(void) {
    loom_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.seed = 0x5EED;
    return p;
}

typedef struct cand {
    float logit;
    int32_t id;
} cand;

/* Higher logit first; equal logits: lower id first (a total order, so results never depend on
 * the sort's stability). */
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Min-heap on (logit, then reversed id) holding the k best candidates seen so far. */
static bool worse(const cand *a, const cand *b) { return cand_cmp(a, b) > 0; }

static void heap_sift_down(cand *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(&h[l], &h[m])) m = l;
        if (r < n && worse(&h[r], &h[m])) m = r;
        if (m == i) return;
        cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Keeps the k best finite logits in c (sorted best first); returns how many were kept. */
static int32_t select_top_k(const float *logits, int32_t n, int32_t k, cand *c) {
    int32_t held = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!(logits[i] > -INFINITY)) continue; /* skips -inf and NaN */
        cand x = {logits[i], i};
        if (held < k) {
            c[held++] = x;
            if (held == k) {
                for (int32_t j = k / 2 - 1; j >= 0; j--) heap_sift_down(c, k, j);
            }
        } else if (worse(&c[0], &x)) {
            c[0] = x;
            heap_sift_down(c, k, 0);
        }
    }
    qsort(c, (size_t)held, sizeof *c, cand_cmp);
    return held;
}

static loom_token arg_max(const float *logits, int32_t n) {
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++) {
        if (!(logits[i] > -INFINITY)) continue;
        if (best < 0 || logits[i] > logits[best]) best = i;
    }
    return best;
}

loom_status loom_sample(const float *logits, int32_t n_vocab, const loom_sampler_params *p,
                        uint64_t draw_index, loom_token *out) {
    loom__clear_error();
    LOOM_CHECK_ARG(logits != NULL && p != NULL && out != NULL && n_vocab > 0);
    LOOM_RETURN_IF(!(p->temperature >= 0) || !isfinite(p->temperature), LOOM_ERR_INVALID_ARG,
                   "sample: temperature %g must be finite and >= 0", (double)p->temperature);
    LOOM_RETURN_IF(!(p->top_p > 0 && p->top_p <= 1), LOOM_ERR_INVALID_ARG,
                   "sample: top_p %g must be in (0, 1]", (double)p->top_p);

    loom_token best = arg_max(logits, n_vocab);
    LOOM_RETURN_IF(best < 0, LOOM_ERR_BAD_INPUT, "sample: no finite logit among %d", n_vocab);
    if (p->temperature == 0 || p->top_k == 1) {
        *out = best;
        return LOOM_OK;
    }

    int32_t k = p->top_k > 0 && p->top_k < n_vocab ? p->top_k : n_vocab;
    cand *c = malloc((size_t)k * sizeof *c);
    LOOM_RETURN_IF(!c, LOOM_ERR_OUT_OF_MEMORY, "sample: out of memory");
    int32_t n = select_top_k(logits, n_vocab, k, c);

    /* Probabilities at temperature 1 for top-p, then the kept set re-weighted at temperature. */
    double sum = 0;
    double *w = malloc((size_t)n * sizeof *w);
    if (!w) {
        free(c);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "sample: out of memory");
    }
    for (int32_t i = 0; i < n; i++) sum += (w[i] = exp((double)c[i].logit - c[0].logit));
    int32_t keep = n;
    if (p->top_p < 1) {
        double cum = 0;
        for (int32_t i = 0; i < n; i++) {
            cum += w[i] / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    double total = 0;
    for (int32_t i = 0; i < keep; i++) {
        total += (w[i] = exp(((double)c[i].logit - c[0].logit) / p->temperature));
    }
    double u = loom__rng_uniform(p->seed, draw_index) * total;
    loom_token chosen = c[keep - 1].id;
    for (int32_t i = 0; i < keep; i++) {
        if (u < w[i]) {
            chosen = c[i].id;
            break;
        }
        u -= w[i];
    }
    free(w);
    free(c);
    *out = chosen;
    return LOOM_OK;
}
