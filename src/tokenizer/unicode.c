/* unicode.c — UTF-8 decoding/validation and code-point category lookup over the generated
 * tables (see unicode.h). */
#include "tokenizer/unicode.h"

unsigned loom__ucat(uint32_t cp) {
    /* Binary search for the last run starting at or before cp; the runs cover 0..0x10FFFF and
     * the first starts at 0, so one always exists. */
    size_t lo = 0, hi = loom__ucat_n_ranges;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (loom__ucat_ranges[mid].start <= cp) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return loom__ucat_ranges[lo].flags;
}

size_t loom__utf8_seq_len(unsigned char lead) {
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    return 1;
}

bool loom__utf8_valid(const char *s, size_t len, size_t *bad_offset) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned char c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n = loom__utf8_seq_len(c);
        /* 0x80..0xC1 (continuation bytes, overlong 2-byte leads) and 0xF5..0xFF never lead. */
        if (n == 1 || len - i < n) goto bad;
        /* The second byte's allowed range depends on the lead: it is what excludes overlong
         * 3/4-byte forms (E0 80.., F0 80..), surrogates (ED A0..) and > U+10FFFF (F4 90..). */
        unsigned char lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        if (p[i + 1] < lo || p[i + 1] > hi) goto bad;
        for (size_t k = 2; k < n; k++) {
            if ((p[i + k] & 0xC0) != 0x80) goto bad;
        }
        i += n;
        continue;
    bad:
        *bad_offset = i;
        return false;
    }
    return true;
}

uint32_t loom__utf8_next(const char *s, size_t *i) {
    const unsigned char *p = (const unsigned char *)s + *i;
    size_t n = loom__utf8_seq_len(p[0]);
    *i += n;
    switch (n) {
    case 1:
        return p[0];
    case 2:
        return ((uint32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3:
        return ((uint32_t)(p[0] & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
        return ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
               ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    }
}

size_t loom__utf8_put(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int loom__gpt2_byte_of(uint32_t cp) {
    /* The alphabet keeps printable Latin-1 bytes as themselves and moves the other 68 bytes to
     * U+0100..U+0143, so both directions are a short scan or an identity. */
    if (cp < 0x100) {
        return loom__gpt2_byte_cp[cp] == cp ? (int)cp : -1;
    }
    if (cp > 0x143) return -1;
    for (int b = 0; b < 256; b++) {
        if (loom__gpt2_byte_cp[b] == cp) return b;
    }
    return -1;
}
