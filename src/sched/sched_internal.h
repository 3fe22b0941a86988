/* sched_internal.h — the scheduler's records, queues and id index, shared by sched_core.c (the
 * request lifecycle: add, commit, cancel, queries), sched_index.c (the id → slot hash index)
 * and sched_plan.c (building a step's plan). Not for use outside src/sched/. */
#pragma once

#include "sched/sched.h"

/* ------------------------------------------------------------------------------------------ */
/* Request records                                                                            */
/* ------------------------------------------------------------------------------------------ */

typedef enum sched_rstate {
    SCHED_FREE = 0, /* the slot holds no request */
    SCHED_WAITING,  /* in s->waiting (never admitted, or preempted: see `preempted`) */
    SCHED_RUNNING,  /* in s->running */
} sched_rstate;

typedef struct sched_req {
    /* what the engine told us */
    uint64_t id;
    int32_t priority;
    int32_t n_prompt;
    int32_t max_new_tokens;
    int64_t arrival_us;
    int64_t ttft_us; /* relative to arrival; 0 = none */
    int64_t tpot_us; /* 0 = none */
    uint64_t seq;    /* add order: the last tie-breaker, so every order is total */

    /* progress */
    int32_t n_computed;  /* positions whose KV the request holds (or has swapped out) */
    int32_t n_generated; /* tokens sampled; n_prompt + n_generated tokens are known */
    int64_t first_token_us;

    /* state */
    sched_rstate state;
    bool preempted;             /* waiting after a preemption */
    bool swapped;               /* its KV is on the host (SWAP preemption, not yet swapped in) */
    bool promoted;              /* sticky until the request leaves */
    int64_t promoted_at_us;     /* orders promoted requests FIFO */
    int64_t wait_since_us;      /* when the current wait began (arrival or preemption) */
    int64_t waited_us;          /* total of the earlier waits */
    int32_t n_preempts;         /* times it was preempted (or deferred) */
    int64_t protected_until_us; /* not a preemption victim before this (see protect_us) */
    int32_t list_idx;           /* index in s->waiting or s->running */
    int32_t entry;              /* index in the pending plan's entries, -1 if none */

    /* per-step scratch, reset by every loom__sched_schedule */
    int64_t key_prio;     /* rank key: 2 * priority, or the promoted rank (see set_keys) */
    int32_t key_tier;     /* within key_prio: 0 deadline still reachable, 1 promoted, 2 the rest */
    int64_t key_deadline; /* INT64_MAX = none */
    int32_t step_blocks;  /* blocks counted against this step for its entry */
    int32_t promise;      /* blocks still reserved for the rest of its prefill */
    bool admitted_now;    /* admitted by this step's plan: not a victim candidate */
    bool preempted_now;   /* preempted by this step's plan: not re-admitted in it */
} sched_req;

/* ------------------------------------------------------------------------------------------ */
/* The scheduler                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* The id → slot index: open addressing, linear probing, power-of-two capacity kept at most half
 * full, deletion by backward shift (no tombstones, so probes stay short under churn). */
typedef struct sched_index {
    uint64_t *keys; /* [cap] */
    int32_t *vals;  /* [cap] slot, -1 = empty */
    int32_t cap;
} sched_index;

/* A request's place in a step's order, copied out of its record so qsort needs no context. */
typedef struct sched_key {
    int64_t prio;     /* rank key, higher first */
    int32_t tier;     /* lower first: reachable deadline, promoted, the rest */
    int64_t deadline; /* earlier first; INT64_MAX = none */
    int64_t arrival;  /* earlier first */
    uint64_t seq;     /* add order: earlier first */
    int32_t slot;
} sched_key;

struct loom__sched {
    loom__sched_config cfg;
    loom__sched_kv_iface kv;

    sched_req *reqs; /* [cap] slots */
    int32_t cap;
    int32_t *free_slots; /* [cap] stack of free slots */
    int32_t n_free;
    sched_index index;

    int32_t *waiting; /* [cap] slots of waiting requests, unordered */
    int32_t n_waiting;
    int32_t *running; /* [max_seqs] slots of running requests, unordered */
    int32_t n_running;
    sched_key *order; /* [cap] scratch: live requests sorted for a step */

    /* the plan, sized at create time */
    loom__sched_entry *entries; /* [max_seqs] */
    int32_t *entry_slot;        /* [max_seqs] slot of each entry; -1 once cancelled */
    bool *entry_seen;           /* [max_seqs] scratch for on_step_done's duplicate check */
    uint64_t *preempted;        /* [max_seqs] */
    uint64_t *rejected;         /* [max_seqs] */
    bool pending;               /* a plan with entries awaits on_step_done */
    int32_t n_pending;          /* its entries */

    uint64_t next_seq;
    int64_t last_now_us;
    loom__cost_model cost;   /* for decode deferral (loom__sched_set_cost); empty: off */
    int64_t reach_prio;      /* this step: lowest priority of a request with a deadline, INT64_MAX
                                if none (bounds the rank of promoted requests) */
    loom__sched_stats stats; /* the n_waiting/n_running/n_preempted fields are filled on demand */
};

/* ------------------------------------------------------------------------------------------ */
/* Shared internals                                                                           */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__sched_index_init(sched_index *ix, int32_t n_items);
void loom__sched_index_free(sched_index *ix);
/* Slot of id, or -1. */
int32_t loom__sched_index_find(const sched_index *ix, uint64_t id);
/* Inserts id (not present; the caller has grown the index to fit). */
void loom__sched_index_put(sched_index *ix, uint64_t id, int32_t slot);
void loom__sched_index_del(sched_index *ix, uint64_t id);
/* Rebuilds ix to hold n_items at most half full; on failure ix is unchanged. */
loom_status loom__sched_index_grow(sched_index *ix, int32_t n_items);

/* Queue moves (O(1): swap-remove with list_idx fix-up). */
void loom__sched_waiting_push(loom__sched *s, int32_t slot);
void loom__sched_waiting_remove(loom__sched *s, int32_t slot);
void loom__sched_running_push(loom__sched *s, int32_t slot);
void loom__sched_running_remove(loom__sched *s, int32_t slot);

/* Computes every live request's rank keys (key_prio, key_tier, key_deadline) for time now, as
 * the plan's order uses them (sched_plan.c). */
void loom__sched_rank_keys(loom__sched *s, int64_t now);

/* Frees a request's slot and forgets its id (it must be in no queue). */
void loom__sched_release(loom__sched *s, int32_t slot);

/* Tokens the request knows (prompt + generated); what remains to compute is this - n_computed. */
static inline int32_t loom__sched_total(const sched_req *r) {
    return r->n_prompt + r->n_generated;
}

/* Time r has spent waiting, up to now (0 while running beyond its earlier waits). */
static inline int64_t loom__sched_waited(const sched_req *r, int64_t now_us) {
    return r->waited_us + (r->state == SCHED_WAITING ? now_us - r->wait_since_us : 0);
}
