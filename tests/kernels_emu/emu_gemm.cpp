// emu_gemm.cpp — kernels/gemm.cu's tensor-core GEMM, compiled from that file, run on the emulator:
// out[t, n] = sum_k x[t, k] w[n, k] for F32, F16, BF16, Q8_0, Q4_K and FP8 E4M3 rows, against a
// float64 product over the weights as kernels/dequant.cuh decodes them (bit-exact with the CPU's
// decoder, which test_cuda_ops checks), within 1e-5 of sum_k |x w|. Awkward shapes: 100 rows (a
// partial row tile), 9, 17 and 130 tokens (partial token tiles), K = 1000 for the float formats
// (a partial chunk), a partial last stage for Q8_0; weight strides that make the stage copy take
// 4-, 2- and 1-byte pieces, activation strides with and without 16-byte loads. Outputs are
// poisoned: the padding and the rows past the step must stay so. A token's outputs must be the
// same bits in steps of 9, 17 and 130 tokens (gemm.cu's batch invariance).
#include "gemm.cu"

#include <stdio.h>

#include <vector>

#include "emu_cases.h"

namespace {

uint64_t g_rs;
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

// Row n's values as the kernels decode them (dequant.cuh), the FP8 rows' scale included.
void decode_row(const weight_spec &ws, const uint8_t *row, double *w) {
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
        for (int j = 0; j < 32 && 32 * c + j < ws.k; j++) w[32 * c + j] = v[j] * scale;
    }
}

template <int T> void launch_gemm(const gemm_args &a, loom_emu::schedule order) {
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = (uint64_t)a.n_tokens * 977 + T;
    loom_emu::launch(
        dim3((unsigned)loom_cdiv(a.n_tokens, GEMM_TOKENS), (unsigned)loom_cdiv(a.w.n, GEMM_ROWS)),
        dim3(GEMM_THREADS), gemm_smem_bytes<T>(), [&a] { gemm_kernel<T>(a); }, opt);
}

void launch_any(const gemm_args &a, loom_emu::schedule order) {
    switch (a.w.type) {
    case LOOM_K_F32:
        return launch_gemm<LOOM_K_F32>(a, order);
    case LOOM_K_F16:
        return launch_gemm<LOOM_K_F16>(a, order);
    case LOOM_K_BF16:
        return launch_gemm<LOOM_K_BF16>(a, order);
    case LOOM_K_Q8_0:
        return launch_gemm<LOOM_K_Q8_0>(a, order);
    case LOOM_K_Q4_K:
        return launch_gemm<LOOM_K_Q4_K>(a, order);
    default:
        return launch_gemm<LOOM_K_FP8_ROWS>(a, order);
    }
}

// One weight type: steps of 9, 17 and 130 tokens. Returns the failures (printed).
int run_type(const weight_spec &ws, bool verbose) {
    const int64_t N = 100, T_MAX = 130;
    const int steps[] = {9, 17, 130};
    /* weights: rows ws.stride apart, the gaps 0xff; the buffer ends with the last row's bytes,
       so AddressSanitizer sees a read past them */
    std::vector<uint8_t> wbuf((size_t)(N - 1) * ws.stride + ws.row_bytes, 0xff);
    g_rs = 0x2545f4914f6cdd1dull + ws.type;
    for (int64_t n = 0; n < N; n++) fill_row(ws, &wbuf[(size_t)n * ws.stride]);
    std::vector<double> w((size_t)(N * ws.k));
    for (int64_t n = 0; n < N; n++) decode_row(ws, &wbuf[(size_t)n * ws.stride], &w[n * ws.k]);
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
    for (int si = 0; si < 3; si++) {
        const int T = steps[si];
        std::vector<float> out((size_t)(T_MAX * os), NAN);
        gemm_args a;
        a.w = loom__k_weight{ws.type, ws.k, N, ws.stride, wbuf.data()};
        a.x = x.data();
        a.x_stride = (size_t)xs * sizeof(float);
        a.n_tokens = T;
        a.out = out.data();
        a.out_stride = (size_t)os * sizeof(float);
        launch_any(a, (loom_emu::schedule)(si + 1));
        double worst = 0;
        for (int64_t t = 0; t < T_MAX && !bad; t++)
            for (int64_t n = 0; n < os && !bad; n++) {
                const float got = out[t * os + n];
                if (t >= T || n >= N) {
                    if (!std::isnan(got)) {
                        printf("FAIL gemm %s T=%d: out[%lld][%lld] written (outside the "
                               "product)\n",
                               ws.name, T, (long long)t, (long long)n);
                        bad++;
                    }
                    continue;
                }
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < ws.k; i++) {
                    const double p = (double)x[t * xs + i] * w[n * ws.k + i];
                    ref += p;
                    mag += fabs(p);
                }
                const double err = fabs(got - ref) / mag;
                if (!(err <= 1e-5)) {
                    printf("FAIL gemm %s T=%d: out[%lld][%lld] = %.9g, want %.9g (error %.3g of "
                           "sum |x w|)\n",
                           ws.name, T, (long long)t, (long long)n, (double)got, ref, err);
                    bad++;
                }
                worst = std::max(worst, err);
            }
        if (verbose && !bad)
            printf("  gemm %-8s k=%4lld n=%lld T=%3d: worst %.2g of sum |x w|\n", ws.name,
                   (long long)ws.k, (long long)N, T, worst);
        outs.push_back(out);
    }
    /* batch invariance: each token's row the same bits in every step that holds it */
    for (int si = 1; si < 3 && !bad; si++)
        for (int sj = 0; sj < si; sj++)
            if (memcmp(outs[si].data(), outs[sj].data(), (size_t)(steps[sj] * os) * 4) != 0) {
                printf("FAIL gemm %s: tokens 0..%d differ between steps of %d and %d tokens\n",
                       ws.name, steps[sj] - 1, steps[sj], steps[si]);
                bad++;
                break;
            }
    if (verbose && !bad)
        printf("  gemm %-8s: tokens the same bits in steps of 9, 17 and 130\n", ws.name);
    return bad;
}

} // namespace

namespace emu_gemm {

int run_all(bool verbose) {
    const weight_spec specs[] = {
        {LOOM_K_F32, "f32", 1000, 4000, 4004},     /* 4-byte pieces */
        {LOOM_K_F16, "f16", 1000, 2000, 2002},     /* 2-byte pieces */
        {LOOM_K_BF16, "bf16", 1000, 2000, 2008},   /* 4-byte pieces */
        {LOOM_K_Q8_0, "q8_0", 992, 31 * 34, 1059}, /* 1-byte pieces; 31 blocks: a partial stage */
        {LOOM_K_Q4_K, "q4_k", 768, 3 * 144, 434},  /* 2-byte pieces */
        {LOOM_K_FP8_ROWS, "fp8rows", 1000, 1004, 1008},
    };
    int bad = 0;
    for (const weight_spec &ws : specs) bad += run_type(ws, verbose);
    return bad;
}

} // namespace emu_gemm
