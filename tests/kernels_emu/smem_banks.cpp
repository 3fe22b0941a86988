// smem_banks.cpp — the emulated kernels' memory accesses by source line, what Nsight Compute
// says of them on a GPU, from the emulator on any machine: shared-memory bank conflicts
// (wavefronts a request) and global-memory coalescing (32-byte sectors a request).
//
// Linked into test_kernels_emu when it is built with LOOM_EMU_SMEM_BANKS (clang, whose
// -fsanitize-coverage=trace-loads,trace-stores calls the __sanitizer_cov_load / store hooks below
// before every load and store of the kernel units), and switched on by LOOM_EMU_BANKS=<file>: the
// report is written there when the program exits.
//
// The model: shared memory is 32 banks of 4-byte words, 128 bytes a wavefront. A warp's request
// (one instruction, its active lanes) is served in phases, as NVIDIA describes it: the whole
// warp for accesses of up to 4 bytes a lane, each half warp (lanes 0-15, 16-31) for 8 bytes,
// each quarter warp for 16; a phase takes as many wavefronts as the most distinct words any one
// bank holds among the words its lanes touch (the same word read by several lanes is one: a
// broadcast), and needs at least ceil(its distinct words / 32). The excess over that least is the
// conflicts' cost. Conflicts between phases cost nothing; a word read by two phases is read
// twice. Global
// memory (kind_of: the heap, where the tests keep the device's buffers): a request costs the
// distinct 32-byte sectors it touches, at least its distinct bytes / 32; caches are not modelled
// (a sector read twice by two requests counts twice, as it does in "sectors per request").
//
// Which accesses are one instruction: the lanes of a warp pass the same collectives and barriers
// (thread::epoch counts them); between two, the n-th execution of an access (its code address)
// by each lane is taken as one instruction, so that lanes which skip some code (a branch, a
// shorter loop) still pair where they meet. Lanes that execute the same access in different
// iterations of a divergent path would be paired wrongly; the kernels here have none such.
//
// The host compiler is not nvcc: it splits a 16-byte uint4 store into two 8-byte ones, loads only
// the fields of a float4 that are used, and where nvcc makes one ld.shared.v4 of four adjacent
// floats it makes four loads. A lane's access that continues its previous one (the next bytes,
// the same direction, within one aligned 16-byte block) is merged into it, as the device's vector
// access would be one; a vector load of which only some fields are used stays split, and its
// conflicts are overstated. The units are built without vectorization (-fno-vectorize
// -fno-slp-vectorize), so that the host's widths come from the source and the merging alone.
// Where a line's width matters, nvcc's PTX says what the device does (ld.shared.v4 and so on).
// Loads the host repeats in a loop count each time, as they do where nvcc keeps them in the loop
// (it does for the attention kernels' shared Q: their registers are taken).
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_emu_machine.h"
#include "smem_banks.h"

