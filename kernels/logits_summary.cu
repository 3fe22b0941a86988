/* logits_summary.cu — what the sampler reads of a row of logits, made on the device so that a
 * few KB per row cross to the host instead of the row (loom_backend.h: logits_summary;
 * sample/chain.h says which settings sample from it). One block per row:
 *
 *   1. a sweep for the largest finite logit, its lowest index, the finite and +inf counts;
 *   2. a sweep summing, in float64 with d = x - max, S = sum e^d, T = sum e^d d and
 *      U = sum e^d d^2, from which H = ln S - T/S and the varentropy U/S - (T/S)^2 (the host's
 *      formulas, sample/entropy.c; only the order of the additions differs);
 *   3. the n best finite entries: a radix select over the order-preserving keys (larger logit
 *      first) finds the n-th key in four 8-bit passes; a sweep in id order then takes every
 *      entry above it and, of the entries equal to it, the lowest ids (a block-wide prefix
 *      count, no atomics deciding places, so the list is the same in every run); a bitonic
 *      sort in shared memory orders them (key, then id) — the host chain's total order.
 *
 * Every reduction is a fixed tree, so a row's summary depends on the row alone. */
#include "common.cuh"

#include "loom_backend.h"

#include <math.h>

#define SUM_THREADS 512
#define SUM_WARPS   (SUM_THREADS / 32)

typedef struct summary_args {
    const float *x;
    size_t x_stride; /* bytes */
    int32_t n_vocab, n_top;
    loom_logit_summary *sum; /* [n_rows], device */
    loom_logit_cand *top;    /* [n_rows * n_top], device */
} summary_args;

/* Ascending key order = the chain's candidate order by logit (larger first); -0 is +0. */
static __device__ __forceinline__ uint32_t desc_key(float v) {
    uint32_t u = __float_as_uint(v + 0.0f);
    u ^= (u >> 31) ? 0xFFFFFFFFu : 0x80000000u;
    return ~u;
}

static __device__ __forceinline__ bool finite_logit(float v) {
    return v > -INFINITY && v < INFINITY;
}

/* Block-wide sum (fixed tree: warps, then warp 0 over the warps' sums); red holds SUM_WARPS. */
template <typename T> static __device__ T block_sum(T v, T *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        T r = l < SUM_WARPS ? red[l] : T(0);
        for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
        if (l == 0) red[0] = r;
    }
    __syncthreads();
    return red[0];
}

/* Exclusive prefix count of flag over the block in thread order, and the block's total. */
static __device__ int block_rank(bool flag, int *warp_tot, int *total) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    const unsigned b = __ballot_sync(0xffffffffu, flag);
    __syncthreads();
    if (l == 0) warp_tot[w] = __popc(b);
    __syncthreads();
    int before = 0, all = 0;
    for (int i = 0; i < SUM_WARPS; i++) {
        before += i < w ? warp_tot[i] : 0;
        all += warp_tot[i];
    }
    *total = all;
    return before + __popc(b & ((1u << l) - 1u));
}

