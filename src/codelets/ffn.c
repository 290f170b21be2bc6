/*
 * ffn.c - the FFN slice tasks (hot and cold, CPU and CUDA) and dense mode's down projection in row
 * blocks.
 */
#include "codelets/codelets.h"

#include "codelets/ffn_sparse.h"
#include "config.h"
#include "model/act.h"
#include "model/forward.h"
#include "model/quants.h"

#include <math.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

#ifdef SI_USE_CUDA
#include "codelets/codelets_cuda.h"
#include <cuda_runtime_api.h>
#endif

/*
 * Dense layout, neurons [n0, n0 + n) in file order (gate and up: their
 * rows, at the slice's buffers): their activations into h, as the
 * reference computes them; the down projection runs afterwards over all the
 * neurons (down_cpu).  Where the engine packed the layer's gate and up
 * (graph/weights.c; n0 a multiple of 8), their dots come 8 rows at a time
 * (si_ref_matvec_act), the same values.  Returns n: dense mode computes
 * every neuron.
 */
static int64_t ffn_dense_slice(struct si_engine *e, int l, int64_t n0, const float *xb,
                               const char *gate, const char *up, const float *b, int64_t n,
                               struct si__scratch *sc, float *h)
{
    const struct si_layer *W = &e->w->layers[l];
    const struct si_hparams *hp = &e->m->hp;
    if (e->p.ref.input_thresholds != NULL) {
        /* input sparsity zeroes entries: this task's own copy */
        if (xb != sc->xn) {
            memcpy(sc->xn, xb, (size_t)hp->n_embd * sizeof *xb);
            xb = sc->xn;
        }
        int64_t nz;
        if (si__input_in(e, sc, l, SI_INPUT_FFN, sc->xn, hp->n_embd, &nz)) {
            si__matvec_t(e, &W->ffn_up, &W->ffn_up_t, n0, n0 + n, sc, nz, sc->xn, h);
            if (gate != NULL)
                si__matvec_t(e, &W->ffn_gate, &W->ffn_gate_t, n0, n0 + n, sc, nz, sc->xn, sc->g);
            for (int64_t i = 0; i < n; i++) {
                const float u = b != NULL ? h[i] + b[i] : h[i];
                h[i] = hp->ffn_kind == SI_FFN_PLAIN
                           ? si_act_apply(hp->act, u)
                           : si_act_gated(hp->ffn_kind, si_act_apply(hp->act, sc->g[i]), u);
            }
            return n;
        }
    }
    const uint32_t t = W->ffn_up.type;
    const void *xa = si__ffn_convert_input(e, t, xb, sc->xq);
    if (xa != NULL && W->ffn_up.pk > 0) {
        struct si_tensor uv = si__rows_of(&W->ffn_up, n0, n0 + n);
        uv.data = up;
        si_ref_matvec_act(h, &uv, xa);
        float *g = sc->g;
        if (gate != NULL) {
            struct si_tensor gv = si__rows_of(&W->ffn_gate, n0, n0 + n);
            gv.data = gate;
            si_ref_matvec_act(g, &gv, xa);
        }
        for (int64_t i = 0; i < n; i++) {
            const float u = b != NULL ? h[i] + b[i] : h[i];
            h[i] = hp->ffn_kind == SI_FFN_PLAIN
                       ? si_act_apply(hp->act, u)
                       : si_act_gated(hp->ffn_kind, si_act_apply(hp->act, g[i]), u);
        }
        return n;
    }
    const size_t rb = W->ffn_up.row_bytes;
    for (int64_t i = 0; i < n; i++)
        h[i] = si__ffn_neuron(e, t, gate != NULL ? gate + (size_t)i * rb : NULL,
                              up + (size_t)i * rb, b != NULL ? b + i : NULL, xa, xb);
    return n; /* every neuron, zero or not */
}

