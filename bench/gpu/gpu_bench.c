/* gpu_bench.c — loom-gpu-bench: the card's ceilings, measured here (a large device-to-device
 * copy, a cuBLAS BF16 GEMM), then loom's CUDA kernels timed through the backend's ops table as
 * a fraction of them. One JSON object per line on stdout, for bench/gpu/peers.py to set beside
 * PyTorch's time for the same shape and turn into the table of bench/gpu/check.sh.
 *
 * Timing: each measurement is the median of 25 runs; a run queues `reps` calls and waits for
 * the stream (so launch cost is amortised as in a real step); inputs rotate over enough copies
 * that each run reads past the 60 MB L2 of an H200. Usage: loom-gpu-bench [--quick]. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "tensor/fp16.h"
#include "tensor/quant.h"
#include "tensor/types.h"

#define RUNS 25

static loom__backend_stream g_gpu;
static uint64_t g_rng = 0x243f6a8885a308d3ull;

static uint64_t rng_u64(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_f(void) {
    return (float)((double)(rng_u64() >> 11) * 0x1p-52 - 1.0);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what) {
    fprintf(stderr, "loom-gpu-bench: %s: %s\n", what, loom_last_error());
    exit(1);
}

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "loom-gpu-bench: %s: %s\n", #call, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void *dev_alloc(size_t bytes) {
    loom_buffer *b = NULL;
    if (g_gpu.ops->buffer_alloc(g_gpu.dev, bytes, &b) != LOOM_OK) die("buffer_alloc");
    return g_gpu.ops->buffer_base(g_gpu.dev, b); /* kept until exit */
}

/* Random finite values whether read as f32 or as f16 pairs: every 16 bits are the f16 of a
 * value in [-1, 1) (as f32, two such halves make a finite float too). */
static void dev_fill(void *d, size_t bytes) {
    size_t chunk = 1 << 24;
    uint16_t *h = malloc(chunk);
    for (size_t i = 0; i < chunk / 2; i++) h[i] = loom__f32_to_f16(rng_f());
    for (size_t at = 0; at < bytes; at += chunk) {
        size_t n = bytes - at < chunk ? bytes - at : chunk;
        if (g_gpu.ops->tensor_set(g_gpu.ctx, (char *)d + at, h, n) != LOOM_OK) die("tensor_set");
    }
    if (g_gpu.ops->synchronize(g_gpu.ctx) != LOOM_OK) die("synchronize");
    free(h);
}

/* ---- ceilings ------------------------------------------------------------------------------ */

static double g_copy_gbs, g_gemm_tflops;

static void ceilings(void) {
    const size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CU(cudaMalloc(&a, bytes));
    CU(cudaMalloc(&b, bytes));
    CU(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    double t[RUNS];
    for (int r = -3; r < RUNS; r++) {
        CU(cudaEventRecord(e0, 0));
        CU(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = ms * 1e-3;
    }
    double s = median(t, RUNS);
    g_copy_gbs = 2.0 * (double)bytes / s * 1e-9; /* read + write */
    printf("{\"kind\":\"ceiling\",\"name\":\"d2d copy\",\"bytes\":%zu,\"s\":%.6e,"
           "\"gbs_rw\":%.1f}\n",
           bytes, s, g_copy_gbs);
    CU(cudaFree(a));
    CU(cudaFree(b));

    const int n = 8192;
    void *A, *B, *C;
    CU(cudaMalloc(&A, (size_t)n * n * 2));
    CU(cudaMalloc(&B, (size_t)n * n * 2));
    CU(cudaMalloc(&C, (size_t)n * n * 2));
    CU(cudaMemset(A, 0x3c, (size_t)n * n * 2)); /* bf16 values near 0.0116 */
    CU(cudaMemset(B, 0x3c, (size_t)n * n * 2));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "loom-gpu-bench: cublasCreate failed\n");
        exit(1);
    }
    const float one = 1.0f, zero = 0.0f;
    for (int r = -3; r < RUNS; r++) {
        CU(cudaEventRecord(e0, 0));
        cublasStatus_t cs = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF,
                                         n, B, CUDA_R_16BF, n, &zero, C, CUDA_R_16BF, n,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (cs != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "loom-gpu-bench: cublasGemmEx: status %d\n", (int)cs);
            exit(1);
        }
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = ms * 1e-3;
    }
    s = median(t, RUNS);
    g_gemm_tflops = 2.0 * n * (double)n * n / s * 1e-12;
    printf("{\"kind\":\"ceiling\",\"name\":\"cublas bf16 gemm\",\"n\":%d,\"s\":%.6e,"
           "\"tflops\":%.1f}\n",
           n, s, g_gemm_tflops);
    cublasDestroy(h);
    CU(cudaFree(A));
    CU(cudaFree(B));
    CU(cudaFree(C));
}

/* ---- timing a queued op --------------------------------------------------------------------- */

typedef void (*run_fn)(void *ctx, int copy);

