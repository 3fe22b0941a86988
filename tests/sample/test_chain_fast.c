/* test_chain_fast.c — the sampler chain's fast paths against plain float64 references: the
 * vector exponential, the entropy pass on a 262,144-token vocabulary, the raw log-sum-exp that
 * reuses the processed pass when bias and penalties edited a few logits (and its fallback for
 * huge biases), top-p's bucketed nucleus (exactly the float64 one, with draws that follow its
 * distribution), and top-k's block skipping. */
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
#include "sample/entropy.h"
#include "sample/rng.h"
#include "sample/vexp.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static void check_close(double got, double want, double rel, const char *what) {
    double tol = rel * (fabs(want) > 1 ? fabs(want) : 1);
    if (!(fabs(got - want) <= tol)) fail_msg("%s: got %.17g want %.17g", what, got, want);
}

/* log-sum-exp of x in float64 (NaN and -inf skipped). */
static double ref_lse(const float *x, int n) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        if (x[i] > m) m = x[i];
    for (int i = 0; i < n; i++)
        if (x[i] > -INFINITY) s += exp((double)x[i] - m);
    return m + log(s);
}

typedef struct ranked {
    float x;
    int32_t id;
} ranked;
static int ranked_cmp(const void *a, const void *b) {
    const ranked *p = a, *q = b;
    if (p->x != q->x) return p->x > q->x ? -1 : 1;
    return (p->id > q->id) - (p->id < q->id);
}

/* ---- the vector exponential -------------------------------------------------------------- */

static void test_vexp_accuracy(void **state) {
    (void)state;
    double worst = 0;
    enum { L = LOOM__VL };
    for (int k = 0; k < 200000; k++) {
        double d[L], out[L];
        for (int j = 0; j < L; j++) {
            double u = frand();
            d[j] = k % 3 == 0 ? -708 * u : k % 3 == 1 ? -40 * u : -1e-3 * u;
        }
        loom__vd dv, dz, ev;
        loom__vl keep;
        memcpy(&dv, d, sizeof dv);
        loom__vexp_split(&dv, &dz, &keep);
        loom__vexp(&ev, &dz, &keep);
        memcpy(out, &ev, sizeof out);
        for (int j = 0; j < L; j++) {
            double want = exp(d[j]), err = fabs(out[j] - want) / want;
            if (err > worst) worst = err;
        }
    }
    print_message("  vexp (%d lanes): worst relative error %.3g (2 ulp = 4.4e-16)\n", L, worst);
    assert_true(worst <= 4.5e-16);
    /* exact points, underflow, -inf and NaN */
    double d[L], out[L], dzs[L];
    for (int j = 0; j < L; j++) d[j] = NAN;
    d[0] = 0.0, d[1] = -708.5, d[2] = -INFINITY;
    loom__vd dv, dz, ev;
    loom__vl keep;
    memcpy(&dv, d, sizeof dv);
    loom__vexp_split(&dv, &dz, &keep);
    loom__vexp(&ev, &dz, &keep);
    memcpy(out, &ev, sizeof out);
    memcpy(dzs, &dz, sizeof dzs);
    assert_true(out[0] == 1.0 && out[1] == 0.0 && out[2] == 0.0 && out[3] == 0.0);
    for (int j = 1; j < L; j++) assert_true(dzs[j] == 0.0); /* no NaN left for products */
}

/* ---- the entropy pass on a full vocabulary ----------------------------------------------- */

