/*
 * profile.h - activation profiles: per layer and FFN neuron, how many of the
 * tokens of a corpus activated it (its activation was not zero).
 *
 * Collecting runs the model (the StarPU engine's batched prefill, or the
 * reference forward pass of model/forward.h: struct si_ffn_runner below)
 * over the tokens in windows of its context length: the KV cache is reset
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
 * and, in profiles counted with thresholds (below; both keys or neither):
 *
 *   starinfer.profile.gate_threshold   FLOAT32 array [n_layer], finite, >= 0
 *   starinfer.profile.target_sparsity  FLOAT32 in [0, 1)
 *
 * and, in profiles with input sparsity thresholds (input_sparsity.h; both
 * or neither):
 *
 *   starinfer.profile.input_sparsity    FLOAT32 array [K], increasing, in (0, 1)
 *   starinfer.profile.input_thresholds  FLOAT32 array [n_layer * 4 * K]: layer
 *                                       l, kind c (enum si_input_kind), grid
 *                                       point k at (l * 4 + c) * K + k; finite,
 *                                       >= 0, not decreasing in k
 *
 * The reader also takes F32 count tensors holding exact integers.  Other
 * keys and tensors are ignored.
 *
 * Thresholds (CATS, Lee et al. 2024).  A SiLU or GELU FFN has almost no
 * exact zeros, so counting "activation != 0" says nothing.  Instead a neuron
 * counts as active when |a| > t_l, where a = act(gate . x) for gated FFNs
 * (the gate's activation before the product with up: what CATS thresholds
 * and what the engine's gate mode and si_ref_params.gate_threshold test,
 * skipping a neuron when !(|a| > t)) or a = act(up . x) for plain ones, and
 * t_l is layer l's S-quantile of |a| over the corpus tokens for a target
 * sparsity S, so that a share S of the (token, neuron) pairs of every layer
 * falls at or below it.  Picking t_l takes a first pass over the tokens
 * (struct si_profile_calib): a histogram per layer of |a| in log-spaced bins
 * (the top 16 bits of the float's bit pattern: exponent and 8 mantissa bits,
 * bins 2^-8 = 0.4% wide relatively, 65536 uint64 per layer, 512 KiB), whose
 * bin edge nearest to the quantile becomes t_l (the largest float of the bin
 * below the edge).  The counting pass then counts |a| > t_l per neuron, so on
 * the same tokens each layer's measured sparsity is S up to the share of
 * values in the bin at the quantile (half of it at most).  ReLU-family
 * models (act ReLU) keep counting activation != 0 and get thresholds 0.
 */
#ifndef SI_PREDICT_PROFILE_H
#define SI_PREDICT_PROFILE_H

#include "model/forward.h"
#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Per layer and FFN neuron, how many evaluated tokens activated it. */
struct si_profile {
    int32_t n_layer;
    int32_t n_ff;
    int64_t n_tokens; /* tokens counted */
    int64_t *counts;  /* (n_layer, n_ff): counts[l * n_ff + i] */
    /* NULL: counts of activation != 0.  Else (n_layer) thresholds: counts of
     * |a| > thresholds[l] (see above), set by si_profile_set_thresholds before
     * collecting, chosen for target_sparsity; all 0 on ReLU-family models. */
    float *thresholds;
    float target_sparsity;
    /* Input sparsity (predict/input_sparsity.h), or n_input 0 and NULLs:
     * input_grid (n_input) target sparsities, increasing, in (0, 1);
     * input_thresholds (n_layer, SI_INPUT_KINDS, n_input) the magnitudes
     * at or below which the share input_grid[k] of the entries of layer l's
     * input of that kind fell on the calibration text. */
    int32_t n_input;
    float *input_grid;
    float *input_thresholds;
};

/*
 * A pass over a corpus (the profile's two passes, predictor training's
 * thresholds and samples): tokens[0..n) in windows of the runner's context
 * (each from an empty cache, BOS in place of its first token when the model
 * adds one, as si_profile_collect describes), with hook(user, view, l)
 * called for every evaluated token's layers in order: token by token,
 * layer 0 first.  si_ffn_runner_ref's runs the reference forward pass with
 * parameters rp (rp.n_ctx the window); graph/engine.h's
 * si_engine_ffn_runner the StarPU engine's batched prefill.  run returns
 * SI_OK or the error, one line in err.
 */
struct si_ffn_runner {
    int (*run)(const struct si_ffn_runner *r, const struct si_model *m, const int32_t *tokens,
               int64_t n, si_ffn_hook hook, void *user, char *err, size_t err_size);
    struct si_ref_params rp; /* the reference's parameters */
    void *self;              /* another runner's state (the engine) */
    /* The reference's runner only: every matrix product's input as well
     * (si_ref's input_hook; NULL: none). */
    si_input_hook input_hook;
    void *input_user;
};

