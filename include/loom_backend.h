/*
 * loom_backend.h — the backend ABI of loom: what a compute backend implements. It is the only
 * loom header a backend plugin includes (it includes loom.h, for loom_status and the log
 * levels), and libloom's own CPU backend is written against it too.
 *
 * PLUGINS. A backend other than the built-in CPU one is a shared library libloom-<name>.so
 * (libloom-cuda.so), opened by libloom at run time when a model asks for it
 * (loom_model_params.backend), so libloom itself never links a device runtime and a machine
 * without the driver loads libloom and runs on the CPU. libloom looks for the file in the
 * folder that holds libloom itself, then in each folder of $LOOM_BACKEND_PATH (separated by
 * ':'). The plugin exports one function, named by LOOM_BACKEND_ENTRY_SYMBOL:
 *
 *     loom_status loom_backend_entry(uint32_t abi_version, const loom_backend_host *host,
 *                                    const loom_backend_ops **ops);
 *
 * It receives the ABI version libloom speaks and the host's callbacks (keep the pointer: it
 * stays valid while the plugin is loaded), and returns its ops table (static storage). A
 * plugin built for another ABI version returns LOOM_ERR_UNSUPPORTED; libloom also checks the
 * table's abi_version and that every required slot is set before it calls anything else.
 * Errors: set the calling thread's message with host->set_error, then return the status; log
 * through host->log. A plugin never exits or aborts.
 *
 * OBJECTS.
 *   device (void *dev)        one per loaded model, from ops->open: device memory, the
 *                             model's weights, memory queries. Device slots may be called from
 *                             any thread at any time: they must be thread-safe.
 *   stream (void *stream)     an execution context, from ops->stream_create: one per engine or
 *                             session. Every slot that computes or moves data takes a stream.
 *                             A stream is used by one thread at a time, so it may hold the
 *                             backend's scratch memory, its worker threads or its device queue
 *                             without a lock; streams of one device run concurrently on
 *                             different threads and must not interfere.
 *   buffer (loom_buffer *)    a block of device memory from buffer_alloc. Addresses inside it
 *                             (buffer_base + offset), and the data of prepared weights, are
 *                             "backend addresses": the host never dereferences them (a device
 *                             backend's are device pointers; the CPU backend's are host ones).
 *
 * ORDER. The slots taking a stream run in call order and may be asynchronous: their results
 * are visible to the host after synchronize(stream) (tensor_get synchronizes first). Host
 * memory an asynchronous slot reads (tensor_set's source, a copy's host side) must stay
 * unchanged until the stream is synchronized.
 *
 * TENSORS. A loom_tensor is a 2-D view: ne[1] rows of ne[0] elements, rows row_stride bytes
 * apart (a per-head view of a [T, H*hd] activation is the same memory seen as [T*H, hd]).
 * Activations are always F32; weights may be of any type supports() accepts.
 *
 * STEPS. libloom runs the model one step at a time: it builds the step's paged-KV descriptors
 * (one per KV group of layers), checks them once, hands them all to step_begin, then queues the
 * ops of the forward pass; kv_store and attention receive one of those descriptors (the same
 * address), so a device backend uploads the block tables once per step, not once per layer.
 * The largest step an engine or session will run is described once, at stream_create, so a
 * backend can allocate its workspace once (and capture a step as a graph).
 *
 * VERSION. LOOM_BACKEND_ABI_VERSION changes whenever a struct or slot below changes; libloom
 * loads only plugins built for its own version.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1: the first table; 2: matmul_multi; 3: plugins — devices and streams, step descriptors,
 * per-tensor weight preparation, batched copies, memory queries, the v2 KV descriptor;
 * 4: add_rms_norm; 5: FP8 and BF16 KV pages, kv_flags (the Hadamard rotation) in the KV
 * descriptor, the op descriptor and the step shape; 6: merged pairs (LOOM_KV_MERGED, the merge
 * fields of the KV descriptor); 7: logits_summary (sampling without copying logit rows);
 * 8: norm_rope_store (a layer's q and k finished and its K/V written in one op),
 * norm_add_rms_norm (a post-norm, the residual add and the next norm in one op). */
#define LOOM_BACKEND_ABI_VERSION 8

/* The name of the function a plugin exports (see the top of this file). */
#define LOOM_BACKEND_ENTRY_SYMBOL "loom_backend_entry"

/* The plugin's entry point is exported with this attribute (default visibility). */
#if defined(_WIN32)
#define LOOM_BACKEND_EXPORT __declspec(dllexport)
#else
#define LOOM_BACKEND_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------------------------ */
/* Element types                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* Tensor element types. Below 0x100 the values are GGUF's (ggml's) type ids, so a type read from
 * a file maps directly; a block type stores block_elems values in a fixed-size block (the
 * layouts are GGUF's). From 0x100 on: element types loom uses that GGUF files do not. */
