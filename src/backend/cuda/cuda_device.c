/* cuda_device.c — the CUDA backend's device: opening a GPU (or saying why there is none),
 * device buffers (cudaMalloc: no managed memory), pinned host memory, the memory query, and
 * weight preparation: each weight is uploaded in its stored format where the kernels read it
 * in place, and decoded to bfloat16 on the host first where they do not (said once per type in
 * the log). */
#include "backend/cuda/cuda_internal.h"

#include "core/checked.h"
#include "core/log.h"
#include "tensor/quant.h"
#include "tensor/types.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Device allocations are aligned to this (cudaMalloc gives 256; arena slices keep it). */
#define LOOM_CUDA_ALIGN 256

struct loom_buffer {
    void *ptr;
    size_t bytes;
};

struct loom__cuda_chunk {
    loom__cuda_chunk *next;
    char *base; /* device memory */
    size_t cap, used;
};

loom_status loom__cuda_status(cudaError_t e, const char *call) {
    loom_status st = e == cudaErrorMemoryAllocation ? LOOM_ERR_OUT_OF_MEMORY : LOOM_ERR_BACKEND;
    (void)cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    return loom__fail(st, "cuda: %s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

loom_status loom__cuda_bind(const loom__cuda_dev *d) {
    LOOM_CU_TRY(cudaSetDevice(d->device));
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Open, close, memory                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* The driver's cuTensorMapEncodeTiled in its CUDA 12.0 form, through the runtime (the plugin
 * links no libcuda); NULL, logged, where the driver has none. */
static loom__k_tmap_encode_fn tmap_encoder(void) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                     cudaEnableDefault, &found);
#else
    cudaError_t e =
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == NULL) {
        (void)cudaGetLastError();
        loom__log(LOOM_LOG_INFO, "cuda: the driver has no cuTensorMapEncodeTiled: the "
                                 "warp-specialised wgmma GEMM copies its tiles by cp.async");
        return NULL;
    }
    loom__k_tmap_encode_fn enc;
    memcpy(&enc, &fn, sizeof enc); /* an object pointer to a function pointer, as dlsym's */
    loom__log(LOOM_LOG_INFO, "cuda: the warp-specialised wgmma GEMM copies its tiles by TMA "
                             "(LOOM_CUDA_GEMM_TMA=0: by cp.async)");
    return enc;
}

