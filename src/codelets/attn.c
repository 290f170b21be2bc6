/*
 * attn.c - attention as tasks: one per layer, or split by kv heads with the output projection in
 * row slices.
 */
#include "codelets/codelets.h"

#include "model/forward.h"

#include <starpu.h>
#include <string.h>

/*
 * attn_L (attention in one task, when its products are not split): layer
 * l - 1's FFN added into x, then the reference's whole attention step on
 * it (x += attention; xb = the FFN's input).
 * Buffers: x (RW), the carried ones (R), xb (W), [xb3 (W)], K, V (RW),
 * Wq, Wk, Wv, Wo (R).
 */
static void attn_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si_ref *s = e->ref;
    double t0 = si__now();
    const double tm = si__residual_in(e, a->l, buffers, 1, s->x, s->x, si__scratch_of(e));
    si_ref_attn(s, a->l);
    si__charge(e, SI_TASK_MERGE, tm);
    si__charge(e, SI_TASK_ATTN, si__now() - t0 - tm);
}

/*
 * attn_L.j (attention split by kv heads): layer l's input residual (layer
 * l - 1's FFN added into x, by every group alike; group 0 keeps it in x2
 * for attn_out), its normalised input, then for kv heads [a_g[j],
 * a_g[j+1]) and their query heads: their rows of q, k and v, biases, QK
 * norm, RoPE, the cache's columns, their attention (si_ref_attn_group).
 * Buffers: x (R), the carried ones (R), Wq, Wk, Wv (R), K_j, V_j (RW),
 * att_j (W: those query heads' outputs), [j = 0: x2 (W)].
 */
static void attn_grp_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->w->layers[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    double t0 = si__now();
    const int j = a->j, hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const int nc = si__n_carried(e, a->l);
    const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    float *att = (float *)STARPU_VECTOR_GET_PTR(buffers[1 + nc + 5]);
    float *xl = j == 0 ? (float *)STARPU_VECTOR_GET_PTR(buffers[1 + nc + 6]) : sc->xl;
    const double tm = si__residual_in(e, a->l, buffers, 1, x, xl, sc);
    si_ref_attn_input(e->ref, a->l, xl, sc->xn, sc->tmp);
    const int64_t g0 = e->a_g[j], g1 = e->a_g[j + 1];
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
    si_ref_attn_group(e->ref, a->l, (int)g0, (int)g1, sc->aq, sc->ak, sc->av, sc->aatt, sc->ascr);
    memcpy(att, sc->aatt + q0, (size_t)(q1 - q0) * sizeof(float));
    si__charge(e, SI_TASK_MERGE, tm);
    si__charge(e, SI_TASK_ATTN, si__now() - t0 - tm);
}

/* Buffers: att_* (R: the whole attention output, the groups' children in
 * order), Wo (R), o_j (W). */
static void ao_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    double t0 = si__now();
    /* The children are consecutive parts of one array in main memory. */
    const float *att = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[e->ng + 1]);
    const struct si_layer *W = &e->w->layers[a->l];
    const int64_t o0 = e->a_o[a->j], o1 = e->a_o[a->j + 1];
    if (e->p.ref.input_thresholds != NULL) {
        /* input sparsity zeroes entries: this task's own copy */
        const int64_t qd = (int64_t)e->m->hp.n_head * e->m->hp.head_dim;
        memcpy(sc->aatt, att, (size_t)qd * sizeof *att);
        att = sc->aatt;
        int64_t nz;
        if (si__input_in(e, sc, a->l, SI_INPUT_O, sc->aatt, qd, &nz)) {
            si__matvec_t(e, &W->wo, &W->wo_t, o0, o1, sc, nz, sc->aatt, y);
            si__account(e, SI_TASK_ATTN_PROJ, t0);
            return;
        }
    }
    struct si_tensor wo = si__rows_of(&W->wo, o0, o1);
    si_ref_matvec(e->p.ref.act_quant, sc->xq, y, &wo, att);
    si__account(e, SI_TASK_ATTN_PROJ, t0);
}

/* Buffers: x2 (R: the layer's input residual), o_* (R), x (W: the residual
 * after attention), xb (W: the FFN's input), [xb3 (W)]. */
static void aout_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si_ref *s = e->ref;
    struct si__scratch *sc = si__scratch_of(e);
    double t0 = si__now();
    const float *x2 = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    for (int32_t j = 0; j < e->na; j++)
        memcpy(sc->xf + e->a_o[j], (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + j]),
               (size_t)(e->a_o[j + 1] - e->a_o[j]) * sizeof(float));
    si_ref_attn_finish_into(s, a->l, x2, sc->xf, s->x, s->xb, s->xb3, sc->tmp);
    si__account(e, SI_TASK_ATTN, t0);
}

static struct starpu_perfmodel attn_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_f32"};
static struct starpu_perfmodel agrp_model = {.type = STARPU_HISTORY_BASED,
                                             .symbol = "si_attn_group"};
static struct starpu_perfmodel ao_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_o"};
static struct starpu_perfmodel aout_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_out"};

struct starpu_codelet si__cl_attn = {
    .cpu_funcs = {attn_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &attn_model,
    .name = "attn",
};
struct starpu_codelet si__cl_agrp = {
    .cpu_funcs = {attn_grp_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &agrp_model,
    .name = "attn",
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
