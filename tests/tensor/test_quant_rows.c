/* test_quant_rows.c — the row kernels: decoding of every block format against a second,
 * value-by-value reading of the format written from its byte offsets; quantize -> dequantize
 * error bounds per format; the q8_K activation quantizer; and loom__vec_dot_f32 against a
 * double-precision dot of the dequantized row (with a stated rounding bound) and against the
 * documented summation order (exactly). The byte-exact comparison with the `gguf` package is in
 * tests/conformance/test_quant_gguf.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/quant.h"
#include "tensor/quant_layouts.h"
#include "tensor/types.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x0123456789abcdefull;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(void) {
    return (double)(rng_next() >> 11) * 0x1p-53;
} /* [0, 1) */

static float rng_normal(void) { /* Box-Muller */
    double u1 = rng_uniform() + 0x1p-60, u2 = rng_uniform();
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static uint16_t rd16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

static void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static const uint32_t block_types[] = {
    LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_1, LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1, LOOM_TYPE_Q8_0,
    LOOM_TYPE_Q2_K, LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K, LOOM_TYPE_Q6_K};
#define N_BLOCK_TYPES (sizeof block_types / sizeof block_types[0])

/* Byte offsets of the f16 scale fields of each block format (format facts). */
static int f16_fields(uint32_t t, int off[2]) {
    switch (t) {
    case LOOM_TYPE_Q4_0:
    case LOOM_TYPE_Q5_0:
    case LOOM_TYPE_Q8_0:
        off[0] = 0;
        return 1;
    case LOOM_TYPE_Q4_1:
    case LOOM_TYPE_Q5_1:
    case LOOM_TYPE_Q4_K:
    case LOOM_TYPE_Q5_K:
        off[0] = 0, off[1] = 2;
        return 2;
    case LOOM_TYPE_Q2_K:
        off[0] = 80, off[1] = 82;
        return 2;
    case LOOM_TYPE_Q3_K:
        off[0] = 108;
        return 1;
    case LOOM_TYPE_Q6_K:
        off[0] = 208;
        return 1;
    default:
        return 0;
    }
}

/* Random bytes, with the f16 fields set to finite values of random sign and magnitude. */
static void random_blocks(uint32_t t, uint8_t *buf, size_t n_blocks) {
    const loom__type_traits *tr = loom__type_get_traits(t);
    for (size_t i = 0; i < n_blocks * tr->block_bytes; i++) buf[i] = (uint8_t)rng_next();
    int off[2];
    int nf = f16_fields(t, off);
    for (size_t b = 0; b < n_blocks; b++)
        for (int k = 0; k < nf; k++)
            wr16(buf + b * tr->block_bytes + off[k],
                 loom__f32_to_f16(rng_normal() * (float)ldexp(1.0, (int)(rng_next() % 12) - 8)));
}

/* ---- a value-by-value reading of each format ---------------------------------------------- *
 * Written from the byte offsets and bit positions of the format (not sharing code with the
 * library), with the same float operation order, so the results must match bit for bit. */
static float h2f(const uint8_t *p) {
    return loom__f16_to_f32(rd16(p));
}

static void k4_scale_min(const uint8_t *s, int i, int *sc, int *mn) {
    if (i < 4) {
        *sc = s[i] & 63;
        *mn = s[i + 4] & 63;
    } else {
        *sc = (s[i + 4] & 15) | (s[i - 4] >> 6) << 4;
        *mn = (s[i + 4] >> 4) | (s[i] >> 6) << 4;
    }
}

static float ref_value(uint32_t t, const uint8_t *b, int v) {
    int h = v / 128, s = (v % 128) / 32, l = v % 32, sc, mn, q;
    switch (t) {
    case LOOM_TYPE_Q4_0:
        q = v < 16 ? b[2 + v] & 15 : b[2 + v - 16] >> 4;
        return h2f(b) * (float)(q - 8);
    case LOOM_TYPE_Q4_1:
        q = v < 16 ? b[4 + v] & 15 : b[4 + v - 16] >> 4;
        return h2f(b) * (float)q + h2f(b + 2);
    case LOOM_TYPE_Q5_0:
        q = (v < 16 ? b[6 + v] & 15 : b[6 + v - 16] >> 4) | ((b[2 + v / 8] >> (v % 8)) & 1) << 4;
        return h2f(b) * (float)(q - 16);
    case LOOM_TYPE_Q5_1:
        q = (v < 16 ? b[8 + v] & 15 : b[8 + v - 16] >> 4) | ((b[4 + v / 8] >> (v % 8)) & 1) << 4;
        return h2f(b) * (float)q + h2f(b + 2);
    case LOOM_TYPE_Q8_0:
        return (float)(int8_t)b[2 + v] * h2f(b);
    case LOOM_TYPE_Q2_K:
        sc = b[v / 16];
        q = (b[16 + 32 * h + l] >> (2 * s)) & 3;
        return h2f(b + 80) * (float)(sc & 15) * (float)q - h2f(b + 82) * (float)(sc >> 4);
    case LOOM_TYPE_Q3_K: {
        int i = v / 16;
        sc = ((b[96 + i % 8] >> (4 * (i / 8))) & 15) | ((b[104 + i % 4] >> (2 * (i / 4))) & 3) << 4;
        q = ((b[32 + 32 * h + l] >> (2 * s)) & 3) - (((b[l] >> (v / 32)) & 1) ? 0 : 4);
        return h2f(b + 108) * (float)(sc - 32) * (float)q;
    }
    case LOOM_TYPE_Q4_K:
        k4_scale_min(b + 4, v / 32, &sc, &mn);
        q = (b[16 + 32 * (v / 64) + l] >> (4 * ((v / 32) % 2))) & 15;
        return h2f(b) * (float)sc * (float)q - h2f(b + 2) * (float)mn;
    case LOOM_TYPE_Q5_K:
        k4_scale_min(b + 4, v / 32, &sc, &mn);
        q = ((b[48 + 32 * (v / 64) + l] >> (4 * ((v / 32) % 2))) & 15) |
            ((b[16 + l] >> (v / 32)) & 1) << 4;
        return h2f(b) * (float)sc * (float)q - h2f(b + 2) * (float)mn;
    case LOOM_TYPE_Q6_K:
        q = ((b[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 15) |
            ((b[128 + 32 * h + l] >> (2 * s)) & 3) << 4;
        return h2f(b + 208) * (float)(int8_t)b[192 + v / 16] * (float)(q - 32);
    default:
        fail_msg("no reference for type %u", t);
    }
    return 0.0f;
}

static void test_decode_matches_format(void **state) {
    (void)state;
    enum { BLOCKS = 64 };
    uint8_t *buf = malloc(BLOCKS * 210);
    float *y = malloc(BLOCKS * 256 * sizeof(float));
    assert_non_null(buf);
    assert_non_null(y);
    for (size_t ti = 0; ti < N_BLOCK_TYPES; ti++) {
        uint32_t t = block_types[ti];
        const loom__type_traits *tr = loom__type_get_traits(t);
        random_blocks(t, buf, BLOCKS);
        assert_true(loom__dequantize_row(t, buf, y, (int64_t)BLOCKS * tr->block_elems));
        for (int b = 0; b < BLOCKS; b++) {
            for (uint32_t v = 0; v < tr->block_elems; v++) {
                float want = ref_value(t, buf + (size_t)b * tr->block_bytes, (int)v);
                float got = y[(size_t)b * tr->block_elems + v];
                if (memcmp(&want, &got, sizeof got) != 0)
                    fail_msg("%s block %d value %u: got %a want %a", tr->name, b, v, (double)got,
                             (double)want);
            }
        }
    }
    free(buf);
    free(y);
}

static void test_decode_known_block(void **state) {
    (void)state;
    /* q4_0 with d = 1: codes j in the low nibbles and 15 - j in the high ones. */
    loom__block_q4_0 b4 = {.d = 0x3c00};
    for (int j = 0; j < 16; j++) b4.qs[j] = (uint8_t)(j | (15 - j) << 4);
    float y[256];
    assert_true(loom__dequantize_row(LOOM_TYPE_Q4_0, &b4, y, 32));
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == (float)(j - 8));
        assert_true(y[j + 16] == (float)(7 - j));
    }
    /* q6_K with d = 0.5 and every scale 2: value v decodes to q(v) - 32 with q = v % 64. */
    loom__block_q6_K b6;
    memset(&b6, 0, sizeof b6);
    b6.d = 0x3800;
    for (int i = 0; i < 16; i++) b6.scales[i] = 2;
    for (int v = 0; v < 256; v++) {
        int h = v / 128, s = (v % 128) / 32, l = v % 32, q = v % 64;
        b6.ql[64 * h + 32 * (s % 2) + l] |= (uint8_t)((q & 15) << (4 * (s / 2)));
        b6.qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * s));
    }
    assert_true(loom__dequantize_row(LOOM_TYPE_Q6_K, &b6, y, 256));
    for (int v = 0; v < 256; v++) assert_true(y[v] == (float)(v % 64 - 32));
}

