/* unicode.h — the Unicode facts the tokenizer needs: strict UTF-8 decoding and validation,
 * general-category classes and White_Space of code points (tables generated from Python's
 * unicodedata by tools/gen_unicode_tables.py), and GPT-2's byte-level alphabet. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Category flags of a code point: exactly one major general category bit, plus LOOM_UCAT_SPACE
 * for the White_Space property. Unassigned code points count as OTHER (as \p{C} does). */
enum {
    LOOM_UCAT_LETTER = 1 << 0,    /* \p{L} */
    LOOM_UCAT_NUMBER = 1 << 1,    /* \p{N} */
    LOOM_UCAT_PUNCT = 1 << 2,     /* \p{P} */
    LOOM_UCAT_SYMBOL = 1 << 3,    /* \p{S} */
    LOOM_UCAT_MARK = 1 << 4,      /* \p{M} */
    LOOM_UCAT_SEPARATOR = 1 << 5, /* \p{Z} */
    LOOM_UCAT_OTHER = 1 << 6,     /* \p{C}, unassigned included */
    LOOM_UCAT_SPACE = 1 << 7,     /* \s: the White_Space property */
};

typedef struct loom__ucat_range {
    uint32_t start; /* first code point of the run; the run ends where the next one starts */
    uint8_t flags;  /* LOOM_UCAT_* */
} loom__ucat_range;

/* Generated tables (unicode_tables.c). */
extern const loom__ucat_range loom__ucat_ranges[];
extern const size_t loom__ucat_n_ranges;
extern const uint16_t loom__gpt2_byte_cp[256];

/* LOOM_UCAT_* flags of code point cp (cp must be <= 0x10FFFF). */
unsigned loom__ucat(uint32_t cp);

/* Checks that s[0..len) is well-formed UTF-8: no stray continuation or invalid lead byte, no
 * truncated sequence, no overlong form, no surrogate (U+D800..U+DFFF), nothing above U+10FFFF.
 * Returns true when it is; otherwise false and *bad_offset = byte offset of the offending
 * sequence's first byte. */
bool loom__utf8_valid(const char *s, size_t len, size_t *bad_offset);

/* Decodes the code point at s[*i] and advances *i past it. s must be valid UTF-8 (checked with
 * loom__utf8_valid) and *i < len. */
uint32_t loom__utf8_next(const char *s, size_t *i);

/* Length of the sequence a lead byte starts (1 for ASCII and for bytes that cannot lead). */
size_t loom__utf8_seq_len(unsigned char lead);

/* Writes cp (<= 0x10FFFF) as UTF-8 to out; returns the byte count (1..4). */
size_t loom__utf8_put(uint32_t cp, char out[4]);

/* The byte that GPT-2 alphabet code point cp stands for, or -1 when cp is not in the alphabet. */
int loom__gpt2_byte_of(uint32_t cp);