typedef enum loom_type {
    LOOM_TYPE_F32 = 0,
    LOOM_TYPE_F16 = 1,
    LOOM_TYPE_Q4_0 = 2,
    LOOM_TYPE_Q4_1 = 3,
    LOOM_TYPE_Q5_0 = 6,
    LOOM_TYPE_Q5_1 = 7,
    LOOM_TYPE_Q8_0 = 8,
    LOOM_TYPE_Q8_1 = 9,
    LOOM_TYPE_Q2_K = 10,
    LOOM_TYPE_Q3_K = 11,
    LOOM_TYPE_Q4_K = 12,
    LOOM_TYPE_Q5_K = 13,
    LOOM_TYPE_Q6_K = 14,
    LOOM_TYPE_Q8_K = 15,
    LOOM_TYPE_I8 = 24,
    LOOM_TYPE_I16 = 25,
    LOOM_TYPE_I32 = 26,
    LOOM_TYPE_I64 = 27,
    LOOM_TYPE_F64 = 28,
    LOOM_TYPE_BF16 = 30,
    LOOM_TYPE_GGUF_END_ = 40, /* upper bound of GGUF's id space (not a type) */
    /* KV-cache element types (pages only: never a weight) */
    LOOM_TYPE_FP8_E4M3 = 0x100, /* 1 sign, 4 exponent, 3 mantissa bits; max 448, no infinity */
    LOOM_TYPE_FP8_E5M2 = 0x101, /* 1 sign, 5 exponent, 2 mantissa bits; IEEE-like */
    /* Weights libloom converted at load (loom_model_params.weights); never read from a file. */
    LOOM_TYPE_FP8_E4M3_ROWS = 0x102, /* E4M3 codes with one float32 scale per row (below) */
} loom_type;

/* LOOM_TYPE_FP8_E4M3_ROWS: a row of K values is K E4M3 codes (bytes 0 .. K-1), zero bytes up
 * to the next multiple of 4, then the row's scale, a float32 in host byte order: row bytes
 * 4 * ceil(K / 4) + 4. Value i of the row is E4M3(code[i]) * scale. libloom writes scale =
 * max_i |w[i]| / 448 (the row's largest magnitude lands on E4M3's largest finite value; 0 for
 * an all-zero row, whose codes are then all 0) and code[i] = E4M3(w[i] / scale), round to
 * nearest even, in float32; it never writes the NaN codes 0x7F / 0xFF. The scale sits in the
 * row itself, so a tensor of such rows is still one loom_tensor (data, row_stride, ne): views,
 * get_rows' row addressing and weight copies need no second array, and row_stride and
 * data are multiples of 4, so the scale is float-aligned. A backend that does not run it says
 * so in supports() (MATMUL and GET_ROWS with this type) and refuses it in weight_prepare. */

/* ------------------------------------------------------------------------------------------ */
/* Tensors and buffers                                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct loom_buffer loom_buffer; /* opaque, backend-defined */

typedef struct loom_tensor {
    loom_type type;
    int64_t ne[2];     /* ne[0]: elements per row, ne[1]: rows */
    size_t row_stride; /* bytes between consecutive rows */
    void *data;        /* backend address of row 0 */
} loom_tensor;

static inline loom_tensor loom_tensor_2d(loom_type type, void *data, int64_t ne0, int64_t ne1,
                                         size_t row_stride) {
    loom_tensor t = {type, {ne0, ne1}, row_stride, data};
    return t;
}