/* ---- quantize -> dequantize error bounds -------------------------------------------------- */

/* Largest |x| and the extremes of a block. */
static void block_stats(const float *x, int n, float *amax, float *mn, float *mx) {
    *amax = 0.0f, *mn = x[0], *mx = x[0];
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > *amax) *amax = fabsf(x[i]);
        if (x[i] < *mn) *mn = x[i];
        if (x[i] > *mx) *mx = x[i];
    }
}

/* Error of storing v as f16: half an ulp, relative 2^-11 for normal halves, 2^-25 absolute
 * in the subnormal range. */
static double f16_err(double v) {
    return fmax(fabs(v) * 0x1p-11, 0x1p-25);
}

/* The worst error a block of format t may have, from the format's rounding: half a step (or a
 * full step where the top code is clipped), plus the f16 rounding of the stored scale times
 * the largest code and of the stored minimum. */
static double error_bound(uint32_t t, const float *x, int n) {
    float amax, mn, mx;
    block_stats(x, n, &amax, &mn, &mx);
    const double slack = 1e-6 * amax + 1e-30;
    double d;
    switch (t) {
    case LOOM_TYPE_F32:
        return 0.0;
    case LOOM_TYPE_F16:
        return f16_err(amax);
    case LOOM_TYPE_BF16:
        return amax * 0x1p-8;
    case LOOM_TYPE_Q8_0:
        d = amax / 127.0;
        return 0.5 * d + 127 * f16_err(d) + slack;
    case LOOM_TYPE_Q4_0:
        d = amax / 8.0;
        return d + 8 * f16_err(d) + slack;
    case LOOM_TYPE_Q5_0:
        d = amax / 16.0;
        return d + 16 * f16_err(d) + slack;
    case LOOM_TYPE_Q4_1:
        d = (mx - mn) / 15.0;
        return 0.5 * d + 15 * f16_err(d) + f16_err(mn) + slack;
    case LOOM_TYPE_Q5_1:
        d = (mx - mn) / 31.0;
        return 0.5 * d + 31 * f16_err(d) + f16_err(mn) + slack;
    default:
        fail_msg("no bound for %u", t);
    }
    return 0.0;
}

