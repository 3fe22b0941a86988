/* backend_plugin.c — finding, loading and checking a backend plugin, libloom-<name>.so: first in
 * the folder that holds libloom itself (the executable's, where libloom is linked statically),
 * then in each folder of $LOOM_BACKEND_PATH. A plugin that cannot be found or loaded is
 * NO_DEVICE; one that loads but speaks another ABI, or whose table lacks a slot, is refused
 * with a message naming the file. Nothing here aborts: dlopen's own errors become messages. */
#include "backend/backend.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/status.h"

/* ---- the host's callbacks ------------------------------------------------------------------ */

static void host_set_error(const char *message) {
    (void)loom__fail(LOOM_ERR_BACKEND, "%s", message ? message : "(no message)");
}

static void host_log(loom_log_level level, const char *message) {
    if (level < LOOM_LOG_DEBUG || level > LOOM_LOG_ERROR) level = LOOM_LOG_ERROR;
    loom__log(level, "%s", message ? message : "");
}

static const loom_backend_host g_host = {
    .abi_version = LOOM_BACKEND_ABI_VERSION,
    .set_error = host_set_error,
    .log = host_log,
};

const loom_backend_host *loom__backend_host(void) {
    return &g_host;
}

/* ---- search -------------------------------------------------------------------------------- */

/* The folder of the object that holds this code (libloom.so, or the executable), into dir. */
static bool own_folder(char *dir, size_t cap) {
    Dl_info info;
    if (dladdr((void *)&loom__backend_plugin_load, &info) == 0 || info.dli_fname == NULL)
        return false;
    const char *slash = strrchr(info.dli_fname, '/');
    if (slash == NULL) return snprintf(dir, cap, ".") < (int)cap;
    size_t n = (size_t)(slash - info.dli_fname);
    if (n + 1 > cap) return false;
    memcpy(dir, info.dli_fname, n);
    dir[n] = '\0';
    return true;
}

/* Appends "folder" to the list of places looked in (for the message), as room allows. */
static void note_place(char *list, size_t cap, const char *folder) {
    size_t n = strlen(list);
    if (n + 3 >= cap) return;
    snprintf(list + n, cap - n, "%s%s", n ? ", " : "", folder);
}

/* Whether folder/libloom-<name>.so exists; its path into path. */
static bool try_folder(const char *folder, const char *name, char *path, size_t cap) {
    if (folder[0] == '\0') return false;
    int n = snprintf(path, cap, "%s/libloom-%s.so", folder, name);
    return n > 0 && (size_t)n < cap && access(path, F_OK) == 0;
}

static bool find_plugin(const char *name, char *path, size_t cap, char *searched,
                        size_t searched_cap) {
    char dir[512];
    searched[0] = '\0';
    if (own_folder(dir, sizeof dir)) {
        note_place(searched, searched_cap, dir);
        if (try_folder(dir, name, path, cap)) return true;
    }
    const char *env = getenv("LOOM_BACKEND_PATH");
    while (env != NULL && *env != '\0') {
        const char *end = strchr(env, ':');
        size_t n = end ? (size_t)(end - env) : strlen(env);
        if (n > 0 && n < sizeof dir) {
            memcpy(dir, env, n);
            dir[n] = '\0';
            note_place(searched, searched_cap, dir);
            if (try_folder(dir, name, path, cap)) return true;
        }
        env = end ? end + 1 : NULL;
    }
    return false;
}

/* ---- loading ------------------------------------------------------------------------------- */

loom_status loom__backend_plugin_load(const char *name, const loom_backend_ops **ops, void **dl,
                                      char *path, size_t path_cap) {
    char searched[1024];
    if (!find_plugin(name, path, path_cap, searched, sizeof searched)) {
        const char *env = getenv("LOOM_BACKEND_PATH");
        path[0] = '\0';
        return loom__fail(LOOM_ERR_NO_DEVICE,
                          "backend %s: no plugin libloom-%s.so in %s (LOOM_BACKEND_PATH %s%s%s)",
                          name, name, searched[0] ? searched : "(nowhere)",
                          env ? "is \"" : "is not set", env ? env : "", env ? "\"" : "");
    }
    dlerror();
    /* RTLD_NODELETE: a plugin stays mapped after its last dlclose. A device runtime linked into
     * it (the CUDA runtime in libloom-cuda.so) registers exit handlers and thread-local
     * destructors that run at process exit, and would jump into unmapped code if the library
     * were gone (seen under ThreadSanitizer after AUTO passed over the cuda plugin). */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h == NULL) {
        const char *why = dlerror();
        return loom__fail(LOOM_ERR_NO_DEVICE, "backend %s: cannot load %s: %s", name, path,
                          why ? why : "unknown dlopen error");
    }
    loom_backend_entry_fn entry = NULL;
    void *sym = dlsym(h, LOOM_BACKEND_ENTRY_SYMBOL);
    memcpy(&entry, &sym, sizeof entry); /* a data pointer to a function pointer, portably */
    if (entry == NULL) {
        dlclose(h);
        return loom__fail(LOOM_ERR_BACKEND, "backend %s: %s exports no %s()", name, path,
                          LOOM_BACKEND_ENTRY_SYMBOL);
    }
    const loom_backend_ops *table = NULL;
    loom__clear_error();
    loom_status st = entry(LOOM_BACKEND_ABI_VERSION, &g_host, &table);
    if (st != LOOM_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", loom_last_error());
        dlclose(h);
        return loom__fail(st, "backend %s: %s refused to start (%s): %s", name, path,
                          loom_status_str(st), why[0] ? why : "no reason given");
    }
    char what[640];
    snprintf(what, sizeof what, "backend %s from %s", name, path);
    st = loom__backend_check_ops(table, what);
    if (st != LOOM_OK) {
        dlclose(h);
        return st;
    }
    LOOM_LOG_I("backend %s: loaded %s", name, path);
    *ops = table;
    *dl = h;
    return LOOM_OK;
}

void loom__backend_plugin_unload(void *dl) {
    if (dl != NULL) dlclose(dl);
}
