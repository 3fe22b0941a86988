/* test_cpu_ops.c — the backend registry, CPU buffers, matmul and get_rows against naive
 * double-precision references; batch invariance (T=1 vs T=17) and 1 vs 2 threads bitwise;
 * bad input gives the right status. Also the backend registry's checks of an ops table, the
 * CPU device's buffers, host memory, batched copies and weight preparation.
 *
 * Tolerance of matmul: |got - ref| <= 1e-5 * sum_k |w[o,k] x[t,k]| + 1e-6, ref computed in
 * double from the very weights the kernel sees (loom__dequantize_row's output); a float32 sum
 * over 32 lanes of K/32 terms each stays well inside that for the K used here. get_rows is
 * exact (it is dequantization). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdalign.h>
#include <time.h>

#include "backend/cpu_test_util.h"
#include "tensor/fp16.h"
#include "tensor/quant.h"
#include "tensor/quant_layouts.h"

/* ------------------------------------------------------------------------------------------ */
/* Weights of any type                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* A random [N, K] weight of type t (row_stride = encoded row bytes + pad) and its float32
 * dequantization wf [N, K]. Legacy and plain types are quantized from random floats; K-quants
 * are random bytes with their f16 scale fields set to sane values. */
typedef struct test_weight {
    uint8_t *data;
    size_t row_stride;
    float *wf;
} test_weight;

static void set_f16_field(uint8_t *block, size_t offset, float v) {
    uint16_t h = loom__f32_to_f16(v);
    memcpy(block + offset, &h, sizeof h);
}

static test_weight make_weight(uint32_t t, int64_t N, int64_t K, size_t pad) {
    test_weight w;
    size_t row_bytes;
    assert_true(loom__type_row_bytes(t, K, &row_bytes));
    w.row_stride = row_bytes + pad;
    w.data = malloc((size_t)N * w.row_stride + 1);
    w.wf = falloc((size_t)(N * K));
    assert_non_null(w.data);
    float *src = falloc((size_t)K);
    const loom__type_traits *tr = loom__type_get_traits(t);
    for (int64_t o = 0; o < N; o++) {
        uint8_t *row = w.data + (size_t)o * w.row_stride;
        fill_rand(src, (size_t)K, 1.0f);
        if (loom__quantize_row(t, src, row, K)) {
            /* quantized from floats */
        } else {
            for (size_t b = 0; b < row_bytes; b++) row[b] = (uint8_t)rng_u64();
            for (int64_t blk = 0; blk < K / tr->block_elems; blk++) {
                uint8_t *bp = row + (size_t)blk * tr->block_bytes;
                switch (t) {
                case LOOM_TYPE_Q2_K:
                    set_f16_field(bp, offsetof(loom__block_q2_K, d), 0.02f);
                    set_f16_field(bp, offsetof(loom__block_q2_K, dmin), 0.01f);
                    break;
                case LOOM_TYPE_Q3_K:
                    set_f16_field(bp, offsetof(loom__block_q3_K, d), 0.02f);
                    break;
                case LOOM_TYPE_Q4_K:
                    set_f16_field(bp, offsetof(loom__block_q4_K, d), 0.02f);
                    set_f16_field(bp, offsetof(loom__block_q4_K, dmin), 0.01f);
                    break;
                case LOOM_TYPE_Q5_K:
                    set_f16_field(bp, offsetof(loom__block_q5_K, d), 0.02f);
                    set_f16_field(bp, offsetof(loom__block_q5_K, dmin), 0.01f);
                    break;
                case LOOM_TYPE_Q6_K:
                    set_f16_field(bp, offsetof(loom__block_q6_K, d), 0.01f);
                    break;
                default:
                    fail_msg("no generator for type %s", loom__type_name(t));
                }
            }
        }
        assert_true(loom__dequantize_row(t, row, w.wf + o * K, K));
        for (int64_t k = 0; k < K; k++) assert_true(isfinite(w.wf[o * K + k]));
    }
    free(src);
    return w;
}

static void free_weight(test_weight *w) {
    free(w->data);
    free(w->wf);
}

