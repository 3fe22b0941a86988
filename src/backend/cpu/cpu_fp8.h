/* cpu_fp8.h — the CPU matmul's loops over FP8 weight rows (LOOM_TYPE_FP8_E4M3_ROWS,
 * tensor/fp8_rows.h): a row's codes widened to float32 units (E4M3 value * 2^-8), and the dot
 * of a row's units with a float32 token read straight from the codes.
 *
 * A code's unit is one F16C conversion away: sign-extend the byte to 16 bits, shift left by 7
 * and clear bit 14, which gives loom__fp8_e4m3_to_f16_scaled_bits (sign at bit 15, exponent
 * and mantissa at bits 13..7), then widen the halves 8 at a time. VCVTPH2PS ignores MXCSR's
 * DAZ, so a host application's flush-to-zero settings cannot touch the subnormal codes.
 *
 * loom__cpu_fp8_dot(codes, x, n) has the bits of loom__cpu_dot(units, x, n) (cpu_vec.h) over
 * the row's decoded units: the same 4 + 1 accumulators, the same fused multiply-adds in the
 * same order, the same reduction and scalar tail. So a matmul may read the codes in place
 * for a few tokens and decode a group of rows once for many, and an output still has the
 * same bits whatever the number of tokens (batch invariance). Without AVX2, FMA and F16C
 * there is no in-place dot (LOOM_CPU_FP8_IN_PLACE undefined): rows are always decoded. With
 * AVX-512 (BW, DQ) the loops take 32 codes a step in 512-bit registers, each holding two of
 * loom__cpu_dot's 256-bit accumulators side by side: the same lanes, the same bits. */
#pragma once

#include "backend/cpu/cpu_vec.h"

#include "tensor/fp8_rows.h"

#include <stdint.h>

#if defined(LOOM_CPU_AVX2) && defined(__F16C__)
#define LOOM_CPU_FP8_IN_PLACE 1

/* The halves of 16 codes' units (one 128-bit load). */
static inline __m256i loom__cpu_fp8_halves16(const uint8_t *c) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)c));
    return _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBF80));
}

/* The units of 8 codes (one 64-bit load). */
static inline __m256 loom__cpu_fp8_units8(const uint8_t *c) {
    const __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)c));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16((short)0xBF80)));
}

/* Rows stream from memory once per call while their arithmetic is short: at every 64 bytes
 * of a row, ask for the line LOOM_CPU_FP8_AHEAD bytes on (a few rows later), as the quantized
 * kernels do (tensor/qdot_internal.h). Spread over the loop rather than a row's lines at
 * once before it (Gemma 3's LM head, 168 MB of rows, one thread: about 25 ms with the
 * prefetches at each row's start, 19-21 ms spread). Hints past a tensor's end are harmless. */
#define LOOM_CPU_FP8_AHEAD 4096

static inline void loom__cpu_fp8_prefetch(const uint8_t *c, int64_t i) {
    if ((i & 63) == 0) _mm_prefetch((const char *)c + i + LOOM_CPU_FP8_AHEAD, _MM_HINT_T0);
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
/* The units of 32 codes (one 256-bit load) as two 512-bit vectors: codes 0..15, 16..31. */
static inline void loom__cpu_fp8_units32(const uint8_t *c, __m512 *lo, __m512 *hi) {
    const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)c));
    const __m512i h = _mm512_and_si512(_mm512_slli_epi16(w, 7), _mm512_set1_epi16((short)0xBF80));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}
#endif

/* The steps of loom__cpu_dot after its 32-wide loop, for row c from i on: the 8-wide loop
 * into s0, the reduction, the scalar tail. */
