/* chain.c — the sampler chain: bias → penalties → entropy correction → temperature → top-k →
 * top-p → min-p → typical-p → draw, with logprobs (the order and the modes are documented in
 * chain.h). All scratch lives in a caller-owned workspace. */
#include "sample/chain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "sample/entropy.h"
#include "sample/rng.h"

/* ---- workspace -------------------------------------------------------------------------- */

typedef struct chain_cand {
    float x; /* logit after bias and penalties (unscaled) */
    loom_token id;
} chain_cand;

typedef struct chain_key { /* typical-p sort key */
    double key;            /* |surprisal - H| */
    float x;
    loom_token id;
} chain_key;

struct loom_sample_chain_ws {
    int32_t n_vocab;
    float *x;          /* [n_vocab] logits after bias and penalties */
    chain_cand *cand;  /* [n_vocab] candidates (also the raw top-n heap before filtering) */
    void *aux;         /* [n_vocab] chain_key, or chain_cand for the final top-n heap */
    int32_t *counts;   /* [n_vocab] penalty counts; all zero between calls */
};

#define CHAIN_ALIGN 16

static size_t align_up(size_t v) { return (v + CHAIN_ALIGN - 1) & ~(size_t)(CHAIN_ALIGN - 1); }

size_t loom_sample_chain_workspace_size(int32_t n_vocab) {
    if (n_vocab <= 0 || (uint64_t)n_vocab > SIZE_MAX / 64) return 0;
    size_t n = (size_t)n_vocab;
    return align_up(sizeof(loom_sample_chain_ws)) + align_up(n * sizeof(float)) +
           align_up(n * sizeof(chain_cand)) + align_up(n * sizeof(chain_key)) +
           align_up(n * sizeof(int32_t));
}

loom_status loom_sample_chain_workspace_init(void *mem, size_t size, int32_t n_vocab,
                                             loom_sample_chain_ws **out) {
    LOOM_CHECK_ARG(mem != NULL && out != NULL && n_vocab > 0);
    LOOM_RETURN_IF(((uintptr_t)mem % CHAIN_ALIGN) != 0, LOOM_ERR_INVALID_ARG,
                   "sample chain: workspace must be %d-byte aligned", CHAIN_ALIGN);
    size_t need = loom_sample_chain_workspace_size(n_vocab);
    LOOM_RETURN_IF(need == 0, LOOM_ERR_INVALID_ARG, "sample chain: n_vocab %d too large",
                   n_vocab);
    LOOM_RETURN_IF(size < need, LOOM_ERR_BUFFER_TOO_SMALL,
                   "sample chain: workspace of %zu bytes, %zu needed", size, need);
    size_t n = (size_t)n_vocab;
    char *p = mem;
    loom_sample_chain_ws *ws = (loom_sample_chain_ws *)(void *)p;
    p += align_up(sizeof *ws);
    ws->n_vocab = n_vocab;
    ws->x = (float *)(void *)p;
    p += align_up(n * sizeof(float));
    ws->cand = (chain_cand *)(void *)p;
    p += align_up(n * sizeof(chain_cand));
    ws->aux = p;
    p += align_up(n * sizeof(chain_key));
    ws->counts = (int32_t *)(void *)p;
    memset(ws->counts, 0, n * sizeof(int32_t));
    *out = ws;
    return LOOM_OK;
}

/* ---- configuration ---------------------------------------------------------------------- */

loom_sample_chain_config loom_sample_chain_default_config(void) {
    loom_sample_chain_config c;
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

loom_status loom_sample_chain_validate(const loom_sample_chain_config *c, int32_t n_vocab) {
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
    case LOOM_ENTROPY_NONE: break;
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
    default: BAD_CFG(1, "unknown entropy mode %d", (int)c->entropy_mode);
    }
    BAD_CFG(c->n_logprobs < 0 || c->n_logprobs > n_vocab, "n_logprobs %d must be in [0, %d]",
            c->n_logprobs, n_vocab);
    return LOOM_OK;
}

/* ---- partial selection ------------------------------------------------------------------ */

/* Higher logit first; equal logits: lower id first (a total order). */
static int cand_cmp(const void *a, const void *b) {
    const chain_cand *p = a, *q = b;
    if (p->x != q->x) return p->x > q->x ? -1 : 1;
    return (p->id > q->id) - (p->id < q->id);
}

static bool cand_worse(const chain_cand *a, const chain_cand *b) { return cand_cmp(a, b) > 0; }

