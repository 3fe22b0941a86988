/* qdot.h — dot products of weight rows with activations rounded to the weight's "activation
 * format", the arithmetic llama.cpp's CPU matmuls use.
 *
 * Before a matmul over quantized weights, llama.cpp rounds each activation row to a block
 * format (8-bit codes and a scale per 32 or 256 values, or half / bfloat16 floats) and then
 * multiplies integer codes block by block, applying the scales once per block. loom does the
 * same here, so that its logits agree with llama.cpp's and its matmuls run on integer SIMD:
 *
 *   weight type                activation format   (loom__vec_dot_type)
 *   q4_0, q5_0, q8_0          -> q8_0               32 values, f16 d = amax / 127
 *   q4_1, q5_1                -> q8_1               q8_0 plus s = f16(d * sum(codes))
 *   q2_K, q3_K, q4_K, q5_K,
 *   q6_K                      -> q8_K               256 values, float d = max / -127, sums of 16
 *   f16                       -> f16
 *   bf16                      -> bf16
 *   f32                       -> f32                (no rounding)
 *
 * Activation rounding (loom__quantize_activations) reproduces llama.cpp's x86 build bit for bit:
 * q8_0 / q8_1 codes are round-to-nearest-even(x * (127 / amax)) (its AVX path: the scale's
 * inverse is 127 / amax, not 1 / (amax / 127), and ties go to even, not away from zero as in its
 * scalar reference and in loom__quantize_row); q8_K codes are min(127, nearest-even(x * (-127 /
 * max))) with max the first value of largest magnitude, d = 1 / (-127 / max) (its reference
 * quantize_row_q8_K_ref, which the x86 build calls; loom__quantize_row's q8_K still uses the
 * older -128 scaling). f16 and bf16 round to nearest even.
 *
 * How often the x86 rules matter, measured on Gemma 3 270M's matmul inputs (512 tokens, 5.8e7
 * codes): 2.7e-5 of the codes are exact .5 ties; ties-to-even instead of ties-away changes
 * 1.5e-5 of them, 127 / amax instead of 1 / d another 4.6e-6; together 1.8e-5 of the codes
 * (5.3e-4 of the blocks) differ from loom__quantize_row's q8_0. Rare, but each flip moves a dot
 * by a whole code step, so loom follows the x86 build, the reference its conformance tests run.
 *
 * Non-finite inputs give defined blocks (a NaN code becomes 0, codes are clamped to
 * [-127, 127]) that need not match llama.cpp's. Half-precision scales overflow as in llama.cpp:
 * a q8_0 / q8_1 block whose amax exceeds ~8.3e6, or a q8_1 block whose |d * sum(codes)| exceeds
 * 65504, stores an infinity.
 *
 * Dot products (loom__vec_dot_q) compute the integer part of every block exactly (int32) and
 * combine the blocks in float32 in one fixed order (documented with each family in
 * qdot_legacy.c, qdot_k.c, qdot.c), so a result depends only on (weight row, activation row):
 * batch invariance holds by construction. The float part differs from llama.cpp's kernels
 * (which sum lane partials in a SIMD-width-dependent order) only by float32 rounding.
 *
 * SIMD paths are chosen at run time among the variants the build compiled (qdot_dispatch.c):
 * AVX2 with F16C and FMA; the same with AVX-VNNI; AVX-512 with VNNI vpdpbusd / vpdpwssd. With
 * AVX-512 the block formats use 256-bit vectors with the EVEX VNNI forms (decode is memory-bound;
 * 512-bit block kernels are left for later) and f16 / bf16 use 512-bit vectors. Every SIMD kernel
 * performs the same float operations in the same order as the portable C one, so both give the same
 * bits (tested).
 *
 * Everything here is thread-safe and allocation-free. */
#pragma once

#include "tensor/types.h"

/* The activation format weight_type's dot products take (table above). Returns false if
 * weight_type is not a weight type loom can dot (unknown, or not dequantizable). */
bool loom__vec_dot_type(uint32_t weight_type, uint32_t *act_type);

/* Rounds n floats x[n] into activation format act_type at dst (loom__type_row_bytes(act_type, n)
 * bytes; q8_K rows must be 4-byte aligned, the others 2-byte aligned). act_type is one of
 * Q8_0, Q8_1, Q8_K (n a whole number of its blocks), F16, BF16, F32 (a copy). Returns false
 * for another type, a bad n, or a NULL pointer with n > 0. */
bool loom__quantize_activations(uint32_t act_type, const float *x, void *dst, int64_t n);

/* Dot of one weight row w_row of weight_type (n values, a whole number of blocks) with an
 * activation row x_act of n values in loom__vec_dot_type(weight_type)'s format. Returns NaN if
 * weight_type has no activation format, n is negative or not a whole number of blocks, or a
 * pointer is NULL with n > 0 (callers validate shapes, so NaN marks a bug). */
float loom__vec_dot_q(uint32_t weight_type, const void *w_row, const void *x_act, int64_t n);

/* The row kernel loom__vec_dot_q dispatches to, for inner loops that call it once per weight
 * row: fn(w_row, x_act, n), n a whole number of blocks (not checked). NULL if weight_type has
 * no activation format. */
typedef float (*loom__vec_dot_q_fn)(const void *w_row, const void *x_act, int64_t n);
loom__vec_dot_q_fn loom__vec_dot_q_get(uint32_t weight_type);

/* The row quantizer loom__quantize_activations dispatches to: fn(x, dst, n), n valid (not
 * checked). NULL for a type that is not an activation format. */
typedef void (*loom__quantize_act_fn)(const float *x, void *dst, int64_t n);
loom__quantize_act_fn loom__quantize_activations_get(uint32_t act_type);

/* ---- for tests ------------------------------------------------------------------------------
 * The portable C kernels, compiled in every build so tests can compare the SIMD path with them
 * in one binary (same contract as the functions above). loom__qdot_simd_name() names the
 * instruction-set variant serving this process ("avx512", "avx2-vnni", "avx2", "portable";
 * qdot_dispatch.c chooses it at the first call). */
float loom__vec_dot_q_portable(uint32_t weight_type, const void *w_row, const void *x_act,
                               int64_t n);
bool loom__quantize_activations_portable(uint32_t act_type, const float *x, void *dst, int64_t n);
const char *loom__qdot_simd_name(void);
