/* tokenizer_encode.c — text to token ids: UTF-8 validation, cutting special tokens out of the
 * text, running the SentencePiece or BPE encoder on the pieces between them, BOS/EOS. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

/* A stretch of the input: a special token already recognised, or text still to encode. */
typedef struct frag {
    int32_t id; /* the special token, or -1 for text */
    size_t off, len;
} frag;

typedef struct frag_list {
    frag *v;
    size_t n, cap;
} frag_list;

static loom_status frag_push(frag_list *l, frag f) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        frag *v = loom__realloc(l->v, cap * sizeof *v);
        LOOM_RETURN_IF(!v, LOOM_ERR_OUT_OF_MEMORY, "tokenize: out of memory");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = f;
    return LOOM_OK;
}

/* Text the caller marked as not theirs: a match there is not a special token. */
typedef struct guard {
    const loom__text_range *plain;
    size_t n_plain;
} guard;

static bool guarded(const guard *g, size_t at, size_t len) {
    for (size_t i = 0; g && i < g->n_plain; i++) {
        if (at < g->plain[i].end && at + len > g->plain[i].begin) return true;
    }
    return false;
}

/* Cuts every occurrence of token id out of the text fragments of *cur (left to right in each),
 * writing the result to *nxt; *found tells whether there was any. An occurrence that overlaps
 * a range of g (NULL: none) stays text. */
static loom_status cut_token(const char *text, const char *tok, size_t tok_len, int32_t id,
                             const guard *g, const frag_list *cur, frag_list *nxt, bool *found) {
    nxt->n = 0;
    *found = false;
    for (size_t i = 0; i < cur->n; i++) {
        frag f = cur->v[i];
        if (f.id >= 0 || f.len < tok_len) {
            LOOM_TRY(frag_push(nxt, f));
            continue;
        }
        size_t off = f.off, end = f.off + f.len, from = off;
        for (;;) {
            const char *m = memmem(text + from, end - from, tok, tok_len);
            if (!m) break;
            size_t at = (size_t)(m - text);
            if (guarded(g, at, tok_len)) {
                from = at + 1;
                continue;
            }
            *found = true;
            if (at > off) LOOM_TRY(frag_push(nxt, (frag){-1, off, at - off}));
            LOOM_TRY(frag_push(nxt, (frag){id, at, tok_len}));
            off = from = at + tok_len;
        }
        if (off < end) LOOM_TRY(frag_push(nxt, (frag){-1, off, end - off}));
    }
    return LOOM_OK;
}

/* Splits text into fragments: special tokens (longest first; control and unknown ones only
 * with parse_special, user-defined ones always) and the text between them. */
static loom_status partition(const loom__tokenizer *t, const char *text, size_t len,
                             bool parse_special, const guard *g, frag_list *out) {
    out->n = 0;
    if (len == 0) return LOOM_OK;
    LOOM_TRY(frag_push(out, (frag){-1, 0, len}));

    bool present[256] = {false}; /* bytes in the text: a token starting elsewhere can't match */
    for (size_t i = 0; i < len; i++) present[(unsigned char)text[i]] = true;

    frag_list other = {0};
    loom_status st = LOOM_OK;
    for (size_t k = 0; k < t->n_specials && st == LOOM_OK; k++) {
        int32_t id = t->specials[k];
        if (!parse_special && (t->attr[id] & (LOOM__ATTR_CONTROL | LOOM__ATTR_UNKNOWN))) continue;
        size_t tl;
        const char *tok = loom__tok_text(t, id, &tl);
        if (tl > len || !present[(unsigned char)tok[0]]) continue;
        bool found;
        /* the guard keeps control and unknown tokens out of the plain ranges; user-defined
         * ones are parsed everywhere, as without parse_special */
        const guard *gk = t->attr[id] & (LOOM__ATTR_CONTROL | LOOM__ATTR_UNKNOWN) ? g : NULL;
        st = cut_token(text, tok, tl, id, gk, out, &other, &found);
        if (st == LOOM_OK && found) { /* something was cut: adopt the new list */
            frag_list tmp = *out;
            *out = other;
            other = tmp;
        }
    }
    free(other.v);
    return st;
}

loom_status loom__tokenizer_encode(const loom__tokenizer *t, const char *text, size_t len,
                                   unsigned flags, loom_token *out, size_t cap, size_t *n_out) {
    return loom__tokenizer_encode_guarded(t, text, len, flags, NULL, 0, out, cap, n_out);
}

loom_status loom__tokenizer_encode_guarded(const loom__tokenizer *t, const char *text, size_t len,
                                           unsigned flags, const loom__text_range *plain,
                                           size_t n_plain, loom_token *out, size_t cap,
                                           size_t *n_out) {
    LOOM_CHECK_ARG(t != NULL && n_out != NULL);
    LOOM_CHECK_ARG(plain != NULL || n_plain == 0);
    LOOM_CHECK_ARG(text != NULL || len == 0);
    LOOM_CHECK_ARG(out != NULL || cap == 0);
    /* Symbol indices are int32 and each byte can grow to three when spaces are escaped. */
    LOOM_RETURN_IF(len > (size_t)INT32_MAX / 4, LOOM_ERR_BAD_INPUT,
                   "tokenize: text of %zu bytes is longer than the %d bytes loom accepts", len,
                   INT32_MAX / 4);
    size_t bad;
    LOOM_RETURN_IF(!loom__utf8_valid(text, len, &bad), LOOM_ERR_BAD_INPUT,
                   "tokenize: invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad,
                   (unsigned)(unsigned char)text[bad]);

    bool add_special = flags & LOOM_TOKENIZE_ADD_SPECIAL;
    frag_list frags = {0};
    loom__tokvec v = {0};
    guard g = {plain, n_plain};
    loom_status st =
        partition(t, text, len, flags & LOOM_TOKENIZE_PARSE_SPECIAL, n_plain ? &g : NULL, &frags);
    if (st == LOOM_OK && add_special && t->add_bos) st = loom__tokvec_push(&v, t->bos);

    /* SentencePiece: a text fragment at the start or right after a special token gets the
     * space prefix (the first word of a sentence is written "▁word" in the vocabulary). */
    bool after_special = true;
    for (size_t i = 0; i < frags.n && st == LOOM_OK; i++) {
        frag f = frags.v[i];
        if (f.id >= 0) {
            st = loom__tokvec_push(&v, f.id);
            after_special = true;
        } else if (t->kind == LOOM_TOKENIZER_SPM) {
            st = loom__spm_encode(t, text + f.off, f.len, t->add_space_prefix && after_special, &v);
            after_special = false;
        } else {
            st = loom__bpe_encode(t, text + f.off, f.len, &v);
        }
    }
    if (st == LOOM_OK && add_special && t->add_eos) st = loom__tokvec_push(&v, t->eos);
    free(frags.v);
    if (st != LOOM_OK) {
        free(v.ids);
        return st;
    }

    if (cap > 0 && v.n > 0) memcpy(out, v.ids, (v.n < cap ? v.n : cap) * sizeof *out);
    *n_out = v.n;
    free(v.ids);
    LOOM_RETURN_IF(v.n > cap, LOOM_ERR_BUFFER_TOO_SMALL,
                   "tokenize: the text needs %zu tokens, the buffer holds %zu", v.n, cap);
    return LOOM_OK;
}
