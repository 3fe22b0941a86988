/* test_trace.c — the per-token trace: records round-trip through JSON Lines and Chrome trace
 * JSON (parsed back by a strict reader), JSON escaping of any piece bytes, phases that tile
 * their step, bad arguments, an unwritable path, clear, dropped records, appends from two
 * threads while a third writes and reads the counts, and the layer-group names and hook the
 * forward pass reports through. */
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/timer.h"
#include "json_mini.h"
#include "trace/trace.h"

/* ---- helpers ---------------------------------------------------------------------------- */

/* Writes the trace to a malloc'd buffer (size query, then fill). */
static char *render(const loom_trace *t, loom_trace_format fmt, size_t *len) {
    size_t n = 0;
    loom_status st = loom_trace_write_buffer(t, fmt, NULL, 0, &n);
    assert_true(st == LOOM_OK || st == LOOM_ERR_BUFFER_TOO_SMALL);
    char *buf = malloc(n + 1);
    assert_non_null(buf);
    size_t m = 0;
    assert_int_equal(loom_trace_write_buffer(t, fmt, buf, n, &m), LOOM_OK);
    assert_int_equal(m, n);
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Splits JSONL into parsed lines; returns how many (at most cap). */
static size_t parse_lines(const char *text, size_t len, jm_value *lines, size_t cap) {
    size_t n = 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        assert_non_null(nl); /* every line ends with a newline */
        assert_true(n < cap);
        assert_true(jm_parse(p, (size_t)(nl - p), &lines[n]));
        n++;
        p = nl + 1;
    }
    return n;
}

static void free_lines(jm_value *lines, size_t n) {
    for (size_t i = 0; i < n; i++) jm_free(&lines[i]);
}

/* True when s[0..n) is well-formed UTF-8 (what a JSON text must be). */
static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], len, cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            len = 2, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            len = 3, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            len = 4, cp = c & 0x07;
        else
            return false;
        if (i + len > n) return false;
        for (unsigned k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

static loom__trace_token token_rec(loom_request_id req, int32_t sample, int64_t step, int32_t pos,
                                   const char *piece, size_t len, int64_t t_ns) {
    return (loom__trace_token){
        .request = req,
        .sample = sample,
        .step = step,
        .pos = pos,
        .token = 1000 + pos,
        .piece = piece,
        .piece_len = len,
        .logprob_raw = -0.25f,
        .logprob_final = -0.125f,
        .entropy = 1.5,
        .entropy_final = 0.75,
        .varentropy = 2.25,
        .temperature = 0.5,
        .t_ns = t_ns,
        .since_arrival_ns = 7000,
    };
}

/* Two steps with fixed timestamps: step 0 (phases 10+20+30+40 ns from t = 1e9), one token;
 * step 1 (from 1e9 + 200), two tokens of two requests. */
static loom_trace *make_sample_trace(void) {
    loom_trace *t = NULL;
    assert_int_equal(loom_trace_create(&t), LOOM_OK);
    loom__trace_timer tm;
    const int64_t t0 = 1000000000;
    loom__trace_step_begin(&tm, 0, t0);
    loom__trace_step_phase(&tm, "schedule", t0 + 10);
    loom__trace_step_phase(&tm, "forward.layers 0-5", t0 + 30);
    loom__trace_step_phase(&tm, "sample", t0 + 60);
    loom__trace_token k = token_rec(7, 0, 0, 12, "Hello", 5, t0 + 55);
    assert_int_equal(loom__trace_add_token(t, &k), LOOM_OK);
    assert_int_equal(loom__trace_step_end(t, &tm, "events", t0 + 100, 1, 12), LOOM_OK);

    loom__trace_step_begin(&tm, 1, t0 + 200);
    loom__trace_step_phase(&tm, "schedule", t0 + 1200);
    loom__trace_step_phase(&tm, "forward.layers 0-5", t0 + 5200);
    loom__trace_step_phase(&tm, "sample", t0 + 6200);
    k = token_rec(7, 0, 1, 13, " world", 6, t0 + 6000);
    assert_int_equal(loom__trace_add_token(t, &k), LOOM_OK);
    k = token_rec(9, 1, 1, 3, "\xe2\x82", 2, t0 + 6100);
    assert_int_equal(loom__trace_add_token(t, &k), LOOM_OK);
    assert_int_equal(loom__trace_step_end(t, &tm, "events", t0 + 6500, 2, 2), LOOM_OK);
    return t;
}

/* ---- round trips ------------------------------------------------------------------------ */

static void test_jsonl_roundtrip(void **state) {
    (void)state;
    loom_trace *t = make_sample_trace();
    assert_int_equal(loom_trace_count(t), 3);
    loom_trace_info info = {.size = sizeof info};
    assert_int_equal(loom_trace_get_info(t, &info), LOOM_OK);
    assert_int_equal(info.n_steps, 2);
    assert_int_equal(info.n_tokens, 3);
    assert_int_equal(info.n_dropped, 0);

    size_t len;
    char *text = render(t, LOOM_TRACE_JSONL, &len);
    assert_true(valid_utf8((const unsigned char *)text, len));
    jm_value L[16];
    size_t n = parse_lines(text, len, L, 16);
    assert_int_equal(n, 6); /* meta, step 0, token, step 1, token, token */
    const char *types[] = {"meta", "step", "token", "step", "token", "token"};
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(jm_str(&L[i], "type"), types[i]);
        assert_string_equal(L[i].keys[0], "type"); /* "type" comes first */
    }
    assert_string_equal(jm_str(&L[0], "format"), "loom-trace");
    assert_true(jm_num(&L[0], "version") == 1);
    assert_true(jm_num(&L[0], "origin_ns") == 1e9);
    assert_true(jm_num(&L[0], "n_steps") == 2 && jm_num(&L[0], "n_tokens") == 3);
    assert_true(jm_num(&L[0], "dropped") == 0);

    /* step 0: relative to the origin (its own start) */
    assert_true(jm_num(&L[1], "step") == 0);
    assert_true(jm_num(&L[1], "start_ns") == 0 && jm_num(&L[1], "end_ns") == 100);
    assert_true(jm_num(&L[1], "dur_ns") == 100);
    assert_true(jm_num(&L[1], "n_seqs") == 1 && jm_num(&L[1], "n_tokens") == 12);
    const jm_value *ph = jm_get(&L[1], "phases");
    assert_true(ph && ph->kind == JM_ARR && ph->n == 4);
    const char *names[] = {"schedule", "forward.layers 0-5", "sample", "events"};
    const double durs[] = {10, 20, 30, 40};
    for (size_t i = 0; i < 4; i++) {
        assert_string_equal(jm_str(&ph->items[i], "name"), names[i]);
        assert_true(jm_num(&ph->items[i], "dur_ns") == durs[i]);
    }

    const jm_value *k = &L[2];
    assert_true(jm_num(k, "request") == 7 && jm_num(k, "sample") == 0);
    assert_true(jm_num(k, "step") == 0 && jm_num(k, "pos") == 12);
    assert_true(jm_num(k, "token") == 1012);
    assert_string_equal(jm_str(k, "piece"), "Hello");
    assert_null(jm_get(k, "piece_hex"));
    assert_true(jm_num(k, "logprob_raw") == -0.25 && jm_num(k, "logprob_final") == -0.125);
    assert_true(jm_num(k, "entropy") == 1.5 && jm_num(k, "entropy_final") == 0.75);
    assert_true(jm_num(k, "varentropy") == 2.25 && jm_num(k, "temperature") == 0.5);
    assert_true(jm_num(k, "t_ns") == 55 && jm_num(k, "since_arrival_ns") == 7000);

    assert_true(jm_num(&L[3], "start_ns") == 200 && jm_num(&L[3], "dur_ns") == 6300);
    assert_string_equal(jm_str(&L[4], "piece"), " world");
    /* the lone lead byte pair of a 3-byte character: two U+FFFD and the exact bytes */
    assert_string_equal(jm_str(&L[5], "piece"), "\xef\xbf\xbd\xef\xbf\xbd");
    assert_string_equal(jm_str(&L[5], "piece_hex"), "e282");
    assert_true(jm_num(&L[5], "request") == 9 && jm_num(&L[5], "sample") == 1);

    free_lines(L, n);
    free(text);
    loom_trace_free(t);
}

