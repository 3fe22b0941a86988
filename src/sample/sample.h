/* sample.h — the bridge between the public sampler parameters (loom_sampler_params,
 * loom_token_info in loom.h) and the chain (sample/chain.h). The public sampler (sample.c), the
 * engine and loom_generate all go through it, so one set of settings means the same thing
 * everywhere. */
#pragma once

#include "loom.h"
#include "sample/chain.h"

/* Maps a caller's p (of p->size bytes; NULL: the defaults) onto a chain configuration; the
 * logit-bias list stays borrowed from p. Checks only what the mapping itself needs (its size,
 * a list when n_logit_bias > 0, a count that fits int32_t); loom__sample_chain_validate checks
 * the values. Errors: INVALID_ARG, UNSUPPORTED (core/abi.h). */
loom_status loom__sampler_to_chain(const loom_sampler_params *p, loom__sample_chain_config *out);

/* The public view of a chain result; the top arrays are shared with r, not copied. */
void loom__sampler_info(const loom__sample_chain_result *r, loom_token_info *out);
