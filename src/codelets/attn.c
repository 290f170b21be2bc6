/*
 * attn.c - attention as tasks: one per layer (on a CPU worker, or on the GPU for the layers the
 * plan puts there), or split by kv heads with the output projection in row slices.
 */
#include "codelets/codelets.h"

#include "model/forward.h"
#include "model/kernels.h"
#include "model/quants.h"

#include <starpu.h>
#include <stdlib.h>
#include <string.h>

#ifdef SI_USE_CUDA
#include "codelets/codelets_cuda.h"
#include <cuda_runtime_api.h>

/* attn_cuda adds in every slice of the layer before: the cold ones and the hot one. */
_Static_assert(SI_CUDA_MAX_PARTS >= SI__MAX_SLICES + 1, "si_cuda_residual takes too few parts");
#endif

/* The first position layer l attends to from pos (sliding windows). */
static int attn_first(const struct si_hparams *hp, int l, int pos)
{
    return si_hparams_is_swa(hp, l) && pos >= hp->sliding_window ? pos - hp->sliding_window + 1 : 0;
}

/*
 * attn_L (attention in one task, when its products are not split): x (RW),
 * the carried FFN output (R), xb (W: the FFN's input), [xb3 (W)], K, V
 * (RW: each kv-head group's columns), [Wq, Wk, Wv, Wo (R): with a GPU in
 * the graph, si__wvec]; for a layer whose attention the plan put on the
 * GPU (on CUDA, or on a CPU worker in its stead): aux (R: its norm
 * weights and biases as floats, state.h) and a scratch of
 * si__attn_gpu_scratch_floats.
 */
struct attn_io {
    float *x, *xb, *xb3, *aux, *scratch;
    void *k[SI__MAX_SLICES + 1], *v[SI__MAX_SLICES + 1]; /* (ng) the caches' interfaces */
    const void *w[4];
    struct si__carried c;
};

static void attn_bufs(struct si__bufs *b, struct si_engine *e, int l, struct attn_io *io)
{
    struct si__layer_state *L = &e->L[l];
    io->x = si__vec(b, e->dec.h_x, STARPU_RW);
    si__carried_bufs(b, e, l, &io->c);
    io->xb = si__vec(b, e->dec.h_ffn_in, STARPU_W);
    io->xb3 = e->dec.h_xb3 != NULL ? si__vec(b, e->dec.h_xb3, STARPU_W) : NULL;
    for (int32_t g = 0; g < e->dec.ng; g++) { /* the caches, in the batches' groups */
        io->k[g] = si__buf(b, e->dec.ng > 1 ? L->h_k_c[g] : L->h_k, STARPU_RW);
        io->v[g] = si__buf(b, e->dec.ng > 1 ? L->h_v_c[g] : L->h_v, STARPU_RW);
    }
    for (int i = 0; i < 4; i++)
        io->w[i] = si__wvec(b, e, L->h_w[i]);
    io->aux = io->scratch = NULL;
    if (L->attn_gpu) {
        io->aux = si__vec(b, L->h_aux, STARPU_R);
        io->scratch = si__vec(b, e->gpu.h_ascratch, STARPU_SCRATCH);
    }
}

static void attn_twin(struct si_engine *e, int l, struct attn_io *io);

/* Layer l - 1's FFN added into x, then the reference's whole attention
 * step on it (x += attention; xb = the FFN's input). */
static void attn_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct attn_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    attn_bufs(&b, e, a->l, &io);
    if (e->L[a->l].attn_gpu && e->p.gpu_twin) { /* the GPU's steps, on this CPU worker */
        attn_twin(e, a->l, &io);
        return;
    }
    double t0 = si__now();
    const double tm = si__residual_in(e, a->l, &io.c, io.x, io.x, si__scratch_of(e));
    si_ref_attn_into(e->ref, a->l, io.x, io.xb, io.xb3);
    si__charge(e, SI_TASK_MERGE, tm);
    si__charge(e, SI_TASK_ATTN, si__now() - t0 - tm);
}

int si__submit_attn(struct si_engine *e, int l, int32_t token)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    attn_bufs(&b, e, l, &(struct attn_io){0});
    const uint32_t where = e->L[l].attn_gpu && e->gpu.cuda_hot ? STARPU_CUDA : STARPU_CPU;
    return si__submit(e, &si__cl_attn, e->L[l].name_attn, l, -1, token, &a, where);
}

