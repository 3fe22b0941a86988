/* sched.h — the token-level scheduler: each engine step, which requests run, how many tokens
 * each computes, and who is preempted when KV blocks run short.
 *
 * A pure policy module. It holds one small record per request (an id and the counters it
 * needs: no tokens, no tensors) and builds a plan per step:
 *   1. every running decode (1 token each) — decodes never stall behind a long prompt (but
 *      for deferral, see loom__sched_set_cost: decodes without deadlines may wait for an
 *      urgent first token);
 *   2. then prefill chunks of running requests and first chunks of newly admitted ones, in
 *      order of importance, each chunk at most the budget left (chunked prefill);
 * under a token budget (max_batched_tokens) and a sequence limit (max_seqs). It asks the KV
 * manager about capacity only through loom__sched_kv_iface (sched never includes kv/): the
 * engine wires the two together.
 *
 * Time: every call takes `now_us`, monotonic microseconds chosen by the caller (the scheduler
 * never reads a clock, so tests drive time by hand). Calls must not go back in time.
 *
 * Order of importance (policy PRIORITY):
 *   effective priority (higher first); within it, requests whose deadline is still reachable
 *   (earliest due first), then those that missed it (earliest due first), then those without
 *   one; then arrival (earlier first), then the order of loom__sched_add (a total order: plans
 *   are deterministic). A request past its deadline yields to those that can still meet
 *   theirs: earliest-deadline-first alone would, under overload, make every request late.
 *   - Deadline of a request with no token yet: arrival_us + ttft_us (TTFT is relative to the
 *     request's arrival). Of a request with tokens: first_token + n_generated * tpot_us, the
 *     time its next token is due if it keeps its mean time-per-output-token under tpot_us; a
 *     request ahead of its pace therefore yields to one behind it.
 *   - Effective priority is `priority`, except for a promoted request (see starvation).
 * Policy FCFS orders by arrival only (priorities, deadlines and promotion are ignored).
 * Running requests are served in this same order: decodes claim blocks (and preempt) in it,
 * and running prefill chunks take the budget in it, interleaved with admissions, so a more
 * important waiting request gets tokens before a less important running prefill. Every running
 * decode always fits the budget (max_batched_tokens >= max_seqs >= running requests); TPOT
 * deadlines act through the order (a decode behind its pace ranks first within its priority)
 * and, with a step cost model (step_*_us), by capping the step's tokens so that decodes still
 * able to meet their pace do.
 *
 * Starvation: a waiting request whose time spent waiting (summed over all its waits, so a
 * request preempted again and again also counts) reaches promote_age_us is promoted: it ranks
 * above every request of lower priority than the lowest priority that has a request with a
 * deadline (never below its own; above everything when no request has a deadline), so
 * promotion never outranks a class that asked for deadlines. Promoted requests rank among
 * themselves by the time they were promoted (FIFO), and promotion sticks until the request
 * leaves. promote_age_us = 0 disables it.
 *
 * Preemption: when the KV manager cannot fit a running request's next tokens, victims are
 * taken from the other running requests, lowest rank first (within a priority: no deadline or
 * a missed one before a reachable one), then the fewest computed positions (the least work to
 * redo or move), then latest arrival; a request preempted twice is spared for protect_us after
 * each later admission; never a request that ranks above the one in need by that same order ("never
 * in favour of a lower-priority one"). A waiting request whose effective priority is strictly
 * higher than a running one's may also preempt it for blocks or a sequence slot (equal priorities
 * never preempt to admit, which would thrash). A victim goes back to waiting keeping n_generated;
 * with RECOMPUTE its KV is dropped (n_computed = 0: it re-prefills prompt + generated tokens), with
 * SWAP its KV goes to host memory and comes back (entry.swap_in) before it continues.
 * Victims are only preempted when taking all allowed ones would make room. A running request
 * with no allowed victim left waits this step, keeping its KV; if it runs alone, its context
 * has outgrown the whole cache and it is rejected (see plan.rejected).
 *
 * Admission: requests are admitted in order; the first that cannot be admitted blocks those
 * behind it (no overtaking, so a large request is not starved by small ones). Admission needs
 * blocks for the request's whole remaining prefill, on top of the blocks promised to running
 * prefills, while keeping watermark_blocks free (so running requests can grow). When nothing is
 * running the watermark is waived, and a request that cannot fit even then is rejected
 * (plan.rejected: the engine fails it, e.g. with LOOM_ERR_CONTEXT_FULL).
 *
 * Protocol, per step: loom__sched_schedule -> the engine carries out the plan (preempts, reserves
 * KV, runs the forward, samples) -> loom__sched_on_step_done with what was sampled and what
 * finished. loom__sched_add and loom__sched_cancel may be called between steps and between
 * schedule and on_step_done.
 *
 * Threads: not thread-safe; all calls come from the engine's step thread.
 * Memory: everything a step needs is allocated at create time or grown by loom__sched_add;
 * loom__sched_schedule and loom__sched_on_step_done never allocate.
 * Errors: LOOM_ERR_INVALID_ARG for bad arguments and misuse (duplicate or unknown id, calls out
 * of protocol, time going back), LOOM_ERR_OUT_OF_MEMORY; the message says which. On failure the
 * scheduler is unchanged. */
