/* sched_core.c — the scheduler's request lifecycle: create/destroy, adding requests (the only
 * place tables grow), committing a step's results, cancellation, queries and the invariant
 * check. Building a plan lives in sched_plan.c. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "sched/sched_internal.h"

/* Bounds that keep every size computation far from overflow. */
#define SCHED_MAX_SEQS         (1 << 20)
#define SCHED_MAX_REQUESTS     (1 << 28)
#define SCHED_DEFAULT_CAPACITY 64

/* ------------------------------------------------------------------------------------------ */
/* Configuration, create, destroy                                                             */
/* ------------------------------------------------------------------------------------------ */

loom__sched_config loom__sched_default_config(void) {
    loom__sched_config c;
    memset(&c, 0, sizeof c);
    c.policy = LOOM_SCHED_POLICY_PRIORITY;
    c.max_batched_tokens = 2048;
    c.max_seqs = 64;
    c.preempt_mode = LOOM_SCHED_PREEMPT_RECOMPUTE;
    c.promote_age_us = 10 * 1000 * 1000;
    return c;
}

static loom_status check_config(const loom__sched_config *c) {
    LOOM_RETURN_IF(c->policy != LOOM_SCHED_POLICY_PRIORITY && c->policy != LOOM_SCHED_POLICY_FCFS,
                   LOOM_ERR_INVALID_ARG, "sched: unknown policy %d", (int)c->policy);
    LOOM_RETURN_IF(c->preempt_mode != LOOM_SCHED_PREEMPT_RECOMPUTE &&
                       c->preempt_mode != LOOM_SCHED_PREEMPT_SWAP,
                   LOOM_ERR_INVALID_ARG, "sched: unknown preempt mode %d", (int)c->preempt_mode);
    LOOM_RETURN_IF(c->max_seqs < 1 || c->max_seqs > SCHED_MAX_SEQS, LOOM_ERR_INVALID_ARG,
                   "sched: max_seqs %d outside [1, %d]", c->max_seqs, SCHED_MAX_SEQS);
    /* A budget below max_seqs could not run every running decode each step, and decodes
     * must never stall. */
    LOOM_RETURN_IF(c->max_batched_tokens < c->max_seqs, LOOM_ERR_INVALID_ARG,
                   "sched: max_batched_tokens %d below max_seqs %d", c->max_batched_tokens,
                   c->max_seqs);
    LOOM_RETURN_IF(c->max_prefill_chunk < 0 || c->watermark_blocks < 0 || c->promote_age_us < 0 ||
                       c->initial_capacity < 0 || c->step_base_us < 0 || c->step_per_token_us < 0 ||
                       c->protect_us < 0,
                   LOOM_ERR_INVALID_ARG,
                   "sched: negative chunk cap, watermark, promotion age, capacity, step cost or "
                   "protection");
    return LOOM_OK;
}

void loom__sched_destroy(loom__sched *s) {
    if (!s) return;
    free(s->reqs);
    free(s->free_slots);
    loom__sched_index_free(&s->index);
    free(s->waiting);
    free(s->running);
    free(s->order);
    free(s->entries);
    free(s->entry_slot);
    free(s->entry_seen);
    free(s->preempted);
    free(s->rejected);
    free(s);
}

