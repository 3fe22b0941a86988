/* tokenizer_bpe.c — byte-level BPE encoding of one text fragment (tokenizer model "gpt2").
 *
 * The pre-tokenizer splits the fragment into words. Each word's bytes are symbols (one GPT-2
 * alphabet character each, the form the vocabulary and merges are written in); the adjacent
 * pair with the lowest merge rank is merged, repeatedly (ties: leftmost), through a priority
 * queue. With ignore_merges (the Llama-3 family) a word that is itself a token is taken whole.
 * A leftover symbol that is no token is looked up byte by byte as llama.cpp does; in a proper
 * byte-level vocabulary that never happens, since all 256 alphabet characters are tokens. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "tokenizer/tokenizer_heap.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

typedef struct bpe_sym {
    int32_t id;   /* token of the symbol's text, or -1 */
    uint32_t len; /* bytes of the word it covers; 0 once merged into its left neighbour */
    int32_t prev, next;
} bpe_sym;

typedef struct bpe_scratch {
    uint32_t *cps;         /* [len] code points of the fragment */
    uint8_t *cats;         /* [len] their category flags */
    size_t *cp_off;        /* [len+1] byte offset of each code point */
    size_t *ends;          /* [len] word ends (code points) */
    size_t *tmp;           /* [len] pre-tokenizer scratch */
    bpe_sym *sym;          /* [longest word] symbols of the current word */
    char *enc;             /* [2 * longest word] a word in the byte alphabet */
    loom__merge_heap heap; /* reused from word to word */
} bpe_scratch;

static loom_status try_pair(const loom__tokenizer *t, const bpe_sym *sym, loom__merge_heap *h,
                            int32_t left, int32_t right) {
    if (left < 0 || right < 0 || sym[left].id < 0 || sym[right].id < 0) return LOOM_OK;
    const loom__merge *m = loom__pairmap_find(&t->merges, sym[left].id, sym[right].id);
    if (!m) return LOOM_OK;
    loom__merge_cand c = {(double)m->rank, left, right, m->merged, sym[left].len, sym[right].len};
    return loom__heap_push(h, c);
}

/* Encodes one word w[0..n) (n >= 1) and appends its ids. */
static loom_status encode_word(const loom__tokenizer *t, const unsigned char *w, size_t n,
                               bpe_scratch *sc, loom__tokvec *out) {
    if (t->ignore_merges) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += loom__utf8_put(loom__gpt2_byte_cp[w[i]], sc->enc + k);
        int32_t id = loom__textmap_find(&t->by_text, sc->enc, k);
        if (id >= 0) return loom__tokvec_push(out, id);
    }
    bpe_sym *sym = sc->sym;
    for (size_t i = 0; i < n; i++) {
        sym[i] = (bpe_sym){t->byte_sym[w[i]], 1, (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    }
    loom__merge_heap *h = &sc->heap;
    h->n = 0;
    for (size_t i = 1; i < n; i++) LOOM_TRY(try_pair(t, sym, h, (int32_t)i - 1, (int32_t)i));
    while (h->n > 0) {
        loom__merge_cand c = loom__heap_pop(h);
        bpe_sym *a = &sym[c.left], *b = &sym[c.right];
        if (a->len != c.llen || b->len != c.rlen) continue; /* stale */
        a->len += b->len;
        a->id = c.merged;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) sym[b->next].prev = c.left;
        LOOM_TRY(try_pair(t, sym, h, a->prev, c.left));
        LOOM_TRY(try_pair(t, sym, h, c.left, a->next));
    }
    size_t at = 0; /* byte offset of symbol i in the word */
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0) {
            LOOM_TRY(loom__tokvec_push(out, sym[i].id));
        } else {
            /* only unmerged single bytes have no token (merge results are tokens) */
            const int32_t *fb = t->byte_fb[w[at]];
            if (fb[0] >= 0) LOOM_TRY(loom__tokvec_push(out, fb[0]));
            if (fb[1] >= 0) LOOM_TRY(loom__tokvec_push(out, fb[1]));
        }
        at += sym[i].len;
    }
    return LOOM_OK;
}

static void free_scratch(bpe_scratch *sc) {
    free(sc->cps);
    free(sc->cats);
    free(sc->cp_off);
    free(sc->ends);
    free(sc->tmp);
    free(sc->sym);
    free(sc->enc);
    free(sc->heap.v);
}

loom_status loom__bpe_encode(const loom__tokenizer *t, const char *text, size_t len,
                             loom__tokvec *out) {
    if (len == 0) return LOOM_OK;
    bpe_scratch sc = {0};
    sc.cps = loom__malloc(len * sizeof *sc.cps);
    sc.cats = loom__malloc(len);
    sc.cp_off = loom__malloc((len + 1) * sizeof *sc.cp_off);
    sc.ends = loom__malloc(len * sizeof *sc.ends);
    sc.tmp = loom__malloc(len * sizeof *sc.tmp);
    if (!sc.cps || !sc.cats || !sc.cp_off || !sc.ends || !sc.tmp) {
        free_scratch(&sc);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "tokenize: out of memory (%zu bytes)", len);
    }
    size_t n_cp = 0;
    for (size_t i = 0; i < len;) {
        sc.cp_off[n_cp] = i;
        sc.cps[n_cp] = loom__utf8_next(text, &i);
        sc.cats[n_cp] = (uint8_t)loom__ucat(sc.cps[n_cp]);
        n_cp++;
    }
    sc.cp_off[n_cp] = len;

    size_t n_words = loom__pretok_split(t->pre, sc.cps, sc.cats, n_cp, sc.ends, sc.tmp);
    size_t longest = 0, start = 0;
    for (size_t w = 0; w < n_words; w++) {
        size_t bytes = sc.cp_off[sc.ends[w]] - sc.cp_off[start];
        if (bytes > longest) longest = bytes;
        start = sc.ends[w];
    }
    sc.sym = loom__malloc(longest * sizeof *sc.sym);
    sc.enc = loom__malloc(2 * longest);
    loom_status st = LOOM_OK;
    if (!sc.sym || !sc.enc) {
        st = loom__fail(LOOM_ERR_OUT_OF_MEMORY, "tokenize: out of memory (a %zu-byte word)",
                        longest);
    }
    start = 0;
    for (size_t w = 0; w < n_words && st == LOOM_OK; w++) {
        size_t b0 = sc.cp_off[start], b1 = sc.cp_off[sc.ends[w]];
        st = encode_word(t, (const unsigned char *)text + b0, b1 - b0, &sc, out);
        start = sc.ends[w];
    }
    free_scratch(&sc);
    return st;
}
