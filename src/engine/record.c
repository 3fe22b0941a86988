/* record.c — the engine's input record (record.h): encoding, the writer and the checked
 * reader. The file is untrusted input to the reader: every count is bounded by the bytes left
 * before anything is allocated, and a malformed record is a BAD_INPUT naming its offset. */
#include "engine/record.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/status.h"
#include "engine/engine.h"

/* ---- encoding ------------------------------------------------------------------------------ */

void loom__rec_put(loom__rec_buf *b, const void *bytes, size_t n) {
    if (!b->ok) return;
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        uint8_t *grown = loom__realloc(b->p, c);
        if (!grown) {
            b->ok = false;
            return;
        }
        b->p = grown;
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, bytes, n);
    b->n += n;
}

void loom__rec_u8(loom__rec_buf *b, uint8_t v) {
    loom__rec_put(b, &v, 1);
}

void loom__rec_u32(loom__rec_buf *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    loom__rec_put(b, x, 4);
}

void loom__rec_u64(loom__rec_buf *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    loom__rec_put(b, x, 8);
}

/* Floats travel as their bit patterns: a replay must see the very values (NaN payloads too). */
void loom__rec_f32(loom__rec_buf *b, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    loom__rec_u32(b, u);
}

void loom__rec_f64(loom__rec_buf *b, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    loom__rec_u64(b, u);
}

void loom__rec_free(loom__rec_buf *b) {
    free(b->p);
    *b = (loom__rec_buf){0};
}

static void encode_header(loom__rec_buf *b, const loom__record_header *h) {
    loom__rec_put(b, LOOM__RECORD_MAGIC, 8);
    loom__rec_u32(b, LOOM__RECORD_VERSION);
    loom__rec_u32(b, h->arch);
    const int32_t shape[] = {h->n_vocab,   h->n_embd,   h->n_layer, h->n_head,
                             h->n_head_kv, h->head_dim, h->n_ff,    h->n_ctx_train};
    for (size_t i = 0; i < sizeof shape / sizeof *shape; i++) loom__rec_u32(b, (uint32_t)shape[i]);
    uint32_t len = (uint32_t)strnlen(h->backend, sizeof h->backend - 1);
    loom__rec_u32(b, len);
    loom__rec_put(b, h->backend, len);
    const loom_engine_params *p = &h->params;
    loom__rec_u64(b, (uint64_t)p->kv_bytes);
    loom__rec_u32(b, (uint32_t)p->block_size);
    loom__rec_u32(b, (uint32_t)p->max_batched_tokens);
    loom__rec_u32(b, (uint32_t)p->max_seqs);
    loom__rec_u32(b, (uint32_t)p->max_ctx);
    loom__rec_u8(b, p->prefix_cache);
    loom__rec_u32(b, (uint32_t)p->preempt);
    loom__rec_u8(b, p->fcfs);
    loom__rec_f64(b, p->starvation_s);
    loom__rec_f32(b, p->watermark);
    loom__rec_u32(b, (uint32_t)p->max_logprobs);
    loom__rec_u32(b, (uint32_t)p->kv_type);                  /* version 2 */
    loom__rec_u8(b, p->kv_rotate);                           /* version 3 */
    const int32_t n_map = h->has_layer_src ? h->n_layer : 0; /* version 4 */
    loom__rec_u32(b, (uint32_t)n_map);
    for (int32_t l = 0; l < n_map; l++) loom__rec_u32(b, (uint32_t)h->layer_src[l]);
    const int32_t n_with = n_map && h->n_merge_pairs > 0 ? h->n_layer : 0; /* version 5 */
    loom__rec_u32(b, (uint32_t)n_with);
    for (int32_t l = 0; l < n_with; l++) loom__rec_u32(b, (uint32_t)h->merge_with[l]);
    if (n_with) {
        loom__rec_f32(b, h->merge_retain);
        loom__rec_f32(b, h->merge_t);
    }
}

