/* rope.cu — rotary position embedding in place, normal (adjacent pairs) and NeoX (halves)
 * layouts, with llama3-style frequency factors and linear position scaling. Angles are formed
 * and their cosines and sines taken in double precision, then rounded to float, as the CPU
 * backend does: the factors agree with the CPU's but for an occasional last bit (CUDA's double
 * pow and sincos are within 2 ulp, glibc's within 1). */
#include "common.cuh"

typedef struct rope_args {
    loom__k_rope p;
    float *x;
} rope_args;

/* One block per row; a thread per frequency computes its cosine and sine once and rotates
 * that pair in every head. */
static __global__ void rope_kernel(rope_args a) {
    const loom__k_rope &p = a.p;
    const int64_t r = blockIdx.x;
    const int half = p.n_rot / 2;
    float *x = (float *)((char *)a.x + r * p.x_stride);
    const double pos = (double)p.pos[r];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double f = (double)p.freq_scale * pow((double)p.theta_base, -2.0 * i / p.n_rot);
        if (p.freq_factors) f /= (double)p.freq_factors[i];
        double sd, cd;
        sincos(pos * f, &sd, &cd);
        const float c = (float)cd, s = (float)sd;
        const int i0 = p.neox ? i : 2 * i, i1 = p.neox ? i + half : 2 * i + 1;
        for (int h = 0; h < p.n_head; h++) {
            float *xh = x + (int64_t)h * p.head_dim;
            const float x0 = xh[i0], x1 = xh[i1];
            xh[i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
            xh[i1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        }
    }
}

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernels itself */
extern "C" loom_status loom__cuda_rope(cudaStream_t stream, const loom__k_rope *p, float *x) {
    if (p->n_rows == 0 || p->n_rot == 0) return LOOM_OK;
    if (p->n_rows > 0x7fffffff) LOOM_K_UNSUPPORTED("cuda: rope of %lld rows", (long long)p->n_rows);
    rope_args a = {*p, x};
    LOOM_K_LAUNCH((rope_kernel), ((unsigned)p->n_rows, 128, 0, stream), a);
    LOOM_K_LAUNCHED("rope");
    return LOOM_OK;
}
#endif
