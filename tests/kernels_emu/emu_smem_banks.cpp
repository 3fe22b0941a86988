// emu_smem_banks.cpp — smem_banks.cpp's model of shared-memory bank conflicts, shown on accesses
// whose cost is known: emulated warps report their accesses to the hooks clang's
// -fsanitize-coverage=trace-loads,trace-stores would call (here called directly, so the test
// needs no clang), and the wavefronts counted must be those of 32 banks of 4-byte words: a
// request takes as many as the most distinct words in one bank, at least its words / 32. Also
// shown: a lane's two 8-byte halves of a 16-byte access are one request; a warp collective
// separates requests; lanes that skip an access still pair with the others at the next one;
// cp.async's writes count as stores.
#include <stdio.h>

#include <functional>

#include "emu_cases.h"
#include "kernel_emu.h"
#include "smem_banks.h"

namespace {

struct bank_case {
    const char *name;
    int threads;
    std::function<void(unsigned char *sm, int lane)> body;
    loom_emu::bank_totals want; // requests, lanes, wavefronts, least
};

uint32_t *w4(unsigned char *sm, int off) {
    return (uint32_t *)(sm + off);
}
uint64_t *w8(unsigned char *sm, int off) {
    return (uint64_t *)(sm + off);
}

const bank_case cases[] = {
    {"4-byte words in a row",
     32,
     [](unsigned char *sm, int l) { __sanitizer_cov_store4(w4(sm, 4 * l)); },
     {1, 32, 1, 1}},
    {"every other word: 2-way",
     32,
     [](unsigned char *sm, int l) { __sanitizer_cov_store4(w4(sm, 8 * l)); },
     {1, 32, 2, 1}},
    {"a column of a 32-word row: 32-way",
     32,
     [](unsigned char *sm, int l) { __sanitizer_cov_store4(w4(sm, 128 * l)); },
     {1, 32, 32, 1}},
    {"one word read by all: a broadcast",
     32,
     [](unsigned char *sm, int) { __sanitizer_cov_load4(w4(sm, 64)); },
     {1, 32, 1, 1}},
    {"16 bytes a lane, stored as two halves",
     32,
     [](unsigned char *sm, int l) {
         __sanitizer_cov_store8(w8(sm, 16 * l));
         __sanitizer_cov_store8(w8(sm, 16 * l + 8));
     },
     {1, 32, 4, 4}},
    {"16 bytes a lane, 32 bytes apart: 2-way",
     32,
     [](unsigned char *sm, int l) {
         __sanitizer_cov_store8(w8(sm, 32 * l));
         __sanitizer_cov_store8(w8(sm, 32 * l + 8));
     },
     {1, 32, 8, 4}},
    {"adjacent words across a 16-byte line: two requests",
     32,
     [](unsigned char *sm, int l) {
         __sanitizer_cov_store4(w4(sm, 16 * l + 12));
         __sanitizer_cov_store4(w4(sm, 16 * l + 16));
     },
     {2, 64, 8, 2}},
    {"two instructions",
     32,
     [](unsigned char *sm, int l) {
         __sanitizer_cov_store4(w4(sm, 4 * l));
         __sanitizer_cov_store4(w4(sm, 128 * l));
     },
     {2, 64, 33, 2}},
    {"a __syncwarp between adjacent words",
     32,
     [](unsigned char *sm, int l) {
         __sanitizer_cov_store4(w4(sm, 8 * l));
         __syncwarp();
         __sanitizer_cov_store4(w4(sm, 8 * l + 4));
     },
     {2, 64, 4, 2}},
    /* paired by position in the lane's accesses, lanes 0-15's first store would meet lanes
       16-31's second (words 0-15 and 32-47: 2-way) */
    {"half the lanes store once more first: paired by instruction",
     32,
     [](unsigned char *sm, int l) {
         if (l < 16) __sanitizer_cov_store4(w4(sm, 4 * l));
         __sanitizer_cov_store4(w4(sm, 4 * l + 64));
     },
     {2, 48, 2, 2}},
    {"cp.async, 16 bytes a lane, 32 bytes apart: 2-way",
     32,
     [](unsigned char *sm, int l) {
         alignas(16) static const unsigned char src[16] = {0};
         loom_emu_cp_async16(sm + 32 * l, src, 16);
         loom_emu_cp_async_commit();
         loom_emu_cp_async_wait(0);
     },
     {1, 32, 8, 4}},
    {"two warps: a request each",
     64,
     [](unsigned char *sm, int l) { __sanitizer_cov_store4(w4(sm, 128 * (l % 32))); },
     {2, 64, 64, 2}},
};

} // namespace

namespace emu_smem_banks {

int run_all(bool verbose) {
    int bad = 0;
    for (const bank_case &c : cases) {
        loom_emu::banks_begin();
        loom_emu::launch(dim3(1, 1, 1), dim3((unsigned)c.threads, 1, 1), 8192,
                         [&c] { c.body(loom_emu::dynamic_smem(), (int)threadIdx.x); });
        const loom_emu::bank_totals got = loom_emu::banks_end();
        const loom_emu::bank_totals &w = c.want;
        const bool ok = got.requests == w.requests && got.lanes == w.lanes &&
                        got.wavefronts == w.wavefronts && got.least == w.least;
        if (!ok || verbose)
            printf("%s smem banks: %-62s requests %llu lanes %llu wavefronts %llu least %llu%s\n",
                   ok ? " " : "FAIL", c.name, (unsigned long long)got.requests,
                   (unsigned long long)got.lanes, (unsigned long long)got.wavefronts,
                   (unsigned long long)got.least, ok ? "" : " (not as the model says)");
        if (!ok) bad++;
    }
    return bad;
}

} // namespace emu_smem_banks