/* ------------------------------------------------------------------------------------------ */
/* The paged-KV descriptor                                                                    */
/* ------------------------------------------------------------------------------------------ */
/*
 * How attention finds a step's keys and values: one descriptor per KV group (the layers that
 * share an attention window share block tables), describing a ragged batch of n_seqs sequences
 * in CSR form (FlashInfer's page table):
 *
 *   sequence s owns the physical blocks block_ids[indptr[s] .. indptr[s+1]), in position order:
 *   position p of s lives in block block_ids[indptr[s] + p / block_size], slot p % block_size.
 *   Its new tokens this step are rows q_start[s] .. q_start[s+1] of the step's activations, at
 *   positions pos_start[s] .. kv_len[s] - 1 (kv_len[s] = pos_start[s] + its number of new rows:
 *   the positions it holds once the step has stored them).
 *
 * Row i of sequence s, at position p = pos_start[s] + i, attends to positions
 * max(0, p - window + 1) .. p (window 0: 0 .. p), reading the pages in block-table order — the
 * same order whatever else is in the batch, which keeps a sequence's output independent of its
 * batch. Table entries before the window of a sequence's first new row may be LOOM_KV_NO_BLOCK
 * (a sliding window released them); every entry from there to its last new row holds a block
 * id in [0, n_blocks).
 *
 * Storage of one layer's pools (K and V alike), layout LOOM_KV_LAYOUT_NHD:
 *   [n_blocks][block_size][n_kv_heads][head_dim] elements of kv_type;
 *   block b, slot t, head h starts at base + b*block_stride + t*token_stride + h*head_dim*elt.
 * Scales (for quantized element types; scale_kind NONE for F16/BF16/F32): float32, per layer,
 *   PER_HEAD:        k_scale[l] -> [n_kv_heads]           (one scale per head and layer)
 *   PER_TOKEN_HEAD:  k_scale[l] -> [n_blocks][block_size][n_kv_heads], slot t of block b at
 *                    byte b*scale_block_stride + t*scale_token_stride
 *   a stored value x is read as x * scale.
 *
 * Rotation (kv_flags & LOOM_KV_HADAMARD): the K and V rows of every head are stored rotated by
 *   the orthonormal Walsh-Hadamard transform H = W_d / sqrt(d) (d = head_dim, a power of two;
 *   W_d the Sylvester matrix, W_d[i][j] = (-1)^popcount(i & j)), applied by kv_store before it
 *   converts to kv_type; attention rotates each query head by H and its output back by H (H is
 *   symmetric and its own inverse), so q.k and the weighted sum of V are those of unrotated
 *   attention up to rounding. It spreads a row's outlier elements over all of them before
 *   quantization.
 *
 * Cross-layer reuse: layer l reads the pools of layer_src[l] (NULL: every layer its own). A
 * layer with layer_src[l] != l computes no K/V and stores none; only source layers (layer_src[l]
 * == l) have pools, and k_base/v_base (and the scales) of the others may be NULL. A source
 * layer reads its own pools, and a layer reads a source of its own KV group.
 *
 * Merged pairs (kv_flags & LOOM_KV_MERGED; MiniCache-style): two layers A < B of one KV group,
 *   merge_with[A] = B, merge_with[B] = A (-1 for a layer in no pair), layer_src[B] = A. A owns
 *   pools; B has none, but B computes its K/V and kv_store is called for both. Each token's head
 *   row x (K and V alike) is kept as a unit direction and a norm ||x||:
 *     kv_store(A) writes dir_a = x_a / ||x_a|| into A's pools and ||x_a|| into the merge block;
 *     kv_store(B), positions of a sequence in increasing order, writes ||x_b|| and decides for
 *       each token: its distance d = max over heads, K and V of acos(dir_a . dir_b) / pi. A
 *       block keeps up to merge_retain tokens unmerged, those of the largest d seen so far in
 *       the block (a later token takes the place of the least distant kept one when its d is
 *       larger; a tie keeps the earlier one): a kept token's A row stays dir_a and dir_b goes to
 *       a retained row; every other token's A row becomes the merged direction
 *       e = slerp(dir_a, dir_b, merge_t) = (sin((1-t)W) dir_a + sin(tW) dir_b) / sin W,
 *       W = acos(dir_a . dir_b) (when sin W < 1e-6: (1-t) dir_a + t dir_b, normalized; a zero
 *       row: the other direction), and a token that loses its place is merged the same way from
 *       its dir_a and retained dir_b.
 *     dir_a here is A's row as stored (widened from the page); dir_b = x_b / ||x_b|| rounded
 *     to float32 (a zero row: zeros); dot products are summed in double; a head where either
 *     row is zero has distance 0 (its restoration is exact), one with a NaN distance 1. The
 *     scalar arithmetic is src/tensor/kv_merge.h's, which host and device code share. A
 *     newcomer kept while fewer than R are takes the lowest row no earlier slot holds. A slot
 *     may be stored a second time (a cached prompt's last block recomputed, a rolled-back
 *     step): it then finds the earlier slots as its first store's displacements left them.
 *     attention reads A's row j as row_j * ||x_a,j|| and B's as (its retained row if kept, else
 *       A's row) * ||x_b,j||. A reads a step's own tokens before B has merged them and earlier
 *       steps' tokens merged, so results depend on how a sequence is cut into steps: merged
 *       pairs are not batch-invariant.
 *   The pair's merge pool, merge_base[A] == merge_base[B], has one block per block of the group
 *   (block b at merge_base + b * merge_block_stride, 16-byte aligned), S = block_size,
 *   H = n_kv_heads, R = merge_retain:
 *     float   norm[S][H][4]   ||k_a||, ||v_a||, ||k_b||, ||v_b|| of slot t, head h
 *     float   dist[S]         d of slot t
 *     int32_t state[S]        -1 merged, else the retained row r (0 <= r < R) holding slot t
 *     kv_type rows[R][2][H][head_dim], at loom_kv_merge_rows_at(S, H): retained K then V rows
 *   Only slots below a slot being stored are read, so a block needs no clearing when it is
 *   reused; a store may rewrite those slots (a displaced token merged), never later ones. F16, BF16
 * and F32 pages, no rotation. A pair's K/V take two pools' bytes per token down to about one, plus
 * R retained rows per block.
 *
 * libloom checks every descriptor once per step before step_begin (structure, types, strides,
 * every block id a step reads or writes); backends may trust what they are given. All arrays
 * are host memory; a device backend copies what it needs in step_begin.
 */

/* A table entry whose block was released (it left a sliding window). */
#define LOOM_KV_NO_BLOCK (-1)

typedef enum loom_kv_layout {
    LOOM_KV_LAYOUT_NHD = 0, /* [block][slot][head][dim] (token-major) */
} loom_kv_layout;