/* Median seconds per call of fn over RUNS runs of reps calls, rotating over n_copies inputs. */
static double time_op(run_fn fn, void *ctx, int n_copies, int reps) {
    for (int i = 0; i < 3; i++) fn(ctx, i % n_copies); /* warm-up */
    if (g_gpu.ops->synchronize(g_gpu.ctx) != LOOM_OK) die("synchronize (warm-up)");
    double t[RUNS];
    int c = 0;
    for (int r = 0; r < RUNS; r++) {
        double t0 = now_s();
        for (int i = 0; i < reps; i++) fn(ctx, c++ % n_copies);
        if (g_gpu.ops->synchronize(g_gpu.ctx) != LOOM_OK) die("synchronize");
        t[r] = (now_s() - t0) / reps;
    }
    return median(t, RUNS);
}

/* ---- matmul ------------------------------------------------------------------------------- */

typedef struct mm_ctx {
    loom_tensor w[8], x, out;
    int n_copies;
} mm_ctx;

static void mm_run(void *p, int copy) {
    mm_ctx *m = p;
    if (g_gpu.ops->matmul(g_gpu.ctx, &m->w[copy], &m->x, &m->out) != LOOM_OK) die("matmul");
}

/* A random row of type t: quantized from floats where loom can, else random codes with small
 * positive f16 scales (K-quants). */
static void make_row(uint32_t t, int64_t k, uint8_t *row, size_t rb, float *tmp) {
    for (int64_t i = 0; i < k; i++) tmp[i] = rng_f();
    if (loom__quantize_row(t, tmp, row, k)) return;
    for (size_t b = 0; b < rb; b++) row[b] = (uint8_t)rng_u64();
    const loom__type_traits *tr = loom__type_get_traits(t);
    for (int64_t blk = 0; blk < k / tr->block_elems; blk++) {
        uint8_t *bp = row + (size_t)blk * tr->block_bytes;
        uint16_t d = loom__f32_to_f16(0.01f);
        size_t at = t == LOOM_TYPE_Q6_K ? 208 : 0;
        memcpy(bp + at, &d, 2);
        if (t == LOOM_TYPE_Q4_K || t == LOOM_TYPE_Q5_K) memcpy(bp + 2, &d, 2);
    }
}

/* Appended to a matmul row's type: "+cublaslt" while the device runs with LOOM_CUDA_FP8_GEMM=1
 * (its steps of more than 8 tokens then take cuBLASLt's FP8 GEMM where the device has one). */
static const char *g_type_suffix = "";
/* The backend's mode while this row ran: "invariant" (the default), "fast"
 * (LOOM_CUDA_BATCH_INVARIANT=0: the GEMV for steps of 1..8 tokens, the tiled prefill kernel),
 * "bf16-math" (LOOM_CUDA_MATH=bf16) or "wgmma" (that and LOOM_CUDA_WGMMA=1: the GEMM on
 * Hopper's warpgroup MMA). */
static const char *g_mode = "invariant";
static bool g_fast(void) {
    return strcmp(g_mode, "fast") == 0;
}
/* Attention rows: the block table in order (the pool's blocks one after another: the same
 * kernel over contiguous KV) or shuffled (blocks scattered, as a paged cache leaves them after
 * a while); the paged-vs-contiguous comparison pairs the two. */
static bool g_shuffle = false;

static void bench_matmul(uint32_t t, int64_t k, int64_t n, int64_t T) {
    mm_ctx m = {0};
    size_t rb;
    if (!loom__type_row_bytes(t, k, &rb)) die("row bytes");
    const size_t bytes = rb * (size_t)n;
    m.n_copies = (int)((200u << 20) / bytes + 1);
    if (m.n_copies > 8) m.n_copies = 8;
    uint8_t *host = malloc(bytes);
    float *tmp = malloc((size_t)k * sizeof *tmp);
    for (int64_t r = 0; r < n; r++) make_row(t, k, host + (size_t)r * rb, rb, tmp);
    for (int c = 0; c < m.n_copies; c++) {
        loom_weight_src src = {.name = "bench.weight",
                               .type = (loom_type)t,
                               .ne = {k, n},
                               .row_stride = rb,
                               .data = host,
                               .persistent = true,
                               .use = LOOM_WEIGHT_MATMUL};
        if (g_gpu.ops->weight_prepare(g_gpu.dev, &src, &m.w[c]) != LOOM_OK) die("prepare");
    }
    free(host);
    free(tmp);
    float *x = dev_alloc((size_t)(k * T) * 4), *o = dev_alloc((size_t)(n * T) * 4);
    dev_fill(x, (size_t)(k * T) * 4);
    m.x = loom_tensor_2d(LOOM_TYPE_F32, x, k, T, (size_t)k * 4);
    m.out = loom_tensor_2d(LOOM_TYPE_F32, o, n, T, (size_t)n * 4);
    double s = time_op(mm_run, &m, m.n_copies, T <= 8 ? 20 : 3);
    double gbs = (double)bytes / s * 1e-9, tflops = 2.0 * (double)k * n * T / s * 1e-12;
    /* which kernel ran: by default loom's tensor-core GEMM (kernels/gemm.cu) for every step;
     * in the fast mode the GEMV for steps of 1..8 tokens; opted in, cuBLASLt's FP8 GEMM */
    const char *kernel = *g_type_suffix                 ? "cublaslt-fp8"
                         : g_fast() && T <= 8           ? "gemv"
                         : strcmp(g_mode, "wgmma") == 0 ? "gemm-wgmma"
                                                        : "gemm-mma";
    printf("{\"kind\":\"matmul\",\"mode\":\"%s\",\"kernel\":\"%s\",\"type\":\"%s%s\","
           "\"k\":%lld,\"n\":%lld,"
           "\"t\":%lld,\"s\":%.6e,\"weight_bytes\":%zu,\"gbs\":%.1f,\"pct_bw\":%.1f,"
           "\"tflops\":%.2f,\"pct_gemm\":%.1f}\n",
           g_mode, kernel, loom__type_name(t), g_type_suffix, (long long)k, (long long)n,
           (long long)T, s, bytes, gbs, 100.0 * gbs / g_copy_gbs, tflops,
           100.0 * tflops / g_gemm_tflops);
    fflush(stdout);
}

