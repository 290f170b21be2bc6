/* task.c - a task's creation and submission from its description's handles (task.h). */
#include "codelets/task.h"

#include "codelets/codelets.h"

#include <errno.h>
#include <stdio.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

/* The in-place graph (task.h). */

/* Room for n elements of size sz in *arr (capacity *cap).  0 or -ENOMEM. */
static int grow(void **arr, int32_t *cap, int32_t n, size_t sz)
{
    if (n <= *cap)
        return 0;
    const int32_t c = n > 2 * *cap ? n : 2 * *cap;
    void *p = realloc(*arr, (size_t)c * sz);
    if (p == NULL)
        return -ENOMEM;
    *arr = p;
    *cap = c;
    return 0;
}

/* The codelet that names a task's phase: the FFN's hot slice (a CPU
 * worker's, here) is a part of the same fork as the cold ones. */
static const struct starpu_codelet *phase_key(const struct starpu_codelet *cl)
{
    return cl == &si__cl_hot ? &si__cl_cold : cl;
}

/* Handle h's bytes in main memory, accessed with mode m. */
static struct si__extent extent_of(starpu_data_handle_t h, enum starpu_data_access_mode m)
{
    void *f = starpu_data_get_interface_on_node(h, STARPU_MAIN_RAM);
    struct si__extent x = {.written = (m & STARPU_W) != 0, .ny = 1};
    switch (starpu_data_get_interface_id(h)) {
    case STARPU_VECTOR_INTERFACE_ID:
        x.p = STARPU_VECTOR_GET_PTR(f);
        x.w = x.stride = (size_t)STARPU_VECTOR_GET_NX(f) * STARPU_VECTOR_GET_ELEMSIZE(f);
        break;
    case STARPU_MATRIX_INTERFACE_ID:
        x.p = STARPU_MATRIX_GET_PTR(f);
        x.w = (size_t)STARPU_MATRIX_GET_NX(f) * STARPU_MATRIX_GET_ELEMSIZE(f);
        x.stride = (size_t)STARPU_MATRIX_GET_LD(f) * STARPU_MATRIX_GET_ELEMSIZE(f);
        x.ny = STARPU_MATRIX_GET_NY(f);
        break;
    case STARPU_VARIABLE_INTERFACE_ID:
        x.p = STARPU_VARIABLE_GET_PTR(f);
        x.w = x.stride = STARPU_VARIABLE_GET_ELEMSIZE(f);
        break;
    default: /* (none in the decoding graph) its pointer and size */
        x.p = (uintptr_t)starpu_data_handle_to_pointer(h, STARPU_MAIN_RAM);
        x.w = x.stride = starpu_data_get_size(h);
        break;
    }
    return x;
}

/* floor(n / d), d > 0. */
static long long floor_div(long long n, long long d)
{
    return n >= 0 ? n / d : -((-n + d - 1) / d);
}

/* See task.h.  Row i of a is [a.p + i S, a.p + i S + a.w), row k of b
 * likewise: they meet where -b.w < (b.p - a.p) + (k - i) S < a.w, for some
 * k - i in [1 - a.ny, b.ny - 1]. */
bool si__extents_overlap(const struct si__extent *a, const struct si__extent *b)
{
    if (a->w == 0 || b->w == 0 || a->ny == 0 || b->ny == 0)
        return false;
    const uintptr_t a1 = a->p + (a->ny - 1) * a->stride + a->w,
                    b1 = b->p + (b->ny - 1) * b->stride + b->w;
    if (a1 <= b->p || b1 <= a->p)
        return false; /* apart */
    if (a->ny == 1 && b->ny == 1)
        return true;
    if (a->ny > 1 && b->ny > 1 && a->stride != b->stride)
        return true; /* (rows of different strides: taken as meeting) */
    const long long s = (long long)(a->ny > 1 ? a->stride : b->stride);
    const long long d = (long long)(b->p - a->p), aw = (long long)a->w, bw = (long long)b->w;
    long long lo = floor_div(-bw - d, s) + 1, hi = -floor_div(-(aw - d), s) - 1;
    if (lo < 1 - (long long)a->ny)
        lo = 1 - (long long)a->ny;
    if (hi > (long long)b->ny - 1)
        hi = (long long)b->ny - 1;
    return lo <= hi;
}

