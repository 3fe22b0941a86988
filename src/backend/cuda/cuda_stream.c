/* cuda_stream.c — the CUDA backend's streams: one CUDA stream per engine or session, the copies
 * that cross PCIe (host <-> device, queued in order; tensor_get waits), the batched block copy
 * of copy-on-write and swap, and step_begin, which packs every descriptor of a step (with the
 * sequence of each row, and which sequences and rows each attention kernel takes) into pinned
 * memory and uploads it in one copy. */
#include "backend/cuda/cuda_internal.h"

#include "core/checked.h"
#include "tensor/types.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Workspace sizing                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* int32s of one step's packed descriptors for the largest step of shape (n_kv groups). */
static size_t meta_ints(const loom_step_shape *shape, int n_kv) {
    const size_t S = (size_t)shape->max_seqs, T = (size_t)shape->max_tokens;
    const size_t bs = (size_t)shape->block_size;
    const size_t blocks_per_seq = ((size_t)shape->max_ctx + bs - 1) / bs + 1;
    /* indptr, q_start (S + 1 each), pos_start (S), block ids, row_seq (T); attention's lists:
     * prefill sequences (S at most) and split-KV rows (T at most) */
    return (size_t)n_kv * (4 * S + 2 + S * blocks_per_seq + 2 * T);
}

/* The GEMM's split scratch for any step of shape: the largest any of its matmuls takes, times
 * the weights one matmul_multi launch may hold (at most the GEMM's own cap, which a split
 * never passes). Weights are laid out as weight_prepare lays them (FP8 rows padded to 16). */
static size_t gemm_work_bound(const loom__cuda_dev *d, const loom_step_shape *shape) {
    size_t most = 0;
    for (int32_t i = 0; shape->matmuls != NULL && i < shape->n_matmuls; i++) {
        const loom_matmul_shape *m = &shape->matmuls[i];
        size_t rb = 0;
        if (m->k < 1 || m->n < 1 || !loom__type_row_bytes(m->type, m->k, &rb)) continue;
        if (m->type == LOOM_TYPE_FP8_E4M3_ROWS) rb = (rb + 15) & ~(size_t)15;
        const loom__k_weight w = {(uint32_t)m->type, m->k, m->n, rb, NULL};
        const int64_t T = m->max_rows > 0 ? m->max_rows : shape->max_tokens;
        const size_t b = loom__cuda_gemm_work_bound(&w, T, d->n_sms, d->tc_math);
        most = b > most ? b : most;
    }
    const size_t multi = most * LOOM_K_GEMM_MULTI;
    const size_t cap = loom__cuda_gemm_work_bound_cap();
    return multi < cap ? multi : cap;
}

/* The wgmma GEMM's BF16 activations for any step of shape: the largest matmul's (0 for the
 * other GEMMs). */
static size_t gemm_x16_bound(const loom__cuda_dev *d, const loom_step_shape *shape) {
    size_t most = 0;
    for (int32_t i = 0; shape->matmuls != NULL && i < shape->n_matmuls; i++) {
        const loom_matmul_shape *m = &shape->matmuls[i];
        const int64_t T = m->max_rows > 0 ? m->max_rows : shape->max_tokens;
        const size_t b = loom__cuda_gemm_x16_bytes(T, m->k, d->tc_math);
        most = b > most ? b : most;
    }
    return most;
}

static size_t tiled_work_bound(const loom__cuda_dev *d, const loom_step_shape *shape) {
    return loom__cuda_attention_tiled_work_bound(shape->n_head, shape->n_kv_heads, shape->head_dim,
                                                 shape->max_tokens, shape->max_ctx, d->n_sms);
}

loom_status loom__cuda_workspace_size(void *dev, const loom_step_shape *shape, size_t *bytes) {
    LOOM_CHECK_ARG(dev != NULL && shape != NULL && bytes != NULL);
    LOOM_CHECK_ARG(shape->max_tokens > 0 && shape->max_seqs > 0 && shape->block_size > 0 &&
                   shape->max_ctx > 0);
    *bytes = loom__cuda_attention_work_bytes(shape->n_head, shape->head_dim) +
             meta_ints(shape, LOOM_CUDA_MAX_KV) * sizeof(int32_t) + gemm_work_bound(dev, shape) +
             gemm_x16_bound(dev, shape) + tiled_work_bound(dev, shape);
    return LOOM_OK;
}

