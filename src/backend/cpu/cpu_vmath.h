/* cpu_vmath.h — float32 exp and tanh, and the GLU activations built on them (SiLU, the tanh
 * form of GELU), for the CPU's element-wise ops.
 *
 * Each function exists as a scalar version and, where the compiler targets them, AVX2+FMA (8
 * lanes) and AVX-512 (16 lanes) versions that perform the SAME float operations in the same
 * order: every product-and-sum is one fused multiply-add on every path (fmaf in C: one
 * rounding, an instruction where FMA exists and glibc's exact emulation where it does not),
 * the rest are single IEEE operations. So an element's result is the same bits whichever path
 * computes it — a row's vector body or its scalar tail, whatever the row length, thread split
 * or instruction set — and depends only on its input. Callers must not let the compiler
 * contract the scalar code further (GCC in ISO C mode does not; clang needs FP_CONTRACT OFF).
 *
 * Accuracy against double-precision exp / tanh, measured over all 2^32 float inputs: exp within
 * 1.02 ulp, tanh within 1.34 ulp, subnormal results included (the unit test,
 * tests/backend/test_cpu_elementwise.c, asserts 1.5 and 2 on a dense sweep). NaN in gives NaN out;
 * exp is +inf past ln(FLT_MAX) and decays through the subnormals to +0; tanh saturates to
 * exactly +-1 and keeps the sign of zero. */
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tensor/fp16.h" /* loom__f32_bits, loom__f32_from_bits */

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LOOM_VM_AVX2 1
#if defined(__AVX512F__)
#define LOOM_VM_AVX512 1
#endif
#endif

/* ---- constants ------------------------------------------------------------------------------ */

/* exp's input is clamped to [LO, HI]: exp(89) already overflows and exp(-104) is below half the
 * smallest subnormal, so the clamp changes no result, and it bounds the exponent arithmetic.
 * The clamps are written so a NaN passes through them. */
#define LOOM_VM_EXP_HI 89.0f
#define LOOM_VM_EXP_LO (-104.0f)
/* 1.5 * 2^23: adding it to a float of magnitude < 2^22 rounds it to an integer (to nearest,
 * ties to even), which then sits in the low bits of the sum's mantissa. */
#define LOOM_VM_SHIFT      0x1.8p23f
#define LOOM_VM_SHIFT_BITS 0x4b400000u
#define LOOM_VM_LOG2E      0x1.715476p+0f
/* ln 2 = HI + LO: two fused steps take x - n ln 2 to well below float rounding. */
#define LOOM_VM_LN2_HI 0x1.62e430p-1f
#define LOOM_VM_LN2_LO (-0x1.05c610p-29f)
/* e^r = 1 + r + r^2 (E2 + E3 r + E4 r^2 + E5 r^3 + E6 r^4) on |r| <= ln2 / 2: a minimax fit of
 * the relative error (3e-9 before the coefficients were rounded to float). */
#define LOOM_VM_E2 0x1.fffffcp-2f
#define LOOM_VM_E3 0x1.555492p-3f
#define LOOM_VM_E4 0x1.5558f2p-5f
#define LOOM_VM_E5 0x1.1239d4p-7f
#define LOOM_VM_E6 0x1.6a244cp-10f

/* tanh(x) = x + x^3 (T0 + T1 s + T2 s^2 + T3 s^3 + T4 s^4), s = x^2, for |x| < TANH_SMALL (a
 * minimax fit of the relative error, 7e-9); above it 1 - 2 / (1 + e^(2|x|)), whose rounding
 * errors shrink relative to the result as |x| grows. The polynomial avoids that form's
 * cancellation near 0. */
#define LOOM_VM_TANH_SMALL 0.625f
#define LOOM_VM_T0         (-0x1.555554p-2f)
#define LOOM_VM_T1         0x1.110cb8p-3f
#define LOOM_VM_T2         (-0x1.b8d69ap-5f)
#define LOOM_VM_T3         0x1.558c48p-6f
#define LOOM_VM_T4         (-0x1.8359dep-8f)

/* GELU, tanh form: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))). */
#define LOOM_VM_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define LOOM_VM_GELU_C 0.044715f

/* ---- scalar --------------------------------------------------------------------------------- */