static inline float loom__cpu_fp8_dot_end(const uint8_t *c, const float *b, int64_t n, int64_t i,
                                          __m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(loom__cpu_fp8_units8(c + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float sum = _mm_cvtss_f32(h);
    for (; i < n; i++) sum += loom__fp8_rows_unit(c[i]) * b[i];
    return sum;
}

/* out[r] = sum_i unit(c[r][i]) * b[i] for the NR rows c[0 .. NR), each in loom__cpu_dot's
 * order. A row alone is n / 32 dependent multiply-adds on each of its accumulators, so the
 * FMA latency sets its pace; NR rows at once give the units independent chains to overlap
 * (rows of 640 held in L2, one thread: 9.7 -> 11.5 G multiply-adds/s). With AVX-512 a 512-bit
 * accumulator holds two of the 256-bit ones side by side (s0 | s1, s2 | s3): each lane sees
 * the multiply-adds it would see in 256-bit registers, in the same order. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define LOOM_CPU_FP8_NR 4
#define LOOM__CPU_FP8_DOT_ROWS(name, NR)                                                           \
    static inline void name(const uint8_t *const *c, const float *b, int64_t n, float *out) {      \
        __m512 s01[NR], s23[NR];                                                                   \
        for (int r = 0; r < NR; r++) s01[r] = s23[r] = _mm512_setzero_ps();                        \
        int64_t i = 0;                                                                             \
        for (; i + 32 <= n; i += 32) {                                                             \
            const __m512 x01 = _mm512_loadu_ps(b + i), x23 = _mm512_loadu_ps(b + i + 16);          \
            for (int r = 0; r < NR; r++) {                                                         \
                loom__cpu_fp8_prefetch(c[r], i);                                                   \
                __m512 a01, a23;                                                                   \
                loom__cpu_fp8_units32(c[r] + i, &a01, &a23);                                       \
                s01[r] = _mm512_fmadd_ps(a01, x01, s01[r]);                                        \
                s23[r] = _mm512_fmadd_ps(a23, x23, s23[r]);                                        \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < NR; r++)                                                               \
            out[r] = loom__cpu_fp8_dot_end(                                                        \
                c[r], b, n, i, _mm512_castps512_ps256(s01[r]), _mm512_extractf32x8_ps(s01[r], 1),  \
                _mm512_castps512_ps256(s23[r]), _mm512_extractf32x8_ps(s23[r], 1));                \
    }
#else
#define LOOM_CPU_FP8_NR 2 /* 8 of the 16 ymm registers as accumulators */
#define LOOM__CPU_FP8_DOT_ROWS(name, NR)                                                           \
    static inline void name(const uint8_t *const *c, const float *b, int64_t n, float *out) {      \
        __m256 s[NR][4];                                                                           \
        for (int r = 0; r < NR; r++) s[r][0] = s[r][1] = s[r][2] = s[r][3] = _mm256_setzero_ps();  \
        int64_t i = 0;                                                                             \
        for (; i + 32 <= n; i += 32) {                                                             \
            for (int r = 0; r < NR; r++) {                                                         \
                loom__cpu_fp8_prefetch(c[r], i);                                                   \
                const __m256i h0 = loom__cpu_fp8_halves16(c[r] + i);                               \
                const __m256i h1 = loom__cpu_fp8_halves16(c[r] + i + 16);                          \
                s[r][0] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h0)),             \
                                          _mm256_loadu_ps(b + i), s[r][0]);                        \
                s[r][1] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h0, 1)),        \
                                          _mm256_loadu_ps(b + i + 8), s[r][1]);                    \
                s[r][2] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h1)),             \
                                          _mm256_loadu_ps(b + i + 16), s[r][2]);                   \
                s[r][3] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h1, 1)),        \
                                          _mm256_loadu_ps(b + i + 24), s[r][3]);                   \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < NR; r++)                                                               \
            out[r] = loom__cpu_fp8_dot_end(c[r], b, n, i, s[r][0], s[r][1], s[r][2], s[r][3]);     \
    }
#endif

LOOM__CPU_FP8_DOT_ROWS(loom__cpu_fp8_dot_rows, LOOM_CPU_FP8_NR)
LOOM__CPU_FP8_DOT_ROWS(loom__cpu_fp8_dot_row1, 1)

/* sum_i unit(c[i]) * b[i], in loom__cpu_dot's order. */
static inline float loom__cpu_fp8_dot(const uint8_t *c, const float *b, int64_t n) {
    float out;
    loom__cpu_fp8_dot_row1(&c, b, n, &out);
    return out;
}

/* ---- many tokens: rows widened once into float32 units ---------------------------------- */

