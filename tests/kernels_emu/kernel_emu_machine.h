// kernel_emu_machine.h — the emulator's own state, shared by its two halves and by nothing else:
// kernel_emu.cpp (the block's coroutine threads, the scheduler, barriers, warp collectives, the
// launch) and kernel_emu_async.cpp (Hopper's asynchronous instructions: wgmma with its fences and
// groups, cp.async, mbarriers, setmaxnreg, and the proxies between them and ordinary stores).
// Kernels and tests include kernel_emu.h only.
#pragma once

// (the standard headers first: kernel_emu.h defines CUDA's __noinline__, which <memory> uses as
// the attribute's own name)
#include <ucontext.h>

#include <deque>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernel_emu.h"

namespace loom_emu {
namespace impl {

enum thread_state : uint8_t { RUNNABLE, AT_BARRIER, AT_WARP_OP, DONE, AT_MBAR, N_STATES };
enum op_kind : uint8_t {
    OP_SHFL,
    OP_BALLOT,
    OP_MMA,
    OP_SYNCWARP,
    OP_MMA16,
    OP_WG_MMA,
    OP_WG_FENCE,
    OP_WG_COMMIT,
    OP_WG_WAIT,
    OP_WG_MAXNREG
};
extern const char *const op_names[];

// Stacks: kernels keep their arrays in registers on the device, here on the stack (the prefill
// kernel's accumulator is 512 bytes); AddressSanitizer's redzones need room too.
constexpr size_t STACK_BYTES = 256 * 1024;
constexpr int MAX_THREADS = 1024;

struct landed_batch;

struct thread {
    void *sp;             // saved stack pointer while suspended (kemu_switch)
    ucontext_t ctx;       // or context (ucontext)
    unsigned char *stack; // lowest usable byte; a guard page lies below
    const void *exit_sp;  // where the stack stood when the thread ended (ASan: see start_thread)
    thread_state state;
    // the warp collectives and barriers this thread has passed in its block: the lanes of a warp
    // agree on it, which is how smem_banks.cpp tells which of their accesses are one instruction
    uint32_t epoch;
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
    bool wg_tb; // B N-major (imm-trans-b 1)
    // AT_MBAR: the mbarrier this thread waits on and the parity of the phase it waits for
    uint64_t *mbar;
    unsigned mbar_parity;
    // the copies whose landing this thread has acquired by its mbarrier waits, for its next
    // fence.proxy.async to publish to the async proxy
    std::vector<std::shared_ptr<landed_batch>> acquired;
};

// A wgmma.mma_async a warp has issued and the emulator has not computed yet.
struct wg_op {
    float *d[32];           // each lane's accumulators
    const uint32_t *ar[32]; // each lane's A registers (A from registers), else null
    uint64_t da, db;
    int n;
    bool acc, f16, tb;        // tb: B N-major (imm-trans-b 1)
    std::vector<double> a, b; // the warp's A rows and all of B as they were at the issue
    // whether an earlier wgmma in flight at the issue writes the same accumulators (a chain:
    // ordered by the hardware); if not, the accumulators' bits at the issue, 32 lanes by n / 2
    bool chained;
    std::vector<uint32_t> d_at_issue;
};

// A cp.async a thread has issued and the emulator has not performed yet.
struct cp_op {
    unsigned char *dst;
    const unsigned char *src;
    int src_bytes;
};

// A thread's cp.async's in flight: those since its last commit, then the committed groups; and
// the destinations of those that have landed since the thread's last fence.proxy.async.
struct cp_queue {
    std::vector<cp_op> open;
    std::deque<std::vector<cp_op>> groups;
    std::vector<unsigned char *> unfenced;
};

// A warp's wgmma state: the instructions issued since its last commit, and the committed groups,
// oldest first; whether it has executed a wgmma.fence; the registers its wgmma's use (each lane's
// accumulators and A fragments, by address) as they stood at its last wgmma.fence or were last
// written by a wgmma; how many warpgroup instructions it has executed.
struct wg_queue {
    std::vector<wg_op> open;
    std::deque<std::vector<wg_op>> groups;
    bool fenced;
    std::unordered_map<const void *, std::vector<uint32_t>> ordered;
    size_t executed;
};

// The destinations of cp.async's that landed through an mbarrier (cp.async.mbarrier.arrive) in one
// of its phases; published: a thread that acquired them (by its wait on the phase) has since run
// a fence.proxy.async, so the async proxy sees them.
// Tensor-map copies (tma_copy) write through the async proxy itself: such a batch is the async
// proxy's as it lands, and a warp's wgmma may read it once a thread of the warp has acquired it.
struct landed_batch {
    std::vector<unsigned char *> dsts;
    bool published = false;
    uint32_t fenced_warps = 0; // the warps with a thread that acquired it and fenced since
    bool async_written = false;
};

// An mbarrier (kernels/mbarrier.cuh): arrivals a phase, those still to come in the current one,
// the phases completed; the copies landed through it in the current phase, and in the last
// completed one (what a wait on that phase acquires).
struct mbar_state {
    unsigned count = 0, pending = 0;
    int64_t tx = 0; // the current phase's bytes announced (expect_tx) and not landed yet
    uint64_t completed = 0;
    std::shared_ptr<landed_batch> landing, last;
};

// A thread's cp.async.mbarrier.arrive: its copies in flight then, and the barrier that gets one
// arrival when they have landed.
struct cp_arrival {
    uint64_t *bar;
    std::vector<cp_op> copies;
};

// A tensor-map copy in flight (kernels/tma.cuh): the box of a 2-D tensor at (x, y) into dst, its
// bytes completing on bar. The map's fields, as loom_emu_tmap_encode_tiled wrote them.
struct tma_copy {
    uint64_t *bar;
    unsigned char *dst;
    const unsigned char *base;
    uint64_t dims[2], stride;
    uint32_t box[2], elem;
    int64_t x, y;
};

// One warpgroup instruction as a warp executed it (kernel_emu_async.cpp compares the four warps').
struct wg_sig {
    op_kind op;
    int arg, n; // OP_WG_WAIT: groups left pending; OP_WG_MMA: N
    bool f16, acc, a_regs, tb;
    uint64_t da, db;
};

// The instructions a warpgroup's warps have executed, from the oldest some warp has not reached.
struct wg_agreement {
    std::deque<wg_sig> sigs;
    size_t base;
};

struct machine {
    thread threads[MAX_THREADS];
    int n = 0; // threads in the block
    dim3 grid, block;
    uint3 block_idx;
    int cur = -1; // the running thread; -1: the scheduler
    const std::function<void()> *kernel = nullptr;
    std::vector<unsigned char> dyn;
    // what the async proxy (wgmma's operand reads) sees of dyn (kernel_emu_async.cpp), and
    // whether a fence.proxy.async has run since it was last brought up to date
    std::vector<unsigned char> dyn_async;
    bool proxy_fenced = false;
    int n_barrier = 0, n_done = 0;
    int warp_arrived[MAX_THREADS / 32];
    wg_queue wgmma[MAX_THREADS / 32];
    wg_agreement wg_groups[MAX_THREADS / 128];
    cp_queue cp[MAX_THREADS];
    // the block's mbarriers by address, the cp.async arrivals not landed yet (they land when no
    // thread can run: as late as the hardware may land them), the landed batches no thread has
    // published yet
    std::unordered_map<uint64_t *, mbar_state> mbars;
    std::vector<cp_arrival> cp_arrivals;
    // the tensor-map copies not landed yet (they land with the cp.async arrivals), and the
    // 16-byte pieces of dyn they will write (offsets), which no wgmma may read before
    std::vector<tma_copy> tma_copies;
    std::unordered_set<size_t> tma_pending;
    std::vector<std::shared_ptr<landed_batch>> unpublished;
    // the batch the 16 bytes at each offset of dyn last landed in (cleared when a cp.async is
    // issued there, or by a barrier after the batch's publication): a warp's wgmma may read them
    // only once one of its threads has fenced after acquiring the batch
    std::unordered_map<size_t, std::shared_ptr<landed_batch>> landed_at;
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

extern machine M;

// smem_banks.cpp's hooks, null unless it traces accesses (plain pointers, constant-initialised,
// so that they may be set before the machine's own initialisation runs): a block has finished;
// a cp.async is issued (its shared destination, global source and source bytes, the issuing
// code's address: the copy's write and read count as a store and a load).
extern void (*block_end_hook)();
extern void (*cp_async_hook)(const void *dst, const void *src, int src_bytes, const void *pc);

// Static shared memory: the section kernel_emu.h's __shared__ puts it in (absent when no kernel
// of the program has any: weak).
extern "C" unsigned char __start_kemu_shared[] __attribute__((weak));
extern "C" unsigned char __stop_kemu_shared[] __attribute__((weak));

// The running thread, its state set to a waiting one, gives the processor back until another
// makes it runnable (make_runnable).
void wait_here();
void make_runnable(int t);
// The running thread stays runnable but lets the threads runnable now go first.
void yield_here();

// Reports a broken rule (the block and thread where it happened) and ends the program.
[[noreturn]] __attribute__((format(printf, 1, 2))) void fault(const char *fmt, ...);
// The running thread; what: the operation, named in the fault if none runs.
thread &current(const char *what);
// The running lane reaches a collective (its arguments already stored in th) and waits for its
// warp; returns its result.
uint64_t warp_arrive(thread &th);

// kernel_emu_async.cpp's part of a block's life: before its first thread runs, when all its
// threads pass a barrier, when they have all returned (reports what is still in flight).
void async_block_begin();
void async_barrier();
void async_block_end();
// No thread can run: lands the cp.async arrivals in flight (true if there were any).
bool async_land_arrivals();
// Warp w's 32 lanes are all at the wgmma instruction op (OP_WG_*).
void wg_complete(int w, op_kind op);

} // namespace impl
using namespace impl;
} // namespace loom_emu