static void test_entropy_large_vocab(void **state) {
    (void)state;
    enum { V = 262144 };
    static float x[V];
    for (int rep = 0; rep < 3; rep++) {
        for (int i = 0; i < V; i++) x[i] = (float)(gauss() * (2 + 3 * rep));
        for (int i = 5; i < V; i += 97) x[i] = rep == 1 ? NAN : -INFINITY;
        x[V - 1] = 100.0f; /* the maximum in the tail */
        double m = -INFINITY, s = 0, t = 0, u = 0;
        for (int i = 0; i < V; i++)
            if (x[i] > m) m = x[i];
        for (int i = 0; i < V; i++) {
            if (!(x[i] > -INFINITY)) continue;
            double d = (double)x[i] - m, e = exp(d);
            s += e, t += e * d, u += e * d * d;
        }
        double h = log(s) - t / s, var = u / s - (t / s) * (t / s);
        loom__logit_stats st;
        loom__logit_stats_compute(x, V, 1.0, &st);
        check_close(st.entropy, h, 1e-9, "entropy");
        check_close(st.varentropy, var, 1e-7, "varentropy");
        check_close(st.max + log(st.sum), m + log(s), 1e-12, "logsumexp");
        assert_int_equal(st.argmax, V - 1);
        /* odd lengths reach the padded tail */
        loom__logit_stats a;
        loom__logit_stats_compute(x, V - 3, 1.0, &a);
        assert_true(a.n_finite < st.n_finite && a.argmax != V - 1);
    }
}

/* ---- raw log-probabilities after bias and penalties --------------------------------------- */

static void test_raw_logprobs_after_edits(void **state) {
    (void)state;
    enum { V = 50021 };
    static float lg[V];
    loom__sample_chain_ws *ws = make_ws(V);
    for (int i = 0; i < V; i++) lg[i] = (float)(gauss() * 3);
    lg[77] = 25.0f; /* the raw maximum, banned below */
    lg[78] = NAN;   /* a NaN the chain reads as -inf */
    lg[79] = 24.0f;
    const loom_token hist[12] = {79, 5, 5, 9, 79, 1000, 2000, 5, 78, 77, 3000, 79};
    loom_logit_bias bias[5] = {
        {77, -INFINITY}, {9, 0.0f}, {1000, 7.5f}, {1000, 0.5f}, {40000, -3.0f}};
    const double lse = ref_lse(lg, V);
    for (int variant = 0; variant < 4; variant++) {
        loom__sample_chain_config c = loom__sample_chain_default_config();
        c.n_logprobs = 20;
        c.entropy_mode = LOOM_ENTROPY_EDT;
        c.bias = bias;
        c.n_bias = 5;
        c.penalty_last_n = 8;
        c.repeat_penalty = 1.3f;
        c.presence_penalty = 0.4f;
        c.frequency_penalty = 0.1f;
        if (variant == 1) c.n_bias = 0; /* penalties alone */
        if (variant == 2) c.repeat_penalty = 1, c.presence_penalty = 0, c.frequency_penalty = 0;
        if (variant == 3) bias[2].bias = 700.0f; /* beyond the reuse: full pass */
        loom__sample_chain_logprob tr[20], tf[20];
        for (uint64_t d = 0; d < 4; d++) {
            loom__sample_chain_result r = {.top_raw = tr, .top_final = tf};
            assert_int_equal(loom__sample_chain_run(ws, &c, lg, hist, 12, d, &r), LOOM_OK);
            check_close(r.logprob_raw, (double)lg[r.token] - lse, 1e-5, "chosen raw logprob");
            assert_int_equal(r.n_top_raw, 20);
            assert_int_equal(tr[0].id, 77); /* raw top is of the unedited logits */
            for (int i = 0; i < 20; i++)
                check_close(tr[i].logprob, (double)lg[tr[i].id] - lse, 1e-5, "top raw");
            if (c.n_bias) assert_true(r.token != 77);
        }
    }
    bias[2].bias = 7.5f;
}

/* ---- top-p: sorted and bucket paths ------------------------------------------------------- */

/* The float64 nucleus of softmax(x / t) at top_p: fills ids (best first), returns its size. */
static int ref_nucleus(const float *x, int n, double t, double top_p, int32_t *ids) {
    static ranked r[300000];
    int m = 0;
    double xmax = -INFINITY, z = 0;
    for (int i = 0; i < n; i++)
        if (x[i] > -INFINITY) r[m++] = (ranked){x[i], i}, xmax = x[i] > xmax ? x[i] : xmax;
    qsort(r, (size_t)m, sizeof *r, ranked_cmp);
    for (int i = 0; i < m; i++) z += exp(((double)r[i].x - xmax) / t);
    double cum = 0;
    int k = m;
    for (int i = 0; i < m; i++) {
        cum += exp(((double)r[i].x - xmax) / t);
        if (cum >= top_p * z) {
            k = i + 1;
            break;
        }
    }
    for (int i = 0; i < k; i++) ids[i] = r[i].id;
    return k;
}

