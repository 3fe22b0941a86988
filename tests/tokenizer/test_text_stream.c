/* test_text_stream.c — streamed text: whole UTF-8 characters, stop strings withheld and cut. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tokenizer/text_stream.h"

typedef struct run {
    char out[256];
    size_t len;
    bool stopped;
} run;

/* Pushes pieces in order and collects what the stream releases. */
static void push_all(const char *const *pieces, size_t n, const loom__stop_set *stops, run *r) {
    char buf[64];
    loom__text_stream ts = {buf, 0, sizeof buf, 0};
    r->len = 0;
    r->stopped = false;
    for (size_t i = 0; i < n && !r->stopped; i++) {
        const char *o;
        size_t ol;
        assert_true(
            loom__text_stream_push(&ts, stops, pieces[i], strlen(pieces[i]), &o, &ol, &r->stopped));
        memcpy(r->out + r->len, o, ol);
        r->len += ol;
    }
    if (!r->stopped) {
        const char *o;
        size_t ol;
        loom__text_stream_flush(&ts, &o, &ol);
        memcpy(r->out + r->len, o, ol);
        r->len += ol;
    }
    r->out[r->len] = '\0';
}

static void test_plain_text_passes_through(void **state) {
    (void)state;
    const char *p[] = {"Hello", ",", " world"};
    run r;
    push_all(p, 3, NULL, &r);
    assert_string_equal(r.out, "Hello, world");
    assert_false(r.stopped);
}

static void test_split_utf8_is_held_until_complete(void **state) {
    (void)state;
    /* "é" = C3 A9 and "€" = E2 82 AC arriving byte by byte (byte-fallback tokens). */
    char buf[32];
    loom__text_stream ts = {buf, 0, sizeof buf, 0};
    const char *o;
    size_t ol;
    bool st;
    assert_true(loom__text_stream_push(&ts, NULL, "\xC3", 1, &o, &ol, &st));
    assert_int_equal(ol, 0);
    assert_true(loom__text_stream_push(&ts, NULL, "\xA9", 1, &o, &ol, &st));
    assert_int_equal(ol, 2);
    assert_memory_equal(o, "\xC3\xA9", 2);
    assert_true(loom__text_stream_push(&ts, NULL, "a\xE2\x82", 3, &o, &ol, &st));
    assert_int_equal(ol, 1);
    assert_true(loom__text_stream_push(&ts, NULL, "\xAC", 1, &o, &ol, &st));
    assert_int_equal(ol, 3);
}

static void test_stop_string_across_pieces_is_cut(void **state) {
    (void)state;
    const char *stop[] = {"###", "\n\nUser:"};
    size_t len[] = {3, 7};
    loom__stop_set stops = {stop, len, 2, 7};
    const char *p[] = {"The answer", " is 4.", "\n", "\nUs", "er: more"};
    run r;
    push_all(p, 5, &stops, &r);
    assert_true(r.stopped);
    assert_string_equal(r.out, "The answer is 4.");
    const char *q[] = {"a#", "#b", " c##", "#"};
    push_all(q, 4, &stops, &r);
    assert_true(r.stopped);
    assert_string_equal(r.out, "a##b c");
}

static void test_partial_stop_prefix_is_released_at_the_end(void **state) {
    (void)state;
    const char *stop[] = {"STOP"};
    size_t len[] = {4};
    loom__stop_set stops = {stop, len, 1, 4};
    const char *p[] = {"go ST", "ILL", " ST"};
    run r;
    push_all(p, 3, &stops, &r);
    assert_false(r.stopped);
    assert_string_equal(r.out, "go STILL ST");
}

static void test_piece_too_long_is_refused(void **state) {
    (void)state;
    char buf[4];
    loom__text_stream ts = {buf, 0, sizeof buf, 0};
    const char *o;
    size_t ol;
    bool st;
    assert_false(loom__text_stream_push(&ts, NULL, "12345", 5, &o, &ol, &st));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_text_passes_through),
        cmocka_unit_test(test_split_utf8_is_held_until_complete),
        cmocka_unit_test(test_stop_string_across_pieces_is_cut),
        cmocka_unit_test(test_partial_stop_prefix_is_released_at_the_end),
        cmocka_unit_test(test_piece_too_long_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
