/* tokenizer.c — building a tokenizer from a loom__tokenizer_spec: validation, defaults, the
 * copied vocabulary and its lookup tables; the small accessors. */
#include "tokenizer/tokenizer_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/log.h"
#include "core/status.h"
#include "tokenizer/unicode.h"

#define K_TOKENS "tokenizer.ggml.tokens"
#define K_SCORES "tokenizer.ggml.scores"
#define K_TYPES  "tokenizer.ggml.token_type"
#define K_MERGES "tokenizer.ggml.merges"

void loom__tokenizer_free(loom__tokenizer *t) {
    if (!t) return;
    free(t->text);
    free(t->text_off);
    free(t->piece);
    free(t->piece_off);
    free(t->scores);
    free(t->attr);
    free(t->specials);
    loom__textmap_free(&t->by_text);
    loom__pairmap_free(&t->merges);
    free(t);
}

/* ---- vocabulary ------------------------------------------------------------------------------ */

/* llama.cpp renames empty tokens "[EMPTY_<id>]" (an empty text would match everywhere as a
 * special token); loom keeps the same texts so ids line up. */
static size_t empty_name(char *buf, size_t cap, size_t id) {
    return (size_t)snprintf(buf, cap, "[EMPTY_%zu]", id);
}

static loom_status copy_texts(loom__tokenizer *t, const loom__tokenizer_spec *spec) {
    size_t n = spec->n_vocab, total = 0;
    char name[48];
    for (size_t i = 0; i < n; i++) {
        const loom__tokenizer_text *s = &spec->tokens[i];
        LOOM_RETURN_IF(s->len > 0 && !s->ptr, LOOM_ERR_INVALID_ARG, K_TOKENS "[%zu]: NULL text", i);
        size_t len = s->len ? s->len : empty_name(name, sizeof name, i);
        LOOM_RETURN_IF(loom__add_overflow_size(total, len, &total), LOOM_ERR_BAD_MODEL,
                       K_TOKENS ": total text size overflows");
    }
    t->text = loom__malloc(total ? total : 1);
    t->text_off = loom__malloc((n + 1) * sizeof *t->text_off);
    LOOM_RETURN_IF(!t->text || !t->text_off, LOOM_ERR_OUT_OF_MEMORY,
                   "tokenizer: out of memory (%zu bytes of token text)", total);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const loom__tokenizer_text *s = &spec->tokens[i];
        t->text_off[i] = at;
        if (s->len) {
            memcpy(t->text + at, s->ptr, s->len);
            at += s->len;
        } else {
            size_t len = empty_name(name, sizeof name, i);
            LOOM_LOG_W("tokenizer: token %zu is empty; named %s as llama.cpp does", i, name);
            memcpy(t->text + at, name, len);
            at += len;
        }
    }
    t->text_off[n] = at;
    return LOOM_OK;
}

static bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f');
}

static loom_status copy_scores_and_types(loom__tokenizer *t, const loom__tokenizer_spec *spec) {
    size_t n = spec->n_vocab;
    t->scores = loom__calloc(n, sizeof *t->scores);
    t->attr = loom__calloc(n, sizeof *t->attr);
    LOOM_RETURN_IF(!t->scores || !t->attr, LOOM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        if (spec->scores) {
            LOOM_RETURN_IF(isnan(spec->scores[i]), LOOM_ERR_BAD_MODEL, K_SCORES "[%zu] is NaN", i);
            t->scores[i] = spec->scores[i];
        }
        int32_t type = spec->types ? spec->types[i] : LOOM_TOKEN_TYPE_NORMAL;
        static const uint8_t k_attr[] = {
            [LOOM_TOKEN_TYPE_UNDEFINED] = 0,
            [LOOM_TOKEN_TYPE_NORMAL] = LOOM__ATTR_NORMAL,
            [LOOM_TOKEN_TYPE_UNKNOWN] = LOOM__ATTR_UNKNOWN,
            [LOOM_TOKEN_TYPE_CONTROL] = LOOM__ATTR_CONTROL,
            [LOOM_TOKEN_TYPE_USER_DEFINED] = LOOM__ATTR_USER_DEFINED,
            [LOOM_TOKEN_TYPE_UNUSED] = LOOM__ATTR_UNUSED,
            [LOOM_TOKEN_TYPE_BYTE] = LOOM__ATTR_BYTE,
        };
        LOOM_RETURN_IF(type < 0 || type > LOOM_TOKEN_TYPE_BYTE, LOOM_ERR_BAD_MODEL,
                       K_TYPES "[%zu] = %d is not a token type (0..6)", i, (int)type);
        t->attr[i] = k_attr[type];
        if (type == LOOM_TOKEN_TYPE_BYTE) {
            /* decoded as the byte its <0xHH> text names */
            size_t len;
            const char *s = loom__tok_text(t, (int32_t)i, &len);
            LOOM_RETURN_IF(len != 6 || memcmp(s, "<0x", 3) != 0 || !is_hex(s[3]) || !is_hex(s[4]) ||
                               s[5] != '>',
                           LOOM_ERR_BAD_MODEL, K_TYPES "[%zu]: byte token '%.*s' is not <0xHH>", i,
                           (int)(len > 16 ? 16 : len), s);
        }
    }
    return LOOM_OK;
}

