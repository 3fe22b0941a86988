// test_fp8_cuda_ref.cpp — src/tensor/fp8.h bit for bit against the CUDA toolkit's own FP8
// conversions (cuda_fp8.h's host code paths: no device is touched, none is needed).
//
// For E4M3 and E5M2 with saturation (__NV_SATFINITE): all 256 codes decoded to float, half and
// bfloat16 (and the scaled-half shortcut checked against the exact decode); every half bit
// pattern encoded, from its bits and from its float; every bfloat16 bit pattern encoded; every
// midpoint between neighbouring codes and the floats either side of it; 10 million pseudo-random
// floats (fixed seed), half of them uniform over bit patterns, half concentrated on the formats'
// range, saturation and underflow included; the named edges (±max, max + 1/2 ulp, the smallest
// subnormal and half of it, the subnormal / normal edge, ±0, NaN, ±inf). A few values fixed by
// the formats' definitions are asserted without the reference. The first mismatches are printed
// (input, ours, cuda's) and the program exits 1. Built and registered only where cuda_fp8.h is.
#include <cuda_fp8.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "tensor/fp8.h"

namespace {

long g_bad = 0;
long g_checked = 0;

void mismatch(const char *what, uint32_t input, uint32_t ours, uint32_t ref) {
    if (g_bad++ < 10)
        std::printf("MISMATCH %s: input 0x%08x, loom 0x%08x, cuda 0x%08x\n", what, input, ours,
                    ref);
}

void expect(const char *what, uint32_t input, uint32_t ours, uint32_t ref) {
    g_checked++;
    if (ours != ref) mismatch(what, input, ours, ref);
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// ---- cuda's answers ---------------------------------------------------------------------------

uint32_t ref_f32_to(float f, __nv_fp8_interpretation_t fmt) {
    return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, fmt);
}

uint32_t ref_f16_to(uint16_t h, __nv_fp8_interpretation_t fmt) {
    __half_raw r;
    r.x = h;
    return __nv_cvt_halfraw_to_fp8(r, __NV_SATFINITE, fmt);
}

uint32_t ref_bf16_to(uint16_t h, __nv_fp8_interpretation_t fmt) {
    __nv_bfloat16_raw r;
    r.x = h;
    return __nv_cvt_bfloat16raw_to_fp8(r, __NV_SATFINITE, fmt);
}

template <typename T> void ref_decode(uint8_t c, uint32_t *f32, uint32_t *f16, uint32_t *bf16) {
    T v;
    v.__x = c;
    *f32 = bits(static_cast<float>(v));
    *f16 = static_cast<__half_raw>(static_cast<__half>(v)).x;
    *bf16 = static_cast<__nv_bfloat16_raw>(static_cast<__nv_bfloat16>(v)).x;
}

// ---- checks -----------------------------------------------------------------------------------

void check_float(float f) {
    expect("f32 -> e4m3", bits(f), loom__f32_to_fp8_e4m3(f), ref_f32_to(f, __NV_E4M3));
    expect("f32 -> e5m2", bits(f), loom__f32_to_fp8_e5m2(f), ref_f32_to(f, __NV_E5M2));
}

void check_decode() {
    for (uint32_t c = 0; c < 256; c++) {
        const uint8_t b = (uint8_t)c;
        uint32_t f32, f16, bf16;
        ref_decode<__nv_fp8_e4m3>(b, &f32, &f16, &bf16);
        expect("e4m3 -> f32", c, bits(loom__fp8_e4m3_to_f32(b)), f32);
        expect("e4m3 -> f16", c, loom__fp8_e4m3_to_f16(b), f16);
        expect("e4m3 -> bf16", c, loom__fp8_e4m3_to_bf16(b), bf16);
        if ((c & 0x7f) != 0x7f) { // NaN codes have no scaled value
            const float scaled = loom__f16_to_f32(loom__fp8_e4m3_to_f16_scaled_bits(b)) * 256.0f;
            expect("e4m3 scaled half * 256", c, bits(scaled), f32);
        }
        ref_decode<__nv_fp8_e5m2>(b, &f32, &f16, &bf16);
        expect("e5m2 -> f32", c, bits(loom__fp8_e5m2_to_f32(b)), f32);
        expect("e5m2 -> f16", c, loom__fp8_e5m2_to_f16(b), f16);
        expect("e5m2 -> bf16", c, loom__fp8_e5m2_to_bf16(b), bf16);
        if ((c & 0x7f) <= 0x7c) expect("e5m2 half == b << 8", c, c << 8, f16);
    }
}

void check_halves() {
    for (uint32_t h = 0; h < 65536; h++) {
        const uint16_t x = (uint16_t)h;
        expect("f16 -> e4m3", h, loom__f16_to_fp8_e4m3(x), ref_f16_to(x, __NV_E4M3));
        expect("f16 -> e5m2", h, loom__f16_to_fp8_e5m2(x), ref_f16_to(x, __NV_E5M2));
        check_float(loom__f16_to_f32(x));
    }
}

void check_bfloat16s() {
    for (uint32_t h = 0; h < 65536; h++) {
        const uint16_t x = (uint16_t)h;
        expect("bf16 -> e4m3", h, loom__bf16_to_fp8_e4m3(x), ref_bf16_to(x, __NV_E4M3));
        expect("bf16 -> e5m2", h, loom__bf16_to_fp8_e5m2(x), ref_bf16_to(x, __NV_E5M2));
    }
}

void check_around(float f) {
    for (int d = -2; d <= 2; d++) {
        const float v = from_bits(bits(f) + (uint32_t)d);
        check_float(v);
        check_float(-v);
    }
}

// Ties are where rounding goes wrong: the exact midpoint between every pair of neighbouring
// codes (and past the largest, the saturation edge), and the floats just either side of it.
void check_midpoints() {
    for (uint32_t c = 0; c < 0x7e; c++) { // E4M3: 0x7E is the largest finite code
        const float lo = loom__fp8_e4m3_to_f32((uint8_t)c);
        check_around((lo + loom__fp8_e4m3_to_f32((uint8_t)(c + 1))) / 2);
    }
    check_around(464.0f);
    for (uint32_t c = 0; c < 0x7b; c++) { // E5M2: 0x7B
        const float lo = loom__fp8_e5m2_to_f32((uint8_t)c);
        check_around((lo + loom__fp8_e5m2_to_f32((uint8_t)(c + 1))) / 2);
    }
    check_around(61440.0f);
}

void check_random() {
    uint64_t s = 0x243f6a8885a308d3ull;
    for (long i = 0; i < 10000000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17; // xorshift64
        uint32_t u = (uint32_t)(s >> 32);
        // Odd draws: exponents 2^-21 .. 2^18, every mantissa and sign: below half the smallest
        // E4M3 and E5M2 subnormals through both subnormal ranges to past both saturations.
        if (i & 1) u = (u & 0x807fffffu) | ((uint32_t)(106 + (uint32_t)s % 40) << 23);
        check_float(from_bits(u));
    }
}

void check_edges() {
    const float inf = from_bits(0x7f800000u), nan = from_bits(0x7fc00000u);
    const float edges[] = {448.0f,
                           464.0f,
                           480.0f,
                           57344.0f,
                           61440.0f,
                           65536.0f, // ±max, max + 1/2 ulp, beyond
                           0x1p-9f,
                           0x1p-10f,
                           0x1.8p-10f,
                           0x1p-16f,
                           0x1p-17f,
                           0x1.8p-17f, // smallest subnormal, half
                           0x1.cp-7f,
                           0x1p-6f,
                           0x1.8p-15f,
                           0x1p-14f, // largest subnormal, smallest normal
                           0.0f,
                           1.0f,
                           3.4028235e38f,
                           1e-45f,
                           inf,
                           nan,
                           from_bits(0x7f800001u),
                           from_bits(0x7fbfffffu),
                           from_bits(0x7fffffffu)};
    for (float e : edges) check_around(e);
}

// Values fixed by the formats' definitions, asserted without cuda's help.
void check_fixed() {
    struct {
        const char *what;
        uint32_t got, want;
    } const fixed[] = {
        {"e4m3 0x7e", bits(loom__fp8_e4m3_to_f32(0x7e)), bits(448.0f)},
        {"e4m3 0x01", bits(loom__fp8_e4m3_to_f32(0x01)), bits(0x1p-9f)},
        {"e4m3 0x08", bits(loom__fp8_e4m3_to_f32(0x08)), bits(0x1p-6f)},
        {"e4m3 0xb8", bits(loom__fp8_e4m3_to_f32(0xb8)), bits(-1.0f)},
        {"e4m3 1.0", loom__f32_to_fp8_e4m3(1.0f), 0x38},
        {"e4m3 448", loom__f32_to_fp8_e4m3(448.0f), 0x7e},
        {"e4m3 1e9", loom__f32_to_fp8_e4m3(1e9f), 0x7e},
        {"e4m3 -inf", loom__f32_to_fp8_e4m3(-from_bits(0x7f800000u)), 0xfe},
        {"e4m3 2^-10", loom__f32_to_fp8_e4m3(0x1p-10f), 0x00},
        {"e4m3 -2^-10", loom__f32_to_fp8_e4m3(-0x1p-10f), 0x80},
        {"e4m3 1.5*2^-9", loom__f32_to_fp8_e4m3(0x1.8p-9f), 0x02},
        {"e5m2 0x7b", bits(loom__fp8_e5m2_to_f32(0x7b)), bits(57344.0f)},
        {"e5m2 0x01", bits(loom__fp8_e5m2_to_f32(0x01)), bits(0x1p-16f)},
        {"e5m2 0x7c", bits(loom__fp8_e5m2_to_f32(0x7c)), 0x7f800000u},
        {"e5m2 1.0", loom__f32_to_fp8_e5m2(1.0f), 0x3c},
        {"e5m2 57344", loom__f32_to_fp8_e5m2(57344.0f), 0x7b},
        {"e5m2 inf", loom__f32_to_fp8_e5m2(from_bits(0x7f800000u)), 0x7b},
        {"e5m2 -65536", loom__f32_to_fp8_e5m2(-65536.0f), 0xfb},
        {"e4m3 scaled 0x01", loom__fp8_e4m3_to_f16_scaled_bits(0x01), 0x0080}, // 2^-17
        {"e4m3 scaled 0xfe", loom__fp8_e4m3_to_f16_scaled_bits(0xfe), 0xbf00}, // -1.75
    };
    for (const auto &f : fixed) {
        g_checked++;
        if (f.got != f.want && g_bad++ < 10)
            std::printf("MISMATCH fixed value %s: loom 0x%08x, expected 0x%08x\n", f.what, f.got,
                        f.want);
    }
}

} // namespace

int main() {
    const auto t0 = std::chrono::steady_clock::now();
    check_fixed();
    check_decode();
    check_halves();
    check_bfloat16s();
    check_midpoints();
    check_edges();
    check_random();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("fp8 vs cuda_fp8.h: %ld checks, %ld mismatches, %.2f s\n", g_checked, g_bad, s);
    return g_bad ? 1 : 0;
}
