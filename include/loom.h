/*
 * loom.h — the public C ABI of loom, an LLM inference runtime.
 *
 * Conventions (they hold for every function below unless its comment says otherwise):
 *   - Every fallible function returns a loom_status; LOOM_OK (0) is success. Out-parameters
 *     come last. On failure, out-parameters are left untouched (handles stay NULL) and a
 *     human-readable message is available from loom_last_error() on the calling thread.
 *   - Handles are opaque. Every *_free / *_destroy accepts NULL.
 *   - Parameter structs are obtained from *_default_params(); set the fields you care about.
 *   - ABI across versions. Every parameter and result struct begins with `size_t size`: the
 *     sizeof the caller's header gives it. Parameter structs get it from *_default_params()
 *     (inline wrappers over the exported *_params_init(p, sizeof *p)); a caller sets it in a
 *     result struct before the call (`loom_engine_stats st = {.size = sizeof st};`). Fields are
 *     only ever appended, so a program compiled against an older header runs on a newer
 *     library: the library reads the prefix the caller knows (the fields after it keep their
 *     defaults) and writes back only that much. A program compiled against a newer header on
 *     an older library works too, unless it set a field that library lacks: that call fails
 *     with LOOM_ERR_UNSUPPORTED naming the byte offset. A size smaller than the struct ever
 *     was is LOOM_ERR_INVALID_ARG. Structs are never embedded in one another (the sampler
 *     settings of a request are a pointer). Arrays the library returns are arrays of pointers
 *     (loom_engine_step's events), or of the frozen structs loom_token_logprob,
 *     loom_logit_bias and loom_chat_message, whose layout never changes.
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
#define LOOM_VERSION_MINOR 2
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
    X(ERR_BUSY, 12, "the engine is running in background mode")                                    \
    X(ERR_NO_DEVICE, 13, "no usable device for the requested backend")                             \
    X(ERR_OVERLOADED, 14, "the request would miss its deadline under the current load")

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

/* Where compute threads run and weights live on machines with several memory nodes (libnuma;
 * the modes of llama.cpp's --numa). The calling thread is never pinned. Where libnuma is
 * missing or reports NUMA unavailable every mode behaves as OFF. */
typedef enum loom_numa_mode {
    LOOM_NUMA_AUTO = 0,   /* DISTRIBUTE on a multi-node machine, OFF on one node (default) */
    LOOM_NUMA_OFF,        /* no pinning, no placement */
    LOOM_NUMA_DISTRIBUTE, /* worker k on node k % n_nodes; weight pages interleaved */
    LOOM_NUMA_ISOLATE,    /* all workers on the loading thread's node; weights bound to it */
} loom_numa_mode;

/* What form the backend holds the weights in (loom_model_params.weights). */
typedef enum loom_weight_format {
    LOOM_WEIGHTS_AS_STORED = 0, /* the file's types, as they are (default) */
    /* Every matrix (the projections, the output, the token embedding) of a type loom decodes
     * (F32, F16, BF16 and the block formats) is decoded to float32 and requantized at load to
     * FP8 E4M3 with one float32 scale per row (output channel): scale = max |row| / 448, each
     * code the value / scale rounded to nearest even (LOOM_TYPE_FP8_E4M3_ROWS in
     * loom_backend.h). 8 bits per weight (plus 4 bytes a row): a quarter of F32, half of F16,
     * about twice Q4_K's; matmuls over them keep activations in float32. Norm weights and
     * biases stay float32. The CPU and CUDA backends run them (CUDA: a GEMV decoding the codes
     * in registers, float32 activations as on the CPU; with LOOM_CUDA_FP8_GEMM=1 and
     * LOOM_CUDA_BATCH_INVARIANT=0 in the environment, steps of more than 8 tokens on sm_89+
     * use cuBLASLt's FP8 GEMM with activations quantized to E4M3 per token instead — faster,
     * not batch-invariant); a
     * backend without FP8 kernels refuses it (LOOM_ERR_UNSUPPORTED). A matrix
     * holding a NaN or an infinity fails the load (LOOM_ERR_BAD_MODEL). */
    LOOM_WEIGHTS_FP8_E4M3 = 1,
} loom_weight_format;

typedef struct loom_model_params {
    size_t size; /* sizeof(loom_model_params) (see "ABI across versions") */
    /* The backend that computes: "cpu" (built in), the name of a backend plugin
     * (libloom-<name>.so, e.g. "cuda": see loom_backend.h for where it is looked for), or NULL
     * / "auto" (default): the best available — a plugin loom knows of ("cuda") where it loads
     * and finds a device, else the CPU; the choice and the reasons are logged at INFO. A named
     * backend that cannot run fails the load with LOOM_ERR_NO_DEVICE (the message says which
     * file was missing or why it found no device). Borrowed: read during loom_model_load. */
    const char *backend;
    int32_t device; /* device index of the backend (default 0; the CPU has only 0) */
    int n_threads;  /* compute threads per engine or session (CPU backend), and the default
                       number of an engine's sampling threads; <= 0: all online cores */
    /* Map the file and use the weights in place (default true): fast to load, and processes
     * share the page cache. false copies them into the backend's memory, on huge pages where
     * the OS gives them (Linux THP), and releases the mapped pages: slower to load, and
     * one-token decode reads its weights faster (fewer TLB misses; 0-17% measured on our 2-core
     * VMs, most where the page cache held the file in small pages). */
    bool use_mmap;
    bool vocab_only; /* load metadata and tokenizer only: no weights, no sessions */
    /* Matmuls over quantized/F16 weights keep activations in float32 (slower; the closest to
     * exact arithmetic) instead of rounding them per block to 8 bits (or F16) and using
     * integer dot products as llama.cpp does. Default false. */
    bool f32_activations;
    loom_numa_mode numa; /* default LOOM_NUMA_AUTO */
    /* default LOOM_WEIGHTS_AS_STORED; another value than the enum's: INVALID_ARG at load */
    loom_weight_format weights;
} loom_model_params;

/* Fills p[0 .. size) with the defaults for loom_model_load and sets p->size = size (size is the
 * caller's sizeof: the bytes past what this library knows are zeroed). Thread-safe. */
LOOM_API void loom_model_params_init(loom_model_params *p, size_t size);

static inline loom_model_params loom_model_default_params(void) {
    loom_model_params p;
    loom_model_params_init(&p, sizeof p);
    return p;
}

/* Loads a GGUF model (weights, configuration and tokenizer) from path.
 * params may be NULL for the defaults. On success *out owns the model; release it with
 * loom_model_free. The file stays mapped for the model's lifetime.
 * Errors: LOOM_ERR_INVALID_ARG (NULL path/out, bad params, a malformed backend name),
 *   LOOM_ERR_IO (cannot open/map), LOOM_ERR_BAD_MODEL (corrupt or truncated file, missing
 *   tensor or key — the message names the field), LOOM_ERR_UNSUPPORTED (architecture, tensor
 *   type or op the backend does not run; a plugin built for another backend ABI),
 *   LOOM_ERR_NO_DEVICE (the named backend's plugin is missing or cannot be loaded, its driver
 *   is absent, or it has no such device), LOOM_ERR_BACKEND (a plugin without an entry point or
 *   with an incomplete ops table), LOOM_ERR_OUT_OF_MEMORY. */
LOOM_API loom_status loom_model_load(const char *path, const loom_model_params *params,
                                     loom_model **out);

/* Releases the caller's hold on the model. Sessions and engines made from it hold it too: the
 * model's memory goes with the last of them, so they may be freed before or after this call
 * (as a garbage collector does), but the caller must not use the model handle itself after
 * it. Thread-safe with respect to sessions and engines freed on other threads. NULL is a
 * no-op. */
LOOM_API void loom_model_free(loom_model *model);

/* ---- Experimental: synthetic models built in memory --------------------------------------- */
/* A model of any llama / qwen2 / gemma3 shape with seeded random weights of one type, built in
 * memory without a file: for tests and benchmarks that need shapes no small file gives (a
 * Llama-3-8B shape on a machine that receives no large files). The numbers it computes are
 * meaningless; the work is the real model's. Its vocabulary is a SentencePiece-style table
 * (<unk>, <s>, </s>, the 256 byte tokens, then filler pieces), so tokenizing text works.
 * EXPERIMENTAL: this interface may change in any release. */
