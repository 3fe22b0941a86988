/* engine_kv.c — the KV cache of an engine: sizing the pools from the byte budget, their
 * storage in backend memory, the scheduler's view of the KV manager, and the data movements
 * the manager asks for (copy-on-write copies, swap to host memory and back).
 *
 * Every group gets the same number of blocks: the scheduler sees one block count (group 0's:
 * full attention when the model has any), and a sliding-window group never holds more blocks
 * than the full-attention group for the same sequences, so group 0 is the binding one. A pool
 * sized for what sliding layers really need is a later refinement (see the issue notes). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "engine/engine.h"

/* Bytes of one block of group g: every layer of the group, K and V. */
static size_t group_block_bytes(const loom_engine *e, int32_t g) {
    size_t layers = 0;
    for (int32_t il = 0; il < e->model->cfg.n_layer; il++) {
        if (e->model->cfg.layers[il].kv_group == g) layers++;
    }
    return layers * 2 * e->block_stride;
}

static int64_t available_bytes(void) {
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (int64_t)pages * size : 0;
}

static loom_status size_pools(loom_engine *e) {
    const loom_model_config *c = &e->model->cfg;
    const loom_engine_params *p = &e->params;
    e->kv_type = LOOM_TYPE_F16;
    e->token_stride = (size_t)c->n_head_kv * (size_t)c->head_dim * 2;
    e->block_stride = e->token_stride * (size_t)p->block_size;
    e->n_groups = c->n_kv_groups;
    size_t per_block = 0;
    for (int32_t g = 0; g < e->n_groups; g++) per_block += group_block_bytes(e, g);
    int64_t budget = p->kv_bytes;
    if (budget == 0) budget = (int64_t)((double)available_bytes() * p->kv_fraction);
    int64_t n = budget / (int64_t)per_block;
    int64_t need = (e->max_ctx + p->block_size - 1) / p->block_size + 1;
    LOOM_RETURN_IF(n < need, LOOM_ERR_OUT_OF_MEMORY,
                   "engine: a KV budget of %lld bytes holds %lld blocks of %zu bytes; one "
                   "request of max_ctx %d needs %lld",
                   (long long)budget, (long long)n, per_block, e->max_ctx, (long long)need);
    if (n > (1 << 24)) n = 1 << 24;
    e->n_blocks = (int32_t)n;
    return LOOM_OK;
}

static loom_status alloc_storage(loom_engine *e) {
    const loom_model_config *c = &e->model->cfg;
    size_t layer_bytes = e->block_stride * (size_t)e->n_blocks;
    LOOM_TRY(e->ops->buffer_alloc(e->bctx, layer_bytes * 2 * (size_t)c->n_layer, &e->kv_buf));
    e->k_base = calloc((size_t)c->n_layer, sizeof *e->k_base);
    e->v_base = calloc((size_t)c->n_layer, sizeof *e->v_base);
    LOOM_RETURN_IF(!e->k_base || !e->v_base, LOOM_ERR_OUT_OF_MEMORY, "engine: out of memory");
    char *base = e->ops->buffer_base(e->bctx, e->kv_buf);
    for (int32_t il = 0; il < c->n_layer; il++) {
        e->k_base[il] = base + (size_t)(2 * il) * layer_bytes;
        e->v_base[il] = base + (size_t)(2 * il + 1) * layer_bytes;
    }
    return LOOM_OK;
}

static loom_status alloc_swap(loom_engine *e) {
    if (e->params.preempt != LOOM_PREEMPT_SWAP) return LOOM_OK;
    size_t slot = 0;
    for (int32_t g = 0; g < e->n_groups; g++) {
        size_t b = group_block_bytes(e, g);
        if (b > slot) slot = b;
    }
    /* As many host slots as device blocks over all groups: every sequence can be out. */
    e->swap_slot_bytes = slot;
    e->swap_slots = e->n_blocks * e->n_groups;
    e->swap_mem = malloc(slot * (size_t)e->swap_slots);
    e->swap_free = malloc((size_t)e->swap_slots * sizeof *e->swap_free);
    LOOM_RETURN_IF(!e->swap_mem || !e->swap_free, LOOM_ERR_OUT_OF_MEMORY,
                   "engine: cannot allocate %zu bytes of host swap space",
                   slot * (size_t)e->swap_slots);
    for (int32_t i = 0; i < e->swap_slots; i++) e->swap_free[i] = e->swap_slots - 1 - i;
    e->n_swap_free = e->swap_slots;
    return LOOM_OK;
}

