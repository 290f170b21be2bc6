/*
 * tokenizer.h - text to token ids and back, from a GGUF file's metadata.
 *
 * Models: "gpt2" (byte-level BPE: the pre-tokenizer named by
 * tokenizer.ggml.pre splits the text, each piece is mapped to GPT-2's
 * printable byte alphabet and merged by tokenizer.ggml.merges ranks) and
 * "llama" / "gemma" style SentencePiece (score-based merges over UTF-8
 * characters, "▁" for spaces, <0xXX> byte fallback).  Special tokens
 * (tokenizer.ggml.token_type CONTROL / USER_DEFINED) are matched whole in the
 * text when parse_special is true.
 */
#ifndef SI_MODEL_TOKENIZER_H
#define SI_MODEL_TOKENIZER_H

#include "model/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct si_tokenizer;

/* Load from the file's tokenizer.* keys; SI_OK or a negative si_status with
 * one line in err (missing key, unknown model or pre-tokenizer, bad ids). */
int si_tokenizer_load(struct si_tokenizer **out, const struct si_gguf *g, char *err,
                      size_t err_size);
void si_tokenizer_free(struct si_tokenizer *tok);

int32_t si_tokenizer_n_vocab(const struct si_tokenizer *tok);
int32_t si_tokenizer_bos(const struct si_tokenizer *tok); /* -1 when none */
int32_t si_tokenizer_eos(const struct si_tokenizer *tok); /* -1 when none */
/* True for end-of-generation tokens (EOS, EOT, <|im_end|>, <end_of_turn>...). */
bool si_tokenizer_is_eog(const struct si_tokenizer *tok, int32_t id);
/* Whether the file asks for BOS to be prepended (tokenizer.ggml.add_bos_token). */
bool si_tokenizer_add_bos(const struct si_tokenizer *tok);

/*
 * Tokenize `len` bytes of UTF-8 text into ids[0..cap).  Returns the number of
 * tokens (which may exceed cap: then only cap were written), or a negative
 * si_status.  add_bos prepends BOS when the model has one.
 */
int64_t si_tokenize(const struct si_tokenizer *tok, const char *text, size_t len, bool add_bos,
                    bool parse_special, int32_t *ids, size_t cap);

/*
 * The bytes of token `id` as text (GPT-2 byte alphabet and "▁" undone, byte
 * tokens as their byte).  Returns the length (which may exceed cap: then only
 * cap bytes were written), or a negative si_status for an invalid id.
 * Special tokens give their text only when `special` is true.
 */
int64_t si_token_to_piece(const struct si_tokenizer *tok, int32_t id, bool special, char *buf,
                          size_t cap);

/* One message of a conversation. */
struct si_chat_msg {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
};

/*
 * Format a conversation with the model's chat template (chatml, as SmolLM2's
 * tokenizer.chat_template; gemma's turns; llama-2 [INST]) into buf[0..cap),
 * ending with the assistant's opening when add_assistant.  Returns the length
 * (may exceed cap) or SI_E_UNSUPPORTED for a template it does not know.
 */
int64_t si_chat_format(const struct si_gguf *g, const struct si_chat_msg *msgs, size_t n,
                       bool add_assistant, char *buf, size_t cap);

#endif /* SI_MODEL_TOKENIZER_H */