/*
 * The GPU form of attn_L, for a layer whose attention the plan put on the
 * GPU (graph/attn_gpu.c), step by step over an implementation of its
 * kernels: CUDA's (attn_cuda), or their CPU twins (attn_twin, what a CPU
 * worker runs in the GPU's stead with params.gpu_twin, so that the steps,
 * the buffers and their offsets are tested where there is no GPU).
 * Buffers: attn_cpu's, then aux (R: the layer's norm weights and biases as
 * floats, state.h) and a scratch of si__attn_gpu_scratch_floats.  The same
 * steps as the reference's: the carried FFN output added into x, the norm,
 * q k v (dots on float inputs: the CPU converts them to Q8 for quantized
 * weights, so the results differ by that rounding), biases, RoPE, the new k
 * and v into the fp16 cache (each kv-head group's columns, a child of the
 * cache when the engine splits it), attention, the output projection, the
 * residual, the FFN's normalised input.  Each step returns 0 or an error,
 * and the first error ends the chain.
 */
struct attn_ops {
    void *c; /* the implementation's own (CUDA: the stream) */
    /* x += ((parts[0] + parts[1]) + ...) + bias, over len */
    int (*residual)(void *c, float *x, const float *const *parts, int n, const float *bias,
                    int64_t len);
    int (*norm)(void *c, bool rms, float *y, const float *x, const float *w, const float *b,
                int64_t n, float eps);
    int (*matvec)(void *c, const struct si_tensor *w, const void *data, const float *x, float *y);
    int (*add)(void *c, float *y, const float *a, const float *b, int64_t n);
    int (*rope)(void *c, float *x, int n_heads, const struct si_hparams *hp, int pos, float base,
                float scale);
    int (*to_f16)(void *c, uint16_t *dst, const float *src, int64_t n);
    /* k and v: a position every ld halves */
    int (*attend)(void *c, float *out, const float *q, const uint16_t *k, const uint16_t *v,
                  int first, int n_kv, int n_head, int n_head_kv, int head_dim, int64_t ld,
                  float scale);
};

static int attn_chain(const struct attn_ops *op, struct si_engine *e, int l,
                      const struct attn_io *io)
{
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->w->layers[l];
    const struct si__layer_state *L = &e->L[l];
    void *c = op->c;
    const int64_t d = hp->n_embd, hd = hp->head_dim, qd = (int64_t)hp->n_head * hd;
    const int64_t kvd = (int64_t)hp->n_head_kv * hd;
    const int group = hp->n_head / hp->n_head_kv, pos = e->ref->n_past;
    float *x = io->x, *xb = io->xb;
    /* the carried parts, then xb3 with a parallel residual */
    const float *parts[SI__MAX_SLICES + 2];
    int nc = io->c.n;
    for (int j = 0; j < nc; j++)
        parts[j] = io->c.part[j];
    if (io->c.xb3 != NULL)
        parts[nc++] = io->c.xb3;
    const void *const *w = io->w;
    const float *aux = io->aux;
    float *xn = io->scratch;
    float *q = xn + d, *k = q + qd, *v = k + kvd, *att = v + kvd, *o = att + qd;
#define AUX(i) (L->aux_off[i] >= 0 ? aux + L->aux_off[i] : NULL)
    const bool rms = hp->norm_kind == SI_NORM_RMS;
    int rc = 0;
    if (nc > 0 && e->lay.sparse) { /* the slices' partial outputs, in order */
        rc = op->residual(c, x, parts, nc, AUX(SI__AUX_PREV_DOWN_B), d);
    } else if (nc > 0) { /* dense: the down projection's blocks side by side */
        const float *bias = AUX(SI__AUX_PREV_DOWN_B);
        for (int32_t j = 0; j < e->down.nd && rc == 0; j++)
            rc =
                op->residual(c, x + e->down.dn[j], &parts[j], 1, bias ? bias + e->down.dn[j] : NULL,
                             e->down.dn[j + 1] - e->down.dn[j]);
    }
    if (rc == 0)
        rc = op->norm(c, rms, xn, x, AUX(SI__AUX_ATTN_NORM), AUX(SI__AUX_ATTN_NORM_B), d,
                      hp->norm_eps);
    const struct si_tensor *wt[3] = {&W->wq, &W->wk, &W->wv};
    float *out[3] = {q, k, v};
    const enum si__aux bias[3] = {SI__AUX_BQ, SI__AUX_BK, SI__AUX_BV};
    for (int i = 0; i < 3 && rc == 0; i++) {
        rc = op->matvec(c, wt[i], w[i], xn, out[i]);
        if (rc == 0 && AUX(bias[i]) != NULL)
            rc = op->add(c, out[i], out[i], AUX(bias[i]), wt[i]->ne[1]);
    }
    const bool local = si_hparams_is_swa(hp, l);
    if (rc == 0 && hp->rope_kind != SI_ROPE_NONE) {
        const float base = local ? hp->rope_base_local : hp->rope_base;
        const float scale = local ? 1.0f : hp->rope_scale;
        rc = op->rope(c, q, hp->n_head, hp, pos, base, scale);
        if (rc == 0)
            rc = op->rope(c, k, hp->n_head_kv, hp, pos, base, scale);
    }
    const int first = attn_first(hp, l, pos);
    for (int32_t g = 0; g < e->dec.ng && rc == 0; g++) {
        const int64_t g0 = e->dec.ng > 1 ? e->dec.a_g[g] : 0,
                      g1 = e->dec.ng > 1 ? e->dec.a_g[g + 1] : hp->n_head_kv;
        uint16_t *kc, *vc;
        int64_t ld;      /* halves from a position to the next */
        if (e->dec.ng > 1) { /* the group's columns: a matrix of bytes, a row per position */
            kc = (uint16_t *)STARPU_MATRIX_GET_PTR(io->k[g]);
            vc = (uint16_t *)STARPU_MATRIX_GET_PTR(io->v[g]);
            ld = (int64_t)STARPU_MATRIX_GET_LD(io->k[g]) / 2;
            if (STARPU_MATRIX_GET_LD(io->v[g]) != STARPU_MATRIX_GET_LD(io->k[g]))
                return -1;
        } else {
            kc = (uint16_t *)STARPU_VECTOR_GET_PTR(io->k[0]);
            vc = (uint16_t *)STARPU_VECTOR_GET_PTR(io->v[0]);
            ld = kvd;
        }
        const int64_t cols = (g1 - g0) * hd;
        rc = op->to_f16(c, kc + (size_t)pos * (size_t)ld, k + g0 * hd, cols);
        if (rc == 0)
            rc = op->to_f16(c, vc + (size_t)pos * (size_t)ld, v + g0 * hd, cols);
        if (rc == 0)
            rc = op->attend(c, att + g0 * group * hd, q + g0 * group * hd, kc, vc, first, pos + 1,
                            (int)((g1 - g0) * group), (int)(g1 - g0), (int)hd, ld, hp->attn_scale);
    }
    if (rc == 0)
        rc = op->matvec(c, &W->wo, w[3], att, o);
    if (rc == 0 && AUX(SI__AUX_BO) != NULL)
        rc = op->add(c, o, o, AUX(SI__AUX_BO), d);
    if (rc == 0)
        rc = op->add(c, x, x, o, d);
    if (rc == 0)
        rc = op->norm(c, rms, xb, x, AUX(SI__AUX_FFN_NORM), AUX(SI__AUX_FFN_NORM_B), d,
                      hp->norm_eps);
#undef AUX
    return rc;
}

