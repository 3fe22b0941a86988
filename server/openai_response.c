/* OpenAI response bodies from a job's event log: the whole response (non-streaming), the SSE
 * chunks of a stream, usage, error objects. Token strings in logprobs are the token's piece
 * with invalid UTF-8 replaced by U+FFFD (a piece may be part of a character); "bytes" gives the
 * exact bytes. loom adds "entropy" and "varentropy" (nats, of the model's distribution before
 * sampling) beside each token's logprob. */
#define _GNU_SOURCE

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* ---- a growable byte buffer ----------------------------------------------------------------- */

void srv_buf_put(srv_buf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->failed = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void srv_buf_puts(srv_buf *b, const char *s) {
    srv_buf_put(b, s, strlen(s));
}

void srv_buf_printf(srv_buf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        srv_buf_put(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->failed = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    srv_buf_put(b, big, (size_t)n);
    free(big);
}

void srv_buf_free(srv_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* ---- errors ------------------------------------------------------------------------------------
 */

void srv_error_set(srv_error *err, int http, const char *type, const char *param, const char *fmt,
                   ...) {
    memset(err, 0, sizeof *err);
    err->http = http;
    err->type = type;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

void srv_error_from_status(srv_error *err, loom_status st) {
    const char *msg = loom_last_error();
    switch (st) {
    case LOOM_ERR_INVALID_ARG:
    case LOOM_ERR_BAD_INPUT:
        srv_error_set(err, 400, "invalid_request_error", "", "%s", msg);
        break;
    case LOOM_ERR_CONTEXT_FULL:
        srv_error_set(err, 400, "invalid_request_error", "messages", "%s", msg);
        err->code = "context_length_exceeded";
        break;
    case LOOM_ERR_OVERLOADED:
        srv_error_set(err, 429, "rate_limit_error", "ttft_deadline_s", "%s", msg);
        err->retry_after_s = 1;
        break;
    case LOOM_ERR_OUT_OF_MEMORY:
        srv_error_set(err, 503, "server_error", "", "%s", msg);
        err->retry_after_s = 1;
        break;
    default:
        srv_error_set(err, 500, "server_error", "", "%s: %s", loom_status_str(st), msg);
        break;
    }
}

char *srv_error_json(const srv_error *err) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    if (!e) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(e, "message", err->message);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "invalid_request_error");
    if (err->param[0])
        cJSON_AddStringToObject(e, "param", err->param);
    else
        cJSON_AddNullToObject(e, "param");
    if (err->code)
        cJSON_AddStringToObject(e, "code", err->code);
    else
        cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ---- token strings
 * ------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n), 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    unsigned cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < len; i++) cp = (cp << 6) | (s[i] & 0x3F);
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

static void utf8_clean(const char *in, size_t n, srv_buf *out) {
    const unsigned char *s = (const unsigned char *)in;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(s + i, n - i);
        if (k) {
            srv_buf_put(out, in + i, k);
            i += k;
        } else {
            srv_buf_put(out, "\xEF\xBF\xBD", 3);
            i++;
        }
    }
}

/* A token's piece: raw bytes into raw[], its cleaned text as a new cJSON string. */
static cJSON *token_string(const srv *s, loom_token t, char *raw, size_t cap, size_t *n_raw) {
    size_t n = 0;
    if (loom_token_to_piece(s->model, t, LOOM_DETOKENIZE_RENDER_SPECIAL, raw, cap, &n) != LOOM_OK)
        n = 0;
    if (n > cap) n = 0;
    *n_raw = n;
    srv_buf b = {0};
    utf8_clean(raw, n, &b);
    cJSON *j = cJSON_CreateString(b.data ? b.data : "");
    srv_buf_free(&b);
    return j;
}

static cJSON *byte_array(const char *raw, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)raw[i]));
    return a;
}

/* The text of token event e (job->text may still be NULL when no token had text). */
static const char *event_text(const srv_job *job, const srv_event *e) {
    return e->text_len ? job->text + e->text_off : "";
}

