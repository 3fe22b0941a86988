/* test_cuda_ops.c — every op of the CUDA backend against the CPU backend's (float32
 * activations) or a float64 reference, on fresh random inputs with the outputs poisoned (NaN)
 * before each run, on awkward shapes: 1, 17 and 64 rows; contexts 1, 54, 97, 4099 and 16384;
 * prefill steps of 15 to 300 new rows per sequence after cached positions;
 * block sizes 1, 8 and 16; head sizes 64, 128 and 256; 1, 4 and 8 query heads per KV head;
 * windows and soft-capping on and off; F32, F16 and BF16 pages. Then whole models: logits of
 * the synthetic llama and gemma3 on CUDA against the CPU.
 *
 * Tolerances (stated per check below) are tight enough that a wrong page index or an
 * off-by-one in a mask fails: attention is compared row by row at 2e-5 of the row's largest
 * value, where attending to one position too many or too few moves a 4099-long row by about
 * 1/4099 = 2.4e-4.
 *
 * Exits 77 (skipped) where the CUDA plugin is not built or finds no device. */
#include "backend/qweight_util.h"

#include <math.h>
#include <stdio.h>

#include "backend/backend.h"
#include "kv/kv_desc.h"
#include "loom.h"
#include "model/synth_model.h"
#include "sample/chain.h"
#include "tensor/fp8.h"

static loom__backend_stream g_cpu, g_gpu;
/* LOOM_TEST_CUDA_STANDIN=cpu runs the whole test with a second CPU backend in the GPU's place:
 * a check of the test itself (its descriptors, references and tolerances) on a machine without
 * a GPU. Not run by CI. */
static const char *g_gpu_name = "cuda";
/* The CUDA backend opened batch-invariant (its default; main reads the environment). */
static bool g_invariant = true;
/* LOOM_CUDA_MATH=bf16: the tensor-core kernels take 16-bit operands (loom_kernels.h), so their
 * results against the CPU's float32 within a BF16 tolerance instead: matmul 2^-7 of sum |w x|
 * (each product within about 2^-8 of itself; the emulator's test_kernels_emu sees 7e-4),
 * attention and logits 2^-5 of the largest value (Q's rounding moves every score). Bits across
 * batches, steps and launches are held to the same standard as at float32 accuracy. */
static bool g_math16 = false;
#define TOL(f32, bf16) (g_math16 ? (bf16) : (f32))

static void fill_rand(float *p, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) p[i] = rng_f() * scale;
}

/* ------------------------------------------------------------------------------------------ */
/* Memory on the two backends                                                                 */
/* ------------------------------------------------------------------------------------------ */

#define MAX_BUFS 256
static loom_buffer *g_bufs[MAX_BUFS];
static int g_n_bufs;

/* bytes of device memory (freed at the end of each test). */
static void *gpu_alloc(size_t bytes) {
    assert_true(g_n_bufs < MAX_BUFS);
    loom_buffer *b = NULL;
    if (g_gpu.ops->buffer_alloc(g_gpu.dev, bytes, &b) != LOOM_OK)
        fail_msg("buffer_alloc %zu: %s", bytes, loom_last_error());
    g_bufs[g_n_bufs++] = b;
    return g_gpu.ops->buffer_base(g_gpu.dev, b);
}

static void gpu_free_all(void) {
    assert_int_equal(g_gpu.ops->synchronize(g_gpu.ctx), LOOM_OK);
    for (int i = 0; i < g_n_bufs; i++) g_gpu.ops->buffer_free(g_gpu.dev, g_bufs[i]);
    g_n_bufs = 0;
}

static void gpu_put(void *dst, const void *src, size_t bytes) {
    if (g_gpu.ops->tensor_set(g_gpu.ctx, dst, src, bytes) != LOOM_OK)
        fail_msg("tensor_set: %s", loom_last_error());
    assert_int_equal(g_gpu.ops->synchronize(g_gpu.ctx), LOOM_OK);
}

static void gpu_get(void *dst, const void *src, size_t bytes) {
    if (g_gpu.ops->tensor_get(g_gpu.ctx, dst, src, bytes) != LOOM_OK)
        fail_msg("tensor_get: %s", loom_last_error());
}

/* A [rows, cols] F32 tensor on the device holding host, and its poisoned twin for outputs. */
static loom_tensor gpu_f32(const float *host, int64_t cols, int64_t rows) {
    size_t bytes = (size_t)(cols * rows) * sizeof(float);
    float *d = gpu_alloc(bytes ? bytes : 4);
    if (host) gpu_put(d, host, bytes);
    return loom_tensor_2d(LOOM_TYPE_F32, d, cols, rows, (size_t)cols * sizeof(float));
}

static void gpu_poison(const loom_tensor *t) {
    size_t n = (size_t)(t->ne[0] * t->ne[1]);
    float *nan = xmalloc(n * sizeof *nan);
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    gpu_put(t->data, nan, n * sizeof *nan);
    free(nan);
}

static float *host_f32(int64_t n) {
    float *p = xmalloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static loom_tensor cpu_view(float *p, int64_t cols, int64_t rows) {
    return loom_tensor_2d(LOOM_TYPE_F32, p, cols, rows, (size_t)cols * sizeof(float));
}

static void expect_ok(loom_status st, const char *what) {
    if (st != LOOM_OK) fail_msg("%s: %s (%s)", what, loom_status_str(st), loom_last_error());
}

/* Largest |a - b| over n values, relative to the largest |b| (ggml-style normalised max
 * error); any NaN in a fails. */
static double norm_err(const float *a, const float *b, size_t n) {
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > num) num = d;
        if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
    }
    return num / den;
}

static void expect_close(const float *gpu, const float *ref, size_t n, double tol,
                         const char *what) {
    double e = norm_err(gpu, ref, n);
    if (!(e <= tol)) fail_msg("%s: normalised error %.3g > %.3g", what, e, tol);
}

/* ------------------------------------------------------------------------------------------ */
/* Weights: get_rows and matmul                                                               */
/* ------------------------------------------------------------------------------------------ */

static const uint32_t g_types[] = {LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_BF16, LOOM_TYPE_Q8_0,
                                   LOOM_TYPE_Q4_0, LOOM_TYPE_Q5_0, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K,
                                   LOOM_TYPE_Q6_K, LOOM_TYPE_FP8_E4M3_ROWS,
                                   /* not read in place: decoded to bf16 at load */
                                   LOOM_TYPE_Q4_1, LOOM_TYPE_Q3_K, LOOM_TYPE_Q2_K};
#define N_TYPES (sizeof g_types / sizeof g_types[0])

typedef struct weight_pair {
    uint8_t *host; /* [n][row_bytes] */
    loom_tensor cpu, gpu;
    float *deq; /* [n][k] the values the GPU holds (bf16-rounded where converted) */
} weight_pair;

static void make_weight(uint32_t t, int64_t k, int64_t n, loom_weight_use use, weight_pair *w) {
    size_t rb = row_bytes(t, k);
    w->host = xmalloc(rb * (size_t)n);
    if (t == LOOM_TYPE_F32) {
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < k; i++) ((float *)w->host)[r * k + i] = rng_f();
    } else {
        for (int64_t r = 0; r < n; r++) make_weight_row(t, k, w->host + (size_t)r * rb);
    }
    loom_weight_src src = {.name = "test.weight",
                           .type = (loom_type)t,
                           .ne = {k, n},
                           .row_stride = rb,
                           .data = w->host,
                           .persistent = true,
                           .use = use};
    expect_ok(g_cpu.ops->weight_prepare(g_cpu.dev, &src, &w->cpu), "cpu weight_prepare");
    expect_ok(g_gpu.ops->weight_prepare(g_gpu.dev, &src, &w->gpu), "cuda weight_prepare");
    w->deq = xmalloc((size_t)(k * n) * sizeof(float));
    for (int64_t r = 0; r < n; r++)
        assert_true(loom__dequantize_row(t, w->host + (size_t)r * rb, w->deq + r * k, k));
    if (w->gpu.type == LOOM_TYPE_BF16 && t != LOOM_TYPE_BF16) {
        for (int64_t i = 0; i < k * n; i++)
            w->deq[i] = loom__bf16_to_f32(loom__f32_to_bf16(w->deq[i]));
    }
}

static void free_weight(weight_pair *w) {
    free(w->host);
    free(w->deq);
}

static bool native(uint32_t t) {
    return t != LOOM_TYPE_Q4_1 && t != LOOM_TYPE_Q3_K && t != LOOM_TYPE_Q2_K;
}

static void test_get_rows(void **state) {
    (void)state;
    const int64_t k = 768, n = 37, n_ids = 17;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t t = g_types[ti];
        weight_pair w;
        make_weight(t, k, n, LOOM_WEIGHT_GET_ROWS, &w);
        if (strcmp(g_gpu_name, "cuda") == 0)
            assert_int_equal(w.gpu.type, native(t) ? (loom_type)t : LOOM_TYPE_BF16);
        int32_t ids[17];
        for (int i = 0; i < n_ids; i++) ids[i] = (int32_t)(rng_u64() % (uint64_t)n);
        ids[0] = 0;
        ids[1] = (int32_t)n - 1;
        int32_t *d_ids = gpu_alloc(sizeof ids);
        gpu_put(d_ids, ids, sizeof ids);
        loom_tensor gid = loom_tensor_2d(LOOM_TYPE_I32, d_ids, n_ids, 1, sizeof ids);
        loom_tensor gout = gpu_f32(NULL, k, n_ids);
        gpu_poison(&gout);
        expect_ok(g_gpu.ops->get_rows(g_gpu.ctx, &w.gpu, &gid, &gout), "cuda get_rows");
        float *got = host_f32(k * n_ids), *ref = host_f32(k * n_ids);
        gpu_get(got, gout.data, (size_t)(k * n_ids) * 4);
        loom_tensor cid = loom_tensor_2d(LOOM_TYPE_I32, ids, n_ids, 1, sizeof ids);
        loom_tensor cout = cpu_view(ref, k, n_ids);
        expect_ok(g_cpu.ops->get_rows(g_cpu.ctx, &w.cpu, &cid, &cout), "cpu get_rows");
        if (native(t) || w.gpu.type == (loom_type)t) {
            /* decoded in place with the CPU's rounding: bit for bit */
            if (memcmp(got, ref, (size_t)(k * n_ids) * 4) != 0)
                fail_msg("get_rows %s: not bitwise the CPU's", loom__type_name(t));
        } else {
            /* decoded to bf16 at load: within bf16's rounding of the CPU's values */
            for (int64_t i = 0; i < k * n_ids; i++)
                if (!(fabsf(got[i] - ref[i]) <= 0x1p-8f * fabsf(ref[i]) + 1e-30f))
                    fail_msg("get_rows %s [%lld]: %g vs %g", loom__type_name(t), (long long)i,
                             (double)got[i], (double)ref[i]);
        }
        /* An id outside the table, out of the host's sight in device memory: a NaN row. */
        int32_t bad[2] = {(int32_t)n, -1};
        gpu_put(d_ids, bad, sizeof bad);
        gid.ne[0] = 2;
        loom_tensor gout2 = gout;
        gout2.ne[1] = 2;
        if (strcmp(g_gpu_name, "cuda") == 0) {
            expect_ok(g_gpu.ops->get_rows(g_gpu.ctx, &w.gpu, &gid, &gout2), "cuda get_rows (bad)");
            gpu_get(got, gout.data, (size_t)(k * 2) * 4);
            for (int64_t i = 0; i < 2 * k; i++) assert_true(isnan(got[i]));
        } else { /* the CPU sees the ids and refuses them */
            assert_int_equal(g_gpu.ops->get_rows(g_gpu.ctx, &w.gpu, &gid, &gout2),
                             LOOM_ERR_BAD_INPUT);
        }
        free(got);
        free(ref);
        free_weight(&w);
        gpu_free_all();
    }
}

/* For every token t < T and row o: ref = the float64 sum over i of w[o, i] x[t, i], mag = the
 * sum of the terms' magnitudes; x rows xs floats apart. */
static void matmul_ref(const float *wd, const float *x, int64_t xs, int64_t k, int64_t n, int64_t T,
                       double *ref, double *mag) {
    for (int64_t tk = 0; tk < T; tk++)
        for (int64_t o = 0; o < n; o++) {
            double s = 0.0, a = 0.0;
            for (int64_t i = 0; i < k; i++) {
                const double p = (double)wd[o * k + i] * (double)x[tk * xs + i];
                s += p;
                a += fabs(p);
            }
            ref[tk * n + o] = s;
            mag[tk * n + o] = a;
        }
}

/* out against a float64 sum over the GPU's weight values, each output within 1e-5 of the sum
 * of |w x| (float32 accumulation), in steps of 1 to 130 tokens; and a token's outputs bitwise
 * the same in every step: by default (batch-invariant) every step, 1 token or 130, takes the
 * tensor-core GEMM's one order, split across blocks or not; with LOOM_CUDA_BATCH_INVARIANT=0,
 * within each regime: 1..8 tokens (the GEMV) and more than 8 (the GEMM), which sum in
 * different orders and may differ from each other. Rows and
 * tokens run past the GEMM's tiles of 64 x 64 (n = 33 .. 200, 130 tokens); K = 1000 (float types
 * only: not whole 32-value chunks) takes the tail path; x_pad 1 puts a NaN before x and after
 * each of its rows (stride K + 1 floats): rows off 16-byte alignment (the scalar loads), and
 * reading x past K poisons the result. */
static void test_matmul(void **state) {
    (void)state;
    const struct {
        int64_t k, n, x_pad;
    } shapes[] = {{768, 67, 0},  {256, 33, 0},   {1536, 129, 0},
                  {1000, 45, 0}, {1000, 200, 1}, {512, 200, 1}};
    const int64_t Ts[] = {1, 3, 8, 9, 17, 64, 130};
    const int64_t T_max = 130;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            uint32_t t = g_types[ti];
            const int64_t k = shapes[si].k, n = shapes[si].n, pad = shapes[si].x_pad;
            if (k % 32 != 0 && loom__type_get_traits(t)->block_elems != 1) continue;
            weight_pair w;
            make_weight(t, k, n, LOOM_WEIGHT_MATMUL, &w);
            /* x row tk at x + pad + tk * xs; the pad floats before it are NaN */
            const int64_t xs = k + pad, x_len = pad + xs * T_max;
            float *x = xmalloc((size_t)x_len * 4);
            fill_acts(x, x_len, 1.0f);
            for (int64_t tk = 0; tk <= T_max && pad > 0; tk++)
                for (int64_t i = 0; i < pad; i++) x[tk * xs + i] = NAN;
            float *d_x = gpu_alloc((size_t)x_len * 4);
            gpu_put(d_x, x, (size_t)x_len * 4);
            loom_tensor gx = loom_tensor_2d(LOOM_TYPE_F32, d_x + pad, k, T_max, (size_t)xs * 4);
            loom_tensor gout = gpu_f32(NULL, n, T_max);
            double *ref = xmalloc((size_t)(n * T_max) * sizeof *ref);
            double *mag = xmalloc((size_t)(n * T_max) * sizeof *mag);
            matmul_ref(w.deq, x + pad, xs, k, n, T_max, ref, mag);
            float *got = host_f32(n * T_max);
            /* per regime (0: 1..8 tokens, 1: more): the last step's outputs and its size */
            float *last[2] = {host_f32(n * T_max), host_f32(n * T_max)};
            int64_t last_T[2] = {0, 0};
            for (size_t bi = 0; bi < sizeof Ts / sizeof Ts[0]; bi++) {
                const int64_t T = Ts[bi];
                loom_tensor vx = gx, vo = gout;
                vx.ne[1] = vo.ne[1] = T;
                gpu_poison(&gout);
                expect_ok(g_gpu.ops->matmul(g_gpu.ctx, &w.gpu, &vx, &vo), "cuda matmul");
                gpu_get(got, gout.data, (size_t)(n * T) * 4);
                for (int64_t i = 0; i < n * T; i++) {
                    const double g = got[i];
                    if (!(fabs(g - ref[i]) <= TOL(1e-5, 0x1p-7) * mag[i] + 1e-30))
                        fail_msg("matmul %s k=%lld n=%lld T=%lld: out[%lld,%lld] = %.9g, float64 "
                                 "%.9g (|w||x| %.3g)",
                                 loom__type_name(t), (long long)k, (long long)n, (long long)T,
                                 (long long)(i / n), (long long)(i % n), g, ref[i], mag[i]);
                }
                /* batch invariance (within the regime, where there are two): the tokens an
                 * earlier, smaller step of the same regime also computed are the same bits */
                const int r = !g_invariant && T > 8;
                if (last_T[r] > 0 && memcmp(got, last[r], (size_t)(n * last_T[r]) * 4) != 0)
                    fail_msg("matmul %s k=%lld n=%lld: tokens of a %lld-token step differ from the "
                             "same tokens in a %lld-token step",
                             loom__type_name(t), (long long)k, (long long)n, (long long)last_T[r],
                             (long long)T);
                memcpy(last[r], got, (size_t)(n * T) * 4);
                last_T[r] = T;
            }
            free(got);
            free(last[0]);
            free(last[1]);
            free(ref);
            free(mag);
            free(x);
            free_weight(&w);
            gpu_free_all();
        }
    }
}

