/*
 * ilp.h - PowerInfer's neuron placement ILP (paper, section 6.3), solved with
 * lp_solve 5.5.
 *
 * The neurons of each layer l are sorted by impact v_i (activation frequency
 * from a profile), most active first, and cut into batches of `batch` (64)
 * neurons; the last batch of a layer may be smaller.  Batch b has impact v_b
 * (the sum of its neurons'), n_b neurons and n_b * M_l bytes on the GPU.
 * Variables: x_b in {0, 1} (1: batch b on the GPU) and y_l in {0, 1} (layer l
 * has GPU neurons).
 *
 *   maximise  sum_b v_b x_b                                         (2)
 *   s.t.      a_bGPU + a_bCPU = 1 for every batch                   (3)
 *             sum_b n_b M_l x_b <= capacity           (GPU)          (4)
 *             sum_b n_b M_l (1 - x_b) <= cpu_capacity (CPU, if set)  (4)
 *             sum_{b in l} n_b x_b >= C_l y_l         for every l    (5)
 *             sum_{b in l} n_b x_b <= K y_l           for every l    (6)
 *             y_l in {0, 1}, x_b in {0, 1}                           (7, 8)
 *
 * (3) is kept by construction: a_bGPU = x_b and a_bCPU = 1 - x_b, so each
 * batch has exactly one binary.  K = n_ff is the big constant of (6): a layer
 * without GPU neurons has y_l = 0, and then (5) is void; with y_l = 1 it holds
 * at least C_l of them.  C_l (from the hardware model) is the least number of
 * neurons whose GPU time saving pays for one synchronisation; c_min[l] > n_ff
 * forbids the layer the GPU.
 *
 * Chain cuts (chain_cuts): within a layer the full batches have equal sizes
 * and decreasing impacts, so x_{b+1} <= x_b.  They remove no optimum: given
 * an optimal solution that takes full batch b+1 and not full batch b of the
 * same layer, swapping the two keeps every constraint (same bytes, same
 * count in the layer) and does not lower the objective (v_b >= v_{b+1}), so
 * repeating the swap gives an optimal solution that satisfies every cut.
 * (The smaller last batch of a layer takes no cut.)  Tests compare with
 * exhaustive search, with and without the cuts.
 *
 * Linking cuts (with the chain cuts): x_first <= y_l (and for the smaller
 * last batch), and x_k >= y_l for the batch k that completes C_l neurons,
 * unless the smaller last batch could complete them instead.  Valid for the
 * prefix solutions the chain cuts keep; they make a layer's first k batches
 * one block in the LP relaxation.  The capacity rows are divided by the
 * greatest common divisor of the batches' bytes and rounded down.
 *
 * lp_solve starts from the greedy placement's basis (IMPROVE_DUALFEAS off,
 * which would flip it away) and runs with a time limit (whole seconds, at
 * least 1), depth first, ceiling branch first.  If the limit passes, its best
 * incumbent is used, or the greedy placement when that is better or there is
 * none (outcome SI_ILP_GREEDY).  The result is checked against every
 * constraint in integer bytes before it is used.  `bound` is the layers'
 * concave envelope (see ilp.c, hull_bound), or objective x (1 + mip_gap) when
 * lp_solve proved optimality; `gap` = (bound - objective) / bound.
 */
#ifndef SI_PLACEMENT_ILP_H
#define SI_PLACEMENT_ILP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct si_ilp_problem {
    int32_t n_layer, n_ff;
    const double *impact;        /* (n_layer, n_ff) v_i, >= 0 */
    const int64_t *neuron_bytes; /* (n_layer) M_l: GPU bytes of one neuron of layer l, > 0 */
    const int64_t *c_min;        /* (n_layer) C_l >= 1; > n_ff: no GPU neurons in layer l */
    int64_t capacity;            /* GPU bytes for neurons, >= 0 */
    int64_t cpu_capacity;        /* CPU bytes for neurons; < 0: no limit */
    int32_t batch;               /* neurons per batch, >= 1 (the paper: 64) */
    double time_limit;           /* seconds, > 0, for the whole solve (lp_solve gets what
                                  * the set-up leaves, in whole seconds, at least 1) */
    double mip_gap;              /* relative gap at which lp_solve may stop, >= 0 */
    bool chain_cuts;             /* add x_{b+1} <= x_b (see above) */
};

/* Defaults: batch 64, time limit 10 s, mip_gap 1e-6, chain cuts on, no CPU limit. */
struct si_ilp_problem si_ilp_default_problem(void);

enum si_ilp_outcome {
    SI_ILP_OPTIMAL,   /* lp_solve proved it (within mip_gap), or a trivial instance */
    SI_ILP_INCUMBENT, /* time limit: lp_solve's best solution so far */
    SI_ILP_GREEDY,    /* time limit without a solution: the greedy placement */
    SI_ILP_OUTCOME_COUNT
};

/* "optimal", "time limit: best incumbent", "time limit: greedy" */
const char *si_ilp_outcome_name(enum si_ilp_outcome o);

struct si_ilp_result {
    uint8_t *gpu;          /* (n_layer, n_ff) 1: neuron on the GPU */
    int64_t *n_gpu;        /* (n_layer) GPU neurons per layer */
    int64_t gpu_bytes;     /* sum of the GPU neurons' bytes */
    double objective;      /* sum of the GPU neurons' impacts */
    double bound;          /* an upper bound of the optimum */
    double gap;            /* (bound - objective) / bound, 0 when bound is 0 */
    double greedy_objective;
    double seconds;        /* wall time of the whole solve */
    enum si_ilp_outcome outcome;
    int64_t n_batches;     /* binaries x_b */
    int64_t n_rows;        /* constraints given to lp_solve (0: no solver run) */
    int64_t nodes;         /* branch-and-bound nodes */
};

/*
 * Solve; SI_OK, SI_E_INVALID (a bad field, named in err), SI_E_NOMEM,
 * SI_E_RUNTIME (lp_solve failed: numerical trouble, infeasible CPU limit).
 * On success r owns its arrays (si_ilp_result_free).
 */
int si_ilp_solve(const struct si_ilp_problem *p, struct si_ilp_result *r, char *err,
                 size_t err_size);

/*
 * The same batches, every assignment tried (tests): SI_E_INVALID when there
 * are more than 24 batches.  r->bound is the optimum.
 */
int si_ilp_exhaustive(const struct si_ilp_problem *p, struct si_ilp_result *r, char *err,
                      size_t err_size);

/*
 * The greedy placement: a layer without GPU batches offers its first batches
 * up to C_l neurons as one block, a layer with some its next batch; the offer
 * of most impact per byte that fits is taken, one that does not fit closes
 * its layer.  Keeps (4)-(6) except the CPU limit (SI_E_BUDGET when that is
 * broken); not optimal in general.
 */
int si_ilp_greedy(const struct si_ilp_problem *p, struct si_ilp_result *r, char *err,
                  size_t err_size);

void si_ilp_result_free(struct si_ilp_result *r);

#endif /* SI_PLACEMENT_ILP_H */
