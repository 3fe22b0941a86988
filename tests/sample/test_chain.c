/* test_chain.c — the sampler chain: streaming entropy (and its edge cases: NaN, partial -inf,
 * closed forms, logits near FLT_MAX) and each correction mode against float64 references, EDT's
 * entropy floor, chi-square distribution tests of every filter and mode (and proof the test
 * can fail; test_chain_dist.c has the full distribution tests), determinism, penalties and
 * bias, logprobs, and bad input. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sample/chain.h"
#include "sample/entropy.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t rng_state = 0x1234567ull;
static double frand(void) { /* xorshift64*, test-local */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static void *ws_mem;
static loom__sample_chain_ws *make_ws(int32_t n_vocab) {
    size_t sz = loom__sample_chain_workspace_size(n_vocab);
    assert_true(sz > 0);
    free(ws_mem);
    ws_mem = aligned_alloc(16, (sz + 15) / 16 * 16);
    assert_non_null(ws_mem);
    loom__sample_chain_ws *ws = NULL;
    assert_int_equal(loom__sample_chain_workspace_init(ws_mem, sz, n_vocab, &ws), LOOM_OK);
    return ws;
}

static loom__sample_chain_config no_filters(void) {
    loom__sample_chain_config c = loom__sample_chain_default_config();
    c.top_k = 0;
    c.top_p = 1.0f;
    c.temperature = 1.0f;
    return c;
}

/* Float64 two-pass reference of softmax(scale * x): entropy, varentropy, log-probs. */
typedef struct ref_stats {
    double h, v, lse;
} ref_stats;
static ref_stats ref_compute(const float *x, int n, double scale, double *logp) {
    double m = -INFINITY, s = 0, h = 0, v = 0;
    for (int i = 0; i < n; i++)
        if (x[i] > -INFINITY && scale * x[i] > m) m = scale * x[i];
    for (int i = 0; i < n; i++)
        if (x[i] > -INFINITY) s += exp(scale * x[i] - m);
    double lse = m + log(s), ls = log(s); /* (y - m) - ln s keeps ln 2 next to 1e30 */
    for (int i = 0; i < n; i++) {
        double lp = x[i] > -INFINITY ? (scale * x[i] - m) - ls : -INFINITY;
        if (logp) logp[i] = lp;
        if (lp > -INFINITY && exp(lp) > 0) h -= exp(lp) * lp;
    }
    for (int i = 0; i < n; i++) {
        double lp = x[i] > -INFINITY ? (scale * x[i] - m) - ls : -INFINITY;
        if (lp > -INFINITY && exp(lp) > 0) v += exp(lp) * (lp + h) * (lp + h);
    }
    return (ref_stats){h, v, lse};
}

static void check_close(double got, double want, double rel, const char *what) {
    double tol = rel * (fabs(want) > 1 ? fabs(want) : 1);
    if (!(fabs(got - want) <= tol)) fail_msg("%s: got %.17g want %.17g", what, got, want);
}

/* Logit vectors of several awkward kinds; returns n. */
enum { CASE_RANDOM, CASE_NEGINF, CASE_HUGE, CASE_TINY, CASE_SINGLE, CASE_EQUAL, N_CASES };
static int make_case(int kind, float *x) {
    int n = 200;
    for (int i = 0; i < n; i++) x[i] = (float)(frand() * 8 - 4);
    switch (kind) {
    case CASE_NEGINF:
        for (int i = 0; i < n; i += 3) x[i] = -INFINITY;
        break;
    case CASE_HUGE: /* 1e30-scale differences: most mass on few tokens, no overflow allowed */
        for (int i = 0; i < n; i++) x[i] = (float)((frand() * 2 - 1) * 1e30);
        x[7] = 1e30f, x[9] = 1e30f;
        break;
    case CASE_TINY:
        for (int i = 0; i < n; i++) x[i] = (float)((frand() * 2 - 1) * 1e-30);
        break;
    case CASE_SINGLE:
        for (int i = 0; i < n; i++) x[i] = -INFINITY;
        x[42] = 3.5f;
        break;
    case CASE_EQUAL:
        for (int i = 0; i < n; i++) x[i] = 0.25f;
        break;
    default:
        break;
    }
    return n;
}

/* ---- entropy ---------------------------------------------------------------------------- */

