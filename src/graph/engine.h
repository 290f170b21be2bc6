/*
 * engine.h - decode steps as a StarPU task graph over FFN neuron slices.
 *
 * Per token the engine submits, and StarPU orders through the data handles:
 *
 *   embed                  x (W)
 *   per layer L:
 *     attn_L               x (RW), [part_L-1.* (R)], ffn_in (W), K_L V_L (RW),
 *                          Wq Wk Wv Wo (R): the previous layer's FFN added into
 *                          x, attention, residual, the FFN's normalised input;
 *                          or, split over the CPU workers (attn_split):
 *       attn_L.j           x, [part_L-1.* (R)], Wq Wk Wv (R), K_L.j V_L.j (RW)
 *                          -> att_j (W): the previous layer's FFN added into x
 *                          (by each task alike; attn_L.0 keeps it in x2), then
 *                          kv-head group j: its rows of q, k, v, RoPE, its
 *                          columns of the cache, its heads' attention
 *       attn_o_L.j         att_*, Wo (R) -> o_j (W): row slice j of the projection
 *       attn_out_L         x2, o_* (R) -> x, ffn_in (W): residual, FFN input
 *     pred_L               ffn_in, fc1, fc2 (R) -> idx_L.j (W)     predictor mode:
 *                          each slice's list of predicted-active positions
 *     ffn_hot_L            ffn_in, hot slice, [idx_L.0] (R) -> part_L.0 (W)
 *     ffn_cold_L.j         ffn_in, cold slice j, [idx_L.j] (R) -> part_L.j (W)
 *     ffn_down_L.k         dense mode: part_L.* (R: the activations), rows
 *                          block k of ffn_down (R) -> down_k (W): outputs
 *                          [dn_k, dn_k+1), each one dot over all the neurons;
 *                          down_* then stand for part_L.* below
 *   norm+lm_head           x (RW), part_last.* (R) -> logits (W); or, split,
 *   lm_head.j              x, part_last.* (R) -> rows j of the logits (W)
 *
 * A layer's FFN output is merged by whoever reads it next: the slices'
 * partial outputs added in slice order (dense: the blocks side by side),
 * post-norm, residual, by the next
 * layer's attention tasks (each computes the same bits) or the head.  There
 * is no merge task per layer, which saves a serial step and a dependency per
 * layer; with --merge redux (STARPU_REDUX) a merge_L task remains.
 *
 * The FFN neurons of a layer sit in slices: an optional hot slice (the GPU's,
 * positions [0, n_hot)) then cold slices for the CPU workers.  Each slice is
 * a child handle (StarPU partitioning) of its layer's weight handles; the hot
 * ones are prefetched to the GPU once and stay there.  Each slice task
 * writes its own partial output: nothing is accumulated without ownership.
 *
 * Layouts.
 *  - dense mode: the file's own tensors, neurons in file order, slices of
 *    whole units of 256 neurons (where the FFN width allows).  A slice's
 *    output is its neurons' activations; the down projection then runs in
 *    blocks of output rows, each output one dot over all the neurons, as
 *    the reference (and llama.cpp) computes it: the engine computes exactly
 *    what the reference computes, bit for bit on CPU workers.  Redux
 *    merging does not apply (there is nothing to add).
 *  - gate and predictor modes: a neuron-major copy made at init.  Neurons
 *    are permuted by expected activity (a profile): the hottest fill the hot
 *    slice, the others are dealt to the cold slices in turn so that each
 *    gets the same number of neurons and about the same expected active
 *    count.  A neuron's record holds its gate row, up row and down_t row
 *    (the down projection transposed: the file's ffn_down_t when it has one,
 *    else made from ffn_down, exactly for F32/F16 and rounded to F16 for
 *    quantized types), so a slice is one contiguous range of records.  A
 *    neuron table maps positions back to the file's neuron ids, and the
 *    predictor's fc2 rows are permuted the same way.  Without a profile the
 *    file order is kept.
 *
 * Sparsity modes.  dense: every neuron.  gate: the gate is computed densely,
 * a neuron whose activation is 0 (ReLU) or at most gate_threshold in
 * magnitude (SiLU, GELU) is skipped: exact for ReLU models.  predictor: the
 * file's predictor (PowerInfer's fc1, ReLU, fc2 >= threshold) picks the
 * neurons.  The reference computes the same with si_ref_params down_t,
 * gate_threshold and predictor.
 *
 * Placement.  Without a CUDA worker every slice is cold.  With one (or
 * hot_on_cpu), the hot slice of layer l holds exactly the neurons that
 * `placement` puts on the GPU (src/placement/, gate and predictor modes),
 * or, without a placement, the hottest neurons (by profile) whose bytes fit
 * the budget.  Attention, the predictor and the merge run on CPU workers.
 * StarPU must be started (si_runtime_start) before si_engine_init.
 *
 * Flash tier ("LLM in a flash").  With a store (params.flash), the cold
 * neurons of the sparse layouts are not copied at init: each layer has a
 * preallocated cache (flash/cache.h) of the records of the neurons active
 * in the last flash_window tokens, and per token a load_L task, submitted
 * after the layer's mask (pred_L, or gmask_L.j tasks computing gate mode's
 * gating rows, which stay resident) and before its ffn_cold_L.j tasks,
 * updates the cache and reads the missing records with the store's reader
 * threads (parallel preads, O_DIRECT).  The ffn_cold tasks then compute
 * from the cache's slots in the same order as the all-in-DRAM engine, so
 * the outputs are equal bit for bit.  Hot records, gating rows, biases and
 * predictors stay in DRAM; the model's FFN tensors are never read.  Prefill
 * runs token by token (a dense batch would read every neuron).
 *
 * The VRAM budget is honest: si_engine_gpu_reserve() itemizes what the
 * engine puts on the GPU besides the hot neurons (the same function tells
 * `starinfer place` what to leave free), init refuses with SI_E_BUDGET a
 * budget below that reserve or a placement whose neurons do not fit what is
 * left, the engine adds up the bytes of every handle it lets onto the CUDA
 * node (si_engine_stats.gpu_accounted, also with hot_on_cpu), and with a
 * CUDA worker it reads what StarPU has allocated on that node after every
 * evaluation (gpu_allocated_peak); an evaluation after which that exceeds
 * the budget fails with SI_E_BUDGET.
 */
