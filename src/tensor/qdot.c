/* qdot.c — one instruction-set variant's table of kernels (loom__qdot_isa, qdot_internal.h):
 * the activation quantizers (q8_0, q8_1, q8_K, f16, bf16, f32), the dot products of the float
 * weight types (f16 x f16, bf16 x bf16, f32 x f32), and the block-format kernels of
 * qdot_legacy.c, qdot_k.c and qgemm_*.c. Compiled once per variant (CMakeLists.txt);
 * qdot_dispatch.c picks the variant the CPU runs and holds the entry points of qdot.h.
 *
 * Float dots: both paths add w[i] * x[i] into lane i % 32, sequentially per lane, and fold the
 * lanes pairwise (16, 8, 4, 2, 1 apart), which makes them bit-identical. The f16 SIMD path may
 * fuse the multiply-add: a product of two halves is exact in float32 (22 significant bits, no
 * underflow or overflow), so fusing changes nothing; bfloat16 products can underflow, so its
 * SIMD path multiplies and adds separately as the portable one does. */
#include "tensor/qdot.h"

#include <string.h>

#include "tensor/qdot_internal.h"
#include "tensor/qgemm.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ------------------------------------------------------------------------------------------ */
/* Rounding helpers                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* Nearest integer to v, ties to even, clamped to [-127, 127]; NaN gives 0. Written with floorf
 * rather than rintf so it does not depend on the floating-point environment's rounding mode
 * (the SIMD paths use an explicit round-to-nearest-even instruction). v - floorf(v) is exact. */
static inline int8_t code_rne(float v) {
    if (!(v == v)) return 0;
    v = v > 127.0f ? 127.0f : v;
    v = v < -127.0f ? -127.0f : v;
    float f = floorf(v);
    float r = v - f;
    int32_t q = (int32_t)f;
    q += (r > 0.5f) | ((r == 0.5f) & (q & 1));
    return (int8_t)q;
}

/* Largest |x[j]| of n values, NaNs ignored. */
static inline float abs_max(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* ------------------------------------------------------------------------------------------ */
/* Activation quantizers: portable                                                            */
/* ------------------------------------------------------------------------------------------ */

/* q8_0 / q8_1 block: d = amax / 127 (stored as f16), codes rne(x * (127 / amax)). Returns the
 * sum of the codes and the float32 d (for q8_1's s). */
static inline int32_t quant_block_8bit(const float *x, int8_t qs[32], uint16_t *d16, float *d_out) {
    float amax = abs_max(x, 32);
    float d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < 32; j++) {
        qs[j] = code_rne(x[j] * id);
        sum += qs[j];
    }
    *d16 = loom__f32_to_f16(d);
    *d_out = d;
    return sum;
}

static void quant_q8_0_portable(const float *x, void *dst, int64_t n) {
    loom__block_q8_0 *y = (loom__block_q8_0 *)dst;
    for (int64_t b = 0; b < n / LOOM_QK_LEGACY; b++) {
        float d;
        (void)quant_block_8bit(x + b * LOOM_QK_LEGACY, y[b].qs, &y[b].d, &d);
    }
}

static void quant_q8_1_portable(const float *x, void *dst, int64_t n) {
    loom__block_q8_1 *y = (loom__block_q8_1 *)dst;
    for (int64_t b = 0; b < n / LOOM_QK_LEGACY; b++) {
        float d;
        int32_t sum = quant_block_8bit(x + b * LOOM_QK_LEGACY, y[b].qs, &y[b].d, &d);
        y[b].s = loom__f32_to_f16((float)sum * d);
    }
}

/* q8_K block: max = the first value of largest magnitude, codes rne(x * (-127 / max)) capped at
 * 127, d = 1 / (-127 / max); an all-zero block is all zeros. */
static void quant_q8_K_portable(const float *x, void *dst, int64_t n) {
    loom__block_q8_K *y = (loom__block_q8_K *)dst;
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, x += LOOM_QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < LOOM_QK_K; j++) {
            float a = fabsf(x[j]);
            if (a > amax) {
                amax = a;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < LOOM_QK_K; j++) y[b].qs[j] = code_rne(iscale * x[j]);
        for (int g = 0; g < LOOM_QK_K / 16; g++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++) s += y[b].qs[16 * g + l];
            y[b].bsums[g] = (int16_t)s; /* |s| <= 16 * 127 */
        }
        y[b].d = 1.0f / iscale;
    }
}

