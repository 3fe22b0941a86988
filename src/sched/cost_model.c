/* cost_model.c — the step-cost model's online weighted least squares (see cost_model.h). */
#include "sched/cost_model.h"

#include <math.h>
#include <string.h>

void loom__cost_model_init(loom__cost_model *m, double half_life) {
    memset(m, 0, sizeof *m);
    m->half_life = half_life > 0 ? half_life : 256;
}

void loom__cost_model_set(loom__cost_model *m, double base_us, double per_token_us,
                          double per_ctx_us) {
    m->base_us = base_us > 0 ? base_us : 0;
    m->per_token_us = per_token_us > 0 ? per_token_us : 0;
    m->per_ctx_us = per_ctx_us > 0 ? per_ctx_us : 0;
    if (m->n_obs == 0) m->n_obs = -1; /* "set": ready without observations */
}

bool loom__cost_model_ready(const loom__cost_model *m) {
    return m->n_obs != 0;
}

/* Solves the normal equations restricted to the inputs in `use` (a bit mask over x's three
 * components); unused coefficients are 0. Returns false when the system is singular. */
static bool solve(const loom__cost_model *m, unsigned use, double coef[3]) {
    int idx[3], k = 0;
    for (int i = 0; i < 3; i++)
        if (use & (1u << i)) idx[k++] = i;
    double a[3][4];
    for (int r = 0; r < k; r++) {
        for (int c = 0; c < k; c++) a[r][c] = m->sxx[idx[r]][idx[c]];
        a[r][k] = m->sxy[idx[r]];
    }
    /* Gaussian elimination with partial pivoting; a pivot tiny against its row's diagonal
     * scale means the inputs are collinear (every step the same size, say). */
    for (int c = 0; c < k; c++) {
        int p = c;
        for (int r = c + 1; r < k; r++)
            if (fabs(a[r][c]) > fabs(a[p][c])) p = r;
        double scale = fabs(m->sxx[idx[c]][idx[c]]);
        if (!(fabs(a[p][c]) > 1e-9 * (scale > 0 ? scale : 1))) return false;
        if (p != c)
            for (int j = 0; j <= k; j++) {
                double t = a[c][j];
                a[c][j] = a[p][j];
                a[p][j] = t;
            }
        for (int r = 0; r < k; r++) {
            if (r == c) continue;
            double f = a[r][c] / a[c][c];
            for (int j = c; j <= k; j++) a[r][j] -= f * a[c][j];
        }
    }
    coef[0] = coef[1] = coef[2] = 0;
    for (int r = 0; r < k; r++) coef[idx[r]] = a[r][k] / a[r][r];
    return true;
}

static void refit(loom__cost_model *m) {
    /* The full model, then ever smaller ones, until every coefficient is >= 0. */
    static const unsigned tries[] = {7u, 3u, 5u, 1u};
    double c[3];
    for (unsigned t = 0; t < sizeof tries / sizeof *tries; t++) {
        if (!solve(m, tries[t], c)) continue;
        if (c[0] < 0 || c[1] < 0 || c[2] < 0) continue;
        m->base_us = c[0];
        m->per_token_us = c[1];
        m->per_ctx_us = c[2];
        return;
    }
    /* Nothing fits with non-negative coefficients: time proportional to tokens. */
    double tok = m->sxx[0][1];
    m->base_us = 0;
    m->per_token_us = tok > 0 ? m->sxy[0] / tok : 0;
    m->per_ctx_us = 0;
}

void loom__cost_model_update(loom__cost_model *m, double n_tokens, double n_ctx, double step_us) {
    if (!isfinite(n_tokens) || !isfinite(n_ctx) || !isfinite(step_us) || n_tokens < 0 ||
        n_ctx < 0 || step_us < 0)
        return;
    double keep = exp2(-1.0 / m->half_life);
    double x[3] = {1.0, n_tokens, n_ctx};
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) m->sxx[i][j] = m->sxx[i][j] * keep + x[i] * x[j];
        m->sxy[i] = m->sxy[i] * keep + x[i] * step_us;
    }
    m->n_obs = m->n_obs < 0 ? 1 : m->n_obs + 1;
    refit(m);
}

double loom__cost_model_predict(const loom__cost_model *m, double n_tokens, double n_ctx) {
    if (m->n_obs == 0) return 0;
    return m->base_us + m->per_token_us * n_tokens + m->per_ctx_us * n_ctx;
}
