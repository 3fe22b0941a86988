/* tokenizer_special.c — which tokens are special: the end-of-generation set, the control tokens
 * llama.cpp recognises by their text, and the list of tokens matched in input text.
 *
 * GGUF files rarely say which tokens end a turn (an instruct model's "<end_of_turn>" is not its
 * EOS), so llama.cpp recognises them by name and makes them control tokens whatever their
 * stored type. That changes how text containing them is tokenized, so loom applies the same
 * names. Where several tokens carry names from one list, llama.cpp's pick depends on its hash
 * order; loom takes the lowest id. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "tokenizer/tokenizer_impl.h"

#define BAR "\xef\xbd\x9c" /* U+FF5C FULLWIDTH VERTICAL LINE, DeepSeek's marker brackets */
#define SP  "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* Names of end-of-turn, end-of-message and fill-in-the-middle markers, as llama.cpp lists
 * them. */
static const char *const k_eot[] = {"<|eot_id|>",
                                    "<|im_end|>",
                                    "<|end|>",
                                    "<end_of_turn>",
                                    "<|endoftext|>",
                                    "<|end_of_text|>",
                                    "<EOT>",
                                    "_<EOT>",
                                    "[EOT]",
                                    "<" BAR "end" SP "of" SP "sentence" BAR ">",
                                    "<end_of_utterance>",
                                    NULL};
static const char *const k_eom[] = {"<|eom_id|>", NULL};
static const char *const k_fim_pre[] = {"<|fim_prefix|>",
                                        "<fim-prefix>",
                                        "<fim_prefix>",
                                        "<" BAR "fim" SP "begin" BAR ">",
                                        "<PRE>",
                                        SP "<PRE>",
                                        "<|code_prefix|>",
                                        "<|prefix|>",
                                        NULL};
static const char *const k_fim_suf[] = {"<|fim_suffix|>",
                                        "<fim-suffix>",
                                        "<fim_suffix>",
                                        "<" BAR "fim" SP "hole" BAR ">",
                                        "<SUF>",
                                        SP "<SUF>",
                                        "<|code_suffix|>",
                                        "<|suffix|>",
                                        NULL};
static const char *const k_fim_mid[] = {"<|fim_middle|>",
                                        "<fim-middle>",
                                        "<fim_middle>",
                                        "<" BAR "fim" SP "end" BAR ">",
                                        "<MID>",
                                        SP "<MID>",
                                        "<|code_middle|>",
                                        "<|middle|>",
                                        NULL};
static const char *const k_fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                        "<PAD>",       "[PAD]",     NULL};
static const char *const k_fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                        "<REPO>",       "<reponame>",    NULL};
static const char *const k_fim_sep[] = {"<|file_sep|>", NULL};
/* Every token with one of these names ends generation. */
static const char *const k_eog[] = {"<|eot_id|>",
                                    "<|im_end|>",
                                    "<|end|>",
                                    "<|return|>",
                                    "<|call|>",
                                    "<|flush|>",
                                    "<|calls|>",
                                    "<end_of_turn>",
                                    "<|endoftext|>",
                                    "</s>",
                                    "<|eom_id|>",
                                    "<EOT>",
                                    "_<EOT>",
                                    "[EOT]",
                                    "[EOS]",
                                    "<|end_of_text|>",
                                    "<end_of_utterance>",
                                    "<eos>",
                                    "<turn|>",
                                    "<|tool_response>",
                                    "<" BAR "end" SP "of" SP "sentence" BAR ">",
                                    "[e~[",
                                    NULL};

static int32_t find_name(const loom__tokenizer *t, const char *name) {
    return loom__textmap_find(&t->by_text, name, strlen(name));
}

/* The id of the key when present; otherwise the lowest id named in names (made a control
 * token), or -1. */
