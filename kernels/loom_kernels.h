/* loom_kernels.h — the launcher interface of loom's CUDA kernels: one parameter struct and one
 * extern "C" entry per kernel family, called by the CUDA backend's host code
 * (src/backend/cuda/). Plain C, so the host code compiles with the C compiler; every pointer
 * in a parameter struct is a device address unless its comment says otherwise, and every
 * stride is in bytes.
 *
 * Each entry queues its kernels on `stream` and returns LOOM_OK, or LOOM_ERR_BACKEND (launch
 * failure, with the CUDA error in the calling thread's message) / LOOM_ERR_UNSUPPORTED (a
 * type or size the kernels were not built for). Arguments are validated by the host code
 * before they get here; the entries check only what decides which kernel runs. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Types the kernels read (loom_type values, loom_backend.h). */
#define LOOM_K_F32  0
#define LOOM_K_F16  1
#define LOOM_K_Q4_0 2
#define LOOM_K_Q5_0 6
#define LOOM_K_Q8_0 8
#define LOOM_K_Q4_K 12
#define LOOM_K_Q5_K 13
#define LOOM_K_Q6_K 14
#define LOOM_K_BF16 30
/* FP8 E4M3 weight rows (LOOM_TYPE_FP8_E4M3_ROWS): K codes, zero padding to 4 bytes, the row's
 * float32 scale */
#define LOOM_K_FP8_ROWS 0x102
/* KV pages only: one byte per element, one float32 scale per (position, KV head) */
#define LOOM_K_FP8_E4M3 0x100
#define LOOM_K_FP8_E5M2 0x101

/* LOOM_OK where this binary holds code the current device runs; else BACKEND, naming the
 * architectures it was built for. */
loom_status loom__cuda_kernels_probe(void);

/* Whether the matmul and get_rows kernels read weights of this type in place. */
int loom__cuda_weight_type_native(uint32_t type);

/* ---- elementwise (elementwise.cu) --------------------------------------------------------- */

typedef struct loom__k_rows {
    int64_t n_rows, n_cols;
    size_t x_stride, y_stride, out_stride; /* y: the second operand (add, glu), where there is
                                              one; y_stride 0 broadcasts its row 0 (add) */
} loom__k_rows;

/* out = x / sqrt(mean(x^2) + eps) * (w ? w : 1), per row; w [n_cols] F32 or NULL. */
loom_status loom__cuda_rms_norm(cudaStream_t stream, const loom__k_rows *shape, const float *x,
                                const float *w, float eps, float *out);
/* x = x + y, then out = rms_norm(x) * (w ? w : 1): the bits of loom__cuda_add then
 * loom__cuda_rms_norm, in one pass. */
loom_status loom__cuda_add_rms_norm(cudaStream_t stream, const loom__k_rows *shape, float *x,
                                    const float *y, const float *w, float eps, float *out);
/* x = x + rms_norm(y) * wy (y is only read), then out = rms_norm(x) * (w ? w : 1): the bits of
 * loom__cuda_rms_norm of y, then loom__cuda_add_rms_norm, in one pass (Gemma's post-norms). */
loom_status loom__cuda_norm_add_rms_norm(cudaStream_t stream, const loom__k_rows *shape, float *x,
                                         const float *y, const float *wy, const float *w, float eps,
                                         float *out);
/* out = x + y. */
loom_status loom__cuda_add(cudaStream_t stream, const loom__k_rows *shape, const float *x,
                           const float *y, float *out);
/* out = x * s. */
loom_status loom__cuda_scale(cudaStream_t stream, const loom__k_rows *shape, const float *x,
                             float s, float *out);
/* out = act(x) * y; kind 0: silu, 1: gelu (tanh approximation). */
loom_status loom__cuda_glu(cudaStream_t stream, const loom__k_rows *shape, const float *x,
                           const float *y, int kind, float *out);

/* ---- rope (rope.cu) ----------------------------------------------------------------------- */

