// emu_kv_store.cpp — kernels/kv_store.cu's KV write, compiled from that file, run on the emulator
// against the CPU backend's kv_store: the same step (sequences of 1 to 97 new rows after cached
// positions, their blocks scattered over a shuffled pool, slots and blocks with spare bytes
// between them) written into two poisoned copies of the pools, which must then be the same
// bytes everywhere — the pages, the FP8 scales, and every byte neither wrote (test_cuda_ops'
// bitwise check). F32, F16 and BF16 pages (values past the half's range and in its subnormals
// among them), FP8 E4M3 and E5M2 with a scale per (position, head) (a head row of zeros: scale 0;
// one with a NaN: scale NaN); block sizes 1, 8 and 16; heads of 40 to 256 elements (fewer and
// more than the block's 128 threads); 1 to 4 KV heads.
#include "kv_store.cu"

#include <stdio.h>

#include <vector>

#include "emu_cases.h"
#include "emu_util.h"

namespace {

using emu_test::rng;

template <int KV> void launch_store(const store_args &a, loom_emu::schedule order) {
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = (uint64_t)a.kv.n_rows + KV;
    const dim3 grid((unsigned)a.kv.n_rows, (unsigned)a.kv.n_kv_heads);
    if (KV == LOOM_K_FP8_E4M3 || KV == LOOM_K_FP8_E5M2)
        loom_emu::launch(
            grid, dim3(STORE_THREADS), 0, [&a] { kv_store_fp8_kernel<KV>(a); }, opt);
    else
        loom_emu::launch(
            grid, dim3(128), 0, [&a] { kv_store_kernel<KV>(a); }, opt);
}

void launch_any(const store_args &a, loom_emu::schedule order) {
    switch (a.kv.kv_type) {
    case LOOM_K_F32:
        return launch_store<LOOM_K_F32>(a, order);
    case LOOM_K_F16:
        return launch_store<LOOM_K_F16>(a, order);
    case LOOM_K_BF16:
        return launch_store<LOOM_K_BF16>(a, order);
    case LOOM_K_FP8_E4M3:
        return launch_store<LOOM_K_FP8_E4M3>(a, order);
    default:
        return launch_store<LOOM_K_FP8_E5M2>(a, order);
    }
}

// One row of one head: random values with a few extremes (FP8: codes far below the largest
// one's scale, subnormal codes and zeros).
void fill_head(rng &r, float *x, int hd) {
    for (int e = 0; e < hd; e++) {
        const uint64_t k = r.below(50);
        float v = r.uniform(2.0f);
        if (k == 0) v = r.uniform(1.0f) * 1e5f;  /* past the half's range */
        if (k == 1) v = r.uniform(1.0f) * 1e-6f; /* the half's subnormals */
        if (k == 2) v = 0.0f;
        x[e] = v;
    }
}

int run_case(const emu_test::kv_shape &sh, loom_emu::schedule order, bool verbose) {
    const std::vector<int> len = {1, 54, 97, 130, 9, 33};
    const std::vector<int> nnew = {1, 20, 97, 15, 9, 1};
    rng r(0x5702 + (uint64_t)sh.hd * 13 + (uint64_t)sh.type);
    int used = 0;
    for (int l : len) used += (l + sh.bs - 1) / sh.bs;
    const emu_test::kv_step st =
        emu_test::make_step(sh, len, nnew, emu_test::shuffled_pool(r, used), false);
    const bool fp8 = emu_test::is_fp8(sh.type);
    const int64_t kvd = (int64_t)sh.nkv * sh.hd, ld = kvd + 3;
    std::vector<float> k((size_t)(st.n_rows * ld), NAN), v((size_t)(st.n_rows * ld), NAN);
    for (int64_t i = 0; i < st.n_rows; i++)
        for (int h = 0; h < sh.nkv; h++) {
            fill_head(r, &k[i * ld + h * sh.hd], sh.hd);
            fill_head(r, &v[i * ld + h * sh.hd], sh.hd);
        }
    if (fp8) { /* a head row of zeros, and one with a NaN */
        for (int e = 0; e < sh.hd; e++) k[5 * ld + e] = 0.0f;
        v[7 * ld + (sh.nkv - 1) * sh.hd + 3] = NAN;
    }

    emu_test::kv_pools gp, cp;
    emu_test::pools_make(st, &gp);
    emu_test::pools_make(st, &cp);
    store_args a;
    a.kv = emu_test::kernel_desc(st);
    a.k = k.data();
    a.v = v.data();
    a.k_stride = a.v_stride = (size_t)ld * 4;
    a.k_pool = gp.kb[0];
    a.v_pool = gp.vb[0];
    a.k_scale = fp8 ? (char *)gp.ks[0] : nullptr;
    a.v_scale = fp8 ? (char *)gp.vs[0] : nullptr;
    launch_any(a, order);

    const loom_kv_desc d = emu_test::cpu_desc(st, cp);
    const loom__backend_stream &c = emu_test::cpu();
    loom_tensor tk = emu_test::view(LOOM_TYPE_F32, k.data(), kvd, st.n_rows, (size_t)ld * 4);
    loom_tensor tv = emu_test::view(LOOM_TYPE_F32, v.data(), kvd, st.n_rows, (size_t)ld * 4);
    emu_test::cpu_ok(c.ops->kv_store(c.ctx, &tk, &tv, &d, 0), "cpu kv_store");

    emu_test::problems pr;
    for (int kv = 0; kv < 2; kv++) {
        const std::vector<unsigned char> &g = kv ? gp.v : gp.k, &e = kv ? cp.v : cp.k;
        for (size_t i = 0; i < g.size(); i++) {
            if (g[i] == e[i]) continue;
            const size_t blk = i / st.block, in = i % st.block;
            if (in >= st.scale_at)
                pr.add("%c pool: block %zu, the scale of slot %zu, byte %zu differs", "KV"[kv], blk,
                       (in - st.scale_at) / (st.scale_token ? st.scale_token : 1),
                       (in - st.scale_at) % (st.scale_token ? st.scale_token : 1));
            else
                pr.add("%c pool: block %zu, slot %zu, byte %zu: 0x%02x, the CPU's 0x%02x", "KV"[kv],
                       blk, in / st.token, in % st.token, g[i], e[i]);
        }
    }
    if (pr.n) {
        printf("FAIL kv_store %s bs=%d hd=%d kv_heads=%d: %s (%d bytes differ)\n",
               emu_test::type_name(sh.type), sh.bs, sh.hd, sh.nkv, pr.first.c_str(), pr.n);
        return 1;
    }
    if (verbose)
        printf("  kv_store %-8s bs=%2d hd=%3d kv_heads=%d %-9s: %d rows, pools the CPU's bytes\n",
               emu_test::type_name(sh.type), sh.bs, sh.hd, sh.nkv, emu_test::order_name(order),
               st.n_rows);
    return 0;
}

} // namespace

namespace emu_kv_store {

int run_all(bool verbose) {
    const emu_test::kv_shape shapes[] = {
        {16, 128, 2, 0, LOOM_TYPE_F16},     {8, 64, 3, 0, LOOM_TYPE_BF16},
        {1, 256, 1, 0, LOOM_TYPE_F32},      {16, 64, 2, 0, LOOM_TYPE_FP8_E4M3},
        {8, 256, 1, 0, LOOM_TYPE_FP8_E5M2}, {1, 40, 3, 0, LOOM_TYPE_FP8_E4M3},
        {8, 80, 2, 0, LOOM_TYPE_F16},       {16, 96, 4, 0, LOOM_TYPE_FP8_E5M2},
    };
    int bad = 0, n = 0;
    for (const emu_test::kv_shape &sh : shapes)
        bad += run_case(sh, (loom_emu::schedule)(n++ % 4), verbose);
    return bad;
}

} // namespace emu_kv_store
