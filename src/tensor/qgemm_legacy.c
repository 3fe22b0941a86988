/* qgemm_legacy.c — tile kernels (qgemm.h) for the 32-value block formats q4_0, q4_1, q5_0,
 * q5_1, q8_0 with q8_0 / q8_1 activations.
 *
 * Prepared token row, with nb = K / 32 blocks padded to nbp = a multiple of 8 (zeros):
 *   int8 x[nbp][32]   activation codes          float dx[nbp]  activation scale d
 *   float sx[nbp]     q8_1's stored d * sum(codes) (for q4_1, q5_1)
 *   int32 xoff[nbp]   off * sum(codes), exact, with off the weight's code offset below
 * Weight rows are read in place: per group of 8 blocks, a row's codes are unpacked once into
 * registers as unsigned u = code + off (q4_0: nibble, off 8; q5_0: 5-bit code, off 16; q8_0:
 * the signed byte + 128, off 128; q4_1 / q5_1: their unsigned codes, off 0) together with its
 * 8 scales, and then serve up to NT_MAX tokens.
 * Per (row, token) and block b: isum_b = sum(u x) - xoff_b = sum(w x) exactly; then the float
 * part of qdot_legacy.c: t_b = (dw_b * dx_b) * (float)isum_b (+ mw_b * sx_b), lane b % 8 of the
 * accumulator, folded as loom__qd_fold8 — the same operations as dot_<fmt>_portable (a partial
 * last group has zero codes and scales in its unused lanes, which add +0.0). */
#include "tensor/qgemm.h"

#include <string.h>

#include "tensor/qdot_internal.h"
#include "tensor/qgemm_unpack.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(LOOM_QDOT_VNNI)

#define LQ 32 /* values per block */

/* Blocks of a K-value row, padded to a whole number of groups of 8. */
static int64_t padded_blocks(int64_t K) {
    return (K / LQ + 7) & ~(int64_t)7;
}

static size_t round64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

/* x codes, dx, sx, xoff */
static size_t x_row_bytes(int64_t K) {
    return round64((size_t)padded_blocks(K) * (LQ + 12));
}

/* ---- activation rows ------------------------------------------------------------------------ */

/* act is a row of q8_0 (with_s false) or q8_1 blocks; both hold d first, q8_1 then s, then the
 * 32 codes. */
LOOM__QINLINE void prepare_legacy(const void *act, void *xrow, int64_t K, bool with_s, int off) {
    const int64_t nb = K / LQ, nbp = padded_blocks(K);
    const size_t bytes = with_s ? sizeof(loom__block_q8_1) : sizeof(loom__block_q8_0);
    const size_t codes = with_s ? offsetof(loom__block_q8_1, qs) : offsetof(loom__block_q8_0, qs);
    int8_t *x = (int8_t *)xrow;
    float *dx = (float *)(x + nbp * LQ), *sx = dx + nbp;
    int32_t *xoff = (int32_t *)(sx + nbp);
    const uint8_t *a = (const uint8_t *)act;
    for (int64_t b = 0; b < nb; b++, a += bytes) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(a + codes));
        _mm256_store_si256((__m256i *)(x + b * LQ), q);
        dx[b] = loom__qd_f16((const uint16_t *)a);
        sx[b] = with_s ? loom__qd_f16((const uint16_t *)(a + 2)) : 0.0f;
        /* sum of 32 codes: dpbusd with all-ones as the unsigned operand */
        __m256i s = loom__qd_dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
        xoff[b] = off * loom__qd_hsum_epi32(s);
    }
    for (int64_t b = nb; b < nbp; b++) {
        _mm256_store_si256((__m256i *)(x + b * LQ), _mm256_setzero_si256());
        dx[b] = sx[b] = 0.0f;
        xoff[b] = 0;
    }
}

static void prepare_q8_0_off8(const void *a, void *x, int64_t K) {
    prepare_legacy(a, x, K, false, 8);
}
static void prepare_q8_0_off16(const void *a, void *x, int64_t K) {
    prepare_legacy(a, x, K, false, 16);
}
static void prepare_q8_0_off128(const void *a, void *x, int64_t K) {
    prepare_legacy(a, x, K, false, 128);
}
static void prepare_q8_1_off0(const void *a, void *x, int64_t K) {
    prepare_legacy(a, x, K, true, 0);
}

/* ---- the tile ------------------------------------------------------------------------------- */

#define NT_MAX 4 /* tokens that share one row's unpacked group in registers */

/* Row w against NT tokens (NT a compile-time constant after inlining): per group of 8 blocks
 * the row's codes and scales are unpacked once, then each token's 8 block sums go into lanes
 * 0..7 (lane k = block 8g + k), as in the one-row kernels. */
