/* elementwise.cu — the row-wise and element-wise ops of the forward pass: rms_norm (one block
 * per row), add (with a broadcast row), scale, and the gated activations (SwiGLU, GeGLU with
 * the tanh approximation). Float32 throughout, like the CPU backend's. */
#include "common.cuh"

/* ---- rms_norm ------------------------------------------------------------------------------ */

#define RMS_THREADS LOOM_RMS_THREADS

typedef struct rms_args {
    loom__k_rows shape;
    float *x;       /* read; written where y is given (the sum) */
    const float *y; /* the residual to add first, or NULL */
    const float *w;
    float *out;
    float eps;
    const float *wy; /* y normed first (rms_norm(y) * wy) before the add, or NULL: y as is */
} rms_args;

/* One block per row: (x += y where y is given, y normed first where wy is,) the sum of squares
 * in a fixed order (loom_rms_inv), then the row scaled. Every thread reads back only what it
 * wrote itself, and the row is read whole before it is written (loom_rms_inv's second barrier),
 * so out may be x (plain rms_norm). The same order with and without y and wy: add_rms_norm has
 * the bits of add then rms_norm, norm_add_rms_norm those of rms_norm, add, rms_norm. */
static __global__ void __launch_bounds__(RMS_THREADS) rms_norm_kernel(rms_args a) {
    __shared__ float warp_sums[RMS_THREADS / 32];
    const int64_t r = blockIdx.x, D = a.shape.n_cols;
    float *x = (float *)((char *)a.x + r * a.shape.x_stride);
    const float *y = a.y ? (const float *)((const char *)a.y + r * a.shape.y_stride) : nullptr;
    float *o = (float *)((char *)a.out + r * a.shape.out_stride);
    float inv_y = 0.0f;
    if (a.wy) {
        float sy = 0.0f;
        for (int64_t i = threadIdx.x; i < D; i += RMS_THREADS) sy = fmaf(y[i], y[i], sy);
        inv_y = loom_rms_inv(sy, D, a.eps, warp_sums);
    }
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < D; i += RMS_THREADS) {
        float v = x[i];
        /* __fmul_rn: the post-norm's product rounded before the add, as rms_norm stores it
         * (nvcc would otherwise contract the multiply and the add into one FMA) */
        if (y) x[i] = v = v + (a.wy ? __fmul_rn(y[i] * inv_y, a.wy[i]) : y[i]);
        s = fmaf(v, v, s);
    }
    const float inv = loom_rms_inv(s, D, a.eps, warp_sums);
    for (int64_t i = threadIdx.x; i < D; i += RMS_THREADS)
        o[i] = a.w ? x[i] * inv * a.w[i] : x[i] * inv;
}

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernels itself */
extern "C" loom_status loom__cuda_rms_norm(cudaStream_t stream, const loom__k_rows *shape,
                                           const float *x, const float *w, float eps, float *out) {
    if (shape->n_rows == 0) return LOOM_OK;
    rms_args a = {*shape, (float *)x, nullptr, w, out, eps, nullptr}; /* x is only read */
    LOOM_K_LAUNCH((rms_norm_kernel), ((unsigned)shape->n_rows, RMS_THREADS, 0, stream), a);
    LOOM_K_LAUNCHED("rms_norm");
    return LOOM_OK;
}

extern "C" loom_status loom__cuda_add_rms_norm(cudaStream_t stream, const loom__k_rows *shape,
                                               float *x, const float *y, const float *w, float eps,
                                               float *out) {
    if (shape->n_rows == 0) return LOOM_OK;
    rms_args a = {*shape, x, y, w, out, eps, nullptr};
    LOOM_K_LAUNCH((rms_norm_kernel), ((unsigned)shape->n_rows, RMS_THREADS, 0, stream), a);
    LOOM_K_LAUNCHED("add_rms_norm");
    return LOOM_OK;
}

extern "C" loom_status loom__cuda_norm_add_rms_norm(cudaStream_t stream, const loom__k_rows *shape,
                                                    float *x, const float *y, const float *wy,
                                                    const float *w, float eps, float *out) {
    if (shape->n_rows == 0) return LOOM_OK;
    rms_args a = {*shape, x, y, w, out, eps, wy};
    LOOM_K_LAUNCH((rms_norm_kernel), ((unsigned)shape->n_rows, RMS_THREADS, 0, stream), a);
    LOOM_K_LAUNCHED("norm_add_rms_norm");
    return LOOM_OK;
}
#endif