static loom_status reserve_meta(loom__cuda_stream *c, size_t ints) {
    if (ints <= c->meta_cap) return LOOM_OK;
    if (c->meta_pending) {
        LOOM_CU_TRY(cudaEventSynchronize(c->meta_done));
        c->meta_pending = false;
    }
    int32_t *h = NULL, *d = NULL;
    LOOM_CU_TRY(cudaHostAlloc((void **)&h, ints * sizeof *h, cudaHostAllocPortable));
    cudaError_t e = cudaMalloc((void **)&d, ints * sizeof *d);
    if (e != cudaSuccess) {
        (void)cudaFreeHost(h);
        return loom__cuda_status(e, "cudaMalloc (step descriptors)");
    }
    /* The old device copy may still be read by queued kernels: free it after them. */
    if (c->meta_dev != NULL) {
        e = cudaStreamSynchronize(c->s);
        if (e != cudaSuccess) {
            (void)cudaFree(d);
            (void)cudaFreeHost(h);
            return loom__cuda_status(e, "cudaStreamSynchronize");
        }
        (void)cudaFree(c->meta_dev);
        (void)cudaFreeHost(c->meta_host);
    }
    c->meta_host = h;
    c->meta_dev = d;
    c->meta_cap = ints;
    return LOOM_OK;
}

loom_status loom__cuda_regrow(loom__cuda_stream *c, void **area, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return LOOM_OK;
    LOOM_TRY(loom__cuda_flush(c)); /* an allocation and a wait: not in a capture */
    void *w = NULL;
    LOOM_CU_TRY(cudaMalloc(&w, bytes));
    if (*area != NULL) { /* queued kernels may still read the old area: free it after them */
        cudaError_t e = cudaStreamSynchronize(c->s);
        if (e != cudaSuccess) {
            (void)cudaFree(w);
            return loom__cuda_status(e, "cudaStreamSynchronize");
        }
        (void)cudaFree(*area);
    }
    *area = w;
    *cap = bytes;
    return LOOM_OK;
}

loom_status loom__cuda_reserve_attn(loom__cuda_stream *c, size_t bytes) {
    return loom__cuda_regrow(c, &c->attn_work, &c->attn_work_cap, bytes);
}

/* ------------------------------------------------------------------------------------------ */
/* Create, destroy                                                                            */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cuda_stream_create(void *dev, const loom_step_shape *shape, void **out) {
    LOOM_CHECK_ARG(dev != NULL && out != NULL);
    loom__cuda_dev *d = dev;
    LOOM_TRY(loom__cuda_bind(d));
    loom__cuda_stream *c = calloc(1, sizeof *c);
    LOOM_RETURN_IF(c == NULL, LOOM_ERR_OUT_OF_MEMORY, "cuda: out of memory");
    c->dev = d;
    loom_status st = LOOM_OK;
    if (shape != NULL && (shape->max_tokens < 1 || shape->max_seqs < 1 || shape->block_size < 1 ||
                          shape->max_ctx < 1 || shape->n_head < 0 || shape->head_dim < 0)) {
        free(c);
        return loom__fail(LOOM_ERR_INVALID_ARG, "cuda: stream_create: bad step shape");
    }
    cudaError_t e = cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->meta_done, cudaEventDisableTiming);
    if (e != cudaSuccess) st = loom__cuda_status(e, "cudaStreamCreate");
    if (st == LOOM_OK && shape != NULL) {
        LOOM_TRY_GOTO(st, reserve_meta(c, meta_ints(shape, LOOM_CUDA_MAX_KV)), fail);
        LOOM_TRY_GOTO(st,
                      loom__cuda_reserve_attn(
                          c, loom__cuda_attention_work_bytes(shape->n_head, shape->head_dim)),
                      fail);
        /* the splits' scratch: sized once, so that no step of the shape allocates */
        LOOM_TRY_GOTO(
            st, loom__cuda_regrow(c, &c->gemm_work, &c->gemm_work_cap, gemm_work_bound(d, shape)),
            fail);
        LOOM_TRY_GOTO(
            st, loom__cuda_regrow(c, &c->gemm_x16, &c->gemm_x16_cap, gemm_x16_bound(d, shape)),
            fail);
        LOOM_TRY_GOTO(
            st,
            loom__cuda_regrow(c, &c->tiled_work, &c->tiled_work_cap, tiled_work_bound(d, shape)),
            fail);
    }
    if (st == LOOM_OK) {
        *out = c;
        return LOOM_OK;
    }
fail:
    loom__cuda_stream_destroy(c);
    return st;
}

void loom__cuda_stream_destroy(void *stream) {
    loom__cuda_stream *c = stream;
    if (c == NULL) return;
    (void)cudaSetDevice(c->dev->device);
    if (c->s != NULL) {
        loom__cuda_graphs_free(c);
        (void)cudaStreamSynchronize(c->s);
    }
    (void)cudaFree(c->gemm_work);
    (void)cudaFree(c->gemm_x16);
    (void)cudaFree(c->tiled_work);
    (void)cudaFree(c->blaslt_work);
    (void)cudaFree(c->summary_work);
    free(c->edit_host);
    (void)cudaFree(c->attn_work);
    (void)cudaFree(c->meta_dev);
    (void)cudaFreeHost(c->meta_host);
    if (c->meta_done != NULL) (void)cudaEventDestroy(c->meta_done);
    if (c->s != NULL) (void)cudaStreamDestroy(c->s);
    free(c);
}

