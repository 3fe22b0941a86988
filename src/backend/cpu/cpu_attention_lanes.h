/* cpu_attention_lanes.h — float lanes for the attention kernels: lv8, eight lanes (AVX2+FMA
 * or plain C), and lw, the widest vector the build has (sixteen with AVX-512, else lv8).
 *
 * Every operation is lane-wise and correctly rounded (add, mul, fma, max, round to nearest
 * even), a lane shuffle, or a reduction over eight lanes in one fixed tree. So the plain-C
 * path gives exactly the bits of the AVX2 one, the kernels in cpu_attention_tile.c are written
 * once, and they use lw only where each lane's operations are the same at any width. Only
 * cpu_attention_*.c include this. */
#pragma once

#include "backend/cpu/cpu_vec.h" /* LOOM_CPU_AVX2, loom__f16_to_f32 */
#include "tensor/fp8.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define LV_N 8 /* lanes */

/* The f16 bit pattern of an FP8 code: for E5M2 the code is a half's top byte (the same value);
 * for E4M3, fp8.h's scaled bits — the value times 2^-8 (E4M3's bias is the half's minus 8; its
 * subnormals land on half subnormals, which the half -> float conversion widens exactly). So
 * one F16C conversion widens either, and a row's scale times 2^8 (exact) undoes E4M3's offset:
 * the product is the dequantized value code * scale, rounded once. (E4M3's NaN code reads as
 * 480: quantization never writes it — a row holding a NaN gets a NaN scale instead.) */
static inline uint16_t lv_fp8_half_bits(uint8_t b, bool e4m3) {
    return e4m3 ? loom__fp8_e4m3_to_f16_scaled_bits(b) : (uint16_t)(b << 8); /* as the AVX path */
}

#if defined(LOOM_CPU_AVX2)
typedef __m256 lv8;
#else
typedef struct lv8 {
    float f[LV_N];
} lv8;
#endif

#if defined(LOOM_CPU_AVX2)

static inline lv8 lv_set1(float x) {
    return _mm256_set1_ps(x);
}
static inline lv8 lv_load(const float *p) {
    return _mm256_loadu_ps(p);
}
static inline void lv_store(float *p, lv8 v) {
    _mm256_storeu_ps(p, v);
}
static inline lv8 lv_add(lv8 a, lv8 b) {
    return _mm256_add_ps(a, b);
}
static inline lv8 lv_sub(lv8 a, lv8 b) {
    return _mm256_sub_ps(a, b);
}
static inline lv8 lv_mul(lv8 a, lv8 b) {
    return _mm256_mul_ps(a, b);
}
/* a * b + c, one rounding. */
static inline lv8 lv_fma(lv8 a, lv8 b, lv8 c) {
    return _mm256_fmadd_ps(a, b, c);
}
/* a > b ? a : b per lane (so a NaN in either gives b, as MAXPS does). */
static inline lv8 lv_max(lv8 a, lv8 b) {
    return _mm256_max_ps(a, b);
}

/* Lanes i with lo <= i <= hi keep v, the others become fill. */
static inline lv8 lv_keep_range(lv8 v, int lo, int hi, float fill) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(lo), idx),
                                  _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(hi)));
    return _mm256_blendv_ps(v, _mm256_set1_ps(fill), _mm256_castsi256_ps(out));
}

/* Lanes where x < t (ordered: not NaN) become 0. */
static inline lv8 lv_zero_below(lv8 v, lv8 x, float t) {
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(t), _CMP_LT_OQ), v);
}

