"""loom.py — a ctypes binding of libloom (include/loom.h).

The shared library is found through $LOOM_LIB, or build/libloom.so next to this repository.
Errors raise LoomError carrying the status code and loom_last_error()'s message.
"""
import ctypes as C
import os
import pathlib
import weakref

import numpy as np

LOOM_OK = 0
STATUS = {0: "OK", 1: "ERR_INVALID_ARG", 2: "ERR_OUT_OF_MEMORY", 3: "ERR_IO",
          4: "ERR_BAD_MODEL", 5: "ERR_UNSUPPORTED", 6: "ERR_BAD_INPUT",
          7: "ERR_CONTEXT_FULL", 8: "ERR_BUFFER_TOO_SMALL", 9: "ERR_BACKEND",
          10: "ERR_INTERNAL", 11: "ERR_NOT_FOUND", 12: "ERR_BUSY"}
TOKENIZE_ADD_SPECIAL = 1
TOKENIZE_PARSE_SPECIAL = 2
DETOKENIZE_RENDER_SPECIAL = 1
DETOKENIZE_STRIP_LEADING = 2


class LoomError(RuntimeError):
    def __init__(self, status, message):
        super().__init__(f"{STATUS.get(status, status)}: {message}")
        self.status = status
        self.name = STATUS.get(status, str(status))


class ModelParams(C.Structure):
    _fields_ = [("backend", C.c_int), ("n_threads", C.c_int), ("use_mmap", C.c_bool),
                ("vocab_only", C.c_bool), ("f32_activations", C.c_bool), ("numa", C.c_int)]


class ModelInfo(C.Structure):
    _fields_ = [("architecture", C.c_char_p), ("name", C.c_char_p), ("n_vocab", C.c_int32),
                ("n_ctx_train", C.c_int32), ("n_embd", C.c_int32), ("n_layer", C.c_int32),
                ("n_head", C.c_int32), ("n_head_kv", C.c_int32), ("head_dim", C.c_int32),
                ("n_params", C.c_int64), ("file_bytes", C.c_int64), ("bos", C.c_int32),
                ("eos", C.c_int32), ("cpu_kernels", C.c_char_p)]


class SessionParams(C.Structure):
    _fields_ = [("n_ctx", C.c_int32), ("n_batch", C.c_int32), ("block_size", C.c_int32),
                ("kv_f32", C.c_bool)]


def _find_lib():
    env = os.environ.get("LOOM_LIB")
    if env:
        return env
    root = pathlib.Path(__file__).resolve().parent.parent
    for cand in (root / "build" / "libloom.so",):
        if cand.exists():
            return str(cand)
    raise FileNotFoundError("libloom.so not found: set LOOM_LIB")


_lib = C.CDLL(_find_lib())
_lib.loom_last_error.restype = C.c_char_p
_lib.loom_status_str.restype = C.c_char_p
_lib.loom_version.restype = C.c_char_p
_lib.loom_model_default_params.restype = ModelParams
_lib.loom_session_default_params.restype = SessionParams
_lib.loom_model_load.argtypes = [C.c_char_p, C.POINTER(ModelParams), C.POINTER(C.c_void_p)]
_lib.loom_model_free.argtypes = [C.c_void_p]
_lib.loom_model_get_info.argtypes = [C.c_void_p, C.POINTER(ModelInfo)]
_lib.loom_tokenize.argtypes = [C.c_void_p, C.c_char_p, C.c_size_t, C.c_uint,
                               C.POINTER(C.c_int32), C.c_size_t, C.POINTER(C.c_size_t)]
_lib.loom_detokenize.argtypes = [C.c_void_p, C.POINTER(C.c_int32), C.c_size_t, C.c_uint,
                                 C.c_char_p, C.c_size_t, C.POINTER(C.c_size_t)]
_lib.loom_session_create.argtypes = [C.c_void_p, C.POINTER(SessionParams),
                                     C.POINTER(C.c_void_p)]
