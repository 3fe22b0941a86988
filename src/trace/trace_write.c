/* trace_write.c — the trace's two output formats (field lists in loom.h): JSON Lines and
 * Chrome trace-event JSON, to a file or to caller memory through one byte sink, with JSON
 * strings made valid whatever bytes a token piece holds. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "trace/trace_impl.h"

/* ---- the byte sink ----------------------------------------------------------------------- */

/* A file, or a memory buffer that keeps the first cap bytes and counts the rest (the buffer
 * variant reports the full size either way). */
typedef struct sink {
    FILE *f;
    char *buf;
    size_t cap;
    size_t n;      /* bytes produced so far */
    bool io_error; /* a write to f failed (errno saved in err) */
    int err;
} sink;

static void put(sink *s, const char *p, size_t len) {
    if (len == 0) return; /* p may be NULL then */
    if (s->f) {
        if (!s->io_error && fwrite(p, 1, len, s->f) != len) {
            s->io_error = true;
            s->err = errno;
        }
    } else if (s->n < s->cap) {
        size_t k = s->cap - s->n < len ? s->cap - s->n : len;
        memcpy(s->buf + s->n, p, k);
    }
    s->n += len;
}

static void put_lit(sink *s, const char *lit) {
    put(s, lit, strlen(lit));
}

static void put_i64(sink *s, int64_t v) {
    char b[24];
    int n = snprintf(b, sizeof b, "%lld", (long long)v);
    put(s, b, (size_t)n);
}

static void put_u64(sink *s, uint64_t v) {
    char b[24];
    int n = snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    put(s, b, (size_t)n);
}

/* Writes the snprintf'd number b[0..n) as JSON. snprintf follows the host program's
 * LC_NUMERIC, which may make the decimal point a comma (or a multibyte mark): any run of bytes
 * that cannot be part of a number is turned back into one '.'. */
static void put_number_text(sink *s, const char *b, int n) {
    char o[48];
    size_t m = 0;
    for (int i = 0; i < n && b[i]; i++) {
        char c = b[i];
        bool num = (c >= '0' && c <= '9') || c == '-' || c == '+' || c == 'e' || c == 'E';
        if (num)
            o[m++] = c;
        else if (m == 0 || o[m - 1] != '.')
            o[m++] = '.';
    }
    put(s, o, m);
}

/* A double as JSON with 9 significant digits: null when not finite (JSON has no inf/nan). */
static void put_num(sink *s, double v) {
    if (!isfinite(v)) {
        put_lit(s, "null");
        return;
    }
    char b[48];
    int n = snprintf(b, sizeof b, "%.9g", v);
    put_number_text(s, b, n < (int)sizeof b ? n : (int)sizeof b - 1);
}

/* A float with the fewest digits (6 to 9) that read back as the same float, so -0.3f is
 * written "-0.3" rather than "-0.300000012". The check reads with the same locale that wrote. */
static void put_float(sink *s, float v) {
    if (!isfinite(v)) {
        put_lit(s, "null");
        return;
    }
    char b[48];
    int n = 0;
    for (int prec = 6; prec <= 9; prec++) {
        n = snprintf(b, sizeof b, "%.*g", prec, (double)v);
        if (strtof(b, NULL) == v) break;
    }
    put_number_text(s, b, n < (int)sizeof b ? n : (int)sizeof b - 1);
}

/* Nanoseconds as microseconds with exactly three decimals (Chrome's ts and dur). */
static void put_us(sink *s, int64_t ns) {
    char b[32];
    unsigned long long a = ns < 0 ? 0ull - (unsigned long long)ns : (unsigned long long)ns;
    int n = snprintf(b, sizeof b, "%s%llu.%03llu", ns < 0 ? "-" : "", a / 1000, a % 1000);
    put(s, b, (size_t)n);
}

/* ---- JSON strings ------------------------------------------------------------------------ */

