/* test_cpu_qmatmul.c — integer-activation dot products (tensor/qdot.h): the kernels the CPU
 * matmul uses (f32_activations = false; the matmul itself: test_cpu_matmul.c).
 *
 *   - loom__vec_dot_type maps every weight type to llama.cpp's activation format.
 *   - The activation quantizers against an independent reference written here (llama.cpp's x86
 *     arithmetic: q8_0/q8_1 codes rint(x * (127 / amax)), q8_K codes rint(x * (-127 / max)),
 *     ties to even), bitwise; q8_0 against loom__quantize_row where the two rounding rules
 *     coincide (no ties, 127 / amax == 1 / (amax / 127)); non-finite input gives defined codes.
 *   - loom__vec_dot_q for every weight type against a double-precision dot of the dequantized
 *     weight row with the dequantized activation row: |err| <= 1e-5 * sum |w x| + 1e-30 (the
 *     kernel's integer block sums are exact; what remains is float32 rounding of the per-block
 *     scale products and of the running sum). For q4_1 / q5_1 the reference uses the block's
 *     stored s (an f16 of d * sum(codes)) for the offset term, as the format defines.
 *   - The SIMD path against the portable path: bitwise, every type, every block count from 1
 *     to 17 (partial SIMD groups), and for the quantizers, including NaN and infinities; the
 *     q8_K quantizer of every variant also on blocks made to probe its rules (ties of |max|
 *     with either sign first, zero / NaN / subnormal / huge blocks, rounding ties).
 *   - Bad input gives a status. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "tensor/fp16.h"
#include "tensor/qdot.h"
#include "tensor/qdot_internal.h"
#include "tensor/qgemm.h"
#include "tensor/quant.h"
#include "tensor/quant_layouts.h"

#include "backend/qweight_util.h"

/* ------------------------------------------------------------------------------------------ */
/* Independent references of the activation formats                                           */
/* ------------------------------------------------------------------------------------------ */

/* Nearest integer, ties to even (the default rounding mode), for finite v. */
static int ref_rint(float v) {
    return (int)rintf(v);
}

static void ref_q8_0(const float *x, loom__block_q8_0 *y, int64_t n, bool with_s,
                     loom__block_q8_1 *y1) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int8_t qs[32];
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            qs[j] = (int8_t)ref_rint(xb[j] * id);
            sum += qs[j];
        }
        if (with_s) {
            y1[b].d = loom__f32_to_f16(d);
            y1[b].s = loom__f32_to_f16((float)sum * d);
            memcpy(y1[b].qs, qs, 32);
        } else {
            y[b].d = loom__f32_to_f16(d);
            memcpy(y[b].qs, qs, 32);
        }
    }
}

static void ref_q8_K(const float *x, loom__block_q8_K *y, int64_t n) {
    for (int64_t b = 0; b < n / 256; b++) {
        const float *xb = x + 256 * b;
        int imax = 0;
        for (int j = 1; j < 256; j++)
            if (fabsf(xb[j]) > fabsf(xb[imax])) imax = j;
        memset(&y[b], 0, sizeof y[b]);
        if (xb[imax] == 0.0f) continue;
        const float iscale = -127.0f / xb[imax];
        for (int j = 0; j < 256; j++) {
            int q = ref_rint(iscale * xb[j]);
            y[b].qs[j] = (int8_t)(q > 127 ? 127 : q);
            y[b].bsums[j / 16] = (int16_t)(y[b].bsums[j / 16] + y[b].qs[j]);
        }
        y[b].d = 1.0f / iscale;
    }
}