static loom_status index_texts(loom__tokenizer *t) {
    LOOM_TRY(loom__textmap_init(&t->by_text, t->text, t->text_off, (size_t)t->n_vocab));
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int32_t dup = loom__textmap_add(&t->by_text, i);
        if (dup >= 0) {
            size_t len;
            const char *s = loom__tok_text(t, i, &len);
            return loom__fail(LOOM_ERR_BAD_MODEL, K_TOKENS ": token %d '%.*s' duplicates token %d",
                              (int)i, (int)(len > 64 ? 64 : len), s, (int)dup);
        }
    }
    return LOOM_OK;
}

/* ---- special ids and flags ------------------------------------------------------------------- */

/* A key's id if present (it must be in range), else def when def is in range, else -1. */
static loom_status resolve_id(const loom__tokenizer *t, loom__tokenizer_opt_id v, int64_t def,
                              const char *key, loom_token *out) {
    if (v.present) {
        LOOM_RETURN_IF(v.value < 0 || v.value >= t->n_vocab, LOOM_ERR_BAD_MODEL,
                       "tokenizer.ggml.%s = %lld is outside the vocabulary (%d tokens)", key,
                       (long long)v.value, (int)t->n_vocab);
        *out = (loom_token)v.value;
    } else {
        *out = (def >= 0 && def < t->n_vocab) ? (loom_token)def : -1;
    }
    return LOOM_OK;
}

static loom_status resolve_specials(loom__tokenizer *t, const loom__tokenizer_spec *spec,
                                    bool pre_add_bos) {
    bool spm = t->kind == LOOM_TOKENIZER_SPM;
    /* llama.cpp's defaults for files without the keys: LLaMA's <unk> <s> </s> = 0 1 2 for
     * SentencePiece; id 11 for BPE (a Falcon legacy; converted files carry the keys). */
    LOOM_TRY(resolve_id(t, spec->bos, spm ? 1 : 11, "bos_token_id", &t->bos));
    LOOM_TRY(resolve_id(t, spec->eos, spm ? 2 : 11, "eos_token_id", &t->eos));
    LOOM_TRY(resolve_id(t, spec->unk, spm ? 0 : -1, "unknown_token_id", &t->unk));
    LOOM_TRY(resolve_id(t, spec->pad, -1, "padding_token_id", &t->pad));
    LOOM_TRY(resolve_id(t, spec->eot, -1, "eot_token_id", &t->eot));
    LOOM_TRY(resolve_id(t, spec->eom, -1, "eom_token_id", &t->eom));

    t->add_bos = spec->add_bos.present ? spec->add_bos.value : (spm || pre_add_bos);
    t->add_eos = spec->add_eos.present ? spec->add_eos.value : false;
    /* The prefix only applies to SentencePiece; llama.cpp reads the key for BPE too but never
     * uses it there. */
    t->add_space_prefix =
        spm && (spec->add_space_prefix.present ? spec->add_space_prefix.value : true);
    if (t->add_bos && t->bos < 0) {
        LOOM_LOG_W("tokenizer: add_bos_token is set but there is no BOS token; not adding one");
        t->add_bos = false;
    }
    if (t->add_eos && t->eos < 0) {
        LOOM_LOG_W("tokenizer: add_eos_token is set but there is no EOS token; not adding one");
        t->add_eos = false;
    }
    return LOOM_OK;
}

