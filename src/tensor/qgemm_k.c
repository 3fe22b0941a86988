/* qgemm_k.c — per-pair tile kernels (qgemm.h) for q4_K and q5_K with q8_K activations (q6_K
 * only has token lanes, qgemm_lanes_k.c).
 *
 * A prepared token row is the q8_K row itself (copied to aligned memory). Weight rows are read
 * in place; per 256-value super-block a row's codes are unpacked once, chunk by chunk (32
 * values = one sub-block), into unsigned bytes u (q4_K 0..15, q5_K 0..31) with the sub-block's
 * int16 scale on all of vpmaddubsw's 16 output lanes, and applied to up to NT_MAX tokens.
 * Per (row, token) and super-block: isum = sum over chunks of scale . maddubs(u, x) (exact:
 * |pair| <= 2 * 31 * 127), msum = the sub-block mins against the activation's 16 sums of 16
 * codes, and then the float part of qdot_k.c:
 *   t = (dx * d) * (float)isum - (dx * dmin) * (float)msum
 * summed super-block by super-block — the same operations as dot_<fmt>_portable. */
#include "tensor/qgemm.h"

#include <string.h>

#include "tensor/qdot_internal.h"
#include "tensor/qgemm_unpack.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(LOOM_QDOT_VNNI)

static size_t x_row_bytes(int64_t K) {
    const size_t n = (size_t)(K / LOOM_QK_K) * sizeof(loom__block_q8_K);
    return (n + 63) & ~(size_t)63;
}

static void prepare_q8_K(const void *act, void *x, int64_t K) {
    memcpy(x, act, (size_t)(K / LOOM_QK_K) * sizeof(loom__block_q8_K));
}

/* acc + the int16 pair sums p times the int16 scales c, pairwise summed into int32 lanes. */
LOOM__QINLINE __m256i add_scaled(__m256i acc, __m256i p, __m256i c) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, p, c);
#else
    return _mm256_dpwssd_avx_epi32(acc, p, c);
#endif
}

#define NT_MAX 4 /* tokens that share one row's unpacked super-block in registers */

/* Row w against NT tokens (a compile-time constant after inlining). */
LOOM__QINLINE void row_tokens(const uint8_t *w, const uint8_t *x0, size_t x_stride, int64_t nsb,
                              k_fmt fmt, int NT, float *out, size_t out_stride) {
    const size_t wb = k_block_bytes(fmt);
    float sum[NT_MAX];
    for (int j = 0; j < NT; j++) sum[j] = 0.0f;
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = w + (size_t)b * wb;
        loom__qd_prefetch(blk, wb);
        const sb_meta m = block_meta(blk, fmt);
        __m256i acc[NT_MAX];
        for (int j = 0; j < NT; j++) acc[j] = _mm256_setzero_si256();
        for (int k = 0; k < 8; k++) {
            const __m256i u = chunk_codes(blk, k, fmt), sc = chunk_scales(&m, k);
            for (int j = 0; j < NT; j++) {
                const loom__block_q8_K *x =
                    (const loom__block_q8_K *)(x0 + (size_t)j * x_stride) + b;
                __m256i p =
                    _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(x->qs + 32 * k)));
                acc[j] = add_scaled(acc[j], p, sc);
            }
        }
        for (int j = 0; j < NT; j++) {
            const loom__block_q8_K *x = (const loom__block_q8_K *)(x0 + (size_t)j * x_stride) + b;
            const int32_t isum = loom__qd_hsum_epi32(acc[j]);
            const int32_t msum = loom__qd_hsum_epi32(
                _mm256_madd_epi16(m.m16, _mm256_loadu_si256((const __m256i *)x->bsums)));
            const float dx = x->d;
            const float t = (dx * m.d) * (float)isum - (dx * m.dmin) * (float)msum;
            sum[j] += t;
        }
    }
    for (int j = 0; j < NT; j++) out[(size_t)j * out_stride] = sum[j];
}

LOOM__QINLINE void tile_k(const void *w, size_t w_stride, int nr, const void *x, size_t x_stride,
                          int nt, int64_t K, float *out, size_t out_stride, k_fmt fmt) {
    const int64_t nsb = K / LOOM_QK_K;
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * w_stride;
        for (int t0 = 0; t0 < nt; t0 += NT_MAX) {
            const uint8_t *xt = (const uint8_t *)x + (size_t)t0 * x_stride;
            float *o = out + (size_t)t0 * out_stride + (size_t)r;
            switch (nt - t0 < NT_MAX ? nt - t0 : NT_MAX) {
            case 1:
                row_tokens(wr, xt, x_stride, nsb, fmt, 1, o, out_stride);
                break;
            case 2:
                row_tokens(wr, xt, x_stride, nsb, fmt, 2, o, out_stride);
                break;
            case 3:
                row_tokens(wr, xt, x_stride, nsb, fmt, 3, o, out_stride);
                break;
            default:
                row_tokens(wr, xt, x_stride, nsb, fmt, 4, o, out_stride);
                break;
            }
        }
    }
}

#define K_TILE(fmt, FMT)                                                                           \
    static void tile_##fmt(const void *w, size_t ws, int nr, const void *x, size_t xs, int nt,     \
                           int64_t K, float *out, size_t os) {                                     \
        tile_k(w, ws, nr, x, xs, nt, K, out, os, FMT);                                             \
    }                                                                                              \
    static const loom__qgemm_kernels kernels_##fmt = {.min_tokens = 2,                             \
                                                      .x_row_bytes = x_row_bytes,                  \
                                                      .prepare_x = prepare_q8_K,                   \
                                                      .tile = tile_##fmt};
K_TILE(q4_K, FMT_Q4_K)
K_TILE(q5_K, FMT_Q5_K)
/* No q6_K here: its two scales per chunk cost more to spread per row than the one-row kernel
 * spends (loom-kernel-bench, T = 4: 0.67x); q6_K takes the token lanes from 5 tokens on. */

const loom__qgemm_kernels *LOOM_ISA_SYM(loom__qgemm_kquant)(uint32_t weight_type) {
    switch (weight_type) {
    case LOOM_TYPE_Q4_K:
        return &kernels_q4_K;
    case LOOM_TYPE_Q5_K:
        return &kernels_q5_K;
    default:
        return NULL;
    }
}

#else /* no integer dot instructions: the matmul keeps the one-row kernels */

const loom__qgemm_kernels *LOOM_ISA_SYM(loom__qgemm_kquant)(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}

#endif
