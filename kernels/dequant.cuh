/* dequant.cuh — the weight formats the CUDA kernels read in place, decoded 32 values at a time:
 * chunk c of a row is its values [32c, 32c + 32) — one block of the 32-value formats, one
 * eighth of a K-quant super-block. The byte layouts are GGUF's (tensor/quant_layouts.h states
 * them); products are rounded one by one (__fmul_rn, no fused multiply-add) so a decoded value
 * has the bits the CPU's decoder gives it. */
#pragma once

#include "common.cuh"

#include "tensor/fp8.h"

/* Chunk c of a row of k values of type T into v[0..32); values at k and beyond are 0 (plain
 * types only: block formats have whole blocks). */
template <int T>
static __device__ __forceinline__ void loom_dequant32(const uint8_t *row, int64_t c, int64_t k,
                                                      float v[32]);

template <>
__device__ __forceinline__ void loom_dequant32<LOOM_K_F32>(const uint8_t *row, int64_t c, int64_t k,
                                                           float v[32]) {
    const float *r = (const float *)row + 32 * c;
    const int64_t left = k - 32 * c;
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = j < left ? r[j] : 0.0f;
}

template <>
__device__ __forceinline__ void loom_dequant32<LOOM_K_F16>(const uint8_t *row, int64_t c, int64_t k,
                                                           float v[32]) {
    const uint16_t *r = (const uint16_t *)row + 32 * c;
    const int64_t left = k - 32 * c;
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = j < left ? loom_h2f(r[j]) : 0.0f;
}

template <>
__device__ __forceinline__ void loom_dequant32<LOOM_K_BF16>(const uint8_t *row, int64_t c,
                                                            int64_t k, float v[32]) {
    const uint16_t *r = (const uint16_t *)row + 32 * c;
    const int64_t left = k - 32 * c;
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = j < left ? loom_bf2f(r[j]) : 0.0f;
}

/* q8_0: 34 bytes: f16 d, 32 int8 codes; y = d * q. */
template <>
__device__ __forceinline__ void loom_dequant32<LOOM_K_Q8_0>(const uint8_t *row, int64_t c,
                                                            int64_t k, float v[32]) {
    const uint8_t *b = row + 34 * c;
    const float d = loom_h2f(loom_ld16(b));
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = __fmul_rn(d, (float)(int8_t)b[2 + j]);
}

/* q4_0: 18 bytes: f16 d, 16 bytes of nibbles (low: values 0..15, high: 16..31); y = d(q - 8). */
template <>
__device__ __forceinline__ void loom_dequant32<LOOM_K_Q4_0>(const uint8_t *row, int64_t c,
                                                            int64_t k, float v[32]) {
    const uint8_t *b = row + 18 * c;
    const float d = loom_h2f(loom_ld16(b));
#pragma unroll
    for (int j = 0; j < 16; j++) {
        v[j] = __fmul_rn(d, (float)((int)(b[2 + j] & 15u) - 8));
        v[j + 16] = __fmul_rn(d, (float)((int)(b[2 + j] >> 4) - 8));
    }
}

/* q5_0: 22 bytes: f16 d, 32 high bits (little-endian word), nibbles as q4_0; y = d(q - 16). */
template <>
__device__ __forceinline__ void loom_dequant32<LOOM_K_Q5_0>(const uint8_t *row, int64_t c,
                                                            int64_t k, float v[32]) {
    const uint8_t *b = row + 22 * c;
    const float d = loom_h2f(loom_ld16(b));
    const uint32_t qh = loom_ld32(b + 2);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int lo = (int)((b[6 + j] & 15u) | ((qh >> j) & 1u) << 4);
        const int hi = (int)((b[6 + j] >> 4) | ((qh >> (j + 16)) & 1u) << 4);
        v[j] = __fmul_rn(d, (float)(lo - 16));
        v[j + 16] = __fmul_rn(d, (float)(hi - 16));
    }
}

/* The six-bit scale and min of sub-block i of a q4_K / q5_K super-block (12 packed bytes). */
static __device__ __forceinline__ void loom_k4_scale_min(const uint8_t *p, int i, int *sc,
                                                         int *mn) {
    if (i < 4) {
        *sc = p[i] & 63;
        *mn = p[i + 4] & 63;
    } else {
        *sc = (p[i + 4] & 15) | (p[i - 4] >> 6) << 4;
        *mn = (p[i + 4] >> 4) | (p[i] >> 6) << 4;
    }
}

/* q4_K: 144-byte super-blocks of 256: f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles
 * (sub-blocks 2p and 2p+1 are the low and high nibbles of qs[32p .. 32p+32)); sub-block i:
 * y = (d sc_i) q - (dmin mn_i). */
