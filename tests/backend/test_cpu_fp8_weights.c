/* test_cpu_fp8_weights.c — FP8 weight rows (LOOM_TYPE_FP8_E4M3_ROWS: E4M3 codes and one float32
 * scale per row) and the CPU backend's ops over them.
 *
 *   - The quantizer: row bytes and padding; scale = max |row| / 448 in float32 (0 for an
 *     all-zero row); every code the nearest E4M3 value to x / scale, checked against the
 *     neighbouring codes in double (ties to the even code) and against fp8.h's encoder; NaN and
 *     infinity reported (and no NaN code written); the dequantizer; NULL rows.
 *   - matmul on 1 and 2 threads, with and without f32_activations, K = 1 .. 1000 (not
 *     multiples of 8 or 32), N = 1, 7, 33, T = 1, 2, 3, 4, 7, 33, padded strides: every output
 *     within float32 rounding of a double-precision dot over the dequantized values (1e-5 of
 *     sum |w x|); the same bits whatever T (codes read in place for few tokens, decoded rows for
 *     many), thread count and activation setting.
 *     Subnormal codes read the same under the caller's FTZ / DAZ.
 *   - matmul_multi bitwise equal to one matmul per weight; get_rows equal to the dequantizer.
 *   - weight_prepare of FP8 rows (copied as they are), and bad input: NULL, zero rows, short or
 *     misaligned strides.
 *   - A whole model: loom_model_load_synthetic with weights = FP8 loads (a quarter of the F32
 *     matrices' bytes), decodes finite logits near the unquantized model's; an unknown
 *     loom_weight_format is INVALID_ARG. */
#include "backend/qweight_util.h"

#include <math.h>
#include <stdio.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "backend/backend.h"
#include "loom.h"
#include "tensor/fp8.h"
#include "tensor/fp8_rows.h"

#define FP8 LOOM_TYPE_FP8_E4M3_ROWS

static size_t fp8_row_bytes(int64_t k) {
    size_t b = 0;
    assert_true(loom__type_row_bytes(FP8, k, &b));
    return b;
}

static float row_scale(const uint8_t *row, int64_t k) {
    float s;
    memcpy(&s, row + ((k + 3) / 4) * 4, sizeof s);
    return s;
}

/* Value of row element i as the format defines it: E4M3(code) * scale, in double (exact). */
static double fp8_value(const uint8_t *row, int64_t k, int64_t i) {
    return (double)loom__fp8_e4m3_to_f32(row[i]) * (double)row_scale(row, k);
}

/* A row with a spread of magnitudes: values over several binades, some zeros, some negative
 * zeros, a few outliers; `mag` scales the whole row. */
