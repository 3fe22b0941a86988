/* common.cuh — what every kernel file shares: the launch check that turns a CUDA error into a
 * status and a message, warp reductions, and half/bfloat16 conversions. Device code only
 * (included by kernels/*.cu). */
#pragma once

#if defined(LOOM_K_EMULATE)
/* tests/kernels_emu/: the kernels built by the host's C++ compiler and run on a SIMT emulator,
 * whose header stands in for the CUDA headers (types, intrinsics, warp collectives, shared
 * memory). Never defined in a real build. */
#include "kernel_emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

/* A kernel's dynamic shared memory (the launch's third argument), 128-byte aligned (tensor-map
 * copies, tma.cuh, land at such addresses); a macro so that the emulator can give its own. */
#define LOOM_K_DYN_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif
#include <stdint.h>

#include "loom_kernels.h"

extern "C" loom_status loom__fail(loom_status status, const char *fmt, ...);
extern "C" void loom__log(loom_log_level level, const char *fmt, ...);

/* After a launch: a launch error (bad configuration, no kernel image for this device) becomes
 * LOOM_ERR_BACKEND with the kernel's name and CUDA's message. Errors of the kernel's execution
 * surface at the stream's next synchronization, which the host code checks. */
#define LOOM_K_LAUNCHED(name)                                                                      \
    do {                                                                                           \
        cudaError_t loom__e = cudaGetLastError();                                                  \
        if (loom__e != cudaSuccess)                                                                \
            return loom__fail(LOOM_ERR_BACKEND, "cuda: launching %s: %s (%s)", name,               \
                              cudaGetErrorString(loom__e), cudaGetErrorName(loom__e));             \
    } while (0)

#define LOOM_K_UNSUPPORTED(...) return loom__fail(LOOM_ERR_UNSUPPORTED, __VA_ARGS__)

/* Whether this compilation carries the host side of the kernel files (launchers, probes, the
 * extern "C" entries): every real build, and the emulated backend (LOOM_K_EMU_BACKEND:
 * tests/kernels_emu/'s plugin, whose launches run on the emulator); not tests/kernels_emu/'s own
 * test, which launches the kernels itself. */
#if !defined(LOOM_K_EMULATE) || defined(LOOM_K_EMU_BACKEND)
#define LOOM_K_HOST_CODE 1
#else
#define LOOM_K_HOST_CODE 0
#endif

/* Launches KERNEL (parenthesized: template arguments have commas) with CONFIG, the parenthesized
 * (grid, block, shared bytes, stream) of <<<>>>, on the arguments that follow. The emulated
 * backend runs it on the emulator in the stream's order (or records it into the stream's
 * capture). */
#define LOOM_K_UNPAREN(...) __VA_ARGS__
#if defined(LOOM_K_EMU_BACKEND)
#define LOOM_K_LAUNCH(KERNEL, CONFIG, ...)                                                         \
    loom_emu_backend_launch(LOOM_K_UNPAREN CONFIG, [=] { LOOM_K_UNPAREN KERNEL(__VA_ARGS__); })
#else
#define LOOM_K_LAUNCH(KERNEL, CONFIG, ...)                                                         \
    LOOM_K_UNPAREN KERNEL<<<LOOM_K_UNPAREN CONFIG>>>(__VA_ARGS__)
#endif

#if LOOM_K_HOST_CODE
#include <atomic>

/* Devices a kernel's shared-memory opt-in is remembered for (others set it on every launch). */
#define LOOM_K_OPTIN_DEVICES 64

/* Whether a warp-specialised kernel has the registers its setmaxnreg split assumes: at launch,
 * `regs` a thread (ptxas gives 168 to 384 threads today), the pool its warpgroups redistribute.
 * With fewer, a consumer's setmaxnreg.inc would wait forever for registers the block never had: a
 * clear error instead of a hang. Asked once per device (checked[]: 0 not yet, 1 enough); a
 * runtime that does not say (numRegs 0: the emulator) passes. */