typedef struct loom_synthetic_params {
    size_t size; /* sizeof(loom_synthetic_params) */
    /* A named shape filling every field below that is 0: "llama3-8b", "gemma3-270m",
     * "qwen2-7b", "smollm2-135m", or NULL (set the fields yourself). Borrowed. */
    const char *preset;
    const char *arch;  /* "llama", "qwen2" or "gemma3" (NULL: the preset's). Borrowed. */
    int32_t n_vocab;   /* tokens (at least 260: control, byte and filler tokens) */
    int32_t n_embd;    /* model width */
    int32_t n_head;    /* query heads */
    int32_t n_head_kv; /* key/value heads (n_head a multiple of it) */
    int32_t head_dim;  /* elements per head (0: n_embd / n_head) */
    int32_t n_ff;      /* feed-forward width */
    int32_t n_layer;
    int32_t n_ctx; /* training context (0: the preset's, else 4096) */
    /* gemma3: the local layers' sliding window (every 6th layer global); llama/qwen2: one
     * window for every layer; 0: none (the preset's, for gemma3). */
    int32_t window;
    float rope_base; /* 0: the preset's, else 10000 */
    /* Weight type of every matrix by its GGUF name: "f32", "f16", "bf16", "q8_0", "q4_0",
     * "q5_0", "q4_K", "q5_K", "q6_K" (any type loom reads; norms are always f32). NULL: "f16".
     * Borrowed. */
    const char *weight_type;
    uint64_t seed; /* weights and their scales (default 1) */
} loom_synthetic_params;

/* Fills p[0 .. size) with the defaults (as loom_model_params_init). Thread-safe. */
LOOM_API void loom_synthetic_params_init(loom_synthetic_params *p, size_t size);

static inline loom_synthetic_params loom_synthetic_default_params(void) {
    loom_synthetic_params p;
    loom_synthetic_params_init(&p, sizeof p);
    return p;
}

/* Builds the synthetic model sp describes and loads it as loom_model_load loads a file
 * (params: the backend and the rest, NULL for the defaults). The model owns its image (about
 * the size of its weights in host memory, for the model's lifetime). Errors: INVALID_ARG (NULL
 * out or sp, an unknown preset or arch, a size that is not positive or is inconsistent —
 * n_head not a multiple of n_head_kv, n_embd not a whole number of blocks of the weight type),
 * UNSUPPORTED (a weight type loom cannot read), OUT_OF_MEMORY, and what loom_model_load
 * returns. */
LOOM_API loom_status loom_model_load_synthetic(const loom_synthetic_params *sp,
                                               const loom_model_params *params, loom_model **out);

typedef struct loom_model_info {
    size_t size;              /* set by the caller: sizeof(loom_model_info) */
    const char *architecture; /* "llama", ... (owned by the model) */
    const char *name;         /* general.name, or "" (owned by the model) */
    int32_t n_vocab;
    int32_t n_ctx_train; /* context length the model was trained with */
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int64_t n_params;         /* number of weight elements */
    int64_t file_bytes;       /* size of the GGUF file */
    loom_token bos;           /* -1 when the model has none */
    loom_token eos;           /* -1 when the model has none */
    const char *cpu_kernels;  /* the CPU matmul kernels this process runs, chosen at the first
                                 use from what the CPU supports: "avx512", "avx2-vnni", "avx2"
                                 or "portable" (static string) */
    const char *backend;      /* the backend computing ("cpu", "cuda", ...; owned by the model;
                                 NULL for a vocab_only model) */
    const char *backend_path; /* the plugin file it came from; "" for the built-in CPU backend
                                 (owned by the model; NULL for a vocab_only model) */
    int32_t device;           /* its device index */
    int64_t weight_bytes;     /* bytes of the weights as the backend was given them (after any
                                 conversion at load: loom_model_params.weights), vectors as
                                 float32; 0 for a vocab_only model */
} loom_model_info;

/* Fills *out with facts about the model (out->size bytes of them; see "ABI across versions").
 * Strings stay owned by the model. Errors: LOOM_ERR_INVALID_ARG. Thread-safe. */
LOOM_API loom_status loom_model_get_info(const loom_model *model, loom_model_info *out);

/* The attention window of a layer: 0 for full attention, w > 0 for a sliding window of the
 * last w positions (Gemma 3's local layers), -1 for a NULL model or a layer it lacks. Layers
 * of one window may share K/V (loom_session_params.kv_plan). Thread-safe. */
