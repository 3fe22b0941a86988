/* test_tokenizer.c — the tokenizer on small hand-made vocabularies: SentencePiece merging by
 * score, byte fallback, the space prefix, BOS/EOS; BPE merging by rank, the byte alphabet round
 * trip, whole-word tokens; the pre-tokenizer splits; special-token parsing; invalid UTF-8; the
 * buffer contract; and bad metadata, from a spec and from an in-memory GGUF file.
 * (tests/conformance/test_tokenizer.py compares real vocabularies with llama.cpp.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gguf/gguf_writer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_pretok.h"
#include "tokenizer/unicode.h"

#define SP "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* ---- building vocabularies ------------------------------------------------------------------- */

typedef struct vocab {
    loom__tokenizer_text tok[600];
    float score[600];
    int32_t type[600];
    size_t n;
    loom__tokenizer_text merge[64];
    size_t n_merges;
    char bytes[600][8]; /* storage for generated texts */
} vocab;

static int32_t add_n(vocab *v, const char *s, size_t len, float score, int32_t type) {
    v->tok[v->n] = (loom__tokenizer_text){s, len};
    v->score[v->n] = score;
    v->type[v->n] = type;
    return (int32_t)v->n++;
}

static int32_t add(vocab *v, const char *s, float score, int32_t type) {
    return add_n(v, s, strlen(s), score, type);
}

static void add_merge(vocab *v, const char *s) {
    v->merge[v->n_merges++] = (loom__tokenizer_text){s, strlen(s)};
}

/* <unk> <s> </s> first (ids 0 1 2, the SentencePiece defaults). */
static void spm_base(vocab *v) {
    memset(v, 0, sizeof *v);
    add(v, "<unk>", 0, LOOM_TOKEN_TYPE_UNKNOWN);
    add(v, "<s>", 0, LOOM_TOKEN_TYPE_CONTROL);
    add(v, "</s>", 0, LOOM_TOKEN_TYPE_CONTROL);
}

static void add_byte_tokens(vocab *v) {
    for (int b = 0; b < 256; b++) {
        snprintf(v->bytes[v->n], sizeof v->bytes[0], "<0x%02X>", b);
        add(v, v->bytes[v->n], 0, LOOM_TOKEN_TYPE_BYTE);
    }
}

/* The 256 GPT-2 alphabet characters as tokens; byte b gets id b. */
static void bpe_base(vocab *v) {
    memset(v, 0, sizeof *v);
    for (int b = 0; b < 256; b++) {
        size_t n = loom__utf8_put(loom__gpt2_byte_cp[b], v->bytes[b]);
        add_n(v, v->bytes[b], n, 0, LOOM_TOKEN_TYPE_NORMAL);
    }
}

static loom__tokenizer_spec spec_of(vocab *v, loom__tokenizer_kind kind, const char *pre) {
    loom__tokenizer_spec s = {0};
    s.kind = kind;
    if (pre) s.pre = (loom__tokenizer_text){pre, strlen(pre)};
    s.n_vocab = v->n;
    s.tokens = v->tok;
    s.scores = v->score;
    s.types = v->type;
    s.merges = v->merge;
    s.n_merges = v->n_merges;
    s.has_merges = kind == LOOM_TOKENIZER_BPE;
    return s;
}

static loom__tokenizer *make(const loom__tokenizer_spec *s) {
    loom__tokenizer *t = NULL;
    loom_status st = loom__tokenizer_create(s, &t);
    if (st != LOOM_OK) fail_msg("create: %s", loom_last_error());
    return t;
}

/* Encodes s and compares with the n expected ids. */
static void expect_ids(const loom__tokenizer *t, const char *s, unsigned flags,
                       const loom_token *want, size_t n) {
    loom_token got[256];
    size_t n_got = 0;
    loom_status st = loom__tokenizer_encode(t, s, strlen(s), flags, got, 256, &n_got);
    if (st != LOOM_OK) fail_msg("encode '%s': %s", s, loom_last_error());
    if (n_got != n || memcmp(got, want, n * sizeof *want) != 0) {
        char buf[1024];
        size_t k = 0;
        for (size_t i = 0; i < n_got && k < 900; i++)
            k += (size_t)snprintf(buf + k, 1024 - k, " %d", got[i]);
        buf[k] = '\0';
        fail_msg("encode '%s' flags %u: got%s (%zu ids, want %zu)", s, flags, buf, n_got, n);
    }
}

#define EXPECT(t, s, flags, ...)                                                                   \
    do {                                                                                           \
        const loom_token want_[] = {__VA_ARGS__};                                                  \
        expect_ids((t), (s), (flags), want_, sizeof want_ / sizeof want_[0]);                      \
    } while (0)

static void expect_none(const loom__tokenizer *t, const char *s, unsigned flags) {
    size_t n = 99;
    assert_int_equal(loom__tokenizer_encode(t, s, strlen(s), flags, NULL, 0, &n), LOOM_OK);
    assert_int_equal(n, 0);
}

