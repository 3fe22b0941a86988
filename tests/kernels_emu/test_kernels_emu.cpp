// test_kernels_emu.cpp — loom's CUDA kernels run without a GPU: each kernel is compiled by the
// host's C++ compiler from its own file in kernels/ (LOOM_K_EMULATE: common.cuh takes
// kernel_emu.h in place of the CUDA headers) and executed on the SIMT emulator of
// kernel_emu.cpp, then checked against a reference: attention_prefill.cu against float64 paged
// attention (and the planted off-by-one of LOOM_K_PLANTED_BUG must be caught), logits_summary.cu
// against the host's summarizer, gemm.cu against a float64 product, and the other families
// against the CPU backend's op (emu_<family>.cpp; gemv.cu against a float64 sum over the CPU's
// decoded weights, blaslt_gemm.cu's kernels against tensor/fp8.h and a BF16 rounding),
// attention.cu's planted off-by-one caught too. The emulator's schedules vary from case to case, so
// a missing barrier shows as a wrong result. `test_kernels_emu [PART ...] [-v]` runs the parts
// named (all by default): prefill, summary, gemm, gemv, get_rows, elementwise, rope, kv_store,
// attention, kv_merge, blaslt_gemm, async_rules (the emulator's own checks of wgmma and cp.async
// rules, each shown to catch its break), smem_banks (smem_banks.cpp's model of shared-memory bank
// conflicts and global-memory sectors on accesses of known cost).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <vector>

#include "emu_cases.h"
#include "loom_kernels.h"

