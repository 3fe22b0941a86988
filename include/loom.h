/*
 * loom.h — the public C ABI of loom, an LLM inference runtime.
 *
 * Conventions (they hold for every function below unless its comment says otherwise):
 *   - Every fallible function returns a loom_status; LOOM_OK (0) is success. Out-parameters
 *     come last. On failure, out-parameters are left untouched (handles stay NULL) and a
 *     human-readable message is available from loom_last_error() on the calling thread.
 *   - Handles are opaque. Every *_free / *_destroy accepts NULL.
 *   - Parameter structs are obtained from *_default_params(); set the fields you care about.
 *     New fields are only ever appended, so code written against an older header keeps working.
 *   - Strings are UTF-8. Lengths are in bytes. Token ids are int32_t.
 *   - ABI: libraries with the same LOOM_VERSION_MAJOR are ABI compatible (for MAJOR >= 1;
 *     during 0.x the minor version is the ABI version).
 *   - Thread-safety: a loom_model is immutable after loading and may be shared by any number
 *     of threads. A loom_session is not thread-safe: use one per thread, or serialise access.
 *     Functions that take no handle are thread-safe.
 *   - The library never calls exit() or abort() on bad input; bad input returns a status.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && !defined(LOOM_STATIC)
#if defined(LOOM_BUILD)
#define LOOM_API __declspec(dllexport)
#else
#define LOOM_API __declspec(dllimport)
#endif
#elif defined(LOOM_BUILD)
#define LOOM_API __attribute__((visibility("default")))
#else
#define LOOM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Version                                                                                    */
/* ------------------------------------------------------------------------------------------ */

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0
#define LOOM_VERSION_NUMBER                                                                        \
    (LOOM_VERSION_MAJOR * 10000 + LOOM_VERSION_MINOR * 100 + LOOM_VERSION_PATCH)

/* The version of the library actually linked, as "MAJOR.MINOR.PATCH". Static string; never
 * free it. Thread-safe. Never fails. */
LOOM_API const char *loom_version(void);

/* The same as a number (LOOM_VERSION_NUMBER of the linked library). */
LOOM_API int loom_version_number(void);

/* ------------------------------------------------------------------------------------------ */
/* Status codes                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* X(name, value, description). Values are fixed forever; new codes are only appended. */
#define LOOM_STATUS_MAP(X)                                                                         \
    X(OK, 0, "success")                                                                            \
    X(ERR_INVALID_ARG, 1, "invalid argument")                                                      \
    X(ERR_OUT_OF_MEMORY, 2, "out of memory")                                                       \
    X(ERR_IO, 3, "input/output error")                                                             \
    X(ERR_BAD_MODEL, 4, "malformed model file")                                                    \
    X(ERR_UNSUPPORTED, 5, "unsupported feature")                                                   \
    X(ERR_BAD_INPUT, 6, "invalid input")                                                           \
    X(ERR_CONTEXT_FULL, 7, "context is full")                                                      \
    X(ERR_BUFFER_TOO_SMALL, 8, "output buffer too small")                                          \
    X(ERR_BACKEND, 9, "backend failure")                                                           \
    X(ERR_INTERNAL, 10, "internal error")

typedef enum loom_status {
#define LOOM__STATUS_ENUM(name, value, desc) LOOM_##name = value,
    LOOM_STATUS_MAP(LOOM__STATUS_ENUM)
#undef LOOM__STATUS_ENUM
} loom_status;

/* A static description of a status ("malformed model file"); "unknown status" for values
 * outside the enum. Never NULL, never free it. Thread-safe. */
LOOM_API const char *loom_status_str(loom_status status);

/* The detailed message of the last failure on the calling thread, e.g.
 * "tensor blk.3.attn_q.weight: offset 912 past end of file (size 800)". Thread-local: each
 * thread sees only its own failures. The pointer stays valid until the next loom call on this
 * thread. Returns "" if nothing failed yet. Never NULL. */
LOOM_API const char *loom_last_error(void);

/* ------------------------------------------------------------------------------------------ */
/* Logging                                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef enum loom_log_level {
    LOOM_LOG_DEBUG = 0,
    LOOM_LOG_INFO = 1,
    LOOM_LOG_WARN = 2,
    LOOM_LOG_ERROR = 3,
    LOOM_LOG_NONE = 4,
} loom_log_level;

/* Receives one complete line (no trailing newline). Called on whichever thread logged. */
typedef void (*loom_log_fn)(loom_log_level level, const char *message, void *user_data);

