/* test_soak.c — an engine under load for a bounded time (issue 18, item 3): a small KV budget,
 * requests of random prompt and output lengths, priorities, deadlines, stop strings and tokens,
 * n > 1, shared prefixes, sampled and greedy, submitted from one thread while another cancels
 * at random, with preemption by recompute and then by swap. Afterwards:
 *   - every request ended: each sample finished (with all its tokens: max_tokens of them, or
 *     fewer for a stop) or the request was cancelled; none failed;
 *   - every request that was not cancelled produced exactly the tokens it produces alone
 *     (batch invariance under load), checked by running each again on an idle engine;
 *   - the block pool is whole (loom__kv_check) and nothing is in use;
 *   - resident memory is flat after warm-up (checked where no sanitizer holds freed memory);
 *   - the run was recorded (loom_engine_params.record_path) and its replay
 *     (loom_engine_create_replay), one thread stepping flat out, gives bitwise the same events
 *     step by step (issue 18, item 4): a digest of each step's events (kinds, ids, tokens,
 *     texts, log probabilities, reasons) is compared. LOOM_SOAK_REPLAY=0 leaves it out.
 * A request is regenerated from its index (request_of), so the record kept per request is a
 * hash of its tokens and its finish reasons, and a long soak needs little memory.
 * LOOM_SOAK_SECONDS sets the time per preemption mode (default 8; scripts/test.sh runs the
 * default, also under ASan and ThreadSanitizer); LOOM_SOAK_CHECK_EVERY=k checks every k-th
 * finished request against its run alone (default 1: all), for long runs (the long soak:
 * LOOM_SOAK_SECONDS=900 LOOM_SOAK_CHECK_EVERY=10, bench/results/soak-*.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kv/kv_manager.h"
#include "loom.h"
#include "model/synth_model.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SOAK_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SOAK_SANITIZED 1
#endif
#endif
#ifndef SOAK_SANITIZED
#define SOAK_SANITIZED 0
#endif

enum { MAX_N = 3, MAX_OUT = 40, MAX_PROMPT = 72, IN_FLIGHT = 24 };

static char g_path[512];
static loom_model *g_model;

/* ---- requests, regenerated from their index -------------------------------------------------- */

typedef struct soak_request {
    loom_request_params p;
    loom_sampler_params sp;
    loom_token prompt[MAX_PROMPT];
    const char *stops[2];
    loom_token stop_token;
} soak_request;

