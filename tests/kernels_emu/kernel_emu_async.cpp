// kernel_emu_async.cpp — Hopper's asynchronous instructions on the emulator's SIMT machine
// (kernel_emu.cpp), with the rules the PTX ISA gives for them checked where a kernel could break
// them:
//   - wgmma.mma_async is recorded when a warp issues it and computed when a wgmma.wait_group lets
//     its committed group go; its operands are read at both points, and any difference reported
//     (the hardware reads them somewhere in between);
//   - wgmma.fence: a warp's first wgmma needs one before it; so does any wgmma whose registers
//     (accumulators, A fragments) the warp's own instructions wrote since its last one ("Async
//     Warpgroup Level Matrix Multiply-Accumulate Instructions: wgmma.fence"). Such writes are
//     found by value: the registers as they stood at the last fence (or as the last wgmma left
//     them) against the issue's; so are writes to accumulators a wgmma in flight owns;
//   - the proxies: wgmma reads shared memory through the async proxy; stores and cp.async write
//     it through the generic proxy, and their data reaches the async proxy only across a
//     fence.proxy.async ("Memory Consistency Model: Proxies"). The emulator keeps the async
//     proxy's own view of the dynamic shared memory, brought up to date at a barrier that
//     follows a fence.proxy.async; a wgmma whose operands differ between the two views read data
//     no fence made visible;
//   - a warpgroup's four warps execute the same wgmma instructions (".sync.aligned") in the same
//     order, with the same descriptors, shape and scale-d;
//   - cp.async fills its destination with 0xff at the issue and copies when a
//     cp.async.wait_group of its thread lets it go, so a read before the wait shows;
//   - mbarriers ("Parallel Synchronization and Communication Instructions: mbarrier"): a wait
//     suspends the thread until the phase of its parity completes; a cp.async.mbarrier.arrive
//     takes the thread's copies in flight, which land (and then arrive) only when no thread of
//     the block can run, as late as the hardware may land them; their bytes reach the async proxy
//     through a fence.proxy.async of a thread that waited on the phase they completed (the
//     fence orders what the thread has acquired), and a warp's wgmma may read them only after
//     such a fence by a thread of its own (by a lane of the warp: the lanes are not told apart). A
//     barrier used before its init, re-initialised while in use, or copies still in flight through
//     one when the block ends are reported, and a block whose threads all wait is a deadlock;
//   - setmaxnreg is a warpgroup instruction like wgmma's (the four warps agree); the registers
//     themselves are not counted.
// The fences' models are coarser than the hardware in one direction only: a barrier after any
// thread's fence.proxy.async publishes every store made before it (a store whose own thread did
// not fence passes), while a cp.async publishes only behind a fence of the thread that issued it
// (or, landed through an mbarrier, of one thread that acquired it: the async proxy's view is the
// block's, not each thread's); a register array a warp's wgmma's have not used before is taken as
// it stands at its first use.
#include "kernel_emu_machine.h"

#include <stdio.h>

#include <algorithm>
#include <utility>