/* Length of the well-formed UTF-8 sequence at p[0..n) (2-4; overlong forms, surrogates and
 * code points past U+10FFFF are not well-formed), or 0. p[0] >= 0x80. */
static size_t utf8_seq(const unsigned char *p, size_t n) {
    unsigned char c = p[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0; /* overlong */
        if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90; /* overlong */
        if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
    } else
        return 0;
    if (n < len || p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return len;
}

/* Writes p[0..n) as a quoted JSON string; sets *lossy when a byte had to become U+FFFD. */
static void put_str(sink *s, const char *str, size_t n, bool *lossy) {
    const unsigned char *p = (const unsigned char *)str;
    static const char hex[] = "0123456789abcdef";
    put(s, "\"", 1);
    size_t run = 0; /* start of the bytes copied as they are */
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        size_t len = 1;
        const char *esc = NULL;
        char u[7];
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c < 0x20 || c == 0x7F) {
            u[0] = '\\', u[1] = 'u', u[2] = '0', u[3] = '0';
            u[4] = hex[c >> 4], u[5] = hex[c & 15], u[6] = '\0';
            esc = u;
        } else if (c >= 0x80) {
            len = utf8_seq(p + i, n - i);
            if (len == 0) {
                esc = "\\ufffd";
                len = 1;
                if (lossy) *lossy = true;
            }
        }
        if (esc) {
            put(s, str + run, i - run);
            put_lit(s, esc);
            run = i + len;
        }
        i += len;
    }
    put(s, str + run, n - run);
    put(s, "\"", 1);
}

static void put_cstr(sink *s, const char *str) {
    put_str(s, str, strlen(str), NULL);
}

static void put_hex(sink *s, const char *str, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)str;
    put(s, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        char b[2] = {hex[p[i] >> 4], hex[p[i] & 15]};
        put(s, b, 2);
    }
    put(s, "\"", 1);
}

/* ---- shared pieces ----------------------------------------------------------------------- */

/* A token's piece (no arithmetic on the pool while it is still unallocated). */
static const char *piece_of(const loom_trace *t, const loom__trace_token_rec *k) {
    return k->piece_len > 0 ? t->bytes + k->piece_off : "";
}

/* The earliest time among the records: written times are relative to it. */
static int64_t origin_of(const loom_trace *t) {
    int64_t o = INT64_MAX;
    for (size_t i = 0; i < t->n_steps; i++)
        if (t->steps[i].start_ns < o) o = t->steps[i].start_ns;
    for (size_t i = 0; i < t->n_tokens; i++)
        if (t->tokens[i].t_ns < o) o = t->tokens[i].t_ns;
    return o == INT64_MAX ? 0 : o;
}

static void meta_fields(sink *s, const loom_trace *t, int64_t origin) {
    put_lit(s, "\"format\":\"loom-trace\",\"version\":1,\"clock\":\"monotonic\",\"origin_ns\":");
    put_i64(s, origin);
    put_lit(s, ",\"n_steps\":");
    put_u64(s, t->n_steps);
    put_lit(s, ",\"n_tokens\":");
    put_u64(s, t->n_tokens);
    put_lit(s, ",\"dropped\":");
    put_u64(s, t->dropped);
}

/* The token record's fields after "type" (JSONL) or as Chrome args. */
static void token_fields(sink *s, const loom_trace *t, const loom__trace_token_rec *k,
                         int64_t origin) {
    const char *piece = piece_of(t, k);
    bool lossy = false;
    put_lit(s, "\"request\":");
    put_u64(s, k->request);
    put_lit(s, ",\"sample\":");
    put_i64(s, k->sample);
    put_lit(s, ",\"step\":");
    put_i64(s, k->step);
    put_lit(s, ",\"pos\":");
    put_i64(s, k->pos);
    put_lit(s, ",\"token\":");
    put_i64(s, k->token);
    put_lit(s, ",\"piece\":");
    put_str(s, piece, k->piece_len, &lossy);
    put_lit(s, ",\"logprob_raw\":");
    put_float(s, k->logprob_raw);
    put_lit(s, ",\"logprob_final\":");
    put_float(s, k->logprob_final);
    put_lit(s, ",\"entropy\":");
    put_num(s, k->entropy);
    put_lit(s, ",\"entropy_final\":");
    put_num(s, k->entropy_final);
    put_lit(s, ",\"varentropy\":");
    put_num(s, k->varentropy);
    put_lit(s, ",\"temperature\":");
    put_num(s, k->temperature);
    put_lit(s, ",\"t_ns\":");
    put_i64(s, k->t_ns - origin);
    put_lit(s, ",\"since_arrival_ns\":");
    put_i64(s, k->since_arrival_ns);
    if (lossy) {
        put_lit(s, ",\"piece_hex\":");
        put_hex(s, piece, k->piece_len);
    }
}

