/*
 * prefill.c - the batch tasks of prefill: each layer's attention, FFN slices (GEMM), down
 * projection and merge over a batch of tokens.
 */
#include "codelets/codelets.h"

#include "codelets/ffn_sparse.h"
#include "codelets/ops.h"
#include "model/act.h"
#include "model/forward.h"
#include "model/pack8.h"
#include "model/quants.h"
#include "model/types.h"
#include "starinfer.h"

#include <cblas.h>
#include <math.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

#ifdef SI_USE_CUDA
#include <cuda_runtime_api.h>
#endif

/*
 * The batch tasks run the reference's per-token steps on rows of the batch
 * arrays by pointing the reference state's x, xb and xb3 at them; the tasks
 * that touch that state are ordered by the batch residual (RW), and each
 * restores the pointers before it returns.
 */
struct saved {
    float *x, *xb, *xb3;
};

static struct saved point_at(struct si_engine *e, int32_t t)
{
    struct si_ref *s = e->ref;
    const size_t d = (size_t)e->m->hp.n_embd;
    struct saved sv = {s->x, s->xb, s->xb3};
    s->x = e->bx + (size_t)t * d;
    s->xb = e->bxb + (size_t)t * d;
    s->xb3 = e->bxb3 + (size_t)t * d;
    return sv;
}

static void restore(struct si_engine *e, struct saved sv)
{
    e->ref->x = sv.x;
    e->ref->xb = sv.xb;
    e->ref->xb3 = sv.xb3;
}

static void bembed_cpu(void *buffers[], void *cl_arg)
{
    (void)buffers;
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    double t0 = si__now();
    for (int32_t t = 0; t < e->bn; t++) {
        struct saved sv = point_at(e, t);
        /* (checked before submission; the position is the token's own:
         * ref's n_past is its sequence's, which a step may not hold) */
        si_ref_begin_at(e->ref, e->btok[t], e->bpos[t]);
        restore(e, sv);
    }
    si__account(e, SI_TASK_PREFILL_EMBED, t0);
}

/*
 * How the batch multiplies rows of type t, from the engine's prefill mode
 * (starinfer.h's si_prefill_mode) and the batch's size, one rule for every
 * product of the batch, so that a prompt has one arithmetic whichever of
 * its matrices the engine keeps packed and however its tasks split it:
 *   ARITH_REF  the reference's dots on converted inputs (gemm_act): exact
 *              prefill, batches under SI__BLAS_MIN_BATCH tokens, and int8's
 *              types without a batched kernel;
 *   ARITH_INT8 inputs converted as the reference converts them, the batched
 *              integer kernel (qgemm; rows the engine keeps unpacked are
 *              packed 8 at a time on the way), sums in its order;
 *   ARITH_BLAS float inputs, sgemm on dequantized rows (si_k_gemm*).
 * Without act_quant (float weights) the reference's inputs are float too.
 */
enum arith { ARITH_REF, ARITH_INT8, ARITH_BLAS };

static enum arith arith_of(const struct si_engine *e, uint32_t t)
{
    if (!e->p.ref.act_quant)
        return ARITH_BLAS;
    /* step_int8's steps: the batched kernel's per-token sums, or the
     * reference's; never sgemm's, whose sums of a row depend on the rows
     * beside it */
    if (e->bstep && e->p.step_int8)
        return si_gemm8_available(t) ? ARITH_INT8 : ARITH_REF;
    /* (a step's prompt tokens are those of prompts of SI__BLAS_MIN_BATCH
     * tokens or more, whatever the step's size) */
    if (e->p.prefill == SI_PREFILL_EXACT || (!e->bstep && e->bn < SI__BLAS_MIN_BATCH))
        return ARITH_REF;
    const bool kernel = si_gemm8_available(t);
    switch (e->p.prefill) {
    case SI_PREFILL_INT8: return kernel ? ARITH_INT8 : ARITH_REF;
    case SI_PREFILL_BLAS: return ARITH_BLAS;
    default: return kernel ? ARITH_INT8 : ARITH_BLAS; /* auto */
    }
}

/* The arithmetic of the batch's token t: arith_of, or the reference's for
 * a step's decoding tokens (bsplit and after; float inputs without
 * act_quant, as the reference's). */
static enum arith arith_at(const struct si_engine *e, uint32_t type, int64_t t)
{
    return t >= e->bsplit && e->p.ref.act_quant ? ARITH_REF : arith_of(e, type);
}

/* The products y[t] = W x[t] for the batch's n_tok inputs x (rows of n_cols
 * floats), tokens tok0 .. tok0 + n_tok - 1 of the batch, each in its
 * arithmetic (arith_at).  scratch: for the converted inputs or si_k_gemm's
 * tile; tile: 8 of w's rows (qgemm's). */
static void batch_products(const struct si_engine *e, const struct si_tensor *w, int64_t n_rows,
                           const float *x, int64_t n_cols, int64_t tok0, int64_t n_tok, float *y,
                           int64_t ldy, void *scratch, void *tile);

/* The row of q | k | v of the batch's token t whose kv-head group g (of
 * a_g) is read: in bqkv[r], r its range of btp, or with bheads r = g (the
 * buffers of the attn_batch_L.r tasks, buffers[0 .. nr) of the tasks that
 * read them). */
