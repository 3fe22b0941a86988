/* test_fp8.c — src/tensor/fp8.h without the CUDA toolkit: values fixed by the formats'
 * definitions, every code decoded against its fields (in double) and round-tripped, encoding
 * against an independent nearest-code reference (exact double distances, ties to the even code,
 * saturation), monotonicity over sorted floats, saturation and NaN, the half and bfloat16 entry
 * points against the float ones, the scaled-half shortcut, and independence from the rounding
 * mode. test_fp8_cuda_ref.cpp compares the same functions with cuda_fp8.h where it is found. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fenv.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "tensor/fp8.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* One format's shape, and its encoder, for the generic checks. */
typedef struct {
    const char *name;
    int mbits, bias;
    uint8_t max_code; /* largest finite magnitude */
    double saturate;  /* from here on (halfway past the largest finite value), the max */
    uint8_t (*enc)(float);
    float (*dec)(uint8_t);
    bool (*is_nan)(uint8_t);
} fp8_format;

static uint8_t enc_e4m3(float f) {
    return loom__f32_to_fp8_e4m3(f);
}
static uint8_t enc_e5m2(float f) {
    return loom__f32_to_fp8_e5m2(f);
}
static float dec_e4m3(uint8_t b) {
    return loom__fp8_e4m3_to_f32(b);
}
static float dec_e5m2(uint8_t b) {
    return loom__fp8_e5m2_to_f32(b);
}
static bool nan_e4m3(uint8_t b) {
    return (b & 0x7f) == 0x7f;
}
static bool nan_e5m2(uint8_t b) {
    return (b & 0x7f) > 0x7c;
}

static const fp8_format E4M3 = {"e4m3", 3, 7, 0x7e, 464.0, enc_e4m3, dec_e4m3, nan_e4m3};
static const fp8_format E5M2 = {"e5m2", 2, 15, 0x7b, 61440.0, enc_e5m2, dec_e5m2, nan_e5m2};

/* A finite code's value from its fields, in double (exact). */
static double code_value(const fp8_format *fmt, uint8_t b) {
    int e = (b & 0x7f) >> fmt->mbits, m = b & ((1 << fmt->mbits) - 1);
    double v = e == 0 ? ldexp(m, 1 - fmt->bias - fmt->mbits)
                      : ldexp((1 << fmt->mbits) + m, e - fmt->bias - fmt->mbits);
    return b & 0x80 ? -v : v;
}

/* Independent encoder: the nearest finite code by exact double distance, ties to the even code,
 * saturating from fmt->saturate on; NaN gives 0x7F. */
static uint8_t ref_encode(const fp8_format *fmt, float f) {
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    double v = fabs((double)f);
    if (v >= fmt->saturate) return sign | fmt->max_code;
    int lo = 0, hi = fmt->max_code; /* the largest code with value <= v */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (code_value(fmt, (uint8_t)mid) <= v)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo == fmt->max_code) return sign | fmt->max_code;
    double below = v - code_value(fmt, (uint8_t)lo);
    double above = code_value(fmt, (uint8_t)(lo + 1)) - v;
    int code = below < above ? lo : above < below ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
    return sign | (uint8_t)code;
}

/* ---- fixed values ------------------------------------------------------------------------- */

