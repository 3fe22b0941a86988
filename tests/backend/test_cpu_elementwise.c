/* test_cpu_elementwise.c — rms_norm, rope, glu, add and scale of the CPU backend
 * against naive double-precision references, on awkward sizes, with poisoned outputs, 1 vs 2
 * threads bitwise, and bad input.
 *
 * Tolerances (inputs of magnitude <= ~1 unless said): rms_norm 1e-5 relative + 1e-6; rope
 * 2e-6 absolute (angles are computed in double, the rotation in float); glu 1e-5 relative +
 * 1e-6; add and scale exact (one float operation each).
 *
 * The exp and tanh under glu (cpu_vmath.h) against double-precision exp / tanh over a dense
 * sweep of the whole float range: within VM_EXP_MAX_ULP and VM_TANH_MAX_ULP ulps of the float
 * result. glu's vector code gives the bits of the scalar code (so those bounds hold for it),
 * and a row computed in pieces of odd lengths gives the bits of the row computed whole. */

/* cpu_vmath.h's scalar code is compared bit for bit with the backend's vector code: clang must
 * not contract it (GCC does not in ISO C mode). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backend/cpu_test_util.h"

#include "backend/cpu/cpu_vmath.h"

static loom_tensor t2d(float *p, int64_t cols, int64_t rows, int64_t stride) {
    return loom_tensor_2d(LOOM_TYPE_F32, p, cols, rows, (size_t)stride * sizeof(float));
}

/* ------------------------------------------------------------------------------------------ */
/* rms_norm                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static void test_rms_norm(void **state) {
    (void)state;
    const int64_t dims[] = {1, 54, 97, 4096};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int64_t D = dims[di], R = D == 4096 ? 5 : 3, S = D + 2; /* padded rows */
        float *x = falloc((size_t)(R * S)), *w = falloc((size_t)D);
        fill_rand(x, (size_t)(R * S), 3.0f);
        fill_rand(w, (size_t)D, 2.0f);
        for (int64_t i = 0; i < D; i++) x[i] = 0.0f; /* an all-zero row */
        for (int with_w = 0; with_w < 2; with_w++) {
            float *out[2] = {falloc((size_t)(R * S)), falloc((size_t)(R * S))};
            loom_tensor tx = t2d(x, D, R, S), tw = t2d(w, D, 1, D);
            for (int b = 0; b < 2; b++) {
                poison(out[b], (size_t)(R * S));
                loom_tensor to = t2d(out[b], D, R, S);
                assert_int_equal(
                    g_be[b]->ops->rms_norm(g_be[b]->ctx, &tx, with_w ? &tw : NULL, 1e-6f, &to),
                    LOOM_OK);
            }
            for (int64_t r = 0; r < R; r++) {
                double ss = 0, ref[4096];
                for (int64_t i = 0; i < D; i++) ss += (double)x[r * S + i] * x[r * S + i];
                double inv = 1.0 / sqrt(ss / (double)D + 1e-6);
                for (int64_t i = 0; i < D; i++)
                    ref[i] = x[r * S + i] * inv * (with_w ? (double)w[i] : 1.0);
                assert_true(
                    close_enough(out[0] + r * S, ref, NULL, (size_t)D, 1e-5, 1e-6, "rms_norm"));
                assert_true(same_bits(out[0] + r * S, out[1] + r * S, (size_t)D, "rms threads"));
            }
            free(out[0]);
            free(out[1]);
        }
        free(x);
        free(w);
    }
}