static float *qkv_row(const struct si_engine *e, void *buffers[], int64_t t, int g)
{
    const struct si_hparams *hp = &e->m->hp;
    const size_t row = (size_t)(hp->n_head + 2 * hp->n_head_kv) * (size_t)hp->head_dim;
    int r = 0;
    if (e->bheads)
        r = g;
    else
        while (t >= e->btp[r + 1])
            r++;
    return (float *)STARPU_VECTOR_GET_PTR(buffers[r]) + (size_t)t * row;
}

/*
 * battn_cpu with bheads: kv-head group r's rows of q, k and v (its heads)
 * for every token of the batch, then its heads' biases, QK norm and RoPE,
 * into those columns of the tokens' rows of bqkv_r.
 */
static void battn_heads(struct si_engine *e, int l, int r, const float *bx, float *out,
                        struct si__scratch *sc)
{
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->w->layers[l];
    const int64_t d = hp->n_embd, hd = hp->head_dim, n = e->bn, group = hp->n_head / hp->n_head_kv;
    const int64_t qd = hp->n_head * hd, kvd = hp->n_head_kv * hd, row = qd + 2 * kvd;
    const int64_t g0 = e->a_g[r], g1 = e->a_g[r + 1];
    float *y = sc->hx;
    for (int64_t t = 0; t < n; t++)
        si_ref_attn_input(e->ref, l, bx + t * d, y + t * d, sc->tmp);
    const struct si_tensor wq = si__rows_of(&W->wq, g0 * group * hd, g1 * group * hd),
                           wk = si__rows_of(&W->wk, g0 * hd, g1 * hd),
                           wv = si__rows_of(&W->wv, g0 * hd, g1 * hd);
    batch_products(e, &wq, wq.ne[1], y, d, 0, n, out + g0 * group * hd, row, sc->gemm, sc->dt);
    batch_products(e, &wk, wk.ne[1], y, d, 0, n, out + qd + g0 * hd, row, sc->gemm, sc->dt);
    batch_products(e, &wv, wv.ne[1], y, d, 0, n, out + qd + kvd + g0 * hd, row, sc->gemm,
                   sc->dt);
    for (int64_t t = 0; t < n; t++) {
        float *q = out + t * row;
        si_ref_attn_group_prepare_at(e->ref, l, (int)e->bpos[t], (int)g0, (int)g1, q, q + qd,
                                     q + qd + kvd, sc->ascr);
    }
}

/*
 * attn_batch_L.r: the batch's tokens [btp[r], btp[r+1]): the attention's
 * normalised inputs, q, k and v for all of them at once (GEMMs), then per
 * token at its position si_ref_attn_group_prepare_at over every head
 * (biases, QK norm, RoPE, in place), into their rows of bqkv_r; with
 * bheads, kv-head group r's part of every token (battn_heads).
 * Buffers: x_batch (R), Wq, Wk, Wv (R), bqkv_r (W).
 */
static void battn_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->w->layers[a->l];
    if (e->bheads) {
        const double t0 = si__now();
        battn_heads(e, a->l, a->j, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]),
                    (float *)STARPU_VECTOR_GET_PTR(buffers[4]), sc);
        si__account(e, SI_TASK_PREFILL_ATTN, t0);
        return;
    }
    const int64_t d = hp->n_embd, hd = hp->head_dim, t0 = e->btp[a->j], nt = e->btp[a->j + 1] - t0;
    const int64_t qd = hp->n_head * hd, kvd = hp->n_head_kv * hd, row = qd + 2 * kvd;
    double start = si__now();
    const float *bx = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    float *out = (float *)STARPU_VECTOR_GET_PTR(buffers[4]) + t0 * row;
    float *y = sc->hx;
    for (int64_t t = 0; t < nt; t++)
        si_ref_attn_input(e->ref, a->l, bx + (t0 + t) * d, y + t * d, sc->tmp);
    if (e->obs_fn != NULL) /* si_ffn_view's xa: rows of the batch's tokens, this layer's */
        memcpy(e->obs_a + ((size_t)a->l * (size_t)e->obs_nb + (size_t)t0) * (size_t)d, y,
               (size_t)(nt * d) * sizeof(float));
    if (nt > 0) {
        batch_products(e, &W->wq, qd, y, d, t0, nt, out, row, sc->gemm, sc->dt);
        batch_products(e, &W->wk, kvd, y, d, t0, nt, out + qd, row, sc->gemm, sc->dt);
        batch_products(e, &W->wv, kvd, y, d, t0, nt, out + qd + kvd, row, sc->gemm, sc->dt);
    }
    for (int64_t t = 0; t < nt; t++) {
        float *q = out + t * row;
        si_ref_attn_group_prepare_at(e->ref, a->l, (int)e->bpos[t0 + t], 0, hp->n_head_kv, q,
                                     q + qd, q + qd + kvd, sc->ascr);
    }
    si__account(e, SI_TASK_PREFILL_ATTN, start);
}

/*
 * attn_kv_batch_L.g: kv-head group g's k and v of every token of the batch
 * into its sequence's cache rows (si_ref_attn_group_cache_at on bseq[t]).
 * Buffers: bqkv_* (R), K_g, V_g (RW).  The handles are ref's cache; the
 * other sequences of a step (si_engine_eval_multi) are reached through
 * bseq, their order kept by these handles, which the attention tasks of
 * every batch and token take in the same modes.
 */
