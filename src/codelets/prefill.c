/*
 * prefill.c - the batches' arithmetic (prefill.h) and a batch's two ends as
 * tasks: the embedding, and the LM head (the last token's, or rows of
 * tokens).  The layers' batch tasks are in prefill_attn.c and prefill_ffn.c.
 */
#include "codelets/prefill.h"

#include "codelets/codelets.h"
#include "codelets/ops.h"
#include "model/act.h"
#include "model/forward.h"
#include "model/pack8.h"
#include "model/quants.h"
#include "model/types.h"
#include "starinfer.h"

#include <starpu.h>
#include <stdlib.h>
#include <string.h>

/* See prefill.h. */
enum si__arith si__arith_of(const struct si_engine *e, uint32_t t)
{
    if (!e->p.ref.act_quant)
        return SI__ARITH_BLAS;
    /* step_int8's steps: the batched kernel's per-token sums, or the
     * reference's; never sgemm's, whose sums of a row depend on the rows
     * beside it */
    if (e->bat.bstep && e->p.step_int8)
        return si_gemm8_available(t) ? SI__ARITH_INT8 : SI__ARITH_REF;
    /* (a step's prompt tokens are those of prompts of SI__BLAS_MIN_BATCH
     * tokens or more, whatever the step's size) */
    if (e->p.prefill == SI_PREFILL_EXACT || (!e->bat.bstep && e->bat.bn < SI__BLAS_MIN_BATCH))
        return SI__ARITH_REF;
    const bool kernel = si_gemm8_available(t);
    switch (e->p.prefill) {
    case SI_PREFILL_INT8:
        return kernel ? SI__ARITH_INT8 : SI__ARITH_REF;
    case SI_PREFILL_BLAS:
        return SI__ARITH_BLAS;
    default:
        return kernel ? SI__ARITH_INT8 : SI__ARITH_BLAS; /* auto */
    }
}

/* The arithmetic of the batch's token t: arith_of, or the reference's for
 * a step's decoding tokens (bsplit and after; float inputs without
 * act_quant, as the reference's). */
enum si__arith si__arith_at(const struct si_engine *e, uint32_t type, int64_t t)
{
    return t >= e->bat.bsplit && e->p.ref.act_quant ? SI__ARITH_REF : si__arith_of(e, type);
}

/*
 * y[t][r] = row r . xa[t] for a tile of rows at a time (the rows stay in
 * cache while every token of the batch uses them): the reference's own dot
 * on activations converted by si_quantize_act, so each value equals the
 * token-by-token one bit for bit; the first pk rows packed 8 at a time
 * (model/pack8.h), a tile being one group.  xa[t] at xa + t * xa_stride
 * bytes.
 */
