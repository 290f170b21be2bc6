/*
 * eval.h - how good a model's activation predictors are: per layer recall,
 * precision and predicted sparsity against the neurons really active, their
 * size, and the perplexity of the model on a text in dense, gate and
 * predictor modes, all on the reference forward pass.
 *
 * "Active": activation != 0 on ReLU-family models; on SiLU/GELU ones the
 * rule the predictors were trained on (predict/train.h: |act(gate . x)|,
 * the profile's CATS rule, or the neuron's output |h|) above the layer's
 * threshold.  A neuron is predicted active when its fc2 output reaches
 * powerinfer.sparse_threshold, computed as the reference's predictor mode
 * computes it (si_ref_predict, with the same si_ref_params).
 *
 * Perplexity is computed as llama.cpp's perplexity tool (and `starinfer
 * perplexity`) computes it: chunks of n_ctx tokens, each from an empty cache
 * with its first token replaced by BOS when the model adds one, attention in
 * f32 for chunks of 64 tokens or more, the second half of each chunk scored.
 */
#ifndef SI_PREDICT_EVAL_H
#define SI_PREDICT_EVAL_H

#include "model/forward.h"
#include "model/model.h"
#include "predict/train.h"

#include <stdint.h>

/* One layer's predictions against the truth over all (token, neuron) pairs. */
struct si_eval_confusion {
    int64_t tp, fp, fn, tn;
};

double si_eval_recall(const struct si_eval_confusion *c);    /* tp / (tp + fn); 1 if none */
double si_eval_precision(const struct si_eval_confusion *c); /* tp / (tp + fp); 1 if none */
double si_eval_pred_sparsity(const struct si_eval_confusion *c); /* (fn + tn) / all */
double si_eval_true_sparsity(const struct si_eval_confusion *c); /* (fp + tn) / all */

struct si_eval_ppl {
    double ppl;          /* exp(mean negative log-likelihood) */
    double ppl_err;      /* its standard error (as llama.cpp reports it) */
    int64_t n_scored;    /* tokens scored */
    int64_t n_chunks;
    double ffn_computed; /* share of FFN neurons with a non-zero contribution */
    double seconds;
};

/* The sums perplexity is made of, position by position (si_eval_perplexity
 * and the engine's perplexity in tools/cmd_perplexity.c alike). */
struct si_ppl_sum {
    double nll, nll2; /* sums of -log p(next) and of its square */
    int64_t count;
};

/* Add -log softmax(logits)[next] (n_vocab logits). */
void si_ppl_add(struct si_ppl_sum *s, const float *logits, int32_t n_vocab, int32_t next);

/* exp of the mean so far (1 with nothing added). */
double si_ppl_value(const struct si_ppl_sum *s);

/* out's ppl, ppl_err (llama.cpp's standard error) and n_scored from s. */
void si_ppl_finish(const struct si_ppl_sum *s, struct si_eval_ppl *out);

/* After each chunk: chunks done, of n_chunks, and the perplexity so far. */
typedef void (*si_eval_progress_fn)(void *user, int64_t chunk, int64_t n_chunks, double ppl);

struct si_eval_params {
    int64_t max_chunks;          /* > 0: at most this many chunks */
    int32_t bos;                 /* the token replacing each chunk's first, or -1 */
    enum si_active_rule rule;    /* what thresholds apply to (SiLU/GELU) */
    const float *thresholds;     /* (n_layer) the rule's; NULL on ReLU-family models */
    struct si_eval_confusion *conf; /* not NULL: (n_layer) predictors vs truth, added to */
    bool oracle;                 /* compute exactly the active neurons (the rule's truth) */
    si_eval_progress_fn progress;
    void *progress_user;
};

/*
 * Perplexity of m with parameters rp (rp.n_ctx: the chunk length, >= 16) on
 * tokens[0..n) (n_chunks = n / n_ctx).  With ep->conf, the model's
 * predictors are compared with the active neurons on every evaluated token
 * (before any sparsity of rp applies).  With ep->oracle, each FFN computes
 * exactly its active neurons: the best any predictor of the rule can do.
 * SI_E_INVALID for fewer tokens than one chunk or a token outside the
 * vocabulary; the reference's errors otherwise.
 */
int si_eval_perplexity(const struct si_model *m, struct si_ref_params rp, const int32_t *tokens,
                       int64_t n, const struct si_eval_params *ep, struct si_eval_ppl *out,
                       char *err, size_t err_size);

/*
 * What si_eval_perplexity watches, as an FFN hook for another evaluator
 * (the engine's observer, graph/engine.h): each call tells the active
 * neurons (ep's rule and thresholds), adds the predictors' calls against
 * them to ep->conf (when set; the predictors computed with act_quant's
 * arithmetic) and, with ep->oracle, zeroes the inactive ones in the view's
 * h.  SI_E_INVALID (predictors compared on a model without them, or
 * thresholds missing on a SiLU/GELU model), SI_E_NOMEM.
 */
struct si_eval_watch;
int si_eval_watch_init(struct si_eval_watch **out, const struct si_model *m,
                       const struct si_eval_params *ep, bool act_quant, char *err,
                       size_t err_size);
void si_eval_watch_hook(void *user, const struct si_ffn_view *v, int l);
/* The share of the (token, layer, neuron) triples seen that were active. */
double si_eval_watch_active_share(const struct si_eval_watch *w);
void si_eval_watch_free(struct si_eval_watch *w);

/* Elements of the predictor tensors (blk.N.fc1, fc2), and of all the others. */
int64_t si_eval_predictor_params(const struct si_model *m);
int64_t si_eval_model_params(const struct si_model *m);

/* Bytes of the predictor tensors in the file. */
uint64_t si_eval_predictor_bytes(const struct si_model *m);

/*
 * The rule and thresholds the predictors were trained on, stored by
 * `starinfer train-predictor` (starinfer.predictor.active_rule,
 * active_threshold): a new (n_layer) array, or NULL with SI_E_NOT_FOUND when
 * the file has none (SI_E_FORMAT when malformed).  *target gets the stored
 * target sparsity.
 */
int si_eval_stored_thresholds(const struct si_model *m, enum si_active_rule *rule, float **out,
                              double *target, char *err, size_t err_size);

#endif /* SI_PREDICT_EVAL_H */
