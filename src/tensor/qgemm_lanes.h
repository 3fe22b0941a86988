/* qgemm_lanes.h — the vector width of the token-lane kernels (qgemm_lanes_*.c): LW tokens per
 * register, 16 in 512-bit registers where the variant has AVX-512, else 8 in 256-bit ones, and
 * the handful of operations the kernels use, named once for both widths. Every lane does the
 * same float operation at either width, so the width changes speed, never bits. Internal to
 * src/tensor; include after qdot_internal.h, only where LOOM_QDOT_VNNI is set. */
#pragma once

#include "tensor/qdot_internal.h"

#if defined(LOOM_QDOT_AVX512)
#define LW 16
typedef __m512i vi;
typedef __m512 vf;
#define V_ZERO_SI()         _mm512_setzero_si512()
#define V_ZERO_PS()         _mm512_setzero_ps()
#define V_SET1_EPI32(v)     _mm512_set1_epi32(v)
#define V_SET1_PS(v)        _mm512_set1_ps(v)
#define V_LOAD_SI(p)        _mm512_load_si512((const void *)(p))
#define V_LOAD_PS(p)        _mm512_load_ps(p)
#define V_STORE_PS(p, v)    _mm512_store_ps(p, v)
#define V_DPBUSD(acc, u, s) _mm512_dpbusd_epi32(acc, u, s)
#define V_ADD_EPI32(a, b)   _mm512_add_epi32(a, b)
#define V_SUB_EPI32(a, b)   _mm512_sub_epi32(a, b)
#define V_XOR_SI(a, b)      _mm512_xor_si512(a, b)
#define V_MULLO_EPI32(a, b) _mm512_mullo_epi32(a, b)
#define V_MADD_EPI16(a, b)  _mm512_madd_epi16(a, b)
#define V_CVT(v)            _mm512_cvtepi32_ps(v)
#define V_ADD_PS(a, b)      _mm512_add_ps(a, b)
#define V_SUB_PS(a, b)      _mm512_sub_ps(a, b)
#define V_MUL_PS(a, b)      _mm512_mul_ps(a, b)
#else
#define LW                  8
typedef __m256i vi;
typedef __m256 vf;
#define V_ZERO_SI()         _mm256_setzero_si256()
#define V_ZERO_PS()         _mm256_setzero_ps()
#define V_SET1_EPI32(v)     _mm256_set1_epi32(v)
#define V_SET1_PS(v)        _mm256_set1_ps(v)
#define V_LOAD_SI(p)        _mm256_load_si256((const __m256i *)(p))
#define V_LOAD_PS(p)        _mm256_load_ps(p)
#define V_STORE_PS(p, v)    _mm256_store_ps(p, v)
#define V_DPBUSD(acc, u, s) loom__qd_dpbusd(acc, u, s)
#define V_ADD_EPI32(a, b)   _mm256_add_epi32(a, b)
#define V_SUB_EPI32(a, b)   _mm256_sub_epi32(a, b)
#define V_XOR_SI(a, b)      _mm256_xor_si256(a, b)
#define V_MULLO_EPI32(a, b) _mm256_mullo_epi32(a, b)
#define V_MADD_EPI16(a, b)  _mm256_madd_epi16(a, b)
#define V_CVT(v)            _mm256_cvtepi32_ps(v)
#define V_ADD_PS(a, b)      _mm256_add_ps(a, b)
#define V_SUB_PS(a, b)      _mm256_sub_ps(a, b)
#define V_MUL_PS(a, b)      _mm256_mul_ps(a, b)
#endif
