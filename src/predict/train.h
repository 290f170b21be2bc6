/*
 * train.h - training PowerInfer's activation predictors, one per layer.
 *
 * A predictor guesses, from a layer's FFN input x (the normalised residual
 * the FFN reads), which of its n_ff neurons will be active:
 *
 *   y = fc2 . relu(fc1 . x),  neuron i predicted active when y_i >= threshold
 *
 * with fc1 (r, n_embd) and fc2 (n_ff, r), no biases: PowerInfer's layout,
 * blk.N.fc1.weight with GGUF shape {n_embd, r} and blk.N.fc2.weight {r, n_ff},
 * and powerinfer.sparse_threshold (0 here) for the threshold.
 *
 * Samples.  si_train_collect runs the model over a corpus (the StarPU
 * engine's batched prefill or the reference: predict/profile.h's runners)
 * and keeps, per layer and token, x (as fp16) and the active mask (a bit per
 * neuron).  Active: on ReLU-family models activation != 0; on SiLU/GELU
 * models a per-layer threshold t_l on
 *   SI_ACTIVE_GATE    |act(gate . x)| > t_l, the profile's CATS rule
 *                     (predict/profile.h; what the engine's gate mode skips)
 *   SI_ACTIVE_OUTPUT  |h| > t_l with h = act(gate . x) * (up . x), the
 *                     neuron's own output (act(up . x) for ungated FFNs):
 *                     what its down row is multiplied by
 * with t_l the layer's target-sparsity quantile of that value over a corpus
 * (si_profile_calib for the gate rule, si_active_calib for either).
 * Memory: n_layer * n_tokens * (2 n_embd + n_ff / 8) bytes
 * (SmolLM2-135M, 8192 tokens: 330 MB).
 *
 * Training one layer at width r: the samples are shuffled (seeded) and split
 * into a training part and a held-out part (--holdout, 10%); fc1 and fc2 are
 * initialised at random (He-scaled to x's RMS), then trained for `epochs`
 * passes in minibatches by Adam on the balanced binary cross-entropy of
 * sigmoid(y) against the mask: positives weighted 1 / (2 p) and negatives
 * 1 / (2 (1 - p)) with p the layer's share of active (token, neuron) pairs
 * in the training part, so a sparse layer's rare positives count as much as
 * its negatives (pos_weight multiplies the positives' weight further).  The
 * products are OpenBLAS sgemm calls; everything is deterministic for a seed
 * (and a BLAS thread count).
 *
 * Adaptive width (PowerInfer section 5.1): the layer's start width is its
 * active share times n_embd, rounded up to a multiple of rank_step and
 * clamped to [rank_min, rank_max]; a predictor trained there whose held-out
 * recall at threshold 0 reaches target_recall is shrunk, else the width is
 * doubled until it does (or rank_max fails too: rank_max is kept), then a
 * binary search over the multiples of rank_step in between finds the
 * smallest width that reaches the target.  Each width is trained from the
 * same seed from scratch.
 */
#ifndef SI_PREDICT_TRAIN_H
#define SI_PREDICT_TRAIN_H

#include "model/forward.h"
#include "model/model.h"
#include "predict/profile.h" /* the runners */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum si_active_rule { SI_ACTIVE_GATE, SI_ACTIVE_OUTPUT, SI_ACTIVE_COUNT };

/* "gate", "output"; and back (SI_E_NOT_FOUND). */
const char *si_active_rule_name(enum si_active_rule r);
int si_active_rule_parse(const char *name, enum si_active_rule *out);

/* The value the rule thresholds for neuron i in an FFN hook (forward.h). */
float si_active_value(const struct si_ffn_view *v, enum si_active_rule r, int64_t i);

/* Per layer, a histogram of the rule's values over a corpus, to pick the
 * thresholds of a target sparsity, as si_profile_calib does for the gate
 * rule (and with the same bins: for the gate rule both pick the same). */