/* e^x = 2^n e^r with n = round(x / ln2), r = x - n ln2, e^r = 1 + (r + r^2 q(r)): its one large
 * rounding is the final + 1. 2^n is applied as two factors 2^n1 2^n2 (n1 + n2 = n, each a
 * normal float), so results in the subnormal range round once, at the last multiply, and
 * overflow gives +inf. k = n + 150 is in [0, 278] after the clamp; for NaN it is garbage,
 * harmlessly (the polynomial is NaN already). */
static inline float loom__vm_expf(float x) {
    x = x > LOOM_VM_EXP_HI ? LOOM_VM_EXP_HI : x;
    x = x < LOOM_VM_EXP_LO ? LOOM_VM_EXP_LO : x;
    const float t = fmaf(x, LOOM_VM_LOG2E, LOOM_VM_SHIFT);
    const float n = t - LOOM_VM_SHIFT;
    float r = fmaf(n, -LOOM_VM_LN2_HI, x);
    r = fmaf(n, -LOOM_VM_LN2_LO, r);
    float q = fmaf(LOOM_VM_E6, r, LOOM_VM_E5);
    q = fmaf(q, r, LOOM_VM_E4);
    q = fmaf(q, r, LOOM_VM_E3);
    q = fmaf(q, r, LOOM_VM_E2);
    const float p = fmaf(r * r, q, r) + 1.0f;
    const uint32_t k = loom__f32_bits(t) - (LOOM_VM_SHIFT_BITS - 150u);
    const uint32_t k1 = k >> 1, k2 = k - k1; /* 2^(k1 - 75) 2^(k2 - 75) = 2^n */
    return p * loom__f32_from_bits((k1 + 52u) << 23) * loom__f32_from_bits((k2 + 52u) << 23);
}

/* Computed on |x| and given x's sign at the end, which keeps tanh(-0) = -0 (x + x^3 P(x^2)
 * on x itself would round -0 to +0). */
static inline float loom__vm_tanhf(float x) {
    const float a = fabsf(x);
    float y;
    if (a < LOOM_VM_TANH_SMALL) {
        const float s = a * a;
        float p = fmaf(LOOM_VM_T4, s, LOOM_VM_T3);
        p = fmaf(p, s, LOOM_VM_T2);
        p = fmaf(p, s, LOOM_VM_T1);
        p = fmaf(p, s, LOOM_VM_T0);
        y = fmaf(a * s, p, a);
    } else { /* NaN lands here too */
        y = 1.0f - 2.0f / (1.0f + loom__vm_expf(a + a));
    }
    return copysignf(y, x);
}

/* x sigma(x) = x / (1 + e^-x). */
static inline float loom__vm_silu(float x) {
    return x / (1.0f + loom__vm_expf(-x));
}

static inline float loom__vm_gelu_tanh(float g) {
    const float inner = LOOM_VM_GELU_K * fmaf(LOOM_VM_GELU_C * g * g, g, g);
    return 0.5f * g * (1.0f + loom__vm_tanhf(inner));
}

/* ---- AVX2 + FMA: the scalar code on 8 lanes ------------------------------------------------- */
#if defined(LOOM_VM_AVX2)

static inline __m256 loom__vm_exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(LOOM_VM_EXP_HI), x); /* min(c, NaN) is the NaN */
    x = _mm256_max_ps(_mm256_set1_ps(LOOM_VM_EXP_LO), x);
    const __m256 t =
        _mm256_fmadd_ps(x, _mm256_set1_ps(LOOM_VM_LOG2E), _mm256_set1_ps(LOOM_VM_SHIFT));
    const __m256 n = _mm256_sub_ps(t, _mm256_set1_ps(LOOM_VM_SHIFT));
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LOOM_VM_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LOOM_VM_LN2_LO), r);
    __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(LOOM_VM_E6), r, _mm256_set1_ps(LOOM_VM_E5));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(LOOM_VM_E4));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(LOOM_VM_E3));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(LOOM_VM_E2));
    const __m256 p =
        _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(r, r), q, r), _mm256_set1_ps(1.0f));
    const __m256i k = _mm256_sub_epi32(_mm256_castps_si256(t),
                                       _mm256_set1_epi32((int)(LOOM_VM_SHIFT_BITS - 150u)));
    const __m256i k1 = _mm256_srli_epi32(k, 1), k2 = _mm256_sub_epi32(k, k1);
    const __m256i bias = _mm256_set1_epi32(52);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* Both branches of loom__vm_tanhf on every lane, a per-lane select, then x's sign. */
