/* engine_create.c — loom_engine_create / loom_engine_destroy: parameters, the per-step arrays
 * (sized once, so a step allocates nothing), the KV cache, the scheduler, the forward
 * workspace, and the background thread. */
#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/engine.h"
#include "engine/kv_plan.h"

void loom_engine_params_init(loom_engine_params *out, size_t size) {
    loom_engine_params p;
    loom__abi_init(&p, sizeof p);
    p.kv_bytes = 0;
    p.kv_fraction = 0.25f;
    p.block_size = 16;
    p.max_batched_tokens = 512;
    p.max_seqs = 64;
    p.max_ctx = 0;
    p.prefix_cache = true;
    p.preempt = LOOM_PREEMPT_RECOMPUTE;
    p.fcfs = false;
    p.starvation_s = 30.0;
    p.watermark = 0.01f;
    p.max_logprobs = LOOM_SAMPLE_CHAIN_DEFAULT_LOGPROBS_MAX;
    p.kv_type = LOOM_KV_CACHE_F16;
    p.kv_rotate = false;
    p.kv_plan = NULL;
    loom__abi_defaults_out(out, size, &p, sizeof p);
}

static loom_status check_params(const loom_model *m, loom_engine_params *p) {
    LOOM_RETURN_IF(p->kv_bytes < 0, LOOM_ERR_INVALID_ARG, "engine: kv_bytes < 0");
    LOOM_RETURN_IF(p->kv_bytes == 0 && !(p->kv_fraction > 0 && p->kv_fraction <= 1),
                   LOOM_ERR_INVALID_ARG, "engine: kv_fraction must be in (0, 1]");
    LOOM_RETURN_IF(p->block_size < 1 || p->block_size > 1024, LOOM_ERR_INVALID_ARG,
                   "engine: block_size %d (1..1024)", p->block_size);
    LOOM_RETURN_IF(p->max_seqs < 1 || p->max_seqs > 4096, LOOM_ERR_INVALID_ARG,
                   "engine: max_seqs %d (1..4096)", p->max_seqs);
    LOOM_RETURN_IF(p->max_batched_tokens < p->max_seqs || p->max_batched_tokens > 65536,
                   LOOM_ERR_INVALID_ARG, "engine: max_batched_tokens %d (max_seqs..65536)",
                   p->max_batched_tokens);
    LOOM_RETURN_IF(p->max_ctx < 0, LOOM_ERR_INVALID_ARG, "engine: max_ctx < 0");
    int64_t us;
    LOOM_RETURN_IF(!loom__duration_us(p->starvation_s, &us), LOOM_ERR_INVALID_ARG,
                   "engine: starvation_s = %g (0 or +inf for never, else up to %g s)",
                   p->starvation_s, LOOM__MAX_DURATION_S);
    LOOM_RETURN_IF(!(p->watermark >= 0 && p->watermark < 1), LOOM_ERR_INVALID_ARG,
                   "engine: watermark %g (in [0, 1))", (double)p->watermark);
    LOOM_RETURN_IF(p->preempt != LOOM_PREEMPT_RECOMPUTE && p->preempt != LOOM_PREEMPT_SWAP,
                   LOOM_ERR_INVALID_ARG, "engine: unknown preemption mode %d", (int)p->preempt);
    LOOM_RETURN_IF(p->admission != LOOM_ADMIT_ALL && p->admission != LOOM_ADMIT_REJECT_LATE &&
                       p->admission != LOOM_ADMIT_DEGRADE,
                   LOOM_ERR_INVALID_ARG, "engine: unknown admission policy %d", (int)p->admission);
    LOOM_RETURN_IF(p->max_logprobs < 0, LOOM_ERR_INVALID_ARG, "engine: max_logprobs %d (>= 0)",
                   p->max_logprobs);
    LOOM_RETURN_IF(p->n_sample_threads < 0 || p->n_sample_threads > LOOM_ENGINE_MAX_SAMPLERS,
                   LOOM_ERR_INVALID_ARG, "engine: n_sample_threads %d (0 .. %d)",
                   p->n_sample_threads, LOOM_ENGINE_MAX_SAMPLERS);
    loom_type kv_type;
    LOOM_TRY(loom__kv_cache_type_resolve(p->kv_type, &kv_type));
    if (kv_type != LOOM_TYPE_F16 || p->kv_rotate)
        LOOM_TRY(loom__model_check_support(m, kv_type, p->kv_rotate ? LOOM_KV_HADAMARD : 0));
    if (p->max_ctx == 0) p->max_ctx = m->cfg.n_ctx_train < 8192 ? m->cfg.n_ctx_train : 8192;
    return LOOM_OK;
}