/* SI_CHECK_PHASES: no two tasks of the phase touch the same bytes where
 * one of them writes; else the engine stops, naming them. */
static void check_phase(const struct si_engine *e)
{
    const struct si__inplace_state *ip = &e->ip;
    for (int32_t i = 0; i < ip->nck; i++) {
        const struct si__extent xi = extent_of(ip->ck[i].h, ip->ck[i].md);
        for (int32_t k = i + 1; k < ip->nck; k++) {
            if (ip->ck[k].task == ip->ck[i].task)
                continue;
            const struct si__extent xk = extent_of(ip->ck[k].h, ip->ck[k].md);
            if ((xi.written || xk.written) && si__extents_overlap(&xi, &xk)) {
                fprintf(stderr,
                        "starinfer: the in-place graph's tasks %s and %s, of one phase, touch "
                        "the same bytes and one writes them\n",
                        ip->pend[ip->ck[i].task]->name, ip->pend[ip->ck[k].task]->name);
                abort();
            }
        }
    }
}

/* A callback: *arg = 1. */
static void flag_set(void *arg)
{
    __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
}

/* Submit j, the token's last join, to be waited on (task.h). */
static void submit_last(struct si__inplace_state *ip, struct starpu_task *j)
{
    j->destroy = 0;
    j->detach = 0;
    j->callback_func = flag_set;
    j->callback_arg = &ip->done;
    ip->done = 0;
    if (starpu_task_submit(j) != 0)
        STARPU_ABORT_MSG("a join refused");
    ip->last = j;
}

/*
 * Submit the phase gathered, after declaring its join, and the join of the
 * phase before, on which its tasks depend.  A join is submitted only once
 * the next phase's tasks have declared their dependency on it, so StarPU
 * may destroy it when it ends (a dependency is declared on a live task;
 * one destroyed by the program instead could still be in its ending on a
 * worker).  The token's last join (last) is submitted at once, to be
 * waited on.  A task StarPU refuses is submitted again without its
 * codelet, so the joins still end; the error is kept for the token.
 */
static void phase_close(struct si_engine *e, bool last)
{
    struct si__inplace_state *ip = &e->ip;
    if (ip->check)
        check_phase(e);
    struct starpu_task *jn = starpu_task_create();
    jn->cl = NULL;
    jn->name = "join";
    starpu_task_declare_deps_array(jn, (unsigned)ip->n, ip->pend);
    for (int32_t k = 0; k < ip->n; k++) {
        struct starpu_task *t = ip->pend[k];
        int rc = starpu_task_submit(t);
        if (rc != 0) {
            t->cl = NULL;
            if (starpu_task_submit(t) != 0)
                STARPU_ABORT_MSG("an empty task refused");
            ip->rc = ip->rc != 0 ? ip->rc : rc;
        }
    }
    if (ip->prev != NULL && starpu_task_submit(ip->prev) != 0)
        STARPU_ABORT_MSG("a join refused");
    ip->prev = jn;
    if (last) {
        submit_last(ip, jn);
        ip->prev = NULL;
    }
    ip->n = 0;
    ip->nck = 0;
}

/* Task t (codelet cl, layer l, handles a) into the phase, after closing
 * the one gathered if t is of another.  0, or -ENOMEM (t destroyed). */
