/* generate.c — loom_generate: prompt, then sample token by token with the sampler chain (its
 * penalties see the prompt and the tokens generated so far), streaming text in whole UTF-8
 * characters through the engine's text stream (a character split across byte-fallback tokens
 * is held back until complete). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h"
#include "core/status.h"
#include "core/timer.h"
#include "engine/text_stream.h"
#include "model/model.h"
#include "sample/sample.h"

loom_generate_params loom_generate_default_params(void) {
    loom_generate_params p;
    memset(&p, 0, sizeof p);
    p.n_predict = 128;
    p.sampler = loom_sampler_default_params();
    p.add_special = true;
    p.parse_special = false;
    p.stop_at_eos = true;
    p.on_token_info = NULL;
    p.token_info_user_data = NULL;
    return p;
}

/* Streams tok's piece through ts and hands the completed text to fn. */
static bool emit_piece(const loom_model *m, loom_text_stream *ts, loom_token tok, loom_piece_fn fn,
                       void *user) {
    char piece[256];
    size_t n = 0;
    if (loom_token_to_piece(m, tok, 0, piece, sizeof piece, &n) != LOOM_OK || n > sizeof piece)
        n = 0;
    const char *out = "";
    size_t len = 0;
    bool stopped = false;
    if (!loom__text_stream_push(ts, NULL, piece, n, &out, &len, &stopped)) len = 0;
    return !fn || fn(out, len, tok, user);
}

loom_status loom_generate(loom_session *s, const char *prompt, const loom_generate_params *params,
                          loom_piece_fn on_piece, void *user_data, loom_generate_stats *stats) {
    loom__clear_error();
    LOOM_CHECK_ARG(s != NULL && prompt != NULL);
    loom_generate_params p = params ? *params : loom_generate_default_params();
    LOOM_CHECK_ARG(p.n_predict >= 0);
    const loom_model *m = loom__session_model(s);
    /* Bad sampler settings fail before any work, not after the prompt has run. */
    loom_sample_chain_config chain;
    loom_status st = loom__sampler_to_chain(&p.sampler, &chain);
    if (st == LOOM_OK) st = loom_sample_chain_validate(&chain, m->cfg.n_vocab);
    if (st != LOOM_OK) {
        loom__error_prefix("generate");
        return st;
    }
    loom_generate_stats st_local;
    memset(&st_local, 0, sizeof st_local);

    unsigned flags = (p.add_special ? LOOM_TOKENIZE_ADD_SPECIAL : 0) |
                     (p.parse_special ? LOOM_TOKENIZE_PARSE_SPECIAL : 0);
    size_t len = strlen(prompt), n_tok = 0;
    st = loom_tokenize(m, prompt, len, flags, NULL, 0, &n_tok);
    if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL) return st;
    LOOM_RETURN_IF(n_tok == 0, LOOM_ERR_INVALID_ARG, "generate: the prompt has no tokens");
    /* The prompt, then the generated tokens: the history the penalties look at. */
    LOOM_RETURN_IF(n_tok > SIZE_MAX / sizeof(loom_token) - (size_t)p.n_predict,
                   LOOM_ERR_INVALID_ARG, "generate: prompt too long");
    loom_token *toks = malloc((n_tok + (size_t)p.n_predict) * sizeof *toks);
    LOOM_RETURN_IF(!toks, LOOM_ERR_OUT_OF_MEMORY, "generate: out of memory");
    loom_sampler *sampler = NULL;
    st = loom_tokenize(m, prompt, len, flags, toks, n_tok, &n_tok);
    if (st != LOOM_OK) goto done;
    st = loom_sampler_create(m->cfg.n_vocab, &sampler);
    if (st != LOOM_OK) goto done;

    if (n_tok > (size_t)loom__session_n_ctx(s)) {
        st = loom__fail(LOOM_ERR_CONTEXT_FULL,
                        "generate: the prompt has %zu tokens but the context holds %d", n_tok,
                        loom__session_n_ctx(s));
        goto done;
    }
    loom_session_reset(s);
    double t0 = loom__now_ms();
    st = loom_session_decode(s, toks, (int32_t)n_tok, false);
    if (st != LOOM_OK) goto done;
    st_local.n_prompt = (int32_t)n_tok;
    st_local.prompt_ms = loom__now_ms() - t0;

    /* Whole UTF-8 characters only: a character split over byte tokens waits for its end. */
    char text_buf[256 + 8];
    loom_text_stream ts = {text_buf, 0, sizeof text_buf, 0};
    double t1 = loom__now_ms();
    size_t n_hist = n_tok;
    for (int32_t i = 0; i < p.n_predict; i++) {
        loom_token_info info;
        st = loom_sampler_run(sampler, loom_session_logits(s, -1), &p.sampler, toks, n_hist,
                              (uint64_t)loom_session_n_past(s), &info);
        if (st != LOOM_OK) break;
        loom_token next = info.token;
        toks[n_hist++] = next;
        st_local.n_generated++;
        if (p.on_token_info) p.on_token_info(&info, p.token_info_user_data);
        if (p.stop_at_eos && loom_tokenizer_is_eog(m->tok, next)) break;
        if (!emit_piece(m, &ts, next, on_piece, user_data)) break;
        if (i + 1 == p.n_predict) break;
        st = loom_session_decode(s, &next, 1, false);
        if (st == LOOM_ERR_CONTEXT_FULL) {
            st = LOOM_OK; /* the context is used up: generation simply ends here */
            break;
        }
        if (st != LOOM_OK) break;
    }
    st_local.generate_ms = loom__now_ms() - t1;

done:
    loom_sampler_free(sampler);
    free(toks);
    if (stats) *stats = st_local;
    return st;
}