/* q8_K on 8 lanes, the same bits as quant_q8_K_portable: amax is the largest |x| with NaNs
 * ignored (max is exact, so any order of comparisons gives the same value), max the first value
 * whose magnitude equals it (what the portable strict > keeps), and the codes go through the same
 * product, NaN -> 0, clamp and round-to-nearest-even as code_rne. */
#if defined(LOOM_QDOT_AVX2)

static inline float q8K_abs_max_avx2(const float *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (int j = 0; j < LOOM_QK_K; j += 32)
        for (int k = 0; k < 4; k++) /* max(NaN, m) is m */
            m[k] = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j + 8 * k)), m[k]);
    __m256 v = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Index of the first x[j] with |x[j]| == amax (one exists: amax is one of the |x[j]|). */
static inline int q8K_first_at_avx2(const float *x, float amax) {
    const __m256 sign = _mm256_set1_ps(-0.0f), target = _mm256_set1_ps(amax);
    for (int j = 0; j < LOOM_QK_K; j += 8) {
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j));
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(a, target, _CMP_EQ_OQ));
        if (mask != 0) return j + __builtin_ctz((unsigned)mask);
    }
    return 0; /* not reached */
}

/* Codes of x[0..32) into qs, and as int32 into q (values 0..7, 8..15, 16..23, 24..31). */
static inline void q8K_codes32_avx2(const float *x, __m256 iscale, int8_t qs[32], __m256i q[4]) {
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    for (int k = 0; k < 4; k++) {
        __m256 p = _mm256_mul_ps(iscale, _mm256_loadu_ps(x + 8 * k));
        p = _mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q)); /* NaN -> 0 */
        p = _mm256_min_ps(_mm256_max_ps(p, lo), hi);
        q[k] =
            _mm256_cvtps_epi32(_mm256_round_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    /* packs interleave 128-bit halves; the permute restores value order */
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, b);
}

static void quant_q8_K_avx2(const float *x, void *dst, int64_t n) {
    loom__block_q8_K *y = (loom__block_q8_K *)dst;
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, x += LOOM_QK_K) {
        const float amax = q8K_abs_max_avx2(x);
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.0f / x[q8K_first_at_avx2(x, amax)];
        const __m256 vs = _mm256_set1_ps(iscale);
        __m256i g[LOOM_QK_K / 16]; /* g[i]: lanes summing to bsums[i] */
        for (int j = 0; j < LOOM_QK_K; j += 32) {
            __m256i q[4];
            q8K_codes32_avx2(x + j, vs, y[b].qs + j, q);
            g[j / 16] = _mm256_add_epi32(q[0], q[1]);
            g[j / 16 + 1] = _mm256_add_epi32(q[2], q[3]);
        }
        for (int h = 0; h < 2; h++) { /* |sum| <= 16 * 127: packs does not saturate */
            __m256i s = loom__qd_hsum8x8_epi32(g + 8 * h);
            __m128i s16 =
                _mm_packs_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            _mm_storeu_si128((__m128i *)(y[b].bsums + 8 * h), s16);
        }
        y[b].d = 1.0f / iscale;
    }
}

#define QUANT_Q8_K_SIMD quant_q8_K_avx2
#else
#define QUANT_Q8_K_SIMD NULL
#endif

static void quant_f16_row(const float *x, void *dst, int64_t n) {
    uint16_t *h = (uint16_t *)dst;
    for (int64_t i = 0; i < n; i++) h[i] = loom__f32_to_f16(x[i]);
}

#if defined(LOOM_QDOT_AVX2)
/* F16C's conversion rounds to nearest even, saturates to infinity from 65520 and keeps a NaN's
 * sign and top payload bits with the quiet bit set: loom__f32_to_f16's results, bit for bit
 * (test_f16_simd_vs_portable sweeps every class of input). The scalar conversion was 8% of an
 * F16 model's prompt processing. */
static void quant_f16_row_f16c(const float *x, void *dst, int64_t n) {
    uint16_t *h = (uint16_t *)dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) h[i] = loom__f32_to_f16(x[i]);
}
#define QUANT_F16_SIMD quant_f16_row_f16c
#else
#define QUANT_F16_SIMD NULL
#endif

static void quant_bf16_row(const float *x, void *dst, int64_t n) {
    uint16_t *h = (uint16_t *)dst;
    for (int64_t i = 0; i < n; i++) h[i] = loom__f32_to_bf16(x[i]);
}

