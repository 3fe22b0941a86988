// emu_smem_banks.cpp — smem_banks.cpp's model of shared-memory bank conflicts, shown on accesses
// whose cost is known: emulated warps report their accesses to the hooks clang's
// -fsanitize-coverage=trace-loads,trace-stores would call (here called directly, so the test
// needs no clang), and the wavefronts counted must be those of 32 banks of 4-byte words: a
// request, phase by phase (the warp for 4-byte accesses, half warps for 8, quarter warps for
// 16), takes as many as the most distinct words in one bank, at least its words / 32. Also
// shown: a lane's two 8-byte halves of a 16-byte access are one request; a warp collective
// separates requests; lanes that skip an access still pair with the others at the next one;
// cp.async's writes count as stores. Global memory (what is on the heap, as the kernel tests'
// device buffers are): the 32-byte sectors a request touches against its bytes / 32.
#include <stdio.h>
#include <stdlib.h>

#include <functional>

#include "emu_cases.h"
#include "kernel_emu.h"
#include "smem_banks.h"

namespace {

struct bank_case {
    const char *name;
    int threads;
    std::function<void(unsigned char *sm, int lane)> body;
    // shared: requests, lanes, wavefronts, least; global: requests, sectors, least
    loom_emu::bank_totals want;
};

uint32_t *w4(unsigned char *sm, int off) {
    return (uint32_t *)(sm + off);
}
uint64_t *w8(unsigned char *sm, int off) {
    return (uint64_t *)(sm + off);
}

// "Device memory" on the heap, as the kernel tests keep theirs (4 KB, 64-byte aligned).
unsigned char *g_mem() {
    static unsigned char *m = (unsigned char *)aligned_alloc(64, 4096);
    return m;
}

const bank_case cases[] = {
    {"4-byte words in a row",
     32,
     [](unsigned char *sm, int l) { __sanitizer_cov_store4(w4(sm, 4 * l)); },
     {1, 32, 1, 1, 0, 0, 0}},
    {"every other word: 2-way",
     32,
     [](unsigned char *sm, int l) { __sanitizer_cov_store4(w4(sm, 8 * l)); },
     {1, 32, 2, 1, 0, 0, 0}},
    {"a column of a 32-word row: 32-way",
     32,
     [](unsigned char *sm, int l) { __sanitizer_cov_store4(w4(sm, 128 * l)); },
     {1, 32, 32, 1, 0, 0, 0}},
    {"one word read by all: a broadcast",
     32,
     [](unsigned char *sm, int) { __sanitizer_cov_load4(w4(sm, 64)); },
     {1, 32, 1, 1, 0, 0, 0}},
    {"16 bytes a lane, stored as two halves",
     32,
     [](unsigned char *sm, int l) {
         __sanitizer_cov_store8(w8(sm, 16 * l));
         __sanitizer_cov_store8(w8(sm, 16 * l + 8));
     },
     {1, 32, 4, 4, 0, 0, 0}},
    {"16 bytes a lane, 32 bytes apart: 2-way",
     32,
     [](unsigned char *sm, int l) {
         __sanitizer_cov_store8(w8(sm, 32 * l));
         __sanitizer_cov_store8(w8(sm, 32 * l + 8));
     },
     {1, 32, 8, 4, 0, 0, 0}},
    /* phases: a quarter warp for 16 bytes a lane; here lanes 0-3 and 4-7 write rows 36 words
       apart (words 0-15 and 36-51: 2-way in banks 4-15), though the warp's 8 rows cover the
       banks evenly */
    {"16 bytes a lane, 2 rows 36 words apart a quarter warp: 2-way",
     32,
     [](unsigned char *sm, int l) {
         __sanitizer_cov_store8(w8(sm, 144 * (l >> 2) + 16 * (l & 3)));
         __sanitizer_cov_store8(w8(sm, 144 * (l >> 2) + 16 * (l & 3) + 8));
     },
     {1, 32, 8, 4, 0, 0, 0}},
    {"8 bytes a lane, both half warps the same words: read twice",
     32,
     [](unsigned char *sm, int l) { __sanitizer_cov_store8(w8(sm, 8 * (l % 16))); },
     {1, 32, 2, 2, 0, 0, 0}},
    {"adjacent words across a 16-byte line: two requests",
     32,
     [](unsigned char *sm, int l) {
         __sanitizer_cov_store4(w4(sm, 16 * l + 12));
         __sanitizer_cov_store4(w4(sm, 16 * l + 16));
     },
     {2, 64, 8, 2, 0, 0, 0}},
    {"two instructions",
     32,
     [](unsigned char *sm, int l) {
         __sanitizer_cov_store4(w4(sm, 4 * l));
         __sanitizer_cov_store4(w4(sm, 128 * l));
     },
     {2, 64, 33, 2, 0, 0, 0}},
    {"a __syncwarp between adjacent words",
     32,
     [](unsigned char *sm, int l) {
         __sanitizer_cov_store4(w4(sm, 8 * l));
         __syncwarp();
         __sanitizer_cov_store4(w4(sm, 8 * l + 4));
     },
     {2, 64, 4, 2, 0, 0, 0}},
    /* paired by position in the lane's accesses, lanes 0-15's first store would meet lanes
       16-31's second (words 0-15 and 32-47: 2-way) */
    {"half the lanes store once more first: paired by instruction",
     32,
     [](unsigned char *sm, int l) {
         if (l < 16) __sanitizer_cov_store4(w4(sm, 4 * l));
         __sanitizer_cov_store4(w4(sm, 4 * l + 64));
     },
     {2, 48, 2, 2, 0, 0, 0}},
    {"cp.async, 16 bytes a lane, 32 bytes apart: 2-way",
     32,
     [](unsigned char *sm, int l) {
         alignas(16) static const unsigned char src[16] = {0};
         loom_emu_cp_async16(sm + 32 * l, src, 16);
         loom_emu_cp_async_commit();
         loom_emu_cp_async_wait(0);
     },
     {1, 32, 8, 4, 0, 0, 0}},
    /* one cp.async instruction executed twice, the odd lanes zero-filling the first copy (no
       read): its reads pair with reads, its writes with writes (counted together, a zero fill
       would shift the odd lanes' second write into the first request) */
    {"cp.async twice, odd lanes zero-fill the first: reads and writes paired apart",
     32,
     [](unsigned char *sm, int l) {
         for (int i = 0; i < 2; i++)
             loom_emu_cp_async16(sm + 512 * i + 16 * l, g_mem() + 16 * l,
                                 i == 0 && (l & 1) ? 0 : 16);
         loom_emu_cp_async_commit();
         loom_emu_cp_async_wait(0);
     },
     {2, 64, 8, 8, 2, 32, 24}},
    /* global memory (the heap): 32-byte sectors against the bytes / 32 */
    {"global: 4-byte words in a row",
     32,
     [](unsigned char *, int l) { __sanitizer_cov_load4((uint32_t *)(g_mem() + 4 * l)); },
     {0, 0, 0, 0, 1, 4, 4}},
    {"global: 4-byte words 128 bytes apart",
     32,
     [](unsigned char *, int l) { __sanitizer_cov_load4((uint32_t *)(g_mem() + 128 * l)); },
     {0, 0, 0, 0, 1, 32, 4}},
    {"global: one word read by all",
     32,
     [](unsigned char *, int) { __sanitizer_cov_load4((uint32_t *)(g_mem() + 256)); },
     {0, 0, 0, 0, 1, 1, 1}},
    {"global: 16 bytes a lane as two halves",
     32,
     [](unsigned char *, int l) {
         __sanitizer_cov_store8((uint64_t *)(g_mem() + 16 * l));
         __sanitizer_cov_store8((uint64_t *)(g_mem() + 16 * l + 8));
     },
     {0, 0, 0, 0, 1, 16, 16}},
    {"global: 4-byte words in a row from 4 bytes past a sector",
     32,
     [](unsigned char *, int l) { __sanitizer_cov_load4((uint32_t *)(g_mem() + 4 + 4 * l)); },
     {0, 0, 0, 0, 1, 5, 4}},
    {"two warps: a request each",
     64,
     [](unsigned char *sm, int l) { __sanitizer_cov_store4(w4(sm, 128 * (l % 32))); },
     {2, 64, 64, 2, 0, 0, 0}},
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
                        got.wavefronts == w.wavefronts && got.least == w.least &&
                        got.g_requests == w.g_requests && got.sectors == w.sectors &&
                        got.sectors_least == w.sectors_least;
        if (!ok || verbose)
            printf("%s smem banks: %-62s shared: requests %llu lanes %llu wavefronts %llu least "
                   "%llu; global: requests %llu sectors %llu least %llu%s\n",
                   ok ? " " : "FAIL", c.name, (unsigned long long)got.requests,
                   (unsigned long long)got.lanes, (unsigned long long)got.wavefronts,
                   (unsigned long long)got.least, (unsigned long long)got.g_requests,
                   (unsigned long long)got.sectors, (unsigned long long)got.sectors_least,
                   ok ? "" : " (not as the model says)");
        if (!ok) bad++;
    }
    return bad;
}

} // namespace emu_smem_banks
