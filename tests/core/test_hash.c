/* test_hash.c — core/hash.h: the mix is splitmix64's finalizer (its published outputs for seed
 * 0), and loom__hash_bytes separates inputs, lengths and seeds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/hash.h"

/* splitmix64 seeded with 0 returns mix(k * 0x9e3779b97f4a7c15) for k = 1, 2, 3: the
 * generator's reference outputs (Vigna's splitmix64.c). */
static void test_mix_is_splitmix64(void **state) {
    (void)state;
    const uint64_t gamma = 0x9e3779b97f4a7c15ull;
    assert_true(loom__hash_mix64(gamma) == 0xe220a8397b1dcdafull);
    assert_true(loom__hash_mix64(2 * gamma) == 0x6e789e6aa1b965f4ull);
    assert_true(loom__hash_mix64(3 * gamma) == 0x06c45d188009454full);
    assert_true(loom__hash_mix64(0) == 0);
}

static void test_bytes_separate(void **state) {
    (void)state;
    const char *text = "the quick brown fox jumps";
    uint64_t seen[26 * 2];
    int n = 0;
    for (size_t len = 0; len <= 25; len++) {
        for (uint64_t seed = 0; seed < 2; seed++) {
            uint64_t h = loom__hash_bytes(text, len, seed);
            for (int k = 0; k < n; k++) assert_true(seen[k] != h);
            seen[n++] = h;
        }
    }
    /* one flipped bit anywhere changes the hash */
    char buf[25];
    memcpy(buf, text, 25);
    uint64_t h0 = loom__hash_bytes(buf, 25, 7);
    for (int i = 0; i < 25 * 8; i++) {
        buf[i / 8] ^= (char)(1 << (i % 8));
        assert_true(loom__hash_bytes(buf, 25, 7) != h0);
        buf[i / 8] ^= (char)(1 << (i % 8));
    }
    assert_true(loom__hash_bytes(buf, 25, 7) == h0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mix_is_splitmix64),
        cmocka_unit_test(test_bytes_separate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
