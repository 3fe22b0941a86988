/* chat.c — chat template detection (by turn markers, in llama.cpp's precedence) and rendering of
 * the chatml, gemma and llama3 formats; chat.h describes the formats and the rules. */
#include "tokenizer/chat.h"

#include <stdint.h>
#include <string.h>

#include "core/status.h"

const char *loom__chat_kind_name(loom__chat_kind kind) {
    switch (kind) {
    case LOOM_CHAT_CHATML:
        return "chatml";
    case LOOM_CHAT_GEMMA:
        return "gemma";
    case LOOM_CHAT_LLAMA3:
        return "llama3";
    }
    return "unknown";
}

/* ---- detection ------------------------------------------------------------------------------ */

/* hay[0..n) contains the NUL-terminated needle (hay may hold any bytes, NUL included). */
static bool contains(const char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (k == 0) return true;
    if (k > n) return false;
    for (size_t i = 0; i + k <= n; i++) {
        if (hay[i] == needle[0] && memcmp(hay + i, needle, k) == 0) return true;
    }
    return false;
}

enum { KIND_OTHER = -1 }; /* a format loom recognises but does not render */

/* One detection rule: the template has every marker (the second may be NULL), or, with
 * at_start, begins with the first. The first rule that matches decides. */
typedef struct chat_rule {
    const char *marker[2];
    bool at_start;
    int kind; /* a loom__chat_kind, or KIND_OTHER */
    const char *format;
} chat_rule;

/* The order is llama.cpp's: a template carrying markers of two formats is read as the format
 * whose rule comes first there. Formats llama.cpp checks after llama3 cannot change the
 * outcome for templates the three rendered formats' rules accept, so they are not listed. */
static const chat_rule chat_rules[] = {
    {{"<|im_start|>", "<|im_sep|>"}, false, KIND_OTHER, "phi-4"},
    {{"<|im_start|>", "<end_of_utterance>"}, false, KIND_OTHER, "smolvlm"},
    {{"<|im_start|>", NULL}, false, LOOM_CHAT_CHATML, "chatml"},
    {{"mistral", NULL}, true, KIND_OTHER, "mistral"},
    {{"[INST]", NULL}, false, KIND_OTHER, "mistral / llama2 ([INST])"},
    {{"<|assistant|>", "<|end|>"}, false, KIND_OTHER, "phi-3"},
    {{"[gMASK]<sop>", NULL}, false, KIND_OTHER, "chatglm4"},
    {{"<|assistant|>", "<|user|>"}, false, KIND_OTHER, "falcon3 / glm-edge"},
    {{"<|{{ item['role'] }}|>", "<|begin_of_image|>"}, false, KIND_OTHER, "glm-edge"},
    {{"<|user|>", "<|endoftext|>"}, false, KIND_OTHER, "zephyr"},
    {{"bos_token + message['role']", NULL}, false, KIND_OTHER, "monarch"},
    {{"<start_of_turn>", NULL}, false, LOOM_CHAT_GEMMA, "gemma"},
    {{"'\\n\\nAssistant: ' + eos_token", NULL}, false, KIND_OTHER, "orion"},
    {{"GPT4 Correct ", NULL}, false, KIND_OTHER, "openchat"},
    {{"USER: ", "ASSISTANT: "}, false, KIND_OTHER, "vicuna"},
    {{"### Instruction:", "<|EOT|>"}, false, KIND_OTHER, "deepseek"},
    {{"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"}, false, KIND_OTHER, "command-r"},
    {{"<|start_header_id|>", "<|end_header_id|>"}, false, LOOM_CHAT_LLAMA3, "llama3"},
};

static bool rule_matches(const chat_rule *r, const char *t, size_t n) {
    if (r->at_start) {
        size_t k = strlen(r->marker[0]);
        return n >= k && memcmp(t, r->marker[0], k) == 0;
    }
    return contains(t, n, r->marker[0]) && (!r->marker[1] || contains(t, n, r->marker[1]));
}

/* The first bytes of t, printable ASCII only (others become '?'), for error messages. */
static void template_excerpt(const char *t, size_t n, char *buf, size_t cap) {
    size_t k = n < cap - 4 ? n : cap - 4;
    for (size_t i = 0; i < k; i++) {
        unsigned char c = (unsigned char)t[i];
        buf[i] = c >= 0x20 && c < 0x7F ? (char)c : '?';
    }
    if (k < n) {
        memcpy(buf + k, "...", 4);
    } else {
        buf[k] = '\0';
    }
}