/*
 * Sparse layouts, the slice's n neurons: their records at rec, and in gate
 * mode their gating rows at pre.  Predictor mode computes the positions in
 * idx (ending at the first -1) with si_k_ffn_act_sparse; gate mode takes
 * every gating dot and only then the up dots of the neurons it lets
 * through.  y = the sum of the activations times the down_t rows
 * (si_k_ffn_down_sparse).  Returns how many activations are not zero.
 */
static int64_t ffn_sparse_slice(struct si_engine *e, const struct si__ffn_fmt *f, const float *xb,
                                const char *pre, int64_t pre_pk, const char *rec, const float *b,
                                const int32_t *idx, int64_t n, float thr, struct si__scratch *sc,
                                float *y, int64_t *rd)
{
    const struct si_hparams *hp = &e->m->hp;
    const int64_t d = hp->n_embd;
    const size_t rb = f->rec_bytes;
    const uint32_t t = f->gu_type;
    const void *xa = si__ffn_convert_input(e, t, xb, sc->xq);
    const char *gate = f->gate_off >= 0 ? rec + f->gate_off : NULL;
    const char *up = f->up_off >= 0 ? rec + f->up_off : NULL;
    int64_t k = 0;
    if (idx != NULL) {
        while (k < n && idx[k] >= 0)
            k++;
        if (idx != sc->ix) /* predict_slice's list is there already */
            memcpy(sc->ix, idx, (size_t)k * sizeof *idx);
        si__ffn_act_records(e, f, gate, up, b, xa, xb, sc->ix, k, sc->h);
        *rd = k * (int64_t)f->gu_row * (gate != NULL ? 2 : 1);
    } else {
        *rd = n * (int64_t)f->gu_row; /* every gating row */
        /* Every gating dot first, row after row: the rows are dense, and
         * one sequential stream is what this machine reads fastest
         * (interleaving 2 or 4 rows read half as fast from DRAM:
         * docs/measurements.md). */
        float *g = sc->g;
        if (pre_pk > 0) {
            const struct si_tensor v = si__pre_rows(f, d, pre, n, pre_pk);
            si_ref_matvec_act(g, &v, xa);
        } else {
            for (int64_t i = 0; i < n; i++)
                g[i] = si__ffn_dot(t, pre + (size_t)i * f->gu_row, xa, xb, d);
        }
        if (hp->ffn_kind == SI_FFN_PLAIN) {
            for (int64_t i = 0; i < n; i++) {
                const float h = si_act_apply(hp->act, b != NULL ? g[i] + b[i] : g[i]);
                if (h != 0.0f) {
                    sc->h[k] = h;
                    sc->ix[k++] = (int32_t)i;
                }
            }
        } else {
            /* The neurons the gate lets through, then their up dots (scattered
             * records, eight at a time, the next eight prefetched). */
            const int64_t m = si__ffn_gate_pass(e, t, up, rb, b, g, n, thr, xa, xb, sc);
            *rd += m * (int64_t)f->gu_row;
            /* The zeros out, the order kept (the down sums' order). */
            for (int64_t q = 0; q < m; q++)
                if (sc->h[q] != 0.0f) {
                    sc->h[k] = sc->h[q];
                    sc->ix[k++] = sc->ix[q];
                }
        }
    }
    si_k_ffn_down_sparse(f->dt_type, rec + f->dt_off, rb, d, sc->h, sc->ix, k, y);
    int64_t computed = 0;
    for (int64_t q = 0; q < k; q++)
        computed += sc->h[q] != 0.0f;
    *rd += computed * (int64_t)f->dt_row; /* the kernel skips zeros */
    return computed;
}

/*
 * Predictor mode with fuse_pred: slice j's own prediction, the predictor
 * task's arithmetic (si_ref_predict) on fc1 whole and the rows of fc2 of
 * the slice's positions (from the group of 8 that holds the first: fc2 is
 * packed in place), into sc->ix: the slice's firing positions, then -1
 * (when fewer than all).  fc1 and fc2 are the buffers of the layer's
 * handles (fc2 in position order).
 */