loom_status loom__sched_create(const loom__sched_config *cfg, const loom__sched_kv_iface *kv,
                               loom__sched **out) {
    LOOM_CHECK_ARG(cfg && kv && out);
    LOOM_TRY(check_config(cfg));
    LOOM_RETURN_IF(!kv->blocks_free || !kv->blocks_needed || !kv->blocks_reclaimable,
                   LOOM_ERR_INVALID_ARG, "sched: kv interface lacks a required function");
    int32_t cap = cfg->initial_capacity > 0 ? cfg->initial_capacity : SCHED_DEFAULT_CAPACITY;
    if (cap > SCHED_MAX_REQUESTS) cap = SCHED_MAX_REQUESTS;
    size_t ns = (size_t)cfg->max_seqs;

    loom__sched *s = loom__calloc(1, sizeof *s);
    LOOM_RETURN_IF(!s, LOOM_ERR_OUT_OF_MEMORY, "sched: scheduler");
    s->cfg = *cfg;
    s->kv = *kv;
    s->cap = cap;
    s->reqs = loom__calloc((size_t)cap, sizeof *s->reqs);
    s->free_slots = loom__malloc((size_t)cap * sizeof *s->free_slots);
    s->waiting = loom__malloc((size_t)cap * sizeof *s->waiting);
    s->order = loom__malloc((size_t)cap * sizeof *s->order);
    s->running = loom__malloc(ns * sizeof *s->running);
    s->entries = loom__calloc(ns, sizeof *s->entries);
    s->entry_slot = loom__malloc(ns * sizeof *s->entry_slot);
    s->entry_seen = loom__calloc(ns, sizeof *s->entry_seen);
    s->preempted = loom__malloc(ns * sizeof *s->preempted);
    s->rejected = loom__malloc(ns * sizeof *s->rejected);
    if (!s->reqs || !s->free_slots || !s->waiting || !s->order || !s->running || !s->entries ||
        !s->entry_slot || !s->entry_seen || !s->preempted || !s->rejected ||
        loom__sched_index_init(&s->index, cap) != LOOM_OK) {
        loom__sched_destroy(s);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "sched: tables for %d requests, %d seqs", cap,
                          cfg->max_seqs);
    }
    /* Pop order hands out low slots first (cosmetic: easier to read in a debugger). */
    for (int32_t i = 0; i < cap; i++) s->free_slots[i] = cap - 1 - i;
    s->n_free = cap;
    s->last_now_us = INT64_MIN;
    *out = s;
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Queues                                                                                     */
/* ------------------------------------------------------------------------------------------ */

void loom__sched_waiting_push(loom__sched *s, int32_t slot) {
    s->reqs[slot].state = SCHED_WAITING;
    s->reqs[slot].list_idx = s->n_waiting;
    s->waiting[s->n_waiting++] = slot;
}

void loom__sched_waiting_remove(loom__sched *s, int32_t slot) {
    int32_t i = s->reqs[slot].list_idx, last = s->waiting[--s->n_waiting];
    s->waiting[i] = last;
    s->reqs[last].list_idx = i;
}

void loom__sched_running_push(loom__sched *s, int32_t slot) {
    s->reqs[slot].state = SCHED_RUNNING;
    s->reqs[slot].list_idx = s->n_running;
    s->running[s->n_running++] = slot;
}

void loom__sched_running_remove(loom__sched *s, int32_t slot) {
    int32_t i = s->reqs[slot].list_idx, last = s->running[--s->n_running];
    s->running[i] = last;
    s->reqs[last].list_idx = i;
}

void loom__sched_release(loom__sched *s, int32_t slot) {
    loom__sched_index_del(&s->index, s->reqs[slot].id);
    memset(&s->reqs[slot], 0, sizeof s->reqs[slot]);
    s->reqs[slot].state = SCHED_FREE;
    s->reqs[slot].entry = -1;
    s->free_slots[s->n_free++] = slot;
}