#ifndef SI_GRAPH_ENGINE_H
#define SI_GRAPH_ENGINE_H

#include "model/forward.h"
#include "model/model.h"

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
    bool hot_on_cpu; /* testing: place the hot slice as with a GPU, but run
                      * it on a CPU worker (no CUDA worker needed) */
    bool redux;      /* the slices add into the layer output through
                      * STARPU_REDUX instead of the merge task adding their
                      * partial outputs (see docs/measurements.md); gate and
                      * predictor modes (dense mode has no partial sums) */
    int32_t n_batch; /* prefill: tokens per batch of si_engine_eval_batch
                      * (0: 32; 1: no batches, token by token) */
    int32_t attn_split; /* decoding: attention in this many tasks (attn_L.j:
                         * whole kv heads each, so at most n_head_kv of
                         * them; attn_o_L.j: row slices of Wo); 0: one
                         * per CPU worker when the layer's attention weights
                         * are worth it (see docs/measurements.md), 1: one
                         * attn task per layer */
    bool exact_prefill; /* prefill with the reference's arithmetic (activations
                         * converted as llama.cpp does), bit for bit the
                         * token-by-token result, instead of OpenBLAS sgemm on
                         * float activations (about 10x faster: see README) */

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
    bool model_in_memory; /* the model file was read, not mapped: all of it
                           * counts as resident */
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
    int64_t tasks;          /* submitted for single tokens */
    int64_t batch_tasks;    /* submitted for batches */
    int64_t neurons_hot;    /* FFN neurons computed in hot slices (dense mode: all;
                             * sparse modes: those with a non-zero activation) */
    int64_t neurons_cold;   /* ... in cold slices */
    int64_t neurons_total;  /* FFN neurons that exist, summed over layers and tokens */
    double seconds;         /* wall time inside si_engine_eval */
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
    int64_t flash_loads, flash_hits, flash_bytes, flash_reads;
    double flash_io_seconds, flash_manage_seconds;
    /* Bytes of weights the single-token evaluations read, summed over them:
     * from host memory (attention, norms, the LM head, one embedding row,
     * predictors, gating rows and the rows of the neurons each CPU slice
     * computed) and from GPU memory (hot slices, whole).  A dense pass reads
     * si_model_token_bytes() per token. */
    int64_t weight_bytes_cpu, weight_bytes_gpu;
};

