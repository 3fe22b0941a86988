/* engine_kv.c — the KV cache of an engine: sizing the pools from the byte budget, their
 * storage in backend memory, the scheduler's view of the KV manager, and the data movements
 * the manager asks for (copy-on-write copies, swap to host memory and back).
 *
 * Sizing. Each KV group has its own pool. The scheduler counts blocks of group 0 only (full
 * attention when the model has any: the group whose tables grow with the context), so every
 * other pool must be large enough never to run out first. A sliding-window group (window w)
 * needs far less than a full one: its sequences release the blocks that leave the window
 * (kv_manager.h). Precisely, with block size bs:
 *   - a sequence about to compute n tokens at positions p .. p+n-1 holds the table entries
 *     covering positions p-w+1 .. p+n-1 (the first query reads back to p-w+1; earlier ones
 *     were released at commit): w+n-1 positions, which straddle at most
 *     floor((w + n + 2*bs - 3) / bs) blocks, and never more than its whole table,
 *     ceil(max_ctx / bs) blocks. Between steps the same holds with n = 0.
 *   - Only running requests hold blocks, at most max_seqs of them: recompute-preempted and
 *     finished ones freed theirs, swapped-out ones hold none, waiting ones hold nothing yet,
 *     and the engine never forks (n > 1 samples share a prompt through the prefix cache). One
 *     step computes at most max_batched_tokens tokens over all of them. Summing the per
 *     sequence bound over S = max_seqs sequences whose n add up to T = max_batched_tokens:
 *         held = min(floor((S * (w + 2*bs - 3) + T) / bs), S * ceil(max_ctx / bs)).
 *     Blocks shared through the prefix cache count once, so sharing only lowers this.
 *   - During a step, a copy-on-write (a reused, indexed last block) keeps its source pinned
 *     until commit: at most one per sequence, so S more.
 *   - A prefix-cache hit needs the sliding group to still have the cached blocks of the
 *     prefix's last window (kv_manager.h), which a pool of exactly held + S may have evicted
 *     under full load, turning every hit on a long prompt into a miss. With prefix caching on,
 *     room for ceil(S / 8) such windows, min(floor((w + 2*bs - 3) / bs), ceil(max_ctx / bs))
 *     blocks each, keeps the hot prefixes hitting for about an eighth more of the pool.
 *   cap = held + S + share is the most such a group can use. Full-attention groups get n
 *   blocks each and each sliding group min(cap, n), n being the largest count (at most 2^24)
 *   whose pools fit the budget: everything the sliding groups cannot use goes to the full
 *   ones. When cap >= n the sliding group gets n, as much as group 0, which is also enough:
 *   a sliding table is a part of the same sequence's full table, so it never holds more.
 *   A model without a full-attention group gives every group n: there the scheduler's group
 *   is a sliding one, and it counts a prompt's whole table when admitting it (the releases
 *   between prefill chunks are not credited), so it needs whole prompts like a full group.
 *   One request of max_ctx must fit every pool on its own (ceil(max_ctx / bs) + 1 blocks, or
 *   cap with S = 1 and no share if less); if not, creation fails with OUT_OF_MEMORY.
 * Gemma 3 270M, bs 16, max_seqs 64, 512 tokens a step, max_ctx >= 8192: the 15 local layers
 * (w = 512) use at most 2196 + 64 + 264 = 2524 blocks, so once a budget passes about 0.7 GiB
 * every further 48 KiB is one more block of the 3 global layers, where an equal split needed
 * 288 KiB (4 GiB: 74761 global blocks instead of 14563). Below that, or with max_ctx <= w,
 * the split stays equal.
 * Statistics (loom_engine_stats.kv_blocks_*) describe group 0's pool; loom_engine_get_kv_group
 * every group's, with its exact internal fragmentation. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/log.h"
#include "engine/engine.h"

/* Most blocks a pool may have (block ids and table entries are int32_t). */
#define KV_MAX_BLOCKS (1 << 24)

/* ---- sizing -------------------------------------------------------------------------------- */

