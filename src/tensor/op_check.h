/* op_check.h — the argument checks of each backend op (loom_backend.h), shared by the CPU
 * backend and the CUDA plugin so that both accept and refuse the same calls with the same
 * statuses and messages. Each looks at views, shapes and parameters only, never at data
 * behind a backend address (what a backend can check only on its own memory — the ids of
 * get_rows, rope's frequency factors — it checks itself). */
#pragma once

#include <stdbool.h>

#include "loom_backend.h"

/* backend names the backend in messages ("cpu") where a type is refused. */
loom_status loom__check_get_rows(const char *backend, const loom_tensor *table,
                                 const loom_tensor *ids, const loom_tensor *out);
loom_status loom__check_matmul(const char *backend, const loom_tensor *w, const loom_tensor *x,
                               const loom_tensor *out);
/* matmul_multi: 1 .. LOOM_MATMUL_MULTI_MAX matmuls of one x, each with matmul's checks, no out
 * overlapping another's w or another out. */
loom_status loom__check_matmul_multi(const char *backend, int n, const loom_tensor *const *ws,
                                     const loom_tensor *x, loom_tensor *const *outs);
loom_status loom__check_rms_norm(const loom_tensor *x, const loom_tensor *w, float eps,
                                 const loom_tensor *out);
loom_status loom__check_add(const loom_tensor *a, const loom_tensor *b, const loom_tensor *out);
/* add_rms_norm: y of x's shape, then rms_norm's checks, and out apart from x and y. */
loom_status loom__check_add_rms_norm(const loom_tensor *x, const loom_tensor *y,
                                     const loom_tensor *w, float eps, const loom_tensor *out);
loom_status loom__check_scale(const loom_tensor *x, const loom_tensor *out);
loom_status loom__check_glu(const loom_tensor *gate, const loom_tensor *up, loom_glu_kind kind,
                            const loom_tensor *out);
/* rope's parameters and positions (not the values of p->freq_factors). */
loom_status loom__check_rope(const loom_tensor *x, const loom_tensor *pos,
                             const loom_rope_params *p);

/* The descriptor's layout, scales and layer for op (kv_store: a layer that owns pools or the
 * later layer of a merged pair; attention, via_layer_src: any layer, reading layer_src's):
 * *pool_layer = the layer whose pools the op uses. The element type is the backend's to check. */
loom_status loom__check_kv_use(const char *backend, const char *op, const loom_kv_desc *kv,
                               int32_t layer, bool via_layer_src, int32_t *pool_layer);
/* kv_store's tensors against the descriptor; *n_rows = the step's new rows. */
loom_status loom__check_kv_store(const loom_tensor *k, const loom_tensor *v, const loom_kv_desc *kv,
                                 int64_t *n_rows);
/* attention's tensors and parameters against the descriptor; *n_rows = the step's new rows. */
loom_status loom__check_attention(const loom_tensor *q, const loom_kv_desc *kv,
                                  const loom_attn_params *p, const loom_tensor *out,
                                  int64_t *n_rows);