static void test_rms_norm_bad(void **state) {
    (void)state;
    loom__backend_stream *be = g_be[0];
    float x[2 * 8], w[8], out[2 * 8];
    fill_rand(x, 16, 1.0f);
    fill_rand(w, 8, 1.0f);
    loom_tensor tx = t2d(x, 8, 2, 8), tw = t2d(w, 8, 1, 8), to = t2d(out, 8, 2, 8);
    assert_int_equal(be->ops->rms_norm(be->ctx, &tx, &tw, 1e-5f, &to), LOOM_OK);
    assert_int_equal(be->ops->rms_norm(be->ctx, &tx, &tw, -1.0f, &to), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->rms_norm(be->ctx, &tx, &tw, NAN, &to), LOOM_ERR_INVALID_ARG);
    loom_tensor bad = t2d(w, 7, 1, 7);
    assert_int_equal(be->ops->rms_norm(be->ctx, &tx, &bad, 1e-5f, &to), LOOM_ERR_INVALID_ARG);
    bad = t2d(out, 8, 1, 8);
    assert_int_equal(be->ops->rms_norm(be->ctx, &tx, &tw, 1e-5f, &bad), LOOM_ERR_INVALID_ARG);
    bad = tx;
    bad.type = LOOM_TYPE_F16;
    assert_int_equal(be->ops->rms_norm(be->ctx, &bad, &tw, 1e-5f, &to), LOOM_ERR_UNSUPPORTED);
    /* In place (out is x) is fine. */
    assert_int_equal(be->ops->rms_norm(be->ctx, &tx, &tw, 1e-5f, &tx), LOOM_OK);
}

/* ------------------------------------------------------------------------------------------ */
/* rope                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static void ref_rope(const float *x, double *out, int32_t pos, const loom_rope_params *p) {
    const int half = p->n_rot / 2;
    for (int h = 0; h < p->n_head; h++) {
        const float *xh = x + h * p->head_dim;
        double *oh = out + h * p->head_dim;
        for (int i = 0; i < p->head_dim; i++) oh[i] = xh[i];
        for (int i = 0; i < half; i++) {
            double theta = pos * (double)p->freq_scale *
                           pow((double)p->theta_base, -2.0 * i / (double)p->n_rot);
            if (p->freq_factors) theta /= p->freq_factors[i];
            int a = p->mode == LOOM_ROPE_NORMAL ? 2 * i : i;
            int b = p->mode == LOOM_ROPE_NORMAL ? 2 * i + 1 : i + half;
            oh[a] = xh[a] * cos(theta) - xh[b] * sin(theta);
            oh[b] = xh[a] * sin(theta) + xh[b] * cos(theta);
        }
    }
}

static void test_rope(void **state) {
    (void)state;
    float ff[64];
    for (int i = 0; i < 64; i++) ff[i] = 1.0f + (float)i * 0.25f;
    const struct {
        loom_rope_mode mode;
        int n_head, head_dim, n_rot;
        float base, fscale;
        const float *ff;
    } cases[] = {
        {LOOM_ROPE_NORMAL, 4, 64, 64, 10000.0f, 1.0f, NULL},
        {LOOM_ROPE_NEOX, 4, 64, 64, 10000.0f, 1.0f, NULL},
        {LOOM_ROPE_NORMAL, 3, 54, 32, 500000.0f, 0.5f, NULL}, /* partial rotation */
        {LOOM_ROPE_NEOX, 3, 54, 20, 1000000.0f, 1.0f, NULL},
        {LOOM_ROPE_NORMAL, 2, 128, 128, 500000.0f, 1.0f, ff}, /* llama3-style factors */
        {LOOM_ROPE_NEOX, 5, 2, 2, 10000.0f, 1.0f, NULL},
    };
    const int32_t positions[] = {0, 1, 7, 54, 97, 1000, 4095, 100000, 131071,
                                 3, 2, 9, 17, 5,  0,    16,   8};
    const int64_t T = 17;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        loom_rope_params p = {cases[c].mode, cases[c].n_head, cases[c].head_dim, cases[c].n_rot,
                              cases[c].base, cases[c].fscale, cases[c].ff};
        const int64_t W = (int64_t)p.n_head * p.head_dim, S = W + 1;
        float *x = falloc((size_t)(T * S));
        fill_rand(x, (size_t)(T * S), 1.0f);
        float *y[2] = {falloc((size_t)(T * S)), falloc((size_t)(T * S))};
        loom_tensor tp = loom_tensor_2d(LOOM_TYPE_I32, (void *)positions, T, 1, sizeof positions);
        for (int b = 0; b < 2; b++) {
            memcpy(y[b], x, sizeof(float) * (size_t)(T * S));
            loom_tensor ty = t2d(y[b], W, T, S);
            assert_int_equal(g_be[b]->ops->rope(g_be[b]->ctx, &ty, &tp, &p), LOOM_OK);
        }
        double *ref = malloc(sizeof(double) * (size_t)W);
        for (int64_t t = 0; t < T; t++) {
            ref_rope(x + t * S, ref, positions[t], &p);
            assert_true(close_enough(y[0] + t * S, ref, NULL, (size_t)W, 0.0, 2e-6, "rope"));
            /* Elements past n_rot in each head are untouched, bit for bit. */
            for (int h = 0; h < p.n_head; h++)
                assert_true(same_bits(y[0] + t * S + h * p.head_dim + p.n_rot,
                                      x + t * S + h * p.head_dim + p.n_rot,
                                      (size_t)(p.head_dim - p.n_rot), "rope tail"));
            assert_true(same_bits(&y[0][t * S + W], &x[t * S + W], 1, "rope padding"));
        }
        assert_true(same_bits(y[0], y[1], (size_t)(T * S), "rope threads"));
        free(ref);
        free(y[0]);
        free(y[1]);
        free(x);
    }
}