/* Bytes of one block of group g: every source layer of the group, K and V. */
static size_t group_block_bytes(const loom_engine *e, int32_t g) {
    return loom__kv_storage_block_bytes(e->model, e->layer_src, &e->merge, e->kv_type,
                                        e->params.block_size, g);
}

/* The backend's free memory, once this engine's execution context took its share (it is created
 * first): what kv_fraction is a fraction of. */
static loom_status available_bytes(const loom_engine *e, int64_t *out) {
    const loom__backend *be = e->model->backend;
    size_t free_bytes = 0, total_bytes = 0;
    LOOM_TRY(be->ops->memory_info(be->dev, &free_bytes, &total_bytes));
    *out = (int64_t)(free_bytes > INT64_MAX ? INT64_MAX : free_bytes);
    return LOOM_OK;
}

static int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* Blocks a sliding group can have in use at once: n_seqs sequences running, n_tokens computed
 * in one step over all of them (the top of the file derives it). INT64_MAX for groups that
 * take the common count: full attention, or any group of a model without full attention. */
static int64_t window_cap(const loom__engine_kv_shape *sh, int32_t g, int64_t n_seqs,
                          int64_t n_tokens, bool share) {
    bool any_full = false;
    for (int32_t k = 0; k < sh->n_groups; k++) any_full |= sh->window[k] == 0;
    if (sh->window[g] == 0 || !any_full) return INT64_MAX;
    const int64_t bs = sh->block_size, span = (int64_t)sh->window[g] + 2 * bs - 3;
    const int64_t table = ((int64_t)sh->max_ctx + bs - 1) / bs;
    int64_t held = min64((n_seqs * span + n_tokens) / bs, n_seqs * table);
    int64_t cached = share ? (n_seqs + 7) / 8 * min64(span / bs, table) : 0;
    return held + n_seqs + cached;
}

/* Bytes of the pools when the uncapped groups get n blocks each; INT64_MAX past that. */
static int64_t plan_bytes(const loom__engine_kv_shape *sh, const int64_t *cap, int64_t n) {
    int64_t total = 0;
    for (int32_t g = 0; g < sh->n_groups; g++) {
        int64_t blocks = min64(cap[g], n), bytes = (int64_t)sh->block_bytes[g];
        if (blocks > 0 && bytes > (INT64_MAX - total) / blocks) return INT64_MAX;
        total += blocks * bytes;
    }
    return total;
}

static loom_status check_shape(const loom__engine_kv_shape *sh) {
    LOOM_RETURN_IF(sh->n_groups < 1 || sh->n_groups > LOOM_MAX_KV_GROUPS || sh->block_size < 1 ||
                       sh->max_seqs < 1 || sh->max_batched_tokens < 1 || sh->max_ctx < 1 ||
                       sh->budget < 0,
                   LOOM_ERR_INVALID_ARG,
                   "engine: KV shape: %d groups, block_size %d, max_seqs %d, max_batched_tokens "
                   "%d, max_ctx %d, budget %lld",
                   sh->n_groups, sh->block_size, sh->max_seqs, sh->max_batched_tokens, sh->max_ctx,
                   (long long)sh->budget);
    for (int32_t g = 0; g < sh->n_groups; g++)
        LOOM_RETURN_IF(sh->window[g] < 0 || sh->block_bytes[g] == 0 ||
                           sh->block_bytes[g] > (size_t)INT64_MAX,
                       LOOM_ERR_INVALID_ARG, "engine: KV group %d: window %d, %zu bytes a block", g,
                       sh->window[g], sh->block_bytes[g]);
    return LOOM_OK;
}