/* Top-p without top-k finds the nucleus with buckets and sorts only the bucket where the mass
 * reaches top_p: the nucleus must be exactly the float64 one (size, and its best-first list
 * through the final logprobs), and every draw must land in it. */
static void check_top_p(int32_t V, double sigma, float temp, float top_p) {
    float *lg = malloc((size_t)V * sizeof *lg);
    int32_t *ids = malloc((size_t)V * sizeof *ids);
    loom__sample_chain_logprob *tf = malloc((size_t)V * sizeof *tf);
    loom__sample_chain_logprob *tr = malloc((size_t)V * sizeof *tr);
    char *in = calloc((size_t)V, 1);
    assert_true(lg && ids && tf && tr && in);
    rng_state = 0x5EEDull + (uint64_t)V; /* the same data whatever ran before */
    for (int i = 0; i < V; i++) lg[i] = (float)(gauss() * sigma);
    for (int i = 3; i < V; i += 101) lg[i] = -INFINITY;
    for (int i = 10; i < V; i += 1009) lg[i] = lg[i - 1]; /* ties across ids */
    loom__sample_chain_ws *ws = make_ws(V);
    loom__sample_chain_config c = loom__sample_chain_default_config();
    c.top_k = 0, c.top_p = top_p, c.temperature = temp;
    c.n_logprobs = V;
    int k = ref_nucleus(lg, V, temp, top_p, ids);
    for (int i = 0; i < k; i++) in[ids[i]] = 1;
    for (uint64_t d = 0; d < 8; d++) {
        loom__sample_chain_result r = {.top_raw = tr, .top_final = tf};
        assert_int_equal(loom__sample_chain_run(ws, &c, lg, NULL, 0, d, &r), LOOM_OK);
        assert_int_equal(r.n_candidates, k);
        assert_int_equal(r.n_top_final, k);
        for (int i = 0; i < k; i++) assert_int_equal(tf[i].id, ids[i]); /* best first */
        assert_true(in[r.token]);
    }
    print_message("  top-p %.2f T %.2f over %d tokens: nucleus of %d\n", top_p, temp, V, k);
    free(lg);
    free(ids);
    free(tf);
    free(tr);
    free(in);
}

/* Upper 0.001 quantile of chi-square with df degrees of freedom (Wilson-Hilferty). */
static double chi2_threshold(int df) {
    const double z = 3.090232306167813;
    double a = 2.0 / (9.0 * df), t = 1 - a + z * sqrt(a);
    return df * t * t * t;
}

/* Draws from a large nucleus follow its distribution: the nucleus ranks are cut into 16 cells
 * of about equal mass and 20,000 draws are tested with chi-square at p = 0.001. */