namespace {

using namespace loom_emu::impl;

struct access {
    uintptr_t addr, pc;
    uint32_t epoch, nth; // nth: the execution of this access (pc) by this thread in the epoch
    uint16_t thread;
    uint8_t size;
    bool store, global;
};

struct line_stats {
    uint64_t requests = 0, cost = 0, least = 0, lanes = 0; // cost: wavefronts or sectors
    unsigned max_size = 0;
    bool store = false, global = false;
};

struct tracer {
    bool on = false, report_on = false;
    bool counting = false; // banks_begin .. banks_end: requests go to totals, not the report
    loom_emu::bank_totals totals = {};
    std::string out;
    std::vector<access> block; // this block's accesses, in the order they ran
    uint32_t epoch[MAX_THREADS];
    long last[MAX_THREADS]; // index in block of the thread's last access
    // by code address and kind (a cp.async's global load and shared store share an address)
    std::map<std::tuple<uintptr_t, bool, bool>, line_stats> by_pc;
    uintptr_t host_stack_lo = 0, host_stack_hi = 0; // the launching thread's (kernel arguments)
};

tracer T;

inline bool in_smem(uintptr_t a) {
    const uintptr_t s0 = (uintptr_t)__start_kemu_shared, s1 = (uintptr_t)__stop_kemu_shared;
    if (a >= s0 && a < s1) return true;
    const uintptr_t d0 = (uintptr_t)M.dyn.data();
    return a >= d0 && a < d0 + M.dyn.size();
}

extern "C" char __executable_start[], end[]; // the program's code and static data (the linker's)

// What an address is to the running thread: shared memory (1), global memory (2: the heap, where
// the tests keep the device's buffers) or neither (0: its own stack, which the device keeps in
// registers; the launching thread's stack, where the kernel's arguments are, which the device
// reads from its constant bank; the program's static data).
inline int kind_of(uintptr_t a) {
    if (in_smem(a)) return 1;
    const uintptr_t st = (uintptr_t)M.threads[M.cur].stack;
    if (a >= st && a < st + STACK_BYTES) return 0;
    if (a >= T.host_stack_lo && a < T.host_stack_hi) return 0;
    if (a >= (uintptr_t)__executable_start && a < (uintptr_t)end) return 0;
    return 2;
}

inline void note(const void *p, unsigned size, bool store, const void *pc) {
    if (!T.on || M.cur < 0) return;
    const uintptr_t a = (uintptr_t)p;
    const int kind = kind_of(a);
    if (kind == 0) return;
    const int t = M.cur;
    const uint32_t e = M.threads[t].epoch;
    if (T.epoch[t] != e) {
        T.epoch[t] = e;
        T.last[t] = -1;
    }
    if (T.last[t] >= 0) {
        access &prev = T.block[(size_t)T.last[t]];
        if (prev.store == store && prev.global == (kind == 2) && prev.addr + prev.size == a &&
            prev.addr / 16 == (a + size - 1) / 16) {
            prev.size = (uint8_t)(prev.size + size);
            return;
        }
    }
    T.last[t] = (long)T.block.size();
    T.block.push_back(access{a, (uintptr_t)pc, e, 0, (uint16_t)t, (uint8_t)size, store, kind == 2});
}

// One warp's request: the accesses of its lanes at [lo, hi) of order. Shared memory: its
// wavefronts (phase by phase, the most distinct words in one bank) against the least (its words
// / 32, phase by phase). Global memory: the 32-byte sectors it touches against the least (the
// bytes it touches / 32, rounded up), which is how coalescing is counted (Nsight Compute's
// sectors per request).
void request(const std::vector<size_t> &order, size_t lo, size_t hi) {
    const access &first = T.block[order[lo]];
    line_stats counted,
        &ls = T.counting ? counted : T.by_pc[std::make_tuple(first.pc, first.store, first.global)];
    ls.store = first.store;
    ls.global = first.global;
    uint64_t cost = 0, least = 0;
    if (first.global) {
        std::vector<uintptr_t> bytes, sectors;
        for (size_t i = lo; i < hi; i++) {
            const access &x = T.block[order[i]];
            ls.max_size = std::max(ls.max_size, (unsigned)x.size);
            for (uintptr_t b = x.addr; b < x.addr + x.size; b++) bytes.push_back(b);
        }
        std::sort(bytes.begin(), bytes.end());
        bytes.erase(std::unique(bytes.begin(), bytes.end()), bytes.end());
        for (uintptr_t b : bytes)
            if (sectors.empty() || sectors.back() != b / 32) sectors.push_back(b / 32);
        cost = sectors.size();
        least = (bytes.size() + 31) / 32;
    } else {
        /* the phases: the whole warp for accesses of 4 bytes or less, half warps for 8, quarter
           warps for 16 (a phase moves at most 128 bytes) */
        unsigned widest = 0;
        for (size_t i = lo; i < hi; i++)
            widest = std::max(widest, (unsigned)T.block[order[i]].size);
        ls.max_size = std::max(ls.max_size, widest);
        const unsigned lanes_per_phase = widest > 8 ? 8 : widest > 4 ? 16 : 32;
        for (unsigned ph = 0; ph < 32 / lanes_per_phase; ph++) {
            std::vector<uintptr_t> words;
            for (size_t i = lo; i < hi; i++) {
                const access &x = T.block[order[i]];
                if (x.thread % 32 / lanes_per_phase != ph) continue;
                for (uintptr_t w = x.addr / 4; w <= (x.addr + x.size - 1) / 4; w++)
                    words.push_back(w);
            }
            if (words.empty()) continue;
            std::sort(words.begin(), words.end());
            words.erase(std::unique(words.begin(), words.end()), words.end());
            unsigned per_bank[32] = {0}, most = 0;
            for (uintptr_t w : words) most = std::max(most, ++per_bank[w % 32]);
            cost += most;
            least += (words.size() + 31) / 32;
        }
    }
    ls.requests++;
    ls.lanes += hi - lo;
    ls.cost += cost;
    ls.least += least;
    if (T.counting) {
        if (first.global) {
            T.totals.g_requests++;
            T.totals.sectors += cost;
            T.totals.sectors_least += least;
        } else {
            T.totals.requests++;
            T.totals.lanes += hi - lo;
            T.totals.wavefronts += cost;
            T.totals.least += least;
        }
    }
}

// The block's accesses into requests: numbered by execution of their code address and kind
// (load or store, shared or global: a cp.async is a global load and a shared store at one
// address, and a zero fill has no load) within each thread's epoch, then grouped by warp, epoch,
// address, kind and number.
void block_end() {
    std::vector<access> &b = T.block;
    std::vector<size_t> order(b.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    auto what = [&](size_t i) { return std::make_tuple(b[i].pc, b[i].store, b[i].global); };
    std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) {
        if (b[i].thread != b[j].thread) return b[i].thread < b[j].thread;
        if (b[i].epoch != b[j].epoch) return b[i].epoch < b[j].epoch;
        return what(i) < what(j);
    });
    for (size_t k = 0; k < order.size(); k++) {
        const access &x = b[order[k]], *prev = k ? &b[order[k - 1]] : nullptr;
        const bool same = prev && prev->thread == x.thread && prev->epoch == x.epoch &&
                          what(order[k - 1]) == what(order[k]);
        b[order[k]].nth = same ? prev->nth + 1 : 0;
    }
    auto key = [&](size_t i) {
        return std::make_tuple(b[i].thread / 32, b[i].epoch, b[i].pc, b[i].store, b[i].global,
                               b[i].nth);
    };
    std::sort(order.begin(), order.end(), [&](size_t i, size_t j) { return key(i) < key(j); });
    for (size_t lo = 0; lo < order.size();) {
        size_t hi = lo + 1;
        while (hi < order.size() && key(order[hi]) == key(order[lo])) hi++;
        request(order, lo, hi);
        lo = hi;
    }
    b.clear();
    for (int t = 0; t < MAX_THREADS; t++) T.epoch[t] = UINT32_MAX;
}