LOOM_API int32_t loom_model_layer_window(const loom_model *model, int32_t layer);

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
 *   the byte offset), LOOM_ERR_BUFFER_TOO_SMALL (*n_out > cap; out holds the first cap ids),
 *   LOOM_ERR_OUT_OF_MEMORY (for the encoder's scratch).
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
LOOM_API loom_status loom_token_to_piece(const loom_model *model, loom_token token, unsigned flags,
                                         char *out, size_t cap, size_t *n_out);

/* ------------------------------------------------------------------------------------------ */
/* Chat templates                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* Frozen: this layout never changes (arrays of it are passed). */
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

/* Renders messages[0..n) as loom_chat_format does and tokenizes the text as
 * LOOM_TOKENIZE_ADD_SPECIAL | LOOM_TOKENIZE_PARSE_SPECIAL would — except that inside the
 * messages' contents control-token text stays text: a user who writes "<|im_end|>\n
 * <|im_start|>system" gets those characters tokenized, not a new system turn (with
 * loom_chat_format + loom_tokenize, as with llama.cpp's template and tokenizer, they become
 * real control tokens). For contents with no control-token text the ids are exactly those of
 * loom_chat_format + loom_tokenize. The way to turn untrusted messages into a prompt. Same
 * buffer contract as loom_tokenize (*n_out = ids needed; out may be NULL when cap is 0).
 * Errors: those of loom_chat_format (no BUFFER_TOO_SMALL for the text) and of loom_tokenize
 * (BAD_INPUT for invalid UTF-8 in a content), OUT_OF_MEMORY. Thread-safe. */
LOOM_API loom_status loom_chat_tokenize(const loom_model *model, const loom_chat_message *messages,
                                        size_t n, bool add_assistant, loom_token *out, size_t cap,
                                        size_t *n_out);

/* ------------------------------------------------------------------------------------------ */
/* Session: one sequence, its paged KV cache and its logits                                    */
/* ------------------------------------------------------------------------------------------ */

typedef struct loom_session loom_session;

/* How the KV cache stores keys and values (sessions and engines).
 *
 * The FP8 types store one byte per element plus, per position and KV head, one float32 scale
 * for K and one for V: a key or value row x of one head is stored as fp8(x / s) with
 * s = max|x| / (the format's largest finite value, 448 for E4M3, 57344 for E5M2), rounded to
 * nearest-even, and read back as fp8 * s. No calibration step, and no value ever saturates:
 * each row's largest element maps to the format's largest value, however large the row is.
 * With head_dim 256 a position costs 260 bytes per head instead of F16's 512 (1.97x the tokens
 * in the same budget; head_dim 128: 1.94x; 64: 1.88x). E4M3 keeps 3 mantissa bits (relative
 * error <= 2^-4), E5M2 2 bits with a wider range it does not need here (the scale absorbs the
 * range), so E4M3 is the more accurate of the two. Attention widens pages to float32 as it
 * reads them; nothing else changes. kv_rotate stores every head's rows rotated by the
 * orthonormal Walsh-Hadamard transform (any type; the attention result is the same up to
 * rounding): it spreads a row's few large elements over all of them before rounding, as
 * llama.cpp does for its quantized caches. A backend that cannot store a type refuses it at
 * creation (LOOM_ERR_UNSUPPORTED, naming the op and the type). */
typedef enum loom_kv_cache_type {
    LOOM_KV_CACHE_F16 = 0,      /* IEEE half (default) */
    LOOM_KV_CACHE_BF16 = 1,     /* bfloat16: F32's range, 8 mantissa bits */
    LOOM_KV_CACHE_F32 = 2,      /* float32 (twice F16's memory; a reference) */
    LOOM_KV_CACHE_FP8_E4M3 = 3, /* FP8 E4M3 with per-(position, head) float32 scales */
    LOOM_KV_CACHE_FP8_E5M2 = 4, /* FP8 E5M2 with per-(position, head) float32 scales */
} loom_kv_cache_type;

typedef struct loom_session_params {
    size_t size;        /* sizeof(loom_session_params) (see "ABI across versions") */
    int32_t n_ctx;      /* maximum positions; 0: the model's n_ctx_train capped at 4096 */
    int32_t n_batch;    /* most tokens per forward call (prompt chunking); default 512 */
    int32_t block_size; /* KV-cache block (page) size in tokens; default 16 */
    bool kv_f32;        /* store K/V in float32 (default false); the same as kv_type F32, and
                           an error beside any kv_type other than F16 or F32 */
    loom_kv_cache_type kv_type; /* how K/V are stored (default LOOM_KV_CACHE_F16) */
    bool kv_rotate;             /* store each head's K and V rows rotated by a fixed Hadamard
                                   transform, undone on the query side (loom_kv_cache_type);
                                   needs a power-of-two head_dim (default false) */
    /* Cross-layer KV reuse: the path of a plan file (examples/loom-kv-plan writes them) whose
     * "share L S" lines make layer L attend over layer S's keys and values, computing and
     * storing none of its own, so the cache holds only the source layers (S < L, of the same
     * attention window, itself a source). Applied on top of the sharing the model declares.
     * "merge L S" lines pair two layers MiniCache-style instead: both compute K/V, S's pages
     * keep each token's direction and a small merge block per page block keeps both layers'
     * norms; "merge-retain F" (default 0.1) keeps the fraction F of each block's tokens, the
     * most different between the two layers, unmerged, and the rest of the tokens' directions
     * are interpolated ("merge-t W", default 0.6, the weight of L's); each layer reads its own
     * norm times the shared direction (loom_backend.h, LOOM_KV_MERGED). Merged pairs need F16,
     * BF16 or F32 pages without kv_rotate, and are not batch-invariant: the earlier layer reads
     * its own step's tokens unmerged, so a sequence's results depend on how its prompt was cut
     * into steps. NULL or "" (default): the model's own layers. Borrowed: read during create.
     * Errors at create: IO (cannot read it), INVALID_ARG (naming the file, line and reason: a
     * layer the model lacks, one paired with itself or a later layer, a chain, different
     * windows, a layer in two merged pairs or read by another, a fraction outside [0, 1]),
     * UNSUPPORTED (merged pairs over other pages, or on a backend without them). */
    const char *kv_plan;
} loom_session_params;

/* Fills p[0 .. size) with the defaults for loom_session_create (as loom_model_params_init). */
LOOM_API void loom_session_params_init(loom_session_params *p, size_t size);

static inline loom_session_params loom_session_default_params(void) {
    loom_session_params p;
    loom_session_params_init(&p, sizeof p);
    return p;
}

/* Creates a session over model, allocating its KV cache and work buffers up front (nothing is
 * allocated per token). params may be NULL. The session holds the model (loom_model_free).
 * Errors: LOOM_ERR_INVALID_ARG, LOOM_ERR_OUT_OF_MEMORY, LOOM_ERR_BACKEND. */
LOOM_API loom_status loom_session_create(loom_model *model, const loom_session_params *params,
                                         loom_session **out);

/* Releases the session. NULL is a no-op. */
LOOM_API void loom_session_free(loom_session *session);

/* Forgets every position: the next decode starts at position 0. Never fails. */
LOOM_API void loom_session_reset(loom_session *session);

/* Number of positions currently in the session's cache. */
LOOM_API int32_t loom_session_n_past(const loom_session *session);

/* Copies what the session's cache holds for layer `layer` at positions [pos, pos + n) into
 * k and v (each [n][n_head_kv][head_dim] floats; either may be NULL), widened to float32 from
 * the pages' type (FP8 codes times their scales): the keys after their norm and RoPE, as
 * attention reads them — rotated when the session stores them rotated (kv_rotate). A layer
 * that reads an earlier layer's K/V (kv_plan) gives its source's. For calibration and
 * inspection (examples/loom-kv-plan); it waits for the session's work and copies from the
 * backend. Not thread-safe with other calls on the same session.
 * Errors: INVALID_ARG (NULL session, no output, a layer the model lacks, positions past
 * n_past or no longer held: a sliding-window layer keeps only its window), OUT_OF_MEMORY,
 * BACKEND. */
LOOM_API loom_status loom_session_kv_read(loom_session *session, int32_t layer, int32_t pos,
                                          int32_t n, float *k, float *v);

/* Runs the model over tokens[0..n) at positions n_past .. n_past+n-1, appending them to the
 * cache. If all_logits is true, logits of every one of the n positions are kept
 * (loom_session_logits(s, i) for i in 0..n-1); otherwise only the last one's (i = n-1).
 * Errors: LOOM_ERR_INVALID_ARG (n <= 0, NULL), LOOM_ERR_BAD_INPUT (a token id out of range;
 *   nothing is appended), LOOM_ERR_CONTEXT_FULL (n_past + n > n_ctx; nothing is appended),
 *   LOOM_ERR_OUT_OF_MEMORY (all_logits rows beyond what the session holds; nothing is
 *   appended), LOOM_ERR_BACKEND. */
LOOM_API loom_status loom_session_decode(loom_session *session, const loom_token *tokens, int32_t n,
                                         bool all_logits);

/* Logits (n_vocab floats, owned by the session) of row i of the last decode: i = -1 means its
 * last token. NULL when that row was not kept or i is out of range. Valid until the next
 * decode or reset. */
LOOM_API const float *loom_session_logits(const loom_session *session, int32_t i);

/* ------------------------------------------------------------------------------------------ */
/* Sampling: the sampler chain                                                                */
/* ------------------------------------------------------------------------------------------ */
/*
 * Every sampled token goes through one chain, configured per request, in this fixed order:
 *   1. logit bias      x_i += bias for each listed token id (-inf bans the token).
 *   2. penalties       over the last penalty_last_n tokens of the history (the prompt, then the
 *                      tokens generated so far), each distinct token seen c times has its logit
 *                      divided by repeat_penalty if positive (multiplied if negative), then
 *                      presence_penalty + c * frequency_penalty subtracted (llama.cpp's and
 *                      OpenAI's meaning of the three).
 *   3. entropy correction  H = Shannon entropy, in nats, of softmax(x) after steps 1-2 over the
 *                      whole vocabulary. The mode turns H into an effective temperature T:
 *                        NONE      T = temperature
 *                        EXP       T = temperature * exp(exp_beta * H), i.e. the logits are
 *                                  scaled by exp(-exp_beta * H) before the temperature
 *                        EDT       T = temperature * edt_n ^ (edt_theta / max(H, edt_h_min))
 *                        DYNATEMP  T = dyn_t_min + (dyn_t_max - dyn_t_min) * r ^ dyn_exponent,
 *                                  r = H / ln n clamped to [0, 1], n = tokens with a finite
 *                                  logit; temperature only says greedy (0) or not.
 *   4. temperature     p = softmax(x / T).
 *   5. top-k, 6. top-p, 7. min-p, 8. typical-p: each keeps part of what the step before left,
 *                      renormalized. They act on the corrected, tempered distribution, the one
 *                      actually sampled from (top-k's choice does not depend on T).
 *   9. draw            inverse CDF with a uniform number from a counter-based RNG keyed by
 *                      (seed, draw_index): a token never depends on what else runs beside it,
 *                      on the thread count or on the schedule.
 * temperature == 0 means greedy in every mode: the arg max after steps 1-2 (ties: the lower
 * id). An effective temperature that underflows to 0 (EDT as H -> 0) is greedy as well.
 * The default parameters switch steps 1-3 and 7-8 off.
 */

typedef enum loom_entropy_mode {
    LOOM_ENTROPY_NONE = 0,     /* no correction */
    LOOM_ENTROPY_EXP = 1,      /* logits * exp(-beta H) */
    LOOM_ENTROPY_EDT = 2,      /* entropy-based dynamic temperature (Zhang et al. 2024) */
    LOOM_ENTROPY_DYNATEMP = 3, /* T between two bounds by normalized entropy (llama.cpp's) */
} loom_entropy_mode;

/* Frozen: this layout never changes (arrays of it are passed). */
typedef struct loom_logit_bias {
    loom_token id; /* in [0, n_vocab) */
    float bias;    /* added to the logit; -inf bans the token; +inf and NaN are invalid */
} loom_logit_bias;

typedef struct loom_sampler_params {
    size_t size;       /* sizeof(loom_sampler_params) (see "ABI across versions") */
    float temperature; /* >= 0, finite; 0: greedy (arg max); default 0.8 */
    int32_t top_k;     /* keep the k most likely; <= 0: off; default 40 */
    float top_p;       /* keep the smallest most-likely set with mass >= top_p; in (0, 1];
                          1: off; default 0.95 */
    uint64_t seed;     /* RNG seed; default 0x5EED */
    float min_p;       /* keep tokens with p >= min_p * p_max; in [0, 1]; 0: off (default) */
    float typical_p;   /* keep the tokens whose surprisal -ln p is closest to the entropy until
                          their mass reaches typical_p; in (0, 1]; 1: off (default) */
    const loom_logit_bias *logit_bias; /* [n_logit_bias]; duplicates add up. Borrowed: read
                                          during the call (the engine copies it at submit) */
    size_t n_logit_bias;
    int32_t penalty_last_n;         /* history tokens the penalties look at: 0 none, -1 all;
                                       default 64 */
    float repeat_penalty;           /* > 0; 1: off (default) */
    float presence_penalty;         /* finite; 0: off (default) */
    float frequency_penalty;        /* finite; 0: off (default) */
    loom_entropy_mode entropy_mode; /* default LOOM_ENTROPY_NONE */
    float exp_beta;                 /* EXP: beta >= 0; default 0.5 */
    float edt_n;                    /* EDT: N in (0, 1]; default 0.8 */
    float edt_theta;                /* EDT: theta >= 0; default 1 */
    float edt_h_min;    /* EDT: entropy floor > 0 (nats) keeping theta / H finite; default 1e-3 */
    float dyn_t_min;    /* DYNATEMP: 0 <= dyn_t_min <= dyn_t_max; default 0.5 */
    float dyn_t_max;    /* DYNATEMP: finite; default 1.5 */
    float dyn_exponent; /* DYNATEMP: >= 0; default 1 */
    int32_t n_logprobs; /* alternatives reported per token (loom_token_info.top_raw and
                           top_final), in [0, n_vocab]; default 0. The engine allows at most
                           loom_engine_params.max_logprobs. */
} loom_sampler_params;

/* Fills p[0 .. size) with the defaults for sampling (see each field; as
 * loom_model_params_init). */
LOOM_API void loom_sampler_params_init(loom_sampler_params *p, size_t size);

static inline loom_sampler_params loom_sampler_default_params(void) {
    loom_sampler_params p;
    loom_sampler_params_init(&p, sizeof p);
    return p;
}

/* Frozen: this layout never changes (loom_token_info points to arrays of it). */
typedef struct loom_token_logprob {
    loom_token id;
    float logprob; /* natural logarithm of the probability */
} loom_token_logprob;

/* What the chain saw and did for one sampled token. The entropies are always filled (the chain
 * computes them anyway); the top arrays hold at most n_logprobs entries, best first (equal
 * probabilities: lower id first), and point into memory owned by whoever produced the info. */
typedef struct loom_token_info {
    size_t size; /* loom_sampler_run's out: set by the caller (sizeof); in events and
                    callbacks: the library's sizeof */
    loom_token token;
    float logprob_raw;    /* of token under softmax(the model's logits): before bias, penalties,
                             correction, temperature and filters */
    float logprob_final;  /* of token under the distribution drawn from (after every step,
                             renormalized over the survivors); 0 for a greedy step */
    int32_t n_candidates; /* tokens the draw could pick (1 when greedy) */
    double entropy;       /* H in nats of softmax after bias and penalties: what the entropy
                             correction sees (the model's own when neither is set) */
    double varentropy;    /* variance of -ln p under that distribution, nats^2 */
    double entropy_final; /* H of the distribution drawn from (0 when greedy) */
    double temperature;   /* the effective temperature (0 when greedy) */
    const loom_token_logprob *top_raw;   /* [n_top_raw] most likely under the model's logits */
    const loom_token_logprob *top_final; /* [n_top_final] most likely in the final
                                            distribution (a greedy step: the token, 0) */
    int32_t n_top_raw;                   /* min(n_logprobs, tokens with a finite logit) */
    int32_t n_top_final;                 /* min(n_logprobs, n_candidates) */
} loom_token_info;

/* A reusable sampler: the chain's workspace for one vocabulary size. */
typedef struct loom_sampler loom_sampler;

/* Creates a sampler for n_vocab tokens. Its workspace (about 32 bytes per token) is allocated
 * here, so loom_sampler_run allocates only to grow its logprob arrays the first time a larger
 * n_logprobs is asked for. Release with loom_sampler_free. A sampler is used by one thread at a
 * time. Errors: INVALID_ARG (NULL out, n_vocab <= 0 or too large), OUT_OF_MEMORY. */
LOOM_API loom_status loom_sampler_create(int32_t n_vocab, loom_sampler **out);

/* Releases the sampler. NULL is a no-op. */
LOOM_API void loom_sampler_free(loom_sampler *sampler);

/* Runs the chain over logits[0..n_vocab) (not modified) and writes the token and what the chain
 * saw to *out. history[0..n_history) are the sequence's tokens so far, oldest first (the
 * prompt, then the generated tokens): the penalties look at its tail; history may be NULL when
 * n_history is 0. draw_index selects the random number, so the same (seed, draw_index) give
 * the same token anywhere. out->top_raw and out->top_final point into the sampler and stay
 * valid until its next run or free. NaN logits count as -inf.
 * Errors: INVALID_ARG (NULL, bad params: the message names the field, e.g. "top_p 1.5 must be
 *   in (0, 1]"), BAD_INPUT (a history id out of range, a +inf logit, a logit pushed to +inf by
 *   bias or penalties, no finite logit), OUT_OF_MEMORY. Not thread-safe per sampler. */
LOOM_API loom_status loom_sampler_run(loom_sampler *sampler, const float *logits,
                                      const loom_sampler_params *params, const loom_token *history,
                                      size_t n_history, uint64_t draw_index, loom_token_info *out);

/* Picks one token from logits[0..n_vocab) with the chain above and no history (penalties have
 * nothing to act on, n_logprobs is ignored). Same draw as loom_sampler_run with the same
 * (seed, draw_index). Allocates a workspace for n_vocab tokens on every call: loops should use
 * a loom_sampler. Errors: as loom_sampler_run (INVALID_ARG also for n_vocab <= 0).
 * Thread-safe. */
LOOM_API loom_status loom_sample(const float *logits, int32_t n_vocab,
                                 const loom_sampler_params *params, uint64_t draw_index,
                                 loom_token *out);

/* ------------------------------------------------------------------------------------------ */
/* Generation                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* A per-token trace (declared here because generation and the engine record into one; see
 * "Per-token trace" below). */
typedef struct loom_trace loom_trace;

/* Receives each newly generated piece of text (complete UTF-8 characters only) and its token.
 * Return false to stop generation early. */
typedef bool (*loom_piece_fn)(const char *piece, size_t len, loom_token token, void *user_data);

/* Receives what the sampler saw for each sampled token (see loom_token_info); info and its
 * arrays are valid only during the call. */
typedef void (*loom_token_info_fn)(const loom_token_info *info, void *user_data);

typedef struct loom_generate_params {
    size_t size;       /* sizeof(loom_generate_params) (see "ABI across versions") */
    int32_t n_predict; /* most tokens to generate; default 128 */
    const loom_sampler_params *sampler; /* NULL (default): loom_sampler_default_params(). The
                                    penalties' history is the prompt, then the generated
                                    tokens. Borrowed: read during loom_generate */
    bool add_special;                   /* add BOS etc. to the prompt (default true) */
    bool parse_special; /* control-token text in the prompt is parsed (default false) */
    bool stop_at_eos;   /* stop on the model's end-of-generation tokens (default true) */
    loom_token_info_fn on_token_info; /* optional (default NULL): called for every sampled token,
                                         before its on_piece, also for an end-of-generation
                                         token that stops generation */
    void *token_info_user_data;       /* passed to on_token_info */
    loom_trace *trace; /* optional (default NULL: no tracing): records one step per forward pass
                          (the prompt's is the first) and one token record per sampled token,
                          as the engine does (see "Per-token trace"). Borrowed: must stay
                          alive until loom_generate returns */
} loom_generate_params;

typedef struct loom_generate_stats {
    size_t size;         /* set by the caller: sizeof(loom_generate_stats) */
    int32_t n_prompt;    /* prompt tokens */
    int32_t n_generated; /* generated tokens */
    double prompt_ms;    /* wall time of the prompt's forward passes */
    double generate_ms;  /* wall time of generation (forward + sampling) */
} loom_generate_stats;

/* Fills p[0 .. size) with the defaults for loom_generate (as loom_model_params_init). */
LOOM_API void loom_generate_params_init(loom_generate_params *p, size_t size);

static inline loom_generate_params loom_generate_default_params(void) {
    loom_generate_params p;
    loom_generate_params_init(&p, sizeof p);
    return p;
}

/* Resets session, tokenizes prompt, runs it, then samples up to n_predict tokens, calling
 * on_piece (may be NULL) for each. stats may be NULL. The token at position p is drawn with
 * (sampler.seed, p), as the engine draws sample 0 of a request.
 * Errors: those of loom_tokenize, loom_session_decode and loom_sampler_run (bad sampler
 *   settings are INVALID_ARG before anything runs); LOOM_ERR_CONTEXT_FULL when the prompt
 *   alone does not fit (nothing is generated); LOOM_ERR_OUT_OF_MEMORY. Hitting n_ctx during
 *   generation stops it with LOOM_OK. */
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
 * (copy-on-write); when blocks run out, the lowest-priority request with the least computed
 * (then the latest) is preempted and resumed later with nothing lost; a request preempted
 * twice is spared for a while (no thrashing). Under overload the order keeps deadlines that
 * can still be met: within a priority, requests that can still meet their deadline go first
 * (earliest first), then those that missed it, then those without one. A request's tokens are the
 * same whatever else runs beside it (batch invariance: on the CPU backend, and on CUDA by
 * default — LOOM_CUDA_BATCH_INVARIANT=0 in the environment trades it for faster decode steps
 * and prefills, see the README; LOOM_CUDA_MATH=bf16, 16-bit tensor-core operands, keeps it,
 * as does LOOM_CUDA_WGMMA=1 with it on Hopper: matmuls and attention on the warpgroup MMA).
 *
 * Threads: loom_engine_submit, loom_engine_cancel and loom_engine_get_stats may be called from
 * any thread at any time. loom_engine_step (and loom_engine_generate, which steps) must be
 * called from one thread at a time (the "step thread") and not at all in background mode,
 * where the engine's own thread steps and delivers events through params.on_event (called on
 * that thread). */

