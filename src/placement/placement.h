/*
 * placement.h - which FFN neurons go to the GPU, made from a profile and a
 * VRAM budget, and stored as PowerInfer's GPU index file.
 *
 * File format: PowerInfer's gpuidx, as its powerinfer-py exporter writes it:
 * GGUF version 3 under the magic "PWRI", tensor types numbered as
 * PowerInfer's ggml numbers them (I32 is 18: model/types.h), and
 *
 *   general.architecture   STRING "generic.gpu_index"
 *   split.vram_capacity    UINT64 the VRAM budget the placement was made for
 *   blk.N.gpu_idx          I32 {n_ff}: 1 for a neuron on the GPU, else 0
 *   blk.N.gpu_bucket       I32 {k}: the k GPU neurons' ids, increasing
 *
 * for N in [0, n_layer), plus starinfer's own keys (absent from PowerInfer's
 * files, which are read all the same):
 *
 *   starinfer.placement.policy           STRING "ilp", "hottest", "random"
 *   starinfer.placement.sparsity         STRING the engine mode it was sized for
 *   starinfer.placement.outcome          STRING the solver's (ilp.h)
 *   starinfer.placement.objective        FLOAT64 sum of the GPU neurons' activation
 *                                        frequencies (expected GPU neurons per token)
 *   starinfer.placement.bound            FLOAT64 an upper bound of the optimum
 *   starinfer.placement.gap              FLOAT64 (bound - objective) / bound
 *   starinfer.placement.solve_seconds    FLOAT64
 *   starinfer.placement.reserve_bytes    UINT64 what the engine puts on the GPU
 *                                        besides neurons (si_engine_gpu_reserve)
 *   starinfer.placement.neuron_bytes     UINT64 M_l: GPU bytes of one neuron
 *   starinfer.placement.batch            UINT32 neurons per ILP batch
 *   starinfer.placement.c_min            INT64 array [n_layer]: C_l (INT64_MAX:
 *                                        the layer may not use the GPU)
 *   starinfer.placement.hw.<field>       FLOAT64 the hardware model (hwmodel.h:
 *                                        cpu_bw, gpu_bw, h2d_bw in bytes/s,
 *                                        h2d_lat, t_sync in s)
 *   starinfer.placement.hw.<field>.source STRING "measured", "assumed", "given"
 *   starinfer.placement.hw.threads       UINT32 CPU threads of the bandwidth probe
 *   starinfer.placement.hw.gpu           STRING the GPU's name ("" without one)
 *
 * PowerInfer reads the tensors by position, gpu_idx and gpu_bucket of layer
 * 0, then of layer 1, ..., and only files whose types it numbers (files of
 * starinfer before 2026-11-28, magic "GGUF" and I32 numbered 26, are read
 * here, not by PowerInfer).  Reading checks every layer's gpu_idx (I32,
 * values 0 or 1, shape {n_ff}, the same n_ff in every layer, layers
 * 0..n_layer-1 with no gap) and, when present, that gpu_bucket lists
 * exactly the neurons gpu_idx marks, in increasing order.
 */
#ifndef SI_PLACEMENT_PLACEMENT_H
#define SI_PLACEMENT_PLACEMENT_H

#include "placement/hwmodel.h"
#include "placement/ilp.h"
#include "placement/plan.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct si_model;
struct si_profile;

enum si_place_policy {
    SI_PLACE_ILP,     /* the ILP of ilp.h */
    SI_PLACE_HOTTEST, /* the most active neurons of the model, any layer, while they fit */
    SI_PLACE_RANDOM,  /* neurons in a random order while they fit */
    SI_PLACE_POLICY_COUNT
};

/* "ilp", "hottest", "random"; si_place_policy_parse: -1 for other names */
const char *si_place_policy_name(enum si_place_policy p);
int si_place_policy_parse(const char *name);

struct si_placement {
    int32_t n_layer, n_ff;
    uint8_t *gpu;           /* (n_layer, n_ff): 1 on the GPU */
    int64_t *n_gpu;         /* (n_layer) */
    uint64_t vram_capacity; /* split.vram_capacity */
    /* starinfer.placement.* (has_meta false for PowerInfer's files) */
    bool has_meta;
    char policy[16], sparsity[16], outcome[40];
    double objective, bound, gap, solve_seconds;
    int64_t reserve_bytes, neuron_bytes;
    int32_t batch;
    int64_t *c_min; /* (n_layer), NULL without meta */
    struct si_hwmodel hw;
};

/* An empty placement (every neuron on the CPU); SI_OK, SI_E_INVALID, SI_E_NOMEM. */
int si_placement_init(struct si_placement **out, int32_t n_layer, int32_t n_ff, char *err,
                      size_t err_size);
void si_placement_free(struct si_placement *p);

/* Bytes of neurons the placement puts on the GPU at neuron_bytes each. */
int64_t si_placement_gpu_neurons(const struct si_placement *p);

struct si_place_params {
    enum si_place_policy policy;
    int64_t vram_budget;           /* bytes, >= 0; 0: every neuron on the CPU */
    struct si_gpu_reserve reserve; /* si_engine_gpu_reserve() for the engine that will run it */
    struct si_hwmodel hw;
    const char *sparsity;          /* stored only */
    int32_t batch;                 /* ILP batch (64) */
    double time_limit;             /* ILP seconds (10) */
    double mip_gap;                /* ILP relative gap (1e-6) */
    bool chain_cuts;               /* ILP chain cuts (on) */
    int64_t cpu_capacity;          /* CPU bytes for neurons, < 0: no limit */
    uint64_t seed;                 /* random policy */
};

struct si_place_params si_place_default_params(void);

/*
 * Place the neurons of profile `prof` under pp.  The capacity for neurons is
 * vram_budget - reserve.total: SI_E_BUDGET naming both sizes when the budget
 * is positive and below the reserve.  The hardware model gives C_l for the
 * ILP (hwmodel.h).  SI_OK, SI_E_INVALID, SI_E_BUDGET, SI_E_NOMEM, SI_E_RUNTIME.
 * When the ILP stops at its time limit the placement says so in `outcome`
 * (the caller warns).
 */
int si_place(struct si_placement **out, const struct si_profile *prof,
             const struct si_place_params *pp, char *err, size_t err_size);

/* Write / read the file (see above).  Reading with m not NULL checks that
 * n_layer and n_ff are the model's (SI_E_INVALID naming both).  SI_E_FORMAT
 * for a malformed file, SI_E_NOT_FOUND / SI_E_IO for one that cannot be read. */
int si_placement_write(const struct si_placement *p, const char *path, char *err,
                       size_t err_size);
int si_placement_read(struct si_placement **out, const char *path, const struct si_model *m,
                      char *err, size_t err_size);

#endif /* SI_PLACEMENT_PLACEMENT_H */