typedef struct loom__k_rope {
    int64_t n_rows;
    size_t x_stride;
    int32_t n_head, head_dim, n_rot;
    int32_t neox; /* 1: rotate halves (NeoX), 0: adjacent pairs */
    float theta_base, freq_scale;
    const float *freq_factors; /* [n_rot/2] or NULL */
    const int32_t *pos;        /* [n_rows] */
} loom__k_rope;

loom_status loom__cuda_rope(cudaStream_t stream, const loom__k_rope *p, float *x);

/* ---- weights: get_rows and matmul (get_rows.cu, gemv.cu) ----------------------------------- */

typedef struct loom__k_weight {
    uint32_t type; /* LOOM_K_* */
    int64_t k;     /* elements per row */
    int64_t n;     /* rows */
    size_t stride; /* bytes between rows */
    const void *data;
} loom__k_weight;

/* out[i, :] = dequant(w[ids[i], :]) for i < n_ids. The ids live in device memory, out of the
 * host's sight: an id outside [0, w->n) gives a row of NaN, never a read out of bounds. */
loom_status loom__cuda_get_rows(cudaStream_t stream, const loom__k_weight *w, const int32_t *ids,
                                int64_t n_ids, float *out, size_t out_stride);

/* The products' operands in the tensor-core kernels (LOOM_CUDA_MATH, read when the device
 * opens). LOOM_K_MATH_F32, the default: float32 accuracy — float32 operands split into two TF32
 * parts (mma.cuh), as the CPU backend's float32 arithmetic. LOOM_K_MATH_BF16: each operand
 * rounded once to a 16-bit type and one m16n8k16 per product tile, what the BF16 peers (cuBLAS,
 * flash attention) do: the GEMM's weights and activations to BF16; attention's to F16 where the
 * pages hold F16 (K and V keep their bits, Q and P round to F16's 11 bits) and to BF16 where
 * they hold BF16, F32 or FP8 (FP8 codes keep theirs; the scales stay outside the products).
 * The sums stay float32, in the same fixed order as the default's, so either setting is
 * batch-invariant; the two differ by the operands' rounding (BF16: up to 2^-8 of each
 * operand, F16 2^-11). The fast mode's GEMV and split-KV kernels stay float32 either way. */
#define LOOM_K_MATH_F32  0
#define LOOM_K_MATH_BF16 1
/* LOOM_CUDA_WGMMA=1 on an sm_90 device in BF16 math: the BF16 math's operands on Hopper's
 * warpgroup MMA (wgmma.cuh) — the GEMM (gemm.cu's gemm_wg_kernel: tiles of 128 rows by 128
 * tokens) and the tiled attention of head sizes 64 and 128 (attention_prefill.cu's wgmma
 * forms; other head sizes as LOOM_K_MATH_BF16) — the same segments and folds, their own bits
 * (batch-invariant within themselves, not the mma.sync kernels' bits). Needs sm_90a device
 * code: loom__cuda_wgmma_probe says whether the device runs it. */
#define LOOM_K_MATH_BF16_WGMMA 2

/* The driver's cuTensorMapEncodeTiled (CUDA 12.0's signature, its enums as int), which the CUDA
 * backend finds through the runtime (cudaGetDriverEntryPointByVersion): 0 on success. */
typedef int (*loom__k_tmap_encode_fn)(void *map, int dtype, uint32_t rank, void *addr,
                                      const uint64_t *dims, const uint64_t *strides,
                                      const uint32_t *box, const uint32_t *elem_strides,
                                      int interleave, int swizzle, int l2_promotion, int oob_fill);

/* The scratch a matmul may split its sums into (device memory), and the device's SM count that
 * sizes the split. */
typedef struct loom__k_gemm_work {
    void *data;
    size_t bytes;
    int n_sms; /* 0: never split */
    /* LOOM_K_MATH_BF16_WGMMA: x rounded to BF16 once per launch, loom__cuda_gemm_x16_bytes */
    void *x16;
    size_t x16_bytes;
    /* 1: the wgmma GEMM never warp-specialised (LOOM_CUDA_GEMM_WS=0, for the bench's
     * comparison); 0 (the default): BF16 weights with 16-byte-aligned rows run warp-specialised,
     * a producer warpgroup copying the tiles into a ring of stages (the same bits) */
    int32_t gemm_plain;
    /* the warp-specialised GEMM's producer: tensor-map copies (TMA) through this encoder; NULL
     * (LOOM_CUDA_GEMM_TMA=0, or a driver without it): cp.async copies (the same bits) */
    loom__k_tmap_encode_fn tmap_encode;
} loom__k_gemm_work;