/* What the engine puts on the GPU besides the hot FFN neurons. */
enum si_gpu_item {
    SI_GPU_ATTENTION, /* attention weights */
    SI_GPU_PREDICTOR, /* predictor weights */
    SI_GPU_KV_CACHE,
    SI_GPU_LM_HEAD,   /* output norm and LM head */
    SI_GPU_BUFFERS,   /* FFN input, index list, each layer's hot partial output */
    SI_GPU_WORKSPACE, /* the CUDA FFN task's scratch */
    SI_GPU_ITEM_COUNT
};

/* "attention", "predictor", "kv cache", "lm_head", "buffers", "workspace" */
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

/*
 * The reserve of the engine that params p would build on model m: the one
 * function both the engine and `starinfer place` use.  SI_OK, or the
 * engine's own refusals of p (SI_E_INVALID, SI_E_UNSUPPORTED).
 */
int si_engine_gpu_reserve(const struct si_model *m, const struct si_engine_params *p,
                          struct si_gpu_reserve *r, char *err, size_t err_size);

struct si_engine;

int si_engine_init(struct si_engine **out, const struct si_model *m, struct si_engine_params p,
                   char *err, size_t err_size);
void si_engine_free(struct si_engine *e);

/* Evaluate `token` at the next position; SI_OK, SI_E_INVALID (token outside
 * the vocabulary), SI_E_BUDGET (context full, or StarPU's allocations on the
 * GPU over the VRAM budget after it: see gpu_allocated_peak) or SI_E_RUNTIME. */
int si_engine_eval(struct si_engine *e, int32_t token);

/*
 * Prefill: evaluate tokens[0..n) at the next positions, n_batch at a time,
 * each batch as one task graph whose FFN slices run GEMM codelets (dense:
 * every neuron, all modes; gate mode still drops the neurons under its
 * threshold) and whose attention task runs the tokens in order.  Logits are
 * those of the last token.  Numerics: batches of 8 tokens or more multiply
 * dequantized weights with float activations (OpenBLAS), so logits differ
 * from token-by-token evaluation by rounding, unless exact_prefill (or
 * act_quant off, where both are float).  SI_OK, SI_E_INVALID (a token outside the vocabulary, n < 1),
 * SI_E_BUDGET (the context cannot hold them: nothing is evaluated) or
 * SI_E_RUNTIME.
 */
int si_engine_eval_batch(struct si_engine *e, const int32_t *tokens, int32_t n);

/* The logits of the last evaluated token (n_vocab). */
const float *si_engine_logits(const struct si_engine *e);

/* Forget the context (start a new sequence). */
void si_engine_reset(struct si_engine *e);

/* The reference state the engine's attention runs on (for its attn_f32 switch). */
struct si_ref *si_engine_ref(struct si_engine *e);

struct si_engine_stats si_engine_get_stats(const struct si_engine *e);

/* The flash tier's message for the last evaluation that failed in a load
 * (SI_E_BUDGET: a layer's active neurons exceed its cache; SI_E_IO), or "". */
const char *si_engine_flash_error(const struct si_engine *e);

/* Cold slices per layer actually used. */
int32_t si_engine_n_slices(const struct si_engine *e);

/* Layer l's neurons in the hot slice (0 without one). */
int64_t si_engine_n_hot(const struct si_engine *e, int l);

/* The file's id of the neuron at position pos of layer l (the neuron table). */
int32_t si_engine_neuron_id(const struct si_engine *e, int l, int64_t pos);

/* Neuron positions [*begin, *end) of layer l's slice j (j = 0 is the hot
 * slice, possibly empty; cold slices are 1..n_slices). */
void si_engine_slice_range(const struct si_engine *e, int l, int32_t j, int64_t *begin,
                           int64_t *end);

/* Gate mode's threshold of layer l (see gate_threshold). */
float si_engine_gate_threshold(const struct si_engine *e, int l);

/* Bytes of FFN weights placed in hot slices (what the budget paid for). */
int64_t si_engine_hot_bytes(const struct si_engine *e);

#endif /* SI_GRAPH_ENGINE_H */