// A code address's source: the innermost line and function, and the outermost function (the
// kernel, where the rest is inlined), by addr2line over this executable.
struct where {
    std::string line, fn, kernel;
};

std::string trim(std::string s, size_t n) {
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    const size_t disc = s.find(" (discriminator");
    if (disc != std::string::npos) s.erase(disc);
    const size_t slash = s.rfind('/');
    if (s.find(':') != std::string::npos && slash != std::string::npos) s = s.substr(slash + 1);
    if (s.size() > n) s = s.substr(0, n - 3) + "...";
    return s;
}

std::map<uintptr_t, where> symbolize(const std::vector<uintptr_t> &pcs) {
    std::map<uintptr_t, where> r;
    std::map<uintptr_t, uintptr_t> of_offset; // offset in the executable -> pc
    char in[] = "/tmp/loom-banks-XXXXXX";
    const int fd = mkstemp(in);
    if (fd < 0) return r;
    FILE *q = fdopen(fd, "w");
    for (uintptr_t pc : pcs) {
        Dl_info info;
        if (!dladdr((void *)pc, &info) || !info.dli_fbase) continue;
        /* the return address of the hook's call: the call itself is the byte before */
        const uintptr_t off = pc - (uintptr_t)info.dli_fbase - 1;
        of_offset[off] = pc;
        fprintf(q, "0x%lx\n", (unsigned long)off);
    }
    fclose(q);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "addr2line -a -C -f -i -e /proc/%d/exe < %s", (int)getpid(), in);
    FILE *p = popen(cmd, "r");
    if (p) {
        std::vector<std::string> frames; // function, file:line, ... innermost first
        uintptr_t at = 0;
        bool have = false;
        auto flush = [&]() {
            if (have && frames.size() >= 2 && of_offset.count(at)) {
                /* the kernel: the outermost frame named *_kernel (kernels are inlined into the
                   launch's lambda), else the outermost */
                std::string kernel = frames[frames.size() - 2];
                for (size_t i = 0; i + 1 < frames.size(); i += 2) {
                    const std::string name = frames[i].substr(0, frames[i].find('('));
                    if (name.find("_kernel") != std::string::npos) kernel = frames[i];
                }
                r[of_offset[at]] =
                    where{trim(frames[1], 60), trim(frames[0], 70), trim(kernel, 70)};
            }
            frames.clear();
        };
        char buf[8192];
        while (fgets(buf, sizeof buf, p)) {
            if (buf[0] == '0' && buf[1] == 'x') {
                flush();
                at = (uintptr_t)strtoull(buf, nullptr, 16);
                have = true;
            } else {
                frames.push_back(buf);
            }
        }
        flush();
        pclose(p);
    }
    unlink(in);
    return r;
}

