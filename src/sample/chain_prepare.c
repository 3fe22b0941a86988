/* chain_prepare.c — the sampler chain's first steps: the copy of the logits (with what later
 * sweeps need to know about them), logit bias and penalties, the effective temperature of the
 * entropy correction, and the raw logits' normalizer. */
#include <math.h>
#include <string.h>

#include "core/status.h"
#include "sample/chain_internal.h"
#include "sample/vexp.h"

/* ---- the chain -------------------------------------------------------------------------- */

/* Copies the logits into x with NaN as -inf, a block at a time: each block's maximum goes to
 * ws->bmax_raw, finite entries are counted, and +inf is only noted (no early exit, so the loop
 * vectorizes). Returns whether some logit is +inf. */
static bool copy_scan(loom__sample_chain_ws *ws, const float *logits, int32_t *n_finite) {
    const int32_t n = ws->n_vocab;
    float *x = ws->x;
    const loom__v8f ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                            -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    loom__v8i any_pinf = {0}, cnt = {0};
    int32_t b = 0;
    for (; (b + 1) * CHAIN_BLOCK <= n; b++) {
        loom__v8f m = ninf;
        for (int32_t i = b * CHAIN_BLOCK; i < (b + 1) * CHAIN_BLOCK; i += 8) {
            loom__v8f v;
            memcpy(&v, logits + i, sizeof v);
            loom__v8i num = v == v;
            any_pinf |= v == -ninf;
            v = (loom__v8f)(((loom__v8i)v & num) | ((loom__v8i)ninf & ~num));
            memcpy(x + i, &v, sizeof v);
            cnt -= v > ninf; /* true is -1 */
            loom__v8i gt = v > m;
            m = (loom__v8f)(((loom__v8i)v & gt) | ((loom__v8i)m & ~gt));
        }
        float r = m[0];
        for (int j = 1; j < 8; j++) r = m[j] > r ? m[j] : r;
        ws->bmax_raw[b] = r;
    }
    bool pinf = false;
    int32_t c = 0;
    for (int j = 0; j < 8; j++) {
        pinf |= any_pinf[j] != 0;
        c += cnt[j];
    }
    if (b * CHAIN_BLOCK < n) { /* the last, partial block */
        float r = -INFINITY;
        for (int32_t i = b * CHAIN_BLOCK; i < n; i++) {
            float v = logits[i];
            pinf |= v == INFINITY;
            x[i] = v != v ? -INFINITY : v;
            c += x[i] > -INFINITY;
            r = x[i] > r ? x[i] : r;
        }
        ws->bmax_raw[b] = r;
    }
    *n_finite = c;
    return pinf;
}

/* One edit of x[t] (bias or penalty): keeps the finite count, and x's block maxima in
 * ws->bmax_x (a copy of bmax_raw made before the first edit) up to date. */
static void edited(loom__sample_chain_ws *ws, loom_token t, bool was_finite, int32_t *n_finite) {
    *n_finite += (ws->x[t] > -INFINITY) - was_finite;
    int32_t b = t / CHAIN_BLOCK, e = (b + 1) * CHAIN_BLOCK;
    ws->bmax_x[b] = loom__chain_block_max(ws->x + (size_t)b * CHAIN_BLOCK,
                                          (e < ws->n_vocab ? e : ws->n_vocab) - b * CHAIN_BLOCK);
}

/* Copies logits, applies bias and penalties; fills *scan and ws->bmax. Returns BAD_INPUT on
 * +inf. */