/* The CPU twins of the CUDA kernels, step for step (codelets_cuda.h names
 * each kernel's twin). */
static int twin_residual(void *c, float *x, const float *const *parts, int n, const float *bias,
                         int64_t len)
{
    (void)c;
    for (int64_t i = 0; i < len; i++) {
        float s = parts[0][i];
        for (int j = 1; j < n; j++)
            s += parts[j][i];
        if (bias != NULL)
            s += bias[i];
        x[i] = x[i] + (s + 0.0f);
    }
    return 0;
}

static int twin_norm(void *c, bool rms, float *y, const float *x, const float *w, const float *b,
                     int64_t n, float eps)
{
    (void)c;
    if (rms)
        si_k_rmsnorm(y, x, w, n, eps);
    else
        si_k_layernorm(y, x, w, b, n, eps);
    return 0;
}

static int twin_matvec(void *c, const struct si_tensor *w, const void *data, const float *x,
                       float *y)
{
    return si__ffn_twin_ops.matvec(c, w->type, data, w->row_bytes, w->ne[1], w->ne[0], x, y);
}

static int twin_add(void *c, float *y, const float *a, const float *b, int64_t n)
{
    (void)c;
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
    return 0;
}

static int twin_rope(void *c, float *x, int n_heads, const struct si_hparams *hp, int pos,
                     float base, float scale)
{
    (void)c;
    si_k_rope(x, n_heads, hp->head_dim, hp->n_rot, hp->rope_kind, pos, base, scale);
    return 0;
}

static int twin_to_f16(void *c, uint16_t *dst, const float *src, int64_t n)
{
    (void)c;
    for (int64_t i = 0; i < n; i++)
        dst[i] = si_fp32_to_fp16(src[i]);
    return 0;
}

/* si_k_attn_f16 reads positions packed: the group's columns are gathered
 * first when they lie in a wider cache (a child of the CPU's copy). */