/* matmul_multi (q, k, v; gate and up): each out the bits of its own matmul, with weights of one
 * type (one launch) and of mixed types (a Q4_K_M file's Q6_K v beside Q4_K q and k: a launch per
 * type), in decode steps (1, 3 tokens: the split GEMM by default) and a prefill chunk (40); and
 * the bad calls refused: no weights, too many, outputs that overlap. */
static void test_matmul_multi(void **state) {
    (void)state;
    const int64_t k = 512, T_max = 40;
    const uint32_t sets[2][3] = {{LOOM_TYPE_Q4_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q4_K},
                                 {LOOM_TYPE_Q4_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q6_K}};
    const int64_t rows[3] = {256, 64, 96};
    float *x = xmalloc((size_t)(k * T_max) * 4);
    fill_acts(x, k * T_max, 1.0f);
    float *d_x = gpu_alloc((size_t)(k * T_max) * 4);
    gpu_put(d_x, x, (size_t)(k * T_max) * 4);
    for (int si = 0; si < 2; si++) {
        weight_pair w[3];
        loom_tensor one[3], multi[3];
        const loom_tensor *ws[3];
        loom_tensor *outs[3];
        for (int j = 0; j < 3; j++) {
            make_weight(sets[si][j], k, rows[j], LOOM_WEIGHT_MATMUL, &w[j]);
            ws[j] = &w[j].gpu;
            one[j] = gpu_f32(NULL, rows[j], T_max);
            multi[j] = gpu_f32(NULL, rows[j], T_max);
            outs[j] = &multi[j];
        }
        const int64_t Ts[] = {1, 3, 40};
        for (int ti = 0; ti < 3; ti++) {
            loom_tensor gx = loom_tensor_2d(LOOM_TYPE_F32, d_x, k, Ts[ti], (size_t)k * 4);
            loom_tensor vo[3], vm[3];
            loom_tensor *vmp[3];
            for (int j = 0; j < 3; j++) {
                vo[j] = one[j], vm[j] = multi[j];
                vo[j].ne[1] = vm[j].ne[1] = Ts[ti];
                vmp[j] = &vm[j];
                gpu_poison(&one[j]);
                gpu_poison(&multi[j]);
                expect_ok(g_gpu.ops->matmul(g_gpu.ctx, ws[j], &gx, &vo[j]), "matmul");
            }
            assert_non_null(g_gpu.ops->matmul_multi);
            expect_ok(g_gpu.ops->matmul_multi(g_gpu.ctx, 3, ws, &gx, vmp), "matmul_multi");
            for (int j = 0; j < 3; j++) {
                float *a = host_f32(rows[j] * T_max), *b = host_f32(rows[j] * T_max);
                gpu_get(a, one[j].data, (size_t)(rows[j] * T_max) * 4);
                gpu_get(b, multi[j].data, (size_t)(rows[j] * T_max) * 4);
                if (memcmp(a, b, (size_t)(rows[j] * T_max) * 4) != 0)
                    fail_msg("matmul_multi (%s) T=%lld: out %d is not matmul's bits",
                             si ? "mixed types" : "one type", (long long)Ts[ti], j);
                free(a), free(b);
            }
        }
        /* bad calls */
        assert_int_equal(g_gpu.ops->matmul_multi(g_gpu.ctx, 0, ws, &one[0], outs),
                         LOOM_ERR_INVALID_ARG);
        assert_int_equal(
            g_gpu.ops->matmul_multi(g_gpu.ctx, LOOM_MATMUL_MULTI_MAX + 1, ws, &one[0], outs),
            LOOM_ERR_INVALID_ARG);
        loom_tensor gx = loom_tensor_2d(LOOM_TYPE_F32, d_x, k, 1, (size_t)k * 4);
        loom_tensor same = multi[1];
        same.ne[1] = 1;
        loom_tensor *clash[3] = {&same, &same, &multi[2]};
        const loom_tensor *ws2[3] = {ws[1], ws[1], ws[2]};
        multi[2].ne[1] = 1;
        assert_int_equal(g_gpu.ops->matmul_multi(g_gpu.ctx, 3, ws2, &gx, clash),
                         LOOM_ERR_INVALID_ARG);
        for (int j = 0; j < 3; j++) free_weight(&w[j]);
        gpu_free_all();
        d_x = gpu_alloc((size_t)(k * T_max) * 4);
        gpu_put(d_x, x, (size_t)(k * T_max) * 4);
    }
    free(x);
    gpu_free_all();
}

/* A CUDA stream opened with the n variables vars[2 i] set to vars[2 i + 1]; the environment
 * left as it was. */
static void open_with_env(const char *const *vars, int n, loom__backend_stream *gb) {
    char *old[8];
    assert_true(n <= 8);
    for (int i = 0; i < n; i++) {
        old[i] = getenv(vars[2 * i]) ? strdup(getenv(vars[2 * i])) : NULL;
        setenv(vars[2 * i], vars[2 * i + 1], 1);
    }
    loom_backend_open_params gp = {.device = 0, .n_threads = 2, .f32_activations = true};
    expect_ok(loom__backend_stream_open("cuda", &gp, gb), vars[0]);
    for (int i = 0; i < n; i++) {
        if (old[i] != NULL)
            setenv(vars[2 * i], old[i], 1);
        else
            unsetenv(vars[2 * i]);
        free(old[i]);
    }
}

/* A CUDA stream opened in the fast mode (cuBLASLt is not invariant: opt-out only) with one more
 * variable set. */
static void open_fast_with(const char *var, const char *value, loom__backend_stream *gb) {
    const char *vars[] = {"LOOM_CUDA_BATCH_INVARIANT", "0", var, value};
    open_with_env(vars, 2, gb);
}

/* w's stored rows (make_weight: type t, n rows of k) prepared on the stream gb too. */
static loom_tensor prepare_on(const loom__backend_stream *gb, const weight_pair *w, uint32_t t,
                              int64_t k, int64_t n) {
    loom_weight_src src = {.name = "test.weight",
                           .type = (loom_type)t,
                           .ne = {k, n},
                           .row_stride = row_bytes(t, k),
                           .data = w->host,
                           .persistent = true,
                           .use = LOOM_WEIGHT_MATMUL};
    loom_tensor wg;
    expect_ok(gb->ops->weight_prepare(gb->dev, &src, &wg), "weight_prepare (second stream)");
    return wg;
}

