/*
 * pwri.h - PowerInfer's layout: the tensor set its loader accepts, written
 * from a starinfer model (convert --powerinfer, train-predictor
 * --powerinfer).
 *
 * PowerInfer's loader looks every tensor of a file up among the ones it
 * makes and refuses a file with any other (docs/powerinfer.md).  Its files
 * carry the down projection as ffn_down_t alone (a row per neuron), OPT's
 * down bias named after it (blk.N.ffn_down_t.bias), and its sparse down
 * kernel reads ffn_down_t as Q4_0 or F16 (any other type as F16).  Keys it
 * does not know it ignores: starinfer keeps its own there.
 */
#ifndef SI_MODEL_PWRI_H
#define SI_MODEL_PWRI_H

#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The name tensor `name` (n bytes) of a starinfer file has in PowerInfer's
 * layout, into out (out_size bytes): the same, but OPT's down bias; false
 * for the tensors PowerInfer does not make, which its loader refuses:
 * ffn_down (ffn_down_t is the down projection there), the planted
 * probabilities of synthetic models, input sparsity's transposed copies,
 * and names that do not fit out. */
bool si_pwri_name(const char *name, size_t n, char *out, size_t out_size);

/* The type of ffn_down_t in PowerInfer's layout for a down projection of
 * type t: Q4_0 stays, every other becomes F16 (what its kernel reads). */
uint32_t si_pwri_down_t_type(uint32_t t);

/* Layer l's ffn_down_t in PowerInfer's layout while a file is written
 * (gguf_write.h's fill callbacks): the model's own rows where their type
 * is one PowerInfer reads, else its rows re-encoded, else ffn_down
 * transposed. */
struct si_pwri_down {
    const struct si_tensor *dt; /* the model's ffn_down_t, or NULL */
    const struct si_tensor *dn; /* else its ffn_down */
    uint32_t type;              /* si_pwri_down_t_type's */
    float *t;                   /* ffn_down transposed, in floats (n_ff x n_embd) */
    float *row;                 /* a row in floats (n_embd) */
};
int si_pwri_down_init(struct si_pwri_down *d, const struct si_model *m, int l);
int si_pwri_down_fill(void *user, int64_t row0, int64_t n_rows, void *dst);
void si_pwri_down_release(struct si_pwri_down *d);

/*
 * Write m to path in PowerInfer's layout: the "PWRI" magic, every key of
 * m's file (and starinfer.ffn_activation where PowerInfer's default for the
 * architecture, ReLU, is not m's), every tensor si_pwri_name keeps, and
 * ffn_down_t (si_pwri_down).  m needs predictors reading the residual
 * (model.h's SI_PRED_RESIDUAL, what PowerInfer gives them): SI_E_INVALID
 * with one line otherwise.  SI_OK, or a negative si_status with one line in
 * err; nothing written on failure.
 */
int si_pwri_write(const struct si_model *m, const char *path, char *err, size_t err_size);

#endif /* SI_MODEL_PWRI_H */
