/* test_engine_threads.c — a model shared by threads, as loom.h promises: two engines on one
 * model, each driven by loom_engine_generate (and by loom_engine_step) from its own thread at
 * the same time, give bitwise the tokens each gives alone; so do two sessions decoding on two
 * threads, and an engine beside a session; a model freed before its session and engine lives
 * on until the last of them goes. Each engine and session has its own execution
 * context (stream, thread pool, scratch); before, both threads met in the model's one thread
 * pool and hung. Run under ThreadSanitizer too (scripts/test.sh), where it must be clean. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>

#include "loom.h"
#include "model/synth_model.h"

#define N_REQ   4
#define N_TOKEN 20

static char g_path[2][512];

static int setup(void **state) {
    (void)state;
    synth_path(g_path[0], sizeof g_path[0], "threads-llama.gguf");
    synth_path(g_path[1], sizeof g_path[1], "threads-gemma3.gguf");
    if (synth_write(g_path[0], &SYNTH_LLAMA, 21) != 0) return -1;
    if (synth_write(g_path[1], &SYNTH_GEMMA3, 22) != 0) return -1;
    return 0;
}

static loom_model *load(const char *path) {
    loom_model_params p = loom_model_default_params();
    p.backend = "cpu";
    p.n_threads = 2;
    loom_model *m = NULL;
    if (loom_model_load(path, &p, &m) != LOOM_OK) fail_msg("load: %s", loom_last_error());
    return m;
}

/* One engine's work: N_REQ requests one after another through loom_engine_generate (which, run
 * from two threads at once on one model, used to hang in the shared thread pool), then N_REQ
 * at once stepped to the end. Tokens into out. */
typedef struct job {
    loom_model *model;
    int salt; /* makes each job's prompts its own */
    loom_token out[2 * N_REQ][N_TOKEN];
    loom_status st;
    char err[256];
} job;

static loom_request_params request(job *j, int r, loom_token *prompt, loom_sampler_params *sp) {
    for (int i = 0; i < 24; i++)
        prompt[i] = (loom_token)(4 + (j->salt * 53 + r * 29 + i * 11) % 290);
    loom_request_params rq = loom_request_default_params();
    rq.prompt_tokens = prompt;
    rq.n_prompt_tokens = 6 + 2 * (size_t)r;
    rq.max_tokens = N_TOKEN;
    rq.ignore_eos = true;
    *sp = loom_sampler_default_params();
    sp->temperature = r % 2 ? 0.7f : 0.0f;
    sp->seed = 7 + (uint64_t)(j->salt * 10 + r);
    rq.sampler = sp;
    return rq;
}

static loom_status run_job(job *j) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 2 << 20;
    ep.max_ctx = 96;
    ep.max_batched_tokens = 24;
    ep.max_seqs = 8;
    loom_engine *e = NULL;
    loom_status st = loom_engine_create(j->model, &ep, &e);
    if (st != LOOM_OK) return st;
    loom_token prompt[2 * N_REQ][24];
    loom_sampler_params sp[2 * N_REQ];
    for (int r = 0; r < N_REQ && st == LOOM_OK; r++) {
        loom_request_params rq = request(j, r, prompt[r], &sp[r]);
        loom_generation *g = NULL;
        st = loom_engine_generate(e, &rq, NULL, NULL, &g);
        if (st == LOOM_OK) {
            if (g->n_tokens != N_TOKEN)
                st = LOOM_ERR_INTERNAL;
            else
                memcpy(j->out[r], g->tokens, sizeof j->out[r]);
        }
        loom_generation_free(g);
    }
    loom_request_id ids[N_REQ];
    for (int r = 0; r < N_REQ && st == LOOM_OK; r++) {
        loom_request_params rq = request(j, N_REQ + r, prompt[N_REQ + r], &sp[N_REQ + r]);
        st = loom_engine_submit(e, &rq, &ids[r]);
    }
    int n[N_REQ] = {0};
    while (st == LOOM_OK && loom_engine_has_work(e)) {
        const loom_event *const *ev;
        size_t n_ev;
        st = loom_engine_step(e, &ev, &n_ev);
        for (size_t k = 0; st == LOOM_OK && k < n_ev; k++)
            for (int r = 0; r < N_REQ; r++)
                if (ev[k]->kind == LOOM_EVENT_TOKEN && ev[k]->id == ids[r] && n[r] < N_TOKEN)
                    j->out[N_REQ + r][n[r]++] = ev[k]->token;
    }
    loom_engine_destroy(e);
    return st;
}

