/*
 * fuzz-tokenizer.c - fuzz target for the tokenizer and the chat templates
 * (see fuzz.h): arbitrary bytes, invalid UTF-8 included.
 *
 * The vocabularies: tests/vocab.c's SentencePiece (byte fallback, a chat
 * template) and GPT-2 byte-level BPE, and those of the GGUF files named in
 * $FUZZ_TOKENIZER_MODELS (colon-separated; tests/test-fuzz.sh passes
 * SmolLM2's byte-level BPE and gemma3's SentencePiece when they are cached).
 * An input is byte 0: flags (bit 0 add BOS, bit 1 parse special tokens,
 * bit 2 special pieces in the text back), byte 1: which vocabulary, then the
 * text.  Promises checked: every id in [0, n_vocab), the same ids twice,
 * every id's piece readable, a byte-level BPE's pieces giving the text back
 * (without special tokens; less the bytes whose alphabet character the
 * vocabulary lacks, which it drops as HF tokenizers and llama.cpp do), and
 * the chat template's length the same with a
 * short buffer as with a long one (the text itself split at NUL bytes into
 * system, user and assistant messages).
 */
#include "fuzz.h"

#include "../vocab.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "starinfer.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VOCABS 8

static struct vocab {
    struct si_gguf *g;
    const struct si_gguf *view;
    struct si_tokenizer *tok;
    bool byte_level; /* GPT-2 BPE: every byte sequence comes back as it was, */
    bool dropped[256]; /* but for the bytes whose alphabet token it lacks */
} vocabs[MAX_VOCABS];
static int n_vocabs;

/* A file's vocabulary (path), or a built one (file: its bytes, kept). */
static void add_vocab(const char *path, struct buf file)
{
    char err[256];
    struct vocab *v = &vocabs[n_vocabs];
    const int rc = path != NULL ? si_gguf_open(&v->g, path, err, sizeof err)
                                : si_gguf_parse(&v->g, file.p, file.n, err, sizeof err);
    if (rc != SI_OK || si_tokenizer_load(&v->tok, v->g, err, sizeof err) != SI_OK)
        fuzz_fail("%s: %s", path != NULL ? path : "a built vocabulary", err);
    v->view = v->g;
    struct si_gguf_str model;
    v->byte_level = si_gguf_get_str(v->g, "tokenizer.ggml.model", &model) == SI_OK &&
                    si_gguf_str_eq(model, "gpt2");
    for (int b = 0; b < 256 && v->byte_level; b++) {
        const char c = (char)b;
        int32_t id[4];
        v->dropped[b] = si_tokenize(v->tok, &c, 1, false, false, id, 4) == 0;
    }
    n_vocabs++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    add_vocab(NULL, make_spm(1, "{{ bos_token }}{% for message in messages %}<start_of_turn>"
                                "{{ message['role'] }}\n{{ message['content'] }}<end_of_turn>\n"
                                "{% endfor %}"));
    add_vocab(NULL, make_bpe("gpt2", NULL, 0));
    const char *env = getenv("FUZZ_TOKENIZER_MODELS");
    if (env != NULL && env[0] != '\0') {
        char *list = strdup(env), *save = NULL;
        if (list == NULL)
            fuzz_fail("out of memory");
        for (char *p = strtok_r(list, ":", &save); p != NULL; p = strtok_r(NULL, ":", &save)) {
            if (n_vocabs == MAX_VOCABS)
                fuzz_fail("FUZZ_TOKENIZER_MODELS: more than %d files", MAX_VOCABS - 1);
            add_vocab(p, (struct buf){0});
        }
        free(list);
    }
    return 0;
}

static int64_t tokenize(const struct si_tokenizer *tok, const char *text, size_t len, bool bos,
                        bool special, int32_t **ids)
{
    size_t cap = len + 16;
    *ids = malloc(cap * sizeof **ids);
    if (*ids == NULL)
        fuzz_fail("out of memory");
    int64_t n = si_tokenize(tok, text, len, bos, special, *ids, cap);
    if (n > (int64_t)cap) {
        cap = (size_t)n;
        free(*ids);
        if ((*ids = malloc(cap * sizeof **ids)) == NULL)
            fuzz_fail("out of memory");
        const int64_t again = si_tokenize(tok, text, len, bos, special, *ids, cap);
        if (again != n)
            fuzz_fail("%lld tokens, then %lld", (long long)n, (long long)again);
    }
    return n;
}

