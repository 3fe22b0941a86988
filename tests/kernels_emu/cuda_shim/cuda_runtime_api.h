/* cuda_runtime_api.h (kernel emulator shim) — the CUDA runtime as loom's kernels and CUDA backend
 * name it, so that both compile on the host with no CUDA toolkit installed: the kernels
 * (kernels/NAME.cu) for tests/kernels_emu/, and the whole backend (src/backend/cuda/NAME.c with the
 * kernels' launchers) for the emulated plugin, whose runtime (cudart_emu.cpp) runs every kernel
 * on the SIMT emulator. Only those builds' include paths hold this folder; every real build uses
 * the toolkit's header. The functions are declared here with the toolkit's signatures (CUDA 12's
 * where they changed) and defined only in cudart_emu.cpp. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define CUDART_VERSION 12050

typedef int cudaError_t;
#define cudaSuccess                       0
#define cudaErrorInvalidValue             1
#define cudaErrorMemoryAllocation         2
#define cudaErrorInvalidDevice            101
#define cudaErrorStreamCaptureUnsupported 900
#define cudaErrorGraphExecUpdateFailure   910

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUgraphNode_st *cudaGraphNode_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
enum cudaGraphExecUpdateResult {
    cudaGraphExecUpdateSuccess = 0,
    cudaGraphExecUpdateError = 1,
    cudaGraphExecUpdateErrorTopologyChanged = 2
};
typedef struct cudaGraphExecUpdateResultInfo_st {
    enum cudaGraphExecUpdateResult result;
    cudaGraphNode_t errorNode, errorFromNode;
} cudaGraphExecUpdateResultInfo;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2
};
#define cudaEnableDefault      0x0
#define cudaStreamNonBlocking  0x01
#define cudaHostAllocPortable  0x01
#define cudaEventDisableTiming 0x02

/* The fields loom reads; the emulated device fills them. */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlockOptin;
    int major, minor;
    int multiProcessorCount;
};
struct cudaFuncAttributes {
    int maxThreadsPerBlock;
    int numRegs; /* 0 on the emulator: registers are not modelled */
};

#if defined(__cplusplus)
extern "C" {
#endif
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetLastError(void);
/* The emulator's driver: cuTensorMapEncodeTiled only (loom_emu_tmap_encode_tiled). */
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo *info);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
#if defined(__cplusplus)
}
#endif

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