void loom__record_encode_request(loom__rec_buf *b, loom_request_id id, int64_t arrival_ns,
                                 const loom_request_params *p, const loom_token *prompt,
                                 int32_t n_prompt) {
    const loom_sampler_params *s = p->sampler;
    loom__rec_u8(b, 'R');
    loom__rec_u64(b, id);
    loom__rec_u64(b, (uint64_t)arrival_ns);
    loom__rec_u32(b, (uint32_t)n_prompt);
    for (int32_t i = 0; i < n_prompt; i++) loom__rec_u32(b, (uint32_t)prompt[i]);
    loom__rec_f32(b, s->temperature);
    loom__rec_u32(b, (uint32_t)s->top_k);
    loom__rec_f32(b, s->top_p);
    loom__rec_u64(b, s->seed);
    loom__rec_f32(b, s->min_p);
    loom__rec_f32(b, s->typical_p);
    loom__rec_u32(b, (uint32_t)s->n_logit_bias);
    for (size_t i = 0; i < s->n_logit_bias; i++) {
        loom__rec_u32(b, (uint32_t)s->logit_bias[i].id);
        loom__rec_f32(b, s->logit_bias[i].bias);
    }
    loom__rec_u32(b, (uint32_t)s->penalty_last_n);
    loom__rec_f32(b, s->repeat_penalty);
    loom__rec_f32(b, s->presence_penalty);
    loom__rec_f32(b, s->frequency_penalty);
    loom__rec_u32(b, (uint32_t)s->entropy_mode);
    const float entropy[] = {s->exp_beta,  s->edt_n,     s->edt_theta,   s->edt_h_min,
                             s->dyn_t_min, s->dyn_t_max, s->dyn_exponent};
    for (size_t i = 0; i < sizeof entropy / sizeof *entropy; i++) loom__rec_f32(b, entropy[i]);
    loom__rec_u32(b, (uint32_t)s->n_logprobs);
    loom__rec_u32(b, (uint32_t)p->max_tokens);
    loom__rec_u32(b, (uint32_t)p->n);
    loom__rec_u32(b, (uint32_t)p->n_stop_tokens);
    for (size_t i = 0; i < p->n_stop_tokens; i++) loom__rec_u32(b, (uint32_t)p->stop_tokens[i]);
    loom__rec_u32(b, (uint32_t)p->n_stop_strings);
    for (size_t i = 0; i < p->n_stop_strings; i++) {
        size_t len = strlen(p->stop_strings[i]);
        loom__rec_u32(b, (uint32_t)len);
        loom__rec_put(b, p->stop_strings[i], len);
    }
    loom__rec_u8(b, p->ignore_eos);
    loom__rec_u32(b, (uint32_t)p->priority);
    loom__rec_f64(b, p->ttft_deadline_s);
    loom__rec_f64(b, p->tpot_deadline_s);
    loom__rec_u64(b, p->cache_salt);
}

/* ---- the writer ----------------------------------------------------------------------------- */

loom_status loom__recorder_open(const char *path, const loom__record_header *h,
                                loom__recorder **out) {
    loom__recorder *r = loom__calloc(1, sizeof *r);
    LOOM_RETURN_IF(!r, LOOM_ERR_OUT_OF_MEMORY, "record: out of memory");
    size_t len = strlen(path);
    r->path = loom__malloc(len + 1);
    loom__rec_buf b = {.ok = true};
    encode_header(&b, h);
    if (!r->path || !b.ok) {
        loom__rec_free(&b);
        loom__recorder_close(r);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "record: out of memory");
    }
    memcpy(r->path, path, len + 1);
    r->f = fopen(path, "wb");
    if (!r->f) {
        int err = errno;
        loom__rec_free(&b);
        loom__recorder_close(r);
        return loom__fail(LOOM_ERR_IO, "record: cannot create %s: %s", path, strerror(err));
    }
    bool ok = fwrite(b.p, 1, b.n, r->f) == b.n && fflush(r->f) == 0;
    int err = errno;
    loom__rec_free(&b);
    if (!ok) {
        loom__recorder_close(r);
        return loom__fail(LOOM_ERR_IO, "record: cannot write %s: %s", path, strerror(err));
    }
    *out = r;
    return LOOM_OK;
}

void loom__recorder_close(loom__recorder *r) {
    if (!r) return;
    if (r->f) fclose(r->f);
    free(r->path);
    free(r->clocks);
    free(r);
}

/* Ends the record after a failed write: what is in the file stays a valid prefix up to the
 * last whole step (a reader stops at the torn record with a message). */
static void stop_recording(loom__recorder *r, const char *what) {
    if (r->failed) return;
    r->failed = true;
    LOOM_LOG_E("engine: the input record %s stops here: %s failed (%s); the engine goes on "
               "without it",
               r->path, what, strerror(errno));
    fclose(r->f);
    r->f = NULL;
}