/* Routes library log lines to fn (NULL restores the default: stderr) and drops lines below
 * min_level (default LOOM_LOG_WARN). Thread-safe, but lines being logged concurrently with the
 * change may go to either sink. */
LOOM_API void loom_log_set(loom_log_fn fn, loom_log_level min_level, void *user_data);

/* ------------------------------------------------------------------------------------------ */
/* Model                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef int32_t loom_token;

typedef struct loom_model loom_model;

typedef enum loom_backend_kind {
    LOOM_BACKEND_CPU = 0,
    LOOM_BACKEND_CUDA = 1, /* reserved: not built yet */
} loom_backend_kind;

typedef struct loom_model_params {
    loom_backend_kind backend; /* default LOOM_BACKEND_CPU */
    int n_threads;             /* compute threads of the CPU backend; <= 0: all online cores */
    bool use_mmap;             /* map the file and use weights in place (default true) */
    bool vocab_only;           /* load metadata and tokenizer only: no weights, no sessions */
    /* Matmuls over quantized/F16 weights keep activations in float32 (slower; the closest to
     * exact arithmetic) instead of rounding them per block to 8 bits (or F16) and using
     * integer dot products as llama.cpp does. Default false. */
    bool f32_activations;
} loom_model_params;

/* Defaults for loom_model_load. Thread-safe. */
LOOM_API loom_model_params loom_model_default_params(void);

/* Loads a GGUF model (weights, configuration and tokenizer) from path.
 * params may be NULL for the defaults. On success *out owns the model; release it with
 * loom_model_free. The file stays mapped for the model's lifetime.
 * Errors: LOOM_ERR_INVALID_ARG (NULL path/out, bad params), LOOM_ERR_IO (cannot open/map),
 *   LOOM_ERR_BAD_MODEL (corrupt or truncated file, missing tensor or key — the message names
 *   the field), LOOM_ERR_UNSUPPORTED (architecture or tensor type loom does not run),
 *   LOOM_ERR_OUT_OF_MEMORY. */
LOOM_API loom_status loom_model_load(const char *path, const loom_model_params *params,
                                     loom_model **out);

/* Releases the model. The caller must have freed every session made from it. NULL is a no-op. */
LOOM_API void loom_model_free(loom_model *model);

typedef struct loom_model_info {
    const char *architecture; /* "llama", ... (owned by the model) */
    const char *name;         /* general.name, or "" (owned by the model) */
    int32_t n_vocab;
    int32_t n_ctx_train; /* context length the model was trained with */
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int64_t n_params;   /* number of weight elements */
    int64_t file_bytes; /* size of the GGUF file */
    loom_token bos;     /* -1 when the model has none */
    loom_token eos;     /* -1 when the model has none */
} loom_model_info;

/* Fills *out with facts about the model. Strings stay owned by the model.
 * Errors: LOOM_ERR_INVALID_ARG. Thread-safe. */
LOOM_API loom_status loom_model_get_info(const loom_model *model, loom_model_info *out);

/* ------------------------------------------------------------------------------------------ */
/* Tokenizer                                                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef enum loom_tokenize_flags {
    LOOM_TOKENIZE_ADD_SPECIAL = 1 << 0,   /* add BOS (and EOS) as the model's metadata asks */
    LOOM_TOKENIZE_PARSE_SPECIAL = 1 << 1, /* text like "<start_of_turn>" becomes its control
                                             token instead of being tokenized as plain text */
} loom_tokenize_flags;

/* Encodes text[0..len) into token ids. Writes at most cap tokens to out (out may be NULL when
 * cap is 0) and always sets *n_out to the number the full encoding needs, so a caller can ask
 * for the size first.
 * Errors: LOOM_ERR_INVALID_ARG, LOOM_ERR_BAD_INPUT (text is not valid UTF-8; the message gives
 *   the byte offset), LOOM_ERR_BUFFER_TOO_SMALL (*n_out > cap; out holds the first cap ids).
 * Thread-safe (the model is read-only). */
LOOM_API loom_status loom_tokenize(const loom_model *model, const char *text, size_t len,
                                   unsigned flags, loom_token *out, size_t cap, size_t *n_out);

