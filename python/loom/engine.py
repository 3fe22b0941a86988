"""loom.engine — continuous batching over a model (loom_engine): requests with every sampling
setting, steps, streaming, statistics.

Threads. Any number of threads may submit, stream and generate on one Engine at once: every
step runs under the engine's step lock, and whichever thread holds it delivers the step's events
to the requests they belong to, so the threads' requests share each step's batch. ctypes
releases the GIL for the whole of each step (loom_engine_step) and of loom_engine_generate, so
a thread waiting in the library does not hold back the others.
"""
from __future__ import annotations

import collections
import ctypes as C
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ._ffi import _Handle
from ._ffi import (ADMISSION, EVENT_FAILED, EVENT_FINISHED, EVENT_FN, EVENT_TOKEN,
                   FINISH_REASONS, ClassStats, EngineParams, EngineStats, Event, Generation,
                   KvGroupInfo, LoomError, RequestParams, SamplerParams, _check, _fields,
                   _kv_type, _lib, _params, _result)
from .model import Model, _token_array
from .sampler import _sampler_params
from .trace import Trace


@dataclass
class Token:
    """One generated token as a stream yields it. text: the bytes this token completes (whole
    UTF-8 characters; stop strings withheld until ruled out; may be empty). logprob: log p of
    the token under the model's raw distribution; logprob_final: under the distribution the
    sampler drew from. entropy / varentropy: of the raw distribution, in nats. top: the raw
    distribution's most likely (id, logprob) pairs (n_logprobs of them)."""
    id: int  # the request's id
    sample: int
    token: int
    text: bytes
    logprob: float
    logprob_final: float
    entropy: float
    varentropy: float
    temperature: float
    top: List[Tuple[int, float]] = field(default_factory=list)


class Stream:
    """The tokens of one request, as the engine produces them (Engine.stream). Iterating steps
    the engine whenever this request has nothing queued; other threads' requests advance in the
    same steps. After the iteration ends, finish_reason holds each sample's reason ("length",
    "eos", "stop_token", "stop_string", "cancelled", "context"). Closing it early (break, or
    close()) cancels the request, which frees its KV blocks at the next step."""

    def __init__(self, engine: "Engine", rid: int, n: int):
        self.engine = engine
        self.id = rid
        self.finish_reason: Dict[int, str] = {}
        self.cached_tokens: Dict[int, int] = {}
        self._n = n
        self._queue: collections.deque = collections.deque()
        self._done = False

    def __iter__(self) -> Iterator[Token]:
        return self

    def __next__(self) -> Token:
        while True:
            if self._queue:
                item = self._queue.popleft()
                if isinstance(item, Token):
                    return item
                kind, sample, value = item
                if kind == "failed":
                    self._finish()
                    raise value
                self.finish_reason[sample] = value[0]
                self.cached_tokens[sample] = value[1]
                if len(self.finish_reason) == self._n:
                    self._finish()
                    raise StopIteration
                continue
            if self._done:
                raise StopIteration
            self.engine._step_for(self)

    def _finish(self):
        self._done = True
        self.engine._streams.pop(self.id, None)

    def close(self) -> None:
        """Cancels the request if it is still running and stops the stream."""
        if not self._done:
            self._finish()
            try:
                self.engine.cancel(self.id)
            except LoomError:
                pass  # it ended in the meantime

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if not self._done and self.engine._h:
            self.close()


def _token(ev) -> Token:
    info = ev.info[0]
    return Token(id=ev.id, sample=ev.sample, token=ev.token,
                 text=C.string_at(ev.text, ev.text_len) if ev.text_len else b"",
                 logprob=info.logprob_raw, logprob_final=info.logprob_final,
                 entropy=info.entropy, varentropy=info.varentropy,
                 temperature=info.temperature,
                 top=[(info.top_raw[k].id, info.top_raw[k].logprob)
                      for k in range(info.n_top_raw)])


