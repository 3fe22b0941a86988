/* test_chain_summary.c — sampling from a row's summary (sample/chain.h: the host summarizer,
 * loom__sample_chain_run_summary, the rebuilt row) against the run over the whole row: every
 * result field bit for bit over rows with ties, masked and NaN entries and few finite logits,
 * for every setting the summary covers; the summarizer against float64 sums and a full sort;
 * which settings are covered; and the errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sample/chain_test_util.h"

#include "sample/chain.h"

#define TOP 256

/* Row kinds: 0 gaussian; 1 logits on a coarse grid (many ties); 2 a third masked to -inf and
 * a few NaN; 3 only 10 finite logits (fewer than most top-k: the rebuilt row); 4 one huge
 * winner (a near point mass). */
static void make_row(float *x, int32_t V, int kind, double sigma) {
    for (int32_t i = 0; i < V; i++) x[i] = (float)(sigma * gauss());
    if (kind == 1)
        for (int32_t i = 0; i < V; i++) x[i] = (float)(0.5 * round(2 * x[i] / sigma));
    if (kind == 2) {
        for (int32_t i = 0; i < V; i++)
            if (frand() < 0.33) x[i] = -INFINITY;
        for (int j = 0; j < 5; j++) x[(int32_t)(frand() * V)] = NAN;
    }
    if (kind == 3) {
        for (int32_t i = 0; i < V; i++) x[i] = -INFINITY;
        for (int j = 0; j < 10; j++) x[(int32_t)(frand() * V)] = (float)gauss();
    }
    if (kind == 4) x[(int32_t)(frand() * V)] = 40.0f;
}