loom_status loom__engine_kv_create(loom_engine *e) {
    LOOM_TRY(size_pools(e));
    LOOM_TRY(alloc_storage(e));
    LOOM_TRY(alloc_swap(e));
    loom_kv_group_params groups[LOOM_MAX_KV_GROUPS];
    for (int32_t g = 0; g < e->n_groups; g++) {
        groups[g].n_blocks = e->n_blocks;
        groups[g].window = e->model->cfg.kv_group_window[g];
    }
    loom_kv_params kp = loom_kv_default_params();
    kp.block_size = e->params.block_size;
    kp.n_groups = e->n_groups;
    kp.groups = groups;
    kp.max_seqs = e->params.max_seqs * 4 + 16; /* running + preempted/swapped ones */
    kp.max_seq_len = e->max_ctx;
    kp.prefix_caching = e->params.prefix_cache;
    kp.watermark = e->params.watermark;
    /* Blocks computed by one model are meaningless to another: salt with its identity. */
    const char *name = e->model->name ? e->model->name : "";
    kp.model_salt = loom_kv_hash_bytes(name, strlen(name), (uint64_t)loom_gguf_file_size(
                                                                e->model->gguf));
    LOOM_TRY(loom_kv_create(&kp, &e->kv));
    e->block_cap = loom_kv_desc_block_cap(e->kv, e->params.max_seqs);
    e->swap_list_cap = e->n_groups * ((e->max_ctx + e->params.block_size - 1) /
                                      e->params.block_size + 1);
    e->swap_blocks = malloc((size_t)e->swap_list_cap * sizeof *e->swap_blocks);
    e->known = malloc((size_t)e->max_ctx * sizeof *e->known);
    LOOM_RETURN_IF(!e->swap_blocks || !e->known, LOOM_ERR_OUT_OF_MEMORY,
                   "engine: out of memory");
    return LOOM_OK;
}

void loom__engine_kv_destroy(loom_engine *e) {
    loom_kv_destroy(e->kv);
    if (e->kv_buf) e->ops->buffer_free(e->bctx, e->kv_buf);
    free(e->k_base);
    free(e->v_base);
    free(e->swap_mem);
    free(e->swap_free);
    free(e->swap_blocks);
    free(e->known);
}

/* ---- the scheduler's view ------------------------------------------------------------------ */

static loom_req_sample *sample_of(loom_engine *e, uint64_t sid, loom_req **req) {
    loom_req *r = loom__id_map_get(&e->reqs, sid / LOOM_ENGINE_MAX_N);
    if (req) *req = r;
    int32_t i = (int32_t)(sid % LOOM_ENGINE_MAX_N);
    return r && i < r->n_samples ? &r->samples[i] : NULL;
}

static int32_t iface_blocks_free(void *ctx) {
    loom_engine *e = ctx;
    return loom_kv_blocks_available(e->kv, 0);
}

static int32_t iface_blocks_needed(void *ctx, uint64_t id, int32_t n_computed, int32_t n_new) {
    loom_engine *e = ctx;
    loom_req *r = NULL;
    loom_req_sample *s = sample_of(e, id, &r);
    if (!s) return 0;
    int32_t need[LOOM_MAX_KV_GROUPS] = {0};
    if (s->kv_seq >= 0) {
        if (loom_kv_seq_need(e->kv, s->kv_seq, n_new, need) != LOOM_OK) return INT32_MAX / 2;
        return need[0];
    }
    /* Not admitted: what admitting its known tokens and computing up to n_computed + n_new
     * would take. */
    int32_t n_known = r->n_prompt + s->n_generated;
    int32_t total = n_computed + n_new;
    if (total > n_known) total = n_known;
    const loom_token *toks = loom__engine_known(e, r, s, total);
    int32_t cached = 0;
    if (loom_kv_admit_need(e->kv, r->cache_salt, toks, total, total, need, &cached) != LOOM_OK)
        return INT32_MAX / 2;
    return need[0];
}

static int32_t iface_blocks_reclaimable(void *ctx, uint64_t id) {
    loom_engine *e = ctx;
    loom_req_sample *s = sample_of(e, id, NULL);
    if (!s || s->kv_seq < 0) return 0;
    const int32_t *table = NULL;
    int32_t n = 0;
    if (loom_kv_seq_table(e->kv, s->kv_seq, 0, &table, &n) != LOOM_OK) return 0;
    int32_t held = 0;
    for (int32_t i = 0; i < n; i++) held += table[i] != LOOM_KV_NO_BLOCK;
    /* Shared prompt blocks stay with their other owners: only the sample's own tail (after
     * the cached prefix) is surely reclaimed. */
    loom_kv_seq_info info;
    if (loom_kv_seq_get_info(e->kv, s->kv_seq, &info) != LOOM_OK) return 0;
    int32_t shared = info.n_cached / e->params.block_size;
    return held > shared ? held - shared : 0;
}