static void quant_f32_row(const float *x, void *dst, int64_t n) {
    memcpy(dst, x, (size_t)n * sizeof(float));
}

/* ------------------------------------------------------------------------------------------ */
/* Activation quantizers: AVX2 (q8_0, q8_1; the same operations on 8 lanes)                   */
/* ------------------------------------------------------------------------------------------ */
#if defined(LOOM_QDOT_AVX2)

/* Codes of 32 values into qs; returns the sum of the codes (for q8_1). */
static inline int32_t quant_block_8bit_avx2(const float *x, int8_t qs[32], uint16_t *d16,
                                            float *d_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), m); /* NaN lanes keep m */
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const float d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i q[4];
    for (int k = 0; k < 4; k++) {
        __m256 p = _mm256_mul_ps(v[k], id);
        p = _mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q)); /* NaN -> 0 */
        p = _mm256_min_ps(_mm256_max_ps(p, lo), hi);
        q[k] =
            _mm256_cvtps_epi32(_mm256_round_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    /* Pack 4 x 8 int32 to 32 int8 in order: packs interleave 128-bit halves, a permute fixes it. */
    __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i b = _mm256_packs_epi16(w01, w23);
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, b);
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    *d16 = loom__f32_to_f16(d);
    *d_out = d;
    return loom__qd_hsum_epi32(s);
}

static void quant_q8_0_avx2(const float *x, void *dst, int64_t n) {
    loom__block_q8_0 *y = (loom__block_q8_0 *)dst;
    for (int64_t b = 0; b < n / LOOM_QK_LEGACY; b++) {
        float d;
        (void)quant_block_8bit_avx2(x + b * LOOM_QK_LEGACY, y[b].qs, &y[b].d, &d);
    }
}

static void quant_q8_1_avx2(const float *x, void *dst, int64_t n) {
    loom__block_q8_1 *y = (loom__block_q8_1 *)dst;
    for (int64_t b = 0; b < n / LOOM_QK_LEGACY; b++) {
        float d;
        int32_t sum = quant_block_8bit_avx2(x + b * LOOM_QK_LEGACY, y[b].qs, &y[b].d, &d);
        y[b].s = loom__f32_to_f16((float)sum * d);
    }
}

#define QUANT_Q8_0_SIMD quant_q8_0_avx2
#define QUANT_Q8_1_SIMD quant_q8_1_avx2
#else
#define QUANT_Q8_0_SIMD NULL
#define QUANT_Q8_1_SIMD NULL
#endif

/* ------------------------------------------------------------------------------------------ */
/* Float dots: portable                                                                       */
/* ------------------------------------------------------------------------------------------ */

#define FD_LANES 32

/* Adds the tail [full, n) into lanes 0.. and folds the lanes pairwise. */
static inline float fd_finish(float acc[FD_LANES], const uint16_t *w, const uint16_t *x,
                              int64_t full, int64_t n, float (*cvt)(uint16_t)) {
    for (int64_t i = full; i < n; i++) acc[i - full] += cvt(w[i]) * cvt(x[i]);
    for (int width = FD_LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++) acc[j] += acc[j + width];
    return acc[0];
}

LOOM__QINLINE float fd_dot_portable(const uint16_t *w, const uint16_t *x, int64_t n,
                                    float (*cvt)(uint16_t)) {
    float acc[FD_LANES] = {0};
    const int64_t full = n - n % FD_LANES;
    for (int64_t i = 0; i < full; i += FD_LANES)
        for (int j = 0; j < FD_LANES; j++) acc[j] += cvt(w[i + j]) * cvt(x[i + j]);
    return fd_finish(acc, w, x, full, n, cvt);
}

static float dot_f16_portable(const void *w, const void *x, int64_t n) {
    return fd_dot_portable(w, x, n, loom__f16_to_f32);
}

static float dot_bf16_portable(const void *w, const void *x, int64_t n) {
    return fd_dot_portable(w, x, n, loom__bf16_to_f32);
}

/* f32 x f32 (never used by the matmul, which keeps f32 weights on its float path): the same
 * lanes, products rounded (no SIMD variant, so nothing to match). */
static float dot_f32_portable(const void *w_row, const void *x_act, int64_t n) {
    const float *w = (const float *)w_row, *x = (const float *)x_act;
    float acc[FD_LANES] = {0};
    const int64_t full = n - n % FD_LANES;
    for (int64_t i = 0; i < full; i += FD_LANES)
        for (int j = 0; j < FD_LANES; j++) acc[j] += w[i + j] * x[i + j];
    for (int64_t i = full; i < n; i++) acc[i - full] += w[i] * x[i];
    for (int width = FD_LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++) acc[j] += acc[j + width];
    return acc[0];
}

