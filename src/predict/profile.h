/*
 * profile.h - activation profiles: per layer and FFN neuron, how many of the
 * tokens of a corpus activated it (its activation was not zero).
 *
 * Collecting runs the reference forward pass (model/forward.h) over the
 * tokens in windows of the reference's context length: the KV cache is reset
 * at the start of each window and, when the model's tokenizer metadata asks
 * for BOS (tokenizer.ggml.add_bos_token, by default true for SentencePiece
 * "llama" tokenizers and false for "gpt2" ones, as model/tokenizer.c decides),
 * the window's first token is evaluated as BOS in its place, as llama.cpp's
 * perplexity tool does.  Exactly n tokens are evaluated and counted either
 * way, so no count ever exceeds n_tokens.
 *
 * File format: GGUF (version 3, magic "GGUF"), independent of the model's
 * architecture (no general.architecture key):
 *
 *   starinfer.profile.n_tokens  UINT64  tokens counted
 *   starinfer.profile.n_layer   UINT32
 *   starinfer.profile.n_ff      UINT32
 *   blk.N.ffn_act_count         I32 {n_ff}, one per layer N in [0, n_layer)
 *
 * The reader also takes F32 count tensors holding exact integers.  Other
 * keys and tensors are ignored.
 */
#ifndef SI_PREDICT_PROFILE_H
#define SI_PREDICT_PROFILE_H

#include "model/forward.h"
#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

/* Per layer and FFN neuron, how many evaluated tokens activated it. */
struct si_profile {
    int32_t n_layer;
    int32_t n_ff;
    int64_t n_tokens; /* tokens counted */
    int64_t *counts;  /* (n_layer, n_ff): counts[l * n_ff + i] */
};

/* A zeroed profile; SI_OK, SI_E_INVALID (a size below 1) or SI_E_NOMEM. */
int si_profile_init(struct si_profile **out, int32_t n_layer, int32_t n_ff, char *err,
                    size_t err_size);
void si_profile_free(struct si_profile *p);

/*
 * Run the reference forward pass (parameters rp; rp.n_ctx 0 is the model's
 * training context, at most 4096) over tokens[0..n) in windows of rp.n_ctx
 * tokens, as described above, adding to p->counts every neuron whose
 * activation is not zero and n to p->n_tokens.  p's shape must be the
 * model's and every token inside its vocabulary (SI_E_INVALID otherwise,
 * checked before anything runs).  On failure p is left unchanged.
 */
int si_profile_collect(struct si_profile *p, const struct si_model *m, struct si_ref_params rp,
                       const int32_t *tokens, int64_t n, char *err, size_t err_size);

/* Write the file (through a temporary name and a rename).  SI_E_INVALID when
 * a count does not fit the I32 tensors (or is negative or above n_tokens). */
int si_profile_write(const struct si_profile *p, const char *path, char *err, size_t err_size);

/*
 * Read and check the file: every key present and in range, each count tensor
 * there with shape {n_ff} and type I32 (or F32 of whole numbers), every count
 * in [0, n_tokens].  SI_E_NOT_FOUND / SI_E_IO for a file that cannot be
 * opened, SI_E_FORMAT for a malformed one.  m may be NULL; otherwise n_layer
 * and n_ff must be the model's (SI_E_INVALID naming both values).
 */
int si_profile_read(struct si_profile **out, const char *path, const struct si_model *m,
                    char *err, size_t err_size);

/*
 * The power-law skew: the smallest fraction of all n_layer * n_ff neurons
 * that, taking the most active first, carries at least `share` (in [0, 1]) of
 * all activations of the profile.  0 for a profile without activations;
 * -1 when out of memory.
 */
double si_profile_top_fraction(const struct si_profile *p, double share);

#endif /* SI_PREDICT_PROFILE_H */