/* Rotates T rows of random values with p at pos on backend b and checks them against the
 * float64 reference. */
static void check_rope_call(loom__backend_stream *be, const loom_rope_params *p, const int32_t *pos,
                            int64_t T) {
    const int64_t W = (int64_t)p->n_head * p->head_dim;
    float *x = falloc((size_t)(T * W)), *y = falloc((size_t)(T * W));
    fill_rand(x, (size_t)(T * W), 1.0f);
    memcpy(y, x, sizeof(float) * (size_t)(T * W));
    loom_tensor tp = loom_tensor_2d(LOOM_TYPE_I32, (void *)pos, T, 1, (size_t)T * sizeof(int32_t));
    loom_tensor ty = t2d(y, W, T, W);
    assert_int_equal(be->ops->rope(be->ctx, &ty, &tp, p), LOOM_OK);
    double *ref = malloc(sizeof(double) * (size_t)W);
    assert_non_null(ref);
    for (int64_t t = 0; t < T; t++) {
        ref_rope(x + t * W, ref, pos[t], p);
        assert_true(close_enough(y + t * W, ref, NULL, (size_t)W, 0.0, 2e-6, "rope table"));
    }
    free(ref);
    free(y);
    free(x);
}

/* The backend keeps the last calls' cos/sin tables; a call must never get a table made for
 * other frequencies or positions: same length but one position changed, the frequency
 * factors changed in place (same address), fewer positions, more keys than it keeps, and a
 * small table of wide heads followed by a long one of narrow heads (its buffers regrown). */
static void test_rope_tables(void **state) {
    (void)state;
    float ff[32];
    for (int i = 0; i < 32; i++) ff[i] = 1.0f + (float)i * 0.5f;
    int32_t pos[40];
    for (int i = 0; i < 40; i++) pos[i] = 3 * i + 1;
    const loom_rope_params A = {LOOM_ROPE_NEOX, 2, 64, 64, 10000.0f, 1.0f, NULL};
    const loom_rope_params B = {LOOM_ROPE_NEOX, 2, 64, 64, 1000000.0f, 1.0f, NULL};
    const loom_rope_params C = {LOOM_ROPE_NORMAL, 2, 64, 64, 10000.0f, 0.25f, NULL};
    const loom_rope_params F = {LOOM_ROPE_NORMAL, 1, 64, 64, 500000.0f, 1.0f, ff};
    const loom_rope_params N = {LOOM_ROPE_NEOX, 3, 4, 2, 10000.0f, 1.0f, NULL};
    for (int b = 0; b < 2; b++) {
        loom__backend_stream *be = g_be[b];
        check_rope_call(be, &A, pos, 16);
        check_rope_call(be, &B, pos, 16);
        check_rope_call(be, &A, pos, 16); /* kept */
        check_rope_call(be, &C, pos, 16); /* a third key */
        check_rope_call(be, &A, pos, 16);
        pos[5] += 1000; /* same length, one position moved */
        check_rope_call(be, &A, pos, 16);
        check_rope_call(be, &A, pos, 7); /* a prefix */
        check_rope_call(be, &F, pos, 16);
        ff[3] *= 2.0f; /* the factors changed where they are */
        check_rope_call(be, &F, pos, 16);
        check_rope_call(be, &A, pos, 1);
        check_rope_call(be, &N, pos, 40); /* 40 positions of one pair after 1 of 32 pairs */
        check_rope_call(be, &B, pos, 40);
        check_rope_call(be, &N, pos, 40);
        pos[5] -= 1000;
    }
}

