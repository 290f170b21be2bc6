/* vocab.c - small tokenizer vocabularies built byte by byte (see vocab.h). */
#include "vocab.h"

#include "model/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put(struct buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (b->p == NULL)
            abort();
    }
    if (n)
        memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u8(struct buf *b, uint8_t v)
{
    put(b, &v, 1);
}
static void put_u32(struct buf *b, uint32_t v)
{
    put(b, &v, 4);
}
static void put_u64(struct buf *b, uint64_t v)
{
    put(b, &v, 8);
}
static void put_str(struct buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_key(struct buf *b, const char *key, uint32_t type)
{
    put_str(b, key);
    put_u32(b, type);
}


void kv_str(struct gguf_build *g, const char *key, const char *v)
{
    put_key(&g->body, key, SI_GGUF_STRING);
    put_str(&g->body, v);
    g->n_kv++;
}
void kv_u32(struct gguf_build *g, const char *key, uint32_t v)
{
    put_key(&g->body, key, SI_GGUF_UINT32);
    put_u32(&g->body, v);
    g->n_kv++;
}
void kv_bool(struct gguf_build *g, const char *key, bool v)
{
    put_key(&g->body, key, SI_GGUF_BOOL);
    put_u8(&g->body, v);
    g->n_kv++;
}
void kv_strs(struct gguf_build *g, const char *key, const char *const *v, size_t n)
{
    put_key(&g->body, key, SI_GGUF_ARRAY);
    put_u32(&g->body, SI_GGUF_STRING);
    put_u64(&g->body, n);
    for (size_t i = 0; i < n; i++)
        put_str(&g->body, v[i]);
    g->n_kv++;
}
void kv_arr(struct gguf_build *g, const char *key, uint32_t type, const void *v, size_t n)
{
    put_key(&g->body, key, SI_GGUF_ARRAY);
    put_u32(&g->body, type);
    put_u64(&g->body, n);
    put(&g->body, v, n * 4);
    g->n_kv++;
}

/* The whole file; frees the build. */
struct buf finish(struct gguf_build *g)
{
    struct buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, g->n_kv);
    put(&b, g->body.p, g->body.n);
    free(g->body.p);
    return b;
}

/* ------------------------------------------- SentencePiece, byte fallback */

static const struct {
    const char *text;
    float score;
} SPM_NORMAL[] = {
    {"\xe2\x96\x81", -1},
    {"h", -2},
    {"e", -2},
    {"l", -2},
    {"o", -2},
    {"w", -2},
    {"r", -2},
    {"d", -2},
    {"he", -3},
    {"ll", -1.5f},
    {"llo", -4},
    {"hello", -6},
    {"lo", -2.5f},
    {"or", -3},
    {"wor", -5},
    {"\xe2\x96\x81w", -4},
    {"\xe2\x96\x81hello", -7},
};

_Static_assert(sizeof SPM_NORMAL / sizeof *SPM_NORMAL == SPM_N_NORMAL, "SPM_N_NORMAL");

/* Id of a normal SPM token by its text. */
int32_t spm_id(const char *text)
{
    for (size_t i = 0; i < SPM_N_NORMAL; i++)
        if (strcmp(SPM_NORMAL[i].text, text) == 0)
            return (int32_t)(SPM_FIRST_NORMAL + i);
    abort();
}

/*
 * <unk>, <s>, </s>, <0x00>..<0xFF>, the normal tokens, then a control token
 * "<ctrl>", a user-defined "<user>" and a control "<end_of_turn>".
 * space_prefix < 0 leaves tokenizer.ggml.add_space_prefix out.
 */
struct buf make_spm(int space_prefix, const char *chat_template)
{
    static char bytes[256][8];
    const char *toks[SPM_N];
    float scores[SPM_N];
    int32_t types[SPM_N];
    toks[0] = "<unk>";
    toks[1] = "<s>";
    toks[2] = "</s>";
    types[0] = 2;
    types[1] = types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[SPM_FIRST_BYTE + b] = bytes[b];
        types[SPM_FIRST_BYTE + b] = 6;
    }
    for (size_t i = 0; i < SPM_N_NORMAL; i++) {
        toks[SPM_FIRST_NORMAL + i] = SPM_NORMAL[i].text;
        types[SPM_FIRST_NORMAL + i] = 1;
    }
    toks[SPM_CTRL] = "<ctrl>";
    types[SPM_CTRL] = 3;
    toks[SPM_USER] = "<user>";
    types[SPM_USER] = 4;
    toks[SPM_EOT] = "<end_of_turn>";
    types[SPM_EOT] = 3;
    for (int i = 0; i < SPM_N; i++)
        scores[i] =
            i >= SPM_FIRST_NORMAL && i < SPM_CTRL ? SPM_NORMAL[i - SPM_FIRST_NORMAL].score : 0.0f;

    struct gguf_build g = {0};
    kv_str(&g, "general.architecture", "gemma3");
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_str(&g, "tokenizer.ggml.pre", "default");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, SPM_N);
    kv_arr(&g, "tokenizer.ggml.scores", SI_GGUF_FLOAT32, scores, SPM_N);
    kv_arr(&g, "tokenizer.ggml.token_type", SI_GGUF_INT32, types, SPM_N);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(&g, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(&g, "tokenizer.ggml.unknown_token_id", 0);
    if (space_prefix >= 0)
        kv_bool(&g, "tokenizer.ggml.add_space_prefix", space_prefix != 0);
    if (chat_template != NULL)
        kv_str(&g, "tokenizer.chat_template", chat_template);
    return finish(&g);
}

/* ------------------------------------------------------ a tiny GPT-2 BPE */

/* GPT-2's byte alphabet character for byte b, as UTF-8. */
static void alphabet(int b, char out[4])
{
    int cp = b, next = 256;
    bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    if (!printable) {
        for (int i = 0; i < b; i++)
            if (!((i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || i >= 0xae))
                next++;
        cp = next;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

/*
 * The 256 byte tokens, "he", "ll", "hell", "hello", "Ġw", "Ġwo", "<|end|>"
 * (control); merges in that order.  `merges` may be replaced to test bad
 * ones; pre NULL leaves tokenizer.ggml.pre out.
 */
struct buf make_bpe(const char *pre, const char *const *merges, size_t n_merges)
{
    static char bytes[256][4];
    static const char *const extra[] = {"he",        "ll",         "hell",   "hello",
                                        "\xc4\xa0w", "\xc4\xa0wo", "<|end|>"};
    static const char *const good[] = {"h e",    "l l",        "he ll",
                                       "hell o", "\xc4\xa0 w", "\xc4\xa0w o"};
    const char *toks[256 + 7];
    int32_t types[256 + 7];
    for (int b = 0; b < 256; b++) {
        alphabet(b, bytes[b]);
        toks[b] = bytes[b];
        types[b] = 1;
    }
    for (int i = 0; i < 7; i++) {
        toks[256 + i] = extra[i];
        types[256 + i] = i == 6 ? 3 : 1;
    }
    if (merges == NULL) {
        merges = good;
        n_merges = 6;
    }
    struct gguf_build g = {0};
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    if (pre != NULL)
        kv_str(&g, "tokenizer.ggml.pre", pre);
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 263);
    kv_arr(&g, "tokenizer.ggml.token_type", SI_GGUF_INT32, types, 263);
    kv_strs(&g, "tokenizer.ggml.merges", merges, n_merges);
    kv_u32(&g, "tokenizer.ggml.eos_token_id", 262);
    return finish(&g);
}