/* ---- BPE merges ------------------------------------------------------------------------------ */

static loom_status read_merges(loom__tokenizer *t, const loom__tokenizer_spec *spec) {
    LOOM_RETURN_IF(!spec->has_merges, LOOM_ERR_BAD_MODEL,
                   K_MERGES " is required for a gpt2 (BPE) tokenizer");
    LOOM_RETURN_IF(spec->n_merges > INT32_MAX, LOOM_ERR_BAD_MODEL, K_MERGES ": %zu merges",
                   spec->n_merges);
    LOOM_RETURN_IF(spec->n_merges > 0 && !spec->merges, LOOM_ERR_INVALID_ARG,
                   "tokenizer: %zu merges but no array", spec->n_merges);
    LOOM_TRY(loom__pairmap_init(&t->merges, spec->n_merges));
    char *buf = NULL;
    size_t buf_cap = 0;
    loom_status st = LOOM_OK;
    for (size_t i = 0; i < spec->n_merges; i++) {
        const loom__tokenizer_text *m = &spec->merges[i];
        if (m->len > 0 && !m->ptr) {
            st = loom__fail(LOOM_ERR_INVALID_ARG, K_MERGES "[%zu]: NULL text", i);
            break;
        }
        /* "left right", split at the first space after the first byte (so a left part may be
         * a lone space, as llama.cpp reads it). */
        const char *sp = m->len > 1 ? memchr(m->ptr + 1, ' ', m->len - 1) : NULL;
        if (!sp || sp + 1 == m->ptr + m->len) {
            st = loom__fail(LOOM_ERR_BAD_MODEL, K_MERGES "[%zu] '%.*s' is not 'left right'", i,
                            (int)(m->len > 64 ? 64 : m->len), m->ptr ? m->ptr : "");
            break;
        }
        size_t ll = (size_t)(sp - m->ptr), rl = m->len - ll - 1;
        int32_t left = loom__textmap_find(&t->by_text, m->ptr, ll);
        int32_t right = loom__textmap_find(&t->by_text, sp + 1, rl);
        /* The merged text is the two parts without the space. */
        if (ll + rl > buf_cap) {
            char *nb = loom__realloc(buf, ll + rl);
            if (!nb) {
                st = loom__fail(LOOM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
                break;
            }
            buf = nb;
            buf_cap = ll + rl;
        }
        memcpy(buf, m->ptr, ll);
        memcpy(buf + ll, sp + 1, rl);
        int32_t merged = loom__textmap_find(&t->by_text, buf, ll + rl);
        if (left < 0 || right < 0 || merged < 0) {
            const char *what = left < 0 ? "left part" : right < 0 ? "right part" : "result";
            st = loom__fail(LOOM_ERR_BAD_MODEL, K_MERGES "[%zu] '%.*s': the %s is not a token", i,
                            (int)(m->len > 64 ? 64 : m->len), m->ptr, what);
            break;
        }
        loom__pairmap_add(&t->merges, left, right, (loom__merge){(int32_t)i, merged});
    }
    free(buf);
    return st;
}

/* ---- byte tables ----------------------------------------------------------------------------- */

static void build_byte_tables(loom__tokenizer *t) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char s[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        char one = (char)b;
        int32_t id = loom__textmap_find(&t->by_text, s, 6);
        t->byte_tok[b] = id >= 0 ? id : loom__textmap_find(&t->by_text, &one, 1);

        char u[4];
        size_t n = loom__utf8_put(loom__gpt2_byte_cp[b], u);
        t->byte_sym[b] = loom__textmap_find(&t->by_text, u, n);
        t->byte_fb[b][0] = loom__textmap_find(&t->by_text, &u[0], 1);
        t->byte_fb[b][1] = n > 1 ? loom__textmap_find(&t->by_text, &u[1], 1) : -1;
    }
}

