/* fp8.h — FP8 E4M3 and E5M2 <-> float32, float16 and bfloat16, one definition shared by host C,
 * C++ and CUDA device code.
 *
 * One definition because FP8 KV pages written by one backend are read by another and compared bit
 * for bit: two implementations kept in step by hand would drift at the edges (ties, subnormals,
 * saturation). Integer bit manipulation only, so the results do not depend on the floating-point
 * environment (rounding mode, a host application's FTZ / DAZ, the device's flush-to-zero), and
 * selects rather than branches, so loops over them vectorise.
 *
 * E4M3 ("fn"): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; largest finite 448 (0x7E),
 * smallest normal 2^-6, smallest subnormal 2^-9; no infinity; NaN is 0x7F / 0xFF.
 * E5M2: 1 sign, 5 exponent bits (bias 15), 2 mantissa bits; largest finite 57344 (0x7B),
 * smallest normal 2^-14, smallest subnormal 2^-16; infinities 0x7C / 0xFC, NaNs above them: the
 * top byte of an IEEE half.
 *
 * Encoding, from every source type, gives what cuda_fp8.h's __nv_cvt_*_to_fp8(x, __NV_SATFINITE,
 * ...) gives, bit for bit (tests/tensor/test_fp8_cuda_ref.cpp checks it):
 *   - round to nearest, ties to even; subnormals are kept; magnitudes up to half the smallest
 *     subnormal (that tie included: zero is even) give a zero of the input's sign;
 *   - from halfway past the largest finite value on (464 for E4M3, 61440 for E5M2), infinities
 *     included, saturate to the largest finite value with the input's sign: the KV cache's
 *     scales make overflow a matter of rounding, never a reason to store an infinity or a NaN;
 *   - any NaN gives 0x7F in both formats, its sign dropped, as cuda's canonical NaN.
 * Decoding is exact: every E4M3 and E5M2 value is a float, a half (normal or subnormal) and a
 * bfloat16. NaN codes decode to cuda_fp8.h's canonical NaNs: 0x7FFFFFFF (float), 0x7FFF (half,
 * bfloat16), sign dropped. */
#pragma once

#include <stdint.h>

#include "tensor/fp16.h" /* LOOM__HOST_DEVICE, loom__f32_bits, half and bfloat16 widening */

/* ---- decoding ----------------------------------------------------------------------------- */

LOOM__HOST_DEVICE static inline float loom__fp8_e4m3_to_f32(uint8_t b) {
    const uint32_t em = b & 0x7fu; /* exponent and mantissa */
    /* Normal codes: fields into float position, exponent rebiased 7 -> 127. Subnormal codes are
     * m * 2^-9: the int -> float conversion and the power-of-two scaling are both exact and
     * never touch a float subnormal. */
    const uint32_t normal = (em << 20) + ((127u - 7u) << 23);
    const uint32_t sub = loom__f32_bits((float)em * 0x1p-9f);
    const uint32_t bits = ((uint32_t)(b & 0x80u) << 24) | (em < 8u ? sub : normal);
    return loom__f32_from_bits(em == 0x7fu ? 0x7fffffffu : bits);
}

LOOM__HOST_DEVICE static inline float loom__fp8_e5m2_to_f32(uint8_t b) {
    const float f = loom__f16_to_f32((uint16_t)(b << 8));
    return (b & 0x7fu) > 0x7cu ? loom__f32_from_bits(0x7fffffffu) : f;
}

/* Every nonzero E4M3 value is a normal half, subnormal codes (m * 2^-9) included: those take
 * the half's exponent and mantissa from the exact float. */
LOOM__HOST_DEVICE static inline uint16_t loom__fp8_e4m3_to_f16(uint8_t b) {
    const uint32_t em = b & 0x7fu;
    const uint32_t normal = (em << 7) + ((15u - 7u) << 10);
    const uint32_t sub = (loom__f32_bits((float)em * 0x1p-9f) >> 13) - ((127u - 15u) << 10);
    const uint32_t mag = em < 8u ? (em == 0u ? 0u : sub) : normal;
    const uint32_t h = ((uint32_t)(b & 0x80u) << 8) | mag;
    return (uint16_t)(em == 0x7fu ? 0x7fffu : h);
}

/* E5M2 is the top byte of a half: b << 8 is the half, NaN payloads and all; only the NaNs are
 * made canonical. */
LOOM__HOST_DEVICE static inline uint16_t loom__fp8_e5m2_to_f16(uint8_t b) {
    return (uint16_t)((b & 0x7fu) > 0x7cu ? 0x7fffu : (uint32_t)b << 8);
}

/* Three (two) mantissa bits fit bfloat16's seven, and both exponent ranges fit its eight bits:
 * the float's top half is exact, and the canonical float NaN's top half is the bfloat16 one. */
LOOM__HOST_DEVICE static inline uint16_t loom__fp8_e4m3_to_bf16(uint8_t b) {
    return (uint16_t)(loom__f32_bits(loom__fp8_e4m3_to_f32(b)) >> 16);
}

LOOM__HOST_DEVICE static inline uint16_t loom__fp8_e5m2_to_bf16(uint8_t b) {
    return (uint16_t)(loom__f32_bits(loom__fp8_e5m2_to_f32(b)) >> 16);
}