#pragma once

#include "loom.h"
#include "sched/cost_model.h"

/* ------------------------------------------------------------------------------------------ */
/* Configuration                                                                              */
/* ------------------------------------------------------------------------------------------ */

typedef enum loom__sched_policy {
    LOOM_SCHED_POLICY_PRIORITY = 0, /* priorities, deadlines, promotion (the default) */
    LOOM_SCHED_POLICY_FCFS = 1,     /* plain first-come-first-served, for comparison */
} loom__sched_policy;

typedef enum loom__sched_preempt_mode {
    LOOM_SCHED_PREEMPT_RECOMPUTE = 0, /* drop the victim's KV; it re-prefills later */
    LOOM_SCHED_PREEMPT_SWAP = 1,      /* move the victim's KV to host memory; swap it in later */
} loom__sched_preempt_mode;

typedef struct loom__sched_config {
    loom__sched_policy policy;
    int32_t max_batched_tokens; /* token budget per step; >= max_seqs (so decodes always fit) */
    int32_t max_seqs;           /* sequences per step = most requests running at once; >= 1 */
    int32_t max_prefill_chunk;  /* per-request chunk cap in tokens; 0 = only the budget */
    int32_t watermark_blocks;   /* admission leaves at least this many KV blocks free; >= 0 */
    loom__sched_preempt_mode preempt_mode;
    int64_t promote_age_us;   /* waiting time after which a request is promoted; 0 = never */
    int32_t initial_capacity; /* requests held before the first growth; 0 = a default */
    /* TPOT-aware budget (PRIORITY policy; both 0 = off): the engine's estimate of a step's time,
     * step_base_us + step_per_token_us * tokens. When set, a step's tokens are capped so the
     * step ends before the earliest due token of a running decode with a TPOT deadline (decodes
     * already too late to save are ignored; the decodes themselves always run). This trades
     * prefill throughput for decode deadlines exactly when they would be missed. */
    int64_t step_base_us;
    int64_t step_per_token_us;
    /* Anti-thrash: a request preempted twice is no preemption victim for this long after each
     * later admission (0 = off). */
    int64_t protect_us;
} loom__sched_config;

/* The engine's protect_us: long enough for a preempted-twice request to produce a burst of
 * tokens (dozens of steps), short against a request's life under overload. */
#define LOOM_SCHED_ENGINE_PROTECT_US (2 * 1000 * 1000)

/* Defaults: PRIORITY, 2048 tokens, 64 seqs, no chunk cap, watermark 0, RECOMPUTE, promotion
 * after 10 s, step cost model off. */
loom__sched_config loom__sched_default_config(void);

/* ------------------------------------------------------------------------------------------ */
/* The KV interface the engine provides                                                      */
/* ------------------------------------------------------------------------------------------ */

/* All counts are in KV blocks. The calls are pure queries about the KV manager's state at the
 * start of the step (before the engine carries out the plan); the scheduler does the step's
 * bookkeeping itself (it subtracts what it plans, adds back what it preempts), so the engine
 * needs no reserve/release hooks. A negative answer is treated as 0. */
typedef struct loom__sched_kv_iface {
    void *ctx; /* passed to every call; owned by the engine */

    /* Blocks that can be handed out now: free blocks plus evictable cached ones. */
    int32_t (*blocks_free)(void *ctx);

    /* Blocks request `id` would newly take to hold KV for positions [0, n_computed + n_new),
     * beyond what it holds now. n_computed is the scheduler's count of positions it holds (for
     * a request that holds nothing yet: the prefix the scheduler expects it to claim from the
     * prefix cache, see cached_tokens). The engine accounts for prefix-cache hits, copy-on-
     * write, sliding-window releases, and for a swapped-out request the blocks to swap its
     * n_computed positions back in. Must not decrease when n_new grows. */
    int32_t (*blocks_needed)(void *ctx, uint64_t id, int32_t n_computed, int32_t n_new);

    /* Blocks that become available if running request `id` is preempted with the configured
     * mode (its blocks that no other sequence shares). */
    int32_t (*blocks_reclaimable)(void *ctx, uint64_t id);

    /* (optional, NULL = 0) Leading tokens of request `id` already in the prefix cache, asked
     * when it is about to be admitted holding nothing. Its first chunk then starts there
     * (entry.pos_start); the scheduler keeps at least one token to compute. */
    int32_t (*cached_tokens)(void *ctx, uint64_t id);
} loom__sched_kv_iface;

