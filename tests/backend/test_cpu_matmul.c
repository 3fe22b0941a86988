/* test_cpu_matmul.c — the CPU backend's matmul with integer activations (f32_activations =
 * false) and its fused form, matmul_multi.
 *
 *   - matmul (1 and 2 threads) on T = 1, 3, 17, 53, K = 256, 512, 2304, 352, N = 7, 33 with
 *     padded strides, every weight type: every output equals loom__vec_dot_q of its row and the
 *     quantized token, bitwise; T = 1 vs T = 53 and 1 vs 2 threads bitwise; F32 weights keep
 *     the float path.
 *   - matmul_multi (q, k, v in one op) bitwise equal to one matmul per weight.
 *   - Bad input gives a status. */
#include "backend/qweight_util.h"

#include <math.h>

#include "backend/backend.h"
#include "tensor/qdot.h"

/* ------------------------------------------------------------------------------------------ */
/* The backend matmul                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* A CPU backend stream (freed by free_backend). */
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

static void run_matmul(loom__backend_stream *be, uint32_t t, const uint8_t *w, size_t w_stride,
                       int64_t N, const float *x, size_t x_stride, int64_t T, int64_t K,
                       float *out) {
    loom_tensor tw = loom_tensor_2d(t, (void *)w, K, N, w_stride);
    loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, (void *)x, K, T, x_stride);
    loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out, N, T, (size_t)N * sizeof(float));
    for (int64_t i = 0; i < N * T; i++) out[i] = NAN; /* poison */
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &to), LOOM_OK);
}

static void test_matmul_quantized(void **state) {
    (void)state;
    loom__backend_stream *be1 = make_backend(1, false), *be2 = make_backend(2, false);
    /* K = 352: 11 legacy blocks, a partial group of 8 (K-quants skip it); N = 33 > one group of
     * rows; T = 17 > one tile of tokens. */
    const int64_t Ts[] = {1, 3, 17, 53}, Ks[] = {256, 512, 2304, 352}, Ns[] = {7, 33};
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const uint32_t t = weight_types[ti];
        uint32_t at;
        assert_true(loom__vec_dot_type(t, &at));
        for (size_t ki = 0; ki < 4; ki++)
            for (size_t ni = 0; ni < 2; ni++) {
                const int64_t K = Ks[ki], N = Ns[ni], Tmax = 53;
                if (K % (int64_t)loom__type_get_traits(t)->block_elems != 0) continue;
                const size_t w_stride = row_bytes(t, K) + 6; /* padded, still 2-aligned */
                const size_t x_stride = (size_t)(K + 5) * sizeof(float);
                uint8_t *w = xmalloc((size_t)N * w_stride);
                for (int64_t o = 0; o < N; o++) make_weight_row(t, K, w + (size_t)o * w_stride);
                float *x = xmalloc((size_t)Tmax * x_stride);
                for (int64_t r = 0; r < Tmax; r++)
                    fill_acts((float *)((uint8_t *)x + (size_t)r * x_stride), K,
                              r % 2 ? 1.0f : 300.0f);
                float *o1 = xmalloc((size_t)(N * Tmax) * sizeof(float));
                float *o2 = xmalloc((size_t)(N * Tmax) * sizeof(float));
                uint8_t *xa = xmalloc(row_bytes(at, K));
                for (size_t tt = 0; tt < 4; tt++) {
                    const int64_t T = Ts[tt];
                    run_matmul(be1, t, w, w_stride, N, x, x_stride, T, K, o1);
                    run_matmul(be2, t, w, w_stride, N, x, x_stride, T, K, o2);
                    assert_memory_equal(o1, o2, (size_t)(N * T) * sizeof(float));
                    for (int64_t r = 0; r < T; r++) {
                        const float *xr =
                            (const float *)((const uint8_t *)x + (size_t)r * x_stride);
                        assert_true(loom__quantize_activations(at, xr, xa, K));
                        for (int64_t o = 0; o < N; o++) {
                            float want = loom__vec_dot_q(t, w + (size_t)o * w_stride, xa, K);
                            if (memcmp(&want, &o1[r * N + o], sizeof want) != 0)
                                fail_msg("%s K=%lld N=%lld T=%lld: out[%lld,%lld] %.9g vs %.9g",
                                         loom__type_name(t), (long long)K, (long long)N,
                                         (long long)T, (long long)r, (long long)o,
                                         (double)o1[r * N + o], (double)want);
                        }
                    }
                }
                /* T = 1 rows equal the same rows inside T = 53 (o1 holds T = 53 now). */
                for (int64_t r = 0; r < Tmax; r += 5) {
                    const float *xr = (const float *)((const uint8_t *)x + (size_t)r * x_stride);
                    run_matmul(be2, t, w, w_stride, N, xr, x_stride, 1, K, o2);
                    assert_memory_equal(o2, o1 + r * N, (size_t)N * sizeof(float));
                }
                free(w);
                free(x);
                free(o1);
                free(o2);
                free(xa);
            }
    }
    free_backend(be1);
    free_backend(be2);
}