static int twin_attend(void *c, float *out, const float *q, const uint16_t *k, const uint16_t *v,
                       int first, int n_kv, int n_head, int n_head_kv, int head_dim, int64_t ld,
                       float scale)
{
    (void)c;
    const int64_t row = (int64_t)n_head_kv * head_dim;
    uint16_t *kp = malloc((size_t)(n_kv > 0 ? n_kv : 1) * (size_t)row * 2 * sizeof *kp);
    uint16_t *scratch = malloc((size_t)head_dim * 2 * sizeof *scratch);
    if (kp == NULL || scratch == NULL) {
        free(kp);
        free(scratch);
        return -1;
    }
    uint16_t *vp = kp + (size_t)(n_kv > 0 ? n_kv : 1) * (size_t)row;
    for (int t = 0; t < n_kv; t++) {
        memcpy(kp + (size_t)t * (size_t)row, k + (size_t)t * (size_t)ld, (size_t)row * 2);
        memcpy(vp + (size_t)t * (size_t)row, v + (size_t)t * (size_t)ld, (size_t)row * 2);
    }
    si_k_attn_f16(out, q, kp, vp, first, n_kv, n_head, n_head_kv, head_dim, scale, scratch);
    free(kp);
    free(scratch);
    return 0;
}

static const struct attn_ops twin_ops = {NULL,     twin_residual, twin_norm,   twin_matvec,
                                         twin_add, twin_rope,     twin_to_f16, twin_attend};

static void attn_twin(struct si_engine *e, int l, struct attn_io *io)
{
    const double t0 = si__now();
    if (attn_chain(&twin_ops, e, l, io) != 0)
        STARPU_ABORT_MSG("attn_L%d: the GPU form's CPU twin failed (out of memory)", l);
    si__account(e, SI_TASK_ATTN, t0);
}

#ifdef SI_USE_CUDA
static int cuda_residual(void *c, float *x, const float *const *parts, int n, const float *bias,
                         int64_t len)
{
    return (int)si_cuda_residual(x, parts, n, bias, len, (cudaStream_t)c);
}

static int cuda_norm(void *c, bool rms, float *y, const float *x, const float *w, const float *b,
                     int64_t n, float eps)
{
    return (int)(rms ? si_cuda_rmsnorm(y, x, w, n, eps, (cudaStream_t)c)
                     : si_cuda_layernorm(y, x, w, b, n, eps, (cudaStream_t)c));
}

static int cuda_matvec(void *c, const struct si_tensor *w, const void *data, const float *x,
                       float *y)
{
    return (int)si_cuda_matvec(w->type, data, w->row_bytes, w->ne[1], w->ne[0], x, y,
                               (cudaStream_t)c);
}

static int cuda_add(void *c, float *y, const float *a, const float *b, int64_t n)
{
    return (int)si_cuda_add(y, a, b, n, (cudaStream_t)c);
}

static int cuda_rope(void *c, float *x, int n_heads, const struct si_hparams *hp, int pos,
                     float base, float scale)
{
    return (int)si_cuda_rope(x, 1, n_heads, hp->head_dim, hp->n_rot, (int)hp->rope_kind, pos, base,
                             scale, (cudaStream_t)c);
}

static int cuda_to_f16(void *c, uint16_t *dst, const float *src, int64_t n)
{
    return (int)si_cuda_to_f16(dst, src, n, (cudaStream_t)c);
}

/* The kernel reads positions packed, as StarPU lays a child out on the GPU. */
static int cuda_attend(void *c, float *out, const float *q, const uint16_t *k, const uint16_t *v,
                       int first, int n_kv, int n_head, int n_head_kv, int head_dim, int64_t ld,
                       float scale)
{
    if (ld != (int64_t)n_head_kv * head_dim)
        return (int)cudaErrorInvalidValue;
    return (int)si_cuda_attn_f16(out, q, k, v, first, n_kv, n_head, n_head_kv, head_dim, scale,
                                 (cudaStream_t)c);
}

static void attn_cuda(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct attn_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    attn_bufs(&b, a->e, a->l, &io);
    const double t0 = si__now();
    const struct attn_ops ops = {(void *)starpu_cuda_get_local_stream(),
                                 cuda_residual,
                                 cuda_norm,
                                 cuda_matvec,
                                 cuda_add,
                                 cuda_rope,
                                 cuda_to_f16,
                                 cuda_attend};
    const int rc = attn_chain(&ops, a->e, a->l, &io);
    if (rc != 0)
        STARPU_CUDA_REPORT_ERROR(rc < 0 ? cudaErrorInvalidValue : (cudaError_t)rc);
    si__account(a->e, SI_TASK_ATTN, t0);
}
#endif