/* A heap whose root is the worst of the k best seen so far. */
static void heap_offer(chain_cand *h, int32_t *held, int32_t k, chain_cand v) {
    int32_t i;
    if (*held < k) {
        i = (*held)++;
        while (i > 0 && cand_worse(&v, &h[(i - 1) / 2])) {
            h[i] = h[(i - 1) / 2];
            i = (i - 1) / 2;
        }
        h[i] = v;
        return;
    }
    if (!cand_worse(&h[0], &v)) return;
    i = 0;
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = -1;
        const chain_cand *worst = &v;
        if (l < k && cand_worse(&h[l], worst)) m = l, worst = &h[l];
        if (r < k && cand_worse(&h[r], worst)) m = r;
        if (m < 0) break;
        h[i] = h[m];
        i = m;
    }
    h[i] = v;
}

/* The k best finite entries of x[0..n) into h, best first; returns how many. */
static int32_t select_best(const float *x, int32_t n, int32_t k, chain_cand *h) {
    int32_t held = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!(x[i] > -INFINITY)) continue;
        heap_offer(h, &held, k, (chain_cand){x[i], i});
    }
    qsort(h, (size_t)held, sizeof *h, cand_cmp);
    return held;
}

static int key_cmp(const void *a, const void *b) {
    const chain_key *p = a, *q = b;
    if (p->key != q->key) return p->key < q->key ? -1 : 1;
    if (p->x != q->x) return p->x > q->x ? -1 : 1;
    return (p->id > q->id) - (p->id < q->id);
}

/* ---- the chain -------------------------------------------------------------------------- */

/* Copies logits, applies bias and penalties. Returns BAD_INPUT on +inf. */
static loom_status chain_prepare(loom_sample_chain_ws *ws, const loom_sample_chain_config *c,
                                 const float *logits, const loom_token *hist, int32_t n_hist,
                                 bool *modified) {
    const int32_t n = ws->n_vocab;
    float *x = ws->x;
    for (int32_t i = 0; i < n; i++) {
        float v = logits[i];
        LOOM_RETURN_IF(v == INFINITY, LOOM_ERR_BAD_INPUT, "sample chain: logit %d is +inf", i);
        x[i] = isnan(v) ? -INFINITY : v;
    }
    *modified = c->n_bias > 0;
    for (int32_t i = 0; i < c->n_bias; i++) x[c->bias[i].id] += c->bias[i].bias;

    bool penalize = c->penalty_last_n != 0 && n_hist > 0 &&
                    (c->repeat_penalty != 1 || c->presence_penalty != 0 ||
                     c->frequency_penalty != 0);
    if (penalize) {
        int32_t start = 0;
        if (c->penalty_last_n > 0 && n_hist > c->penalty_last_n) start = n_hist - c->penalty_last_n;
        for (int32_t i = start; i < n_hist; i++) ws->counts[hist[i]]++;
        /* Second pass: apply once per distinct token, then reset its count to zero. */
        for (int32_t i = start; i < n_hist; i++) {
            loom_token t = hist[i];
            int32_t cnt = ws->counts[t];
            if (cnt == 0) continue;
            ws->counts[t] = 0;
            float v = x[t];
            v = v > 0 ? v / c->repeat_penalty : v * c->repeat_penalty;
            v -= c->presence_penalty + (float)cnt * c->frequency_penalty;
            x[t] = v;
        }
        *modified = true;
    }
    /* Only biased or penalized entries can have overflowed to +inf. */
    for (int32_t i = 0; i < c->n_bias; i++) {
        loom_token t = c->bias[i].id;
        LOOM_RETURN_IF(x[t] == INFINITY || isnan(x[t]), LOOM_ERR_BAD_INPUT,
                       "sample chain: logit %d overflows after its bias", t);
    }
    if (penalize) {
        for (int32_t i = 0; i < n_hist; i++) {
            loom_token t = hist[i];
            LOOM_RETURN_IF(x[t] == INFINITY || isnan(x[t]), LOOM_ERR_BAD_INPUT,
                           "sample chain: logit %d overflows after penalties", t);
        }
    }
    return LOOM_OK;
}

/* The effective temperature from the mode (0 = greedy). */
static double chain_temperature(const loom_sample_chain_config *c, const loom__logit_stats *st) {
    double t0 = c->temperature, h = st->entropy, t;
    if (t0 == 0) return 0;
    switch (c->entropy_mode) {
    case LOOM_ENTROPY_EXP: t = t0 * exp((double)c->exp_beta * h); break; /* s = e^(-bH) / T0 */
    case LOOM_ENTROPY_EDT: {
        double he = h > c->edt_h_min ? h : (double)c->edt_h_min;
        t = t0 * pow((double)c->edt_n, (double)c->edt_theta / he);
        break;
    }
    case LOOM_ENTROPY_DYNATEMP: {
        double r = st->n_finite > 1 ? h / log((double)st->n_finite) : 0;
        r = r < 0 ? 0 : r > 1 ? 1 : r;
        t = c->dyn_t_min + ((double)c->dyn_t_max - c->dyn_t_min) * pow(r, (double)c->dyn_exponent);
        break;
    }
    default: t = t0; break;
    }
    /* Below 1e-30 the scale 1/T would push scaled logits toward overflow; the limit is greedy. */
    return t < 1e-30 || !isfinite(t) ? 0 : t;
}