static void test_quantize_roundtrip(void **state) {
    (void)state;
    static const uint32_t types[] = {LOOM_TYPE_F32,  LOOM_TYPE_F16,  LOOM_TYPE_BF16,
                                     LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_1,
                                     LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1};
    enum { N = 32 * 128 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    uint8_t *q = malloc(N * 4);
    assert_true(x && y && q);
    for (int dist = 0; dist < 4; dist++) {
        for (int i = 0; i < N; i++) {
            float g = rng_normal();
            switch (dist) {
            case 0:
                x[i] = g;
                break; /* standard normal */
            case 1:
                x[i] = g * 1000.0f + 3000.0f;
                break; /* offset, large */
            case 2:
                x[i] = (i / 32) % 3 == 0 ? 0.0f : g * 1e-3f;
                break; /* zero blocks, small */
            default:
                x[i] = i % 32 == 5 ? g * 100.0f : g;
                break; /* one outlier per block */
            }
        }
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            uint32_t t = types[ti];
            const loom__type_traits *tr = loom__type_get_traits(t);
            assert_true(loom__quantize_row(t, x, q, N));
            assert_true(loom__dequantize_row(t, q, y, N));
            double err2 = 0, sig2 = 0;
            for (int b = 0; b < N / 32; b++) {
                double bound = error_bound(t, x + 32 * b, 32);
                for (int i = 32 * b; i < 32 * b + 32; i++) {
                    double e = fabs((double)y[i] - x[i]);
                    if (!(e <= bound))
                        fail_msg("%s dist %d value %d: %a -> %a, error %g > bound %g", tr->name,
                                 dist, i, (double)x[i], (double)y[i], e, bound);
                    err2 += e * e;
                    sig2 += (double)x[i] * x[i];
                }
            }
            /* Zero blocks come back exactly zero. */
            if (dist == 2)
                for (int i = 0; i < 32; i++) assert_true(y[i] == 0.0f);
            /* On plain data the format is as good as its bit count says (relative RMS error). */
            double rel = sqrt(err2 / sig2);
            double limit = t == LOOM_TYPE_F32 ? 0.0 : (tr->block_elems == 1 ? 0.004 : 0.12);
            if (dist <= 1 && rel > limit)
                fail_msg("%s dist %d: relative RMS error %g", tr->name, dist, rel);
        }
    }
    free(x);
    free(y);
    free(q);
}

