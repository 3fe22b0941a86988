/* chain_filter.c — the sampler chain's filters: top-k, top-p (with top-k, or over the whole
 * vocabulary by bucketing its weights), min-p and typical-p. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/chain_internal.h"
#include "sample/vexp.h"

/* ---- top-p without top-k ----------------------------------------------------------------- */
/* The nucleus (the shortest best-first prefix of the tokens with mass >= top_p) without
 * sorting the vocabulary: one pass sums the normalizer z of the weights w = e^d,
 * d = s (x - xmax), and puts the weight of each token that can be in a nucleus into one of
 * CHAIN_BUCKETS buckets of equal width in d over [-CHAIN_SPAN, 0], best first; the bucket
 * where the running mass reaches top_p z is the only one sorted. A token can be in a nucleus
 * only if d >= cut = ln((1 - top_p) / n_finite): all tokens below weigh at most 1 - top_p in
 * total, and z >= 1 (the maximum weighs 1), so the better ones already hold top_p z. The cut
 * is above -CHAIN_SPAN for any top_p < 1 as a float and up to 2^31 tokens. Tokens below it
 * count in z only; most vectors of a peaked distribution have none above it and skip the
 * bucket bookkeeping. */

#define CHAIN_BUCKETS 4096
#define CHAIN_SPAN    40.0

/* d and bucket of LOOM__VL entries x[0..LOOM__VL): *dz and *keep as loom__vexp_split gives
 * them, *in where d >= cut, *bucket valid there. One definition for every use, so they
 * bucket each token the same way. */
static inline void bucket_lanes(const float *x, double s, double xmax, double cut, loom__vd *dz,
                                loom__vl *keep, loom__vl *in, loom__vi *bucket) {
    loom__vf v;
    memcpy(&v, x, sizeof v);
    const loom__vd d = (__builtin_convertvector(v, loom__vd) - xmax) * s; /* -inf stays */
    loom__vexp_split(&d, dz, keep);
    *in = d >= cut;
    const loom__vd scaled = *dz * (-CHAIN_BUCKETS / CHAIN_SPAN); /* in [0, CHAIN_BUCKETS] */
    loom__vi bi = __builtin_convertvector(scaled, loom__vi);
    const loom__vi top = (loom__vi){0} + (CHAIN_BUCKETS - 1);
    const loom__vi over = bi > top;
    *bucket = (bi & ~over) | (top & over);
}

/* The bucket of one logit, by bucket_lanes' arithmetic (CHAIN_BUCKETS + 1 below the cut). */
static int32_t bucket_of(float v, double s, double xmax, double cut) {
    float lanes[LOOM__VL];
    for (int j = 0; j < LOOM__VL; j++) lanes[j] = v;
    loom__vd dz;
    loom__vl keep, in;
    loom__vi bucket;
    bucket_lanes(lanes, s, xmax, cut, &dz, &keep, &in, &bucket);
    return in[0] ? bucket[0] : CHAIN_BUCKETS + 1;
}

/* The lowest finite float whose bucket is <= last (+inf when last < 0: no finite logit; the
 * maximum's bucket is 0, and buckets grow as x falls): a bisection over the floats in
 * [-FLT_MAX, xmax], ordered by loom__chain_desc_key. */
