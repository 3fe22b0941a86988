/* mbarrier.cuh — the shared-memory barriers of warp-specialised kernels (sm_90a): mbarrier
 * objects that producer threads arrive on when their cp.async copies land and consumer threads
 * wait on by phase, and setmaxnreg, which moves registers from a producer warpgroup to its
 * consumers. Device code only; the emulator (tests/kernels_emu) stands in for every instruction.
 *
 * An mbarrier is 8 bytes of shared memory (8-byte aligned) that counts arrivals: initialised
 * with a count, its current phase completes when that many arrivals have come, and the next
 * phase starts with the count again. A wait names the parity of the phase it waits for: it
 * returns once that phase has completed, which for the phase before the first (parity 1 on a new
 * barrier) is at once. So a ring of stages goes with two barriers a stage: "full" (the producers'
 * copies have landed; consumers wait with parity round & 1) and "empty" (the consumers are done
 * with it; the producers wait with parity (round & 1) ^ 1 before they copy into it again).
 *
 * Memory order: an arrive releases, a completed wait acquires, at the CTA's scope. cp.async
 * writes through the generic proxy, so a consumer that hands the landed bytes to wgmma (the async
 * proxy) fences (loom_wg_fence_proxy_async) after its wait. */
#pragma once

#include "common.cuh"
#include "wgmma.cuh" /* LOOM_WGMMA_HAS (the sm_90a device code these need), loom_wg_smem_addr */

/* Initialises the barrier at bar with count arrivals a phase (1 .. 2^20 - 1). One thread does it,
 * before a barrier (__syncthreads) that orders it before every other use. */
static __device__ __forceinline__ void loom_mbar_init(uint64_t *bar, unsigned count) {
#if defined(LOOM_K_EMULATE)
    loom_emu_mbar_init(bar, count);
#elif LOOM_WGMMA_HAS
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(loom_wg_smem_addr(bar)), "r"(count)
                 : "memory");
#else
    (void)bar;
    (void)count;
#if defined(__CUDA_ARCH__)
    __trap(); /* device code without these instructions: never launched (the host's probe) */
#endif
#endif
}

/* After a thread's mbarrier.init's (before the barrier that publishes them): makes them visible
 * to the async proxy too, where tensor-map copies (tma.cuh) complete on them. The PTX ISA now
 * says those copies reach their barrier through the generic proxy, the CUDA Programming Guide's
 * TMA example still fences here: the fence costs nothing. The emulator's barriers are one object
 * for both proxies. */
static __device__ __forceinline__ void loom_mbar_init_fence(void) {
#if defined(LOOM_K_EMULATE)
#elif LOOM_WGMMA_HAS
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

/* One arrival of this thread on the barrier's current phase. */
static __device__ __forceinline__ void loom_mbar_arrive(uint64_t *bar) {
#if defined(LOOM_K_EMULATE)
    loom_emu_mbar_arrive(bar);
#elif LOOM_WGMMA_HAS
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}" ::"r"(
                     loom_wg_smem_addr(bar))
                 : "memory");
#else
    (void)bar;
#endif
}

/* One arrival of this thread on the barrier's current phase, which first expects `bytes` more
 * (its transaction count): the phase completes when its arrivals have come and as many bytes of
 * copies completing on it (tma.cuh) have landed. Announce the bytes before the copies. */
static __device__ __forceinline__ void loom_mbar_arrive_expect_tx(uint64_t *bar, unsigned bytes) {
#if defined(LOOM_K_EMULATE)
    loom_emu_mbar_arrive_expect_tx(bar, bytes);
#elif LOOM_WGMMA_HAS
    asm volatile("{\n\t.reg .b64 st;\n\t"
                 "mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(
                     loom_wg_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
#else
    (void)bar;
    (void)bytes;
#endif
}

/* Waits until the phase of parity `parity` of the barrier has completed (try_wait suspends the
 * thread for a time the hardware chooses; the loop asks again until it has). */
static __device__ __forceinline__ void loom_mbar_wait(uint64_t *bar, unsigned parity) {
#if defined(LOOM_K_EMULATE)
    loom_emu_mbar_wait(bar, parity);
#elif LOOM_WGMMA_HAS
    const uint32_t a = loom_wg_smem_addr(bar);
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
#else
    (void)bar;
    (void)parity;
#if defined(__CUDA_ARCH__)
    __trap(); /* a wait that cannot wait must not pass */
#endif
#endif
}

/* One arrival on the barrier, made when every cp.async this thread has issued so far has landed
 * (.noinc: the arrival is one of the count the barrier was initialised with). The copies need no
 * commit or wait of their own. */
static __device__ __forceinline__ void loom_cp_async_mbar_arrive(uint64_t *bar) {
#if defined(LOOM_K_EMULATE)
    loom_emu_cp_async_mbar_arrive(bar);
#elif LOOM_WGMMA_HAS
    asm volatile(
        "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(loom_wg_smem_addr(bar))
        : "memory");
#else
    (void)bar;
#endif
}

/* setmaxnreg: this warpgroup's registers a thread become N (24 .. 256, a multiple of 8): fewer
 * (a producer's, .dec: the registers go back to the block's pool) or more (a consumer's, .inc:
 * waits until the pool has them). Warpgroup-wide (.sync.aligned), with the same N in all four
 * warps. */
template <int N> static __device__ __forceinline__ void loom_wg_maxnreg_dec(void) {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes 24 .. 256, multiples of 8");
#if defined(LOOM_K_EMULATE)
    loom_emu_setmaxnreg(false, N);
#elif LOOM_WGMMA_HAS
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
#endif
}
template <int N> static __device__ __forceinline__ void loom_wg_maxnreg_inc(void) {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes 24 .. 256, multiples of 8");
#if defined(LOOM_K_EMULATE)
    loom_emu_setmaxnreg(true, N);
#elif LOOM_WGMMA_HAS
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
#endif
}
