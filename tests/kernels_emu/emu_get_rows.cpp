// emu_get_rows.cpp — kernels/get_rows.cu's embedding gather, compiled from that file, run on the
// emulator against the CPU backend's get_rows, bit for bit (test_cuda_ops' check), for every
// weight type the kernels read in place. Rows of 4100 values for the plain types and FP8 rows
// (129 chunks, the last partial: thread 0 takes two) and 4352 for the block types (136 blocks,
// 17 super-blocks); rows a few bytes apart (2-byte aligned, as the CPU wants them), the gaps
// 0xff. 21 ids with repeats, the first and
// last row, and two outside the table (37 and -1), which must give rows of NaN (the CPU refuses
// them). The output is poisoned with one NaN pattern before the launch: each row's padding must
// keep it, a bad id's row must be NaN of the kernel's own.
#include "get_rows.cu"

#include <stdio.h>

#include <vector>

#include "emu_cases.h"
#include "emu_util.h"

namespace {

using emu_test::rng;

const uint32_t POISON = 0x7fbadbadu; /* a NaN the kernel never writes */

template <int T> void launch_rows(const rows_args &a, unsigned n_ids, loom_emu::schedule order) {
    loom_emu::launch_options opt;
    opt.order = order;
    opt.seed = n_ids + T;
    loom_emu::launch(
        dim3(n_ids), dim3(128), 0, [&a] { get_rows_kernel<T>(a); }, opt);
}

void launch_any(const rows_args &a, unsigned n_ids, loom_emu::schedule order) {
    switch (a.w.type) {
    case LOOM_K_F32:
        return launch_rows<LOOM_K_F32>(a, n_ids, order);
    case LOOM_K_F16:
        return launch_rows<LOOM_K_F16>(a, n_ids, order);
    case LOOM_K_BF16:
        return launch_rows<LOOM_K_BF16>(a, n_ids, order);
    case LOOM_K_Q8_0:
        return launch_rows<LOOM_K_Q8_0>(a, n_ids, order);
    case LOOM_K_Q4_0:
        return launch_rows<LOOM_K_Q4_0>(a, n_ids, order);
    case LOOM_K_Q5_0:
        return launch_rows<LOOM_K_Q5_0>(a, n_ids, order);
    case LOOM_K_Q4_K:
        return launch_rows<LOOM_K_Q4_K>(a, n_ids, order);
    case LOOM_K_Q5_K:
        return launch_rows<LOOM_K_Q5_K>(a, n_ids, order);
    case LOOM_K_Q6_K:
        return launch_rows<LOOM_K_Q6_K>(a, n_ids, order);
    default:
        return launch_rows<LOOM_K_FP8_ROWS>(a, n_ids, order);
    }
}

int run_type(uint32_t type, int64_t K, size_t gap, loom_emu::schedule order, bool verbose) {
    const int64_t N = 37;
    const size_t rb = emu_test::row_bytes(type, K), stride = rb + gap;
    std::vector<uint8_t> wbuf((size_t)(N - 1) * stride + rb, 0xff);
    rng r(0x9e75 + type * 31 + (uint64_t)K);
    for (int64_t n = 0; n < N; n++) emu_test::make_weight_row(r, type, K, &wbuf[n * stride]);
    /* ids: the first and last row, repeats, two outside the table */
    std::vector<int32_t> ids;
    for (int i = 0; i < 21; i++) ids.push_back((int32_t)r.below((uint64_t)N));
    ids[0] = 0;
    ids[1] = (int32_t)N - 1;
    ids[9] = ids[4];
    ids[6] = (int32_t)N;
    ids[15] = -1;
    const int n_ids = (int)ids.size();
    const int64_t os = K + 3;
    std::vector<float> out((size_t)(n_ids * os));
    for (float &f : out) f = __uint_as_float(POISON);
    rows_args a;
    a.w = loom__k_weight{type, K, N, stride, wbuf.data()};
    a.ids = ids.data();
    a.out = out.data();
    a.out_stride = (size_t)os * 4;
    launch_any(a, (unsigned)n_ids, order);

    /* the CPU's rows of the valid ids */
    std::vector<int32_t> good;
    for (int32_t id : ids)
        if (id >= 0 && id < N) good.push_back(id);
    std::vector<float> ref(good.size() * (size_t)K, NAN);
    const loom__backend_stream &c = emu_test::cpu();
    loom_tensor tw = emu_test::view((loom_type)type, wbuf.data(), K, N, stride);
    loom_tensor ti =
        emu_test::view(LOOM_TYPE_I32, good.data(), (int64_t)good.size(), 1, good.size() * 4);
    loom_tensor to = emu_test::view(LOOM_TYPE_F32, ref.data(), K, (int64_t)good.size(), K * 4);
    emu_test::cpu_ok(c.ops->get_rows(c.ctx, &tw, &ti, &to), "cpu get_rows");

    emu_test::problems pr;
    for (int i = 0, g = 0; i < n_ids; i++) {
        const float *o = &out[(size_t)i * os];
        const bool valid = ids[i] >= 0 && ids[i] < N;
        for (int64_t j = 0; j < K; j++) {
            if (valid && !emu_test::same_bits(o[j], ref[(size_t)g * K + j]))
                pr.add("row %d (id %d) [%lld] = %.9g, the CPU's %.9g", i, ids[i], (long long)j,
                       (double)o[j], (double)ref[(size_t)g * K + j]);
            if (!valid && (!std::isnan(o[j]) || __float_as_uint(o[j]) == POISON))
                pr.add("row %d (id %d, outside the table) [%lld] = %.9g: not the kernel's NaN", i,
                       ids[i], (long long)j, (double)o[j]);
        }
        for (int64_t j = K; j < os; j++)
            if (__float_as_uint(o[j]) != POISON) pr.add("row %d: its padding was written", i);
        g += valid;
    }
    if (pr.n) {
        printf("FAIL get_rows %s k=%lld: %s (%d wrong)\n", emu_test::type_name(type), (long long)K,
               pr.first.c_str(), pr.n);
        return 1;
    }
    if (verbose)
        printf("  get_rows %-13s k=%lld %-9s: %d rows the CPU's bits, 2 bad ids NaN\n",
               emu_test::type_name(type), (long long)K, emu_test::order_name(order), n_ids - 2);
    return 0;
}

} // namespace

namespace emu_get_rows {

int run_all(bool verbose) {
    const struct {
        uint32_t type;
        int64_t k;
        size_t gap;
    } specs[] = {
        {LOOM_K_F32, 4100, 4},       {LOOM_K_F16, 4100, 2},  {LOOM_K_BF16, 4100, 6},
        {LOOM_K_Q8_0, 4352, 2},      {LOOM_K_Q4_0, 4352, 6}, {LOOM_K_Q5_0, 4352, 4},
        {LOOM_K_Q4_K, 4352, 2},      {LOOM_K_Q5_K, 4352, 6}, {LOOM_K_Q6_K, 4352, 4},
        {LOOM_K_FP8_ROWS, 4100, 4},  /* rows 4108 bytes apart: the byte loads but in row 0 */
        {LOOM_K_FP8_ROWS, 4096, 12}, /* 4100 + 12 = 257 * 16: the wide loads */
    };
    int bad = 0, i = 0;
    for (const auto &s : specs)
        bad += run_type(s.type, s.k, s.gap, (loom_emu::schedule)(i++ % 4), verbose);
    return bad;
}

} // namespace emu_get_rows