/* ------------------------------------------------------------------------------------------ */
/* matmul                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct mm_case {
    uint32_t type;
    int64_t T, K, N;
    size_t w_pad;  /* bytes added to each weight row's stride (even: blocks are 2-aligned) */
    int64_t x_pad; /* floats added to each x / out row's stride */
} mm_case;

static loom_status run_matmul(loom__backend_stream *be, const test_weight *w, const mm_case *c,
                              const float *x, int64_t T, float *out) {
    loom_tensor tw = loom_tensor_2d(c->type, w->data, c->K, c->N, w->row_stride);
    loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, (void *)x, c->K, T,
                                    (size_t)(c->K + c->x_pad) * sizeof(float));
    loom_tensor to =
        loom_tensor_2d(LOOM_TYPE_F32, out, c->N, T, (size_t)(c->N + c->x_pad) * sizeof(float));
    return be->ops->matmul(be->ctx, &tw, &tx, &to);
}

static void check_matmul_case(const mm_case *c) {
    const int64_t xs = c->K + c->x_pad, os = c->N + c->x_pad;
    test_weight w = make_weight(c->type, c->N, c->K, c->w_pad);
    float *x = falloc((size_t)(c->T * xs));
    fill_rand(x, (size_t)(c->T * xs), 1.0f);
    float *out[2] = {falloc((size_t)(c->T * os)), falloc((size_t)(c->T * os))};
    double *ref = malloc(sizeof(double) * (size_t)(c->T * c->N));
    double *mag = malloc(sizeof(double) * (size_t)(c->T * c->N));
    float *got = falloc((size_t)(c->T * c->N));

    for (int b = 0; b < 2; b++) {
        poison(out[b], (size_t)(c->T * os));
        assert_int_equal(run_matmul(g_be[b], &w, c, x, c->T, out[b]), LOOM_OK);
    }
    for (int64_t t = 0; t < c->T; t++) {
        for (int64_t o = 0; o < c->N; o++) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < c->K; k++) {
                double p = (double)w.wf[o * c->K + k] * (double)x[t * xs + k];
                s += p;
                m += fabs(p);
            }
            ref[t * c->N + o] = s;
            mag[t * c->N + o] = m;
            got[t * c->N + o] = out[0][t * os + o];
        }
    }
    char what[96];
    snprintf(what, sizeof what, "matmul %s T=%lld K=%lld N=%lld", loom__type_name(c->type),
             (long long)c->T, (long long)c->K, (long long)c->N);
    assert_true(close_enough(got, ref, mag, (size_t)(c->T * c->N), 1e-5, 1e-6, what));
    /* 1 vs 2 threads (the padding between rows stays poisoned in both). */
    for (int64_t t = 0; t < c->T; t++)
        assert_true(same_bits(out[0] + t * os, out[1] + t * os, (size_t)c->N, what));
    /* Batch invariance: each row alone (T = 1) gives the same bits as inside the batch. */
    float *one = falloc((size_t)os);
    for (int64_t t = 0; t < c->T; t++) {
        poison(one, (size_t)os);
        assert_int_equal(run_matmul(g_be[1], &w, c, x + t * xs, 1, one), LOOM_OK);
        assert_true(same_bits(one, out[0] + t * os, (size_t)c->N, what));
    }
    free(one);
    free(got);
    free(mag);
    free(ref);
    free(out[0]);
    free(out[1]);
    free(x);
    free_weight(&w);
}

