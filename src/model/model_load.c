/* model_load.c — loom_model_load / loom_model_free: open the GGUF file, read the configuration
 * and the tokenizer, open the backend the caller names (the registry, backend/backend.h) and
 * have it prepare every weight tensor. */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "tensor/qdot.h"
#include "tensor/quant.h"
#include "tensor/types.h"

void loom_model_params_init(loom_model_params *out, size_t size) {
    loom_model_params p;
    loom__abi_init(&p, sizeof p);
    p.backend = NULL; /* AUTO */
    p.device = 0;
    p.n_threads = 0;
    p.use_mmap = true;
    p.vocab_only = false;
    loom__abi_defaults_out(out, size, &p, sizeof p);
}

static char *dup_gguf_str(loom__gguf_str s) {
    char *out = loom__malloc(s.len + 1);
    if (!out) return NULL;
    memcpy(out, s.ptr, s.len);
    out[s.len] = '\0';
    return out;
}

/* Bytes the backend will be given to prepare, in all (its arena hint): every tensor, vectors
 * as the F32 rows they are converted to, each 64-byte aligned. */
static size_t weight_bytes(const loom__gguf *g) {
    size_t total = 0;
    for (int64_t i = 0; i < loom__gguf_n_tensors(g); i++) {
        const loom__gguf_tensor *t = loom__gguf_tensor_at(g, i);
        int64_t rows = 1;
        for (uint32_t d = 1; d < t->n_dims; d++) rows *= t->ne[d];
        size_t row = 0;
        if (!loom__type_row_bytes(t->type, t->ne[0], &row)) continue;
        size_t bytes = row * (size_t)rows;
        if (rows == 1 && bytes < (size_t)t->ne[0] * sizeof(float))
            bytes = (size_t)t->ne[0] * sizeof(float);
        total += (bytes + 63) & ~(size_t)63;
    }
    return total;
}

