/* test_replay.c — deterministic replay (loom_engine_params.record_path,
 * loom_engine_create_replay): a recorded run replays to bitwise the same events, though the
 * recorded one slept between steps so that its deadlines, priorities by age and starvation
 * promotions saw other clock readings than a replay running flat out would; a record cut short
 * (a crashed run) replays up to its end; a malformed record, a record of another model, and
 * every truncation and many byte mutations of a good one fail with a clean status, never a
 * crash (the suite runs under ASan + UBSan too). The concurrent case — submitters and
 * cancellers on other threads — is test_soak.c's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom.h"
#include "model/synth_model.h"

static char g_path[512], g_other_path[512], g_twin_path[512], g_rec[512], g_bad[512];
static loom_model *g_model, *g_other, *g_twin; /* g_twin: g_model's shape, other weights */

/* ---- events, kept whole ---------------------------------------------------------------------- */

typedef struct ev_rec {
    int64_t step;
    int kind, sample, reason, status, cached, n_top;
    uint64_t id;
    loom_token token;
    uint32_t lp_raw, lp_final; /* bit patterns */
    uint64_t entropy;
    loom_token top[4];
    char text[48];
} ev_rec;

typedef struct ev_log {
    ev_rec *v;
    size_t n, cap;
    int64_t steps;
} ev_log;

static void log_events(ev_log *L, const loom_event *const *ev, size_t n) {
    for (size_t k = 0; k < n; k++) {
        if (L->n == L->cap) {
            L->cap = L->cap ? L->cap * 2 : 1024;
            L->v = realloc(L->v, L->cap * sizeof *L->v);
            assert_non_null(L->v);
        }
        ev_rec *r = &L->v[L->n++];
        memset(r, 0, sizeof *r);
        r->step = L->steps;
        r->kind = ev[k]->kind;
        r->id = ev[k]->id;
        r->sample = ev[k]->sample;
        r->token = ev[k]->token;
        r->reason = ev[k]->reason;
        r->status = ev[k]->status;
        r->cached = ev[k]->cached_tokens;
        size_t len = ev[k]->text_len < sizeof r->text - 1 ? ev[k]->text_len : sizeof r->text - 1;
        if (len) memcpy(r->text, ev[k]->text, len);
        if (ev[k]->info) {
            memcpy(&r->lp_raw, &ev[k]->info->logprob_raw, 4);
            memcpy(&r->lp_final, &ev[k]->info->logprob_final, 4);
            memcpy(&r->entropy, &ev[k]->info->entropy, 8);
            r->n_top = ev[k]->info->n_top_raw < 4 ? ev[k]->info->n_top_raw : 4;
            for (int i = 0; i < r->n_top; i++) r->top[i] = ev[k]->info->top_raw[i].id;
        }
    }
    L->steps++;
}

static void step_into(loom_engine *e, ev_log *L) {
    const loom_event *const *ev = NULL;
    size_t n = 0;
    loom_status st = loom_engine_step(e, &ev, &n);
    if (st != LOOM_OK) fail_msg("step %lld: %s", (long long)L->steps, loom_last_error());
    log_events(L, ev, n);
}

/* ---- a recorded run ---------------------------------------------------------------------------
 */

