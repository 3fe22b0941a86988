"""loom.trace — the per-token trace (loom_trace): every engine step's phases and every produced
token's sampler figures, written as JSON Lines or Chrome trace-event JSON (docs/trace-format.md).
"""
from __future__ import annotations

import ctypes as C
import os
import weakref

from ._ffi import LOOM_OK, TRACE_FORMATS, LoomError, TraceInfo, _check, _lib, _result


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