struct si_active_calib;
int si_active_calib_init(struct si_active_calib **out, const struct si_model *m,
                         enum si_active_rule r, char *err, size_t err_size);
void si_active_calib_free(struct si_active_calib *c);
/* Run tokens[0..n) through `run` (windows, as si_profile_collect) into c. */
int si_active_calib_collect(struct si_active_calib *c, const struct si_model *m,
                            const struct si_ffn_runner *run, const int32_t *tokens, int64_t n,
                            char *err, size_t err_size);
/* thresholds[0..n_layer) for target sparsity S in [0, 1) (0 for S = 0). */
int si_active_calib_thresholds(const struct si_active_calib *c, double S, float *thresholds,
                               char *err, size_t err_size);

/* Per layer: x (fp16) and the active bits of each sample. */
struct si_train_samples {
    int32_t n_layer, n_embd, n_ff;
    int64_t cap;        /* samples room per layer */
    int64_t n;          /* samples kept per layer (the same in every layer) */
    int64_t mask_bytes; /* (n_ff + 7) / 8 */
    uint16_t *x;        /* (n_layer, cap, n_embd) */
    uint8_t *mask;      /* (n_layer, cap, mask_bytes), bit i of byte i / 8 */
    enum si_pred_input input; /* what x is (model.h): the FFN's normalised
                               * input (si_ffn_view's x), the attention's
                               * (xa) or the residual the FFN's norm read
                               * (xr); set before collecting */
};

/* Room for cap samples per layer; SI_OK, SI_E_INVALID or SI_E_NOMEM. */
int si_train_samples_init(struct si_train_samples **out, int32_t n_layer, int32_t n_embd,
                          int32_t n_ff, int64_t cap, char *err, size_t err_size);
void si_train_samples_free(struct si_train_samples *s);

/* Store sample number s->n of layer l: x (n_embd) and active (n_ff, 0 or
 * not).  The caller fills every layer, then increments s->n (tests do this;
 * si_train_collect does it for the corpus). */
void si_train_samples_set(struct si_train_samples *s, int32_t l, const float *x,
                          const uint8_t *active);

/* Is neuron i of sample k in layer l active? */
static inline bool si_train_sample_active(const struct si_train_samples *s, int32_t l, int64_t k,
                                          int64_t i)
{
    const uint8_t *m = s->mask + ((size_t)l * (size_t)s->cap + (size_t)k) * (size_t)s->mask_bytes;
    return (m[i >> 3] >> (i & 7)) & 1;
}

/*
 * Evaluate tokens[0..n) through `run` (in windows, as si_profile_collect
 * does) and add a sample per token and layer
 * until s is full (the tokens beyond are not evaluated).  thresholds: the
 * (n_layer) thresholds of `rule` on a SiLU/GELU model (required there;
 * ignored on ReLU-family models).  SI_E_INVALID for a shape that is not the
 * model's.
 */
int si_train_collect(struct si_train_samples *s, const struct si_model *m,
                     const struct si_ffn_runner *run, enum si_active_rule rule,
                     const float *thresholds, const int32_t *tokens, int64_t n, char *err,
                     size_t err_size);

/*
 * Keep collected samples in a file to train again without the forward
 * passes: GGUF with starinfer.samples.{n (UINT64), n_layer, n_embd, n_ff
 * (UINT32)}, per layer blk.N.samples_x F16 {n_embd, n} and
 * blk.N.samples_mask I8 {mask_bytes, n}, and the rule and thresholds the
 * masks were made with (starinfer.samples.active_rule STRING,
 * starinfer.samples.active_threshold FLOAT32[n_layer],
 * starinfer.samples.target_sparsity) when given.
 */
int si_train_samples_write(const struct si_train_samples *s, enum si_active_rule rule,
                           const float *thresholds, double target_sparsity, const char *path,
                           char *err, size_t err_size);

