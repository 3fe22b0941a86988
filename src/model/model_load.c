/* model_load.c — loom_model_load / loom_model_free: open the GGUF file, read the configuration
 * and the tokenizer, create the backend and place the weights in its memory. */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/numa.h"
#include "core/pages.h"
#include "core/timer.h"
#include "tensor/qdot.h"
#include "tensor/quant.h"

loom_model_params loom_model_default_params(void) {
    loom_model_params p;
    memset(&p, 0, sizeof p);
    p.backend = LOOM_BACKEND_CPU;
    p.n_threads = 0;
    p.use_mmap = true;
    p.vocab_only = false;
    return p;
}

static char *dup_gguf_str(loom__gguf_str s) {
    char *out = malloc(s.len + 1);
    if (!out) return NULL;
    memcpy(out, s.ptr, s.len);
    out[s.len] = '\0';
    return out;
}

/* Places the weights in backend memory: zero-copy over the mapped file when the backend can
 * wrap host memory and the caller allows mmap, otherwise one buffer holding a copy of the
 * file's data section. Tensor views are made later by loom__model_tensor. */
static loom_status place_weights(loom_model *m, bool use_mmap, loom_numa_mode numa) {
    const loom_backend_ops *ops = m->backend->ops;
    void *ctx = m->backend->ctx;
    size_t size = loom__gguf_file_size(m->gguf);
    void *image = (void *)loom__gguf_image(m->gguf);
    /* The backend is the CPU one (loom_model_load), whose memory is host memory: weight pages
     * follow its NUMA plan (core/numa.h), before the copy below touches them, or as the
     * mapping faults them in. */
    const loom__numa_plan plan = loom__numa_plan_make(numa);
    if (use_mmap && ops->buffer_wrap_host) {
        if (ops->buffer_wrap_host(ctx, image, size, &m->weights) == LOOM_OK) {
            (void)loom__numa_place(&plan, image, size);
            return LOOM_OK;
        }
        LOOM_LOG_W("backend %s cannot map weights in place; copying", ops->name);
    }
    LOOM_TRY(ops->buffer_alloc(ctx, size, &m->weights));
    void *base = ops->buffer_base(ctx, m->weights);
    /* One-token decode streams every weight once per token, a 4 KiB page after another, and
     * each page misses the TLB: a decode-shaped Q8_0 harness (the matmuls of 30 layers and the
     * LM head, 143 MB, alternated passes over two copies of the same weights, 2 threads) read
     * 10-13% faster from huge pages. Only the weight copy asks: the KV pools and workspaces
     * showed no gain, and faulting them in on huge pages (zeroed, and compacted for) made a
     * fresh session's first prompt 50-130 ms slower. */
    loom__advise_huge_pages(base, size);
    (void)loom__numa_place(&plan, base, size);
    return ops->tensor_set(ctx, base, image, size);
}

static loom_status add_extra_buffer(loom_model *m, size_t bytes, loom_buffer **out) {
    loom_buffer **grown = realloc(m->extra, (size_t)(m->n_extra + 1) * sizeof *grown);
    LOOM_RETURN_IF(!grown, LOOM_ERR_OUT_OF_MEMORY, "model: out of memory");
    m->extra = grown;
    LOOM_TRY(m->backend->ops->buffer_alloc(m->backend->ctx, bytes, out));
    m->extra[m->n_extra++] = *out;
    return LOOM_OK;
}