static void *job_thread(void *arg) {
    job *j = arg;
    j->st = run_job(j);
    if (j->st != LOOM_OK) snprintf(j->err, sizeof j->err, "%s", loom_last_error());
    return NULL;
}

/* Decodes a 30-token prompt, then 10 tokens one at a time, keeping every logit row. */
typedef struct sjob {
    loom_model *model;
    int salt;
    float *logits; /* [40][V] */
    int32_t V;
    loom_status st;
} sjob;

static void *session_thread(void *arg) {
    sjob *j = arg;
    loom_session *s = NULL;
    j->st = loom_session_create(j->model, NULL, &s);
    loom_token t[40];
    for (int i = 0; i < 40; i++) t[i] = (loom_token)(3 + (j->salt * 7 + i * 13) % (j->V - 3));
    if (j->st == LOOM_OK) j->st = loom_session_decode(s, t, 30, true);
    if (j->st == LOOM_OK) memcpy(j->logits, loom_session_logits(s, 0), sizeof(float) * 30 * j->V);
    for (int i = 30; i < 40 && j->st == LOOM_OK; i++) {
        j->st = loom_session_decode(s, t + i, 1, false);
        if (j->st == LOOM_OK)
            memcpy(j->logits + (size_t)i * j->V, loom_session_logits(s, -1), sizeof(float) * j->V);
    }
    loom_session_free(s);
    return NULL;
}

static void test_two_engines(void **state) {
    (void)state;
    for (int mi = 0; mi < 2; mi++) {
        loom_model *m = load(g_path[mi]);
        static job alone[2], together[2];
        for (int k = 0; k < 2; k++) {
            alone[k] = (job){.model = m, .salt = k};
            together[k] = (job){.model = m, .salt = k};
            job_thread(&alone[k]);
            if (alone[k].st != LOOM_OK) fail_msg("alone: %s", alone[k].err);
        }
        pthread_t th[2];
        for (int k = 0; k < 2; k++)
            assert_int_equal(pthread_create(&th[k], NULL, job_thread, &together[k]), 0);
        for (int k = 0; k < 2; k++) assert_int_equal(pthread_join(th[k], NULL), 0);
        for (int k = 0; k < 2; k++) {
            if (together[k].st != LOOM_OK) fail_msg("together: %s", together[k].err);
            assert_memory_equal(alone[k].out, together[k].out, sizeof alone[k].out);
        }
        /* Not vacuous: the two jobs' prompts, and so their tokens, differ. */
        assert_memory_not_equal(alone[0].out, alone[1].out, sizeof alone[0].out);
        loom_model_free(m);
    }
}

