/* record.h — an engine's input record, for deterministic replay (loom_engine_params.record_path,
 * loom_engine_create_replay).
 *
 * What makes a run of the engine what it is, given the model and the resolved engine
 * parameters: which requests and cancellations each step took from its inbox, in order, and
 * every reading of the scheduler's clock during the step (admission, scheduling, the step's end:
 * deadlines, priorities by age and starvation promotions depend on them). Everything else —
 * the forward pass, the sampler with its per-request seeds, the KV manager — is a function of
 * those. The record is written by the step thread as the step takes its inputs, so it holds
 * what the engine saw, not what callers did (a request submitted while a step ran belongs to
 * the next one; a cancel that named a finished request never reaches it).
 *
 * The file, every number little-endian:
 *   header  "LOOMREC1", u32 version, the model's shape (arch, vocab, widths, layers, heads,
 *           training context), the backend's name, the engine's parameters as resolved at
 *           create (the KV budget in bytes even when kv_fraction chose it; version 2 adds the
 *           kv_type after max_logprobs, version 3 kv_rotate after it, version 4 the layer map
 *           after that: u32 n_layer, then the layer each layer reads; older records replay
 *           with what they lack at its default: F16 pages, unrotated, the model's own map)
 *   then per step:
 *     'R' request: u64 id, i64 arrival (ns after the engine's creation), the prompt's token ids,
 *         every sampler setting with the logit-bias list, max_tokens, n, stop tokens, stop
 *         strings, ignore_eos, priority, the two deadlines, cache_salt
 *     'X' cancellation: u64 id
 *     'S' the step's end: u32 count, then each clock reading (i64 microseconds), then a u64
 *         digest of the step's events (kinds, ids, samples, tokens, reasons, statuses, the
 *         tokens' log-probabilities): the replay compares it, so a replay that gives other
 *         events than the recorded run (another backend or device, a nondeterministic kernel,
 *         another model of the same shape) says so at the first step that differs
 * A run that crashes leaves its last step without 'S': each request's and cancellation's record
 * is flushed as the step takes it, before it is acted on, so that step replays too (its clock
 * readings then repeat the last one recorded); a record torn by the crash is dropped with a
 * warning. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "loom.h"

#define LOOM__RECORD_MAGIC "LOOMREC1"
/* 2: the engine's kv_type; 3: kv_rotate; 4: the layer map; 5: merged pairs */
#define LOOM__RECORD_VERSION 5u
/* Most layers a record's layer map holds. */
#define LOOM__RECORD_MAX_LAYERS 1024
/* The latest clock reading (and the farthest arrival either side of creation) a record may
 * hold: LOOM__MAX_DURATION_S in microseconds, so sums with durations stay inside int64_t. */
#define LOOM__RECORD_MAX_US 1000000000000000ll

/* Growable little-endian byte buffer. put_* record a failed growth in ok and do nothing more. */
typedef struct loom__rec_buf {
    uint8_t *p;
    size_t n, cap;
    bool ok;
} loom__rec_buf;

void loom__rec_put(loom__rec_buf *b, const void *bytes, size_t n);
void loom__rec_u8(loom__rec_buf *b, uint8_t v);
void loom__rec_u32(loom__rec_buf *b, uint32_t v);
void loom__rec_u64(loom__rec_buf *b, uint64_t v);
void loom__rec_f32(loom__rec_buf *b, float v);
void loom__rec_f64(loom__rec_buf *b, double v);
void loom__rec_free(loom__rec_buf *b);

/* What the header holds besides the magic and version. */
typedef struct loom__record_header {
    uint32_t arch;
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx_train;
    char backend[32];
    loom_engine_params params; /* kv_bytes and max_ctx as resolved; no callbacks, no trace */
    /* The layer map the engine ran with (kv_plan applied), n_layer entries; has_layer_src false
     * for a record older than version 4 (the model's own map then). */
    bool has_layer_src;
    int32_t layer_src[LOOM__RECORD_MAX_LAYERS];
    /* The plan's merged pairs (version 5; none before): merge_with[n_layer] (each layer's
     * partner or -1), the retained fraction and the interpolation weight. n_merge_pairs 0: none
     * (merge_with then unset). */
    int32_t n_merge_pairs;
    int32_t merge_with[LOOM__RECORD_MAX_LAYERS];
    float merge_retain, merge_t;
} loom__record_header;

