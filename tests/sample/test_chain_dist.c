/* test_chain_dist.c — the sampler chain's draws against exact target distributions.
 *
 * For each setting (temperature alone, top-k, top-p, min-p, typical-p, each entropy mode, bias
 * with penalties, and all filters together) the chain draws 100,000 tokens with draw indices
 * 0..99999 from one fixed 32-token distribution (24 finite logits, 8 at -inf). The target is
 * computed here in double precision from the definitions (nothing from chain.c), and a
 * chi-square goodness-of-fit test must give p > 0.001; cells expected below 5 are merged, and
 * a token outside the target's support must never be drawn. The p-value comes from the
 * regularized upper incomplete gamma function, written below and checked against known
 * quantiles. A filter broken on purpose fails these tests (see the notes of the sampler work:
 * off-by-one top-p, min-p without p_max, EDT with theta * H, and more). */
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

#define NV           32
#define N_DRAWS      100000
#define MIN_EXPECTED 5.0
#define ALPHA        0.001

/* 24 distinct finite logits scattered among 8 banned tokens (so n_finite < n_vocab matters to
 * DYNATEMP and to top-p's cut), with mass spread enough that each filter cuts mid-support. */
static const float LOGITS[NV] = {
    1.9f,  -INFINITY, 3.1f,  0.4f,      -2.4f,     -0.2f, -INFINITY, 2.6f,
    -1.1f, 0.9f,      -9.0f, -INFINITY, 2.2f,      -4.2f, 1.2f,      -INFINITY,
    -0.5f, -5.0f,     0.1f,  -INFINITY, -1.5f,     0.7f,  -2.9f,     -INFINITY,
    -6.0f, 1.5f,      -3.5f, -0.8f,     -INFINITY, -7.5f, -1.9f,     -INFINITY,
};

/* ---- chi-square p-value ----------------------------------------------------------------- */

/* Q(a, x) = Gamma(a, x) / Gamma(a), the regularized upper incomplete gamma function, a > 0,
 * x >= 0. Below x = a + 1 the power series of the lower function P converges fast (Q = 1 - P);
 * above it, the continued fraction of Q itself, evaluated with the modified Lentz method. */
static double gamma_q(double a, double x) {
    if (x <= 0) return 1.0;
    const double eps = 1e-15, tiny = 1e-300;
    double log_front = -x + a * log(x) - lgamma(a); /* ln(x^a e^-x / Gamma(a)) */
    if (x < a + 1) {
        double term = 1.0 / a, sum = term;
        for (int n = 1; n < 100000; n++) {
            term *= x / (a + n);
            sum += term;
            if (fabs(term) < fabs(sum) * eps) break;
        }
        double p = sum * exp(log_front);
        return p >= 1 ? 0.0 : 1.0 - p;
    }
    /* Q = front * 1 / (x + 1 - a - 1(1 - a) / (x + 3 - a - 2(2 - a) / (x + 5 - a - ...))) */
    double b = x + 1 - a, c = 1 / tiny, d = 1 / b, f = d;
    for (int i = 1; i < 100000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1 / d;
        double delta = d * c;
        f *= delta;
        if (fabs(delta - 1) < eps) break;
    }
    return exp(log_front) * f;
}

/* P(chi-square with df degrees of freedom > stat). */
static double chi2_pvalue(double stat, int df) {
    return gamma_q(0.5 * df, 0.5 * stat);
}