loom_status loom__chat_detect_text(const char *tmpl, size_t len, loom__chat_kind *out) {
    LOOM_CHECK_ARG((tmpl != NULL || len == 0) && out != NULL);
    /* A format's own name, as llama.cpp accepts in place of a template. */
    static const loom__chat_kind named[] = {LOOM_CHAT_CHATML, LOOM_CHAT_GEMMA, LOOM_CHAT_LLAMA3};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        const char *name = loom__chat_kind_name(named[i]);
        if (len == strlen(name) && memcmp(tmpl, name, len) == 0) {
            *out = named[i];
            return LOOM_OK;
        }
    }
    for (size_t i = 0; i < sizeof chat_rules / sizeof chat_rules[0]; i++) {
        const chat_rule *r = &chat_rules[i];
        if (!rule_matches(r, tmpl, len)) continue;
        if (r->kind == KIND_OTHER) {
            return loom__fail(LOOM_ERR_UNSUPPORTED,
                              "chat template: looks like the %s format (it has \"%s\"%s%s%s), "
                              "which loom does not render; known: chatml, gemma, llama3",
                              r->format, r->marker[0], r->marker[1] ? " and \"" : "",
                              r->marker[1] ? r->marker[1] : "", r->marker[1] ? "\"" : "");
        }
        *out = (loom__chat_kind)r->kind;
        return LOOM_OK;
    }
    char excerpt[64];
    template_excerpt(tmpl, len, excerpt, sizeof excerpt);
    return loom__fail(LOOM_ERR_UNSUPPORTED,
                      "chat template: none of the turn markers loom knows (<|im_start|>, "
                      "<start_of_turn>, <|start_header_id|>) in %zu bytes beginning \"%s\"",
                      len, excerpt);
}

loom_status loom__chat_detect_gguf(const loom__gguf *g, const char *arch_name,
                                   loom__chat_kind *out) {
    LOOM_CHECK_ARG(g != NULL && arch_name != NULL && out != NULL);
    const loom__gguf_kv *kv = loom__gguf_find_kv(g, "tokenizer.chat_template");
    if (kv) {
        LOOM_RETURN_IF(kv->value.type != LOOM_GGUF_STR, LOOM_ERR_BAD_MODEL,
                       "tokenizer.chat_template: expected a string, found %s",
                       loom__gguf_vtype_name(kv->value.type));
        loom_status st = loom__chat_detect_text(kv->value.str.ptr, (size_t)kv->value.str.len, out);
        if (st != LOOM_OK) loom__error_prefix("tokenizer.chat_template");
        return st;
    }
    if (strcmp(arch_name, "gemma3") == 0) {
        *out = LOOM_CHAT_GEMMA;
        return LOOM_OK;
    }
    if (strcmp(arch_name, "qwen2") == 0) {
        *out = LOOM_CHAT_CHATML;
        return LOOM_OK;
    }
    return loom__fail(LOOM_ERR_UNSUPPORTED,
                      "chat template: the file has no tokenizer.chat_template and architecture "
                      "'%s' has no default one (gemma3 and qwen2 do)",
                      arch_name);
}

/* ---- rendering ------------------------------------------------------------------------------ */

typedef enum chat_role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } chat_role;

static bool parse_role(const char *s, chat_role *out) {
    if (strcmp(s, "system") == 0) {
        *out = ROLE_SYSTEM;
    } else if (strcmp(s, "user") == 0) {
        *out = ROLE_USER;
    } else if (strcmp(s, "assistant") == 0 || strcmp(s, "model") == 0) {
        *out = ROLE_ASSISTANT;
    } else {
        return false;
    }
    return true;
}

static const char *role_text(chat_role r) {
    return r == ROLE_SYSTEM ? "system" : r == ROLE_USER ? "user" : "assistant";
}

/* The output: bytes beyond cap are counted, not written. */
typedef struct chat_out {
    char *buf;
    size_t cap;
    size_t n;                /* bytes of the whole text so far */
    bool overflow;           /* the text is longer than SIZE_MAX */
    loom__text_range *spans; /* NULL, or where each message content went (room for all) */
    size_t n_spans;
} chat_out;

static void put_n(chat_out *o, const char *s, size_t len) {
    if (len > SIZE_MAX - o->n) {
        o->overflow = true;
        return;
    }
    if (o->n < o->cap) {
        size_t k = o->cap - o->n < len ? o->cap - o->n : len;
        memcpy(o->buf + o->n, s, k);
    }
    o->n += len;
}

static void put(chat_out *o, const char *s) {
    put_n(o, s, strlen(s));
}

static bool is_ascii_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* s without ASCII white space at either end: s[*start .. *start + *len). */
static void trimmed(const char *s, size_t *start, size_t *len) {
    size_t a = 0, b = strlen(s);
    while (a < b && is_ascii_space(s[a])) a++;
    while (b > a && is_ascii_space(s[b - 1])) b--;
    *start = a;
    *len = b - a;
}

/* A message's content: the caller's text inside the template's, noted in o->spans. */
static void put_content_n(chat_out *o, const char *s, size_t len) {
    size_t begin = o->n;
    put_n(o, s, len);
    if (o->spans && len > 0) o->spans[o->n_spans++] = (loom__text_range){begin, o->n};
}

static void put_trimmed(chat_out *o, const char *s) {
    size_t a, len;
    trimmed(s, &a, &len);
    put_content_n(o, s + a, len);
}

