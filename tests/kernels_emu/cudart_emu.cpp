// cudart_emu.cpp — the CUDA runtime of the emulated plugin (tests/CMakeLists.txt's
// loom-cuda-emu): libloom-cuda.so's own host code (src/backend/cuda) and kernel launchers
// (kernels/*.cu, LOOM_K_EMU_BACKEND) over a device that is this process: device memory is host
// memory, and every kernel runs on the SIMT emulator (kernel_emu.cpp). The device reports compute
// capability LOOM_EMU_CC (80, 89 or 90; default 90, so the wgmma paths run) and LOOM_EMU_SMS
// multiprocessors (default 8).
//
// Stream semantics are kept where the host code could get them wrong, so its mistakes show:
//   - work is deferred: kernels and copies queue on their stream and run only when the host
//     synchronizes (the stream, an event recorded on it, or a blocking cudaMemcpy); a host that
//     reads a result before synchronizing reads the 0xff bytes its destination was filled with
//     when the copy was queued (pinned memory; pageable destinations synchronize, as CUDA does);
//   - a copy from pinned memory reads its source when it runs, not when it is queued (a host that
//     rewrites a staging buffer before the copy ran sends the new bytes); a copy from pageable
//     memory takes its bytes when queued, as CUDA's staging does;
//   - capture: work on a capturing stream is recorded, not run; synchronizing a capturing stream
//     is an error; a graph's launches replay its kernels with their captured arguments and its
//     copies from their captured addresses; cudaGraphExecUpdate takes a graph of the same shape;
//   - allocations are checked: freeing what was not allocated (or twice) is an error.
// One lock serializes every call (the emulator is one machine).
#include "cuda_runtime_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

// The emulator's tensor-map encoder (kernel_emu_async.cpp), this driver's cuTensorMapEncodeTiled.
extern "C" int loom_emu_tmap_encode_tiled(void *map, int dtype, uint32_t rank, void *addr,
                                          const uint64_t *dims, const uint64_t *strides,
                                          const uint32_t *box, const uint32_t *elem_strides,
                                          int interleave, int swizzle, int l2, int oob);
extern "C" void loom_emu_submit(cudaStream_t stream, void (*run)(void *), void *ctx,
                                void (*drop)(void *));

namespace {

// A kernel launch: its closure, dropped when no stream or graph holds it any more.
struct closure {
    void (*run)(void *);
    void *ctx;
    void (*drop)(void *);
    closure(void (*r)(void *), void *c, void (*d)(void *)) : run(r), ctx(c), drop(d) {}
    closure(const closure &) = delete;
    closure &operator=(const closure &) = delete;
    ~closure() { drop(ctx); }
};

// One stream operation: a kernel, or a copy (from src, or from the bytes taken when queued).
struct op {
    std::shared_ptr<closure> kernel;
    void *dst = nullptr;
    const void *src = nullptr;
    size_t bytes = 0;
    std::shared_ptr<std::vector<unsigned char>> taken;
    void perform() const {
        if (kernel) {
            kernel->run(kernel->ctx);
        } else if (bytes > 0) {
            memmove(dst, taken ? taken->data() : src, bytes);
        }
    }
};

} // namespace

struct CUstream_st {
    std::deque<op> queue;
    uint64_t queued = 0, done = 0; // operations ever queued / performed
    bool capturing = false;
    std::vector<op> captured;
};
struct CUevent_st {
    cudaStream_t stream = nullptr;
    uint64_t at = 0; // the stream's operations before the record
};
struct CUgraph_st {
    std::vector<op> nodes;
};
struct CUgraphExec_st {
    std::vector<op> nodes;
};