static void test_pvalue_function(void **state) {
    (void)state;
    /* Upper quantiles of the chi-square distribution (standard tables). */
    const struct {
        int df;
        double x, p;
    } known[] = {
        {1, 3.841458820694124, 0.05},   {1, 10.827566170662733, 0.001},
        {2, 13.815510557964274, 0.001}, {5, 11.070497693516351, 0.05},
        {10, 18.307038053275146, 0.05}, {10, 2.558212160993, 0.99},
        {30, 59.70306308, 0.001},       {100, 149.4493, 0.001},
        {100, 77.92946, 0.95},
    };
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
        double p = chi2_pvalue(known[k].x, known[k].df);
        if (!(fabs(p - known[k].p) <= 2e-4 * known[k].p + 1e-9))
            fail_msg("df %d x %g: p %.10g, want %.10g", known[k].df, known[k].x, p, known[k].p);
    }
    /* df 2 is exactly exp(-x / 2); df 4 is exp(-x / 2) (1 + x / 2). */
    for (double x = 0.01; x < 80; x *= 1.7) {
        double q2 = chi2_pvalue(x, 2), q4 = chi2_pvalue(x, 4);
        if (!(fabs(q2 - exp(-x / 2)) <= 1e-12 * exp(-x / 2) + 1e-300))
            fail_msg("df 2 at %g: %.17g vs %.17g", x, q2, exp(-x / 2));
        double w4 = exp(-x / 2) * (1 + x / 2);
        if (!(fabs(q4 - w4) <= 1e-12 * w4 + 1e-300))
            fail_msg("df 4 at %g: %.17g vs %.17g", x, q4, w4);
    }
    assert_true(chi2_pvalue(0, 7) == 1.0);
}

/* ---- the exact target, from the definitions ---------------------------------------------- */

typedef struct target_cfg {
    /* 1-2. bias and penalties */
    const loom_logit_bias *bias;
    int n_bias;
    const loom_token *history;
    int n_history;
    int penalty_last_n; /* -1 all */
    double repeat, presence, frequency;
    /* 3-4. correction and temperature */
    loom_entropy_mode mode;
    double temperature, beta, edt_n, edt_theta, edt_h_min, dyn_min, dyn_max, dyn_exp;
    /* 5-8. filters (off: top_k 0, top_p 1, min_p 0, typical_p 1) */
    int top_k;
    double top_p, min_p, typical_p;
} target_cfg;

static target_cfg plain(double temperature) {
    target_cfg t;
    memset(&t, 0, sizeof t);
    t.penalty_last_n = 64;
    t.repeat = 1;
    t.mode = LOOM_ENTROPY_NONE;
    t.temperature = temperature;
    t.edt_h_min = 1e-3;
    t.top_p = 1;
    t.typical_p = 1;
    return t;
}

/* The same settings as the chain sees them. */
static loom__sample_chain_config chain_cfg(const target_cfg *t) {
    loom__sample_chain_config c = loom__sample_chain_default_config();
    c.bias = t->bias;
    c.n_bias = t->n_bias;
    c.penalty_last_n = t->penalty_last_n;
    c.repeat_penalty = (float)t->repeat;
    c.presence_penalty = (float)t->presence;
    c.frequency_penalty = (float)t->frequency;
    c.entropy_mode = t->mode;
    c.exp_beta = (float)t->beta;
    c.edt_n = (float)t->edt_n;
    c.edt_theta = (float)t->edt_theta;
    c.edt_h_min = (float)t->edt_h_min;
    c.dyn_t_min = (float)t->dyn_min;
    c.dyn_t_max = (float)t->dyn_max;
    c.dyn_exponent = (float)t->dyn_exp;
    c.temperature = (float)t->temperature;
    c.top_k = t->top_k;
    c.top_p = (float)t->top_p;
    c.min_p = (float)t->min_p;
    c.typical_p = (float)t->typical_p;
    c.seed = 0xD15C0;
    return c;
}

/* The indices i with keep[i] set, into idx, ordered by key[i] (descending, or ascending when
 * asked; ties: lower index first); returns how many. */
static int order_by(const double *key, const int *keep, int *idx, int ascending) {
    int n = 0;
    for (int i = 0; i < NV; i++)
        if (keep[i]) idx[n++] = i;
    for (int a = 1; a < n; a++) { /* insertion sort: stable, tiny n */
        int v = idx[a], b = a;
        while (b > 0 && (ascending ? key[idx[b - 1]] > key[v] : key[idx[b - 1]] < key[v])) {
            idx[b] = idx[b - 1];
            b--;
        }
        idx[b] = v;
    }
    return n;
}

/* Mass of the kept entries of w. */
static double kept_mass(const double *w, const int *keep) {
    double z = 0;
    for (int i = 0; i < NV; i++)
        if (keep[i]) z += w[i];
    return z;
}

