/* gguf_tensors.c — parsing and checking the tensor-info section of a GGUF file, then placing
 * each tensor in the data section (alignment and bounds), which yields the zero-copy views.
 *
 * Shapes are checked so that code downstream may multiply dims freely: every dim is in
 * [0, 2^63), the product of the nonzero dims fits int64_t, and the byte size (row bytes times
 * rows) fits size_t. */
#include <stdlib.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "gguf/gguf_impl.h"
#include "tensor/types.h"

/* Longest prefix of a tensor name quoted in messages. */
#define NAME_QUOTE_MAX 200

/* Reads the name of tensor #i into an owned NUL-terminated copy. */
static loom_status parse_name(loom__gguf_reader *r, loom__gguf_tensor *t) {
    loom__gguf_str s = {NULL, 0};
    LOOM_TRY(loom__gguf_read_str(r, "name", &s));
    LOOM_RETURN_IF(s.len == 0, LOOM_ERR_BAD_MODEL, "empty name");
    LOOM_RETURN_IF(s.len > LOOM_GGUF_MAX_KEY_LEN, LOOM_ERR_BAD_MODEL,
                   "name length %" PRIu64 " exceeds the limit of %u bytes", s.len,
                   LOOM_GGUF_MAX_KEY_LEN);
    LOOM_RETURN_IF(memchr(s.ptr, 0, (size_t)s.len) != NULL, LOOM_ERR_BAD_MODEL,
                   "name contains a NUL byte");
    t->name = loom__malloc((size_t)s.len + 1);
    LOOM_RETURN_IF(!t->name, LOOM_ERR_OUT_OF_MEMORY, "out of memory for a tensor name");
    memcpy(t->name, s.ptr, (size_t)s.len);
    t->name[s.len] = '\0';
    return LOOM_OK;
}

/* Reads dims, type and offset of a named tensor and checks its shape, type and size. */
static loom_status parse_shape(loom__gguf_reader *r, loom__gguf_tensor *t) {
    LOOM_TRY(loom__gguf_read_u32(r, "n_dims", &t->n_dims));
    LOOM_RETURN_IF(t->n_dims < 1 || t->n_dims > 4, LOOM_ERR_BAD_MODEL,
                   "n_dims %" PRIu32 " out of range 1..4", t->n_dims);
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        LOOM_TRY(loom__gguf_read_u64(r, "ne", &ne));
        LOOM_RETURN_IF(ne > (uint64_t)INT64_MAX, LOOM_ERR_BAD_MODEL,
                       "ne[%" PRIu32 "] = %" PRIu64 " is negative as int64", d, ne);
        t->ne[d] = (int64_t)ne;
    }
    LOOM_TRY(loom__gguf_read_u32(r, "type", &t->type));
    LOOM_TRY(loom__gguf_read_u64(r, "data offset", &t->offset));

    /* Zero dims are legal (an empty tensor); they are skipped so the other dims still have to
     * multiply without overflow. */
    int64_t n_elems = 1;
    for (int d = 0; d < 4; d++) {
        if (t->ne[d] == 0) continue;
        LOOM_RETURN_IF(__builtin_mul_overflow(n_elems, t->ne[d], &n_elems), LOOM_ERR_BAD_MODEL,
                       "dims [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                       "]: element count overflows int64",
                       t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    }

    /* GGUF's id space only: loom's own element types (FP8 KV pages) never come from a file. */
    const loom__type_traits *tr =
        t->type < LOOM_TYPE_GGUF_END_ ? loom__type_get_traits(t->type) : NULL;
    LOOM_RETURN_IF(!tr || !tr->name || tr->block_elems == 0, LOOM_ERR_UNSUPPORTED,
                   "type id %" PRIu32 " unknown", t->type);
    LOOM_RETURN_IF(t->ne[0] % tr->block_elems != 0, LOOM_ERR_BAD_MODEL,
                   "ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRIu32, t->ne[0],
                   tr->name, tr->block_elems);
    size_t row;
    LOOM_RETURN_IF(!loom__type_row_bytes(t->type, t->ne[0], &row), LOOM_ERR_BAD_MODEL,
                   "row of %" PRId64 " %s elements: byte size overflows", t->ne[0], tr->name);
    /* The rows' product cannot overflow: it divides the element count checked above (or is 0). */
    uint64_t rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
    LOOM_RETURN_IF(rows > SIZE_MAX || loom__mul_overflow_size(row, (size_t)rows, &t->bytes),
                   LOOM_ERR_BAD_MODEL, "%" PRIu64 " rows of %zu bytes: byte size overflows", rows,
                   row);
    return LOOM_OK;
}

