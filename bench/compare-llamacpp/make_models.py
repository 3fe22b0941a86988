"""make_models.py — the synthetic models bench/compare-llamacpp measures.

A SmolLM2-135M-shaped llama model (vocab 49,152, d_model 576, 30 layers, 9 heads / 3 KV heads
of dim 64, FFN 1,536, tied embeddings, rms eps 1e-5, rope base 100,000 as SmolLM2 has it,
training context 8,192) with random seeded weights, written by the conformance tests' writer
(tests/conformance/synth_llama.py: weights scaled by 1/sqrt(fan-in), unit-RMS embedding rows,
a SentencePiece-style vocabulary that both loom and llama.cpp accept) as F32, then converted
by llama.cpp's own quantizer (llama_model_quantize) into F16, Q8_0 and Q4_K_M — the files a
user would get. The F32 file is a temporary and is deleted.

Also a tiny model of the same kind (2 layers, d_model 64, vocab 512) for the smoke test.

    .venv/bin/python bench/compare-llamacpp/make_models.py [--cache-dir DIR] [--variants f16,...]

Files already present with the size the quantizer gave them last time (recorded in
DIR/sizes.json) are not written again.
"""
import argparse
import json
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests" / "conformance"))
import synth_llama  # noqa: E402  (tests/conformance: the GGUF writer and quantize())

DEFAULT_CACHE = pathlib.Path(os.path.expanduser("~/.cache/loom-bench"))

SMOLLM2 = synth_llama.Shape("smollm2-135m-shaped", n_vocab=49152, n_embd=576, n_head=9,
                            n_head_kv=3, n_ff=1536, n_layer=30, tied=True,
                            rope_base=100000.0, n_ctx=8192)
TINY = synth_llama.Shape("bench-tiny", n_vocab=512, n_embd=64, n_head=4, n_head_kv=2,
                         n_ff=128, n_layer=2, tied=True, n_ctx=1024)

# variant -> (shape, llama.cpp ftype name, file name)
VARIANTS = {
    "f16": (SMOLLM2, "MOSTLY_F16", "smollm2-135m-shaped-f16.gguf"),
    "q8_0": (SMOLLM2, "MOSTLY_Q8_0", "smollm2-135m-shaped-q8_0.gguf"),
    "q4_k_m": (SMOLLM2, "MOSTLY_Q4_K_M", "smollm2-135m-shaped-q4_k_m.gguf"),
    "tiny": (TINY, "MOSTLY_F16", "bench-tiny-f16.gguf"),
}
SEED = 135


def _load_sizes(cache):
    try:
        return json.loads((cache / "sizes.json").read_text())
    except (OSError, ValueError):
        return {}


def model_path(variant, cache=DEFAULT_CACHE):
    return pathlib.Path(cache) / VARIANTS[variant][2]


def make(variants, cache=DEFAULT_CACHE, log=print):
    """Writes the variants missing from cache; returns {variant: path}."""
    cache = pathlib.Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    sizes = _load_sizes(cache)
    out = {}
    for v in variants:
        shape, ftype, name = VARIANTS[v]
        dst = cache / name
        out[v] = dst
        if dst.exists() and sizes.get(name) == dst.stat().st_size:
            continue
        t0 = time.time()
        src = cache / f"{shape.name}-f32.tmp.gguf"
        # the F32 source is only ever complete once os.replace has run
        if not src.exists():
            partial = cache / f"{shape.name}-f32.partial"
            synth_llama.write_llama(str(partial), shape, seed=SEED)
            os.replace(partial, src)
        tmp = cache / (name + ".partial")
        synth_llama.quantize(str(src), str(tmp), ftype)
        os.replace(tmp, dst)
        sizes[name] = dst.stat().st_size
        (cache / "sizes.json").write_text(json.dumps(sizes, indent=1, sort_keys=True))
        log(f"wrote {dst} ({dst.stat().st_size / 1e6:.1f} MB, {time.time() - t0:.1f} s)")
    for shape in {VARIANTS[v][0] for v in variants}:
        src = cache / f"{shape.name}-f32.tmp.gguf"
        if src.exists():
            src.unlink()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", default=str(DEFAULT_CACHE),
                    help="where the GGUF files go (default ~/.cache/loom-bench)")
    ap.add_argument("--variants", default="f16,q8_0,q4_k_m",
                    help=f"comma-separated, of {','.join(VARIANTS)} (default f16,q8_0,q4_k_m)")
    a = ap.parse_args()
    vs = [v for v in a.variants.split(",") if v]
    bad = [v for v in vs if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {bad}; known: {list(VARIANTS)}")
    for v, p in make(vs, a.cache_dir).items():
        print(f"{v}: {p}")


if __name__ == "__main__":
    main()