/* Decodes ids and compares with text. */
static void expect_text(const loom__tokenizer *t, const loom_token *ids, size_t n, unsigned flags,
                        const char *want) {
    char out[1024];
    size_t n_out = 0;
    assert_int_equal(loom__tokenizer_decode(t, ids, n, flags, out, sizeof out, &n_out), LOOM_OK);
    if (n_out != strlen(want) || memcmp(out, want, n_out) != 0) {
        fail_msg("decode: got '%.*s' want '%s'", (int)n_out, out, want);
    }
}

/* ---- SentencePiece --------------------------------------------------------------------------- */

static void test_spm_merges_by_score(void **state) {
    (void)state;
    vocab v;
    spm_base(&v);
    int32_t sp = add(&v, SP, -10, 1);
    int32_t a = add(&v, "a", -10, 1), b = add(&v, "b", -10, 1), c = add(&v, "c", -10, 1);
    int32_t ab = add(&v, "ab", -1, 1);
    int32_t bc = add(&v, "bc", -2, 1);
    int32_t abc = add(&v, "abc", -3, 1);
    add(&v, SP "a", -5, 1);
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_SPM, NULL);
    s.add_space_prefix = (loom__tokenizer_opt_bool){true, false};
    loom__tokenizer *t = make(&s);
    /* "ab" (-1) beats "bc" (-2), then "abc" (-3) forms from ab + c */
    EXPECT(t, "abc", 0, abc);
    EXPECT(t, "cab", 0, c, ab);
    EXPECT(t, "bca", 0, bc, a);
    loom__tokenizer_free(t);

    /* "bc" first now: a + bc, whose concatenation is again the token "abc" */
    v.score[bc] = 0;
    t = make(&s);
    EXPECT(t, "abc", 0, abc);
    loom__tokenizer_free(t);
    /* without "abc" the order decides the pieces */
    v.tok[abc] = (loom__tokenizer_text){"zzz", 3};
    t = make(&s);
    EXPECT(t, "abc", 0, a, bc);
    v.score[bc] = -2;
    loom__tokenizer_free(t);
    t = make(&s);
    EXPECT(t, "abc", 0, ab, c);
    /* spaces are U+2581 pieces; with the prefix on, "a" at the start is "▁a" */
    EXPECT(t, " b", 0, sp, b);
    loom__tokenizer_free(t);
}

static void test_spm_tie_leftmost(void **state) {
    (void)state;
    vocab v;
    spm_base(&v);
    int32_t a = add(&v, "a", -10, 1);
    int32_t aa = add(&v, "aa", -1, 1);
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_SPM, NULL);
    s.add_space_prefix = (loom__tokenizer_opt_bool){true, false};
    loom__tokenizer *t = make(&s);
    EXPECT(t, "aaa", 0, aa, a);
    EXPECT(t, "aaaa", 0, aa, aa);
    EXPECT(t, "aaaaa", 0, aa, aa, a);
    loom__tokenizer_free(t);
}

static void test_spm_byte_fallback(void **state) {
    (void)state;
    vocab v;
    spm_base(&v);
    add_byte_tokens(&v); /* <0x00> is id 3 */
    int32_t sp = add(&v, SP, -1, 1);
    int32_t x = add(&v, "x", -1, 1);
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_SPM, NULL);
    loom__tokenizer *t = make(&s);
    /* é = C3 A9 is no token: its bytes' tokens */
    EXPECT(t, "x\xc3\xa9", 0, sp, x, 3 + 0xC3, 3 + 0xA9);
    EXPECT(t, "\n", 0, sp, 3 + 0x0A);
    const loom_token ids[] = {sp, x, 3 + 0xC3, 3 + 0xA9};
    expect_text(t, ids, 4, 0, " x\xc3\xa9");
    expect_text(t, ids, 4, LOOM_DETOKENIZE_STRIP_LEADING, "x\xc3\xa9");
    loom__tokenizer_free(t);

    /* no byte tokens: the unknown token (id 0 unless the file says otherwise), one per
     * character */
    spm_base(&v);
    add(&v, SP, -1, 1);
    x = add(&v, "x", -1, 1);
    s = spec_of(&v, LOOM_TOKENIZER_SPM, NULL);
    s.add_space_prefix = (loom__tokenizer_opt_bool){true, false};
    t = make(&s);
    EXPECT(t, "x\xc3\xa9\xc3\xa9x", 0, x, 0, 0, x);
    loom__tokenizer_free(t);
}

