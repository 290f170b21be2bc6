/*
 * task.h - a task's buffers, described once.
 *
 * Each task kind has one description in its codelet file: a function
 * `<kind>_bufs(struct si__bufs *b, ...)` that names the kind's buffers in
 * their order, each with its handle and access mode, and stores what the
 * task reads from each into the kind's struct of pointers.  The kind's
 * submit function (si__submit_<kind>, also in the codelet file) runs the
 * description to collect the handles (b->args set); the kind's CPU and
 * CUDA functions run the same description over the task's buffers
 * (b->buffers set) to get their data.  Order and modes are thus written
 * once, and no code indexes buffers[] by arithmetic.
 *
 *     static void ao_bufs(struct si__bufs *b, struct si_engine *e, int l, int j,
 *                         struct ao_io *io)
 *     {
 *         io->att = si__vec(b, e->dec.h_att, STARPU_R);
 *         io->wo = si__vec(b, e->L[l].h_w[3], STARPU_R);
 *         io->y = si__vec(b, e->dec.h_o[j], STARPU_W);
 *     }
 *
 * Running a description over the buffers evaluates its handle expressions
 * (engine fields: cheap) and ignores them.  A task of the in-place graph
 * (below) has no buffers: its walk (si__bufs_task) returns each handle's
 * interface in main memory instead, the same data.
 */
#ifndef SI_CODELETS_TASK_H
#define SI_CODELETS_TASK_H

#include "codelets/state.h"

#include <starpu.h>
#include <stddef.h>

/* A task's handles and their access modes, in the codelet's order (set n
 * to 0 to start; an initializer would zero the arrays for every task). */
struct si__args {
    starpu_data_handle_t h[SI__MAX_SLICES + 16];
    enum starpu_data_access_mode md[SI__MAX_SLICES + 16];
    int n;
};

/* A description's walk: collecting handles (args), reading a task's
 * buffers (buffers, from i), or, neither set, the handles' interfaces in
 * main memory (a task of the in-place graph). */
struct si__bufs {
    struct si__args *args;
    void **buffers;
    int i;
};

/* Collecting: a walk that adds to a (emptied). */
static inline struct si__bufs si__bufs_collect(struct si__args *a)
{
    a->n = 0;
    return (struct si__bufs){.args = a};
}

/* Running: a walk over a task's buffers. */
static inline struct si__bufs si__bufs_read(void *buffers[])
{
    return (struct si__bufs){.buffers = buffers};
}

/* Running a task of the decoding graph: over its buffers, or, in the
 * in-place graph, over its handles' interfaces in main memory. */
static inline struct si__bufs si__bufs_task(void *buffers[], const void *cl_arg)
{
    const struct si__task_arg *a = cl_arg;
    return (struct si__bufs){.buffers = a->inplace ? NULL : buffers};
}

/* The next buffer: handle h with mode m.  Collecting, adds them and
 * returns NULL; running, returns the buffer's interface (in place: h's in
 * main memory). */
static inline void *si__buf(struct si__bufs *b, starpu_data_handle_t h,
                            enum starpu_data_access_mode m)
{
    if (b->args != NULL) {
        STARPU_ASSERT_MSG(b->args->n < (int)(sizeof b->args->h / sizeof b->args->h[0]),
                          "a task with more buffers than struct si__args holds");
        b->args->h[b->args->n] = h;
        b->args->md[b->args->n++] = m;
        return NULL;
    }
    if (b->buffers == NULL)
        return starpu_data_get_interface_on_node(h, STARPU_MAIN_RAM);
    return b->buffers[b->i++];
}

/* si__buf for a vector: its data pointer (NULL when collecting). */
static inline void *si__vec(struct si__bufs *b, starpu_data_handle_t h,
                            enum starpu_data_access_mode m)
{
    void *f = si__buf(b, h, m);
    return f != NULL ? (void *)STARPU_VECTOR_GET_PTR(f) : NULL;
}

/* Create and submit a task of codelet cl named `name` (layer l, part j,
 * token) with the handles of a; `where` restricts its workers (0: the
 * codelet's).  In the in-place graph (e->ip.on) the task takes no buffers
 * and joins its phase instead (below).  -errno or 0. */
int si__submit(struct si_engine *e, struct starpu_codelet *cl, const char *name, int l, int j,
               int32_t token, const struct si__args *a, uint32_t where);

/*
 * The in-place graph (e->lay.inplace: graph/layout.c says where): a decoded
 * token's tasks on CPU workers alone, with no buffers.  Every datum is in
 * main memory, where the tasks read and write it through the handles'
 * interfaces (si__bufs_task), so StarPU has no copies to keep coherent,
 * and the order that its implicit dependencies gave is given by phases
 * instead: a phase is a run of tasks of one kind in one layer (the parts
 * of a fork, which read what the phases before wrote and write parts of
 * their own), and one empty join task after each phase, on which every
 * task of the next phase depends.  A task costs about half as much to
 * submit, and the workers acquire and release no handles
 * (docs/measurements.md).  With SI_CHECK_PHASES=1 each phase's
 * descriptions are checked for two tasks touching the same bytes where one
 * writes (task.c's check_phase), and the engine stops naming them: the
 * tests run so.
 */
/* Begin a token's in-place graph. */
void si__inplace_begin(struct si_engine *e);
/* Submit its last phase and join (e->ip.last, which ends after every task
 * of the token; its callback sets e->ip.done; graph/decode.c waits for it,
 * destroys it and sets e->ip.on false).  0, or the first submission
 * error. */
int si__inplace_submit(struct si_engine *e);

/* One access of a phase's check: a handle's bytes in main memory, as rows
 * (ny rows of w bytes, stride bytes apart, from p; a vector is one row),
 * and whether it is written. */
struct si__extent {
    uintptr_t p;
    size_t w, stride, ny;
    bool written;
};
/* Whether two extents share a byte. */
bool si__extents_overlap(const struct si__extent *a, const struct si__extent *b);

/*
 * The carried FFN output (state.h): layer l - 1's FFN output, which layer
 * l's first tasks (or the head, l = n_layer, or a pipeline rank's last
 * residual) add into x instead of a merge task of their own.  Without
 * redux, a layer's FFN slices write partial outputs (sparse: each slice's
 * rows; dense: the down projection's blocks); nobody sums them in that
 * layer.  Each task that reads the layer's input residual takes them as R
 * buffers (si__carried_bufs) and adds them into its own copy of x in one
 * fixed order (si__residual_in, codelets/merge.c), so every such task sees
 * the same bits.  With redux, or at layer 0, there is nothing to carry.
 */
struct si__carried {
    int n;                                 /* partial outputs */
    const float *part[SI__MAX_SLICES + 1]; /* in slice (dense: block) order */
    const float *xb3;                      /* a parallel residual's attention output, or NULL */
};

/* The carried buffers of layer l, all R, in the description b. */
void si__carried_bufs(struct si__bufs *b, const struct si_engine *e, int l, struct si__carried *c);

#endif /* SI_CODELETS_TASK_H */