_lib.loom_session_free.argtypes = [C.c_void_p]
_lib.loom_session_reset.argtypes = [C.c_void_p]
_lib.loom_session_n_past.argtypes = [C.c_void_p]
_lib.loom_session_n_past.restype = C.c_int32
_lib.loom_session_decode.argtypes = [C.c_void_p, C.POINTER(C.c_int32), C.c_int32, C.c_bool]
_lib.loom_session_logits.argtypes = [C.c_void_p, C.c_int32]
_lib.loom_session_logits.restype = C.POINTER(C.c_float)


def _check(status):
    if status != LOOM_OK:
        raise LoomError(status, _lib.loom_last_error().decode("utf-8", "replace"))


def version():
    return _lib.loom_version().decode()


class Model:
    """A loaded GGUF model. Use as a context manager or call close()."""

    _h = None

    NUMA_MODES = {"auto": 0, "off": 1, "distribute": 2, "isolate": 3}

    def __init__(self, path, n_threads=0, vocab_only=False, use_mmap=True,
                 f32_activations=False, numa="auto"):
        p = _lib.loom_model_default_params()
        p.f32_activations = f32_activations
        p.numa = Model.NUMA_MODES[numa]
        p.n_threads = n_threads
        p.vocab_only = vocab_only
        p.use_mmap = use_mmap
        h = C.c_void_p()
        _check(_lib.loom_model_load(os.fsencode(path), C.byref(p), C.byref(h)))
        self._h = h
        info = ModelInfo()
        _check(_lib.loom_model_get_info(h, C.byref(info)))
        self.info = info
        self.n_vocab = info.n_vocab
        self._children = weakref.WeakSet()  # sessions and engines: closed before the model

    def close(self):
        if self._h:
            for child in list(self._children):
                child.close()
            _lib.loom_model_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def tokenize(self, text, add_special=True, parse_special=False):
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        flags = (TOKENIZE_ADD_SPECIAL if add_special else 0) | \
                (TOKENIZE_PARSE_SPECIAL if parse_special else 0)
        n = C.c_size_t()
        st = _lib.loom_tokenize(self._h, data, len(data), flags, None, 0, C.byref(n))
        if st not in (LOOM_OK, 8):
            _check(st)
        buf = (C.c_int32 * max(n.value, 1))()
        _check(_lib.loom_tokenize(self._h, data, len(data), flags, buf, n.value, C.byref(n)))
        return list(buf[:n.value])

    def detokenize(self, tokens, render_special=False, strip_leading=False):
        arr = (C.c_int32 * max(len(tokens), 1))(*tokens)
        flags = (DETOKENIZE_RENDER_SPECIAL if render_special else 0) | \
                (DETOKENIZE_STRIP_LEADING if strip_leading else 0)
        n = C.c_size_t()
        st = _lib.loom_detokenize(self._h, arr, len(tokens), flags, None, 0, C.byref(n))
        if st not in (LOOM_OK, 8):
            _check(st)
        out = C.create_string_buffer(max(n.value, 1))
        _check(_lib.loom_detokenize(self._h, arr, len(tokens), flags, out, n.value, C.byref(n)))
        return out.raw[:n.value]


