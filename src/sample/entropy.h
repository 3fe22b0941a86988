/* entropy.h — one streaming pass over a logit vector that yields its maximum, the normalizer
 * (sum of exponentials) and the Shannon entropy and varentropy of its softmax, in float64.
 * Internal to the sampler chain (src/sample/chain.c). */
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

/* One pass over x[0..n) (online max / sum / first and second moments of the surprisal, each
 * rescaled when the running maximum grows, so no exp ever overflows), scale > 0.
 * No allocation; thread-safe. */
void loom__logit_stats_compute(const float *x, int32_t n, double scale, loom__logit_stats *out);
