/* plugin_host.c — what a plugin built from loom's sources links instead of libloom's public
 * error and log entry points (plugin_host.h): core/error.c's messages are forwarded to the
 * host through loom__error_sink, and loom__log's lines go to the host's log. */
#include "backend/plugin/plugin_host.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "core/status.h"

/* Set by every entry call (each model load), read by any thread: atomics. */
static const loom_backend_host *_Atomic g_host;

void loom__plugin_set_host(const loom_backend_host *host) {
    atomic_store(&g_host, host);
    atomic_store(&loom__error_sink, host != NULL ? host->set_error : NULL);
}

void loom__log(loom_log_level level, const char *fmt, ...) {
    const loom_backend_host *h = atomic_load(&g_host);
    if (h == NULL || h->log == NULL) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    h->log(level, line);
}

loom_status loom__plugin_entry(uint32_t abi_version, const loom_backend_host *host,
                               const loom_backend_ops *table, const char *what,
                               const loom_backend_ops **ops) {
    if (host == NULL || ops == NULL) return LOOM_ERR_INVALID_ARG;
    loom__plugin_set_host(host);
    LOOM_RETURN_IF(abi_version != LOOM_BACKEND_ABI_VERSION || host->abi_version != abi_version,
                   LOOM_ERR_UNSUPPORTED, "%s: built for backend ABI %u, the host speaks %u", what,
                   (unsigned)LOOM_BACKEND_ABI_VERSION, (unsigned)abi_version);
    *ops = table;
    return LOOM_OK;
}
