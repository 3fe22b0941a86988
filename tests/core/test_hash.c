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

/* SipHash-2-4 with key 00..0f: the paper's vector (message 00..0e) and the reference
 * implementation's first (the empty message). SipHash-1-3 under the zero key: CPython's bytes
 * hash with PYTHONHASHSEED=0 (which zeroes its key), computed with python3 for these inputs. */
static void test_siphash_vectors(void **state) {
    (void)state;
    unsigned char msg[64];
    for (int i = 0; i < 64; i++) msg[i] = (unsigned char)i;
    loom__hash_key k = {0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
    assert_true(loom__siphash(msg, 15, &k, 2, 4) == 0xa129ca6149be45e5ull);
    assert_true(loom__siphash(msg, 0, &k, 2, 4) == 0x726fdb47dd0e0e31ull);
    loom__hash_key zero = {0, 0};
    const char *fox = "The quick brown fox jumps over the lazy dog";
    assert_true(loom__hash_keyed("a", 1, &zero) == 0x407448d2b89b1813ull);
    assert_true(loom__hash_keyed("abcdefgh", 8, &zero) == 0x3f7b849c0b8e35eaull);
    assert_true(loom__hash_keyed(fox, strlen(fox), &zero) == 0x8df676d3d00c451eull);
    assert_true(loom__hash_keyed(msg, 15, &zero) == 0xf30eb725bb91c9eaull);
    assert_true(loom__hash_keyed(msg, 64, &zero) == 0x75e05fd5bbc870c6ull);
}

/* Two random keys differ, and so do the hashes of one name under them. */
static void test_random_keys_differ(void **state) {
    (void)state;
    loom__hash_key a = loom__hash_key_random(), b = loom__hash_key_random();
    assert_false(a.k0 == b.k0 && a.k1 == b.k1);
    assert_true(loom__hash_keyed("token_embd.weight", 17, &a) !=
                loom__hash_keyed("token_embd.weight", 17, &b));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_siphash_vectors),
        cmocka_unit_test(test_random_keys_differ),
        cmocka_unit_test(test_mix_is_splitmix64),
        cmocka_unit_test(test_bytes_separate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