void loom__recorder_write(loom__recorder *r, const void *bytes, size_t n) {
    if (r->failed) return;
    if (fwrite(bytes, 1, n, r->f) != n) stop_recording(r, "a write");
}

void loom__recorder_cancel(loom__recorder *r, loom_request_id id) {
    uint8_t x[9] = {'X'};
    for (int i = 0; i < 8; i++) x[1 + i] = (uint8_t)(id >> (8 * i));
    loom__recorder_write(r, x, sizeof x);
}

void loom__recorder_clock(loom__recorder *r, int64_t us) {
    if (r->failed) return;
    if (r->n_clocks == r->cap_clocks) {
        uint32_t c = r->cap_clocks ? r->cap_clocks * 2 : 64;
        int64_t *grown = loom__realloc(r->clocks, (size_t)c * sizeof *grown);
        if (!grown) {
            errno = ENOMEM;
            stop_recording(r, "growing the clock list");
            return;
        }
        r->clocks = grown;
        r->cap_clocks = c;
    }
    r->clocks[r->n_clocks++] = us;
}

void loom__recorder_flush(loom__recorder *r) {
    if (!r->failed && fflush(r->f) != 0) stop_recording(r, "a flush");
}

void loom__recorder_step_end(loom__recorder *r, uint64_t digest) {
    if (r->failed) return;
    uint8_t x[5] = {'S'};
    for (int i = 0; i < 4; i++) x[1 + i] = (uint8_t)(r->n_clocks >> (8 * i));
    loom__recorder_write(r, x, sizeof x);
    for (uint32_t k = 0; k < r->n_clocks; k++) {
        uint8_t y[8];
        for (int i = 0; i < 8; i++) y[i] = (uint8_t)((uint64_t)r->clocks[k] >> (8 * i));
        loom__recorder_write(r, y, sizeof y);
    }
    uint8_t d[8];
    for (int i = 0; i < 8; i++) d[i] = (uint8_t)(digest >> (8 * i));
    loom__recorder_write(r, d, sizeof d);
    r->n_clocks = 0;
    loom__recorder_flush(r);
}

/* ---- the reader ----------------------------------------------------------------------------- */

/* Where the reader is, for messages: "the header" or "step N" (0-based, as every message of
 * the replay counts steps). */
static const char *where(const loom__replayer *r, char *buf, size_t cap) {
    if (r->n_steps == 0) return "the header";
    snprintf(buf, cap, "step %lld", (long long)r->step);
    return buf;
}

static loom_status rd(loom__replayer *r, void *dst, size_t n, const char *what) {
    char w[32];
    if ((int64_t)n > r->size - r->off) {
        r->torn = true; /* the file ends here: a crashed run's last record, or a cut file */
        return loom__fail(LOOM_ERR_BAD_INPUT,
                          "replay: the record ends at byte %lld inside %s: %s needs %zu bytes, "
                          "%lld are left",
                          (long long)r->off, where(r, w, sizeof w), what, n,
                          (long long)(r->size - r->off));
    }
    if (fread(dst, 1, n, r->f) != n) {
        const char *why = ferror(r->f) ? strerror(errno) : "the file shrank while being read";
        return loom__fail(LOOM_ERR_IO, "replay: read failed at byte %lld: %s", (long long)r->off,
                          why);
    }
    r->off += (int64_t)n;
    return LOOM_OK;
}

static loom_status rd_u8(loom__replayer *r, uint8_t *v, const char *what) {
    return rd(r, v, 1, what);
}

static loom_status rd_u32(loom__replayer *r, uint32_t *v, const char *what) {
    uint8_t x[4];
    LOOM_TRY(rd(r, x, 4, what));
    *v = (uint32_t)x[0] | (uint32_t)x[1] << 8 | (uint32_t)x[2] << 16 | (uint32_t)x[3] << 24;
    return LOOM_OK;
}

static loom_status rd_i32(loom__replayer *r, int32_t *v, const char *what) {
    uint32_t u;
    LOOM_TRY(rd_u32(r, &u, what));
    memcpy(v, &u, 4);
    return LOOM_OK;
}

static loom_status rd_u64(loom__replayer *r, uint64_t *v, const char *what) {
    uint8_t x[8];
    LOOM_TRY(rd(r, x, 8, what));
    *v = 0;
    for (int i = 7; i >= 0; i--) *v = *v << 8 | x[i];
    return LOOM_OK;
}