static void make_row(float *x, int64_t k, float mag) {
    for (int64_t i = 0; i < k; i++) {
        const uint64_t r = rng_u64();
        float v = rng_f() * mag * ldexpf(1.0f, -(int)(r % 12));
        if (r % 29 == 0) v = 0.0f;
        if (r % 31 == 0) v = -0.0f;
        if (r % 37 == 0) v *= 50.0f;
        x[i] = v;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The quantizer                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* |code c|'s value for magnitude codes 0 .. 0x7E. */
static double mag_value(int c) {
    return (double)loom__fp8_e4m3_to_f32((uint8_t)c);
}

/* code is the nearest E4M3 value to q (ties to the even code), saturating at 448. */
static void check_nearest(double q, uint8_t code, const char *what) {
    const int c = code & 0x7f;
    if (c == 0x7f) fail_msg("%s: NaN code for %g", what, q);
    if (signbit(q) != ((code & 0x80) != 0) && !(c == 0 && q == 0.0))
        fail_msg("%s: sign of code 0x%02x for %g", what, code, q);
    const double a = fabs(q), d = fabs(a - mag_value(c));
    if (c > 0) {
        const double dl = fabs(a - mag_value(c - 1));
        if (dl < d || (dl == d && ((c - 1) & 1) == 0))
            fail_msg("%s: %.9g -> code 0x%02x, but 0x%02x is nearer", what, q, code, c - 1);
    }
    if (c < 0x7e) {
        const double du = fabs(a - mag_value(c + 1));
        if (du < d || (du == d && ((c + 1) & 1) == 0))
            fail_msg("%s: %.9g -> code 0x%02x, but 0x%02x is nearer", what, q, code, c + 1);
    }
}

static void check_quantized_row(const float *x, const uint8_t *row, int64_t k) {
    float amax = 0.0f;
    for (int64_t i = 0; i < k; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    const float want_scale = amax / 448.0f;
    const float scale = row_scale(row, k);
    assert_memory_equal(&scale, &want_scale, sizeof scale);
    for (int64_t i = k; i < ((k + 3) / 4) * 4; i++) assert_int_equal(row[i], 0); /* padding */
    bool saw_max = false;
    for (int64_t i = 0; i < k; i++) {
        if (scale == 0.0f) {
            assert_int_equal(row[i], 0);
            continue;
        }
        const float q = x[i] / scale;
        assert_int_equal(row[i], loom__f32_to_fp8_e4m3(q)); /* fp8.h's encoder */
        check_nearest((double)q, row[i], "quantize");       /* and an independent one */
        if ((row[i] & 0x7f) == 0x7e) saw_max = true;
    }
    /* the largest magnitude lands on 448 */
    if (scale != 0.0f) assert_true(saw_max);
}

static void test_quantize(void **state) {
    (void)state;
    assert_string_equal(loom__type_name(FP8), "fp8_e4m3_rows");
    const loom__type_traits *tr = loom__type_get_traits(FP8);
    assert_non_null(tr);
    assert_true(tr->can_dequantize && tr->row_scale);
    const int64_t ks[] = {1, 2, 3, 4, 5, 13, 32, 37, 255, 640, 1000};
    const size_t want_bytes[] = {8, 8, 8, 8, 12, 20, 36, 44, 260, 644, 1004};
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
        assert_int_equal(fp8_row_bytes(ks[ki]), want_bytes[ki]);

    const float mags[] = {1.0f, 3e-3f, 250.0f, 1e-30f, 1e30f};
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
        const int64_t k = ks[ki];
        float *x = xmalloc((size_t)k * sizeof *x), *back = xmalloc((size_t)k * sizeof *back);
        uint8_t *row = xmalloc(fp8_row_bytes(k));
        for (size_t mi = 0; mi < sizeof mags / sizeof *mags; mi++) {
            make_row(x, k, mags[mi]);
            memset(row, 0xAA, fp8_row_bytes(k)); /* poison, padding included */
            assert_true(loom__fp8_rows_quantize(x, row, k));
            check_quantized_row(x, row, k);
            /* through quant.h's generic entry points */
            uint8_t *row2 = xmalloc(fp8_row_bytes(k));
            assert_true(loom__quantize_row(FP8, x, row2, k));
            assert_memory_equal(row, row2, fp8_row_bytes(k));
            free(row2);
            assert_true(loom__dequantize_row(FP8, row, back, k));
            for (int64_t i = 0; i < k; i++) {
                const float want = (float)fp8_value(row, k, i);
                assert_memory_equal(&back[i], &want, sizeof want);
            }
        }
        /* an all-zero row (negative zeros too): scale 0, codes 0 */
        for (int64_t i = 0; i < k; i++) x[i] = i % 2 ? -0.0f : 0.0f;
        assert_true(loom__fp8_rows_quantize(x, row, k));
        check_quantized_row(x, row, k);
        assert_true(loom__dequantize_row(FP8, row, back, k));
        for (int64_t i = 0; i < k; i++) assert_true(back[i] == 0.0f);
        free(x);
        free(back);
        free(row);
    }

    /* subnormal codes: a row whose small values fall below 2^-6 of the scale */
    float sub[8] = {448.0f,      1.0f / 64,  1.0f / 512,  3.0f / 512,
                    1.0f / 1024, 1.5f / 512, -1.0f / 600, 0.0f};
    uint8_t srow[12];
    assert_true(loom__fp8_rows_quantize(sub, srow, 8));
    check_quantized_row(sub, srow, 8);
    assert_int_equal(srow[0], 0x7e);
    assert_int_equal(srow[2], 0x01); /* 2^-9: the smallest subnormal */
    assert_int_equal(srow[4], 0x00); /* 2^-10: the tie between 0 and 2^-9 goes to 0 */
    assert_int_equal(srow[5], 0x02); /* 1.5 * 2^-9: the tie between codes 1 and 2 goes to 2 */

    /* non-finite rows are reported, and no NaN code is written */
    float bad[5] = {1.0f, NAN, -2.0f, INFINITY, -INFINITY};
    uint8_t brow[12];
    assert_false(loom__fp8_rows_quantize(bad, brow, 5));
    for (int i = 0; i < 5; i++) assert_int_not_equal(brow[i] & 0x7f, 0x7f);
    assert_int_equal(brow[1], 0x00);                  /* NaN -> 0 */
    assert_int_equal(brow[3], 0x7e);                  /* inf -> 448 */
    assert_int_equal(brow[4], 0xfe);                  /* -inf -> -448 */
    assert_true(row_scale(brow, 5) == 2.0f / 448.0f); /* over the finite values */
    assert_false(loom__fp8_rows_quantize(bad + 3, brow, 1));

    /* NULL rows */
    float one = 1.0f;
    assert_false(loom__quantize_row(FP8, NULL, brow, 4));
    assert_false(loom__quantize_row(FP8, &one, NULL, 1));
    assert_false(loom__dequantize_row(FP8, NULL, &one, 1));
    assert_false(loom__dequantize_row(FP8, brow, NULL, 1));
    assert_true(loom__quantize_row(FP8, NULL, NULL, 0)); /* nothing to do */
}

/* ------------------------------------------------------------------------------------------ */
/* Backend ops                                                                                */
/* ------------------------------------------------------------------------------------------ */

static loom__backend_stream *make_backend(int n_threads, bool f32_act) {
    loom__backend_stream *be = calloc(1, sizeof *be);
    assert_non_null(be);
    loom_backend_open_params p = {.n_threads = n_threads, .f32_activations = f32_act};
    assert_int_equal(loom__backend_stream_open("cpu", &p, be), LOOM_OK);
    return be;
}

static void free_backend(loom__backend_stream *be) {
    loom__backend_stream_close(be);
    free(be);
}

/* n FP8 rows of k values, `stride` bytes apart (the padding past each row poisoned). */
static uint8_t *make_weights(int64_t n, int64_t k, size_t stride) {
    uint8_t *w = xmalloc((size_t)n * stride);
    memset(w, 0x7f, (size_t)n * stride);
    float *x = xmalloc((size_t)k * sizeof *x);
    for (int64_t o = 0; o < n; o++) {
        make_row(x, k, o % 3 == 0 ? 0.02f : o % 3 == 1 ? 1.5f : 40.0f);
        if (o == 5) memset(x, 0, (size_t)k * sizeof *x); /* an all-zero row */
        assert_true(loom__fp8_rows_quantize(x, w + (size_t)o * stride, k));
    }
    free(x);
    return w;
}

static void run_matmul(loom__backend_stream *be, const uint8_t *w, size_t w_stride, int64_t n,
                       const float *x, size_t x_stride, int64_t t, int64_t k, float *out) {
    loom_tensor tw = loom_tensor_2d(FP8, (void *)w, k, n, w_stride);
    loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, (void *)x, k, t, x_stride);
    loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out, n, t, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n * t; i++) out[i] = NAN; /* poison */
    loom_status st = be->ops->matmul(be->ctx, &tw, &tx, &to);
    if (st != LOOM_OK) fail_msg("matmul: %s", loom_last_error());
}

