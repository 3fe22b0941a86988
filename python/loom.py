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
          10: "ERR_INTERNAL", 11: "ERR_NOT_FOUND", 12: "ERR_BUSY", 13: "ERR_NO_DEVICE",
          14: "ERR_OVERLOADED"}
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
    _fields_ = [("size", C.c_size_t), ("backend", C.c_char_p), ("device", C.c_int32), ("n_threads", C.c_int),
                ("use_mmap", C.c_bool),
                ("vocab_only", C.c_bool), ("f32_activations", C.c_bool), ("numa", C.c_int),
                ("weights", C.c_int)]


class ModelInfo(C.Structure):
    _fields_ = [("size", C.c_size_t), ("architecture", C.c_char_p), ("name", C.c_char_p), ("n_vocab", C.c_int32),
                ("n_ctx_train", C.c_int32), ("n_embd", C.c_int32), ("n_layer", C.c_int32),
                ("n_head", C.c_int32), ("n_head_kv", C.c_int32), ("head_dim", C.c_int32),
                ("n_params", C.c_int64), ("file_bytes", C.c_int64), ("bos", C.c_int32),
                ("eos", C.c_int32), ("cpu_kernels", C.c_char_p), ("backend", C.c_char_p),
                ("backend_path", C.c_char_p), ("device", C.c_int32), ("weight_bytes", C.c_int64)]


class SessionParams(C.Structure):
    _fields_ = [("size", C.c_size_t), ("n_ctx", C.c_int32), ("n_batch", C.c_int32), ("block_size", C.c_int32),
                ("kv_f32", C.c_bool), ("kv_type", C.c_int), ("kv_rotate", C.c_bool),
                ("kv_plan", C.c_char_p)]

# loom_kv_cache_type: how a session or an engine stores keys and values
KV_TYPES = {"f16": 0, "bf16": 1, "f32": 2, "fp8_e4m3": 3, "fp8_e5m2": 4}


def _kv_type(v):
    if isinstance(v, str):
        if v not in KV_TYPES:
            raise ValueError(f"unknown kv_type {v!r} (one of {', '.join(KV_TYPES)})")
        return KV_TYPES[v]
    return int(v)


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
_lib.loom_model_params_init.argtypes = [C.POINTER(ModelParams), C.c_size_t]
_lib.loom_model_params_init.restype = None
_lib.loom_session_params_init.argtypes = [C.POINTER(SessionParams), C.c_size_t]
_lib.loom_session_params_init.restype = None


def _params(cls, init):
    """A parameter struct with the library's defaults (loom_*_params_init): its size field is
    this binding's sizeof, so the library reads exactly the fields bound here."""
    p = cls()
    init(C.byref(p), C.sizeof(p))
    return p


def _result(cls):
    """A result struct to hand the library: its size field says how much it may write."""
    r = cls()
    r.size = C.sizeof(r)
    return r


def _fields(struct):
    """The struct's fields as a dict, without its size."""
    return {f: getattr(struct, f) for f, _ in struct._fields_ if f != "size"}
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
_lib.loom_session_kv_read.argtypes = [C.c_void_p, C.c_int32, C.c_int32, C.c_int32,
                                      C.POINTER(C.c_float), C.POINTER(C.c_float)]
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
    # loom_weight_format: the weights as the file stores them, or requantized to FP8 E4M3 rows
    WEIGHT_FORMATS = {"stored": 0, "fp8": 1}
    # The backend a Model uses when none is given: None is loom's AUTO (the best available).
    default_backend = None

    def __init__(self, path, n_threads=0, vocab_only=False, use_mmap=True,
                 f32_activations=False, numa="auto", backend=None, device=0, weights="stored"):
        p = _params(ModelParams, _lib.loom_model_params_init)
        backend = backend if backend is not None else Model.default_backend
        self._backend = backend.encode() if isinstance(backend, str) else backend
        p.backend = self._backend
        p.device = device
        p.f32_activations = f32_activations
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

    def __init__(self, model, n_ctx=0, n_batch=512, block_size=16, kv_f32=False, kv_type="f16",
                 kv_rotate=False, kv_plan=None):
        p = _params(SessionParams, _lib.loom_session_params_init)
        p.n_ctx, p.n_batch, p.block_size, p.kv_f32 = n_ctx, n_batch, block_size, kv_f32
        p.kv_type = _kv_type(kv_type)
        p.kv_rotate = kv_rotate
        p.kv_plan = os.fsencode(kv_plan) if kv_plan is not None else None
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

    def kv_read(self, layer, pos=0, n=None):
        """The cached keys and values of a layer at positions pos .. pos+n-1 (default: all held),
        as two float32 arrays [n, n_head_kv, head_dim] (loom_session_kv_read)."""
        if n is None:
            n = self.n_past - pos
        info = self.model.info
        shape = (n, info.n_head_kv, info.head_dim)
        k = np.empty(shape, dtype=np.float32)
        v = np.empty(shape, dtype=np.float32)
        fp = C.POINTER(C.c_float)
        _check(_lib.loom_session_kv_read(self._h, layer, pos, n, k.ctypes.data_as(fp),
                                         v.ctypes.data_as(fp)))
        return k, v

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


