"""test_fp8_weights.py — weights requantized at load to FP8 E4M3 rows (loom.Model(...,
weights="fp8"), loom_model_params.weights) against a float64 reference over the same rows.

  1. Synthetic llama models (MHA with a separate output; GQA with a tied embedding) in F32 and
     F16: every matrix is quantized here in numpy, independently of loom — per row, scale =
     max |w| / 448 in float32 and each code the E4M3 value nearest to w / scale (found among
     all 126 finite magnitudes, ties to the even code) — and ref_llama's float64 forward runs
     over those dequantized weights. loom's teacher-forced logits (f32 KV cache) at every
     position of a 64-token sequence must match within 1e-4 (max error over the RMS of the
     reference logits), while they differ from the unquantized model's by far more (so the
     FP8 path really ran), and the model reports a quarter (F32) or half (F16) of the weight
     bytes.
  2. An unknown weight format is refused with INVALID_ARG.
  3. Gemma 3 270M (skipped without its package): loads with FP8 weights (1 byte a matrix
     value, plus a scale a row), its teacher-forced next-token choices over 128 GPL tokens
     mostly agree with the stored weights', and a short greedy generation runs.
"""
import os
import sys

import numpy as np

try:
    import gguf  # noqa: F401
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

import gemma_pkg
import loom
import ref_fp8
import ref_llama
import synth_llama
from conf_checks import check, finish, rel_err

TOL = 2e-5  # only float32 rounding separates them (largest seen 1.8e-6)
N_SEQ = 64






# ---- synthetic models ----------------------------------------------------------------------

def quantized_weights(path):
    W = ref_llama.load_weights(path)
    return {n: (ref_fp8.quantize_rows(a) if a.ndim == 2 else a) for n, a in W.items()}


def check_synthetic(shape, tname, path, tokens):
    label = f"{shape.name}/{tname}"
    stored = loom.Model(path, n_threads=2)
    fp8 = loom.Model(path, n_threads=2, weights="fp8")
    s8 = loom.Session(fp8, n_ctx=shape.n_ctx, kv_f32=True)
    ss = loom.Session(stored, n_ctx=shape.n_ctx, kv_f32=True)
    ours = s8.decode(tokens, all_logits=True)
    plain = ss.decode(tokens, all_logits=True)
    ref = ref_llama.forward(quantized_weights(path), shape, tokens)
    e = rel_err(ours, ref)
    check(e <= TOL, f"{label}: fp8 logits vs float64 over the same FP8 rows: {e:.2e} <= {TOL:.0e}")
    d = rel_err(ours, plain)
    check(d > 100 * max(e, 1e-7), f"{label}: fp8 logits differ from the stored weights' ({d:.2e})")
    ratio = fp8.info.weight_bytes / stored.info.weight_bytes
    want = {"F32": (0.24, 0.27), "F16": (0.49, 0.53)}[tname]
    check(want[0] < ratio < want[1], f"{label}: weight bytes {stored.info.weight_bytes} -> "
                                     f"{fp8.info.weight_bytes} ({ratio:.3f}x)")
    # the weights copied (use_mmap=False) give the same bits
    fp8c = loom.Model(path, n_threads=2, weights="fp8", use_mmap=False)
    sc = loom.Session(fp8c, n_ctx=shape.n_ctx, kv_f32=True)
    check(np.array_equal(sc.decode(tokens, all_logits=True), ours),
          f"{label}: use_mmap=False gives the same logits")
    for o in (sc, fp8c, s8, ss, fp8, stored):
        o.close()


def synthetic():
    tmp = os.environ.get("LOOM_TEST_TMP", "/tmp/loom-conf")
    os.makedirs(tmp, exist_ok=True)
    rng = np.random.default_rng(11)
    shapes = [synth_llama.SHAPES[0], synth_llama.SHAPES[1]]  # mha (output), gqa (tied)
    try:
        import llama_cpp  # noqa: F401  (synth_llama.quantize uses llama.cpp's quantizer)
        have_quantizer = True
    except ImportError:
        have_quantizer = False
        print("SKIP the F16 variants: llama_cpp is not installed")
    for shape in shapes:
        base = os.path.join(tmp, f"fp8w-{shape.name}-F32.gguf")
        synth_llama.write_llama(base, shape)
        tokens = [1] + [int(t) for t in rng.integers(3, shape.n_vocab, N_SEQ - 1)]
        check_synthetic(shape, "F32", base, tokens)
        if have_quantizer:
            f16 = base.replace("-F32", "-F16")
            synth_llama.quantize(base, f16, "MOSTLY_F16")
            check_synthetic(shape, "F16", f16, tokens)
        if shape is shapes[0]:
            try:
                loom.Model(base, n_threads=1, weights=7)
                check(False, "weights=7 is refused")
            except loom.LoomError as err:
                check(err.status == 1 and "weights" in str(err),
                      f"weights=7 is refused with INVALID_ARG ({err})")


# ---- Gemma 3 270M --------------------------------------------------------------------------

def greedy(model, sess, prompt, n):
    sess.reset()
    toks = model.tokenize(prompt)
    lg = sess.decode(toks)
    out = []
    for _ in range(n):
        t = int(np.argmax(lg))
        out.append(t)
        lg = sess.decode([t])
    return out


def gemma():
    path = gemma_pkg.gemma_path("the Gemma 3 270M checks")
    if path is None:
        return
    stored = loom.Model(path, n_threads=2)
    fp8 = loom.Model(path, n_threads=2, weights="fp8")
    n_params = fp8.info.n_params
    wb = fp8.info.weight_bytes
    print(f"gemma: weight bytes {stored.info.weight_bytes} as stored, {wb} as FP8 rows "
          f"({n_params} parameters)")
    check(n_params <= wb <= 1.05 * n_params,
          f"gemma: FP8 weights take about a byte per parameter ({wb / n_params:.3f})")
    text = open("/usr/share/common-licenses/GPL-3").read()[:3000]
    toks = stored.tokenize(text)[:128]
    ls = loom.Session(stored, n_ctx=256).decode(toks, all_logits=True)
    l8 = loom.Session(fp8, n_ctx=256).decode(toks, all_logits=True)
    check(bool(np.all(np.isfinite(l8))), "gemma: fp8 logits are finite")
    agree = float(np.mean(ls.argmax(1) == l8.argmax(1)))
    check(agree >= 0.75, f"gemma: next-token choices agree with the stored weights' at "
                        f"{agree:.3f} of 128 positions")
    s8 = loom.Session(fp8, n_ctx=256)
    prompt = "The capital of France is"
    out = greedy(fp8, s8, prompt, 16)
    reply = fp8.detokenize(out)
    print(f"gemma fp8 greedy: {prompt!r} -> {reply!r}")
    ref = stored.detokenize(greedy(stored, loom.Session(stored, n_ctx=256), prompt, 16))
    print(f"gemma stored greedy: {prompt!r} -> {ref!r}")
    check(len(out) == 16 and len(reply) > 0, "gemma: fp8 greedy generation produced text")
    s8.close()
    fp8.close()
    stored.close()


def main():
    ref_fp8.self_check(check)
    synthetic()
    gemma()
    return finish("fp8 weights")


if __name__ == "__main__":
    sys.exit(main())
