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

/* Equal, neighbouring floats, or within 1e-12: x - lse with a float64 normalizer summed in
 * another order (its rounding, about 1e-14 for a normalizer below 100, is all there is to a
 * log-probability near 0). */
static bool one_ulp(float a, float b) {
    return a == b || nextafterf(a, b) == b || fabs((double)a - (double)b) <= 1e-12;
}

/* One row, one configuration, the request's history: the whole-row run against the run over
 * the row's summary (with the edits the settings and history make). Bit for bit, but for the
 * raw log-probabilities of an edited row (its raw normalizer is summed over the raw row rather
 * than corrected from the edited one): within one float ulp or 1e-12. Returns whether the chain
 * walked the whole vocabulary (the summary's row rebuilt into the scratch, seen overwritten). */
static bool check_one(loom__sample_chain_ws *ws, const loom__sample_chain_config *c, const float *x,
                      int32_t V, const loom_token *hist, int32_t n_hist, uint64_t draw,
                      const char *what) {
    static loom_logit_cand top[TOP], raw_top[TOP];
    static int32_t pen_id[LOOM_LOGIT_SUMMARY_MAX_EDITS], pen_count[LOOM_LOGIT_SUMMARY_MAX_EDITS];
    static float edit_raw[LOOM_LOGIT_SUMMARY_MAX_EDITS];
    loom_logit_summary sum, raw_sum;
    loom_logit_edits edits;
    assert_true(loom__sample_chain_edits(c, hist, n_hist, pen_id, pen_count, &edits));
    float *scratch = malloc((size_t)V * sizeof *scratch);
    assert_non_null(scratch);
    loom__sample_logits_summarize_edited(x, V, TOP, &edits, scratch, &sum, top, &raw_sum, raw_top,
                                         edit_raw);
    loom__sample_chain_result full, fromsum;
    memset(&full, 0, sizeof full);
    memset(&fromsum, 0, sizeof fromsum);
    full.top_raw = bufs[0];
    full.top_final = bufs[1];
    fromsum.top_raw = bufs[2];
    fromsum.top_final = bufs[3];
    assert_int_equal(loom__sample_chain_run(ws, c, x, hist, n_hist, draw, &full), LOOM_OK);
    const loom__row_summary rs = {.sum = &sum,
                                  .top = top,
                                  .edits = &edits,
                                  .raw_sum = &raw_sum,
                                  .raw_top = raw_top,
                                  .edit_raw = edit_raw};
    for (int32_t i = 0; i < V; i++) scratch[i] = NAN; /* a rebuilt row overwrites it */
    if (loom__sample_chain_run_summary(ws, c, &rs, draw, scratch, &fromsum) != LOOM_OK)
        fail_msg("%s: %s", what, loom_last_error());
    const bool rebuilt = scratch[0] == scratch[0];
    free(scratch);
    const bool edited = edits.n_bias + edits.n_pen > 0;
    if (edited) { /* the raw log-probabilities within 1e-6, then the rest bit for bit */
        if (!one_ulp(full.logprob_raw, fromsum.logprob_raw))
            fail_msg("%s: logprob_raw %.9g, from the row %.9g", what, (double)fromsum.logprob_raw,
                     (double)full.logprob_raw);
        assert_int_equal(full.n_top_raw, fromsum.n_top_raw);
        for (int32_t i = 0; i < full.n_top_raw; i++)
            if (full.top_raw[i].id != fromsum.top_raw[i].id ||
                !one_ulp(full.top_raw[i].logprob, fromsum.top_raw[i].logprob))
                fail_msg("%s: top_raw[%d] differs", what, i);
        fromsum.logprob_raw = full.logprob_raw;
        memcpy(fromsum.top_raw, full.top_raw, (size_t)full.n_top_raw * sizeof *full.top_raw);
    }
    expect_same_result(&full, &fromsum, what);
    return rebuilt;
}

/* The edits rotating over the sweep: none; bias (a ban of the best token, a boost of a poor
 * one, an id twice); penalties over a 40-token window (tokens among the best and at random);
 * both. hist receives the window. */