static void test_matmul(void **state) {
    (void)state;
    loom__backend_stream *bes[3] = {make_backend(1, false), make_backend(2, false),
                                    make_backend(2, true)};
    const int64_t Ks[] = {1, 5, 13, 37, 100, 257, 640, 1000}, Ns[] = {1, 7, 33};
    const int64_t Ts[] = {1, 2, 3, 4, 7, 33}, Tmax = 33;
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
        for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++) {
            const int64_t K = Ks[ki], N = Ns[ni];
            const size_t w_stride = fp8_row_bytes(K) + 8;
            const size_t x_stride = (size_t)(K + 3) * sizeof(float);
            uint8_t *w = make_weights(N, K, w_stride);
            float *x = xmalloc((size_t)Tmax * x_stride);
            for (int64_t r = 0; r < Tmax; r++)
                fill_acts((float *)((uint8_t *)x + (size_t)r * x_stride), K, r % 2 ? 1.0f : 30.0f);
            float *full = xmalloc((size_t)(N * Tmax) * sizeof(float));
            float *got = xmalloc((size_t)(N * Tmax) * sizeof(float));
            run_matmul(bes[0], w, w_stride, N, x, x_stride, Tmax, K, full);
            /* against double over the dequantized values */
            for (int64_t r = 0; r < Tmax; r++) {
                const float *xr = (const float *)((const uint8_t *)x + (size_t)r * x_stride);
                for (int64_t o = 0; o < N; o++) {
                    const uint8_t *row = w + (size_t)o * w_stride;
                    double ref = 0, mag = 0;
                    for (int64_t i = 0; i < K; i++) {
                        ref += fp8_value(row, K, i) * (double)xr[i];
                        mag += fabs(fp8_value(row, K, i) * (double)xr[i]);
                    }
                    const double err = fabs((double)full[r * N + o] - ref);
                    if (!(err <= 1e-5 * mag + 1e-30))
                        fail_msg("K=%lld N=%lld token %lld row %lld: %.9g, want %.9g (sum|wx| %g)",
                                 (long long)K, (long long)N, (long long)r, (long long)o,
                                 (double)full[r * N + o], ref, mag);
                }
            }
            /* the same bits for any T, threads and activation setting */
            for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
                for (int b = 0; b < 3; b++) {
                    run_matmul(bes[b], w, w_stride, N, x, x_stride, Ts[ti], K, got);
                    if (memcmp(got, full, (size_t)(N * Ts[ti]) * sizeof(float)) != 0)
                        fail_msg("K=%lld N=%lld: T=%lld on backend %d differs from T=%lld",
                                 (long long)K, (long long)N, (long long)Ts[ti], b, (long long)Tmax);
                }
            }
            free(w);
            free(x);
            free(full);
            free(got);
        }
    }
    for (int b = 0; b < 3; b++) free_backend(bes[b]);
}

