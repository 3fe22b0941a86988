#!/usr/bin/env python3
"""test_quant_gguf.py — loom's tensor formats against the `gguf` Python package (gguf-py), the
reference implementation of GGUF's quantization formats.

For every type loom knows it checks, through tests/tools/quant_tool (built next to this test,
found in $LOOM_BIN_DIR):
  traits    name and block size/bytes agree with gguf.GGML_QUANT_SIZES;
  quantize  (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0) float data from several
            distributions quantized by gguf.quants.quantize and by loom_quantize_row: the blocks
            must be byte-identical;
  dequant   (every dequantizable type) random raw blocks, with the f16 scale fields set to finite
            values, dequantized by gguf.quants.dequantize and loom_dequantize_row: the floats must
            be bit-identical (both compute in float32 with the same operation order);
  dot       loom_vec_dot_f32 of those rows with a random vector against a float64 dot of gguf's
            dequantized rows, within the float32 rounding bound of loom's summation order.

Documented differences (checked in their own way rather than skipped):
  * f16 of a NaN: numpy keeps the payload as is (a signalling NaN stays signalling), loom sets
    the quiet bit (as F16C hardware does). NaN inputs are compared for NaN-ness and sign only.
  * q8_1 block size: gguf-py lists 40 bytes (an old layout with float32 d and s); ggml's C
    definition, which loom follows, is 36 (f16 d and s). q8_1 is an activation format that never
    appears in model files.
  * gguf cannot quantize or dequantize q8_1 and q8_K (activation formats); loom's q8_K
    quantizer is covered by tests/tensor/test_quant_rows.c.

Prints a table of types and deviations; exits 0 on success, 1 on failure, 77 if numpy or gguf
is missing.
"""
import os
import subprocess
import sys
import warnings

try:
    import numpy as np
    import gguf
    from gguf import quants
except ImportError as exc:  # the conformance environment is optional
    print(f"skip: {exc}")
    sys.exit(77)

QT = gguf.GGMLQuantizationType
QUANTIZABLE = [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0]
DEQUANTIZABLE = QUANTIZABLE + [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K]
ALL_KNOWN = DEQUANTIZABLE + [QT.Q8_1, QT.Q8_K, QT.I8, QT.I16, QT.I32, QT.I64, QT.F64]
# Byte offsets of each block format's f16 fields (the scales and mins).
F16_FIELDS = {QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2], QT.Q8_0: [0],
              QT.Q2_K: [80, 82], QT.Q3_K: [108], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2],
              QT.Q6_K: [208]}
ROW = 1024  # values per row: a multiple of every block size

BIN_DIR = os.environ.get("LOOM_BIN_DIR", "")
TMP = os.environ.get("LOOM_TEST_TMP", "/tmp/loom_conf")
TOOL = os.path.join(BIN_DIR, "quant_tool")
rng = np.random.default_rng(20240611)


def loom_name(t):
    """gguf's enum name in the spelling GGUF tools print ("Q4_K" -> "q4_K")."""
    return t.name.lower().replace("_k", "_K")


def run_tool(*args):
    res = subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"quant_tool {' '.join(map(str, args))}: rc {res.returncode}: "
                           f"{res.stderr.strip()}")
    return res.stdout


def tmp_path(name):
    return os.path.join(TMP, name)


def loom_quantize(t, data):
    data.astype(np.float32).tofile(tmp_path("q_in.f32"))
    run_tool("quant", int(t), ROW, tmp_path("q_in.f32"), tmp_path("q_out.bin"))
    return np.fromfile(tmp_path("q_out.bin"), dtype=np.uint8)


def loom_dequantize(t, raw):
    raw.tofile(tmp_path("d_in.bin"))
    run_tool("dequant", int(t), ROW, tmp_path("d_in.bin"), tmp_path("d_out.f32"))
    return np.fromfile(tmp_path("d_out.f32"), dtype=np.float32)


def loom_dot(t, raw, x):
    raw.tofile(tmp_path("w.bin"))
    x.astype(np.float32).tofile(tmp_path("x.f32"))
    run_tool("dot", int(t), ROW, tmp_path("w.bin"), tmp_path("x.f32"), tmp_path("dot.f32"))
    return np.fromfile(tmp_path("dot.f32"), dtype=np.float32)


# ---- input data ---------------------------------------------------------------------------