namespace {

using emu_test::prefill_case;
using loom_emu::schedule;

const char *type_name(uint32_t t) {
    switch (t) {
    case LOOM_K_F32:
        return "f32";
    case LOOM_K_F16:
        return "f16";
    case LOOM_K_BF16:
        return "bf16";
    case LOOM_K_FP8_E4M3:
        return "e4m3";
    default:
        return "e5m2";
    }
}

const char *const order_names[] = {"breadth", "depth", "depth-rev", "random"};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- attention_prefill.cu -----------------------------------------------------------------------

struct shape {
    int bs, hd, nkv, G, window;
    float cap;
    uint32_t type;
};

prefill_case make_case(const shape &s, std::vector<int> cached, std::vector<int> nnew,
                       schedule order) {
    prefill_case c;
    c.bs = s.bs, c.hd = s.hd, c.nkv = s.nkv, c.G = s.G, c.window = s.window, c.cap = s.cap;
    c.type = s.type, c.cached = cached, c.nnew = nnew, c.order = order;
    return c;
}

prefill_case with(prefill_case c, bool all, int n_sms, std::vector<int> ids = {}) {
    c.all = all;
    c.n_sms = n_sms;
    c.ids = ids;
    return c;
}

// wgmma math runs on sm_90, whose blocks may have 227 KB of shared memory (which the
// warp-specialised forms need, pf_direct)
prefill_case in_math(prefill_case c, int math) {
    c.math = math;
    if (math == LOOM_K_MATH_BF16_WGMMA) c.smem_optin = 227 << 10;
    return c;
}

const char *math_name(int math) {
    return math == LOOM_K_MATH_BF16_WGMMA ? "wgmma"
           : math == LOOM_K_MATH_BF16     ? "bf16 math"
                                          : "f32 math";
}

// A row's output (q_stride floats from row r of res) equals another's, bit for bit.
bool same_row(const emu_test::prefill_result &a, int ra, const emu_test::prefill_result &b,
              int rb) {
    return memcmp(&a.out[(size_t)ra * a.q_stride], &b.out[(size_t)rb * b.q_stride],
                  (size_t)a.q_stride * sizeof(float)) == 0;
}

// The invariant mode (every row on the tiled kernel, long contexts of small steps split across
// blocks at fixed segments): every row against float64, and a sequence's rows the same bits
// whatever the step — cut into other chunks, decoded one row at a time, beside other
// sequences, split or not. In either math.
int invariant_mode_tests(bool verbose, int math) {
    int bad = 0;
    const char *mn = math_name(math);
    auto report = [&](const char *what, const emu_test::prefill_result &r) {
        if (!r.problem.empty()) {
            printf("FAIL prefill (invariant mode, %s) %s: %s\n", mn, what, r.problem.c_str());
            bad++;
        } else if (verbose) {
            printf("  prefill (invariant mode, %s) %s: worst %.2g, %d group(s)\n", mn, what,
                   r.worst, r.groups);
        }
    };
    auto run = [math](const prefill_case &c) { return emu_prefill::run(in_math(c, math)); };
    /* every row, decodes among prefills, against float64: the plans of 0, 4 and 132 SMs */
    const shape shapes[] = {
        {16, 128, 2, 4, 0, 0, LOOM_K_F16},  {1, 64, 2, 1, 37, 30, LOOM_K_FP8_E4M3},
        {8, 256, 1, 8, 0, 0, LOOM_K_BF16},  {8, 128, 2, 1, 0, 50, LOOM_K_F32},
        {16, 40, 3, 5, 300, 0, LOOM_K_F16}, {16, 64, 1, 8, 600, 30, LOOM_K_FP8_E5M2},
    };
    const int sms[] = {0, 4, 132};
    for (int i = 0; i < 6; i++) {
        const shape &s = shapes[i];
        const prefill_case c =
            with(make_case(s, {0, 700, 97, 5, 300, 1030}, {17, 1, 40, 3, 1, 2}, (schedule)(i % 4)),
                 true, sms[i % 3]);
        char what[96];
        snprintf(what, sizeof what, "bs=%d hd=%d G=%d window=%d %s on %d SMs", s.bs, s.hd, s.G,
                 s.window, type_name(s.type), sms[i % 3]);
        report(what, run(c));
    }

    /* cuts: a 120-row prompt in one step alone; in chunks of 1, 16, 40 and 63 rows beside other
       sequences (each chunk's step on a different SM count); its last 10 rows decoded one per
       step beside others; a long context (1030 positions, 5 segments) decoded, split or not */
    const shape inv_shapes[] = {{16, 128, 2, 4, 0, 0, LOOM_K_F16},
                                {8, 72, 1, 2, 20, 30, LOOM_K_F32},
                                {1, 64, 1, 8, 0, 0, LOOM_K_FP8_E4M3},
                                {16, 256, 1, 4, 300, 0, LOOM_K_BF16}};
    for (const shape &s : inv_shapes) {
        const emu_test::prefill_result alone =
            run(with(make_case(s, {0}, {120}, schedule::breadth), true, 0, {7}));
        report("a 120-row prompt alone", alone);
        const int chunk_at[] = {0, 1, 17, 57, 120};
        bool same = alone.problem.empty();
        for (int k = 0; k < 4 && same; k++) {
            const int n = chunk_at[k + 1] - chunk_at[k];
            const emu_test::prefill_result r =
                run(with(make_case(s, {33, chunk_at[k], 500}, {2, n, 1}, (schedule)(k % 4)), true,
                         sms[k % 3], {3, 7, 9}));
            report("a chunk of the prompt beside others", r);
            for (int i = 0; i < n && same; i++)
                if (!same_row(alone, chunk_at[k] + i, r, 2 + i)) {
                    printf("FAIL prefill (invariant mode, %s) hd=%d %s: position %d differs in a "
                           "chunk of %d rows from the whole prompt's\n",
                           mn, s.hd, type_name(s.type), chunk_at[k] + i, n);
                    same = false;
                    bad++;
                }
        }
        for (int pos = 110; pos < 120 && same; pos++) {
            const emu_test::prefill_result r = run(with(
                make_case(s, {pos, 9}, {1, 3}, (schedule)(pos % 4)), true, sms[pos % 3], {7, 2}));
            if (!r.problem.empty() || !same_row(alone, pos, r, 0)) {
                printf(
                    "FAIL prefill (invariant mode, %s) hd=%d %s: position %d decoded alone in its "
                    "row differs from the whole prompt's (%s)\n",
                    mn, s.hd, type_name(s.type), pos, r.problem.c_str());
                same = false;
                bad++;
            }
        }
        /* a long context: its last row as a decode step on 0, 4 and 132 SMs, and in a prefill
           chunk of 20 rows */
        const emu_test::prefill_result chunk =
            run(with(make_case(s, {1010}, {20}, schedule::depth), true, 0, {11}));
        report("a 20-row chunk at position 1010", chunk);
        for (int k = 0; k < 3 && same; k++) {
            const emu_test::prefill_result r = run(
                with(make_case(s, {1029, 40}, {1, 1}, (schedule)(k + 1)), true, sms[k], {11, 4}));
            if (!r.problem.empty() || !same_row(chunk, 19, r, 0)) {
                printf(
                    "FAIL prefill (invariant mode, %s) hd=%d %s: position 1029 decoded on %d SMs "
                    "(%d groups) differs from its chunk's (%s)\n",
                    mn, s.hd, type_name(s.type), sms[k], r.groups, r.problem.c_str());
                same = false;
                bad++;
            } else if (verbose) {
                printf("  prefill (invariant mode, %s) hd=%3d %-4s: position 1029 on %3d SMs (%d "
                       "groups) the same bits as in its chunk\n",
                       mn, s.hd, type_name(s.type), sms[k], r.groups);
            }
        }
        if (same && verbose)
            printf(
                "  prefill (invariant mode, %s) hd=%3d G=%d %-4s: the prompt's rows the same bits "
                "whole, in chunks and decoded\n",
                mn, s.hd, s.G, type_name(s.type));
    }
    return bad;
}

int prefill_tests(bool verbose) {
    int bad = 0;
    /* block sizes 1 / 8 / 16, head sizes 40 .. 256 (the accumulator layouts 64, 128, 256 and
       sizes under them), GQA groups 1 .. 16, windows, soft caps, every page type */
    const shape shapes[] = {
        {16, 128, 2, 4, 0, 0, LOOM_K_F16},    {1, 64, 2, 1, 37, 30, LOOM_K_FP8_E4M3},
        {8, 256, 1, 8, 0, 0, LOOM_K_BF16},    {16, 64, 1, 8, 600, 30, LOOM_K_FP8_E5M2},
        {8, 128, 2, 1, 0, 50, LOOM_K_F32},    {1, 256, 1, 4, 37, 0, LOOM_K_F16},
        {16, 40, 3, 5, 0, 0, LOOM_K_F16},     {8, 96, 1, 7, 37, 30, LOOM_K_F32},
        {1, 80, 2, 3, 0, 0, LOOM_K_FP8_E4M3}, {16, 128, 1, 16, 0, 0, LOOM_K_F16},
        {8, 72, 1, 2, 20, 0, LOOM_K_BF16},    {16, 256, 2, 8, 0, 30, LOOM_K_F32},
        {16, 64, 2, 2, 0, 0, LOOM_K_BF16}, /* BF16 pages at a head size the wgmma forms take */
    };
    /* sequences: cached positions and new rows; prefill rows around the tile edges, one
       sequence at the prefill threshold (16), one under it (15), decodes (1) */
    const std::vector<int> cached = {0, 54, 97, 5, 40, 33, 130};
    const std::vector<int> nnew = {17, 64, 100, 15, 16, 1, 33};
    int wg_direct = 0, wg_converted = 0; /* the wgmma forms' two kernels (pf_direct) */
    int n_qr = 0;                        /* cases run again on PF_*_QR */
    /* LOOM_EMU_NO_RERUNS (the sanitizer builds, CMakeLists.txt): no reruns comparing bits */
    const bool reruns = getenv("LOOM_EMU_NO_RERUNS") == nullptr;
    for (int math : {LOOM_K_MATH_F32, LOOM_K_MATH_BF16, LOOM_K_MATH_BF16_WGMMA}) {
        int i = 0;
        for (const shape &s : shapes) {
            const auto t0 = std::chrono::steady_clock::now();
            const schedule order = (schedule)(i % 4);
            const emu_test::prefill_result r =
                emu_prefill::run(in_math(make_case(s, cached, nnew, order), math));
            if (!r.problem.empty()) {
                printf("FAIL prefill case %d (%s): %s\n", i, math_name(math), r.problem.c_str());
                bad++;
            } else if (verbose) {
                printf("  prefill %2d %-9s bs=%2d hd=%3d nkv=%d G=%2d window=%3d cap=%2g %-4s "
                       "%-9s: worst %.2g (%.2f s)%s\n",
                       i, math_name(math), s.bs, s.hd, s.nkv, s.G, s.window, (double)s.cap,
                       type_name(s.type), order_names[(int)order], r.worst, seconds_since(t0),
                       r.direct ? " (warp-specialised, tiles by cp.async)" : "");
            }
            if (math == LOOM_K_MATH_BF16_WGMMA && (s.hd == 64 || s.hd == 128))
                (r.direct ? wg_direct : wg_converted)++;
            /* the case again as variant v, which must take the other path (took) and give the
               same bits */
            auto same_bits = [&](const prefill_case &v, auto took, const char *what) {
                const emu_test::prefill_result rv = emu_prefill::run(v);
                if (!took(rv) || rv.out.size() != r.out.size() ||
                    memcmp(rv.out.data(), r.out.data(), r.out.size() * sizeof(float)) != 0) {
                    printf("FAIL prefill case %d (%s): %s (form %d) does not give the bits of "
                           "form %d%s%s\n",
                           i, math_name(math), what, rv.ops, r.ops, rv.problem.empty() ? "" : ": ",
                           rv.problem.c_str());
                    bad++;
                } else if (verbose) {
                    printf("  prefill %2d %-9s: %s, the same bits\n", i, math_name(math), what);
                }
            };
            /* BF16 math at head sizes 72 .. 128 where blocks may have over 100 KB of shared memory:
               Q in registers and the fold in shared memory (PF_*_QR) */
            if (reruns && math == LOOM_K_MATH_BF16 && s.hd > 64 && s.hd <= 128 &&
                r.problem.empty()) {
                prefill_case v = in_math(make_case(s, cached, nnew, order), math);
                v.smem_optin = 227 << 10;
                same_bits(
                    v, [](const emu_test::prefill_result &x) { return x.q_regs; },
                    "Q in registers, the fold in shared memory");
                n_qr++;
            }
            /* the wgmma forms' register path (attn_prefill_kernel), not warp-specialised */
            if (reruns && r.direct && r.problem.empty()) {
                prefill_case v = in_math(make_case(s, cached, nnew, order), math);
                v.tile_regs = true;
                same_bits(
                    v, [](const emu_test::prefill_result &x) { return !x.direct; },
                    "the register path, not warp-specialised (tile_regs)");
            }
            i++;
        }
    }
    /* The warp-specialised wgmma forms with windows (consumers whose walks start apart, the
       producer's zeros below the earlier tile's window), a split on 132 SMs (blocks whose later
       tile has no position in their group), pages of one position, under every schedule: the
       register path's bits (release build only, as the reruns above) */
    const shape ws_shapes[] = {{16, 128, 2, 4, 20, 0, LOOM_K_F16},
                               {1, 64, 1, 8, 5, 30, LOOM_K_BF16}};
    for (const shape &s : ws_shapes)
        for (int o = 0; reruns && o < 4; o++) {
            /* contexts to 800 positions: 4 segments, split across blocks on 132 SMs; the last
               sequence's rows 468 .. 523 at head size 64 (8 rows a tile) put a pair's tiles at
               508 and 516, whose window-5 walks start either side of the groups' boundary at 512:
               a block whose later tile has no position in its group */
            const prefill_case c =
                in_math(with(make_case(s, {0, 54, 700, 5, 40, 33, 530, 468},
                                       {17, 64, 100, 15, 16, 1, 33, 56}, (schedule)o),
                             true, 132),
                        LOOM_K_MATH_BF16_WGMMA);
            const emu_test::prefill_result r = emu_prefill::run(c);
            prefill_case v = c;
            v.tile_regs = true;
            const emu_test::prefill_result rv = emu_prefill::run(v);
            if (!r.problem.empty() || !r.direct || !rv.problem.empty() ||
                memcmp(rv.out.data(), r.out.data(), r.out.size() * sizeof(float)) != 0) {
                printf("FAIL prefill warp-specialised hd=%d window=%d %s %s: %s\n", s.hd, s.window,
                       type_name(s.type), order_names[o],
                       !r.problem.empty()    ? r.problem.c_str()
                       : !r.direct           ? "not warp-specialised"
                       : !rv.problem.empty() ? rv.problem.c_str()
                                             : "not the register path's bits");
                bad++;
            } else if (verbose) {
                printf("  prefill warp-specialised hd=%3d window=%2d %-4s %-9s split in %d: worst "
                       "%.2g, the register path's bits\n",
                       s.hd, s.window, type_name(s.type), order_names[o], r.groups, r.worst);
            }
        }
    if (reruns && n_qr < 2) {
        printf("FAIL prefill: %d cases ran on the forms with Q in registers (PF_*_QR)\n", n_qr);
        bad++;
    }
    if (wg_direct == 0 || wg_converted == 0) {
        printf("FAIL prefill: the wgmma forms ran %d cases warp-specialised and %d on the "
               "register path; the cases must take both\n",
               wg_direct, wg_converted);
        bad++;
    }

    /* Batch invariance: a sequence's outputs alone and in a batch (other sequences before and
       after it in the descriptor, other block ids, another schedule), bit for bit. */
    const shape inv_shapes[] = {{16, 128, 2, 4, 0, 0, LOOM_K_F16},
                                {8, 72, 1, 2, 20, 30, LOOM_K_F32},
                                {1, 64, 1, 8, 0, 0, LOOM_K_FP8_E4M3}};
    for (const shape &s : inv_shapes) {
        const emu_test::prefill_result alone =
            emu_prefill::run(make_case(s, {97}, {100}, schedule::breadth));
        const emu_test::prefill_result batch = emu_prefill::run(
            make_case(s, {97, 33, 0, 500, 7}, {100, 1, 40, 16, 3}, schedule::random));
        const size_t n = (size_t)100 * alone.q_stride;
        const bool same = alone.problem.empty() && batch.problem.empty() &&
                          memcmp(alone.out.data(), batch.out.data(), n * sizeof(float)) == 0;
        if (!same) {
            printf("FAIL prefill invariance hd=%d %s: %s\n", s.hd, type_name(s.type),
                   !alone.problem.empty()   ? alone.problem.c_str()
                   : !batch.problem.empty() ? batch.problem.c_str()
                                            : "a sequence's bits differ alone and batched");
            bad++;
        } else if (verbose) {
            printf("  prefill invariance hd=%3d G=%d %-4s: alone and batched the same bits\n", s.hd,
                   s.G, type_name(s.type));
        }
    }

    bad += invariant_mode_tests(verbose, LOOM_K_MATH_F32);
    bad += invariant_mode_tests(verbose, LOOM_K_MATH_BF16);
    bad += invariant_mode_tests(verbose, LOOM_K_MATH_BF16_WGMMA);

    /* Long rows (positions past 4000, where LOOM_K_PLANTED_BUG drops position 0): the kernel
       as built passes, the planted build must fail. */
    const shape long_shape = {16, 64, 1, 4, 0, 0, LOOM_K_F16};
    const prefill_case lc = make_case(long_shape, {4090, 0}, {20, 16}, schedule::depth);
    const emu_test::prefill_result real = emu_prefill::run(lc);
    if (!real.problem.empty()) {
        printf("FAIL prefill long rows: %s\n", real.problem.c_str());
        bad++;
    } else if (verbose) {
        printf("  prefill long rows (positions 4090 .. 4109): worst %.2g\n", real.worst);
    }
    const emu_test::prefill_result planted = emu_prefill_planted::run(lc);
    if (planted.problem.empty()) {
        printf("FAIL prefill: the planted off-by-one (LOOM_K_PLANTED_BUG) went unnoticed "
               "(worst %.2g)\n",
               planted.worst);
        bad++;
    } else if (verbose) {
        printf("  prefill planted bug caught: %s\n", planted.problem.c_str());
    }
    return bad;
}

// attention.cu's split-KV and merge kernels; then the planted build's long rows must fail.
int attention_tests(bool verbose) {
    int bad = emu_attention::run_all(verbose);
    const std::string planted = emu_attention_planted::run_planted();
    if (planted.empty()) {
        printf("FAIL attention: the planted off-by-one (LOOM_K_PLANTED_BUG) went unnoticed\n");
        bad++;
    } else if (verbose) {
        printf("  attention planted bug caught: %s\n", planted.c_str());
    }
    return bad;
}

struct part {
    const char *name;
    const char *label; // the kernel file
    int (*run)(bool verbose);
};

const part parts[] = {
    {"prefill", "attention_prefill", prefill_tests},
    {"summary", "logits_summary", emu_summary::run_all},
    {"gemm", "gemm", emu_gemm::run_all},
    {"gemv", "gemv", emu_gemv::run_all},
    {"get_rows", "get_rows", emu_get_rows::run_all},
    {"elementwise", "elementwise", emu_elementwise::run_all},
    {"rope", "rope", emu_rope::run_all},
    {"kv_store", "kv_store", emu_kv_store::run_all},
    {"norm_rope_store", "norm_rope_store", emu_norm_rope_store::run_all},
    {"attention", "attention", attention_tests},
    {"kv_merge", "kv_merge", emu_kv_merge::run_all},
    {"blaslt_gemm", "blaslt_gemm", emu_blaslt_gemm::run_all},
    {"async_rules", "the emulator's wgmma and cp.async rules", emu_async_rules::run_all},
    {"smem_banks", "the memory access model (banks, sectors)", emu_smem_banks::run_all},
};
const int n_parts = (int)(sizeof parts / sizeof parts[0]);

} // namespace

