/* head.c - the model's two ends as tasks: embed, and norm+lm_head (one task or row slices). */
#include "codelets/codelets.h"

#include "model/forward.h"

#include <starpu.h>

/* embed: x (W), the token's embedding. */
static float *embed_bufs(struct si__bufs *b, struct si_engine *e)
{
    return si__vec(b, e->dec.h_x, STARPU_W);
}

static void embed_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    float *x = embed_bufs(&b, a->e);
    double t0 = si__now();
    si_ref_begin_into(a->e->ref, a->token, a->e->ref->n_past, x); /* checked before submission */
    si__account(a->e, SI_TASK_EMBED, t0);
}

int si__submit_embed(struct si_engine *e, int32_t token)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    embed_bufs(&b, e);
    return si__submit(e, &si__cl_embed, "embed", -1, -1, token, &a, 0);
}

/* norm+lm_head (one task): x (RW), the carried FFN output (R), xb (RW:
 * scratch of the norm), logits (W), output (R: the LM head's rows, read
 * through the reference's lm_head, which may be the engine's packed copy). */
struct head_io {
    float *x, *xn, *logits;
    struct si__carried c;
};

static void head_bufs(struct si__bufs *b, struct si_engine *e, struct head_io *io)
{
    io->x = si__vec(b, e->dec.h_x, STARPU_RW);
    si__carried_bufs(b, e, e->m->hp.n_layer, &io->c);
    io->xn = si__vec(b, e->dec.h_ffn_in, STARPU_RW);
    io->logits = si__vec(b, e->dec.h_logits, STARPU_W);
    si__buf(b, e->dec.h_out, STARPU_R);
}

/* The last layer's FFN added into x, then the reference's head. */
static void head_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct head_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    head_bufs(&b, e, &io);
    double t0 = si__now();
    const double tm = si__residual_in(e, e->m->hp.n_layer, &io.c, io.x, io.x, si__scratch_of(e));
    si_ref_end_into(e->ref, io.x, io.xn, io.logits);
    si__charge(e, SI_TASK_MERGE, tm);
    si__charge(e, SI_TASK_HEAD, si__now() - t0 - tm);
}

/* lm_head.j: x (R), the carried FFN output (R), output (R), logits child j
 * (W). */
struct head_rows_io {
    const float *x, *out;
    float *y;
    struct si__carried c;
};

static void head_rows_bufs(struct si__bufs *b, struct si_engine *e, int j, struct head_rows_io *io)
{
    io->x = si__vec(b, e->dec.h_x, STARPU_R);
    si__carried_bufs(b, e, e->m->hp.n_layer, &io->c);
    io->out = si__vec(b, e->dec.h_out, STARPU_R);
    io->y = si__vec(b, e->dec.h_logits_c[j], STARPU_W);
}

/* The last layer's FFN added into x (every slice alike), the output norm,
 * then rows [a_h[j], a_h[j+1]) of the LM head. */
static void head_rows_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    struct head_rows_io io;
    struct si__bufs b = si__bufs_task(buffers, cl_arg);
    head_rows_bufs(&b, e, a->j, &io);
    double t0 = si__now();
    const double tm = si__residual_in(e, e->m->hp.n_layer, &io.c, io.x, sc->xl, sc);
    si_ref_head_input(e->ref, sc->xl, sc->xn, sc->tmp);
    struct si_tensor w = si__rows_of(&e->w->output, e->dec.a_h[a->j], e->dec.a_h[a->j + 1]);
    si_ref_matvec(e->p.ref.act_quant, sc->xq, io.y, &w, sc->xn);
    si__charge(e, SI_TASK_MERGE, tm);
    si__charge(e, SI_TASK_HEAD, si__now() - t0 - tm);
}

int si__submit_head(struct si_engine *e, int32_t token)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    if (e->dec.na <= 1) {
        head_bufs(&b, e, &(struct head_io){0});
        return si__submit(e, &si__cl_head, "norm+lm_head", -1, -1, token, &a, 0);
    }
    int rc = 0;
    const bool split = !e->ip.on; /* (in place: no partitions) */
    if (split)
        starpu_data_partition_submit(e->dec.h_logits, (unsigned)e->dec.na, e->dec.h_logits_c);
    for (int32_t j = 0; j < e->dec.na && rc == 0; j++) {
        b = si__bufs_collect(&a);
        head_rows_bufs(&b, e, j, &(struct head_rows_io){0});
        rc = si__submit(e, &si__cl_head_rows, e->dec.name_head[j], -1, j, token, &a, 0);
    }
    if (split)
        starpu_data_unpartition_submit(e->dec.h_logits, (unsigned)e->dec.na, e->dec.h_logits_c,
                                       STARPU_MAIN_RAM);
    return rc;
}

static struct starpu_perfmodel embed_model = {.type = STARPU_HISTORY_BASED,
                                              .symbol = "si_embed_f32"};
static struct starpu_perfmodel head_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_head_f32"};
static struct starpu_perfmodel head_rows_model = {.type = STARPU_HISTORY_BASED,
                                                  .symbol = "si_lm_head_rows"};

struct starpu_codelet si__cl_embed = {
    .cpu_funcs = {embed_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS, /* (none in the in-place graph) */
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
