/* wgmma.cuh — Hopper's warpgroup MMA (sm_90a): wgmma.mma_async reading B (and A, or A from
 * registers) from shared memory through matrix descriptors, its fences and groups, as
 * gemm_wgmma.cuh and attention_prefill.cu use them. Device code only; the emulator
 * (tests/kernels_emu) stands in for every instruction here.
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
#include "mma.cuh" /* LOOM_MMA16_BF16, LOOM_MMA16_F16: the operand types */

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

/* Keeps the compiler from moving register uses of the N accumulators d across the wgmma's and
 * waits around this point: to the compiler the wait asm touches memory only, so without this a
 * read of d could be scheduled before the wait that makes it valid. Emits no instruction. */
template <int N> static __device__ __forceinline__ void loom_wg_fence_acc(float *d) {
#if !defined(LOOM_K_EMULATE)
#pragma unroll
    for (int j = 0; j < N; j++) asm volatile("" : "+f"(d[j])::"memory");
#else
    (void)d;
#endif
}

/* The same for N registers of A fragments (loom_wg_rs): computed before the wgmma.fence that
 * precedes their wgmma's, not moved past it. */
template <int N> static __device__ __forceinline__ void loom_wg_fence_regs(uint32_t *a) {
#if !defined(LOOM_K_EMULATE)
#pragma unroll
    for (int j = 0; j < N; j++) asm volatile("" : "+r"(a[j])::"memory");
#else
    (void)a;
#endif
}

/* d = A · B + (scale_d ? d : 0) over m64nNk16, OP16 operands (LOOM_MMA16_BF16 or _F16, as
 * mma.cuh names them), float32 accumulators d[N / 2] in the fragment layout above. B (16 x N,
 * stored as N rows of K) in shared memory at descriptor db, K-major (loom_wg_rs with TB:
 * N-major, the layout below); A (64 x 16) in shared memory at descriptor da, K-major
 * (loom_wg_ss), or in registers (loom_wg_rs: a[4] per thread, warp w's rows 16 w .. 16 w + 15
 * as mma.sync m16n8k16's A fragment: loom_mma16_a_row/col).
 * Issued asynchronously: d, a and the operands' shared memory belong to the instruction until a
 * loom_wg_wait lets it go. N: 32, 64 or 128. scale-d is a predicate; A and B are unscaled (1)
 * and K-major (transpose 0; a register A has no transpose operand) but for TB's B.
 *
 * N-major B (imm-trans-b 1, 16-bit types only; the ISA's canonical MN-major layout without
 * swizzle, ((T,1,m),(8,k)) : ((1,T,SBO),(1T,LBO)), T = 8 values): a core matrix holds 8 rows of
 * K by 8 values of N (16 contiguous bytes), the rows 16 bytes apart, 128 contiguous bytes; the
 * next 8 values of N lie SBO bytes further, the next 8 rows of K LBO bytes further:
 *   element (k, n) at start + (n / 8) SBO + (k / 8) LBO + (k % 8) 16 + (n % 8) 2
 * — a matrix stored by rows of K (V by position) is copied in 16-byte pieces as it stands. */
#define LOOM_WG_D8(i)                                                                              \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),    \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define LOOM_WG_OUT16 LOOM_WG_D8(0), LOOM_WG_D8(8)
#define LOOM_WG_OUT32 LOOM_WG_OUT16, LOOM_WG_D8(16), LOOM_WG_D8(24)
#define LOOM_WG_OUT64 LOOM_WG_OUT32, LOOM_WG_D8(32), LOOM_WG_D8(40), LOOM_WG_D8(48), LOOM_WG_D8(56)
#define LOOM_WG_R16   "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define LOOM_WG_R32                                                                                \
    LOOM_WG_R16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define LOOM_WG_R64                                                                                \
    LOOM_WG_R32                                                                                    \
    ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
/* One wgmma: SHAPE and T (strings), REGS the accumulators' operand list, AB the operands of A
 * and B, SCALE scale-d's operand, TAIL the immediates. */
