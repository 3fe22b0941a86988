/* request.c — validating and copying a request at submit (so bad input fails at once and the
 * caller's memory is never referenced later), and the per-token stop test. */
#include "engine/request.h"

#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/timer.h"
#include "sample/sample.h"

void loom_request_params_init(loom_request_params *out, size_t size) {
    loom_request_params p;
    loom__abi_init(&p, sizeof p);
    p.add_special = true;
    p.sampler = NULL; /* the sampler's defaults */
    p.max_tokens = 128;
    p.n = 1;
    loom__abi_defaults_out(out, size, &p, sizeof p);
}

loom_status loom__request_params_in(const loom_request_params *caller, loom_request_params *p,
                                    loom_sampler_params *sampler) {
    *p = loom_request_default_params();
    LOOM_TRY(loom__abi_params_in(p, sizeof *p, caller,
                                 LOOM__ABI_END(loom_request_params, arrival_s), "request_params"));
    *sampler = loom_sampler_default_params();
    LOOM_TRY(loom__abi_params_in(sampler, sizeof *sampler, p->sampler,
                                 LOOM__ABI_END(loom_sampler_params, n_logprobs), "sampler_params"));
    p->sampler = sampler;
    return LOOM_OK;
}

static loom_status check_params(const loom_model *m, const loom_request_params *p) {
    LOOM_RETURN_IF(!p->prompt && !p->prompt_tokens, LOOM_ERR_INVALID_ARG,
                   "submit: give prompt text or prompt_tokens");
    LOOM_RETURN_IF(p->prompt && p->prompt_tokens, LOOM_ERR_INVALID_ARG,
                   "submit: give prompt text or prompt_tokens, not both");
    LOOM_RETURN_IF(p->n < 1 || p->n > 256, LOOM_ERR_INVALID_ARG, "submit: n = %d (1..256)", p->n);
    LOOM_RETURN_IF(p->max_tokens < 1, LOOM_ERR_INVALID_ARG, "submit: max_tokens = %d (>= 1)",
                   p->max_tokens);
    loom__sample_chain_config chain;
    loom_status st = loom__sampler_to_chain(p->sampler, &chain);
    if (st == LOOM_OK) st = loom__sample_chain_validate(&chain, m->cfg.n_vocab);
    if (st != LOOM_OK) {
        loom__error_prefix("submit");
        return st;
    }
    LOOM_RETURN_IF(p->n_stop_tokens > 0 && !p->stop_tokens, LOOM_ERR_INVALID_ARG,
                   "submit: stop_tokens is NULL");
    LOOM_RETURN_IF(p->n_stop_strings > 0 && !p->stop_strings, LOOM_ERR_INVALID_ARG,
                   "submit: stop_strings is NULL");
    LOOM_RETURN_IF(p->n_stop_tokens > 1024 || p->n_stop_strings > 64, LOOM_ERR_INVALID_ARG,
                   "submit: at most 1024 stop tokens and 64 stop strings");
    for (size_t i = 0; i < p->n_stop_tokens; i++) {
        LOOM_RETURN_IF(p->stop_tokens[i] < 0 || p->stop_tokens[i] >= m->cfg.n_vocab,
                       LOOM_ERR_BAD_INPUT, "submit: stop token %d out of range", p->stop_tokens[i]);
    }
    for (size_t i = 0; i < p->n_stop_strings; i++) {
        const char *s = p->stop_strings[i];
        LOOM_RETURN_IF(!s || !*s || strlen(s) > 1024, LOOM_ERR_INVALID_ARG,
                       "submit: stop string %zu is NULL, empty or longer than 1024 bytes", i);
    }
    int64_t us;
    LOOM_RETURN_IF(!loom__duration_us(p->ttft_deadline_s, &us), LOOM_ERR_INVALID_ARG,
                   "submit: ttft_deadline_s = %g (0 or +inf for none, else up to %g s)",
                   p->ttft_deadline_s, LOOM__MAX_DURATION_S);
    LOOM_RETURN_IF(!loom__duration_us(p->tpot_deadline_s, &us), LOOM_ERR_INVALID_ARG,
                   "submit: tpot_deadline_s = %g (0 or +inf for none, else up to %g s)",
                   p->tpot_deadline_s, LOOM__MAX_DURATION_S);
    return LOOM_OK;
}