static int32_t key_or_name(loom__tokenizer *t, loom__tokenizer_opt_id key,
                           const char *const *names) {
    if (key.present) return (int32_t)key.value;
    int32_t best = -1;
    for (size_t i = 0; names[i]; i++) {
        int32_t id = find_name(t, names[i]);
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    if (best >= 0) t->attr[best] |= LOOM__ATTR_CONTROL;
    return best;
}

static loom_status check_key(const loom__tokenizer *t, loom__tokenizer_opt_id v, const char *key) {
    LOOM_RETURN_IF(v.present && (v.value < 0 || v.value >= t->n_vocab), LOOM_ERR_BAD_MODEL,
                   "tokenizer.ggml.%s = %lld is outside the vocabulary (%d tokens)", key,
                   (long long)v.value, (int)t->n_vocab);
    return LOOM_OK;
}

typedef struct len_id {
    size_t len;
    int32_t id;
} len_id;

static int by_len_desc(const void *pa, const void *pb) {
    const len_id *a = pa, *b = pb;
    if (a->len != b->len) return a->len < b->len ? 1 : -1;
    return (a->id > b->id) - (a->id < b->id);
}

loom_status loom__tokenizer_find_specials(loom__tokenizer *t, const loom__tokenizer_spec *spec) {
    LOOM_TRY(check_key(t, spec->fim_pre, "fim_pre_token_id"));
    LOOM_TRY(check_key(t, spec->fim_suf, "fim_suf_token_id"));
    LOOM_TRY(check_key(t, spec->fim_mid, "fim_mid_token_id"));
    LOOM_TRY(check_key(t, spec->fim_pad, "fim_pad_token_id"));
    LOOM_TRY(check_key(t, spec->fim_rep, "fim_rep_token_id"));
    LOOM_TRY(check_key(t, spec->fim_sep, "fim_sep_token_id"));

    /* eot/eom were resolved from their keys; without a key they are found by name. */
    if (t->eot < 0) t->eot = key_or_name(t, (loom__tokenizer_opt_id){0}, k_eot);
    if (t->eom < 0) t->eom = key_or_name(t, (loom__tokenizer_opt_id){0}, k_eom);
    key_or_name(t, spec->fim_pre, k_fim_pre);
    key_or_name(t, spec->fim_suf, k_fim_suf);
    key_or_name(t, spec->fim_mid, k_fim_mid);
    int32_t eog_ids[6] = {key_or_name(t, spec->fim_pad, k_fim_pad),
                          key_or_name(t, spec->fim_rep, k_fim_rep),
                          key_or_name(t, spec->fim_sep, k_fim_sep),
                          t->eos,
                          t->eot,
                          t->eom};
    for (size_t i = 0; i < 6; i++) {
        if (eog_ids[i] >= 0) t->attr[eog_ids[i]] |= LOOM__ATTR_EOG;
    }
    for (size_t i = 0; k_eog[i]; i++) {
        int32_t id = find_name(t, k_eog[i]);
        if (id >= 0) t->attr[id] |= LOOM__ATTR_EOG | LOOM__ATTR_CONTROL;
    }

    /* The tokens matched in input text, longest first so that a token containing another one
     * wins over it. */
    size_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->attr[i] & (LOOM__ATTR_CONTROL | LOOM__ATTR_USER_DEFINED | LOOM__ATTR_UNKNOWN)) n++;
    }
    len_id *tmp = loom__malloc((n ? n : 1) * sizeof *tmp);
    t->specials = loom__malloc((n ? n : 1) * sizeof *t->specials);
    if (!tmp || !t->specials) {
        free(tmp);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    }
    size_t k = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->attr[i] & (LOOM__ATTR_CONTROL | LOOM__ATTR_USER_DEFINED | LOOM__ATTR_UNKNOWN)) {
            tmp[k].len = t->text_off[i + 1] - t->text_off[i];
            tmp[k].id = i;
            k++;
        }
    }
    qsort(tmp, n, sizeof *tmp, by_len_desc);
    for (size_t i = 0; i < n; i++) t->specials[i] = tmp[i].id;
    t->n_specials = n;
    free(tmp);
    return LOOM_OK;
}