static inline __m256 loom__vm_tanh8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 a = _mm256_andnot_ps(sign, x);
    const __m256 s = _mm256_mul_ps(a, a);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(LOOM_VM_T4), s, _mm256_set1_ps(LOOM_VM_T3));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(LOOM_VM_T2));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(LOOM_VM_T1));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(LOOM_VM_T0));
    const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(a, s), p, a);
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = loom__vm_exp8(_mm256_add_ps(a, a));
    const __m256 big =
        _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(one, e)));
    const __m256 is_small = _mm256_cmp_ps(a, _mm256_set1_ps(LOOM_VM_TANH_SMALL), _CMP_LT_OQ);
    const __m256 y = _mm256_blendv_ps(big, small, is_small);
    return _mm256_or_ps(_mm256_andnot_ps(sign, y), _mm256_and_ps(sign, x)); /* copysign */
}

static inline __m256 loom__vm_silu8(__m256 x) {
    const __m256 e = loom__vm_exp8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static inline __m256 loom__vm_gelu_tanh8(__m256 g) {
    const __m256 c3 = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(LOOM_VM_GELU_C), g), g);
    const __m256 inner = _mm256_mul_ps(_mm256_set1_ps(LOOM_VM_GELU_K), _mm256_fmadd_ps(c3, g, g));
    const __m256 t = loom__vm_tanh8(inner);
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g),
                         _mm256_add_ps(_mm256_set1_ps(1.0f), t));
}

#endif /* LOOM_VM_AVX2 */

/* ---- AVX-512: the scalar code on 16 lanes --------------------------------------------------- */
#if defined(LOOM_VM_AVX512)

static inline __m512 loom__vm_exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(LOOM_VM_EXP_HI), x); /* min(c, NaN) is the NaN */
    x = _mm512_max_ps(_mm512_set1_ps(LOOM_VM_EXP_LO), x);
    const __m512 t =
        _mm512_fmadd_ps(x, _mm512_set1_ps(LOOM_VM_LOG2E), _mm512_set1_ps(LOOM_VM_SHIFT));
    const __m512 n = _mm512_sub_ps(t, _mm512_set1_ps(LOOM_VM_SHIFT));
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LOOM_VM_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LOOM_VM_LN2_LO), r);
    __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(LOOM_VM_E6), r, _mm512_set1_ps(LOOM_VM_E5));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(LOOM_VM_E4));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(LOOM_VM_E3));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(LOOM_VM_E2));
    const __m512 p =
        _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(r, r), q, r), _mm512_set1_ps(1.0f));
    const __m512i k = _mm512_sub_epi32(_mm512_castps_si512(t),
                                       _mm512_set1_epi32((int)(LOOM_VM_SHIFT_BITS - 150u)));
    const __m512i k1 = _mm512_srli_epi32(k, 1), k2 = _mm512_sub_epi32(k, k1);
    const __m512i bias = _mm512_set1_epi32(52);
    const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, bias), 23));
    const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, bias), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

/* Sign bits are handled as integers: AVX-512F alone has no float and/or. */
static inline __m512 loom__vm_tanh16(__m512 x) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
    const __m512 s = _mm512_mul_ps(a, a);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(LOOM_VM_T4), s, _mm512_set1_ps(LOOM_VM_T3));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(LOOM_VM_T2));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(LOOM_VM_T1));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(LOOM_VM_T0));
    const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(a, s), p, a);
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 e = loom__vm_exp16(_mm512_add_ps(a, a));
    const __m512 big =
        _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(one, e)));
    const __mmask16 is_small =
        _mm512_cmp_ps_mask(a, _mm512_set1_ps(LOOM_VM_TANH_SMALL), _CMP_LT_OQ);
    const __m512i y = _mm512_castps_si512(_mm512_mask_blend_ps(is_small, big, small));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_andnot_si512(sign, y),
                                               _mm512_and_si512(sign, _mm512_castps_si512(x))));
}

static inline __m512 loom__vm_silu16(__m512 x) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512 e =
        loom__vm_exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), sign)));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

static inline __m512 loom__vm_gelu_tanh16(__m512 g) {
    const __m512 c3 = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(LOOM_VM_GELU_C), g), g);
    const __m512 inner = _mm512_mul_ps(_mm512_set1_ps(LOOM_VM_GELU_K), _mm512_fmadd_ps(c3, g, g));
    const __m512 t = loom__vm_tanh16(inner);
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), g),
                         _mm512_add_ps(_mm512_set1_ps(1.0f), t));
}

#endif /* LOOM_VM_AVX512 */