/* The pair layouts, checked directly: a unit vector e0 at position 1 rotates into element 1
 * (NORMAL: pairs (2i, 2i+1)) or into element n_rot/2 (NEOX: pairs (i, i + n_rot/2)). */
static void test_rope_layout(void **state) {
    (void)state;
    int32_t pos = 1;
    loom_tensor tp = loom_tensor_2d(LOOM_TYPE_I32, &pos, 1, 1, sizeof pos);
    for (int mode = 0; mode < 2; mode++) {
        float x[8] = {1, 0, 0, 0, 0, 0, 0, 0};
        loom_rope_params p = {(loom_rope_mode)mode, 1, 8, 8, 10000.0f, 1.0f, NULL};
        loom_tensor tx = t2d(x, 8, 1, 8);
        assert_int_equal(g_be[0]->ops->rope(g_be[0]->ctx, &tx, &tp, &p), LOOM_OK);
        assert_true(fabsf(x[0] - cosf(1.0f)) < 1e-6f);
        int partner = mode == LOOM_ROPE_NORMAL ? 1 : 4;
        for (int i = 1; i < 8; i++)
            assert_true(fabsf(x[i] - (i == partner ? sinf(1.0f) : 0.0f)) < 1e-6f);
    }
}

static void test_rope_bad(void **state) {
    (void)state;
    loom__backend_stream *be = g_be[0];
    float x[2 * 16];
    int32_t pos[2] = {0, 1};
    fill_rand(x, 32, 1.0f);
    loom_tensor tx = t2d(x, 16, 2, 16);
    loom_tensor tp = loom_tensor_2d(LOOM_TYPE_I32, pos, 2, 1, sizeof pos);
    loom_rope_params p = {LOOM_ROPE_NEOX, 2, 8, 8, 10000.0f, 1.0f, NULL};
    assert_int_equal(be->ops->rope(be->ctx, &tx, &tp, &p), LOOM_OK);
    loom_rope_params bad = p;
    bad.n_rot = 7; /* odd */
    assert_int_equal(be->ops->rope(be->ctx, &tx, &tp, &bad), LOOM_ERR_INVALID_ARG);
    bad.n_rot = 10; /* > head_dim */
    assert_int_equal(be->ops->rope(be->ctx, &tx, &tp, &bad), LOOM_ERR_INVALID_ARG);
    bad = p;
    bad.n_head = 3; /* 3*8 != 16 */
    assert_int_equal(be->ops->rope(be->ctx, &tx, &tp, &bad), LOOM_ERR_INVALID_ARG);
    bad = p;
    bad.mode = (loom_rope_mode)7;
    assert_int_equal(be->ops->rope(be->ctx, &tx, &tp, &bad), LOOM_ERR_INVALID_ARG);
    bad = p;
    bad.theta_base = 0.0f;
    assert_int_equal(be->ops->rope(be->ctx, &tx, &tp, &bad), LOOM_ERR_INVALID_ARG);
    float zero_ff[4] = {1, 1, 0, 1};
    bad = p;
    bad.freq_factors = zero_ff;
    assert_int_equal(be->ops->rope(be->ctx, &tx, &tp, &bad), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->rope(be->ctx, &tx, &tp, NULL), LOOM_ERR_INVALID_ARG);
    loom_tensor tp1 = tp;
    tp1.ne[0] = 1; /* one position for two rows */
    assert_int_equal(be->ops->rope(be->ctx, &tx, &tp1, &p), LOOM_ERR_INVALID_ARG);
    tp1 = tp;
    tp1.type = LOOM_TYPE_I64;
    assert_int_equal(be->ops->rope(be->ctx, &tx, &tp1, &p), LOOM_ERR_UNSUPPORTED);
}

