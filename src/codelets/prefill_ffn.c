/*
 * prefill_ffn.c - a layer's FFN over a batch of tokens as tasks: each slice
 * for every token (ffn_batch_L.j: GEMMs, or gate mode's gate first), dense
 * mode's down projection by row blocks (ffn_down_batch_L.k), and the merge
 * into the batch's residual (merge_batch_L).
 */
#include "codelets/codelets.h"
#include "codelets/prefill.h"

#include "codelets/ops.h"
#include "model/act.h"
#include "model/forward.h"
#include "model/quants.h"

#include <cblas.h>
#include <math.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

#ifdef SI_USE_CUDA
#include <cuda_runtime_api.h>
#endif

/* h = act(g) * u (or act(u) for the plain kind) over a batch of rows, with
 * gate mode's threshold; the up bias already added to u. */
static void batch_act(const struct si_engine *e, int l, float *g, float *u, int64_t count)
{
    const struct si_hparams *hp = &e->m->hp;
    const float t = e->lay.gthr[l];
    const bool thr = e->p.mode == SI_SPARSITY_GATE && hp->act != SI_ACT_RELU &&
                     hp->ffn_kind != SI_FFN_PLAIN && t > 0.0f;
    for (int64_t k = 0; k < count; k++) {
        if (hp->ffn_kind == SI_FFN_PLAIN) {
            u[k] = si_act_apply(hp->act, u[k]);
            continue;
        }
        float a = si_act_apply(hp->act, g[k]);
        u[k] = thr && !(fabsf(a) > t) ? 0.0f : si_act_gated(hp->ffn_kind, a, u[k]);
    }
}

/* Whether gate mode's gate lets few neurons of layer l through: ReLU, or a
 * threshold above 0 (with 0 a SiLU gate passes nearly every neuron). */
static bool sparse_gate(const struct si_engine *e, int l)
{
    const struct si_hparams *hp = &e->m->hp;
    return hp->ffn_kind != SI_FFN_PLAIN && (hp->act == SI_ACT_RELU || e->lay.gthr[l] > 0.0f);
}

/*
 * Gate mode's batch after the gating dots (sc->bg, n per token, from qgemm,
 * whose converted inputs are still at xa): per token, the neurons whose
 * act(gate) passes, their up dots 8 rows at a time (si_vec_dot_act8p, the
 * decoding's dots), their activations, then the sparse down kernel into
 * token t's partial output y + t * n_embd.  The up and down rows of the
 * neurons that do not fire are not read: at 90% sparsity a tenth of what
 * a dense product over the batch reads.  Returns the activations that are
 * not zero, over the tokens.
 */
static int64_t gate_first(const struct si_engine *e, int l, const struct si__ffn_fmt *f,
                          const char *rec, const float *b, const char *xa, int64_t n, int64_t nt,
                          float *y, struct si__scratch *sc)
{
    const struct si_hparams *hp = &e->m->hp;
    const int64_t d = hp->n_embd;
    const size_t rb = f->rec_bytes;
    const char *up = rec + f->up_off;
    size_t xr = 0;
    si_type_row_size(si_act_type(f->gu_type), d, &xr);
    int64_t computed = 0;
    for (int64_t t = 0; t < nt; t++) {
        const int64_t m = si__ffn_gate_pass(e, f->gu_type, up, rb, b, sc->bg + t * n, n,
                                            e->lay.gthr[l], xa + (size_t)t * xr, NULL, sc);
        si_k_ffn_down_sparse(f->dt_type, rec + f->dt_off, rb, d, sc->h, sc->ix, m, y + t * d);
        for (int64_t q = 0; q < m; q++)
            computed += sc->h[q] != 0.0f;
    }
    return computed;
}

/* Observation (si_engine_observe): a slice's columns [n0, n0 + n) of the
 * batch's gate products g and activations h into layer l's kept rows (in
 * neuron order: the records' positions through the neuron table), and (the
 * slice starting at position 0) the FFN inputs xb. */