/* ---- create ---------------------------------------------------------------------------------- */

static loom_status build(loom__tokenizer *t, const loom__tokenizer_spec *spec) {
    LOOM_RETURN_IF(spec->kind != LOOM_TOKENIZER_SPM && spec->kind != LOOM_TOKENIZER_BPE,
                   LOOM_ERR_INVALID_ARG, "tokenizer: unknown kind %d", (int)spec->kind);
    LOOM_RETURN_IF(spec->n_vocab == 0 || spec->n_vocab > INT32_MAX, LOOM_ERR_BAD_MODEL,
                   K_TOKENS ": %zu tokens (need 1..%d)", spec->n_vocab, INT32_MAX);
    LOOM_RETURN_IF(!spec->tokens, LOOM_ERR_INVALID_ARG, "tokenizer: no tokens");
    t->kind = spec->kind;
    t->n_vocab = (int32_t)spec->n_vocab;

    bool pre_add_bos = false;
    if (t->kind == LOOM_TOKENIZER_BPE) {
        const loom__pretok_name *pre = NULL;
        if (!spec->pre.ptr) {
            LOOM_LOG_W("tokenizer: tokenizer.ggml.pre is missing; using the 'default' "
                       "pre-tokenizer (the model may tokenize differently from its training)");
            pre = loom__pretok_find("default", 7);
        } else {
            pre = loom__pretok_find(spec->pre.ptr, spec->pre.len);
            LOOM_RETURN_IF(!pre, LOOM_ERR_UNSUPPORTED,
                           "tokenizer.ggml.pre '%.*s' is not a pre-tokenizer loom implements",
                           (int)(spec->pre.len > 64 ? 64 : spec->pre.len), spec->pre.ptr);
        }
        t->pre = pre->kind;
        t->ignore_merges = pre->ignore_merges;
        pre_add_bos = pre->add_bos;
    }

    LOOM_TRY(copy_texts(t, spec));
    LOOM_TRY(copy_scores_and_types(t, spec));
    LOOM_TRY(index_texts(t));
    LOOM_TRY(resolve_specials(t, spec, pre_add_bos));
    if (t->kind == LOOM_TOKENIZER_BPE) LOOM_TRY(read_merges(t, spec));
    build_byte_tables(t);
    LOOM_TRY(loom__tokenizer_find_specials(t, spec));
    LOOM_TRY(loom__tokenizer_build_pieces(t));
    return LOOM_OK;
}

loom_status loom__tokenizer_create(const loom__tokenizer_spec *spec, loom__tokenizer **out) {
    LOOM_CHECK_ARG(spec != NULL && out != NULL);
    loom__tokenizer *t = loom__calloc(1, sizeof *t);
    LOOM_RETURN_IF(!t, LOOM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    loom_status st = build(t, spec);
    if (st != LOOM_OK) {
        loom__tokenizer_free(t);
        return st;
    }
    *out = t;
    return LOOM_OK;
}

/* ---- accessors ------------------------------------------------------------------------------- */

int32_t loom__tokenizer_n_vocab(const loom__tokenizer *t) {
    return t ? t->n_vocab : 0;
}
loom_token loom__tokenizer_bos(const loom__tokenizer *t) {
    return t ? t->bos : -1;
}
loom_token loom__tokenizer_eos(const loom__tokenizer *t) {
    return t ? t->eos : -1;
}

bool loom__tokenizer_is_eog(const loom__tokenizer *t, loom_token id) {
    return t && id >= 0 && id < t->n_vocab && (t->attr[id] & LOOM__ATTR_EOG);
}

bool loom__tokenizer_is_control(const loom__tokenizer *t, loom_token id) {
    return t && id >= 0 && id < t->n_vocab && (t->attr[id] & LOOM__ATTR_CONTROL);
}

loom_status loom__tokvec_push(loom__tokvec *v, loom_token id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        loom_token *ids = loom__realloc(v->ids, cap * sizeof *ids);
        LOOM_RETURN_IF(!ids, LOOM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory (%zu ids)", cap);
        v->ids = ids;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return LOOM_OK;
}