typedef enum loom_detokenize_flags {
    LOOM_DETOKENIZE_RENDER_SPECIAL = 1 << 0, /* write control tokens' text ("<eos>") */
    LOOM_DETOKENIZE_STRIP_LEADING = 1 << 1,  /* drop the leading space the tokenizer's
                                                space-prefix rule added to the first token */
} loom_detokenize_flags;

/* Decodes tokens into UTF-8 text. Writes at most cap bytes to out (no terminating NUL is
 * added) and always sets *n_out to the number of bytes the full text needs.
 * Byte-fallback pieces are joined into characters; bytes that do not (yet) form a complete
 * UTF-8 sequence at the end are held back only by loom_detokenizer (below), not here.
 * Errors: LOOM_ERR_INVALID_ARG (NULL pointers), LOOM_ERR_BAD_INPUT (a token id out of range),
 *   LOOM_ERR_BUFFER_TOO_SMALL. Thread-safe. */
LOOM_API loom_status loom_detokenize(const loom_model *model, const loom_token *tokens,
                                     size_t n_tokens, unsigned flags, char *out, size_t cap,
                                     size_t *n_out);

/* The text of one token's piece, as the vocabulary stores it after decoding (byte tokens give
 * their single byte, so a piece may be an incomplete UTF-8 sequence). Same buffer contract as
 * loom_detokenize. Thread-safe. */
LOOM_API loom_status loom_token_to_piece(const loom_model *model, loom_token token,
                                         unsigned flags, char *out, size_t cap, size_t *n_out);

/* ------------------------------------------------------------------------------------------ */
/* Chat templates                                                                              */
/* ------------------------------------------------------------------------------------------ */

typedef struct loom_chat_message {
    const char *role;    /* "system", "user" or "assistant" ("model" is taken as "assistant") */
    const char *content; /* UTF-8, NUL-terminated */
} loom_chat_message;

/* The name of the chat template loom uses for model ("gemma", "chatml", "llama3"), chosen from
 * the tokenizer.chat_template metadata (by its turn markers; no Jinja engine is involved) or,
 * when the file has none, from the architecture. Static string. Errors: INVALID_ARG,
 * UNSUPPORTED (no known template fits; the message says what the file has). Thread-safe. */
LOOM_API loom_status loom_chat_template_name(const loom_model *model, const char **out);

/* Renders messages[0..n) as the model's chat template would, as text to tokenize with
 * LOOM_TOKENIZE_ADD_SPECIAL | LOOM_TOKENIZE_PARSE_SPECIAL (the BOS token is not part of the
 * text). add_assistant appends the opening of the assistant's turn, so generation continues
 * as the assistant. Same buffer contract as loom_detokenize (*n_out = bytes needed; no NUL).
 * Errors: INVALID_ARG (NULL pointers, unknown role), UNSUPPORTED (see above),
 * BUFFER_TOO_SMALL. Thread-safe. */
LOOM_API loom_status loom_chat_format(const loom_model *model, const loom_chat_message *messages,
                                      size_t n, bool add_assistant, char *out, size_t cap,
                                      size_t *n_out);

/* ------------------------------------------------------------------------------------------ */
/* Session: one sequence, its paged KV cache and its logits                                    */
/* ------------------------------------------------------------------------------------------ */

typedef struct loom_session loom_session;

typedef struct loom_session_params {
    int32_t n_ctx;      /* maximum positions; 0: the model's n_ctx_train capped at 4096 */
    int32_t n_batch;    /* most tokens per forward call (prompt chunking); default 512 */
    int32_t block_size; /* KV-cache block (page) size in tokens; default 16 */
    bool kv_f32;        /* store K/V in float32 instead of float16 (default false) */
} loom_session_params;

/* Defaults for loom_session_create. Thread-safe. */
LOOM_API loom_session_params loom_session_default_params(void);

/* Creates a session over model, allocating its KV cache and work buffers up front (nothing is
 * allocated per token). params may be NULL. The model must outlive the session.
 * Errors: LOOM_ERR_INVALID_ARG, LOOM_ERR_OUT_OF_MEMORY, LOOM_ERR_BACKEND. */
LOOM_API loom_status loom_session_create(loom_model *model, const loom_session_params *params,
                                         loom_session **out);

/* Releases the session. NULL is a no-op. */
LOOM_API void loom_session_free(loom_session *session);

/* Forgets every position: the next decode starts at position 0. Never fails. */
LOOM_API void loom_session_reset(loom_session *session);

