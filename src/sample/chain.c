/* chain.c — the sampler chain: bias → penalties → entropy correction → temperature → top-k →
 * top-p → min-p → typical-p → draw, with logprobs (the order and the modes are documented in
 * chain.h). All scratch lives in a caller-owned workspace. */
#include "sample/chain.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "sample/entropy.h"
#include "sample/rng.h"
#include "sample/vexp.h"

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

struct loom__sample_chain_ws {
    int32_t n_vocab;
    float *x;          /* [n_vocab] logits after bias and penalties */
    chain_cand *cand;  /* [n_vocab] candidates (also the raw top-n heap before filtering) */
    void *aux;         /* [n_vocab] chain_key, or chain_cand for the final top-n heap */
    int32_t *counts;   /* [n_vocab] penalty counts; all zero between calls */
    float *bmax_raw;   /* [n_blocks] largest finite raw logit of each CHAIN_BLOCK entries */
    float *bmax_x;     /* [n_blocks] the same of x where bias or penalties edited it */
    const float *bmax; /* this call's block maxima of x: bmax_raw, or bmax_x after edits */
    int32_t n_blocks;
};

#define CHAIN_BLOCK 64 /* entries per block of the vocabulary sweeps (below) */

#define CHAIN_ALIGN 16

static size_t align_up(size_t v) { return (v + CHAIN_ALIGN - 1) & ~(size_t)(CHAIN_ALIGN - 1); }

size_t loom__sample_chain_workspace_size(int32_t n_vocab) {
    if (n_vocab <= 0 || (uint64_t)n_vocab > SIZE_MAX / 64) return 0;
    size_t n = (size_t)n_vocab, nb = (n + CHAIN_BLOCK - 1) / CHAIN_BLOCK;
    return align_up(sizeof(loom__sample_chain_ws)) + align_up(n * sizeof(float)) +
           align_up(n * sizeof(chain_cand)) + align_up(n * sizeof(chain_key)) +
           align_up(n * sizeof(int32_t)) + 2 * align_up(nb * sizeof(float));
}