static uint64_t mix(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Four shared prefixes (prefix-cache hits and copy-on-write), then a private suffix. */
static void request_of(uint32_t index, soak_request *r) {
    uint64_t s = mix(index * 0x9e3779b97f4a7c15ull + 17);
    uint32_t u[12];
    for (int i = 0; i < 12; i++) u[i] = (uint32_t)(s = mix(s + (uint64_t)i));
    r->p = loom_request_default_params();
    r->sp = loom_sampler_default_params();
    size_t prefix = u[0] % 3 == 0 ? 0 : 16 + 16 * (u[1] % 2);
    size_t suffix = 1 + u[2] % (MAX_PROMPT - 32);
    for (size_t i = 0; i < prefix; i++)
        r->prompt[i] = (loom_token)(5 + (u[3] % 4 * 31 + i * 7) % 300);
    for (size_t i = 0; i < suffix; i++)
        r->prompt[prefix + i] = (loom_token)(3 + mix(s + 100 + i) % 317);
    r->p.prompt_tokens = r->prompt;
    r->p.n_prompt_tokens = prefix + suffix;
    r->p.max_tokens = 1 + (int32_t)(u[4] % MAX_OUT);
    r->p.n = u[5] % 8 == 0 ? 2 + (int32_t)(u[5] / 8 % 2) : 1;
    r->sp.temperature = u[6] % 2 ? 0.0f : 0.9f;
    r->sp.top_k = (int32_t)(u[6] / 2 % 50);
    r->sp.seed = u[7];
    r->p.sampler = &r->sp;
    static const char *stop_texts[] = {" w1", " w23", "w4"};
    if (u[8] % 4 == 0) {
        r->stops[0] = stop_texts[u[8] / 4 % 3];
        r->p.stop_strings = r->stops;
        r->p.n_stop_strings = 1;
    }
    if (u[8] % 5 == 0) {
        r->stop_token = (loom_token)(259 + u[8] / 5 % 61);
        r->p.stop_tokens = &r->stop_token;
        r->p.n_stop_tokens = 1;
    }
    r->p.ignore_eos = u[9] % 2;
    r->p.priority = (int32_t)(u[10] % 3);
    if (u[10] % 7 == 0) r->p.ttft_deadline_s = 0.05 * (1 + u[10] / 7 % 4);
    if (u[11] % 9 == 0) r->p.tpot_deadline_s = 0.01;
    r->p.cache_salt = u[11] % 5 == 0 ? 1 : 0;
}

/* ---- what each request did ------------------------------------------------------------------- */

typedef struct outcome {
    uint64_t hash[MAX_N];
    int32_t n_tokens[MAX_N];
    uint8_t reason[MAX_N];
    uint8_t finished; /* bit per sample */
    uint8_t failed;   /* the FAILED event's status (0: none) */
} outcome;

static void note_event(outcome *o, const loom_event *ev) {
    int k = ev->sample;
    if (ev->kind == LOOM_EVENT_TOKEN) {
        o->hash[k] = mix(o->hash[k] ^ (uint64_t)(uint32_t)ev->token);
        o->n_tokens[k]++;
    } else if (ev->kind == LOOM_EVENT_FINISHED) {
        o->reason[k] = (uint8_t)ev->reason;
        o->finished |= (uint8_t)(1u << k);
    } else {
        o->failed = (uint8_t)(ev->status ? ev->status : 255);
    }
}

static bool ended(const soak_request *r, const outcome *o) {
    return o->failed || o->finished == (1u << r->p.n) - 1;
}

/* ---- step digests: what a replay must reproduce --------------------------------------------- */

typedef struct step_digests {
    uint64_t *v;
    size_t n, cap;
} step_digests;

static uint64_t digest_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void push_digest(step_digests *d, const loom_event *const *ev, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (size_t k = 0; k < n; k++) {
        const loom_event *x = ev[k];
        int64_t f[] = {x->kind,   (int64_t)x->id, x->sample,        x->token,
                       x->reason, x->status,      x->cached_tokens, (int64_t)x->text_len};
        h = digest_bytes(h, f, sizeof f);
        h = digest_bytes(h, x->text, x->text_len);
        if (x->info) {
            h = digest_bytes(h, &x->info->logprob_raw, sizeof x->info->logprob_raw);
            h = digest_bytes(h, &x->info->logprob_final, sizeof x->info->logprob_final);
            h = digest_bytes(h, &x->info->entropy, sizeof x->info->entropy);
        }
    }
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 4096;
        d->v = realloc(d->v, d->cap * sizeof *d->v);
        assert_non_null(d->v);
    }
    d->v[d->n++] = h;
}

/* ---- the soak -------------------------------------------------------------------------------- */

typedef struct soak {
    loom_engine *engine;
    double until;
    uint32_t max_reqs;
    outcome *out;                 /* [max_reqs], written by the stepping thread only */
    _Atomic uint64_t *ids;        /* [max_reqs], 0 until submitted */
    _Atomic uint32_t n_submitted; /* requests 0 .. n_submitted-1 exist */
    _Atomic uint32_t n_ended;
    _Atomic bool stop;
    _Atomic int64_t cancels_sent;
    _Atomic int64_t submit_errors;
    step_digests live; /* one per loom_engine_step call, for the replay */
} soak;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *submitter(void *arg) {
    soak *S = arg;
    soak_request r;
    while (!atomic_load(&S->stop)) {
        uint32_t i = atomic_load(&S->n_submitted);
        if (i >= S->max_reqs) break;
        if (i - atomic_load(&S->n_ended) >= IN_FLIGHT) {
            usleep(200);
            continue;
        }
        request_of(i, &r);
        r.p.user_data = (void *)(uintptr_t)i;
        loom_request_id id = 0;
        if (loom_engine_submit(S->engine, &r.p, &id) != LOOM_OK) {
            atomic_fetch_add(&S->submit_errors, 1);
            break;
        }
        atomic_store(&S->ids[i], id);
        atomic_store(&S->n_submitted, i + 1);
    }
    return NULL;
}