/* Steps 5-8 on the scaled distribution w = exp(s (x - xmax)); leaves survivors in ws->cand and
 * returns their count; *by_prob says whether they are sorted best first. */
static int32_t chain_filter(loom_sample_chain_ws *ws, const loom_sample_chain_config *c,
                            double s, const loom__logit_stats *st, bool *by_prob) {
    const int32_t nv = ws->n_vocab;
    const float *x = ws->x;
    chain_cand *cd = ws->cand;
    const double xmax = st->max;
    int32_t n = 0;
    double z = 0; /* mass of the set top-p is measured against */
    *by_prob = false;

    if (c->top_k > 0 && c->top_k < st->n_finite) { /* 5. top-k: k-entry heap */
        n = select_best(x, nv, c->top_k, cd);
        for (int32_t i = 0; i < n; i++) z += exp(s * ((double)cd[i].x - xmax));
        *by_prob = true;
    } else { /* gather, dropping what top-p and min-p can never keep */
        double log_w = -INFINITY;
        if (c->min_p > 0) log_w = log((double)c->min_p);
        if (c->top_p < 1) {
            for (int32_t i = 0; i < nv; i++)
                if (x[i] > -INFINITY) z += exp(s * ((double)x[i] - xmax));
            double cut = log((1.0 - c->top_p) * z / st->n_finite);
            if (cut > log_w) log_w = cut;
        }
        for (int32_t i = 0; i < nv; i++) {
            if (!(x[i] > -INFINITY)) continue;
            if (s * ((double)x[i] - xmax) >= log_w) cd[n++] = (chain_cand){x[i], i};
        }
        if (c->top_p < 1) {
            qsort(cd, (size_t)n, sizeof *cd, cand_cmp);
            *by_prob = true;
        }
    }
    if (c->top_p < 1) { /* 6. top-p: the shortest best-first prefix with mass >= top_p */
        double cum = 0, target = (double)c->top_p * z;
        for (int32_t i = 0; i < n; i++) {
            cum += exp(s * ((double)cd[i].x - xmax));
            if (cum >= target) {
                n = i + 1;
                break;
            }
        }
    }
    if (c->min_p > 0) { /* 7. min-p: p_i >= min_p * p_max (the max always survives) */
        double log_mp = log((double)c->min_p);
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (s * ((double)cd[i].x - xmax) >= log_mp) cd[m++] = cd[i];
        n = m;
    }
    if (c->typical_p < 1 && n > 1) { /* 8. typical-p over the renormalized survivors */
        chain_key *k = ws->aux;
        double zc = 0, h = 0;
        for (int32_t i = 0; i < n; i++) zc += exp(s * ((double)cd[i].x - xmax));
        double lzc = log(zc);
        for (int32_t i = 0; i < n; i++) {
            double lq = s * ((double)cd[i].x - xmax) - lzc;
            h -= exp(lq) * lq;
        }
        for (int32_t i = 0; i < n; i++) {
            double lq = s * ((double)cd[i].x - xmax) - lzc;
            k[i] = (chain_key){fabs(-lq - h), cd[i].x, cd[i].id};
        }
        qsort(k, (size_t)n, sizeof *k, key_cmp);
        double cum = 0, target = (double)c->typical_p;
        int32_t m = n;
        for (int32_t i = 0; i < n; i++) {
            cum += exp(s * ((double)k[i].x - xmax) - lzc);
            if (cum >= target) {
                m = i + 1;
                break;
            }
        }
        for (int32_t i = 0; i < m; i++) cd[i] = (chain_cand){k[i].x, k[i].id};
        n = m;
        *by_prob = false;
    }
    return n;
}