/* loom__cpu_dot(u, b, n) after its 32-wide loop, from i on. */
static inline float loom__cpu_fp8_units_dot_end(const float *u, const float *b, int64_t n,
                                                int64_t i, __m256 s0, __m256 s1, __m256 s2,
                                                __m256 s3) {
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(u + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float sum = _mm_cvtss_f32(h);
    for (; i < n; i++) sum += u[i] * b[i];
    return sum;
}

/* out[r * NT + t] = loom__cpu_dot(u[r], b[t], n), bit for bit, for a block of NR widened rows
 * and NT tokens: NR * NT independent chains, each row's units loaded once per step for all
 * NT tokens (the rows come from the thread's scratch, the tokens from the activations). With
 * AVX-512, 2 rows x 4 tokens: Gemma 3's LM head over 128 tokens, one thread, took 1.42 s one
 * pair at a time, 0.98 s in blocks of 4 x 2, 0.90 s in blocks of 2 x 4. */
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define LOOM_CPU_FP8_BLOCK_NR 2
#define LOOM_CPU_FP8_BLOCK_NT 4 /* 16 of the 32 zmm registers as accumulators */
#define LOOM__CPU_FP8_UNITS_BLOCK(name, NR, NT)                                                    \
    static inline void name(const float *const *u, const float *const *b, int64_t n, float *out) { \
        __m512 s01[NR][NT], s23[NR][NT];                                                           \
        for (int r = 0; r < NR; r++)                                                               \
            for (int t = 0; t < NT; t++) s01[r][t] = s23[r][t] = _mm512_setzero_ps();              \
        int64_t i = 0;                                                                             \
        for (; i + 32 <= n; i += 32) {                                                             \
            __m512 x01[NT], x23[NT];                                                               \
            for (int t = 0; t < NT; t++) {                                                         \
                x01[t] = _mm512_loadu_ps(b[t] + i);                                                \
                x23[t] = _mm512_loadu_ps(b[t] + i + 16);                                           \
            }                                                                                      \
            for (int r = 0; r < NR; r++) {                                                         \
                const __m512 a01 = _mm512_loadu_ps(u[r] + i),                                      \
                             a23 = _mm512_loadu_ps(u[r] + i + 16);                                 \
                for (int t = 0; t < NT; t++) {                                                     \
                    s01[r][t] = _mm512_fmadd_ps(a01, x01[t], s01[r][t]);                           \
                    s23[r][t] = _mm512_fmadd_ps(a23, x23[t], s23[r][t]);                           \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < NR; r++)                                                               \
            for (int t = 0; t < NT; t++)                                                           \
                out[r * NT + t] = loom__cpu_fp8_units_dot_end(                                     \
                    u[r], b[t], n, i, _mm512_castps512_ps256(s01[r][t]),                           \
                    _mm512_extractf32x8_ps(s01[r][t], 1), _mm512_castps512_ps256(s23[r][t]),       \
                    _mm512_extractf32x8_ps(s23[r][t], 1));                                         \
    }
#else
#define LOOM_CPU_FP8_BLOCK_NR 2
#define LOOM_CPU_FP8_BLOCK_NT 1 /* 8 of the 16 ymm registers as accumulators */
#define LOOM__CPU_FP8_UNITS_BLOCK(name, NR, NT)                                                    \
    static inline void name(const float *const *u, const float *const *b, int64_t n, float *out) { \
        __m256 s[NR][NT][4];                                                                       \
        for (int r = 0; r < NR; r++)                                                               \
            for (int t = 0; t < NT; t++)                                                           \
                for (int k = 0; k < 4; k++) s[r][t][k] = _mm256_setzero_ps();                      \
        int64_t i = 0;                                                                             \
        for (; i + 32 <= n; i += 32)                                                               \
            for (int r = 0; r < NR; r++)                                                           \
                for (int t = 0; t < NT; t++)                                                       \
                    for (int k = 0; k < 4; k++)                                                    \
                        s[r][t][k] =                                                               \
                            _mm256_fmadd_ps(_mm256_loadu_ps(u[r] + i + 8 * k),                     \
                                            _mm256_loadu_ps(b[t] + i + 8 * k), s[r][t][k]);        \
        for (int r = 0; r < NR; r++)                                                               \
            for (int t = 0; t < NT; t++)                                                           \
                out[r * NT + t] = loom__cpu_fp8_units_dot_end(u[r], b[t], n, i, s[r][t][0],        \
                                                              s[r][t][1], s[r][t][2], s[r][t][3]); \
    }
#endif

LOOM__CPU_FP8_UNITS_BLOCK(loom__cpu_fp8_units_block, LOOM_CPU_FP8_BLOCK_NR, LOOM_CPU_FP8_BLOCK_NT)
LOOM__CPU_FP8_UNITS_BLOCK(loom__cpu_fp8_units_block_r1, 1, LOOM_CPU_FP8_BLOCK_NT)
LOOM__CPU_FP8_UNITS_BLOCK(loom__cpu_fp8_units_block_t1, LOOM_CPU_FP8_BLOCK_NR, 1)
LOOM__CPU_FP8_UNITS_BLOCK(loom__cpu_fp8_units_block_1, 1, 1)
#endif

/* dst[0..n) = the units of codes c[0..n). */
static inline void loom__cpu_fp8_units(const uint8_t *c, float *dst, int64_t n) {
    int64_t i = 0;
#if defined(LOOM_CPU_FP8_IN_PLACE)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
    for (; i + 32 <= n; i += 32) {
        __m512 lo, hi;
        loom__cpu_fp8_units32(c + i, &lo, &hi);
        _mm512_storeu_ps(dst + i, lo);
        _mm512_storeu_ps(dst + i + 16, hi);
    }
#endif
    for (; i + 16 <= n; i += 16) {
        const __m256i h = loom__cpu_fp8_halves16(c + i);
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
        _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
    }
#endif
    for (; i < n; i++) dst[i] = loom__fp8_rows_unit(c[i]);
}
