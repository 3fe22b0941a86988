/* kv_merge.h — the scalar arithmetic of merged layer pairs (loom_backend.h, LOOM_KV_MERGED),
 * one definition for every backend's kv_store and for reading a cache back: the distance of
 * two directions and the coefficients of their interpolation. Callers compute the dot products
 * (in double, so the order of the sum hardly matters) and apply the coefficients per element as
 * out[i] = fmaf(ca, a[i], cb * b[i]). Host and device (nvcc) alike. */
#pragma once

#include <math.h>

#if defined(__CUDACC__)
#define LOOM_MERGE_FN static __host__ __device__ inline
#else
#define LOOM_MERGE_FN static inline
#endif

/* Below this sin W two directions are treated as parallel (or opposite): the interpolation is
 * then linear, renormalized. */
#define LOOM_MERGE_SIN_MIN 1e-6
/* Below this squared norm a direction is a zero row. */
#define LOOM_MERGE_ZERO2 1e-30

/* Angular distance acos(cos W) / pi in [0, 1] of two directions with squared norms a2, b2 and
 * dot product dot: 0 where either is a zero row (its restoration is exact whatever the
 * direction, since its norm is 0), 1 for a NaN (a row that cannot be merged faithfully is the
 * most distant). */
LOOM_MERGE_FN float loom__merge_dist(double dot, double a2, double b2) {
    if (dot != dot || a2 != a2 || b2 != b2) return 1.0f;
    if (a2 < LOOM_MERGE_ZERO2 || b2 < LOOM_MERGE_ZERO2) return 0.0f;
    const double c = dot > 1.0 ? 1.0 : dot < -1.0 ? -1.0 : dot;
    return (float)(acos(c) / 3.14159265358979323846);
}

/* Coefficients of e = slerp(a, b, t) = (sin((1-t)W) a + sin(tW) b) / sin W, cos W = dot (a and
 * b unit directions up to rounding): a zero row gives the other direction; sin W below
 * LOOM_MERGE_SIN_MIN gives ((1-t) a + t b) / |(1-t) a + t b|, or a itself where that sum
 * vanishes (opposite directions at t = 1/2). */
LOOM_MERGE_FN void loom__merge_slerp(double dot, double a2, double b2, float t, float *ca,
                                     float *cb) {
    const int a0 = !(a2 >= LOOM_MERGE_ZERO2), b0 = !(b2 >= LOOM_MERGE_ZERO2);
    if (a0 || b0) {
        *ca = b0 && !a0 ? 1.0f : 0.0f;
        *cb = a0 && !b0 ? 1.0f : 0.0f;
        return;
    }
    const double c = dot > 1.0 ? 1.0 : dot < -1.0 ? -1.0 : dot;
    const double w = acos(c), s = sin(w);
    if (s < LOOM_MERGE_SIN_MIN) {
        const double u = 1.0 - (double)t, v = (double)t;
        const double n2 = u * u * a2 + v * v * b2 + 2.0 * u * v * c;
        if (!(n2 >= LOOM_MERGE_ZERO2)) {
            *ca = 1.0f;
            *cb = 0.0f;
            return;
        }
        const double n = sqrt(n2);
        *ca = (float)(u / n);
        *cb = (float)(v / n);
        return;
    }
    *ca = (float)(sin((1.0 - (double)t) * w) / s);
    *cb = (float)(sin((double)t * w) / s);
}
