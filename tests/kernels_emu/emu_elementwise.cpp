// emu_elementwise.cpp — kernels/elementwise.cu's kernels, compiled from that file, run on the
// emulator against the CPU backend's ops: rms_norm with and without a weight, add_rms_norm (the
// sum left in x bit for bit the CPU's add), norm_add_rms_norm (against the kernels it replaces),
// add (a row of its own or one broadcast row), scale, and the gated activations (SwiGLU, GeGLU with
// tanh). Rows of 1000 (a partial block of 256), 1, 17 and 64 of them, and of 100 (fewer than a
// block's threads), rows 3 floats of padding apart; out apart from x and in place (x as out, where
// the op allows); rows of 263000 values for scale and GeGLU (more than the grid's 1024 blocks of
// 256 threads: the column loop). Tolerances are test_cuda_ops': add and scale (one float operation
// an element) bit for bit, rms_norm and the activations within 2e-6 of the row's largest value (the
// sum of squares in another order; the host's expf and tanhf against the CPU's own). Outputs are
// poisoned (NaN); the padding must stay so.
#include "elementwise.cu"

#include <stdio.h>

#include <vector>

#include "emu_cases.h"
#include "emu_util.h"

namespace {

using emu_test::rng;

enum kind { K_RMS, K_RMS_NOW, K_ADD_RMS, K_ADD, K_ADD_ROW, K_SCALE, K_SWIGLU, K_GEGLU };
const char *const kind_names[] = {"rms_norm",  "rms_norm (no w)", "add_rms_norm", "add",
                                  "add (row)", "scale",           "swiglu",       "geglu_tanh"};

const float SCALE = 0.37f;

void launch(kind k, int64_t R, int64_t D, float *x, const float *y, size_t y_stride, const float *w,
            float *out, size_t stride, loom_emu::schedule order) {
    const loom__k_rows shape = {R, D, stride, k == K_ADD_ROW ? 0 : y_stride, stride};
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = (uint64_t)(R * 7 + D + k);
    if (k == K_RMS || k == K_RMS_NOW || k == K_ADD_RMS) {
        const float eps = k == K_RMS_NOW ? 1e-5f : 1e-6f;
        const rms_args a = {
            shape, x,      k == K_ADD_RMS ? y : nullptr, k == K_RMS_NOW ? nullptr : w, out,
            eps,   nullptr};
        loom_emu::launch(
            dim3((unsigned)R), dim3(RMS_THREADS), 0, [&a] { rms_norm_kernel(a); }, opt);
        return;
    }
    /* the grid of ew_launch */
    const int64_t bx = std::min<int64_t>(loom_cdiv(D, 256), 1024);
    const dim3 grid((unsigned)bx, (unsigned)std::min<int64_t>(R, 65535));
    const ew_args a = {shape, x, k == K_ADD_ROW ? w : y, out, SCALE};
    switch (k) {
    case K_ADD:
    case K_ADD_ROW:
        return loom_emu::launch(
            grid, dim3(256), 0, [&a] { ew_kernel<EW_ADD>(a); }, opt);
    case K_SCALE:
        return loom_emu::launch(
            grid, dim3(256), 0, [&a] { ew_kernel<EW_SCALE>(a); }, opt);
    case K_SWIGLU:
        return loom_emu::launch(
            grid, dim3(256), 0, [&a] { ew_kernel<EW_SILU>(a); }, opt);
    default:
        return loom_emu::launch(
            grid, dim3(256), 0, [&a] { ew_kernel<EW_GELU_TANH>(a); }, opt);
    }
}

// The CPU's op on dense copies (x updated in place for add_rms_norm).
void reference(kind k, int64_t R, int64_t D, float *x, const float *y, const float *w, float *out) {
    const loom__backend_stream &c = emu_test::cpu();
    loom_tensor tx = emu_test::view(LOOM_TYPE_F32, x, D, R, D * 4);
    loom_tensor ty = emu_test::view(LOOM_TYPE_F32, y, D, R, D * 4);
    loom_tensor tw = emu_test::view(LOOM_TYPE_F32, w, D, 1, D * 4);
    loom_tensor to = emu_test::view(LOOM_TYPE_F32, out, D, R, D * 4);
    loom_status st = LOOM_OK;
    switch (k) {
    case K_RMS:
        st = c.ops->rms_norm(c.ctx, &tx, &tw, 1e-6f, &to);
        break;
    case K_RMS_NOW:
        st = c.ops->rms_norm(c.ctx, &tx, nullptr, 1e-5f, &to);
        break;
    case K_ADD_RMS:
        if (c.ops->add_rms_norm) {
            st = c.ops->add_rms_norm(c.ctx, &tx, &ty, &tw, 1e-6f, &to);
        } else {
            st = c.ops->add(c.ctx, &tx, &ty, &tx);
            if (st == LOOM_OK) st = c.ops->rms_norm(c.ctx, &tx, &tw, 1e-6f, &to);
        }
        break;
    case K_ADD:
        st = c.ops->add(c.ctx, &tx, &ty, &to);
        break;
    case K_ADD_ROW:
        st = c.ops->add(c.ctx, &tx, &tw, &to);
        break;
    case K_SCALE:
        st = c.ops->scale(c.ctx, &tx, SCALE, &to);
        break;
    case K_SWIGLU:
        st = c.ops->glu(c.ctx, &tx, &ty, LOOM_GLU_SWIGLU, &to);
        break;
    default:
        st = c.ops->glu(c.ctx, &tx, &ty, LOOM_GLU_GEGLU_TANH, &to);
        break;
    }
    emu_test::cpu_ok(st, kind_names[k]);
}

int run_case(kind k, int64_t R, int64_t D, bool inplace, loom_emu::schedule order, bool verbose) {
    const int64_t ld = D + 3; /* floats between rows */
    rng r(0xe1e + (uint64_t)k * 1000 + (uint64_t)R * 10 + (uint64_t)inplace);
    std::vector<float> x((size_t)(R * ld), NAN), y((size_t)(R * ld), NAN), w((size_t)D);
    std::vector<float> xd((size_t)(R * D)), yd((size_t)(R * D)); /* dense copies: the CPU's */
    for (int64_t i = 0; i < R; i++) {
        emu_test::fill_acts(r, &x[i * ld], (size_t)D, 3.0f);
        emu_test::fill_acts(r, &y[i * ld], (size_t)D, 1.0f);
        memcpy(&xd[i * D], &x[i * ld], (size_t)D * 4);
        memcpy(&yd[i * D], &y[i * ld], (size_t)D * 4);
    }
    for (float &f : w) f = r.uniform(1.5f);
    std::vector<float> out_buf(inplace ? 0 : (size_t)(R * ld), NAN), ref((size_t)(R * D), NAN);
    float *out = inplace ? x.data() : out_buf.data();
    launch(k, R, D, x.data(), y.data(), (size_t)ld * 4, w.data(), out, (size_t)ld * 4, order);
    reference(k, R, D, xd.data(), yd.data(), w.data(), ref.data());

    const bool exact = k == K_ADD || k == K_ADD_ROW || k == K_SCALE;
    emu_test::problems pr;
    double worst = 0;
    for (int64_t i = 0; i < R; i++) {
        const float *o = out + i * ld, *e = &ref[(size_t)(i * D)];
        for (int64_t j = D; j < ld; j++)
            if (!std::isnan(o[j])) pr.add("row %lld: its padding was written", (long long)i);
        if (exact) {
            for (int64_t j = 0; j < D; j++)
                if (!emu_test::same_bits(o[j], e[j]))
                    pr.add("row %lld [%lld] = %.9g, the CPU's %.9g", (long long)i, (long long)j,
                           (double)o[j], (double)e[j]);
            continue;
        }
        const double err = emu_test::norm_err(o, e, (size_t)D);
        if (!(err <= 2e-6)) pr.add("row %lld: normalised error %.3g", (long long)i, err);
        worst = std::max(worst, err);
        if (k == K_ADD_RMS && memcmp(&x[i * ld], &xd[i * D], (size_t)D * 4) != 0)
            pr.add("row %lld: the sum left in x is not the CPU's add", (long long)i);
    }
    if (pr.n) {
        printf("FAIL elementwise %s, %lld rows of %lld%s: %s\n", kind_names[k], (long long)R,
               (long long)D, inplace ? ", in place" : "", pr.first.c_str());
        return 1;
    }
    if (verbose)
        printf("  elementwise %-15s %2lld x %6lld%-10s %-9s: %s %.2g\n", kind_names[k],
               (long long)R, (long long)D, inplace ? " in place" : "", emu_test::order_name(order),
               exact ? "the CPU's bits" : "worst", worst);
    return 0;
}

// norm_add_rms_norm (Gemma's post-norm, the residual add and the next norm in one launch)
// against the two launches it replaces, run here too: rms_norm of y in place, then
// add_rms_norm. The sum left in x and out must be the same bits, and y must be left as it came.
int run_norm_add(int64_t R, int64_t D, bool with_w, loom_emu::schedule order, bool verbose) {
    const int64_t ld = D + 3;
    rng r(0x90a + (uint64_t)R * 10 + (uint64_t)D);
    std::vector<float> x1((size_t)(R * ld), NAN), y((size_t)(R * ld), NAN), wy((size_t)D),
        w((size_t)D);
    for (int64_t i = 0; i < R; i++) {
        emu_test::fill_acts(r, &x1[(size_t)(i * ld)], (size_t)D, 3.0f);
        emu_test::fill_acts(r, &y[(size_t)(i * ld)], (size_t)D, 40.0f);
    }
    for (float &f : wy) f = r.uniform(1.5f);
    for (float &f : w) f = r.uniform(1.5f);
    std::vector<float> x2 = x1, y1 = y, y2 = y, out1((size_t)(R * ld), NAN),
                       out2((size_t)(R * ld), NAN);
    const loom__k_rows shape = {R, D, (size_t)ld * 4, (size_t)ld * 4, (size_t)ld * 4};
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = (uint64_t)(R + D);
    const rms_args pre = {shape, y1.data(), nullptr, wy.data(), y1.data(), 1e-6f, nullptr};
    loom_emu::launch(
        dim3((unsigned)R), dim3(RMS_THREADS), 0, [&pre] { rms_norm_kernel(pre); }, opt);
    const float *wn = with_w ? w.data() : nullptr; /* the next norm's weight, or none */
    const rms_args add = {shape, x1.data(), y1.data(), wn, out1.data(), 1e-6f, nullptr};
    loom_emu::launch(
        dim3((unsigned)R), dim3(RMS_THREADS), 0, [&add] { rms_norm_kernel(add); }, opt);
    const rms_args one = {shape, x2.data(), y2.data(), wn, out2.data(), 1e-6f, wy.data()};
    loom_emu::launch(
        dim3((unsigned)R), dim3(RMS_THREADS), 0, [&one] { rms_norm_kernel(one); }, opt);
    emu_test::problems pr;
    if (memcmp(x1.data(), x2.data(), x1.size() * 4) != 0) pr.add("the sum left in x differs");
    if (memcmp(out1.data(), out2.data(), out1.size() * 4) != 0) pr.add("out differs");
    if (memcmp(y.data(), y2.data(), y.size() * 4) != 0) pr.add("y was written");
    if (memcmp(y.data(), y1.data(), y.size() * 4) == 0) pr.add("the separate rms_norm did nothing");
    if (pr.n) {
        printf("FAIL elementwise norm_add_rms_norm, %lld rows of %lld: %s\n", (long long)R,
               (long long)D, pr.first.c_str());
        return 1;
    }
    if (verbose)
        printf("  elementwise norm_add_rms_norm %2lld x %6lld%-7s %-9s: the two launches' bits\n",
               (long long)R, (long long)D, with_w ? "" : " (no w)", emu_test::order_name(order));
    return 0;
}

} // namespace