namespace loom_emu {
namespace {

// Copies bytes of a lane's registers — stack memory, perhaps of a scope the kernel has left by
// now (the fence's snapshot below reads every array a wgmma used): AddressSanitizer is kept from
// reading it as a use after scope; the bytes are only compared.
__attribute__((no_sanitize("address"))) void copy_lane_regs(void *dst, const void *src,
                                                            size_t bytes) {
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    for (size_t i = 0; i < bytes; i++) d[i] = s[i];
}

// A matrix descriptor (the PTX ISA's "Matrix Descriptor"): start address bits 0-13, LBO 16-29,
// SBO 32-45 (each in 16-byte units, returned in bytes), base offset 49-51 and swizzle mode 62-63
// both 0 here, the other bits unused (0).
struct wg_desc_fields {
    size_t start, lbo, sbo;
};
wg_desc_fields wg_desc_of(int w, uint64_t desc) {
    const uint64_t used = 0x3fffull | 0x3fffull << 16 | 0x3fffull << 32;
    if ((desc & ~used) != 0)
        fault("warp %d: wgmma descriptor 0x%016llx sets bits past the address, LBO and SBO "
              "(base offset, swizzle or unused ones: not emulated)",
              w, (unsigned long long)desc);
    return {(size_t)(desc & 0x3fff) << 4, (size_t)(desc >> 16 & 0x3fff) << 4,
            (size_t)(desc >> 32 & 0x3fff) << 4};
}

// Where wg_row8 notes the shared byte offsets it reads (null: nowhere).
std::vector<size_t> *g_rows_read = nullptr;

// The 8 BF16 or F16 values of a core-matrix row at shared byte at into v[0], v[stride], ...
// (what: the operand's row and values, for the fault).
void wg_row8(int w, const std::vector<unsigned char> &smem, size_t at, bool f16, double *v,
             size_t stride, const char *what, int row, int first) {
    if (g_rows_read != nullptr) g_rows_read->push_back(at);
    if (at + 16 > smem.size())
        fault("warp %d: wgmma %s %d, values %d..%d at shared byte %zu, past the %zu bytes of "
              "dynamic shared memory",
              w, what, row, first, first + 7, at, smem.size());
    uint16_t h[8];
    memcpy(h, smem.data() + at, 16);
    for (int e = 0; e < 8; e++)
        v[e * stride] = f16 ? (double)__half2float(__ushort_as_half(h[e]))
                            : (double)__bfloat162float(__ushort_as_bfloat16(h[e]));
}

// Rows r0 .. r0 + rows - 1 (16 BF16 or F16 values of K each) of a K-major operand without swizzle
// at descriptor desc into out[rows][16] (wgmma.cuh's layout, from the PTX ISA's "Shared Memory
// Matrix Layout"): element (r, k) at start + (r / 8) SBO + (r % 8) 16 + (k / 8) LBO + (k % 8) 2.
// smem: the generic proxy's view (M.dyn) or the async proxy's (M.dyn_async).
void wg_rows(int w, const std::vector<unsigned char> &smem, uint64_t desc, bool f16, int r0,
             int rows, double *out) {
    const wg_desc_fields d = wg_desc_of(w, desc);
    for (int r = r0; r < r0 + rows; r++)
        for (int kg = 0; kg < 2; kg++)
            wg_row8(w, smem, d.start + (size_t)(r / 8) * d.sbo + (size_t)(r % 8) * 16 + kg * d.lbo,
                    f16, out + (size_t)(r - r0) * 16 + 8 * kg, 1, "operand row", r, 8 * kg);
}

// All of an N-major ("transposed", imm-trans-b 1) B operand without swizzle, 16 values of K by n
// of N, at descriptor desc into out[n][16] (out[c][k]: column c, row k), from the same section's
// canonical layouts, MN-major without swizzling: ((T,1,m),(8,k)) : ((1,T,SBO),(1T,LBO)) with
// T = 8 16-bit values, that is element (k, c) at start + (c / 8) SBO + (c % 8) 2 + (k / 8) LBO +
// (k % 8) 16: a core matrix holds 8 rows of K by 16 contiguous bytes of N; the next 8 values of N
// lie SBO bytes further, the next 8 rows of K LBO bytes further (the roles of the two offsets
// are the K-major layout's, with N in place of the rows).
void wg_cols_n_major(int w, const std::vector<unsigned char> &smem, uint64_t desc, bool f16, int n,
                     double *out) {
    const wg_desc_fields d = wg_desc_of(w, desc);
    for (int cg = 0; cg < n / 8; cg++)
        for (int k = 0; k < 16; k++)
            wg_row8(w, smem, d.start + (size_t)cg * d.sbo + (size_t)(k / 8) * d.lbo + (k % 8) * 16,
                    f16, out + (size_t)(8 * cg) * 16 + k, 16, "N-major operand row of K", k,
                    8 * cg);
}

// The operands of warp w's wgmma: its 16 rows of A (16 x 16) and B (n rows of 16). A from
// registers: lane l = 4 g + i holds in a[r] the pair of row g + 8 (r % 2), columns 2i + 8 (r / 2)
// and + 1, the lower in the low half (the ISA's "Register Fragments" for m64nNk16's A: warp w
// % 4's rows, as mma.sync m16n8k16's A fragment).
void wg_operands(int w, const wg_op &op, const std::vector<unsigned char> &smem,
                 std::vector<double> &a, std::vector<double> &b) {
    const int q = w % 4;
    a.resize(16 * 16);
    b.resize((size_t)op.n * 16);
    if (op.ar[0] == nullptr) {
        wg_rows(w, smem, op.da, op.f16, 16 * q, 16, a.data());
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
    if (op.tb)
        wg_cols_n_major(w, smem, op.db, op.f16, op.n, b.data());
    else
        wg_rows(w, smem, op.db, op.f16, 0, op.n, b.data());
}

// Records the registers at p (words 32-bit words of lane l of warp w) as ordered: the warp's
// later wgmma's may use them as they are now.
void wg_order(int w, const void *p, int words) {
    std::vector<uint32_t> &e = M.wgmma[w].ordered[p];
    e.resize((size_t)words);
    copy_lane_regs(e.data(), p, (size_t)words * 4);
}

// A wgmma of warp w is about to use lane l's registers at p (words of them; what: which): they
// must be as they stood at the warp's last wgmma.fence (or as a wgmma left them since). An array
// not used before is taken as it stands.
void wg_check_ordered(int w, int l, const void *p, int words, const char *what) {
    auto it = M.wgmma[w].ordered.find(p);
    if (it == M.wgmma[w].ordered.end() || it->second.size() < (size_t)words) {
        wg_order(w, p, words);
        return;
    }
    if (memcmp(it->second.data(), p, (size_t)words * 4) != 0)
        fault("warp %d, lane %d: the %s of a wgmma.mma_async were written since the warp's last "
              "wgmma.fence (the PTX ISA requires one between a register write and a wgmma that "
              "uses the register)",
              w, l, what);
}

// The wgmma in flight (issued, not computed) of warp w whose lane l accumulates into d, if any:
// the last issued.
const wg_op *wg_in_flight_on(int w, int l, const float *d) {
    const wg_queue &qu = M.wgmma[w];
    for (auto it = qu.open.rbegin(); it != qu.open.rend(); ++it)
        if (it->d[l] == d) return &*it;
    for (auto g = qu.groups.rbegin(); g != qu.groups.rend(); ++g)
        for (auto it = g->rbegin(); it != g->rend(); ++it)
            if (it->d[l] == d) return &*it;
    return nullptr;
}

// wgmma.mma_async.m64nNk16.f32.{bf16,f16} of warp w (its 16 rows): D = A B + (acc ? D : 0), A
// (64 x 16) K-major and B (16 x N) K-major (stored as N rows of K) or N-major; the accumulator
// fragment as wgmma.cuh states it from the ISA ("Register Fragments", m64nNk16): register j of lane
// l holds row 16 (w % 4) + l / 4 + 8 ((j / 2) % 2), column 8 (j / 4) + 2 (l % 4) + j % 2. Products
// exact in double, the sum rounded to float once.
//
// The operands are read at the issue and again here, when the wait lets the instruction go: the
// hardware reads them somewhere in between, so any change (a write that landed late, or came
// before the wait) is a race, reported; so is a change to accumulators the instruction owns.
void wg_compute(int w, const wg_op &op) {
    std::vector<double> a, B;
    wg_operands(w, op, M.dyn, a, B);
    /* bit patterns, not values: a NaN operand is the same NaN at both reads */
    if (memcmp(a.data(), op.a.data(), a.size() * sizeof(double)) != 0 ||
        memcmp(B.data(), op.b.data(), B.size() * sizeof(double)) != 0)
        fault("warp %d: a wgmma's operands (shared memory or A's registers) changed between its "
              "issue and the wait that let it go",
              w);
    const int words = op.n / 2;
    if (!op.chained)
        for (int l = 0; l < 32; l++)
            if (memcmp(op.d[l], op.d_at_issue.data() + (size_t)l * words, (size_t)words * 4) != 0)
                fault("warp %d, lane %d: the accumulators of a wgmma.mma_async in flight were "
                      "written before the wait that let it go",
                      w, l);
    double A[16][16];
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++) A[r][k] = a[(size_t)r * 16 + k];
    for (int l = 0; l < 32; l++) {
        for (int j = 0; j < words; j++) {
            const int r = l / 4 + 8 * ((j / 2) % 2), c = 8 * (j / 4) + 2 * (l % 4) + j % 2;
            double s = op.acc ? (double)op.d[l][j] : 0.0;
            for (int k = 0; k < 16; k++) s += A[r][k] * B[(size_t)c * 16 + k];
            op.d[l][j] = (float)s;
        }
        wg_order(w, op.d[l], words); /* the wait orders the instruction's own writes */
    }
    M.stats.mma++;
}

// Warp w issues the wgmma its lanes agreed on.
void wg_issue(int w) {
    const thread *lane = &M.threads[w * 32];
    wg_queue &qu = M.wgmma[w];
    if (!qu.fenced)
        fault("warp %d: wgmma.mma_async before any wgmma.fence (the PTX ISA requires one before "
              "a warpgroup's first wgmma)",
              w);
    wg_op o;
    o.da = lane[0].da, o.db = lane[0].db, o.n = lane[0].wg_n, o.acc = lane[0].wg_acc;
    o.f16 = lane[0].f16, o.tb = lane[0].wg_tb;
    for (int l = 0; l < 32; l++) {
        if (lane[l].da != o.da || lane[l].db != o.db || lane[l].wg_n != o.n ||
            lane[l].wg_acc != o.acc || lane[l].f16 != o.f16 || lane[l].wg_tb != o.tb ||
            (lane[l].a == nullptr) != (lane[0].a == nullptr))
            fault("warp %d: lanes 0 and %d issue wgmma with other operands", w, l);
        o.d[l] = lane[l].d;
        o.ar[l] = lane[l].a;
    }
    /* accumulators a wgmma in flight writes: a chain of the same shape, ordered by the hardware;
       else they are the warp's registers, and must be as ordered */
    const wg_op *prev = wg_in_flight_on(w, 0, o.d[0]);
    o.chained = prev != nullptr;
    if (prev != nullptr && prev->n != o.n)
        fault("warp %d: a wgmma of N = %d on the accumulators of one of N = %d in flight (only "
              "the same shape chains without a wait)",
              w, o.n, prev->n);
    const int words = o.n / 2;
    for (int l = 0; l < 32; l++) {
        if ((wg_in_flight_on(w, l, o.d[l]) != nullptr) != o.chained)
            fault("warp %d: lanes 0 and %d chain a wgmma differently", w, l);
        if (!o.chained) wg_check_ordered(w, l, o.d[l], words, "accumulators");
        if (o.ar[l] != nullptr) wg_check_ordered(w, l, o.ar[l], 4, "A registers");
    }
    if (!o.chained) {
        o.d_at_issue.resize((size_t)32 * words);
        for (int l = 0; l < 32; l++)
            memcpy(o.d_at_issue.data() + (size_t)l * words, o.d[l], (size_t)words * 4);
    }
    std::vector<size_t> read;
    g_rows_read = &read;
    wg_operands(w, o, M.dyn, o.a, o.b);
    g_rows_read = nullptr;
    /* bytes landed through an mbarrier: a thread of this warp fenced after acquiring them */
    for (size_t at : read) {
        if (M.tma_pending.count(at & ~(size_t)15) != 0)
            fault("warp %d: a wgmma.mma_async reads shared memory a tensor-map copy has not "
                  "landed in yet (no wait on the mbarrier it completes on)",
                  w);
        auto it = M.landed_at.find(at & ~(size_t)15);
        if (it != M.landed_at.end() && (it->second->fenced_warps >> w & 1u) == 0)
            fault("warp %d: a wgmma.mma_async reads shared memory copied through an mbarrier "
                  "that no thread of the warp has fenced (fence.proxy.async) since a wait that "
                  "acquired it: the async proxy need not see the data",
                  w);
    }
    /* what the async proxy reads of shared memory must be what the generic proxy wrote */
    std::vector<double> a_async, b_async;
    wg_operands(w, o, M.dyn_async, a_async, b_async);
    if (memcmp(a_async.data(), o.a.data(), o.a.size() * sizeof(double)) != 0 ||
        memcmp(b_async.data(), o.b.data(), o.b.size() * sizeof(double)) != 0)
        fault("warp %d: a wgmma.mma_async reads shared memory written (stored, or by cp.async) "
              "with no fence.proxy.async of the writing thread and barrier between, or copied "
              "through an mbarrier and not landed, not waited for or not fenced since the wait: "
              "the async proxy need not see the data",
              w);
    qu.open.push_back(std::move(o));
}

// The four warps of a warpgroup execute the same warpgroup instructions: warp w's next is s.
void wg_agree(int w, const wg_sig &s) {
    if (M.n % 128 != 0)
        fault("warp %d: %s in a block of %d threads (warpgroups are 128 threads)", w,
              op_names[s.op], M.n);
    wg_agreement &g = M.wg_groups[w / 4];
    const size_t at = M.wgmma[w].executed++;
    if (at == g.base + g.sigs.size()) {
        g.sigs.push_back(s);
    } else {
        const wg_sig &t = g.sigs[at - g.base];
        if (t.op != s.op || t.arg != s.arg || t.n != s.n || t.f16 != s.f16 || t.acc != s.acc ||
            t.a_regs != s.a_regs || t.tb != s.tb || t.da != s.da || t.db != s.db)
            fault("warp %d: its warpgroup instruction %zu (%s) is not what another warp of its "
                  "warpgroup executed there (%s, or its operands differ): the wgmma "
                  "instructions are .sync.aligned across the warpgroup",
                  w, at, op_names[s.op], op_names[t.op]);
    }
    size_t low = M.wgmma[4 * (w / 4)].executed;
    for (int v = 4 * (w / 4) + 1; v < 4 * (w / 4) + 4; v++)
        low = std::min(low, M.wgmma[v].executed);
    while (g.base < low) { /* every warp is past it */
        g.sigs.pop_front();
        g.base++;
    }
}

void wg_collective(op_kind op, int arg) {
    thread &th = current(op_names[op]);
    th.op = op;
    th.mask = 0xffffffffu;
    th.arg = arg;
    warp_arrive(th);
}

} // namespace

namespace impl {

void wg_complete(int w, op_kind op) {
    thread *lane = &M.threads[w * 32];
    wg_sig s = {op, 0, 0, false, false, false, false, 0, 0};
    if (op == OP_WG_WAIT || op == OP_WG_MAXNREG) s.arg = lane[0].arg;
    if (op == OP_WG_MMA) {
        s.n = lane[0].wg_n, s.f16 = lane[0].f16, s.acc = lane[0].wg_acc;
        s.a_regs = lane[0].a != nullptr, s.tb = lane[0].wg_tb, s.da = lane[0].da, s.db = lane[0].db;
    }
    wg_agree(w, s);
    wg_queue &qu = M.wgmma[w];
    switch (op) {
    case OP_WG_FENCE: /* the registers as they are now are ordered before what follows */
        qu.fenced = true;
        for (auto &e : qu.ordered) copy_lane_regs(e.second.data(), e.first, e.second.size() * 4);
        break;
    case OP_WG_MMA:
        wg_issue(w);
        break;
    case OP_WG_COMMIT:
        qu.groups.push_back(std::move(qu.open));
        qu.open.clear();
        break;
    case OP_WG_WAIT:
        for (int l = 0; l < 32; l++)
            if (lane[l].arg != lane[0].arg) fault("warp %d: lanes wait for other counts", w);
        while ((int)qu.groups.size() > lane[0].arg) {
            for (const wg_op &o : qu.groups.front()) wg_compute(w, o);
            qu.groups.pop_front();
        }
        break;
    case OP_WG_MAXNREG:
        for (int l = 0; l < 32; l++)
            if (lane[l].arg != lane[0].arg) fault("warp %d: lanes set other register counts", w);
        break;
    default:
        fault("warp %d: %s is no wgmma instruction", w, op_names[op]);
    }
}

void async_block_begin() {
    for (int w = 0; w < M.n / 32; w++) {
        wg_queue &qu = M.wgmma[w];
        qu.open.clear();
        qu.groups.clear();
        qu.fenced = false;
        qu.ordered.clear();
        qu.executed = 0;
    }
    for (int g = 0; g < M.n / 128; g++) {
        M.wg_groups[g].sigs.clear();
        M.wg_groups[g].base = 0;
    }
    for (int t = 0; t < M.n; t++) {
        M.cp[t].open.clear();
        M.cp[t].groups.clear();
        M.cp[t].unfenced.clear();
    }
    for (int t = 0; t < M.n; t++) M.threads[t].acquired.clear();
    M.mbars.clear();
    M.cp_arrivals.clear();
    M.tma_copies.clear();
    M.tma_pending.clear();
    M.unpublished.clear();
    M.landed_at.clear();
    M.dyn_async = M.dyn;
    M.proxy_fenced = false;
}

// A barrier after a fence.proxy.async: the async proxy sees shared memory as it is now, except
// what cp.async's wrote whose threads have not fenced since (those bytes keep the view's).
void async_barrier() {
    if (!M.proxy_fenced) return;
    M.proxy_fenced = false;
    std::vector<std::pair<size_t, std::vector<unsigned char>>> keep;
    for (int t = 0; t < M.n; t++)
        for (unsigned char *d : M.cp[t].unfenced) {
            const size_t at = (size_t)(d - M.dyn.data());
            keep.emplace_back(at, std::vector<unsigned char>(M.dyn_async.begin() + (long)at,
                                                             M.dyn_async.begin() + (long)at + 16));
        }
    /* and what landed through mbarriers that no acquiring thread has fenced */
    std::vector<std::shared_ptr<landed_batch>> still;
    for (const auto &b : M.unpublished) {
        if (b->published) continue;
        still.push_back(b);
        for (unsigned char *d : b->dsts) {
            if (d < M.dyn.data() || d >= M.dyn.data() + M.dyn.size()) continue;
            const size_t at = (size_t)(d - M.dyn.data());
            keep.emplace_back(at, std::vector<unsigned char>(M.dyn_async.begin() + (long)at,
                                                             M.dyn_async.begin() + (long)at + 16));
        }
    }
    M.unpublished.swap(still);
    /* published batches: every warp sees them after this barrier */
    for (auto it = M.landed_at.begin(); it != M.landed_at.end();)
        it = it->second->published ? M.landed_at.erase(it) : std::next(it);
    M.dyn_async = M.dyn;
    for (const auto &k : keep) memcpy(M.dyn_async.data() + k.first, k.second.data(), 16);
}

void async_block_end() {
    for (int w = 0; w < M.n / 32; w++)
        if (!M.wgmma[w].open.empty() || !M.wgmma[w].groups.empty())
            fault("warp %d ended with wgmma's in flight (%zu uncommitted, %zu groups not waited "
                  "for)",
                  w, M.wgmma[w].open.size(), M.wgmma[w].groups.size());
    for (int w = 0; w + 4 <= M.n / 32; w += 4)
        for (int v = w + 1; v < w + 4; v++)
            if (M.wgmma[v].executed != M.wgmma[w].executed)
                fault("warps %d and %d of one warpgroup ended after %zu and %zu warpgroup "
                      "instructions",
                      w, v, M.wgmma[w].executed, M.wgmma[v].executed);
    for (int t = 0; t < M.n; t++)
        if (!M.cp[t].open.empty() || !M.cp[t].groups.empty())
            fault("thread %d ended with cp.async copies in flight (%zu uncommitted, %zu groups not "
                  "waited for)",
                  t, M.cp[t].open.size(), M.cp[t].groups.size());
    if (!M.cp_arrivals.empty())
        fault("the block ended with cp.async copies in flight through an mbarrier (%zu "
              "cp.async.mbarrier.arrive's not landed: the block's shared memory is gone)",
              M.cp_arrivals.size());
    if (!M.tma_copies.empty())
        fault("the block ended with %zu tensor-map copies (cp.async.bulk.tensor) in flight: the "
              "block's shared memory is gone",
              M.tma_copies.size());
}

namespace {

// Thread t's wait acquires batch: a fence of its own makes cp.async bytes the async proxy's,
// while tensor-map copies wrote through that proxy, so the acquisition is enough for its warp.
void mbar_acquire(int t, const std::shared_ptr<landed_batch> &batch) {
    if (batch->dsts.empty()) return;
    if (batch->async_written) {
        batch->fenced_warps |= 1u << (t / 32);
        batch->published = true; /* a barrier after this wait shows it to every warp */
    } else
        M.threads[t].acquired.push_back(batch);
}

// The barrier's phase completes once its arrivals have all come and its announced bytes have all
// landed. Returns whether that woke a thread.
bool mbar_try_complete(uint64_t *bar, mbar_state &b) {
    if (b.pending > 0 || b.tx != 0) return false;
    b.completed++;
    b.pending = b.count;
    b.last = std::move(b.landing);
    b.landing = std::make_shared<landed_batch>();
    if (!b.last->dsts.empty() && !b.last->async_written) M.unpublished.push_back(b.last);
    bool woke = false;
    for (int t = 0; t < M.n; t++) {
        thread &th = M.threads[t];
        if (th.state != AT_MBAR || th.mbar != bar || (b.completed & 1) == th.mbar_parity) continue;
        mbar_acquire(t, b.last);
        make_runnable(t);
        woke = true;
    }
    return woke;
}

// One arrival on the barrier at bar. Returns whether it completed the phase and woke a thread.
bool mbar_arrive_on(uint64_t *bar, mbar_state &b) {
    if (b.pending == 0)
        fault("an arrival on the mbarrier at %p, whose phase has all its arrivals and waits for "
              "%lld announced bytes",
              (void *)bar, (long long)b.tx);
    --b.pending;
    return mbar_try_complete(bar, b);
}

// Tensor-map copy c lands: the box row by row into its destination (values outside the tensor as
// zeros), in both proxies' views, then its bytes complete on its barrier.
void tma_land(const tma_copy &c) {
    auto it = M.mbars.find(c.bar);
    if (it == M.mbars.end())
        fault("a tensor-map copy completing on %p, which is no initialised mbarrier any more",
              (void *)c.bar);
    mbar_state &b = it->second;
    const size_t row_bytes = (size_t)c.box[0] * c.elem, bytes = row_bytes * c.box[1];
    for (uint32_t r = 0; r < c.box[1]; r++)
        for (uint32_t e = 0; e < c.box[0]; e++) {
            const int64_t x = c.x + e, y = c.y + r;
            unsigned char *d = c.dst + r * row_bytes + (size_t)e * c.elem;
            if (x >= 0 && y >= 0 && (uint64_t)x < c.dims[0] && (uint64_t)y < c.dims[1])
                memcpy(d, c.base + (size_t)y * c.stride + (size_t)x * c.elem, c.elem);
            else
                memset(d, 0, c.elem);
        }
    const size_t at = (size_t)(c.dst - M.dyn.data());
    memcpy(M.dyn_async.data() + at, c.dst, bytes);
    if (b.landing->dsts.empty()) b.landing->async_written = true;
    if (!b.landing->async_written)
        fault("the mbarrier at %p completes cp.async copies and tensor-map copies in one phase "
              "(the emulator keeps their proxies apart)",
              (void *)c.bar);
    for (size_t o = 0; o < bytes; o += 16) {
        b.landing->dsts.push_back(c.dst + o);
        M.landed_at[at + o] = b.landing;
        M.tma_pending.erase(at + o);
    }
    b.tx -= (int64_t)bytes;
    if (b.tx < 0)
        fault("tensor-map copies completed %lld bytes more on the mbarrier at %p than its phase "
              "announced (mbarrier.arrive.expect_tx, which must come before the copies)",
              (long long)-b.tx, (void *)c.bar);
    mbar_try_complete(c.bar, b);
}

} // namespace

bool async_land_arrivals() {
    if (M.cp_arrivals.empty() && M.tma_copies.empty()) return false;
    std::vector<tma_copy> copies;
    copies.swap(M.tma_copies);
    for (const tma_copy &c : copies) tma_land(c);
    std::vector<cp_arrival> now;
    now.swap(M.cp_arrivals);
    for (const cp_arrival &a : now) {
        auto it = M.mbars.find(a.bar);
        if (it == M.mbars.end())
            fault("cp.async.mbarrier.arrive on %p, which is no initialised mbarrier any more",
                  (void *)a.bar);
        if (it->second.landing->async_written)
            fault("the mbarrier at %p completes cp.async copies and tensor-map copies in one "
                  "phase (the emulator keeps their proxies apart)",
                  (void *)a.bar);
        for (const cp_op &c : a.copies) {
            memcpy(c.dst, c.src, (size_t)c.src_bytes);
            memset(c.dst + c.src_bytes, 0, (size_t)(16 - c.src_bytes));
            it->second.landing->dsts.push_back(c.dst);
            M.landed_at[(size_t)(c.dst - M.dyn.data())] = it->second.landing;
        }
        mbar_arrive_on(a.bar, it->second);
    }
    return true;
}

} // namespace impl
} // namespace loom_emu