typedef struct loom_engine loom_engine;
typedef uint64_t loom_request_id; /* 0 is never a valid id */

typedef enum loom_preempt_mode {
    LOOM_PREEMPT_RECOMPUTE = 0, /* free the victim's blocks; recompute prompt + output later */
    LOOM_PREEMPT_SWAP = 1,      /* copy the victim's blocks to host memory and back */
} loom_preempt_mode;

/* What the engine does with a request whose time to first token, predicted at submit from the
 * queue ahead of it and the engine's step-cost model, is later than its ttft_deadline_s
 * (loom_engine_params.admission). Requests without a TTFT deadline are always admitted. */
typedef enum loom_admission_policy {
    LOOM_ADMIT_ALL = 0,         /* admit every request (the default) */
    LOOM_ADMIT_REJECT_LATE = 1, /* refuse it: submit returns LOOM_ERR_OVERLOADED, and the
                                   message gives the predicted TTFT (an HTTP server answers
                                   429 with Retry-After) */
    LOOM_ADMIT_DEGRADE = 2,     /* admit it as best-effort: no deadlines, priority min(p, 0) */
} loom_admission_policy;

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

/* One event, owned by the engine (reached through a pointer: fields may be appended). */
typedef struct loom_event {
    loom_event_kind kind;
    loom_request_id id;
    void *user_data;  /* the request's user_data */
    int32_t sample;   /* which of the request's n samples (0 .. n-1) */
    loom_token token; /* TOKEN: the token; -1 otherwise */
    const char *text; /* TOKEN: text completed by this token (whole UTF-8 characters,
                         stop strings withheld until ruled out); valid until the next
                         step; may be empty */
    size_t text_len;
    loom_finish_reason reason;   /* FINISHED */
    loom_status status;          /* FAILED */
    int32_t cached_tokens;       /* FINISHED: prompt tokens this sample reused from the prefix
                                    cache (at its last admission) */
    const loom_token_info *info; /* TOKEN: what the sampler saw and did (never NULL; its top
                                    arrays hold the request's n_logprobs entries at most);
                                    valid until the next step. NULL for other kinds */
} loom_event;

