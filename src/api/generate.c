/* generate.c — loom_generate: prompt, then sample token by token with the sampler chain (its
 * penalties see the prompt and the tokens generated so far), streaming text in whole UTF-8
 * characters through the engine's text stream (a character split across byte-fallback tokens
 * is held back until complete). With params.trace, each forward pass is a traced step (layer
 * groups, logits, sample, events) and each sampled token a token record, as in the engine. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/session.h"
#include "core/abi.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/timer.h"
#include "tokenizer/text_stream.h"
#include "model/model.h"
#include "sample/sample.h"
#include "trace/trace.h"

void loom_generate_params_init(loom_generate_params *out, size_t size) {
    loom_generate_params p;
    loom__abi_init(&p, sizeof p);
    p.n_predict = 128;
    p.sampler = NULL; /* the sampler's defaults */
    p.add_special = true;
    p.parse_special = false;
    p.stop_at_eos = true;
    p.on_token_info = NULL;
    p.token_info_user_data = NULL;
    p.trace = NULL;
    loom__abi_defaults_out(out, size, &p, sizeof p);
}

/* ---- tracing -------------------------------------------------------------------------------- */

/* The state of a traced generation: the step timer, the layer-group names its hook borrows,
 * and the step being timed. */
typedef struct gen_trace {
    loom_trace *trace; /* NULL: tracing off, and nothing below is used */
    loom__trace_timer tm;
    loom__trace_layers layers;
    loom__trace_layer_hook hook;
    int64_t step;     /* index of the open step */
    bool open;        /* a step is being timed */
    int32_t n_tokens; /* tokens in the open step's forward pass */
    int64_t start_ns; /* when loom_generate was called: the "arrival" of its request */
} gen_trace;

static void gt_phase(gen_trace *g, const char *name) {
    if (g->trace && g->open) loom__trace_step_phase(&g->tm, name, loom__now_ns());
}

static void gt_begin(gen_trace *g, int32_t n_tokens) {
    if (!g->trace) return;
    loom__trace_step_begin(&g->tm, g->step, loom__now_ns());
    g->open = true;
    g->n_tokens = n_tokens;
}

/* Ends the open step with its "events" phase (appending it to the trace). */
static void gt_end(gen_trace *g) {
    if (!g->trace || !g->open) return;
    (void)loom__trace_step_end(g->trace, &g->tm, "events", loom__now_ns(), 1, g->n_tokens);
    g->open = false;
    g->step++;
}

/* The token record of tok, sampled at position pos with info. */
static void gt_token(gen_trace *g, const loom_model *m, int32_t pos, const loom_token_info *info) {
    if (!g->trace) return;
    char piece[256];
    size_t n = 0;
    if (loom_token_to_piece(m, info->token, 0, piece, sizeof piece, &n) != LOOM_OK ||
        n > sizeof piece)
        n = 0;
    int64_t now = loom__now_ns();
    loom__trace_token k = {
        .request = 0, /* loom_generate has no request ids (documented in loom.h) */
        .sample = 0,
        .step = g->step,
        .pos = pos,
        .token = info->token,
        .piece = piece,
        .piece_len = n,
        .logprob_raw = info->logprob_raw,
        .logprob_final = info->logprob_final,
        .entropy = info->entropy,
        .entropy_final = info->entropy_final,
        .varentropy = info->varentropy,
        .temperature = info->temperature,
        .t_ns = now,
        .since_arrival_ns = now - g->start_ns,
    };
    (void)loom__trace_add_token(g->trace, &k); /* a dropped record is counted by the trace */
}

