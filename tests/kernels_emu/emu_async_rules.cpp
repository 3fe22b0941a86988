// emu_async_rules.cpp — the emulator's own rules for Hopper's asynchronous instructions
// (kernel_emu_async.cpp), each shown to hold: one warpgroup computes D = A Bᵀ (A 64 x 16, B 32 x
// 16, BF16) with kernels/wgmma.cuh and kernels/cp_async.cuh, then D = 2 D + A Bᵀ + A Bᵀ (A from
// registers this time, and B read K-major or from an N-major copy), correct as written: its result
// must be the float64 product's.
// Then the same kernel with one rule broken, each in a child process (the emulator reports a
// broken rule and exits): the report must come, naming the rule. What the wgmma kernels of
// gemm_wgmma.cuh and attention_prefill.cu rely on the emulator to catch — a missing wgmma.fence
// or fence.proxy.async, a write to registers or shared memory a wgmma owns, warps of a
// warpgroup disagreeing, a wait left out — is thereby checked to be caught.
// Then a warp-specialised pipeline (kernels/mbarrier.cuh, as attention_prefill.cu's PF_WS form
// runs one): a producer warpgroup copies B's tiles by cp.async into a ring of two stages, each
// with a "full" and an "empty" mbarrier, and two consumer warpgroups sum A Bᵀ over the tiles
// with wgmma; correct, its result must be the float64 sum, and with a wait, fence, init or
// count wrong the emulator must say so (or the result must be off). And the same pipeline fed by
// one producer thread's tensor-map copies (kernels/tma.cuh), with the bytes its full barriers
// announce right, short or long, and its waits there or not.
#include "cp_async.cuh"
#include "mbarrier.cuh"
#include "mma.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

#include <math.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "emu_cases.h"

