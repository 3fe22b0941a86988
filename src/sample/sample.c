/* sample.c — the public sampler: loom_sampler_params mapped onto the chain (chain.h), a reusable
 * loom_sampler that owns a chain workspace, and loom_sample, the one-call form. */
#include "sample/sample.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "core/alloc.h"
#include "core/status.h"

/* ---- parameters ------------------------------------------------------------------------- */

void loom_sampler_params_init(loom_sampler_params *out, size_t size) {
    /* The chain's defaults are the documented ones: copy them so the two cannot drift. */
    loom__sample_chain_config c = loom__sample_chain_default_config();
    loom_sampler_params p;
    loom__abi_init(&p, sizeof p);
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.seed = c.seed;
    p.min_p = c.min_p;
    p.typical_p = c.typical_p;
    p.logit_bias = NULL;
    p.n_logit_bias = 0;
    p.penalty_last_n = c.penalty_last_n;
    p.repeat_penalty = c.repeat_penalty;
    p.presence_penalty = c.presence_penalty;
    p.frequency_penalty = c.frequency_penalty;
    p.entropy_mode = c.entropy_mode;
    p.exp_beta = c.exp_beta;
    p.edt_n = c.edt_n;
    p.edt_theta = c.edt_theta;
    p.edt_h_min = c.edt_h_min;
    p.dyn_t_min = c.dyn_t_min;
    p.dyn_t_max = c.dyn_t_max;
    p.dyn_exponent = c.dyn_exponent;
    p.n_logprobs = c.n_logprobs;
    loom__abi_defaults_out(out, size, &p, sizeof p);
}

loom_status loom__sampler_to_chain(const loom_sampler_params *caller,
                                   loom__sample_chain_config *out) {
    loom_sampler_params params = loom_sampler_default_params(), *p = &params;
    LOOM_TRY(loom__abi_params_in(p, sizeof *p, caller,
                                 LOOM__ABI_END(loom_sampler_params, n_logprobs), "sampler_params"));
    LOOM_RETURN_IF(p->n_logit_bias > 0 && p->logit_bias == NULL, LOOM_ERR_INVALID_ARG,
                   "sampler: logit_bias is NULL with n_logit_bias %zu", p->n_logit_bias);
    LOOM_RETURN_IF(p->n_logit_bias > INT32_MAX, LOOM_ERR_INVALID_ARG,
                   "sampler: n_logit_bias %zu is too large", p->n_logit_bias);
    loom__sample_chain_config c;
    memset(&c, 0, sizeof c);
    c.bias = p->logit_bias;
    c.n_bias = (int32_t)p->n_logit_bias;
    c.penalty_last_n = p->penalty_last_n;
    c.repeat_penalty = p->repeat_penalty;
    c.presence_penalty = p->presence_penalty;
    c.frequency_penalty = p->frequency_penalty;
    c.entropy_mode = p->entropy_mode;
    c.exp_beta = p->exp_beta;
    c.edt_n = p->edt_n;
    c.edt_theta = p->edt_theta;
    c.edt_h_min = p->edt_h_min;
    c.dyn_t_min = p->dyn_t_min;
    c.dyn_t_max = p->dyn_t_max;
    c.dyn_exponent = p->dyn_exponent;
    c.temperature = p->temperature;
    c.top_k = p->top_k;
    c.top_p = p->top_p;
    c.min_p = p->min_p;
    c.typical_p = p->typical_p;
    c.seed = p->seed;
    c.n_logprobs = p->n_logprobs;
    *out = c;
    return LOOM_OK;
}

void loom__sampler_info(const loom__sample_chain_result *r, loom_token_info *out) {
    out->size = sizeof *out;
    out->token = r->token;
    out->logprob_raw = r->logprob_raw;
    out->logprob_final = r->logprob_final;
    out->n_candidates = r->n_candidates;
    out->entropy = r->entropy;
    out->varentropy = r->varentropy;
    out->entropy_final = r->entropy_final;
    out->temperature = r->temperature;
    out->top_raw = r->top_raw;
    out->top_final = r->top_final;
    out->n_top_raw = r->n_top_raw;
    out->n_top_final = r->n_top_final;
}

/* ---- loom_sampler ----------------------------------------------------------------------- */

struct loom_sampler {
    int32_t n_vocab;
    void *mem; /* the chain workspace's memory (16-byte aligned) */
    loom__sample_chain_ws *ws;
    loom_token_logprob *top; /* [2 * cap_top]: raw alternatives, then final ones */
    int32_t cap_top;
};

/* Chain workspace memory for n_vocab tokens, or NULL (size 0: too large). */
static void *alloc_workspace(int32_t n_vocab, size_t *size) {
    size_t sz = loom__sample_chain_workspace_size(n_vocab);
    *size = sz;
    if (sz == 0) return NULL;
    return loom__aligned_alloc(16, (sz + 15) / 16 * 16); /* C11: a multiple of the alignment */
}