/* The activation row dequantized (q8_1: codes times d; its s is read separately). */
static void dequant_act(uint32_t at, const void *xa, double *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        switch (at) {
        case LOOM_TYPE_Q8_0: {
            const loom__block_q8_0 *b = (const loom__block_q8_0 *)xa + i / 32;
            out[i] = (double)loom__f16_to_f32(b->d) * b->qs[i % 32];
            break;
        }
        case LOOM_TYPE_Q8_1: {
            const loom__block_q8_1 *b = (const loom__block_q8_1 *)xa + i / 32;
            out[i] = (double)loom__f16_to_f32(b->d) * b->qs[i % 32];
            break;
        }
        case LOOM_TYPE_Q8_K: {
            const loom__block_q8_K *b = (const loom__block_q8_K *)xa + i / 256;
            out[i] = (double)b->d * b->qs[i % 256];
            break;
        }
        case LOOM_TYPE_F16:
            out[i] = loom__f16_to_f32(((const uint16_t *)xa)[i]);
            break;
        case LOOM_TYPE_BF16:
            out[i] = loom__bf16_to_f32(((const uint16_t *)xa)[i]);
            break;
        default:
            fail_msg("no activation dequantizer for %s", loom__type_name(at));
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* loom__vec_dot_type                                                                          */
/* ------------------------------------------------------------------------------------------ */

static void test_vec_dot_type(void **state) {
    (void)state;
    static const uint32_t want[][2] = {
        {LOOM_TYPE_Q4_0, LOOM_TYPE_Q8_0}, {LOOM_TYPE_Q4_1, LOOM_TYPE_Q8_1},
        {LOOM_TYPE_Q5_0, LOOM_TYPE_Q8_0}, {LOOM_TYPE_Q5_1, LOOM_TYPE_Q8_1},
        {LOOM_TYPE_Q8_0, LOOM_TYPE_Q8_0}, {LOOM_TYPE_Q2_K, LOOM_TYPE_Q8_K},
        {LOOM_TYPE_Q3_K, LOOM_TYPE_Q8_K}, {LOOM_TYPE_Q4_K, LOOM_TYPE_Q8_K},
        {LOOM_TYPE_Q5_K, LOOM_TYPE_Q8_K}, {LOOM_TYPE_Q6_K, LOOM_TYPE_Q8_K},
        {LOOM_TYPE_F16, LOOM_TYPE_F16},   {LOOM_TYPE_BF16, LOOM_TYPE_BF16},
        {LOOM_TYPE_F32, LOOM_TYPE_F32}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        uint32_t at = 999;
        assert_true(loom__vec_dot_type(want[i][0], &at));
        assert_int_equal(at, want[i][1]);
        assert_non_null(loom__vec_dot_q_get(want[i][0]));
        assert_non_null(loom__quantize_activations_get(at));
    }
    uint32_t at;
    assert_false(loom__vec_dot_type(LOOM_TYPE_Q8_K, &at)); /* activation formats are not weights */
    assert_false(loom__vec_dot_type(LOOM_TYPE_Q8_1, &at));
    assert_false(loom__vec_dot_type(LOOM_TYPE_I32, &at));
    assert_false(loom__vec_dot_type(17, &at)); /* iq2_xs: unknown to loom */
    assert_false(loom__vec_dot_type(12345, &at));
    assert_false(loom__vec_dot_type(LOOM_TYPE_Q4_0, NULL));
    assert_null(loom__vec_dot_q_get(LOOM_TYPE_I8));
    assert_null(loom__quantize_activations_get(LOOM_TYPE_Q4_0));
    printf("qdot SIMD path: %s\n", loom__qdot_simd_name());
}

/* ------------------------------------------------------------------------------------------ */
/* Activation quantizers                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* A row with awkward blocks: ties (amax 127, values k + 0.5), an all-zero block, a negative
 * extreme, a lone nonzero, subnormal and huge values, and ordinary random blocks. */
static void fill_quant_cases(float *x, int64_t n) {
    fill_acts(x, n, 3.0f);
    for (int64_t i = 0; i < n; i++) {
        int64_t blk = i / 256, j = i % 256;
        switch (blk % 6) {
        case 0: /* ties for q8_0 (amax 127 -> id 1) and q8_K (max -127 -> iscale 1) */
            x[i] = j % 32 == 0 ? -127.0f : (float)((int)(rng_u64() % 200) - 100) + 0.5f;
            break;
        case 1:
            if (j < 64) x[i] = 0.0f;
            break;
        case 2:
            if (j == 77) x[i] = -1e4f;
            break;
        case 3:
            x[i] = j == 5 ? 1e-3f : 0.0f;
            break;
        case 4:
            x[i] *= j % 2 ? 1e-39f : 1e30f;
            break;
        default:
            break;
        }
    }
}

static void test_quantizers_reference(void **state) {
    (void)state;
    const int64_t n = 256 * 12;
    float *x = xmalloc((size_t)n * sizeof(float));
    fill_quant_cases(x, n);
    size_t cap = (size_t)n * sizeof(float) + row_bytes(LOOM_TYPE_Q8_K, n);
    uint8_t *got = xmalloc(cap), *want = xmalloc(cap), *port = xmalloc(cap);

    /* q8_0 */
    size_t nb = row_bytes(LOOM_TYPE_Q8_0, n);
    assert_true(loom__quantize_activations(LOOM_TYPE_Q8_0, x, got, n));
    ref_q8_0(x, (loom__block_q8_0 *)want, n, false, NULL);
    assert_memory_equal(got, want, nb);
    assert_true(loom__quantize_activations_portable(LOOM_TYPE_Q8_0, x, port, n));
    assert_memory_equal(got, port, nb);
    /* q8_1 */
    nb = row_bytes(LOOM_TYPE_Q8_1, n);
    assert_true(loom__quantize_activations(LOOM_TYPE_Q8_1, x, got, n));
    ref_q8_0(x, NULL, n, true, (loom__block_q8_1 *)want);
    assert_memory_equal(got, want, nb);
    assert_true(loom__quantize_activations_portable(LOOM_TYPE_Q8_1, x, port, n));
    assert_memory_equal(got, port, nb);
    /* q8_K */
    nb = row_bytes(LOOM_TYPE_Q8_K, n);
    assert_true(loom__quantize_activations(LOOM_TYPE_Q8_K, x, got, n));
    ref_q8_K(x, (loom__block_q8_K *)want, n);
    assert_memory_equal(got, want, nb);
    assert_true(loom__quantize_activations_portable(LOOM_TYPE_Q8_K, x, port, n));
    assert_memory_equal(got, port, nb);
    /* f16, bf16, f32: element conversions */
    assert_true(loom__quantize_activations(LOOM_TYPE_F16, x, got, n));
    for (int64_t i = 0; i < n; i++) assert_int_equal(((uint16_t *)got)[i], loom__f32_to_f16(x[i]));
    assert_true(loom__quantize_activations(LOOM_TYPE_BF16, x, got, n));
    for (int64_t i = 0; i < n; i++) assert_int_equal(((uint16_t *)got)[i], loom__f32_to_bf16(x[i]));
    assert_true(loom__quantize_activations(LOOM_TYPE_F32, x, got, n));
    assert_memory_equal(got, x, (size_t)n * sizeof(float));

    /* Ties go to even: block 0 has amax 127, so id = 1 and x = k + 0.5 rounds to even k. */
    const loom__block_q8_0 *b0 = NULL;
    assert_true(loom__quantize_activations(LOOM_TYPE_Q8_0, x, got, n));
    b0 = (const loom__block_q8_0 *)got;
    for (int j = 0; j < 32; j++) {
        float v = x[j];
        int q = b0->qs[j];
        if (v != floorf(v)) assert_int_equal(q % 2, 0);
        assert_true(fabsf((float)q - v) <= 0.5f);
    }

    /* Bad input. */
    assert_false(loom__quantize_activations(LOOM_TYPE_Q8_0, x, got, 31));
    assert_false(loom__quantize_activations(LOOM_TYPE_Q8_K, x, got, 128));
    assert_false(loom__quantize_activations(LOOM_TYPE_Q4_0, x, got, 32));
    assert_false(loom__quantize_activations(LOOM_TYPE_Q8_0, NULL, got, 32));
    assert_false(loom__quantize_activations(LOOM_TYPE_Q8_0, x, got, -32));
    assert_true(loom__quantize_activations(LOOM_TYPE_Q8_0, NULL, NULL, 0));
    free(x);
    free(got);
    free(want);
    free(port);
}

/* Where the rules coincide (no ties, 127 / amax == 1 / (amax / 127)), q8_0 activations equal
 * loom__quantize_row's q8_0 (the gguf package's rounding: id = 1 / d, ties away from zero). */
static void test_quantizer_vs_quantize_row(void **state) {
    (void)state;
    const int64_t n = 32 * 64;
    float *x = xmalloc((size_t)n * sizeof(float));
    size_t nb = row_bytes(LOOM_TYPE_Q8_0, n);
    loom__block_q8_0 *a = xmalloc(nb), *r = xmalloc(nb);
    int compared = 0, tie_blocks = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        /* amax a power of two times 127: both inverses are exact powers of two. */
        float scale = ldexpf(127.0f, (int)(b % 9) - 4);
        for (int j = 0; j < 32; j++) x[32 * b + j] = rng_f() * scale;
        x[32 * b + (b % 32)] = b % 2 ? scale : -scale;
    }
    assert_true(loom__quantize_activations(LOOM_TYPE_Q8_0, x, a, n));
    assert_true(loom__quantize_row(LOOM_TYPE_Q8_0, x, r, n));
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
        bool tie = false;
        for (int j = 0; j < 32; j++) {
            float v = x[32 * b + j] * (127.0f / amax);
            tie |= v - floorf(v) == 0.5f;
        }
        if (tie || 127.0f / amax != 1.0f / (amax / 127.0f)) {
            tie_blocks++;
            continue;
        }
        assert_memory_equal(&a[b], &r[b], sizeof a[b]);
        compared++;
    }
    assert_true(compared > 50);
    (void)tie_blocks;

    /* Non-finite input: a defined, identical result in both paths (NaN codes 0, no UB). */
    const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, -3.0f, 1e-45f};
    for (int64_t i = 0; i < n; i++) x[i] = specials[rng_u64() % 8];
    for (int64_t i = 0; i < 256; i++) x[i] = i == 3 ? NAN : 1.0f; /* NaN among finite values */
    size_t kb = row_bytes(LOOM_TYPE_Q8_K, n) + nb;
    uint8_t *g1 = xmalloc(kb), *g2 = xmalloc(kb);
    const uint32_t ats[] = {LOOM_TYPE_Q8_0, LOOM_TYPE_Q8_1, LOOM_TYPE_Q8_K, LOOM_TYPE_F16,
                            LOOM_TYPE_BF16};
    for (size_t i = 0; i < 5; i++) {
        memset(g1, 0x5a, kb);
        memset(g2, 0x5a, kb);
        assert_true(loom__quantize_activations(ats[i], x, g1, n));
        assert_true(loom__quantize_activations_portable(ats[i], x, g2, n));
        assert_memory_equal(g1, g2, row_bytes(ats[i], n));
    }
    assert_true(loom__quantize_activations(LOOM_TYPE_Q8_0, x, g1, n));
    assert_int_equal(((loom__block_q8_0 *)g1)[0].qs[3], 0);
    assert_int_equal(((loom__block_q8_0 *)g1)[0].qs[4], 127);
    free(x);
    free(a);
    free(r);
    free(g1);
    free(g2);
}

