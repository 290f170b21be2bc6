/* task.c - a task's creation and submission from its description's handles (task.h). */
#include "codelets/task.h"

#include <errno.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

/* See task.h. */
int si__submit(struct si_engine *e, struct starpu_codelet *cl, const char *name, int l, int j,
               int32_t token, const struct si__args *args, uint32_t where)
{
    struct si__task_arg *a = malloc(sizeof *a);
    if (a == NULL)
        return -ENOMEM;
    *a = (struct si__task_arg){.e = e, .l = l, .j = j, .token = token};
    struct starpu_task *t = starpu_task_create();
    t->cl = cl;
    t->cl_arg = a;
    t->cl_arg_size = sizeof *a;
    t->cl_arg_free = 1;
    t->name = name;
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
