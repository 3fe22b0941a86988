/* qweight_util.h — what the quantized-matmul tests share: a deterministic RNG, activations
 * with outliers, the weight types under test and a generator of random weight rows of each. */
#pragma once

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "tensor/fp16.h"
#include "tensor/quant.h"
#include "tensor/quant_layouts.h"
#include "tensor/types.h"

static uint64_t g_rng = 0x5eed0123456789abull;

static inline uint64_t rng_u64(void) { /* splitmix64 */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline float rng_f(void) { /* uniform in [-1, 1) */
    return (float)((double)(rng_u64() >> 11) * 0x1p-52 - 1.0);
}

static inline void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (p == NULL) abort(); /* test harness only */
    return p;
}

/* Activations with the spread of a real residual stream: most values O(scale), a few outliers
 * 100x larger, some exact zeros. */
static inline void fill_acts(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = rng_u64() % 64;
        float v = rng_f() * scale;
        if (r == 0) v *= 100.0f;
        if (r == 1) v = 0.0f;
        x[i] = v;
    }
}

static const uint32_t weight_types[] = {
    LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_1, LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1, LOOM_TYPE_Q8_0, LOOM_TYPE_Q2_K,
    LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K, LOOM_TYPE_Q6_K, LOOM_TYPE_F16,  LOOM_TYPE_BF16};
#define N_WEIGHT_TYPES (sizeof weight_types / sizeof weight_types[0])

static inline size_t row_bytes(uint32_t t, int64_t n) {
    size_t b = 0;
    assert_true(loom__type_row_bytes(t, n, &b));
    return b;
}

static inline void set_f16(uint8_t *p, float v) {
    uint16_t h = loom__f32_to_f16(v);
    memcpy(p, &h, sizeof h);
}

/* One random weight row of type t: legacy and float types quantized from random floats,
 * K-quants random bytes with sane f16 scales (every bit pattern of codes and packed scales). */
static inline void make_weight_row(uint32_t t, int64_t K, uint8_t *row) {
    float *src = xmalloc((size_t)K * sizeof(float));
    for (int64_t i = 0; i < K; i++) src[i] = rng_f();
    if (!loom__quantize_row(t, src, row, K)) {
        const loom__type_traits *tr = loom__type_get_traits(t);
        size_t nbytes = row_bytes(t, K);
        for (size_t b = 0; b < nbytes; b++) row[b] = (uint8_t)rng_u64();
        for (int64_t blk = 0; blk < K / tr->block_elems; blk++) {
            uint8_t *bp = row + (size_t)blk * tr->block_bytes;
            float d = 0.01f + 0.02f * (float)(rng_u64() % 100) / 100.0f;
            switch (t) {
            case LOOM_TYPE_Q2_K:
                set_f16(bp + offsetof(loom__block_q2_K, d), d);
                set_f16(bp + offsetof(loom__block_q2_K, dmin), d * 0.5f);
                break;
            case LOOM_TYPE_Q3_K:
                set_f16(bp + offsetof(loom__block_q3_K, d), d);
                break;
            case LOOM_TYPE_Q4_K:
                set_f16(bp + offsetof(loom__block_q4_K, d), d);
                set_f16(bp + offsetof(loom__block_q4_K, dmin), d * 0.5f);
                break;
            case LOOM_TYPE_Q5_K:
                set_f16(bp + offsetof(loom__block_q5_K, d), d);
                set_f16(bp + offsetof(loom__block_q5_K, dmin), d * 0.5f);
                break;
            case LOOM_TYPE_Q6_K:
                set_f16(bp + offsetof(loom__block_q6_K, d), d);
                break;
            default:
                fail_msg("no generator for type %s", loom__type_name(t));
            }
        }
    }
    free(src);
}