/* The reference's runner: si_ref_eval token by token with parameters rp. */
struct si_ffn_runner si_ffn_runner_ref(struct si_ref_params rp);

/* A zeroed profile; SI_OK, SI_E_INVALID (a size below 1) or SI_E_NOMEM. */
int si_profile_init(struct si_profile **out, int32_t n_layer, int32_t n_ff, char *err,
                    size_t err_size);
void si_profile_free(struct si_profile *p);

/*
 * Run the model through `run` (the reference with rp.n_ctx 0 takes the
 * model's training context, at most 4096) over tokens[0..n) in windows of
 * its context, as described above, adding to p->counts every neuron whose
 * activation is not zero (with thresholds on a SiLU/GELU model: whose |a|
 * is above its layer's threshold) and n to p->n_tokens.  p's shape must be the
 * model's and every token inside its vocabulary (SI_E_INVALID otherwise,
 * checked before anything runs).  On failure p is left unchanged.
 */
int si_profile_collect(struct si_profile *p, const struct si_model *m,
                       const struct si_ffn_runner *run, const int32_t *tokens, int64_t n,
                       char *err, size_t err_size);

/* The token every window starts with, or -1: BOS when the model has one and
 * its tokenizer metadata asks for it (defaults as in model/tokenizer.c). */
int32_t si_profile_window_bos(const struct si_model *m);

/* True for models whose FFN activation is ReLU (exact zeros to count). */
bool si_profile_relu_family(const struct si_model *m);

/* The first pass that picks the thresholds: per layer, a histogram of |a|. */
struct si_profile_calib;

/* For model m: SI_OK or SI_E_NOMEM.  (ReLU-family models need no histogram.) */
int si_profile_calib_init(struct si_profile_calib **out, const struct si_model *m, char *err,
                          size_t err_size);
void si_profile_calib_free(struct si_profile_calib *c);

/* Run tokens[0..n) through `run` in windows, as si_profile_collect
 * does, adding every |a| to c's histograms (nothing for ReLU-family models).
 * SI_E_INVALID for a token outside the vocabulary or another model's c; after
 * another failure c holds part of the tokens (free it). */
int si_profile_calib_collect(struct si_profile_calib *c, const struct si_model *m,
                             const struct si_ffn_runner *run, const int32_t *tokens, int64_t n,
                             char *err, size_t err_size);

/* Tokens c has seen. */
int64_t si_profile_calib_tokens(const struct si_profile_calib *c);

/*
 * Give p the thresholds of target sparsity S in [0, 1) from c (S = 0: all 0;
 * ReLU-family models: all 0 whatever S).  p must be c's shape and hold no
 * counts yet (SI_E_INVALID otherwise); the share of |a| values at or below
 * each layer's threshold goes to below_share[l] when not NULL.
 */
int si_profile_set_thresholds(struct si_profile *p, const struct si_profile_calib *c, double S,
                              double *below_share, char *err, size_t err_size);

/*
 * The activation CDF as an SVG picture (PowerInfer's Fig. 4): for the whole
 * model (thick) and each layer (thin, grey), the share of neurons sorted most
 * active first on x against the cumulative share of their activations on y,
 * with the diagonal of uniform activity, axes, a legend and `title` (escaped;
 * its first two lines, the second smaller).
 * Exactly n_layer + 1 <polyline> elements.  SI_OK or SI_E_IO / SI_E_NOMEM.
 */
int si_profile_write_svg(const struct si_profile *p, const char *path, const char *title,
                         char *err, size_t err_size);

/* NULL when an input sparsity table (struct si_profile's n_input,
 * input_grid, input_thresholds for n_layer layers) is well formed, else
 * what is wrong, in a few words. */
const char *si_profile_input_check(int32_t n_layer, int32_t n_input, const float *grid,
                                   const float *thr);

/* Write the file (through a temporary name and a rename).  SI_E_INVALID when
 * a count does not fit the I32 tensors (or is negative or above n_tokens). */
int si_profile_write(const struct si_profile *p, const char *path, char *err, size_t err_size);

/*
 * Read and check the file: every key present and in range, each count tensor
 * there with shape {n_ff} and type I32 (or F32 of whole numbers), every count
 * in [0, n_tokens], thresholds (when there) finite and >= 0 with a target
 * sparsity in [0, 1).  SI_E_NOT_FOUND / SI_E_IO for a file that cannot be
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
