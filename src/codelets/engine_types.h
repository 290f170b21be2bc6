/*
 * engine_types.h - the engine's parameters, task kinds and statistics.
 *
 * They sit here, below both src/graph/ (which builds and submits the task
 * graph, graph/engine.h) and src/codelets/ (whose tasks read the parameters
 * and charge their time to a kind), so that neither folder includes the
 * other's headers in a circle.  The engine's API is graph/engine.h.
 */
#ifndef SI_CODELETS_ENGINE_TYPES_H
#define SI_CODELETS_ENGINE_TYPES_H

#include "model/forward.h"
#include "starinfer.h" /* enum si_prefill_mode */

#include <stdbool.h>
#include <stdint.h>

struct si_profile;
struct si_placement;
struct si_flash_store;

enum si_sparsity { SI_SPARSITY_DENSE, SI_SPARSITY_GATE, SI_SPARSITY_PREDICTOR };

/* "dense", "gate", "predictor" */
const char *si_sparsity_name(enum si_sparsity m);

struct si_engine_params {
    struct si_ref_params ref; /* context length and numerics, as the reference's */
    enum si_sparsity mode;
    float gate_threshold; /* gate mode, SiLU/GELU models: |act(gate)| must exceed it */
    int32_t n_slices;     /* cold FFN slices per layer; 0: one per CPU worker */
    int64_t vram_budget;  /* bytes the engine may allocate on the GPU, reserve
                           * included (si_engine_gpu_reserve); 0: none, or the
                           * placement's vram_capacity when there is one */
    const struct si_profile *profile; /* expected activity (may be NULL); must
                                       * outlive si_engine_init only */
    const struct si_placement *placement; /* per layer, the neurons for the GPU
                                           * (may be NULL: the greedy rule); must
                                           * outlive si_engine_init only */
    int32_t attn_gpu;                     /* layers whose attention runs on the GPU (the first
                                           * ones; graph/attn_gpu.c): 0 as many as pay under the
                                           * VRAM budget, -1 none, N the first N (or all) */
    bool hot_on_cpu;                      /* testing: place the hot slice and the GPU's attention
                                           * layers as with a GPU, but run them on CPU workers (no
                                           * CUDA worker needed) */
    bool gpu_twin;                        /* testing, with hot_on_cpu: the tasks a GPU would
                                           * run (the attention of its layers, codelets/attn.c;
                                           * the hot FFN slice, decoding and prompt batches,
                                           * si__ffn_gpu_token in codelets/ffn.c) run the GPU's
                                           * steps with the CPU twins of its kernels instead of
                                           * the reference's, on the CPU worker in its stead */
    bool redux;      /* the slices add into the layer output through
                      * STARPU_REDUX instead of the merge task adding their
                      * partial outputs (see docs/measurements.md); gate and
                      * predictor modes (dense mode has no partial sums) */
    int32_t n_batch; /* prefill: tokens per batch of si_engine_eval_batch
                      * (0: 128; 1: no batches, token by token) */
    int32_t attn_split; /* decoding: attention in this many tasks (attn_L.j:
                         * whole kv heads each, so at most n_head_kv of
                         * them; attn_o_L.j: row slices of Wo); 0: one
                         * per CPU worker when the layer's attention weights
                         * are worth it (see docs/measurements.md), 1: one
                         * attn task per layer */
    enum si_prefill_mode prefill; /* the batches' arithmetic (starinfer.h):
                                   * auto, the reference's (exact), converted
                                   * inputs through the batched integer kernel
                                   * (int8; SI_E_UNSUPPORTED without AVX-512
                                   * VNNI) or float ones through OpenBLAS (blas);
                                   * codelets/prefill.c's arith_of */
    bool step_int8;     /* si_engine_eval_multi's steps through the batched
                         * integer kernels where the CPU and type have them
                         * (else the reference's dots), every token alike:
                         * several tokens for less than their cost alone,
                         * each token's results independent of the step's
                         * others but not decoding's bits (false: decoding's
                         * arithmetic for every request under 8 tokens) */

    /* The flash tier (gate and predictor modes; see "Flash tier" above). */
    struct si_flash_store *flash; /* the cold neurons' store (may be NULL: every
                                   * neuron in DRAM); must outlive the engine */
    int64_t dram_budget;  /* flash: host bytes for everything resident (see
                           * si_engine_stats.dram_resident); the caches get
                           * what the resident part leaves */
    int64_t flash_cache;  /* flash: records per layer cache, overriding the
                           * budget's share (0: from dram_budget) */
    int32_t flash_window; /* flash: tokens whose active neurons stay cached
                           * (k; 0: none, every active neuron read each token) */
    float flash_pin;      /* flash: share of each cache pinned to its first cold
                           * positions (the hottest with a profile), never
                           * evicted; 0: none */
    bool model_in_memory; /* the model file was read, not mapped: all of it
                           * counts as resident */

