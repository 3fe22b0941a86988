/* sched_sim.c — the serving simulator (sched_sim.h): the real scheduler, a model of the KV pool
 * and a step-cost model, stepping through an arrival trace in virtual time. */
#include "sched/sched_sim.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"

/* ------------------------------------------------------------------------------------------ */
/* The KV pool model                                                                          */
/* ------------------------------------------------------------------------------------------ */

typedef struct sim_seq {
    int32_t held;    /* device blocks */
    int32_t swapped; /* host blocks */
    int32_t n_generated;
    bool done;
} sim_seq;

typedef struct sim {
    const loom__sim_config *cfg;
    const loom__sim_request *reqs;
    loom__sim_outcome *out;
    int32_t n;
    sim_seq *seqs; /* [n], by id - 1 */
    int32_t used;  /* device blocks held */
} sim;

static int32_t blocks_for(const sim *x, int64_t positions) {
    return (int32_t)((positions + x->cfg->block_size - 1) / x->cfg->block_size);
}

static int32_t kv_free(void *ctx) {
    sim *x = ctx;
    return x->cfg->n_blocks - x->used;
}

static int32_t kv_needed(void *ctx, uint64_t id, int32_t n_computed, int32_t n_new) {
    sim *x = ctx;
    int32_t need = blocks_for(x, (int64_t)n_computed + n_new) - x->seqs[id - 1].held;
    return need > 0 ? need : 0;
}

static int32_t kv_reclaimable(void *ctx, uint64_t id) {
    sim *x = ctx;
    return x->seqs[id - 1].held;
}

static int32_t kv_cached(void *ctx, uint64_t id) {
    sim *x = ctx;
    return x->reqs[id - 1].n_cached;
}

static void release(sim *x, uint64_t id) {
    sim_seq *q = &x->seqs[id - 1];
    x->used -= q->held;
    q->held = 0;
    q->swapped = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The run                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static loom_status check_inputs(const loom__sim_config *cfg, const loom__sim_request *reqs,
                                int32_t n) {
    LOOM_RETURN_IF(cfg->n_blocks < 1 || cfg->block_size < 1, LOOM_ERR_INVALID_ARG,
                   "sim: %d blocks of %d tokens", cfg->n_blocks, cfg->block_size);
    LOOM_RETURN_IF(!loom__cost_model_ready(&cfg->cost), LOOM_ERR_INVALID_ARG,
                   "sim: the cost model has no fit");
    LOOM_RETURN_IF(n < 0 || n > INT32_MAX / 2, LOOM_ERR_INVALID_ARG, "sim: %d requests", n);
    for (int32_t i = 0; i < n; i++)
        LOOM_RETURN_IF(reqs[i].n_prompt < 1 || reqs[i].n_output < 1 || reqs[i].arrival_us < 0 ||
                           reqs[i].ttft_us < 0 || reqs[i].tpot_us < 0 || reqs[i].n_cached < 0,
                       LOOM_ERR_INVALID_ARG, "sim: request %d is malformed", i);
    return LOOM_OK;
}

static int cmp_arrival(const void *pa, const void *pb, const loom__sim_request *reqs) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    if (reqs[a].arrival_us != reqs[b].arrival_us)
        return reqs[a].arrival_us < reqs[b].arrival_us ? -1 : 1;
    return (a > b) - (a < b);
}

/* Insertion-free arrival order: a stable merge sort on indices (qsort has no context). */
static void sort_by_arrival(int32_t *idx, int32_t *tmp, int32_t n, const loom__sim_request *r) {
    if (n < 2) return;
    int32_t h = n / 2;
    sort_by_arrival(idx, tmp, h, r);
    sort_by_arrival(idx + h, tmp, n - h, r);
    int32_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = cmp_arrival(&idx[j], &idx[i], r) < 0 ? idx[j++] : idx[i++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, (size_t)n * sizeof *idx);
}

