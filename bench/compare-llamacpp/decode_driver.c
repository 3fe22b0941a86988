/* decode_driver.c — loom-decode-driver: decode a fixed sequence of token ids, one per call.
 *
 *   loom-decode-driver -m MODEL [-n N] [-p P] [-t THREADS] [--seed S] [--seqs S]
 *
 * Loads MODEL, runs a prompt of P token ids in one loom_session_decode call, then N calls of
 * one token each, and prints the timings on stderr. With --seqs S (S > 1) it runs S requests
 * of P prompt tokens each through an engine instead, greedy for N tokens each, and times the
 * steps from the one in which every sequence has its first token to the end: batched decode,
 * S tokens a step (compare.py's "batched" figure). Token ids are drawn from a fixed-seed
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
               "  --seed S    seed of the token ids (default 1)\n"
               "  --seqs S    S sequences decoding together through an engine (default 1: a\n"
               "              session)\n");
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

/* The driver builds against the header of the library it runs (steps.py compiles it against
 * older commits too): loom 0.2 gave results a size field and handed out event pointers. */
#if LOOM_VERSION_NUMBER >= 200
#define RESULT_INIT(x)                                                                             \
    { .size = sizeof(x) }
typedef const loom_event *const *event_list;
#define EVENT(list, k) ((list)[k])
#else
#define RESULT_INIT(x)                                                                             \
    { 0 }
typedef const loom_event *event_list;
#define EVENT(list, k) (&(list)[k])
#endif

/* n_seqs requests of the prompt ids[s*n_prompt ..], greedy for n_decode tokens each; returns
 * batched decode tokens/s (the steps after every sequence has its first token). */
static int run_batched(loom_model *model, const loom_token *ids, long n_seqs, long n_prompt,
                       long n_decode, double *tok_s) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = (int64_t)256 << 20;
    ep.max_seqs = (int32_t)n_seqs;
    ep.max_batched_tokens = (int32_t)(n_seqs * n_prompt > 512 ? n_seqs * n_prompt : 512);
    ep.max_ctx = (int32_t)(n_prompt + n_decode + 16);
    loom_engine *e = NULL;
    loom_status st = loom_engine_create(model, &ep, &e);
    if (st != LOOM_OK) return fail(st, "creating the engine");
#if LOOM_VERSION_NUMBER >= 200
    loom_sampler_params sp = loom_sampler_default_params();
    sp.temperature = 0.0f;
#endif
    for (long s = 0; s < n_seqs && st == LOOM_OK; s++) {
        loom_request_params rq = loom_request_default_params();
        rq.prompt_tokens = ids + s * n_prompt;
        rq.n_prompt_tokens = (size_t)n_prompt;
        rq.max_tokens = (int32_t)n_decode;
        rq.ignore_eos = true;
#if LOOM_VERSION_NUMBER >= 200
        rq.sampler = &sp;
#else
        rq.sampler.temperature = 0.0f;
#endif
        loom_request_id id;
        st = loom_engine_submit(e, &rq, &id);
    }
    long started = 0, counted = 0;
    double t0 = 0;
    while (st == LOOM_OK && loom_engine_has_work(e)) {
        event_list ev = NULL;
        size_t n = 0;
        st = loom_engine_step(e, &ev, &n);
        for (size_t k = 0; st == LOOM_OK && k < n; k++) {
            const loom_event *x = EVENT(ev, k);
            if (x->kind == LOOM_EVENT_FAILED) st = x->status;
            if (x->kind != LOOM_EVENT_TOKEN) continue;
            if (t0 > 0)
                counted++;
            else
                started++;
        }
        if (t0 == 0 && started >= n_seqs) t0 = now_s();
    }
    double t1 = now_s();
    loom_engine_destroy(e);
    if (st != LOOM_OK) return fail(st, "batched decode");
    *tok_s = counted > 0 ? (double)counted / (t1 - t0) : 0;
    return 0;
}

int main(int argc, char **argv) {
    const char *model_path = NULL;
    long n_decode = 16, n_prompt = 4, n_threads = 1, seed = 1, n_seqs = 1;
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
        } else if (!strcmp(a, "--seqs")) {
            n_seqs = int_arg(argc, argv, &i);
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
    loom_model_info info = RESULT_INIT(info);
    loom_model_get_info(model, &info);

    if (n_seqs > 1) {
        loom_token *ids = malloc((size_t)(n_seqs * n_prompt) * sizeof *ids);
        if (!ids) return fail(LOOM_ERR_OUT_OF_MEMORY, "token ids");
        uint64_t rng = (uint64_t)seed;
        for (long i = 0; i < n_seqs * n_prompt; i++)
            ids[i] = 3 + (loom_token)(next_u64(&rng) % (uint64_t)(info.n_vocab - 3));
        double tok_s = 0;
        int rc = run_batched(model, ids, n_seqs, n_prompt, n_decode, &tok_s);
        if (rc == 0)
            fprintf(stderr,
                    "loom-decode-driver: %s, %ld threads: batched %ld sequences %.2f tok/s\n",
                    info.name, n_threads, n_seqs, tok_s);
        free(ids);
        loom_model_free(model);
        return rc;
    }

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