static void bakv_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct si_hparams *hp = &e->m->hp;
    const int64_t qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
    double t0 = si__now();
    for (int64_t t = 0; t < e->bn; t++) {
        const float *q = qkv_row(e, buffers, t, a->j);
        si_ref_attn_group_cache_at(e->bseq[t], a->l, (int)e->bpos[t], (int)e->a_g[a->j],
                                   (int)e->a_g[a->j + 1], q + qd, q + qd + kvd);
    }
    si__account(e, SI_TASK_PREFILL_ATTN, t0);
}

/*
 * attn_core_batch_L.g.r (j = g * nr + r): kv-head group g's attention for
 * the batch's tokens [btr[r], btr[r+1]), each at its position (their q
 * prepared, every position up to theirs cached), into those rows of
 * att_j, a row of the group's query heads per token.
 * Buffers: bqkv_* (R), K_g, V_g (R), att_j (W).
 */
static void bacore_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    const struct si_hparams *hp = &e->m->hp;
    const int g = a->j / e->nr, r = a->j % e->nr, nr = e->nr;
    const int64_t hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const int64_t g0 = e->a_g[g], g1 = e->a_g[g + 1], q0 = g0 * group * hd,
                  nq = (g1 - g0) * group * hd;
    double t0 = si__now();
    float *att = (float *)STARPU_VECTOR_GET_PTR(buffers[nr + 2]);
    for (int64_t t = e->btr[r]; t < e->btr[r + 1]; t++) {
        si_ref_attn_group_attend_at(e->bseq[t], a->l, (int)e->bpos[t], (int)g0, (int)g1,
                                    qkv_row(e, buffers, t, g), sc->aatt, sc->ascr);
        memcpy(att + t * nq, sc->aatt + q0, (size_t)nq * sizeof(float));
    }
    si__account(e, SI_TASK_PREFILL_ATTN, t0);
}

/*
 * attn_o_batch_L.j: the groups' attention outputs gathered per token, then
 * Wo's rows [bo_c[j], bo_c[j+1]) times them for every token at once, into
 * bo_j (a row of that many per token).
 * Buffers: att_* (R), Wo (R), bo_j (W).
 */
static void bao_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    const struct si_hparams *hp = &e->m->hp;
    const int64_t bn = e->bn, qd = (int64_t)hp->n_head * hp->head_dim;
    const int nb = e->ng * e->nr;
    const int64_t c0 = e->bo_c[a->j], w = e->bo_c[a->j + 1] - c0;
    double t0 = si__now();
    float *att = sc->bqkv;
    for (int j = 0; j < nb; j++) {
        const int g = j / e->nr, r = j % e->nr;
        const float *ag = (const float *)STARPU_VECTOR_GET_PTR(buffers[j]);
        const int64_t gw = e->att_len[g], off = e->a_g[g] * (hp->n_head / hp->n_head_kv) *
                                                    hp->head_dim;
        for (int64_t t = e->btr[r]; t < e->btr[r + 1]; t++)
            memcpy(att + t * qd + off, ag + t * gw, (size_t)gw * sizeof(float));
    }
    float *o = (float *)STARPU_VECTOR_GET_PTR(buffers[nb + 1]);
    if (w > 0) {
        const struct si_tensor wo = si__rows_of(&e->w->layers[a->l].wo, c0, c0 + w);
        batch_products(e, &wo, w, att, qd, 0, bn, o, w, sc->gemm, sc->dt);
    }
    si__account(e, SI_TASK_PREFILL_ATTN, t0);
}

/*
 * attn_out_batch_L: the projections gathered per token, then per token the
 * reference's finish (bias, post-norm, residual; the FFN's normalised input).
 * Buffers: bo_* (R), x_batch (RW), ffn_in_batch (W), xb3_batch (W).
 */
static void baout_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    const int64_t d = e->m->hp.n_embd, bn = e->bn;
    const int nr = e->nr;
    double t0 = si__now();
    float *o = sc->hx;
    for (int j = 0; j < nr; j++) {
        const float *bo = (const float *)STARPU_VECTOR_GET_PTR(buffers[j]);
        const int64_t c0 = e->bo_c[j], w = e->bo_c[j + 1] - c0;
        for (int64_t t = 0; t < bn && w > 0; t++)
            memcpy(o + t * d + c0, bo + t * w, (size_t)w * sizeof(float));
    }
    float *bx = (float *)STARPU_VECTOR_GET_PTR(buffers[nr]);
    float *bxb = (float *)STARPU_VECTOR_GET_PTR(buffers[nr + 1]);
    float *bxb3 = (float *)STARPU_VECTOR_GET_PTR(buffers[nr + 2]);
    for (int64_t t = 0; t < bn; t++)
        si_ref_attn_finish_into(e->ref, a->l, bx + t * d, o + t * d, bx + t * d, bxb + t * d,
                                bxb3 + t * d, sc->tmp);
    if (e->obs_fn != NULL) /* si_ffn_view's xr: the residual the FFN's norm read */
        memcpy(e->obs_r + (size_t)a->l * (size_t)e->obs_nb * (size_t)d, bx,
               (size_t)(bn * d) * sizeof(float));
    si__account(e, SI_TASK_PREFILL_ATTN, t0);
}

