/* cpu_hadamard.c — the KV rotation of loom_backend.h (LOOM_KV_HADAMARD): x <- H x with
 * H = W_n / sqrt(n), W_n the Sylvester-Hadamard matrix, in place, by the fast transform (log2 n
 * passes of butterflies a + b, a - b, then one scaling). The butterflies run in a fixed order
 * and every element takes the same operations, so a row's result depends on nothing but the
 * row: kv_store and attention rotate a vector identically wherever it comes from. */
#include "backend/cpu/cpu_internal.h"

#include <math.h>

void loom__cpu_hadamard(float *x, int32_t n) {
    for (int32_t h = 1; h < n; h *= 2)
        for (int32_t i = 0; i < n; i += 2 * h)
            for (int32_t j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    const float s = 1.0f / sqrtf((float)n); /* exact for n a power of 4 (256: 1/16) */
    for (int32_t i = 0; i < n; i++) x[i] *= s;
}
