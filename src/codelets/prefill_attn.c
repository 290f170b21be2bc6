/*
 * prefill_attn.c - a layer's attention over a batch of tokens as tasks: q, k
 * and v by token ranges or kv-head groups (attn_batch_L.r), each group's k
 * and v into the cache (attn_kv_batch_L.g), each group's attention in token
 * ranges of about equal work (attn_core_batch_L.g.r), Wo's product by row
 * slices (attn_o_batch_L.j) and the residual (attn_out_batch_L).
 */
#include "codelets/codelets.h"
#include "codelets/prefill.h"

#include "model/forward.h"

#include <starpu.h>
#include <string.h>

/* The row of q | k | v of the batch's token t whose kv-head group g (of
 * a_g) is read: in bqkv[r], r its range of btp, or with bheads r = g (the
 * outputs of the attn_batch_L.r tasks). */
static const float *qkv_row(const struct si_engine *e, const float *const *bqkv, int64_t t, int g)
{
    const struct si_hparams *hp = &e->m->hp;
    const size_t row = (size_t)(hp->n_head + 2 * hp->n_head_kv) * (size_t)hp->head_dim;
    int r = 0;
    if (e->bat.bheads)
        r = g;
    else
        while (t >= e->bat.btp[r + 1])
            r++;
    return bqkv[r] + (size_t)t * row;
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
    const int64_t d = hp->n_embd, hd = hp->head_dim, n = e->bat.bn,
                  group = hp->n_head / hp->n_head_kv;
    const int64_t qd = hp->n_head * hd, kvd = hp->n_head_kv * hd, row = qd + 2 * kvd;
    const int64_t g0 = e->dec.a_g[r], g1 = e->dec.a_g[r + 1];
    float *y = sc->hx;
    for (int64_t t = 0; t < n; t++)
        si_ref_attn_input(e->ref, l, bx + t * d, y + t * d, sc->tmp);
    const struct si_tensor wq = si__rows_of(&W->wq, g0 * group * hd, g1 * group * hd),
                           wk = si__rows_of(&W->wk, g0 * hd, g1 * hd),
                           wv = si__rows_of(&W->wv, g0 * hd, g1 * hd);
    si__batch_products(e, &wq, wq.ne[1], y, d, 0, n, out + g0 * group * hd, row, sc->gemm, sc->dt);
    si__batch_products(e, &wk, wk.ne[1], y, d, 0, n, out + qd + g0 * hd, row, sc->gemm, sc->dt);
    si__batch_products(e, &wv, wv.ne[1], y, d, 0, n, out + qd + kvd + g0 * hd, row, sc->gemm,
                       sc->dt);
    for (int64_t t = 0; t < n; t++) {
        float *q = out + t * row;
        si_ref_attn_group_prepare_at(e->ref, l, (int)e->bat.bpos[t], (int)g0, (int)g1, q, q + qd,
                                     q + qd + kvd, sc->ascr);
    }
}

/*
 * attn_batch_L.r: the batch's tokens [btp[r], btp[r+1]): the attention's
 * normalised inputs, q, k and v for all of them at once (GEMMs), then per
 * token at its position si_ref_attn_group_prepare_at over every head
 * (biases, QK norm, RoPE, in place), into their rows of bqkv_r; with
 * bheads, kv-head group r's part of every token (battn_heads).
 * Buffers: x_batch (R), [Wq, Wk, Wv (R): with a GPU in the graph], bqkv_r (W).
 */
struct battn_io {
    const float *bx;
    float *out;
};

static void battn_bufs(struct si__bufs *b, struct si_engine *e, int l, int r, struct battn_io *io)
{
    io->bx = si__vec(b, e->bat.h_bx, STARPU_R);
    for (int i = 0; i < 3; i++) /* (read through e->w: buffers only with a GPU, codelets.h) */
        (void)si__wvec(b, e, e->L[l].h_w[i]);
    io->out = si__vec(b, e->bat.h_bqkv[r], STARPU_W);
}