/* h = act(g) * u (or act(u) for the plain kind) over a batch of rows, with
 * gate mode's threshold; the up bias already added to u. */
static void batch_act(const struct si_engine *e, int l, float *g, float *u, int64_t count)
{
    const struct si_hparams *hp = &e->m->hp;
    const float t = e->gthr[l];
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

/*
 * y[t][r] = row r . xa[t] for a tile of rows at a time (the rows stay in
 * cache while every token of the batch uses them): the reference's own dot
 * on activations converted by si_quantize_act, so each value equals the
 * token-by-token one bit for bit; the first pk rows packed 8 at a time
 * (model/pack8.h), a tile being one group.  xa[t] at xa + t * xa_stride
 * bytes.
 */
static void gemm_act(uint32_t type, const char *w, size_t row_bytes, int64_t pk, int64_t n_rows,
                     int64_t n_cols, const char *xa, size_t xa_stride, int64_t n_tok, float *y,
                     int64_t ldy)
{
    enum { TILE = 8 };
    for (int64_t r0 = 0; r0 < n_rows; r0 += TILE) {
        const int64_t r1 = r0 + TILE < n_rows ? r0 + TILE : n_rows;
        if (r0 < pk) {
            /* a group; pk ends inside one only where the rows end */
            float o[8];
            for (int64_t t = 0; t < n_tok; t++) {
                si_vec_dot_act8(type, w + (size_t)r0 * row_bytes, xa + (size_t)t * xa_stride,
                                n_cols, o);
                memcpy(y + t * ldy + r0, o, (size_t)(r1 - r0) * sizeof *o);
            }
            continue;
        }
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = r0; r < r1; r++)
                y[t * ldy + r] = si_vec_dot_act(type, w + (size_t)r * row_bytes,
                                                xa + (size_t)t * xa_stride, n_cols);
    }
}

/*
 * y[t][r] = row r of w . x[t] (x[t] at x + t * ldx) for a packed w through
 * the batched kernel (si_gemm8: integer products of 8 rows by 16 tokens at
 * a time): each token converted once into scratch (si__qgemm_scratch), the
 * rows after the packed ones by the row kernel.  With a tile (8 rows'
 * bytes), rows that are not packed (neuron records: w->row_bytes apart) are
 * packed there 8 at a time on the way, the batch repaying the copy.  False,
 * nothing done, where w is not packed (and no tile) or this CPU has no such
 * kernel.
 */
static bool qgemm(const struct si_tensor *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
                  int64_t ldy, void *scratch, void *tile)
{
    const bool fly = w->pk == 0 && tile != NULL && si_pack8_type(w->type);
    if ((w->pk == 0 && !fly) || !si_gemm8_available(w->type))
        return false;
    const int64_t pk = fly ? w->ne[1] / 8 * 8 : w->pk;
    const int64_t n = w->ne[0], nb = n / 32;
    const uint32_t at = si_act_type(w->type);
    size_t xr = 0;
    si_type_row_size(at, n, &xr);
    char *xa = scratch;
    int32_t *sums = (int32_t *)(void *)(xa + ((size_t)n_tok * xr + 63) / 64 * 64);
    for (int64_t t = 0; t < n_tok; t++) {
        si_quantize_act(at, x + t * ldx, xa + (size_t)t * xr, n);
        si_act_block_sums(at, xa + (size_t)t * xr, n, sums + t * nb);
    }
    const char *row = w->data;
    for (int64_t r = 0; r < pk; r += 8, row += 8 * w->row_bytes) {
        const char *g = row;
        if (fly) {
            si_pack8(w->type, row, w->row_bytes, n, tile);
            g = tile;
        }
        if (r + 8 <= pk) {
            si_gemm8(w->type, g, n, xa, xr, sums, n_tok, y + r, (size_t)ldy);
            continue;
        }
        float o[8]; /* a view that ends inside a group */
        for (int64_t t = 0; t < n_tok; t++) {
            si_vec_dot_act8(w->type, g, xa + (size_t)t * xr, n, o);
            memcpy(y + t * ldy + r, o, (size_t)(pk - r) * sizeof *o);
        }
    }
    row = (const char *)w->data + (size_t)pk * w->row_bytes;
    for (int64_t r = pk; r < w->ne[1]; r++, row += w->row_bytes)
        for (int64_t t = 0; t < n_tok; t++)
            y[t * ldy + r] = si_vec_dot_act(w->type, row, xa + (size_t)t * xr, n);
    return true;
}