static void test_sessions_and_engine(void **state) {
    (void)state;
    loom_model *m = load(g_path[1]);
    loom_model_info info = {.size = sizeof info};
    assert_int_equal(loom_model_get_info(m, &info), LOOM_OK);
    const int32_t V = info.n_vocab;
    sjob alone[2], together[2];
    for (int k = 0; k < 2; k++) {
        alone[k] =
            (sjob){.model = m, .salt = k, .V = V, .logits = malloc(sizeof(float) * 40 * (size_t)V)};
        together[k] = alone[k];
        together[k].logits = malloc(sizeof(float) * 40 * (size_t)V);
        assert_non_null(alone[k].logits);
        assert_non_null(together[k].logits);
        session_thread(&alone[k]);
        assert_int_equal(alone[k].st, LOOM_OK);
    }
    static job ejob_alone, ejob;
    ejob_alone = (job){.model = m, .salt = 5};
    ejob = ejob_alone;
    job_thread(&ejob_alone);
    assert_int_equal(ejob_alone.st, LOOM_OK);
    /* two sessions and an engine at once */
    pthread_t th[3];
    for (int k = 0; k < 2; k++)
        assert_int_equal(pthread_create(&th[k], NULL, session_thread, &together[k]), 0);
    assert_int_equal(pthread_create(&th[2], NULL, job_thread, &ejob), 0);
    for (int k = 0; k < 3; k++) assert_int_equal(pthread_join(th[k], NULL), 0);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(together[k].st, LOOM_OK);
        assert_memory_equal(alone[k].logits, together[k].logits, sizeof(float) * 40 * (size_t)V);
        free(alone[k].logits);
        free(together[k].logits);
    }
    assert_int_equal(ejob.st, LOOM_OK);
    assert_memory_equal(ejob_alone.out, ejob.out, sizeof ejob.out);
    loom_model_free(m);
}

/* Frees a session or an engine (the arg says which) on its own thread. */
typedef struct holder {
    loom_session *s;
    loom_engine *e;
} holder;

static void *free_thread(void *arg) {
    holder *h = arg;
    loom_session_free(h->s);
    loom_engine_destroy(h->e);
    return NULL;
}

/* The application frees the model first (a garbage collector's order): the session and the
 * engine made from it still work, bitwise as before, and the model goes with the last of them,
 * freed here on two threads at once (ASan: nothing used after free or leaked; TSan: clean). */
static void test_model_freed_first(void **state) {
    (void)state;
    loom_model *m = load(g_path[1]);
    loom_model_info info = {.size = sizeof info};
    assert_int_equal(loom_model_get_info(m, &info), LOOM_OK);
    const int32_t V = info.n_vocab;
    sjob before = {.model = m, .salt = 3, .V = V, .logits = malloc(sizeof(float) * 40 * (size_t)V)};
    assert_non_null(before.logits);
    session_thread(&before);
    assert_int_equal(before.st, LOOM_OK);
    static job ej_before, ej_after;
    ej_before = (job){.model = m, .salt = 9};
    job_thread(&ej_before);
    assert_int_equal(ej_before.st, LOOM_OK);

    loom_session *s = NULL;
    loom_engine *e = NULL;
    assert_int_equal(loom_session_create(m, NULL, &s), LOOM_OK);
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 2 << 20;
    ep.max_ctx = 96;
    assert_int_equal(loom_engine_create(m, &ep, &e), LOOM_OK);
    loom_model_free(m);

    loom_token t[40];
    for (int i = 0; i < 40; i++) t[i] = (loom_token)(3 + (3 * 7 + i * 13) % (V - 3));
    assert_int_equal(loom_session_decode(s, t, 30, true), LOOM_OK);
    assert_memory_equal(loom_session_logits(s, 0), before.logits, sizeof(float) * 30 * (size_t)V);
    loom_token prompt[24];
    loom_sampler_params sp;
    ej_after = (job){.salt = 9};
    loom_request_params rq = request(&ej_after, 0, prompt, &sp);
    loom_generation *g = NULL;
    assert_int_equal(loom_engine_generate(e, &rq, NULL, NULL, &g), LOOM_OK);
    assert_int_equal(g->n_tokens, N_TOKEN);
    assert_memory_equal(g->tokens, ej_before.out[0], sizeof ej_before.out[0]);
    loom_generation_free(g);

    holder hs = {.s = s}, he = {.e = e};
    pthread_t th[2];
    assert_int_equal(pthread_create(&th[0], NULL, free_thread, &hs), 0);
    assert_int_equal(pthread_create(&th[1], NULL, free_thread, &he), 0);
    for (int k = 0; k < 2; k++) assert_int_equal(pthread_join(th[k], NULL), 0);
    free(before.logits);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_engines),
        cmocka_unit_test(test_sessions_and_engine),
        cmocka_unit_test(test_model_freed_first),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