loom_status loom__cuda_open(const loom_backend_open_params *p, void **out) {
    LOOM_CHECK_ARG(p != NULL && out != NULL);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        /* Without a driver the runtime says "driver version is insufficient": say which. */
        void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (drv != NULL) dlclose(drv);
        return loom__fail(LOOM_ERR_NO_DEVICE, "cuda: no usable CUDA device: %s%s (%s)",
                          drv == NULL ? "no NVIDIA driver (libcuda.so.1 cannot be loaded); " : "",
                          cudaGetErrorString(e), cudaGetErrorName(e));
    }
    LOOM_RETURN_IF(count == 0, LOOM_ERR_NO_DEVICE, "cuda: the driver reports no CUDA device");
    LOOM_RETURN_IF(p->device < 0 || p->device >= count, LOOM_ERR_NO_DEVICE,
                   "cuda: device %d does not exist (%d device%s: 0..%d)", p->device, count,
                   count == 1 ? "" : "s", count - 1);
    struct cudaDeviceProp prop;
    LOOM_CU_TRY(cudaGetDeviceProperties(&prop, p->device));
    LOOM_RETURN_IF(prop.major < 8, LOOM_ERR_NO_DEVICE,
                   "cuda: device %d (%s) has compute capability %d.%d; loom's kernels need 8.0 "
                   "or later",
                   p->device, prop.name, prop.major, prop.minor);
    LOOM_CU_TRY(cudaSetDevice(p->device));
    loom__cuda_dev *d = calloc(1, sizeof *d);
    LOOM_RETURN_IF(d == NULL, LOOM_ERR_OUT_OF_MEMORY, "cuda: out of memory");
    d->device = p->device;
    d->cc_major = prop.major;
    d->cc_minor = prop.minor;
    d->n_sms = prop.multiProcessorCount;
    d->smem_optin = (int)prop.sharedMemPerBlockOptin;
    snprintf(d->name, sizeof d->name, "%s", prop.name);
    d->weight_bytes = p->weight_bytes;
    pthread_mutex_init(&d->mu, NULL);
    /* A binary built without this device's architecture fails at its first launch: say so now,
     * with the device named, rather than in the middle of a step. */
    loom_status st = loom__cuda_kernels_probe();
    if (st != LOOM_OK) {
        loom__error_prefix("cuda: device %d (%s, sm_%d%d)", d->device, d->name, d->cc_major,
                           d->cc_minor);
        loom__cuda_close(d);
        return LOOM_ERR_NO_DEVICE;
    }
    loom__log(LOOM_LOG_INFO, "cuda: device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB",
              d->device, d->name, d->cc_major, d->cc_minor, d->n_sms,
              (double)prop.totalGlobalMem / (1u << 30));
    const char *math = getenv("LOOM_CUDA_MATH");
    d->math = LOOM_K_MATH_F32;
    if (math != NULL && strcmp(math, "bf16") == 0) {
        d->math = LOOM_K_MATH_BF16;
        loom__log(LOOM_LOG_INFO, "cuda: tensor-core products on 16-bit operands (LOOM_CUDA_MATH="
                                 "bf16): matmul in BF16, attention in F16 or BF16 by page type, "
                                 "sums in float32");
    } else if (math != NULL && strcmp(math, "f32") != 0) {
        loom__cuda_close(d);
        return loom__fail(LOOM_ERR_INVALID_ARG, "cuda: LOOM_CUDA_MATH=%s: not f32 or bf16", math);
    }
    d->tc_math = d->math;
    const char *wgmma = getenv("LOOM_CUDA_WGMMA");
    if (wgmma != NULL && strcmp(wgmma, "1") == 0) {
        int runs = 0;
        if (d->math != LOOM_K_MATH_BF16)
            loom__log(LOOM_LOG_INFO, "cuda: LOOM_CUDA_WGMMA=1 ignored: the wgmma GEMM takes BF16 "
                                     "operands (LOOM_CUDA_MATH=bf16)");
        else if (d->cc_major != 9 || d->cc_minor != 0)
            loom__log(LOOM_LOG_INFO,
                      "cuda: LOOM_CUDA_WGMMA=1 ignored: wgmma needs sm_90 (the "
                      "device is sm_%d%d)",
                      d->cc_major, d->cc_minor);
        else if (loom__cuda_wgmma_probe(&runs) != LOOM_OK)
            loom__log(LOOM_LOG_INFO, "cuda: LOOM_CUDA_WGMMA=1 ignored: %s", loom__error_message());
        else if (!runs)
            loom__log(LOOM_LOG_INFO, "cuda: LOOM_CUDA_WGMMA=1 ignored: this build has no sm_90a "
                                     "code for the device (LOOM_CUDA_ARCHITECTURES)");
        else {
            d->tc_math = LOOM_K_MATH_BF16_WGMMA;
            loom__log(LOOM_LOG_INFO,
                      "cuda: matmul and the tiled attention of head sizes 64 and 128 "
                      "on Hopper's warpgroup MMA (LOOM_CUDA_WGMMA=1)");
        }
    }
    const char *attn_async = getenv("LOOM_CUDA_ATTN_ASYNC");
    d->attn_tile_regs = attn_async != NULL && strcmp(attn_async, "0") == 0;
    if (d->attn_tile_regs && d->tc_math == LOOM_K_MATH_BF16_WGMMA)
        loom__log(LOOM_LOG_INFO, "cuda: LOOM_CUDA_ATTN_ASYNC=0: the wgmma attention reads its "
                                 "K and V tiles through registers, one at a time, not "
                                 "warp-specialised");
    const char *gemm_ws = getenv("LOOM_CUDA_GEMM_WS");
    d->gemm_plain = gemm_ws != NULL && strcmp(gemm_ws, "0") == 0;
    if (d->gemm_plain && d->tc_math == LOOM_K_MATH_BF16_WGMMA)
        loom__log(LOOM_LOG_INFO, "cuda: LOOM_CUDA_GEMM_WS=0: the wgmma GEMM copies its BF16 "
                                 "tiles from its own warps, not warp-specialised");
    const char *gemm_tma = getenv("LOOM_CUDA_GEMM_TMA");
    if (d->tc_math == LOOM_K_MATH_BF16_WGMMA && !d->gemm_plain &&
        !(gemm_tma != NULL && strcmp(gemm_tma, "0") == 0))
        d->tmap_encode = tmap_encoder();
    else if (d->tc_math == LOOM_K_MATH_BF16_WGMMA && !d->gemm_plain)
        loom__log(LOOM_LOG_INFO, "cuda: LOOM_CUDA_GEMM_TMA=0: the warp-specialised wgmma GEMM "
                                 "copies its tiles by cp.async, not TMA");
    const char *fuse = getenv("LOOM_CUDA_FUSE");
    d->unfused = fuse != NULL && strcmp(fuse, "0") == 0;
    if (d->unfused)
        loom__log(LOOM_LOG_INFO, "cuda: LOOM_CUDA_FUSE=0: a layer's q/k norms, rope and KV write, "
                                 "and its post-norms and residual adds, as separate launches");
    const char *inv = getenv("LOOM_CUDA_BATCH_INVARIANT");
    d->batch_invariant = !(inv != NULL && strcmp(inv, "0") == 0);
    if (d->batch_invariant)
        loom__log(LOOM_LOG_INFO,
                  "cuda: batch-invariant: every matmul on the tensor-core GEMM's one order, every "
                  "attention row on one kernel (LOOM_CUDA_BATCH_INVARIANT=0 turns it off)");
    if (d->batch_invariant && getenv("LOOM_CUDA_FP8_GEMM") != NULL &&
        strcmp(getenv("LOOM_CUDA_FP8_GEMM"), "1") == 0)
        loom__log(LOOM_LOG_INFO, "cuda: LOOM_CUDA_FP8_GEMM=1 ignored: cuBLASLt's sums depend on "
                                 "the step's shape; it needs LOOM_CUDA_BATCH_INVARIANT=0");
    if (!d->batch_invariant) loom__cuda_blaslt_open(d);
    const char *graphs = getenv("LOOM_CUDA_GRAPHS");
    d->graphs = graphs != NULL && strcmp(graphs, "1") == 0;
    if (d->graphs)
        loom__log(LOOM_LOG_INFO, "cuda: a step's kernels replayed as CUDA graphs "
                                 "(LOOM_CUDA_GRAPHS=1)");
    *out = d;
    return LOOM_OK;
}

