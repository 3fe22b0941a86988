/* cuda_backend.c — the CUDA backend's ops table, its supports() query, and the plugin's entry
 * point: libloom-cuda.so is opened by libloom only when a model asks for the cuda backend (or
 * AUTO finds it), so libloom never links the CUDA runtime. */
#include "backend/cuda/cuda_internal.h"

#include "backend/plugin/plugin_host.h"
#include "tensor/types.h"

static bool cuda_supports(void *dev, const loom_op_desc *op) {
    (void)dev;
    if (op == NULL) return false;
    switch (op->op) {
    case LOOM_OP_GET_ROWS:
    case LOOM_OP_MATMUL: {
        /* every type loom decodes: the kernels' own in place (FP8 weight rows among them), the
         * rest as bf16 (prepare) */
        const loom__type_traits *tr = loom__type_get_traits(op->type);
        return tr != NULL && tr->can_dequantize;
    }
    case LOOM_OP_KV_STORE:
    case LOOM_OP_ATTENTION:
        return (((op->type == LOOM_TYPE_F16 || op->type == LOOM_TYPE_BF16 ||
                  op->type == LOOM_TYPE_F32) &&
                 op->scale_kind == LOOM_KV_SCALE_NONE) ||
                ((op->type == LOOM_TYPE_FP8_E4M3 || op->type == LOOM_TYPE_FP8_E5M2) &&
                 op->scale_kind == LOOM_KV_SCALE_PER_TOKEN_HEAD)) &&
               op->layout == LOOM_KV_LAYOUT_NHD &&
               (op->kv_flags == 0 ||
                (op->kv_flags == LOOM_KV_MERGED && op->scale_kind == LOOM_KV_SCALE_NONE)) &&
               op->window >= 0 && op->softcap >= 0.0f &&
               (op->op == LOOM_OP_KV_STORE
                    ? op->head_dim >= 1
                    : loom__cuda_attention_shape_ok(op->n_head, op->n_kv_heads, op->head_dim));
    case LOOM_OP_RMS_NORM:
    case LOOM_OP_ROPE:
    case LOOM_OP_GLU:
    case LOOM_OP_ADD:
    case LOOM_OP_SCALE:
        return op->type == LOOM_TYPE_F32;
    case LOOM_OP_COUNT_:
        break;
    }
    return false;
}

static const loom_backend_ops cuda_ops = {
    .abi_version = LOOM_BACKEND_ABI_VERSION,
    .name = "cuda",
    .open = loom__cuda_open,
    .close = loom__cuda_close,
    .memory_info = loom__cuda_memory_info,
    .supports = cuda_supports,
    .buffer_alloc = loom__cuda_buffer_alloc,
    .buffer_free = loom__cuda_buffer_free,
    .buffer_base = loom__cuda_buffer_base,
    .host_alloc = loom__cuda_host_alloc,
    .host_free = loom__cuda_host_free,
    .weight_prepare = loom__cuda_weight_prepare,
    .workspace_size = loom__cuda_workspace_size,
    .stream_create = loom__cuda_stream_create,
    .stream_destroy = loom__cuda_stream_destroy,
    .tensor_set = loom__cuda_tensor_set,
    .tensor_get = loom__cuda_tensor_get,
    .copy_batch = loom__cuda_copy_batch,
    .synchronize = loom__cuda_synchronize,
    .step_begin = loom__cuda_step_begin,
    .get_rows = loom__cuda_get_rows_op,
    .matmul = loom__cuda_matmul_op,
    .matmul_multi = loom__cuda_matmul_multi_op,
    .rms_norm = loom__cuda_rms_norm_op,
    .rope = loom__cuda_rope_op,
    .kv_store = loom__cuda_kv_store_op,
    .attention = loom__cuda_attention_op,
    .glu = loom__cuda_glu_op,
    .add = loom__cuda_add_op,
    .scale = loom__cuda_scale_op,
    .add_rms_norm = loom__cuda_add_rms_norm_op,
    .logits_summary = loom__cuda_logits_summary_op,
    .norm_rope_store = loom__cuda_norm_rope_store_op,
    .norm_add_rms_norm = loom__cuda_norm_add_rms_norm_op,
};

LOOM_BACKEND_EXPORT loom_status loom_backend_entry(uint32_t abi_version,
                                                   const loom_backend_host *host,
                                                   const loom_backend_ops **ops);

LOOM_BACKEND_EXPORT loom_status loom_backend_entry(uint32_t abi_version,
                                                   const loom_backend_host *host,
                                                   const loom_backend_ops **ops) {
    return loom__plugin_entry(abi_version, host, &cuda_ops, "cuda", ops);
}