static int32_t edits_of(int which, const float *x, int32_t V, loom__sample_chain_config *c,
                        loom_token *hist) {
    static loom_logit_bias bias[3];
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    if (which & 1) {
        bias[0] = (loom_logit_bias){best, -INFINITY};
        bias[1] = (loom_logit_bias){(best + V / 2) % V, 3.0f};
        bias[2] = (loom_logit_bias){(best + V / 2) % V, 0.5f};
        c->bias = bias;
        c->n_bias = 3;
    }
    if (!(which & 2)) return 0;
    c->repeat_penalty = 1.3f;
    c->presence_penalty = 0.5f;
    c->frequency_penalty = 0.2f;
    c->penalty_last_n = 40;
    for (int32_t h = 0; h < 50; h++) /* a longer history: the window is its tail */
        hist[h] = h % 3 == 0 ? (best + h % 7) % V : (loom_token)(frand() * V);
    return 50;
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
    int n_cases = 0, n_rebuilt = 0, n_edited = 0;
    loom_token hist[64];
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
                                /* the modes, logprob counts and edits rotate over the sweep */
                                loom__sample_chain_config c = loom__sample_chain_default_config();
                                c.temperature = temps[ti];
                                c.top_k = ks[ki];
                                c.top_p = top_ps[pi];
                                c.min_p = min_ps[mi];
                                c.typical_p = typicals[yi];
                                c.entropy_mode = modes[n_cases % 4];
                                c.n_logprobs = n_lps[n_cases % 3];
                                c.seed = 11u + (uint64_t)n_cases;
                                const int which = (n_cases / 3) % 4;
                                const int32_t n_hist = edits_of(which, x, V, &c, hist);
                                n_edited += which != 0;
                                assert_true(loom__sample_chain_summary_ok(&c, TOP));
                                char what[200];
                                snprintf(what, sizeof what,
                                         "V=%d kind=%d T=%g k=%d p=%g min_p=%g typical=%g mode=%d "
                                         "logprobs=%d edits=%d",
                                         V, kind, (double)c.temperature, c.top_k, (double)c.top_p,
                                         (double)c.min_p, (double)c.typical_p, (int)c.entropy_mode,
                                         c.n_logprobs, which);
                                for (uint64_t d = 0; d < 3; d++)
                                    n_rebuilt +=
                                        check_one(ws, &c, x, V, hist, n_hist, 1000 + d, what);
                                n_cases++;
                            }
        }
        /* Greedy with top-k off and the most logprobs a summary holds. */
        loom__sample_chain_config g = loom__sample_chain_default_config();
        g.temperature = 0;
        g.top_k = 0;
        g.n_logprobs = TOP;
        make_row(x, V, 1, 2.0);
        check_one(ws, &g, x, V, NULL, 0, 5, "greedy, top-k off");
        free(x);
    }
    /* The rows with 10 finite logits take the rebuilt row wherever top-k reaches 10 */
    assert_true(n_rebuilt > 0);
    print_message("%d settings x rows x 3 draws (%d with bias or penalties); %d went through the "
                  "rebuilt row\n",
                  n_cases, n_edited, n_rebuilt);
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
    c = loom__sample_chain_default_config(); /* bias and penalties: edits on the device */
    loom_logit_bias bias = {5, -INFINITY};
    c.bias = &bias;
    c.n_bias = 1;
    c.repeat_penalty = 1.1f;
    c.frequency_penalty = 0.5f;
    assert_true(loom__sample_chain_summary_ok(&c, TOP));
    c.n_bias = LOOM_LOGIT_SUMMARY_MAX_EDITS + 1; /* more bias entries than a row's edits */
    assert_false(loom__sample_chain_summary_ok(&c, TOP));
    /* a penalty window longer than the edits take: the row (loom__sample_chain_edits says) */
    static loom_token hist[LOOM_LOGIT_SUMMARY_MAX_EDITS + 1];
    static int32_t ids[LOOM_LOGIT_SUMMARY_MAX_EDITS], counts[LOOM_LOGIT_SUMMARY_MAX_EDITS];
    loom_logit_edits e;
    c = loom__sample_chain_default_config();
    c.repeat_penalty = 1.1f;
    c.penalty_last_n = -1;
    assert_false(
        loom__sample_chain_edits(&c, hist, LOOM_LOGIT_SUMMARY_MAX_EDITS + 1, ids, counts, &e));
    /* its window, the last 64 of 1025: positions 961..1000 hold 0, 1, 2; 1001..1024 hold 7, 8,
     * 9 — six distinct tokens, counted */
    c.penalty_last_n = 64;
    for (int i = 0; i < LOOM_LOGIT_SUMMARY_MAX_EDITS + 1; i++) hist[i] = i % 3 + (i > 1000) * 7;
    assert_true(
        loom__sample_chain_edits(&c, hist, LOOM_LOGIT_SUMMARY_MAX_EDITS + 1, ids, counts, &e));
    assert_int_equal(e.n_pen, 6);
    static const int32_t want_ids[6] = {0, 1, 2, 7, 8, 9}, want_counts[6] = {13, 14, 13, 8, 8, 8};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(ids[i], want_ids[i]);
        assert_int_equal(counts[i], want_counts[i]);
    }
}

