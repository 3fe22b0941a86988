// emu_attention.cpp — kernels/attention.cu's split-KV attention (the split kernel, then the merge
// kernel over each launch's rows, in launches of LOOM_K_ATTN_ROWS rows as attn_run makes them),
// compiled from that file, run on the emulator against the CPU backend's attention over the same
// pages (written by the CPU's kv_store), each row within 2e-5 of its largest value
// (test_cuda_ops' tolerance: attending to one position too many or too few moves a 4099-long row
// by about 1/4099). The rows are the step's split-KV list (loom__k_kv's split_rows: sequences
// under LOOM_K_ATTN_PREFILL_ROWS new rows; a prefill sequence beside them must stay untouched),
// or every row (rows NULL: a head size the prefill kernel declines). Contexts 1, 2, 8, 9, 16, 17,
// 31, 33, 54, 97, 255, 256, 257 (one split and two), 513, 600, 1000, a 5-row chunk after 40
// cached positions, 4099 (sixteen splits) and 16384; block sizes 1, 8, 16; head sizes 64, 128, 256
// and 36, 100, 200; 1, 3, 4, 5, 7, 8 and 16 query heads per KV head; windows 37, 600 and 1000
// (table entries before a window LOOM_KV_NO_BLOCK) and soft-capping on and off; F32, F16, BF16, FP8
// E4M3 and E5M2 pages; the layers of a merged pair (directions times norms, the later layer's
// retained rows). Outputs, their padding and the workspace are poisoned (NaN). Batch invariance:
// a 4099- and a 2500-position row's output the same bits alone and after 65 other rows (its
// blocks elsewhere in the pool, in the second launch of rows, under another schedule).
// Built twice (CMakeLists.txt): EMU_ATTENTION_NS names this build's functions,
// LOOM_K_PLANTED_BUG plants attention.cu's off-by-one, which run_planted() must show.
#include "attention.cu"

#include <stdio.h>

#include <vector>

#include "emu_cases.h"
#include "emu_util.h"

extern "C" {
#include "kv/kv_desc.h"
}

#if !defined(EMU_ATTENTION_NS)
#define EMU_ATTENTION_NS emu_attention
#endif

