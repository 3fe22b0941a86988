// emu_norm_rope_store.cpp — kernels/norm_rope_store.cu's one launch, run on the emulator against
// the kernels it replaces, also run on the emulator over copies of the same inputs: rms_norm of
// q's and k's heads (elementwise.cu), rope of q and of k (rope.cu), kv_store of k and v
// (kv_store.cu). q, k and the pools (every byte, including those neither wrote) must be the same
// bits. Shapes of llama (no norms, GQA 4), Gemma 3 (norms, one KV head of 256, NeoX), Qwen 3
// (norms, frequency factors, F32 pages), a partial rotation, heads of 320 (more elements than the
// block's threads) and FP8 pages (the launch without the store, kv_store's FP8 kernel after it);
// q and k rows with padding between them; new rows after cached positions in scattered blocks.
#include "elementwise.cu"
#include "kv_store.cu"
#include "norm_rope_store.cu"
#include "rope.cu"

#include <stdio.h>

#include <vector>

#include "emu_cases.h"
#include "emu_util.h"

namespace {

using emu_test::rng;

struct qk_case {
    int n_head, nkv, hd, n_rot, neox;
    bool norms, factors;
    loom_type type;
    int bs;
    int heads_per_block; // kv heads a block takes (several in long steps)
};

loom_emu::launch_options opts(loom_emu::schedule order, uint64_t seed) {
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = seed;
    return opt;
}

// The separate kernels' path: per-head rms_norm of q and k (when normed), rope of q, of k, then
// the store — what the forward pass runs without norm_rope_store.
void run_separate(const loom__k_qk &a, const loom__k_kv &kv, void *kp, void *vp, void *ks, void *vs,
                  loom_emu::schedule order) {
    const loom__k_rope &p = a.rope;
    const int64_t T = p.n_rows;
    for (int which = 0; which < 2; which++) {
        float *x = which ? a.k : a.q;
        const float *w = which ? a.k_norm : a.q_norm;
        const int heads = which ? a.n_kv_heads : p.n_head;
        if (w != nullptr) {
            rms_args ra = {};
            ra.shape.n_rows = T * heads;
            ra.shape.n_cols = p.head_dim;
            ra.shape.x_stride = ra.shape.out_stride = (size_t)p.head_dim * 4;
            ra.shape.y_stride = 0;
            ra.x = x;
            ra.y = nullptr;
            ra.w = w;
            ra.out = x;
            ra.eps = a.eps;
            loom_emu::launch(
                dim3((unsigned)(T * heads)), dim3(RMS_THREADS), 0, [&ra] { rms_norm_kernel(ra); },
                opts(order, 1 + which));
        }
        rope_args ro;
        ro.p = p;
        ro.p.n_head = heads;
        ro.p.x_stride = which ? a.k_stride : a.q_stride;
        ro.x = x;
        loom_emu::launch(
            dim3((unsigned)T), dim3(128), 0, [&ro] { rope_kernel(ro); }, opts(order, 3 + which));
    }
    store_args sa = {kv, a.k, a.v, a.k_stride, a.v_stride, kp, vp, (char *)ks, (char *)vs};
    const dim3 grid((unsigned)T, (unsigned)a.n_kv_heads);
    switch (kv.kv_type) {
    case LOOM_K_F32:
        return loom_emu::launch(
            grid, dim3(128), 0, [&sa] { kv_store_kernel<LOOM_K_F32>(sa); }, opts(order, 5));
    case LOOM_K_F16:
        return loom_emu::launch(
            grid, dim3(128), 0, [&sa] { kv_store_kernel<LOOM_K_F16>(sa); }, opts(order, 5));
    case LOOM_K_BF16:
        return loom_emu::launch(
            grid, dim3(128), 0, [&sa] { kv_store_kernel<LOOM_K_BF16>(sa); }, opts(order, 5));
    default:
        return loom_emu::launch(
            grid, dim3(STORE_THREADS), 0, [&sa] { kv_store_fp8_kernel<LOOM_K_FP8_E4M3>(sa); },
            opts(order, 5));
    }
}

// The fused path: one norm_rope_store launch, storing where the page type allows (as
// loom__cuda_norm_rope_store_op decides), else kv_store's FP8 kernel after it.
void run_fused(const loom__k_qk &a, const loom__k_kv &kv, void *kp, void *vp, void *ks, void *vs,
               int heads_per_block, loom_emu::schedule order) {
    qk_args g = {a, kv, kp, vp, heads_per_block};
    const dim3 grid((unsigned)a.rope.n_rows, (unsigned)(a.n_kv_heads / heads_per_block));
    const dim3 block(LOOM_RMS_THREADS);
    switch (kv.kv_type) {
    case LOOM_K_F32:
        return loom_emu::launch(
            grid, block, 0, [&g] { norm_rope_store_kernel<LOOM_K_F32>(g); }, opts(order, 7));
    case LOOM_K_F16:
        return loom_emu::launch(
            grid, block, 0, [&g] { norm_rope_store_kernel<LOOM_K_F16>(g); }, opts(order, 7));
    case LOOM_K_BF16:
        return loom_emu::launch(
            grid, block, 0, [&g] { norm_rope_store_kernel<LOOM_K_BF16>(g); }, opts(order, 7));
    default:
        break;
    }
    loom_emu::launch(
        grid, block, 0, [&g] { norm_rope_store_kernel<QK_NO_STORE>(g); }, opts(order, 7));
    store_args sa = {kv, a.k, a.v, a.k_stride, a.v_stride, kp, vp, (char *)ks, (char *)vs};
    loom_emu::launch(
        dim3((unsigned)a.rope.n_rows, (unsigned)a.n_kv_heads), dim3(STORE_THREADS), 0,
        [&sa] { kv_store_fp8_kernel<LOOM_K_FP8_E4M3>(sa); }, opts(order, 5));
}

int run_case(const qk_case &qc, loom_emu::schedule order, bool verbose) {
    const emu_test::kv_shape sh = {qc.bs, qc.hd, qc.nkv, 0, qc.type};
    const std::vector<int> len = {1, 40, 19, 70};
    const std::vector<int> nnew = {1, 13, 19, 2};
    rng r(0x9e57 + (uint64_t)qc.hd * 7 + (uint64_t)qc.n_head);
    int used = 0;
    for (int l : len) used += (l + qc.bs - 1) / qc.bs;
    const emu_test::kv_step st =
        emu_test::make_step(sh, len, nnew, emu_test::shuffled_pool(r, used), false);
    const int64_t T = st.n_rows, qd = (int64_t)qc.n_head * qc.hd, kd = (int64_t)qc.nkv * qc.hd;
    const int64_t qld = qd + 3, kld = kd + 5;
    // positions from the descriptor, as the forward pass's
    std::vector<int32_t> pos((size_t)T);
    for (int64_t i = 0; i < T; i++) {
        const int s = st.row_seq[(size_t)i];
        pos[(size_t)i] = st.pos_start[(size_t)s] + (int)i - st.q_start[(size_t)s];
    }
    std::vector<float> q((size_t)(T * qld), NAN), k((size_t)(T * kld), NAN),
        v((size_t)(T * kld), NAN);
    for (int64_t i = 0; i < T; i++) {
        for (int64_t e = 0; e < qd; e++) q[(size_t)(i * qld + e)] = r.uniform(3.0f);
        for (int64_t e = 0; e < kd; e++) {
            k[(size_t)(i * kld + e)] = r.uniform(3.0f);
            v[(size_t)(i * kld + e)] = r.uniform(3.0f);
        }
    }
    std::vector<float> qn((size_t)qc.hd), kn((size_t)qc.hd), ff((size_t)qc.n_rot / 2);
    for (float &x : qn) x = 0.5f + r.uniform(1.0f);
    for (float &x : kn) x = 0.5f + r.uniform(1.0f);
    for (float &f : ff) f = 1.0f + 7.0f * (float)r.below(100) / 100.0f;
    // The normed views need contiguous rows: the separate path gets q and k copies without
    // padding; the fused one keeps the padding (it reads rows at their strides).
    const bool pad = !qc.norms;
    const int64_t qs = pad ? qld : qd, ks = pad ? kld : kd;
    std::vector<float> q1((size_t)(T * qs), NAN), k1((size_t)(T * ks), NAN);
    for (int64_t i = 0; i < T; i++) {
        memcpy(&q1[(size_t)(i * qs)], &q[(size_t)(i * qld)], (size_t)qd * 4);
        memcpy(&k1[(size_t)(i * ks)], &k[(size_t)(i * kld)], (size_t)kd * 4);
    }
    std::vector<float> q2 = q1, k2 = k1;

    loom__k_qk a;
    memset(&a, 0, sizeof a);
    a.rope.n_rows = T;
    a.rope.n_head = qc.n_head;
    a.rope.head_dim = qc.hd;
    a.rope.n_rot = qc.n_rot;
    a.rope.neox = qc.neox;
    a.rope.theta_base = qc.factors ? 500000.0f : 10000.0f;
    a.rope.freq_scale = qc.factors ? 1.0f : 0.5f;
    a.rope.freq_factors = qc.factors ? ff.data() : nullptr;
    a.rope.pos = pos.data();
    a.n_kv_heads = qc.nkv;
    a.q_stride = (size_t)qs * 4;
    a.k_stride = (size_t)ks * 4;
    a.v = v.data();
    a.v_stride = (size_t)kld * 4;
    a.q_norm = qc.norms ? qn.data() : nullptr;
    a.k_norm = qc.norms ? kn.data() : nullptr;
    a.eps = 1e-6f;
    const loom__k_kv kv = emu_test::kernel_desc(st);

    emu_test::kv_pools p1, p2;
    emu_test::pools_make(st, &p1);
    emu_test::pools_make(st, &p2);
    a.q = q1.data();
    a.k = k1.data();
    run_separate(a, kv, p1.kb[0], p1.vb[0], p1.ks[0], p1.vs[0], order);
    a.q = q2.data();
    a.k = k2.data();
    run_fused(a, kv, p2.kb[0], p2.vb[0], p2.ks[0], p2.vs[0], qc.heads_per_block, order);

    emu_test::problems pr;
    for (size_t i = 0; i < q1.size(); i++)
        if (!emu_test::same_bits(q1[i], q2[i]))
            pr.add("q row %zu, element %zu: %.9g, the separate kernels' %.9g", i / (size_t)qs,
                   i % (size_t)qs, (double)q2[i], (double)q1[i]);
    for (size_t i = 0; i < k1.size(); i++)
        if (!emu_test::same_bits(k1[i], k2[i]))
            pr.add("k row %zu, element %zu: %.9g, the separate kernels' %.9g", i / (size_t)ks,
                   i % (size_t)ks, (double)k2[i], (double)k1[i]);
    for (int w = 0; w < 2; w++) {
        const std::vector<unsigned char> &g = w ? p2.v : p2.k, &e = w ? p1.v : p1.k;
        for (size_t i = 0; i < g.size(); i++)
            if (g[i] != e[i])
                pr.add("%c pool byte %zu: 0x%02x, the separate kernels' 0x%02x", "KV"[w], i, g[i],
                       e[i]);
    }
    // the rotation must have moved something (a launch that did nothing would match nothing)
    int moved = 0;
    for (int64_t e = 0; e < qd; e++)
        moved += q2[(size_t)(T - 1) * qs + e] != q[(size_t)(T - 1) * qld + e];
    if (moved == 0) pr.add("the last row's q is unchanged");
    const char *name = emu_test::type_name(qc.type);
    if (pr.n) {
        printf("FAIL norm_rope_store %d/%d heads of %d, n_rot %d %s%s%s, %s pages: %s (%d "
               "differ)\n",
               qc.n_head, qc.nkv, qc.hd, qc.n_rot, qc.neox ? "neox" : "normal",
               qc.norms ? " normed" : "", qc.factors ? " factors" : "", name, pr.first.c_str(),
               pr.n);
        return 1;
    }
    if (verbose)
        printf("  norm_rope_store %2d/%d heads of %3d, n_rot %3d %-6s %-6s %-7s %-8s %-9s: %lld "
               "rows%s, the separate kernels' bits\n",
               qc.n_head, qc.nkv, qc.hd, qc.n_rot, qc.neox ? "neox" : "normal",
               qc.norms ? "normed" : "", qc.factors ? "factors" : "", name,
               emu_test::order_name(order), (long long)T,
               qc.heads_per_block > 1 ? " (kv heads a block > 1)" : "");
    return 0;
}

} // namespace