static void test_top_p_draws(void **state) {
    (void)state;
    enum { V = 3000, CELLS = 16, DRAWS = 20000 };
    static float lg[V];
    static int32_t ids[V];
    static int cell_of[V];
    rng_state = 0xD1CEull;
    for (int i = 0; i < V; i++) lg[i] = (float)(gauss() * 0.8);
    const double temp = 1.0, top_p = 0.9;
    int k = ref_nucleus(lg, V, temp, top_p, ids);
    double xmax = -INFINITY, zk = 0, p_cell[CELLS] = {0};
    for (int i = 0; i < V; i++) xmax = lg[i] > xmax ? lg[i] : xmax;
    for (int i = 0; i < k; i++) zk += exp(((double)lg[ids[i]] - xmax) / temp);
    for (int i = 0; i < V; i++) cell_of[i] = -1;
    double cum = 0;
    for (int i = 0; i < k; i++) {
        double p = exp(((double)lg[ids[i]] - xmax) / temp) / zk;
        int cell = (int)(cum * CELLS);
        cell = cell < CELLS ? cell : CELLS - 1;
        cell_of[ids[i]] = cell;
        p_cell[cell] += p;
        cum += p;
    }
    loom__sample_chain_ws *ws = make_ws(V);
    loom__sample_chain_config c = loom__sample_chain_default_config();
    c.top_k = 0, c.top_p = (float)top_p, c.temperature = (float)temp;
    long count[CELLS] = {0};
    for (uint64_t d = 0; d < DRAWS; d++) {
        loom__sample_chain_result r = {0};
        assert_int_equal(loom__sample_chain_run(ws, &c, lg, NULL, 0, d, &r), LOOM_OK);
        assert_true(cell_of[r.token] >= 0); /* in the nucleus */
        count[cell_of[r.token]]++;
    }
    double stat = 0;
    for (int j = 0; j < CELLS; j++) {
        double e = p_cell[j] * DRAWS;
        stat += (count[j] - e) * (count[j] - e) / e;
    }
    print_message("  top-p draws over a nucleus of %d: chi2 %.2f, threshold %.2f (df %d)\n", k,
                  stat, chi2_threshold(CELLS - 1), CELLS - 1);
    assert_true(stat < chi2_threshold(CELLS - 1));
}

static void test_top_p_nucleus(void **state) {
    (void)state;
    check_top_p(200, 1.0, 1.0f, 0.9f);     /* a small vocabulary */
    check_top_p(8000, 3.0, 1.0f, 0.9f);    /* hundreds */
    check_top_p(40000, 3.0, 1.0f, 0.9f);   /* a small nucleus among many tokens */
    check_top_p(100000, 0.7, 1.3f, 0.95f); /* flat: most of the vocabulary */
    check_top_p(262144, 1.5, 2.0f, 0.8f);
    check_top_p(50000, 20.0, 0.5f, 0.5f); /* peaked: a nucleus of one or two */
}

/* ---- top-k with block skipping ----------------------------------------------------------- */

static void test_top_k_blocks(void **state) {
    (void)state;
    enum { V = 70001 };
    static float lg[V];
    static ranked r[V];
    loom__sample_chain_ws *ws = make_ws(V);
    for (int rep = 0; rep < 3; rep++) {
        for (int i = 0; i < V; i++) lg[i] = (float)(gauss() * 2);
        if (rep == 1) /* rising logits: every block beats the heap */
            for (int i = 0; i < V; i++) lg[i] = (float)i * 1e-3f;
        if (rep == 2) /* many exact ties straddling the k-th place */
            for (int i = 0; i < V; i++) lg[i] = (float)(i % 7 == 0 ? 5 : i % 3);
        int m = 0;
        for (int i = 0; i < V; i++) r[m++] = (ranked){lg[i], i};
        qsort(r, (size_t)m, sizeof *r, ranked_cmp);
        loom__sample_chain_config c = loom__sample_chain_default_config();
        c.top_k = 57, c.top_p = 1.0f, c.n_logprobs = 57, c.temperature = 0.7f;
        loom__sample_chain_logprob tr[57], tf[57];
        loom__sample_chain_result res = {.top_raw = tr, .top_final = tf};
        assert_int_equal(loom__sample_chain_run(ws, &c, lg, NULL, 0, 1, &res), LOOM_OK);
        assert_int_equal(res.n_top_raw, 57);
        assert_int_equal(res.n_top_final, 57);
        for (int i = 0; i < 57; i++) {
            assert_int_equal(tr[i].id, r[i].id);
            assert_int_equal(tf[i].id, r[i].id);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vexp_accuracy),
        cmocka_unit_test(test_entropy_large_vocab),
        cmocka_unit_test(test_raw_logprobs_after_edits),
        cmocka_unit_test(test_top_p_nucleus),
        cmocka_unit_test(test_top_p_draws),
        cmocka_unit_test(test_top_k_blocks),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free_ws();
    return rc;
}
