/* chain.c — the sampler chain: bias → penalties → entropy correction → temperature → top-k →
 * top-p → min-p → typical-p → draw, with logprobs (the order and the modes are documented in
 * chain.h). This file holds the workspace, the configuration and the run that takes the steps
 * in order; the steps are in chain_select.c, chain_prepare.c and chain_filter.c. All scratch
 * lives in a caller-owned workspace. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "sample/chain_internal.h"
#include "sample/rng.h"

/* ---- workspace -------------------------------------------------------------------------- */

#define CHAIN_ALIGN 16

static size_t align_up(size_t v) {
    return (v + CHAIN_ALIGN - 1) & ~(size_t)(CHAIN_ALIGN - 1);
}

size_t loom__sample_chain_workspace_size(int32_t n_vocab) {
    if (n_vocab <= 0 || (uint64_t)n_vocab > SIZE_MAX / 64) return 0;
    size_t n = (size_t)n_vocab, nb = (n + CHAIN_BLOCK - 1) / CHAIN_BLOCK;
    return align_up(sizeof(loom__sample_chain_ws)) + align_up(n * sizeof(float)) +
           align_up(n * sizeof(loom__chain_cand)) + align_up(n * sizeof(loom__chain_key)) +
           align_up(n * sizeof(int32_t)) + 2 * align_up(nb * sizeof(float));
}

loom_status loom__sample_chain_workspace_init(void *mem, size_t size, int32_t n_vocab,
                                              loom__sample_chain_ws **out) {
    LOOM_CHECK_ARG(mem != NULL && out != NULL && n_vocab > 0);
    LOOM_RETURN_IF(((uintptr_t)mem % CHAIN_ALIGN) != 0, LOOM_ERR_INVALID_ARG,
                   "sample chain: workspace must be %d-byte aligned", CHAIN_ALIGN);
    size_t need = loom__sample_chain_workspace_size(n_vocab);
    LOOM_RETURN_IF(need == 0, LOOM_ERR_INVALID_ARG, "sample chain: n_vocab %d too large", n_vocab);
    LOOM_RETURN_IF(size < need, LOOM_ERR_BUFFER_TOO_SMALL,
                   "sample chain: workspace of %zu bytes, %zu needed", size, need);
    size_t n = (size_t)n_vocab;
    char *p = mem;
    loom__sample_chain_ws *ws = (loom__sample_chain_ws *)(void *)p;
    p += align_up(sizeof *ws);
    ws->n_vocab = n_vocab;
    ws->x = (float *)(void *)p;
    p += align_up(n * sizeof(float));
    ws->cand = (loom__chain_cand *)(void *)p;
    p += align_up(n * sizeof(loom__chain_cand));
    ws->aux = p;
    p += align_up(n * sizeof(loom__chain_key));
    ws->counts = (int32_t *)(void *)p;
    memset(ws->counts, 0, n * sizeof(int32_t));
    p += align_up(n * sizeof(int32_t));
    ws->n_blocks = (int32_t)((n + CHAIN_BLOCK - 1) / CHAIN_BLOCK);
    ws->bmax_raw = (float *)(void *)p;
    p += align_up((size_t)ws->n_blocks * sizeof(float));
    ws->bmax_x = (float *)(void *)p;
    ws->bmax = ws->bmax_raw;
    *out = ws;
    return LOOM_OK;
}

/* ---- configuration ---------------------------------------------------------------------- */

loom__sample_chain_config loom__sample_chain_default_config(void) {
    loom__sample_chain_config c;
    memset(&c, 0, sizeof c);
    c.penalty_last_n = 64;
    c.repeat_penalty = 1.0f;
    c.entropy_mode = LOOM_ENTROPY_NONE;
    c.exp_beta = 0.5f;
    c.edt_n = 0.8f;
    c.edt_theta = 1.0f;
    c.edt_h_min = 1e-3f;
    c.dyn_t_min = 0.5f;
    c.dyn_t_max = 1.5f;
    c.dyn_exponent = 1.0f;
    c.temperature = 0.8f;
    c.top_k = 40;
    c.top_p = 0.95f;
    c.min_p = 0.0f;
    c.typical_p = 1.0f;
    c.seed = 0x5EED;
    return c;
}