static loom_status alloc_step_arrays(loom_engine *e) {
    size_t B = (size_t)e->params.max_batched_tokens, S = (size_t)e->params.max_seqs;
    e->tokens = loom__malloc(B * sizeof *e->tokens);
    e->pos = loom__malloc(B * sizeof *e->pos);
    e->logit_rows = loom__malloc(S * sizeof *e->logit_rows);
    e->logits = loom__malloc(S * (size_t)e->model->cfg.n_vocab * sizeof *e->logits);
    e->summary_only = loom__malloc(S * sizeof *e->summary_only);
    e->summaries = loom__malloc(S * sizeof *e->summaries);
    e->summary_top = loom__malloc(S * LOOM_ENGINE_SUMMARY_TOP * sizeof *e->summary_top);
    e->edits = loom__malloc(S * sizeof *e->edits);
    e->pen_id = loom__malloc(S * LOOM_LOGIT_SUMMARY_MAX_EDITS * sizeof *e->pen_id);
    e->pen_count = loom__malloc(S * LOOM_LOGIT_SUMMARY_MAX_EDITS * sizeof *e->pen_count);
    e->raw_sums = loom__malloc(S * sizeof *e->raw_sums);
    e->raw_top = loom__malloc(S * LOOM_ENGINE_SUMMARY_TOP * sizeof *e->raw_top);
    e->edit_raw = loom__malloc(S * LOOM_LOGIT_SUMMARY_MAX_EDITS * sizeof *e->edit_raw);
    e->seqs = loom__malloc(S * sizeof *e->seqs);
    e->n_new = loom__malloc(S * sizeof *e->n_new);
    e->batch_samples = loom__malloc(S * sizeof *e->batch_samples);
    e->row_status = loom__malloc(S * sizeof *e->row_status);
    e->sample_entry = loom__malloc(S * sizeof *e->sample_entry);
    e->batch_reqs = loom__malloc(S * sizeof *e->batch_reqs);
    e->batch_index = loom__malloc(S * sizeof *e->batch_index);
    e->batch_entries = loom__malloc(S * sizeof *e->batch_entries);
    e->results = loom__malloc(S * sizeof *e->results);
    e->cap_events = LOOM_ENGINE_BATCH_EVENTS(S) + 16;
    e->events = loom__malloc(e->cap_events * sizeof *e->events);
    e->event_ptrs = loom__malloc(e->cap_events * sizeof *e->event_ptrs);
    bool ok = e->tokens && e->pos && e->logit_rows && e->logits && e->summary_only &&
              e->summaries && e->summary_top && e->edits && e->pen_id && e->pen_count &&
              e->raw_sums && e->raw_top && e->edit_raw && e->seqs && e->n_new && e->batch_samples &&
              e->row_status && e->sample_entry && e->batch_reqs && e->batch_index &&
              e->batch_entries && e->results && e->events && e->event_ptrs;
    LOOM_RETURN_IF(!ok, LOOM_ERR_OUT_OF_MEMORY, "engine: out of memory for step buffers");
    /* A sampler workspace per sampling thread of the engine's own pool: n_sample_threads, or
     * the model's host threads, at most one per sequence and LOOM_ENGINE_MAX_SAMPLERS. */
    int32_t n = e->params.n_sample_threads > 0 ? e->params.n_sample_threads : e->model->n_threads;
    if (n > e->params.max_seqs) n = e->params.max_seqs;
    if (n > LOOM_ENGINE_MAX_SAMPLERS) n = LOOM_ENGINE_MAX_SAMPLERS;
    if (n < 1) n = 1;
    size_t sz = loom__sample_chain_workspace_size(e->model->cfg.n_vocab);
    LOOM_RETURN_IF(sz == 0, LOOM_ERR_INVALID_ARG, "engine: vocabulary of %d tokens too large",
                   e->model->cfg.n_vocab);
    for (e->n_samplers = 0; e->n_samplers < n; e->n_samplers++) {
        const int32_t k = e->n_samplers;
        e->sample_mem[k] = loom__aligned_alloc(16, (sz + 15) / 16 * 16);
        e->sample_hist[k] = loom__malloc((size_t)e->max_ctx * sizeof *e->sample_hist[k]);
        LOOM_RETURN_IF(!e->sample_mem[k] || !e->sample_hist[k], LOOM_ERR_OUT_OF_MEMORY,
                       "engine: out of memory for sampler workspace %d (%zu bytes)", k, sz);
        LOOM_TRY(loom__sample_chain_workspace_init(e->sample_mem[k], sz, e->model->cfg.n_vocab,
                                                   &e->sample_ws[k]));
    }
    if (e->n_samplers > 1)
        LOOM_TRY(loom__threadpool_create(e->n_samplers, LOOM__TP_SPIN_NS, &e->sample_tp));
    return LOOM_OK;
}

