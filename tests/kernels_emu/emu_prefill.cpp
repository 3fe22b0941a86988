// emu_prefill.cpp — kernels/attention_prefill.cu's kernel, compiled from that file, run on the
// emulator over a step of paged KV and checked against a float64 reference of paged attention:
// causal, windowed (table entries before the window left as LOOM_KV_NO_BLOCK), soft-capped, GQA,
// F32 / F16 / BF16 / FP8 pages with one scale per position and head, the pool's blocks in a
// shuffled order with poisoned gaps and margins, outputs poisoned (rows the kernel must not
// write: the padding of each row and, in the fast mode, every row of a sequence under the prefill
// threshold). In the invariant mode every row, split across blocks at segment boundaries where
// the case's SM count asks for it (the segment states poisoned), then folded. In BF16 math
// (16-bit operands) the reference takes the operands the kernel rounds as it rounds them (Q, and
// F32 pages' K and V, to BF16 or F16 by pf_ops_of): what remains is the rounding of the softmax
// weights P (times FP8 V's scale), a relative 2^-8 (BF16) or 2^-11 (F16) each at most.
// Built twice (CMakeLists.txt): EMU_PREFILL_NS names this build's run(), LOOM_K_PLANTED_BUG
// plants attention_prefill.cu's off-by-one.
#include "attention_prefill.cu"

#include <stdarg.h>
#include <stdio.h>

#include <algorithm>
#include <vector>

#include "emu_cases.h"
#include "loom_backend.h" /* LOOM_KV_NO_BLOCK */

#if !defined(EMU_PREFILL_NS)
#define EMU_PREFILL_NS emu_prefill
#endif

