/* fp8.h — FP8 E4M3 and E5M2 <-> float32, one definition for host C and CUDA device code.
 *
 * E4M3 ("fn"): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; largest finite 448, no
 * infinity, NaN 0x7F / 0xFF. E5M2: 1 sign, 5 exponent bits (bias 15), 2 mantissa bits; largest
 * finite 57344, infinities 0x7C / 0xFC, NaNs above them — the top byte of an IEEE half.
 * Encoding rounds to nearest, ties to even, keeps subnormals, and saturates: anything beyond the
 * largest finite value (infinity included) gives it, with the sign — the KV cache's scales make
 * overflow a rounding matter, never a reason to store infinity. NaN stays NaN. Integer bit
 * manipulation only, so the results do not depend on the floating-point environment. */
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define LOOM_FP8_FN static inline __host__ __device__
#else
#define LOOM_FP8_FN static inline
#endif

LOOM_FP8_FN uint32_t loom__fp8_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

LOOM_FP8_FN float loom__fp8_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A code with `mbits` mantissa bits and exponent bias `bias`, exactly. */
LOOM_FP8_FN float loom__fp8_decode(uint8_t b, int mbits, int bias) {
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    const uint32_t e = (b & 0x7fu) >> mbits, m = b & ((1u << mbits) - 1u);
    float mag;
    if (e == 0) { /* subnormal: m * 2^(1 - bias - mbits), exact */
        mag = (float)m * loom__fp8_f32_from_bits((uint32_t)(127 + 1 - bias - mbits) << 23);
    } else {
        mag = loom__fp8_f32_from_bits(((e - (uint32_t)bias + 127u) << 23) | (m << (23 - mbits)));
    }
    return loom__fp8_f32_from_bits(sign | loom__fp8_f32_bits(mag));
}

LOOM_FP8_FN float loom__fp8_e4m3_to_f32(uint8_t b) {
    if ((b & 0x7fu) == 0x7fu)
        return loom__fp8_f32_from_bits(((uint32_t)(b & 0x80u) << 24) | 0x7fc00000u);
    return loom__fp8_decode(b, 3, 7);
}

LOOM_FP8_FN float loom__fp8_e5m2_to_f32(uint8_t b) {
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    if ((b & 0x7fu) == 0x7cu) return loom__fp8_f32_from_bits(sign | 0x7f800000u);
    if ((b & 0x7fu) > 0x7cu) return loom__fp8_f32_from_bits(sign | 0x7fc00000u);
    return loom__fp8_decode(b, 2, 15);
}

/* |f| (bits a, finite, below the saturation point) to the code's magnitude, nearest-even. */
LOOM_FP8_FN uint32_t loom__fp8_round(uint32_t a, int mbits, int bias) {
    const int e = (int)(a >> 23) - 127; /* unbiased exponent of a normal float */
    const int emin = 1 - bias;          /* the format's smallest normal exponent */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    int shift = 23 - mbits;                    /* dropped bits of a normal result */
    uint32_t ebias = (uint32_t)(e - emin + 1); /* biased exponent of a normal result */
    if (e < emin) { /* subnormal result (or zero): shift the extra exponent into the mantissa */
        shift += emin - e;
        ebias = 0;
        if (shift > 24) return 0; /* below half the smallest subnormal */
    }
    if ((a >> 23) == 0) return 0; /* float zero or subnormal: far below any FP8 subnormal */
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    /* For a normal result q holds the implicit bit: drop it and place the exponent; the
     * rounding carry then moves into the exponent as it should. */
    uint32_t code = ebias ? ((ebias << mbits) + (q & ((1u << mbits) - 1u))) : q;
    code += (rem > half) | ((rem == half) & (code & 1u));
    return code;
}

LOOM_FP8_FN uint8_t loom__f32_to_fp8_e4m3(float f) {
    const uint32_t x = loom__fp8_f32_bits(f), sign = (x >> 24) & 0x80u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fu; /* every NaN, whatever its sign (as cuda_fp8.h) */
    /* 464 is halfway between 448 (0x7E) and the NaN slot: from there on, saturate. */
    if (a >= 0x43e80000u) return (uint8_t)(sign | 0x7eu);
    return (uint8_t)(sign | loom__fp8_round(a, 3, 7));
}

LOOM_FP8_FN uint8_t loom__f32_to_fp8_e5m2(float f) {
    const uint32_t x = loom__fp8_f32_bits(f), sign = (x >> 24) & 0x80u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fu; /* every NaN, whatever its sign (as cuda_fp8.h) */
    /* 61440 is halfway between 57344 (0x7B) and 2^16: from there on (infinity too), saturate. */
    if (a >= 0x47700000u) return (uint8_t)(sign | 0x7bu);
    return (uint8_t)(sign | loom__fp8_round(a, 2, 15));
}
