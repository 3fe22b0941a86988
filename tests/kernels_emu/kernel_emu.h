// kernel_emu.h — the device side of the kernel emulator: what kernels/common.cuh includes instead
// of the CUDA headers when LOOM_K_EMULATE is defined, so that the kernels of kernels/*.cu compile
// with the host's C++ compiler and run on a SIMT machine (kernel_emu.cpp): a block of up to 1024
// coroutine threads with threadIdx / blockIdx / blockDim, __syncthreads, warp collectives
// (shuffles, ballot, mma.sync m16n8k8 TF32 and m16n8k16 BF16 / F16, wgmma.mma_async BF16 / F16),
// static and dynamic shared memory.
//
// Semantics kept as CUDA states them, and checked where a kernel could break them: a warp
// collective needs all 32 lanes at the same collective with a full mask (a lane elsewhere is a
// divergence, reported), __syncthreads needs every thread of the block (a barrier some threads
// left by returning is reported, as is a deadlock). Intrinsics with a stated rounding are
// emulated to the bit (__fmul_rn, half and bfloat16 conversions, cvt.rna.tf32). Not emulated:
// partial masks, shuffle widths below 32, the device's math library (expf, tanhf and exp are the
// host's, a few ulps from CUDA's) and nvcc's contraction of a * b + c into a fused multiply-add
// (the host build keeps -ffp-contract=off), so results match the device's within tolerances,
// not bit for bit; bit-for-bit claims (batch invariance) are checked within the emulator.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#include "cuda_runtime_api.h" /* cuda_shim/: the vector types */

// ---- CUDA's keywords ----------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#if defined(LOOM_EMU_SMEM_BANKS)
// smem_banks.cpp names each access's kernel from the inlined frames, as nvcc inlines these
#define __forceinline__ inline __attribute__((always_inline))
#else
#define __forceinline__ inline
#endif
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
// Static shared memory: one instance for the whole block (a function-local static, the block's
// threads being coroutines of one OS thread), placed in a section of its own so the emulator can
// fill it with 0xff (NaN as floats) before every block and a read before a write shows.
#define __shared__ static __attribute__((section("kemu_shared")))
// Dynamic shared memory (common.cuh's LOOM_K_DYN_SMEM on the device): the launch's buffer.
#define LOOM_K_DYN_SMEM(name) unsigned char *const name = ::loom_emu::dynamic_smem()

// ---- the launch ---------------------------------------------------------------------------------

namespace loom_emu {

// The order in which runnable threads run. Kernels must give the same results under every one
// (each block's result depends on the block alone); the orders differ in which warp runs ahead,
// so a missing __syncthreads between a shared write and another warp's read changes the output.
enum class schedule {
    breadth,        // first come, first run: the warps advance together
    depth,          // the threads released last run first, the lowest first: warp 0 runs ahead
                    // of the rest as far as it can
    depth_reversed, // the same, the highest first: the last warp runs ahead
    random,         // a pseudo-random runnable thread each time (seeded)
};

struct launch_options {
    schedule order = schedule::breadth;
    uint64_t seed = 1; // schedule::random
};

// Runs kernel() as every thread of every block of grid (block by block, x fastest), blockDim =
// block (at most 1024 threads, a multiple of 32), with dyn_smem bytes of dynamic shared memory.
// A kernel that breaks the rules above ends the program with a message (exit status 1).
void launch(dim3 grid, dim3 block, size_t dyn_smem, const std::function<void()> &kernel,
            launch_options opt = launch_options());

// What the launches so far have executed.
struct counters {
    uint64_t blocks, barriers, warp_ops, mma, switches;
};
const counters &stats();

// ---- used by the shim below ---------------------------------------------------------------------

uint3 thread_idx();
uint3 block_idx();
dim3 block_dim();
dim3 grid_dim();
unsigned char *dynamic_smem();
void syncthreads();
enum class shfl_mode { xor_lanes, from_lane };
uint64_t warp_shfl(unsigned mask, uint64_t bits, int size, shfl_mode mode, int arg, int width);
unsigned warp_ballot(unsigned mask, bool pred);
void warp_sync(unsigned mask);

template <typename T> static inline T shfl(unsigned mask, T v, shfl_mode mode, int arg, int width) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "shuffles move 4 or 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = warp_shfl(mask, b, (int)sizeof v, mode, arg, width);
    T r;
    memcpy(&r, &b, sizeof r);
    return r;
}

} // namespace loom_emu

