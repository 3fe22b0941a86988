/* cpu_attention_exp.h — exp(x) on eight lanes, for softmax weights (x <= 0).
 *
 * x = n ln2 + r with n = round(x / ln2), |r| <= ln2 / 2; exp(r) by its Taylor series to r^7
 * (the first dropped term is below 6e-9 relative, so rounding in the Horner steps dominates:
 * about 1 ulp); then the exponent field adds n. ln2 is split into a part with 12 trailing zero
 * bits (n * hi is exact for |n| < 2^12) and the rest, so r keeps its low bits.
 *
 * Lanes below -87 (where 2^n would leave the normal range), -inf included, give exactly +0:
 * softmax uses that for masked positions. NaN stays NaN. exp(0) is exactly 1. Built only from
 * lv_* operations, so every build path gives the same bits for the same input. */
#pragma once

#include "backend/cpu/cpu_attention_lanes.h"

#define LV_EXP_MIN (-87.0f)

static inline lv8 lv_exp(lv8 x) {
    const float ln2_hi = 0x1.62ep-1f;     /* ln 2 with its low 12 bits cleared */
    const float ln2_lo = 0x1.0bfbe8p-15f; /* ln 2 - ln2_hi */
    const float log2e = 0x1.715476p+0f;   /* 1 / ln 2 */
    lv8 n = lv_round(lv_mul(x, lv_set1(log2e)));
    lv8 r = lv_fma(n, lv_set1(-ln2_hi), x);
    r = lv_fma(n, lv_set1(-ln2_lo), r);
    /* sum_k r^k / k!, k = 7 .. 0, Horner */
    lv8 p = lv_set1(1.0f / 5040.0f);
    p = lv_fma(p, r, lv_set1(1.0f / 720.0f));
    p = lv_fma(p, r, lv_set1(1.0f / 120.0f));
    p = lv_fma(p, r, lv_set1(1.0f / 24.0f));
    p = lv_fma(p, r, lv_set1(1.0f / 6.0f));
    p = lv_fma(p, r, lv_set1(0.5f));
    p = lv_fma(p, r, lv_set1(1.0f));
    p = lv_fma(p, r, lv_set1(1.0f));
    return lv_zero_below(lv_mul(p, lv_pow2i(n)), x, LV_EXP_MIN);
}

/* One value through the same lanes (so a scalar exp agrees with the vector one). */
static inline float lv_exp1(float x) {
    float out[LV_N];
    lv_store(out, lv_exp(lv_set1(x)));
    return out[0];
}