loom_status loom__sample_chain_workspace_init(void *mem, size_t size, int32_t n_vocab,
                                             loom__sample_chain_ws **out) {
    LOOM_CHECK_ARG(mem != NULL && out != NULL && n_vocab > 0);
    LOOM_RETURN_IF(((uintptr_t)mem % CHAIN_ALIGN) != 0, LOOM_ERR_INVALID_ARG,
                   "sample chain: workspace must be %d-byte aligned", CHAIN_ALIGN);
    size_t need = loom__sample_chain_workspace_size(n_vocab);
    LOOM_RETURN_IF(need == 0, LOOM_ERR_INVALID_ARG, "sample chain: n_vocab %d too large",
                   n_vocab);
    LOOM_RETURN_IF(size < need, LOOM_ERR_BUFFER_TOO_SMALL,
                   "sample chain: workspace of %zu bytes, %zu needed", size, need);
    size_t n = (size_t)n_vocab;
    char *p = mem;
    loom__sample_chain_ws *ws = (loom__sample_chain_ws *)(void *)p;
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

/* ---- vocabulary sweeps ------------------------------------------------------------------ */
/* A 262,144-token vocabulary makes every per-token operation count: the copy of the logits
 * records each block's maximum, so later sweeps skip blocks that cannot matter, and
 * exponentials are taken a vector at a time (vexp.h). */

/* Largest finite entry of x[0..n) (-inf when none), n <= CHAIN_BLOCK. */
static float block_max(const float *x, int32_t n) {
    float r = -INFINITY;
    int32_t i = 0;
    if (n == CHAIN_BLOCK) {
        loom__v8f m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                       -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        for (; i < CHAIN_BLOCK; i += 8) {
            loom__v8f v;
            memcpy(&v, x + i, sizeof v);
            loom__v8i gt = v > m; /* false for NaN */
            m = (loom__v8f)(((loom__v8i)v & gt) | ((loom__v8i)m & ~gt));
        }
        for (int j = 0; j < 8; j++) r = m[j] > r ? m[j] : r;
    }
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* w[j] = e^(s (xs[j] - xmax)) for j < 8 where xs[j] is finite, else 0 (xmax >= every xs[j]). */
static inline void exp8_shifted(const float *xs, double s, double xmax, double *w) {
    for (int h = 0; h < 8; h += LOOM__VL) {
        loom__vf v;
        memcpy(&v, xs + h, sizeof v);
        const loom__vd d = (__builtin_convertvector(v, loom__vd) - xmax) * s; /* -inf stays */
        loom__vd dz, e;
        loom__vl keep;
        loom__vexp_split(&d, &dz, &keep);
        loom__vexp(&e, &dz, &keep);
        memcpy(w + h, &e, sizeof e);
    }
}

/* w[i] = e^(s (cd[i].x - xmax)) for the candidates cd[0..n) (all finite). */
static void exp_cands(const chain_cand *cd, int32_t n, double s, double xmax, double *w) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float xs[8];
        for (int j = 0; j < 8; j++) xs[j] = cd[i + j].x;
        exp8_shifted(xs, s, xmax, w + i);
    }
    if (i < n) {
        float xs[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                       -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        double e[8];
        for (int32_t j = 0; j < n - i; j++) xs[j] = cd[i + j].x;
        exp8_shifted(xs, s, xmax, e);
        memcpy(w + i, e, (size_t)(n - i) * sizeof *w);
    }
}

/* The k best finite entries of x[0..n) into h, best first; returns how many. bmax holds the
 * maximum of each block of x. Once the heap is full, a block whose maximum does not beat the
 * heap's worst is skipped: its entries could only tie it with a higher id, which ranks lower. */
static int32_t select_best(const float *x, const float *bmax, int32_t n, int32_t k, chain_cand *h) {
    int32_t held = 0;
    for (int32_t b = 0; b < n; b += CHAIN_BLOCK) {
        int32_t e = n - b < CHAIN_BLOCK ? n : b + CHAIN_BLOCK;
        if (held == k && !(bmax[b / CHAIN_BLOCK] > h[0].x)) continue;
        for (int32_t i = b; i < e; i++) {
            if (!(x[i] > -INFINITY) || (held == k && x[i] < h[0].x)) continue;
            heap_offer(h, &held, k, (chain_cand){x[i], i});
        }
    }
    qsort(h, (size_t)held, sizeof *h, cand_cmp);
    return held;
}

/* A key whose ascending unsigned order is the descending order of the logit (-0 and +0
 * equal, as cand_cmp holds them). */
static inline uint32_t desc_key(float x) {
    float f = x + 0.0f; /* -0 becomes +0 */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u ^= (u >> 31) ? 0xFFFFFFFFu : 0x80000000u; /* ascending as unsigned */
    return ~u;
}

/* Sorts cd[0..n), which must arrive in increasing id order, best first (cand_cmp's order):
 * a stable LSD radix sort on desc_key, so equal logits keep lower ids first. tmp holds n
 * entries. Small sets go to qsort. */
static void sort_cands(chain_cand *cd, int32_t n, chain_cand *tmp) {
    if (n < 256) {
        qsort(cd, (size_t)n, sizeof *cd, cand_cmp);
        return;
    }
    chain_cand *src = cd, *dst = tmp;
    for (int shift = 0; shift < 32; shift += 8) { /* four passes: the result ends in cd */
        size_t count[257] = {0};
        for (int32_t i = 0; i < n; i++) count[(desc_key(src[i].x) >> shift & 0xFF) + 1]++;
        for (int j = 0; j < 256; j++) count[j + 1] += count[j];
        for (int32_t i = 0; i < n; i++) dst[count[desc_key(src[i].x) >> shift & 0xFF]++] = src[i];
        chain_cand *t = src;
        src = dst;
        dst = t;
    }
}

static int key_cmp(const void *a, const void *b) {
    const chain_key *p = a, *q = b;
    if (p->key != q->key) return p->key < q->key ? -1 : 1;
    if (p->x != q->x) return p->x > q->x ? -1 : 1;
    return (p->id > q->id) - (p->id < q->id);
}

/* ---- the chain -------------------------------------------------------------------------- */

/* Copies logits, applies bias and penalties. Returns BAD_INPUT on +inf. */
/* What the copy of the logits learned, so that no later sweep has to look for it again. */
typedef struct chain_scan {
    float xmax;       /* largest finite x (-inf when none) */
    int32_t n_finite; /* finite entries of x */
    float raw_max;    /* largest finite raw logit (-inf when none) */
} chain_scan;

/* Copies the logits into x with NaN as -inf, a block at a time: each block's maximum goes to
 * ws->bmax_raw, finite entries are counted, and +inf is only noted (no early exit, so the loop
 * vectorizes). Returns whether some logit is +inf. */
static bool copy_scan(loom__sample_chain_ws *ws, const float *logits, int32_t *n_finite) {
    const int32_t n = ws->n_vocab;
    float *x = ws->x;
    const loom__v8f ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                            -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    loom__v8i any_pinf = {0}, cnt = {0};
    int32_t b = 0;
    for (; (b + 1) * CHAIN_BLOCK <= n; b++) {
        loom__v8f m = ninf;
        for (int32_t i = b * CHAIN_BLOCK; i < (b + 1) * CHAIN_BLOCK; i += 8) {
            loom__v8f v;
            memcpy(&v, logits + i, sizeof v);
            loom__v8i num = v == v;
            any_pinf |= v == -ninf;
            v = (loom__v8f)(((loom__v8i)v & num) | ((loom__v8i)ninf & ~num));
            memcpy(x + i, &v, sizeof v);
            cnt -= v > ninf; /* true is -1 */
            loom__v8i gt = v > m;
            m = (loom__v8f)(((loom__v8i)v & gt) | ((loom__v8i)m & ~gt));
        }
        float r = m[0];
        for (int j = 1; j < 8; j++) r = m[j] > r ? m[j] : r;
        ws->bmax_raw[b] = r;
    }
    bool pinf = false;
    int32_t c = 0;
    for (int j = 0; j < 8; j++) {
        pinf |= any_pinf[j] != 0;
        c += cnt[j];
    }
    if (b * CHAIN_BLOCK < n) { /* the last, partial block */
        float r = -INFINITY;
        for (int32_t i = b * CHAIN_BLOCK; i < n; i++) {
            float v = logits[i];
            pinf |= v == INFINITY;
            x[i] = v != v ? -INFINITY : v;
            c += x[i] > -INFINITY;
            r = x[i] > r ? x[i] : r;
        }
        ws->bmax_raw[b] = r;
    }
    *n_finite = c;
    return pinf;
}

/* One edit of x[t] (bias or penalty): keeps the finite count, and x's block maxima in
 * ws->bmax_x (a copy of bmax_raw made before the first edit) up to date. */
static void edited(loom__sample_chain_ws *ws, loom_token t, bool was_finite, int32_t *n_finite) {
    *n_finite += (ws->x[t] > -INFINITY) - was_finite;
    int32_t b = t / CHAIN_BLOCK, e = (b + 1) * CHAIN_BLOCK;
    ws->bmax_x[b] = block_max(ws->x + (size_t)b * CHAIN_BLOCK,
                              (e < ws->n_vocab ? e : ws->n_vocab) - b * CHAIN_BLOCK);
}

/* Copies logits, applies bias and penalties; fills *scan and ws->bmax. Returns BAD_INPUT on
 * +inf. */
static loom_status chain_prepare(loom__sample_chain_ws *ws, const loom__sample_chain_config *c,
                                 const float *logits, const loom_token *hist, int32_t n_hist,
                                 bool *modified, chain_scan *scan) {
    const int32_t n = ws->n_vocab;
    float *x = ws->x;
    int32_t n_finite = 0;
    if (copy_scan(ws, logits, &n_finite)) {
        for (int32_t i = 0; i < n; i++)
            LOOM_RETURN_IF(logits[i] == INFINITY, LOOM_ERR_BAD_INPUT,
                           "sample chain: logit %d is +inf", i);
    }
    bool penalize = c->penalty_last_n != 0 && n_hist > 0 &&
                    (c->repeat_penalty != 1 || c->presence_penalty != 0 ||
                     c->frequency_penalty != 0);
    *modified = c->n_bias > 0 || penalize;
    ws->bmax = ws->bmax_raw;
    if (*modified) {
        memcpy(ws->bmax_x, ws->bmax_raw, (size_t)ws->n_blocks * sizeof *ws->bmax_x);
        ws->bmax = ws->bmax_x;
    }
    for (int32_t i = 0; i < c->n_bias; i++) {
        loom_token t = c->bias[i].id;
        bool was = x[t] > -INFINITY;
        x[t] += c->bias[i].bias;
        edited(ws, t, was, &n_finite);
    }
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
            bool was = v > -INFINITY;
            v = v > 0 ? v / c->repeat_penalty : v * c->repeat_penalty;
            v -= c->presence_penalty + (float)cnt * c->frequency_penalty;
            x[t] = v;
            edited(ws, t, was, &n_finite);
        }
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
    scan->n_finite = n_finite;
    scan->xmax = scan->raw_max = -INFINITY;
    for (int32_t b = 0; b < ws->n_blocks; b++) {
        scan->xmax = ws->bmax[b] > scan->xmax ? ws->bmax[b] : scan->xmax;
        scan->raw_max = ws->bmax_raw[b] > scan->raw_max ? ws->bmax_raw[b] : scan->raw_max;
    }
    return LOOM_OK;
}

