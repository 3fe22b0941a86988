// kernel_emu.cpp — the SIMT machine behind kernel_emu.h: a block's threads are coroutines of the
// one OS thread, each with its own stack; a thread runs until it reaches __syncthreads or a warp
// collective, and a scheduler (one of kernel_emu.h's orders) picks the next. A collective
// completes when the warp's 32 lanes have all reached it (the last lane to arrive computes it for
// the warp); a barrier when every thread has. Nothing runs in parallel, so the emulator and the
// kernels share memory freely; AddressSanitizer is told about every stack switch. Hopper's
// asynchronous instructions (wgmma, cp.async) and their fences: kernel_emu_async.cpp.
#include "kernel_emu_machine.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#define KEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KEMU_ASAN 1
#endif
#endif
#if defined(KEMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// On x86-64 a stack switch takes a few instructions (below); elsewhere, and where Intel CET's
// shadow stack is on (it would refuse the switch's return), ucontext's swapcontext, which makes
// a system call per switch: about ten times slower, still correct.
#if defined(__x86_64__)
#define KEMU_ASM_SWITCH 1
#if defined(__CET__) && (__CET__ & 2)
#include <immintrin.h> /* _get_ssp */
#endif
#endif

namespace loom_emu {
namespace {

// ---- coroutines ---------------------------------------------------------------------------------

#if defined(KEMU_ASM_SWITCH)
// kemu_switch(save, to): pushes the callee-saved registers, stores the stack pointer in *save and
// resumes the stack `to`, saved the same way. A new stack is laid out so that the first switch to
// it returns into kemu_start, which calls r13(r12) on a 16-byte aligned stack.
extern "C" void kemu_switch(void **save, void *to);
extern "C" void kemu_start(void);
asm(R"(
    .text
    .p2align 4
    .globl kemu_switch
    .hidden kemu_switch
    .type kemu_switch, @function
kemu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kemu_switch, .-kemu_switch

    .p2align 4
    .globl kemu_start
    .hidden kemu_start
    .type kemu_start, @function
kemu_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size kemu_start, .-kemu_start
)");
#endif

} // namespace

namespace impl {

const char *const op_names[] = {"a shuffle",   "__ballot_sync",      "mma.sync",
                                "__syncwarp",  "mma.sync (16-bit)",  "wgmma.mma_async",
                                "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group",
                                "setmaxnreg"};

machine M;

[[noreturn]] __attribute__((format(printf, 1, 2))) void fault(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kernel_emu: block (%u, %u, %u)", M.block_idx.x, M.block_idx.y, M.block_idx.z);
    if (M.cur >= 0) fprintf(stderr, ", thread %d", M.cur);
    fprintf(stderr, ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    _exit(1);
}

thread &current(const char *what) {
    if (M.cur < 0) fault("%s called outside a kernel", what);
    return M.threads[M.cur];
}
} // namespace impl

namespace {

// ---- the run queue ------------------------------------------------------------------------------

void push(int t) {
    M.queue.push_back(t);
}

// Pushes threads [first, first + count) so that the schedule takes them in its order.
void push_range(int first, int count) {
    if (M.order == schedule::depth) /* a stack: the lowest on top */
        for (int t = first + count - 1; t >= first; t--) push(t);
    else
        for (int t = first; t < first + count; t++) push(t);
}

int pop() {
    const size_t live = M.queue.size() - M.head;
    if (live == 0) {
        M.queue.clear();
        M.head = 0;
        return -1;
    }
    int t;
    switch (M.order) {
    case schedule::breadth:
        t = M.queue[M.head++];
        if (M.head > 4096 && M.head * 2 > M.queue.size()) { /* drop the consumed front */
            M.queue.erase(M.queue.begin(), M.queue.begin() + (ptrdiff_t)M.head);
            M.head = 0;
        }
        return t;
    case schedule::random: {
        M.rng ^= M.rng << 13, M.rng ^= M.rng >> 7, M.rng ^= M.rng << 17; /* xorshift64 */
        std::swap(M.queue[M.head + M.rng % live], M.queue.back());
        break;
    }
    default:
        break;
    }
    t = M.queue.back();
    M.queue.pop_back();
    return t;
}

// ---- switching ----------------------------------------------------------------------------------

void thread_main(void *);

// The scheduler runs thread t until it blocks or ends.
void resume(int t) {
    thread &th = M.threads[t];
    M.cur = t;
    M.stats.switches++;
#if defined(KEMU_ASAN)
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, th.stack, STACK_BYTES);
#endif
#if defined(KEMU_ASM_SWITCH)
    if (M.asm_switch)
        kemu_switch(&M.sched_sp, th.sp);
    else
#endif
        swapcontext(&M.sched_ctx, &th.ctx);
#if defined(KEMU_ASAN)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    M.cur = -1;
}

// The running thread gives the processor back (for good when it has ended).
void suspend(bool ending) {
    thread &th = M.threads[M.cur];
#if defined(KEMU_ASAN)
    void *fake = nullptr;
    if (ending) th.exit_sp = &fake;
    __sanitizer_start_switch_fiber(ending ? nullptr : &fake, M.sched_stack_bottom,
                                   M.sched_stack_size);
#else
    (void)ending;
#endif
#if defined(KEMU_ASM_SWITCH)
    if (M.asm_switch)
        kemu_switch(&th.sp, M.sched_sp);
    else
#endif
        swapcontext(&th.ctx, &M.sched_ctx);
#if defined(KEMU_ASAN)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void thread_main(void *) {
#if defined(KEMU_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &M.sched_stack_bottom, &M.sched_stack_size);
#endif
    (*M.kernel)();
    thread &th = M.threads[M.cur];
    th.state = DONE;
    M.n_done++;
    suspend(true);
    fault("a finished thread was resumed");
}

void thread_main_uc() {
    thread_main(nullptr);
}

#if defined(KEMU_ASM_SWITCH) && defined(__CET__) && (__CET__ & 2)
// Built for CET's shadow stack (-fcf-protection): whether it is on in this process (_get_ssp
// gives 0 where it is off, processors without CET included).
__attribute__((target("shstk"))) bool shadow_stack_on() {
    return _get_ssp() != 0;
}
#else
bool shadow_stack_on() {
    return false;
}
#endif

// Readies thread t to run the kernel from its start.
void start_thread(int t) {
    thread &th = M.threads[t];
    th.epoch = 0;
    if (!th.stack) {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        void *m = mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) fault("no memory for thread %d's stack", t);
        mprotect(m, page, PROT_NONE); /* an overflowing stack faults instead of corrupting */
        th.stack = (unsigned char *)m + page;
    }
#if defined(KEMU_ASAN)
    /* The frames that were live when the thread last ended never returned: their redzones are
       still poisoned, and the new frames will overlap them. */
    if (th.exit_sp) {
        unsigned char *lo = (unsigned char *)th.exit_sp - 4096;
        if (lo < th.stack) lo = th.stack;
        __asan_unpoison_memory_region(lo, (size_t)(th.stack + STACK_BYTES - lo));
    }
#endif
#if defined(KEMU_ASM_SWITCH)
    if (M.asm_switch) {
        /* the frame kemu_switch pops: r15, r14, r13 (function), r12 (argument), rbx, rbp,
           return address; after the return the stack pointer is 16-byte aligned, as before a
           call */
        void **sp = (void **)(th.stack + STACK_BYTES - 72);
        sp[0] = sp[1] = nullptr;
        sp[2] = (void *)&thread_main;
        sp[3] = nullptr;
        sp[4] = sp[5] = nullptr;
        sp[6] = (void *)&kemu_start;
        th.sp = sp;
        th.state = RUNNABLE;
        return;
    }
#endif
    getcontext(&th.ctx);
    th.ctx.uc_stack.ss_sp = th.stack;
    th.ctx.uc_stack.ss_size = STACK_BYTES;
    th.ctx.uc_link = nullptr;
    makecontext(&th.ctx, thread_main_uc, 0);
    th.state = RUNNABLE;
}

// ---- the collectives ----------------------------------------------------------------------------

// D = A B + C for warp w over a K-deep product (A: 16 x K, B: K x 8, exact in double), C and D
// in the m16n8 accumulator fragments every mma shares, lane l, g = l / 4, i = l % 4:
//   c0: (g, 2i)     c1: (g, 2i + 1)     c2: (g + 8, 2i)     c3: (g + 8, 2i + 1)
// The K products and C summed in double, rounded to float once (the device accumulates in
// float32, in an order it does not document: within the tolerances, not bit for bit).
template <int K> void mma_finish(int w, const double (&A)[16][K], const double (&B)[K][8]) {
    static const int c_at[4][2] = {{0, 0}, {0, 1}, {8, 0}, {8, 1}};
    double C[16][8];
    for (int l = 0; l < 32; l++)
        for (int r = 0; r < 4; r++)
            C[(l >> 2) + c_at[r][0]][2 * (l & 3) + c_at[r][1]] = M.threads[w * 32 + l].d[r];
    for (int l = 0; l < 32; l++)
        for (int r = 0; r < 4; r++) {
            const int m = (l >> 2) + c_at[r][0], n = 2 * (l & 3) + c_at[r][1];
            double s = C[m][n];
            for (int k = 0; k < K; k++) s += A[m][k] * B[k][n];
            M.threads[w * 32 + l].d[r] = (float)s;
        }
    M.stats.mma++;
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 for warp w, the fragments as the PTX ISA
// lays them out ("Matrix Fragments for mma.m16n8k8", .tf32):
//   A (16 x 8)  a0: (g, i)      a1: (g + 8, i)      a2: (g, i + 4)      a3: (g + 8, i + 4)
//   B (8 x 8)   b0: (i, g)      b1: (i + 4, g)
// Operands are TF32: the low 13 bits of each register are ignored; their products are exact in
// double.
void warp_mma(int w) {
    static const int a_at[4][2] = {{0, 0}, {8, 0}, {0, 4}, {8, 4}};
    static const int b_at[2][2] = {{0, 0}, {4, 0}};
    double A[16][8], B[8][8];
    auto tf32 = [](uint32_t u) { return (double)__uint_as_float(u & 0xffffe000u); };
    for (int l = 0; l < 32; l++) {
        const thread &t = M.threads[w * 32 + l];
        const int g = l >> 2, i = l & 3;
        for (int r = 0; r < 4; r++) A[g + a_at[r][0]][i + a_at[r][1]] = tf32(t.a[r]);
        for (int r = 0; r < 2; r++) B[i + b_at[r][0]][g + b_at[r][1]] = tf32(t.b[r]);
    }
    mma_finish<8>(w, A, B);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 for warp w ("Matrix Fragments
// for mma.m16n8k16 with floating point type"), two 16-bit elements per register, the lower in
// the low half:
//   A (16 x 16)  a0: (g, 2i..2i+1)  a1: (g + 8, 2i..)  a2: (g, 2i + 8..)  a3: (g + 8, 2i + 8..)
//   B (16 x 8)   b0: (2i..2i+1, g)  b1: (2i + 8.., g)
// Products of 16-bit values are exact in double.
void warp_mma16(int w) {
    double A[16][16], B[16][8];
    const bool f16 = M.threads[w * 32].f16;
    auto val = [f16](uint32_t u) {
        const uint16_t h = (uint16_t)u;
        return f16 ? (double)__half2float(__ushort_as_half(h))
                   : (double)__bfloat162float(__ushort_as_bfloat16(h));
    };
    for (int l = 0; l < 32; l++) {
        const thread &t = M.threads[w * 32 + l];
        if (t.f16 != f16) fault("warp %d: lanes 0 and %d run mma of different types", w, l);
        const int g = l >> 2, i = l & 3;
        for (int r = 0; r < 4; r++)
            for (int e = 0; e < 2; e++)
                A[g + 8 * (r & 1)][2 * i + 8 * (r >> 1) + e] = val(t.a[r] >> (16 * e));
        for (int r = 0; r < 2; r++)
            for (int e = 0; e < 2; e++) B[2 * i + 8 * r + e][g] = val(t.b[r] >> (16 * e));
    }
    mma_finish<16>(w, A, B);
}

// Warp w's 32 lanes have all reached a collective: check they agree on which, compute it, let
// them run on.
void warp_complete(int w) {
    thread *lane = &M.threads[w * 32];
    const op_kind op = lane[0].op;
    for (int l = 0; l < 32; l++) {
        if (lane[l].op != op)
            fault("warp %d: lane 0 is at %s, lane %d at %s", w, op_names[op], l,
                  op_names[lane[l].op]);
        if (lane[l].mask != 0xffffffffu)
            fault("warp %d: %s with mask 0x%08x (only full masks are emulated)", w, op_names[op],
                  lane[l].mask);
    }
    switch (op) {
    case OP_SHFL:
        for (int l = 0; l < 32; l++) {
            if (lane[l].size != lane[0].size || lane[l].mode != lane[0].mode)
                fault("warp %d: lanes 0 and %d shuffle different types or kinds", w, l);
            if (lane[l].width != 32) fault("warp %d: shuffle width %d", w, lane[l].width);
            const int src =
                lane[l].mode == shfl_mode::xor_lanes ? (l ^ lane[l].arg) & 31 : lane[l].arg & 31;
            lane[l].out = lane[src].in;
        }
        break;
    case OP_BALLOT: {
        uint64_t bits = 0;
        for (int l = 0; l < 32; l++) bits |= (uint64_t)(lane[l].in != 0) << l;
        for (int l = 0; l < 32; l++) lane[l].out = bits;
        break;
    }
    case OP_MMA:
        warp_mma(w);
        break;
    case OP_MMA16:
        warp_mma16(w);
        break;
    case OP_SYNCWARP:
        break;
    case OP_WG_MMA:
    case OP_WG_FENCE:
    case OP_WG_COMMIT:
    case OP_WG_WAIT:
    case OP_WG_MAXNREG:
        wg_complete(w, op);
        break;
    }
    M.stats.warp_ops++;
    for (int l = 0; l < 32; l++) lane[l].state = RUNNABLE;
    if (M.order == schedule::depth) /* lane 0 next */
        for (int l = 31; l >= 0; l--) push(w * 32 + l);
    else
        for (int l = 0; l < 32; l++) push(w * 32 + l);
}

} // namespace

namespace impl {

// The running lane reaches a collective (its arguments already stored) and waits for its warp.
uint64_t warp_arrive(thread &th) {
    th.state = AT_WARP_OP;
    th.epoch++;
    const int w = M.cur / 32;
    if (++M.warp_arrived[w] == 32) {
        M.warp_arrived[w] = 0;
        warp_complete(w);
    }
    suspend(false);
    return th.out;
}

void wait_here() {
    M.threads[M.cur].epoch++;
    suspend(false);
}

void make_runnable(int t) {
    M.threads[t].state = RUNNABLE;
    push(t);
}

void yield_here() {
    M.threads[M.cur].state = RUNNABLE;
    if (M.order == schedule::depth || M.order == schedule::depth_reversed)
        M.queue.insert(M.queue.begin() + (ptrdiff_t)M.head, M.cur); /* the stack's bottom */
    else
        push(M.cur);
    suspend(false);
}

} // namespace impl

namespace {

// No thread can run: the block is done, or every thread waits at the barrier, or copies that
// mbarrier waits need land now, or it is stuck.
bool unblock() {
    if (M.n_done == M.n) return false;
    if (async_land_arrivals()) return true;
    if (M.n_barrier > 0 && M.n_barrier + M.n_done == M.n) {
        if (M.n_done > 0)
            fault("__syncthreads reached by %d threads while %d have returned (CUDA requires "
                  "every thread of the block)",
                  M.n_barrier, M.n_done);
        M.n_barrier = 0;
        M.stats.barriers++;
        async_barrier();
        for (int t = 0; t < M.n; t++) M.threads[t].state = RUNNABLE;
        push_range(0, M.n);
        return true;
    }
    /* a warp waits at a collective some of its lanes will never reach */
    for (int w = 0; w < M.n / 32; w++) {
        int at[N_STATES] = {};
        for (int l = 0; l < 32; l++) at[M.threads[w * 32 + l].state]++;
        if (at[AT_WARP_OP] > 0)
            fault("deadlock: warp %d has %d lanes at %s, %d at __syncthreads, %d waiting on "
                  "mbarriers, %d returned",
                  w, at[AT_WARP_OP], op_names[M.threads[w * 32].op], at[AT_BARRIER], at[AT_MBAR],
                  at[DONE]);
    }
    int n_mbar = 0, first = -1;
    for (int t = 0; t < M.n; t++)
        if (M.threads[t].state == AT_MBAR && n_mbar++ == 0) first = t;
    if (n_mbar > 0)
        fault("deadlock: %d threads wait on mbarriers (thread %d on the phase of parity %u of the "
              "one at %p, which has %u arrivals and %lld announced bytes to come), %d at "
              "__syncthreads, %d returned",
              n_mbar, first, M.threads[first].mbar_parity, (void *)M.threads[first].mbar,
              M.mbars[M.threads[first].mbar].pending, (long long)M.mbars[M.threads[first].mbar].tx,
              M.n_barrier, M.n_done);
    fault("deadlock: %d threads at __syncthreads, %d returned", M.n_barrier, M.n_done);
}

void run_block() {
    unsigned char *shared_lo = __start_kemu_shared, *shared_hi = __stop_kemu_shared;
    if (shared_lo != shared_hi) memset(shared_lo, 0xff, (size_t)(shared_hi - shared_lo));
    if (!M.dyn.empty()) memset(M.dyn.data(), 0xff, M.dyn.size());
    M.n_barrier = M.n_done = 0;
    for (int w = 0; w < M.n / 32; w++) M.warp_arrived[w] = 0;
    M.queue.clear();
    M.head = 0;
    for (int t = 0; t < M.n; t++) start_thread(t);
    push_range(0, M.n);
    async_block_begin();
    for (;;) {
        const int t = pop();
        if (t >= 0)
            resume(t);
        else if (!unblock())
            break;
    }
    async_block_end();
    if (block_end_hook) block_end_hook();
    M.stats.blocks++;
}

} // namespace

// ---- the interface ------------------------------------------------------------------------------

void launch(dim3 grid, dim3 block, size_t dyn_smem, const std::function<void()> &kernel,
            launch_options opt) {
    const long n = (long)block.x * block.y * block.z;
    if (n <= 0 || n > MAX_THREADS || n % 32 != 0)
        fault("launch with %ld threads per block (1 to %d, a multiple of 32)", n, MAX_THREADS);
    if (M.cur >= 0) fault("launch from inside a kernel");
#if defined(KEMU_ASM_SWITCH)
    M.asm_switch = !shadow_stack_on();
#endif
    M.n = (int)n;
    M.grid = grid;
    M.block = block;
    M.kernel = &kernel;
    M.order = opt.order;
    M.rng = opt.seed ? opt.seed : 1;
    M.dyn.assign(dyn_smem, 0xff);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                M.block_idx = uint3{x, y, z};
                run_block();
            }
    M.kernel = nullptr;
}

const counters &stats() {
    return M.stats;
}

uint3 thread_idx() {
    current("threadIdx");
    const unsigned t = (unsigned)M.cur;
    return uint3{t % M.block.x, t / M.block.x % M.block.y, t / (M.block.x * M.block.y)};
}
uint3 block_idx() {
    current("blockIdx");
    return M.block_idx;
}
dim3 block_dim() {
    return M.block;
}
dim3 grid_dim() {
    return M.grid;
}

unsigned char *dynamic_smem() {
    current("dynamic shared memory");
    return M.dyn.data();
}

void syncthreads() {
    thread &th = current("__syncthreads");
    th.state = AT_BARRIER;
    th.epoch++;
    M.n_barrier++;
    suspend(false);
}

uint64_t warp_shfl(unsigned mask, uint64_t bits, int size, shfl_mode mode, int arg, int width) {
    thread &th = current("a shuffle");
    th.op = OP_SHFL;
    th.mask = mask;
    th.in = bits;
    th.size = size;
    th.mode = mode;
    th.arg = arg;
    th.width = width;
    return warp_arrive(th);
}

unsigned warp_ballot(unsigned mask, bool pred) {
    thread &th = current("__ballot_sync");
    th.op = OP_BALLOT;
    th.mask = mask;
    th.in = pred;
    return (unsigned)warp_arrive(th);
}

void warp_sync(unsigned mask) {
    thread &th = current("__syncwarp");
    th.op = OP_SYNCWARP;
    th.mask = mask;
    warp_arrive(th);
}

// The running lane reaches an mma (its operands stored) and waits for its warp.
void mma_arrive(op_kind op, bool f16, float *d, const uint32_t *a, const uint32_t *b) {
    thread &th = current("mma.sync");
    th.op = op;
    th.mask = 0xffffffffu;
    th.f16 = f16;
    th.d = d;
    th.a = a;
    th.b = b;
    warp_arrive(th);
}

} // namespace loom_emu

void loom_emu_mma_m16n8k8_tf32(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    loom_emu::mma_arrive(loom_emu::OP_MMA, false, d, a, b);
}

void loom_emu_mma_m16n8k16(bool f16, float d[4], const uint32_t a[4], const uint32_t b[2]) {
    loom_emu::mma_arrive(loom_emu::OP_MMA16, f16, d, a, b);
}

// cvt.rna.tf32.f32: to 10 mantissa bits, to nearest with ties away from zero (adding half of the
// dropped part's unit to the magnitude's bits does that; a carry into the exponent is right, up
// to infinity); infinities and NaN pass unchanged.
uint32_t loom_emu_cvt_rna_tf32(float x) {
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return u;
    return (u + 0x1000u) & 0xffffe000u;
}
