// kernel_emu.cpp — the SIMT machine behind kernel_emu.h: a block's threads are coroutines of the
// one OS thread, each with its own stack; a thread runs until it reaches __syncthreads or a warp
// collective, and a scheduler (one of kernel_emu.h's orders) picks the next. A collective
// completes when the warp's 32 lanes have all reached it (the last lane to arrive computes it for
// the warp); a barrier when every thread has. Nothing runs in parallel, so the emulator and the
// kernels share memory freely; AddressSanitizer is told about every stack switch.
#include "kernel_emu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <deque>
#include <utility>
#include <vector>

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

enum thread_state : uint8_t { RUNNABLE, AT_BARRIER, AT_WARP_OP, DONE };
enum op_kind : uint8_t {
    OP_SHFL,
    OP_BALLOT,
    OP_MMA,
    OP_SYNCWARP,
    OP_MMA16,
    OP_WG_MMA,
    OP_WG_FENCE,
    OP_WG_COMMIT,
    OP_WG_WAIT
};
const char *const op_names[] = {"a shuffle",   "__ballot_sync",      "mma.sync",
                                "__syncwarp",  "mma.sync (16-bit)",  "wgmma.mma_async",
                                "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group"};

// Stacks: kernels keep their arrays in registers on the device, here on the stack (the prefill
// kernel's accumulator is 512 bytes); AddressSanitizer's redzones need room too.
constexpr size_t STACK_BYTES = 256 * 1024;
constexpr int MAX_THREADS = 1024;

struct thread {
    void *sp;             // saved stack pointer while suspended (kemu_switch)
    ucontext_t ctx;       // or context (ucontext)
    unsigned char *stack; // lowest usable byte; a guard page lies below
    const void *exit_sp;  // where the stack stood when the thread ended (ASan: see start_thread)
    thread_state state;
    // the warp collective this lane waits at: its arguments and result
    op_kind op;
    shfl_mode mode;
    int size, arg, width;
    unsigned mask;
    uint64_t in, out;
    float *d;
    const uint32_t *a, *b;
    bool f16; // OP_MMA16: F16 operands (else BF16)
    // OP_WG_MMA: the descriptors, the columns, scale-d; OP_WG_WAIT: the groups left pending (arg)
    uint64_t da, db;
    int wg_n;
    bool wg_acc;
};

// A wgmma.mma_async a warp has issued and the emulator has not computed yet.
struct wg_op {
    float *d[32];           // each lane's accumulators
    const uint32_t *ar[32]; // each lane's A registers (A from registers), else null
    uint64_t da, db;
    int n;
    bool acc, f16;
    std::vector<double> a, b; // the warp's A rows and all of B as they were at the issue
};

// A cp.async a thread has issued and the emulator has not performed yet.
struct cp_op {
    unsigned char *dst;
    const unsigned char *src;
    int src_bytes;
};

// A thread's cp.async's in flight: those since its last commit, then the committed groups.
struct cp_queue {
    std::vector<cp_op> open;
    std::deque<std::vector<cp_op>> groups;
};

// A warp's wgmma's in flight: those issued since its last commit, and the committed groups,
// oldest first.
struct wg_queue {
    std::vector<wg_op> open;
    std::deque<std::vector<wg_op>> groups;
};

struct machine {
    thread threads[MAX_THREADS];
    int n = 0; // threads in the block
    dim3 grid, block;
    uint3 block_idx;
    int cur = -1; // the running thread; -1: the scheduler
    const std::function<void()> *kernel = nullptr;
    std::vector<unsigned char> dyn;
    int n_barrier = 0, n_done = 0;
    int warp_arrived[MAX_THREADS / 32];
    wg_queue wgmma[MAX_THREADS / 32];
    cp_queue cp[MAX_THREADS];
    // runnable threads, each at most once; taken as the schedule says
    std::vector<int> queue;
    size_t head = 0;
    schedule order = schedule::breadth;
    uint64_t rng = 1;
    bool asm_switch = false; // kemu_switch, not ucontext
    void *sched_sp;
    ucontext_t sched_ctx;
    const void *sched_stack_bottom = nullptr; // ASan: the scheduler's stack
    size_t sched_stack_size = 0;
    counters stats = {};
};

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