static uint64_t mix(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void submit_one(loom_engine *e, uint32_t i, loom_request_id *id) {
    uint64_t s = mix(i + 1000);
    loom_token prompt[40];
    size_t np = 4 + s % 30;
    for (size_t k = 0; k < np; k++) prompt[k] = (loom_token)(3 + mix(s + k) % 300);
    if (i % 3 == 0) { /* a shared prefix: prefix-cache hits */
        for (size_t k = 0; k < 16 && k < np; k++) prompt[k] = (loom_token)(7 + k);
    }
    loom_sampler_params sp = loom_sampler_default_params();
    sp.temperature = i % 2 ? 0.8f : 0.0f;
    sp.seed = s;
    sp.n_logprobs = i % 4 == 0 ? 3 : 0;
    sp.repeat_penalty = i % 5 == 0 ? 1.2f : 1.0f;
    loom_logit_bias bias = {.id = 42, .bias = -2.5f};
    if (i % 6 == 0) {
        sp.logit_bias = &bias;
        sp.n_logit_bias = 1;
    }
    loom_request_params p = loom_request_default_params();
    p.prompt_tokens = prompt;
    p.n_prompt_tokens = np;
    p.sampler = &sp;
    p.max_tokens = 4 + (int32_t)(s / 7 % 24);
    p.n = i % 7 == 0 ? 2 : 1;
    const char *stops[] = {" w1"};
    if (i % 4 == 1) {
        p.stop_strings = stops;
        p.n_stop_strings = 1;
    }
    loom_token stop_tok = 300;
    if (i % 5 == 2) {
        p.stop_tokens = &stop_tok;
        p.n_stop_tokens = 1;
    }
    p.ignore_eos = i % 2;
    p.priority = (int32_t)(i % 3);
    if (i % 4 == 3) p.ttft_deadline_s = 0.002 * (1 + i % 5); /* tight: the clock decides */
    if (i % 9 == 4) p.tpot_deadline_s = 0.001;
    p.cache_salt = i % 8 == 5 ? 77 : 0;
    if (i % 10 == 9) p.arrival_s = loom_engine_now() - 0.01; /* queued before its submit */
    assert_int_equal(loom_engine_submit(e, &p, id), LOOM_OK);
}

static loom_engine_params small_engine(loom_preempt_mode mode) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 96 << 10; /* few blocks: preemption */
    ep.max_ctx = 96;
    ep.max_seqs = 6;
    ep.max_batched_tokens = 24;
    ep.preempt = mode;
    ep.starvation_s = 0.004;
    ep.max_logprobs = 4;
    ep.n_sample_threads = 1;
    return ep;
}

/* Runs a workload on an engine recording into path: requests arrive over the first steps
 * (twenty in the first),
 * a few are cancelled (one twice, one after it finished), and the caller sleeps between steps
 * so the clock moves as it would under load. */
static void recorded_run(loom_preempt_mode mode, const char *path, ev_log *L) {
    loom_engine_params ep = small_engine(mode);
    ep.record_path = path;
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(g_model, &ep, &e), LOOM_OK);
    loom_request_id ids[40] = {0};
    uint32_t next = 0;
    for (int t = 0; next < 40 || loom_engine_has_work(e); t++) {
        /* 20 at once first: one step takes more records than the reader's arrays start with */
        for (int k = 0; k < (t == 0 ? 20 : 3) && next < 40 && t % 2 == 0; k++)
            submit_one(e, next, &ids[next]), next++;
        if (t == 5 || t == 9) (void)loom_engine_cancel(e, ids[t]);
        if (t == 12) { /* the same request twice, and a finished or unknown one */
            (void)loom_engine_cancel(e, ids[11]);
            (void)loom_engine_cancel(e, ids[11]);
            (void)loom_engine_cancel(e, ids[0]);
        }
        step_into(e, L);
        usleep((useconds_t)(mix((uint64_t)t) % 3000));
        assert_true(t < 100000);
    }
    loom_engine_destroy(e);
}

static void replay_into(const char *path, ev_log *L, int32_t n_sample_threads) {
    loom_engine_params rp = loom_engine_default_params();
    rp.n_sample_threads = n_sample_threads;
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create_replay(g_model, path, &rp, &e), LOOM_OK);
    while (loom_engine_has_work(e)) step_into(e, L);
    /* Past the end: nothing more, and no error. */
    const loom_event *const *ev = NULL;
    size_t n = 7;
    assert_int_equal(loom_engine_step(e, &ev, &n), LOOM_OK);
    assert_int_equal(n, 0);
    loom_engine_destroy(e);
}

static void assert_same(const ev_log *a, const ev_log *b) {
    assert_int_equal(a->steps, b->steps);
    assert_int_equal(a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        if (memcmp(&a->v[i], &b->v[i], sizeof a->v[i]) != 0)
            fail_msg("event %zu (step %lld, request %llu, kind %d) differs in the replay: "
                     "request %llu kind %d sample %d token %d text '%s' reason %d status %d "
                     "cached %d, replayed: request %llu kind %d sample %d token %d text '%s' "
                     "reason %d status %d cached %d",
                     i, (long long)a->v[i].step, (unsigned long long)a->v[i].id, a->v[i].kind,
                     (unsigned long long)a->v[i].id, a->v[i].kind, a->v[i].sample, a->v[i].token,
                     a->v[i].text, a->v[i].reason, a->v[i].status, a->v[i].cached,
                     (unsigned long long)b->v[i].id, b->v[i].kind, b->v[i].sample, b->v[i].token,
                     b->v[i].text, b->v[i].reason, b->v[i].status, b->v[i].cached);
    }
}