/* F32 weights stay on the float path whatever f32_activations says. */
static void test_matmul_f32_weights(void **state) {
    (void)state;
    loom__backend_stream *bq = make_backend(2, false), *bf = make_backend(2, true);
    const int64_t K = 300, N = 9, T = 4;
    float *w = xmalloc((size_t)(N * K) * sizeof(float)), *x = xmalloc((size_t)(T * K) * 4);
    float *o1 = xmalloc((size_t)(N * T) * 4), *o2 = xmalloc((size_t)(N * T) * 4);
    fill_acts(w, N * K, 1.0f);
    fill_acts(x, T * K, 1.0f);
    run_matmul(bq, LOOM_TYPE_F32, (const uint8_t *)w, (size_t)K * 4, N, x, (size_t)K * 4, T, K, o1);
    run_matmul(bf, LOOM_TYPE_F32, (const uint8_t *)w, (size_t)K * 4, N, x, (size_t)K * 4, T, K, o2);
    assert_memory_equal(o1, o2, (size_t)(N * T) * 4);
    free(w);
    free(x);
    free(o1);
    free(o2);
    free_backend(bq);
    free_backend(bf);
}

static void test_matmul_bad(void **state) {
    (void)state;
    loom__backend_stream *be = make_backend(2, false);
    uint8_t w[4096] = {0};
    float x[1024] = {0}, out[64];
    /* K = 48 is not a whole number of q4_0 blocks */
    loom_tensor tw = loom_tensor_2d(LOOM_TYPE_Q4_0, w, 48, 2, 64);
    loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, x, 48, 1, 48 * 4);
    loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out, 2, 1, 8);
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &to), LOOM_ERR_INVALID_ARG);
    /* K = 128 with q4_K (256 per block) */
    tw = loom_tensor_2d(LOOM_TYPE_Q4_K, w, 128, 2, 144);
    tx = loom_tensor_2d(LOOM_TYPE_F32, x, 128, 1, 128 * 4);
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &to), LOOM_ERR_INVALID_ARG);
    /* an activation format is not a weight type */
    tw = loom_tensor_2d(LOOM_TYPE_Q8_K, w, 256, 2, 292);
    tx = loom_tensor_2d(LOOM_TYPE_F32, x, 256, 1, 256 * 4);
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &to), LOOM_ERR_UNSUPPORTED);
    /* K mismatch */
    tw = loom_tensor_2d(LOOM_TYPE_Q8_0, w, 64, 2, 68);
    tx = loom_tensor_2d(LOOM_TYPE_F32, x, 32, 1, 32 * 4);
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &to), LOOM_ERR_INVALID_ARG);
    /* T = 0 is a no-op */
    tx = loom_tensor_2d(LOOM_TYPE_F32, x, 64, 0, 64 * 4);
    to = loom_tensor_2d(LOOM_TYPE_F32, out, 2, 0, 8);
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &to), LOOM_OK);
    free_backend(be);
}