static void test_matmul_f32(void **state) {
    (void)state;
    const mm_case cases[] = {
        {LOOM_TYPE_F32, 1, 1, 1, 0, 0},      {LOOM_TYPE_F32, 1, 37, 5, 0, 0},
        {LOOM_TYPE_F32, 3, 37, 33, 12, 3},   {LOOM_TYPE_F32, 17, 100, 19, 0, 1},
        {LOOM_TYPE_F32, 17, 1536, 40, 4, 0}, {LOOM_TYPE_F32, 17, 7, 10, 0, 0},
        {LOOM_TYPE_F32, 3, 70001, 3, 0, 0}, /* K past the scratch group size: rb = 1 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_matmul_case(&cases[i]);
}

static void test_matmul_quant(void **state) {
    (void)state;
    const mm_case cases[] = {
        {LOOM_TYPE_F16, 3, 54, 9, 2, 0},     {LOOM_TYPE_BF16, 17, 97, 7, 0, 2},
        {LOOM_TYPE_Q8_0, 17, 64, 13, 0, 0},  {LOOM_TYPE_Q4_0, 3, 96, 11, 6, 1},
        {LOOM_TYPE_Q4_1, 17, 64, 5, 0, 0},   {LOOM_TYPE_Q5_0, 1, 64, 6, 0, 0},
        {LOOM_TYPE_Q5_1, 17, 32, 17, 0, 0},  {LOOM_TYPE_Q2_K, 3, 256, 5, 0, 0},
        {LOOM_TYPE_Q3_K, 17, 256, 6, 0, 0},  {LOOM_TYPE_Q4_K, 17, 512, 9, 0, 0},
        {LOOM_TYPE_Q5_K, 1, 256, 7, 0, 0},   {LOOM_TYPE_Q6_K, 3, 256, 21, 0, 0},
        {LOOM_TYPE_Q8_0, 3, 70016, 3, 0, 0}, /* grows the per-thread scratch */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_matmul_case(&cases[i]);
}

static void test_matmul_bad(void **state) {
    (void)state;
    loom__backend_stream *be = g_be[1];
    float w[6 * 64], x[3 * 64], out[3 * 6];
    fill_rand(w, 6 * 64, 1.0f);
    fill_rand(x, 3 * 64, 1.0f);
    loom_tensor tw = loom_tensor_2d(LOOM_TYPE_F32, w, 64, 6, 64 * 4);
    loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, x, 64, 3, 64 * 4);
    loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out, 6, 3, 6 * 4);
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &to), LOOM_OK);

    loom_tensor bad = tx;
    bad.ne[0] = 63; /* K mismatch */
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &bad, &to), LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "matmul"));
    bad = to;
    bad.ne[0] = 5; /* N mismatch */
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &bad), LOOM_ERR_INVALID_ARG);
    bad = to;
    bad.ne[1] = 2; /* T mismatch */
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &bad), LOOM_ERR_INVALID_ARG);
    bad = tx;
    bad.type = LOOM_TYPE_F16; /* activations must be f32 */
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &bad, &to), LOOM_ERR_UNSUPPORTED);
    bad = tw;
    bad.type = LOOM_TYPE_I32; /* not a weight type */
    assert_int_equal(be->ops->matmul(be->ctx, &bad, &tx, &to), LOOM_ERR_UNSUPPORTED);
    bad.type = LOOM_TYPE_Q8_K; /* activation-only format */
    assert_int_equal(be->ops->matmul(be->ctx, &bad, &tx, &to), LOOM_ERR_UNSUPPORTED);
    bad.type = (loom_type)37; /* unknown id */
    assert_int_equal(be->ops->matmul(be->ctx, &bad, &tx, &to), LOOM_ERR_UNSUPPORTED);
    bad = tw;
    bad.type = LOOM_TYPE_Q8_0;
    bad.ne[0] = 48; /* not a whole number of 32-blocks */
    loom_tensor x48 = tx;
    x48.ne[0] = 48;
    assert_int_equal(be->ops->matmul(be->ctx, &bad, &x48, &to), LOOM_ERR_INVALID_ARG);
    bad = tw;
    bad.type = LOOM_TYPE_Q8_0;
    bad.ne[0] = 64;
    bad.row_stride = 69; /* blocks hold 16-bit scales: rows must be 2-byte aligned */
    assert_int_equal(be->ops->matmul(be->ctx, &bad, &tx, &to), LOOM_ERR_INVALID_ARG);
    bad = tx;
    bad.row_stride = 60 * 4; /* rows overlap */
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &bad, &to), LOOM_ERR_INVALID_ARG);
    loom_tensor alias = loom_tensor_2d(LOOM_TYPE_F32, x, 6, 3, 64 * 4); /* out over x */
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &alias), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->matmul(be->ctx, NULL, &tx, &to), LOOM_ERR_INVALID_ARG);
    /* T = 0 is a no-op. */
    loom_tensor x0 = tx, o0 = to;
    x0.ne[1] = 0;
    o0.ne[1] = 0;
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &x0, &o0), LOOM_OK);
}

