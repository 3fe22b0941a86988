"""ref_llama.py — an independent float64 numpy forward pass of the llama architecture.

Weights come from the gguf package's reader and dequantizer (not from loom), so this checks
loom's math separately from llama.cpp's (which quantizes activations and rounds through f16).
"""
import numpy as np
import gguf


def load_weights(path):
    r = gguf.GGUFReader(path)
    f = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        f[t.name] = np.asarray(a, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)]
                                                             if len(t.shape) > 1 else [-1])
    return f


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_neox(x, pos, base, n_rot):
    # x: [T, H, hd]; rotates pairs (i, i + n_rot/2) by pos * base^(-2i/n_rot)
    out = x.copy()
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot)
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:n_rot]
    out[..., :half] = x0 * c - x1 * s
    out[..., half:n_rot] = x0 * s + x1 * c
    return out


def rope_normal(x, pos, base, n_rot):
    # x: [T, H, hd]; rotates pairs (2i, 2i+1) by pos * base^(-2i/n_rot)
    out = x.copy()
    i = np.arange(n_rot // 2)
    inv = base ** (-2.0 * i / n_rot)
    ang = pos[:, None] * inv[None, :]                  # [T, n_rot/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
    out[..., 0:n_rot:2] = x0 * c - x1 * s
    out[..., 1:n_rot:2] = x0 * s + x1 * c
    return out


def forward(W, shape, tokens, eps=1e-5, kv_src=None, kv_out=None):
    """Logits [T, V] for tokens at positions 0..T-1 (teacher forcing). kv_src maps a layer to
    the earlier layer whose keys and values it attends over instead of its own (cross-layer
    reuse: the layer computes only its queries). kv_out, a dict, receives each source layer's
    (k after RoPE, v), each [T, n_head_kv, head_dim]."""
    kv_src = kv_src or {}
    kv = {} if kv_out is None else kv_out
    s = shape
    T, H, Hkv, hd = len(tokens), s.n_head, s.n_head_kv, s.head_dim
    pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][np.asarray(tokens)]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    if s.window:  # position p sees j with p - window < j <= p
        mask = mask + np.tril(np.full((T, T), -np.inf), -s.window)
    rope = rope_neox if s.family == "qwen2" else rope_normal
    for il in range(s.n_layer):
        p = f"blk.{il}."
        xn = rms_norm(x, W[p + "attn_norm.weight"], eps)
        q = xn @ W[p + "attn_q.weight"].T + W.get(p + "attn_q.bias", 0.0)
        q = rope(q.reshape(T, H, hd), pos, s.rope_base, hd)
        if kv_src.get(il, il) != il:
            k, v = kv[kv_src[il]]
        else:
            k = xn @ W[p + "attn_k.weight"].T + W.get(p + "attn_k.bias", 0.0)
            v = xn @ W[p + "attn_v.weight"].T + W.get(p + "attn_v.bias", 0.0)
            k = rope(k.reshape(T, Hkv, hd), pos, s.rope_base, hd)
            v = v.reshape(T, Hkv, hd)
            kv[il] = (k, v)
        g = H // Hkv
        att = np.empty((T, H, hd))
        for h in range(H):
            sc = q[:, h, :] @ k[:, h // g, :].T / np.sqrt(hd) + mask
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            sc /= sc.sum(axis=1, keepdims=True)
            att[:, h, :] = sc @ v[:, h // g, :]
        x = x + att.reshape(T, H * hd) @ W[p + "attn_output.weight"].T
        xn = rms_norm(x, W[p + "ffn_norm.weight"], eps)
        gate = xn @ W[p + "ffn_gate.weight"].T
        up = xn @ W[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ W[p + "ffn_down.weight"].T
    xn = rms_norm(x, W["output_norm.weight"], eps)
    out = W.get("output.weight", W["token_embd.weight"])
    return xn @ out.T
