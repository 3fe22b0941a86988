/* qgemm.h — quantized matrix products over a tile of weight rows and a tile of tokens, for the
 * CPU matmul: each weight row is unpacked once per call instead of once per token.
 *
 * loom__vec_dot_q (qdot.h) takes one weight row and one activation row and unpacks the weight's
 * codes and scales every time. With T tokens in a step that unpacking, and the sign tricks the
 * one-row kernels need, are repeated T times. Here a matmul:
 *   1. prepares each activation row once (prepare_x: the row in the activation format of
 *      qdot.h, laid out for the tile kernel: codes contiguous, scales as float32, and the
 *      code sums the weight's code offset needs), and
 *   2. runs tile() over nr weight rows (read in place) and nt prepared tokens: each group of a
 *      row's blocks is unpacked once into registers as unsigned codes and scales and then
 *      multiplied with several tokens, leaving per pair only the integer dot products
 *      (vpdpbusd, or vpmaddubsw + vpdpwssd) and the float combination.
 *
 * Results are bit-identical to loom__vec_dot_q(weight_type, w_row, act_row, K): the integer block
 * sums are exact whatever their order, and the float operations on them are the same ones in
 * the same order (qdot_legacy.c, qdot_k.c document them). Batch invariance therefore carries
 * over: out[t, o] does not depend on which other rows or tokens share the tile.
 *
 * Unsigned-code identity: the tile kernels multiply unsigned weight codes u = w + off by signed
 * activation codes x, and subtract off * sum(x) per block (legacy) or use the activation's
 * 16-value sums (K-quants): sum(w x) = sum(u x) - off * sum(x), exactly, in int32.
 *
 * Only built where the integer dot instructions make it pay (AVX-512 VNNI or AVX-VNNI);
 * loom__qgemm_get returns NULL otherwise, and for weight types without a tile kernel (the
 * matmul then calls loom__vec_dot_q per pair). Thread-safe, allocation-free. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* out[t * out_stride + r] = loom__vec_dot_q(weight_type, row r, token t, K) for r < nr, t < nt:
 * weight rows w_stride bytes apart, prepared token rows x_stride bytes apart (64-byte
 * aligned). */
typedef void (*loom__qgemm_tile_fn)(const void *w, size_t w_stride, int nr, const void *x,
                                    size_t x_stride, int nt, int64_t K, float *out,
                                    size_t out_stride);

typedef struct loom__qgemm_kernels {
    /* Fewest tokens for which the tile beats the one-row kernels (loom-kernel-bench): 1 for the
     * legacy formats (their one-row kernels spend more on sign tricks than the tile on
     * unpacking), 2 for q4_K / q5_K (unpacking scales costs as much as one row's dot). */
    int min_tokens;
    /* Bytes of one prepared activation row of K values (K a whole number of the weight type's
     * blocks); a multiple of 64. */
    size_t (*x_row_bytes)(int64_t K);
    /* act: one row in loom__vec_dot_type(weight_type)'s format (qdot.h); x: x_row_bytes(K)
     * bytes, 64-byte aligned. */
    void (*prepare_x)(const void *act, void *x, int64_t K);
    /* The weight rows in place (the type's blocks). */
    loom__qgemm_tile_fn tile;
    /* Optional (NULL / 0 where there is none): a second tile kernel over weight rows that it
     * prepares itself into wp (64-byte aligned, nr rows w_row_bytes(K) bytes apart, a multiple
     * of 64), prepared_tokens_per_call tokens per call at most, for steps of at least
     * prepare_min_tokens(K) tokens. With fill set the call prepares wp from w's rows while
     * computing (its first tokens meet them); without, wp holds them already and w is not
     * read. The matmul fills once per group of rows and block of tokens. F16 converts its
     * weights to float32 this way instead of once per call. */
    size_t (*w_row_bytes)(int64_t K);
    void (*tile_prepared)(const void *w, size_t w_stride, int nr, void *wp, int fill, const void *x,
                          size_t x_stride, int nt, int64_t K, float *out, size_t out_stride);
    int (*prepare_min_tokens)(int64_t K);
    int prepared_tokens_per_call;
} loom__qgemm_kernels;

/* The tile kernels for weight_type in this build, or NULL. */
const loom__qgemm_kernels *loom__qgemm_get(uint32_t weight_type);

/* Token-lane kernels, for steps with many tokens (prefill, batched decode): `width` tokens (16
 * with AVX-512, else 8) are prepared together, interleaved so that one register holds 4 codes
 * of each token; a weight row's 4 codes are broadcast against it, so every vpdpbusd lane
 * accumulates one token's block sum and no horizontal reduction is needed. The float
 * combination runs on vectors of tokens, one accumulator per block lane (b % 8 for the legacy
 * formats), folded in loom__qd_fold8's order: per (row, token) the same operations as
 * loom__vec_dot_q, bit for bit, so a token's result does not depend on which kernel served it. */
typedef struct loom__qgemm_lanes {
    int width; /* tokens per prepared group: 8 or 16 */
    /* Bytes of one prepared group of `width` tokens of K values; a multiple of 64. */
    size_t (*x8_bytes)(int64_t K);
    /* act: n (1..width) rows in the activation format, act_stride bytes apart; x8:
     * x8_bytes(K) bytes, 64-byte aligned; tokens n..width-1 are zero. */
    void (*prepare_x8)(const void *act, size_t act_stride, int n, void *x8, int64_t K);
    /* out[t * out_stride + r] = loom__vec_dot_q(weight_type, row r, token t, K) for r < nr,
     * t < nt (<= width) of the prepared group x8. */
    void (*tile8)(const void *w, size_t w_stride, int nr, const void *x8, int nt, int64_t K,
                  float *out, size_t out_stride);
} loom__qgemm_lanes;

/* The token-lane kernels for weight_type in this build, or NULL. */
const loom__qgemm_lanes *loom__qgemm_lanes_get(uint32_t weight_type);