static __global__ void __launch_bounds__(SUM_THREADS) summary_kernel(summary_args a) {
    __shared__ uint32_t s_key[LOOM_LOGIT_SUMMARY_MAX_TOP];
    __shared__ int32_t s_id[LOOM_LOGIT_SUMMARY_MAX_TOP];
    __shared__ float s_val[LOOM_LOGIT_SUMMARY_MAX_TOP];
    __shared__ double s_red[SUM_WARPS];
    __shared__ int s_ired[SUM_WARPS];
    /* the arg max's warp minima: not in s_ired, whose red[0] block_sum_i's callers read after
     * its last barrier (a warp running ahead would overwrite another's n_pinf) */
    __shared__ int s_amin[SUM_WARPS];
    __shared__ float s_fmax[SUM_WARPS];
    __shared__ int s_hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_need;

    const int64_t row = blockIdx.x;
    const float *x = (const float *)((const char *)a.x + row * a.x_stride);
    const int V = a.n_vocab, tid = threadIdx.x;

    /* 1. finite maximum, its lowest index, counts */
    float mx = -INFINITY;
    int n_fin = 0, n_pinf = 0;
    for (int i = tid; i < V; i += SUM_THREADS) {
        const float v = x[i];
        if (v == INFINITY) n_pinf++;
        if (!finite_logit(v)) continue;
        n_fin++;
        mx = fmaxf(mx, v);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((tid & 31) == 0) s_fmax[tid >> 5] = mx;
    __syncthreads();
    float gmax = -INFINITY;
    for (int i = 0; i < SUM_WARPS; i++) gmax = fmaxf(gmax, s_fmax[i]);
    n_fin = block_sum(n_fin, s_ired);
    n_pinf = block_sum(n_pinf, s_ired);
    /* the lowest index attaining the maximum (+inf where there is one, as the host's summary
     * reports it): each thread's first (its indices grow), then a min tree */
    const float target = n_pinf > 0 ? INFINITY : gmax;
    int cand = 0x7fffffff;
    for (int i = tid; i < V && target > -INFINITY; i += SUM_THREADS)
        if (x[i] == target) {
            cand = i;
            break;
        }
    for (int o = 16; o > 0; o >>= 1) cand = min(cand, __shfl_xor_sync(0xffffffffu, cand, o));
    if ((tid & 31) == 0) s_amin[tid >> 5] = cand;
    __syncthreads();
    int argmax = 0x7fffffff;
    for (int i = 0; i < SUM_WARPS; i++) argmax = min(argmax, s_amin[i]);
    __syncthreads();

    /* 2. the float64 sums (meaningless, and skipped, with a +inf: the chain refuses the row) */
    double S = 0, T = 0, U = 0;
    if (n_pinf == 0 && n_fin > 0) {
        const double m = (double)gmax;
        for (int i = tid; i < V; i += SUM_THREADS) {
            const float v = x[i];
            if (!finite_logit(v)) continue;
            const double d = (double)v - m, e = exp(d);
            S += e;
            T += e * d;
            U += e * d * d;
        }
    }
    S = block_sum(S, s_red);
    T = block_sum(T, s_red);
    U = block_sum(U, s_red);

    /* 3. the n best: radix select of the n-th smallest key */
    const int n_take = n_fin < a.n_top ? n_fin : a.n_top;
    if (tid == 0) {
        s_prefix = 0;
        s_need = n_take;
    }
    uint32_t mask = 0;
    for (int shift = 24; shift >= 0 && n_take > 0; shift -= 8) {
        for (int b = tid; b < 256; b += SUM_THREADS) s_hist[b] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix;
        for (int i = tid; i < V; i += SUM_THREADS) {
            const float v = x[i];
            if (!finite_logit(v)) continue;
            const uint32_t k = desc_key(v);
            if ((k & mask) == prefix) atomicAdd(&s_hist[(k >> shift) & 0xFF], 1); /* a count */
        }
        __syncthreads();
        if (tid == 0) {
            int need = s_need, b = 0;
            while (s_hist[b] < need) need -= s_hist[b++];
            s_need = need;
            s_prefix = prefix | ((uint32_t)b << shift);
        }
        mask |= 0xFFu << shift;
        __syncthreads();
    }
    const uint32_t kth = s_prefix; /* the n-th key */
    const int n_eq_take = s_need;  /* entries equal to it that make the list */
    const int n_less = n_take - n_eq_take;
    __syncthreads();

    /* the sweep in id order: places by prefix counts */
    int at_less = 0, at_eq = 0;
    for (int base = 0; base < V && n_take > 0; base += SUM_THREADS) {
        const int i = base + tid;
        const float v = i < V ? x[i] : -INFINITY;
        const bool fin = finite_logit(v);
        const uint32_t k = fin ? desc_key(v) : 0xFFFFFFFFu;
        const bool less = fin && k < kth, eq = fin && k == kth;
        int tot_less, tot_eq;
        const int r_less = block_rank(less, s_ired, &tot_less);
        const int r_eq = block_rank(eq, s_ired, &tot_eq);
        if (less) {
            const int p = at_less + r_less;
            s_key[p] = k, s_id[p] = i, s_val[p] = v;
        }
        if (eq && at_eq + r_eq < n_eq_take) {
            const int p = n_less + at_eq + r_eq;
            s_key[p] = k, s_id[p] = i, s_val[p] = v;
        }
        at_less += tot_less;
        at_eq += tot_eq;
    }
    /* bitonic sort of the list, padded to a power of two with entries that sort last */
    int P = 1;
    while (P < n_take) P <<= 1;
    for (int i = n_take + tid; i < P; i += SUM_THREADS)
        s_key[i] = 0xFFFFFFFFu, s_id[i] = 0x7fffffff;
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < P; i += SUM_THREADS) {
                const int j = i ^ stride;
                if (j <= i) continue;
                const bool up = (i & size) == 0;
                const bool after =
                    s_key[i] > s_key[j] || (s_key[i] == s_key[j] && s_id[i] > s_id[j]);
                if (after == up) {
                    const uint32_t tk = s_key[i];
                    s_key[i] = s_key[j], s_key[j] = tk;
                    const int32_t ti = s_id[i];
                    s_id[i] = s_id[j], s_id[j] = ti;
                    const float tv = s_val[i];
                    s_val[i] = s_val[j], s_val[j] = tv;
                }
            }
            __syncthreads();
        }
    }
    loom_logit_cand *top = a.top + row * a.n_top;
    for (int i = tid; i < n_take; i += SUM_THREADS) top[i] = loom_logit_cand{s_val[i], s_id[i]};
    if (tid == 0) {
        loom_logit_summary s;
        if (n_pinf > 0) {
            s.max = INFINITY;
            s.sum = s.entropy = s.varentropy = 0;
        } else if (n_fin == 0) {
            s.max = -INFINITY;
            s.sum = s.entropy = s.varentropy = 0;
        } else {
            const double mean = T / S, h = log(S) - mean, var = U / S - mean * mean;
            s.max = (double)gmax;
            s.sum = S;
            s.entropy = h > 0 ? h : 0;
            s.varentropy = var > 0 ? var : 0;
        }
        s.n_finite = n_fin;
        s.argmax = n_fin > 0 || n_pinf > 0 ? argmax : -1;
        s.n_posinf = n_pinf;
        s.n_top = n_take;
        a.sum[row] = s;
    }
}

