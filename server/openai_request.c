/* OpenAI request bodies (/v1/completions, /v1/chat/completions) -> srv_parsed: every field
 * checked for its type and range, the prompt tokenized (a completions prompt as raw text with
 * its control tokens parsed, as llama-server and vLLM do; chat messages through the model's
 * template by loom_chat_tokenize, where a message's text can never become a control token).
 * Unknown fields are ignored, as OpenAI's clients send fields servers may not know. */
#define _GNU_SOURCE

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

#define SRV_MAX_PROMPTS     16
#define SRV_MAX_STOP        16
#define SRV_MAX_STOP_LEN    512
#define SRV_MAX_STOP_TOKENS 64
#define SRV_MAX_MESSAGES    1024

/* ---- field access: absent and null are the same ------------------------------------------ */

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static bool bad(srv_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool bad(srv_error *e, const char *param, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_error_set(e, 400, "invalid_request_error", param, "%s", msg);
    return false;
}

/* A number in [lo, hi] (integer when asked); *given false and *out untouched when absent. */
static bool get_number(const cJSON *o, const char *name, double lo, double hi, bool integer,
                       double *out, srv_error *e) {
    const cJSON *v = field(o, name);
    if (!v) return true;
    if (!cJSON_IsNumber(v))
        return bad(e, name, "'%s' must be %s", name, integer ? "an integer" : "a number");
    double d = v->valuedouble;
    if (!isfinite(d)) return bad(e, name, "'%s' must be finite", name);
    if (integer && d != floor(d)) return bad(e, name, "'%s' must be an integer", name);
    if (d < lo || d > hi)
        return bad(e, name, "'%s' is %g; it must be in [%g, %g]", name, d, lo, hi);
    *out = d;
    return true;
}

static bool get_float(const cJSON *o, const char *name, double lo, double hi, float *out,
                      srv_error *e) {
    double d = *out;
    if (!get_number(o, name, lo, hi, false, &d, e)) return false;
    *out = (float)d;
    return true;
}

static bool get_int(const cJSON *o, const char *name, double lo, double hi, int32_t *out,
                    srv_error *e) {
    double d = *out;
    if (!get_number(o, name, lo, hi, true, &d, e)) return false;
    *out = (int32_t)d;
    return true;
}

static bool get_bool(const cJSON *o, const char *name, bool *out, srv_error *e) {
    const cJSON *v = field(o, name);
    if (!v) return true;
    if (!cJSON_IsBool(v)) return bad(e, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return true;
}

/* ---- prompts ------------------------------------------------------------------------------- */

static bool tokenize_text(srv *s, const char *text, srv_prompt *out, srv_error *e,
                          const char *param) {
    size_t len = strlen(text), need = 0;
    unsigned flags = LOOM_TOKENIZE_ADD_SPECIAL | LOOM_TOKENIZE_PARSE_SPECIAL;
    loom_status st = loom_tokenize(s->model, text, len, flags, NULL, 0, &need);
    if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL)
        return bad(e, param, "%s: %s", param, loom_last_error());
    out->tokens = malloc((need ? need : 1) * sizeof *out->tokens);
    if (!out->tokens) {
        srv_error_set(e, 503, "server_error", "", "out of memory tokenizing the prompt");
        return false;
    }
    st = loom_tokenize(s->model, text, len, flags, out->tokens, need, &out->n_tokens);
    if (st != LOOM_OK) return bad(e, param, "%s: %s", param, loom_last_error());
    return true;
}

static bool token_list(srv *s, const cJSON *arr, srv_prompt *out, srv_error *e, const char *param) {
    int n = cJSON_GetArraySize(arr);
    out->tokens = malloc((size_t)(n ? n : 1) * sizeof *out->tokens);
    if (!out->tokens) {
        srv_error_set(e, 503, "server_error", "", "out of memory");
        return false;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, arr) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble >= s->n_vocab)
            return bad(e, param, "'%s' token ids must be integers in [0, %d)", param, s->n_vocab);
        out->tokens[out->n_tokens++] = (loom_token)t->valuedouble;
    }
    return true;
}