static void check_mode(loom_preempt_mode mode) {
    ev_log live = {0}, again = {0};
    recorded_run(mode, g_rec, &live);
    /* The run did what the test is about: tokens, cancellations, n > 1. */
    size_t tokens = 0, cancelled = 0;
    for (size_t i = 0; i < live.n; i++) {
        tokens += live.v[i].kind == LOOM_EVENT_TOKEN;
        cancelled +=
            live.v[i].kind == LOOM_EVENT_FINISHED && live.v[i].reason == LOOM_FINISH_CANCELLED;
    }
    assert_true(tokens > 200);
    assert_true(cancelled >= 2);
    replay_into(g_rec, &again, 2); /* other sampler threads: tokens never depend on them */
    assert_same(&live, &again);
    free(live.v);
    free(again.v);
}

static void test_replay_recompute(void **state) {
    (void)state;
    check_mode(LOOM_PREEMPT_RECOMPUTE);
}

static void test_replay_swap(void **state) {
    (void)state;
    check_mode(LOOM_PREEMPT_SWAP);
}

/* ---- records that are not right ---------------------------------------------------------------
 */

static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

static unsigned char *read_all(const char *path, long *n) {
    *n = file_size(path);
    unsigned char *b = malloc((size_t)*n);
    FILE *f = fopen(path, "rb");
    assert_non_null(b);
    assert_non_null(f);
    assert_int_equal(fread(b, 1, (size_t)*n, f), (size_t)*n);
    fclose(f);
    return b;
}

static void write_all(const char *path, const unsigned char *b, long n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
}

/* The size of a record's header: the file of an engine that never stepped. */
static long header_size(void) {
    loom_engine_params ep = small_engine(LOOM_PREEMPT_RECOMPUTE);
    ep.record_path = g_bad;
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(g_model, &ep, &e), LOOM_OK);
    loom_engine_destroy(e);
    return file_size(g_bad);
}

/* Replays path as far as it goes: OK to its end, or a status with a message. */
static loom_status replay_status(const char *path, int64_t *steps) {
    loom_engine *e = NULL;
    loom_status st = loom_engine_create_replay(g_model, path, NULL, &e);
    *steps = 0;
    if (st != LOOM_OK) {
        assert_true(strlen(loom_last_error()) > 0);
        assert_null(e);
        return st;
    }
    while (loom_engine_has_work(e) && st == LOOM_OK) {
        const loom_event *const *ev = NULL;
        size_t n = 0;
        st = loom_engine_step(e, &ev, &n);
        if (st != LOOM_OK) assert_true(strlen(loom_last_error()) > 0);
        (*steps)++;
        assert_true(*steps < 100000);
    }
    loom_engine_destroy(e);
    return st;
}