static void test_fixed_values(void **state) {
    (void)state;
    assert_true(loom__fp8_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(loom__fp8_e4m3_to_f32(0xfe) == -448.0f);
    assert_true(loom__fp8_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(loom__fp8_e4m3_to_f32(0x08) == 0x1p-6f);
    assert_true(loom__fp8_e4m3_to_f32(0x38) == 1.0f);
    assert_int_equal(bits_of(loom__fp8_e4m3_to_f32(0x80)), 0x80000000u); /* -0 */
    assert_true(isnan(loom__fp8_e4m3_to_f32(0x7f)) && isnan(loom__fp8_e4m3_to_f32(0xff)));
    assert_int_equal(loom__f32_to_fp8_e4m3(1.0f), 0x38);
    assert_int_equal(loom__f32_to_fp8_e4m3(-2.0f), 0xc0);
    assert_int_equal(loom__f32_to_fp8_e4m3(448.0f), 0x7e);
    assert_int_equal(loom__f32_to_fp8_e4m3(0x1p-9f), 0x01);
    assert_int_equal(loom__f32_to_fp8_e4m3(0x1p-10f), 0x00);  /* tie with 0: even */
    assert_int_equal(loom__f32_to_fp8_e4m3(0x1.8p-9f), 0x02); /* tie 1 | 2: even */
    assert_int_equal(loom__f32_to_fp8_e4m3(0x1.1p0f), 0x38);  /* tie 1 | 1.125: even */
    assert_int_equal(loom__f32_to_fp8_e4m3(0x1.3p0f), 0x3a);  /* tie 1.125 | 1.25: even */

    assert_true(loom__fp8_e5m2_to_f32(0x3c) == 1.0f);
    assert_true(loom__fp8_e5m2_to_f32(0x7b) == 57344.0f);
    assert_true(loom__fp8_e5m2_to_f32(0x01) == 0x1p-16f);
    assert_true(loom__fp8_e5m2_to_f32(0x04) == 0x1p-14f);
    assert_true(isinf(loom__fp8_e5m2_to_f32(0x7c)) && loom__fp8_e5m2_to_f32(0xfc) < 0);
    assert_true(isnan(loom__fp8_e5m2_to_f32(0x7d)) && isnan(loom__fp8_e5m2_to_f32(0xff)));
    assert_int_equal(loom__f32_to_fp8_e5m2(1.0f), 0x3c);
    assert_int_equal(loom__f32_to_fp8_e5m2(57344.0f), 0x7b);
    assert_int_equal(loom__f32_to_fp8_e5m2(0x1p-17f), 0x00); /* tie with 0: even */
    assert_int_equal(loom__f32_to_fp8_e5m2(-0x1.8p-16f), 0x82);
}

/* ---- decoding ----------------------------------------------------------------------------- */

static void check_codes(const fp8_format *fmt) {
    for (int c = 0; c < 256; c++) {
        uint8_t b = (uint8_t)c;
        float f = fmt->dec(b);
        if (fmt->is_nan(b)) {
            assert_true(isnan(f));
            assert_int_equal(fmt->enc(f), 0x7f);
            continue;
        }
        assert_int_equal(signbit(f) != 0, (c & 0x80) != 0);
        if (fmt == &E5M2 && (c & 0x7f) == 0x7c) { /* infinity: decodes, saturates back */
            assert_true(isinf(f));
            assert_int_equal(fmt->enc(f), (c & 0x80) | fmt->max_code);
            continue;
        }
        assert_true((double)f == code_value(fmt, b));
        if ((c & 0x7f) != 0) /* magnitudes order as their codes (the reference relies on it) */
            assert_true(fabs(code_value(fmt, b)) > fabs(code_value(fmt, (uint8_t)(b - 1))));
        assert_int_equal(fmt->enc(f), c); /* round trip */
    }
}

static void test_decode_and_round_trip(void **state) {
    (void)state;
    check_codes(&E4M3);
    check_codes(&E5M2);
}

/* The half and bfloat16 decoders against the float one; the scaled half (value * 2^-8) and
 * E5M2's half (b << 8) shortcuts the CPU kernels use. */
static void test_decode_to_half_and_bf16(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        uint8_t b = (uint8_t)c;
        float f4 = loom__fp8_e4m3_to_f32(b), f5 = loom__fp8_e5m2_to_f32(b);
        assert_int_equal(loom__fp8_e4m3_to_bf16(b), bits_of(f4) >> 16);
        assert_int_equal(loom__fp8_e5m2_to_bf16(b), bits_of(f5) >> 16);
        if ((c & 0x7f) == 0x7f) { /* canonical NaNs: half and bfloat16 0x7FFF */
            assert_int_equal(loom__fp8_e4m3_to_f16(b), 0x7fff);
            assert_int_equal(loom__fp8_e4m3_to_bf16(b), 0x7fff);
        } else {
            assert_int_equal(bits_of(loom__f16_to_f32(loom__fp8_e4m3_to_f16(b))), bits_of(f4));
            uint16_t scaled = loom__fp8_e4m3_to_f16_scaled_bits(b);
            assert_int_equal(bits_of(loom__f16_to_f32(scaled) * 256.0f), bits_of(f4));
            assert_int_equal(scaled, ((c & 0x7f) << 7) | ((c & 0x80) << 8));
        }
        if ((c & 0x7f) <= 0x7c) {
            assert_int_equal(loom__fp8_e5m2_to_f16(b), c << 8);
            assert_int_equal(bits_of(loom__f16_to_f32(loom__fp8_e5m2_to_f16(b))), bits_of(f5));
        } else {
            assert_int_equal(loom__fp8_e5m2_to_f16(b), 0x7fff);
            assert_int_equal(loom__fp8_e5m2_to_bf16(b), 0x7fff);
        }
    }
}

/* ---- encoding ----------------------------------------------------------------------------- */

static void check_encode(float f) {
    uint8_t want4 = ref_encode(&E4M3, f), want5 = ref_encode(&E5M2, f);
    uint8_t got4 = loom__f32_to_fp8_e4m3(f), got5 = loom__f32_to_fp8_e5m2(f);
    if (got4 != want4 || got5 != want5)
        fail_msg("encode %a (0x%08x): e4m3 %02x (want %02x), e5m2 %02x (want %02x)", (double)f,
                 bits_of(f), got4, want4, got5, want5);
}

/* Every half's value, the midpoint between every pair of neighbouring codes and the floats
 * either side, and random floats over the formats' range and over all bit patterns. */
static void test_encode_reference(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) check_encode(loom__f16_to_f32((uint16_t)h));
    const fp8_format *fmts[] = {&E4M3, &E5M2};
    for (int k = 0; k < 2; k++)
        for (int c = 0; c <= fmts[k]->max_code; c++) {
            double next = c < fmts[k]->max_code
                              ? code_value(fmts[k], (uint8_t)(c + 1))
                              : 2 * fmts[k]->saturate - code_value(fmts[k], (uint8_t)c);
            float mid = (float)((code_value(fmts[k], (uint8_t)c) + next) / 2);
            for (int d = -2; d <= 2; d++) {
                check_encode(float_of(bits_of(mid) + (uint32_t)d));
                check_encode(-float_of(bits_of(mid) + (uint32_t)d));
            }
        }
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rng_next();
        if (i & 1) u = (u & 0x807fffffu) | ((uint32_t)(106 + (u >> 8) % 40) << 23);
        check_encode(float_of(u));
    }
}