/* Called once per event in background mode, on the engine's thread. Must not call
 * loom_engine_step or loom_engine_destroy; may call submit/cancel/get_stats. */
typedef void (*loom_event_fn)(const loom_event *event, void *user_data);

typedef struct loom_engine_params {
    size_t size;                /* sizeof(loom_engine_params) (see "ABI across versions") */
    int64_t kv_bytes;           /* KV-cache budget in bytes; 0: use kv_fraction. Split
                                   between the model's KV groups (layers with the same
                                   attention window): a sliding-window group gets at most
                                   what max_seqs running requests can hold in it (their last
                                   window plus one step of max_batched_tokens, with room for
                                   copy-on-write and, with prefix_cache, for about max_seqs / 8
                                   cached windows); every other byte goes to the full-attention
                                   layers, so on models such as Gemma 3 a large budget holds
                                   several times more context than an equal split would. A
                                   model with only one kind of layer splits it equally */
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
    double starvation_s;        /* a request waiting longer is promoted (default 30; 0 or
                                   +inf: never; finite values up to 1e9): it ranks above
                                   every request of lower priority than the lowest priority
                                   that has a request still able to meet its deadline (above
                                   everything when none can), so promotion never costs a
                                   deadline that can still be met */
    float watermark;            /* fraction of blocks admission keeps free (default 0.01) */
    loom_event_fn on_event;     /* non-NULL: background mode — a thread steps the engine */
    void *on_event_user_data;
    int32_t max_logprobs;            /* most sampler.n_logprobs a request may ask for (default 20);
                                        each sample of a request holds 2 * n_logprobs entries */
    loom_trace *trace;               /* optional (default NULL: no tracing, and no cost beyond a
                                        pointer test per phase): every step that runs a batch appends
                                        a step record and one token record per produced token (see
                                        "Per-token trace"). Borrowed: must outlive the engine; may be
                                        written or cleared from any thread while the engine runs */
    int32_t n_sample_threads;        /* threads that run a step's sampler chains, the step thread
                                        included, from a pool the engine owns (0, the default: the
                                        model's n_threads; at most 8, and never more than max_seqs
                                        are used). A token never depends on it */
    const char *record_path;         /* optional (default NULL): records the engine's inputs to this
                                        file (created, or truncated), for loom_engine_create_replay —
                                        each request as the step that took it saw it (prompt tokens,
                                        every sampler setting, arrival), each cancellation, and the
                                        scheduler's clock readings and a digest of the events of
                                        each step. Each request and cancellation is flushed as a step
                                        takes it, before it is acted on, so a run that crashes keeps
                                        what it was doing. The path is copied at create (IO if it
                                        cannot be created); a write that fails later ends the record
                                        with a log line (ERROR) and the engine goes on. Costs a write
                                        per step, per request and per cancellation; two engines must
                                        not record into one path */
    loom_admission_policy admission; /* default LOOM_ADMIT_ALL; see loom_engine_predict_ttft for
                                        what the prediction counts */
    loom_kv_cache_type kv_type;      /* how K/V are stored (default LOOM_KV_CACHE_F16). kv_bytes
                                        counts real bytes, FP8's scales included: the same budget
                                        holds about twice the tokens with FP8 */
    bool kv_rotate;                  /* as loom_session_params.kv_rotate (default false) */
    const char *kv_plan;             /* as loom_session_params.kv_plan: the budget then holds
                                        tokens of the source layers only, and the merge blocks
                                        of merged pairs (default NULL) */
} loom_engine_params;

