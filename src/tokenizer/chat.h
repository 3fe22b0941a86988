/* chat.h — chat templates without a Jinja engine: recognising a model's template by its turn
 * markers, and rendering a conversation in that template's text format.
 *
 * The reference is llama.cpp's llama_chat_apply_template (its built-in, non-Jinja formats):
 * for the same messages, add_assistant flag and template, the rendered text is byte for byte
 * the same. Three formats are known:
 *
 *   chatml  "<|im_start|>" role "\n" content "<|im_end|>\n" per message (content as given);
 *           add_assistant: "<|im_start|>assistant\n". Qwen2 and many others.
 *   gemma   "<start_of_turn>" role "\n" trim(content) "<end_of_turn>\n", with "assistant"
 *           written as "model". Gemma has no system turn: system messages are trimmed,
 *           concatenated (no separator) and put, followed by "\n\n", at the start of the next
 *           turn that is not the model's (a system message with no such turn after it is
 *           dropped). add_assistant: "<start_of_turn>model\n".
 *   llama3  "<|start_header_id|>" role "<|end_header_id|>\n\n" trim(content) "<|eot_id|>";
 *           add_assistant: "<|start_header_id|>assistant<|end_header_id|>\n\n".
 * trim() removes ASCII white space (space, \t, \n, \v, \f, \r) at both ends, nothing else.
 * No format writes the BOS token ("<bos>", "<|begin_of_text|>"): tokenizing the text with
 * LOOM_TOKENIZE_ADD_SPECIAL adds it once, as llama.cpp's own chat programs do.
 *
 * Detection follows llama.cpp's precedence between these markers and those of the formats loom
 * does not render, so a template llama.cpp reads as another format (phi-4's "<|im_sep|>" next
 * to "<|im_start|>", for instance) is reported as unsupported instead of rendered wrongly.
 *
 * Roles: "system", "user", "assistant", and "model" as a synonym of "assistant" (so chatml and
 * llama3 write "assistant" for it; llama.cpp would write "model" there). Any other role is
 * LOOM_ERR_INVALID_ARG, where llama.cpp would pass it through.
 *
 * Thread-safety: everything here is pure; any thread may call it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "loom.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

typedef enum loom__chat_kind {
    LOOM_CHAT_CHATML = 0,
    LOOM_CHAT_GEMMA = 1,
    LOOM_CHAT_LLAMA3 = 2,
} loom__chat_kind;

/* "chatml", "gemma" or "llama3"; "unknown" for values outside the enum. Static string. */
const char *loom__chat_kind_name(loom__chat_kind kind);

/* Recognises template text tmpl[0..len) (any bytes; a Jinja template or a format name such as
 * "chatml") by its turn markers. Errors: LOOM_ERR_UNSUPPORTED (no known format, or markers of
 * a format loom does not render; the message says what was found). */
loom_status loom__chat_detect_text(const char *tmpl, size_t len, loom__chat_kind *out);

/* The template of a model file: tokenizer.chat_template of g when present (detected as above),
 * otherwise by architecture name ("gemma3" → gemma, "qwen2" → chatml).
 * Errors: LOOM_ERR_UNSUPPORTED (the message names what the file has), LOOM_ERR_BAD_MODEL
 * (tokenizer.chat_template is not a string). */
loom_status loom__chat_detect_gguf(const loom__gguf *g, const char *arch_name,
                                   loom__chat_kind *out);

/* Renders msgs[0..n) (msgs may be NULL when n is 0) in format kind. Writes at most cap bytes to
 * out (no NUL; out may be NULL when cap is 0) and sets *n_out to the length of the whole text.
 * Every message is checked before anything is written.
 * Errors: LOOM_ERR_INVALID_ARG (NULL role or content, unknown role, unknown kind; the message
 *   gives the message index), LOOM_ERR_BUFFER_TOO_SMALL (*n_out > cap; out holds the first cap
 *   bytes). */
loom_status loom__chat_render(loom__chat_kind kind, const loom_chat_message *msgs, size_t n,
                              bool add_assistant, char *out, size_t cap, size_t *n_out);

/* loom__chat_render that also gives where each message's content went: spans[0 .. *n_spans)
 * (spans has room for n; a content rendered empty has none), the ranges of the text that came
 * from the messages rather than from the template (for loom__tokenizer_encode_guarded). */
loom_status loom__chat_render_spans(loom__chat_kind kind, const loom_chat_message *msgs, size_t n,
                                    bool add_assistant, char *out, size_t cap, size_t *n_out,
                                    loom__text_range *spans, size_t *n_spans);