static void battn_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->w->layers[a->l];
    struct battn_io io;
    struct si__bufs b = si__bufs_read(buffers);
    battn_bufs(&b, e, a->l, a->j, &io);
    if (e->bat.bheads) {
        const double t0 = si__now();
        battn_heads(e, a->l, a->j, io.bx, io.out, sc);
        si__account(e, SI_TASK_PREFILL_ATTN, t0);
        return;
    }
    const int64_t d = hp->n_embd, hd = hp->head_dim, t0 = e->bat.btp[a->j],
                  nt = e->bat.btp[a->j + 1] - t0;
    const int64_t qd = hp->n_head * hd, kvd = hp->n_head_kv * hd, row = qd + 2 * kvd;
    double start = si__now();
    const float *bx = io.bx;
    float *out = io.out + t0 * row;
    float *y = sc->hx;
    for (int64_t t = 0; t < nt; t++)
        si_ref_attn_input(e->ref, a->l, bx + (t0 + t) * d, y + t * d, sc->tmp);
    if (e->obs.fn != NULL) /* si_ffn_view's xa: rows of the batch's tokens, this layer's */
        memcpy(e->obs.a + ((size_t)a->l * (size_t)e->obs.nb + (size_t)t0) * (size_t)d, y,
               (size_t)(nt * d) * sizeof(float));
    if (nt > 0) {
        si__batch_products(e, &W->wq, qd, y, d, t0, nt, out, row, sc->gemm, sc->dt);
        si__batch_products(e, &W->wk, kvd, y, d, t0, nt, out + qd, row, sc->gemm, sc->dt);
        si__batch_products(e, &W->wv, kvd, y, d, t0, nt, out + qd + kvd, row, sc->gemm, sc->dt);
    }
    for (int64_t t = 0; t < nt; t++) {
        float *q = out + t * row;
        si_ref_attn_group_prepare_at(e->ref, a->l, (int)e->bat.bpos[t0 + t], 0, hp->n_head_kv, q,
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
struct bkv_io {
    const float *bqkv[SI__MAX_SLICES + 1];
};

/* The k and v caches of group g in mode m, after bqkv_* (R). */
static void bkv_bufs(struct si__bufs *b, struct si_engine *e, int l, int g,
                     enum starpu_data_access_mode m, struct bkv_io *io)
{
    struct si__layer_state *L = &e->L[l];
    for (int32_t r = 0; r < e->bat.nr; r++)
        io->bqkv[r] = si__vec(b, e->bat.h_bqkv[r], STARPU_R);
    si__buf(b, e->dec.ng > 1 ? L->h_k_c[g] : L->h_k, m);
    si__buf(b, e->dec.ng > 1 ? L->h_v_c[g] : L->h_v, m);
}

static void bakv_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct si_hparams *hp = &e->m->hp;
    const int64_t qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
    struct bkv_io io;
    struct si__bufs b = si__bufs_read(buffers);
    bkv_bufs(&b, e, a->l, a->j, STARPU_RW, &io);
    double t0 = si__now();
    for (int64_t t = 0; t < e->bat.bn; t++) {
        const float *q = qkv_row(e, io.bqkv, t, a->j);
        si_ref_attn_group_cache_at(e->bat.bseq[t], a->l, (int)e->bat.bpos[t], (int)e->dec.a_g[a->j],
                                   (int)e->dec.a_g[a->j + 1], q + qd, q + qd + kvd);
    }
    si__account(e, SI_TASK_PREFILL_ATTN, t0);
}

/*
 * attn_core_batch_L.c.r (j = c * nr + r): head chunk c's attention (state.h)
 * for the batch's tokens [btr[r], btr[r+1]), each at its position (their q
 * prepared, every position up to theirs cached), into those rows of
 * att_j, a row of the chunk's query heads per token.
 * Buffers: bqkv_* (R), K_g, V_g (R) of the chunk's group g, att_j (W).
 */
static float *bacore_bufs(struct si__bufs *b, struct si_engine *e, int l, int j, struct bkv_io *io)
{
    bkv_bufs(b, e, l, e->bat.c_g[j / e->bat.nr], STARPU_R, io);
    return si__vec(b, e->bat.h_batt[j], STARPU_W);
}

static void bacore_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    const struct si_hparams *hp = &e->m->hp;
    const int c = a->j / e->bat.nr, r = a->j % e->bat.nr, g = e->bat.c_g[c];
    const int64_t hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const int64_t g0 = e->bat.c_h[c], g1 = e->bat.c_h[c + 1], nq = (g1 - g0) * group * hd;
    struct bkv_io io;
    struct si__bufs b = si__bufs_read(buffers);
    float *att = bacore_bufs(&b, e, a->l, a->j, &io);
    double t0 = si__now();
    const size_t row = (size_t)(hp->n_head + 2 * hp->n_head_kv) * (size_t)hd;
    /* runs of tokens of one sequence whose q rows follow one another,
     * attended together (their tiles of the cache read once) */
    for (int64_t t = e->bat.btr[r], u; t < e->bat.btr[r + 1]; t = u) {
        const float *q = qkv_row(e, io.bqkv, t, g);
        for (u = t + 1; u < e->bat.btr[r + 1] && e->bat.bseq[u] == e->bat.bseq[t] &&
                        qkv_row(e, io.bqkv, u, g) == q + (size_t)(u - t) * row;
             u++)
            ;
        si_ref_attn_group_attend_rows(e->bat.bseq[t], a->l, e->bat.bpos + t, (int)(u - t), (int)g0,
                                      (int)g1, q, row, att + t * nq, (size_t)nq, sc->ascr);
    }
    si__account(e, SI_TASK_PREFILL_ATTN, t0);
}

