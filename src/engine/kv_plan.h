/* kv_plan.h — cross-layer KV reuse chosen per engine (or session): the layer map that says which
 * layer's K/V pools each layer reads, from the model's declared sharing and an optional plan
 * file, checked against the model before any memory is sized by it.
 *
 * A plan file is text, one directive per line, '#' starting a comment:
 *
 *     loom-kv-plan 1          the format and its version (the first directive, required)
 *     layers 18               optional: the number of layers the plan was made for
 *     share 5 4               layer 5 reads layer 4's K/V and stores none of its own
 *     merge 13 12             layers 12 and 13 keep one merged K/V (loom_backend.h, merged pairs)
 *     merge-retain 0.1        fraction of each block's tokens a pair keeps unmerged (0 .. 1)
 *     merge-t 0.6             slerp weight of the later layer's direction (0 .. 1)
 *
 * A layer may share with any earlier layer of the same attention window that keeps its own
 * K/V (no chains: the source reads itself), and a layer that is a source cannot share. A merged
 * pair is a layer and an earlier one of the same window, neither sharing nor shared, neither in
 * another pair. Errors name the file and the line. */
#pragma once

#include "model/model.h"

/* Longest line of a plan file, in bytes. */
#define LOOM_KV_PLAN_MAX_LINE 1024

/* Defaults of a plan's merge-retain and merge-t (MiniCache's interpolation weight). */
#define LOOM_KV_MERGE_RETAIN_DEFAULT 0.1f
#define LOOM_KV_MERGE_T_DEFAULT      0.6f

/* A plan's merged pairs. */
typedef struct loom__kv_merge {
    int32_t *with;   /* [n_layer], the caller's: the other layer of each layer's pair, or -1 */
    int32_t n_pairs; /* pairs in with */
    float retain;    /* fraction of each block's tokens a pair keeps unmerged, in [0, 1] */
    float t;         /* slerp weight of the later layer's direction, in [0, 1] */
} loom__kv_merge;

/* Fills layer_src[n_layer] with the model's own map (each layer's kv_src: declared sharing, or
 * itself) and merge with no pairs and the defaults, then applies the plan at path when path is
 * non-NULL and non-empty. A merged pair (a, b), a < b, is layer_src[b] = a, merge->with[a] = b
 * and merge->with[b] = a. The map is checked whole. Errors: IO (the file cannot be read),
 * INVALID_ARG (a malformed line, a layer the model lacks, a layer paired with itself or a later
 * layer, a chain, layers of different windows, a layer named twice, a layer count that is not
 * the model's, a merge-retain or merge-t outside [0, 1]). */
loom_status loom__kv_plan_load(const loom_model *m, const char *path, int32_t *layer_src,
                               loom__kv_merge *merge);

/* The same over the plan's text (name is used in messages in place of a file name). */
loom_status loom__kv_plan_parse(const loom_model *m, const char *text, const char *name,
                                int32_t *layer_src, loom__kv_merge *merge);

/* Checks a whole map for the model: every entry a layer at or before its own, of the same KV
 * group, and reading a layer that reads itself; with merge_with (NULL: no pairs) every pair
 * two layers that name each other, the later reading the earlier, which no other layer reads.
 * Errors: INVALID_ARG naming the first bad entry. */
loom_status loom__kv_plan_check(const loom_model *m, const int32_t *layer_src,
                                const int32_t *merge_with);

/* Retained rows per block for a fraction retain of block_size tokens: ceil(retain * size). */
int32_t loom__kv_merge_rows(float retain, int32_t block_size);

/* Layers of the map that keep their own K/V. */
int32_t loom__kv_plan_sources(const loom_model *m, const int32_t *layer_src);

/* merge->with[0 .. n_layer) all -1, no pairs, the defaults. */
void loom__kv_merge_reset(loom__kv_merge *merge, int32_t n_layer);

/* Adds LOOM_KV_MERGED to *kv_flags where merge has pairs, once it is known that pages of kv_type
 * with *kv_flags can hold them (F16, BF16 or F32, not rotated); no pairs: nothing.
 * Errors: UNSUPPORTED naming what is not. */
loom_status loom__kv_merge_flags(const loom__kv_merge *merge, loom_type kv_type,
                                 uint32_t *kv_flags);
