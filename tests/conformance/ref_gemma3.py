"""ref_gemma3.py — an independent float64 numpy forward pass of the Gemma 3 (text) architecture.

Weights come from the gguf package's reader and dequantizer (not from loom), so this checks
loom's math separately from llama.cpp's (which quantizes activations and rounds through f16).

Conventions (read from llama.cpp's gemma3 graph and hparams, HF transformers' Gemma3 code and
the GGUF converter, then confirmed against llama.cpp on gemma-3-270m; a wrong choice for any of
them moves the logits far more than the ~5e-4 by which this reference and llama.cpp agree when
llama.cpp runs the same weights as F32 with an F32 KV cache):

  * Embedding rows are multiplied by sqrt(n_embd) (exact; HF rounds the factor to the weight
    dtype, which is exact only for f32 checkpoints).
  * Norm weights in GGUF already contain Gemma's "+1" (convert_hf_to_gguf.py adds 1 to every
    "*norm.weight"), so rms_norm(x) * w is used as-is. Evidence in the file: for every one of
    the 109 norm tensors of gemma-3-270m, w - 1 is exactly representable in bf16 (the
    checkpoint dtype) while w itself often is not.
  * Per-head RMS norm of q and k (attn_q_norm / attn_k_norm, same eps) before RoPE.
  * RoPE in the NeoX layout (dimension i pairs with i + n_rot/2), over n_rot = head_dim.
    Base: rope.freq_base on global layers; rope.freq_base_swa if the file has it, else 10000,
    on sliding-window (local) layers. Linear rope scaling (rope.scaling.type == "linear",
    position *= 1/factor) applies to global layers only (llama.cpp: freq_scale_swa = 1).
  * Queries are multiplied by 1/sqrt(query_pre_attn_scalar); there is no further scale on
    q.k. llama.cpp (hparams.f_attention_scale) uses n_embd / n_head for the 27B model
    (n_layer == 62: 5376/32 = 168, matching HF's query_pre_attn_scalar = 168) and head_dim
    for every other size; we do the same (override with query_pre_attn_scalar=...).
  * Sliding window (window W = attention.sliding_window): a query at position p attends to a
    key at position j iff j <= p and p - j < W, i.e. the current token plus W - 1 past tokens.
    This is llama.cpp's LLAMA_SWA_TYPE_STANDARD (masked iff p1 - p0 >= n_swa) and HF's
    sliding_window_overlay (kv_idx > q_idx - sliding_window). window_mode="le" (p - j <= W,
    one more key) exists only to show the difference: at p = 512 it moves the logits by 2e-2
    relative against llama.cpp, where "lt" stays at 3e-4.
  * Layer pattern: layer il is global iff (il + 1) % 6 == 0, unless the file has
    attention.sliding_window_pattern (an int n: local iff il % n < n - 1; or a per-layer
    array, nonzero = local). Without attention.sliding_window every layer is global.
  * Attention output -> post_attention_norm -> residual add; ffn_norm; GeGLU with the tanh
    GELU, gelu_tanh(gate) * up; down; post_ffw_norm -> residual add. Final output_norm;
    logits = x @ token_embd^T (tied), unless output.weight exists. No attention soft-capping;
    final_logit_softcapping is applied only if the file carries it with a value > 0.

Against llama.cpp on a quantized file (gemma-3-270m Q4_K_M) expect only ~4-6% RMS relative
logit error and ~94-97% top-1 agreement: llama.cpp rounds activations to Q8_0/Q8_K before every
quantized matmul, and this model amplifies that (its residual stream grows to ~1e4).
"""
import numpy as np
import gguf


# ------------------------------------------------------------------ gguf access

def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def _dequant(t, dtype):
    a = gguf.quants.dequantize(t.data, t.tensor_type)
    shape = [int(x) for x in reversed(t.shape)] if len(t.shape) > 1 else [-1]
    return np.asarray(a, dtype=dtype).reshape(shape)


# ------------------------------------------------------------------ math

def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x * x * x)))


