/* qdot_k.c — dot products of the K-quant formats q2_K, q3_K, q4_K, q5_K, q6_K with
 * activations in q8_K (256 codes, a float scale d, and the sums of each group of 16 codes).
 *
 * Arithmetic per super-block, identical in the portable and the SIMD path:
 *   isum = sum over sub-blocks i of sc_i * (sum_j wq[j] * xq[j])      exact, int32
 *   msum = sum over sub-blocks i of mn_i * (sum of the sub-block's xq) exact, int32 (from bsums;
 *                                                                     q2_K, q4_K, q5_K only)
 *   t    = (dx * d) * (float)isum - (dx * dmin) * (float)msum        (q2_K, q4_K, q5_K)
 *   t    = (dx * d) * (float)isum                                     (q3_K, q6_K: their
 *                                                                     codes are signed)
 *   row: sum += t, super-block by super-block, each float operation rounded separately.
 * wq are the weight codes as the format defines them (q3_K: lo - 4 (high bit clear); q6_K:
 * q - 32); sc and mn the sub-block scales and mins (q3_K's minus 32). The SIMD paths form the
 * same integers with unsigned codes (q3_K: lo + 4 * high; q6_K: q) and subtract the offset
 * times the bsums, which gives the same exact isum. */
#include "tensor/qdot_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ------------------------------------------------------------------------------------------ */
/* Scales (format facts, quant_layouts.h)                                                     */
/* ------------------------------------------------------------------------------------------ */

/* q4_K / q5_K: 8 six-bit scales and mins packed in 12 bytes, unpacked 4 at a time as 32-bit
 * words (p[0..3], p[4..7], p[8..11]). */
static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

