/* synth_model.h — small synthetic models for the C tests that need a whole model (engines on
 * several threads, a recording backend, plugins): an F32 GGUF file of the llama or gemma3
 * architecture with random weights from a fixed seed and a SentencePiece-style vocabulary
 * (control tokens, the 256 byte tokens, then filler pieces), written with gguf_writer.h. The
 * numbers are meaningless; what the tests compare is loom against loom (alone and batched, one
 * thread and two, built-in backend and plugin). */
#pragma once

#include <math.h>
#include <stdio.h>

#include "gguf/gguf_writer.h"

typedef struct synth_shape {
    const char *arch; /* "llama" or "gemma3" (interleaved sliding-window layers) */
    int n_vocab, n_embd, n_head, n_head_kv, n_ff, n_layer, n_ctx;
    int window; /* gemma3: the local layers' sliding window */
} synth_shape;

static const synth_shape SYNTH_LLAMA = {"llama", 320, 64, 4, 2, 128, 2, 256, 0};
/* Layers 0, 1 local (window 8), layer 2 global: two KV groups. */
static const synth_shape SYNTH_GEMMA3 = {"gemma3", 300, 64, 4, 1, 128, 3, 256, 8};

static inline uint64_t synth_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float synth_uniform(uint64_t *s) {
    return (float)((double)(synth_rng(s) >> 11) * 0x1p-52 - 1.0);
}

typedef struct synth_tensor {
    char name[64];
    uint64_t ne[2];
    uint32_t n_dims;
    float gain; /* scale of the uniform weights; a norm vector: 1 + gain * u */
    int is_norm;
} synth_tensor;

static inline void synth_add(synth_tensor *t, int *n, const char *name, uint64_t ne0, uint64_t ne1,
                             float gain, int is_norm) {
    synth_tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->ne[0] = ne0;
    x->ne[1] = ne1;
    x->n_dims = ne1 > 1 ? 2 : 1;
    x->gain = gain;
    x->is_norm = is_norm;
}

