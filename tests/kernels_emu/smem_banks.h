// smem_banks.h — counting shared-memory wavefronts by hand (smem_banks.cpp's model), for its own
// test (emu_smem_banks.cpp): between banks_begin and banks_end, every shared access reported to
// the __sanitizer_cov_load / store hooks from an emulated kernel is counted into the totals
// instead of the report. The hooks may be called directly, as that test does.
#pragma once

#include <stdint.h>

namespace loom_emu {

struct bank_totals {
    uint64_t requests, lanes, wavefronts, least; // shared memory
    uint64_t g_requests, sectors, sectors_least; // global memory
};

void banks_begin();
bank_totals banks_end();

} // namespace loom_emu

extern "C" {
void __sanitizer_cov_load4(uint32_t *p);
void __sanitizer_cov_store4(uint32_t *p);
void __sanitizer_cov_store8(uint64_t *p);
}
