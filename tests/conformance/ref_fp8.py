"""ref_fp8.py — an FP8 E4M3 quantizer in numpy, written from the format's definition (1 sign
bit, 4 exponent bits of bias 7, 3 mantissa bits; no infinities; 0x7F and 0xFF are NaN; the
largest finite value is 448), for the tests that check loom's FP8 weights and FP8 KV pages.

Rounding is to the nearest value, ties to the even code, saturating at 448 — what loom's
tensor/fp8.h does and the CUDA toolkit's cuda_fp8.h (its C test compares bit for bit) does."""

import numpy as np


def _magnitudes():
    """Values of the magnitude codes 0 .. 0x7E, increasing with the code."""
    v = []
    for c in range(0x7F):
        e, m = c >> 3, c & 7
        v.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(v)


MAGS = _magnitudes()


def e4m3_codes(q):
    """Nearest E4M3 codes to the float32 values q (ties to the even code, saturating)."""
    q = np.asarray(q, dtype=np.float32)
    a = np.abs(q.astype(np.float64))
    hi = np.clip(np.searchsorted(MAGS, a), 1, len(MAGS) - 1)
    lo = hi - 1
    d_lo, d_hi = a - MAGS[lo], MAGS[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo)
    code = np.where(a >= MAGS[-1], len(MAGS) - 1, code)
    return (code | np.where(np.signbit(q), 0x80, 0)).astype(np.uint8)


def code_values(codes):
    """The values of E4M3 codes (no NaN codes), float64."""
    codes = np.asarray(codes)
    return MAGS[codes & 0x7F] * np.where(codes & 0x80, -1.0, 1.0)


def quantize_rows(x):
    """Each row (last axis) of x as loom stores it in FP8 and reads it back, in float64:
    scale = max|row| / 448 in float32, codes of x / scale (float32 division), value code * scale
    (a row of zeros: scale 0, codes 0)."""
    x32 = np.asarray(x, dtype=np.float32)
    scale = (np.max(np.abs(x32), axis=-1, keepdims=True) / np.float32(448.0)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = (x32 / scale).astype(np.float32)
    codes = np.where(scale == 0, 0, e4m3_codes(np.where(scale == 0, 0, q))).astype(np.uint8)
    return code_values(codes) * scale.astype(np.float64)


def self_check(check):
    """The quantizer above on values whose codes are known (check(cond, msg) reports)."""
    q = np.array([0.0, -0.0, 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -9, 448.0, 460.0, 500.0,
                  -1.0, 1.0625, 1.1875, 17.0], dtype=np.float32)
    want = [0x00, 0x80, 0x01, 0x00, 0x02, 0x7E, 0x7E, 0x7E, 0xB8, 0x38, 0x3A, 0x58]
    got = list(e4m3_codes(q))
    check(got == want, f"numpy E4M3 rounding on known values ({[hex(c) for c in got]})")
