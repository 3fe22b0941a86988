/* engine.h — the engine's state, shared by its files: engine_create.c (sizing, storage,
 * threads), engine_submit.c (the thread-safe inbox, cancel, stats), engine_step.c (one step),
 * engine_kv.c (the KV manager wired to the scheduler and to storage copies). */
#pragma once

#include <pthread.h>

#include "core/threadpool.h"
#include "engine/id_map.h"
#include "engine/kv_storage.h"
#include "engine/record.h"
#include "engine/request.h"
#include "kv/kv_manager.h"
#include "model/forward.h"
#include "sample/chain.h"
#include "sched/sched.h"
#include "trace/trace.h"

/* Samples of one request get scheduler ids id * LOOM_ENGINE_MAX_N + sample. */
#define LOOM_ENGINE_MAX_N 256
/* Most sampler workspaces (each holds a vocabulary's worth of scratch: 8 MiB for Gemma 3). */
#define LOOM_ENGINE_MAX_SAMPLERS 8
/* Candidates a summary holds: a request with top_k <= 256 and n_logprobs <= 256 (or greedy) is
 * sampled from a few KB per row instead of the whole row. */
#define LOOM_ENGINE_SUMMARY_TOP 256

typedef struct loom__engine_inbox {
    loom__req **reqs; /* submitted, not yet taken by a step */
    size_t n_reqs, cap_reqs;
    loom_request_id *cancels;
    size_t n_cancels, cap_cancels;
    size_t next_req, next_cancel; /* the step's copy (drained): entries taken so far; the rest
                                     waits for the next step when memory for events is short */
} loom__engine_inbox;

/* The most events one step's batch can make besides those of the inbox: one FAILED per
 * preempted (a failed swap-out) and per rejected request, and per entry at most three (TOKEN,
 * FINISHED, and FAILED when starting an n > 1 request's other samples fails). The event array
 * always has this much room left when the batch starts (engine_step.c). */
#define LOOM_ENGINE_BATCH_EVENTS(max_seqs) (5 * (size_t)(max_seqs) + 16)

/* Host memory that holds swapped-out blocks of one KV group: n_slots slots of one block each
 * (every source layer of the group, K then V per layer; kv_storage.h). From the backend's
 * host_alloc: pinned, for a device. */
typedef struct loom__engine_swap_area {
    char *mem; /* [n_slots][slot_bytes] */
    size_t slot_bytes;
    int32_t n_slots;
    int32_t *free; /* [n_slots] stack of free slots */
    int32_t n_free;
} loom__engine_swap_area;

/* The service figures of one priority class (loom_class_stats), under the engine's mu. */
typedef struct loom__engine_class {
    loom_class_stats st;           /* the counters; get_class_stats computes the percentiles */
    double *ttft_ring, *tpot_ring; /* [LOOM_ENGINE_LATENCY_WINDOW], indexed by count % window */
    int64_t n_ttft, n_tpot;
} loom__engine_class;

/* What sizing the KV pools depends on (loom__engine_kv_plan). */
typedef struct loom__engine_kv_shape {
    int64_t budget; /* bytes for every pool together */
    int32_t n_groups;
    int32_t window[LOOM_MAX_KV_GROUPS];     /* each group's sliding window; 0: full attention */
    size_t block_bytes[LOOM_MAX_KV_GROUPS]; /* bytes of one block of each group (all its layers,
                                               K and V) */
    int32_t block_size;
    int32_t max_seqs;           /* sequences running at once */
    int32_t max_batched_tokens; /* tokens computed in one step, over all sequences */
    int32_t max_ctx;            /* positions one sequence may hold */
    bool prefix_cache;
} loom__engine_kv_shape;

