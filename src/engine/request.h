/* request.h — an engine request as the engine keeps it: everything from loom_request_params
 * validated and copied at submit, plus each sample's progress and streamed text. */
#pragma once

#include "tokenizer/text_stream.h"
#include "model/model.h"
#include "sample/chain.h"

typedef enum loom__req_state {
    LOOM_REQ_QUEUED = 0, /* submitted, not yet seen by a step */
    LOOM_REQ_ACTIVE = 1, /* known to the scheduler (waiting, running or preempted) */
    LOOM_REQ_DONE = 2,   /* every sample finished or the request failed */
} loom__req_state;

typedef struct loom__req_sample {
    loom_token *tokens; /* [tokens_cap] generated tokens, grown as they come */
    int32_t n_generated;
    int32_t tokens_cap;
    int32_t kv_seq;        /* the KV manager's sequence, -1 when it holds none */
    int32_t cached_tokens; /* tokens reused from the prefix cache at its last admission */
    bool in_sched;         /* known to the scheduler */
    bool swapped;          /* its blocks are in the engine's host swap area */
    int32_t *swap_slots;   /* [swap_cap] host slots of its swapped blocks */
    int32_t swap_offsets[LOOM_MAX_KV_GROUPS + 1]; /* per-group ranges of swap_slots */
    bool finished;
    loom_finish_reason reason;
    loom__text_stream text;   /* pending text of this sample */
    int64_t t_first_token_ns; /* monotonic clock (loom__now_ns); 0 until the first token */
    int64_t t_last_token_ns;
    loom_token_info info;    /* the last sampled token's, as its TOKEN event reports it */
    loom_token_logprob *top; /* [2 * chain.n_logprobs] info's top arrays: raw, then final */
} loom__req_sample;

typedef struct loom__req {
    loom_request_id id;
    void *user_data;
    loom__req_state state;
    bool cancel_requested;

    loom_token *prompt; /* [n_prompt] */
    int32_t n_prompt;
    loom__sample_chain_config chain; /* the request's sampler; bias points to the copy below */
    loom_logit_bias *bias;           /* [chain.n_bias] */
    int32_t max_tokens;
    int32_t n_samples;
    loom_token *stop_tokens; /* [n_stop_tokens] */
    int32_t n_stop_tokens;
    char **stop_strings; /* [stops.n] NUL-terminated copies */
    size_t *stop_lens;
    loom__stop_set stops;
    bool ignore_eos;
    int32_t priority;
    int64_t ttft_us, tpot_us; /* deadlines in microseconds (0: none), checked at submit */
    int32_t class_priority;   /* the priority it was submitted with (its class in the stats) */
    int64_t asked_ttft_us;    /* the TTFT deadline it asked for (kept when degraded) */
    uint64_t cache_salt;
    int64_t arrival_ns; /* monotonic clock (loom__now_ns): the caller's arrival_s, or the
                           submit time */

    uint8_t *record; /* [n_record] its input record (engine params.record_path), written and
                        freed when a step takes it; NULL when not recording */
    size_t n_record;

    loom__req_sample *samples;      /* [n_samples] */
    char *text_mem;                 /* backing store of every sample's text stream */
    struct loom__req *next_retired; /* the engine's list of requests retired by a step */
} loom__req;

/* A caller's request (of caller->size bytes) and its sampler settings (of their size, or the
 * defaults) read into full structs of this library: p->sampler then points at *sampler.
 * Errors: INVALID_ARG, UNSUPPORTED (core/abi.h). */
loom_status loom__request_params_in(const loom_request_params *caller, loom_request_params *p,
                                    loom_sampler_params *sampler);

/* Validates params (read by loom__request_params_in) against the model and copies everything
 * into a new request (id 0: the
 * engine assigns it). The prompt must leave room for one generated token within max_ctx; a
 * request whose context fills later finishes with LOOM_FINISH_CONTEXT. max_piece is the
 * vocabulary's longest piece in bytes (sizes the text streams). Errors: see
 * loom_engine_submit in loom.h. */
loom_status loom__req_create(const loom_model *m, const loom_request_params *p, int32_t max_ctx,
                             size_t max_piece, loom__req **out);

void loom__req_free(loom__req *r);
/* Makes room for one more generated token of s (the buffer grows geometrically as tokens come,
 * so a huge max_tokens reserves nothing up front). Errors: OUT_OF_MEMORY. */
loom_status loom__req_reserve_token(loom__req_sample *s);

/* Whether tok ends a sample of r: its stop tokens, or the model's end-of-generation tokens
 * unless ignore_eos; sets *reason. */
bool loom__req_is_stop_token(const loom__req *r, const loom_model *m, loom_token tok,
                             loom_finish_reason *reason);