/* x rounded to BF16, nearest even (written here from the format: a float's top 16 bits). */
static float bf16_round_f(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* The opt-in FP8 GEMM (LOOM_CUDA_FP8_GEMM=1, cuBLASLt on sm_89+) for steps of more than 8
 * tokens: against a float64 sum over the weights' values and the activations quantized as the
 * path quantizes them (E4M3 with max|x_t| / 448 per token, tensor/fp8.h's rounding), each output
 * within 1e-4 of the sum of |w x|; and not the outputs of loom's own matmul (float32
 * activations: its tensor-core GEMM at this step's 48 tokens), so cuBLASLt really ran. A device
 * without the FP8 GEMM (no FP8 tensor cores, no cuBLASLt) logs why and runs loom's: the test
 * then says so and checks nothing more. CUDA only. */
static void test_fp8_gemm(void **state) {
    (void)state;
    if (strcmp(g_gpu_name, "cuda") != 0) return;
    loom__backend_stream gb;
    open_fast_with("LOOM_CUDA_FP8_GEMM", "1", &gb);
    const int64_t k = 1024, n = 192, T = 48;
    weight_pair w;
    make_weight(LOOM_TYPE_FP8_E4M3_ROWS, k, n, LOOM_WEIGHT_MATMUL, &w);
    loom_tensor wg = prepare_on(&gb, &w, LOOM_TYPE_FP8_E4M3_ROWS, k, n);
    float *x = xmalloc((size_t)(k * T) * 4), *xq = xmalloc((size_t)(k * T) * 4);
    fill_acts(x, k * T, 1.0f);
    for (int64_t t = 0; t < T; t++) {
        float amax = 0.0f;
        for (int64_t i = 0; i < k; i++) amax = fmaxf(amax, fabsf(x[t * k + i]));
        const float s = amax / 448.0f;
        for (int64_t i = 0; i < k; i++)
            xq[t * k + i] = s > 0.0f
                                ? loom__fp8_e4m3_to_f32(loom__f32_to_fp8_e4m3(x[t * k + i] / s)) * s
                                : 0.0f;
    }
    float *d_x = gpu_alloc((size_t)(k * T) * 4), *d_o = gpu_alloc((size_t)(n * T) * 4);
    gpu_put(d_x, x, (size_t)(k * T) * 4);
    loom_tensor gx = loom_tensor_2d(LOOM_TYPE_F32, d_x, k, T, (size_t)k * 4);
    loom_tensor go = loom_tensor_2d(LOOM_TYPE_F32, d_o, n, T, (size_t)n * 4);
    gpu_poison(&go);
    expect_ok(gb.ops->matmul(gb.ctx, &wg, &gx, &go), "fp8 gemm matmul");
    expect_ok(gb.ops->synchronize(gb.ctx), "fp8 gemm sync");
    float *got = host_f32(n * T), *gemv = host_f32(n * T);
    gpu_get(got, d_o, (size_t)(n * T) * 4);
    gpu_poison(&go);
    expect_ok(g_gpu.ops->matmul(g_gpu.ctx, &w.gpu, &gx, &go), "gemv matmul");
    gpu_get(gemv, d_o, (size_t)(n * T) * 4);
    if (memcmp(got, gemv, (size_t)(n * T) * 4) == 0) {
        printf("fp8 gemm: not available on this device (loom's matmul ran): nothing more to "
               "check\n");
    } else {
        for (int64_t t = 0; t < T; t++)
            for (int64_t o = 0; o < n; o++) {
                double s = 0.0, a = 0.0;
                for (int64_t i = 0; i < k; i++) {
                    const double p = (double)w.deq[o * k + i] * (double)xq[t * k + i];
                    s += p;
                    a += fabs(p);
                }
                const double g = got[t * n + o];
                if (!(fabs(g - s) <= 1e-4 * a + 1e-30))
                    fail_msg("fp8 gemm out[%lld,%lld] = %.9g, float64 %.9g (|w||x| %.3g)",
                             (long long)t, (long long)o, g, s, a);
            }
        printf("fp8 gemm: %lld x %lld x %lld within 1e-4 of the float64 sum over quantized "
               "activations\n",
               (long long)n, (long long)T, (long long)k);
    }
    free(x), free(xq), free(got), free(gemv);
    free_weight(&w);
    gpu_free_all();
    loom__backend_stream_close(&gb);
}

/* BF16 weights in the fast mode with BF16 math (LOOM_CUDA_BATCH_INVARIANT=0 LOOM_CUDA_MATH=bf16:
 * cuBLASLt's BF16 GEMM for steps of more than 8 tokens, loom's own BF16-math GEMM where cuBLASLt
 * is missing): against a float64 sum over the weights and the activations rounded to BF16
 * (nearest even, written here), each output within 1e-4 of the sum of |w x| — either GEMM sums
 * exact products in float32 — and not within 1e-6 of the float32 product (the activations were
 * rounded: the BF16 path ran, not the default's). CUDA only. */
static void test_bf16_gemm(void **state) {
    (void)state;
    if (strcmp(g_gpu_name, "cuda") != 0) return;
    loom__backend_stream gb;
    open_fast_with("LOOM_CUDA_MATH", "bf16", &gb);
    const int64_t k = 1024, n = 192, T = 48;
    weight_pair w;
    make_weight(LOOM_TYPE_BF16, k, n, LOOM_WEIGHT_MATMUL, &w);
    loom_tensor wg = prepare_on(&gb, &w, LOOM_TYPE_BF16, k, n);
    float *x = xmalloc((size_t)(k * T) * 4), *xb = xmalloc((size_t)(k * T) * 4);
    fill_acts(x, k * T, 1.0f);
    for (int64_t i = 0; i < k * T; i++) xb[i] = bf16_round_f(x[i]);
    float *d_x = gpu_alloc((size_t)(k * T) * 4), *d_o = gpu_alloc((size_t)(n * T) * 4);
    gpu_put(d_x, x, (size_t)(k * T) * 4);
    loom_tensor gx = loom_tensor_2d(LOOM_TYPE_F32, d_x, k, T, (size_t)k * 4);
    loom_tensor go = loom_tensor_2d(LOOM_TYPE_F32, d_o, n, T, (size_t)n * 4);
    gpu_poison(&go);
    expect_ok(gb.ops->matmul(gb.ctx, &wg, &gx, &go), "bf16 gemm matmul");
    expect_ok(gb.ops->synchronize(gb.ctx), "bf16 gemm sync");
    float *got = host_f32(n * T);
    gpu_get(got, d_o, (size_t)(n * T) * 4);
    double far = 0.0; /* the largest distance from the float32 product, of sum |w x| */
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < n; o++) {
            double s = 0.0, a = 0.0, s32 = 0.0;
            for (int64_t i = 0; i < k; i++) {
                const double p = (double)w.deq[o * k + i] * (double)xb[t * k + i];
                s += p;
                a += fabs(p);
                s32 += (double)w.deq[o * k + i] * (double)x[t * k + i];
            }
            const double g = got[t * n + o];
            if (!(fabs(g - s) <= 1e-4 * a + 1e-30))
                fail_msg("bf16 gemm out[%lld,%lld] = %.9g, float64 %.9g (|w||x| %.3g)",
                         (long long)t, (long long)o, g, s, a);
            far = fmax(far, fabs(g - s32) / (a + 1e-30));
        }
    if (!(far > 1e-6)) fail_msg("bf16 gemm: the float32 product's bits (%.3g): no BF16 ran", far);
    printf("bf16 gemm: %lld x %lld x %lld within 1e-4 of the float64 sum over BF16 activations "
           "(%.2g from the float32 product)\n",
           (long long)n, (long long)T, (long long)k, far);
    free(x), free(xb), free(got);
    free_weight(&w);
    gpu_free_all();
    loom__backend_stream_close(&gb);
}

/* The wgmma GEMM (LOOM_CUDA_MATH=bf16 LOOM_CUDA_WGMMA=1, Hopper; the batch-invariant default):
 * where the device opens with it (the INFO log says so), Q4_K, Q8_0 and BF16 weights of 192 rows
 * (a whole and a partial 128-row tile) in steps of 1, 9, 48 and 200 tokens (two token tiles):
 * each output within 1e-4 of sum |w x| of a float64 sum over the weights' values and the
 * activations, both rounded to BF16 here (the kernel sums exact products in float32); each
 * token's row the same bits in every step that holds it (the step of 1 splits K across blocks,
 * the others do not: the split's traffic rule); and matmul_multi's three weights cut from the rows
 * the bits of the whole. The BF16 weights' GEMM is warp-specialised with TMA copies (the log says
 * so); BF16 rows of 1,000 values (the last chunk's boxes past k) must give a step of 200 tokens
 * within 1e-4 as above, and the same bits on a second stream with LOOM_CUDA_GEMM_TMA=0 (cp.async
 * copies). Elsewhere (not sm_90, or a build without sm_90a code) the log says why and
 * the test checks nothing more. CUDA only. */
typedef struct log_capture {
    char chosen, tma, map_refused, refused[256];
} log_capture;

static void capture_wgmma_log(loom_log_level level, const char *msg, void *user) {
    (void)level;
    log_capture *c = user;
    if (strstr(msg, "warpgroup MMA (LOOM_CUDA_WGMMA=1)") != NULL) c->chosen = 1;
    if (strstr(msg, "copies its tiles by TMA") != NULL) c->tma = 1;
    if (strstr(msg, "refused a tensor map") != NULL) c->map_refused = 1;
    if (strstr(msg, "LOOM_CUDA_WGMMA=1 ignored") != NULL)
        snprintf(c->refused, sizeof c->refused, "%s", msg);
}

static void test_wgmma_gemm(void **state) {
    (void)state;
    if (strcmp(g_gpu_name, "cuda") != 0) return;
    /* static: a failure below leaves the test with the capture still set */
    static log_capture cap;
    memset(&cap, 0, sizeof cap);
    loom_log_set(capture_wgmma_log, LOOM_LOG_INFO, &cap);
    loom__backend_stream gb;
    const char *vars[] = {
        "LOOM_CUDA_MATH", "bf16", "LOOM_CUDA_WGMMA", "1", "LOOM_CUDA_BATCH_INVARIANT", "1"};
    open_with_env(vars, 3, &gb);
    if (!cap.chosen) {
        loom_log_set(NULL, LOOM_LOG_WARN, NULL);
        printf("wgmma gemm: not run (%s)\n", cap.refused[0] ? cap.refused : "no log line");
        if (cap.refused[0] == '\0') fail_msg("wgmma gemm: the device said neither yes nor no");
        loom__backend_stream_close(&gb);
        return;
    }
    if (!cap.tma) fail_msg("wgmma gemm: the warp-specialised GEMM's TMA copies were not chosen");
    const uint32_t types[] = {LOOM_TYPE_Q4_K, LOOM_TYPE_Q8_0, LOOM_TYPE_BF16};
    const int64_t k = 1024, n = 192, steps[] = {1, 9, 48, 200}, T_max = 200;
    float *x = xmalloc((size_t)(k * T_max) * 4), *xb = xmalloc((size_t)(k * T_max) * 4);
    fill_acts(x, k * T_max, 1.0f);
    for (int64_t i = 0; i < k * T_max; i++) xb[i] = bf16_round_f(x[i]);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        weight_pair w;
        make_weight(types[ti], k, n, LOOM_WEIGHT_MATMUL, &w);
        const loom_tensor wg = prepare_on(&gb, &w, types[ti], k, n);
        float *d_x = gpu_alloc((size_t)(k * T_max) * 4), *d_o = gpu_alloc((size_t)(n * T_max) * 4);
        gpu_put(d_x, x, (size_t)(k * T_max) * 4);
        float *prev = host_f32(n * T_max), *got = host_f32(n * T_max);
        for (size_t si = 0; si < sizeof steps / sizeof steps[0]; si++) {
            const int64_t T = steps[si];
            loom_tensor gx = loom_tensor_2d(LOOM_TYPE_F32, d_x, k, T, (size_t)k * 4);
            loom_tensor go = loom_tensor_2d(LOOM_TYPE_F32, d_o, n, T, (size_t)n * 4);
            gpu_poison(&go);
            expect_ok(gb.ops->matmul(gb.ctx, &wg, &gx, &go), "wgmma matmul");
            expect_ok(gb.ops->synchronize(gb.ctx), "wgmma sync");
            gpu_get(got, d_o, (size_t)(n * T) * 4);
            for (int64_t t = 0; t < T; t++)
                for (int64_t o = 0; o < n; o++) {
                    double s = 0.0, a = 0.0;
                    for (int64_t i = 0; i < k; i++) {
                        const double p =
                            (double)bf16_round_f(w.deq[o * k + i]) * (double)xb[t * k + i];
                        s += p;
                        a += fabs(p);
                    }
                    const double g = got[t * n + o];
                    if (!(fabs(g - s) <= 1e-4 * a + 1e-30))
                        fail_msg("wgmma %s T=%lld: out[%lld,%lld] = %.9g, float64 %.9g "
                                 "(|w||x| %.3g)",
                                 loom__type_name((loom_type)types[ti]), (long long)T, (long long)t,
                                 (long long)o, g, s, a);
                }
            if (si > 0 && memcmp(prev, got, (size_t)(n * steps[si - 1]) * 4) != 0)
                fail_msg("wgmma %s: tokens 0..%lld differ between steps of %lld and %lld tokens",
                         loom__type_name((loom_type)types[ti]), (long long)steps[si - 1] - 1,
                         (long long)steps[si - 1], (long long)T);
            memcpy(prev, got, (size_t)(n * T) * 4);
        }
        /* the rows cut into three weights (64, 80 and 48 rows) in one matmul_multi */
        const int64_t cut[4] = {0, 64, 144, 192};
        loom_tensor part[3], outs[3];
        const loom_tensor *pw[3];
        loom_tensor *po[3];
        float *d_p = gpu_alloc((size_t)(n * T_max) * 4);
        for (int j = 0; j < 3; j++) {
            part[j] = wg;
            part[j].ne[1] = cut[j + 1] - cut[j];
            part[j].data = (uint8_t *)wg.data + (size_t)cut[j] * wg.row_stride;
            pw[j] = &part[j];
            outs[j] = loom_tensor_2d(LOOM_TYPE_F32, d_p + cut[j] * T_max, cut[j + 1] - cut[j],
                                     T_max, (size_t)(cut[j + 1] - cut[j]) * 4);
            gpu_poison(&outs[j]);
            po[j] = &outs[j];
        }
        loom_tensor gx = loom_tensor_2d(LOOM_TYPE_F32, d_x, k, T_max, (size_t)k * 4);
        expect_ok(gb.ops->matmul_multi(gb.ctx, 3, pw, &gx, po), "wgmma matmul_multi");
        expect_ok(gb.ops->synchronize(gb.ctx), "wgmma multi sync");
        for (int j = 0; j < 3; j++) {
            const int64_t rows = cut[j + 1] - cut[j];
            gpu_get(got, d_p + cut[j] * T_max, (size_t)(rows * T_max) * 4);
            for (int64_t t = 0; t < T_max; t++)
                if (memcmp(got + t * rows, prev + t * n + cut[j], (size_t)rows * 4) != 0)
                    fail_msg("wgmma %s matmul_multi: weight %d, token %lld not the bits of the "
                             "whole product",
                             loom__type_name((loom_type)types[ti]), j, (long long)t);
        }
        printf("wgmma gemm %s: %lld x %lld, steps of 1, 9, 48, 200 tokens within 1e-4 of the "
               "float64 sum over BF16 operands, the same bits in each, and in matmul_multi\n",
               loom__type_name((loom_type)types[ti]), (long long)n, (long long)k);
        free(prev), free(got);
        free_weight(&w);
        gpu_free_all();
    }
    /* TMA against cp.async copies: BF16 rows of k = 1000 (2,000 bytes, 16-byte aligned; the last
     * chunk's boxes at 1,000, 1,008 and 1,016 lie wholly past k, the tail TMA fills with zeros),
     * a step of T_max tokens on this stream and on one with LOOM_CUDA_GEMM_TMA=0 */
    {
        const int64_t k2 = 1000;
        weight_pair w;
        make_weight(LOOM_TYPE_BF16, k2, n, LOOM_WEIGHT_MATMUL, &w);
        loom__backend_stream gc;
        const char *cp_vars[] = {
            "LOOM_CUDA_MATH",     "bf16", "LOOM_CUDA_WGMMA", "1", "LOOM_CUDA_BATCH_INVARIANT", "1",
            "LOOM_CUDA_GEMM_TMA", "0"};
        open_with_env(cp_vars, 4, &gc);
        const loom_tensor wt = prepare_on(&gb, &w, LOOM_TYPE_BF16, k2, n);
        const loom_tensor wc = prepare_on(&gc, &w, LOOM_TYPE_BF16, k2, n);
        float *d_x = gpu_alloc((size_t)(k2 * T_max) * 4), *d_o = gpu_alloc((size_t)(n * T_max) * 4);
        gpu_put(d_x, x, (size_t)(k2 * T_max) * 4);
        float *by_tma = host_f32(n * T_max), *by_cp = host_f32(n * T_max);
        const loom__backend_stream *on[2] = {&gb, &gc};
        const loom_tensor *wo[2] = {&wt, &wc};
        for (int m = 0; m < 2; m++) {
            loom_tensor gx = loom_tensor_2d(LOOM_TYPE_F32, d_x, k2, T_max, (size_t)k2 * 4);
            loom_tensor go = loom_tensor_2d(LOOM_TYPE_F32, d_o, n, T_max, (size_t)n * 4);
            gpu_poison(&go);
            expect_ok(on[m]->ops->matmul(on[m]->ctx, wo[m], &gx, &go), "wgmma matmul k=1000");
            expect_ok(on[m]->ops->synchronize(on[m]->ctx), "wgmma sync k=1000");
            gpu_get(m == 0 ? by_tma : by_cp, d_o, (size_t)(n * T_max) * 4);
        }
        for (int64_t t = 0; t < T_max; t++)
            for (int64_t o = 0; o < n; o++) {
                double sum = 0.0, a = 0.0;
                for (int64_t i = 0; i < k2; i++) {
                    const double p = (double)bf16_round_f(w.deq[o * k2 + i]) *
                                     (double)bf16_round_f(x[t * k2 + i]);
                    sum += p;
                    a += fabs(p);
                }
                if (!(fabs(by_tma[t * n + o] - sum) <= 1e-4 * a + 1e-30))
                    fail_msg("wgmma bf16 k=1000 (TMA): out[%lld,%lld] = %.9g, float64 %.9g",
                             (long long)t, (long long)o, by_tma[t * n + o], sum);
            }
        if (memcmp(by_tma, by_cp, (size_t)(n * T_max) * 4) != 0)
            fail_msg("wgmma bf16 k=1000: TMA and cp.async copies give other bits");
        printf("wgmma gemm bf16: TMA and cp.async copies, the same bits (k 1000: boxes past k)\n");
        free(by_tma), free(by_cp);
        free_weight(&w);
        gpu_free_all();
        loom__backend_stream_close(&gc);
    }
    free(x), free(xb);
    loom__backend_stream_close(&gb);
    loom_log_set(NULL, LOOM_LOG_WARN, NULL);
    if (cap.map_refused) fail_msg("wgmma gemm: the driver refused a tensor map");
}

/* ------------------------------------------------------------------------------------------ */
/* Row-wise and element-wise                                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef enum ew_kind {
    EW_RMS,
    EW_RMS_NOW,
    EW_ADD,
    EW_ADD_ROW,
    EW_SCALE,
    EW_SWIGLU,
    EW_GEGLU,
    EW_ADD_RMS /* x += y, out = rms_norm(x): the fused slot where there is one */
} ew_kind;

static void run_ew(const loom__backend_stream *b, ew_kind kind, loom_tensor *x, loom_tensor *y,
                   loom_tensor *w, loom_tensor *out) {
    loom_status st = LOOM_OK;
    switch (kind) {
    case EW_RMS:
        st = b->ops->rms_norm(b->ctx, x, w, 1e-6f, out);
        break;
    case EW_RMS_NOW:
        st = b->ops->rms_norm(b->ctx, x, NULL, 1e-5f, out);
        break;
    case EW_ADD:
        st = b->ops->add(b->ctx, x, y, out);
        break;
    case EW_ADD_ROW:
        st = b->ops->add(b->ctx, x, w, out);
        break;
    case EW_SCALE:
        st = b->ops->scale(b->ctx, x, 0.37f, out);
        break;
    case EW_SWIGLU:
        st = b->ops->glu(b->ctx, x, y, LOOM_GLU_SWIGLU, out);
        break;
    case EW_GEGLU:
        st = b->ops->glu(b->ctx, x, y, LOOM_GLU_GEGLU_TANH, out);
        break;
    case EW_ADD_RMS:
        if (b->ops->add_rms_norm != NULL) {
            st = b->ops->add_rms_norm(b->ctx, x, y, w, 1e-6f, out);
        } else {
            st = b->ops->add(b->ctx, x, y, x);
            if (st == LOOM_OK) st = b->ops->rms_norm(b->ctx, x, w, 1e-6f, out);
        }
        break;
    }
    expect_ok(st, b == &g_gpu ? "cuda elementwise" : "cpu elementwise");
}

static void test_elementwise(void **state) {
    (void)state;
    const int64_t rows_list[] = {1, 17, 64};
    const int64_t D = 1000;
    const char *names[] = {"rms_norm", "rms_norm (no w)", "add",        "add (row)",
                           "scale",    "swiglu",          "geglu_tanh", "add_rms_norm"};
    for (int kind = EW_RMS; kind <= EW_ADD_RMS; kind++) {
        for (size_t ri = 0; ri < 3; ri++) {
            for (int inplace = 0; inplace < 2; inplace++) {
                if (kind == EW_ADD_RMS && inplace) continue; /* out apart from x, by contract */
                const int64_t R = rows_list[ri];
                float *x = xmalloc((size_t)(R * D) * 4), *y = xmalloc((size_t)(R * D) * 4);
                float *w = xmalloc((size_t)D * 4);
                fill_acts(x, R * D, 3.0f);
                fill_acts(y, R * D, 1.0f);
                fill_rand(w, (size_t)D, 1.5f);
                loom_tensor gx = gpu_f32(x, D, R), gy = gpu_f32(y, D, R), gw = gpu_f32(w, D, 1);
                loom_tensor gout = inplace ? gx : gpu_f32(NULL, D, R);
                if (!inplace) gpu_poison(&gout);
                float *cx = xmalloc((size_t)(R * D) * 4);
                memcpy(cx, x, (size_t)(R * D) * 4);
                float *cref = inplace ? cx : host_f32(R * D);
                loom_tensor tx = cpu_view(cx, D, R), ty = cpu_view(y, D, R), tw = cpu_view(w, D, 1);
                loom_tensor tout = cpu_view(cref, D, R);
                run_ew(&g_gpu, (ew_kind)kind, &gx, &gy, &gw, &gout);
                run_ew(&g_cpu, (ew_kind)kind, &tx, &ty, &tw, &tout);
                float *got = host_f32(R * D);
                gpu_get(got, gout.data, (size_t)(R * D) * 4);
                char what[96];
                snprintf(what, sizeof what, "%s, %lld rows%s", names[kind], (long long)R,
                         inplace ? ", in place" : "");
                /* float32 with another order of the rms sum, and CUDA's expf/tanhf */
                expect_close(got, cref, (size_t)(R * D), 2e-6, what);
                if (kind == EW_ADD_RMS) { /* the sum left in x: one float add, the same bits */
                    gpu_get(got, gx.data, (size_t)(R * D) * 4);
                    if (memcmp(got, cx, (size_t)(R * D) * 4) != 0)
                        fail_msg("%s: the sum in x differs from the CPU's", what);
                }
                free(got);
                if (!inplace) free(cref);
                free(cx);
                free(x);
                free(y);
                free(w);
                gpu_free_all();
            }
        }
    }
}

/* norm_add_rms_norm (one launch on CUDA) against rms_norm of y then add_rms_norm on the same
 * device: the sum left in x and out the same bits; against the CPU's two ops within rms_norm's
 * 2e-6; then its refusals. (The kernel leaves y as it came: test_kernels_emu.) */