/* ---- add, scale, glu ----------------------------------------------------------------------- */

enum { EW_ADD, EW_SCALE, EW_SILU, EW_GELU_TANH };

typedef struct ew_args {
    loom__k_rows shape;
    const float *x, *y;
    float *out;
    float s;
} ew_args;

/* sqrt(2/pi) and the cubic's coefficient of the tanh approximation of GELU. */
#define GELU_K 0.7978845608028654f
#define GELU_C 0.044715f

/* Rows over grid.y (looping past its 65535 limit), columns over grid.x. */
template <int OP> static __global__ void ew_kernel(ew_args a) {
    for (int64_t r = blockIdx.y; r < a.shape.n_rows; r += gridDim.y) {
        const float *x = (const float *)((const char *)a.x + r * a.shape.x_stride);
        const float *y = a.y ? (const float *)((const char *)a.y + r * a.shape.y_stride) : nullptr;
        float *o = (float *)((char *)a.out + r * a.shape.out_stride);
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.shape.n_cols;
             i += (int64_t)gridDim.x * blockDim.x) {
            const float v = x[i];
            float res;
            if (OP == EW_ADD) {
                res = v + y[i];
            } else if (OP == EW_SCALE) {
                res = v * a.s;
            } else if (OP == EW_SILU) {
                res = v / (1.0f + expf(-v)) * y[i];
            } else {
                const float inner = GELU_K * fmaf(GELU_C * v * v, v, v);
                res = 0.5f * v * (1.0f + tanhf(inner)) * y[i];
            }
            o[i] = res;
        }
    }
}

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernels itself */
template <int OP>
static loom_status ew_launch(cudaStream_t stream, const ew_args &a, const char *name) {
    if (a.shape.n_rows == 0 || a.shape.n_cols == 0) return LOOM_OK;
    const int threads = 256;
    int64_t bx = loom_cdiv(a.shape.n_cols, threads);
    if (bx > 1024) bx = 1024;
    const int64_t by = a.shape.n_rows < 65535 ? a.shape.n_rows : 65535;
    dim3 grid((unsigned)bx, (unsigned)by);
    LOOM_K_LAUNCH((ew_kernel<OP>), (grid, threads, 0, stream), a);
    LOOM_K_LAUNCHED(name);
    return LOOM_OK;
}

extern "C" loom_status loom__cuda_add(cudaStream_t stream, const loom__k_rows *shape,
                                      const float *x, const float *y, float *out) {
    ew_args a = {*shape, x, y, out, 0.0f};
    return ew_launch<EW_ADD>(stream, a, "add");
}

extern "C" loom_status loom__cuda_scale(cudaStream_t stream, const loom__k_rows *shape,
                                        const float *x, float s, float *out) {
    ew_args a = {*shape, x, nullptr, out, s};
    return ew_launch<EW_SCALE>(stream, a, "scale");
}

extern "C" loom_status loom__cuda_glu(cudaStream_t stream, const loom__k_rows *shape,
                                      const float *x, const float *y, int kind, float *out) {
    ew_args a = {*shape, x, y, out, 0.0f};
    switch (kind) {
    case 0:
        return ew_launch<EW_SILU>(stream, a, "glu (swiglu)");
    case 1:
        return ew_launch<EW_GELU_TANH>(stream, a, "glu (geglu_tanh)");
    default:
        LOOM_K_UNSUPPORTED("cuda: glu kind %d", kind);
    }
}

/* ---- the probe ----------------------------------------------------------------------------- */

#define LOOM_K_STR2(x) #x
#define LOOM_K_STR(x)  LOOM_K_STR2(x)

extern "C" loom_status loom__cuda_kernels_probe(void) {
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, rms_norm_kernel);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return loom__fail(LOOM_ERR_BACKEND,
                          "libloom-cuda has no code for this device: %s (built for "
                          "LOOM_CUDA_ARCHITECTURES=%s; rebuild with this device's)",
                          cudaGetErrorString(e),
#ifdef LOOM_CUDA_ARCHS_BUILT
                          LOOM_K_STR(LOOM_CUDA_ARCHS_BUILT)
#else
                          "?"
#endif
        );
    }
    return LOOM_OK;
}
#endif