loom_status loom_sampler_create(int32_t n_vocab, loom_sampler **out) {
    loom__clear_error();
    LOOM_CHECK_ARG(out != NULL && n_vocab > 0);
    loom_sampler *s = loom__calloc(1, sizeof *s);
    LOOM_RETURN_IF(!s, LOOM_ERR_OUT_OF_MEMORY, "sampler: out of memory");
    size_t sz = 0;
    s->n_vocab = n_vocab;
    s->mem = alloc_workspace(n_vocab, &sz);
    if (!s->mem) {
        free(s);
        if (sz == 0)
            return loom__fail(LOOM_ERR_INVALID_ARG, "sampler: n_vocab %d is too large", n_vocab);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "sampler: out of memory for %zu bytes", sz);
    }
    loom_status st = loom__sample_chain_workspace_init(s->mem, sz, n_vocab, &s->ws);
    if (st != LOOM_OK) {
        loom_sampler_free(s);
        return st;
    }
    *out = s;
    return LOOM_OK;
}

void loom_sampler_free(loom_sampler *s) {
    if (!s) return;
    free(s->mem);
    free(s->top);
    free(s);
}

loom_status loom_sampler_run(loom_sampler *s, const float *logits,
                             const loom_sampler_params *params, const loom_token *history,
                             size_t n_history, uint64_t draw_index, loom_token_info *out) {
    loom__clear_error();
    LOOM_CHECK_ARG(s != NULL && logits != NULL && params != NULL && out != NULL);
    LOOM_RETURN_IF(out->size < LOOM__ABI_END(loom_token_info, n_top_final), LOOM_ERR_INVALID_ARG,
                   "sampler: out->size %zu: set it to sizeof(loom_token_info)", out->size);
    LOOM_CHECK_ARG(n_history == 0 || history != NULL);
    LOOM_RETURN_IF(n_history > INT32_MAX, LOOM_ERR_INVALID_ARG,
                   "sampler: a history of %zu tokens is too long", n_history);
    loom__sample_chain_config c;
    LOOM_TRY(loom__sampler_to_chain(params, &c));
    /* Validate before growing, so a bad n_logprobs never turns into a huge allocation. */
    LOOM_TRY(loom__sample_chain_validate(&c, s->n_vocab));
    if (c.n_logprobs > s->cap_top) {
        loom_token_logprob *grown = loom__realloc(s->top, 2 * (size_t)c.n_logprobs * sizeof *grown);
        LOOM_RETURN_IF(!grown, LOOM_ERR_OUT_OF_MEMORY, "sampler: out of memory for %d logprobs",
                       c.n_logprobs);
        s->top = grown;
        s->cap_top = c.n_logprobs;
    }
    loom__sample_chain_result r;
    memset(&r, 0, sizeof r);
    r.top_raw = s->top;
    r.top_final = s->top ? s->top + c.n_logprobs : NULL;
    LOOM_TRY(
        loom__sample_chain_run(s->ws, &c, logits, history, (int32_t)n_history, draw_index, &r));
    loom_token_info info;
    loom__sampler_info(&r, &info);
    return loom__abi_result_out(out, &info, sizeof info,
                                LOOM__ABI_END(loom_token_info, n_top_final), "token_info");
}

/* ---- loom_sample ------------------------------------------------------------------------ */

loom_status loom_sample(const float *logits, int32_t n_vocab, const loom_sampler_params *p,
                        uint64_t draw_index, loom_token *out) {
    loom__clear_error();
    LOOM_CHECK_ARG(logits != NULL && p != NULL && out != NULL && n_vocab > 0);
    loom__sample_chain_config c;
    LOOM_TRY(loom__sampler_to_chain(p, &c));
    c.n_logprobs = 0; /* nothing to return them in */
    LOOM_TRY(loom__sample_chain_validate(&c, n_vocab));
    size_t sz = 0;
    void *mem = alloc_workspace(n_vocab, &sz);
    LOOM_RETURN_IF(!mem && sz == 0, LOOM_ERR_INVALID_ARG, "sample: n_vocab %d is too large",
                   n_vocab);
    LOOM_RETURN_IF(!mem, LOOM_ERR_OUT_OF_MEMORY, "sample: out of memory for %zu bytes", sz);
    loom__sample_chain_ws *ws = NULL;
    loom__sample_chain_result r;
    memset(&r, 0, sizeof r);
    loom_status st = loom__sample_chain_workspace_init(mem, sz, n_vocab, &ws);
    if (st == LOOM_OK) st = loom__sample_chain_run(ws, &c, logits, NULL, 0, draw_index, &r);
    free(mem);
    if (st == LOOM_OK) *out = r.token;
    return st;
}