# ---- sampler and engine -------------------------------------------------------------------------

ENTROPY_MODES = {"none": 0, "exp": 1, "edt": 2, "dynatemp": 3}


class LogitBias(C.Structure):
    _fields_ = [("id", C.c_int32), ("bias", C.c_float)]


class SamplerParams(C.Structure):
    _fields_ = [("size", C.c_size_t), ("temperature", C.c_float), ("top_k", C.c_int32), ("top_p", C.c_float),
                ("seed", C.c_uint64), ("min_p", C.c_float), ("typical_p", C.c_float),
                ("logit_bias", C.POINTER(LogitBias)), ("n_logit_bias", C.c_size_t),
                ("penalty_last_n", C.c_int32), ("repeat_penalty", C.c_float),
                ("presence_penalty", C.c_float), ("frequency_penalty", C.c_float),
                ("entropy_mode", C.c_int), ("exp_beta", C.c_float), ("edt_n", C.c_float),
                ("edt_theta", C.c_float), ("edt_h_min", C.c_float), ("dyn_t_min", C.c_float),
                ("dyn_t_max", C.c_float), ("dyn_exponent", C.c_float),
                ("n_logprobs", C.c_int32)]


class TokenLogprob(C.Structure):
    _fields_ = [("id", C.c_int32), ("logprob", C.c_float)]


class TokenInfo(C.Structure):
    _fields_ = [("size", C.c_size_t), ("token", C.c_int32), ("logprob_raw", C.c_float), ("logprob_final", C.c_float),
                ("n_candidates", C.c_int32), ("entropy", C.c_double),
                ("varentropy", C.c_double), ("entropy_final", C.c_double),
                ("temperature", C.c_double), ("top_raw", C.POINTER(TokenLogprob)),
                ("top_final", C.POINTER(TokenLogprob)), ("n_top_raw", C.c_int32),
                ("n_top_final", C.c_int32)]

    def to_dict(self):
        """A copy that outlives the engine step (the C arrays do not)."""
        return {"token": self.token, "logprob_raw": self.logprob_raw,
                "logprob_final": self.logprob_final, "n_candidates": self.n_candidates,
                "entropy": self.entropy, "varentropy": self.varentropy,
                "entropy_final": self.entropy_final, "temperature": self.temperature,
                "top_raw": [(self.top_raw[k].id, self.top_raw[k].logprob)
                            for k in range(self.n_top_raw)],
                "top_final": [(self.top_final[k].id, self.top_final[k].logprob)
                              for k in range(self.n_top_final)]}


class EngineParams(C.Structure):
    _fields_ = [("size", C.c_size_t), ("kv_bytes", C.c_int64), ("kv_fraction", C.c_float), ("block_size", C.c_int32),
                ("max_batched_tokens", C.c_int32), ("max_seqs", C.c_int32),
                ("max_ctx", C.c_int32), ("prefix_cache", C.c_bool), ("preempt", C.c_int),
                ("fcfs", C.c_bool), ("starvation_s", C.c_double), ("watermark", C.c_float),
                ("on_event", C.c_void_p), ("on_event_user_data", C.c_void_p),
                ("max_logprobs", C.c_int32), ("trace", C.c_void_p),
                ("n_sample_threads", C.c_int32), ("record_path", C.c_char_p),
                ("admission", C.c_int), ("kv_type", C.c_int), ("kv_rotate", C.c_bool),
                ("kv_plan", C.c_char_p)]

