/* test_admission.c — admission control (loom_engine_params.admission), the TTFT prediction
 * behind it (loom_engine_predict_ttft), the fitted step-cost model in the stats, and the
 * per-class service figures (loom_engine_get_class_stats), on a small synthetic llama. The
 * deadlines are chosen far from any prediction (a microsecond, a million seconds) so that no
 * assertion depends on how fast the machine is; the predictions' accuracy is the serving
 * benchmark's job (bench/sched_sim.c), against the simulator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "loom.h"
#include "model/synth_model.h"

enum { N_OUT = 4, N_PROMPT = 24 };

static char g_path[512];
static loom_model *g_model;
static loom_token g_prompt[N_PROMPT];
static loom_sampler_params g_greedy;

static loom_request_params request(int priority, double ttft_s) {
    loom_request_params p = loom_request_default_params();
    p.prompt_tokens = g_prompt;
    p.n_prompt_tokens = N_PROMPT;
    p.max_tokens = N_OUT;
    p.ignore_eos = true;
    p.priority = priority;
    p.ttft_deadline_s = ttft_s;
    p.sampler = &g_greedy;
    return p;
}

static loom_engine *make_engine(loom_admission_policy admission) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 4 << 20;
    ep.block_size = 8;
    ep.max_seqs = 2;
    ep.max_batched_tokens = 32;
    ep.max_ctx = 64;
    ep.admission = admission;
    loom_engine *e = NULL;
    if (loom_engine_create(g_model, &ep, &e) != LOOM_OK) fail_msg("create: %s", loom_last_error());
    return e;
}

/* Steps until idle; returns the tokens of request `id` (up to N_OUT) in out. */
static int drain(loom_engine *e, loom_request_id id, loom_token *out) {
    int n = 0;
    while (loom_engine_has_work(e)) {
        const loom_event *const *ev = NULL;
        size_t ne = 0;
        assert_int_equal(loom_engine_step(e, &ev, &ne), LOOM_OK);
        for (size_t k = 0; k < ne; k++)
            if (ev[k]->id == id && ev[k]->kind == LOOM_EVENT_TOKEN && n < N_OUT)
                out[n++] = ev[k]->token;
    }
    return n;
}

/* Runs a few requests so the step-cost model has a fit. */
static void warm_up(loom_engine *e) {
    for (int i = 0; i < 3; i++) {
        loom_request_params p = request(0, 0);
        loom_request_id id;
        assert_int_equal(loom_engine_submit(e, &p, &id), LOOM_OK);
    }
    loom_token ignored[N_OUT];
    drain(e, 0, ignored);
}

/* Queues n requests of priority `prio` without stepping (the queue a prediction counts). */
static void queue(loom_engine *e, int n, int prio) {
    for (int i = 0; i < n; i++) {
        loom_request_params p = request(prio, 0);
        loom_request_id id;
        assert_int_equal(loom_engine_submit(e, &p, &id), LOOM_OK);
    }
}

static void test_predict(void **state) {
    (void)state;
    loom_engine *e = make_engine(LOOM_ADMIT_ALL);
    loom_request_params p = request(1, 0);
    double t = 0;
    assert_int_equal(loom_engine_predict_ttft(e, &p, &t), LOOM_OK);
    assert_true(t == -1.0); /* no step yet: no cost model */
    warm_up(e);
    loom_engine_stats st = {.size = sizeof st};
    assert_int_equal(loom_engine_get_stats(e, &st), LOOM_OK);
    assert_true(st.step_base_s >= 0 && st.step_per_token_s >= 0 && st.step_per_ctx_s >= 0);
    assert_true(st.step_base_s + st.step_per_token_s > 0);

    double empty = 0, behind_low = 0, behind_high = 0;
    assert_int_equal(loom_engine_predict_ttft(e, &p, &empty), LOOM_OK);
    assert_true(empty > 0);
    /* Ten best-effort requests queued: a priority-1 request does not wait for their prompts
     * (it ranks first and takes a slot by preemption), a priority-0 one waits for all. */
    queue(e, 10, 0);
    assert_int_equal(loom_engine_predict_ttft(e, &p, &behind_low), LOOM_OK);
    loom_request_params p0 = request(0, 0);
    assert_int_equal(loom_engine_predict_ttft(e, &p0, &behind_high), LOOM_OK);
    assert_true(behind_high > behind_low);
    assert_true(behind_high > empty);
    loom_token ignored[N_OUT];
    drain(e, 0, ignored);

    /* Bad input, as submit's. */
    assert_int_equal(loom_engine_predict_ttft(NULL, &p, &t), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_engine_predict_ttft(e, NULL, &t), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_engine_predict_ttft(e, &p, NULL), LOOM_ERR_INVALID_ARG);
    loom_request_params bad = request(0, 0);
    bad.prompt_tokens = NULL;
    bad.n_prompt_tokens = 0;
    assert_int_equal(loom_engine_predict_ttft(e, &bad, &t), LOOM_ERR_INVALID_ARG);
    bad = request(0, 0);
    bad.arrival_s = -1;
    assert_int_equal(loom_engine_predict_ttft(e, &bad, &t), LOOM_ERR_INVALID_ARG);
    loom_engine_destroy(e);
}