static loom_status rd_i64(loom__replayer *r, int64_t *v, const char *what) {
    uint64_t u;
    LOOM_TRY(rd_u64(r, &u, what));
    memcpy(v, &u, 8);
    return LOOM_OK;
}

static loom_status rd_f32(loom__replayer *r, float *v, const char *what) {
    uint32_t u;
    LOOM_TRY(rd_u32(r, &u, what));
    memcpy(v, &u, 4);
    return LOOM_OK;
}

static loom_status rd_f64(loom__replayer *r, double *v, const char *what) {
    uint64_t u;
    LOOM_TRY(rd_u64(r, &u, what));
    memcpy(v, &u, 8);
    return LOOM_OK;
}

static loom_status rd_bool(loom__replayer *r, bool *v, const char *what) {
    uint8_t u;
    LOOM_TRY(rd_u8(r, &u, what));
    LOOM_RETURN_IF(u > 1, LOOM_ERR_BAD_INPUT, "replay: %s at byte %lld is %u (0 or 1)", what,
                   (long long)r->off - 1, u);
    *v = u;
    return LOOM_OK;
}

/* A count of items of item_bytes each that must fit in what is left of the file. */
static loom_status rd_count(loom__replayer *r, uint32_t *n, size_t item_bytes, const char *what) {
    LOOM_TRY(rd_u32(r, n, what));
    char w[32];
    LOOM_RETURN_IF((int64_t)*n > (r->size - r->off) / (int64_t)item_bytes, LOOM_ERR_BAD_INPUT,
                   "replay: %s of %u at byte %lld (%s) needs %llu bytes; the file has %lld left",
                   what, *n, (long long)r->off - 4, where(r, w, sizeof w),
                   (unsigned long long)*n * item_bytes, (long long)(r->size - r->off));
    return LOOM_OK;
}

static loom_status rd_tokens(loom__replayer *r, loom_token **out, uint32_t *n, const char *what) {
    LOOM_TRY(rd_count(r, n, 4, what));
    *out = loom__malloc(((size_t)*n + 1) * sizeof **out);
    LOOM_RETURN_IF(!*out, LOOM_ERR_OUT_OF_MEMORY, "replay: out of memory for %s", what);
    for (uint32_t i = 0; i < *n; i++) LOOM_TRY(rd_i32(r, &(*out)[i], what));
    return LOOM_OK;
}