/* Number of positions currently in the session's cache. */
LOOM_API int32_t loom_session_n_past(const loom_session *session);

/* Runs the model over tokens[0..n) at positions n_past .. n_past+n-1, appending them to the
 * cache. If all_logits is true, logits of every one of the n positions are kept
 * (loom_session_logits(s, i) for i in 0..n-1); otherwise only the last one's (i = n-1).
 * Errors: LOOM_ERR_INVALID_ARG (n <= 0, NULL), LOOM_ERR_BAD_INPUT (a token id out of range;
 *   nothing is appended), LOOM_ERR_CONTEXT_FULL (n_past + n > n_ctx; nothing is appended),
 *   LOOM_ERR_BACKEND. */
LOOM_API loom_status loom_session_decode(loom_session *session, const loom_token *tokens,
                                         int32_t n, bool all_logits);

/* Logits (n_vocab floats, owned by the session) of row i of the last decode: i = -1 means its
 * last token. NULL when that row was not kept or i is out of range. Valid until the next
 * decode or reset. */
LOOM_API const float *loom_session_logits(const loom_session *session, int32_t i);

/* ------------------------------------------------------------------------------------------ */
/* Sampling (minimal: the full chain with entropy correction comes with the engine)           */
/* ------------------------------------------------------------------------------------------ */

typedef struct loom_sampler_params {
    float temperature; /* 0: greedy (arg max); default 0.8 */
    int32_t top_k;     /* keep the k most likely; <= 0: off; default 40 */
    float top_p;       /* keep the smallest set with mass >= top_p; 1: off; default 0.95 */
    uint64_t seed;     /* RNG seed; default 0x5EED */
} loom_sampler_params;

/* Defaults for sampling. Thread-safe. */
LOOM_API loom_sampler_params loom_sampler_default_params(void);

/* Picks one token from logits[0..n_vocab) with params. draw_index selects the random number
 * (a counter-based RNG keyed by (seed, draw_index)), so the same seed and index give the same
 * token on any thread or schedule. Allocates a temporary index buffer when top-k/top-p are on.
 * Errors: LOOM_ERR_INVALID_ARG (NULL, n_vocab <= 0, temperature < 0, top_p outside (0,1],
 *   non-finite temperature), LOOM_ERR_BAD_INPUT (no finite logit),
 *   LOOM_ERR_OUT_OF_MEMORY. Thread-safe. */
LOOM_API loom_status loom_sample(const float *logits, int32_t n_vocab,
                                 const loom_sampler_params *params, uint64_t draw_index,
                                 loom_token *out);

/* ------------------------------------------------------------------------------------------ */
/* Generation                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Receives each newly generated piece of text (complete UTF-8 characters only) and its token.
 * Return false to stop generation early. */
typedef bool (*loom_piece_fn)(const char *piece, size_t len, loom_token token, void *user_data);

typedef struct loom_generate_params {
    int32_t n_predict;           /* most tokens to generate; default 128 */
    loom_sampler_params sampler; /* default loom_sampler_default_params() */
    bool add_special;            /* add BOS etc. to the prompt (default true) */
    bool parse_special;          /* control-token text in the prompt is parsed (default false) */
    bool stop_at_eos;            /* stop on the model's end-of-generation tokens (default true) */
} loom_generate_params;

typedef struct loom_generate_stats {
    int32_t n_prompt;    /* prompt tokens */
    int32_t n_generated; /* generated tokens */
    double prompt_ms;    /* wall time of the prompt's forward passes */
    double generate_ms;  /* wall time of generation (forward + sampling) */
} loom_generate_stats;

/* Defaults for loom_generate. Thread-safe. */
LOOM_API loom_generate_params loom_generate_default_params(void);

/* Resets session, tokenizes prompt, runs it, then samples up to n_predict tokens, calling
 * on_piece (may be NULL) for each. stats may be NULL.
 * Errors: those of loom_tokenize and loom_session_decode; LOOM_ERR_CONTEXT_FULL when the prompt
 *   alone does not fit (nothing is generated). Hitting n_ctx during generation stops it with
 *   LOOM_OK. */
LOOM_API loom_status loom_generate(loom_session *session, const char *prompt,
                                   const loom_generate_params *params, loom_piece_fn on_piece,
                                   void *user_data, loom_generate_stats *stats);

#ifdef __cplusplus
}
#endif
