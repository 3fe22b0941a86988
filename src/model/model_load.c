/* model_load.c — loom_model_load / loom_model_free: open the GGUF file, read the configuration
 * and the tokenizer, open the backend the caller names (the registry, backend/backend.h) and
 * have it prepare every weight tensor — converted first, where the caller asks, to FP8 rows
 * (loom_model_params.weights): here rather than in each backend's weight_prepare, so that one
 * quantizer serves every backend and a backend only has to run (or refuse) the rows. */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "tensor/fp8_rows.h"
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
    p.weights = LOOM_WEIGHTS_AS_STORED;
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
 * as the F32 rows they are converted to, matrices as FP8 rows where they will be, each 64-byte
 * aligned. */
static size_t weight_bytes(const loom__gguf *g, loom_weight_format format) {
    size_t total = 0;
    for (int64_t i = 0; i < loom__gguf_n_tensors(g); i++) {
        const loom__gguf_tensor *t = loom__gguf_tensor_at(g, i);
        int64_t rows = 1;
        for (uint32_t d = 1; d < t->n_dims; d++) rows *= t->ne[d];
        const uint32_t type = rows > 1 && format == LOOM_WEIGHTS_FP8_E4M3
                                  ? (uint32_t)LOOM_TYPE_FP8_E4M3_ROWS
                                  : t->type;
        size_t row = 0;
        if (!loom__type_row_bytes(type, t->ne[0], &row)) continue;
        size_t bytes = row * (size_t)rows;
        if (rows == 1 && bytes < (size_t)t->ne[0] * sizeof(float))
            bytes = (size_t)t->ne[0] * sizeof(float);
        total += (bytes + 63) & ~(size_t)63;
    }
    return total;
}

/* One matrix's conversion to FP8 rows, its rows shared out over the load pool's threads. */
typedef struct fp8_task {
    const loom_weight_src *src;
    uint8_t *dst;    /* [ne[1]] rows of row8 bytes */
    size_t row8;     /* bytes of an FP8 row */
    float *rows;     /* [nth][ne[0]] each thread's decoded row */
    int64_t *failed; /* [nth] each thread's first row that failed (ne[1]: none) */
    bool *nonfinite; /* [nth] whether it failed for a NaN or infinity (else: decoding) */
} fp8_task;

static void fp8_worker(void *p, int ith, int nth) {
    const fp8_task *a = p;
    const int64_t k = a->src->ne[0];
    float *row = a->rows + (size_t)ith * (size_t)k;
    int64_t r0, r1;
    loom__split_range(a->src->ne[1], ith, nth, &r0, &r1);
    a->failed[ith] = a->src->ne[1];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *in = (const uint8_t *)a->src->data + (size_t)r * a->src->row_stride;
        const bool decoded = loom__dequantize_row(a->src->type, in, row, k);
        if (!decoded || !loom__fp8_rows_quantize(row, a->dst + (size_t)r * a->row8, k)) {
            a->failed[ith] = r;
            a->nonfinite[ith] = decoded;
            return;
        }
    }
}

/* Makes *src (a matrix) FP8 rows: each row decoded to float32 and requantized
 * (loom__fp8_rows_quantize) into *conv, which the caller frees once the backend has it; on
 * pool's threads (NULL: the calling thread alone). */