/* batch_products' tokens in one arithmetic. */
static void products(enum arith ar, const struct si_tensor *w, int64_t n_rows, const float *x,
                     int64_t n_cols, int64_t n_tok, float *y, int64_t ldy, void *scratch,
                     void *tile)
{
    STARPU_ASSERT(n_rows == w->ne[1]);
    if (n_tok <= 0)
        return;
    switch (ar) {
    case ARITH_REF: {
        size_t xa_row = 0;
        const uint32_t at = si_act_type(w->type);
        si_type_row_size(at, n_cols, &xa_row);
        char *xa = scratch;
        for (int64_t t = 0; t < n_tok; t++)
            si_quantize_act(at, x + t * n_cols, xa + (size_t)t * xa_row, n_cols);
        gemm_act(w->type, w->data, w->row_bytes, w->pk, n_rows, n_cols, xa, xa_row, n_tok, y,
                 ldy);
        return;
    }
    case ARITH_INT8: {
        const bool done = qgemm(w, x, n_cols, n_tok, y, ldy, scratch, tile);
        STARPU_ASSERT_MSG(done, "no batched integer kernel for a type that has one");
        return;
    }
    case ARITH_BLAS: {
        const int rc = si_k_gemm_tensor(w, x, n_cols, n_tok, y, ldy, scratch);
        STARPU_ASSERT_MSG(rc == SI_OK, "prefill GEMM refused its shapes");
        return;
    }
    }
}

static void batch_products(const struct si_engine *e, const struct si_tensor *w, int64_t n_rows,
                           const float *x, int64_t n_cols, int64_t tok0, int64_t n_tok, float *y,
                           int64_t ldy, void *scratch, void *tile)
{
    int64_t s = e->bsplit - tok0; /* the tokens before the split */
    s = s < 0 ? 0 : s > n_tok ? n_tok : s;
    products(arith_at(e, w->type, tok0), w, n_rows, x, n_cols, s, y, ldy, scratch, tile);
    products(arith_at(e, w->type, tok0 + s), w, n_rows, x + s * n_cols, n_cols, n_tok - s,
             y + s * ldy, ldy, scratch, tile);
}

/* Whether gate mode's gate lets few neurons of layer l through: ReLU, or a
 * threshold above 0 (with 0 a SiLU gate passes nearly every neuron). */
static bool sparse_gate(const struct si_engine *e, int l)
{
    const struct si_hparams *hp = &e->m->hp;
    return hp->ffn_kind != SI_FFN_PLAIN && (hp->act == SI_ACT_RELU || e->gthr[l] > 0.0f);
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
                                            e->gthr[l], xa + (size_t)t * xr, NULL, sc);
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
static void keep_observed(const struct si_engine *e, int l, const float *xb,
                          const float *g, const float *h, int64_t n0, int64_t n)
{
    const struct si_hparams *hp = &e->m->hp;
    const size_t d = (size_t)hp->n_embd, ff = (size_t)hp->n_ff;
    const size_t row0 = (size_t)l * (size_t)e->obs_nb;
    const int32_t *perm = e->sparse ? e->L[l].perm : NULL; /* position -> neuron */
    for (int64_t t = 0; t < e->bn; t++) {
        const size_t row = row0 + (size_t)t;
        if (n0 == 0 && n > 0)
            memcpy(e->obs_x + row * d, xb + (size_t)t * d, d * sizeof(float));
        for (int64_t k = 0; k < n; k++) {
            const size_t c = perm != NULL ? (size_t)perm[n0 + k] : (size_t)(n0 + k);
            if (hp->ffn_kind != SI_FFN_PLAIN)
                e->obs_g[row * ff + c] = g[t * n + k];
            e->obs_h[row * ff + c] = h[t * n + k];
        }
    }
}

/*
 * A slice for the whole batch, every neuron: G = gate X and U = up X, H,
 * then (sparse layouts) Y = down H, in the batch's arithmetic (arith_of).
 * The reference's (ARITH_REF): its own dots over row tiles (gemm_act) and,
 * for neuron records, each token's non-zero activations through the sparse
 * down kernel, as in decoding (gate mode: the gating dots, then
 * gate_first).  ARITH_INT8: G and U through qgemm (gate
 * mode, and predictor mode on ReLU: up and down only for the neurons the
 * gate lets through, gate_first).  ARITH_BLAS: G and U through si_k_gemm.
 * Otherwise the records' down_t rows dequantized SI__DT_TILE at a time for
 * sgemm on the float activations (the reference's down_t product does not
 * convert them either).  Buffers as ffn_cpu's without idx; the output
 * last: (n_batch, rows, n_embd), or dense, H (n_batch, n) for bdown_cpu.
 */
static void bffn_twin(void *buffers[], struct si__task_arg *a);