static const int32_t *predict_slice(struct si_engine *e, int l, int j, const float *xb,
                                    const void *fc1, const void *fc2, struct si__scratch *sc)
{
    const struct si__layer_state *L = &e->L[l];
    const struct si_layer *W = &e->w->layers[l];
    const double t0 = si__now();
    const int64_t p0 = L->s0[j], n = L->s0[j + 1] - p0;
    const int64_t r0 = p0 < L->fc2_pk ? p0 / 8 * 8 : p0; /* a group's start */
    struct si_tensor w1 = W->fc1, w2 = W->fc2;
    w1.data = fc1;
    w2.data = fc2;
    w2.pk = L->fc2_pk;
    const struct si_tensor v = si__rows_of(&w2, r0, p0 + n);
    /* sc->g (the gating dots, unused in predictor mode) holds the bytes */
    uint8_t *sel = (uint8_t *)sc->g;
    /* fc2's outputs after the partial rows of redux mode, which may be
     * this slice's output (engine.c sizes sc->y for both) */
    const struct si_hparams *hp = &e->m->hp;
    float *y2 = sc->y + ((size_t)(hp->n_ff / e->lay.chunk) + 1) * (size_t)hp->n_embd;
    si_ref_predict(&w1, &v, e->m->predictor_threshold, e->p.ref.act_quant, sc->xq, xb, sc->h, y2,
                   sel);
    int64_t k = 0;
    for (int64_t q = 0; q < n; q++)
        if (sel[p0 - r0 + q])
            sc->ix[k++] = (int32_t)q;
    if (k < n)
        sc->ix[k] = -1;
    si__account(e, SI_TASK_PRED, t0);
    return sc->ix;
}

/*
 * ffn_hot_L, ffn_cold_L.j (an FFN slice), in order:
 *   the input: ffn_in (R), and x (R: the residual its norm read) where the
 *     slice's fused predictor reads that (si__ffn_reads_residual); or, with
 *     fuse_out, x2 and o_all (R; or the groups' partial products where
 *     they multiply Wo, si__o_read), from which each slice makes the
 *     input itself (attn_out's work);
 *   the slice's weights (si__ffn_slice_bufs; like every weight, buffers
 *     only where a GPU is in the graph: si__wvec);
 *   predictor mode: [fc1, fc2 (R)] where each slice predicts its own
 *     neurons (fuse_pred), else idx j (R);
 *   out: the slice's partial output (W: rows x n_embd; dense: its
 *     activations) or, in redux mode, the layer's output (REDUX);
 *   on CUDA: iota (R), a scratch of 2 n_ff floats;
 *   fuse_out, slice 0: x (W: the residual after attention), [xb3 (W)].
 */
struct ffn_io {
    const float *xb, *xr, *x2;
    const float *o; /* Wo's product (no 1), or the first of no partial products,
                     * rows of n_embd to add in order (si__o_read) */
    int32_t no;
    struct si__ffn_slice w;
    const void *fc1, *fc2;
    const int32_t *idx, *iota;
    float *out, *h, *x_out, *xb3;
};

static void ffn_bufs(struct si__bufs *b, struct si_engine *e, int l, int j, bool gpu,
                     struct ffn_io *io)
{
    struct si__layer_state *L = &e->L[l];
    memset(io, 0, sizeof *io);
    if (e->lay.fuse_out) {
        io->x2 = si__vec(b, e->dec.h_x2, STARPU_R);
        io->o = si__o_read(b, e, l, &io->no);
    } else {
        io->xb = si__vec(b, e->dec.h_ffn_in, STARPU_R);
        if (si__ffn_reads_residual(e))
            io->xr = si__vec(b, e->dec.h_x, STARPU_R);
    }
    si__ffn_slice_bufs(b, e, l, j, &io->w);
    if (e->p.mode == SI_SPARSITY_PREDICTOR && e->lay.fuse_pred) {
        io->fc1 = si__wvec(b, e, L->h_fc1);
        io->fc2 = si__wvec(b, e, L->h_fc2);
    } else if (e->p.mode == SI_SPARSITY_PREDICTOR) {
        io->idx = si__vec(b, L->h_idx_c[j], STARPU_R);
    }
    if (e->p.redux)
        io->out = si__vec(b, L->h_y, STARPU_REDUX);
    else
        io->out = si__vec(b, L->h_part_c[j], STARPU_W);
    if (gpu) {
        io->iota = si__vec(b, e->dec.h_iota, STARPU_R);
        io->h = si__vec(b, e->dec.h_hscratch, STARPU_SCRATCH);
    }
    if (e->lay.fuse_out && j == 0) { /* the residual for the next layer */
        io->x_out = si__vec(b, e->dec.h_x, STARPU_W);
        if (e->dec.h_xb3 != NULL)
            io->xb3 = si__vec(b, e->dec.h_xb3, STARPU_W);
    }
}