static loom_status copy_prompt(const loom_model *m, const loom_request_params *p, loom__req *r) {
    size_t n = 0;
    if (p->prompt) {
        unsigned flags = (p->add_special ? LOOM_TOKENIZE_ADD_SPECIAL : 0) |
                         (p->parse_special ? LOOM_TOKENIZE_PARSE_SPECIAL : 0);
        size_t len = strlen(p->prompt);
        loom_status st = loom__tokenizer_encode(m->tok, p->prompt, len, flags, NULL, 0, &n);
        if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL) return st;
        LOOM_RETURN_IF(n == 0, LOOM_ERR_INVALID_ARG, "submit: the prompt has no tokens");
        r->prompt = loom__malloc(n * sizeof *r->prompt);
        LOOM_RETURN_IF(!r->prompt, LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
        LOOM_TRY(loom__tokenizer_encode(m->tok, p->prompt, len, flags, r->prompt, n, &n));
    } else {
        n = p->n_prompt_tokens;
        LOOM_RETURN_IF(n == 0, LOOM_ERR_INVALID_ARG, "submit: the prompt has no tokens");
        for (size_t i = 0; i < n; i++) {
            LOOM_RETURN_IF(p->prompt_tokens[i] < 0 || p->prompt_tokens[i] >= m->cfg.n_vocab,
                           LOOM_ERR_BAD_INPUT,
                           "submit: prompt token %d at %zu out of range [0, %d)",
                           p->prompt_tokens[i], i, m->cfg.n_vocab);
        }
        r->prompt = loom__malloc(n * sizeof *r->prompt);
        LOOM_RETURN_IF(!r->prompt, LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
        memcpy(r->prompt, p->prompt_tokens, n * sizeof *r->prompt);
    }
    LOOM_RETURN_IF(n > INT32_MAX, LOOM_ERR_CONTEXT_FULL, "submit: prompt too long");
    r->n_prompt = (int32_t)n;
    return LOOM_OK;
}

static loom_status copy_stops(const loom_request_params *p, loom__req *r) {
    if (p->n_stop_tokens) {
        r->stop_tokens = loom__malloc(p->n_stop_tokens * sizeof *r->stop_tokens);
        LOOM_RETURN_IF(!r->stop_tokens, LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
        memcpy(r->stop_tokens, p->stop_tokens, p->n_stop_tokens * sizeof *r->stop_tokens);
        r->n_stop_tokens = (int32_t)p->n_stop_tokens;
    }
    size_t n = p->n_stop_strings;
    if (!n) return LOOM_OK;
    r->stop_strings = loom__calloc(n, sizeof *r->stop_strings);
    r->stop_lens = loom__calloc(n, sizeof *r->stop_lens);
    LOOM_RETURN_IF(!r->stop_strings || !r->stop_lens, LOOM_ERR_OUT_OF_MEMORY,
                   "submit: out of memory");
    r->stops.n = n; /* set first so loom__req_free frees a partial copy */
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(p->stop_strings[i]);
        r->stop_strings[i] = loom__malloc(len + 1);
        LOOM_RETURN_IF(!r->stop_strings[i], LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
        memcpy(r->stop_strings[i], p->stop_strings[i], len + 1);
        r->stop_lens[i] = len;
        if (len > r->stops.max_len) r->stops.max_len = len;
    }
    r->stops.s = (const char *const *)r->stop_strings;
    r->stops.len = r->stop_lens;
    return LOOM_OK;
}

/* The sampler settings, with a private copy of the logit-bias list. */
static loom_status copy_sampler(const loom_request_params *p, loom__req *r) {
    LOOM_TRY(loom__sampler_to_chain(p->sampler, &r->chain));
    if (r->chain.n_bias > 0) {
        r->bias = loom__malloc((size_t)r->chain.n_bias * sizeof *r->bias);
        LOOM_RETURN_IF(!r->bias, LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
        memcpy(r->bias, r->chain.bias, (size_t)r->chain.n_bias * sizeof *r->bias);
    }
    r->chain.bias = r->bias;
    return LOOM_OK;
}

static loom_status alloc_samples(size_t max_piece, loom__req *r) {
    r->samples = loom__calloc((size_t)r->n_samples, sizeof *r->samples);
    LOOM_RETURN_IF(!r->samples, LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
    size_t cap = r->stops.max_len + max_piece + 4;
    r->text_mem = loom__malloc(cap * (size_t)r->n_samples);
    LOOM_RETURN_IF(!r->text_mem, LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
    for (int32_t i = 0; i < r->n_samples; i++) {
        loom__req_sample *s = &r->samples[i];
        s->text.buf = r->text_mem + cap * (size_t)i;
        s->text.cap = cap;
        if (r->chain.n_logprobs > 0) {
            s->top = loom__malloc(2 * (size_t)r->chain.n_logprobs * sizeof *s->top);
            LOOM_RETURN_IF(!s->top, LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
        }
    }
    return LOOM_OK;
}

loom_status loom__req_reserve_token(loom__req_sample *s) {
    if (s->n_generated < s->tokens_cap) return LOOM_OK;
    LOOM_RETURN_IF(s->tokens_cap > INT32_MAX / 2, LOOM_ERR_INTERNAL, "engine: sample too long");
    int32_t cap = s->tokens_cap ? 2 * s->tokens_cap : 64;
    loom_token *t = loom__realloc(s->tokens, (size_t)cap * sizeof *t);
    LOOM_RETURN_IF(!t, LOOM_ERR_OUT_OF_MEMORY, "engine: out of memory for %d generated tokens",
                   cap);
    s->tokens = t;
    s->tokens_cap = cap;
    return LOOM_OK;
}

loom_status loom__req_create(const loom_model *m, const loom_request_params *p, int32_t max_ctx,
                             size_t max_piece, loom__req **out) {
    LOOM_TRY(check_params(m, p));
    loom__req *r = loom__calloc(1, sizeof *r);
    LOOM_RETURN_IF(!r, LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
    r->user_data = p->user_data;
    r->max_tokens = p->max_tokens;
    r->n_samples = p->n;
    r->ignore_eos = p->ignore_eos;
    r->priority = p->priority;
    loom__duration_us(p->ttft_deadline_s, &r->ttft_us); /* checked above */
    loom__duration_us(p->tpot_deadline_s, &r->tpot_us);
    r->class_priority = r->priority;
    r->asked_ttft_us = r->ttft_us;
    r->cache_salt = p->cache_salt;
    loom_status st = copy_prompt(m, p, r);
    if (st == LOOM_OK && r->n_prompt >= max_ctx) {
        st = loom__fail(LOOM_ERR_CONTEXT_FULL,
                        "submit: the prompt has %d tokens; a request holds at most %d positions "
                        "(and needs one more to generate)",
                        r->n_prompt, max_ctx);
    }
    if (st == LOOM_OK) st = copy_stops(p, r);
    if (st == LOOM_OK) st = copy_sampler(p, r);
    if (st == LOOM_OK) st = alloc_samples(max_piece, r);
    if (st != LOOM_OK) {
        loom__req_free(r);
        return st;
    }
    *out = r;
    return LOOM_OK;
}

void loom__req_free(loom__req *r) {
    if (!r) return;
    if (r->samples) {
        for (int32_t i = 0; i < r->n_samples; i++) {
            free(r->samples[i].tokens);
            free(r->samples[i].top);
            free(r->samples[i].swap_slots);
        }
    }
    free(r->samples);
    free(r->text_mem);
    if (r->stop_strings) {
        for (size_t i = 0; i < r->stops.n; i++) free(r->stop_strings[i]);
    }
    free(r->stop_strings);
    free(r->stop_lens);
    free(r->stop_tokens);
    free(r->bias);
    free(r->prompt);
    free(r->record);
    free(r);
}

bool loom__req_is_stop_token(const loom__req *r, const loom_model *m, loom_token tok,
                             loom_finish_reason *reason) {
    for (int32_t i = 0; i < r->n_stop_tokens; i++) {
        if (r->stop_tokens[i] == tok) {
            *reason = LOOM_FINISH_STOP_TOKEN;
            return true;
        }
    }
    if (!r->ignore_eos && loom__tokenizer_is_eog(m->tok, tok)) {
        *reason = LOOM_FINISH_EOS;
        return true;
    }
    return false;
}
