"""test_cuda_emu_gemma.py — Gemma 3 270M (Q4_K_M: Q5_0, Q4_K, Q6_K and Q8_0 weights, head size
256, tied 262,144-row output) on the CUDA backend, the emulated plugin's (tests/kernels_emu: the
real plugin's host code and kernels, run on the SIMT emulator), against the CPU backend with
float32 activations (the CUDA backend's arithmetic: no activation quantization) on the same
file: the prompt's logits at every position, then a decode step, within 1e-5 of the largest
logit with F32 KV pages (the two sum in other orders; nothing else differs) and 1e-3 with F16
pages (each backend rounds its own K and V), and the same greedy token. Skips (77) where the
emulated plugin is not built (LOOM_TEST_CUDA_EMU_DIR unset: ThreadSanitizer builds)."""
import os
import sys

import numpy as np

from gemma_pkg import gemma_path

EMU_DIR = os.environ.get("LOOM_TEST_CUDA_EMU_DIR")
if not EMU_DIR:
    print("SKIP: the emulated CUDA plugin is not built here")
    sys.exit(77)
# libloom through its link in the plugin's folder: it looks for plugins beside itself first
# (where a real build also has a libloom-cuda.so), then in LOOM_BACKEND_PATH
os.environ.pop("LOOM_LIBRARY", None)
os.environ["LOOM_LIB"] = os.path.join(EMU_DIR, "libloom.so")
os.environ["LOOM_BACKEND_PATH"] = EMU_DIR

import loom  # noqa: E402


def norm_err(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def main():
    path = gemma_path("Gemma 3 270M on the emulated CUDA backend")
    if path is None:
        return 77
    cpu = loom.Model(path, backend="cpu", f32_activations=True)
    gpu = loom.Model(path, backend="cuda")
    assert gpu.info.backend.decode() == "cuda", gpu.info.backend
    where = gpu.info.backend_path.decode()
    assert os.path.dirname(where) == EMU_DIR, f"the cuda plugin loaded is {where}"
    toks = cpu.tokenize("The capital of France is")
    failures = []
    for kv, tol in (("f32", 1e-5), ("f16", 1e-3)):
        sc, sg = loom.Session(cpu, kv_type=kv), loom.Session(gpu, kv_type=kv)
        lc = sc.decode(toks, all_logits=True)
        lg = sg.decode(toks, all_logits=True)
        e = norm_err(lg, lc)
        print(f"kv {kv}: prompt of {len(toks)} tokens, logits within {e:.3g} of the largest "
              f"(tolerance {tol:g})")
        if not e <= tol:
            failures.append(f"kv {kv} prompt logits: {e:.3g} > {tol:g}")
        nxt = int(np.argmax(lc[-1]))
        if int(np.argmax(lg[-1])) != nxt:
            failures.append(f"kv {kv}: greedy token {int(np.argmax(lg[-1]))}, cpu {nxt}")
        dc = sc.decode([nxt])
        dg = sg.decode([nxt])
        e = norm_err(dg, dc)
        print(f"kv {kv}: decode step, logits within {e:.3g}")
        if not e <= tol:
            failures.append(f"kv {kv} decode logits: {e:.3g} > {tol:g}")
        sc.close()
        sg.close()
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("gemma3 270m on the emulated cuda backend: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
