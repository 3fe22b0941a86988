// emu_gemv.cpp — kernels/gemv.cu's decode GEMV, compiled from that file, run on the emulator:
// out[t, n] = sum_k x[t, k] w[n, k] for every weight type it reads in place (F32, F16, BF16,
// Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, FP8 E4M3 rows), against a float64 sum over the weights
// as the CPU backend decodes them (loom__dequantize_row, which get_rows' case shows the kernels
// decode bit for bit), each output within 1e-5 of sum_k |x w| — test_cuda_ops' tolerance. 67
// rows (a partial block of four warps); K = 1000 and 777 for the plain types and FP8 rows (a
// partial last chunk), 33 blocks (lane 0 takes two) and 6 super-blocks for the block types;
// weight rows a few bytes apart (odd addresses for the block types), the gaps 0xff; x rows
// 16-byte aligned (the float4 loads) and one float off with a NaN between rows (the scalar
// loads; a read past K poisons the output). Steps of 1, 2, 3, 5, 8 and 11 tokens (two groups
// of 8 in grid.y); each token's outputs must be the same bits in every step (gemv.cu's batch
// invariance), the rows past the step and each row's padding untouched (poisoned NaN).
#include "gemv.cu"

#include <stdio.h>

#include <vector>

#include "emu_cases.h"
#include "emu_util.h"

extern "C" {
#include "tensor/quant.h"
}

