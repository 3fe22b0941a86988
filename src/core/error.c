/* error.c — the calling thread's last-error message behind loom__fail and friends
 * (core/status.h). Compiled into libloom and into the plugins built from loom's sources: a
 * plugin sets loom__error_sink to its host's set_error, so each message it records also
 * reaches the application's loom_last_error(). */
#include "core/status.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define LOOM_ERROR_CAP 512

static _Thread_local char tls_error[LOOM_ERROR_CAP];

loom__error_sink_fn _Atomic loom__error_sink;

const char *loom__error_message(void) {
    return tls_error;
}

static void recorded(void) {
    loom__error_sink_fn sink = atomic_load_explicit(&loom__error_sink, memory_order_relaxed);
    if (sink != NULL) sink(tls_error);
}

void loom__clear_error(void) {
    tls_error[0] = '\0';
}

loom_status loom__fail(loom_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_error, sizeof tls_error, fmt, ap);
    va_end(ap);
    recorded();
    return status;
}

void loom__error_prefix(const char *fmt, ...) {
    char prefix[LOOM_ERROR_CAP];
    char old[LOOM_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tls_error, sizeof old);
    /* Assemble by hand: the message is cut at the buffer's end on purpose. */
    size_t n = strlen(prefix);
    if (n > sizeof tls_error - 3) n = sizeof tls_error - 3;
    memcpy(tls_error, prefix, n);
    memcpy(tls_error + n, ": ", 2);
    size_t room = sizeof tls_error - n - 3, m = strlen(old);
    if (m > room) m = room;
    memcpy(tls_error + n + 2, old, m);
    tls_error[n + 2 + m] = '\0';
    recorded();
}