namespace {

std::recursive_mutex g_mu;
thread_local cudaError_t g_last = cudaSuccess;
CUstream_st g_legacy;                 // stream 0
std::vector<CUstream_st *> g_streams; // the others, as created
std::map<const unsigned char *, size_t> g_device, g_pinned;
size_t g_device_bytes = 0;
constexpr size_t TOTAL_BYTES = (size_t)16 << 30;

cudaError_t fail(cudaError_t e) {
    g_last = e;
    return e;
}

CUstream_st *stream_of(cudaStream_t s) {
    return s ? s : &g_legacy;
}

// Whether [p, p + n) lies in one allocation of map m.
bool within(const std::map<const unsigned char *, size_t> &m, const void *p, size_t n) {
    const unsigned char *c = (const unsigned char *)p;
    auto it = m.upper_bound(c);
    if (it == m.begin()) return false;
    --it;
    return c >= it->first && c + n <= it->first + it->second;
}

// Performs stream s's queued operations up to operation number `until`.
void drain(CUstream_st *s, uint64_t until) {
    while (s->done < until && !s->queue.empty()) {
        const op o = s->queue.front();
        s->queue.pop_front();
        s->done++;
        o.perform();
    }
}

// Every stream's queued operations.
void drain_all() {
    drain(&g_legacy, g_legacy.queued);
    for (CUstream_st *s : g_streams) drain(s, s->queued);
}

void enqueue(CUstream_st *s, op o) {
    if (s->capturing) {
        s->captured.push_back(std::move(o));
        return;
    }
    s->queue.push_back(std::move(o));
    s->queued++;
}

} // namespace

extern "C" {

void loom_emu_submit(cudaStream_t stream, void (*run)(void *), void *ctx, void (*drop)(void *)) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    op o;
    o.kernel = std::make_shared<closure>(run, ctx, drop);
    enqueue(stream_of(stream), std::move(o));
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0) return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    const char *cc = getenv("LOOM_EMU_CC"), *sms = getenv("LOOM_EMU_SMS");
    const int c = cc ? atoi(cc) : 90;
    prop->major = c / 10;
    prop->minor = c % 10;
    prop->multiProcessorCount = sms ? atoi(sms) : 8;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    prop->totalGlobalMem = TOTAL_BYTES;
    snprintf(prop->name, sizeof prop->name, "loom kernel emulator (sm_%d)", c);
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int *device) {
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    const cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
    (void)flags;
    if (symbol == nullptr || fn == nullptr) return fail(cudaErrorInvalidValue);
    const bool found = strcmp(symbol, "cuTensorMapEncodeTiled") == 0 && version >= 12000;
    *fn = found ? (void *)&loom_emu_tmap_encode_tiled : nullptr;
    if (status != nullptr)
        *status = found ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    case cudaErrorStreamCaptureUnsupported:
        return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorGraphExecUpdateFailure:
        return "cudaErrorGraphExecUpdateFailure";
    default:
        return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : cudaGetErrorName(e);
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    *p = nullptr;
    if (g_device_bytes + bytes > TOTAL_BYTES) return fail(cudaErrorMemoryAllocation);
    void *m = nullptr;
    if (posix_memalign(&m, 256, bytes ? bytes : 1) != 0) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xa5, bytes); /* cudaMalloc's memory is not zeroed */
    g_device[(const unsigned char *)m] = bytes;
    g_device_bytes += bytes;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    if (p == nullptr) return cudaSuccess;
    auto it = g_device.find((const unsigned char *)p);
    if (it == g_device.end()) return fail(cudaErrorInvalidValue);
    drain_all(); /* cudaFree synchronizes the device */
    g_device_bytes -= it->second;
    g_device.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    (void)flags;
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    void *m = nullptr;
    if (posix_memalign(&m, 256, bytes ? bytes : 1) != 0) return fail(cudaErrorMemoryAllocation);
    g_pinned[(const unsigned char *)m] = bytes ? bytes : 1;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    if (p == nullptr) return cudaSuccess;
    auto it = g_pinned.find((const unsigned char *)p);
    if (it == g_pinned.end()) return fail(cudaErrorInvalidValue);
    drain_all();
    g_pinned.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    *free_bytes = TOTAL_BYTES - g_device_bytes;
    *total_bytes = TOTAL_BYTES;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    CUstream_st *s = stream_of(stream);
    const bool to_host = kind == cudaMemcpyDeviceToHost, from_host = kind == cudaMemcpyHostToDevice;
    if ((to_host || kind == cudaMemcpyDeviceToDevice) && !within(g_device, src, bytes))
        return fail(cudaErrorInvalidValue);
    if ((from_host || kind == cudaMemcpyDeviceToDevice) && !within(g_device, dst, bytes))
        return fail(cudaErrorInvalidValue);
    op o;
    o.dst = dst, o.src = src, o.bytes = bytes;
    if (from_host && !within(g_pinned, src, bytes)) { /* pageable: staged now; not capturable */
        if (s->capturing) return fail(cudaErrorStreamCaptureUnsupported);
        o.taken = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                               (const unsigned char *)src + bytes);
    }
    if (to_host && !within(g_pinned, dst, bytes)) { /* pageable: the call waits for it */
        if (s->capturing) return fail(cudaErrorStreamCaptureUnsupported);
        drain(s, s->queued);
        o.perform();
        return cudaSuccess;
    }
    if (to_host && !s->capturing) memset(dst, 0xff, bytes); /* not there until it has run */
    enqueue(s, std::move(o));
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    if (g_legacy.capturing) return fail(cudaErrorStreamCaptureUnsupported);
    for (CUstream_st *s : g_streams)
        if (s->capturing) return fail(cudaErrorStreamCaptureUnsupported);
    drain_all();
    const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
    if (e != cudaSuccess) return e;
    drain(&g_legacy, g_legacy.queued);
    return cudaSuccess;
}

