/* tokenizer_decode.c — token ids back to text. Each token's piece is computed once at load
 * (as llama.cpp caches them) and decoding concatenates pieces. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

/* ---- pieces ---------------------------------------------------------------------------------- */

typedef struct strbuf {
    char *p;
    size_t n, cap;
} strbuf;

static loom_status put(strbuf *b, const char *s, size_t len) {
    if (len == 0) return LOOM_OK;
    if (len > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->n < len) {
            LOOM_RETURN_IF(cap > SIZE_MAX / 2, LOOM_ERR_OUT_OF_MEMORY, "tokenizer: pieces too big");
            cap *= 2;
        }
        char *p = loom__realloc(b->p, cap);
        LOOM_RETURN_IF(!p, LOOM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory (%zu bytes)", cap);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    return LOOM_OK;
}

/* Lenient UTF-8 step for token texts (they are data, not validated input): a malformed
 * sequence gives U+FFFD and skips one byte, as llama.cpp reads them. */
static uint32_t next_cp_lenient(const char *s, size_t len, size_t *i) {
    size_t bad;
    size_t n = loom__utf8_seq_len((unsigned char)s[*i]);
    if (n > len - *i || !loom__utf8_valid(s + *i, n, &bad) ||
        ((unsigned char)s[*i] >= 0x80 && n == 1)) {
        (*i)++;
        return 0xFFFD;
    }
    return loom__utf8_next(s, i);
}

/* A byte-level BPE token's text back to bytes. A character outside the byte alphabet is
 * written as "[UNK_BYTE_0x<its utf-8 hex><the token's text>]", as llama.cpp writes it, when the
 * token holds one such character. llama.cpp repeats the whole text for every such character,
 * so a vocabulary of a few long tokens of them makes the piece table quadratic in the file's
 * size (a 104 KB file needed 3 GB); a token with several is written "[UNK_BYTE_0x<hex>]" per
 * character instead, which keeps the table within 19 bytes per byte of token text. Real
 * byte-level vocabularies hold no such character at all. */
static loom_status put_bpe_text(strbuf *b, const char *s, size_t len) {
    size_t n_unknown = 0;
    for (size_t i = 0; i < len && n_unknown < 2;) {
        if (loom__gpt2_byte_of(next_cp_lenient(s, len, &i)) < 0) n_unknown++;
    }
    for (size_t i = 0; i < len;) {
        uint32_t cp = next_cp_lenient(s, len, &i);
        int byte = loom__gpt2_byte_of(cp);
        if (byte >= 0) {
            char c = (char)byte;
            LOOM_TRY(put(b, &c, 1));
            continue;
        }
        char u[4], hex[3];
        size_t n = loom__utf8_put(cp, u);
        LOOM_TRY(put(b, "[UNK_BYTE_0x", 12));
        for (size_t k = 0; k < n; k++) {
            snprintf(hex, sizeof hex, "%02x", (unsigned char)u[k]);
            LOOM_TRY(put(b, hex, 2));
        }
        if (n_unknown == 1) LOOM_TRY(put(b, s, len));
        LOOM_TRY(put(b, "]", 1));
    }
    return LOOM_OK;
}

/* A SentencePiece token's text with U+2581 turned back into spaces. */
static loom_status put_spm_text(strbuf *b, const char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        const char *m = len - i >= 3 ? memmem(s + i, len - i, "\xe2\x96\x81", 3) : NULL;
        size_t upto = m ? (size_t)(m - s) : len;
        LOOM_TRY(put(b, s + i, upto - i));
        if (!m) break;
        LOOM_TRY(put(b, " ", 1));
        i = upto + 3;
    }
    return LOOM_OK;
}

static int hex_val(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return c - 'A' + 10;
}

static loom_status put_piece(const loom__tokenizer *t, int32_t id, strbuf *b) {
    size_t len;
    const char *s = loom__tok_text(t, id, &len);
    uint8_t a = t->attr[id];
    if (a & (LOOM__ATTR_UNKNOWN | LOOM__ATTR_CONTROL | LOOM__ATTR_USER_DEFINED)) {
        return put(b, s, len); /* shown as written (control ones only when asked) */
    }
    if (a & LOOM__ATTR_NORMAL) {
        return t->kind == LOOM_TOKENIZER_SPM ? put_spm_text(b, s, len) : put_bpe_text(b, s, len);
    }
    if (a & LOOM__ATTR_BYTE) {
        char c = (char)(hex_val(s[3]) * 16 + hex_val(s[4])); /* "<0xHH>", checked at load */
        return put(b, &c, 1);
    }
    return LOOM_OK; /* unused and undefined tokens decode to nothing */
}