/* ------------------------------------------------------------------------------------------ */
/* Dot products                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* Reference of one dot: double sums of dequantized weights times dequantized activations; for
 * q4_1 / q5_1 the offset term m * sum(x) uses the stored s. Also returns sum |w x|. */
static double ref_dot(uint32_t t, const uint8_t *w, const void *xa, int64_t K, double *mag) {
    uint32_t at;
    assert_true(loom__vec_dot_type(t, &at));
    float *wf = xmalloc((size_t)K * sizeof(float));
    double *xf = xmalloc((size_t)K * sizeof(double));
    assert_true(loom__dequantize_row(t, w, wf, K));
    dequant_act(at, xa, xf, K);
    double s = 0.0, m = 0.0;
    for (int64_t k = 0; k < K; k++) {
        s += (double)wf[k] * xf[k];
        m += fabs((double)wf[k] * xf[k]);
    }
    if (at == LOOM_TYPE_Q8_1) {
        size_t wb = loom__type_get_traits(t)->block_bytes;
        const loom__block_q8_1 *xb = xa;
        for (int64_t b = 0; b < K / 32; b++) {
            uint16_t mh;
            memcpy(&mh, w + (size_t)b * wb + 2, sizeof mh); /* m follows d in q4_1 / q5_1 */
            double mw = loom__f16_to_f32(mh), sum_x = 0.0;
            for (int j = 0; j < 32; j++) sum_x += xf[32 * b + j];
            s += mw * ((double)loom__f16_to_f32(xb[b].s) - sum_x);
            m += fabs(mw * loom__f16_to_f32(xb[b].s));
        }
    }
    free(wf);
    free(xf);
    *mag = m;
    return s;
}

