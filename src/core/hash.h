/* hash.h — the one 64-bit mixing function behind every hash of the library: the open-addressing
 * tables (tokenizer maps, request and scheduler indexes), the prefix cache's chained block
 * hashes, and the sampler's counter-based RNG.
 *
 * loom__hash_mix64 is splitmix64's finalizer (a published constant set): a bijection on 64-bit
 * words in which every input bit reaches every output bit, so the low bits index a table well
 * (sequential ids do not cluster) and distinct inputs stay distinct. */
#pragma once

#include <stddef.h>
#include <stdint.h>

static inline uint64_t loom__hash_mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A 64-bit hash of data[0 .. n), seeded: 8-byte words in host byte order mixed in one at a
 * time (a table key or a salt, not a portable digest). */
uint64_t loom__hash_bytes(const void *data, size_t n, uint64_t seed);

/* ---- keyed hashing, for tables whose keys come from a file or a request ----------------------
 *
 * A table indexed by an unkeyed hash can be flooded: whoever writes the keys (a GGUF file's key
 * and tensor names, a vocabulary's texts, a merge list) can choose many that share a slot, and
 * open addressing turns that into quadratic time (40,000 colliding GGUF keys took 1.4 s to parse
 * against 9 ms). Those tables use SipHash-1-3 (Aumasson and Bernstein; the variant Python and
 * Rust hash their tables with) under a key drawn from the operating system's random source for
 * each table, so the slots of a name cannot be predicted from the file. */
typedef struct loom__hash_key {
    uint64_t k0, k1;
} loom__hash_key;

/* A fresh random key (getrandom; when the kernel cannot give one, a mix of the clock, the
 * address space and a counter, which still differs per table and per process). */
loom__hash_key loom__hash_key_random(void);

/* SipHash-c-d of data[0 .. n) under key: c compression and d finalization rounds. Tables use
 * loom__hash_keyed (1-3); the general form is there for the published 2-4 test vectors. */
uint64_t loom__siphash(const void *data, size_t n, const loom__hash_key *key, int c, int d);

static inline uint64_t loom__hash_keyed(const void *data, size_t n, const loom__hash_key *key) {
    return loom__siphash(data, n, key, 1, 3);
}