/* The BF16 GEMM's three shapes on a CUDA stream opened with var=0, as mode. */
static void bench_bf16_gemm_with(const loom_backend_open_params *op, const char *var,
                                 const char *mode) {
    setenv(var, "0", 1);
    if (loom__backend_stream_open("cuda", op, &g_gpu) != LOOM_OK) die("cuda backend");
    g_mode = mode;
    bench_matmul(LOOM_TYPE_BF16, 4096, 14336, 16);
    bench_matmul(LOOM_TYPE_BF16, 4096, 4096, 512);
    bench_matmul(LOOM_TYPE_BF16, 4096, 14336, 2048);
    loom__backend_stream_close(&g_gpu);
    unsetenv(var);
}

/* ---- attention ------------------------------------------------------------------------------ */

typedef struct at_ctx {
    loom_tensor q, out;
    loom_kv_desc kv[4];
    void *k[4], *v[4];
    loom_attn_params p;
    int32_t n_rows;
} at_ctx;

static void at_run(void *p, int copy) {
    at_ctx *a = p;
    if (g_gpu.ops->attention(g_gpu.ctx, &a->q, &a->kv[copy], &a->p, &a->out) != LOOM_OK)
        die("attention");
}

/* batch sequences of ctx positions, new rows each (1: decode), n_head over n_kv heads, pages
 * of kv_type (F16, or FP8 with its per-(position, head) scales after each block's values, as
 * the engine lays them out). */
