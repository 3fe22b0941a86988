/* tensor_check.h — argument checks of tensor views shared by every backend's ops (the CPU
 * backend's and the CUDA plugin's): each names the op and the argument in its message and
 * looks only at a view's fields and addresses, never at the data behind them. */
#pragma once

#include <stdbool.h>

#include "loom_backend.h"

/* t is non-NULL, of F32 type, ne[0] >= 1, ne[1] >= 0, rows float-aligned and not overlapping
 * (row_stride >= ne[0] * 4), data non-NULL when there is any row. */
loom_status loom__check_f32(const char *op, const char *name, const loom_tensor *t);

/* A table whose rows are of a dequantizable type: ne[0] a whole number of blocks, rows at
 * least one encoded row apart. backend names the backend in the message ("cpu"). */
loom_status loom__check_weight(const char *backend, const char *op, const char *name,
                               const loom_tensor *t);

/* a and b have the same ne[0] and ne[1]. */
loom_status loom__check_same_shape(const char *op, const char *name_a, const loom_tensor *a,
                                   const char *name_b, const loom_tensor *b);

/* The byte ranges the two tensors span intersect (used to reject in-place use where an op
 * reads inputs after writing outputs). */
bool loom__tensors_overlap(const loom_tensor *a, const loom_tensor *b);