static cJSON *text_json(const srv_job *job, const srv_event *e) {
    srv_buf b = {0};
    srv_buf_put(&b, event_text(job, e), e->text_len);
    cJSON *j = cJSON_CreateString(b.data ? b.data : "");
    srv_buf_free(&b);
    return j;
}

/* ---- logprobs
 * ------------------------------------------------------------------------------------- */

/* A chat logprobs content entry for token event e. */
static cJSON *chat_logprob(const srv_job *job, const srv_event *e) {
    const srv *s = job->srv;
    char raw[256];
    size_t n;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "token", token_string(s, e->token, raw, sizeof raw, &n));
    cJSON_AddNumberToObject(o, "logprob", e->logprob);
    cJSON_AddItemToObject(o, "bytes", byte_array(raw, n));
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    for (int32_t i = 0; i < e->n_top; i++) {
        const loom_token_logprob *t = &job->top[e->top_off + (size_t)i];
        cJSON *a = cJSON_CreateObject();
        cJSON_AddItemToObject(a, "token", token_string(s, t->id, raw, sizeof raw, &n));
        cJSON_AddNumberToObject(a, "logprob", t->logprob);
        cJSON_AddItemToObject(a, "bytes", byte_array(raw, n));
        cJSON_AddItemToArray(top, a);
    }
    cJSON_AddNumberToObject(o, "entropy", e->entropy);
    cJSON_AddNumberToObject(o, "varentropy", e->varentropy);
    return o;
}

/* Completions logprobs: parallel arrays. */
typedef struct cmpl_logprobs {
    cJSON *obj, *tokens, *token_logprobs, *top_logprobs, *text_offset, *entropy, *varentropy;
} cmpl_logprobs;

static cmpl_logprobs cmpl_logprobs_new(void) {
    cmpl_logprobs l;
    l.obj = cJSON_CreateObject();
    l.tokens = cJSON_AddArrayToObject(l.obj, "tokens");
    l.token_logprobs = cJSON_AddArrayToObject(l.obj, "token_logprobs");
    l.top_logprobs = cJSON_AddArrayToObject(l.obj, "top_logprobs");
    l.text_offset = cJSON_AddArrayToObject(l.obj, "text_offset");
    l.entropy = cJSON_AddArrayToObject(l.obj, "entropy");
    l.varentropy = cJSON_AddArrayToObject(l.obj, "varentropy");
    return l;
}

static void cmpl_logprobs_add(const srv_job *job, const srv_event *e, cmpl_logprobs *l) {
    const srv *s = job->srv;
    char raw[256];
    size_t n;
    cJSON_AddItemToArray(l->tokens, token_string(s, e->token, raw, sizeof raw, &n));
    cJSON_AddItemToArray(l->token_logprobs, cJSON_CreateNumber(e->logprob));
    cJSON *top = cJSON_CreateObject();
    for (int32_t i = 0; i < e->n_top; i++) {
        const loom_token_logprob *t = &job->top[e->top_off + (size_t)i];
        cJSON *name = token_string(s, t->id, raw, sizeof raw, &n);
        /* two pieces may clean to the same text: the first (the likelier) stays */
        if (name && !cJSON_GetObjectItemCaseSensitive(top, name->valuestring))
            cJSON_AddNumberToObject(top, name->valuestring, t->logprob);
        cJSON_Delete(name);
    }
    cJSON_AddItemToArray(l->top_logprobs, top);
    cJSON_AddItemToArray(l->text_offset, cJSON_CreateNumber(e->choice_off));
    cJSON_AddItemToArray(l->entropy, cJSON_CreateNumber(e->entropy));
    cJSON_AddItemToArray(l->varentropy, cJSON_CreateNumber(e->varentropy));
}

/* ---- shared pieces
 * ---------------------------------------------------------------------------------- */