/* A slice's rows as bffn_cpu found them in its buffers. */
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
                     int64_t nt, float *y, enum arith ar, struct si__scratch *sc)
{
    struct si__layer_state *L = &e->L[l];
    const struct si_hparams *hp = &e->m->hp;
    const struct si__ffn_fmt *f = &L->f;
    const int64_t d = hp->n_embd, n = w->n;
    const char *gate = w->gate, *up = w->up, *rec = w->rec;
    const float *b = w->b;
    if (nt <= 0)
        return 0;
    const bool gated = gate != NULL && e->sparse && sparse_gate(e, l) &&
                       (e->pre_sep || hp->act == SI_ACT_RELU) && e->obs_fn == NULL;
    const bool q = ar == ARITH_REF;
    if (q) {
        size_t xa_row = 0;
        const uint32_t at = si_act_type(f->gu_type);
        si_type_row_size(at, d, &xa_row);
        char *xa = sc->gemm;
        for (int64_t t = 0; t < nt; t++)
            si_quantize_act(at, xb + t * d, xa + (size_t)t * xa_row, d);
        if (gate != NULL)
            gemm_act(f->gu_type, gate, w->gs, w->gpk, n, d, xa, xa_row, nt, sc->bg, n);
        if (gated) {
            /* gate mode on a few tokens (a step's decoding ones): each
             * token's decoding work, the gating rows read once */
            return gate_first(e, l, f, rec, b, xa, n, nt, y, sc);
        }
        gemm_act(f->gu_type, up, w->us, w->upk, n, d, xa, xa_row, nt, sc->bu, n);
    } else {
        /* the rows as tensors (strides gs, us: records in sparse layouts) */
        const struct si_tensor gt = {.data = gate, .type = f->gu_type, .ne = {d, n, 1, 1},
                                     .nbytes = (size_t)n * w->gs, .row_bytes = w->gs,
                                     .pk = w->gpk},
                               ut = {.data = up, .type = f->gu_type, .ne = {d, n, 1, 1},
                                     .nbytes = (size_t)n * w->us, .row_bytes = w->us,
                                     .pk = w->upk};
        const bool i8 = ar == ARITH_INT8;
        int rc = SI_OK;
        /* rows kept unpacked (records, a hot slice's) are packed on the way
         * (qgemm's tile: sc->dt, free until the down rows below) */
        void *tile = sc->dt;
        const bool gq = gate != NULL && i8 && qgemm(&gt, xb, d, nt, sc->bg, n, sc->gemm, tile);
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
        if (rc == SI_OK && !(i8 && qgemm(&ut, xb, d, nt, sc->bu, n, sc->gemm, tile)))
            rc = w->upk > 0 ? si_k_gemm_tensor(&ut, xb, d, nt, sc->bu, n, sc->gemm)
                            : si_k_gemm(f->gu_type, up, w->us, n, d, xb, d, nt, sc->bu, n,
                                        sc->gemm);
        STARPU_ASSERT_MSG(rc == SI_OK, "prefill GEMM refused its shapes");
    }
    if (b != NULL)
        for (int64_t t = 0; t < nt; t++)
            for (int64_t k = 0; k < n; k++)
                sc->bu[t * n + k] += b[k];
    batch_act(e, l, sc->bg, sc->bu, nt * n);
    if (e->obs_fn != NULL) /* (observed batches: the whole batch at once) */
        keep_observed(e, l, xb, sc->bg, sc->bu, L->s0[j], n);
    int64_t computed = nt * n;
    if (!e->sparse) {
        memcpy(y, sc->bu, (size_t)(nt * n) * sizeof(float));
    } else if (q || (e->bstep && e->p.step_int8)) { /* (each token's own sums, not sgemm's) */
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
    if (e->p.gpu_twin && e->sparse && si__is_hot(e, a->l, a->j)) {
        bffn_twin(buffers, a); /* the GPU's steps, on this CPU worker */
        return;
    }
    struct si__layer_state *L = &e->L[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    const int64_t d = e->m->hp.n_embd, n = L->s0[a->j + 1] - L->s0[a->j];
    const bool bias = e->w->layers[a->l].ffn_up_b.data != NULL;
    double t0 = si__now();
    int i = 0;
    const float *xb = (const float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    const struct si__ffn_fmt *f = &L->f;
    struct bslice w = {.gs = f->gu_row, .us = f->gu_row, .n = n};
    if (!e->sparse) {
        const struct si_layer *W = &e->w->layers[a->l];
        const int64_t n0 = L->s0[a->j];
        if (e->has_gate) {
            w.gate = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
            w.gpk = si__rows_of(&W->ffn_gate, n0, n0 + n).pk;
        }
        w.up = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
        w.upk = si__rows_of(&W->ffn_up, n0, n0 + n).pk;
    } else {
        const char *pre = e->pre_sep ? (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]) : NULL;
        w.rec = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
        const int64_t ppk = pre != NULL ? L->pre_pk[a->j] : 0;
        if (e->has_gate) {
            w.gate = pre != NULL ? pre : w.rec + f->gate_off;
            w.gs = pre != NULL ? f->gu_row : f->rec_bytes;
            w.gpk = pre != NULL ? ppk : 0;
        }
        w.up = f->up_off >= 0 ? w.rec + f->up_off : pre;
        w.us = f->up_off >= 0 ? f->rec_bytes : f->gu_row;
        w.upk = f->up_off >= 0 ? 0 : ppk;
    }
    w.b = bias ? (const float *)STARPU_VECTOR_GET_PTR(buffers[i]) : NULL;
    i++;
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    /* the tokens before the split in the batch's arithmetic, the others
     * (a step's decoding tokens) in theirs (arith_at) */
    const int64_t s = e->bsplit, out_row = e->sparse ? d : n;
    ffn_rows(e, a->l, a->j, &w, xb, s, y, arith_at(e, f->gu_type, 0), sc);
    const int64_t c = ffn_rows(e, a->l, a->j, &w, xb + s * d, e->bn - s, y + s * out_row,
                               arith_at(e, f->gu_type, s), sc);
    if (e->bstep) /* a step's decoding tokens: counted as decoding counts them */
        __atomic_fetch_add(si__is_hot(e, a->l, a->j) ? &e->step_hot : &e->step_cold, c,
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
                    void *buffers[], const int32_t *iota, float *h)
{
    const int64_t d = e->m->hp.n_embd;
    int i = 0;
    const float *xb = (const float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    struct si__ffn_slice w;
    si__ffn_slice_of(e, l, buffers, &i, &w);
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    int rc = 0;
    for (int64_t t = 0; t < e->bn && rc == 0; t++)
        rc = si__ffn_gpu_token(op, e, l, j, &w, xb + t * d, NULL, iota, y + t * d, h);
    if (e->bstep) /* every hot neuron of a step's decoding tokens */
        __atomic_fetch_add(&e->step_hot, (e->bn - e->bsplit) * (int64_t)e->L[l].n_hot,
                           __ATOMIC_RELAXED);
    return rc;
}

static void bffn_twin(void *buffers[], struct si__task_arg *a)
{
    struct si_engine *e = a->e;
    const double t0 = si__now();
    float *h = malloc(2 * (size_t)e->m->hp.n_ff * sizeof *h); /* the GPU's scratch */
    if (h == NULL || bffn_gpu(&si__ffn_twin_ops, e, a->l, a->j, buffers, e->iota, h) != 0)
        STARPU_ABORT_MSG("ffn_batch_hot_L%d: the GPU form's CPU twin is out of memory", a->l);
    free(h);
    si__account(e, SI_TASK_PREFILL_FFN, t0);
}

#ifdef SI_USE_CUDA
static void bffn_cuda(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const double t0 = si__now();
    const int nb = STARPU_TASK_GET_NBUFFERS(starpu_task_get_current());
    const int32_t *iota = (const int32_t *)STARPU_VECTOR_GET_PTR(buffers[nb - 2]);
    float *h = (float *)STARPU_VECTOR_GET_PTR(buffers[nb - 1]);
    const struct si__ffn_ops op = si__ffn_cuda_ops((void *)starpu_cuda_get_local_stream());
    const int rc = bffn_gpu(&op, e, a->l, a->j, buffers, iota, h);
    if (rc != 0)
        STARPU_CUDA_REPORT_ERROR((cudaError_t)rc);
    si__account(e, SI_TASK_PREFILL_FFN, t0);
}
#endif

/*
 * down_cpu for a batch: each token's activations gathered from the slices'
 * outputs, then in the batch's arithmetic (arith_of) the reference's
 * product per token, as in decoding, or batch_products on H.  Output:
 * (n_batch, block rows), token-major.
 */
static void bdown_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct si__layer_state *L = &e->L[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    const int64_t ff = e->m->hp.n_ff, bn = e->bn, no = e->dn[a->j + 1] - e->dn[a->j];
    double t0 = si__now();
    struct si_tensor rows = si__rows_of(&e->w->layers[a->l].ffn_down, e->dn[a->j], e->dn[a->j + 1]);
    rows.data = (const void *)STARPU_MATRIX_GET_PTR(buffers[L->nsl]);
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[L->nsl + 1]);
    for (int64_t t = 0; t < bn; t++)
        si__ffn_gather(L, buffers, t, sc->bu + t * ff);
    for (int64_t t = 0; t < bn; t++) /* the reference's product, token by token */
        if (arith_at(e, rows.type, t) == ARITH_REF)
            si_ref_matvec(true, sc->hq, y + t * no, &rows, sc->bu + t * ff);
    if (arith_at(e, rows.type, 0) != ARITH_REF) /* the others' (before the split) */
        products(arith_of(e, rows.type), &rows, no, sc->bu, ff, e->bsplit, y, no, sc->gemm,
                 sc->dt);
    si__account(e, SI_TASK_PREFILL_FFN_DOWN, t0);
}

static void bmerge_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__layer_state *L = &e->L[a->l];
    struct si_ref *s = e->ref;
    const struct si_layer *W = &e->w->layers[a->l];
    const int64_t d = e->m->hp.n_embd;
    double t0 = si__now();
    for (int32_t t = 0; t < e->bn; t++) {
        for (int32_t k = 0; !e->sparse && k < e->nd; k++) {
            const int64_t no = e->dn[k + 1] - e->dn[k];
            memcpy(s->xb2 + e->dn[k],
                   (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + k]) + (size_t)t * (size_t)no,
                   (size_t)no * sizeof(float));
        }
        bool first = true;
        for (int32_t j = 0; e->sparse && j < L->nsl; j++) {
            const float *p = (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + j]) +
                             (size_t)t * (size_t)L->rows[j] * (size_t)d;
            for (int32_t r = 0; r < L->rows[j]; r++, p += d, first = false)
                for (int64_t o = 0; o < d; o++)
                    s->xb2[o] = first ? p[o] : s->xb2[o] + p[o];
        }
        if (W->ffn_down_b.data != NULL)
            for (int64_t o = 0; o < d; o++)
                s->xb2[o] += ((const float *)W->ffn_down_b.data)[o];
        struct saved sv = point_at(e, t);
        si_ref_ffn_finish(s, a->l);
        restore(e, sv);
    }
    si__account(e, SI_TASK_PREFILL_MERGE, t0);
}

