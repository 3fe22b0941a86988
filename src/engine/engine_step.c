/* engine_step.c — one engine step (ARCHITECTURE.md "One engine step"):
 *   0. free last step's finished requests; take submissions and cancellations from the inbox;
 *   1. schedule (sched/): preemptions, rejections, entries under the token budget;
 *   2. reserve KV (kv/): admissions first (they claim cached prefixes before anything can be
 *      evicted), then swap-ins, then each entry's reservation and its copy-on-write copies;
 *   3. one forward pass over every scheduled token of every sequence (model/);
 *   4. sample each sequence whose chunk reached its last known token (sample/), with an RNG
 *      keyed by (seed, sample, position) so batch composition never changes a token;
 *   5. commit: stop conditions, streamed text, events, the scheduler's bookkeeping.
 * With a trace attached, the step is timed in these phases ("schedule" = 0-2, the forward
 * pass's layer groups and "logits" = 3, "sample" = 4, "events" = 5) and each produced token is
 * recorded; without one, each phase costs one pointer test.
 * Nothing here allocates except when the inbox brings more submissions and cancellations
 * than the event array has room for (drain_inbox grows it first) and the trace, which grows
 * its own storage. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/engine.h"
#include "sample/sample.h"

/* ---- events ------------------------------------------------------------------------------- */

/* Grows the event array to cap. The pointers loom_engine_step hands out grow first: once the
 * step has run, handing its events out must not need memory (a failure there lost every event
 * of the step, tokens included). */
static bool grow_events(loom_engine *e, size_t cap) {
    const loom_event **ptrs = loom__realloc(e->event_ptrs, cap * sizeof *ptrs);
    if (!ptrs) return false;
    e->event_ptrs = ptrs;
    loom_event *grown = loom__realloc(e->events, cap * sizeof *grown);
    if (!grown) return false;
    e->events = grown;
    e->cap_events = cap;
    return true;
}

/* Makes room for k more events now and the batch's LOOM_ENGINE_BATCH_EVENTS after them, so
 * the batch itself never needs memory for its events. False when memory is short. */
static bool reserve_events(loom_engine *e, size_t k) {
    const size_t need = e->n_events + k + LOOM_ENGINE_BATCH_EVENTS(e->params.max_seqs);
    if (need <= e->cap_events) return true;
    return grow_events(e, e->cap_events * 2 > need ? e->cap_events * 2 : need);
}

static loom_event *new_event(loom_engine *e, const loom__req *r, int32_t sample,
                             loom_event_kind kind) {
    /* Not expected: drain_inbox reserves room for every event a step can make. */
    if (e->n_events == e->cap_events && !grow_events(e, e->cap_events * 2)) {
        LOOM_LOG_E("engine: out of memory for events; an event of request %llu is lost",
                   (unsigned long long)r->id);
        return NULL;
    }
    loom_event *ev = &e->events[e->n_events++];
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ev->id = r->id;
    ev->user_data = r->user_data;
    ev->sample = sample;
    ev->token = -1;
    ev->text = "";
    return ev;
}

void loom__engine_free_retired(loom_engine *e) {
    while (e->retired) {
        loom__req *r = e->retired;
        e->retired = r->next_retired;
        loom__req_free(r);
    }
}

/* Moves a request whose samples are all done out of the tables; it is freed next step. */
static void retire_if_done(loom_engine *e, loom__req *r) {
    /* Once only: a request ended inside the loop over a step's rows (starting its other samples
     * failed) is met again by the loop's own retirement, and a second retirement listed it
     * twice, so it was freed twice (found replaying a record with a clock that went back). */
    if (r->state == LOOM_REQ_DONE) return;
    for (int32_t i = 0; i < r->n_samples; i++) {
        if (!r->samples[i].finished) return;
    }
    r->state = LOOM_REQ_DONE;
    loom__id_map_del(&e->reqs, r->id);
    /* Its latency figures (definitions in loom.h, loom_engine_stats). */
    int64_t first_ns = INT64_MAX, decode_ns = 0, decode_tokens = 0;
    for (int32_t i = 0; i < r->n_samples; i++) {
        const loom__req_sample *s = &r->samples[i];
        if (s->n_generated > 0 && s->t_first_token_ns < first_ns) first_ns = s->t_first_token_ns;
        if (s->n_generated >= 2) {
            decode_ns += s->t_last_token_ns - s->t_first_token_ns;
            decode_tokens += s->n_generated - 1;
        }
    }
    int64_t tokens = 0;
    for (int32_t i = 0; i < r->n_samples; i++) tokens += r->samples[i].n_generated;
    double ttft = -1, tpot = -1;
    pthread_mutex_lock(&e->mu);
    loom__id_map_del(&e->live, r->id);
    e->stats.requests_finished++;
    if (first_ns != INT64_MAX) {
        ttft = (double)(first_ns - r->arrival_ns) * 1e-9;
        e->ttft_sum_s += ttft;
        e->ttft_ring[e->stats.ttft_count++ % LOOM_ENGINE_LATENCY_WINDOW] = ttft;
    }
    if (decode_tokens > 0) {
        tpot = (double)decode_ns * 1e-9 / (double)decode_tokens;
        e->tpot_sum_s += tpot;
        e->tpot_ring[e->stats.tpot_count++ % LOOM_ENGINE_LATENCY_WINDOW] = tpot;
    }
    loom__engine_class_ended_locked(e, r, ttft, tpot, tokens);
    pthread_mutex_unlock(&e->mu);
    /* Kept until the next step: this step's events point into it (a TOKEN event's info and
     * text). A list through the requests themselves, so retiring cannot fail for memory (a
     * growable array used to free the request at once when it could not grow, leaving those
     * events dangling). */
    r->next_retired = e->retired;
    e->retired = r;
}