/* The half whose value is the E4M3 value times 2^-8, for widening with F16C (or a half2
 * conversion) and one exact multiply by 256 afterwards. E4M3's exponent field put in the half's
 * (bias 7 read as bias 15) scales normal codes by 2^-8; subnormal codes m * 2^-9 land on half
 * subnormals (m << 7) * 2^-24 = m * 2^-17, the same scaling, so one shift covers every code. The
 * NaN codes land on ±1.875 (480 * 2^-8), not on a NaN: the encoders never write them for a
 * number. (E5M2 needs no scaling: its half is b << 8.) */
LOOM__HOST_DEVICE static inline uint16_t loom__fp8_e4m3_to_f16_scaled_bits(uint8_t b) {
    return (uint16_t)(((b & 0x7fu) << 7) | ((b & 0x80u) << 8));
}

/* ---- encoding ----------------------------------------------------------------------------- */

/* |x| (float bits a: finite and below the saturation point) to the magnitude code with `mbits`
 * mantissa bits and exponent bias `bias`, nearest-even. Both candidates are computed and one is
 * selected; the constant arguments fold. */
LOOM__HOST_DEVICE static inline uint32_t loom__fp8_round_mag(uint32_t a, uint32_t mbits,
                                                             uint32_t bias) {
    const uint32_t drop = 23u - mbits; /* float mantissa bits a normal code loses */
    /* Normal code: rebias the exponent in place and round the float's bits; a carry out of the
     * mantissa moves into the exponent, as it should. */
    const uint32_t rebased = a - ((127u - bias) << 23);
    const uint32_t normal = (rebased + (1u << (drop - 1u)) - 1u + ((rebased >> drop) & 1u)) >> drop;
    /* Subnormal code: the value in units of the smallest subnormal, 2^(1 - bias - mbits), is
     * m >> (151 - bias - mbits - e), m with its implicit bit. Shifts past 24 leave m below half
     * a unit: zero (float zeros and subnormals end there too). Rounding up the largest
     * subnormal gives 1 << mbits, the smallest normal code. The exponent is pinned for normal
     * inputs so that the shift stays in range (no undefined shifts); that result is not used. */
    const uint32_t is_sub = a < ((128u - bias) << 23);
    const uint32_t e = is_sub ? a >> 23 : 127u - bias;
    const uint32_t shift_raw = 151u - bias - mbits - e; /* >= 24 - mbits */
    const uint32_t shift = shift_raw < 25u ? shift_raw : 25u;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    /* Selects, not (rem > halfway) | (...): GCC vectorises loops over this form only. */
    const uint32_t sub = q + (rem > halfway ? 1u : rem == halfway ? (q & 1u) : 0u);
    return is_sub ? sub : normal;
}

LOOM__HOST_DEVICE static inline uint8_t loom__f32_to_fp8_e4m3(float f) {
    const uint32_t x = loom__f32_bits(f), a = x & 0x7fffffffu, sign = (x >> 24) & 0x80u;
    uint32_t code = sign | loom__fp8_round_mag(a, 3u, 7u);
    code = a >= 0x43e80000u ? sign | 0x7eu : code; /* 464: halfway from 448 to 480 */
    return (uint8_t)(a > 0x7f800000u ? 0x7fu : code);
}

LOOM__HOST_DEVICE static inline uint8_t loom__f32_to_fp8_e5m2(float f) {
    const uint32_t x = loom__f32_bits(f), a = x & 0x7fffffffu, sign = (x >> 24) & 0x80u;
    uint32_t code = sign | loom__fp8_round_mag(a, 2u, 15u);
    code = a >= 0x47700000u ? sign | 0x7bu : code; /* 61440: halfway from 57344 to 65536 */
    return (uint8_t)(a > 0x7f800000u ? 0x7fu : code);
}

/* Half subnormals lie far below E4M3's smallest subnormal: widening first is exact and costs
 * nothing in range. */
LOOM__HOST_DEVICE static inline uint8_t loom__f16_to_fp8_e4m3(uint16_t h) {
    return loom__f32_to_fp8_e4m3(loom__f16_to_f32(h));
}

/* E5M2 is a half with 8 mantissa bits fewer, subnormals aligned: round those 8 bits off. */
LOOM__HOST_DEVICE static inline uint8_t loom__f16_to_fp8_e5m2(uint16_t h) {
    const uint32_t a = h & 0x7fffu, sign = (uint32_t)(h >> 8) & 0x80u;
    uint32_t code = sign | ((a + 0x7fu + ((a >> 8) & 1u)) >> 8);
    code = a >= 0x7b80u ? sign | 0x7bu : code; /* 61440 */
    return (uint8_t)(a > 0x7c00u ? 0x7fu : code);
}

LOOM__HOST_DEVICE static inline uint8_t loom__bf16_to_fp8_e4m3(uint16_t h) {
    return loom__f32_to_fp8_e4m3(loom__bf16_to_f32(h));
}

LOOM__HOST_DEVICE static inline uint8_t loom__bf16_to_fp8_e5m2(uint16_t h) {
    return loom__f32_to_fp8_e5m2(loom__bf16_to_f32(h));
}