namespace {

using emu_test::rng;

struct gemv_spec {
    uint32_t type;
    int64_t k;
    size_t gap; // bytes between one row's end and the next row
};

template <int T> void launch_gemv(const gemv_args &a, loom_emu::schedule order) {
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = (uint64_t)a.n_tokens * 131 + T;
    loom_emu::launch(
        dim3((unsigned)loom_cdiv(a.w.n, GEMV_WARPS), (unsigned)loom_cdiv(a.n_tokens, GEMV_TOKENS)),
        dim3(GEMV_WARPS * 32), 0, [&a] { gemv_kernel<T>(a); }, opt);
}

void launch_any(const gemv_args &a, loom_emu::schedule order) {
    switch (a.w.type) {
    case LOOM_K_F32:
        return launch_gemv<LOOM_K_F32>(a, order);
    case LOOM_K_F16:
        return launch_gemv<LOOM_K_F16>(a, order);
    case LOOM_K_BF16:
        return launch_gemv<LOOM_K_BF16>(a, order);
    case LOOM_K_Q8_0:
        return launch_gemv<LOOM_K_Q8_0>(a, order);
    case LOOM_K_Q4_0:
        return launch_gemv<LOOM_K_Q4_0>(a, order);
    case LOOM_K_Q5_0:
        return launch_gemv<LOOM_K_Q5_0>(a, order);
    case LOOM_K_Q4_K:
        return launch_gemv<LOOM_K_Q4_K>(a, order);
    case LOOM_K_Q5_K:
        return launch_gemv<LOOM_K_Q5_K>(a, order);
    case LOOM_K_Q6_K:
        return launch_gemv<LOOM_K_Q6_K>(a, order);
    default:
        return launch_gemv<LOOM_K_FP8_ROWS>(a, order);
    }
}

// One weight type, both x layouts, every step. Returns the failures (printed).
int run_type(const gemv_spec &sp, bool verbose) {
    const int64_t N = 67, K = sp.k, T_MAX = 11;
    const int steps[] = {1, 2, 3, 5, 8, 11};
    const size_t rb = emu_test::row_bytes(sp.type, K), stride = rb + sp.gap;
    /* the buffer ends with the last row's bytes: AddressSanitizer sees a read past them */
    std::vector<uint8_t> wbuf((size_t)(N - 1) * stride + rb, 0xff);
    rng r(0x6e37 + sp.type * 7919 + (uint64_t)K);
    for (int64_t n = 0; n < N; n++) emu_test::make_weight_row(r, sp.type, K, &wbuf[n * stride]);
    std::vector<float> w((size_t)(N * K));
    std::vector<uint8_t> aligned(rb); /* the CPU's decoder wants its blocks 2-byte aligned */
    for (int64_t n = 0; n < N; n++) {
        memcpy(aligned.data(), &wbuf[n * stride], rb);
        if (!loom__dequantize_row(sp.type, aligned.data(), &w[n * K], K)) {
            printf("FAIL gemv %s: the CPU cannot decode the rows\n", emu_test::type_name(sp.type));
            return 1;
        }
    }
    int bad = 0;
    for (int layout = 0; layout < 2 && !bad; layout++) {
        /* 0: rows 16-byte aligned; 1: rows K + 1 floats apart, one float in, NaN between */
        const int64_t xs = layout == 0 ? (K + 3) / 4 * 4 + 4 : K + 1, x0 = layout == 0 ? 0 : 1;
        std::vector<float> xbuf((size_t)(x0 + T_MAX * xs + 4), NAN);
        for (int64_t t = 0; t < T_MAX; t++)
            emu_test::fill_acts(r, &xbuf[x0 + t * xs], (size_t)K, 1.0f);
        const float *x = xbuf.data() + x0;
        std::vector<double> ref((size_t)(T_MAX * N)), mag((size_t)(T_MAX * N));
        for (int64_t t = 0; t < T_MAX; t++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0, m = 0;
                for (int64_t i = 0; i < K; i++) {
                    const double p = (double)w[n * K + i] * x[t * xs + i];
                    s += p;
                    m += fabs(p);
                }
                ref[t * N + n] = s;
                mag[t * N + n] = m;
            }
        const int64_t os = N + 5;
        std::vector<float> first((size_t)(T_MAX * os), NAN); /* each token's first outputs */
        int have = 0;                                        /* tokens in `first` */
        double worst = 0;
        for (int si = 0; si < 6 && !bad; si++) {
            const int T = steps[si];
            std::vector<float> out((size_t)(T_MAX * os), NAN);
            gemv_args a;
            a.w = loom__k_weight{sp.type, K, N, stride, wbuf.data()};
            a.x = x;
            a.x_stride = (size_t)xs * 4;
            a.n_tokens = T;
            a.out = out.data();
            a.out_stride = (size_t)os * 4;
            launch_any(a, (loom_emu::schedule)((si + layout) % 4));
            for (int64_t t = 0; t < T_MAX && !bad; t++)
                for (int64_t n = 0; n < os && !bad; n++) {
                    const float got = out[t * os + n];
                    if (t >= T || n >= N) {
                        if (!std::isnan(got)) {
                            printf("FAIL gemv %s T=%d: out[%lld][%lld] written (outside the "
                                   "product)\n",
                                   emu_test::type_name(sp.type), T, (long long)t, (long long)n);
                            bad++;
                        }
                        continue;
                    }
                    const double err = fabs(got - ref[t * N + n]) / (mag[t * N + n] + 1e-300);
                    if (!(err <= 1e-5)) {
                        printf("FAIL gemv %s k=%lld T=%d x layout %d: out[%lld][%lld] = %.9g, "
                               "float64 %.9g (error %.3g of sum |x w|)\n",
                               emu_test::type_name(sp.type), (long long)K, T, layout, (long long)t,
                               (long long)n, (double)got, ref[t * N + n], err);
                        bad++;
                    }
                    worst = std::max(worst, err);
                }
            /* batch invariance: the tokens an earlier step computed, the same bits */
            if (!bad && memcmp(out.data(), first.data(), (size_t)(std::min(have, T) * os) * 4)) {
                printf("FAIL gemv %s: tokens of a %d-token step differ from the same tokens "
                       "in a smaller step\n",
                       emu_test::type_name(sp.type), T);
                bad++;
            }
            if (T > have) {
                memcpy(first.data(), out.data(), (size_t)(T * os) * 4);
                have = T;
            }
        }
        if (verbose && !bad)
            printf("  gemv %-13s k=%4lld n=%lld x %s: worst %.2g of sum |x w|; tokens the same "
                   "bits in steps of 1..11\n",
                   emu_test::type_name(sp.type), (long long)K, (long long)N,
                   layout ? "unaligned" : "aligned", worst);
    }
    return bad;
}

} // namespace

namespace emu_gemv {

int run_all(bool verbose) {
    const gemv_spec specs[] = {
        {LOOM_K_F32, 1000, 4},      {LOOM_K_F16, 1000, 2},  {LOOM_K_BF16, 1000, 6},
        {LOOM_K_Q8_0, 1056, 3},     {LOOM_K_Q4_0, 1056, 1}, {LOOM_K_Q5_0, 1056, 5},
        {LOOM_K_Q4_K, 1536, 3},     {LOOM_K_Q5_K, 1536, 1}, {LOOM_K_Q6_K, 1536, 7},
        {LOOM_K_FP8_ROWS, 1000, 4}, /* rows 1008 bytes apart: 16-byte aligned, the wide loads */
        {LOOM_K_FP8_ROWS, 777, 4},  /* rows 788 apart: the byte loads */
    };
    int bad = 0;
    for (const gemv_spec &sp : specs) bad += run_type(sp, verbose);
    return bad;
}

} // namespace emu_gemv
