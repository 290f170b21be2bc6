/*
 * graph.h - what the files of src/graph/ share: the engine is built by
 * engine.c (state, lifecycle: init's stages), laid out by layout.c (each
 * mode's FFN layout, the fuse policy, the parameter checks, the GPU
 * reserve), given its data by data.c (records, handles, partitions), and run
 * by decode.c (one token's tasks) and prefill.c (a batch's).  The tasks
 * themselves are the codelets of src/codelets/ (codelets.h); the state they
 * share is codelets/state.h.
 */
#ifndef SI_GRAPH_GRAPH_H
#define SI_GRAPH_GRAPH_H

#include "codelets/state.h"
#include "codelets/task.h"
#include "graph/engine.h"

#include <stddef.h>
#include <stdint.h>

/* --- layout.c */

/* The FFN layout of mode on m: e's sparse, has_gate, chunk and pre_sep
 * (e->m and e->p set). */
void si__layout_of(const struct si_model *m, enum si_sparsity mode, struct si_engine *e);

/* The fuse policy: e's fuse_out and fuse_pred, once the plan has chosen the
 * GPU's attention layers; redux as asked (dense mode drops e->p.redux). */
void si__fuse_of(struct si_engine *e, bool redux);

/* How layer l's FFN rows are stored under that layout (with the flash
 * tier: the store's records). */
void si__ffn_fmt_of(const struct si_engine *e, int l, struct si__ffn_fmt *f);

/* The context length the reference will have (si_ref_init's rule). */
int64_t si__n_ctx_of(const struct si_engine *e);

/* The GPU reserve of engine e (its layout set). */
void si__reserve_of(const struct si_engine *e, struct si_gpu_reserve *r);

/* The weight types the CUDA matvec and FFN kernels take (codelets_cuda.h). */
bool si__cuda_type(uint32_t t);

/* Check p against m and the ncuda CUDA workers: SI_OK or the refusal. */
int si__check_params(const struct si_model *m, const struct si_engine_params *p, unsigned ncuda,
                     char *err, size_t err_size);

/* --- data.c */

/* Layer l's neuron records in position order (sparse layouts); col is
 * n_ff x n_embd floats of scratch when the file has no ffn_down_t. */
int si__build_records(struct si_engine *e, int l, float *col, char *err, size_t err_size);

/* Layer l's resident part with the flash tier: gating rows, biases, the hot
 * records read from the store, fc2 in position order. */
int si__build_flash(struct si_engine *e, int l, char *err, size_t err_size);

/* weights.c: e->w, the matrices decoding reads whole packed where they can
 * be (after the plan: the splits and hot slices known); and their memory. */
int si__weights_pack(struct si_engine *e, char *err, size_t err_size);

/* bytes of weight memory for the engine's own copies (released with free):
 * from 2 MiB on, 2 MiB-aligned and advised for transparent huge pages (fewer
 * TLB misses on rows read far apart); NULL when out of memory. */
void *si__weights_alloc(size_t bytes);
void si__weights_free(struct si_engine *e);

void si__register_engine(struct si_engine *e);
void si__unregister_engine(struct si_engine *e);

/* A batch's logits rows at p as the handles h_blog_c, one per vocabulary
 * slice; si__unregister_batch_logits waits for their tasks and drops them. */
void si__register_batch_logits(struct si_engine *e, float *p, int32_t rows);
void si__unregister_batch_logits(struct si_engine *e);

/* The GPU memory StarPU's allocator takes for a set of buffers (layout.c):
 * those above 4 MiB alone, the others as 16 KiB blocks in 32 MiB chunks. */
#define SI__GPU_CHUNK ((int64_t)32 << 20)
struct si__gpu_bytes {
    int64_t alone;  /* bytes of the buffers allocated alone */
    int64_t blocks; /* blocks of the others */
};
void si__gpu_bytes_add(struct si__gpu_bytes *g, int64_t bytes);
int64_t si__gpu_bytes_total(const struct si__gpu_bytes *g);

/* What the handles of a plan with n_hot[l] hot neurons in layer l will take
 * on the GPU (layout.c; the same handles as si__gpu_accounted's). */
int64_t si__gpu_planned(const struct si_engine *e, const int64_t *n_hot);

/* The GPU memory of every handle the engine lets onto the CUDA node, as
 * StarPU's allocator takes it (data.c). */
int64_t si__gpu_accounted(const struct si_engine *e);

/* --- attn_gpu.c: a layer's attention on the GPU */

/* Why m's attention under p cannot run on the GPU, or NULL when it can. */
const char *si__attn_gpu_unable(const struct si_model *m, const struct si_engine_params *p);

/* How many layers get it (the first ones), with rs the reserve without it. */
int32_t si__attn_gpu_choose(const struct si_engine *e, const struct si_gpu_reserve *rs,
                            int64_t budget);

/* The GPU handles of layer l's attention (n_parts: the partial outputs of
 * the layer before it adds in), and those all such layers share. */
void si__attn_gpu_layer_bytes(const struct si_engine *e, int l, int32_t n_parts,
                              struct si__gpu_bytes *g);
void si__attn_gpu_shared(const struct si_engine *e, struct si__gpu_bytes *g);

/* Floats of the attention task's GPU scratch. */
int64_t si__attn_gpu_scratch_floats(const struct si_model *m);

/* Layer l's aux: its norm weights and biases as floats (state.h). */
int si__attn_gpu_aux(struct si_engine *e, int l);

/* --- observe.c */

/* After a batch: the observer on each kept (token, layer), in order. */
void si__observe_batch(struct si_engine *e);

/* pipe.c: a pipeline's transfers (SI_E_UNSUPPORTED without StarPU-MPI):
 * receive x from the rank before, send x to the rank after, the logits
 * from the last rank to rank 0 (a no-op with one rank). */
int si__pipe_recv_x(struct si_engine *e);
int si__pipe_send_x(struct si_engine *e);
int si__pipe_logits(struct si_engine *e);

#endif /* SI_GRAPH_GRAPH_H */
