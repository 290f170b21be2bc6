/*
 * merge.c - a layer's FFN merged into the residual: by the next layer's first tasks
 * (si__residual_in), or by a merge task over STARPU_REDUX.
 */
#include "codelets/codelets.h"

#include "model/forward.h"

#include <starpu.h>
#include <string.h>

/*
 * The merge of layer l's FFN (l >= 0) into the residual: xb2 = the slices'
 * partial outputs added in slice order (dense layout: the down projection's
 * blocks side by side) plus the down bias, then x_out =
 * si_ref_ffn_finish_into(x, xb2, xb3).  The partial outputs (blocks) are
 * buffers[b0 ..]; the same bits wherever it runs.
 */
static void merge_into(struct si_engine *e, int l, void *buffers[], int b0, const float *x,
                       const float *xb3, float *xb2, float *x_out, float *tmp)
{
    const struct si__layer_state *L = &e->L[l];
    const struct si_layer *W = &e->w->layers[l];
    const int64_t d = e->m->hp.n_embd;
    bool first = true;
    for (int32_t k = 0; !e->sparse && k < e->nd; k++)
        memcpy(xb2 + e->dn[k], (const float *)STARPU_VECTOR_GET_PTR(buffers[b0 + k]),
               (size_t)(e->dn[k + 1] - e->dn[k]) * sizeof(float));
    for (int32_t j = 0; e->sparse && j < L->nsl; j++) {
        const float *p = (const float *)STARPU_VECTOR_GET_PTR(buffers[b0 + j]);
        for (int32_t r = 0; r < L->rows[j]; r++, p += d, first = false)
            for (int64_t i = 0; i < d; i++)
                xb2[i] = first ? p[i] : xb2[i] + p[i];
    }
    if (W->ffn_down_b.data != NULL) {
        const float *b = W->ffn_down_b.data;
        for (int64_t i = 0; i < d; i++)
            xb2[i] += b[i];
    }
    si_ref_ffn_finish_into(e->ref, l, x, xb2, xb3, x_out, tmp);
}

/* Buffers that carry layer l - 1's FFN output to layer l's first tasks
 * (attn, or the LM head for l = n_layer): its slices' partial outputs (dense
 * mode: the down projection's blocks), then its attention output xb3 with a
 * parallel residual.  None at l = 0 and in redux mode, where a merge task
 * adds them into x. */
int si__n_carried(const struct si_engine *e, int l)
{
    if (l == 0 || l == e->l0 || e->p.redux) /* l0: x came whole from the rank before */
        return 0;
    return (e->sparse ? e->L[l - 1].nsl : e->nd) + (e->m->hp.parallel_residual ? 1 : 0);
}

/* x_out = layer l's input residual: x, plus layer l - 1's FFN when carried
 * in buffers[b0 ..] (see n_carried).  Returns the time spent merging. */
double si__residual_in(struct si_engine *e, int l, void *buffers[], int b0, const float *x,
                       float *x_out, struct si__scratch *sc)
{
    const int64_t d = e->m->hp.n_embd;
    if (si__n_carried(e, l) == 0) {
        if (x_out != x)
            memcpy(x_out, x, (size_t)d * sizeof(float));
        return 0.0;
    }
    const double t0 = si__now();
    const int np = e->sparse ? e->L[l - 1].nsl : e->nd;
    const float *xb3 =
        e->m->hp.parallel_residual ? (const float *)STARPU_VECTOR_GET_PTR(buffers[b0 + np]) : NULL;
    merge_into(e, l - 1, buffers, b0, x, xb3, sc->xf, x_out, sc->tmp);
    return si__now() - t0;
}

/* Redux mode: x += the layer's FFN output, the sum StarPU reduced into
 * y, which is left at zero for the next token.  Buffers: x (RW), y (RW). */
static void merge_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si_ref *s = e->ref;
    const struct si_layer *W = &e->w->layers[a->l];
    const int64_t d = e->m->hp.n_embd;
    double t0 = si__now();
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    memcpy(s->xb2, y, (size_t)d * sizeof(float));
    memset(y, 0, (size_t)d * sizeof(float));
    if (W->ffn_down_b.data != NULL) {
        const float *b = W->ffn_down_b.data;
        for (int64_t i = 0; i < d; i++)
            s->xb2[i] += b[i];
    }
    si_ref_ffn_finish(s, a->l);
    si__account(e, SI_TASK_MERGE, t0);
}

/* residual_L (a pipeline's last layer on this rank, l = l1): x += layer
 * l - 1's FFN output, carried, before x goes to the next rank.  Buffers: x
 * (RW), carried* (R). */
static void residual_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    float *x = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    si__charge(e, SI_TASK_MERGE, si__residual_in(e, a->l, buffers, 1, x, x, si__scratch_of(e)));
}

/* Redux mode: the layer output starts at zero and workers' shares add up. */
static void zero_cpu(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    memset((void *)STARPU_VECTOR_GET_PTR(buffers[0]), 0,
           STARPU_VECTOR_GET_NX(buffers[0]) * sizeof(float));
}

static void sum_cpu(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    float *dst = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const float *src = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    for (uint32_t i = 0; i < STARPU_VECTOR_GET_NX(buffers[0]); i++)
        dst[i] += src[i];
}

static struct starpu_perfmodel merge_model = {.type = STARPU_HISTORY_BASED,
                                              .symbol = "si_merge_f32"};
static struct starpu_perfmodel zero_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_zero_f32"};
static struct starpu_perfmodel sum_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_sum_f32"};

struct starpu_codelet si__cl_merge = {
    .cpu_funcs = {merge_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &merge_model,
    .name = "merge",
};
static struct starpu_perfmodel residual_model = {.type = STARPU_HISTORY_BASED,
                                                 .symbol = "si_residual"};
struct starpu_codelet si__cl_residual = {
    .cpu_funcs = {residual_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &residual_model,
    .name = "residual",
};
struct starpu_codelet si__cl_zero = {
    .cpu_funcs = {zero_cpu},
    .nbuffers = 1,
    .modes = {STARPU_W},
    .model = &zero_model,
    .name = "zero",
};
struct starpu_codelet si__cl_sum = {
    .cpu_funcs = {sum_cpu},
    .nbuffers = 2,
    .modes = {STARPU_RW | STARPU_COMMUTE, STARPU_R},
    .model = &sum_model,
    .name = "sum",
};
