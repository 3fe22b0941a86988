/* fuzz_chat.c — libFuzzer target: chat templates. The whole input is first given to template
 * detection (as a tokenizer.chat_template text would be); then it is read as messages — a role
 * chosen by one byte (the known ones, "model", or arbitrary bytes) and a content of arbitrary
 * bytes — rendered in every format, with and without the assistant prefix, first sized and
 * then written. What must hold: a refusal names the message, and the written text has exactly
 * the length the sizing call promised. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_input.h"
#include "tokenizer/chat.h"

enum { MAX_MSGS = 16, MAX_CONTENT = 512 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    loom__chat_kind kind;
    (void)loom__chat_detect_text((const char *)data, size, &kind);

    static char content[MAX_MSGS][MAX_CONTENT + 1], role[MAX_MSGS][16];
    loom_chat_message msgs[MAX_MSGS];
    fuzz_input in = {data, size};
    size_t n = 0;
    static const char *roles[] = {"system", "user", "assistant", "model", "tool", ""};
    while (in.n > 0 && n < MAX_MSGS) {
        uint8_t r = fz_u8(&in);
        if (r < 6 * 40) {
            strcpy(role[n], roles[r % 6]);
        } else {
            size_t got;
            const char *s = fz_bytes(&in, r % 8 + 1, &got);
            memcpy(role[n], s, got);
            role[n][got] = '\0';
        }
        size_t want = fz_u8(&in) * 2u, got;
        const char *s = fz_bytes(&in, want < MAX_CONTENT ? want : MAX_CONTENT, &got);
        memcpy(content[n], s, got);
        content[n][got] = '\0'; /* contents are C strings: a NUL inside ends one early */
        msgs[n] = (loom_chat_message){role[n], content[n]};
        n++;
    }
    for (int k = 0; k < 3; k++) {
        for (int asst = 0; asst < 2; asst++) {
            size_t need = 0;
            loom_status st =
                loom__chat_render((loom__chat_kind)k, n ? msgs : NULL, n, asst, NULL, 0, &need);
            if (st == LOOM_ERR_INVALID_ARG) {
                if (loom_last_error()[0] == '\0') abort();
                continue;
            }
            if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL) abort();
            char *out = malloc(need ? need : 1);
            if (!out) return 0;
            size_t wrote = 0;
            st = loom__chat_render((loom__chat_kind)k, n ? msgs : NULL, n, asst, out, need, &wrote);
            if (st != LOOM_OK || wrote != need) abort();
            free(out);
        }
    }
    return 0;
}
