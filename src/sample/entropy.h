/* entropy.h — one pass over a logit vector (after a cheap sweep for its maximum) that yields
 * its maximum, the normalizer (sum of exponentials) and the Shannon entropy and varentropy of
 * its softmax, in float64. Internal to the sampler chain (src/sample/chain.c). */
#pragma once

#include <stdint.h>

/* Statistics of p = softmax(scale * x) over the finite entries of x. -inf and NaN entries
 * have probability 0 and are skipped; callers reject +inf before calling. */
typedef struct loom__logit_stats {
    double max;        /* max of scale * x over finite entries; -inf when none */
    double sum;        /* sum of exp(scale * x_i - max) (>= 1 when n_finite > 0) */
    double entropy;    /* H = -sum p_i ln p_i, nats, >= 0 */
    double varentropy; /* sum p_i (ln p_i + H)^2, nats^2, >= 0 */
    int32_t n_finite;  /* number of entries with probability > 0 (before underflow) */
    int32_t argmax;    /* lowest index attaining max; -1 when none */
} loom__logit_stats;

/* Statistics of x[0..n) with scale > 0: a sweep for the maximum, then one pass summing the
 * exponentials and the first and second moments of the surprisal relative to it (so no exp
 * overflows). No allocation; thread-safe. */
void loom__logit_stats_compute(const float *x, int32_t n, double scale, loom__logit_stats *out);

/* The same at scale 1 when the caller already knows x's largest finite entry xmax and the
 * number of finite entries n_finite (the chain finds them while it copies the logits), so only
 * the summing pass runs. With raw (may be NULL), x being raw[0..n) after a few edits (bias,
 * penalties): also *sum_same = the sum of e^(x_i - out->max) over the finite x_i equal to
 * raw_i, from which the caller gets raw's normalizer by adding the edited entries alone,
 * without a second pass over the vocabulary. */
void loom__logit_stats_known(const float *x, const float *raw, int32_t n, float xmax,
                             int32_t n_finite, loom__logit_stats *out, double *sum_same);
