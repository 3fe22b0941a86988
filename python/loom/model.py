"""loom.model — a loaded model (weights, tokenizer, chat template) and the one-sequence Session.

A Model is immutable once loaded and may be shared by any number of threads, sessions and
engines (loom.h's thread-safety rule); a Session is one sequence and must be used by one thread
at a time.
"""
from __future__ import annotations

import ctypes as C
import os
import weakref
from typing import Iterable, Sequence, Union

import numpy as np

from ._ffi import _Handle
from ._ffi import (DETOKENIZE_RENDER_SPECIAL, DETOKENIZE_STRIP_LEADING, LOOM_OK,
                   TOKENIZE_ADD_SPECIAL, TOKENIZE_PARSE_SPECIAL, ChatMessage, LoomError,
                   ModelInfo, ModelParams, SessionParams, _check, _kv_type, _lib, _params,
                   _result)

_BUFFER_TOO_SMALL = 8
Tokens = Union[Sequence[int], np.ndarray]
Messages = Iterable[Union[dict, tuple]]


def _token_array(tokens: Tokens):
    """tokens as something loom reads as int32_t[]: an int32 C-contiguous numpy array is passed
    as it is (no copy); anything else is copied once into a ctypes array. Returns (pointer, n,
    owner) where owner keeps the memory alive."""
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 and tokens.ndim == 1 \
            and tokens.flags.c_contiguous:
        return tokens.ctypes.data_as(C.POINTER(C.c_int32)), len(tokens), tokens
    arr = (C.c_int32 * max(len(tokens), 1))(*tokens)
    return arr, len(tokens), arr


def _chat_messages(messages: Messages):
    """[{"role", "content"}] or [(role, content)] as a loom_chat_message array (and its n)."""
    msgs = list(messages)
    arr = (ChatMessage * max(len(msgs), 1))()
    for i, m in enumerate(msgs):
        role, content = (m["role"], m["content"]) if isinstance(m, dict) else m
        if not isinstance(role, str) or not isinstance(content, str):
            raise TypeError(f"message {i}: role and content must be str")
        arr[i].role = role.encode()
        arr[i].content = content.encode()
    return arr, len(msgs)


