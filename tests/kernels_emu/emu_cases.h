// emu_cases.h — the kernel cases of test_kernels_emu, one file per kernel family (emu_<family>.cpp
// for kernels/<family>.cu), each of which compiles its kernel from kernels/*.cu. The prefill and
// split-KV attention cases are compiled twice: as the kernel is, and with the planted bug
// (LOOM_K_PLANTED_BUG), which the test must catch.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "kernel_emu.h"

namespace emu_test {

// One step of paged prefill attention: sequences with cached[s] positions in the cache and
// nnew[s] new rows, pages of type `type` (LOOM_K_*) holding bs positions, nkv KV heads of hd
// elements, G query heads per KV head, a window (0: none) and a soft cap (0: none). all: the
// invariant mode (every sequence on the tiled kernel, split for n_sms SMs; 0: never) rather
// than the fast mode's prefill sequences. A sequence's K, V and queries are a function of
// (id, position), id = ids[s] (or s where ids is empty), so the same sequence cut into other
// steps reads and asks the same values. math: the products' operands.
struct prefill_case {
    int bs, hd, nkv, G, window;
    float cap;
    uint32_t type;
    std::vector<int> cached, nnew;
    loom_emu::schedule order;
    bool all = false;
    int n_sms = 0;
    std::vector<int> ids = {};
    int math = 0;           // LOOM_K_MATH_*: 1, BF16 math (16-bit operands, pf_ops_of)
    bool tile_regs = false; // loom__k_attn's tile_regs: the wgmma forms never warp-specialised
    int smem_optin = 0;     // loom__k_attn's: over 100 KB, BF16 math at 72..128 takes PF_*_QR
};

struct prefill_result {
    double worst;           // largest error of a row, normalised by the row's largest value
    std::string problem;    // empty, or what went wrong first
    std::vector<float> out; // [rows, q_stride] as the kernel left it
    int q_stride;           // floats
    int groups;             // the split's groups of segments (1: none)
    bool direct = false;    // the wgmma forms ran warp-specialised (pf_direct)
    int ops = -1;           // the kernel's form (pf_ops_of)
    bool q_regs = false;    // it was PF_BF16_QR or PF_F16_QR
};

} // namespace emu_test

namespace emu_prefill {
emu_test::prefill_result run(const emu_test::prefill_case &c);
}
namespace emu_prefill_planted {
emu_test::prefill_result run(const emu_test::prefill_case &c);
}

// Each runs every case of its kernel; returns the number of failures (each printed).
namespace emu_summary {
int run_all(bool verbose);
}
namespace emu_gemm {
int run_all(bool verbose);
}
namespace emu_gemv {
int run_all(bool verbose);
}
namespace emu_get_rows {
int run_all(bool verbose);
}
namespace emu_elementwise {
int run_all(bool verbose);
}
namespace emu_rope {
int run_all(bool verbose);
}
namespace emu_kv_store {
int run_all(bool verbose);
}
namespace emu_norm_rope_store {
int run_all(bool verbose);
}
namespace emu_kv_merge {
int run_all(bool verbose);
}
namespace emu_blaslt_gemm {
int run_all(bool verbose);
}
// kernel_emu_async.cpp's rules: a correct warpgroup kernel passes, each break of a rule is
// reported (in child processes).
namespace emu_async_rules {
int run_all(bool verbose);
}
// smem_banks.cpp's bank-conflict model, on accesses whose cost is known.
namespace emu_smem_banks {
int run_all(bool verbose);
}
// attention.cu's split-KV and merge kernels; the planted build's run_planted() gives the
// problem its long rows show (empty: the planted off-by-one went unnoticed).
namespace emu_attention {
int run_all(bool verbose);
}
namespace emu_attention_planted {
std::string run_planted();
}
