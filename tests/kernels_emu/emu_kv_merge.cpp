// emu_kv_merge.cpp — kernels/kv_merge.cu's KV write of merged layer pairs, compiled from that file,
// run on the emulator against the CPU backend's kv_store of a merged descriptor (cpu_kv_merge.c):
// the earlier layer's directions and norms (store_a_kernel), then the later layer's norms,
// distances and decisions (store_b_kernel: keep in a free retained row, displace the least
// distant kept token, or merge), step after step — three sequences growing by 7, 5 and 9 rows a
// step, runs across block boundaries — then the last step stored again (a rolled-back step: a
// slot stored a second time). After every step both copies of the pages and the merge pool must
// agree: each slot's decision (state) exactly, norms and distances within 1e-6 of themselves,
// page and retained values within one unit of the page type's last place and 1e-6 (the sums
// are in double on both, in other orders: a rounding may fall the other way; verbose output
// counts the values whose bits differ). F32, F16 and BF16 pages; block sizes 1, 8 and 16; 0 to 4
// retained rows a block; head sizes 64, 128 and 200 (more than the block's 128 threads); 1 to 3
// KV heads; tokens whose later row is zero (distance 0: two of them kept, then a tie for which
// goes), repeats the earlier, reverses it (opposite directions; 16-bit pages, see below) or has
// a zero head, and an earlier row with a zero head.
#include "kv_merge.cu"

#include <stdio.h>

#include <algorithm>
#include <vector>

#include "emu_cases.h"
#include "emu_util.h"

extern "C" {
#include "kv/kv_desc.h"
#include "tensor/fp16.h"
}