static void *canceller(void *arg) {
    soak *S = arg;
    uint64_t s = 99;
    while (!atomic_load(&S->stop)) {
        usleep(1000 + (useconds_t)((s = mix(s)) % 4000));
        uint32_t n = atomic_load(&S->n_submitted);
        if (n == 0 || (s = mix(s)) % 3) continue; /* about one cancel per 9 ms */
        uint32_t i = n - 1 - (uint32_t)((s >> 8) % (n < IN_FLIGHT ? n : IN_FLIGHT));
        uint64_t id = atomic_load(&S->ids[i]);
        if (id && loom_engine_cancel(S->engine, id) == LOOM_OK)
            atomic_fetch_add(&S->cancels_sent, 1);
    }
    return NULL;
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(f);
    }
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static void step_events(soak *S) {
    const loom_event *const *ev = NULL;
    size_t n = 0;
    loom_status st = loom_engine_step(S->engine, &ev, &n);
    if (st != LOOM_OK) fail_msg("step: %s", loom_last_error());
    push_digest(&S->live, ev, n);
    for (size_t k = 0; k < n; k++) {
        uint32_t i = (uint32_t)(uintptr_t)ev[k]->user_data;
        soak_request r;
        request_of(i, &r);
        bool was = ended(&r, &S->out[i]);
        if (ev[k]->kind == LOOM_EVENT_FAILED)
            fprintf(stderr, "soak: request %u failed (%s); the step's last error: %s\n", i,
                    loom_status_str(ev[k]->status), loom_last_error());
        note_event(&S->out[i], ev[k]);
        if (!was && ended(&r, &S->out[i])) atomic_fetch_add(&S->n_ended, 1);
    }
}

/* Runs request i alone on an idle engine into o. */
static void run_alone(loom_engine *e, uint32_t i, outcome *o) {
    soak_request r;
    request_of(i, &r);
    r.p.user_data = (void *)(uintptr_t)i;
    r.p.ttft_deadline_s = r.p.tpot_deadline_s = 0;
    memset(o, 0, sizeof *o);
    loom_request_id id;
    assert_int_equal(loom_engine_submit(e, &r.p, &id), LOOM_OK);
    while (loom_engine_has_work(e)) {
        const loom_event *const *ev = NULL;
        size_t n = 0;
        assert_int_equal(loom_engine_step(e, &ev, &n), LOOM_OK);
        for (size_t k = 0; k < n; k++) note_event(o, ev[k]);
    }
}

static double env_number(const char *name, double def) {
    const char *s = getenv(name);
    double v = s && *s ? atof(s) : def;
    return v > 0 ? v : def;
}

/* Replays the record of a soak and compares each step's events with the recorded run's. */
static void check_replay(const char *rec, const step_digests *live, const char *name) {
    loom_engine *e = NULL;
    if (loom_engine_create_replay(g_model, rec, NULL, &e) != LOOM_OK)
        fail_msg("%s: replay: %s", name, loom_last_error());
    step_digests again = {0};
    double t0 = now_s();
    while (loom_engine_has_work(e)) {
        const loom_event *const *ev = NULL;
        size_t n = 0;
        if (loom_engine_step(e, &ev, &n) != LOOM_OK)
            fail_msg("%s: replay step %zu: %s", name, again.n, loom_last_error());
        push_digest(&again, ev, n);
        if (again.n > live->n) fail_msg("%s: the replay has more steps than the run", name);
        if (again.v[again.n - 1] != live->v[again.n - 1])
            fail_msg("%s: replay step %zu of %zu: other events than the recorded run's", name,
                     again.n - 1, live->n);
    }
    loom_engine_destroy(e);
    if (again.n != live->n)
        fail_msg("%s: the replay ran %zu steps, the run %zu", name, again.n, live->n);
    long size = 0;
    FILE *f = fopen(rec, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        size = ftell(f);
        fclose(f);
    }
    printf("soak %s: replayed %zu steps from a record of %ld KB in %.1f s: every step's events "
           "equal\n",
           name, again.n, size / 1024, now_s() - t0);
    free(again.v);
    remove(rec);
}