void report() {
    if (!T.report_on) return;
    T.on = T.report_on = false;
    FILE *f = fopen(T.out.c_str(), "w");
    if (!f) {
        fprintf(stderr, "smem_banks: cannot write %s\n", T.out.c_str());
        return;
    }
    std::vector<uintptr_t> pcs;
    for (const auto &kv : T.by_pc)
        if (pcs.empty() || pcs.back() != std::get<0>(kv.first))
            pcs.push_back(std::get<0>(kv.first));
    std::map<uintptr_t, where> src = symbolize(pcs);
    for (int global = 0; global < 2; global++) {
        const char *cost = global ? "Sectors" : "Wavefronts";
        fprintf(f, global ? "\n## Global memory: 32-byte sectors a request\n\n"
                          : "## Shared memory: wavefronts a request\n\n");
        // by kernel, then the lines with an excess, most first
        std::map<std::string, line_stats> by_kernel;
        for (const auto &kv : T.by_pc) {
            if (kv.second.global != (global == 1)) continue;
            line_stats &k = by_kernel[src[std::get<0>(kv.first)].kernel];
            k.requests += kv.second.requests;
            k.cost += kv.second.cost;
            k.least += kv.second.least;
            k.lanes += kv.second.lanes;
        }
        fprintf(f, "| Kernel | Requests | %s | Least | Excess | Lanes a request |\n", cost);
        fprintf(f, "|---|---:|---:|---:|---:|---:|\n");
        for (const auto &kv : by_kernel)
            fprintf(f, "| `%s` | %llu | %llu | %llu | %.2fx | %.1f |\n", kv.first.c_str(),
                    (unsigned long long)kv.second.requests, (unsigned long long)kv.second.cost,
                    (unsigned long long)kv.second.least,
                    kv.second.least ? (double)kv.second.cost / (double)kv.second.least : 0.0,
                    (double)kv.second.lanes / (double)kv.second.requests);
        // the lines: a line's accesses (an unrolled loop has one pc per copy) added up
        std::map<std::string, line_stats> by_line;
        for (const auto &kv : T.by_pc) {
            const line_stats &l = kv.second;
            if (l.global != (global == 1)) continue;
            const where &w = src[std::get<0>(kv.first)];
            char key[512];
            snprintf(key, sizeof key, "%s | `%s` | `%s` | %s %u B", w.line.c_str(), w.fn.c_str(),
                     w.kernel.c_str(), l.store ? "store" : "load", l.max_size);
            line_stats &t = by_line[key];
            t.requests += l.requests;
            t.cost += l.cost;
            t.least += l.least;
            t.lanes += l.lanes;
        }
        std::vector<std::pair<std::string, line_stats>> lines(by_line.begin(), by_line.end());
        std::sort(lines.begin(), lines.end(), [](const auto &a, const auto &b) {
            return a.second.cost - a.second.least > b.second.cost - b.second.least;
        });
        fprintf(f,
                "\n| Line | Function | Kernel | Access | Requests | %s per request | Least | "
                "Lanes |\n",
                cost);
        fprintf(f, "|---|---|---|---|---:|---:|---:|---:|\n");
        int shown = 0;
        for (const auto &kv : lines) {
            const line_stats &l = kv.second;
            if (l.cost == l.least) continue;
            if (shown++ == 80) break; /* the 80 with the most excess */
            fprintf(f, "| %s | %llu | %.2f | %.2f | %.1f |\n", kv.first.c_str(),
                    (unsigned long long)l.requests, (double)l.cost / (double)l.requests,
                    (double)l.least / (double)l.requests, (double)l.lanes / (double)l.requests);
        }
    }
    fclose(f);
}

