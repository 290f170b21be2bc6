/*
 * test-tokenizer.c - the tokenizer on small vocabularies built here byte by
 * byte (SentencePiece with byte fallback, a tiny GPT-2 BPE, chat templates,
 * bad metadata) and, with STARINFER_TEST_MODEL set, on the real SmolLM2 file
 * against ids recorded from Hugging Face tokenizers.
 *
 * The SAMPLES table below was printed by tests/data/tokenizer-oracle.py
 * (HF tokenizers 0.23.3, a BPE model built from the GGUF's tokens and
 * merges with SmolLM2's pre-tokenizer: Digits(individual_digits) then
 * ByteLevel with the GPT-2 regex); see that script for the exact recipe.
 * The chat strings were rendered from the file's own tokenizer.chat_template
 * with jinja2.
 *
 * Without STARINFER_TEST_MODEL the synthetic checks run and the test then
 * reports SKIP (exit 77) for the real-model part.
 */
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/unicode.h"
#include "starinfer.h"
#include "test.h"
#include "vocab.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Parse the file and load its tokenizer; *file keeps the bytes alive. */
static int load(struct buf *file, struct si_gguf **g, struct si_tokenizer **tok, char *err,
                size_t err_size)
{
    *tok = NULL;
    int rc = si_gguf_parse(g, file->p, file->n, err, err_size);
    if (rc != SI_OK)
        return rc;
    return si_tokenizer_load(tok, *g, err, err_size);
}

/* Tokenize a NUL-terminated string into ids (at most 256). */
static int64_t tokenize(const struct si_tokenizer *tok, const char *s, bool bos, bool special,
                        int32_t *ids)
{
    return si_tokenize(tok, s, strlen(s), bos, special, ids, 256);
}

/* Detokenize ids into out (NUL-terminated); returns the length. */
static size_t detokenize(const struct si_tokenizer *tok, const int32_t *ids, int64_t n,
                         bool special, char *out, size_t cap)
{
    size_t len = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t m = si_token_to_piece(tok, ids[i], special, out + len, cap - 1 - len);
        CHECK(m >= 0 && (size_t)m <= cap - 1 - len, "piece of %d: %lld", ids[i], (long long)m);
        if (m < 0 || (size_t)m > cap - 1 - len)
            break;
        len += (size_t)m;
    }
    out[len] = '\0';
    return len;
}