/* Ascending floats give non-decreasing codes (magnitudes order as their codes: check_codes), and
 * -x gives x's code with the sign. */
static void test_monotonic(void **state) {
    (void)state;
    const fp8_format *fmts[] = {&E4M3, &E5M2};
    for (int k = 0; k < 2; k++) {
        uint8_t prev = 0;
        for (uint64_t u = 0; u <= 0x7f800000u; u += 61) {
            float f = float_of((uint32_t)u);
            uint8_t c = fmts[k]->enc(f);
            if (c < prev)
                fail_msg("%s: %a gives %02x, below %02x", fmts[k]->name, (double)f, c, prev);
            prev = c;
            assert_int_equal(fmts[k]->enc(-f), c | 0x80);
        }
        assert_int_equal(prev, fmts[k]->max_code);
    }
}

static void test_saturation_and_nan(void **state) {
    (void)state;
    const float inf = INFINITY;
    const float big[] = {464.0f, 465.0f, 480.0f, 1e6f, 3.4028235e38f, inf};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        assert_int_equal(loom__f32_to_fp8_e4m3(big[i]), 0x7e);
        assert_int_equal(loom__f32_to_fp8_e4m3(-big[i]), 0xfe);
    }
    assert_int_equal(loom__f32_to_fp8_e4m3(nextafterf(464.0f, 0)), 0x7e); /* rounds down */
    const float bigger[] = {61440.0f, 65504.0f, 65536.0f, 3.4028235e38f, inf};
    for (size_t i = 0; i < sizeof bigger / sizeof bigger[0]; i++) {
        assert_int_equal(loom__f32_to_fp8_e5m2(bigger[i]), 0x7b);
        assert_int_equal(loom__f32_to_fp8_e5m2(-bigger[i]), 0xfb);
    }
    assert_int_equal(loom__f32_to_fp8_e5m2(nextafterf(61440.0f, 0)), 0x7b);
    assert_int_equal(loom__f16_to_fp8_e5m2(0x7c00), 0x7b);  /* half infinity */
    assert_int_equal(loom__f16_to_fp8_e5m2(0xfbff), 0xfb);  /* -65504 */
    assert_int_equal(loom__bf16_to_fp8_e4m3(0xff80), 0xfe); /* bfloat16 -infinity */
    /* Any NaN, quiet or signalling, either sign: 0x7F in both formats. */
    const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        assert_int_equal(loom__f32_to_fp8_e4m3(float_of(nans[i])), 0x7f);
        assert_int_equal(loom__f32_to_fp8_e5m2(float_of(nans[i])), 0x7f);
    }
    assert_int_equal(loom__f16_to_fp8_e5m2(0xfc01), 0x7f);
    assert_int_equal(loom__f16_to_fp8_e4m3(0x7e00), 0x7f);
}