/* The fast mode (LOOM_CUDA_BATCH_INVARIANT=0) runs steps of up to this many tokens on the GEMV,
 * more on the GEMM. A token's bits are the same in every step of either regime, but the two sum
 * in different orders. */
#define LOOM_K_GEMV_MAX_TOKENS 8

/* The GEMV for any number of tokens (groups of 8, each re-reading the weights). */
loom_status loom__cuda_gemv(cudaStream_t stream, const loom__k_weight *w, const float *x,
                            size_t x_stride, int64_t n_tokens, float *out, size_t out_stride);
/* Most weights one loom__cuda_gemm_multi launch takes (loom_backend.h's LOOM_MATMUL_MULTI_MAX). */
#define LOOM_K_GEMM_MULTI 4
/* outs[j] = x·ws[j]ᵀ for j < n (1..LOOM_K_GEMM_MULTI weights of one type and width) on tensor
 * cores (gemm.cu, mma.sync; math: LOOM_K_MATH_F32, float32 accuracy through split TF32, or
 * LOOM_K_MATH_BF16, operands rounded to BF16; LOOM_K_MATH_BF16_WGMMA, the latter on wgmma), in
 * one order of additions for every n_tokens — the CUDA backend's default, batch-invariant
 * matmul: tiles of 64 rows by 64 tokens (128 by 128 on wgmma); each output summed in segments of K
 * (256 values; K/16 past 4,096), folded left to right. One launch (and one fold, splitting) for all
 * n; each outs[j] gets the bits it would alone. Small grids split K across blocks into work
 * (loom__cuda_gemm_multi_work_bytes; NULL or n_sms 0: never split), which changes no bits. */
loom_status loom__cuda_gemm_multi(cudaStream_t stream, int n, const loom__k_weight *const *ws,
                                  const float *x, size_t x_stride, int64_t n_tokens,
                                  float *const *outs, const size_t *out_strides,
                                  const loom__k_gemm_work *work, int math);
/* Its scratch for these shapes (0: it does not split, or the shapes are not one launch's). */
size_t loom__cuda_gemm_multi_work_bytes(int n, const loom__k_weight *const *ws, int64_t n_tokens,
                                        int n_sms, int math);
/* The most loom__cuda_gemm_multi takes for one weight in any step of 1..max_tokens tokens (w's
 * data unused); a launch of up to LOOM_K_GEMM_MULTI weights of one type and width takes
 * at most the sum of theirs (it splits only where each alone would, with their segments). */
size_t loom__cuda_gemm_work_bound(const loom__k_weight *w, int64_t max_tokens, int n_sms, int math);
/* 1 where the current device runs gemm.cu's wgmma kernel (sm_90a code, built and loadable), 0
 * where it does not; a launch error is a status. */
loom_status loom__cuda_wgmma_probe(int *runs);
/* The most scratch any split takes (a split needing more does not happen). */
size_t loom__cuda_gemm_work_bound_cap(void);
/* The wgmma GEMM's x in BF16 for a step of n_tokens rows of k values (0 for the other maths). */
size_t loom__cuda_gemm_x16_bytes(int64_t n_tokens, int64_t k, int math);

/* cuBLASLt's GEMMs of the fast mode (blaslt_gemm.cu). FP8 weight rows: each token row of x
 * [n_tokens, k] to E4M3 codes xq (rows xq_stride bytes apart) with scale[t] = max|x_t| / 448
 * (a zero row: scale 0, zero codes); and out[t][n] *= (row n's scale) * token_scale[t]. */
loom_status loom__cuda_fp8_quantize_acts(cudaStream_t stream, const float *x, size_t x_stride,
                                         int64_t n_tokens, int64_t k, uint8_t *xq, size_t xq_stride,
                                         float *scale);
