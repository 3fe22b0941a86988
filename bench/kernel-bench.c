/* kernel-bench.c — loom-kernel-bench: the CPU backend's quantized matmul on the shapes that
 * dominate a forward pass, next to the one-row kernels it replaced, one thread.
 *
 *   loom-kernel-bench [-t THREADS] [-r REPS] [--quick] [--no-rowdot] [--shape TYPE:N:K]...
 *                     [-T T1,T2,...]
 *
 * For each weight type and shape [N rows x K] and token count T it prints the best time of
 * REPS runs (best, not median: the question is what the code costs, not what the shared machine
 * did meanwhile) of
 *   matmul   the backend's matmul (activation rounding included) with THREADS threads, and
 *   rowdot   one thread calling loom__vec_dot_q once per (row, token) on pre-rounded rows —
 *            the arithmetic the matmul used before the tile kernels (tensor/qgemm.h),
 * with the weight bytes read per second and the ratio. --shape TYPE:N:K (repeatable; TYPE a
 * loom type name such as f16, q8_0, q4_K, or fp8_e4m3_rows, which has no one-row reference)
 * replaces the built-in shapes, -T the token counts
 * (default 1,4,16,128), and --no-rowdot skips the one-row reference. Weights are random codes with
 * sane scales (the timing does not depend on the values). Links the static library to reach the
 * internal headers. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "backend/backend.h"
#include "tensor/fp16.h"
#include "tensor/qdot.h"
#include "tensor/quant.h"
#include "tensor/types.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xalloc(size_t n) {
    void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* Random rows of type t: quantized random floats where loom has a quantizer for t; otherwise
 * (K-quants) random bytes with every half-precision field of a super-block set to a small
 * normal value, so no NaN, infinity or subnormal slows the float part down. */
static void fill_kquant(uint32_t t, uint8_t *row, int64_t K) {
    const loom__type_traits *tr = loom__type_get_traits(t);
    for (int64_t i = 0; i < (int64_t)tr->block_bytes * (K / tr->block_elems); i++)
        row[i] = (uint8_t)(frand() * 127.0f + 128.0f);
    for (int64_t b = 0; b < K / tr->block_elems; b++) {
        uint8_t *blk = row + b * tr->block_bytes;
        uint16_t h = loom__f32_to_f16(0.001f);
        /* q4_K / q5_K start with d and dmin; q6_K ends with d (the benchmarked K-quants) */
        if (t == LOOM_TYPE_Q4_K || t == LOOM_TYPE_Q5_K) {
            memcpy(blk, &h, 2);
            memcpy(blk + 2, &h, 2);
        } else {
            memcpy(blk + tr->block_bytes - 2, &h, 2);
        }
    }
}

static uint8_t *make_weights(uint32_t t, int64_t N, int64_t K, size_t *row_bytes) {
    if (!loom__type_row_bytes(t, K, row_bytes)) exit(1);
    uint8_t *w = xalloc((size_t)N * *row_bytes);
    float *row = xalloc((size_t)K * sizeof(float));
    for (int64_t o = 0; o < N; o++) {
        if (o < 64) { /* quantizing 262,144 rows would dominate the run: repeat 64 of them */
            for (int64_t i = 0; i < K; i++) row[i] = 0.05f * frand();
            if (!loom__quantize_row(t, row, w + (size_t)o * *row_bytes, K))
                fill_kquant(t, w + (size_t)o * *row_bytes, K);
        } else {
            memcpy(w + (size_t)o * *row_bytes, w + (size_t)(o % 64) * *row_bytes, *row_bytes);
        }
    }
    free(row);
    return w;
}

/* A type by its loom name (loom__type_name), case-insensitive: GGUF's, or FP8 weight rows
 * ("fp8_e4m3_rows", float32 activations: no rowdot). */
static bool parse_type(const char *name, uint32_t *out) {
    if (!strcasecmp(name, loom__type_name(LOOM_TYPE_FP8_E4M3_ROWS))) {
        *out = LOOM_TYPE_FP8_E4M3_ROWS;
        return true;
    }
    for (uint32_t t = 0; t < 64; t++) {
        const char *n = loom__type_name(t);
        if (n && !strcasecmp(n, name)) {
            *out = t;
            return true;
        }
    }
    return false;
}

typedef struct shape {
    const char *what;
    uint32_t type;
    int64_t N, K;
} shape;

