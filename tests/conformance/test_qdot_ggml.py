"""test_qdot_ggml.py — loom's integer-activation matmul arithmetic (src/tensor/qdot.h) against
llama.cpp's own CPU kernels (ggml-cpu from llama-cpp-python, called through ctypes).

1. Activation rounding: ggml's quantize_row_q8_0 / q8_1 / q8_K and its f32 -> f16 / bf16 row
   conversions vs loom_quantize_activations (tests/tools/qdot_tool), byte for byte, on rows with
   exact .5 ties, all-zero blocks, lone values, outliers and scales from 1e-6 to 1e4.
2. Dot products: for every weight type loom runs, weights quantized by ggml's quantizers and
   activations rounded by ggml, ggml_vec_dot_<w>_<act> vs loom_vec_dot_q:
   |loom - ggml| <= 1e-5 * sum |w| |x| per row. Both sides compute each block's integer sum
   exactly; only the float32 order in which the scaled block sums are added differs.
"""
import ctypes as C
import os
import subprocess
import sys

import numpy as np

try:
    import gguf
    import llama_cpp
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

from gguf.quants import dequantize

T = gguf.GGMLQuantizationType
LIB = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu.so")
TOOL = os.path.join(os.environ.get("LOOM_BIN_DIR", "build/tests"), "qdot_tool")
TMP = os.environ.get("LOOM_TEST_TMP", "/tmp/loom-conf")
N = 2048  # values per row: a whole number of 256-value super-blocks
ROWS = 24
REL = 1e-5

# weight type -> (activation type, ggml dot, ggml weight quantizer)
WEIGHTS = {
    T.Q4_0: (T.Q8_0, "ggml_vec_dot_q4_0_q8_0", "quantize_row_q4_0"),
    T.Q4_1: (T.Q8_1, "ggml_vec_dot_q4_1_q8_1", "quantize_row_q4_1"),
    T.Q5_0: (T.Q8_0, "ggml_vec_dot_q5_0_q8_0", "quantize_row_q5_0"),
    T.Q5_1: (T.Q8_1, "ggml_vec_dot_q5_1_q8_1", "quantize_row_q5_1"),
    T.Q8_0: (T.Q8_0, "ggml_vec_dot_q8_0_q8_0", "quantize_row_q8_0"),
    T.Q2_K: (T.Q8_K, "ggml_vec_dot_q2_K_q8_K", "quantize_row_q2_K"),
    T.Q3_K: (T.Q8_K, "ggml_vec_dot_q3_K_q8_K", "quantize_row_q3_K"),
    T.Q4_K: (T.Q8_K, "ggml_vec_dot_q4_K_q8_K", "quantize_row_q4_K"),
    T.Q5_K: (T.Q8_K, "ggml_vec_dot_q5_K_q8_K", "quantize_row_q5_K"),
    T.Q6_K: (T.Q8_K, "ggml_vec_dot_q6_K_q8_K", "quantize_row_q6_K"),
    T.F16: (T.F16, "ggml_vec_dot_f16", "ggml_cpu_fp32_to_fp16"),
    T.BF16: (T.BF16, "ggml_vec_dot_bf16", "ggml_cpu_fp32_to_bf16"),
}
# activation type -> ggml's row function that rounds src1 for the matmul
ACT_FN = {T.Q8_0: "quantize_row_q8_0", T.Q8_1: "quantize_row_q8_1", T.Q8_K: "quantize_row_q8_K",
          T.F16: "ggml_cpu_fp32_to_fp16", T.BF16: "ggml_cpu_fp32_to_bf16"}

ggml = C.CDLL(LIB)
ggml.ggml_cpu_init.restype = None
ggml.ggml_cpu_init()  # fills the f16 tables the kernels read
for name in set(ACT_FN.values()) | {q for _, _, q in WEIGHTS.values()}:
    getattr(ggml, name).argtypes = [C.c_void_p, C.c_void_p, C.c_int64]
    getattr(ggml, name).restype = None
for _, dot, _ in WEIGHTS.values():
    f = getattr(ggml, dot)
    f.argtypes = [C.c_int, C.POINTER(C.c_float), C.c_size_t, C.c_void_p, C.c_size_t, C.c_void_p,
                  C.c_size_t, C.c_int]
    f.restype = None


# ggml's block sizes of the activation formats (the gguf package still lists q8_1 with float32
# d and s, 40 bytes; ggml stores them as f16, 36 bytes).
ACT_SIZES = {T.Q8_0: (32, 34), T.Q8_1: (32, 36), T.Q8_K: (256, 292), T.F16: (1, 2),
             T.BF16: (1, 2)}