/* Subnormal codes (a row's values far below its largest) are widened exactly even where the
 * caller runs with denormals-are-zero and flush-to-zero set (a host application may). */
static void test_matmul_daz(void **state) {
    (void)state;
#if defined(__SSE2__)
    loom__backend_stream *be = make_backend(1, false);
    const int64_t K = 77, N = 5, T = 2;
    const size_t stride = fp8_row_bytes(K);
    uint8_t *w = xmalloc((size_t)N * stride);
    float row[77], x[2 * 77], plain[10], daz[10];
    for (int64_t o = 0; o < N; o++) {
        for (int64_t i = 0; i < K; i++) row[i] = (i % 3 ? 1e-3f : 1.0f) * rng_f();
        row[o] = 448.0f; /* the rest land on small and subnormal codes */
        assert_true(loom__fp8_rows_quantize(row, w + (size_t)o * stride, K));
    }
    int n_sub = 0;
    for (int64_t o = 0; o < N; o++)
        for (int64_t i = 0; i < K; i++) n_sub += (w[(size_t)o * stride + i] & 0x78) == 0;
    assert_true(n_sub > 50);
    fill_acts(x, 2 * K, 1.0f);
    run_matmul(be, w, stride, N, x, (size_t)K * sizeof(float), T, K, plain);
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
    run_matmul(be, w, stride, N, x, (size_t)K * sizeof(float), T, K, daz);
    _mm_setcsr(csr);
    assert_memory_equal(plain, daz, sizeof plain);
    free(w);
    free_backend(be);
#endif
}

static void test_matmul_multi(void **state) {
    (void)state;
    loom__backend_stream *be = make_backend(2, false);
    const int64_t K = 200, Ns[3] = {48, 16, 16}, Ts[] = {1, 9};
    const size_t w_stride = fp8_row_bytes(K);
    uint8_t *w[3];
    loom_tensor tw[3];
    const loom_tensor *wp[3];
    for (int j = 0; j < 3; j++) {
        w[j] = make_weights(Ns[j], K, w_stride);
        tw[j] = loom_tensor_2d(FP8, w[j], K, Ns[j], w_stride);
        wp[j] = &tw[j];
    }
    float *x = xmalloc((size_t)(9 * K) * sizeof(float));
    fill_acts(x, 9 * K, 2.0f);
    for (size_t ti = 0; ti < 2; ti++) {
        const int64_t T = Ts[ti];
        loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, x, K, T, (size_t)K * sizeof(float));
        float *multi[3], *single[3];
        loom_tensor to[3];
        loom_tensor *op[3];
        for (int j = 0; j < 3; j++) {
            multi[j] = xmalloc((size_t)(Ns[j] * T) * sizeof(float));
            single[j] = xmalloc((size_t)(Ns[j] * T) * sizeof(float));
            to[j] = loom_tensor_2d(LOOM_TYPE_F32, multi[j], Ns[j], T, (size_t)Ns[j] * 4);
            op[j] = &to[j];
            run_matmul(be, w[j], w_stride, Ns[j], x, (size_t)K * sizeof(float), T, K, single[j]);
        }
        assert_int_equal(be->ops->matmul_multi(be->ctx, 3, wp, &tx, op), LOOM_OK);
        for (int j = 0; j < 3; j++) {
            assert_memory_equal(multi[j], single[j], (size_t)(Ns[j] * T) * sizeof(float));
            free(multi[j]);
            free(single[j]);
        }
    }
    for (int j = 0; j < 3; j++) free(w[j]);
    free(x);
    free_backend(be);
}

