/* chain_internal.h — what the sampler chain's files share: the workspace's layout, the
 * candidate types, and the steps each file implements (chain.c runs them in order, see
 * chain.h): chain_select.c (partial selection and the vocabulary sweeps' vector helpers),
 * chain_prepare.c (copy, bias, penalties, the entropy-corrected temperature, the raw
 * normalizer), chain_filter.c (top-k, top-p, min-p, typical-p). Nothing outside these files
 * includes it. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "sample/chain.h"
#include "sample/entropy.h"

typedef struct loom__chain_cand {
    float x; /* logit after bias and penalties (unscaled) */
    loom_token id;
} loom__chain_cand;

typedef struct loom__chain_key { /* typical-p sort key */
    double key;                  /* |surprisal - H| */
    float x;
    loom_token id;
} loom__chain_key;

struct loom__sample_chain_ws {
    int32_t n_vocab;
    float *x;               /* [n_vocab] logits after bias and penalties */
    loom__chain_cand *cand; /* [n_vocab] candidates (also the raw top-n heap before filtering) */
    void *aux;         /* [n_vocab] loom__chain_key, or loom__chain_cand for the final top-n heap */
    int32_t *counts;   /* [n_vocab] penalty counts; all zero between calls */
    float *bmax_raw;   /* [n_blocks] largest finite raw logit of each CHAIN_BLOCK entries */
    float *bmax_x;     /* [n_blocks] the same of x where bias or penalties edited it */
    const float *bmax; /* this call's block maxima of x: bmax_raw, or bmax_x after edits */
    int32_t n_blocks;
};

#define CHAIN_BLOCK 64 /* entries per block of the vocabulary sweeps (below) */

/* What the copy of the logits learned, so that no later sweep has to look for it again. */
typedef struct loom__chain_scan {
    float xmax;       /* largest finite x (-inf when none) */
    int32_t n_finite; /* finite entries of x */
    float raw_max;    /* largest finite raw logit (-inf when none) */
} loom__chain_scan;

/* A key whose ascending unsigned order is the descending order of the logit (-0 and +0
 * equal, as loom__chain_cand_cmp holds them). */
static inline uint32_t loom__chain_desc_key(float x) {
    float f = x + 0.0f; /* -0 becomes +0 */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u ^= (u >> 31) ? 0xFFFFFFFFu : 0x80000000u; /* ascending as unsigned */
    return ~u;
}

/* The chain's edits of one logit (step 1, a bias entry; step 2, a penalized token seen cnt
 * times in the window), in the float arithmetic every copy of them must share: the chain's
 * own (chain_prepare.c) and the summarizer's (summary.c), which a device reproduces. */
static inline float loom__chain_bias(float x, float bias) {
    return x + bias;
}
static inline float loom__chain_penalize(float x, int32_t cnt, const loom__sample_chain_config *c) {
    x = x > 0 ? x / c->repeat_penalty : x * c->repeat_penalty;
    return x - (c->presence_penalty + (float)cnt * c->frequency_penalty);
}

/* ---- chain_select.c ---- */

/* Higher logit first; equal logits: lower id first (a total order; qsort's signature). */
int loom__chain_cand_cmp(const void *a, const void *b);
/* typical-p's order: closest surprisal first, then cand_cmp's. */
int loom__chain_key_cmp(const void *a, const void *b);
/* Offers v to a heap of the k best (h[0] the worst of them), *held entries so far. */
void loom__chain_heap_offer(loom__chain_cand *h, int32_t *held, int32_t k, loom__chain_cand v);
/* Largest finite entry of x[0..n) (-inf when none), n <= CHAIN_BLOCK. */
float loom__chain_block_max(const float *x, int32_t n);
/* w[i] = e^(s (cd[i].x - xmax)) for the candidates cd[0..n) (all finite). */
void loom__chain_exp_cands(const loom__chain_cand *cd, int32_t n, double s, double xmax, double *w);
/* The k best finite entries of x[0..n) into h, best first; returns how many (bmax: the
 * maximum of each CHAIN_BLOCK entries of x). */
int32_t loom__chain_select_best(const float *x, const float *bmax, int32_t n, int32_t k,
                                loom__chain_cand *h);
/* Sorts cd[0..n), arriving in increasing id order, best first; tmp holds n entries. */
void loom__chain_sort_cands(loom__chain_cand *cd, int32_t n, loom__chain_cand *tmp);

/* ---- chain_prepare.c ---- */

/* Copies logits into ws->x with NaN as -inf, applies bias and penalties; fills *scan and
 * ws->bmax; *modified tells whether bias or penalties changed anything. BAD_INPUT on +inf. */
loom_status loom__chain_prepare(loom__sample_chain_ws *ws, const loom__sample_chain_config *c,
                                const float *logits, const loom_token *hist, int32_t n_hist,
                                bool *modified, loom__chain_scan *scan);
/* The effective temperature from the entropy mode (0 = greedy). */
double loom__chain_temperature(const loom__sample_chain_config *c, const loom__logit_stats *st);
/* log-sum-exp of the raw logits after the pass over the processed ones (see the definition). */
double loom__chain_raw_lse(loom__sample_chain_ws *ws, const loom__sample_chain_config *c,
                           const float *logits, const loom_token *hist, int32_t n_hist,
                           const loom__logit_stats *st, double same, float raw_max);

/* ---- chain_filter.c ---- */

/* Steps 5-8 on the scaled distribution w = exp(s (x - xmax)); leaves survivors in ws->cand and
 * returns their count; *by_prob says whether they are sorted best first. */
int32_t loom__chain_filter(loom__sample_chain_ws *ws, const loom__sample_chain_config *c, double s,
                           const loom__logit_stats *st, bool *by_prob);
/* Steps 6-8 after the first selection left n candidates in ws->cand (best first when *by_prob,
 * their weights summing to z then): what loom__chain_filter does after its top-k, shared with
 * the run over a row's summary. */
int32_t loom__chain_filter_rest(loom__sample_chain_ws *ws, const loom__sample_chain_config *c,
                                double s, double xmax, int32_t n, double z, bool *by_prob);