static void norm_add_rms_norm_case(int64_t R, int64_t D) {
    float *x = xmalloc((size_t)(R * D) * 4), *y = xmalloc((size_t)(R * D) * 4);
    float *wy = xmalloc((size_t)D * 4), *w = xmalloc((size_t)D * 4);
    fill_acts(x, R * D, 3.0f);
    fill_acts(y, R * D, 40.0f);
    fill_rand(wy, (size_t)D, 1.5f);
    fill_rand(w, (size_t)D, 1.5f);
    loom_tensor gx[2] = {gpu_f32(x, D, R), gpu_f32(x, D, R)};
    loom_tensor gy[2] = {gpu_f32(y, D, R), gpu_f32(y, D, R)};
    loom_tensor gwy = gpu_f32(wy, D, 1), gw = gpu_f32(w, D, 1);
    loom_tensor go[2] = {gpu_f32(NULL, D, R), gpu_f32(NULL, D, R)};
    gpu_poison(&go[0]);
    gpu_poison(&go[1]);
    expect_ok(g_gpu.ops->rms_norm(g_gpu.ctx, &gy[0], &gwy, 1e-6f, &gy[0]), "cuda rms_norm");
    expect_ok(g_gpu.ops->add_rms_norm(g_gpu.ctx, &gx[0], &gy[0], &gw, 1e-6f, &go[0]),
              "cuda add_rms_norm");
    expect_ok(g_gpu.ops->norm_add_rms_norm(g_gpu.ctx, &gx[1], &gy[1], &gwy, &gw, 1e-6f, &go[1]),
              "cuda norm_add_rms_norm");
    const size_t bytes = (size_t)(R * D) * 4;
    float *a = host_f32(R * D), *b = host_f32(R * D);
    gpu_get(a, gx[0].data, bytes);
    gpu_get(b, gx[1].data, bytes);
    if (memcmp(a, b, bytes) != 0) fail_msg("norm_add_rms_norm: the sum in x differs");
    gpu_get(a, go[0].data, bytes);
    gpu_get(b, go[1].data, bytes);
    if (memcmp(a, b, bytes) != 0) fail_msg("norm_add_rms_norm: out differs");
    /* the CPU's rms_norm, then add_rms_norm (or add and rms_norm) */
    loom_tensor ty = cpu_view(y, D, R), twy = cpu_view(wy, D, 1);
    expect_ok(g_cpu.ops->rms_norm(g_cpu.ctx, &ty, &twy, 1e-6f, &ty), "cpu rms_norm");
    float *ref = host_f32(R * D);
    loom_tensor tx = cpu_view(x, D, R), tw = cpu_view(w, D, 1), tout = cpu_view(ref, D, R);
    run_ew(&g_cpu, EW_ADD_RMS, &tx, &ty, &tw, &tout);
    expect_close(b, ref, (size_t)(R * D), 2e-6, "norm_add_rms_norm against the cpu");
    /* refusals */
    assert_int_equal(
        g_gpu.ops->norm_add_rms_norm(g_gpu.ctx, &gx[1], &gy[1], NULL, &gw, 1e-6f, &go[1]),
        LOOM_ERR_INVALID_ARG);
    loom_tensor short_wy = gwy;
    short_wy.ne[0] = D - 1;
    assert_int_equal(
        g_gpu.ops->norm_add_rms_norm(g_gpu.ctx, &gx[1], &gy[1], &short_wy, &gw, 1e-6f, &go[1]),
        LOOM_ERR_INVALID_ARG);
    assert_int_equal(
        g_gpu.ops->norm_add_rms_norm(g_gpu.ctx, &gx[1], &gy[1], &gwy, &gw, 1e-6f, &gx[1]),
        LOOM_ERR_INVALID_ARG);
    assert_int_equal(
        g_gpu.ops->norm_add_rms_norm(g_gpu.ctx, &gx[1], &gx[1], &gwy, &gw, 1e-6f, &go[1]),
        LOOM_ERR_INVALID_ARG);
    loom_tensor wy_in_x = loom_tensor_2d(LOOM_TYPE_F32, gx[1].data, D, 1, (size_t)D * 4);
    assert_int_equal(
        g_gpu.ops->norm_add_rms_norm(g_gpu.ctx, &gx[1], &gy[1], &wy_in_x, &gw, 1e-6f, &go[1]),
        LOOM_ERR_INVALID_ARG);
    free(a);
    free(b);
    free(ref);
    free(x);
    free(y);
    free(wy);
    free(w);
    gpu_free_all();
}

static void test_norm_add_rms_norm(void **state) {
    (void)state;
    if (g_gpu.ops->norm_add_rms_norm == NULL) {
        printf("SKIP: the %s backend has no norm_add_rms_norm\n", g_gpu_name);
        return;
    }
    norm_add_rms_norm_case(17, 1000);
    norm_add_rms_norm_case(1, 640); /* Gemma 3 270M's width */
    norm_add_rms_norm_case(64, 100);
}

