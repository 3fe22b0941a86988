/* gguf.h — reading GGUF model files (versions 2 and 3): metadata key/values and tensor views.
 *
 * The file is mapped read-only (or taken from caller memory) and parsed once. Keys, string
 * values, fixed-size arrays and tensor data are zero-copy views into that image; the parser
 * only allocates for per-kv / per-tensor records, string arrays, nested arrays, tensor names and
 * the lookup tables. Every count, length, offset and size read from the file is checked
 * against the bytes that remain before anything is allocated or dereferenced, so a truncated or
 * corrupt file fails with LOOM_ERR_BAD_MODEL and a message naming the field (see
 * loom_last_error()) — never a crash or an allocation larger than a small multiple of the file.
 *
 * Limits loom enforces on top of the format (documented so a rejection is never a surprise):
 *   - keys: 1..LOOM_GGUF_MAX_KEY_LEN bytes, no NUL byte; duplicate keys are rejected;
 *   - tensor names: 1..LOOM_GGUF_MAX_KEY_LEN bytes, no NUL byte; duplicates are rejected;
 *   - arrays nest at most LOOM_GGUF_MAX_DEPTH levels (an array of arrays is depth 2);
 *   - bool values (scalar and array elements) must be 0 or 1;
 *   - general.alignment, when present, must be a uint32 that is a nonzero power of two;
 *   - tensors: 1..4 dims, each 0 <= ne < 2^63, the product of the nonzero dims fits int64_t,
 *     ne[0] a multiple of the type's block size, the type known to loom__type_get_traits
 *     (else LOOM_ERR_UNSUPPORTED), the data offset a multiple of the alignment and
 *     offset + size within the data section.
 * Only little-endian files are read (a byte-swapped version number is reported as such).
 *
 * Thread-safety: a loom__gguf is immutable after opening; any number of threads may read it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#define LOOM_GGUF_MAX_KEY_LEN       65535u /* longest key / tensor name accepted, in bytes */
#define LOOM_GGUF_MAX_DEPTH         8      /* deepest array nesting accepted */
#define LOOM_GGUF_DEFAULT_ALIGNMENT 32u

/* Value types; the numbers are the format's and never change. */
typedef enum loom__gguf_vtype {
    LOOM_GGUF_U8 = 0,
    LOOM_GGUF_I8 = 1,
    LOOM_GGUF_U16 = 2,
    LOOM_GGUF_I16 = 3,
    LOOM_GGUF_U32 = 4,
    LOOM_GGUF_I32 = 5,
    LOOM_GGUF_F32 = 6,
    LOOM_GGUF_BOOL = 7,
    LOOM_GGUF_STR = 8,
    LOOM_GGUF_ARR = 9,
    LOOM_GGUF_U64 = 10,
    LOOM_GGUF_I64 = 11,
    LOOM_GGUF_F64 = 12,
} loom__gguf_vtype;

/* A string inside the file image: ptr[0..len) — NOT NUL-terminated, may hold any bytes. */
typedef struct loom__gguf_str {
    const char *ptr;
    uint64_t len;
} loom__gguf_str;

typedef struct loom__gguf_value loom__gguf_value;
struct loom__gguf_value {
    loom__gguf_vtype type;
    union {
        uint64_t u64;       /* U8, U16, U32, U64 (widened) */
        int64_t i64;        /* I8, I16, I32, I64 (widened) */
        double f64;         /* F32 (widened) and F64 */
        bool b;             /* BOOL */
        loom__gguf_str str; /* STR */
        struct {
            loom__gguf_vtype elem_type;
            uint64_t n; /* element count */
            /* Fixed-size element types (everything but STR and ARR): pointer into the file
             * image, n little-endian elements, possibly unaligned — read them with
             * loom__gguf_arr_f32 / loom__gguf_arr_i64 or memcpy. NULL for STR and ARR. */
            const void *raw;
            /* elem_type STR: the n strings (owned by the loom__gguf); NULL otherwise or n == 0. */
            const loom__gguf_str *strs;
            /* elem_type ARR: the n nested arrays (type LOOM_GGUF_ARR each; owned by the
             * loom__gguf); NULL otherwise or n == 0. */
            const loom__gguf_value *items;
        } arr; /* ARR */
    };
};

typedef struct loom__gguf_kv {
    loom__gguf_str key; /* points into the file image */
    loom__gguf_value value;
} loom__gguf_kv;

typedef struct loom__gguf_tensor {
    char *name;       /* NUL-terminated copy, owned by the loom__gguf */
    uint32_t n_dims;  /* 1..4 */
    int64_t ne[4];    /* ne[0] innermost (row length); dims beyond n_dims are 1 */
    uint32_t type;    /* loom_type id (tensor/types.h) */
    uint64_t offset;  /* relative to the start of the data section */
    size_t bytes;     /* total bytes of the tensor's data */
    const void *data; /* into the file image: data section start + offset */
} loom__gguf_tensor;

typedef struct loom__gguf loom__gguf; /* opaque */

/* ---- opening and closing --------------------------------------------------------------------- */

