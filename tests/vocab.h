/*
 * vocab.h - small tokenizer vocabularies built byte by byte as GGUF images
 * (metadata only), for test-tokenizer and the tokenizer's fuzz target: a
 * SentencePiece vocabulary with byte fallback and a tiny GPT-2 byte-level
 * BPE, plus the builder for hand-made (and broken) ones.
 */
#ifndef SI_TESTS_VOCAB_H
#define SI_TESTS_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growing byte buffer; aborts when out of memory. */
struct buf {
    uint8_t *p;
    size_t n, cap;
};

/* A GGUF file with metadata only: key-values go into `body`, counted. */
struct gguf_build {
    struct buf body;
    uint64_t n_kv;
};

void kv_str(struct gguf_build *g, const char *key, const char *v);
void kv_u32(struct gguf_build *g, const char *key, uint32_t v);
void kv_bool(struct gguf_build *g, const char *key, bool v);
void kv_strs(struct gguf_build *g, const char *key, const char *const *v, size_t n);
/* An array of n 4-byte elements of `type`. */
void kv_arr(struct gguf_build *g, const char *key, uint32_t type, const void *v, size_t n);
/* The whole file; frees the build. */
struct buf finish(struct gguf_build *g);

/* The SentencePiece vocabulary's ids: <unk>, <s>, </s>, <0x00>..<0xFF>, 17
 * normal tokens ("▁", letters, "he", "hello", ...), then a control token
 * "<ctrl>", a user-defined "<user>" and a control "<end_of_turn>". */
#define SPM_N_NORMAL     17
#define SPM_FIRST_BYTE   3
#define SPM_FIRST_NORMAL (SPM_FIRST_BYTE + 256)
#define SPM_CTRL         ((int32_t)(SPM_FIRST_NORMAL + SPM_N_NORMAL))
#define SPM_USER         (SPM_CTRL + 1)
#define SPM_EOT          (SPM_CTRL + 2)
#define SPM_N            (SPM_CTRL + 3)

/* Id of a normal SPM token by its text; aborts for another text. */
int32_t spm_id(const char *text);

/* The SentencePiece vocabulary ("gemma3"); space_prefix < 0 leaves
 * tokenizer.ggml.add_space_prefix out; chat_template may be NULL. */
struct buf make_spm(int space_prefix, const char *chat_template);

/* The GPT-2 BPE: the 256 byte tokens, "he", "ll", "hell", "hello", "Ġw",
 * "Ġwo", "<|end|>" (control); merges in that order.  `merges` (NULL: those)
 * may be replaced to test bad ones; pre NULL leaves tokenizer.ggml.pre out. */
struct buf make_bpe(const char *pre, const char *const *merges, size_t n_merges);

#endif /* SI_TESTS_VOCAB_H */