/* Keeps the shortest prefix of idx[0..n) whose share of w reaches frac of the kept mass.
 * *margin gets how close the boundary is (the test must not depend on rounding). */
static void keep_prefix_mass(const double *w, int *keep, const int *idx, int n, double frac,
                             double *margin) {
    double z = kept_mass(w, keep), cum = 0;
    int cut = n;
    for (int a = 0; a < n; a++) {
        cum += w[idx[a]] / z;
        if (cum >= frac) {
            cut = a + 1;
            double before = cum - w[idx[a]] / z;
            double m1 = cum - frac, m2 = frac - before;
            *margin = m1 < m2 ? m1 : m2;
            break;
        }
    }
    for (int a = cut; a < n; a++) keep[idx[a]] = 0;
}

/* p[0..NV) = the distribution the chain should draw from; returns the smallest distance of a
 * filter's threshold from a decision (asserted well above float rounding by the caller). */
static double ref_target(const target_cfg *t, double *p, double *temperature_out) {
    double x[NV], w[NV];
    int keep[NV], idx[NV];
    double margin = INFINITY;
    for (int i = 0; i < NV; i++) x[i] = LOGITS[i];
    /* 1. bias */
    for (int k = 0; k < t->n_bias; k++) x[t->bias[k].id] += t->bias[k].bias;
    /* 2. penalties: once per distinct token of the window, with its count there */
    int start = 0;
    if (t->penalty_last_n >= 0 && t->n_history > t->penalty_last_n)
        start = t->n_history - t->penalty_last_n;
    if (t->penalty_last_n == 0) start = t->n_history;
    int count[NV] = {0};
    for (int k = start; k < t->n_history; k++) count[t->history[k]]++;
    for (int i = 0; i < NV; i++) {
        if (count[i] == 0) continue;
        x[i] = x[i] > 0 ? x[i] / t->repeat : x[i] * t->repeat;
        x[i] -= t->presence + count[i] * t->frequency;
    }
    /* 3. entropy of softmax(x) over the finite entries */
    double xmax = -INFINITY, z = 0, h = 0;
    int n_finite = 0;
    for (int i = 0; i < NV; i++)
        if (x[i] > -INFINITY) {
            n_finite++;
            if (x[i] > xmax) xmax = x[i];
        }
    for (int i = 0; i < NV; i++)
        if (x[i] > -INFINITY) z += exp(x[i] - xmax);
    for (int i = 0; i < NV; i++)
        if (x[i] > -INFINITY) {
            double q = exp(x[i] - xmax) / z;
            h -= q * log(q);
        }
    /* 4. the effective temperature */
    double temp = t->temperature;
    switch (t->mode) {
    case LOOM_ENTROPY_EXP:
        temp = t->temperature * exp(t->beta * h);
        break;
    case LOOM_ENTROPY_EDT:
        temp = t->temperature * pow(t->edt_n, t->edt_theta / (h > t->edt_h_min ? h : t->edt_h_min));
        break;
    case LOOM_ENTROPY_DYNATEMP: {
        double r = n_finite > 1 ? h / log((double)n_finite) : 0;
        if (r > 1) r = 1;
        temp = t->dyn_min + (t->dyn_max - t->dyn_min) * pow(r, t->dyn_exp);
        break;
    }
    default:
        break;
    }
    *temperature_out = temp;
    for (int i = 0; i < NV; i++) {
        keep[i] = x[i] > -INFINITY;
        w[i] = keep[i] ? exp((x[i] - xmax) / temp) : 0;
    }
    /* 5. top-k: the k largest logits */
    if (t->top_k > 0) {
        int n = order_by(x, keep, idx, 0);
        for (int a = t->top_k; a < n; a++) keep[idx[a]] = 0;
    }
    /* 6. top-p: the most probable first, until their share reaches top_p */
    if (t->top_p < 1) {
        int n = order_by(w, keep, idx, 0);
        keep_prefix_mass(w, keep, idx, n, t->top_p, &margin);
    }
    /* 7. min-p: p_i >= min_p * p_max (the ratio does not depend on normalization) */
    if (t->min_p > 0) {
        double wmax = 0;
        for (int i = 0; i < NV; i++)
            if (keep[i] && w[i] > wmax) wmax = w[i];
        for (int i = 0; i < NV; i++) {
            if (!keep[i]) continue;
            double d = fabs(w[i] / wmax - t->min_p) / t->min_p;
            if (d < margin) margin = d;
            if (w[i] < t->min_p * wmax) keep[i] = 0;
        }
    }
    /* 8. typical-p: on the renormalized survivors q, the tokens whose surprisal -ln q is closest
     * to H(q) first, until their share reaches typical_p */
    if (t->typical_p < 1) {
        double zq = kept_mass(w, keep), hq = 0, dev[NV];
        for (int i = 0; i < NV; i++)
            if (keep[i]) hq -= w[i] / zq * log(w[i] / zq);
        for (int i = 0; i < NV; i++) dev[i] = keep[i] ? fabs(-log(w[i] / zq) - hq) : 0;
        int n = order_by(dev, keep, idx, 1);
        keep_prefix_mass(w, keep, idx, n, t->typical_p, &margin);
    }
    double zf = kept_mass(w, keep);
    for (int i = 0; i < NV; i++) p[i] = keep[i] ? w[i] / zf : 0;
    return margin;
}