static bool completions_prompt(srv *s, const cJSON *body, srv_parsed *p, srv_error *e) {
    const cJSON *v = field(body, "prompt");
    if (!v) return bad(e, "prompt", "'prompt' is required");
    p->prompts = calloc(SRV_MAX_PROMPTS, sizeof *p->prompts);
    if (!p->prompts) {
        srv_error_set(e, 503, "server_error", "", "out of memory");
        return false;
    }
    if (cJSON_IsString(v)) {
        p->n_prompts = 1;
        return tokenize_text(s, v->valuestring, &p->prompts[0], e, "prompt");
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return bad(e, "prompt",
                   "'prompt' must be a string, an array of strings, an array of "
                   "token ids or an array of such arrays (not empty)");
    const cJSON *first = cJSON_GetArrayItem(v, 0);
    if (cJSON_IsNumber(first)) {
        p->n_prompts = 1;
        return token_list(s, v, &p->prompts[0], e, "prompt");
    }
    if (cJSON_GetArraySize(v) > SRV_MAX_PROMPTS)
        return bad(e, "prompt", "at most %d prompts in one request", SRV_MAX_PROMPTS);
    const cJSON *item;
    cJSON_ArrayForEach(item, v) {
        srv_prompt *pr = &p->prompts[p->n_prompts++];
        if (cJSON_IsString(item)) {
            if (!tokenize_text(s, item->valuestring, pr, e, "prompt")) return false;
        } else if (cJSON_IsArray(item) && cJSON_GetArraySize(item) > 0 &&
                   cJSON_IsNumber(cJSON_GetArrayItem(item, 0))) {
            if (!token_list(s, item, pr, e, "prompt")) return false;
        } else {
            return bad(e, "prompt", "'prompt' items must all be strings or all token-id arrays");
        }
    }
    return true;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts (joined). */
static char *message_text(const cJSON *content, srv_error *e) {
    if (!content) return strdup("");
    if (cJSON_IsString(content)) return strdup(content->valuestring);
    if (!cJSON_IsArray(content)) {
        bad(e, "messages", "a message's 'content' must be a string or an array of text parts");
        return NULL;
    }
    srv_buf b = {0};
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = field(part, "type"), *text = field(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
            !cJSON_IsString(text)) {
            srv_buf_free(&b);
            bad(e, "messages",
                "content parts must be {\"type\": \"text\", \"text\": string} "
                "(this model takes text only)");
            return NULL;
        }
        srv_buf_puts(&b, text->valuestring);
    }
    srv_buf_put(&b, "", 1);
    if (b.failed) {
        srv_buf_free(&b);
        srv_error_set(e, 503, "server_error", "", "out of memory");
        return NULL;
    }
    return b.data;
}

static bool chat_prompt(srv *s, const cJSON *body, srv_parsed *p, srv_error *e) {
    const cJSON *msgs = field(body, "messages");
    if (!msgs) return bad(e, "messages", "'messages' is required");
    int n = cJSON_IsArray(msgs) ? cJSON_GetArraySize(msgs) : -1;
    if (n < 1 || n > SRV_MAX_MESSAGES)
        return bad(e, "messages", "'messages' must be an array of 1 to %d messages",
                   SRV_MAX_MESSAGES);
    loom_chat_message *cm = calloc((size_t)n, sizeof *cm);
    char **texts = calloc((size_t)n, sizeof *texts);
    p->prompts = calloc(1, sizeof *p->prompts);
    bool ok = cm && texts && p->prompts;
    if (!ok) srv_error_set(e, 503, "server_error", "", "out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (!ok) break;
        const cJSON *role = field(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            ok = bad(e, "messages", "messages[%d] must be an object with a string 'role'", i);
            break;
        }
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
            ok = bad(e, "messages",
                     "messages[%d]: role '%.40s' is not supported (system, "
                     "developer, user, assistant)",
                     i, role->valuestring);
            break;
        }
        texts[i] = message_text(field(m, "content"), e);
        if (!texts[i]) {
            ok = false;
            break;
        }
        cm[i].role = r;
        cm[i].content = texts[i];
        i++;
    }
    if (ok) {
        size_t need = 0;
        loom_status st = loom_chat_tokenize(s->model, cm, (size_t)n, true, NULL, 0, &need);
        if (st == LOOM_OK || st == LOOM_ERR_BUFFER_TOO_SMALL) {
            p->prompts[0].tokens = malloc((need ? need : 1) * sizeof(loom_token));
            st = p->prompts[0].tokens
                     ? loom_chat_tokenize(s->model, cm, (size_t)n, true, p->prompts[0].tokens, need,
                                          &p->prompts[0].n_tokens)
                     : LOOM_ERR_OUT_OF_MEMORY;
        }
        if (st == LOOM_ERR_OUT_OF_MEMORY) {
            srv_error_set(e, 503, "server_error", "", "out of memory");
            ok = false;
        } else if (st != LOOM_OK) {
            ok = bad(e, "messages", "messages: %s", loom_last_error());
        }
        p->n_prompts = 1;
    }
    for (int k = 0; texts && k < n; k++) free(texts[k]);
    free(texts);
    free(cm);
    return ok;
}