/* ------------------------------------------------------------------------------------------ */
/* glu                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static double ref_act(loom_glu_kind kind, double g) {
    if (kind == LOOM_GLU_SWIGLU) return g / (1.0 + exp(-g));
    return 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
}

static void test_glu(void **state) {
    (void)state;
    const struct { int64_t R, F; } shapes[] = {{3, 97}, {1, 14336}, {17, 54}, {5, 3000}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t R = shapes[si].R, F = shapes[si].F, n = R * F;
        float *g = falloc((size_t)n), *u = falloc((size_t)n);
        fill_rand(g, (size_t)n, 6.0f);
        fill_rand(u, (size_t)n, 1.0f);
        g[0] = -100.0f; /* exp overflow region */
        if (n > 1) g[1] = 100.0f;
        double *ref = malloc(sizeof(double) * (size_t)n);
        for (int kind = 0; kind < 2; kind++) {
            float *out[2] = {falloc((size_t)n), falloc((size_t)n)};
            loom_tensor tg = t2d(g, F, R, F), tu = t2d(u, F, R, F);
            for (int b = 0; b < 2; b++) {
                poison(out[b], (size_t)n);
                loom_tensor to = t2d(out[b], F, R, F);
                assert_int_equal(
                    g_be[b]->ops->glu(g_be[b]->ctx, &tg, &tu, (loom_glu_kind)kind, &to), LOOM_OK);
            }
            for (int64_t i = 0; i < n; i++) ref[i] = ref_act((loom_glu_kind)kind, g[i]) * u[i];
            assert_true(close_enough(out[0], ref, NULL, (size_t)n, 1e-5, 1e-6, "glu"));
            assert_true(same_bits(out[0], out[1], (size_t)n, "glu threads"));
            free(out[0]);
            free(out[1]);
        }
        free(ref);
        free(g);
        free(u);
    }
    /* Bad input. */
    float a[6], b[6], o[6];
    fill_rand(a, 6, 1.0f);
    fill_rand(b, 6, 1.0f);
    loom_tensor ta = t2d(a, 3, 2, 3), tb = t2d(b, 3, 2, 3), to = t2d(o, 3, 2, 3);
    loom_tensor tb1 = t2d(b, 2, 3, 2);
    assert_int_equal(g_be[0]->ops->glu(g_be[0]->ctx, &ta, &tb1, LOOM_GLU_SWIGLU, &to),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(g_be[0]->ops->glu(g_be[0]->ctx, &ta, &tb, (loom_glu_kind)9, &to),
                     LOOM_ERR_INVALID_ARG);
}

/* ------------------------------------------------------------------------------------------ */
/* exp and tanh (cpu_vmath.h), and glu's bits                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Largest errors over all 2^32 inputs, measured when the code was written: exp 1.014 ulp (x =
 * 37.78), tanh 1.332 ulp (|x| = 0.631, just above the polynomial's range). The bounds leave a
 * little room; the sweep here reaches exp 0.96, tanh 1.32. */
#define VM_EXP_MAX_ULP  1.5
#define VM_TANH_MAX_ULP 2.0

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* |got - ref| in units of the float ulp at ref (subnormal spacing below FLT_MIN). +-inf counts
 * as +-2^128, the next step past FLT_MAX, and so does any ref beyond it, so an overflow is
 * judged like any other rounding. */
static double ulp_err(float got, double ref) {
    double g = isinf(got) ? copysign(0x1p128, (double)got) : (double)got;
    if (fabs(ref) > 0x1p128) ref = copysign(0x1p128, ref);
    int e = ref == 0.0 ? -126 : ilogb(ref);
    e = e < -126 ? -126 : e > 127 ? 127 : e;
    return fabs(g - ref) / ldexp(1.0, e - 23);
}

typedef struct vm_worst {
    double exp_ulp, tanh_ulp;
    float exp_at, tanh_at;
} vm_worst;

static void vm_check_one(float x, vm_worst *w) {
    if (isnan(x)) return;
    double e = ulp_err(loom__vm_expf(x), exp((double)x));
    double t = ulp_err(loom__vm_tanhf(x), tanh((double)x));
    if (!(e <= w->exp_ulp)) w->exp_ulp = e, w->exp_at = x; /* NaN err is kept: it fails */
    if (!(t <= w->tanh_ulp)) w->tanh_ulp = t, w->tanh_at = x;
}

