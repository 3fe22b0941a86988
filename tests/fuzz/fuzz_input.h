/* fuzz_input.h — reading a fuzzer's bytes as typed fields: each read takes what it needs from
 * the front and gives zeros once the input runs out, so every input is a valid sequence of
 * choices and the fuzzer's mutations map to nearby choices. */
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fuzz_input {
    const uint8_t *p;
    size_t n;
} fuzz_input;

static inline uint8_t fz_u8(fuzz_input *in) {
    if (in->n == 0) return 0;
    in->n--;
    return *in->p++;
}

static inline uint32_t fz_u32(fuzz_input *in) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fz_u8(in) << (8 * i);
    return v;
}

static inline uint64_t fz_u64(fuzz_input *in) {
    return (uint64_t)fz_u32(in) | (uint64_t)fz_u32(in) << 32;
}

/* A float that is often one of the values validation must handle: NaN, infinities, zero,
 * negative, huge, tiny, and otherwise a small ordinary value or raw bits. */
static inline float fz_float(fuzz_input *in) {
    static const float special[] = {0.0f,   -0.0f,   1.0f, -1.0f, 0.5f,   2.0f,
                                    1e-45f, 3.4e38f, 1e9f, -1e9f, 0.999f, 1.0001f};
    uint8_t k = fz_u8(in);
    if (k < 12) return special[k];
    if (k == 12) return NAN;
    if (k == 13) return INFINITY;
    if (k == 14) return -INFINITY;
    if (k < 128) return (float)(k - 64) / 16.0f;
    uint32_t bits = fz_u32(in);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* An int32 that is often a boundary (0, -1, 1, INT32_MAX, INT32_MIN) or small. */
static inline int32_t fz_i32(fuzz_input *in) {
    uint8_t k = fz_u8(in);
    switch (k) {
    case 0:
        return 0;
    case 1:
        return -1;
    case 2:
        return INT32_MAX;
    case 3:
        return INT32_MIN;
    case 4:
        return (int32_t)fz_u32(in);
    default:
        return (int32_t)k - 128;
    }
}

/* The next len bytes (fewer at the end), as a pointer into the input. */
static inline const char *fz_bytes(fuzz_input *in, size_t len, size_t *got) {
    if (len > in->n) len = in->n;
    const char *s = (const char *)in->p;
    in->p += len;
    in->n -= len;
    *got = len;
    return s;
}
