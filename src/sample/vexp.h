/* vexp.h — e^d for a vector of doubles d <= 0, the sampler's hot operation (a 262,144-token
 * vocabulary takes one per token per pass). Written with GCC/Clang vector extensions so that
 * any x86-64 or ARM build vectorizes it at -O2, without intrinsics per instruction set.
 *
 * Accuracy: Cody-Waite reduction d = k ln2 + r, |r| <= ln2 / 2, and the Taylor polynomial of
 * e^r to degree 13 (truncation below 5e-18): within about 2 ulp of the correctly rounded value
 * over [-708, 0]. Below -708 the result is 0 (e^-708 < 4e-308: against a sum that includes
 * e^0 = 1 such a term can never change a double), and so it is for NaN and -inf. Fused
 * multiply-adds are used exactly where the build enables FMA instructions (LOOM__VFMA below, never
 * left to the compiler's contraction), so one build always gives the same bits.
 *
 * The helper takes pointers, not vector values: a vector argument wider than the baseline ISA
 * changes the calling convention (GCC's -Wpsabi); inlined, the pointers cost nothing. */
#pragma once

#include <stdint.h>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

/* LOOM__VL doubles per vector: 8 where AVX-512 is enabled, else 4 (32 bytes: native on AVX2;
 * GCC lowers some operations on 64-byte double vectors to scalar code without AVX-512). The
 * lane count changes the order of the sums built on it, so an AVX-512 build and an AVX2 build
 * may differ in the last bits; a given build always gives the same ones. */
#if defined(__AVX512F__)
#define LOOM__VL 8
#else
#define LOOM__VL 4
#endif
typedef double loom__vd __attribute__((vector_size(LOOM__VL * 8)));
typedef int64_t loom__vl __attribute__((vector_size(LOOM__VL * 8)));
typedef float loom__vf __attribute__((vector_size(LOOM__VL * 4)));
typedef int32_t loom__vi __attribute__((vector_size(LOOM__VL * 4)));
typedef float loom__v8f __attribute__((vector_size(32)));
typedef int32_t loom__v8i __attribute__((vector_size(32)));

/* a * b + c, fused (one rounding) when the build has FMA instructions. */
#if defined(__AVX512F__)
#define LOOM__VFMA(a, b, c) ((loom__vd)_mm512_fmadd_pd((a), (b), (c)))
#elif defined(__FMA__)
#define LOOM__VFMA(a, b, c) ((loom__vd)_mm256_fmadd_pd((a), (b), (c)))
#else
#define LOOM__VFMA(a, b, c) ((a) * (b) + (c))
#endif

#define LOOM__VEXP_MIN (-708.0)

/* Splits d into the lanes worth an exponential, *keep (-1 where LOOM__VEXP_MIN <= d, which is
 * false for NaN and -inf; 0 elsewhere), and *dz: d in those lanes, 0 in the others, so that
 * products such as e^d * d stay 0 rather than NaN there. */
static inline void loom__vexp_split(const loom__vd *d, loom__vd *dz, loom__vl *keep) {
    *keep = *d >= LOOM__VEXP_MIN;
    *dz = (loom__vd)((loom__vl)*d & *keep);
}

/* *out = e^*dz where *keep is set (there LOOM__VEXP_MIN <= *dz <= 0), 0 elsewhere; dz and keep
 * as loom__vexp_split makes them. */
static inline void loom__vexp(loom__vd *out, const loom__vd *dz, const loom__vl *keep) {
    const loom__vd zero = {0};
    const loom__vd shifter = zero + 0x1.8p52; /* adding it rounds to an integer in the low bits */
    const loom__vd one = zero + 1.0;
    const loom__vd t = LOOM__VFMA(*dz, one * 1.4426950408889634074, shifter);
    const loom__vd kf = t - shifter;
    /* ln 2 split so that kf * LN2_HI is exact for |k| < 2^11 */
    const loom__vd r = LOOM__VFMA(kf, one * -1.90821492927058770002e-10,
                                  LOOM__VFMA(kf, one * -6.93147180369123816490e-01, *dz));
    /* Taylor series of e^r to degree 13 by Horner's scheme, from 1/13! down */
    loom__vd p = LOOM__VFMA(r, one * (1.0 / 6227020800.0), one * (1.0 / 479001600.0));
    p = LOOM__VFMA(p, r, one * (1.0 / 39916800.0));
    p = LOOM__VFMA(p, r, one * (1.0 / 3628800.0));
    p = LOOM__VFMA(p, r, one * (1.0 / 362880.0));
    p = LOOM__VFMA(p, r, one * (1.0 / 40320.0));
    p = LOOM__VFMA(p, r, one * (1.0 / 5040.0));
    p = LOOM__VFMA(p, r, one * (1.0 / 720.0));
    p = LOOM__VFMA(p, r, one * (1.0 / 120.0));
    p = LOOM__VFMA(p, r, one * (1.0 / 24.0));
    p = LOOM__VFMA(p, r, one * (1.0 / 6.0));
    p = LOOM__VFMA(p, r, one * 0.5);
    p = LOOM__VFMA(p, r, one);
    p = LOOM__VFMA(p, r, one);
    /* 2^k from the shifted value's low bits: k >= -1022 since dz >= -708, so 2^k is normal. */
    const loom__vl k = (loom__vl)t - (loom__vl)shifter;
    const loom__vd e = p * (loom__vd)((k + 1023) << 52);
    *out = (loom__vd)((loom__vl)e & *keep);
}