static void bhead_cpu(void *buffers[], void *cl_arg)
{
    (void)buffers;
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    double t0 = si__now();
    /* the last token's logits; xb is the state's own (the logits' input) */
    struct si_ref *s = e->ref;
    float *x = s->x;
    s->x = e->bx + (size_t)(e->bn - 1) * (size_t)e->m->hp.n_embd;
    s->n_past = e->bpos[e->bn - 1];
    si_ref_end(s);
    s->x = x;
    si__account(e, SI_TASK_PREFILL_HEAD, t0);
}

/*
 * The LM head over the batch's tokens bout0 .. bn - 1, vocabulary rows
 * [lh[j], lh[j+1]) of each: their final norms, then the rows times them,
 * through batch_products (the reference's dots with converted activations
 * where exactness is asked or the batch is small, else si_k_gemm).
 * Buffers: x_batch (R), the LM head (R), this slice of the logits rows (W).
 */
static void bhead_rows_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    const struct si_model *m = e->m;
    const int64_t d = m->hp.n_embd, nt = e->bn - e->bout0;
    double t0 = si__now();
    const float *bx = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const char *w = (const char *)STARPU_VECTOR_GET_PTR(buffers[1]);
    float *y = (float *)STARPU_MATRIX_GET_PTR(buffers[2]);
    const int64_t ldy = STARPU_MATRIX_GET_LD(buffers[2]);
    const int64_t r0 = (int64_t)e->lh[a->j], nr = (int64_t)e->lh[a->j + 1] - r0;
    struct si_tensor rows = si__rows_of(&e->w->output, r0, r0 + nr);
    rows.data = w + (size_t)r0 * rows.row_bytes; /* the handle's copy */
    for (int64_t t = 0; t < nt; t++) {
        const int64_t row = e->bstep ? e->bhrow[t] : e->bout0 + t;
        si_ref_head_input(e->ref, bx + (size_t)row * (size_t)d, sc->hx + t * d, sc->tmp);
    }
    /* a step's logits as each sequence's alone: the reference's (the
     * prompt's last token's head, si_ref_end, or decoding's), or step_int8's */
    products(e->bstep && e->p.ref.act_quant && !e->p.step_int8 ? ARITH_REF
                                                                : arith_of(e, rows.type),
             &rows, nr, sc->hx, d, nt, y, ldy, sc->gemm, sc->dt);
    si__account(e, SI_TASK_PREFILL_HEAD, t0);
}