static void test_entropy_matches_reference(void **state) {
    (void)state;
    float x[200];
    const double scales[] = {1.0, 0.37, 2.5};
    for (int kind = 0; kind < N_CASES; kind++) {
        for (int si = 0; si < 3; si++) {
            int n = make_case(kind, x);
            loom__logit_stats st;
            loom__logit_stats_compute(x, n, scales[si], &st);
            ref_stats r = ref_compute(x, n, scales[si], NULL);
            assert_true(isfinite(st.entropy) && isfinite(st.varentropy) && isfinite(st.sum));
            check_close(st.entropy, r.h, 1e-9, "entropy");
            check_close(st.varentropy, r.v, 1e-7, "varentropy");
            check_close(st.max + log(st.sum), r.lse, 1e-12, "logsumexp");
        }
    }
}

static void test_entropy_uniform_is_ln_n(void **state) {
    (void)state;
    static float x[262144];
    const int32_t ns[] = {1, 2, 7, 1000, 262144};
    for (int j = 0; j < 5; j++) {
        for (int32_t i = 0; i < ns[j]; i++) x[i] = -1.75f;
        loom__logit_stats st;
        loom__logit_stats_compute(x, ns[j], 1.0, &st);
        check_close(st.entropy, log((double)ns[j]), 1e-12, "H(uniform)");
        assert_true(st.varentropy < 1e-12);
        assert_int_equal(st.n_finite, ns[j]);
    }
    float none[3] = {-INFINITY, NAN, -INFINITY};
    loom__logit_stats st;
    loom__logit_stats_compute(none, 3, 1.0, &st);
    assert_int_equal(st.n_finite, 0);
    assert_int_equal(st.argmax, -1);
}

/* NaN entries count as -inf; -inf entries leave a uniform over the rest at ln n_finite; a
 * two-point distribution against its closed forms; logits near FLT_MAX do not overflow. */
static void test_entropy_edge_cases(void **state) {
    (void)state;
    float x[200];
    int n = make_case(CASE_RANDOM, x);
    float y[200];
    memcpy(y, x, sizeof x);
    for (int i = 0; i < n; i += 7) x[i] = NAN, y[i] = -INFINITY;
    loom__logit_stats a, b;
    loom__logit_stats_compute(x, n, 1.0, &a);
    loom__logit_stats_compute(y, n, 1.0, &b);
    assert_true(a.entropy == b.entropy && a.varentropy == b.varentropy && a.n_finite == b.n_finite);
    for (int i = 0; i < n; i++) x[i] = i % 3 == 0 ? -INFINITY : 1.25f;
    loom__logit_stats_compute(x, n, 1.0, &a);
    check_close(a.entropy, log((double)(n - (n + 2) / 3)), 1e-12, "H(uniform over finite)");
    /* p = sigmoid(d): H = -p ln p - q ln q, Var = p q (ln(p / q))^2 = p q d^2 */
    const double ds[] = {0.0, 0.3, 2.0, 9.0, 30.0};
    for (int k = 0; k < 5; k++) {
        float two[2] = {(float)ds[k], 0.0f};
        double d = (double)two[0], p = 1 / (1 + exp(-d)), q = 1 - p;
        loom__logit_stats_compute(two, 2, 1.0, &a);
        check_close(a.entropy, -p * log(p) - q * log(q), 1e-9, "H(two-point)");
        check_close(a.varentropy, p * q * d * d, 1e-9, "varentropy(two-point)");
    }
    float big[4] = {3.0e38f, 2.9e38f, -INFINITY, 3.0e38f};
    loom__logit_stats_compute(big, 4, 1.0, &a);
    check_close(a.entropy, log(2.0), 1e-12, "H(near FLT_MAX)");
    assert_int_equal(a.argmax, 0);
}

/* EDT's floor: an entropy below edt_h_min is replaced by it, giving a small but usable
 * temperature (not 0 / 0, not greedy unless it underflows). */