static void finish_sample(loom_engine *e, loom__req *r, int32_t i, loom_finish_reason reason) {
    loom__req_sample *s = &r->samples[i];
    if (s->finished) return;
    s->finished = true;
    s->reason = reason;
    loom__engine_release(e, s);
    loom_event *ev = new_event(e, r, i, LOOM_EVENT_FINISHED);
    if (ev) {
        ev->reason = reason;
        ev->cached_tokens = s->cached_tokens;
    }
}

/* Takes every unfinished sample of r out of the scheduler and the KV cache; kind FAILED (with
 * status) or FINISHED/CANCELLED. */
static void end_request(loom_engine *e, loom__req *r, loom_status status) {
    for (int32_t i = 0; i < r->n_samples; i++) {
        loom__req_sample *s = &r->samples[i];
        if (s->finished) continue;
        if (s->in_sched) {
            (void)loom__sched_cancel(e->sched, loom__sched_id(r, i), NULL);
            s->in_sched = false;
        }
        if (status == LOOM_OK) {
            finish_sample(e, r, i, LOOM_FINISH_CANCELLED);
        } else {
            s->finished = true;
            loom__engine_release(e, s);
        }
    }
    if (status != LOOM_OK) {
        loom_event *ev = new_event(e, r, 0, LOOM_EVENT_FAILED);
        if (ev) ev->status = status;
    }
    retire_if_done(e, r);
}

static loom_status add_to_sched(loom_engine *e, loom__req *r, int32_t i) {
    loom__sched_request_info info = loom__engine_sched_info(e, r, loom__sched_id(r, i));
    int64_t now_us = loom__engine_now_us(e);
    /* An arrival_s a little in the future (submit allows a small tolerance) counts as now. */
    if (info.arrival_us > now_us) info.arrival_us = now_us;
    LOOM_TRY(loom__sched_add(e->sched, &info, now_us));
    r->samples[i].in_sched = true;
    return LOOM_OK;
}

/* ---- 0. the inbox ------------------------------------------------------------------------- */

static void drain_inbox(loom_engine *e) {
    loom__engine_inbox *d = &e->drained;
    /* What an earlier step could not take (below) goes first; then the inbox. Swap the arrays
     * under the lock: submitters keep appending to an empty inbox while this thread works
     * through what was there, so no entry is overwritten or seen twice. */
    if (d->n_reqs == 0 && d->n_cancels == 0) {
        pthread_mutex_lock(&e->mu);
        loom__engine_inbox in = e->inbox;
        e->inbox = e->drained;
        e->inbox.n_reqs = e->inbox.n_cancels = 0;
        e->drained = in;
        pthread_mutex_unlock(&e->mu);
    }
    /* Each submission may end at once (one FAILED event), each cancellation with an event per
     * sample: room for them comes first. Without it the rest waits for a later step (in order:
     * a cancel may name a request still in the list) rather than their events being lost.
     * With params.record_path each one taken goes to the record as it is taken. */
    for (; d->next_req < d->n_reqs; d->next_req++) {
        if (!reserve_events(e, 1)) goto short_of_memory;
        loom__req *r = d->reqs[d->next_req];
        if (e->rec && r->record) { /* flushed before it is acted on: a crash keeps it */
            loom__recorder_write(e->rec, r->record, r->n_record);
            loom__recorder_flush(e->rec);
            free(r->record);
            r->record = NULL;
        }
        loom_status st = loom__id_map_put(&e->reqs, r->id, r);
        /* A request the table cannot take (its rebuild needs memory) fails with an event, as
         * any other: it used to be freed without one, and its caller waited forever. */
        if (st == LOOM_OK) {
            r->state = LOOM_REQ_ACTIVE;
            st = add_to_sched(e, r, 0);
        }
        if (st != LOOM_OK) end_request(e, r, st);
    }
    for (; d->next_cancel < d->n_cancels; d->next_cancel++) {
        loom__req *r = loom__id_map_get(&e->reqs, d->cancels[d->next_cancel]);
        bool active = r && r->state == LOOM_REQ_ACTIVE;
        if (active && !reserve_events(e, (size_t)r->n_samples)) goto short_of_memory;
        if (e->rec) { /* a replay sees it as this step did, a no-op included */
            loom__recorder_cancel(e->rec, d->cancels[d->next_cancel]);
            loom__recorder_flush(e->rec);
        }
        if (active) end_request(e, r, LOOM_OK);
    }
    d->n_reqs = d->n_cancels = d->next_req = d->next_cancel = 0;
    return;
short_of_memory:
    LOOM_LOG_W("engine: out of memory for events: %zu submissions and %zu cancellations wait "
               "for the next step",
               d->n_reqs - d->next_req, d->n_cancels - d->next_cancel);
}