loom_status loom__cuda_fp8_scale_out(cudaStream_t stream, const loom__k_weight *w, float *out,
                                     size_t out_stride, int64_t n_tokens, const float *token_scale);
/* BF16 weights in BF16 math: each token row of x [n_tokens, k] rounded to BF16 into xb (rows
 * xb_stride bytes apart; n_tokens <= 65535). */
loom_status loom__cuda_acts_to_bf16(cudaStream_t stream, const float *x, size_t x_stride,
                                    int64_t n_tokens, int64_t k, uint16_t *xb, size_t xb_stride);

/* ---- the paged KV cache (kv_store.cu, attention.cu) ---------------------------------------- */

/* One KV group's step descriptor in device memory (uploaded by step_begin). */
typedef struct loom__k_kv {
    const int32_t *indptr;    /* [n_seqs + 1] */
    const int32_t *block_ids; /* [indptr[n_seqs]] */
    const int32_t *q_start;   /* [n_seqs + 1] */
    const int32_t *pos_start; /* [n_seqs] */
    const int32_t *row_seq;   /* [n_rows] the sequence of each row of the step */
    int32_t n_seqs, n_rows;
    int32_t block_size, n_kv_heads, head_dim, window;
    uint32_t kv_type; /* LOOM_K_F32, LOOM_K_F16, LOOM_K_BF16, LOOM_K_FP8_E4M3 or _E5M2 */
    size_t token_stride, block_stride;
    /* FP8: where a (position, head)'s scale lies from a layer's scale base: block * block
     * stride + slot * token stride + head * 4 (loom_kv_desc's scale fields) */
    size_t scale_token_stride, scale_block_stride;
    /* Attention's two kernels in the fast mode (loom__k_attn.invariant 0): a sequence with at
     * least LOOM_K_ATTN_PREFILL_ROWS new rows in the step is a prefill sequence (the tiled
     * kernel, where the layer allows it), the rows of the others go to the split-KV kernel. A
     * rule on each sequence's own rows in the step (the other sequences never change a
     * sequence's kernel, but the scheduler's cut of its rows into steps can). Zero counts:
     * every row split-KV. The invariant default takes every sequence on one kernel. */
    const int32_t *prefill_seqs; /* [n_prefill_seqs] increasing */
    const int32_t *split_rows;   /* [n_split_rows] increasing: the other sequences' rows */
    int32_t n_prefill_seqs, n_split_rows;
    int32_t prefill_max_rows; /* the most new rows of a prefill sequence */
    int32_t max_rows;         /* the most new rows of any sequence */
    int32_t max_kv_len;       /* the most positions any sequence holds after the step */
} loom__k_kv;

/* Writes rows of k and v [n_rows, n_kv_heads*head_dim] into the pools at their positions.
 * FP8 pages: each (row, head) is scaled by s = max|x| / 448 (E4M3) or / 57344 (E5M2), the
 * codes rounded to nearest even, s stored at k_scale / v_scale (the layer's scale bases;
 * NULL for other types) — bit for bit what the CPU backend stores. */
loom_status loom__cuda_kv_store(cudaStream_t stream, const loom__k_kv *kv, const float *k,
                                size_t k_stride, const float *v, size_t v_stride, void *k_pool,
                                void *v_pool, void *k_scale, void *v_scale);

/* The attention's inputs finished in one launch (norm_rope_store.cu): for each row, q's heads
 * and k's heads each RMS-normed where q_norm / k_norm is given (F32 [head_dim]: Gemma 3, Qwen 3;
 * NULL: not normed), then rotated (rope: its n_head is q's; k has n_kv_heads), in place; then,
 * where kv is given, k's and v's rows written into the pools as loom__cuda_kv_store writes
 * them (F32, F16 or BF16 pages; FP8 and merged pairs take kv_store after this). Each value has
 * the bits of rms_norm, rope and kv_store run one after another. Needs n_head a multiple of
 * n_kv_heads, n_kv_heads <= 65535 and n_rot <= 2 * LOOM_K_QK_MAX_FREQS. */
