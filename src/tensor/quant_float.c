/* quant_float.c — row kernels of the plain floating-point storage types: f32, f16, bf16.
 * Conversions are exact (widening) or round-to-nearest-even (narrowing); dot products widen
 * each weight to float and accumulate in the fixed lane order of quant_internal.h. */
#include <string.h>

#include "tensor/quant_internal.h"

/* ---- f32 ---------------------------------------------------------------------------------- */

static void dequant_row_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void quant_row_f32(const float *src, void *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static float dot_f32(const void *w_row, const float *x, int64_t n) {
    const float *w = (const float *)w_row;
    float acc[LOOM__DOT_LANES] = {0};
    int64_t full = n - n % LOOM__DOT_LANES;
    for (int64_t i = 0; i < full; i += LOOM__DOT_LANES)
        for (int j = 0; j < LOOM__DOT_LANES; j++) acc[j] += w[i + j] * x[i + j];
    for (int64_t i = full; i < n; i++) acc[i - full] += w[i] * x[i];
    return loom__lanes_sum(acc);
}

/* ---- f16 ---------------------------------------------------------------------------------- */

static void dequant_row_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *h = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) dst[i] = loom__f16_to_f32(h[i]);
}

static void quant_row_f16(const float *src, void *dst, int64_t n) {
    uint16_t *h = (uint16_t *)dst;
    for (int64_t i = 0; i < n; i++) h[i] = loom__f32_to_f16(src[i]);
}

static float dot_f16(const void *w_row, const float *x, int64_t n) {
    const uint16_t *w = (const uint16_t *)w_row;
    float acc[LOOM__DOT_LANES] = {0};
    int64_t full = n - n % LOOM__DOT_LANES;
    for (int64_t i = 0; i < full; i += LOOM__DOT_LANES)
        for (int j = 0; j < LOOM__DOT_LANES; j++) acc[j] += loom__f16_to_f32(w[i + j]) * x[i + j];
    for (int64_t i = full; i < n; i++) acc[i - full] += loom__f16_to_f32(w[i]) * x[i];
    return loom__lanes_sum(acc);
}

/* ---- bf16 --------------------------------------------------------------------------------- */

static void dequant_row_bf16(const void *src, float *dst, int64_t n) {
    const uint16_t *h = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) dst[i] = loom__bf16_to_f32(h[i]);
}

static void quant_row_bf16(const float *src, void *dst, int64_t n) {
    uint16_t *h = (uint16_t *)dst;
    for (int64_t i = 0; i < n; i++) h[i] = loom__f32_to_bf16(src[i]);
}

static float dot_bf16(const void *w_row, const float *x, int64_t n) {
    const uint16_t *w = (const uint16_t *)w_row;
    float acc[LOOM__DOT_LANES] = {0};
    int64_t full = n - n % LOOM__DOT_LANES;
    for (int64_t i = 0; i < full; i += LOOM__DOT_LANES)
        for (int j = 0; j < LOOM__DOT_LANES; j++) acc[j] += loom__bf16_to_f32(w[i + j]) * x[i + j];
    for (int64_t i = full; i < n; i++) acc[i - full] += loom__bf16_to_f32(w[i]) * x[i];
    return loom__lanes_sum(acc);
}

/* ---- the family's table ------------------------------------------------------------------- */

static const loom__qkernels kernels_f32 = {
    .dequant_row = dequant_row_f32, .quant_row = quant_row_f32, .dot = dot_f32};
static const loom__qkernels kernels_f16 = {
    .dequant_row = dequant_row_f16, .quant_row = quant_row_f16, .dot = dot_f16};
static const loom__qkernels kernels_bf16 = {
    .dequant_row = dequant_row_bf16, .quant_row = quant_row_bf16, .dot = dot_bf16};

const loom__qkernels *loom__qkernels_float(uint32_t t) {
    switch (t) {
    case LOOM_TYPE_F32:
        return &kernels_f32;
    case LOOM_TYPE_F16:
        return &kernels_f16;
    case LOOM_TYPE_BF16:
        return &kernels_bf16;
    default:
        return NULL;
    }
}
