/* backend.c — checking an ops table, opening a backend by name (built in, or a plugin through
 * backend_plugin.c), AUTO's preference order, and the supports() wrapper. */
#include "backend/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/status.h"

/* Plugins AUTO tries before the CPU, best first. */
static const char *const auto_order[] = {"cuda"};

/* ---- checking a table ---------------------------------------------------------------------- */

/* The slot named `field` must be set; its name goes into the message. */
#define LOOM__REQUIRE_SLOT(ops, field)                                                             \
    LOOM_RETURN_IF((ops)->field == NULL, LOOM_ERR_BACKEND, "%s: required slot '%s' is NULL", what, \
                   #field)

loom_status loom__backend_check_ops(const loom_backend_ops *ops, const char *what) {
    LOOM_RETURN_IF(ops == NULL, LOOM_ERR_BACKEND, "%s: no ops table", what);
    LOOM_RETURN_IF(ops->abi_version != LOOM_BACKEND_ABI_VERSION, LOOM_ERR_UNSUPPORTED,
                   "%s: backend ABI version %u, this library speaks %u", what,
                   (unsigned)ops->abi_version, (unsigned)LOOM_BACKEND_ABI_VERSION);
    LOOM_RETURN_IF(ops->name == NULL || ops->name[0] == '\0', LOOM_ERR_BACKEND,
                   "%s: the ops table has no name", what);
    LOOM__REQUIRE_SLOT(ops, open);
    LOOM__REQUIRE_SLOT(ops, close);
    LOOM__REQUIRE_SLOT(ops, memory_info);
    LOOM__REQUIRE_SLOT(ops, supports);
    LOOM__REQUIRE_SLOT(ops, buffer_alloc);
    LOOM__REQUIRE_SLOT(ops, buffer_free);
    LOOM__REQUIRE_SLOT(ops, buffer_base);
    LOOM__REQUIRE_SLOT(ops, host_alloc);
    LOOM__REQUIRE_SLOT(ops, host_free);
    LOOM__REQUIRE_SLOT(ops, weight_prepare);
    /* workspace_size is optional: a backend with no workspace worth counting. */
    LOOM__REQUIRE_SLOT(ops, stream_create);
    LOOM__REQUIRE_SLOT(ops, stream_destroy);
    LOOM__REQUIRE_SLOT(ops, tensor_set);
    LOOM__REQUIRE_SLOT(ops, tensor_get);
    LOOM__REQUIRE_SLOT(ops, copy_batch);
    LOOM__REQUIRE_SLOT(ops, synchronize);
    /* step_begin is optional: ops that read the host descriptors need nothing per step. */
    LOOM__REQUIRE_SLOT(ops, get_rows);
    LOOM__REQUIRE_SLOT(ops, matmul);
    /* matmul_multi is optional: the caller makes one matmul call per weight. */
    LOOM__REQUIRE_SLOT(ops, rms_norm);
    LOOM__REQUIRE_SLOT(ops, rope);
    LOOM__REQUIRE_SLOT(ops, kv_store);
    LOOM__REQUIRE_SLOT(ops, attention);
    LOOM__REQUIRE_SLOT(ops, glu);
    LOOM__REQUIRE_SLOT(ops, add);
    LOOM__REQUIRE_SLOT(ops, scale);
    return LOOM_OK;
}

/* ---- opening ------------------------------------------------------------------------------- */

static bool valid_name(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 24) return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* Opens the named backend (not AUTO). */
static loom_status open_named(const char *name, const loom_backend_open_params *p,
                              loom__backend **out) {
    loom__backend *be = loom__calloc(1, sizeof *be);
    LOOM_RETURN_IF(be == NULL, LOOM_ERR_OUT_OF_MEMORY, "backend: out of memory");
    loom_status st;
    if (strcmp(name, "cpu") == 0) {
        be->ops = loom__cpu_backend_ops();
        st = loom__backend_check_ops(be->ops, "built-in backend cpu");
    } else {
        st = loom__backend_plugin_load(name, &be->ops, &be->dl, be->path, sizeof be->path);
    }
    if (st == LOOM_OK) {
        snprintf(be->name, sizeof be->name, "%s", be->ops->name);
        st = be->ops->open(p, &be->dev);
        if (st != LOOM_OK) {
            be->dev = NULL;
            loom__error_prefix("backend %s%s%s", name, be->path[0] ? " from " : "", be->path);
        }
    }
    if (st != LOOM_OK) {
        loom__backend_close(be);
        return st;
    }
    *out = be;
    return LOOM_OK;
}

loom_status loom__backend_open(const char *name, const loom_backend_open_params *p,
                               loom__backend **out) {
    LOOM_CHECK_ARG(p != NULL && out != NULL);
    if (name != NULL && strcmp(name, "auto") != 0) {
        LOOM_RETURN_IF(!valid_name(name), LOOM_ERR_INVALID_ARG,
                       "backend name '%.40s' (expected \"cpu\", \"auto\" or a plugin's name: "
                       "1 to 24 of a-z, 0-9, _ and -)",
                       name);
        return open_named(name, p, out);
    }
    for (size_t i = 0; i < sizeof auto_order / sizeof *auto_order; i++) {
        if (open_named(auto_order[i], p, out) == LOOM_OK) {
            LOOM_LOG_I("backend auto: using %s", (*out)->name);
            return LOOM_OK;
        }
        LOOM_LOG_I("backend auto: %s is not available (%s); trying the next", auto_order[i],
                   loom_last_error());
    }
    loom__clear_error();
    LOOM_LOG_I("backend auto: using the cpu");
    return open_named("cpu", p, out);
}

void loom__backend_close(loom__backend *be) {
    if (be == NULL) return;
    if (be->dev != NULL) be->ops->close(be->dev);
    if (be->dl != NULL) loom__backend_plugin_unload(be->dl);
    free(be);
}

bool loom__backend_supports(const loom__backend *be, const loom_op_desc *op) {
    if (be == NULL || be->ops == NULL || op == NULL) return false;
    return be->ops->supports(be->dev, op);
}

loom_status loom__backend_stream_open(const char *name, const loom_backend_open_params *p,
                                      loom__backend_stream *out) {
    LOOM_CHECK_ARG(out != NULL);
    memset(out, 0, sizeof *out);
    LOOM_TRY(loom__backend_open(name, p, &out->be));
    out->ops = out->be->ops;
    out->dev = out->be->dev;
    loom_status st = out->ops->stream_create(out->dev, NULL, &out->ctx);
    if (st != LOOM_OK) loom__backend_stream_close(out);
    return st;
}

void loom__backend_stream_close(loom__backend_stream *bs) {
    if (bs == NULL) return;
    if (bs->ctx != NULL) bs->ops->stream_destroy(bs->ctx);
    loom__backend_close(bs->be);
    memset(bs, 0, sizeof *bs);
}