namespace emu_elementwise {

int run_all(bool verbose) {
    int bad = 0, n = 0;
    const int64_t rows[] = {1, 17, 64};
    for (int k = K_RMS; k <= K_GEGLU; k++)
        for (int ri = 0; ri < 3; ri++)
            for (int inplace = 0; inplace < 2; inplace++) {
                if (inplace && (k == K_ADD_RMS || k == K_ADD_ROW)) continue; /* out apart */
                if (inplace && ri != 1) continue;                            /* in place: 17 rows */
                bad += run_case((kind)k, rows[ri], 1000, inplace != 0,
                                (loom_emu::schedule)(n++ % 4), verbose);
            }
    /* rows shorter than a block (idle threads), and rows longer than the grid's threads */
    bad += run_case(K_RMS, 17, 100, false, loom_emu::schedule::depth_reversed, verbose);
    bad += run_case(K_ADD_RMS, 5, 100, false, loom_emu::schedule::random, verbose);
    bad += run_case(K_SWIGLU, 5, 100, true, loom_emu::schedule::breadth, verbose);
    bad += run_case(K_SCALE, 2, 263000, false, loom_emu::schedule::random, verbose);
    bad += run_case(K_GEGLU, 1, 263000, true, loom_emu::schedule::depth, verbose);
    for (int order = 0; order < 4; order++) { /* every schedule, as norm_rope_store's */
        const loom_emu::schedule o = (loom_emu::schedule)order;
        bad += run_norm_add(17, 1000, true, o, verbose);
        bad += run_norm_add(3, 640, true, o, verbose); /* Gemma 3 270M's width */
        bad += run_norm_add(2, 100, order % 2 == 0, o, verbose);
    }
    return bad;
}

} // namespace emu_elementwise