/* The role of message i (checked before rendering started). */
static chat_role role_at(const loom_chat_message *msgs, size_t i) {
    chat_role r = ROLE_USER;
    (void)parse_role(msgs[i].role, &r);
    return r;
}

static void render_chatml(chat_out *o, const loom_chat_message *msgs, size_t n,
                          bool add_assistant) {
    for (size_t i = 0; i < n; i++) {
        put(o, "<|im_start|>");
        put(o, role_text(role_at(msgs, i)));
        put(o, "\n");
        put_content_n(o, msgs[i].content, strlen(msgs[i].content));
        put(o, "<|im_end|>\n");
    }
    if (add_assistant) put(o, "<|im_start|>assistant\n");
}

static void render_llama3(chat_out *o, const loom_chat_message *msgs, size_t n,
                          bool add_assistant) {
    for (size_t i = 0; i < n; i++) {
        put(o, "<|start_header_id|>");
        put(o, role_text(role_at(msgs, i)));
        put(o, "<|end_header_id|>\n\n");
        put_trimmed(o, msgs[i].content);
        put(o, "<|eot_id|>");
    }
    if (add_assistant) put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_gemma(chat_out *o, const loom_chat_message *msgs, size_t n, bool add_assistant) {
    /* System text waiting for the next user turn: the system messages from pending_from on
     * (those whose trimmed content is empty add nothing). */
    bool pending = false;
    size_t pending_from = 0;
    for (size_t i = 0; i < n; i++) {
        chat_role r = role_at(msgs, i);
        if (r == ROLE_SYSTEM) {
            size_t a, len;
            trimmed(msgs[i].content, &a, &len);
            if (!pending && len > 0) {
                pending = true;
                pending_from = i;
            }
            continue;
        }
        put(o, "<start_of_turn>");
        put(o, r == ROLE_ASSISTANT ? "model" : "user");
        put(o, "\n");
        if (pending && r == ROLE_USER) {
            for (size_t j = pending_from; j < i; j++) {
                if (role_at(msgs, j) == ROLE_SYSTEM) put_trimmed(o, msgs[j].content);
            }
            put(o, "\n\n");
            pending = false;
        }
        put_trimmed(o, msgs[i].content);
        put(o, "<end_of_turn>\n");
    }
    if (add_assistant) put(o, "<start_of_turn>model\n");
}

static loom_status check_message(const loom_chat_message *msgs, size_t i) {
    chat_role role;
    LOOM_RETURN_IF(!msgs[i].role, LOOM_ERR_INVALID_ARG, "chat: message %zu has a NULL role", i);
    LOOM_RETURN_IF(!msgs[i].content, LOOM_ERR_INVALID_ARG, "chat: message %zu has NULL content", i);
    LOOM_RETURN_IF(!parse_role(msgs[i].role, &role), LOOM_ERR_INVALID_ARG,
                   "chat: message %zu: unknown role \"%.40s\" (expected system, user, assistant "
                   "or model)",
                   i, msgs[i].role);
    return LOOM_OK;
}

loom_status loom__chat_render(loom__chat_kind kind, const loom_chat_message *msgs, size_t n,
                              bool add_assistant, char *out, size_t cap, size_t *n_out) {
    return loom__chat_render_spans(kind, msgs, n, add_assistant, out, cap, n_out, NULL, NULL);
}

loom_status loom__chat_render_spans(loom__chat_kind kind, const loom_chat_message *msgs, size_t n,
                                    bool add_assistant, char *out, size_t cap, size_t *n_out,
                                    loom__text_range *spans, size_t *n_spans) {
    LOOM_CHECK_ARG(n_out != NULL);
    LOOM_CHECK_ARG(spans == NULL || n_spans != NULL);
    LOOM_CHECK_ARG(msgs != NULL || n == 0);
    LOOM_CHECK_ARG(out != NULL || cap == 0);
    for (size_t i = 0; i < n; i++) LOOM_TRY(check_message(msgs, i));

    chat_out o = {.buf = out, .cap = cap, .n = 0, .overflow = false, .spans = spans};
    switch (kind) {
    case LOOM_CHAT_CHATML:
        render_chatml(&o, msgs, n, add_assistant);
        break;
    case LOOM_CHAT_GEMMA:
        render_gemma(&o, msgs, n, add_assistant);
        break;
    case LOOM_CHAT_LLAMA3:
        render_llama3(&o, msgs, n, add_assistant);
        break;
    default:
        return loom__fail(LOOM_ERR_INVALID_ARG, "chat: unknown template kind %d", (int)kind);
    }
    LOOM_RETURN_IF(o.overflow, LOOM_ERR_INVALID_ARG, "chat: the rendered text exceeds SIZE_MAX");
    *n_out = o.n;
    if (n_spans) *n_spans = o.n_spans;
    LOOM_RETURN_IF(o.n > cap, LOOM_ERR_BUFFER_TOO_SMALL,
                   "chat: the text needs %zu bytes, the buffer holds %zu", o.n, cap);
    return LOOM_OK;
}