static loom_status create_sched(loom_engine *e) {
    loom__sched_config sc = loom__sched_default_config();
    sc.policy = e->params.fcfs ? LOOM_SCHED_POLICY_FCFS : LOOM_SCHED_POLICY_PRIORITY;
    sc.max_batched_tokens = e->params.max_batched_tokens;
    sc.max_seqs = e->params.max_seqs;
    sc.watermark_blocks = (int32_t)(e->params.watermark * (float)e->n_blocks + 0.999f);
    sc.preempt_mode = e->params.preempt == LOOM_PREEMPT_SWAP ? LOOM_SCHED_PREEMPT_SWAP
                                                             : LOOM_SCHED_PREEMPT_RECOMPUTE;
    loom__duration_us(e->params.starvation_s, &sc.promote_age_us); /* checked at create */
    /* A request preempted twice keeps its blocks for a while after each later admission. */
    sc.protect_us = LOOM_SCHED_ENGINE_PROTECT_US;
    loom__sched_kv_iface kv = loom__engine_kv_iface(e);
    return loom__sched_create(&sc, &kv, &e->sched);
}

static void *engine_thread(void *arg);

/* Where the sampler reads a row from (engine.h, sample_from): the backend's summaries where it
 * has logits_summary, else the rows; LOOM_SAMPLE_FROM=rows or =summary overrides (summary on
 * a backend without the slot summarizes on the host, which is how tests check the path on the
 * CPU). */
static loom_status pick_sample_from(loom_engine *e) {
    const bool slot = e->ops->logits_summary != NULL;
    const char *env = getenv("LOOM_SAMPLE_FROM");
    e->sample_from = slot ? LOOM__FROM_DEVICE : LOOM__FROM_ROWS;
    if (env != NULL && strcmp(env, "rows") == 0)
        e->sample_from = LOOM__FROM_ROWS;
    else if (env != NULL && strcmp(env, "summary") == 0)
        e->sample_from = slot ? LOOM__FROM_DEVICE : LOOM__FROM_HOST;
    else if (env != NULL && env[0] != '\0')
        LOOM_LOG_W("engine: LOOM_SAMPLE_FROM=%s ignored (rows or summary)", env);
    if (e->sample_from != LOOM__FROM_HOST) return LOOM_OK;
    /* each sampler's copy of a row to edit */
    e->summary_scratch = loom__malloc((size_t)e->n_samplers * (size_t)e->model->cfg.n_vocab *
                                      sizeof *e->summary_scratch);
    LOOM_RETURN_IF(e->summary_scratch == NULL, LOOM_ERR_OUT_OF_MEMORY,
                   "engine: out of memory for the samplers' scratch rows");
    return LOOM_OK;
}

