/* quant.h — reference (portable C) conversion between float32 and every supported storage type.
 *
 * Block layouts follow the GGUF format's definitions (facts of the format, written down in
 * quant_layouts.h). Everything here is scalar reference code: the backends' fast kernels are
 * validated against it. */
#pragma once

#include "tensor/fp16.h" /* half and bfloat16 <-> float (inline) */
#include "tensor/types.h"

/* Dequantizes n values (a multiple of the type's block size) of type t from src into dst.
 * Returns false if t cannot be dequantized or n is not a whole number of blocks. */
bool loom__dequantize_row(uint32_t t, const void *src, float *dst, int64_t n);

/* Quantizes n floats into type t (reference rounding). Supported for F32, F16, BF16, Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_K (activation format) and FP8_E4M3_ROWS (one row of n values:
 * tensor/fp8_rows.h); returns false otherwise. */
bool loom__quantize_row(uint32_t t, const float *src, void *dst, int64_t n);

/* Dot product of one weight row of type t (n values, a whole number of blocks) with the float32
 * vector x[n], computed block by block without materialising the dequantized row. The result
 * equals the dot of loom__dequantize_row's output with x, summed in a fixed order (lane i % 32
 * of 32 float accumulators, sequential per lane, lanes folded pairwise), so it depends only on
 * the inputs. (FP8_E4M3_ROWS sums its codes' values so and multiplies by the row's scale once
 * at the end: equal to that dot up to float32 rounding.) Returns NaN if t cannot be dequantized, n
 * is negative or not a whole number of blocks, or a pointer is NULL (callers check the type when a
 * model loads, so NaN marks a bug, not a runtime condition). Thread-safe. */
float loom__vec_dot_f32(const void *w_row, uint32_t t, const float *x, int64_t n);

/* The row kernel loom__vec_dot_f32 dispatches to for type t, for inner loops that call it once
 * per row: fn(w_row, x, n) with n a whole number of blocks (not checked). NULL if t cannot be
 * dequantized. */
typedef float (*loom__vec_dot_fn)(const void *w_row, const float *x, int64_t n);
loom__vec_dot_fn loom__vec_dot_get(uint32_t t);