static void bench_attention(int32_t batch, int32_t ctx, int32_t new_rows, int32_t n_head,
                            int32_t n_kv, int32_t hd, loom_type kv_type) {
    at_ctx a = {0};
    const bool fp8 = kv_type == LOOM_TYPE_FP8_E4M3 || kv_type == LOOM_TYPE_FP8_E5M2;
    const int32_t bs = 16, blocks_per = (ctx + bs - 1) / bs, nb = batch * blocks_per;
    const size_t token = (size_t)n_kv * hd * (fp8 ? 1 : 2),
                 scale_token = fp8 ? (size_t)n_kv * 4 : 0;
    const size_t block = (token * bs + scale_token * bs + 15) & ~(size_t)15;
    const size_t pool = (size_t)nb * block;
    void *ks[4], *vs[4];
    const int n_copies = pool * 2 >= (200u << 20) ? 1 : (int)((200u << 20) / (pool * 2) + 1);
    const int copies = n_copies > 4 ? 4 : n_copies;
    int32_t *indptr = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)nb);
    int32_t *q_start = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)batch),
            *len = malloc(sizeof(int32_t) * (size_t)batch);
    for (int32_t s = 0; s <= batch; s++) {
        indptr[s] = s * blocks_per;
        q_start[s] = s * new_rows;
    }
    for (int32_t i = 0; i < nb; i++) ids[i] = i;
    uint64_t rs = 0x9e3779b97f4a7c15ull;
    for (int32_t i = nb - 1; g_shuffle && i > 0; i--) { /* Fisher-Yates, a fixed seed */
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        const int32_t j = (int32_t)(rs % (uint64_t)(i + 1)), t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    for (int32_t s = 0; s < batch; s++) {
        pos[s] = ctx - new_rows;
        len[s] = ctx;
    }
    a.n_rows = batch * new_rows;
    for (int c = 0; c < copies; c++) {
        a.k[c] = dev_alloc(pool);
        a.v[c] = dev_alloc(pool);
        dev_fill(a.k[c], pool);
        dev_fill(a.v[c], pool);
        ks[c] = (char *)a.k[c] + token * bs;
        vs[c] = (char *)a.v[c] + token * bs;
        a.kv[c] =
            (loom_kv_desc){.n_seqs = batch,
                           .indptr = indptr,
                           .block_ids = ids,
                           .q_start = q_start,
                           .pos_start = pos,
                           .kv_len = len,
                           .block_size = bs,
                           .n_blocks = nb,
                           .n_kv_heads = n_kv,
                           .head_dim = hd,
                           .kv_type = kv_type,
                           .layout = LOOM_KV_LAYOUT_NHD,
                           .token_stride = token,
                           .block_stride = block,
                           .n_layers = 1,
                           .k_base = &a.k[c],
                           .v_base = &a.v[c],
                           .scale_kind = fp8 ? LOOM_KV_SCALE_PER_TOKEN_HEAD : LOOM_KV_SCALE_NONE,
                           .k_scale = fp8 ? &ks[c] : NULL,
                           .v_scale = fp8 ? &vs[c] : NULL,
                           .scale_token_stride = scale_token,
                           .scale_block_stride = fp8 ? block : 0};
    }
    const int64_t qd = (int64_t)n_head * hd;
    float *q = dev_alloc((size_t)(a.n_rows * qd) * 4), *o = dev_alloc((size_t)(a.n_rows * qd) * 4);
    dev_fill(q, (size_t)(a.n_rows * qd) * 4);
    a.q = loom_tensor_2d(LOOM_TYPE_F32, q, qd, a.n_rows, (size_t)qd * 4);
    a.out = loom_tensor_2d(LOOM_TYPE_F32, o, qd, a.n_rows, (size_t)qd * 4);
    a.p = (loom_attn_params){.n_head = n_head, .layer = 0, .scale = 1.0f / sqrtf((float)hd)};
    /* One step holding every copy's descriptor, as a step hands all its KV groups over at once:
     * the timed calls are the attention kernels alone, as in a layer of a step. */
    loom_step_desc st = {.n_tokens = a.n_rows, .n_kv = copies, .kv = a.kv};
    if (g_gpu.ops->step_begin(g_gpu.ctx, &st) != LOOM_OK) die("step_begin");
    double s = time_op(at_run, &a, copies, new_rows == 1 ? 10 : 2);
    const double kv_bytes = 2.0 * (double)pool;
    /* q·k and p·v over the positions each row attends: a prefill chunk from position 0 is
     * causal, about half the square */
    const double flops = 4.0 * (double)batch * n_head * hd * (double)new_rows *
                         (new_rows > 1 && new_rows == ctx ? (ctx + 1) / 2.0 : (double)ctx);
    double gbs = kv_bytes / s * 1e-9;
    /* which kernel ran: by default every row takes the tiled tensor-core kernel
     * (attention_prefill.cu; these layers are all ones it runs), long contexts of small steps
     * split at fixed segments; in the fast mode, sequences of 16 new rows or more take it
     * (loom_kernels.h's LOOM_K_ATTN_PREFILL_ROWS), the others split-KV, in its 16-byte vector
     * form for head sizes 64, 128 and 256 (these pools are aligned; GQA groups within its
     * accumulators) */
    printf("{\"kind\":\"attention\",\"mode\":\"%s\",\"kernel\":\"%s\",\"kv\":\"%s\","
           "\"blocks\":\"%s\",\"batch\":%d,\"ctx\":%d,"
           "\"new_rows\":%d,\"n_head\":%d,\"n_kv\":%d,\"hd\":%d,\"s\":%.6e,\"kv_bytes\":%.0f,"
           "\"gbs\":%.1f,\"pct_bw\":%.1f,\"tflops\":%.2f}\n",
           g_mode,
           !g_fast()                              ? "tiled-mma"
           : new_rows >= 16                       ? "prefill-mma"
           : (hd == 64 || hd == 128 || hd == 256) ? "split-kv-vec16"
                                                  : "split-kv",
           fp8                         ? "fp8_e4m3"
           : kv_type == LOOM_TYPE_BF16 ? "bf16"
                                       : "f16",
           g_shuffle ? "shuffled" : "in order", batch, ctx, new_rows, n_head, n_kv, hd, s, kv_bytes,
           gbs, 100.0 * gbs / g_copy_gbs, flops / s * 1e-12);
    fflush(stdout);
    free(indptr);
    free(ids);
    free(q_start);
    free(pos);
    free(len);
}

/* ---- a layer's attention inputs: norm_rope_store against the five ops it replaces ---------- */

typedef struct qk_ctx {
    loom_tensor q, k, v, pos, qn, kn;
    loom_rope_params p;
    loom_kv_desc kv;
    bool norms;
} qk_ctx;

static void qk_fused_run(void *ctx, int copy) {
    (void)copy;
    qk_ctx *c = ctx;
    if (g_gpu.ops->norm_rope_store(g_gpu.ctx, &c->q, &c->k, &c->v, c->norms ? &c->qn : NULL,
                                   c->norms ? &c->kn : NULL, 1e-6f, &c->pos, &c->p, &c->kv,
                                   0) != LOOM_OK)
        die("norm_rope_store");
}