/*
 * Decoding's attention over SI_ATTN_SPLIT_MIN positions or more goes over
 * positions as well as kv heads (flash-decoding): the attn_L.j tasks then
 * prepare and cache their heads' q, k and v and leave the attention to np
 * tasks attn_pos_L.p, each over a run of the chunks of positions of
 * si_k_attn_split (model/kernels.h), every head, into part_p; the
 * attn_o_L.j tasks merge the chunks' results before their products.  The
 * chunks, and so the bits, depend on the positions alone: the reference's
 * attention computes the same.  np: this token's count at layer l, 0 when
 * the attention is not split over positions.
 */
static int pos_tasks_at(const struct si_engine *e, int l, int pos, int *c0, int *nc)
{
    const int first = attn_first(&e->m->hp, l, pos);
    if (e->dec.na <= 1 || !e->ref->p.kv_f16 || pos + 1 - first < SI_ATTN_SPLIT_MIN)
        return 0;
    *nc = si_k_attn_chunks(first, pos + 1, c0);
    return *nc < e->dec.na ? *nc : e->dec.na;
}
static int pos_tasks(const struct si_engine *e, int l, int *c0, int *nc)
{
    return pos_tasks_at(e, l, e->ref->n_past, c0, nc);
}

bool si__wo_fused_at(const struct si_engine *e, int l, int pos)
{
    int c0, nc;
    return e->lay.fuse_wo && !e->L[l].attn_gpu && pos_tasks_at(e, l, pos, &c0, &nc) == 0;
}
bool si__wo_fused(const struct si_engine *e, int l)
{
    return si__wo_fused_at(e, l, e->ref->n_past);
}

/* Task p's chunks of np: [c0 + p nc / np, c0 + (p + 1) nc / np). */
static int pos_chunk(int c0, int nc, int np, int p)
{
    return c0 + (int)((int64_t)p * nc / np);
}

/*
 * attn_L.j (attention split by kv heads): x (R), the carried FFN output
 * (R), [Wq, Wk, Wv (R)], K_j, V_j (RW), then att_j (W: its query heads'
 * outputs) or, where Wo is fused (si__wo_fused), [Wo (R)] and opart_j (W:
 * the product of its heads' columns of Wo with their outputs), [j = 0: x2
 * (W: the layer's input residual, for attn_out)].  The weights are buffers
 * only where a GPU is in the graph: on CPU workers alone they are read in
 * place, never written, and a buffer of theirs only cost the submission
 * and the workers a handle each (docs/measurements.md).
 */
struct agrp_io {
    const float *x;
    float *att, *op, *x2;
    struct si__carried c;
};

static void agrp_bufs(struct si__bufs *b, struct si_engine *e, int l, int j, struct agrp_io *io)
{
    struct si__layer_state *L = &e->L[l];
    io->x = si__vec(b, e->dec.h_x, STARPU_R);
    si__carried_bufs(b, e, l, &io->c);
    for (int i = 0; i < 3; i++) /* (read through e->w: buffers only with a GPU, codelets.h) */
        (void)si__wvec(b, e, L->h_w[i]);
    si__buf(b, e->dec.ng > 1 ? L->h_k_c[j] : L->h_k, STARPU_RW);
    si__buf(b, e->dec.ng > 1 ? L->h_v_c[j] : L->h_v, STARPU_RW);
    io->att = io->op = NULL;
    if (si__wo_fused(e, l)) {
        (void)si__wvec(b, e, L->h_w[3]);
        io->op = si__vec(b, e->dec.h_opart_c[j], STARPU_W);
    } else {
        io->att = si__vec(b, e->dec.ng > 1 ? e->dec.h_att_c[j] : e->dec.h_att, STARPU_W);
    }
    io->x2 = j == 0 ? si__vec(b, e->dec.h_x2, STARPU_W) : NULL;
}

/*
 * Layer l's input residual (layer l - 1's FFN added into x, by every group
 * alike), its normalised input, then for kv heads [a_g[j], a_g[j+1]) and
 * their query heads: their rows of q, k and v, biases, QK norm, RoPE, the
 * cache's columns, their attention (si_ref_attn_group).  The weights and
 * the cache are read through the reference's (the same memory: the
 * engine's copies, graph/data.c), whose group functions know the layout.
 */