typedef struct loom_request_params {
    size_t size;                     /* sizeof(loom_request_params) (see "ABI across versions") */
    const char *prompt;              /* UTF-8 text, or NULL when prompt_tokens is given */
    const loom_token *prompt_tokens; /* token ids (copied at submit) */
    size_t n_prompt_tokens;
    bool add_special;                   /* text prompts: add BOS etc. (default true) */
    bool parse_special;                 /* text prompts: parse control-token text (default
                                           false) */
    const loom_sampler_params *sampler; /* NULL (default): loom_sampler_default_params().
                                        Copied at submit, with its logit-bias list. Penalties
                                        see the prompt, then the sample's generated tokens; the
                                        token at position p is drawn with index p, and sample
                                        i > 0 with a seed derived from (seed, i) */
    int32_t max_tokens;                 /* most tokens to generate per sample (default 128; any
                                           value >= 1: a sample that fills max_ctx first ends
                                           with LOOM_FINISH_CONTEXT, and token storage grows as
                                           tokens come, so nothing is reserved for it) */
    int32_t n;                          /* samples of the prompt, sharing its KV (default 1) */
    const loom_token *stop_tokens;      /* ids that end a sample (copied) */
    size_t n_stop_tokens;
    const char *const *stop_strings; /* texts that end a sample (copied) */
    size_t n_stop_strings;
    bool ignore_eos;        /* do not stop at the model's end-of-generation tokens */
    int32_t priority;       /* higher runs first (default 0) */
    double ttft_deadline_s; /* wanted time to first token after the request's arrival
                               (arrival_s, or its submit); 0 or +inf: none; finite values
                               up to 1e9 s */
    double tpot_deadline_s; /* wanted time per output token; 0 or +inf: none; up to 1e9 s */
    uint64_t cache_salt;    /* requests share cached prefixes only with equal salts */
    void *user_data;        /* returned in every event of the request */
    double arrival_s;       /* when the request arrived, in seconds of
                               loom_engine_now()'s clock, for a caller that queued it
                               before submitting (default 0: at submit). The arrival
                               orders the waiting queue (after priority and deadline),
                               starts the TTFT deadline, the starvation age and the TTFT
                               statistics, and is the trace's since-arrival origin.
                               Must be finite and > 0 (or 0), and at most
                               LOOM_ENGINE_ARRIVAL_SLACK_S after the submit (a little
                               later is taken as the submit time) */
} loom_request_params;

/* How far in the future of submit a request's arrival_s may lie: room for a caller whose
 * clock reading is converted with rounding. Later arrivals are refused (INVALID_ARG). */
#define LOOM_ENGINE_ARRIVAL_SLACK_S 0.001

typedef struct loom_engine_stats {
    size_t size;     /* set by the caller: sizeof(loom_engine_stats) */
    int32_t running; /* requests with KV in use */
    int32_t waiting; /* queued, not yet admitted or preempted */
    /* The kv_blocks_* figures describe one pool: that of the first KV group, the
     * full-attention layers' when the model has any (else its only or first sliding-window
     * group). It is the pool that limits how much context fits, the one admission and
     * preemption count, and the one whose size max_ctx and prompts are checked against
     * (block_size tokens a block). Sliding-window groups have their own, smaller pools (see
     * kv_bytes), sized so that they never run out first. total = used + cached + free. */
    int32_t kv_blocks_total;
    int32_t kv_blocks_used;   /* held by requests */
    int32_t kv_blocks_cached; /* free but holding a reusable prefix */
    int32_t kv_blocks_free;
    int64_t prefix_query_tokens; /* prompt tokens looked up in the prefix cache */
    int64_t prefix_hit_tokens;   /* of which were found */
    int64_t preemptions;
    int64_t steps;
    int64_t tokens_generated;
    int64_t requests_finished;
    /* Latency, over requests that have ended (finished, cancelled or failed) after producing
     * tokens. TTFT: from the request's arrival (its arrival_s, or its submit) to its first
     * token (of any sample). TPOT: over the request's samples with two tokens or more, the
     * time from each one's first token to its last divided by its tokens after the first
     * (summed over the samples). Means are over every such request since create; p50 and p99
     * are nearest-rank percentiles over the most recent LOOM_ENGINE_LATENCY_WINDOW of them.
     * All 0 while there is none. */
    int64_t ttft_count; /* requests in the TTFT figures */
    double ttft_mean_s;
    double ttft_p50_s;
    double ttft_p99_s;
    int64_t tpot_count; /* requests in the TPOT figures */
    double tpot_mean_s;
    double tpot_p50_s;
    double tpot_p99_s;
    /* Throughput of generated tokens per second of stepping: busy_s is the wall time spent
     * inside steps that ran a batch (idle time between steps is not counted). tokens_per_s is
     * tokens_generated / busy_s; tokens_per_s_recent the same over the last
     * LOOM_ENGINE_RATE_WINDOW steps that ran a batch. 0 before the first such step. */
    double busy_s;
    double tokens_per_s;
    double tokens_per_s_recent;
    /* The step-cost model the engine fits to its own steps (least squares, recent steps
     * weighing more: half-life LOOM_ENGINE_COST_HALF_LIFE steps): a step computing n tokens
     * whose sequences hold c positions takes about base + per_token * n + per_ctx * c
     * seconds. All 0 before the first step. */
    double step_base_s;
    double step_per_token_s;
    double step_per_ctx_s;
    int64_t rejected; /* submits refused by admission control (LOOM_ERR_OVERLOADED) */
    int64_t degraded; /* requests admitted as best-effort by LOOM_ADMIT_DEGRADE */
} loom_engine_stats;

/* Steps after which a step's weight in the step-cost model halves. */
#define LOOM_ENGINE_COST_HALF_LIFE 128

/* Service per priority class: the requests submitted with one `priority` (a degraded request
 * stays in the class it was submitted in, and is judged against the deadline it asked for). */
typedef struct loom_class_stats {
    size_t size;      /* set by the caller: sizeof(loom_class_stats) */
    int32_t priority; /* the class */
    int64_t admitted; /* submits accepted (degraded ones included) */
    int64_t rejected; /* submits refused with LOOM_ERR_OVERLOADED */
    int64_t degraded; /* admitted as best-effort (LOOM_ADMIT_DEGRADE) */
    int64_t ended;    /* admitted requests that have ended (finished, cancelled, failed) */
    /* TTFT attainment over ended requests that asked for a TTFT deadline: met when the first
     * token came within it; a request that ended without a token missed it */
    int64_t ttft_deadlines;
    int64_t ttft_met;
    int64_t preemptions;      /* of the class's requests */
    int64_t tokens_generated; /* by the class's ended requests */
    /* Percentiles (nearest rank) over the class's last LOOM_ENGINE_LATENCY_WINDOW ended
     * requests with a first token (TTFT) and with two tokens or more (TPOT); 0 while none. */
    double ttft_p50_s;
    double ttft_p99_s;
    double tpot_p50_s;
    double tpot_p99_s;
} loom_class_stats;

/* Classes an engine keeps figures for: the first LOOM_ENGINE_MAX_CLASSES distinct priorities
 * submitted; requests of later ones are served as any other but not counted per class. */
#define LOOM_ENGINE_MAX_CLASSES 16

/* Requests the TTFT/TPOT percentiles of loom_engine_stats look back over. */
#define LOOM_ENGINE_LATENCY_WINDOW 1024
/* Steps tokens_per_s_recent looks back over. */
#define LOOM_ENGINE_RATE_WINDOW 64

/* Fill p[0 .. size) with the defaults (as loom_model_params_init). Thread-safe. */
LOOM_API void loom_engine_params_init(loom_engine_params *p, size_t size);
LOOM_API void loom_request_params_init(loom_request_params *p, size_t size);