typedef struct run_state {
    sim x;
    loom__sched *s;
    loom__sched_forecast fc;
    loom__sched_result *results;
    int32_t *order, *tmp;
    int32_t next;                        /* next arrival in order */
    int32_t live;                        /* admitted, not finished */
    double prompt_tokens, cached_tokens; /* over admitted requests: the forecast's hit rate */
    int64_t now;
    loom__sim_stats st;
} run_state;

static loom_status admit_arrivals(run_state *rs) {
    const loom__sim_config *cfg = rs->x.cfg;
    bool forecast = false;
    while (rs->next < rs->x.n && rs->x.reqs[rs->order[rs->next]].arrival_us <= rs->now) {
        int32_t i = rs->order[rs->next++];
        const loom__sim_request *q = &rs->x.reqs[i];
        loom__sched_request_info info = {
            .id = (uint64_t)i + 1,
            .priority = q->priority,
            .n_prompt = q->n_prompt,
            .max_new_tokens = q->n_output,
            .arrival_us = q->arrival_us,
            .ttft_us = q->ttft_us,
            .tpot_us = q->tpot_us,
        };
        if (q->ttft_us > 0) {
            if (!forecast) {
                LOOM_TRY(loom__sched_forecast_build(rs->s, rs->now, &rs->fc));
                /* As the engine does: the hit rate of the prompts so far. */
                rs->fc.hit_frac = rs->prompt_tokens > 0 ? rs->cached_tokens / rs->prompt_tokens : 0;
                forecast = true;
            }
            rs->x.out[i].predicted_ttft_us =
                loom__sched_forecast_ttft(&rs->fc, &cfg->cost, &info, rs->now);
        }
        bool degraded;
        if (!loom__admission_decide(cfg->admission, rs->x.out[i].predicted_ttft_us, &info,
                                    &degraded)) {
            rs->x.out[i].rejected = true;
            rs->x.seqs[i].done = true;
            continue;
        }
        rs->x.out[i].degraded = degraded;
        LOOM_TRY(loom__sched_add(rs->s, &info, rs->now));
        rs->prompt_tokens += q->n_prompt;
        rs->cached_tokens += q->n_cached;
        if (forecast) LOOM_TRY(loom__sched_forecast_add(&rs->fc, &info));
        rs->live++;
    }
    return LOOM_OK;
}

/* Carries out a plan in the KV model and returns the step's context (positions held by the
 * batch's sequences after it). */
static int64_t carry_out(run_state *rs, const loom__sched_plan *p, int32_t *n_results) {
    sim *x = &rs->x;
    for (int32_t k = 0; k < p->n_preempted; k++) {
        uint64_t id = p->preempted[k];
        sim_seq *q = &x->seqs[id - 1];
        x->out[id - 1].n_preempted++;
        if (p->preempt_mode == LOOM_SCHED_PREEMPT_SWAP) {
            q->swapped = q->held;
            x->used -= q->held;
            q->held = 0;
        } else {
            release(x, id);
        }
    }
    for (int32_t k = 0; k < p->n_rejected; k++) {
        uint64_t id = p->rejected[k];
        release(x, id);
        x->seqs[id - 1].done = true;
        x->out[id - 1].rejected = true;
        rs->live--;
    }
    int64_t ctx = 0;
    *n_results = 0;
    for (int32_t k = 0; k < p->n_entries; k++) {
        const loom__sched_entry *e = &p->entries[k];
        sim_seq *q = &x->seqs[e->id - 1];
        if (e->swap_in) q->swapped = 0;
        int32_t want = blocks_for(x, (int64_t)e->pos_start + e->n_tokens);
        if (want > q->held) {
            x->used += want - q->held;
            q->held = want;
        }
        ctx += e->pos_start + e->n_tokens;
        if (e->sample)
            rs->results[(*n_results)++] = (loom__sched_result){.id = e->id, .n_new_tokens = 1};
    }
    return ctx;
}

static void commit(run_state *rs, int32_t n_results) {
    sim *x = &rs->x;
    for (int32_t k = 0; k < n_results; k++) {
        uint64_t id = rs->results[k].id;
        sim_seq *q = &x->seqs[id - 1];
        loom__sim_outcome *o = &x->out[id - 1];
        if (q->n_generated == 0) o->first_token_us = rs->now;
        q->n_generated++;
        if (q->n_generated >= x->reqs[id - 1].n_output) {
            o->finish_us = rs->now;
            release(x, id);
            q->done = true;
            rs->live--;
        }
    }
}