static void test_edt_floor(void **state) {
    (void)state;
    loom__sample_chain_ws *ws = make_ws(3);
    const float lg[3] = {0.0f, -30.0f, -31.0f}; /* H ~ 1e-11 nats */
    loom__sample_chain_config c = no_filters();
    c.entropy_mode = LOOM_ENTROPY_EDT;
    c.temperature = 0.9f;
    c.edt_theta = 0.01f;
    c.edt_h_min = 1e-3f;
    loom__sample_chain_result r = {0};
    assert_int_equal(loom__sample_chain_run(ws, &c, lg, NULL, 0, 0, &r), LOOM_OK);
    assert_true(r.entropy < 1e-3);
    double want = (double)c.temperature * pow((double)c.edt_n, (double)c.edt_theta / c.edt_h_min);
    check_close(r.temperature, want, 1e-9, "EDT floored temperature");
    assert_int_equal(r.token, 0);
    c.edt_theta = 1.0f; /* 0.9 * 0.8^1000 underflows the 1e-30 guard: greedy */
    assert_int_equal(loom__sample_chain_run(ws, &c, lg, NULL, 0, 0, &r), LOOM_OK);
    assert_true(r.temperature == 0 && r.n_candidates == 1 && r.token == 0);
}

/* ---- correction modes against the reference -------------------------------------------- */

/* The temperature each mode should produce from H (entropy after bias/penalties). */
static double ref_mode_temperature(const loom__sample_chain_config *c, double h, int n_finite) {
    switch (c->entropy_mode) {
    case LOOM_ENTROPY_EXP:
        return c->temperature / exp(-(double)c->exp_beta * h);
    case LOOM_ENTROPY_EDT: {
        double he = h > c->edt_h_min ? h : c->edt_h_min;
        return c->temperature * pow(c->edt_n, c->edt_theta / he);
    }
    case LOOM_ENTROPY_DYNATEMP: {
        double r = n_finite > 1 ? h / log((double)n_finite) : 0;
        if (r > 1) r = 1;
        return c->dyn_t_min + ((double)c->dyn_t_max - c->dyn_t_min) * pow(r, c->dyn_exponent);
    }
    default:
        return c->temperature;
    }
}

static void test_correction_modes_match_reference(void **state) {
    (void)state;
    float x[200];
    double logp[200];
    loom__sample_chain_logprob top_raw[200], top_fin[200];
    loom__sample_chain_ws *ws = make_ws(200);
    for (int mode = 0; mode < 4; mode++) {
        for (int kind = 0; kind < N_CASES; kind++) {
            int n = make_case(kind, x);
            loom__sample_chain_config c = no_filters();
            c.entropy_mode = (loom_entropy_mode)mode;
            c.temperature = 0.9f;
            c.exp_beta = 0.3f;
            c.edt_theta = 0.7f;
            c.dyn_t_min = 0.2f, c.dyn_t_max = 1.8f, c.dyn_exponent = 0.8f;
            c.n_logprobs = n;
            loom__sample_chain_result r = {.top_raw = top_raw, .top_final = top_fin};
            assert_int_equal(loom__sample_chain_run(ws, &c, x, NULL, 0, 5, &r), LOOM_OK);
            ref_stats rs = ref_compute(x, n, 1.0, NULL);
            int n_finite = 0;
            for (int i = 0; i < n; i++) n_finite += x[i] > -INFINITY;
            check_close(r.entropy, rs.h, 1e-9, "chain entropy");
            double t = ref_mode_temperature(&c, rs.h, n_finite);
            if (t < 1e-30) {
                assert_true(r.temperature == 0);
                continue;
            }
            check_close(r.temperature, t, 1e-9, "mode temperature");
            ref_stats fs = ref_compute(x, n, 1.0 / t, logp);
            check_close(r.entropy_final, fs.h, 1e-7, "final entropy");
            assert_int_equal(r.n_top_final, n_finite);
            for (int i = 0; i < r.n_top_final; i++) {
                double want = logp[top_fin[i].id];
                if (want < -80) continue; /* float rounding of tiny probabilities */
                check_close(top_fin[i].logprob, want, 1e-5, "final logprob");
            }
            check_close(r.logprob_final, logp[r.token], 1e-5, "chosen final logprob");
        }
    }
}

/* ---- distribution tests ----------------------------------------------------------------- */

#define NV 8
static const float DIST_LOGITS[NV] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};

/* Upper 0.001 quantile of chi-square with df degrees of freedom (Wilson-Hilferty). */
static double chi2_threshold(int df) {
    const double z = 3.090232306167813; /* standard normal upper 0.001 point */
    double a = 2.0 / (9.0 * df);
    double t = 1 - a + z * sqrt(a);
    return df * t * t * t;
}

/* Exact target: softmax at temperature t (descending logits), then top-k / top-p / min-p /
 * typical-p written out directly. */