static void keep_observed(const struct si_engine *e, int l, const float *xb, const float *g,
                          const float *h, int64_t n0, int64_t n)
{
    const struct si_hparams *hp = &e->m->hp;
    const size_t d = (size_t)hp->n_embd, ff = (size_t)hp->n_ff;
    const size_t row0 = (size_t)l * (size_t)e->obs.nb;
    const int32_t *perm = e->lay.sparse ? e->L[l].perm : NULL; /* position -> neuron */
    for (int64_t t = 0; t < e->bat.bn; t++) {
        const size_t row = row0 + (size_t)t;
        if (n0 == 0 && n > 0)
            memcpy(e->obs.x + row * d, xb + (size_t)t * d, d * sizeof(float));
        for (int64_t k = 0; k < n; k++) {
            const size_t c = perm != NULL ? (size_t)perm[n0 + k] : (size_t)(n0 + k);
            if (hp->ffn_kind != SI_FFN_PLAIN)
                e->obs.g[row * ff + c] = g[t * n + k];
            e->obs.h[row * ff + c] = h[t * n + k];
        }
    }
}

/*
 * A slice for the whole batch, every neuron: G = gate X and U = up X, H,
 * then (sparse layouts) Y = down H, in the batch's arithmetic (arith_of).
 * The reference's (SI__ARITH_REF): its own dots over row tiles (gemm_act) and,
 * for neuron records, each token's non-zero activations through the sparse
 * down kernel, as in decoding (gate mode: the gating dots, then
 * gate_first).  SI__ARITH_INT8: G and U through qgemm (gate
 * mode, and predictor mode on ReLU: up and down only for the neurons the
 * gate lets through, gate_first).  SI__ARITH_BLAS: G and U through si_k_gemm.
 * Otherwise the records' down_t rows dequantized SI__DT_TILE at a time for
 * sgemm on the float activations (the reference's down_t product does not
 * convert them either).  Buffers as ffn_cpu's without idx; the output
 * last: (n_batch, rows, n_embd), or dense, H (n_batch, n) for bdown_cpu.
 */
struct bffn_io {
    const float *xb;
    struct si__ffn_slice w;
    float *y;
    const int32_t *iota;
    float *h;
};

/* ffn_batch_L.j: xb_batch (R), the slice's weights as ffn's
 * (si__ffn_slice_bufs, R), its output for the batch (W); the hot slice of
 * the sparse layouts on CUDA, then iota (R) and a scratch of 2 n_ff
 * floats. */
static void bffn_bufs(struct si__bufs *b, struct si_engine *e, int l, int j, bool gpu,
                      struct bffn_io *io)
{
    io->xb = si__vec(b, e->bat.h_bffn_in, STARPU_R);
    si__ffn_slice_bufs(b, e, l, j, &io->w);
    io->y = si__vec(b, e->bat.h_bpart[j], STARPU_W);
    io->iota = NULL;
    io->h = NULL;
    if (gpu) {
        io->iota = si__vec(b, e->dec.h_iota, STARPU_R);
        io->h = si__vec(b, e->dec.h_hscratch, STARPU_SCRATCH);
    }
}

static void bffn_twin(struct si_engine *e, int l, int j, const struct bffn_io *io);

/* A slice's rows as bffn_cpu takes them from its buffers. */
struct bslice {
    const char *gate, *up, *rec; /* gate NULL: the plain kind; rec: sparse layouts */
    size_t gs, us;               /* gate's and up's row strides */
    int64_t gpk, upk;            /* their packed rows */
    int64_t n;                   /* neurons */
    const float *b;              /* the up bias, or NULL */
};

/* bffn_cpu's work for nt tokens of the batch in arithmetic ar: inputs xb,
 * outputs y (both at those tokens' first row).  Returns the neurons it
 * computed: their activations that are not zero (dense: all). */