static void test_vec_dot_vs_reference(void **state) {
    (void)state;
    const int64_t Ks[] = {256, 512, 2304};
    const float scales[] = {1.0f, 2.5e4f, 1e-3f};
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        uint32_t t = weight_types[ti], at;
        assert_true(loom__vec_dot_type(t, &at));
        for (size_t ki = 0; ki < 3; ki++) {
            const int64_t K = Ks[ki];
            uint8_t *w = xmalloc(row_bytes(t, K));
            uint8_t *xa = xmalloc(row_bytes(at, K));
            float *x = xmalloc((size_t)K * sizeof(float));
            for (int rep = 0; rep < 6; rep++) {
                make_weight_row(t, K, w);
                /* f16 activations overflow past 65504, and q8_1's s = f16(d * sum(codes)) past
                 * |sum x| ~ 65504 per block, as in llama.cpp: keep inputs below that. */
                float sc = scales[rep % 3];
                if (at == LOOM_TYPE_Q8_1 && sc > 10.0f) sc = 10.0f;
                if (at == LOOM_TYPE_F16 && sc > 300.0f) sc = 300.0f;
                fill_acts(x, K, sc);
                assert_true(loom__quantize_activations(at, x, xa, K));
                double mag, want = ref_dot(t, w, xa, K, &mag);
                float got = loom__vec_dot_q(t, w, xa, K);
                double err = fabs((double)got - want);
                if (!(err <= 1e-5 * mag + 1e-30))
                    fail_msg("%s K=%lld: got %.9g want %.9g (err %.3g, sum|wx| %.3g)",
                             loom__type_name(t), (long long)K, (double)got, want, err, mag);
            }
            free(w);
            free(xa);
            free(x);
        }
    }
    /* Bad arguments give NaN. */
    uint8_t buf[1024] = {0};
    assert_true(isnan(loom__vec_dot_q(LOOM_TYPE_Q4_0, buf, buf, 31)));
    assert_true(isnan(loom__vec_dot_q(LOOM_TYPE_Q4_K, buf, buf, 32)));
    assert_true(isnan(loom__vec_dot_q(LOOM_TYPE_Q8_K, buf, buf, 256)));
    assert_true(isnan(loom__vec_dot_q(LOOM_TYPE_Q8_0, NULL, buf, 32)));
    assert_true(isnan(loom__vec_dot_q(LOOM_TYPE_Q8_0, buf, buf, -32)));
    assert_true(loom__vec_dot_q(LOOM_TYPE_Q8_0, NULL, NULL, 0) == 0.0f);
}