/*
 * attn_o_batch_L.j: the groups' attention outputs gathered per token, then
 * Wo's rows [bo_c[j], bo_c[j+1]) times them for every token at once, into
 * bo_j (a row of that many per token).
 * Buffers: att_* (R), [Wo (R): with a GPU in the graph], bo_j (W).
 */
struct bao_io {
    const float *att[SI__MAX_SLICES + 1];
    float *o;
};

static void bao_bufs(struct si__bufs *b, struct si_engine *e, int l, int j, struct bao_io *io)
{
    for (int32_t k = 0; k < e->bat.nc * e->bat.nr; k++)
        io->att[k] = si__vec(b, e->bat.h_batt[k], STARPU_R);
    (void)si__wvec(b, e, e->L[l].h_w[3]); /* (read through e->w) */
    io->o = si__vec(b, e->bat.h_bo[j], STARPU_W);
}

/* Wo's rows [c0, c0 + w) times every token's attention output (att: qd
 * floats a token) into o (w a token).  A step's decoding tokens whose
 * attention groups would multiply Wo alone (si__wo_fused_at, at the
 * token's position) take it as those groups do (si__products_ranges over
 * the decoding groups' columns), so that a context sharing an engine gets
 * the tokens of a context of its own; the other tokens by rows. */
static void bao_products(struct si_engine *e, int l, int64_t c0, int64_t w, const float *att,
                         float *o, struct si__scratch *sc)
{
    const struct si_hparams *hp = &e->m->hp;
    const int64_t bn = e->bat.bn, qd = (int64_t)hp->n_head * hp->head_dim;
    const int64_t cols = (int64_t)(hp->n_head / hp->n_head_kv) * hp->head_dim;
    const struct si_tensor wo = si__rows_of(&e->w->layers[l].wo, c0, c0 + w);
    int64_t cb[SI__MAX_SLICES + 1];
    STARPU_ASSERT(e->dec.ng <= SI__MAX_SLICES);
    for (int32_t g = 0; g <= e->dec.ng && e->lay.fuse_wo; g++)
        cb[g] = e->dec.a_g[g] * cols;
    for (int64_t t = 0; t < bn;) {
        const bool f = t >= e->bat.bdec && si__wo_fused_at(e, l, e->bat.bpos[t]);
        int64_t u = t < e->bat.bdec ? e->bat.bdec : t + 1; /* a run of tokens alike */
        while (t >= e->bat.bdec && u < bn && f == si__wo_fused_at(e, l, e->bat.bpos[u]))
            u++;
        if (f)
            si__products_ranges(e->p.ref.act_quant, &wo, cb, e->dec.ng, att + t * qd, qd, u - t,
                                o + t * w, w, sc->gemm);
        else
            si__batch_products(e, &wo, w, att + t * qd, qd, t, u - t, o + t * w, w, sc->gemm,
                               sc->dt);
        t = u;
    }
}

static void bao_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    const struct si_hparams *hp = &e->m->hp;
    const int64_t qd = (int64_t)hp->n_head * hp->head_dim;
    const int nb = e->bat.nc * e->bat.nr;
    const int64_t c0 = e->bat.bo_c[a->j], w = e->bat.bo_c[a->j + 1] - c0;
    struct bao_io io;
    struct si__bufs b = si__bufs_read(buffers);
    bao_bufs(&b, e, a->l, a->j, &io);
    double t0 = si__now();
    float *att = sc->bqkv;
    for (int j = 0; j < nb; j++) {
        const int c = j / e->bat.nr, r = j % e->bat.nr;
        const float *ag = io.att[j];
        const int64_t gw = si__chunk_len(e, c),
                      off = e->bat.c_h[c] * (hp->n_head / hp->n_head_kv) * hp->head_dim;
        for (int64_t t = e->bat.btr[r]; t < e->bat.btr[r + 1]; t++)
            memcpy(att + t * qd + off, ag + t * gw, (size_t)gw * sizeof(float));
    }
    float *o = io.o;
    if (w > 0)
        bao_products(e, a->l, c0, w, att, o, sc);
    si__account(e, SI_TASK_PREFILL_ATTN, t0);
}