// ---- the instructions, as kernels/cp_async.cuh and kernels/wgmma.cuh call them ------------------

void (*loom_emu::impl::block_end_hook)() = nullptr;
void (*loom_emu::impl::cp_async_hook)(const void *, const void *, int, const void *) = nullptr;

void loom_emu_cp_async16(void *dst, const void *src, int src_bytes) {
    using namespace loom_emu;
    current("cp.async");
    if (cp_async_hook) cp_async_hook(dst, src, src_bytes, __builtin_return_address(0));
    unsigned char *d = (unsigned char *)dst;
    if (M.dyn.empty() || d < M.dyn.data() || d + 16 > M.dyn.data() + M.dyn.size() ||
        ((uintptr_t)d & 15) != 0 || ((uintptr_t)src & 15) != 0)
        fault("cp.async to %p from %p: not 16 aligned bytes of dynamic shared memory and global "
              "memory",
              dst, src);
    if (src_bytes < 0 || src_bytes > 16) fault("cp.async of %d source bytes", src_bytes);
    memset(d, 0xff, 16);
    M.landed_at.erase((size_t)(d - M.dyn.data()));
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
            q.unfenced.push_back(c.dst);
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
    using namespace loom_emu;
    thread &th = current("fence.proxy.async");
    M.cp[M.cur].unfenced.clear();
    M.proxy_fenced = true;
    /* what this thread acquired through mbarrier waits: the async proxy sees it from now on */
    for (const auto &b : th.acquired) {
        b->fenced_warps |= 1u << (M.cur / 32);
        if (b->published) continue;
        b->published = true;
        for (unsigned char *d : b->dsts)
            if (d >= M.dyn.data() && d + 16 <= M.dyn.data() + M.dyn.size())
                memcpy(M.dyn_async.data() + (d - M.dyn.data()), d, 16);
    }
    th.acquired.clear();
}

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
                    bool accumulate, bool trans_b) {
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
    th.wg_tb = trans_b;
    th.f16 = f16;
    th.a = a;
    warp_arrive(th);
}

