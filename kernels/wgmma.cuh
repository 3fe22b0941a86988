/* wgmma.cuh — Hopper's warpgroup MMA (sm_90a): wgmma.mma_async reading both operands from shared
 * memory through matrix descriptors, its fences and groups, as gemm_wgmma.cuh uses them. Device
 * code only; the emulator (tests/kernels_emu) stands in for every instruction here.
 *
 * A warpgroup is four consecutive warps (threads 128 g .. 128 g + 127). Every function below is
 * ".sync.aligned": all 128 threads execute it, with the same arguments, in convergence.
 *
 * Operands in shared memory: the canonical K-major layout without swizzling (the PTX ISA's
 * "Shared Memory Matrix Layout", swizzle mode none): the matrix is cut into core matrices of 8
 * rows (M for A, N for B) by 16 bytes of K (8 BF16 values); a core matrix's 8 rows lie 16 bytes
 * apart, 128 contiguous bytes; the core matrices next in K lie LBO bytes further ("leading
 * dimension byte offset"), the next 8 rows SBO bytes further ("stride dimension byte offset"):
 *   element (r, k) at start + (r / 8) SBO + (k / 8) LBO + (r % 8) 16 + (k % 8) 2.
 * A k16 step reads two core matrices across K per 8 rows.
 *
 * The accumulator of m64nNk16 in float32: N / 2 registers per thread; with w the warp's place in
 * its warpgroup, g = lane / 4 and i = lane % 4, register j holds
 *   row 16 w + g + 8 ((j / 2) % 2), column 8 (j / 4) + 2 i + j % 2
 * — the m16n8 accumulator fragment of mma.sync, one per 8 columns, warp w owning rows 16 w ..
 * 16 w + 15. */
#pragma once

#include "common.cuh"

/* Whether this compilation carries the instructions: sm_90a device code, or the emulator. A
 * device build for another architecture compiles the functions empty; the host launches the
 * wgmma kernel only where loom__cuda_wgmma_probe said the device runs code that has them. */
#if defined(LOOM_K_EMULATE) || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define LOOM_WGMMA_HAS 1
#else
#define LOOM_WGMMA_HAS 0
#endif

/* The shared-memory address (the .shared window's) of p, a pointer into shared memory. */
static __device__ __forceinline__ uint32_t loom_wg_smem_addr(const void *p) {
#if defined(LOOM_K_EMULATE)
    return loom_emu_smem_addr(p);
#elif defined(__CUDA_ARCH__)
    return (uint32_t)__cvta_generic_to_shared(p);
#else
    (void)p;
    return 0;
#endif
}

/* The matrix descriptor of an operand at p in the layout above (no swizzle, base offset 0):
 * bits 0-13 the start address, 16-29 LBO, 32-45 SBO, each in units of 16 bytes. p, lbo and sbo
 * are multiples of 16. */
static __device__ __forceinline__ uint64_t loom_wg_desc(const void *p, uint32_t lbo, uint32_t sbo) {
    const uint64_t a = (loom_wg_smem_addr(p) >> 4) & 0x3fffu;
    return a | (uint64_t)((lbo >> 4) & 0x3fffu) << 16 | (uint64_t)((sbo >> 4) & 0x3fffu) << 32;
}

/* Orders this thread's earlier shared-memory writes (the generic proxy) before later reads by
 * the async proxy, which wgmma's operand fetches are; then a barrier makes every thread's
 * writes visible to the wgmma's of every warpgroup. */
static __device__ __forceinline__ void loom_wg_fence_proxy_async(void) {
#if defined(LOOM_K_EMULATE)
    loom_emu_fence_proxy_async();
#elif LOOM_WGMMA_HAS
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* Orders the warpgroup's register accesses before the wgmma's that follow: needed before the
 * first wgmma and whenever an accumulator was written by other instructions (zeroed, folded)
 * since the last. */
static __device__ __forceinline__ void loom_wg_fence(void) {
#if defined(LOOM_K_EMULATE)
    loom_emu_wgmma_fence();
#elif LOOM_WGMMA_HAS
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

/* Closes the group of the wgmma's issued since the last commit. */
static __device__ __forceinline__ void loom_wg_commit(void) {
#if defined(LOOM_K_EMULATE)
    loom_emu_wgmma_commit();
#elif LOOM_WGMMA_HAS
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

/* Waits until at most N committed groups of this warpgroup are pending: the accumulators of the
 * others may be read, and the shared memory they read written. */
template <int N> static __device__ __forceinline__ void loom_wg_wait(void) {
#if defined(LOOM_K_EMULATE)
    loom_emu_wgmma_wait(N);
#elif LOOM_WGMMA_HAS
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}

/* Keeps the compiler from moving register uses of the accumulators across the wgmma's and
 * waits around this point: to the compiler the wait asm touches memory only, so without this a
 * read of d could be scheduled before the wait that makes it valid. Emits no instruction. */
static __device__ __forceinline__ void loom_wg_fence_acc(float d[64]) {
#if !defined(LOOM_K_EMULATE)
#pragma unroll
    for (int j = 0; j < 64; j++) asm volatile("" : "+f"(d[j])::"memory");
#else
    (void)d;
#endif
}

/* d = A · B + (scale_d ? d : 0) over m64n128k16, BF16 operands, float32 accumulators: A (64 x 16)
 * and B (16 x 128, stored as 128 rows of K) in shared memory at descriptors da and db, K-major
 * both. Issued asynchronously: d and the operands' shared memory belong to the instruction
 * until a loom_wg_wait lets it go. */
static __device__ __forceinline__ void loom_wg_bf16_m64n128k16(float d[64], uint64_t da,
                                                               uint64_t db, int scale_d) {
#if defined(LOOM_K_EMULATE)
    loom_emu_wgmma_bf16(128, d, da, db, scale_d != 0);
#elif LOOM_WGMMA_HAS
#define LOOM_WG_D8(i)                                                                              \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),    \
        "+f"(d[i + 6]), "+f"(d[i + 7])
    /* scale-d is a predicate; A and B unscaled (1) and K-major (transpose 0) */
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
                 "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
                 "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
                 "%61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : LOOM_WG_D8(0), LOOM_WG_D8(8), LOOM_WG_D8(16), LOOM_WG_D8(24), LOOM_WG_D8(32),
                   LOOM_WG_D8(40), LOOM_WG_D8(48), LOOM_WG_D8(56)
                 : "l"(da), "l"(db), "r"(scale_d)
                 : "memory");
#undef LOOM_WG_D8
#else
    (void)da;
    (void)db;
    (void)scale_d;
    for (int j = 0; j < 64; j++) d[j] = __int_as_float(0x7fc00000);
#endif
}