template <>
__device__ __forceinline__ void loom_dequant32<LOOM_K_Q4_K>(const uint8_t *row, int64_t c,
                                                            int64_t k, float v[32]) {
    const uint8_t *b = row + 144 * (c >> 3);
    const int i = (int)(c & 7);
    int sc, mn;
    loom_k4_scale_min(b + 4, i, &sc, &mn);
    const float dl = __fmul_rn(loom_h2f(loom_ld16(b)), (float)sc);
    const float ml = __fmul_rn(loom_h2f(loom_ld16(b + 2)), (float)mn);
    const uint8_t *q = b + 16 + 32 * (i >> 1);
    const int shift = (i & 1) * 4;
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = __fsub_rn(__fmul_rn(dl, (float)((q[j] >> shift) & 15)), ml);
}

/* q5_K: 176 bytes: as q4_K with 32 bytes qh before the nibbles; bit 4 of value 32i + j's code
 * is bit i of qh[j]. */
template <>
__device__ __forceinline__ void loom_dequant32<LOOM_K_Q5_K>(const uint8_t *row, int64_t c,
                                                            int64_t k, float v[32]) {
    const uint8_t *b = row + 176 * (c >> 3);
    const int i = (int)(c & 7);
    int sc, mn;
    loom_k4_scale_min(b + 4, i, &sc, &mn);
    const float dl = __fmul_rn(loom_h2f(loom_ld16(b)), (float)sc);
    const float ml = __fmul_rn(loom_h2f(loom_ld16(b + 2)), (float)mn);
    const uint8_t *qh = b + 16;
    const uint8_t *q = b + 48 + 32 * (i >> 1);
    const int shift = (i & 1) * 4;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const int code = ((q[j] >> shift) & 15) | ((qh[j] >> i) & 1) << 4;
        v[j] = __fsub_rn(__fmul_rn(dl, (float)code), ml);
    }
}

/* q6_K: 210 bytes: 128 bytes low nibbles, 64 bytes high pairs, 16 int8 scales, f16 d. Value
 * v = 128h + 32s + l: low nibble (s / 2) of ql[64h + 32(s % 2) + l], high bits 2s..2s+1 of
 * qh[32h + l], scale scales[v / 16]; y = (d scale)(q - 32). Chunk i is h = i / 4, s = i % 4. */
template <>
__device__ __forceinline__ void loom_dequant32<LOOM_K_Q6_K>(const uint8_t *row, int64_t c,
                                                            int64_t k, float v[32]) {
    const uint8_t *b = row + 210 * (c >> 3);
    const int i = (int)(c & 7), h = i >> 2, s = i & 3;
    const float d = loom_h2f(loom_ld16(b + 208));
    const uint8_t *ql = b + 64 * h + 32 * (s & 1);
    const uint8_t *qh = b + 128 + 32 * h;
    const int8_t *scales = (const int8_t *)(b + 192);
    const int lshift = (s >> 1) * 4, hshift = 2 * s;
    const float d0 = __fmul_rn(d, (float)scales[2 * i]);
    const float d1 = __fmul_rn(d, (float)scales[2 * i + 1]);
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const int q = (int)(((ql[j] >> lshift) & 15) | ((qh[j] >> hshift) & 3) << 4) - 32;
        v[j] = __fmul_rn(j < 16 ? d0 : d1, (float)q);
    }
}

/* FP8 E4M3 rows: codes, padding to 4 bytes, the row's float32 scale. A chunk's values are its
 * codes' units, E4M3 * 2^-8 exactly (tensor/fp8_rows.h: the NaN codes, never written, read as
 * +-1.875); the row's value is the unit times loom_fp8_rows_scale256, which the matmul applies
 * once to each dot and get_rows to each value, as the CPU does. Codes are read 16 at a time
 * where the chunk is whole (rows are 16-byte aligned: weight_prepare pads their stride). */
template <>
__device__ __forceinline__ void loom_dequant32<LOOM_K_FP8_ROWS>(const uint8_t *row, int64_t c,
                                                                int64_t k, float v[32]) {
    const uint8_t *b = row + 32 * c;
    const int64_t left = k - 32 * c;
    if (left >= 32 && ((uintptr_t)b & 15) == 0) {
        const uint4 q[2] = {((const uint4 *)b)[0], ((const uint4 *)b)[1]};
        const uint32_t *w = (const uint32_t *)q;
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] =
                loom_h2f(loom__fp8_e4m3_to_f16_scaled_bits((uint8_t)(w[j >> 2] >> (8 * (j & 3)))));
        return;
    }
#pragma unroll
    for (int j = 0; j < 32; j++)
        v[j] = j < left ? loom_h2f(loom__fp8_e4m3_to_f16_scaled_bits(b[j])) : 0.0f;
}

/* An FP8 row's scale times 256: the factor of its units. */
static __device__ __forceinline__ float loom_fp8_rows_scale256(const uint8_t *row, int64_t k) {
    return *(const float *)(row + ((k + 3) & ~(int64_t)3)) * 256.0f;
}