static void test_get_rows(void **state) {
    (void)state;
    loom__backend_stream *be = make_backend(2, false);
    const int64_t K = 37, V = 50;
    const size_t stride = fp8_row_bytes(K);
    uint8_t *table = make_weights(V, K, stride);
    const int32_t ids[6] = {0, 49, 5, 5, 17, 3};
    float out[6 * 37], want[37];
    loom_tensor tt = loom_tensor_2d(FP8, table, K, V, stride);
    loom_tensor ti = loom_tensor_2d(LOOM_TYPE_I32, (void *)ids, 6, 1, sizeof ids);
    loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out, K, 6, (size_t)K * sizeof(float));
    assert_int_equal(be->ops->get_rows(be->ctx, &tt, &ti, &to), LOOM_OK);
    for (int r = 0; r < 6; r++) {
        assert_true(loom__dequantize_row(FP8, table + (size_t)ids[r] * stride, want, K));
        assert_memory_equal(out + r * K, want, sizeof want);
    }
    free(table);
    free_backend(be);
}

static void test_prepare_and_bad_input(void **state) {
    (void)state;
    loom__backend_stream *be = make_backend(1, false);
    const int64_t K = 13, N = 4;
    const size_t rb = fp8_row_bytes(K), padded = rb + 12;
    uint8_t *w = make_weights(N, K, padded);
    /* prepared: copied row by row into tight rows, type kept */
    loom_weight_src src = {.name = "w",
                           .type = FP8,
                           .ne = {K, N},
                           .row_stride = padded,
                           .data = w,
                           .persistent = false,
                           .use = LOOM_WEIGHT_MATMUL};
    loom_tensor out;
    assert_int_equal(be->ops->weight_prepare(be->dev, &src, &out), LOOM_OK);
    assert_int_equal(out.type, FP8);
    assert_int_equal(out.row_stride, rb);
    for (int64_t r = 0; r < N; r++)
        assert_memory_equal((uint8_t *)out.data + r * rb, w + r * padded, rb);
    loom_op_desc d = {.op = LOOM_OP_MATMUL, .type = FP8};
    assert_true(be->ops->supports(be->dev, &d));
    d.op = LOOM_OP_GET_ROWS;
    assert_true(be->ops->supports(be->dev, &d));
    /* bad sources */
    loom_weight_src bad = src;
    bad.ne[1] = 0;
    assert_int_equal(be->ops->weight_prepare(be->dev, &bad, &out), LOOM_ERR_INVALID_ARG);
    bad = src;
    bad.data = NULL;
    assert_int_equal(be->ops->weight_prepare(be->dev, &bad, &out), LOOM_ERR_INVALID_ARG);
    bad = src;
    bad.row_stride = K; /* no room for the scale */
    assert_int_equal(be->ops->weight_prepare(be->dev, &bad, &out), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->weight_prepare(be->dev, NULL, &out), LOOM_ERR_INVALID_ARG);

    /* bad matmuls */
    float x[13] = {0}, o[4];
    loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, x, K, 1, sizeof x);
    loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, o, N, 1, sizeof o);
    loom_tensor tw = loom_tensor_2d(FP8, w, K, N, padded);
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &to), LOOM_OK);
    loom_tensor zero_rows = tw;
    zero_rows.ne[1] = 0;
    assert_int_equal(be->ops->matmul(be->ctx, &zero_rows, &tx, &to), LOOM_ERR_INVALID_ARG);
    loom_tensor short_rows = tw;
    short_rows.row_stride = rb - 4;
    assert_int_equal(be->ops->matmul(be->ctx, &short_rows, &tx, &to), LOOM_ERR_INVALID_ARG);
    loom_tensor odd = tw;
    odd.row_stride = rb + 1; /* the scales would be misaligned */
    assert_int_equal(be->ops->matmul(be->ctx, &odd, &tx, &to), LOOM_ERR_INVALID_ARG);
    loom_tensor no_data = tw;
    no_data.data = NULL;
    assert_int_equal(be->ops->matmul(be->ctx, &no_data, &tx, &to), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->matmul(be->ctx, NULL, &tx, &to), LOOM_ERR_INVALID_ARG);
    free(w);
    free_backend(be);
}

