/* qgemm.c — the entries of qgemm.h: which family's kernels serve a weight type. */
#include "tensor/qgemm.h"

#include "tensor/qdot_internal.h"

const loom_qgemm_kernels *loom_qgemm_get(uint32_t weight_type) {
    const loom_qgemm_kernels *k = loom__qgemm_legacy(weight_type);
    return k ? k : loom__qgemm_kquant(weight_type);
}

const loom_qgemm_lanes *loom_qgemm_lanes_get(uint32_t weight_type) {
    const loom_qgemm_lanes *k = loom__qgemm_lanes_legacy(weight_type);
    return k ? k : loom__qgemm_lanes_kquant(weight_type);
}