static void test_rope(void **state) {
    (void)state;
    const int64_t T = 17;
    const int configs[][4] = {/* n_head, head_dim, n_rot, neox */
                              {8, 64, 64, 0},
                              {4, 128, 128, 1},
                              {2, 256, 256, 1},
                              {6, 96, 32, 0}};
    for (size_t ci = 0; ci < 4; ci++) {
        for (int factors = 0; factors < 2; factors++) {
            const int nh = configs[ci][0], hd = configs[ci][1], nrot = configs[ci][2];
            const int64_t D = (int64_t)nh * hd;
            float *x = xmalloc((size_t)(T * D) * 4), *ff = xmalloc((size_t)nrot / 2 * 4);
            fill_rand(x, (size_t)(T * D), 2.0f);
            for (int i = 0; i < nrot / 2; i++) ff[i] = 1.0f + 7.0f * (float)(rng_u64() % 100) / 100;
            int32_t pos[17];
            for (int i = 0; i < T; i++) pos[i] = (int32_t)(rng_u64() % 16384);
            pos[0] = 0;
            pos[1] = 16383;
            loom_rope_params p = {.mode = configs[ci][3] ? LOOM_ROPE_NEOX : LOOM_ROPE_NORMAL,
                                  .n_head = nh,
                                  .head_dim = hd,
                                  .n_rot = nrot,
                                  .theta_base = factors ? 500000.0f : 10000.0f,
                                  .freq_scale = factors ? 1.0f : 0.25f};
            loom_weight_src src = {.name = "rope_freqs.weight",
                                   .type = LOOM_TYPE_F32,
                                   .ne = {nrot / 2, 1},
                                   .row_stride = (size_t)nrot / 2 * 4,
                                   .data = ff,
                                   .persistent = true,
                                   .use = LOOM_WEIGHT_VECTOR};
            loom_tensor fc, fg;
            expect_ok(g_cpu.ops->weight_prepare(g_cpu.dev, &src, &fc), "cpu prepare");
            expect_ok(g_gpu.ops->weight_prepare(g_gpu.dev, &src, &fg), "cuda prepare");
            loom_tensor gx = gpu_f32(x, D, T);
            int32_t *dpos = gpu_alloc(sizeof pos);
            gpu_put(dpos, pos, sizeof pos);
            loom_tensor gpos = loom_tensor_2d(LOOM_TYPE_I32, dpos, T, 1, sizeof pos);
            loom_tensor cpos = loom_tensor_2d(LOOM_TYPE_I32, pos, T, 1, sizeof pos);
            loom_rope_params pg = p, pc = p;
            if (factors) {
                pg.freq_factors = fg.data;
                pc.freq_factors = fc.data;
            }
            expect_ok(g_gpu.ops->rope(g_gpu.ctx, &gx, &gpos, &pg), "cuda rope");
            loom_tensor cx = cpu_view(x, D, T);
            expect_ok(g_cpu.ops->rope(g_cpu.ctx, &cx, &cpos, &pc), "cpu rope");
            float *got = host_f32(T * D);
            gpu_get(got, gx.data, (size_t)(T * D) * 4);
            /* the same float factors (double-precision angles), a float multiply-add each */
            expect_close(got, x, (size_t)(T * D), 1e-6, "rope");
            free(got);
            free(x);
            free(ff);
            gpu_free_all();
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The paged KV cache: kv_store and attention                                                 */
/* ------------------------------------------------------------------------------------------ */

typedef struct attn_case {
    int32_t block_size, head_dim, n_kv_heads, group, window;
    float softcap;
    loom_type kv_type;
    int32_t n_seqs;
    const int32_t *kv_len; /* positions each sequence holds after the step */
    const int32_t *n_new;  /* its new rows this step */
} attn_case;

/* One descriptor over n_seqs sequences (rows: n_new of each at the end of its kv_len), blocks
 * from a shuffled pool; when hole, blocks wholly before a windowed sequence's first new row's
 * window are LOOM_KV_NO_BLOCK. */
typedef struct kv_layout {
    int32_t *indptr, *block_ids, *q_start, *pos_start, *kv_len;
    int32_t n_blocks, n_rows;
} kv_layout;

static void layout_make(const attn_case *c, bool history, bool hole, const int32_t *perm,
                        kv_layout *L) {
    const int32_t S = c->n_seqs, bs = c->block_size;
    L->indptr = xmalloc(sizeof(int32_t) * (size_t)(S + 1));
    L->q_start = xmalloc(sizeof(int32_t) * (size_t)(S + 1));
    L->pos_start = xmalloc(sizeof(int32_t) * (size_t)S);
    L->kv_len = xmalloc(sizeof(int32_t) * (size_t)S);
    int32_t nb = 0, rows = 0;
    for (int32_t s = 0; s < S; s++) nb += (c->kv_len[s] + bs - 1) / bs;
    L->block_ids = xmalloc(sizeof(int32_t) * (size_t)(nb ? nb : 1));
    L->n_blocks = nb + 3;
    int32_t at = 0;
    L->indptr[0] = L->q_start[0] = 0;
    for (int32_t s = 0; s < S; s++) {
        const int32_t len = c->kv_len[s], nnew = history ? len : c->n_new[s];
        const int32_t first = len - nnew;
        const int32_t lo = c->window > 0 && first - c->window + 1 > 0 ? first - c->window + 1 : 0;
        for (int32_t b = 0; b < (len + bs - 1) / bs; b++) {
            L->block_ids[at] = perm[at];
            if (hole && (b + 1) * bs <= lo) L->block_ids[at] = LOOM_KV_NO_BLOCK;
            at++;
        }
        L->indptr[s + 1] = at;
        L->pos_start[s] = first;
        L->kv_len[s] = len;
        rows += nnew;
        L->q_start[s + 1] = rows;
    }
    L->n_rows = rows;
}

static void layout_free(kv_layout *L) {
    free(L->indptr);
    free(L->block_ids);
    free(L->q_start);
    free(L->pos_start);
    free(L->kv_len);
}

static bool is_fp8(loom_type t) {
    return t == LOOM_TYPE_FP8_E4M3 || t == LOOM_TYPE_FP8_E5M2;
}

/* A page layout as the engine's (engine/kv_storage.h): a slot's values; FP8 blocks end with
 * their [block_size][n_kv_heads] float32 scales, each block rounded up to 16 bytes. */
typedef struct kv_geom {
    size_t token, block, scale_at, scale_token;
} kv_geom;

static kv_geom geom_of(const attn_case *c) {
    const size_t elt = c->kv_type == LOOM_TYPE_F32 ? 4 : is_fp8(c->kv_type) ? 1 : 2;
    kv_geom g = {.token = (size_t)c->n_kv_heads * (size_t)c->head_dim * elt};
    g.scale_at = g.token * (size_t)c->block_size;
    g.scale_token = is_fp8(c->kv_type) ? (size_t)c->n_kv_heads * sizeof(float) : 0;
    g.block = is_fp8(c->kv_type)
                  ? (g.scale_at + g.scale_token * (size_t)c->block_size + 15) & ~(size_t)15
                  : g.scale_at;
    return g;
}

/* ks, vs: the scale bases (block 0's scales) for FP8 pages; ignored otherwise. */
static loom_kv_desc desc_of(const attn_case *c, const kv_layout *L, void *const *kb,
                            void *const *vb, void *const *ks, void *const *vs) {
    const kv_geom g = geom_of(c);
    const bool fp8 = is_fp8(c->kv_type);
    return (loom_kv_desc){.n_seqs = c->n_seqs,
                          .indptr = L->indptr,
                          .block_ids = L->block_ids,
                          .q_start = L->q_start,
                          .pos_start = L->pos_start,
                          .kv_len = L->kv_len,
                          .block_size = c->block_size,
                          .n_blocks = L->n_blocks,
                          .n_kv_heads = c->n_kv_heads,
                          .head_dim = c->head_dim,
                          .window = c->window,
                          .kv_type = c->kv_type,
                          .layout = LOOM_KV_LAYOUT_NHD,
                          .token_stride = g.token,
                          .block_stride = g.block,
                          .n_layers = 1,
                          .k_base = kb,
                          .v_base = vb,
                          .layer_src = NULL,
                          .scale_kind = fp8 ? LOOM_KV_SCALE_PER_TOKEN_HEAD : LOOM_KV_SCALE_NONE,
                          .k_scale = fp8 ? ks : NULL,
                          .v_scale = fp8 ? vs : NULL,
                          .scale_token_stride = g.scale_token,
                          .scale_block_stride = fp8 ? g.block : 0};
}

static void step_begin(const loom__backend_stream *b, const loom_kv_desc *kv, int32_t rows) {
    if (b->ops->step_begin == NULL) return;
    loom_step_desc st = {.n_tokens = rows, .n_kv = 1, .kv = kv};
    expect_ok(b->ops->step_begin(b->ctx, &st), "step_begin");
}

/* Each sequence's keys, values and queries from a seed of its own (its index and length), so
 * the same sequence gets the same data in any batch. */
static void fill_seq(float *dst, int64_t rows, int64_t width, float scale, uint64_t seed) {
    const uint64_t saved = g_rng;
    g_rng = seed;
    fill_rand(dst, (size_t)(rows * width), scale);
    g_rng = saved;
}

/* Runs one case; where capture is given, the output rows of sequence 0 are copied into it. */
static void run_attn_case(const attn_case *c, const char *label, float *capture) {
    const int32_t hd = c->head_dim, nkv = c->n_kv_heads, nh = nkv * c->group;
    const int64_t kvd = (int64_t)nkv * hd, qd = (int64_t)nh * hd;
    kv_layout H, L;
    /* a shuffled pool: sequences' blocks scattered */
    int32_t total = 0;
    for (int32_t s = 0; s < c->n_seqs; s++)
        total += (c->kv_len[s] + c->block_size - 1) / c->block_size;
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)(total + 3));
    for (int32_t i = 0; i < total + 3; i++) perm[i] = i;
    for (int32_t i = total + 2; i > 0; i--) {
        int32_t j = (int32_t)(rng_u64() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    layout_make(c, true, false, perm, &H);
    layout_make(c, false, c->window > 0, perm, &L);
    const kv_geom geo = geom_of(c);
    const size_t pool = (size_t)H.n_blocks * geo.block;
    void *gk = gpu_alloc(pool), *gv = gpu_alloc(pool);
    void *ck = xmalloc(pool), *cv = xmalloc(pool);
    void *gkb[1] = {gk}, *gvb[1] = {gv}, *ckb[1] = {ck}, *cvb[1] = {cv};
    void *gks[1] = {(char *)gk + geo.scale_at}, *gvs[1] = {(char *)gv + geo.scale_at};
    void *cks[1] = {(char *)ck + geo.scale_at}, *cvs[1] = {(char *)cv + geo.scale_at};

    /* Step 1: every position's K and V stored (no attention). */
    float *kh = xmalloc((size_t)(H.n_rows * kvd) * 4), *vh = xmalloc((size_t)(H.n_rows * kvd) * 4);
    for (int32_t s = 0; s < c->n_seqs; s++) {
        const uint64_t seed = 0x9000ull + (uint64_t)s * 1000003ull + (uint64_t)c->kv_len[s];
        fill_seq(kh + (int64_t)H.q_start[s] * kvd, c->kv_len[s], kvd, 2.0f, seed);
        fill_seq(vh + (int64_t)H.q_start[s] * kvd, c->kv_len[s], kvd, 1.0f, seed + 1);
    }
    loom_kv_desc dg = desc_of(c, &H, gkb, gvb, gks, gvs), dc = desc_of(c, &H, ckb, cvb, cks, cvs);
    expect_ok(loom__kv_desc_check(&dc, H.n_rows), "descriptor (history)");
    step_begin(&g_gpu, &dg, H.n_rows);
    loom_tensor gkt = gpu_f32(kh, kvd, H.n_rows), gvt = gpu_f32(vh, kvd, H.n_rows);
    expect_ok(g_gpu.ops->kv_store(g_gpu.ctx, &gkt, &gvt, &dg, 0), "cuda kv_store");
    loom_tensor ckt = cpu_view(kh, kvd, H.n_rows), cvt = cpu_view(vh, kvd, H.n_rows);
    expect_ok(g_cpu.ops->kv_store(g_cpu.ctx, &ckt, &cvt, &dc, 0), "cpu kv_store");
    /* the pools hold the same bits (the same conversion) where the CPU wrote */
    {
        uint8_t *gp = xmalloc(pool), *gq = xmalloc(pool);
        gpu_get(gp, gk, pool);
        gpu_get(gq, gv, pool);
        for (int32_t s = 0; s < c->n_seqs; s++) {
            for (int32_t p = 0; p < c->kv_len[s]; p += 1 + p / 7) {
                int32_t blk = H.block_ids[H.indptr[s] + p / c->block_size];
                const size_t slot = (size_t)(p % c->block_size);
                size_t off = (size_t)blk * geo.block + slot * geo.token;
                if (memcmp(gp + off, (uint8_t *)ck + off, geo.token) != 0 ||
                    memcmp(gq + off, (uint8_t *)cv + off, geo.token) != 0)
                    fail_msg("%s: kv_store of sequence %d position %d differs", label, s, p);
                /* FP8: the scales too, bit for bit */
                size_t soff = (size_t)blk * geo.block + geo.scale_at + slot * geo.scale_token;
                if (memcmp(gp + soff, (uint8_t *)ck + soff, geo.scale_token) != 0 ||
                    memcmp(gq + soff, (uint8_t *)cv + soff, geo.scale_token) != 0)
                    fail_msg("%s: the scales of sequence %d position %d differ", label, s, p);
            }
        }
        free(gp);
        free(gq);
    }

    /* Step 2: the new rows again (stored again, the same values) and attention. */
    float *q = xmalloc((size_t)(L.n_rows * qd) * 4);
    for (int32_t s = 0; s < c->n_seqs; s++)
        fill_seq(q + (int64_t)L.q_start[s] * qd, c->n_new[s], qd, 1.5f,
                 0x7000ull + (uint64_t)s * 1000003ull + (uint64_t)c->kv_len[s]);
    float *kn = xmalloc((size_t)(L.n_rows * kvd) * 4), *vn = xmalloc((size_t)(L.n_rows * kvd) * 4);
    for (int32_t s = 0, r = 0; s < c->n_seqs; s++)
        for (int32_t i = 0; i < c->n_new[s]; i++, r++) {
            int32_t hr = H.q_start[s] + L.pos_start[s] + i;
            memcpy(kn + r * kvd, kh + hr * kvd, (size_t)kvd * 4);
            memcpy(vn + r * kvd, vh + hr * kvd, (size_t)kvd * 4);
        }
    dg = desc_of(c, &L, gkb, gvb, gks, gvs);
    dc = desc_of(c, &L, ckb, cvb, cks, cvs);
    expect_ok(loom__kv_desc_check(&dc, L.n_rows), "descriptor (step)");
    step_begin(&g_gpu, &dg, L.n_rows);
    loom_tensor gkn = gpu_f32(kn, kvd, L.n_rows), gvn = gpu_f32(vn, kvd, L.n_rows);
    expect_ok(g_gpu.ops->kv_store(g_gpu.ctx, &gkn, &gvn, &dg, 0), "cuda kv_store");
    loom_tensor ckn = cpu_view(kn, kvd, L.n_rows), cvn = cpu_view(vn, kvd, L.n_rows);
    expect_ok(g_cpu.ops->kv_store(g_cpu.ctx, &ckn, &cvn, &dc, 0), "cpu kv_store");
    loom_attn_params ap = {
        .n_head = nh, .layer = 0, .scale = 1.0f / sqrtf((float)hd), .softcap = c->softcap};
    loom_tensor gq = gpu_f32(q, qd, L.n_rows), gout = gpu_f32(NULL, qd, L.n_rows);
    gpu_poison(&gout);
    expect_ok(g_gpu.ops->attention(g_gpu.ctx, &gq, &dg, &ap, &gout), "cuda attention");
    float *ref = host_f32(L.n_rows * qd), *got = host_f32(L.n_rows * qd);
    loom_tensor cq = cpu_view(q, qd, L.n_rows), cout = cpu_view(ref, qd, L.n_rows);
    expect_ok(g_cpu.ops->attention(g_cpu.ctx, &cq, &dc, &ap, &cout), "cpu attention");
    gpu_get(got, gout.data, (size_t)(L.n_rows * qd) * 4);
    if (capture) memcpy(capture, got, (size_t)((int64_t)c->n_new[0] * qd) * 4);
    for (int32_t r = 0; r < L.n_rows; r++) {
        double e = norm_err(got + r * qd, ref + r * qd, (size_t)qd);
        if (!(e <= TOL(2e-5, 0x1p-5))) {
            int32_t s = 0;
            while (L.q_start[s + 1] <= r) s++;
            fail_msg("%s: row %d (sequence %d, position %d of %d) normalised error %.3g", label, r,
                     s, L.pos_start[s] + r - L.q_start[s], c->kv_len[s], e);
        }
    }
    free(ref);
    free(got);
    free(q);
    free(kn);
    free(vn);
    free(kh);
    free(vh);
    free(ck);
    free(cv);
    free(perm);
    layout_free(&H);
    layout_free(&L);
    gpu_free_all();
}

/* Batch invariance: a sequence's attention is the same bits alone (batch 1), among 17 others
 * and among 63 others — wherever its blocks sit in the pool — since its splits depend on its
 * own length only; and a prefill sequence's, whose kernel and tiles depend on its own rows only.
 * (In the CPU stand-in, whose split plan follows the thread count and the batch, within the
 * tolerance instead.) */
static void test_attention_batches(void **state) {
    (void)state;
    const int32_t hd = 128, nkv = 2, group = 4, qd = nkv * group * hd;
    static int32_t lens[64], news[64];
    float *alone = host_f32(qd), *in_batch = host_f32(qd);
    const int32_t sizes[] = {1, 18, 64};
    for (int bi = 0; bi < 3; bi++) {
        for (int32_t s = 0; s < sizes[bi]; s++) {
            lens[s] = s == 0 ? 4099 : 1 + (int32_t)((s * 7919) % 2000);
            news[s] = 1;
        }
        attn_case c = {.block_size = 16,
                       .head_dim = hd,
                       .n_kv_heads = nkv,
                       .group = group,
                       .kv_type = LOOM_TYPE_F16,
                       .n_seqs = sizes[bi],
                       .kv_len = lens,
                       .n_new = news};
        char label[64];
        snprintf(label, sizeof label, "attention, batch of %d", sizes[bi]);
        run_attn_case(&c, label, bi == 0 ? alone : in_batch);
        if (bi == 0) continue;
        if (strcmp(g_gpu_name, "cuda") == 0) {
            if (memcmp(alone, in_batch, (size_t)qd * 4) != 0)
                fail_msg("attention of a 4099-position sequence differs alone and in a batch of %d",
                         sizes[bi]);
        } else {
            expect_close(in_batch, alone, (size_t)qd, 2e-5, label);
        }
    }
    free(alone);
    free(in_batch);
    /* Prefill rows (the tiled kernel on CUDA): 100 new rows after 97 cached, alone, then beside
     * decode rows, a sequence just under the prefill threshold and another prefill sequence. */
    static const int32_t p_lens[] = {197, 54, 20, 300, 1, 4099 + 1};
    static const int32_t p_news[] = {100, 1, 15, 40, 1, 1};
    alone = host_f32(100 * (int64_t)qd);
    in_batch = host_f32(100 * (int64_t)qd);
    for (int bi = 0; bi < 2; bi++) {
        attn_case c = {.block_size = 16,
                       .head_dim = hd,
                       .n_kv_heads = nkv,
                       .group = group,
                       .kv_type = LOOM_TYPE_F16,
                       .n_seqs = bi == 0 ? 1 : 6,
                       .kv_len = p_lens,
                       .n_new = p_news};
        const char *label = bi == 0 ? "prefill attention alone" : "prefill attention in a batch";
        run_attn_case(&c, label, bi == 0 ? alone : in_batch);
    }
    if (strcmp(g_gpu_name, "cuda") == 0) {
        if (memcmp(alone, in_batch, (size_t)(100 * (int64_t)qd) * 4) != 0)
            fail_msg("prefill attention of 100 rows differs alone and in a batch");
    } else {
        expect_close(in_batch, alone, (size_t)(100 * (int64_t)qd), 2e-5, "prefill in a batch");
    }
    free(alone);
    free(in_batch);
}

/* Prefill in one step: sequences with 16 or more new rows (the tiled tensor-core kernel on
 * CUDA, loom_kernels.h's LOOM_K_ATTN_PREFILL_ROWS) after 0, 54, 97 and 4099 cached positions,
 * row counts off the kernel's tiles of 64 / group rows (17, 100, 300; 64 a whole number of them),
 * beside one sequence at the threshold, one just under it and a decode row (split-KV). Nine cases
 * of an orthogonal array over block size, head size, group and page type: each pair of those
 * meets once; windows and soft-capping alternate. The 4099-position sequence (its rows past
 * position 4000, where the planted off-by-one strikes) and the 300 rows only in the three cases
 * of 16-position blocks (the engine's), whose head sizes, groups and page types all differ. */
static void attn_prefill_sweep(void) {
    static const int32_t lens[] = {54 + 64, 97 + 100, 17, 40 + 16, 5 + 15, 33, 300, 4099 + 17};
    static const int32_t news[] = {64, 100, 17, 16, 15, 1, 300, 17};
    const int32_t block_sizes[] = {1, 8, 16}, head_dims[] = {64, 128, 256}, groups[] = {1, 4, 8};
    const loom_type kv_types[] = {LOOM_TYPE_F16, LOOM_TYPE_BF16, LOOM_TYPE_FP8_E4M3};
    for (int k = 0; k < 9; k++) {
        const int a = k / 3, b = k % 3;
        const int32_t group = groups[(a + b) % 3];
        attn_case c = {.block_size = block_sizes[a],
                       .head_dim = head_dims[b],
                       .n_kv_heads = group == 8 ? 1 : 2,
                       .group = group,
                       .window = k % 3 == 1 ? 37 : (k % 3 == 2 ? 1000 : 0),
                       .softcap = k % 2 ? 30.0f : 0.0f,
                       .kv_type = kv_types[(a + 2 * b) % 3],
                       .n_seqs = a == 2 ? 8 : 6,
                       .kv_len = lens,
                       .n_new = news};
        char label[160];
        snprintf(label, sizeof label,
                 "prefill attention bs=%d hd=%d kv_heads=%d group=%d window=%d softcap=%g %s",
                 c.block_size, c.head_dim, c.n_kv_heads, c.group, c.window, (double)c.softcap,
                 loom__type_name(c.kv_type));
        run_attn_case(&c, label, NULL);
    }
}

static void test_attention(void **state) {
    (void)state;
    /* 17 decoding sequences of awkward lengths, one chunked-prefill sequence (64 new rows after
     * 33 cached), and one whose only row is its first position */
    static const int32_t lens[] = {1,   54, 97, 4099, 2,  17, 255,  256, 257, 513,
                                   600, 33, 8,  9,    16, 31, 1000, 97,  1};
    static const int32_t news[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 64, 1};
    const int32_t n_seqs = (int32_t)(sizeof lens / sizeof lens[0]);
    const int32_t block_sizes[] = {1, 8, 16};
    const int32_t head_dims[] = {64, 128, 256};
    const int32_t groups[] = {1, 4, 8};
    const loom_type kv_types[] = {LOOM_TYPE_F16, LOOM_TYPE_F32, LOOM_TYPE_FP8_E4M3};
    int n = 0;
    for (int bi = 0; bi < 3; bi++)
        for (int hi = 0; hi < 3; hi++)
            for (int gi = 0; gi < 3; gi++) {
                /* windows and soft-capping alternate over the sweep */
                attn_case c = {.block_size = block_sizes[bi],
                               .head_dim = head_dims[hi],
                               .n_kv_heads = groups[gi] == 8 ? 1 : 2,
                               .group = groups[gi],
                               .window = (n % 3 == 1) ? 37 : (n % 3 == 2 ? 600 : 0),
                               .softcap = (n % 2) ? 30.0f : 0.0f,
                               .kv_type = kv_types[(bi + hi + gi) % 3],
                               .n_seqs = n_seqs,
                               .kv_len = lens,
                               .n_new = news};
                char label[160];
                snprintf(label, sizeof label,
                         "attention bs=%d hd=%d kv_heads=%d group=%d window=%d softcap=%g %s",
                         c.block_size, c.head_dim, c.n_kv_heads, c.group, c.window,
                         (double)c.softcap, loom__type_name(c.kv_type));
                run_attn_case(&c, label, NULL);
                n++;
            }
    /* One long context: 16384 positions, head_dim 128, GQA 4, f16 pages; a decode row and 17
     * prefill rows at the end (the tiled kernel on CUDA). */
    static const int32_t long_len[] = {16384, 16384};
    static const int32_t long_new[] = {1, 17};
    attn_case c = {.block_size = 16,
                   .head_dim = 128,
                   .n_kv_heads = 2,
                   .group = 4,
                   .window = 0,
                   .softcap = 0.0f,
                   .kv_type = LOOM_TYPE_F16,
                   .n_seqs = 2,
                   .kv_len = long_len,
                   .n_new = long_new};
    run_attn_case(&c, "attention 16384 positions", NULL);
    /* Head sizes that are not a multiple of 32 and groups that are not powers of two: the
     * kernels' partial-lane and partial-group paths. */
    static const int32_t odd[][4] = {{8, 96, 1, 7}, {16, 80, 2, 3}, {1, 40, 3, 5}};
    for (int i = 0; i < 3; i++) {
        attn_case o = {.block_size = odd[i][0],
                       .head_dim = odd[i][1],
                       .n_kv_heads = odd[i][2],
                       .group = odd[i][3],
                       .window = i == 1 ? 37 : 0,
                       .softcap = i == 2 ? 50.0f : 0.0f,
                       .kv_type = i == 0   ? LOOM_TYPE_F32
                                  : i == 1 ? LOOM_TYPE_F16
                                           : LOOM_TYPE_FP8_E5M2,
                       .n_seqs = n_seqs,
                       .kv_len = lens,
                       .n_new = news};
        char label[96];
        snprintf(label, sizeof label, "attention hd=%d group=%d kv_heads=%d", o.head_dim, o.group,
                 o.n_kv_heads);
        run_attn_case(&o, label, NULL);
    }
    attn_prefill_sweep();
}

/* norm_rope_store (one launch on CUDA) against the separate ops it stands for on the same
 * device: q, k and both pools (every byte, those neither wrote included) the same bits; q and k
 * against the CPU's separate ops within rope's 1e-6. Then its refusals. */
static void norm_rope_store_case(int32_t nh, int32_t nkv, int32_t hd, int32_t n_rot, bool neox,
                                 bool norms, loom_type kv_type, int32_t bs, bool long_step) {
    /* a short step (a block per row and kv head), or one of 531 rows (several kv heads a
     * block where that still leaves 1,024 blocks: 4 kv heads, 2 a block) */
    static const int32_t lens[] = {1, 40, 19, 70, 300}, long_lens[] = {600, 3};
    static const int32_t news[] = {1, 13, 19, 2, 1}, long_news[] = {530, 1};
    const attn_case c = {.block_size = bs,
                         .head_dim = hd,
                         .n_kv_heads = nkv,
                         .group = nh / nkv,
                         .kv_type = kv_type,
                         .n_seqs = long_step ? 2 : 5,
                         .kv_len = long_step ? long_lens : lens,
                         .n_new = long_step ? long_news : news};
    char label[128];
    snprintf(label, sizeof label, "norm_rope_store %d/%d heads of %d, n_rot %d%s%s, %s pages%s", nh,
             nkv, hd, n_rot, neox ? " neox" : "", norms ? " normed" : "", loom__type_name(kv_type),
             long_step ? ", 531 rows" : "");
    int32_t total = 0;
    for (int32_t s = 0; s < c.n_seqs; s++) total += (c.kv_len[s] + bs - 1) / bs;
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)(total + 3));
    for (int32_t i = 0; i < total + 3; i++) perm[i] = (i * 7 + 3) % (total + 3);
    kv_layout L;
    layout_make(&c, false, false, perm, &L);
    const int64_t T = L.n_rows, qd = (int64_t)nh * hd, kd = (int64_t)nkv * hd;
    const kv_geom geo = geom_of(&c);
    const size_t pool = (size_t)L.n_blocks * geo.block;
    uint8_t *poison = xmalloc(pool);
    memset(poison, 0xff, pool);
    void *pk[2], *pv[2];
    for (int i = 0; i < 2; i++) {
        pk[i] = gpu_alloc(pool);
        pv[i] = gpu_alloc(pool);
        gpu_put(pk[i], poison, pool);
        gpu_put(pv[i], poison, pool);
    }
    float *q = xmalloc((size_t)(T * qd) * 4), *k = xmalloc((size_t)(T * kd) * 4),
          *v = xmalloc((size_t)(T * kd) * 4), *qn = xmalloc((size_t)hd * 4),
          *kn = xmalloc((size_t)hd * 4);
    fill_rand(q, (size_t)(T * qd), 3.0f);
    fill_rand(k, (size_t)(T * kd), 3.0f);
    fill_rand(v, (size_t)(T * kd), 3.0f);
    for (int32_t i = 0; i < hd; i++) {
        qn[i] = 1.0f + 0.5f * rng_f();
        kn[i] = 1.0f + 0.5f * rng_f();
    }
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)T);
    for (int32_t s = 0, r = 0; s < c.n_seqs; s++)
        for (int32_t i = 0; i < c.n_new[s]; i++, r++) pos[r] = L.pos_start[s] + i;
    int32_t *dpos = gpu_alloc(sizeof(int32_t) * (size_t)T);
    gpu_put(dpos, pos, sizeof(int32_t) * (size_t)T);
    const loom_tensor gpos = loom_tensor_2d(LOOM_TYPE_I32, dpos, T, 1, sizeof(int32_t) * (size_t)T);
    const loom_tensor cpos = loom_tensor_2d(LOOM_TYPE_I32, pos, T, 1, sizeof(int32_t) * (size_t)T);
    loom_weight_src qs = {.name = "q_norm.weight",
                          .type = LOOM_TYPE_F32,
                          .ne = {hd, 1},
                          .row_stride = (size_t)hd * 4,
                          .data = qn,
                          .persistent = true,
                          .use = LOOM_WEIGHT_VECTOR},
                    ks = qs;
    ks.data = kn;
    loom_tensor gqn, gkn;
    expect_ok(g_gpu.ops->weight_prepare(g_gpu.dev, &qs, &gqn), "cuda prepare");
    expect_ok(g_gpu.ops->weight_prepare(g_gpu.dev, &ks, &gkn), "cuda prepare");
    const loom_rope_params p = {.mode = neox ? LOOM_ROPE_NEOX : LOOM_ROPE_NORMAL,
                                .n_head = nh,
                                .head_dim = hd,
                                .n_rot = n_rot,
                                .theta_base = 10000.0f,
                                .freq_scale = 1.0f};
    loom_rope_params pk_ = p;
    pk_.n_head = nkv;
    loom_tensor gq[2], gk[2];
    for (int i = 0; i < 2; i++) {
        gq[i] = gpu_f32(q, qd, T);
        gk[i] = gpu_f32(k, kd, T);
    }
    const loom_tensor gv = gpu_f32(v, kd, T);
    void *kb0[1] = {pk[0]}, *vb0[1] = {pv[0]}, *kb1[1] = {pk[1]}, *vb1[1] = {pv[1]};
    void *ks0[1] = {(char *)pk[0] + geo.scale_at}, *vs0[1] = {(char *)pv[0] + geo.scale_at};
    void *ks1[1] = {(char *)pk[1] + geo.scale_at}, *vs1[1] = {(char *)pv[1] + geo.scale_at};
    const loom_kv_desc d0 = desc_of(&c, &L, kb0, vb0, ks0, vs0);
    const loom_kv_desc d1 = desc_of(&c, &L, kb1, vb1, ks1, vs1);

    /* the separate ops */
    step_begin(&g_gpu, &d0, (int32_t)T);
    if (norms) {
        loom_tensor qh = loom_tensor_2d(LOOM_TYPE_F32, gq[0].data, hd, T * nh, (size_t)hd * 4);
        loom_tensor kh = loom_tensor_2d(LOOM_TYPE_F32, gk[0].data, hd, T * nkv, (size_t)hd * 4);
        expect_ok(g_gpu.ops->rms_norm(g_gpu.ctx, &qh, &gqn, 1e-6f, &qh), label);
        expect_ok(g_gpu.ops->rms_norm(g_gpu.ctx, &kh, &gkn, 1e-6f, &kh), label);
    }
    expect_ok(g_gpu.ops->rope(g_gpu.ctx, &gq[0], &gpos, &p), label);
    expect_ok(g_gpu.ops->rope(g_gpu.ctx, &gk[0], &gpos, &pk_), label);
    expect_ok(g_gpu.ops->kv_store(g_gpu.ctx, &gk[0], &gv, &d0, 0), label);
    /* the one op */
    step_begin(&g_gpu, &d1, (int32_t)T);
    expect_ok(g_gpu.ops->norm_rope_store(g_gpu.ctx, &gq[1], &gk[1], &gv, norms ? &gqn : NULL,
                                         norms ? &gkn : NULL, 1e-6f, &gpos, &p, &d1, 0),
              label);

    float *a = host_f32(T * qd), *b = host_f32(T * qd);
    gpu_get(a, gq[0].data, (size_t)(T * qd) * 4);
    gpu_get(b, gq[1].data, (size_t)(T * qd) * 4);
    if (memcmp(a, b, (size_t)(T * qd) * 4) != 0)
        fail_msg("%s: q differs from the separate ops'", label);
    /* against the CPU's separate ops */
    loom_tensor cq = cpu_view(q, qd, T), ck = cpu_view(k, kd, T);
    if (norms) {
        loom_tensor qh = cpu_view(q, hd, T * nh), kh = cpu_view(k, hd, T * nkv);
        loom_tensor cqn = cpu_view(qn, hd, 1), ckn = cpu_view(kn, hd, 1);
        expect_ok(g_cpu.ops->rms_norm(g_cpu.ctx, &qh, &cqn, 1e-6f, &qh), "cpu rms_norm");
        expect_ok(g_cpu.ops->rms_norm(g_cpu.ctx, &kh, &ckn, 1e-6f, &kh), "cpu rms_norm");
    }
    expect_ok(g_cpu.ops->rope(g_cpu.ctx, &cq, &cpos, &p), "cpu rope");
    expect_ok(g_cpu.ops->rope(g_cpu.ctx, &ck, &cpos, &pk_), "cpu rope");
    expect_close(b, q, (size_t)(T * qd), 1e-6, label);
    gpu_get(a, gk[0].data, (size_t)(T * kd) * 4);
    gpu_get(b, gk[1].data, (size_t)(T * kd) * 4);
    if (memcmp(a, b, (size_t)(T * kd) * 4) != 0)
        fail_msg("%s: k differs from the separate ops'", label);
    expect_close(b, k, (size_t)(T * kd), 1e-6, label);
    uint8_t *p0 = xmalloc(pool), *p1 = xmalloc(pool);
    for (int w = 0; w < 2; w++) {
        gpu_get(p0, w ? pv[0] : pk[0], pool);
        gpu_get(p1, w ? pv[1] : pk[1], pool);
        if (memcmp(p0, p1, pool) != 0)
            fail_msg("%s: the %c pool differs from kv_store's", label, "KV"[w]);
        if (memcmp(p1, poison, pool) == 0) fail_msg("%s: nothing was stored", label);
    }

    /* refusals: nothing launched, a clear status */
    loom_tensor wide = gk[1]; /* a kv head too many */
    wide.ne[0] = kd + hd;
    wide.row_stride = (size_t)(kd + hd) * 4;
    assert_int_equal(g_gpu.ops->norm_rope_store(g_gpu.ctx, &gq[1], &wide, &gv, NULL, NULL, 1e-6f,
                                                &gpos, &p, &d1, 0),
                     LOOM_ERR_INVALID_ARG);
    loom_tensor k_in_q = loom_tensor_2d(LOOM_TYPE_F32, gq[1].data, kd, T, (size_t)kd * 4);
    assert_int_equal(g_gpu.ops->norm_rope_store(g_gpu.ctx, &gq[1], &k_in_q, &gv, NULL, NULL, 1e-6f,
                                                &gpos, &p, &d1, 0),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(g_gpu.ops->norm_rope_store(g_gpu.ctx, NULL, &gk[1], &gv, NULL, NULL, 1e-6f,
                                                &gpos, &p, &d1, 0),
                     LOOM_ERR_INVALID_ARG);
    loom_tensor pos_in_q =
        loom_tensor_2d(LOOM_TYPE_I32, gq[1].data, T, 1, sizeof(int32_t) * (size_t)T);
    assert_int_equal(g_gpu.ops->norm_rope_store(g_gpu.ctx, &gq[1], &gk[1], &gv, NULL, NULL, 1e-6f,
                                                &pos_in_q, &p, &d1, 0),
                     LOOM_ERR_INVALID_ARG);
    loom_tensor short_norm = gqn;
    short_norm.ne[0] = hd - 2;
    assert_int_equal(g_gpu.ops->norm_rope_store(g_gpu.ctx, &gq[1], &gk[1], &gv, &short_norm, NULL,
                                                1e-6f, &gpos, &p, &d1, 0),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(g_gpu.ops->norm_rope_store(g_gpu.ctx, &gq[1], &gk[1], &gv, NULL, NULL, 1e-6f,
                                                &gpos, &p, &d1, 1),
                     LOOM_ERR_INVALID_ARG);
    free(p0);
    free(p1);
    free(a);
    free(b);
    free(q);
    free(k);
    free(v);
    free(qn);
    free(kn);
    free(pos);
    free(poison);
    free(perm);
    layout_free(&L);
    gpu_free_all();
}

static void test_norm_rope_store(void **state) {
    (void)state;
    if (g_gpu.ops->norm_rope_store == NULL) {
        printf("SKIP: the %s backend has no norm_rope_store\n", g_gpu_name);
        return;
    }
    norm_rope_store_case(8, 2, 64, 64, false, false, LOOM_TYPE_F16, 16, false); /* llama */
    norm_rope_store_case(8, 2, 64, 64, false, false, LOOM_TYPE_F16, 16, true);
    norm_rope_store_case(16, 4, 64, 64, true, true, LOOM_TYPE_BF16, 16, true);  /* 2 kv a block */
    norm_rope_store_case(4, 1, 256, 256, true, true, LOOM_TYPE_BF16, 8, false); /* Gemma 3 */
    norm_rope_store_case(6, 2, 128, 128, true, true, LOOM_TYPE_F32, 1, true);   /* Qwen 3 */
    norm_rope_store_case(4, 4, 96, 32, false, true, LOOM_TYPE_F16, 16, false);  /* partial */
    /* FP8 pages: kv_store's kernel after the launch */
    norm_rope_store_case(8, 2, 128, 128, true, true, LOOM_TYPE_FP8_E4M3, 16, false);
}

/* ------------------------------------------------------------------------------------------ */
/* Copies                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static void test_copy_batch(void **state) {
    (void)state;
    const size_t n = 1 << 16;
    uint8_t *host = xmalloc(n), *back = xmalloc(n);
    for (size_t i = 0; i < n; i++) host[i] = (uint8_t)rng_u64();
    uint8_t *a = gpu_alloc(n), *b = gpu_alloc(n);
    gpu_put(a, host, n);
    void *pinned = NULL;
    expect_ok(g_gpu.ops->host_alloc(g_gpu.dev, n, &pinned), "host_alloc");
    /* blocks of 4 KiB reversed a -> b, then b -> pinned host, then host -> a shifted */
    loom_copy_range r[16];
    for (int i = 0; i < 16; i++)
        r[i] = (loom_copy_range){a + (size_t)i * 4096, b + (size_t)(15 - i) * 4096, 4096};
    expect_ok(g_gpu.ops->copy_batch(g_gpu.ctx, LOOM_COPY_DEVICE, r, 16), "copy device");
    for (int i = 0; i < 16; i++)
        r[i] = (loom_copy_range){b + (size_t)i * 4096, (uint8_t *)pinned + (size_t)i * 4096, 4096};
    expect_ok(g_gpu.ops->copy_batch(g_gpu.ctx, LOOM_COPY_TO_HOST, r, 16), "copy to host");
    expect_ok(g_gpu.ops->synchronize(g_gpu.ctx), "synchronize");
    for (int i = 0; i < 16; i++)
        assert_memory_equal((uint8_t *)pinned + (size_t)i * 4096, host + (size_t)(15 - i) * 4096,
                            4096);
    for (int i = 0; i < 16; i++)
        r[i] = (loom_copy_range){(uint8_t *)pinned + (size_t)i * 4096, a + (size_t)i * 4096, 4096};
    expect_ok(g_gpu.ops->copy_batch(g_gpu.ctx, LOOM_COPY_FROM_HOST, r, 16), "copy from host");
    gpu_get(back, a, n);
    for (int i = 0; i < 16; i++)
        assert_memory_equal(back + (size_t)i * 4096, host + (size_t)(15 - i) * 4096, 4096);
    /* bad arguments: a status, no crash */
    assert_int_equal(g_gpu.ops->copy_batch(g_gpu.ctx, (loom_copy_kind)9, r, 1),
                     LOOM_ERR_INVALID_ARG);
    r[0].src = NULL;
    assert_int_equal(g_gpu.ops->copy_batch(g_gpu.ctx, LOOM_COPY_DEVICE, r, 1),
                     LOOM_ERR_INVALID_ARG);
    size_t fr = 0, tot = 0;
    expect_ok(g_gpu.ops->memory_info(g_gpu.dev, &fr, &tot), "memory_info");
    assert_true(fr > 0 && fr <= tot);
    g_gpu.ops->host_free(g_gpu.dev, pinned);
    free(host);
    free(back);
    gpu_free_all();
}