static void attn_grp_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->w->layers[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    struct agrp_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    agrp_bufs(&b, e, a->l, a->j, &io);
    double t0 = si__now();
    const int j = a->j, hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    float *xl = io.x2 != NULL ? io.x2 : sc->xl;
    const double tm = si__residual_in(e, a->l, &io.c, io.x, xl, sc);
    si_ref_attn_input(e->ref, a->l, xl, sc->xn, sc->tmp);
    const int64_t g0 = e->dec.a_g[j], g1 = e->dec.a_g[j + 1];
    const int64_t q0 = g0 * group * hd, q1 = g1 * group * hd, k0 = g0 * hd, k1 = g1 * hd;
    struct si_tensor wq = si__rows_of(&W->wq, q0, q1), wk = si__rows_of(&W->wk, k0, k1),
                     wv = si__rows_of(&W->wv, k0, k1);
    int64_t nz;
    if (si__input_in(e, sc, a->l, SI_INPUT_QKV, sc->xn, hp->n_embd, &nz)) {
        si__matvec_t(e, &W->wq, &W->wq_t, q0, q1, sc, nz, sc->xn, sc->aq + q0);
        si__matvec_t(e, &W->wk, &W->wk_t, k0, k1, sc, nz, sc->xn, sc->ak + k0);
        si__matvec_t(e, &W->wv, &W->wv_t, k0, k1, sc, nz, sc->xn, sc->av + k0);
    } else {
        si_ref_matvec(e->p.ref.act_quant, sc->xq, sc->aq + q0, &wq, sc->xn);
        si_ref_matvec(e->p.ref.act_quant, sc->xq, sc->ak + k0, &wk, sc->xn);
        si_ref_matvec(e->p.ref.act_quant, sc->xq, sc->av + k0, &wv, sc->xn);
    }
    int c0, nc;
    if (pos_tasks(e, a->l, &c0, &nc) > 0) { /* q to att_j, for the attn_pos_L tasks */
        const int pos = e->ref->n_past;
        si_ref_attn_group_prepare_at(e->ref, a->l, pos, (int)g0, (int)g1, sc->aq, sc->ak, sc->av,
                                     sc->ascr);
        si_ref_attn_group_cache_at(e->ref, a->l, pos, (int)g0, (int)g1, sc->ak, sc->av);
        memcpy(io.att, sc->aq + q0, (size_t)(q1 - q0) * sizeof(float));
    } else {
        si_ref_attn_group(e->ref, a->l, (int)g0, (int)g1, sc->aq, sc->ak, sc->av, sc->aatt,
                          sc->ascr);
        if (io.att != NULL)
            memcpy(io.att, sc->aatt + q0, (size_t)(q1 - q0) * sizeof(float));
    }
    si__charge(e, SI_TASK_MERGE, tm);
    si__charge(e, SI_TASK_ATTN, si__now() - t0 - tm);
    if (io.op != NULL) { /* its heads' part of Wo's product, every row */
        t0 = si__now();
        si_ref_matvec_cols(e->p.ref.act_quant, sc->xq, io.op, &W->wo, sc->aatt, q0, q1);
        si__account(e, SI_TASK_ATTN_PROJ, t0);
    }
}

/*
 * attn_pos_L.p: att_* (R: every head's q, the groups' children in order,
 * consecutive parts of one array in main memory), K_g, V_g (R, every
 * group), part_p (W: its chunks' partial results, in order).
 */
struct apos_io {
    const float *q;
    float *part;
};

/* The attention output, every head, as a task that reads it all takes it
 * (R): whole where the groups' parts are joined (si__joins), else the parts
 * in order, consecutive in main memory.  Its first float. */
static const float *att_read(struct si__bufs *b, struct si_engine *e)
{
    return si__read_whole(b, e->dec.ng <= 1 || si__joins(e->dec.ng), e->dec.h_att, e->dec.ng,
                          e->dec.h_att_c);
}

static void apos_bufs(struct si__bufs *b, struct si_engine *e, int l, int p, struct apos_io *io)
{
    const struct si__layer_state *L = &e->L[l];
    io->q = att_read(b, e);
    for (int32_t g = 0; g < e->dec.ng; g++) {
        si__buf(b, e->dec.ng > 1 ? L->h_k_c[g] : L->h_k, STARPU_R);
        si__buf(b, e->dec.ng > 1 ? L->h_v_c[g] : L->h_v, STARPU_R);
    }
    io->part = si__vec(b, e->dec.h_part[p], STARPU_W);
}

/* The chunks of task p, every head, read through the reference's cache
 * (the same memory as the handles'). */
static void apos_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct si_hparams *hp = &e->m->hp;
    struct apos_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    apos_bufs(&b, e, a->l, a->j, &io);
    const double t0 = si__now();
    int c0, nc;
    const int np = pos_tasks(e, a->l, &c0, &nc), pos = e->ref->n_past;
    const int first = attn_first(hp, a->l, pos);
    const size_t pf = si_k_attn_part_floats(hp->n_head, hp->head_dim);
    const struct si_kv kv = si_ref_kv(e->ref, a->l);
    const int ca = pos_chunk(c0, nc, np, a->j), cb = pos_chunk(c0, nc, np, a->j + 1);
    for (int c = ca; c < cb; c++)
        si_k_attn_chunk(io.part + (size_t)(c - ca) * pf, io.q, &kv, first, pos + 1, c, 0,
                        hp->n_head, hp->n_head / hp->n_head_kv, hp->head_dim, hp->attn_scale,
                        si__scratch_of(e)->ascr);
    si__account(e, SI_TASK_ATTN, t0);
}

