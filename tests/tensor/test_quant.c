/* test_quant.c — the type table and the scalar float conversions: traits and row sizes of every
 * type (and bad ids / sizes), half <-> float exhaustively and against an independent
 * double-precision rounding reference, bfloat16 rounding and NaN handling, and the refusals of
 * the row functions on bad input. Row kernels are tested in test_quant_rows.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/quant.h"
#include "tensor/quant_layouts.h"
#include "tensor/types.h"

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

/* ---- traits and row sizes ----------------------------------------------------------------- */

static void test_traits_table(void **state) {
    (void)state;
    /* GGUF's block sizes (values, bytes) for every type loom knows. */
    static const struct {
        uint32_t id;
        const char *name;
        uint32_t elems, bytes;
        bool quantized, can_deq;
    } want[] = {
        {LOOM_TYPE_F32, "f32", 1, 4, false, true},
        {LOOM_TYPE_F16, "f16", 1, 2, false, true},
        {LOOM_TYPE_Q4_0, "q4_0", 32, 18, true, true},
        {LOOM_TYPE_Q4_1, "q4_1", 32, 20, true, true},
        {LOOM_TYPE_Q5_0, "q5_0", 32, 22, true, true},
        {LOOM_TYPE_Q5_1, "q5_1", 32, 24, true, true},
        {LOOM_TYPE_Q8_0, "q8_0", 32, 34, true, true},
        {LOOM_TYPE_Q8_1, "q8_1", 32, 36, true, false},
        {LOOM_TYPE_Q2_K, "q2_K", 256, 84, true, true},
        {LOOM_TYPE_Q3_K, "q3_K", 256, 110, true, true},
        {LOOM_TYPE_Q4_K, "q4_K", 256, 144, true, true},
        {LOOM_TYPE_Q5_K, "q5_K", 256, 176, true, true},
        {LOOM_TYPE_Q6_K, "q6_K", 256, 210, true, true},
        {LOOM_TYPE_Q8_K, "q8_K", 256, 292, true, false},
        {LOOM_TYPE_I8, "i8", 1, 1, false, false},
        {LOOM_TYPE_I16, "i16", 1, 2, false, false},
        {LOOM_TYPE_I32, "i32", 1, 4, false, false},
        {LOOM_TYPE_I64, "i64", 1, 8, false, false},
        {LOOM_TYPE_F64, "f64", 1, 8, false, false},
        {LOOM_TYPE_BF16, "bf16", 1, 2, false, true},
    };
    size_t n_known = sizeof want / sizeof want[0];
    for (size_t i = 0; i < n_known; i++) {
        const loom__type_traits *tr = loom__type_get_traits(want[i].id);
        assert_non_null(tr);
        assert_string_equal(tr->name, want[i].name);
        assert_string_equal(loom__type_name(want[i].id), want[i].name);
        assert_int_equal(tr->block_elems, want[i].elems);
        assert_int_equal(tr->block_bytes, want[i].bytes);
        assert_int_equal(tr->quantized, want[i].quantized);
        assert_int_equal(tr->can_dequantize, want[i].can_deq);
    }
    /* Every other id in the id space (and beyond) has no traits. */
    size_t known = 0;
    for (uint32_t id = 0; id < 64; id++)
        if (loom__type_get_traits(id)) known++;
    assert_int_equal(known, n_known);
    assert_null(loom__type_get_traits(4));
    assert_null(loom__type_get_traits(16));
    assert_null(loom__type_get_traits(LOOM_TYPE_GGUF_END_));
    assert_null(loom__type_get_traits(UINT32_MAX));
    /* Names for messages: GGUF types loom lacks keep their name, the rest are numbered. */
    assert_string_equal(loom__type_name(16), "iq2_xxs");
    assert_string_equal(loom__type_name(39), "mxfp4");
    assert_string_equal(loom__type_name(1000), "unknown(1000)");
    assert_string_equal(loom__type_name(UINT32_MAX), "unknown(4294967295)");
}

static void test_layout_offsets(void **state) {
    (void)state;
    /* Field offsets are format facts; the Python conformance test relies on them too. */
    assert_int_equal(offsetof(loom__block_q4_1, qs), 4);
    assert_int_equal(offsetof(loom__block_q5_0, qs), 6);
    assert_int_equal(offsetof(loom__block_q5_1, qh), 4);
    assert_int_equal(offsetof(loom__block_q5_1, qs), 8);
    assert_int_equal(offsetof(loom__block_q2_K, d), 80);
    assert_int_equal(offsetof(loom__block_q3_K, scales), 96);
    assert_int_equal(offsetof(loom__block_q3_K, d), 108);
    assert_int_equal(offsetof(loom__block_q4_K, qs), 16);
    assert_int_equal(offsetof(loom__block_q5_K, qh), 16);
    assert_int_equal(offsetof(loom__block_q5_K, qs), 48);
    assert_int_equal(offsetof(loom__block_q6_K, scales), 192);
    assert_int_equal(offsetof(loom__block_q6_K, d), 208);
    assert_int_equal(offsetof(loom__block_q8_K, bsums), 260);
}