/* Bad summaries and settings get clear errors. */
static void test_summary_errors(void **state) {
    (void)state;
    const int32_t V = 100;
    loom__sample_chain_ws *ws = make_ws(V);
    float x[100], row[100];
    for (int i = 0; i < V; i++) x[i] = (float)gauss();
    loom_logit_summary s;
    static loom_logit_cand top[TOP];
    loom__sample_logits_summarize(x, V, 20, &s, top);
    loom__sample_chain_config c = loom__sample_chain_default_config();
    loom__sample_chain_result r;
    memset(&r, 0, sizeof r);
    loom__row_summary rs = {.sum = &s, .top = top};
    /* top-k 40 over a list of 20 of 100 finite logits: not covered */
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &rs, 0, row, &r), LOOM_ERR_INVALID_ARG);
    c.top_k = 10;
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &rs, 0, row, &r), LOOM_OK);
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, NULL, 0, row, &r),
                     LOOM_ERR_INVALID_ARG);
    rs.top = NULL;
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &rs, 0, row, &r), LOOM_ERR_INVALID_ARG);
    rs.top = top;
    loom_logit_summary bad = s;
    bad.n_posinf = 1; /* a +inf (or one made by the edits) */
    rs.sum = &bad;
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &rs, 0, row, &r), LOOM_ERR_BAD_INPUT);
    bad = s;
    bad.n_finite = 0;
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &rs, 0, row, &r), LOOM_ERR_BAD_INPUT);
    rs.sum = &s;
    c.temperature = -1; /* the settings are validated as the whole-row run validates them */
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &rs, 0, row, &r), LOOM_ERR_INVALID_ARG);
    c.temperature = 0.5f;
    /* edits without the raw row's summary */
    loom_logit_bias b = {3, 1.0f};
    loom_logit_edits e = {.bias = &b, .n_bias = 1};
    rs.edits = &e;
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &rs, 0, row, &r), LOOM_ERR_INVALID_ARG);
    /* every logit finite in a list of 100, top-k 200: the row rebuilt, and without scratch */
    loom__sample_logits_summarize(x, V, 100, &s, top);
    rs = (loom__row_summary){.sum = &s, .top = top};
    c.top_k = 200;
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &rs, 0, row, &r), LOOM_OK);
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &rs, 0, NULL, &r),
                     LOOM_ERR_INVALID_ARG);
    top[3].id = V; /* a stray id in the list */
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &rs, 0, row, &r), LOOM_ERR_BAD_INPUT);
    /* a penalty that overflows on a -inf logit (-inf - -inf: NaN): the whole-row run refuses it,
     * and so does the run over the summary */
    x[5] = -INFINITY;
    c = loom__sample_chain_default_config();
    c.frequency_penalty = -3e38f;
    const loom_token hist[2] = {5, 5};
    static int32_t ids[LOOM_LOGIT_SUMMARY_MAX_EDITS], counts[LOOM_LOGIT_SUMMARY_MAX_EDITS];
    static loom_logit_cand rtop[TOP];
    loom_logit_edits ed;
    loom_logit_summary rsum;
    float vals[2], scratch[100];
    assert_int_equal(loom__sample_chain_run(ws, &c, x, hist, 2, 0, &r), LOOM_ERR_BAD_INPUT);
    assert_true(loom__sample_chain_edits(&c, hist, 2, ids, counts, &ed));
    loom__sample_logits_summarize_edited(x, V, TOP, &ed, scratch, &s, top, &rsum, rtop, vals);
    assert_true(s.n_posinf == 1 && scratch[5] == INFINITY);
    rs = (loom__row_summary){
        .sum = &s, .top = top, .edits = &ed, .raw_sum = &rsum, .raw_top = rtop, .edit_raw = vals};
    assert_int_equal(loom__sample_chain_run_summary(ws, &c, &rs, 0, row, &r), LOOM_ERR_BAD_INPUT);
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
