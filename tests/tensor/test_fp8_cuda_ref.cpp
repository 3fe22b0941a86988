// test_fp8_cuda_ref.cpp — src/tensor/fp8.h bit for bit against the CUDA toolkit's own
// conversions (cuda_fp8.h, which run on the host: no device is touched).
//
// Checked, for E4M3 and E5M2: all 256 codes decoded; every float whose low 16 bits are zero
// (so every BF16 value, every F16 value's float among them or near them), 20 million random
// floats — half with uniform bit patterns, half with exponents inside the formats' range — and
// the boundaries (±max, max + ½ ulp, the subnormal edge and half the smallest subnormal, ±0,
// NaN, ±inf) encoded with saturation (__NV_SATFINITE). The reference disagrees with nothing we
// ask; the first mismatch is printed and the test fails. Built when the CUDA toolkit is found.
#include <cuda_fp8.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "tensor/fp8.h"

static long g_bad = 0;

static void check_decode() {
    for (int c = 0; c < 256; c++) {
        __nv_fp8_e4m3 a;
        a.__x = (__nv_fp8_storage_t)c;
        __nv_fp8_e5m2 b;
        b.__x = (__nv_fp8_storage_t)c;
        const float ra = (float)a, rb = (float)b;
        const float oa = loom__fp8_e4m3_to_f32((uint8_t)c), ob = loom__fp8_e5m2_to_f32((uint8_t)c);
        const bool same_a = std::memcmp(&ra, &oa, 4) == 0 || (ra != ra && oa != oa);
        const bool same_b = std::memcmp(&rb, &ob, 4) == 0 || (rb != rb && ob != ob);
        if (!same_a && g_bad++ < 10) std::printf("decode e4m3 %02x: cuda %g, loom %g\n", c, ra, oa);
        if (!same_b && g_bad++ < 10) std::printf("decode e5m2 %02x: cuda %g, loom %g\n", c, rb, ob);
    }
}

static void check_encode(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    const uint8_t r4 = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
    const uint8_t r5 = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2);
    const uint8_t o4 = loom__f32_to_fp8_e4m3(f), o5 = loom__f32_to_fp8_e5m2(f);
    if (r4 != o4 && g_bad++ < 10)
        std::printf("encode e4m3 %08x (%g): cuda %02x, loom %02x\n", u, f, r4, o4);
    if (r5 != o5 && g_bad++ < 10)
        std::printf("encode e5m2 %08x (%g): cuda %02x, loom %02x\n", u, f, r5, o5);
}

static float next_up(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u++;
    std::memcpy(&f, &u, 4);
    return f;
}

int main() {
    check_decode();
    long n = 0;
    for (uint32_t hi = 0; hi < 65536; hi++, n++) check_encode(hi << 16);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (long i = 0; i < 20000000; i++, n++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17; /* xorshift64 */
        uint32_t u = (uint32_t)(s >> 32);
        if (i & 1) /* exponents 2^-27 .. 2^20: subnormals, normals and saturation of both */
            u = (u & 0x807fffffu) | ((uint32_t)(100 + (u >> 8) % 48) << 23);
        check_encode(u);
    }
    const float edges[] = {448.0f,   464.0f,     480.0f,           57344.0f,          61440.0f,
                           65536.0f, 0x1p-9f,    0x1p-10f,         0x1.8p-10f,        0x1p-16f,
                           0x1p-17f, 0x1.8p-17f, 0x1p-6f,          0x1p-14f,          0.0f,
                           1.0f,     3.4e38f,    __builtin_inff(), __builtin_nanf("")};
    for (float e : edges)
        for (float v : {e, -e, next_up(e), -next_up(e)}) {
            uint32_t u;
            std::memcpy(&u, &v, 4);
            check_encode(u);
            n++;
        }
    /* Independent of the reference: values fixed by the formats' definitions. */
    const bool fixed =
        loom__f32_to_fp8_e4m3(448.0f) == 0x7e && loom__f32_to_fp8_e4m3(1.0f) == 0x38 &&
        loom__f32_to_fp8_e4m3(0x1p-9f) == 0x01 && loom__f32_to_fp8_e4m3(1e9f) == 0x7e &&
        loom__f32_to_fp8_e4m3(-__builtin_inff()) == 0xfe && loom__f32_to_fp8_e5m2(1.0f) == 0x3c &&
        loom__f32_to_fp8_e5m2(57344.0f) == 0x7b &&
        loom__f32_to_fp8_e5m2(__builtin_inff()) == 0x7b && loom__fp8_e4m3_to_f32(0x7e) == 448.0f &&
        loom__fp8_e5m2_to_f32(0x01) == 0x1p-16f;
    if (!fixed) {
        std::printf("a fixed value is wrong\n");
        g_bad++;
    }
    std::printf("fp8: 512 codes decoded, %ld floats encoded to both formats, %ld mismatches\n", n,
                g_bad);
    return g_bad ? 1 : 0;
}