namespace {

using emu_test::rng;
using loom_emu::schedule;

// ---- the launches -------------------------------------------------------------------------------

template <int KV, int HDC, int MAXG>
void launch_split(const attn_args &a, unsigned rows, size_t smem, schedule order) {
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = 0xa77 + rows + (uint64_t)a.row0;
    loom_emu::launch(
        dim3(LOOM_K_ATTN_MAX_SPLITS, (unsigned)a.kv.n_kv_heads, rows), dim3(ATTN_WARPS * 32), smem,
        [&a] { attn_split_kernel<KV, HDC, MAXG>(a); }, opt);
}

template <int KV, int HD>
void launch_vec(const attn_args &a, unsigned rows, size_t smem, schedule order) {
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = 0xa78 + rows + (uint64_t)a.row0;
    loom_emu::launch(
        dim3(LOOM_K_ATTN_MAX_SPLITS, (unsigned)a.kv.n_kv_heads, rows), dim3(ATTN_WARPS * 32), smem,
        [&a] { attn_vec_kernel<KV, HD>(a); }, opt);
}

/* attn_run's choice: the vector form where attn_vec_hd takes the layer, else the scalar one. */
template <int KV>
void launch_split_hd(const attn_args &a, unsigned rows, size_t smem, schedule order) {
    switch (attn_vec_hd<KV>(a.kv, a.p)) {
    case 64:
        return launch_vec<KV, 64>(a, rows, smem, order);
    case 128:
        return launch_vec<KV, 128>(a, rows, smem, order);
    case 256:
        return launch_vec<KV, 256>(a, rows, smem, order);
    default:
        break;
    }
    switch (attn_hdc(a.kv.head_dim)) {
    case 2:
        return launch_split<KV, 2, 16>(a, rows, smem, order);
    case 4:
        return launch_split<KV, 4, 16>(a, rows, smem, order);
    default:
        return launch_split<KV, 8, 8>(a, rows, smem, order);
    }
}

// attn_run's launches: rows rows[0 .. n) (rows NULL: 0 .. n), LOOM_K_ATTN_ROWS at a time.
void run_kernels(const loom__k_kv &kv, const loom__k_attn &p, const int32_t *rows, int n,
                 schedule order) {
    const int G = p.n_head / kv.n_kv_heads;
    const size_t smem =
        ((size_t)G * kv.head_dim * (1 + ATTN_WARPS) + ATTN_WARPS * G * 2) * sizeof(float);
    for (int row0 = 0; row0 < n; row0 += LOOM_K_ATTN_ROWS) {
        const unsigned nr = (unsigned)std::min(n - row0, LOOM_K_ATTN_ROWS);
        const attn_args a = {kv, p, rows, row0};
        switch (kv.kv_type) {
        case LOOM_K_F32:
            launch_split_hd<LOOM_K_F32>(a, nr, smem, order);
            break;
        case LOOM_K_F16:
            launch_split_hd<LOOM_K_F16>(a, nr, smem, order);
            break;
        case LOOM_K_BF16:
            launch_split_hd<LOOM_K_BF16>(a, nr, smem, order);
            break;
        case LOOM_K_FP8_E4M3:
            launch_split_hd<LOOM_K_FP8_E4M3>(a, nr, smem, order);
            break;
        default:
            launch_split_hd<LOOM_K_FP8_E5M2>(a, nr, smem, order);
            break;
        }
        loom_emu::launch_options opt;
        opt.order = (schedule)(((int)order + 1) % 4);
        opt.seed = 0x3e7 + nr;
        loom_emu::launch(
            dim3(nr, (unsigned)p.n_head), dim3(128), 0, [&a] { attn_merge_kernel(a); }, opt);
    }
}

// ---- one case -----------------------------------------------------------------------------------

struct attn_case {
    emu_test::kv_shape sh;
    int G;
    float cap;
    std::vector<int> len, nnew;
    bool all_rows; // every row on split-KV (rows NULL), not the split list
    int merged;    // 0; 1, 2: the earlier, later layer of a merged pair (reads layer merged - 1)
    schedule order;
};

struct attn_result {
    std::string problem;
    double worst = 0;
    std::vector<float> out; // [rows][ld]
    int ld = 0;
};

// A sequence's keys, values and queries depend on its length alone, so it gets the same data
// alone and in any batch.
uint64_t seq_seed(int len, int what) {
    return 0x517cc1b727220a95ull * (uint64_t)(len + 1) + (uint64_t)what * 0x2545f4914f6cdd1dull;
}

// The merged pair's part of the descriptor (layers 0 and 1, 4 of each block's slots retained).
struct merge_setup {
    int32_t layer_src[2] = {0, 0}, merge_with[2] = {1, 0};
    void *base[2] = {nullptr, nullptr};
    std::vector<unsigned char> pool;
    size_t stride = 0;
};
const int MERGE_RETAIN = 4;
const float MERGE_T = 0.4f;

void merge_desc(merge_setup &m, const emu_test::kv_step &st, loom_kv_desc *d) {
    if (m.pool.empty()) {
        const size_t row = (size_t)st.sh.nkv * st.sh.hd * st.elt;
        m.stride = (loom_kv_merge_rows_at(st.sh.bs, st.sh.nkv) + 2 * MERGE_RETAIN * row + 15) &
                   ~(size_t)15;
        m.pool.assign((size_t)st.n_blocks * m.stride + 16, 0xff);
        m.base[0] = m.base[1] = (void *)(((uintptr_t)m.pool.data() + 15) & ~(uintptr_t)15);
    }
    d->n_layers = 2;
    d->layer_src = m.layer_src;
    d->merge_with = m.merge_with;
    d->merge_base = m.base;
    d->merge_block_stride = m.stride;
    d->merge_retain = MERGE_RETAIN;
    d->merge_t = MERGE_T;
    d->kv_flags = LOOM_KV_MERGED;
    emu_test::cpu_ok(loom__kv_desc_check(d, st.n_rows), "the merged pair's descriptor");
}

attn_result run(const attn_case &c) {
    attn_result res;
    const emu_test::kv_shape &sh = c.sh;
    const int nkv = sh.nkv, hd = sh.hd, nh = nkv * c.G;
    const int64_t kvd = (int64_t)nkv * hd, qd = (int64_t)nh * hd;
    /* loom__cuda_attention_shape_ok's rule (the entry points are not built here) */
    if (attn_hdc(hd) == 0 || c.G > attn_maxg(attn_hdc(hd))) {
        res.problem = "a head shape the kernels do not run";
        return res;
    }
    rng r(0xa7e + (uint64_t)c.len.size() * 31 + (uint64_t)hd);
    int used = 0;
    for (int l : c.len) used += (l + sh.bs - 1) / sh.bs;
    const std::vector<int32_t> pool = emu_test::shuffled_pool(r, used);
    const emu_test::kv_step H = emu_test::make_step(sh, c.len, c.len, pool, false);
    const emu_test::kv_step L = emu_test::make_step(sh, c.len, c.nnew, pool, sh.window > 0);
    emu_test::kv_pools pools;
    emu_test::pools_make(H, &pools);
    merge_setup ms;

    /* every position's K and V through the CPU's kv_store (both layers of a merged pair) */
    std::vector<float> k((size_t)(H.n_rows * kvd)), v((size_t)(H.n_rows * kvd));
    for (int s = 0; s < H.n_seqs; s++) {
        rng rs(seq_seed(c.len[s], 1));
        for (int64_t i = (int64_t)H.q_start[s] * kvd; i < (int64_t)H.q_start[s + 1] * kvd; i++) {
            k[i] = rs.uniform(2.0f);
            v[i] = rs.uniform(1.0f);
        }
    }
    const loom__backend_stream &cb = emu_test::cpu();
    {
        loom_kv_desc dh = emu_test::cpu_desc(H, pools);
        if (c.merged) merge_desc(ms, H, &dh);
        loom_tensor tk = emu_test::view(LOOM_TYPE_F32, k.data(), kvd, H.n_rows, kvd * 4);
        loom_tensor tv = emu_test::view(LOOM_TYPE_F32, v.data(), kvd, H.n_rows, kvd * 4);
        for (int layer = 0; layer < (c.merged ? 2 : 1); layer++) {
            if (c.merged && layer == 1) /* the later layer's own K/V */
                for (size_t i = 0; i < k.size(); i++) {
                    k[i] = 0.7f * k[i] + r.uniform(0.6f);
                    v[i] = 0.7f * v[i] + r.uniform(0.4f);
                }
            emu_test::cpu_ok(cb.ops->kv_store(cb.ctx, &tk, &tv, &dh, layer), "cpu kv_store");
        }
    }

    /* the step's queries; the reference */
    std::vector<float> q((size_t)(L.n_rows * qd)), ref((size_t)(L.n_rows * qd), NAN);
    for (int s = 0; s < L.n_seqs; s++) {
        rng rs(seq_seed(c.len[s], 2));
        for (int64_t i = (int64_t)L.q_start[s] * qd; i < (int64_t)L.q_start[s + 1] * qd; i++)
            q[i] = rs.uniform(1.5f);
    }
    loom_kv_desc dl = emu_test::cpu_desc(L, pools);
    if (c.merged) merge_desc(ms, L, &dl);
    loom_attn_params ap;
    ap.n_head = nh;
    ap.layer = c.merged ? c.merged - 1 : 0;
    ap.scale = 1.0f / sqrtf((float)hd);
    ap.softcap = c.cap;
    {
        loom_tensor tq = emu_test::view(LOOM_TYPE_F32, q.data(), qd, L.n_rows, qd * 4);
        loom_tensor to = emu_test::view(LOOM_TYPE_F32, ref.data(), qd, L.n_rows, qd * 4);
        emu_test::cpu_ok(cb.ops->attention(cb.ctx, &tq, &dl, &ap, &to), "cpu attention");
    }

    /* the kernels, q and out with padding */
    res.ld = (int)qd + 4;
    std::vector<float> qp((size_t)L.n_rows * res.ld, NAN);
    for (int64_t i = 0; i < L.n_rows; i++) memcpy(&qp[i * res.ld], &q[i * qd], (size_t)qd * 4);
    res.out.assign((size_t)L.n_rows * res.ld, NAN);
    /* loom__cuda_attention_work_bytes: partial outputs and (max, sum) pairs per row, head, split */
    std::vector<float> work((size_t)LOOM_K_ATTN_ROWS * nh * LOOM_K_ATTN_MAX_SPLITS * (hd + 2), NAN);
    const bool fp8 = emu_test::is_fp8(sh.type);
    loom__k_attn p;
    memset(&p, 0, sizeof p);
    p.q = qp.data();
    p.q_stride = (size_t)res.ld * 4;
    p.out = res.out.data();
    p.out_stride = (size_t)res.ld * 4;
    p.k_pool = pools.kb[0];
    p.v_pool = pools.vb[0];
    p.k_scale = fp8 ? pools.ks[0] : nullptr;
    p.v_scale = fp8 ? pools.vs[0] : nullptr;
    p.n_head = nh;
    p.scale = ap.scale;
    p.softcap = c.cap;
    p.work = work.data();
    if (c.merged) {
        p.merge.base = (char *)ms.base[0];
        p.merge.block_stride = ms.stride;
        p.merge.dist_at = loom_kv_merge_dist_at(sh.bs, nkv);
        p.merge.state_at = loom_kv_merge_state_at(sh.bs, nkv);
        p.merge.rows_at = loom_kv_merge_rows_at(sh.bs, nkv);
        p.merge.retain = MERGE_RETAIN;
        p.merge.t = MERGE_T;
        p.merge.later = c.merged == 2;
    }
    const loom__k_kv kd = emu_test::kernel_desc(L);
    if (c.all_rows)
        run_kernels(kd, p, nullptr, L.n_rows, c.order);
    else
        run_kernels(kd, p, kd.split_rows, kd.n_split_rows, c.order);

    /* rows on split-KV against the CPU; the others untouched; padding untouched */
    std::vector<char> mine((size_t)L.n_rows, c.all_rows);
    for (int32_t row : L.split_rows) mine[row] = 1;
    emu_test::problems pr;
    for (int s = 0; s < L.n_seqs; s++)
        for (int row = L.q_start[s]; row < L.q_start[s + 1]; row++) {
            const float *o = &res.out[(size_t)row * res.ld];
            for (int64_t e = qd; e < res.ld; e++)
                if (!std::isnan(o[e])) pr.add("row %d: its padding was written", row);
            if (!mine[row]) {
                for (int64_t e = 0; e < qd; e++)
                    if (!std::isnan(o[e]))
                        pr.add("row %d (sequence %d, a prefill sequence's) was written", row, s);
                continue;
            }
            const double err = emu_test::norm_err(o, &ref[(size_t)row * qd], (size_t)qd);
            if (!(err <= 2e-5))
                pr.add("row %d (sequence %d, position %d of %d): normalised error %.3g", row, s,
                       L.pos_start[s] + row - L.q_start[s], c.len[s], err);
            res.worst = std::max(res.worst, err);
        }
    res.problem = pr.first;
    return res;
}

std::string describe(const attn_case &c) {
    char buf[200];
    snprintf(buf, sizeof buf, "bs=%2d hd=%3d kv_heads=%d G=%d window=%3d cap=%2g %-8s%s%s", c.sh.bs,
             c.sh.hd, c.sh.nkv, c.G, c.sh.window, (double)c.cap, emu_test::type_name(c.sh.type),
             c.all_rows ? " all rows" : "",
             c.merged == 1   ? " merged (earlier)"
             : c.merged == 2 ? " merged (later)"
                             : "");
    return buf;
}

// The long rows of the planted bug: a 4099-position decode row and a 3-row chunk at 4100.
attn_case long_case() {
    attn_case c;
    c.sh = emu_test::kv_shape{16, 64, 1, 0, LOOM_TYPE_F16};
    c.G = 1;
    c.cap = 0;
    c.len = {4099, 4102};
    c.nnew = {1, 3};
    c.all_rows = false;
    c.merged = 0;
    c.order = schedule::depth;
    return c;
}

} // namespace