static inline loom_engine_params loom_engine_default_params(void) {
    loom_engine_params p;
    loom_engine_params_init(&p, sizeof p);
    return p;
}

static inline loom_request_params loom_request_default_params(void) {
    loom_request_params p;
    loom_request_params_init(&p, sizeof p);
    return p;
}

/* Now, in seconds of the monotonic clock every engine keeps time with (CLOCK_MONOTONIC: it
 * never jumps with the wall clock and counts from an arbitrary origin, typically boot). Stamp a
 * request's arrival_s with it when it arrives, before it is submitted. The trace's times are the
 * same clock in nanoseconds (its origin_ns). Thread-safe. Never fails. */
LOOM_API double loom_engine_now(void);

/* Creates an engine over model (which it holds: loom_model_free); params may be NULL. Sizes the KV
 * cache and every per-step buffer now. With params->on_event set, starts the background thread.
 * Errors: INVALID_ARG (NULL, vocab_only model, bad params), OUT_OF_MEMORY (the KV budget
 * cannot be allocated, or gives some KV group fewer blocks than one request of max_ctx needs:
 * ceil(max_ctx / block_size) + 1 in a full-attention group; the message names the group),
 * BACKEND. */
LOOM_API loom_status loom_engine_create(loom_model *model, const loom_engine_params *params,
                                        loom_engine **out);
/* Sampling on a device backend: a request with n_logprobs <= 256 sampled greedily or with top-k
 * in 1 .. 256 (top-p, min-p, typical-p and every entropy mode then act on the k candidates) is
 * sampled from a summary of its row that the backend makes (loom_backend.h, logits_summary:
 * the row's maximum, normalizer, entropy, varentropy and 256 best logits, about 2 KB, not the
 * row's 1 MiB for a 262,144-token vocabulary), its logit bias and penalties applied there (a
 * penalty window of more than 1,024 tokens copies the row). Its tokens and loom_token_info are
 * those of the whole row, up to the last bits of the float64 sums (the device's order; with
 * bias or penalties the raw log-probabilities' normalizer is summed over the raw row rather
 * than corrected from the edited one). Top-k off with a temperature copies the row (the chain's
 * top-p then walks the whole vocabulary). The CPU backend copies rows (they are host memory
 * already). The environment variable LOOM_SAMPLE_FROM=rows makes an engine copy every row;
 * =summary on a backend without summaries makes it summarize on the host (a check of the
 * path); read at engine creation. */

/* Creates an engine that replays a record written through loom_engine_params.record_path:
 * each loom_engine_step runs the next recorded step with the same inputs and clock readings, so
 * its events are those of the recorded run (request ids, tokens, texts, log probabilities,
 * finish reasons; user_data is NULL) — a failure seen under load, concurrent submitters and
 * cancellations included, becomes a single-threaded program to debug. Each step checks that:
 * the record holds a digest of every recorded step's events and the number of times its
 * scheduler read the clock, and a step that differs in either has diverged (another backend,
 * device or library version, a model of the same shape with other weights, a kernel that is
 * not deterministic, or memory running short in the replay): it returns LOOM_ERR_INTERNAL
 * naming the step. model must be the recorded one (its shape and backend name are checked at
 * create; its weights show in the digests). The engine takes its parameters from the record
 * (a record may ask for the KV memory its machine had: creation fails with OUT_OF_MEMORY where
 * this one has less); of params (may be NULL) only trace and n_sample_threads are used, which
 * change no token, and on_event and record_path must be NULL. A replay engine takes no submit
 * or cancel (INVALID_ARG); loom_engine_has_work is true while recorded steps remain, then a
 * step returns LOOM_OK with no events. A failed step ends the replay: has_work turns false and
 * every later step returns the same status and message. A record cut short inside a step (a
 * crashed run) replays that step with the requests and cancellations recorded before the cut
 * (a record torn by the cut is dropped with a warning).
 * Errors: INVALID_ARG, IO (cannot open or read path), BAD_INPUT (not a record, a malformed or
 * truncated header — the message names the field and byte offset — or one made with another
 * model shape or backend), OUT_OF_MEMORY, and those of loom_engine_create (the message says
 * they come from the record's parameters). Steps fail with BAD_INPUT (a malformed record, or
 * a recorded request this library refuses), IO, OUT_OF_MEMORY and INTERNAL (a divergence). */
LOOM_API loom_status loom_engine_create_replay(loom_model *model, const char *path,
                                               const loom_engine_params *params, loom_engine **out);

/* Stops the background thread if any, fails nothing, frees everything. NULL is a no-op.
 * Requests still queued are dropped without events. Not from an event callback. */
LOOM_API void loom_engine_destroy(loom_engine *engine);

/* Queues a request; *out_id identifies it in events and for cancel. Everything is validated
 * and copied here, so bad input fails now and nothing of it is kept. Thread-safe.
 * Errors: INVALID_ARG (NULL, no prompt, n < 1, max_tokens < 1, bad sampler settings — e.g. a
 *   negative temperature, top_p outside (0, 1], a logit-bias id outside [0, n_vocab), a NaN
 *   penalty; the message names the field — n_logprobs above the engine's max_logprobs, and an
 *   arrival_s that is negative, not finite or later than now + LOOM_ENGINE_ARRIVAL_SLACK_S),
 *   BAD_INPUT (invalid UTF-8, a token id out of range), CONTEXT_FULL (the prompt does not fit
 *   max_ctx or the whole KV budget), OUT_OF_MEMORY (nothing is queued), OVERLOADED (admission
 *   LOOM_ADMIT_REJECT_LATE, and the request's predicted TTFT is later than its
 *   ttft_deadline_s: nothing is queued; the message gives both, in seconds). */
LOOM_API loom_status loom_engine_submit(loom_engine *engine, const loom_request_params *req,
                                        loom_request_id *out_id);

/* Cancels a request wherever it is: it finishes with LOOM_FINISH_CANCELLED at the next step
 * and everything it holds is freed. Thread-safe. Errors: INVALID_ARG, NOT_FOUND (unknown or
 * already finished id), OUT_OF_MEMORY (the cancellation was not recorded: call again). */
LOOM_API loom_status loom_engine_cancel(loom_engine *engine, loom_request_id id);

/* Runs one step: admits submitted requests, schedules, runs one batched forward pass, samples
 * and sets *events to an engine-owned array of *n_events pointers to the step's events, in
 * order (read them as events[i]->kind; an array of pointers, so loom_event may grow without
 * breaking a compiled caller). Both stay valid until the next step. With nothing to do it
 * returns LOOM_OK with no events. A failure inside the step fails only the requests it touched
 * (FAILED events) when that is possible; the engine stays usable.
 * Errors: INVALID_ARG, BUSY (background mode), BACKEND, INTERNAL. */
LOOM_API loom_status loom_engine_step(loom_engine *engine, const loom_event *const **events,
                                      size_t *n_events);

/* Whether any request is queued or running. Thread-safe. */
LOOM_API bool loom_engine_has_work(loom_engine *engine);

/* The result of loom_engine_generate, allocated by the library (so fields may be appended in
 * later versions without breaking callers). Release with loom_generation_free. */
typedef struct loom_generation {
    loom_request_id id; /* the id the request ran under */
    char *text;         /* the sample's text: the concatenated text of its TOKEN events
                           (whole UTF-8 characters; a stop string is not included),
                           NUL-terminated (text_len bytes before the NUL; the text may
                           itself hold NUL bytes) */
    size_t text_len;
    loom_token *tokens; /* [n_tokens] every generated token, in order, including a final
                           end-of-generation or stop token (which adds no text) */
    size_t n_tokens;
    loom_finish_reason reason; /* why it ended */
    int32_t cached_tokens;     /* prompt tokens reused from the prefix cache */
} loom_generation;