/* Nearest integer, ties to even. */
static inline lv8 lv_round(lv8 x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* 2^n for integral n in [-126, 127]; other lanes give garbage (callers mask them). */
static inline lv8 lv_pow2i(lv8 n) {
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}

/* The fixed tree: (x0+x4, x1+x5, x2+x6, x3+x7) -> ((0+4)+(2+6), (1+5)+(3+7)) -> their sum. */
static inline float lv_hsum(lv8 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* The same tree with max (first operand the lower lanes). */
static inline float lv_hmax(lv8 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Eight IEEE halves to floats (exact). */
static inline lv8 lv_load_f16(const uint16_t *p) {
#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    float f[LV_N];
    for (int i = 0; i < LV_N; i++) f[i] = loom__f16_to_f32(p[i]);
    return _mm256_loadu_ps(f);
#endif
}

/* Eight bfloat16 to floats (exact: a bfloat16 is a float's top half). */
static inline lv8 lv_load_bf16(const uint16_t *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Eight FP8 codes to floats through their f16 bit patterns (lv_fp8_half_bits): E5M2 exactly,
 * E4M3 times 2^-8 (the caller's scale carries the 2^8). */
static inline lv8 lv_load_fp8(const uint8_t *p, bool e4m3) {
    uint64_t raw;
    memcpy(&raw, p, sizeof raw);
    __m128i b = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)raw));
    __m128i h = e4m3 ? _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7),
                                    _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8))
                     : _mm_slli_epi16(b, 8);
#if defined(__F16C__)
    return _mm256_cvtph_ps(h);
#else
    uint16_t u[LV_N];
    _mm_storeu_si128((__m128i *)u, h);
    return lv_load_f16(u);
#endif
}

