/* serve_workload.c — the seeded synthetic workload of loom-serve-bench.
 *
 * Every request i draws its attributes from its own random stream, keyed by (seed, i), in a
 * fixed order: arrival gap, prompt length, output length, shared-prefix flag, class, token
 * seed. So the same seed gives the same requests at any rate (the Poisson gaps are exponential
 * draws divided by the rate), and the priority and FCFS runs see identical requests.
 *
 * A prompt is BOS (when the model has one), then — for a shared-prefix request — the shared
 * prefix (prefix_len tokens drawn once from the seed, the "system prompt"), then the request's
 * own tokens (the drawn prompt length). Token ids are uniform over [3, n_vocab): no tokenizer
 * is involved, and requests are submitted with ignore_eos so each generates exactly its drawn
 * output length. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

/* ---- random numbers ------------------------------------------------------------------------ */

/* splitmix64: a counter-based stream, good enough for workload draws. */
typedef struct serve_rng {
    uint64_t state;
} serve_rng;

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rng_next(serve_rng *r) {
    r->state += 0x9E3779B97F4A7C15ull;
    return mix64(r->state);
}

/* Uniform in [0, 1). */
static double rng_uniform(serve_rng *r) {
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static serve_rng rng_for(uint64_t seed, uint64_t stream) {
    serve_rng r = {mix64(seed ^ mix64(stream + 0x632BE59BD9B4E019ull))};
    return r;
}

/* Standard normal (Box-Muller; one of the pair). */
static double rng_normal(serve_rng *r) {
    double u1 = 1.0 - rng_uniform(r); /* (0, 1] */
    double u2 = rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- length distributions ------------------------------------------------------------------ */

static int32_t dist_draw(const serve_dist *d, serve_rng *r) {
    double x;
    switch (d->kind) {
    case SERVE_DIST_FIXED:
        (void)rng_normal(r); /* keep the stream aligned whatever the kind */
        return d->lo;
    case SERVE_DIST_UNIFORM:
        x = rng_uniform(r);
        (void)rng_uniform(r);
        return d->lo + (int32_t)(x * (double)(d->hi - d->lo + 1));
    case SERVE_DIST_LOGNORMAL:
    default:
        x = floor(exp(log(d->median) + d->sigma * rng_normal(r)) + 0.5);
        if (x < d->lo) x = d->lo;
        if (x > d->hi) x = d->hi;
        return (int32_t)x;
    }
}

static bool parse_int(const char *s, char **end, int32_t *out) {
    long v = strtol(s, end, 10);
    if (*end == s || v < 1 || v > (1L << 24)) return false;
    *out = (int32_t)v;
    return true;
}

bool serve_dist_parse(const char *spec, serve_dist *out) {
    serve_dist d;
    memset(&d, 0, sizeof d);
    char *end = NULL;
    if (strncmp(spec, "fixed:", 6) == 0) spec += 6;
    if (strncmp(spec, "uniform:", 8) == 0) {
        d.kind = SERVE_DIST_UNIFORM;
        if (!parse_int(spec + 8, &end, &d.lo) || *end != ':') return false;
        if (!parse_int(end + 1, &end, &d.hi) || *end || d.hi < d.lo) return false;
    } else if (strncmp(spec, "lognormal:", 10) == 0) {
        d.kind = SERVE_DIST_LOGNORMAL;
        d.median = strtod(spec + 10, &end);
        if (end == spec + 10 || *end != ':' || !(d.median >= 1)) return false;
        const char *s = end + 1;
        d.sigma = strtod(s, &end);
        if (end == s || !(d.sigma >= 0 && d.sigma <= 4)) return false;
        d.lo = 1;
        d.hi = (int32_t)(8 * d.median);
        if (*end == ':') {
            if (!parse_int(end + 1, &end, &d.lo) || *end != ':') return false;
            if (!parse_int(end + 1, &end, &d.hi) || d.hi < d.lo) return false;
        }
        if (*end) return false;
    } else {
        d.kind = SERVE_DIST_FIXED;
        if (!parse_int(spec, &end, &d.lo) || *end) return false;
        d.hi = d.lo;
    }
    *out = d;
    return true;
}

void serve_dist_format(const serve_dist *d, char *buf, size_t cap) {
    switch (d->kind) {
    case SERVE_DIST_FIXED:
        snprintf(buf, cap, "fixed:%d", d->lo);
        break;
    case SERVE_DIST_UNIFORM:
        snprintf(buf, cap, "uniform:%d:%d", d->lo, d->hi);
        break;
    case SERVE_DIST_LOGNORMAL:
    default:
        snprintf(buf, cap, "lognormal:%g:%g:%d:%d", d->median, d->sigma, d->lo, d->hi);
        break;
    }
}

/* ---- the workload -------------------------------------------------------------------------- */

#define SERVE_FIRST_TOKEN 3 /* drawn ids start here: past the usual pad/eos/bos/unk */

static loom_token draw_token(serve_rng *r, int32_t n_vocab) {
    int32_t lo = n_vocab > SERVE_FIRST_TOKEN ? SERVE_FIRST_TOKEN : 0;
    return lo + (loom_token)(rng_next(r) % (uint64_t)(n_vocab - lo));
}

int32_t serve_workload_max_len(const serve_config *cfg, int32_t n_head) {
    int32_t prefix = cfg->shared_prefix_frac > 0 ? cfg->prefix_len : 0;
    return n_head + prefix + cfg->prompt_len.hi + cfg->output_len.hi;
}

bool serve_workload_make(const serve_config *cfg, const loom_model_info *info, int32_t max_ctx,
                         double rate, int32_t n, double duration_s, serve_workload *out) {
    memset(out, 0, sizeof *out);
    if (rate <= 0 && n <= 0) return false; /* a burst needs a request count */
    out->n_vocab = info->n_vocab;
    out->n_head = info->bos >= 0 ? 1 : 0;
    out->n_prefix = out->n_head + cfg->prefix_len;
    out->prefix = malloc((size_t)(out->n_prefix > 0 ? out->n_prefix : 1) * sizeof *out->prefix);
    if (!out->prefix) return false;
    if (out->n_head) out->prefix[0] = info->bos;
    serve_rng pr = rng_for(cfg->seed, UINT64_MAX); /* the shared prefix's own stream */
    for (int32_t k = out->n_head; k < out->n_prefix; k++) {
        out->prefix[k] = draw_token(&pr, info->n_vocab);
    }

    size_t cap = n > 0 ? (size_t)n : 64;
    out->reqs = malloc(cap * sizeof *out->reqs);
    if (!out->reqs) return false;
    double t = 0;
    for (uint64_t i = 0;; i++) {
        serve_rng r = rng_for(cfg->seed, i);
        double gap = -log(1.0 - rng_uniform(&r));
        if (rate > 0) t += gap / rate;
        if (n > 0 ? i >= (uint64_t)n : t > duration_s) break;
        if (out->n == cap) {
            cap *= 2;
            serve_request *grown = realloc(out->reqs, cap * sizeof *grown);
            if (!grown) return false;
            out->reqs = grown;
        }
        serve_request *q = &out->reqs[out->n++];
        q->arrival_s = rate > 0 ? t : 0;
        q->n_own = dist_draw(&cfg->prompt_len, &r);
        q->max_tokens = dist_draw(&cfg->output_len, &r);
        q->shared = rng_uniform(&r) < cfg->shared_prefix_frac;
        q->cls = rng_uniform(&r) < cfg->high_frac ? SERVE_CLASS_HIGH : SERVE_CLASS_BEST_EFFORT;
        q->token_seed = rng_next(&r);
        /* Fit the context: shorten the own tokens first, then the output. */
        int32_t fixed = q->shared ? out->n_prefix : out->n_head;
        if (fixed + q->n_own + q->max_tokens > max_ctx) {
            out->n_clamped++;
            int32_t own = max_ctx - fixed - q->max_tokens;
            q->n_own = own >= 1 ? own : 1;
            if (fixed + q->n_own + q->max_tokens > max_ctx) {
                q->max_tokens = max_ctx - fixed - q->n_own;
                if (q->max_tokens < 1) q->max_tokens = 1; /* submit will refuse it */
            }
        }
        q->n_prompt = fixed + q->n_own;
    }
    return true;
}

void serve_workload_free(serve_workload *w) {
    free(w->reqs);
    free(w->prefix);
    memset(w, 0, sizeof *w);
}

void serve_workload_prompt(const serve_workload *w, const serve_request *r, loom_token *out) {
    int32_t fixed = r->shared ? w->n_prefix : w->n_head;
    memcpy(out, w->prefix, (size_t)fixed * sizeof *out);
    serve_rng tr = {r->token_seed};
    for (int32_t k = 0; k < r->n_own; k++) out[fixed + k] = draw_token(&tr, w->n_vocab);
}

loom_engine_params serve_engine_params(const serve_config *c, const loom_model_info *mi) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = c->kv_bytes;
    if (c->max_seqs) ep.max_seqs = c->max_seqs;
    if (c->max_batched_tokens) ep.max_batched_tokens = c->max_batched_tokens;
    if (c->block_size) ep.block_size = c->block_size;
    ep.prefix_cache = !c->no_prefix_cache;
    /* The longest request the distributions can draw, within the model's context. */
    int32_t model_ctx = mi->n_ctx_train < 8192 ? mi->n_ctx_train : 8192;
    int32_t longest = serve_workload_max_len(c, mi->bos >= 0 ? 1 : 0);
    ep.max_ctx = c->max_ctx ? c->max_ctx : (longest < model_ctx ? longest : model_ctx);
    return ep;
}
