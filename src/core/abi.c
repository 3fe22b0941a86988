/* abi.c — copying loom.h's versioned structs (abi.h). */
#include "core/abi.h"

#include <string.h>

#include "core/status.h"

void loom__abi_init(void *p, size_t size) {
    if (p == NULL || size < sizeof(size_t)) return;
    memset(p, 0, size);
    memcpy(p, &size, sizeof size);
}

void loom__abi_defaults_out(void *p, size_t size, const void *defaults, size_t own) {
    if (p == NULL || size < sizeof(size_t)) return;
    loom__abi_init(p, size);
    const size_t k = size < own ? size : own;
    memcpy((char *)p + sizeof(size_t), (const char *)defaults + sizeof(size_t), k - sizeof(size_t));
}

static size_t size_of(const void *s) {
    size_t n;
    memcpy(&n, s, sizeof n);
    return n;
}

loom_status loom__abi_params_in(void *dst, size_t own, const void *caller, size_t min,
                                const char *what) {
    if (caller == NULL) return LOOM_OK;
    const size_t n = size_of(caller);
    LOOM_RETURN_IF(n < min, LOOM_ERR_INVALID_ARG,
                   "%s: size %zu is smaller than any loom_%s ever was (%zu): set it with "
                   "sizeof, or start from the *_default_params() function",
                   what, n, what, min);
    if (n > own) {
        const unsigned char *tail = (const unsigned char *)caller + own;
        for (size_t i = 0; i < n - own; i++)
            LOOM_RETURN_IF(tail[i] != 0, LOOM_ERR_UNSUPPORTED,
                           "%s: byte %zu is set, but this library's loom_%s ends at %zu "
                           "(a field of a newer loom)",
                           what, own + i, what, own);
    }
    memcpy(dst, caller, n < own ? n : own);
    memcpy(dst, &own, sizeof own);
    return LOOM_OK;
}

loom_status loom__abi_result_out(void *caller, const void *src, size_t own, size_t min,
                                 const char *what) {
    LOOM_RETURN_IF(caller == NULL, LOOM_ERR_INVALID_ARG, "%s: NULL result", what);
    const size_t n = size_of(caller);
    LOOM_RETURN_IF(n < min, LOOM_ERR_INVALID_ARG,
                   "%s: size %zu is smaller than any loom_%s ever was (%zu): set it to "
                   "sizeof before the call",
                   what, n, what, min);
    const size_t k = n < own ? n : own;
    memcpy((char *)caller + sizeof(size_t), (const char *)src + sizeof(size_t), k - sizeof(size_t));
    return LOOM_OK;
}