/* The effective temperature from the mode (0 = greedy). */
static double chain_temperature(const loom__sample_chain_config *c, const loom__logit_stats *st) {
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

/* ---- top-p without top-k ----------------------------------------------------------------- */
/* The nucleus (the shortest best-first prefix of the tokens with mass >= top_p) without
 * sorting the vocabulary: one pass sums the normalizer z of the weights w = e^d,
 * d = s (x - xmax), and puts the weight of each token that can be in a nucleus into one of
 * CHAIN_BUCKETS buckets of equal width in d over [-CHAIN_SPAN, 0], best first; the bucket
 * where the running mass reaches top_p z is the only one sorted. A token can be in a nucleus
 * only if d >= cut = ln((1 - top_p) / n_finite): all tokens below weigh at most 1 - top_p in
 * total, and z >= 1 (the maximum weighs 1), so the better ones already hold top_p z. The cut
 * is above -CHAIN_SPAN for any top_p < 1 as a float and up to 2^31 tokens. Tokens below it
 * count in z only; most vectors of a peaked distribution have none above it and skip the
 * bucket bookkeeping. */

#define CHAIN_BUCKETS 4096
#define CHAIN_SPAN    40.0

/* d and bucket of LOOM__VL entries x[0..LOOM__VL): *dz and *keep as loom__vexp_split gives
 * them, *in where d >= cut, *bucket valid there. One definition for every use, so they
 * bucket each token the same way. */
static inline void bucket_lanes(const float *x, double s, double xmax, double cut, loom__vd *dz,
                                loom__vl *keep, loom__vl *in, loom__vi *bucket) {
    loom__vf v;
    memcpy(&v, x, sizeof v);
    const loom__vd d = (__builtin_convertvector(v, loom__vd) - xmax) * s; /* -inf stays */
    loom__vexp_split(&d, dz, keep);
    *in = d >= cut;
    const loom__vd scaled = *dz * (-CHAIN_BUCKETS / CHAIN_SPAN); /* in [0, CHAIN_BUCKETS] */
    loom__vi bi = __builtin_convertvector(scaled, loom__vi);
    const loom__vi top = (loom__vi){0} + (CHAIN_BUCKETS - 1);
    const loom__vi over = bi > top;
    *bucket = (bi & ~over) | (top & over);
}

/* The bucket of one logit, by bucket_lanes' arithmetic (CHAIN_BUCKETS + 1 below the cut). */
static int32_t bucket_of(float v, double s, double xmax, double cut) {
    float lanes[LOOM__VL];
    for (int j = 0; j < LOOM__VL; j++) lanes[j] = v;
    loom__vd dz;
    loom__vl keep, in;
    loom__vi bucket;
    bucket_lanes(lanes, s, xmax, cut, &dz, &keep, &in, &bucket);
    return in[0] ? bucket[0] : CHAIN_BUCKETS + 1;
}

/* The lowest finite float whose bucket is <= last (+inf when last < 0: no finite logit; the
 * maximum's bucket is 0, and buckets grow as x falls): a bisection over the floats in
 * [-FLT_MAX, xmax], ordered by desc_key. */
static float lowest_in(double s, double xmax, double cut, int32_t last) {
    if (last < 0) return INFINITY;
    uint32_t good = desc_key((float)xmax), bad = desc_key(-FLT_MAX); /* good: in; bad: maybe */
    if (bucket_of(-FLT_MAX, s, xmax, cut) <= last) return -FLT_MAX;
    while (bad - good > 1) {
        uint32_t mid = good + (bad - good) / 2;
        uint32_t u = ~mid; /* back from the key to the float */
        u ^= (u >> 31) ? 0x80000000u : 0xFFFFFFFFu;
        float f;
        memcpy(&f, &u, sizeof f);
        if (bucket_of(f, s, xmax, cut) <= last) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    uint32_t u = ~good;
    u ^= (u >> 31) ? 0x80000000u : 0xFFFFFFFFu;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Keeps the nucleus of top_p in ws->cand (tokens of the buckets before the edge in id order,
 * then the edge bucket's in rank order); returns its size. */
static int32_t nucleus(loom__sample_chain_ws *ws, double s, double xmax, double top_p,
                       int32_t n_finite) {
    enum { L = LOOM__VL };
    const int32_t nv = ws->n_vocab;
    const float *x = ws->x;
    double cut = log((1.0 - top_p) / n_finite);
    cut = cut > -CHAIN_SPAN ? cut : -CHAIN_SPAN;
    /* Lanes below the cut go, without a branch, to a spare bucket of their own, so that
     * neither a mispredicted jump nor a chain of additions to one address slows the pass. */
    double mass[CHAIN_BUCKETS + L] = {0};
    loom__vd zl[2] = {{0}, {0}};
    for (int32_t i = 0; i < nv; i += 2 * L) { /* two vectors a step, for overlap */
        float pad[2 * L];
        const float *p = x + i;
        if (nv - i < 2 * L) { /* the tail, padded with -inf */
            for (int j = 0; j < 2 * L; j++) pad[j] = i + j < nv ? x[i + j] : -INFINITY;
            p = pad;
        }
        for (int h = 0; h < 2; h++) {
            loom__vd dz, e;
            loom__vl keep, in;
            loom__vi bucket;
            bucket_lanes(p + h * L, s, xmax, cut, &dz, &keep, &in, &bucket);
            loom__vexp(&e, &dz, &keep);
            zl[h] += e;
            int64_t any = 0;
            for (int j = 0; j < L; j++) any |= in[j];
            if (!any) continue;
            for (int j = 0; j < L; j++) mass[in[j] ? bucket[j] : CHAIN_BUCKETS + j] += e[j];
        }
    }
    double z = 0;
    for (int j = 0; j < L; j++) z += zl[0][j] + zl[1][j];
    const double target = top_p * z;
    double cum = 0;
    int32_t edge = 0;
    while (edge < CHAIN_BUCKETS && cum + mass[edge] < target) cum += mass[edge++];

    /* Gather: better buckets into cand, the edge bucket aside. As the bucket is monotone in
     * x, "bucket < edge" and "bucket <= edge" are x >= two float thresholds (found once by
     * bisection with the same arithmetic), and blocks whose maximum is below both hold
     * nothing. */
    chain_cand *cd = ws->cand, *side = ws->aux, *tmp = side + nv;
    int32_t n = 0, m = 0;
    const float f_in = edge == CHAIN_BUCKETS ? -FLT_MAX : lowest_in(s, xmax, cut, edge - 1);
    const float f_edge = edge == CHAIN_BUCKETS ? -FLT_MAX : lowest_in(s, xmax, cut, edge);
    for (int32_t b = 0; b < ws->n_blocks; b++) {
        if (!(ws->bmax[b] >= f_edge)) continue;
        int32_t e = (b + 1) * CHAIN_BLOCK < nv ? (b + 1) * CHAIN_BLOCK : nv;
        for (int32_t k = b * CHAIN_BLOCK; k < e; k++) {
            const float v = x[k];
            if (v >= f_in) {
                cd[n++] = (chain_cand){v, k};
            } else if (v >= f_edge) {
                side[m++] = (chain_cand){v, k};
            }
        }
    }
    if (m > 0) { /* the edge bucket, best first, up to where the mass reaches the target */
        sort_cands(side, m, tmp);
        for (int32_t k = 0; k < m; k += 8) {
            double w[8];
            int32_t r = m - k < 8 ? m - k : 8, j = 0;
            exp_cands(side + k, r, s, xmax, w);
            while (j < r && (cum += w[j]) < target) j++;
            if (j < r) {
                m = k + j + 1;
                break;
            }
        }
        memcpy(cd + n, side, (size_t)m * sizeof *cd);
        n += m;
    }
    return n;
}

/* Steps 5-8 on the scaled distribution w = exp(s (x - xmax)); leaves survivors in ws->cand and
 * returns their count; *by_prob says whether they are sorted best first. */
static int32_t chain_filter(loom__sample_chain_ws *ws, const loom__sample_chain_config *c,
                            double s, const loom__logit_stats *st, bool *by_prob) {
    const int32_t nv = ws->n_vocab;
    const float *x = ws->x;
    chain_cand *cd = ws->cand;
    const double xmax = st->max;
    int32_t n = 0;
    double z = 0; /* mass of the set top-p is measured against */
    *by_prob = false;

    if (c->top_k > 0 && c->top_k < st->n_finite) { /* 5. top-k: k-entry heap */
        n = select_best(x, ws->bmax, nv, c->top_k, cd);
        double *w = ws->aux;
        exp_cands(cd, n, s, xmax, w);
        for (int32_t i = 0; i < n; i++) z += w[i];
        *by_prob = true;
    } else if (c->top_p < 1) { /* 6. top-p over the whole vocabulary */
        n = nucleus(ws, s, xmax, (double)c->top_p, st->n_finite);
    } else { /* gather, dropping what min-p can never keep */
        double log_w = -INFINITY;
        if (c->min_p > 0) log_w = log((double)c->min_p);
        /* Blocks whose maximum fails the cut hold no survivor (the test is monotone in x). */
        for (int32_t b = 0; b < nv; b += CHAIN_BLOCK) {
            int32_t e = nv - b < CHAIN_BLOCK ? nv : b + CHAIN_BLOCK;
            float bm = ws->bmax[b / CHAIN_BLOCK];
            if (!(bm > -INFINITY) || !(s * ((double)bm - xmax) >= log_w)) continue;
            for (int32_t i = b; i < e; i++) {
                if (!(x[i] > -INFINITY)) continue;
                if (s * ((double)x[i] - xmax) >= log_w) cd[n++] = (chain_cand){x[i], i};
            }
        }
    }
    if (c->top_p < 1 && *by_prob) { /* 6. top-p after top-k: the shortest best-first prefix with
                                       mass >= top_p */
        double cum = 0, target = (double)c->top_p * z;
        for (int32_t i = 0; i < n; i += 8) { /* eight exponentials at a time, summed in order */
            double w[8];
            int32_t m = n - i < 8 ? n - i : 8;
            exp_cands(cd + i, m, s, xmax, w);
            int32_t j = 0;
            while (j < m && (cum += w[j]) < target) j++;
            if (j < m) {
                n = i + j + 1;
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

/* log-sum-exp of the raw logits, given the pass over the processed ones: the entries that bias
 * and penalties left alone were summed there (same, relative to st->max); the few they changed
 * (found among the bias ids and the history, each once) are added here. A positive bias large
 * enough to underflow the untouched entries' weights falls back to a full pass. */
static double raw_lse(loom__sample_chain_ws *ws, const loom__sample_chain_config *c,
                      const float *logits, const loom_token *hist, int32_t n_hist,
                      const loom__logit_stats *st, double same, float raw_max) {
    if (!(raw_max > -INFINITY)) return INFINITY;
    const double mr = raw_max;
    if (st->max - mr > 500) {
        loom__logit_stats raw;
        loom__logit_stats_compute(logits, ws->n_vocab, 1.0, &raw);
        return raw.max + log(raw.sum);
    }
    double sum = same * exp(st->max - mr);
    const float *x = ws->x;
    int32_t *seen = ws->counts; /* all zero between calls; reset below */
    for (int32_t pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < c->n_bias + n_hist; i++) {
            loom_token t = i < c->n_bias ? c->bias[i].id : hist[i - c->n_bias];
            if (pass == 1) {
                seen[t] = 0;
                continue;
            }
            if (seen[t]) continue;
            seen[t] = 1;
            /* the pass summed x_t where x_t == raw_t; otherwise raw_t is added here */
            if (!(x[t] > -INFINITY && x[t] == logits[t]) && logits[t] > -INFINITY)
                sum += exp((double)logits[t] - mr);
        }
    }
    return mr + log(sum);
}

loom_status loom__sample_chain_run(loom__sample_chain_ws *ws, const loom__sample_chain_config *c,
                                  const float *logits, const loom_token *history,
                                  int32_t n_history, uint64_t draw_index,
                                  loom__sample_chain_result *out) {
    LOOM_CHECK_ARG(ws != NULL && c != NULL && logits != NULL && out != NULL);
    LOOM_CHECK_ARG(n_history >= 0 && (n_history == 0 || history != NULL));
    LOOM_TRY(loom__sample_chain_validate(c, ws->n_vocab));
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
    chain_scan scan;
    LOOM_TRY(chain_prepare(ws, c, logits, history, n_history, &modified, &scan));
    LOOM_RETURN_IF(scan.n_finite == 0, LOOM_ERR_BAD_INPUT, "sample chain: no finite logit among %d",
                   nv);

    /* One pass: normalizer, entropy, varentropy of softmax(x) (and what raw_lse needs). */
    loom__logit_stats st;
    double same = 0;
    loom__logit_stats_known(ws->x, modified ? logits : NULL, nv, scan.xmax, scan.n_finite, &st,
                            &same);
    const double lse_raw = modified
                               ? raw_lse(ws, c, logits, history, n_history, &st, same, scan.raw_max)
                               : st.max + log(st.sum);
    out->entropy = st.entropy;
    out->varentropy = st.varentropy;

    /* Raw top-n (before any processing), using ws->cand as the heap. */
    out->n_top_raw = 0;
    if (c->n_logprobs > 0) {
        int32_t m = select_best(logits, ws->bmax_raw, nv, c->n_logprobs, ws->cand);
        for (int32_t i = 0; i < m; i++)
            out->top_raw[i] = (loom__sample_chain_logprob){
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
            out->top_final[0] = (loom__sample_chain_logprob){tok, 0.0f};
            out->n_top_final = 1;
        }
    } else {
        const double s = 1.0 / t, xmax = st.max;
        bool by_prob;
        int32_t n = chain_filter(ws, c, s, &st, &by_prob);
        chain_cand *cd = ws->cand;
        double *w = ws->aux; /* the survivors' weights, computed once */
        exp_cands(cd, n, s, xmax, w);
        double zf = 0;
        for (int32_t i = 0; i < n; i++) zf += w[i];
        const double lzf = log(zf);
        /* 9. draw: inverse CDF in candidate order (a deterministic order). */
        double u = loom__rng_uniform(c->seed, draw_index) * zf, cum = 0;
        int32_t pick = n - 1;
        for (int32_t i = 0; i < n; i++) {
            cum += w[i];
            if (u < cum) {
                pick = i;
                break;
            }
        }
        tok = cd[pick].id;
        out->logprob_final = (float)(s * ((double)cd[pick].x - xmax) - lzf);
        double hf = 0, izf = 1.0 / zf;
        for (int32_t i = 0; i < n; i++) {
            double lq = s * ((double)cd[i].x - xmax) - lzf;
            hf -= w[i] * izf * lq;
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
                for (int32_t i = 0; i < n; i++)
                    if (held < m || !(cd[i].x < h[0].x)) heap_offer(h, &held, m, cd[i]);
                qsort(h, (size_t)held, sizeof *h, cand_cmp);
                best = h;
            }
            for (int32_t i = 0; i < m; i++)
                out->top_final[i] = (loom__sample_chain_logprob){
                    best[i].id, (float)(s * ((double)best[i].x - xmax) - lzf)};
            out->n_top_final = m;
        }
    }
    out->token = tok;
    out->logprob_raw = (float)((double)logits[tok] - lse_raw);
    return LOOM_OK;
}