class Engine(_Handle):
    """Continuous batching over a model (loom_engine). submit() returns an id; step() returns
    events as dicts; run() steps until idle and returns {id: {sample: {"tokens", "text",
    "reason", "info"}}}, where "info" holds one TokenInfo.to_dict() per token (logprobs,
    entropies, effective temperature, top alternatives); stream() yields a request's Tokens as
    they come; generate() runs one request to its end.

    Engine parameters are loom_engine_params' fields by keyword (kv_bytes, kv_fraction,
    block_size, max_batched_tokens, max_seqs, max_ctx, prefix_cache, preempt, fcfs,
    starvation_s, watermark, max_logprobs, n_sample_threads, record_path, admission
    ("admit_all", "reject_late", "degrade"), kv_type ("f16", "bf16", "fp8_e4m3", "fp8_e5m2"),
    kv_rotate, kv_plan). trace: a Trace to record into (the engine keeps a reference, so the
    trace outlives it). replay: a record_path file, for an engine that replays it
    (loom_engine_create_replay: it takes its parameters from the record, only trace and
    n_sample_threads from here, and no submit; run() replays every recorded step)."""
    _what = "engine"
    _h = None

    def __init__(self, model: Model, trace: Optional[Trace] = None,
                 replay: Union[str, os.PathLike, None] = None, **params):
        self._step_lock = threading.RLock()
        self._streams: Dict[int, Stream] = {}
        p = _params(EngineParams, _lib.loom_engine_params_init)
        # on_event / on_event_user_data: raw C pointers, for background mode (the engine's own
        # thread steps; step(), stream() and generate() must then not be used).
        names = {f for f, _ in EngineParams._fields_} - {"size", "trace"}
        for k, v in params.items():
            if k not in names:
                raise TypeError(f"unknown engine parameter {k!r}")
            if k in ("record_path", "kv_plan") and v is not None:
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
            _check(_lib.loom_engine_create_replay(model._handle(), os.fsencode(replay),
                                                  C.byref(p), C.byref(h)))
        else:
            _check(_lib.loom_engine_create(model._handle(), C.byref(p), C.byref(h)))
        self._h = h
        self.model = model
        model._children.add(self)
        if trace is not None:
            trace._users.add(self)
        self.outputs: Dict[int, dict] = {}

    def close(self) -> None:
        """Destroys the engine (cancelling whatever still runs)."""
        with self._step_lock:
            if self._h:
                _lib.loom_engine_destroy(self._h)
                self._h = None

    # ---- requests -------------------------------------------------------------------------------

    @staticmethod
    def _request(prompt=None, tokens=None, max_tokens=32, temperature=0.0, top_k=40,
                 top_p=1.0, seed=1, n=1, priority=0, stop=None, stop_tokens=None,
                 ignore_eos=True, cache_salt=0, ttft_deadline_s=0.0, tpot_deadline_s=0.0,
                 arrival_s=0.0, logit_bias=None, entropy_mode=None, add_special=True,
                 parse_special=False, **sampler):
        """RequestParams from submit()'s arguments, and the arrays it points to."""
        r = _params(RequestParams, _lib.loom_request_params_init)
        sp = _params(SamplerParams, _lib.loom_sampler_params_init)
        keep = [sp]
        _sampler_params(sp, keep, logit_bias=logit_bias, entropy_mode=entropy_mode, **sampler)
        r.sampler = C.pointer(sp)
        if prompt is not None:
            r.prompt = prompt.encode() if isinstance(prompt, str) else prompt
            r.add_special, r.parse_special = add_special, parse_special
        if tokens is not None:
            arr, count, owner = _token_array(tokens)
            keep.append(owner)
            r.prompt_tokens = arr
            r.n_prompt_tokens = count
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

    def submit(self, prompt: Union[str, bytes, None] = None,
               tokens: Optional[Sequence[int]] = None, **kw) -> int:
        """Queues a request; returns its id. Its events go to step()'s results and to
        self.outputs. Arguments (all by keyword): prompt (text; add_special, parse_special) or
        tokens (a list or an int32 numpy array); max_tokens (default 32), n, priority, stop
        (strings), stop_tokens, ignore_eos (default True: the length is max_tokens — pass False
        to stop at the model's end of turn), cache_salt, ttft_deadline_s, tpot_deadline_s,
        arrival_s (engine_now() seconds; 0: now); temperature (default 0: greedy), top_k
        (default 40), top_p (default 1), seed (default 1), and any other loom_sampler_params
        field by name (min_p, typical_p, penalty_last_n, repeat_penalty, presence_penalty,
        frequency_penalty, exp_beta, edt_n, edt_theta, edt_h_min, dyn_t_min, dyn_t_max,
        dyn_exponent, n_logprobs); logit_bias: {token id: bias} or [(id, bias)];
        entropy_mode: "none", "exp", "edt", "dynatemp" or its number. Raises LoomError
        (ERR_INVALID_ARG for a bad setting, ERR_OVERLOADED when admission refuses it)."""
        r, keep = self._request(prompt=prompt, tokens=tokens, **kw)
        rid = C.c_uint64()
        with self._step_lock:
            _check(_lib.loom_engine_submit(self._handle(), C.byref(r), C.byref(rid)))
            self.outputs[rid.value] = {}
        return rid.value

    def stream(self, prompt: Union[str, bytes, None] = None,
               tokens: Optional[Sequence[int]] = None, **kw) -> Stream:
        """Submits a request (submit()'s arguments) and returns a Stream of its Tokens, in the
        order the engine produces them (with n > 1 the samples interleave; Token.sample tells
        them apart). Its events are not added to self.outputs."""
        r, keep = self._request(prompt=prompt, tokens=tokens, **kw)
        rid = C.c_uint64()
        with self._step_lock:  # registered before any step can deliver its first event
            _check(_lib.loom_engine_submit(self._handle(), C.byref(r), C.byref(rid)))
            s = Stream(self, rid.value, r.n)
            self._streams[rid.value] = s
        return s

    def generate(self, prompt: Union[str, bytes, None] = None,
                 tokens: Optional[Sequence[int]] = None,
                 on_event: Optional[Callable[[dict], None]] = None, **kw) -> dict:
        """loom_engine_generate: submits one request (submit()'s arguments; n must be 1), steps
        until it ends and returns {"id", "text" (bytes), "tokens", "reason", "cached_tokens"}.
        Events of other requests run in those steps go where step() sends them;
        on_event(dict), if given, also sees every event (this request's too). Other threads'
        streams and generate calls wait for the step lock meanwhile (their requests still
        advance in these steps)."""
        r, keep = self._request(prompt=prompt, tokens=tokens, **kw)

        def deliver(evp, _user):
            d = self._dispatch(evp[0])
            if on_event is not None and d is not None:
                on_event(d)

        cb = EVENT_FN(deliver)
        g = C.POINTER(Generation)()
        with self._step_lock:
            _check(_lib.loom_engine_generate(self._handle(), C.byref(r), cb, None, C.byref(g)))
        try:
            out = g[0]
            res = {"id": out.id, "text": C.string_at(out.text, out.text_len),
                   "tokens": list(out.tokens[:out.n_tokens]) if out.n_tokens else [],
                   "reason": FINISH_REASONS[out.reason], "cached_tokens": out.cached_tokens}
        finally:
            _lib.loom_generation_free(g)
        return res

    def cancel(self, rid: int) -> None:
        """Cancels a request (any thread, any time): it ends with reason "cancelled" at the
        next step, which frees its KV blocks. ERR_NOT_FOUND once it has ended."""
        _check(_lib.loom_engine_cancel(self._handle(), rid))

    # ---- steps ----------------------------------------------------------------------------------

    def step(self) -> List[dict]:
        """Runs one engine step; returns the events of requests made with submit() as dicts
        (stream()s' events go to their streams)."""
        with self._step_lock:
            return self._step_locked()

    def _step_locked(self) -> List[dict]:
        evp = C.POINTER(C.POINTER(Event))()
        n = C.c_size_t()
        _check(_lib.loom_engine_step(self._handle(), C.byref(evp), C.byref(n)))
        out = []
        for i in range(n.value):
            d = self._dispatch(evp[i][0])
            if d is not None:
                out.append(d)
        return out

    def _step_for(self, stream: Stream) -> None:
        """Steps once for a stream that has nothing queued — unless, by the time this thread
        holds the lock, another thread's step has queued something for it."""
        with self._step_lock:
            if stream._queue or stream._done:
                return
            if not self._h:
                raise ValueError("engine: closed while a stream was reading it")
            self._step_locked()

    def _dispatch(self, ev) -> Optional[dict]:
        """Sends one event to its stream, or records it in self.outputs and returns it as a
        dict."""
        s = self._streams.get(ev.id)
        if s is not None:
            if ev.kind == EVENT_TOKEN:
                s._queue.append(_token(ev))
            elif ev.kind == EVENT_FINISHED:
                s._queue.append(("finished", ev.sample,
                                 (FINISH_REASONS[ev.reason], ev.cached_tokens)))
            else:
                s._queue.append(("failed", ev.sample,
                                 LoomError(ev.status, f"request {ev.id} failed")))
            return None
        return self._record(ev)

    def _record(self, ev) -> dict:
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

    def has_work(self) -> bool:
        """True while any request is queued or running."""
        return bool(_lib.loom_engine_has_work(self._handle()))

    def run(self, max_steps: int = 100000) -> Dict[int, dict]:
        """Steps until idle (or max_steps); returns self.outputs."""
        steps = 0
        while self.has_work() and steps < max_steps:
            self.step()
            steps += 1
        return self.outputs

    # ---- statistics -----------------------------------------------------------------------------

    def stats(self) -> dict:
        """loom_engine_get_stats as a dict: running, waiting, kv_blocks_*, prefix_query_tokens,
        prefix_hit_tokens, preemptions, steps, tokens_generated, ttft/tpot mean and
        percentiles, tokens_per_s, ... (any thread, any time)."""
        s = _result(EngineStats)
        _check(_lib.loom_engine_get_stats(self._handle(), C.byref(s)))
        return _fields(s)

    def class_stats(self, priority: int) -> dict:
        """loom_engine_get_class_stats: the service figures of one priority class as a dict
        (admitted, rejected, degraded, ended, ttft_deadlines, ttft_met, preemptions, ...)."""
        s = _result(ClassStats)
        _check(_lib.loom_engine_get_class_stats(self._handle(), priority, C.byref(s)))
        return _fields(s)

    def predict_ttft(self, prompt=None, tokens=None, **kw) -> float:
        """loom_engine_predict_ttft: the TTFT in seconds the engine predicts for a request with
        submit()'s arguments if it were submitted now (-1 before the first step)."""
        r, keep = self._request(prompt=prompt, tokens=tokens, **kw)
        out = C.c_double()
        _check(_lib.loom_engine_predict_ttft(self._handle(), C.byref(r), C.byref(out)))
        return out.value

    def kv_groups(self) -> List[dict]:
        """Every KV group's pool as a list of dicts (loom_kv_group_info's fields)."""
        out, g, n = [], 0, 1
        while g < n:
            s = _result(KvGroupInfo)
            _check(_lib.loom_engine_get_kv_group(self._handle(), g, C.byref(s)))
            out.append(_fields(s))
            n, g = s.n_groups, g + 1
        return out