/* ---- 1-2. plan and reserve ---------------------------------------------------------------- */

static loom__req_sample *lookup(loom_engine *e, uint64_t sid, loom__req **req, int32_t *idx) {
    loom__req *r = loom__id_map_get(&e->reqs, sid / LOOM_ENGINE_MAX_N);
    int32_t i = (int32_t)(sid % LOOM_ENGINE_MAX_N);
    if (!r || r->state != LOOM_REQ_ACTIVE || i >= r->n_samples || r->samples[i].finished)
        return NULL;
    *req = r;
    *idx = i;
    return &r->samples[i];
}

static void carry_out_preemptions(loom_engine *e, const loom__sched_plan *plan) {
    for (int32_t k = 0; k < plan->n_preempted; k++) {
        loom__req *r;
        int32_t i;
        loom__req_sample *s = lookup(e, plan->preempted[k], &r, &i);
        if (!s) continue;
        if (plan->preempt_mode == LOOM_SCHED_PREEMPT_SWAP && s->kv_seq >= 0) {
            loom_status st = loom__engine_swap_out(e, s);
            /* The host swap area full (nothing moved yet): preempt by recompute instead of
             * failing the request (the long soak test failed one in 650,000 so). */
            if (st != LOOM_OK && !s->swapped &&
                loom__sched_unswap(e->sched, plan->preempted[k]) == LOOM_OK) {
                loom__engine_release(e, s);
            } else if (st != LOOM_OK) {
                end_request(e, r, st);
            }
        } else {
            loom__engine_release(e, s);
        }
        pthread_mutex_lock(&e->mu);
        e->stats.preemptions++;
        loom__engine_class *c = loom__engine_class_locked(e, r->class_priority);
        if (c) c->st.preemptions++;
        pthread_mutex_unlock(&e->mu);
    }
    for (int32_t k = 0; k < plan->n_rejected; k++) {
        loom__req *r;
        int32_t i;
        if (!lookup(e, plan->rejected[k], &r, &i)) continue;
        r->samples[i].in_sched = false; /* the scheduler has forgotten it */
        (void)loom__fail(LOOM_ERR_CONTEXT_FULL, "engine: request %llu cannot fit the KV cache",
                         (unsigned long long)r->id);
        end_request(e, r, LOOM_ERR_CONTEXT_FULL);
    }
}

/* Admits the entry's sample into the KV manager with its known tokens. */
static loom_status admit(loom_engine *e, loom__req *r, loom__req_sample *s,
                         const loom__sched_entry *en) {
    int32_t n_known = r->n_prompt + s->n_generated;
    const loom_token *toks = loom__engine_known(e, r, s, n_known);
    int32_t cached = 0;
    LOOM_TRY(loom__kv_seq_admit(e->kv, r->cache_salt, toks, n_known, &s->kv_seq, &cached));
    s->cached_tokens = cached;
    LOOM_RETURN_IF(cached != en->pos_start, LOOM_ERR_INTERNAL,
                   "engine: request %llu: %d tokens cached at admission, %d planned",
                   (unsigned long long)r->id, cached, en->pos_start);
    return LOOM_OK;
}

/* Fills the batch from the plan; entries whose sample is gone or failed are left out. */
/* The plan promised blocks the KV manager does not have (st CONTEXT_FULL from a reservation
 * or a swap-in): the sample sits this step out and starts over, as if preempted by
 * recompute, instead of failing. The plan's arithmetic is meant to make this unreachable (the
 * soak test found it reached twice: see loom__kv_seq_exclusive_blocks); when it is not, a
 * request waits, nothing is lost. Returns whether the sample was deferred. */
static bool defer_short(loom_engine *e, loom__req_sample *s, const loom__sched_entry *en,
                        loom_status st) {
    if (st != LOOM_ERR_CONTEXT_FULL || loom__sched_defer(e->sched, en->id) != LOOM_OK) return false;
    LOOM_LOG_I("engine: request %llu deferred: %s",
               (unsigned long long)(en->id / LOOM_ENGINE_MAX_N), loom_last_error());
    loom__engine_release(e, s);
    s->swapped = false;
    e->stats.preemptions++;
    return true;
}