static void ref_target(double t, int top_k, double top_p, double min_p, double typical_p,
                       double *p) {
    int keep[NV];
    double w[NV], z = 0;
    for (int i = 0; i < NV; i++) keep[i] = top_k <= 0 || i < top_k;
    for (int i = 0; i < NV; i++) z += keep[i] ? (w[i] = exp(DIST_LOGITS[i] / t)) : (w[i] = 0);
    double cum = 0;
    for (int i = 0; i < NV; i++) {
        if (!keep[i]) continue;
        if (cum >= top_p * z) keep[i] = 0;
        cum += w[i];
    }
    for (int i = 0; i < NV; i++)
        if (keep[i] && w[i] < min_p * w[0]) keep[i] = 0;
    if (typical_p < 1) {
        double zc = 0, h = 0, dev[NV];
        int order[NV], m = 0;
        for (int i = 0; i < NV; i++) zc += keep[i] ? w[i] : 0;
        for (int i = 0; i < NV; i++)
            if (keep[i]) h -= w[i] / zc * log(w[i] / zc);
        for (int i = 0; i < NV; i++)
            if (keep[i]) dev[i] = fabs(-log(w[i] / zc) - h), order[m++] = i;
        for (int a = 0; a < m; a++) /* insertion sort by deviation */
            for (int b = a; b > 0 && dev[order[b]] < dev[order[b - 1]]; b--) {
                int tmp = order[b];
                order[b] = order[b - 1], order[b - 1] = tmp;
            }
        double c2 = 0;
        for (int a = 0; a < m; a++) {
            if (c2 >= typical_p * zc) keep[order[a]] = 0;
            c2 += w[order[a]];
        }
    }
    double zz = 0;
    for (int i = 0; i < NV; i++) zz += keep[i] ? w[i] : 0;
    for (int i = 0; i < NV; i++) p[i] = keep[i] ? w[i] / zz : 0;
}

#define N_DRAWS 100000
static void draw_counts(const loom__sample_chain_config *c, long *counts) {
    loom__sample_chain_ws *ws = make_ws(NV);
    memset(counts, 0, NV * sizeof *counts);
    for (uint64_t d = 0; d < N_DRAWS; d++) {
        loom__sample_chain_result r = {0};
        assert_int_equal(loom__sample_chain_run(ws, c, DIST_LOGITS, NULL, 0, d, &r), LOOM_OK);
        counts[r.token]++;
    }
}

/* Chi-square of counts against p; tokens with p == 0 must never appear. Sets *df. */
static double chi2(const long *counts, const double *p, int *df) {
    double stat = 0;
    int support = 0;
    *df = 0;
    for (int i = 0; i < NV; i++) {
        if (p[i] == 0) {
            if (counts[i] != 0) return INFINITY;
            continue;
        }
        support++;
        double e = p[i] * N_DRAWS;
        stat += (counts[i] - e) * (counts[i] - e) / e;
    }
    *df = support - 1;
    return stat;
}

static void expect_fit(const char *name, const loom__sample_chain_config *c, const double *p) {
    long counts[NV];
    draw_counts(c, counts);
    int df = 0;
    double stat = chi2(counts, p, &df);
    double thr = df > 0 ? chi2_threshold(df) : 0;
    print_message("  chi2 %-22s df %d  stat %8.3f  threshold %7.3f\n", name, df, stat, thr);
    if (df == 0)
        assert_true(stat == 0);
    else
        assert_true(stat < thr);
}