/* Writes the model of shape s to path. Returns 0 on success. */
static inline int synth_write(const char *path, const synth_shape *s, uint64_t seed) {
    const int gemma = strcmp(s->arch, "gemma3") == 0;
    const int hd = s->n_embd / s->n_head, D = s->n_embd, F = s->n_ff;
    synth_tensor t[256];
    int nt = 0;
    char nm[64];
    synth_add(t, &nt, "token_embd.weight", D, s->n_vocab, 1.0f, 0);
    synth_add(t, &nt, "output_norm.weight", D, 1, 0.2f, 1);
    if (!gemma) synth_add(t, &nt, "output.weight", D, s->n_vocab, 4.0f / sqrtf((float)D), 0);
    for (int il = 0; il < s->n_layer; il++) {
#define LAYER(suffix, ne0, ne1, gain, norm)                                                        \
    snprintf(nm, sizeof nm, "blk.%d." suffix, il), synth_add(t, &nt, nm, ne0, ne1, gain, norm)
        const float g = 1.0f / sqrtf((float)D);
        LAYER("attn_norm.weight", D, 1, 0.2f, 1);
        LAYER("attn_q.weight", D, s->n_head * hd, g, 0);
        LAYER("attn_k.weight", D, s->n_head_kv * hd, g, 0);
        LAYER("attn_v.weight", D, s->n_head_kv * hd, g, 0);
        if (gemma) {
            LAYER("attn_q_norm.weight", hd, 1, 0.2f, 1);
            LAYER("attn_k_norm.weight", hd, 1, 0.2f, 1);
        }
        LAYER("attn_output.weight", s->n_head * hd, D, 1.0f / sqrtf((float)(s->n_head * hd)), 0);
        if (gemma) LAYER("post_attention_norm.weight", D, 1, 0.2f, 1);
        LAYER("ffn_norm.weight", D, 1, 0.2f, 1);
        LAYER("ffn_gate.weight", D, F, g, 0);
        LAYER("ffn_up.weight", D, F, g, 0);
        LAYER("ffn_down.weight", F, D, 1.0f / sqrtf((float)F), 0);
        if (gemma) LAYER("post_ffw_norm.weight", D, 1, 0.2f, 1);
#undef LAYER
    }

    tbuf kv = {0};
    int n_kv = 0;
    char key[96];
#define KEY(k) (snprintf(key, sizeof key, "%s." k, s->arch), key)
    tb_kv(&kv, "general.architecture", LOOM_GGUF_STR), tb_str(&kv, s->arch), n_kv++;
    tb_kv(&kv, "general.name", LOOM_GGUF_STR), tb_str(&kv, "synthetic"), n_kv++;
    tb_kv(&kv, KEY("context_length"), LOOM_GGUF_U32), tb_u32(&kv, (uint32_t)s->n_ctx), n_kv++;
    tb_kv(&kv, KEY("embedding_length"), LOOM_GGUF_U32), tb_u32(&kv, (uint32_t)D), n_kv++;
    tb_kv(&kv, KEY("block_count"), LOOM_GGUF_U32), tb_u32(&kv, (uint32_t)s->n_layer), n_kv++;
    tb_kv(&kv, KEY("feed_forward_length"), LOOM_GGUF_U32), tb_u32(&kv, (uint32_t)F), n_kv++;
    tb_kv(&kv, KEY("attention.head_count"), LOOM_GGUF_U32), tb_u32(&kv, (uint32_t)s->n_head),
        n_kv++;
    tb_kv(&kv, KEY("attention.head_count_kv"), LOOM_GGUF_U32), tb_u32(&kv, (uint32_t)s->n_head_kv),
        n_kv++;
    tb_kv(&kv, KEY("attention.layer_norm_rms_epsilon"), LOOM_GGUF_F32), tb_f32(&kv, 1e-5f), n_kv++;
    tb_kv(&kv, KEY("rope.freq_base"), LOOM_GGUF_F32), tb_f32(&kv, 10000.0f), n_kv++;
    if (gemma) {
        tb_kv(&kv, KEY("attention.sliding_window"), LOOM_GGUF_U32),
            tb_u32(&kv, (uint32_t)s->window), n_kv++;
        tb_kv(&kv, KEY("attention.sliding_window_pattern"), LOOM_GGUF_U32), tb_u32(&kv, 3), n_kv++;
    }
#undef KEY
    tb_kv(&kv, "tokenizer.ggml.model", LOOM_GGUF_STR), tb_str(&kv, "llama"), n_kv++;
    tb_kv(&kv, "tokenizer.ggml.tokens", LOOM_GGUF_ARR), tb_arr(&kv, LOOM_GGUF_STR, s->n_vocab);
    for (int i = 0; i < s->n_vocab; i++) {
        char tok[32];
        if (i < 3)
            snprintf(tok, sizeof tok, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(tok, sizeof tok, "<0x%02X>", i - 3);
        else
            snprintf(tok, sizeof tok, "\xe2\x96\x81w%d", i - 259);
        tb_str(&kv, tok);
    }
    n_kv++;
    tb_kv(&kv, "tokenizer.ggml.scores", LOOM_GGUF_ARR), tb_arr(&kv, LOOM_GGUF_F32, s->n_vocab);
    for (int i = 0; i < s->n_vocab; i++) tb_f32(&kv, i < 259 ? 0.0f : -(float)(i - 259));
    n_kv++;
    tb_kv(&kv, "tokenizer.ggml.token_type", LOOM_GGUF_ARR), tb_arr(&kv, LOOM_GGUF_I32, s->n_vocab);
    for (int i = 0; i < s->n_vocab; i++) tb_u32(&kv, i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);
    n_kv++;
    tb_kv(&kv, "tokenizer.ggml.unknown_token_id", LOOM_GGUF_U32), tb_u32(&kv, 0), n_kv++;
    tb_kv(&kv, "tokenizer.ggml.bos_token_id", LOOM_GGUF_U32), tb_u32(&kv, 1), n_kv++;
    tb_kv(&kv, "tokenizer.ggml.eos_token_id", LOOM_GGUF_U32), tb_u32(&kv, 2), n_kv++;

    tbuf b = {0};
    tb_header(&b, 3, (uint64_t)nt, (uint64_t)n_kv);
    tb_put(&b, kv.p, kv.n);
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        tb_tensor(&b, t[i].name, t[i].n_dims, t[i].ne, LOOM_TYPE_F32, off);
        off += (t[i].ne[0] * t[i].ne[1] * 4 + 31) / 32 * 32;
    }
    tb_pad(&b, 32);
    uint64_t rng = seed;
    for (int i = 0; i < nt; i++) {
        const uint64_t n = t[i].ne[0] * t[i].ne[1];
        for (uint64_t k = 0; k < n; k++) {
            float u = synth_uniform(&rng);
            tb_f32(&b, t[i].is_norm ? 1.0f + t[i].gain * u : t[i].gain * u * 1.7f);
        }
        tb_pad(&b, 32);
    }
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(b.p, 1, b.n, f) == b.n ? 0 : -1;
    if (f && fclose(f) != 0) rc = -1;
    tb_free(&kv);
    tb_free(&b);
    return rc;
}

/* A path in the tests' scratch folder ($LOOM_TEST_TMP, else /tmp) for `name`. */
static inline const char *synth_path(char *buf, size_t cap, const char *name) {
    const char *dir = getenv("LOOM_TEST_TMP");
    snprintf(buf, cap, "%s/%s", dir && *dir ? dir : "/tmp", name);
    return buf;
}