struct loom_engine {
    loom_model *model;
    const loom_backend_ops *ops;
    loom_engine_params params;
    loom_type kv_type;    /* the pages' element type (params.kv_type) */
    int32_t *layer_src;   /* [n_layer] the layer whose K/V each layer reads: the model's map with
                             params.kv_plan applied (kv_plan.h); params.kv_plan is not kept */
    loom__kv_merge merge; /* the plan's merged pairs; merge.with [n_layer] */
    uint32_t kv_flags;    /* the descriptors' kv_flags: LOOM_KV_HADAMARD (kv_rotate), and
                             LOOM_KV_MERGED when the plan merges pairs */
    int32_t max_ctx;
    size_t max_piece;
    int64_t t0_ns; /* the scheduler's clock (microseconds) counts from create; request times
                      are kept in absolute monotonic nanoseconds (loom__now_ns) */

    /* Tracing (params.trace; NULL: off). The timer and the hook live here so a traced step
     * allocates nothing; the layer-group names are borrowed by the trace until each step ends. */
    loom_trace *trace;
    loom__trace_timer tm;
    loom__trace_layers layers;
    loom__trace_layer_hook hook;

    /* KV: the manager, and the pools in backend memory with the step's descriptors
     * (kv_storage.h). Each group has its own pool size (engine_kv.c says how they are
     * chosen). */
    loom__kv *kv;
    loom__kv_storage store;
    int32_t n_groups;
    int32_t n_blocks; /* group 0's pool: the one the scheduler counts and submit checks prompts
                         against (full attention when the model has any) */
    int32_t group_blocks[LOOM_MAX_KV_GROUPS]; /* each group's pool */
    int64_t kv_budget; /* the bytes the pools were sized from (kv_bytes, or kv_fraction's) */
    /* Host swap areas for LOOM_PREEMPT_SWAP, one per group (their blocks differ in size). */
    loom__engine_swap_area swap[LOOM_MAX_KV_GROUPS];

    loom__sched *sched;
    /* The engine's execution context: its own backend stream and activations, so engines on
     * one model run at the same time (forward.h). */
    loom__exec exec;

    /* Per-step arrays, sized at create (max_batched_tokens, max_seqs). */
    loom_token *tokens;  /* [max_batched_tokens] */
    int32_t *pos;        /* [max_batched_tokens] */
    int32_t *logit_rows; /* [max_seqs] */
    float *logits;       /* [max_seqs * n_vocab] */
    /* Sampling from summaries (sample/chain.h; set at create): ROWS copies every row of
     * logits; DEVICE has the backend summarize the rows of requests whose settings allow it
     * (its logits_summary, the default where it has one); HOST copies the rows but samples
     * those requests from summaries made here (LOOM_SAMPLE_FROM=summary on a backend without
     * the slot: how the CPU's tests run the path). */
    enum { LOOM__FROM_ROWS, LOOM__FROM_DEVICE, LOOM__FROM_HOST } sample_from;
    uint8_t *summary_only;         /* [max_seqs] per logit row: sampled from its summary */
    loom_logit_summary *summaries; /* [max_seqs] */
    loom_logit_cand *summary_top;  /* [max_seqs * LOOM_ENGINE_SUMMARY_TOP] */
    /* A summary row's bias and penalties (loom_logit_edits), and what the summarizer reports of
     * the row before them. */
    loom_logit_edits *edits;      /* [max_seqs] */
    int32_t *pen_id, *pen_count;  /* [max_seqs * LOOM_LOGIT_SUMMARY_MAX_EDITS] */
    loom_logit_summary *raw_sums; /* [max_seqs] */
    loom_logit_cand *raw_top;     /* [max_seqs * LOOM_ENGINE_SUMMARY_TOP] */
    float *edit_raw;              /* [max_seqs * LOOM_LOGIT_SUMMARY_MAX_EDITS] */
    float *summary_scratch;       /* HOST: [n_samplers * n_vocab], each sampler's edited copy */
    int32_t *seqs, *n_new;        /* [max_seqs] KV sequences of the batch, tokens each */
    struct loom__req_sample **batch_samples; /* [max_seqs] */
    loom_status *row_status;                 /* [max_seqs] the sampler's status per entry */
    int32_t *sample_entry;                   /* [max_seqs] the entries that sample, in order */
    loom__req **batch_reqs;                  /* [max_seqs] */
    int32_t *batch_index;                    /* [max_seqs] sample index */
    const loom__sched_entry **batch_entries; /* [max_seqs] */
    int32_t *indptr[LOOM_MAX_KV_GROUPS];     /* [max_seqs + 1] */
    int32_t *block_ids[LOOM_MAX_KV_GROUPS];  /* [block_cap] */
    int64_t block_cap;
    int32_t *q_start, *pos_start, *kv_len; /* [max_seqs + 1] */
    loom__kv_copy copies[LOOM_MAX_KV_GROUPS];
    loom_token *known; /* [max_ctx] scratch: a sample's known tokens */
    /* Sampler chain workspaces (one vocabulary each, 16-byte aligned) and penalty histories
     * ([max_ctx] each), one per sampling thread: the step samples its rows in parallel on the
     * engine's own pool (n_samplers threads, the step thread included; NULL for one). */
    loom__threadpool *sample_tp;
    int32_t n_samplers;
    void *sample_mem[LOOM_ENGINE_MAX_SAMPLERS];
    loom__sample_chain_ws *sample_ws[LOOM_ENGINE_MAX_SAMPLERS];
    loom_token *sample_hist[LOOM_ENGINE_MAX_SAMPLERS];
    int32_t *swap_blocks; /* [swap list cap] */
    int32_t swap_list_cap;
    /* One batched copy's arguments (loom__kv_storage_copy): [swap list cap] each. */
    int32_t *copy_groups, *copy_src, *copy_dst;
    char **copy_host;
    loom__sched_result *results; /* [max_seqs] */
    int32_t n_results;

