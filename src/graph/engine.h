/*
 * engine.h - decode steps as a StarPU task graph over FFN neuron slices.
 *
 * Where things are: the engine's state and lifecycle (graph/engine.c), each
 * mode's layout and the GPU reserve (graph/layout.c), its data handles
 * (graph/data.c), one token's submission (graph/decode.c), a batch's
 * (graph/prefill.c); the tasks are the codelets of src/codelets/
 * (codelets.h lists them; each codelet file describes its tasks' buffers,
 * codelets/task.h); the neuron plan is
 * placement/plan.h's, the flash tier's records and loads flash/tier.h's.
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
 *                          each slice's list of predicted-active positions;
 *                          lookahead predictors (model.h): x and the carried
 *                          FFN output (R) instead of ffn_in, submitted
 *                          before attn_L (with the flash tier's load_L), so
 *                          both run beside the attention
 *     ffn_hot_L            ffn_in, hot slice, [idx_L.0] (R) -> part_L.0 (W)
 *     ffn_cold_L.j         ffn_in, cold slice j, [idx_L.j] (R) -> part_L.j (W)
 *     ffn_down_L.k         dense mode: part_L.* (R: the activations), rows
 *                          block k of ffn_down (R) -> down_k (W): outputs
 *                          [dn_k, dn_k+1), each one dot over all the neurons;
 *                          down_* then stand for part_L.* below
 *   norm+lm_head           x (RW), part_last.* (R) -> logits (W); or, split,
 *   lm_head.j              x, part_last.* (R) -> rows j of the logits (W)
 *
 * A layer's FFN output is carried to whoever reads it next (the next
 * layer's first tasks, or the head), which adds it into its own copy of x
 * (codelets/task.h explains it): there is no merge task per layer, which
 * saves a serial step and a dependency per layer; with --merge redux
 * (STARPU_REDUX) a merge_L task remains.
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
 * the budget.  The attention of the first layers goes to the GPU too when
 * the budget pays for it (params.attn_gpu, graph/attn_gpu.c): their attn_L
 * is one task on the CUDA worker, its weights and KV cache kept there.  The
 * other layers' attention, the predictor and the merge run on CPU workers.
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
 * Input sparsity (TEAL; params.ref.input_thresholds): each task zeroes its
 * own copy of a product's input below the layer's threshold and, where the
 * model has the transposed copies (model/transpose.h, model/colblock.h),
 * reads only the non-zero inputs' rows over its column range; the rule is
 * the reference's (si_ref_reads_t), and so are the bits.  Prompt batches
 * stay dense.  docs/input-sparsity.md.
 *
 * Across MPI ranks (params.pipe, graph/pipe.c): each rank submits the tasks
 * of its layer range; x arrives from the rank before and leaves, after a
 * residual_L task, for the one after; the logits go to rank 0.
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

#include "codelets/engine_types.h" /* the parameters, task kinds and statistics */
#include "model/forward.h"
#include "model/model.h"
#include "placement/plan.h" /* the GPU reserve */
#include "predict/profile.h" /* struct si_ffn_runner */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The reserve of the engine that params p would build on model m: the one
 * function both the engine and `starinfer place` use.  SI_OK, or the
 * engine's own refusals of p (SI_E_INVALID, SI_E_UNSUPPORTED).
 */
int si_engine_gpu_reserve(const struct si_model *m, const struct si_engine_params *p,
                          struct si_gpu_reserve *r, char *err, size_t err_size);

struct si_engine;

/*
 * The layers [*l0, *l1) of rank `rank` of `nranks` in a pipeline over model
 * m (si_engine_params.pipe): contiguous ranges of about equal weight bytes,
 * the LM head counted on the last rank, at least one layer each.  SI_OK, or
 * SI_E_INVALID (more ranks than layers, a rank out of range).
 */