static void test_replay_bad_records(void **state) {
    (void)state;
    ev_log live = {0};
    recorded_run(LOOM_PREEMPT_RECOMPUTE, g_rec, &live);
    long n;
    unsigned char *good = read_all(g_rec, &n);
    int64_t steps;

    /* Not a record; another version; a missing file; a directory. */
    write_all(g_bad, (const unsigned char *)"GGUF\3\0\0\0 not a record", 20);
    assert_int_equal(replay_status(g_bad, &steps), LOOM_ERR_BAD_INPUT);
    assert_non_null(strstr(loom_last_error(), "not an engine record"));
    unsigned char *b = malloc((size_t)n);
    assert_non_null(b);
    memcpy(b, good, (size_t)n);
    b[8] = 9;
    write_all(g_bad, b, n);
    assert_int_equal(replay_status(g_bad, &steps), LOOM_ERR_BAD_INPUT);
    assert_non_null(strstr(loom_last_error(), "version 9"));
    assert_int_equal(replay_status("/nonexistent/loom.rec", &steps), LOOM_ERR_IO);
    assert_int_equal(replay_status("/", &steps), LOOM_ERR_IO);

    /* Another model: refused at create, naming the difference. */
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create_replay(g_other, g_rec, NULL, &e), LOOM_ERR_BAD_INPUT);
    assert_non_null(strstr(loom_last_error(), "the record was made with a model of"));

    /* Arguments; a replay engine takes no submit, cancel, on_event or record_path. */
    assert_int_equal(loom_engine_create_replay(NULL, g_rec, NULL, &e), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_engine_create_replay(g_model, NULL, NULL, &e), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_engine_create_replay(g_model, g_rec, NULL, NULL), LOOM_ERR_INVALID_ARG);
    loom_engine_params ep = loom_engine_default_params();
    ep.record_path = g_bad;
    assert_int_equal(loom_engine_create_replay(g_model, g_rec, &ep, &e), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_engine_create_replay(g_model, g_rec, NULL, &e), LOOM_OK);
    loom_request_params rq = loom_request_default_params();
    loom_token tok[2] = {5, 6};
    rq.prompt_tokens = tok;
    rq.n_prompt_tokens = 2;
    loom_request_id id;
    assert_int_equal(loom_engine_submit(e, &rq, &id), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_engine_cancel(e, 1), LOOM_ERR_INVALID_ARG);
    loom_engine_destroy(e);

    /* A record that cannot be created fails the engine's creation. */
    ep = small_engine(LOOM_PREEMPT_RECOMPUTE);
    ep.record_path = "/nonexistent/dir/loom.rec";
    assert_int_equal(loom_engine_create(g_model, &ep, &e), LOOM_ERR_IO);
    assert_non_null(strstr(loom_last_error(), "/nonexistent/dir/loom.rec"));

    /* Every truncation: the header's fail at create; the steps' replay up to the cut. A cut
     * inside a step's clock list, or before it, replays that step with what it has. */
    int64_t full_steps;
    assert_int_equal(replay_status(g_rec, &full_steps), LOOM_OK);
    assert_int_equal(full_steps, live.steps);
    int header_fails = 0, ok = 0, bad = 0;
    loom_log_set(NULL, LOOM_LOG_ERROR, NULL); /* each cut's torn record is a warning */
    for (long cut = 0; cut < n; cut += cut < 200 ? 1 : 1 + cut / 64) {
        write_all(g_bad, good, cut);
        loom_status st = replay_status(g_bad, &steps);
        if (st == LOOM_OK) {
            ok++;
            assert_true(steps <= full_steps);
        } else if (steps == 0) {
            header_fails++;
        } else {
            bad++;
        }
        assert_true(st == LOOM_OK || st == LOOM_ERR_BAD_INPUT || st == LOOM_ERR_INTERNAL);
    }
    assert_true(header_fails > 0 && ok > 0);
    loom_log_set(NULL, LOOM_LOG_WARN, NULL);

    /* Byte mutations anywhere past the header: a clean status or a replay, never a crash or
     * a hang. (A header may ask for any KV budget, as the recording machine had: flipping
     * kv_bytes' high bits would ask this one for terabytes, which ASan refuses by aborting;
     * the header's fields are covered by the cases above and by fuzz_replay.) */
    const long header = header_size();
    assert_true(header > 32 && header < n);
    uint64_t s = 5;
    for (int trial = 0; trial < 300; trial++) {
        memcpy(b, good, (size_t)n);
        for (int k = 0; k < 1 + trial % 4; k++) {
            s = mix(s);
            b[header + (long)(s % (uint64_t)(n - header))] ^= (unsigned char)(1u << (s >> 40) % 8);
        }
        write_all(g_bad, b, n);
        (void)replay_status(g_bad, &steps);
    }
    (void)bad;
    free(b);
    free(good);
    free(live.v);
}

/* The number of events of a log's first step. */
static size_t k_step0(const ev_log *L) {
    size_t k = 0;
    while (k < L->n && L->v[k].step == 0) k++;
    return k;
}

/* A run that crashed mid-step leaves the step's inputs without its 'S' (they are flushed before
 * the forward pass): the replay still runs that step, with its requests. Without deadlines the
 * clock readings it lacks change nothing, so its events equal the recorded run's. */