void si__gemm_act(uint32_t type, const char *w, size_t row_bytes, int64_t pk, int64_t n_rows,
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

/* See prefill.h. */
void si__products_ranges(bool act_quant, const struct si_tensor *w, const int64_t *cb, int nr,
                         const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy,
                         void *scratch)
{
    const struct si_type_traits *wt = si_type_get(w->type);
    const int64_t n = w->ne[0];
    const uint32_t at = si_act_type(w->type);
    size_t xr = 0;
    const char *xa = scratch;
    if (act_quant) { /* each token converted whole: the conversion is per block */
        si_type_row_size(at, n, &xr);
        for (int64_t t = 0; t < n_tok; t++)
            si_quantize_act(at, x + t * ldx, (char *)scratch + (size_t)t * xr, n);
    } else {
        STARPU_ASSERT_MSG(w->pk == 0, "packed rows need converted activations");
    }
    for (int64_t r0 = 0; r0 < w->ne[1]; r0 += 8) {
        const int64_t r1 = r0 + 8 < w->ne[1] ? r0 + 8 : w->ne[1];
        const char *row = (const char *)w->data + (size_t)r0 * w->row_bytes;
        for (int64_t t = 0; t < n_tok; t++) {
            float *yt = y + t * ldy;
            for (int g = 0; g < nr; g++) {
                const int64_t c0 = cb[g], nc = cb[g + 1] - c0;
                const size_t off = (size_t)(c0 / wt->block) * wt->size;
                size_t aoff = 0; /* the range's first block of the converted input */
                if (act_quant)
                    si_type_row_size(at, c0, &aoff);
                const char *xt = xa + (size_t)t * xr + aoff;
                float o[8];
                if (r0 < w->pk) /* a group of 8 packed rows: range g at 8 times off */
                    si_vec_dot_act8(w->type, row + 8 * off, xt, nc, o);
                else
                    for (int64_t r = r0; r < r1; r++) {
                        const char *wr = row + (size_t)(r - r0) * w->row_bytes + off;
                        o[r - r0] = act_quant ? si_vec_dot_act(w->type, wr, xt, nc)
                                              : si_vec_dot(w->type, wr, x + t * ldx + c0, nc);
                    }
                for (int64_t r = r0; r < r1; r++) /* range 0's product, then the others added */
                    yt[r] = g == 0 ? o[r - r0] : yt[r] + o[r - r0];
            }
        }
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
bool si__qgemm(const struct si_tensor *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
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

/* See prefill.h. */
void si__products(enum si__arith ar, const struct si_tensor *w, int64_t n_rows, const float *x,
                  int64_t n_cols, int64_t n_tok, float *y, int64_t ldy, void *scratch, void *tile)
{
    STARPU_ASSERT(n_rows == w->ne[1]);
    if (n_tok <= 0)
        return;
    switch (ar) {
    case SI__ARITH_REF: {
        size_t xa_row = 0;
        const uint32_t at = si_act_type(w->type);
        si_type_row_size(at, n_cols, &xa_row);
        char *xa = scratch;
        for (int64_t t = 0; t < n_tok; t++)
            si_quantize_act(at, x + t * n_cols, xa + (size_t)t * xa_row, n_cols);
        si__gemm_act(w->type, w->data, w->row_bytes, w->pk, n_rows, n_cols, xa, xa_row, n_tok, y,
                     ldy);
        return;
    }
    case SI__ARITH_INT8: {
        const bool done = si__qgemm(w, x, n_cols, n_tok, y, ldy, scratch, tile);
        STARPU_ASSERT_MSG(done, "no batched integer kernel for a type that has one");
        return;
    }
    case SI__ARITH_BLAS: {
        const int rc = si_k_gemm_tensor(w, x, n_cols, n_tok, y, ldy, scratch);
        STARPU_ASSERT_MSG(rc == SI_OK, "prefill GEMM refused its shapes");
        return;
    }
    }
}

/* See prefill.h. */
void si__batch_products(const struct si_engine *e, const struct si_tensor *w, int64_t n_rows,
                        const float *x, int64_t n_cols, int64_t tok0, int64_t n_tok, float *y,
                        int64_t ldy, void *scratch, void *tile)
{
    int64_t s = e->bat.bsplit - tok0; /* the tokens before the split */
    s = s < 0 ? 0 : s > n_tok ? n_tok : s;
    si__products(si__arith_at(e, w->type, tok0), w, n_rows, x, n_cols, s, y, ldy, scratch, tile);
    si__products(si__arith_at(e, w->type, tok0 + s), w, n_rows, x + s * n_cols, n_cols, n_tok - s,
                 y + s * ldy, ldy, scratch, tile);
}

/* embed_batch: x_batch (W). */
static float *bembed_bufs(struct si__bufs *b, struct si_engine *e)
{
    return si__vec(b, e->bat.h_bx, STARPU_W);
}

/* Each token's embedding into its row of x_batch. */
static void bembed_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__bufs b = si__bufs_read(buffers);
    float *bx = bembed_bufs(&b, e);
    const size_t d = (size_t)e->m->hp.n_embd;
    double t0 = si__now();
    for (int32_t t = 0; t < e->bat.bn; t++)
        /* (checked before submission; the position is the token's own:
         * ref's n_past is its sequence's, which a step may not hold) */
        si_ref_begin_into(e->ref, e->bat.btok[t], e->bat.bpos[t], bx + (size_t)t * d);
    si__account(e, SI_TASK_PREFILL_EMBED, t0);
}

int si__submit_bembed(struct si_engine *e)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    bembed_bufs(&b, e);
    return si__submit(e, &si__cl_bembed, "embed_batch", -1, -1, 0, &a, 0);
}

/* norm+lm_head_last: x_batch (R), xb (RW: the norm's output), logits (W),
 * output (R: the LM head, read through the reference's lm_head). */
struct bhead_io {
    const float *bx;
    float *xn, *logits;
};

static void bhead_bufs(struct si__bufs *b, struct si_engine *e, struct bhead_io *io)
{
    io->bx = si__vec(b, e->bat.h_bx, STARPU_R);
    io->xn = si__vec(b, e->dec.h_ffn_in, STARPU_RW);
    io->logits = si__vec(b, e->dec.h_logits, STARPU_W);
    si__buf(b, e->dec.h_out, STARPU_R);
}

/* The batch's last token's logits, as si_ref_end gives them. */
static void bhead_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct bhead_io io;
    struct si__bufs b = si__bufs_read(buffers);
    bhead_bufs(&b, e, &io);
    double t0 = si__now();
    e->ref->n_past = e->bat.bpos[e->bat.bn - 1];
    si_ref_end_into(e->ref, io.bx + (size_t)(e->bat.bn - 1) * (size_t)e->m->hp.n_embd, io.xn,
                    io.logits);
    si__account(e, SI_TASK_PREFILL_HEAD, t0);
}

int si__submit_bhead(struct si_engine *e)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    bhead_bufs(&b, e, &(struct bhead_io){0});
    return si__submit(e, &si__cl_bhead, "norm+lm_head_last", -1, -1, 0, &a, 0);
}