#define LOOM_K_QK_MAX_FREQS 256
typedef struct loom__k_qk {
    loom__k_rope rope; /* n_rows, n_head (q's), head_dim, n_rot, angles, pos */
    int32_t n_kv_heads;
    float *q, *k;
    size_t q_stride, k_stride;
    const float *v;
    size_t v_stride;
    const float *q_norm, *k_norm; /* [head_dim] or NULL */
    float eps;
} loom__k_qk;

loom_status loom__cuda_norm_rope_store(cudaStream_t stream, const loom__k_qk *a,
                                       const loom__k_kv *kv, void *k_pool, void *v_pool);

/* A layer of a merged pair (loom_backend.h, LOOM_KV_MERGED): the pair's merge pool and its
 * block layout (offsets from the host's loom_kv_merge_*_at). base NULL: the layer is in no
 * pair. */
typedef struct loom__k_merge {
    char *base;
    size_t block_stride;
    size_t dist_at, state_at, rows_at;
    int32_t retain; /* retained rows per block */
    float t;        /* slerp weight of the later layer's direction */
    int32_t later;  /* 1: the pair's later layer; 0: the earlier (its pages are the pair's) */
} loom__k_merge;

/* kv_store for a layer of a merged pair, over F32, F16 or BF16 pages (the pair's: k_pool and
 * v_pool are the earlier layer's): the earlier layer stores directions and norms; the later
 * layer its norms, and merges its block's tokens as cpu_kv_merge.c does. */
loom_status loom__cuda_kv_store_merged(cudaStream_t stream, const loom__k_kv *kv, const float *k,
                                       size_t k_stride, const float *v, size_t v_stride,
                                       void *k_pool, void *v_pool, const loom__k_merge *m);

/* Most splits of one row's attention (split-KV); the workspace holds them. */
#define LOOM_K_ATTN_MAX_SPLITS 16
/* Positions per split at the least: a row attends to ceil(len / 256) splits, at most
 * LOOM_K_ATTN_MAX_SPLITS, so its splits depend on its own length only. */
#define LOOM_K_ATTN_SPLIT_MIN 256
/* Rows one launch pair (splits, merge) covers: the workspace is sized for this many. */
#define LOOM_K_ATTN_ROWS 64
/* New rows of a sequence in one step from which its attention runs on the tiled prefill kernel
 * (attention_prefill.cu): a whole m16 block of the mma's rows. Decode and short verification
 * chunks stay on split-KV, which also spreads one row's long context over many blocks. */
#define LOOM_K_ATTN_PREFILL_ROWS 16

typedef struct loom__k_attn {
    const float *q;
    size_t q_stride;
    float *out;
    size_t out_stride;
    const void *k_pool, *v_pool;
    const void *k_scale, *v_scale; /* FP8 pages: the layer's scale bases; NULL otherwise */
    int32_t n_head;
    float scale, softcap;
    float *work; /* loom__cuda_attention_work_bytes(n_head, head_dim) bytes */
    /* A layer of a merged pair: its rows are directions, read times the layer's norms (the
     * later layer's retained row where its token kept one); merge.base NULL otherwise. */
    loom__k_merge merge;
    /* 1 (the batch-invariant default): every row on the tiled kernel where the layer runs on
     * it (loom__cuda_attention_tiled_ok), else every row on split-KV — a rule on the layer and
     * the device, so a row's kernel never depends on how its sequence was cut into steps; long
     * contexts of small steps split at fixed positions into tiled_work. 0 (the fast mode):
     * prefill sequences on the tiled kernel, the other rows on split-KV. */
    int32_t invariant;
    int32_t n_sms;      /* the device's SMs (sizes the split; 0: never split) */
    int32_t smem_optin; /* the most shared memory a block may opt in to */
    float *tiled_work;  /* loom__cuda_attention_tiled_work_bytes */
    size_t tiled_work_bytes;
    int32_t math; /* the tiled kernel's operands: LOOM_K_MATH_F32, _BF16 or _BF16_WGMMA */
    /* 1: the wgmma forms read every page through registers, one tile at a time
     * (LOOM_CUDA_ATTN_ASYNC=0, for the bench's comparison); 0 (the default): over 16-bit pages
     * of the products' type they run warp-specialised, a producer warpgroup copying the tiles
     * by cp.async into a ring of stages for two consumer warpgroups (the same bits) */
    int32_t tile_regs;
} loom__k_attn;