/* Takes the rows of r out of the batch built so far (r ended while the batch was built: its
 * sequences are gone, and a row naming one would fail the whole step). */
static void drop_rows_of(loom_engine *e, const loom__req *r, int32_t *n, int32_t *n_tok,
                         int32_t *n_logits) {
    int32_t w = 0, tok_w = 0, tok_r = 0;
    *n_logits = 0;
    for (int32_t k = 0; k < *n; k++) {
        const int32_t len = e->n_new[k];
        if (e->batch_reqs[k] != r) {
            if (tok_w != tok_r) {
                memmove(e->tokens + tok_w, e->tokens + tok_r, (size_t)len * sizeof *e->tokens);
                memmove(e->pos + tok_w, e->pos + tok_r, (size_t)len * sizeof *e->pos);
            }
            e->seqs[w] = e->seqs[k];
            e->n_new[w] = len;
            e->batch_reqs[w] = e->batch_reqs[k];
            e->batch_samples[w] = e->batch_samples[k];
            e->batch_index[w] = e->batch_index[k];
            e->batch_entries[w] = e->batch_entries[k];
            tok_w += len;
            if (e->batch_entries[w]->sample) e->logit_rows[(*n_logits)++] = tok_w - 1;
            w++;
        }
        tok_r += len;
    }
    *n = w;
    *n_tok = tok_w;
}

static int32_t build_batch(loom_engine *e, const loom__sched_plan *plan, int32_t *n_tok,
                           int32_t *n_logits) {
    int32_t n = 0;
    *n_tok = *n_logits = 0;
    /* Admissions, then swap-ins, before any reservation can evict a planned prefix. */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t k = 0; k < plan->n_entries; k++) {
            const loom__sched_entry *en = &plan->entries[k];
            loom__req *r;
            int32_t i;
            loom__req_sample *s = lookup(e, en->id, &r, &i);
            if (!s) continue;
            loom_status st = LOOM_OK;
            if (pass == 0 && en->admitted && s->kv_seq < 0) st = admit(e, r, s, en);
            if (pass == 1 && en->swap_in && s->swapped) st = loom__engine_swap_in(e, s);
            if (st != LOOM_OK && !(pass == 1 && defer_short(e, s, en, st))) end_request(e, r, st);
        }
    }
    for (int32_t k = 0; k < plan->n_entries; k++) {
        const loom__sched_entry *en = &plan->entries[k];
        loom__req *r;
        int32_t i;
        loom__req_sample *s = lookup(e, en->id, &r, &i);
        if (!s || s->kv_seq < 0) continue;
        for (int32_t j = 0; j < en->n_tokens; j++) {
            e->tokens[*n_tok + j] = loom__sample_token(r, s, en->pos_start + j);
            e->pos[*n_tok + j] = en->pos_start + j;
        }
        int32_t n_copies = 0;
        loom_status st = loom__kv_reserve(e->kv, s->kv_seq, en->n_tokens, e->tokens + *n_tok,
                                          e->copies, LOOM_MAX_KV_GROUPS, &n_copies);
        if (st == LOOM_OK && n_copies > 0) st = loom__engine_kv_copy(e, e->copies, n_copies);
        if (st != LOOM_OK) {
            if (n_copies > 0) (void)loom__kv_rollback(e->kv, s->kv_seq);
            if (defer_short(e, s, en, st)) continue;
            end_request(e, r, st);
            drop_rows_of(e, r, &n, n_tok, n_logits); /* its other samples' rows, if any */
            continue;
        }
        e->seqs[n] = s->kv_seq;
        e->n_new[n] = en->n_tokens;
        e->batch_reqs[n] = r;
        e->batch_samples[n] = s;
        e->batch_index[n] = i;
        e->batch_entries[n] = en;
        *n_tok += en->n_tokens;
        if (en->sample) e->logit_rows[(*n_logits)++] = *n_tok - 1;
        n++;
    }
    return n;
}

/* ---- 4-5. sample and commit --------------------------------------------------------------- */

/* Appends the token record of sample i's newest token (tracing on). */
static void trace_token(loom_engine *e, const loom__req *r, int32_t i, const char *piece,
                        size_t piece_len, int64_t now_ns) {
    const loom__req_sample *s = &r->samples[i];
    const loom_token_info *in = &s->info;
    loom__trace_token k = {
        .request = r->id,
        .sample = i,
        .step = e->stats.steps, /* counted when the step ends; only this thread writes it */
        .pos = r->n_prompt + s->n_generated - 1,
        .token = s->tokens[s->n_generated - 1],
        .piece = piece,
        .piece_len = piece_len,
        .logprob_raw = in->logprob_raw,
        .logprob_final = in->logprob_final,
        .entropy = in->entropy,
        .entropy_final = in->entropy_final,
        .varentropy = in->varentropy,
        .temperature = in->temperature,
        .t_ns = now_ns,
        .since_arrival_ns = now_ns - r->arrival_ns,
    };
    (void)loom__trace_add_token(e->trace, &k); /* a dropped record is counted by the trace */
}