static void qk_separate_run(void *ctx, int copy) {
    (void)copy;
    qk_ctx *c = ctx;
    const int32_t hd = c->p.head_dim, n_kv = c->kv.n_kv_heads;
    loom_rope_params pk = c->p;
    pk.n_head = n_kv;
    if (c->norms) {
        loom_tensor qh =
            loom_tensor_2d(LOOM_TYPE_F32, c->q.data, hd, c->q.ne[1] * c->p.n_head, (size_t)hd * 4);
        loom_tensor kh =
            loom_tensor_2d(LOOM_TYPE_F32, c->k.data, hd, c->k.ne[1] * n_kv, (size_t)hd * 4);
        if (g_gpu.ops->rms_norm(g_gpu.ctx, &qh, &c->qn, 1e-6f, &qh) != LOOM_OK ||
            g_gpu.ops->rms_norm(g_gpu.ctx, &kh, &c->kn, 1e-6f, &kh) != LOOM_OK)
            die("rms_norm");
    }
    if (g_gpu.ops->rope(g_gpu.ctx, &c->q, &c->pos, &c->p) != LOOM_OK ||
        g_gpu.ops->rope(g_gpu.ctx, &c->k, &c->pos, &pk) != LOOM_OK ||
        g_gpu.ops->kv_store(g_gpu.ctx, &c->k, &c->v, &c->kv, 0) != LOOM_OK)
        die("rope, kv_store");
}

/* rows new rows of one sequence (decode: 1) over n_head query and n_kv KV heads of hd, F16
 * pages of 16 positions, per-head norms where norms (Gemma 3): the one launch against the
 * five, alternated (A B A B), each the median of its runs. The values rotate a little further
 * at every call, which changes neither path's time. */
static void bench_qk(int32_t rows, int32_t n_head, int32_t n_kv, int32_t hd, bool norms) {
    qk_ctx c = {.norms = norms};
    const int64_t qd = (int64_t)n_head * hd, kd = (int64_t)n_kv * hd;
    const int32_t bs = 16, nb = (rows + bs - 1) / bs;
    const size_t token = (size_t)kd * 2, block = token * bs, pool = block * (size_t)nb;
    void *kp = dev_alloc(pool), *vp = dev_alloc(pool);
    float *q = dev_alloc((size_t)(rows * qd) * 4), *k = dev_alloc((size_t)(rows * kd) * 4),
          *v = dev_alloc((size_t)(rows * kd) * 4), *w = dev_alloc((size_t)hd * 4);
    dev_fill(q, (size_t)(rows * qd) * 4);
    dev_fill(k, (size_t)(rows * kd) * 4);
    dev_fill(v, (size_t)(rows * kd) * 4);
    dev_fill(w, (size_t)hd * 4);
    int32_t *pos_h = malloc(sizeof(int32_t) * (size_t)rows),
            *ids = malloc(sizeof(int32_t) * (size_t)nb);
    if (pos_h == NULL || ids == NULL) die("malloc");
    for (int32_t i = 0; i < rows; i++) pos_h[i] = i;
    for (int32_t b = 0; b < nb; b++) ids[b] = b;
    int32_t *pos_d = dev_alloc(sizeof(int32_t) * (size_t)rows);
    if (g_gpu.ops->tensor_set(g_gpu.ctx, pos_d, pos_h, sizeof(int32_t) * (size_t)rows) != LOOM_OK)
        die("tensor_set");
    static int32_t indptr[2], q_start[2], pos_start[1], len[1];
    indptr[0] = 0;
    indptr[1] = nb;
    q_start[0] = 0;
    q_start[1] = rows;
    pos_start[0] = 0;
    len[0] = rows;
    static void *kb[1], *vb[1];
    kb[0] = kp;
    vb[0] = vp;
    c.kv = (loom_kv_desc){.n_seqs = 1,
                          .indptr = indptr,
                          .block_ids = ids,
                          .q_start = q_start,
                          .pos_start = pos_start,
                          .kv_len = len,
                          .block_size = bs,
                          .n_blocks = nb,
                          .n_kv_heads = n_kv,
                          .head_dim = hd,
                          .kv_type = LOOM_TYPE_F16,
                          .layout = LOOM_KV_LAYOUT_NHD,
                          .token_stride = token,
                          .block_stride = block,
                          .n_layers = 1,
                          .k_base = kb,
                          .v_base = vb};
    c.q = loom_tensor_2d(LOOM_TYPE_F32, q, qd, rows, (size_t)qd * 4);
    c.k = loom_tensor_2d(LOOM_TYPE_F32, k, kd, rows, (size_t)kd * 4);
    c.v = loom_tensor_2d(LOOM_TYPE_F32, v, kd, rows, (size_t)kd * 4);
    c.pos = loom_tensor_2d(LOOM_TYPE_I32, pos_d, rows, 1, sizeof(int32_t) * (size_t)rows);
    c.qn = c.kn = loom_tensor_2d(LOOM_TYPE_F32, w, hd, 1, (size_t)hd * 4);
    c.p = (loom_rope_params){.mode = LOOM_ROPE_NEOX,
                             .n_head = n_head,
                             .head_dim = hd,
                             .n_rot = hd,
                             .theta_base = 500000.0f,
                             .freq_scale = 1.0f};
    loom_step_desc st = {.n_tokens = rows, .n_kv = 1, .kv = &c.kv};
    if (g_gpu.ops->step_begin(g_gpu.ctx, &st) != LOOM_OK) die("step_begin");
    const int reps = rows == 1 ? 50 : 10;
    double f[2], sep[2];
    for (int i = 0; i < 2; i++) {
        f[i] = time_op(qk_fused_run, &c, 1, reps);
        sep[i] = time_op(qk_separate_run, &c, 1, reps);
    }
    const double sf = (f[0] + f[1]) / 2, ss = (sep[0] + sep[1]) / 2;
    printf("{\"kind\":\"qk\",\"mode\":\"%s\",\"rows\":%d,\"n_head\":%d,\"n_kv\":%d,"
           "\"hd\":%d,\"norms\":%s,\"s_fused\":%.6e,\"s_separate\":%.6e}\n",
           g_mode, rows, n_head, n_kv, hd, norms ? "true" : "false", sf, ss);
    fflush(stdout);
    free(pos_h);
    free(ids);
}

