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
    X(ERR_INTERNAL, 10, "internal error")                                                          \
    X(ERR_NOT_FOUND, 11, "no such request")                                                        \
    X(ERR_BUSY, 12, "the engine is running in background mode")

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

/* Where compute threads run and weights live on machines with several memory nodes (libnuma;
 * the modes of llama.cpp's --numa). The calling thread is never pinned. Where libnuma is
 * missing or reports NUMA unavailable every mode behaves as OFF. */
typedef enum loom_numa_mode {
    LOOM_NUMA_AUTO = 0,   /* DISTRIBUTE on a multi-node machine, OFF on one node (default) */
    LOOM_NUMA_OFF,        /* no pinning, no placement */
    LOOM_NUMA_DISTRIBUTE, /* worker k on node k % n_nodes; weight pages interleaved */
    LOOM_NUMA_ISOLATE,    /* all workers on the loading thread's node; weights bound to it */
} loom_numa_mode;

typedef struct loom_model_params {
    loom_backend_kind backend; /* default LOOM_BACKEND_CPU */
    int n_threads;             /* compute threads of the CPU backend; <= 0: all online cores */
    bool use_mmap;             /* map the file and use weights in place (default true) */
    bool vocab_only;           /* load metadata and tokenizer only: no weights, no sessions */
    /* Matmuls over quantized/F16 weights keep activations in float32 (slower; the closest to
     * exact arithmetic) instead of rounding them per block to 8 bits (or F16) and using
     * integer dot products as llama.cpp does. Default false. */
    bool f32_activations;
    loom_numa_mode numa; /* default LOOM_NUMA_AUTO */
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
    const char *cpu_kernels; /* the CPU matmul kernels this process runs, chosen at the first
                                use from what the CPU supports: "avx512", "avx2-vnni", "avx2"
                                or "portable" (static string) */
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
 * the tokenizer.chat_template metadata (by its turn markers, with llama.cpp's precedence; no
 * Jinja engine is involved) or, when the file has none, from the architecture (gemma3: gemma,
 * qwen2: chatml). Static string. Errors: INVALID_ARG, UNSUPPORTED (no known template fits, or
 * the markers are those of a format loom does not render, such as phi-4's; the message says
 * what the file has), BAD_MODEL (tokenizer.chat_template is not a string). Thread-safe. */
LOOM_API loom_status loom_chat_template_name(const loom_model *model, const char **out);

/* Renders messages[0..n) (messages may be NULL when n is 0) in the model's chat template, as
 * text to tokenize with LOOM_TOKENIZE_ADD_SPECIAL | LOOM_TOKENIZE_PARSE_SPECIAL. The text is
 * byte for byte what llama.cpp's llama_chat_apply_template gives for the same messages and
 * template: gemma trims contents, writes "assistant" as "model" and merges system messages
 * into the next user turn (it has no system turn); llama3 trims contents; chatml does not.
 * The BOS token ("<bos>", "<|begin_of_text|>") is never part of the text: tokenizing with
 * ADD_SPECIAL adds it once, as llama.cpp's chat programs do. add_assistant appends the opening
 * of the assistant's turn, so generation continues as the assistant. "model" is taken as
 * "assistant" (chatml and llama3 write "assistant" for it, where llama.cpp would write the
 * role as given). Same buffer contract as loom_detokenize (*n_out = bytes needed; no NUL).
 * Errors: INVALID_ARG (NULL pointers, a NULL role or content, unknown role; nothing is
 * written), UNSUPPORTED and BAD_MODEL (as loom_chat_template_name), BUFFER_TOO_SMALL.
 * Thread-safe. */
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

/* ------------------------------------------------------------------------------------------ */
/* Engine: continuous batching over a paged KV cache                                           */
/* ------------------------------------------------------------------------------------------ */
/*
 * An engine serves many requests at once over one model. Each step it schedules a batch under
 * a token budget (running decodes first, then chunks of prompts), runs one forward pass over
 * all scheduled tokens of all sequences, samples, and reports events. Prompts that share a
 * prefix share KV blocks (prefix cache); n > 1 samples of one prompt share its blocks
 * (copy-on-write); when blocks run out, the lowest-priority, latest request is preempted and
 * resumed later with nothing lost. A request's tokens are the same whatever else runs beside
 * it (batch invariance, on the CPU backend).
 *
 * Threads: loom_engine_submit, loom_engine_cancel and loom_engine_get_stats may be called from
 * any thread at any time. loom_engine_step must be called from one thread at a time (the
 * "step thread") and not at all in background mode, where the engine's own thread steps and
 * delivers events through params.on_event (called on that thread). */

typedef struct loom_engine loom_engine;
typedef uint64_t loom_request_id; /* 0 is never a valid id */

typedef enum loom_preempt_mode {
    LOOM_PREEMPT_RECOMPUTE = 0, /* free the victim's blocks; recompute prompt + output later */
    LOOM_PREEMPT_SWAP = 1,      /* copy the victim's blocks to host memory and back */
} loom_preempt_mode;

typedef enum loom_event_kind {
    LOOM_EVENT_TOKEN = 0,    /* a token was produced */
    LOOM_EVENT_FINISHED = 1, /* the request (or one of its n samples) finished */
    LOOM_EVENT_FAILED = 2,   /* the request failed; status says why; nothing more will come */
} loom_event_kind;

typedef enum loom_finish_reason {
    LOOM_FINISH_LENGTH = 0,      /* max_tokens reached */
    LOOM_FINISH_EOS = 1,         /* an end-of-generation token of the model */
    LOOM_FINISH_STOP_TOKEN = 2,  /* one of the request's stop token ids */
    LOOM_FINISH_STOP_STRING = 3, /* one of the request's stop strings (not included in text) */
    LOOM_FINISH_CANCELLED = 4,   /* loom_engine_cancel */
    LOOM_FINISH_CONTEXT = 5,     /* the request's context is full */
} loom_finish_reason;

typedef struct loom_event {
    loom_event_kind kind;
    loom_request_id id;
    void *user_data;        /* the request's user_data */
    int32_t sample;         /* which of the request's n samples (0 .. n-1) */
    loom_token token;       /* TOKEN: the token; -1 otherwise */
    const char *text;       /* TOKEN: text completed by this token (whole UTF-8 characters,
                               stop strings withheld until ruled out); valid until the next
                               step; may be empty */
    size_t text_len;
    loom_finish_reason reason; /* FINISHED */
    loom_status status;        /* FAILED */
    int32_t cached_tokens;     /* FINISHED: prompt tokens this sample reused from the prefix
                                  cache (at its last admission) */
} loom_event;

/* Called once per event in background mode, on the engine's thread. Must not call
 * loom_engine_step or loom_engine_destroy; may call submit/cancel/get_stats. */
typedef void (*loom_event_fn)(const loom_event *event, void *user_data);

typedef struct loom_engine_params {
    int64_t kv_bytes;           /* KV-cache budget in bytes; 0: use kv_fraction */
    float kv_fraction;          /* fraction of the backend's free memory for the KV cache when
                                   kv_bytes is 0 (default 0.25) */
    int32_t block_size;         /* tokens per KV block (default 16) */
    int32_t max_batched_tokens; /* token budget of one step (default 512) */
    int32_t max_seqs;           /* most sequences in one step (default 64) */
    int32_t max_ctx;            /* positions one request may hold; 0: the model's training
                                   context capped at 8192 */
    bool prefix_cache;          /* reuse cached KV blocks of shared prompt prefixes (default
                                   true) */
    loom_preempt_mode preempt;  /* default LOOM_PREEMPT_RECOMPUTE */
    bool fcfs;                  /* plain first-come-first-served: ignore priorities and
                                   deadlines (default false) */
    double starvation_s;        /* a request waiting longer is promoted (default 30) */
    float watermark;            /* fraction of blocks admission keeps free (default 0.01) */
    loom_event_fn on_event;     /* non-NULL: background mode — a thread steps the engine */
    void *on_event_user_data;
} loom_engine_params;

typedef struct loom_request_params {
    const char *prompt;              /* UTF-8 text, or NULL when prompt_tokens is given */
    const loom_token *prompt_tokens; /* token ids (copied at submit) */
    size_t n_prompt_tokens;
    bool add_special;                /* text prompts: add BOS etc. (default true) */
    bool parse_special;              /* text prompts: parse control-token text (default
                                        false) */
    loom_sampler_params sampler;     /* default loom_sampler_default_params() */
    int32_t max_tokens;              /* most tokens to generate per sample (default 128) */
    int32_t n;                       /* samples of the prompt, sharing its KV (default 1) */
    const loom_token *stop_tokens;   /* ids that end a sample (copied) */
    size_t n_stop_tokens;
    const char *const *stop_strings; /* texts that end a sample (copied) */
    size_t n_stop_strings;
    bool ignore_eos;                 /* do not stop at the model's end-of-generation tokens */
    int32_t priority;                /* higher runs first (default 0) */
    double ttft_deadline_s;          /* wanted time to first token after submit; 0: none */
    double tpot_deadline_s;          /* wanted time per output token; 0: none */
    uint64_t cache_salt;             /* requests share cached prefixes only with equal salts */
    void *user_data;                 /* returned in every event of the request */
} loom_request_params;

typedef struct loom_engine_stats {
    int32_t running;           /* requests with KV in use */
    int32_t waiting;           /* queued, not yet admitted or preempted */
    int32_t kv_blocks_total;
    int32_t kv_blocks_used;    /* held by requests */
    int32_t kv_blocks_cached;  /* free but holding a reusable prefix */
    int32_t kv_blocks_free;
    int64_t prefix_query_tokens; /* prompt tokens looked up in the prefix cache */
    int64_t prefix_hit_tokens;   /* of which were found */
    int64_t preemptions;
    int64_t steps;
    int64_t tokens_generated;
    int64_t requests_finished;
} loom_engine_stats;

/* Defaults. Thread-safe. */
LOOM_API loom_engine_params loom_engine_default_params(void);
LOOM_API loom_request_params loom_request_default_params(void);

/* Creates an engine over model (which must outlive it); params may be NULL. Sizes the KV cache
 * and every per-step buffer now. With params->on_event set, starts the background thread.
 * Errors: INVALID_ARG (NULL, vocab_only model, bad params), OUT_OF_MEMORY (the KV budget
 * cannot be allocated, or holds fewer blocks than one full context needs), BACKEND. */
LOOM_API loom_status loom_engine_create(loom_model *model, const loom_engine_params *params,
                                        loom_engine **out);

/* Stops the background thread if any, fails nothing, frees everything. NULL is a no-op.
 * Requests still queued are dropped without events. Not from an event callback. */
LOOM_API void loom_engine_destroy(loom_engine *engine);

/* Queues a request; *out_id identifies it in events and for cancel. Everything is validated
 * and copied here, so bad input fails now and nothing of it is kept. Thread-safe.
 * Errors: INVALID_ARG (NULL, no prompt, n < 1, max_tokens < 1, bad sampler settings: negative
 *   temperature, top_p outside (0, 1]), BAD_INPUT (invalid UTF-8, a token id out of range),
 *   CONTEXT_FULL (the prompt does not fit max_ctx or the whole KV budget). */
LOOM_API loom_status loom_engine_submit(loom_engine *engine, const loom_request_params *req,
                                        loom_request_id *out_id);

/* Cancels a request wherever it is: it finishes with LOOM_FINISH_CANCELLED at the next step
 * and everything it holds is freed. Thread-safe. Errors: INVALID_ARG, NOT_FOUND (unknown or
 * already finished id). */
LOOM_API loom_status loom_engine_cancel(loom_engine *engine, loom_request_id id);

/* Runs one step: admits submitted requests, schedules, runs one batched forward pass, samples
 * and writes the step's events to an engine-owned array (*events, *n_events; valid until the
 * next step). With nothing to do it returns LOOM_OK with no events. A failure inside the step
 * fails only the requests it touched (FAILED events) when that is possible; the engine stays
 * usable. Errors: INVALID_ARG, BUSY (background mode), BACKEND, INTERNAL. */
LOOM_API loom_status loom_engine_step(loom_engine *engine, const loom_event **events,
                                      size_t *n_events);

/* Whether any request is queued or running. Thread-safe. */
LOOM_API bool loom_engine_has_work(loom_engine *engine);

/* Counters and occupancy, a consistent snapshot. Thread-safe. */
LOOM_API loom_status loom_engine_get_stats(loom_engine *engine, loom_engine_stats *out);

#ifdef __cplusplus
}
#endif