/* ------------------------------------------------------------------------------------------ */
/* Sampling from summaries                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* The stand-in's slot: each row through tensor_get and the host's summarizer (with the row's
 * edits), with the checks the CUDA op makes; edited rows are written back, as the op edits
 * them in place. */
static loom_status standin_summary(void *stream, const loom_tensor *logits, int32_t n_top,
                                   const loom_logit_edits *edits, loom_logit_summary *sum,
                                   loom_logit_cand *top, loom_logit_summary *raw_sum,
                                   loom_logit_cand *raw_top, float *edit_raw) {
    if (logits->type != LOOM_TYPE_F32 || n_top < 1 || n_top > LOOM_LOGIT_SUMMARY_MAX_TOP)
        return LOOM_ERR_INVALID_ARG;
    const int64_t V = logits->ne[0];
    float *row = malloc((size_t)V * 4), *edited = malloc((size_t)V * 4);
    loom_status st = row && edited ? LOOM_OK : LOOM_ERR_OUT_OF_MEMORY;
    for (int64_t r = 0; st == LOOM_OK && r < logits->ne[1]; r++) {
        char *at = (char *)logits->data + r * logits->row_stride;
        st = g_gpu.ops->tensor_get(stream, row, at, (size_t)V * 4);
        if (st != LOOM_OK) break;
        const loom_logit_edits *e = edits ? &edits[r] : NULL;
        loom__sample_logits_summarize_edited(
            row, (int32_t)V, n_top, e, edited, &sum[r], top + r * n_top,
            raw_sum ? &raw_sum[r] : NULL, raw_top ? raw_top + r * n_top : NULL,
            edit_raw ? edit_raw + r * LOOM_LOGIT_SUMMARY_MAX_EDITS : NULL);
        if (e != NULL && e->n_bias + e->n_pen > 0) {
            st = g_gpu.ops->tensor_set(stream, at, edited, (size_t)V * 4);
            if (st == LOOM_OK) st = g_gpu.ops->synchronize(stream);
        }
    }
    free(row);
    free(edited);
    return st;
}

/* One row's summary on the backend against the host's: counts, arg max, max and the top list
 * exactly (ids and bits); the float64 sums to 1e-12 of themselves (only their order differs). */
static void expect_summary(const loom_logit_summary *s, const loom_logit_cand *st,
                           const loom_logit_summary *want, const loom_logit_cand *wt,
                           const char *what) {
    if (s->n_finite != want->n_finite || s->n_posinf != want->n_posinf || s->n_top != want->n_top ||
        s->argmax != want->argmax)
        fail_msg("%s: finite %d/%d, +inf %d/%d, listed %d/%d, arg max %d/%d (cuda/host)", what,
                 s->n_finite, want->n_finite, s->n_posinf, want->n_posinf, s->n_top, want->n_top,
                 s->argmax, want->argmax);
    if (memcmp(st, wt, sizeof *wt * (size_t)want->n_top) != 0)
        fail_msg("%s: the top lists differ", what);
    if (want->n_posinf > 0 || want->n_finite == 0) return;
    if (s->max != want->max) fail_msg("%s: max %.9g, host %.9g", what, s->max, want->max);
    const double got_v[3] = {s->sum, s->entropy, s->varentropy};
    const double want_v[3] = {want->sum, want->entropy, want->varentropy};
    for (int k = 0; k < 3; k++)
        if (!(fabs(got_v[k] - want_v[k]) <= 1e-12 * fmax(fabs(want_v[k]), 1e-3)))
            fail_msg("%s: sum/entropy/varentropy [%d] %.17g, host %.17g", what, k, got_v[k],
                     want_v[k]);
}