static int32_t iface_cached_tokens(void *ctx, uint64_t id) {
    loom_engine *e = ctx;
    loom_req *r = NULL;
    loom_req_sample *s = sample_of(e, id, &r);
    if (!s || s->kv_seq >= 0) return 0;
    int32_t n_known = r->n_prompt + s->n_generated;
    const loom_token *toks = loom__engine_known(e, r, s, n_known);
    int32_t need[LOOM_MAX_KV_GROUPS], cached = 0;
    if (loom_kv_admit_need(e->kv, r->cache_salt, toks, n_known, 0, need, &cached) != LOOM_OK)
        return 0;
    return cached;
}

loom_sched_kv_iface loom__engine_kv_iface(loom_engine *e) {
    loom_sched_kv_iface k = {
        .ctx = e,
        .blocks_free = iface_blocks_free,
        .blocks_needed = iface_blocks_needed,
        .blocks_reclaimable = iface_blocks_reclaimable,
        .cached_tokens = iface_cached_tokens,
    };
    return k;
}

/* ---- data movements ------------------------------------------------------------------------ */

loom_status loom__engine_kv_copy(loom_engine *e, const loom_kv_copy *c) {
    size_t src = (size_t)c->src * e->block_stride, dst = (size_t)c->dst * e->block_stride;
    for (int32_t il = 0; il < e->model->cfg.n_layer; il++) {
        if (e->model->cfg.layers[il].kv_group != c->group) continue;
        LOOM_TRY(e->ops->copy(e->bctx, (char *)e->k_base[il] + dst, (char *)e->k_base[il] + src,
                              e->block_stride));
        LOOM_TRY(e->ops->copy(e->bctx, (char *)e->v_base[il] + dst, (char *)e->v_base[il] + src,
                              e->block_stride));
    }
    return LOOM_OK;
}

/* Moves one block of group g between device block b and host slot (dir > 0: to host). */
static loom_status move_block(loom_engine *e, int32_t g, int32_t b, int32_t slot, int dir) {
    char *host = e->swap_mem + (size_t)slot * e->swap_slot_bytes;
    size_t off = (size_t)b * e->block_stride;
    for (int32_t il = 0; il < e->model->cfg.n_layer; il++) {
        if (e->model->cfg.layers[il].kv_group != g) continue;
        void *k = (char *)e->k_base[il] + off, *v = (char *)e->v_base[il] + off;
        if (dir > 0) {
            LOOM_TRY(e->ops->tensor_get(e->bctx, host, k, e->block_stride));
            LOOM_TRY(e->ops->tensor_get(e->bctx, host + e->block_stride, v, e->block_stride));
        } else {
            LOOM_TRY(e->ops->tensor_set(e->bctx, k, host, e->block_stride));
            LOOM_TRY(e->ops->tensor_set(e->bctx, v, host + e->block_stride, e->block_stride));
        }
        host += 2 * e->block_stride;
    }
    return LOOM_OK;
}

loom_status loom__engine_swap_out(loom_engine *e, loom_req_sample *s) {
    loom_kv_seq_info info;
    LOOM_TRY(loom_kv_seq_get_info(e->kv, s->kv_seq, &info));
    LOOM_RETURN_IF(info.n_held > e->n_swap_free || info.n_held > e->swap_list_cap,
                   LOOM_ERR_OUT_OF_MEMORY, "engine: host swap space is full");
    LOOM_TRY(loom_kv_swap_out(e->kv, s->kv_seq, e->swap_blocks, e->swap_list_cap,
                              s->swap_offsets));
    for (int32_t g = 0; g < e->n_groups; g++) {
        for (int32_t j = s->swap_offsets[g]; j < s->swap_offsets[g + 1]; j++) {
            int32_t slot = e->swap_free[--e->n_swap_free];
            s->swap_slots[j] = slot;
            LOOM_TRY(move_block(e, g, e->swap_blocks[j], slot, +1));
        }
    }
    s->swapped = true;
    return LOOM_OK;
}

loom_status loom__engine_swap_in(loom_engine *e, loom_req_sample *s) {
    int32_t offsets[LOOM_MAX_KV_GROUPS + 1];
    LOOM_TRY(loom_kv_swap_in(e->kv, s->kv_seq, e->swap_blocks, e->swap_list_cap, offsets));
    for (int32_t g = 0; g < e->n_groups; g++) {
        for (int32_t j = offsets[g]; j < offsets[g + 1]; j++) {
            LOOM_TRY(move_block(e, g, e->swap_blocks[j], s->swap_slots[j], -1));
            e->swap_free[e->n_swap_free++] = s->swap_slots[j];
        }
    }
    s->swapped = false;
    return LOOM_OK;
}

void loom__engine_release(loom_engine *e, loom_req_sample *s) {
    if (s->swapped) {
        for (int32_t j = 0; j < s->swap_offsets[e->n_groups]; j++) {
            e->swap_free[e->n_swap_free++] = s->swap_slots[j];
        }
        s->swapped = false;
    }
    if (s->kv_seq >= 0) {
        (void)loom_kv_seq_free(e->kv, s->kv_seq);
        s->kv_seq = -1;
    }
}