/* ------------------------------------------------------------------------------------------ */
/* Requests                                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct loom__sched_request_info {
    uint64_t id;            /* the engine's id; unique among requests the scheduler holds */
    int32_t priority;       /* higher = more important; 0 is the usual default */
    int32_t n_prompt;       /* prompt tokens, >= 1 */
    int32_t max_new_tokens; /* >= 1; reaching it finishes the request (see on_step_done) */
    int64_t arrival_us;     /* when it arrived (<= now); waiting time counts from here */
    int64_t ttft_us;        /* time-to-first-token deadline relative to arrival; 0 = none */
    int64_t tpot_us;        /* mean time-per-output-token deadline; 0 = none */
} loom__sched_request_info;

typedef enum loom__sched_state {
    LOOM_SCHED_STATE_WAITING = 0,   /* never admitted */
    LOOM_SCHED_STATE_RUNNING = 1,   /* admitted: holds (or is about to hold) KV */
    LOOM_SCHED_STATE_PREEMPTED = 2, /* back in the waiting queue after preemption */
} loom__sched_state;

/* What a cancelled request leaves for the engine to free (after the engine has carried out the
 * pending plan, if any). */
typedef enum loom__sched_holds {
    LOOM_SCHED_HOLDS_NOTHING = 0, /* waiting, or preempted with RECOMPUTE */
    LOOM_SCHED_HOLDS_KV = 1,      /* running: free its KV sequence */
    LOOM_SCHED_HOLDS_SWAP = 2,    /* preempted with SWAP: free its host copy */
} loom__sched_holds;

typedef struct loom__sched_request_view {
    loom__sched_state state;
    int32_t n_computed;         /* positions whose KV it holds (or has swapped out) */
    int32_t n_generated;        /* tokens sampled so far (never lost by preemption) */
    int64_t effective_priority; /* priority, or LOOM_SCHED_PROMOTED_PRIORITY once promoted */
    bool promoted;
    bool swapped; /* preempted with SWAP and not yet swapped back in */
} loom__sched_request_view;

/* A promoted request's effective priority: above every int32_t priority. */
#define LOOM_SCHED_PROMOTED_PRIORITY ((int64_t)INT32_MAX + 1)

/* ------------------------------------------------------------------------------------------ */
/* The plan                                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct loom__sched_entry {
    uint64_t id;
    int32_t pos_start; /* first position computed this step (= n_computed before it) */
    int32_t n_tokens;  /* tokens computed this step, >= 1: positions [pos_start, +n_tokens) */
    bool is_prefill;   /* a prompt (or recompute) chunk, not a single-token decode */
    bool sample;       /* the chunk reaches the last known token: sample from its last row */
    bool admitted;     /* admitted this step: set up its sequence (claiming pos_start cached
                          tokens from the prefix cache) before reserving */
    bool swap_in;      /* resumed after SWAP preemption: swap its KV in before computing */
} loom__sched_entry;

/* Filled by loom__sched_schedule; the arrays point into memory owned by the scheduler, valid
 * until the next loom__sched_schedule or loom__sched_destroy. The engine carries out, in order:
 * preemptions (preempt_mode), rejections, then the entries. */
typedef struct loom__sched_plan {
    const loom__sched_entry *entries; /* [n_entries]: running decodes first, then chunks in
                                        order of importance */
    int32_t n_entries;                /* <= max_seqs */
    int32_t n_tokens;                 /* sum of entries' n_tokens, <= max_batched_tokens */
    int32_t n_decode;                 /* entries that are decodes */
    const uint64_t *preempted;        /* [n_preempted] running requests to preempt now */
    int32_t n_preempted;
    loom__sched_preempt_mode preempt_mode;
    const uint64_t *rejected; /* [n_rejected] requests that can never fit in the KV cache; the
                                 scheduler has forgotten them; the engine fails them and frees
                                 what they hold (a rejected running request holds KV) */
    int32_t n_rejected;
} loom__sched_plan;

/* What the engine reports for one entry of the last plan. */
typedef struct loom__sched_result {
    uint64_t id;
    int32_t n_new_tokens; /* tokens sampled this step (0 unless the entry had `sample`) */
    bool finished;        /* the request is done (stop, error, ...): the scheduler forgets it,
                             the engine frees its KV */
} loom__sched_result;