/* kv_flags bits (loom_kv_desc, loom_op_desc, loom_step_shape). */
#define LOOM_KV_HADAMARD 1u /* K/V rows stored rotated by H (above); head_dim a power of two */
#define LOOM_KV_MERGED   2u /* some layers form merged pairs (above) */

/* Most retained rows per block of a merge pool (merge_retain). */
#define LOOM_KV_MERGE_MAX_RETAIN 4096

/* Byte offsets in a block of a merge pool (above): dist, state, and the retained rows (norm
 * is at 0). */
static inline size_t loom_kv_merge_dist_at(int32_t block_size, int32_t n_kv_heads) {
    return (size_t)block_size * (size_t)n_kv_heads * 4 * sizeof(float);
}
static inline size_t loom_kv_merge_state_at(int32_t block_size, int32_t n_kv_heads) {
    return loom_kv_merge_dist_at(block_size, n_kv_heads) + (size_t)block_size * sizeof(float);
}
static inline size_t loom_kv_merge_rows_at(int32_t block_size, int32_t n_kv_heads) {
    const size_t head =
        loom_kv_merge_state_at(block_size, n_kv_heads) + (size_t)block_size * sizeof(int32_t);
    return (head + 15) & ~(size_t)15;
}

typedef enum loom_kv_scale_kind {
    LOOM_KV_SCALE_NONE = 0,           /* values are stored as they are */
    LOOM_KV_SCALE_PER_HEAD = 1,       /* one float per (layer, kv head) */
    LOOM_KV_SCALE_PER_TOKEN_HEAD = 2, /* one float per (layer, position, kv head) */
} loom_kv_scale_kind;

typedef struct loom_kv_desc {
    int32_t n_seqs;
    const int32_t *indptr;    /* [n_seqs + 1] offsets into block_ids */
    const int32_t *block_ids; /* [indptr[n_seqs]] physical block ids (or LOOM_KV_NO_BLOCK) */
    const int32_t *q_start;   /* [n_seqs + 1] row offsets of each sequence's new tokens */
    const int32_t *pos_start; /* [n_seqs] position of each sequence's first new token */
    const int32_t *kv_len;    /* [n_seqs] positions held after this step */

    int32_t block_size; /* positions per block */
    int32_t n_blocks;   /* blocks in each pool of the group */
    int32_t n_kv_heads; /* key/value heads */
    int32_t head_dim;   /* elements per head */
    int32_t window;     /* positions a query reads back, its own included; 0: all */
    loom_type kv_type;  /* element type of the pools: F16, BF16, F32, FP8_E4M3, FP8_E5M2 */
    loom_kv_layout layout;
    size_t token_stride; /* bytes of one slot: at least n_kv_heads * head_dim * elt */
    size_t block_stride; /* bytes of one block: at least block_size * token_stride */

    int32_t n_layers;
    void *const *k_base;      /* [n_layers] each source layer's K pool (backend memory) */
    void *const *v_base;      /* [n_layers] each source layer's V pool */
    const int32_t *layer_src; /* [n_layers] the layer whose pools each layer reads; NULL: own */

    loom_kv_scale_kind scale_kind;
    void *const *k_scale;      /* [n_layers] K scales of each source layer, or NULL (NONE) */
    void *const *v_scale;      /* [n_layers] V scales */
    size_t scale_token_stride; /* PER_TOKEN_HEAD: bytes between slots of a scale pool */
    size_t scale_block_stride; /* PER_TOKEN_HEAD: bytes between blocks of a scale pool */
    uint32_t kv_flags;         /* LOOM_KV_HADAMARD, LOOM_KV_MERGED or 0 */

    /* Merged pairs (kv_flags & LOOM_KV_MERGED; otherwise NULL and 0): */
    const int32_t *merge_with; /* [n_layers] the other layer of each layer's pair, or -1 */
    void *const *merge_base;   /* [n_layers] the pair's merge pool, the same for both layers */
    size_t merge_block_stride; /* bytes of one block of a merge pool */
    int32_t merge_retain;      /* tokens per block a pair keeps unmerged (0 .. block_size) */
    float merge_t;             /* slerp weight of the later layer's direction, in [0, 1] */
} loom_kv_desc;

/* The other layer of layer's merged pair, or -1 (no merged pairs, or none for this layer): a
 * partner above layer makes it the pair's earlier layer, below it the later. */