/* r[0..8) are the rows of an 8x8 block; afterwards r[i] holds its column i. */
static inline void lv_transpose8(lv8 r[LV_N]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);     /* a0 b0 a1 b1 | a4 b4 a5 b5 */
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    }
    for (int i = 0; i < 2; i++) {
        const int b = 4 * i;                                    /* rows 4i .. 4i+3 */
        u[b + 0] = _mm256_shuffle_ps(t[b], t[b + 2], 0x44);     /* a0 b0 c0 d0 | a4 .. */
        u[b + 1] = _mm256_shuffle_ps(t[b], t[b + 2], 0xee);     /* a1 b1 c1 d1 | a5 .. */
        u[b + 2] = _mm256_shuffle_ps(t[b + 1], t[b + 3], 0x44); /* a2 .. | a6 .. */
        u[b + 3] = _mm256_shuffle_ps(t[b + 1], t[b + 3], 0xee); /* a3 .. | a7 .. */
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

#else /* plain C: the same operations one lane at a time */

static inline lv8 lv_set1(float x) {
    lv8 v;
    for (int i = 0; i < LV_N; i++) v.f[i] = x;
    return v;
}
static inline lv8 lv_load(const float *p) {
    lv8 v;
    memcpy(v.f, p, sizeof v.f);
    return v;
}
static inline void lv_store(float *p, lv8 v) {
    memcpy(p, v.f, sizeof v.f);
}
static inline lv8 lv_add(lv8 a, lv8 b) {
    for (int i = 0; i < LV_N; i++) a.f[i] += b.f[i];
    return a;
}
static inline lv8 lv_sub(lv8 a, lv8 b) {
    for (int i = 0; i < LV_N; i++) a.f[i] -= b.f[i];
    return a;
}
static inline lv8 lv_mul(lv8 a, lv8 b) {
    for (int i = 0; i < LV_N; i++) a.f[i] *= b.f[i];
    return a;
}
static inline lv8 lv_fma(lv8 a, lv8 b, lv8 c) {
    for (int i = 0; i < LV_N; i++) c.f[i] = fmaf(a.f[i], b.f[i], c.f[i]);
    return c;
}
static inline lv8 lv_max(lv8 a, lv8 b) {
    for (int i = 0; i < LV_N; i++) a.f[i] = a.f[i] > b.f[i] ? a.f[i] : b.f[i];
    return a;
}
static inline lv8 lv_keep_range(lv8 v, int lo, int hi, float fill) {
    for (int i = 0; i < LV_N; i++)
        if (i < lo || i > hi) v.f[i] = fill;
    return v;
}
static inline lv8 lv_zero_below(lv8 v, lv8 x, float t) {
    for (int i = 0; i < LV_N; i++)
        if (x.f[i] < t) v.f[i] = 0.0f;
    return v;
}
static inline lv8 lv_round(lv8 x) {
    for (int i = 0; i < LV_N; i++) x.f[i] = nearbyintf(x.f[i]); /* default mode: ties to even */
    return x;
}
static inline lv8 lv_pow2i(lv8 n) {
    for (int i = 0; i < LV_N; i++) {
        /* Out-of-range lanes are masked by the caller; keep the conversion defined. */
        int32_t e = n.f[i] >= -126.0f && n.f[i] <= 127.0f ? (int32_t)n.f[i] : 0;
        n.f[i] = loom__f32_from_bits((uint32_t)(e + 127) << 23);
    }
    return n;
}
static inline float lv_hsum(lv8 v) {
    float a = v.f[0] + v.f[4], b = v.f[1] + v.f[5], c = v.f[2] + v.f[6], d = v.f[3] + v.f[7];
    return (a + c) + (b + d);
}
static inline float lv_hmax_2(float a, float b) {
    return a > b ? a : b;
}
static inline float lv_hmax(lv8 v) {
    float a = lv_hmax_2(v.f[0], v.f[4]), b = lv_hmax_2(v.f[1], v.f[5]);
    float c = lv_hmax_2(v.f[2], v.f[6]), d = lv_hmax_2(v.f[3], v.f[7]);
    return lv_hmax_2(lv_hmax_2(a, c), lv_hmax_2(b, d));
}
static inline lv8 lv_load_f16(const uint16_t *p) {
    lv8 v;
    for (int i = 0; i < LV_N; i++) v.f[i] = loom__f16_to_f32(p[i]);
    return v;
}
static inline lv8 lv_load_bf16(const uint16_t *p) {
    lv8 v;
    for (int i = 0; i < LV_N; i++) v.f[i] = loom__bf16_to_f32(p[i]);
    return v;
}
static inline lv8 lv_load_fp8(const uint8_t *p, bool e4m3) {
    lv8 v;
    for (int i = 0; i < LV_N; i++) v.f[i] = loom__f16_to_f32(lv_fp8_half_bits(p[i], e4m3));
    return v;
}
static inline void lv_transpose8(lv8 r[LV_N]) {
    for (int i = 0; i < LV_N; i++)
        for (int j = i + 1; j < LV_N; j++) {
            float x = r[i].f[j];
            r[i].f[j] = r[j].f[i];
            r[j].f[i] = x;
        }
}

#endif

static inline lv8 lv_zero(void) {
    return lv_set1(0.0f);
}

/* ------------------------------------------------------------------------------------------ */
/* Wide lanes: the widest vector the build has (16 floats with AVX-512, else the 8 above), for */
/* the lane-wise loops whose bits do not depend on the width (fma chains, one per lane).      */
/* ------------------------------------------------------------------------------------------ */

#if defined(LOOM_CPU_AVX2) && defined(__AVX512F__)
#define LW_N    16
#define LW_REGS 32 /* vector registers: how many accumulators a kernel may keep */
typedef __m512 lw;
static inline lw lw_set1(float x) {
    return _mm512_set1_ps(x);
}
static inline lw lw_load(const float *p) {
    return _mm512_loadu_ps(p);
}
static inline void lw_store(float *p, lw v) {
    _mm512_storeu_ps(p, v);
}
static inline lw lw_mul(lw a, lw b) {
    return _mm512_mul_ps(a, b);
}
static inline lw lw_fma(lw a, lw b, lw c) {
    return _mm512_fmadd_ps(a, b, c);
}
#else
#define LW_N    LV_N
#define LW_REGS 16
typedef lv8 lw;
static inline lw lw_set1(float x) {
    return lv_set1(x);
}
static inline lw lw_load(const float *p) {
    return lv_load(p);
}
static inline void lw_store(float *p, lw v) {
    lv_store(p, v);
}
static inline lw lw_mul(lw a, lw b) {
    return lv_mul(a, b);
}
static inline lw lw_fma(lw a, lw b, lw c) {
    return lv_fma(a, b, c);
}
#endif