/* n consecutive floats either side of c (same sign as c). */
static void vm_check_window(float c, uint32_t n, vm_worst *w) {
    uint32_t u;
    memcpy(&u, &c, sizeof u);
    for (uint32_t i = 0; i < 2 * n; i++) vm_check_one(from_bits(u - n + i), w);
}

static void test_vmath_accuracy(void **state) {
    (void)state;
    vm_worst w = {0};
    /* every 509th bit pattern: 8.4M inputs of both signs, all binades */
    for (uint64_t u = 0; u <= UINT32_MAX; u += 509) vm_check_one(from_bits((uint32_t)u), &w);
    /* every float where the code changes regime: tanh's polynomial / exp boundary, exp's
     * overflow, its first subnormal results and its underflow to 0, tanh's saturation, and
     * inputs so small that exp is 1 and tanh is x */
    const float centers[] = {0.625f, -0.625f,  88.72f,    -87.34f,  -103.97f, 9.01f,
                             -9.01f, 0x1p-24f, -0x1p-24f, 0x1p-12f, 0.3466f,  -0.3466f};
    for (size_t i = 0; i < sizeof centers / sizeof centers[0]; i++)
        vm_check_window(centers[i], 1u << 16, &w);
    printf("exp max %.3f ulp at %a, tanh max %.3f ulp at %a\n", w.exp_ulp, (double)w.exp_at,
           w.tanh_ulp, (double)w.tanh_at);
    assert_true(w.exp_ulp <= VM_EXP_MAX_ULP);
    assert_true(w.tanh_ulp <= VM_TANH_MAX_ULP);

    /* Special values, exactly. */
    assert_true(isnan(loom__vm_expf(NAN)) && isnan(loom__vm_tanhf(NAN)));
    assert_true(isnan(loom__vm_expf(-NAN)) && isnan(loom__vm_tanhf(-NAN)));
    assert_true(loom__vm_expf(INFINITY) == INFINITY && loom__vm_expf(-INFINITY) == 0.0f);
    assert_true(loom__vm_expf(89.0f) == INFINITY && loom__vm_expf(-104.0f) == 0.0f);
    assert_true(loom__vm_expf(0.0f) == 1.0f && loom__vm_expf(-0.0f) == 1.0f);
    assert_true(loom__vm_expf(-100.0f) > 0.0f); /* subnormal, not flushed */
    assert_true(loom__vm_tanhf(INFINITY) == 1.0f && loom__vm_tanhf(-INFINITY) == -1.0f);
    assert_true(loom__vm_tanhf(20.0f) == 1.0f && loom__vm_tanhf(-1e30f) == -1.0f);
    assert_true(loom__vm_tanhf(0.0f) == 0.0f && !signbit(loom__vm_tanhf(0.0f)));
    assert_true(loom__vm_tanhf(-0.0f) == 0.0f && signbit(loom__vm_tanhf(-0.0f)));
    assert_true(loom__vm_tanhf(0x1p-149f) == 0x1p-149f);
}

/* Gate values covering every binade of both signs, the special values, and a few of each
 * magnitude around where exp and tanh change regime. */
static int64_t fill_gate_sweep(float *g, float *u, int64_t cap) {
    int64_t n = 0;
    for (uint64_t b = 0; b <= UINT32_MAX && n < cap; b += 65521) g[n++] = from_bits((uint32_t)b);
    const float sp[] = {NAN,       -NAN,       INFINITY,        -INFINITY,        0.0f,   -0.0f,
                        0x1p-149f, -0x1p-149f, 0x1.fffffep127f, -0x1.fffffep127f, 0.625f, -0.625f,
                        88.72f,    -88.72f,    -103.97f,        103.97f,          1e-20f, -1e-20f,
                        5.0f,      -5.0f};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0] && n < cap; i++) g[n++] = sp[i];
    for (int64_t i = 0; i < n; i++) u[i] = i % 5 == 0 ? 1.0f : rng_f() * 2.0f;
    return n;
}