static const char *finish_reason(loom_finish_reason r) {
    switch (r) {
    case LOOM_FINISH_EOS:
    case LOOM_FINISH_STOP_TOKEN:
    case LOOM_FINISH_STOP_STRING:
        return "stop";
    case LOOM_FINISH_CANCELLED:
        return "abort";
    case LOOM_FINISH_LENGTH:
    case LOOM_FINISH_CONTEXT:
    default:
        return "length";
    }
}

static cJSON *envelope(const srv_job *job, const char *model_name, const char *object) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", job->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)job->created);
    cJSON_AddStringToObject(root, "model", model_name);
    return root;
}

static cJSON *usage_json(const srv_job *job) {
    int64_t prompt = 0, cached = 0;
    for (int32_t i = 0; i < job->n_subs; i++) prompt += job->subs[i].prompt_tokens;
    /* cached prompt tokens: sample 0's of each prompt (the samples share one prompt) */
    for (size_t i = 0; i < job->n_events; i++) {
        const srv_event *e = &job->events[i];
        if (e->kind == SRV_EV_END && e->choice % job->n == 0) cached += e->cached_tokens;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)job->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + job->completion_tokens));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    return u;
}

static char *print_and_free(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

/* ---- the whole response
 * ------------------------------------------------------------------------------ */

char *srv_response_full(srv_job *job, const char *model_name, srv_error *err) {
    pthread_mutex_lock(&job->mu);
    for (size_t i = 0; i < job->n_events; i++) {
        const srv_event *e = &job->events[i];
        if (e->kind == SRV_EV_END && e->status != LOOM_OK) {
            srv_error_set(err, 500, "server_error", "", "the engine failed the request: %s",
                          loom_status_str(e->status));
            pthread_mutex_unlock(&job->mu);
            return NULL;
        }
    }
    if (job->lost_events) {
        pthread_mutex_unlock(&job->mu);
        srv_error_set(err, 503, "server_error", "", "out of memory collecting the output");
        return NULL;
    }
    bool chat = job->endpoint == SRV_CHAT;
    cJSON *root = envelope(job, model_name, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (int32_t c = 0; c < job->n_choices; c++) {
        srv_buf text = {0};
        cmpl_logprobs cl = {0};
        cJSON *content = NULL;
        if (job->logprobs && !chat) cl = cmpl_logprobs_new();
        if (job->logprobs && chat) content = cJSON_CreateArray();
        loom_finish_reason reason = LOOM_FINISH_LENGTH;
        for (size_t i = 0; i < job->n_events; i++) {
            const srv_event *e = &job->events[i];
            if (e->choice != c) continue;
            if (e->kind == SRV_EV_END) {
                reason = e->reason;
                continue;
            }
            srv_buf_put(&text, event_text(job, e), e->text_len);
            if (cl.obj) cmpl_logprobs_add(job, e, &cl);
            if (content) cJSON_AddItemToArray(content, chat_logprob(job, e));
        }
        cJSON *choice = cJSON_CreateObject();
        cJSON_AddNumberToObject(choice, "index", c);
        if (chat) {
            cJSON *msg = cJSON_AddObjectToObject(choice, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            cJSON_AddStringToObject(msg, "content", text.data ? text.data : "");
            if (content) {
                cJSON *lp = cJSON_AddObjectToObject(choice, "logprobs");
                cJSON_AddItemToObject(lp, "content", content);
            } else {
                cJSON_AddNullToObject(choice, "logprobs");
            }
        } else {
            cJSON_AddStringToObject(choice, "text", text.data ? text.data : "");
            if (cl.obj)
                cJSON_AddItemToObject(choice, "logprobs", cl.obj);
            else
                cJSON_AddNullToObject(choice, "logprobs");
        }
        cJSON_AddStringToObject(choice, "finish_reason", finish_reason(reason));
        cJSON_AddItemToArray(choices, choice);
        bool failed = text.failed;
        srv_buf_free(&text);
        if (failed) {
            cJSON_Delete(root);
            root = NULL;
            break;
        }
    }
    if (root) cJSON_AddItemToObject(root, "usage", usage_json(job));
    pthread_mutex_unlock(&job->mu);
    char *s = print_and_free(root);
    if (!s) srv_error_set(err, 503, "server_error", "", "out of memory writing the response");
    return s;
}

/* ---- streaming
 * ------------------------------------------------------------------------------------------ */

static void sse(srv_buf *out, cJSON *root) {
    char *s = print_and_free(root);
    if (!s) {
        out->failed = true;
        return;
    }
    srv_buf_puts(out, "data: ");
    srv_buf_puts(out, s);
    srv_buf_puts(out, "\n\n");
    free(s);
}

void srv_response_chunks(srv_job *job, const char *model_name, size_t from, size_t to,
                         srv_buf *out) {
    bool chat = job->endpoint == SRV_CHAT;
    for (size_t i = from; i < to; i++) {
        const srv_event *e = &job->events[i];
        if (e->kind == SRV_EV_END && e->status != LOOM_OK) {
            srv_error err;
            srv_error_set(&err, 500, "server_error", "", "the engine failed the request: %s",
                          loom_status_str(e->status));
            char *s = srv_error_json(&err);
            if (s) {
                srv_buf_printf(out, "data: %s\n\n", s);
                free(s);
            }
            continue;
        }
        /* tokens without text (the end-of-turn token) are shown only with logprobs */
        if (e->kind == SRV_EV_TOKEN && e->text_len == 0 && !job->logprobs &&
            job->choices[e->choice].started)
            continue;
        cJSON *root = envelope(job, model_name, chat ? "chat.completion.chunk" : "text_completion");
        cJSON *choice = cJSON_CreateObject();
        cJSON_AddNumberToObject(choice, "index", e->choice);
        if (chat) {
            cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
            if (!job->choices[e->choice].started)
                cJSON_AddStringToObject(delta, "role", "assistant");
            if (e->kind == SRV_EV_TOKEN) cJSON_AddItemToObject(delta, "content", text_json(job, e));
            if (e->kind == SRV_EV_TOKEN && job->logprobs) {
                cJSON *lp = cJSON_AddObjectToObject(choice, "logprobs");
                cJSON *content = cJSON_AddArrayToObject(lp, "content");
                cJSON_AddItemToArray(content, chat_logprob(job, e));
            } else {
                cJSON_AddNullToObject(choice, "logprobs");
            }
        } else {
            if (e->kind == SRV_EV_TOKEN)
                cJSON_AddItemToObject(choice, "text", text_json(job, e));
            else
                cJSON_AddStringToObject(choice, "text", "");
            if (e->kind == SRV_EV_TOKEN && job->logprobs) {
                cmpl_logprobs cl = cmpl_logprobs_new();
                cmpl_logprobs_add(job, e, &cl);
                cJSON_AddItemToObject(choice, "logprobs", cl.obj);
            } else {
                cJSON_AddNullToObject(choice, "logprobs");
            }
        }
        if (e->kind == SRV_EV_END)
            cJSON_AddStringToObject(choice, "finish_reason", finish_reason(e->reason));
        else
            cJSON_AddNullToObject(choice, "finish_reason");
        job->choices[e->choice].started = true;
        cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), choice);
        sse(out, root);
    }
}

void srv_response_stream_end(srv_job *job, const char *model_name, bool include_usage,
                             srv_buf *out) {
    if (job->lost_events) {
        srv_error err;
        srv_error_set(&err, 503, "server_error", "", "out of memory: the output is incomplete");
        char *s = srv_error_json(&err);
        if (s) srv_buf_printf(out, "data: %s\n\n", s);
        free(s);
    }
    if (include_usage) {
        bool chat = job->endpoint == SRV_CHAT;
        cJSON *root = envelope(job, model_name, chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(root, "choices");
        cJSON_AddItemToObject(root, "usage", usage_json(job));
        sse(out, root);
    }
    srv_buf_puts(out, "data: [DONE]\n\n");
}