def distributions():
    """(name, float32 array [rows, ROW]) pairs; finite values only (see quantize check)."""
    r = 32
    shape = (r, ROW)
    out = [("normal", rng.standard_normal(shape)),
           ("uniform*1e3", rng.uniform(-1e3, 1e3, shape)),
           ("normal*1e4+off", rng.standard_normal(shape) * 1e4 + 3e3),
           ("huge (f16 d overflows)", rng.standard_normal(shape) * 3e5),
           ("tiny (f16 d subnormal)", rng.standard_normal(shape) * 1e-6)]
    # Exponents spread over a wide range, random signs.
    out.append(("wide exponents", rng.choice([-1.0, 1.0], shape)
                * np.exp2(rng.uniform(-20, 20, shape))))
    # Zero blocks (+0 and -0 alone), constant blocks, one outlier per block.
    z = rng.standard_normal(shape)
    z[:, 0:64] = 0.0
    z[:, 64:96] = -0.0
    z[:, 96:128] = 0.7
    z[:, 128:160] = -3.25
    z[:, 165::32] *= 100.0
    out.append(("zero/constant/outlier blocks", z))
    # Exact ties of every quantizer's rounding: grid values and grid half-steps.
    g = rng.integers(-16, 16, shape) * 0.25 + rng.choice([0.0, 0.125], shape)
    g[:, ::32] = -4.0  # largest magnitude first in each block: d is an exact power of two
    out.append(("grid and half-steps (ties)", g))
    q8 = rng.integers(-127, 127, shape) * 0.5 + 0.25
    q8[:, ::32] = 63.5
    out.append(("q8 ties", q8))
    return [(name, a.astype(np.float32)) for name, a in out]


def float_bit_patterns(nan_ok):
    """Random float32 bit patterns (every exponent, incl. infinities)."""
    bits = rng.integers(0, 2**32, (8, ROW), dtype=np.uint64).astype(np.uint32)
    f = bits.view(np.float32)
    if not nan_ok:
        f = np.where(np.isnan(f), np.float32(1.5), f)
    return f


