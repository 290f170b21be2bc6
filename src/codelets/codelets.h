/*
 * codelets.h - the engine's task kinds: one StarPU codelet each.  Each file
 * holds its kinds' buffer descriptions (task.h: `<kind>_bufs`, the one place
 * that gives a kind's buffers, their modes and their order, read by both
 * its submit function and its CPU and CUDA functions), the functions
 * themselves, the perfmodels (history-based, symbol si_<op>...) and the
 * codelet structs; the pure kernels they call live apart (model/quants.h,
 * model/kernels.h, codelets/ffn_sparse.h, codelets/ops.h,
 * codelets/codelets_cuda.h) and know nothing of StarPU.  The graph
 * (graph/decode.c, graph/prefill.c) calls the submit functions below in
 * the order of a layer's maths; every task's cl_arg is a struct
 * si__task_arg (state.h).
 *
 * head.c     embed, norm+lm_head (one task), lm_head.j (row slices)
 * attn.c     attn_L (one task; on the GPU for the plan's layers), attn_L.j
 *            (by kv-head groups), attn_o_L.j (Wo's row slices), attn_out_L
 * pred.c     pred_L (predictor mode), gmask_L.j (the flash tier's gate masks)
 * ffn.c      ffn_hot_L, ffn_cold_L.j (the FFN slices), ffn_down_L.k (dense)
 * merge.c    merge_L (redux), residual_L (a pipeline rank's last layer),
 *            redux's zero and sum; the carried FFN output (task.h)
 * load.c     load_L, and ffn_cold_L.j from the flash cache
 * prefill.c  a batch's embed_batch and heads; prefill_attn.c, prefill_ffn.c
 *            its layers' attention and FFN tasks (prefill.h: their
 *            arithmetic)
 * pack.c     pack8 (set-up): no buffers; cl_arg a struct si__pack_job
 */
#ifndef SI_CODELETS_CODELETS_H
#define SI_CODELETS_CODELETS_H

#include "codelets/ffn_sparse.h"
#include "codelets/state.h"
#include "codelets/task.h"
#include "model/act.h"
#include "model/colblock.h"
#include "model/quants.h"
#include "model/types.h"

#include <math.h>

extern struct starpu_codelet si__cl_embed, si__cl_head, si__cl_head_rows;
extern struct starpu_codelet si__cl_attn, si__cl_agrp, si__cl_apos, si__cl_ao, si__cl_aout;
extern struct starpu_codelet si__cl_pred, si__cl_gmask;
extern struct starpu_codelet si__cl_hot, si__cl_cold, si__cl_down;
extern struct starpu_codelet si__cl_merge, si__cl_zero, si__cl_sum, si__cl_residual;
extern struct starpu_codelet si__cl_load, si__cl_flash;
extern struct starpu_codelet si__cl_bembed, si__cl_battn, si__cl_bffn, si__cl_bdown, si__cl_bmerge,
    si__cl_bhead, si__cl_bhead_rows, si__cl_bakv, si__cl_bacore, si__cl_bao, si__cl_baout;
extern struct starpu_codelet si__cl_pack;

/* pack8's argument: groups [g0, g1) of 8 rows of type t (n values, row_bytes
 * each) from src into dst, both at group 0 of the matrix; in place where
 * src == dst, through tmp (8 * row_bytes); release: then drop src's pages
 * from the process (src a read-only file mapping). */
struct si__pack_job {
    uint32_t type;
    const char *src;
    char *dst, *tmp;
    size_t row_bytes;
    int64_t n, g0, g1;
    bool release;
};

/* --- the FFN's arithmetic, shared by ffn.c, pred.c and load.c (inline: the
 * per-row helpers of the hottest loops) */

/* Whether the FFN slice tasks read x, the residual the FFN's norm read,
 * after ffn_in: their fused predictor's input (model.h's SI_PRED_RESIDUAL),
 * when they do not make the FFN's input themselves (fuse_out). */
static inline bool si__ffn_reads_residual(const struct si_engine *e)
{
    return e->p.mode == SI_SPARSITY_PREDICTOR && e->lay.fuse_pred && !e->lay.fuse_out &&
           e->m->pred_input == SI_PRED_RESIDUAL;
}

