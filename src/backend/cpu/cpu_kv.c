/* cpu_kv.c — kv_store: writes a step's new K and V rows into a layer's paged pools.
 *
 * Row r of k and v belongs to sequence s (q_start[s] <= r < q_start[s+1]) at position
 * p = pos_start[s] + (r - q_start[s]); it goes to block block_ids[indptr[s] + p / block_size],
 * slot p % block_size, all heads contiguous, converted to the pool's type (F16 rounds to
 * nearest-even, as loom__f32_to_f16 does; F32 is copied). The whole descriptor is validated
 * before anything is written, so a bad block id leaves the pools untouched. */
#include "backend/cpu/cpu_internal.h"

#include "core/status.h"
#include "tensor/fp16.h"

#include <stdint.h>
#include <string.h>

/* Below this many elements the store runs on the calling thread only. */
#define KVS_INLINE_ELEMS 16384

typedef struct kvs_task {
    const loom_tensor *k; /* [T, n_kv_heads*head_dim] f32 */
    const loom_tensor *v; /* [T, n_kv_heads*head_dim] f32 */
    const loom_kv_desc *kv;
    char *k_pool; /* layer's K pool: [n_blocks][block_size][n_kv_heads][head_dim] */
    char *v_pool;
} kvs_task;

static void kvs_put_row(const loom_kv_desc *kv, const float *src, char *dst, int64_t n) {
    if (kv->kv_type == LOOM_TYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else {
        uint16_t *h = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) h[i] = loom__f32_to_f16(src[i]);
    }
}

static void kvs_worker(void *arg, int ith, int nth) {
    const kvs_task *t = arg;
    const loom_kv_desc *kv = t->kv;
    const int64_t n = t->k->ne[0];
    int64_t r0, r1;
    loom__split_range(t->k->ne[1], ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int32_t s = loom__cpu_seq_of_row(kv, r);
        int64_t p = (int64_t)kv->pos_start[s] + (r - kv->q_start[s]);
        size_t off = loom__cpu_kv_slot(kv, s, p);
        kvs_put_row(kv, loom__cpu_row(t->k, r), t->k_pool + off, n);
        kvs_put_row(kv, loom__cpu_row(t->v, r), t->v_pool + off, n);
    }
}

loom_status loom__cpu_kv_store(void *ctx, const loom_tensor *k, const loom_tensor *v,
                               const loom_kv_desc *kv, int32_t layer) {
    loom__cpu_ctx *c = ctx;
    int32_t pool_layer;
    LOOM_TRY(loom__cpu_check_kv_use("kv_store", kv, layer, false, &pool_layer));
    int64_t n_rows;
    LOOM_TRY(loom__check_kv_store(k, v, kv, &n_rows));
    const int64_t kv_dim = (int64_t)kv->n_kv_heads * kv->head_dim;
    if (n_rows == 0) return LOOM_OK;

    kvs_task t = {.k = k,
                  .v = v,
                  .kv = kv,
                  .k_pool = kv->k_base[pool_layer],
                  .v_pool = kv->v_base[pool_layer]};
    if (n_rows * kv_dim < KVS_INLINE_ELEMS || c->n_threads == 1)
        kvs_worker(&t, 0, 1);
    else
        loom__threadpool_run(c->tp, kvs_worker, &t);
    return LOOM_OK;
}
