/* head.c - the model's two ends as tasks: embed, and norm+lm_head (one task or row slices). */
#include "codelets/codelets.h"

#include "model/forward.h"

#include <starpu.h>

static void embed_cpu(void *buffers[], void *cl_arg)
{
    (void)buffers;
    struct si__task_arg *a = cl_arg;
    double t0 = si__now();
    si_ref_begin(a->e->ref, a->token); /* checked before submission */
    si__account(a->e, SI_TASK_EMBED, t0);
}

/* norm+lm_head (one task): the last layer's FFN added into x, then the
 * reference's head.  Buffers: x (RW), the carried ones (R), xb (RW),
 * logits (W), output (R). */
static void head_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si_ref *s = e->ref;
    double t0 = si__now();
    const double tm =
        si__residual_in(e, e->m->hp.n_layer, buffers, 1, s->x, s->x, si__scratch_of(e));
    si_ref_end(s);
    si__charge(e, SI_TASK_MERGE, tm);
    si__charge(e, SI_TASK_HEAD, si__now() - t0 - tm);
}

/* lm_head.j: the last layer's FFN added into x (every slice alike), the
 * output norm, then rows [a_h[j], a_h[j+1]) of the LM head.
 * Buffers: x (R), the carried ones (R), output (R), logits child j (W). */
static void head_rows_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    double t0 = si__now();
    const int nc = si__n_carried(e, e->m->hp.n_layer);
    const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[nc + 2]);
    const double tm = si__residual_in(e, e->m->hp.n_layer, buffers, 1, x, sc->xl, sc);
    si_ref_head_input(e->ref, sc->xl, sc->xn, sc->tmp);
    struct si_tensor w = si__rows_of(&e->w->output, e->a_h[a->j], e->a_h[a->j + 1]);
    si_ref_matvec(e->p.ref.act_quant, sc->xq, y, &w, sc->xn);
    si__charge(e, SI_TASK_MERGE, tm);
    si__charge(e, SI_TASK_HEAD, si__now() - t0 - tm);
}

static struct starpu_perfmodel embed_model = {.type = STARPU_HISTORY_BASED,
                                              .symbol = "si_embed_f32"};
static struct starpu_perfmodel head_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_head_f32"};
static struct starpu_perfmodel head_rows_model = {.type = STARPU_HISTORY_BASED,
                                                  .symbol = "si_lm_head_rows"};

struct starpu_codelet si__cl_embed = {
    .cpu_funcs = {embed_cpu},
    .nbuffers = 1,
    .modes = {STARPU_W},
    .model = &embed_model,
    .name = "embed",
};
struct starpu_codelet si__cl_head = {
    .cpu_funcs = {head_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &head_model,
    .name = "norm+lm_head",
};
struct starpu_codelet si__cl_head_rows = {
    .cpu_funcs = {head_rows_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &head_rows_model,
    .name = "lm_head",
};