/* The FFN input converted for rows of type t into dst (NULL: dots in float). */
static inline const void *si__ffn_convert_input(const struct si_engine *e, uint32_t t,
                                                const float *xb, void *dst)
{
    if (!e->p.ref.act_quant)
        return NULL;
    si_quantize_act(si_act_type(t), xb, dst, e->m->hp.n_embd);
    return dst;
}

/* row . x, with the converted input xa when there is one. */
static inline float si__ffn_dot(uint32_t t, const void *row, const void *xa, const float *x,
                                int64_t n)
{
    return xa != NULL ? si_vec_dot_act(t, row, xa, n) : si_vec_dot(t, row, x, n);
}

/* The activation of one neuron from its rows of type t (gate may be NULL
 * for the plain kind, b NULL without an up bias), as the reference
 * computes it. */
static inline float si__ffn_neuron(const struct si_engine *e, uint32_t t, const void *gate,
                                   const void *up, const float *b, const void *xa, const float *xb)
{
    const struct si_hparams *hp = &e->m->hp;
    const int64_t d = hp->n_embd;
    if (hp->ffn_kind == SI_FFN_PLAIN)
        return si_act_apply(hp->act, b != NULL ? si__ffn_dot(t, up, xa, xb, d) + *b
                                               : si__ffn_dot(t, up, xa, xb, d));
    float a = si_act_apply(hp->act, si__ffn_dot(t, gate, xa, xb, d));
    float u = b != NULL ? si__ffn_dot(t, up, xa, xb, d) + *b : si__ffn_dot(t, up, xa, xb, d);
    return si_act_gated(hp->ffn_kind, a, u);
}

/* h[q] = the activation of the neuron whose record is number ix[q] (records
 * of format f; gate and up point at the first record's rows, b at the
 * first record's bias or NULL), q < k: the sparse kernel on the converted
 * input xa, or the reference's float dots without one. */
static inline void si__ffn_act_records(const struct si_engine *e, const struct si__ffn_fmt *f,
                                       const char *gate, const char *up, const float *b,
                                       const void *xa, const float *xb, const int32_t *ix,
                                       int64_t k, float *h)
{
    const struct si_hparams *hp = &e->m->hp;
    const size_t rb = f->rec_bytes;
    if (xa != NULL) {
        si_k_ffn_act_sparse(hp->ffn_kind, hp->act, f->gu_type, gate, up, b, rb, hp->n_embd, xa, ix,
                            k, h);
        return;
    }
    for (int64_t q = 0; q < k; q++) {
        const size_t o = (size_t)ix[q] * rb;
        h[q] = si__ffn_neuron(e, f->gu_type, gate != NULL ? gate + o : NULL, up + o,
                              b != NULL ? b + ix[q] : NULL, xa, xb);
    }
}

/*
 * Gate mode past a slice's n gating dots g (gated kinds): the neurons whose
 * act(gate) passes (ReLU: not zero; else |act| > thr) into sc->ix[0..m), in
 * order, and their activations into sc->h[0..m): act(gate) times the up
 * dot (+ its bias b[i]) as si_act_gated combines them, the up rows (up, rb
 * bytes apart) read 8 at a time through si_vec_dot_act8p with the next 8
 * prefetched where x is converted (xa), else in float (xb).  Returns m;
 * h may hold zeros (the up side's ReLU of the Bamboo kind).
 */
static inline int64_t si__ffn_gate_pass(const struct si_engine *e, uint32_t t, const char *up,
                                        size_t rb, const float *b, const float *g, int64_t n,
                                        float thr, const void *xa, const float *xb,
                                        struct si__scratch *sc)
{
    const struct si_hparams *hp = &e->m->hp;
    const int64_t d = hp->n_embd;
    const bool relu = hp->act == SI_ACT_RELU;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        const float a = si_act_apply(hp->act, g[i]);
        if (relu ? a == 0.0f : !(fabsf(a) > thr))
            continue;
        sc->h[m] = a;
        sc->ix[m++] = (int32_t)i;
    }
    float u[8];
    for (int64_t q = 0; q < m; q += 8) {
        const int cnt = m - q < 8 ? (int)(m - q) : 8;
        if (xa != NULL && cnt == 8) {
            const void *rows[8], *ahead[8];
            for (int r = 0; r < 8; r++) {
                rows[r] = up + (size_t)sc->ix[q + r] * rb;
                ahead[r] = q + 8 + r < m ? up + (size_t)sc->ix[q + 8 + r] * rb : NULL;
            }
            si_vec_dot_act8p(t, rows, xa, d, u, ahead);
        } else {
            for (int r = 0; r < cnt; r++)
                u[r] = si__ffn_dot(t, up + (size_t)sc->ix[q + r] * rb, xa, xb, d);
        }
        for (int r = 0; r < cnt; r++) {
            const int32_t i = sc->ix[q + r];
            sc->h[q + r] = si_act_gated(hp->ffn_kind, sc->h[q + r], b != NULL ? u[r] + b[i] : u[r]);
        }
    }
    return m;
}