int main(int argc, char **argv) {
    bool verbose = false, want[n_parts] = {}, any = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) {
            verbose = true;
            continue;
        }
        int j = 0;
        while (j < n_parts && strcmp(argv[i], parts[j].name) != 0) j++;
        if (j == n_parts) {
            fprintf(stderr, "usage: %s [PART ...] [-v]; parts:", argv[0]);
            for (const part &p : parts) fprintf(stderr, " %s", p.name);
            fprintf(stderr, "\n");
            return 2;
        }
        want[j] = any = true;
    }
    int bad = 0;
    for (int j = 0; j < n_parts; j++) {
        if (any && !want[j]) continue;
        const auto t0 = std::chrono::steady_clock::now();
        const int b = parts[j].run(verbose);
        printf("%s: %s (%.1f s)\n", parts[j].label, b ? "FAILED" : "ok", seconds_since(t0));
        fflush(stdout);
        bad += b;
    }
    const loom_emu::counters &c = loom_emu::stats();
    printf(
        "emulated: %llu blocks, %llu barriers, %llu warp collectives (%llu mma), %llu switches\n",
        (unsigned long long)c.blocks, (unsigned long long)c.barriers,
        (unsigned long long)c.warp_ops, (unsigned long long)c.mma, (unsigned long long)c.switches);
    return bad ? 1 : 0;
}
