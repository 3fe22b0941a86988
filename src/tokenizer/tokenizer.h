/* tokenizer.h — text <-> token ids from a model's tokenizer.ggml.* metadata, behaving as
 * llama.cpp's tokenizer does for the same file (the conformance test compares the two).
 *
 * Two tokenizer models are read:
 *   "llama": SentencePiece style. Spaces become U+2581, an optional space prefix is added, the
 *            adjacent pair whose concatenation is the best-scoring vocabulary entry is merged
 *            until none is left, and characters outside the vocabulary fall back to byte tokens
 *            <0xXX> (or to the unknown token when the vocabulary has no byte tokens).
 *   "gpt2":  byte-level BPE. A pre-tokenizer (tokenizer.ggml.pre) splits the text into words,
 *            each word's bytes are written in GPT-2's byte alphabet and merged by the rank of
 *            tokenizer.ggml.merges. Pre-tokenizers: "default" (also when the key is absent),
 *            the GPT-2 split ("gpt-2", "phi-2", "mpt", "olmo", ...), the Llama-3 split
 *            ("llama-bpe", "llama3", ...), the Qwen2 split ("qwen2", "stablelm2", ...) and the
 *            SmolLM split ("smollm", "starcoder", ...); tokenizer_pretok.c lists every name.
 *            Any other name is LOOM_ERR_UNSUPPORTED, as llama.cpp refuses unknown names too: a
 *            silent fallback would tokenize differently from the model's training.
 * Other models (bert, t5, rwkv, ...) are LOOM_ERR_UNSUPPORTED.
 *
 * Special tokens: control, user-defined and unknown tokens are matched in the input text
 * (longest first) before the normal algorithm runs on the text between them. Control and
 * unknown tokens only with LOOM_TOKENIZE_PARSE_SPECIAL; user-defined tokens always (as
 * llama.cpp and HF tokenizers do). Tokens named like end-of-turn markers ("<end_of_turn>",
 * "<|eot_id|>", ...) count as control tokens and as end-of-generation, whatever their type.
 *
 * Not reproduced: llama.cpp's per-model attribute patches chosen by model name (phi-3's rstrip,
 * jina's lstrip <mask>, gpt-oss's <|channel|> retyping) and the clean-up of spaces before
 * punctuation that llama_detokenize applies to some BPE models (decode here concatenates the
 * pieces, as llama.cpp's streaming output does). Equal-length special tokens that overlap in
 * the text are tried in id order (llama.cpp's order there is its sort's).
 *
 * Thread-safety: a loom__tokenizer is immutable after creation; encode/decode/piece may run
 * concurrently from any number of threads (each call allocates its own scratch).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "gguf/gguf.h"

typedef struct loom__tokenizer loom__tokenizer;

/* Reads the tokenizer.ggml.* keys of g and builds a tokenizer. Everything is copied: the
 * tokenizer does not keep pointers into g, which may be closed afterwards.
 * Errors: LOOM_ERR_INVALID_ARG (NULL), LOOM_ERR_BAD_MODEL (a missing or malformed key: arrays
 *   of different lengths, an id out of range, a duplicate token, a merge naming an unknown
 *   token, ... — the message names the key), LOOM_ERR_UNSUPPORTED (tokenizer model or
 *   pre-tokenizer loom does not implement; the message names it), LOOM_ERR_OUT_OF_MEMORY. */
loom_status loom__tokenizer_load(const loom__gguf *g, loom__tokenizer **out);

/* Releases t. NULL is a no-op. */
void loom__tokenizer_free(loom__tokenizer *t);

int32_t loom__tokenizer_n_vocab(const loom__tokenizer *t);
loom_token loom__tokenizer_bos(const loom__tokenizer *t); /* -1 if none */
loom_token loom__tokenizer_eos(const loom__tokenizer *t); /* -1 if none */
/* True for the tokens that end generation: EOS, EOT, EOM and tokens named like them. */
bool loom__tokenizer_is_eog(const loom__tokenizer *t, loom_token id);
/* True for control tokens (BOS, EOS, <start_of_turn>, ...); false for ids out of range. */
bool loom__tokenizer_is_control(const loom__tokenizer *t, loom_token id);

/* Encodes text[0..len) with LOOM_TOKENIZE_* flags; the buffer contract of loom_tokenize:
 * writes at most cap ids, always sets *n_out to the full count.
 * Errors: LOOM_ERR_INVALID_ARG, LOOM_ERR_BAD_INPUT (invalid UTF-8, with the byte offset; a
 *   character that a vocabulary without byte tokens and without an unknown token cannot
 *   encode), LOOM_ERR_BUFFER_TOO_SMALL, LOOM_ERR_OUT_OF_MEMORY. */
loom_status loom__tokenizer_encode(const loom__tokenizer *t, const char *text, size_t len,
                                   unsigned flags, loom_token *out, size_t cap, size_t *n_out);

/* A byte range [begin, end) of a text. */
typedef struct loom__text_range {
    size_t begin, end;
} loom__text_range;