// ---- mbarriers and setmaxnreg, as kernels/mbarrier.cuh calls them
// --------------------------------

namespace {

// The barrier at bar (what: the instruction, for the report); it must be initialised.
loom_emu::mbar_state &mbar_at(uint64_t *bar, const char *what) {
    using namespace loom_emu;
    auto it = M.mbars.find(bar);
    if (it == M.mbars.end())
        fault("%s on %p, which is no initialised mbarrier (mbarrier.init first, then a barrier)",
              what, (void *)bar);
    return it->second;
}

} // namespace

void loom_emu_mbar_init(uint64_t *bar, unsigned count) {
    using namespace loom_emu;
    current("mbarrier.init");
    const unsigned char *p = (const unsigned char *)bar;
    const bool in_dyn = !M.dyn.empty() && p >= M.dyn.data() && p + 8 <= M.dyn.data() + M.dyn.size();
    const bool in_static =
        __start_kemu_shared != nullptr && p >= __start_kemu_shared && p + 8 <= __stop_kemu_shared;
    if ((!in_dyn && !in_static) || ((uintptr_t)p & 7) != 0)
        fault("mbarrier.init at %p: not 8 aligned bytes of shared memory", (void *)bar);
    if (count < 1 || count >= (1u << 20)) fault("mbarrier.init with a count of %u", count);
    auto it = M.mbars.find(bar);
    if (it != M.mbars.end()) {
        for (int t = 0; t < M.n; t++)
            if (M.threads[t].state == AT_MBAR && M.threads[t].mbar == bar)
                fault("mbarrier.init at %p while thread %d waits on it", (void *)bar, t);
        for (const cp_arrival &a : M.cp_arrivals)
            if (a.bar == bar)
                fault("mbarrier.init at %p while copies are in flight to arrive on it",
                      (void *)bar);
        for (const tma_copy &c : M.tma_copies)
            if (c.bar == bar)
                fault("mbarrier.init at %p while tensor-map copies are in flight to complete on "
                      "it",
                      (void *)bar);
    }
    mbar_state b;
    b.count = b.pending = count;
    b.landing = std::make_shared<landed_batch>();
    b.last = std::make_shared<landed_batch>();
    M.mbars[bar] = std::move(b);
    memset(bar, 0, 8); /* the object's bytes: not data any more (a read of them shows nothing) */
}