loom_status loom__model_tensor(loom_model *m, const char *name, int64_t ne0, int64_t ne1,
                               bool required, loom_tensor *out) {
    memset(out, 0, sizeof *out);
    const loom__gguf_tensor *t = loom__gguf_find_tensor(m->gguf, name);
    if (!t) {
        LOOM_RETURN_IF(required, LOOM_ERR_BAD_MODEL, "model: missing tensor '%s'", name);
        return LOOM_OK;
    }
    int64_t rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++) rows *= t->ne[d];
    LOOM_RETURN_IF(t->ne[0] != ne0 || rows != ne1, LOOM_ERR_BAD_MODEL,
                   "model: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                   (long long)t->ne[0], (long long)rows, (long long)ne0, (long long)ne1);
    const loom__type_traits *tr = loom__type_get_traits(t->type);
    LOOM_RETURN_IF(!tr || !tr->can_dequantize, LOOM_ERR_UNSUPPORTED,
                   "model: tensor '%s' has type %s, which loom cannot compute with", name,
                   loom__type_name(t->type));
    size_t row_bytes = 0;
    LOOM_RETURN_IF(!loom__type_row_bytes(t->type, ne0, &row_bytes), LOOM_ERR_BAD_MODEL,
                   "model: tensor '%s': bad row size", name);

    const loom_backend_ops *ops = m->backend->ops;
    char *base = ops->buffer_base(m->backend->ctx, m->weights);
    const char *image = loom__gguf_image(m->gguf);
    if (ne1 == 1 && t->type != LOOM_TYPE_F32) {
        /* Vectors (norm weights) are consumed as F32 by every op: convert once at load. */
        float *tmp = malloc((size_t)ne0 * sizeof(float));
        LOOM_RETURN_IF(!tmp, LOOM_ERR_OUT_OF_MEMORY, "model: out of memory");
        loom_status st = LOOM_OK;
        if (!loom__dequantize_row(t->type, t->data, tmp, ne0)) {
            st = loom__fail(LOOM_ERR_UNSUPPORTED, "model: cannot convert '%s'", name);
        }
        loom_buffer *buf = NULL;
        if (st == LOOM_OK) st = add_extra_buffer(m, (size_t)ne0 * sizeof(float), &buf);
        if (st == LOOM_OK) {
            void *dst = ops->buffer_base(m->backend->ctx, buf);
            st = ops->tensor_set(m->backend->ctx, dst, tmp, (size_t)ne0 * sizeof(float));
            *out = loom_tensor_2d(LOOM_TYPE_F32, dst, ne0, 1, (size_t)ne0 * sizeof(float));
        }
        free(tmp);
        return st;
    }
    void *data = base + ((const char *)t->data - image);
    *out = loom_tensor_2d((loom_type)t->type, data, ne0, ne1, row_bytes);
    return LOOM_OK;
}

static loom_status read_general(loom_model *m) {
    loom__gguf_str arch, name;
    LOOM_TRY(loom__gguf_get_str(m->gguf, "general.architecture", true, &arch));
    LOOM_TRY(loom__gguf_get_str(m->gguf, "general.name", false, &name));
    m->arch_name = dup_gguf_str(arch);
    m->name = dup_gguf_str(name);
    LOOM_RETURN_IF(!m->arch_name || !m->name, LOOM_ERR_OUT_OF_MEMORY, "model: out of memory");
    return LOOM_OK;
}

static loom_status load_model(loom_model *m, const char *path, const loom_model_params *p) {
    LOOM_TRY(loom__gguf_open(path, &m->gguf));
    LOOM_TRY(read_general(m));
    LOOM_TRY(loom__tokenizer_load(m->gguf, &m->tok));

    if (strcmp(m->arch_name, "llama") == 0) {
        m->cfg.arch = LOOM_ARCH_LLAMA;
        LOOM_TRY(loom__llama_read_config(m->gguf, "llama", &m->cfg));
    } else if (strcmp(m->arch_name, "qwen2") == 0) {
        m->cfg.arch = LOOM_ARCH_QWEN2;
        LOOM_TRY(loom__llama_read_config(m->gguf, "qwen2", &m->cfg));
    } else if (strcmp(m->arch_name, "gemma3") == 0) {
        m->cfg.arch = LOOM_ARCH_GEMMA3;
        LOOM_TRY(loom__gemma3_read_config(m->gguf, &m->cfg));
    } else {
        return loom__fail(LOOM_ERR_UNSUPPORTED, "model: architecture '%s' is not supported",
                          m->arch_name);
    }
    LOOM_TRY(loom__model_assign_kv_groups(&m->cfg));
    int32_t n_tok = loom__tokenizer_n_vocab(m->tok);
    if (m->cfg.n_vocab == 0) m->cfg.n_vocab = n_tok;
    LOOM_RETURN_IF(m->cfg.n_vocab != n_tok, LOOM_ERR_BAD_MODEL,
                   "model: vocab_size %d differs from the tokenizer's %d tokens", m->cfg.n_vocab,
                   n_tok);
    if (p->vocab_only) {
        m->vocab_only = true;
        return LOOM_OK;
    }

    LOOM_RETURN_IF(p->backend != LOOM_BACKEND_CPU, LOOM_ERR_UNSUPPORTED,
                   "model: backend %d is not built into this library", (int)p->backend);
    loom__cpu_params cp = {
        .n_threads = p->n_threads, .f32_activations = p->f32_activations, .numa = p->numa};
    LOOM_TRY(loom__backend_cpu_create(&cp, &m->backend));
    LOOM_TRY(place_weights(m, p->use_mmap, p->numa));
    LOOM_TRY(loom__model_bind_weights(m));
    /* Copied weights need the mapped ones no more (binding read the norm vectors from them). */
    if (m->backend->ops->buffer_base(m->backend->ctx, m->weights) != loom__gguf_image(m->gguf))
        loom__gguf_release_data(m->gguf);

    m->n_params = 0;
    for (int64_t i = 0; i < loom__gguf_n_tensors(m->gguf); i++) {
        const loom__gguf_tensor *t = loom__gguf_tensor_at(m->gguf, i);
        int64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n *= t->ne[d];
        m->n_params += n;
    }
    return LOOM_OK;
}