static loom_status decode_header(loom__replayer *r, loom__record_header *h) {
    char magic[8];
    LOOM_TRY(rd(r, magic, 8, "the magic"));
    LOOM_RETURN_IF(memcmp(magic, LOOM__RECORD_MAGIC, 8) != 0, LOOM_ERR_BAD_INPUT,
                   "replay: not an engine record (no " LOOM__RECORD_MAGIC " magic)");
    uint32_t version;
    LOOM_TRY(rd_u32(r, &version, "the version"));
    LOOM_RETURN_IF(version < 1 || version > LOOM__RECORD_VERSION, LOOM_ERR_BAD_INPUT,
                   "replay: record version %u; this library reads versions 1 .. %u", version,
                   LOOM__RECORD_VERSION);
    memset(h, 0, sizeof *h);
    LOOM_TRY(rd_u32(r, &h->arch, "arch"));
    int32_t *shape[] = {&h->n_vocab,   &h->n_embd,   &h->n_layer, &h->n_head,
                        &h->n_head_kv, &h->head_dim, &h->n_ff,    &h->n_ctx_train};
    for (size_t i = 0; i < sizeof shape / sizeof *shape; i++)
        LOOM_TRY(rd_i32(r, shape[i], "the model shape"));
    uint32_t len;
    LOOM_TRY(rd_u32(r, &len, "the backend name's length"));
    LOOM_RETURN_IF(len >= sizeof h->backend, LOOM_ERR_BAD_INPUT,
                   "replay: backend name of %u bytes (at most %zu)", len, sizeof h->backend - 1);
    LOOM_TRY(rd(r, h->backend, len, "the backend name"));
    loom_engine_params *p = &h->params;
    loom_engine_params_init(p, sizeof *p);
    LOOM_TRY(rd_i64(r, &p->kv_bytes, "kv_bytes"));
    LOOM_TRY(rd_i32(r, &p->block_size, "block_size"));
    LOOM_TRY(rd_i32(r, &p->max_batched_tokens, "max_batched_tokens"));
    LOOM_TRY(rd_i32(r, &p->max_seqs, "max_seqs"));
    LOOM_TRY(rd_i32(r, &p->max_ctx, "max_ctx"));
    LOOM_TRY(rd_bool(r, &p->prefix_cache, "prefix_cache"));
    uint32_t preempt;
    LOOM_TRY(rd_u32(r, &preempt, "preempt"));
    LOOM_RETURN_IF(preempt != LOOM_PREEMPT_RECOMPUTE && preempt != LOOM_PREEMPT_SWAP,
                   LOOM_ERR_BAD_INPUT, "replay: preemption mode %u", preempt);
    p->preempt = (loom_preempt_mode)preempt;
    LOOM_TRY(rd_bool(r, &p->fcfs, "fcfs"));
    LOOM_TRY(rd_f64(r, &p->starvation_s, "starvation_s"));
    LOOM_TRY(rd_f32(r, &p->watermark, "watermark"));
    LOOM_TRY(rd_i32(r, &p->max_logprobs, "max_logprobs"));
    if (version >= 2) { /* version 1 had F16 pages only */
        uint32_t kv_type;
        LOOM_TRY(rd_u32(r, &kv_type, "kv_type"));
        LOOM_RETURN_IF(kv_type > LOOM_KV_CACHE_FP8_E5M2, LOOM_ERR_BAD_INPUT, "replay: kv_type %u",
                       kv_type);
        p->kv_type = (loom_kv_cache_type)kv_type;
    }
    if (version >= 3) LOOM_TRY(rd_bool(r, &p->kv_rotate, "kv_rotate"));
    if (version >= 4) {
        uint32_t n_map;
        LOOM_TRY(rd_u32(r, &n_map, "the layer map's length"));
        LOOM_RETURN_IF(n_map != 0 &&
                           (n_map != (uint32_t)h->n_layer || n_map > LOOM__RECORD_MAX_LAYERS),
                       LOOM_ERR_BAD_INPUT, "replay: a layer map of %u layers for %d layers", n_map,
                       h->n_layer);
        for (uint32_t l = 0; l < n_map; l++) {
            LOOM_TRY(rd_i32(r, &h->layer_src[l], "the layer map"));
            LOOM_RETURN_IF(h->layer_src[l] < 0 || h->layer_src[l] > (int32_t)l, LOOM_ERR_BAD_INPUT,
                           "replay: layer %u reads layer %d", l, h->layer_src[l]);
        }
        h->has_layer_src = n_map != 0;
    }
    if (version >= 5) {
        uint32_t n_with;
        LOOM_TRY(rd_u32(r, &n_with, "the merged pairs' length"));
        LOOM_RETURN_IF(n_with != 0 && (!h->has_layer_src || n_with != (uint32_t)h->n_layer),
                       LOOM_ERR_BAD_INPUT, "replay: merged pairs for %u layers of %d", n_with,
                       h->n_layer);
        int32_t n_paired = 0;
        for (uint32_t l = 0; l < n_with; l++) {
            LOOM_TRY(rd_i32(r, &h->merge_with[l], "the merged pairs"));
            LOOM_RETURN_IF(h->merge_with[l] < -1 || h->merge_with[l] >= h->n_layer,
                           LOOM_ERR_BAD_INPUT, "replay: layer %u merged with layer %d", l,
                           h->merge_with[l]);
            n_paired += h->merge_with[l] >= 0;
        }
        if (n_with) {
            LOOM_TRY(rd_f32(r, &h->merge_retain, "merge_retain"));
            LOOM_TRY(rd_f32(r, &h->merge_t, "merge_t"));
            LOOM_RETURN_IF(!(h->merge_retain >= 0.0f && h->merge_retain <= 1.0f) ||
                               !(h->merge_t >= 0.0f && h->merge_t <= 1.0f),
                           LOOM_ERR_BAD_INPUT, "replay: merge_retain %g, merge_t %g",
                           (double)h->merge_retain, (double)h->merge_t);
            LOOM_RETURN_IF(n_paired == 0 || n_paired % 2 != 0, LOOM_ERR_BAD_INPUT,
                           "replay: %d layers in merged pairs", n_paired);
        }
        h->n_merge_pairs = n_paired / 2;
    }
    /* kv_bytes 0 would ask for kv_fraction of this machine's memory: not the recorded pool. */
    LOOM_RETURN_IF(p->kv_bytes <= 0, LOOM_ERR_BAD_INPUT, "replay: kv_bytes %lld (> 0)",
                   (long long)p->kv_bytes);
    LOOM_RETURN_IF(p->max_ctx <= 0, LOOM_ERR_BAD_INPUT, "replay: max_ctx %d (> 0)", p->max_ctx);
    return LOOM_OK;
}