/* Read them back (cap = n); m, when not NULL, must have their shape.
 * *thresholds gets a new (n_layer) array or NULL when the file has none. */
int si_train_samples_read(struct si_train_samples **out, enum si_active_rule *rule,
                          float **thresholds, double *target_sparsity, const char *path,
                          const struct si_model *m, char *err, size_t err_size);

/* Called after every epoch of every width tried on a layer. */
typedef void (*si_train_progress_fn)(void *user, int32_t layer, int32_t rank, int32_t epoch,
                                     int32_t epochs);

enum si_train_loss { SI_TRAIN_LOSS_BALANCED, SI_TRAIN_LOSS_COST, SI_TRAIN_LOSS_COUNT };

struct si_train_params {
    double target_recall; /* held-out recall the adaptive width aims at (0.95) */
    int32_t rank_step;    /* widths are multiples of it (32: quantizable rows) */
    int32_t rank_min;     /* smallest width tried (rank_step) */
    int32_t rank_max;     /* largest width tried (0: n_embd rounded up to rank_step) */
    int32_t epochs;       /* passes over the training part per width (10) */
    int32_t batch;        /* minibatch (256) */
    float lr;             /* Adam's step (2e-3), decayed linearly to a tenth */
    float pos_weight;     /* extra weight of the positives (1: balanced) */
    double holdout;       /* share of samples held out for recall (0.1) */
    uint64_t seed;        /* shuffling and initialisation (1) */
    int32_t threads;      /* threads for the elementwise steps (the loss's
                           * gradient, Adam; 0: the online CPUs); the
                           * weights do not depend on it */
    /* The loss: SI_TRAIN_LOSS_BALANCED (default) as described above, or
     * SI_TRAIN_LOSS_COST: each (sample, neuron) pair's cross-entropy
     * weighted by the cost of getting it wrong, |v^P - t_l^P| with v the
     * rule's value (recomputed from the model's FFN weights and x), t_l the
     * layer's threshold (> 0: SiLU/GELU rules with a target sparsity; a
     * ReLU model's rule has none and is refused) and P = cost_power, the
     * weights normalised to a mean of 1 (no class balancing: the costs set
     * it).  A missed strong neuron then costs more than a missed weak one.
     * si_train_adaptive refuses it: recall at threshold 0, its test, means
     * nothing without balanced classes. */
    enum si_train_loss loss;
    double cost_power;            /* P, (0, 4] (1) */
    const struct si_model *model; /* the samples' model (needed by COST) */
    enum si_active_rule rule;     /* the samples' rule */
    const float *thresholds;      /* (n_layer) their thresholds, NULL on ReLU */
    si_train_progress_fn progress;
    void *progress_user;
};

struct si_train_params si_train_default_params(void);

/* Quality of a predictor on held-out samples at threshold 0. */
struct si_train_quality {
    double recall;    /* active neurons predicted active, share */
    double precision; /* predicted neurons that are active, share */
    double pred_sparsity; /* (token, neuron) pairs predicted inactive, share */
    double loss;      /* balanced cross-entropy per (token, neuron) pair */
};

/* A trained predictor of one layer (row-major floats). */
struct si_train_layer {
    int32_t rank;
    float *fc1; /* (rank, n_embd) */
    float *fc2; /* (n_ff, rank) */
    struct si_train_quality before; /* held out, at the initial weights */
    struct si_train_quality after;  /* held out, trained */
    double train_loss;              /* training part, last epoch's mean */
    double active_share;            /* the layer's share of active pairs */
    int32_t n_trials;               /* widths tried */
    double seconds;                 /* training time, all widths */
};

void si_train_layer_clear(struct si_train_layer *t); /* frees fc1, fc2; zeroes */

/* Train layer l at width `rank` (a multiple of nothing in particular). */
int si_train_fit(const struct si_train_samples *s, int32_t l, int32_t rank,
                 const struct si_train_params *p, struct si_train_layer *out, char *err,
                 size_t err_size);

