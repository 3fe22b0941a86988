/* fuzz_tokenizer.c — libFuzzer target: encoding arbitrary bytes and decoding arbitrary ids.
 * Six tokenizers are built once in memory: SentencePiece (with byte fallback and control
 * tokens) and byte-level BPE under each pre-tokenizer family (default, gpt-2, llama-bpe, qwen2,
 * smollm), with merges and ChatML control tokens. The first input byte picks the tokenizer and
 * the flags; the rest is the text. What must hold: invalid UTF-8 is BAD_INPUT with a message,
 * valid text encodes, its ids decode, and without special parsing control text never becomes a
 * control token. The same bytes read as int32 ids (out-of-range ones included) decode or are
 * refused. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_input.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

enum { N_TOK = 6, MAX_VOCAB = 700, MAX_IDS = 8192 };

static loom__tokenizer *g_tok[N_TOK];

typedef struct vocab {
    loom__tokenizer_text tok[MAX_VOCAB];
    float score[MAX_VOCAB];
    int32_t type[MAX_VOCAB];
    size_t n;
    loom__tokenizer_text merge[64];
    size_t n_merges;
    char mem[MAX_VOCAB][12];
} vocab;

static vocab g_v[N_TOK];

static void add(vocab *v, const char *s, size_t len, float score, int32_t type) {
    v->tok[v->n] = (loom__tokenizer_text){s, len};
    v->score[v->n] = score;
    v->type[v->n++] = type;
}

static void adds(vocab *v, const char *s, float score, int32_t type) {
    add(v, s, strlen(s), score, type);
}

static void build_spm(vocab *v) {
    adds(v, "<unk>", 0, LOOM_TOKEN_TYPE_UNKNOWN);
    adds(v, "<s>", 0, LOOM_TOKEN_TYPE_CONTROL);
    adds(v, "</s>", 0, LOOM_TOKEN_TYPE_CONTROL);
    adds(v, "<start_of_turn>", 0, LOOM_TOKEN_TYPE_CONTROL);
    adds(v, "<end_of_turn>", 0, LOOM_TOKEN_TYPE_CONTROL);
    adds(v, "<mask>", 0, LOOM_TOKEN_TYPE_USER_DEFINED);
    for (int b = 0; b < 256; b++) {
        snprintf(v->mem[v->n], sizeof v->mem[0], "<0x%02X>", b);
        adds(v, v->mem[v->n], 0, LOOM_TOKEN_TYPE_BYTE);
    }
    static const char *pieces[] = {"\xe2\x96\x81",
                                   "\xe2\x96\x81the",
                                   "\xe2\x96\x81\x61",
                                   "a",
                                   "b",
                                   "ab",
                                   "abc",
                                   "th",
                                   "he",
                                   "the",
                                   "\xe4\xb8\xad",
                                   "\xe2\x96\x81\xe2\x96\x81",
                                   "1",
                                   "12",
                                   "!",
                                   "."};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++)
        adds(v, pieces[i], -(float)i, LOOM_TOKEN_TYPE_NORMAL);
}

static void build_bpe(vocab *v) {
    for (int b = 0; b < 256; b++) {
        size_t n = loom__utf8_put(loom__gpt2_byte_cp[b], v->mem[v->n]);
        add(v, v->mem[v->n], n, 0, LOOM_TOKEN_TYPE_NORMAL);
    }
    static const char *merged[] = {"\xc4\xa0t", "he",           "\xc4\xa0the", "in",
                                   "er",        "\xc4\xa0\x61", "12",          "\xc4\xa0\xc4\xa0"};
    static const char *merges[] = {"\xc4\xa0 t", "h e",        "\xc4\xa0t he", "i n",
                                   "e r",        "\xc4\xa0 a", "1 2",          "\xc4\xa0 \xc4\xa0"};
    for (size_t i = 0; i < sizeof merged / sizeof *merged; i++) {
        adds(v, merged[i], 0, LOOM_TOKEN_TYPE_NORMAL);
        v->merge[v->n_merges++] = (loom__tokenizer_text){merges[i], strlen(merges[i])};
    }
    adds(v, "<|im_start|>", 0, LOOM_TOKEN_TYPE_CONTROL);
    adds(v, "<|im_end|>", 0, LOOM_TOKEN_TYPE_CONTROL);
    adds(v, "<|endoftext|>", 0, LOOM_TOKEN_TYPE_CONTROL);
    adds(v, "<tool>", 0, LOOM_TOKEN_TYPE_USER_DEFINED);
}

static loom__tokenizer *make(vocab *v, loom__tokenizer_kind kind, const char *pre) {
    loom__tokenizer_spec s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    if (pre) s.pre = (loom__tokenizer_text){pre, strlen(pre)};
    s.n_vocab = v->n;
    s.tokens = v->tok;
    s.scores = v->score;
    s.types = v->type;
    s.merges = v->merge;
    s.n_merges = v->n_merges;
    s.has_merges = kind == LOOM_TOKENIZER_BPE;
    if (kind == LOOM_TOKENIZER_SPM) {
        s.bos = (loom__tokenizer_opt_id){true, 1};
        s.eos = (loom__tokenizer_opt_id){true, 2};
        s.unk = (loom__tokenizer_opt_id){true, 0};
        s.add_space_prefix = (loom__tokenizer_opt_bool){true, true};
    } else {
        s.bos = (loom__tokenizer_opt_id){true, (int64_t)v->n - 2};
        s.eos = (loom__tokenizer_opt_id){true, (int64_t)v->n - 3};
        s.add_bos = (loom__tokenizer_opt_bool){true, true};
    }
    loom__tokenizer *t = NULL;
    if (loom__tokenizer_create(&s, &t) != LOOM_OK) {
        fprintf(stderr, "fuzz_tokenizer: setup: %s\n", loom_last_error());
        abort();
    }
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static const char *pre[N_TOK] = {NULL, "default", "gpt-2", "llama-bpe", "qwen2", "smollm"};
    for (int i = 0; i < N_TOK; i++) {
        if (i == 0) {
            build_spm(&g_v[i]);
            g_tok[i] = make(&g_v[i], LOOM_TOKENIZER_SPM, NULL);
        } else {
            build_bpe(&g_v[i]);
            g_tok[i] = make(&g_v[i], LOOM_TOKENIZER_BPE, pre[i]);
        }
    }
    return 0;
}

static loom_token g_ids[MAX_IDS];
static char g_text[1 << 16];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok[0]) LLVMFuzzerInitialize(NULL, NULL); /* replay driver without the hook */
    fuzz_input in = {data, size};
    uint8_t sel = fz_u8(&in);
    const loom__tokenizer *t = g_tok[sel % N_TOK];
    unsigned flags = (sel / N_TOK) & 3u; /* ADD_SPECIAL, PARSE_SPECIAL */
    const char *text = (const char *)in.p;
    size_t len = in.n;
    size_t n = 0;
    loom_status st = loom__tokenizer_encode(t, text, len, flags, g_ids, MAX_IDS, &n);
    if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL) {
        if (st != LOOM_ERR_BAD_INPUT || loom_last_error()[0] == '\0') abort();
    } else {
        size_t got = n < MAX_IDS ? n : MAX_IDS;
        for (size_t i = 0; i < got; i++) {
            if (g_ids[i] < 0 || g_ids[i] >= loom__tokenizer_n_vocab(t)) abort();
            /* without special parsing, only the BOS the flags add may be a control token */
            if (!(flags & LOOM_TOKENIZE_PARSE_SPECIAL) && loom__tokenizer_is_control(t, g_ids[i]) &&
                !((flags & LOOM_TOKENIZE_ADD_SPECIAL) && i == 0))
                abort();
        }
        size_t n_out = 0;
        for (unsigned df = 0; df < 4; df++) {
            st = loom__tokenizer_decode(t, g_ids, got, df, g_text, sizeof g_text, &n_out);
            if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL) abort();
        }
    }
    /* The same bytes as ids: out-of-range ones are refused by name, the rest decode. */
    fuzz_input ids = {data, size};
    size_t n_ids = 0;
    while (ids.n >= 4 && n_ids < MAX_IDS) {
        int32_t v = (int32_t)fz_u32(&ids);
        g_ids[n_ids++] = sel & 0x80 ? v : (int32_t)((uint32_t)v % 800u); /* mostly in range */
    }
    size_t n_out = 0;
    st = loom__tokenizer_decode(t, g_ids, n_ids, sel & 3u, g_text, sizeof g_text, &n_out);
    if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL &&
        (st != LOOM_ERR_BAD_INPUT || loom_last_error()[0] == '\0'))
        abort();
    for (size_t i = 0; i < n_ids && i < 16; i++) {
        char piece[256];
        (void)loom__tokenizer_piece(t, g_ids[i], sel & 1u, piece, sizeof piece, &n_out);
    }
    return 0;
}
