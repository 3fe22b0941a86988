/* cpu_backend.c — the CPU backend's ops table and its supports() query. The device lives in
 * cpu_device.c, the streams in cpu_stream.c, the ops in one file per family. */
#include "backend/cpu/cpu_internal.h"

#include "tensor/types.h"

static bool cpu_supports(void *dev, const loom_op_desc *op) {
    (void)dev;
    if (op == NULL) return false;
    switch (op->op) {
    case LOOM_OP_GET_ROWS:
    case LOOM_OP_MATMUL: {
        const loom__type_traits *tr = loom__type_get_traits(op->type);
        return tr != NULL && tr->can_dequantize;
    }
    case LOOM_OP_KV_STORE:
    case LOOM_OP_ATTENTION:
        /* any head size, window and soft-cap; float values in token-major pages */
        return loom__cpu_kv_type_ok(op->type) && op->layout == LOOM_KV_LAYOUT_NHD &&
               op->scale_kind == loom__kv_scale_kind_of(op->type) &&
               (op->kv_flags == 0 ||
                (op->kv_flags == LOOM_KV_HADAMARD && op->head_dim <= LOOM_CPU_HADAMARD_MAX &&
                 (op->head_dim & (op->head_dim - 1)) == 0) ||
                (op->kv_flags == LOOM_KV_MERGED &&
                 (op->type == LOOM_TYPE_F16 || op->type == LOOM_TYPE_BF16 ||
                  op->type == LOOM_TYPE_F32))) &&
               op->head_dim >= 1 && op->window >= 0 && op->softcap >= 0.0f;
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

static const loom_backend_ops cpu_ops = {
    .abi_version = LOOM_BACKEND_ABI_VERSION,
    .name = "cpu",
    .open = loom__cpu_open,
    .close = loom__cpu_close,
    .memory_info = loom__cpu_memory_info,
    .supports = cpu_supports,
    .buffer_alloc = loom__cpu_buffer_alloc,
    .buffer_free = loom__cpu_buffer_free,
    .buffer_base = loom__cpu_buffer_base,
    .host_alloc = loom__cpu_host_alloc,
    .host_free = loom__cpu_host_free,
    .weight_prepare = loom__cpu_weight_prepare,
    .workspace_size = loom__cpu_workspace_size,
    .stream_create = loom__cpu_stream_create,
    .stream_destroy = loom__cpu_stream_destroy,
    .tensor_set = loom__cpu_tensor_set,
    .tensor_get = loom__cpu_tensor_get,
    .copy_batch = loom__cpu_copy_batch,
    .synchronize = loom__cpu_synchronize,
    .step_begin = NULL, /* ops read the host descriptors directly */
    .get_rows = loom__cpu_get_rows,
    .matmul = loom__cpu_matmul,
    .matmul_multi = loom__cpu_matmul_multi,
    .rms_norm = loom__cpu_rms_norm,
    .rope = loom__cpu_rope,
    .kv_store = loom__cpu_kv_store,
    .attention = loom__cpu_attention,
    .glu = loom__cpu_glu,
    .add = loom__cpu_add,
    .scale = loom__cpu_scale,
};

const loom_backend_ops *loom__cpu_backend_ops(void) {
    return &cpu_ops;
}
