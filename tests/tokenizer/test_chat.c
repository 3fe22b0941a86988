/* test_chat.c — chat templates: detection from template text and from GGUF metadata (files
 * built in memory), rendering of the chatml, gemma and llama3 formats (expected texts are
 * llama.cpp's llama_chat_apply_template output for the same messages), bad input, the buffer
 * contract, and the public entry points over a vocab-only model written to LOOM_TEST_TMP. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tokenizer/chat.h"
#include "gguf/gguf_writer.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- templates ---------------------------------------------------------------------------- */

static const char k_chatml_tmpl[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";
static const char k_gemma_tmpl[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";
static const char k_llama3_tmpl[] =
    "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

static loom_status detect(const char *t, loom__chat_kind *k) {
    return loom__chat_detect_text(t, strlen(t), k);
}

static void test_detect_text(void **state) {
    (void)state;
    loom__chat_kind k = (loom__chat_kind)99;
    assert_int_equal(detect(k_chatml_tmpl, &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_CHATML);
    assert_int_equal(detect(k_gemma_tmpl, &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_GEMMA);
    assert_int_equal(detect(k_llama3_tmpl, &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_LLAMA3);
    /* format names stand for themselves */
    assert_int_equal(detect("chatml", &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_CHATML);
    assert_int_equal(detect("gemma", &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_GEMMA);
    assert_int_equal(detect("llama3", &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_LLAMA3);
    assert_string_equal(loom__chat_kind_name(LOOM_CHAT_CHATML), "chatml");
    assert_string_equal(loom__chat_kind_name(LOOM_CHAT_GEMMA), "gemma");
    assert_string_equal(loom__chat_kind_name(LOOM_CHAT_LLAMA3), "llama3");
    assert_string_equal(loom__chat_kind_name((loom__chat_kind)7), "unknown");
}

static void test_detect_precedence(void **state) {
    (void)state;
    loom__chat_kind k;
    /* llama.cpp reads these as chatml, gemma and gemma: the earlier rule wins */
    assert_int_equal(detect("<|im_start|> <start_of_turn>", &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_CHATML);
    assert_int_equal(detect("<|start_header_id|><|end_header_id|> <start_of_turn>", &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_GEMMA);
    /* llama3 needs both header markers */
    assert_int_equal(detect("<|start_header_id|> only", &k), LOOM_ERR_UNSUPPORTED);
    /* a marker after a NUL byte still counts: the text is length-delimited */
    static const char with_nul[] = "x\0<start_of_turn>";
    assert_int_equal(loom__chat_detect_text(with_nul, sizeof with_nul - 1, &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_GEMMA);
}

static void test_detect_unsupported(void **state) {
    (void)state;
    loom__chat_kind k = LOOM_CHAT_LLAMA3;
    /* phi-4 shares <|im_start|> but is another format */
    assert_int_equal(detect("{{'<|im_start|>' + role + '<|im_sep|>'}}", &k), LOOM_ERR_UNSUPPORTED);
    assert_non_null(strstr(loom_last_error(), "phi-4"));
    assert_int_equal(detect("<|im_start|>User:<end_of_utterance>", &k), LOOM_ERR_UNSUPPORTED);
    /* [INST] comes before gemma in llama.cpp's order */
    assert_int_equal(detect("[INST] <start_of_turn>", &k), LOOM_ERR_UNSUPPORTED);
    assert_non_null(strstr(loom_last_error(), "[INST]"));
    assert_int_equal(detect("mistral-v7", &k), LOOM_ERR_UNSUPPORTED);
    assert_int_equal(detect("<|assistant|><|end|><start_of_turn>", &k), LOOM_ERR_UNSUPPORTED);
    /* openchat comes before llama3 */
    assert_int_equal(detect("GPT4 Correct <|start_header_id|><|end_header_id|>", &k),
                     LOOM_ERR_UNSUPPORTED);
    assert_int_equal(
        detect("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", &k),
        LOOM_ERR_UNSUPPORTED);
    assert_non_null(strstr(loom_last_error(), "none of the turn markers"));
    assert_non_null(strstr(loom_last_error(), "{% for m in"));
    assert_int_equal(detect("", &k), LOOM_ERR_UNSUPPORTED);
    assert_int_equal(k, LOOM_CHAT_LLAMA3); /* untouched on failure */
    assert_int_equal(loom__chat_detect_text(NULL, 3, &k), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__chat_detect_text("chatml", 6, NULL), LOOM_ERR_INVALID_ARG);
}

/* ---- detection from GGUF metadata ----------------------------------------------------------- */

/* A GGUF image with general.architecture = arch and, unless tmpl_type is 0, a
 * tokenizer.chat_template of that type (a string tmpl, or the uint32 7). */
static void build_meta(tbuf *b, const char *arch, uint32_t tmpl_type, const char *tmpl) {
    tb_header(b, 3, 0, tmpl_type ? 2 : 1);
    tb_kv(b, "general.architecture", LOOM_GGUF_STR);
    tb_str(b, arch);
    if (tmpl_type == LOOM_GGUF_STR) {
        tb_kv(b, "tokenizer.chat_template", LOOM_GGUF_STR);
        tb_str(b, tmpl);
    } else if (tmpl_type == LOOM_GGUF_U32) {
        tb_kv(b, "tokenizer.chat_template", LOOM_GGUF_U32);
        tb_u32(b, 7);
    }
}

static loom_status detect_meta(const char *arch, uint32_t tmpl_type, const char *tmpl,
                               loom__chat_kind *k) {
    tbuf b = {0};
    build_meta(&b, arch, tmpl_type, tmpl);
    loom__gguf *g = NULL;
    assert_int_equal(loom__gguf_open_memory(b.p, b.n, &g), LOOM_OK);
    loom_status st = loom__chat_detect_gguf(g, arch, k);
    loom__gguf_close(g);
    tb_free(&b);
    return st;
}

static void test_detect_gguf(void **state) {
    (void)state;
    loom__chat_kind k;
    /* no template: by architecture */
    assert_int_equal(detect_meta("gemma3", 0, NULL, &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_GEMMA);
    assert_int_equal(detect_meta("qwen2", 0, NULL, &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_CHATML);
    assert_int_equal(detect_meta("llama", 0, NULL, &k), LOOM_ERR_UNSUPPORTED);
    assert_non_null(strstr(loom_last_error(), "no tokenizer.chat_template"));
    assert_non_null(strstr(loom_last_error(), "'llama'"));
    /* the template wins over the architecture */
    assert_int_equal(detect_meta("gemma3", LOOM_GGUF_STR, k_llama3_tmpl, &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_LLAMA3);
    assert_int_equal(detect_meta("llama", LOOM_GGUF_STR, k_chatml_tmpl, &k), LOOM_OK);
    assert_int_equal(k, LOOM_CHAT_CHATML);
    assert_int_equal(detect_meta("qwen2", LOOM_GGUF_STR, "{{ messages }}", &k),
                     LOOM_ERR_UNSUPPORTED);
    assert_non_null(strstr(loom_last_error(), "tokenizer.chat_template"));
    /* not a string */
    assert_int_equal(detect_meta("gemma3", LOOM_GGUF_U32, NULL, &k), LOOM_ERR_BAD_MODEL);
    assert_non_null(strstr(loom_last_error(), "uint32"));
}

/* ---- rendering ------------------------------------------------------------------------------ */

/* Renders into a poisoned buffer and checks the exact text, the size query, and that the byte
 * after the text is untouched. */
static void expect_render(loom__chat_kind kind, const loom_chat_message *m, size_t n, bool add,
                          const char *want) {
    size_t want_len = strlen(want), n_out = 12345;
    assert_int_equal(loom__chat_render(kind, m, n, add, NULL, 0, &n_out),
                     want_len ? LOOM_ERR_BUFFER_TOO_SMALL : LOOM_OK);
    assert_int_equal(n_out, want_len);
    char buf[1024];
    memset(buf, 0x5A, sizeof buf);
    assert_true(want_len < sizeof buf);
    n_out = 0;
    assert_int_equal(loom__chat_render(kind, m, n, add, buf, want_len, &n_out), LOOM_OK);
    assert_int_equal(n_out, want_len);
    if (memcmp(buf, want, want_len) != 0) {
        fprintf(stderr, "got:  [%.*s]\nwant: [%s]\n", (int)want_len, buf, want);
        fail();
    }
    assert_int_equal((unsigned char)buf[want_len], 0x5A);
}

/* The conversation every format is checked on: padded system, user and assistant messages, a
 * second system message in the middle. */
static const loom_chat_message k_conv[] = {
    {"system", "  Be brief. \n"},
    {"user", " Hi\t\n"},
    {"assistant", "Hello! "},
    {"system", "s2"},
    {"user", "Q?"},
};

static void test_render_chatml(void **state) {
    (void)state;
    expect_render(LOOM_CHAT_CHATML, k_conv, N_OF(k_conv), true,
                  "<|im_start|>system\n  Be brief. \n<|im_end|>\n"
                  "<|im_start|>user\n Hi\t\n<|im_end|>\n"
                  "<|im_start|>assistant\nHello! <|im_end|>\n"
                  "<|im_start|>system\ns2<|im_end|>\n"
                  "<|im_start|>user\nQ?<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_render(LOOM_CHAT_CHATML, k_conv + 1, 1, false, "<|im_start|>user\n Hi\t\n<|im_end|>\n");
    /* "model" is "assistant" */
    const loom_chat_message m[] = {{"model", "x"}};
    expect_render(LOOM_CHAT_CHATML, m, 1, false, "<|im_start|>assistant\nx<|im_end|>\n");
}

static void test_render_llama3(void **state) {
    (void)state;
    expect_render(LOOM_CHAT_LLAMA3, k_conv, N_OF(k_conv), true,
                  "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                  "<|start_header_id|>system<|end_header_id|>\n\ns2<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nQ?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    /* no <|begin_of_text|>: BOS comes from tokenization */
    const loom_chat_message m[] = {{"user", "u"}};
    expect_render(LOOM_CHAT_LLAMA3, m, 1, false,
                  "<|start_header_id|>user<|end_header_id|>\n\nu<|eot_id|>");
}

static void test_render_gemma(void **state) {
    (void)state;
    expect_render(LOOM_CHAT_GEMMA, k_conv, N_OF(k_conv), true,
                  "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                  "<start_of_turn>model\nHello!<end_of_turn>\n"
                  "<start_of_turn>user\ns2\n\nQ?<end_of_turn>\n"
                  "<start_of_turn>model\n");
    /* system messages concatenate and wait past model turns for the next user turn */
    const loom_chat_message a[] = {
        {"system", "A"}, {"system", " B"}, {"assistant", "x"}, {"user", "u"}, {"user", "v"}};
    expect_render(LOOM_CHAT_GEMMA, a, N_OF(a), false,
                  "<start_of_turn>model\nx<end_of_turn>\n"
                  "<start_of_turn>user\nAB\n\nu<end_of_turn>\n"
                  "<start_of_turn>user\nv<end_of_turn>\n");
    /* a system message with no user turn after it is dropped */
    const loom_chat_message b[] = {{"system", "A"}};
    expect_render(LOOM_CHAT_GEMMA, b, 1, true, "<start_of_turn>model\n");
    /* an all-space system message adds nothing, not even the blank line */
    const loom_chat_message c[] = {{"system", " \n"}, {"user", "u"}};
    expect_render(LOOM_CHAT_GEMMA, c, 2, false, "<start_of_turn>user\nu<end_of_turn>\n");
    /* empty content; "model" role */
    const loom_chat_message d[] = {{"model", "m"}, {"user", ""}};
    expect_render(LOOM_CHAT_GEMMA, d, 2, true,
                  "<start_of_turn>model\nm<end_of_turn>\n<start_of_turn>user\n<end_of_turn>\n"
                  "<start_of_turn>model\n");
    /* only ASCII white space is trimmed: \v \f \r go, U+0085 and U+00A0 stay */
    const loom_chat_message e[] = {{"user", "\v\fA\r\xc2\x85"},
                                   {"user", "\xc2\xa0"
                                            "B"}};
    expect_render(LOOM_CHAT_GEMMA, e, 2, false,
                  "<start_of_turn>user\nA\r\xc2\x85<end_of_turn>\n"
                  "<start_of_turn>user\n\xc2\xa0"
                  "B<end_of_turn>\n");
}

static void test_render_empty(void **state) {
    (void)state;
    expect_render(LOOM_CHAT_GEMMA, NULL, 0, true, "<start_of_turn>model\n");
    expect_render(LOOM_CHAT_CHATML, NULL, 0, true, "<|im_start|>assistant\n");
    expect_render(LOOM_CHAT_LLAMA3, NULL, 0, true,
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_render(LOOM_CHAT_GEMMA, NULL, 0, false, "");
}

static void test_render_bad_input(void **state) {
    (void)state;
    char buf[64];
    memset(buf, 0x5A, sizeof buf);
    size_t n_out = 777;
    const loom_chat_message unknown[] = {{"user", "a"}, {"tool", "b"}};
    assert_int_equal(loom__chat_render(LOOM_CHAT_CHATML, unknown, 2, true, buf, sizeof buf, &n_out),
                     LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "message 1"));
    assert_non_null(strstr(loom_last_error(), "tool"));
    const loom_chat_message upper[] = {{"User", "a"}};
    assert_int_equal(loom__chat_render(LOOM_CHAT_GEMMA, upper, 1, true, buf, sizeof buf, &n_out),
                     LOOM_ERR_INVALID_ARG);
    const loom_chat_message null_content[] = {{"user", "a"}, {"user", NULL}};
    assert_int_equal(
        loom__chat_render(LOOM_CHAT_GEMMA, null_content, 2, true, buf, sizeof buf, &n_out),
        LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "NULL content"));
    const loom_chat_message null_role[] = {{NULL, "a"}};
    assert_int_equal(
        loom__chat_render(LOOM_CHAT_LLAMA3, null_role, 1, true, buf, sizeof buf, &n_out),
        LOOM_ERR_INVALID_ARG);
    /* nothing was written and *n_out is untouched */
    assert_int_equal(n_out, 777);
    for (size_t i = 0; i < sizeof buf; i++) assert_int_equal((unsigned char)buf[i], 0x5A);

    const loom_chat_message ok[] = {{"user", "a"}};
    assert_int_equal(loom__chat_render(LOOM_CHAT_GEMMA, NULL, 1, true, buf, sizeof buf, &n_out),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__chat_render(LOOM_CHAT_GEMMA, ok, 1, true, NULL, 4, &n_out),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__chat_render(LOOM_CHAT_GEMMA, ok, 1, true, buf, sizeof buf, NULL),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__chat_render((loom__chat_kind)9, ok, 1, true, buf, sizeof buf, &n_out),
                     LOOM_ERR_INVALID_ARG);
}

static void test_render_buffer_too_small(void **state) {
    (void)state;
    const loom_chat_message m[] = {{"system", "sys"}, {"user", "hello"}};
    const char *want = "<start_of_turn>user\nsys\n\nhello<end_of_turn>\n<start_of_turn>model\n";
    size_t len = strlen(want);
    for (size_t cap = 0; cap < len; cap += 7) {
        char buf[128];
        memset(buf, 0x5A, sizeof buf);
        size_t n_out = 0;
        assert_int_equal(loom__chat_render(LOOM_CHAT_GEMMA, m, 2, true, buf, cap, &n_out),
                         LOOM_ERR_BUFFER_TOO_SMALL);
        assert_int_equal(n_out, len);
        assert_memory_equal(buf, want, cap); /* the first cap bytes */
        assert_int_equal((unsigned char)buf[cap], 0x5A);
    }
}

/* ---- the public entry points over a vocab-only model ---------------------------------------- */

/* Writes a vocab-only qwen2 (or llama) GGUF with a tiny SentencePiece vocabulary and an
 * optional chat template to path. */
static void write_vocab_file(const char *path, const char *arch, const char *tmpl) {
    static const char *tokens[] = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "a"};
    const size_t n_tok = N_OF(tokens);
    tbuf kv = {0};
    uint64_t n_kv = 0;
    char key[96];
    tb_kv(&kv, "general.architecture", LOOM_GGUF_STR), tb_str(&kv, arch), n_kv++;
    static const char *dims[] = {"context_length", "embedding_length", "block_count",
                                 "feed_forward_length", "attention.head_count"};
    static const uint32_t vals[] = {128, 8, 1, 16, 2};
    for (size_t i = 0; i < N_OF(dims); i++) {
        snprintf(key, sizeof key, "%s.%s", arch, dims[i]);
        tb_kv(&kv, key, LOOM_GGUF_U32), tb_u32(&kv, vals[i]), n_kv++;
    }
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    tb_kv(&kv, key, LOOM_GGUF_F32), tb_f32(&kv, 1e-6f), n_kv++;
    tb_kv(&kv, "tokenizer.ggml.model", LOOM_GGUF_STR), tb_str(&kv, "llama"), n_kv++;
    tb_kv(&kv, "tokenizer.ggml.tokens", LOOM_GGUF_ARR), tb_arr(&kv, LOOM_GGUF_STR, n_tok), n_kv++;
    for (size_t i = 0; i < n_tok; i++) tb_str(&kv, tokens[i]);
    tb_kv(&kv, "tokenizer.ggml.scores", LOOM_GGUF_ARR), tb_arr(&kv, LOOM_GGUF_F32, n_tok), n_kv++;
    for (size_t i = 0; i < n_tok; i++) tb_f32(&kv, -(float)i);
    tb_kv(&kv, "tokenizer.ggml.token_type", LOOM_GGUF_ARR), n_kv++;
    tb_arr(&kv, LOOM_GGUF_I32, n_tok);
    static const uint32_t types[] = {2, 3, 3, 3, 3, 1};
    for (size_t i = 0; i < n_tok; i++) tb_u32(&kv, types[i]);
    if (tmpl) tb_kv(&kv, "tokenizer.chat_template", LOOM_GGUF_STR), tb_str(&kv, tmpl), n_kv++;
    tbuf b = {0};
    tb_header(&b, 3, 0, n_kv);
    tb_put(&b, kv.p, kv.n);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b.p, 1, b.n, f), b.n);
    assert_int_equal(fclose(f), 0);
    tb_free(&kv);
    tb_free(&b);
}

static loom_model *load_vocab(const char *name, const char *arch, const char *tmpl) {
    const char *dir = getenv("LOOM_TEST_TMP");
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "/tmp", name);
    write_vocab_file(path, arch, tmpl);
    loom_model_params p = loom_model_default_params();
    p.vocab_only = true;
    loom_model *m = NULL;
    loom_status st = loom_model_load(path, &p, &m);
    if (st != LOOM_OK) fprintf(stderr, "load %s: %s\n", path, loom_last_error());
    assert_int_equal(st, LOOM_OK);
    remove(path);
    return m;
}

static void test_public_api(void **state) {
    (void)state;
    const char *name = NULL;
    size_t n_out = 0;
    const loom_chat_message m[] = {{"system", "S"}, {"user", "U"}};
    assert_int_equal(loom_chat_template_name(NULL, &name), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_chat_format(NULL, m, 2, true, NULL, 0, &n_out), LOOM_ERR_INVALID_ARG);

    /* qwen2 without a template: chatml */
    loom_model *q = load_vocab("chat-qwen2.gguf", "qwen2", NULL);
    assert_int_equal(loom_chat_template_name(q, NULL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_chat_template_name(q, &name), LOOM_OK);
    assert_string_equal(name, "chatml");
    char buf[256];
    assert_int_equal(loom_chat_format(q, m, 2, true, buf, sizeof buf, &n_out), LOOM_OK);
    const char *want = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                       "<|im_start|>assistant\n";
    assert_int_equal(n_out, strlen(want));
    assert_memory_equal(buf, want, n_out);
    assert_int_equal(loom_chat_format(q, m, 2, true, NULL, 0, &n_out), LOOM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n_out, strlen(want));
    assert_int_equal(loom_chat_format(q, NULL, 2, true, buf, sizeof buf, &n_out),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_chat_format(q, m, 2, true, NULL, 5, &n_out), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_chat_format(q, m, 2, true, buf, sizeof buf, NULL), LOOM_ERR_INVALID_ARG);
    const loom_chat_message bad[] = {{"robot", "x"}};
    assert_int_equal(loom_chat_format(q, bad, 1, true, buf, sizeof buf, &n_out),
                     LOOM_ERR_INVALID_ARG);
    /* the rendered text tokenizes with its control tokens as single ids, after one BOS */
    loom_token toks[256];
    size_t n_tok = 0;
    assert_int_equal(loom_tokenize(q, want, strlen(want),
                                   LOOM_TOKENIZE_ADD_SPECIAL | LOOM_TOKENIZE_PARSE_SPECIAL, toks,
                                   N_OF(toks), &n_tok),
                     LOOM_OK);
    assert_true(n_tok > 2);
    assert_int_equal(toks[0], 1); /* <s> */
    assert_int_equal(toks[1], 3); /* <|im_start|> */
    size_t n_bos = 0, n_start = 0;
    for (size_t i = 0; i < n_tok; i++) {
        n_bos += toks[i] == 1;
        n_start += toks[i] == 3;
    }
    assert_int_equal(n_bos, 1);
    assert_int_equal(n_start, 3);
    loom_model_free(q);

    /* llama with a gemma template: gemma; llama without one: unsupported */
    loom_model *g = load_vocab("chat-llama-gemma.gguf", "llama", k_gemma_tmpl);
    assert_int_equal(loom_chat_template_name(g, &name), LOOM_OK);
    assert_string_equal(name, "gemma");
    assert_int_equal(loom_chat_format(g, m, 2, false, buf, sizeof buf, &n_out), LOOM_OK);
    want = "<start_of_turn>user\nS\n\nU<end_of_turn>\n";
    assert_int_equal(n_out, strlen(want));
    assert_memory_equal(buf, want, n_out);
    loom_model_free(g);

    loom_model *l = load_vocab("chat-llama.gguf", "llama", NULL);
    name = "untouched";
    assert_int_equal(loom_chat_template_name(l, &name), LOOM_ERR_UNSUPPORTED);
    assert_string_equal(name, "untouched");
    n_out = 5;
    assert_int_equal(loom_chat_format(l, m, 2, true, buf, sizeof buf, &n_out),
                     LOOM_ERR_UNSUPPORTED);
    assert_int_equal(n_out, 5);
    loom_model_free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect_text),        cmocka_unit_test(test_detect_precedence),
        cmocka_unit_test(test_detect_unsupported), cmocka_unit_test(test_detect_gguf),
        cmocka_unit_test(test_render_chatml),      cmocka_unit_test(test_render_llama3),
        cmocka_unit_test(test_render_gemma),       cmocka_unit_test(test_render_empty),
        cmocka_unit_test(test_render_bad_input),   cmocka_unit_test(test_render_buffer_too_small),
        cmocka_unit_test(test_public_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
