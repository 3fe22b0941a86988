/* mma.cuh — warp-level tensor-core products (mma.sync, sm_80+) at float32 accuracy, shared by
 * the tiled GEMM (gemm.cu) and the tiled prefill attention (attention_prefill.cu).
 *
 * The instruction is mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: D[16x8] = A[16x8] ·
 * B[8x8] + C, inputs TF32 (float32 with 10 mantissa bits), products summed into float32. loom's
 * CPU backend keeps float32 activations; one TF32 product would cost them 13 bits. So a float32
 * operand is split into two TF32 parts, x = hi + lo (hi = x rounded to TF32, lo = the rest
 * rounded to TF32: 21 of float32's 24 bits), and a product of two float32 operands takes three
 * instructions (a_lo·b_hi + a_hi·b_lo + a_hi·b_hi, the smallest terms first; a_lo·b_lo, about
 * 2^-22 of the product, is left out). An operand that is exactly TF32 — F16, BF16 and FP8
 * values, the integer-times-power-of-two products some block formats decode to — needs no lo
 * part: two instructions, or one where both are exact.
 *
 * Every output's additions run in one order fixed by the K loop of the caller (no split-K, no
 * atomics): an output's bits do not depend on how many rows or columns the tile held.
 *
 * Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k8" with .tf32), per lane l of the
 * warp, g = l / 4 (the group) and i = l % 4 (the thread in the group):
 *   A (16 x 8, row-major)  a[r], r < 4: row g + 8 (r % 2), column i + 4 (r / 2)
 *   B (8 x 8, column-major) b[r], r < 2: row (k) i + 4 r,   column (n) g
 *   C, D (16 x 8)           c[r], r < 4: row g + 8 (r / 2), column 2 i + (r % 2)
 * The functions below say the same in code; host code (tests) may call them too. */
#pragma once

#include "common.cuh"

static __host__ __device__ __forceinline__ int loom_mma_a_row(int lane, int r) {
    return (lane >> 2) + 8 * (r & 1);
}
static __host__ __device__ __forceinline__ int loom_mma_a_col(int lane, int r) {
    return (lane & 3) + 4 * (r >> 1);
}
static __host__ __device__ __forceinline__ int loom_mma_b_row(int lane, int r) {
    return (lane & 3) + 4 * r;
}
static __host__ __device__ __forceinline__ int loom_mma_b_col(int lane) {
    return lane >> 2;
}
static __host__ __device__ __forceinline__ int loom_mma_c_row(int lane, int r) {
    return (lane >> 2) + 8 * (r >> 1);
}
static __host__ __device__ __forceinline__ int loom_mma_c_col(int lane, int r) {
    return 2 * (lane & 3) + (r & 1);
}

/* x rounded to TF32 (nearest, ties away: cvt.rna), as the bits of a float32. */
static __device__ __forceinline__ uint32_t loom_tf32(float x) {
#if defined(LOOM_K_EMULATE) /* tests/kernels_emu/ (common.cuh) */
    return loom_emu_cvt_rna_tf32(x);
#else
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
#endif
}

/* x = hi + lo, both TF32. Infinities and NaN give a NaN lo (inf - inf), which propagates as
 * the float32 product would. */
static __device__ __forceinline__ void loom_tf32_split(float x, uint32_t *hi, uint32_t *lo) {
    *hi = loom_tf32(x);
    *lo = loom_tf32(x - __uint_as_float(*hi));
}