/* Gate mode's n gating rows of a slice at pre (format f, n_embd values
 * each), the first pk packed 8 at a time (graph/weights.c), as a tensor
 * for si_ref_matvec_act. */
static inline struct si_tensor si__pre_rows(const struct si__ffn_fmt *f, int64_t n_embd,
                                            const char *pre, int64_t n, int64_t pk)
{
    return (struct si_tensor){.data = pre,
                              .type = f->gu_type,
                              .ne = {n_embd, n, 1, 1},
                              .nbytes = (size_t)n * f->gu_row,
                              .row_bytes = f->gu_row,
                              .pk = pk};
}

/* --- input sparsity (TEAL; si_ref_params.input_thresholds), shared by
 * attn.c and ffn.c */

/*
 * x (n values, the task's own copy) as layer l's products of `kind` (enum
 * si_input_kind) take it: its entries at or below the layer's threshold
 * zeroed, as the reference's.  Returns whether those products read the
 * transposed copies (si_ref_reads_t, the reference's rule); x's non-zero
 * entries are then in sc->sx and sc->sv, *nz of them (si_k_nonzero), for
 * si_k_matvec_t.
 */
static inline bool si__input_in(const struct si_engine *e, struct si__scratch *sc, int l, int kind,
                                float *x, int64_t n, int64_t *nz)
{
    const float t = si_ref_input_threshold(&e->p.ref, l, kind);
    if (t > 0.0f)
        for (int64_t i = 0; i < n; i++)
            if (fabsf(x[i]) <= t)
                x[i] = 0.0f;
    if (!si_ref_reads_t(&e->p.ref, e->m, l, kind))
        return false;
    *nz = si_k_nonzero(x, n, sc->sx, sc->sv);
    return true;
}

/* y = columns [c0, c1) of wt's product with x (the input si__input_in
 * zeroed and gathered): rows [c0, c1) of w's product, the statistics told
 * of the bytes of w not read (e->in_saved). */
static inline void si__matvec_t(struct si_engine *e, const struct si_tensor *w,
                                const struct si_tensor *wt, int64_t c0, int64_t c1,
                                const struct si__scratch *sc, int64_t nz, const float *x, float *y)
{
    int64_t read;
    if (wt->cb_scale != NULL) {
        const int64_t blocks = si_cb_matvec(wt, c0, c1, x, y);
        read = nz * (c1 - c0) / 2 + blocks * (c1 - c0) * (wt->type == SI_TYPE_Q4_0 ? 2 : 4);
    } else {
        si_k_matvec_t(wt->type, wt->data, wt->row_bytes, c0, c1, sc->sv, sc->sx, nz, y);
        size_t span = 0;
        si_type_row_size(wt->type, c1 - c0, &span);
        read = nz * (int64_t)span;
    }
    __atomic_fetch_add(&e->in_saved, (c1 - c0) * (int64_t)w->row_bytes - read, __ATOMIC_RELAXED);
}

/* ffn_down_L.k and ffn_down_batch_L.k (dense mode; batch: a batch's
 * arrays): the slices' outputs (R), the block's rows of ffn_down (R), the
 * block's output (W).  io->rows: those rows as a tensor on the buffer. */
struct si__down_io {
    const float *act[SI__MAX_SLICES + 1];
    struct si_tensor rows;
    float *y;
};
void si__down_bufs(struct si__bufs *b, struct si_engine *e, int l, int k, bool batch,
                   struct si__down_io *io);

/* Dense mode: layer L's slices' activations of token t, from the slices'
 * outputs act[0 .. nsl), gathered into h (n_ff). */
void si__ffn_gather(const struct si__layer_state *L, const float *const *act, int64_t t, float *h);

/* --- shared by the codelet files (merge.c) */

/* x_out = layer l's input residual: x plus the carried FFN output c (task.h;
 * x_out may be x); returns the seconds spent merging. */