/* matmul_multi: several weights against one x give, bitwise, what one matmul each gives —
 * same type (one fused run over all their groups), mixed types (one matmul each), and float32
 * activations — on 1 and 2 threads, at T = 1, 5 (token lanes), 17 and 53 (prepared F16 rows at
 * K >= 1024; at K = 4096, 53 tokens are two blocks of them), with N of 7, 40 and 33 rows
 * (partial groups). */
static void test_matmul_multi(void **state) {
    (void)state;
    const int64_t Ts[] = {1, 5, 17, 53}, Ns[3] = {7, 40, 33}, Tmax = 53;
    const struct {
        uint32_t type[3];
        int64_t K;
        bool f32_act;
    } cases[] = {
        {{LOOM_TYPE_Q8_0, LOOM_TYPE_Q8_0, LOOM_TYPE_Q8_0}, 512, false},
        {{LOOM_TYPE_F16, LOOM_TYPE_F16, LOOM_TYPE_F16}, 1024, false},
        {{LOOM_TYPE_F16, LOOM_TYPE_F16, LOOM_TYPE_F16}, 352, false},
        {{LOOM_TYPE_F16, LOOM_TYPE_F16, LOOM_TYPE_F16}, 4096, false}, /* 2 blocks of tokens */
        {{LOOM_TYPE_Q4_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q4_K}, 512, false},
        {{LOOM_TYPE_Q4_K, LOOM_TYPE_Q6_K, LOOM_TYPE_Q4_K}, 256, false}, /* mixed: one each */
        {{LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_0}, 256, true},  /* float path */
    };
    loom__backend_stream *bes[2] = {make_backend(1, false), make_backend(2, false)};
    loom__backend_stream *bef = make_backend(2, true);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t K = cases[c].K;
        const size_t x_stride = (size_t)(K + 3) * sizeof(float);
        float *x = xmalloc((size_t)Tmax * x_stride);
        for (int64_t r = 0; r < Tmax; r++)
            fill_acts((float *)((uint8_t *)x + (size_t)r * x_stride), K, r % 2 ? 1.0f : 50.0f);
        uint8_t *w[3];
        float *want[3], *got[3];
        loom_tensor tw[3], to[3];
        const loom_tensor *wp[3];
        loom_tensor *op[3];
        for (int j = 0; j < 3; j++) {
            const uint32_t t = cases[c].type[j];
            w[j] = xmalloc((size_t)Ns[j] * row_bytes(t, K));
            for (int64_t o = 0; o < Ns[j]; o++)
                make_weight_row(t, K, w[j] + (size_t)o * row_bytes(t, K));
            want[j] = xmalloc((size_t)(Ns[j] * Tmax) * sizeof(float));
            got[j] = xmalloc((size_t)(Ns[j] * Tmax) * sizeof(float));
            tw[j] = loom_tensor_2d(t, w[j], K, Ns[j], row_bytes(t, K));
            wp[j] = &tw[j];
            op[j] = &to[j];
        }
        for (int b = 0; b < 2; b++) {
            loom__backend_stream *be = cases[c].f32_act ? bef : bes[b];
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                const int64_t T = Ts[ti];
                loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, x, K, T, x_stride);
                for (int j = 0; j < 3; j++) {
                    run_matmul(be, cases[c].type[j], w[j], row_bytes(cases[c].type[j], K), Ns[j], x,
                               x_stride, T, K, want[j]);
                    for (int64_t i = 0; i < Ns[j] * T; i++) got[j][i] = NAN; /* poison */
                    to[j] = loom_tensor_2d(LOOM_TYPE_F32, got[j], Ns[j], T,
                                           (size_t)Ns[j] * sizeof(float));
                }
                assert_int_equal(be->ops->matmul_multi(be->ctx, 3, wp, &tx, op), LOOM_OK);
                for (int j = 0; j < 3; j++)
                    if (memcmp(want[j], got[j], (size_t)(Ns[j] * T) * sizeof(float)) != 0)
                        fail_msg("case %zu T=%lld: matmul_multi's out %d differs from matmul's", c,
                                 (long long)T, j);
                /* n = 1 and n = 2 (gate and up) */
                assert_int_equal(be->ops->matmul_multi(be->ctx, 2, wp + 1, &tx, op + 1), LOOM_OK);
                assert_memory_equal(want[2], got[2], (size_t)(Ns[2] * T) * sizeof(float));
                assert_int_equal(be->ops->matmul_multi(be->ctx, 1, wp, &tx, op), LOOM_OK);
                assert_memory_equal(want[0], got[0], (size_t)(Ns[0] * T) * sizeof(float));
            }
        }
        for (int j = 0; j < 3; j++) {
            free(w[j]);
            free(want[j]);
            free(got[j]);
        }
        free(x);
    }
    free_backend(bes[0]);
    free_backend(bes[1]);
    free_backend(bef);
}