void loom_emu_mbar_arrive(uint64_t *bar) {
    using namespace loom_emu;
    current("mbarrier.arrive");
    /* the threads the arrival released run first: what they do next (a producer's copies into
       the stage, say) may come before anything the arriving thread does after its arrival (its
       wgmma's reads, say), as on the hardware */
    if (mbar_arrive_on(bar, mbar_at(bar, "mbarrier.arrive"))) yield_here();
}

void loom_emu_mbar_wait(uint64_t *bar, unsigned parity) {
    using namespace loom_emu;
    thread &th = current("mbarrier.try_wait.parity");
    mbar_state &b = mbar_at(bar, "mbarrier.try_wait.parity");
    if (parity > 1) fault("mbarrier.try_wait.parity with parity %u", parity);
    if ((b.completed & 1) != parity) { /* the phase of that parity is the last completed */
        mbar_acquire(M.cur, b.last);
        return;
    }
    th.state = AT_MBAR;
    th.mbar = bar;
    th.mbar_parity = parity;
    wait_here();
}

void loom_emu_cp_async_mbar_arrive(uint64_t *bar) {
    using namespace loom_emu;
    current("cp.async.mbarrier.arrive");
    mbar_at(bar, "cp.async.mbarrier.arrive");
    cp_queue &q = M.cp[M.cur];
    cp_arrival a;
    a.bar = bar;
    for (auto &g : q.groups) a.copies.insert(a.copies.end(), g.begin(), g.end());
    a.copies.insert(a.copies.end(), q.open.begin(), q.open.end());
    q.groups.clear();
    q.open.clear();
    M.cp_arrivals.push_back(std::move(a));
}