loom_status loom__chain_prepare(loom__sample_chain_ws *ws, const loom__sample_chain_config *c,
                                const float *logits, const loom_token *hist, int32_t n_hist,
                                bool *modified, loom__chain_scan *scan) {
    const int32_t n = ws->n_vocab;
    float *x = ws->x;
    int32_t n_finite = 0;
    if (copy_scan(ws, logits, &n_finite)) {
        for (int32_t i = 0; i < n; i++)
            LOOM_RETURN_IF(logits[i] == INFINITY, LOOM_ERR_BAD_INPUT,
                           "sample chain: logit %d is +inf", i);
    }
    bool penalize =
        c->penalty_last_n != 0 && n_hist > 0 &&
        (c->repeat_penalty != 1 || c->presence_penalty != 0 || c->frequency_penalty != 0);
    *modified = c->n_bias > 0 || penalize;
    ws->bmax = ws->bmax_raw;
    if (*modified) {
        memcpy(ws->bmax_x, ws->bmax_raw, (size_t)ws->n_blocks * sizeof *ws->bmax_x);
        ws->bmax = ws->bmax_x;
    }
    for (int32_t i = 0; i < c->n_bias; i++) {
        loom_token t = c->bias[i].id;
        bool was = x[t] > -INFINITY;
        x[t] = loom__chain_bias(x[t], c->bias[i].bias);
        edited(ws, t, was, &n_finite);
    }
    if (penalize) {
        int32_t start = 0;
        if (c->penalty_last_n > 0 && n_hist > c->penalty_last_n) start = n_hist - c->penalty_last_n;
        for (int32_t i = start; i < n_hist; i++) ws->counts[hist[i]]++;
        /* Second pass: apply once per distinct token, then reset its count to zero. */
        for (int32_t i = start; i < n_hist; i++) {
            loom_token t = hist[i];
            int32_t cnt = ws->counts[t];
            if (cnt == 0) continue;
            ws->counts[t] = 0;
            bool was = x[t] > -INFINITY;
            x[t] = loom__chain_penalize(x[t], cnt, c);
            edited(ws, t, was, &n_finite);
        }
    }
    /* Only biased or penalized entries can have overflowed to +inf. */
    for (int32_t i = 0; i < c->n_bias; i++) {
        loom_token t = c->bias[i].id;
        LOOM_RETURN_IF(x[t] == INFINITY || isnan(x[t]), LOOM_ERR_BAD_INPUT,
                       "sample chain: logit %d overflows after its bias", t);
    }
    if (penalize) {
        for (int32_t i = 0; i < n_hist; i++) {
            loom_token t = hist[i];
            LOOM_RETURN_IF(x[t] == INFINITY || isnan(x[t]), LOOM_ERR_BAD_INPUT,
                           "sample chain: logit %d overflows after penalties", t);
        }
    }
    scan->n_finite = n_finite;
    scan->xmax = scan->raw_max = -INFINITY;
    for (int32_t b = 0; b < ws->n_blocks; b++) {
        scan->xmax = ws->bmax[b] > scan->xmax ? ws->bmax[b] : scan->xmax;
        scan->raw_max = ws->bmax_raw[b] > scan->raw_max ? ws->bmax_raw[b] : scan->raw_max;
    }
    return LOOM_OK;
}

/* The effective temperature from the mode (0 = greedy). */
double loom__chain_temperature(const loom__sample_chain_config *c, const loom__logit_stats *st) {
    double t0 = c->temperature, h = st->entropy, t;
    if (t0 == 0) return 0;
    switch (c->entropy_mode) {
    case LOOM_ENTROPY_EXP:
        t = t0 * exp((double)c->exp_beta * h);
        break; /* s = e^(-bH) / T0 */
    case LOOM_ENTROPY_EDT: {
        double he = h > c->edt_h_min ? h : (double)c->edt_h_min;
        t = t0 * pow((double)c->edt_n, (double)c->edt_theta / he);
        break;
    }
    case LOOM_ENTROPY_DYNATEMP: {
        double r = st->n_finite > 1 ? h / log((double)st->n_finite) : 0;
        r = r < 0 ? 0 : r > 1 ? 1 : r;
        t = c->dyn_t_min + ((double)c->dyn_t_max - c->dyn_t_min) * pow(r, (double)c->dyn_exponent);
        break;
    }
    default:
        t = t0;
        break;
    }
    /* Below 1e-30 the scale 1/T would push scaled logits toward overflow; the limit is greedy. */
    return t < 1e-30 || !isfinite(t) ? 0 : t;
}

/* log-sum-exp of the raw logits, given the pass over the processed ones: the entries that bias
 * and penalties left alone were summed there (same, relative to st->max); the few they changed
 * (found among the bias ids and the history, each once) are added here. A positive bias large
 * enough to underflow the untouched entries' weights falls back to a full pass. */
double loom__chain_raw_lse(loom__sample_chain_ws *ws, const loom__sample_chain_config *c,
                           const float *logits, const loom_token *hist, int32_t n_hist,
                           const loom__logit_stats *st, double same, float raw_max) {
    if (!(raw_max > -INFINITY)) return INFINITY;
    const double mr = raw_max;
    if (st->max - mr > 500) {
        loom__logit_stats raw;
        loom__logit_stats_compute(logits, ws->n_vocab, 1.0, &raw);
        return raw.max + log(raw.sum);
    }
    double sum = same * exp(st->max - mr);
    const float *x = ws->x;
    int32_t *seen = ws->counts; /* all zero between calls; reset below */
    for (int32_t pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < c->n_bias + n_hist; i++) {
            loom_token t = i < c->n_bias ? c->bias[i].id : hist[i - c->n_bias];
            if (pass == 1) {
                seen[t] = 0;
                continue;
            }
            if (seen[t]) continue;
            seen[t] = 1;
            /* the pass summed x_t where x_t == raw_t; otherwise raw_t is added here */
            if (!(x[t] > -INFINITY && x[t] == logits[t]) && logits[t] > -INFINITY)
                sum += exp((double)logits[t] - mr);
        }
    }
    return mr + log(sum);
}