/* Streams tok into sample i's text and events; finishes the sample when it ends. */
static bool accept_token(loom_engine *e, loom__req *r, int32_t i, loom_token tok) {
    loom__req_sample *s = &r->samples[i];
    int64_t now_ns = loom__now_ns();
    if (s->n_generated == 0) s->t_first_token_ns = now_ns;
    s->t_last_token_ns = now_ns;
    s->tokens[s->n_generated++] = tok;
    loom_finish_reason reason = LOOM_FINISH_LENGTH;
    bool done = loom__req_is_stop_token(r, e->model, tok, &reason);
    if (!done && s->n_generated >= r->max_tokens) {
        done = true;
        reason = LOOM_FINISH_LENGTH;
    }
    if (!done && r->n_prompt + s->n_generated >= e->max_ctx) {
        done = true;
        reason = LOOM_FINISH_CONTEXT;
    }
    char piece[1024];
    size_t n = 0;
    bool stop_tok = done && (reason == LOOM_FINISH_EOS || reason == LOOM_FINISH_STOP_TOKEN);
    /* A stop token adds no text, but the trace still shows its piece. */
    if ((!stop_tok || e->trace) &&
        loom__tokenizer_piece(e->model->tok, tok, 0, piece, sizeof piece, &n) != LOOM_OK)
        n = 0;
    if (e->trace) trace_token(e, r, i, piece, n, now_ns);
    if (stop_tok) n = 0;
    const char *out = "";
    size_t out_len = 0;
    bool stopped = false;
    bool ok =
        done ? loom__text_stream_push_final(&s->text, &r->stops, piece, n, &out, &out_len, &stopped)
             : loom__text_stream_push(&s->text, &r->stops, piece, n, &out, &out_len, &stopped);
    if (!ok) out_len = 0;
    if (stopped) {
        done = true;
        reason = LOOM_FINISH_STOP_STRING;
    }
    loom_event *ev = new_event(e, r, i, LOOM_EVENT_TOKEN);
    if (ev) {
        ev->token = tok;
        ev->text = out;
        ev->text_len = out_len;
        ev->info = &s->info;
    }
    if (done) finish_sample(e, r, i, reason);
    return done;
}

/* The length of the sample's penalty window: the tail of its known tokens (prompt, then
 * generated) that the window covers, 0 where no penalty is on. */
static int32_t penalty_window_len(const loom__req *r, const loom__req_sample *s) {
    const loom__sample_chain_config *c = &r->chain;
    const int32_t n_known = r->n_prompt + s->n_generated;
    const bool penalize =
        c->penalty_last_n != 0 &&
        (c->repeat_penalty != 1 || c->presence_penalty != 0 || c->frequency_penalty != 0);
    if (!penalize) return 0;
    return c->penalty_last_n < 0 || c->penalty_last_n > n_known ? n_known : c->penalty_last_n;
}

/* The sample's penalty window into hist; returns its length. */
static int32_t penalty_window(const loom__req *r, const loom__req_sample *s, loom_token *hist) {
    const int32_t n_known = r->n_prompt + s->n_generated, n_hist = penalty_window_len(r, s);
    for (int32_t h = 0; h < n_hist; h++) hist[h] = loom__sample_token(r, s, n_known - n_hist + h);
    return n_hist;
}

/* Which logit rows are sampled from summaries (engine.h, sample_from): those of requests whose
 * settings a summary covers (sample/chain.h), with their bias and penalties as edits (a window
 * too long for them copies the row). Row j is the j-th entry that samples. Returns whether the
 * backend is to summarize any. */
static bool mark_summary_rows(loom_engine *e, int32_t n) {
    bool any = false;
    for (int32_t b = 0, j = 0; b < n; b++) {
        if (!e->batch_entries[b]->sample) continue;
        const loom__req *r = e->batch_reqs[b];
        bool ok = e->sample_from != LOOM__FROM_ROWS &&
                  loom__sample_chain_summary_ok(&r->chain, LOOM_ENGINE_SUMMARY_TOP);
        /* a window longer than a row's edits copies the row (checked before it is read) */
        if (ok && penalty_window_len(r, e->batch_samples[b]) >
                      LOOM_LOGIT_SUMMARY_MAX_EDITS - r->chain.n_bias)
            ok = false;
        if (ok) {
            const int32_t n_hist = penalty_window(r, e->batch_samples[b], e->known);
            ok = loom__sample_chain_edits(
                &r->chain, e->known, n_hist, e->pen_id + (size_t)j * LOOM_LOGIT_SUMMARY_MAX_EDITS,
                e->pen_count + (size_t)j * LOOM_LOGIT_SUMMARY_MAX_EDITS, &e->edits[j]);
        }
        e->summary_only[j] = ok;
        if (!ok) e->edits[j] = (loom_logit_edits){0};
        j++;
        any |= ok;
    }
    return any && e->sample_from == LOOM__FROM_DEVICE;
}