def random_blocks(t, rows, realistic):
    """Random raw rows of type t; block formats get finite f16 scale fields."""
    block, size = gguf.GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, (rows, ROW // block * size), dtype=np.uint8)
    if t in F16_FIELDS:
        blocks = raw.reshape(-1, size)
        for off in F16_FIELDS[t]:
            if realistic:  # typical magnitudes of scales in real models
                v = (rng.standard_normal(len(blocks)) * np.exp2(rng.integers(-12, 2, len(blocks))))
                h = v.astype(np.float16).view(np.uint16)
            else:  # any finite half: subnormals, negatives, 65504
                h = rng.integers(0, 2**16, len(blocks), dtype=np.uint32).astype(np.uint16)
                h = np.where((h & 0x7C00) == 0x7C00, h & 0xBFFF, h)  # exponent 31 -> 15
            blocks[:, off] = (h & 0xFF).astype(np.uint8)
            blocks[:, off + 1] = (h >> 8).astype(np.uint8)
    return raw


# ---- comparisons --------------------------------------------------------------------------

def float_mismatches(want, got):
    """(count of bit mismatches, max ulp distance); NaN == NaN if signs agree."""
    w = want.reshape(-1).view(np.uint32)
    g = got.reshape(-1).view(np.uint32)
    both_nan = np.isnan(want.reshape(-1)) & np.isnan(got.reshape(-1)) & ((w >> 31) == (g >> 31))
    bad = (w != g) & ~both_nan
    if not bad.any():
        return 0, 0

    def ordered(u):  # float bits -> integers ordered like the floats
        s = u.astype(np.int64)
        return np.where(s & 0x80000000, 0x80000000 - s, s)
    ulps = np.abs(ordered(w[bad]) - ordered(g[bad]))
    return int(bad.sum()), int(ulps.max())


def check_traits(failures):
    for t in ALL_KNOWN:
        name, elems, nbytes, _quantized, can_deq = run_tool("info", int(t)).split()
        block, size = gguf.GGML_QUANT_SIZES[t]
        if t == QT.Q8_1:
            size = 36  # documented above: gguf-py's 40 is an old layout
        if (name, int(elems), int(nbytes)) != (loom_name(t), block, size):
            failures.append(f"traits {t.name}: loom {name} {elems} {nbytes}, gguf {block} {size}")
        if (int(can_deq) == 1) != (t in DEQUANTIZABLE):
            failures.append(f"traits {t.name}: can_dequantize {can_deq}")


def check_quantize(t, failures):
    """Returns (blocks compared, blocks differing)."""
    block, size = gguf.GGML_QUANT_SIZES[t]
    cases = distributions()
    if t in (QT.F16, QT.BF16, QT.F32):
        cases.append(("float bit patterns", float_bit_patterns(nan_ok=(t != QT.F16))))
    total = bad = 0
    for name, data in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # overflow to inf in astype(float16) is intended
            want = np.ascontiguousarray(quants.quantize(data, t)).view(np.uint8).reshape(-1)
        got = loom_quantize(t, data)
        if want.shape != got.shape:
            failures.append(f"quantize {t.name} {name}: {got.size} bytes, gguf {want.size}")
            continue
        diff = (want.reshape(-1, size) != got.reshape(-1, size)).any(axis=1)
        total += diff.size
        if diff.any():
            bad += int(diff.sum())
            i = int(np.argmax(diff))
            failures.append(f"quantize {t.name} [{name}]: {int(diff.sum())}/{diff.size} blocks "
                            f"differ; first block {i}: loom "
                            f"{got.reshape(-1, size)[i][:12].tobytes().hex()}.. gguf "
                            f"{want.reshape(-1, size)[i][:12].tobytes().hex()}..")
    if t == QT.F16:  # NaN inputs: NaN out with the same sign (payload handling differs)
        nan_bits = (rng.integers(1, 2**23, ROW, dtype=np.uint32)
                    | np.uint32(0x7F800000) | (rng.integers(0, 2, ROW, dtype=np.uint32) << 31))
        data = nan_bits.astype(np.uint32).view(np.float32).reshape(1, ROW)
        h = loom_quantize(t, data).view(np.uint16)
        if not (((h & 0x7C00) == 0x7C00) & ((h & 0x3FF) != 0)
                & ((h >> 15) == (nan_bits >> 31))).all():
            failures.append("quantize F16: a NaN input did not give a NaN of the same sign")
    return total, bad


def check_dequantize(t, failures):
    """Returns (values compared, values differing, max ulp, raw rows used for the dot check)."""
    cases = []
    if t in F16_FIELDS:
        cases = [("realistic scales", random_blocks(t, 64, True)),
                 ("any finite scales", random_blocks(t, 64, False))]
    else:
        cases = [("random bits", random_blocks(t, 64, False))]
    total = bad = worst = 0
    for name, raw in cases:
        want = quants.dequantize(raw, t).astype(np.float32, copy=False)
        got = loom_dequantize(t, raw)
        if want.size != got.size:
            failures.append(f"dequantize {t.name}: {got.size} values, gguf {want.size}")
            continue
        n_bad, ulps = float_mismatches(want, got)
        total += want.size
        bad += n_bad
        worst = max(worst, ulps)
        if n_bad:
            i = int(np.argmax(want.reshape(-1).view(np.uint32) != got.view(np.uint32)))
            failures.append(f"dequantize {t.name} [{name}]: {n_bad}/{want.size} values differ "
                            f"(max {ulps} ulp); first at {i}: loom {got[i]!r} gguf "
                            f"{want.reshape(-1)[i]!r}")
    return total, bad, worst


def check_dot(t, failures):
    """Returns the worst |error| / bound over the rows (<= 1 passes)."""
    if t in F16_FIELDS:
        raw = random_blocks(t, 16, True)
    else:  # plain types: finite values of ordinary size
        raw = np.ascontiguousarray(quants.quantize(rng.standard_normal((16, ROW))
                                                   .astype(np.float32), t)).view(np.uint8)
    x = rng.standard_normal(ROW).astype(np.float32)
    w = quants.dequantize(raw, t).astype(np.float64).reshape(-1, ROW)
    ref = w @ x.astype(np.float64)
    mag = np.abs(w) @ np.abs(x.astype(np.float64))
    bound = (ROW / 32 + 7) * 2.0**-24 * mag + 1e-30
    got = loom_dot(t, raw, x).astype(np.float64)
    ratio = np.abs(got - ref) / bound
    if not (ratio <= 1.0).all():
        i = int(np.argmax(np.where(np.isnan(ratio), np.inf, ratio)))
        failures.append(f"dot {t.name} row {i}: loom {got[i]!r}, float64 reference {ref[i]!r}, "
                        f"bound {bound[i]:.3g}")
    return float(np.nanmax(ratio))


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"FAIL: {TOOL} not found (set LOOM_BIN_DIR to the build's tests directory)")
        return 1
    os.makedirs(TMP, exist_ok=True)
    failures = []
    check_traits(failures)
    print(f"{'type':6} | {'quantize: blocks*, differing':28} | {'dequant: values, differing, ulp':32}"
          f" | dot err/bound")
    print("-" * 90)
    for t in DEQUANTIZABLE:
        q = "-"
        if t in QUANTIZABLE:
            total, bad = check_quantize(t, failures)
            q = f"{total:7d} {bad:7d}"
        total, bad, ulps = check_dequantize(t, failures)
        ratio = check_dot(t, failures)
        print(f"{loom_name(t):6} | {q:28} | {total:9d} {bad:7d} {ulps:10d}     | {ratio:.3f}")
    print("-" * 90)
    print("* values for the plain types; ulp: largest distance of a differing value; "
          "err/bound: worst dot error over its rounding bound")
    if failures:
        print(f"FAILED ({len(failures)}):")
        for f in failures[:40]:
            print("  " + f)
        return 1
    try:
        from importlib.metadata import version
        ref = f"gguf {version('gguf')}"
    except Exception:  # metadata is informative only
        ref = "gguf"
    print(f"all types agree with {ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