void loom_emu_setmaxnreg(bool inc, int n) {
    using namespace loom_emu;
    thread &th = current("setmaxnreg");
    if (n < 24 || n > 256 || n % 8 != 0) fault("setmaxnreg to %d registers", n);
    th.op = OP_WG_MAXNREG;
    th.mask = 0xffffffffu;
    th.arg = inc ? n : -n;
    warp_arrive(th);
}

// ---- the tensor memory accelerator, as kernels/tma.cuh and mbarrier.cuh call it ----------------

namespace {

// The emulator's tensor map (what loom_emu_tmap_encode_tiled writes into the driver's 128 bytes).
struct emu_tmap {
    uint64_t magic;
    const unsigned char *base;
    uint64_t dims[2], stride;
    uint32_t box[2], elem;
};
constexpr uint64_t EMU_TMAP_MAGIC = 0x6c6f6f6d746d6170ull; // "loomtmap"
static_assert(sizeof(emu_tmap) <= 128, "a tensor map is 128 bytes");

} // namespace

extern "C" int loom_emu_tmap_encode_tiled(void *map, int dtype, uint32_t rank, void *addr,
                                          const uint64_t *dims, const uint64_t *strides,
                                          const uint32_t *box, const uint32_t *elem_strides,
                                          int interleave, int swizzle, int l2, int oob) {
    /* the driver's CUtensorMapDataType: 1 uint16, 6 float16, 9 bfloat16 (2 bytes); 0 uint8 */
    const uint32_t elem = dtype == 0 ? 1 : dtype == 1 || dtype == 6 || dtype == 9 ? 2 : 0;
    if (map == nullptr || ((uintptr_t)map & 63) != 0 || elem == 0 || rank != 2 || addr == nullptr ||
        ((uintptr_t)addr & 15) != 0 || dims == nullptr || strides == nullptr || box == nullptr ||
        elem_strides == nullptr || interleave != 0 || swizzle != 0 || l2 < 0 || l2 > 3 || oob != 0)
        return 1;
    for (int i = 0; i < 2; i++)
        if (dims[i] == 0 || dims[i] > (1ull << 32) || box[i] == 0 || box[i] > 256 ||
            elem_strides[i] != 1)
            return 1;
    if (strides[0] % 16 != 0 || strides[0] >= (1ull << 40) || (box[0] * elem) % 16 != 0) return 1;
    emu_tmap m = {};
    m.magic = EMU_TMAP_MAGIC;
    m.base = (const unsigned char *)addr;
    m.dims[0] = dims[0];
    m.dims[1] = dims[1];
    m.stride = strides[0];
    m.box[0] = box[0];
    m.box[1] = box[1];
    m.elem = elem;
    memset(map, 0, 128);
    memcpy(map, &m, sizeof m);
    return 0;
}

