// emu_util.h — what the kernel cases that compare against the CPU backend share (emu_gemv.cpp,
// emu_get_rows.cpp, emu_elementwise.cpp, emu_rope.cpp, emu_kv_store.cpp, emu_attention.cpp,
// emu_kv_merge.cpp, emu_blaslt_gemm.cpp): a seeded generator, the CPU backend's ops on one stream
// (the reference), weight rows of every type, a paged-KV step as both the CPU's descriptor
// (loom_kv_desc) and the kernels' (loom__k_kv), and the comparisons. Included after the kernel
// file a case compiles (its first include), so kernel_emu.h is already in.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "kernel_emu.h"
#include "loom_kernels.h"

extern "C" {
#include "backend/backend.h"
}

namespace emu_test {

// ---- random numbers -----------------------------------------------------------------------------

struct rng {
    uint64_t s;
    explicit rng(uint64_t seed) : s(seed) {}
    uint64_t next() { /* splitmix64 */
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float uniform(float a) { /* in [-a, a) */
        return (float)(((double)(next() >> 11) * 0x1p-52 - 1.0) * a);
    }
    uint64_t below(uint64_t n) { return next() % n; }
};

// Activations with the spread of a residual stream: O(scale), 1 in 64 a hundred times larger,
// 1 in 64 an exact zero.
void fill_acts(rng &r, float *x, size_t n, float scale);

// ---- the reference: the CPU backend
// ---------------------------------------------------------------

// The CPU backend with one stream (one thread), opened on first use and kept.
const loom__backend_stream &cpu();

// Fails the program with the operation's message where st is not LOOM_OK (a broken reference).
void cpu_ok(loom_status st, const char *what);

// A CPU tensor view of host memory: rows of cols elements stride bytes apart.
loom_tensor view(loom_type t, const void *p, int64_t cols, int64_t rows, size_t stride);

// ---- weights ------------------------------------------------------------------------------------

// Bytes of a row of k values of type t (loom's own count).
size_t row_bytes(uint32_t t, int64_t k);

// One random weight row of type t: float types and the types loom quantizes to from random
// floats (F32's values in [-1, 1)), the K-quants from random bytes with moderate scales.
void make_weight_row(rng &r, uint32_t t, int64_t k, uint8_t *row);

const char *type_name(uint32_t t);

// ---- the paged KV step --------------------------------------------------------------------------

// A KV group's shape: pages of `type` holding bs positions of nkv heads of hd elements.
struct kv_shape {
    int bs, hd, nkv, window;
    loom_type type;
};

// A step over sequences of kv_len[s] positions each, the last n_new[s] of them the step's rows,
// their blocks at pool[indptr[s] + b] (a shuffled pool, 3 spare blocks); with `hole`, the blocks
// wholly before a windowed sequence's first new row's window are LOOM_KV_NO_BLOCK. Pages are
// laid out with room between slots and blocks (strides a kernel must follow); FP8 pages keep
// their scales after each block's slots.
struct kv_step {
    kv_shape sh;
    int n_seqs = 0, n_rows = 0, n_blocks = 0;
    std::vector<int32_t> indptr, block_ids, q_start, pos_start, kv_len;
    // the kernels' lists, as the CUDA backend's step_begin makes them
    std::vector<int32_t> row_seq, prefill_seqs, split_rows;
    int prefill_max_rows = 0;
    size_t elt = 0, token = 0, block = 0, scale_at = 0, scale_token = 0;
    size_t pool_bytes() const { return (size_t)n_blocks * block; }
};

std::vector<int32_t> shuffled_pool(rng &r, int n_used);
kv_step make_step(const kv_shape &sh, const std::vector<int> &kv_len, const std::vector<int> &n_new,
                  const std::vector<int32_t> &pool, bool hole);
bool is_fp8(loom_type t);
uint32_t k_type(loom_type t); // LOOM_K_* of a KV type

// One layer's pools: K and V of pool_bytes each (poisoned 0xff: NaN in every page type), the
// FP8 scales inside them (scale_at of each block).
struct kv_pools {
    std::vector<unsigned char> k, v;
    void *kb[2], *vb[2], *ks[2], *vs[2]; // per layer of the descriptor (layer 1: NULL)
};
void pools_make(const kv_step &st, kv_pools *p);

// The CPU's descriptor (one layer; checked by loom__kv_desc_check) and the kernels' over the
// same arrays. The descriptor points into st and p: keep them alive and unmoved.
loom_kv_desc cpu_desc(const kv_step &st, kv_pools &p);
loom__k_kv kernel_desc(const kv_step &st);

// ---- comparisons --------------------------------------------------------------------------------

// ggml's normalised error: max |a - b| over max |b|; a NaN in a gives infinity.
double norm_err(const float *a, const float *b, size_t n);

bool same_bits(float a, float b);

// The first problem found (the rest are dropped): the case's name, then what went wrong.
struct problems {
    std::string first;
    int n = 0;
    __attribute__((format(printf, 2, 3))) void add(const char *fmt, ...);
};

const char *order_name(loom_emu::schedule s);

} // namespace emu_test