/* ---- draws and the goodness of fit ------------------------------------------------------- */

static void *ws_mem;
static loom__sample_chain_ws *ws;

static int setup(void **state) {
    (void)state;
    size_t sz = loom__sample_chain_workspace_size(NV);
    ws_mem = aligned_alloc(16, (sz + 15) / 16 * 16);
    if (!ws_mem) return -1;
    return loom__sample_chain_workspace_init(ws_mem, sz, NV, &ws) == LOOM_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    free(ws_mem);
    return 0;
}

/* Draws N_DRAWS tokens with cfg, tests them against the target; returns the p-value. */
static double fit(const char *name, const target_cfg *t) {
    double p[NV], temp = 0;
    double margin = ref_target(t, p, &temp);
    /* A threshold within float rounding of a decision would make the target ambiguous. */
    if (!(margin > 1e-4)) fail_msg("%s: a filter boundary is too close to call (%g)", name, margin);
    loom__sample_chain_config c = chain_cfg(t);
    long counts[NV] = {0};
    for (uint64_t d = 0; d < N_DRAWS; d++) {
        loom__sample_chain_result r;
        memset(&r, 0, sizeof r);
        loom_status st = loom__sample_chain_run(ws, &c, LOGITS, t->history, t->n_history, d, &r);
        if (st != LOOM_OK)
            fail_msg("%s: draw %llu: %s", name, (unsigned long long)d, loom_last_error());
        counts[r.token]++;
    }
    int support = 0;
    for (int i = 0; i < NV; i++) {
        if (p[i] > 0) {
            support++;
        } else if (counts[i] != 0) {
            fail_msg("%s: token %d is outside the target's support but was drawn %ld times", name,
                     i, counts[i]);
        }
    }
    /* Cells by expected count, smallest first; small ones are pooled until the pool reaches
     * MIN_EXPECTED, and a remainder below it joins the last full cell. */
    int idx[NV], n = 0;
    for (int i = 0; i < NV; i++)
        if (p[i] > 0) idx[n++] = i;
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && p[idx[b - 1]] > p[idx[b]]; b--) {
            int tmp = idx[b];
            idx[b] = idx[b - 1], idx[b - 1] = tmp;
        }
    double cell_e[NV], cell_o[NV], pool_e = 0, pool_o = 0;
    int cells = 0;
    for (int a = 0; a < n; a++) {
        pool_e += p[idx[a]] * N_DRAWS;
        pool_o += (double)counts[idx[a]];
        if (pool_e >= MIN_EXPECTED) {
            cell_e[cells] = pool_e, cell_o[cells] = pool_o, cells++;
            pool_e = pool_o = 0;
        }
    }
    if (pool_e > 0) {
        if (cells == 0) cell_e[cells] = 0, cell_o[cells] = 0, cells++;
        cell_e[cells - 1] += pool_e, cell_o[cells - 1] += pool_o;
    }
    double stat = 0;
    for (int k = 0; k < cells; k++)
        stat += (cell_o[k] - cell_e[k]) * (cell_o[k] - cell_e[k]) / cell_e[k];
    int df = cells - 1;
    double pv = df > 0 ? chi2_pvalue(stat, df) : (stat < 1e-9 ? 1.0 : 0.0);
    print_message("  %-28s T %6.3f  support %2d  cells %2d  chi2 %8.2f  p %.4f\n", name, temp,
                  support, cells, stat, pv);
    return pv;
}