/* ---- sampling, stops, loom's fields -------------------------------------------------------- */

static bool logit_bias(srv *s, const cJSON *body, srv_parsed *p, srv_error *e) {
    const cJSON *v = field(body, "logit_bias");
    if (!v) return true;
    if (!cJSON_IsObject(v))
        return bad(e, "logit_bias", "'logit_bias' must be an object of token id -> bias");
    int n = cJSON_GetArraySize(v);
    if (n > 1024) return bad(e, "logit_bias", "at most 1024 'logit_bias' entries");
    p->logit_bias = calloc((size_t)(n ? n : 1), sizeof *p->logit_bias);
    if (!p->logit_bias) {
        srv_error_set(e, 503, "server_error", "", "out of memory");
        return false;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        char *end = NULL;
        long id = strtol(it->string, &end, 10);
        if (!*it->string || *end || id < 0 || id >= s->n_vocab)
            return bad(e, "logit_bias", "'logit_bias' key '%.40s' is not a token id in [0, %d)",
                       it->string, s->n_vocab);
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < -100 ||
            it->valuedouble > 100)
            return bad(e, "logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
        p->logit_bias[p->n_logit_bias].id = (loom_token)id;
        p->logit_bias[p->n_logit_bias].bias = (float)it->valuedouble;
        p->n_logit_bias++;
    }
    p->sampler.logit_bias = p->logit_bias;
    p->sampler.n_logit_bias = p->n_logit_bias;
    return true;
}

static bool stops(srv *s, const cJSON *body, srv_parsed *p, srv_error *e) {
    const cJSON *v = field(body, "stop");
    if (v) {
        int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
        if (n < 0 || n > SRV_MAX_STOP)
            return bad(e, "stop", "'stop' must be a string or an array of at most %d strings",
                       SRV_MAX_STOP);
        p->stop = calloc((size_t)(n ? n : 1), sizeof *p->stop);
        if (!p->stop) {
            srv_error_set(e, 503, "server_error", "", "out of memory");
            return false;
        }
        const cJSON *one[1] = {v};
        for (int i = 0; i < n; i++) {
            const cJSON *it = cJSON_IsString(v) ? one[0] : cJSON_GetArrayItem(v, i);
            if (!cJSON_IsString(it) || !*it->valuestring ||
                strlen(it->valuestring) > SRV_MAX_STOP_LEN)
                return bad(e, "stop", "'stop' strings must be non-empty, at most %d bytes",
                           SRV_MAX_STOP_LEN);
            p->stop[i] = strdup(it->valuestring);
            if (!p->stop[i]) {
                srv_error_set(e, 503, "server_error", "", "out of memory");
                return false;
            }
            p->n_stop++;
        }
    }
    v = field(body, "stop_token_ids");
    if (v) {
        int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
        if (n < 0 || n > SRV_MAX_STOP_TOKENS)
            return bad(e, "stop_token_ids", "'stop_token_ids' must be an array of at most %d ids",
                       SRV_MAX_STOP_TOKENS);
        srv_prompt ids = {0};
        if (!token_list(s, v, &ids, e, "stop_token_ids")) {
            free(ids.tokens);
            return false;
        }
        p->stop_tokens = ids.tokens;
        p->n_stop_tokens = ids.n_tokens;
    }
    return true;
}

