// emu_rope.cpp — kernels/rope.cu's rotary embedding, compiled from that file, run on the emulator
// against the CPU backend's rope: normal (adjacent pairs) and NeoX (halves) layouts, every head
// rotated, n_rot below head_dim (the rest of each head untouched), 160 frequencies (threads loop
// past 128), frequency factors (llama3) and linear position scaling on and off, two bases; 17
// rows at positions 0, 16383, 1000000 and random ones, rows 5 floats of padding apart. Within
// 1e-6 of each row's largest value (test_cuda_ops': the same double angles, the device's pow and
// sincos a few ulps from glibc's); the padding must stay NaN.
#include "rope.cu"

#include <stdio.h>

#include <vector>

#include "emu_cases.h"
#include "emu_util.h"

namespace {

using emu_test::rng;

struct rope_case {
    int n_head, head_dim, n_rot, neox;
};

int run_case(const rope_case &rc, bool factors, loom_emu::schedule order, bool verbose) {
    const int64_t T = 17, D = (int64_t)rc.n_head * rc.head_dim, ld = D + 5;
    rng r(0x20fe + (uint64_t)rc.head_dim * 3 + (uint64_t)factors);
    std::vector<float> x((size_t)(T * ld), NAN), xd((size_t)(T * D)), ff((size_t)rc.n_rot / 2);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < D; i++) x[t * ld + i] = r.uniform(2.0f);
        memcpy(&xd[t * D], &x[t * ld], (size_t)D * 4);
    }
    for (float &f : ff) f = 1.0f + 7.0f * (float)r.below(100) / 100.0f;
    std::vector<int32_t> pos((size_t)T);
    for (int32_t &p : pos) p = (int32_t)r.below(16384);
    pos[0] = 0;
    pos[1] = 16383;
    pos[2] = 1000000;

    loom__k_rope p;
    p.n_rows = T;
    p.x_stride = (size_t)ld * 4;
    p.n_head = rc.n_head;
    p.head_dim = rc.head_dim;
    p.n_rot = rc.n_rot;
    p.neox = rc.neox;
    p.theta_base = factors ? 500000.0f : 10000.0f;
    p.freq_scale = factors ? 1.0f : 0.25f;
    p.freq_factors = factors ? ff.data() : nullptr;
    p.pos = pos.data();
    const rope_args a = {p, x.data()};
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = (uint64_t)D;
    loom_emu::launch(
        dim3((unsigned)T), dim3(128), 0, [&a] { rope_kernel(a); }, opt);

    loom_rope_params cp;
    memset(&cp, 0, sizeof cp);
    cp.mode = rc.neox ? LOOM_ROPE_NEOX : LOOM_ROPE_NORMAL;
    cp.n_head = rc.n_head;
    cp.head_dim = rc.head_dim;
    cp.n_rot = rc.n_rot;
    cp.theta_base = p.theta_base;
    cp.freq_scale = p.freq_scale;
    cp.freq_factors = p.freq_factors;
    const loom__backend_stream &c = emu_test::cpu();
    loom_tensor tx = emu_test::view(LOOM_TYPE_F32, xd.data(), D, T, (size_t)D * 4);
    loom_tensor tp = emu_test::view(LOOM_TYPE_I32, pos.data(), T, 1, (size_t)T * 4);
    emu_test::cpu_ok(c.ops->rope(c.ctx, &tx, &tp, &cp), "cpu rope");

    emu_test::problems pr;
    double worst = 0;
    for (int64_t t = 0; t < T; t++) {
        const double err = emu_test::norm_err(&x[t * ld], &xd[t * D], (size_t)D);
        if (!(err <= 1e-6))
            pr.add("row %lld (position %d): normalised error %.3g", (long long)t, pos[t], err);
        worst = std::max(worst, err);
        for (int64_t i = D; i < ld; i++)
            if (!std::isnan(x[t * ld + i]))
                pr.add("row %lld: its padding was written", (long long)t);
    }
    if (pr.n) {
        printf("FAIL rope n_head=%d head_dim=%d n_rot=%d %s%s: %s\n", rc.n_head, rc.head_dim,
               rc.n_rot, rc.neox ? "neox" : "normal", factors ? " factors" : "", pr.first.c_str());
        return 1;
    }
    if (verbose)
        printf("  rope %d x %3d n_rot=%3d %-6s %-13s %-9s: worst %.2g\n", rc.n_head, rc.head_dim,
               rc.n_rot, rc.neox ? "neox" : "normal", factors ? "factors" : "freq_scale 1/4",
               emu_test::order_name(order), worst);
    return 0;
}

} // namespace

namespace emu_rope {

int run_all(bool verbose) {
    const rope_case cases[] = {{8, 64, 64, 0}, {4, 128, 128, 1}, {2, 256, 256, 1},
                               {6, 96, 32, 0}, {3, 128, 64, 1},  {2, 320, 320, 0}};
    int bad = 0, n = 0;
    for (const rope_case &rc : cases)
        for (int factors = 0; factors < 2; factors++)
            bad += run_case(rc, factors != 0, (loom_emu::schedule)(n++ % 4), verbose);
    return bad;
}

} // namespace emu_rope