static void test_distributions(void **state) {
    (void)state;
    double p[NV];
    loom__sample_chain_config c;

    c = no_filters(), c.temperature = 0.7f;
    ref_target(0.7, 0, 1, 0, 1, p);
    expect_fit("temperature 0.7", &c, p);

    c = no_filters(), c.top_k = 3;
    ref_target(1, 3, 1, 0, 1, p);
    expect_fit("top-k 3", &c, p);

    c = no_filters(), c.top_p = 0.8f, c.temperature = 1.3f;
    ref_target(1.3, 0, 0.8f, 0, 1, p);
    expect_fit("top-p 0.8 T1.3", &c, p);

    c = no_filters(), c.min_p = 0.2f;
    ref_target(1, 0, 1, 0.2f, 1, p);
    expect_fit("min-p 0.2", &c, p);

    c = no_filters(), c.typical_p = 0.6f;
    ref_target(1, 0, 1, 0, 0.6f, p);
    expect_fit("typical-p 0.6", &c, p);

    c = no_filters(), c.top_k = 6, c.top_p = 0.9f, c.min_p = 0.05f;
    ref_target(1, 6, 0.9f, 0.05f, 1, p);
    expect_fit("top-k6 top-p.9 min-p.05", &c, p);

    /* The modes: the reference temperature from the float64 entropy of the logits. */
    ref_stats rs = ref_compute(DIST_LOGITS, NV, 1.0, NULL);
    for (int mode = 1; mode < 4; mode++) {
        c = no_filters();
        c.entropy_mode = (loom_entropy_mode)mode;
        c.exp_beta = 0.4f, c.edt_theta = 1.5f, c.dyn_t_min = 0.3f, c.dyn_t_max = 2.0f;
        double t = ref_mode_temperature(&c, rs.h, NV);
        ref_target(t, 0, 1, 0, 1, p);
        char name[32];
        snprintf(name, sizeof name, "mode %d (T %.3f)", mode, t);
        expect_fit(name, &c, p);
    }
}

static void test_chi2_detects_an_off_by_one_top_k(void **state) {
    (void)state;
    loom__sample_chain_config c = no_filters();
    c.top_k = 3;
    long counts[NV];
    draw_counts(&c, counts);
    double broken[NV];
    ref_target(1, 4, 1, 0, 1, broken); /* the off-by-one filter keeps 4 */
    int df = 0;
    double stat = chi2(counts, broken, &df);
    print_message("  chi2 off-by-one top-k   df %d  stat %8.3f  threshold %7.3f\n", df, stat,
                  chi2_threshold(df));
    assert_true(stat > chi2_threshold(df));
    /* And a subtler one: temperature 1 vs 1.1 without any filter. */
    c = no_filters();
    draw_counts(&c, counts);
    ref_target(1.1, 0, 1, 0, 1, broken);
    stat = chi2(counts, broken, &df);
    print_message("  chi2 T 1 vs target 1.1  df %d  stat %8.3f  threshold %7.3f\n", df, stat,
                  chi2_threshold(df));
    assert_true(stat > chi2_threshold(df));
}

/* ---- determinism, greedy ---------------------------------------------------------------- */

static void test_determinism(void **state) {
    (void)state;
    loom__sample_chain_ws *ws = make_ws(NV);
    loom__sample_chain_config c = no_filters();
    c.temperature = 2.0f;
    loom_token a[256], b[256];
    int differ = 0;
    for (uint64_t d = 0; d < 256; d++) {
        loom__sample_chain_result r1 = {0}, r2 = {0}, r3 = {0};
        assert_int_equal(loom__sample_chain_run(ws, &c, DIST_LOGITS, NULL, 0, d, &r1), LOOM_OK);
        assert_int_equal(loom__sample_chain_run(ws, &c, DIST_LOGITS, NULL, 0, d, &r2), LOOM_OK);
        assert_int_equal(r1.token, r2.token);
        assert_int_equal(loom__sample_chain_run(ws, &c, DIST_LOGITS, NULL, 0, d + 256, &r3),
                         LOOM_OK);
        a[d] = r1.token, b[d] = r3.token;
        differ += a[d] != b[d];
    }
    assert_true(differ > 64); /* a different draw index gives a different stream */
    c.seed = 99;
    differ = 0;
    for (uint64_t d = 0; d < 256; d++) {
        loom__sample_chain_result r = {0};
        assert_int_equal(loom__sample_chain_run(ws, &c, DIST_LOGITS, NULL, 0, d, &r), LOOM_OK);
        differ += r.token != a[d];
    }
    assert_true(differ > 64);
}

