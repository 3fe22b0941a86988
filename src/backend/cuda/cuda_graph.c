/* cuda_graph.c — a step's kernel launches replayed as a CUDA graph (opt-in: LOOM_CUDA_GRAPHS=1
 * in the environment when the device opens).
 *
 * The ops queue their kernels as they always do; with graphs on, the first kernel-launching op
 * after a copy or a synchronization starts capturing the stream (loom__cuda_launches), and the
 * next copy, synchronization, allocation or step (loom__cuda_flush) ends the capture and
 * launches what it holds as one graph. A decode step's forward pass — every layer's kernels,
 * between the copy of its tokens and the copy of its logits' summaries — thus reaches the GPU as
 * one launch, with no gap between kernels for the host to fill.
 *
 * A step's kernels take other parameters every step (positions, lengths, split plans), so each
 * capture is a new graph; it updates an executable graph of the same shape (the same number of
 * nodes: cudaGraphExecUpdate changes kernel parameters and grids in place) kept from an earlier
 * step, and only a new shape — a prefill among decodes, a split plan that adds a fold — pays for
 * an instantiation. LOOM_CUDA_GRAPH_SLOTS executable graphs are kept per stream, the least
 * recently used replaced.
 *
 * Failure: a capture the runtime refused or invalidated has queued nothing, so the step fails
 * (LOOM_ERR_BACKEND, saying so) and graphs stay off for the stream from then on; a capture that
 * cannot start leaves the stream running uncaptured. */
#include "backend/cuda/cuda_internal.h"

#include "core/log.h"

#include <stdlib.h>

/* Stops graphs on this stream for good, logging why once. */
static void graphs_off(loom__cuda_stream *c, const char *why, cudaError_t e) {
    if (!c->graph_off)
        loom__log(LOOM_LOG_WARN, "cuda: graphs off for this stream: %s: %s (%s)", why,
                  cudaGetErrorString(e), cudaGetErrorName(e));
    c->graph_off = true;
}

loom_status loom__cuda_launches(loom__cuda_stream *c) {
    LOOM_TRY(loom__cuda_bind(c->dev));
    if (!c->dev->graphs || c->graph_off || c->capturing) return LOOM_OK;
    /* relaxed: the ops' own runtime calls (an attribute set once, the last error) stay legal */
    const cudaError_t e = cudaStreamBeginCapture(c->s, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        graphs_off(c, "cudaStreamBeginCapture", e); /* nothing captured: run uncaptured */
        return LOOM_OK;
    }
    c->capturing = true;
    return LOOM_OK;
}

/* The slot for a graph of n_nodes nodes: the one that last held that many, else the least
 * recently used. */
static loom__cuda_graph_slot *slot_for(loom__cuda_stream *c, size_t n_nodes) {
    loom__cuda_graph_slot *best = &c->graphs[0];
    for (int i = 0; i < LOOM_CUDA_GRAPH_SLOTS; i++) {
        loom__cuda_graph_slot *s = &c->graphs[i];
        if (s->exec != NULL && s->n_nodes == n_nodes) return s;
        if (s->exec == NULL || (best->exec != NULL && s->used < best->used)) best = s;
    }
    return best;
}

static cudaError_t update(cudaGraphExec_t exec, cudaGraph_t g) {
#if CUDART_VERSION >= 12000
    cudaGraphExecUpdateResultInfo info;
    return cudaGraphExecUpdate(exec, g, &info);
#else
    cudaGraphNode_t bad = NULL;
    enum cudaGraphExecUpdateResult res;
    return cudaGraphExecUpdate(exec, g, &bad, &res);
#endif
}

static cudaError_t instantiate(cudaGraphExec_t *exec, cudaGraph_t g) {
#if CUDART_VERSION >= 12000
    return cudaGraphInstantiate(exec, g, 0);
#else
    return cudaGraphInstantiate(exec, g, NULL, NULL, 0);
#endif
}

loom_status loom__cuda_flush(loom__cuda_stream *c) {
    if (!c->capturing) return LOOM_OK;
    c->capturing = false;
    LOOM_TRY(loom__cuda_bind(c->dev)); /* instantiation and launch on the stream's device */
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->s, &g);
    if (e != cudaSuccess || g == NULL) {
        (void)cudaGetLastError();
        graphs_off(c, "cudaStreamEndCapture", e);
        return loom__fail(LOOM_ERR_BACKEND,
                          "cuda: the step's kernels could not be captured as a graph: %s (%s); "
                          "the step is lost (graphs are off for this stream from now on)",
                          cudaGetErrorString(e), cudaGetErrorName(e));
    }
    size_t n_nodes = 0;
    e = cudaGraphGetNodes(g, NULL, &n_nodes);
    if (e == cudaSuccess && n_nodes == 0) { /* nothing was queued since the capture began */
        (void)cudaGraphDestroy(g);
        return LOOM_OK;
    }
    loom__cuda_graph_slot *s = slot_for(c, n_nodes);
    if (e == cudaSuccess && s->exec != NULL && s->n_nodes == n_nodes) {
        if (update(s->exec, g) == cudaSuccess) {
            c->n_graph_updates++;
        } else { /* another shape after all: a new executable graph */
            (void)cudaGetLastError();
            (void)cudaGraphExecDestroy(s->exec);
            s->exec = NULL;
        }
    }
    if (e == cudaSuccess && s->exec != NULL && s->n_nodes != n_nodes) {
        /* the least recently used slot, holding another shape: its graph goes */
        (void)cudaGraphExecDestroy(s->exec);
        s->exec = NULL;
    }
    if (e == cudaSuccess && s->exec == NULL) {
        e = instantiate(&s->exec, g);
        c->n_graph_instantiations++;
        if (e != cudaSuccess) s->exec = NULL;
    }
    if (e == cudaSuccess) {
        s->n_nodes = n_nodes;
        s->used = ++c->graph_clock;
        e = cudaGraphLaunch(s->exec, c->s);
    }
    (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        graphs_off(c, "instantiating or launching the step's graph", e);
        return loom__fail(LOOM_ERR_BACKEND,
                          "cuda: the step's graph of %zu kernels could not run: %s (%s); the "
                          "step is lost (graphs are off for this stream from now on)",
                          n_nodes, cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return LOOM_OK;
}

void loom__cuda_graphs_free(loom__cuda_stream *c) {
    if (c->capturing) { /* a stream destroyed mid-capture: drop what it holds */
        cudaGraph_t g = NULL;
        (void)cudaStreamEndCapture(c->s, &g);
        if (g != NULL) (void)cudaGraphDestroy(g);
        (void)cudaGetLastError();
        c->capturing = false;
    }
    for (int i = 0; i < LOOM_CUDA_GRAPH_SLOTS; i++)
        if (c->graphs[i].exec != NULL) (void)cudaGraphExecDestroy(c->graphs[i].exec);
}
