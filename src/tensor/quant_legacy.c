/* quant_legacy.c — the 32-value block formats q4_0, q4_1, q5_0, q5_1, q8_0: decoding, the
 * reference quantizers, and row dot products.
 *
 * The quantizers reproduce the `gguf` Python package's (gguf-py quants.py) arithmetic step for
 * step, so a tensor quantized by loom is byte-identical to one quantized by gguf: float32
 * throughout, the scale computed from the float32 extremes (not from its f16-rounded value),
 * codes by truncation of value * (1 / d) + offset (q4/q5) or by rounding half away from zero
 * (q8_0), and each multiply and add rounded separately (this file must not be compiled with
 * floating-point contraction into FMA; ISO C mode, which the build uses, keeps it off).
 *
 * For inputs the reference leaves undefined (NaN, infinities, extremes whose range overflows)
 * loom still gives a defined result: codes are clamped to their range and NaN codes become 0. */
#include <math.h>

#include "tensor/quant_internal.h"

/* No fused multiply-add: results must round each operation as the reference does. GCC keeps
 * contraction off in ISO C mode (the build's -std=c11); clang needs to be told. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- code helpers ------------------------------------------------------------------------- */

/* trunc(v) clipped to [0, hi]; v is value * id + offset, >= 0 for finite input. */
static inline uint8_t code_trunc(float v, int hi) {
    if (!(v > 0.0f)) return 0; /* also NaN */
    if (v >= (float)hi) return (uint8_t)hi;
    return (uint8_t)(int)v;
}

/* round half away from zero, clipped to [-127, 127] (NaN -> 0). */
static inline int8_t code_round_q8(float v) {
    if (!(v == v)) return 0;
    float r = roundf(v);
    if (r > 127.0f) return 127;
    if (r < -127.0f) return -127;
    return (int8_t)r;
}

/* Index of the first value of largest magnitude (numpy's argmax of |x|). */
static inline int first_absmax(const float *x, int n) {
    int imax = 0;
    for (int j = 1; j < n; j++)
        if (fabsf(x[j]) > fabsf(x[imax])) imax = j;
    return imax;
}

static inline void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

static inline float inverse_or_zero(float d) {
    return d != 0.0f ? 1.0f / d : 0.0f;
}

/* Packs 32 codes: low nibbles of q[j] and q[j + 16] into qs[j]; bit 4 of q[j] into bit j of qh
 * (little-endian) when qh is not NULL. */
static void pack_nibbles(const uint8_t q[LOOM_QK_LEGACY], uint8_t qs[16], uint8_t qh[4]) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 15u) | (q[j + 16] & 15u) << 4);
    if (qh) {
        for (int k = 0; k < 4; k++) {
            uint8_t byte = 0;
            for (int bit = 0; bit < 8; bit++)
                byte |= (uint8_t)(((q[8 * k + bit] >> 4) & 1u) << bit);
            qh[k] = byte;
        }
    }
}

/* The 5-bit code of value j: low nibble from qs, bit 4 from the little-endian word qh. */
static inline uint32_t qh_word(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

/* ---- q4_0 --------------------------------------------------------------------------------- */

LOOM__INLINE void decode_q4_0(const void *blk, float *y) {
    const loom__block_q4_0 *b = (const loom__block_q4_0 *)blk;
    float d = loom__f16_to_f32(b->d);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((int)(b->qs[j] & 15u) - 8);
        y[j + 16] = d * (float)((int)(b->qs[j] >> 4) - 8);
    }
}

static void quant_block_q4_0(const float *x, loom__block_q4_0 *b) {
    /* The value of largest magnitude maps to code 0 (-8 * d), keeping its sign in d. */
    float d = x[first_absmax(x, LOOM_QK_LEGACY)] / -8.0f;
    float id = inverse_or_zero(d);
    uint8_t q[LOOM_QK_LEGACY];
    for (int j = 0; j < LOOM_QK_LEGACY; j++) q[j] = code_trunc(x[j] * id + 8.5f, 15);
    b->d = loom__f32_to_f16(d);
    pack_nibbles(q, b->qs, NULL);
}

/* ---- q4_1 --------------------------------------------------------------------------------- */

LOOM__INLINE void decode_q4_1(const void *blk, float *y) {
    const loom__block_q4_1 *b = (const loom__block_q4_1 *)blk;
    float d = loom__f16_to_f32(b->d);
    float m = loom__f16_to_f32(b->m);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(b->qs[j] & 15u) + m;
        y[j + 16] = d * (float)(b->qs[j] >> 4) + m;
    }
}

static void quant_block_q4_1(const float *x, loom__block_q4_1 *b) {
    float mn, mx;
    min_max(x, LOOM_QK_LEGACY, &mn, &mx);
    float d = (mx - mn) / 15.0f;
    float id = inverse_or_zero(d);
    uint8_t q[LOOM_QK_LEGACY];
    for (int j = 0; j < LOOM_QK_LEGACY; j++) q[j] = code_trunc((x[j] - mn) * id + 0.5f, 15);
    b->d = loom__f32_to_f16(d);
    b->m = loom__f32_to_f16(mn);
    pack_nibbles(q, b->qs, NULL);
}

/* ---- q5_0 --------------------------------------------------------------------------------- */