ADMISSION = {"admit_all": 0, "reject_late": 1, "degrade": 2}  # loom_admission_policy


class RequestParams(C.Structure):
    _fields_ = [("size", C.c_size_t), ("prompt", C.c_char_p),
                ("prompt_tokens", C.POINTER(C.c_int32)),
                ("n_prompt_tokens", C.c_size_t), ("add_special", C.c_bool),
                ("parse_special", C.c_bool), ("sampler", C.POINTER(SamplerParams)),
                ("max_tokens", C.c_int32), ("n", C.c_int32),
                ("stop_tokens", C.POINTER(C.c_int32)), ("n_stop_tokens", C.c_size_t),
                ("stop_strings", C.POINTER(C.c_char_p)), ("n_stop_strings", C.c_size_t),
                ("ignore_eos", C.c_bool), ("priority", C.c_int32),
                ("ttft_deadline_s", C.c_double), ("tpot_deadline_s", C.c_double),
                ("cache_salt", C.c_uint64), ("user_data", C.c_void_p),
                ("arrival_s", C.c_double)]


class Event(C.Structure):
    _fields_ = [("kind", C.c_int), ("id", C.c_uint64), ("user_data", C.c_void_p),
                ("sample", C.c_int32), ("token", C.c_int32), ("text", C.POINTER(C.c_char)),
                ("text_len", C.c_size_t), ("reason", C.c_int), ("status", C.c_int),
                ("cached_tokens", C.c_int32), ("info", C.POINTER(TokenInfo))]


class EngineStats(C.Structure):
    _fields_ = [("size", C.c_size_t), ("running", C.c_int32), ("waiting", C.c_int32), ("kv_blocks_total", C.c_int32),
                ("kv_blocks_used", C.c_int32), ("kv_blocks_cached", C.c_int32),
                ("kv_blocks_free", C.c_int32), ("prefix_query_tokens", C.c_int64),
                ("prefix_hit_tokens", C.c_int64), ("preemptions", C.c_int64),
                ("steps", C.c_int64), ("tokens_generated", C.c_int64),
                ("requests_finished", C.c_int64),
                ("ttft_count", C.c_int64), ("ttft_mean_s", C.c_double),
                ("ttft_p50_s", C.c_double), ("ttft_p99_s", C.c_double),
                ("tpot_count", C.c_int64), ("tpot_mean_s", C.c_double),
                ("tpot_p50_s", C.c_double), ("tpot_p99_s", C.c_double),
                ("busy_s", C.c_double), ("tokens_per_s", C.c_double),
                ("tokens_per_s_recent", C.c_double), ("step_base_s", C.c_double),
                ("step_per_token_s", C.c_double), ("step_per_ctx_s", C.c_double),
                ("rejected", C.c_int64), ("degraded", C.c_int64)]


class ClassStats(C.Structure):
    _fields_ = [("size", C.c_size_t), ("priority", C.c_int32), ("admitted", C.c_int64),
                ("rejected", C.c_int64), ("degraded", C.c_int64), ("ended", C.c_int64),
                ("ttft_deadlines", C.c_int64), ("ttft_met", C.c_int64),
                ("preemptions", C.c_int64), ("tokens_generated", C.c_int64),
                ("ttft_p50_s", C.c_double), ("ttft_p99_s", C.c_double),
                ("tpot_p50_s", C.c_double), ("tpot_p99_s", C.c_double)]


class KvGroupInfo(C.Structure):
    _fields_ = [("size", C.c_size_t), ("n_groups", C.c_int32), ("window", C.c_int32), ("n_layers", C.c_int32),
                ("block_size", C.c_int32), ("block_bytes", C.c_int64),
                ("blocks_total", C.c_int32), ("blocks_used", C.c_int32),
                ("blocks_cached", C.c_int32), ("blocks_free", C.c_int32),
                ("slots_unused", C.c_int64), ("window_releases", C.c_int64),
                ("evictions", C.c_int64), ("cow_copies", C.c_int64)]