#define BAD_CFG(cond, ...) LOOM_RETURN_IF(cond, LOOM_ERR_INVALID_ARG, "sample chain: " __VA_ARGS__)

loom_status loom__sample_chain_validate(const loom__sample_chain_config *c, int32_t n_vocab) {
    LOOM_CHECK_ARG(c != NULL && n_vocab > 0);
    BAD_CFG(!(c->temperature >= 0) || !isfinite(c->temperature),
            "temperature %g must be finite and >= 0", (double)c->temperature);
    BAD_CFG(!(c->top_p > 0 && c->top_p <= 1), "top_p %g must be in (0, 1]", (double)c->top_p);
    BAD_CFG(!(c->min_p >= 0 && c->min_p <= 1), "min_p %g must be in [0, 1]", (double)c->min_p);
    BAD_CFG(!(c->typical_p > 0 && c->typical_p <= 1), "typical_p %g must be in (0, 1]",
            (double)c->typical_p);
    BAD_CFG(c->n_bias < 0 || (c->n_bias > 0 && c->bias == NULL),
            "logit bias list of %d entries is invalid", c->n_bias);
    for (int32_t i = 0; i < c->n_bias; i++) {
        BAD_CFG(c->bias[i].id < 0 || c->bias[i].id >= n_vocab,
                "logit bias %d: token id %d out of range [0, %d)", i, c->bias[i].id, n_vocab);
        BAD_CFG(isnan(c->bias[i].bias) || c->bias[i].bias == INFINITY,
                "logit bias %d (token %d): bias %g must be finite or -inf", i, c->bias[i].id,
                (double)c->bias[i].bias);
    }
    BAD_CFG(c->penalty_last_n < -1, "penalty_last_n %d must be >= -1", c->penalty_last_n);
    BAD_CFG(!(c->repeat_penalty > 0) || !isfinite(c->repeat_penalty),
            "repeat_penalty %g must be finite and > 0", (double)c->repeat_penalty);
    BAD_CFG(!isfinite(c->presence_penalty), "presence_penalty %g must be finite",
            (double)c->presence_penalty);
    BAD_CFG(!isfinite(c->frequency_penalty), "frequency_penalty %g must be finite",
            (double)c->frequency_penalty);
    switch (c->entropy_mode) {
    case LOOM_ENTROPY_NONE:
        break;
    case LOOM_ENTROPY_EXP:
        BAD_CFG(!(c->exp_beta >= 0) || !isfinite(c->exp_beta),
                "entropy EXP: beta %g must be finite and >= 0", (double)c->exp_beta);
        break;
    case LOOM_ENTROPY_EDT:
        BAD_CFG(!(c->edt_theta >= 0) || !isfinite(c->edt_theta),
                "entropy EDT: theta %g must be finite and >= 0", (double)c->edt_theta);
        BAD_CFG(!(c->edt_n > 0 && c->edt_n <= 1), "entropy EDT: N %g must be in (0, 1]",
                (double)c->edt_n);
        BAD_CFG(!(c->edt_h_min > 0) || !isfinite(c->edt_h_min),
                "entropy EDT: entropy floor %g must be finite and > 0", (double)c->edt_h_min);
        break;
    case LOOM_ENTROPY_DYNATEMP:
        BAD_CFG(!(c->dyn_t_min >= 0 && c->dyn_t_max >= c->dyn_t_min) || !isfinite(c->dyn_t_max),
                "entropy DYNATEMP: range [%g, %g] must satisfy 0 <= t_min <= t_max < inf",
                (double)c->dyn_t_min, (double)c->dyn_t_max);
        BAD_CFG(!(c->dyn_exponent >= 0) || !isfinite(c->dyn_exponent),
                "entropy DYNATEMP: exponent %g must be finite and >= 0", (double)c->dyn_exponent);
        break;
    default:
        BAD_CFG(1, "unknown entropy mode %d", (int)c->entropy_mode);
    }
    BAD_CFG(c->n_logprobs < 0 || c->n_logprobs > n_vocab, "n_logprobs %d must be in [0, %d]",
            c->n_logprobs, n_vocab);
    return LOOM_OK;
}

