/* cpu_backend.c — the CPU backend object: its context (thread pool, per-thread scratch), host
 * buffers, memory ops, the supports() query, and the ops table.
 *
 * Every op runs synchronously on the calling thread plus the pool's workers, so results are
 * visible when the op returns and synchronize() has nothing to wait for. Backend addresses
 * are host addresses: tensor_set / tensor_get are memcpy. */
#include "backend/cpu/cpu_internal.h"

#include "core/checked.h"
#include "core/status.h"
#include "tensor/types.h"

#include <stdlib.h>
#include <string.h>

#define LOOM_CPU_ALIGN 64

/* Initial per-thread scratch (floats): a 4-row matmul group for K up to 16384, and far more
 * than attention, rope or norm need for any head size loom runs. Larger shapes grow it once. */
#define LOOM_CPU_SCRATCH_INIT (4 * 16384)

struct loom_buffer {
    void *base;
    size_t bytes;
    bool owned; /* false for buffer_wrap_host: the caller keeps the memory */
};

/* ------------------------------------------------------------------------------------------ */
/* Context and scratch                                                                        */
/* ------------------------------------------------------------------------------------------ */

static void *aligned_bytes(size_t bytes) {
    size_t rounded;
    if (bytes == 0) bytes = 1;
    if (loom__add_overflow_size(bytes, LOOM_CPU_ALIGN - 1, &rounded)) return NULL;
    rounded -= rounded % LOOM_CPU_ALIGN; /* aligned_alloc wants a multiple of the alignment */
    return aligned_alloc(LOOM_CPU_ALIGN, rounded);
}

loom_status loom__cpu_reserve_scratch(loom__cpu_ctx *c, size_t n_floats) {
    if (n_floats <= c->scratch_cap) return LOOM_OK;
    size_t bytes;
    LOOM_RETURN_IF(loom__mul_overflow_size(n_floats, sizeof(float), &bytes), LOOM_ERR_INVALID_ARG,
                   "cpu: scratch of %zu floats overflows", n_floats);
    /* Allocate every new buffer before freeing any old one, so failure leaves c unchanged. */
    float **fresh = calloc((size_t)c->n_threads, sizeof *fresh);
    LOOM_RETURN_IF(fresh == NULL, LOOM_ERR_OUT_OF_MEMORY, "cpu: out of memory for scratch");
    for (int i = 0; i < c->n_threads; i++) {
        fresh[i] = aligned_bytes(bytes);
        if (fresh[i] == NULL) {
            for (int j = 0; j < i; j++) free(fresh[j]);
            free(fresh);
            return loom__fail(LOOM_ERR_OUT_OF_MEMORY,
                              "cpu: out of memory for %d x %zu bytes of scratch", c->n_threads,
                              bytes);
        }
    }
    if (c->scratch != NULL)
        for (int i = 0; i < c->n_threads; i++) free(c->scratch[i]);
    free(c->scratch);
    c->scratch = fresh;
    c->scratch_cap = n_floats;
    return LOOM_OK;
}

/* Grows one shared area (*area, *cap bytes) to n_bytes; what names it in the error. */
static loom_status reserve_area(void **area, size_t *cap, size_t n_bytes, const char *what) {
    if (n_bytes <= *cap && *area != NULL) return LOOM_OK;
    void *fresh = aligned_bytes(n_bytes);
    LOOM_RETURN_IF(fresh == NULL, LOOM_ERR_OUT_OF_MEMORY, "cpu: out of memory for %zu bytes of %s",
                   n_bytes, what);
    free(*area);
    *area = fresh;
    *cap = n_bytes;
    return LOOM_OK;
}

loom_status loom__cpu_reserve_act(loom__cpu_ctx *c, size_t n_bytes) {
    return reserve_area(&c->act, &c->act_cap, n_bytes, "activation scratch");
}

loom_status loom__cpu_reserve_attn_parts(loom__cpu_ctx *c, size_t n_bytes) {
    return reserve_area(&c->attn_parts, &c->attn_parts_cap, n_bytes, "attention segment states");
}

static void cpu_destroy(void *ctx) {
    loom__cpu_ctx *c = ctx;
    if (c == NULL) return;
    loom__threadpool_destroy(c->tp);
    loom__workshare_destroy(c->share);
    loom__cpu_rope_tables_free(c->rope);
    if (c->scratch != NULL)
        for (int i = 0; i < c->n_threads; i++) free(c->scratch[i]);
    free(c->scratch);
    free(c->act);
    free(c->attn_parts);
    free(c);
}

