// emu_gemm.cpp — kernels/gemm.cu's tensor-core GEMM, compiled from that file, run on the emulator:
// out[t, n] = sum_k x[t, k] w[n, k] for F32, F16, BF16, Q8_0, Q4_K and FP8 E4M3 rows, against a
// float64 product over the weights as kernels/dequant.cuh decodes them (bit-exact with the CPU's
// decoder, which test_cuda_ops checks), within 1e-5 of sum_k |x w|. Awkward shapes: 100 rows (a
// partial row tile), 9, 17 and 130 tokens (partial token tiles), K = 1000 for the float formats
// (a partial chunk), a partial last stage for Q8_0, K = 4352 for Q4_K (segments of 512 values,
// the last of 256); weight strides that make the stage copy take
// 4-, 2- and 1-byte pieces, activation strides with and without 16-byte loads. Outputs are
// poisoned: the padding and the rows past the step must stay so. Batch invariance, the CUDA
// backend's default: a token's outputs must be the same bits in steps of 1, 3, 8, 9, 17 and 130
// tokens, and the same whether K ran in one block or split across blocks into segment sums that
// gemm_fold_kernel folds (the plans for 0, 2 and 132 SMs: no split, 2 or 3 groups, one per
// segment). All of it three times: at float32 accuracy (LOOM_K_MATH_F32), with BF16 operands
// (LOOM_K_MATH_BF16), and with BF16 operands on the wgmma kernel (LOOM_K_MATH_BF16_WGMMA,
// gemm_wgmma.cuh: 128 x 128 tiles, so 130 tokens are two token tiles and 100 rows part of one;
// the emulator computes each wgmma when its group is waited for), the BF16 runs checked against
// a float64 product of the operands rounded to BF16 here (the same 1e-5: the products are exact
// either way, only the operands differ) and within 2^-7 of sum_k |x w| of the unrounded
// product.
#include "gemm.cu"

#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "emu_cases.h"