static void test_admit_all_keeps_late_requests(void **state) {
    (void)state;
    loom_engine *e = make_engine(LOOM_ADMIT_ALL);
    warm_up(e);
    queue(e, 6, 1);
    loom_request_params p = request(1, 1e-6);
    loom_request_id id;
    assert_int_equal(loom_engine_submit(e, &p, &id), LOOM_OK);
    loom_token got[N_OUT];
    assert_int_equal(drain(e, id, got), N_OUT);
    loom_class_stats cs = {.size = sizeof cs};
    assert_int_equal(loom_engine_get_class_stats(e, 1, &cs), LOOM_OK);
    assert_int_equal(cs.priority, 1);
    assert_int_equal(cs.admitted, 7);
    assert_int_equal(cs.ended, 7);
    assert_int_equal(cs.rejected, 0);
    assert_int_equal(cs.ttft_deadlines, 1);
    assert_int_equal(cs.ttft_met, 0); /* one microsecond: missed */
    assert_int_equal(cs.tokens_generated, 7 * N_OUT);
    assert_true(cs.ttft_p50_s > 0 && cs.ttft_p99_s >= cs.ttft_p50_s);
    assert_true(cs.tpot_p50_s > 0);
    assert_int_equal(loom_engine_get_class_stats(e, 0, &cs), LOOM_OK);
    assert_int_equal(cs.admitted, 3); /* the warm-up */
    assert_int_equal(cs.ttft_deadlines, 0);
    loom_engine_destroy(e);
}

static void test_reject_late(void **state) {
    (void)state;
    loom_engine *e = make_engine(LOOM_ADMIT_REJECT_LATE);
    /* Before the first step there is no prediction: admitted. */
    loom_request_params p = request(1, 1e-6);
    loom_request_id id;
    assert_int_equal(loom_engine_submit(e, &p, &id), LOOM_OK);
    warm_up(e);
    queue(e, 6, 1);
    assert_int_equal(loom_engine_submit(e, &p, &id), LOOM_ERR_OVERLOADED);
    assert_non_null(strstr(loom_last_error(), "predicted time to first token"));
    /* A deadline it can meet, and a request without one, are admitted. */
    loom_request_params ok = request(1, 1e6);
    assert_int_equal(loom_engine_submit(e, &ok, &id), LOOM_OK);
    loom_request_params none = request(1, 0);
    assert_int_equal(loom_engine_submit(e, &none, &id), LOOM_OK);
    loom_token got[N_OUT];
    assert_int_equal(drain(e, id, got), N_OUT);
    loom_engine_stats st = {.size = sizeof st};
    assert_int_equal(loom_engine_get_stats(e, &st), LOOM_OK);
    assert_int_equal(st.rejected, 1);
    assert_int_equal(st.degraded, 0);
    assert_int_equal(st.requests_finished, 1 + 3 + 6 + 2); /* the rejected one never ran */
    loom_class_stats cs = {.size = sizeof cs};
    assert_int_equal(loom_engine_get_class_stats(e, 1, &cs), LOOM_OK);
    assert_int_equal(cs.rejected, 1);
    assert_int_equal(cs.admitted, 1 + 6 + 2);
    assert_int_equal(cs.ended, cs.admitted);
    assert_int_equal(cs.ttft_deadlines, 2); /* the first (1 us: missed) and the 1e6-s one */
    assert_int_equal(cs.ttft_met, 1);
    loom_engine_destroy(e);
}