/* ------------------------------------------------------------------------------------------ */
/* supports                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static bool cpu_supports(void *ctx, loom_op op, loom_type type) {
    (void)ctx;
    switch (op) {
    case LOOM_OP_GET_ROWS:
    case LOOM_OP_MATMUL: {
        const loom__type_traits *tr = loom__type_get_traits(type);
        return tr != NULL && tr->can_dequantize;
    }
    case LOOM_OP_KV_STORE:
    case LOOM_OP_ATTENTION:
        return type == LOOM_TYPE_F16 || type == LOOM_TYPE_F32;
    case LOOM_OP_RMS_NORM:
    case LOOM_OP_ROPE:
    case LOOM_OP_GLU:
    case LOOM_OP_ADD:
    case LOOM_OP_SCALE:
    case LOOM_OP_SOFTMAX:
        return type == LOOM_TYPE_F32;
    case LOOM_OP_COUNT_:
        break;
    }
    return false;
}

/* ------------------------------------------------------------------------------------------ */
/* Memory                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static loom_status cpu_buffer_alloc(void *ctx, size_t bytes, loom_buffer **out) {
    (void)ctx;
    LOOM_CHECK_ARG(out != NULL);
    loom_buffer *b = malloc(sizeof *b);
    LOOM_RETURN_IF(b == NULL, LOOM_ERR_OUT_OF_MEMORY, "cpu: out of memory for a buffer");
    b->base = aligned_bytes(bytes);
    if (b->base == NULL) {
        free(b);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "cpu: cannot allocate a %zu-byte buffer", bytes);
    }
    b->bytes = bytes;
    b->owned = true;
    *out = b;
    return LOOM_OK;
}

static loom_status cpu_buffer_wrap_host(void *ctx, void *host, size_t bytes, loom_buffer **out) {
    (void)ctx;
    LOOM_CHECK_ARG(out != NULL);
    LOOM_CHECK_ARG(host != NULL || bytes == 0);
    loom_buffer *b = malloc(sizeof *b);
    LOOM_RETURN_IF(b == NULL, LOOM_ERR_OUT_OF_MEMORY, "cpu: out of memory for a buffer");
    b->base = host;
    b->bytes = bytes;
    b->owned = false;
    *out = b;
    return LOOM_OK;
}

static void cpu_buffer_free(void *ctx, loom_buffer *buf) {
    (void)ctx;
    if (buf == NULL) return;
    if (buf->owned) free(buf->base);
    free(buf);
}

static void *cpu_buffer_base(void *ctx, loom_buffer *buf) {
    (void)ctx;
    return buf ? buf->base : NULL;
}

static loom_status cpu_tensor_set(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes == 0) return LOOM_OK;
    LOOM_RETURN_IF(dst == NULL || src == NULL, LOOM_ERR_INVALID_ARG,
                   "cpu: tensor_set of %zu bytes with a NULL pointer", bytes);
    memcpy(dst, src, bytes);
    return LOOM_OK;
}

static loom_status cpu_tensor_get(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes == 0) return LOOM_OK;
    LOOM_RETURN_IF(dst == NULL || src == NULL, LOOM_ERR_INVALID_ARG,
                   "cpu: tensor_get of %zu bytes with a NULL pointer", bytes);
    memcpy(dst, src, bytes);
    return LOOM_OK;
}

static loom_status cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes == 0) return LOOM_OK;
    LOOM_RETURN_IF(dst == NULL || src == NULL, LOOM_ERR_INVALID_ARG,
                   "cpu: copy of %zu bytes with a NULL pointer", bytes);
    LOOM_RETURN_IF((const char *)dst < (const char *)src + bytes &&
                       (const char *)src < (const char *)dst + bytes,
                   LOOM_ERR_INVALID_ARG, "cpu: copy of %zu bytes between overlapping ranges",
                   bytes);
    memcpy(dst, src, bytes);
    return LOOM_OK;
}

static loom_status cpu_synchronize(void *ctx) {
    (void)ctx; /* ops are synchronous */
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The table and the constructor                                                              */
/* ------------------------------------------------------------------------------------------ */

static int cpu_host_threads(void *ctx) {
    return loom__threadpool_size(((loom__cpu_ctx *)ctx)->tp);
}

static void cpu_host_parallel(void *ctx, void (*fn)(void *arg, int ith, int nth), void *arg) {
    loom__threadpool_run(((loom__cpu_ctx *)ctx)->tp, fn, arg);
}

static const loom_backend_ops cpu_ops = {
    .abi_version = LOOM_BACKEND_ABI_VERSION,
    .name = "cpu",
    .destroy = cpu_destroy,
    .supports = cpu_supports,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_wrap_host = cpu_buffer_wrap_host,
    .buffer_free = cpu_buffer_free,
    .buffer_base = cpu_buffer_base,
    .tensor_set = cpu_tensor_set,
    .tensor_get = cpu_tensor_get,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
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
    .softmax = loom__cpu_softmax,
    .host_threads = cpu_host_threads,
    .host_parallel = cpu_host_parallel,
};

/* Each worker pins itself (thread 0, the caller, is the application's and stays as it is). */
static void pin_worker(void *arg, int ith, int nth) {
    loom__cpu_ctx *c = arg;
    (void)nth;
    if (ith > 0) (void)loom__numa_pin_worker(&c->numa, ith);
}

loom_status loom__backend_cpu_create(const loom__cpu_params *p, loom__backend **out) {
    LOOM_CHECK_ARG(out != NULL);
    int n_threads = p ? p->n_threads : 0;
    if (n_threads <= 0) n_threads = loom__cpu_count();

    loom__cpu_ctx *c = calloc(1, sizeof *c);
    LOOM_RETURN_IF(c == NULL, LOOM_ERR_OUT_OF_MEMORY, "cpu: out of memory");
    c->n_threads = n_threads;
    c->f32_activations = p ? p->f32_activations : false;
    loom_status st;
    LOOM_TRY_GOTO(st, loom__threadpool_create(n_threads, &c->tp), fail);
    LOOM_TRY_GOTO(st, loom__workshare_create(n_threads, &c->share), fail);
    c->numa = loom__numa_plan_make(p ? p->numa : LOOM_NUMA_AUTO);
    if (c->numa.mode != LOOM_NUMA_OFF) loom__threadpool_run(c->tp, pin_worker, c);
    LOOM_TRY_GOTO(st, loom__cpu_reserve_scratch(c, LOOM_CPU_SCRATCH_INIT), fail);
    LOOM_TRY_GOTO(st, loom__backend_register(&cpu_ops, c, out), fail);
    return LOOM_OK;
fail:
    cpu_destroy(c);
    return st;
}