static void test_greedy(void **state) {
    (void)state;
    loom__sample_chain_ws *ws = make_ws(6);
    float lg[6] = {0.5f, -INFINITY, 3.0f, 2.9f, NAN, 3.0f};
    loom__sample_chain_config c = loom__sample_chain_default_config();
    c.temperature = 0;
    c.entropy_mode = LOOM_ENTROPY_EDT;
    c.n_logprobs = 3;
    loom__sample_chain_logprob tr[3], tf[3];
    loom__sample_chain_result r = {.top_raw = tr, .top_final = tf};
    for (uint64_t d = 0; d < 50; d++) {
        assert_int_equal(loom__sample_chain_run(ws, &c, lg, NULL, 0, d, &r), LOOM_OK);
        assert_int_equal(r.token, 2);
        assert_true(r.logprob_final == 0 && r.n_top_final == 1 && tf[0].id == 2);
    }
    assert_int_equal(r.n_top_raw, 3);
    assert_int_equal(tr[0].id, 2);
    assert_int_equal(tr[1].id, 5);
    assert_int_equal(tr[2].id, 3);
    /* A single finite logit under every mode is always chosen. */
    float one[6] = {-INFINITY, -INFINITY, -INFINITY, 7.0f, -INFINITY, NAN};
    for (int mode = 0; mode < 4; mode++) {
        c = no_filters();
        c.entropy_mode = (loom_entropy_mode)mode;
        assert_int_equal(loom__sample_chain_run(ws, &c, one, NULL, 0, 3, &r), LOOM_OK);
        assert_int_equal(r.token, 3);
        assert_true(fabs(r.logprob_raw) < 1e-6);
    }
}

/* ---- penalties and bias ----------------------------------------------------------------- */

static void test_penalties_and_bias(void **state) {
    (void)state;
    loom__sample_chain_ws *ws = make_ws(5);
    const float lg[5] = {1.0f, -1.0f, 2.0f, 0.5f, 0.25f};
    const loom_token hist[5] = {2, 0, 1, 0, 0}; /* window 4: token 0 x3, token 1 x1 */
    const loom_logit_bias bias[3] = {{3, 1.0f}, {4, -INFINITY}, {3, 0.5f}};
    loom__sample_chain_config c = no_filters();
    c.penalty_last_n = 4;
    c.repeat_penalty = 2.0f, c.presence_penalty = 0.5f, c.frequency_penalty = 0.25f;
    c.bias = bias, c.n_bias = 3;
    c.n_logprobs = 5;
    /* Hand-computed: x0 = 1/2 - 0.5 - 3*0.25 = -0.75; x1 = -1*2 - 0.5 - 0.25 = -2.75;
     * x2 = 2 (outside the window); x3 = 0.5 + 1 + 0.5 = 2; x4 banned. */
    const double want[5] = {-0.75, -2.75, 2.0, 2.0, -INFINITY};
    double z = 0;
    for (int i = 0; i < 4; i++) z += exp(want[i]);
    for (int rep = 0; rep < 2; rep++) { /* twice: the count scratch must be reset */
        loom__sample_chain_logprob tr[5], tf[5];
        loom__sample_chain_result r = {.top_raw = tr, .top_final = tf};
        assert_int_equal(loom__sample_chain_run(ws, &c, lg, hist, 5, 11, &r), LOOM_OK);
        assert_int_equal(r.n_top_final, 4);
        assert_int_equal(tf[0].id, 2); /* tie with 3 goes to the lower id */
        assert_int_equal(tf[1].id, 3);
        assert_int_equal(tf[2].id, 0);
        assert_int_equal(tf[3].id, 1);
        for (int i = 0; i < 4; i++)
            check_close(tf[i].logprob, want[tf[i].id] - log(z), 1e-6, "penalized logprob");
        assert_true(r.token != 4);
    }
    /* Whole history (-1): token 2 also penalized once: 2/2 - 0.5 - 0.25 = 0.25. */
    c.penalty_last_n = -1;
    c.temperature = 0;
    c.n_logprobs = 0;
    loom__sample_chain_result r = {0};
    assert_int_equal(loom__sample_chain_run(ws, &c, lg, hist, 5, 0, &r), LOOM_OK);
    assert_int_equal(r.token, 3);
    /* Window 0: penalties off, bias on: 2 and 3 tie at 2.0, lower id wins. */
    c.penalty_last_n = 0;
    assert_int_equal(loom__sample_chain_run(ws, &c, lg, hist, 5, 0, &r), LOOM_OK);
    assert_int_equal(r.token, 2);
}

/* ---- logprobs --------------------------------------------------------------------------- */