/* ------------------------------------------------------------------------------------------ */
/* get_rows                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static void test_get_rows(void **state) {
    (void)state;
    const struct {
        uint32_t type;
        int64_t D;
    } cases[] = {{LOOM_TYPE_F32, 54},  {LOOM_TYPE_F16, 97},   {LOOM_TYPE_BF16, 3},
                 {LOOM_TYPE_Q8_0, 64}, {LOOM_TYPE_Q4_K, 256}, {LOOM_TYPE_Q6_K, 512}};
    const int32_t ids[] = {12, 0, 5, 5, 7, 12, 1};
    const int64_t V = 13, n = 7;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t D = cases[c].D;
        test_weight w = make_weight(cases[c].type, V, D, 8);
        loom_tensor table = loom_tensor_2d(cases[c].type, w.data, D, V, w.row_stride);
        loom_tensor tid = loom_tensor_2d(LOOM_TYPE_I32, (void *)ids, n, 1, sizeof ids);
        float *out[2] = {falloc((size_t)(n * D)), falloc((size_t)(n * D))};
        for (int b = 0; b < 2; b++) {
            poison(out[b], (size_t)(n * D));
            loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out[b], D, n, (size_t)D * 4);
            assert_int_equal(g_be[b]->ops->get_rows(g_be[b]->ctx, &table, &tid, &to), LOOM_OK);
        }
        for (int64_t i = 0; i < n; i++)
            assert_true(same_bits(out[0] + i * D, w.wf + ids[i] * D, (size_t)D, "get_rows"));
        assert_true(same_bits(out[0], out[1], (size_t)(n * D), "get_rows threads"));
        free(out[0]);
        free(out[1]);
        free_weight(&w);
    }
}

static void test_get_rows_bad(void **state) {
    (void)state;
    loom__backend_stream *be = g_be[1];
    float table[4 * 8], out[3 * 8];
    fill_rand(table, 32, 1.0f);
    int32_t ids[3] = {0, 3, 1};
    loom_tensor tt = loom_tensor_2d(LOOM_TYPE_F32, table, 8, 4, 32);
    loom_tensor ti = loom_tensor_2d(LOOM_TYPE_I32, ids, 3, 1, sizeof ids);
    loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out, 8, 3, 32);
    assert_int_equal(be->ops->get_rows(be->ctx, &tt, &ti, &to), LOOM_OK);

    ids[1] = 4; /* one past the end */
    poison(out, 24);
    assert_int_equal(be->ops->get_rows(be->ctx, &tt, &ti, &to), LOOM_ERR_BAD_INPUT);
    assert_non_null(strstr(loom_last_error(), "get_rows"));
    for (int i = 0; i < 24; i++) assert_true(isnan(out[i])); /* nothing written */
    ids[1] = -1;
    assert_int_equal(be->ops->get_rows(be->ctx, &tt, &ti, &to), LOOM_ERR_BAD_INPUT);
    ids[1] = 2;
    loom_tensor bad = ti;
    bad.type = LOOM_TYPE_F32;
    assert_int_equal(be->ops->get_rows(be->ctx, &tt, &bad, &to), LOOM_ERR_UNSUPPORTED);
    bad = to;
    bad.ne[0] = 7;
    assert_int_equal(be->ops->get_rows(be->ctx, &tt, &ti, &bad), LOOM_ERR_INVALID_ARG);
    bad.ne[0] = 8;
    bad.ne[1] = 2;
    assert_int_equal(be->ops->get_rows(be->ctx, &tt, &ti, &bad), LOOM_ERR_INVALID_ARG);
    bad = tt;
    bad.type = LOOM_TYPE_I16;
    assert_int_equal(be->ops->get_rows(be->ctx, &bad, &ti, &to), LOOM_ERR_UNSUPPORTED);
}

/* ------------------------------------------------------------------------------------------ */
/* Registry, supports, buffers                                                                */
/* ------------------------------------------------------------------------------------------ */