static bool entropy_fields(const cJSON *body, loom_sampler_params *sp, srv_error *e) {
    const cJSON *v = field(body, "entropy_mode");
    if (v) {
        static const char *const names[] = {"none", "exp", "edt", "dynatemp"};
        int mode = -1;
        for (int i = 0; i < 4 && cJSON_IsString(v); i++)
            if (!strcmp(v->valuestring, names[i])) mode = i;
        if (mode < 0)
            return bad(e, "entropy_mode", "'entropy_mode' must be none, exp, edt or dynatemp");
        sp->entropy_mode = (loom_entropy_mode)mode;
    }
    return get_float(body, "entropy_beta", 0, 1e6, &sp->exp_beta, e) &&
           get_float(body, "edt_n", 1e-9, 1, &sp->edt_n, e) &&
           get_float(body, "edt_theta", 0, 1e6, &sp->edt_theta, e) &&
           get_float(body, "edt_h_min", 1e-9, 1e6, &sp->edt_h_min, e) &&
           get_float(body, "dynatemp_min", 0, 1e6, &sp->dyn_t_min, e) &&
           get_float(body, "dynatemp_max", 0, 1e6, &sp->dyn_t_max, e) &&
           get_float(body, "dynatemp_exponent", 0, 1e6, &sp->dyn_exponent, e);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static uint64_t random_seed(void) {
    uint64_t x = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&x, sizeof x, 1, f) != 1) x = 0;
        fclose(f);
    }
    return x ^ (uint64_t)(loom_engine_now() * 1e9);
}

static bool sampling(srv *s, const cJSON *body, srv_parsed *p, srv_error *e) {
    loom_sampler_params *sp = &p->sampler;
    *sp = loom_sampler_default_params();
    /* OpenAI's defaults, not loom's: temperature 1, nucleus and top-k off */
    sp->temperature = 1.0f;
    sp->top_p = 1.0f;
    sp->top_k = 0;
    double seed = -1;
    if (!get_float(body, "temperature", 0, 2, &sp->temperature, e) ||
        !get_float(body, "top_p", 1e-9, 1, &sp->top_p, e) ||
        !get_int(body, "top_k", -1, s->n_vocab, &sp->top_k, e) ||
        !get_float(body, "min_p", 0, 1, &sp->min_p, e) ||
        !get_float(body, "typical_p", 1e-9, 1, &sp->typical_p, e) ||
        !get_float(body, "presence_penalty", -2, 2, &sp->presence_penalty, e) ||
        !get_float(body, "frequency_penalty", -2, 2, &sp->frequency_penalty, e) ||
        !get_float(body, "repetition_penalty", 1e-6, 100, &sp->repeat_penalty, e) ||
        !get_int(body, "penalty_last_n", -1, 1 << 30, &sp->penalty_last_n, e) ||
        !get_number(body, "seed", -9.2e18, 1.8e19, true, &seed, e) || !entropy_fields(body, sp, e))
        return false;
    const cJSON *sv = field(body, "seed");
    sp->seed = sv ? (seed < 0 ? (uint64_t)(int64_t)seed : (uint64_t)seed) : random_seed();
    return logit_bias(s, body, p, e);
}

static bool logprob_fields(srv *s, const cJSON *body, srv_parsed *p, srv_error *e) {
    const cJSON *v = field(body, "logprobs");
    if (p->endpoint == SRV_COMPLETIONS) {
        /* completions: logprobs is the number of alternatives (0 .. max) */
        int32_t k = -1;
        if (v && !get_int(body, "logprobs", 0, s->max_logprobs, &k, e)) return false;
        p->logprobs = k >= 0;
        p->top_logprobs = k > 0 ? k : 0;
    } else {
        if (!get_bool(body, "logprobs", &p->logprobs, e)) return false;
        int32_t k = -1;
        if (!get_int(body, "top_logprobs", 0, s->max_logprobs, &k, e)) return false;
        if (k >= 0 && !p->logprobs)
            return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        p->top_logprobs = k > 0 ? k : 0;
    }
    p->sampler.n_logprobs = p->top_logprobs;
    return true;
}

static bool unsupported(const cJSON *body, srv_parsed *p, srv_error *e) {
    const cJSON *v;
    if ((v = field(body, "echo")) && !cJSON_IsFalse(v))
        return bad(e, "echo", "'echo' is not supported");
    if ((v = field(body, "suffix")) && !(cJSON_IsString(v) && !*v->valuestring))
        return bad(e, "suffix", "'suffix' is not supported");
    if (field(body, "tools") || field(body, "functions") || field(body, "tool_choice"))
        return bad(e, "tools", "tool calls are not supported");
    if ((v = field(body, "response_format"))) {
        const cJSON *t = field(v, "type");
        if (!cJSON_IsObject(v) || !cJSON_IsString(t) || strcmp(t->valuestring, "text"))
            return bad(e, "response_format", "only {\"type\": \"text\"} responses are supported");
    }
    double best_of = p->n;
    if (!get_number(body, "best_of", 1, 64, true, &best_of, e)) return false;
    if ((int32_t)best_of != p->n) return bad(e, "best_of", "'best_of' must equal 'n'");
    return true;
}

