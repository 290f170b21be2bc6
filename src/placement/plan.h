/*
 * plan.h - which FFN neurons of each layer go to the GPU, and how the rest
 * are dealt to the CPU's slices: the engine's neuron planning, and the
 * GPU reserve that both the engine and `starinfer place` budget with.
 *
 * The plan is the engine's first step at init (graph/engine.c): with a
 * placement (placement.h, the ILP's or PowerInfer's GPU index) exactly its
 * GPU neurons are hot; without one, the hottest neurons (by profile) while
 * the VRAM budget lasts.  The cold neurons are then dealt to the cold
 * slices in turn, hottest first, so that every slice gets the same number
 * of neurons and about the same expected activity.  Nothing here knows of
 * StarPU: the plan is a permutation and slice boundaries per layer.
 */
#ifndef SI_PLACEMENT_PLAN_H
#define SI_PLACEMENT_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct si_profile;
struct si_placement;

/* What the engine puts on the GPU besides the hot FFN neurons. */
enum si_gpu_item {
    SI_GPU_ATTENTION, /* attention weights */
    SI_GPU_PREDICTOR, /* predictor weights */
    SI_GPU_KV_CACHE,
    SI_GPU_LM_HEAD,   /* output norm and LM head */
    SI_GPU_BUFFERS,   /* FFN input, index list, each layer's hot partial output */
    SI_GPU_WORKSPACE, /* the CUDA FFN task's scratch */
    SI_GPU_ALLOCATOR, /* StarPU's allocation granularity: buffers under 4 MiB
                       * share 32 MiB chunks (graph/layout.c) */
    SI_GPU_ITEM_COUNT
};

/* "attention", "predictor", "kv cache", "lm_head", "buffers", "workspace",
 * "allocator" */
const char *si_gpu_item_name(enum si_gpu_item i);

struct si_gpu_reserve {
    int64_t bytes[SI_GPU_ITEM_COUNT]; /* on the GPU */
    int64_t cpu_bytes[SI_GPU_ITEM_COUNT]; /* kept on the CPU by this engine (0 on the GPU) */
    int64_t total;         /* sum of bytes[] */
    int64_t unit_bytes;    /* GPU bytes of one hot unit: a neuron (gate, predictor
                            * modes: its record, gating row, bias, index) or a
                            * unit of 256 neurons (dense: their gate and up rows,
                            * biases and activations) */
    int64_t unit_neurons;  /* neurons per unit: 1, or the dense unit */
    bool any_neurons;      /* any set of neurons can be hot (gate, predictor modes:
                            * the engine permutes them); dense mode keeps file order */
};

struct si_plan_params {
    int32_t n_layer;
    int64_t n_ff;
    int32_t n_slices;      /* cold slices per layer (at most; fewer when there are
                            * fewer neurons or units) */
    struct si_gpu_reserve reserve; /* unit_neurons 1 and any_neurons: neurons are
                                    * permuted; else slices of whole units, file order */
    bool gpu;              /* hot slices can be placed (a CUDA worker, or testing) */
    int64_t vram_budget;   /* 0: the placement's vram_capacity, if any */
    const struct si_profile *profile;     /* may be NULL */
    const struct si_placement *placement; /* may be NULL */
};

/* One layer's plan; perm (n_ff) and s0 (n_slices + 2) are the caller's. */
struct si_plan_layer {
    int64_t n_hot;  /* positions [0, n_hot) are the hot slice */
    int32_t nsl;    /* non-empty slices, the hot one first when n_hot > 0 */
    int64_t *s0;    /* (nsl + 1) slice boundaries, in positions */
    int32_t *perm;  /* position -> the file's neuron id */
};

/*
 * Plan every layer into layers[0 .. n_layer).  *gpu_budget gets the VRAM
 * budget in force (0 when no hot slice can be placed), *hot_bytes the GPU
 * bytes of the hot neurons.  SI_OK; SI_E_BUDGET when the budget is below
 * the reserve or the placement's neurons do not fit what it leaves;
 * SI_E_NOMEM.  The message names the sizes.
 */
int si_plan_neurons(const struct si_plan_params *p, struct si_plan_layer *layers,
                    int64_t *gpu_budget, int64_t *hot_bytes, char *err, size_t err_size);

#endif /* SI_PLACEMENT_PLAN_H */
