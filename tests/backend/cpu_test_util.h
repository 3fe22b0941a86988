/* cpu_test_util.h — helpers shared by the CPU backend tests: a deterministic RNG, NaN
 * poisoning, the two backends every op is run on (1 and 2 threads), and tolerance checks. */
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

/* Backends under test, each with one stream: [0] one thread, [1] two threads. Results must
 * match bitwise. g_be[i]->ops->op(g_be[i]->ctx, ...) runs an op on the stream; buffers come
 * from g_be[i]->dev. */
static loom__backend_stream g_be_store[2];
static loom__backend_stream *g_be[2] = {&g_be_store[0], &g_be_store[1]};

/* A CPU backend stream of n_threads threads (f32 activations unless said otherwise). */
static inline int cpu_stream_open(loom__backend_stream *bs, int n_threads, bool f32) {
    loom_backend_open_params p = {.n_threads = n_threads, .f32_activations = f32};
    if (loom__backend_stream_open("cpu", &p, bs) != LOOM_OK) {
        fprintf(stderr, "cpu backend: %s\n", loom_last_error());
        return -1;
    }
    return 0;
}

static inline int cpu_group_setup(void **state) {
    (void)state;
    if (cpu_stream_open(g_be[0], 1, true) != 0) return -1;
    if (cpu_stream_open(g_be[1], 2, true) != 0) return -1;
    return 0;
}

static inline int cpu_group_teardown(void **state) {
    (void)state;
    loom__backend_stream_close(g_be[0]);
    loom__backend_stream_close(g_be[1]);
    return 0;
}

/* splitmix64: a fixed stream, so failures reproduce. */
static uint64_t g_rng = 0x1234567887654321ull;

static inline uint64_t rng_u64(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float rng_f(void) {
    return (float)((double)(rng_u64() >> 11) * 0x1p-52 - 1.0);
}

static inline void fill_rand(float *p, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) p[i] = rng_f() * scale;
}

static inline void poison(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

static inline float *falloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (p == NULL) abort(); /* test harness only */
    return p;
}

/* |got - ref| <= rel * mag + abs_tol for every element; prints the first offender. mag may be
 * NULL (then |ref| is used). */
static inline int close_enough(const float *got, const double *ref, const double *mag, size_t n,
                               double rel, double abs_tol, const char *what) {
    for (size_t i = 0; i < n; i++) {
        double m = mag ? mag[i] : fabs(ref[i]);
        double err = fabs((double)got[i] - ref[i]);
        if (!(err <= rel * m + abs_tol)) { /* also catches NaN */
            fprintf(stderr, "%s: element %zu: got %.9g, want %.9g (err %.3g, bound %.3g)\n", what,
                    i, (double)got[i], ref[i], err, rel * m + abs_tol);
            return 0;
        }
    }
    return 1;
}

/* Bitwise equality of float arrays, with a message on the first difference. */
static inline int same_bits(const float *a, const float *b, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            fprintf(stderr, "%s: element %zu differs: %.9g vs %.9g\n", what, i, (double)a[i],
                    (double)b[i]);
            return 0;
        }
    }
    return 1;
}