static void chat(const struct si_gguf *g, const char *text, size_t len, bool add_assistant)
{
    static const char *const roles[] = {"system", "user", "assistant", "user"};
    struct si_chat_msg msgs[4];
    size_t n = 0, at = 0;
    while (n < 4 && at <= len) {
        msgs[n] = (struct si_chat_msg){roles[n], text + at};
        n++;
        at += strlen(text + at) + 1;
    }
    char small[8];
    const int64_t want = si_chat_format(g, msgs, n, add_assistant, small, sizeof small);
    if (want < 0)
        return; /* a template it does not know */
    char *buf = malloc((size_t)want + 1);
    if (buf == NULL)
        fuzz_fail("out of memory");
    const int64_t got = si_chat_format(g, msgs, n, add_assistant, buf, (size_t)want + 1);
    if (got != want)
        fuzz_fail("chat: %lld bytes, then %lld", (long long)want, (long long)got);
    if (memcmp(buf, small, want < (int64_t)sizeof small ? (size_t)want : sizeof small) != 0)
        fuzz_fail("chat: the short buffer's bytes differ");
    fuzz_sink += fuzz_touch(buf, (size_t)got);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const bool bos = data[0] & 1, special = data[0] & 2, special_out = data[0] & 4;
    const struct vocab *v = &vocabs[data[1] % n_vocabs];
    /* The text as a NUL-ended copy of its own size, for the chat's strings. */
    const size_t len = size - 2;
    char *text = malloc(len + 1);
    if (text == NULL)
        fuzz_fail("out of memory");
    memcpy(text, data + 2, len);
    text[len] = '\0';

    int32_t *ids = NULL, *again = NULL;
    const int64_t n = tokenize(v->tok, text, len, bos, special, &ids);
    if (n < 0) {
        free(ids);
        free(text);
        return 0;
    }
    fuzz_accepted++;
    const int32_t nv = si_tokenizer_n_vocab(v->tok);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv)
            fuzz_fail("id %d out of [0, %d)", ids[i], nv);
    const int64_t n2 = tokenize(v->tok, text, len, bos, special, &again);
    if (n2 != n || memcmp(ids, again, (size_t)n * sizeof *ids) != 0)
        fuzz_fail("the same text gave two tokenizations");
    char piece[16];
    /* The byte-level round trip: the text without the bytes it drops. */
    char *want = malloc(len + 1);
    size_t n_want = 0, n_back = 0;
    if (want == NULL)
        fuzz_fail("out of memory");
    for (size_t i = 0; i < len; i++)
        if (!v->dropped[(uint8_t)text[i]])
            want[n_want++] = text[i];
    bool same = true;
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = si_token_to_piece(v->tok, ids[i], special_out, piece, sizeof piece);
        if (k < 0)
            fuzz_fail("id %d has no piece: %lld", ids[i], (long long)k);
        if (k > (int64_t)sizeof piece) {
            char *big = malloc((size_t)k);
            if (big == NULL)
                fuzz_fail("out of memory");
            if (si_token_to_piece(v->tok, ids[i], special_out, big, (size_t)k) != k)
                fuzz_fail("id %d: two lengths", ids[i]);
            fuzz_sink += fuzz_touch(big, (size_t)k);
            same = same && n_back + (size_t)k <= n_want &&
                   memcmp(big, want + n_back, (size_t)k) == 0;
            free(big);
        } else {
            fuzz_sink += fuzz_touch(piece, (size_t)k);
            same = same && n_back + (size_t)k <= n_want &&
                   memcmp(piece, want + n_back, (size_t)k) == 0;
        }
        n_back += (size_t)k;
    }
    if (v->byte_level && !bos && !special && !(same && n_back == n_want))
        fuzz_fail("byte-level BPE: %zu bytes (%zu it keeps) came back as %zu, not the same", len,
                  n_want, n_back);
    free(want);
    chat(v->view, text, len, bos);
    free(again);
    free(ids);
    free(text);
    return 0;
}

/* Texts that reach the tokenizer's corners: plain, multilingual, invalid
 * UTF-8, special tokens, whitespace and digit runs, chat messages. */
#define CHAT "\x01\x01You are terse.\0What is 2+2?\0It is 4.\0And 3+3?"
int fuzz_write_seeds(const char *dir)
{
    static const struct {
        const char *name;
        const char *text;
        size_t len; /* 0: strlen */
    } seeds[] = {
        {"plain", "\x00\x00The quick brown fox jumps over the lazy dog.", 0},
        {"multilingual", "\x01\x01H\xc3\xa9llo, \xe4\xb8\x96\xe7\x95\x8c! \xd0\x9f\xd1\x80\xd0\xb8"
                         "\xd0\xb2\xd0\xb5\xd1\x82 \xf0\x9f\x98\x80 na\xc3\xafve caf\xc3\xa9",
         0},
        {"invalid-utf8",
         "\x00\x02\xff\xfe\x80\x80 abc \xc0\xaf \xe0\x80\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \xf0\x9f\x98"
         " \xc3",
         0},
        {"special", "\x03\x01<|im_start|>user\nhi<|im_end|><s></s><end_of_turn><start_of_turn>"
                    "<|endoftext|><unk><pad>",
         0},
        {"spaces-digits", "\x05\x02   \t\t\n\n\r\n  12345678901234567890 3.14159 1,000,000   x  ", 0},
        {"chat", CHAT, sizeof CHAT - 1},
        {"empty", "\x07\x00", 2},
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        const size_t n = seeds[i].len ? seeds[i].len : 2 + strlen(seeds[i].text + 2);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, seeds[i].name);
        if (fuzz_write_file(path, seeds[i].text, n) != 0) {
            fprintf(stderr, "fuzz-tokenizer: cannot write %s\n", path);
            return -1;
        }
    }
    return 0;
}