// The warp-wide mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (d += a · b, the PTX fragment
// layout) and cvt.rna.tf32.f32: what kernels/mma.cuh's inline assembly becomes when emulated.
void loom_emu_mma_m16n8k8_tf32(float d[4], const uint32_t a[4], const uint32_t b[2]);
uint32_t loom_emu_cvt_rna_tf32(float x);
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (f16: the F16 form).
void loom_emu_mma_m16n8k16(bool f16, float d[4], const uint32_t a[4], const uint32_t b[2]);

// Hopper's warpgroup MMA (kernels/wgmma.cuh), emulated warp by warp (kernel_emu_async.cpp): warp
// w of a warpgroup computes rows 16 (w % 4) .. + 15 of the m64 product, which is all the
// registers it holds. wgmma.mma_async (BF16 or F16 operands, B in shared memory, A there or in
// registers, K-major without swizzle, as the descriptors say; n columns; accumulate: scale-d) is
// recorded when the warp issues it and computed when a wgmma.wait_group lets its committed group
// go, on the accumulators as they are then; its operands are read at both points and any
// difference reported (the hardware reads them somewhere in between: a store that lands late or
// comes before the wait is a race). Reported too: groups still open or pending when the block
// ends; a wgmma with no wgmma.fence before it since the warp's own writes to its accumulators or
// A registers (found by value, against the registers as they stood at the fence), or before the
// warp's first; writes to accumulators while a wgmma on them is in flight; operands in shared
// memory written (stored, or by cp.async) with no fence.proxy.async and barrier after, which the
// async proxy need not see (the emulator keeps that proxy's view apart); a warpgroup whose four
// warps execute other wgmma instructions or operands. cp.async (kernels/cp_async.cuh), per thread:
// a 16-byte copy fills its destination with 0xff at once and copies (src_bytes of it, 0..16;
// zeros after) when a cp.async.wait_group of the issuing thread lets its group go; copies still in
// flight when the block ends are reported.
void loom_emu_cp_async16(void *dst, const void *src, int src_bytes);
void loom_emu_cp_async_commit(void);
void loom_emu_cp_async_wait(int n);
uint32_t loom_emu_smem_addr(const void *p); // __cvta_generic_to_shared, dynamic shared memory
void loom_emu_fence_proxy_async(void);
void loom_emu_wgmma_fence(void);
void loom_emu_wgmma_commit(void);
void loom_emu_wgmma_wait(int n);
// A from shared memory at da (a == nullptr) or from each lane's registers a[4]; F16 or BF16; B
// K-major (trans_b false) or N-major (trans_b: imm-trans-b 1).
void loom_emu_wgmma(bool f16, int n, float *d, uint64_t da, const uint32_t *a, uint64_t db,
                    bool accumulate, bool trans_b);
// mbarriers (kernels/mbarrier.cuh): init (count arrivals a phase), arrive, the wait for the phase
// of a parity (the thread waits until it completes), and cp.async.mbarrier.arrive.noinc (the
// thread's copies in flight land, then arrive, when no thread of the block can run: the latest
// moment the hardware could land them; a fence.proxy.async of a thread whose wait acquired them
// makes them the async proxy's). setmaxnreg.{inc,dec}: a warpgroup instruction, checked for
// agreement; the register count is not modelled.
void loom_emu_mbar_init(uint64_t *bar, unsigned count);
void loom_emu_mbar_arrive(uint64_t *bar);
void loom_emu_mbar_wait(uint64_t *bar, unsigned parity);
void loom_emu_cp_async_mbar_arrive(uint64_t *bar);
void loom_emu_setmaxnreg(bool inc, int n);
// The tensor memory accelerator (kernels/tma.cuh): mbarrier.arrive.expect_tx (the phase also
// waits for that many bytes), and a 2-D tile copy of a tensor map (the emulator's encoding,
// loom_emu_tmap_encode_tiled) into shared memory completing its bytes on an mbarrier. The copy
// fills its destination with 0xff at once and lands, as the cp.async arrivals do, only when no
// thread of the block can run; it writes through the async proxy, so a warp's wgmma may read it
// once a thread of the warp has waited on the phase it completed (no fence needed). Reported:
// bytes completing past those announced, copies still in flight when the block ends, a
// destination not 128-byte aligned, a map the emulator did not encode.
void loom_emu_mbar_arrive_expect_tx(uint64_t *bar, unsigned bytes);
void loom_emu_tma_load_2d(void *dst, const void *map, int x, int y, uint64_t *bar);
// cuTensorMapEncodeTiled (CUDA 12.0's signature) for the emulator: checks the driver's documented
// requirements (rank 2 here, 16-byte aligned address and strides, boxes of at most 256, box[0]
// whole 16 bytes, no interleave or swizzle) and writes its own encoding; 0 (CUDA_SUCCESS) or 1
// (CUDA_ERROR_INVALID_VALUE).
extern "C" int loom_emu_tmap_encode_tiled(void *map, int dtype, uint32_t rank, void *addr,
                                          const uint64_t *dims, const uint64_t *strides,
                                          const uint32_t *box, const uint32_t *elem_strides,
                                          int interleave, int swizzle, int l2, int oob);