LATENCY_WINDOW = 1024  # LOOM_ENGINE_LATENCY_WINDOW
RATE_WINDOW = 64       # LOOM_ENGINE_RATE_WINDOW


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


_lib.loom_sampler_params_init.argtypes = [C.POINTER(SamplerParams), C.c_size_t]
_lib.loom_sampler_params_init.restype = None
_lib.loom_sampler_create.argtypes = [C.c_int32, C.POINTER(C.c_void_p)]
_lib.loom_sampler_free.argtypes = [C.c_void_p]
_lib.loom_sampler_run.argtypes = [C.c_void_p, C.POINTER(C.c_float), C.POINTER(SamplerParams),
                                  C.POINTER(C.c_int32), C.c_size_t, C.c_uint64,
                                  C.POINTER(TokenInfo)]


class Sampler:
    """The sampler chain over logits you hold (loom_sampler_run): run() returns the token's
    TokenInfo.to_dict(). Settings default to loom_sampler_default_params()."""

    _h = None

    def __init__(self, n_vocab):
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

    def run(self, logits, history=(), draw_index=0, **sampler):
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


EVENT_TOKEN, EVENT_FINISHED, EVENT_FAILED = 0, 1, 2
FINISH_REASONS = ["length", "eos", "stop_token", "stop_string", "cancelled", "context"]

_lib.loom_engine_params_init.argtypes = [C.POINTER(EngineParams), C.c_size_t]
_lib.loom_engine_params_init.restype = None
_lib.loom_request_params_init.argtypes = [C.POINTER(RequestParams), C.c_size_t]
_lib.loom_request_params_init.restype = None
_lib.loom_engine_create.argtypes = [C.c_void_p, C.POINTER(EngineParams), C.POINTER(C.c_void_p)]
_lib.loom_engine_create_replay.argtypes = [C.c_void_p, C.c_char_p, C.POINTER(EngineParams),
                                           C.POINTER(C.c_void_p)]
_lib.loom_engine_destroy.argtypes = [C.c_void_p]
_lib.loom_engine_submit.argtypes = [C.c_void_p, C.POINTER(RequestParams), C.POINTER(C.c_uint64)]
_lib.loom_engine_cancel.argtypes = [C.c_void_p, C.c_uint64]
_lib.loom_engine_step.argtypes = [C.c_void_p, C.POINTER(C.POINTER(C.POINTER(Event))),
                                  C.POINTER(C.c_size_t)]
_lib.loom_engine_has_work.argtypes = [C.c_void_p]
_lib.loom_engine_has_work.restype = C.c_bool
_lib.loom_engine_get_stats.argtypes = [C.c_void_p, C.POINTER(EngineStats)]
_lib.loom_engine_get_class_stats.argtypes = [C.c_void_p, C.c_int32, C.POINTER(ClassStats)]
_lib.loom_engine_predict_ttft.argtypes = [C.c_void_p, C.POINTER(RequestParams),
                                          C.POINTER(C.c_double)]
_lib.loom_engine_get_kv_group.argtypes = [C.c_void_p, C.c_int32, C.POINTER(KvGroupInfo)]
_lib.loom_engine_now.restype = C.c_double
_lib.loom_engine_now.argtypes = []


class Generation(C.Structure):
    _fields_ = [("id", C.c_uint64), ("text", C.POINTER(C.c_char)), ("text_len", C.c_size_t),
                ("tokens", C.POINTER(C.c_int32)), ("n_tokens", C.c_size_t),
                ("reason", C.c_int), ("cached_tokens", C.c_int32)]


EVENT_FN = C.CFUNCTYPE(None, C.POINTER(Event), C.c_void_p)
_lib.loom_engine_generate.argtypes = [C.c_void_p, C.POINTER(RequestParams), EVENT_FN,
                                      C.c_void_p, C.POINTER(C.POINTER(Generation))]
_lib.loom_generation_free.argtypes = [C.POINTER(Generation)]


def engine_now():
    """loom_engine_now(): seconds of the engines' monotonic clock (for submit's arrival_s)."""
    return _lib.loom_engine_now()


# ---- per-token trace ----------------------------------------------------------------------------

TRACE_FORMATS = {"jsonl": 0, "chrome": 1}