static void run_soak(loom_preempt_mode mode, const char *name) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 192 << 10; /* about 48 blocks of 16 tokens: fewer than IN_FLIGHT requests need */
    ep.max_ctx = 128;
    ep.max_seqs = 12;
    ep.max_batched_tokens = 48;
    ep.preempt = mode;
    ep.starvation_s = 0.5;
    ep.n_sample_threads = 1;
    const char *replay_env = getenv("LOOM_SOAK_REPLAY");
    const bool replay = !(replay_env && strcmp(replay_env, "0") == 0);
    char rec[512], file[64];
    snprintf(file, sizeof file, "soak-%s.rec", name);
    synth_path(rec, sizeof rec, file);
    if (replay) ep.record_path = rec;
    soak S;
    memset(&S, 0, sizeof S);
    assert_int_equal(loom_engine_create(g_model, &ep, &S.engine), LOOM_OK);
    double secs = env_number("LOOM_SOAK_SECONDS", 8), t0;
    const uint32_t every = (uint32_t)env_number("LOOM_SOAK_CHECK_EVERY", 1);
    /* Room for 4,000 requests a second (about twice what a fast machine serves), touched now
     * so that the records' pages are not mistaken for the engine's growth. */
    S.max_reqs = (uint32_t)(4000 * secs) + 4096;
    S.out = malloc((size_t)S.max_reqs * sizeof *S.out);
    S.ids = malloc((size_t)S.max_reqs * sizeof *S.ids);
    assert_non_null(S.out);
    assert_non_null(S.ids);
    memset(S.out, 0, (size_t)S.max_reqs * sizeof *S.out);
    for (uint32_t i = 0; i < S.max_reqs; i++) atomic_init(&S.ids[i], 0);
    /* The step digests likewise (a fast machine steps about 5,000 times a second here). */
    S.live.cap = (size_t)(10000 * secs) + 65536;
    S.live.v = malloc(S.live.cap * sizeof *S.live.v);
    assert_non_null(S.live.v);
    memset(S.live.v, 0, S.live.cap * sizeof *S.live.v);
    t0 = now_s();
    S.until = t0 + secs;
    pthread_t sub, can;
    assert_int_equal(pthread_create(&sub, NULL, submitter, &S), 0);
    assert_int_equal(pthread_create(&can, NULL, canceller, &S), 0);
    long rss_warm = 0, rss_peak = 0;
    while (now_s() < S.until) {
        if (loom_engine_has_work(S.engine)) {
            step_events(&S);
        } else {
            usleep(100);
        }
        long rss = rss_kb();
        if (rss > rss_peak) rss_peak = rss;
        if (!rss_warm && now_s() > t0 + secs / 4) rss_warm = rss;
    }
    atomic_store(&S.stop, true);
    pthread_join(sub, NULL);
    pthread_join(can, NULL);
    while (loom_engine_has_work(S.engine)) step_events(&S);
    long rss_end = rss_kb();

    loom_engine_stats st = {.size = sizeof st};
    assert_int_equal(loom_engine_get_stats(S.engine, &st), LOOM_OK);
    assert_int_equal(atomic_load(&S.submit_errors), 0);
    assert_int_equal(loom__kv_check(S.engine->kv), LOOM_OK);
    assert_int_equal(st.running + st.waiting + st.kv_blocks_used, 0);

    /* Every request ended; a cancelled one is any with a CANCELLED sample. */
    uint32_t n = atomic_load(&S.n_submitted);
    int64_t n_cancelled = 0, n_finished = 0, n_tokens = 0, n_checked = 0;
    loom_engine *alone = NULL;
    loom_engine_params ap = ep;
    ap.preempt = LOOM_PREEMPT_RECOMPUTE;
    ap.kv_bytes = 4 << 20;
    ap.record_path = NULL; /* the soak's record is replayed below */
    assert_int_equal(loom_engine_create(g_model, &ap, &alone), LOOM_OK);
    for (uint32_t i = 0; i < n; i++) {
        soak_request r;
        request_of(i, &r);
        const outcome *o = &S.out[i];
        if (o->failed)
            fail_msg("%s: request %u failed: %s (prompt %zu tokens, n %d, max_tokens %d)", name, i,
                     loom_status_str((loom_status)o->failed), r.p.n_prompt_tokens, r.p.n,
                     r.p.max_tokens);
        if (!ended(&r, o)) fail_msg("%s: request %u did not end", name, i);
        bool cancelled = false;
        for (int k = 0; k < r.p.n; k++) {
            cancelled |= o->reason[k] == LOOM_FINISH_CANCELLED;
            n_tokens += o->n_tokens[k];
            if (o->reason[k] == LOOM_FINISH_LENGTH && o->n_tokens[k] != r.p.max_tokens)
                fail_msg("%s: request %u sample %d: %d tokens of %d", name, i, k, o->n_tokens[k],
                         r.p.max_tokens);
        }
        if (cancelled) {
            n_cancelled++;
            continue;
        }
        n_finished++;
        if (n_finished % every != 0) continue;
        outcome a;
        run_alone(alone, i, &a);
        n_checked++;
        for (int k = 0; k < r.p.n; k++) {
            if (a.hash[k] != o->hash[k] || a.n_tokens[k] != o->n_tokens[k] ||
                a.reason[k] != o->reason[k])
                fail_msg("%s: request %u sample %d: %d tokens (reason %d) under load, %d (reason "
                         "%d) alone",
                         name, i, k, o->n_tokens[k], o->reason[k], a.n_tokens[k], a.reason[k]);
        }
    }
    loom_engine_destroy(alone);
    printf("soak %s: %.0f s, %u requests (%lld finished, %lld cancelled; %lld cancels sent), "
           "%lld tokens, %lld preemptions, %lld steps; %lld checked against alone: equal; RSS "
           "warm %ld KB, peak %ld KB, end %ld KB\n",
           name, secs, n, (long long)n_finished, (long long)n_cancelled,
           (long long)atomic_load(&S.cancels_sent), (long long)n_tokens, (long long)st.preemptions,
           (long long)st.steps, (long long)n_checked, rss_warm, rss_peak, rss_end);
    assert_true(n > 50);
    assert_true(n_cancelled > 0);
    assert_true(st.preemptions > 0);
    /* Flat after warm-up: the engine allocates what it needs in its first requests; where no
     * sanitizer quarantines freed memory, later growth would be a leak or a grown cache. */
    if (!SOAK_SANITIZED) assert_true(rss_end <= rss_warm + 16 * 1024);
    loom_engine_destroy(S.engine);
    if (replay) check_replay(rec, &S.live, name);
    free(S.live.v);
    free(S.out);
    free((void *)S.ids);
}

static void test_soak_recompute(void **state) {
    (void)state;
    run_soak(LOOM_PREEMPT_RECOMPUTE, "recompute");
}

static void test_soak_swap(void **state) {
    (void)state;
    run_soak(LOOM_PREEMPT_SWAP, "swap");
}

static int setup(void **state) {
    (void)state;
    synth_path(g_path, sizeof g_path, "soak-llama.gguf");
    if (synth_write(g_path, &SYNTH_LLAMA, 31) != 0) return -1;
    loom_model_params p = loom_model_default_params();
    p.backend = "cpu";
    p.n_threads = 1;
    return loom_model_load(g_path, &p, &g_model) == LOOM_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    loom_model_free(g_model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_soak_recompute),
        cmocka_unit_test(test_soak_swap),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