// ---- built-in variables -------------------------------------------------------------------------

#define threadIdx (::loom_emu::thread_idx())
#define blockIdx  (::loom_emu::block_idx())
#define blockDim  (::loom_emu::block_dim())
#define gridDim   (::loom_emu::grid_dim())
#define warpSize  32

// ---- synchronization and warp collectives -------------------------------------------------------

static inline void __syncthreads(void) {
    loom_emu::syncthreads();
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    loom_emu::warp_sync(mask);
}

template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int w = 32) {
    return loom_emu::shfl(mask, v, loom_emu::shfl_mode::xor_lanes, lane_mask, w);
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src_lane, int w = 32) {
    return loom_emu::shfl(mask, v, loom_emu::shfl_mode::from_lane, src_lane, w);
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    return loom_emu::warp_ballot(mask, pred != 0);
}
static inline int __any_sync(unsigned mask, int pred) {
    return __ballot_sync(mask, pred) != 0;
}
static inline int __all_sync(unsigned mask, int pred) {
    return __ballot_sync(mask, pred) == mask;
}

// Atomics: the block's threads never run at the same time, so a plain read-modify-write is
// atomic; which thread comes first is the schedule's.
static inline int atomicAdd(int *p, int v) {
    const int old = *p;
    *p = (int)((unsigned)old + (unsigned)v);
    return old;
}
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    const unsigned long long old = *p;
    *p = old + v;
    return old;
}
static inline float atomicAdd(float *p, float v) {
    const float old = *p;
    *p = old + v;
    return old;
}

// ---- integer and bit intrinsics -----------------------------------------------------------------

static inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
static inline int __popcll(unsigned long long x) {
    return __builtin_popcountll(x);
}
static inline int __clz(unsigned x) {
    return x ? __builtin_clz(x) : 32;
}
static inline int __ffs(int x) {
    return __builtin_ffs(x);
}

static inline int min(int a, int b) {
    return a < b ? a : b;
}
static inline int max(int a, int b) {
    return a > b ? a : b;
}
static inline unsigned min(unsigned a, unsigned b) {
    return a < b ? a : b;
}
static inline unsigned max(unsigned a, unsigned b) {
    return a > b ? a : b;
}
static inline long long min(long long a, long long b) {
    return a < b ? a : b;
}
static inline long long max(long long a, long long b) {
    return a > b ? a : b;
}
static inline float min(float a, float b) {
    return fminf(a, b);
}
static inline float max(float a, float b) {
    return fmaxf(a, b);
}

static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}
static inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, sizeof i);
    return i;
}
static inline long long __double_as_longlong(double d) {
    long long i;
    memcpy(&i, &d, sizeof i);
    return i;
}
static inline double __longlong_as_double(long long i) {
    double d;
    memcpy(&d, &i, sizeof d);
    return d;
}

template <typename T> static inline T __ldg(const T *p) {
    return *p;
}

// ---- float arithmetic with a stated rounding ----------------------------------------------------

// IEEE single operations rounded to nearest even, never fused: the host's float arithmetic with
// contraction off (the build's -ffp-contract=off; a separate function keeps even a contracting
// compiler from fusing across the call).