static const jm_value *find_event(const jm_value *evs, const char *ph, const char *name,
                                  size_t nth) {
    for (size_t i = 0; i < evs->n; i++) {
        const jm_value *e = &evs->items[i];
        if (strcmp(jm_str(e, "ph"), ph) == 0 && strcmp(jm_str(e, "name"), name) == 0) {
            if (nth-- == 0) return e;
        }
    }
    return NULL;
}

static void test_chrome_roundtrip(void **state) {
    (void)state;
    loom_trace *t = make_sample_trace();
    size_t len;
    char *text = render(t, LOOM_TRACE_CHROME, &len);
    assert_true(valid_utf8((const unsigned char *)text, len));
    jm_value root;
    assert_true(jm_parse(text, len, &root));
    assert_string_equal(jm_str(&root, "displayTimeUnit"), "ms");
    const jm_value *od = jm_get(&root, "otherData");
    assert_true(jm_num(od, "origin_ns") == 1e9 && jm_num(od, "dropped") == 0);
    const jm_value *evs = jm_get(&root, "traceEvents");
    assert_true(evs && evs->kind == JM_ARR);
    size_t n_x = 0, n_c = 0, n_i = 0, n_m = 0;
    for (size_t i = 0; i < evs->n; i++) {
        const jm_value *e = &evs->items[i];
        const char *ph = jm_str(e, "ph");
        assert_non_null(ph);
        assert_true(jm_num(e, "pid") == 1);
        assert_non_null(jm_str(e, "name"));
        if (!strcmp(ph, "X")) {
            n_x++;
            assert_true(jm_num(e, "ts") >= 0 && jm_num(e, "dur") >= 0);
        } else if (!strcmp(ph, "C")) {
            n_c++;
        } else if (!strcmp(ph, "i")) {
            n_i++;
            assert_string_equal(jm_str(e, "s"), "t");
        } else {
            assert_string_equal(ph, "M");
            n_m++;
        }
    }
    assert_int_equal(n_x, 2 + 8);     /* steps + phases */
    assert_int_equal(n_i, 3);         /* one instant per token */
    assert_int_equal(n_c, 2 * 3);     /* entropy and prob per token */
    assert_int_equal(n_m, 1 + 2 + 2); /* process, steps, phases, two streams */

    const jm_value *s1 = find_event(evs, "X", "step", 1);
    assert_non_null(s1);
    assert_true(jm_num(s1, "ts") == 0.2 && jm_num(s1, "dur") == 6.3);
    assert_true(jm_num(s1, "tid") == 1);
    assert_true(jm_num(jm_get(s1, "args"), "n_seqs") == 2);
    const jm_value *fw = find_event(evs, "X", "forward.layers 0-5", 1);
    assert_true(fw && jm_num(fw, "ts") == 1.2 && jm_num(fw, "dur") == 4.0);
    assert_true(jm_num(fw, "tid") == 2);

    const jm_value *h = find_event(evs, "C", "entropy 7.0", 0);
    assert_non_null(h);
    assert_true(jm_num(jm_get(h, "args"), "before") == 1.5);
    assert_true(jm_num(jm_get(h, "args"), "after") == 0.75);
    const jm_value *p = find_event(evs, "C", "prob 9.1", 0);
    assert_non_null(p);
    assert_true(fabs(jm_num(jm_get(p, "args"), "final") - exp(-0.125)) < 1e-8);
    const jm_value *w = find_event(evs, "i", " world", 0);
    assert_non_null(w);
    assert_true(jm_num(w, "tid") == 10); /* request 7 sample 0 is the first stream */
    assert_true(jm_num(jm_get(w, "args"), "pos") == 13);
    const jm_value *m = find_event(evs, "i", "\xef\xbf\xbd\xef\xbf\xbd", 0);
    assert_true(m && jm_num(m, "tid") == 11);
    assert_string_equal(jm_str(jm_get(m, "args"), "piece_hex"), "e282");

    jm_free(&root);
    free(text);
    loom_trace_free(t);
}

