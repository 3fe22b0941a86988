/* quant_fp8.c — row kernels of FP8 weight rows (LOOM_TYPE_FP8_E4M3_ROWS: E4M3 codes and one
 * float32 scale per row, tensor/fp8_rows.h): the quantizer libloom runs at load, the reference
 * dequantizer and the reference dot. The CPU matmul's fast loops (backend/cpu/cpu_fp8.h) are
 * checked against these. */
#include "tensor/fp8_rows.h"

#include "tensor/quant_internal.h"

/* ---- quantize ----------------------------------------------------------------------------- */

/* |x| bits below infinity's: finite. */
static inline bool finite_bits(uint32_t a) {
    return a < 0x7f800000u;
}

bool loom__fp8_rows_quantize(const float *src, void *dst, int64_t k) {
    uint8_t *codes = dst;
    /* Loops in the forms GCC vectorises (a conversion at load touches every weight of the
     * model): the largest magnitude as the largest bit pattern (non-negative floats order as
     * their bits), non-finite values counted apart and, where there are any, left out by a
     * second, scalar pass. */
    uint32_t amax = 0, bad = 0;
    for (int64_t i = 0; i < k; i++) {
        const uint32_t a = loom__f32_bits(src[i]) & 0x7fffffffu;
        amax = a > amax ? a : amax;
        bad |= finite_bits(a) ? 0u : 1u;
    }
    if (bad) {
        amax = 0;
        for (int64_t i = 0; i < k; i++) {
            const uint32_t a = loom__f32_bits(src[i]) & 0x7fffffffu;
            if (finite_bits(a) && a > amax) amax = a;
        }
    }
    const float scale = loom__f32_from_bits(amax) / LOOM_FP8_E4M3_MAX;
    if (scale == 0.0f) {
        memset(codes, 0, (size_t)k);
    } else {
        for (int64_t i = 0; i < k; i++) {
            /* Division, as the rule says (a multiply by 448 / amax would round differently). */
            const uint8_t c = loom__f32_to_fp8_e4m3(src[i] / scale);
            codes[i] = c == 0x7fu ? 0u : c; /* a NaN: the encoder's only NaN code */
        }
    }
    const size_t pad = loom__fp8_rows_codes_bytes(k);
    memset(codes + k, 0, pad - (size_t)k);
    memcpy(codes + pad, &scale, sizeof scale);
    return bad == 0;
}

static void quant_row_fp8_rows(const float *src, void *dst, int64_t n) {
    (void)loom__fp8_rows_quantize(src, dst, n);
}

/* ---- dequantize and dot ------------------------------------------------------------------- */

static void dequant_row_fp8_rows(const void *src, float *dst, int64_t n) {
    const uint8_t *codes = src;
    const float s = loom__fp8_rows_scale256(src, n);
    for (int64_t i = 0; i < n; i++) dst[i] = loom__fp8_rows_unit(codes[i]) * s;
}

/* The lanes' order of every dot here over the units, the scale applied once at the end: the
 * dot of the dequantized row up to that one rounding (what the CPU matmul computes too). */
static float dot_fp8_rows(const void *w_row, const float *x, int64_t n) {
    const uint8_t *codes = w_row;
    float acc[LOOM__DOT_LANES] = {0};
    int64_t full = n - n % LOOM__DOT_LANES;
    for (int64_t i = 0; i < full; i += LOOM__DOT_LANES)
        for (int j = 0; j < LOOM__DOT_LANES; j++)
            acc[j] += loom__fp8_rows_unit(codes[i + j]) * x[i + j];
    for (int64_t i = full; i < n; i++) acc[i - full] += loom__fp8_rows_unit(codes[i]) * x[i];
    return loom__lanes_sum(acc) * loom__fp8_rows_scale256(w_row, n);
}

static const loom__qkernels kernels_fp8_rows = {
    .dequant_row = dequant_row_fp8_rows, .quant_row = quant_row_fp8_rows, .dot = dot_fp8_rows};

const loom__qkernels *loom__qkernels_fp8(uint32_t t) {
    return t == LOOM_TYPE_FP8_E4M3_ROWS ? &kernels_fp8_rows : NULL;
}
