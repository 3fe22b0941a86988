/* tma.cuh — Hopper's tensor memory accelerator (sm_90a): a tile of a 2-D tensor in global memory
 * copied into shared memory by one instruction of one thread, completing on an mbarrier by bytes
 * (mbarrier.cuh's loom_mbar_arrive_expect_tx announces them). Device code only; the emulator
 * (tests/kernels_emu) stands in for the instruction, and for the driver's encoder on the host.
 *
 * The tensor map (a 128-byte object the driver's cuTensorMapEncodeTiled fills on the host) says
 * where the tensor is, its sizes and row stride, and the box a copy takes; the kernel gets it as
 * a __grid_constant__ parameter, whose address the instruction takes. A copy of the box at
 * (x, y) lands row after row, box[0] values a row, with no gaps (no swizzle, no interleave):
 * values at coordinates outside the tensor land as zeros, and count in the bytes all the same.
 *
 * With a box of 8 16-bit values by R rows, a copy lands R rows of 16 bytes, 128 contiguous bytes
 * for each 8 rows: the core matrices of wgmma.cuh's K-major layout, stacked along M or N (SBO
 * 128), each next 8 values of K one more copy further (LBO R * 16). So TMA fills wgmma's operand
 * tiles without swizzled shared memory. */
#pragma once

#include "common.cuh"
#include "wgmma.cuh" /* LOOM_WGMMA_HAS, loom_wg_smem_addr */

/* The tensor map, as the driver encodes it (CUtensorMap's size and alignment); opaque here. */
typedef struct loom_k_tmap {
    alignas(64) uint64_t opaque[16];
} loom_k_tmap;

/* The box of map at (x, y) (x along the rows' values, y the rows) into dst (shared memory,
 * 128-byte aligned), completing its bytes on the mbarrier bar (which the issuing thread or another
 * announced with loom_mbar_arrive_expect_tx). map: the address of a __grid_constant__ parameter
 * (or of global or constant memory). Issued by one thread; no commit or wait of its own. */
static __device__ __forceinline__ void loom_tma_load_2d(void *dst, const loom_k_tmap *map, int x,
                                                        int y, uint64_t *bar) {
#if defined(LOOM_K_EMULATE)
    loom_emu_tma_load_2d(dst, map, x, y, bar);
#elif LOOM_WGMMA_HAS
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" ::"r"(loom_wg_smem_addr(dst)),
                 "l"((uint64_t)(uintptr_t)map), "r"(x), "r"(y), "r"(loom_wg_smem_addr(bar))
                 : "memory");
#else
    (void)dst;
    (void)map;
    (void)x;
    (void)y;
    (void)bar;
#if defined(__CUDA_ARCH__)
    __trap(); /* device code without the instruction: never launched (the host's probe) */
#endif
#endif
}