namespace EMU_ATTENTION_NS {

std::string run_planted() {
    const attn_result r = run(long_case());
    return r.problem;
}

int run_all(bool verbose) {
    using emu_test::kv_shape;
    int bad = 0;
    auto report = [&](const attn_case &c, const attn_result &r, const char *what) {
        if (!r.problem.empty()) {
            printf("FAIL attention %s %s: %s\n", what, describe(c).c_str(), r.problem.c_str());
            bad++;
        } else if (verbose) {
            printf("  attention %s %s %-9s: worst %.2g\n", what, describe(c).c_str(),
                   emu_test::order_name(c.order), r.worst);
        }
    };
    /* decode rows of awkward lengths, a 5-row chunk after 40 cached positions (split-KV), a
       20-row prefill sequence (not split-KV's: it must stay untouched, or in all_rows cases is
       split-KV's too); every third case a 4099-position row too */
    const std::vector<int> len = {1,  54, 97, 2,  17, 255,  256, 257, 513, 600,
                                  33, 8,  9,  16, 31, 1000, 1,   45,  50};
    const std::vector<int> nnew = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 5, 20};
    std::vector<int> len_long = len, nnew_long = nnew;
    len_long.insert(len_long.begin() + 3, 4099);
    nnew_long.insert(nnew_long.begin() + 3, 1);
    /* block sizes x head sizes x groups, every combination; page types, windows and soft caps
       rotate over them */
    const int block_sizes[] = {1, 8, 16}, head_dims[] = {64, 128, 256}, groups[] = {1, 4, 8};
    const loom_type types[] = {LOOM_TYPE_F16, LOOM_TYPE_F32, LOOM_TYPE_FP8_E4M3, LOOM_TYPE_BF16,
                               LOOM_TYPE_FP8_E5M2};
    int n = 0;
    for (int bi = 0; bi < 3; bi++)
        for (int hi = 0; hi < 3; hi++)
            for (int gi = 0; gi < 3; gi++, n++) {
                const int G = groups[gi];
                const kv_shape sh = {block_sizes[bi], head_dims[hi], G == 8 ? 1 : 2,
                                     n % 3 == 1   ? 37
                                     : n % 3 == 2 ? 600
                                                  : 0,
                                     types[n % 5]};
                const bool with_long = n % 3 == 0;
                const attn_case c = {sh,
                                     G,
                                     n % 2 ? 30.0f : 0.0f,
                                     with_long ? len_long : len,
                                     with_long ? nnew_long : nnew,
                                     false,
                                     0,
                                     (schedule)(n % 4)};
                report(c, run(c), "");
            }
    /* head sizes off the prefill kernel's (every row split-KV: rows NULL), groups that are not
       powers of two, the most query heads a KV head takes (16) */
    const struct {
        kv_shape sh;
        int G;
        float cap;
        bool all_rows;
    } odd[] = {
        {{8, 36, 1, 0, LOOM_TYPE_F16}, 7, 50, true},
        {{16, 100, 1, 37, LOOM_TYPE_FP8_E5M2}, 5, 0, true},
        {{1, 200, 2, 0, LOOM_TYPE_F32}, 3, 30, true},
        {{16, 128, 1, 600, LOOM_TYPE_BF16}, 16, 0, false},
    };
    for (const auto &s : odd) {
        const attn_case c = {s.sh, s.G, s.cap, len, nnew, s.all_rows, 0, (schedule)(n++ % 4)};
        report(c, run(c), "");
    }

