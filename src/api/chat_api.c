/* chat_api.c — the public chat-template entry points: argument checks over tokenizer/chat.h, with
 * the template chosen from the model's metadata on every call (a scan of a few kilobytes). */
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