static bool ids_eq(const int32_t *a, int64_t na, const int32_t *b, int64_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

static void print_ids(const char *what, const int32_t *ids, int64_t n)
{
    fprintf(stderr, "  %s:", what);
    for (int64_t i = 0; i < n; i++)
        fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* ------------------------------------------------------ SentencePiece */

/* Normal tokens of the small SPM vocabulary and their scores. */
/* Tokenize s and compare with the expected ids, then check the round trip. */
static void expect(const struct si_tokenizer *tok, const char *s, bool special, const int32_t *want,
                   int64_t n_want, const char *roundtrip)
{
    int32_t ids[256];
    int64_t n = tokenize(tok, s, false, special, ids);
    CHECK(ids_eq(ids, n, want, n_want), "'%s' (special %d): %lld tokens", s, special, (long long)n);
    if (!ids_eq(ids, n, want, n_want)) {
        print_ids("got", ids, n);
        print_ids("want", want, n_want);
    }
    if (roundtrip != NULL && n >= 0) {
        char out[1024];
        detokenize(tok, ids, n, special, out, sizeof out);
        CHECK(strcmp(out, roundtrip) == 0, "'%s' detokenized to '%s'", s, out);
    }
}

static void test_spm(void)
{
    struct buf file = make_spm(-1, NULL);
    struct si_gguf *g = NULL;
    struct si_tokenizer *tok = NULL;
    char err[256] = "";
    int rc = load(&file, &g, &tok, err, sizeof err);
    CHECK(rc == SI_OK, "SPM vocabulary: %s", err);
    if (rc != SI_OK) {
        si_gguf_free(g);
        free(file.p);
        return;
    }
    /* The tokenizer keeps its own copies: the file may go. */
    si_gguf_free(g);
    memset(file.p, 0, file.n);
    free(file.p);

    CHECK(si_tokenizer_n_vocab(tok) == SPM_N, "n_vocab %d", si_tokenizer_n_vocab(tok));
    CHECK(si_tokenizer_bos(tok) == 1 && si_tokenizer_eos(tok) == 2, "bos/eos");
    CHECK(si_tokenizer_add_bos(tok), "SPM adds BOS by default");
    CHECK(si_tokenizer_is_eog(tok, 2) && si_tokenizer_is_eog(tok, SPM_EOT), "EOS, <end_of_turn>");
    CHECK(!si_tokenizer_is_eog(tok, 1) && !si_tokenizer_is_eog(tok, -1) &&
              !si_tokenizer_is_eog(tok, SPM_N),
          "not EOG");

    const int32_t sp = spm_id("\xe2\x96\x81");
    const int32_t hello = spm_id("\xe2\x96\x81hello");
    /* "▁hello": ll, he, llo, hello, ▁hello by descending score. */
    expect(tok, "hello", false, (int32_t[]){hello}, 1, " hello");
    /* "▁hello▁world": "▁w" (-4) beats "wor" (-5); "▁wor" is no token. */
    expect(tok, "hello world", false,
           (int32_t[]){hello, spm_id("\xe2\x96\x81w"), spm_id("or"), spm_id("l"), spm_id("d")}, 5,
           " hello world");
    /* Characters outside the vocabulary fall back to bytes: é is C3 A9. */
    expect(tok, "h\xc3\xa9z", false,
           (int32_t[]){sp, spm_id("h"), SPM_FIRST_BYTE + 0xc3, SPM_FIRST_BYTE + 0xa9,
                       SPM_FIRST_BYTE + 'z'},
           5, " h\xc3\xa9z");
    /* Invalid UTF-8 goes byte by byte, and comes back unchanged. */
    expect(tok, "he\xff\xc3", false,
           (int32_t[]){sp, spm_id("he"), SPM_FIRST_BYTE + 0xff, SPM_FIRST_BYTE + 0xc3}, 4,
           " he\xff\xc3");
    /* Two spaces: "▁▁" is no token. */
    expect(tok, " hello", false, (int32_t[]){sp, hello}, 2, "  hello");
    expect(tok, "", false, NULL, 0, "");

    /* Special tokens: control only when parsing specials (with a space
     * prefix after it), user-defined always. */
    expect(tok, "hello<ctrl>hello", true, (int32_t[]){hello, SPM_CTRL, hello}, 3,
           " hello<ctrl> hello");
    int32_t ids[256];
    int64_t n = tokenize(tok, "hello<ctrl>", false, false, ids);
    CHECK(n == 7 && ids[0] == hello && ids[1] == SPM_FIRST_BYTE + '<' &&
              ids[6] == SPM_FIRST_BYTE + '>',
          "control token as text: %lld tokens", (long long)n);
    expect(tok, "hello<user>", false, (int32_t[]){hello, SPM_USER}, 2, " hello<user>");

    /* BOS. */
    n = tokenize(tok, "hello", true, false, ids);
    CHECK(n == 2 && ids[0] == 1 && ids[1] == hello, "BOS + hello: %lld", (long long)n);
    n = tokenize(tok, "", true, false, ids);
    CHECK(n == 1 && ids[0] == 1, "BOS alone: %lld", (long long)n);

    /* A short output buffer gets the first tokens and the full count. */
    n = si_tokenize(tok, "hello world", 11, true, false, ids, 2);
    CHECK(n == 6 && ids[0] == 1 && ids[1] == hello, "capped: %lld", (long long)n);
    n = si_tokenize(tok, "hello world", 11, false, false, NULL, 0);
    CHECK(n == 5, "counting only: %lld", (long long)n);

    /* Pieces: byte tokens as their byte, control tokens only on request,
     * bad ids refused. */
    char piece[16];
    CHECK(si_token_to_piece(tok, SPM_FIRST_BYTE + 0x41, false, piece, sizeof piece) == 1 &&
              piece[0] == 'A',
          "<0x41>");
    CHECK(si_token_to_piece(tok, SPM_CTRL, false, piece, sizeof piece) == 0, "control hidden");
    CHECK(si_token_to_piece(tok, SPM_CTRL, true, piece, sizeof piece) == 6 &&
              memcmp(piece, "<ctrl>", 6) == 0,
          "control shown");
    CHECK(si_token_to_piece(tok, hello, false, piece, 3) == 6 && memcmp(piece, " he", 3) == 0,
          "piece truncated to cap");
    CHECK(si_token_to_piece(tok, -1, false, piece, sizeof piece) == SI_E_INVALID, "id -1");
    CHECK(si_token_to_piece(tok, SPM_N, false, piece, sizeof piece) == SI_E_INVALID, "id n_vocab");
    CHECK(si_token_to_piece(tok, INT32_MAX, true, piece, sizeof piece) == SI_E_INVALID,
          "id INT32_MAX");
    si_tokenizer_free(tok);

    /* add_space_prefix = false (gemma): no leading "▁". */
    file = make_spm(0, NULL);
    rc = load(&file, &g, &tok, err, sizeof err);
    CHECK(rc == SI_OK, "SPM without space prefix: %s", err);
    if (rc == SI_OK) {
        expect(tok, "hello", false, (int32_t[]){spm_id("hello")}, 1, "hello");
        expect(tok, "hello world", false,
               (int32_t[]){spm_id("hello"), spm_id("\xe2\x96\x81w"), spm_id("or"), spm_id("l"),
                           spm_id("d")},
               5, "hello world");
    }
    si_tokenizer_free(tok);
    si_gguf_free(g);
    free(file.p);
    si_tokenizer_free(NULL);
}

/* ------------------------------------------------------ a tiny GPT-2 BPE */


static void test_bpe(void)
{
    static const char *const pres[] = {"gpt2", "smollm", "llama-bpe", "qwen2", "default", NULL};
    for (size_t k = 0; k < sizeof pres / sizeof *pres; k++) {
        struct buf file = make_bpe(pres[k], NULL, 0);
        struct si_gguf *g = NULL;
        struct si_tokenizer *tok = NULL;
        char err[256] = "";
        int rc = load(&file, &g, &tok, err, sizeof err);
        CHECK(rc == SI_OK, "BPE with pre %s: %s", pres[k] ? pres[k] : "(none)", err);
        if (rc == SI_OK) {
            CHECK(!si_tokenizer_add_bos(tok) && si_tokenizer_bos(tok) == -1, "no BOS");
            CHECK(si_tokenizer_is_eog(tok, 262), "EOS is EOG");
            /* "hello" merges all the way; " wo" + "rld" bytes. */
            expect(tok, "hello world", false, (int32_t[]){259, 261, 'r' - 0x21 + 0x21, 'l', 'd'}, 5,
                   "hello world");
            expect(tok, "hel<|end|>", true, (int32_t[]){256, 'l', 262}, 3, "hel<|end|>");
            /* Bytes outside the printable alphabet map to U+0100.. and back;
             * invalid UTF-8 passes byte by byte. */
            static const char odd[] = "\x01\xff\xc3(\x80\t";
            int32_t ids[256];
            int64_t n = tokenize(tok, odd, false, false, ids);
            char out[64];
            detokenize(tok, ids, n, false, out, sizeof out);
            CHECK(n == 6 && strcmp(out, odd) == 0, "odd bytes: %lld tokens", (long long)n);
            CHECK(n == 6 && ids[0] == 1 && ids[1] == 255 && ids[5] == 9, "byte ids");
            si_tokenizer_free(tok);
        }
        si_gguf_free(g);
        free(file.p);
    }
}

/* ------------------------------------------------------ bad metadata */

static void expect_load_error(struct buf file, int status, const char *needle, const char *what)
{
    struct si_gguf *g = NULL;
    struct si_tokenizer *tok = (struct si_tokenizer *)1;
    char err[256] = "";
    int rc = si_gguf_parse(&g, file.p, file.n, err, sizeof err);
    CHECK(rc == SI_OK, "%s: file does not parse: %s", what, err);
    if (rc == SI_OK) {
        rc = si_tokenizer_load(&tok, g, err, sizeof err);
        CHECK(rc == status, "%s: status %d, expected %d (%s)", what, rc, status, err);
        CHECK(tok == NULL, "%s: output not cleared", what);
        CHECK(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", what, err, needle);
        if (rc == SI_OK)
            si_tokenizer_free(tok);
    }
    si_gguf_free(g);
    free(file.p);
}

static void test_bad(void)
{
    struct gguf_build g = {0};
    kv_str(&g, "general.architecture", "llama");
    expect_load_error(finish(&g), SI_E_FORMAT, "tokenizer.ggml.model", "no tokenizer at all");

    g = (struct gguf_build){0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    expect_load_error(finish(&g), SI_E_FORMAT, "tokenizer.ggml.tokens", "missing tokens");

    g = (struct gguf_build){0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_u32(&g, "tokenizer.ggml.tokens", 3);
    expect_load_error(finish(&g), SI_E_FORMAT, "not an array of strings", "tokens not an array");

    g = (struct gguf_build){0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", NULL, 0);
    expect_load_error(finish(&g), SI_E_FORMAT, "0 tokens", "empty vocabulary");

    g = (struct gguf_build){0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", (const char *const[]){"a", "b"}, 2);
    kv_arr(&g, "tokenizer.ggml.scores", SI_GGUF_FLOAT32, (float[]){1}, 1);
    expect_load_error(finish(&g), SI_E_FORMAT, "tokenizer.ggml.scores", "short scores");

    g = (struct gguf_build){0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", (const char *const[]){"a", "b"}, 2);
    kv_arr(&g, "tokenizer.ggml.token_type", SI_GGUF_INT32, (int32_t[]){1, 9}, 2);
    expect_load_error(finish(&g), SI_E_FORMAT, "type 9", "bad token type");

    g = (struct gguf_build){0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", (const char *const[]){"a", "b"}, 2);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", 2);
    expect_load_error(finish(&g), SI_E_FORMAT, "bos_token_id = 2", "BOS out of range");

    g = (struct gguf_build){0};
    kv_str(&g, "tokenizer.ggml.model", "bert");
    expect_load_error(finish(&g), SI_E_UNSUPPORTED, "'bert'", "unknown model");

    expect_load_error(make_bpe("no-such-pre", NULL, 0), SI_E_UNSUPPORTED, "'no-such-pre'",
                      "unknown pre-tokenizer");
    expect_load_error(make_bpe("gpt2", (const char *const[]){"h e", "x\xc4\xa0 q"}, 2), SI_E_FORMAT,
                      "unknown token 'x\xc4\xa0'", "merge with unknown token");
    expect_load_error(make_bpe("gpt2", (const char *const[]){"h e", "w o"}, 2), SI_E_FORMAT,
                      "not in the vocabulary", "merge making an unknown token");
    expect_load_error(make_bpe("gpt2", (const char *const[]){"he"}, 1), SI_E_FORMAT, "is not 'a b'",
                      "merge without a space");

    g = (struct gguf_build){0};
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_strs(&g, "tokenizer.ggml.tokens", (const char *const[]){"a", "b"}, 2);
    expect_load_error(finish(&g), SI_E_FORMAT, "tokenizer.ggml.merges", "BPE without merges");
}

/* ------------------------------------------------------ Unicode */

static void test_unicode(void)
{
    CHECK(strcmp(si_unicode_version(), "14.0.0") == 0, "Unicode %s", si_unicode_version());
    /* The ASCII fast path agrees with the generated table. */
    for (uint32_t c = 0; c < 0x80; c++) {
        size_t i = 0;
        while (i + 1 < si__unicode_n_ranges && si__unicode_ranges[i + 1] >> 8 <= c)
            i++;
        CHECK(si_unicode_class(c) == (si__unicode_ranges[i] & 0xffu), "class of U+%04X", c);
    }
    CHECK(si_unicode_is_letter(si_unicode_class(0xe9)), "é is a letter");
    CHECK(si_unicode_is_letter(si_unicode_class(0x65e5)), "日 is a letter");
    CHECK(si_unicode_is_number(si_unicode_class(0x0663)), "Arabic-Indic 3 is a number");
    CHECK(si_unicode_is_number(si_unicode_class(0xb2)), "² is a number");
    CHECK(si_unicode_is_space(si_unicode_class(0xa0)), "NBSP is White_Space");
    CHECK(si_unicode_is_space(si_unicode_class(0x3000)), "ideographic space");
    CHECK(si_unicode_is_space(si_unicode_class(0x2028)), "line separator");
    CHECK(si_unicode_is_space(si_unicode_class(0x85)), "NEL");
    CHECK(!si_unicode_is_space(si_unicode_class(0x200b)), "ZWSP is not White_Space");
    CHECK(si_unicode_is_punct(si_unicode_class(0x3002)), "。 is punctuation");
    CHECK((si_unicode_class(0x301) & SI_UCAT_MASK) == SI_UCAT_MARK, "combining acute");
    CHECK((si_unicode_class(0x1f44d) & SI_UCAT_MASK) == SI_UCAT_SYMBOL, "thumbs up");
    CHECK(si_unicode_class(0x10ffff) == SI_UCAT_UNASSIGNED, "U+10FFFF");
    CHECK(si_unicode_class(SI_UTF8_INVALID) == SI_UCAT_OTHER, "invalid");

    size_t n;
    CHECK(si_utf8_decode("\xf0\x9f\x91\x8d", 4, &n) == 0x1f44d && n == 4, "4-byte decode");
    CHECK(si_utf8_decode("\xf0\x9f\x91", 3, &n) == SI_UTF8_INVALID && n == 1, "truncated");
    CHECK(si_utf8_decode("\xc0\xaf", 2, &n) == SI_UTF8_INVALID && n == 1, "overlong");
    CHECK(si_utf8_decode("\xed\xa0\x80", 3, &n) == SI_UTF8_INVALID && n == 1, "surrogate");
    CHECK(si_utf8_decode("\xf4\x90\x80\x80", 4, &n) == SI_UTF8_INVALID && n == 1, "> U+10FFFF");
    char enc[4];
    for (uint32_t c = 1; c <= 0x10ffff; c += (c < 0x800 ? 1 : 97)) {
        if (c >= 0xd800 && c <= 0xdfff)
            continue;
        size_t m = si_utf8_encode(c, enc);
        if (si_utf8_decode(enc, m, &n) != c || n != m) {
            CHECK(false, "UTF-8 round trip of U+%04X", c);
            break;
        }
    }
}

/* ------------------------------------------------------ chat templates */

static void expect_chat(const struct si_gguf *g, const struct si_chat_msg *msgs, size_t n,
                        bool add_assistant, const char *want, const char *what)
{
    char buf[1024];
    int64_t len = si_chat_format(g, msgs, n, add_assistant, buf, sizeof buf - 1);
    CHECK(len == (int64_t)strlen(want), "%s: length %lld, expected %zu", what, (long long)len,
          strlen(want));
    if (len >= 0 && (size_t)len < sizeof buf) {
        buf[len] = '\0';
        CHECK(strcmp(buf, want) == 0, "%s: got\n%s\nexpected\n%s", what, buf, want);
    }
    /* Too small a buffer: the same length, the prefix written. */
    char small[8];
    CHECK(si_chat_format(g, msgs, n, add_assistant, small, sizeof small) == len &&
              (len < 8 || memcmp(small, want, 8) == 0),
          "%s: capped", what);
}

static void test_chat_synthetic(void)
{
    static const struct si_chat_msg conv[] = {
        {"system", "Be brief."},
        {"user", " Hello "},
        {"assistant", "Hi!"},
        {"user", "Bye"},
    };
    struct buf file = make_spm(0, "{{ bos_token }}{% for m in messages %}<start_of_turn>...");
    struct si_gguf *g = NULL;
    char err[256] = "";
    CHECK(si_gguf_parse(&g, file.p, file.n, err, sizeof err) == SI_OK, "%s", err);
    expect_chat(g, conv, 4, true,
                "<start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n"
                "<start_of_turn>model\nHi!<end_of_turn>\n"
                "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
                "gemma");
    si_gguf_free(g);
    free(file.p);

    file = make_spm(1, "{% if messages[0]['role'] == 'system' %}<<SYS>>{% endif %}"
                       "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}");
    CHECK(si_gguf_parse(&g, file.p, file.n, err, sizeof err) == SI_OK, "%s", err);
    expect_chat(g, conv, 4, true,
                "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHello [/INST]Hi!</s><s>[INST] Bye [/INST]",
                "llama-2");
    si_gguf_free(g);
    free(file.p);

    file = make_spm(1, "{% for message in messages %}{{ message['content'] }}{% endfor %}");
    CHECK(si_gguf_parse(&g, file.p, file.n, err, sizeof err) == SI_OK, "%s", err);
    char buf[64];
    CHECK(si_chat_format(g, conv, 4, true, buf, sizeof buf) == SI_E_UNSUPPORTED,
          "unknown template");
    si_gguf_free(g);
    free(file.p);

    /* No template at all in a gemma file: gemma's turns (content trimmed). */
    file = make_spm(1, NULL);
    CHECK(si_gguf_parse(&g, file.p, file.n, err, sizeof err) == SI_OK, "%s", err);
    expect_chat(g, conv + 1, 1, true,
                "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n", "no template");
    si_gguf_free(g);
    free(file.p);

    /* No template in another architecture: chatml without a default system
     * message, as llama.cpp assumes. */
    struct gguf_build b = {0};
    kv_str(&b, "general.architecture", "llama");
    file = finish(&b);
    CHECK(si_gguf_parse(&g, file.p, file.n, err, sizeof err) == SI_OK, "%s", err);
    expect_chat(g, conv + 1, 1, true,
                "<|im_start|>user\n Hello <|im_end|>\n<|im_start|>assistant\n", "no template, llama");
    si_gguf_free(g);
    free(file.p);
}

/* ------------------------------------------------------ the real model */

struct sample {
    const char *text;
    const int32_t *special;
    int64_t n_special;
    const int32_t *plain;
    int64_t n_plain;
};

/* Generated by tests/data/tokenizer-oracle.py (HF tokenizers). */
static const int32_t sample0_special[] = {19556, 905, 17,  378,   2365, 6354, 16438,
                                          27003, 690, 260, 23790, 2767, 30};
static const int32_t sample0_plain[] = {19556, 905, 17,  378,   2365, 6354, 16438,
                                        27003, 690, 260, 23790, 2767, 30};
static const int32_t sample1_special[] = {
    51, 1939, 2756, 1650,  11180, 1558,  1156,  41307, 92, 20174, 28,    5549,  137, 593,
    29, 87,   291,  34878, 28,    12102, 10214, 3231,  28, 15486, 46494, 28239, 83,  1747};
static const int32_t sample1_plain[] = {
    51, 1939, 2756, 1650,  11180, 1558,  1156,  41307, 92, 20174, 28,    5549,  137, 593,
    29, 87,   291,  34878, 28,    12102, 10214, 3231,  28, 15486, 46494, 28239, 83,  1747};
static const int32_t sample2_special[] = {23274, 115,   40993, 179, 120,   248, 26453, 11100, 224,
                                          10391, 251,   10391, 134, 11100, 226, 7365,  118,   28589,
                                          29184, 33579, 40236, 218, 18645, 237, 32607, 19076};
static const int32_t sample2_plain[] = {23274, 115,   40993, 179, 120,   248, 26453, 11100, 224,
                                        10391, 251,   10391, 134, 11100, 226, 7365,  118,   28589,
                                        29184, 33579, 40236, 218, 18645, 237, 32607, 19076};
static const int32_t sample3_special[] = {10809, 33777, 42,    15107, 235,   231, 10813, 233, 138,
                                          15107, 225,   121,   10813, 225,   132, 40303, 218, 173,
                                          247,   114,   31752, 15107, 235,   118, 321,   231, 10813,
                                          235,   119,   321,   231,   10813, 235, 117};
static const int32_t sample3_plain[] = {10809, 33777, 42,    15107, 235,   231, 10813, 233, 138,
                                        15107, 225,   121,   10813, 225,   132, 40303, 218, 173,
                                        247,   114,   31752, 15107, 235,   118, 321,   231, 10813,
                                        235,   119,   321,   231,   10813, 235, 117};
static const int32_t sample4_special[] = {
    39006, 216, 33,  34, 35, 36, 37, 28, 216, 35, 30, 33, 36,    28,  731, 32,  30,  37,  85,  33,
    32,    284, 216, 33, 28, 32, 32, 32, 28,  32, 32, 32, 19133, 216, 164, 111, 164, 112, 164, 113};
static const int32_t sample4_plain[] = {
    39006, 216, 33,  34, 35, 36, 37, 28, 216, 35, 30, 33, 36,    28,  731, 32,  30,  37,  85,  33,
    32,    284, 216, 33, 28, 32, 32, 32, 28,  32, 32, 32, 19133, 216, 164, 111, 164, 112, 164, 113};
static const int32_t sample5_special[] = {12420, 982,  339, 3060,  392,   3543, 502,  2316,
                                          1041,  6737, 357, 506,   12246, 23,   3256, 637,
                                          34818, 492,  23,  47917, 10922, 385,  5036, 3816};
static const int32_t sample5_plain[] = {12420, 982,  339, 3060,  392,   3543, 502,  2316,
                                        1041,  6737, 357, 506,   12246, 23,   3256, 637,
                                        34818, 492,  23,  47917, 10922, 385,  5036, 3816};
static const int32_t sample6_special[] = {256, 2899, 5600, 28, 35079, 5600, 333};
static const int32_t sample6_plain[] = {256, 2899, 5600, 28, 35079, 5600, 333};
static const int32_t sample7_special[] = {100,  7366, 197,  397,  197,   197, 100,
                                          7366, 216,  197,  6468, 198,   198, 2241,
                                          201,  198,  5110, 1116, 11181, 198, 1112};
static const int32_t sample7_plain[] = {100,  7366, 197,  397,  197,   197, 100,
                                        7366, 216,  197,  6468, 198,   198, 2241,
                                        201,  198,  5110, 1116, 11181, 198, 1112};
static const int32_t sample8_special[] = {81,  216,   278, 256,   265, 333,
                                          287, 15442, 85,  12109, 218, 86};
static const int32_t sample8_plain[] = {81,  216,   278, 256,   265, 333,
                                        287, 15442, 85,  12109, 218, 86};
static const int32_t sample9_special[] = {4635, 42,   585,  365,   104,   10888, 216, 33, 32,
                                          25,   1662, 1003, 1792,  22690, 105,   75,  32, 77,
                                          1232, 637,  83,   36651, 4029,  13241, 5189};
static const int32_t sample9_plain[] = {4635, 42,   585,  365,   104,   10888, 216, 33, 32,
                                        25,   1662, 1003, 1792,  22690, 105,   75,  32, 77,
                                        1232, 637,  83,   36651, 4029,  13241, 5189};
static const int32_t sample10_special[] = {1, 4093, 198, 26843, 665, 2, 198, 1, 520, 9531, 198};
static const int32_t sample10_plain[] = {44,  108, 306, 79,   3738, 108, 46,  4093, 198, 26843,
                                         665, 44,  108, 306,  79,   486, 108, 46,   198, 44,
                                         108, 306, 79,  3738, 108,  46,  520, 9531, 198};
static const int32_t sample11_special[] = {0, 1, 2, 216, 3, 104, 5};
static const int32_t sample11_plain[] = {
    44, 108, 486, 1714, 2692, 108,   21198, 108,  306, 79,  3738, 108,  21198, 108,   306,
    79, 486, 108, 46,   2067, 22139, 79,    1245, 46,  104, 44,   2153, 79,    29070, 46};
static const int32_t sample12_special[] = {
    35781, 151, 219,   9301,  253,   151,   226,   284,   4963,  19521, 22235, 23098, 7105,
    22901, 286, 21985, 46879, 16464, 32547, 12428, 36395, 20602, 44626, 31462, 10805};
static const int32_t sample12_plain[] = {
    35781, 151, 219,   9301,  253,   151,   226,   284,   4963,  19521, 22235, 23098, 7105,
    22901, 286, 21985, 46879, 16464, 32547, 12428, 36395, 20602, 44626, 31462, 10805};
static const int32_t sample13_special[] = {-1};
static const int32_t sample13_plain[] = {-1};
static const int32_t sample14_special[] = {216};
static const int32_t sample14_plain[] = {216};
static const int32_t sample15_special[] = {198};
static const int32_t sample15_plain[] = {198};
static const int32_t sample16_special[] = {29646, 16693, 47, 27040, 12002, 43, 43, 43};
static const int32_t sample16_plain[] = {29646, 16693, 47, 27040, 12002, 43, 43, 43};
static const struct sample SAMPLES[] = {
    {"Hello world! The quick brown fox jumps over the lazy dog.", sample0_special, 13,
     sample0_plain, 13},
    {"Caf\303\251 cr\303\250me br\303\273l\303\251e, \303\274ber-gro\303\237, ma\303\261ana, "
     "na\303\257ve \303\211cole",
     sample1_special, 28, sample1_plain, 28},
    {"\346\227\245\346\234\254\350\252\236\343\201\256\343\203\206\343\202\255\343\202\271\343\203"
     "\210\343\201\250\344\270\255\346\226\207\357\274\210\347\256\200\344\275\223\357\274\211\343"
     "\200\202",
     sample2_special, 26, sample2_plain, 26},
    {"Emoji: \360\237\221\215\360\237\217\275 \360\237\207\253\360\237\207\267 "
     "\360\237\230\200\342\235\244\357\270\217 "
     "\360\237\221\250\342\200\215\360\237\221\251\342\200\215\360\237\221\247",
     sample3_special, 34, sample3_plain, 34},
    {"Numbers 12345, 3.14, -0.5e10 and 1,000,000\302\262 \331\241\331\242\331\243", sample4_special,
     40, sample4_plain, 40},
    {"don't I'll we've they're she'd it's YOU'RE 'tis O'Neil ''quoted''", sample5_special, 24,
     sample5_plain, 24},
    {"   leading spaces, trailing spaces   ", sample6_special, 7, sample6_plain, 7},
    {"tabs\011and\011\011tabs \011 mixed\012\012new\015\012lines\012\012\012  \012 end",
     sample7_special, 21, sample7_plain, 21},
    {"a  b   c    d\302\240e\343\200\200f", sample8_special, 12, sample8_plain, 12},
    {"code: if (x >= 10) { return x->y[0] + 'c'; } // comment", sample9_special, 25, sample9_plain,
     25},
    {"<|im_start|>user\012Hi there<|im_end|>\012<|im_start|>assistant\012", sample10_special, 11,
     sample10_plain, 29},
    {"<|endoftext|><|im_start|><|im_end|> <repo_name>x<file_sep>", sample11_special, 7,
     sample11_plain, 30},
    {"mixed\314\201 combining a\314\210 and Greek \316\261\316\262\316\263 Cyrillic "
     "\320\277\321\200\320\270\320\262\320\265\321\202 Arabic "
     "\331\205\330\261\330\255\330\250\330\247",
     sample12_special, 25, sample12_plain, 25},
    {"", sample13_special, 0, sample13_plain, 0},
    {" ", sample14_special, 1, sample14_plain, 1},
    {"\012", sample15_special, 1, sample15_plain, 1},
    {"!!!???...,,,;;;", sample16_special, 8, sample16_plain, 8},
};

/*
 * The samples llama.cpp tokenized (tests/data/smollm2-tokenize.txt, made with
 * its llama-tokenize: special tokens parsed, no BOS for this model) must give
 * the same ids here.  "text:" lines escape newline, tab, CR and backslash.
 */
static void test_llamacpp_file(const struct si_tokenizer *tok)
{
    const char *srcdir = getenv("srcdir");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/smollm2-tokenize.txt", srcdir != NULL ? srcdir : ".");
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s", path);
    if (f == NULL)
        return;
    char line[4096], text[4096];
    size_t text_len = 0;
    int samples = 0;
    bool have_text = false;
    while (fgets(line, sizeof line, f) != NULL) {
        size_t n = strlen(line);
        if (n > 0 && line[n - 1] == '\n')
            line[--n] = '\0';
        if (strncmp(line, "text: ", 6) == 0) {
            text_len = 0;
            for (const char *p = line + 6; *p != '\0' && text_len < sizeof text - 1; p++) {
                if (*p == '\\' && p[1] != '\0') {
                    p++;
                    text[text_len++] = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'r' ? '\r' : *p;
                } else {
                    text[text_len++] = *p;
                }
            }
            have_text = true;
        } else if (strncmp(line, "ids:", 4) == 0 && have_text) {
            int32_t want[512], got[512];
            int nw = 0;
            char *p = line + 4, *end;
            for (long v; nw < 512 && (v = strtol(p, &end, 10), end != p); p = end)
                want[nw++] = (int32_t)v;
            int64_t ng = si_tokenize(tok, text, text_len, false, true, got, 512);
            bool same = ng == nw;
            for (int i = 0; same && i < nw; i++)
                same = got[i] == want[i];
            CHECK(same, "llama.cpp sample '%.*s': %lld ids here, %d there", (int)text_len, text,
                  (long long)ng, nw);
            samples++;
            have_text = false;
        }
    }
    fclose(f);
    CHECK(samples >= 10, "only %d samples in %s", samples, path);
    printf("llama.cpp's tokenizations: %d samples compared\n", samples);
}

static void test_real_model(const char *path)
{
    struct si_gguf *g = NULL;
    struct si_tokenizer *tok = NULL;
    char err[512] = "";
    int rc = si_gguf_open(&g, path, err, sizeof err);
    CHECK(rc == SI_OK, "%s", err);
    if (rc != SI_OK)
        return;
    rc = si_tokenizer_load(&tok, g, err, sizeof err);
    CHECK(rc == SI_OK, "%s", err);
    if (rc != SI_OK) {
        si_gguf_free(g);
        return;
    }
    test_llamacpp_file(tok);
    CHECK(si_tokenizer_n_vocab(tok) == 49152, "n_vocab %d", si_tokenizer_n_vocab(tok));
    CHECK(si_tokenizer_bos(tok) == 1 && si_tokenizer_eos(tok) == 2, "bos %d eos %d",
          si_tokenizer_bos(tok), si_tokenizer_eos(tok));
    CHECK(!si_tokenizer_add_bos(tok), "SmolLM2 does not add BOS");
    CHECK(si_tokenizer_is_eog(tok, 2) && si_tokenizer_is_eog(tok, 0) &&
              !si_tokenizer_is_eog(tok, 1),
          "EOG: <|im_end|> and <|endoftext|>, not <|im_start|>");

    int32_t ids[512];
    char out[2048];
    for (size_t k = 0; k < sizeof SAMPLES / sizeof *SAMPLES; k++) {
        const struct sample *s = &SAMPLES[k];
        size_t len = strlen(s->text);
        for (int special = 0; special < 2; special++) {
            const int32_t *want = special ? s->special : s->plain;
            int64_t n_want = special ? s->n_special : s->n_plain;
            int64_t n = si_tokenize(tok, s->text, len, false, special, ids, 512);
            CHECK(ids_eq(ids, n, want, n_want), "sample %zu (special %d): %lld tokens, HF %lld", k,
                  special, (long long)n, (long long)n_want);
            if (!ids_eq(ids, n, want, n_want)) {
                print_ids("got", ids, n);
                print_ids("HF ", want, n_want);
            }
            /* Detokenizing gives back the exact bytes (control tokens
             * shown when they were parsed). */
            size_t m = detokenize(tok, ids, n, special, out, sizeof out);
            CHECK(m == len && memcmp(out, s->text, len) == 0, "sample %zu round trip: '%s'", k,
                  out);
        }
    }

    /* BOS on request even though the file does not ask for it. */
    int64_t n = si_tokenize(tok, "Hi", 2, true, false, ids, 512);
    CHECK(n >= 2 && ids[0] == 1, "BOS first: %lld", (long long)n);
    /* Special tokens hidden unless asked for. */
    CHECK(si_token_to_piece(tok, 1, false, out, sizeof out) == 0, "<|im_start|> hidden");
    CHECK(si_token_to_piece(tok, 1, true, out, sizeof out) == 12 &&
              memcmp(out, "<|im_start|>", 12) == 0,
          "<|im_start|> shown");
    CHECK(si_token_to_piece(tok, 49152, true, out, sizeof out) == SI_E_INVALID, "id n_vocab");

    /* Invalid UTF-8 survives the round trip when the vocabulary has the
     * bytes; those it lacks (0xFF, 0xC0, ...) are dropped, as HF does. */
    static const char bad[] = "ok \xc3 \xe2\x82 \xf0\x9f\x91 \xed\xa0\x80 \xaf\x80 end";
    n = si_tokenize(tok, bad, sizeof bad - 1, false, true, ids, 512);
    CHECK(n > 0 && detokenize(tok, ids, n, true, out, sizeof out) == sizeof bad - 1 &&
              memcmp(out, bad, sizeof bad - 1) == 0,
          "invalid UTF-8 round trip");
    static const char lacking[] = "a\xff\xc0\x04"
                                  "b";
    n = si_tokenize(tok, lacking, sizeof lacking - 1, false, true, ids, 512);
    CHECK(n == 2 && ids[0] == 81 && ids[1] == 82, "bytes outside the vocabulary: %lld tokens",
          (long long)n);

    /* A long run of one character: the heap keeps this fast. */
    size_t big = 100000;
    char *text = malloc(big);
    int32_t *many = malloc(big * sizeof *many);
    if (text != NULL && many != NULL) {
        memset(text, 'a', big);
        n = si_tokenize(tok, text, big, false, false, many, big);
        char *back = malloc(big + 1);
        CHECK(n > 0 && back != NULL && detokenize(tok, many, n, false, back, big + 1) == big &&
                  memcmp(back, text, big) == 0,
              "100000 x 'a': %lld tokens", (long long)n);
        free(back);
    }
    free(text);
    free(many);

    /* The chat template: SmolLM2 adds its default system message when the
     * conversation has none (strings rendered with jinja2). */
    static const struct si_chat_msg conv[] = {
        {"user", "Hello"},
        {"assistant", "Hi! How can I help?"},
    };
    expect_chat(g, conv, 2, true,
                "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                "Hugging Face<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>"
                "assistant\nHi! How can I help?<|im_end|>\n<|im_start|>assistant\n",
                "SmolLM2 chatml");
    static const struct si_chat_msg with_system[] = {
        {"system", "Be brief."},
        {"user", "Hello"},
    };
    expect_chat(g, with_system, 2, true,
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                "<|im_start|>assistant\n",
                "SmolLM2 chatml with a system message");
    expect_chat(g, with_system, 2, false,
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n",
                "SmolLM2 chatml without the assistant's opening");

    /* The formatted chat tokenizes with its markers as single tokens. */
    n = si_chat_format(g, conv, 2, true, out, sizeof out);
    if (n > 0 && (size_t)n < sizeof out) {
        int64_t m = si_tokenize(tok, out, (size_t)n, false, true, ids, 512);
        int markers = 0;
        for (int64_t i = 0; i < m && i < 512; i++)
            markers += ids[i] == 1 || ids[i] == 2;
        CHECK(markers == 7, "chat markers %d", markers);
    }

    si_tokenizer_free(tok);
    si_gguf_free(g);
}

int main(void)
{
    test_unicode();
    test_spm();
    test_bpe();
    test_bad();
    test_chat_synthetic();
    const char *path = getenv("STARINFER_TEST_MODEL");
    if (path == NULL || *path == '\0') {
        if (test_failures > 0)
            return test_result();
        printf("%d synthetic checks passed\n", test_checks);
        test_skip("STARINFER_TEST_MODEL not set; real-model checks not run");
    }
    test_real_model(path);
    return test_result();
}