namespace {

uint64_t g_rs;
uint64_t rnd() {
    g_rs ^= g_rs << 13, g_rs ^= g_rs >> 7, g_rs ^= g_rs << 17;
    return g_rs;
}
float frand(float a) { /* uniform in (-a, a) */
    return (float)(((double)(rnd() >> 11) * 0x1p-53 * 2 - 1) * a);
}

// The reference's own decoders, written from the formats (not the kernels' or loom's).
double half_value(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}
double e4m3_value(uint8_t b) { /* bias 7, 3 mantissa bits, exponent 0: m * 2^-9; 0x7f NaN */
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (b & 0x80) ? -v : v;
}
double e5m2_value(uint8_t b) {
    return half_value((uint16_t)(b << 8));
}
double bf16_value(uint16_t b) { /* a float's top half */
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

size_t elt_bytes(uint32_t type) {
    return type == LOOM_K_F32 ? 4 : (type == LOOM_K_FP8_E4M3 || type == LOOM_K_FP8_E5M2) ? 1 : 2;
}

int window_lo(int window, int pos) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// Keeps the first problem found.
__attribute__((format(printf, 2, 3))) void problem(emu_test::prefill_result &res, const char *fmt,
                                                   ...) {
    if (!res.problem.empty()) return;
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    res.problem = buf;
}

// x rounded to the 16-bit operand type: BF16 written here from the format (a float's top half,
// nearest even), F16 by the emulator's conversion read back with half_value.
double round16(int ops, float x) {
    if (ops == PF_F16 || ops == PF_WG_F16 || ops == PF_F16_QR)
        return half_value(__half_as_ushort(__float2half_rn(x)));
    uint32_t u = __float_as_uint(x);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return __uint_as_float(u);
}

template <int HD, int OPS>
void launch_kernel(const pf_args &a, unsigned blocks, unsigned groups, size_t smem,
                   loom_emu::schedule order) {
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = 0x5eed + blocks;
    const dim3 grid(blocks, (unsigned)a.kv.n_kv_heads, groups);
    if constexpr (OPS == PF_WG_BF16 || OPS == PF_WG_F16) {
        if (a.direct) {
            loom_emu::launch(
                grid, dim3(PF_WS_THREADS), smem, [&a] { attn_prefill_ws_kernel<HD, OPS>(a); }, opt);
        } else {
            loom_emu::launch(
                grid, dim3(PF_THREADS), smem, [&a] { attn_prefill_kernel<HD, OPS>(a); }, opt);
        }
    } else {
        loom_emu::launch(
            grid, dim3(PF_THREADS), smem, [&a] { attn_prefill_kernel<HD, OPS>(a); }, opt);
    }
    if (a.part != nullptr)
        loom_emu::launch(
            dim3((unsigned)a.kv.n_rows, (unsigned)a.p.n_head), dim3(128), 0,
            [&a] { pf_fold_kernel(a); }, opt);
}

template <int HD>
void launch_ops(int ops, const pf_args &a, unsigned blocks, unsigned groups, size_t smem,
                loom_emu::schedule order) {
    switch (ops) {
    case PF_TF32:
        return launch_kernel<HD, PF_TF32>(a, blocks, groups, smem, order);
    case PF_TF32_KV:
        return launch_kernel<HD, PF_TF32_KV>(a, blocks, groups, smem, order);
    case PF_BF16:
        return launch_kernel<HD, PF_BF16>(a, blocks, groups, smem, order);
    case PF_F16:
        return launch_kernel<HD, PF_F16>(a, blocks, groups, smem, order);
    case PF_BF16_QR:
    case PF_F16_QR: /* head sizes 72 .. 128 (pf_ops_of) */
        if constexpr (HD == 128) {
            if (ops == PF_F16_QR)
                return launch_kernel<HD, PF_F16_QR>(a, blocks, groups, smem, order);
            return launch_kernel<HD, PF_BF16_QR>(a, blocks, groups, smem, order);
        }
        return;
    default: /* the wgmma forms: head sizes 64 and 128 only (pf_ops_of) */
        if constexpr (HD == 64 || HD == 128) {
            if (ops == PF_WG_F16)
                return launch_kernel<HD, PF_WG_F16>(a, blocks, groups, smem, order);
            return launch_kernel<HD, PF_WG_BF16>(a, blocks, groups, smem, order);
        }
    }
}

// A sequence's values at a position: a generator seeded by (id, position, what).
void seed_at(int id, int pos, int what) {
    g_rs = 0x9e3779b97f4a7c15ull ^
           ((uint64_t)id * 1000003ull + (uint64_t)pos * 7919ull + (uint64_t)what * 104729ull + 1);
    if (g_rs == 0) g_rs = 1;
    for (int i = 0; i < 4; i++) (void)rnd(); /* nearby seeds: spread them */
}

} // namespace

namespace EMU_PREFILL_NS {

emu_test::prefill_result run(const emu_test::prefill_case &c) {
    emu_test::prefill_result res;
    res.worst = 0;
    const int S = (int)c.cached.size(), hd = c.hd, nkv = c.nkv, nh = nkv * c.G;
    const size_t elt = elt_bytes(c.type);
    const bool fp8 = c.type == LOOM_K_FP8_E4M3 || c.type == LOOM_K_FP8_E5M2;
    const int ops = pf_ops_of(c.type, c.math, c.hd, c.smem_optin);
    res.ops = ops;
    res.q_regs = ops == PF_BF16_QR || ops == PF_F16_QR;
    const bool m16 = ops >= PF_BF16;
    /* strides with room between tokens and blocks, aligned as pf_layer_ok wants */
    const size_t token = (size_t)nkv * hd * elt + 16, block = (size_t)c.bs * token + 32;
    const size_t stok = (size_t)nkv * 4 + 4, sblk = (size_t)c.bs * stok + 8;

    /* the descriptor: sequences' block tables into a shuffled pool with three spare blocks */
    std::vector<int> indptr(S + 1), qs(S + 1), ps(S), len(S);
    int nb = 0, rows = 0;
    for (int s = 0; s < S; s++) {
        len[s] = c.cached[s] + c.nnew[s];
        indptr[s] = nb;
        nb += (len[s] + c.bs - 1) / c.bs;
        qs[s] = rows;
        ps[s] = c.cached[s];
        rows += c.nnew[s];
    }
    indptr[S] = nb;
    qs[S] = rows;
    g_rs = 0x243f6a8885a308d3ull + (uint64_t)nb;
    std::vector<int> perm(nb + 3);
    for (int i = 0; i < nb + 3; i++) perm[i] = i;
    for (int i = nb + 2; i > 0; i--) std::swap(perm[i], perm[rnd() % (uint64_t)(i + 1)]);
    std::vector<int> ids(nb ? nb : 1);
    for (int s = 0; s < S; s++) {
        const int lo = window_lo(c.window, ps[s]); /* the first new row's window start */
        for (int b = indptr[s]; b < indptr[s + 1]; b++)
            ids[b] = (b - indptr[s] + 1) * c.bs <= lo ? LOOM_KV_NO_BLOCK : perm[b];
    }
    const size_t margin = 1 << 16, pool = (size_t)(nb + 3) * block, spool = (size_t)(nb + 3) * sblk;
    std::vector<unsigned char> kbuf(pool + 2 * margin, 0xff), vbuf(pool + 2 * margin, 0xff);
    std::vector<unsigned char> ksb(spool + 2 * margin, 0xff), vsb(spool + 2 * margin, 0xff);
    unsigned char *kp = kbuf.data() + margin, *vp = vbuf.data() + margin;
    unsigned char *ksp = ksb.data() + margin, *vsp = vsb.data() + margin;

    /* pages, and the reference's values [s][pos][kv head][d]; a sequence's values depend on its
       id and the position only, so a sequence gets the same data alone, in a batch and cut
       into other steps */
    std::vector<std::vector<double>> K(S), V(S);
    for (int s = 0; s < S; s++) {
        K[s].assign((size_t)len[s] * nkv * hd, 0);
        V[s].assign((size_t)len[s] * nkv * hd, 0);
        const int lo = window_lo(c.window, ps[s]);
        for (int p = 0; p < len[s]; p++) {
            if ((p / c.bs + 1) * c.bs <= lo) continue; /* a block never read: not stored */
            seed_at(c.ids.empty() ? s : c.ids[s], p, 0);
            const int blk = ids[indptr[s] + p / c.bs], slot = p % c.bs;
            for (int h = 0; h < nkv; h++) {
                const float ksc = 0.001f + 0.01f * (float)(rnd() % 1000) / 1000;
                const float vsc = 0.001f + 0.01f * (float)(rnd() % 1000) / 1000;
                if (fp8) {
                    memcpy(ksp + (size_t)blk * sblk + slot * stok + h * 4, &ksc, 4);
                    memcpy(vsp + (size_t)blk * sblk + slot * stok + h * 4, &vsc, 4);
                }
                for (int d = 0; d < hd; d++) {
                    const size_t at =
                        (size_t)blk * block + slot * token + ((size_t)h * hd + d) * elt;
                    for (int kv = 0; kv < 2; kv++) {
                        unsigned char *pp = (kv ? vp : kp) + at;
                        const float amp = kv ? 1.0f : 2.0f, sc = kv ? vsc : ksc;
                        double val;
                        if (c.type == LOOM_K_F32) {
                            const float f = frand(amp);
                            memcpy(pp, &f, 4);
                            val = m16 ? round16(ops, f) : f;
                        } else if (c.type == LOOM_K_F16) { /* a normal half in (-amp, amp) */
                            uint16_t b;
                            do b = (uint16_t)rnd();
                            while (((b >> 10) & 31) < 4 || fabs(half_value(b)) >= amp);
                            memcpy(pp, &b, 2);
                            val = half_value(b);
                        } else if (c.type == LOOM_K_BF16) {
                            const uint16_t b = (uint16_t)(__float_as_uint(frand(amp)) >> 16);
                            memcpy(pp, &b, 2);
                            val = bf16_value(b);
                        } else if (c.type == LOOM_K_FP8_E4M3) {
                            uint8_t b;
                            do b = (uint8_t)rnd();
                            while ((b & 0x7f) == 0x7f);
                            *pp = b;
                            val = e4m3_value(b) * sc;
                        } else { /* E5M2 without infinities and NaN, magnitudes up to 2^9 */
                            uint8_t b;
                            do b = (uint8_t)rnd();
                            while ((b & 0x7f) > 0x60);
                            *pp = b;
                            val = e5m2_value(b) * sc;
                        }
                        (kv ? V : K)[s][((size_t)p * nkv + h) * hd + d] = val;
                    }
                }
            }
        }
    }
    const int qd = nh * hd, qstride = qd + 8;
    std::vector<float> q((size_t)rows * qstride);
    res.out.assign((size_t)rows * qstride, NAN);
    res.q_stride = qstride;
    for (int s = 0; s < S; s++)
        for (int r = qs[s]; r < qs[s + 1]; r++) {
            seed_at(c.ids.empty() ? s : c.ids[s], ps[s] + r - qs[s], 1);
            for (size_t i = (size_t)r * qstride; i < (size_t)(r + 1) * qstride; i++)
                q[i] = frand(1.5f);
        }

    /* the prefill sequences, as step_begin lists them */
    std::vector<int> pf, row_seq;
    int most = 0, most_any = 0, longest = 0;
    for (int s = 0; s < S; s++) {
        if (c.nnew[s] >= LOOM_K_ATTN_PREFILL_ROWS) {
            pf.push_back(s);
            most = std::max(most, c.nnew[s]);
        }
        most_any = std::max(most_any, c.nnew[s]);
        longest = std::max(longest, len[s]);
        for (int i = 0; i < c.nnew[s]; i++) row_seq.push_back(s);
    }
    loom__k_kv kv = {};
    kv.indptr = indptr.data();
    kv.block_ids = ids.data();
    kv.q_start = qs.data();
    kv.pos_start = ps.data();
    kv.n_seqs = S;
    kv.n_rows = rows;
    kv.block_size = c.bs;
    kv.n_kv_heads = nkv;
    kv.head_dim = hd;
    kv.window = c.window;
    kv.kv_type = c.type;
    kv.token_stride = token;
    kv.block_stride = block;
    kv.scale_token_stride = stok;
    kv.scale_block_stride = sblk;
    kv.prefill_seqs = pf.data();
    kv.n_prefill_seqs = (int)pf.size();
    kv.prefill_max_rows = most;
    kv.row_seq = row_seq.data();
    kv.max_rows = most_any;
    kv.max_kv_len = longest;
    loom__k_attn p = {};
    p.invariant = c.all;
    p.n_sms = c.n_sms;
    p.q = q.data();
    p.q_stride = (size_t)qstride * 4;
    p.out = res.out.data();
    p.out_stride = (size_t)qstride * 4;
    p.k_pool = kp;
    p.v_pool = vp;
    p.k_scale = fp8 ? ksp : nullptr;
    p.v_scale = fp8 ? vsp : nullptr;
    p.n_head = nh;
    p.scale = 1.0f / sqrtf((float)hd);
    p.softcap = c.cap;
    p.math = c.math;
    p.tile_regs = c.tile_regs;
    p.smem_optin = c.smem_optin;
    if (!pf_layer_ok(&kv, &p)) {
        problem(res, "pf_layer_ok refuses the case");
        return res;
    }

    /* the launch, as loom__cuda_attention_prefill makes it */
    const pf_plan pl = pf_plan_of(&kv, &p, c.all);
    res.groups = pl.groups;
    std::vector<float> part(pl.part_bytes / sizeof(float), NAN);
    const pf_args a = {kv,
                       p,
                       c.G,
                       PF_M / c.G,
                       c.all,
                       pl.part_bytes != 0 ? part.data() : nullptr,
                       pl.segs_per_block,
                       pl.seg_stride,
                       pf_direct(&kv, &p, ops)};
    res.direct = a.direct != 0;
    const size_t smem = pf_smem_bytes(hd, ops, a.direct);
    const unsigned blocks = (unsigned)pf_grid_x(&kv, c.all, a.rows_per_tile, a.direct);
    const unsigned g = (unsigned)pl.groups;
    switch (hd <= 64 ? 64 : hd <= 128 ? 128 : 256) {
    case 64:
        launch_ops<64>(ops, a, blocks, g, smem, c.order);
        break;
    case 128:
        launch_ops<128>(ops, a, blocks, g, smem, c.order);
        break;
    default:
        launch_ops<256>(ops, a, blocks, g, smem, c.order);
        break;
    }

    /* the float64 reference, row by row */
    const double inv_sqrt = 1.0 / sqrt((double)hd);
    std::vector<double> ref(qd), sc;
    for (int s = 0; s < S; s++) {
        const bool pre = c.all || c.nnew[s] >= LOOM_K_ATTN_PREFILL_ROWS;
        for (int r = qs[s]; r < qs[s + 1]; r++) {
            const float *got = &res.out[(size_t)r * qstride];
            for (int e = qd; e < qstride; e++)
                if (!std::isnan(got[e])) problem(res, "row %d: its padding was written", r);
            if (!pre) {
                for (int e = 0; e < qd; e++)
                    if (!std::isnan(got[e]))
                        problem(res,
                                "row %d of sequence %d (under the prefill threshold) was written",
                                r, s);
                continue;
            }
            const int pos = ps[s] + r - qs[s], lo = window_lo(c.window, pos);
            sc.assign(pos + 1, 0);
            for (int h = 0; h < nh; h++) {
                const int kh = h / c.G;
                const float *qr = &q[(size_t)r * qstride + (size_t)h * hd];
                double mx = -INFINITY;
                for (int j = lo; j <= pos; j++) {
                    const double *kr = &K[s][((size_t)j * nkv + kh) * hd];
                    double d = 0;
                    for (int e = 0; e < hd; e++)
                        d += (m16 ? round16(ops, qr[e]) : (double)qr[e]) * kr[e];
                    d *= inv_sqrt;
                    if (c.cap > 0) d = c.cap * tanh(d / c.cap);
                    sc[j] = d;
                    mx = std::max(mx, d);
                }
                double l = 0;
                for (int j = lo; j <= pos; j++) l += exp(sc[j] - mx);
                for (int e = 0; e < hd; e++) ref[(size_t)h * hd + e] = 0;
                for (int j = lo; j <= pos; j++) {
                    const double w = exp(sc[j] - mx) / l;
                    const double *vr = &V[s][((size_t)j * nkv + kh) * hd];
                    for (int e = 0; e < hd; e++) ref[(size_t)h * hd + e] += w * vr[e];
                }
            }
            double num = 0, den = 1e-30;
            bool nan = false;
            for (int e = 0; e < qd; e++) {
                if (std::isnan(got[e])) nan = true;
                num = std::max(num, fabs(got[e] - ref[e]));
                den = std::max(den, fabs(ref[e]));
            }
            const double err = nan ? INFINITY : num / den;
            /* 16-bit: one unit in the last place of the type (P rounds to half of one) */
            const double tol = ops == PF_BF16 || ops == PF_WG_BF16 || ops == PF_BF16_QR ? 0x1p-7
                               : ops == PF_F16 || ops == PF_WG_F16 || ops == PF_F16_QR  ? 0x1p-10
                                                                                        : 2e-5;
            if (!(err <= tol))
                problem(res,
                        "sequence %d row %d (position %d): error %.3g of the row's largest value",
                        s, r, pos, err);
            res.worst = std::max(res.worst, err);
        }
    }
    return res;
}

} // namespace EMU_PREFILL_NS