    /* Events of the last step (grown geometrically when a step has many cancellations). */
    loom_event *events;
    size_t n_events, cap_events;
    const loom_event **event_ptrs; /* [cap_events] what loom_engine_step hands out (grown
                                      with events, so handing them out never allocates) */

    /* Requests the step thread knows (id -> loom__req) and those finished in the last step,
     * freed at the start of the next one (their events point into them). */
    loom__id_map reqs;
    loom__req *retired; /* a list through loom__req.next_retired */

    /* Shared with submitting threads, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    loom__engine_inbox inbox;
    loom__engine_inbox drained; /* the step's copy: swapped with inbox under mu, then read
                                  without it while submitters fill the (now empty) inbox */
    loom__id_map live;          /* ids submitted and not yet finished (for cancel's NOT_FOUND) */
    uint64_t next_id;
    loom_engine_stats stats; /* counters updated by steps (latency and rate figures are
                                computed by get_stats from what follows) */
    loom_kv_group_info kv_groups[LOOM_MAX_KV_GROUPS]; /* per-group snapshot, as stats */
    /* Latency of ended requests: lifetime sums and the last LOOM_ENGINE_LATENCY_WINDOW
     * values, ring buffers indexed by count % window. */
    double ttft_sum_s, tpot_sum_s;
    double ttft_ring[LOOM_ENGINE_LATENCY_WINDOW], tpot_ring[LOOM_ENGINE_LATENCY_WINDOW];
    /* Throughput: wall time in steps that ran a batch, and the last LOOM_ENGINE_RATE_WINDOW
     * such steps (tokens, nanoseconds), ring buffers indexed by n_rate % window. */
    int64_t busy_ns;
    int64_t rate_tokens[LOOM_ENGINE_RATE_WINDOW], rate_ns[LOOM_ENGINE_RATE_WINDOW];
    int64_t n_rate;
    /* Admission control (engine_admit.c). The step thread fits the step-cost model to each
     * step and copies the scheduler's queues into fc_build after it; under mu, both are then
     * published (fc_pub, cost_pub) for submit's predictions, and submit adds each request it
     * queues to fc_pub so the next submit counts it before a step has taken it. */
    loom__cost_model cost;
    loom__sched_forecast fc_build;
    loom__sched_forecast fc_pub;                         /* under mu */
    loom__cost_model cost_pub;                           /* under mu */
    loom__engine_class classes[LOOM_ENGINE_MAX_CLASSES]; /* under mu */
    int32_t n_classes;
    bool stop;
    bool has_thread;
    pthread_t thread;