/* ---- JSON Lines -------------------------------------------------------------------------- */

static void jsonl_step(sink *s, const loom_trace *t, const loom__trace_step_rec *r,
                       int64_t origin) {
    put_lit(s, "{\"type\":\"step\",\"step\":");
    put_i64(s, r->step);
    put_lit(s, ",\"start_ns\":");
    put_i64(s, r->start_ns - origin);
    put_lit(s, ",\"end_ns\":");
    put_i64(s, r->end_ns - origin);
    put_lit(s, ",\"dur_ns\":");
    put_i64(s, r->end_ns - r->start_ns);
    put_lit(s, ",\"n_seqs\":");
    put_i64(s, r->n_seqs);
    put_lit(s, ",\"n_tokens\":");
    put_i64(s, r->n_tokens);
    put_lit(s, ",\"phases\":[");
    for (int32_t i = 0; i < r->n_phases; i++) {
        const loom__trace_phase_rec *p = &t->phases[r->first_phase + (size_t)i];
        put_lit(s, i ? ",{\"name\":" : "{\"name\":");
        put_cstr(s, t->names[p->name]);
        put_lit(s, ",\"start_ns\":");
        put_i64(s, p->start_ns - origin);
        put_lit(s, ",\"end_ns\":");
        put_i64(s, p->end_ns - origin);
        put_lit(s, ",\"dur_ns\":");
        put_i64(s, p->end_ns - p->start_ns);
        put_lit(s, "}");
    }
    put_lit(s, "]}\n");
}

static void write_jsonl(sink *s, const loom_trace *t) {
    int64_t origin = origin_of(t);
    put_lit(s, "{\"type\":\"meta\",");
    meta_fields(s, t, origin);
    put_lit(s, "}\n");
    /* Merge by step index: each step line, then the tokens it produced (appended before the
     * step record, since a step is recorded when it ends). */
    size_t i = 0, j = 0;
    while (i < t->n_steps || j < t->n_tokens) {
        if (i < t->n_steps && (j == t->n_tokens || t->steps[i].step <= t->tokens[j].step)) {
            jsonl_step(s, t, &t->steps[i++], origin);
        } else {
            put_lit(s, "{\"type\":\"token\",");
            token_fields(s, t, &t->tokens[j++], origin);
            put_lit(s, "}\n");
        }
    }
}

/* ---- Chrome trace events ----------------------------------------------------------------- */

enum { TID_STEPS = 1, TID_PHASES = 2, TID_STREAM0 = 10 };

typedef struct stream_key {
    loom_request_id request;
    int32_t sample;
} stream_key;

static int stream_cmp(const void *a, const void *b) {
    const stream_key *p = a, *q = b;
    if (p->request != q->request) return p->request < q->request ? -1 : 1;
    return (p->sample > q->sample) - (p->sample < q->sample);
}

/* Opens an event: the comma between events, then ph, pid and name. */
static void ev_open(sink *s, bool *first, const char *ph) {
    put_lit(s, *first ? "\n{\"ph\":\"" : ",\n{\"ph\":\"");
    *first = false;
    put_lit(s, ph);
    put_lit(s, "\",\"pid\":1,\"name\":");
}