LOOM__QINLINE void row_tokens(const uint8_t *w, const uint8_t *x0, size_t x_stride, int64_t nb,
                              legacy_fmt fmt, bool with_min, int NT, float *out,
                              size_t out_stride) {
    const size_t wb = legacy_block_bytes(fmt);
    const int64_t nbp = padded_blocks(nb * LQ);
    __m256 acc[NT_MAX];
    for (int j = 0; j < NT; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t g = 0; g < nb; g += 8) {
        const int nk = nb - g < 8 ? (int)(nb - g) : 8;
        const uint8_t *wg = w + (size_t)g * wb;
        loom__qd_prefetch(wg, 8 * wb);
        __m256i u[8];
        for (int k = 0; k < 8; k++)
            u[k] = k < nk ? block_codes(wg + (size_t)k * wb, fmt) : _mm256_setzero_si256();
        /* d, and m after it (q4_1, q5_1), are each followed by 2 more bytes of the block, as
         * the gather needs */
        const __m256 dw = loom__qd_f16x8(wg, (int)wb, nk);
        const __m256 mw = with_min ? loom__qd_f16x8(wg + 2, (int)wb, nk) : _mm256_setzero_ps();
        for (int j = 0; j < NT; j++) {
            const int8_t *x = (const int8_t *)(x0 + (size_t)j * x_stride);
            const float *dx = (const float *)(x + nbp * LQ), *sx = dx + nbp;
            const int32_t *xoff = (const int32_t *)(sx + nbp);
            __m256i s[8];
            for (int k = 0; k < 8; k++)
                s[k] = loom__qd_dpbusd(_mm256_setzero_si256(), u[k],
                                       _mm256_load_si256((const __m256i *)(x + (g + k) * LQ)));
            __m256i isum = _mm256_sub_epi32(loom__qd_hsum8x8_epi32(s),
                                            _mm256_load_si256((const __m256i *)(xoff + g)));
            __m256 t =
                _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_load_ps(dx + g)), _mm256_cvtepi32_ps(isum));
            if (with_min) t = _mm256_add_ps(t, _mm256_mul_ps(mw, _mm256_load_ps(sx + g)));
            acc[j] = _mm256_add_ps(acc[j], t);
        }
    }
    for (int j = 0; j < NT; j++) out[(size_t)j * out_stride] = loom__qd_fold8_ps(acc[j]);
}

LOOM__QINLINE void tile_legacy(const void *w, size_t w_stride, int nr, const void *x,
                               size_t x_stride, int nt, int64_t K, float *out, size_t out_stride,
                               legacy_fmt fmt, bool with_min) {
    const int64_t nb = K / LQ;
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * w_stride;
        for (int t0 = 0; t0 < nt; t0 += NT_MAX) {
            const uint8_t *xt = (const uint8_t *)x + (size_t)t0 * x_stride;
            float *o = out + (size_t)t0 * out_stride + (size_t)r;
            switch (nt - t0 < NT_MAX ? nt - t0 : NT_MAX) {
            case 1:
                row_tokens(wr, xt, x_stride, nb, fmt, with_min, 1, o, out_stride);
                break;
            case 2:
                row_tokens(wr, xt, x_stride, nb, fmt, with_min, 2, o, out_stride);
                break;
            case 3:
                row_tokens(wr, xt, x_stride, nb, fmt, with_min, 3, o, out_stride);
                break;
            default:
                row_tokens(wr, xt, x_stride, nb, fmt, with_min, 4, o, out_stride);
                break;
            }
        }
    }
}

#define LEGACY_TILE(fmt, FMT, with_min)                                                            \
    static void tile_##fmt(const void *w, size_t ws, int nr, const void *x, size_t xs, int nt,     \
                           int64_t K, float *out, size_t os) {                                     \
        tile_legacy(w, ws, nr, x, xs, nt, K, out, os, FMT, with_min);                              \
    }
LEGACY_TILE(q4_0, FMT_Q4_0, false)
LEGACY_TILE(q4_1, FMT_Q4_1, true)
LEGACY_TILE(q5_0, FMT_Q5_0, false)
LEGACY_TILE(q5_1, FMT_Q5_1, true)
LEGACY_TILE(q8_0, FMT_Q8_0, false)

#define LEGACY_KERNELS(fmt, prep)                                                                  \
    static const loom__qgemm_kernels kernels_##fmt = {                                             \
        .min_tokens = 1, .x_row_bytes = x_row_bytes, .prepare_x = prep, .tile = tile_##fmt};
LEGACY_KERNELS(q4_0, prepare_q8_0_off8)
LEGACY_KERNELS(q4_1, prepare_q8_1_off0)
LEGACY_KERNELS(q5_0, prepare_q8_0_off16)
LEGACY_KERNELS(q5_1, prepare_q8_1_off0)
LEGACY_KERNELS(q8_0, prepare_q8_0_off128)

const loom__qgemm_kernels *LOOM_ISA_SYM(loom__qgemm_legacy)(uint32_t weight_type) {
    switch (weight_type) {
    case LOOM_TYPE_Q4_0:
        return &kernels_q4_0;
    case LOOM_TYPE_Q4_1:
        return &kernels_q4_1;
    case LOOM_TYPE_Q5_0:
        return &kernels_q5_0;
    case LOOM_TYPE_Q5_1:
        return &kernels_q5_1;
    case LOOM_TYPE_Q8_0:
        return &kernels_q8_0;
    default:
        return NULL;
    }
}

#else /* no integer dot instructions: the matmul keeps the one-row kernels */

const loom__qgemm_kernels *LOOM_ISA_SYM(loom__qgemm_legacy)(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}

#endif