/* attn_o_L.j: att_* (R: the whole attention output, the groups' children
 * in order, consecutive parts of one array in main memory) or, split over
 * positions, part_* (R: the chunks' results, merged first); [Wo (R): as
 * attn_L.j's weights], o_j (W). */
struct ao_io {
    const float *att;
    const float *part[SI__MAX_SLICES + 1];
    float *y;
};

static void ao_bufs(struct si__bufs *b, struct si_engine *e, int l, int j, struct ao_io *io)
{
    int c0, nc;
    const int np = pos_tasks(e, l, &c0, &nc);
    io->att = NULL;
    for (int p = 0; p < np; p++)
        io->part[p] = si__vec(b, e->dec.h_part[p], STARPU_R);
    if (np == 0)
        io->att = att_read(b, e);
    (void)si__wvec(b, e, e->L[l].h_w[3]); /* (as attn_L.j's weights) */
    io->y = si__vec(b, e->dec.h_o[j], STARPU_W);
}

/* The position tasks' chunks merged into att (every head). */
static void ao_merge(const struct si_engine *e, int l, const struct ao_io *io, float *att)
{
    const struct si_hparams *hp = &e->m->hp;
    int c0, nc;
    const int np = pos_tasks(e, l, &c0, &nc);
    const size_t pf = si_k_attn_part_floats(hp->n_head, hp->head_dim);
    const float *parts[SI_ATTN_MAX_CHUNKS];
    for (int p = 0; p < np; p++)
        for (int c = pos_chunk(c0, nc, np, p); c < pos_chunk(c0, nc, np, p + 1); c++)
            parts[c - c0] = io->part[p] + (size_t)(c - pos_chunk(c0, nc, np, p)) * pf;
    si_k_attn_merge(att, parts, nc, hp->n_head, hp->head_dim);
}

/* Rows [a_o[j], a_o[j+1]) of Wo's product with the attention output. */
static void ao_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    struct ao_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    ao_bufs(&b, e, a->l, a->j, &io);
    double t0 = si__now();
    const float *att = io.att;
    if (att == NULL) { /* split over positions */
        ao_merge(e, a->l, &io, sc->aatt);
        att = sc->aatt;
    }
    const struct si_layer *W = &e->w->layers[a->l];
    const int64_t o0 = e->dec.a_o[a->j], o1 = e->dec.a_o[a->j + 1];
    if (e->p.ref.input_thresholds != NULL) {
        /* input sparsity zeroes entries: this task's own copy */
        const int64_t qd = (int64_t)e->m->hp.n_head * e->m->hp.head_dim;
        if (att != sc->aatt)
            memcpy(sc->aatt, att, (size_t)qd * sizeof *att);
        att = sc->aatt;
        int64_t nz;
        if (si__input_in(e, sc, a->l, SI_INPUT_O, sc->aatt, qd, &nz)) {
            si__matvec_t(e, &W->wo, &W->wo_t, o0, o1, sc, nz, sc->aatt, io.y);
            si__account(e, SI_TASK_ATTN_PROJ, t0);
            return;
        }
    }
    struct si_tensor wo = si__rows_of(&W->wo, o0, o1);
    si_ref_matvec(e->p.ref.act_quant, sc->xq, io.y, &wo, att);
    si__account(e, SI_TASK_ATTN_PROJ, t0);
}

/* attn_out_L: x2 (R: the layer's input residual), o_all (R), x (W: the
 * residual after attention), xb (W: the FFN's input), [xb3 (W)]. */
struct aout_io {
    const float *x2;
    const float *o;
    float *x, *xb, *xb3;
};

static void aout_bufs(struct si__bufs *b, struct si_engine *e, int l, struct aout_io *io)
{
    io->x2 = si__vec(b, e->dec.h_x2, STARPU_R);
    int32_t n;
    io->o = si__o_read(b, e, l, &n); /* (never fused: fuse_wo needs fuse_out) */
    io->x = si__vec(b, e->dec.h_x, STARPU_W);
    io->xb = si__vec(b, e->dec.h_ffn_in, STARPU_W);
    io->xb3 = e->dec.h_xb3 != NULL ? si__vec(b, e->dec.h_xb3, STARPU_W) : NULL;
}

