/* fake_plugin.c — backend plugins that go wrong, for test_backend_plugin.c. Written as a plugin
 * author would: only loom_backend.h, reaching libloom through the host callbacks. Built several
 * times, one variant each (tests/CMakeLists.txt):
 *   FAKE_NO_DEVICE  a complete table whose open() finds no device (a driver that is not
 *                   installed): built as libloom-nodevice.so, and as libloom-cuda.so in a
 *                   folder of its own, which AUTO must pass over;
 *   FAKE_OLD_ABI    a table that says it speaks ABI version 2;
 *   FAKE_NO_SLOT    a table without its attention slot;
 *   FAKE_REFUSE     an entry point that refuses the host's ABI version, as a plugin built for
 *                   another version would;
 *   FAKE_NO_ENTRY   no entry point at all. */
#include "loom_backend.h"

#include <stddef.h>

static const loom_backend_host *g_host;

static loom_status fail(loom_status st, const char *message) {
    if (g_host != NULL) g_host->set_error(message);
    return st;
}

/* Every slot of a complete table; none but open is ever reached. */
static loom_status fake_open(const loom_backend_open_params *p, void **dev) {
    (void)p;
    (void)dev;
    if (g_host != NULL) g_host->log(LOOM_LOG_INFO, "fake: looking for a device");
    return fail(LOOM_ERR_NO_DEVICE, "fake: no driver (libfakedriver.so.1 is not installed)");
}
static void fake_close(void *dev) {
    (void)dev;
}
static loom_status fake_memory_info(void *dev, size_t *f, size_t *t) {
    (void)dev, (void)f, (void)t;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static bool fake_supports(void *dev, const loom_op_desc *op) {
    (void)dev, (void)op;
    return false;
}
static loom_status fake_buffer_alloc(void *dev, size_t n, loom_buffer **out) {
    (void)dev, (void)n, (void)out;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static void fake_buffer_free(void *dev, loom_buffer *b) {
    (void)dev, (void)b;
}
static void *fake_buffer_base(void *dev, loom_buffer *b) {
    (void)dev, (void)b;
    return NULL;
}
static loom_status fake_host_alloc(void *dev, size_t n, void **out) {
    (void)dev, (void)n, (void)out;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static void fake_host_free(void *dev, void *p) {
    (void)dev, (void)p;
}
static loom_status fake_weight_prepare(void *dev, const loom_weight_src *s, loom_tensor *o) {
    (void)dev, (void)s, (void)o;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static loom_status fake_stream_create(void *dev, const loom_step_shape *sh, void **out) {
    (void)dev, (void)sh, (void)out;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static void fake_stream_destroy(void *s) {
    (void)s;
}
static loom_status fake_move(void *s, void *dst, const void *src, size_t n) {
    (void)s, (void)dst, (void)src, (void)n;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static loom_status fake_copy_batch(void *s, loom_copy_kind k, const loom_copy_range *r, size_t n) {
    (void)s, (void)k, (void)r, (void)n;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static loom_status fake_sync(void *s) {
    (void)s;
    return LOOM_OK;
}
static loom_status fake_get_rows(void *s, const loom_tensor *t, const loom_tensor *i,
                                 loom_tensor *o) {
    (void)s, (void)t, (void)i, (void)o;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static loom_status fake_matmul(void *s, const loom_tensor *w, const loom_tensor *x,
                               loom_tensor *o) {
    (void)s, (void)w, (void)x, (void)o;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static loom_status fake_rms_norm(void *s, const loom_tensor *x, const loom_tensor *w, float e,
                                 loom_tensor *o) {
    (void)s, (void)x, (void)w, (void)e, (void)o;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static loom_status fake_rope(void *s, loom_tensor *x, const loom_tensor *p,
                             const loom_rope_params *r) {
    (void)s, (void)x, (void)p, (void)r;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static loom_status fake_kv_store(void *s, const loom_tensor *k, const loom_tensor *v,
                                 const loom_kv_desc *d, int32_t l) {
    (void)s, (void)k, (void)v, (void)d, (void)l;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
__attribute__((unused)) static loom_status fake_attention(void *s, const loom_tensor *q,
                                                          const loom_kv_desc *d,
                                                          const loom_attn_params *p,
                                                          loom_tensor *o) {
    (void)s, (void)q, (void)d, (void)p, (void)o;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static loom_status fake_glu(void *s, const loom_tensor *g, const loom_tensor *u, loom_glu_kind k,
                            loom_tensor *o) {
    (void)s, (void)g, (void)u, (void)k, (void)o;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static loom_status fake_add(void *s, const loom_tensor *a, const loom_tensor *b, loom_tensor *o) {
    (void)s, (void)a, (void)b, (void)o;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}
static loom_status fake_scale(void *s, const loom_tensor *x, float f, loom_tensor *o) {
    (void)s, (void)x, (void)f, (void)o;
    return fail(LOOM_ERR_BACKEND, "fake: unreachable");
}

__attribute__((unused)) static const loom_backend_ops fake_ops = {
#if defined(FAKE_OLD_ABI)
    .abi_version = 2,
#else
    .abi_version = LOOM_BACKEND_ABI_VERSION,
#endif
    .name = "fake",
    .open = fake_open,
    .close = fake_close,
    .memory_info = fake_memory_info,
    .supports = fake_supports,
    .buffer_alloc = fake_buffer_alloc,
    .buffer_free = fake_buffer_free,
    .buffer_base = fake_buffer_base,
    .host_alloc = fake_host_alloc,
    .host_free = fake_host_free,
    .weight_prepare = fake_weight_prepare,
    .stream_create = fake_stream_create,
    .stream_destroy = fake_stream_destroy,
    .tensor_set = fake_move,
    .tensor_get = fake_move,
    .copy_batch = fake_copy_batch,
    .synchronize = fake_sync,
    .get_rows = fake_get_rows,
    .matmul = fake_matmul,
    .rms_norm = fake_rms_norm,
    .rope = fake_rope,
    .kv_store = fake_kv_store,
#if defined(FAKE_NO_SLOT)
    .attention = NULL,
#else
    .attention = fake_attention,
#endif
    .glu = fake_glu,
    .add = fake_add,
    .scale = fake_scale,
};

#if !defined(FAKE_NO_ENTRY)
LOOM_BACKEND_EXPORT loom_status loom_backend_entry(uint32_t abi_version,
                                                   const loom_backend_host *host,
                                                   const loom_backend_ops **ops);

LOOM_BACKEND_EXPORT loom_status loom_backend_entry(uint32_t abi_version,
                                                   const loom_backend_host *host,
                                                   const loom_backend_ops **ops) {
    g_host = host;
#if defined(FAKE_REFUSE)
    (void)abi_version;
    (void)ops;
    return fail(LOOM_ERR_UNSUPPORTED, "fake: built for backend ABI 99");
#else
    if (abi_version != LOOM_BACKEND_ABI_VERSION)
        return fail(LOOM_ERR_UNSUPPORTED, "fake: built for another backend ABI");
    *ops = &fake_ops;
    return LOOM_OK;
#endif
}
#else
/* Something to export, so the library is not empty. */
LOOM_BACKEND_EXPORT int loom_fake_plugin_without_entry(void);
LOOM_BACKEND_EXPORT int loom_fake_plugin_without_entry(void) {
    return (int)sizeof fake_ops;
}
#endif