namespace {

enum flaw {
    NONE,                // correct: B stored by threads
    NONE_CP,             // correct: B by cp.async, waited for before the proxy fence
    NONE_N_MAJOR,        // correct: the register-A products read B from an N-major copy
    N_MAJOR_AS_K,        // that copy read as K-major: a wrong result
    NO_PROXY_FENCE,      // stores, then a barrier, no fence.proxy.async
    CP_WAIT_AFTER_FENCE, // cp.async waited for after the proxy fence (the copy is not behind it)
    NO_WG_FENCE,         // no wgmma.fence before the first wgmma
    ACC_AFTER_FENCE,     // an accumulator used before written between the wgmma.fence and the wgmma
    A_AFTER_FENCE,       // an A register used before written between the wgmma.fence and the wgmma
    ACC_IN_FLIGHT,       // an accumulator written between the wgmma and its wait
    SMEM_IN_FLIGHT,      // B's shared memory written between the wgmma and its wait
    WARPS_DISAGREE,      // warp 1 issues its wgmma with another scale-d
    UNEVEN_WARPS,        // warp 2 executes one wgmma.fence more than the others, at the end
    NO_WAIT,             // the block ends with a group not waited for
    // the pipeline (pipe_kernel)
    PIPE,                // correct
    PIPE_NO_FULL_WAIT,   // a consumer reads a stage without waiting for its copies
    PIPE_NO_FENCE,       // a consumer waits but hands the landed bytes to wgmma without a fence
    PIPE_FENCE_ONE_WG,   // only the first consumer warpgroup fences (the other relies on it)
    PIPE_NO_EMPTY,       // the producer copies into a stage without waiting for the consumers
    PIPE_EARLY_EMPTY,    // a consumer releases a stage before its wgmma has read it
    PIPE_NO_INIT,        // the empty barriers are never initialised
    PIPE_COUNT,          // full's count one more than the producers' arrivals: nobody wakes
    PIPE_LEFT_IN_FLIGHT, // the producer copies one more tile that nobody waits for
    PIPE_MAXNREG,        // one consumer warp asks for another register count
    // the pipeline fed by tensor-map copies (kernels/tma.cuh): one producer thread
    PIPE_TMA,                // correct
    PIPE_TMA_NO_FULL_WAIT,   // a consumer reads a stage without waiting for its copies
    PIPE_TMA_TX_SHORT,       // the full barrier announced half the copies' bytes
    PIPE_TMA_TX_LONG,        // ... twice their bytes: nobody wakes
    PIPE_TMA_EARLY_EMPTY,    // a consumer releases a stage before its wgmma has read it
    PIPE_TMA_LEFT_IN_FLIGHT, // the producer copies one more tile that nobody waits for
    PIPE_TMA_NO_EMPTY,       // the producer copies into a stage without waiting for the consumers
};

struct rule_case {
    flaw f;
    const char *name;
    const char *report; // a piece of the emulator's report; nullptr: must pass
    loom_emu::schedule order = loom_emu::schedule::breadth;
};

const rule_case cases[] = {
    {NONE, "correct (stores)", nullptr},
    {NONE_CP, "correct (cp.async)", nullptr},
    {NONE_N_MAJOR, "correct (B N-major)", nullptr},
    {N_MAJOR_AS_K, "N-major B read as K-major", "result off"},
    {NO_PROXY_FENCE, "no fence.proxy.async", "no fence.proxy.async of the writing thread"},
    {CP_WAIT_AFTER_FENCE, "cp.async waited for after the fence",
     "no fence.proxy.async of the writing thread"},
    {NO_WG_FENCE, "no wgmma.fence", "before any wgmma.fence"},
    {ACC_AFTER_FENCE, "accumulator written after the fence",
     "the accumulators of a wgmma.mma_async were written since"},
    {A_AFTER_FENCE, "A register written after the fence",
     "the A registers of a wgmma.mma_async were written since"},
    {ACC_IN_FLIGHT, "accumulator written in flight", "in flight were written"},
    {SMEM_IN_FLIGHT, "operand stored in flight", "changed between its issue and the wait"},
    {WARPS_DISAGREE, "warps issue other scale-d", "is not what another warp of its warpgroup"},
    {UNEVEN_WARPS, "a warp executes one fence more", "warpgroup instructions"},
    {NO_WAIT, "no wait", "ended with wgmma's in flight"},
    {PIPE, "pipeline: correct", nullptr},
    {PIPE, "pipeline: correct, warp 0 ahead", nullptr, loom_emu::schedule::depth},
    {PIPE, "pipeline: correct, the last warp ahead", nullptr, loom_emu::schedule::depth_reversed},
    {PIPE, "pipeline: correct, a random order", nullptr, loom_emu::schedule::random},
    {PIPE_NO_FULL_WAIT, "pipeline: no wait for the copies", "through an mbarrier"},
    {PIPE_NO_FENCE, "pipeline: no fence after the wait", "through an mbarrier"},
    {PIPE_FENCE_ONE_WG, "pipeline: one consumer warpgroup fences for both",
     "that no thread of the warp has fenced"},
    {PIPE_NO_EMPTY, "pipeline: no wait for the consumers", "through an mbarrier"},
    {PIPE_EARLY_EMPTY, "pipeline: a stage released in flight",
     "changed between its issue and the wait"},
    {PIPE_NO_INIT, "pipeline: a barrier not initialised", "no initialised mbarrier"},
    {PIPE_COUNT, "pipeline: a count nobody reaches", "deadlock: 384 threads wait on mbarriers"},
    {PIPE_LEFT_IN_FLIGHT, "pipeline: copies left in flight", "in flight through an mbarrier"},
    {PIPE_MAXNREG, "pipeline: warps disagree on setmaxnreg",
     "is not what another warp of its warpgroup"},
    {PIPE_TMA, "TMA pipeline: correct", nullptr},
    {PIPE_TMA, "TMA pipeline: correct, warp 0 ahead", nullptr, loom_emu::schedule::depth},
    {PIPE_TMA, "TMA pipeline: correct, the last warp ahead", nullptr,
     loom_emu::schedule::depth_reversed},
    {PIPE_TMA, "TMA pipeline: correct, a random order", nullptr, loom_emu::schedule::random},
    {PIPE_TMA_NO_FULL_WAIT, "TMA pipeline: no wait for the copies",
     "a tensor-map copy has not landed"},
    {PIPE_TMA_TX_SHORT, "TMA pipeline: half the bytes announced", "more on the mbarrier"},
    {PIPE_TMA_TX_LONG, "TMA pipeline: twice the bytes announced",
     "deadlock: 257 threads wait on mbarriers"},
    {PIPE_TMA_EARLY_EMPTY, "TMA pipeline: a stage released in flight",
     "changed between its issue and the wait"},
    {PIPE_TMA_LEFT_IN_FLIGHT, "TMA pipeline: copies left in flight", "tensor-map copies"},
    {PIPE_TMA_NO_EMPTY, "TMA pipeline: no wait for the consumers",
     "whose phase has all its arrivals"},
};

constexpr int SBO = 256, LBO = 128; // 8 rows by two core matrices across K16

// Byte offset of (row r, 8-value group kg) in a K-major tile of 16 values a row.
int tile_at(int r, int kg) {
    return (r / 8) * SBO + kg * LBO + (r % 8) * 16;
}

// Byte offset of the 8 values of N from 8 cg of row k of K in an N-major B (the PTX ISA's
// canonical MN-major layout without swizzle, ((8,1,m),(8,k)) : ((1,8,SBO),(8,LBO)) in values):
// N groups SBO_N apart, the two 8-row halves of K LBO_N apart, rows 16 bytes apart.
constexpr int SBO_N = 256, LBO_N = 128;
int n_major_at(int k, int cg) {
    return cg * SBO_N + (k / 8) * LBO_N + (k % 8) * 16;
}

// The kernel: 128 threads, 4 KB of dynamic shared memory (A's tile, B's, B's N-major copy).
// out: D (64 x 32) after both products, row-major.
void rules_kernel(flaw f, const uint16_t *a_g, const uint16_t *b_g, float *out) {
    LOOM_K_DYN_SMEM(sm);
    uint8_t *as = sm, *bs = sm + 64 * 16 * 2, *bn = bs + 32 * 16 * 2;
    const int t = (int)threadIdx.x, lane = t % 32, warp = t / 32;
    const bool by_cp = f == NONE_CP || f == CP_WAIT_AFTER_FENCE;
    /* A: a thread per row half; B: threads 0..63 */
    *(uint4 *)(as + tile_at(t / 2, t % 2)) = *(const uint4 *)(a_g + (t / 2) * 16 + 8 * (t % 2));
    if (t < 64) {
        uint8_t *dst = bs + tile_at(t / 2, t % 2);
        const uint16_t *src = b_g + (t / 2) * 16 + 8 * (t % 2);
        if (by_cp)
            loom_cp_async16(dst, src, 16);
        else
            *(uint4 *)dst = *(const uint4 *)src;
    }
    if (t < 64) { /* B N-major: row k of K, values 8 cg .. 8 cg + 7 of N */
        const int k = t / 4, cg = t % 4;
        uint16_t h[8];
        for (int e = 0; e < 8; e++) h[e] = b_g[(8 * cg + e) * 16 + k];
        memcpy(bn + n_major_at(k, cg), h, 16);
    }
    if (by_cp) {
        loom_cp_async_commit();
        if (f != CP_WAIT_AFTER_FENCE) loom_cp_async_wait<0>();
    }
    if (f != NO_PROXY_FENCE) loom_wg_fence_proxy_async();
    if (f == CP_WAIT_AFTER_FENCE) loom_cp_async_wait<0>();
    __syncthreads();

    float d[16];
    for (int j = 0; j < 16; j++) d[j] = 0.0f;
    if (f != NO_WG_FENCE) loom_wg_fence();
    const int scale_d = f == WARPS_DISAGREE && warp == 1 ? 1 : 0;
    loom_wg_ss<LOOM_MMA16_BF16, 32>(d, loom_wg_desc(as, LBO, SBO), loom_wg_desc(bs, LBO, SBO),
                                    scale_d);
    loom_wg_commit();
    if (f == ACC_IN_FLIGHT) d[0] = 2.0f;
    if (f == SMEM_IN_FLIGHT && t == 0) bs[0] ^= 0x40;
    if (f == NO_WAIT) return;
    loom_wg_wait<0>();

    /* D = 2 D + A Bᵀ + A Bᵀ, A from registers (warp w's rows 16 w .., mma.sync's A fragment),
     * twice: the rules on registers apply to those a warp's wgmma's have used before */
    for (int j = 0; j < 16; j++) d[j] *= 2.0f;
    for (int it = 0; it < 2; it++) {
        uint32_t a[4];
        for (int r = 0; r < 4; r++) {
            const int row = 16 * warp + lane / 4 + 8 * (r % 2), col = 2 * (lane % 4) + 8 * (r / 2);
            a[r] = (uint32_t)a_g[row * 16 + col] | (uint32_t)a_g[row * 16 + col + 1] << 16;
        }
        loom_wg_fence();
        if (f == ACC_AFTER_FENCE) d[3] += 1.0f;
        if (f == A_AFTER_FENCE && it == 1) a[1] ^= 0x00010000u;
        if (f == NONE_N_MAJOR)
            loom_wg_rs<LOOM_MMA16_BF16, 32, true>(d, a, loom_wg_desc(bn, LBO_N, SBO_N), 1);
        else if (f == N_MAJOR_AS_K)
            loom_wg_rs<LOOM_MMA16_BF16, 32>(d, a, loom_wg_desc(bn, LBO_N, SBO_N), 1);
        else
            loom_wg_rs<LOOM_MMA16_BF16, 32>(d, a, loom_wg_desc(bs, LBO, SBO), 1);
        loom_wg_commit();
        loom_wg_wait<0>();
    }
    if (f == UNEVEN_WARPS && warp == 2) loom_wg_fence();
    for (int j = 0; j < 16; j++) {
        const int row = 16 * warp + lane / 4 + 8 * ((j / 2) % 2);
        const int col = 8 * (j / 4) + 2 * (lane % 4) + j % 2;
        out[row * 32 + col] = d[j];
    }
}

// The pipeline: 384 threads, A (64 x 16) in shared memory, B's PIPE_TILES tiles (32 x 16 each,
// b_g + 512 t) through a ring of two stages. Warpgroup 0 produces (threads 0 .. 63 copy a
// stage's 64 pieces, all 128 arrive on its full barrier through cp.async.mbarrier.arrive),
// warpgroups 1 and 2 consume (each D += A B_tᵀ for every tile, then an arrival on the stage's
// empty barrier). out: warpgroup 1's D then warpgroup 2's, 64 x 32 each, row-major.
constexpr int PIPE_TILES = 6, PIPE_STAGES = 2;

// The TMA forms (f >= PIPE_TMA): thread 0 alone produces, each tile by two tensor-map copies of
// B (map: 16 values by 32 PIPE_TILES rows, boxes of 8 values by 32 rows), one for each 8 values
// of K: the stage holds the 32 rows' first 8 values, then their next 8 (LBO 512, SBO 128).
constexpr int LBO_TMA = 512, SBO_TMA = 128;

void pipe_kernel(flaw f, const uint16_t *a_g, const uint16_t *b_g, const loom_k_tmap *b_map,
                 float *out) {
    LOOM_K_DYN_SMEM(sm);
    uint64_t *full = (uint64_t *)sm, *empty = full + PIPE_STAGES;
    uint8_t *as = sm + 128, *stage = as + 64 * 16 * 2; /* stages of 32 * 16 * 2 bytes */
    const int t = (int)threadIdx.x, wg = t / 128, lane = t % 32, warp = t / 32;
    const bool tma = f >= PIPE_TMA;
    if (t == 0)
        for (int s = 0; s < PIPE_STAGES; s++) {
            loom_mbar_init(full + s, tma ? 1 : f == PIPE_COUNT ? 129 : 128);
            if (f != PIPE_NO_INIT) loom_mbar_init(empty + s, 256);
        }
    if (t < 128) *(uint4 *)(as + tile_at(t / 2, t % 2)) = *(const uint4 *)(a_g + t * 8);
    loom_wg_fence_proxy_async();
    __syncthreads();
    if (wg == 0 && tma) {
        loom_wg_maxnreg_dec<40>();
        if (t != 0) return;
        const int tiles = PIPE_TILES + (f == PIPE_TMA_LEFT_IN_FLIGHT ? 1 : 0);
        const unsigned bytes = f == PIPE_TMA_TX_SHORT ? 512 : f == PIPE_TMA_TX_LONG ? 2048 : 1024;
        for (int i = 0; i < tiles; i++) {
            const int s = i % PIPE_STAGES, r = i / PIPE_STAGES;
            if (f != PIPE_TMA_NO_EMPTY) loom_mbar_wait(empty + s, (r & 1) ^ 1);
            loom_mbar_arrive_expect_tx(full + s, bytes);
            for (int kg = 0; kg < 2; kg++)
                loom_tma_load_2d(stage + s * 1024 + kg * LBO_TMA, b_map, 8 * kg,
                                 32 * (i % PIPE_TILES), full + s);
        }
        if (f == PIPE_TMA_LEFT_IN_FLIGHT) return;
        for (int i = tiles; i < tiles + PIPE_STAGES; i++)
            loom_mbar_wait(empty + i % PIPE_STAGES, ((i / PIPE_STAGES) & 1) ^ 1);
        return;
    }
    if (wg == 0) {
        loom_wg_maxnreg_dec<40>();
        const int tiles = PIPE_TILES + (f == PIPE_LEFT_IN_FLIGHT ? 1 : 0);
        for (int i = 0; i < tiles; i++) {
            const int s = i % PIPE_STAGES, r = i / PIPE_STAGES;
            if (f != PIPE_NO_EMPTY) loom_mbar_wait(empty + s, (r & 1) ^ 1);
            if (t < 64)
                loom_cp_async16(stage + s * 1024 + tile_at(t / 2, t % 2),
                                b_g + (size_t)(i % PIPE_TILES) * 512 + t * 8, 16);
            loom_cp_async_mbar_arrive(full + s);
        }
        if (f == PIPE_LEFT_IN_FLIGHT) return;
        /* the tail: every stage released, so that no copy outlives the block */
        for (int i = tiles; i < tiles + PIPE_STAGES; i++)
            loom_mbar_wait(empty + i % PIPE_STAGES, ((i / PIPE_STAGES) & 1) ^ 1);
        return;
    }
    if (f == PIPE_MAXNREG && warp == 5)
        loom_wg_maxnreg_inc<224>();
    else
        loom_wg_maxnreg_inc<232>();
    float d[16];
    for (int j = 0; j < 16; j++) d[j] = 0.0f;
    loom_wg_fence();
    for (int i = 0; i < PIPE_TILES; i++) {
        const int s = i % PIPE_STAGES, r = i / PIPE_STAGES;
        if (f != PIPE_NO_FULL_WAIT && f != PIPE_TMA_NO_FULL_WAIT) loom_mbar_wait(full + s, r & 1);
        /* the TMA's bytes are the async proxy's already: no fence */
        if (!tma && f != PIPE_NO_FENCE && !(f == PIPE_FENCE_ONE_WG && wg == 2))
            loom_wg_fence_proxy_async();
        loom_wg_ss<LOOM_MMA16_BF16, 32>(d, loom_wg_desc(as, LBO, SBO),
                                        tma ? loom_wg_desc(stage + s * 1024, LBO_TMA, SBO_TMA)
                                            : loom_wg_desc(stage + s * 1024, LBO, SBO),
                                        1);
        loom_wg_commit();
        const bool early = f == PIPE_EARLY_EMPTY || f == PIPE_TMA_EARLY_EMPTY;
        if (early) loom_mbar_arrive(empty + s);
        loom_wg_wait<0>();
        if (!early) loom_mbar_arrive(empty + s);
    }
    for (int j = 0; j < 16; j++) {
        const int row = 16 * (warp % 4) + lane / 4 + 8 * ((j / 2) % 2);
        const int col = 8 * (j / 4) + 2 * (lane % 4) + j % 2;
        out[(wg - 1) * 64 * 32 + row * 32 + col] = d[j];
    }
}

float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

// Runs case c in a child process; returns what went wrong ("" if nothing).
std::string run_case(const rule_case &c, const std::vector<uint16_t> &a,
                     const std::vector<uint16_t> &b) {
    int fds[2];
    if (pipe(fds) != 0) return "pipe failed";
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) return "fork failed";
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        const bool pipe = c.f >= PIPE;
        std::vector<float> out((pipe ? 2 : 1) * 64 * 32, NAN);
        loom_emu::launch_options opt;
        opt.order = c.order;
        /* B as a tensor of PIPE_TILES * 32 rows of 16 BF16 values, boxes of 8 by 32 */
        loom_k_tmap b_map;
        const uint64_t dims[2] = {16, 32 * PIPE_TILES}, strides[1] = {32};
        const uint32_t box[2] = {8, 32}, ones[2] = {1, 1};
        if (loom_emu_tmap_encode_tiled(&b_map, 9, 2, (void *)b.data(), dims, strides, box, ones, 0,
                                       0, 2, 0) != 0) {
            fprintf(stderr, "the tensor map was refused\n");
            _exit(4);
        }
        if (pipe)
            loom_emu::launch(
                dim3(1), dim3(384), 128 + 2048 + PIPE_STAGES * 1024,
                [&] { pipe_kernel(c.f, a.data(), b.data(), &b_map, out.data()); }, opt);
        else
            loom_emu::launch(
                dim3(1), dim3(128), 4096,
                [&] { rules_kernel(c.f, a.data(), b.data(), out.data()); }, opt);
        /* rules_kernel: D = 4 A Bᵀ, B the first tile; pipe_kernel: D = sum of A B_tᵀ over the
           tiles, in each consumer's half; each product exact in double, each step rounded to
           float */
        double worst = 0;
        for (int h = 0; h < (pipe ? 2 : 1); h++)
            for (int r = 0; r < 64; r++)
                for (int n = 0; n < 32; n++) {
                    double s = 0, mag = 0; /* mag: the sum's terms' magnitudes */
                    for (int tile = 0; tile < (pipe ? PIPE_TILES : 1); tile++)
                        for (int k = 0; k < 16; k++) {
                            const double p = (double)bf16_value(a[r * 16 + k]) *
                                             bf16_value(b[(size_t)tile * 512 + n * 16 + k]);
                            s += p;
                            mag += fabs(p);
                        }
                    if (!pipe) s *= 4, mag *= 4;
                    const double e = fabs(out[(size_t)h * 2048 + r * 32 + n] - s) / (mag + 1e-30);
                    if (!(e <= worst)) worst = e;
                }
        if (!(worst < 1e-6)) {
            fprintf(stderr, "result off by %.3g of the product\n", worst);
            _exit(3);
        }
        _exit(0);
    }
    close(fds[1]);
    std::string report;
    char buf[512];
    ssize_t got;
    while ((got = read(fds[0], buf, sizeof buf)) > 0) report.append(buf, (size_t)got);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    const bool passed = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (c.report == nullptr) return passed ? "" : "failed: " + report;
    if (passed) return "passed: the broken rule went unreported";
    if (report.find(c.report) == std::string::npos) return "reported something else: " + report;
    return "";
}

} // namespace

namespace emu_async_rules {

int run_all(bool verbose) {
    std::vector<uint16_t> a(64 * 16), b((size_t)PIPE_TILES * 32 * 16);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    auto next = [&s] {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        return s;
    };
    /* BF16 values of 1..2 in 1/128 steps times a sign and a power of two in 2^-3..2^3 */
    for (auto *v : {&a, &b})
        for (uint16_t &h : *v) {
            const uint64_t r = next();
            h = (uint16_t)((r & 1) << 15 | (uint16_t)(124 + (r >> 1) % 7) << 7 | (r >> 8) % 128);
        }
    int bad = 0;
    for (const rule_case &c : cases) {
        const std::string problem = run_case(c, a, b);
        if (!problem.empty()) {
            printf("FAIL async rules: %s: %s\n", c.name, problem.c_str());
            bad++;
        } else if (verbose) {
            printf("  async rules: %-40s %s\n", c.name, c.report ? "reported" : "passes");
        }
    }
    return bad;
}

} // namespace emu_async_rules