/* ---- the last steps, shared by the run over a whole row and the run over its summary ----- */

/* A greedy step: a point mass on the arg max. */
static loom_token greedy(const loom__sample_chain_config *c, const loom__logit_stats *st,
                         loom__sample_chain_result *out) {
    out->logprob_final = 0;
    out->entropy_final = 0;
    out->temperature = 0;
    out->n_candidates = 1;
    out->n_top_final = 0;
    if (c->n_logprobs > 0) {
        out->top_final[0] = (loom__sample_chain_logprob){st->argmax, 0.0f};
        out->n_top_final = 1;
    }
    return st->argmax;
}

/* 9. The draw among the n survivors the filters left in ws->cand (best first when by_prob), at
 * temperature t, and what the result reports of the final distribution. */
static loom_token draw(loom__sample_chain_ws *ws, const loom__sample_chain_config *c, double t,
                       double xmax, int32_t n, bool by_prob, uint64_t draw_index,
                       loom__sample_chain_result *out) {
    const double s = 1.0 / t;
    loom__chain_cand *cd = ws->cand;
    double *w = ws->aux; /* the survivors' weights, computed once */
    loom__chain_exp_cands(cd, n, s, xmax, w);
    double zf = 0;
    for (int32_t i = 0; i < n; i++) zf += w[i];
    const double lzf = log(zf);
    /* inverse CDF in candidate order (a deterministic order) */
    double u = loom__rng_uniform(c->seed, draw_index) * zf, cum = 0;
    int32_t pick = n - 1;
    for (int32_t i = 0; i < n; i++) {
        cum += w[i];
        if (u < cum) {
            pick = i;
            break;
        }
    }
    out->logprob_final = (float)(s * ((double)cd[pick].x - xmax) - lzf);
    double hf = 0, izf = 1.0 / zf;
    for (int32_t i = 0; i < n; i++) {
        double lq = s * ((double)cd[i].x - xmax) - lzf;
        hf -= w[i] * izf * lq;
    }
    out->entropy_final = hf > 0 ? hf : 0;
    out->temperature = t;
    out->n_candidates = n;
    out->n_top_final = 0;
    if (c->n_logprobs > 0) {
        int32_t m = n < c->n_logprobs ? n : c->n_logprobs;
        const loom__chain_cand *best = cd;
        if (!by_prob) { /* n-entry heap over the survivors */
            loom__chain_cand *h = ws->aux;
            int32_t held = 0;
            for (int32_t i = 0; i < n; i++)
                if (held < m || !(cd[i].x < h[0].x)) loom__chain_heap_offer(h, &held, m, cd[i]);
            qsort(h, (size_t)held, sizeof *h, loom__chain_cand_cmp);
            best = h;
        }
        for (int32_t i = 0; i < m; i++)
            out->top_final[i] = (loom__sample_chain_logprob){
                best[i].id, (float)(s * ((double)best[i].x - xmax) - lzf)};
        out->n_top_final = m;
    }
    return cd[pick].id;
}

/* ---- the run ---------------------------------------------------------------------------- */

