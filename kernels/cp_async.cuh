/* cp_async.cuh — asynchronous copies from global to shared memory (cp.async, sm_80+): a thread
 * issues 16-byte copies that land while it goes on, closes them into groups, and waits for all
 * but its newest groups. Another thread sees the bytes only after the issuing thread's wait and
 * a barrier between them. Device code only; the emulator stands in for each instruction (it
 * performs a copy at the wait that lets it go and fills the destination with 0xff bytes until
 * then, so an early read shows). */
#pragma once

#include "common.cuh"

/* 16 bytes from global src to shared dst (both 16-byte aligned), of which the first src_bytes
 * (0 to 16) are read and the rest zero-filled: src_bytes 0 reads nothing (src need only be a
 * valid address). Cached in L2 only (.cg): the tiles are read once per block. */
static __device__ __forceinline__ void loom_cp_async16(void *dst, const void *src, int src_bytes) {
#if defined(LOOM_K_EMULATE)
    loom_emu_cp_async16(dst, src, src_bytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes)
                 : "memory");
#else
    (void)dst;
    (void)src;
    (void)src_bytes;
#endif
}

/* Closes this thread's copies issued since the last commit into a group. */
static __device__ __forceinline__ void loom_cp_async_commit(void) {
#if defined(LOOM_K_EMULATE)
    loom_emu_cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> static __device__ __forceinline__ void loom_cp_async_wait(void) {
#if defined(LOOM_K_EMULATE)
    loom_emu_cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