class Model(_Handle):
    """A loaded GGUF model (loom_model_load). Use as a context manager or call close(); closing
    the model closes its sessions and engines first.

    Raises LoomError on failure: a missing file is ERR_IO, a file that is not a model loom can
    run ERR_BAD_MODEL, and the message names the file (and the tensor or key at fault)."""
    _what = "model"
    _h = None

    NUMA_MODES = {"auto": 0, "off": 1, "distribute": 2, "isolate": 3}
    # loom_weight_format: the weights as the file stores them, or requantized to FP8 E4M3 rows
    WEIGHT_FORMATS = {"stored": 0, "fp8": 1}
    # The backend a Model uses when none is given: None is loom's AUTO (the best available).
    default_backend = None

    def __init__(self, path: Union[str, os.PathLike], n_threads: int = 0,
                 vocab_only: bool = False, use_mmap: bool = True, f32_activations: bool = False,
                 numa: str = "auto", backend: Union[str, None] = None, device: int = 0,
                 weights: Union[str, int] = "stored"):
        """path: a GGUF file. n_threads: compute threads (0: all cores). vocab_only: load only
        the tokenizer. backend: "cpu", a plugin's name ("cuda") or None (the best available).
        weights: "stored" (the file's types) or "fp8" (matrices requantized to FP8 E4M3)."""
        p = _params(ModelParams, _lib.loom_model_params_init)
        backend = backend if backend is not None else Model.default_backend
        self._backend = backend.encode() if isinstance(backend, str) else backend
        p.backend = self._backend
        p.device = device
        p.f32_activations = f32_activations
        if numa not in Model.NUMA_MODES:
            raise ValueError(f"numa={numa!r}: one of {', '.join(Model.NUMA_MODES)}")
        p.numa = Model.NUMA_MODES[numa]
        p.weights = Model.WEIGHT_FORMATS[weights] if isinstance(weights, str) else weights
        p.n_threads = n_threads
        p.vocab_only = vocab_only
        p.use_mmap = use_mmap
        h = C.c_void_p()
        _check(_lib.loom_model_load(os.fsencode(path), C.byref(p), C.byref(h)))
        self._h = h
        info = _result(ModelInfo)
        _check(_lib.loom_model_get_info(h, C.byref(info)))
        self.info = info
        self.n_vocab: int = info.n_vocab
        self._children = weakref.WeakSet()  # sessions and engines: closed before the model

    def close(self) -> None:
        """Frees the model, after closing every session and engine made from it."""
        if self._h:
            for child in list(self._children):
                child.close()
            _lib.loom_model_free(self._h)
            self._h = None

    # ---- tokenizer ------------------------------------------------------------------------------

    def tokenize(self, text: Union[str, bytes], add_special: bool = True,
                 parse_special: bool = False, as_array: bool = False):
        """The token ids of text (loom_tokenize): a list, or with as_array an int32 numpy array
        over the buffer the library wrote (no copy). add_special adds BOS etc.; parse_special
        turns control-token text into control tokens."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        flags = (TOKENIZE_ADD_SPECIAL if add_special else 0) | \
                (TOKENIZE_PARSE_SPECIAL if parse_special else 0)
        h = self._handle()
        n = C.c_size_t()
        st = _lib.loom_tokenize(h, data, len(data), flags, None, 0, C.byref(n))
        if st not in (LOOM_OK, _BUFFER_TOO_SMALL):
            _check(st)
        buf = (C.c_int32 * max(n.value, 1))()
        _check(_lib.loom_tokenize(h, data, len(data), flags, buf, n.value, C.byref(n)))
        if as_array:
            return np.frombuffer(buf, dtype=np.int32, count=n.value)
        return list(buf[:n.value])

    def detokenize(self, tokens: Tokens, render_special: bool = False,
                   strip_leading: bool = False) -> bytes:
        """The bytes tokens stand for (loom_detokenize); bytes, since a token may end inside a
        UTF-8 character. render_special writes control tokens as their text."""
        arr, count, _keep = _token_array(tokens)
        flags = (DETOKENIZE_RENDER_SPECIAL if render_special else 0) | \
                (DETOKENIZE_STRIP_LEADING if strip_leading else 0)
        h = self._handle()
        n = C.c_size_t()
        st = _lib.loom_detokenize(h, arr, count, flags, None, 0, C.byref(n))
        if st not in (LOOM_OK, _BUFFER_TOO_SMALL):
            _check(st)
        out = C.create_string_buffer(max(n.value, 1))
        _check(_lib.loom_detokenize(h, arr, count, flags, out, n.value, C.byref(n)))
        return out.raw[:n.value]

    def token_to_piece(self, token: int, render_special: bool = False) -> bytes:
        """One token's piece as the vocabulary stores it (loom_token_to_piece)."""
        flags = DETOKENIZE_RENDER_SPECIAL if render_special else 0
        h = self._handle()
        n = C.c_size_t()
        st = _lib.loom_token_to_piece(h, token, flags, None, 0, C.byref(n))
        if st not in (LOOM_OK, _BUFFER_TOO_SMALL):
            _check(st)
        out = C.create_string_buffer(max(n.value, 1))
        _check(_lib.loom_token_to_piece(h, token, flags, out, n.value, C.byref(n)))
        return out.raw[:n.value]

    # ---- chat template --------------------------------------------------------------------------

    def chat_template_name(self) -> str:
        """The chat template loom renders for this model: "gemma", "chatml" or "llama3"."""
        out = C.c_char_p()
        _check(_lib.loom_chat_template_name(self._handle(), C.byref(out)))
        return out.value.decode()

    def chat_format(self, messages: Messages, add_assistant: bool = True) -> str:
        """messages ([{"role", "content"}] or [(role, content)]) rendered in the model's chat
        template, as llama.cpp's llama_chat_apply_template renders them (loom_chat_format).
        add_assistant opens the assistant's turn. Tokenize the text with parse_special=True —
        or, for untrusted contents, use chat_tokenize instead."""
        arr, count = _chat_messages(messages)
        h = self._handle()
        n = C.c_size_t()
        st = _lib.loom_chat_format(h, arr, count, add_assistant, None, 0, C.byref(n))
        if st not in (LOOM_OK, _BUFFER_TOO_SMALL):
            _check(st)
        out = C.create_string_buffer(max(n.value, 1))
        _check(_lib.loom_chat_format(h, arr, count, add_assistant, out, n.value, C.byref(n)))
        return out.raw[:n.value].decode("utf-8")

    def chat_tokenize(self, messages: Messages, add_assistant: bool = True,
                      as_array: bool = False):
        """The prompt tokens of messages in the model's chat template (loom_chat_tokenize):
        control-token text inside a content stays text, so a user cannot open a new turn."""
        arr, count = _chat_messages(messages)
        h = self._handle()
        n = C.c_size_t()
        st = _lib.loom_chat_tokenize(h, arr, count, add_assistant, None, 0, C.byref(n))
        if st not in (LOOM_OK, _BUFFER_TOO_SMALL):
            _check(st)
        buf = (C.c_int32 * max(n.value, 1))()
        _check(_lib.loom_chat_tokenize(h, arr, count, add_assistant, buf, n.value, C.byref(n)))
        if as_array:
            return np.frombuffer(buf, dtype=np.int32, count=n.value)
        return list(buf[:n.value])


