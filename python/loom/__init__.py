"""loom — Python bindings of libloom, an LLM inference runtime (include/loom.h), over ctypes.

    import loom
    with loom.Model("gemma-3-270m-it-Q4_K_M.gguf") as model:
        engine = loom.Engine(model, kv_bytes=64 << 20)
        print(engine.generate("The capital of France is", max_tokens=16)["text"].decode())
        for tok in engine.stream("Once upon a time", max_tokens=16, n_logprobs=3):
            print(tok.text.decode(errors="replace"), tok.logprob, tok.entropy)

Model (weights, tokenizer, chat template), Session (one sequence: logits, KV), Engine
(continuous batching: submit/step/run, stream, generate, statistics), Sampler, Trace. Errors
raise LoomError with the status and loom_last_error()'s message. The library is the one inside
this package (pip install ./python), or $LOOM_LIBRARY.
"""
from ._ffi import (ADMISSION, DETOKENIZE_RENDER_SPECIAL, DETOKENIZE_STRIP_LEADING,
                   ENTROPY_MODES, EVENT_FAILED, EVENT_FINISHED, EVENT_FN, EVENT_TOKEN,
                   FINISH_REASONS, KV_TYPES, LATENCY_WINDOW, LOOM_OK, RATE_WINDOW, STATUS,
                   TOKENIZE_ADD_SPECIAL, TOKENIZE_PARSE_SPECIAL, TRACE_FORMATS, ChatMessage,
                   ClassStats, EngineParams, EngineStats, Event, Generation, KvGroupInfo,
                   LogitBias, LoomError, ModelInfo, ModelParams, RequestParams, SamplerParams,
                   SessionParams, TokenInfo, TokenLogprob, TraceInfo, C, _check, _lib,
                   engine_now, version)
from .engine import Engine, Stream, Token
from .model import Model, Session
from .sampler import Sampler
from .trace import Trace

__all__ = ["Engine", "LoomError", "Model", "Sampler", "Session", "Stream", "Token", "Trace",
           "engine_now", "version"]
library_path: str = _lib._name