static void test_quantize_q8_K(void **state) {
    (void)state;
    enum { NB = 16 };
    float x[NB * 256];
    loom__block_q8_K blocks[NB];
    for (int i = 0; i < NB * 256; i++) x[i] = rng_normal() * (float)(1 + i / 256);
    for (int i = 256; i < 512; i++) x[i] = 0.0f; /* block 1: all zero */
    x[2 * 256 + 77] = 50.0f;                     /* block 2: a positive outlier */
    assert_true(loom__quantize_row(LOOM_TYPE_Q8_K, x, blocks, NB * 256));
    for (int b = 0; b < NB; b++) {
        const loom__block_q8_K *k = &blocks[b];
        const float *xb = x + 256 * b;
        int imax = 0;
        for (int j = 1; j < 256; j++)
            if (fabsf(xb[j]) > fabsf(xb[imax])) imax = j;
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += k->qs[16 * g + l];
            assert_int_equal(k->bsums[g], sum);
        }
        if (b == 1) {
            assert_true(k->d == 0.0f);
            for (int j = 0; j < 256; j++) assert_int_equal(k->qs[j], 0);
            continue;
        }
        assert_int_equal(k->qs[imax], -128); /* the extreme takes the full code range */
        assert_true((k->d < 0) == (xb[imax] > 0));
        for (int j = 0; j < 256; j++) { /* nearest code, but the far end clips to 127 */
            double e = fabs((double)k->d * k->qs[j] - xb[j]);
            double bound = k->qs[j] == 127 ? fabs(k->d) * 1.000001 : fabs(k->d) * 0.500001;
            if (!(e <= bound)) fail_msg("q8_K block %d value %d: error %g", b, j, e);
        }
    }
    assert_int_equal(blocks[2].qs[77], -128);
    assert_true(blocks[2].d < 0.0f);
}

/* ---- dot products ------------------------------------------------------------------------- */

