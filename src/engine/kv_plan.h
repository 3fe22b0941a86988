/* kv_plan.h — cross-layer KV reuse chosen per engine (or session): the layer map that says which
 * layer's K/V pools each layer reads, from the model's declared sharing and an optional plan
 * file, checked against the model before any memory is sized by it.
 *
 * A plan file is text, one directive per line, '#' starting a comment:
 *
 *     loom-kv-plan 1          the format and its version (the first directive, required)
 *     layers 18               optional: the number of layers the plan was made for
 *     share 5 4               layer 5 reads layer 4's K/V and stores none of its own
 *
 * A layer may share with any earlier layer of the same attention window that keeps its own
 * K/V (no chains: the source reads itself), and a layer that is a source cannot share. Errors
 * name the file and the line. */
#pragma once

#include "model/model.h"

/* Longest line of a plan file, in bytes. */
#define LOOM_KV_PLAN_MAX_LINE 1024

/* Fills layer_src[n_layer] with the model's own map (each layer's kv_src: declared sharing, or
 * itself), then applies the plan at path when path is non-NULL and non-empty. The map is
 * checked whole. Errors: IO (the file cannot be read), INVALID_ARG (a malformed line, a layer
 * the model lacks, a layer paired with itself or a later layer, a chain, layers of different
 * windows, a layer named twice, a layer count that is not the model's). */
loom_status loom__kv_plan_load(const loom_model *m, const char *path, int32_t *layer_src);

/* The same over the plan's text (name is used in messages in place of a file name). */
loom_status loom__kv_plan_parse(const loom_model *m, const char *text, const char *name,
                                int32_t *layer_src);

/* Checks a whole map for the model: every entry a layer at or before its own, of the same KV
 * group, and reading a layer that reads itself. Errors: INVALID_ARG naming the first bad
 * entry. */
loom_status loom__kv_plan_check(const loom_model *m, const int32_t *layer_src);

/* Layers of the map that keep their own K/V. */
int32_t loom__kv_plan_sources(const loom_model *m, const int32_t *layer_src);