static void test_registry(void **state) {
    (void)state;
    const loom_backend_ops *cpu = loom__cpu_backend_ops();
    assert_int_equal(loom__backend_check_ops(cpu, "cpu"), LOOM_OK);
    loom_backend_ops ops = *cpu;
    ops.workspace_size = NULL; /* optional */
    ops.step_begin = NULL;
    ops.matmul_multi = NULL;
    assert_int_equal(loom__backend_check_ops(&ops, "t"), LOOM_OK);

    loom_backend_ops bad = ops;
    bad.abi_version = LOOM_BACKEND_ABI_VERSION + 1;
    assert_int_equal(loom__backend_check_ops(&bad, "t"), LOOM_ERR_UNSUPPORTED);
    assert_non_null(strstr(loom_last_error(), "ABI version"));
    bad = ops;
    bad.attention = NULL;
    assert_int_equal(loom__backend_check_ops(&bad, "t"), LOOM_ERR_BACKEND);
    assert_non_null(strstr(loom_last_error(), "'attention'"));
    bad = ops;
    bad.copy_batch = NULL;
    assert_int_equal(loom__backend_check_ops(&bad, "t"), LOOM_ERR_BACKEND);
    assert_non_null(strstr(loom_last_error(), "'copy_batch'"));
    bad = ops;
    bad.name = NULL;
    assert_int_equal(loom__backend_check_ops(&bad, "t"), LOOM_ERR_BACKEND);
    assert_int_equal(loom__backend_check_ops(NULL, "t"), LOOM_ERR_BACKEND);

    /* Opening by name: the built-in cpu; a malformed name; the CPU's one device. */
    loom_backend_open_params p = {.n_threads = 1};
    loom__backend *be = NULL;
    assert_int_equal(loom__backend_open("cpu", &p, &be), LOOM_OK);
    assert_string_equal(be->name, "cpu");
    assert_null(be->dl);
    loom__backend_close(be);
    loom__backend_close(NULL);
    be = NULL;
    assert_int_equal(loom__backend_open("../cpu", &p, &be), LOOM_ERR_INVALID_ARG);
    assert_null(be);
    assert_int_equal(loom__backend_open("", &p, &be), LOOM_ERR_INVALID_ARG);
    p.device = 1;
    assert_int_equal(loom__backend_open("cpu", &p, &be), LOOM_ERR_NO_DEVICE);
    assert_non_null(strstr(loom_last_error(), "device 1"));
    assert_null(be);
    assert_int_equal(loom__backend_open("cpu", NULL, &be), LOOM_ERR_INVALID_ARG);
}

static void test_supports(void **state) {
    (void)state;
    const loom__backend *be = g_be[0]->be;
#define SUPPORTS(o, t) loom__backend_supports(be, &(loom_op_desc){.op = (o), .type = (t)})
    assert_true(SUPPORTS(LOOM_OP_MATMUL, LOOM_TYPE_F32));
    assert_true(SUPPORTS(LOOM_OP_MATMUL, LOOM_TYPE_Q4_K));
    assert_true(SUPPORTS(LOOM_OP_GET_ROWS, LOOM_TYPE_Q6_K));
    assert_false(SUPPORTS(LOOM_OP_MATMUL, LOOM_TYPE_I32));
    assert_false(SUPPORTS(LOOM_OP_MATMUL, LOOM_TYPE_Q8_K));
    assert_false(SUPPORTS(LOOM_OP_MATMUL, (loom_type)37));
    assert_false(SUPPORTS(LOOM_OP_MATMUL, LOOM_TYPE_FP8_E4M3));
    assert_true(SUPPORTS(LOOM_OP_ROPE, LOOM_TYPE_F32));
    assert_false(SUPPORTS(LOOM_OP_ADD, LOOM_TYPE_F16));
    assert_false(SUPPORTS(LOOM_OP_COUNT_, LOOM_TYPE_F32));
    assert_false(loom__backend_supports(NULL, &(loom_op_desc){.op = LOOM_OP_ADD}));
    assert_false(loom__backend_supports(be, NULL));
#undef SUPPORTS
    /* Attention routes on its variant: kv type, head dim, window, soft-cap, layout, scales. */
    loom_op_desc att = {.op = LOOM_OP_ATTENTION,
                        .type = LOOM_TYPE_F16,
                        .head_dim = 256,
                        .n_head = 4,
                        .n_kv_heads = 1,
                        .window = 512};
    assert_true(loom__backend_supports(be, &att));
    att.softcap = 30.0f;
    assert_true(loom__backend_supports(be, &att));
    att.type = LOOM_TYPE_F32;
    assert_true(loom__backend_supports(be, &att));
    /* BF16 pages, and FP8 pages with their per-(position, head) scales — only with them. */
    loom_op_desc yes = att;
    yes.type = LOOM_TYPE_BF16;
    assert_true(loom__backend_supports(be, &yes));
    yes.type = LOOM_TYPE_FP8_E4M3;
    yes.scale_kind = LOOM_KV_SCALE_PER_TOKEN_HEAD;
    assert_true(loom__backend_supports(be, &yes));
    yes.type = LOOM_TYPE_FP8_E5M2;
    assert_true(loom__backend_supports(be, &yes));
    loom_op_desc no = yes;
    no.scale_kind = LOOM_KV_SCALE_NONE;
    assert_false(loom__backend_supports(be, &no));
    no.scale_kind = LOOM_KV_SCALE_PER_HEAD;
    assert_false(loom__backend_supports(be, &no));
    no = att;
    no.type = LOOM_TYPE_Q8_0;
    assert_false(loom__backend_supports(be, &no));
    no = att;
    no.scale_kind = LOOM_KV_SCALE_PER_TOKEN_HEAD;
    assert_false(loom__backend_supports(be, &no));
    no = att;
    no.window = -1;
    assert_false(loom__backend_supports(be, &no));
    no = att;
    no.head_dim = 0;
    assert_false(loom__backend_supports(be, &no));
    no = att;
    no.op = LOOM_OP_KV_STORE;
    assert_true(loom__backend_supports(be, &no));
}

