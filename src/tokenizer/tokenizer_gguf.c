/* tokenizer_gguf.c — reading the tokenizer.ggml.* keys of a GGUF file into a
 * loom__tokenizer_spec, then building the tokenizer from it. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "tokenizer/tokenizer_impl.h"

#define KEY(name) "tokenizer.ggml." name

static loom_status opt_id(const loom__gguf *g, const char *key, loom__tokenizer_opt_id *out) {
    out->present = loom__gguf_find_kv(g, key) != NULL;
    if (out->present) LOOM_TRY(loom__gguf_get_i64(g, key, true, 0, &out->value));
    return LOOM_OK;
}

static loom_status opt_bool(const loom__gguf *g, const char *key, loom__tokenizer_opt_bool *out) {
    out->present = loom__gguf_find_kv(g, key) != NULL;
    if (out->present) LOOM_TRY(loom__gguf_get_bool(g, key, true, false, &out->value));
    return LOOM_OK;
}

/* A string array as loom__tokenizer_text[] (allocated; the texts stay in the file image). */
static loom_status texts_of(const loom__gguf_value *arr, const char *key,
                            loom__tokenizer_text **out) {
    LOOM_RETURN_IF(arr->arr.n > SIZE_MAX / sizeof(loom__tokenizer_text), LOOM_ERR_BAD_MODEL,
                   "%s: %llu entries", key, (unsigned long long)arr->arr.n);
    size_t n = (size_t)arr->arr.n;
    loom__tokenizer_text *v = loom__malloc((n ? n : 1) * sizeof *v);
    LOOM_RETURN_IF(!v, LOOM_ERR_OUT_OF_MEMORY, "%s: out of memory (%zu entries)", key, n);
    for (size_t i = 0; i < n; i++) {
        v[i].ptr = arr->arr.strs[i].ptr;
        v[i].len = (size_t)arr->arr.strs[i].len;
    }
    *out = v;
    return LOOM_OK;
}

/* tokenizer.ggml.scores: float32 (or int32, which llama.cpp also reads), one per token. */
static loom_status read_scores(const loom__gguf *g, size_t n_vocab, float **out) {
    const loom__gguf_kv *kv = loom__gguf_find_kv(g, KEY("scores"));
    *out = NULL;
    if (!kv) return LOOM_OK;
    const loom__gguf_value *v = &kv->value;
    LOOM_RETURN_IF(v->type != LOOM_GGUF_ARR, LOOM_ERR_BAD_MODEL,
                   KEY("scores") " must be an array of float32 (is %s)",
                   loom__gguf_vtype_name(v->type));
    LOOM_RETURN_IF(v->arr.elem_type != LOOM_GGUF_F32 && v->arr.elem_type != LOOM_GGUF_I32,
                   LOOM_ERR_BAD_MODEL, KEY("scores") " must be an array of float32 (is one of %s)",
                   loom__gguf_vtype_name(v->arr.elem_type));
    LOOM_RETURN_IF(v->arr.n != n_vocab, LOOM_ERR_BAD_MODEL,
                   KEY("scores") " has %llu entries for %zu tokens", (unsigned long long)v->arr.n,
                   n_vocab);
    float *s = loom__malloc((n_vocab ? n_vocab : 1) * sizeof *s);
    LOOM_RETURN_IF(!s, LOOM_ERR_OUT_OF_MEMORY, KEY("scores") ": out of memory");
    for (size_t i = 0; i < n_vocab; i++) {
        s[i] = v->arr.elem_type == LOOM_GGUF_F32 ? loom__gguf_arr_f32(v, i)
                                                 : (float)loom__gguf_arr_i64(v, i);
    }
    *out = s;
    return LOOM_OK;
}

static loom_status read_types(const loom__gguf *g, size_t n_vocab, int32_t **out) {
    const loom__gguf_value *v;
    *out = NULL;
    LOOM_TRY(loom__gguf_get_arr(g, KEY("token_type"), LOOM_GGUF_I32, false, &v));
    if (!v) return LOOM_OK;
    LOOM_RETURN_IF(v->arr.n != n_vocab, LOOM_ERR_BAD_MODEL,
                   KEY("token_type") " has %llu entries for %zu tokens",
                   (unsigned long long)v->arr.n, n_vocab);
    int32_t *t = loom__malloc((n_vocab ? n_vocab : 1) * sizeof *t);
    LOOM_RETURN_IF(!t, LOOM_ERR_OUT_OF_MEMORY, KEY("token_type") ": out of memory");
    for (size_t i = 0; i < n_vocab; i++) t[i] = (int32_t)loom__gguf_arr_i64(v, i);
    *out = t;
    return LOOM_OK;
}