int si_engine_pipe_range(const struct si_model *m, int rank, int nranks, int32_t *l0, int32_t *l1);

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
 * as params.prefill says (codelets/prefill.c's si__prefill_arith): but for
 * exact, logits differ from token-by-token evaluation by rounding (act_quant
 * off: float everywhere).  SI_OK, SI_E_INVALID (a token outside the vocabulary, n < 1),
 * SI_E_BUDGET (the context cannot hold them: nothing is evaluated) or
 * SI_E_RUNTIME.
 */
int si_engine_eval_batch(struct si_engine *e, const int32_t *tokens, int32_t n);

/*
 * si_engine_eval_batch, and the logits of tokens[first .. n) into logits
 * ((n - first) rows of n_vocab): each batch's LM head as a GEMM over the
 * batch's tokens from `first` on, in row slices of the vocabulary, one task
 * per CPU worker (norm+lm_head_batch.j); a batch with no such token skips
 * the LM head.  What perplexity needs: the logits of many positions, as
 * llama.cpp's batches give them.  si_engine_logits then holds the last
 * token's when it is one of them.  0 <= first <= n; the errors of
 * si_engine_eval_batch.
 */
int si_engine_eval_batch_logits(struct si_engine *e, const int32_t *tokens, int32_t n,
                                int32_t first, float *logits);

/*
 * FFN observation, what the profile, predictor training and eval watch
 * (predict/profile.h): with fn set, every batch of si_engine_eval_batch and
 * si_engine_eval_batch_logits keeps each layer's FFN input, gate products
 * and activations for its tokens (the batch FFN tasks copy them), and
 * after the batch calls fn(user, view, l) on the calling thread for every
 * token's layers in order: token by token, layer 0 first.  A single token
 * then goes through the batch path too.  The values are those of the
 * engine's prefill arithmetic (see si_engine_eval_batch).  Batches are cut
 * so that the kept values take at most 256 MiB.  Dense mode with batches
 * only (the sparse modes do not compute every neuron): SI_E_INVALID
 * otherwise; SI_E_NOMEM.  A view lasts until fn returns; writing to its h
 * changes nothing.  fn NULL stops observing and frees the buffers.
 */
int si_engine_observe(struct si_engine *e, si_ffn_hook fn, void *user);

/* The runner of predict/profile.h on e (observing while it runs): windows
 * of e's context, each from a reset engine, the tokens as one batched
 * evaluation.  e must be in dense mode. */
struct si_ffn_runner si_engine_ffn_runner(struct si_engine *e);

/* The logits of the last evaluated token (n_vocab). */
const float *si_engine_logits(const struct si_engine *e);

/* Forget the context (start a new sequence). */
void si_engine_reset(struct si_engine *e);

/*
 * Sequences beside the engine's own (si_engine_ref): each a KV cache, a
 * position (n_past) and the logits of its last token, on the engine's
 * weights and tasks.  si_engine_eval_multi decodes several of them in one
 * batch: the weights read once for all their tokens.  The caller owns the
 * sequence and frees it with si_engine_seq_free before the engine; only
 * its n_past (moved back to rewind it), logits and cache are to be read.
 * NULL when out of memory, or when the engine takes no batches (n_batch 1:
 * the flash tier, a pipeline, or asked) or observes.
 */
struct si_ref *si_engine_seq_new(struct si_engine *e);
void si_engine_seq_free(struct si_engine *e, struct si_ref *s);
/* The bytes a sequence allocates (its KV cache and logits). */
int64_t si_engine_seq_bytes(const struct si_engine *e);
/* The most tokens one batch or step takes (1: no batches). */
int32_t si_engine_n_batch(const struct si_engine *e);
/* The fewest tokens a batch takes a prompt batch's arithmetic for (fewer
 * take the reference's, as decoding). */
int32_t si_engine_min_batch(const struct si_engine *e);
/* Whether steps take params.step_int8's arithmetic. */
bool si_engine_steps_int8(const struct si_engine *e);

/* One sequence's part of a step: n tokens appended to seq (the engine's own
 * or one of si_engine_seq_new's). */
struct si_engine_req {
    struct si_ref *seq;
    const int32_t *tokens;
    int32_t n;
};

/*
 * One step over n_req distinct sequences: every request's tokens through
 * the model as one batch (prompt batches' tasks; each token's attention
 * over its own sequence's cache, at its own position), then each
 * sequence's n_past moved past them and the logits of its last token in
 * seq->logits.  Requests of fewer than si_engine_min_batch(e) tokens
 * (decoding: one) take the reference's arithmetic, as decoding does, and
 * their results do not depend on the step's other tokens; a longer one
 * takes a prompt batch's, and equals si_engine_eval_batch's of the same
 * tokens when it is the step's only request (the products' kernels may
 * sum a token's row differently beside other rows).  Logits are the
 * reference's, as si_engine_eval_batch's last token and decoding's.  Each
 * sequence's attention takes the arithmetic its attn_f32 switch asks (see
 * si_engine_ref).
 * SI_E_INVALID: no
 * requests, a request without tokens, a token outside the vocabulary, a
 * sequence twice, more tokens than n_batch, or an engine without batches
 * or observing; SI_E_BUDGET: a sequence's context would overflow;
 * SI_E_RUNTIME.  Nothing is evaluated on an error before submission.
 */
int si_engine_eval_multi(struct si_engine *e, const struct si_engine_req *r, int32_t n_req);

/* The prompt batches' arithmetic: params.prefill, auto resolved (int8 where
 * this CPU runs a batched integer kernel for the FFN's type and the inputs
 * are converted, else blas; per matrix, int8's types without a kernel take
 * the reference's dots, auto's take blas: codelets/prefill.c). */
enum si_prefill_mode si_engine_prefill(const struct si_engine *e);

/* The reference state the engine's attention runs on (for its attn_f32 switch). */
struct si_ref *si_engine_ref(struct si_engine *e);

/* Make the KV cache of si_engine_ref(e) (kcache, vcache) hold what the
 * evaluations wrote, the layers whose attention runs on a CUDA worker
 * included (their copies come back from the GPU).  SI_OK, or SI_E_RUNTIME
 * (called from another thread than the caller worker's). */
int si_engine_sync_kv(struct si_engine *e);

/* si_ref_kv_shift on seq (si_engine_ref(e), or one of si_engine_seq_new's),
 * the engine's copies of ref's cache written back first and dropped (the
 * GPU's layers).  Its statuses, SI_E_UNSUPPORTED across MPI ranks,
 * SI_E_RUNTIME. */
int si_engine_kv_shift(struct si_engine *e, struct si_ref *seq, int32_t n_keep,
                       int32_t n_discard);

struct si_engine_stats si_engine_get_stats(const struct si_engine *e);

/* Why the last evaluation failed, when the engine knows more than its
 * status: a flash load (SI_E_BUDGET: a layer's active neurons exceed its
 * cache; SI_E_IO), or StarPU's GPU memory above the VRAM budget
 * (SI_E_BUDGET); "" otherwise. */
const char *si_engine_error(const struct si_engine *e);

/* Cold slices per layer actually used. */
int32_t si_engine_n_slices(const struct si_engine *e);

/* Whether the attention groups multiply Wo themselves, in partial products
 * the FFN slices add (the fuse policy's fuse_wo, graph/layout.c). */
bool si_engine_wo_fused(const struct si_engine *e);

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
