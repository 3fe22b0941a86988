/* status.h — setting the thread-local error message, and the early-return macros every
 * fallible internal function uses (zstd's RETURN_ERROR_IF / FORWARD_IF_ERROR pattern). */
#pragma once

#include "loom.h"

#if defined(__GNUC__)
#define LOOM_PRINTF(fmt_idx, args_idx) __attribute__((format(printf, fmt_idx, args_idx)))
#else
#define LOOM_PRINTF(fmt_idx, args_idx)
#endif

/* Records a formatted message as the calling thread's last error and returns status, so a
 * failure reads `return loom__fail(LOOM_ERR_IO, "open %s: %s", path, strerror(errno));`. */
loom_status loom__fail(loom_status status, const char *fmt, ...) LOOM_PRINTF(2, 3);

/* Clears the calling thread's last error (public entry points call it on entry). */
void loom__clear_error(void);

/* Prepends "prefix: " to the current thread-local message (adds context on the way up). */
void loom__error_prefix(const char *fmt, ...) LOOM_PRINTF(1, 2);

/* The calling thread's message (what loom_last_error returns). */
const char *loom__error_message(void);

/* NULL in libloom. A plugin built from loom's sources points it at its host's set_error, so
 * every message it records reaches the application too (backend/plugin/plugin_host.c). */
typedef void (*loom__error_sink_fn)(const char *message);
extern loom__error_sink_fn _Atomic loom__error_sink;

#define LOOM_RETURN_IF(cond, status, ...)                                                          \
    do {                                                                                           \
        if (cond) {                                                                                \
            (void)loom__fail((status), __VA_ARGS__);                                               \
            return (status); /* a constant the compiler sees is not LOOM_OK */                     \
        }                                                                                          \
    } while (0)

#define LOOM_TRY(expr)                                                                             \
    do {                                                                                           \
        loom_status loom__st = (expr);                                                             \
        if (loom__st != LOOM_OK) return loom__st;                                                  \
    } while (0)

/* Jumps to a cleanup label instead of returning (for functions that own resources). */
#define LOOM_TRY_GOTO(st_var, expr, label)                                                         \
    do {                                                                                           \
        (st_var) = (expr);                                                                         \
        if ((st_var) != LOOM_OK) goto label;                                                       \
    } while (0)

#define LOOM_CHECK_ARG(cond)                                                                       \
    LOOM_RETURN_IF(!(cond), LOOM_ERR_INVALID_ARG, "%s: invalid argument: %s", __func__, #cond)