static void test_degrade(void **state) {
    (void)state;
    /* The tokens of a request alone, then degraded behind a queue: the same (batch
     * invariance), and the request is counted as degraded in the class it asked for. */
    loom_engine *e = make_engine(LOOM_ADMIT_ALL);
    loom_request_params p = request(1, 0);
    loom_request_id id;
    assert_int_equal(loom_engine_submit(e, &p, &id), LOOM_OK);
    loom_token want[N_OUT];
    assert_int_equal(drain(e, id, want), N_OUT);
    loom_engine_destroy(e);

    e = make_engine(LOOM_ADMIT_DEGRADE);
    warm_up(e);
    queue(e, 6, 1);
    p = request(1, 1e-6);
    assert_int_equal(loom_engine_submit(e, &p, &id), LOOM_OK);
    loom_token got[N_OUT];
    assert_int_equal(drain(e, id, got), N_OUT);
    assert_memory_equal(got, want, sizeof want);
    loom_engine_stats st = {.size = sizeof st};
    assert_int_equal(loom_engine_get_stats(e, &st), LOOM_OK);
    assert_int_equal(st.degraded, 1);
    assert_int_equal(st.rejected, 0);
    loom_class_stats cs = {.size = sizeof cs};
    assert_int_equal(loom_engine_get_class_stats(e, 1, &cs), LOOM_OK);
    assert_int_equal(cs.degraded, 1);
    assert_int_equal(cs.admitted, 7);
    assert_int_equal(cs.ttft_deadlines, 1); /* judged against the deadline it asked for */
    assert_int_equal(cs.ttft_met, 0);
    loom_engine_destroy(e);
}

static void test_bad_input(void **state) {
    (void)state;
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 4 << 20;
    ep.admission = (loom_admission_policy)7;
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(g_model, &ep, &e), LOOM_ERR_INVALID_ARG);
    assert_null(e);
    e = make_engine(LOOM_ADMIT_ALL);
    loom_class_stats cs = {.size = sizeof cs};
    assert_int_equal(loom_engine_get_class_stats(e, 5, &cs), LOOM_ERR_NOT_FOUND);
    assert_int_equal(loom_engine_get_class_stats(NULL, 5, &cs), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_engine_get_class_stats(e, 5, NULL), LOOM_ERR_INVALID_ARG);
    cs.size = 8;
    assert_int_equal(loom_engine_get_class_stats(e, 5, &cs), LOOM_ERR_INVALID_ARG);
    /* More classes than are tracked: the rest are served, not counted. */
    for (int prio = 0; prio < LOOM_ENGINE_MAX_CLASSES + 3; prio++) queue(e, 1, prio);
    loom_token ignored[N_OUT];
    drain(e, 0, ignored);
    cs.size = sizeof cs;
    assert_int_equal(loom_engine_get_class_stats(e, LOOM_ENGINE_MAX_CLASSES - 1, &cs), LOOM_OK);
    assert_int_equal(cs.ended, 1);
    assert_int_equal(loom_engine_get_class_stats(e, LOOM_ENGINE_MAX_CLASSES, &cs),
                     LOOM_ERR_NOT_FOUND);
    loom_engine_stats st = {.size = sizeof st};
    assert_int_equal(loom_engine_get_stats(e, &st), LOOM_OK);
    assert_int_equal(st.requests_finished, LOOM_ENGINE_MAX_CLASSES + 3);
    assert_string_equal(loom_status_str(LOOM_ERR_OVERLOADED),
                        "the request would miss its deadline under the current load");
    loom_engine_destroy(e);
}

static int setup(void **state) {
    (void)state;
    synth_path(g_path, sizeof g_path, "admission-llama.gguf");
    if (synth_write(g_path, &SYNTH_LLAMA, 43) != 0) return -1;
    loom_model_params p = loom_model_default_params();
    p.backend = "cpu";
    p.n_threads = 1;
    for (int i = 0; i < N_PROMPT; i++) g_prompt[i] = (loom_token)(3 + (i * 7) % 50);
    g_greedy = loom_sampler_default_params();
    g_greedy.temperature = 0;
    return loom_model_load(g_path, &p, &g_model) == LOOM_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    loom_model_free(g_model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_predict),     cmocka_unit_test(test_admit_all_keeps_late_requests),
        cmocka_unit_test(test_reject_late), cmocka_unit_test(test_degrade),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