/*
 * The FFN's input of slice j: ffn_in, or with fuse_out, attn_out's work
 * done by each slice alike from x2 and o_all: the residual after attention
 * and its normalised input, in scratch (slice 0 also writes the residual
 * into x and, with a parallel residual, the attention output into xb3).
 * *xr: the residual (NULL where the slice does not read it).
 */
static const float *ffn_input(struct si_engine *e, int l, const struct ffn_io *io,
                              struct si__scratch *sc, const float **xr)
{
    *xr = io->xr;
    if (!e->lay.fuse_out)
        return io->xb;
    const int64_t d = e->m->hp.n_embd;
    memcpy(sc->xf, io->o, (size_t)d * sizeof(float));
    for (int32_t g = 1; g < io->no; g++) { /* the groups' products, in order */
        const float *og = io->o + (size_t)g * (size_t)d;
        for (int64_t i = 0; i < d; i++)
            sc->xf[i] += og[i];
    }
    float *x_out = io->x_out != NULL ? io->x_out : sc->xl;
    float *xb3 = io->x_out != NULL && io->xb3 != NULL ? io->xb3 : sc->xo;
    si_ref_attn_finish_into(e->ref, l, io->x2, sc->xf, x_out, sc->xn, xb3, sc->tmp);
    *xr = x_out;
    return sc->xn;
}

static void ffn_twin(struct si_engine *e, int l, int j, const struct ffn_io *io);

/* The slice's neurons for the token on a CPU worker (or, for the hot slice
 * with gpu_twin, the GPU's steps on this CPU worker). */
static void ffn_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct ffn_io io;
    struct si__bufs bw = si__bufs_task(buffers, cl_arg);
    ffn_bufs(&bw, e, a->l, a->j, false, &io);
    if (e->p.gpu_twin && si__is_hot(e, a->l, a->j) && !e->p.redux && !e->lay.fuse_out &&
        !(e->p.mode == SI_SPARSITY_PREDICTOR && e->lay.fuse_pred)) {
        ffn_twin(e, a->l, a->j, &io); /* the GPU's steps, on this CPU worker */
        return;
    }
    struct si__layer_state *L = &e->L[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    const int64_t d = e->m->hp.n_embd;
    double t0 = si__now();
    const float *xr;
    const float *xb = ffn_input(e, a->l, &io, sc, &xr);
    const int64_t n = L->s0[a->j + 1] - L->s0[a->j];
    float *out = io.out;
    float *y;
    int64_t computed, rd = 0;
    if (!e->lay.sparse) {
        y = out;
        computed = ffn_dense_slice(e, a->l, L->s0[a->j], xb, io.w.gate, io.w.up, io.w.b, n, sc, y);
        rd = n * (int64_t)L->f.gu_row * (io.w.gate != NULL ? 2 : 1);
    } else {
        const int32_t *idx = io.idx;
        if (io.fc1 != NULL) {
            const double tp = si__now();
            idx = predict_slice(e, a->l, a->j, si_ref_pred_in(e->m, xr, xb, NULL), io.fc1, io.fc2,
                                sc);
            t0 += si__now() - tp; /* predict_slice counts its own time */
            if (a->j > 0)         /* fc1 read again: every slice takes it whole */
                rd += (int64_t)e->w->layers[a->l].fc1.nbytes;
        }
        y = e->p.redux ? sc->y : out;
        int64_t rd_ffn = 0;
        computed = ffn_sparse_slice(e, &L->f, xb, io.w.pre, L->pre_pk[a->j], io.w.rec, io.w.b, idx,
                                    n, e->lay.gthr[a->l], sc, y, &rd_ffn);
        rd += rd_ffn;
    }
    if (e->p.redux) /* add the rows into this worker's share of the output */
        for (int32_t r = 0; r < L->rows[a->j]; r++)
            for (int64_t o = 0; o < d; o++)
                out[o] += y[(size_t)r * d + o];
    L->active[a->j] = computed;
    L->rd[a->j] = rd;
    si__account(e, si__is_hot(e, a->l, a->j) ? SI_TASK_FFN_HOT : SI_TASK_FFN_COLD, t0);
}