/* ------------------------------------------------------------------------------------------ */
/* Float dots: SIMD (4 x 8 or 2 x 16 lanes = lanes i % 32)                                    */
/* ------------------------------------------------------------------------------------------ */
#if defined(LOOM_QDOT_AVX512)

LOOM__QINLINE __m512 f16x16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
LOOM__QINLINE __m512 bf16x16(const uint16_t *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

#define FD_DOT_SIMD(name, load, cvt, madd)                                                         \
    static float name(const void *w_row, const void *x_act, int64_t n) {                           \
        const uint16_t *w = (const uint16_t *)w_row, *x = (const uint16_t *)x_act;                 \
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();                                 \
        const int64_t full = n - n % FD_LANES;                                                     \
        for (int64_t i = 0; i < full; i += FD_LANES) {                                             \
            loom__qd_prefetch(w + i, FD_LANES * sizeof(uint16_t));                                 \
            a0 = madd(load(w + i), load(x + i), a0);                                               \
            a1 = madd(load(w + i + 16), load(x + i + 16), a1);                                     \
        }                                                                                          \
        float acc[FD_LANES];                                                                       \
        _mm512_storeu_ps(acc, a0);                                                                 \
        _mm512_storeu_ps(acc + 16, a1);                                                            \
        return fd_finish(acc, w, x, full, n, cvt);                                                 \
    }
LOOM__QINLINE __m512 mul_add16(__m512 a, __m512 b, __m512 c) {
    return _mm512_add_ps(c, _mm512_mul_ps(a, b));
}
FD_DOT_SIMD(dot_f16_simd, f16x16, loom__f16_to_f32, _mm512_fmadd_ps)
FD_DOT_SIMD(dot_bf16_simd, bf16x16, loom__bf16_to_f32, mul_add16)
#define DOT_F16_SIMD  dot_f16_simd
#define DOT_BF16_SIMD dot_bf16_simd

#elif defined(LOOM_QDOT_AVX2)

LOOM__QINLINE __m256 f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
LOOM__QINLINE __m256 bf16x8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

#define FD_DOT_SIMD(name, load, cvt, madd)                                                         \
    static float name(const void *w_row, const void *x_act, int64_t n) {                           \
        const uint16_t *w = (const uint16_t *)w_row, *x = (const uint16_t *)x_act;                 \
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),              \
                       _mm256_setzero_ps()};                                                       \
        const int64_t full = n - n % FD_LANES;                                                     \
        for (int64_t i = 0; i < full; i += FD_LANES) {                                             \
            loom__qd_prefetch(w + i, FD_LANES * sizeof(uint16_t));                                 \
            for (int k = 0; k < 4; k++)                                                            \
                a[k] = madd(load(w + i + 8 * k), load(x + i + 8 * k), a[k]);                       \
        }                                                                                          \
        float acc[FD_LANES];                                                                       \
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(acc + 8 * k, a[k]);                           \
        return fd_finish(acc, w, x, full, n, cvt);                                                 \
    }
LOOM__QINLINE __m256 mul_add8(__m256 a, __m256 b, __m256 c) {
    return _mm256_add_ps(c, _mm256_mul_ps(a, b));
}
FD_DOT_SIMD(dot_f16_simd, f16x8, loom__f16_to_f32, _mm256_fmadd_ps)
FD_DOT_SIMD(dot_bf16_simd, bf16x8, loom__bf16_to_f32, mul_add8)
#define DOT_F16_SIMD  dot_f16_simd
#define DOT_BF16_SIMD dot_bf16_simd

#else
#define DOT_F16_SIMD  NULL
#define DOT_BF16_SIMD NULL
#endif

/* ------------------------------------------------------------------------------------------ */
/* Tables and the selection point                                                             */
/* ------------------------------------------------------------------------------------------ */

static const loom__qdot_entry entry_f32 = {LOOM_TYPE_F32, dot_f32_portable, NULL};
static const loom__qdot_entry entry_f16 = {LOOM_TYPE_F16, dot_f16_portable, DOT_F16_SIMD};
static const loom__qdot_entry entry_bf16 = {LOOM_TYPE_BF16, dot_bf16_portable, DOT_BF16_SIMD};

