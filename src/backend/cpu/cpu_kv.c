/* cpu_kv.c — kv_store: writes a step's new K and V rows into a layer's paged pools.
 *
 * Row r of k and v belongs to sequence s (q_start[s] <= r < q_start[s+1]) at position
 * p = pos_start[s] + (r - q_start[s]); it goes to block block_ids[indptr[s] + p / block_size],
 * slot p % block_size, all heads contiguous, converted to the pool's type (F16 and BF16 round
 * to nearest-even, as loom__f32_to_f16 / loom__f32_to_bf16 do; F32 is copied). FP8 pools store
 * each head's row x as fp8(x / s), s = max|x| / the format's largest finite value (loom.h's
 * loom_kv_cache_type), s in the slot's scale; a row of zeros gets s = 0 and zero codes; a row
 * with a NaN gets s = NaN, so it reads back as NaN rather than as a made-up finite value. The
 * whole descriptor is validated before anything is written, so a bad block id leaves the pools
 * untouched. The layers of merged pairs store through cpu_kv_merge.c. */
#include "backend/cpu/cpu_internal.h"

#include "core/status.h"
#include "tensor/fp16.h"
#include "tensor/fp8.h"

#include <math.h>
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
    char *k_scale, *v_scale; /* FP8: the layer's scale pools; NULL otherwise */
    float *const *scratch;   /* LOOM_KV_HADAMARD: per-thread room for one rotated row */
} kvs_task;

/* The row to store: src itself, or (LOOM_KV_HADAMARD) its heads rotated into tmp. */
static const float *kvs_source(const loom_kv_desc *kv, const float *src, float *tmp) {
    if (!(kv->kv_flags & LOOM_KV_HADAMARD)) return src;
    memcpy(tmp, src, (size_t)kv->n_kv_heads * (size_t)kv->head_dim * sizeof(float));
    for (int32_t h = 0; h < kv->n_kv_heads; h++)
        loom__cpu_hadamard(tmp + (size_t)h * kv->head_dim, kv->head_dim);
    return tmp;
}

/* One head's row of an FP8 pool: the scale, then the codes. */
static void kvs_put_fp8(bool e4m3, const float *src, uint8_t *dst, float *scale, int64_t n) {
    float amax = 0.0f;
    bool nan = false;
    for (int64_t i = 0; i < n; i++) {
        const float a = fabsf(src[i]);
        nan |= a != a;
        amax = a > amax ? a : amax;
    }
    const float s = nan ? NAN : amax / (e4m3 ? 448.0f : 57344.0f);
    *scale = s;
    for (int64_t i = 0; i < n; i++) {
        const float x = s > 0.0f ? src[i] / s : 0.0f; /* s = 0: every element is 0 */
        dst[i] = e4m3 ? loom__f32_to_fp8_e4m3(x) : loom__f32_to_fp8_e5m2(x);
    }
}

void loom__cpu_kv_put_row(const loom_kv_desc *kv, const float *src, char *dst, char *scales,
                          int64_t n) {
    switch (kv->kv_type) {
    case LOOM_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case LOOM_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = loom__f32_to_bf16(src[i]);
        break;
    case LOOM_TYPE_FP8_E4M3:
    case LOOM_TYPE_FP8_E5M2:
        for (int32_t h = 0; h < kv->n_kv_heads; h++) {
            float s;
            kvs_put_fp8(kv->kv_type == LOOM_TYPE_FP8_E4M3, src + (size_t)h * kv->head_dim,
                        (uint8_t *)dst + (size_t)h * kv->head_dim, &s, kv->head_dim);
            memcpy(scales + (size_t)h * sizeof(float), &s, sizeof s);
        }
        break;
    default:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = loom__f32_to_f16(src[i]);
        break;
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
        size_t soff = loom__cpu_kv_scale_slot(kv, s, p);
        float *tmp = t->scratch[ith];
        loom__cpu_kv_put_row(kv, kvs_source(kv, loom__cpu_row(t->k, r), tmp), t->k_pool + off,
                             t->k_scale ? t->k_scale + soff : NULL, n);
        loom__cpu_kv_put_row(kv, kvs_source(kv, loom__cpu_row(t->v, r), tmp), t->v_pool + off,
                             t->v_scale ? t->v_scale + soff : NULL, n);
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
    if (loom__cpu_merge_role(kv, layer) != LOOM_CPU_MERGE_NONE)
        return loom__cpu_kv_store_merged(c, k, v, kv, layer, pool_layer, n_rows);

    if (kv->kv_flags & LOOM_KV_HADAMARD) LOOM_TRY(loom__cpu_reserve_scratch(c, (size_t)kv_dim));
    kvs_task t = {.k = k,
                  .v = v,
                  .kv = kv,
                  .k_pool = kv->k_base[pool_layer],
                  .v_pool = kv->v_base[pool_layer],
                  .k_scale = kv->k_scale ? kv->k_scale[pool_layer] : NULL,
                  .v_scale = kv->v_scale ? kv->v_scale[pool_layer] : NULL,
                  .scratch = c->scratch};
    if (n_rows * kv_dim < KVS_INLINE_ELEMS || c->n_threads == 1)
        kvs_worker(&t, 0, 1);
    else
        loom__threadpool_run(c->tp, kvs_worker, &t);
    return LOOM_OK;
}
