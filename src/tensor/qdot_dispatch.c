/* qdot_dispatch.c — the entry points of qdot.h and qgemm.h, served by the instruction-set
 * variant this CPU runs best.
 *
 * On x86-64 the kernel sources are compiled four times (CMakeLists.txt): portable C
 * (-march=x86-64), AVX2 + FMA + F16C, the same with AVX-VNNI, and AVX-512 F/BW/VL/DQ with
 * AVX-512 VNNI and BF16. The first call asks the CPU (cpuid, and xgetbv for the register state
 * the OS saves) which of them it can run and keeps the best;
 * the environment variable LOOM_CPU_ISA (portable, avx2, avx2-vnni, avx512) lowers the choice,
 * for tests and measurements, never raises it past what the CPU has. Elsewhere there is one
 * variant, portable, compiled with the library's flags.
 *
 * Every variant gives the same bits for the same inputs (tests/backend/test_cpu_qmatmul.c
 * checks each one the CPU runs against the portable kernels), so the choice changes speed
 * only: logits do not depend on the machine's instruction set. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/qdot.h"
#include "tensor/qdot_internal.h"
#include "tensor/qgemm.h"

#if defined(LOOM_ISA_VARIANTS_X86)
#include <cpuid.h>

const loom__qdot_isa *loom__qdot_isa_portable(void);
const loom__qdot_isa *loom__qdot_isa_avx2(void);
const loom__qdot_isa *loom__qdot_isa_avx2vnni(void);
const loom__qdot_isa *loom__qdot_isa_avx512(void);
#else
const loom__qdot_isa *loom__qdot_isa_portable(void);
#endif

#if defined(LOOM_ISA_VARIANTS_X86)
/* The CPU's features, read directly (Intel SDM vol. 2, CPUID and XGETBV) rather than through
 * __builtin_cpu_supports, whose feature names differ between compilers and versions (clang
 * rejects "f16c" and "avxvnni"). A feature counts only where the OS also saves its registers. */
typedef struct cpu_features {
    bool avx2, avx512, avxvnni;
} cpu_features;

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

static cpu_features read_cpu_features(void) {
    cpu_features f = {false, false, false};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool fma = c >> 12 & 1, osxsave = c >> 27 & 1, avx = c >> 28 & 1, f16c = c >> 29 & 1;
    if (!osxsave || !avx) return f;
    const uint64_t xcr0 = xgetbv0();
    const bool ymm_saved = (xcr0 & 0x6) == 0x6;   /* XMM and YMM state */
    const bool zmm_saved = (xcr0 & 0xE6) == 0xE6; /* and opmask, ZMM_Hi256, Hi16_ZMM */
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7 || !ymm_saved) return f;
    __cpuid_count(7, 0, a, b, c, d);
    const bool avx2 = b >> 5 & 1, avx512f = b >> 16 & 1, avx512dq = b >> 17 & 1;
    const bool avx512bw = b >> 30 & 1, avx512vl = b >> 31 & 1, avx512vnni = c >> 11 & 1;
    const unsigned max_sub = a;
    bool avxvnni = false, avx512bf16 = false;
    if (max_sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        avxvnni = a >> 4 & 1;
        avx512bf16 = a >> 5 & 1;
    }
    f.avx2 = avx2 && fma && f16c;
    f.avx512 = f.avx2 && zmm_saved && avx512f && avx512bw && avx512vl && avx512dq && avx512vnni &&
               avx512bf16;
    f.avxvnni = f.avx2 && avxvnni;
    return f;
}
#endif

/* The variants this CPU can run, best first; returns how many (>= 1: portable always). */
int loom__qdot_isa_list(const loom__qdot_isa *out[4]) {
    int n = 0;
#if defined(LOOM_ISA_VARIANTS_X86)
    const cpu_features f = read_cpu_features();
    const bool avx2 = f.avx2, avx512 = f.avx512, avxvnni = f.avxvnni;
    if (avx512) out[n++] = loom__qdot_isa_avx512();
    if (avxvnni) out[n++] = loom__qdot_isa_avx2vnni();
    if (avx2) out[n++] = loom__qdot_isa_avx2();
#endif
    out[n++] = loom__qdot_isa_portable();
    return n;
}