/* Streams tok's piece through ts and hands the completed text to fn. */
static bool emit_piece(const loom_model *m, loom__text_stream *ts, loom_token tok, loom_piece_fn fn,
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
    loom_generate_params p = loom_generate_default_params();
    LOOM_TRY(loom__abi_params_in(&p, sizeof p, params, LOOM__ABI_END(loom_generate_params, trace),
                                 "generate_params"));
    LOOM_CHECK_ARG(p.n_predict >= 0);
    LOOM_RETURN_IF(stats != NULL && stats->size < LOOM__ABI_END(loom_generate_stats, generate_ms),
                   LOOM_ERR_INVALID_ARG, "generate: stats->size %zu: set it to sizeof",
                   stats->size);
    const loom_sampler_params sampler_defaults = loom_sampler_default_params();
    const loom_sampler_params *sp = p.sampler ? p.sampler : &sampler_defaults;
    const loom_model *m = loom__session_model(s);
    /* Bad sampler settings fail before any work, not after the prompt has run. */
    loom__sample_chain_config chain;
    loom_status st = loom__sampler_to_chain(sp, &chain);
    if (st == LOOM_OK) st = loom__sample_chain_validate(&chain, m->cfg.n_vocab);
    if (st != LOOM_OK) {
        loom__error_prefix("generate");
        return st;
    }
    loom_generate_stats st_local = {.size = sizeof st_local};
    memset(&st_local, 0, sizeof st_local);
    st_local.size = sizeof st_local;
    gen_trace gt = {.trace = p.trace, .start_ns = loom__now_ns()};

    unsigned flags = (p.add_special ? LOOM_TOKENIZE_ADD_SPECIAL : 0) |
                     (p.parse_special ? LOOM_TOKENIZE_PARSE_SPECIAL : 0);
    size_t len = strlen(prompt), n_tok = 0;
    st = loom_tokenize(m, prompt, len, flags, NULL, 0, &n_tok);
    if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL) return st;
    LOOM_RETURN_IF(n_tok == 0, LOOM_ERR_INVALID_ARG, "generate: the prompt has no tokens");
    size_t n_ctx = (size_t)loom__session_n_ctx(s);
    LOOM_RETURN_IF(n_tok > n_ctx, LOOM_ERR_CONTEXT_FULL,
                   "generate: the prompt has %zu tokens but the context holds %d", n_tok,
                   (int)n_ctx);
    /* The prompt, then the generated tokens: the history the penalties look at. Generation
     * ends when the context is full (the last token is sampled, not decoded), so no more than
     * n_ctx + 1 are ever held, whatever n_predict asks. */
    size_t cap = n_tok + (size_t)p.n_predict < n_ctx + 1 ? n_tok + (size_t)p.n_predict : n_ctx + 1;
    loom_token *toks = loom__malloc(cap * sizeof *toks);
    LOOM_RETURN_IF(!toks, LOOM_ERR_OUT_OF_MEMORY, "generate: out of memory");
    loom_sampler *sampler = NULL;
    st = loom_tokenize(m, prompt, len, flags, toks, n_tok, &n_tok);
    if (st != LOOM_OK) goto done;
    st = loom_sampler_create(m->cfg.n_vocab, &sampler);
    if (st != LOOM_OK) goto done;
    loom_session_reset(s);
    if (gt.trace) {
        /* Steps are numbered on from what the trace holds (several calls stay in order). */
        loom_trace_info ti = {.size = sizeof ti};
        if (loom_trace_get_info(gt.trace, &ti) == LOOM_OK) gt.step = (int64_t)ti.n_steps;
        loom__trace_layers_init(&gt.layers, m->cfg.n_layer);
        gt.hook = (loom__trace_layer_hook){.tm = &gt.tm, .layers = &gt.layers};
        loom__session_set_layer_hook(s, loom__trace_on_layers, &gt.hook, gt.layers.every);
    }
    double t0 = loom__now_ms();
    gt_begin(&gt, (int32_t)n_tok);
    st = loom_session_decode(s, toks, (int32_t)n_tok, false);
    gt_phase(&gt, "logits");
    if (st != LOOM_OK) goto done;
    st_local.n_prompt = (int32_t)n_tok;
    st_local.prompt_ms = loom__now_ms() - t0;

    /* Whole UTF-8 characters only: a character split over byte tokens waits for its end. */
    char text_buf[256 + 8];
    loom__text_stream ts = {text_buf, 0, sizeof text_buf, 0};
    double t1 = loom__now_ms();
    size_t n_hist = n_tok;
    for (int32_t i = 0; i < p.n_predict; i++) {
        loom_token_info info = {.size = sizeof info};
        st = loom_sampler_run(sampler, loom_session_logits(s, -1), sp, toks, n_hist,
                              (uint64_t)loom_session_n_past(s), &info);
        if (st != LOOM_OK) break;
        gt_phase(&gt, "sample");
        gt_token(&gt, m, loom_session_n_past(s), &info);
        loom_token next = info.token;
        if (n_hist == cap) {
            st = loom__fail(LOOM_ERR_INTERNAL, "generate: token %zu past the context", n_hist);
            break;
        }
        toks[n_hist++] = next;
        st_local.n_generated++;
        if (p.on_token_info) p.on_token_info(&info, p.token_info_user_data);
        if (p.stop_at_eos && loom__tokenizer_is_eog(m->tok, next)) break;
        if (!emit_piece(m, &ts, next, on_piece, user_data)) break;
        if (i + 1 == p.n_predict) break;
        gt_end(&gt);
        gt_begin(&gt, 1);
        st = loom_session_decode(s, &next, 1, false);
        gt_phase(&gt, "logits");
        if (st == LOOM_ERR_CONTEXT_FULL) {
            st = LOOM_OK; /* the context is used up: generation simply ends here */
            break;
        }
        if (st != LOOM_OK) break;
    }
    st_local.generate_ms = loom__now_ms() - t1;

done:
    gt_end(&gt);
    if (gt.trace) loom__session_set_layer_hook(s, NULL, NULL, 0);
    loom_sampler_free(sampler);
    free(toks);
    if (stats)
        (void)loom__abi_result_out(stats, &st_local, sizeof st_local,
                                   LOOM__ABI_END(loom_generate_stats, generate_ms),
                                   "generate_stats"); /* its size was checked on entry */
    return st;
}