static loom_status read_spec(const loom__gguf *g, loom__tokenizer_spec *spec,
                             loom__tokenizer_text **tokens, loom__tokenizer_text **merges,
                             float **scores, int32_t **types) {
    loom__gguf_str model;
    LOOM_TRY(loom__gguf_get_str(g, KEY("model"), true, &model));
    if (loom__gguf_str_eq(model, "llama")) {
        spec->kind = LOOM_TOKENIZER_SPM;
    } else if (loom__gguf_str_eq(model, "gpt2")) {
        spec->kind = LOOM_TOKENIZER_BPE;
    } else {
        return loom__fail(LOOM_ERR_UNSUPPORTED,
                          KEY("model") " '%.*s' is not supported (loom reads 'llama' and 'gpt2')",
                          (int)(model.len > 64 ? 64 : model.len), model.ptr);
    }
    if (loom__gguf_find_kv(g, KEY("pre"))) {
        loom__gguf_str pre;
        LOOM_TRY(loom__gguf_get_str(g, KEY("pre"), true, &pre));
        spec->pre = (loom__tokenizer_text){pre.ptr ? pre.ptr : "", (size_t)pre.len};
    }

    const loom__gguf_value *arr;
    LOOM_TRY(loom__gguf_get_arr(g, KEY("tokens"), LOOM_GGUF_STR, true, &arr));
    LOOM_TRY(texts_of(arr, KEY("tokens"), tokens));
    spec->tokens = *tokens;
    spec->n_vocab = (size_t)arr->arr.n;
    LOOM_TRY(read_scores(g, spec->n_vocab, scores));
    spec->scores = *scores;
    LOOM_TRY(read_types(g, spec->n_vocab, types));
    spec->types = *types;
    LOOM_TRY(loom__gguf_get_arr(g, KEY("merges"), LOOM_GGUF_STR, false, &arr));
    if (arr) {
        LOOM_TRY(texts_of(arr, KEY("merges"), merges));
        spec->merges = *merges;
        spec->n_merges = (size_t)arr->arr.n;
        spec->has_merges = true;
    }

    LOOM_TRY(opt_id(g, KEY("bos_token_id"), &spec->bos));
    LOOM_TRY(opt_id(g, KEY("eos_token_id"), &spec->eos));
    LOOM_TRY(opt_id(g, KEY("unknown_token_id"), &spec->unk));
    LOOM_TRY(opt_id(g, KEY("padding_token_id"), &spec->pad));
    LOOM_TRY(opt_id(g, KEY("eot_token_id"), &spec->eot));
    LOOM_TRY(opt_id(g, KEY("eom_token_id"), &spec->eom));
    LOOM_TRY(opt_id(g, KEY("fim_pre_token_id"), &spec->fim_pre));
    LOOM_TRY(opt_id(g, KEY("fim_suf_token_id"), &spec->fim_suf));
    LOOM_TRY(opt_id(g, KEY("fim_mid_token_id"), &spec->fim_mid));
    LOOM_TRY(opt_id(g, KEY("fim_pad_token_id"), &spec->fim_pad));
    LOOM_TRY(opt_id(g, KEY("fim_rep_token_id"), &spec->fim_rep));
    LOOM_TRY(opt_id(g, KEY("fim_sep_token_id"), &spec->fim_sep));
    LOOM_TRY(opt_bool(g, KEY("add_bos_token"), &spec->add_bos));
    LOOM_TRY(opt_bool(g, KEY("add_eos_token"), &spec->add_eos));
    LOOM_TRY(opt_bool(g, KEY("add_space_prefix"), &spec->add_space_prefix));
    return LOOM_OK;
}

loom_status loom__tokenizer_load(const loom__gguf *g, loom__tokenizer **out) {
    LOOM_CHECK_ARG(g != NULL && out != NULL);
    loom__tokenizer_spec spec = {0};
    loom__tokenizer_text *tokens = NULL, *merges = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    loom_status st = read_spec(g, &spec, &tokens, &merges, &scores, &types);
    if (st == LOOM_OK) st = loom__tokenizer_create(&spec, out);
    free(tokens);
    free(merges);
    free(scores);
    free(types);
    return st;
}