static void expect_fit(const char *name, const target_cfg *t) {
    double pv = fit(name, t);
    if (!(pv > ALPHA)) fail_msg("%s: chi-square p-value %.3g <= %g", name, pv, ALPHA);
}

/* ---- the settings ----------------------------------------------------------------------- */

static void test_temperature(void **state) {
    (void)state;
    target_cfg t = plain(0.7);
    expect_fit("temperature 0.7", &t);
    t = plain(1.5);
    expect_fit("temperature 1.5", &t);
}

static void test_top_k(void **state) {
    (void)state;
    target_cfg t = plain(1.0);
    t.top_k = 3;
    expect_fit("top-k 3", &t);
}

static void test_top_p(void **state) {
    (void)state;
    target_cfg t = plain(1.0);
    t.top_p = 0.9;
    expect_fit("top-p 0.9", &t);
    t = plain(1.6); /* a flatter distribution: the nucleus holds more tokens */
    t.top_p = 0.6;
    expect_fit("top-p 0.6 at T 1.6", &t);
}

static void test_min_p(void **state) {
    (void)state;
    target_cfg t = plain(1.0);
    t.min_p = 0.08;
    expect_fit("min-p 0.08", &t);
}

static void test_typical_p(void **state) {
    (void)state;
    target_cfg t = plain(1.0);
    t.typical_p = 0.45; /* keeps 4 tokens around the entropy, not the most likely one */
    expect_fit("typical-p 0.45", &t);
}

static void test_entropy_modes(void **state) {
    (void)state;
    target_cfg t = plain(0.9);
    t.mode = LOOM_ENTROPY_EXP;
    t.beta = 0.4;
    expect_fit("EXP beta 0.4, T0 0.9", &t);
    t = plain(1.2);
    t.mode = LOOM_ENTROPY_EDT;
    t.edt_n = 0.8, t.edt_theta = 1.5, t.edt_h_min = 1e-3;
    expect_fit("EDT N 0.8 theta 1.5, T0 1.2", &t);
    t = plain(1.0);
    t.mode = LOOM_ENTROPY_DYNATEMP;
    t.dyn_min = 0.3, t.dyn_max = 2.0, t.dyn_exp = 0.5;
    expect_fit("DYNATEMP 0.3..2.0 k 0.5", &t);
}

static void test_bias_and_penalties(void **state) {
    (void)state;
    /* Token 2 (the arg max) banned; 9 raised by two entries that add up; 13 raised; history
     * repeats a positive (0), a negative (8) and an out-of-window token (25). */
    static const loom_logit_bias bias[4] = {{2, -INFINITY}, {9, 0.5f}, {13, 3.0f}, {9, 0.25f}};
    static const loom_token hist[10] = {25, 25, 0, 8, 0, 7, 8, 8, 14, 0};
    target_cfg t = plain(1.0);
    t.bias = bias, t.n_bias = 4;
    t.history = hist, t.n_history = 10, t.penalty_last_n = 8;
    t.repeat = 1.4, t.presence = 0.3, t.frequency = 0.2;
    expect_fit("bias + penalties", &t);
}

static void test_all_filters(void **state) {
    (void)state;
    target_cfg t = plain(1.1);
    t.mode = LOOM_ENTROPY_EXP;
    t.beta = 0.2;
    t.top_k = 14, t.top_p = 0.97, t.min_p = 0.004, t.typical_p = 0.9;
    expect_fit("EXP + all four filters", &t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pvalue_function), cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_k),           cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_min_p),           cmocka_unit_test(test_typical_p),
        cmocka_unit_test(test_entropy_modes),   cmocka_unit_test(test_bias_and_penalties),
        cmocka_unit_test(test_all_filters),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