static void ev_tid(sink *s, int64_t tid) {
    put_lit(s, ",\"tid\":");
    put_i64(s, tid);
}

/* A counter value: Chrome's counters take numbers only, so a missing value draws as 0. */
static void put_counter(sink *s, double v) {
    put_num(s, isfinite(v) ? v : 0.0);
}

static loom_status write_chrome(sink *s, const loom_trace *t) {
    /* One thread track per (request, sample), numbered in sorted order. */
    stream_key *keys = NULL;
    size_t n_keys = 0;
    if (t->n_tokens > 0) {
        keys = loom__malloc(t->n_tokens * sizeof *keys);
        LOOM_RETURN_IF(!keys, LOOM_ERR_OUT_OF_MEMORY, "trace: out of memory writing %zu tokens",
                       t->n_tokens);
        for (size_t i = 0; i < t->n_tokens; i++)
            keys[i] = (stream_key){t->tokens[i].request, t->tokens[i].sample};
        qsort(keys, t->n_tokens, sizeof *keys, stream_cmp);
        for (size_t i = 0; i < t->n_tokens; i++)
            if (n_keys == 0 || stream_cmp(&keys[n_keys - 1], &keys[i]) != 0)
                keys[n_keys++] = keys[i];
    }
    int64_t origin = origin_of(t);
    bool first = true;
    put_lit(s, "{\"displayTimeUnit\":\"ms\",\"otherData\":{");
    meta_fields(s, t, origin);
    put_lit(s, "},\"traceEvents\":[");

    ev_open(s, &first, "M");
    put_lit(s, "\"process_name\",\"args\":{\"name\":\"loom\"}}");
    static const struct {
        int tid;
        const char *name;
    } fixed[] = {{TID_STEPS, "steps"}, {TID_PHASES, "phases"}};
    for (size_t i = 0; i < 2; i++) {
        ev_open(s, &first, "M");
        put_lit(s, "\"thread_name\"");
        ev_tid(s, fixed[i].tid);
        put_lit(s, ",\"args\":{\"name\":");
        put_cstr(s, fixed[i].name);
        put_lit(s, "}}");
    }
    for (size_t k = 0; k < n_keys; k++) {
        char name[64];
        snprintf(name, sizeof name, "request %llu sample %d", (unsigned long long)keys[k].request,
                 (int)keys[k].sample);
        ev_open(s, &first, "M");
        put_lit(s, "\"thread_name\"");
        ev_tid(s, TID_STREAM0 + (int64_t)k);
        put_lit(s, ",\"args\":{\"name\":");
        put_cstr(s, name);
        put_lit(s, "}}");
    }

    for (size_t i = 0; i < t->n_steps; i++) {
        const loom__trace_step_rec *r = &t->steps[i];
        ev_open(s, &first, "X");
        put_lit(s, "\"step\",\"cat\":\"step\"");
        ev_tid(s, TID_STEPS);
        put_lit(s, ",\"ts\":");
        put_us(s, r->start_ns - origin);
        put_lit(s, ",\"dur\":");
        put_us(s, r->end_ns - r->start_ns);
        put_lit(s, ",\"args\":{\"step\":");
        put_i64(s, r->step);
        put_lit(s, ",\"n_seqs\":");
        put_i64(s, r->n_seqs);
        put_lit(s, ",\"n_tokens\":");
        put_i64(s, r->n_tokens);
        put_lit(s, "}}");
        for (int32_t j = 0; j < r->n_phases; j++) {
            const loom__trace_phase_rec *p = &t->phases[r->first_phase + (size_t)j];
            ev_open(s, &first, "X");
            put_cstr(s, t->names[p->name]);
            put_lit(s, ",\"cat\":\"phase\"");
            ev_tid(s, TID_PHASES);
            put_lit(s, ",\"ts\":");
            put_us(s, p->start_ns - origin);
            put_lit(s, ",\"dur\":");
            put_us(s, p->end_ns - p->start_ns);
            put_lit(s, ",\"args\":{\"step\":");
            put_i64(s, r->step);
            put_lit(s, "}}");
        }
    }

    for (size_t i = 0; i < t->n_tokens; i++) {
        const loom__trace_token_rec *k = &t->tokens[i];
        stream_key key = {k->request, k->sample};
        const stream_key *found = bsearch(&key, keys, n_keys, sizeof *keys, stream_cmp);
        int64_t tid = TID_STREAM0 + (found ? (int64_t)(found - keys) : 0);
        ev_open(s, &first, "i");
        put_str(s, piece_of(t, k), k->piece_len, NULL);
        put_lit(s, ",\"cat\":\"token\",\"s\":\"t\"");
        ev_tid(s, tid);
        put_lit(s, ",\"ts\":");
        put_us(s, k->t_ns - origin);
        put_lit(s, ",\"args\":{");
        token_fields(s, t, k, origin);
        put_lit(s, "}}");

        char name[64];
        snprintf(name, sizeof name, "entropy %llu.%d", (unsigned long long)k->request,
                 (int)k->sample);
        ev_open(s, &first, "C");
        put_cstr(s, name);
        put_lit(s, ",\"ts\":");
        put_us(s, k->t_ns - origin);
        put_lit(s, ",\"args\":{\"before\":");
        put_counter(s, k->entropy);
        put_lit(s, ",\"after\":");
        put_counter(s, k->entropy_final);
        put_lit(s, "}}");

        snprintf(name, sizeof name, "prob %llu.%d", (unsigned long long)k->request, (int)k->sample);
        ev_open(s, &first, "C");
        put_cstr(s, name);
        put_lit(s, ",\"ts\":");
        put_us(s, k->t_ns - origin);
        put_lit(s, ",\"args\":{\"raw\":");
        put_counter(s, exp((double)k->logprob_raw));
        put_lit(s, ",\"final\":");
        put_counter(s, exp((double)k->logprob_final));
        put_lit(s, "}}");
    }
    put_lit(s, "\n]}\n");
    free(keys);
    return LOOM_OK;
}