/* ---- sampling: a row's summary against the row --------------------------------------------- */

typedef struct sum_ctx {
    loom_tensor logits;
    loom_logit_summary *sum;
    loom_logit_cand *top;
    float *rows; /* host memory for whole rows (pageable, as the engine's) */
} sum_ctx;

static void sum_run(void *p, int copy) {
    (void)copy;
    sum_ctx *c = p;
    if (g_gpu.ops->logits_summary(g_gpu.ctx, &c->logits, 256, NULL, c->sum, c->top, NULL, NULL,
                                  NULL) != LOOM_OK)
        die("logits_summary");
}

static void rows_run(void *p, int copy) {
    (void)copy;
    sum_ctx *c = p;
    if (g_gpu.ops->tensor_get(g_gpu.ctx, c->rows, c->logits.data,
                              (size_t)c->logits.ne[0] * (size_t)c->logits.ne[1] * 4) != LOOM_OK)
        die("tensor_get");
}

/* What a decode step's sampling moves for batch rows of Gemma 3's 262,144-token vocabulary:
 * the summaries (logits_summary: the kernel, 2 KB a row to the host, the wait) against the
 * whole rows (1 MiB each over PCIe, what the host chain then reads). */
static void bench_sampling(int32_t batch) {
    const int64_t V = 262144;
    sum_ctx c;
    float *d = dev_alloc((size_t)(V * batch) * 4);
    dev_fill(d, (size_t)(V * batch) * 4);
    c.logits = loom_tensor_2d(LOOM_TYPE_F32, d, V, batch, (size_t)V * 4);
    c.sum = malloc(sizeof *c.sum * (size_t)batch);
    c.top = malloc(sizeof *c.top * 256 * (size_t)batch);
    c.rows = malloc((size_t)(V * batch) * 4);
    if (!c.sum || !c.top || !c.rows) die("malloc");
    const double s_sum = time_op(sum_run, &c, 1, 5), s_rows = time_op(rows_run, &c, 1, 5);
    printf("{\"kind\":\"sampling\",\"vocab\":%lld,\"batch\":%d,\"s_summary\":%.6e,"
           "\"s_rows\":%.6e,\"bytes_summary\":%zu,\"bytes_rows\":%lld}\n",
           (long long)V, batch, s_sum, s_rows,
           (size_t)batch * (sizeof *c.sum + 256 * sizeof *c.top), (long long)(V * batch * 4));
    fflush(stdout);
    free(c.sum);
    free(c.top);
    free(c.rows);
}

/* The shapes timed with 16-bit operands (BF16 math, and again on the wgmma kernels): BF16 and
 * Q4_K matmuls at 1, 16 and 512 tokens, a 2,048-token prefill's up/gate matmul (against cuBLAS
 * on the same shape), decode attention, 2k prefills (head sizes 128 and 64) and the 8k
 * BF16 prefill (head size 128). */
static void bench_16bit(int quick) {
    const uint32_t types16[] = {LOOM_TYPE_BF16, LOOM_TYPE_Q4_K};
    for (int ti = 0; ti < 2; ti++) {
        bench_matmul(types16[ti], 4096, 14336, 1);
        if (!quick) bench_matmul(types16[ti], 4096, 14336, 16);
        if (!quick) bench_matmul(types16[ti], 4096, 4096, 512);
    }
    if (!quick) bench_matmul(LOOM_TYPE_BF16, 4096, 14336, 2048);
    bench_attention(16, 8192, 1, 32, 8, 128, LOOM_TYPE_F16);
    if (!quick) bench_attention(1, 2048, 2048, 32, 8, 128, LOOM_TYPE_F16);
    /* head size 64, where the wgmma attention's register path fits 3 blocks an SM and its
     * warp-specialised form 1 (of two consumer warpgroups) */
    if (!quick) bench_attention(1, 2048, 2048, 32, 8, 64, LOOM_TYPE_F16);
    if (!quick) bench_attention(1, 8192, 8192, 32, 8, 128, LOOM_TYPE_BF16);
}

/* What the device said of LOOM_CUDA_WGMMA=1 when it opened (its INFO log lines). */
typedef struct wgmma_log {
    bool chosen;
    char refused[200];
} wgmma_log;

