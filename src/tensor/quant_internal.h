/* quant_internal.h — what the per-format kernel files (quant_float.c, quant_legacy.c, quant_k.c,
 * quant_fp8.c) share with the dispatcher in quant.c: a table of row kernels per type, and the
 * fixed-order accumulation every dot product uses. Internal to src/tensor. */
#pragma once

#include <stdint.h>

#include "tensor/fp16.h"
#include "tensor/quant_layouts.h"
#include "tensor/types.h"

/* Forces inlining of the small block drivers below into each format's row kernel, so the
 * decoder is a direct, inlinable call and the loops see constant block sizes. */
#if defined(__GNUC__)
#define LOOM__INLINE static inline __attribute__((always_inline))
#else
#define LOOM__INLINE static inline
#endif

/* Row kernels of one type. n is a count of values, already checked to be a whole number of
 * blocks by the caller. */
typedef struct loom__qkernels {
    void (*dequant_row)(const void *src, float *dst, int64_t n);
    void (*quant_row)(const float *src, void *dst, int64_t n); /* NULL: no reference quantizer */
    float (*dot)(const void *w, const float *x, int64_t n);    /* NULL: cannot dequantize */
} loom__qkernels;

/* Each returns the kernels of t if t belongs to its file's family, else NULL. */
const loom__qkernels *loom__qkernels_float(uint32_t t);  /* f32, f16, bf16 */
const loom__qkernels *loom__qkernels_legacy(uint32_t t); /* q4_0 .. q8_0 */
const loom__qkernels *loom__qkernels_kquant(uint32_t t); /* q2_K .. q6_K, q8_K */
const loom__qkernels *loom__qkernels_fp8(uint32_t t);    /* fp8_e4m3_rows */

/* ---- fixed-order dot accumulation ----------------------------------------------------------
 * Every dot product sums w[i] * x[i] into lane i % LOOM__DOT_LANES, sequentially per lane in
 * increasing i, then folds the lanes pairwise in a fixed tree. The result depends only on the
 * inputs (not on threads, alignment or the caller), and the independent lanes give the compiler
 * vector registers to fill: 32 floats are four AVX2 or two AVX-512 registers, enough to hide
 * the latency of the adds. Block sizes (32, 256) are multiples of the lane count. */
#define LOOM__DOT_LANES 32

/* acc[j] += w[i] * x[i] for i in [0, n), i % LANES == j; n a multiple of LOOM__DOT_LANES. */
LOOM__INLINE void loom__dot_lanes(float *restrict acc, const float *restrict w,
                                  const float *restrict x, int n) {
    for (int i = 0; i < n; i += LOOM__DOT_LANES)
        for (int j = 0; j < LOOM__DOT_LANES; j++) acc[j] += w[i + j] * x[i + j];
}

/* Folds the lanes: halves added onto halves (16, 8, 4, 2, 1 apart). */
static inline float loom__lanes_sum(float *acc) {
    for (int width = LOOM__DOT_LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++) acc[j] += acc[j + width];
    return acc[0];
}

/* Dot of a row of block-format weights with x, a chunk of blocks at a time: decode the chunk
 * into a stack buffer with the same function the dequantizer uses (so the dot is exactly the dot
 * of the dequantized row, in the order above), then accumulate it. Chunks of 1024 values rather
 * than single blocks because the compiler may write the buffer with narrower vectors than it
 * reads it with; reading back a value just stored by a different-width store stalls
 * (store-forwarding), and a 4 KiB chunk lets those stores complete before they are read.
 * Meant to be inlined with a constant `decode` so the call becomes direct. */
#define LOOM__DOT_CHUNK 1024 /* values; a multiple of every block size */

LOOM__INLINE float loom__dot_blocks(const void *w, const float *x, int64_t n, size_t block_bytes,
                                    int block_elems, void (*decode)(const void *blk, float *y)) {
    float acc[LOOM__DOT_LANES] = {0};
    float buf[LOOM__DOT_CHUNK];
    const uint8_t *p = (const uint8_t *)w;
    for (int64_t i = 0; i < n; i += LOOM__DOT_CHUNK) {
        int len = n - i < LOOM__DOT_CHUNK ? (int)(n - i) : LOOM__DOT_CHUNK;
        for (int k = 0; k < len; k += block_elems, p += block_bytes) decode(p, buf + k);
        loom__dot_lanes(acc, buf, x + i, len);
    }
    return loom__lanes_sum(acc);
}

/* Dequantizes a row block by block with decode. */
LOOM__INLINE void loom__dequant_blocks(const void *src, float *dst, int64_t n, size_t block_bytes,
                                       int block_elems, void (*decode)(const void *blk, float *y)) {
    const uint8_t *p = (const uint8_t *)src;
    for (int64_t i = 0; i < n; i += block_elems, p += block_bytes) decode(p, dst + i);
}