/* ---- the whole request ------------------------------------------------------------------- */

bool srv_parse_request(srv *s, srv_endpoint endpoint, const char *body_text, size_t len,
                       srv_parsed *p, srv_error *e) {
    memset(p, 0, sizeof *p);
    p->endpoint = endpoint;
    p->n = 1;
    if (len == 0) return bad(e, "", "the request body is empty: a JSON object is expected");
    const char *end = NULL;
    cJSON *body = cJSON_ParseWithLengthOpts(body_text, len, &end, false);
    if (!body) {
        size_t at = end && end >= body_text ? (size_t)(end - body_text) : 0;
        return bad(e, "", "the body is not valid JSON (at byte %zu)", at);
    }
    bool ok = false;
    if (!cJSON_IsObject(body)) {
        bad(e, "", "the body must be a JSON object");
        goto done;
    }
    const cJSON *model = field(body, "model");
    if (model && (!cJSON_IsString(model) || strcmp(model->valuestring, s->cfg.model_name))) {
        srv_error_set(e, 404, "invalid_request_error", "model",
                      "the model '%.80s' does not exist: this server serves '%s'",
                      cJSON_IsString(model) ? model->valuestring : "(not a string)",
                      s->cfg.model_name);
        e->code = "model_not_found";
        goto done;
    }
    double max_tokens = 0;
    if (!get_bool(body, "stream", &p->stream, e) ||
        !get_int(body, "n", 1, s->cfg.max_n, &p->n, e) ||
        !get_number(body, "max_tokens", 1, 1e9, true, &max_tokens, e) ||
        !get_number(body, "max_completion_tokens", 1, 1e9, true, &max_tokens, e) ||
        !unsupported(body, p, e))
        goto done;
    if (max_tokens > s->cfg.max_tokens_ceiling) {
        bad(e, field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
            "max_tokens %.0f is above this server's ceiling of %d", max_tokens,
            s->cfg.max_tokens_ceiling);
        goto done;
    }
    p->max_tokens = (int32_t)max_tokens;
    const cJSON *so = field(body, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) {
            bad(e, "stream_options", "'stream_options' must be an object");
            goto done;
        }
        if (!p->stream) {
            bad(e, "stream_options", "'stream_options' is only allowed with 'stream': true");
            goto done;
        }
        if (!get_bool(so, "include_usage", &p->include_usage, e)) goto done;
    }
    double priority = 0, salt_num = 0;
    if (!sampling(s, body, p, e) || !logprob_fields(s, body, p, e) || !stops(s, body, p, e) ||
        !get_bool(body, "ignore_eos", &p->ignore_eos, e) ||
        !get_number(body, "priority", -1e6, 1e6, true, &priority, e) ||
        !get_number(body, "ttft_deadline_s", 0, 1e9, false, &p->ttft_deadline_s, e) ||
        !get_number(body, "tpot_deadline_s", 0, 1e9, false, &p->tpot_deadline_s, e))
        goto done;
    p->priority = -(int32_t)priority; /* vLLM's sense: a lower value is served first */
    const cJSON *salt = field(body, "cache_salt");
    if (salt) {
        if (cJSON_IsString(salt)) {
            p->cache_salt = fnv1a(salt->valuestring);
        } else if (get_number(body, "cache_salt", 0, 1.8e19, true, &salt_num, e)) {
            p->cache_salt = (uint64_t)salt_num;
        } else {
            goto done;
        }
    }
    ok = endpoint == SRV_CHAT ? chat_prompt(s, body, p, e) : completions_prompt(s, body, p, e);
    for (size_t i = 0; ok && i < p->n_prompts; i++)
        if (p->prompts[i].n_tokens == 0) ok = bad(e, "prompt", "the prompt is empty");
done:
    cJSON_Delete(body);
    return ok;
}

void srv_parsed_free(srv_parsed *p) {
    for (size_t i = 0; p->prompts && i < p->n_prompts; i++) free(p->prompts[i].tokens);
    free(p->prompts);
    for (size_t i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->stop);
    free(p->stop_tokens);
    free(p->logit_bias);
    memset(p, 0, sizeof *p);
}
