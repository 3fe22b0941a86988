/* membw.c — loom-membw: the machine's main-memory read bandwidth, the roofline of decoding.
 *
 *   loom-membw [-t THREADS] [-m MIB] [-r REPS]
 *
 * Reads a buffer of MIB MiB (default 1024: far larger than any L3 we run on) split evenly
 * over 1, 2, ... THREADS threads (default: the online cores), REPS times each (default 5), and
 * prints the best and the median GB/s per thread count. One-token decoding streams every
 * weight once per token, so tokens/s can never exceed this figure / the bytes of weights; the
 * issue-5 results quote decode against it.
 *
 * Two ways of reading, both printed. "streams": each thread reads its share as STREAMS
 * interleaved streams (1 KiB from each in turn) with 64-byte vectors: the most the memory
 * gives a thread here, and the roofline figure (the first two columns). "single": one
 * sequential stream per thread with 32-byte vectors, the simple loop. On our shared Xeon VMs
 * a single stream reads 20-25% less (two threads: 19-22 GB/s against 25-33 GB/s, alternated
 * runs): one stream cannot keep enough lines in flight, and the hardware prefetcher runs
 * further ahead on several. Every reader keeps independent sums and publishes them, so that the
 * compiler cannot drop the loop. */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct reader {
    const uint64_t *p;
    size_t n; /* words */
    uint64_t sum;
} reader;

/* 32- and 64-byte vectors (GCC / clang vector extension): one AVX / AVX-512 load each where
 * the build allows (LOOM_NATIVE), several narrower ones otherwise. */
typedef uint64_t v4u64 __attribute__((vector_size(32)));
typedef uint64_t v8u64 __attribute__((vector_size(64)));

#define STREAMS     4
#define CHUNK_WORDS 128 /* 1 KiB from each stream in turn */

/* One sequential stream of 32-byte loads. */
static void *read_single(void *arg) {
    reader *r = arg;
    v4u64 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    const v4u64 *v = (const v4u64 *)r->p; /* 64-byte aligned: see main */
    size_t i = 0;
    for (; i + 16 <= r->n; i += 16, v += 4) {
        s0 += v[0];
        s1 += v[1];
        s2 += v[2];
        s3 += v[3];
    }
    uint64_t sum = 0;
    for (; i < r->n; i++) sum += r->p[i];
    const v4u64 t = s0 ^ s1 ^ s2 ^ s3;
    r->sum = sum ^ t[0] ^ t[1] ^ t[2] ^ t[3];
    return NULL;
}

/* STREAMS streams over the quarters of the share, CHUNK_WORDS of each in turn, 64-byte loads;
 * the words past the last whole chunk of each quarter one at a time. */
static void *read_streams(void *arg) {
    reader *r = arg;
    v8u64 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    const size_t q = r->n / STREAMS / CHUNK_WORDS * CHUNK_WORDS; /* words per stream */
    for (size_t c = 0; c < q; c += CHUNK_WORDS)
        for (size_t k = 0; k < STREAMS; k++) {
            const v8u64 *v = (const v8u64 *)(r->p + k * q + c);
            for (size_t i = 0; i < CHUNK_WORDS / 8; i += 4) {
                s0 += v[i];
                s1 += v[i + 1];
                s2 += v[i + 2];
                s3 += v[i + 3];
            }
        }
    uint64_t sum = 0;
    for (size_t i = STREAMS * q; i < r->n; i++) sum += r->p[i];
    const v8u64 t = s0 ^ s1 ^ s2 ^ s3;
    for (int k = 0; k < 8; k++) sum ^= t[k];
    r->sum = sum;
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long arg_long(int argc, char **argv, int *i, long lo, long hi) {
    char *end = NULL;
    long v = *i + 1 < argc ? strtol(argv[*i + 1], &end, 10) : lo - 1;
    if (!end || *end || v < lo || v > hi) {
        fprintf(stderr, "loom-membw: %s wants a number in %ld..%ld\n", argv[*i], lo, hi);
        exit(2);
    }
    (*i)++;
    return v;
}

int main(int argc, char **argv) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long threads = cores > 0 ? cores : 1, mib = 1024, reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t"))
            threads = arg_long(argc, argv, &i, 1, 256);
        else if (!strcmp(argv[i], "-m"))
            mib = arg_long(argc, argv, &i, 1, 1L << 20);
        else if (!strcmp(argv[i], "-r"))
            reps = arg_long(argc, argv, &i, 1, 1000);
        else {
            fprintf(stderr, "usage: loom-membw [-t THREADS] [-m MIB] [-r REPS]\n");
            return 2;
        }
    }
    const size_t bytes = (size_t)mib << 20, words = bytes / sizeof(uint64_t);
    uint64_t *buf = aligned_alloc(64, bytes);
    reader *rd = calloc((size_t)threads, sizeof *rd);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    double *gbs = calloc((size_t)reps, sizeof *gbs);
    if (!buf || !rd || !th || !gbs) {
        fprintf(stderr, "loom-membw: out of memory (%ld MiB)\n", mib);
        return 1;
    }
    for (size_t i = 0; i < words; i++) buf[i] = i; /* touch every page */
    uint64_t published = 0;
    printf("threads  best GB/s  median GB/s  single: best  median  (%ld MiB read %ld times; "
           "%d streams per thread, then one)\n",
           mib, reps, STREAMS);
    for (long t = 1; t <= threads; t++) {
        double best[2], med[2];
        for (int way = 0; way < 2; way++) {
            for (long r = 0; r < reps; r++) {
                const double t0 = now_s();
                const size_t share = words / (size_t)t / 8 * 8; /* whole 64-byte lines */
                for (long k = 0; k < t; k++) {
                    rd[k].p = buf + share * (size_t)k;
                    rd[k].n = k == t - 1 ? words - share * (size_t)k : share;
                    if (pthread_create(&th[k], NULL, way == 0 ? read_streams : read_single,
                                       &rd[k]) != 0) {
                        fprintf(stderr, "loom-membw: cannot start thread %ld\n", k);
                        return 1;
                    }
                }
                for (long k = 0; k < t; k++) {
                    pthread_join(th[k], NULL);
                    published ^= rd[k].sum;
                }
                gbs[r] = (double)bytes / (now_s() - t0) * 1e-9;
            }
            qsort(gbs, (size_t)reps, sizeof *gbs, cmp_double);
            best[way] = gbs[reps - 1];
            med[way] = gbs[reps / 2];
        }
        printf("%7ld  %9.1f  %11.1f  %12.1f  %6.1f\n", t, best[0], med[0], best[1], med[1]);
    }
    fprintf(stderr, "(checksum %llx)\n", (unsigned long long)published);
    free(buf);
    free(rd);
    free(th);
    free(gbs);
    return 0;
}