/* Runs the request's sampler chain on one row of logits, or on its summary. The penalties'
 * history is the sample's penalty window; the draw index is the position of the token being
 * drawn. */
static loom_status sample_row(loom_engine *e, int32_t k, const loom__req *r, loom__req_sample *s,
                              int32_t i, int32_t j) {
    const int32_t V = e->model->cfg.n_vocab;
    float *logits = e->logits + (size_t)j * (size_t)V;
    loom__sample_chain_config cfg = r->chain;
    /* Each sample draws from its own stream; sample 0 matches an n = 1 request. */
    cfg.seed = r->chain.seed + (uint64_t)i * 0x9E3779B97F4A7C15ull;
    const int32_t n_known = r->n_prompt + s->n_generated;
    loom__sample_chain_result res;
    memset(&res, 0, sizeof res);
    res.top_raw = s->top;
    res.top_final = s->top ? s->top + cfg.n_logprobs : NULL;
    if (!e->summary_only[j]) {
        loom_token *hist = e->sample_hist[k]; /* sampler k's own: rows are sampled in parallel */
        const int32_t n_hist = penalty_window(r, s, hist);
        LOOM_TRY(loom__sample_chain_run(e->sample_ws[k], &cfg, logits, hist, n_hist,
                                        (uint64_t)n_known, &res));
    } else { /* from the row's summary: the backend's, or made here from the row */
        const size_t at = (size_t)j * LOOM_ENGINE_SUMMARY_TOP;
        const loom__row_summary rs = {.sum = &e->summaries[j],
                                      .top = e->summary_top + at,
                                      .edits = &e->edits[j],
                                      .raw_sum = &e->raw_sums[j],
                                      .raw_top = e->raw_top + at,
                                      .edit_raw =
                                          e->edit_raw + (size_t)j * LOOM_LOGIT_SUMMARY_MAX_EDITS};
        if (e->sample_from == LOOM__FROM_HOST)
            loom__sample_logits_summarize_edited(
                logits, V, LOOM_ENGINE_SUMMARY_TOP, rs.edits, e->summary_scratch + (size_t)k * V,
                &e->summaries[j], e->summary_top + at, &e->raw_sums[j], e->raw_top + at,
                e->edit_raw + (size_t)j * LOOM_LOGIT_SUMMARY_MAX_EDITS);
        /* the row's own slot of e->logits is the scratch a rebuilt row needs */
        LOOM_TRY(loom__sample_chain_run_summary(e->sample_ws[k], &cfg, &rs, (uint64_t)n_known,
                                                logits, &res));
    }
    loom__sampler_info(&res, &s->info);
    return LOOM_OK;
}

/* Step 4: commits every entry's KV and runs the sampler chain of every row that samples,
 * keeping each status for commit_rows. Each draw depends only on its own row, seed and
 * position, so sampling every row before accepting any token changes nothing; doing it in one
 * pass lets the trace time sampling apart from the events. */
typedef struct sample_task {
    loom_engine *e;
    int32_t n;            /* rows to sample */
    const int32_t *entry; /* [n] their batch entries; row j's logits are row j of e->logits */
} sample_task;

/* Sampler k (of e->n_samplers) takes rows k, k + n_samplers, ...; threads past the samplers
 * have nothing to do. A row's draw depends on its own logits, seed and position only, so which
 * thread samples it changes nothing. */
static void sample_worker(void *p, int ith, int nth) {
    (void)nth;
    const sample_task *t = p;
    loom_engine *e = t->e;
    for (int32_t j = ith; ith < e->n_samplers && j < t->n; j += e->n_samplers) {
        const int32_t b = t->entry[j];
        e->row_status[b] =
            sample_row(e, ith, e->batch_reqs[b], e->batch_samples[b], e->batch_index[b], j);
    }
}

static loom_status sample_rows(loom_engine *e, int32_t n) {
    int32_t *entry = e->sample_entry, n_rows = 0;
    for (int32_t b = 0; b < n; b++) {
        LOOM_TRY(loom__kv_commit(e->kv, e->batch_samples[b]->kv_seq));
        if (e->batch_entries[b]->sample) entry[n_rows++] = b;
    }
    sample_task t = {.e = e, .n = n_rows, .entry = entry};
    if (e->sample_tp != NULL && n_rows > 1)
        loom__threadpool_run(e->sample_tp, sample_worker, &t);
    else
        for (int32_t k = 0; k < e->n_samplers; k++) sample_worker(&t, k, e->n_samplers);
    return LOOM_OK;
}

/* Step 5: accepts each sampled token (stop conditions, text, events), starts the other samples
 * of an n > 1 request after its first token, and fills the scheduler's results. */
