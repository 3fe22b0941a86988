/* fuzz_gguf.c — libFuzzer target: the GGUF reader on arbitrary bytes. A file either opens or
 * fails with a status and a message; an opened one is read through every accessor (each key's
 * value, every array element and string, every tensor's data, found again by name), so a view
 * the reader accepted but that points outside the image shows up under AddressSanitizer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "tokenizer/chat.h"

static volatile uint64_t g_sink; /* keeps the reads below from being optimised away */

static void touch_value(const loom__gguf_value *v, int depth) {
    uint64_t h = (uint64_t)v->type;
    switch (v->type) {
    case LOOM_GGUF_STR:
        for (uint64_t i = 0; i < v->str.len; i++) h += (unsigned char)v->str.ptr[i];
        break;
    case LOOM_GGUF_ARR:
        for (uint64_t i = 0; i < v->arr.n; i++) {
            if (v->arr.elem_type == LOOM_GGUF_STR) {
                const loom__gguf_str *s = &v->arr.strs[i];
                for (uint64_t k = 0; k < s->len; k++) h += (unsigned char)s->ptr[k];
            } else if (v->arr.elem_type == LOOM_GGUF_ARR) {
                if (depth < 8) touch_value(&v->arr.items[i], depth + 1);
            } else {
                h += (uint64_t)loom__gguf_arr_i64(v, i);
                float f = loom__gguf_arr_f32(v, i);
                uint32_t bits;
                memcpy(&bits, &f, sizeof bits); /* any float, NaN included: no conversion */
                h += bits;
            }
        }
        break;
    default:
        h += v->u64;
        break;
    }
    g_sink += h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    loom__gguf *g = NULL;
    loom_status st = loom__gguf_open_memory(data, size, &g);
    if (st != LOOM_OK) {
        if (g != NULL || loom_last_error()[0] == '\0') abort(); /* a failure must say why */
        return 0;
    }
    for (int64_t i = 0; i < loom__gguf_n_kv(g); i++) {
        const loom__gguf_kv *kv = loom__gguf_kv_at(g, i);
        touch_value(&kv->value, 0);
        char key[LOOM_GGUF_MAX_KEY_LEN + 1];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (loom__gguf_find_kv(g, key) != kv) abort(); /* keys are unique and findable */
        uint32_t u32;
        float f32;
        loom__gguf_str s;
        (void)loom__gguf_get_u32(g, key, false, 0, &u32);
        (void)loom__gguf_get_f32(g, key, false, 0, &f32);
        (void)loom__gguf_get_str(g, key, false, &s);
    }
    for (int64_t i = 0; i < loom__gguf_n_tensors(g); i++) {
        const loom__gguf_tensor *t = loom__gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        uint64_t h = 0;
        for (size_t k = 0; k < t->bytes; k += 61) h += d[k];
        if (t->bytes) h += d[t->bytes - 1];
        g_sink += h;
        if (loom__gguf_find_tensor(g, t->name) != t) abort();
    }
    loom__chat_kind kind;
    (void)loom__chat_detect_gguf(g, "llama", &kind);
    loom__gguf_close(g);
    return 0;
}