def row_bytes(t, n):
    blk, size = ACT_SIZES.get(t) or gguf.GGML_QUANT_SIZES[t]
    return n // blk * size


def ggml_rows(fn, x, t):
    """Rounds each row of x with ggml's fn into type t; returns [rows, row_bytes] uint8."""
    rb = row_bytes(t, x.shape[1])
    out = np.zeros((x.shape[0], rb + 64), dtype=np.uint8)  # + slack: ggml writes whole blocks
    for r in range(x.shape[0]):
        src = np.ascontiguousarray(x[r], dtype=np.float32)
        getattr(ggml, fn)(src.ctypes.data, out[r].ctypes.data, x.shape[1])
    return np.ascontiguousarray(out[:, :rb])


def loom_quant(t, x):
    inp, out = os.path.join(TMP, "qdot_in.f32"), os.path.join(TMP, "qdot_out.bin")
    x.astype(np.float32).tofile(inp)
    r = subprocess.run([TOOL, "quant", str(int(t)), str(x.shape[1]), inp, out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"qdot_tool quant {t.name}: {r.stderr}")
    return np.fromfile(out, dtype=np.uint8).reshape(x.shape[0], -1)


def loom_dot(wt, w, xq, n):
    wp, xp = os.path.join(TMP, "qdot_w.bin"), os.path.join(TMP, "qdot_x.bin")
    op = os.path.join(TMP, "qdot_dot.f32")
    w.tofile(wp)
    xq.tofile(xp)
    r = subprocess.run([TOOL, "dot", str(int(wt)), str(n), wp, xp, op], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(f"qdot_tool dot {wt.name}: {r.stderr}")
    return np.fromfile(op, dtype=np.float32)


def activation_rows(rng):
    """Rows with the awkward cases (see the docstring) and ordinary data."""
    x = rng.standard_normal((ROWS, N)).astype(np.float32)
    x *= np.float32(10.0) ** rng.integers(-6, 5, (ROWS, 1)).astype(np.float32)
    x[0] = np.round(x[0] * 2) / 2                      # many halves
    x[0, ::32] = 127.0                                 # amax 127 -> scale 1: exact ties
    x[1, :512] = 0.0                                   # zero blocks
    x[2] = 0.0
    x[2, 77] = -3.0                                    # a lone value per row
    x[3, ::97] *= 1000.0                               # outliers
    return x


def main():
    os.makedirs(TMP, exist_ok=True)
    rng = np.random.default_rng(1234)
    failures = []

    # 1. activation rounding
    x = activation_rows(rng)
    for t, fn in ACT_FN.items():
        ref = ggml_rows(fn, x, t)
        got = loom_quant(t, x)
        diff = int(np.count_nonzero(ref != got))
        print(f"{t.name:5s} activations: {ref.size} bytes, {diff} differ from ggml's {fn}")
        if diff:
            failures.append(f"{t.name} activations differ from ggml in {diff} bytes")

    # 2. dot products
    for wt, (at, dot, wq) in WEIGHTS.items():
        wf = rng.standard_normal((ROWS, N)).astype(np.float32)
        w = ggml_rows(wq, wf, wt)
        xs = rng.standard_normal((ROWS, N)).astype(np.float32) * np.float32(3.0)
        xq = ggml_rows(ACT_FN[at], xs, at)
        ref = np.zeros(ROWS, dtype=np.float32)
        for r in range(ROWS):
            s = C.c_float()
            getattr(ggml, dot)(N, C.byref(s), 0, w[r].ctypes.data, 0, xq[r].ctypes.data, 0, 1)
            ref[r] = s.value
        got = loom_dot(wt, w, xq, N)
        wd = dequantize(w, wt).reshape(ROWS, N).astype(np.float64)
        mag = np.sum(np.abs(wd) * np.abs(xs.astype(np.float64)), axis=1)
        worst = float(np.max(np.abs(got.astype(np.float64) - ref) / mag))
        print(f"{wt.name:5s} x {at.name:5s}: max |loom - ggml| / sum|w x| = {worst:.2e}")
        if not worst <= REL:
            failures.append(f"{wt.name}: loom vs {dot} differs by {worst:.2e} > {REL:.0e}")

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("loom's activation rounding is byte-identical to llama.cpp's; dots agree to float "
          "rounding")


if __name__ == "__main__":
    main()
