/*
 * pred.c - which FFN neurons fire: the predictor task (predictor mode) and gate mode's masks of
 * the flash tier's cold slices.
 */
#include "codelets/codelets.h"

#include "model/act.h"
#include "model/forward.h"

#include <math.h>
#include <starpu.h>

/* Buffers: the predictor's input (ffn_in, or x: model.h's si_pred_input),
 * fc1, fc2 (position order), idx of each slice (W).  A lookahead predictor
 * (model.h): x and the carried ones (R); it reads the attention's
 * normalised input, the layer's input residual made as the attention
 * tasks make it. */
static void pred_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__layer_state *L = &e->L[a->l];
    const struct si_layer *W = &e->w->layers[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    double t0 = si__now();
    const float *xb = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    int b = 1; /* fc1's buffer */
    double tm = 0.0;
    if (e->m->pred_input == SI_PRED_LAYER) {
        b += si__n_carried(e, a->l);
        tm = si__residual_in(e, a->l, buffers, 1, xb, sc->xl, sc);
        si_ref_attn_input(e->ref, a->l, sc->xl, sc->xn, sc->tmp);
        xb = sc->xn;
    }
    struct si_tensor fc2 = W->fc2;
    fc2.data = (const void *)STARPU_VECTOR_GET_PTR(buffers[b + 1]);
    fc2.pk = L->fc2_pk; /* packed in place (graph/weights.c) */
    /* The reference's predictor on fc2's rows in position order: the
     * selection comes out in position order, then as each slice's list. */
    uint8_t *sel = (uint8_t *)sc->ix; /* n_ff bytes of the n_ff int32 */
    si_ref_predict(&W->fc1, &fc2, e->m->predictor_threshold, e->p.ref.act_quant, sc->xq, xb, sc->h,
                   sc->y, sel);
    for (int32_t j = 0; j < L->nsl; j++) {
        int32_t *idx = (int32_t *)STARPU_VECTOR_GET_PTR(buffers[b + 2 + j]);
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

/*
 * Gate mode's mask of a cold slice (flash): the gating dots of every neuron
 * of the slice, as ffn_sparse_slice takes them, so that the load task knows
 * which records to read.  The neurons that pass go to idx (local positions,
 * then -1) and their act(gate) (the plain kind: the activation itself,
 * dropping zeros as ffn_sparse_slice does) to gact.
 * Buffers: ffn_in, gating rows, up_b (R), idx (W).
 */
static void gmask_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__layer_state *L = &e->L[a->l];
    const struct si_hparams *hp = &e->m->hp;
    struct si__scratch *sc = si__scratch_of(e);
    const int64_t d = hp->n_embd, p0 = L->s0[a->j], n = L->s0[a->j + 1] - p0;
    const uint32_t t = L->f.gu_type;
    const float thr = e->gthr[a->l];
    const bool relu = hp->act == SI_ACT_RELU;
    double t0 = si__now();
    const float *xb = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const char *pre = (const char *)STARPU_VECTOR_GET_PTR(buffers[1]);
    const bool bias = e->w->layers[a->l].ffn_up_b.data != NULL;
    const float *b = bias ? (const float *)STARPU_VECTOR_GET_PTR(buffers[2]) : NULL;
    int32_t *idx = (int32_t *)STARPU_VECTOR_GET_PTR(buffers[3]);
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
        L->gact[p0 + i] = v;
        idx[k++] = (int32_t)i;
    }
    for (int64_t q = k; q < n; q++)
        idx[q] = -1;
    L->rd[a->j] = n * (int64_t)L->f.gu_row; /* ffn_cold adds the records' rows */
    si__account(e, SI_TASK_PRED, t0);
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
    .nbuffers = 4,
    .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_W},
    .model = &gmask_model,
    .name = "gmask",
};