/* loom__tokenizer_encode, where control-token text found across any of plain[0..n_plain) is not
 * parsed as a control token even with LOOM_TOKENIZE_PARSE_SPECIAL: the ranges hold text from
 * someone else (a chat message's content) inside text the caller wrote (the template). Outside
 * them, and wherever no control text occurs, the ids are those of loom__tokenizer_encode.
 * Errors as loom__tokenizer_encode. */
loom_status loom__tokenizer_encode_guarded(const loom__tokenizer *t, const char *text, size_t len,
                                           unsigned flags, const loom__text_range *plain,
                                           size_t n_plain, loom_token *out, size_t cap,
                                           size_t *n_out);

/* Decodes toks[0..n) with LOOM_DETOKENIZE_* flags into out (no NUL added); writes at most cap
 * bytes, always sets *n_out to the full length. LOOM_DETOKENIZE_STRIP_LEADING removes one
 * leading space from the first token that is not a control or unknown token (skipping BOS),
 * when the tokenizer adds a space prefix (SentencePiece models with add_space_prefix).
 * Errors: LOOM_ERR_INVALID_ARG, LOOM_ERR_BAD_INPUT (id out of range; the message gives its
 *   index), LOOM_ERR_BUFFER_TOO_SMALL. */
loom_status loom__tokenizer_decode(const loom__tokenizer *t, const loom_token *toks, size_t n,
                                   unsigned flags, char *out, size_t cap, size_t *n_out);

/* The piece of one token (LOOM_DETOKENIZE_RENDER_SPECIAL decides whether control tokens show
 * their text); same buffer contract and errors as loom__tokenizer_decode. */
loom_status loom__tokenizer_piece(const loom__tokenizer *t, loom_token id, unsigned flags,
                                  char *out, size_t cap, size_t *n_out);

/* ---- building from memory (tests, and what loom__tokenizer_load uses) -------------------------
 */

typedef enum loom__tokenizer_kind {
    LOOM_TOKENIZER_SPM = 0, /* tokenizer.ggml.model "llama" */
    LOOM_TOKENIZER_BPE = 1, /* tokenizer.ggml.model "gpt2" */
} loom__tokenizer_kind;

/* tokenizer.ggml.token_type values. */
typedef enum loom__token_type {
    LOOM_TOKEN_TYPE_UNDEFINED = 0,
    LOOM_TOKEN_TYPE_NORMAL = 1,
    LOOM_TOKEN_TYPE_UNKNOWN = 2,
    LOOM_TOKEN_TYPE_CONTROL = 3,
    LOOM_TOKEN_TYPE_USER_DEFINED = 4,
    LOOM_TOKEN_TYPE_UNUSED = 5,
    LOOM_TOKEN_TYPE_BYTE = 6,
} loom__token_type;

/* A byte string (not NUL-terminated). */
typedef struct loom__tokenizer_text {
    const char *ptr;
    size_t len;
} loom__tokenizer_text;

/* A metadata id that may be absent. */
typedef struct loom__tokenizer_opt_id {
    bool present;
    int64_t value; /* checked against the vocabulary size */
} loom__tokenizer_opt_id;

typedef struct loom__tokenizer_opt_bool {
    bool present;
    bool value;
} loom__tokenizer_opt_bool;

/* Everything loom__tokenizer_create reads; the fields mirror the GGUF keys. Absent optional
 * values take llama.cpp's defaults: SPM bos 1, eos 2, unk 0 (when in range), add_bos true,
 * add_space_prefix true; BPE bos = eos = 11 (when in range; GGUF files written for llama.cpp
 * normally carry both ids), add_bos true only for the Llama-3 pre-tokenizer family;
 * add_eos false. Every field is copied. */
typedef struct loom__tokenizer_spec {
    loom__tokenizer_kind kind;
    loom__tokenizer_text pre; /* tokenizer.ggml.pre; ptr NULL when absent */
    size_t n_vocab;
    const loom__tokenizer_text *tokens; /* [n_vocab] tokenizer.ggml.tokens */
    const float *scores;                /* [n_vocab] tokenizer.ggml.scores, or NULL (all 0) */
    const int32_t *types;               /* [n_vocab] tokenizer.ggml.token_type, or NULL (normal) */
    size_t n_merges;
    const loom__tokenizer_text *merges; /* [n_merges] "left right"; required for BPE */
    bool has_merges;                    /* tokenizer.ggml.merges present (BPE requires it) */
    loom__tokenizer_opt_id bos, eos, unk, pad, eot, eom; /* tokenizer.ggml.*_token_id */
    /* fill-in-the-middle markers: pad/rep/sep end generation; all are control tokens */
    loom__tokenizer_opt_id fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    loom__tokenizer_opt_bool add_bos, add_eos, add_space_prefix;
} loom__tokenizer_spec;

/* Builds a tokenizer from spec (validated as loom__tokenizer_load validates a file; messages
 * name the corresponding GGUF keys). Errors as loom__tokenizer_load. */
loom_status loom__tokenizer_create(const loom__tokenizer_spec *spec, loom__tokenizer **out);