loom_status loom__tokenizer_build_pieces(loom__tokenizer *t) {
    strbuf b = {0};
    t->piece_off = loom__malloc(((size_t)t->n_vocab + 1) * sizeof *t->piece_off);
    LOOM_RETURN_IF(!t->piece_off, LOOM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->piece_off[i] = b.n;
        loom_status st = put_piece(t, i, &b);
        if (st != LOOM_OK) {
            free(b.p);
            return st;
        }
    }
    t->piece_off[t->n_vocab] = b.n;
    t->piece = b.p ? b.p : loom__malloc(1);
    LOOM_RETURN_IF(!t->piece, LOOM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    return LOOM_OK;
}

/* ---- decode ---------------------------------------------------------------------------------- */

/* The piece of id as flags show it. */
static const char *piece_of(const loom__tokenizer *t, int32_t id, unsigned flags, size_t *len) {
    if (!(flags & LOOM_DETOKENIZE_RENDER_SPECIAL) &&
        (t->attr[id] & (LOOM__ATTR_UNKNOWN | LOOM__ATTR_CONTROL))) {
        *len = 0;
        return t->piece;
    }
    *len = t->piece_off[id + 1] - t->piece_off[id];
    return t->piece + t->piece_off[id];
}

loom_status loom__tokenizer_decode(const loom__tokenizer *t, const loom_token *toks, size_t n,
                                   unsigned flags, char *out, size_t cap, size_t *n_out) {
    LOOM_CHECK_ARG(t != NULL && n_out != NULL);
    LOOM_CHECK_ARG(toks != NULL || n == 0);
    LOOM_CHECK_ARG(out != NULL || cap == 0);
    for (size_t i = 0; i < n; i++) {
        LOOM_RETURN_IF(toks[i] < 0 || toks[i] >= t->n_vocab, LOOM_ERR_BAD_INPUT,
                       "detokenize: token #%zu = %d is outside the vocabulary (%d tokens)", i,
                       (int)toks[i], (int)t->n_vocab);
    }
    /* The space prefix was added before the first text fragment: strip it from the first
     * token that is not a control/unknown token (so a leading BOS does not hide it). */
    bool strip = (flags & LOOM_DETOKENIZE_STRIP_LEADING) && t->add_space_prefix;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *p = piece_of(t, toks[i], flags, &len);
        if (strip && !(t->attr[toks[i]] & (LOOM__ATTR_UNKNOWN | LOOM__ATTR_CONTROL))) {
            if (len > 0 && p[0] == ' ') {
                p++;
                len--;
            }
            strip = false;
        }
        if (total < cap) {
            size_t room = cap - total;
            memcpy(out + total, p, len < room ? len : room);
        }
        total += len;
    }
    *n_out = total;
    LOOM_RETURN_IF(total > cap, LOOM_ERR_BUFFER_TOO_SMALL,
                   "detokenize: the text needs %zu bytes, the buffer holds %zu", total, cap);
    return LOOM_OK;
}

loom_status loom__tokenizer_piece(const loom__tokenizer *t, loom_token id, unsigned flags,
                                  char *out, size_t cap, size_t *n_out) {
    LOOM_CHECK_ARG(t != NULL && n_out != NULL);
    LOOM_CHECK_ARG(out != NULL || cap == 0);
    LOOM_RETURN_IF(id < 0 || id >= t->n_vocab, LOOM_ERR_BAD_INPUT,
                   "token_to_piece: token %d is outside the vocabulary (%d tokens)", (int)id,
                   (int)t->n_vocab);
    size_t len;
    const char *p = piece_of(t, id, flags, &len);
    if (cap > 0) memcpy(out, p, len < cap ? len : cap);
    *n_out = len;
    LOOM_RETURN_IF(len > cap, LOOM_ERR_BUFFER_TOO_SMALL,
                   "token_to_piece: the piece needs %zu bytes, the buffer holds %zu", len, cap);
    return LOOM_OK;
}
