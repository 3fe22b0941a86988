/* qdot_legacy.c — dot products of the 32-value block formats q4_0, q4_1, q5_0, q5_1, q8_0
 * with activations in q8_0 (weights q4_0, q5_0, q8_0) or q8_1 (weights q4_1, q5_1).
 *
 * Arithmetic, identical in the portable and the SIMD path:
 *   block b:  isum_b = sum_j wq[j] * xq[j]                    exact, int32
 *             t_b = (dw_b * dx_b) * (float)isum_b             (q4_0, q5_0, q8_0)
 *             t_b = (dw_b * dx_b) * (float)isum_b + mw_b * sx_b   (q4_1, q5_1: wq >= 0, the
 *                                                   offset m times the block's stored d*sum)
 *   row:      acc[b % 8] += t_b for b = 0, 1, ..., then loom__qd_fold8(acc)
 * with wq the weight's signed codes (q - 8, q - 16, q) or unsigned codes (q4_1, q5_1), every
 * float operation rounded separately (no FMA contraction), and the scales read from their f16
 * fields. The SIMD path computes 8 blocks' isum vectors, reduces them to one vector of 8 block
 * sums (so lane k of its accumulator is acc[k] above), and converts the scales 8 at a time. */
#include "tensor/qdot_internal.h"

/* Float operations must round one by one in both paths. GCC keeps contraction off in ISO C
 * mode (the build's -std=c11); clang needs to be told. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* Offsets of the fields the float part reads: d first in every format, m (q4_1, q5_1) and s
 * (q8_1) right after it. */
#define LEG_D_OFFSET 0
#define LEG_M_OFFSET 2

static inline uint32_t qh_bits(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

/* ------------------------------------------------------------------------------------------ */
/* Portable integer block dots                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Values j (low nibble of qs[j]) and j + 16 (high nibble) of each block; q5 codes take bit 4
 * from bit j of qh. */

LOOM__QINLINE int32_t isum_q4_0(const void *blk, const int8_t *x) {
    const loom__block_q4_0 *b = (const loom__block_q4_0 *)blk;
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
        s += ((int32_t)(b->qs[j] & 15u) - 8) * x[j];
        s += ((int32_t)(b->qs[j] >> 4) - 8) * x[j + 16];
    }
    return s;
}

LOOM__QINLINE int32_t isum_q4_1(const void *blk, const int8_t *x) {
    const loom__block_q4_1 *b = (const loom__block_q4_1 *)blk;
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
        s += (int32_t)(b->qs[j] & 15u) * x[j];
        s += (int32_t)(b->qs[j] >> 4) * x[j + 16];
    }
    return s;
}

LOOM__QINLINE int32_t isum_q5_0(const void *blk, const int8_t *x) {
    const loom__block_q5_0 *b = (const loom__block_q5_0 *)blk;
    uint32_t qh = qh_bits(b->qh);
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
        int32_t lo = (int32_t)((b->qs[j] & 15u) | ((qh >> j) & 1u) << 4) - 16;
        int32_t hi = (int32_t)((b->qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4) - 16;
        s += lo * x[j] + hi * x[j + 16];
    }
    return s;
}

LOOM__QINLINE int32_t isum_q5_1(const void *blk, const int8_t *x) {
    const loom__block_q5_1 *b = (const loom__block_q5_1 *)blk;
    uint32_t qh = qh_bits(b->qh);
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
        int32_t lo = (int32_t)((b->qs[j] & 15u) | ((qh >> j) & 1u) << 4);
        int32_t hi = (int32_t)((b->qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4);
        s += lo * x[j] + hi * x[j + 16];
    }
    return s;
}