loom_status loom__replayer_open(const char *path, loom__record_header *h, loom__replayer **out) {
    loom__replayer *r = loom__calloc(1, sizeof *r);
    LOOM_RETURN_IF(!r, LOOM_ERR_OUT_OF_MEMORY, "replay: out of memory");
    r->f = fopen(path, "rb");
    struct stat sb;
    loom_status st = LOOM_OK;
    if (!r->f) {
        st = loom__fail(LOOM_ERR_IO, "replay: cannot open %s: %s", path, strerror(errno));
    } else if (fstat(fileno(r->f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = loom__fail(LOOM_ERR_IO, "replay: %s is not a regular file", path);
    } else {
        r->size = (int64_t)sb.st_size;
        st = decode_header(r, h);
    }
    if (st != LOOM_OK) {
        loom__replayer_close(r);
        return st;
    }
    *out = r;
    return LOOM_OK;
}

void loom__record_request_free(loom__record_request *q) {
    free(q->prompt);
    free(q->stop_tokens);
    free(q->bias);
    for (size_t i = 0; q->stop_strings && i < q->n_stop_strings; i++) free(q->stop_strings[i]);
    free(q->stop_strings);
    memset(q, 0, sizeof *q);
}

static void clear_step(loom__replayer *r) {
    for (size_t i = 0; i < r->n_reqs; i++) loom__record_request_free(&r->reqs[i]);
    r->n_reqs = r->n_cancels = 0;
    free(r->clocks);
    r->clocks = NULL;
    r->n_clocks = r->next_clock = 0;
    r->has_end = false;
}

void loom__replayer_close(loom__replayer *r) {
    if (!r) return;
    clear_step(r);
    free(r->reqs);
    free(r->cancels);
    if (r->f) fclose(r->f);
    free(r);
}

bool loom__replayer_more(const loom__replayer *r) {
    return r->off < r->size;
}

static loom_status decode_sampler(loom__replayer *r, loom__record_request *q) {
    loom_sampler_params *s = &q->sampler;
    loom_sampler_params_init(s, sizeof *s);
    LOOM_TRY(rd_f32(r, &s->temperature, "temperature"));
    LOOM_TRY(rd_i32(r, &s->top_k, "top_k"));
    LOOM_TRY(rd_f32(r, &s->top_p, "top_p"));
    LOOM_TRY(rd_u64(r, &s->seed, "seed"));
    LOOM_TRY(rd_f32(r, &s->min_p, "min_p"));
    LOOM_TRY(rd_f32(r, &s->typical_p, "typical_p"));
    uint32_t n_bias;
    LOOM_TRY(rd_count(r, &n_bias, 8, "the logit-bias count"));
    q->bias = loom__malloc(((size_t)n_bias + 1) * sizeof *q->bias);
    LOOM_RETURN_IF(!q->bias, LOOM_ERR_OUT_OF_MEMORY, "replay: out of memory for logit biases");
    for (uint32_t i = 0; i < n_bias; i++) {
        LOOM_TRY(rd_i32(r, &q->bias[i].id, "a logit-bias id"));
        LOOM_TRY(rd_f32(r, &q->bias[i].bias, "a logit bias"));
    }
    s->logit_bias = q->bias;
    s->n_logit_bias = n_bias;
    LOOM_TRY(rd_i32(r, &s->penalty_last_n, "penalty_last_n"));
    LOOM_TRY(rd_f32(r, &s->repeat_penalty, "repeat_penalty"));
    LOOM_TRY(rd_f32(r, &s->presence_penalty, "presence_penalty"));
    LOOM_TRY(rd_f32(r, &s->frequency_penalty, "frequency_penalty"));
    uint32_t mode;
    LOOM_TRY(rd_u32(r, &mode, "entropy_mode"));
    LOOM_RETURN_IF(mode > LOOM_ENTROPY_DYNATEMP, LOOM_ERR_BAD_INPUT,
                   "replay: entropy_mode %u at byte %lld", mode, (long long)r->off - 4);
    s->entropy_mode = (loom_entropy_mode)mode;
    float *entropy[] = {&s->exp_beta,  &s->edt_n,     &s->edt_theta,   &s->edt_h_min,
                        &s->dyn_t_min, &s->dyn_t_max, &s->dyn_exponent};
    for (size_t i = 0; i < sizeof entropy / sizeof *entropy; i++)
        LOOM_TRY(rd_f32(r, entropy[i], "an entropy setting"));
    LOOM_TRY(rd_i32(r, &s->n_logprobs, "n_logprobs"));
    return LOOM_OK;
}

static loom_status decode_stop_strings(loom__replayer *r, loom__record_request *q) {
    uint32_t n;
    LOOM_TRY(rd_count(r, &n, 4, "the stop-string count"));
    q->stop_strings = loom__calloc((size_t)n + 1, sizeof *q->stop_strings);
    LOOM_RETURN_IF(!q->stop_strings, LOOM_ERR_OUT_OF_MEMORY, "replay: out of memory");
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len;
        LOOM_TRY(rd_count(r, &len, 1, "a stop string's length"));
        char *sz = loom__malloc((size_t)len + 1);
        LOOM_RETURN_IF(!sz, LOOM_ERR_OUT_OF_MEMORY, "replay: out of memory for a stop string");
        q->stop_strings[q->n_stop_strings++] = sz;
        LOOM_TRY(rd(r, sz, len, "a stop string"));
        sz[len] = '\0';
        LOOM_RETURN_IF(strlen(sz) != len, LOOM_ERR_BAD_INPUT,
                       "replay: stop string %u of the request at byte %lld holds a NUL", i,
                       (long long)r->off - len);
    }
    return LOOM_OK;
}

static loom_status decode_request(loom__replayer *r, loom__record_request *q) {
    loom_request_params *p = &q->params;
    loom_request_params_init(p, sizeof *p);
    LOOM_TRY(rd_u64(r, &q->id, "a request id"));
    LOOM_RETURN_IF(q->id == 0 || q->id > UINT64_MAX / LOOM_ENGINE_MAX_N, LOOM_ERR_BAD_INPUT,
                   "replay: request id %llu at byte %lld (step %lld) is out of range",
                   (unsigned long long)q->id, (long long)r->off - 8, (long long)r->step);
    LOOM_TRY(rd_i64(r, &q->arrival_ns, "an arrival"));
    LOOM_RETURN_IF(
        q->arrival_ns < -LOOM__RECORD_MAX_US * 1000 || q->arrival_ns > LOOM__RECORD_MAX_US * 1000,
        LOOM_ERR_BAD_INPUT, "replay: arrival %lld ns at byte %lld (step %lld) is out of range",
        (long long)q->arrival_ns, (long long)r->off - 8, (long long)r->step);
    uint32_t n;
    LOOM_TRY(rd_tokens(r, &q->prompt, &n, "the prompt"));
    p->prompt_tokens = q->prompt;
    p->n_prompt_tokens = n;
    LOOM_TRY(decode_sampler(r, q)); /* p->sampler is set where it is used (engine_replay.c) */
    LOOM_TRY(rd_i32(r, &p->max_tokens, "max_tokens"));
    LOOM_TRY(rd_i32(r, &p->n, "n"));
    LOOM_TRY(rd_tokens(r, &q->stop_tokens, &n, "the stop tokens"));
    p->stop_tokens = q->stop_tokens;
    p->n_stop_tokens = n;
    LOOM_TRY(decode_stop_strings(r, q));
    p->stop_strings = (const char *const *)q->stop_strings;
    p->n_stop_strings = q->n_stop_strings;
    LOOM_TRY(rd_bool(r, &p->ignore_eos, "ignore_eos"));
    LOOM_TRY(rd_i32(r, &p->priority, "priority"));
    LOOM_TRY(rd_f64(r, &p->ttft_deadline_s, "ttft_deadline_s"));
    LOOM_TRY(rd_f64(r, &p->tpot_deadline_s, "tpot_deadline_s"));
    LOOM_TRY(rd_u64(r, &p->cache_salt, "cache_salt"));
    return LOOM_OK;
}

static bool grow(void **arr, size_t *cap, size_t need, size_t sz) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need) c *= 2;
    void *grown = loom__realloc(*arr, c * sz);
    if (!grown) return false;
    *arr = grown;
    *cap = c;
    return true;
}

