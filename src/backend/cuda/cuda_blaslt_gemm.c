/* cuda_blaslt_gemm.c — the fast mode's library GEMMs: steps of many tokens on cuBLASLt, for the
 * weights where it does what loom's own GEMM does, faster:
 *   - FP8 weight rows (LOOM_CUDA_FP8_GEMM=1, sm_89 and later): the activations quantized to
 *     E4M3 with one scale per token (kernels/blaslt_gemm.cu), the GEMM of the codes with unit
 *     scales into float32, and an epilogue multiplying each output by its weight row's scale
 *     and its token's;
 *   - BF16 weights in BF16 math (LOOM_CUDA_MATH=bf16): the activations rounded to BF16, the
 *     BF16 GEMM into float32 — the arithmetic of loom's own GEMM in BF16 math, in cuBLASLt's
 *     order of additions.
 *
 * Only with batch invariance off (LOOM_CUDA_BATCH_INVARIANT=0), because cuBLASLt picks its
 * algorithm, and with it the order of the sums, by the shape: a token's result then depends on
 * its batch. The FP8 GEMM also gives up the float32 activations loom's own kernels keep. Steps
 * of at most 8 tokens stay on the GEMV either way.
 *
 * cuBLASLt is opened with dlopen when the device opens, not linked: the plugin loads, and runs
 * everything else, on a machine whose toolkit has no cuBLAS; there the opt-in logs why it is
 * off. */
#include "backend/cuda/cuda_internal.h"

#include "core/log.h"
#include "tensor/types.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* Steps of more tokens than this go to the GEMM (the GEMV's group of tokens), and of at most
 * BLT_MAX_TOKENS (the activation kernels' and the epilogue's grids). */
#define BLT_MIN_TOKENS 8
#define BLT_MAX_TOKENS 65535
/* cuBLASLt's workspace per stream. */
#define BLT_WORKSPACE (32u << 20)

