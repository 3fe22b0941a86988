// emu_util.cpp — the shared part of the cases that compare kernels with the CPU backend
// (emu_util.h).
#include "emu_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kv/kv_desc.h"
#include "tensor/fp16.h"
#include "tensor/quant.h"
#include "tensor/types.h"
}

namespace emu_test {

void fill_acts(rng &r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) {
        const uint64_t k = r.below(64);
        float v = r.uniform(scale);
        if (k == 0) v *= 100.0f;
        if (k == 1) v = 0.0f;
        x[i] = v;
    }
}

// ---- the CPU backend ----------------------------------------------------------------------------

const loom__backend_stream &cpu() {
    static loom__backend_stream bs;
    static bool open = false;
    if (!open) {
        loom_backend_open_params p;
        memset(&p, 0, sizeof p);
        p.device = 0;
        p.n_threads = 1;
        p.f32_activations = true;
        cpu_ok(loom__backend_stream_open("cpu", &p, &bs), "opening the cpu backend");
        open = true;
    }
    return bs;
}

void cpu_ok(loom_status st, const char *what) {
    if (st == LOOM_OK) return;
    fprintf(stderr, "test_kernels_emu: %s: %s (%s)\n", what, loom_status_str(st),
            loom_last_error());
    exit(1);
}

loom_tensor view(loom_type t, const void *p, int64_t cols, int64_t rows, size_t stride) {
    return loom_tensor_2d(t, (void *)p, cols, rows, stride);
}

// ---- weights ------------------------------------------------------------------------------------

size_t row_bytes(uint32_t t, int64_t k) {
    size_t b = 0;
    if (!loom__type_row_bytes(t, k, &b)) {
        fprintf(stderr, "test_kernels_emu: no row of %lld %s values\n", (long long)k,
                loom__type_name(t));
        exit(1);
    }
    return b;
}

static void put_half(uint8_t *p, float v) {
    const uint16_t h = loom__f32_to_f16(v);
    memcpy(p, &h, 2);
}

void make_weight_row(rng &r, uint32_t t, int64_t k, uint8_t *row) {
    std::vector<float> src((size_t)k);
    for (float &f : src) f = r.uniform(1.0f);
    if (t == LOOM_K_F32) {
        memcpy(row, src.data(), (size_t)k * 4);
        return;
    }
    /* quantized into an aligned row (the CPU's encoders want their blocks 2-byte aligned; the
       cases may place rows at odd addresses) */
    const size_t nb = row_bytes(t, k);
    std::vector<uint8_t> q(nb);
    if (loom__quantize_row(t, src.data(), q.data(), k)) {
        memcpy(row, q.data(), nb);
        return;
    }
    /* K-quants (loom does not quantize to them): every byte random, then the super-blocks'
       half scales set to moderate values (d at 0 for q4_K / q5_K, dmin after it; q6_K's d at
       the end), as GGUF lays them out */
    for (size_t i = 0; i < nb; i++) row[i] = (uint8_t)r.next();
    const loom__type_traits *tr = loom__type_get_traits(t);
    for (int64_t b = 0; b < k / (int64_t)tr->block_elems; b++) {
        uint8_t *p = row + (size_t)b * tr->block_bytes;
        const float d = 0.01f + 0.02f * (float)r.below(100) / 100.0f;
        if (t == LOOM_K_Q6_K) {
            put_half(p + 208, d);
        } else { /* q4_K, q5_K */
            put_half(p, d);
            put_half(p + 2, d * 0.5f);
        }
    }
}

const char *type_name(uint32_t t) {
    return loom__type_name(t);
}

// ---- the paged KV step --------------------------------------------------------------------------

bool is_fp8(loom_type t) {
    return t == LOOM_TYPE_FP8_E4M3 || t == LOOM_TYPE_FP8_E5M2;
}

uint32_t k_type(loom_type t) {
    return (uint32_t)t; /* loom_kernels.h's LOOM_K_* are loom_type's values */
}

std::vector<int32_t> shuffled_pool(rng &r, int n_used) {
    std::vector<int32_t> perm((size_t)n_used + 3);
    for (size_t i = 0; i < perm.size(); i++) perm[i] = (int32_t)i;
    for (size_t i = perm.size() - 1; i > 0; i--) std::swap(perm[i], perm[r.below(i + 1)]);
    return perm;
}