static void expect_same_result(const loom__sample_chain_result *a,
                               const loom__sample_chain_result *b, const char *what) {
#define SAME(f)                                                                                    \
    if (memcmp(&a->f, &b->f, sizeof a->f) != 0) fail_msg("%s: field " #f " differs", what)
    SAME(token);
    SAME(logprob_raw);
    SAME(logprob_final);
    SAME(n_top_raw);
    SAME(n_top_final);
    SAME(entropy);
    SAME(varentropy);
    SAME(entropy_final);
    SAME(temperature);
    SAME(n_candidates);
#undef SAME
    if (memcmp(a->top_raw, b->top_raw, (size_t)a->n_top_raw * sizeof *a->top_raw) != 0)
        fail_msg("%s: top_raw differs", what);
    if (memcmp(a->top_final, b->top_final, (size_t)a->n_top_final * sizeof *a->top_final) != 0)
        fail_msg("%s: top_final differs", what);
}

static loom__sample_chain_logprob bufs[4][2 * TOP];

/* One row, one configuration: the whole-row run against the summary's (rebuilding the row
 * where asked). Returns whether the rebuilt row was needed. */
static bool check_one(loom__sample_chain_ws *ws, const loom__sample_chain_config *c, const float *x,
                      int32_t V, uint64_t draw, const char *what) {
    loom_logit_summary sum;
    static loom_logit_cand top[TOP];
    loom__sample_logits_summarize(x, V, TOP, &sum, top);
    loom__sample_chain_result full, fromsum;
    memset(&full, 0, sizeof full);
    memset(&fromsum, 0, sizeof fromsum);
    full.top_raw = bufs[0];
    full.top_final = bufs[1];
    fromsum.top_raw = bufs[2];
    fromsum.top_final = bufs[3];
    assert_int_equal(loom__sample_chain_run(ws, c, x, NULL, 0, draw, &full), LOOM_OK);
    bool need_row = true;
    assert_int_equal(loom__sample_chain_run_summary(ws, c, &sum, top, draw, &fromsum, &need_row),
                     LOOM_OK);
    if (need_row) {
        float *row = malloc((size_t)V * sizeof *row);
        assert_non_null(row);
        assert_int_equal(loom__sample_chain_rebuild_row(&sum, top, V, row), LOOM_OK);
        memset(&fromsum, 0, sizeof fromsum);
        fromsum.top_raw = bufs[2];
        fromsum.top_final = bufs[3];
        assert_int_equal(loom__sample_chain_run(ws, c, row, NULL, 0, draw, &fromsum), LOOM_OK);
        free(row);
    }
    expect_same_result(&full, &fromsum, what);
    return need_row;
}

/* Every covered setting over every row kind: the same result, bit for bit. */
static void test_summary_equals_row(void **state) {
    (void)state;
    const int32_t Vs[] = {3000, 70000};
    const float temps[] = {0.0f, 0.7f, 1.3f};
    const int32_t ks[] = {1, 5, 40, 256};
    const float top_ps[] = {1.0f, 0.9f, 0.3f};
    const float min_ps[] = {0.0f, 0.05f};
    const float typicals[] = {1.0f, 0.7f};
    const loom_entropy_mode modes[] = {LOOM_ENTROPY_NONE, LOOM_ENTROPY_EXP, LOOM_ENTROPY_EDT,
                                       LOOM_ENTROPY_DYNATEMP};
    const int32_t n_lps[] = {0, 7, 256};
    int n_cases = 0, n_rebuilt = 0;
    for (size_t vi = 0; vi < 2; vi++) {
        const int32_t V = Vs[vi];
        loom__sample_chain_ws *ws = make_ws(V);
        float *x = malloc((size_t)V * sizeof *x);
        assert_non_null(x);
        for (int kind = 0; kind < 5; kind++) {
            make_row(x, V, kind, kind == 0 ? 3.0 : 1.5);
            for (size_t ti = 0; ti < 3; ti++)
                for (size_t ki = 0; ki < 4; ki++)
                    for (size_t pi = 0; pi < 3; pi++)
                        for (size_t mi = 0; mi < 2; mi++)
                            for (size_t yi = 0; yi < 2; yi++) {
                                /* the modes and logprob counts rotate over the sweep */
                                loom__sample_chain_config c = loom__sample_chain_default_config();
                                c.temperature = temps[ti];
                                c.top_k = ks[ki];
                                c.top_p = top_ps[pi];
                                c.min_p = min_ps[mi];
                                c.typical_p = typicals[yi];
                                c.entropy_mode = modes[n_cases % 4];
                                c.n_logprobs = n_lps[n_cases % 3];
                                c.seed = 11u + (uint64_t)n_cases;
                                assert_true(loom__sample_chain_summary_ok(&c, TOP));
                                char what[200];
                                snprintf(what, sizeof what,
                                         "V=%d kind=%d T=%g k=%d p=%g min_p=%g typical=%g mode=%d "
                                         "logprobs=%d",
                                         V, kind, (double)c.temperature, c.top_k, (double)c.top_p,
                                         (double)c.min_p, (double)c.typical_p, (int)c.entropy_mode,
                                         c.n_logprobs);
                                for (uint64_t d = 0; d < 3; d++)
                                    n_rebuilt += check_one(ws, &c, x, V, 1000 + d, what);
                                n_cases++;
                            }
        }
        /* Greedy with top-k off and the most logprobs a summary holds. */
        loom__sample_chain_config g = loom__sample_chain_default_config();
        g.temperature = 0;
        g.top_k = 0;
        g.n_logprobs = TOP;
        make_row(x, V, 1, 2.0);
        check_one(ws, &g, x, V, 5, "greedy, top-k off");
        free(x);
    }
    /* The rows with 10 finite logits take the rebuilt row wherever top-k reaches 10 */
    assert_true(n_rebuilt > 0);
    print_message("%d settings x rows x 3 draws; %d went through the rebuilt row\n", n_cases,
                  n_rebuilt);
}

/* The summarizer against float64 sums and a sort of every finite entry. */
static int cand_cmp(const void *a, const void *b) {
    const loom_logit_cand *p = a, *q = b;
    if (p->logit != q->logit) return p->logit > q->logit ? -1 : 1;
    return (p->id > q->id) - (p->id < q->id);
}

static void test_summarizer(void **state) {
    (void)state;
    const int32_t V = 20000;
    float *x = malloc((size_t)V * sizeof *x);
    loom_logit_cand *all = malloc((size_t)V * sizeof *all);
    static loom_logit_cand top[TOP];
    assert_true(x && all);
    for (int kind = 0; kind < 6; kind++) {
        make_row(x, V, kind < 5 ? kind : 0, 2.0);
        if (kind == 5) x[123] = x[4567] = INFINITY;
        loom_logit_summary s;
        memset(top, 0xff, sizeof top);
        loom__sample_logits_summarize(x, V, TOP, &s, top);
        double m = -INFINITY;
        int32_t n_fin = 0, n_pinf = 0, am = -1;
        int32_t n_all = 0;
        for (int32_t i = 0; i < V; i++) {
            if (x[i] == INFINITY) n_pinf++;
            if (!(x[i] > -INFINITY && x[i] < INFINITY)) continue;
            n_fin++;
            all[n_all++] = (loom_logit_cand){x[i], i};
            if (x[i] > m) m = x[i], am = i;
        }
        assert_int_equal(s.n_finite, n_fin);
        assert_int_equal(s.n_posinf, n_pinf);
        assert_int_equal(s.n_top, n_fin < TOP ? n_fin : TOP);
        qsort(all, (size_t)n_all, sizeof *all, cand_cmp);
        if (memcmp(top, all, (size_t)s.n_top * sizeof *top) != 0)
            fail_msg("row kind %d: top list is not the sorted row's head", kind);
        if (n_pinf > 0) {
            assert_int_equal(s.argmax, 123);
            continue;
        }
        assert_int_equal(s.argmax, am);
        assert_true(s.max == m);
        double S = 0, T = 0, U = 0;
        for (int32_t i = 0; i < V; i++) {
            if (!(x[i] > -INFINITY)) continue;
            double d = (double)x[i] - m, e = exp(d);
            S += e;
            T += e * d;
            U += e * d * d;
        }
        double h = log(S) - T / S, v = U / S - (T / S) * (T / S);
        if (!(fabs(s.sum - S) <= 1e-12 * S))
            fail_msg("kind %d: sum %.17g want %.17g", kind, s.sum, S);
        if (!(fabs(s.entropy - h) <= 1e-10 * (h > 1 ? h : 1)))
            fail_msg("kind %d: entropy %.17g want %.17g", kind, s.entropy, h);
        if (!(fabs(s.varentropy - v) <= 1e-9 * (v > 1 ? v : 1)))
            fail_msg("kind %d: varentropy %.17g want %.17g", kind, s.varentropy, v);
    }
    free(x);
    free(all);
}

/* Which settings a summary covers. */
static void test_summary_ok(void **state) {
    (void)state;
    loom__sample_chain_config c = loom__sample_chain_default_config(); /* top-k 40 */
    assert_true(loom__sample_chain_summary_ok(&c, TOP));
    assert_false(loom__sample_chain_summary_ok(&c, 39)); /* k beyond the list */
    assert_false(loom__sample_chain_summary_ok(NULL, TOP));
    assert_false(loom__sample_chain_summary_ok(&c, 0));
    c.top_k = 0; /* top-k off: top-p walks the vocabulary */
    assert_false(loom__sample_chain_summary_ok(&c, TOP));
    c.temperature = 0; /* greedy needs no candidates beyond the logprobs */
    assert_true(loom__sample_chain_summary_ok(&c, TOP));
    c.n_logprobs = TOP + 1;
    assert_false(loom__sample_chain_summary_ok(&c, TOP));
    c = loom__sample_chain_default_config();
    loom_logit_bias bias = {5, -INFINITY};
    c.bias = &bias;
    c.n_bias = 1;
    assert_false(loom__sample_chain_summary_ok(&c, TOP));
    c = loom__sample_chain_default_config();
    c.repeat_penalty = 1.1f;
    assert_false(loom__sample_chain_summary_ok(&c, TOP));
    c.penalty_last_n = 0; /* a window of nothing penalizes nothing */
    assert_true(loom__sample_chain_summary_ok(&c, TOP));
    c = loom__sample_chain_default_config();
    c.frequency_penalty = 0.5f;
    assert_false(loom__sample_chain_summary_ok(&c, TOP));
}

/* Bad summaries and settings get clear errors. */
static void test_summary_errors(void **state) {
    (void)state;
    const int32_t V = 100;
    loom__sample_chain_ws *ws = make_ws(V);
    float x[100];
    for (int i = 0; i < V; i++) x[i] = (float)gauss();
    loom_logit_summary s;
    static loom_logit_cand top[TOP];
    loom__sample_logits_summarize(x, V, 20, &s, top);
    loom__sample_chain_config c = loom__sample_chain_default_config();
    loom__sample_chain_result r;
    memset(&r, 0, sizeof r);
    bool need = false;
    /* top-k 40 over a list of 20 of 100 finite logits: not covered */
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &s, top, 0, &r, &need),
                     LOOM_ERR_INVALID_ARG);
    c.top_k = 10;
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &s, top, 0, &r, &need), LOOM_OK);
    assert_false(need);
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &s, NULL, 0, &r, &need),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, NULL, top, 0, &r, &need),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &s, top, 0, &r, NULL),
                     LOOM_ERR_INVALID_ARG);
    loom_logit_summary bad = s;
    bad.n_posinf = 1;
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &bad, top, 0, &r, &need),
                     LOOM_ERR_BAD_INPUT);
    bad = s;
    bad.n_finite = 0;
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &bad, top, 0, &r, &need),
                     LOOM_ERR_BAD_INPUT);
    c.temperature = -1; /* the settings are validated as the whole-row run validates them */
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &s, top, 0, &r, &need),
                     LOOM_ERR_INVALID_ARG);
    /* a row rebuilt from a list that does not hold every finite logit, or names a stray id */
    float row[100];
    assert_int_equal(loom__sample_chain_rebuild_row(&s, top, V, row), LOOM_ERR_INVALID_ARG);
    loom_logit_summary full = s;
    full.n_finite = full.n_top;
    assert_int_equal(loom__sample_chain_rebuild_row(&full, top, V, row), LOOM_OK);
    top[3].id = V;
    assert_int_equal(loom__sample_chain_rebuild_row(&full, top, V, row), LOOM_ERR_BAD_INPUT);
    assert_int_equal(loom__sample_chain_rebuild_row(NULL, top, V, row), LOOM_ERR_INVALID_ARG);
}

int main(void) {
    rng_state = 0x243F6A8885A308D3ull;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_summary_equals_row),
        cmocka_unit_test(test_summarizer),
        cmocka_unit_test(test_summary_ok),
        cmocka_unit_test(test_summary_errors),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free_ws();
    return rc;
}