/* Maps path read-only (MAP_PRIVATE) and parses it. On success *out owns the mapping; every
 * pointer handed out (keys, strings, arrays, tensor data) stays valid until loom__gguf_close.
 * Errors: LOOM_ERR_INVALID_ARG (NULL path/out), LOOM_ERR_IO (cannot open, stat or map; not a
 *   regular file — the message carries strerror), LOOM_ERR_BAD_MODEL (corrupt or truncated;
 *   the message names the field), LOOM_ERR_UNSUPPORTED (version other than 2 or 3, big-endian
 *   file, unknown tensor type), LOOM_ERR_OUT_OF_MEMORY. *out is untouched on failure. */
loom_status loom__gguf_open(const char *path, loom__gguf **out);

/* Parses an in-memory image of size bytes. Nothing is copied: the caller keeps data alive and
 * unchanged until loom__gguf_close. Errors as loom__gguf_open, without LOOM_ERR_IO
 * (LOOM_ERR_INVALID_ARG for NULL out, or NULL data with size > 0). */
loom_status loom__gguf_open_memory(const void *data, size_t size, loom__gguf **out);

/* Releases everything (and unmaps the file when loom__gguf_open mapped it). NULL is a no-op. */
void loom__gguf_close(loom__gguf *g);

/* ---- header facts ---------------------------------------------------------------------------- */

uint32_t loom__gguf_version(const loom__gguf *g);   /* 2 or 3 */
uint64_t loom__gguf_alignment(const loom__gguf *g); /* general.alignment, default 32 */
size_t loom__gguf_file_size(const loom__gguf *g);   /* bytes of the whole image */
/* The whole image: base[0..loom__gguf_file_size) (the mapping, or the caller's memory). */
const char *loom__gguf_image(const loom__gguf *g);
/* File offset of the data section (end of the tensor infos rounded up to the alignment). */
uint64_t loom__gguf_data_offset(const loom__gguf *g);

/* Drops the tensor data section's pages from this process's memory, for a reader opened from a
 * file whose tensors were copied elsewhere (loom_model_load with use_mmap false): the
 * metadata stays, and a later read of tensor data faults it back in from the file. A no-op
 * for a reader over a memory image. */
void loom__gguf_release_data(loom__gguf *g);

/* ---- metadata -------------------------------------------------------------------------------- */

int64_t loom__gguf_n_kv(const loom__gguf *g);
/* The i-th kv in file order, or NULL when i is outside [0, n_kv). */
const loom__gguf_kv *loom__gguf_kv_at(const loom__gguf *g, int64_t i);
/* The kv whose key equals key byte for byte (hash lookup), or NULL when absent. */
const loom__gguf_kv *loom__gguf_find_kv(const loom__gguf *g, const char *key);

/* Typed getters. When key is absent: LOOM_ERR_BAD_MODEL naming the key if required, otherwise
 * *out = def and LOOM_OK. When present with an incompatible type or a value that does not fit:
 * LOOM_ERR_BAD_MODEL naming the key, the type found and the value. Compatibility:
 *   get_u32 / get_i64: any integer type (U8..I64) whose value is in the target's range;
 *   get_f32: F32, F64 (finite values must be in float range) or any integer type;
 *   get_bool: BOOL only; get_str: STR only. *out is untouched on failure. */
loom_status loom__gguf_get_u32(const loom__gguf *g, const char *key, bool required, uint32_t def,
                               uint32_t *out);
loom_status loom__gguf_get_i64(const loom__gguf *g, const char *key, bool required, int64_t def,
                               int64_t *out);
loom_status loom__gguf_get_f32(const loom__gguf *g, const char *key, bool required, float def,
                               float *out);
loom_status loom__gguf_get_bool(const loom__gguf *g, const char *key, bool required, bool def,
                                bool *out);
/* Absent and not required: *out = {"", 0}. The string points into the image. */
loom_status loom__gguf_get_str(const loom__gguf *g, const char *key, bool required,
                               loom__gguf_str *out);
/* An array whose elements are exactly elem_type. Absent and not required: *out = NULL.
 * Errors: LOOM_ERR_BAD_MODEL (required and absent, not an array, other element type). */
loom_status loom__gguf_get_arr(const loom__gguf *g, const char *key, loom__gguf_vtype elem_type,
                               bool required, const loom__gguf_value **out);

/* Element i of a numeric array (any fixed-size element type except BOOL is converted; BOOL
 * gives 0 or 1), read from the raw little-endian bytes. Returns 0 when arr is NULL, not an
 * array, of STR/ARR elements, or i >= n — check the type and count with loom__gguf_get_arr first.
 * loom__gguf_arr_i64 truncates floats toward zero (saturating) and saturates U64 values above
 * INT64_MAX. */
float loom__gguf_arr_f32(const loom__gguf_value *arr, uint64_t i);
int64_t loom__gguf_arr_i64(const loom__gguf_value *arr, uint64_t i);

/* s equals the NUL-terminated cstr byte for byte (length included). */
bool loom__gguf_str_eq(loom__gguf_str s, const char *cstr);

/* The format's name of a value type ("uint32", "string", "array", ...); "unknown" otherwise. */
const char *loom__gguf_vtype_name(uint32_t t);

/* ---- tensors --------------------------------------------------------------------------------- */

int64_t loom__gguf_n_tensors(const loom__gguf *g);
/* The i-th tensor in file order, or NULL when i is outside [0, n_tensors). */
const loom__gguf_tensor *loom__gguf_tensor_at(const loom__gguf *g, int64_t i);
/* The tensor named name (hash lookup), or NULL when absent. */
const loom__gguf_tensor *loom__gguf_find_tensor(const loom__gguf *g, const char *name);
