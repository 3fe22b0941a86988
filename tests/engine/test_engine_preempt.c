/* test_engine_preempt.c — preemption frees what the plan counted on. A's prompt blocks are
 * shared with B (B found them in the prefix cache); a more important C arrives needing two
 * blocks more than are free. Preempting A frees only A's own block: its shared ones stay with
 * B. The scheduler used to count every block of A past A's own cached prefix as reclaimed, so
 * it admitted C after preempting A alone, and C's reservation then failed ("needs 1 blocks, 0
 * available": C ended FAILED with CONTEXT_FULL; the soak test hit this about once per 70,000
 * requests). Now C is admitted only once enough is really freed, and every request ends with
 * the tokens it produces alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "loom.h"
#include "model/synth_model.h"

enum { BS = 4, N_OUT = 6 };

static char g_path[512];
static loom_model *g_model;

typedef struct result {
    loom_token tok[N_OUT];
    int n;
    bool finished, failed;
    loom_status status;
} result;

static void run_events(loom_engine *e, result *res, int n_res) {
    const loom_event *const *ev = NULL;
    size_t n = 0;
    assert_int_equal(loom_engine_step(e, &ev, &n), LOOM_OK);
    for (size_t k = 0; k < n; k++) {
        int i = (int)(intptr_t)ev[k]->user_data;
        assert_true(i >= 0 && i < n_res);
        result *r = &res[i];
        if (ev[k]->kind == LOOM_EVENT_TOKEN && r->n < N_OUT) r->tok[r->n++] = ev[k]->token;
        if (ev[k]->kind == LOOM_EVENT_FINISHED) r->finished = true;
        if (ev[k]->kind == LOOM_EVENT_FAILED) {
            r->failed = true;
            r->status = ev[k]->status;
        }
    }
}

static loom_request_params request(const loom_token *prompt, size_t n, int priority, int index) {
    loom_request_params p = loom_request_default_params();
    p.prompt_tokens = prompt;
    p.n_prompt_tokens = n;
    p.max_tokens = N_OUT;
    p.ignore_eos = true;
    p.priority = priority;
    p.user_data = (void *)(intptr_t)index;
    static loom_sampler_params greedy;
    greedy = loom_sampler_default_params();
    greedy.temperature = 0;
    p.sampler = &greedy;
    return p;
}

static loom_engine *make_engine(int64_t kv_bytes) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = kv_bytes;
    ep.block_size = BS;
    ep.max_seqs = 4;
    ep.max_batched_tokens = 128;
    ep.max_ctx = 124;
    ep.watermark = 0;
    ep.preempt = LOOM_PREEMPT_RECOMPUTE;
    loom_engine *e = NULL;
    if (loom_engine_create(g_model, &ep, &e) != LOOM_OK) fail_msg("create: %s", loom_last_error());
    return e;
}

static void alone(const loom_token *prompt, size_t n, result *out) {
    loom_engine *e = make_engine(1 << 20);
    memset(out, 0, sizeof *out);
    loom_request_params p = request(prompt, n, 0, 0);
    loom_request_id id;
    assert_int_equal(loom_engine_submit(e, &p, &id), LOOM_OK);
    while (loom_engine_has_work(e)) run_events(e, out, 1);
    loom_engine_destroy(e);
}

static void test_preempt_counts_shared_blocks(void **state) {
    (void)state;
    /* A and B share an 8-token prefix (two blocks); each has one token of its own. */
    loom_token a[9], b[9], c[128];
    for (int i = 0; i < 8; i++) a[i] = b[i] = (loom_token)(260 + i);
    a[8] = 300;
    b[8] = 301;
    loom_engine *e = make_engine(32 * 1024); /* 32 blocks of 4 tokens */
    loom_engine_stats st = {.size = sizeof st};
    result res[3];
    memset(res, 0, sizeof res);
    loom_request_id id;
    loom_request_params pa = request(a, 9, 0, 0), pb = request(b, 9, 1, 1);
    assert_int_equal(loom_engine_submit(e, &pa, &id), LOOM_OK);
    run_events(e, res, 3); /* A computes its prompt: its two full blocks enter the cache */
    assert_int_equal(loom_engine_submit(e, &pb, &id), LOOM_OK);
    run_events(e, res, 3); /* B reuses them; A decodes */
    assert_int_equal(loom_engine_get_stats(e, &st), LOOM_OK);
    assert_int_equal(st.running, 2);
    /* A holds 3 blocks (2 shared with B), B 1 of its own: free = total - 4. C needs two more
     * than are free, so A (the least important) and B must both go before C fits. */
    int32_t avail = st.kv_blocks_free + st.kv_blocks_cached;
    int32_t m = avail + 2;
    size_t nc = (size_t)(BS * (m - 1) + 1); /* m blocks, the last holding one token */
    assert_true(nc <= sizeof c / sizeof *c - 1);
    for (size_t i = 0; i < nc; i++) c[i] = (loom_token)(3 + (i * 37) % 250);
    loom_request_params pc = request(c, nc, 2, 2);
    assert_int_equal(loom_engine_submit(e, &pc, &id), LOOM_OK);
    while (loom_engine_has_work(e)) run_events(e, res, 3);
    assert_int_equal(loom_engine_get_stats(e, &st), LOOM_OK);
    printf("preempt: %d blocks in all, C needs %d; %lld preemptions\n", st.kv_blocks_total, m,
           (long long)st.preemptions);
    const loom_token *prompts[3] = {a, b, c};
    size_t lens[3] = {9, 9, nc};
    for (int i = 0; i < 3; i++) {
        if (res[i].failed)
            fail_msg("request %c failed: %s", 'A' + i, loom_status_str(res[i].status));
        assert_true(res[i].finished);
        result want;
        alone(prompts[i], lens[i], &want);
        assert_int_equal(res[i].n, want.n);
        assert_memory_equal(res[i].tok, want.tok, sizeof want.tok[0] * (size_t)want.n);
    }
    assert_true(st.preemptions >= 1);
    loom_engine_destroy(e);
}

static int setup(void **state) {
    (void)state;
    synth_path(g_path, sizeof g_path, "preempt-llama.gguf");
    if (synth_write(g_path, &SYNTH_LLAMA, 41) != 0) return -1;
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
        cmocka_unit_test(test_preempt_counts_shared_blocks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