static int64_t ffn_rows(struct si_engine *e, int l, int j, const struct bslice *w, const float *xb,
                        int64_t nt, float *y, enum si__arith ar, struct si__scratch *sc)
{
    struct si__layer_state *L = &e->L[l];
    const struct si_hparams *hp = &e->m->hp;
    const struct si__ffn_fmt *f = &L->f;
    const int64_t d = hp->n_embd, n = w->n;
    const char *gate = w->gate, *up = w->up, *rec = w->rec;
    const float *b = w->b;
    if (nt <= 0)
        return 0;
    const bool gated = gate != NULL && e->lay.sparse && sparse_gate(e, l) &&
                       (e->lay.pre_sep || hp->act == SI_ACT_RELU) && e->obs.fn == NULL;
    const bool q = ar == SI__ARITH_REF;
    if (q) {
        size_t xa_row = 0;
        const uint32_t at = si_act_type(f->gu_type);
        si_type_row_size(at, d, &xa_row);
        char *xa = sc->gemm;
        for (int64_t t = 0; t < nt; t++)
            si_quantize_act(at, xb + t * d, xa + (size_t)t * xa_row, d);
        if (gate != NULL)
            si__gemm_act(f->gu_type, gate, w->gs, w->gpk, n, d, xa, xa_row, nt, sc->bg, n);
        if (gated) {
            /* gate mode on a few tokens (a step's decoding ones): each
             * token's decoding work, the gating rows read once */
            return gate_first(e, l, f, rec, b, xa, n, nt, y, sc);
        }
        si__gemm_act(f->gu_type, up, w->us, w->upk, n, d, xa, xa_row, nt, sc->bu, n);
    } else {
        /* the rows as tensors (strides gs, us: records in sparse layouts) */
        const struct si_tensor gt = {.data = gate,
                                     .type = f->gu_type,
                                     .ne = {d, n, 1, 1},
                                     .nbytes = (size_t)n * w->gs,
                                     .row_bytes = w->gs,
                                     .pk = w->gpk},
                               ut = {.data = up,
                                     .type = f->gu_type,
                                     .ne = {d, n, 1, 1},
                                     .nbytes = (size_t)n * w->us,
                                     .row_bytes = w->us,
                                     .pk = w->upk};
        const bool i8 = ar == SI__ARITH_INT8;
        int rc = SI_OK;
        /* rows kept unpacked (records, a hot slice's) are packed on the way
         * (qgemm's tile: sc->dt, free until the down rows below) */
        void *tile = sc->dt;
        const bool gq = gate != NULL && i8 && si__qgemm(&gt, xb, d, nt, sc->bg, n, sc->gemm, tile);
        if (gq && gated) {
            /* gate mode, and predictor mode on ReLU (whose gate says
             * exactly which neurons fire; over a batch the predicted ones
             * are nearly all): the neurons the gate lets through, token
             * by token (observed: every neuron's values, below) */
            return gate_first(e, l, f, rec, b, sc->gemm, n, nt, y, sc);
        }
        if (gate != NULL && !gq)
            rc = w->gpk > 0
                     ? si_k_gemm_tensor(&gt, xb, d, nt, sc->bg, n, sc->gemm)
                     : si_k_gemm(f->gu_type, gate, w->gs, n, d, xb, d, nt, sc->bg, n, sc->gemm);
        if (rc == SI_OK && !(i8 && si__qgemm(&ut, xb, d, nt, sc->bu, n, sc->gemm, tile)))
            rc = w->upk > 0
                     ? si_k_gemm_tensor(&ut, xb, d, nt, sc->bu, n, sc->gemm)
                     : si_k_gemm(f->gu_type, up, w->us, n, d, xb, d, nt, sc->bu, n, sc->gemm);
        STARPU_ASSERT_MSG(rc == SI_OK, "prefill GEMM refused its shapes");
    }
    if (b != NULL)
        for (int64_t t = 0; t < nt; t++)
            for (int64_t k = 0; k < n; k++)
                sc->bu[t * n + k] += b[k];
    batch_act(e, l, sc->bg, sc->bu, nt * n);
    if (e->obs.fn != NULL) /* (observed batches: the whole batch at once) */
        keep_observed(e, l, xb, sc->bg, sc->bu, L->s0[j], n);
    int64_t computed = nt * n;
    if (!e->lay.sparse) {
        memcpy(y, sc->bu, (size_t)(nt * n) * sizeof(float));
    } else if (q || (e->bat.bstep && e->p.step_int8)) { /* (each token's own sums, not sgemm's) */
        computed = 0;
        for (int64_t t = 0; t < nt; t++) {
            const float *h = sc->bu + t * n;
            int64_t k = 0;
            for (int64_t c = 0; c < n; c++)
                if (h[c] != 0.0f) {
                    sc->h[k] = h[c];
                    sc->ix[k++] = (int32_t)c;
                }
            si_k_ffn_down_sparse(f->dt_type, rec + f->dt_off, f->rec_bytes, d, sc->h, sc->ix, k,
                                 y + t * d);
            computed += k;
        }
    } else {
        const char *dt = rec + f->dt_off;
        for (int64_t k0 = 0; k0 < n; k0 += SI__DT_TILE) {
            const int64_t kb = n - k0 < SI__DT_TILE ? n - k0 : SI__DT_TILE;
            for (int64_t k = 0; k < kb; k++)
                si_dequantize_row(f->dt_type, dt + (size_t)(k0 + k) * f->rec_bytes,
                                  sc->dt + (size_t)k * d, d);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nt, (int)d, (int)kb, 1.0f,
                        sc->bu + k0, (int)n, sc->dt, (int)d, k0 == 0 ? 0.0f : 1.0f, y, (int)d);
        }
        if (n == 0)
            memset(y, 0, (size_t)(nt * d) * sizeof(float));
    }
    return computed;
}