/* logits_summary against the host's summarizer (sample/chain.h), outputs poisoned first. Rows
 * of Gemma 3's vocabulary and small ones; gaussian, on a coarse grid (ties at the list's edge),
 * a third masked with NaN among them, five finite logits, one +inf, none finite; lists of 1,
 * 40, 256 and 1024; without edits, then with edits on three rows (a bias list with a ban, a
 * boost and an id twice, on a NaN too; penalties over a window; both): the raw and edited
 * summaries and each edit's raw value. */
static void test_logits_summary(void **state) {
    (void)state;
    /* The CPU standing in has no slot (its rows are host memory): the test's own logic then
     * runs against the host's summarizer behind tensor_get, as a slot would. */
    static loom_backend_ops standin;
    const loom_backend_ops *real = g_gpu.ops;
    if (real->logits_summary == NULL) {
        standin = *real;
        standin.logits_summary = standin_summary;
        g_gpu.ops = &standin;
    }
    const int32_t Vs[] = {262144, 1000};
    const int32_t tops[] = {1, 40, 256, LOOM_LOGIT_SUMMARY_MAX_TOP};
    enum { ROWS = 6 };
    static const loom_logit_bias bias[4] = {{7, -INFINITY}, {300, 4.5f}, {300, -0.25f}, {2, 1.0f}};
    static const int32_t pen_id[5] = {3, 7, 9, 300, 500}, pen_count[5] = {1, 4, 2, 1, 3};
    loom_logit_edits edits[ROWS] = {{0}};
    edits[0] = (loom_logit_edits){.bias = bias, .n_bias = 4};
    edits[1] = (loom_logit_edits){.n_pen = 5,
                                  .pen_id = pen_id,
                                  .pen_count = pen_count,
                                  .repeat_penalty = 1.3f,
                                  .presence_penalty = 0.5f,
                                  .frequency_penalty = 0.25f};
    edits[2] = edits[1];
    edits[2].bias = bias;
    edits[2].n_bias = 4;
    for (int vi = 0; vi < 2; vi++) {
        const int32_t V = Vs[vi];
        float *x = host_f32((int64_t)V * ROWS), *scratch = host_f32(V);
        fill_rand(x, (size_t)V * ROWS, 4.0f);
        for (int32_t i = 0; i < V; i++) x[V + i] = 0.5f * roundf(x[V + i]); /* ties */
        for (int32_t i = 0; i < V; i++)
            if (i % 3 == 1) x[2 * V + i] = i % 7 ? -INFINITY : NAN;
        for (int32_t i = 0; i < V; i++)
            x[3 * V + i] = i % (V / 5) == 3 ? x[3 * V + i] : -INFINITY; /* five finite */
        x[4 * V + V / 2] = INFINITY;
        for (int32_t i = 0; i < V; i++) x[5 * V + i] = -INFINITY;
        loom_tensor g = gpu_f32(x, V, ROWS);
        for (int ti = 0; ti < 8; ti++) {
            const int32_t n_top = tops[ti % 4];
            const bool with_edits = ti >= 4;
            loom_logit_summary got[ROWS], raw_got[ROWS], want, raw_want;
            loom_logit_cand *gt = malloc(sizeof *gt * (size_t)n_top * ROWS);
            loom_logit_cand *rgt = malloc(sizeof *gt * (size_t)n_top * ROWS);
            loom_logit_cand *wt = malloc(sizeof *wt * (size_t)n_top);
            loom_logit_cand *rwt = malloc(sizeof *wt * (size_t)n_top);
            float *vals = malloc(sizeof *vals * ROWS * LOOM_LOGIT_SUMMARY_MAX_EDITS);
            float want_vals[LOOM_LOGIT_SUMMARY_MAX_EDITS];
            assert_true(gt && rgt && wt && rwt && vals);
            memset(got, 0xff, sizeof got);
            memset(raw_got, 0xff, sizeof raw_got);
            memset(gt, 0xff, sizeof *gt * (size_t)n_top * ROWS);
            memset(vals, 0xff, sizeof *vals * ROWS * LOOM_LOGIT_SUMMARY_MAX_EDITS);
            gpu_put(g.data, x, (size_t)V * ROWS * 4); /* the edits of the last call undone */
            expect_ok(g_gpu.ops->logits_summary(g_gpu.ctx, &g, n_top, with_edits ? edits : NULL,
                                                got, gt, raw_got, rgt, vals),
                      "logits_summary");
            for (int r = 0; r < ROWS; r++) {
                char what[96];
                snprintf(what, sizeof what, "V=%d top %d row %d%s", V, n_top, r,
                         with_edits ? " (edits)" : "");
                const loom_logit_edits *e = with_edits ? &edits[r] : NULL;
                loom__sample_logits_summarize_edited(x + (size_t)r * V, V, n_top, e, scratch, &want,
                                                     wt, &raw_want, rwt, want_vals);
                expect_summary(&got[r], gt + (size_t)r * n_top, &want, wt, what);
                if (e == NULL || e->n_bias + e->n_pen == 0) continue;
                expect_summary(&raw_got[r], rgt + (size_t)r * n_top, &raw_want, rwt, what);
                const float *gv = vals + (size_t)r * LOOM_LOGIT_SUMMARY_MAX_EDITS;
                if (memcmp(gv, want_vals, sizeof *gv * (size_t)(e->n_bias + e->n_pen)) != 0)
                    fail_msg("%s: the edited logits' raw values differ", what);
            }
            free(gt);
            free(rgt);
            free(wt);
            free(rwt);
            free(vals);
        }
        free(x);
        free(scratch);
        gpu_free_all();
    }
    /* bad arguments: an n_top out of range, a non-F32 tensor, an edit naming a stray token, too
     * many edits, edits without the raw outputs */
    loom_tensor g = gpu_f32(NULL, 100, 1);
    loom_logit_summary s, rs;
    loom_logit_cand c[1], rc[1];
    float v[LOOM_LOGIT_SUMMARY_MAX_EDITS];
    assert_int_equal(g_gpu.ops->logits_summary(g_gpu.ctx, &g, 0, NULL, &s, c, NULL, NULL, NULL),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(g_gpu.ops->logits_summary(g_gpu.ctx, &g, LOOM_LOGIT_SUMMARY_MAX_TOP + 1, NULL,
                                               &s, c, NULL, NULL, NULL),
                     LOOM_ERR_INVALID_ARG);
    if (real->logits_summary != NULL) { /* the op's own checks (the stand-in has only some) */
        loom_logit_bias stray = {100, 1.0f};
        loom_logit_edits e = {.bias = &stray, .n_bias = 1};
        assert_int_equal(g_gpu.ops->logits_summary(g_gpu.ctx, &g, 1, &e, &s, c, &rs, rc, v),
                         LOOM_ERR_INVALID_ARG);
        stray.id = 5;
        e.n_bias = LOOM_LOGIT_SUMMARY_MAX_EDITS + 1;
        assert_int_equal(g_gpu.ops->logits_summary(g_gpu.ctx, &g, 1, &e, &s, c, &rs, rc, v),
                         LOOM_ERR_INVALID_ARG);
        e.n_bias = 1;
        assert_int_equal(g_gpu.ops->logits_summary(g_gpu.ctx, &g, 1, &e, &s, c, NULL, NULL, NULL),
                         LOOM_ERR_INVALID_ARG);
    }
    g.type = LOOM_TYPE_F16;
    assert_int_equal(g_gpu.ops->logits_summary(g_gpu.ctx, &g, 1, NULL, &s, c, NULL, NULL, NULL),
                     LOOM_ERR_INVALID_ARG);
    gpu_free_all();
    g_gpu.ops = real;
}

/* ------------------------------------------------------------------------------------------ */
/* Whole models                                                                               */
/* ------------------------------------------------------------------------------------------ */

static loom_model *load_on(const char *path, const char *backend) {
    loom_model_params p = loom_model_default_params();
    p.backend = backend;
    p.n_threads = 2;
    p.f32_activations = true;
    loom_model *m = NULL;
    if (loom_model_load(path, &p, &m) != LOOM_OK)
        fail_msg("load %s on %s: %s", path, backend, loom_last_error());
    return m;
}

static loom_model *synthetic_fmt_on(const char *arch, const char *type, const char *backend,
                                    loom_weight_format weights) {
    loom_synthetic_params sp = loom_synthetic_default_params();
    sp.arch = arch;
    sp.n_vocab = 1024;
    sp.n_embd = 512;
    sp.n_head = 8;
    sp.n_head_kv = 2;
    sp.n_ff = 1024;
    sp.n_layer = 3;
    sp.n_ctx = 512;
    sp.window = strcmp(arch, "gemma3") == 0 ? 16 : 0;
    sp.weight_type = type;
    sp.seed = 5;
    loom_model_params p = loom_model_default_params();
    p.backend = backend;
    p.n_threads = 2;
    p.f32_activations = true;
    p.weights = weights;
    loom_model *m = NULL;
    if (loom_model_load_synthetic(&sp, &p, &m) != LOOM_OK)
        fail_msg("synthetic %s/%s on %s: %s", arch, type, backend, loom_last_error());
    return m;
}

static loom_model *synthetic_on(const char *arch, const char *type, const char *backend) {
    return synthetic_fmt_on(arch, type, backend, LOOM_WEIGHTS_AS_STORED);
}

/* Teacher-forced logits of 40 tokens then 6 decodes, CUDA against the CPU: the two file models
 * (F32 weights), then in-memory ones of each architecture in the block formats the kernels
 * read (qwen2's Q/K/V biases among them), and two with every matrix requantized to FP8 E4M3
 * rows at load (loom_model_params.weights). */
static void test_models_logits(void **state) {
    (void)state;
    const synth_shape *shapes[] = {&SYNTH_LLAMA, &SYNTH_GEMMA3, NULL, NULL, NULL, NULL, NULL, NULL};
    const char *syn[][2] = {{"qwen2", "q4_K"}, {"llama", "q8_0"}, {"gemma3", "bf16"},
                            {"qwen2", "q6_K"}, {"llama", "f16"},  {"gemma3", "q8_0"}};
    for (int mi = 0; mi < 8; mi++) {
        char path[512];
        loom_model *mc, *mg;
        if (mi < 2) {
            synth_path(path, sizeof path, mi ? "cuda-gemma3.gguf" : "cuda-llama.gguf");
            assert_int_equal(synth_write(path, shapes[mi], 31 + (uint64_t)mi), 0);
            mc = load_on(path, "cpu");
            mg = load_on(path, g_gpu_name);
        } else {
            const loom_weight_format wf = mi >= 6 ? LOOM_WEIGHTS_FP8_E4M3 : LOOM_WEIGHTS_AS_STORED;
            mc = synthetic_fmt_on(syn[mi - 2][0], syn[mi - 2][1], "cpu", wf);
            mg = synthetic_fmt_on(syn[mi - 2][0], syn[mi - 2][1], g_gpu_name, wf);
        }
        const char *name = mi < 2 ? shapes[mi]->arch : syn[mi - 2][0];
        loom_model_info info = {.size = sizeof info};
        assert_int_equal(loom_model_get_info(mg, &info), LOOM_OK);
        assert_string_equal(info.backend, g_gpu_name);
        const int32_t V = info.n_vocab;
        loom_session *sc = NULL, *sg = NULL;
        expect_ok(loom_session_create(mc, NULL, &sc), "cpu session");
        expect_ok(loom_session_create(mg, NULL, &sg), "cuda session");
        loom_token toks[46];
        for (int i = 0; i < 46; i++) toks[i] = (loom_token)(3 + (i * 37) % (V - 3));
        expect_ok(loom_session_decode(sc, toks, 40, true), "cpu decode");
        expect_ok(loom_session_decode(sg, toks, 40, true), "cuda decode");
        for (int i = 0; i < 40; i++) {
            char what[64];
            snprintf(what, sizeof what, "%s logits, position %d", name, i);
            expect_close(loom_session_logits(sg, i), loom_session_logits(sc, i), (size_t)V,
                         TOL(1e-4, 0x1p-5), what);
        }
        for (int i = 40; i < 46; i++) {
            expect_ok(loom_session_decode(sc, toks + i, 1, false), "cpu decode");
            expect_ok(loom_session_decode(sg, toks + i, 1, false), "cuda decode");
            expect_close(loom_session_logits(sg, -1), loom_session_logits(sc, -1), (size_t)V,
                         TOL(1e-4, 0x1p-5), "decode logits");
        }
        loom_session_free(sc);
        loom_session_free(sg);
        loom_model_free(mc);
        loom_model_free(mg);
    }
}

/* Merged layer pairs (MiniCache-style, a kv_plan's "merge"): the 3-layer synthetic llama with
 * layers 2 and 1 merged, 4 of each block's 16 tokens kept, over F32, F16 and BF16 pages: 40
 * tokens in steps of 7 (merging depends on the steps), then 6 decodes, CUDA's logits against
 * the CPU's; what both layers of the pair read back (kv_read: directions times norms, the
 * retained rows) likewise. */
static void test_models_merged(void **state) {
    (void)state;
    char plan[512];
    synth_path(plan, sizeof plan, "cuda-merge.plan");
    FILE *f = fopen(plan, "w");
    assert_non_null(f);
    fputs("loom-kv-plan 1\nlayers 3\nmerge 2 1\nmerge-retain 0.25\n", f);
    assert_int_equal(fclose(f), 0);
    loom_model *mc = synthetic_on("llama", "f32", "cpu");
    loom_model *mg = synthetic_on("llama", "f32", g_gpu_name);
    loom_model_info info = {.size = sizeof info};
    assert_int_equal(loom_model_get_info(mg, &info), LOOM_OK);
    const int32_t V = info.n_vocab, row = info.n_head_kv * info.head_dim;
    const loom_kv_cache_type types[] = {LOOM_KV_CACHE_F32, LOOM_KV_CACHE_F16, LOOM_KV_CACHE_BF16};
    for (int ti = 0; ti < 3; ti++) {
        loom_session_params sp = loom_session_default_params();
        sp.kv_type = types[ti];
        sp.kv_plan = plan;
        sp.block_size = 16;
        loom_session *sc = NULL, *sg = NULL;
        expect_ok(loom_session_create(mc, &sp, &sc), "cpu session (merged)");
        expect_ok(loom_session_create(mg, &sp, &sg), "cuda session (merged)");
        loom_token toks[46];
        for (int i = 0; i < 46; i++) toks[i] = (loom_token)(3 + (i * 41) % (V - 3));
        for (int i0 = 0; i0 < 40; i0 += 7) {
            const int n = 40 - i0 < 7 ? 40 - i0 : 7;
            expect_ok(loom_session_decode(sc, toks + i0, n, true), "cpu decode");
            expect_ok(loom_session_decode(sg, toks + i0, n, true), "cuda decode");
            for (int i = 0; i < n; i++) {
                char what[64];
                snprintf(what, sizeof what, "merged pair, kv type %d, position %d", ti, i0 + i);
                expect_close(loom_session_logits(sg, i), loom_session_logits(sc, i), (size_t)V,
                             1e-4, what);
            }
        }
        for (int i = 40; i < 46; i++) {
            expect_ok(loom_session_decode(sc, toks + i, 1, false), "cpu decode");
            expect_ok(loom_session_decode(sg, toks + i, 1, false), "cuda decode");
            expect_close(loom_session_logits(sg, -1), loom_session_logits(sc, -1), (size_t)V, 1e-4,
                         "merged pair, decode logits");
        }
        /* the merged rows' sums run in other orders on the two (double on both): a page value
         * may round the other way, one unit in the last place of the page type (as
         * tests/kernels_emu/emu_kv_merge.cpp allows; on the emulated backend an F16 row did) */
        const double page_tol[] = {1e-5, 0x1p-10, 0x1p-7};
        float *kc = host_f32(46 * (int64_t)row), *vc = host_f32(46 * (int64_t)row);
        float *kg = host_f32(46 * (int64_t)row), *vg = host_f32(46 * (int64_t)row);
        for (int32_t layer = 1; layer <= 2; layer++) {
            expect_ok(loom_session_kv_read(sc, layer, 0, 46, kc, vc), "cpu kv_read");
            expect_ok(loom_session_kv_read(sg, layer, 0, 46, kg, vg), "cuda kv_read");
            expect_close(kg, kc, (size_t)46 * row, page_tol[ti], "merged pair, kv_read K");
            expect_close(vg, vc, (size_t)46 * row, page_tol[ti], "merged pair, kv_read V");
        }
        free(kc), free(vc), free(kg), free(vg);
        loom_session_free(sc);
        loom_session_free(sg);
    }
    loom_model_free(mc);
    loom_model_free(mg);
}

/* The engine's concurrent-requests run on a model: 16 requests (four of them n = 4 samples,
 * half sampled at temperature 0.8), prompts sharing prefixes (prefix-cache hits), a 32-token
 * step budget (chunked prefill) and a KV budget small enough to preempt — by recompute, then
 * by swap. Tokens of every sample into out[16][4][24]. */
#define ENG_REQ 16
static void engine_run(loom_model *m, loom_preempt_mode mode, loom_token out[ENG_REQ][4][24],
                       loom_engine_stats *st) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 96 << 10;
    ep.max_ctx = 128;
    ep.max_batched_tokens = 32;
    ep.max_seqs = 16;
    ep.prefix_cache = true;
    ep.preempt = mode;
    loom_engine *e = NULL;
    if (loom_engine_create(m, &ep, &e) != LOOM_OK) fail_msg("engine: %s", loom_last_error());
    loom_request_id ids[ENG_REQ];
    static loom_token prompt[ENG_REQ][40];
    for (int r = 0; r < ENG_REQ; r++) {
        for (int i = 0; i < 40; i++)
            prompt[r][i] =
                (loom_token)(5 + (i < 24 ? (r % 3) * 11 + i * 7 : r * 31 + i * 17) % 250);
        loom_request_params rq = loom_request_default_params();
        loom_sampler_params sp = loom_sampler_default_params();
        rq.sampler = &sp;
        rq.prompt_tokens = prompt[r];
        rq.n_prompt_tokens = 24 + (size_t)(r % 5) * 4;
        rq.max_tokens = 24;
        rq.n = r % 4 == 3 ? 4 : 1;
        rq.ignore_eos = true;
        sp.temperature = r % 2 ? 0.8f : 0.0f;
        sp.seed = 1000 + (uint64_t)r;
        if (loom_engine_submit(e, &rq, &ids[r]) != LOOM_OK)
            fail_msg("submit: %s", loom_last_error());
    }
    int n[ENG_REQ][4] = {{0}};
    while (loom_engine_has_work(e)) {
        const loom_event *const *ev;
        size_t n_ev;
        expect_ok(loom_engine_step(e, &ev, &n_ev), "engine step");
        for (size_t k = 0; k < n_ev; k++) {
            assert_int_not_equal(ev[k]->kind, LOOM_EVENT_FAILED);
            for (int r = 0; r < ENG_REQ; r++)
                if (ev[k]->kind == LOOM_EVENT_TOKEN && ev[k]->id == ids[r])
                    out[r][ev[k]->sample][n[r][ev[k]->sample]++] = ev[k]->token;
        }
    }
    for (int r = 0; r < ENG_REQ; r++)
        for (int i = 0; i < (r % 4 == 3 ? 4 : 1); i++) assert_int_equal(n[r][i], 24);
    st->size = sizeof *st;
    expect_ok(loom_engine_get_stats(e, st), "engine stats");
    loom_engine_destroy(e);
}