static const loom__qdot_entry *dot_entry(uint32_t weight_type) {
    switch (weight_type) {
    case LOOM_TYPE_F32:
        return &entry_f32;
    case LOOM_TYPE_F16:
        return &entry_f16;
    case LOOM_TYPE_BF16:
        return &entry_bf16;
    default:
        break;
    }
    const loom__qdot_entry *e = LOOM_ISA_SYM(loom__qdot_legacy)(weight_type);
    return e ? e : LOOM_ISA_SYM(loom__qdot_kquant)(weight_type);
}

typedef struct quant_entry {
    loom__quantize_act_fn portable;
    loom__quantize_act_fn simd; /* NULL: the portable one */
} quant_entry;

static const quant_entry *quant_entry_of(uint32_t act_type) {
    static const quant_entry q8_0 = {quant_q8_0_portable, QUANT_Q8_0_SIMD};
    static const quant_entry q8_1 = {quant_q8_1_portable, QUANT_Q8_1_SIMD};
    static const quant_entry q8_K = {quant_q8_K_portable, QUANT_Q8_K_SIMD};
    static const quant_entry f16 = {quant_f16_row, QUANT_F16_SIMD};
    static const quant_entry bf16 = {quant_bf16_row, NULL};
    static const quant_entry f32 = {quant_f32_row, NULL};
    switch (act_type) {
    case LOOM_TYPE_Q8_0:
        return &q8_0;
    case LOOM_TYPE_Q8_1:
        return &q8_1;
    case LOOM_TYPE_Q8_K:
        return &q8_K;
    case LOOM_TYPE_F16:
        return &f16;
    case LOOM_TYPE_BF16:
        return &bf16;
    case LOOM_TYPE_F32:
        return &f32;
    default:
        return NULL;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* This variant's table (qdot_dispatch.c chooses among the variants)                          */
/* ------------------------------------------------------------------------------------------ */

#if defined(LOOM_QDOT_AVX512)
#define ISA_NAME "avx512"
#elif defined(LOOM_QDOT_AVX2) && defined(LOOM_QDOT_VNNI)
#define ISA_NAME "avx2-vnni"
#elif defined(LOOM_QDOT_AVX2)
#define ISA_NAME "avx2"
#else
#define ISA_NAME "portable"
#endif

static loom__vec_dot_q_fn isa_dot(uint32_t weight_type) {
    const loom__qdot_entry *e = dot_entry(weight_type);
    return e ? (e->simd ? e->simd : e->portable) : NULL;
}

static loom__vec_dot_q_fn isa_dot_portable(uint32_t weight_type) {
    const loom__qdot_entry *e = dot_entry(weight_type);
    return e ? e->portable : NULL;
}

static bool isa_act_type(uint32_t weight_type, uint32_t *act_type) {
    const loom__qdot_entry *e = dot_entry(weight_type);
    if (e) *act_type = e->act_type;
    return e != NULL;
}

static loom__quantize_act_fn isa_quant(uint32_t act_type) {
    const quant_entry *e = quant_entry_of(act_type);
    return e ? (e->simd ? e->simd : e->portable) : NULL;
}

static loom__quantize_act_fn isa_quant_portable(uint32_t act_type) {
    const quant_entry *e = quant_entry_of(act_type);
    return e ? e->portable : NULL;
}

static const loom__qgemm_kernels *isa_qgemm(uint32_t weight_type) {
    const loom__qgemm_kernels *k = LOOM_ISA_SYM(loom__qgemm_legacy)(weight_type);
    if (!k) k = LOOM_ISA_SYM(loom__qgemm_kquant)(weight_type);
    return k ? k : LOOM_ISA_SYM(loom__qgemm_float)(weight_type);
}

static const loom__qgemm_lanes *isa_lanes(uint32_t weight_type) {
    const loom__qgemm_lanes *k = LOOM_ISA_SYM(loom__qgemm_lanes_legacy)(weight_type);
    return k ? k : LOOM_ISA_SYM(loom__qgemm_lanes_kquant)(weight_type);
}

const loom__qdot_isa *LOOM_ISA_SYM(loom__qdot_isa)(void) {
    static const loom__qdot_isa isa = {
        .name = ISA_NAME,
        .act_type = isa_act_type,
        .dot = isa_dot,
        .dot_portable = isa_dot_portable,
        .quant = isa_quant,
        .quant_portable = isa_quant_portable,
        .qgemm = isa_qgemm,
        .lanes = isa_lanes,
    };
    return &isa;
}