static void commit_rows(loom_engine *e, int32_t n) {
    int64_t n_tokens = 0;
    e->n_results = 0;
    for (int32_t b = 0; b < n; b++) {
        loom__req *r = e->batch_reqs[b];
        loom__req_sample *s = e->batch_samples[b];
        int32_t i = e->batch_index[b];
        const loom__sched_entry *en = e->batch_entries[b];
        if (!en->sample) continue;
        /* An earlier row's failure may have ended this request (and cancelled this entry in
         * the scheduler, which then expects no result for it). */
        if (s->finished || r->state != LOOM_REQ_ACTIVE) continue;
        loom__sched_result *res = &e->results[e->n_results++];
        res->id = en->id;
        res->n_new_tokens = 1;
        res->finished = false;
        if (e->row_status[b] != LOOM_OK) {
            res->finished = true;
            s->in_sched = false;
            end_request(e, r, e->row_status[b]);
            continue;
        }
        loom_status room = loom__req_reserve_token(s);
        if (room != LOOM_OK) {
            res->finished = true;
            s->in_sched = false;
            end_request(e, r, room);
            continue;
        }
        n_tokens++;
        if (accept_token(e, r, i, s->info.token)) {
            res->finished = true;
            s->in_sched = false;
        }
        /* The other samples of the prompt start once the first has computed it: they find
         * its blocks in the prefix cache. */
        if (i == 0 && s->n_generated == 1 && r->n_samples > 1 && r->state == LOOM_REQ_ACTIVE) {
            for (int32_t k = 1; k < r->n_samples; k++) {
                loom_status st2 = add_to_sched(e, r, k);
                if (st2 != LOOM_OK) {
                    end_request(e, r, st2);
                    break;
                }
            }
        }
        if (!s->in_sched) retire_if_done(e, r);
    }
    pthread_mutex_lock(&e->mu);
    e->stats.tokens_generated += n_tokens;
    pthread_mutex_unlock(&e->mu);
}

static void fail_batch(loom_engine *e, int32_t n, loom_status st) {
    e->n_results = 0;
    for (int32_t b = 0; b < n; b++) {
        loom__req_sample *s = e->batch_samples[b];
        if (s->kv_seq >= 0) (void)loom__kv_rollback(e->kv, s->kv_seq);
        loom__sched_result *res = &e->results[e->n_results++];
        res->id = e->batch_entries[b]->id;
        res->n_new_tokens = 0;
        res->finished = true;
        s->in_sched = false;
    }
    for (int32_t b = 0; b < n; b++) {
        loom__req *r = e->batch_reqs[b];
        if (r->state == LOOM_REQ_ACTIVE) end_request(e, r, st);
    }
}

static void update_stats(loom_engine *e) {
    loom__sched_stats ss;
    loom__kv_stats ks;
    loom__sched_get_stats(e->sched, &ss);
    if (loom__kv_get_stats(e->kv, &ks) != LOOM_OK) return;
    loom_kv_group_info gi[LOOM_MAX_KV_GROUPS];
    for (int32_t g = 0; g < e->n_groups; g++) {
        loom__kv_group_stats k;
        gi[g] = e->kv_groups[g]; /* the fixed fields (only this thread writes the rest) */
        if (loom__kv_get_group_stats(e->kv, g, &k) != LOOM_OK ||
            loom__kv_unused_slots(e->kv, g, &gi[g].slots_unused) != LOOM_OK)
            return;
        gi[g].blocks_total = k.n_blocks;
        gi[g].blocks_used = k.n_used;
        gi[g].blocks_cached = k.n_cached;
        gi[g].blocks_free = k.n_free;
        gi[g].window_releases = k.window_releases;
        gi[g].evictions = k.evictions;
        gi[g].cow_copies = k.cow_copies;
    }
    pthread_mutex_lock(&e->mu);
    memcpy(e->kv_groups, gi, (size_t)e->n_groups * sizeof *gi);
    e->stats.running = ss.n_running;
    e->stats.waiting = ss.n_waiting + ss.n_preempted;
    e->stats.kv_blocks_total = gi[0].blocks_total; /* group 0's pool (loom.h) */
    e->stats.kv_blocks_used = gi[0].blocks_used;
    e->stats.kv_blocks_cached = gi[0].blocks_cached;
    e->stats.kv_blocks_free = gi[0].blocks_free;
    e->stats.prefix_query_tokens = ks.prefix_query_tokens;
    e->stats.prefix_hit_tokens = ks.prefix_hit_tokens;
    pthread_mutex_unlock(&e->mu);
}

/* Closes a traced step's phase `name` now (tracing off: nothing, not even a clock read). */
static inline void mark(loom_engine *e, const char *name) {
    if (e->trace) loom__trace_step_phase(&e->tm, name, loom__now_ns());
}