static inline int32_t loom_kv_merge_partner(const loom_kv_desc *kv, int32_t layer) {
    return (kv->kv_flags & LOOM_KV_MERGED) ? kv->merge_with[layer] : -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Operations and their parameters                                                            */
/* ------------------------------------------------------------------------------------------ */

typedef enum loom_op {
    LOOM_OP_GET_ROWS,
    LOOM_OP_MATMUL,
    LOOM_OP_RMS_NORM,
    LOOM_OP_ROPE,
    LOOM_OP_KV_STORE,
    LOOM_OP_ATTENTION,
    LOOM_OP_GLU,
    LOOM_OP_ADD,
    LOOM_OP_SCALE,
    LOOM_OP_COUNT_,
} loom_op;

/* What supports() is asked: an op and the variant of it a model would run. */
typedef struct loom_op_desc {
    loom_op op;
    loom_type type; /* MATMUL, GET_ROWS: the weight type; KV_STORE, ATTENTION: the KV element
                       type; F32 for the others */
    /* KV_STORE and ATTENTION (0 elsewhere): */
    int32_t head_dim;
    int32_t n_head; /* query heads (ATTENTION) */
    int32_t n_kv_heads;
    int32_t window; /* sliding window; 0: full attention */
    float softcap;  /* logit soft-capping; 0: off */
    loom_kv_layout layout;
    loom_kv_scale_kind scale_kind;
    uint32_t kv_flags; /* KV_STORE and ATTENTION: LOOM_KV_HADAMARD, LOOM_KV_MERGED or 0 */
} loom_op_desc;

typedef enum loom_rope_mode {
    LOOM_ROPE_NORMAL = 0, /* rotates adjacent pairs (x[2i], x[2i+1]) — llama */
    LOOM_ROPE_NEOX = 1,   /* rotates halves (x[i], x[i + n_rot/2]) — qwen2, gemma3, neox */
} loom_rope_mode;

typedef struct loom_rope_params {
    loom_rope_mode mode;
    int32_t n_head;            /* heads in the row */
    int32_t head_dim;          /* elements per head */
    int32_t n_rot;             /* rotated elements per head (<= head_dim, even) */
    float theta_base;          /* frequency base (10000, 500000, ...) */
    float freq_scale;          /* linear position scaling: angle uses pos * freq_scale (1: none) */
    const float *freq_factors; /* [n_rot/2] per-frequency divisors (llama3 scaling), a prepared
                                  F32 weight (backend memory), or NULL */
} loom_rope_params;

typedef enum loom_glu_kind {
    LOOM_GLU_SWIGLU = 0,    /* silu(gate) * up */
    LOOM_GLU_GEGLU_TANH = 1 /* gelu_tanh(gate) * up */
} loom_glu_kind;

typedef struct loom_attn_params {
    int32_t n_head; /* query heads */
    int32_t layer;  /* which layer's pools (through kv->layer_src) */
    float scale;    /* applied to q·k (usually 1/sqrt(head_dim)) */
    float softcap;  /* logit soft-capping: cap * tanh(s / cap); 0: off */
} loom_attn_params;

/* Most matmuls one matmul_multi call takes. */
#define LOOM_MATMUL_MULTI_MAX 4

/* ------------------------------------------------------------------------------------------ */
/* Devices, weights, streams and steps                                                        */
/* ------------------------------------------------------------------------------------------ */

/* ops->open's parameters. A backend ignores what it has no use for. */
typedef struct loom_backend_open_params {
    int32_t device;       /* device index (the CPU backend has one: 0) */
    int32_t n_threads;    /* host threads computing per stream (CPU); <= 0: all online cores */
    bool f32_activations; /* matmuls keep activations in float32 (loom_model_params) */
    loom_numa_mode numa;  /* where a host backend places threads and weights */
    size_t weight_bytes;  /* bytes of the weights weight_prepare will be given, in all: lets a
                             backend reserve one arena */
} loom_backend_open_params;

/* How a weight is consumed, so a backend can repack it for its kernels. */
typedef enum loom_weight_use {
    LOOM_WEIGHT_MATMUL = 0,   /* the w of matmul / matmul_multi */
    LOOM_WEIGHT_GET_ROWS = 1, /* the table of get_rows */
    LOOM_WEIGHT_VECTOR = 2,   /* an F32 vector: a norm's weight, a bias, rope factors */
    LOOM_WEIGHT_TIED = 3,     /* both the table of get_rows and the w of the output matmul (a
                                 tied embedding) */
} loom_weight_use;

/* One weight handed to weight_prepare. */
typedef struct loom_weight_src {
    const char *name; /* "blk.3.attn_q.weight", for messages */
    loom_type type;
    int64_t ne[2];     /* ne[0] elements per row, ne[1] rows */
    size_t row_stride; /* bytes between rows of data */
    const void *data;  /* host memory */
    bool persistent;   /* data stays valid and unchanged until the device is closed (a mapped
                          file the caller allows to be used in place): a backend whose memory
                          is host memory may then use it without a copy */
    loom_weight_use use;
} loom_weight_src;

/* One matmul the forward pass runs, for sizing workspaces. */
typedef struct loom_matmul_shape {
    loom_type type;   /* the weight's type as prepared */
    int64_t k;        /* elements per row of w and x */
    int64_t n;        /* rows of w */
    int32_t max_rows; /* most rows of x */
} loom_matmul_shape;

/* The largest step a stream will run (stream_create, workspace_size). */
typedef struct loom_step_shape {
    int32_t max_tokens; /* rows of the step's activations */
    int32_t max_seqs;   /* sequences in one step */
    int32_t max_ctx;    /* positions one sequence may hold */
    int32_t block_size; /* positions per KV block */
    int32_t n_head;     /* query heads */
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t n_rot; /* rotated elements per head */
    loom_type kv_type;
    int32_t n_matmuls;                /* distinct matmul shapes */
    const loom_matmul_shape *matmuls; /* [n_matmuls] */
    uint32_t kv_flags;                /* the descriptors' kv_flags */
} loom_step_shape;

/* Everything a step will read through kv_store and attention (step_begin). */
typedef struct loom_step_desc {
    int32_t n_tokens;       /* rows of the step's activations */
    int32_t n_kv;           /* descriptors: one per KV group */
    const loom_kv_desc *kv; /* [n_kv], checked by libloom */
} loom_step_desc;

/* Direction of a batched copy. */
typedef enum loom_copy_kind {
    LOOM_COPY_DEVICE = 0,    /* backend memory -> backend memory */
    LOOM_COPY_TO_HOST = 1,   /* backend memory -> host memory */
    LOOM_COPY_FROM_HOST = 2, /* host memory -> backend memory */
} loom_copy_kind;

typedef struct loom_copy_range {
    const void *src;
    void *dst;
    size_t bytes;
} loom_copy_range;

/* What logits_summary reports of one row of logits x[0..V): everything the sampler chain reads
 * from a whole row (sample/chain.h), in float64. NaN counts as -inf (probability 0), as the
 * chain holds it. */
typedef struct loom_logit_summary {
    double max;        /* largest finite x_i; -inf when none */
    double sum;        /* sum of e^(x_i - max) over the finite x_i */
    double entropy;    /* H = log(sum) - E_p[x - max] of p = softmax(x), nats, >= 0 */
    double varentropy; /* E_p[(x - max)^2] - E_p[x - max]^2, nats^2, >= 0 */
    int32_t n_finite;  /* finite entries */
    int32_t argmax;    /* lowest index attaining max; -1 when none */
    int32_t n_posinf;  /* +inf entries (the chain refuses a row holding one) */
    int32_t n_top;     /* entries of the row's top list: min(n_top asked, n_finite) */
} loom_logit_summary;

/* One entry of a row's top list. */
typedef struct loom_logit_cand {
    float logit;
    int32_t id;
} loom_logit_cand;

/* Most entries a top list may be asked for. */
#define LOOM_LOGIT_SUMMARY_MAX_TOP 1024

/* The edits the sampler chain makes to a row before it samples (its steps 1 and 2: logit bias,
 * then repetition / presence / frequency penalties; sample/chain.h), which logits_summary
 * applies on the device in the chain's own float arithmetic and order: a NaN logit an edit
 * touches counts as -inf first; then each bias entry in turn, x[id] += bias; then each penalty
 * entry once (their ids are distinct): x = x > 0 ? x / repeat : x * repeat, then
 * x -= presence + count * frequency; an edit giving NaN (an overflow, inf - inf) leaves +inf,
 * which the chain refuses as it refuses the NaN. All arrays are host memory. */
typedef struct loom_logit_edits {
    const loom_logit_bias *bias; /* [n_bias]; ids may repeat (they add up in order) */
    int32_t n_bias;
    int32_t n_pen;
    const int32_t *pen_id;    /* [n_pen] distinct token ids */
    const int32_t *pen_count; /* [n_pen] each id's count in the penalty window, >= 1 */
    float repeat_penalty, presence_penalty, frequency_penalty;
} loom_logit_edits;

/* Most edits (bias entries plus penalty entries) of one row logits_summary takes. */
#define LOOM_LOGIT_SUMMARY_MAX_EDITS 1024

/* ------------------------------------------------------------------------------------------ */
/* The host's callbacks and the ops table                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct loom_backend_ops loom_backend_ops;

typedef struct loom_backend_host {
    uint32_t abi_version; /* LOOM_BACKEND_ABI_VERSION of the library */
    /* Sets the calling thread's loom_last_error() message (copied). */
    void (*set_error)(const char *message);
    /* Logs one line through the library's log sink (loom_log_set); lines below its level are
     * dropped. */
    void (*log)(loom_log_level level, const char *message);
} loom_backend_host;

