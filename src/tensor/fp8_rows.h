/* fp8_rows.h — FP8 weight rows (LOOM_TYPE_FP8_E4M3_ROWS, loom_backend.h says the layout): K
 * E4M3 codes, zero padding to a multiple of 4 bytes, then the row's float32 scale.
 *
 * The readers here (and the CPU matmul, backend/cpu/cpu_fp8.h) take a code's value as its
 * "unit", the E4M3 value times 2^-8: the half whose bits loom__fp8_e4m3_to_f16_scaled_bits
 * gives, which F16C widens in one instruction for every code, subnormals included. A row's
 * value i is then unit(code[i]) * (scale * 256): the same real product as E4M3(code[i]) *
 * scale, so the same float once rounded (multiplying by 2^±8 is exact short of float
 * subnormals, which neither the units nor normal scales reach). The NaN codes, which the
 * quantizer never writes, read as ±1.875 units (±480) everywhere, so every reader agrees. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "tensor/fp16.h"
#include "tensor/fp8.h"

/* E4M3's largest finite value: a row's largest magnitude is scaled onto it. */
#define LOOM_FP8_E4M3_MAX 448.0f

/* Bytes of a row's codes with their padding: where its scale starts. */
static inline size_t loom__fp8_rows_codes_bytes(int64_t k) {
    return ((size_t)k + 3u) & ~(size_t)3u;
}

/* A row's scale times 256, the factor its units are multiplied by. */
static inline float loom__fp8_rows_scale256(const void *row, int64_t k) {
    float s;
    memcpy(&s, (const uint8_t *)row + loom__fp8_rows_codes_bytes(k), sizeof s);
    return s * 256.0f;
}

/* The unit of code c: E4M3(c) * 2^-8, exactly. */
static inline float loom__fp8_rows_unit(uint8_t c) {
    return loom__f16_to_f32(loom__fp8_e4m3_to_f16_scaled_bits(c));
}

/* Quantizes the k floats of src into one row at dst (loom__type_row_bytes(FP8_E4M3_ROWS, k)
 * bytes): scale = max |src[i]| / 448 in float32, code[i] = E4M3(src[i] / scale) round to
 * nearest even in float32; a row whose scale is 0 (all zeros, or a largest magnitude so small
 * that the scale underflows) gets scale 0 and all-zero codes. Returns false, having still
 * written a row (NaN read as 0, infinities saturated to ±448 of a scale taken over the finite
 * values), when src holds a NaN or an infinity: such a row has no faithful FP8 form. */
bool loom__fp8_rows_quantize(const float *src, void *dst, int64_t k);
