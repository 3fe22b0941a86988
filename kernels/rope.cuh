/* rope.cuh — rotary embedding's two steps, shared by rope_kernel and norm_rope_store_kernel so
 * that both give the same bits: a frequency's angle at a position (in double precision, then
 * rounded to float, as the CPU backend does), and one pair of a head rotated by it. */
#pragma once

#include "common.cuh"

/* The cosine and sine of frequency i (0 <= i < n_rot / 2) at position pos. */
static __device__ __forceinline__ void loom_rope_angle(const loom__k_rope &p, double pos, int i,
                                                       float *c, float *s) {
    double f = (double)p.freq_scale * pow((double)p.theta_base, -2.0 * i / p.n_rot);
    if (p.freq_factors) f /= (double)p.freq_factors[i];
    double sd, cd;
    sincos(pos * f, &sd, &cd);
    *c = (float)cd;
    *s = (float)sd;
}

/* Pair i of head xh rotated by (c, s): elements i and i + n_rot / 2 (NeoX) or 2i and 2i + 1. */
static __device__ __forceinline__ void loom_rope_rotate(float *xh, const loom__k_rope &p, int i,
                                                        float c, float s) {
    const int half = p.n_rot / 2;
    const int i0 = p.neox ? i : 2 * i, i1 = p.neox ? i + half : 2 * i + 1;
    const float x0 = xh[i0], x1 = xh[i1];
    xh[i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    xh[i1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}
