/* fp16.h — inline IEEE binary16 and bfloat16 <-> float32 conversions.
 *
 * Integer bit manipulation only: the results do not depend on the floating-point environment
 * (rounding mode, flush-to-zero / denormals-are-zero set by a host application), and the
 * half -> float direction is written with selects rather than branches so loops over it
 * auto-vectorise. quant.h exports these as loom__f16_to_f32 etc.; kernels in this layer call the
 * inline forms directly. The functions are also CUDA device functions under nvcc (fp8.h builds
 * on them, and kernels must round exactly as the host does); memcpy is available on the device. */
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define LOOM__HOST_DEVICE __host__ __device__
#else
#define LOOM__HOST_DEVICE
#endif

LOOM__HOST_DEVICE static inline uint32_t loom__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

LOOM__HOST_DEVICE static inline float loom__f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Exact: every half is representable as a float. NaN payloads are kept bit for bit. Written
 * with masks instead of branches or ?: so that loops over it vectorise. */
LOOM__HOST_DEVICE static inline float loom__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu; /* exponent and mantissa */
    /* Normal halves: move the fields into float position and rebias the exponent (15 -> 127).
     * Infinity and NaN (exponent 31) take the same shift and a second rebias, landing on the
     * all-ones float exponent with the payload carried over. */
    uint32_t special = 0u - (uint32_t)(em >= 0x7c00u);
    uint32_t normal = (em << 13) + ((uint32_t)(127 - 15) << 23);
    normal += special & ((uint32_t)(127 - 15) << 23);
    /* Subnormal halves are mant * 2^-24: the int -> float conversion and the power-of-two
     * scaling are both exact and never touch a float subnormal. */
    uint32_t sub = 0u - (uint32_t)(em < 0x0400u);
    uint32_t subnormal = loom__f32_bits((float)em * 0x1p-24f);
    return loom__f32_from_bits(sign | (subnormal & sub) | (normal & ~sub));
}

/* Round to nearest, ties to even. Overflow gives infinity (IEEE); NaN stays NaN with its sign
 * and the top payload bits, with the quiet bit set (a payload living only in the dropped low
 * bits would otherwise turn the NaN into an infinity). */
LOOM__HOST_DEVICE static inline uint16_t loom__f32_to_f16(float f) {
    uint32_t x = loom__f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    /* 65520 is halfway between the largest half (65504, odd mantissa) and 2^16: from there on
     * round-to-even gives infinity. */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* >= 2^-14: a normal half */
        uint32_t rebased = a - ((uint32_t)(127 - 15) << 23);
        uint32_t rounded = rebased + 0x0fffu + ((rebased >> 13) & 1u); /* carry may bump exp */
        return (uint16_t)(sign | (rounded >> 13));
    }
    uint32_t e = a >> 23;
    if (e < 102) return sign; /* below 2^-25 (incl. float subnormals): rounds to zero */
    /* Subnormal half: the value in units of 2^-24 is m * 2^(e - 126), m with its implicit bit. */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14 .. 24 */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    /* 0x3ff + 1 = 0x400 is the smallest normal */
    q += (rem > halfway) | ((rem == halfway) & (q & 1u));
    return (uint16_t)(sign | q);
}

/* bfloat16 is the top half of a float: widening is a shift. */
LOOM__HOST_DEVICE static inline float loom__bf16_to_f32(uint16_t h) {
    return loom__f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest even on the dropped 16 bits; NaN is kept (quiet bit set, sign and top payload
 * kept) because rounding a NaN's low payload bits could carry it into infinity. */
LOOM__HOST_DEVICE static inline uint16_t loom__f32_to_bf16(float f) {
    uint32_t x = loom__f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
