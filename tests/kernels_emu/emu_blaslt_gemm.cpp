// emu_blaslt_gemm.cpp — the kernels of kernels/blaslt_gemm.cu (around cuBLASLt's GEMMs, which are
// host code), compiled from that file, run on the emulator, bit for bit against what their
// contract (loom_kernels.h) computes with loom's one FP8 conversion (tensor/fp8.h, the CPU's):
// activations to E4M3 with one scale per token, max |x_t| / 448 (a zero row: scale 0, codes 0),
// over rows of 1000 and 4099 values (fewer and more than the block's 256 threads; outliers,
// values in E4M3's subnormals after scaling), the padding after each row of codes untouched;
// the epilogue out[t][n] *= scale(row n) * token_scale[t] over 300 rows (a partial block of
// 256) and 3 tokens, each row's scale where FP8 rows keep it (K = 1000 and 1001: after the codes
// padded to 4 bytes), the padding of out untouched; and activations to BF16 against a rounding
// written here from the format (nearest even; halfway cases, overflow to infinity, NaN, signed
// zeros, subnormals), rows of 1000 and 20000 values (a grid of 4 and of 64 pieces per row, the
// latter looping), the padding untouched.
#include "blaslt_gemm.cu"

#include <stdio.h>

#include <vector>

#include "emu_cases.h"
#include "emu_util.h"

namespace {

using emu_test::rng;

int run_quant(int64_t K, int T, loom_emu::schedule order, bool verbose) {
    rng r(0xf8 + (uint64_t)K);
    const int64_t xs = K + 3, qs = K + 5;
    std::vector<float> x((size_t)(T * xs), NAN);
    for (int t = 0; t < T; t++) emu_test::fill_acts(r, &x[t * xs], (size_t)K, 1.0f);
    for (int64_t i = 0; i < K; i++) x[1 * xs + i] = 0.0f;             /* a zero row */
    for (int64_t i = 0; i < K; i++) x[2 * xs + i] = r.uniform(1e-3f); /* tiny values */
    x[2 * xs + K / 3] = 5e4f;                                         /* and an outlier */
    std::vector<uint8_t> q((size_t)(T * qs), 0xa5);
    std::vector<float> scale((size_t)T + 1, NAN);
    const quant_args a = {x.data(), (size_t)xs * 4, K, q.data(), (size_t)qs, scale.data()};
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = (uint64_t)K;
    loom_emu::launch(
        dim3((unsigned)T), dim3(QUANT_THREADS), 0, [&a] { quant_kernel(a); }, opt);

    emu_test::problems pr;
    for (int t = 0; t < T; t++) {
        float amax = 0.0f;
        for (int64_t i = 0; i < K; i++) amax = std::max(amax, fabsf(x[t * xs + i]));
        const float s = amax / 448.0f;
        if (!emu_test::same_bits(scale[t], s))
            pr.add("token %d: scale %.9g, want %.9g", t, (double)scale[t], (double)s);
        for (int64_t i = 0; i < K; i++) {
            const uint8_t want = s > 0.0f ? loom__f32_to_fp8_e4m3(x[t * xs + i] / s) : 0;
            if (q[t * qs + i] != want)
                pr.add("token %d [%lld]: code 0x%02x, want 0x%02x", t, (long long)i, q[t * qs + i],
                       want);
        }
        for (int64_t i = K; i < qs; i++)
            if (q[t * qs + i] != 0xa5) pr.add("token %d: the padding after its codes written", t);
    }
    if (!std::isnan(scale[T])) pr.add("a scale past the last token written");
    if (pr.n) {
        printf("FAIL fp8 quantize k=%lld: %s\n", (long long)K, pr.first.c_str());
        return 1;
    }
    if (verbose)
        printf(
            "  fp8 quantize k=%4lld, %d tokens %-9s: codes and scales the bits of tensor/fp8.h\n",
            (long long)K, T, emu_test::order_name(order));
    return 0;
}

int run_scale(int64_t K, loom_emu::schedule order, bool verbose) {
    const int64_t N = 300, T = 3, os = N + 3;
    rng r(0x5ca1e + (uint64_t)K);
    const size_t rb = emu_test::row_bytes(LOOM_TYPE_FP8_E4M3_ROWS, K), stride = rb + 4;
    std::vector<uint8_t> w((size_t)(N - 1) * stride + rb, 0xff);
    for (int64_t n = 0; n < N; n++)
        emu_test::make_weight_row(r, LOOM_K_FP8_ROWS, K, &w[n * stride]);
    std::vector<float> out((size_t)(T * os), NAN), ts((size_t)T), before;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t n = 0; n < N; n++) out[t * os + n] = r.uniform(300.0f);
        ts[t] = 1e-3f + r.uniform(1e-3f);
    }
    before = out;
    const scale_args a = {loom__k_weight{LOOM_K_FP8_ROWS, K, N, stride, w.data()}, out.data(),
                          (size_t)os * 4, T, ts.data()};
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = (uint64_t)K * 3;
    loom_emu::launch(
        dim3((unsigned)loom_cdiv(N, 256), (unsigned)T), dim3(256), 0, [&a] { scale_kernel(a); },
        opt);
    emu_test::problems pr;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t n = 0; n < N; n++) {
            float ws;
            memcpy(&ws, &w[n * stride + ((K + 3) & ~(int64_t)3)], 4);
            const float want = before[t * os + n] * (ws * ts[t]);
            if (!emu_test::same_bits(out[t * os + n], want))
                pr.add("out[%lld][%lld] = %.9g, want %.9g", (long long)t, (long long)n,
                       (double)out[t * os + n], (double)want);
        }
        for (int64_t n = N; n < os; n++)
            if (!std::isnan(out[t * os + n]))
                pr.add("token %lld: the padding written", (long long)t);
    }
    if (pr.n) {
        printf("FAIL fp8 epilogue k=%lld: %s\n", (long long)K, pr.first.c_str());
        return 1;
    }
    if (verbose)
        printf("  fp8 epilogue k=%4lld, %lld rows x %lld tokens %-9s: the bits of "
               "out * (scale * token_scale)\n",
               (long long)K, (long long)N, (long long)T, emu_test::order_name(order));
    return 0;
}

