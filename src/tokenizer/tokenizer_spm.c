/* tokenizer_spm.c — SentencePiece-style encoding of one text fragment (tokenizer model "llama").
 *
 * Spaces become U+2581 ("▁"), with one more in front when a space prefix is asked for; the text
 * is cut into UTF-8 characters; then, repeatedly, the adjacent pair whose concatenation is the
 * vocabulary entry with the highest score is merged (ties: leftmost), until no adjacent pair
 * forms a vocabulary entry. Candidates sit in a priority queue and a merge only queues the two
 * new pairs it creates, so the whole is O(n log n). A leftover character that is not a token
 * falls back to its bytes' <0xXX> tokens (or to the unknown token when the vocabulary has no
 * byte tokens). */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "tokenizer/tokenizer_heap.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

typedef struct spm_sym {
    size_t start; /* byte offset into the escaped text */
    uint32_t len; /* bytes; 0 once merged into its left neighbour */
    int32_t prev, next;
} spm_sym;

typedef struct spm_state {
    const loom__tokenizer *t;
    const char *s; /* the escaped text */
    spm_sym *sym;
    loom__merge_heap heap;
} spm_state;

/* Queues (left, right) when their concatenation is a token. */
static loom_status try_pair(spm_state *st, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return LOOM_OK;
    const spm_sym *a = &st->sym[left], *b = &st->sym[right];
    int32_t id = loom__textmap_find(&st->t->by_text, st->s + a->start, (size_t)a->len + b->len);
    if (id < 0) return LOOM_OK;
    loom__merge_cand c = {-(double)st->t->scores[id], left, right, id, a->len, b->len};
    return loom__heap_push(&st->heap, c);
}

/* Appends the ids of one leftover symbol: its token, else its bytes' tokens, else <unk>. */
static loom_status emit_symbol(const loom__tokenizer *t, const char *s, size_t len,
                               loom__tokvec *out) {
    int32_t id = loom__textmap_find(&t->by_text, s, len);
    if (id >= 0) return loom__tokvec_push(out, id);
    bool all_bytes = true;
    for (size_t i = 0; i < len; i++) all_bytes = all_bytes && t->byte_tok[(unsigned char)s[i]] >= 0;
    if (all_bytes) {
        for (size_t i = 0; i < len; i++) {
            LOOM_TRY(loom__tokvec_push(out, t->byte_tok[(unsigned char)s[i]]));
        }
        return LOOM_OK;
    }
    /* llama.cpp has no answer here (it throws); SentencePiece without byte fallback emits the
     * unknown token per unknown character, and so does loom. */
    if (t->unk >= 0) return loom__tokvec_push(out, t->unk);
    size_t i = 0;
    return loom__fail(LOOM_ERR_BAD_INPUT,
                      "tokenize: character U+%04X has no token, no byte tokens and no unknown "
                      "token in this vocabulary",
                      (unsigned)loom__utf8_next(s, &i));
}

loom_status loom__spm_encode(const loom__tokenizer *t, const char *text, size_t len,
                             bool add_prefix, loom__tokvec *out) {
    /* Escape: every space (and the prefix) becomes the 3-byte U+2581. */
    size_t n_spaces = add_prefix, n_chars = add_prefix;
    for (size_t i = 0; i < len; i++) {
        n_spaces += text[i] == ' ';
        n_chars += ((unsigned char)text[i] & 0xC0) != 0x80; /* lead bytes (text is valid) */
    }
    size_t esc_len = len + add_prefix + 2 * n_spaces;
    char *s = loom__malloc(esc_len ? esc_len : 1);
    spm_sym *sym = loom__malloc((n_chars ? n_chars : 1) * sizeof *sym);
    spm_state ss = {t, s, sym, {NULL, 0, 0}};
    loom_status st = LOOM_OK;
    if (!s || !sym) {
        st = loom__fail(LOOM_ERR_OUT_OF_MEMORY, "tokenize: out of memory (%zu bytes)", esc_len);
        goto done;
    }
    size_t k = 0;
    if (add_prefix) memcpy(s + k, "\xe2\x96\x81", 3), k += 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s + k, "\xe2\x96\x81", 3);
            k += 3;
        } else {
            s[k++] = text[i];
        }
    }

    /* One symbol per character. */
    int32_t n_sym = 0;
    for (size_t i = 0; i < esc_len;) {
        size_t n = loom__utf8_seq_len((unsigned char)s[i]);
        sym[n_sym] = (spm_sym){i, (uint32_t)n, n_sym - 1, -1};
        if (n_sym > 0) sym[n_sym - 1].next = n_sym;
        n_sym++;
        i += n;
    }

    for (int32_t i = 1; i < n_sym && st == LOOM_OK; i++) st = try_pair(&ss, i - 1, i);
    while (st == LOOM_OK && ss.heap.n > 0) {
        loom__merge_cand c = loom__heap_pop(&ss.heap);
        spm_sym *a = &sym[c.left], *b = &sym[c.right];
        if (a->len != c.llen || b->len != c.rlen) continue; /* stale */
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) sym[b->next].prev = c.left;
        st = try_pair(&ss, a->prev, c.left);
        if (st == LOOM_OK) st = try_pair(&ss, c.left, a->next);
    }

    for (int32_t i = n_sym > 0 ? 0 : -1; i >= 0 && st == LOOM_OK; i = sym[i].next) {
        st = emit_symbol(t, s + sym[i].start, sym[i].len, out);
    }
done:
    free(s);
    free(sym);
    free(ss.heap.v);
    return st;
}