static loom_status to_fp8_rows(loom__threadpool *pool, loom_weight_src *src, void **conv) {
    const int64_t k = src->ne[0], rows = src->ne[1];
    const int nth = pool ? loom__threadpool_size(pool) : 1;
    size_t row8, bytes, row_floats;
    LOOM_RETURN_IF(!loom__type_row_bytes(LOOM_TYPE_FP8_E4M3_ROWS, k, &row8) ||
                       loom__mul_overflow_size(row8, (size_t)rows, &bytes) ||
                       loom__mul_overflow_size((size_t)k, (size_t)nth * sizeof(float), &row_floats),
                   LOOM_ERR_BAD_MODEL, "model: tensor '%s' is too large for FP8 rows", src->name);
    fp8_task t = {.src = src,
                  .dst = loom__malloc(bytes),
                  .row8 = row8,
                  .rows = loom__malloc(row_floats),
                  .failed = loom__malloc((size_t)nth * sizeof(int64_t)),
                  .nonfinite = loom__calloc((size_t)nth, sizeof(bool))};
    loom_status st = LOOM_OK;
    if (!t.dst || !t.rows || !t.failed || !t.nonfinite) {
        st = loom__fail(LOOM_ERR_OUT_OF_MEMORY,
                        "model: out of memory converting '%s' to FP8 rows (%zu bytes)", src->name,
                        bytes);
    } else {
        if (pool && rows >= nth)
            loom__threadpool_run(pool, fp8_worker, &t);
        else
            fp8_worker(&t, 0, 1);
        int64_t bad = rows;
        bool nonfinite = false;
        for (int i = 0; i < (pool && rows >= nth ? nth : 1); i++) {
            if (t.failed[i] < bad) {
                bad = t.failed[i];
                nonfinite = t.nonfinite[i];
            }
        }
        if (bad < rows && nonfinite)
            st = loom__fail(LOOM_ERR_BAD_MODEL,
                            "model: tensor '%s' row %lld holds a NaN or an infinity, which FP8 "
                            "weights cannot represent",
                            src->name, (long long)bad);
        else if (bad < rows)
            st = loom__fail(LOOM_ERR_UNSUPPORTED, "model: cannot decode '%s' (%s)", src->name,
                            loom__type_name(src->type));
    }
    free(t.rows);
    free(t.failed);
    free(t.nonfinite);
    if (st != LOOM_OK) {
        free(t.dst);
        return st;
    }
    src->type = LOOM_TYPE_FP8_E4M3_ROWS;
    src->row_stride = row8;
    src->data = t.dst;
    src->persistent = false;
    *conv = t.dst;
    return LOOM_OK;
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
    const int64_t stored = (int64_t)(src.row_stride * (size_t)ne1);
    void *conv = NULL;
    /* Converting weights: the vectors are copied too, so that nothing keeps the mapped file
     * (whose pages the conversion read) once the model is loaded. */
    if (m->weights == LOOM_WEIGHTS_FP8_E4M3) src.persistent = false;
    if (ne1 > 1 && m->weights == LOOM_WEIGHTS_FP8_E4M3) {
        loom_status cst = to_fp8_rows(m->load_pool, &src, &conv);
        if (cst != LOOM_OK) {
            free(tmp);
            return cst;
        }
    }
    loom_status st = m->backend->ops->weight_prepare(m->backend->dev, &src, out);
    free(tmp);
    free(conv);
    if (st != LOOM_OK) {
        loom__error_prefix("model: preparing '%s'", name);
        return st;
    }
    if (src.persistent && out->data == src.data) m->weights_in_place = true;
    m->weight_bytes_stored += stored;
    m->weight_bytes += (int64_t)(src.row_stride * (size_t)ne1);
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
        .weight_bytes = weight_bytes(m->gguf, p->weights),
    };
    m->n_threads = p->n_threads > 0 ? p->n_threads : loom__cpu_count();
    m->use_mmap = p->use_mmap;
    m->device = p->device;
    m->weights = p->weights;
    LOOM_TRY(loom__backend_open(p->backend, &bp, &m->backend));
    if (m->weights == LOOM_WEIGHTS_FP8_E4M3) {
        /* Asked before any conversion, so that a backend without the rows fails at once. */
        const loom_op_desc mm = {.op = LOOM_OP_MATMUL, .type = LOOM_TYPE_FP8_E4M3_ROWS};
        const loom_op_desc gr = {.op = LOOM_OP_GET_ROWS, .type = LOOM_TYPE_FP8_E4M3_ROWS};
        LOOM_RETURN_IF(!loom__backend_supports(m->backend, &mm) ||
                           !loom__backend_supports(m->backend, &gr),
                       LOOM_ERR_UNSUPPORTED,
                       "model: backend %s does not run FP8 weight rows (weights = fp8 needs a "
                       "backend that does: the cpu backend)",
                       m->backend->name);
    }
    const double t_bind = loom__now_ms();
    /* The conversion's threads, for the load only (none can be had: the calling thread). */
    if (m->weights == LOOM_WEIGHTS_FP8_E4M3 && m->n_threads > 1 &&
        loom__threadpool_create(m->n_threads, LOOM__TP_SPIN_NS, &m->load_pool) != LOOM_OK) {
        loom__clear_error();
        m->load_pool = NULL;
    }
    loom_status bst = loom__model_bind_weights(m);
    loom__threadpool_destroy(m->load_pool);
    m->load_pool = NULL;
    LOOM_TRY(bst);
    if (m->weights == LOOM_WEIGHTS_FP8_E4M3)
        LOOM_LOG_I("weights: FP8 E4M3 rows with per-row scales: %.1f MiB as stored -> %.1f MiB "
                   "(converted in %.0f ms)",
                   (double)m->weight_bytes_stored / 1048576.0, (double)m->weight_bytes / 1048576.0,
                   loom__now_ms() - t_bind);
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
    LOOM_RETURN_IF(p->weights != LOOM_WEIGHTS_AS_STORED && p->weights != LOOM_WEIGHTS_FP8_E4M3,
                   LOOM_ERR_INVALID_ARG,
                   "model_params: weights = %d is not a loom_weight_format (0: as stored, 1: "
                   "fp8_e4m3)",
                   (int)p->weights);
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
    out->weight_bytes = m->weight_bytes;
    return loom__abi_result_out(caller, out, sizeof *out, LOOM__ABI_END(loom_model_info, device),
                                "model_info");
}
