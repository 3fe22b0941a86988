/* gguf_impl.h — internals shared by the gguf_*.c files: the loom__gguf object, the bounds-checked
 * little-endian cursor every parse step reads through, and the name index (hash table).
 * Not for use outside src/gguf/gguf*.c. */
#pragma once

#include <inttypes.h>
#include <string.h>

#include "core/hash.h"
#include "core/status.h"
#include "gguf/gguf.h"

/* Smallest encodings, used to bound counts by the bytes that remain before allocating:
 * a kv is key length (8) + at least 1 key byte + value type (4) + at least 1 value byte;
 * a tensor info is name length (8) + at least 1 name byte + n_dims (4) + at least one dim (8)
 * + type (4) + offset (8); a string is its length (8); a nested array is its element type (4)
 * and count (8). */
#define LOOM__GGUF_MIN_KV_BYTES          14u
#define LOOM__GGUF_MIN_TENSOR_INFO_BYTES 33u
#define LOOM__GGUF_MIN_STR_BYTES         8u
#define LOOM__GGUF_MIN_ARR_BYTES         12u

/* ---- name index ------------------------------------------------------------------------------ */
/* Open addressing over (ptr, len) names that live elsewhere (the image or owned copies); the
 * index stores only references, so it must not outlive the names. */
typedef struct loom__gguf_slot {
    const char *ptr;
    uint64_t len;
    uint64_t hash;
    int64_t idx; /* -1: empty */
} loom__gguf_slot;

typedef struct loom__gguf_index {
    loom__gguf_slot *slots;
    uint64_t mask;      /* capacity - 1 (capacity a power of two, at least twice the entries) */
    loom__hash_key key; /* random per index: file-chosen names cannot aim at one slot */
} loom__gguf_index;

/* Sizes the index for up to n entries. Errors: LOOM_ERR_OUT_OF_MEMORY. */
loom_status loom__gguf_index_init(loom__gguf_index *ix, int64_t n);
void loom__gguf_index_free(loom__gguf_index *ix);
/* Inserts name -> idx. Returns -1 when inserted, or the index of an earlier entry with the same
 * name (nothing inserted). At most the n entries given to init may be inserted. */
int64_t loom__gguf_index_insert(loom__gguf_index *ix, const char *ptr, uint64_t len, int64_t idx);
/* The entry index of name, or -1. An uninitialised (zeroed) index finds nothing. */
int64_t loom__gguf_index_find(const loom__gguf_index *ix, const char *ptr, uint64_t len);

/* ---- the object ------------------------------------------------------------------------------ */
struct loom__gguf {
    const uint8_t *base; /* the image: base[0..size) */
    size_t size;
    void *map; /* the mapping when loom__gguf_open mapped the file (length size), else NULL */

    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset; /* file offset of the data section */

    int64_t n_kv;
    loom__gguf_kv *kvs; /* [n_kv], zero-initialised so a half-parsed array frees cleanly */
    loom__gguf_index kv_index;

    int64_t n_tensors;
    loom__gguf_tensor *tensors; /* [n_tensors] */
    loom__gguf_index tensor_index;
};

/* ---- bounds-checked cursor ------------------------------------------------------------------- */
typedef struct loom__gguf_reader {
    const uint8_t *base;
    size_t size;
    size_t pos; /* invariant: pos <= size */
} loom__gguf_reader;

static inline uint64_t loom__gguf_remaining(const loom__gguf_reader *r) {
    return (uint64_t)(r->size - r->pos);
}

/* Hands out the next n bytes, or fails naming field when fewer remain. */
static inline loom_status loom__gguf_take(loom__gguf_reader *r, uint64_t n, const char *field,
                                          const uint8_t **out) {
    if (n > loom__gguf_remaining(r)) {
        /* The constant return (not loom__fail's) lets the compiler see *out is set on LOOM_OK. */
        loom__fail(LOOM_ERR_BAD_MODEL,
                   "%s: %" PRIu64 " bytes at offset %zu past end of file (%zu bytes)", field, n,
                   r->pos, r->size);
        return LOOM_ERR_BAD_MODEL;
    }
    *out = r->base + r->pos;
    r->pos += (size_t)n;
    return LOOM_OK;
}