static loom_status create_engine(loom_engine *e) {
    /* The execution context first: the KV budget (kv_fraction) is what the backend has left. */
    loom__exec_shape es = {
        .max_tokens = e->params.max_batched_tokens,
        .max_seqs = e->params.max_seqs,
        .max_ctx = e->max_ctx,
        .block_size = e->params.block_size,
        .kv_type = e->kv_type,
        .kv_flags = e->kv_flags,
    };
    LOOM_TRY(loom__exec_create(e->model, &es, &e->exec));
    LOOM_TRY(loom__engine_kv_create(e));
    LOOM_TRY(alloc_step_arrays(e));
    LOOM_TRY(pick_sample_from(e));
    LOOM_TRY(create_sched(e));
    loom__cost_model_init(&e->cost, LOOM_ENGINE_COST_HALF_LIFE);
    e->cost_pub = e->cost;
    LOOM_TRY(loom__id_map_init(&e->reqs, 64));
    LOOM_TRY(loom__id_map_init(&e->live, 64));
    /* Longest vocabulary piece: sizes each sample's text stream. */
    char buf[1024];
    e->max_piece = 16;
    for (int32_t t = 0; t < e->model->cfg.n_vocab; t++) {
        size_t n = 0;
        loom_status st = loom__tokenizer_piece(e->model->tok, t, LOOM_DETOKENIZE_RENDER_SPECIAL,
                                               buf, sizeof buf, &n);
        LOOM_RETURN_IF(st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL, st,
                       "engine: token %d has no piece", t);
        if (n > e->max_piece) e->max_piece = n;
    }
    return LOOM_OK;
}

/* The engine's layer map: the recorded one (a replay), or the model's with the plan applied;
 * then the pages' flags, and whether the backend runs the plan. */
static loom_status load_layer_map(loom_engine *e, const int32_t *layer_src,
                                  const loom__kv_merge *merge) {
    const int32_t n = e->model->cfg.n_layer;
    e->layer_src = loom__malloc((size_t)n * sizeof *e->layer_src);
    e->merge.with = loom__malloc((size_t)n * sizeof *e->merge.with);
    LOOM_RETURN_IF(!e->layer_src || !e->merge.with, LOOM_ERR_OUT_OF_MEMORY,
                   "engine: out of memory");
    if (layer_src == NULL) {
        LOOM_TRY(loom__kv_plan_load(e->model, e->params.kv_plan, e->layer_src, &e->merge));
    } else {
        memcpy(e->layer_src, layer_src, (size_t)n * sizeof *e->layer_src);
        int32_t *with = e->merge.with;
        if (merge != NULL) {
            e->merge = *merge;
            e->merge.with = with;
            memcpy(with, merge->with, (size_t)n * sizeof *with);
        } else {
            loom__kv_merge_reset(&e->merge, n);
        }
        LOOM_TRY(loom__kv_plan_check(e->model, e->layer_src, e->merge.with));
    }
    e->kv_flags = e->params.kv_rotate ? LOOM_KV_HADAMARD : 0;
    LOOM_TRY(loom__kv_merge_flags(&e->merge, e->kv_type, &e->kv_flags));
    if (e->merge.n_pairs > 0)
        LOOM_TRY(loom__model_check_support(e->model, e->kv_type, e->kv_flags));
    return LOOM_OK;
}

loom_status loom_engine_create(loom_model *model, const loom_engine_params *params,
                               loom_engine **out) {
    loom__clear_error();
    return loom__engine_create(model, params, NULL, NULL, out);
}