static void test_simd_vs_portable(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        uint32_t t = weight_types[ti], at;
        assert_true(loom__vec_dot_type(t, &at));
        const int64_t be = loom__type_get_traits(t)->block_elems;
        const int64_t unit = be == 1 ? 1 : be;
        /* block counts 1..17 (float types: lengths 1..17 and multiples of 32 plus a tail) */
        for (int64_t nblk = 1; nblk <= 17; nblk++) {
            const int64_t K = be == 1 ? nblk * 37 : nblk * unit;
            uint8_t *w = xmalloc(row_bytes(t, K));
            uint8_t *xa = xmalloc(row_bytes(at, K));
            float *x = xmalloc((size_t)K * sizeof(float));
            for (int rep = 0; rep < 3; rep++) {
                make_weight_row(t, K, w);
                fill_acts(x, K, rep == 2 ? 3e4f : 1.0f);
                assert_true(loom__quantize_activations(at, x, xa, K));
                float a = loom__vec_dot_q(t, w, xa, K);
                float b = loom__vec_dot_q_portable(t, w, xa, K);
                if (memcmp(&a, &b, sizeof a) != 0)
                    fail_msg("%s K=%lld: simd %.9g portable %.9g", loom__type_name(t), (long long)K,
                             (double)a, (double)b);
            }
            free(w);
            free(xa);
            free(x);
        }
    }
}

/* Every instruction-set variant this CPU runs (the process uses one; LOOM_CPU_ISA picks
 * another) gives the portable kernels' bits: its quantizers, its one-row dots, and its tile and
 * token-lane kernels (qgemm.h), on 1..17 blocks and 1..19 tokens. */