static void test_buffers(void **state) {
    (void)state;
    loom__backend_stream *be = g_be[1];
    void *dev = be->dev, *ctx = be->ctx;
    const size_t sizes[] = {0, 1, 63, 64, 100, 4096};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        loom_buffer *buf = NULL;
        assert_int_equal(be->ops->buffer_alloc(dev, sizes[i], &buf), LOOM_OK);
        char *base = be->ops->buffer_base(dev, buf);
        assert_non_null(base);
        assert_int_equal((uintptr_t)base % 64, 0);
        if (sizes[i] > 0) {
            char src[4096], back[4096];
            for (size_t k = 0; k < sizes[i]; k++) src[k] = (char)(k * 7 + 1);
            assert_int_equal(be->ops->tensor_set(ctx, base, src, sizes[i]), LOOM_OK);
            assert_int_equal(be->ops->synchronize(ctx), LOOM_OK);
            assert_int_equal(be->ops->tensor_get(ctx, back, base, sizes[i]), LOOM_OK);
            assert_memory_equal(src, back, sizes[i]);
        }
        be->ops->buffer_free(dev, buf);
    }
    be->ops->buffer_free(dev, NULL);
    loom_buffer *none = NULL;
    assert_int_equal(be->ops->buffer_alloc(dev, 16, NULL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->buffer_alloc(dev, SIZE_MAX - 8, &none), LOOM_ERR_OUT_OF_MEMORY);
    assert_null(none);
    char host[8] = {0};
    assert_int_equal(be->ops->tensor_set(ctx, NULL, host, 4), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->tensor_get(ctx, host, NULL, 4), LOOM_ERR_INVALID_ARG);

    /* Host memory, and what the device reports of its memory. */
    void *pinned = NULL;
    assert_int_equal(be->ops->host_alloc(dev, 1000, &pinned), LOOM_OK);
    memset(pinned, 7, 1000);
    be->ops->host_free(dev, pinned);
    be->ops->host_free(dev, NULL);
    assert_int_equal(be->ops->host_alloc(dev, SIZE_MAX - 8, &pinned), LOOM_ERR_OUT_OF_MEMORY);
    size_t free_b = 0, total_b = 0;
    assert_int_equal(be->ops->memory_info(dev, &free_b, &total_b), LOOM_OK);
    assert_true(total_b > 0 && free_b <= total_b);
    assert_int_equal(be->ops->memory_info(dev, NULL, &total_b), LOOM_ERR_INVALID_ARG);

    /* Batched copies: many ranges in one call, each landing; an overlapping range or a NULL
     * pointer refuses the whole batch before anything is copied. */
    char a[96], b[96];
    for (int k = 0; k < 96; k++) a[k] = (char)k, b[k] = 0;
    loom_copy_range r[3] = {{a, b, 32}, {a + 40, b + 40, 16}, {a + 64, b + 70, 20}};
    assert_int_equal(be->ops->copy_batch(ctx, LOOM_COPY_DEVICE, r, 3), LOOM_OK);
    assert_memory_equal(a, b, 32);
    assert_memory_equal(a + 40, b + 40, 16);
    assert_memory_equal(a + 64, b + 70, 20);
    assert_int_equal(b[33], 0);
    char c[96] = {0};
    loom_copy_range bad[2] = {{a, c, 8}, {b, b + 4, 8}};
    assert_int_equal(be->ops->copy_batch(ctx, LOOM_COPY_TO_HOST, bad, 2), LOOM_ERR_INVALID_ARG);
    assert_int_equal(c[1], 0); /* the first, sound range was not copied either */
    bad[1] = (loom_copy_range){NULL, b, 8};
    assert_int_equal(be->ops->copy_batch(ctx, LOOM_COPY_FROM_HOST, bad, 2), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->copy_batch(ctx, (loom_copy_kind)7, r, 1), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->copy_batch(ctx, LOOM_COPY_DEVICE, NULL, 0), LOOM_OK);
}

