/* tokenizer_pretok.c — the BPE pre-tokenizers (see tokenizer_pretok.h).
 *
 * A pre-tokenizer is a list of passes. Each pass splits every segment left by the previous one
 * on its own — its matches and the text between them both become segments — and a match never
 * looks past the end of its segment. The passes reproduce how llama.cpp evaluates each
 * expression, quirks included, because its tokenization is what a GGUF model was checked
 * against:
 *   - \s is Unicode White_Space; \p{..} are general categories (Unicode 15.1);
 *   - the (?i:...) contractions fold ASCII letters only (no other code point lower-cases to
 *     one of s t m d r e v l, which tools/gen_unicode_tables.py checks);
 *   - \s+(?!\S) gives back one space before a following character but not at the end of a
 *     segment.
 */
#include "tokenizer/tokenizer_pretok.h"

#include <string.h>

#include "tokenizer/unicode.h"

enum { L = LOOM_UCAT_LETTER, N = LOOM_UCAT_NUMBER, WS = LOOM_UCAT_SPACE };

/* ---- the names llama.cpp gives these pre-tokenizers ------------------------------------------ */

static const loom__pretok_name k_names[] = {
    {"default", LOOM__PRETOK_DEFAULT, false, false},
    /* GPT-2 split */
    {"gpt-2", LOOM__PRETOK_GPT2, false, false},
    {"phi-2", LOOM__PRETOK_GPT2, false, false},
    {"mpt", LOOM__PRETOK_GPT2, false, false},
    {"olmo", LOOM__PRETOK_GPT2, false, false},
    {"exaone4", LOOM__PRETOK_GPT2, false, false},
    {"mellum", LOOM__PRETOK_GPT2, false, false},
    {"gigachat", LOOM__PRETOK_GPT2, false, false},
    {"a.x-4.0", LOOM__PRETOK_GPT2, false, false},
    {"jina-es", LOOM__PRETOK_GPT2, false, false},
    {"jina-de", LOOM__PRETOK_GPT2, false, false},
    {"jina-v2-es", LOOM__PRETOK_GPT2, false, false},
    {"jina-v2-de", LOOM__PRETOK_GPT2, false, false},
    {"modern-bert", LOOM__PRETOK_GPT2, false, false},
    /* Llama-3 split: whole-word tokens skip the merges, BOS by default */
    {"llama-bpe", LOOM__PRETOK_LLAMA3, true, true},
    {"llama3", LOOM__PRETOK_LLAMA3, true, true},
    {"llama-v3", LOOM__PRETOK_LLAMA3, true, true},
    {"falcon3", LOOM__PRETOK_LLAMA3, true, true},
    {"falcon-h1", LOOM__PRETOK_LLAMA3, true, true},
    {"pixtral", LOOM__PRETOK_LLAMA3, true, true},
    {"midm-2.0", LOOM__PRETOK_LLAMA3, true, true},
    {"lfm2", LOOM__PRETOK_LLAMA3, true, true},
    {"jina-v5-nano", LOOM__PRETOK_LLAMA3, true, true},
    /* Qwen2 split */
    {"qwen2", LOOM__PRETOK_QWEN2, false, false},
    {"deepseek-r1-qwen", LOOM__PRETOK_QWEN2, false, false},
    {"kormo", LOOM__PRETOK_QWEN2, false, false},
    {"f2llmv2", LOOM__PRETOK_QWEN2, false, false},
    {"megrez", LOOM__PRETOK_QWEN2, false, false},
    {"stablelm2", LOOM__PRETOK_QWEN2, false, false},
    {"hunyuan", LOOM__PRETOK_QWEN2, false, false},
    {"solar-open", LOOM__PRETOK_QWEN2, false, false},
    /* SmolLM / StarCoder split */
    {"smollm", LOOM__PRETOK_SMOLLM, false, false},
    {"starcoder", LOOM__PRETOK_SMOLLM, false, false},
    {"refact", LOOM__PRETOK_SMOLLM, false, false},
    {"command-r", LOOM__PRETOK_SMOLLM, false, false},
    {"codeshell", LOOM__PRETOK_SMOLLM, false, false},
    {"exaone", LOOM__PRETOK_SMOLLM, false, false},
    {"minerva-7b", LOOM__PRETOK_SMOLLM, false, false},
    {"mellum2", LOOM__PRETOK_SMOLLM, false, false},
};

const loom__pretok_name *loom__pretok_find(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++) {
        if (strlen(k_names[i].name) == len && memcmp(k_names[i].name, name, len) == 0) {
            return &k_names[i];
        }
    }
    return NULL;
}

/* ---- helpers over one segment [a, b) --------------------------------------------------------- */

/* Category flags of position i, 0 past the segment's end (so a run stops there). */
static unsigned cat_at(const uint8_t *cats, size_t i, size_t b) {
    return i < b ? cats[i] : 0;
}