loom_status loom_sample_chain_run(loom_sample_chain_ws *ws, const loom_sample_chain_config *c,
                                  const float *logits, const loom_token *history,
                                  int32_t n_history, uint64_t draw_index,
                                  loom_sample_chain_result *out) {
    LOOM_CHECK_ARG(ws != NULL && c != NULL && logits != NULL && out != NULL);
    LOOM_CHECK_ARG(n_history >= 0 && (n_history == 0 || history != NULL));
    LOOM_TRY(loom_sample_chain_validate(c, ws->n_vocab));
    LOOM_RETURN_IF(c->n_logprobs > 0 && (out->top_raw == NULL || out->top_final == NULL),
                   LOOM_ERR_INVALID_ARG,
                   "sample chain: n_logprobs %d needs top_raw and top_final buffers",
                   c->n_logprobs);
    const int32_t nv = ws->n_vocab;
    for (int32_t i = 0; i < n_history; i++)
        LOOM_RETURN_IF(history[i] < 0 || history[i] >= nv, LOOM_ERR_BAD_INPUT,
                       "sample chain: history token %d at %d out of range [0, %d)", history[i],
                       i, nv);

    /* 1-2. bias and penalties into ws->x */
    bool modified = false;
    LOOM_TRY(chain_prepare(ws, c, logits, history, n_history, &modified));

    /* One streaming pass: max, normalizer, entropy, varentropy of softmax(x). */
    loom__logit_stats st, raw;
    loom__logit_stats_compute(ws->x, nv, 1.0, &st);
    LOOM_RETURN_IF(st.n_finite == 0, LOOM_ERR_BAD_INPUT, "sample chain: no finite logit among %d",
                   nv);
    if (modified) loom__logit_stats_compute(logits, nv, 1.0, &raw);
    else raw = st;
    const double lse_raw = raw.n_finite > 0 ? raw.max + log(raw.sum) : INFINITY;
    out->entropy = st.entropy;
    out->varentropy = st.varentropy;

    /* Raw top-n (before any processing), using ws->cand as the heap. */
    out->n_top_raw = 0;
    if (c->n_logprobs > 0) {
        int32_t m = select_best(logits, nv, c->n_logprobs, ws->cand);
        for (int32_t i = 0; i < m; i++)
            out->top_raw[i] = (loom_sample_chain_logprob){
                ws->cand[i].id, (float)((double)ws->cand[i].x - lse_raw)};
        out->n_top_raw = m;
    }

    /* 3-4. correction and temperature as one scale s = 1 / T. */
    double t = chain_temperature(c, &st);
    loom_token tok;
    out->n_top_final = 0;
    if (t == 0) { /* greedy: a point mass on the arg max */
        tok = st.argmax;
        out->logprob_final = 0;
        out->entropy_final = 0;
        out->temperature = 0;
        out->n_candidates = 1;
        if (c->n_logprobs > 0) {
            out->top_final[0] = (loom_sample_chain_logprob){tok, 0.0f};
            out->n_top_final = 1;
        }
    } else {
        const double s = 1.0 / t, xmax = st.max;
        bool by_prob;
        int32_t n = chain_filter(ws, c, s, &st, &by_prob);
        chain_cand *cd = ws->cand;
        double zf = 0;
        for (int32_t i = 0; i < n; i++) zf += exp(s * ((double)cd[i].x - xmax));
        const double lzf = log(zf);
        /* 9. draw: inverse CDF in candidate order (a deterministic order). */
        double u = loom__rng_uniform(c->seed, draw_index) * zf, cum = 0;
        int32_t pick = n - 1;
        for (int32_t i = 0; i < n; i++) {
            cum += exp(s * ((double)cd[i].x - xmax));
            if (u < cum) {
                pick = i;
                break;
            }
        }
        tok = cd[pick].id;
        out->logprob_final = (float)(s * ((double)cd[pick].x - xmax) - lzf);
        double hf = 0;
        for (int32_t i = 0; i < n; i++) {
            double lq = s * ((double)cd[i].x - xmax) - lzf;
            hf -= exp(lq) * lq;
        }
        out->entropy_final = hf > 0 ? hf : 0;
        out->temperature = t;
        out->n_candidates = n;
        if (c->n_logprobs > 0) {
            int32_t m = n < c->n_logprobs ? n : c->n_logprobs;
            const chain_cand *best = cd;
            if (!by_prob) { /* n-entry heap over the survivors */
                chain_cand *h = ws->aux;
                int32_t held = 0;
                for (int32_t i = 0; i < n; i++) heap_offer(h, &held, m, cd[i]);
                qsort(h, (size_t)held, sizeof *h, cand_cmp);
                best = h;
            }
            for (int32_t i = 0; i < m; i++)
                out->top_final[i] = (loom_sample_chain_logprob){
                    best[i].id, (float)(s * ((double)best[i].x - xmax) - lzf)};
            out->n_top_final = m;
        }
    }
    out->token = tok;
    out->logprob_raw = (float)((double)logits[tok] - lse_raw);
    return LOOM_OK;
}