// A cp.async (kernel_emu_async.cpp calls this as it issues one): its read of global memory
// (src_bytes of it; none for a zero fill) and its 16-byte write of shared memory.
void note_cp_async(const void *dst, const void *src, int src_bytes, const void *pc) {
    if (src_bytes > 0) note(src, (unsigned)src_bytes, false, pc);
    note(dst, 16, true, pc);
}

// The calling thread's stack (the kernels' arguments, captured by the launch's lambda).
void find_host_stack() {
    pthread_attr_t at;
    void *lo = nullptr;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &at) == 0) {
        pthread_attr_getstack(&at, &lo, &size);
        pthread_attr_destroy(&at);
    }
    T.host_stack_lo = (uintptr_t)lo;
    T.host_stack_hi = (uintptr_t)lo + size;
}

// Switched on by the environment when the program starts (after T, which is defined above in
// this unit, is constructed).
struct starter {
    starter() {
        const char *out = getenv("LOOM_EMU_BANKS");
        if (!out || !*out) return;
        T.out = out;
        T.on = T.report_on = true;
        block_end_hook = block_end;
        cp_async_hook = note_cp_async;
        find_host_stack();
        for (int t = 0; t < MAX_THREADS; t++) T.epoch[t] = UINT32_MAX;
        atexit(report);
    }
} start;

} // namespace

namespace loom_emu {

void banks_begin() {
    T.on = T.counting = true;
    block_end_hook = block_end;
    cp_async_hook = note_cp_async;
    find_host_stack();
    T.totals = bank_totals{};
    T.block.clear();
    for (int t = 0; t < MAX_THREADS; t++) T.epoch[t] = UINT32_MAX;
}

bank_totals banks_end() {
    T.counting = false;
    T.on = T.report_on;
    return T.totals;
}

} // namespace loom_emu

#define LOOM_EMU_HOOK(n, type)                                                                     \
    extern "C" void __sanitizer_cov_load##n(type *p) {                                             \
        note(p, n, false, __builtin_return_address(0));                                            \
    }                                                                                              \
    extern "C" void __sanitizer_cov_store##n(type *p) {                                            \
        note(p, n, true, __builtin_return_address(0));                                             \
    }
LOOM_EMU_HOOK(1, uint8_t)
LOOM_EMU_HOOK(2, uint16_t)
LOOM_EMU_HOOK(4, uint32_t)
LOOM_EMU_HOOK(8, uint64_t)
LOOM_EMU_HOOK(16, __int128)
