/* test_pages.c — core/pages.h: the whole pages inside a range, and the huge-page hint leaving
 * memory usable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/pages.h"

static void test_whole_pages(void **state) {
    (void)state;
    const uintptr_t P = (uintptr_t)sysconf(_SC_PAGESIZE);
    char *buf = aligned_alloc(P, 8 * P);
    assert_non_null(buf);
    uintptr_t b = 0, e = 0, a = (uintptr_t)buf;
    /* aligned both ends */
    assert_true(loom__whole_pages(buf, 8 * P, &b, &e));
    assert_true(b == a && e == a + 8 * P);
    /* one byte in: the first page is partial, the last one whole */
    assert_true(loom__whole_pages(buf + 1, 8 * P - 1, &b, &e));
    assert_true(b == a + P && e == a + 8 * P);
    /* partial at both ends */
    assert_true(loom__whole_pages(buf + 1, 8 * P - 2, &b, &e));
    assert_true(b == a + P && e == a + 7 * P);
    /* inside one page, or across a boundary without a whole page: none */
    assert_false(loom__whole_pages(buf + 1, P - 2, &b, &e));
    assert_false(loom__whole_pages(buf + P / 2, P, &b, &e));
    assert_false(loom__whole_pages(buf, 0, &b, &e));
    assert_false(loom__whole_pages(NULL, 8 * P, &b, &e));
    free(buf);
}

static void test_advise_huge_pages(void **state) {
    (void)state;
    const size_t n = (size_t)8 << 20;
    unsigned char *buf = malloc(n);
    assert_non_null(buf);
    loom__advise_huge_pages(buf, n);
    loom__advise_huge_pages(buf + 3, 100); /* no whole page: nothing to do */
    loom__advise_huge_pages(NULL, n);
    memset(buf, 0x5a, n);
    for (size_t i = 0; i < n; i += 4093) assert_int_equal(buf[i], 0x5a);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_pages),
        cmocka_unit_test(test_advise_huge_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