def rope_neox(x, pos, base, n_rot, pos_scale=1.0):
    # x: [T, H, hd]; dimension i (< n_rot/2) pairs with i + n_rot/2, angle pos*scale*base^(-2i/n_rot)
    out = x.copy()
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot)
    ang = (pos * pos_scale)[:, None] * inv[None, :]          # [T, half]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:n_rot]
    out[..., :half] = x0 * c - x1 * s
    out[..., half:n_rot] = x0 * s + x1 * c
    return out


def attention_mask(T, window=None, window_mode="lt"):
    """Additive mask [T, T]: 0 where query p may see key j, -inf elsewhere.
    Causal (j <= p); with a window W also p - j < W ("lt", llama.cpp/HF) or p - j <= W ("le")."""
    p = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    ok = j <= p
    if window is not None:
        if window_mode == "lt":
            ok &= (p - j) < window
        elif window_mode == "le":
            ok &= (p - j) <= window
        else:
            raise ValueError(f"window_mode {window_mode!r}")
    return np.where(ok, 0.0, -np.inf)


# ------------------------------------------------------------------ model

class Gemma3Ref:
    """Weights dequantized to dtype (token_embd / output stay float32 to save memory: the
    embedding is 262144 x 640); compute in dtype, logits in float64 chunks."""

    def __init__(self, path, dtype=np.float64, window_mode="lt", query_pre_attn_scalar=None):
        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture", "gemma3")
        g = lambda k, d=None: _field(r, f"{arch}.{k}", d)
        self.dtype = dtype
        self.n_embd = int(g("embedding_length"))
        self.n_layer = int(g("block_count"))
        self.n_ff = int(g("feed_forward_length"))
        self.n_head = int(g("attention.head_count"))
        self.n_head_kv = int(g("attention.head_count_kv", self.n_head))
        self.head_dim = int(g("attention.key_length", self.n_embd // self.n_head))
        self.head_dim_v = int(g("attention.value_length", self.head_dim))
        self.n_rot = int(g("rope.dimension_count", self.head_dim))
        self.eps = float(g("attention.layer_norm_rms_epsilon", 1e-6))
        self.rope_base = float(g("rope.freq_base", 10000.0))
        self.rope_base_swa = float(g("rope.freq_base_swa", 10000.0))
        scaling = g("rope.scaling.type")
        factor = float(g("rope.scaling.factor", 0.0) or 0.0)
        self.rope_scale = 1.0 / factor if (scaling in (None, "linear") and factor > 0) else 1.0
        if scaling not in (None, "none", "linear"):
            raise NotImplementedError(f"rope scaling {scaling!r}")
        sw = g("attention.sliding_window")
        self.sliding_window = int(sw) if sw else None
        pat = g("attention.sliding_window_pattern", 6)
        if self.sliding_window is None:
            self.is_swa = [False] * self.n_layer
        elif isinstance(pat, (list, tuple)):
            self.is_swa = [bool(v) for v in pat][: self.n_layer]
        else:
            n = int(pat)
            self.is_swa = [n == 0 or il % n < n - 1 for il in range(self.n_layer)]
        self.window_mode = window_mode
        if query_pre_attn_scalar is None:
            query_pre_attn_scalar = (self.n_embd // self.n_head if self.n_layer == 62  # 27B
                                     else self.head_dim)
        self.query_pre_attn_scalar = float(query_pre_attn_scalar)
        self.final_softcap = float(g("final_logit_softcapping", 0.0) or 0.0)

        self.W = {}
        for t in r.tensors:
            keep32 = t.name in ("token_embd.weight", "output.weight")
            self.W[t.name] = _dequant(t, np.float32 if keep32 else dtype)
        self.tok_embd = self.W["token_embd.weight"]                       # [V, n_embd] f32
        self.output = self.W.get("output.weight", self.tok_embd)          # [V, n_embd] f32
        self.n_vocab = self.tok_embd.shape[0]
        del r

    # ---------------------------------------------------------------- per layer

    def layer_rope(self, il):
        """(base, position scale) used by layer il."""
        if self.is_swa[il]:
            return self.rope_base_swa, 1.0
        return self.rope_base, self.rope_scale

    def _layer(self, il, x, pos, masks, trace):
        W, p = self.W, f"blk.{il}."
        T, H, Hkv, hd, hdv = x.shape[0], self.n_head, self.n_head_kv, self.head_dim, self.head_dim_v
        put = (lambda k, v: trace.__setitem__((k, il), v)) if trace is not None else (lambda k, v: None)

        xn = rms_norm(x, W[p + "attn_norm.weight"], self.eps);             put("attn_norm", xn)
        q = (xn @ W[p + "attn_q.weight"].T).reshape(T, H, hd)
        k = (xn @ W[p + "attn_k.weight"].T).reshape(T, Hkv, hd)
        v = (xn @ W[p + "attn_v.weight"].T).reshape(T, Hkv, hdv);         put("Vcur", v)
        q = rms_norm(q, W[p + "attn_q_norm.weight"], self.eps);           put("Qcur_normed", q)
        k = rms_norm(k, W[p + "attn_k_norm.weight"], self.eps);           put("Kcur_normed", k)
        base, scale = self.layer_rope(il)
        q = rope_neox(q, pos, base, self.n_rot, scale);                   put("Qcur", q)
        k = rope_neox(k, pos, base, self.n_rot, scale);                   put("Kcur", k)
        q = q / np.sqrt(self.query_pre_attn_scalar)

        mask = masks[self.is_swa[il]]
        g = H // Hkv
        att = np.empty((T, H, hdv), dtype=x.dtype)
        for h in range(H):
            sc = q[:, h, :] @ k[:, h // g, :].T + mask
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            sc /= sc.sum(axis=1, keepdims=True)
            att[:, h, :] = sc @ v[:, h // g, :]
        put("kqv_out", att)
        a = att.reshape(T, H * hdv) @ W[p + "attn_output.weight"].T;      put("attn_out", a)
        a = rms_norm(a, W[p + "post_attention_norm.weight"], self.eps);   put("attn_post_norm", a)
        x = x + a;                                                        put("sa_out", x)

        xn = rms_norm(x, W[p + "ffn_norm.weight"], self.eps);             put("ffn_norm", xn)
        gate = xn @ W[p + "ffn_gate.weight"].T
        up = xn @ W[p + "ffn_up.weight"].T
        f = (gelu_tanh(gate) * up) @ W[p + "ffn_down.weight"].T;          put("ffn_out", f)
        f = rms_norm(f, W[p + "post_ffw_norm.weight"], self.eps);         put("ffn_post_norm", f)
        return x + f

    # ---------------------------------------------------------------- public

    def hidden_states(self, tokens, n_layers=None, trace=None):
        """Residual stream [T, n_embd] after the embedding scale (index 0) and after each of the
        first n_layers layers (default all), for tokens at positions 0..T-1 (teacher forcing).
        If trace is a dict, per-layer intermediates are stored in it under (name, il), named as
        llama.cpp's graph callbacks name them: attn_norm, Qcur_normed/Kcur_normed ([T, H, hd],
        after the q/k norm), Qcur/Kcur (after RoPE, before the query scale), Vcur, kqv_out
        ([T, H, hd_v], attention before the output projection), attn_out, attn_post_norm,
        sa_out, ffn_norm, ffn_out, ffn_post_norm."""
        n_layers = self.n_layer if n_layers is None else n_layers
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        pos = np.arange(T, dtype=np.float64)
        x = self.tok_embd[tokens].astype(self.dtype) * np.sqrt(float(self.n_embd))
        masks = {False: attention_mask(T),
                 True: attention_mask(T, self.sliding_window, self.window_mode)
                 if self.sliding_window else attention_mask(T)}
        out = [x]
        for il in range(n_layers):
            x = self._layer(il, x, pos, masks, trace)
            out.append(x)
        return out

    def logits(self, tokens, chunk=16384):
        """Logits [T, n_vocab] (float64) at every position."""
        x = self.hidden_states(tokens)[-1]
        xn = rms_norm(x, self.W["output_norm.weight"], self.eps)
        out = np.empty((xn.shape[0], self.n_vocab), dtype=self.dtype)
        for c in range(0, self.n_vocab, chunk):
            out[:, c:c + chunk] = xn @ self.output[c:c + chunk].astype(self.dtype).T
        if self.final_softcap > 0:
            out = np.tanh(out / self.final_softcap) * self.final_softcap
        return out