typedef struct loom__sched_stats {
    int32_t n_waiting; /* never admitted */
    int32_t n_running;
    int32_t n_preempted; /* preempted, waiting to resume */
    int64_t n_steps;     /* plans with at least one entry */
    int64_t n_added, n_finished, n_cancelled, n_rejected;
    int64_t n_preemptions, n_promotions;
    int64_t n_prefill_tokens, n_decode_tokens; /* planned and committed */
    int64_t n_ttft_met, n_ttft_missed;         /* first tokens of requests with a TTFT deadline */
    int64_t n_tpot_met, n_tpot_missed;         /* later tokens of requests with a TPOT deadline */
    int64_t n_deferred; /* decodes left out of a step for an urgent first token */
} loom__sched_stats;

/* ------------------------------------------------------------------------------------------ */
/* Functions                                                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct loom__sched loom__sched;

/* Creates a scheduler. cfg and kv are copied (kv->ctx must outlive the scheduler). Errors:
 * INVALID_ARG (NULL, max_seqs < 1, max_batched_tokens < max_seqs, negative chunk cap, watermark
 * or age, unknown policy or mode, a required kv function missing), OUT_OF_MEMORY. */
loom_status loom__sched_create(const loom__sched_config *cfg, const loom__sched_kv_iface *kv,
                               loom__sched **out);

/* Frees the scheduler and its plan memory. NULL is a no-op. */
void loom__sched_destroy(loom__sched *s);

/* Adds a waiting request. May grow the scheduler's tables (the only call that allocates).
 * Errors: INVALID_ARG (NULL, duplicate id, n_prompt or max_new_tokens < 1, negative deadline,
 * arrival after now, now before an earlier call's), OUT_OF_MEMORY. */
loom_status loom__sched_add(loom__sched *s, const loom__sched_request_info *info, int64_t now_us);

/* Builds the next step's plan into *plan (see loom__sched_plan for ownership). Preemptions and
 * admissions take effect at once; progress is committed by loom__sched_on_step_done. A plan
 * with no entries needs no on_step_done. Errors: INVALID_ARG (NULL, time going back, the last
 * plan with entries not yet committed). */
loom_status loom__sched_schedule(loom__sched *s, int64_t now_us, loom__sched_plan *plan);

/* Commits the last plan: every entry's n_tokens become computed, results add sampled tokens
 * (a request that reaches max_new_tokens finishes, whether or not `finished` is set) and
 * remove finished requests. results name entries of the last plan, each at most once; every
 * entry with `sample` needs a result with n_new_tokens >= 1 or finished (otherwise it would have
 * nothing left to compute). Results for requests cancelled since the plan are ignored. Errors:
 * INVALID_ARG (NULL with n_results > 0, no plan pending, an id not in the plan, a repeated id,
 * tokens for an entry without `sample`, a sampling entry without a result, time going back);
 * nothing is committed then. */
loom_status loom__sched_on_step_done(loom__sched *s, const loom__sched_result *results,
                                     int32_t n_results, int64_t now_us);

/* Removes request id in whatever state it is; *holds (may be NULL) says what the engine must
 * free. If it is in the pending plan, the engine drops its entry (if it has not run yet) and
 * on_step_done ignores it. Errors: INVALID_ARG (NULL s, unknown id). */
loom_status loom__sched_cancel(loom__sched *s, uint64_t id, loom__sched_holds *holds);

/* Between loom__sched_schedule and loom__sched_on_step_done: the running request id could not
 * run its entry of the pending plan (the engine found fewer KV blocks than the plan assumed).
 * It goes back to waiting as a request preempted by recompute (n_computed 0, not swapped; the
 * engine frees what it held) and its entry counts for nothing. Errors: INVALID_ARG (unknown
 * id, no plan pending, or no entry for it in the plan). */
loom_status loom__sched_defer(loom__sched *s, uint64_t id);

/* The request id, just preempted by swap, could not be swapped out (the engine's host swap
 * area is full): it waits as one preempted by recompute (n_computed 0, not swapped). Errors:
 * INVALID_ARG (unknown id, or not a swapped waiting request). */
loom_status loom__sched_unswap(loom__sched *s, uint64_t id);

/* The state and counters of request id. Errors: INVALID_ARG (NULL, unknown id). */
loom_status loom__sched_get(const loom__sched *s, uint64_t id, loom__sched_request_view *out);

/* Counters since create. Never fails for non-NULL arguments (NULL: zeroes / no-op). */
void loom__sched_get_stats(const loom__sched *s, loom__sched_stats *out);

