/* blaslt_emu.c — the emulated plugin's stand-in for src/backend/cuda/cuda_blaslt_gemm.c: the
 * emulated device has no cuBLASLt, so the fast mode's library GEMMs are never taken and every
 * matmul stays on loom's kernels (what the real file does where libcublasLt cannot be loaded). */
#include "backend/cuda/cuda_internal.h"

#include "core/log.h"

void loom__cuda_blaslt_open(loom__cuda_dev *d) {
    if (d->math == LOOM_K_MATH_BF16)
        loom__log(LOOM_LOG_INFO, "cuda: cuBLASLt is not emulated; every matmul stays on loom's "
                                 "kernels");
}

void loom__cuda_blaslt_close(loom__cuda_dev *d) {
    (void)d;
}

bool loom__cuda_blaslt_takes(const loom__cuda_dev *d, loom_type type) {
    (void)d;
    (void)type;
    return false;
}

loom_status loom__cuda_blaslt_gemm(loom__cuda_stream *c, const loom_tensor *w, const loom_tensor *x,
                                   loom_tensor *out, bool *done) {
    (void)c;
    (void)w;
    (void)x;
    (void)out;
    *done = false;
    return LOOM_OK;
}