/* ---- public entry points ----------------------------------------------------------------- */

static void snapshot_free(loom_trace *c) {
    free(c->steps);
    free(c->phases);
    free(c->tokens);
    free(c->bytes);
    free(c->names); /* the pointers only: the strings belong to the trace */
}

/* Room for n elements of elem bytes (n * elem is allocated in the trace already: no overflow);
 * false when out of memory. */
static bool alloc_array(void **p, size_t n, size_t elem) {
    *p = n ? loom__malloc(n * elem) : NULL;
    return n == 0 || *p != NULL;
}

/* A copy of t's records, so that the formatting, which takes far longer (tens of milliseconds
 * for a large trace), runs without the trace's lock: the engine appends records every step and
 * would otherwise wait for the whole write. The lock is held only for the counts and for the
 * memcpy; the copy's memory is allocated between the two (a large allocation maps fresh pages,
 * which must not fault under the lock). Records only grow between two clears, so the first n
 * of each kind counted at the first look are still there, unchanged, at the second; a clear
 * in between starts over. The phase-name strings are shared, not copied: the dictionary only
 * grows and its strings live as long as the trace (which the caller keeps alive during the
 * write). c's mutex is never used. */
static loom_status snapshot(const loom_trace *t, loom_trace *c) {
    for (;;) {
        memset(c, 0, sizeof *c);
        pthread_mutex_lock(loom__trace_mu(t));
        const uint64_t clears = t->clears;
        c->n_steps = c->cap_steps = t->n_steps;
        c->n_phases = c->cap_phases = t->n_phases;
        c->n_tokens = c->cap_tokens = t->n_tokens;
        c->n_bytes = c->cap_bytes = t->n_bytes;
        c->n_names = c->cap_names = t->n_names;
        pthread_mutex_unlock(loom__trace_mu(t));

        if (!alloc_array((void **)&c->steps, c->n_steps, sizeof *c->steps) ||
            !alloc_array((void **)&c->phases, c->n_phases, sizeof *c->phases) ||
            !alloc_array((void **)&c->tokens, c->n_tokens, sizeof *c->tokens) ||
            !alloc_array((void **)&c->bytes, c->n_bytes, 1) ||
            !alloc_array((void **)&c->names, c->n_names, sizeof *c->names)) {
            snapshot_free(c);
            return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "trace: out of memory copying the records");
        }

        pthread_mutex_lock(loom__trace_mu(t));
        const bool same = t->clears == clears;
        if (same) {
            if (c->n_steps) memcpy(c->steps, t->steps, c->n_steps * sizeof *c->steps);
            if (c->n_phases) memcpy(c->phases, t->phases, c->n_phases * sizeof *c->phases);
            if (c->n_tokens) memcpy(c->tokens, t->tokens, c->n_tokens * sizeof *c->tokens);
            if (c->n_bytes) memcpy(c->bytes, t->bytes, c->n_bytes);
            if (c->n_names) memcpy(c->names, t->names, c->n_names * sizeof *c->names);
            c->dropped = t->dropped;
        }
        pthread_mutex_unlock(loom__trace_mu(t));
        if (same) return LOOM_OK;
        snapshot_free(c); /* cleared meanwhile: the counts are stale */
    }
}