    /* a merged pair's two layers (4 of each block's 16 slots retained) */
    const std::vector<int> mlen = {40, 70, 17, 1};
    const std::vector<int> mnew = {1, 1, 3, 1};
    for (int layer = 1; layer <= 2; layer++)
        for (loom_type t : {LOOM_TYPE_F16, LOOM_TYPE_BF16}) {
            const attn_case c = {kv_shape{16, 64, 2, 0, t}, 2, 0, mlen, mnew, false, layer,
                                 (schedule)(n++ % 4)};
            report(c, run(c), "");
        }

    /* batch invariance: a 4099- (2500-) position row alone, then after 65 decode rows and
       before three more (its rows in the second launch, its blocks elsewhere in the pool,
       another schedule): the same bits */
    const struct {
        kv_shape sh;
        int G;
        float cap;
        int long_len;
    } inv[] = {{{16, 128, 2, 0, LOOM_TYPE_F16}, 4, 0, 4099},
               {{8, 64, 1, 1000, LOOM_TYPE_FP8_E4M3}, 8, 30, 2500}};
    for (const auto &s : inv) {
        attn_case alone = {s.sh, s.G, s.cap, {s.long_len}, {1}, false, 0, schedule::breadth};
        attn_case batch = alone;
        batch.order = schedule::random;
        batch.len.clear();
        batch.nnew.clear();
        for (int i = 0; i < 65; i++) batch.len.push_back(1 + (i * 37) % 120);
        batch.len.push_back(s.long_len);
        for (int l : {300, 17, 5}) batch.len.push_back(l);
        batch.nnew.assign(batch.len.size(), 1);
        const attn_result a = run(alone), b = run(batch);
        report(alone, a, "alone");
        report(batch, b, "batch");
        if (a.problem.empty() && b.problem.empty()) {
            const size_t qd = (size_t)a.ld - 4;
            if (memcmp(a.out.data(), &b.out[(size_t)65 * b.ld], qd * 4) != 0) {
                printf("FAIL attention invariance %s: a %d-position row differs alone and in a "
                       "batch\n",
                       describe(alone).c_str(), s.long_len);
                bad++;
            } else if (verbose) {
                printf("  attention invariance %s: the %d-position row the same bits alone and "
                       "in a batch of 69\n",
                       describe(alone).c_str(), s.long_len);
            }
        }
    }

    /* a 16384-position context (splits of 1024) beside a short one */
    {
        const attn_case c = {kv_shape{16, 128, 1, 0, LOOM_TYPE_F16},
                             4,
                             0,
                             {16384, 300},
                             {1, 3},
                             false,
                             0,
                             schedule::depth_reversed};
        report(c, run(c), "16384 positions");
    }

    /* the planted bug's rows, as built (the planted build must fail them: test_kernels_emu) */
    report(long_case(), run(long_case()), "long rows");
    return bad;
}

} // namespace EMU_ATTENTION_NS