LOOM__QINLINE int32_t isum_q8_0(const void *blk, const int8_t *x) {
    const loom__block_q8_0 *b = (const loom__block_q8_0 *)blk;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (int32_t)b->qs[j] * x[j];
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* Portable row driver                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* x_act is a row of q8_0 blocks (with_min false) or q8_1 blocks (with_min true); both keep
 * their codes at the same offset after 2 (q8_0) or 4 (q8_1) bytes of scales. */
LOOM__QINLINE float legacy_dot_portable(const void *w_row, const void *x_act, int64_t n,
                                        size_t w_bytes, bool with_min,
                                        int32_t (*isum)(const void *, const int8_t *)) {
    const size_t x_bytes = with_min ? sizeof(loom__block_q8_1) : sizeof(loom__block_q8_0);
    const size_t x_codes =
        with_min ? offsetof(loom__block_q8_1, qs) : offsetof(loom__block_q8_0, qs);
    const uint8_t *w = (const uint8_t *)w_row, *x = (const uint8_t *)x_act;
    float acc[8] = {0};
    for (int64_t b = 0; b < n / LOOM_QK_LEGACY; b++, w += w_bytes, x += x_bytes) {
        float dw = loom__qd_f16((const uint16_t *)(w + LEG_D_OFFSET));
        float dx = loom__qd_f16((const uint16_t *)(x + LEG_D_OFFSET));
        float t = (dw * dx) * (float)isum(w, (const int8_t *)(x + x_codes));
        if (with_min) {
            float mw = loom__qd_f16((const uint16_t *)(w + LEG_M_OFFSET));
            float sx = loom__qd_f16((const uint16_t *)(x + LEG_M_OFFSET));
            t = t + mw * sx;
        }
        acc[b & 7] += t;
    }
    return loom__qd_fold8(acc);
}

/* ------------------------------------------------------------------------------------------ */
/* AVX2 (+ VNNI) integer block dots: 8 int32 lanes whose sum is isum                         */
/* ------------------------------------------------------------------------------------------ */
#if defined(LOOM_QDOT_AVX2)

LOOM__QINLINE __m256i x_codes_256(const int8_t *x) {
    return _mm256_loadu_si256((const __m256i *)x);
}

LOOM__QINLINE __m256i vsum_q4_0(const void *blk, const int8_t *x) {
    const loom__block_q4_0 *b = (const loom__block_q4_0 *)blk;
    __m256i w = _mm256_sub_epi8(loom__qd_nibbles(b->qs), _mm256_set1_epi8(8));
    return loom__qd_dot_s8(w, x_codes_256(x));
}

LOOM__QINLINE __m256i vsum_q4_1(const void *blk, const int8_t *x) {
    const loom__block_q4_1 *b = (const loom__block_q4_1 *)blk;
    return loom__qd_dpbusd(_mm256_setzero_si256(), loom__qd_nibbles(b->qs), x_codes_256(x));
}

LOOM__QINLINE __m256i vsum_q5_0(const void *blk, const int8_t *x) {
    const loom__block_q5_0 *b = (const loom__block_q5_0 *)blk;
    __m256i u = _mm256_or_si256(loom__qd_nibbles(b->qs), loom__qd_fifth_bits(b->qh));
    return loom__qd_dot_s8(_mm256_sub_epi8(u, _mm256_set1_epi8(16)), x_codes_256(x));
}

LOOM__QINLINE __m256i vsum_q5_1(const void *blk, const int8_t *x) {
    const loom__block_q5_1 *b = (const loom__block_q5_1 *)blk;
    __m256i u = _mm256_or_si256(loom__qd_nibbles(b->qs), loom__qd_fifth_bits(b->qh));
    return loom__qd_dpbusd(_mm256_setzero_si256(), u, x_codes_256(x));
}

LOOM__QINLINE __m256i vsum_q8_0(const void *blk, const int8_t *x) {
    const loom__block_q8_0 *b = (const loom__block_q8_0 *)blk;
    return loom__qd_dot_s8(_mm256_loadu_si256((const __m256i *)b->qs), x_codes_256(x));
}

/* The row driver: groups of 8 blocks; the last group may be partial (its missing lanes get
 * isum 0 and scales 0, so they add +0.0, which leaves a lane unchanged: a lane that starts at
 * +0.0 and only ever adds is never -0.0). */
LOOM__QINLINE float legacy_dot_avx2(const void *w_row, const void *x_act, int64_t n, int w_bytes,
                                    bool with_min, __m256i (*vsum)(const void *, const int8_t *)) {
    const int x_bytes = with_min ? (int)sizeof(loom__block_q8_1) : (int)sizeof(loom__block_q8_0);
    const int x_codes =
        with_min ? (int)offsetof(loom__block_q8_1, qs) : (int)offsetof(loom__block_q8_0, qs);
    const uint8_t *w = (const uint8_t *)w_row, *x = (const uint8_t *)x_act;
    const int64_t nb = n / LOOM_QK_LEGACY;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g = 0; g < nb; g += 8) {
        const uint8_t *wg = w + g * w_bytes, *xg = x + g * x_bytes;
        const int nk = nb - g < 8 ? (int)(nb - g) : 8;
        loom__qd_prefetch(wg, (size_t)(8 * w_bytes));
        __m256i s[8];
        if (nk == 8) {
            for (int k = 0; k < 8; k++)
                s[k] = vsum(wg + k * w_bytes, (const int8_t *)(xg + k * x_bytes + x_codes));
        } else {
            for (int k = 0; k < 8; k++)
                s[k] = k < nk ? vsum(wg + k * w_bytes, (const int8_t *)(xg + k * x_bytes + x_codes))
                              : _mm256_setzero_si256();
        }
        __m256 fsum = _mm256_cvtepi32_ps(loom__qd_hsum8x8_epi32(s));
        __m256 dw = loom__qd_f16x8(wg + LEG_D_OFFSET, w_bytes, nk);
        __m256 dx = loom__qd_f16x8(xg + LEG_D_OFFSET, x_bytes, nk);
        __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, dx), fsum);
        if (with_min) {
            __m256 mw = loom__qd_f16x8(wg + LEG_M_OFFSET, w_bytes, nk);
            __m256 sx = loom__qd_f16x8(xg + LEG_M_OFFSET, x_bytes, nk);
            t = _mm256_add_ps(t, _mm256_mul_ps(mw, sx));
        }
        acc = _mm256_add_ps(acc, t);
    }
    return loom__qd_fold8_ps(acc);
}