static void test_logprobs(void **state) {
    (void)state;
    enum { V = 5000 };
    static float lg[V];
    static double lp[V];
    for (int i = 0; i < V; i++) lg[i] = (float)(frand() * 10 - 5);
    lg[17] = -INFINITY;
    loom__sample_chain_ws *ws = make_ws(V);
    ref_stats rs = ref_compute(lg, V, 1.0, lp);
    const int tops[3][3] = {{50, 0, 0}, {0, 1, 0}, {0, 0, 1}}; /* top-k / top-p / typical */
    for (int cfgi = 0; cfgi < 3; cfgi++) {
        loom__sample_chain_config c = no_filters();
        c.top_k = tops[cfgi][0];
        if (tops[cfgi][1]) c.top_p = 0.9f;
        if (tops[cfgi][2]) c.typical_p = 0.5f;
        c.n_logprobs = 20;
        c.entropy_mode = LOOM_ENTROPY_EXP;
        loom__sample_chain_logprob tr[20], tf[20];
        for (uint64_t d = 0; d < 20; d++) {
            loom__sample_chain_result r = {.top_raw = tr, .top_final = tf};
            assert_int_equal(loom__sample_chain_run(ws, &c, lg, NULL, 0, d, &r), LOOM_OK);
            check_close(r.entropy, rs.h, 1e-9, "entropy");
            check_close(r.varentropy, rs.v, 1e-7, "varentropy");
            check_close(r.logprob_raw, lp[r.token], 1e-5, "chosen raw logprob");
            assert_int_equal(r.n_top_raw, 20);
            double sr = 0, sf = 0;
            for (int i = 0; i < 20; i++) {
                if (i) assert_true(tr[i].logprob <= tr[i - 1].logprob);
                check_close(tr[i].logprob, lp[tr[i].id], 1e-5, "top raw logprob");
                sr += exp(tr[i].logprob);
            }
            for (int i = 0; i < r.n_top_final; i++) {
                if (i) assert_true(tf[i].logprob <= tf[i - 1].logprob);
                sf += exp(tf[i].logprob);
                if (tf[i].id == r.token) check_close(tf[i].logprob, r.logprob_final, 1e-6, "fin");
            }
            assert_true(sr <= 1 + 1e-6 && sf <= 1 + 1e-6);
            assert_true(r.logprob_final <= 0);
            if (r.n_candidates <= 20)
                assert_true(r.logprob_final >= tf[r.n_top_final - 1].logprob - 1e-6);
            /* top raw is the true top-20 of the logits */
            int better = 0;
            for (int i = 0; i < V; i++) better += lg[i] > tr[19].logprob + rs.lse + 1e-4;
            assert_true(better <= 19);
        }
    }
}

/* ---- bad input -------------------------------------------------------------------------- */

static void test_bad_input(void **state) {
    (void)state;
    loom__sample_chain_ws *ws = make_ws(NV);
    loom_logit_bias bad_id = {NV, 1.0f}, bad_val = {1, INFINITY};
    loom__sample_chain_result r = {0};
#define EXPECT_BAD(field_set)                                                                      \
    do {                                                                                           \
        loom__sample_chain_config c = loom__sample_chain_default_config();                         \
        field_set;                                                                                 \
        assert_int_equal(loom__sample_chain_validate(&c, NV), LOOM_ERR_INVALID_ARG);               \
        assert_int_equal(loom__sample_chain_run(ws, &c, DIST_LOGITS, NULL, 0, 0, &r),              \
                         LOOM_ERR_INVALID_ARG);                                                    \
        assert_non_null(strstr(loom_last_error(), "sample chain"));                                \
    } while (0)
    EXPECT_BAD(c.temperature = -0.1f);
    EXPECT_BAD(c.temperature = NAN);
    EXPECT_BAD(c.top_p = 0);
    EXPECT_BAD(c.top_p = 1.01f);
    EXPECT_BAD(c.min_p = -0.01f);
    EXPECT_BAD(c.min_p = 1.5f);
    EXPECT_BAD(c.typical_p = 0);
    EXPECT_BAD((c.bias = &bad_id, c.n_bias = 1));
    EXPECT_BAD((c.bias = &bad_val, c.n_bias = 1));
    EXPECT_BAD(c.n_bias = 2);
    EXPECT_BAD(c.repeat_penalty = 0);
    EXPECT_BAD(c.presence_penalty = INFINITY);
    EXPECT_BAD(c.penalty_last_n = -2);
    EXPECT_BAD((c.entropy_mode = LOOM_ENTROPY_EXP, c.exp_beta = -1));
    EXPECT_BAD((c.entropy_mode = LOOM_ENTROPY_EDT, c.edt_theta = -1));
    EXPECT_BAD((c.entropy_mode = LOOM_ENTROPY_EDT, c.edt_n = 1.5f));
    EXPECT_BAD((c.entropy_mode = LOOM_ENTROPY_DYNATEMP, c.dyn_t_min = 2, c.dyn_t_max = 1));
    EXPECT_BAD(c.entropy_mode = (loom_entropy_mode)9);
    EXPECT_BAD(c.n_logprobs = NV + 1);
#undef EXPECT_BAD
    loom__sample_chain_config c = loom__sample_chain_default_config();
    c.n_logprobs = 2; /* valid, but run needs result buffers */
    assert_int_equal(loom__sample_chain_validate(&c, NV), LOOM_OK);
    assert_int_equal(loom__sample_chain_run(ws, &c, DIST_LOGITS, NULL, 0, 0, &r),
                     LOOM_ERR_INVALID_ARG);
}