void loom__cuda_close(void *dev) {
    loom__cuda_dev *d = dev;
    if (d == NULL) return;
    (void)cudaSetDevice(d->device);
    loom__cuda_blaslt_close(d);
    for (loom__cuda_chunk *c = d->chunks, *next; c != NULL; c = next) {
        next = c->next;
        (void)cudaFree(c->base);
        free(c);
    }
    pthread_mutex_destroy(&d->mu);
    free(d);
}

loom_status loom__cuda_memory_info(void *dev, size_t *free_bytes, size_t *total_bytes) {
    LOOM_CHECK_ARG(dev != NULL && free_bytes != NULL && total_bytes != NULL);
    LOOM_TRY(loom__cuda_bind(dev));
    LOOM_CU_TRY(cudaMemGetInfo(free_bytes, total_bytes));
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Buffers and pinned host memory                                                             */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cuda_buffer_alloc(void *dev, size_t bytes, loom_buffer **out) {
    LOOM_CHECK_ARG(dev != NULL && out != NULL);
    LOOM_TRY(loom__cuda_bind(dev));
    loom_buffer *b = malloc(sizeof *b);
    LOOM_RETURN_IF(b == NULL, LOOM_ERR_OUT_OF_MEMORY, "cuda: out of memory for a buffer");
    cudaError_t e = cudaMalloc(&b->ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        free(b);
        (void)cudaGetLastError();
        return loom__fail(
            e == cudaErrorMemoryAllocation ? LOOM_ERR_OUT_OF_MEMORY : LOOM_ERR_BACKEND,
            "cuda: cannot allocate a %zu-byte device buffer: %s", bytes, cudaGetErrorString(e));
    }
    b->bytes = bytes;
    *out = b;
    return LOOM_OK;
}

void loom__cuda_buffer_free(void *dev, loom_buffer *buf) {
    if (buf == NULL) return;
    if (dev != NULL) (void)loom__cuda_bind(dev);
    (void)cudaFree(buf->ptr);
    free(buf);
}

void *loom__cuda_buffer_base(void *dev, loom_buffer *buf) {
    (void)dev;
    return buf ? buf->ptr : NULL;
}

loom_status loom__cuda_host_alloc(void *dev, size_t bytes, void **out) {
    LOOM_CHECK_ARG(dev != NULL && out != NULL);
    LOOM_TRY(loom__cuda_bind(dev));
    LOOM_CU_TRY(cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable));
    return LOOM_OK;
}