namespace {

uint64_t g_rs;
// The wgmma kernels' BF16 weights with aligned rows: warp-specialised (gemm_wg_ws_kernel) with
// TMA copies, as gemm_launch runs them by default, or with cp.async copies, or on gemm_wg_kernel
// (plain); the launches that ran warp-specialised, with TMA; tensor maps refused.
enum ws_mode { WS_TMA, WS_CP, PLAIN };
ws_mode g_mode = WS_TMA;
int g_ws_runs = 0, g_tma_runs = 0, g_tma_refused = 0;
uint64_t rnd() {
    g_rs ^= g_rs << 13, g_rs ^= g_rs >> 7, g_rs ^= g_rs << 17;
    return g_rs;
}
float frand() {
    return (float)((double)(rnd() >> 11) * 0x1p-52 - 1);
} /* (-1, 1), 24 bits */

// A half whose value is a power of two times m in [lo_exp, hi_exp] (biased exponents), sign random.
uint16_t half_bits(int lo_exp, int hi_exp) {
    const unsigned e = (unsigned)lo_exp + (unsigned)(rnd() % (uint64_t)(hi_exp - lo_exp + 1));
    return (uint16_t)(((rnd() & 1) << 15) | (e << 10) | (rnd() & 1023));
}

struct weight_spec {
    uint32_t type;
    const char *name;
    int64_t k;
    size_t row_bytes, stride; // the stride sets the stage copy's piece size (4, 2 or 1 bytes)
};

// The stored row n of the weights: random bytes of the format, scales kept in range.
void fill_row(const weight_spec &ws, uint8_t *row) {
    switch (ws.type) {
    case LOOM_K_F32:
        for (int64_t i = 0; i < ws.k; i++) {
            const float f = frand();
            memcpy(row + 4 * i, &f, 4);
        }
        break;
    case LOOM_K_F16:
        for (int64_t i = 0; i < ws.k; i++) {
            const uint16_t h = half_bits(5, 16);
            memcpy(row + 2 * i, &h, 2);
        }
        break;
    case LOOM_K_BF16:
        for (int64_t i = 0; i < ws.k; i++) {
            const uint16_t b = (uint16_t)(__float_as_uint(frand()) >> 16);
            memcpy(row + 2 * i, &b, 2);
        }
        break;
    case LOOM_K_Q8_0: /* 34-byte blocks: f16 d, 32 int8 */
        for (int64_t b = 0; b < ws.k / 32; b++) {
            const uint16_t d = half_bits(6, 9);
            memcpy(row + 34 * b, &d, 2);
            for (int j = 0; j < 32; j++) row[34 * b + 2 + j] = (uint8_t)rnd();
        }
        break;
    case LOOM_K_Q4_K: /* 144-byte super-blocks: f16 d, f16 dmin, 12 scale bytes, nibbles */
        for (int64_t b = 0; b < ws.k / 256; b++) {
            uint8_t *p = row + 144 * b;
            const uint16_t d = (uint16_t)(half_bits(6, 9) & 0x7fff);
            const uint16_t dmin = (uint16_t)(half_bits(6, 9) & 0x7fff);
            memcpy(p, &d, 2);
            memcpy(p + 2, &dmin, 2);
            for (int j = 4; j < 144; j++) p[j] = (uint8_t)rnd();
        }
        break;
    default: { /* FP8 E4M3 rows: codes (no NaN), zero padding to 4 bytes, a float32 scale */
        for (int64_t i = 0; i < ws.k; i++) {
            uint8_t c;
            do c = (uint8_t)rnd();
            while ((c & 0x7f) == 0x7f);
            row[i] = c;
        }
        const int64_t at = (ws.k + 3) & ~(int64_t)3;
        for (int64_t i = ws.k; i < at; i++) row[i] = 0;
        const float scale = 0.0123f;
        memcpy(row + at, &scale, 4);
        break;
    }
    }
}

// x rounded to BF16, nearest even (written here from the format: a float's top 16 bits).
double bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

// Row n's values as the kernels decode them (dequant.cuh), the FP8 rows' scale included; w16:
// each decoded value rounded to BF16 first (the scale is applied after the sum either way).
void decode_row(const weight_spec &ws, const uint8_t *row, double *w, double *w16) {
    float v[32];
    for (int64_t c = 0; c < (ws.k + 31) / 32; c++) {
        switch (ws.type) {
        case LOOM_K_F32:
            loom_dequant32<LOOM_K_F32>(row, c, ws.k, v);
            break;
        case LOOM_K_F16:
            loom_dequant32<LOOM_K_F16>(row, c, ws.k, v);
            break;
        case LOOM_K_BF16:
            loom_dequant32<LOOM_K_BF16>(row, c, ws.k, v);
            break;
        case LOOM_K_Q8_0:
            loom_dequant32<LOOM_K_Q8_0>(row, c, ws.k, v);
            break;
        case LOOM_K_Q4_K:
            loom_dequant32<LOOM_K_Q4_K>(row, c, ws.k, v);
            break;
        default:
            loom_dequant32<LOOM_K_FP8_ROWS>(row, c, ws.k, v);
            break;
        }
        const double scale =
            ws.type == LOOM_K_FP8_ROWS ? (double)loom_fp8_rows_scale256(row, ws.k) : 1.0;
        for (int j = 0; j < 32 && 32 * c + j < ws.k; j++) {
            w[32 * c + j] = v[j] * scale;
            w16[32 * c + j] = bf16_round(v[j]) * scale;
        }
    }
}

// Products j < n of one x, as loom__cuda_gemm_multi launches them (one launch, one fold).
template <int T, int MATH>
void launch_gemm(const loom__k_weight *const *ws, int n, const float *x, size_t xs,
                 int64_t n_tokens, float *const *outs, const size_t *oss, int n_sms,
                 loom_emu::schedule order) {
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = (uint64_t)n_tokens * 977 + T + (uint64_t)n_sms + (uint64_t)n;
    const gemm_plan pl = gemm_plan_of(ws, n, n_tokens, n_sms, MATH);
    std::vector<float> partial(pl.partial_bytes / sizeof(float), NAN);
    gemm_multi mm = gemm_multi_of(ws, n, x, xs, n_tokens, outs, oss, pl, partial.data(), MATH);
    const dim3 grid((unsigned)loom_cdiv(n_tokens, gemm_tile_tokens(MATH)), (unsigned)mm.tile0[n],
                    (unsigned)pl.groups);
    if constexpr (MATH == LOOM_K_MATH_BF16_WGMMA) {
        /* x in BF16 first (poisoned before), as gemm_launch does */
        const int64_t k = ws[0]->k;
        std::vector<uint4> x16((size_t)n_tokens * gemm_x16_stride(k) / 16,
                               make_uint4(~0u, ~0u, ~0u, ~0u));
        mm.x16 = (const uint8_t *)x16.data();
        mm.x16_stride = gemm_x16_stride(k);
        loom_emu::launch(
            dim3((unsigned)n_tokens, (unsigned)loom_cdiv((int64_t)mm.x16_stride / 16, 256)),
            dim3(256), 0, [&] { gemm_x16_kernel(x, xs, k, (uint8_t *)x16.data()); }, opt);
        bool direct = T == LOOM_K_BF16;
        for (int j = 0; j < n; j++)
            direct = direct && (((uintptr_t)ws[j]->data | ws[j]->stride) & 15) == 0;
        if (direct && g_mode != PLAIN) {
            gemm_tmaps tm = {};
            if (g_mode == WS_TMA) {
                if (gemm_tmaps_of(mm, loom_emu_tmap_encode_tiled, &tm))
                    g_tma_runs++;
                else
                    g_tma_refused++;
            }
            if constexpr (T == LOOM_K_BF16)
                loom_emu::launch(
                    grid, dim3(GEMM_WS_THREADS), gemm_ws_smem_bytes(),
                    [&mm, &tm] { gemm_wg_ws_kernel<T>(mm, tm); }, opt);
            g_ws_runs++;
        } else if (direct)
            loom_emu::launch(
                grid, dim3(GEMM_WG_THREADS), gemm_wg_smem_bytes<T, true>(),
                [&mm] { gemm_wg_kernel<T, true>(mm); }, opt);
        else
            loom_emu::launch(
                grid, dim3(GEMM_WG_THREADS), gemm_wg_smem_bytes<T, false>(),
                [&mm] { gemm_wg_kernel<T, false>(mm); }, opt);
    } else
        loom_emu::launch(
            grid, dim3(GEMM_THREADS), gemm_smem_bytes<T, MATH>(),
            [&mm] { gemm_kernel<T, MATH>(mm); }, opt);
    if (pl.partial_bytes == 0) return;
    const int64_t n_segs = pl.n_segs;
    loom_emu::launch(
        dim3((unsigned)mm.fold0[n], (unsigned)n_tokens), dim3(256), 0,
        [&mm, n_segs] { gemm_fold_kernel(mm, n_segs); }, opt);
}

template <int MATH>
void launch_math(const loom__k_weight *const *ws, int n, const float *x, size_t xs,
                 int64_t n_tokens, float *const *outs, const size_t *oss, int n_sms,
                 loom_emu::schedule order) {
    switch (ws[0]->type) {
    case LOOM_K_F32:
        return launch_gemm<LOOM_K_F32, MATH>(ws, n, x, xs, n_tokens, outs, oss, n_sms, order);
    case LOOM_K_F16:
        return launch_gemm<LOOM_K_F16, MATH>(ws, n, x, xs, n_tokens, outs, oss, n_sms, order);
    case LOOM_K_BF16:
        return launch_gemm<LOOM_K_BF16, MATH>(ws, n, x, xs, n_tokens, outs, oss, n_sms, order);
    case LOOM_K_Q8_0:
        return launch_gemm<LOOM_K_Q8_0, MATH>(ws, n, x, xs, n_tokens, outs, oss, n_sms, order);
    case LOOM_K_Q4_K:
        return launch_gemm<LOOM_K_Q4_K, MATH>(ws, n, x, xs, n_tokens, outs, oss, n_sms, order);
    default:
        return launch_gemm<LOOM_K_FP8_ROWS, MATH>(ws, n, x, xs, n_tokens, outs, oss, n_sms, order);
    }
}

void launch_any(int math, const loom__k_weight *const *ws, int n, const float *x, size_t xs,
                int64_t n_tokens, float *const *outs, const size_t *oss, int n_sms,
                loom_emu::schedule order) {
    if (math == LOOM_K_MATH_BF16)
        launch_math<LOOM_K_MATH_BF16>(ws, n, x, xs, n_tokens, outs, oss, n_sms, order);
    else if (math == LOOM_K_MATH_BF16_WGMMA)
        launch_math<LOOM_K_MATH_BF16_WGMMA>(ws, n, x, xs, n_tokens, outs, oss, n_sms, order);
    else
        launch_math<LOOM_K_MATH_F32>(ws, n, x, xs, n_tokens, outs, oss, n_sms, order);
}

// One weight type: steps of 1, 3, 8, 9, 17 and 130 tokens, each on 0, 2 and 132 SMs. Returns
// the failures (printed).
int run_type(const weight_spec &ws, int math, bool verbose) {
    const bool m16 = math != LOOM_K_MATH_F32;
    const char *mname = math == LOOM_K_MATH_BF16_WGMMA ? "wgmma" : m16 ? "bf16 math" : "f32 math";
    const int64_t N = 100, T_MAX = 130;
    const int steps[] = {1, 3, 8, 9, 17, 130};
    const int sms[] = {0, 2, 132};
    constexpr int N_RUNS = 6 * 3;
    /* weights: rows ws.stride apart, the gaps 0xff; the buffer ends with the last row's bytes,
       so AddressSanitizer sees a read past them */
    std::vector<uint8_t> wbuf((size_t)(N - 1) * ws.stride + ws.row_bytes, 0xff);
    g_rs = 0x2545f4914f6cdd1dull + ws.type;
    for (int64_t n = 0; n < N; n++) fill_row(ws, &wbuf[(size_t)n * ws.stride]);
    std::vector<double> w((size_t)(N * ws.k)), w16(w.size());
    for (int64_t n = 0; n < N; n++)
        decode_row(ws, &wbuf[(size_t)n * ws.stride], &w[n * ws.k], &w16[n * ws.k]);
    /* activations: the float formats' rows 4 floats apart from 16-byte multiples (the scalar
       loads), the others' aligned (the 16-byte loads) */
    const bool x_aligned = ws.type != LOOM_K_F32 && ws.type != LOOM_K_F16;
    const int64_t xs = x_aligned ? (ws.k + 3) / 4 * 4 + 4 : ws.k + 3;
    std::vector<float> x((size_t)(T_MAX * xs), NAN);
    for (int64_t t = 0; t < T_MAX; t++)
        for (int64_t i = 0; i < ws.k; i++) x[t * xs + i] = frand();
    const int64_t os = N + 5;

    int bad = 0;
    std::vector<std::vector<float>> outs;
    std::vector<int> run_T;
    for (int ri = 0; ri < N_RUNS; ri++) {
        const int T = steps[ri / 3], n_sms = sms[ri % 3];
        run_T.push_back(T);
        std::vector<float> out((size_t)(T_MAX * os), NAN);
        const loom__k_weight kw = {ws.type, ws.k, N, ws.stride, wbuf.data()};
        const loom__k_weight *kp = &kw;
        float *op = out.data();
        const size_t oss = (size_t)os * sizeof(float);
        launch_any(math, &kp, 1, x.data(), (size_t)xs * sizeof(float), T, &op, &oss, n_sms,
                   (loom_emu::schedule)(ri % 4));
        double worst = 0, worst_exact = 0;
        for (int64_t t = 0; t < T_MAX && !bad; t++)
            for (int64_t n = 0; n < os && !bad; n++) {
                const float got = out[t * os + n];
                if (t >= T || n >= N) {
                    if (!std::isnan(got)) {
                        printf("FAIL gemm %s (%s) T=%d sms=%d: out[%lld][%lld] written (outside "
                               "the product)\n",
                               ws.name, mname, T, n_sms, (long long)t, (long long)n);
                        bad++;
                    }
                    continue;
                }
                /* ref: the product of the operands the kernel multiplies (rounded to BF16 in
                   bf16 math); exact: of the unrounded ones */
                double ref = 0, mag = 0, exact = 0;
                for (int64_t i = 0; i < ws.k; i++) {
                    const float xv = x[t * xs + i];
                    const double p =
                        m16 ? bf16_round(xv) * w16[n * ws.k + i] : (double)xv * w[n * ws.k + i];
                    ref += p;
                    mag += fabs(p);
                    exact += (double)xv * w[n * ws.k + i];
                }
                const double err = fabs(got - ref) / mag, err_exact = fabs(got - exact) / mag;
                if (!(err <= 1e-5) || !(err_exact <= (m16 ? 0x1p-7 : 1e-5))) {
                    printf("FAIL gemm %s (%s) T=%d sms=%d: out[%lld][%lld] = %.9g, want %.9g "
                           "(error %.3g of sum |x w|; %.3g from the unrounded product)\n",
                           ws.name, mname, T, n_sms, (long long)t, (long long)n, (double)got, ref,
                           err, err_exact);
                    bad++;
                }
                worst = std::max(worst, err);
                worst_exact = std::max(worst_exact, err_exact);
            }
        if (verbose && !bad)
            printf("  gemm %-8s %-9s k=%4lld n=%lld T=%3d sms=%3d (%lld K groups): worst %.2g "
                   "of sum |x w| (%.2g from the unrounded product)\n",
                   ws.name, mname, (long long)ws.k, (long long)N, T, n_sms,
                   (long long)gemm_plan_of(&kp, 1, T, n_sms, math).groups, worst, worst_exact);
        outs.push_back(out);
    }
    /* batch invariance: each token's row the same bits in every step that holds it, split or
       not */
    for (int ri = 1; ri < N_RUNS && !bad; ri++)
        for (int rj = 0; rj < ri; rj++) {
            const int T = std::min(run_T[ri], run_T[rj]);
            if (memcmp(outs[ri].data(), outs[rj].data(), (size_t)(T * os) * 4) != 0) {
                printf("FAIL gemm %s (%s): tokens 0..%d differ between steps of %d tokens on %d "
                       "SMs and %d tokens on %d SMs\n",
                       ws.name, mname, T - 1, run_T[rj], sms[rj % 3], run_T[ri], sms[ri % 3]);
                bad++;
                break;
            }
        }
    /* the wgmma kernels' aligned BF16 weights: the runs of 1 token on 0 and 132 SMs (K split
       across 4 blocks), 17 on 2 and 130 on 132 again on gemm_wg_kernel, which must give the
       warp-specialised kernel's bits (LOOM_EMU_NO_RERUNS, the sanitizer builds: not rerun) */
    const bool direct =
        math == LOOM_K_MATH_BF16_WGMMA && ws.type == LOOM_K_BF16 && ws.stride % 16 == 0;
    if (direct && getenv("LOOM_EMU_NO_RERUNS") == nullptr)
        for (int ri : {0, 2, 13, 17})
            for (ws_mode mode : {WS_CP, PLAIN}) {
                if (bad) break;
                const int T = run_T[ri], n_sms = sms[ri % 3];
                std::vector<float> out((size_t)(T_MAX * os), NAN);
                const loom__k_weight kw = {ws.type, ws.k, N, ws.stride, wbuf.data()};
                const loom__k_weight *kp = &kw;
                float *op = out.data();
                const size_t oss = (size_t)os * sizeof(float);
                const int before = g_ws_runs, tma_before = g_tma_runs;
                g_mode = mode;
                launch_any(math, &kp, 1, x.data(), (size_t)xs * sizeof(float), T, &op, &oss, n_sms,
                           (loom_emu::schedule)((ri + 1) % 4));
                g_mode = WS_TMA;
                const bool ran_as_asked =
                    g_tma_runs == tma_before && (g_ws_runs != before) == (mode == WS_CP);
                if (!ran_as_asked || memcmp(out.data(), outs[ri].data(), out.size() * 4) != 0) {
                    printf("FAIL gemm %s (wgmma) T=%d sms=%d: %s does not give the "
                           "warp-specialised kernel's bits with TMA copies\n",
                           ws.name, T, n_sms,
                           mode == PLAIN ? "gemm_wg_kernel" : "its cp.async copies");
                    bad++;
                } else if (verbose) {
                    printf("  gemm %-8s wgmma     T=%3d sms=%3d: TMA copies and %s, the same "
                           "bits\n",
                           ws.name, T, n_sms,
                           mode == PLAIN ? "not warp-specialised" : "cp.async copies");
                }
            }
    /* the split plans this test means to cover */
    const loom__k_weight shape = {ws.type, ws.k, N, ws.stride, nullptr};
    const loom__k_weight *sp = &shape;
    if (gemm_plan_of(&sp, 1, 1, 2, math).groups < 2 ||
        gemm_plan_of(&sp, 1, 1, 132, math).groups != gemm_plan_of(&sp, 1, 1, 132, math).n_segs)
        printf("FAIL gemm %s: the plans for 1 token do not split K as meant\n", ws.name), bad++;
    /* matmul_multi: the rows cut into three weights (37, 27 and 36 rows) in one launch, each
       output the bits of the whole product's (runs 0, 14, 17: 1 token unsplit, 17 tokens on 2
       SMs, 130 tokens on 132) */
    const int cut[4] = {0, 37, 64, 100}, multi_runs[3] = {0, 14, 17};
    for (int mi = 0; mi < 3 && !bad; mi++) {
        const int ri = multi_runs[mi], T = run_T[ri], n_sms = sms[ri % 3];
        loom__k_weight kw[3];
        const loom__k_weight *kp[3];
        std::vector<float> part[3];
        float *op[3];
        size_t oss[3];
        for (int j = 0; j < 3; j++) {
            kw[j] = loom__k_weight{ws.type, ws.k, cut[j + 1] - cut[j], ws.stride,
                                   &wbuf[(size_t)cut[j] * ws.stride]};
            kp[j] = &kw[j];
            part[j].assign((size_t)(T * (cut[j + 1] - cut[j] + 3)), NAN);
            op[j] = part[j].data();
            oss[j] = (size_t)(cut[j + 1] - cut[j] + 3) * sizeof(float);
        }
        launch_any(math, kp, 3, x.data(), (size_t)xs * sizeof(float), T, op, oss, n_sms,
                   (loom_emu::schedule)(mi + 1));
        for (int j = 0; j < 3 && !bad; j++)
            for (int t = 0; t < T && !bad; t++) {
                const float *got = &part[j][(size_t)t * (cut[j + 1] - cut[j] + 3)];
                if (memcmp(got, &outs[ri][(size_t)t * os + cut[j]],
                           (size_t)(cut[j + 1] - cut[j]) * sizeof(float)) != 0 ||
                    !std::isnan(got[cut[j + 1] - cut[j]])) {
                    printf("FAIL gemm %s (%s): matmul_multi's weight %d, token %d (of %d, on %d "
                           "SMs): not the bits of its own product (or its padding written)\n",
                           ws.name, mname, j, t, T, n_sms);
                    bad++;
                }
            }
    }
    if (verbose && !bad)
        printf("  gemm %-8s %-9s: tokens the same bits in steps of 1, 3, 8, 9, 17 and 130, "
               "split or not, alone or in a multi-weight launch\n",
               ws.name, mname);
    return bad;
}

} // namespace

