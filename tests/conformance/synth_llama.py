"""synth_llama.py — synthetic llama-architecture GGUF files for conformance tests.

Weights are random (seeded) with enough spread that logits are rarely near-ties; the vocabulary
is a small SentencePiece-style one (control tokens, the 256 byte tokens, then filler pieces) so
that llama.cpp accepts the file. Quantized variants are made with llama.cpp's own quantizer
(llama_model_quantize), as a user would.
"""
import ctypes
import os
from dataclasses import dataclass

import numpy as np
import gguf


@dataclass(frozen=True)
class Shape:
    name: str
    n_vocab: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_layer: int = 2
    tied: bool = False
    rope_base: float = 10000.0
    n_ctx: int = 256
    family: str = "llama"   # "llama", or "qwen2": Q/K/V biases and the NeoX rope layout
    window: int = 0         # Mistral-style sliding window on every layer (0: none)

    @property
    def head_dim(self):
        return self.n_embd // self.n_head


# Gain of the query and key projections: attention scores have a spread of about QK_GAIN^2.
QK_GAIN = 1.0

SHAPES = [
    # MHA, head dim 64, separate output matrix
    Shape("mha", n_vocab=512, n_embd=256, n_head=4, n_head_kv=4, n_ff=512),
    # GQA 4:1, head dim 32, tied embeddings, another rope base
    Shape("gqa", n_vocab=512, n_embd=256, n_head=8, n_head_kv=2, n_ff=768, tied=True,
          rope_base=500000.0),
    # odd vocabulary, head dim 128, 2:1 grouping
    Shape("odd", n_vocab=1001, n_embd=256, n_head=2, n_head_kv=1, n_ff=512),
    # qwen2: biases on Q/K/V, NeoX rope, GQA 2:1, tied output
    Shape("qwen2", n_vocab=640, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, tied=True,
          rope_base=1000000.0, family="qwen2"),
]

# Mistral-style sliding window over a llama model. llama.cpp's llama architecture ignores
# llama.attention.sliding_window, so this one is checked against the float64 reference only.
SWA_SHAPE = Shape("llama-swa", n_vocab=512, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                  window=16)


def spm_vocab(n_vocab):
    """tokens, scores, types of a small SentencePiece-style vocabulary."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    i = 0
    while len(tokens) < n_vocab:
        tokens.append(f"\u2581w{i}")
        types.append(1)
        i += 1
    scores = [0.0] * 259 + [-float(k) for k in range(n_vocab - 259)]
    return tokens[:n_vocab], scores[:n_vocab], types[:n_vocab]


def write_llama(path, shape, seed=1234, arch="llama", skip=(), override=None, edit=None,
                extra_tensors=None):
    """Writes an F32 llama GGUF of the given shape at path.

    For bad-input tests: arch replaces the architecture name, tensors named in skip are left
    out, override maps tensor names to arrays written instead of the random weights, edit(w)
    adds keys to the gguf.GGUFWriter after the hyper-parameters, and extra_tensors maps more
    tensor names to arrays.
    """
    rng = np.random.default_rng(seed)
    s = shape
    hd = s.head_dim
    override = override or {}
    w = gguf.GGUFWriter(path, arch if arch != "llama" else s.family)
    if arch != "llama":
        # GGUFWriter prefixes hyper-parameter keys with the arch; keep them under the family's
        w.arch = s.family
    w.add_name(f"synthetic-{s.name}")
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(s.rope_base)
    w.add_rope_dimension_count(hd)
    if s.window:
        w.add_sliding_window(s.window)
    w.add_file_type(0)
    if edit:
        edit(w)
    tokens, scores, types = spm_vocab(s.n_vocab)
    w.add_tokenizer_model("llama")
    add_tensor = w.add_tensor

    def put(name, value):
        if name in skip:
            return
        value = override.get(name, value)
        if isinstance(value, tuple):  # (raw bytes array, GGMLQuantizationType)
            add_tensor(name, value[0], raw_dtype=value[1])
        else:
            add_tensor(name, value)
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    D, F = s.n_embd, s.n_ff
    q_dim, kv_dim = s.n_head * hd, s.n_head_kv * hd
    # Embedding rows of unit RMS; output logits with a spread of a few units.
    put("token_embd.weight", rng.standard_normal((s.n_vocab, D)).astype(np.float32))
    put("output_norm.weight", norm(D))
    if not s.tied:
        put("output.weight", mat(s.n_vocab, D, gain=4.0))
    for il in range(s.n_layer):
        p = f"blk.{il}."
        put(p + "attn_norm.weight", norm(D))
        put(p + "attn_q.weight", mat(q_dim, D, gain=QK_GAIN))
        put(p + "attn_k.weight", mat(kv_dim, D, gain=QK_GAIN))
        put(p + "attn_v.weight", mat(kv_dim, D))
        if s.family == "qwen2":
            put(p + "attn_q.bias", (0.5 * rng.standard_normal(q_dim)).astype(np.float32))
            put(p + "attn_k.bias", (0.5 * rng.standard_normal(kv_dim)).astype(np.float32))
            put(p + "attn_v.bias", (0.5 * rng.standard_normal(kv_dim)).astype(np.float32))
        put(p + "attn_output.weight", mat(D, q_dim))
        put(p + "ffn_norm.weight", norm(D))
        put(p + "ffn_gate.weight", mat(F, D))
        put(p + "ffn_up.weight", mat(F, D))
        put(p + "ffn_down.weight", mat(D, F))
    for name, value in (extra_tensors or {}).items():
        put(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src, dst, ftype_name):
    """Quantizes src into dst with llama.cpp's quantizer; ftype_name like 'MOSTLY_Q8_0'."""
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_" + ftype_name)
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({ftype_name}) failed with {rc}")