static inline float __fmul_rn(float a, float b) {
    return a * b;
}
static inline float __fadd_rn(float a, float b) {
    return a + b;
}
static inline float __fsub_rn(float a, float b) {
    return a - b;
}
static inline float __fdiv_rn(float a, float b) {
    return a / b;
}
static inline float __frcp_rn(float a) {
    return 1.0f / a;
}
static inline float __fsqrt_rn(float a) {
    return sqrtf(a);
}
static inline float __fmaf_rn(float a, float b, float c) {
    return fmaf(a, b, c);
}
static inline double __dmul_rn(double a, double b) {
    return a * b;
}
static inline double __dadd_rn(double a, double b) {
    return a + b;
}

// ---- half and bfloat16 --------------------------------------------------------------------------

// Storage types holding the bits; the conversions are written here from the formats (not taken
// from loom's own, src/tensor/fp16.h, which tests compare against).

struct __half {
    uint16_t x;
};
struct __nv_bfloat16 {
    uint16_t x;
};
/* (cuda_fp16.h's typedef `half` is left out: no kernel names it, and rope.cu's local variable
   `half` would shadow it, which -Wshadow refuses here) */

static inline __half __ushort_as_half(unsigned short u) {
    return __half{u};
}
static inline unsigned short __half_as_ushort(__half h) {
    return h.x;
}
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
    return __nv_bfloat16{u};
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) {
    return h.x;
}

// Exact: sign, exponent 5 bits (bias 15), 10 mantissa bits; exponent 0 is m * 2^-24.
static inline float __half2float(__half h) {
    const int e = (h.x >> 10) & 31, m = h.x & 1023;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? __uint_as_float(0x7f800000u | ((unsigned)m << 13)) : INFINITY;
    else
        v = ldexpf((float)(1024 + m), e - 25);
    return (h.x & 0x8000u) ? -v : v;
}

// Round to nearest even (subnormal halves included); from 65520 (halfway between the largest
// half and 2^16) up, infinity; NaN gives CUDA's canonical 0x7fff.
static inline __half __float2half_rn(float f) {
    const unsigned u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return __half{0x7fff};
    if (a >= 0x477ff000u) return __half{(uint16_t)(sign | 0x7c00u)};
    /* q = |f| in units of the half's ulp at f's exponent (2^-24 for subnormal halves), rounded
       by rintf (ties to even); the scaling by a power of two is exact */
    const int e = (int)(a >> 23) - 127, ulp = (e < -14 ? -14 : e) - 10;
    const unsigned q = (unsigned)rintf(ldexpf(__uint_as_float(a), -ulp));
    if (ulp == -24) return __half{(uint16_t)(sign | q)}; /* q = 1024: the smallest normal */
    /* q in [1024, 2048]: 2048 carries into the exponent */
    return __half{(uint16_t)(sign | (((unsigned)(e + 15) << 10) + q - 1024u))};
}

static inline float __bfloat162float(__nv_bfloat16 h) {
    return __uint_as_float((unsigned)h.x << 16);
}

// Round to nearest even; NaN gives CUDA's canonical 0x7fff.
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    const unsigned u = __float_as_uint(f);
    if (f != f) return __nv_bfloat16{0x7fff};
    return __nv_bfloat16{(uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

// ---- the emulated backend (LOOM_K_EMU_BACKEND) --------------------------------------------------

#if defined(LOOM_K_EMU_BACKEND)
// The runtime of the emulated plugin (cudart_emu.cpp): run(ctx) in stream order — at once, or
// recorded into the stream's capture and run at each launch of the graph; drop(ctx) when no
// graph holds it any more.
extern "C" void loom_emu_submit(cudaStream_t stream, void (*run)(void *), void *ctx,
                                void (*drop)(void *));

// common.cuh's LOOM_K_LAUNCH: the kernel's blocks on the emulator, as a stream operation.
template <typename F>
static inline void loom_emu_backend_launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                           F body) {
    auto *fn = new std::function<void()>(
        [grid, block, smem, body] { loom_emu::launch(grid, block, smem, body); });
    loom_emu_submit(
        stream, [](void *c) { (*(std::function<void()> *)c)(); }, fn,
        [](void *c) { delete (std::function<void()> *)c; });
}

// The attributes the launchers set and read: every kernel runs whatever shared memory it asks.
template <typename K>
static inline cudaError_t cudaFuncSetAttribute(K, enum cudaFuncAttribute, int) {
    return cudaSuccess;
}
template <typename K> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, K) {
    a->maxThreadsPerBlock = 1024;
    a->numRegs = 0; /* not modelled */
    return cudaSuccess;
}
#endif