#endif /* LOOM_QDOT_AVX2 */

/* ------------------------------------------------------------------------------------------ */
/* Row kernels and the table                                                                  */
/* ------------------------------------------------------------------------------------------ */

#define LEGACY_PORTABLE(fmt, with_min)                                                             \
    static float dot_##fmt##_portable(const void *w, const void *x, int64_t n) {                   \
        return legacy_dot_portable(w, x, n, sizeof(loom__block_##fmt), with_min, isum_##fmt);      \
    }

LEGACY_PORTABLE(q4_0, false)
LEGACY_PORTABLE(q4_1, true)
LEGACY_PORTABLE(q5_0, false)
LEGACY_PORTABLE(q5_1, true)
LEGACY_PORTABLE(q8_0, false)

#if defined(LOOM_QDOT_AVX2)
#define LEGACY_AVX2(fmt, with_min)                                                                 \
    static float dot_##fmt##_avx2(const void *w, const void *x, int64_t n) {                       \
        return legacy_dot_avx2(w, x, n, (int)sizeof(loom__block_##fmt), with_min, vsum_##fmt);     \
    }
LEGACY_AVX2(q4_0, false)
LEGACY_AVX2(q4_1, true)
LEGACY_AVX2(q5_0, false)
LEGACY_AVX2(q5_1, true)
LEGACY_AVX2(q8_0, false)
#define LEGACY_SIMD(fmt) dot_##fmt##_avx2
#else
#define LEGACY_SIMD(fmt) NULL
#endif

static const loom__qdot_entry entry_q4_0 = {LOOM_TYPE_Q8_0, dot_q4_0_portable, LEGACY_SIMD(q4_0)};
static const loom__qdot_entry entry_q4_1 = {LOOM_TYPE_Q8_1, dot_q4_1_portable, LEGACY_SIMD(q4_1)};
static const loom__qdot_entry entry_q5_0 = {LOOM_TYPE_Q8_0, dot_q5_0_portable, LEGACY_SIMD(q5_0)};
static const loom__qdot_entry entry_q5_1 = {LOOM_TYPE_Q8_1, dot_q5_1_portable, LEGACY_SIMD(q5_1)};
static const loom__qdot_entry entry_q8_0 = {LOOM_TYPE_Q8_0, dot_q8_0_portable, LEGACY_SIMD(q8_0)};

const loom__qdot_entry *LOOM_ISA_SYM(loom__qdot_legacy)(uint32_t weight_type) {
    switch (weight_type) {
    case LOOM_TYPE_Q4_0:
        return &entry_q4_0;
    case LOOM_TYPE_Q4_1:
        return &entry_q4_1;
    case LOOM_TYPE_Q5_0:
        return &entry_q5_0;
    case LOOM_TYPE_Q5_1:
        return &entry_q5_1;
    case LOOM_TYPE_Q8_0:
        return &entry_q8_0;
    default:
        return NULL;
    }
}
