/* qdot_internal.h — what the integer-activation dot product files (qdot.c, qdot_legacy.c,
 * qdot_k.c, qgemm_*.c, qdot_dispatch.c) share: the per-weight-type kernel entry, the variant
 * table, the SIMD macros of the variant being compiled, and small helpers whose float
 * operations both paths must perform identically. Internal to src/tensor.
 *
 * Within one variant SIMD selection is compile-time: LOOM_QDOT_AVX2 when the variant's flags
 * target AVX2 + FMA + F16C, LOOM_QDOT_AVX512 when they also target AVX-512 F/BW/VL, and VNNI
 * dot instructions where __AVX512VNNI__ (with VL) or __AVXVNNI__ is defined. Each kernel file
 * keeps its SIMD code in separate static functions and names them in its entry table; the
 * run-time choice is which variant (qdot_dispatch.c). */
#pragma once

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "tensor/fp16.h"
#include "tensor/qdot.h"
#include "tensor/quant_layouts.h"
#include "tensor/types.h"

/* unused: a helper that only some ISA variants call must not warn in the others (clang warns
 * about unused static inline functions of a .c file, gcc does not). */
#if defined(__GNUC__)
#define LOOM__QINLINE static inline __attribute__((always_inline, unused))
#else
#define LOOM__QINLINE static inline
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define LOOM_QDOT_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LOOM_QDOT_AVX512 1
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LOOM_QDOT_VNNI 1 /* EVEX vpdpbusd on ymm and zmm */
#elif defined(__AVXVNNI__)
#define LOOM_QDOT_VNNI 1 /* VEX vpdpbusd on ymm */
#endif
#endif

/* One weight type's dot kernels: the activation format it pairs with, the portable C row
 * kernel, and the SIMD row kernel of this build (NULL: the portable one is used). */
typedef struct loom__qdot_entry {
    uint32_t act_type;
    loom__vec_dot_q_fn portable;
    loom__vec_dot_q_fn simd;
} loom__qdot_entry;

/* One instruction-set variant's kernels. The variant sources (qdot.c, qdot_legacy.c,
 * qdot_k.c, qgemm_*.c) are compiled once per variant with its compiler flags and
 * LOOM_ISA_SUFFIX (_portable, _avx2, _avx2vnni, _avx512; CMakeLists.txt), which LOOM_ISA_SYM
 * appends to their external names; qdot_dispatch.c asks the CPU which variants it can run and
 * serves qdot.h / qgemm.h from the best one. */
struct loom__qgemm_kernels;
struct loom__qgemm_lanes;
typedef struct loom__qdot_isa {
    const char *name; /* "portable", "avx2", "avx2-vnni", "avx512" */
    bool (*act_type)(uint32_t weight_type, uint32_t *act_type);
    loom__vec_dot_q_fn (*dot)(uint32_t weight_type);          /* NULL: no kernel for the type */
    loom__vec_dot_q_fn (*dot_portable)(uint32_t weight_type); /* the portable C kernel */
    loom__quantize_act_fn (*quant)(uint32_t act_type);
    loom__quantize_act_fn (*quant_portable)(uint32_t act_type);
    const struct loom__qgemm_kernels *(*qgemm)(uint32_t weight_type); /* NULL: none */
    const struct loom__qgemm_lanes *(*lanes)(uint32_t weight_type);   /* NULL: none */
} loom__qdot_isa;

/* The variants this CPU can run, best first (qdot_dispatch.c); returns how many (>= 1: the
 * portable one is always last). */
int loom__qdot_isa_list(const loom__qdot_isa *out[4]);

#if defined(LOOM_ISA_SUFFIX)
#define LOOM__ISA_CAT2(a, b) a##b
#define LOOM__ISA_CAT(a, b)  LOOM__ISA_CAT2(a, b)
#define LOOM_ISA_SYM(name)   LOOM__ISA_CAT(name, LOOM_ISA_SUFFIX)

const loom__qdot_isa *LOOM_ISA_SYM(loom__qdot_isa)(void);

/* Each returns weight_type's entry if it belongs to the file's family, else NULL. */
const loom__qdot_entry *LOOM_ISA_SYM(loom__qdot_legacy)(uint32_t weight_type); /* q4_0 .. q8_0 */
const loom__qdot_entry *LOOM_ISA_SYM(loom__qdot_kquant)(uint32_t weight_type); /* q2_K .. q6_K */
/* The tile kernels of qgemm.h per family (NULL for other types, or without VNNI; f16: AVX2). */
const struct loom__qgemm_kernels *LOOM_ISA_SYM(loom__qgemm_legacy)(uint32_t weight_type);
const struct loom__qgemm_kernels *LOOM_ISA_SYM(loom__qgemm_kquant)(uint32_t weight_type);
const struct loom__qgemm_kernels *LOOM_ISA_SYM(loom__qgemm_float)(uint32_t weight_type); /* f16 */
const struct loom__qgemm_lanes *LOOM_ISA_SYM(loom__qgemm_lanes_legacy)(uint32_t weight_type);
const struct loom__qgemm_lanes *LOOM_ISA_SYM(loom__qgemm_lanes_kquant)(uint32_t weight_type);
#endif

/* ---- scalar helpers --------------------------------------------------------------------- */

