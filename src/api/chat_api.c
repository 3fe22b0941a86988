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

loom_status loom_chat_format(const loom_model *model, const loom_chat_message *messages, size_t n,
                             bool add_assistant, char *out, size_t cap, size_t *n_out) {
    loom__clear_error();
    LOOM_CHECK_ARG(model != NULL && n_out != NULL);
    LOOM_CHECK_ARG(messages != NULL || n == 0);
    LOOM_CHECK_ARG(out != NULL || cap == 0);
    loom__chat_kind kind;
    LOOM_TRY(loom__chat_detect_gguf(model->gguf, model->arch_name, &kind));
    return loom__chat_render(kind, messages, n, add_assistant, out, cap, n_out);
}

loom_status loom_chat_tokenize(const loom_model *model, const loom_chat_message *messages, size_t n,
                               bool add_assistant, loom_token *out, size_t cap, size_t *n_out) {
    loom__clear_error();
    LOOM_CHECK_ARG(model != NULL && n_out != NULL);
    LOOM_CHECK_ARG(messages != NULL || n == 0);
    LOOM_CHECK_ARG(out != NULL || cap == 0);
    loom__chat_kind kind;
    LOOM_TRY(loom__chat_detect_gguf(model->gguf, model->arch_name, &kind));
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