/* The file writer gives the same bytes as the buffer writer. */
static void test_file_matches_buffer(void **state) {
    (void)state;
    loom_trace *t = make_sample_trace();
    const char *dir = getenv("LOOM_TEST_TMP");
    char path[512];
    snprintf(path, sizeof path, "%s/test_trace_%d.json", dir ? dir : "/tmp", (int)getpid());
    for (int f = 0; f < 2; f++) {
        loom_trace_format fmt = f ? LOOM_TRACE_CHROME : LOOM_TRACE_JSONL;
        size_t len;
        char *text = render(t, fmt, &len);
        assert_int_equal(loom_trace_write(t, path, fmt), LOOM_OK);
        FILE *fp = fopen(path, "rb");
        assert_non_null(fp);
        char *back = malloc(len + 2);
        size_t got = fread(back, 1, len + 1, fp);
        fclose(fp);
        assert_int_equal(got, len);
        assert_memory_equal(back, text, len);
        free(back);
        free(text);
    }
    remove(path);
    loom_trace_free(t);
}

/* ---- numbers ---------------------------------------------------------------------------- */

/* Floats in their shortest exact form, no inf/nan in JSON, and a '.' decimal point whatever
 * the host program's locale (checked where a comma locale is installed). */
static void test_numbers(void **state) {
    (void)state;
    loom_trace *t = NULL;
    assert_int_equal(loom_trace_create(&t), LOOM_OK);
    loom__trace_token k = token_rec(1, 0, 0, 0, "x", 1, 0);
    k.logprob_raw = -0.3f;
    k.logprob_final = -INFINITY;
    k.entropy = NAN;
    k.entropy_final = 1e-300;
    k.varentropy = 123456.789;
    assert_int_equal(loom__trace_add_token(t, &k), LOOM_OK);
    size_t len;
    char *text = render(t, LOOM_TRACE_JSONL, &len);
    assert_non_null(strstr(text, "\"logprob_raw\":-0.3,"));
    assert_non_null(strstr(text, "\"logprob_final\":null,"));
    assert_non_null(strstr(text, "\"entropy\":null,"));
    assert_non_null(strstr(text, "\"entropy_final\":1e-300,"));
    assert_non_null(strstr(text, "\"varentropy\":123456.789,"));
    free(text);
    text = render(t, LOOM_TRACE_CHROME, &len);
    jm_value root;
    assert_true(jm_parse(text, len, &root)); /* counters hold 0 for the missing values */
    jm_free(&root);
    free(text);

    static const char *comma_locales[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8",
                                          "ru_RU.UTF-8"};
    bool tried = false;
    for (size_t i = 0; i < sizeof comma_locales / sizeof *comma_locales && !tried; i++) {
        if (!setlocale(LC_NUMERIC, comma_locales[i])) continue;
        tried = true;
        text = render(t, LOOM_TRACE_JSONL, &len);
        assert_non_null(strstr(text, "\"logprob_raw\":-0.3,"));
        assert_non_null(strstr(text, "\"varentropy\":123456.789,"));
        free(text);
        setlocale(LC_NUMERIC, "C");
    }
    if (!tried) print_message("no comma-decimal locale installed: locale part not run\n");
    loom_trace_free(t);
}

