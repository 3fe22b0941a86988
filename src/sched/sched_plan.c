/* sched_plan.c — building one step's plan: promotion, the order of importance, the token
 * budget, running decodes first, then prefill chunks and admissions in order, and the choice of
 * preemption victims when KV blocks or sequence slots run short. The policy is described in
 * sched.h; this file says how it is carried out. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "core/status.h"
#include "sched/sched_internal.h"

/* One step's running accounts. Blocks are int64_t: sums of the engine's int32_t answers. */
typedef struct step {
    loom__sched *s;
    int64_t now;
    int64_t avail;    /* blocks this step can still hand out (planned needs subtracted) */
    int64_t promised; /* blocks reserved for the rest of running requests' prefills */
    int32_t budget;   /* tokens left */
    int32_t n_entries, n_tokens, n_decode, n_preempted, n_rejected;
    bool admission_closed; /* a waiting request could not be admitted: none behind it may be */
} step;

/* ------------------------------------------------------------------------------------------ */
/* The KV interface, with the engine's answers clamped to sense                               */
/* ------------------------------------------------------------------------------------------ */

static int64_t kv_free(const loom__sched *s) {
    int32_t n = s->kv.blocks_free(s->kv.ctx);
    return n > 0 ? n : 0;
}

static int64_t kv_needed(const loom__sched *s, const sched_req *r, int32_t n_computed,
                         int32_t n_new) {
    int32_t n = s->kv.blocks_needed(s->kv.ctx, r->id, n_computed, n_new);
    return n > 0 ? n : 0;
}

static int64_t kv_reclaimable(const loom__sched *s, const sched_req *r) {
    int32_t n = s->kv.blocks_reclaimable(s->kv.ctx, r->id);
    return n > 0 ? n : 0;
}

/* Where a request that holds nothing starts: after its cached prefix, keeping one token to
 * compute so the step yields logits to sample from. */
static int32_t start_position(const loom__sched *s, const sched_req *r) {
    if (r->swapped) return r->n_computed;
    int32_t n = s->kv.cached_tokens ? s->kv.cached_tokens(s->kv.ctx, r->id) : 0;
    int32_t max = loom__sched_total(r) - 1;
    return n < 0 ? 0 : n > max ? max : n;
}

/* ------------------------------------------------------------------------------------------ */
/* Order                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static bool is_fcfs(const loom__sched *s) {
    return s->cfg.policy == LOOM_SCHED_POLICY_FCFS;
}

/* A running request with exactly its newest sampled token left to compute. */
static bool is_decode(const sched_req *r) {
    return r->n_generated > 0 && loom__sched_total(r) - r->n_computed == 1;
}

