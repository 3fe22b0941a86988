"""ref_merge.py — an independent float64 numpy forward pass of the llama architecture with
merged layer pairs (MiniCache-style; loom_backend.h, LOOM_KV_MERGED), written from the
documented rule, not from loom's code.

A pair (a, b), a < b: both layers compute K and V. Each head row x of either layer is kept as
its direction x / |x| and its norm |x|. Layer b's store decides per token, in position order,
inside each block of `block_size` positions: the block keeps `retain` tokens unmerged, those of
the largest distance d = max over heads, K and V of acos(dir_a . dir_b) / pi seen so far (a
newcomer displaces the least distant kept one when its d is strictly larger; an equal distance
keeps the earlier token); a kept token keeps both directions; every other token's direction
becomes e = slerp(dir_a, dir_b, t) (a displaced token is merged from its two directions then).
Layer a reads a position as (its stored direction) * |x_a|, layer b as (its own direction if
kept, else layer a's stored direction) * |x_b|.

Steps matter: layer a attends over this step's own tokens before layer b has merged them, and
over earlier steps' tokens as merged. forward() runs the tokens in chunks of `chunk` positions,
each chunk one step, as a session's decode calls would.
"""
import numpy as np

import ref_llama

ZERO2 = 1e-30
SIN_MIN = 1e-6


def dist(a, b):
    """Angular distance of two directions (vectors of one head)."""
    a2, b2, d = float(a @ a), float(b @ b), float(a @ b)
    if np.isnan(d) or np.isnan(a2) or np.isnan(b2):
        return 1.0
    if a2 < ZERO2 or b2 < ZERO2:
        return 0.0
    return float(np.arccos(np.clip(d, -1.0, 1.0)) / np.pi)


def slerp(a, b, t):
    a2, b2 = float(a @ a), float(b @ b)
    if a2 < ZERO2 or b2 < ZERO2:
        return b.copy() if a2 < ZERO2 and b2 >= ZERO2 else (a.copy() if b2 < ZERO2 and
                                                            a2 >= ZERO2 else 0 * a)
    c = float(np.clip(a @ b, -1.0, 1.0))
    w = np.arccos(c)
    s = np.sin(w)
    if s < SIN_MIN:
        u, v = 1.0 - t, t
        n2 = u * u * a2 + v * v * b2 + 2 * u * v * c
        return a.copy() if n2 < ZERO2 else (u * a + v * b) / np.sqrt(n2)
    return (np.sin((1 - t) * w) * a + np.sin(t * w) * b) / s


def unit(x):
    """Directions and norms of x [T, H, d] per (position, head)."""
    n = np.sqrt(np.sum(x * x, axis=-1))
    d = np.where(n[..., None] > 0, x / np.where(n > 0, n, 1)[..., None], 0.0)
    return d, n


class Pair:
    """The stored state of one merged pair over a sequence."""

    def __init__(self, n_ctx, H, hd):
        self.dir_a = np.zeros((2, n_ctx, H, hd))   # layer a's stored directions (K, V)
        self.kept = np.zeros((2, n_ctx, H, hd))    # layer b's directions where kept
        self.norm = np.zeros((4, n_ctx, H))        # |k_a|, |v_a|, |k_b|, |v_b|
        self.dist = np.zeros(n_ctx)
        self.state = np.full(n_ctx, -1)            # 1: kept, -1: merged

    def store_a(self, p0, k, v):
        for i, x in enumerate((k, v)):
            d, n = unit(x)
            self.dir_a[i, p0:p0 + len(x)] = d
            self.norm[i, p0:p0 + len(x)] = n

    def store_b(self, p0, k, v, retain, block_size, t):
        dk, nk = unit(k)
        dv, nv = unit(v)
        for j in range(len(k)):
            p = p0 + j
            self.norm[2, p], self.norm[3, p] = nk[j], nv[j]
            db = (dk[j], dv[j])
            d = max(dist(self.dir_a[i, p, h], db[i][h]) for i in range(2)
                    for h in range(k.shape[1]))
            self.dist[p] = d
            b0 = p - p % block_size
            kept = [q for q in range(b0, p) if self.state[q] == 1]
            keep = False
            if retain > 0:
                if len(kept) < retain:
                    keep = True
                else:
                    victim = None
                    for q in kept:  # least distant; an equal one: the later goes
                        if victim is None or self.dist[q] <= self.dist[victim]:
                            victim = q
                    if d > self.dist[victim]:
                        self.merge(victim, self.kept[:, victim], t)
                        keep = True
            if keep:
                self.kept[0, p], self.kept[1, p] = db
                self.state[p] = 1
            else:
                self.merge(p, np.stack(db), t)

    def merge(self, p, db, t):
        for i in range(2):
            for h in range(db.shape[1]):
                self.dir_a[i, p, h] = slerp(self.dir_a[i, p, h], db[i, h], t)
        self.state[p] = -1

    def read(self, later, n):
        """K, V [n, H, d] as layer a (later False) or b reads positions 0..n-1."""
        out = []
        for i in range(2):
            d = self.dir_a[i, :n]
            if later:
                d = np.where((self.state[:n] == 1)[:, None, None], self.kept[i, :n], d)
            out.append(d * self.norm[(2 if later else 0) + i, :n, :, None])
        return out