/* ------------------------------------------------------------------------------------------ */
/* A whole model                                                                              */
/* ------------------------------------------------------------------------------------------ */

static loom_status load_synthetic(const char *type, int weights, loom_model **out) {
    loom_synthetic_params sp = loom_synthetic_default_params();
    sp.arch = "llama";
    sp.n_vocab = 512;
    sp.n_embd = 256; /* whole q4_K blocks */
    sp.n_head = 4;
    sp.n_head_kv = 2;
    sp.n_ff = 512;
    sp.n_layer = 2;
    sp.n_ctx = 128;
    sp.weight_type = type;
    sp.seed = 3;
    loom_model_params mp = loom_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = 2;
    mp.weights = (loom_weight_format)weights;
    return loom_model_load_synthetic(&sp, &mp, out);
}

static void last_logits(loom_model *m, float *out) {
    loom_session *s = NULL;
    assert_int_equal(loom_session_create(m, NULL, &s), LOOM_OK);
    loom_token toks[9];
    for (int i = 0; i < 9; i++) toks[i] = (loom_token)(3 + (i * 97) % 500);
    assert_int_equal(loom_session_decode(s, toks, 9, false), LOOM_OK);
    memcpy(out, loom_session_logits(s, -1), 512 * sizeof(float));
    loom_session_free(s);
}

static void test_model(void **state) {
    (void)state;
    const char *types[] = {"f32", "f16", "q4_K"};
    float *base = xmalloc(512 * sizeof(float)), *fp8 = xmalloc(512 * sizeof(float));
    for (size_t t = 0; t < 3; t++) {
        loom_model *ms = NULL, *m8 = NULL;
        assert_int_equal(load_synthetic(types[t], LOOM_WEIGHTS_AS_STORED, &ms), LOOM_OK);
        loom_status st = load_synthetic(types[t], LOOM_WEIGHTS_FP8_E4M3, &m8);
        if (st != LOOM_OK) fail_msg("%s with fp8 weights: %s", types[t], loom_last_error());
        loom_model_info is = {.size = sizeof is}, i8 = {.size = sizeof i8};
        assert_int_equal(loom_model_get_info(ms, &is), LOOM_OK);
        assert_int_equal(loom_model_get_info(m8, &i8), LOOM_OK);
        /* matrices: 4 bytes a value (f32), 2 (f16), 4.5 bits (q4_K) -> 1 byte and 4 a row */
        const double ratio = (double)i8.weight_bytes / (double)is.weight_bytes;
        if (t == 0) assert_true(ratio > 0.24 && ratio < 0.27);
        if (t == 1) assert_true(ratio > 0.49 && ratio < 0.53);
        if (t == 2) assert_true(ratio > 1.5);
        last_logits(ms, base);
        last_logits(m8, fp8);
        double diff = 0, sq = 0;
        bool differs = false;
        for (int i = 0; i < 512; i++) {
            assert_true(isfinite(fp8[i]));
            diff = fmax(diff, fabs((double)fp8[i] - base[i]));
            sq += (double)base[i] * base[i];
            differs = differs || fp8[i] != base[i];
        }
        const double rel = diff / sqrt(sq / 512);
        if (!(rel < 0.25 && differs)) fail_msg("%s: fp8 logits off by %.3g of rms", types[t], rel);
        loom_model_free(ms);
        loom_model_free(m8);
    }
    free(base);
    free(fp8);
    /* an unknown format */
    loom_model *m = NULL;
    assert_int_equal(load_synthetic("f16", 2, &m), LOOM_ERR_INVALID_ARG);
    assert_null(m);
    assert_int_equal(load_synthetic("f16", -1, &m), LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "weights"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize),   cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_daz), cmocka_unit_test(test_matmul_multi),
        cmocka_unit_test(test_get_rows),   cmocka_unit_test(test_prepare_and_bad_input),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