LOOM__INLINE void decode_q5_0(const void *blk, float *y) {
    const loom__block_q5_0 *b = (const loom__block_q5_0 *)blk;
    float d = loom__f16_to_f32(b->d);
    uint32_t qh = qh_word(b->qh);
    for (int j = 0; j < 16; j++) {
        int lo = (int)((b->qs[j] & 15u) | ((qh >> j) & 1u) << 4);
        int hi = (int)((b->qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4);
        y[j] = d * (float)(lo - 16);
        y[j + 16] = d * (float)(hi - 16);
    }
}

static void quant_block_q5_0(const float *x, loom__block_q5_0 *b) {
    float d = x[first_absmax(x, LOOM_QK_LEGACY)] / -16.0f;
    float id = inverse_or_zero(d);
    uint8_t q[LOOM_QK_LEGACY];
    for (int j = 0; j < LOOM_QK_LEGACY; j++) q[j] = code_trunc(x[j] * id + 16.5f, 31);
    b->d = loom__f32_to_f16(d);
    pack_nibbles(q, b->qs, b->qh);
}

/* ---- q5_1 --------------------------------------------------------------------------------- */

LOOM__INLINE void decode_q5_1(const void *blk, float *y) {
    const loom__block_q5_1 *b = (const loom__block_q5_1 *)blk;
    float d = loom__f16_to_f32(b->d);
    float m = loom__f16_to_f32(b->m);
    uint32_t qh = qh_word(b->qh);
    for (int j = 0; j < 16; j++) {
        uint32_t lo = (b->qs[j] & 15u) | ((qh >> j) & 1u) << 4;
        uint32_t hi = (b->qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4;
        y[j] = d * (float)lo + m;
        y[j + 16] = d * (float)hi + m;
    }
}

static void quant_block_q5_1(const float *x, loom__block_q5_1 *b) {
    float mn, mx;
    min_max(x, LOOM_QK_LEGACY, &mn, &mx);
    float d = (mx - mn) / 31.0f;
    float id = inverse_or_zero(d);
    uint8_t q[LOOM_QK_LEGACY];
    for (int j = 0; j < LOOM_QK_LEGACY; j++) q[j] = code_trunc((x[j] - mn) * id + 0.5f, 31);
    b->d = loom__f32_to_f16(d);
    b->m = loom__f32_to_f16(mn);
    pack_nibbles(q, b->qs, b->qh);
}

/* ---- q8_0 --------------------------------------------------------------------------------- */

LOOM__INLINE void decode_q8_0(const void *blk, float *y) {
    const loom__block_q8_0 *b = (const loom__block_q8_0 *)blk;
    float d = loom__f16_to_f32(b->d);
    for (int j = 0; j < LOOM_QK_LEGACY; j++) y[j] = (float)b->qs[j] * d;
}

static void quant_block_q8_0(const float *x, loom__block_q8_0 *b) {
    float amax = fabsf(x[first_absmax(x, LOOM_QK_LEGACY)]);
    float d = amax / 127.0f;
    float id = inverse_or_zero(d);
    for (int j = 0; j < LOOM_QK_LEGACY; j++) b->qs[j] = code_round_q8(x[j] * id);
    b->d = loom__f32_to_f16(d);
}

/* ---- row kernels -------------------------------------------------------------------------- */

/* One set of row functions per format: the block loops are the shared inline drivers, made
 * direct calls by the constant decoder. */
#define LEGACY_ROW_KERNELS(fmt)                                                                    \
    static void dequant_row_##fmt(const void *src, float *dst, int64_t n) {                        \
        loom__dequant_blocks(src, dst, n, sizeof(loom__block_##fmt), LOOM_QK_LEGACY,               \
                             decode_##fmt);                                                        \
    }                                                                                              \
    static float dot_##fmt(const void *w, const float *x, int64_t n) {                             \
        return loom__dot_blocks(w, x, n, sizeof(loom__block_##fmt), LOOM_QK_LEGACY, decode_##fmt); \
    }                                                                                              \
    static void quant_row_##fmt(const float *src, void *dst, int64_t n) {                          \
        loom__block_##fmt *b = (loom__block_##fmt *)dst;                                           \
        for (int64_t i = 0; i < n / LOOM_QK_LEGACY; i++)                                           \
            quant_block_##fmt(src + i * LOOM_QK_LEGACY, &b[i]);                                    \
    }                                                                                              \
    static const loom__qkernels kernels_##fmt = {                                                  \
        .dequant_row = dequant_row_##fmt, .quant_row = quant_row_##fmt, .dot = dot_##fmt};

LEGACY_ROW_KERNELS(q4_0)
LEGACY_ROW_KERNELS(q4_1)
LEGACY_ROW_KERNELS(q5_0)
LEGACY_ROW_KERNELS(q5_1)
LEGACY_ROW_KERNELS(q8_0)

const loom__qkernels *loom__qkernels_legacy(uint32_t t) {
    switch (t) {
    case LOOM_TYPE_Q4_0:
        return &kernels_q4_0;
    case LOOM_TYPE_Q4_1:
        return &kernels_q4_1;
    case LOOM_TYPE_Q5_0:
        return &kernels_q5_0;
    case LOOM_TYPE_Q5_1:
        return &kernels_q5_1;
    case LOOM_TYPE_Q8_0:
        return &kernels_q8_0;
    default:
        return NULL;
    }
}
