/* rope.cu — rotary position embedding in place, normal (adjacent pairs) and NeoX (halves)
 * layouts, with llama3-style frequency factors and linear position scaling. Angles are formed
 * and their cosines and sines taken in double precision, then rounded to float, as the CPU
 * backend does: the factors agree with the CPU's but for an occasional last bit (CUDA's double
 * pow and sincos are within 2 ulp, glibc's within 1). */
#include "rope.cuh"

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
        float c, s;
        loom_rope_angle(p, pos, i, &c, &s);
        for (int h = 0; h < p.n_head; h++)
            loom_rope_rotate(x + (int64_t)h * p.head_dim, p, i, c, s);
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