loom_status loom__sample_chain_run(loom__sample_chain_ws *ws, const loom__sample_chain_config *c,
                                   const float *logits, const loom_token *history,
                                   int32_t n_history, uint64_t draw_index,
                                   loom__sample_chain_result *out) {
    LOOM_CHECK_ARG(ws != NULL && c != NULL && logits != NULL && out != NULL);
    LOOM_CHECK_ARG(n_history >= 0 && (n_history == 0 || history != NULL));
    LOOM_TRY(loom__sample_chain_validate(c, ws->n_vocab));
    LOOM_RETURN_IF(
        c->n_logprobs > 0 && (out->top_raw == NULL || out->top_final == NULL), LOOM_ERR_INVALID_ARG,
        "sample chain: n_logprobs %d needs top_raw and top_final buffers", c->n_logprobs);
    const int32_t nv = ws->n_vocab;
    for (int32_t i = 0; i < n_history; i++)
        LOOM_RETURN_IF(history[i] < 0 || history[i] >= nv, LOOM_ERR_BAD_INPUT,
                       "sample chain: history token %d at %d out of range [0, %d)", history[i], i,
                       nv);

    /* 1-2. bias and penalties into ws->x */
    bool modified = false;
    loom__chain_scan scan;
    LOOM_TRY(loom__chain_prepare(ws, c, logits, history, n_history, &modified, &scan));
    LOOM_RETURN_IF(scan.n_finite == 0, LOOM_ERR_BAD_INPUT, "sample chain: no finite logit among %d",
                   nv);

    /* One pass: normalizer, entropy, varentropy of softmax(x) (and what loom__chain_raw_lse needs).
     */
    loom__logit_stats st;
    double same = 0;
    loom__logit_stats_known(ws->x, modified ? logits : NULL, nv, scan.xmax, scan.n_finite, &st,
                            &same);
    const double lse_raw =
        modified ? loom__chain_raw_lse(ws, c, logits, history, n_history, &st, same, scan.raw_max)
                 : st.max + log(st.sum);
    out->entropy = st.entropy;
    out->varentropy = st.varentropy;

    /* Raw top-n (before any processing), using ws->cand as the heap. */
    out->n_top_raw = 0;
    if (c->n_logprobs > 0) {
        int32_t m = loom__chain_select_best(logits, ws->bmax_raw, nv, c->n_logprobs, ws->cand);
        for (int32_t i = 0; i < m; i++)
            out->top_raw[i] = (loom__sample_chain_logprob){
                ws->cand[i].id, (float)((double)ws->cand[i].x - lse_raw)};
        out->n_top_raw = m;
    }

    /* 3-4. correction and temperature as one scale s = 1 / T. */
    const double t = loom__chain_temperature(c, &st);
    loom_token tok;
    if (t == 0) {
        tok = greedy(c, &st, out);
    } else {
        bool by_prob;
        int32_t n = loom__chain_filter(ws, c, 1.0 / t, &st, &by_prob);
        tok = draw(ws, c, t, st.max, n, by_prob, draw_index, out);
    }
    out->token = tok;
    out->logprob_raw = (float)((double)logits[tok] - lse_raw);
    return LOOM_OK;
}

/* ---- the run over a row's summary ------------------------------------------------------- */

static bool penalties_on(const loom__sample_chain_config *c) {
    return c->penalty_last_n != 0 &&
           (c->repeat_penalty != 1 || c->presence_penalty != 0 || c->frequency_penalty != 0);
}

bool loom__sample_chain_summary_ok(const loom__sample_chain_config *c, int32_t n_top) {
    if (c == NULL || n_top < 1 || c->n_logprobs > n_top) return false;
    if (c->n_bias < 0 || c->n_bias > LOOM_LOGIT_SUMMARY_MAX_EDITS) return false;
    return c->temperature == 0 || (c->top_k >= 1 && c->top_k <= n_top);
}

static int cmp_token(const void *a, const void *b) {
    const loom_token *p = a, *q = b;
    return (*p > *q) - (*p < *q);
}