/* ------------------------------------------------------------------------------------------ */
/* Copies                                                                                     */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cuda_tensor_set(void *stream, void *dst, const void *src, size_t bytes) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL && (bytes == 0 || (dst != NULL && src != NULL)));
    if (bytes == 0) return LOOM_OK;
    LOOM_TRY(loom__cuda_flush(c));
    LOOM_TRY(loom__cuda_bind(c->dev));
    LOOM_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->s));
    return LOOM_OK;
}

loom_status loom__cuda_tensor_get(void *stream, void *dst, const void *src, size_t bytes) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL && (bytes == 0 || (dst != NULL && src != NULL)));
    LOOM_TRY(loom__cuda_flush(c));
    LOOM_TRY(loom__cuda_bind(c->dev));
    if (bytes > 0) LOOM_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->s));
    /* Also where a kernel queued before failed: its error surfaces here, with its text. */
    LOOM_CU_TRY(cudaStreamSynchronize(c->s));
    return LOOM_OK;
}

loom_status loom__cuda_copy_batch(void *stream, loom_copy_kind kind, const loom_copy_range *ranges,
                                  size_t n) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL && (n == 0 || ranges != NULL));
    enum cudaMemcpyKind k;
    switch (kind) {
    case LOOM_COPY_DEVICE:
        k = cudaMemcpyDeviceToDevice;
        break;
    case LOOM_COPY_TO_HOST:
        k = cudaMemcpyDeviceToHost;
        break;
    case LOOM_COPY_FROM_HOST:
        k = cudaMemcpyHostToDevice;
        break;
    default:
        return loom__fail(LOOM_ERR_INVALID_ARG, "copy_batch: unknown kind %d", (int)kind);
    }
    for (size_t i = 0; i < n; i++)
        LOOM_RETURN_IF(ranges[i].bytes > 0 && (ranges[i].src == NULL || ranges[i].dst == NULL),
                       LOOM_ERR_INVALID_ARG, "copy_batch: range %zu has a NULL side", i);
    LOOM_TRY(loom__cuda_flush(c));
    LOOM_TRY(loom__cuda_bind(c->dev));
    /* Queued in order on the stream: a block copied to host memory is there once the stream is
     * synchronized (the engine does before it reuses the block). */
    for (size_t i = 0; i < n; i++)
        if (ranges[i].bytes > 0)
            LOOM_CU_TRY(cudaMemcpyAsync(ranges[i].dst, ranges[i].src, ranges[i].bytes, k, c->s));
    return LOOM_OK;
}

loom_status loom__cuda_synchronize(void *stream) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__cuda_flush(c));
    LOOM_TRY(loom__cuda_bind(c->dev));
    LOOM_CU_TRY(cudaStreamSynchronize(c->s));
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Steps                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Copies n ints to the packed area at *at, returning where they landed on the device. */
static const int32_t *pack(loom__cuda_stream *c, size_t *at, const int32_t *src, size_t n) {
    if (n > 0) memcpy(c->meta_host + *at, src, n * sizeof *src);
    const int32_t *dev = c->meta_dev + *at;
    *at += n;
    return dev;
}