    /* A layer pipeline across the StarPU-MPI ranks (graph/pipe.c; the
     * runtime started with si_runtime_set_mpi): this rank computes its
     * share of the layers (si_engine_pipe_range), receives the residual
     * from the rank before and sends it to the one after; the last rank's
     * logits go to rank 0.  CPU workers, in memory; prefill token by token. */
    bool pipe;
};

struct si_engine_params si_engine_default_params(void);

/* Task kinds, as named in traces. */
enum si_task_kind {
    SI_TASK_EMBED,
    SI_TASK_ATTN,
    SI_TASK_ATTN_PROJ, /* attn_o */
    SI_TASK_PRED,
    SI_TASK_FFN_HOT,
    SI_TASK_FFN_COLD,
    SI_TASK_MERGE,
    SI_TASK_HEAD,
    SI_TASK_LOAD, /* flash: a layer's cache update and reads */
    SI_TASK_FFN_DOWN, /* dense mode: the down projection's row blocks */
    SI_TASK_PREFILL_EMBED, /* the batch tasks of si_engine_eval_batch, from here on */
    SI_TASK_PREFILL_ATTN,
    SI_TASK_PREFILL_FFN,
    SI_TASK_PREFILL_MERGE,
    SI_TASK_PREFILL_HEAD,
    SI_TASK_PREFILL_FFN_DOWN,
    SI_TASK_KIND_COUNT
};

/* "embed", "attn", "attn_proj", "pred", "ffn_hot", "ffn_cold", "merge", "norm+lm_head",
 * "load", "ffn_down", "embed_batch", "attn_batch", "ffn_batch", "merge_batch",
 * "head_batch", "ffn_down_batch" */
const char *si_task_kind_name(enum si_task_kind k);

/* Totals since init. */
struct si_engine_stats {
    int64_t tokens;         /* evaluated one by one */
    int64_t batch_tokens;   /* evaluated in batches */
    double batch_seconds;   /* wall time inside si_engine_eval_batch */
    int64_t steps;          /* si_engine_eval_multi's steps */
    int64_t step_tokens;    /* their tokens */
    int64_t step_seqs;      /* their sequences, summed over steps */
    double step_seconds;    /* wall time inside them */
    int64_t tasks;          /* submitted for single tokens */
    int64_t batch_tasks;    /* submitted for batches */
    int64_t neurons_hot;    /* FFN neurons computed in hot slices (dense mode: all;
                             * sparse modes: those with a non-zero activation) */
    int64_t neurons_cold;   /* ... in cold slices */
    int64_t neurons_total;  /* FFN neurons that exist, summed over layers and tokens */
    double seconds;         /* wall time inside si_engine_eval */
    double submit_seconds;  /* ... of it submitting the token's tasks (the graph's
                             * cost on the calling thread; the workers may run
                             * tasks meanwhile) */
    double submit_cpu_seconds; /* the calling thread's CPU time in it (without
                                * the time it waited for a core) */
    /* Time spent inside the tasks' functions, by kind, summed over workers
     * (for CUDA tasks: the time to queue their kernels); the rest of
     * seconds x workers is scheduling, submission and idling. */
    double task_seconds[SI_TASK_KIND_COUNT];
    int64_t task_count[SI_TASK_KIND_COUNT];
    /* The GPU's bytes: the budget in force (0: no hot slices), the bytes of
     * the handles the engine lets onto the CUDA node (reserve + hot neurons;
     * computed with hot_on_cpu too), and the most StarPU had allocated on
     * that node after an evaluation, less what it held before init (-1
     * without a CUDA worker). */
    int64_t gpu_budget;
    int64_t gpu_accounted;
    int64_t gpu_allocated_peak;
    int64_t packed_bytes; /* weights packed 8 rows at a time (graph/weights.c) */
    /* The flash tier (zeros without one): host bytes resident besides the
     * caches (the model's tensors other than the FFN's, KV cache, hot
     * records, gating rows, predictor copies, per-layer buffers), the
     * caches' bytes and records per layer (the smallest), and, summed over
     * tokens and layers: neurons read and found cached, bytes and read
     * requests, the wall time the load tasks waited for reads, and their
     * time in cache bookkeeping (deletes, moves, appends, lists). */
    int64_t dram_resident;
    int64_t flash_cache_bytes;
    int64_t flash_cache_records;
    int64_t flash_pinned; /* flash: records pinned (all layers) */
    bool flash_overlap;   /* flash: reads on the reader thread, beside compute */
    int64_t flash_loads, flash_hits, flash_bytes, flash_reads;
    double flash_io_seconds, flash_manage_seconds;
    /* Bytes of weights the single-token evaluations read, summed over them:
     * from host memory (attention, norms, the LM head, one embedding row,
     * predictors, gating rows and the rows of the neurons each CPU slice
     * computed) and from GPU memory (hot slices, whole).  A dense pass reads
     * si_model_token_bytes() per token. */
    int64_t weight_bytes_cpu, weight_bytes_gpu;
    int32_t attn_gpu_layers; /* layers whose attention runs on the GPU */
};

#endif /* SI_CODELETS_ENGINE_TYPES_H */