LOOM__QINLINE void unpack_k4_scales8(const uint8_t p[LOOM_K_SCALE_BYTES], uint8_t sc[8],
                                     uint8_t mn[8]) {
    const uint32_t w0 = le32(p), w1 = le32(p + 4), w2 = le32(p + 8);
    put32(sc, w0 & 0x3f3f3f3fu);
    put32(mn, w1 & 0x3f3f3f3fu);
    put32(sc + 4, (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4);
    put32(mn + 4, ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4);
}

/* q3_K: 16 six-bit scales, returned minus 32: the low nibbles of bytes 0..7 then their high
 * nibbles, each with two more bits from bytes 8..11 (shifted by 0, 2, 4, 6 per group of 4). */
LOOM__QINLINE void unpack_q3_K_scales8(const uint8_t p[12], int8_t sc[16]) {
    const uint32_t a0 = le32(p), a1 = le32(p + 4), t = le32(p + 8);
    uint8_t u[16];
    put32(u, (a0 & 0x0f0f0f0fu) | (t & 0x03030303u) << 4);
    put32(u + 4, (a1 & 0x0f0f0f0fu) | ((t >> 2) & 0x03030303u) << 4);
    put32(u + 8, ((a0 >> 4) & 0x0f0f0f0fu) | ((t >> 4) & 0x03030303u) << 4);
    put32(u + 12, ((a1 >> 4) & 0x0f0f0f0fu) | ((t >> 6) & 0x03030303u) << 4);
    for (int i = 0; i < 16; i++) sc[i] = (int8_t)(u[i] - 32);
}

/* The same unpacking written from the format's definition, for the portable path. */
LOOM__QINLINE void unpack_k4_scales(const uint8_t p[LOOM_K_SCALE_BYTES], int32_t sc[8],
                                    int32_t mn[8]) {
    for (int i = 0; i < 4; i++) {
        sc[i] = p[i] & 63;
        mn[i] = p[i + 4] & 63;
        sc[i + 4] = (p[i + 8] & 15) | (p[i] >> 6) << 4;
        mn[i + 4] = (p[i + 8] >> 4) | (p[i + 4] >> 6) << 4;
    }
}

LOOM__QINLINE void unpack_q3_K_scales(const uint8_t p[12], int32_t sc[16]) {
    for (int i = 0; i < 16; i++) {
        int32_t lo = (p[i % 8] >> (4 * (i / 8))) & 15;
        int32_t hi = (p[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = (lo | hi << 4) - 32;
    }
}

/* Sum of the codes of 16-value sub-block i of an activation block. */
LOOM__QINLINE int32_t bsum16(const loom__block_q8_K *x, int i) {
    return x->bsums[i];
}

/* ------------------------------------------------------------------------------------------ */
/* Portable integer parts                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Sum over 16-value sub-blocks of sc[i] * (sum of q[v] * x[v]); q holds 256 signed codes. */
LOOM__QINLINE int32_t scaled_sum16(const int8_t *q, const int8_t *x, const int32_t *sc) {
    int32_t total = 0;
    for (int i = 0; i < 16; i++) {
        int32_t s = 0;
        for (int l = 0; l < 16; l++) s += (int32_t)q[16 * i + l] * x[16 * i + l];
        total += sc[i] * s;
    }
    return total;
}

/* Same over 32-value sub-blocks (q4_K, q5_K). */
LOOM__QINLINE int32_t scaled_sum32(const int8_t *q, const int8_t *x, const int32_t *sc) {
    int32_t total = 0;
    for (int i = 0; i < 8; i++) {
        int32_t s = 0;
        for (int l = 0; l < 32; l++) s += (int32_t)q[32 * i + l] * x[32 * i + l];
        total += sc[i] * s;
    }
    return total;
}

/* q2_K: value v = 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]; sub-block v / 16 has scale
 * scales[i] & 15 and min scales[i] >> 4. */
LOOM__QINLINE void isum_q2_K_portable(const loom__block_q2_K *w, const loom__block_q8_K *x,
                                      int32_t *isum, int32_t *msum) {
    int8_t q[LOOM_QK_K];
    int32_t sc[16];
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * s + l] = (int8_t)((w->qs[32 * h + l] >> (2 * s)) & 3);
    int32_t m = 0;
    for (int i = 0; i < 16; i++) {
        sc[i] = w->scales[i] & 15;
        m += (w->scales[i] >> 4) * bsum16(x, i);
    }
    *isum = scaled_sum16(q, x->qs, sc);
    *msum = m;
}

/* q3_K: low bits as q2_K, high bit (v / 32) of hmask[v % 32]; a clear high bit subtracts 4. */
LOOM__QINLINE void isum_q3_K_portable(const loom__block_q3_K *w, const loom__block_q8_K *x,
                                      int32_t *isum, int32_t *msum) {
    int8_t q[LOOM_QK_K];
    int32_t sc[16];
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++) {
                int lo = (w->qs[32 * h + l] >> (2 * s)) & 3;
                int high = (w->hmask[l] >> (4 * h + s)) & 1;
                q[128 * h + 32 * s + l] = (int8_t)(lo - (high ? 0 : 4));
            }
    unpack_q3_K_scales(w->scales, sc);
    *isum = scaled_sum16(q, x->qs, sc);
    *msum = 0;
}

/* The common end of q4_K and q5_K: the unpacked codes q dotted with x per 32-value sub-block
 * and scaled, and the sub-block minimums against x's 16-value sums. */
LOOM__QINLINE void k4_sums(const int8_t *q, const uint8_t *scales, const loom__block_q8_K *x,
                           int32_t *isum, int32_t *msum) {
    int32_t sc[8], mn[8];
    unpack_k4_scales(scales, sc, mn);
    int32_t m = 0;
    for (int i = 0; i < 8; i++) m += mn[i] * (bsum16(x, 2 * i) + bsum16(x, 2 * i + 1));
    *isum = scaled_sum32(q, x->qs, sc);
    *msum = m;
}

/* q4_K: sub-blocks 2c and 2c+1 are the low and high nibbles of qs[32c .. 32c+32). */
LOOM__QINLINE void isum_q4_K_portable(const loom__block_q4_K *w, const loom__block_q8_K *x,
                                      int32_t *isum, int32_t *msum) {
    int8_t q[LOOM_QK_K];
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)(w->qs[32 * c + l] & 15);
            q[64 * c + 32 + l] = (int8_t)(w->qs[32 * c + l] >> 4);
        }
    k4_sums(q, w->scales, x, isum, msum);
}

/* q5_K: as q4_K with bit 4 of value v's code at bit v / 32 of qh[v % 32]. */
LOOM__QINLINE void isum_q5_K_portable(const loom__block_q5_K *w, const loom__block_q8_K *x,
                                      int32_t *isum, int32_t *msum) {
    int8_t q[LOOM_QK_K];
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)((w->qs[32 * c + l] & 15) | ((w->qh[l] >> (2 * c)) & 1) << 4);
            q[64 * c + 32 + l] =
                (int8_t)((w->qs[32 * c + l] >> 4) | ((w->qh[l] >> (2 * c + 1)) & 1) << 4);
        }
    k4_sums(q, w->scales, x, isum, msum);
}