double si__residual_in(struct si_engine *e, int l, const struct si__carried *c, const float *x,
                       float *x_out, struct si__scratch *sc);

/* --- each kind's submission (its codelet file): the task(s) of layer l
 * (part j) for token, their buffers from the kind's description. 0 or the
 * error of starpu_task_submit. */
int si__submit_embed(struct si_engine *e, int32_t token);
int si__submit_head(struct si_engine *e, int32_t token);              /* one task or row slices */
int si__submit_attn(struct si_engine *e, int l, int32_t token);       /* attention in one task */
int si__submit_attn_split(struct si_engine *e, int l, int32_t token); /* agrp, ao, aout */
/* Wo's slices split again after the readers of their joined whole (attn.c). */
void si__split_o(struct si_engine *e);

/*
 * Whether n parts that n tasks each write and as many read whole are joined
 * between them (StarPU's unpartition, then partition again after the
 * readers): 4n dependencies instead of 2n^2 (each reader on each writer,
 * each next writer on each reader).  The join and the split cost about
 * 3 us of submission; an edge about 0.12 us; below 6 parts the edges cost
 * less (docs/measurements.md, "What the task graph costs").
 */
#define SI__JOIN_MIN 6
static inline bool si__joins(int32_t n)
{
    return n >= SI__JOIN_MIN;
}

/* Layer l's FFN output, which layer l + 1's first tasks (or the head) all
 * read, joined after its writers (the sparse slices, or dense mode's down
 * blocks) where si__joins; si__split_carried splits it again after those
 * readers (graph/decode.c).  merge.c. */
void si__join_carried(struct si_engine *e, int l);
void si__split_carried(struct si_engine *e);

/* Whether the engine's parts may be joined: none on a CUDA worker (the
 * GPU forms keep theirs apart; not measured there). */
static inline bool si__cpu_graph(const struct si_engine *e)
{
    return !e->gpu.cuda_hot && e->gpu.n_attn_gpu == 0;
}

/* A weight that tasks only read (a vector; _mat: a matrix): a buffer where
 * a GPU is in the graph (StarPU moves it there), else read in place with no
 * buffer, through its handle's main-memory pointer (NULL when collecting).
 * Weights are never written and leave StarPU's implicit dependencies once
 * partitioned (graph/data.c), so on CPU workers a buffer of theirs only
 * cost each task a handle to submit, sort, acquire and release
 * (docs/measurements.md). */
static inline void *si__wvec(struct si__bufs *b, const struct si_engine *e, starpu_data_handle_t h)
{
    if (!si__cpu_graph(e))
        return si__vec(b, h, STARPU_R);
    return b->args != NULL ? NULL : (void *)starpu_vector_get_local_ptr(h);
}
static inline void *si__wmat(struct si__bufs *b, const struct si_engine *e, starpu_data_handle_t h)
{
    if (!si__cpu_graph(e)) {
        void *f = si__buf(b, h, STARPU_R);
        return f != NULL ? (void *)STARPU_MATRIX_GET_PTR(f) : NULL;
    }
    return b->args != NULL ? NULL : (void *)starpu_matrix_get_local_ptr(h);
}

/* Dense mode: whether layer l's down blocks read its slices' activations
 * joined (graph/decode.c, ffn.c's si__down_bufs). */
static inline bool si__down_joins(const struct si_engine *e, int l)
{
    return si__cpu_graph(e) && si__joins(e->L[l].nsl) && si__joins(e->down.nd);
}

/* An array of n parts as a task that reads it all takes it (R): the whole
 * where joined, else the parts in order (consecutive in main memory).  Its
 * first float. */
static inline const float *si__read_whole(struct si__bufs *b, bool joined,
                                          starpu_data_handle_t whole, int32_t n,
                                          const starpu_data_handle_t *parts)
{
    if (joined)
        return si__vec(b, whole, STARPU_R);
    const float *first = NULL;
    for (int32_t j = 0; j < n; j++) {
        const float *p = si__vec(b, parts[j], STARPU_R);
        if (j == 0)
            first = p;
    }
    return first;
}

/* Whether layer l's attention groups multiply Wo themselves this token
 * (lay.fuse_wo, and its attention not split over positions, which leaves
 * Wo to the attn_o tasks that merge the positions' parts); _at: for a token
 * decoded alone at position pos.  attn.c. */