int si__submit_ffn(struct si_engine *e, int l, int j, int32_t token)
{
    const bool hot = si__is_hot(e, l, j), gpu = hot && e->gpu.cuda_hot;
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    struct ffn_io io;
    ffn_bufs(&b, e, l, j, gpu, &io);
    return si__submit(e, hot ? &si__cl_hot : &si__cl_cold, e->L[l].name_ffn[j], l, j, token, &a,
                      gpu ? STARPU_CUDA : STARPU_CPU);
}

/*
 * The hot slice's GPU form for one token (what ffn_cuda runs, and bffn's
 * CUDA function for each token of a batch), over an implementation of its
 * kernels: CUDA's, or their CPU twins (si__ffn_twin_ops: a CPU worker in the
 * GPU's stead with params.gpu_twin).  Dots take the input in float (no
 * act_quant), so results differ from the CPU's by that rounding.  Dense mode
 * writes the activations (the down projection runs on CPU workers).  Gate
 * mode computes every neuron of the slice (they are the ones that fire most)
 * and the down kernel skips the zeros; its threshold applies on CPU workers
 * only.  idx: the predicted positions (NULL: iota, every neuron); h: 2 n_ff
 * floats of scratch.
 */
int si__ffn_gpu_token(const struct si__ffn_ops *op, const struct si_engine *e, int l, int j,
                      const struct si__ffn_slice *w, const float *xb, const int32_t *idx,
                      const int32_t *iota, float *out, float *h)
{
    const struct si__layer_state *L = &e->L[l];
    const struct si__ffn_fmt *f = &L->f;
    const struct si_hparams *hp = &e->m->hp;
    const int64_t d = hp->n_embd, n = L->s0[j + 1] - L->s0[j];
    const int kind = (int)hp->ffn_kind, act = (int)hp->act;
    void *c = op->c;
    int rc;
    if (e->lay.pre_sep) {
        /* gating rows and up rows have different strides: two products */
        float *g = h + hp->n_ff;
        if (hp->ffn_kind == SI_FFN_PLAIN) {
            rc = op->matvec(c, f->gu_type, w->pre, f->gu_row, n, d, xb, h);
            if (rc == 0)
                rc = op->combine(c, NULL, h, w->b, n, kind, act, h);
        } else {
            rc = op->matvec(c, f->gu_type, w->pre, f->gu_row, n, d, xb, g);
            if (rc == 0)
                rc = op->matvec(c, f->gu_type, w->up, f->rec_bytes, n, d, xb, h);
            if (rc == 0)
                rc = op->combine(c, g, h, w->b, n, kind, act, h);
        }
    } else {
        rc = op->gate_up(c, f->gu_type, w->gate, w->up, e->lay.sparse ? f->rec_bytes : f->gu_row, n,
                         d, w->b, xb, idx != NULL ? idx : iota, n, kind, act,
                         e->lay.sparse ? h : out);
    }
    if (rc == 0 && e->lay.sparse)
        rc = op->down(c, f->dt_type, w->rec + f->dt_off, f->rec_bytes, n, d, h,
                      idx != NULL ? idx : iota, n, out);
    return rc;
}