def forward(W, shape, tokens, pairs, retain, block_size, t=0.6, chunk=None, eps=1e-5,
            kv_out=None):
    """Logits [T, V] of tokens at positions 0..T-1 run in steps of `chunk` positions (None: one
    step), with merged pairs {b: a}; retain: rows kept per block. kv_out (a dict) receives
    each layer's K, V as the cache holds them at the end (a pair's earlier layer then reads its
    last step's tokens merged too)."""
    s = shape
    T, H, Hkv, hd = len(tokens), s.n_head, s.n_head_kv, s.head_dim
    chunk = chunk or T
    rope = ref_llama.rope_neox if s.family == "qwen2" else ref_llama.rope_normal
    partner = {**{b: a for b, a in pairs.items()}, **{a: b for b, a in pairs.items()}}
    state = {a: Pair(T, Hkv, hd) for a in pairs.values()}
    cache = {il: (np.zeros((T, Hkv, hd)), np.zeros((T, Hkv, hd))) for il in range(s.n_layer)}
    logits = []
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        n = c1 - c0
        pos = np.arange(c0, c1, dtype=np.float64)
        x = W["token_embd.weight"][np.asarray(tokens[c0:c1])]
        mask = np.full((n, c1), -np.inf)
        for i in range(n):
            mask[i, :c0 + i + 1] = 0.0
        for il in range(s.n_layer):
            p = f"blk.{il}."
            xn = ref_llama.rms_norm(x, W[p + "attn_norm.weight"], eps)
            q = rope((xn @ W[p + "attn_q.weight"].T).reshape(n, H, hd), pos, s.rope_base, hd)
            k = rope((xn @ W[p + "attn_k.weight"].T).reshape(n, Hkv, hd), pos, s.rope_base, hd)
            v = (xn @ W[p + "attn_v.weight"].T).reshape(n, Hkv, hd)
            if il in partner:
                later = partner[il] < il
                st = state[partner[il] if later else il]
                if later:
                    st.store_b(c0, k, v, retain, block_size, t)
                else:
                    st.store_a(c0, k, v)
                K, V = st.read(later, c1)
            else:
                cache[il][0][c0:c1], cache[il][1][c0:c1] = k, v
                K, V = cache[il][0][:c1], cache[il][1][:c1]
            g = H // Hkv
            att = np.empty((n, H, hd))
            for h in range(H):
                sc = q[:, h, :] @ K[:, h // g, :].T / np.sqrt(hd) + mask
                sc = np.exp(sc - sc.max(axis=1, keepdims=True))
                sc /= sc.sum(axis=1, keepdims=True)
                att[:, h, :] = sc @ V[:, h // g, :]
            x = x + att.reshape(n, H * hd) @ W[p + "attn_output.weight"].T
            xn = ref_llama.rms_norm(x, W[p + "ffn_norm.weight"], eps)
            gate = xn @ W[p + "ffn_gate.weight"].T
            up = xn @ W[p + "ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ W[p + "ffn_down.weight"].T
        xn = ref_llama.rms_norm(x, W["output_norm.weight"], eps)
        out = W.get("output.weight", W["token_embd.weight"])
        logits.append(xn @ out.T)
    if kv_out is not None:
        for il in range(s.n_layer):
            if il in partner:
                later = partner[il] < il
                kv_out[il] = state[partner[il] if later else il].read(later, T)
            else:
                kv_out[il] = cache[il]
    return np.concatenate(logits)