    /* Deterministic replay (record.h): the writer when params.record_path is set (the step
     * thread's alone), or the reader of an engine from loom_engine_create_replay. */
    loom__recorder *rec;
    loom__replayer *rp;
    bool rp_more; /* under mu: recorded steps remain (loom_engine_has_work) */
};

/* engine_kv.c */
/* Blocks of each group's pool (n_blocks[n_groups]) for the shape, as engine_kv.c describes.
 * Pure: no allocation, no engine. Errors: INVALID_ARG (a bad shape), OUT_OF_MEMORY (the budget
 * cannot give some group the blocks one request of max_ctx needs; the message says which). */
loom_status loom__engine_kv_plan(const loom__engine_kv_shape *shape, int32_t *n_blocks);

/* loom_engine_create with the layer map given (a replay's recorded map: [n_layer], checked
 * here) in place of params->kv_plan's; layer_src NULL: as loom_engine_create. */
loom_status loom__engine_create(loom_model *model, const loom_engine_params *params,
                                const int32_t *layer_src, const loom__kv_merge *merge,
                                loom_engine **out);
loom_status loom__engine_kv_create(loom_engine *e);
void loom__engine_kv_destroy(loom_engine *e);
/* The scheduler's view of the KV manager. */
loom__sched_kv_iface loom__engine_kv_iface(loom_engine *e);
/* Performs the copy-on-write copies of one reservation (every layer of each group) in one
 * backend call. */
loom_status loom__engine_kv_copy(loom_engine *e, const loom__kv_copy *c, int32_t n);
/* Preemption by swap: moves the sample's blocks to host slots / back. */
loom_status loom__engine_swap_out(loom_engine *e, struct loom__req_sample *s);
loom_status loom__engine_swap_in(loom_engine *e, struct loom__req_sample *s);
/* Frees whatever KV or swap space the sample holds. */
void loom__engine_release(loom_engine *e, struct loom__req_sample *s);

/* engine_step.c */
loom_status loom__engine_step(loom_engine *e);

/* engine_admit.c */
/* At submit (not for replayed requests): predicts r's TTFT and applies params.admission —
 * OVERLOADED for a rejection (r untouched), or r (and *p, which the record is encoded from)
 * rewritten as best-effort for DEGRADE; counts the submit in r's class. */
loom_status loom__engine_admit(loom_engine *e, loom__req *r, loom_request_params *p);
/* Under mu, after a request has been queued: counts it in the published forecast. */
void loom__engine_admitted_locked(loom_engine *e, const loom__req *r);
/* Step thread, after a step that ran a batch: updates the cost model with the step's tokens,
 * context and duration, and publishes a fresh forecast. */
void loom__engine_after_step(loom_engine *e, int32_t n_tokens, int64_t n_ctx, int64_t step_us);
/* Under mu: the class of priority p (added if there is room; NULL if not). */
loom__engine_class *loom__engine_class_locked(loom_engine *e, int32_t p);
/* Under mu: a request of r's class ended (latencies in seconds; < 0 when it had none). */
void loom__engine_class_ended_locked(loom_engine *e, const loom__req *r, double ttft_s,
                                     double tpot_s, int64_t tokens);
void loom__engine_admit_free(loom_engine *e);

