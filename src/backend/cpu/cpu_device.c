/* cpu_device.c — the CPU backend's device: its settings, host memory (buffers, "pinned" host
 * memory, which for the CPU is any memory), the memory query, and weight preparation.
 *
 * Weights: a persistent source (a mapped file the model may use in place) is used where it
 * lies, its pages placed by the NUMA plan as they fault in. Any other source is copied into
 * the device's arena: one block of the open-time weight_bytes hint, on huge pages where the OS
 * gives them (one-token decode streams every weight once per token, a 4 KiB page after
 * another, and each page misses the TLB: a decode-shaped Q8_0 harness read 10-13% faster from
 * huge pages), placed by the NUMA plan before the copy touches it. Weights keep their block
 * format: the CPU kernels read GGUF's layouts directly. */
#include "backend/cpu/cpu_internal.h"

#include "core/alloc.h"
#include "core/checked.h"
#include "core/pages.h"
#include "core/status.h"
#include "tensor/types.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOOM_CPU_ALIGN 64
/* Alignment of the weight arena: huge pages back only 2 MiB-aligned ranges. */
#define LOOM_CPU_ARENA_ALIGN ((size_t)2 << 20)

struct loom_buffer {
    void *base;
    size_t bytes;
};

struct loom__cpu_chunk {
    loom__cpu_chunk *next;
    char *base;
    size_t cap, used;
};

/* aligned_alloc of at least bytes (a multiple of align, as it requires); NULL on failure. */
static void *aligned_bytes(size_t bytes, size_t align) {
    size_t rounded;
    if (bytes == 0) bytes = 1;
    if (loom__add_overflow_size(bytes, align - 1, &rounded)) return NULL;
    rounded -= rounded % align;
    return loom__aligned_alloc(align, rounded);
}

/* ------------------------------------------------------------------------------------------ */
/* Open, close, memory                                                                        */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cpu_open(const loom_backend_open_params *p, void **out) {
    LOOM_CHECK_ARG(p != NULL && out != NULL);
    LOOM_RETURN_IF(p->device != 0, LOOM_ERR_NO_DEVICE,
                   "cpu: device %d does not exist (the cpu backend has one device, 0)", p->device);
    loom__cpu_dev *d = loom__calloc(1, sizeof *d);
    LOOM_RETURN_IF(d == NULL, LOOM_ERR_OUT_OF_MEMORY, "cpu: out of memory");
    d->n_threads = p->n_threads > 0 ? p->n_threads : loom__cpu_count();
    d->f32_activations = p->f32_activations;
    d->numa = loom__numa_plan_make(p->numa);
    d->weight_bytes = p->weight_bytes;
    pthread_mutex_init(&d->mu, NULL);
    *out = d;
    return LOOM_OK;
}

void loom__cpu_close(void *dev) {
    loom__cpu_dev *d = dev;
    if (d == NULL) return;
    for (loom__cpu_chunk *c = d->chunks, *next; c != NULL; c = next) {
        next = c->next;
        free(c->base);
        free(c);
    }
    pthread_mutex_destroy(&d->mu);
    free(d);
}

