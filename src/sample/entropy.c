/* entropy.c — the softmax statistics pass (see entropy.h), in two sweeps over the logits:
 * the first finds the maximum m of y = scale * x and counts the finite entries (a cheap float
 * sweep), the second sums, with d_i = y_i - m <= 0 and e_i = e^(d_i),
 *   S = sum e_i,  T = sum e_i d_i,  U = sum e_i d_i^2,
 * two vectors of lanes at a time with the vector exponential of vexp.h. With p_i = e_i / S and
 * ln p_i = d_i - ln S:
 *   H = ln S - T / S,   varentropy = Var_p[d] = U / S - (T / S)^2.
 * Knowing m first means no rescaling inside the loop, so it has no branch and vectorizes; the
 * lanes are summed in a fixed order, so a given build always gives the same bits. */
#include "sample/entropy.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "sample/vexp.h"

/* Largest finite entry of x[0..n) (-inf when none) and how many are finite. NaN and -inf are
 * skipped: the comparisons are false for them. */
static float finite_max(const float *x, int32_t n, int32_t *n_finite) {
    loom__v8f m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                   -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    loom__v8i cnt = {0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        loom__v8f v;
        memcpy(&v, x + i, sizeof v);
        loom__v8i gt = v > m;
        m = (loom__v8f)(((loom__v8i)v & gt) | ((loom__v8i)m & ~gt));
        cnt -= v > -INFINITY; /* true is -1 */
    }
    float mx = -INFINITY;
    int32_t c = 0;
    for (int j = 0; j < 8; j++) {
        mx = m[j] > mx ? m[j] : mx;
        c += cnt[j];
    }
    for (; i < n; i++) {
        if (!(x[i] > -INFINITY)) continue;
        c++;
        mx = x[i] > mx ? x[i] : mx;
    }
    *n_finite = c;
    return mx;
}

/* The first index whose scale * x rounds to m (the maximum; it exists). At scale 1 that is the
 * first x equal to xmax, found eight floats at a time. */
static int32_t first_reaching(const float *x, int32_t n, float xmax, double scale, double m) {
    int32_t i = 0;
    if (scale == 1.0) {
        loom__v8f target = {xmax, xmax, xmax, xmax, xmax, xmax, xmax, xmax};
        for (; i + 8 <= n; i += 8) {
            loom__v8f v;
            memcpy(&v, x + i, sizeof v);
            loom__v8i eq = v == target;
            int64_t any = 0;
            for (int j = 0; j < 8; j++) any |= eq[j];
            if (any) break;
        }
    }
    for (; i < n; i++)
        if (x[i] > -INFINITY && scale * (double)x[i] == m) return i;
    return -1;
}

/* Lane sums of the pass: S = sum e, T = sum e d, U = sum e d^2, SS = sum e where x == raw. */
typedef struct stats_lanes {
    loom__vd S, T, U, SS;
} stats_lanes;

/* Adds x[0..LOOM__VL) (d = scale * x - m) to the lane sums; with raw, SS too. -inf and NaN
 * entries give d = -inf or NaN, which loom__vexp_split leaves out. */
static inline void accumulate(const float *x, const float *raw, double scale, double m,
                              stats_lanes *acc) {
    loom__vf v;
    memcpy(&v, x, sizeof v);
    /* Rounded product, then difference, as m = scale * xmax was: a fused multiply-add would
     * leave the product's rounding error (huge for logits near 1e30) in d of the maximum. */
    const loom__vd d = __builtin_convertvector(v, loom__vd) * scale - m;
    loom__vd dz, e;
    loom__vl keep;
    loom__vexp_split(&d, &dz, &keep);
    loom__vexp(&e, &dz, &keep);
    const loom__vd ed = e * dz;
    acc->S += e;
    acc->T += ed;
    acc->U = LOOM__VFMA(ed, dz, acc->U);
    if (raw) {
        loom__vf r;
        memcpy(&r, raw, sizeof r);
        const loom__vl same = __builtin_convertvector(v == r, loom__vl);
        acc->SS += (loom__vd)((loom__vl)e & same);
    }
}

/* The pass behind both entry points, given x's finite maximum and count; raw and sum_same
 * only for loom__logit_stats_known. */
static void stats_pass(const float *x, const float *raw, int32_t n, double scale, float xmax,
                       int32_t n_finite, loom__logit_stats *out, double *sum_same) {
    out->n_finite = n_finite;
    out->argmax = -1;
    if (sum_same) *sum_same = 0;
    if (n_finite == 0) {
        out->max = -INFINITY;
        out->sum = 0;
        out->entropy = 0;
        out->varentropy = 0;
        return;
    }
    /* scale > 0 and rounding are monotone, so the max of y is the rounded scale * xmax; the
     * arg max is the first index that reaches it. */
    const double m = scale * (double)xmax;
    out->argmax = first_reaching(x, n, xmax, scale, m);

    /* Two sets of lanes, for two independent chains of additions. */
    enum { L = LOOM__VL };
    stats_lanes a = {{0}, {0}, {0}, {0}}, b = {{0}, {0}, {0}, {0}};
    int32_t i = 0;
    for (; i + 2 * L <= n; i += 2 * L) {
        accumulate(x + i, raw ? raw + i : NULL, scale, m, &a);
        accumulate(x + i + L, raw ? raw + i + L : NULL, scale, m, &b);
    }
    for (; i < n; i += L) { /* the tail, padded with -inf (zero weight) */
        float buf[L], rbuf[L];
        size_t k = (size_t)(n - i < L ? n - i : L);
        for (int j = 0; j < L; j++) buf[j] = rbuf[j] = -INFINITY;
        memcpy(buf, x + i, k * sizeof *buf);
        if (raw) memcpy(rbuf, raw + i, k * sizeof *rbuf);
        accumulate(buf, raw ? rbuf : NULL, scale, m, &a);
    }
    double s = 0, t = 0, u = 0, ss = 0;
    for (int j = 0; j < L; j++) {
        s += a.S[j] + b.S[j];
        t += a.T[j] + b.T[j];
        u += a.U[j] + b.U[j];
        ss += a.SS[j] + b.SS[j];
    }
    if (sum_same) *sum_same = ss;
    out->max = m;
    out->sum = s;
    double mean = t / s; /* E_p[y - m] <= 0 */
    double h = log(s) - mean;
    double v = u / s - mean * mean;
    out->entropy = h > 0 ? h : 0;
    out->varentropy = v > 0 ? v : 0;
}

void loom__logit_stats_compute(const float *x, int32_t n, double scale, loom__logit_stats *out) {
    int32_t n_finite = 0;
    float xmax = finite_max(x, n, &n_finite);
    stats_pass(x, NULL, n, scale, xmax, n_finite, out, NULL);
}

void loom__logit_stats_known(const float *x, const float *raw, int32_t n, float xmax,
                             int32_t n_finite, loom__logit_stats *out, double *sum_same) {
    stats_pass(x, raw, n, 1.0, xmax, n_finite, out, sum_same);
}