/* End of the run from i of code points having some flag in mask. */
static size_t run_with(const uint8_t *cats, size_t i, size_t b, unsigned mask) {
    while (i < b && (cats[i] & mask)) i++;
    return i;
}

/* End of the run from i of code points having none of the flags in mask. */
static size_t run_without(const uint8_t *cats, size_t i, size_t b, unsigned mask) {
    while (i < b && !(cats[i] & mask)) i++;
    return i;
}

static uint32_t ascii_lower(uint32_t c) {
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* 's 't 're 've 'm 'll 'd at pos: the end of the match, or 0. fold: case-insensitive. */
static size_t contraction(const uint32_t *cps, size_t pos, size_t b, bool fold) {
    if (cps[pos] != '\'' || pos + 1 >= b) return 0;
    uint32_t c1 = fold ? ascii_lower(cps[pos + 1]) : cps[pos + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return pos + 2;
    if (pos + 2 >= b) return 0;
    uint32_t c2 = fold ? ascii_lower(cps[pos + 2]) : cps[pos + 2];
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
        return pos + 3;
    }
    return 0;
}

/* \s+(?!\S)|\s+ at pos (pos is whitespace or the last position): a run of two or more spaces
 * followed by a character leaves its last space to that character's word. */
static size_t spaces(const uint8_t *cats, size_t pos, size_t b) {
    size_t e = run_with(cats, pos, b, WS);
    if (e - pos > 1 && e < b) return e - 1;
    return e > pos ? e : pos + 1;
}

/* ---- the passes ------------------------------------------------------------------------------ */

typedef struct seg_out {
    size_t *ends;
    size_t n;
} seg_out;

static void emit(seg_out *o, size_t end) {
    o->ends[o->n++] = end;
}

static void pass_gpt2(const uint32_t *cps, const uint8_t *cats, size_t a, size_t b, seg_out *o) {
    size_t pos = a;
    while (pos < b) {
        size_t end = contraction(cps, pos, b, false);
        if (!end) {
            bool sp = cps[pos] == ' ';
            /* " ?X+": a space joins the run that follows it */
            unsigned f = sp ? cat_at(cats, pos + 1, b) : cats[pos];
            size_t from = pos + sp;
            if (f & L) {
                end = run_with(cats, from, b, L);
            } else if (f & N) {
                end = run_with(cats, from, b, N);
            } else if (f && !(f & (WS | L | N))) {
                end = run_without(cats, from, b, WS | L | N);
            } else {
                end = spaces(cats, pos, b);
            }
        }
        emit(o, end);
        pos = end;
    }
}

/* The Llama-3 split (max_digits 3) and Qwen2's (max_digits 1). */
static void pass_llama3(const uint32_t *cps, const uint8_t *cats, size_t a, size_t b,
                        size_t max_digits, seg_out *o) {
    size_t pos = a;
    while (pos < b) {
        size_t end = contraction(cps, pos, b, true);
        if (end) {
            emit(o, end);
            pos = end;
            continue;
        }
        uint32_t c = cps[pos];
        unsigned f = cats[pos];
        bool nl = c == '\r' || c == '\n';
        if (!nl && !(f & N) && ((f & L) || (cat_at(cats, pos + 1, b) & L))) {
            /* [^\r\n\p{L}\p{N}]?\p{L}+ : one leading non-letter, then letters */
            end = run_with(cats, pos + 1, b, L);
        } else if (f & N) {
            end = pos;
            while (end < b && (cats[end] & N) && end - pos < max_digits) end++;
        } else {
            bool sp = c == ' ';
            unsigned f2 = sp ? cat_at(cats, pos + 1, b) : f;
            if (!(f2 & (WS | L | N))) {
                /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
                end = run_without(cats, pos + sp, b, WS | L | N);
                while (end < b && (cps[end] == '\r' || cps[end] == '\n')) end++;
            } else {
                /* \s*[\r\n]+ : through the last newline of the whitespace run */
                size_t e = pos, after_nl = 0;
                while (e < b && (cats[e] & WS)) {
                    if (cps[e] == '\r' || cps[e] == '\n') after_nl = e + 1;
                    e++;
                }
                end = after_nl ? after_nl : spaces(cats, pos, b);
            }
        }
        emit(o, end);
        pos = end;
    }
}

/* The default pre-tokenizer's first class: punctuation and $ + < = > ^ ~ | (ASCII: every
 * printable non-alphanumeric but ` and space). */
static bool is_default_punct(uint32_t cp, unsigned cat) {
    if (cp < 128) {
        return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
               (cp >= 0x5B && cp <= 0x5F) || (cp >= 0x7B && cp <= 0x7E);
    }
    return (cat & LOOM_UCAT_PUNCT) && !(cat & WS);
}

static bool is_number(uint32_t cp, unsigned cat) {
    return cp < 128 ? (cp >= '0' && cp <= '9') : (cat & N) != 0;
}

/* [class]+ : maximal runs of members and of non-members, alternately. */
static void pass_runs(const uint32_t *cps, const uint8_t *cats, size_t a, size_t b,
                      bool (*member)(uint32_t, unsigned), seg_out *o) {
    size_t pos = a;
    while (pos < b) {
        bool in = member(cps[pos], cats[pos]);
        size_t e = pos + 1;
        while (e < b && member(cps[e], cats[e]) == in) e++;
        emit(o, e);
        pos = e;
    }
}

/* \p{N} : every number on its own; the text between them as one segment. */
static void pass_each_number(const uint32_t *cps, const uint8_t *cats, size_t a, size_t b,
                             seg_out *o) {
    size_t pos = a;
    while (pos < b) {
        size_t e = pos + 1;
        if (!is_number(cps[pos], cats[pos])) {
            while (e < b && !is_number(cps[e], cats[e])) e++;
        }
        emit(o, e);
        pos = e;
    }
}

static bool is_ascii_digit(uint32_t c) {
    return c >= '0' && c <= '9';
}

/* [0-9][0-9][0-9] : groups of three ASCII digits from the left, found anywhere. */
static void pass_digit_triples(const uint32_t *cps, size_t a, size_t b, seg_out *o) {
    size_t gap = a, i = a;
    while (i + 3 <= b) {
        if (is_ascii_digit(cps[i]) && is_ascii_digit(cps[i + 1]) && is_ascii_digit(cps[i + 2])) {
            if (i > gap) emit(o, i);
            emit(o, i + 3);
            i += 3;
            gap = i;
        } else {
            i++;
        }
    }
    if (gap < b) emit(o, b);
}

/* ---- driver ---------------------------------------------------------------------------------- */

typedef enum pass_kind {
    P_GPT2,
    P_LLAMA3,
    P_QWEN2,
    P_PUNCT_RUNS,
    P_NUMBER_RUNS,
    P_EACH_NUMBER,
    P_TRIPLES
} pass_kind;

static void run_pass(pass_kind p, const uint32_t *cps, const uint8_t *cats, size_t a, size_t b,
                     seg_out *o) {
    switch (p) {
    case P_GPT2:
        pass_gpt2(cps, cats, a, b, o);
        break;
    case P_LLAMA3:
        pass_llama3(cps, cats, a, b, 3, o);
        break;
    case P_QWEN2:
        pass_llama3(cps, cats, a, b, 1, o);
        break;
    case P_PUNCT_RUNS:
        pass_runs(cps, cats, a, b, is_default_punct, o);
        break;
    case P_NUMBER_RUNS:
        pass_runs(cps, cats, a, b, is_number, o);
        break;
    case P_EACH_NUMBER:
        pass_each_number(cps, cats, a, b, o);
        break;
    case P_TRIPLES:
        pass_digit_triples(cps, a, b, o);
        break;
    }
}

size_t loom__pretok_split(loom__pretok kind, const uint32_t *cps, const uint8_t *cats, size_t n,
                          size_t *ends, size_t *scratch) {
    static const pass_kind k_default[] = {P_PUNCT_RUNS, P_GPT2, P_NUMBER_RUNS, P_TRIPLES};
    static const pass_kind k_gpt2[] = {P_GPT2};
    static const pass_kind k_llama3[] = {P_LLAMA3};
    static const pass_kind k_qwen2[] = {P_QWEN2};
    static const pass_kind k_smollm[] = {P_EACH_NUMBER, P_GPT2};
    const pass_kind *passes = k_default;
    size_t n_passes = 4;
    switch (kind) {
    case LOOM__PRETOK_DEFAULT:
        break;
    case LOOM__PRETOK_GPT2:
        passes = k_gpt2, n_passes = 1;
        break;
    case LOOM__PRETOK_LLAMA3:
        passes = k_llama3, n_passes = 1;
        break;
    case LOOM__PRETOK_QWEN2:
        passes = k_qwen2, n_passes = 1;
        break;
    case LOOM__PRETOK_SMOLLM:
        passes = k_smollm, n_passes = 2;
        break;
    }
    if (n == 0) return 0;

    /* Segments alternate between the two buffers; each pass only ever subdivides, so n ends
     * always suffice. Start so that the last pass writes into ends. */
    size_t *cur = (n_passes % 2) ? scratch : ends;
    size_t *nxt = (n_passes % 2) ? ends : scratch;
    cur[0] = n;
    size_t n_cur = 1;
    for (size_t p = 0; p < n_passes; p++) {
        seg_out o = {nxt, 0};
        size_t start = 0;
        for (size_t s = 0; s < n_cur; s++) {
            run_pass(passes[p], cps, cats, start, cur[s], &o);
            start = cur[s];
        }
        size_t *tmp = cur;
        cur = nxt;
        nxt = tmp;
        n_cur = o.n;
    }
    return n_cur;
}