static void bffn_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct bffn_io io;
    struct si__bufs bw = si__bufs_read(buffers);
    bffn_bufs(&bw, e, a->l, a->j, false, &io);
    if (e->p.gpu_twin && e->lay.sparse && si__is_hot(e, a->l, a->j)) {
        bffn_twin(e, a->l, a->j, &io); /* the GPU's steps, on this CPU worker */
        return;
    }
    struct si__layer_state *L = &e->L[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    const int64_t d = e->m->hp.n_embd, n = L->s0[a->j + 1] - L->s0[a->j];
    double t0 = si__now();
    const float *xb = io.xb;
    const struct si__ffn_fmt *f = &L->f;
    struct bslice w = {.gs = f->gu_row, .us = f->gu_row, .n = n, .b = io.w.b};
    if (!e->lay.sparse) {
        const struct si_layer *W = &e->w->layers[a->l];
        const int64_t n0 = L->s0[a->j];
        if (e->lay.has_gate) {
            w.gate = io.w.gate;
            w.gpk = si__rows_of(&W->ffn_gate, n0, n0 + n).pk;
        }
        w.up = io.w.up;
        w.upk = si__rows_of(&W->ffn_up, n0, n0 + n).pk;
    } else {
        const char *pre = io.w.pre;
        w.rec = io.w.rec;
        const int64_t ppk = pre != NULL ? L->pre_pk[a->j] : 0;
        if (e->lay.has_gate) {
            w.gate = pre != NULL ? pre : w.rec + f->gate_off;
            w.gs = pre != NULL ? f->gu_row : f->rec_bytes;
            w.gpk = pre != NULL ? ppk : 0;
        }
        w.up = f->up_off >= 0 ? w.rec + f->up_off : pre;
        w.us = f->up_off >= 0 ? f->rec_bytes : f->gu_row;
        w.upk = f->up_off >= 0 ? 0 : ppk;
    }
    float *y = io.y;
    /* the tokens before the split in the batch's arithmetic, the others
     * (a step's decoding tokens) in theirs (arith_at) */
    const int64_t s = e->bat.bsplit, out_row = e->lay.sparse ? d : n;
    ffn_rows(e, a->l, a->j, &w, xb, s, y, si__arith_at(e, f->gu_type, 0), sc);
    const int64_t c = ffn_rows(e, a->l, a->j, &w, xb + s * d, e->bat.bn - s, y + s * out_row,
                               si__arith_at(e, f->gu_type, s), sc);
    if (e->bat.bstep) /* a step's decoding tokens: counted as decoding counts them */
        __atomic_fetch_add(si__is_hot(e, a->l, a->j) ? &e->bat.step_hot : &e->bat.step_cold, c,
                           __ATOMIC_RELAXED);
    si__account(e, SI_TASK_PREFILL_FFN, t0);
}

/*
 * The hot slice of a batch in its GPU form (sparse layouts): each token
 * through si__ffn_gpu_token, on the CUDA worker (bffn_cuda) or its CPU twin
 * (bffn_twin, gpu_twin).  Buffers: bffn_cpu's; then, CUDA only, iota (R)
 * and a scratch of 2 n_ff floats.  Every hot neuron is computed, as in
 * decoding on the GPU (gate mode's threshold applies on CPU workers only);
 * the weights stay where decoding keeps them, and a batch moves only its
 * FFN input there and the output back.
 */