/* Encodes a request record ('R' included). prompt: the tokens the request holds (a text prompt
 * as tokenized at submit); p and its sampler are read as validated by loom_engine_submit. */
void loom__record_encode_request(loom__rec_buf *b, loom_request_id id, int64_t arrival_ns,
                                 const loom_request_params *p, const loom_token *prompt,
                                 int32_t n_prompt);

/* The writer: the step thread's. A write that fails stops the record (logged once); the
 * engine goes on serving. */
typedef struct loom__recorder {
    FILE *f;
    char *path;
    bool failed;
    int64_t *clocks; /* the current step's readings */
    uint32_t n_clocks, cap_clocks;
} loom__recorder;

/* Creates path (truncating it) and writes the header. Errors: IO, OUT_OF_MEMORY. */
loom_status loom__recorder_open(const char *path, const loom__record_header *h,
                                loom__recorder **out);
void loom__recorder_close(loom__recorder *r);
void loom__recorder_write(loom__recorder *r, const void *bytes, size_t n);
void loom__recorder_cancel(loom__recorder *r, loom_request_id id);
void loom__recorder_clock(loom__recorder *r, int64_t us);
/* Flushes what the step took so far (before the forward pass: a crash keeps it). */
void loom__recorder_flush(loom__recorder *r);
/* Writes 'S' with the step's clock readings and its events' digest, and flushes. */
void loom__recorder_step_end(loom__recorder *r, uint64_t digest);

/* A decoded request record: params point into the arrays below, which it owns, except
 * params.sampler, left NULL: it would point into the entry itself, which moves as the step's
 * array of requests grows; the user sets it to &sampler before use. */
typedef struct loom__record_request {
    loom_request_id id;
    int64_t arrival_ns;
    loom_request_params params;
    loom_sampler_params sampler;
    loom_token *prompt, *stop_tokens;
    loom_logit_bias *bias;
    char **stop_strings;
    size_t n_stop_strings;
} loom__record_request;

void loom__record_request_free(loom__record_request *q);

/* The reader. Every count and length is checked against what is left of the file before
 * anything is allocated for it. */
typedef struct loom__replayer {
    FILE *f;
    int64_t size, off;  /* bytes of the file, and read so far */
    int64_t step;       /* the step being read or replayed (0-based, as messages count) */
    int64_t n_steps;    /* steps begun */
    bool torn;          /* a read ran past the end of the file */
    loom_status failed; /* a failed step ends the replay: every later step returns this */
    uint64_t digest;    /* the step's recorded event digest (has_end) */
    char why[512];      /* the failed step's message */
    /* The current step's inputs and clock readings. */
    loom__record_request *reqs;
    size_t n_reqs, cap_reqs;
    loom_request_id *cancels;
    size_t n_cancels, cap_cancels;
    int64_t *clocks;
    uint32_t n_clocks, next_clock;
    bool has_end;       /* the step's 'S' was there (else the file ended inside it) */
    int64_t last_clock; /* the last reading handed out: what a step without 'S' reads */
} loom__replayer;

/* Opens path and reads its header. Errors: IO, BAD_INPUT (not a record, another version, a
 * truncated or malformed header; the message names the field and byte offset),
 * OUT_OF_MEMORY. */
loom_status loom__replayer_open(const char *path, loom__record_header *h, loom__replayer **out);
void loom__replayer_close(loom__replayer *r);
/* Whether the file has another step. */
bool loom__replayer_more(const loom__replayer *r);
/* Reads the next step's records (the previous step's are freed). Errors: BAD_INPUT (an unknown
 * record, a count beyond the file, an embedded NUL in a stop string...; the message names the
 * step and byte offset), OUT_OF_MEMORY. */
loom_status loom__replayer_next_step(loom__replayer *r);
/* The step's next clock reading; false when the step has used all it recorded (a divergence,
 * unless the step had no 'S'). */
bool loom__replayer_clock(loom__replayer *r, int64_t *us);