static int64_t add_sat(int64_t a, int64_t b) {
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

/* The due time of the request's next token (see sched.h), INT64_MAX if it has no deadline. */
static int64_t next_due(const sched_req *r) {
    if (r->n_generated == 0) return r->ttft_us > 0 ? add_sat(r->arrival_us, r->ttft_us) : INT64_MAX;
    if (r->tpot_us <= 0) return INT64_MAX;
    if (r->tpot_us > INT64_MAX / r->n_generated) return INT64_MAX;
    return add_sat(r->first_token_us, r->tpot_us * r->n_generated);
}

/* Does r have a deadline (TTFT or TPOT) at all? */
static bool has_deadline(const sched_req *r) {
    return r->ttft_us > 0 || r->tpot_us > 0;
}

/* Can r still meet the deadline of its next token? (false when it has none) */
static bool deadline_reachable(const sched_req *r, int64_t now) {
    int64_t due = next_due(r);
    return due != INT64_MAX && due > now;
}

/* Rank keys. Priorities are doubled so a promoted request can rank between two of them.
 *   - Unpromoted: key 2 * priority; within it, tier 0 while its deadline is reachable (earliest
 *     due first), tier 2 once missed or with none (missed first, by due time, then no deadline).
 *     A request past its deadline yields to those still able to meet theirs: under overload,
 *     serving earliest-deadline-first would make every later request late too (the domino
 *     effect).
 *   - Promoted: above every request of lower priority than the lowest priority that has a
 *     request with a deadline (s->reach_prio), below that priority itself (key
 *     2 * reach_prio - 1), never below its own; at the top when no request has a deadline. So
 *     starvation promotion never outranks a class that asked for deadlines — under overload
 *     the best-effort work is what degrades —, and the bound does not flip with every
 *     deadline met or missed (which made promoted requests jump to the top, be admitted and be
 *     preempted again at the next arrival). Promoted requests go FIFO (tier 1, by promotion
 *     time). */
static void set_keys(const loom__sched *s, sched_req *r, int64_t now) {
    r->key_tier = 0;
    if (is_fcfs(s)) {
        r->key_prio = 0;
        r->key_deadline = 0;
    } else if (r->promoted) {
        int64_t own = 2 * (int64_t)r->priority;
        int64_t bound = s->reach_prio == INT64_MAX ? INT64_MAX : 2 * s->reach_prio - 1;
        r->key_prio = own > bound ? own : bound;
        r->key_tier = 1;
        r->key_deadline = r->promoted_at_us;
    } else {
        r->key_prio = 2 * (int64_t)r->priority;
        r->key_deadline = next_due(r);
        r->key_tier = deadline_reachable(r, now) ? 0 : 2;
    }
}

static int cmp3(int64_t a, int64_t b) {
    return (a > b) - (a < b);
}

static int key_cmp(const void *pa, const void *pb) {
    const sched_key *a = pa, *b = pb;
    int c = cmp3(b->prio, a->prio); /* higher rank first */
    if (!c) c = cmp3(a->tier, b->tier);
    if (!c) c = cmp3(a->deadline, b->deadline);
    if (!c) c = cmp3(a->arrival, b->arrival);
    if (!c) c = (a->seq > b->seq) - (a->seq < b->seq);
    return c;
}

/* Would v be preempted before r? Victims go lowest rank first (within a priority: no deadline
 * or a missed one before a deadline still reachable), then the one with the fewest
 * computed positions (the least work to redo or to move: recompute re-prefills them, swap
 * copies their blocks), then latest arrival (then latest added). */
static bool victim_before(const sched_req *v, const sched_req *r) {
    if (v->key_prio != r->key_prio) return v->key_prio < r->key_prio;
    if (v->key_tier != r->key_tier) return v->key_tier > r->key_tier;
    if (v->n_computed != r->n_computed) return v->n_computed < r->n_computed;
    if (v->arrival_us != r->arrival_us) return v->arrival_us > r->arrival_us;
    return v->seq > r->seq;
}

/* May v be preempted to make room for r? A running r (strict = false) may take from any request
 * that ranks after it as a victim; a waiting r (strict = true) only from strictly lower rank, so
 * equal priorities never trade places by preemption. Requests admitted in this plan are never
 * victims: the engine has not even set them up yet; nor is a request preempted twice already,
 * for protect_us after its admission (so no request thrashes). */
static bool may_preempt(const loom__sched *s, const sched_req *v, const sched_req *r, bool strict) {
    if (v == r || v->admitted_now || v->state != SCHED_RUNNING) return false;
    if (v->protected_until_us > s->last_now_us) return false;
    if (strict) return !is_fcfs(s) && v->key_prio < r->key_prio;
    return victim_before(v, r);
}

static void promote(loom__sched *s, int64_t now) {
    int64_t age = s->cfg.promote_age_us;
    if (is_fcfs(s) || age <= 0) return;
    for (int32_t i = 0; i < s->n_waiting; i++) {
        sched_req *r = &s->reqs[s->waiting[i]];
        if (r->promoted || loom__sched_waited(r, now) < age) continue;
        r->promoted = true;
        /* The moment its waiting reached the age, so FIFO among the promoted is exact. */
        r->promoted_at_us = r->wait_since_us + (age - r->waited_us);
        s->stats.n_promotions++;
    }
}

void loom__sched_rank_keys(loom__sched *s, int64_t now) {
    s->reach_prio = INT64_MAX;
    for (int32_t q = 0; q < 2; q++) {
        const int32_t *list = q ? s->waiting : s->running;
        int32_t len = q ? s->n_waiting : s->n_running;
        for (int32_t i = 0; i < len; i++) {
            const sched_req *r = &s->reqs[list[i]];
            if (!r->promoted && r->priority < s->reach_prio && has_deadline(r))
                s->reach_prio = r->priority;
        }
    }
    for (int32_t q = 0; q < 2; q++) {
        const int32_t *list = q ? s->waiting : s->running;
        int32_t len = q ? s->n_waiting : s->n_running;
        for (int32_t i = 0; i < len; i++) set_keys(s, &s->reqs[list[i]], now);
    }
}

/* Resets the step scratch, computes keys, and sorts every live request into s->order.
 * Returns how many. */
static int32_t build_order(loom__sched *s, int64_t now) {
    loom__sched_rank_keys(s, now);
    int32_t n = 0;
    for (int32_t q = 0; q < 2; q++) {
        const int32_t *list = q ? s->waiting : s->running;
        int32_t len = q ? s->n_waiting : s->n_running;
        for (int32_t i = 0; i < len; i++) {
            sched_req *r = &s->reqs[list[i]];
            r->admitted_now = r->preempted_now = false;
            r->step_blocks = r->promise = 0;
            s->order[n++] = (sched_key){r->key_prio,   r->key_tier, r->key_deadline,
                                        r->arrival_us, r->seq,      list[i]};
        }
    }
    qsort(s->order, (size_t)n, sizeof *s->order, key_cmp);
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* The plan's lists                                                                           */
/* ------------------------------------------------------------------------------------------ */

static void plan_entry(step *st, int32_t slot, int32_t pos_start, int32_t n_tokens, int64_t blocks,
                       bool admitted, bool swap_in) {
    loom__sched *s = st->s;
    sched_req *r = &s->reqs[slot];
    int32_t k = st->n_entries++;
    bool decode = r->n_generated > 0 && pos_start == loom__sched_total(r) - 1;
    s->entries[k] = (loom__sched_entry){
        .id = r->id,
        .pos_start = pos_start,
        .n_tokens = n_tokens,
        .is_prefill = !decode,
        .sample = pos_start + n_tokens == loom__sched_total(r),
        .admitted = admitted,
        .swap_in = swap_in,
    };
    s->entry_slot[k] = slot;
    r->entry = k;
    r->step_blocks = (int32_t)blocks;
    st->avail -= blocks;
    st->budget -= n_tokens;
    st->n_tokens += n_tokens;
    st->n_decode += decode ? 1 : 0;
}

/* Takes r's entry back out of the plan (r is being preempted), returning its tokens and blocks. */
static void unplan(step *st, sched_req *r) {
    loom__sched *s = st->s;
    int32_t k = r->entry;
    st->budget += s->entries[k].n_tokens;
    st->n_tokens -= s->entries[k].n_tokens;
    st->n_decode -= s->entries[k].is_prefill ? 0 : 1;
    st->avail += r->step_blocks;
    r->step_blocks = 0;
    r->entry = -1;
    for (int32_t j = k + 1; j < st->n_entries; j++) {
        s->entries[j - 1] = s->entries[j];
        s->entry_slot[j - 1] = s->entry_slot[j];
        s->reqs[s->entry_slot[j - 1]].entry = j - 1;
    }
    st->n_entries--;
}

static void preempt(step *st, int32_t slot) {
    loom__sched *s = st->s;
    sched_req *v = &s->reqs[slot];
    if (v->entry >= 0) unplan(st, v);
    st->avail += kv_reclaimable(s, v);
    st->promised -= v->promise;
    v->promise = 0;
    loom__sched_running_remove(s, slot);
    if (s->cfg.preempt_mode == LOOM_SCHED_PREEMPT_SWAP)
        v->swapped = true;
    else
        v->n_computed = 0; /* n_generated stays: it re-prefills prompt + generated tokens */
    v->preempted = true;
    v->preempted_now = true;
    v->n_preempts++;
    v->wait_since_us = st->now;
    loom__sched_waiting_push(s, slot);
    s->preempted[st->n_preempted++] = v->id;
    s->stats.n_preemptions++;
}

/* Forgets a request that can never fit in the KV cache; the engine fails it. */
static void reject(step *st, int32_t slot) {
    loom__sched *s = st->s;
    sched_req *r = &s->reqs[slot];
    if (r->state == SCHED_RUNNING) {
        st->promised -= r->promise;
        loom__sched_running_remove(s, slot);
    } else {
        loom__sched_waiting_remove(s, slot);
    }
    s->rejected[st->n_rejected++] = r->id;
    s->stats.n_rejected++;
    loom__sched_release(s, slot);
}

/* ------------------------------------------------------------------------------------------ */
/* Making room                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Is there room for r to take `need` blocks? A running request only needs the blocks; an
 * admission also needs a sequence slot and must leave the promised blocks and the watermark
 * (waived when nothing runs) untouched. The *_after arguments let make_room ask the question
 * for the accounts as they would be after preempting every candidate. */
static bool room_for(const step *st, bool admission, int64_t need, int64_t avail, int64_t promised,
                     int32_t n_running) {
    if (!admission) return need <= avail;
    const loom__sched_config *c = &st->s->cfg;
    int64_t wm = n_running == 0 ? 0 : c->watermark_blocks;
    return n_running < c->max_seqs && need + promised + wm <= avail;
}

static bool room_now(const step *st, bool admission, int64_t need) {
    return room_for(st, admission, need, st->avail, st->promised, st->s->n_running);
}

/* The best victim for r: lowest effective priority, then latest arrival. -1 if none may go. */
static int32_t pick_victim(const loom__sched *s, const sched_req *r, bool strict) {
    int32_t best = -1;
    for (int32_t i = 0; i < s->n_running; i++) {
        const sched_req *v = &s->reqs[s->running[i]];
        if (!may_preempt(s, v, r, strict)) continue;
        if (best < 0 || victim_before(v, &s->reqs[best])) best = s->running[i];
    }
    return best;
}

/* Preempts victims until r has room for `need` blocks (see room_for). Checks first that
 * preempting every allowed candidate would be enough, so no request is preempted for nothing.
 * Returns whether there is room. */
static bool make_room(step *st, int32_t slot, bool admission, int64_t need) {
    loom__sched *s = st->s;
    const sched_req *r = &s->reqs[slot];
    if (room_now(st, admission, need)) return true;
    int64_t avail = st->avail, promised = st->promised;
    int32_t n_running = s->n_running;
    for (int32_t i = 0; i < s->n_running; i++) {
        const sched_req *v = &s->reqs[s->running[i]];
        if (!may_preempt(s, v, r, admission)) continue;
        avail += kv_reclaimable(s, v) + v->step_blocks;
        promised -= v->promise;
        n_running--;
    }
    if (!room_for(st, admission, need, avail, promised, n_running)) return false;
    while (!room_now(st, admission, need)) {
        int32_t v = pick_victim(s, r, admission);
        if (v < 0) return false; /* unreachable: the check above counted these victims */
        preempt(st, v);
    }
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* The passes                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* A running request that cannot get even one token's blocks, with no victim left to take
 * from: it waits for others to finish, unless it runs alone, in which case no amount of waiting
 * helps (its context outgrew the whole cache) and it is rejected. */
static void stuck(step *st, int32_t slot) {
    if (st->s->n_running == 1 && st->n_rejected < st->s->cfg.max_seqs) reject(st, slot);
}

/* Largest chunk in [1, max] whose blocks fit in `limit` (0 if none), by bisection: the
 * engine's block count does not decrease as the chunk grows. *blocks gets its need. */
static int32_t fit_chunk(const loom__sched *s, const sched_req *r, int32_t max, int64_t limit,
                         int64_t *blocks) {
    int64_t need = kv_needed(s, r, r->n_computed, max);
    if (need <= limit) {
        *blocks = need;
        return max;
    }
    need = kv_needed(s, r, r->n_computed, 1);
    if (need > limit) return 0;
    int32_t lo = 1, hi = max; /* need(lo) fits, need(hi) does not */
    int64_t lo_need = need;
    while (hi - lo > 1) {
        int32_t mid = lo + (hi - lo) / 2;
        int64_t m = kv_needed(s, r, r->n_computed, mid);
        if (m <= limit) {
            lo = mid;
            lo_need = m;
        } else {
            hi = mid;
        }
    }
    *blocks = lo_need;
    return lo;
}

static int32_t chunk_limit(const step *st, int32_t remaining) {
    int32_t c = remaining < st->budget ? remaining : st->budget;
    int32_t cap = st->s->cfg.max_prefill_chunk;
    return cap > 0 && cap < c ? cap : c;
}

static void schedule_decode(step *st, int32_t slot) {
    sched_req *r = &st->s->reqs[slot];
    int64_t need = kv_needed(st->s, r, r->n_computed, 1);
    if (!make_room(st, slot, false, need)) {
        stuck(st, slot);
        return;
    }
    plan_entry(st, slot, r->n_computed, 1, need, false, false);
}

static void schedule_prefill(step *st, int32_t slot) {
    loom__sched *s = st->s;
    sched_req *r = &s->reqs[slot];
    int32_t remaining = loom__sched_total(r) - r->n_computed;
    int64_t blocks = 0;
    int32_t c = fit_chunk(s, r, chunk_limit(st, remaining), st->avail, &blocks);
    if (c == 0) {
        /* Not even one token fits: preempt for one token's worth, then take what fits. */
        if (!make_room(st, slot, false, kv_needed(s, r, r->n_computed, 1))) {
            stuck(st, slot);
            return;
        }
        c = fit_chunk(s, r, chunk_limit(st, remaining), st->avail, &blocks);
        if (c == 0) return;
    }
    plan_entry(st, slot, r->n_computed, c, blocks, false, false);
    /* This chunk's blocks come out of what was promised to the request's prefill. */
    int64_t take = blocks < r->promise ? blocks : r->promise;
    r->promise -= (int32_t)take;
    st->promised -= take;
}

static void schedule_admission(step *st, int32_t slot) {
    loom__sched *s = st->s;
    sched_req *r = &s->reqs[slot];
    int32_t start = start_position(s, r);
    int32_t remaining = loom__sched_total(r) - start;
    int64_t need_all = kv_needed(s, r, start, remaining);
    if (!make_room(st, slot, true, need_all)) {
        /* Alone and still too big: it never will fit. Otherwise it waits, and (no overtaking)
         * so does everyone behind it. */
        if (s->n_running == 0 && st->n_rejected < s->cfg.max_seqs)
            reject(st, slot);
        else
            st->admission_closed = true;
        return;
    }
    if (st->budget == 0) return; /* preemption gave slots and blocks, but no tokens are left */
    int32_t c = chunk_limit(st, remaining);
    int64_t need_c = c == remaining ? need_all : kv_needed(s, r, start, c);

    bool swap_in = r->swapped;
    r->waited_us += st->now - r->wait_since_us;
    loom__sched_waiting_remove(s, slot);
    loom__sched_running_push(s, slot);
    r->n_computed = start;
    r->swapped = false;
    r->preempted = false;
    r->admitted_now = true;
    if (r->n_preempts >= 2 && s->cfg.protect_us > 0)
        r->protected_until_us = add_sat(st->now, s->cfg.protect_us);
    plan_entry(st, slot, start, c, need_c, true, swap_in);
    r->promise = (int32_t)(need_all > need_c ? need_all - need_c : 0);
    st->promised += r->promise;
}

/* The step's token budget: max_batched_tokens, cut (PRIORITY with a step cost model) so the
 * step ends before the earliest due token among running decodes that can still make it, but
 * never below the number of running decodes (decodes always run). */
static int32_t step_budget(const loom__sched *s, int64_t now) {
    const loom__sched_config *c = &s->cfg;
    int32_t budget = c->max_batched_tokens, n_decode = 0;
    for (int32_t i = 0; i < s->n_running; i++) n_decode += is_decode(&s->reqs[s->running[i]]);
    if (is_fcfs(s) || c->step_per_token_us <= 0) return budget;
    /* Cost models that overflow int64 microseconds are treated as "no model". */
    if (c->step_per_token_us > (INT64_MAX / 2 - c->step_base_us) / (n_decode + 1)) return budget;
    int64_t floor_us = c->step_base_us + c->step_per_token_us * n_decode;
    for (int32_t i = 0; i < s->n_running; i++) {
        const sched_req *r = &s->reqs[s->running[i]];
        if (!is_decode(r) || r->tpot_us <= 0) continue;
        int64_t slack = next_due(r) - now;
        if (slack < floor_us) continue; /* too late already: cutting prefills won't save it */
        int64_t fit = (slack - c->step_base_us) / c->step_per_token_us;
        if (fit < budget) budget = (int32_t)fit;
    }
    return budget;
}

/* May running decode r be deferred for a request of rank key `key`? Only one that ranks below it
 * and has no pace to keep (no TPOT deadline). */
static bool may_defer(const sched_req *r, int64_t key) {
    return r->key_prio < key && next_due(r) == INT64_MAX;
}

/* Decode deferral. The most urgent request still to produce its first token with a reachable
 * TTFT deadline (the first such in the order) computes its prompt at the budget the running
 * decodes leave, in steps that the decodes make slower. When the step-cost model says it would
 * miss its deadline so but make it with the decodes of requests without any deadline and of
 * lower rank left out of the step, those decodes wait (keeping their KV) until it has its
 * first token: best-effort work yields first, and only when it saves a deadline. Returns the
 * rank key below which deadline-free decodes are deferred, or INT64_MIN for none. */
static int64_t defer_below(const loom__sched *s, int32_t n_order, int64_t now) {
    const loom__cost_model *cm = &s->cost;
    if (is_fcfs(s) || !loom__cost_model_ready(cm)) return INT64_MIN;
    const sched_req *u = NULL;
    for (int32_t i = 0; i < n_order && !u; i++) {
        const sched_req *r = &s->reqs[s->order[i].slot];
        if (r->n_generated == 0 && r->ttft_us > 0 && r->key_tier == 0 && !r->promoted) u = r;
    }
    if (!u) return INT64_MIN;
    int32_t n_keep = 0, n_defer = 0;
    int64_t ctx_keep = 0, ctx_defer = 0;
    for (int32_t i = 0; i < s->n_running; i++) {
        const sched_req *r = &s->reqs[s->running[i]];
        if (!is_decode(r)) continue;
        bool deferrable = may_defer(r, u->key_prio);
        n_defer += deferrable;
        n_keep += !deferrable;
        *(deferrable ? &ctx_defer : &ctx_keep) += r->n_computed + 1;
    }
    if (n_defer == 0) return INT64_MIN;
    int32_t left = loom__sched_total(u) - (u->state == SCHED_RUNNING ? u->n_computed : 0);
    int32_t B = s->cfg.max_batched_tokens;
    double slack = (double)(next_due(u) - now);
    /* Time to its first token with the decodes in every step, and without the deferrable. */
    double with = 0, without = 0;
    {
        int32_t per = B - n_keep - n_defer > 0 ? B - n_keep - n_defer : 1;
        double steps = ceil((double)left / per);
        with = steps * loom__cost_model_predict(cm, B, (double)(ctx_keep + ctx_defer));
        per = B - n_keep > 0 ? B - n_keep : 1;
        steps = ceil((double)left / per);
        without = steps * loom__cost_model_predict(cm, B, (double)ctx_keep);
    }
    return with > slack && without <= slack ? u->key_prio : INT64_MIN;
}

/* ------------------------------------------------------------------------------------------ */
/* loom__sched_schedule                                                                        */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__sched_schedule(loom__sched *s, int64_t now_us, loom__sched_plan *plan) {
    LOOM_CHECK_ARG(s && plan);
    LOOM_RETURN_IF(now_us < s->last_now_us, LOOM_ERR_INVALID_ARG,
                   "loom__sched_schedule: now %lld before an earlier call's %lld",
                   (long long)now_us, (long long)s->last_now_us);
    LOOM_RETURN_IF(s->pending, LOOM_ERR_INVALID_ARG,
                   "loom__sched_schedule: the last plan awaits loom__sched_on_step_done");
    s->last_now_us = now_us;

    promote(s, now_us);
    int32_t n = build_order(s, now_us);
    step st = {.s = s, .now = now_us, .avail = kv_free(s), .budget = step_budget(s, now_us)};
    for (int32_t i = 0; i < s->n_running; i++) {
        sched_req *r = &s->reqs[s->running[i]];
        if (is_decode(r)) continue;
        r->promise = (int32_t)kv_needed(s, r, r->n_computed, loom__sched_total(r) - r->n_computed);
        st.promised += r->promise;
    }

    /* Pass 1: every running decode, most important first (they choose victims first), but
     * those deferred for an urgent first token. */
    int64_t defer = defer_below(s, n, now_us);
    for (int32_t i = 0; i < n; i++) {
        int32_t slot = s->order[i].slot;
        const sched_req *r = &s->reqs[slot];
        if (r->state != SCHED_RUNNING || !is_decode(r)) continue;
        if (defer != INT64_MIN && may_defer(r, defer)) {
            s->stats.n_deferred++;
            continue;
        }
        schedule_decode(&st, slot);
    }
    /* Pass 2: running prefills and admissions in one order, so a more important waiting
     * request gets budget before a less important running prefill does. */
    for (int32_t i = 0; i < n && st.budget > 0; i++) {
        int32_t slot = s->order[i].slot;
        const sched_req *r = &s->reqs[slot];
        if (r->state == SCHED_RUNNING) {
            if (r->entry < 0 && !r->admitted_now && !is_decode(r)) schedule_prefill(&st, slot);
        } else if (r->state == SCHED_WAITING && !r->preempted_now && !st.admission_closed) {
            schedule_admission(&st, slot);
        }
    }

    plan->entries = s->entries;
    plan->n_entries = st.n_entries;
    plan->n_tokens = st.n_tokens;
    plan->n_decode = st.n_decode;
    plan->preempted = s->preempted;
    plan->n_preempted = st.n_preempted;
    plan->preempt_mode = s->cfg.preempt_mode;
    plan->rejected = s->rejected;
    plan->n_rejected = st.n_rejected;
    s->pending = st.n_entries > 0;
    s->n_pending = st.n_entries;
    if (s->pending) s->stats.n_steps++;
    return LOOM_OK;
}