/* The projection's slices gathered, then the residual and the FFN's input. */
static void aout_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    struct aout_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    aout_bufs(&b, e, a->l, &io);
    double t0 = si__now();
    memcpy(sc->xf, io.o, (size_t)e->m->hp.n_embd * sizeof(float));
    si_ref_attn_finish_into(e->ref, a->l, io.x2, sc->xf, io.x, io.xb, io.xb3, sc->tmp);
    si__account(e, SI_TASK_ATTN, t0);
}

/* Wo's slices o_j, children of o_all (or, fused, the groups' partial
 * products, children of opart), joined after their tasks for the tasks that
 * read them all (si__joins), split again after those readers
 * (si__split_o). */
static void join_o(struct si_engine *e, bool fused)
{
    if (e->ip.on) /* (in place: no partitions) */
        return;
    if (fused && si__joins(e->dec.ng))
        si__join(&e->dec.o_join, e->dec.h_opart, (unsigned)e->dec.ng, e->dec.h_opart_c);
    else if (!fused && si__joins(e->dec.na))
        si__join(&e->dec.o_join, e->dec.h_o_all, (unsigned)e->dec.na, e->dec.h_o);
}

void si__split_o(struct si_engine *e)
{
    si__unjoin(&e->dec.o_join);
}

/* Attention split: attn_L.j for each kv-head group, attn_o_L.j for each
 * row slice of Wo (none where the groups multiply Wo: si__wo_fused), then
 * attn_out_L unless the FFN slices do its work (fuse_out). */
int si__submit_attn_split(struct si_engine *e, int l, int32_t token)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    struct si__bufs b;
    int rc = 0;
    si__split_o(e); /* (left joined by a failed submission) */
    for (int32_t j = 0; j < e->dec.ng && rc == 0; j++) {
        b = si__bufs_collect(&a);
        agrp_bufs(&b, e, l, j, &(struct agrp_io){0});
        rc = si__submit(e, &si__cl_agrp, L->name_agrp[j], l, j, token, &a, 0);
    }
    if (si__wo_fused(e, l)) { /* the FFN slices add the groups' products */
        join_o(e, true);
        return rc;
    }
    const bool join_att = e->dec.ng > 1 && si__joins(e->dec.ng) && !e->ip.on;
    if (join_att) /* the groups' outputs whole for the tasks that read them all */
        starpu_data_unpartition_submit(e->dec.h_att, (unsigned)e->dec.ng, e->dec.h_att_c,
                                       STARPU_MAIN_RAM);
    int c0, nc;
    const int np = pos_tasks(e, l, &c0, &nc);
    for (int32_t p = 0; p < np && rc == 0; p++) {
        b = si__bufs_collect(&a);
        apos_bufs(&b, e, l, p, &(struct apos_io){0});
        rc = si__submit(e, &si__cl_apos, L->name_apos[p], l, p, token, &a, 0);
    }
    for (int32_t j = 0; j < e->dec.na && rc == 0; j++) {
        b = si__bufs_collect(&a);
        ao_bufs(&b, e, l, j, &(struct ao_io){0});
        rc = si__submit(e, &si__cl_ao, L->name_ao[j], l, j, token, &a, 0);
    }
    if (join_att)
        starpu_data_partition_submit(e->dec.h_att, (unsigned)e->dec.ng, e->dec.h_att_c);
    join_o(e, false);
    if (!e->lay.fuse_out) { /* else the FFN slices read o_all (graph/decode.c) */
        if (rc == 0) {
            b = si__bufs_collect(&a);
            aout_bufs(&b, e, l, &(struct aout_io){0});
            rc = si__submit(e, &si__cl_aout, L->name_aout, l, -1, token, &a, 0);
        }
        si__split_o(e);
    }
    return rc;
}

static struct starpu_perfmodel attn_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_f32"};
static struct starpu_perfmodel agrp_model = {.type = STARPU_HISTORY_BASED,
                                             .symbol = "si_attn_group"};
static struct starpu_perfmodel apos_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_pos"};
static struct starpu_perfmodel ao_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_o"};
static struct starpu_perfmodel aout_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_out"};

struct starpu_codelet si__cl_attn = {
    .cpu_funcs = {attn_cpu},
#ifdef SI_USE_CUDA
    .cuda_funcs = {attn_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &attn_model,
    .name = "attn",
};
struct starpu_codelet si__cl_agrp = {
    .cpu_funcs = {attn_grp_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &agrp_model,
    .name = "attn_grp",
};
struct starpu_codelet si__cl_apos = {
    .cpu_funcs = {apos_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &apos_model,
    .name = "attn_pos",
};
struct starpu_codelet si__cl_ao = {
    .cpu_funcs = {ao_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &ao_model,
    .name = "attn_o",
};
struct starpu_codelet si__cl_aout = {
    .cpu_funcs = {aout_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &aout_model,
    .name = "attn_out",
};