// Row by row, each a blocking cudaMemcpy (rows width bytes, pitches apart).
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    if (width > dpitch || width > spitch) return fail(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++) {
        const cudaError_t e = cudaMemcpy((unsigned char *)dst + r * dpitch,
                                         (const unsigned char *)src + r * spitch, width, kind);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    (void)flags;
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    *stream = new CUstream_st;
    g_streams.push_back(*stream);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    for (size_t i = 0; i < g_streams.size(); i++)
        if (g_streams[i] == stream) {
            drain(stream, stream->queued); /* its work still runs */
            g_streams.erase(g_streams.begin() + (long)i);
            delete stream;
            return cudaSuccess;
        }
    return fail(cudaErrorInvalidValue);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    CUstream_st *s = stream_of(stream);
    if (s->capturing) return fail(cudaErrorStreamCaptureUnsupported);
    drain(s, s->queued);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    (void)mode;
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    if (stream == nullptr || stream->capturing) return fail(cudaErrorStreamCaptureUnsupported);
    stream->capturing = true;
    stream->captured.clear();
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    *graph = nullptr;
    if (stream == nullptr || !stream->capturing) return fail(cudaErrorStreamCaptureUnsupported);
    stream->capturing = false;
    *graph = new CUgraph_st{std::move(stream->captured)};
    stream->captured.clear();
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    *event = new CUevent_st;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    CUstream_st *s = stream_of(stream);
    if (s->capturing) return fail(cudaErrorStreamCaptureUnsupported); /* not emulated */
    event->stream = s;
    event->at = s->queued;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    if (event->stream != nullptr) drain(event->stream, event->at);
    return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count) {
    if (nodes != nullptr)
        for (size_t i = 0; i < *count && i < graph->nodes.size(); i++)
            nodes[i] = (cudaGraphNode_t)(uintptr_t)(i + 1);
    *count = graph->nodes.size();
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags) {
    (void)flags;
    *exec = new CUgraphExec_st{graph->nodes};
    return cudaSuccess;
}

// Same shape: as many nodes, each a kernel or a copy where the other's is.
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo *info) {
    bool same = exec->nodes.size() == graph->nodes.size();
    for (size_t i = 0; same && i < graph->nodes.size(); i++)
        same = (exec->nodes[i].kernel != nullptr) == (graph->nodes[i].kernel != nullptr);
    info->result = same ? cudaGraphExecUpdateSuccess : cudaGraphExecUpdateErrorTopologyChanged;
    info->errorNode = info->errorFromNode = nullptr;
    if (!same) return fail(cudaErrorGraphExecUpdateFailure);
    exec->nodes = graph->nodes;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    CUstream_st *s = stream_of(stream);
    if (s->capturing) return fail(cudaErrorStreamCaptureUnsupported); /* not emulated */
    for (const op &o : exec->nodes) {
        if (!o.kernel && o.dst != nullptr && within(g_pinned, o.dst, o.bytes))
            memset(o.dst, 0xff, o.bytes);
        enqueue(s, o);
    }
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    delete exec;
    return cudaSuccess;
}

} // extern "C"