static const loom__qdot_isa *pick(void) {
    const loom__qdot_isa *list[4];
    const int n = loom__qdot_isa_list(list);
    const char *want = getenv("LOOM_CPU_ISA");
    if (want && *want)
        for (int i = 0; i < n; i++)
            if (!strcmp(list[i]->name, want)) return list[i];
    return list[0]; /* unknown or unavailable names keep the best */
}

static const loom__qdot_isa *isa(void) {
    static _Atomic(const loom__qdot_isa *) chosen;
    const loom__qdot_isa *p = atomic_load_explicit(&chosen, memory_order_acquire);
    if (!p) { /* racing first calls compute the same answer */
        p = pick();
        atomic_store_explicit(&chosen, p, memory_order_release);
    }
    return p;
}

const char *loom__qdot_simd_name(void) {
    return isa()->name;
}

/* ------------------------------------------------------------------------------------------ */
/* qdot.h                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* n is a valid count of values for rows of type t: >= 0 and a whole number of blocks. */
static bool whole_blocks(uint32_t t, int64_t n) {
    const loom__type_traits *tr = loom__type_get_traits(t);
    return tr && n >= 0 && n % tr->block_elems == 0;
}

bool loom__vec_dot_type(uint32_t weight_type, uint32_t *act_type) {
    return act_type && isa()->act_type(weight_type, act_type);
}

loom__vec_dot_q_fn loom__vec_dot_q_get(uint32_t weight_type) {
    return isa()->dot(weight_type);
}

loom__quantize_act_fn loom__quantize_activations_get(uint32_t act_type) {
    return isa()->quant(act_type);
}

static float vec_dot_q(uint32_t weight_type, const void *w_row, const void *x_act, int64_t n,
                       loom__vec_dot_q_fn fn) {
    if (!fn || !whole_blocks(weight_type, n)) return NAN;
    if (n == 0) return 0.0f;
    if (!w_row || !x_act) return NAN;
    return fn(w_row, x_act, n);
}

static bool quantize_activations(uint32_t act_type, const float *x, void *dst, int64_t n,
                                 loom__quantize_act_fn fn) {
    if (!fn || !whole_blocks(act_type, n)) return false;
    if (n == 0) return true;
    if (!x || !dst) return false;
    fn(x, dst, n);
    return true;
}

float loom__vec_dot_q(uint32_t weight_type, const void *w_row, const void *x_act, int64_t n) {
    return vec_dot_q(weight_type, w_row, x_act, n, isa()->dot(weight_type));
}

bool loom__quantize_activations(uint32_t act_type, const float *x, void *dst, int64_t n) {
    return quantize_activations(act_type, x, dst, n, isa()->quant(act_type));
}

float loom__vec_dot_q_portable(uint32_t weight_type, const void *w_row, const void *x_act,
                               int64_t n) {
    return vec_dot_q(weight_type, w_row, x_act, n, isa()->dot_portable(weight_type));
}

bool loom__quantize_activations_portable(uint32_t act_type, const float *x, void *dst, int64_t n) {
    return quantize_activations(act_type, x, dst, n, isa()->quant_portable(act_type));
}

/* ------------------------------------------------------------------------------------------ */
/* qgemm.h                                                                                    */
/* ------------------------------------------------------------------------------------------ */

const loom__qgemm_kernels *loom__qgemm_get(uint32_t weight_type) {
    return isa()->qgemm(weight_type);
}

const loom__qgemm_lanes *loom__qgemm_lanes_get(uint32_t weight_type) {
    return isa()->lanes(weight_type);
}
