/* kv_desc.h — the one check of a paged-KV descriptor (loom_backend.h), run by whoever builds
 * the descriptors of a step, once per step, before the backend sees them. Backends trust what
 * passed it, so every offset and block id they will follow is checked here and nowhere else. */
#pragma once

#include "loom_backend.h"

/* Bytes of one element of a KV pool of type t; 0 for a type no pool stores. */
size_t loom__kv_elt_bytes(loom_type t);

/* Checks kv for a step of n_rows rows: arrays present and consistent (indptr, q_start
 * monotone from 0, q_start[n_seqs] = n_rows, kv_len[s] = pos_start[s] + the sequence's new
 * rows), sizes positive, a known element type, layout and scale kind, strides that hold a slot
 * and a block, pool sizes that do not overflow, layer_src mapping every layer to a source
 * layer (one that reads its own pools) whose pools (and scales) are set and aligned, block
 * tables long enough for every new row, and every table entry a step reads or writes — from
 * the window of a sequence's first new row to its last — a block id in [0, n_blocks).
 * Errors: INVALID_ARG (structure: a caller's bug), UNSUPPORTED (an unknown type, layout or
 * scale kind), BAD_INPUT (positions and block ids); the message names the field, sequence and
 * entry. */
loom_status loom__kv_desc_check(const loom_kv_desc *kv, int64_t n_rows);