static void test_isa_variants_agree(void **state) {
    (void)state;
    const loom__qdot_isa *isas[4];
    const int n_isa = loom__qdot_isa_list(isas);
    const loom__qdot_isa *port = isas[n_isa - 1];
    assert_string_equal(port->name, "portable");
    for (int v = 0; v < n_isa; v++) {
        const loom__qdot_isa *isa = isas[v];
        printf("variant %s: qgemm %s\n", isa->name, isa->qgemm(LOOM_TYPE_Q8_0) ? "yes" : "no");
        for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
            const uint32_t t = weight_types[ti];
            uint32_t at;
            assert_true(isa->act_type(t, &at));
            const int64_t be = loom__type_get_traits(t)->block_elems;
            for (int64_t nblk = 1; nblk <= 17; nblk += 4) {
                const int64_t K = be == 1 ? nblk * 37 : nblk * be, T = 19;
                const size_t wb = row_bytes(t, K), ab = row_bytes(at, K);
                uint8_t *w = xmalloc(3 * wb), *xa = xmalloc((size_t)T * ab), *xp = xmalloc(ab);
                float *x = xmalloc((size_t)K * sizeof(float));
                float want[3][19], got[19 * 3];
                for (int r = 0; r < 3; r++) make_weight_row(t, K, w + (size_t)r * wb);
                for (int64_t j = 0; j < T; j++) {
                    fill_acts(x, K, j % 3 == 2 ? 3e4f : 1.0f);
                    isa->quant(at)(x, xa + (size_t)j * ab, K);
                    port->quant_portable(at)(x, xp, K);
                    assert_memory_equal(xa + (size_t)j * ab, xp, ab);
                    for (int r = 0; r < 3; r++) {
                        want[r][j] = port->dot_portable(t)(w + (size_t)r * wb, xp, K);
                        float a = isa->dot(t)(w + (size_t)r * wb, xp, K);
                        assert_memory_equal(&a, &want[r][j], sizeof a);
                    }
                }
                const loom__qgemm_kernels *qk = isa->qgemm(t);
                if (qk) { /* 3 rows x 19 tokens */
                    uint8_t *xr = aligned_alloc(64, (size_t)T * qk->x_row_bytes(K));
                    assert_non_null(xr);
                    for (int64_t j = 0; j < T; j++)
                        qk->prepare_x(xa + (size_t)j * ab, xr + (size_t)j * qk->x_row_bytes(K), K);
                    const size_t xb = qk->x_row_bytes(K);
                    /* weights in place: all 19 tokens in one call, then one token per call */
                    qk->tile(w, wb, 3, xr, xb, (int)T, K, got, 3);
                    for (int64_t j = 0; j < T; j++)
                        for (int r = 0; r < 3; r++)
                            assert_memory_equal(&got[j * 3 + r], &want[r][j], sizeof(float));
                    for (int64_t j = 0; j < T; j++) {
                        qk->tile(w, wb, 3, xr + (size_t)j * xb, xb, 1, K, got, 3);
                        for (int r = 0; r < 3; r++)
                            assert_memory_equal(&got[r], &want[r][j], sizeof(float));
                    }
                    /* prepared rows (where the kernels have them): filled by a call of all 19
                     * tokens, then by one of a single token; reused by one-token calls with w
                     * poisoned (a call that does not fill must not read w) */
                    void *wp = NULL;
                    if (qk->tile_prepared) {
                        assert_int_equal(qk->w_row_bytes(K) % 64, 0);
                        wp = aligned_alloc(64, 3 * qk->w_row_bytes(K));
                        assert_non_null(wp);
                        qk->tile_prepared(w, wb, 3, wp, 1, xr, xb, (int)T, K, got, 3);
                        for (int64_t j = 0; j < T; j++)
                            for (int r = 0; r < 3; r++)
                                assert_memory_equal(&got[j * 3 + r], &want[r][j], sizeof(float));
                        memset(wp, 0xff, 3 * qk->w_row_bytes(K));
                        qk->tile_prepared(w, wb, 3, wp, 1, xr, xb, 1, K, got, 3);
                        for (int r = 0; r < 3; r++)
                            assert_memory_equal(&got[r], &want[r][0], sizeof(float));
                        for (int64_t j = 0; j < T; j++) {
                            qk->tile_prepared(NULL, 0, 3, wp, 0, xr + (size_t)j * xb, xb, 1, K, got,
                                              3);
                            for (int r = 0; r < 3; r++)
                                assert_memory_equal(&got[r], &want[r][j], sizeof(float));
                        }
                    }
                    free(wp);
                    free(xr);
                }
                const loom__qgemm_lanes *lk = isa->lanes(t);
                if (lk) { /* groups of width tokens, the last one partial */
                    uint8_t *x8 = aligned_alloc(64, lk->x8_bytes(K));
                    assert_non_null(x8);
                    for (int64_t j0 = 0; j0 < T; j0 += lk->width) {
                        const int n = (int)(T - j0 < lk->width ? T - j0 : lk->width);
                        lk->prepare_x8(xa + (size_t)j0 * ab, ab, n, x8, K);
                        lk->tile8(w, wb, 3, x8, n, K, got, 3);
                        for (int j = 0; j < n; j++)
                            for (int r = 0; r < 3; r++)
                                assert_memory_equal(&got[j * 3 + r], &want[r][j0 + j],
                                                    sizeof(float));
                    }
                    free(x8);
                }
                free(w);
                free(xa);
                free(xp);
                free(x);
            }
        }
    }
}

