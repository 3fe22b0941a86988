/* decode_driver.c — loom-decode-driver: decode a fixed sequence of token ids, one per call.
 *
 *   loom-decode-driver -m MODEL [-n N] [-p P] [-t THREADS] [--seed S]
 *
 * Loads MODEL, runs a prompt of P token ids in one loom_session_decode call, then N calls of
 * one token each, and prints the timings on stderr. Token ids are drawn from a fixed-seed
 * generator over [3, n_vocab), so every run does exactly the same work: there is no sampling,
 * no end-of-sequence stop and no tokenizer. bench/compare-llamacpp/compare.py --callgrind runs
 * it under callgrind with two values of N; the difference of the instruction counts divided
 * by the difference of N is the cost of one decoded token, with loading and the prompt
 * cancelled out. Uses only the public API (include/loom.h). */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f) {
    fprintf(f, "usage: loom-decode-driver -m MODEL [-n N] [-p P] [-t THREADS] [--seed S]\n"
               "  -n N        tokens decoded one per call after the prompt (default 16)\n"
               "  -p P        prompt tokens, decoded in one call (default 4)\n"
               "  -t THREADS  compute threads (default 1)\n"
               "  --seed S    seed of the token ids (default 1)\n");
}

/* Parses a non-negative integer argument or exits with a message naming the flag. */
static long int_arg(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "loom-decode-driver: %s needs a value\n", argv[*i]);
        exit(2);
    }
    char *end = NULL;
    errno = 0;
    long v = strtol(argv[*i + 1], &end, 10);
    if (errno || end == argv[*i + 1] || *end || v < 0 || v > (1L << 20)) {
        fprintf(stderr, "loom-decode-driver: %s: not a count: %s\n", argv[*i], argv[*i + 1]);
        exit(2);
    }
    (*i)++;
    return v;
}

/* splitmix64: the token-id stream. */
static uint64_t next_u64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int fail(loom_status st, const char *what) {
    fprintf(stderr, "loom-decode-driver: %s: %s: %s\n", what, loom_status_str(st),
            loom_last_error());
    return 1;
}

int main(int argc, char **argv) {
    const char *model_path = NULL;
    long n_decode = 16, n_prompt = 4, n_threads = 1, seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && i + 1 < argc) {
            model_path = argv[++i];
        } else if (!strcmp(a, "-n")) {
            n_decode = int_arg(argc, argv, &i);
        } else if (!strcmp(a, "-p")) {
            n_prompt = int_arg(argc, argv, &i);
        } else if (!strcmp(a, "-t")) {
            n_threads = int_arg(argc, argv, &i);
        } else if (!strcmp(a, "--seed")) {
            seed = int_arg(argc, argv, &i);
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!model_path || n_prompt < 1) {
        usage(stderr);
        return 2;
    }

    double t0 = now_s();
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = (int)n_threads;
    loom_model *model = NULL;
    loom_status st = loom_model_load(model_path, &mp, &model);
    if (st != LOOM_OK) return fail(st, "loading the model");
    loom_model_info info = {.size = sizeof info};
    loom_model_get_info(model, &info);

    loom_session_params sp = loom_session_default_params();
    sp.n_ctx = (int32_t)(n_prompt + n_decode);
    loom_session *session = NULL;
    st = loom_session_create(model, &sp, &session);
    if (st != LOOM_OK) {
        loom_model_free(model);
        return fail(st, "creating the session");
    }

    loom_token *ids = malloc((size_t)(n_prompt + n_decode) * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "loom-decode-driver: out of memory\n");
        return 1;
    }
    uint64_t rng = (uint64_t)seed;
    for (long i = 0; i < n_prompt + n_decode; i++)
        ids[i] = 3 + (loom_token)(next_u64(&rng) % (uint64_t)(info.n_vocab - 3));

    double t1 = now_s();
    st = loom_session_decode(session, ids, (int32_t)n_prompt, false);
    double t2 = now_s();
    for (long i = 0; st == LOOM_OK && i < n_decode; i++)
        st = loom_session_decode(session, ids + n_prompt + i, 1, false);
    double t3 = now_s();
    if (st == LOOM_OK && !loom_session_logits(session, -1)) st = LOOM_ERR_INTERNAL;
    int rc = st == LOOM_OK ? 0 : fail(st, "decoding");
    if (rc == 0)
        fprintf(stderr,
                "loom-decode-driver: %s, %ld threads: load %.3f s; prompt %ld tokens %.3f s; "
                "decode %ld tokens %.3f s (%.2f tok/s)\n",
                info.name, n_threads, t1 - t0, n_prompt, t2 - t1, n_decode, t3 - t2,
                n_decode > 0 ? (double)n_decode / (t3 - t2) : 0.0);
    free(ids);
    loom_session_free(session);
    loom_model_free(model);
    return rc;
}