// Rows r0 .. r0 + rows - 1 (16 BF16 or F16 values of K each) of a K-major operand without swizzle
// at descriptor desc into out[rows][16] (wgmma.cuh's layout, from the PTX ISA's "Shared Memory
// Matrix Layout" and "Matrix Descriptor"): element (r, k) at start + (r / 8) SBO + (r % 8) 16 +
// (k / 8) LBO + (k % 8) 2; start address bits 0-13, LBO 16-29, SBO 32-45 (each in 16-byte
// units), base offset 49-51 and swizzle mode 62-63 both 0 here, the other bits unused (0).
void wg_rows(int w, uint64_t desc, bool f16, int r0, int rows, double *out) {
    const uint64_t used = 0x3fffull | 0x3fffull << 16 | 0x3fffull << 32;
    if ((desc & ~used) != 0)
        fault("warp %d: wgmma descriptor 0x%016llx sets bits past the address, LBO and SBO "
              "(base offset, swizzle or unused ones: not emulated)",
              w, (unsigned long long)desc);
    const size_t start = (size_t)(desc & 0x3fff) << 4, lbo = (size_t)(desc >> 16 & 0x3fff) << 4;
    const size_t sbo = (size_t)(desc >> 32 & 0x3fff) << 4;
    for (int r = r0; r < r0 + rows; r++)
        for (int kg = 0; kg < 2; kg++) {
            const size_t at = start + (size_t)(r / 8) * sbo + (size_t)(r % 8) * 16 + kg * lbo;
            if (at + 16 > M.dyn.size())
                fault("warp %d: wgmma operand row %d, values %d..%d at shared byte %zu, past the "
                      "%zu bytes of dynamic shared memory",
                      w, r, 8 * kg, 8 * kg + 7, at, M.dyn.size());
            uint16_t h[8];
            memcpy(h, M.dyn.data() + at, 16);
            for (int e = 0; e < 8; e++)
                out[(size_t)(r - r0) * 16 + 8 * kg + e] =
                    f16 ? (double)__half2float(__ushort_as_half(h[e]))
                        : (double)__bfloat162float(__ushort_as_bfloat16(h[e]));
        }
}

// The operands of warp w's wgmma: its 16 rows of A (16 x 16) and B (n rows of 16). A from
// registers: lane l = 4 g + i holds in a[r] the pair of row g + 8 (r % 2), columns 2i + 8 (r / 2)
// and + 1, the lower in the low half (the ISA's "Register Fragments" for m64nNk16's A: warp w
// % 4's rows, as mma.sync m16n8k16's A fragment).
void wg_operands(int w, const wg_op &op, std::vector<double> &a, std::vector<double> &b) {
    const int q = w % 4;
    a.resize(16 * 16);
    b.resize((size_t)op.n * 16);
    if (op.ar[0] == nullptr) {
        wg_rows(w, op.da, op.f16, 16 * q, 16, a.data());
    } else {
        for (int l = 0; l < 32; l++)
            for (int r = 0; r < 4; r++)
                for (int e = 0; e < 2; e++) {
                    const uint16_t h = (uint16_t)(op.ar[l][r] >> (16 * e));
                    a[(size_t)(l / 4 + 8 * (r % 2)) * 16 + 2 * (l % 4) + 8 * (r / 2) + e] =
                        op.f16 ? (double)__half2float(__ushort_as_half(h))
                               : (double)__bfloat162float(__ushort_as_bfloat16(h));
                }
    }
    wg_rows(w, op.db, op.f16, 0, op.n, b.data());
}

// wgmma.mma_async.m64nNk16.f32.{bf16,f16} of warp w (its 16 rows): D = A B + (acc ? D : 0), A
// (64 x 16) and B (16 x N, stored N rows of K) K-major; the accumulator fragment as wgmma.cuh
// states it from the ISA ("Register Fragments", m64nNk16): register j of lane l holds row
// 16 (w % 4) + l / 4 + 8 ((j / 2) % 2), column 8 (j / 4) + 2 (l % 4) + j % 2. Products exact in
// double, the sum rounded to float once.