static void test_matmul_multi_bad(void **state) {
    (void)state;
    loom__backend_stream *be = make_backend(2, false);
    uint8_t w[2][4 * 68] = {{0}};
    float x[2 * 64] = {0}, out[4 * 16];
    loom_tensor tw[2] = {loom_tensor_2d(LOOM_TYPE_Q8_0, w[0], 64, 4, 68),
                         loom_tensor_2d(LOOM_TYPE_Q8_0, w[1], 64, 4, 68)};
    loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, x, 64, 2, 64 * 4);
    loom_tensor to[2] = {loom_tensor_2d(LOOM_TYPE_F32, out, 4, 2, 16),
                         loom_tensor_2d(LOOM_TYPE_F32, out + 32, 4, 2, 16)};
    const loom_tensor *wp[5] = {&tw[0], &tw[1], &tw[0], &tw[1], &tw[0]};
    loom_tensor *op[5] = {&to[0], &to[1], &to[0], &to[1], &to[0]};
    assert_int_equal(be->ops->matmul_multi(be->ctx, 2, wp, &tx, op), LOOM_OK);
    assert_int_equal(be->ops->matmul_multi(be->ctx, 0, wp, &tx, op), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->matmul_multi(be->ctx, LOOM_MATMUL_MULTI_MAX + 1, wp, &tx, op),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->matmul_multi(be->ctx, 2, NULL, &tx, op), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->matmul_multi(be->ctx, 2, wp, &tx, NULL), LOOM_ERR_INVALID_ARG);
    loom_tensor *op_null[2] = {&to[0], NULL};
    assert_int_equal(be->ops->matmul_multi(be->ctx, 2, wp, &tx, op_null), LOOM_ERR_INVALID_ARG);
    /* the same output twice, and an output on top of the other's */
    loom_tensor *op_same[2] = {&to[0], &to[0]};
    assert_int_equal(be->ops->matmul_multi(be->ctx, 2, wp, &tx, op_same), LOOM_ERR_INVALID_ARG);
    loom_tensor shifted = loom_tensor_2d(LOOM_TYPE_F32, out + 4, 4, 2, 16);
    loom_tensor *op_overlap[2] = {&to[0], &shifted};
    assert_int_equal(be->ops->matmul_multi(be->ctx, 2, wp, &tx, op_overlap), LOOM_ERR_INVALID_ARG);
    /* an output over another matmul's weight */
    loom_tensor on_w = loom_tensor_2d(LOOM_TYPE_F32, (float *)(void *)w[1], 4, 2, 16);
    loom_tensor *op_on_w[2] = {&on_w, &to[1]};
    assert_int_equal(be->ops->matmul_multi(be->ctx, 2, wp, &tx, op_on_w), LOOM_ERR_INVALID_ARG);
    /* a weight of another K */
    loom_tensor w32 = loom_tensor_2d(LOOM_TYPE_Q8_0, w[1], 32, 4, 34);
    const loom_tensor *wp_k[2] = {&tw[0], &w32};
    assert_int_equal(be->ops->matmul_multi(be->ctx, 2, wp_k, &tx, op), LOOM_ERR_INVALID_ARG);
    free_backend(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_quantized), cmocka_unit_test(test_matmul_f32_weights),
        cmocka_unit_test(test_matmul_multi),     cmocka_unit_test(test_matmul_multi_bad),
        cmocka_unit_test(test_matmul_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