/* One q8_K block (256 values) of the given kind, built to probe the quantizer's rules: which
 * value is the max (first of equal magnitudes, either sign first, in the same or different
 * vectors), zero and NaN blocks, subnormal and huge magnitudes (iscale overflowing to +-inf, d
 * then 0), infinities, and products that land on .5 ties. */
static void fill_q8K_block(float *x, int kind) {
    const int a = (int)(rng_u64() % 256), b = (a + 1 + (int)(rng_u64() % 255)) % 256; /* != a */
    const int lo = a < b ? a : b, hi = a < b ? b : a;
    fill_acts(x, 256, 1.0f); /* |x| <= 100 */
    switch (kind) {
    case 0: /* random */
        break;
    case 1: /* |max| tie, negative first */
    case 2: /* |max| tie, positive first */
        x[lo] = kind == 1 ? -1000.0f : 1000.0f;
        x[hi] = kind == 1 ? 1000.0f : -1000.0f;
        break;
    case 3: /* all zeros, some negative */
        for (int j = 0; j < 256; j++) x[j] = j % 3 ? 0.0f : -0.0f;
        break;
    case 4: /* subnormal; the largest may be the smallest subnormal (iscale +-inf) */
        for (int j = 0; j < 256; j++) x[j] *= 1e-39f;
        if (a % 2) {
            for (int j = 0; j < 256; j++) x[j] = 0.0f;
            x[a] = -0x1p-149f;
            x[b] = 0x1p-149f;
        }
        break;
    case 5: /* huge, up to FLT_MAX */
        for (int j = 0; j < 256; j++) x[j] *= 3e36f;
        x[a] = a % 2 ? 0x1.fffffep127f : -0x1.fffffep127f;
        break;
    case 6: /* NaNs and infinities among finite values */
        x[a] = NAN;
        x[b] = b % 2 ? INFINITY : -INFINITY;
        x[(a + 7) % 256] = -NAN;
        break;
    case 7: /* all NaN */
        for (int j = 0; j < 256; j++) x[j] = NAN;
        break;
    case 8: /* every magnitude equal */
        for (int j = 0; j < 256; j++) x[j] = rng_u64() % 2 ? 0.75f : -0.75f;
        break;
    default: /* max -127 (iscale 1): k + 0.5 values are ties for the rounding */
        for (int j = 0; j < 256; j++) x[j] = (float)((int)(rng_u64() % 200) - 100) + 0.5f;
        x[a] = -127.0f;
        break;
    }
}

/* Every variant's q8_K quantizer gives the portable one's bytes, on rows of 1..6 blocks of
 * mixed kinds; the SIMD variants really have their own. */