/* q6_K: value v = 128h + 32s + l: low nibble (s / 2) of ql[64h + 32(s % 2) + l], high two bits
 * at 2s of qh[32h + l]; code minus 32; sub-block v / 16 has the signed scale scales[v / 16]. */
LOOM__QINLINE void isum_q6_K_portable(const loom__block_q6_K *w, const loom__block_q8_K *x,
                                      int32_t *isum, int32_t *msum) {
    int8_t q[LOOM_QK_K];
    int32_t sc[16];
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++) {
                int lo = (w->ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 15;
                int hi = (w->qh[32 * h + l] >> (2 * s)) & 3;
                q[128 * h + 32 * s + l] = (int8_t)((lo | hi << 4) - 32);
            }
    for (int i = 0; i < 16; i++) sc[i] = w->scales[i];
    *isum = scaled_sum16(q, x->qs, sc);
    *msum = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* AVX2 integer parts                                                                         */
/* ------------------------------------------------------------------------------------------ */
#if defined(LOOM_QDOT_AVX2)

/* acc + the int16 pair sums p times the int16 scales c, pairwise summed into int32 lanes. */
LOOM__QINLINE __m256i add_scaled(__m256i acc, __m256i p, __m256i c) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, p, c);
#elif defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, p, c);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, c));
#endif
}

/* Byte shuffles: PICK8[p] spreads int8 scales 2p and 2p+1 over the two 8-byte halves of 16
 * bytes; PICK16[k] broadcasts int16 element k of a 128-bit lane over the lane. */
static const uint8_t PICK8[8][16] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9},
    {10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13},
    {14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};
static const uint8_t PICK16[8][16] = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1},
    {2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5},
    {6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
    {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9},
    {10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
    {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13},
    {14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15}};

/* int16 scales for the 32 values of 16-value sub-blocks 2p (low half) and 2p+1 (high half),
 * from 16 int8 scales. */
LOOM__QINLINE __m256i scale_pair(__m128i sc8, int p) {
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, _mm_loadu_si128((const __m128i *)PICK8[p])));
}

/* sum_i sc8[i] * bsums[i] over the 16 sub-blocks (int8 scales). */
LOOM__QINLINE int32_t scales_dot_bsums(__m128i sc8, const loom__block_q8_K *x) {
    __m256i b = _mm256_loadu_si256((const __m256i *)x->bsums);
    return loom__qd_hsum_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), b));
}

LOOM__QINLINE __m256i xq_256(const loom__block_q8_K *x, int v) {
    return _mm256_loadu_si256((const __m256i *)(x->qs + v));
}

/* Shared by q2_K, q3_K, q6_K: acc + 32 unsigned codes u of values v0..v0+32 (16-value
 * sub-blocks 2p and 2p+1) times their activation codes and int8 scales. */
LOOM__QINLINE __m256i sub16_pair(__m256i acc, __m256i u, const loom__block_q8_K *x, int v0,
                                 __m128i sc8, int p) {
    __m256i prod = _mm256_maddubs_epi16(u, xq_256(x, v0)); /* |pair| <= 2 * 63 * 128 */
    return add_scaled(acc, prod, scale_pair(sc8, p));
}

LOOM__QINLINE void isum_q2_K_avx2(const loom__block_q2_K *w, const loom__block_q8_K *x,
                                  int32_t *isum, int32_t *msum) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i raw = _mm_loadu_si128((const __m128i *)w->scales), m4 = _mm_set1_epi8(15);
    const __m128i sc8 = _mm_and_si128(raw, m4);
    const __m128i mn8 = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * h));
        for (int s = 0; s < 4; s++) {
            acc = sub16_pair(acc, _mm256_and_si256(q, m3), x, 128 * h + 32 * s, sc8, 4 * h + s);
            q = _mm256_srli_epi16(q, 2);
        }
    }
    *isum = loom__qd_hsum_epi32(acc);
    *msum = scales_dot_bsums(mn8, x);
}

