/* backend.h — the backend registry: opening a model's backend by name (the built-in CPU one,
 * or a plugin libloom-<name>.so found next to libloom or on $LOOM_BACKEND_PATH), checking an
 * ops table's ABI version and required slots, and the thin wrappers the model and the engine
 * call instead of reaching into the table where a slot is optional.
 *
 * The model code computes only through a loom__backend's ops table (loom_backend.h) and the
 * streams it creates; it never includes a backend's own headers. */
#pragma once

#include "loom_backend.h"

/* A model's backend: the ops table, the device it opened, and the plugin it came from. */
typedef struct loom__backend {
    const loom_backend_ops *ops;
    void *dev;
    void *dl;       /* dlopen handle of the plugin; NULL for the built-in CPU backend */
    char name[32];  /* the backend's name ("cpu", "cuda", ...) */
    char path[512]; /* the plugin's file; "" for a built-in one */
} loom__backend;

/* Opens backend `name` (see loom_model_params.backend: "cpu", "auto" or NULL for the best
 * available, or a plugin's name) on device p->device. AUTO tries the plugins loom knows of in
 * order of preference ("cuda") and falls back to the CPU, logging at INFO why each was passed
 * over. Errors: INVALID_ARG (a name that is not [a-z0-9_-], 1 to 24 characters),
 * NO_DEVICE (the plugin's file is not found — the message lists where it was looked for —, it
 * cannot be loaded, or it finds no device), UNSUPPORTED (the plugin speaks another ABI
 * version), BACKEND (it exports no entry point, or its table lacks a required slot), and what
 * the backend's open returns. */
loom_status loom__backend_open(const char *name, const loom_backend_open_params *p,
                               loom__backend **out);

/* Closes the device and unloads the plugin. NULL is a no-op. */
void loom__backend_close(loom__backend *be);

/* Checks a table before use: its ABI version and every required slot ("what" names it in the
 * messages). Errors: UNSUPPORTED (ABI version), BACKEND (missing name or slot). */
loom_status loom__backend_check_ops(const loom_backend_ops *ops, const char *what);

/* Whether be runs the op as described (false for a NULL table or a missing slot). */
bool loom__backend_supports(const loom__backend *be, const loom_op_desc *op);

/* The built-in CPU backend's table (src/backend/cpu). */
const loom_backend_ops *loom__cpu_backend_ops(void);

/* The host callbacks every plugin is handed (errors into loom_last_error, lines into the
 * library's log). */
const loom_backend_host *loom__backend_host(void);

/* backend_plugin.c, for backend.c: finds libloom-<name>.so, loads it, calls its entry point and
 * checks its table; *path receives the file (path_cap bytes). Errors: as loom__backend_open. */
loom_status loom__backend_plugin_load(const char *name, const loom_backend_ops **ops, void **dl,
                                      char *path, size_t path_cap);
void loom__backend_plugin_unload(void *dl);

/* For the tests and benchmarks that call ops directly: a backend (cpu, or any name
 * loom__backend_open takes) with one stream made without a step shape (its scratch grows on
 * demand). ops and ctx (the stream) are what the ops take; dev what buffer and weight slots
 * take. */
typedef struct loom__backend_stream {
    loom__backend *be;
    const loom_backend_ops *ops;
    void *dev;
    void *ctx; /* the stream */
} loom__backend_stream;

loom_status loom__backend_stream_open(const char *name, const loom_backend_open_params *p,
                                      loom__backend_stream *out);
void loom__backend_stream_close(loom__backend_stream *bs);