/* An element is its scalar value whatever computed it (NaN: any NaN). */
static int same_or_both_nan(float got, float want) {
    return (isnan(got) && isnan(want)) || memcmp(&got, &want, sizeof got) == 0;
}

static void test_glu_matches_scalar(void **state) {
    (void)state;
    const int64_t cap = 66000;
    float *g = falloc((size_t)cap), *u = falloc((size_t)cap), *o = falloc((size_t)cap);
    const int64_t n = fill_gate_sweep(g, u, cap);
    loom_tensor tg = t2d(g, n, 1, n), tu = t2d(u, n, 1, n), to = t2d(o, n, 1, n);
    for (int kind = 0; kind < 2; kind++)
        for (int b = 0; b < 2; b++) {
            poison(o, (size_t)n);
            assert_int_equal(g_be[b]->ops->glu(g_be[b]->ctx, &tg, &tu, (loom_glu_kind)kind, &to),
                             LOOM_OK);
            for (int64_t i = 0; i < n; i++) {
                float a = kind == LOOM_GLU_SWIGLU ? loom__vm_silu(g[i]) : loom__vm_gelu_tanh(g[i]);
                float want = a * u[i];
                if (!same_or_both_nan(o[i], want))
                    fail_msg("glu kind %d, g = %a: got %a, scalar %a", kind, (double)g[i],
                             (double)o[i], (double)want);
            }
        }
    free(g);
    free(u);
    free(o);
}

/* A row computed in pieces of odd lengths (1, 3, 5, ...: every alignment against the vector
 * width) equals the row computed whole, bit for bit; so does an in-place run. */
static void test_glu_pieces(void **state) {
    (void)state;
    const int64_t n = 1000;
    float *g = falloc((size_t)n), *u = falloc((size_t)n);
    float *whole = falloc((size_t)n), *parts = falloc((size_t)n);
    fill_rand(g, (size_t)n, 8.0f);
    fill_rand(u, (size_t)n, 1.0f);
    g[3] = NAN, g[10] = 1e30f, g[11] = -1e30f, g[500] = -0.0f, g[999] = 100.0f;
    for (int kind = 0; kind < 2; kind++) {
        loom_tensor tg = t2d(g, n, 1, n), tu = t2d(u, n, 1, n), tw = t2d(whole, n, 1, n);
        poison(whole, (size_t)n);
        assert_int_equal(g_be[0]->ops->glu(g_be[0]->ctx, &tg, &tu, (loom_glu_kind)kind, &tw),
                         LOOM_OK);
        poison(parts, (size_t)n);
        for (int64_t c = 0, len = 1; c < n; c += len, len += 2) {
            int64_t m = c + len <= n ? len : n - c;
            loom_tensor pg = t2d(g + c, m, 1, m), pu = t2d(u + c, m, 1, m);
            loom_tensor po = t2d(parts + c, m, 1, m);
            assert_int_equal(g_be[0]->ops->glu(g_be[0]->ctx, &pg, &pu, (loom_glu_kind)kind, &po),
                             LOOM_OK);
        }
        assert_true(same_bits(whole, parts, (size_t)n, "glu pieces"));
        memcpy(parts, g, sizeof(float) * (size_t)n);
        loom_tensor tp = t2d(parts, n, 1, n);
        assert_int_equal(g_be[1]->ops->glu(g_be[1]->ctx, &tp, &tu, (loom_glu_kind)kind, &tp),
                         LOOM_OK);
        assert_true(same_bits(whole, parts, (size_t)n, "glu in place"));
    }
    free(g);
    free(u);
    free(whole);
    free(parts);
}

/* ------------------------------------------------------------------------------------------ */
/* add, scale                                                                                 */
/* ------------------------------------------------------------------------------------------ */