class TraceInfo(C.Structure):
    _fields_ = [("size", C.c_size_t), ("n_steps", C.c_size_t), ("n_tokens", C.c_size_t), ("n_dropped", C.c_uint64)]


_lib.loom_trace_create.argtypes = [C.POINTER(C.c_void_p)]
_lib.loom_trace_free.argtypes = [C.c_void_p]
_lib.loom_trace_clear.argtypes = [C.c_void_p]
_lib.loom_trace_count.argtypes = [C.c_void_p]
_lib.loom_trace_count.restype = C.c_size_t
_lib.loom_trace_get_info.argtypes = [C.c_void_p, C.POINTER(TraceInfo)]
_lib.loom_trace_write.argtypes = [C.c_void_p, C.c_char_p, C.c_int]
_lib.loom_trace_write_buffer.argtypes = [C.c_void_p, C.c_int, C.c_char_p, C.c_size_t,
                                         C.POINTER(C.c_size_t)]


def _trace_format(fmt):
    if fmt not in TRACE_FORMATS and fmt not in TRACE_FORMATS.values():
        raise ValueError(f"trace format {fmt!r}: want 'jsonl' or 'chrome'")
    return TRACE_FORMATS.get(fmt, fmt)


class Trace:
    """A per-token trace (loom_trace): pass it as Engine(model, trace=t). It records every
    engine step's phases and every produced token; write() saves it as JSON Lines ("jsonl") or
    Chrome trace-event JSON ("chrome"), to_string() returns the same text. An engine keeps a
    reference to its trace, and close() refuses while an open engine still uses it."""

    _h = None

    def __init__(self):
        h = C.c_void_p()
        _check(_lib.loom_trace_create(C.byref(h)))
        self._h = h
        self._users = weakref.WeakSet()  # engines recording into it

    def close(self):
        if any(u._h for u in self._users):
            raise RuntimeError("trace: an open engine still records into it; close it first")
        if self._h:
            _lib.loom_trace_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Engines hold a reference, so none can be open when the trace is collected.
        if self._h:
            _lib.loom_trace_free(self._h)
            self._h = None

    def _handle(self):
        if not self._h:
            raise ValueError("trace: used after close()")
        return self._h

    def clear(self):
        _lib.loom_trace_clear(self._handle())

    def count(self):
        """Token records held."""
        return _lib.loom_trace_count(self._handle())

    def info(self):
        """{"n_steps", "n_tokens", "n_dropped"}."""
        i = _result(TraceInfo)
        _check(_lib.loom_trace_get_info(self._handle(), C.byref(i)))
        return {"n_steps": i.n_steps, "n_tokens": i.n_tokens, "n_dropped": i.n_dropped}

    def write(self, path, fmt="jsonl"):
        _check(_lib.loom_trace_write(self._handle(), os.fsencode(path), _trace_format(fmt)))

    def to_string(self, fmt="jsonl"):
        """The trace as text (loom_trace_write_buffer): the size first, then the text; retried
        when records arrive in between."""
        f = _trace_format(fmt)
        h = self._handle()
        n = C.c_size_t()
        for _ in range(8):
            st = _lib.loom_trace_write_buffer(h, f, None, 0, C.byref(n))
            if st not in (LOOM_OK, 8):
                _check(st)
            buf = C.create_string_buffer(max(n.value, 1))
            st = _lib.loom_trace_write_buffer(h, f, buf, n.value, C.byref(n))
            if st == LOOM_OK:
                return buf.raw[:n.value].decode("utf-8")
            if st != 8:
                _check(st)
        raise LoomError(8, "trace: it kept growing while being written")