typedef loom_status (*loom_backend_entry_fn)(uint32_t abi_version, const loom_backend_host *host,
                                             const loom_backend_ops **ops);

/* Every slot is required unless marked (optional); a NULL optional slot has the documented
 * fallback. Statuses: LOOM_ERR_INVALID_ARG for a caller's bad argument, LOOM_ERR_UNSUPPORTED
 * for a type or shape the backend does not run, LOOM_ERR_OUT_OF_MEMORY, LOOM_ERR_NO_DEVICE
 * (open: no usable device), LOOM_ERR_BACKEND for a failure of the device itself. */
struct loom_backend_ops {
    uint32_t abi_version; /* LOOM_BACKEND_ABI_VERSION */
    const char *name;     /* "cpu", "cuda" */

    /* ---- device ---- */
    /* Opens device p->device for one model. NO_DEVICE (with the reason in the message: no
     * driver, no such device) when it cannot. */
    loom_status (*open)(const loom_backend_open_params *p, void **dev);
    /* Frees the device and everything it owns (buffers, prepared weights). Streams are
     * destroyed first. */
    void (*close)(void *dev);
    /* Free and total bytes of the memory the device allocates from (host RAM for the CPU). */
    loom_status (*memory_info)(void *dev, size_t *free_bytes, size_t *total_bytes);
    /* Whether the device runs op as described; libloom asks before it loads a model. */
    bool (*supports)(void *dev, const loom_op_desc *op);

