/* gguf.c — opening a GGUF image (mapped file or caller memory), the header, the order of the
 * parse steps, closing, and the plain accessors. The sections themselves are parsed in
 * gguf_meta.c (key/values) and gguf_tensors.c (tensor infos); lookups use gguf_index.c.
 *
 * Layout of a file (little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv
 * key/values, n_tensors tensor infos, padding up to the alignment, then the data section that
 * tensor offsets are relative to. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/pages.h"
#include "gguf/gguf_impl.h"

/* ---- header ---------------------------------------------------------------------------------- */

static loom_status check_version(uint32_t v) {
    if (v == 2 || v == 3) return LOOM_OK;
    uint32_t swapped = __builtin_bswap32(v);
    LOOM_RETURN_IF(swapped >= 1 && swapped <= 3, LOOM_ERR_UNSUPPORTED,
                   "gguf: version field 0x%08" PRIx32 " is a big-endian file (version %" PRIu32
                   "); only little-endian files are supported",
                   v, swapped);
    return loom__fail(LOOM_ERR_UNSUPPORTED,
                      "gguf: version %" PRIu32 " not supported (loom reads versions 2 and 3)", v);
}

/* Reads the header and returns the two counts, each bounded by what the rest of the file can
 * hold, so the allocations they size stay proportional to the file. */
static loom_status parse_header(loom__gguf *g, loom__gguf_reader *r, int64_t *n_tensors,
                                int64_t *n_kv) {
    const uint8_t *magic = NULL;
    uint64_t nt = 0, nkv = 0;
    if (loom__gguf_take(r, 4, "magic", &magic) != LOOM_OK)
        return loom__fail(LOOM_ERR_BAD_MODEL, "gguf: header: magic: file too small (%zu bytes)",
                          r->size);
    LOOM_RETURN_IF(memcmp(magic, "GGUF", 4) != 0, LOOM_ERR_BAD_MODEL,
                   "gguf: header: bad magic %02x %02x %02x %02x (expected \"GGUF\")", magic[0],
                   magic[1], magic[2], magic[3]);
    loom_status st = loom__gguf_read_u32(r, "version", &g->version);
    if (st == LOOM_OK) st = check_version(g->version);
    if (st == LOOM_OK) st = loom__gguf_read_u64(r, "n_tensors", &nt);
    if (st == LOOM_OK) st = loom__gguf_read_u64(r, "n_kv", &nkv);
    if (st != LOOM_OK) {
        if (st == LOOM_ERR_BAD_MODEL) loom__error_prefix("gguf: header");
        return st;
    }

    uint64_t left = loom__gguf_remaining(r);
    LOOM_RETURN_IF(nkv > left / LOOM__GGUF_MIN_KV_BYTES, LOOM_ERR_BAD_MODEL,
                   "gguf: header: n_kv %" PRIu64 " too large for the file (each kv needs at least "
                   "%u bytes, %" PRIu64 " remain)",
                   nkv, LOOM__GGUF_MIN_KV_BYTES, left);
    LOOM_RETURN_IF(nt > left / LOOM__GGUF_MIN_TENSOR_INFO_BYTES, LOOM_ERR_BAD_MODEL,
                   "gguf: header: n_tensors %" PRIu64 " too large for the file (each tensor info "
                   "needs at least %u bytes, %" PRIu64 " remain)",
                   nt, LOOM__GGUF_MIN_TENSOR_INFO_BYTES, left);
    /* Each product is at most left, so the sum cannot overflow. */
    LOOM_RETURN_IF(nkv * LOOM__GGUF_MIN_KV_BYTES + nt * LOOM__GGUF_MIN_TENSOR_INFO_BYTES > left,
                   LOOM_ERR_BAD_MODEL,
                   "gguf: header: n_kv %" PRIu64 " and n_tensors %" PRIu64
                   " too large for the file (%" PRIu64 " bytes remain)",
                   nkv, nt, left);
    *n_tensors = (int64_t)nt;
    *n_kv = (int64_t)nkv;
    return LOOM_OK;
}

/* ---- open / close ---------------------------------------------------------------------------- */

/* Parses g->base[0..size) into g; on failure g holds whatever was built, for loom__gguf_close. */
static loom_status parse(loom__gguf *g) {
    loom__gguf_reader r = {g->base, g->size, 0};
    int64_t n_tensors = 0, n_kv = 0;
    LOOM_TRY(parse_header(g, &r, &n_tensors, &n_kv));
    LOOM_TRY(loom__gguf_parse_kvs(g, &r, n_kv));
    LOOM_TRY(loom__gguf_parse_tensor_infos(g, &r, n_tensors));
    LOOM_RETURN_IF(loom__align_up_u64(r.pos, g->alignment, &g->data_offset), LOOM_ERR_BAD_MODEL,
                   "gguf: data section offset overflows (alignment %" PRIu64 ")", g->alignment);
    return loom__gguf_place_tensors(g);
}