/* Reads a little-endian f16 field at p (block fields are only 2-byte aligned). The conversion
 * is exact, so the F16C instruction and the bit-level C one give the same float. */
LOOM__QINLINE float loom__qd_f16(const uint16_t *p) {
#if defined(LOOM_QDOT_AVX2)
    return _cvtsh_ss(*p);
#else
    return loom__f16_to_f32(*p);
#endif
}

/* The 8-lane fold every legacy dot ends with: (a[i] + a[i+4]), then (b[i] + b[i+2]), then
 * c[0] + c[1] — the order of an AVX2 horizontal sum (high half onto low half, twice, then the
 * odd lane onto the even one). */
LOOM__QINLINE float loom__qd_fold8(const float a[8]) {
    float b0 = a[0] + a[4], b1 = a[1] + a[5], b2 = a[2] + a[6], b3 = a[3] + a[7];
    float c0 = b0 + b2, c1 = b1 + b3;
    return c0 + c1;
}

/* ---- AVX2 helpers -------------------------------------------------------------------------- */
#if defined(LOOM_QDOT_AVX2)

/* Weight rows stream from memory once per matmul call while their arithmetic is short, so the
 * kernels ask for the bytes LOOM__QD_PREFETCH_AHEAD past what they are computing (the rest of
 * the row, then the next rows; prefetches past the end of a tensor are harmless hints). On
 * Gemma 3's LM head (178 MB of q8_0, one token, one thread) this made the matmul 1.45-1.8x
 * faster (loom-kernel-bench); 1 KiB ahead gave 1.2x, 8 KiB no more than 4 KiB. */
#define LOOM__QD_PREFETCH_AHEAD 4096

/* Prefetches the cache lines of [p + AHEAD, p + AHEAD + bytes). */
LOOM__QINLINE void loom__qd_prefetch(const void *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64)
        _mm_prefetch((const char *)p + LOOM__QD_PREFETCH_AHEAD + off, _MM_HINT_T0);
}

/* Sum of the 8 int32 lanes of v (exact in int32 for the ranges used here). */
LOOM__QINLINE int32_t loom__qd_hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Lane k of the result is the sum of the 8 int32 lanes of v[k] (a transposing reduction:
 * 6 horizontal adds and one cross-half add for 8 vectors). */
LOOM__QINLINE __m256i loom__qd_hsum8x8_epi32(const __m256i v[8]) {
    __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
    /* u0: low half holds partial sums of v0..v3, high half the rest of them; same for u1. */
    __m256i lo = _mm256_permute2x128_si256(u0, u1, 0x20);
    __m256i hi = _mm256_permute2x128_si256(u0, u1, 0x31);
    return _mm256_add_epi32(lo, hi);
}

/* The fold of loom__qd_fold8 on a vector. */
LOOM__QINLINE float loom__qd_fold8_ps(__m256 a) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

/* acc + (sums of 4 products u[i] * s[i], u unsigned bytes, s signed) per int32 lane. Without
 * VNNI the products go through vpmaddubsw's int16 pair sums, exact as long as
 * |u[2i] s[2i] + u[2i+1] s[2i+1]| <= 32767 — every caller stays within that (|u| <= 128 with
 * |s| <= 127, or u <= 63). */
LOOM__QINLINE __m256i loom__qd_dpbusd(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
    return _mm256_add_epi32(acc, p);
#endif
}

/* Sums of 4 products a[i] * b[i] of signed bytes per int32 lane, via |a| and b with a's sign
 * (b must not hold -128; a may). */
LOOM__QINLINE __m256i loom__qd_dot_s8(__m256i a, __m256i b) {
    return loom__qd_dpbusd(_mm256_setzero_si256(), _mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

/* Converts the f16 fields at byte offsets base + k * stride (k < nk <= 8; lanes >= nk are
 * 0.0f) to float. Reads 4 bytes at each address: callers point at a field followed by at
 * least 2 more bytes of the same block. */
LOOM__QINLINE __m256 loom__qd_f16x8(const void *base, int stride, int nk) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i idx = _mm256_mullo_epi32(lane, _mm256_set1_epi32(stride));
    __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nk), lane);
    __m256i v =
        _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)base, idx, mask, 1);
    v = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm256_cvtph_ps(h);
}

/* 32 bytes, byte j = 0xff if bit j of bits is set, else 0. */
LOOM__QINLINE __m256i loom__qd_bits_to_bytes(uint32_t bits) {
    const __m256i pick = _mm256_setr_epi64x(0x0000000000000000ll, 0x0101010101010101ll,
                                            0x0202020202020202ll, 0x0303030303030303ll);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), pick);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* The 32 4-bit codes of a legacy block in value order: low nibbles (values 0..15) in the low
 * half, high nibbles (16..31) in the high half. */
LOOM__QINLINE __m256i loom__qd_nibbles(const uint8_t qs[16]) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

/* Bit 4 of each q5 code (value j's from bit j of the block's little-endian qh word). */
LOOM__QINLINE __m256i loom__qd_fifth_bits(const uint8_t qh[4]) {
    uint32_t bits =
        (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    return _mm256_and_si256(loom__qd_bits_to_bytes(bits), _mm256_set1_epi8(16));
}

#endif /* LOOM_QDOT_AVX2 */
