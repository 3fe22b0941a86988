/* tokenize.c — the public tokenizer entry points: argument checks over tokenizer/tokenizer.h. */
#include "core/status.h"
#include "model/model.h"

loom_status loom_tokenize(const loom_model *model, const char *text, size_t len, unsigned flags,
                          loom_token *out, size_t cap, size_t *n_out) {
    loom__clear_error();
    LOOM_CHECK_ARG(model != NULL && n_out != NULL);
    LOOM_CHECK_ARG(text != NULL || len == 0);
    LOOM_CHECK_ARG(out != NULL || cap == 0);
    LOOM_RETURN_IF(flags & ~(unsigned)(LOOM_TOKENIZE_ADD_SPECIAL | LOOM_TOKENIZE_PARSE_SPECIAL),
                   LOOM_ERR_INVALID_ARG, "tokenize: unknown flags 0x%x", flags);
    return loom__tokenizer_encode(model->tok, text ? text : "", len, flags, out, cap, n_out);
}

loom_status loom_detokenize(const loom_model *model, const loom_token *tokens, size_t n_tokens,
                            unsigned flags, char *out, size_t cap, size_t *n_out) {
    loom__clear_error();
    LOOM_CHECK_ARG(model != NULL && n_out != NULL);
    LOOM_CHECK_ARG(tokens != NULL || n_tokens == 0);
    LOOM_CHECK_ARG(out != NULL || cap == 0);
    LOOM_RETURN_IF(flags &
                       ~(unsigned)(LOOM_DETOKENIZE_RENDER_SPECIAL | LOOM_DETOKENIZE_STRIP_LEADING),
                   LOOM_ERR_INVALID_ARG, "detokenize: unknown flags 0x%x", flags);
    return loom__tokenizer_decode(model->tok, tokens, n_tokens, flags, out, cap, n_out);
}

loom_status loom_token_to_piece(const loom_model *model, loom_token token, unsigned flags,
                                char *out, size_t cap, size_t *n_out) {
    loom__clear_error();
    LOOM_CHECK_ARG(model != NULL && n_out != NULL);
    LOOM_CHECK_ARG(out != NULL || cap == 0);
    return loom__tokenizer_piece(model->tok, token, flags, out, cap, n_out);
}
