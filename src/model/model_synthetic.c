/* model_synthetic.c — loom_model_load_synthetic: a model of a chosen llama / qwen2 / gemma3
 * shape with seeded random weights, built as a GGUF image in memory and loaded through the same
 * path as a file (loom__model_load_gguf), so everything downstream — backends, engines, the
 * benchmarks on a GPU machine that receives no large files — sees a real model.
 *
 * Weights: float types are uniform with the spread 1/sqrt(fan-in) of a trained layer; block
 * types are random codes (every bit pattern) with f16 scales chosen to give about that spread
 * and a mean near 0. A matrix whose rows are not whole blocks of the type is stored as q8_0
 * (else f16) instead, as llama.cpp's quantizer falls back, and the load logs it. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/log.h"
#include "tensor/fp16.h"
#include "tensor/types.h"

#define SYN_ALIGN 32

/* ------------------------------------------------------------------------------------------ */
/* Presets and parameters                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct syn_preset {
    const char *name, *arch;
    int32_t n_vocab, n_embd, n_head, n_head_kv, head_dim, n_ff, n_layer, n_ctx, window;
    float rope_base;
} syn_preset;

/* The published shapes (config.json of each model). */
static const syn_preset presets[] = {
    {"llama3-8b", "llama", 128256, 4096, 32, 8, 128, 14336, 32, 8192, 0, 500000.0f},
    {"gemma3-270m", "gemma3", 262144, 640, 4, 1, 256, 2048, 18, 32768, 512, 1000000.0f},
    {"qwen2-7b", "qwen2", 152064, 3584, 28, 4, 128, 18944, 28, 32768, 0, 1000000.0f},
    {"smollm2-135m", "llama", 49152, 576, 9, 3, 64, 1536, 30, 8192, 0, 100000.0f},
};

void loom_synthetic_params_init(loom_synthetic_params *out, size_t size) {
    loom_synthetic_params p;
    loom__abi_init(&p, sizeof p);
    p.seed = 1;
    loom__abi_defaults_out(out, size, &p, sizeof p);
}

#define FILL(field)                                                                                \
    if (s->field == 0) s->field = ps->field

static loom_status resolve(loom_synthetic_params *s, bool *tied) {
    if (s->preset != NULL) {
        const syn_preset *ps = NULL;
        for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
            if (strcmp(s->preset, presets[i].name) == 0) ps = &presets[i];
        LOOM_RETURN_IF(ps == NULL, LOOM_ERR_INVALID_ARG,
                       "synthetic: unknown preset '%s' (llama3-8b, gemma3-270m, qwen2-7b, "
                       "smollm2-135m)",
                       s->preset);
        if (s->arch == NULL) s->arch = ps->arch;
        FILL(n_vocab);
        FILL(n_embd);
        FILL(n_head);
        FILL(n_head_kv);
        FILL(head_dim);
        FILL(n_ff);
        FILL(n_layer);
        FILL(n_ctx);
        FILL(window);
        FILL(rope_base);
    }
    LOOM_RETURN_IF(s->arch == NULL, LOOM_ERR_INVALID_ARG, "synthetic: no arch and no preset");
    LOOM_RETURN_IF(strcmp(s->arch, "llama") != 0 && strcmp(s->arch, "qwen2") != 0 &&
                       strcmp(s->arch, "gemma3") != 0,
                   LOOM_ERR_INVALID_ARG, "synthetic: arch '%s' (llama, qwen2 or gemma3)", s->arch);
    if (s->head_dim == 0 && s->n_head > 0) s->head_dim = s->n_embd / s->n_head;
    if (s->n_ctx == 0) s->n_ctx = 4096;
    if (!(s->rope_base > 0.0f)) s->rope_base = 10000.0f;
    LOOM_RETURN_IF(s->n_vocab < 260 || s->n_embd < 1 || s->n_head < 1 || s->n_head_kv < 1 ||
                       s->head_dim < 2 || s->head_dim % 2 != 0 || s->n_ff < 1 || s->n_layer < 1 ||
                       s->n_ctx < 1 || s->window < 0,
                   LOOM_ERR_INVALID_ARG,
                   "synthetic: sizes must be positive (n_vocab %d >= 260, n_embd %d, n_head %d, "
                   "n_head_kv %d, head_dim %d even, n_ff %d, n_layer %d, n_ctx %d, window %d)",
                   s->n_vocab, s->n_embd, s->n_head, s->n_head_kv, s->head_dim, s->n_ff, s->n_layer,
                   s->n_ctx, s->window);
    LOOM_RETURN_IF(s->n_head % s->n_head_kv != 0, LOOM_ERR_INVALID_ARG,
                   "synthetic: n_head %d is not a multiple of n_head_kv %d", s->n_head,
                   s->n_head_kv);
    LOOM_RETURN_IF((int64_t)s->n_vocab * s->n_embd > ((int64_t)1 << 40) ||
                       (int64_t)s->n_ff * s->n_embd > ((int64_t)1 << 40),
                   LOOM_ERR_INVALID_ARG, "synthetic: a matrix of more than 2^40 values");
    if (s->weight_type == NULL) s->weight_type = "f16";
    /* Small models tie the output projection to the embedding, as their releases do. */
    *tied = strcmp(s->arch, "gemma3") == 0 || s->n_embd < 1024;
    return LOOM_OK;
}