static float lowest_in(double s, double xmax, double cut, int32_t last) {
    if (last < 0) return INFINITY;
    uint32_t good = loom__chain_desc_key((float)xmax),
             bad = loom__chain_desc_key(-FLT_MAX); /* good: in; bad: maybe */
    if (bucket_of(-FLT_MAX, s, xmax, cut) <= last) return -FLT_MAX;
    while (bad - good > 1) {
        uint32_t mid = good + (bad - good) / 2;
        uint32_t u = ~mid; /* back from the key to the float */
        u ^= (u >> 31) ? 0x80000000u : 0xFFFFFFFFu;
        float f;
        memcpy(&f, &u, sizeof f);
        if (bucket_of(f, s, xmax, cut) <= last) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    uint32_t u = ~good;
    u ^= (u >> 31) ? 0x80000000u : 0xFFFFFFFFu;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Keeps the nucleus of top_p in ws->cand (tokens of the buckets before the edge in id order,
 * then the edge bucket's in rank order); returns its size. */
static int32_t nucleus(loom__sample_chain_ws *ws, double s, double xmax, double top_p,
                       int32_t n_finite) {
    enum { L = LOOM__VL };
    const int32_t nv = ws->n_vocab;
    const float *x = ws->x;
    double cut = log((1.0 - top_p) / n_finite);
    cut = cut > -CHAIN_SPAN ? cut : -CHAIN_SPAN;
    /* Lanes below the cut go, without a branch, to a spare bucket of their own, so that
     * neither a mispredicted jump nor a chain of additions to one address slows the pass. */
    double mass[CHAIN_BUCKETS + L] = {0};
    loom__vd zl[2] = {{0}, {0}};
    for (int32_t i = 0; i < nv; i += 2 * L) { /* two vectors a step, for overlap */
        float pad[2 * L];
        const float *p = x + i;
        if (nv - i < 2 * L) { /* the tail, padded with -inf */
            for (int j = 0; j < 2 * L; j++) pad[j] = i + j < nv ? x[i + j] : -INFINITY;
            p = pad;
        }
        for (int h = 0; h < 2; h++) {
            loom__vd dz, e;
            loom__vl keep, in;
            loom__vi bucket;
            bucket_lanes(p + h * L, s, xmax, cut, &dz, &keep, &in, &bucket);
            loom__vexp(&e, &dz, &keep);
            zl[h] += e;
            int64_t any = 0;
            for (int j = 0; j < L; j++) any |= in[j];
            if (!any) continue;
            for (int j = 0; j < L; j++) mass[in[j] ? bucket[j] : CHAIN_BUCKETS + j] += e[j];
        }
    }
    double z = 0;
    for (int j = 0; j < L; j++) z += zl[0][j] + zl[1][j];
    const double target = top_p * z;
    double cum = 0;
    int32_t edge = 0;
    while (edge < CHAIN_BUCKETS && cum + mass[edge] < target) cum += mass[edge++];

    /* Gather: better buckets into cand, the edge bucket aside. As the bucket is monotone in
     * x, "bucket < edge" and "bucket <= edge" are x >= two float thresholds (found once by
     * bisection with the same arithmetic), and blocks whose maximum is below both hold
     * nothing. */
    loom__chain_cand *cd = ws->cand, *side = ws->aux, *tmp = side + nv;
    int32_t n = 0, m = 0;
    const float f_in = edge == CHAIN_BUCKETS ? -FLT_MAX : lowest_in(s, xmax, cut, edge - 1);
    const float f_edge = edge == CHAIN_BUCKETS ? -FLT_MAX : lowest_in(s, xmax, cut, edge);
    for (int32_t b = 0; b < ws->n_blocks; b++) {
        if (!(ws->bmax[b] >= f_edge)) continue;
        int32_t e = (b + 1) * CHAIN_BLOCK < nv ? (b + 1) * CHAIN_BLOCK : nv;
        for (int32_t k = b * CHAIN_BLOCK; k < e; k++) {
            const float v = x[k];
            if (v >= f_in) {
                cd[n++] = (loom__chain_cand){v, k};
            } else if (v >= f_edge) {
                side[m++] = (loom__chain_cand){v, k};
            }
        }
    }
    if (m > 0) { /* the edge bucket, best first, up to where the mass reaches the target */
        loom__chain_sort_cands(side, m, tmp);
        for (int32_t k = 0; k < m; k += 8) {
            double w[8];
            int32_t r = m - k < 8 ? m - k : 8, j = 0;
            loom__chain_exp_cands(side + k, r, s, xmax, w);
            while (j < r && (cum += w[j]) < target) j++;
            if (j < r) {
                m = k + j + 1;
                break;
            }
        }
        memcpy(cd + n, side, (size_t)m * sizeof *cd);
        n += m;
    }
    return n;
}

/* Steps 5-8 on the scaled distribution w = exp(s (x - xmax)); leaves survivors in ws->cand and
 * returns their count; *by_prob says whether they are sorted best first. */
int32_t loom__chain_filter(loom__sample_chain_ws *ws, const loom__sample_chain_config *c, double s,
                           const loom__logit_stats *st, bool *by_prob) {
    const int32_t nv = ws->n_vocab;
    const float *x = ws->x;
    loom__chain_cand *cd = ws->cand;
    const double xmax = st->max;
    int32_t n = 0;
    double z = 0; /* mass of the set top-p is measured against */
    *by_prob = false;

    if (c->top_k > 0 && c->top_k < st->n_finite) { /* 5. top-k: k-entry heap */
        n = loom__chain_select_best(x, ws->bmax, nv, c->top_k, cd);
        double *w = ws->aux;
        loom__chain_exp_cands(cd, n, s, xmax, w);
        for (int32_t i = 0; i < n; i++) z += w[i];
        *by_prob = true;
    } else if (c->top_p < 1) { /* 6. top-p over the whole vocabulary */
        n = nucleus(ws, s, xmax, (double)c->top_p, st->n_finite);
    } else { /* gather, dropping what min-p can never keep */
        double log_w = -INFINITY;
        if (c->min_p > 0) log_w = log((double)c->min_p);
        /* Blocks whose maximum fails the cut hold no survivor (the test is monotone in x). */
        for (int32_t b = 0; b < nv; b += CHAIN_BLOCK) {
            int32_t e = nv - b < CHAIN_BLOCK ? nv : b + CHAIN_BLOCK;
            float bm = ws->bmax[b / CHAIN_BLOCK];
            if (!(bm > -INFINITY) || !(s * ((double)bm - xmax) >= log_w)) continue;
            for (int32_t i = b; i < e; i++) {
                if (!(x[i] > -INFINITY)) continue;
                if (s * ((double)x[i] - xmax) >= log_w) cd[n++] = (loom__chain_cand){x[i], i};
            }
        }
    }
    return loom__chain_filter_rest(ws, c, s, xmax, n, z, by_prob);
}

int32_t loom__chain_filter_rest(loom__sample_chain_ws *ws, const loom__sample_chain_config *c,
                                double s, double xmax, int32_t n, double z, bool *by_prob) {
    loom__chain_cand *cd = ws->cand;
    if (c->top_p < 1 && *by_prob) { /* 6. top-p after top-k: the shortest best-first prefix with
                                       mass >= top_p */
        double cum = 0, target = (double)c->top_p * z;
        for (int32_t i = 0; i < n; i += 8) { /* eight exponentials at a time, summed in order */
            double w[8];
            int32_t m = n - i < 8 ? n - i : 8;
            loom__chain_exp_cands(cd + i, m, s, xmax, w);
            int32_t j = 0;
            while (j < m && (cum += w[j]) < target) j++;
            if (j < m) {
                n = i + j + 1;
                break;
            }
        }
    }
    if (c->min_p > 0) { /* 7. min-p: p_i >= min_p * p_max (the max always survives) */
        double log_mp = log((double)c->min_p);
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (s * ((double)cd[i].x - xmax) >= log_mp) cd[m++] = cd[i];
        n = m;
    }
    if (c->typical_p < 1 && n > 1) { /* 8. typical-p over the renormalized survivors */
        loom__chain_key *k = ws->aux;
        double zc = 0, h = 0;
        for (int32_t i = 0; i < n; i++) zc += exp(s * ((double)cd[i].x - xmax));
        double lzc = log(zc);
        for (int32_t i = 0; i < n; i++) {
            double lq = s * ((double)cd[i].x - xmax) - lzc;
            h -= exp(lq) * lq;
        }
        for (int32_t i = 0; i < n; i++) {
            double lq = s * ((double)cd[i].x - xmax) - lzc;
            k[i] = (loom__chain_key){fabs(-lq - h), cd[i].x, cd[i].id};
        }
        qsort(k, (size_t)n, sizeof *k, loom__chain_key_cmp);
        double cum = 0, target = (double)c->typical_p;
        int32_t m = n;
        for (int32_t i = 0; i < n; i++) {
            cum += exp(s * ((double)k[i].x - xmax) - lzc);
            if (cum >= target) {
                m = i + 1;
                break;
            }
        }
        for (int32_t i = 0; i < m; i++) cd[i] = (loom__chain_cand){k[i].x, k[i].id};
        n = m;
        *by_prob = false;
    }
    return n;
}