static loom_status step(loom_engine *e) {
    const int64_t t_start = loom__now_ns(); /* busy time (stats), and the trace's step start */
    if (e->trace) loom__trace_step_begin(&e->tm, e->stats.steps, t_start);
    drain_inbox(e);

    loom__sched_plan plan;
    const int64_t t_plan_us = loom__engine_now_us(e);
    LOOM_TRY(loom__sched_schedule(e->sched, t_plan_us, &plan));
    carry_out_preemptions(e, &plan);
    if (plan.n_entries == 0) {
        update_stats(e);
        return LOOM_OK; /* no step ran: nothing is traced */
    }
    const int64_t tokens_before = e->stats.tokens_generated; /* only this thread writes it */
    int32_t n_tok = 0, n_logits = 0;
    int32_t n = build_batch(e, &plan, &n_tok, &n_logits);
    loom_status st = LOOM_OK;
    if (n > 0) {
        loom_kv_desc kv[LOOM_MAX_KV_GROUPS];
        st = loom__kv_storage_descs(&e->store, e->kv, n, e->seqs, e->n_new, NULL, kv);
        mark(e, "schedule");
        if (st == LOOM_OK) {
            const bool device_summaries = mark_summary_rows(e, n);
            loom__batch batch = {
                .tokens = e->tokens,
                .pos = e->pos,
                .n_tokens = n_tok,
                .logit_rows = e->logit_rows,
                .n_logits = n_logits,
                .summary_only = device_summaries ? e->summary_only : NULL,
                .summary = e->summaries,
                .top = e->summary_top,
                .n_top = LOOM_ENGINE_SUMMARY_TOP,
                .edits = e->edits,
                .raw_summary = e->raw_sums,
                .raw_top = e->raw_top,
                .edit_raw = e->edit_raw,
                .on_layers = e->trace ? loom__trace_on_layers : NULL,
                .hook_user = &e->hook,
                .hook_every = e->layers.every,
            };
            st = loom__model_forward(e->model, &e->exec, &batch, kv, e->logits);
            mark(e, "logits");
        }
        if (st == LOOM_OK) st = sample_rows(e, n);
        mark(e, "sample");
        if (st == LOOM_OK) {
            commit_rows(e, n);
        } else {
            LOOM_LOG_E("engine: step failed: %s", loom_last_error());
            fail_batch(e, n, st);
            st = LOOM_OK; /* the batch's requests failed; the engine goes on */
        }
    } else {
        mark(e, "schedule");
        e->n_results = 0;
    }
    /* Entries that were dropped (cancelled, failed) still close the plan. */
    const int64_t t_done_us = loom__engine_now_us(e);
    loom_status st2 = loom__sched_on_step_done(e->sched, e->results, e->n_results, t_done_us);
    if (st2 != LOOM_OK) LOOM_LOG_E("engine: scheduler bookkeeping: %s", loom_last_error());
    /* The step-cost model learns from the scheduler's own clock readings (so a replay fits the
     * same model); the context is what the plan's sequences hold after the step. */
    int64_t n_ctx = 0;
    for (int32_t k = 0; k < plan.n_entries; k++)
        n_ctx += (int64_t)plan.entries[k].pos_start + plan.entries[k].n_tokens;
    loom__engine_after_step(e, plan.n_tokens, n_ctx, t_done_us - t_plan_us);
    update_stats(e);
    /* The step record goes in before the step is counted: its index is the one its token
     * records carry. */
    const int64_t t_end = loom__now_ns();
    if (e->trace) (void)loom__trace_step_end(e->trace, &e->tm, "events", t_end, n, n_tok);
    pthread_mutex_lock(&e->mu);
    e->stats.steps++;
    e->busy_ns += t_end - t_start;
    int64_t k = e->n_rate++ % LOOM_ENGINE_RATE_WINDOW;
    e->rate_tokens[k] = e->stats.tokens_generated - tokens_before;
    e->rate_ns[k] = t_end - t_start;
    pthread_mutex_unlock(&e->mu);
    return st == LOOM_OK ? st2 : st;
}

loom_status loom__engine_step(loom_engine *e) {
    e->n_events = 0;
    loom__engine_free_retired(e);
    if (e->rp) { /* a replay: this step's inputs and clock come from the record */
        if (e->rp->failed != LOOM_OK)
            return loom__fail(e->rp->failed, "%s (the replay ended there)", e->rp->why);
        if (!loom__replayer_more(e->rp)) return LOOM_OK;
        loom_status st = loom__engine_replay_begin(e);
        if (st != LOOM_OK) return loom__engine_replay_fail(e, st);
    }
    loom_status st = step(e);
    if (e->rec) loom__recorder_step_end(e->rec, loom__engine_events_digest(e));
    if (e->rp && st == LOOM_OK) st = loom__engine_replay_end(e);
    if (e->rp && st != LOOM_OK) loom__engine_replay_fail(e, st);
    return st;
}