static void test_spm_space_prefix(void **state) {
    (void)state;
    vocab v;
    spm_base(&v);
    add_byte_tokens(&v);
    int32_t sp = add(&v, SP, -5, 1);
    int32_t hi = add(&v, "hi", -1, 1);
    int32_t sphi = add(&v, SP "hi", -0.5f, 1);
    int32_t sot = add(&v, "<start_of_turn>", 0, LOOM_TOKEN_TYPE_CONTROL);
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_SPM, NULL);
    loom__tokenizer *t = make(&s); /* add_space_prefix defaults to true for SentencePiece */
    EXPECT(t, "hi", 0, sphi);
    EXPECT(t, "hi hi", 0, sphi, sphi);
    EXPECT(t, " hi", 0, sp, sphi);
    /* a text fragment after a special token gets the prefix too */
    EXPECT(t, "<start_of_turn>hi", LOOM_TOKENIZE_PARSE_SPECIAL, sot, sphi);
    EXPECT(t, "hi<start_of_turn>hi", LOOM_TOKENIZE_PARSE_SPECIAL, sphi, sot, sphi);
    /* decoding: STRIP_LEADING removes the prefix of the first text token, BOS or not */
    const loom_token ids[] = {1, sphi, sphi};
    expect_text(t, ids, 3, 0, " hi hi");
    expect_text(t, ids, 3, LOOM_DETOKENIZE_STRIP_LEADING, "hi hi");
    expect_text(t, ids, 3, LOOM_DETOKENIZE_STRIP_LEADING | LOOM_DETOKENIZE_RENDER_SPECIAL,
                "<s>hi hi");
    expect_text(t, ids + 1, 2, LOOM_DETOKENIZE_STRIP_LEADING, "hi hi");
    loom__tokenizer_free(t);

    s.add_space_prefix = (loom__tokenizer_opt_bool){true, false};
    t = make(&s);
    EXPECT(t, "hi", 0, hi);
    EXPECT(t, " hi", 0, sphi);
    /* no prefix rule: STRIP_LEADING keeps the text as it is */
    const loom_token ids2[] = {sphi};
    expect_text(t, ids2, 1, LOOM_DETOKENIZE_STRIP_LEADING, " hi");
    loom__tokenizer_free(t);
}

static void test_bos_eos(void **state) {
    (void)state;
    vocab v;
    spm_base(&v);
    add_byte_tokens(&v);
    int32_t spx = add(&v, SP "x", -1, 1);
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_SPM, NULL);
    loom__tokenizer *t = make(&s);
    assert_int_equal(loom__tokenizer_bos(t), 1);
    assert_int_equal(loom__tokenizer_eos(t), 2);
    EXPECT(t, "x", LOOM_TOKENIZE_ADD_SPECIAL, 1, spx);
    EXPECT(t, "x", 0, spx);
    EXPECT(t, "", LOOM_TOKENIZE_ADD_SPECIAL, 1);
    expect_none(t, "", 0);
    assert_true(loom__tokenizer_is_eog(t, 2));
    assert_false(loom__tokenizer_is_eog(t, 1));
    assert_true(loom__tokenizer_is_control(t, 1));
    assert_false(loom__tokenizer_is_control(t, spx));
    assert_false(loom__tokenizer_is_control(t, -1));
    assert_false(loom__tokenizer_is_eog(t, 1 << 20));
    loom__tokenizer_free(t);

    s.add_bos = (loom__tokenizer_opt_bool){true, false};
    s.add_eos = (loom__tokenizer_opt_bool){true, true};
    t = make(&s);
    EXPECT(t, "x", LOOM_TOKENIZE_ADD_SPECIAL, spx, 2);
    EXPECT(t, "", LOOM_TOKENIZE_ADD_SPECIAL, 2);
    loom__tokenizer_free(t);

    /* ids from metadata */
    s.bos = (loom__tokenizer_opt_id){true, 2};
    s.eos = (loom__tokenizer_opt_id){true, 1};
    s.add_bos = (loom__tokenizer_opt_bool){false, false};
    t = make(&s);
    EXPECT(t, "x", LOOM_TOKENIZE_ADD_SPECIAL, 2, spx, 1);
    loom__tokenizer_free(t);
}

/* ---- BPE ------------------------------------------------------------------------------------- */

static void test_bpe_merges_by_rank(void **state) {
    (void)state;
    vocab v;
    bpe_base(&v);
    int32_t ab = add(&v, "ab", 0, 1), bc = add(&v, "bc", 0, 1);
    int32_t abc = add(&v, "abc", 0, 1);
    add_merge(&v, "a b");
    add_merge(&v, "b c");
    add_merge(&v, "ab c");
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_BPE, "gpt-2");
    loom__tokenizer *t = make(&s);
    EXPECT(t, "abc", 0, abc);
    EXPECT(t, "abcb", 0, abc, 'b');
    EXPECT(t, "bcab", 0, bc, ab);
    assert_int_equal(loom__tokenizer_bos(t), 11); /* llama.cpp's default for BPE */
    loom__tokenizer_free(t);

    /* "b c" first now: a + bc, and no merge joins them */
    v.merge[0] = (loom__tokenizer_text){"b c", 3};
    v.merge[1] = (loom__tokenizer_text){"a b", 3};
    t = make(&s);
    EXPECT(t, "abc", 0, 'a', bc);
    EXPECT(t, "ab", 0, ab);
    /* words are merged separately: " ab" is one word (space, a, b) */
    EXPECT(t, "ab ab", 0, ab, ' ', ab);
    loom__tokenizer_free(t);
}