// The operands are read at the issue and again here, when the wait lets the instruction go: the
// hardware reads them somewhere in between, so any change (a write that landed late, or came
// before the wait) is a race, reported.
void wg_compute(int w, const wg_op &op) {
    std::vector<double> a, B;
    wg_operands(w, op, a, B);
    /* bit patterns, not values: a NaN operand is the same NaN at both reads */
    if (memcmp(a.data(), op.a.data(), a.size() * sizeof(double)) != 0 ||
        memcmp(B.data(), op.b.data(), B.size() * sizeof(double)) != 0)
        fault("warp %d: a wgmma's operands (shared memory or A's registers) changed between its "
              "issue and the wait that let it go",
              w);
    double A[16][16];
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++) A[r][k] = a[(size_t)r * 16 + k];
    for (int l = 0; l < 32; l++)
        for (int j = 0; j < op.n / 2; j++) {
            const int r = l / 4 + 8 * ((j / 2) % 2), c = 8 * (j / 4) + 2 * (l % 4) + j % 2;
            double s = op.acc ? (double)op.d[l][j] : 0.0;
            for (int k = 0; k < 16; k++) s += A[r][k] * B[(size_t)c * 16 + k];
            op.d[l][j] = (float)s;
        }
    M.stats.mma++;
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
    case OP_WG_FENCE:
        break;
    case OP_WG_MMA: {
        wg_op o;
        o.da = lane[0].da, o.db = lane[0].db, o.n = lane[0].wg_n, o.acc = lane[0].wg_acc;
        o.f16 = lane[0].f16;
        for (int l = 0; l < 32; l++) {
            if (lane[l].da != o.da || lane[l].db != o.db || lane[l].wg_n != o.n ||
                lane[l].wg_acc != o.acc || lane[l].f16 != o.f16 ||
                (lane[l].a == nullptr) != (lane[0].a == nullptr))
                fault("warp %d: lanes 0 and %d issue wgmma with other operands", w, l);
            o.d[l] = lane[l].d;
            o.ar[l] = lane[l].a;
        }
        wg_operands(w, o, o.a, o.b);
        M.wgmma[w].open.push_back(std::move(o));
        break;
    }
    case OP_WG_COMMIT:
        M.wgmma[w].groups.push_back(std::move(M.wgmma[w].open));
        M.wgmma[w].open.clear();
        break;
    case OP_WG_WAIT: {
        for (int l = 0; l < 32; l++)
            if (lane[l].arg != lane[0].arg) fault("warp %d: lanes wait for other counts", w);
        wg_queue &qu = M.wgmma[w];
        while ((int)qu.groups.size() > lane[0].arg) {
            for (const wg_op &o : qu.groups.front()) wg_compute(w, o);
            qu.groups.pop_front();
        }
        break;
    }
    }
    M.stats.warp_ops++;
    for (int l = 0; l < 32; l++) lane[l].state = RUNNABLE;
    if (M.order == schedule::depth) /* lane 0 next */
        for (int l = 31; l >= 0; l--) push(w * 32 + l);
    else
        for (int l = 0; l < 32; l++) push(w * 32 + l);
}

// The running lane reaches a collective (its arguments already stored) and waits for its warp.
uint64_t warp_arrive(thread &th) {
    th.state = AT_WARP_OP;
    const int w = M.cur / 32;
    if (++M.warp_arrived[w] == 32) {
        M.warp_arrived[w] = 0;
        warp_complete(w);
    }
    suspend(false);
    return th.out;
}

// No thread can run: the block is done, or every thread waits at the barrier, or it is stuck.
bool unblock() {
    if (M.n_done == M.n) return false;
    if (M.n_barrier > 0 && M.n_barrier + M.n_done == M.n) {
        if (M.n_done > 0)
            fault("__syncthreads reached by %d threads while %d have returned (CUDA requires "
                  "every thread of the block)",
                  M.n_barrier, M.n_done);
        M.n_barrier = 0;
        M.stats.barriers++;
        for (int t = 0; t < M.n; t++) M.threads[t].state = RUNNABLE;
        push_range(0, M.n);
        return true;
    }
    /* a warp waits at a collective some of its lanes will never reach */
    for (int w = 0; w < M.n / 32; w++) {
        int at[4] = {0, 0, 0, 0};
        for (int l = 0; l < 32; l++) at[M.threads[w * 32 + l].state]++;
        if (at[AT_WARP_OP] > 0)
            fault("deadlock: warp %d has %d lanes at %s, %d at __syncthreads, %d returned", w,
                  at[AT_WARP_OP], op_names[M.threads[w * 32].op], at[AT_BARRIER], at[DONE]);
    }
    fault("deadlock: %d threads at __syncthreads, %d returned", M.n_barrier, M.n_done);
}