/* Emulates the documented order: lane i % 32, sequential per lane, lanes folded 16, 8, 4, 2, 1
 * apart. */
static float ordered_dot(const float *w, const float *x, int64_t n) {
    float acc[32] = {0};
    for (int64_t i = 0; i < n; i++) acc[i % 32] += w[i] * x[i];
    for (int width = 16; width >= 1; width /= 2)
        for (int j = 0; j < width; j++) acc[j] += acc[j + width];
    return acc[0];
}

static void check_dot(uint32_t t, const void *w, int64_t n, float *wf, const float *x) {
    const loom__type_traits *tr = loom__type_get_traits(t);
    assert_true(loom__dequantize_row(t, w, wf, n));
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        ref += (double)wf[i] * x[i]; /* exact products; double sum error is negligible here */
        mag += fabs((double)wf[i] * x[i]);
    }
    float got = loom__vec_dot_f32(w, t, x, n);
    /* Float rounding of each product and of each add along a lane's chain (n / 32 adds) and
     * the 5 folds: |error| <= (n/32 + 7) * 2^-24 * sum |w x|. */
    double bound = ((double)(n + 31) / 32 + 7) * 0x1p-24 * mag + 1e-30;
    if (!(fabs(got - ref) <= bound))
        fail_msg("%s n=%lld: dot %a, reference %a, error %g > %g", tr->name, (long long)n,
                 (double)got, ref, fabs(got - ref), bound);
    /* The fixed order, exactly; the same through the per-type kernel; the same again. */
    float ordered = ordered_dot(wf, x, n);
    float again = loom__vec_dot_get(t)(w, x, n);
    if (memcmp(&got, &ordered, sizeof got) != 0)
        fail_msg("%s n=%lld: dot %a differs from the documented order %a", tr->name, (long long)n,
                 (double)got, (double)ordered);
    assert_memory_equal(&got, &again, sizeof got);
}

static void test_vec_dot(void **state) {
    (void)state;
    enum { MAX_N = 256 * 17 };
    float *x = malloc(MAX_N * sizeof(float)), *wf = malloc(MAX_N * sizeof(float));
    uint8_t *w = malloc(MAX_N * 4);
    assert_true(x && wf && w);
    for (int i = 0; i < MAX_N; i++) x[i] = rng_normal();
    /* Plain types at awkward lengths (tails shorter and longer than a lane group). */
    static const int64_t plain_n[] = {1, 7, 31, 32, 33, 63, 100, 1000, 4099};
    static const uint32_t plain[] = {LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_BF16};
    for (size_t ti = 0; ti < 3; ti++) {
        for (size_t k = 0; k < sizeof plain_n / sizeof plain_n[0]; k++) {
            for (int64_t i = 0; i < plain_n[k]; i++) wf[i] = rng_normal();
            assert_true(loom__quantize_row(plain[ti], wf, w, plain_n[k]));
            check_dot(plain[ti], w, plain_n[k], wf, x);
        }
    }
    /* Block types: 1, 2, 3, 5 and 17 blocks of random codes and sane scales. */
    static const int64_t n_blocks[] = {1, 2, 3, 5, 17};
    for (size_t ti = 0; ti < N_BLOCK_TYPES; ti++) {
        uint32_t t = block_types[ti];
        const loom__type_traits *tr = loom__type_get_traits(t);
        for (size_t k = 0; k < sizeof n_blocks / sizeof n_blocks[0]; k++) {
            random_blocks(t, w, (size_t)n_blocks[k]);
            check_dot(t, w, n_blocks[k] * tr->block_elems, wf, x);
        }
    }
    free(x);
    free(wf);
    free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_matches_format),
        cmocka_unit_test(test_decode_known_block),
        cmocka_unit_test(test_quantize_roundtrip),
        cmocka_unit_test(test_quantize_q8_K),
        cmocka_unit_test(test_vec_dot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