namespace emu_norm_rope_store {

int run_all(bool verbose) {
    const qk_case cases[] = {
        {8, 2, 64, 64, 0, false, true, LOOM_TYPE_F16, 16, 1},   // llama
        {8, 2, 64, 64, 0, false, true, LOOM_TYPE_F16, 16, 2},   // llama, a block a row
        {4, 1, 256, 256, 1, true, false, LOOM_TYPE_BF16, 8, 1}, // Gemma 3
        {6, 2, 128, 128, 1, true, true, LOOM_TYPE_F32, 1, 1},   // Qwen 3
        {6, 2, 128, 128, 1, true, true, LOOM_TYPE_F32, 1, 2},   // Qwen 3, a block a row
        {8, 4, 96, 32, 0, true, false, LOOM_TYPE_F16, 16, 2},   // partial rotation, 2 a block
        {2, 1, 320, 320, 0, true, true, LOOM_TYPE_BF16, 8, 1},  // heads past the threads
        {8, 2, 128, 128, 1, true, false, LOOM_TYPE_FP8_E4M3, 16, 1},
        {3, 3, 64, 64, 1, false, false, LOOM_TYPE_FP8_E4M3, 8, 3},
    };
    int bad = 0;
    /* every schedule: a missing barrier shows under some orders of the threads only */
    for (const qk_case &qc : cases)
        for (int order = 0; order < 4; order++)
            bad += run_case(qc, (loom_emu::schedule)order, verbose);
    return bad;
}

} // namespace emu_norm_rope_store