class Engine:
    """Continuous batching over a model. submit() returns an id; step() returns events as
    dicts; run() steps until idle and returns {id: {sample: {"tokens", "text", "reason",
    "info"}}}, where "info" holds one TokenInfo.to_dict() per token (logprobs, entropies,
    effective temperature, top alternatives). trace: a Trace to record into (the engine keeps
    a reference, so the trace outlives it). record_path: a file to record the engine's inputs
    into; replay: such a file, for an engine that replays it (loom_engine_create_replay: it
    takes its parameters from the record, only trace and n_sample_threads from here, and no
    submit; run() replays every recorded step, giving the recorded run's events)."""

    _h = None

    def __init__(self, model, trace=None, replay=None, **params):
        p = _params(EngineParams, _lib.loom_engine_params_init)
        for k, v in params.items():
            if k not in {f for f, _ in EngineParams._fields_} - {"size"}:
                raise TypeError(f"unknown engine parameter {k!r}")
            if k in ("record_path", "kv_plan") and isinstance(v, str):
                v = os.fsencode(v)
            if k == "admission" and isinstance(v, str):
                v = ADMISSION[v]
            if k == "kv_type":
                v = _kv_type(v)
            setattr(p, k, v)
        if trace is not None:
            if not isinstance(trace, Trace) or not trace._h:
                raise TypeError("trace must be an open loom.Trace")
            p.trace = trace._h
        self.trace = trace
        h = C.c_void_p()
        if replay is not None:
            _check(_lib.loom_engine_create_replay(model._h, os.fsencode(replay), C.byref(p),
                                                  C.byref(h)))
        else:
            _check(_lib.loom_engine_create(model._h, C.byref(p), C.byref(h)))
        self._h = h
        self.model = model
        model._children.add(self)
        if trace is not None:
            trace._users.add(self)
        self.outputs = {}

    def close(self):
        if self._h:
            _lib.loom_engine_destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()

    @staticmethod
    def _request(prompt=None, tokens=None, max_tokens=32, temperature=0.0, top_k=40,
                 top_p=1.0, seed=1, n=1, priority=0, stop=None, stop_tokens=None,
                 ignore_eos=True, cache_salt=0, ttft_deadline_s=0.0, tpot_deadline_s=0.0,
                 arrival_s=0.0, logit_bias=None, entropy_mode=None, **sampler):
        """RequestParams from submit()'s arguments, and the arrays it points to."""
        r = _params(RequestParams, _lib.loom_request_params_init)
        sp = _params(SamplerParams, _lib.loom_sampler_params_init)
        keep = [sp]
        _sampler_params(sp, keep, logit_bias=logit_bias, entropy_mode=entropy_mode, **sampler)
        r.sampler = C.pointer(sp)
        if prompt is not None:
            r.prompt = prompt.encode() if isinstance(prompt, str) else prompt
        if tokens is not None:
            arr = (C.c_int32 * max(len(tokens), 1))(*tokens)
            keep.append(arr)
            r.prompt_tokens = arr
            r.n_prompt_tokens = len(tokens)
        r.max_tokens, r.n, r.priority, r.ignore_eos = max_tokens, n, priority, ignore_eos
        sp.temperature, sp.top_k, sp.top_p = temperature, top_k, top_p
        sp.seed = seed
        r.cache_salt = cache_salt
        r.ttft_deadline_s, r.tpot_deadline_s = ttft_deadline_s, tpot_deadline_s
        r.arrival_s = arrival_s
        if stop:
            arr = (C.c_char_p * len(stop))(*[s.encode() for s in stop])
            keep.append(arr)
            r.stop_strings, r.n_stop_strings = arr, len(stop)
        if stop_tokens:
            arr = (C.c_int32 * len(stop_tokens))(*stop_tokens)
            keep.append(arr)
            r.stop_tokens, r.n_stop_tokens = arr, len(stop_tokens)
        return r, keep

    def submit(self, prompt=None, tokens=None, **kw):
        """Queues a request; returns its id. Arguments (all by keyword): prompt (text) or
        tokens; max_tokens, n, priority, stop (strings), stop_tokens, ignore_eos (default
        True), cache_salt, ttft_deadline_s, tpot_deadline_s, arrival_s (engine_now() seconds;
        0: now); temperature (default 0: greedy), top_k, top_p, seed, and any other
        loom_sampler_params field by name (min_p, typical_p, penalty_last_n, repeat_penalty,
        presence_penalty, frequency_penalty, exp_beta, edt_n, edt_theta, edt_h_min, dyn_t_min,
        dyn_t_max, dyn_exponent, n_logprobs); logit_bias: {token id: bias} or [(id, bias)];
        entropy_mode: "none", "exp", "edt", "dynatemp" or its number."""
        r, keep = self._request(prompt=prompt, tokens=tokens, **kw)
        rid = C.c_uint64()
        _check(_lib.loom_engine_submit(self._h, C.byref(r), C.byref(rid)))
        self.outputs[rid.value] = {}
        return rid.value

    def generate(self, prompt=None, tokens=None, on_event=None, **kw):
        """loom_engine_generate: submits one request (submit()'s arguments; n must be 1), steps
        until it ends and returns {"id", "text" (bytes), "tokens", "reason", "cached_tokens"}.
        Events of other requests run in those steps are recorded in self.outputs as step()
        records them; on_event(dict), if given, also sees every event (this request's too)."""
        r, keep = self._request(prompt=prompt, tokens=tokens, **kw)

        def deliver(evp, _user):
            d = self._record(evp[0])
            if on_event is not None:
                on_event(d)

        cb = EVENT_FN(deliver)
        g = C.POINTER(Generation)()
        _check(_lib.loom_engine_generate(self._h, C.byref(r), cb, None, C.byref(g)))
        try:
            out = g[0]
            res = {"id": out.id, "text": C.string_at(out.text, out.text_len),
                   "tokens": list(out.tokens[:out.n_tokens]) if out.n_tokens else [],
                   "reason": FINISH_REASONS[out.reason], "cached_tokens": out.cached_tokens}
        finally:
            _lib.loom_generation_free(g)
        return res

    def cancel(self, rid):
        _check(_lib.loom_engine_cancel(self._h, rid))

    def step(self):
        evp = C.POINTER(C.POINTER(Event))()
        n = C.c_size_t()
        _check(_lib.loom_engine_step(self._h, C.byref(evp), C.byref(n)))
        return [self._record(evp[i][0]) for i in range(n.value)]

    def _record(self, ev):
        """The event as a dict, also added to self.outputs."""
        d = {"kind": ev.kind, "id": ev.id, "sample": ev.sample, "token": ev.token,
             "text": C.string_at(ev.text, ev.text_len) if ev.text_len else b"",
             "reason": ev.reason, "status": ev.status}
        o = self.outputs.setdefault(ev.id, {}).setdefault(
            ev.sample, {"tokens": [], "text": b"", "reason": None, "status": 0, "info": []})
        if ev.kind == EVENT_TOKEN:
            d["info"] = ev.info[0].to_dict() if ev.info else None
            o["tokens"].append(ev.token)
            o["text"] += d["text"]
            o["info"].append(d["info"])
        elif ev.kind == EVENT_FINISHED:
            o["reason"] = FINISH_REASONS[ev.reason]
            o["cached_tokens"] = ev.cached_tokens
        else:
            o["status"] = ev.status
            o["reason"] = "failed"
        return d

    def has_work(self):
        return bool(_lib.loom_engine_has_work(self._h))

    def run(self, max_steps=100000):
        steps = 0
        while self.has_work() and steps < max_steps:
            self.step()
            steps += 1
        return self.outputs

    def stats(self):
        s = _result(EngineStats)
        _check(_lib.loom_engine_get_stats(self._h, C.byref(s)))
        return _fields(s)

    def class_stats(self, priority):
        """loom_engine_get_class_stats: the service figures of one priority class as a dict
        (admitted, rejected, degraded, ended, ttft_deadlines, ttft_met, preemptions, ...)."""
        s = _result(ClassStats)
        _check(_lib.loom_engine_get_class_stats(self._h, priority, C.byref(s)))
        return _fields(s)

    def predict_ttft(self, prompt=None, tokens=None, **kw):
        """loom_engine_predict_ttft: the TTFT in seconds the engine predicts for a request with
        submit()'s arguments if it were submitted now (-1 before the first step)."""
        r, keep = self._request(prompt=prompt, tokens=tokens, **kw)
        out = C.c_double()
        _check(_lib.loom_engine_predict_ttft(self._h, C.byref(r), C.byref(out)))
        return out.value

    def kv_groups(self):
        """Every KV group's pool as a list of dicts (loom_kv_group_info's fields)."""
        out, g, n = [], 0, 1
        while g < n:
            s = _result(KvGroupInfo)
            _check(_lib.loom_engine_get_kv_group(self._h, g, C.byref(s)))
            out.append(_fields(s))
            n, g = s.n_groups, g + 1
        return out