    loom_status (*buffer_alloc)(void *dev, size_t bytes, loom_buffer **out);
    void (*buffer_free)(void *dev, loom_buffer *buf);  /* NULL is a no-op */
    void *(*buffer_base)(void *dev, loom_buffer *buf); /* backend address of byte 0 */
    /* Host memory the device copies to and from fastest (pinned, for a GPU): swap areas,
     * staging of per-step arrays. host_free(NULL) is a no-op. */
    loom_status (*host_alloc)(void *dev, size_t bytes, void **out);
    void (*host_free)(void *dev, void *ptr);

    /* Prepares one weight: copies it to the device (or, for a persistent source in a backend
     * whose memory is host memory, uses it in place), possibly repacked or converted for the
     * backend's kernels, and writes the view the ops will receive to *out (its type may
     * differ from src->type where the backend converted it). The device owns the result until
     * close. */
    loom_status (*weight_prepare)(void *dev, const loom_weight_src *src, loom_tensor *out);

    /* ---- streams ---- */
    /* (optional) Bytes of workspace a stream needs for steps up to shape (what stream_create
     * will allocate beyond its fixed state); NULL: none worth counting. */
    loom_status (*workspace_size)(void *dev, const loom_step_shape *shape, size_t *bytes);
    /* Creates an execution context able to run steps up to shape (allocating its workspace
     * now, so that no step allocates). */
    loom_status (*stream_create)(void *dev, const loom_step_shape *shape, void **stream);
    void (*stream_destroy)(void *stream); /* NULL is a no-op */

    /* ---- on a stream ---- */
    /* host -> backend: bytes at dst (backend address) from src (host). */
    loom_status (*tensor_set)(void *stream, void *dst, const void *src, size_t bytes);
    /* backend -> host; waits for queued work first. */
    loom_status (*tensor_get)(void *stream, void *dst, const void *src, size_t bytes);
    /* Copies n ranges in one call (copy-on-write of KV blocks, swapping them out and in): each
     * from src to dst, the kind saying which side is host memory. No range's destination
     * overlaps another range's source or destination. Queued like an op. */
    loom_status (*copy_batch)(void *stream, loom_copy_kind kind, const loom_copy_range *ranges,
                              size_t n);
    loom_status (*synchronize)(void *stream);
    /* (optional) The step's descriptors, before its first op (see STEPS above); they stay
     * valid until the step's last op has been queued. NULL: nothing to do. */
    loom_status (*step_begin)(void *stream, const loom_step_desc *step);

    /* ---- operations (all outputs F32 unless said otherwise) ---- */
    /* out[i, :] = dequant(table[ids[i], :]); ids I32 [n] with ne[0] = n, out [n, D]. */
    loom_status (*get_rows)(void *stream, const loom_tensor *table, const loom_tensor *ids,
                            loom_tensor *out);
    /* out[t, o] = sum_k x[t, k] * w[o, k]; w [N, K] any supported type, x [T, K], out [T, N].
     * The sum for one output element is computed in an order that does not depend on T. */
    loom_status (*matmul)(void *stream, const loom_tensor *w, const loom_tensor *x,
                          loom_tensor *out);
    /* (optional) outs[i] = x·ws[i]ᵀ for i < n, 1 <= n <= LOOM_MATMUL_MULTI_MAX: several
     * matmuls of one activation (q, k and v; gate and up) in one op, so a backend can prepare
     * x once and run them as one parallel pass. Each outs[i] has the bits matmul(ws[i], x,
     * outs[i]) would give; the outs must not overlap x, any w or each other. NULL: libloom
     * makes the n matmul calls. */
    loom_status (*matmul_multi)(void *stream, int n, const loom_tensor *const *ws,
                                const loom_tensor *x, loom_tensor *const *outs);
    /* out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * (w ? w[:] : 1); w F32 [D] (ne[1]=1).
     * out may alias x. */
    loom_status (*rms_norm)(void *stream, const loom_tensor *x, const loom_tensor *w, float eps,
                            loom_tensor *out);
    /* In place on x [T, n_head*head_dim]; pos I32 [T] positions. */
    loom_status (*rope)(void *stream, loom_tensor *x, const loom_tensor *pos,
                        const loom_rope_params *p);
    /* Writes k, v [T, n_kv_heads*head_dim] (rows in the order kv describes) into layer's pools
     * at each row's position, converting to kv->kv_type. kv is one of the step's descriptors. */
    loom_status (*kv_store)(void *stream, const loom_tensor *k, const loom_tensor *v,
                            const loom_kv_desc *kv, int32_t layer);
    /* out [T, n_head*head_dim] = softmax(scale * q k^T (+ causal/window mask)) v, per head,
     * with GQA (query head h reads kv head h / (n_head / n_kv_heads)), over the pools of
     * kv->layer_src[p->layer]. kv is one of the step's descriptors. */
    loom_status (*attention)(void *stream, const loom_tensor *q, const loom_kv_desc *kv,
                             const loom_attn_params *p, loom_tensor *out);
    /* out = act(gate) * up, elementwise, [T, F]. out may alias gate. */
    loom_status (*glu)(void *stream, const loom_tensor *gate, const loom_tensor *up,
                       loom_glu_kind kind, loom_tensor *out);
    /* out = a + b; b has a's shape, or one row (broadcast over a's rows). out may alias a. */
    loom_status (*add)(void *stream, const loom_tensor *a, const loom_tensor *b, loom_tensor *out);
    /* out = x * s. out may alias x. */
    loom_status (*scale)(void *stream, const loom_tensor *x, float s, loom_tensor *out);