static loom_status type_of(const char *name, uint32_t *out) {
    for (uint32_t t = 0; t < LOOM_TYPE_GGUF_END_; t++) {
        const loom__type_traits *tr = loom__type_get_traits(t);
        if (tr != NULL && tr->name != NULL && strcmp(tr->name, name) == 0) {
            LOOM_RETURN_IF(!tr->can_dequantize || t == LOOM_TYPE_Q8_1 || t == LOOM_TYPE_Q8_K,
                           LOOM_ERR_UNSUPPORTED,
                           "synthetic: weight type %s is not a weight format "
                           "loom reads",
                           name);
            *out = t;
            return LOOM_OK;
        }
    }
    return loom__fail(LOOM_ERR_UNSUPPORTED, "synthetic: unknown weight type '%s'", name);
}

/* ------------------------------------------------------------------------------------------ */
/* The tensors                                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef enum syn_kind { SYN_MATRIX, SYN_NORM, SYN_BIAS } syn_kind;

typedef struct syn_tensor {
    char name[64];
    int64_t ne[2];
    uint32_t type;
    syn_kind kind;
    float spread; /* standard deviation of the values */
    uint64_t offset;
    size_t bytes;
} syn_tensor;

typedef struct syn_list {
    syn_tensor *t;
    int n, cap;
    uint32_t want; /* the matrices' type */
    int n_fallback;
} syn_list;

static loom_status add(syn_list *l, const char *name, int64_t ne0, int64_t ne1, syn_kind kind,
                       float spread) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        syn_tensor *t = loom__realloc(l->t, (size_t)cap * sizeof *t);
        LOOM_RETURN_IF(t == NULL, LOOM_ERR_OUT_OF_MEMORY, "synthetic: out of memory");
        l->t = t;
        l->cap = cap;
    }
    syn_tensor *x = &l->t[l->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->ne[0] = ne0;
    x->ne[1] = ne1;
    x->kind = kind;
    x->spread = spread;
    x->type = LOOM_TYPE_F32;
    if (kind == SYN_MATRIX) {
        const loom__type_traits *tr = loom__type_get_traits(l->want);
        x->type = l->want;
        if (ne0 % tr->block_elems != 0) {
            x->type = ne0 % 32 == 0 ? LOOM_TYPE_Q8_0 : LOOM_TYPE_F16;
            l->n_fallback++;
        }
    }
    size_t row;
    LOOM_RETURN_IF(!loom__type_row_bytes(x->type, ne0, &row) ||
                       loom__mul_overflow_size(row, (size_t)ne1, &x->bytes),
                   LOOM_ERR_INVALID_ARG, "synthetic: tensor %s is too large", name);
    return LOOM_OK;
}