/* The half and bfloat16 encoders are the float ones on the widened value, for every pattern. */
static void test_half_and_bf16_entry_points(void **state) {
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float fh = loom__f16_to_f32(h), fb = loom__bf16_to_f32(h);
        assert_int_equal(loom__f16_to_fp8_e4m3(h), loom__f32_to_fp8_e4m3(fh));
        assert_int_equal(loom__f16_to_fp8_e5m2(h), loom__f32_to_fp8_e5m2(fh));
        assert_int_equal(loom__bf16_to_fp8_e4m3(h), loom__f32_to_fp8_e4m3(fb));
        assert_int_equal(loom__bf16_to_fp8_e5m2(h), loom__f32_to_fp8_e5m2(fb));
    }
}

/* The conversions are integer code: another rounding mode changes nothing. */
static void test_rounding_mode_independent(void **state) {
    (void)state;
    const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        uint32_t hash = 0;
        for (int pass = 0; pass < 2; pass++) {
            if (fesetround(pass ? modes[k] : FE_TONEAREST) != 0) skip();
            uint32_t h = 0;
            for (uint32_t i = 0; i < 65536; i++) {
                float f = loom__f16_to_f32((uint16_t)i);
                h = h * 31u + loom__f32_to_fp8_e4m3(f);
                h = h * 31u + loom__f32_to_fp8_e5m2(f);
                h = h * 31u + bits_of(loom__fp8_e4m3_to_f32((uint8_t)i));
                h = h * 31u + loom__fp8_e4m3_to_f16((uint8_t)i);
            }
            if (pass == 0) hash = h;
            fesetround(FE_TONEAREST);
            if (pass == 1) assert_int_equal(h, hash);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_values),
        cmocka_unit_test(test_decode_and_round_trip),
        cmocka_unit_test(test_decode_to_half_and_bf16),
        cmocka_unit_test(test_encode_reference),
        cmocka_unit_test(test_monotonic),
        cmocka_unit_test(test_saturation_and_nan),
        cmocka_unit_test(test_half_and_bf16_entry_points),
        cmocka_unit_test(test_rounding_mode_independent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
