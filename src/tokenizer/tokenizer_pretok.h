/* tokenizer_pretok.h — BPE pre-tokenizers: split text into words before merging, as the
 * regular expressions of the models' tokenizer.json files do (in the form llama.cpp evaluates
 * them, which is what GGUF files are made for), written as hand-made matchers over code-point
 * categories. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum loom__pretok {
    /* [\p{P}$+<=>^~|]+ isolated, then the GPT-2 split, then \p{N}+, then [0-9]{3} groups. */
    LOOM__PRETOK_DEFAULT = 0,
    /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) */
    LOOM__PRETOK_GPT2,
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
     *   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    LOOM__PRETOK_LLAMA3,
    /* as LLAMA3 with \p{N} (one digit per word) instead of \p{N}{1,3} */
    LOOM__PRETOK_QWEN2,
    /* each \p{N} isolated, then the GPT-2 split */
    LOOM__PRETOK_SMOLLM,
} loom__pretok;

typedef struct loom__pretok_name {
    const char *name; /* a tokenizer.ggml.pre value */
    loom__pretok kind;
    bool ignore_merges; /* a word that is itself a token is taken whole */
    bool add_bos;       /* the default of tokenizer.ggml.add_bos_token */
} loom__pretok_name;

/* The entry for tokenizer.ggml.pre name[0..len), or NULL when loom does not implement it. */
const loom__pretok_name *loom__pretok_find(const char *name, size_t len);

/* Splits cps[0..n) (with cats[i] = loom__ucat(cps[i])) into words: writes the exclusive end of
 * each word, in code points, to ends and returns how many. ends and scratch must each hold n
 * entries. */
size_t loom__pretok_split(loom__pretok kind, const uint32_t *cps, const uint8_t *cats, size_t n,
                          size_t *ends, size_t *scratch);
