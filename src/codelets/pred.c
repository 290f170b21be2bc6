/*
 * pred.c - which FFN neurons fire: the predictor task (predictor mode) and gate mode's masks of
 * the flash tier's cold slices.
 */
#include "codelets/codelets.h"

#include "model/act.h"
#include "model/forward.h"

#include <math.h>
#include <starpu.h>

/* pred_L: the predictor's input (R: ffn_in, or x: model.h's
 * si_pred_input; a lookahead predictor, x and the carried FFN output), [fc1,
 * fc2 (R: position order): with a GPU in the graph], idx of each slice (W). */
struct pred_io {
    const float *in;
    const void *fc2;
    int32_t *idx[SI__MAX_SLICES + 1];
    struct si__carried c;
};

static void pred_bufs(struct si__bufs *b, struct si_engine *e, int l, struct pred_io *io)
{
    struct si__layer_state *L = &e->L[l];
    io->c.n = 0;
    if (e->m->pred_input == SI_PRED_LAYER) {
        io->in = si__vec(b, e->dec.h_x, STARPU_R);
        si__carried_bufs(b, e, l, &io->c);
    } else {
        io->in = si__vec(b, e->m->pred_input == SI_PRED_RESIDUAL ? e->dec.h_x : e->dec.h_ffn_in,
                         STARPU_R);
    }
    (void)si__wvec(b, e, L->h_fc1); /* (read through the model's fc1) */
    io->fc2 = si__wvec(b, e, L->h_fc2);
    for (int32_t j = 0; j < L->nsl; j++)
        io->idx[j] = si__vec(b, L->h_idx_c[j], STARPU_W);
}

/* The reference's predictor; a lookahead one reads the attention's
 * normalised input, the layer's input residual made as the attention
 * tasks make it. */
static void pred_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__layer_state *L = &e->L[a->l];
    const struct si_layer *W = &e->w->layers[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    struct pred_io io;
    struct si__bufs bw = si__bufs_task(buffers, cl_arg);
    pred_bufs(&bw, e, a->l, &io);
    double t0 = si__now();
    const float *xb = io.in;
    double tm = 0.0;
    if (e->m->pred_input == SI_PRED_LAYER) {
        tm = si__residual_in(e, a->l, &io.c, xb, sc->xl, sc);
        si_ref_attn_input(e->ref, a->l, sc->xl, sc->xn, sc->tmp);
        xb = sc->xn;
    }
    struct si_tensor fc2 = W->fc2;
    fc2.data = io.fc2;
    fc2.pk = L->fc2_pk; /* packed in place (graph/weights.c) */
    /* The reference's predictor on fc2's rows in position order: the
     * selection comes out in position order, then as each slice's list. */
    uint8_t *sel = (uint8_t *)sc->ix; /* n_ff bytes of the n_ff int32 */
    si_ref_predict(&W->fc1, &fc2, e->m->predictor_threshold, e->p.ref.act_quant, sc->xq, xb, sc->h,
                   sc->y, sel);
    for (int32_t j = 0; j < L->nsl; j++) {
        int32_t *idx = io.idx[j];
        const int64_t p0 = L->s0[j], n = L->s0[j + 1] - p0;
        int64_t k = 0;
        for (int64_t p = 0; p < n; p++)
            if (sel[p0 + p])
                idx[k++] = (int32_t)p;
        for (; k < n; k++)
            idx[k] = -1;
    }
    si__charge(e, SI_TASK_MERGE, tm);
    si__charge(e, SI_TASK_PRED, si__now() - t0 - tm);
}

int si__submit_pred(struct si_engine *e, int l, int32_t token)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    pred_bufs(&b, e, l, &(struct pred_io){0});
    return si__submit(e, &si__cl_pred, e->L[l].name_pred, l, -1, token, &a, 0);
}

