/* plugin_host.c — core/status.h's and core/log.h's functions for code built into a plugin
 * (plugin_host.h): messages are formatted here and forwarded to the host. */
#include "backend/plugin/plugin_host.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "core/status.h"

#define LOOM_ERROR_CAP 512

static const loom_backend_host *g_host;
static _Thread_local char tls_error[LOOM_ERROR_CAP];

void loom__plugin_set_host(const loom_backend_host *host) {
    g_host = host;
}

static void forward(void) {
    if (g_host != NULL && g_host->set_error != NULL) g_host->set_error(tls_error);
}

void loom__clear_error(void) {
    tls_error[0] = '\0';
}

loom_status loom__fail(loom_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_error, sizeof tls_error, fmt, ap);
    va_end(ap);
    forward();
    return status;
}

void loom__error_prefix(const char *fmt, ...) {
    char prefix[LOOM_ERROR_CAP], old[LOOM_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tls_error, sizeof old);
    /* Assembled by hand: the message is cut at the buffer's end on purpose. */
    size_t n = strnlen(prefix, sizeof tls_error - 3), m = strlen(old);
    memcpy(tls_error, prefix, n);
    memcpy(tls_error + n, ": ", 2);
    if (m > sizeof tls_error - n - 3) m = sizeof tls_error - n - 3;
    memcpy(tls_error + n + 2, old, m);
    tls_error[n + 2 + m] = '\0';
    forward();
}

void loom__log(loom_log_level level, const char *fmt, ...) {
    if (g_host == NULL || g_host->log == NULL) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    g_host->log(level, line);
}