/*
 * attn_out_batch_L: the projections gathered per token, then per token the
 * reference's finish (bias, post-norm, residual; the FFN's normalised input).
 * Buffers: bo_* (R), x_batch (RW), ffn_in_batch (W), xb3_batch (W).
 */
struct baout_io {
    const float *bo[SI__MAX_SLICES + 1];
    float *bx, *bffn_in, *bxb3;
};

static void baout_bufs(struct si__bufs *b, struct si_engine *e, struct baout_io *io)
{
    for (int32_t j = 0; j < e->bat.nr; j++)
        io->bo[j] = si__vec(b, e->bat.h_bo[j], STARPU_R);
    io->bx = si__vec(b, e->bat.h_bx, STARPU_RW);
    io->bffn_in = si__vec(b, e->bat.h_bffn_in, STARPU_W);
    io->bxb3 = si__vec(b, e->bat.h_bxb3, STARPU_W);
}

static void baout_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    const int64_t d = e->m->hp.n_embd, bn = e->bat.bn;
    const int nr = e->bat.nr;
    struct baout_io io;
    struct si__bufs b = si__bufs_read(buffers);
    baout_bufs(&b, e, &io);
    double t0 = si__now();
    float *o = sc->hx;
    for (int j = 0; j < nr; j++) {
        const float *bo = io.bo[j];
        const int64_t c0 = e->bat.bo_c[j], w = e->bat.bo_c[j + 1] - c0;
        for (int64_t t = 0; t < bn && w > 0; t++)
            memcpy(o + t * d + c0, bo + t * w, (size_t)w * sizeof(float));
    }
    float *bx = io.bx, *bffn_in = io.bffn_in, *bxb3 = io.bxb3;
    for (int64_t t = 0; t < bn; t++)
        si_ref_attn_finish_into(e->ref, a->l, bx + t * d, o + t * d, bx + t * d, bffn_in + t * d,
                                bxb3 + t * d, sc->tmp);
    if (e->obs.fn != NULL) /* si_ffn_view's xr: the residual the FFN's norm read */
        memcpy(e->obs.r + (size_t)a->l * (size_t)e->obs.nb * (size_t)d, bx,
               (size_t)(bn * d) * sizeof(float));
    si__account(e, SI_TASK_PREFILL_ATTN, t0);
}

/* The batch's attention of layer l: x_b += attention_l(norm(x_b)) for the
 * batch's tokens (K, V of the new positions written); xb_b = the FFN's
 * input. */
int si__submit_battn(struct si_engine *e, int l)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    struct si__bufs b;
    int rc = 0;
    for (int32_t r = 0; r < e->bat.nr && rc == 0; r++) {
        b = si__bufs_collect(&a);
        battn_bufs(&b, e, l, r, &(struct battn_io){0});
        rc = si__submit(e, &si__cl_battn, L->name_bagrp[r], l, r, 0, &a, STARPU_CPU);
    }
    struct bkv_io kv;
    for (int32_t g = 0; g < e->dec.ng && rc == 0; g++) {
        b = si__bufs_collect(&a);
        bkv_bufs(&b, e, l, g, STARPU_RW, &kv);
        rc = si__submit(e, &si__cl_bakv, L->name_bakv[g], l, g, 0, &a, STARPU_CPU);
        for (int32_t j = 0; j < e->bat.nc * e->bat.nr && rc == 0; j++) {
            if (e->bat.c_g[j / e->bat.nr] != g)
                continue;
            b = si__bufs_collect(&a);
            bacore_bufs(&b, e, l, j, &kv);
            rc = si__submit(e, &si__cl_bacore, L->name_bacore[j], l, j, 0, &a, STARPU_CPU);
        }
    }
    for (int32_t j = 0; j < e->bat.nr && rc == 0; j++) {
        b = si__bufs_collect(&a);
        bao_bufs(&b, e, l, j, &(struct bao_io){0});
        rc = si__submit(e, &si__cl_bao, L->name_bao[j], l, j, 0, &a, STARPU_CPU);
    }
    if (rc == 0) {
        b = si__bufs_collect(&a);
        baout_bufs(&b, e, &(struct baout_io){0});
        rc = si__submit(e, &si__cl_baout, L->name_battn, l, -1, 0, &a, STARPU_CPU);
    }
    return rc;
}

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

struct starpu_codelet si__cl_battn = {
    .cpu_funcs = {battn_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS, /* the weights only with a GPU in the graph */
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