class Session:
    """One sequence over a model: decode tokens, read logits."""

    _h = None

    def __init__(self, model, n_ctx=0, n_batch=512, block_size=16, kv_f32=False):
        p = _lib.loom_session_default_params()
        p.n_ctx, p.n_batch, p.block_size, p.kv_f32 = n_ctx, n_batch, block_size, kv_f32
        h = C.c_void_p()
        _check(_lib.loom_session_create(model._h, C.byref(p), C.byref(h)))
        self._h = h
        self.model = model
        model._children.add(self)

    def close(self):
        if self._h:
            _lib.loom_session_free(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def reset(self):
        _lib.loom_session_reset(self._h)

    @property
    def n_past(self):
        return _lib.loom_session_n_past(self._h)

    def decode(self, tokens, all_logits=False):
        """Runs tokens; returns logits as a float32 array [n, vocab] (all) or [vocab] (last)."""
        arr = (C.c_int32 * len(tokens))(*tokens)
        _check(_lib.loom_session_decode(self._h, arr, len(tokens), all_logits))
        V = self.model.n_vocab
        if all_logits:
            p = _lib.loom_session_logits(self._h, 0)
            return np.ctypeslib.as_array(p, shape=(len(tokens), V)).copy()
        p = _lib.loom_session_logits(self._h, -1)
        return np.ctypeslib.as_array(p, shape=(V,)).copy()


# ---- engine -----------------------------------------------------------------------------------

class SamplerParams(C.Structure):
    _fields_ = [("temperature", C.c_float), ("top_k", C.c_int32), ("top_p", C.c_float),
                ("seed", C.c_uint64)]


class EngineParams(C.Structure):
    _fields_ = [("kv_bytes", C.c_int64), ("kv_fraction", C.c_float), ("block_size", C.c_int32),
                ("max_batched_tokens", C.c_int32), ("max_seqs", C.c_int32),
                ("max_ctx", C.c_int32), ("prefix_cache", C.c_bool), ("preempt", C.c_int),
                ("fcfs", C.c_bool), ("starvation_s", C.c_double), ("watermark", C.c_float),
                ("on_event", C.c_void_p), ("on_event_user_data", C.c_void_p)]


class RequestParams(C.Structure):
    _fields_ = [("prompt", C.c_char_p), ("prompt_tokens", C.POINTER(C.c_int32)),
                ("n_prompt_tokens", C.c_size_t), ("add_special", C.c_bool),
                ("parse_special", C.c_bool), ("sampler", SamplerParams),
                ("max_tokens", C.c_int32), ("n", C.c_int32),
                ("stop_tokens", C.POINTER(C.c_int32)), ("n_stop_tokens", C.c_size_t),
                ("stop_strings", C.POINTER(C.c_char_p)), ("n_stop_strings", C.c_size_t),
                ("ignore_eos", C.c_bool), ("priority", C.c_int32),
                ("ttft_deadline_s", C.c_double), ("tpot_deadline_s", C.c_double),
                ("cache_salt", C.c_uint64), ("user_data", C.c_void_p)]


class Event(C.Structure):
    _fields_ = [("kind", C.c_int), ("id", C.c_uint64), ("user_data", C.c_void_p),
                ("sample", C.c_int32), ("token", C.c_int32), ("text", C.POINTER(C.c_char)),
                ("text_len", C.c_size_t), ("reason", C.c_int), ("status", C.c_int),
                ("cached_tokens", C.c_int32)]


class EngineStats(C.Structure):
    _fields_ = [("running", C.c_int32), ("waiting", C.c_int32), ("kv_blocks_total", C.c_int32),
                ("kv_blocks_used", C.c_int32), ("kv_blocks_cached", C.c_int32),
                ("kv_blocks_free", C.c_int32), ("prefix_query_tokens", C.c_int64),
                ("prefix_hit_tokens", C.c_int64), ("preemptions", C.c_int64),
                ("steps", C.c_int64), ("tokens_generated", C.c_int64),
                ("requests_finished", C.c_int64)]


EVENT_TOKEN, EVENT_FINISHED, EVENT_FAILED = 0, 1, 2
FINISH_REASONS = ["length", "eos", "stop_token", "stop_string", "cancelled", "context"]

_lib.loom_engine_default_params.restype = EngineParams
_lib.loom_request_default_params.restype = RequestParams
_lib.loom_engine_create.argtypes = [C.c_void_p, C.POINTER(EngineParams), C.POINTER(C.c_void_p)]
_lib.loom_engine_destroy.argtypes = [C.c_void_p]
_lib.loom_engine_submit.argtypes = [C.c_void_p, C.POINTER(RequestParams), C.POINTER(C.c_uint64)]
_lib.loom_engine_cancel.argtypes = [C.c_void_p, C.c_uint64]
_lib.loom_engine_step.argtypes = [C.c_void_p, C.POINTER(C.POINTER(Event)),
                                  C.POINTER(C.c_size_t)]
_lib.loom_engine_has_work.argtypes = [C.c_void_p]
_lib.loom_engine_has_work.restype = C.c_bool
_lib.loom_engine_get_stats.argtypes = [C.c_void_p, C.POINTER(EngineStats)]


class Engine:
    """Continuous batching over a model. submit() returns an id; step() returns events as
    dicts; run() steps until idle and returns {id: {sample: (tokens, text, reason)}}."""

    _h = None

    def __init__(self, model, **params):
        p = _lib.loom_engine_default_params()
        for k, v in params.items():
            setattr(p, k, v)
        h = C.c_void_p()
        _check(_lib.loom_engine_create(model._h, C.byref(p), C.byref(h)))
        self._h = h
        self.model = model
        model._children.add(self)
        self.outputs = {}

    def close(self):
        if self._h:
            _lib.loom_engine_destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def submit(self, prompt=None, tokens=None, max_tokens=32, temperature=0.0, top_k=40,
               top_p=1.0, seed=1, n=1, priority=0, stop=None, stop_tokens=None,
               ignore_eos=True, cache_salt=0, ttft_deadline_s=0.0, tpot_deadline_s=0.0):
        r = _lib.loom_request_default_params()
        keep = []
        if prompt is not None:
            r.prompt = prompt.encode() if isinstance(prompt, str) else prompt
        if tokens is not None:
            arr = (C.c_int32 * max(len(tokens), 1))(*tokens)
            keep.append(arr)
            r.prompt_tokens = arr
            r.n_prompt_tokens = len(tokens)
        r.max_tokens, r.n, r.priority, r.ignore_eos = max_tokens, n, priority, ignore_eos
        r.sampler.temperature, r.sampler.top_k, r.sampler.top_p = temperature, top_k, top_p
        r.sampler.seed = seed
        r.cache_salt = cache_salt
        r.ttft_deadline_s, r.tpot_deadline_s = ttft_deadline_s, tpot_deadline_s
        if stop:
            arr = (C.c_char_p * len(stop))(*[s.encode() for s in stop])
            keep.append(arr)
            r.stop_strings, r.n_stop_strings = arr, len(stop)
        if stop_tokens:
            arr = (C.c_int32 * len(stop_tokens))(*stop_tokens)
            keep.append(arr)
            r.stop_tokens, r.n_stop_tokens = arr, len(stop_tokens)
        rid = C.c_uint64()
        _check(_lib.loom_engine_submit(self._h, C.byref(r), C.byref(rid)))
        self.outputs[rid.value] = {}
        return rid.value

    def cancel(self, rid):
        _check(_lib.loom_engine_cancel(self._h, rid))

    def step(self):
        evp = C.POINTER(Event)()
        n = C.c_size_t()
        _check(_lib.loom_engine_step(self._h, C.byref(evp), C.byref(n)))
        out = []
        for i in range(n.value):
            ev = evp[i]
            d = {"kind": ev.kind, "id": ev.id, "sample": ev.sample, "token": ev.token,
                 "text": C.string_at(ev.text, ev.text_len) if ev.text_len else b"",
                 "reason": ev.reason, "status": ev.status}
            out.append(d)
            o = self.outputs.setdefault(ev.id, {}).setdefault(
                ev.sample, {"tokens": [], "text": b"", "reason": None, "status": 0})
            if ev.kind == EVENT_TOKEN:
                o["tokens"].append(ev.token)
                o["text"] += d["text"]
            elif ev.kind == EVENT_FINISHED:
                o["reason"] = FINISH_REASONS[ev.reason]
                o["cached_tokens"] = ev.cached_tokens
            else:
                o["status"] = ev.status
                o["reason"] = "failed"
        return out

    def has_work(self):
        return bool(_lib.loom_engine_has_work(self._h))

    def run(self, max_steps=100000):
        steps = 0
        while self.has_work() and steps < max_steps:
            self.step()
            steps += 1
        return self.outputs

    def stats(self):
        s = EngineStats()
        _check(_lib.loom_engine_get_stats(self._h, C.byref(s)))
        return {f: getattr(s, f) for f, _ in EngineStats._fields_}