static loom_status check_now(loom__sched *s, int64_t now_us, const char *fn) {
    LOOM_RETURN_IF(now_us < s->last_now_us, LOOM_ERR_INVALID_ARG,
                   "%s: now %lld before an earlier call's %lld (the clock must be monotonic)", fn,
                   (long long)now_us, (long long)s->last_now_us);
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Adding requests                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* Doubles the request tables. Each realloc that succeeds leaves a larger buffer behind even if
 * a later one fails; s->cap only changes once all succeeded, so a failure changes nothing the
 * scheduler relies on. */
static loom_status grow(loom__sched *s) {
    LOOM_RETURN_IF(s->cap >= SCHED_MAX_REQUESTS, LOOM_ERR_OUT_OF_MEMORY,
                   "sched: more than %d requests", SCHED_MAX_REQUESTS);
    int32_t cap = s->cap * 2 > SCHED_MAX_REQUESTS ? SCHED_MAX_REQUESTS : s->cap * 2;
    size_t n = (size_t)cap;
    sched_req *reqs = loom__realloc(s->reqs, n * sizeof *reqs);
    if (reqs) s->reqs = reqs;
    int32_t *fs = loom__realloc(s->free_slots, n * sizeof *fs);
    if (fs) s->free_slots = fs;
    int32_t *w = loom__realloc(s->waiting, n * sizeof *w);
    if (w) s->waiting = w;
    sched_key *o = loom__realloc(s->order, n * sizeof *o);
    if (o) s->order = o;
    LOOM_RETURN_IF(!reqs || !fs || !w || !o, LOOM_ERR_OUT_OF_MEMORY,
                   "sched: growing to %d requests", cap);
    LOOM_TRY(loom__sched_index_grow(&s->index, cap));
    memset(s->reqs + s->cap, 0, (n - (size_t)s->cap) * sizeof *reqs);
    for (int32_t i = cap - 1; i >= s->cap; i--) s->free_slots[s->n_free++] = i;
    s->cap = cap;
    return LOOM_OK;
}

loom_status loom__sched_add(loom__sched *s, const loom__sched_request_info *info, int64_t now_us) {
    LOOM_CHECK_ARG(s && info);
    LOOM_TRY(check_now(s, now_us, __func__));
    LOOM_RETURN_IF(loom__sched_index_find(&s->index, info->id) >= 0, LOOM_ERR_INVALID_ARG,
                   "loom__sched_add: request id %llu already present",
                   (unsigned long long)info->id);
    LOOM_RETURN_IF(info->n_prompt < 1 || info->max_new_tokens < 1, LOOM_ERR_INVALID_ARG,
                   "loom__sched_add: request %llu: n_prompt %d and max_new_tokens %d must be >= 1",
                   (unsigned long long)info->id, info->n_prompt, info->max_new_tokens);
    /* The sum of known tokens must stay an int32_t position. */
    LOOM_RETURN_IF(info->n_prompt > INT32_MAX - info->max_new_tokens, LOOM_ERR_INVALID_ARG,
                   "loom__sched_add: request %llu: n_prompt + max_new_tokens overflows",
                   (unsigned long long)info->id);
    LOOM_RETURN_IF(info->ttft_us < 0 || info->tpot_us < 0, LOOM_ERR_INVALID_ARG,
                   "loom__sched_add: request %llu: negative deadline",
                   (unsigned long long)info->id);
    LOOM_RETURN_IF(info->arrival_us > now_us, LOOM_ERR_INVALID_ARG,
                   "loom__sched_add: request %llu arrives at %lld, after now %lld",
                   (unsigned long long)info->id, (long long)info->arrival_us, (long long)now_us);
    if (s->n_free == 0) LOOM_TRY(grow(s));

    int32_t slot = s->free_slots[--s->n_free];
    sched_req *r = &s->reqs[slot];
    memset(r, 0, sizeof *r);
    r->id = info->id;
    r->priority = info->priority;
    r->n_prompt = info->n_prompt;
    r->max_new_tokens = info->max_new_tokens;
    r->arrival_us = info->arrival_us;
    r->ttft_us = info->ttft_us;
    r->tpot_us = info->tpot_us;
    r->seq = s->next_seq++;
    r->wait_since_us = info->arrival_us; /* time in the engine's inbox counts as waiting */
    r->entry = -1;
    loom__sched_index_put(&s->index, r->id, slot);
    loom__sched_waiting_push(s, slot);
    s->stats.n_added++;
    s->last_now_us = now_us;
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Committing a step                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* The entry of the pending plan a result names: >= 0 for a live entry; -1 for an entry cancelled
 * since the plan (its result is ignored); -2 if the id is not in the plan. */
static int32_t result_entry(const loom__sched *s, uint64_t id) {
    int32_t slot = loom__sched_index_find(&s->index, id);
    if (slot >= 0 && s->reqs[slot].entry >= 0) return s->reqs[slot].entry;
    for (int32_t k = 0; k < s->n_pending; k++)
        if (s->entry_slot[k] < 0 && s->entries[k].id == id) return -1;
    return -2;
}

static loom_status check_results(loom__sched *s, const loom__sched_result *res, int32_t n) {
    memset(s->entry_seen, 0, (size_t)s->n_pending * sizeof *s->entry_seen);
    for (int32_t i = 0; i < n; i++) {
        unsigned long long id = (unsigned long long)res[i].id;
        int32_t k = result_entry(s, res[i].id);
        LOOM_RETURN_IF(k == -2, LOOM_ERR_INVALID_ARG,
                       "loom__sched_on_step_done: request %llu is not in the last plan", id);
        if (k < 0) continue;
        LOOM_RETURN_IF(s->entry_seen[k], LOOM_ERR_INVALID_ARG,
                       "loom__sched_on_step_done: request %llu reported twice", id);
        s->entry_seen[k] = true;
        LOOM_RETURN_IF(
            res[i].n_new_tokens < 0 || (res[i].n_new_tokens > 0 && !s->entries[k].sample),
            LOOM_ERR_INVALID_ARG,
            "loom__sched_on_step_done: request %llu: %d tokens from an entry that %s", id,
            res[i].n_new_tokens, s->entries[k].sample ? "samples" : "does not sample");
        LOOM_RETURN_IF(s->entries[k].sample && res[i].n_new_tokens == 0 && !res[i].finished,
                       LOOM_ERR_INVALID_ARG,
                       "loom__sched_on_step_done: request %llu sampled no token and did not finish",
                       id);
    }
    for (int32_t k = 0; k < s->n_pending; k++)
        LOOM_RETURN_IF(s->entry_slot[k] >= 0 && s->entries[k].sample && !s->entry_seen[k],
                       LOOM_ERR_INVALID_ARG,
                       "loom__sched_on_step_done: no result for sampling request %llu",
                       (unsigned long long)s->entries[k].id);
    return LOOM_OK;
}

/* Deadline attainment for n new tokens of r arriving at now (before n_generated is updated). */
static void count_deadlines(loom__sched *s, const sched_req *r, int32_t n, int64_t now_us) {
    int32_t later = n;
    if (r->n_generated == 0 && n > 0) {
        later--;
        if (r->ttft_us > 0) {
            if (now_us - r->arrival_us <= r->ttft_us)
                s->stats.n_ttft_met++;
            else
                s->stats.n_ttft_missed++;
        }
    }
    if (r->tpot_us > 0 && later > 0) {
        /* Token g (g >= 1 after the first) is due at first_token + g * tpot (mean TPOT). */
        int64_t first = r->n_generated == 0 ? now_us : r->first_token_us;
        /* Saturating, as next_due (sched_plan.c): 1e9-s deadlines times many tokens overflow. */
        int64_t g = (int64_t)r->n_generated + n - 1;
        int64_t due =
            g > 0 && r->tpot_us > (INT64_MAX - first) / g ? INT64_MAX : first + g * r->tpot_us;
        if (now_us <= due)
            s->stats.n_tpot_met += later;
        else
            s->stats.n_tpot_missed += later;
    }
}

static void finish(loom__sched *s, int32_t slot) {
    loom__sched_running_remove(s, slot);
    loom__sched_release(s, slot);
    s->stats.n_finished++;
}

loom_status loom__sched_on_step_done(loom__sched *s, const loom__sched_result *results,
                                     int32_t n_results, int64_t now_us) {
    LOOM_CHECK_ARG(s && n_results >= 0 && (results || n_results == 0));
    LOOM_TRY(check_now(s, now_us, __func__));
    if (!s->pending) {
        LOOM_RETURN_IF(n_results > 0, LOOM_ERR_INVALID_ARG,
                       "loom__sched_on_step_done: results but no plan pending");
        s->last_now_us = now_us;
        return LOOM_OK;
    }
    LOOM_TRY(check_results(s, results, n_results));

    /* Every live entry's tokens were computed. */
    for (int32_t k = 0; k < s->n_pending; k++) {
        if (s->entry_slot[k] < 0) continue;
        sched_req *r = &s->reqs[s->entry_slot[k]];
        r->n_computed += s->entries[k].n_tokens;
        r->entry = -1;
        if (s->entries[k].is_prefill)
            s->stats.n_prefill_tokens += s->entries[k].n_tokens;
        else
            s->stats.n_decode_tokens += s->entries[k].n_tokens;
    }
    /* Then sampled tokens and finishes. Entries were checked above, so each result names a
     * running request or one cancelled since the plan. */
    for (int32_t i = 0; i < n_results; i++) {
        int32_t slot = loom__sched_index_find(&s->index, results[i].id);
        if (slot < 0 || s->reqs[slot].state != SCHED_RUNNING) continue;
        sched_req *r = &s->reqs[slot];
        int32_t n = results[i].n_new_tokens;
        if (n > r->max_new_tokens - r->n_generated) n = r->max_new_tokens - r->n_generated;
        count_deadlines(s, r, n, now_us);
        if (r->n_generated == 0 && n > 0) r->first_token_us = now_us;
        r->n_generated += n;
        if (results[i].finished || r->n_generated >= r->max_new_tokens) finish(s, slot);
    }
    s->pending = false;
    s->n_pending = 0;
    s->last_now_us = now_us;
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Cancellation and queries                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* The slot of request id; fn names the caller in the message. Errors: INVALID_ARG. */
static loom_status find_request(const loom__sched *s, uint64_t id, const char *fn, int32_t *slot) {
    *slot = loom__sched_index_find(&s->index, id);
    LOOM_RETURN_IF(*slot < 0, LOOM_ERR_INVALID_ARG, "%s: unknown request %llu", fn,
                   (unsigned long long)id);
    return LOOM_OK;
}

loom_status loom__sched_cancel(loom__sched *s, uint64_t id, loom__sched_holds *holds) {
    LOOM_CHECK_ARG(s);
    int32_t slot;
    LOOM_TRY(find_request(s, id, __func__, &slot));
    sched_req *r = &s->reqs[slot];
    loom__sched_holds h;
    if (r->state == SCHED_RUNNING) {
        h = LOOM_SCHED_HOLDS_KV;
        if (r->entry >= 0) s->entry_slot[r->entry] = -1; /* on_step_done skips it */
        loom__sched_running_remove(s, slot);
    } else {
        h = r->swapped ? LOOM_SCHED_HOLDS_SWAP : LOOM_SCHED_HOLDS_NOTHING;
        loom__sched_waiting_remove(s, slot);
    }
    loom__sched_release(s, slot);
    s->stats.n_cancelled++;
    if (holds) *holds = h;
    return LOOM_OK;
}

loom_status loom__sched_defer(loom__sched *s, uint64_t id) {
    LOOM_CHECK_ARG(s);
    int32_t slot;
    LOOM_TRY(find_request(s, id, __func__, &slot));
    sched_req *r = &s->reqs[slot];
    LOOM_RETURN_IF(!s->pending || r->entry < 0 || r->state != SCHED_RUNNING, LOOM_ERR_INVALID_ARG,
                   "loom__sched_defer: request %llu has no entry in a pending plan",
                   (unsigned long long)id);
    s->entry_slot[r->entry] = -1; /* on_step_done skips it */
    r->entry = -1;
    r->step_blocks = 0;
    r->promise = 0;
    loom__sched_running_remove(s, slot);
    r->n_computed = 0;
    r->swapped = false;
    r->preempted = true;
    r->wait_since_us = s->last_now_us;
    r->n_preempts++;
    loom__sched_waiting_push(s, slot);
    s->stats.n_preemptions++;
    return LOOM_OK;
}

loom_status loom__sched_unswap(loom__sched *s, uint64_t id) {
    LOOM_CHECK_ARG(s);
    int32_t slot;
    LOOM_TRY(find_request(s, id, __func__, &slot));
    sched_req *r = &s->reqs[slot];
    LOOM_RETURN_IF(r->state == SCHED_RUNNING || !r->swapped, LOOM_ERR_INVALID_ARG,
                   "loom__sched_unswap: request %llu is not swapped out", (unsigned long long)id);
    r->swapped = false;
    r->n_computed = 0;
    return LOOM_OK;
}

void loom__sched_set_cost(loom__sched *s, const loom__cost_model *cm) {
    if (s && cm) s->cost = *cm;
}

loom_status loom__sched_get(const loom__sched *s, uint64_t id, loom__sched_request_view *out) {
    LOOM_CHECK_ARG(s && out);
    int32_t slot;
    LOOM_TRY(find_request(s, id, __func__, &slot));
    const sched_req *r = &s->reqs[slot];
    out->state = r->state == SCHED_RUNNING ? LOOM_SCHED_STATE_RUNNING
                 : r->preempted            ? LOOM_SCHED_STATE_PREEMPTED
                                           : LOOM_SCHED_STATE_WAITING;
    out->n_computed = r->n_computed;
    out->n_generated = r->n_generated;
    out->promoted = r->promoted;
    out->effective_priority = r->promoted ? LOOM_SCHED_PROMOTED_PRIORITY : r->priority;
    out->swapped = r->swapped;
    return LOOM_OK;
}

void loom__sched_get_stats(const loom__sched *s, loom__sched_stats *out) {
    if (!out) return;
    if (!s) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = s->stats;
    out->n_running = s->n_running;
    out->n_preempted = 0;
    for (int32_t i = 0; i < s->n_waiting; i++)
        out->n_preempted += s->reqs[s->waiting[i]].preempted ? 1 : 0;
    out->n_waiting = s->n_waiting - out->n_preempted;
}

/* ------------------------------------------------------------------------------------------ */
/* Invariants                                                                                 */
/* ------------------------------------------------------------------------------------------ */

#define SCHED_CHECK(cond, ...) LOOM_RETURN_IF(!(cond), LOOM_ERR_INTERNAL, __VA_ARGS__)

static loom_status check_request(const loom__sched *s, int32_t slot) {
    const sched_req *r = &s->reqs[slot];
    unsigned long long id = (unsigned long long)r->id;
    SCHED_CHECK(loom__sched_index_find(&s->index, r->id) == slot, "sched: %llu not indexed", id);
    int32_t total = loom__sched_total(r);
    SCHED_CHECK(r->n_computed >= 0 && r->n_computed <= total && r->n_generated >= 0 &&
                    r->n_generated < r->max_new_tokens,
                "sched: %llu counters %d/%d/%d", id, r->n_computed, r->n_generated, total);
    if (r->state == SCHED_RUNNING) {
        SCHED_CHECK(r->list_idx >= 0 && r->list_idx < s->n_running &&
                        s->running[r->list_idx] == slot,
                    "sched: running %llu not in the running queue", id);
        SCHED_CHECK(r->n_computed < total && !r->swapped && !r->preempted,
                    "sched: running %llu has nothing to compute or is marked waiting", id);
        SCHED_CHECK(r->entry < 0 ||
                        (s->pending && r->entry < s->n_pending && s->entry_slot[r->entry] == slot),
                    "sched: %llu has a stale plan entry", id);
    } else {
        SCHED_CHECK(r->state == SCHED_WAITING, "sched: %llu in state %d", id, (int)r->state);
        SCHED_CHECK(r->list_idx >= 0 && r->list_idx < s->n_waiting &&
                        s->waiting[r->list_idx] == slot,
                    "sched: waiting %llu not in the waiting queue", id);
        SCHED_CHECK(r->entry < 0, "sched: waiting %llu has a plan entry", id);
        SCHED_CHECK(r->swapped || r->n_computed == 0, "sched: waiting %llu holds %d positions", id,
                    r->n_computed);
        SCHED_CHECK(r->preempted || (r->n_generated == 0 && !r->swapped),
                    "sched: never-admitted %llu has progress", id);
    }
    return LOOM_OK;
}

loom_status loom__sched_validate(const loom__sched *s) {
    LOOM_CHECK_ARG(s);
    SCHED_CHECK(s->n_running <= s->cfg.max_seqs, "sched: %d running > max_seqs %d", s->n_running,
                s->cfg.max_seqs);
    SCHED_CHECK(s->n_free + s->n_waiting + s->n_running == s->cap,
                "sched: %d free + %d waiting + %d running != %d slots", s->n_free, s->n_waiting,
                s->n_running, s->cap);
    int32_t live = 0;
    for (int32_t slot = 0; slot < s->cap; slot++) {
        if (s->reqs[slot].state == SCHED_FREE) continue;
        live++;
        LOOM_TRY(check_request(s, slot));
    }
    SCHED_CHECK(live == s->n_waiting + s->n_running, "sched: %d live records, %d queued", live,
                s->n_waiting + s->n_running);
    for (int32_t k = 0; s->pending && k < s->n_pending; k++) {
        int32_t slot = s->entry_slot[k];
        SCHED_CHECK(slot < 0 || (s->reqs[slot].state == SCHED_RUNNING && s->reqs[slot].entry == k),
                    "sched: plan entry %d points at a request not running", k);
    }
    return LOOM_OK;
}