namespace emu_gemm {

int run_all(bool verbose) {
    const weight_spec specs[] = {
        {LOOM_K_F32, "f32", 1000, 4000, 4004},   /* 4-byte pieces */
        {LOOM_K_F16, "f16", 1000, 2000, 2002},   /* 2-byte pieces */
        {LOOM_K_BF16, "bf16", 1000, 2000, 2008}, /* 4-byte pieces */
        /* rows 16-byte aligned, K 4 past a multiple of 8: the wgmma kernel copies them to their
           tiles as stored, the last chunk's first 16-byte piece half past K */
        {LOOM_K_BF16, "bf16", 996, 1992, 2048},
        {LOOM_K_Q8_0, "q8_0", 992, 31 * 34, 1059}, /* 1-byte pieces; 31 blocks: a partial stage */
        {LOOM_K_Q4_K, "q4_k", 768, 3 * 144, 434},  /* 2-byte pieces */
        /* 136 chunks: segments of 16 chunks (gemm_seg_chunks), the last one of 8 */
        {LOOM_K_Q4_K, "q4_k", 4352, 17 * 144, 2450},
        {LOOM_K_FP8_ROWS, "fp8rows", 1000, 1004, 1008},
    };
    int bad = 0;
    g_ws_runs = g_tma_runs = g_tma_refused = 0;
    for (int math : {LOOM_K_MATH_F32, LOOM_K_MATH_BF16, LOOM_K_MATH_BF16_WGMMA})
        for (const weight_spec &ws : specs) bad += run_type(ws, math, verbose);
    if (g_ws_runs == 0 || g_tma_runs == 0 || g_tma_refused != 0) {
        printf("FAIL gemm: the warp-specialised wgmma kernel ran %d times, %d with TMA copies, "
               "%d with tensor maps refused\n",
               g_ws_runs, g_tma_runs, g_tma_refused);
        bad++;
    }
    return bad;
}

} // namespace emu_gemm
