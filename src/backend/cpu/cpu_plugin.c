/* cpu_plugin.c — the entry point of libloom-cpuplugin.so: the CPU backend built as a plugin
 * (test-only), which proves the plugin boundary with the backend loom has — the conformance
 * tests run through it and must give the built-in backend's bits. Not part of libloom. */
#include "backend/cpu/cpu_internal.h"
#include "backend/plugin/plugin_host.h"

#include "core/status.h"

LOOM_BACKEND_EXPORT loom_status loom_backend_entry(uint32_t abi_version,
                                                   const loom_backend_host *host,
                                                   const loom_backend_ops **ops);

LOOM_BACKEND_EXPORT loom_status loom_backend_entry(uint32_t abi_version,
                                                   const loom_backend_host *host,
                                                   const loom_backend_ops **ops) {
    if (host == NULL || ops == NULL) return LOOM_ERR_INVALID_ARG;
    loom__plugin_set_host(host);
    LOOM_RETURN_IF(abi_version != LOOM_BACKEND_ABI_VERSION || host->abi_version != abi_version,
                   LOOM_ERR_UNSUPPORTED, "cpuplugin: built for backend ABI %u, the host speaks %u",
                   (unsigned)LOOM_BACKEND_ABI_VERSION, (unsigned)abi_version);
    *ops = loom__cpu_backend_ops();
    return LOOM_OK;
}