/* The CPU twins of the CUDA FFN kernels (codelets_cuda.h), in float. */
static int twin_matvec(void *c, uint32_t type, const void *w, size_t stride, int64_t n_rows,
                       int64_t n_cols, const float *x, float *y)
{
    (void)c;
    for (int64_t r = 0; r < n_rows; r++)
        y[r] = si_vec_dot(type, (const char *)w + (size_t)r * stride, x, n_cols);
    return 0;
}

static float twin_neuron(int kind, int act, float g, float u)
{
    if (kind == SI_FFN_PLAIN)
        return si_act_apply((enum si_act)act, u);
    return si_act_gated((enum si_ffn_kind)kind, si_act_apply((enum si_act)act, g), u);
}

static int twin_gate_up(void *c, uint32_t type, const void *gate, const void *up, size_t stride,
                        int64_t n_ff, int64_t n_embd, const float *b, const float *x,
                        const int32_t *idx, int64_t n_idx, int kind, int act, float *h)
{
    (void)c;
    for (int64_t k = 0; k < n_idx; k++) {
        const int32_t i = idx[k];
        if (i < 0 || i >= n_ff) {
            h[k] = 0.0f;
            continue;
        }
        const float g = kind == SI_FFN_PLAIN
                            ? 0.0f
                            : si_vec_dot(type, (const char *)gate + (size_t)i * stride, x, n_embd);
        const float u = si_vec_dot(type, (const char *)up + (size_t)i * stride, x, n_embd) +
                        (b != NULL ? b[i] : 0.0f);
        h[k] = twin_neuron(kind, act, g, u);
    }
    return 0;
}

static int twin_combine(void *c, const float *g, const float *u, const float *b, int64_t n,
                        int kind, int act, float *h)
{
    (void)c;
    for (int64_t i = 0; i < n; i++)
        h[i] = twin_neuron(kind, act, g != NULL ? g[i] : 0.0f, u[i] + (b != NULL ? b[i] : 0.0f));
    return 0;
}

static int twin_down(void *c, uint32_t type, const void *down_t, size_t stride, int64_t n_ff,
                     int64_t n_embd, const float *h, const int32_t *idx, int64_t n_idx, float *y)
{
    (void)c;
    memset(y, 0, (size_t)n_embd * sizeof *y);
    for (int64_t k = 0; k < n_idx; k++)
        if (h[k] != 0.0f && idx[k] >= 0 && idx[k] < n_ff)
            si_vec_mad(type, (const char *)down_t + (size_t)idx[k] * stride, h[k], y, n_embd);
    return 0;
}

const struct si__ffn_ops si__ffn_twin_ops = {NULL, twin_matvec, twin_gate_up, twin_combine,
                                             twin_down};

void si__ffn_slice_bufs(struct si__bufs *b, const struct si_engine *e, int l, int j,
                        struct si__ffn_slice *w)
{
    const struct si__layer_state *L = &e->L[l];
    const struct si__ffn_fmt *f = &L->f;
    memset(w, 0, sizeof *w);
    if (!e->lay.sparse) {
        if (e->lay.has_gate)
            w->gate = si__wvec(b, e, L->h_gate_c[j]);
        w->up = si__wvec(b, e, L->h_up_c[j]);
    } else {
        if (e->lay.pre_sep)
            w->pre = si__wvec(b, e, L->h_gate_c[j]);
        w->rec = si__wvec(b, e, L->h_rec_c[j]);
        if (w->rec != NULL) {
            w->gate = f->gate_off >= 0 ? w->rec + f->gate_off : NULL;
            w->up = f->up_off >= 0 ? w->rec + f->up_off : NULL;
        }
    }
    /* The up bias (zeros in the handle for files without one: not added) */
    const float *bias = si__wvec(b, e, L->h_upb_c[j]);
    w->b = e->w->layers[l].ffn_up_b.data != NULL ? bias : NULL;
}

/* Bytes the GPU form of slice j reads for a token: the whole slice (an upper
 * bound in predictor mode, whose mask stays on the GPU). */
