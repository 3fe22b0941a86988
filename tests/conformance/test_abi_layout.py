"""test_abi_layout.py — python/loom/_ffi.py's ctypes structures have the very layouts of loom.h's
structs: the same fields, in the same order, at the same offsets, and the same size. The C side
comes from abi_layout (generated from loom.h by tests/tools/gen_abi_layout.py, built by CMake),
so a field appended to loom.h and forgotten in python/loom — or the reverse — fails here.

Every struct of loom.h is either bound in python/loom (BOUND) or listed in NOT_BOUND with the
reason; a new struct in neither list fails too.
"""
import ctypes as C
import json
import os
import subprocess
import sys

import loom

BIN_DIR = os.environ.get("LOOM_BIN_DIR", "build/tests")
TOOL = os.path.join(BIN_DIR, "abi_layout")

BOUND = {
    "loom_model_params": loom.ModelParams,
    "loom_model_info": loom.ModelInfo,
    "loom_session_params": loom.SessionParams,
    "loom_logit_bias": loom.LogitBias,
    "loom_sampler_params": loom.SamplerParams,
    "loom_token_logprob": loom.TokenLogprob,
    "loom_token_info": loom.TokenInfo,
    "loom_event": loom.Event,
    "loom_engine_params": loom.EngineParams,
    "loom_request_params": loom.RequestParams,
    "loom_engine_stats": loom.EngineStats,
    "loom_generation": loom.Generation,
    "loom_kv_group_info": loom.KvGroupInfo,
    "loom_class_stats": loom.ClassStats,
    "loom_trace_info": loom.TraceInfo,
    "loom_chat_message": loom.ChatMessage,
}
NOT_BOUND = {
    "loom_generate_params": "loom_generate is not bound (Python uses the engine)",
    "loom_generate_stats": "loom_generate is not bound",
    "loom_synthetic_params": "experimental; loom_model_load_synthetic is not bound yet",
}


def main():
    if not os.path.exists(TOOL):
        print(f"FAIL: {TOOL} is missing")
        return 1
    c = json.loads(subprocess.run([TOOL], check=True, capture_output=True, text=True).stdout)
    failures = []
    for name in c:
        if name not in BOUND and name not in NOT_BOUND:
            failures.append(f"{name}: in loom.h but neither bound in python/loom nor listed as not")
    for name in list(BOUND) + list(NOT_BOUND):
        if name not in c:
            failures.append(f"{name}: listed here but not a struct of loom.h")
    for name, cls in BOUND.items():
        if name not in c:
            continue
        want = c[name]
        py_fields = [f for f, _ in cls._fields_]
        if py_fields != list(want["fields"]):
            failures.append(f"{name}: fields {py_fields} in Python, {list(want['fields'])} in C")
            continue
        for f in py_fields:
            off = getattr(cls, f).offset
            if off != want["fields"][f]:
                failures.append(f"{name}.{f}: offset {off} in Python, {want['fields'][f]} in C")
        if C.sizeof(cls) != want["size"]:
            failures.append(f"{name}: size {C.sizeof(cls)} in Python, {want['size']} in C")
        print(f"{name}: {len(py_fields)} fields, {want['size']} bytes: "
              f"{'ok' if not any(x.startswith(name) for x in failures) else 'DIFFERS'}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"abi layout: {len(BOUND)} structs match, {len(NOT_BOUND)} not bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
