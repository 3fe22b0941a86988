/* cpu_vec.h — the few float vector routines the CPU ops are built from.
 *
 * Each routine has ONE fixed order of operations for a given n, whatever the caller's batch
 * shape or thread count: matmul and attention call loom__cpu_dot once per output element, so
 * an output value is the same bits whether its row is computed alone or in a batch (batch
 * invariance). The AVX2+FMA path and the portable path give (slightly) different results from
 * each other, but a given build always takes the same one.
 *
 * Inputs may be unaligned; loads are unaligned loads. */
#pragma once

#include "tensor/fp16.h"
#include "tensor/quant.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LOOM_CPU_AVX2 1
#endif

/* sum_i a[i] * b[i]. Lanes: 4 independent 8-wide accumulators over blocks of 32, then one
 * 8-wide accumulator over blocks of 8, a fixed-order reduction, then the scalar tail. */
static inline float loom__cpu_dot(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float sum;
#if defined(LOOM_CPU_AVX2)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    sum = _mm_cvtss_f32(h);
#else
    float acc[32] = {0};
    for (; i + 32 <= n; i += 32)
        for (int l = 0; l < 32; l++) acc[l] += a[i + l] * b[i + l];
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; l < 8; l++) acc[l] = (acc[l] + acc[l + 8]) + (acc[l + 16] + acc[l + 24]);
    for (int l = 0; l < 4; l++) acc[l] += acc[l + 4];
    acc[0] += acc[2];
    acc[1] += acc[3];
    sum = acc[0] + acc[1];
#endif
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* y[i] += a * x[i]. Elementwise, so every order gives the same bits. */
static inline void loom__cpu_axpy(float *y, float a, const float *x, int64_t n) {
    int64_t i = 0;
#if defined(LOOM_CPU_AVX2)
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = __builtin_fmaf(a, x[i], y[i]); /* same rounding as the lanes */
#else
    for (; i < n; i++) y[i] += a * x[i];
#endif
}

/* y[i] *= a. */
static inline void loom__cpu_vscale(float *y, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}

/* dst[i] = (float)src[i] for IEEE halves: exact, branch-free (the loop vectorises). */
static inline void loom__cpu_f16_to_f32_row(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = loom__f16_to_f32(src[i]);
}

/* dst[0..n) = row src of type t as float32 (n a whole number of blocks). F32 and F16 take
 * the fast paths above; the other types go through the reference dequantizer. Returns false
 * for a type that cannot be dequantized. */
static inline bool loom__cpu_row_to_f32(uint32_t t, const void *src, float *dst, int64_t n) {
    if (t == LOOM_TYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return true;
    }
    if (t == LOOM_TYPE_F16) {
        loom__cpu_f16_to_f32_row(src, dst, n);
        return true;
    }
    return loom__dequantize_row(t, src, dst, n);
}