/* Sets the step-cost model decode deferral uses (copied; the engine passes its fitted model
 * after every step). While it has no fit, no decode is ever deferred. Deferral (PRIORITY
 * policy): when the most urgent request still to get its first token with a reachable TTFT
 * deadline would miss it with every running decode in each step, but make it with the
 * decodes of lower-ranked requests without any deadline left out, those decodes wait, keeping
 * their KV, for as long as that holds. */
void loom__sched_set_cost(loom__sched *s, const loom__cost_model *cm);

/* Checks the scheduler's internal invariants (every request in exactly one queue, the id index,
 * running <= max_seqs, counters in range). For tests and debug builds. Errors: INTERNAL with
 * the broken invariant in the message. */
loom_status loom__sched_validate(const loom__sched *s);

/* ------------------------------------------------------------------------------------------ */
/* Forecast: predicted time to first token, for admission control                            */
/* ------------------------------------------------------------------------------------------ */

/* One live request as the forecast sees it: its rank and the work it still has. */
typedef struct loom__sched_brief {
    int64_t key_prio; /* rank, as in the plan's order (sched_plan.c) */
    int32_t tier;
    int64_t deadline;
    int64_t arrival_us;
    uint64_t seq;
    int32_t remaining; /* positions to compute before its next token (0 for a decode) */
    int32_t out_left;  /* tokens it may still generate */
    bool running;
    bool protected_;    /* no preemption victim now (anti-thrash) */
    bool paced;         /* a TPOT deadline: a decode without one may be deferred */
    int32_t n_computed; /* positions it holds (running) */
    bool promoted;      /* its key is the promoted rank, bounded by the classes with deadlines */
    int32_t priority;
} loom__sched_brief;

/* A copy of the scheduler's queues, made between steps, from which the time to first token of a
 * request that arrives now can be predicted without touching the scheduler (so another thread
 * may read it under the engine's lock while the step thread works). */
typedef struct loom__sched_forecast {
    loom__sched_brief *briefs; /* [n], capacity cap; owned */
    int32_t n, cap;
    bool fcfs;
    int32_t max_seqs, max_batched_tokens;
    int32_t n_running, n_decode;
    int64_t ctx_running; /* positions the running requests hold */
    bool defer;          /* the scheduler defers decodes (it has a cost model) */
    double hit_frac;     /* set by the caller: the fraction of a new prompt expected to be found
                            in the prefix cache (its recent hit rate; 0: none) */
    int64_t now_us;      /* when it was made */
} loom__sched_forecast;

/* Fills f (whose memory it grows; zero-initialise f before the first call) from the scheduler's
 * state at now_us. Errors: INVALID_ARG (NULL), OUT_OF_MEMORY (f keeps its previous content). */
loom_status loom__sched_forecast_build(const loom__sched *s, int64_t now_us,
                                       loom__sched_forecast *f);

/* Adds a request just given to the scheduler (waiting, nothing computed), so predictions for
 * later arrivals of the same step count it. Errors: OUT_OF_MEMORY (f unchanged). */
loom_status loom__sched_forecast_add(loom__sched_forecast *f, const loom__sched_request_info *info);

/* Predicted time from the request's arrival to its first token, in microseconds, if it were
 * added now: the time already waited, plus the steps until the prefill ranked ahead of it and
 * its own prompt are computed (each step computing the budget left after the running decodes)
 * or, when every sequence slot is taken by requests it may not preempt, until enough of them
 * finish (at the rate running requests finish, assuming each generates all the tokens it may)
 * plus its own prefill; each step costing what the model says for its tokens and the running
 * context — without the decodes the scheduler would defer for it (loom__sched_set_cost) when
 * that is what makes its deadline. The queued requests' prefix-cache hits are the KV manager's
 * answers at build time, the new request's are hit_frac of its prompt. Ignores KV blocks (a
 * KV-bound queue is predicted early) and sampling stops. -1 when the cost model has no fit yet. */
int64_t loom__sched_forecast_ttft(const loom__sched_forecast *f, const loom__cost_model *cm,
                                  const loom__sched_request_info *info, int64_t now_us);

void loom__sched_forecast_free(loom__sched_forecast *f);

/* The decision for a request with a TTFT deadline whose predicted TTFT is predicted_us (-1:
 * unknown, admitted) under policy (loom.h's loom_admission_policy). Requests without a TTFT
 * deadline are always admitted. Returns true when
 * the request is admitted; *info is rewritten for DEGRADE. */
bool loom__admission_decide(loom_admission_policy policy, int64_t predicted_us,
                            loom__sched_request_info *info, bool *degraded);