// Static shared memory: the section kernel_emu.h's __shared__ puts it in (absent when no kernel
// of the program has any: weak).
extern "C" unsigned char __start_kemu_shared[] __attribute__((weak));
extern "C" unsigned char __stop_kemu_shared[] __attribute__((weak));

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
    for (int w = 0; w < M.n / 32; w++) {
        M.wgmma[w].open.clear();
        M.wgmma[w].groups.clear();
    }
    for (int t = 0; t < M.n; t++) {
        M.cp[t].open.clear();
        M.cp[t].groups.clear();
    }
    for (;;) {
        const int t = pop();
        if (t >= 0)
            resume(t);
        else if (!unblock())
            break;
    }
    for (int w = 0; w < M.n / 32; w++)
        if (!M.wgmma[w].open.empty() || !M.wgmma[w].groups.empty())
            fault("warp %d ended with wgmma's in flight (%zu uncommitted, %zu groups not waited "
                  "for)",
                  w, M.wgmma[w].open.size(), M.wgmma[w].groups.size());
    for (int t = 0; t < M.n; t++)
        if (!M.cp[t].open.empty() || !M.cp[t].groups.empty())
            fault("thread %d ended with cp.async copies in flight (%zu uncommitted, %zu groups not "
                  "waited for)",
                  t, M.cp[t].open.size(), M.cp[t].groups.size());
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

void loom_emu_cp_async16(void *dst, const void *src, int src_bytes) {
    using namespace loom_emu;
    current("cp.async");
    unsigned char *d = (unsigned char *)dst;
    if (M.dyn.empty() || d < M.dyn.data() || d + 16 > M.dyn.data() + M.dyn.size() ||
        ((uintptr_t)d & 15) != 0 || ((uintptr_t)src & 15) != 0)
        fault("cp.async to %p from %p: not 16 aligned bytes of dynamic shared memory and global "
              "memory",
              dst, src);
    if (src_bytes < 0 || src_bytes > 16) fault("cp.async of %d source bytes", src_bytes);
    memset(d, 0xff, 16);
    M.cp[M.cur].open.push_back(cp_op{d, (const unsigned char *)src, src_bytes});
}

void loom_emu_cp_async_commit(void) {
    using namespace loom_emu;
    current("cp.async.commit_group");
    cp_queue &q = M.cp[M.cur];
    q.groups.push_back(std::move(q.open));
    q.open.clear();
}

void loom_emu_cp_async_wait(int n) {
    using namespace loom_emu;
    current("cp.async.wait_group");
    cp_queue &q = M.cp[M.cur];
    while ((int)q.groups.size() > n) {
        for (const cp_op &c : q.groups.front()) {
            memcpy(c.dst, c.src, (size_t)c.src_bytes);
            memset(c.dst + c.src_bytes, 0, (size_t)(16 - c.src_bytes));
        }
        q.groups.pop_front();
    }
}

uint32_t loom_emu_smem_addr(const void *p) {
    using namespace loom_emu;
    current("__cvta_generic_to_shared");
    const unsigned char *c = (const unsigned char *)p;
    if (M.dyn.empty() || c < M.dyn.data() || c >= M.dyn.data() + M.dyn.size())
        fault("a shared-memory address of %p, outside the dynamic shared memory (the only one "
              "emulated for wgmma)",
              p);
    return (uint32_t)(c - M.dyn.data());
}

void loom_emu_fence_proxy_async(void) {
    loom_emu::current("fence.proxy.async");
}

namespace loom_emu {
namespace {
void wg_collective(op_kind op, int arg) {
    thread &th = current(op_names[op]);
    th.op = op;
    th.mask = 0xffffffffu;
    th.arg = arg;
    warp_arrive(th);
}
} // namespace
} // namespace loom_emu

void loom_emu_wgmma_fence(void) {
    loom_emu::wg_collective(loom_emu::OP_WG_FENCE, 0);
}

void loom_emu_wgmma_commit(void) {
    loom_emu::wg_collective(loom_emu::OP_WG_COMMIT, 0);
}

void loom_emu_wgmma_wait(int n) {
    loom_emu::wg_collective(loom_emu::OP_WG_WAIT, n);
}

void loom_emu_wgmma(bool f16, int n, float *d, uint64_t da, const uint32_t *a, uint64_t db,
                    bool accumulate) {
    using namespace loom_emu;
    thread &th = current("wgmma.mma_async");
    if (n < 8 || n > 256 || n % 8 != 0) fault("wgmma with N = %d (8 .. 256, multiples of 8)", n);
    th.op = OP_WG_MMA;
    th.mask = 0xffffffffu;
    th.d = d;
    th.da = da;
    th.db = db;
    th.wg_n = n;
    th.wg_acc = accumulate;
    th.f16 = f16;
    th.a = a;
    warp_arrive(th);
}

// cvt.rna.tf32.f32: to 10 mantissa bits, to nearest with ties away from zero (adding half of the
// dropped part's unit to the magnitude's bits does that; a carry into the exponent is right, up
// to infinity); infinities and NaN pass unchanged.
uint32_t loom_emu_cvt_rna_tf32(float x) {
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return u;
    return (u + 0x1000u) & 0xffffe000u;
}