/* Weights: a persistent source is used in place; any other is copied (the source may then be
 * freed); shapes and types the CPU cannot compute with are refused with the weight's name. */
static void test_weight_prepare(void **state) {
    (void)state;
    loom__backend_stream *be = g_be[0];
    float rows[4][8];
    for (int i = 0; i < 32; i++) rows[i / 8][i % 8] = (float)i * 0.5f;
    loom_weight_src src = {.name = "w",
                           .type = LOOM_TYPE_F32,
                           .ne = {8, 4},
                           .row_stride = sizeof rows[0],
                           .data = rows,
                           .persistent = true,
                           .use = LOOM_WEIGHT_MATMUL};
    loom_tensor t;
    assert_int_equal(be->ops->weight_prepare(be->dev, &src, &t), LOOM_OK);
    assert_ptr_equal(t.data, rows);
    assert_int_equal(t.ne[0], 8);
    assert_int_equal(t.ne[1], 4);
    src.persistent = false;
    assert_int_equal(be->ops->weight_prepare(be->dev, &src, &t), LOOM_OK);
    assert_ptr_not_equal(t.data, rows);
    assert_int_equal((uintptr_t)t.data % 64, 0);
    assert_memory_equal(t.data, rows, sizeof rows);
    /* A strided source is packed. */
    src.ne[0] = 4;
    assert_int_equal(be->ops->weight_prepare(be->dev, &src, &t), LOOM_OK);
    assert_int_equal(t.row_stride, 4 * sizeof(float));
    for (int r = 0; r < 4; r++) assert_memory_equal((float *)t.data + r * 4, rows[r], 16);

    loom_weight_src badw = src;
    badw.type = LOOM_TYPE_Q8_K;
    assert_int_equal(be->ops->weight_prepare(be->dev, &badw, &t), LOOM_ERR_UNSUPPORTED);
    assert_non_null(strstr(loom_last_error(), "'w'"));
    badw = src;
    badw.ne[0] = 0;
    assert_int_equal(be->ops->weight_prepare(be->dev, &badw, &t), LOOM_ERR_INVALID_ARG);
    badw = src;
    badw.row_stride = 8;
    assert_int_equal(be->ops->weight_prepare(be->dev, &badw, &t), LOOM_ERR_INVALID_ARG);
    badw = src;
    badw.data = NULL;
    assert_int_equal(be->ops->weight_prepare(be->dev, &badw, &t), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->weight_prepare(be->dev, NULL, &t), LOOM_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),     cmocka_unit_test(test_supports),
        cmocka_unit_test(test_buffers),      cmocka_unit_test(test_weight_prepare),
        cmocka_unit_test(test_matmul_f32),   cmocka_unit_test(test_matmul_quant),
        cmocka_unit_test(test_matmul_bad),   cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_get_rows_bad),
    };
    return cmocka_run_group_tests(tests, cpu_group_setup, cpu_group_teardown);
}
