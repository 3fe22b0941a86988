/* session.h — what the public API's files (api/generate.c) and the test tools reach of a
 * loom_session beyond loom.h. */
#pragma once

#include "loom.h"

const loom_model *loom__session_model(const loom_session *s);

/* Positions the session's cache can hold. */
int32_t loom__session_n_ctx(const loom_session *s);

/* Sets (or, with on_layers NULL, clears) the layer hook every forward pass of the session's
 * decodes gets (loom__batch.on_layers: called after every `every` layers). For loom_generate's
 * trace; the caller clears it before returning. */
void loom__session_set_layer_hook(loom_session *s,
                                  void (*on_layers)(void *user, int32_t first, int32_t last),
                                  void *user, int32_t every);

/* Runs tokens (at most n_batch) from position 0 through the first n_layers layers only and
 * copies the residual stream, [n, n_embd] floats, to out; the session is reset before and
 * after. For layer-by-layer comparisons with a reference (tests/tools/hidden_tool.c). */
loom_status loom__session_hidden(loom_session *s, const loom_token *tokens, int32_t n,
                                 int32_t n_layers, float *out);