/*
 * Gate mode's mask of a cold slice (flash): the gating dots of every neuron
 * of the slice, as ffn_sparse_slice takes them, so that the load task knows
 * which records to read.  The neurons that pass go to idx (local positions,
 * then -1) and their act(gate) (the plain kind: the activation itself,
 * dropping zeros as ffn_sparse_slice does) to gact.
 * Buffers: ffn_in, [gating rows j, up_b j (R): with a GPU in the graph],
 * idx j, gact j (W).
 */
struct gmask_io {
    const float *xb, *b;
    const char *pre;
    int32_t *idx;
    float *gact; /* by the slice's own positions */
};

static void gmask_bufs(struct si__bufs *b, struct si_engine *e, int l, int j, struct gmask_io *io)
{
    struct si__layer_state *L = &e->L[l];
    io->xb = si__vec(b, e->dec.h_ffn_in, STARPU_R);
    io->pre = si__wvec(b, e, L->h_gate_c[j]);
    const float *bias = si__wvec(b, e, L->h_upb_c[j]);
    io->b = e->w->layers[l].ffn_up_b.data != NULL ? bias : NULL;
    io->idx = si__vec(b, L->h_idx_c[j], STARPU_W);
    io->gact = si__vec(b, L->h_gact_c[j], STARPU_W);
}

static void gmask_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__layer_state *L = &e->L[a->l];
    const struct si_hparams *hp = &e->m->hp;
    struct si__scratch *sc = si__scratch_of(e);
    const int64_t d = hp->n_embd, p0 = L->s0[a->j], n = L->s0[a->j + 1] - p0;
    const uint32_t t = L->f.gu_type;
    const float thr = e->lay.gthr[a->l];
    const bool relu = hp->act == SI_ACT_RELU;
    struct gmask_io io;
    struct si__bufs bw = si__bufs_task(buffers, cl_arg);
    gmask_bufs(&bw, e, a->l, a->j, &io);
    double t0 = si__now();
    const float *xb = io.xb, *b = io.b;
    const char *pre = io.pre;
    int32_t *idx = io.idx;
    const void *xa = si__ffn_convert_input(e, t, xb, sc->xq);
    float *gd = sc->g;
    if (L->pre_pk[a->j] > 0) {
        const struct si_tensor v = si__pre_rows(&L->f, d, pre, n, L->pre_pk[a->j]);
        si_ref_matvec_act(gd, &v, xa);
    } else {
        for (int64_t i = 0; i < n; i++)
            gd[i] = si__ffn_dot(t, pre + (size_t)i * L->f.gu_row, xa, xb, d);
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        const float g = gd[i];
        float v;
        if (hp->ffn_kind == SI_FFN_PLAIN) {
            v = si_act_apply(hp->act, b != NULL ? g + b[i] : g);
            if (v == 0.0f)
                continue;
        } else {
            v = si_act_apply(hp->act, g);
            if (relu ? v == 0.0f : !(fabsf(v) > thr))
                continue;
        }
        io.gact[i] = v;
        idx[k++] = (int32_t)i;
    }
    for (int64_t q = k; q < n; q++)
        idx[q] = -1;
    L->rd[a->j] = n * (int64_t)L->f.gu_row; /* ffn_cold adds the records' rows */
    si__account(e, SI_TASK_PRED, t0);
}

int si__submit_gmask(struct si_engine *e, int l, int j, int32_t token)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    gmask_bufs(&b, e, l, j, &(struct gmask_io){0});
    return si__submit(e, &si__cl_gmask, e->L[l].name_gmask[j], l, j, token, &a, STARPU_CPU);
}

static struct starpu_perfmodel pred_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_pred_f32"};
static struct starpu_perfmodel gmask_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_gmask"};

struct starpu_codelet si__cl_pred = {
    .cpu_funcs = {pred_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &pred_model,
    .name = "pred",
};
struct starpu_codelet si__cl_gmask = {
    .cpu_funcs = {gmask_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS, /* the weights only with a GPU in the graph */
    .model = &gmask_model,
    .name = "gmask",
};