static int bffn_gpu(const struct si__ffn_ops *op, struct si_engine *e, int l, int j,
                    const struct bffn_io *io, const int32_t *iota, float *h)
{
    const int64_t d = e->m->hp.n_embd;
    int rc = 0;
    for (int64_t t = 0; t < e->bat.bn && rc == 0; t++)
        rc = si__ffn_gpu_token(op, e, l, j, &io->w, io->xb + t * d, NULL, iota, io->y + t * d, h);
    if (e->bat.bstep) /* every hot neuron of a step's decoding tokens */
        __atomic_fetch_add(&e->bat.step_hot, (e->bat.bn - e->bat.bsplit) * (int64_t)e->L[l].n_hot,
                           __ATOMIC_RELAXED);
    return rc;
}

static void bffn_twin(struct si_engine *e, int l, int j, const struct bffn_io *io)
{
    const double t0 = si__now();
    float *h = malloc(2 * (size_t)e->m->hp.n_ff * sizeof *h); /* the GPU's scratch */
    if (h == NULL || bffn_gpu(&si__ffn_twin_ops, e, l, j, io, e->lay.iota, h) != 0)
        STARPU_ABORT_MSG("ffn_batch_hot_L%d: the GPU form's CPU twin is out of memory", l);
    free(h);
    si__account(e, SI_TASK_PREFILL_FFN, t0);
}

#ifdef SI_USE_CUDA
static void bffn_cuda(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const double t0 = si__now();
    struct bffn_io io;
    struct si__bufs b = si__bufs_read(buffers);
    bffn_bufs(&b, e, a->l, a->j, true, &io);
    const struct si__ffn_ops op = si__ffn_cuda_ops((void *)starpu_cuda_get_local_stream());
    const int rc = bffn_gpu(&op, e, a->l, a->j, &io, io.iota, io.h);
    if (rc != 0)
        STARPU_CUDA_REPORT_ERROR((cudaError_t)rc);
    si__account(e, SI_TASK_PREFILL_FFN, t0);
}
#endif

/*
 * down_cpu for a batch: each token's activations gathered from the slices'
 * outputs, then in the batch's arithmetic (si__arith_of) the reference's
 * product per token, as in decoding, or si__products on H.  Output:
 * (n_batch, block rows), token-major.  Its buffers: si__down_bufs.
 */
static void bdown_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct si__layer_state *L = &e->L[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    const int64_t ff = e->m->hp.n_ff, bn = e->bat.bn, no = e->down.dn[a->j + 1] - e->down.dn[a->j];
    struct si__down_io io;
    struct si__bufs b = si__bufs_read(buffers);
    si__down_bufs(&b, e, a->l, a->j, true, &io);
    double t0 = si__now();
    const struct si_tensor rows = io.rows;
    float *y = io.y;
    for (int64_t t = 0; t < bn; t++)
        si__ffn_gather(L, io.act, t, sc->bu + t * ff);
    for (int64_t t = 0; t < bn; t++) /* the reference's product, token by token */
        if (si__arith_at(e, rows.type, t) == SI__ARITH_REF)
            si_ref_matvec(true, sc->hq, y + t * no, &rows, sc->bu + t * ff);
    if (si__arith_at(e, rows.type, 0) != SI__ARITH_REF) /* the others' (before the split) */
        si__products(si__arith_of(e, rows.type), &rows, no, sc->bu, ff, e->bat.bsplit, y, no,
                     sc->gemm, sc->dt);
    si__account(e, SI_TASK_PREFILL_FFN_DOWN, t0);
}

/* merge_batch_L: x_batch (RW), the down blocks (dense) or the slices'
 * outputs (R), xb3_batch (R). */
struct bmerge_io {
    float *bx;
    const float *part[SI__MAX_SLICES + 1];
    const float *bxb3;
};

static void bmerge_bufs(struct si__bufs *b, struct si_engine *e, int l, struct bmerge_io *io)
{
    struct si__layer_state *L = &e->L[l];
    io->bx = si__vec(b, e->bat.h_bx, STARPU_RW);
    if (!e->lay.sparse)
        for (int32_t k = 0; k < e->down.nd; k++)
            io->part[k] = si__vec(b, e->down.h_bdout[k], STARPU_R);
    else
        for (int32_t j = 0; j < L->nsl; j++)
            io->part[j] = si__vec(b, e->bat.h_bpart[j], STARPU_R);
    io->bxb3 = si__vec(b, e->bat.h_bxb3, STARPU_R);
}

/* x_b += FFN_l for each token: the slices' outputs (dense: the down
 * blocks) added in decoding's order, then the reference's finish. */