void loom__cuda_host_free(void *dev, void *ptr) {
    (void)dev;
    if (ptr != NULL) (void)cudaFreeHost(ptr);
}

/* ------------------------------------------------------------------------------------------ */
/* Weights                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* bytes of device memory for a weight, from the arena (allocated at the first call, of the
 * open-time size) or a chunk of its own. Under d->mu. */
static loom_status weight_space(loom__cuda_dev *d, size_t bytes, void **out) {
    size_t need;
    LOOM_RETURN_IF(loom__add_overflow_size(bytes, LOOM_CUDA_ALIGN - 1, &need),
                   LOOM_ERR_OUT_OF_MEMORY, "cuda: a weight of %zu bytes", bytes);
    need -= need % LOOM_CUDA_ALIGN;
    for (loom__cuda_chunk *c = d->chunks; c != NULL; c = c->next) {
        if (c->cap - c->used >= need) {
            *out = c->base + c->used;
            c->used += need;
            return LOOM_OK;
        }
    }
    size_t cap = d->chunks == NULL && d->weight_bytes > need ? d->weight_bytes : need;
    loom__cuda_chunk *c = calloc(1, sizeof *c);
    LOOM_RETURN_IF(c == NULL, LOOM_ERR_OUT_OF_MEMORY, "cuda: out of memory");
    cudaError_t e = cudaMalloc((void **)&c->base, cap);
    if (e != cudaSuccess) {
        free(c);
        (void)cudaGetLastError();
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY,
                          "cuda: cannot allocate %zu bytes of device memory for weights: %s", cap,
                          cudaGetErrorString(e));
    }
    c->cap = cap;
    c->used = need;
    c->next = d->chunks;
    d->chunks = c;
    *out = c->base;
    return LOOM_OK;
}

/* A weight the kernels cannot read in place, decoded row by row to bfloat16 on the host, into
 * host memory the caller frees. */
static loom_status decode_to_bf16(const loom_weight_src *src, uint16_t **out) {
    const size_t n = (size_t)src->ne[0] * (size_t)src->ne[1];
    uint16_t *bf = malloc((n ? n : 1) * sizeof *bf);
    float *row = malloc((size_t)src->ne[0] * sizeof *row);
    if (bf == NULL || row == NULL) {
        free(bf);
        free(row);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "cuda: out of memory decoding %s", src->name);
    }
    for (int64_t r = 0; r < src->ne[1]; r++) {
        const char *in = (const char *)src->data + (size_t)r * src->row_stride;
        if (!loom__dequantize_row(src->type, in, row, src->ne[0])) {
            free(bf);
            free(row);
            return loom__fail(LOOM_ERR_UNSUPPORTED, "cuda: %s: cannot decode type %s", src->name,
                              loom__type_name(src->type));
        }
        (void)loom__quantize_row(LOOM_TYPE_BF16, row, bf + (size_t)r * (size_t)src->ne[0],
                                 src->ne[0]); /* never fails for bf16 */
    }
    free(row);
    *out = bf;
    return LOOM_OK;
}