static void test_replay_crashed_run(void **state) {
    (void)state;
    loom_engine_params ep = small_engine(LOOM_PREEMPT_RECOMPUTE);
    ep.record_path = g_rec;
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(g_model, &ep, &e), LOOM_OK);
    ev_log live = {0}, again = {0};
    loom_request_params p = loom_request_default_params();
    loom_token prompt[4] = {11, 12, 13, 14};
    p.prompt_tokens = prompt;
    p.n_prompt_tokens = 4;
    p.max_tokens = 8;
    loom_request_id id;
    for (int k = 0; k < 2; k++) assert_int_equal(loom_engine_submit(e, &p, &id), LOOM_OK);
    step_into(e, &live);
    prompt[0] = 20;
    for (int k = 0; k < 2; k++) assert_int_equal(loom_engine_submit(e, &p, &id), LOOM_OK);
    step_into(e, &live); /* the step that "crashes" */
    loom_engine_destroy(e);
    long n;
    unsigned char *good = read_all(g_rec, &n);
    /* Its 'S' ends the file: 'S', u32 count, count readings, the events' digest. */
    long cut = -1;
    for (uint32_t c = 0; c < 64 && cut < 0; c++) {
        long at = n - 5 - 8 * (long)c - 8; /* then the 8-byte event digest */
        if (at > 0 && good[at] == 'S' &&
            (good[at + 1] | good[at + 2] << 8 | (uint32_t)good[at + 3] << 16 |
             (uint32_t)good[at + 4] << 24) == c)
            cut = at;
    }
    assert_true(cut > 0);
    write_all(g_bad, good, cut);
    replay_into(g_bad, &again, 1);
    assert_int_equal(again.steps, 2);
    size_t tokens_of_new = 0;
    for (size_t i = 0; i < live.n; i++) tokens_of_new += live.v[i].step == 1 && live.v[i].id >= 3;
    assert_true(tokens_of_new >= 2); /* the crashed step did admit and run the new requests */
    assert_same(&live, &again);
    /* Torn inside its last request's record (the crash hit while it was written): that
     * request is dropped with a warning, the step replays with the one before it. */
    write_all(g_bad, good, cut - 3);
    ev_log torn = {0};
    replay_into(g_bad, &torn, 1);
    assert_int_equal(torn.steps, 2);
    size_t of_3 = 0, of_4 = 0;
    for (size_t i = 0; i < torn.n; i++) {
        if (i < k_step0(&live)) assert_memory_equal(&torn.v[i], &live.v[i], sizeof torn.v[i]);
        of_3 += torn.v[i].step == 1 && torn.v[i].id == 3;
        of_4 += torn.v[i].id == 4;
    }
    assert_true(of_3 >= 1 && of_4 == 0);
    free(torn.v);
    free(good);
    free(live.v);
    free(again.v);
}

/* A model of the same shape with other weights passes the header's check but makes other
 * tokens: the replay says so at the first step whose events differ, and ends there. */
static void test_replay_other_weights(void **state) {
    (void)state;
    ev_log live = {0};
    recorded_run(LOOM_PREEMPT_RECOMPUTE, g_rec, &live);
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create_replay(g_twin, g_rec, NULL, &e), LOOM_OK);
    loom_status st = LOOM_OK;
    int64_t steps = 0;
    while (loom_engine_has_work(e) && st == LOOM_OK) {
        const loom_event *const *ev = NULL;
        size_t n = 0;
        st = loom_engine_step(e, &ev, &n);
        steps++;
    }
    assert_int_equal(st, LOOM_ERR_INTERNAL);
    assert_non_null(strstr(loom_last_error(), "diverged from the record"));
    assert_true(steps < live.steps);
    /* Ended: no more work, and every later step says why. */
    assert_false(loom_engine_has_work(e));
    const loom_event *const *ev = NULL;
    size_t n = 0;
    assert_int_equal(loom_engine_step(e, &ev, &n), LOOM_ERR_INTERNAL);
    assert_int_equal(n, 0);
    assert_non_null(strstr(loom_last_error(), "the replay ended there"));
    loom_engine_destroy(e);
    free(live.v);
}

static int setup(void **state) {
    (void)state;
    synth_path(g_path, sizeof g_path, "replay-llama.gguf");
    synth_path(g_other_path, sizeof g_other_path, "replay-gemma.gguf");
    synth_path(g_rec, sizeof g_rec, "replay.rec");
    synth_path(g_bad, sizeof g_bad, "replay-bad.rec");
    if (synth_write(g_path, &SYNTH_LLAMA, 41) != 0) return -1;
    if (synth_write(g_other_path, &SYNTH_GEMMA3, 42) != 0) return -1;
    synth_path(g_twin_path, sizeof g_twin_path, "replay-llama-twin.gguf");
    if (synth_write(g_twin_path, &SYNTH_LLAMA, 43) != 0) return -1;
    loom_model_params p = loom_model_default_params();
    p.backend = "cpu";
    p.n_threads = 1;
    if (loom_model_load(g_path, &p, &g_model) != LOOM_OK) return -1;
    if (loom_model_load(g_twin_path, &p, &g_twin) != LOOM_OK) return -1;
    return loom_model_load(g_other_path, &p, &g_other) == LOOM_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    loom_model_free(g_model);
    loom_model_free(g_other);
    loom_model_free(g_twin);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_recompute),     cmocka_unit_test(test_replay_swap),
        cmocka_unit_test(test_replay_bad_records),   cmocka_unit_test(test_replay_crashed_run),
        cmocka_unit_test(test_replay_other_weights),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