class Session(_Handle):
    """One sequence over a model (loom_session): decode tokens, read logits and the KV cache.
    Not thread-safe: one thread at a time."""
    _what = "session"
    _h = None

    def __init__(self, model: Model, n_ctx: int = 0, n_batch: int = 512, block_size: int = 16,
                 kv_f32: bool = False, kv_type: Union[str, int] = "f16", kv_rotate: bool = False,
                 kv_plan: Union[str, os.PathLike, None] = None):
        p = _params(SessionParams, _lib.loom_session_params_init)
        p.n_ctx, p.n_batch, p.block_size, p.kv_f32 = n_ctx, n_batch, block_size, kv_f32
        p.kv_type = _kv_type(kv_type)
        p.kv_rotate = kv_rotate
        p.kv_plan = os.fsencode(kv_plan) if kv_plan is not None else None
        h = C.c_void_p()
        _check(_lib.loom_session_create(model._handle(), C.byref(p), C.byref(h)))
        self._h = h
        self.model = model
        model._children.add(self)

    def close(self) -> None:
        if self._h:
            _lib.loom_session_free(self._h)
            self._h = None

    def reset(self) -> None:
        """Forgets every position (the KV cache is emptied)."""
        _lib.loom_session_reset(self._handle())

    @property
    def n_past(self) -> int:
        """Positions the session holds."""
        return _lib.loom_session_n_past(self._handle())

    def kv_read(self, layer: int, pos: int = 0, n: Union[int, None] = None):
        """The cached keys and values of a layer at positions pos .. pos+n-1 (default: all held),
        as two float32 arrays [n, n_head_kv, head_dim] (loom_session_kv_read)."""
        if n is None:
            n = self.n_past - pos
        info = self.model.info
        shape = (n, info.n_head_kv, info.head_dim)
        k = np.empty(shape, dtype=np.float32)
        v = np.empty(shape, dtype=np.float32)
        fp = C.POINTER(C.c_float)
        _check(_lib.loom_session_kv_read(self._handle(), layer, pos, n, k.ctypes.data_as(fp),
                                         v.ctypes.data_as(fp)))
        return k, v

    def decode(self, tokens: Tokens, all_logits: bool = False, copy: bool = True) -> np.ndarray:
        """Runs tokens (a list, or an int32 numpy array passed without a copy) and returns the
        logits as float32 [n, vocab] (all_logits) or [vocab] (the last token's). With
        copy=False the array is a read-only view of the session's own buffer: no copy of the
        vocabulary-sized rows, valid until the next decode, reset or close."""
        arr, count, _keep = _token_array(tokens)
        h = self._handle()
        _check(_lib.loom_session_decode(h, arr, count, all_logits))
        V = self.model.n_vocab
        shape = (count, V) if all_logits else (V,)
        p = _lib.loom_session_logits(h, 0 if all_logits else -1)
        view = np.ctypeslib.as_array(p, shape=shape)
        if copy:
            return view.copy()
        view.flags.writeable = False
        return view