/* ---- escaping --------------------------------------------------------------------------- */

typedef struct esc_case {
    const char *in;
    size_t len;
    const char *want; /* decoded JSON string */
    size_t want_len;
    const char *hex; /* piece_hex, or NULL when none is expected */
} esc_case;

#define S(x) x, sizeof(x) - 1

static void test_escaping(void **state) {
    (void)state;
    static const esc_case cases[] = {
        {S("a\"b\\c/"), S("a\"b\\c/"), NULL},
        {S("\n\t\r\x01\x1f\x7f"), S("\n\t\r\x01\x1f\x7f"), NULL},
        {S("a\0b"), S("a\0b"), NULL},
        {S("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"), S("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"),
         NULL},
        {S("\xe2\x82"), S("\xef\xbf\xbd\xef\xbf\xbd"), "e282"},
        {S("x\xff"), S("x\xef\xbf\xbd"), "78ff"},
        {S("\xc0\xaf"), S("\xef\xbf\xbd\xef\xbf\xbd"), "c0af"},                   /* overlong '/' */
        {S("\xed\xa0\x80"), S("\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"), "eda080"}, /* surrogate */
        {S("\xf4\x90\x80\x80"), S("\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"),
         "f4908080"},                                             /* > U+10FFFF */
        {S("\x80\xc3\xa9"), S("\xef\xbf\xbd\xc3\xa9"), "80c3a9"}, /* resync after */
        {S(""), S(""), NULL},
    };
    const size_t n_cases = sizeof cases / sizeof cases[0];
    loom_trace *t = NULL;
    assert_int_equal(loom_trace_create(&t), LOOM_OK);
    for (size_t i = 0; i < n_cases; i++) {
        loom__trace_token k =
            token_rec(1, 0, 0, (int32_t)i, cases[i].in, cases[i].len, 100 + (int64_t)i);
        assert_int_equal(loom__trace_add_token(t, &k), LOOM_OK);
    }
    /* Phase names go through the same escaper. */
    loom__trace_timer tm;
    loom__trace_step_begin(&tm, 0, 0);
    loom__trace_step_phase(&tm, "quote\"back\\slash\ttab", 5);
    assert_int_equal(loom__trace_step_end(t, &tm, "\xe2\x82 bad", 9, 1, 1), LOOM_OK);

    for (int f = 0; f < 2; f++) {
        size_t len;
        char *text = render(t, f ? LOOM_TRACE_CHROME : LOOM_TRACE_JSONL, &len);
        assert_true(valid_utf8((const unsigned char *)text, len));
        for (size_t i = 0; i < len; i++) { /* raw control bytes never appear in strings */
            unsigned char c = (unsigned char)text[i];
            assert_true(c >= 0x20 || c == '\n');
            assert_true(c != 0x7f);
        }
        if (f == 0) {
            jm_value L[32];
            size_t n = parse_lines(text, len, L, 32);
            assert_int_equal(n, 2 + n_cases); /* meta, step, tokens */
            const jm_value *ph = jm_get(&L[1], "phases");
            assert_string_equal(jm_str(&ph->items[0], "name"), "quote\"back\\slash\ttab");
            assert_string_equal(jm_str(&ph->items[1], "name"), "\xef\xbf\xbd\xef\xbf\xbd bad");
            for (size_t i = 0; i < n_cases; i++) {
                const jm_value *k = &L[2 + i];
                const jm_value *pc = jm_get(k, "piece");
                assert_non_null(pc);
                assert_int_equal(pc->len, cases[i].want_len);
                assert_memory_equal(pc->str, cases[i].want, cases[i].want_len);
                const char *hex = jm_str(k, "piece_hex");
                if (cases[i].hex)
                    assert_string_equal(hex, cases[i].hex);
                else
                    assert_null(hex);
            }
            free_lines(L, n);
            /* The documented spelling of escapes. */
            assert_non_null(strstr(text, "\"a\\\"b\\\\c/\""));
            assert_non_null(strstr(text, "\"\\u000a\\u0009\\u000d\\u0001\\u001f\\u007f\""));
            assert_non_null(strstr(text, "\"a\\u0000b\""));
            assert_non_null(strstr(text, "\"\\ufffd\\ufffd\""));
        } else {
            jm_value root;
            assert_true(jm_parse(text, len, &root));
            jm_free(&root);
        }
        free(text);
    }
    loom_trace_free(t);
}

/* ---- phases tile the step --------------------------------------------------------------- */

static void check_tiled(const jm_value *step) {
    const jm_value *ph = jm_get(step, "phases");
    assert_true(ph && ph->n >= 1);
    double at = jm_num(step, "start_ns"), sum = 0;
    for (size_t i = 0; i < ph->n; i++) {
        assert_true(jm_num(&ph->items[i], "start_ns") == at);
        at = jm_num(&ph->items[i], "end_ns");
        double d = jm_num(&ph->items[i], "dur_ns");
        assert_true(d >= 0);
        sum += d;
    }
    assert_true(at == jm_num(step, "end_ns"));
    assert_true(sum == jm_num(step, "dur_ns"));
}