static void test_row_bytes(void **state) {
    (void)state;
    size_t bytes = 12345;
    assert_true(loom__type_row_bytes(LOOM_TYPE_Q4_0, 64, &bytes));
    assert_int_equal(bytes, 36);
    assert_true(loom__type_row_bytes(LOOM_TYPE_Q6_K, 4096, &bytes));
    assert_int_equal(bytes, 16 * 210);
    assert_true(loom__type_row_bytes(LOOM_TYPE_F32, 7, &bytes));
    assert_int_equal(bytes, 28);
    assert_true(loom__type_row_bytes(LOOM_TYPE_Q8_K, 0, &bytes));
    assert_int_equal(bytes, 0);
    assert_true(loom__type_row_bytes(LOOM_TYPE_I8, INT64_MAX, &bytes));
    assert_int_equal(bytes, (size_t)INT64_MAX);
    assert_true(loom__type_row_bytes(LOOM_TYPE_F16, INT64_C(1) << 62, &bytes));
    assert_int_equal(bytes, (size_t)1 << 63);

    bytes = 777;
    assert_false(loom__type_row_bytes(LOOM_TYPE_Q4_0, 33, &bytes));  /* not whole blocks */
    assert_false(loom__type_row_bytes(LOOM_TYPE_Q4_K, 128, &bytes)); /* half a super-block */
    assert_false(loom__type_row_bytes(LOOM_TYPE_F32, -4, &bytes));   /* negative */
    assert_false(loom__type_row_bytes(LOOM_TYPE_Q4_0, -32, &bytes));
    assert_false(loom__type_row_bytes(4, 32, &bytes)); /* unknown ids */
    assert_false(loom__type_row_bytes(LOOM_TYPE_GGUF_END_, 32, &bytes));
    assert_false(loom__type_row_bytes(UINT32_MAX, 1, &bytes));
    assert_false(loom__type_row_bytes(LOOM_TYPE_F32, INT64_MAX, &bytes)); /* 4 * 2^63 overflows */
    assert_false(loom__type_row_bytes(LOOM_TYPE_F64, INT64_C(1) << 61, &bytes));
    assert_false(loom__type_row_bytes(LOOM_TYPE_I64, INT64_C(1) << 61, &bytes));
    assert_false(loom__type_row_bytes(LOOM_TYPE_I32, INT64_MAX, &bytes));
    assert_false(loom__type_row_bytes(LOOM_TYPE_Q4_0, 64, NULL));
    assert_int_equal(bytes, 777); /* untouched on failure */
}

/* ---- half precision ----------------------------------------------------------------------- */

/* The value of a half from its fields, in double (exact). */
static double half_value(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return sign ? -v : v;
}

static void test_f16_to_f32_exhaustive(void **state) {
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = loom__f16_to_f32(h);
        int e = (h >> 10) & 31, m = h & 1023;
        bool negative = h >> 15;
        assert_int_equal(signbit(f) != 0, negative);
        if (e == 31 && m != 0) { /* NaN: payload carried over bit for bit */
            assert_true(isnan(f));
            assert_int_equal(bits_of(f),
                             (uint32_t)negative << 31 | 0x7f800000u | (uint32_t)m << 13);
            uint16_t back = loom__f32_to_f16(f);
            assert_int_equal(back, h | 0x0200); /* quiet bit set, rest kept */
            continue;
        }
        if (e == 31) {
            assert_true(isinf(f));
        } else {
            assert_true((double)f == half_value(h));
        }
        assert_int_equal(loom__f32_to_f16(f), h); /* identity round trip */
#ifdef __FLT16_MAX__
        _Float16 hw;
        memcpy(&hw, &h, sizeof hw);
        assert_int_equal(bits_of((float)hw), bits_of(f)); /* the compiler's conversion agrees */
#endif
    }
}

/* Independent f32 -> f16 reference: nearest of all finite halves by exact double distance,
 * ties to the even code; at or above 65520 (halfway to 2^16) infinity. */
static double pos_half[0x7c00];

static uint16_t ref_f32_to_f16(float f) {
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double v = fabs((double)f);
    if (isnan(f)) return 0xffff; /* not used */
    if (v >= 65520.0) return sign | 0x7c00;
    int lo = 0, hi = 0x7bff; /* largest code with value <= v */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (pos_half[mid] <= v)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo == 0x7bff) return sign | 0x7bff; /* in [65504, 65520) */
    double below = v - pos_half[lo], above = pos_half[lo + 1] - v;
    int code = below < above ? lo : (above < below ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1));
    return sign | (uint16_t)code;
}