/* Reads one record of the step (its tag already read: at is its offset); *end: it was 'S'. */
static loom_status read_record(loom__replayer *r, uint8_t tag, int64_t at, bool *end) {
    char w[32];
    *end = false;
    if (tag == 'R') {
        LOOM_RETURN_IF(!grow((void **)&r->reqs, &r->cap_reqs, r->n_reqs + 1, sizeof *r->reqs),
                       LOOM_ERR_OUT_OF_MEMORY, "replay: out of memory");
        loom__record_request *q = &r->reqs[r->n_reqs++];
        memset(q, 0, sizeof *q);
        return decode_request(r, q);
    }
    if (tag == 'X') {
        LOOM_RETURN_IF(
            !grow((void **)&r->cancels, &r->cap_cancels, r->n_cancels + 1, sizeof *r->cancels),
            LOOM_ERR_OUT_OF_MEMORY, "replay: out of memory");
        LOOM_TRY(rd_u64(r, &r->cancels[r->n_cancels], "a cancelled id"));
        r->n_cancels++;
        return LOOM_OK;
    }
    LOOM_RETURN_IF(tag != 'S', LOOM_ERR_BAD_INPUT,
                   "replay: unknown record tag 0x%02x at byte %lld (%s)", tag, (long long)at,
                   where(r, w, sizeof w));
    uint32_t n;
    LOOM_TRY(rd_count(r, &n, 8, "the clock-reading count"));
    r->clocks = loom__malloc(((size_t)n + 1) * sizeof *r->clocks);
    LOOM_RETURN_IF(!r->clocks, LOOM_ERR_OUT_OF_MEMORY, "replay: out of memory");
    /* Readings of a monotonic clock from the engine's creation, in microseconds: never
     * negative, never going back, within what a duration may be (timer.h). */
    int64_t prev = r->last_clock;
    for (uint32_t k = 0; k < n; k++) {
        LOOM_TRY(rd_i64(r, &r->clocks[k], "a clock reading"));
        LOOM_RETURN_IF(r->clocks[k] < prev || r->clocks[k] > LOOM__RECORD_MAX_US,
                       LOOM_ERR_BAD_INPUT,
                       "replay: clock reading %lld at byte %lld (%s) is outside [%lld, %lld] (the "
                       "clock only goes forward)",
                       (long long)r->clocks[k], (long long)r->off - 8, where(r, w, sizeof w),
                       (long long)prev, (long long)LOOM__RECORD_MAX_US);
        prev = r->clocks[k];
    }
    r->n_clocks = n;
    LOOM_TRY(rd_u64(r, &r->digest, "the step's event digest"));
    *end = true;
    return LOOM_OK;
}