loom_status loom__engine_create(loom_model *model, const loom_engine_params *params,
                                const int32_t *layer_src, const loom__kv_merge *merge,
                                loom_engine **out) {
    LOOM_CHECK_ARG(model != NULL && out != NULL);
    LOOM_RETURN_IF(model->vocab_only, LOOM_ERR_INVALID_ARG,
                   "engine: the model was loaded with vocab_only");
    loom_engine_params p = loom_engine_default_params();
    LOOM_TRY(loom__abi_params_in(&p, sizeof p, params,
                                 LOOM__ABI_END(loom_engine_params, n_sample_threads),
                                 "engine_params"));
    LOOM_TRY(check_params(model, &p));
    loom_engine *e = loom__calloc(1, sizeof *e);
    LOOM_RETURN_IF(!e, LOOM_ERR_OUT_OF_MEMORY, "engine: out of memory");
    e->model = model;
    loom__model_retain(model);
    e->ops = model->backend->ops;
    e->params = p;
    loom__kv_cache_type_resolve(p.kv_type, &e->kv_type); /* checked by check_params */
    e->max_ctx = p.max_ctx;
    e->next_id = 1;
    e->t0_ns = loom__now_ns();
    e->trace = p.trace;
    loom__trace_layers_init(&e->layers, model->cfg.n_layer);
    e->hook = (loom__trace_layer_hook){.tm = &e->tm, .layers = &e->layers};
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    loom_status st = load_layer_map(e, layer_src, merge);
    e->params.kv_plan = NULL; /* the caller's string: not kept */
    if (st == LOOM_OK) st = create_engine(e);
    if (st == LOOM_OK && p.record_path) st = loom__engine_record_open(e);
    if (st == LOOM_OK && p.on_event) {
        if (pthread_create(&e->thread, NULL, engine_thread, e) != 0) {
            st = loom__fail(LOOM_ERR_INTERNAL, "engine: cannot start the background thread");
        } else {
            e->has_thread = true;
        }
    }
    if (st != LOOM_OK) {
        loom_engine_destroy(e);
        return st;
    }
    *out = e;
    return LOOM_OK;
}

void loom_engine_destroy(loom_engine *e) {
    if (!e) return;
    if (e->has_thread) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    for (uint32_t i = 0; e->reqs.keys && i < e->reqs.cap; i++) {
        uint64_t k = e->reqs.keys[i];
        if (k != 0 && k != UINT64_MAX) loom__req_free(e->reqs.vals[i]);
    }
    for (size_t i = 0; i < e->inbox.n_reqs; i++) loom__req_free(e->inbox.reqs[i]);
    for (size_t i = e->drained.next_req; i < e->drained.n_reqs; i++)
        loom__req_free(e->drained.reqs[i]); /* left by a step short of memory */
    loom__engine_free_retired(e);
    loom__recorder_close(e->rec);
    loom__replayer_close(e->rp);
    free(e->inbox.reqs);
    free(e->inbox.cancels);
    free(e->drained.reqs);
    free(e->drained.cancels);
    loom__id_map_free(&e->reqs);
    loom__id_map_free(&e->live);
    loom__sched_destroy(e->sched);
    loom__engine_admit_free(e);
    loom__engine_kv_destroy(e);
    loom__exec_destroy(e->model, &e->exec);
    free(e->layer_src);
    free(e->merge.with);
    loom__threadpool_destroy(e->sample_tp);
    free(e->tokens);
    free(e->pos);
    free(e->logit_rows);
    free(e->logits);
    free(e->summary_only);
    free(e->summaries);
    free(e->summary_top);
    free(e->edits);
    free(e->pen_id);
    free(e->pen_count);
    free(e->raw_sums);
    free(e->raw_top);
    free(e->edit_raw);
    free(e->summary_scratch);
    free(e->seqs);
    free(e->n_new);
    free(e->batch_samples);
    free(e->row_status);
    free(e->sample_entry);
    free(e->batch_reqs);
    free(e->batch_index);
    free(e->batch_entries);
    free(e->results);
    free(e->events);
    free(e->event_ptrs);
    for (int32_t k = 0; k < LOOM_ENGINE_MAX_SAMPLERS; k++) {
        free(e->sample_mem[k]);
        free(e->sample_hist[k]);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    loom__model_release(e->model);
    free(e);
}

/* Background mode: step while there is work, deliver the events, sleep when idle. */
static void *engine_thread(void *arg) {
    loom_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && e->inbox.n_reqs == 0 && e->inbox.n_cancels == 0 && e->live.count == 0) {
            pthread_cond_wait(&e->cv, &e->mu);
        }
        bool stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        if (loom__engine_step(e) != LOOM_OK) {
            /* A failed step has already failed its requests through events; keep serving. */
        }
        for (size_t i = 0; i < e->n_events; i++) {
            e->params.on_event(&e->events[i], e->params.on_event_user_data);
        }
    }
    return NULL;
}
