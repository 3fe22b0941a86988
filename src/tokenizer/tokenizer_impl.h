/* tokenizer_impl.h — the tokenizer's internal state, shared by the tokenizer*.c files only. */
#pragma once

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_maps.h"
#include "tokenizer/tokenizer_pretok.h"

/* Token attributes (bit set; the first six are llama.cpp's attribute bits, kept so the rules
 * that test them read the same). */
enum {
    LOOM__ATTR_UNKNOWN = 1 << 0,
    LOOM__ATTR_UNUSED = 1 << 1,
    LOOM__ATTR_NORMAL = 1 << 2,
    LOOM__ATTR_CONTROL = 1 << 3,
    LOOM__ATTR_USER_DEFINED = 1 << 4,
    LOOM__ATTR_BYTE = 1 << 5,
    LOOM__ATTR_EOG = 1 << 6, /* ends generation (loom's own bit) */
};

struct loom__tokenizer {
    loom__tokenizer_kind kind;
    loom__pretok pre;      /* BPE only */
    bool ignore_merges;    /* BPE: a word that is itself a token is taken whole */
    bool add_bos, add_eos; /* what LOOM_TOKENIZE_ADD_SPECIAL adds */
    bool add_space_prefix; /* SPM: a space before each text fragment that starts the text or
                              follows a special token */
    int32_t n_vocab;
    loom_token bos, eos, unk, pad, eot, eom; /* -1 when absent */

    char *text;        /* token texts back to back */
    size_t *text_off;  /* [n_vocab+1]: token i is text[text_off[i] .. text_off[i+1]) */
    char *piece;       /* what each token decodes to (control tokens: their text) */
    size_t *piece_off; /* [n_vocab+1] */
    float *scores;     /* [n_vocab] SPM merge priority: higher merges first */
    uint8_t *attr;     /* [n_vocab] LOOM__ATTR_* */

    loom__textmap by_text; /* token text -> id */
    loom__pairmap merges;  /* BPE: (left, right) -> (rank, merged) */

    int32_t byte_tok[256];   /* SPM: token of byte b ("<0xBB>", else the 1-byte text), or -1 */
    int32_t byte_sym[256];   /* BPE: token of byte b's GPT-2 alphabet character, or -1 */
    int32_t byte_fb[256][2]; /* BPE: when that character is no token, llama.cpp looks up each
                                byte of its UTF-8 form as a 1-byte text: those ids, or -1 */

    int32_t *specials; /* [n_specials] control/user-defined/unknown ids, longest text first */
    size_t n_specials;
};

/* Text of token id. */
static inline const char *loom__tok_text(const loom__tokenizer *t, int32_t id, size_t *len) {
    *len = t->text_off[id + 1] - t->text_off[id];
    return t->text + t->text_off[id];
}

/* A growable list of token ids (encode's output). */
typedef struct loom__tokvec {
    loom_token *ids;
    size_t n, cap;
} loom__tokvec;

loom_status loom__tokvec_push(loom__tokvec *v, loom_token id);

/* Encodes one text fragment (no special tokens inside) and appends the ids to out.
 * SPM: add_prefix says whether to put a space before it. text is valid UTF-8. */
loom_status loom__spm_encode(const loom__tokenizer *t, const char *text, size_t len,
                             bool add_prefix, loom__tokvec *out);
loom_status loom__bpe_encode(const loom__tokenizer *t, const char *text, size_t len,
                             loom__tokvec *out);

/* tokenizer_special.c: after types and texts are in place, marks end-of-generation tokens
 * (and the control tokens llama.cpp recognises by name), then lists the special tokens in
 * matching order. */
loom_status loom__tokenizer_find_specials(loom__tokenizer *t, const loom__tokenizer_spec *spec);

/* tokenizer_decode.c: fills piece / piece_off from the texts and attributes. */
loom_status loom__tokenizer_build_pieces(loom__tokenizer *t);
