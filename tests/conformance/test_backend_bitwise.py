"""test_backend_bitwise.py — the CPU backend loaded as a plugin (libloom-cpuplugin.so) computes
the very bits of the built-in one: bench/bitwise/snapshot.py's record (every synthetic model in
F32, F16, Q8_0 and Q4_K_M, sessions on 1 and 2 threads, copied weights, float32 activations,
F16 and F32 KV caches, engines with swapping; Gemma 3 270M's sessions and engine) taken on both
paths and compared entry by entry. The same record at the commit before the plugin boundary is
bench/bitwise/base-e2094ee.json, which this record must also equal (nothing here changed a
token loom produces)."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "bitwise"))

try:
    import gguf  # noqa: F401
    import llama_cpp  # noqa: F401  (the quantizer of the synthetic models)
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

import loom
import snapshot
from gemma_pkg import gemma_path

TMP = os.environ.get("LOOM_TEST_TMP", "/tmp/loom-conf")
BASE = os.path.join(HERE, "..", "..", "bench", "bitwise", "base-e2094ee.json")


def main():
    gemma_path("the Gemma part of the bitwise record")  # required where LOOM_REQUIRE_GEMMA=1
    models = os.path.join(TMP, "bitwise-models")
    records = {}
    for backend in (None, "cpuplugin"):
        loom.Model.default_backend = backend
        records[backend] = dict(snapshot.flatten(snapshot.snapshot(models)))
        records[backend].pop("version")
    builtin, plugin = records[None], records["cpuplugin"]
    base = dict(snapshot.flatten(json.load(open(BASE))))
    base.pop("version")
    if builtin.get("gemma3_270m") is None and base.get("gemma3_270m") is not None:
        for k in [k for k in base if k.startswith("gemma3_270m")]:
            base.pop(k)  # the package is absent and not required: compare the synthetic part
    failures = []
    for name, want, got in (("plugin vs built-in", builtin, plugin),
                            ("built-in vs e2094ee", base, builtin)):
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        print(f"{name}: {len(want)} entries, {len(diff)} differ")
        if diff:
            failures.append(f"{name}: {diff[:10]}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("backend bitwise: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