template <typename K>
static loom_status loom_k_regs_check(K kernel, int regs, std::atomic<int> *checked,
                                     const char *what) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    const bool known = e == cudaSuccess && dev >= 0 && dev < LOOM_K_OPTIN_DEVICES;
    if (known && checked[dev].load(std::memory_order_relaxed) == 1) return LOOM_OK;
    cudaFuncAttributes attr;
    memset(&attr, 0, sizeof attr);
    e = cudaFuncGetAttributes(&attr, kernel);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return loom__fail(LOOM_ERR_BACKEND, "cuda: %s: its attributes: %s (%s)", what,
                          cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (attr.numRegs != 0 && attr.numRegs < regs)
        return loom__fail(LOOM_ERR_UNSUPPORTED,
                          "cuda: %s has %d registers a thread at launch; its warpgroups' "
                          "setmaxnreg split needs %d (a build with another ptxas?)",
                          what, attr.numRegs, regs);
    if (known) checked[dev].store(1, std::memory_order_relaxed);
    return LOOM_OK;
}

/* Lets kernel take smem bytes of dynamic shared memory (past the default 48 KB) on the current
 * device. The attribute is set the first time, or when a launch asks for more than was set,
 * not on every launch: set[] is the kernel's record, one slot per device (a function-local
 * static per kernel; two threads racing both set it, which is harmless). */
template <typename K>
static loom_status loom_k_smem_optin(K kernel, size_t smem, std::atomic<int> *set,
                                     const char *what) {
    if (smem <= 48 * 1024) return LOOM_OK;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    const bool known = e == cudaSuccess && dev >= 0 && dev < LOOM_K_OPTIN_DEVICES;
    if (known && set[dev].load(std::memory_order_relaxed) >= (int)smem) return LOOM_OK;
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return loom__fail(LOOM_ERR_BACKEND, "cuda: %s with %zu bytes of shared memory: %s (%s)",
                          what, smem, cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (known) set[dev].store((int)smem, std::memory_order_relaxed);
    return LOOM_OK;
}
#endif

/* Sum over the 32 lanes of a warp, every lane receiving it; a fixed butterfly, so the order of
 * the additions is the same in every call. */
static __device__ __forceinline__ float loom_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The threads of a row's RMS norm (rms_norm_kernel, norm_rope_store_kernel): their layout is
 * part of the result's bits. */
#define LOOM_RMS_THREADS 256

/* 1 / sqrt(mean(x^2) + eps) of a row of D floats, by a block of LOOM_RMS_THREADS threads, each
 * holding s, the fmaf sum of the squares of its elements (threadIdx.x, then every
 * LOOM_RMS_THREADS-th). A fixed order: each warp's butterfly, then the warps' sums in turn. Every
 * thread gets the result; warp_sums is LOOM_RMS_THREADS / 32 floats of shared memory, free
 * again when this returns (its second barrier). */
static __device__ __forceinline__ float loom_rms_inv(float s, int64_t D, float eps,
                                                     float *warp_sums) {
    s = loom_warp_sum(s);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = s;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < LOOM_RMS_THREADS / 32; w++) total += warp_sums[w];
    const float inv = 1.0f / sqrtf(total / (float)D + eps);
    __syncthreads();
    return inv;
}

static __device__ __forceinline__ float loom_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* IEEE binary16 and bfloat16 bits to float (weights store raw bits, tensor/quant_layouts.h). */
static __device__ __forceinline__ float loom_h2f(uint16_t bits) {
    return __half2float(__ushort_as_half(bits));
}
static __device__ __forceinline__ float loom_bf2f(uint16_t bits) {
    return __uint_as_float((uint32_t)bits << 16);
}

/* Unaligned-safe little-endian loads from block formats (blocks are 2-byte aligned at best). */
static __device__ __forceinline__ uint16_t loom_ld16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static __device__ __forceinline__ uint32_t loom_ld32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* ceil(a / b) for positive b. */
static __host__ __device__ __forceinline__ int64_t loom_cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

/* Element e of a KV page row of type KV (LOOM_K_F32, _F16 or _BF16) as float, and stored into
 * one rounded to nearest even. */
template <int KV> static __device__ __forceinline__ float loom_kv_get(const void *row, int64_t e) {
    if (KV == LOOM_K_F32) return ((const float *)row)[e];
    if (KV == LOOM_K_F16) return __half2float(((const __half *)row)[e]);
    return __bfloat162float(((const __nv_bfloat16 *)row)[e]);
}
template <int KV>
static __device__ __forceinline__ void loom_kv_put(void *row, int64_t e, float x) {
    if (KV == LOOM_K_F32)
        ((float *)row)[e] = x;
    else if (KV == LOOM_K_F16)
        ((__half *)row)[e] = __float2half_rn(x);
    else
        ((__nv_bfloat16 *)row)[e] = __float2bfloat16_rn(x);
}