size_t loom__cuda_attention_work_bytes(int32_t n_head, int32_t head_dim);
/* Whether the kernels run this head shape (head_dim <= 256; the query heads of one KV head
 * within the registers one warp holds: at most 16, 8 for head_dim > 128). */
int loom__cuda_attention_shape_ok(int32_t n_head, int32_t n_kv_heads, int32_t head_dim);
/* out = softmax(scale * q k^T, causal and window masked, soft-capped) v over the pools: the
 * tiled kernel's rows (loom__cuda_attention_prefill) there, the others (or all, where the
 * layer is not one it runs) on split-KV. */
loom_status loom__cuda_attention(cudaStream_t stream, const loom__k_kv *kv, const loom__k_attn *p);
/* Whether the tiled kernel runs the layer: not a merged pair, head_dim a multiple of 8 up to
 * 256, page strides aligned to 4 elements, FP8 with scales, the shared memory within
 * p->smem_optin. */
int loom__cuda_attention_tiled_ok(const loom__k_kv *kv, const loom__k_attn *p);
/* The scratch the invariant mode's tiled attention splits this step's long contexts into (0:
 * it does not split; p->invariant, n_sms, smem_optin and the layer's fields read). */
size_t loom__cuda_attention_tiled_work_bytes(const loom__k_kv *kv, const loom__k_attn *p);
/* The most it takes for any step within these bounds (stream_create reserves it once). */
size_t loom__cuda_attention_tiled_work_bound(int32_t n_head, int32_t n_kv_heads, int32_t head_dim,
                                             int32_t max_tokens, int32_t max_ctx, int n_sms);
/* The rows of the tiled tensor-core kernel (attention_prefill.cu): every sequence's in the
 * invariant mode, the prefill sequences' (kv->prefill_seqs) in the fast mode; *ran = 0
 * (nothing queued, LOOM_OK) where the layer is not one it runs (loom__cuda_attention_tiled_ok).
 * Called by loom__cuda_attention. */
loom_status loom__cuda_attention_prefill(cudaStream_t stream, const loom__k_kv *kv,
                                         const loom__k_attn *p, int *ran);

/* ---- sampling (logits_summary.cu) ---------------------------------------------------------- */

/* Device bytes loom__cuda_logits_summary writes for n_rows rows: the summaries
 * (loom_logit_summary, loom_backend.h), then each row's n_top candidates. */
size_t loom__cuda_logits_summary_bytes(int64_t n_rows, int32_t n_top);
/* The summaries of rows x[r] (n_vocab floats, x_stride bytes apart) into out (device memory,
 * loom__cuda_logits_summary_bytes): loom_backend.h's logits_summary, on the device. */
loom_status loom__cuda_logits_summary(cudaStream_t stream, const float *x, size_t x_stride,
                                      int64_t n_rows, int32_t n_vocab, int32_t n_top, void *out);

/* One edit of a row (loom_logit_edits, flattened): count 0, x[id] += bias; else the penalty of
 * a token seen count times. */
typedef struct loom__k_logit_edit {
    int32_t id;
    int32_t count;
    float bias;
} loom__k_logit_edit;

/* Applies rows' edits in place: row r's entries ent[row_off[r] .. row_off[r + 1]) in order,
 * its penalty parameters pen[3r .. 3r + 2] (repeat, presence, frequency); edit_raw[r *
 * LOOM_LOGIT_SUMMARY_MAX_EDITS + j] receives entry j's raw value (NaN as -inf). Device
 * memory; ids checked by the host. */
loom_status loom__cuda_logits_edit(cudaStream_t stream, float *x, size_t x_stride, int64_t n_rows,
                                   const int32_t *row_off, const loom__k_logit_edit *ent,
                                   const float *pen, float *edit_raw);

#ifdef __cplusplus
}
#endif
