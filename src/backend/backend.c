/* backend.c — registering a backend's ops table, and the thin wrappers every caller uses
 * instead of reaching into the table (destroy, supports). */
#include "backend/backend.h"

#include "core/status.h"

#include <stdlib.h>

/* The slot named `field` must be set; its name goes into the message. */
#define LOOM__REQUIRE_SLOT(ops, field)                                                             \
    LOOM_RETURN_IF((ops)->field == NULL, LOOM_ERR_INVALID_ARG,                                     \
                   "backend '%s': required slot '%s' is NULL", (ops)->name, #field)

static loom_status check_slots(const loom_backend_ops *ops) {
    LOOM__REQUIRE_SLOT(ops, destroy);
    LOOM__REQUIRE_SLOT(ops, supports);
    LOOM__REQUIRE_SLOT(ops, buffer_alloc);
    /* buffer_wrap_host is optional: callers fall back to alloc + tensor_set. */
    LOOM__REQUIRE_SLOT(ops, buffer_free);
    LOOM__REQUIRE_SLOT(ops, buffer_base);
    LOOM__REQUIRE_SLOT(ops, tensor_set);
    LOOM__REQUIRE_SLOT(ops, tensor_get);
    LOOM__REQUIRE_SLOT(ops, copy);
    LOOM__REQUIRE_SLOT(ops, synchronize);
    LOOM__REQUIRE_SLOT(ops, get_rows);
    LOOM__REQUIRE_SLOT(ops, matmul);
    LOOM__REQUIRE_SLOT(ops, rms_norm);
    LOOM__REQUIRE_SLOT(ops, rope);
    LOOM__REQUIRE_SLOT(ops, kv_store);
    LOOM__REQUIRE_SLOT(ops, attention);
    LOOM__REQUIRE_SLOT(ops, glu);
    LOOM__REQUIRE_SLOT(ops, add);
    LOOM__REQUIRE_SLOT(ops, scale);
    LOOM__REQUIRE_SLOT(ops, softmax);
    return LOOM_OK;
}

/* On failure ctx stays owned by the caller (it is not destroyed). */
loom_status loom__backend_register(const loom_backend_ops *ops, void *ctx, loom__backend **out) {
    LOOM_CHECK_ARG(ops != NULL);
    LOOM_CHECK_ARG(out != NULL);
    LOOM_RETURN_IF(ops->name == NULL, LOOM_ERR_INVALID_ARG, "backend: ops table has no name");
    LOOM_RETURN_IF(ops->abi_version != LOOM_BACKEND_ABI_VERSION, LOOM_ERR_UNSUPPORTED,
                   "backend '%s': ABI version %u, this library speaks %u", ops->name,
                   (unsigned)ops->abi_version, (unsigned)LOOM_BACKEND_ABI_VERSION);
    LOOM_TRY(check_slots(ops));

    loom__backend *be = malloc(sizeof *be);
    LOOM_RETURN_IF(be == NULL, LOOM_ERR_OUT_OF_MEMORY, "backend '%s': out of memory", ops->name);
    be->ops = ops;
    be->ctx = ctx;
    *out = be;
    return LOOM_OK;
}

void loom__backend_destroy(loom__backend *be) {
    if (be == NULL) return;
    be->ops->destroy(be->ctx);
    free(be);
}

/* The op slot that runs op, so a NULL slot (a future optional op) reads as unsupported. */
static bool op_slot_present(const loom_backend_ops *ops, loom_op op) {
    switch (op) {
    case LOOM_OP_GET_ROWS:
        return ops->get_rows != NULL;
    case LOOM_OP_MATMUL:
        return ops->matmul != NULL;
    case LOOM_OP_RMS_NORM:
        return ops->rms_norm != NULL;
    case LOOM_OP_ROPE:
        return ops->rope != NULL;
    case LOOM_OP_KV_STORE:
        return ops->kv_store != NULL;
    case LOOM_OP_ATTENTION:
        return ops->attention != NULL;
    case LOOM_OP_GLU:
        return ops->glu != NULL;
    case LOOM_OP_ADD:
        return ops->add != NULL;
    case LOOM_OP_SCALE:
        return ops->scale != NULL;
    case LOOM_OP_SOFTMAX:
        return ops->softmax != NULL;
    case LOOM_OP_COUNT_:
        break;
    }
    return false;
}

bool loom__backend_supports(const loom__backend *be, loom_op op, loom_type type) {
    if (be == NULL || be->ops == NULL) return false;
    if (!op_slot_present(be->ops, op)) return false;
    return be->ops->supports(be->ctx, op, type);
}
