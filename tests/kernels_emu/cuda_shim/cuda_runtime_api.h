/* cuda_runtime_api.h (kernel emulator shim) — the few CUDA runtime types that loom's kernel
 * headers name, so that the kernels (kernels/NAME.cu) compile on the host for tests/kernels_emu/
 * with no CUDA toolkit installed (CI machines have none). Only this test's include path holds this
 * folder; every real build uses the toolkit's header. Types only: nothing here runs on a device. */
#pragma once

#include <stdint.h>

typedef struct CUstream_st *cudaStream_t;
typedef int cudaError_t;
#define cudaSuccess 0

/* The vector types, with CUDA's sizes and alignments (the kernels' wide loads rely on them:
 * UBSan checks every such load's alignment here). */
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
#if defined(__cplusplus)
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz) {}
#endif
};
struct __attribute__((aligned(8))) float2 {
    float x, y;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned int x, y;
};
struct __attribute__((aligned(16))) uint4 {
    unsigned int x, y, z, w;
};
struct __attribute__((aligned(8))) int2 {
    int x, y;
};
struct __attribute__((aligned(16))) int4 {
    int x, y, z, w;
};

#if defined(__cplusplus)
static inline float2 make_float2(float x, float y) {
    return float2{x, y};
}
static inline float4 make_float4(float x, float y, float z, float w) {
    return float4{x, y, z, w};
}
static inline uint2 make_uint2(unsigned int x, unsigned int y) {
    return uint2{x, y};
}
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
    return uint4{x, y, z, w};
}
static inline int2 make_int2(int x, int y) {
    return int2{x, y};
}
static inline int4 make_int4(int x, int y, int z, int w) {
    return int4{x, y, z, w};
}
#endif