bool loom__sample_chain_edits(const loom__sample_chain_config *c, const loom_token *hist,
                              int32_t n_hist, int32_t *pen_id, int32_t *pen_count,
                              loom_logit_edits *out) {
    *out = (loom_logit_edits){.bias = c->bias,
                              .n_bias = c->n_bias,
                              .repeat_penalty = c->repeat_penalty,
                              .presence_penalty = c->presence_penalty,
                              .frequency_penalty = c->frequency_penalty};
    if (c->n_bias > LOOM_LOGIT_SUMMARY_MAX_EDITS) return false;
    if (!penalties_on(c) || n_hist <= 0) return true;
    /* the window the chain's penalties read (chain_prepare.c) */
    int32_t start = 0;
    if (c->penalty_last_n > 0 && n_hist > c->penalty_last_n) start = n_hist - c->penalty_last_n;
    const int32_t w = n_hist - start;
    if (w > LOOM_LOGIT_SUMMARY_MAX_EDITS - c->n_bias) return false;
    /* distinct tokens with their counts: the window sorted, then runs (the penalties of
     * distinct tokens touch distinct logits, so their order does not matter) */
    memcpy(pen_id, hist + start, (size_t)w * sizeof *pen_id);
    qsort(pen_id, (size_t)w, sizeof *pen_id, cmp_token);
    int32_t n = 0;
    for (int32_t i = 0; i < w;) {
        int32_t j = i;
        while (j < w && pen_id[j] == pen_id[i]) j++;
        pen_id[n] = pen_id[i];
        pen_count[n++] = j - i;
        i = j;
    }
    out->pen_id = pen_id;
    out->pen_count = pen_count;
    out->n_pen = n;
    return true;
}

/* row[0..n_vocab) = -inf but for the summary's entries, which must be every finite logit. */
static loom_status rebuild_row(const loom_logit_summary *sum, const loom_logit_cand *top,
                               int32_t n_vocab, float *row) {
    LOOM_RETURN_IF(sum->n_top != sum->n_finite || row == NULL, LOOM_ERR_INVALID_ARG,
                   "sample chain: a summary of %d of %d finite logits cannot rebuild its row",
                   sum->n_top, sum->n_finite);
    for (int32_t i = 0; i < n_vocab; i++) row[i] = -INFINITY;
    for (int32_t i = 0; i < sum->n_top; i++) {
        LOOM_RETURN_IF(top[i].id < 0 || top[i].id >= n_vocab, LOOM_ERR_BAD_INPUT,
                       "sample chain: summary entry %d names token %d of %d", i, top[i].id,
                       n_vocab);
        row[top[i].id] = top[i].logit;
    }
    return LOOM_OK;
}

/* The raw logit of token tok whose processed logit is x: an edited token's raw value, else x. */
static float raw_logit(const loom__row_summary *rs, bool edited, loom_token tok, float x) {
    if (!edited) return x;
    const loom_logit_edits *e = rs->edits;
    for (int32_t j = 0; j < e->n_bias; j++)
        if (e->bias[j].id == tok) return rs->edit_raw[j];
    for (int32_t j = 0; j < e->n_pen; j++)
        if (e->pen_id[j] == tok) return rs->edit_raw[e->n_bias + j];
    return x;
}

