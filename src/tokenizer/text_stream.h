/* text_stream.h — turning a sample's tokens into streamed text: whole UTF-8 characters only,
 * and text that could be the start of a stop string held back until it is ruled out, so a
 * stop string never reaches the caller (OpenAI/vLLM semantics: the stop text is excluded). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

typedef struct loom__text_stream {
    char *buf; /* [cap] bytes received but not yet released */
    size_t len;
    size_t cap;      /* longest stop string + the longest piece + 4 */
    size_t released; /* bytes at the front of buf handed out by the last push */
} loom__text_stream;

/* The stop strings of a request (borrowed). */
typedef struct loom__stop_set {
    const char *const *s;
    const size_t *len;
    size_t n;
    size_t max_len;
} loom__stop_set;

/* Appends piece[0..n) and decides what can be released. On return *out and *out_len give the text
 * to emit now (points into the stream's buffer, valid until the next push), and *stopped tells
 * whether a stop string was found (the text before it is emitted; the stream is then done).
 * Returns false only if piece is longer than the stream was sized for (the caller sized it
 * from the vocabulary's longest piece, so that is an internal error). */
bool loom__text_stream_push(loom__text_stream *ts, const loom__stop_set *stops, const char *piece,
                            size_t n, const char **out, size_t *out_len, bool *stopped);

/* The last piece of a sample: like push, but nothing is held back unless a stop string is
 * found (then the text before it). */
bool loom__text_stream_push_final(loom__text_stream *ts, const loom__stop_set *stops,
                                  const char *piece, size_t n, const char **out, size_t *out_len,
                                  bool *stopped);

/* What is left at the end of a sample (a held-back partial stop string is real text then;
 * an incomplete UTF-8 sequence is emitted as is). Same out contract. */
void loom__text_stream_flush(loom__text_stream *ts, const char **out, size_t *out_len);