namespace {

using emu_test::rng;
using loom_emu::schedule;

template <int KV> void launch_store(const merge_args &a, schedule order) {
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = 0x3e6 + (uint64_t)a.kv.n_rows;
    if (!a.m.later) {
        loom_emu::launch(
            dim3((unsigned)a.kv.n_rows, (unsigned)a.kv.n_kv_heads), dim3(MERGE_THREADS), 0,
            [&a] { store_a_kernel<KV>(a); }, opt);
        return;
    }
    const size_t smem = (MERGE_THREADS / 32) * sizeof(double) + 2 * (size_t)a.kv.n_kv_heads * 4;
    loom_emu::launch(
        dim3((unsigned)a.kv.n_rows), dim3(MERGE_THREADS), smem, [&a] { store_b_kernel<KV>(a); },
        opt);
}

void launch_any(const merge_args &a, schedule order) {
    switch (a.kv.kv_type) {
    case LOOM_K_F32:
        return launch_store<LOOM_K_F32>(a, order);
    case LOOM_K_F16:
        return launch_store<LOOM_K_F16>(a, order);
    default:
        return launch_store<LOOM_K_BF16>(a, order);
    }
}

struct merge_case {
    emu_test::kv_shape sh;
    int retain;
};

// One side's memory: the pair's pools and merge pool, and the descriptor's arrays over them.
struct side {
    emu_test::kv_pools pools;
    std::vector<unsigned char> merge;
    void *mbase[2];
    int32_t layer_src[2] = {0, 0}, merge_with[2] = {1, 0};
};

double value(loom_type t, const unsigned char *p) {
    uint16_t h;
    float f;
    switch (t) {
    case LOOM_TYPE_F32:
        memcpy(&f, p, 4);
        return f;
    case LOOM_TYPE_BF16:
        memcpy(&h, p, 2);
        return loom__bf16_to_f32(h);
    default:
        memcpy(&h, p, 2);
        return loom__f16_to_f32(h);
    }
}

// Page values (elements of type t) within one unit of the type's last place and 1e-6, or the
// same bits (both never written: poisoned alike). Counts the values whose bits differ.
bool values_close(loom_type t, const unsigned char *g, const unsigned char *e, size_t elt,
                  int *n_diff) {
    if (memcmp(g, e, elt) == 0) return true;
    ++*n_diff;
    const double a = value(t, g), b = value(t, e);
    const double ulp = t == LOOM_TYPE_F32 ? 0x1p-23 : t == LOOM_TYPE_F16 ? 0x1p-10 : 0x1p-7;
    return fabs(a - b) <= ulp * fabs(b) + 1e-6;
}

bool floats_close(const unsigned char *g, const unsigned char *e, int *n_diff) {
    if (memcmp(g, e, 4) == 0) return true;
    ++*n_diff;
    float a, b;
    memcpy(&a, g, 4);
    memcpy(&b, e, 4);
    return fabs((double)a - b) <= 1e-6 * fabs((double)b);
}

int run_case(const merge_case &mc, bool verbose) {
    const emu_test::kv_shape &sh = mc.sh;
    const int H = sh.nkv, hd = sh.hd, bs = sh.bs;
    const int64_t kvd = (int64_t)H * hd;
    const std::vector<int> final_len = {40, 23, 50}, chunk = {7, 5, 9};
    const int S = (int)final_len.size();
    rng r(0x3e63 + (uint64_t)hd * 7 + (uint64_t)sh.type + (uint64_t)mc.retain);
    /* each sequence's blocks, fixed for its whole life */
    std::vector<std::vector<int32_t>> seq_blocks((size_t)S);
    int total = 0;
    for (int s = 0; s < S; s++) total += (final_len[s] + bs - 1) / bs;
    const std::vector<int32_t> perm = emu_test::shuffled_pool(r, total);
    for (int s = 0, at = 0; s < S; s++)
        for (int b = 0; b < (final_len[s] + bs - 1) / bs; b++) seq_blocks[s].push_back(perm[at++]);

    /* the tokens' K and V rows of both layers, [S][final_len][kvd]; the later layer's are the
       earlier's plus noise, but for two zero rows (distance exactly 0: kept while rows are free,
       then a tie for which goes first), a copy, a reversed row and a row with one zero head */
    std::vector<std::vector<float>> xa((size_t)S * 2), xb((size_t)S * 2);
    for (int s = 0; s < S; s++)
        for (int kv = 0; kv < 2; kv++) {
            std::vector<float> &a = xa[s * 2 + kv], &b = xb[s * 2 + kv];
            a.resize((size_t)(final_len[s] * kvd));
            b.resize(a.size());
            for (size_t i = 0; i < a.size(); i++) {
                a[i] = r.uniform(kv ? 1.0f : 2.0f);
                b[i] = 0.8f * a[i] + r.uniform(0.3f + 0.5f * (float)(i / kvd % 3));
            }
            /* Reversed rows only over 16-bit pages: over F32 pages the two stored directions
               are opposite to within 1e-7, sin W ~ 5e-4 passes kv_merge.h's 1e-6 threshold,
               the slerp coefficients (~2000) cancel, and the double sums' order (the CPU's
               sequential, the kernel's tree) moves the merged row by ~1e-3 of itself: the
               arithmetic's conditioning, not a difference between the two stores. */
            const bool reverse = sh.type != LOOM_TYPE_F32;
            for (int64_t e = 0; e < kvd; e++) {
                b[1 * kvd + e] = b[2 * kvd + e] = 0.0f;
                b[3 * kvd + e] = a[3 * kvd + e];
                if (reverse) b[4 * kvd + e] = -a[4 * kvd + e];
                if (e < hd) b[6 * kvd + e] = a[8 * kvd + e] = 0.0f;
            }
        }

    const int n_blocks = total + 3;
    side sd[2]; /* 0: the kernels', 1: the CPU's */
    emu_test::kv_step geom = emu_test::make_step(sh, {1}, {1}, perm, false);
    const size_t row = (size_t)kvd * geom.elt;
    const size_t mstride =
        (loom_kv_merge_rows_at(bs, H) + 2 * (size_t)mc.retain * row + 15) & ~(size_t)15;
    for (side &x : sd) {
        emu_test::pools_make(geom, &x.pools);
        x.merge.assign((size_t)n_blocks * mstride + 16, 0xff);
        x.mbase[0] = x.mbase[1] = (void *)(((uintptr_t)x.merge.data() + 15) & ~(uintptr_t)15);
    }

    /* the steps: each sequence's next chunk until all are whole, then the last step again */
    std::vector<std::vector<int>> steps;
    for (std::vector<int> len((size_t)S, 0);;) {
        std::vector<int> nnew((size_t)S);
        bool any = false;
        for (int s = 0; s < S; s++) {
            nnew[s] = std::min(chunk[s], final_len[s] - len[s]);
            len[s] += nnew[s];
            any |= nnew[s] > 0;
        }
        if (!any) break;
        steps.push_back(nnew);
    }
    steps.push_back(steps.back());

    std::vector<int> len((size_t)S, 0);
    emu_test::problems pr;
    int n_diff = 0, step = 0;
    for (; step < (int)steps.size() && !pr.n; step++) {
        const std::vector<int> &nnew = steps[step];
        if (step + 1 == (int)steps.size()) /* rolled back: the same rows stored again */
            for (int s = 0; s < S; s++) len[s] -= nnew[s];
        std::vector<int> kv_len((size_t)S);
        std::vector<int32_t> pool;
        for (int s = 0; s < S; s++) {
            kv_len[s] = len[s] + nnew[s];
            for (int b = 0; b < (kv_len[s] + bs - 1) / bs; b++) pool.push_back(seq_blocks[s][b]);
        }
        for (int32_t id = 0; (int)pool.size() < n_blocks; id++) /* the rest, unused */
            if (std::find(pool.begin(), pool.end(), id) == pool.end()) pool.push_back(id);
        const emu_test::kv_step st = emu_test::make_step(sh, kv_len, nnew, pool, false);
        for (int layer = 0; layer < 2; layer++) {
            std::vector<float> k((size_t)(st.n_rows * kvd)), v(k.size());
            for (int s = 0, at = 0; s < S; s++)
                for (int i = 0; i < nnew[s]; i++, at++) {
                    const int p = len[s] + i;
                    const std::vector<float> *x = layer ? xb.data() : xa.data();
                    memcpy(&k[at * kvd], &x[s * 2][(size_t)p * kvd], (size_t)kvd * 4);
                    memcpy(&v[at * kvd], &x[s * 2 + 1][(size_t)p * kvd], (size_t)kvd * 4);
                }
            /* the CPU */
            side &c = sd[1];
            loom_kv_desc d = emu_test::cpu_desc(st, c.pools);
            d.n_layers = 2;
            d.layer_src = c.layer_src;
            d.merge_with = c.merge_with;
            d.merge_base = c.mbase;
            d.merge_block_stride = mstride;
            d.merge_retain = mc.retain;
            d.merge_t = 0.4f;
            d.kv_flags = LOOM_KV_MERGED;
            emu_test::cpu_ok(loom__kv_desc_check(&d, st.n_rows), "the merged descriptor");
            const loom__backend_stream &cb = emu_test::cpu();
            loom_tensor tk = emu_test::view(LOOM_TYPE_F32, k.data(), kvd, st.n_rows, kvd * 4);
            loom_tensor tv = emu_test::view(LOOM_TYPE_F32, v.data(), kvd, st.n_rows, kvd * 4);
            emu_test::cpu_ok(cb.ops->kv_store(cb.ctx, &tk, &tv, &d, layer), "cpu kv_store");
            /* the kernels */
            side &g = sd[0];
            merge_args a;
            a.kv = emu_test::kernel_desc(st);
            a.k = k.data();
            a.v = v.data();
            a.k_stride = a.v_stride = (size_t)kvd * 4;
            a.pool[0] = (char *)g.pools.kb[0];
            a.pool[1] = (char *)g.pools.vb[0];
            a.m.base = (char *)g.mbase[0];
            a.m.block_stride = mstride;
            a.m.dist_at = loom_kv_merge_dist_at(bs, H);
            a.m.state_at = loom_kv_merge_state_at(bs, H);
            a.m.rows_at = loom_kv_merge_rows_at(bs, H);
            a.m.retain = mc.retain;
            a.m.t = 0.4f;
            a.m.later = layer;
            launch_any(a, (schedule)((step * 2 + layer) % 4));
        }
        for (int s = 0; s < S; s++) len[s] += nnew[s];

        /* both sides' pages and merge blocks */
        for (int kv = 0; kv < 2; kv++) {
            const std::vector<unsigned char> &g = kv ? sd[0].pools.v : sd[0].pools.k;
            const std::vector<unsigned char> &e = kv ? sd[1].pools.v : sd[1].pools.k;
            for (size_t i = 0; i + geom.elt <= g.size(); i += geom.elt)
                if (!values_close(sh.type, &g[i], &e[i], geom.elt, &n_diff))
                    pr.add("step %d: %c page of block %zu, slot %zu, element %zu: %.9g, the "
                           "CPU's %.9g",
                           step, "KV"[kv], i / geom.block, i % geom.block / geom.token,
                           i % geom.token / geom.elt, value(sh.type, &g[i]), value(sh.type, &e[i]));
        }
        for (int b = 0; b < n_blocks; b++) {
            const unsigned char *g = (const unsigned char *)sd[0].mbase[0] + (size_t)b * mstride;
            const unsigned char *e = (const unsigned char *)sd[1].mbase[0] + (size_t)b * mstride;
            const size_t dist_at = loom_kv_merge_dist_at(bs, H),
                         state_at = loom_kv_merge_state_at(bs, H);
            const size_t rows_at = loom_kv_merge_rows_at(bs, H);
            for (size_t i = 0; i < state_at; i += 4)
                if (!floats_close(g + i, e + i, &n_diff))
                    pr.add("step %d: block %d's %s differs", step, b,
                           i < dist_at ? "norms" : "distances");
            if (memcmp(g + state_at, e + state_at, (size_t)bs * 4) != 0)
                pr.add("step %d: block %d's decisions (state) differ", step, b);
            for (size_t i = rows_at; i < rows_at + 2 * (size_t)mc.retain * row; i += geom.elt)
                if (!values_close(sh.type, g + i, e + i, geom.elt, &n_diff))
                    pr.add("step %d: block %d's retained row %zu differs", step, b,
                           (i - rows_at) / (2 * row));
        }
    }
    if (pr.n) {
        printf("FAIL kv_merge %s bs=%d hd=%d kv_heads=%d retain=%d: %s (%d wrong)\n",
               emu_test::type_name(sh.type), bs, hd, H, mc.retain, pr.first.c_str(), pr.n);
        return 1;
    }
    if (verbose)
        printf("  kv_merge %-5s bs=%2d hd=%3d kv_heads=%d retain=%d: %d steps, the CPU's decisions "
               "and values (%d of them not bit for bit)\n",
               emu_test::type_name(sh.type), bs, hd, H, mc.retain, step, n_diff);
    return 0;
}

} // namespace

namespace emu_kv_merge {

int run_all(bool verbose) {
    const merge_case cases[] = {
        {{16, 64, 2, 0, LOOM_TYPE_F16}, 4},
        {{8, 128, 1, 0, LOOM_TYPE_BF16}, 2},
        {{16, 200, 2, 0, LOOM_TYPE_F32}, 0},
        {{1, 64, 3, 0, LOOM_TYPE_F16}, 1},
    };
    int bad = 0;
    for (const merge_case &mc : cases) bad += run_case(mc, verbose);
    return bad;
}

} // namespace emu_kv_merge
