/* qgemm_unpack.h — unpacking one block (legacy formats) or one 32-value chunk of a super-block
 * (K-quants) of a weight row into registers, shared by the tile kernels of qgemm_legacy.c,
 * qgemm_k.c and qgemm_lanes_*.c. Internal to src/tensor; only where LOOM_QDOT_VNNI is set. */
#pragma once

#include <string.h>

#include "tensor/qdot_internal.h"

#if defined(LOOM_QDOT_VNNI)

/* ---- legacy formats ------------------------------------------------------------------------ */

typedef enum { FMT_Q4_0, FMT_Q4_1, FMT_Q5_0, FMT_Q5_1, FMT_Q8_0 } legacy_fmt;

LOOM__QINLINE size_t legacy_block_bytes(legacy_fmt fmt) {
    switch (fmt) {
    case FMT_Q4_0:
        return sizeof(loom__block_q4_0);
    case FMT_Q4_1:
        return sizeof(loom__block_q4_1);
    case FMT_Q5_0:
        return sizeof(loom__block_q5_0);
    case FMT_Q5_1:
        return sizeof(loom__block_q5_1);
    default:
        return sizeof(loom__block_q8_0);
    }
}

/* Unsigned codes (codes + off) of the block at blk. */
LOOM__QINLINE __m256i block_codes(const uint8_t *blk, legacy_fmt fmt) {
    switch (fmt) {
    case FMT_Q4_0:
        return loom__qd_nibbles(((const loom__block_q4_0 *)blk)->qs);
    case FMT_Q4_1:
        return loom__qd_nibbles(((const loom__block_q4_1 *)blk)->qs);
    case FMT_Q5_0: {
        const loom__block_q5_0 *b = (const loom__block_q5_0 *)blk;
        return _mm256_or_si256(loom__qd_nibbles(b->qs), loom__qd_fifth_bits(b->qh));
    }
    case FMT_Q5_1: {
        const loom__block_q5_1 *b = (const loom__block_q5_1 *)blk;
        return _mm256_or_si256(loom__qd_nibbles(b->qs), loom__qd_fifth_bits(b->qh));
    }
    default: /* q8_0: signed codes + 128 = their bytes with the top bit flipped */
        return _mm256_xor_si256(
            _mm256_loadu_si256((const __m256i *)((const loom__block_q8_0 *)blk)->qs),
            _mm256_set1_epi8((char)0x80));
    }
}

/* ---- K-quants ------------------------------------------------------------------------------- */

typedef enum { FMT_Q4_K, FMT_Q5_K, FMT_Q6_K } k_fmt;

/* Spreads int16 element k of each 128-bit lane of v over that lane. */
LOOM__QINLINE __m256i pick16(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)((2 * k) | (2 * k + 1) << 8)));
}

LOOM__QINLINE uint32_t le32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One super-block's unpacked metadata: scales (as int16, both 128-bit lanes) and the bsum
 * multipliers. */
typedef struct sb_meta {
    __m256i sc16; /* q4_K / q5_K: 8 scales in lanes 0..7 of each half; q6_K: 16 scales */
    __m256i m16;  /* multipliers of bsums[0..16) */
    float d, dmin;
} sb_meta;

LOOM__QINLINE sb_meta meta_k4(const uint8_t *scales, uint16_t d, uint16_t dmin) {
    /* 8 six-bit scales and mins from 12 packed bytes (the format's layout), 4 at a time as
     * 32-bit words. */
    const uint32_t w0 = le32(scales), w1 = le32(scales + 4), w2 = le32(scales + 8);
    const uint32_t sc_lo = w0 & 0x3f3f3f3fu, mn_lo = w1 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    const uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    sb_meta m;
    __m128i sc8 = _mm_set_epi32(0, 0, (int)sc_hi, (int)sc_lo);
    __m128i mn8 = _mm_set_epi32(0, 0, (int)mn_hi, (int)mn_lo);
    m.sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
    /* mins each twice: bsum j covers values 16j .. 16j+15, in sub-block j / 2 */
    m.m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
    m.d = loom__qd_f16(&d);
    m.dmin = loom__qd_f16(&dmin);
    return m;
}

LOOM__QINLINE sb_meta meta_q6_K(const int8_t scales[16], uint16_t d) {
    sb_meta m;
    __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)scales));
    m.sc16 = s;
    m.m16 = _mm256_slli_epi16(s, 5); /* 32 * scale, |.| <= 4096 */
    m.d = loom__qd_f16(&d);
    m.dmin = 0.0f;
    return m;
}

/* Scale vector of chunk k (32 values, one q4_K / q5_K sub-block): scale k on all 16 lanes. */
LOOM__QINLINE __m256i chunk_scales(const sb_meta *m, int k) {
    return pick16(m->sc16, k);
}

/* Unsigned codes of chunk k of a super-block. */
LOOM__QINLINE __m256i chunk_codes(const void *blk, int k, k_fmt fmt) {
    const __m256i m4 = _mm256_set1_epi8(15);
    if (fmt == FMT_Q6_K) {
        /* value v = 128h + 32s + l: low nibble (s / 2) of ql[64h + 32(s % 2) + l], high two
         * bits at 2s of qh[32h + l] */
        const loom__block_q6_K *b = (const loom__block_q6_K *)blk;
        const int h = k / 4, s = k % 4;
        __m256i ql = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32 * (s % 2)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        __m256i lo = _mm256_and_si256(s < 2 ? ql : _mm256_srli_epi16(ql, 4), m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
    /* q4_K: chunk 2c = low nibbles of qs[32c .. 32c+32), chunk 2c+1 their high nibbles; q5_K
     * adds bit 4 of value v from bit v / 32 of qh[v % 32] */
    const uint8_t *qs =
        fmt == FMT_Q4_K ? ((const loom__block_q4_K *)blk)->qs : ((const loom__block_q5_K *)blk)->qs;
    const int c = k / 2;
    __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
    __m256i u = _mm256_and_si256(k % 2 ? _mm256_srli_epi16(q, 4) : q, m4);
    if (fmt == FMT_Q5_K) {
        __m256i qh = _mm256_loadu_si256((const __m256i *)((const loom__block_q5_K *)blk)->qh);
        __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, k), _mm256_set1_epi8(1));
        u = _mm256_or_si256(u, _mm256_slli_epi16(bit, 4));
    }
    return u;
}

LOOM__QINLINE sb_meta block_meta(const void *blk, k_fmt fmt) {
    switch (fmt) {
    case FMT_Q4_K: {
        const loom__block_q4_K *b = (const loom__block_q4_K *)blk;
        return meta_k4(b->scales, b->d, b->dmin);
    }
    case FMT_Q5_K: {
        const loom__block_q5_K *b = (const loom__block_q5_K *)blk;
        return meta_k4(b->scales, b->d, b->dmin);
    }
    default: {
        const loom__block_q6_K *b = (const loom__block_q6_K *)blk;
        return meta_q6_K(b->scales, b->d);
    }
    }
}

LOOM__QINLINE size_t k_block_bytes(k_fmt fmt) {
    return fmt == FMT_Q4_K   ? sizeof(loom__block_q4_K)
           : fmt == FMT_Q5_K ? sizeof(loom__block_q5_K)
                             : sizeof(loom__block_q6_K);
}

#endif /* LOOM_QDOT_VNNI */