static int phase_add(struct si_engine *e, struct starpu_task *t, const struct starpu_codelet *cl,
                     int l, const struct si__args *a)
{
    struct si__inplace_state *ip = &e->ip;
    if (ip->n > 0 && (phase_key(cl) != ip->key || l != ip->l))
        phase_close(e, false);
    int rc = grow((void **)&ip->pend, &ip->cap, ip->n + 1, sizeof *ip->pend);
    if (rc == 0 && ip->check)
        rc = grow((void **)&ip->ck, &ip->ck_cap, ip->nck + a->n, sizeof *ip->ck);
    for (int32_t i = 0; i < a->n && rc == 0 && ip->check; i++)
        ip->ck[ip->nck++] = (struct si__access){a->h[i], a->md[i], ip->n};
    if (rc != 0) {
        t->destroy = 0;
        starpu_task_destroy(t);
        ip->rc = ip->rc != 0 ? ip->rc : rc;
        return rc;
    }
    if (ip->prev != NULL)
        starpu_task_declare_deps_array(t, 1, &ip->prev);
    ip->pend[ip->n++] = t;
    ip->key = phase_key(cl);
    ip->l = l;
    return 0;
}

void si__inplace_begin(struct si_engine *e)
{
    struct si__inplace_state *ip = &e->ip;
    const char *c = getenv("SI_CHECK_PHASES");
    ip->on = true;
    ip->check = c != NULL && strcmp(c, "0") != 0;
    ip->n = ip->nck = 0;
    ip->prev = ip->last = NULL;
    ip->rc = 0;
}

int si__inplace_submit(struct si_engine *e)
{
    struct si__inplace_state *ip = &e->ip;
    ip->last = NULL;
    if (ip->n > 0) {
        phase_close(e, true);
    } else if (ip->prev != NULL) { /* (a failure left no task after it) */
        submit_last(ip, ip->prev);
        ip->prev = NULL;
    }
    return ip->rc;
}

/* See task.h. */
int si__submit(struct si_engine *e, struct starpu_codelet *cl, const char *name, int l, int j,
               int32_t token, const struct si__args *args, uint32_t where)
{
    struct si__task_arg *a = malloc(sizeof *a);
    if (a == NULL)
        return -ENOMEM;
    *a = (struct si__task_arg){.e = e, .l = l, .j = j, .token = token, .inplace = e->ip.on};
    struct starpu_task *t = starpu_task_create();
    t->cl = cl;
    t->cl_arg = a;
    t->cl_arg_size = sizeof *a;
    t->cl_arg_free = 1;
    t->name = name;
    if (e->ip.on) { /* no buffers: into the phase (task.h) */
        t->nbuffers = 0;
        t->where = STARPU_CPU;
        int rc = phase_add(e, t, cl, l, args);
        if (rc == 0)
            e->stats.tasks++;
        return rc;
    }
    const int n = args->n;
    const starpu_data_handle_t *h = args->h;
    const enum starpu_data_access_mode *modes = args->md;
    t->nbuffers = n;
    if (where != 0)
        t->where = where;
    if (n > STARPU_NMAXBUFS) {
        t->dyn_handles = malloc((size_t)n * sizeof *t->dyn_handles);
        t->dyn_modes = malloc((size_t)n * sizeof *t->dyn_modes);
        if (t->dyn_handles == NULL || t->dyn_modes == NULL) {
            free(t->dyn_handles);
            free(t->dyn_modes);
            t->dyn_handles = NULL;
            t->dyn_modes = NULL;
            t->destroy = 0; /* (StarPU's assertion: destroy 1 is for its own) */
            starpu_task_destroy(t);
            return -ENOMEM;
        }
        memcpy(t->dyn_handles, h, (size_t)n * sizeof *h);
        memcpy(t->dyn_modes, modes, (size_t)n * sizeof *modes);
    } else {
        for (int i = 0; i < n; i++) {
            t->handles[i] = h[i];
            t->modes[i] = modes[i];
        }
    }
    int rc = starpu_task_submit(t);
    if (rc != 0) {
        t->destroy = 0;
        starpu_task_destroy(t);
        return rc;
    }
    if (e->bat.bn > 0)
        e->stats.batch_tasks++;
    else
        e->stats.tasks++;
    return 0;
}