LOOM__QINLINE void isum_q3_K_avx2(const loom__block_q3_K *w, const loom__block_q8_K *x,
                                  int32_t *isum, int32_t *msum) {
    const __m256i m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    int8_t sc[16];
    unpack_q3_K_scales8(w->scales, sc);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)sc);
    __m256i hm = _mm256_loadu_si256((const __m256i *)w->hmask);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * h));
        for (int s = 0; s < 4; s++) {
            __m256i hb = _mm256_slli_epi16(_mm256_and_si256(hm, m1), 2);
            __m256i u = _mm256_or_si256(_mm256_and_si256(q, m3), hb); /* lo + 4 * high */
            acc = sub16_pair(acc, u, x, 128 * h + 32 * s, sc8, 4 * h + s);
            q = _mm256_srli_epi16(q, 2);
            hm = _mm256_srli_epi16(hm, 1);
        }
    }
    /* code = u - 4 */
    *isum = loom__qd_hsum_epi32(acc) - 4 * scales_dot_bsums(sc8, x);
    *msum = 0;
}

/* q4_K / q5_K: 4 pairs of 32-value sub-blocks with scales sc[8]; qh (q5_K) supplies bit 4. */
LOOM__QINLINE int32_t isum_k4_avx2(const uint8_t *qs, const uint8_t *qh, const loom__block_q8_K *x,
                                   const uint8_t sc[8]) {
    const __m256i m4 = _mm256_set1_epi8(15), m1 = _mm256_set1_epi8(1);
    const __m256i sc16 =
        _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
    __m256i hb = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(q, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (qh) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hb, m1), 4));
            hi = _mm256_or_si256(
                hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 1), m1), 4));
            hb = _mm256_srli_epi16(hb, 2);
        }
        const __m256i s_lo = _mm256_shuffle_epi8(
            sc16, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)PICK16[2 * c])));
        const __m256i s_hi = _mm256_shuffle_epi8(
            sc16, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)PICK16[2 * c + 1])));
        acc = add_scaled(acc, _mm256_maddubs_epi16(lo, xq_256(x, 64 * c)), s_lo);
        acc = add_scaled(acc, _mm256_maddubs_epi16(hi, xq_256(x, 64 * c + 32)), s_hi);
    }
    return loom__qd_hsum_epi32(acc);
}

/* sum_j mn[j] * (bsums[2j] + bsums[2j+1]) for the 8 mins of q4_K / q5_K. */
LOOM__QINLINE int32_t mins_dot_bsums(const uint8_t mn[8], const loom__block_q8_K *x) {
    __m256i b = _mm256_loadu_si256((const __m256i *)x->bsums);
    __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
    __m128i p = _mm_madd_epi16(pairs, m16);
    p = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0xb1));
    return _mm_cvtsi128_si32(p);
}

LOOM__QINLINE void isum_q4_K_avx2(const loom__block_q4_K *w, const loom__block_q8_K *x,
                                  int32_t *isum, int32_t *msum) {
    uint8_t sc[8], mn[8];
    unpack_k4_scales8(w->scales, sc, mn);
    *isum = isum_k4_avx2(w->qs, NULL, x, sc);
    *msum = mins_dot_bsums(mn, x);
}

LOOM__QINLINE void isum_q5_K_avx2(const loom__block_q5_K *w, const loom__block_q8_K *x,
                                  int32_t *isum, int32_t *msum) {
    uint8_t sc[8], mn[8];
    unpack_k4_scales8(w->scales, sc, mn);
    *isum = isum_k4_avx2(w->qs, w->qh, x, sc);
    *msum = mins_dot_bsums(mn, x);
}

LOOM__QINLINE void isum_q6_K_avx2(const loom__block_q6_K *w, const loom__block_q8_K *x,
                                  int32_t *isum, int32_t *msum) {
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)w->scales);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * h));
        __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(w->qh + 32 * h));
        for (int s = 0; s < 4; s++) {
            __m256i ql = (s % 2) ? ql1 : ql0;
            __m256i lo = _mm256_and_si256(s < 2 ? ql : _mm256_srli_epi16(ql, 4), m4);
            __m256i hi = _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4);
            acc = sub16_pair(acc, _mm256_or_si256(lo, hi), x, 128 * h + 32 * s, sc8, 4 * h + s);
            qh = _mm256_srli_epi16(qh, 2);
        }
    }
    /* code = q - 32 */
    *isum = loom__qd_hsum_epi32(acc) - 32 * scales_dot_bsums(sc8, x);
    *msum = 0;
}