static void test_add_scale(void **state) {
    (void)state;
    const struct { int64_t R, C; } shapes[] = {{1, 1}, {3, 97}, {17, 54}, {4, 5000}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t R = shapes[si].R, C = shapes[si].C, S = C + 3, n = R * S;
        float *a = falloc((size_t)n), *b = falloc((size_t)n),
              *o[2] = {falloc((size_t)n), falloc((size_t)n)};
        fill_rand(a, (size_t)n, 1.0f);
        fill_rand(b, (size_t)n, 1.0f);
        for (int bcast = 0; bcast < 2; bcast++) {
            loom_tensor ta = t2d(a, C, R, S), tb = t2d(b, C, bcast ? 1 : R, S);
            for (int k = 0; k < 2; k++) {
                poison(o[k], (size_t)n);
                loom_tensor to = t2d(o[k], C, R, S);
                assert_int_equal(g_be[k]->ops->add(g_be[k]->ctx, &ta, &tb, &to), LOOM_OK);
            }
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++) {
                    float want = a[r * S + c] + b[(bcast ? 0 : r) * S + c];
                    assert_true(same_bits(&o[0][r * S + c], &want, 1, "add"));
                    assert_true(same_bits(&o[1][r * S + c], &want, 1, "add threads"));
                }
        }
        /* scale, then both ops in place. */
        for (int k = 0; k < 2; k++) {
            poison(o[k], (size_t)n);
            loom_tensor ta = t2d(a, C, R, S), to = t2d(o[k], C, R, S);
            assert_int_equal(g_be[k]->ops->scale(g_be[k]->ctx, &ta, 0.37f, &to), LOOM_OK);
        }
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                float want = a[r * S + c] * 0.37f;
                assert_true(same_bits(&o[0][r * S + c], &want, 1, "scale"));
                assert_true(same_bits(&o[1][r * S + c], &want, 1, "scale threads"));
            }
        memcpy(o[0], a, sizeof(float) * (size_t)n);
        loom_tensor tio = t2d(o[0], C, R, S), tb = t2d(b, C, R, S);
        assert_int_equal(g_be[1]->ops->add(g_be[1]->ctx, &tio, &tb, &tio), LOOM_OK);
        assert_int_equal(g_be[1]->ops->scale(g_be[1]->ctx, &tio, -2.0f, &tio), LOOM_OK);
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                float want = (a[r * S + c] + b[r * S + c]) * -2.0f;
                assert_true(same_bits(&o[0][r * S + c], &want, 1, "add+scale in place"));
            }
        free(a);
        free(b);
        free(o[0]);
        free(o[1]);
    }
    /* Bad input: b neither a's shape nor one row; width mismatch; out shape. */
    float a[12], b[12], o[12];
    fill_rand(a, 12, 1.0f);
    fill_rand(b, 12, 1.0f);
    loom_tensor ta = t2d(a, 4, 3, 4), to = t2d(o, 4, 3, 4);
    loom_tensor b2 = t2d(b, 4, 2, 4), bw = t2d(b, 3, 3, 3), o2 = t2d(o, 4, 2, 4);
    assert_int_equal(g_be[0]->ops->add(g_be[0]->ctx, &ta, &b2, &to), LOOM_ERR_INVALID_ARG);
    assert_int_equal(g_be[0]->ops->add(g_be[0]->ctx, &ta, &bw, &to), LOOM_ERR_INVALID_ARG);
    assert_int_equal(g_be[0]->ops->add(g_be[0]->ctx, &ta, &ta, &o2), LOOM_ERR_INVALID_ARG);
    assert_int_equal(g_be[0]->ops->scale(g_be[0]->ctx, &ta, 2.0f, &o2), LOOM_ERR_INVALID_ARG);
    loom_tensor ti = ta;
    ti.type = LOOM_TYPE_I32;
    assert_int_equal(g_be[0]->ops->scale(g_be[0]->ctx, &ti, 2.0f, &to), LOOM_ERR_UNSUPPORTED);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rms_norm),
        cmocka_unit_test(test_rms_norm_bad),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_tables),
        cmocka_unit_test(test_rope_layout),
        cmocka_unit_test(test_rope_bad),
        cmocka_unit_test(test_glu),
        cmocka_unit_test(test_vmath_accuracy),
        cmocka_unit_test(test_glu_matches_scalar),
        cmocka_unit_test(test_glu_pieces),
        cmocka_unit_test(test_add_scale),
    };
    return cmocka_run_group_tests(tests, cpu_group_setup, cpu_group_teardown);
}
