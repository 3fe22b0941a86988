/* cpu_plugin.c — the entry point of libloom-cpuplugin.so: the CPU backend built as a plugin
 * (test-only), which proves the plugin boundary with the backend loom has — the conformance
 * tests run through it and must give the built-in backend's bits. Not part of libloom. */
#include "backend/cpu/cpu_internal.h"
#include "backend/plugin/plugin_host.h"

LOOM_BACKEND_EXPORT loom_status loom_backend_entry(uint32_t abi_version,
                                                   const loom_backend_host *host,
                                                   const loom_backend_ops **ops);

LOOM_BACKEND_EXPORT loom_status loom_backend_entry(uint32_t abi_version,
                                                   const loom_backend_host *host,
                                                   const loom_backend_ops **ops) {
    return loom__plugin_entry(abi_version, host, loom__cpu_backend_ops(), "cpuplugin", ops);
}