static void check_f32_to_f16(float f) {
    uint16_t got = loom__f32_to_f16(f), want = ref_f32_to_f16(f);
    if (got != want) fail_msg("f32_to_f16(%a) = 0x%04x, want 0x%04x", (double)f, got, want);
#ifdef __FLT16_MAX__
    _Float16 hw = (_Float16)f;
    uint16_t hw_bits;
    memcpy(&hw_bits, &hw, sizeof hw_bits);
    if (hw_bits != want)
        fail_msg("compiler f16(%a) = 0x%04x, want 0x%04x", (double)f, hw_bits, want);
#endif
}

static void test_f32_to_f16_reference(void **state) {
    (void)state;
    for (int i = 0; i < 0x7c00; i++) pos_half[i] = half_value((uint16_t)i);
    /* Every midpoint between neighbouring halves (exact in float) and its float neighbours:
     * exercises round-to-even in the normal and subnormal ranges and at the top. */
    for (int i = 0; i < 0x7bff; i++) {
        float mid = (float)((pos_half[i] + pos_half[i + 1]) / 2);
        for (int s = 0; s < 2; s++) {
            float m = s ? -mid : mid;
            check_f32_to_f16(m);
            check_f32_to_f16(nextafterf(m, INFINITY));
            check_f32_to_f16(nextafterf(m, -INFINITY));
        }
    }
    static const float edges[] = {
        0.0f,       -0.0f,        1.0f,     -1.0f,        65504.0f,        65519.996f,
        65520.0f,   65536.0f,     1e10f,    FLT_MAX,      INFINITY,        -INFINITY,
        FLT_MIN,    FLT_TRUE_MIN, 0x1p-24f, 0x1p-25f,     0x1.000002p-25f, 0x1p-26f,
        0x1.8p-24f, 0x1.ffcp-15f, 0x1p-14f, 0x1.ffep-15f, 3.14159265f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        check_f32_to_f16(edges[i]);
        check_f32_to_f16(-edges[i]);
    }
    assert_int_equal(loom__f32_to_f16(65519.996f), 0x7bff);
    assert_int_equal(loom__f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(loom__f32_to_f16(0x1p-25f), 0x0000);         /* tie with 0 -> even (0) */
    assert_int_equal(loom__f32_to_f16(0x1.8p-24f), 0x0002);       /* 1.5 ulp: tie -> even (2) */
    assert_int_equal(loom__f32_to_f16(-0x1.000002p-25f), 0x8001); /* just past the tie */
    /* A million random bit patterns cover every float exponent. */
    for (int i = 0; i < 1000000; i++) {
        float f = float_of((uint32_t)rng_next());
        if (isnan(f)) {
            uint16_t h = loom__f32_to_f16(f);
            assert_true((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0); /* still a NaN */
            assert_int_equal(h >> 15, bits_of(f) >> 31);
            continue;
        }
        check_f32_to_f16(f);
    }
    /* A NaN whose payload lives only in the dropped bits stays a NaN. */
    assert_int_equal(loom__f32_to_f16(float_of(0x7f800001u)), 0x7e00);
    assert_int_equal(loom__f32_to_f16(float_of(0xff800fffu)), 0xfe00);
}

/* ---- bfloat16 ----------------------------------------------------------------------------- */

static uint16_t ref_f32_to_bf16(float f) {
    uint32_t x = bits_of(f);
    uint32_t lo = x & 0xffff0000u;
    double down = fabs((double)float_of(lo)), up;
    if ((lo & 0x7fffffffu) == 0x7f7f0000u)
        up = 0x1p128; /* next step is infinity */
    else
        up = fabs((double)float_of(lo + 0x10000u));
    double v = fabs((double)f);
    uint16_t code = (uint16_t)(lo >> 16);
    if (v - down > up - v || (v - down == up - v && (code & 1))) code++;
    return code;
}

static void test_bf16(void **state) {
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) { /* widening is exact; narrowing it back is identity */
        float f = loom__bf16_to_f32((uint16_t)i);
        assert_int_equal(bits_of(f), i << 16);
        if (!isnan(f))
            assert_int_equal(loom__f32_to_bf16(f), i);
        else
            assert_int_equal(loom__f32_to_bf16(f), i | 0x0040);
    }
    assert_int_equal(loom__f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(loom__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);        /* tie -> even */
    assert_int_equal(loom__f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);        /* tie -> even (up) */
    assert_int_equal(loom__f32_to_bf16(float_of(0x3f808001u)), 0x3f81); /* past the tie */
    assert_int_equal(loom__f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(loom__f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(loom__f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(loom__f32_to_bf16(FLT_MAX), 0x7f80);               /* rounds to infinity */
    assert_int_equal(loom__f32_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f); /* stays finite */
    assert_int_equal(loom__f32_to_bf16(float_of(0x7f800001u)), 0x7fc0); /* NaN stays NaN */
    assert_int_equal(loom__f32_to_bf16(float_of(0xffc12345u)), 0xffc1); /* sign, payload kept */
    assert_int_equal(loom__f32_to_bf16(FLT_TRUE_MIN), 0x0000);
    for (int i = 0; i < 1000000; i++) {
        float f = float_of((uint32_t)rng_next());
        if (isnan(f)) continue;
        uint16_t got = loom__f32_to_bf16(f), want = ref_f32_to_bf16(f);
        if (got != want) fail_msg("f32_to_bf16(%a) = 0x%04x, want 0x%04x", (double)f, got, want);
    }
}

/* ---- refusals of the row functions -------------------------------------------------------- */

static void test_row_functions_bad_input(void **state) {
    (void)state;
    float x[256] = {0}, y[256];
    uint8_t blk[512] = {0};
    /* Types loom cannot dequantize: activation formats, integers, unknown ids. */
    assert_false(loom__dequantize_row(LOOM_TYPE_Q8_K, blk, y, 256));
    assert_false(loom__dequantize_row(LOOM_TYPE_Q8_1, blk, y, 32));
    assert_false(loom__dequantize_row(LOOM_TYPE_I32, blk, y, 4));
    assert_false(loom__dequantize_row(4, blk, y, 32));
    assert_false(loom__dequantize_row(UINT32_MAX, blk, y, 32));
    /* Partial blocks, negative counts, NULL buffers. */
    assert_false(loom__dequantize_row(LOOM_TYPE_Q4_0, blk, y, 31));
    assert_false(loom__dequantize_row(LOOM_TYPE_Q4_K, blk, y, 32));
    assert_false(loom__dequantize_row(LOOM_TYPE_F32, blk, y, -1));
    assert_false(loom__dequantize_row(LOOM_TYPE_Q8_0, NULL, y, 32));
    assert_false(loom__dequantize_row(LOOM_TYPE_Q8_0, blk, NULL, 32));
    assert_true(loom__dequantize_row(LOOM_TYPE_Q8_0, NULL, NULL, 0)); /* nothing to do */

    /* Quantization exists only for the reference formats. */
    assert_false(loom__quantize_row(LOOM_TYPE_Q4_K, x, blk, 256));
    assert_false(loom__quantize_row(LOOM_TYPE_Q6_K, x, blk, 256));
    assert_false(loom__quantize_row(LOOM_TYPE_Q8_1, x, blk, 32));
    assert_false(loom__quantize_row(LOOM_TYPE_I8, x, blk, 8));
    assert_false(loom__quantize_row(7777, x, blk, 32));
    assert_false(loom__quantize_row(LOOM_TYPE_Q8_0, x, blk, 48));
    assert_false(loom__quantize_row(LOOM_TYPE_Q8_K, x, blk, 128));
    assert_false(loom__quantize_row(LOOM_TYPE_Q4_0, x, blk, -32));
    assert_false(loom__quantize_row(LOOM_TYPE_Q4_0, NULL, blk, 32));
    assert_true(loom__quantize_row(LOOM_TYPE_Q8_K, x, blk, 256));

    /* The dot product signals misuse with NaN. */
    assert_true(isnan(loom__vec_dot_f32(blk, LOOM_TYPE_Q8_K, x, 256)));
    assert_true(isnan(loom__vec_dot_f32(blk, LOOM_TYPE_I16, x, 4)));
    assert_true(isnan(loom__vec_dot_f32(blk, 5, x, 32)));
    assert_true(isnan(loom__vec_dot_f32(blk, LOOM_TYPE_Q4_0, x, 40)));
    assert_true(isnan(loom__vec_dot_f32(blk, LOOM_TYPE_F32, x, -3)));
    assert_true(isnan(loom__vec_dot_f32(NULL, LOOM_TYPE_F32, x, 3)));
    assert_true(isnan(loom__vec_dot_f32(blk, LOOM_TYPE_F32, NULL, 3)));
    assert_true(loom__vec_dot_f32(NULL, LOOM_TYPE_Q4_K, NULL, 0) == 0.0f);
    assert_null(loom__vec_dot_get(LOOM_TYPE_Q8_K));
    assert_null(loom__vec_dot_get(LOOM_TYPE_Q8_1));
    assert_null(loom__vec_dot_get(LOOM_TYPE_F64));
    assert_null(loom__vec_dot_get(99));
    assert_non_null(loom__vec_dot_get(LOOM_TYPE_Q6_K));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traits_table),
        cmocka_unit_test(test_layout_offsets),
        cmocka_unit_test(test_row_bytes),
        cmocka_unit_test(test_f16_to_f32_exhaustive),
        cmocka_unit_test(test_f32_to_f16_reference),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_row_functions_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