static int64_t gpu_slice_bytes(const struct si_engine *e, int l, int j)
{
    const struct si__layer_state *L = &e->L[l];
    const int64_t n = L->s0[j + 1] - L->s0[j];
    return !e->lay.sparse ? n * (int64_t)L->f.gu_row * (e->lay.has_gate ? 2 : 1)
                          : n * (int64_t)(L->f.rec_bytes + (e->lay.pre_sep ? L->f.gu_row : 0));
}

/* The hot slice's task in its GPU form: iota and h, the GPU's (ffn_bufs'),
 * or the CPU twin's. */
static int hot_gpu_form(const struct si__ffn_ops *op, struct si_engine *e, int l, int j,
                        const struct ffn_io *io, const int32_t *iota, float *h)
{
    struct si__layer_state *L = &e->L[l];
    const int32_t *idx = e->lay.sparse ? io->idx : NULL;
    const int rc = si__ffn_gpu_token(op, e, l, j, &io->w, io->xb, idx, iota, io->out, h);
    L->active[j] = -1; /* not counted on the GPU (the mask stays there) */
    L->rd[j] = gpu_slice_bytes(e, l, j);
    return rc;
}

/* ... on the CPU worker that stands in for the GPU (gpu_twin). */
static void ffn_twin(struct si_engine *e, int l, int j, const struct ffn_io *io)
{
    const double t0 = si__now();
    float *h = malloc(2 * (size_t)e->m->hp.n_ff * sizeof *h); /* the GPU's scratch */
    if (h == NULL)
        STARPU_ABORT_MSG("ffn_hot_L%d: the GPU form's CPU twin is out of memory", l);
    hot_gpu_form(&si__ffn_twin_ops, e, l, j, io, e->lay.iota, h);
    free(h);
    si__account(e, SI_TASK_FFN_HOT, t0);
}

#ifdef SI_USE_CUDA
static int cuda_matvec(void *c, uint32_t type, const void *w, size_t stride, int64_t n_rows,
                       int64_t n_cols, const float *x, float *y)
{
    return (int)si_cuda_matvec(type, w, stride, n_rows, n_cols, x, y, (cudaStream_t)c);
}

static int cuda_gate_up(void *c, uint32_t type, const void *gate, const void *up, size_t stride,
                        int64_t n_ff, int64_t n_embd, const float *b, const float *x,
                        const int32_t *idx, int64_t n_idx, int kind, int act, float *h)
{
    return (int)si_cuda_ffn_gate_up(type, gate, up, stride, n_ff, n_embd, b, x, idx, n_idx, kind,
                                    act, h, (cudaStream_t)c);
}

static int cuda_combine(void *c, const float *g, const float *u, const float *b, int64_t n,
                        int kind, int act, float *h)
{
    return (int)si_cuda_ffn_combine(g, u, b, n, kind, act, h, (cudaStream_t)c);
}

static int cuda_down(void *c, uint32_t type, const void *down_t, size_t stride, int64_t n_ff,
                     int64_t n_embd, const float *h, const int32_t *idx, int64_t n_idx, float *y)
{
    return (int)si_cuda_ffn_down(type, down_t, stride, n_ff, n_embd, h, idx, n_idx, y,
                                 (cudaStream_t)c);
}

struct si__ffn_ops si__ffn_cuda_ops(void *stream)
{
    return (struct si__ffn_ops){stream, cuda_matvec, cuda_gate_up, cuda_combine, cuda_down};
}

/* ... on a CUDA worker. */
static void ffn_cuda(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    const double t0 = si__now();
    struct ffn_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    ffn_bufs(&b, a->e, a->l, a->j, true, &io);
    const struct si__ffn_ops op = si__ffn_cuda_ops((void *)starpu_cuda_get_local_stream());
    const int rc = hot_gpu_form(&op, a->e, a->l, a->j, &io, io.iota, io.h);
    if (rc != 0)
        STARPU_CUDA_REPORT_ERROR((cudaError_t)rc);
    si__account(a->e, SI_TASK_FFN_HOT, t0);
}
#endif