/* Takes ownership of map (may be NULL) whatever the outcome. */
static loom_status open_image(const void *data, size_t size, void *map, loom__gguf **out) {
    loom__gguf *g = loom__calloc(1, sizeof *g);
    if (!g) {
        if (map) munmap(map, size);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "gguf: out of memory");
    }
    g->base = data;
    g->size = size;
    g->map = map;
    g->alignment = LOOM_GGUF_DEFAULT_ALIGNMENT;
    loom_status st = parse(g);
    if (st != LOOM_OK) {
        loom__gguf_close(g);
        return st;
    }
    *out = g;
    return LOOM_OK;
}

loom_status loom__gguf_open_memory(const void *data, size_t size, loom__gguf **out) {
    LOOM_CHECK_ARG(out != NULL);
    LOOM_CHECK_ARG(data != NULL || size == 0);
    static const uint8_t empty[1];
    return open_image(data ? data : empty, size, NULL, out);
}

loom_status loom__gguf_open(const char *path, loom__gguf **out) {
    LOOM_CHECK_ARG(path != NULL);
    LOOM_CHECK_ARG(out != NULL);
    /* O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; what is not a
     * regular file is refused below, and the flag changes nothing for one that is. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    LOOM_RETURN_IF(fd < 0, LOOM_ERR_IO, "gguf: open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return loom__fail(LOOM_ERR_IO, "gguf: stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return loom__fail(LOOM_ERR_IO, "gguf: '%s' is not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size == 0) { /* mmap refuses length 0; an empty file is simply not a GGUF file */
        close(fd);
        return loom__fail(LOOM_ERR_BAD_MODEL, "gguf: '%s': header: magic: file too small (0 bytes)",
                          path);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file referenced */
    LOOM_RETURN_IF(map == MAP_FAILED, LOOM_ERR_IO, "gguf: mmap '%s' (%zu bytes): %s", path, size,
                   strerror(e));
    return open_image(map, size, map, out);
}

void loom__gguf_close(loom__gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) loom__gguf_value_free(&g->kvs[i].value);
    free(g->kvs);
    for (int64_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->tensors);
    loom__gguf_index_free(&g->kv_index);
    loom__gguf_index_free(&g->tensor_index);
    if (g->map) munmap(g->map, g->size);
    free(g);
}

/* ---- accessors ------------------------------------------------------------------------------- */

uint32_t loom__gguf_version(const loom__gguf *g) {
    return g->version;
}
uint64_t loom__gguf_alignment(const loom__gguf *g) {
    return g->alignment;
}
size_t loom__gguf_file_size(const loom__gguf *g) {
    return g->size;
}
const char *loom__gguf_image(const loom__gguf *g) {
    return (const char *)g->base;
}

uint64_t loom__gguf_data_offset(const loom__gguf *g) {
    return g->data_offset;
}

void loom__gguf_release_data(loom__gguf *g) {
    uintptr_t begin, end;
    if (!g || !g->map || g->data_offset >= g->size ||
        !loom__whole_pages((char *)g->map + g->data_offset, g->size - g->data_offset, &begin, &end))
        return;
    /* A private read-only file mapping: the pages go, the mapping stays, and a later read
     * faults them back in from the file. */
    (void)madvise((void *)begin, end - begin, MADV_DONTNEED);
}

int64_t loom__gguf_n_kv(const loom__gguf *g) {
    return g->n_kv;
}

const loom__gguf_kv *loom__gguf_kv_at(const loom__gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? &g->kvs[i] : NULL;
}

const loom__gguf_kv *loom__gguf_find_kv(const loom__gguf *g, const char *key) {
    if (!key) return NULL;
    int64_t i = loom__gguf_index_find(&g->kv_index, key, strlen(key));
    return i >= 0 ? &g->kvs[i] : NULL;
}

int64_t loom__gguf_n_tensors(const loom__gguf *g) {
    return g->n_tensors;
}

const loom__gguf_tensor *loom__gguf_tensor_at(const loom__gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const loom__gguf_tensor *loom__gguf_find_tensor(const loom__gguf *g, const char *name) {
    if (!name) return NULL;
    int64_t i = loom__gguf_index_find(&g->tensor_index, name, strlen(name));
    return i >= 0 ? &g->tensors[i] : NULL;
}