loom_status loom__replayer_next_step(loom__replayer *r) {
    clear_step(r);
    r->step = r->n_steps++;
    while (r->off < r->size) {
        uint8_t tag;
        int64_t at = r->off;
        LOOM_TRY(rd_u8(r, &tag, "a record tag"));
        bool end = false;
        loom_status st = read_record(r, tag, at, &end);
        if (st != LOOM_OK && r->torn && tag != 'S') {
            /* A run that crashed while writing its last record: that record is lost, the step
             * replays with the ones before it (a cut 'S' leaves a truncated file: refused). */
            LOOM_LOG_W("%s; the step replays without that record", loom_last_error());
            if (tag == 'R') loom__record_request_free(&r->reqs[--r->n_reqs]);
            r->off = r->size;
            return LOOM_OK;
        }
        LOOM_TRY(st);
        if (end) {
            r->has_end = true;
            return LOOM_OK;
        }
    }
    return LOOM_OK; /* the file ended inside a step: it replays without its clock record */
}

bool loom__replayer_clock(loom__replayer *r, int64_t *us) {
    if (r->next_clock < r->n_clocks) {
        r->last_clock = r->clocks[r->next_clock++];
        *us = r->last_clock;
        return true;
    }
    *us = r->last_clock;
    if (r->has_end) r->next_clock++; /* counted: the step read more than it recorded */
    return !r->has_end;
}