/*
 * Dense mode: the activations of layer l's slices, in order, gathered from
 * their outputs act[0 .. nsl) into h (n_ff floats), for token t of a batch
 * (each slice's output token-major, as many floats per token as the slice
 * has neurons; t = 0 for one token).
 */
void si__ffn_gather(const struct si__layer_state *L, const float *const *act, int64_t t, float *h)
{
    for (int32_t j = 0; j < L->nsl; j++) {
        const int64_t n = L->s0[j + 1] - L->s0[j];
        memcpy(h + L->s0[j], act[j] + t * n, (size_t)n * sizeof(float));
    }
}

/* See codelets.h. */
void si__down_bufs(struct si__bufs *b, struct si_engine *e, int l, int k, bool batch,
                   struct si__down_io *io)
{
    struct si__layer_state *L = &e->L[l];
    if (!batch && si__down_joins(e, l)) { /* joined (graph/decode.c): the whole, then its parts */
        const float *all = si__vec(b, L->h_part, STARPU_R);
        size_t at = 0;
        for (int32_t j = 0; j < L->nsl; j++) {
            io->act[j] = all + at;
            at += L->len_p[j];
        }
    } else {
        for (int32_t j = 0; j < L->nsl; j++)
            io->act[j] = si__vec(b, batch ? e->bat.h_bpart[j] : L->h_part_c[j], STARPU_R);
    }
    const void *rows = si__wmat(b, e, L->h_down_c[k]);
    io->rows = si__rows_of(&e->w->layers[l].ffn_down, e->down.dn[k], e->down.dn[k + 1]);
    io->rows.data = rows;
    io->y = si__vec(b, batch ? e->down.h_bdout[k] : e->down.h_dout[k], STARPU_W);
}

/*
 * Block k = a->j of layer l's down projection, outputs [dn[k], dn[k+1]):
 * each one dot over all the layer's neurons, the reference's own
 * matrix-vector product on those rows (si_ref_matvec), so the same bits.
 */
static void down_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct si__layer_state *L = &e->L[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    struct si__down_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    si__down_bufs(&b, e, a->l, a->j, false, &io);
    double t0 = si__now();
    si__ffn_gather(L, io.act, 0, sc->h);
    int64_t nz;
    if (e->p.ref.input_thresholds != NULL &&
        si__input_in(e, sc, a->l, SI_INPUT_DOWN, sc->h, e->m->hp.n_ff, &nz)) {
        const struct si_layer *W = &e->w->layers[a->l];
        si__matvec_t(e, &W->ffn_down, si_ref_down_copy(e->m, W), e->down.dn[a->j],
                     e->down.dn[a->j + 1], sc, nz, sc->h, io.y);
        si__account(e, SI_TASK_FFN_DOWN, t0);
        return;
    }
    si_ref_matvec(e->p.ref.act_quant, sc->hq, io.y, &io.rows, sc->h);
    si__account(e, SI_TASK_FFN_DOWN, t0);
}

int si__submit_down(struct si_engine *e, int l, int k, int32_t token)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    si__down_bufs(&b, e, l, k, false, &(struct si__down_io){0});
    return si__submit(e, &si__cl_down, e->L[l].name_down[k], l, k, token, &a, STARPU_CPU);
}

static struct starpu_perfmodel hot_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_ffn_hot"};
static struct starpu_perfmodel cold_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_ffn_cold"};
static struct starpu_perfmodel down_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_ffn_down"};

struct starpu_codelet si__cl_hot = {
    .cpu_funcs = {ffn_cpu},
#ifdef SI_USE_CUDA
    .cuda_funcs = {ffn_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &hot_model,
    .name = "ffn_hot",
};
struct starpu_codelet si__cl_cold = {
    .cpu_funcs = {ffn_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &cold_model,
    .name = "ffn_cold",
};
struct starpu_codelet si__cl_down = {
    .cpu_funcs = {down_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &down_model,
    .name = "ffn_down",
};
