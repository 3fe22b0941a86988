/* cpu_check.c — the CPU ops' check of the paged-KV descriptor they are handed (the tensor
 * checks every backend shares are in tensor/tensor_check.c). */
#include "backend/cpu/cpu_internal.h"

#include "core/status.h"
#include "tensor/op_check.h"
#include "tensor/types.h"

#include <stdint.h>

/* ------------------------------------------------------------------------------------------ */
/* The paged-KV descriptor                                                                    */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cpu_check_kv_use(const char *op, const loom_kv_desc *kv, int32_t layer,
                                   bool via_layer_src, int32_t *pool_layer) {
    LOOM_RETURN_IF(kv == NULL, LOOM_ERR_INVALID_ARG, "%s: kv descriptor is NULL", op);
    LOOM_RETURN_IF(!loom__cpu_kv_type_ok(kv->kv_type), LOOM_ERR_UNSUPPORTED,
                   "%s: kv type %s (cpu stores f16, bf16, f32, fp8_e4m3 and fp8_e5m2)", op,
                   loom__type_name(kv->kv_type));
    return loom__check_kv_use("cpu", op, kv, layer, via_layer_src, pool_layer);
}