static struct starpu_perfmodel bembed_model = {.type = STARPU_HISTORY_BASED,
                                               .symbol = "si_embed_batch"};
static struct starpu_perfmodel battn_model = {.type = STARPU_HISTORY_BASED,
                                              .symbol = "si_attn_qkv_batch"};
static struct starpu_perfmodel bakv_model = {.type = STARPU_HISTORY_BASED,
                                             .symbol = "si_attn_kv_batch"};
static struct starpu_perfmodel bacore_model = {.type = STARPU_HISTORY_BASED,
                                               .symbol = "si_attn_core_batch"};
static struct starpu_perfmodel bao_model = {.type = STARPU_HISTORY_BASED,
                                            .symbol = "si_attn_o_batch"};
static struct starpu_perfmodel baout_model = {.type = STARPU_HISTORY_BASED,
                                              .symbol = "si_attn_out_batch"};
static struct starpu_perfmodel bffn_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_ffn_gemm"};
static struct starpu_perfmodel bdown_model = {.type = STARPU_HISTORY_BASED,
                                              .symbol = "si_ffn_down_batch"};
static struct starpu_perfmodel bmerge_model = {.type = STARPU_HISTORY_BASED,
                                               .symbol = "si_merge_batch"};
static struct starpu_perfmodel bhead_model = {.type = STARPU_HISTORY_BASED,
                                              .symbol = "si_head_batch"};

struct starpu_codelet si__cl_bembed = {
    .cpu_funcs = {bembed_cpu},
    .nbuffers = 1,
    .modes = {STARPU_W},
    .model = &bembed_model,
    .name = "embed_batch",
};
struct starpu_codelet si__cl_battn = {
    .cpu_funcs = {battn_cpu},
    .nbuffers = 5,
    .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W},
    .model = &battn_model,
    .name = "attn_batch",
};
struct starpu_codelet si__cl_bakv = {
    .cpu_funcs = {bakv_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &bakv_model,
    .name = "attn_kv_batch",
};
struct starpu_codelet si__cl_bacore = {
    .cpu_funcs = {bacore_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &bacore_model,
    .name = "attn_core_batch",
};
struct starpu_codelet si__cl_bao = {
    .cpu_funcs = {bao_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &bao_model,
    .name = "attn_o_batch",
};
struct starpu_codelet si__cl_baout = {
    .cpu_funcs = {baout_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &baout_model,
    .name = "attn_out_batch",
};
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
static struct starpu_perfmodel bhead_rows_model = {.type = STARPU_HISTORY_BASED,
                                                   .symbol = "si_head_rows_batch"};

struct starpu_codelet si__cl_bhead_rows = {
    .cpu_funcs = {bhead_rows_cpu},
    .nbuffers = 3,
    .modes = {STARPU_R, STARPU_R, STARPU_W},
    .model = &bhead_rows_model,
    .name = "norm+lm_head_batch",
};
struct starpu_codelet si__cl_bhead = {
    .cpu_funcs = {bhead_cpu},
    .nbuffers = 4,
    .modes = {STARPU_R, STARPU_RW, STARPU_W, STARPU_R},
    .model = &bhead_model,
    .name = "norm+lm_head_last",
};