static void note_wgmma(loom_log_level level, const char *msg, void *user) {
    (void)level;
    wgmma_log *w = user;
    if (strstr(msg, "warpgroup MMA (LOOM_CUDA_WGMMA=1)") != NULL) w->chosen = true;
    if (strstr(msg, "LOOM_CUDA_WGMMA=1 ignored") != NULL) {
        /* JSON-safe: the log lines hold no quotes or backslashes, but keep it so */
        size_t j = 0;
        for (const char *p = msg; *p != '\0' && j + 1 < sizeof w->refused; p++)
            if (*p != '"' && *p != '\\') w->refused[j++] = *p;
        w->refused[j] = '\0';
    }
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    loom_backend_open_params op = {.device = 0};
    if (loom__backend_stream_open("cuda", &op, &g_gpu) != LOOM_OK) die("cuda backend");
    ceilings();
    /* Matmuls on Llama-3-8B's shapes (up/gate: 4096 -> 14336; down: 14336 -> 4096): decode and
     * small batches (T = 1, 8), then steps of more than 8 tokens (T = 16 and a prefill-sized
     * 512), all on the tensor-core GEMM (the invariant default); the fast mode's below. */
    const uint32_t types[] = {LOOM_TYPE_BF16, LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_K,
                              LOOM_TYPE_FP8_E4M3_ROWS};
    for (int ti = 0; ti < 4; ti++) {
        bench_matmul(types[ti], 4096, 14336, 1);
        bench_matmul(types[ti], 14336, 4096, 1);
        bench_matmul(types[ti], 4096, 14336, 8);
        if (!quick) bench_matmul(types[ti], 4096, 14336, 16);
        if (!quick) bench_matmul(types[ti], 4096, 4096, 512);
    }
    /* Decode attention at long contexts (Llama-3-8B heads: 32 over 8, head_dim 128), Gemma 3
     * 270M's (4 over 1, head_dim 256), and a prefill chunk (the tiled tensor-core kernel). */
    bench_attention(16, 8192, 1, 32, 8, 128, LOOM_TYPE_F16);
    bench_attention(64, 8192, 1, 32, 8, 128, LOOM_TYPE_F16);
    bench_attention(1, 16384, 1, 32, 8, 128, LOOM_TYPE_F16);
    bench_attention(16, 8192, 1, 4, 1, 256, LOOM_TYPE_F16);
    if (!quick) bench_attention(1, 2048, 2048, 32, 8, 128, LOOM_TYPE_F16);
    /* Paged against contiguous: the same shapes with the block table shuffled (the rows above
     * read their blocks in order). */
    g_shuffle = true;
    bench_attention(16, 8192, 1, 32, 8, 128, LOOM_TYPE_F16);
    if (!quick) bench_attention(1, 2048, 2048, 32, 8, 128, LOOM_TYPE_F16);
    g_shuffle = false;
    /* FP8 E4M3 pages on the same decode shapes: half the bytes read (issue goal: >= 1.6x the
     * F16 kernel's rate at >= 8k positions). */
    bench_attention(16, 8192, 1, 32, 8, 128, LOOM_TYPE_FP8_E4M3);
    bench_attention(64, 8192, 1, 32, 8, 128, LOOM_TYPE_FP8_E4M3);
    bench_attention(1, 16384, 1, 32, 8, 128, LOOM_TYPE_FP8_E4M3);
    bench_attention(16, 8192, 1, 4, 1, 256, LOOM_TYPE_FP8_E4M3);
    bench_sampling(1);
    bench_sampling(16);
    bench_sampling(64);
    /* a layer's q/k norms, rope and KV write: one launch against five (Llama-3-8B's heads, no
     * norms; Gemma 3 270M's, normed) at decode, a batch of decodes' size and a prefill */
    const int32_t qk_rows[] = {1, 64, 2048};
    for (int i = 0; i < 3; i++) bench_qk(qk_rows[i], 32, 8, 128, false);
    for (int i = 0; i < 3; i += 2) bench_qk(qk_rows[i], 4, 1, 256, true);
    loom__backend_stream_close(&g_gpu);
    /* The default's cost: the shapes whose kernel the fast mode (LOOM_CUDA_BATCH_INVARIANT=0)
     * changes — decode steps on the GEMV, decode attention on split-KV (a prefill chunk takes
     * the tiled kernel in both modes, without the segment folds' split in this one). */
    setenv("LOOM_CUDA_BATCH_INVARIANT", "0", 1);
    if (loom__backend_stream_open("cuda", &op, &g_gpu) != LOOM_OK) die("cuda backend");
    g_mode = "fast";
    for (int ti = 0; ti < 4; ti++) {
        bench_matmul(types[ti], 4096, 14336, 1);
        bench_matmul(types[ti], 14336, 4096, 1);
        bench_matmul(types[ti], 4096, 14336, 8);
    }
    bench_attention(16, 8192, 1, 32, 8, 128, LOOM_TYPE_F16);
    bench_attention(1, 16384, 1, 32, 8, 128, LOOM_TYPE_F16);
    bench_attention(16, 8192, 1, 4, 1, 256, LOOM_TYPE_F16);
    bench_attention(16, 8192, 1, 32, 8, 128, LOOM_TYPE_FP8_E4M3);
    if (!quick) bench_attention(1, 2048, 2048, 32, 8, 128, LOOM_TYPE_F16);
    loom__backend_stream_close(&g_gpu);
    /* FP8 weight rows through cuBLASLt's FP8 GEMM (the opt-in prefill path) on the prefill
     * shapes; rows say "+cublaslt". Where the device has no such GEMM they time loom's
     * tensor-core GEMM again. */
    if (!quick) {
        setenv("LOOM_CUDA_FP8_GEMM", "1", 1);
        if (loom__backend_stream_open("cuda", &op, &g_gpu) != LOOM_OK) die("cuda backend");
        g_type_suffix = "+cublaslt";
        bench_matmul(LOOM_TYPE_FP8_E4M3_ROWS, 4096, 14336, 512);
        bench_matmul(LOOM_TYPE_FP8_E4M3_ROWS, 4096, 4096, 512);
        loom__backend_stream_close(&g_gpu);
        unsetenv("LOOM_CUDA_FP8_GEMM");
        g_type_suffix = "";
    }
    /* BF16 math (LOOM_CUDA_MATH=bf16, batch-invariant): the tensor-core kernels on 16-bit
     * operands, as the peers compute, against the default's float32 accuracy on the same
     * shapes; and the prefill attention, BF16 pages, head size 128, causal, 8k, in
     * both. */
    unsetenv("LOOM_CUDA_BATCH_INVARIANT");
    if (!quick) {
        if (loom__backend_stream_open("cuda", &op, &g_gpu) != LOOM_OK) die("cuda backend");
        g_mode = "invariant";
        bench_attention(1, 8192, 8192, 32, 8, 128, LOOM_TYPE_BF16);
        loom__backend_stream_close(&g_gpu);
    }
    setenv("LOOM_CUDA_MATH", "bf16", 1);
    if (loom__backend_stream_open("cuda", &op, &g_gpu) != LOOM_OK) die("cuda backend");
    g_mode = "bf16-math";
    bench_16bit(quick);
    loom__backend_stream_close(&g_gpu);
    /* The same matmuls and attention shapes on the wgmma kernels (LOOM_CUDA_WGMMA=1, BF16 math,
     * sm_90 only), where the device takes them (its INFO log line says; else a note row says
     * why). */
    setenv("LOOM_CUDA_WGMMA", "1", 1);
    wgmma_log wl = {0};
    loom_log_set(note_wgmma, LOOM_LOG_INFO, &wl);
    if (loom__backend_stream_open("cuda", &op, &g_gpu) != LOOM_OK) die("cuda backend");
    loom_log_set(NULL, LOOM_LOG_WARN, NULL);
    if (wl.chosen) {
        g_mode = "wgmma";
        bench_16bit(quick);
    } else {
        printf("{\"kind\":\"note\",\"what\":\"wgmma kernels not run: %s\"}\n",
               wl.refused[0] ? wl.refused : "the device said neither yes nor no");
    }
    loom__backend_stream_close(&g_gpu);
    /* The wgmma attention's prefills again with its K and V tiles read through registers one
     * at a time (LOOM_CUDA_ATTN_ASYNC=0) rather than warp-specialised (the default for these
     * 16-bit pages: a producer warpgroup's cp.async into a ring of stages for two consumer
     * warpgroups): what the specialisation and the copies' pipelining gain. */
    if (wl.chosen && !quick) {
        setenv("LOOM_CUDA_ATTN_ASYNC", "0", 1);
        if (loom__backend_stream_open("cuda", &op, &g_gpu) != LOOM_OK) die("cuda backend");
        g_mode = "wgmma-regs";
        bench_attention(1, 2048, 2048, 32, 8, 128, LOOM_TYPE_F16);
        bench_attention(1, 2048, 2048, 32, 8, 64, LOOM_TYPE_F16);
        bench_attention(1, 8192, 8192, 32, 8, 128, LOOM_TYPE_BF16);
        loom__backend_stream_close(&g_gpu);
        unsetenv("LOOM_CUDA_ATTN_ASYNC");
        /* the wgmma GEMM over BF16 weights with its copies from the block's own warps, two
         * chunks ahead (LOOM_CUDA_GEMM_WS=0), rather than warp-specialised (the default); and
         * warp-specialised with its producer's copies by cp.async (128 threads,
         * LOOM_CUDA_GEMM_TMA=0) rather than TMA (one thread's tensor-map copies, the default) */
        bench_bf16_gemm_with(&op, "LOOM_CUDA_GEMM_WS", "wgmma-plain");
        bench_bf16_gemm_with(&op, "LOOM_CUDA_GEMM_TMA", "wgmma-cp");
    }
    unsetenv("LOOM_CUDA_WGMMA");
    unsetenv("LOOM_CUDA_MATH");
    return 0;
}