static void test_bpe_byte_round_trip(void **state) {
    (void)state;
    vocab v;
    bpe_base(&v);
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_BPE, "llama-bpe");
    s.add_bos = (loom__tokenizer_opt_bool){true, false};
    loom__tokenizer *t = make(&s);
    /* every ASCII byte, NUL included, and multi-byte characters */
    char text[256];
    size_t n = 0;
    for (int c = 0; c < 128; c++) text[n++] = (char)c;
    const char *more = "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80 end";
    memcpy(text + n, more, strlen(more));
    n += strlen(more);
    loom_token ids[512];
    size_t n_ids = 0;
    assert_int_equal(loom__tokenizer_encode(t, text, n, 0, ids, 512, &n_ids), LOOM_OK);
    assert_int_equal(n_ids, n); /* no merges: one token per byte, id = byte */
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], (unsigned char)text[i]);
    char out[512];
    size_t n_out = 0;
    assert_int_equal(loom__tokenizer_decode(t, ids, n_ids, 0, out, sizeof out, &n_out), LOOM_OK);
    assert_int_equal(n_out, n);
    assert_memory_equal(out, text, n);
    /* each alphabet token decodes to its byte */
    for (int b = 0; b < 256; b++) {
        char c;
        size_t k = 0;
        assert_int_equal(loom__tokenizer_piece(t, b, 0, &c, 1, &k), LOOM_OK);
        assert_int_equal(k, 1);
        assert_int_equal((unsigned char)c, b);
    }
    loom__tokenizer_free(t);
}

static void test_bpe_ignore_merges(void **state) {
    (void)state;
    vocab v;
    bpe_base(&v);
    int32_t bc = add(&v, "bc", 0, 1);
    int32_t abc = add(&v, "abc", 0, 1);
    add_merge(&v, "b c");
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_BPE, "llama-bpe");
    loom__tokenizer *t = make(&s);
    EXPECT(t, "abc", 0, abc); /* a whole-word token skips the merges */
    EXPECT(t, "abcc", 0, 'a', bc, 'c');
    assert_int_equal(loom__tokenizer_bos(t), 11);
    loom__tokenizer_free(t);
    s = spec_of(&v, LOOM_TOKENIZER_BPE, "gpt-2");
    t = make(&s);
    EXPECT(t, "abc", 0, 'a', bc);
    loom__tokenizer_free(t);
}

/* ---- pre-tokenizers -------------------------------------------------------------------------- */

/* Splits s with kind and compares with the expected words joined by '|'. */
static void expect_split(loom__pretok kind, const char *s, const char *want) {
    uint32_t cps[256];
    uint8_t cats[256];
    size_t offs[257], ends[256], tmp[256], n = 0;
    size_t len = strlen(s);
    for (size_t i = 0; i < len;) {
        offs[n] = i;
        cps[n] = loom__utf8_next(s, &i);
        cats[n] = (uint8_t)loom__ucat(cps[n]);
        n++;
    }
    offs[n] = len;
    size_t nw = loom__pretok_split(kind, cps, cats, n, ends, tmp);
    char got[1024];
    size_t k = 0, start = 0;
    for (size_t w = 0; w < nw; w++) {
        if (w) got[k++] = '|';
        memcpy(got + k, s + offs[start], offs[ends[w]] - offs[start]);
        k += offs[ends[w]] - offs[start];
        start = ends[w];
    }
    got[k] = '\0';
    if (strcmp(got, want) != 0) fail_msg("split(%d) '%s': got '%s' want '%s'", kind, s, got, want);
}

static void test_pretok_splits(void **state) {
    (void)state;
    /* GPT-2: a space joins the next run; runs of spaces give one back; contractions are
     * lower-case only */
    expect_split(LOOM__PRETOK_GPT2, "Hello world's  12345 ok!!  ",
                 "Hello| world|'s| | 12345| ok|!!|  ");
    expect_split(LOOM__PRETOK_GPT2, "DON'T", "DON|'|T");
    expect_split(LOOM__PRETOK_GPT2, "a\n\nb", "a|\n|\n|b");
    /* Llama-3: digits in threes, case-insensitive contractions, a leading non-letter joins the
     * letters, newlines end whitespace runs */
    expect_split(LOOM__PRETOK_LLAMA3, "DON'T 1234567", "DON|'T| |123|456|7");
    expect_split(LOOM__PRETOK_LLAMA3, "x  \n\n  y", "x|  \n\n| | y");
    expect_split(LOOM__PRETOK_LLAMA3, "(hello)\n", "(hello|)\n");
    expect_split(LOOM__PRETOK_LLAMA3, "a   b", "a|  | b");
    /* Qwen2: one digit per word */
    expect_split(LOOM__PRETOK_QWEN2, "ab123", "ab|1|2|3");
    /* SmolLM: every digit alone first, then GPT-2 (so " 1" is not one word) */
    expect_split(LOOM__PRETOK_SMOLLM, "a 12", "a| |1|2");
    /* default: punctuation runs isolated first, digit groups of three */
    expect_split(LOOM__PRETOK_DEFAULT, "a+=b 1234567", "a|+=|b| |123|456|7");
    /* non-ASCII categories: é is a letter, ٣ a number, U+3000 whitespace */
    expect_split(LOOM__PRETOK_LLAMA3, "caf\xc3\xa9\xe3\x80\x80\xd9\xa3",
                 "caf\xc3\xa9|\xe3\x80\x80|\xd9\xa3");
}