/* The largest common count n (at most KV_MAX_BLOCKS) whose pools fit the budget; 0 if none. */
static int64_t common_count(const loom__engine_kv_shape *sh, const int64_t *cap) {
    int64_t lo = 0, hi = KV_MAX_BLOCKS; /* plan_bytes grows with n */
    if (plan_bytes(sh, cap, hi) <= sh->budget) return hi;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (plan_bytes(sh, cap, mid) <= sh->budget)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

loom_status loom__engine_kv_plan(const loom__engine_kv_shape *sh, int32_t *n_blocks) {
    LOOM_CHECK_ARG(sh != NULL && n_blocks != NULL);
    LOOM_TRY(check_shape(sh));
    int64_t cap[LOOM_MAX_KV_GROUPS];
    for (int32_t g = 0; g < sh->n_groups; g++)
        cap[g] = window_cap(sh, g, sh->max_seqs, sh->max_batched_tokens, sh->prefix_cache);
    const int64_t n = common_count(sh, cap);
    const int64_t whole = ((int64_t)sh->max_ctx + sh->block_size - 1) / sh->block_size + 1;
    for (int32_t g = 0; g < sh->n_groups; g++) {
        int64_t need = min64(whole, window_cap(sh, g, 1, sh->max_batched_tokens, false));
        LOOM_RETURN_IF(min64(cap[g], n) < need, LOOM_ERR_OUT_OF_MEMORY,
                       "engine: a KV budget of %lld bytes gives KV group %d (window %d) %lld "
                       "blocks of %zu bytes; one request of max_ctx %d needs %lld",
                       (long long)sh->budget, g, sh->window[g], (long long)min64(cap[g], n),
                       sh->block_bytes[g], sh->max_ctx, (long long)need);
    }
    for (int32_t g = 0; g < sh->n_groups; g++) n_blocks[g] = (int32_t)min64(cap[g], n);
    return LOOM_OK;
}

static loom_status size_pools(loom_engine *e) {
    const loom__model_config *c = &e->model->cfg;
    const loom_engine_params *p = &e->params;
    e->n_groups = c->n_kv_groups;
    loom__engine_kv_shape sh = {
        .budget = p->kv_bytes,
        .n_groups = e->n_groups,
        .block_size = p->block_size,
        .max_seqs = p->max_seqs,
        .max_batched_tokens = p->max_batched_tokens,
        .max_ctx = e->max_ctx,
        .prefix_cache = p->prefix_cache,
    };
    if (sh.budget == 0) {
        int64_t avail = 0;
        LOOM_TRY(available_bytes(e, &avail));
        sh.budget = (int64_t)((double)avail * p->kv_fraction);
    }
    for (int32_t g = 0; g < e->n_groups; g++) {
        sh.window[g] = c->kv_group_window[g];
        sh.block_bytes[g] = group_block_bytes(e, g);
    }
    LOOM_TRY(loom__engine_kv_plan(&sh, e->group_blocks));
    e->n_blocks = e->group_blocks[0];
    e->kv_budget = sh.budget;
    return LOOM_OK;
}

/* ---- storage ------------------------------------------------------------------------------- */

static loom_status alloc_swap(loom_engine *e) {
    if (e->params.preempt != LOOM_PREEMPT_SWAP) return LOOM_OK;
    /* As many host slots per group as device blocks: every sequence can be out, and the host
     * area costs what the device pools do. */
    for (int32_t g = 0; g < e->n_groups; g++) {
        loom__engine_swap_area *a = &e->swap[g];
        a->slot_bytes = group_block_bytes(e, g);
        a->n_slots = e->group_blocks[g];
        const loom__backend *be = e->model->backend;
        void *mem = NULL;
        LOOM_TRY(be->ops->host_alloc(be->dev, a->slot_bytes * (size_t)a->n_slots, &mem));
        a->mem = mem;
        a->free = loom__malloc((size_t)a->n_slots * sizeof *a->free);
        LOOM_RETURN_IF(!a->free, LOOM_ERR_OUT_OF_MEMORY, "engine: out of memory");
        for (int32_t i = 0; i < a->n_slots; i++) a->free[i] = a->n_slots - 1 - i;
        a->n_free = a->n_slots;
    }
    return LOOM_OK;
}

loom_status loom__engine_kv_create(loom_engine *e) {
    LOOM_TRY(size_pools(e));
    LOOM_TRY(alloc_swap(e));
    loom__kv_group_params groups[LOOM_MAX_KV_GROUPS];
    for (int32_t g = 0; g < e->n_groups; g++) {
        groups[g].n_blocks = e->group_blocks[g];
        groups[g].window = e->model->cfg.kv_group_window[g];
    }
    loom__kv_params kp = loom__kv_default_params();
    kp.block_size = e->params.block_size;
    kp.n_groups = e->n_groups;
    kp.groups = groups;
    kp.max_seqs = e->params.max_seqs * 4 + 16; /* running + preempted/swapped ones */
    kp.max_seq_len = e->max_ctx;
    kp.prefix_caching = e->params.prefix_cache;
    kp.watermark = e->params.watermark;
    kp.writes_rewrite_block = e->merge.n_pairs > 0;
    /* Blocks computed by one model are meaningless to another: salt with its identity. */
    const char *name = e->model->name ? e->model->name : "";
    kp.model_salt =
        loom__hash_bytes(name, strlen(name), (uint64_t)loom__gguf_file_size(e->model->gguf));
    LOOM_TRY(loom__kv_create(&kp, &e->kv));
    e->swap_list_cap =
        e->n_groups * ((e->max_ctx + e->params.block_size - 1) / e->params.block_size + 1);
    loom__kv_storage_params sp = {
        .kv_type = e->kv_type,
        .kv_flags = e->kv_flags,
        .block_size = e->params.block_size,
        .group_blocks = e->group_blocks,
        .max_seqs = e->params.max_seqs,
        .block_cap = loom__kv_desc_block_cap(e->kv, e->params.max_seqs),
        .max_copy_blocks =
            e->swap_list_cap > LOOM_MAX_KV_GROUPS ? e->swap_list_cap : LOOM_MAX_KV_GROUPS,
        .layer_src = e->layer_src,
        .merge = &e->merge,
    };
    LOOM_TRY(loom__kv_storage_create(e->model, &sp, &e->store));
    for (int32_t g = 0; g < e->n_groups; g++) { /* the fixed fields; steps update the rest */
        loom_kv_group_info *gi = &e->kv_groups[g];
        gi->n_groups = e->n_groups;
        gi->window = groups[g].window;
        gi->block_size = e->params.block_size;
        gi->block_bytes = (int64_t)group_block_bytes(e, g);
        for (int32_t il = 0; il < e->model->cfg.n_layer; il++) /* the sources: reusing layers
                                                                     hold nothing */
            gi->n_layers += e->model->cfg.layers[il].kv_group == g && e->layer_src[il] == il;
        gi->blocks_total = gi->blocks_free = groups[g].n_blocks;
    }
    const size_t n_list = (size_t)e->store.ranges_cap / 2 + 1; /* >= max_copy_blocks */
    e->swap_blocks = loom__malloc((size_t)e->swap_list_cap * sizeof *e->swap_blocks);
    e->copy_groups = loom__malloc(n_list * sizeof *e->copy_groups);
    e->copy_src = loom__malloc(n_list * sizeof *e->copy_src);
    e->copy_dst = loom__malloc(n_list * sizeof *e->copy_dst);
    e->copy_host = loom__malloc(n_list * sizeof *e->copy_host);
    e->known = loom__malloc((size_t)e->max_ctx * sizeof *e->known);
    LOOM_RETURN_IF(!e->swap_blocks || !e->known || !e->copy_groups || !e->copy_src ||
                       !e->copy_dst || !e->copy_host,
                   LOOM_ERR_OUT_OF_MEMORY, "engine: out of memory");
    return LOOM_OK;
}

void loom__engine_kv_destroy(loom_engine *e) {
    loom__kv_destroy(e->kv);
    loom__kv_storage_destroy(&e->store);
    for (int32_t g = 0; g < LOOM_MAX_KV_GROUPS; g++) {
        e->model->backend->ops->host_free(e->model->backend->dev, e->swap[g].mem);
        free(e->swap[g].free);
    }
    free(e->swap_blocks);
    free(e->copy_groups);
    free(e->copy_src);
    free(e->copy_dst);
    free(e->copy_host);
    free(e->known);
}

/* ---- the scheduler's view ------------------------------------------------------------------ */

static loom__req_sample *sample_of(loom_engine *e, uint64_t sid, loom__req **req) {
    loom__req *r = loom__id_map_get(&e->reqs, sid / LOOM_ENGINE_MAX_N);
    if (req) *req = r;
    int32_t i = (int32_t)(sid % LOOM_ENGINE_MAX_N);
    return r && i < r->n_samples ? &r->samples[i] : NULL;
}

static int32_t iface_blocks_free(void *ctx) {
    loom_engine *e = ctx;
    return loom__kv_blocks_available(e->kv, 0);
}

static int32_t iface_blocks_needed(void *ctx, uint64_t id, int32_t n_computed, int32_t n_new) {
    loom_engine *e = ctx;
    loom__req *r = NULL;
    loom__req_sample *s = sample_of(e, id, &r);
    if (!s) return 0;
    int32_t need[LOOM_MAX_KV_GROUPS] = {0};
    if (s->kv_seq >= 0) {
        if (loom__kv_seq_need(e->kv, s->kv_seq, n_new, need) != LOOM_OK) return INT32_MAX / 2;
        return need[0];
    }
    /* Not admitted: what admitting its known tokens and computing up to n_computed + n_new
     * would take. */
    int32_t n_known = r->n_prompt + s->n_generated;
    int32_t total = n_computed + n_new;
    if (total > n_known) total = n_known;
    const loom_token *toks = loom__engine_known(e, r, s, total);
    int32_t cached = 0;
    if (loom__kv_admit_need(e->kv, r->cache_salt, toks, total, total, need, &cached) != LOOM_OK)
        return INT32_MAX / 2;
    return need[0];
}

static int32_t iface_blocks_reclaimable(void *ctx, uint64_t id) {
    loom_engine *e = ctx;
    loom__req_sample *s = sample_of(e, id, NULL);
    if (!s || s->kv_seq < 0) return 0;
    /* Only the blocks no one else holds come back. Counting every block past the sample's own
     * cached prefix (as this did) over-counted the blocks others found in the cache after it
     * computed them, and its siblings' shared prompt: the plan then promised blocks a
     * preemption did not free, and about one request in 70,000 of the soak test failed with
     * "needs 1 blocks, 0 available" at reservation. */
    int32_t n = 0;
    if (loom__kv_seq_exclusive_blocks(e->kv, s->kv_seq, 0, &n) != LOOM_OK) return 0;
    return n;
}

static int32_t iface_cached_tokens(void *ctx, uint64_t id) {
    loom_engine *e = ctx;
    loom__req *r = NULL;
    loom__req_sample *s = sample_of(e, id, &r);
    if (!s || s->kv_seq >= 0) return 0;
    int32_t n_known = r->n_prompt + s->n_generated;
    const loom_token *toks = loom__engine_known(e, r, s, n_known);
    int32_t need[LOOM_MAX_KV_GROUPS], cached = 0;
    if (loom__kv_admit_need(e->kv, r->cache_salt, toks, n_known, 0, need, &cached) != LOOM_OK)
        return 0;
    return cached;
}

loom__sched_kv_iface loom__engine_kv_iface(loom_engine *e) {
    loom__sched_kv_iface k = {
        .ctx = e,
        .blocks_free = iface_blocks_free,
        .blocks_needed = iface_blocks_needed,
        .blocks_reclaimable = iface_blocks_reclaimable,
        .cached_tokens = iface_cached_tokens,
    };
    return k;
}

/* ---- data movements ------------------------------------------------------------------------ */

loom_status loom__engine_kv_copy(loom_engine *e, const loom__kv_copy *c, int32_t n) {
    for (int32_t k = 0; k < n; k++) {
        e->copy_groups[k] = c[k].group;
        e->copy_src[k] = c[k].src;
        e->copy_dst[k] = c[k].dst;
    }
    return loom__kv_storage_copy(&e->store, e->exec.stream, LOOM_COPY_DEVICE, n, e->copy_groups,
                                 e->copy_src, e->copy_dst, NULL);
}

/* Gives a swapped-out sample's host slots back to their groups' areas. */
static void release_slots(loom_engine *e, loom__req_sample *s) {
    if (!s->swapped) return;
    for (int32_t g = 0; g < e->n_groups; g++) {
        loom__engine_swap_area *a = &e->swap[g];
        for (int32_t j = s->swap_offsets[g]; j < s->swap_offsets[g + 1]; j++)
            a->free[a->n_free++] = s->swap_slots[j];
    }
    s->swapped = false;
}

/* Moves the blocks listed at offsets[0 .. n_groups] of e->swap_blocks between the device and
 * the sample's host slots, in one backend call (TO_HOST: out; FROM_HOST: in). */
static loom_status move_blocks(loom_engine *e, const loom__req_sample *s, const int32_t *offsets,
                               loom_copy_kind kind) {
    int32_t n = 0;
    for (int32_t g = 0; g < e->n_groups; g++) {
        for (int32_t j = offsets[g]; j < offsets[g + 1]; j++, n++) {
            e->copy_groups[n] = g;
            e->copy_src[n] = e->swap_blocks[j];
            e->copy_host[n] = e->swap[g].mem + (size_t)s->swap_slots[j] * e->swap[g].slot_bytes;
        }
    }
    return loom__kv_storage_copy(&e->store, e->exec.stream, kind, n, e->copy_groups, e->copy_src,
                                 NULL, e->copy_host);
}

/* Whether every group's host area has a slot for each block the sequence holds there. */
static bool swap_fits(const loom_engine *e, int32_t seq) {
    int32_t total = 0;
    for (int32_t g = 0; g < e->n_groups; g++) {
        const int32_t *table = NULL;
        int32_t n = 0, held = 0;
        if (loom__kv_seq_table(e->kv, seq, g, &table, &n) != LOOM_OK) return false;
        for (int32_t i = 0; i < n; i++) held += table[i] != LOOM_KV_NO_BLOCK;
        if (held > e->swap[g].n_free) return false;
        total += held;
    }
    return total <= e->swap_list_cap;
}

loom_status loom__engine_swap_out(loom_engine *e, loom__req_sample *s) {
    LOOM_RETURN_IF(!swap_fits(e, s->kv_seq), LOOM_ERR_OUT_OF_MEMORY,
                   "engine: host swap space is full");
    LOOM_TRY(
        loom__kv_swap_out(e->kv, s->kv_seq, e->swap_blocks, e->swap_list_cap, s->swap_offsets));
    /* Slots first, so that a failed copy still leaves every slot where release finds it. */
    for (int32_t g = 0; g < e->n_groups; g++) {
        loom__engine_swap_area *a = &e->swap[g];
        for (int32_t j = s->swap_offsets[g]; j < s->swap_offsets[g + 1]; j++)
            s->swap_slots[j] = a->free[--a->n_free];
    }
    s->swapped = true;
    LOOM_TRY(move_blocks(e, s, s->swap_offsets, LOOM_COPY_TO_HOST));
    /* The blocks may be reused as soon as this returns: the copy must have landed. */
    return e->ops->synchronize(e->exec.stream);
}

loom_status loom__engine_swap_in(loom_engine *e, loom__req_sample *s) {
    int32_t offsets[LOOM_MAX_KV_GROUPS + 1];
    LOOM_TRY(loom__kv_swap_in(e->kv, s->kv_seq, e->swap_blocks, e->swap_list_cap, offsets));
    LOOM_TRY(move_blocks(e, s, offsets, LOOM_COPY_FROM_HOST));
    /* The host slots are given back for reuse: the copy must have read them first. */
    LOOM_TRY(e->ops->synchronize(e->exec.stream));
    release_slots(e, s);
    return LOOM_OK;
}

void loom__engine_release(loom_engine *e, loom__req_sample *s) {
    release_slots(e, s);
    if (s->kv_seq >= 0) {
        (void)loom__kv_seq_free(e->kv, s->kv_seq);
        s->kv_seq = -1;
    }
}
