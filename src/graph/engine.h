/*
 * engine.h - one decode step as a StarPU task graph.
 *
 * Per token the engine submits, with StarPU tracking the dependencies
 * through data handles on the activations:
 *
 *   embed                        x (W)
 *   per layer L:
 *     attn L                     x (RW), xb (W)      attention, FFN input in xb
 *     ffn L.j   j < n_slices     xb (R), part_j (W)  neurons of slice j: their
 *                                                    activations and their share
 *                                                    of the down projection
 *     merge L                    part_* (R), x (RW)  sum of the slices' partial
 *                                                    outputs, post-norm, residual
 *   head                         x (R), logits (W)
 *
 * Each FFN slice task writes its own partial output; only the merge task adds
 * them, in slice order.  Slices are contiguous neuron ranges made of whole
 * quantization blocks of the down projection, so the partial dot products are
 * the reference's own blocks: in `dense` mode the engine computes what the
 * reference forward pass computes, up to the order of the final additions.
 * In `gate` mode the gate is computed densely and a neuron whose activation is
 * zero (ReLU) or below the threshold in magnitude (SiLU, GELU) is skipped:
 * exact for ReLU models.
 *
 * This first engine runs on CPU workers; the hot slices on CUDA workers come
 * with the GPU codelets.  StarPU must be started (si_runtime_start) first.
 */
#ifndef SI_GRAPH_ENGINE_H
#define SI_GRAPH_ENGINE_H

#include "model/forward.h"
#include "model/model.h"

#include <stdbool.h>
#include <stdint.h>

enum si_sparsity { SI_SPARSITY_DENSE, SI_SPARSITY_GATE };

struct si_engine_params {
    struct si_ref_params ref; /* context length and numerics, as the reference's */
    enum si_sparsity mode;
    float gate_threshold; /* gate mode, non-ReLU models: |act(gate)| must exceed it */
    int32_t n_slices;     /* FFN slices per layer; 0: one per CPU worker */
};

struct si_engine_params si_engine_default_params(void);

/* Task kinds, as named in traces. */
enum si_task_kind {
    SI_TASK_EMBED,
    SI_TASK_ATTN,
    SI_TASK_FFN,
    SI_TASK_MERGE,
    SI_TASK_HEAD,
    SI_TASK_KIND_COUNT
};

/* "embed", "attn", "ffn_cold", "merge", "norm+lm_head" */
const char *si_task_kind_name(enum si_task_kind k);

/* Totals since init. */
struct si_engine_stats {
    int64_t tokens;
    int64_t tasks;
    int64_t neurons_active; /* FFN neurons computed, summed over layers and tokens */
    int64_t neurons_total;  /* FFN neurons that exist, likewise */
    double seconds;         /* wall time inside si_engine_eval */
    /* Time spent inside the tasks' functions, by kind, summed over workers;
     * the rest of seconds x workers is scheduling, submission and idling. */
    double task_seconds[SI_TASK_KIND_COUNT];
    int64_t task_count[SI_TASK_KIND_COUNT];
};

struct si_engine;

int si_engine_init(struct si_engine **out, const struct si_model *m, struct si_engine_params p,
                   char *err, size_t err_size);
void si_engine_free(struct si_engine *e);

/* Evaluate `token` at the next position; SI_OK, SI_E_INVALID (token outside
 * the vocabulary), SI_E_BUDGET (context full) or SI_E_RUNTIME. */
int si_engine_eval(struct si_engine *e, int32_t token);

/* The logits of the last evaluated token (n_vocab). */
const float *si_engine_logits(const struct si_engine *e);

/* Forget the context (start a new sequence). */
void si_engine_reset(struct si_engine *e);

/* The reference state the engine's attention runs on (for its attn_f32 switch). */
struct si_ref *si_engine_ref(struct si_engine *e);

struct si_engine_stats si_engine_get_stats(const struct si_engine *e);

/* Slices per layer actually used. */
int32_t si_engine_n_slices(const struct si_engine *e);

#endif /* SI_GRAPH_ENGINE_H */