static loom_status run(run_state *rs) {
    const loom__sim_config *cfg = rs->x.cfg;
    for (;;) {
        LOOM_TRY(admit_arrivals(rs));
        loom__sched_plan plan;
        LOOM_TRY(loom__sched_schedule(rs->s, rs->now, &plan));
        int32_t n_results = 0;
        int64_t ctx = carry_out(rs, &plan, &n_results);
        if (plan.n_entries == 0) {
            if (rs->next < rs->x.n) { /* idle until the next arrival */
                int64_t t = rs->x.reqs[rs->order[rs->next]].arrival_us;
                if (t > rs->now) rs->now = t;
                continue;
            }
            LOOM_RETURN_IF(rs->live > 0, LOOM_ERR_INTERNAL,
                           "sim: %d requests left and an empty plan at %lld us", rs->live,
                           (long long)rs->now);
            return LOOM_OK;
        }
        double us = loom__cost_model_predict(&cfg->cost, plan.n_tokens, (double)ctx);
        int64_t dt = us < 1 ? 1 : (int64_t)(us + 0.5);
        rs->now += dt;
        rs->st.busy_us += dt;
        rs->st.steps++;
        LOOM_TRY(loom__sched_on_step_done(rs->s, rs->results, n_results, rs->now));
        commit(rs, n_results);
        rs->st.end_us = rs->now;
    }
}

loom_status loom__sim_run(const loom__sim_config *cfg, const loom__sim_request *reqs, int32_t n,
                          loom__sim_outcome *out, loom__sim_stats *stats) {
    LOOM_CHECK_ARG(cfg && (reqs || n == 0) && (out || n == 0));
    LOOM_TRY(check_inputs(cfg, reqs, n));
    run_state rs;
    memset(&rs, 0, sizeof rs);
    rs.x = (sim){.cfg = cfg, .reqs = reqs, .out = out, .n = n};
    for (int32_t i = 0; i < n; i++)
        out[i] =
            (loom__sim_outcome){.first_token_us = -1, .finish_us = -1, .predicted_ttft_us = -1};
    size_t nn = (size_t)(n > 0 ? n : 1);
    rs.x.seqs = loom__calloc(nn, sizeof *rs.x.seqs);
    rs.order = loom__malloc(nn * sizeof *rs.order);
    rs.tmp = loom__malloc(nn * sizeof *rs.tmp);
    rs.results = loom__malloc((size_t)cfg->sched.max_seqs * sizeof *rs.results);
    loom__sched_kv_iface kv = {
        .ctx = &rs.x,
        .blocks_free = kv_free,
        .blocks_needed = kv_needed,
        .blocks_reclaimable = kv_reclaimable,
        .cached_tokens = kv_cached,
    };
    loom_status st = LOOM_ERR_OUT_OF_MEMORY;
    if (rs.x.seqs && rs.order && rs.tmp && rs.results) {
        for (int32_t i = 0; i < n; i++) rs.order[i] = i;
        sort_by_arrival(rs.order, rs.tmp, n, reqs);
        st = loom__sched_create(&cfg->sched, &kv, &rs.s);
        if (st == LOOM_OK) loom__sched_set_cost(rs.s, &cfg->cost); /* as the engine does */
        if (st == LOOM_OK) st = run(&rs);
    } else {
        loom__fail(st, "sim: tables for %d requests", n);
    }
    if (rs.s && stats) {
        loom__sched_stats ss;
        loom__sched_get_stats(rs.s, &ss);
        rs.st.preemptions = ss.n_preemptions;
        rs.st.promotions = ss.n_promotions;
        *stats = rs.st;
    }
    loom__sched_destroy(rs.s);
    loom__sched_forecast_free(&rs.fc);
    free(rs.x.seqs);
    free(rs.order);
    free(rs.tmp);
    free(rs.results);
    return st;
}
