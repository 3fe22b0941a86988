/* arch_llama.c — the llama family's configuration: llama (Llama 2/3, SmolLM, TinyLlama,
 * Mistral) and qwen2 (llama with Q/K/V biases and the NeoX rope layout). Mistral-style
 * sliding-window attention applies to every layer when "<arch>.attention.sliding_window" is
 * set. */
#include "model/model.h"

loom_status loom__llama_read_config(const loom__gguf *g, const char *arch, loom__model_config *c) {
    LOOM_TRY(loom__hparams_common(g, arch, c));
    bool qwen2 = c->arch == LOOM_ARCH_QWEN2;
    LOOM_TRY(loom__hparam_dim(g, arch, "attention.sliding_window", false, 0, &c->n_swa));
    for (int32_t il = 0; il < c->n_layer; il++) {
        c->layers[il].window = c->n_swa;
        if (qwen2) c->layers[il].rope.mode = LOOM_ROPE_NEOX;
    }
    return LOOM_OK;
}