loom_status loom_model_load(const char *path, const loom_model_params *params, loom_model **out) {
    loom__clear_error();
    LOOM_CHECK_ARG(path != NULL);
    LOOM_CHECK_ARG(out != NULL);
    loom_model_params p = params ? *params : loom_model_default_params();
    LOOM_CHECK_ARG(p.n_threads <= 1024);
    LOOM_CHECK_ARG(p.numa >= LOOM_NUMA_AUTO && p.numa <= LOOM_NUMA_ISOLATE);

    loom_model *m = calloc(1, sizeof *m);
    LOOM_RETURN_IF(!m, LOOM_ERR_OUT_OF_MEMORY, "model: out of memory");
    double t0 = loom__now_ms();
    loom_status st = load_model(m, path, &p);
    if (st != LOOM_OK) {
        loom__error_prefix("%s", path);
        loom_model_free(m);
        return st;
    }
    LOOM_LOG_I("loaded %s (%s, %d layers) in %.1f ms", path, m->arch_name, m->cfg.n_layer,
               loom__now_ms() - t0);
    *out = m;
    return LOOM_OK;
}

void loom_model_free(loom_model *m) {
    if (!m) return;
    if (m->backend) {
        for (int32_t i = 0; i < m->n_extra; i++) {
            m->backend->ops->buffer_free(m->backend->ctx, m->extra[i]);
        }
        if (m->weights) m->backend->ops->buffer_free(m->backend->ctx, m->weights);
        loom__backend_destroy(m->backend);
    }
    free(m->extra);
    free(m->layers);
    free(m->cfg.layers);
    free(m->rope_freq_factors);
    free(m->arch_name);
    free(m->name);
    loom__tokenizer_free(m->tok);
    loom__gguf_close(m->gguf);
    free(m);
}

loom_status loom_model_get_info(const loom_model *m, loom_model_info *out) {
    loom__clear_error();
    LOOM_CHECK_ARG(m != NULL);
    LOOM_CHECK_ARG(out != NULL);
    memset(out, 0, sizeof *out);
    out->architecture = m->arch_name;
    out->name = m->name;
    out->n_vocab = m->cfg.n_vocab;
    out->n_ctx_train = m->cfg.n_ctx_train;
    out->n_embd = m->cfg.n_embd;
    out->n_layer = m->cfg.n_layer;
    out->n_head = m->cfg.n_head;
    out->n_head_kv = m->cfg.n_head_kv;
    out->head_dim = m->cfg.head_dim;
    out->n_params = m->n_params;
    out->file_bytes = (int64_t)loom__gguf_file_size(m->gguf);
    out->bos = loom__tokenizer_bos(m->tok);
    out->eos = loom__tokenizer_eos(m->tok);
    out->cpu_kernels = loom__qdot_simd_name();
    return LOOM_OK;
}