kv_step make_step(const kv_shape &sh, const std::vector<int> &kv_len, const std::vector<int> &n_new,
                  const std::vector<int32_t> &pool, bool hole) {
    kv_step st;
    st.sh = sh;
    st.n_seqs = (int)kv_len.size();
    st.indptr.assign((size_t)st.n_seqs + 1, 0);
    st.q_start.assign((size_t)st.n_seqs + 1, 0);
    for (int s = 0; s < st.n_seqs; s++) {
        const int len = kv_len[s], first = len - n_new[s];
        const int lo = sh.window > 0 && first - sh.window + 1 > 0 ? first - sh.window + 1 : 0;
        const int nb = (len + sh.bs - 1) / sh.bs;
        for (int b = 0; b < nb; b++) {
            const int32_t id = pool[st.block_ids.size()];
            st.block_ids.push_back(hole && (b + 1) * sh.bs <= lo ? LOOM_KV_NO_BLOCK : id);
        }
        st.indptr[s + 1] = (int32_t)st.block_ids.size();
        st.pos_start.push_back(first);
        st.kv_len.push_back(len);
        st.q_start[s + 1] = st.q_start[s] + n_new[s];
        for (int i = 0; i < n_new[s]; i++) st.row_seq.push_back(s);
    }
    st.n_rows = st.q_start[st.n_seqs];
    st.n_blocks = (int)pool.size();
    if (st.block_ids.empty()) st.block_ids.push_back(0);
    for (int s = 0; s < st.n_seqs; s++) {
        if (n_new[s] >= LOOM_K_ATTN_PREFILL_ROWS) {
            st.prefill_seqs.push_back(s);
            st.prefill_max_rows = std::max(st.prefill_max_rows, n_new[s]);
        } else {
            for (int r = st.q_start[s]; r < st.q_start[s + 1]; r++) st.split_rows.push_back(r);
        }
    }
    /* a slot with 16 spare bytes (slots stay 16-byte aligned where the heads are: the decode
       attention's vector form needs that, FP8 pages included), a block with 2 spare slots' worth
       of bytes; FP8 scales after the block's slots, 4 spare bytes a slot, the block rounded up to
       16 bytes */
    st.elt = loom__kv_elt_bytes(sh.type);
    st.token = (size_t)sh.nkv * (size_t)sh.hd * st.elt + 16;
    st.scale_at = ((size_t)sh.bs * st.token + 2 * st.token + 15) & ~(size_t)15;
    st.scale_token = is_fp8(sh.type) ? (size_t)sh.nkv * 4 + 4 : 0;
    st.block = (st.scale_at + (size_t)sh.bs * st.scale_token + 15) & ~(size_t)15;
    return st;
}

void pools_make(const kv_step &st, kv_pools *p) {
    p->k.assign(st.pool_bytes(), 0xff);
    p->v.assign(st.pool_bytes(), 0xff);
    p->kb[0] = p->k.data();
    p->vb[0] = p->v.data();
    p->ks[0] = p->k.data() + st.scale_at;
    p->vs[0] = p->v.data() + st.scale_at;
    p->kb[1] = p->vb[1] = p->ks[1] = p->vs[1] = nullptr;
}

loom_kv_desc cpu_desc(const kv_step &st, kv_pools &p) {
    loom_kv_desc d;
    memset(&d, 0, sizeof d);
    const bool fp8 = is_fp8(st.sh.type);
    d.n_seqs = st.n_seqs;
    d.indptr = st.indptr.data();
    d.block_ids = st.block_ids.data();
    d.q_start = st.q_start.data();
    d.pos_start = st.pos_start.data();
    d.kv_len = st.kv_len.data();
    d.block_size = st.sh.bs;
    d.n_blocks = st.n_blocks;
    d.n_kv_heads = st.sh.nkv;
    d.head_dim = st.sh.hd;
    d.window = st.sh.window;
    d.kv_type = st.sh.type;
    d.layout = LOOM_KV_LAYOUT_NHD;
    d.token_stride = st.token;
    d.block_stride = st.block;
    d.n_layers = 1;
    d.k_base = p.kb;
    d.v_base = p.vb;
    d.scale_kind = fp8 ? LOOM_KV_SCALE_PER_TOKEN_HEAD : LOOM_KV_SCALE_NONE;
    d.k_scale = fp8 ? p.ks : nullptr;
    d.v_scale = fp8 ? p.vs : nullptr;
    d.scale_token_stride = st.scale_token;
    d.scale_block_stride = fp8 ? st.block : 0;
    cpu_ok(loom__kv_desc_check(&d, st.n_rows), "the step's descriptor");
    return d;
}

loom__k_kv kernel_desc(const kv_step &st) {
    loom__k_kv k;
    memset(&k, 0, sizeof k);
    k.indptr = st.indptr.data();
    k.block_ids = st.block_ids.data();
    k.q_start = st.q_start.data();
    k.pos_start = st.pos_start.data();
    k.row_seq = st.row_seq.data();
    k.n_seqs = st.n_seqs;
    k.n_rows = st.n_rows;
    k.block_size = st.sh.bs;
    k.n_kv_heads = st.sh.nkv;
    k.head_dim = st.sh.hd;
    k.window = st.sh.window;
    k.kv_type = k_type(st.sh.type);
    k.token_stride = st.token;
    k.block_stride = st.block;
    k.scale_token_stride = st.scale_token;
    k.scale_block_stride = is_fp8(st.sh.type) ? st.block : 0;
    k.prefill_seqs = st.prefill_seqs.data();
    k.split_rows = st.split_rows.data();
    k.n_prefill_seqs = (int32_t)st.prefill_seqs.size();
    k.n_split_rows = (int32_t)st.split_rows.size();
    k.prefill_max_rows = st.prefill_max_rows;
    for (int s = 0; s < st.n_seqs; s++) {
        k.max_rows = std::max(k.max_rows, st.q_start[s + 1] - st.q_start[s]);
        k.max_kv_len = std::max(k.max_kv_len, st.kv_len[s]);
    }
    return k;
}

// ---- comparisons --------------------------------------------------------------------------------

double norm_err(const float *a, const float *b, size_t n) {
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
        num = std::max(num, fabs((double)a[i] - (double)b[i]));
        den = std::max(den, fabs((double)b[i]));
    }
    return num / den;
}

bool same_bits(float a, float b) {
    return memcmp(&a, &b, sizeof a) == 0;
}

void problems::add(const char *fmt, ...) {
    n++;
    if (!first.empty()) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    first = buf;
}

const char *order_name(loom_emu::schedule s) {
    static const char *const names[] = {"breadth", "depth", "depth-rev", "random"};
    return names[(int)s];
}

} // namespace emu_test