/* The cuBLASLt entry points used, resolved from the library. */
struct loom__cuda_blaslt {
    void *lib;
    cublasLtHandle_t handle;
    __typeof__(&cublasLtCreate) create;
    __typeof__(&cublasLtDestroy) destroy;
    __typeof__(&cublasLtMatmulDescCreate) desc_create;
    __typeof__(&cublasLtMatmulDescDestroy) desc_destroy;
    __typeof__(&cublasLtMatmulDescSetAttribute) desc_set;
    __typeof__(&cublasLtMatrixLayoutCreate) layout_create;
    __typeof__(&cublasLtMatrixLayoutDestroy) layout_destroy;
    __typeof__(&cublasLtMatmulPreferenceCreate) pref_create;
    __typeof__(&cublasLtMatmulPreferenceDestroy) pref_destroy;
    __typeof__(&cublasLtMatmulPreferenceSetAttribute) pref_set;
    __typeof__(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    __typeof__(&cublasLtMatmul) matmul;
    bool fp8, bf16; /* the GEMMs it runs: FP8 weight rows; BF16 weights */
};

void loom__cuda_blaslt_close(loom__cuda_dev *d) {
    loom__cuda_blaslt *b = d->blaslt;
    if (b == NULL) return;
    if (b->handle != NULL) (void)b->destroy(b->handle);
    dlclose(b->lib);
    free(b);
    d->blaslt = NULL;
}

/* Resolves every entry point into b; false (with the missing name) when one is absent. */
static bool resolve(loom__cuda_blaslt *b, const char **missing) {
#define LOOM_BLT_SYM(field, name)                                                                  \
    do {                                                                                           \
        *(void **)&b->field = dlsym(b->lib, name);                                                 \
        if (b->field == NULL) {                                                                    \
            *missing = name;                                                                       \
            return false;                                                                          \
        }                                                                                          \
    } while (0)
    LOOM_BLT_SYM(create, "cublasLtCreate");
    LOOM_BLT_SYM(destroy, "cublasLtDestroy");
    LOOM_BLT_SYM(desc_create, "cublasLtMatmulDescCreate");
    LOOM_BLT_SYM(desc_destroy, "cublasLtMatmulDescDestroy");
    LOOM_BLT_SYM(desc_set, "cublasLtMatmulDescSetAttribute");
    LOOM_BLT_SYM(layout_create, "cublasLtMatrixLayoutCreate");
    LOOM_BLT_SYM(layout_destroy, "cublasLtMatrixLayoutDestroy");
    LOOM_BLT_SYM(pref_create, "cublasLtMatmulPreferenceCreate");
    LOOM_BLT_SYM(pref_destroy, "cublasLtMatmulPreferenceDestroy");
    LOOM_BLT_SYM(pref_set, "cublasLtMatmulPreferenceSetAttribute");
    LOOM_BLT_SYM(heuristic, "cublasLtMatmulAlgoGetHeuristic");
    LOOM_BLT_SYM(matmul, "cublasLtMatmul");
#undef LOOM_BLT_SYM
    return true;
}

void loom__cuda_blaslt_open(loom__cuda_dev *d) {
    const char *want = getenv("LOOM_CUDA_FP8_GEMM");
    bool fp8 = want != NULL && strcmp(want, "1") == 0;
    const bool bf16 = d->math == LOOM_K_MATH_BF16;
    if (fp8 && d->cc_major * 10 + d->cc_minor < 89) {
        loom__log(LOOM_LOG_INFO,
                  "cuda: LOOM_CUDA_FP8_GEMM: %s (compute capability %d.%d) has no FP8 tensor "
                  "cores; FP8 weights stay on loom's kernels",
                  d->name, d->cc_major, d->cc_minor);
        fp8 = false;
    }
    if (!fp8 && !bf16) return;
    loom__cuda_blaslt *b = calloc(1, sizeof *b);
    if (b == NULL) return;
    b->fp8 = fp8;
    b->bf16 = bf16;
    const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    for (size_t i = 0; b->lib == NULL && i < sizeof names / sizeof *names; i++)
        b->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    const char *missing = NULL;
    if (b->lib == NULL || !resolve(b, &missing) || b->create(&b->handle) != CUBLAS_STATUS_SUCCESS) {
        loom__log(LOOM_LOG_INFO, "cuda: cuBLASLt %s; every matmul stays on loom's kernels",
                  b->lib == NULL ? "cannot be loaded (libcublasLt.so.13/.12 not found)"
                  : missing      ? "lacks an entry point"
                                 : "would not create a handle");
        if (b->lib != NULL) dlclose(b->lib);
        free(b);
        return;
    }
    d->blaslt = b;
    if (fp8)
        loom__log(LOOM_LOG_INFO,
                  "cuda: FP8 weights: steps of more than %d tokens use cuBLASLt's FP8 "
                  "GEMM (activations in E4M3; not batch-invariant)",
                  BLT_MIN_TOKENS);
    if (bf16)
        loom__log(LOOM_LOG_INFO,
                  "cuda: BF16 weights: steps of more than %d tokens use cuBLASLt's BF16 "
                  "GEMM (activations in BF16; not batch-invariant)",
                  BLT_MIN_TOKENS);
}

/* The stream's room for one GEMM: the activations of n_tokens rows of k in elt-byte values
 * (16-byte rows), their scales (FP8), cuBLASLt's workspace. */
static loom_status reserve(loom__cuda_stream *c, int64_t n_tokens, int64_t k, size_t elt,
                           size_t *xq_stride) {
    *xq_stride = ((size_t)k * elt + 15) & ~(size_t)15;
    const size_t need =
        *xq_stride * (size_t)n_tokens + (size_t)n_tokens * sizeof(float) + 256 + BLT_WORKSPACE;
    if (need <= c->blaslt_work_cap) return LOOM_OK;
    c->n_grows++;
    return loom__cuda_regrow(c, &c->blaslt_work, &c->blaslt_work_cap, need);
}

/* The largest power of two (up to 256) dividing both a pointer and a leading dimension in
 * bytes: what cuBLASLt may assume of a matrix's alignment. */
static uint32_t alignment_of(const void *p, size_t ld_bytes) {
    uint32_t a = 256;
    while (a > 1 && (((uintptr_t)p | ld_bytes) & (a - 1)) != 0) a >>= 1;
    return a;
}

/* Why loom's own kernels run a step cuBLASLt was meant for: said once per stream. */
static void refuse(loom__cuda_stream *c, const char *why, const loom_tensor *w, int64_t T,
                   int status) {
    bool *said = &c->blaslt_refused[w->type == LOOM_TYPE_BF16];
    if (*said) return;
    *said = true;
    loom__log(LOOM_LOG_INFO,
              "cuda: cuBLASLt GEMM %lld x %lld x %lld (%s weights): %s (status %d); loom's "
              "kernels run it",
              (long long)w->ne[1], (long long)T, (long long)w->ne[0], loom__type_name(w->type), why,
              status);
}

/* Sets the descriptors of D[n][t] = sum_k A[n][k] B[t][k] (column-major: A k x n transposed,
 * B k x t, D n x t; A and B of type ab, elt bytes a value), and runs the first algorithm
 * cuBLASLt proposes for the matrices' real alignments. Whatever cuBLASLt declines leaves *done
 * false for loom's kernels to run the step. */
static void run_gemm(loom__cuda_stream *c, const loom_tensor *w, cudaDataType_t ab, size_t elt,
                     const void *xq, size_t xq_stride, int64_t n_tokens, loom_tensor *out, void *ws,
                     bool *done) {
    loom__cuda_blaslt *b = c->dev->blaslt;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const uint64_t ws_bytes = BLT_WORKSPACE;
    cublasStatus_t s = b->desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = b->desc_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = b->desc_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = b->layout_create(&la, ab, (uint64_t)w->ne[0], (uint64_t)w->ne[1],
                             (int64_t)(w->row_stride / elt));
    if (s == CUBLAS_STATUS_SUCCESS)
        s = b->layout_create(&lb, ab, (uint64_t)w->ne[0], (uint64_t)n_tokens,
                             (int64_t)(xq_stride / elt));
    if (s == CUBLAS_STATUS_SUCCESS)
        s = b->layout_create(&ld, CUDA_R_32F, (uint64_t)w->ne[1], (uint64_t)n_tokens,
                             (int64_t)(out->row_stride / sizeof(float)));
    if (s == CUBLAS_STATUS_SUCCESS) s = b->pref_create(&pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = b->pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
    const uint32_t align[4] = {alignment_of(w->data, w->row_stride), alignment_of(xq, xq_stride),
                               alignment_of(out->data, out->row_stride),
                               alignment_of(out->data, out->row_stride)};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = b->pref_set(pref, align_attr[i], &align[i], sizeof align[i]);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = b->heuristic(b->handle, op, la, lb, ld, ld, pref, 1, &heur, &found);
    if (s == CUBLAS_STATUS_SUCCESS && found > 0) {
        const float one = 1.0f, zero = 0.0f;
        s = b->matmul(b->handle, op, &one, w->data, la, xq, lb, &zero, out->data, ld, out->data, ld,
                      &heur.algo, ws, BLT_WORKSPACE, c->s);
        if (s == CUBLAS_STATUS_SUCCESS)
            *done = true;
        else /* declined at launch: nothing ran, and the GEMV writes out */
            refuse(c, "cublasLtMatmul declined it", w, n_tokens, (int)s);
    } else {
        refuse(c, "cuBLASLt proposes no algorithm", w, n_tokens, (int)s);
    }
    if (pref) b->pref_destroy(pref);
    if (ld) b->layout_destroy(ld);
    if (lb) b->layout_destroy(lb);
    if (la) b->layout_destroy(la);
    if (op) b->desc_destroy(op);
}

bool loom__cuda_blaslt_takes(const loom__cuda_dev *d, loom_type type) {
    const loom__cuda_blaslt *b = d->blaslt;
    return b != NULL &&
           ((b->fp8 && type == LOOM_TYPE_FP8_E4M3_ROWS) || (b->bf16 && type == LOOM_TYPE_BF16));
}

loom_status loom__cuda_blaslt_gemm(loom__cuda_stream *c, const loom_tensor *w, const loom_tensor *x,
                                   loom_tensor *out, bool *done) {
    *done = false;
    const int64_t T = x->ne[1];
    const bool takes = loom__cuda_blaslt_takes(c->dev, w->type);
    const bool fp8 = takes && w->type == LOOM_TYPE_FP8_E4M3_ROWS;
    const bool bf16 = takes && w->type == LOOM_TYPE_BF16;
    if ((!fp8 && !bf16) || T <= BLT_MIN_TOKENS || T > BLT_MAX_TOKENS || w->row_stride % 16 != 0 ||
        out->row_stride % 16 != 0 || ((uintptr_t)w->data & 15) != 0 ||
        ((uintptr_t)out->data & 15) != 0)
        return LOOM_OK;
    LOOM_TRY(loom__cuda_flush(c)); /* cuBLASLt's calls run uncaptured */
    const size_t elt = fp8 ? 1 : 2;
    size_t xq_stride;
    if (reserve(c, T, w->ne[0], elt, &xq_stride) != LOOM_OK) { /* no room: loom's need none */
        loom__clear_error();
        refuse(c, "no device memory for its workspace", w, T, 0);
        return LOOM_OK;
    }
    uint8_t *xq = c->blaslt_work;
    float *x_scale = (float *)(xq + xq_stride * (size_t)T);
    void *ws = (char *)c->blaslt_work +
               ((xq_stride * (size_t)T + (size_t)T * sizeof(float) + 255) & ~(size_t)255);
    if (bf16) {
        LOOM_TRY(loom__cuda_acts_to_bf16(c->s, x->data, x->row_stride, T, w->ne[0], (uint16_t *)xq,
                                         xq_stride));
        run_gemm(c, w, CUDA_R_16BF, 2, xq, xq_stride, T, out, ws, done);
        return LOOM_OK;
    }
    LOOM_TRY(loom__cuda_fp8_quantize_acts(c->s, x->data, x->row_stride, T, w->ne[0], xq, xq_stride,
                                          x_scale));
    run_gemm(c, w, CUDA_R_8F_E4M3, 1, xq, xq_stride, T, out, ws, done);
    if (!*done) return LOOM_OK;
    const loom__k_weight kw = {.type = (uint32_t)w->type,
                               .k = w->ne[0],
                               .n = w->ne[1],
                               .stride = w->row_stride,
                               .data = w->data};
    return loom__cuda_fp8_scale_out(c->s, &kw, out->data, out->row_stride, T, x_scale);
}
