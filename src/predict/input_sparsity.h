/*
 * input_sparsity.h - training-free input sparsity (TEAL, Liu et al. 2024):
 * before each matrix product of a layer, the entries of its input whose
 * magnitude is at or below a threshold become 0, so that the product can
 * skip the weight columns they multiply.  The inputs are those of enum
 * si_input_kind (model/forward.h): the attention's normalised input (q, k,
 * v), its output (the output projection), the FFN's normalised input (gate
 * and up) and its activations (down).
 *
 * A layer's threshold for an input is the S-quantile of the input's
 * magnitudes over a calibration text, S the target sparsity: a share S of
 * its entries falls at or below it.  Calibration runs the reference forward
 * pass over the text (in windows, as the profiler does: predict/profile.h)
 * and keeps a histogram of |x| per layer and input (predict/hist.h: bins
 * 0.4% wide, 512 KiB each); the thresholds of a grid of S values are kept
 * in the profile (starinfer profile --input-sparsity), and a run at any S
 * in the grid's range takes, per layer and input, the threshold linearly
 * interpolated between the grid's two nearest points.
 */
#ifndef SI_PREDICT_INPUT_SPARSITY_H
#define SI_PREDICT_INPUT_SPARSITY_H

#include "model/forward.h"
#include "model/model.h"
#include "predict/profile.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The grid the profiler calibrates: S = 0.05, 0.10, ..., 0.90. */
#define SI_INPUT_GRID_N 18

struct si_input_calib;

/* For model m: SI_OK, or SI_E_NOMEM (n_layer x 4 histograms of 512 KiB). */
int si_input_calib_init(struct si_input_calib **out, const struct si_model *m, char *err,
                        size_t err_size);
void si_input_calib_free(struct si_input_calib *c);

/*
 * Run tokens[0..n) through the reference with parameters rp (rp.n_ctx the
 * window; 0: the model's training context, at most 4096), adding every
 * matrix product's input to c's histograms.  SI_E_INVALID for a token
 * outside the vocabulary or another model's c.
 */
int si_input_calib_collect(struct si_input_calib *c, const struct si_model *m,
                           struct si_ref_params rp, const int32_t *tokens, int64_t n, char *err,
                           size_t err_size);

/*
 * Give p c's thresholds on the grid SI_INPUT_GRID_N (replacing any it
 * had); the measured share at or below each threshold, layer by layer,
 * goes to below (n_layer * SI_INPUT_KINDS * SI_INPUT_GRID_N, as the
 * thresholds) when not NULL.  SI_E_INVALID when p is not c's shape or c saw
 * no tokens, SI_E_NOMEM.
 */
int si_input_calib_apply(const struct si_input_calib *c, struct si_profile *p, double *below,
                         char *err, size_t err_size);

/*
 * out (n_layer * SI_INPUT_KINDS, as si_ref_params.input_thresholds wants
 * them) = p's thresholds at target sparsity S: 0 for S = 0; between two
 * grid points, linear in S; SI_E_INVALID (one line naming the range) for S
 * outside [0, the grid's last point] or a profile without input sparsity.
 */
int si_input_thresholds_at(const struct si_profile *p, double S, float *out, char *err,
                           size_t err_size);

/* The same with a target sparsity per input kind (S[kind]). */
int si_input_thresholds_by_kind(const struct si_profile *p, const double S[SI_INPUT_KINDS],
                                float *out, char *err, size_t err_size);

/*
 * The share of model m's layer weights that S[kind] leaves out when each
 * kind's input drops that share of its entries: each kind weighed by the
 * elements of its matrices (q, k, v; the output projection; gate and up;
 * down) over the layers.  The embedding and the LM head are not counted.
 */
double si_input_model_sparsity(const struct si_model *m, const double S[SI_INPUT_KINDS]);

/*
 * The targets per input kind of input sparsity S beside an FFN mode: S for
 * every kind, but 0 for the FFN's inputs (gate/up, down) when sparse_ffn
 * (gate and predictor modes keep their own neuron sparsity there).
 */
void si_input_targets(double S, bool sparse_ffn, double out[SI_INPUT_KINDS]);

/*
 * Parse a --sparsity input value after "input": "" (0.4 everywhere), "=S",
 * or "=KIND:S,..." with KIND qkv, o, ffn, down (the kinds not named: 0).
 * Each S in [0, 0.9].  true, or false with one line in err.
 */
bool si_input_parse(const char *spec, double S[SI_INPUT_KINDS], char *err, size_t err_size);

#endif /* SI_PREDICT_INPUT_SPARSITY_H */