loom_status loom__sample_chain_run_summary(loom__sample_chain_ws *ws,
                                           const loom__sample_chain_config *c,
                                           const loom__row_summary *rs, uint64_t draw_index,
                                           float *row, loom__sample_chain_result *out) {
    LOOM_CHECK_ARG(ws != NULL && c != NULL && rs != NULL && out != NULL && rs->sum != NULL);
    const loom_logit_summary *sum = rs->sum;
    const bool edited = rs->edits != NULL && rs->edits->n_bias + rs->edits->n_pen > 0;
    LOOM_CHECK_ARG(sum->n_top >= 0 && (sum->n_top == 0 || rs->top != NULL));
    LOOM_CHECK_ARG(!edited || (rs->raw_sum != NULL && rs->edit_raw != NULL &&
                               (rs->raw_sum->n_top == 0 || rs->raw_top != NULL)));
    const loom_logit_summary *raw = edited ? rs->raw_sum : sum;
    const loom_logit_cand *top = rs->top, *raw_top = edited ? rs->raw_top : top;
    LOOM_TRY(loom__sample_chain_validate(c, ws->n_vocab));
    LOOM_RETURN_IF(
        c->n_logprobs > 0 && (out->top_raw == NULL || out->top_final == NULL), LOOM_ERR_INVALID_ARG,
        "sample chain: n_logprobs %d needs top_raw and top_final buffers", c->n_logprobs);
    LOOM_RETURN_IF(raw->n_posinf > 0, LOOM_ERR_BAD_INPUT, "sample chain: %d logits are +inf",
                   raw->n_posinf);
    LOOM_RETURN_IF(sum->n_posinf > 0, LOOM_ERR_BAD_INPUT,
                   "sample chain: %d logits overflow after bias and penalties", sum->n_posinf);
    LOOM_RETURN_IF(sum->n_finite <= 0, LOOM_ERR_BAD_INPUT, "sample chain: no finite logit among %d",
                   ws->n_vocab);
    /* The lists must hold every candidate the settings reach: as summary_ok promises for lists
     * of n_top entries, or every finite logit. */
    const bool complete = sum->n_top == sum->n_finite;
    const bool raw_complete = raw->n_top == raw->n_finite;
    LOOM_RETURN_IF((!complete && !loom__sample_chain_summary_ok(c, sum->n_top)) ||
                       (!raw_complete && raw->n_top < c->n_logprobs),
                   LOOM_ERR_INVALID_ARG,
                   "sample chain: these settings need the whole row of logits (top-k off or "
                   "above the %d candidates of the summary, or more logprobs)",
                   sum->n_top);

    const loom__logit_stats st = {.max = sum->max,
                                  .sum = sum->sum,
                                  .entropy = sum->entropy,
                                  .varentropy = sum->varentropy,
                                  .n_finite = sum->n_finite,
                                  .argmax = sum->argmax};
    const double lse_raw = raw->max + log(raw->sum);
    const double t = loom__chain_temperature(c, &st);
    loom_token tok;
    float tok_x; /* its processed logit */
    if (t == 0) {
        tok = greedy(c, &st, out);
        tok_x = (float)st.max;
    } else if (c->top_k > 0 && c->top_k < st.n_finite) {
        /* Top-k over fewer than every finite logit keeps the list's first k (the same total
         * order as the chain's heap). */
        loom__chain_cand *cd = ws->cand;
        double *w = ws->aux;
        const int32_t k = c->top_k;
        for (int32_t i = 0; i < k; i++) cd[i] = (loom__chain_cand){top[i].logit, top[i].id};
        loom__chain_exp_cands(cd, k, 1.0 / t, st.max, w);
        double z = 0;
        for (int32_t i = 0; i < k; i++) z += w[i];
        bool by_prob = true;
        int32_t n = loom__chain_filter_rest(ws, c, 1.0 / t, st.max, k, z, &by_prob);
        tok = draw(ws, c, t, st.max, n, by_prob, draw_index, out);
        tok_x = NAN;
        for (int32_t i = 0; i < k; i++)
            if (top[i].id == tok) tok_x = top[i].logit;
    } else {
        /* The chain walks the whole vocabulary (top-p's buckets, or every finite logit in id
         * order); the list holds every finite (processed) logit: the row rebuilt from it, run
         * without the edits it already holds. */
        LOOM_TRY(rebuild_row(sum, top, ws->n_vocab, row));
        loom__sample_chain_config plain = *c;
        plain.n_bias = 0;
        plain.penalty_last_n = 0;
        LOOM_TRY(loom__sample_chain_run(ws, &plain, row, NULL, 0, draw_index, out));
        tok = out->token;
        tok_x = row[tok];
    }
    out->entropy = st.entropy;
    out->varentropy = st.varentropy;
    out->n_top_raw = 0;
    if (c->n_logprobs > 0) { /* the best n of the raw row are its list's first n */
        int32_t m = c->n_logprobs < raw->n_top ? c->n_logprobs : raw->n_top;
        for (int32_t i = 0; i < m; i++)
            out->top_raw[i] = (loom__sample_chain_logprob){
                raw_top[i].id, (float)((double)raw_top[i].logit - lse_raw)};
        out->n_top_raw = m;
    }
    out->token = tok;
    out->logprob_raw = (float)((double)raw_logit(rs, edited, tok, tok_x) - lse_raw);
    return LOOM_OK;
}
