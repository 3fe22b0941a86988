"""loom.sampler — the sampler chain (bias, penalties, entropy correction, temperature, top-k,
top-p, min-p, typical-p, draw) over logits you hold, and the keyword form of its settings that
Engine requests share.
"""
from __future__ import annotations

import ctypes as C

import numpy as np

from ._ffi import (ENTROPY_MODES, LogitBias, SamplerParams, TokenInfo, _check, _lib, _params,
                   _result)


def _sampler_params(p, keep, logit_bias=None, entropy_mode=None, **fields):
    """Sets SamplerParams p from keyword arguments (field names of loom_sampler_params;
    logit_bias as {id: bias} or [(id, bias)]; entropy_mode by name or number). keep collects
    the arrays that must outlive the call."""
    names = {f for f, _ in SamplerParams._fields_} - {"size", "logit_bias", "n_logit_bias"}
    for k, v in fields.items():
        if k not in names:
            raise TypeError(f"unknown sampler setting {k!r}")
        setattr(p, k, v)
    if entropy_mode is not None:
        p.entropy_mode = ENTROPY_MODES.get(entropy_mode, entropy_mode)
    if logit_bias:
        pairs = list(logit_bias.items() if isinstance(logit_bias, dict) else logit_bias)
        arr = (LogitBias * len(pairs))(*[LogitBias(int(i), float(b)) for i, b in pairs])
        keep.append(arr)
        p.logit_bias = arr
        p.n_logit_bias = len(pairs)


class Sampler:
    """The sampler chain over logits you hold (loom_sampler_run): run() returns the token's
    TokenInfo.to_dict(). Settings default to loom_sampler_default_params()."""

    _h = None

    def __init__(self, n_vocab: int):
        h = C.c_void_p()
        _check(_lib.loom_sampler_create(n_vocab, C.byref(h)))
        self._h = h
        self.n_vocab = n_vocab

    def close(self):
        if self._h:
            _lib.loom_sampler_free(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def run(self, logits, history=(), draw_index: int = 0, **sampler) -> dict:
        """Draws one token from logits (float32 [n_vocab]) with the settings given by keyword
        (loom_sampler_params field names); history: the tokens penalties look back over;
        draw_index: the position the draw is keyed on (with seed)."""
        lg = np.ascontiguousarray(logits, dtype=np.float32)
        if lg.shape != (self.n_vocab,):
            raise ValueError(f"logits of shape {lg.shape}, want ({self.n_vocab},)")
        p = _params(SamplerParams, _lib.loom_sampler_params_init)
        keep = []
        _sampler_params(p, keep, **sampler)
        hist = (C.c_int32 * max(len(history), 1))(*history)
        info = _result(TokenInfo)
        _check(_lib.loom_sampler_run(self._h, lg.ctypes.data_as(C.POINTER(C.c_float)),
                                     C.byref(p), hist, len(history), draw_index,
                                     C.byref(info)))
        return info.to_dict()