static loom_status format_snapshot(const loom_trace *t, loom_trace_format fmt, sink *s) {
    loom_trace c;
    LOOM_TRY(snapshot(t, &c));
    loom_status st = LOOM_OK;
    if (fmt == LOOM_TRACE_JSONL)
        write_jsonl(s, &c);
    else
        st = write_chrome(s, &c);
    snapshot_free(&c);
    return st;
}

static bool format_ok(loom_trace_format fmt) {
    return fmt == LOOM_TRACE_JSONL || fmt == LOOM_TRACE_CHROME;
}

loom_status loom_trace_write(const loom_trace *t, const char *path, loom_trace_format fmt) {
    loom__clear_error();
    LOOM_CHECK_ARG(t != NULL && path != NULL);
    LOOM_RETURN_IF(!format_ok(fmt), LOOM_ERR_INVALID_ARG, "trace: unknown format %d", (int)fmt);
    FILE *f = fopen(path, "wb");
    LOOM_RETURN_IF(!f, LOOM_ERR_IO, "trace: cannot open '%s' for writing: %s", path,
                   strerror(errno));
    /* Records are many short writes: a large stdio buffer keeps them cheap. */
    (void)setvbuf(f, NULL, _IOFBF, 1 << 16);
    sink s = {.f = f};
    loom_status st = format_snapshot(t, fmt, &s);
    if (st != LOOM_OK) {
        fclose(f);
        return st;
    }
    if (!s.io_error && fflush(f) != 0) {
        s.io_error = true;
        s.err = errno;
    }
    if (fclose(f) != 0 && !s.io_error) {
        s.io_error = true;
        s.err = errno;
    }
    LOOM_RETURN_IF(s.io_error, LOOM_ERR_IO, "trace: writing '%s': %s", path, strerror(s.err));
    return LOOM_OK;
}

loom_status loom_trace_write_buffer(const loom_trace *t, loom_trace_format fmt, char *out,
                                    size_t cap, size_t *n_out) {
    loom__clear_error();
    LOOM_CHECK_ARG(t != NULL && n_out != NULL && (out != NULL || cap == 0));
    LOOM_RETURN_IF(!format_ok(fmt), LOOM_ERR_INVALID_ARG, "trace: unknown format %d", (int)fmt);
    sink s = {.buf = out, .cap = cap};
    LOOM_TRY(format_snapshot(t, fmt, &s));
    *n_out = s.n;
    LOOM_RETURN_IF(s.n > cap, LOOM_ERR_BUFFER_TOO_SMALL,
                   "trace: %zu bytes needed, the buffer holds %zu", s.n, cap);
    return LOOM_OK;
}
