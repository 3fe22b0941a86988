/* kv_desc.h — the paged-KV descriptor: how attention finds a batch's keys and values.
 *
 * Filled by the KV layer (src/kv), read by every backend (CPU ops, CUDA kernels). It describes
 * a ragged batch of n_seqs sequences in one step, in a CSR form:
 *
 *   sequence s owns the physical blocks block_ids[indptr[s] .. indptr[s+1]), in position order:
 *   position p of s lives in block block_ids[indptr[s] + p / block_size], slot p % block_size.
 *   Its new tokens this step are rows q_start[s] .. q_start[s+1] of the step's activations, at
 *   positions pos_start[s] .. pos_start[s] + (q_start[s+1] - q_start[s]) - 1. After the step the
 *   sequence holds kv_len[s] = pos_start[s] + n_new positions (we store kv_len rather than the
 *   last block's fill: it is what attention loops over, and the fill is kv_len % block_size).
 *
 * Storage of one layer's pool (K and V alike), row-major:
 *   [n_blocks][block_size][n_kv_heads][head_dim] elements of kv_type (F16 or F32);
 *   block b, slot t, head h starts at base + b*block_stride + t*token_stride + h*head_dim*elt.
 *
 * Attention of row i of sequence s reads positions max(0, p - window + 1) .. p, p = pos_start[s]
 * + i, in block-table order — the same order whatever else is in the batch, which is what keeps
 * a sequence's output independent of the batch it runs in.
 *
 * All arrays are host memory for the CPU backend; a device backend copies them to the device
 * (they are small) before launching. */
#pragma once

#include "tensor/types.h"

typedef struct loom_kv_desc {
    int32_t n_seqs;
    const int32_t *indptr;    /* [n_seqs + 1] offsets into block_ids */
    const int32_t *block_ids; /* [indptr[n_seqs]] physical block ids */
    const int32_t *q_start;   /* [n_seqs + 1] row offsets of each sequence's new tokens */
    const int32_t *pos_start; /* [n_seqs] position of each sequence's first new token */
    const int32_t *kv_len;    /* [n_seqs] positions held after this step */

    int32_t block_size;   /* tokens per block */
    int32_t n_blocks;     /* blocks in each layer's pool */
    int32_t n_kv_heads;   /* key/value heads */
    int32_t head_dim;     /* elements per head */
    loom_type kv_type;    /* LOOM_TYPE_F16 or LOOM_TYPE_F32 */
    size_t token_stride;  /* bytes of one slot: n_kv_heads * head_dim * elt */
    size_t block_stride;  /* bytes of one block: block_size * token_stride */

    int32_t n_layers;
    void *const *k_base;        /* [n_layers] base of each layer's K pool (backend memory) */
    void *const *v_base;        /* [n_layers] base of each layer's V pool */
    const int32_t *layer_src;   /* [n_layers] layer whose KV each layer reads; NULL: identity */
} loom_kv_desc;