static void test_bad_input_run(void **state) {
    (void)state;
    loom__sample_chain_ws *ws = make_ws(NV);
    loom__sample_chain_config c = loom__sample_chain_default_config();
    loom__sample_chain_result r = {0};
    loom_token hist[2] = {1, NV};
    assert_int_equal(loom__sample_chain_run(ws, &c, DIST_LOGITS, hist, 2, 0, &r),
                     LOOM_ERR_BAD_INPUT);
    float all_inf[NV], pinf[NV];
    for (int i = 0; i < NV; i++) all_inf[i] = -INFINITY, pinf[i] = 0;
    pinf[3] = INFINITY;
    assert_int_equal(loom__sample_chain_run(ws, &c, all_inf, NULL, 0, 0, &r), LOOM_ERR_BAD_INPUT);
    assert_int_equal(loom__sample_chain_run(ws, &c, pinf, NULL, 0, 0, &r), LOOM_ERR_BAD_INPUT);
    loom_logit_bias big = {2, 3e38f};
    float near[NV] = {0, 0, 3e38f, 0, 0, 0, 0, 0};
    c.bias = &big, c.n_bias = 1;
    assert_int_equal(loom__sample_chain_run(ws, &c, near, NULL, 0, 0, &r), LOOM_ERR_BAD_INPUT);
    c = loom__sample_chain_default_config();
    assert_int_equal(loom__sample_chain_run(NULL, &c, DIST_LOGITS, NULL, 0, 0, &r),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__sample_chain_run(ws, &c, DIST_LOGITS, NULL, 1, 0, &r),
                     LOOM_ERR_INVALID_ARG);
    /* workspace init */
    loom__sample_chain_ws *w2;
    assert_int_equal(loom__sample_chain_workspace_size(0), 0);
    assert_int_equal(loom__sample_chain_workspace_init(ws_mem, 16, NV, &w2),
                     LOOM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(loom__sample_chain_workspace_init((char *)ws_mem + 4, 1 << 20, NV, &w2),
                     LOOM_ERR_INVALID_ARG);
}

static void test_large_vocab(void **state) { /* 262,144 tokens, all filters, sanity */
    (void)state;
    enum { V = 262144 };
    static float lg[V];
    for (int i = 0; i < V; i++) lg[i] = (float)(frand() * 20 - 10);
    loom__sample_chain_ws *ws = make_ws(V);
    loom__sample_chain_config c = loom__sample_chain_default_config();
    c.top_k = 0, c.top_p = 0.9f, c.min_p = 0.01f, c.entropy_mode = LOOM_ENTROPY_EDT;
    c.n_logprobs = 20;
    loom__sample_chain_logprob tr[20], tf[20];
    loom__sample_chain_result r = {.top_raw = tr, .top_final = tf};
    assert_int_equal(loom__sample_chain_run(ws, &c, lg, NULL, 0, 1, &r), LOOM_OK);
    assert_true(r.token >= 0 && r.token < V && lg[r.token] > -10 + 20 * 0.5);
    assert_true(r.n_candidates > 0 && r.n_candidates < V);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entropy_matches_reference),
        cmocka_unit_test(test_entropy_uniform_is_ln_n),
        cmocka_unit_test(test_entropy_edge_cases),
        cmocka_unit_test(test_edt_floor),
        cmocka_unit_test(test_correction_modes_match_reference),
        cmocka_unit_test(test_distributions),
        cmocka_unit_test(test_chi2_detects_an_off_by_one_top_k),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_penalties_and_bias),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_bad_input_run),
        cmocka_unit_test(test_large_vocab),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(ws_mem);
    return rc;
}