/* ---- the sampler's edits (loom_logit_edits) ------------------------------------------------ */

typedef struct edit_args {
    float *x; /* rows edited in place */
    size_t x_stride;
    const int32_t *row_off; /* [n_rows + 1] each row's first entry */
    const loom__k_logit_edit *ent;
    const float *pen; /* [n_rows * 3] repeat, presence, frequency */
    float *edit_raw;  /* [n_rows * LOOM_LOGIT_SUMMARY_MAX_EDITS] */
} edit_args;

/* One block per row, one thread: the raw values first (an id may be edited twice: a bias and a
 * penalty, or repeated bias entries, and each entry reports the raw value), then the edits in
 * order, in the chain's arithmetic with every rounding explicit (no contraction into FMAs). */
static __global__ void edit_kernel(edit_args a) {
    if (threadIdx.x != 0) return;
    const int64_t row = blockIdx.x;
    float *x = (float *)((char *)a.x + row * a.x_stride);
    const int32_t e0 = a.row_off[row], e1 = a.row_off[row + 1];
    float *raw = a.edit_raw + row * LOOM_LOGIT_SUMMARY_MAX_EDITS;
    for (int32_t j = e0; j < e1; j++) {
        const float v = x[a.ent[j].id];
        raw[j - e0] = v != v ? -INFINITY : v;
    }
    const float rep = a.pen[3 * row], pres = a.pen[3 * row + 1], freq = a.pen[3 * row + 2];
    for (int32_t j = e0; j < e1; j++) {
        const loom__k_logit_edit e = a.ent[j];
        float v = x[e.id];
        if (v != v) v = -INFINITY;
        if (e.count == 0) {
            v = __fadd_rn(v, e.bias);
        } else {
            v = v > 0 ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
            v = __fsub_rn(v, __fadd_rn(pres, __fmul_rn((float)e.count, freq)));
        }
        x[e.id] = v != v ? INFINITY : v; /* a NaN (inf - inf) as the +inf the chain refuses */
    }
}

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernel itself */
extern "C" loom_status loom__cuda_logits_edit(cudaStream_t stream, float *x, size_t x_stride,
                                              int64_t n_rows, const int32_t *row_off,
                                              const loom__k_logit_edit *ent, const float *pen,
                                              float *edit_raw) {
    if (n_rows == 0) return LOOM_OK;
    if (n_rows > 0x7fffffff)
        LOOM_K_UNSUPPORTED("cuda: logit edits of %lld rows", (long long)n_rows);
    edit_args a = {x, x_stride, row_off, ent, pen, edit_raw};
    LOOM_K_LAUNCH((edit_kernel), ((unsigned)n_rows, 32, 0, stream), a);
    LOOM_K_LAUNCHED("logit edits");
    return LOOM_OK;
}

extern "C" size_t loom__cuda_logits_summary_bytes(int64_t n_rows, int32_t n_top) {
    return (size_t)n_rows * (sizeof(loom_logit_summary) + (size_t)n_top * sizeof(loom_logit_cand));
}

extern "C" loom_status loom__cuda_logits_summary(cudaStream_t stream, const float *x,
                                                 size_t x_stride, int64_t n_rows, int32_t n_vocab,
                                                 int32_t n_top, void *out) {
    if (n_rows == 0) return LOOM_OK;
    if (n_rows > 0x7fffffff || n_top < 1 || n_top > LOOM_LOGIT_SUMMARY_MAX_TOP)
        LOOM_K_UNSUPPORTED("cuda: logits_summary of %lld rows, %d candidates", (long long)n_rows,
                           n_top);
    summary_args a;
    a.x = x;
    a.x_stride = x_stride;
    a.n_vocab = n_vocab;
    a.n_top = n_top;
    a.sum = (loom_logit_summary *)out;
    a.top = (loom_logit_cand *)((char *)out + (size_t)n_rows * sizeof(loom_logit_summary));
    LOOM_K_LAUNCH((summary_kernel), ((unsigned)n_rows, SUM_THREADS, 0, stream), a);
    LOOM_K_LAUNCHED("logits_summary");
    return LOOM_OK;
}
#endif
