/* text_stream.c — see text_stream.h. The buffer holds released-later bytes only; each push
 * first moves what was released by the previous push out of the way (its bytes were the front
 * of the buffer and the caller has consumed them). */
#include "tokenizer/text_stream.h"

#include <string.h>

/* Length of the prefix of s[0..n) ending on a UTF-8 character boundary. */
static size_t utf8_complete_prefix(const char *s, size_t n) {
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) {
        i--;
        back++;
    }
    if (i == 0) return n;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return back + 1 < need ? i - 1 : n;
}

/* The longest suffix of s[0..n) that is a proper prefix of some stop string. */
static size_t stop_prefix_suffix(const char *s, size_t n, const loom__stop_set *stops) {
    size_t best = 0;
    for (size_t k = 0; k < stops->n; k++) {
        if (stops->len[k] == 0) continue; /* submit refuses empty stop strings */
        size_t m = stops->len[k] - 1 < n ? stops->len[k] - 1 : n;
        for (size_t l = m; l > best; l--) {
            if (memcmp(s + n - l, stops->s[k], l) == 0) {
                best = l;
                break;
            }
        }
    }
    return best;
}

/* Earliest position in s[from..n) where a stop string starts and fits; n when none. */
static size_t find_stop(const char *s, size_t n, size_t from, const loom__stop_set *stops) {
    size_t best = n;
    for (size_t k = 0; k < stops->n; k++) {
        size_t L = stops->len[k];
        if (L == 0) continue;
        for (size_t i = from; i + L <= n && i < best; i++) {
            if (memcmp(s + i, stops->s[k], L) == 0) {
                best = i;
                break;
            }
        }
    }
    return best;
}

bool loom__text_stream_push(loom__text_stream *ts, const loom__stop_set *stops, const char *piece,
                            size_t n, const char **out, size_t *out_len, bool *stopped) {
    if (ts->released) {
        memmove(ts->buf, ts->buf + ts->released, ts->len - ts->released);
        ts->len -= ts->released;
        ts->released = 0;
    }
    *out = ts->buf;
    *out_len = 0;
    *stopped = false;
    if (n > ts->cap - ts->len) return false;
    size_t old = ts->len;
    memcpy(ts->buf + ts->len, piece, n);
    ts->len += n;

    if (stops && stops->n) {
        /* Only a match that includes new bytes is new: earlier bytes were checked before. */
        size_t from = old >= stops->max_len ? old - stops->max_len + 1 : 0;
        size_t at = find_stop(ts->buf, ts->len, from, stops);
        if (at < ts->len) {
            *out_len = at;
            *stopped = true;
            ts->released = ts->len; /* the stop string and anything after it are dropped */
            return true;
        }
    }
    size_t keep = ts->len - utf8_complete_prefix(ts->buf, ts->len);
    if (stops && stops->n) {
        size_t hold = stop_prefix_suffix(ts->buf, ts->len, stops);
        if (hold > keep) keep = hold;
    }
    *out_len = ts->len - keep;
    ts->released = *out_len;
    return true;
}

void loom__text_stream_flush(loom__text_stream *ts, const char **out, size_t *out_len) {
    if (ts->released) {
        memmove(ts->buf, ts->buf + ts->released, ts->len - ts->released);
        ts->len -= ts->released;
        ts->released = 0;
    }
    *out = ts->buf;
    *out_len = ts->len;
    ts->released = ts->len;
}

bool loom__text_stream_push_final(loom__text_stream *ts, const loom__stop_set *stops,
                                  const char *piece, size_t n, const char **out, size_t *out_len,
                                  bool *stopped) {
    if (!loom__text_stream_push(ts, stops, piece, n, out, out_len, stopped)) return false;
    if (!*stopped) {
        /* Release the held-back tail too: nothing can complete it any more. The released
         * bytes and the tail are contiguous at the front of the buffer. */
        *out_len = ts->len;
        ts->released = ts->len;
    }
    return true;
}