static void test_unicode_categories(void **state) {
    (void)state;
    assert_int_equal(loom__ucat('a'), LOOM_UCAT_LETTER);
    assert_int_equal(loom__ucat('7'), LOOM_UCAT_NUMBER);
    assert_int_equal(loom__ucat('`'), LOOM_UCAT_SYMBOL);
    assert_int_equal(loom__ucat(' '), LOOM_UCAT_SEPARATOR | LOOM_UCAT_SPACE);
    assert_int_equal(loom__ucat('\n'), LOOM_UCAT_OTHER | LOOM_UCAT_SPACE);
    assert_int_equal(loom__ucat(0x85), LOOM_UCAT_OTHER | LOOM_UCAT_SPACE);
    assert_int_equal(loom__ucat(0x1C), LOOM_UCAT_OTHER); /* not White_Space */
    assert_int_equal(loom__ucat(0x3000), LOOM_UCAT_SEPARATOR | LOOM_UCAT_SPACE);
    assert_int_equal(loom__ucat(0x200B), LOOM_UCAT_OTHER); /* zero width space: Cf */
    assert_int_equal(loom__ucat(0x0663), LOOM_UCAT_NUMBER);
    assert_int_equal(loom__ucat(0x0301), LOOM_UCAT_MARK);
    assert_int_equal(loom__ucat(0x00BF), LOOM_UCAT_PUNCT);
    /* the Unicode version llama.cpp's tables have: CJK Extension I (15.1) is a letter, Todhri
     * (16.0) is not assigned yet */
    assert_int_equal(loom__ucat(0x2EBF0), LOOM_UCAT_LETTER);
    assert_int_equal(loom__ucat(0x105C0), LOOM_UCAT_OTHER);
    assert_int_equal(loom__ucat(0x10FFFF), LOOM_UCAT_OTHER);
    for (int b = 0; b < 256; b++) assert_int_equal(loom__gpt2_byte_of(loom__gpt2_byte_cp[b]), b);
    assert_int_equal(loom__gpt2_byte_of(' '), -1);
    assert_int_equal(loom__gpt2_byte_of(0x144), -1);
}

/* ---- special tokens -------------------------------------------------------------------------- */

static void test_special_tokens(void **state) {
    (void)state;
    vocab v;
    bpe_base(&v);
    int32_t ctl = add(&v, "<ctl>", 0, LOOM_TOKEN_TYPE_CONTROL);
    int32_t ud = add(&v, "<ud>", 0, LOOM_TOKEN_TYPE_USER_DEFINED);
    int32_t ab = add(&v, "ab", 0, LOOM_TOKEN_TYPE_CONTROL);
    int32_t abc = add(&v, "abc", 0, LOOM_TOKEN_TYPE_CONTROL);
    int32_t eot = add(&v, "<end_of_turn>", 0, LOOM_TOKEN_TYPE_NORMAL);
    int32_t eos_ds = add(&v,
                         "<\xef\xbd\x9c"
                         "end" SP "of" SP "sentence\xef\xbd\x9c>",
                         0, 1);
    int32_t fim_pad = add(&v, "<|fim_pad|>", 0, LOOM_TOKEN_TYPE_NORMAL);
    int32_t fim_pre = add(&v, "<|fim_prefix|>", 0, LOOM_TOKEN_TYPE_NORMAL);
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_BPE, "gpt-2");
    loom__tokenizer *t = make(&s);
    /* control text is plain text unless parse_special */
    EXPECT(t, "x<ctl>", 0, 'x', '<', 'c', 't', 'l', '>');
    EXPECT(t, "x<ctl>", LOOM_TOKENIZE_PARSE_SPECIAL, 'x', ctl);
    /* user-defined tokens are always matched */
    EXPECT(t, "<ud>x", 0, ud, 'x');
    /* longest first */
    EXPECT(t, "abcab", LOOM_TOKENIZE_PARSE_SPECIAL, abc, ab);
    /* an end-of-turn name makes a control, end-of-generation token */
    assert_true(loom__tokenizer_is_control(t, eot));
    assert_true(loom__tokenizer_is_eog(t, eot));
    EXPECT(t, "<end_of_turn>", LOOM_TOKENIZE_PARSE_SPECIAL, eot);
    assert_true(loom__tokenizer_is_eog(t, eos_ds));
    assert_true(loom__tokenizer_is_eog(t, fim_pad));
    assert_true(loom__tokenizer_is_control(t, fim_pre)); /* a control token ... */
    assert_false(loom__tokenizer_is_eog(t, fim_pre));    /* ... that does not end generation */
    /* pieces: control text only when rendered */
    const loom_token ids[] = {'x', ctl, ud};
    expect_text(t, ids, 3, 0, "x<ud>");
    expect_text(t, ids, 3, LOOM_DETOKENIZE_RENDER_SPECIAL, "x<ctl><ud>");
    loom__tokenizer_free(t);
}