/* Train layer l with the adaptive width described above. */
int si_train_adaptive(const struct si_train_samples *s, int32_t l, const struct si_train_params *p,
                      struct si_train_layer *out, char *err, size_t err_size);

/*
 * The predictor threshold T at which the trained predictors layers[0..
 * n_layer) select a share 1 - S of the (sample, neuron) pairs of s, all
 * layers together (powerinfer.sparse_threshold is one number for the whole
 * model): neurons with fc2 output >= T are computed.  Training on a rule
 * with a high target sparsity and running at a lower one (the predictors
 * then rank the neurons, the threshold picks how many) keeps the strongest
 * neurons best.  T is found on a histogram of the outputs (steps of 1/256
 * in [-64, 64)): the edge that skips the largest share at or below S
 * (-FLT_MAX, skipping nothing, when more than S lies below -64); *got gets
 * that share.  S in [0, 1).
 */
int si_train_threshold_for_sparsity(const struct si_train_samples *s,
                                    const struct si_train_layer *layers, double S, float *T,
                                    double *got, char *err, size_t err_size);

/* Output file options. */
struct si_train_write_params {
    uint32_t type;          /* enum si_type of fc1/fc2: F32, F16 or a quantizable type */
    float threshold;        /* powerinfer.sparse_threshold */
    bool powerinfer;        /* PowerInfer's layout (model/pwri.h: "PWRI", its tensor set,
                             * ffn_down_t in Q4_0 or F16; input must be residual);
                             * also the input model's when it is a PWRI file */
    bool down_t;            /* add blk.N.ffn_down_t.weight (when the model has none) */
    enum si_active_rule rule;     /* the rule trained on */
    const float *thresholds;      /* (n_layer) its thresholds, or NULL (ReLU) */
    double target_sparsity;       /* their target (stored with them) */
    int64_t n_samples;            /* samples per layer trained on (> 0: stored) */
    enum si_pred_input input;     /* what the predictors were trained on: stored
                                   * as SI_PREDICTOR_INPUT_KEY (si_pred_input_name) */
    bool predictors_only;         /* write a predictor file (model.h) instead of the
                                   * model: the predictors, their keys and the
                                   * model's shape and fingerprint, no weights */
};

/*
 * Write the model m (every key and tensor of its file, predictor tensors
 * already there replaced) with layers[0..n_layer) as blk.N.fc1.weight
 * {n_embd, rank} and blk.N.fc2.weight {rank, n_ff} in wp->type, and
 * powerinfer.sparse_threshold; with thresholds, also
 * starinfer.predictor.active_rule ("gate" or "output"),
 * starinfer.predictor.active_threshold FLOAT32[n_layer] and
 * starinfer.predictor.target_sparsity (what `starinfer eval` calls active);
 * with n_samples, starinfer.predictor.n_samples (UINT64: trained predictors,
 * not synth's random ones).
 * A PWRI file of a llama model whose activation is not ReLU gets
 * starinfer.ffn_activation, since PWRI llama files are ReLU by default.
 * With down_t, a model without them gets blk.N.ffn_down_t.weight {n_embd,
 * n_ff} (PowerInfer's transposed down projection: row i is neuron i's
 * column of ffn_down), in ffn_down's type when si_quantize_row writes it,
 * else F16, made one layer at a time while the file is written.
 * SI_E_INVALID when a width does not fit the type's blocks.
 */
int si_train_write(const struct si_model *m, const struct si_train_layer *layers,
                   const struct si_train_write_params *wp, const char *path, char *err,
                   size_t err_size);

/* The type "auto" picks: the model's ffn_up type when si_quantize_row writes
 * it and every width (multiples of rank_step) and n_embd fit its blocks, else F16. */
uint32_t si_train_auto_type(const struct si_model *m, int32_t rank_step);

#endif /* SI_PREDICT_TRAIN_H */