loom_status loom__model_tensor(loom_model *m, const char *name, int64_t ne0, int64_t ne1,
                               bool required, loom_weight_use use, loom_tensor *out) {
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
    loom_weight_src src = {
        .name = name,
        .type = (loom_type)t->type,
        .ne = {ne0, ne1},
        .row_stride = row_bytes,
        .data = t->data,
        .persistent = m->use_mmap,
        .use = use,
    };
    float *tmp = NULL;
    if (ne1 == 1 && t->type != LOOM_TYPE_F32) {
        /* Vectors (norm weights) are consumed as F32 by every op: convert once at load. */
        tmp = loom__malloc((size_t)ne0 * sizeof(float));
        LOOM_RETURN_IF(!tmp, LOOM_ERR_OUT_OF_MEMORY, "model: out of memory");
        if (!loom__dequantize_row(t->type, t->data, tmp, ne0)) {
            free(tmp);
            return loom__fail(LOOM_ERR_UNSUPPORTED, "model: cannot convert '%s'", name);
        }
        src.type = LOOM_TYPE_F32;
        src.row_stride = (size_t)ne0 * sizeof(float);
        src.data = tmp;
        src.persistent = false;
    }
    if (ne1 == 1) src.use = LOOM_WEIGHT_VECTOR;
    loom_status st = m->backend->ops->weight_prepare(m->backend->dev, &src, out);
    free(tmp);
    if (st != LOOM_OK) {
        loom__error_prefix("model: preparing '%s'", name);
        return st;
    }
    if (src.persistent && out->data == src.data) m->weights_in_place = true;
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

loom_status loom__model_load_gguf(loom_model *m, const loom_model_params *p) {
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
    LOOM_TRY(loom__model_read_kv_sharing(m->gguf, m->arch_name, &m->cfg));
    int32_t n_tok = loom__tokenizer_n_vocab(m->tok);
    if (m->cfg.n_vocab == 0) m->cfg.n_vocab = n_tok;
    LOOM_RETURN_IF(m->cfg.n_vocab != n_tok, LOOM_ERR_BAD_MODEL,
                   "model: vocab_size %d differs from the tokenizer's %d tokens", m->cfg.n_vocab,
                   n_tok);
    if (p->vocab_only) {
        m->vocab_only = true;
        return LOOM_OK;
    }

    loom_backend_open_params bp = {
        .device = p->device,
        .n_threads = p->n_threads,
        .f32_activations = p->f32_activations,
        .numa = p->numa,
        .weight_bytes = weight_bytes(m->gguf),
    };
    m->n_threads = p->n_threads > 0 ? p->n_threads : loom__cpu_count();
    m->use_mmap = p->use_mmap;
    m->device = p->device;
    LOOM_TRY(loom__backend_open(p->backend, &bp, &m->backend));
    LOOM_TRY(loom__model_bind_weights(m));
    /* Weights the backend copied need the mapped ones no more. */
    if (!m->weights_in_place) loom__gguf_release_data(m->gguf);
    LOOM_TRY(loom__model_check_support(m, LOOM_TYPE_F16, 0));

    m->n_params = 0;
    for (int64_t i = 0; i < loom__gguf_n_tensors(m->gguf); i++) {
        const loom__gguf_tensor *t = loom__gguf_tensor_at(m->gguf, i);
        int64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n *= t->ne[d];
        m->n_params += n;
    }
    return LOOM_OK;
}

static loom_status load_model(loom_model *m, const char *path, const loom_model_params *p) {
    LOOM_TRY(loom__gguf_open(path, &m->gguf));
    return loom__model_load_gguf(m, p);
}

loom_status loom__model_params_in(const loom_model_params *params, loom_model_params *p) {
    *p = loom_model_default_params();
    LOOM_TRY(loom__abi_params_in(p, sizeof *p, params, LOOM__ABI_END(loom_model_params, numa),
                                 "model_params"));
    LOOM_CHECK_ARG(p->n_threads <= 1024);
    LOOM_CHECK_ARG(p->device >= 0);
    LOOM_CHECK_ARG(p->numa >= LOOM_NUMA_AUTO && p->numa <= LOOM_NUMA_ISOLATE);
    return LOOM_OK;
}

loom_model *loom__model_new(void) {
    loom_model *m = loom__calloc(1, sizeof *m);
    if (m) atomic_init(&m->refs, 1);
    return m;
}

loom_status loom_model_load(const char *path, const loom_model_params *params, loom_model **out) {
    loom__clear_error();
    LOOM_CHECK_ARG(path != NULL);
    LOOM_CHECK_ARG(out != NULL);
    loom_model_params p;
    LOOM_TRY(loom__model_params_in(params, &p));
    loom_model *m = loom__model_new();
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

static void model_destroy(loom_model *m) {
    loom__backend_close(m->backend); /* its device owns the prepared weights */
    free(m->layers);
    free(m->cfg.layers);
    free(m->arch_name);
    free(m->name);
    loom__tokenizer_free(m->tok);
    loom__gguf_close(m->gguf);
    free(m->image);
    free(m);
}

void loom__model_retain(loom_model *m) {
    atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
}

void loom__model_release(loom_model *m) {
    /* acq_rel: every use of the model by the releasing threads happens before the destroy. */
    if (atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1) model_destroy(m);
}

void loom_model_free(loom_model *m) {
    if (m) loom__model_release(m);
}

loom_status loom_model_get_info(const loom_model *m, loom_model_info *caller) {
    loom__clear_error();
    LOOM_CHECK_ARG(m != NULL);
    LOOM_CHECK_ARG(caller != NULL);
    loom_model_info info, *out = &info;
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
    out->backend = m->backend ? m->backend->name : NULL;
    out->backend_path = m->backend ? m->backend->path : NULL;
    out->device = m->device;
    return loom__abi_result_out(caller, out, sizeof *out, LOOM__ABI_END(loom_model_info, device),
                                "model_info");
}