#endif /* LOOM_QDOT_AVX2 */

/* ------------------------------------------------------------------------------------------ */
/* Row kernels and the table                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* The float part of one super-block (see the top of the file); has_min for q2_K, q4_K, q5_K. */
LOOM__QINLINE float kq_term(float dx, float d, float dmin, int32_t isum, int32_t msum,
                            bool has_min) {
    float t = (dx * d) * (float)isum;
    if (has_min) t = t - (dx * dmin) * (float)msum;
    return t;
}

/* f16 -> f32 per path (both exact, so the same values). */
#define KQ_CVT_portable(h)         loom__f16_to_f32(h)
#define KQ_PREFETCH_portable(p, n) ((void)0)
#if defined(LOOM_QDOT_AVX2)
#define KQ_CVT_avx2(h)         _cvtsh_ss(h)
#define KQ_PREFETCH_avx2(p, n) loom__qd_prefetch(p, n)
#endif

#define KQ_ROW(fmt, path, has_min, dmin_field)                                                     \
    static float dot_##fmt##_##path(const void *w_row, const void *x_act, int64_t n) {             \
        const loom__block_##fmt *w = (const loom__block_##fmt *)w_row;                             \
        const loom__block_q8_K *x = (const loom__block_q8_K *)x_act;                               \
        float sum = 0.0f;                                                                          \
        for (int64_t b = 0; b < n / LOOM_QK_K; b++) {                                              \
            KQ_PREFETCH_##path(&w[b], sizeof w[b]);                                                \
            int32_t isum, msum;                                                                    \
            isum_##fmt##_##path(&w[b], &x[b], &isum, &msum);                                       \
            sum += kq_term(x[b].d, KQ_CVT_##path(w[b].d), KQ_CVT_##path(dmin_field), isum, msum,   \
                           has_min);                                                               \
        }                                                                                          \
        return sum;                                                                                \
    }

KQ_ROW(q2_K, portable, true, w[b].dmin)
KQ_ROW(q3_K, portable, false, 0)
KQ_ROW(q4_K, portable, true, w[b].dmin)
KQ_ROW(q5_K, portable, true, w[b].dmin)
KQ_ROW(q6_K, portable, false, 0)

#if defined(LOOM_QDOT_AVX2)
KQ_ROW(q2_K, avx2, true, w[b].dmin)
KQ_ROW(q3_K, avx2, false, 0)
KQ_ROW(q4_K, avx2, true, w[b].dmin)
KQ_ROW(q5_K, avx2, true, w[b].dmin)
KQ_ROW(q6_K, avx2, false, 0)
#define KQ_SIMD(fmt) dot_##fmt##_avx2
#else
#define KQ_SIMD(fmt) NULL
#endif

static const loom__qdot_entry entry_q2_K = {LOOM_TYPE_Q8_K, dot_q2_K_portable, KQ_SIMD(q2_K)};
static const loom__qdot_entry entry_q3_K = {LOOM_TYPE_Q8_K, dot_q3_K_portable, KQ_SIMD(q3_K)};
static const loom__qdot_entry entry_q4_K = {LOOM_TYPE_Q8_K, dot_q4_K_portable, KQ_SIMD(q4_K)};
static const loom__qdot_entry entry_q5_K = {LOOM_TYPE_Q8_K, dot_q5_K_portable, KQ_SIMD(q5_K)};
static const loom__qdot_entry entry_q6_K = {LOOM_TYPE_Q8_K, dot_q6_K_portable, KQ_SIMD(q6_K)};

const loom__qdot_entry *LOOM_ISA_SYM(loom__qdot_kquant)(uint32_t weight_type) {
    switch (weight_type) {
    case LOOM_TYPE_Q2_K:
        return &entry_q2_K;
    case LOOM_TYPE_Q3_K:
        return &entry_q3_K;
    case LOOM_TYPE_Q4_K:
        return &entry_q4_K;
    case LOOM_TYPE_Q5_K:
        return &entry_q5_K;
    case LOOM_TYPE_Q6_K:
        return &entry_q6_K;
    default:
        return NULL;
    }
}