loom_status loom__gguf_parse_tensor_infos(loom__gguf *g, loom__gguf_reader *r, int64_t n_tensors) {
    LOOM_TRY(loom__gguf_index_init(&g->tensor_index, n_tensors));
    if (n_tensors > 0) {
        g->tensors = loom__calloc((size_t)n_tensors, sizeof *g->tensors);
        LOOM_RETURN_IF(!g->tensors, LOOM_ERR_OUT_OF_MEMORY,
                       "gguf: out of memory for %" PRId64 " tensor infos", n_tensors);
    }
    g->n_tensors = n_tensors; /* names are freed up to the first NULL one */
    for (int64_t i = 0; i < n_tensors; i++) {
        loom__gguf_tensor *t = &g->tensors[i];
        loom_status st = parse_name(r, t);
        if (st != LOOM_OK) {
            loom__error_prefix("gguf: tensor #%" PRId64, i);
            return st;
        }
        uint64_t len = strlen(t->name);
        int64_t first = loom__gguf_index_insert(&g->tensor_index, t->name, len, i);
        LOOM_RETURN_IF(first >= 0, LOOM_ERR_BAD_MODEL,
                       "gguf: tensor #%" PRId64 " '%.*s': duplicate name (first at tensor #%" PRId64
                       ")",
                       i, NAME_QUOTE_MAX, t->name, first);
        st = parse_shape(r, t);
        if (st != LOOM_OK) {
            loom__error_prefix("gguf: tensor #%" PRId64 " '%.*s'", i, NAME_QUOTE_MAX, t->name);
            return st;
        }
    }
    return LOOM_OK;
}

loom_status loom__gguf_place_tensors(loom__gguf *g) {
    if (g->n_tensors == 0) return LOOM_OK;
    LOOM_RETURN_IF(g->data_offset > g->size, LOOM_ERR_BAD_MODEL,
                   "gguf: data section offset %" PRIu64 " (alignment %" PRIu64
                   ") past end of file (%zu bytes)",
                   g->data_offset, g->alignment, g->size);
    uint64_t data_size = g->size - g->data_offset;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        loom__gguf_tensor *t = &g->tensors[i];
        uint64_t end;
        LOOM_RETURN_IF(t->offset % g->alignment != 0, LOOM_ERR_BAD_MODEL,
                       "gguf: tensor #%" PRId64 " '%.*s': data offset %" PRIu64
                       " is not a multiple of the alignment %" PRIu64,
                       i, NAME_QUOTE_MAX, t->name, t->offset, g->alignment);
        LOOM_RETURN_IF(loom__add_overflow_u64(t->offset, t->bytes, &end), LOOM_ERR_BAD_MODEL,
                       "gguf: tensor #%" PRId64 " '%.*s': data offset %" PRIu64 " + size %zu "
                       "overflows",
                       i, NAME_QUOTE_MAX, t->name, t->offset, t->bytes);
        LOOM_RETURN_IF(end > data_size, LOOM_ERR_BAD_MODEL,
                       "gguf: tensor #%" PRId64 " '%.*s': data offset %" PRIu64 " + size %zu past "
                       "end of file (data section of %" PRIu64 " bytes at file offset %" PRIu64
                       ", file %zu bytes)",
                       i, NAME_QUOTE_MAX, t->name, t->offset, t->bytes, data_size, g->data_offset,
                       g->size);
        t->data = g->base + g->data_offset + t->offset;
    }
    return LOOM_OK;
}