static void test_models_engine(void **state) {
    (void)state;
    const synth_shape *shapes[] = {&SYNTH_LLAMA, &SYNTH_GEMMA3};
    static loom_token a[ENG_REQ][4][24], b[ENG_REQ][4][24], rows_run[ENG_REQ][4][24];
    for (int mi = 0; mi < 2; mi++) {
        char path[512];
        synth_path(path, sizeof path, mi ? "cuda-eng-gemma3.gguf" : "cuda-eng-llama.gguf");
        assert_int_equal(synth_write(path, shapes[mi], 41 + (uint64_t)mi), 0);
        loom_model *mc = load_on(path, "cpu"), *mg = load_on(path, g_gpu_name);
        /* the opt-out mode (the GEMV for decode steps, the tiled prefill kernel), whose tokens
         * may depend on the scheduler's cuts: run to completion, every token delivered */
        setenv("LOOM_CUDA_BATCH_INVARIANT", "0", 1);
        loom_model *mgo = load_on(path, g_gpu_name);
        if (g_invariant) unsetenv("LOOM_CUDA_BATCH_INVARIANT");
        for (int mode = 0; mode < 2; mode++) {
            memset(a, 0, sizeof a);
            memset(b, 0, sizeof b);
            loom_engine_stats sc, sg;
            engine_run(mc, (loom_preempt_mode)mode, a, &sc);
            engine_run(mg, (loom_preempt_mode)mode, b, &sg);
            /* The GPU engine samples the requests a summary covers from logits_summary; with
             * LOOM_SAMPLE_FROM=rows it copies every row: the same tokens, since (batch-invariant,
             * the default) a token's logits do not depend on how the scheduler cut its steps,
             * which may differ between two runs. */
            loom_engine_stats sr;
            memset(rows_run, 0, sizeof rows_run);
            setenv("LOOM_SAMPLE_FROM", "rows", 1);
            engine_run(mg, (loom_preempt_mode)mode, rows_run, &sr);
            unsetenv("LOOM_SAMPLE_FROM");
            if (g_invariant && memcmp(rows_run, b, sizeof rows_run) != 0)
                fail_msg("%s (%s): the cuda engine's tokens differ sampled from summaries and "
                         "from whole rows",
                         shapes[mi]->arch, mode ? "swap" : "recompute");
            engine_run(mgo, (loom_preempt_mode)mode, rows_run, &sr);
            printf("%s, preempt by %s: cpu %lld preemptions, %lld prefix-cached tokens; cuda %lld, "
                   "%lld\n",
                   shapes[mi]->arch, mode ? "swap" : "recompute", (long long)sc.preemptions,
                   (long long)sc.prefix_hit_tokens, (long long)sg.preemptions,
                   (long long)sg.prefix_hit_tokens);
            assert_true(sg.preemptions > 0); /* the budget is meant to force them */
            for (int r = 0; r < ENG_REQ; r++)
                for (int i = 0; i < 4; i++)
                    for (int t = 0; t < 24; t++)
                        if (a[r][i][t] != b[r][i][t])
                            fail_msg("%s (%s): request %d sample %d token %d: cpu %d, cuda %d",
                                     shapes[mi]->arch, mode ? "swap" : "recompute", r, i, t,
                                     a[r][i][t], b[r][i][t]);
        }
        loom_model_free(mc);
        loom_model_free(mg);
        loom_model_free(mgo);
    }
}

/* Batch invariance end to end (the issue's check, default settings): 16 concurrent requests
 * give bitwise the tokens — and the raw log-probability and entropy of each — that each gives
 * alone. Prompts of 9 to 84 tokens, some sharing a 16-token prefix (the batch run reuses
 * another request's cached blocks), cut into chunks by a 48-token step budget differently
 * alone and together; half sample at temperature 0.9 (seeded), half greedy. */
#define INV_REQ 16
#define INV_GEN 20
typedef struct inv_out {
    loom_token tok[INV_REQ][INV_GEN];
    float lp[INV_REQ][INV_GEN];
    double ent[INV_REQ][INV_GEN];
} inv_out;

static void inv_run(loom_model *m, int only, inv_out *o) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 8 << 20;
    ep.max_ctx = 128;
    ep.max_batched_tokens = 48;
    ep.max_seqs = INV_REQ;
    ep.prefix_cache = true;
    loom_engine *e = NULL;
    if (loom_engine_create(m, &ep, &e) != LOOM_OK) fail_msg("engine: %s", loom_last_error());
    loom_request_id ids[INV_REQ];
    static loom_token prompt[INV_REQ][84];
    int n[INV_REQ] = {0};
    for (int r = 0; r < INV_REQ; r++) {
        ids[r] = -1;
        if (only >= 0 && r != only) continue;
        for (int i = 0; i < 84; i++)
            prompt[r][i] =
                (loom_token)(3 + (i < 16 && r % 3 == 0 ? i * 13 : r * 37 + i * 11) % 250);
        loom_request_params rq = loom_request_default_params();
        loom_sampler_params sp = loom_sampler_default_params();
        rq.sampler = &sp;
        rq.prompt_tokens = prompt[r];
        rq.n_prompt_tokens = 9 + (size_t)((r * 29) % 76);
        rq.max_tokens = INV_GEN;
        rq.ignore_eos = true;
        sp.temperature = r % 2 ? 0.9f : 0.0f;
        sp.seed = 77 + (uint64_t)r;
        if (loom_engine_submit(e, &rq, &ids[r]) != LOOM_OK)
            fail_msg("submit: %s", loom_last_error());
    }
    while (loom_engine_has_work(e)) {
        const loom_event *const *ev;
        size_t n_ev;
        expect_ok(loom_engine_step(e, &ev, &n_ev), "engine step");
        for (size_t k = 0; k < n_ev; k++) {
            assert_int_not_equal(ev[k]->kind, LOOM_EVENT_FAILED);
            if (ev[k]->kind != LOOM_EVENT_TOKEN) continue;
            for (int r = 0; r < INV_REQ; r++)
                if (ev[k]->id == ids[r] && n[r] < INV_GEN) {
                    o->tok[r][n[r]] = ev[k]->token;
                    o->lp[r][n[r]] = ev[k]->info->logprob_raw;
                    o->ent[r][n[r]++] = ev[k]->info->entropy;
                }
        }
    }
    for (int r = 0; r < INV_REQ; r++)
        if (only < 0 || r == only) assert_int_equal(n[r], INV_GEN);
    loom_engine_destroy(e);
}

/* The synthetic llama both tests below run, written once per run of the test. */
static const char *inv_model_path(void) {
    static char path[512];
    if (path[0] == '\0') {
        synth_path(path, sizeof path, "cuda-inv-llama.gguf");
        assert_int_equal(synth_write(path, &SYNTH_LLAMA, 43), 0);
    }
    return path;
}

static void test_engine_batch_invariance(void **state) {
    (void)state;
    loom_model *m = load_on(inv_model_path(), g_gpu_name);
    static inv_out together, alone;
    memset(&together, 0, sizeof together);
    memset(&alone, 0, sizeof alone);
    inv_run(m, -1, &together);
    for (int r = 0; r < INV_REQ; r++) inv_run(m, r, &alone);
    int differ = 0;
    for (int r = 0; r < INV_REQ; r++)
        for (int i = 0; i < INV_GEN; i++)
            if (together.tok[r][i] != alone.tok[r][i] ||
                memcmp(&together.lp[r][i], &alone.lp[r][i], sizeof(float)) != 0 ||
                memcmp(&together.ent[r][i], &alone.ent[r][i], sizeof(double)) != 0) {
                if (differ++ < 5)
                    printf("request %d token %d: together %d (logprob %.9g, entropy %.17g), alone "
                           "%d (%.9g, %.17g)\n",
                           r, i, together.tok[r][i], (double)together.lp[r][i], together.ent[r][i],
                           alone.tok[r][i], (double)alone.lp[r][i], alone.ent[r][i]);
                break;
            }
    if (g_invariant && differ > 0)
        fail_msg("%d of %d requests differ between the batch of %d and alone (batch-invariant "
                 "mode)",
                 differ, INV_REQ, INV_REQ);
    printf("batch invariance (%s mode): %d of %d requests differ in a batch of %d from alone\n",
           g_invariant ? "invariant" : "fast", differ, INV_REQ, INV_REQ);
    loom_model_free(m);
}

/* CUDA graphs (LOOM_CUDA_GRAPHS=1): the 16 requests of test_engine_batch_invariance give the
 * same tokens, log-probabilities and entropies with every step's kernels replayed as graphs as
 * launched one by one. (The CPU stand-in has no graphs: there it compares two plain runs.) */
static void test_engine_graphs(void **state) {
    (void)state;
    loom_model *plain = load_on(inv_model_path(), g_gpu_name);
    setenv("LOOM_CUDA_GRAPHS", "1", 1);
    loom_model *graphs = load_on(inv_model_path(), g_gpu_name);
    unsetenv("LOOM_CUDA_GRAPHS");
    static inv_out a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    inv_run(plain, -1, &a);
    inv_run(graphs, -1, &b);
    if (memcmp(&a, &b, sizeof a) != 0)
        fail_msg("the engine's tokens differ with CUDA graphs and without");
    loom_model_free(plain);
    loom_model_free(graphs);
}

int main(void) {
    /* the CUDA backend's mode, as it reads it when it opens: batch-invariant unless "0" */
    g_invariant = getenv("LOOM_CUDA_BATCH_INVARIANT") == NULL ||
                  strcmp(getenv("LOOM_CUDA_BATCH_INVARIANT"), "0") != 0;
    g_math16 = getenv("LOOM_CUDA_MATH") != NULL && strcmp(getenv("LOOM_CUDA_MATH"), "bf16") == 0;
#if !defined(LOOM_TEST_CUDA_BUILT)
    if (getenv("LOOM_TEST_CUDA_STANDIN") == NULL && getenv("LOOM_TEST_CUDA_EMULATED") == NULL) {
        printf("SKIP: the CUDA backend is not built\n");
        return 77;
    }
#endif
    const char *standin = getenv("LOOM_TEST_CUDA_STANDIN");
    if (standin != NULL && strcmp(standin, "cpu") == 0) g_gpu_name = "cpu";
    loom_backend_open_params gp = {.device = 0, .n_threads = 2, .f32_activations = true};
    loom_status st = loom__backend_stream_open(g_gpu_name, &gp, &g_gpu);
    if (st == LOOM_ERR_NO_DEVICE) {
        printf("SKIP: no CUDA device: %s\n", loom_last_error());
        return 77;
    }
    if (st != LOOM_OK) {
        fprintf(stderr, "cuda backend: %s\n", loom_last_error());
        return 1;
    }
    loom_backend_open_params cp = {.device = 0, .n_threads = 4, .f32_activations = true};
    if (loom__backend_stream_open("cpu", &cp, &g_cpu) != LOOM_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_batch),
        cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_attention_batches),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_models_logits),
        cmocka_unit_test(test_models_merged),
        cmocka_unit_test(test_models_engine),
        cmocka_unit_test(test_fp8_gemm),
        cmocka_unit_test(test_bf16_gemm),
        cmocka_unit_test(test_logits_summary),
        cmocka_unit_test(test_engine_batch_invariance),
        cmocka_unit_test(test_matmul_multi),
        cmocka_unit_test(test_engine_graphs),
        cmocka_unit_test(test_wgmma_gemm),
        cmocka_unit_test(test_norm_rope_store),
        cmocka_unit_test(test_norm_add_rms_norm),
    };
    /* LOOM_TEST_ONLY=name[,name...] runs those tests alone (check.sh's planted-bug step and its
     * run of the fast mode). */
    enum { N_ALL = sizeof tests / sizeof tests[0] };
    struct CMUnitTest only[N_ALL];
    const char *want = getenv("LOOM_TEST_ONLY");
    size_t n_tests = N_ALL;
    const struct CMUnitTest *run = tests;
    if (want != NULL) {
        n_tests = 0;
        for (size_t i = 0; i < N_ALL; i++) {
            const size_t len = strlen(tests[i].name);
            for (const char *p = want; *p != '\0';) {
                const char *end = strchr(p, ',');
                const size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
                if (n == len && strncmp(p, tests[i].name, n) == 0) {
                    only[n_tests++] = tests[i];
                    break;
                }
                p += n + (end != NULL);
            }
        }
        if (n_tests == 0) {
            fprintf(stderr, "LOOM_TEST_ONLY=%s: no such test\n", want);
            return 1;
        }
        run = only;
    }
    int rc = _cmocka_run_group_tests("test_cuda_ops", run, n_tests, NULL, NULL);
    loom__backend_stream_close(&g_cpu);
    loom__backend_stream_close(&g_gpu);
    return rc;
}
