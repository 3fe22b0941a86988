"""test_model_errors.py — bad models and bad calls through the public API get clear statuses.

Each case writes a small llama GGUF with one defect (through the gguf package) and checks the
status of loom_model_load and that the error message names the culprit; then decode-time
misuse on a good model (token out of range, context full) and that a failed call leaves the
session usable.
"""
import os
import subprocess
import sys

import numpy as np

try:
    import gguf
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

import loom
import synth_llama

SHAPE = synth_llama.SHAPES[0]
TMP = os.environ.get("LOOM_TEST_TMP", "/tmp/loom-conf")
failures = []


def expect_load_error(label, status, words, **kw):
    path = os.path.join(TMP, f"bad-{label}.gguf")
    synth_llama.write_llama(path, SHAPE, **kw)
    try:
        loom.Model(path).close()
        failures.append(f"{label}: loaded without error")
        return
    except loom.LoomError as e:
        msg = str(e)
        if e.name != status or not all(w in msg for w in words):
            failures.append(f"{label}: got '{msg}', want {status} naming {words}")
        else:
            print(f"ok  {label:22} {msg}")


def main():
    os.makedirs(TMP, exist_ok=True)
    D = SHAPE.n_embd
    expect_load_error("arch", "ERR_UNSUPPORTED", ["gpt9"], arch="gpt9")
    expect_load_error("missing-tensor", "ERR_BAD_MODEL", ["blk.1.ffn_up.weight"],
                      skip=("blk.1.ffn_up.weight",))
    expect_load_error("wrong-shape", "ERR_BAD_MODEL", ["blk.0.attn_q.weight", "shape"],
                      override={"blk.0.attn_q.weight": np.zeros((D // 2, D), np.float32)})
    # A weight stored as I8 (a type GGUF allows but no model computes with).
    i8 = (np.zeros((SHAPE.n_ff, D), np.int8), gguf.GGMLQuantizationType.I8)
    expect_load_error("tensor-type", "ERR_UNSUPPORTED", ["blk.0.ffn_gate.weight", "i8"],
                      override={"blk.0.ffn_gate.weight": i8})

    # Rope parameters that load but would make every angle inf or NaN (issue 18, bug 7).
    fam = SHAPE.family
    half = SHAPE.head_dim // 2
    expect_load_error("rope-factor-tiny", "ERR_BAD_MODEL", [f"{fam}.rope.scaling.factor"],
                      edit=lambda w: w.add_rope_scaling_factor(1e-45))
    expect_load_error("rope-factor-nan", "ERR_BAD_MODEL", [f"{fam}.rope.scaling.factor"],
                      edit=lambda w: (w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR),
                                      w.add_rope_scaling_factor(float("nan"))))
    expect_load_error("rope-base-inf", "ERR_BAD_MODEL", [f"{fam}.rope.freq_base"],
                      edit=lambda w: w.add_key_value(f"{fam}.rope.freq_base", float("inf"),
                                                     gguf.GGUFValueType.FLOAT32))
    for label, bad in (("zero", 0.0), ("nan", float("nan")), ("neg", -2.0),
                       ("inf", float("inf"))):
        f = np.ones(half, np.float32)
        f[3] = bad
        expect_load_error(f"rope-freqs-{label}", "ERR_BAD_MODEL", ["rope_freqs.weight[3]"],
                          extra_tensors={"rope_freqs.weight": f})
    # ... and good ones still load: linear scaling by 2, factors of 1 and 8.
    for label, kw in (("linear-2", dict(edit=lambda w: (
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR),
            w.add_rope_scaling_factor(2.0)))),
            ("freqs", dict(extra_tensors={"rope_freqs.weight": np.where(
                np.arange(half) < half // 2, 1.0, 8.0).astype(np.float32)}))):
        path = os.path.join(TMP, f"good-rope-{label}.gguf")
        synth_llama.write_llama(path, SHAPE, **kw)
        try:
            loom.Model(path).close()
            print(f"ok  good-rope-{label}")
        except loom.LoomError as e:
            failures.append(f"good-rope-{label}: {e}")

    # Truncated file: the loader must refuse it, naming a field, not crash.
    good = os.path.join(TMP, "good.gguf")
    synth_llama.write_llama(good, SHAPE)
    data = open(good, "rb").read()
    cut = os.path.join(TMP, "bad-truncated.gguf")
    for frac in (0.001, 0.3, 0.999):
        open(cut, "wb").write(data[: int(len(data) * frac)])
        try:
            loom.Model(cut).close()
            failures.append(f"truncated at {frac}: loaded")
        except loom.LoomError as e:
            if e.name != "ERR_BAD_MODEL":
                failures.append(f"truncated at {frac}: {e}")
            else:
                print(f"ok  truncated@{frac:<13} {e}")

    try:
        loom.Model(os.path.join(TMP, "does-not-exist.gguf"))
        failures.append("missing file: loaded")
    except loom.LoomError as e:
        if e.name != "ERR_IO":
            failures.append(f"missing file: {e}")

    # Decode-time misuse on a good model.
    with loom.Model(good, n_threads=1) as m:
        s = loom.Session(m, n_ctx=32)
        for bad in ([SHAPE.n_vocab], [-1], [1, 2, 1 << 30]):
            try:
                s.decode(bad)
                failures.append(f"token {bad} accepted")
            except loom.LoomError as e:
                if e.name != "ERR_BAD_INPUT" or s.n_past != 0:
                    failures.append(f"token {bad}: {e}, n_past {s.n_past}")
        try:
            s.decode(list(range(3, 36)))
            failures.append("33 tokens fit in n_ctx 32")
        except loom.LoomError as e:
            if e.name != "ERR_CONTEXT_FULL" or s.n_past != 0:
                failures.append(f"context: {e}")
        # The session still works after the failures, and matches a fresh one.
        a = s.decode([1, 5, 6])
        s2 = loom.Session(m, n_ctx=32)
        b = s2.decode([1, 5, 6])
        if not np.array_equal(a, b):
            failures.append("session after errors differs from a fresh one")
        s.close()
        s2.close()
        try:
            loom.Session(m, n_ctx=-5)
            failures.append("n_ctx -5 accepted")
        except loom.LoomError as e:
            if e.name != "ERR_INVALID_ARG":
                failures.append(f"n_ctx -5: {e}")

    # vocab_only models tokenize but cannot run.
    with loom.Model(good, vocab_only=True) as m:
        try:
            loom.Session(m)
            failures.append("session on a vocab_only model")
        except loom.LoomError as e:
            if e.name != "ERR_INVALID_ARG":
                failures.append(f"vocab_only session: {e}")

    # The example program reports a bad model and exits non-zero.
    gen = os.path.join(os.environ.get("LOOM_BIN_DIR", ""), "..", "loom-generate")
    if os.path.exists(gen):
        r = subprocess.run([gen, "-m", cut, "-n", "4"], capture_output=True, text=True)
        if r.returncode == 0 or "malformed model file" not in r.stderr:
            failures.append(f"loom-generate on a bad file: rc {r.returncode}, {r.stderr!r}")

    # A prompt longer than the context: a clear error, not a truncated answer.
    if os.path.exists(gen):
        r = subprocess.run([gen, "-m", good, "-c", "8", "-n", "4",
                            "-p", "one two three four five six seven eight nine ten"],
                           capture_output=True, text=True)
        if r.returncode == 0 or "context" not in r.stderr:
            failures.append(f"long prompt: rc {r.returncode}, {r.stderr!r}")
        else:
            print(f"ok  long prompt            {r.stderr.strip().splitlines()[0]}")

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("all bad-input cases gave the expected status")
    return 0


if __name__ == "__main__":
    sys.exit(main())