static void bmerge_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__layer_state *L = &e->L[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    const struct si_layer *W = &e->w->layers[a->l];
    const int64_t d = e->m->hp.n_embd;
    struct bmerge_io io;
    struct si__bufs b = si__bufs_read(buffers);
    bmerge_bufs(&b, e, a->l, &io);
    double t0 = si__now();
    float *xb2 = sc->xf;
    for (int32_t t = 0; t < e->bat.bn; t++) {
        for (int32_t k = 0; !e->lay.sparse && k < e->down.nd; k++) {
            const int64_t no = e->down.dn[k + 1] - e->down.dn[k];
            memcpy(xb2 + e->down.dn[k], io.part[k] + (size_t)t * (size_t)no,
                   (size_t)no * sizeof(float));
        }
        bool first = true;
        for (int32_t j = 0; e->lay.sparse && j < L->nsl; j++) {
            const float *p = io.part[j] + (size_t)t * (size_t)L->rows[j] * (size_t)d;
            for (int32_t r = 0; r < L->rows[j]; r++, p += d, first = false)
                for (int64_t o = 0; o < d; o++)
                    xb2[o] = first ? p[o] : xb2[o] + p[o];
        }
        if (W->ffn_down_b.data != NULL)
            for (int64_t o = 0; o < d; o++)
                xb2[o] += ((const float *)W->ffn_down_b.data)[o];
        float *x = io.bx + (size_t)t * (size_t)d;
        si_ref_ffn_finish_into(e->ref, a->l, x, xb2, io.bxb3 + (size_t)t * (size_t)d, x, sc->tmp);
    }
    si__account(e, SI_TASK_PREFILL_MERGE, t0);
}

/* The batch's FFN of layer l: out_j = FFN slice j (xb_b) for every token
 * (GEMM tasks on CPU workers; in the sparse layouts the hot slice on the
 * GPU, where its weights are, token by token; dense mode's runs on a CPU
 * worker: its read-only weights stay valid in main memory too), dense
 * mode's down blocks, then x_b += FFN_l. */
int si__submit_bffn(struct si_engine *e, int l)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    struct si__bufs b;
    struct bffn_io io;
    int rc = 0;
    for (int32_t j = 0; j < L->nsl && rc == 0; j++) {
        const bool gpu =
            si__is_hot(e, l, j) && e->gpu.cuda_hot && e->lay.sparse && e->obs.fn == NULL;
        b = si__bufs_collect(&a);
        bffn_bufs(&b, e, l, j, gpu, &io);
        rc = si__submit(e, &si__cl_bffn, L->name_bffn[j], l, j, 0, &a,
                        gpu ? STARPU_CUDA : STARPU_CPU);
    }
    for (int32_t k = 0; k < e->down.nd && !e->lay.sparse && rc == 0; k++) {
        b = si__bufs_collect(&a);
        si__down_bufs(&b, e, l, k, true, &(struct si__down_io){0});
        rc = si__submit(e, &si__cl_bdown, L->name_bdown[k], l, k, 0, &a, STARPU_CPU);
    }
    if (rc == 0) {
        b = si__bufs_collect(&a);
        bmerge_bufs(&b, e, l, &(struct bmerge_io){0});
        rc = si__submit(e, &si__cl_bmerge, L->name_bmerge, l, -1, 0, &a, 0);
    }
    return rc;
}

static struct starpu_perfmodel bffn_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_ffn_gemm"};
static struct starpu_perfmodel bdown_model = {.type = STARPU_HISTORY_BASED,
                                              .symbol = "si_ffn_down_batch"};
static struct starpu_perfmodel bmerge_model = {.type = STARPU_HISTORY_BASED,
                                               .symbol = "si_merge_batch"};

struct starpu_codelet si__cl_bffn = {
    .cpu_funcs = {bffn_cpu},
#ifdef SI_USE_CUDA
    .cuda_funcs = {bffn_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &bffn_model,
    .name = "ffn_batch",
};
struct starpu_codelet si__cl_bdown = {
    .cpu_funcs = {bdown_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &bdown_model,
    .name = "ffn_down_batch",
};
struct starpu_codelet si__cl_bmerge = {
    .cpu_funcs = {bmerge_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &bmerge_model,
    .name = "merge_batch",
};
