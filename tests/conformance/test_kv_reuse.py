"""test_kv_reuse.py — cross-layer KV reuse end to end (the descriptor's layer_src): a layer set
to read an earlier layer's keys and values computes and stores none of its own, and the engine
and the session allocate pool memory for source layers only.

For a 4-layer synthetic llama (F32, GQA 2:1) and several maps (layer -> the layer it reads):
  1. logits at every position of a 48-token sequence (session, f32 KV cache, f32 activations)
     against an independent float64 numpy forward that attends layer l over layer src's K/V
     (tests/conformance/ref_llama.py, weights from the gguf package) — within the float64
     tolerance test_llama_logits uses (2e-5 relative);
  2. the map changes the logits (far beyond that tolerance): the reuse really happens;
  3. the engine's KV groups hold the source layers only: block_bytes scales with them, and the
     engine's greedy tokens are the session's;
  4. maps the model cannot honour (a later layer, a chain) are refused with a message.
"""
import os
import subprocess
import sys

import numpy as np

try:
    import gguf  # noqa: F401
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

import ref_llama
import synth_llama
from conf_checks import check, finish, rel_err

BIN_DIR = os.environ.get("LOOM_BIN_DIR", "build/tests")
TMP = os.environ.get("LOOM_TEST_TMP", "/tmp/loom-conf")
TOOL = os.path.join(BIN_DIR, "kvshare_tool")
TOL_REF = 2e-5
SHAPE = synth_llama.Shape("reuse", n_vocab=512, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                          n_layer=4)
MAPS = {"-": {}, "1:0": {1: 0}, "2:1,3:1": {2: 1, 3: 1}, "3:0": {3: 0}}






def run_tool(path, m, tokens):
    out = os.path.join(TMP, "kvshare.f32")
    p = subprocess.run([TOOL, path, m, out], input=" ".join(map(str, tokens)), text=True,
                       capture_output=True)
    if p.returncode != 0:
        return None, p.stderr
    logits = np.fromfile(out, dtype=np.float32).reshape(len(tokens), SHAPE.n_vocab)
    info = {"groups": [], "session": None, "engine": None}
    for line in p.stdout.splitlines():
        f = line.split()
        if f[0] == "group":
            info["groups"].append((int(f[3]), int(f[5])))
        elif f[0] in ("session", "engine"):
            info[f[0]] = [int(x) for x in f[1:]]
    return (logits, info), p.stderr


def main():
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "kv-reuse.gguf")
    synth_llama.write_llama(path, SHAPE, seed=4321)
    W = ref_llama.load_weights(path)
    rng = np.random.default_rng(3)
    tokens = [int(t) for t in rng.integers(3, SHAPE.n_vocab, size=48)]
    results = {}
    for m, kv_src in MAPS.items():
        got, err = run_tool(path, m, tokens)
        check(got is not None, f"map {m}: the tool runs ({err.strip()})")
        if got is None:
            continue
        logits, info = got
        ref = ref_llama.forward(W, SHAPE, tokens, kv_src=kv_src)
        e = rel_err(logits, ref)
        check(e <= TOL_REF, f"map {m}: logits vs float64 reference, rel err {e:.2e}")
        n_sources = SHAPE.n_layer - len(kv_src)
        groups = info["groups"]
        check(len(groups) == 1 and groups[0][0] == n_sources,
              f"map {m}: the KV group holds {groups} (layers, block bytes): {n_sources} layers")
        results[m] = (logits, groups[0][1] if groups else 0)
        check(info["engine"] == info["session"] and len(info["session"] or []) == 8,
              f"map {m}: engine greedy {info['engine']} == session {info['session']}")
    if "-" in results:
        base_logits, base_bytes = results["-"]
        for m, (logits, block_bytes) in results.items():
            if m == "-":
                continue
            n_sources = SHAPE.n_layer - len(MAPS[m])
            check(block_bytes * SHAPE.n_layer == base_bytes * n_sources,
                  f"map {m}: block bytes {block_bytes}, {n_sources}/{SHAPE.n_layer} of "
                  f"{base_bytes}")
            e = rel_err(logits, base_logits)
            check(e > 100 * TOL_REF, f"map {m}: changes the logits (rel diff {e:.2e})")
    for m, why in (("1:2", "an earlier layer"), ("2:1,1:0", "is the KV source of layer 2"),
                   ("3:9", "an earlier layer")):
        got, err = run_tool(path, m, tokens)
        check(got is None and why in err, f"map {m} refused: {err.strip()}")
    return finish("kv reuse")


if __name__ == "__main__":
    sys.exit(main())