loom_status loom__cpu_memory_info(void *dev, size_t *free_bytes, size_t *total_bytes) {
    (void)dev;
    LOOM_CHECK_ARG(free_bytes != NULL && total_bytes != NULL);
    long avail = sysconf(_SC_AVPHYS_PAGES), total = sysconf(_SC_PHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    LOOM_RETURN_IF(avail < 0 || total <= 0 || page <= 0, LOOM_ERR_BACKEND,
                   "cpu: the system does not report its memory (sysconf)");
    *free_bytes = (size_t)avail * (size_t)page;
    *total_bytes = (size_t)total * (size_t)page;
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Buffers and host memory                                                                    */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cpu_buffer_alloc(void *dev, size_t bytes, loom_buffer **out) {
    (void)dev;
    LOOM_CHECK_ARG(out != NULL);
    loom_buffer *b = loom__malloc(sizeof *b);
    LOOM_RETURN_IF(b == NULL, LOOM_ERR_OUT_OF_MEMORY, "cpu: out of memory for a buffer");
    b->base = aligned_bytes(bytes, LOOM_CPU_ALIGN);
    if (b->base == NULL) {
        free(b);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "cpu: cannot allocate a %zu-byte buffer", bytes);
    }
    b->bytes = bytes;
    *out = b;
    return LOOM_OK;
}

void loom__cpu_buffer_free(void *dev, loom_buffer *buf) {
    (void)dev;
    if (buf == NULL) return;
    free(buf->base);
    free(buf);
}

void *loom__cpu_buffer_base(void *dev, loom_buffer *buf) {
    (void)dev;
    return buf ? buf->base : NULL;
}

loom_status loom__cpu_host_alloc(void *dev, size_t bytes, void **out) {
    (void)dev;
    LOOM_CHECK_ARG(out != NULL);
    void *p = aligned_bytes(bytes, LOOM_CPU_ALIGN);
    LOOM_RETURN_IF(p == NULL, LOOM_ERR_OUT_OF_MEMORY,
                   "cpu: cannot allocate %zu bytes of host memory", bytes);
    *out = p;
    return LOOM_OK;
}

void loom__cpu_host_free(void *dev, void *ptr) {
    (void)dev;
    free(ptr);
}

/* ------------------------------------------------------------------------------------------ */
/* Weights                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* A new chunk of at least `bytes`, placed and advised before anything touches it (d->mu held). */
static loom__cpu_chunk *new_chunk(loom__cpu_dev *d, size_t bytes) {
    loom__cpu_chunk *c = loom__calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    size_t cap;
    if (loom__add_overflow_size(bytes, LOOM_CPU_ARENA_ALIGN - 1, &cap)) {
        free(c);
        return NULL;
    }
    cap -= cap % LOOM_CPU_ARENA_ALIGN;
    c->base = loom__aligned_alloc(LOOM_CPU_ARENA_ALIGN, cap);
    if (c->base == NULL) {
        free(c);
        return NULL;
    }
    c->cap = cap;
    loom__advise_huge_pages(c->base, cap);
    (void)loom__numa_place(&d->numa, c->base, cap);
    c->next = d->chunks;
    d->chunks = c;
    return c;
}

/* Room for `bytes` (64-byte aligned) among the device's chunks; NULL when memory runs out. */
static void *weight_room(loom__cpu_dev *d, size_t bytes) {
    pthread_mutex_lock(&d->mu);
    loom__cpu_chunk *c = d->chunks;
    size_t at = c ? (c->used + LOOM_CPU_ALIGN - 1) / LOOM_CPU_ALIGN * LOOM_CPU_ALIGN : 0;
    if (c == NULL || at > c->cap || c->cap - at < bytes) {
        /* The first chunk is the whole hinted arena; a later one (the hint was short) holds
         * what is asked. */
        size_t want = d->chunks == NULL && d->weight_bytes > bytes ? d->weight_bytes : bytes;
        c = new_chunk(d, want);
        at = 0;
    }
    void *p = NULL;
    if (c != NULL) {
        p = c->base + at;
        c->used = at + bytes;
    }
    pthread_mutex_unlock(&d->mu);
    return p;
}

loom_status loom__cpu_weight_prepare(void *dev, const loom_weight_src *src, loom_tensor *out) {
    loom__cpu_dev *d = dev;
    LOOM_CHECK_ARG(d != NULL && src != NULL && out != NULL);
    const char *name = src->name ? src->name : "(unnamed)";
    const loom__type_traits *tr = loom__type_get_traits(src->type);
    LOOM_RETURN_IF(tr == NULL || !tr->can_dequantize, LOOM_ERR_UNSUPPORTED,
                   "cpu: weight '%s' has type %s, which the cpu backend cannot compute with", name,
                   loom__type_name(src->type));
    size_t row_bytes, bytes;
    LOOM_RETURN_IF(src->ne[0] < 1 || src->ne[1] < 1 ||
                       !loom__type_row_bytes(src->type, src->ne[0], &row_bytes),
                   LOOM_ERR_INVALID_ARG, "cpu: weight '%s' has shape [%lld, %lld] of %s", name,
                   (long long)src->ne[1], (long long)src->ne[0], loom__type_name(src->type));
    LOOM_RETURN_IF(src->data == NULL || src->row_stride < row_bytes, LOOM_ERR_INVALID_ARG,
                   "cpu: weight '%s': no data, or rows %zu bytes apart for %zu-byte rows", name,
                   src->row_stride, row_bytes);
    LOOM_RETURN_IF(loom__mul_overflow_size(row_bytes, (size_t)src->ne[1], &bytes),
                   LOOM_ERR_INVALID_ARG, "cpu: weight '%s' is too large", name);
    if (src->persistent) {
        /* Used where it lies: its pages follow the NUMA plan as they fault in. */
        (void)loom__numa_place(&d->numa, (void *)src->data,
                               (size_t)(src->ne[1] - 1) * src->row_stride + row_bytes);
        *out =
            loom_tensor_2d(src->type, (void *)src->data, src->ne[0], src->ne[1], src->row_stride);
        return LOOM_OK;
    }
    char *dst = weight_room(d, bytes);
    LOOM_RETURN_IF(dst == NULL, LOOM_ERR_OUT_OF_MEMORY,
                   "cpu: out of memory for weight '%s' (%zu bytes)", name, bytes);
    if (src->row_stride == row_bytes) {
        memcpy(dst, src->data, bytes);
    } else {
        for (int64_t r = 0; r < src->ne[1]; r++)
            memcpy(dst + (size_t)r * row_bytes,
                   (const char *)src->data + (size_t)r * src->row_stride, row_bytes);
    }
    *out = loom_tensor_2d(src->type, dst, src->ne[0], src->ne[1], row_bytes);
    return LOOM_OK;
}