static loom_status list_tensors(const loom_synthetic_params *s, bool tied, syn_list *l) {
    const bool gemma = strcmp(s->arch, "gemma3") == 0, qwen = strcmp(s->arch, "qwen2") == 0;
    const int64_t D = s->n_embd, Q = (int64_t)s->n_head * s->head_dim,
                  KV = (int64_t)s->n_head_kv * s->head_dim, F = s->n_ff;
    const float g = 1.0f / sqrtf((float)D);
    LOOM_TRY(add(l, "token_embd.weight", D, s->n_vocab, SYN_MATRIX, 1.0f));
    LOOM_TRY(add(l, "output_norm.weight", D, 1, SYN_NORM, 0.1f));
    if (!tied) LOOM_TRY(add(l, "output.weight", D, s->n_vocab, SYN_MATRIX, 4.0f * g));
    char nm[64];
    for (int32_t il = 0; il < s->n_layer; il++) {
#define T(suffix, ne0, ne1, kind, spread)                                                          \
    do {                                                                                           \
        snprintf(nm, sizeof nm, "blk.%d." suffix, (int)il);                                        \
        LOOM_TRY(add(l, nm, ne0, ne1, kind, spread));                                              \
    } while (0)
        T("attn_norm.weight", D, 1, SYN_NORM, 0.1f);
        T("attn_q.weight", D, Q, SYN_MATRIX, g);
        T("attn_k.weight", D, KV, SYN_MATRIX, g);
        T("attn_v.weight", D, KV, SYN_MATRIX, g);
        if (qwen) {
            T("attn_q.bias", Q, 1, SYN_BIAS, 0.02f);
            T("attn_k.bias", KV, 1, SYN_BIAS, 0.02f);
            T("attn_v.bias", KV, 1, SYN_BIAS, 0.02f);
        }
        if (gemma) {
            T("attn_q_norm.weight", s->head_dim, 1, SYN_NORM, 0.1f);
            T("attn_k_norm.weight", s->head_dim, 1, SYN_NORM, 0.1f);
        }
        T("attn_output.weight", Q, D, SYN_MATRIX, 1.0f / sqrtf((float)Q));
        if (gemma) T("post_attention_norm.weight", D, 1, SYN_NORM, 0.1f);
        T("ffn_norm.weight", D, 1, SYN_NORM, 0.1f);
        T("ffn_gate.weight", D, F, SYN_MATRIX, g);
        T("ffn_up.weight", D, F, SYN_MATRIX, g);
        T("ffn_down.weight", F, D, SYN_MATRIX, 1.0f / sqrtf((float)F));
        if (gemma) T("post_ffw_norm.weight", D, 1, SYN_NORM, 0.1f);
#undef T
    }
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Random values                                                                              */
/* ------------------------------------------------------------------------------------------ */

static uint64_t rng(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1) from 16 random bits. */
static float u16_uniform(uint64_t bits) {
    return (float)(int32_t)((bits & 0xffff) - 0x8000) * (1.0f / 32768.0f);
}

static void put_f16(uint8_t *p, float v) {
    uint16_t h = loom__f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Where a block type keeps its f16 scale (and min), and the spread of d * code for d = 1: the
 * scale that gives the wanted spread, and the min that centres the values. */
typedef struct block_scales {
    int d_at, m_at; /* byte offsets; m_at < 0: no min */
    float code_std; /* spread of the decoded value for d = 1 */
    float m_per_d;  /* min = m_per_d * d (0: none) */
} block_scales;

static block_scales scales_of(uint32_t t) {
    switch (t) {
    case LOOM_TYPE_Q4_0:
        return (block_scales){0, -1, 4.6f, 0.0f};
    case LOOM_TYPE_Q4_1:
        return (block_scales){0, 2, 4.6f, -7.5f};
    case LOOM_TYPE_Q5_0:
        return (block_scales){0, -1, 9.2f, 0.0f};
    case LOOM_TYPE_Q5_1:
        return (block_scales){0, 2, 9.2f, -15.5f};
    case LOOM_TYPE_Q8_0:
        return (block_scales){0, -1, 73.9f, 0.0f};
    case LOOM_TYPE_Q2_K:
        return (block_scales){80, 82, 16.0f, 1.5f};
    case LOOM_TYPE_Q3_K:
        return (block_scales){108, -1, 42.0f, 0.0f};
    case LOOM_TYPE_Q4_K:
        return (block_scales){0, 2, 300.0f, 7.5f};
    case LOOM_TYPE_Q5_K:
        return (block_scales){0, 2, 600.0f, 15.5f};
    case LOOM_TYPE_Q6_K:
        return (block_scales){208, -1, 1370.0f, 0.0f};
    default:
        return (block_scales){-1, -1, 1.0f, 0.0f};
    }
}

static void fill_tensor(const syn_tensor *x, uint8_t *dst, uint64_t *seed) {
    const int64_t n = x->ne[0] * x->ne[1];
    if (x->kind != SYN_MATRIX) { /* F32 vectors */
        float *f = (float *)dst;
        for (int64_t i = 0; i < n; i++) {
            float u = u16_uniform(rng(seed));
            f[i] = x->kind == SYN_NORM ? 1.0f + x->spread * u : x->spread * u;
        }
        return;
    }
    const float a = x->spread * 1.7320508f; /* uniform on [-a, a) has spread a / sqrt(3) */
    switch (x->type) {
    case LOOM_TYPE_F32:
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = a * u16_uniform(rng(seed));
        return;
    case LOOM_TYPE_F16:
    case LOOM_TYPE_BF16:
        for (int64_t i = 0; i < n; i += 4) {
            uint64_t r = rng(seed);
            for (int64_t j = i; j < i + 4 && j < n; j++, r >>= 16) {
                float v = a * u16_uniform(r);
                uint16_t h = x->type == LOOM_TYPE_F16 ? loom__f32_to_f16(v) : loom__f32_to_bf16(v);
                memcpy(dst + 2 * j, &h, 2);
            }
        }
        return;
    default:
        break;
    }
    /* Block types: random codes, then each block's scales. */
    for (size_t i = 0; i < x->bytes; i += 8) {
        uint64_t r = rng(seed);
        memcpy(dst + i, &r, x->bytes - i < 8 ? x->bytes - i : 8);
    }
    const loom__type_traits *tr = loom__type_get_traits(x->type);
    const block_scales bs = scales_of(x->type);
    const float d = x->spread / bs.code_std;
    const size_t blocks = x->bytes / tr->block_bytes;
    for (size_t b = 0; b < blocks; b++) {
        uint8_t *blk = dst + b * tr->block_bytes;
        /* each block's scale varies by up to 2x, as real blocks do */
        const float db = d * (0.75f + 0.25f * u16_uniform(rng(seed)));
        put_f16(blk + bs.d_at, db);
        if (bs.m_at >= 0) put_f16(blk + bs.m_at, bs.m_per_d * db);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The image                                                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct meta_buf {
    uint8_t *p;
    size_t n, cap;
    bool failed;
} meta_buf;

static void put(meta_buf *b, const void *src, size_t n) {
    if (b->failed) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = loom__realloc(b->p, cap);
        if (p == NULL) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(meta_buf *b, uint32_t v) {
    put(b, &v, 4); /* GGUF is little-endian, as every host loom runs on */
}
static void put_u64(meta_buf *b, uint64_t v) {
    put(b, &v, 8);
}
static void put_f32(meta_buf *b, float v) {
    put(b, &v, 4);
}
static void put_str(meta_buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void key(meta_buf *b, const char *arch, const char *k, uint32_t vtype) {
    char full[128];
    snprintf(full, sizeof full, "%s%s%s", arch ? arch : "", arch ? "." : "", k);
    put_str(b, full);
    put_u32(b, vtype);
}

static int write_meta(meta_buf *b, const loom_synthetic_params *s, const syn_list *l) {
    const char *a = s->arch;
    const bool gemma = strcmp(a, "gemma3") == 0;
    int n_kv = 0;
#define KV_U32(k, v) (key(b, a, k, LOOM_GGUF_U32), put_u32(b, (uint32_t)(v)), n_kv++)
#define KV_F32(k, v) (key(b, a, k, LOOM_GGUF_F32), put_f32(b, (float)(v)), n_kv++)
    key(b, NULL, "general.architecture", LOOM_GGUF_STR), put_str(b, a), n_kv++;
    key(b, NULL, "general.name", LOOM_GGUF_STR), put_str(b, s->preset ? s->preset : "synthetic"),
        n_kv++;
    KV_U32("context_length", s->n_ctx);
    KV_U32("embedding_length", s->n_embd);
    KV_U32("block_count", s->n_layer);
    KV_U32("feed_forward_length", s->n_ff);
    KV_U32("attention.head_count", s->n_head);
    KV_U32("attention.head_count_kv", s->n_head_kv);
    KV_U32("attention.key_length", s->head_dim);
    KV_U32("attention.value_length", s->head_dim);
    KV_F32("attention.layer_norm_rms_epsilon", 1e-6);
    KV_F32("rope.freq_base", s->rope_base);
    KV_U32("vocab_size", s->n_vocab);
    if (s->window > 0) KV_U32("attention.sliding_window", s->window);
    if (gemma) KV_U32("attention.sliding_window_pattern", 6);
#undef KV_U32
#undef KV_F32
    /* A SentencePiece-style vocabulary: <unk> <s> </s>, the 256 byte tokens, filler pieces. */
    key(b, NULL, "tokenizer.ggml.model", LOOM_GGUF_STR), put_str(b, "llama"), n_kv++;
    key(b, NULL, "tokenizer.ggml.tokens", LOOM_GGUF_ARR), put_u32(b, LOOM_GGUF_STR),
        put_u64(b, (uint64_t)s->n_vocab), n_kv++;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        char tok[32];
        if (i < 3)
            snprintf(tok, sizeof tok, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(tok, sizeof tok, "<0x%02X>", i - 3);
        else
            snprintf(tok, sizeof tok, "\xe2\x96\x81w%d", i - 259);
        put_str(b, tok);
    }
    key(b, NULL, "tokenizer.ggml.scores", LOOM_GGUF_ARR), put_u32(b, LOOM_GGUF_F32),
        put_u64(b, (uint64_t)s->n_vocab), n_kv++;
    for (int32_t i = 0; i < s->n_vocab; i++) put_f32(b, i < 259 ? 0.0f : -(float)(i - 259));
    key(b, NULL, "tokenizer.ggml.token_type", LOOM_GGUF_ARR), put_u32(b, LOOM_GGUF_I32),
        put_u64(b, (uint64_t)s->n_vocab), n_kv++;
    for (int32_t i = 0; i < s->n_vocab; i++) put_u32(b, i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);
    key(b, NULL, "tokenizer.ggml.unknown_token_id", LOOM_GGUF_U32), put_u32(b, 0), n_kv++;
    key(b, NULL, "tokenizer.ggml.bos_token_id", LOOM_GGUF_U32), put_u32(b, 1), n_kv++;
    key(b, NULL, "tokenizer.ggml.eos_token_id", LOOM_GGUF_U32), put_u32(b, 2), n_kv++;
    /* tensor infos */
    for (int i = 0; i < l->n; i++) {
        const syn_tensor *x = &l->t[i];
        put_str(b, x->name);
        const uint32_t dims = x->ne[1] > 1 ? 2 : 1;
        put_u32(b, dims);
        for (uint32_t d = 0; d < dims; d++) put_u64(b, (uint64_t)x->ne[d]);
        put_u32(b, x->type);
        put_u64(b, x->offset);
    }
    return n_kv;
}

/* The whole image: header, metadata, tensor infos, then the data section. */
static loom_status build_image(const loom_synthetic_params *s, syn_list *l, void **out,
                               size_t *out_size) {
    uint64_t data = 0;
    for (int i = 0; i < l->n; i++) {
        l->t[i].offset = data;
        LOOM_RETURN_IF(loom__add_overflow_u64(
                           data, (l->t[i].bytes + SYN_ALIGN - 1) / SYN_ALIGN * SYN_ALIGN, &data),
                       LOOM_ERR_INVALID_ARG, "synthetic: the weights' size overflows");
    }
    meta_buf m = {0};
    put(&m, "GGUF", 4);
    put_u32(&m, 3);
    put_u64(&m, (uint64_t)l->n);
    put_u64(&m, 0); /* n_kv, set below */
    const int n_kv = write_meta(&m, s, l);
    if (m.failed) {
        free(m.p);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "synthetic: out of memory (metadata)");
    }
    uint64_t nkv = (uint64_t)n_kv;
    memcpy(m.p + 16, &nkv, 8);
    const size_t head = (m.n + SYN_ALIGN - 1) / SYN_ALIGN * SYN_ALIGN;
    size_t total;
    if (loom__add_overflow_size(head, (size_t)data, &total)) {
        free(m.p);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "synthetic: the image's size overflows");
    }
    uint8_t *img = loom__malloc(total);
    if (img == NULL) {
        free(m.p);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY,
                          "synthetic: cannot allocate the %.2f GB image of its weights",
                          (double)total * 1e-9);
    }
    memcpy(img, m.p, m.n);
    memset(img + m.n, 0, head - m.n);
    free(m.p);
    uint64_t seed = s->seed;
    for (int i = 0; i < l->n; i++) {
        uint8_t *dst = img + head + l->t[i].offset;
        fill_tensor(&l->t[i], dst, &seed);
        size_t padded = (l->t[i].bytes + SYN_ALIGN - 1) / SYN_ALIGN * SYN_ALIGN;
        memset(dst + l->t[i].bytes, 0, padded - l->t[i].bytes);
    }
    *out = img;
    *out_size = total;
    return LOOM_OK;
}

loom_status loom_model_load_synthetic(const loom_synthetic_params *sp,
                                      const loom_model_params *params, loom_model **out) {
    loom__clear_error();
    LOOM_CHECK_ARG(sp != NULL && out != NULL);
    loom_synthetic_params s = loom_synthetic_default_params();
    LOOM_TRY(loom__abi_params_in(&s, sizeof s, sp, LOOM__ABI_END(loom_synthetic_params, seed),
                                 "synthetic_params"));
    loom_model_params p;
    LOOM_TRY(loom__model_params_in(params, &p));
    bool tied = false;
    LOOM_TRY(resolve(&s, &tied));
    syn_list l = {0};
    LOOM_TRY(type_of(s.weight_type, &l.want));
    loom_status st = list_tensors(&s, tied, &l);
    loom_model *m = NULL;
    size_t size = 0;
    void *image = NULL;
    if (st == LOOM_OK) st = build_image(&s, &l, &image, &size);
    if (st == LOOM_OK && l.n_fallback > 0)
        LOOM_LOG_I("synthetic: %d matrices whose rows are not whole %s blocks stored as q8_0/f16",
                   l.n_fallback, s.weight_type);
    free(l.t);
    if (st != LOOM_OK) return st;
    m = loom__model_new();
    if (m == NULL) {
        free(image);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "synthetic: out of memory");
    }
    m->image = image;
    st = loom__gguf_open_memory(image, size, &m->gguf);
    if (st == LOOM_OK) st = loom__model_load_gguf(m, &p);
    if (st != LOOM_OK) {
        loom__error_prefix("synthetic model");
        loom_model_free(m);
        return st;
    }
    LOOM_LOG_I("synthetic %s model (%s, %d layers, %s weights, %.2f GB)", s.arch,
               s.preset ? s.preset : "custom", s.n_layer, s.weight_type, (double)size * 1e-9);
    *out = m;
    return LOOM_OK;
}