#define LOOM_WG_ASM(SHAPE, T, REGS, AB, SCALE, TAIL, OUTS, ...)                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." T "." T " {" REGS "}, " AB          \
                 ", p, " TAIL ";\n}\n"                                                             \
                 : OUTS:__VA_ARGS__                                                                \
                 : "memory")
#define LOOM_WG_SS(T, N)                                                                           \
    do {                                                                                           \
        if constexpr (N == 32)                                                                     \
            LOOM_WG_ASM("m64n32k16", T, LOOM_WG_R16, "%16, %17", "%18", "1, 1, 0, 0",              \
                        LOOM_WG_OUT16, "l"(da), "l"(db), "r"(scale_d));                            \
        else if constexpr (N == 64)                                                                \
            LOOM_WG_ASM("m64n64k16", T, LOOM_WG_R32, "%32, %33", "%34", "1, 1, 0, 0",              \
                        LOOM_WG_OUT32, "l"(da), "l"(db), "r"(scale_d));                            \
        else                                                                                       \
            LOOM_WG_ASM("m64n128k16", T, LOOM_WG_R64, "%64, %65", "%66", "1, 1, 0, 0",             \
                        LOOM_WG_OUT64, "l"(da), "l"(db), "r"(scale_d));                            \
    } while (0)
#define LOOM_WG_RS(T, N, TAIL)                                                                     \
    do {                                                                                           \
        if constexpr (N == 32)                                                                     \
            LOOM_WG_ASM("m64n32k16", T, LOOM_WG_R16, "{%16, %17, %18, %19}, %20", "%21", TAIL,     \
                        LOOM_WG_OUT16, "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db),        \
                        "r"(scale_d));                                                             \
        else if constexpr (N == 64)                                                                \
            LOOM_WG_ASM("m64n64k16", T, LOOM_WG_R32, "{%32, %33, %34, %35}, %36", "%37", TAIL,     \
                        LOOM_WG_OUT32, "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db),        \
                        "r"(scale_d));                                                             \
        else                                                                                       \
            LOOM_WG_ASM("m64n128k16", T, LOOM_WG_R64, "{%64, %65, %66, %67}, %68", "%69", TAIL,    \
                        LOOM_WG_OUT64, "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db),        \
                        "r"(scale_d));                                                             \
    } while (0)

template <int OP16, int N>
static __device__ __forceinline__ void loom_wg_ss(float *d, uint64_t da, uint64_t db, int scale_d) {
    static_assert(N == 32 || N == 64 || N == 128, "wgmma N: 32, 64 or 128 here");
#if defined(LOOM_K_EMULATE)
    loom_emu_wgmma(OP16 == LOOM_MMA16_F16, N, d, da, nullptr, db, scale_d != 0, false);
#elif LOOM_WGMMA_HAS
    if constexpr (OP16 == LOOM_MMA16_F16)
        LOOM_WG_SS("f16", N);
    else
        LOOM_WG_SS("bf16", N);
#else
    (void)da;
    (void)db;
    (void)scale_d;
    for (int j = 0; j < N / 2; j++) d[j] = __int_as_float(0x7fc00000);
#endif
}

template <int OP16, int N, bool TB = false>
static __device__ __forceinline__ void loom_wg_rs(float *d, const uint32_t a[4], uint64_t db,
                                                  int scale_d) {
    static_assert(N == 32 || N == 64 || N == 128, "wgmma N: 32, 64 or 128 here");
#if defined(LOOM_K_EMULATE)
    loom_emu_wgmma(OP16 == LOOM_MMA16_F16, N, d, 0, a, db, scale_d != 0, TB);
#elif LOOM_WGMMA_HAS
    if constexpr (OP16 == LOOM_MMA16_F16 && TB)
        LOOM_WG_RS("f16", N, "1, 1, 1");
    else if constexpr (OP16 == LOOM_MMA16_F16)
        LOOM_WG_RS("f16", N, "1, 1, 0");
    else if constexpr (TB)
        LOOM_WG_RS("bf16", N, "1, 1, 1");
    else
        LOOM_WG_RS("bf16", N, "1, 1, 0");
#else
    (void)a;
    (void)db;
    (void)scale_d;
    for (int j = 0; j < N / 2; j++) d[j] = __int_as_float(0x7fc00000);
#endif
}