/* d += a · b over one m16n8k8 tile (a: 4 TF32 registers, b: 2, d: 4 floats). */
static __device__ __forceinline__ void loom_mma_tf32(float d[4], const uint32_t a[4],
                                                     const uint32_t b[2]) {
#if defined(LOOM_K_EMULATE) /* tests/kernels_emu/: the emulator's warp-wide instruction */
    loom_emu_mma_m16n8k8_tf32(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    /* The plugin is built for sm_80 and later only (CMake); never reached. */
    (void)a;
    (void)b;
    d[0] = d[1] = d[2] = d[3] = __int_as_float(0x7fc00000);
#endif
}

/* d += a · b at float32 accuracy: both operands split (three instructions). */
static __device__ __forceinline__ void loom_mma_3xtf32(float d[4], const uint32_t a_hi[4],
                                                       const uint32_t a_lo[4],
                                                       const uint32_t b_hi[2],
                                                       const uint32_t b_lo[2]) {
    loom_mma_tf32(d, a_lo, b_hi);
    loom_mma_tf32(d, a_hi, b_lo);
    loom_mma_tf32(d, a_hi, b_hi);
}

/* d += a · b where b is exactly TF32 and a is split (two instructions). */
static __device__ __forceinline__ void
loom_mma_2xtf32_a(float d[4], const uint32_t a_hi[4], const uint32_t a_lo[4], const uint32_t b[2]) {
    loom_mma_tf32(d, a_lo, b);
    loom_mma_tf32(d, a_hi, b);
}

/* d += a · b where a is exactly TF32 and b is split (two instructions). */
static __device__ __forceinline__ void
loom_mma_2xtf32_b(float d[4], const uint32_t a[4], const uint32_t b_hi[2], const uint32_t b_lo[2]) {
    loom_mma_tf32(d, a, b_lo);
    loom_mma_tf32(d, a, b_hi);
}

/* ---- 16-bit operands: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 ------ */
/* The reduced-precision products (LOOM_CUDA_MATH=bf16): D[16x8] = A[16x16] · B[16x8] + C, the
 * operands BF16 (or F16) packed two to a register, the products summed into float32. One
 * instruction covers what six (3xTF32) or four (2xTF32) m16n8k8's do at float32 accuracy, at
 * the tensor cores' 16-bit rate (twice TF32's).
 *
 * Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), per
 * lane, g = lane / 4, i = lane % 4; each register holds two elements, the lower-numbered in
 * its low 16 bits, the pair adjacent in K:
 *   A (16 x 16, row-major)  a[r], r < 4: row g + 8 (r % 2), columns 2i + 8 (r / 2) and + 1
 *   B (16 x 8, column-major) b[r], r < 2: rows (k) 2i + 8 r and + 1, column (n) g
 *   C, D (16 x 8)            as m16n8k8's (loom_mma_c_row / loom_mma_c_col)
 * So a C fragment of two n8 tiles side by side is, packed, the A fragment of a 16-wide K step
 * (lane (g, i) holds columns 2i, 2i + 1 of both): attention's P needs no shuffle. */
static __host__ __device__ __forceinline__ int loom_mma16_a_row(int lane, int r) {
    return (lane >> 2) + 8 * (r & 1);
}
static __host__ __device__ __forceinline__ int loom_mma16_a_col(int lane, int r) {
    return 2 * (lane & 3) + 8 * (r >> 1);
}
static __host__ __device__ __forceinline__ int loom_mma16_b_row(int lane, int r) {
    return 2 * (lane & 3) + 8 * r;
}
static __host__ __device__ __forceinline__ int loom_mma16_b_col(int lane) {
    return lane >> 2;
}

/* The 16-bit operand types. */
#define LOOM_MMA16_BF16 0
#define LOOM_MMA16_F16  1

/* x rounded to the 16-bit type (nearest even), its bits. */
template <int OP16> static __device__ __forceinline__ uint32_t loom_mma16_bits(float x) {
    if constexpr (OP16 == LOOM_MMA16_BF16)
        return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    else
        return __half_as_ushort(__float2half_rn(x));
}
/* lo and hi, rounded, in one register (lo in the low half). */
template <int OP16> static __device__ __forceinline__ uint32_t loom_mma16_pack(float lo, float hi) {
    return loom_mma16_bits<OP16>(lo) | (loom_mma16_bits<OP16>(hi) << 16);
}

/* d += a · b over one m16n8k16 tile (a: 4 registers, b: 2, of two OP16 values each). */
template <int OP16>
static __device__ __forceinline__ void loom_mma16(float d[4], const uint32_t a[4],
                                                  const uint32_t b[2]) {
#if defined(LOOM_K_EMULATE)
    loom_emu_mma_m16n8k16(OP16 == LOOM_MMA16_F16, d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define LOOM_MMA16_ASM(T)                                                                          \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 "                          \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                 \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
    if constexpr (OP16 == LOOM_MMA16_BF16)
        LOOM_MMA16_ASM("bf16");
    else
        LOOM_MMA16_ASM("f16");
#undef LOOM_MMA16_ASM
#else
    (void)a;
    (void)b;
    d[0] = d[1] = d[2] = d[3] = __int_as_float(0x7fc00000);
#endif
}