loom_status loom__cuda_weight_prepare(void *dev, const loom_weight_src *src, loom_tensor *out) {
    loom__cuda_dev *d = dev;
    LOOM_CHECK_ARG(d != NULL && src != NULL && out != NULL);
    LOOM_CHECK_ARG(src->ne[0] >= 1 && src->ne[1] >= 0 && (src->data != NULL || src->ne[1] == 0));
    const char *name = src->name ? src->name : "(unnamed)";
    const loom__type_traits *tr = loom__type_get_traits(src->type);
    LOOM_RETURN_IF(tr == NULL || !tr->can_dequantize, LOOM_ERR_UNSUPPORTED,
                   "cuda: weight %s has type %s, which loom cannot read", name,
                   loom__type_name(src->type));
    size_t row_bytes;
    LOOM_RETURN_IF(!loom__type_row_bytes(src->type, src->ne[0], &row_bytes) ||
                       (src->ne[1] > 1 && src->row_stride < row_bytes),
                   LOOM_ERR_INVALID_ARG, "cuda: weight %s: rows of %lld %s values", name,
                   (long long)src->ne[0], loom__type_name(src->type));
    LOOM_TRY(loom__cuda_bind(d));

    const bool native = loom__cuda_weight_type_native(src->type) != 0;
    uint16_t *decoded = NULL;
    loom_type type = src->type;
    const void *host = src->data;
    size_t host_stride = src->ne[1] <= 1 ? row_bytes : src->row_stride; /* one row: any stride */
    if (!native) {
        LOOM_TRY(decode_to_bf16(src, &decoded));
        type = LOOM_TYPE_BF16;
        host = decoded;
        row_bytes = host_stride = (size_t)src->ne[0] * 2;
    }
    /* FP8 rows are kept 16-byte aligned (their stride padded): the kernels load their codes 16
     * at a time, and cuBLASLt's FP8 GEMM wants such a leading dimension. */
    const size_t pitch =
        type == LOOM_TYPE_FP8_E4M3_ROWS ? (row_bytes + 15) & ~(size_t)15 : row_bytes;
    size_t bytes;
    loom_status st = LOOM_OK;
    if (loom__mul_overflow_size(pitch, (size_t)src->ne[1], &bytes)) {
        free(decoded);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "cuda: weight %s is too large", name);
    }
    void *dst = NULL;
    pthread_mutex_lock(&d->mu);
    st = weight_space(d, bytes, &dst);
    if (st == LOOM_OK && !native && (d->converted_logged & (1ull << (src->type & 63))) == 0) {
        d->converted_logged |= 1ull << (src->type & 63);
        loom__log(LOOM_LOG_INFO,
                  "cuda: %s weights are decoded to bf16 at load (no kernel reads %s in place; "
                  "first: %s)",
                  loom__type_name(src->type), loom__type_name(src->type), name);
    }
    pthread_mutex_unlock(&d->mu);
    if (st == LOOM_OK && bytes > 0) {
        cudaError_t e = host_stride == row_bytes && pitch == row_bytes
                            ? cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice)
                            : cudaMemcpy2D(dst, pitch, host, host_stride, row_bytes,
                                           (size_t)src->ne[1], cudaMemcpyHostToDevice);
        if (e != cudaSuccess) st = loom__cuda_status(e, "cudaMemcpy2D (weight upload)");
    }
    free(decoded);
    if (st != LOOM_OK) {
        loom__error_prefix("weight %s", name);
        return st;
    }
    *out = loom_tensor_2d(type, dst, src->ne[0], src->ne[1], pitch);
    return LOOM_OK;
}