/* Blocking convenience for one request: submits req, steps the engine until the request ends,
 * and returns its output in *out (library-allocated; free with loom_generation_free). req->n
 * must be 1 (n > 1 samples: use loom_engine_submit and step). It runs the steps itself, so it
 * must be called from the step thread (not concurrently with loom_engine_step or another
 * loom_engine_generate, not from an event callback) and not in background mode. Other requests
 * queued on the engine run in the same steps: every event of those steps — theirs and this
 * request's, in order — is passed to on_event (may be NULL) on the calling thread before the
 * step's next event is looked at; with on_event NULL the other requests' events are dropped
 * (they still run and finish; stream them with on_event or let them finish before calling).
 * An event passed to on_event, and what it points to, is valid during that call only.
 * Errors: INVALID_ARG (NULL engine, req or out; n != 1), BUSY (background mode), every error
 *   of loom_engine_submit (nothing ran), the status of the request's FAILED event (the message
 *   names the request), OUT_OF_MEMORY (collecting the output), and a failing step's status; in
 *   the last two cases the request is cancelled (it ends at the next step). On an error *out is
 *   left untouched. */
LOOM_API loom_status loom_engine_generate(loom_engine *engine, const loom_request_params *req,
                                          loom_event_fn on_event, void *user_data,
                                          loom_generation **out);

/* Releases a loom_generation and its arrays. NULL is a no-op. */
LOOM_API void loom_generation_free(loom_generation *generation);

/* Counters and occupancy, a consistent snapshot. Thread-safe. */
LOOM_API loom_status loom_engine_get_stats(loom_engine *engine, loom_engine_stats *out);

/* The service figures of priority class `priority` (loom_class_stats). Thread-safe.
 * Errors: INVALID_ARG (NULL engine or out, out->size too small), NOT_FOUND (no request of that
 * priority was submitted, or the engine already tracked LOOM_ENGINE_MAX_CLASSES others). */
LOOM_API loom_status loom_engine_get_class_stats(loom_engine *engine, int32_t priority,
                                                 loom_class_stats *out);

/* The time to first token the engine predicts for req if it were submitted now, in seconds
 * from its arrival (arrival_s, or now) — what admission control compares with its
 * ttft_deadline_s. The prediction counts the prompt tokens still to compute of every request
 * that ranks before it (priority, then a deadline it can still meet, then arrival; requests
 * submitted since the last step included), the sequence slots it must wait for when every slot
 * is held by requests it may not preempt (they finish at the rate running requests do,
 * assuming each generates all its max_tokens), and its own prompt, each step taking what the
 * engine's step-cost model says (loom_engine_stats.step_*). It does not model KV blocks
 * running short or prefix-cache hits, so a KV-bound queue is predicted early and a cached
 * prompt late. *ttft_s is -1 before the engine has run a step (no cost model yet). req is
 * validated as by submit and not kept. Thread-safe (takes the engine's lock for a pass over
 * its queue). Errors: INVALID_ARG (NULL, a replay engine), every error of submit's
 * validation. */
LOOM_API loom_status loom_engine_predict_ttft(loom_engine *engine, const loom_request_params *req,
                                              double *ttft_s);

/* One KV group: the layers that share an attention window share a pool of blocks (Gemma 3: the
 * full-attention layers, and the sliding-window layers). */
typedef struct loom_kv_group_info {
    size_t size;             /* set by the caller: sizeof(loom_kv_group_info) */
    int32_t n_groups;        /* groups in this engine (the same whichever group is asked) */
    int32_t window;          /* 0: full attention; else the sliding window, in positions */
    int32_t n_layers;        /* layers whose K and V this pool holds (a layer that reuses an
                                earlier layer's K/V holds none) */
    int32_t block_size;      /* positions per block */
    int64_t block_bytes;     /* bytes of one block over the group's layers, K and V */
    int32_t blocks_total;    /* the pool; total = used + cached + free */
    int32_t blocks_used;     /* held by requests (or by a copy-on-write in progress) */
    int32_t blocks_cached;   /* free but holding a reusable prefix */
    int32_t blocks_free;     /* empty */
    int64_t slots_unused;    /* positions of the used blocks that hold nothing computed:
                                internal fragmentation, exactly (a block shared by several
                                requests counts once) */
    int64_t window_releases; /* blocks given back because they left every window (sliding
                                groups; lifetime) */
    int64_t evictions;       /* cached blocks evicted to make room (lifetime) */
    int64_t cow_copies;      /* copy-on-write block copies (lifetime) */
} loom_kv_group_info;

/* A snapshot of KV group `group`, in [0, n_groups), as of the last step; group 0 is the pool
 * loom_engine_stats.kv_blocks_* describe. Thread-safe. Errors: INVALID_ARG (NULL engine or
 * out, group outside [0, n_groups)). */
LOOM_API loom_status loom_engine_get_kv_group(loom_engine *engine, int32_t group,
                                              loom_kv_group_info *out);

/* ------------------------------------------------------------------------------------------ */
/* Per-token trace                                                                             */
/* ------------------------------------------------------------------------------------------ */
/*
 * A loom_trace collects, while an engine runs, one record per engine step (its wall time, the
 * batch, and the time of each phase: schedule, forward per group of layers, logits, sample,
 * events) and one per produced token (request, position, token and text piece, log-probability
 * and entropy before and after the entropy correction). The caller owns the trace and hands it
 * to an engine (loom_engine_params.trace) or to loom_generate (loom_generate_params.trace); it
 * can be written at any time, as JSON Lines or as Chrome trace-event JSON (Perfetto). What is
 * recorded, and both file formats field by field, are specified in docs/trace-format.md.
 *
 * Threads: every function below may be called from any thread, also while the engine's step
 * thread appends (a mutex serialises them; a write holds it while it formats, so appends wait
 * for a running write). The trace must outlive any engine it is attached to.
 * Memory: records are kept until loom_trace_clear or loom_trace_free; storage grows
 * geometrically. When memory runs out a record is dropped, never the engine step: the count
 * of dropped records is reported by loom_trace_get_info and in the written metadata.
 */

/* typedef struct loom_trace loom_trace; is declared above, before loom_generate_params. */

typedef enum loom_trace_format {
    LOOM_TRACE_JSONL = 0,  /* JSON Lines: one record per line */
    LOOM_TRACE_CHROME = 1, /* Chrome trace-event JSON (Perfetto, chrome://tracing) */
} loom_trace_format;

typedef struct loom_trace_info {
    size_t size;        /* set by the caller: sizeof(loom_trace_info) */
    size_t n_steps;     /* step records held */
    size_t n_tokens;    /* token records held */
    uint64_t n_dropped; /* records lost to allocation failure since create/clear */
} loom_trace_info;

/* Creates an empty trace; *out owns it (release with loom_trace_free).
 * Errors: INVALID_ARG (NULL out), OUT_OF_MEMORY. */
LOOM_API loom_status loom_trace_create(loom_trace **out);

/* Releases the trace and its records. NULL is a no-op. No other thread may use it any more,
 * and no engine may still hold it. */
LOOM_API void loom_trace_free(loom_trace *trace);

/* Forgets every record and resets the dropped counter; keeps the allocated storage for reuse.
 * NULL is a no-op. */
LOOM_API void loom_trace_clear(loom_trace *trace);

/* The number of token records held; 0 for NULL. */
LOOM_API size_t loom_trace_count(const loom_trace *trace);

/* Counts of step, token and dropped records (one consistent snapshot).
 * Errors: INVALID_ARG. */
LOOM_API loom_status loom_trace_get_info(const loom_trace *trace, loom_trace_info *out);

/* Writes every record to the file at path (created or truncated) in the given format.
 * Errors: INVALID_ARG (NULL, unknown format), IO (cannot open or write the file; the message
 *   names the path and the system's reason; a partly written file may remain),
 *   OUT_OF_MEMORY. */
LOOM_API loom_status loom_trace_write(const loom_trace *trace, const char *path,
                                      loom_trace_format format);

/* The same into memory: writes at most cap bytes to out (out may be NULL when cap is 0; no
 * terminating NUL) and sets *n_out to the size of the whole text. Records appended between a
 * size query and the real call change the size: retry on BUFFER_TOO_SMALL.
 * Errors: INVALID_ARG, BUFFER_TOO_SMALL (*n_out > cap; out holds the first cap bytes),
 *   OUT_OF_MEMORY. */
LOOM_API loom_status loom_trace_write_buffer(const loom_trace *trace, loom_trace_format format,
                                             char *out, size_t cap, size_t *n_out);

#ifdef __cplusplus
}
#endif
