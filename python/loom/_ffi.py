"""loom._ffi — the ctypes layer of the loom package: the shared library, its status codes, the
structs of include/loom.h (same names, same layouts: tests/conformance/test_abi_layout.py checks
them against the header) and every function's prototype.

The library is found, in order, through $LOOM_LIBRARY (an installed libloom), $LOOM_LIB (the
name the test suite uses), the libloom.so that `pip install ./python` put inside this package,
and build/libloom.so of the source tree this file sits in.

ctypes releases the GIL around every foreign call (CDLL, not PyDLL), so a thread in a long
libloom call (a model load, an engine step, loom_engine_generate) never stops other Python
threads; a callback into Python takes it back for the callback's duration only.
"""
import ctypes as C
import os
import pathlib

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


class _Handle:
    """An object that owns a library handle in self._h, released by its close(): usable in a
    with statement, closed when collected, and checked on use (_handle())."""
    _what = "object"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()

    def _handle(self):
        if not self._h:
            raise ValueError(f"{self._what}: used after close()")
        return self._h


class LoomError(RuntimeError):
    """A libloom call failed: status is its loom_status code, name that code's name
    ("ERR_IO", ...), message loom_last_error()'s text (which names the file, tensor or field)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{STATUS.get(status, status)}: {message}")
        self.status = status
        self.name = STATUS.get(status, str(status))
        self.message = message


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
    """The path of the libloom to load (see the module's docstring for the order)."""
    for var in ("LOOM_LIBRARY", "LOOM_LIB"):
        env = os.environ.get(var)
        if env:
            if not os.path.exists(env):
                raise FileNotFoundError(f"${var}={env}: no such file")
            return env
    here = pathlib.Path(__file__).resolve().parent
    for cand in (here / "libloom.so", here.parent.parent / "build" / "libloom.so"):
        if cand.exists():
            return str(cand)
    raise FileNotFoundError("libloom.so not found: install the package with `pip install ./python`"
                            ", or set LOOM_LIBRARY to an installed libloom.so")


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




_lib.loom_sampler_params_init.argtypes = [C.POINTER(SamplerParams), C.c_size_t]
_lib.loom_sampler_params_init.restype = None
_lib.loom_sampler_create.argtypes = [C.c_int32, C.POINTER(C.c_void_p)]
_lib.loom_sampler_free.argtypes = [C.c_void_p]
_lib.loom_sampler_run.argtypes = [C.c_void_p, C.POINTER(C.c_float), C.POINTER(SamplerParams),
                                  C.POINTER(C.c_int32), C.c_size_t, C.c_uint64,
                                  C.POINTER(TokenInfo)]




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


# ---- tokens and chat templates ------------------------------------------------------------------

class ChatMessage(C.Structure):
    """loom_chat_message (frozen layout)."""
    _fields_ = [("role", C.c_char_p), ("content", C.c_char_p)]


_lib.loom_token_to_piece.argtypes = [C.c_void_p, C.c_int32, C.c_uint, C.c_char_p, C.c_size_t,
                                     C.POINTER(C.c_size_t)]
_lib.loom_chat_template_name.argtypes = [C.c_void_p, C.POINTER(C.c_char_p)]
_lib.loom_chat_format.argtypes = [C.c_void_p, C.POINTER(ChatMessage), C.c_size_t, C.c_bool,
                                  C.c_char_p, C.c_size_t, C.POINTER(C.c_size_t)]
_lib.loom_chat_tokenize.argtypes = [C.c_void_p, C.POINTER(ChatMessage), C.c_size_t, C.c_bool,
                                    C.POINTER(C.c_int32), C.c_size_t, C.POINTER(C.c_size_t)]