static void test_q8K_simd_vs_portable(void **state) {
    (void)state;
    const loom__qdot_isa *isas[4];
    const int n_isa = loom__qdot_isa_list(isas);
    const loom__qdot_isa *port = isas[n_isa - 1];
    const size_t bb = sizeof(loom__block_q8_K);
    float *x = xmalloc(6 * 256 * sizeof(float));
    uint8_t *got = xmalloc(6 * bb), *want = xmalloc(6 * bb);
    for (int v = 0; v < n_isa; v++) {
        const loom__qdot_isa *isa = isas[v];
        const loom__quantize_act_fn q = isa->quant(LOOM_TYPE_Q8_K);
        if (v < n_isa - 1) assert_true(q != isa->quant_portable(LOOM_TYPE_Q8_K));
        for (int rep = 0; rep < 400; rep++) {
            const int nblk = 1 + rep % 6;
            for (int k = 0; k < nblk; k++) fill_q8K_block(x + 256 * k, (rep + 3 * k) % 10);
            memset(got, 0x5a, 6 * bb);
            memset(want, 0xa5, 6 * bb);
            q(x, got, 256 * nblk);
            port->quant_portable(LOOM_TYPE_Q8_K)(x, want, 256 * nblk);
            if (memcmp(got, want, (size_t)nblk * bb) != 0)
                fail_msg("variant %s, rep %d: q8_K differs from portable", isa->name, rep);
        }
    }
    free(x);
    free(got);
    free(want);
}

/* The F16 activation rounding of every variant against the portable one, bit for bit: a sweep
 * of float bit patterns (every 4099th: all exponents, both signs), then the edges — quiet and
 * signalling NaNs with payloads, infinities, the largest half and the rounding boundary to
 * infinity, the smallest normal and subnormal halves and the halfway points between them,
 * float subnormals, signed zeros — at every position of a vector and in the scalar tail. */
static void test_f16_simd_vs_portable(void **state) {
    (void)state;
    const loom__qdot_isa *isas[4];
    const int n_isa = loom__qdot_isa_list(isas);
    const loom__qdot_isa *port = isas[n_isa - 1];
    static const uint32_t edges[] = {
        0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7fbfffffu, 0x7fffe000u,
        0x7f802000u, 0x7f800000u, 0xff800000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u,
        0xc77ff000u, 0x38800000u, 0x387fffffu, 0x387ff000u, 0x33800000u, 0x33000000u, 0x33000001u,
        0x32ffffffu, 0x33c00000u, 0x00000001u, 0x807fffffu, 0x00000000u, 0x80000000u, 0x3f800000u,
        0x3f801000u, 0x3f803000u, 0x3f802fffu, 0x3f801001u};
    enum { N = 4103 }; /* not a multiple of 8: the last values take the scalar tail */
    float *x = xmalloc(N * sizeof(float));
    uint16_t got[N], want[N];
    for (int v = 0; v < n_isa; v++) {
        const loom__quantize_act_fn q = isas[v]->quant(LOOM_TYPE_F16);
        for (uint64_t base = 0; base < (1ull << 32); base += (uint64_t)N * 4099u) {
            for (int i = 0; i < N; i++) {
                uint32_t b = (uint32_t)(base + (uint64_t)i * 4099u);
                if (i % 97 == 5) b = edges[(size_t)(i / 97) % (sizeof edges / sizeof edges[0])];
                memcpy(&x[i], &b, sizeof b);
            }
            q(x, got, N);
            port->quant_portable(LOOM_TYPE_F16)(x, want, N);
            for (int i = 0; i < N; i++)
                if (got[i] != want[i]) {
                    uint32_t b;
                    memcpy(&b, &x[i], sizeof b);
                    fail_msg("variant %s: f16 of 0x%08x is 0x%04x, portable 0x%04x", isas[v]->name,
                             b, got[i], want[i]);
                }
        }
    }
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vec_dot_type),
        cmocka_unit_test(test_quantizers_reference),
        cmocka_unit_test(test_quantizer_vs_quantize_row),
        cmocka_unit_test(test_vec_dot_vs_reference),
        cmocka_unit_test(test_simd_vs_portable),
        cmocka_unit_test(test_isa_variants_agree),
        cmocka_unit_test(test_q8K_simd_vs_portable),
        cmocka_unit_test(test_f16_simd_vs_portable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