/* ---- bad input ------------------------------------------------------------------------------- */

static void test_invalid_utf8(void **state) {
    (void)state;
    vocab v;
    bpe_base(&v);
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_BPE, "qwen2");
    loom__tokenizer *t = make(&s);
    static const struct {
        const char *s;
        size_t len, off;
    } cases[] = {
        {"\xff", 1, 0},
        {"ab\x80", 3, 2},
        {"abc\xc3", 4, 3},
        {"\xc0\xaf", 2, 0},
        {"x\xed\xa0\x80", 4, 1},
        {"\xf4\x90\x80\x80", 4, 0},
        {"ok\xe2\x82", 4, 2},
        {"\xe0\x80\x80", 3, 0},
        {"a\xc3\xa9\xa9", 4, 3},
        {"\xf0\x9f\x98", 3, 0},
        {"\xf8\x88\x80\x80\x80", 5, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = 0;
        assert_int_equal(loom__tokenizer_encode(t, cases[i].s, cases[i].len, 0, NULL, 0, &n),
                         LOOM_ERR_BAD_INPUT);
        char want[64];
        snprintf(want, sizeof want, "offset %zu ", cases[i].off);
        if (!strstr(loom_last_error(), want)) {
            fail_msg("case %zu: '%s' lacks '%s'", i, loom_last_error(), want);
        }
    }
    /* the largest code point and U+FFFF are fine */
    size_t n = 0;
    assert_int_equal(loom__tokenizer_encode(t, "\xf4\x8f\xbf\xbf\xef\xbf\xbf", 7, 0, NULL, 0, &n),
                     LOOM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, 7);
    loom__tokenizer_free(t);
}

static void test_buffer_contract(void **state) {
    (void)state;
    vocab v;
    bpe_base(&v);
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_BPE, "gpt-2");
    loom__tokenizer *t = make(&s);
    loom_token ids[8] = {-7, -7, -7, -7, -7, -7, -7, -7};
    size_t n = 0;
    assert_int_equal(loom__tokenizer_encode(t, "hello", 5, 0, ids, 3, &n),
                     LOOM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, 5);
    assert_int_equal(ids[0], 'h');
    assert_int_equal(ids[2], 'l');
    assert_int_equal(ids[3], -7); /* nothing past cap */
    assert_int_equal(loom__tokenizer_encode(t, "hello", 5, 0, ids, 5, &n), LOOM_OK);

    char out[8] = "#######";
    assert_int_equal(loom__tokenizer_decode(t, ids, 5, 0, out, 2, &n), LOOM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, 5);
    assert_memory_equal(out, "he#", 3);
    assert_int_equal(loom__tokenizer_decode(t, ids, 5, 0, NULL, 0, &n), LOOM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, 5);
    assert_int_equal(loom__tokenizer_piece(t, 'h', 0, NULL, 0, &n), LOOM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, 1);

    /* ids out of range */
    const loom_token bad[] = {1, 256, 2};
    assert_int_equal(loom__tokenizer_decode(t, bad, 3, 0, out, 8, &n), LOOM_ERR_BAD_INPUT);
    assert_non_null(strstr(loom_last_error(), "#1"));
    assert_int_equal(loom__tokenizer_piece(t, -1, 0, out, 8, &n), LOOM_ERR_BAD_INPUT);
    /* NULL arguments */
    assert_int_equal(loom__tokenizer_encode(t, NULL, 3, 0, ids, 8, &n), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__tokenizer_encode(t, "a", 1, 0, ids, 8, NULL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__tokenizer_encode(t, "a", 1, 0, NULL, 8, &n), LOOM_ERR_INVALID_ARG);
    loom__tokenizer_free(t);
}

/* ---- bad metadata ---------------------------------------------------------------------------- */

static void expect_create_fails(const loom__tokenizer_spec *s, loom_status st, const char *needle) {
    loom__tokenizer *t = NULL;
    assert_int_equal(loom__tokenizer_create(s, &t), st);
    assert_null(t);
    if (!strstr(loom_last_error(), needle)) {
        fail_msg("error '%s' lacks '%s'", loom_last_error(), needle);
    }
}