// x rounded to BF16, nearest even, written from the format: the top 16 bits of x after adding
// half of the dropped part's unit, less one where the kept part is even (ties to even); NaN a
// quiet NaN.
uint16_t bf16_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

int run_bf16(int64_t K, int T, loom_emu::schedule order, bool verbose) {
    rng r(0xbf16 + (uint64_t)K);
    const int64_t xs = K + 3, bs = K + 6; /* floats, halves a row */
    std::vector<float> x((size_t)(T * xs), NAN);
    for (int t = 0; t < T; t++) emu_test::fill_acts(r, &x[t * xs], (size_t)K, 1.0f);
    const float special[] = {0x1.0101p0f, /* just past halfway: up */
                             0x1.01p0f,   /* halfway, even below: down */
                             0x1.03p0f,   /* halfway, odd below: up */
                             3.4e38f,     /* past BF16's largest: infinity */
                             -0.0f,          INFINITY, -INFINITY, NAN, 0x1p-130f, /* a subnormal */
                             -0x1.ffffp-127f};
    for (int i = 0; i < 10 && i < K; i++) x[(T - 1) * xs + i * (K / 10)] = special[i];
    std::vector<uint16_t> xb((size_t)(T * bs), 0xa5a5);
    const bf16_args a = {x.data(), (size_t)xs * 4, K, xb.data(), (size_t)bs * 2};
    const int64_t pieces = loom_cdiv(K, 256);
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = (uint64_t)K * 5;
    loom_emu::launch(
        dim3((unsigned)(pieces < 64 ? pieces : 64), (unsigned)T), dim3(256), 0,
        [&a] { bf16_kernel(a); }, opt);
    emu_test::problems pr;
    for (int t = 0; t < T; t++) {
        for (int64_t i = 0; i < K; i++) {
            const float v = x[t * xs + i];
            const uint16_t got = xb[t * bs + i], want = bf16_of(v);
            /* NaN: any quiet NaN */
            const bool ok = std::isnan(v) ? (got & 0x7fc0u) == 0x7fc0u : got == want;
            if (!ok)
                pr.add("token %d [%lld]: %.9g to 0x%04x, want 0x%04x", t, (long long)i, (double)v,
                       got, want);
        }
        for (int64_t i = K; i < bs; i++)
            if (xb[t * bs + i] != 0xa5a5) pr.add("token %d: the padding after its row written", t);
    }
    if (pr.n) {
        printf("FAIL bf16 activations k=%lld: %s\n", (long long)K, pr.first.c_str());
        return 1;
    }
    if (verbose)
        printf("  bf16 activations k=%5lld, %d tokens %-9s: the bits of nearest-even BF16\n",
               (long long)K, T, emu_test::order_name(order));
    return 0;
}

} // namespace

namespace emu_blaslt_gemm {

int run_all(bool verbose) {
    int bad = 0;
    bad += run_quant(1000, 5, loom_emu::schedule::breadth, verbose);
    bad += run_quant(4099, 3, loom_emu::schedule::depth_reversed, verbose);
    bad += run_scale(1000, loom_emu::schedule::depth, verbose);
    bad += run_scale(1001, loom_emu::schedule::random, verbose);
    bad += run_bf16(1000, 3, loom_emu::schedule::depth, verbose);
    bad += run_bf16(20000, 2, loom_emu::schedule::random, verbose);
    return bad;
}

} // namespace emu_blaslt_gemm
