/* cpu_check.c — the CPU ops' check of the paged-KV descriptor they are handed (the tensor
 * checks every backend shares are in tensor/tensor_check.c). */
#include "backend/cpu/cpu_internal.h"

#include "core/checked.h"
#include "core/status.h"
#include "tensor/types.h"

#include <stdint.h>

/* ------------------------------------------------------------------------------------------ */
/* The paged-KV descriptor                                                                    */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cpu_check_kv_use(const char *op, const loom_kv_desc *kv, int32_t layer,
                                   bool via_layer_src, int32_t *pool_layer) {
    LOOM_RETURN_IF(kv == NULL, LOOM_ERR_INVALID_ARG, "%s: kv descriptor is NULL", op);
    LOOM_RETURN_IF(kv->kv_type != LOOM_TYPE_F16 && kv->kv_type != LOOM_TYPE_F32,
                   LOOM_ERR_UNSUPPORTED, "%s: kv type %s (cpu stores f16 and f32)", op,
                   loom__type_name(kv->kv_type));
    LOOM_RETURN_IF(kv->layout != LOOM_KV_LAYOUT_NHD || kv->scale_kind != LOOM_KV_SCALE_NONE,
                   LOOM_ERR_UNSUPPORTED, "%s: kv layout %d with scales %d (cpu: NHD, no scales)",
                   op, (int)kv->layout, (int)kv->scale_kind);
    LOOM_RETURN_IF(layer < 0 || layer >= kv->n_layers, LOOM_ERR_INVALID_ARG,
                   "%s: layer %d outside [0, %d)", op, layer, kv->n_layers);
    int32_t src = via_layer_src && kv->layer_src != NULL ? kv->layer_src[layer] : layer;
    /* kv_store writes only the layers that own pools (a reusing layer stores nothing). */
    LOOM_RETURN_IF(!via_layer_src && kv->layer_src != NULL && kv->layer_src[layer] != layer,
                   LOOM_ERR_INVALID_ARG, "%s: layer %d reads layer %d's pools and stores none", op,
                   layer, kv->layer_src[layer]);
    *pool_layer = src;
    return LOOM_OK;
}