static void test_bad_spec(void **state) {
    (void)state;
    vocab v;
    bpe_base(&v);
    add(&v, "ab", 0, 1);
    add_merge(&v, "a b");
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_BPE, "gpt-2");

    s.pre = (loom__tokenizer_text){"mystery", 7};
    expect_create_fails(&s, LOOM_ERR_UNSUPPORTED, "mystery");
    s.pre = (loom__tokenizer_text){"gpt-2", 5};

    s.has_merges = false;
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "tokenizer.ggml.merges");
    s.has_merges = true;

    v.merge[0] = (loom__tokenizer_text){"a q", 3}; /* "q" is a token but "aq" is not */
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "result");
    v.merge[0] = (loom__tokenizer_text){"a \xff", 3};
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "right part");
    v.merge[0] = (loom__tokenizer_text){"ab", 2};
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "left right");
    v.merge[0] = (loom__tokenizer_text){"a b", 3};

    s.bos = (loom__tokenizer_opt_id){true, 257};
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "bos_token_id");
    s.bos = (loom__tokenizer_opt_id){true, -1};
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "bos_token_id");
    s.bos = (loom__tokenizer_opt_id){false, 0};
    s.eot = (loom__tokenizer_opt_id){true, 1000};
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "eot_token_id");
    s.eot = (loom__tokenizer_opt_id){false, 0};

    v.type[5] = 9;
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "token_type[5]");
    v.type[5] = LOOM_TOKEN_TYPE_BYTE; /* its text is not <0xHH> */
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "not <0xHH>");
    v.type[5] = 1;

    v.tok[7] = v.tok[3];
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "duplicates token 3");
    v.tok[7] = (loom__tokenizer_text){v.bytes[7], strlen(v.bytes[7])};

    v.score[2] = NAN;
    s.kind = LOOM_TOKENIZER_SPM;
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "scores[2]");
    v.score[2] = 0;

    s.n_vocab = 0;
    expect_create_fails(&s, LOOM_ERR_BAD_MODEL, "tokenizer.ggml.tokens");

    /* the repaired spec builds */
    s = spec_of(&v, LOOM_TOKENIZER_BPE, "gpt-2");
    loom__tokenizer *t = make(&s);
    loom__tokenizer_free(t);
    assert_int_equal(loom__tokenizer_create(NULL, &t), LOOM_ERR_INVALID_ARG);
}

/* ---- loading from GGUF ----------------------------------------------------------------------- */

typedef struct gguf_opts {
    const char *model;
    uint64_t n_scores; /* entries written to tokenizer.ggml.scores */
    uint32_t types_elem;
    bool with_tokens;
} gguf_opts;

/* An in-memory GGUF with a three-token SentencePiece vocabulary. */
static void build_gguf(tbuf *b, gguf_opts o) {
    static const char *toks[] = {"<unk>", "<s>", "</s>", SP "a"};
    tbuf kv = {0};
    int n = 0;
    tb_kv(&kv, "general.architecture", LOOM_GGUF_STR), tb_str(&kv, "llama"), n++;
    tb_kv(&kv, "tokenizer.ggml.model", LOOM_GGUF_STR), tb_str(&kv, o.model), n++;
    if (o.with_tokens) {
        tb_kv(&kv, "tokenizer.ggml.tokens", LOOM_GGUF_ARR), tb_arr(&kv, LOOM_GGUF_STR, 4), n++;
        for (int i = 0; i < 4; i++) tb_str(&kv, toks[i]);
    }
    tb_kv(&kv, "tokenizer.ggml.scores", LOOM_GGUF_ARR), tb_arr(&kv, LOOM_GGUF_F32, o.n_scores), n++;
    for (uint64_t i = 0; i < o.n_scores; i++) tb_f32(&kv, -(float)i);
    tb_kv(&kv, "tokenizer.ggml.token_type", LOOM_GGUF_ARR), tb_arr(&kv, o.types_elem, 4), n++;
    for (int i = 0; i < 4; i++) tb_u32(&kv, i == 0 ? 2 : i < 3 ? 3 : 1);
    tb_kv(&kv, "tokenizer.ggml.bos_token_id", LOOM_GGUF_U32), tb_u32(&kv, 1), n++;
    tb_kv(&kv, "tokenizer.ggml.add_space_prefix", LOOM_GGUF_BOOL), tb_u8(&kv, 1), n++;
    tb_header(b, 3, 0, (uint64_t)n);
    tb_put(b, kv.p, kv.n);
    tb_pad(b, 32);
    tb_free(&kv);
}

static loom_status load_from(gguf_opts o, loom__tokenizer **t) {
    tbuf b = {0};
    build_gguf(&b, o);
    loom__gguf *g = NULL;
    loom_status st = loom__gguf_open_memory(b.p, b.n, &g);
    if (st == LOOM_OK) st = loom__tokenizer_load(g, t);
    loom__gguf_close(g); /* the tokenizer keeps nothing of the file */
    tb_free(&b);
    return st;
}

