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
 * si_ref_ffn_finish_into(x, xb2, xb3).  The same bits wherever it runs.
 */
static void merge_into(struct si_engine *e, int l, const struct si__carried *c, const float *x,
                       float *xb2, float *x_out, float *tmp)
{
    const struct si__layer_state *L = &e->L[l];
    const struct si_layer *W = &e->w->layers[l];
    const int64_t d = e->m->hp.n_embd;
    bool first = true;
    for (int32_t k = 0; !e->lay.sparse && k < e->down.nd; k++)
        memcpy(xb2 + e->down.dn[k], c->part[k],
               (size_t)(e->down.dn[k + 1] - e->down.dn[k]) * sizeof(float));
    for (int32_t j = 0; e->lay.sparse && j < L->nsl; j++) {
        const float *p = c->part[j];
        for (int32_t r = 0; r < L->rows[j]; r++, p += d, first = false)
            for (int64_t i = 0; i < d; i++)
                xb2[i] = first ? p[i] : xb2[i] + p[i];
    }
    if (W->ffn_down_b.data != NULL) {
        const float *b = W->ffn_down_b.data;
        for (int64_t i = 0; i < d; i++)
            xb2[i] += b[i];
    }
    si_ref_ffn_finish_into(e->ref, l, x, xb2, c->xb3, x_out, tmp);
}

/* Whether layer l's first tasks take layer l - 1's FFN output (task.h):
 * not at l = 0, at a pipeline rank's first layer (x came whole from the
 * rank before), or in redux mode, where a merge task adds it into x. */
static bool carries(const struct si_engine *e, int l)
{
    return !(l == 0 || l == e->pipe.l0 || e->p.redux);
}

/* Whether layer l - 1's FFN output reaches layer l's tasks joined: a fact
 * of the engine's shape (the tasks' functions read it when they run, after
 * the submission has moved on), which si__join_carried acts on. */
static bool carry_joined(const struct si_engine *e, int l)
{
    if (!carries(e, l) || !si__cpu_graph(e))
        return false;
    return si__joins(e->lay.sparse ? e->L[l - 1].nsl : e->down.nd);
}

/* See task.h: layer l - 1's slices' partial outputs (dense mode: the down
 * projection's blocks; the whole, then pointers into it, where joined), then
 * its attention output xb3 with a parallel residual. */
void si__carried_bufs(struct si__bufs *b, const struct si_engine *e, int l, struct si__carried *c)
{
    c->n = 0;
    c->xb3 = NULL;
    if (!carries(e, l))
        return;
    const struct si__layer_state *P = &e->L[l - 1];
    c->n = e->lay.sparse ? P->nsl : e->down.nd;
    STARPU_ASSERT(c->n <= SI__MAX_SLICES + 1);
    if (carry_joined(e, l)) { /* (si__join_carried) the whole, then its parts */
        const float *all = si__vec(b, e->lay.sparse ? P->h_part : e->down.h_dout_all, STARPU_R);
        size_t at = 0;
        for (int32_t j = 0; j < c->n; j++) {
            c->part[j] = all + at;
            at += e->lay.sparse ? P->len_p[j] : e->down.dout_len[j];
        }
    } else {
        for (int32_t j = 0; j < c->n; j++)
            c->part[j] = si__vec(b, e->lay.sparse ? P->h_part_c[j] : e->down.h_dout[j], STARPU_R);
    }
    if (e->m->hp.parallel_residual)
        c->xb3 = si__vec(b, e->dec.h_xb3, STARPU_R);
}

void si__join_carried(struct si_engine *e, int l)
{
    si__split_carried(e);
    if (!carry_joined(e, l + 1) || e->ip.on) /* (in place: no partitions) */
        return;
    struct si__layer_state *L = &e->L[l];
    if (e->lay.sparse)
        si__join(&e->dec.carry, L->h_part, (unsigned)L->nsl, L->h_part_c);
    else
        si__join(&e->dec.carry, e->down.h_dout_all, (unsigned)e->down.nd, e->down.h_dout);
}

void si__split_carried(struct si_engine *e)
{
    si__unjoin(&e->dec.carry);
}

/* x_out = layer l's input residual: x, plus layer l - 1's FFN carried in c.
 * Returns the time spent merging. */
double si__residual_in(struct si_engine *e, int l, const struct si__carried *c, const float *x,
                       float *x_out, struct si__scratch *sc)
{
    const int64_t d = e->m->hp.n_embd;
    if (!carries(e, l)) {
        if (x_out != x)
            memcpy(x_out, x, (size_t)d * sizeof(float));
        return 0.0;
    }
    const double t0 = si__now();
    merge_into(e, l - 1, c, x, sc->xf, x_out, sc->tmp);
    return si__now() - t0;
}

/* merge_L (redux mode): x (RW), y (RW), [xb3 (R): a parallel residual's
 * attention output]. */
struct merge_io {
    float *x, *y;
    const float *xb3;
};

static void merge_bufs(struct si__bufs *b, struct si_engine *e, int l, struct merge_io *io)
{
    io->x = si__vec(b, e->dec.h_x, STARPU_RW);
    io->y = si__vec(b, e->L[l].h_y, STARPU_RW);
    io->xb3 = e->m->hp.parallel_residual ? si__vec(b, e->dec.h_xb3, STARPU_R) : NULL;
}

/* x += the layer's FFN output, the sum StarPU reduced into y, which is left
 * at zero for the next token. */
static void merge_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    const struct si_layer *W = &e->w->layers[a->l];
    const int64_t d = e->m->hp.n_embd;
    struct merge_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    merge_bufs(&b, e, a->l, &io);
    double t0 = si__now();
    memcpy(sc->xf, io.y, (size_t)d * sizeof(float));
    memset(io.y, 0, (size_t)d * sizeof(float));
    if (W->ffn_down_b.data != NULL) {
        const float *bias = W->ffn_down_b.data;
        for (int64_t i = 0; i < d; i++)
            sc->xf[i] += bias[i];
    }
    si_ref_ffn_finish_into(e->ref, a->l, io.x, sc->xf, io.xb3, io.x, sc->tmp);
    si__account(e, SI_TASK_MERGE, t0);
}

int si__submit_merge(struct si_engine *e, int l, int32_t token)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    merge_bufs(&b, e, l, &(struct merge_io){0});
    return si__submit(e, &si__cl_merge, e->L[l].name_merge, l, -1, token, &a, 0);
}

/* residual_L (a pipeline's last layer on this rank, l = l1): x (RW), the
 * carried FFN output (R). */
struct residual_io {
    float *x;
    struct si__carried c;
};

static void residual_bufs(struct si__bufs *b, struct si_engine *e, int l, struct residual_io *io)
{
    io->x = si__vec(b, e->dec.h_x, STARPU_RW);
    si__carried_bufs(b, e, l, &io->c);
}

/* x += layer l - 1's FFN output, before x goes to the next rank. */
static void residual_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct residual_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    residual_bufs(&b, e, a->l, &io);
    si__charge(e, SI_TASK_MERGE, si__residual_in(e, a->l, &io.c, io.x, io.x, si__scratch_of(e)));
}

int si__submit_residual(struct si_engine *e, int l, int32_t token)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    residual_bufs(&b, e, l, &(struct residual_io){0});
    return si__submit(e, &si__cl_residual, "residual", l, -1, token, &a, 0);
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