/* engine_replay.c */
/* Opens params.record_path (at create). Errors: IO, OUT_OF_MEMORY. */
loom_status loom__engine_record_open(loom_engine *e);
/* A request's record, encoded by the submitting thread before it takes the inbox lock (p as
 * validated, the request's tokens; the id left 0): r->record. Errors: OUT_OF_MEMORY. */
loom_status loom__engine_record_request(loom_engine *e, const loom_request_params *p, loom__req *r);
/* Writes r->id into its record (under the lock, once the id is given). */
void loom__engine_record_set_id(loom__req *r);
/* The digest of the step's events that the record's 'S' holds. */
uint64_t loom__engine_events_digest(const loom_engine *e);
/* Ends a replay after a failed step (keeps st and the message for every later step). */
loom_status loom__engine_replay_fail(loom_engine *e, loom_status st);
/* Replay: queues the next recorded step's requests and cancellations and loads its clock
 * readings (before the step); checks the step read the clock as often as recorded and made the
 * recorded events (after). */
loom_status loom__engine_replay_begin(loom_engine *e);
loom_status loom__engine_replay_end(loom_engine *e);
/* Validates, copies and queues a request with the given id and arrival (submit's and a
 * replay's common path). Errors: see loom_engine_submit. */
loom_status loom__engine_enqueue(loom_engine *e, const loom_request_params *p, int64_t arrival_ns,
                                 loom_request_id id, loom_request_id *out_id);
/* Frees the requests the last step retired. */
void loom__engine_free_retired(loom_engine *e);

/* Token at position p of a sample: the prompt, then its generated tokens. */
static inline loom_token loom__sample_token(const loom__req *r, const loom__req_sample *s,
                                            int32_t p) {
    return p < r->n_prompt ? r->prompt[p] : s->tokens[p - r->n_prompt];
}

static inline uint64_t loom__sched_id(const loom__req *r, int32_t sample) {
    return r->id * LOOM_ENGINE_MAX_N + (uint64_t)sample;
}

/* Copies the first n known tokens of a sample (prompt, then generated) into e->known and
 * returns e->known (n <= max_ctx). */
static inline const loom_token *loom__engine_known(loom_engine *e, const loom__req *r,
                                                   const loom__req_sample *s, int32_t n) {
    for (int32_t p = 0; p < n; p++) e->known[p] = loom__sample_token(r, s, p);
    return e->known;
}

/* Tokens a sample of r may generate: max_tokens, at most what the context leaves (submit
 * checked n_prompt < max_ctx): the sample finishes with LOOM_FINISH_CONTEXT there whatever
 * max_tokens says. */
static inline int32_t loom__engine_max_new(const loom_engine *e, const loom__req *r) {
    return r->max_tokens < e->max_ctx - r->n_prompt ? r->max_tokens : e->max_ctx - r->n_prompt;
}

/* Nearest-rank percentile q (0 < q <= 1) of v[0..n), sorted here; 0 for n = 0. */
double loom__engine_percentile(double *v, size_t n, double q);

/* Engine clock in microseconds since create (the scheduler's time). Every reading a step
 * makes goes through here: recorded with params.record_path, taken from the record in a
 * replay. */
int64_t loom__engine_now_us(loom_engine *e);
/* An absolute monotonic time (loom__now_ns) on the scheduler's clock. */
static inline int64_t loom__engine_us_of(const loom_engine *e, int64_t t_ns) {
    return (t_ns - e->t0_ns) / 1000;
}

/* The scheduler's view of a sample of r, scheduler id `id` (0 for a forecast). */
static inline loom__sched_request_info loom__engine_sched_info(const loom_engine *e,
                                                               const loom__req *r, uint64_t id) {
    return (loom__sched_request_info){
        .id = id,
        .priority = r->priority,
        .n_prompt = r->n_prompt,
        .max_new_tokens = loom__engine_max_new(e, r),
        .arrival_us = loom__engine_us_of(e, r->arrival_ns),
        .ttft_us = r->ttft_us,
        .tpot_us = r->tpot_us,
    };
}