static void test_load_gguf(void **state) {
    (void)state;
    gguf_opts good = {"llama", 4, LOOM_GGUF_I32, true};
    loom__tokenizer *t = NULL;
    assert_int_equal(load_from(good, &t), LOOM_OK);
    assert_int_equal(loom__tokenizer_n_vocab(t), 4);
    EXPECT(t, "a", LOOM_TOKENIZE_ADD_SPECIAL, 1, 3);
    loom__tokenizer_free(t);
    t = NULL;

    gguf_opts o = good;
    o.n_scores = 3;
    assert_int_equal(load_from(o, &t), LOOM_ERR_BAD_MODEL);
    assert_non_null(strstr(loom_last_error(), "tokenizer.ggml.scores"));
    o = good;
    o.types_elem = LOOM_GGUF_U32;
    assert_int_equal(load_from(o, &t), LOOM_ERR_BAD_MODEL);
    assert_non_null(strstr(loom_last_error(), "tokenizer.ggml.token_type"));
    o = good;
    o.model = "bert";
    assert_int_equal(load_from(o, &t), LOOM_ERR_UNSUPPORTED);
    assert_non_null(strstr(loom_last_error(), "'bert'"));
    o = good;
    o.with_tokens = false;
    assert_int_equal(load_from(o, &t), LOOM_ERR_BAD_MODEL);
    assert_non_null(strstr(loom_last_error(), "tokenizer.ggml.tokens"));
    assert_null(t);
}

/* ---- long input ------------------------------------------------------------------------------ */

static void test_long_input(void **state) {
    (void)state;
    /* 200k characters merge in well under a second only if merging is O(n log n) */
    vocab v;
    spm_base(&v);
    add(&v, "a", -10, 1);
    add(&v, "aa", -1, 1);
    add(&v, "aaaa", -2, 1);
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_SPM, NULL);
    s.add_space_prefix = (loom__tokenizer_opt_bool){true, false};
    loom__tokenizer *t = make(&s);
    size_t len = 200000;
    char *text = malloc(len);
    assert_non_null(text);
    memset(text, 'a', len);
    size_t n = 0;
    assert_int_equal(loom__tokenizer_encode(t, text, len, 0, NULL, 0, &n),
                     LOOM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, len / 4);
    free(text);
    loom__tokenizer_free(t);
}

/* Characters outside the GPT-2 byte alphabet in NORMAL byte-level tokens (issue 18, bug 1): one
 * such character is written as llama.cpp writes it (its hex, then the token's whole text);
 * several are written without the repeated text, so a long token of them cannot make the piece
 * table quadratic (30,000 of them took 2.7 GB in llama.cpp's form). */
static void test_bpe_unknown_chars_linear(void **state) {
    (void)state;
    enum { N_CJK = 30000 };
    static char long_text[N_CJK * 3];
    for (size_t i = 0; i < N_CJK; i++) memcpy(long_text + 3 * i, "\xe4\xb8\xad", 3); /* U+4E2D */
    vocab v;
    bpe_base(&v);
    int32_t one = add(&v, "a\xe4\xb8\xad", 0, LOOM_TOKEN_TYPE_NORMAL);
    int32_t two = add(&v,
                      "\xe4\xb8\xad"
                      "b\xe4\xb8\xad",
                      0, LOOM_TOKEN_TYPE_NORMAL);
    int32_t many = add_n(&v, long_text, sizeof long_text, 0, LOOM_TOKEN_TYPE_NORMAL);
    loom__tokenizer_spec s = spec_of(&v, LOOM_TOKENIZER_BPE, "gpt-2");
    loom__tokenizer *t = make(&s);
    char out[64];
    size_t n = 0;
    assert_int_equal(loom__tokenizer_piece(t, one, 0, out, sizeof out, &n), LOOM_OK);
    const char *want_one = "a[UNK_BYTE_0xe4b8ada\xe4\xb8\xad]";
    assert_int_equal(n, strlen(want_one));
    assert_memory_equal(out, want_one, n);
    assert_int_equal(loom__tokenizer_piece(t, two, 0, out, sizeof out, &n), LOOM_OK);
    const char *want_two = "[UNK_BYTE_0xe4b8ad]b[UNK_BYTE_0xe4b8ad]";
    assert_int_equal(n, strlen(want_two));
    assert_memory_equal(out, want_two, n);
    assert_int_equal(loom__tokenizer_piece(t, many, 0, NULL, 0, &n), LOOM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, (size_t)N_CJK * strlen("[UNK_BYTE_0xe4b8ad]"));
    loom__tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spm_merges_by_score),
        cmocka_unit_test(test_spm_tie_leftmost),
        cmocka_unit_test(test_spm_byte_fallback),
        cmocka_unit_test(test_spm_space_prefix),
        cmocka_unit_test(test_bos_eos),
        cmocka_unit_test(test_bpe_merges_by_rank),
        cmocka_unit_test(test_bpe_byte_round_trip),
        cmocka_unit_test(test_bpe_ignore_merges),
        cmocka_unit_test(test_pretok_splits),
        cmocka_unit_test(test_unicode_categories),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_buffer_contract),
        cmocka_unit_test(test_bad_spec),
        cmocka_unit_test(test_load_gguf),
        cmocka_unit_test(test_long_input),
        cmocka_unit_test(test_bpe_unknown_chars_linear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