    /* (optional) The residual add and the next norm in one op: x = x + y (y of x's shape), then
     * out = rms_norm(x, w, eps) as rms_norm computes it; x holds the sum afterwards. out must
     * not overlap x or y. A device backend saves a pass over the activations per layer and
     * norm. NULL: libloom calls add(x, y, x), then rms_norm(x, w, eps, out). */
    loom_status (*add_rms_norm)(void *stream, loom_tensor *x, const loom_tensor *y,
                                const loom_tensor *w, float eps, loom_tensor *out);

    /* (optional) A layer's attention inputs finished in one op: q and k each RMS-normed per
     * head where q_norm / k_norm is given (F32 [head_dim], as rms_norm over rows of head_dim
     * computes it; NULL: not normed), then rotated in place (rope with p; p->n_head is q's,
     * k's heads are kv->n_kv_heads), then k and v written into layer's pools (kv_store).
     * q [T, p->n_head*head_dim], k and v [T, n_kv_heads*head_dim], pos as rope's. Each output
     * has the bits the separate calls give. Statuses as those calls', and INVALID_ARG where q,
     * k and v overlap each other, or q or k the norms' weights or pos. NULL: libloom calls
     * rms_norm on q's and k's heads, rope on q and on k, then kv_store — five ops a layer,
     * which a device backend runs as five launches. */
    loom_status (*norm_rope_store)(void *stream, loom_tensor *q, loom_tensor *k,
                                   const loom_tensor *v, const loom_tensor *q_norm,
                                   const loom_tensor *k_norm, float eps, const loom_tensor *pos,
                                   const loom_rope_params *p, const loom_kv_desc *kv,
                                   int32_t layer);

    /* (optional) add_rms_norm with y normed first (Gemma's post-attention and post-FFN norms):
     * x = x + rms_norm(y, w_y, eps), then out = rms_norm(x, w, eps); x holds the sum afterwards,
     * y either its input or its norm (the caller's scratch). Each value has the bits of
     * rms_norm(y, w_y, eps, y) then add_rms_norm(x, y, w, eps, out). out must not overlap x or
     * y, x not y, and the weights none of x, y and out (INVALID_ARG). NULL: libloom makes those
     * two calls. */
    loom_status (*norm_add_rms_norm)(void *stream, loom_tensor *x, const loom_tensor *y,
                                     const loom_tensor *w_y, const loom_tensor *w, float eps,
                                     loom_tensor *out);

    /* (optional) Summaries of rows of logits, so that sampling does not copy them to the host
     * (a row of Gemma 3's 262,144-token vocabulary is 1 MiB; a summary with 256 candidates,
     * 2 KiB): for each row r of logits (F32 [n_rows, V]), sum[r] as loom_logit_summary says,
     * and top[r * n_top ...] the row's sum[r].n_top best finite entries, best first (larger
     * logit first; equal logits, lower id first), 1 <= n_top <= LOOM_LOGIT_SUMMARY_MAX_TOP.
     * edits (NULL: none) holds one entry per row; a row with bias or penalty entries (at most
     * LOOM_LOGIT_SUMMARY_MAX_EDITS together) is summarized twice: raw_sum[r] and
     * raw_top[r * n_top ...] describe it as it came, sum[r] and top[...] after its edits, and
     * edit_raw[r * LOOM_LOGIT_SUMMARY_MAX_EDITS + j] is the raw value (NaN as -inf) of its j-th
     * edit's token (bias entries, then penalty entries); the row's logits are edited in place.
     * Entries of raw_sum, raw_top and edit_raw that belong to no edited row's report hold
     * nothing of use (all three may be NULL when no row has edits). Every output is host memory;
     * like tensor_get, the call waits for queued work and returns once they are written. The
     * floating-point sums may differ from the host's in the last bits (their order is the
     * backend's); max, the counts, the edited values and the top lists are exact. NULL: libloom
     * copies whole rows (a backend whose buffers are host memory gains nothing). */
    loom_status (*logits_summary)(void *stream, const loom_tensor *logits, int32_t n_top,
                                  const loom_logit_edits *edits, loom_logit_summary *sum,
                                  loom_logit_cand *top, loom_logit_summary *raw_sum,
                                  loom_logit_cand *raw_top, float *edit_raw);
};

#ifdef __cplusplus
}
#endif