loom_status loom__cuda_step_begin(void *stream, const loom_step_desc *step) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL && step != NULL && step->n_tokens >= 0);
    LOOM_CHECK_ARG(step->n_kv >= 0 && (step->n_kv == 0 || step->kv != NULL));
    LOOM_RETURN_IF(step->n_kv > LOOM_CUDA_MAX_KV, LOOM_ERR_UNSUPPORTED,
                   "step_begin: %d kv groups (the cuda backend takes %d)", step->n_kv,
                   LOOM_CUDA_MAX_KV);
    LOOM_TRY(loom__cuda_flush(c));
    LOOM_TRY(loom__cuda_bind(c->dev));
    /* Until this step's descriptors are in place, no op may find the last step's. */
    c->n_kv = 0;
    size_t ints = 0;
    for (int32_t g = 0; g < step->n_kv; g++) {
        const loom_kv_desc *kv = &step->kv[g];
        ints += 4 * (size_t)kv->n_seqs + 2 + (size_t)kv->indptr[kv->n_seqs] +
                2 * (size_t)step->n_tokens;
    }
    if (ints > c->meta_cap) c->n_grows++;
    LOOM_TRY(reserve_meta(c, ints));
    if (c->meta_pending) {
        LOOM_CU_TRY(cudaEventSynchronize(c->meta_done));
        c->meta_pending = false;
    }
    size_t at = 0;
    for (int32_t g = 0; g < step->n_kv; g++) {
        const loom_kv_desc *kv = &step->kv[g];
        LOOM_RETURN_IF(kv->q_start[kv->n_seqs] != step->n_tokens, LOOM_ERR_INVALID_ARG,
                       "step_begin: descriptor %d covers %d rows; the step has %d", g,
                       kv->q_start[kv->n_seqs], step->n_tokens);
        loom__cuda_step_kv *sk = &c->kv[g];
        sk->host = kv;
        loom__k_kv *d = &sk->dev;
        d->indptr = pack(c, &at, kv->indptr, (size_t)kv->n_seqs + 1);
        d->block_ids = pack(c, &at, kv->block_ids, (size_t)kv->indptr[kv->n_seqs]);
        d->q_start = pack(c, &at, kv->q_start, (size_t)kv->n_seqs + 1);
        d->pos_start = pack(c, &at, kv->pos_start, (size_t)kv->n_seqs);
        int32_t *rs = c->meta_host + at;
        for (int32_t s = 0; s < kv->n_seqs; s++)
            for (int32_t r = kv->q_start[s]; r < kv->q_start[s + 1]; r++) rs[r] = s;
        d->row_seq = c->meta_dev + at;
        at += (size_t)step->n_tokens;
        /* Attention's kernels (loom_kernels.h): the prefill sequences, then the others' rows. */
        int32_t *ps = c->meta_host + at, n_ps = 0, most = 0, most_any = 0, longest = 0;
        for (int32_t s = 0; s < kv->n_seqs; s++) {
            const int32_t n = kv->q_start[s + 1] - kv->q_start[s];
            most_any = n > most_any ? n : most_any;
            /* the positions the rows attend: through pos_start + n - 1 (kv_len should agree) */
            const int64_t held = (int64_t)kv->pos_start[s] + n;
            if (held > longest) longest = held > INT32_MAX ? INT32_MAX : (int32_t)held;
            if (n >= LOOM_K_ATTN_PREFILL_ROWS) {
                ps[n_ps++] = s;
                most = n > most ? n : most;
            }
        }
        d->prefill_seqs = c->meta_dev + at;
        at += (size_t)n_ps;
        int32_t *sr = c->meta_host + at, n_sr = 0;
        for (int32_t s = 0; s < kv->n_seqs; s++)
            if (kv->q_start[s + 1] - kv->q_start[s] < LOOM_K_ATTN_PREFILL_ROWS)
                for (int32_t r = kv->q_start[s]; r < kv->q_start[s + 1]; r++) sr[n_sr++] = r;
        d->split_rows = c->meta_dev + at;
        at += (size_t)n_sr;
        d->n_prefill_seqs = n_ps;
        d->n_split_rows = n_sr;
        d->prefill_max_rows = most;
        d->max_rows = most_any;
        d->max_kv_len = longest;
        d->n_seqs = kv->n_seqs;
        d->n_rows = step->n_tokens;
        d->block_size = kv->block_size;
        d->n_kv_heads = kv->n_kv_heads;
        d->head_dim = kv->head_dim;
        d->window = kv->window;
        d->kv_type = (uint32_t)kv->kv_type;
        d->token_stride = kv->token_stride;
        d->block_stride = kv->block_stride;
        d->scale_token_stride = kv->scale_token_stride;
        d->scale_block_stride = kv->scale_block_stride;
    }
    c->n_kv = step->n_kv;
    if (at > 0) {
        LOOM_CU_TRY(cudaMemcpyAsync(c->meta_dev, c->meta_host, at * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, c->s));
        LOOM_CU_TRY(cudaEventRecord(c->meta_done, c->s));
        c->meta_pending = true;
    }
    return LOOM_OK;
}

loom_status loom__cuda_find_step_kv(loom__cuda_stream *c, const char *op, const loom_kv_desc *kv,
                                    const loom__k_kv **out) {
    LOOM_RETURN_IF(kv == NULL, LOOM_ERR_INVALID_ARG, "%s: kv descriptor is NULL", op);
    for (int32_t g = 0; g < c->n_kv; g++) {
        if (c->kv[g].host == kv) {
            *out = &c->kv[g].dev;
            return LOOM_OK;
        }
    }
    return loom__fail(LOOM_ERR_INVALID_ARG,
                      "%s: the kv descriptor is not one of this step's (the cuda backend reads "
                      "the descriptors step_begin uploaded)",
                      op);
}