static void test_phases_tile_the_step(void **state) {
    (void)state;
    loom_trace *t = NULL;
    assert_int_equal(loom_trace_create(&t), LOOM_OK);
    loom__trace_timer tm;

    /* Real clock, with some work between marks. */
    volatile double sink = 0;
    loom__trace_step_begin(&tm, 0, loom__now_ns());
    for (int i = 0; i < 100000; i++) sink += sqrt((double)i);
    loom__trace_step_phase(&tm, "schedule", loom__now_ns());
    for (int g = 0; g < 3; g++) {
        static const char *groups[] = {"forward.layers 0-5", "forward.layers 6-11",
                                       "forward.layers 12-17"};
        for (int i = 0; i < 50000; i++) sink += sqrt((double)i);
        loom__trace_step_phase(&tm, groups[g], loom__now_ns());
    }
    loom__trace_step_phase(&tm, "logits", loom__now_ns());
    (void)sink; /* volatile: the loops above are real work between the marks */
    loom__trace_step_phase(&tm, "sample", loom__now_ns());
    assert_int_equal(loom__trace_step_end(t, &tm, "events", loom__now_ns(), 4, 4), LOOM_OK);

    /* A mark before the previous one is clamped: no negative phase. */
    loom__trace_step_begin(&tm, 1, 1000);
    loom__trace_step_phase(&tm, "a", 1500);
    loom__trace_step_phase(&tm, "b", 1200);
    assert_int_equal(loom__trace_step_end(t, &tm, "c", 1600, 1, 1), LOOM_OK);

    /* More phases than the timer holds: the rest merge into the last, renamed "other". */
    loom__trace_step_begin(&tm, 2, 5000);
    for (int i = 0; i < LOOM__TRACE_MAX_PHASES + 10; i++)
        loom__trace_step_phase(&tm, "layer", 5000 + 10 * (i + 1));
    int64_t end = 5000 + 10 * (LOOM__TRACE_MAX_PHASES + 10) + 7;
    assert_int_equal(loom__trace_step_end(t, &tm, "events", end, 1, 1), LOOM_OK);
    assert_int_equal(tm.n_phases, LOOM__TRACE_MAX_PHASES);

    /* Tracing off: the timer still runs, nothing is stored. */
    loom__trace_step_begin(&tm, 3, 0);
    assert_int_equal(loom__trace_step_end(NULL, &tm, "events", 10, 1, 1), LOOM_OK);

    size_t len;
    char *text = render(t, LOOM_TRACE_JSONL, &len);
    jm_value L[8];
    size_t n = parse_lines(text, len, L, 8);
    assert_int_equal(n, 4);
    for (size_t i = 1; i < n; i++) check_tiled(&L[i]);
    assert_int_equal(jm_get(&L[1], "phases")->n, 7);
    const jm_value *ph2 = jm_get(&L[2], "phases");
    assert_true(jm_num(&ph2->items[1], "dur_ns") == 0);
    const jm_value *ph3 = jm_get(&L[3], "phases");
    assert_int_equal(ph3->n, LOOM__TRACE_MAX_PHASES);
    assert_string_equal(jm_str(&ph3->items[LOOM__TRACE_MAX_PHASES - 1], "name"), "other");
    assert_true(jm_num(&L[3], "dur_ns") == (double)(end - 5000));
    free_lines(L, n);
    free(text);

    /* Hand-made steps whose phases do not tile are refused, and nothing is stored. */
    loom__trace_phase gap[2] = {{"a", 0, 10}, {"b", 11, 20}};
    loom__trace_step s = {.step = 9, .start_ns = 0, .end_ns = 20, .phases = gap, .n_phases = 2};
    assert_int_equal(loom__trace_add_step(t, &s), LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "'b'"));
    loom__trace_phase overlap[2] = {{"a", 0, 10}, {"b", 9, 20}};
    s.phases = overlap;
    assert_int_equal(loom__trace_add_step(t, &s), LOOM_ERR_INVALID_ARG);
    loom__trace_phase short_end[1] = {{"a", 0, 10}};
    s.phases = short_end;
    s.n_phases = 1;
    assert_int_equal(loom__trace_add_step(t, &s), LOOM_ERR_INVALID_ARG);
    loom__trace_phase late_start[1] = {{"a", 5, 20}};
    s.phases = late_start;
    assert_int_equal(loom__trace_add_step(t, &s), LOOM_ERR_INVALID_ARG);
    loom__trace_phase backwards[1] = {{"a", 0, -5}};
    s.phases = backwards;
    s.end_ns = -5;
    assert_int_equal(loom__trace_add_step(t, &s), LOOM_ERR_INVALID_ARG);
    loom__trace_phase unnamed[1] = {{"", 0, 20}};
    s.phases = unnamed;
    s.end_ns = 20;
    assert_int_equal(loom__trace_add_step(t, &s), LOOM_ERR_INVALID_ARG);
    s.n_phases = 0;
    assert_int_equal(loom__trace_add_step(t, &s), LOOM_ERR_INVALID_ARG);
    s.n_phases = LOOM__TRACE_MAX_PHASES + 1;
    assert_int_equal(loom__trace_add_step(t, &s), LOOM_ERR_INVALID_ARG);
    loom_trace_info info = {.size = sizeof info};
    assert_int_equal(loom_trace_get_info(t, &info), LOOM_OK);
    assert_int_equal(info.n_steps, 3);
    assert_int_equal(info.n_dropped, 0);
    loom_trace_free(t);
}