/* norm+lm_head_batch.j: x_batch (R), the LM head (R), this slice of the
 * logits rows (W: a matrix, a row per token). */
struct bhead_rows_io {
    const float *bx;
    const char *w;
    float *y;
    int64_t ldy;
};

static void bhead_rows_bufs(struct si__bufs *b, struct si_engine *e, int j,
                            struct bhead_rows_io *io)
{
    io->bx = si__vec(b, e->bat.h_bx, STARPU_R);
    io->w = si__vec(b, e->dec.h_out, STARPU_R);
    void *y = si__buf(b, e->bat.h_blog_c[j], STARPU_W);
    io->y = y != NULL ? (float *)STARPU_MATRIX_GET_PTR(y) : NULL;
    io->ldy = y != NULL ? (int64_t)STARPU_MATRIX_GET_LD(y) : 0;
}

/*
 * The LM head over the batch's tokens bout0 .. bn - 1, vocabulary rows
 * [lh[j], lh[j+1]) of each: their final norms, then the rows times them,
 * through si__products (the reference's dots with converted activations
 * where exactness is asked or the batch is small, else si_k_gemm).
 */
static void bhead_rows_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    const struct si_model *m = e->m;
    const int64_t d = m->hp.n_embd, nt = e->bat.bn - e->bat.bout0;
    struct bhead_rows_io io;
    struct si__bufs b = si__bufs_read(buffers);
    bhead_rows_bufs(&b, e, a->j, &io);
    double t0 = si__now();
    const int64_t r0 = (int64_t)e->bat.lh[a->j], nr = (int64_t)e->bat.lh[a->j + 1] - r0;
    struct si_tensor rows = si__rows_of(&e->w->output, r0, r0 + nr);
    rows.data = io.w + (size_t)r0 * rows.row_bytes; /* the handle's copy */
    for (int64_t t = 0; t < nt; t++) {
        const int64_t row = e->bat.bstep ? e->bat.bhrow[t] : e->bat.bout0 + t;
        si_ref_head_input(e->ref, io.bx + (size_t)row * (size_t)d, sc->hx + t * d, sc->tmp);
    }
    /* a step's logits as each sequence's alone: the reference's (the
     * prompt's last token's head, si_ref_end, or decoding's), or step_int8's */
    si__products(e->bat.bstep && e->p.ref.act_quant && !e->p.step_int8 ? SI__ARITH_REF
                                                                       : si__arith_of(e, rows.type),
                 &rows, nr, sc->hx, d, nt, io.y, io.ldy, sc->gemm, sc->dt);
    si__account(e, SI_TASK_PREFILL_HEAD, t0);
}

int si__submit_bhead_rows(struct si_engine *e, int j)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    bhead_rows_bufs(&b, e, j, &(struct bhead_rows_io){0});
    return si__submit(e, &si__cl_bhead_rows, e->bat.name_lhb[j], -1, j, 0, &a, STARPU_CPU);
}

static struct starpu_perfmodel bembed_model = {.type = STARPU_HISTORY_BASED,
                                               .symbol = "si_embed_batch"};
static struct starpu_perfmodel bhead_model = {.type = STARPU_HISTORY_BASED,
                                              .symbol = "si_head_batch"};
static struct starpu_perfmodel bhead_rows_model = {.type = STARPU_HISTORY_BASED,
                                                   .symbol = "si_head_rows_batch"};

struct starpu_codelet si__cl_bembed = {
    .cpu_funcs = {bembed_cpu},
    .nbuffers = 1,
    .modes = {STARPU_W},
    .model = &bembed_model,
    .name = "embed_batch",
};
struct starpu_codelet si__cl_bhead = {
    .cpu_funcs = {bhead_cpu},
    .nbuffers = 4,
    .modes = {STARPU_R, STARPU_RW, STARPU_W, STARPU_R},
    .model = &bhead_model,
    .name = "norm+lm_head_last",
};
struct starpu_codelet si__cl_bhead_rows = {
    .cpu_funcs = {bhead_rows_cpu},
    .nbuffers = 3,
    .modes = {STARPU_R, STARPU_R, STARPU_W},
    .model = &bhead_rows_model,
    .name = "norm+lm_head_batch",
};