void loom_emu_mbar_arrive_expect_tx(uint64_t *bar, unsigned bytes) {
    using namespace loom_emu;
    current("mbarrier.arrive.expect_tx");
    mbar_state &b = mbar_at(bar, "mbarrier.arrive.expect_tx");
    if (bytes >= (1u << 20)) fault("mbarrier.arrive.expect_tx of %u bytes", bytes);
    b.tx += bytes;
    if (mbar_arrive_on(bar, b)) yield_here();
}

void loom_emu_tma_load_2d(void *dst, const void *map, int x, int y, uint64_t *bar) {
    using namespace loom_emu;
    current("cp.async.bulk.tensor");
    emu_tmap m;
    memcpy(&m, map, sizeof m);
    if (m.magic != EMU_TMAP_MAGIC)
        fault("cp.async.bulk.tensor with a tensor map at %p that loom_emu_tmap_encode_tiled did "
              "not write",
              map);
    mbar_at(bar, "cp.async.bulk.tensor");
    unsigned char *d = (unsigned char *)dst;
    const size_t bytes = (size_t)m.box[0] * m.box[1] * m.elem;
    if (M.dyn.empty() || d < M.dyn.data() || d + bytes > M.dyn.data() + M.dyn.size() ||
        (d - M.dyn.data()) % 128 != 0)
        fault("cp.async.bulk.tensor to %p: not %zu bytes of dynamic shared memory from a "
              "128-byte aligned offset",
              dst, bytes);
    const size_t at = (size_t)(d - M.dyn.data());
    memset(d, 0xff, bytes);
    for (size_t o = 0; o < bytes; o += 16) {
        M.landed_at.erase(at + o);
        M.tma_pending.insert(at + o);
    }
    tma_copy c;
    c.bar = bar;
    c.dst = d;
    c.base = m.base;
    c.dims[0] = m.dims[0];
    c.dims[1] = m.dims[1];
    c.stride = m.stride;
    c.box[0] = m.box[0];
    c.box[1] = m.box[1];
    c.elem = m.elem;
    c.x = x;
    c.y = y;
    M.tma_copies.push_back(c);
}