int main(int argc, char **argv) {
    int n_threads = 1, reps = 5;
    bool quick = false, rowdot = true;
    shape custom[16];
    int n_custom = 0;
    int64_t Ts[16] = {1, 4, 16, 128};
    int n_Ts = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc)
            n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--no-rowdot"))
            rowdot = false;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc && n_custom < 16) {
            /* TYPE:N:K, TYPE a loom type name (f16, q8_0, q4_K, ...) */
            char name[32];
            long long N, K;
            if (sscanf(argv[++i], "%31[^:]:%lld:%lld", name, &N, &K) != 3 || N < 1 || K < 1 ||
                !parse_type(name, &custom[n_custom].type)) {
                fprintf(stderr, "--shape wants TYPE:N:K, got %s\n", argv[i]);
                return 2;
            }
            custom[n_custom].what = argv[i];
            custom[n_custom].N = N;
            custom[n_custom++].K = K;
        } else if (!strcmp(argv[i], "-T") && i + 1 < argc) {
            n_Ts = 0;
            for (char *tok = strtok(argv[++i], ","); tok && n_Ts < 16; tok = strtok(NULL, ","))
                if ((Ts[n_Ts++] = atoll(tok)) < 1) {
                    fprintf(stderr, "-T wants positive token counts\n");
                    return 2;
                }
        } else {
            fprintf(
                stderr,
                "usage: %s [-t THREADS] [-r REPS] [--quick] [--no-rowdot] [--shape TYPE:N:K]... "
                "[-T T1,T2,...]\n",
                argv[0]);
            return 2;
        }
    }
    const shape builtin[] = {
        {"gemma3 lm head", LOOM_TYPE_Q8_0, 262144, 640},
        {"gemma3 ffn_up", LOOM_TYPE_Q5_0, 2048, 640},
        {"gemma3 attn_out", LOOM_TYPE_Q4_K, 640, 1024},
        {"gemma3 ffn_down", LOOM_TYPE_Q6_K, 640, 2048},
        {"smollm ffn_up q8_0", LOOM_TYPE_Q8_0, 1536, 576},
        {"smollm ffn_up q4_0", LOOM_TYPE_Q4_0, 1536, 576},
        {"smollm ffn_down q4_K", LOOM_TYPE_Q4_K, 576, 1536},
        {"smollm ffn_up f16", LOOM_TYPE_F16, 1536, 576},
    };
    const shape *shapes = n_custom ? custom : builtin;
    const size_t n_shapes = n_custom ? (size_t)n_custom : sizeof builtin / sizeof builtin[0];
    int64_t Tmax = 1;
    for (int i = 0; i < n_Ts; i++) Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
    loom_backend_open_params cp = {.n_threads = n_threads};
    loom__backend_stream bs;
    loom__backend_stream *be = &bs;
    if (loom__backend_stream_open("cpu", &cp, &bs) != LOOM_OK) {
        fprintf(stderr, "backend: %s\n", loom_last_error());
        return 1;
    }
    printf("%-22s %-5s %4s %10s %9s %10s %9s %7s\n", "shape", "type", "T", "matmul ms", "GB/s",
           "rowdot ms", "GB/s", "ratio");
    for (size_t si = 0; si < n_shapes; si++) {
        const shape *s = &shapes[si];
        const int64_t N = quick && s->N > 8192 ? 8192 : s->N, K = s->K;
        size_t wrow, arow;
        uint8_t *w = make_weights(s->type, N, K, &wrow);
        uint32_t at = LOOM_TYPE_F32; /* FP8 rows: float32 activations, no one-row kernel */
        const bool has_rowdot = loom__vec_dot_type(s->type, &at);
        if (!has_rowdot && s->type != LOOM_TYPE_FP8_E4M3_ROWS) return 1;
        if (!loom__type_row_bytes(at, K, &arow)) return 1;
        float *x = xalloc((size_t)(Tmax * K) * sizeof(float));
        for (int64_t i = 0; i < Tmax * K; i++) x[i] = frand();
        float *out = xalloc((size_t)(Tmax * N) * sizeof(float));
        uint8_t *xa = xalloc((size_t)Tmax * arow);
        for (int64_t t = 0; t < Tmax; t++)
            if (has_rowdot && !loom__quantize_activations(at, x + t * K, xa + (size_t)t * arow, K))
                return 1;
        const loom__vec_dot_q_fn dot = has_rowdot ? loom__vec_dot_q_get(s->type) : NULL;
        for (int ti = 0; ti < n_Ts; ti++) {
            const int64_t T = Ts[ti];
            if (quick && T > 16) continue;
            loom_tensor tw = loom_tensor_2d(s->type, w, K, N, wrow);
            loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, x, K, T, (size_t)K * sizeof(float));
            loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out, N, T, (size_t)N * sizeof(float));
            double best_mm = 1e30, best_rd = 1e30;
            for (int r = 0; r < reps; r++) {
                double t0 = now_s();
                if (be->ops->matmul(be->ctx, &tw, &tx, &to) != LOOM_OK) {
                    fprintf(stderr, "matmul: %s\n", loom_last_error());
                    return 1;
                }
                double t1 = now_s();
                for (int64_t o = 0; o < N && rowdot && dot; o++)
                    for (int64_t t = 0; t < T; t++)
                        out[t * N + o] = dot(w + (size_t)o * wrow, xa + (size_t)t * arow, K);
                double t2 = now_s();
                if (t1 - t0 < best_mm) best_mm = t1 - t0;
                if (t2 - t1 < best_rd) best_rd = t2 - t1;
            }
            const double gb = (double)N * (double)wrow * 1e-9;
            printf("%-22s %-5s %4lld %10.3f %9.1f", s->what, loom__type_name(s->type), (long long)T,
                   best_mm * 1e3, gb / best_mm);
            if (rowdot && dot)
                printf(" %10.3f %9.1f %7.2f\n", best_rd * 1e3, gb / best_rd, best_rd / best_mm);
            else
                printf(" %10s %9s %7s\n", "-", "-", "-");
            fflush(stdout);
        }
        free(w);
        free(x);
        free(out);
        free(xa);
    }
    loom__backend_stream_close(&bs);
    return 0;
}