bool si__wo_fused(const struct si_engine *e, int l);
bool si__wo_fused_at(const struct si_engine *e, int l, int pos);

/* Wo's product of layer l as a task that reads it all takes it: o_all, or
 * where the groups multiply Wo (si__wo_fused) their *n partial products,
 * rows of n_embd floats to add in order.  Its first float. */
static inline const float *si__o_read(struct si__bufs *b, const struct si_engine *e, int l,
                                      int32_t *n)
{
    if (si__wo_fused(e, l)) {
        *n = e->dec.ng;
        return si__read_whole(b, si__joins(e->dec.ng), e->dec.h_opart, e->dec.ng, e->dec.h_opart_c);
    }
    *n = 1;
    return si__read_whole(b, si__joins(e->dec.na), e->dec.h_o_all, e->dec.na, e->dec.h_o);
}
int si__submit_pred(struct si_engine *e, int l, int32_t token);
int si__submit_gmask(struct si_engine *e, int l, int j, int32_t token);
int si__submit_load(struct si_engine *e, int l, int32_t token);
int si__submit_flash(struct si_engine *e, int l, int j, int32_t token);
int si__submit_ffn(struct si_engine *e, int l, int j, int32_t token); /* hot or cold */
int si__submit_down(struct si_engine *e, int l, int k, int32_t token);
int si__submit_merge(struct si_engine *e, int l, int32_t token);
int si__submit_residual(struct si_engine *e, int l, int32_t token);
/* a batch (graph/prefill.c): its embedding, layer l's attention tasks, its
 * FFN tasks (slices, dense mode's down blocks, the merge), the last token's
 * head, the head's slice j of the logits rows */
int si__submit_bembed(struct si_engine *e);
int si__submit_battn(struct si_engine *e, int l);
int si__submit_bffn(struct si_engine *e, int l);
int si__submit_bhead(struct si_engine *e);
int si__submit_bhead_rows(struct si_engine *e, int j);

/*
 * The GPU form of the hot FFN slice for one token (ffn.c), over an
 * implementation of its kernels: CUDA's (si__ffn_cuda_ops) or their CPU
 * twins (si__ffn_twin_ops, for a CPU worker in the GPU's stead with
 * params.gpu_twin).  Each returns 0 or an error (CUDA's cudaError_t).
 */
struct si__ffn_ops {
    void *c; /* CUDA: the stream */
    int (*matvec)(void *c, uint32_t type, const void *w, size_t stride, int64_t n_rows,
                  int64_t n_cols, const float *x, float *y);
    int (*gate_up)(void *c, uint32_t type, const void *gate, const void *up, size_t stride,
                   int64_t n_ff, int64_t n_embd, const float *b, const float *x, const int32_t *idx,
                   int64_t n_idx, int kind, int act, float *h);
    int (*combine)(void *c, const float *g, const float *u, const float *b, int64_t n, int kind,
                   int act, float *h);
    int (*down)(void *c, uint32_t type, const void *down_t, size_t stride, int64_t n_ff,
                int64_t n_embd, const float *h, const int32_t *idx, int64_t n_idx, float *y);
};
extern const struct si__ffn_ops si__ffn_twin_ops;
#ifdef SI_USE_CUDA
struct si__ffn_ops si__ffn_cuda_ops(void *stream);
#endif

/* A slice's weights as its task's buffers hold them (NULL: not there). */
struct si__ffn_slice {
    const char *gate, *up, *rec, *pre;
    const float *b;
};

/* The weights of slice j of layer l as the FFN tasks take them (R), in
 * the description b: dense, [gate j] and up j; sparse, [gating rows j
 * (gate mode)] and records j; then up_b j (w->b NULL for files without an
 * up bias). */
void si__ffn_slice_bufs(struct si__bufs *b, const struct si_engine *e, int l, int j,
                        struct si__ffn_slice *w);

/* Slice j of layer l for the input xb into out (sparse: n_embd floats;
 * dense: its activations), its predicted positions idx (NULL: every neuron,
 * iota), h 2 n_ff floats of scratch; all in the implementation's memory. */
int si__ffn_gpu_token(const struct si__ffn_ops *op, const struct si_engine *e, int l, int j,
                      const struct si__ffn_slice *w, const float *xb, const int32_t *idx,
                      const int32_t *iota, float *out, float *h);

#endif /* SI_CODELETS_CODELETS_H */