/* Little-endian decoding byte by byte: independent of host order and of alignment. */
static inline uint16_t loom__gguf_le16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t loom__gguf_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t loom__gguf_le64(const uint8_t *p) {
    return (uint64_t)loom__gguf_le32(p) | (uint64_t)loom__gguf_le32(p + 4) << 32;
}

static inline loom_status loom__gguf_read_u32(loom__gguf_reader *r, const char *field,
                                              uint32_t *out) {
    const uint8_t *p;
    LOOM_TRY(loom__gguf_take(r, 4, field, &p));
    *out = loom__gguf_le32(p);
    return LOOM_OK;
}
static inline loom_status loom__gguf_read_u64(loom__gguf_reader *r, const char *field,
                                              uint64_t *out) {
    const uint8_t *p;
    LOOM_TRY(loom__gguf_take(r, 8, field, &p));
    *out = loom__gguf_le64(p);
    return LOOM_OK;
}

/* Reads a length-prefixed string; what names it in messages ("key", "string", "name"). */
static inline loom_status loom__gguf_read_str(loom__gguf_reader *r, const char *what,
                                              loom__gguf_str *out) {
    uint64_t len;
    const uint8_t *p;
    /* Constant returns, as in loom__gguf_take, so *out is visibly set on LOOM_OK. */
    if (loom__gguf_remaining(r) < 8) {
        loom__fail(LOOM_ERR_BAD_MODEL,
                   "%s length: 8 bytes at offset %zu past end of file (%zu bytes)", what, r->pos,
                   r->size);
        return LOOM_ERR_BAD_MODEL;
    }
    len = loom__gguf_le64(r->base + r->pos);
    r->pos += 8;
    if (len > loom__gguf_remaining(r)) {
        loom__fail(LOOM_ERR_BAD_MODEL,
                   "%s length %" PRIu64 " past end of file (at offset %zu, %" PRIu64
                   " bytes remain)",
                   what, len, r->pos, loom__gguf_remaining(r));
        return LOOM_ERR_BAD_MODEL;
    }
    LOOM_TRY(loom__gguf_take(r, len, what, &p));
    out->ptr = (const char *)p;
    out->len = len;
    return LOOM_OK;
}

/* Bytes of one element of a fixed-size value type; 0 for STR, ARR and unknown types. */
static inline uint64_t loom__gguf_vtype_size(uint32_t t) {
    switch (t) {
    case LOOM_GGUF_U8:
    case LOOM_GGUF_I8:
    case LOOM_GGUF_BOOL:
        return 1;
    case LOOM_GGUF_U16:
    case LOOM_GGUF_I16:
        return 2;
    case LOOM_GGUF_U32:
    case LOOM_GGUF_I32:
    case LOOM_GGUF_F32:
        return 4;
    case LOOM_GGUF_U64:
    case LOOM_GGUF_I64:
    case LOOM_GGUF_F64:
        return 8;
    default:
        return 0;
    }
}

/* ---- parse steps (each leaves g in a state loom__gguf_close can free, even on failure) --------
 */

/* Reads n_kv key/values at r (allocates g->kvs, fills g->kv_index), then applies
 * general.alignment. Errors: LOOM_ERR_BAD_MODEL, LOOM_ERR_OUT_OF_MEMORY. */
loom_status loom__gguf_parse_kvs(loom__gguf *g, loom__gguf_reader *r, int64_t n_kv);

/* Releases what a parsed (or half-parsed) value owns; the value itself is not freed. */
void loom__gguf_value_free(loom__gguf_value *v);

/* Reads n_tensors tensor infos at r and checks everything that does not depend on where the
 * data section starts. Errors: LOOM_ERR_BAD_MODEL, LOOM_ERR_UNSUPPORTED (tensor type),
 * LOOM_ERR_OUT_OF_MEMORY. */
loom_status loom__gguf_parse_tensor_infos(loom__gguf *g, loom__gguf_reader *r, int64_t n_tensors);

/* With g->data_offset known: checks each tensor's offset (alignment, bounds) and sets data. */
loom_status loom__gguf_place_tensors(loom__gguf *g);

/* Decodes one fixed-size scalar of type t (not STR or ARR) from the little-endian bytes at p
 * into v's union member for that type (gguf_meta.c). */
void loom__gguf_decode_scalar(uint32_t t, const uint8_t *p, loom__gguf_value *v);