/* ---- bad input, IO errors, clear, dropped ------------------------------------------------ */

static void test_bad_args(void **state) {
    (void)state;
    loom_trace *t = make_sample_trace();
    loom_trace_info info = {.size = sizeof info};
    size_t n = 0;
    char buf[8];
    assert_int_equal(loom_trace_create(NULL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_trace_get_info(NULL, &info), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_trace_get_info(t, NULL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_trace_write(NULL, "x", LOOM_TRACE_JSONL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_trace_write(t, NULL, LOOM_TRACE_JSONL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_trace_write_buffer(NULL, LOOM_TRACE_JSONL, buf, 8, &n),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_trace_write_buffer(t, LOOM_TRACE_JSONL, buf, 8, NULL),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_trace_write_buffer(t, LOOM_TRACE_JSONL, NULL, 8, &n),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_trace_write_buffer(t, (loom_trace_format)7, buf, 8, &n),
                     LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "format 7"));
    assert_int_equal(loom_trace_count(NULL), 0);
    loom_trace_free(NULL);
    loom_trace_clear(NULL);

    /* A trace whose only piece is empty (nothing in its byte pool yet) writes fine. */
    loom_trace *e = NULL;
    assert_int_equal(loom_trace_create(&e), LOOM_OK);
    loom__trace_token k = token_rec(1, 0, 0, 0, NULL, 0, 0);
    assert_int_equal(loom__trace_add_token(e, &k), LOOM_OK);
    for (int f = 0; f < 2; f++) {
        size_t len;
        char *text = render(e, f ? LOOM_TRACE_CHROME : LOOM_TRACE_JSONL, &len);
        assert_non_null(strstr(text, "\"piece\":\"\""));
        free(text);
    }
    loom_trace_free(e);

    /* Internal producers */
    k = token_rec(1, 0, 0, 0, NULL, 3, 0);
    assert_int_equal(loom__trace_add_token(t, &k), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__trace_add_token(NULL, &k), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__trace_add_token(t, NULL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__trace_add_step(t, NULL), LOOM_ERR_INVALID_ARG);
    k.piece_len = 0; /* a NULL empty piece is fine */
    assert_int_equal(loom__trace_add_token(t, &k), LOOM_OK);

    /* A buffer that is too small gets a prefix and the full size. */
    size_t full = 0;
    assert_int_equal(loom_trace_write_buffer(t, LOOM_TRACE_JSONL, NULL, 0, &full),
                     LOOM_ERR_BUFFER_TOO_SMALL);
    assert_true(full > sizeof buf);
    memset(buf, 0, sizeof buf);
    assert_int_equal(loom_trace_write_buffer(t, LOOM_TRACE_JSONL, buf, sizeof buf, &n),
                     LOOM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, full);
    assert_memory_equal(buf, "{\"type\":", 8);
    loom_trace_free(t);
}

static void test_unwritable_path(void **state) {
    (void)state;
    loom_trace *t = make_sample_trace();
    const char *bad = "/nonexistent-loom-dir/trace.jsonl";
    assert_int_equal(loom_trace_write(t, bad, LOOM_TRACE_JSONL), LOOM_ERR_IO);
    assert_non_null(strstr(loom_last_error(), bad));
    assert_non_null(strstr(loom_last_error(), "No such file"));
    assert_int_equal(loom_trace_write(t, "/", LOOM_TRACE_CHROME), LOOM_ERR_IO);
    /* A full device fails at flush or close, not silently. */
    FILE *probe = fopen("/dev/full", "wb");
    if (probe) {
        fclose(probe);
        assert_int_equal(loom_trace_write(t, "/dev/full", LOOM_TRACE_JSONL), LOOM_ERR_IO);
        assert_non_null(strstr(loom_last_error(), "/dev/full"));
    }
    /* An unknown format is refused before the file is touched. */
    const char *dir = getenv("LOOM_TEST_TMP");
    char path[512];
    snprintf(path, sizeof path, "%s/test_trace_fmt_%d.json", dir ? dir : "/tmp", (int)getpid());
    remove(path);
    assert_int_equal(loom_trace_write(t, path, (loom_trace_format)-1), LOOM_ERR_INVALID_ARG);
    assert_null(fopen(path, "rb"));
    loom_trace_free(t);
}

static void test_clear_and_dropped(void **state) {
    (void)state;
    loom_trace *t = make_sample_trace();
    /* A piece whose length cannot be stored: the record is dropped and counted. */
    static const char one = 'x';
    loom__trace_token k = token_rec(1, 0, 5, 0, &one, SIZE_MAX, 0);
    assert_int_equal(loom__trace_add_token(t, &k), LOOM_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(loom_last_error(), "dropped"));
    loom_trace_info info = {.size = sizeof info};
    assert_int_equal(loom_trace_get_info(t, &info), LOOM_OK);
    assert_int_equal(info.n_tokens, 3);
    assert_int_equal(info.n_dropped, 1);
    size_t len;
    char *text = render(t, LOOM_TRACE_JSONL, &len);
    assert_non_null(strstr(text, "\"dropped\":1}"));
    free(text);

    loom_trace_clear(t);
    assert_int_equal(loom_trace_count(t), 0);
    assert_int_equal(loom_trace_get_info(t, &info), LOOM_OK);
    assert_true(info.n_steps == 0 && info.n_tokens == 0 && info.n_dropped == 0);
    text = render(t, LOOM_TRACE_JSONL, &len);
    jm_value L[4];
    size_t n = parse_lines(text, len, L, 4);
    assert_int_equal(n, 1);
    assert_true(jm_num(&L[0], "n_steps") == 0 && jm_num(&L[0], "origin_ns") == 0);
    free_lines(L, n);
    free(text);
    text = render(t, LOOM_TRACE_CHROME, &len);
    jm_value root;
    assert_true(jm_parse(text, len, &root));
    jm_free(&root);
    free(text);

    /* Usable again after clear. */
    k = token_rec(3, 0, 0, 0, "again", 5, 42);
    assert_int_equal(loom__trace_add_token(t, &k), LOOM_OK);
    assert_int_equal(loom_trace_count(t), 1);
    text = render(t, LOOM_TRACE_JSONL, &len);
    assert_non_null(strstr(text, "\"piece\":\"again\""));
    assert_null(strstr(text, "Hello"));
    free(text);
    loom_trace_free(t);
}

/* ---- threads ---------------------------------------------------------------------------- */

/* ThreadSanitizer keeps a shadow of every allocation and of every synchronisation a reader and
 * two producers make; at the full size its internal allocator runs out of memory, so under TSan
 * the producers append a tenth as much (the interleavings tested stay the same). */
#if defined(__SANITIZE_THREAD__)
#define PRODUCER_STEPS 40
#else
#define PRODUCER_STEPS 400
#endif
#define TOKENS_PER_STEP 4

typedef struct producer_arg {
    loom_trace *t;
    loom_request_id request;
} producer_arg;

static void *producer(void *p) {
    producer_arg *a = p;
    loom__trace_timer tm;
    char piece[16];
    for (int64_t s = 0; s < PRODUCER_STEPS; s++) {
        loom__trace_step_begin(&tm, s, loom__now_ns());
        loom__trace_step_phase(&tm, "schedule", loom__now_ns());
        loom__trace_step_phase(&tm, "forward", loom__now_ns());
        for (int i = 0; i < TOKENS_PER_STEP; i++) {
            int n = snprintf(piece, sizeof piece, "t%lld\n\"", (long long)s);
            loom__trace_token k =
                token_rec(a->request, i, s, (int32_t)s, piece, (size_t)n, loom__now_ns());
            if (loom__trace_add_token(a->t, &k) != LOOM_OK) return (void *)1;
        }
        if (loom__trace_step_end(a->t, &tm, "sample", loom__now_ns(), TOKENS_PER_STEP,
                                 TOKENS_PER_STEP) != LOOM_OK)
            return (void *)1;
    }
    return NULL;
}

#if defined(__SANITIZE_THREAD__)
#define READER_PARSES 8
#else
#define READER_PARSES 40
#endif

typedef struct reader_arg {
    loom_trace *t;
    atomic_int stop;
    int n_parsed;
    int failures;
} reader_arg;

static void *reader(void *p) {
    reader_arg *a = p;
    char *buf = NULL;
    size_t cap = 0;
    do { /* at least one write, even if the producers are done before this thread starts */
        loom_trace_format fmt = a->n_parsed % 2 ? LOOM_TRACE_CHROME : LOOM_TRACE_JSONL;
        size_t n = 0;
        loom_status st;
        while ((st = loom_trace_write_buffer(a->t, fmt, buf, cap, &n)) ==
               LOOM_ERR_BUFFER_TOO_SMALL) {
            free(buf);
            cap = n + n / 2;
            buf = malloc(cap);
            if (!buf) {
                a->failures++;
                return NULL;
            }
        }
        if (st != LOOM_OK) {
            a->failures++;
            break;
        }
        /* A snapshot is always a whole, valid document (parsed a limited number of times:
         * the reader's many small allocations weigh on ThreadSanitizer). */
        if (fmt == LOOM_TRACE_CHROME && a->n_parsed < READER_PARSES) {
            jm_value root;
            if (!jm_parse(buf, n, &root))
                a->failures++;
            else
                jm_free(&root);
        } else if (n == 0 || buf[n - 1] != '\n') {
            a->failures++;
        }
        (void)loom_trace_count(a->t);
        a->n_parsed++;
        /* Each write copies the records under the trace's lock (it formats without it), so
         * back-to-back writes of a growing trace still take the lock for ever longer copies;
         * a pause between them keeps the run short under ASan and TSan and still interleaves
         * them with the appends. */
        nanosleep(&(struct timespec){.tv_nsec = 200000}, NULL);
    } while (!atomic_load(&a->stop));
    free(buf);
    return NULL;
}

static void test_concurrent_append_and_write(void **state) {
    (void)state;
    loom_trace *t = NULL;
    assert_int_equal(loom_trace_create(&t), LOOM_OK);
    producer_arg pa[2] = {{t, 1}, {t, 2}};
    reader_arg ra = {.t = t};
    atomic_init(&ra.stop, 0);
    pthread_t th[3];
    assert_int_equal(pthread_create(&th[2], NULL, reader, &ra), 0);
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, producer, &pa[i]), 0);
    for (int i = 0; i < 2; i++) {
        void *ret = (void *)2;
        assert_int_equal(pthread_join(th[i], &ret), 0);
        assert_null(ret);
    }
    atomic_store(&ra.stop, 1);
    assert_int_equal(pthread_join(th[2], NULL), 0);
    assert_int_equal(ra.failures, 0);
    assert_true(ra.n_parsed > 0);

    loom_trace_info info = {.size = sizeof info};
    assert_int_equal(loom_trace_get_info(t, &info), LOOM_OK);
    assert_int_equal(info.n_steps, 2 * PRODUCER_STEPS);
    assert_int_equal(info.n_tokens, 2 * PRODUCER_STEPS * TOKENS_PER_STEP);
    assert_int_equal(info.n_dropped, 0);
    size_t len;
    char *text = render(t, LOOM_TRACE_JSONL, &len);
    size_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    assert_int_equal(lines, 1 + info.n_steps + info.n_tokens);
    free(text);

    /* clear racing a producer and a writer: counts stay consistent, every write is still a
     * whole document (a write that a clear overtakes copies the records again) */
    reader_arg rb = {.t = t};
    atomic_init(&rb.stop, 0);
    assert_int_equal(pthread_create(&th[2], NULL, reader, &rb), 0);
    assert_int_equal(pthread_create(&th[0], NULL, producer, &pa[0]), 0);
    for (int i = 0; i < 50; i++) {
        loom_trace_clear(t);
        nanosleep(&(struct timespec){.tv_nsec = 50000}, NULL);
    }
    assert_int_equal(pthread_join(th[0], NULL), 0);
    atomic_store(&rb.stop, 1);
    assert_int_equal(pthread_join(th[2], NULL), 0);
    assert_int_equal(rb.failures, 0);
    assert_int_equal(loom_trace_get_info(t, &info), LOOM_OK);
    assert_true(info.n_tokens <= (size_t)PRODUCER_STEPS * TOKENS_PER_STEP);
    assert_true(info.n_steps <= PRODUCER_STEPS);
    loom_trace_free(t);
}

/* ---- layer groups ------------------------------------------------------------------------ */

static void test_layer_groups(void **state) {
    (void)state;
    static const struct {
        int32_t n_layer, every, n_groups;
        const char *last; /* name of the last group */
    } cases[] = {{18, 5, 4, "forward.layers 15-17"}, {26, 7, 4, "forward.layers 21-25"},
                 {6, 2, 3, "forward.layers 4-5"},    {5, 2, 3, "forward.layers 4-4"},
                 {4, 1, 4, "forward.layers 3-3"},    {2, 1, 2, "forward.layers 1-1"},
                 {1, 1, 1, "forward.layers 0-0"},    {0, 1, 1, "forward.layers 0-0"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        loom__trace_layers ln;
        loom__trace_layers_init(&ln, cases[c].n_layer);
        assert_int_equal(ln.every, cases[c].every);
        assert_int_equal(ln.n_groups, cases[c].n_groups);
        assert_true(ln.n_groups <= LOOM__TRACE_LAYER_GROUPS);
        assert_string_equal(ln.names[ln.n_groups - 1], cases[c].last);
    }
    loom__trace_layers ln;
    loom__trace_layers_init(&ln, 18);
    assert_string_equal(ln.names[0], "forward.layers 0-4");
    assert_string_equal(ln.names[1], "forward.layers 5-9");

    /* The hook closes one phase per group, named by the group's first layer, and the step
     * still tiles. */
    loom_trace *t = NULL;
    assert_int_equal(loom_trace_create(&t), LOOM_OK);
    loom__trace_timer tm;
    loom__trace_layer_hook hook = {.tm = &tm, .layers = &ln};
    loom__trace_step_begin(&tm, 0, loom__now_ns());
    loom__trace_step_phase(&tm, "schedule", loom__now_ns());
    for (int32_t il = 0; il < 18; il++) {
        if ((il + 1) % ln.every == 0 || il == 17) loom__trace_on_layers(&hook, il - il % 5, il);
    }
    assert_int_equal(loom__trace_step_end(t, &tm, "logits", loom__now_ns(), 1, 1), LOOM_OK);
    assert_int_equal(tm.n_phases, 6);
    for (int32_t g = 0; g < 4; g++) assert_string_equal(tm.phases[1 + g].name, ln.names[g]);
    size_t len = 0;
    char *text = render(t, LOOM_TRACE_JSONL, &len);
    assert_non_null(strstr(text, "\"forward.layers 10-14\""));
    free(text);
    loom_trace_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonl_roundtrip),
        cmocka_unit_test(test_chrome_roundtrip),
        cmocka_unit_test(test_file_matches_buffer),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_phases_tile_the_step),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_unwritable_path),
        cmocka_unit_test(test_clear_and_dropped),
        cmocka_unit_test(test_concurrent_append_and_write),
        cmocka_unit_test(test_layer_groups),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
