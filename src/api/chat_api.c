/* chat_api.c — the public chat-template entry points: argument checks over tokenizer/chat.h, with
 * the template chosen from the model's metadata on every call (a scan of a few kilobytes). */
#include <stdlib.h>

#include "core/alloc.h"
#include "core/status.h"
#include "tokenizer/chat.h"
#include "model/model.h"

loom_status loom_chat_template_name(const loom_model *model, const char **out) {
    loom__clear_error();
    LOOM_CHECK_ARG(model != NULL && out != NULL);
    loom__chat_kind kind;
    LOOM_TRY(loom__chat_detect_gguf(model->gguf, model->arch_name, &kind));
    *out = loom__chat_kind_name(kind);
    return LOOM_OK;
}

/* The arguments both renderers take, checked (fn names the caller in messages), and the
 * model's template. */
static loom_status chat_begin(const char *fn, const loom_model *model,
                              const loom_chat_message *messages, size_t n, const void *out,
                              size_t cap, const size_t *n_out, loom__chat_kind *kind) {
    LOOM_RETURN_IF(model == NULL || n_out == NULL, LOOM_ERR_INVALID_ARG,
                   "%s: invalid argument: model and n_out must not be NULL", fn);
    LOOM_RETURN_IF(messages == NULL && n != 0, LOOM_ERR_INVALID_ARG,
                   "%s: invalid argument: messages is NULL with n = %zu", fn, n);
    LOOM_RETURN_IF(out == NULL && cap != 0, LOOM_ERR_INVALID_ARG,
                   "%s: invalid argument: out is NULL with cap = %zu", fn, cap);
    return loom__chat_detect_gguf(model->gguf, model->arch_name, kind);
}

loom_status loom_chat_format(const loom_model *model, const loom_chat_message *messages, size_t n,
                             bool add_assistant, char *out, size_t cap, size_t *n_out) {
    loom__clear_error();
    loom__chat_kind kind;
    LOOM_TRY(chat_begin(__func__, model, messages, n, out, cap, n_out, &kind));
    return loom__chat_render(kind, messages, n, add_assistant, out, cap, n_out);
}

loom_status loom_chat_tokenize(const loom_model *model, const loom_chat_message *messages, size_t n,
                               bool add_assistant, loom_token *out, size_t cap, size_t *n_out) {
    loom__clear_error();
    loom__chat_kind kind;
    LOOM_TRY(chat_begin(__func__, model, messages, n, out, cap, n_out, &kind));
    size_t len = 0;
    loom_status st = loom__chat_render(kind, messages, n, add_assistant, NULL, 0, &len);
    if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL) return st;
    char *text = loom__malloc(len ? len : 1);
    loom__text_range *spans = loom__malloc((n ? n : 1) * sizeof *spans);
    size_t n_spans = 0;
    if (!text || !spans) {
        free(text);
        free(spans);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "chat_tokenize: out of memory (%zu bytes)", len);
    }
    st =
        loom__chat_render_spans(kind, messages, n, add_assistant, text, len, &len, spans, &n_spans);
    if (st == LOOM_OK)
        st = loom__tokenizer_encode_guarded(model->tok, text, len,
                                            LOOM_TOKENIZE_ADD_SPECIAL | LOOM_TOKENIZE_PARSE_SPECIAL,
                                            spans, n_spans, out, cap, n_out);
    free(text);
    free(spans);
    return st;
}
