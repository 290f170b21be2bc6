/*
 * bench-submit.c - what StarPU itself charges to submit a decoded token's
 * task graph, without the engine: chains of fork-joins shaped like a
 * layer's (phases of `width` tasks, each reading the previous phase's
 * output whole and writing its own part), with empty tasks, in three ways:
 *
 *   joins     the engine's graph of buffers (graph/data.c's si__joins;
 *             SI_INPLACE=0, and wherever a GPU, the flash tier or redux
 *             is in the graph): each phase's
 *             parts are the children of one vector, unpartitioned after
 *             their writers and partitioned again after their readers, and
 *             StarPU's implicit dependencies (sequential consistency) do
 *             the rest; every task has 2 + `extra` buffers (the extra ones
 *             R, sequential consistency off: as weights were before they
 *             were read in place);
 *   explicit  no data at all: each task declares one dependency, on an
 *             empty join task (cl NULL) that declares the previous phase's
 *             `width` tasks (the engine's in-place graph on CPU workers
 *             alone since the eleventh session, codelets/task.h);
 *   tags      the same edges through tags (starpu_tag_declare_deps), the
 *             join an empty task with a tag.
 *
 * It prints, per way, the submitting thread's CPU time and wall time per
 * task (the tasks run meanwhile on the workers, STARPU_NCPU, or after it
 * with --paused 1: submission alone, without the workers contending for
 * the same locks), and the wall time until all have run: a floor for the
 * engine's cost per task (docs/measurements.md, "What the task graph costs
 * per token" and "The in-place decoding graph").
 *
 *   tools/bench-submit [-w WIDTH] [-p PHASES] [-r ROUNDS] [-x EXTRA] [--paused 0|1]
 */
#include <starpu.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void nothing(void *buffers[], void *arg)
{
    (void)buffers;
    (void)arg;
}

static struct starpu_codelet cl = {
    .cpu_funcs = {nothing},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "empty",
};

static double now(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct shape {
    int width, phases, extra;
};

/* Two vectors whose parts alternate as a phase's output; `extra` weights. */
struct data {
    float *buf[2], *w;
    starpu_data_handle_t whole[2], *part[2], *wh;
};

static int data_init(struct data *d, const struct shape *s)
{
    const int n = 64 * s->width;
    memset(d, 0, sizeof *d);
    d->w = calloc(1024, sizeof *d->w);
    d->wh = calloc((size_t)s->extra + 1, sizeof *d->wh);
    if (d->w == NULL || d->wh == NULL)
        return -1;
    for (int v = 0; v < 2; v++) {
        d->buf[v] = calloc((size_t)n, sizeof(float));
        d->part[v] = calloc((size_t)s->width, sizeof(starpu_data_handle_t));
        if (d->buf[v] == NULL || d->part[v] == NULL)
            return -1;
        starpu_vector_data_register(&d->whole[v], STARPU_MAIN_RAM, (uintptr_t)d->buf[v], n,
                                    sizeof(float));
        struct starpu_data_filter f = {.filter_func = starpu_vector_filter_block,
                                       .nchildren = (unsigned)s->width};
        starpu_data_partition_plan(d->whole[v], &f, d->part[v]);
    }
    for (int k = 0; k < s->extra; k++) {
        starpu_vector_data_register(&d->wh[k], STARPU_MAIN_RAM, (uintptr_t)d->w, 1024,
                                    sizeof(float));
        starpu_data_set_sequential_consistency_flag(d->wh[k], 0);
    }
    return 0;
}

static void data_free(struct data *d, const struct shape *s)
{
    for (int v = 0; v < 2; v++) {
        if (d->part[v] != NULL)
            starpu_data_partition_clean(d->whole[v], (unsigned)s->width, d->part[v]);
        starpu_data_unregister(d->whole[v]);
        free(d->part[v]);
        free(d->buf[v]);
    }
    for (int k = 0; k < s->extra; k++)
        starpu_data_unregister(d->wh[k]);
    free(d->wh);
    free(d->w);
}

/* The joins way: phase p reads vector p % 2 whole, writes (p + 1) % 2's parts. */
static int run_joins(const struct shape *s, struct data *d)
{
    /* vector 0 starts whole and readable; vector 1 partitioned for writers */
    starpu_data_partition_submit(d->whole[1], (unsigned)s->width, d->part[1]);
    for (int p = 0; p < s->phases; p++) {
        const int in = p % 2, out = 1 - in;
        for (int j = 0; j < s->width; j++) {
            struct starpu_task *t = starpu_task_create();
            t->cl = &cl;
            t->nbuffers = 2 + s->extra;
            t->handles[0] = d->whole[in];
            t->modes[0] = STARPU_R;
            t->handles[1] = d->part[out][j];
            t->modes[1] = STARPU_W;
            for (int k = 0; k < s->extra; k++) {
                t->handles[2 + k] = d->wh[k];
                t->modes[2 + k] = STARPU_R;
            }
            if (starpu_task_submit(t) != 0)
                return -1;
        }
        /* the outputs joined for the next phase's readers; the inputs split
         * again for the phase after it, which writes them */
        starpu_data_unpartition_submit(d->whole[out], (unsigned)s->width, d->part[out],
                                       STARPU_MAIN_RAM);
        starpu_data_partition_submit(d->whole[in], (unsigned)s->width, d->part[in]);
    }
    const int last = (s->phases - 1) % 2; /* the last phase's input, split again */
    starpu_data_unpartition_submit(d->whole[last], (unsigned)s->width, d->part[last],
                                   STARPU_MAIN_RAM);
    return 0;
}

/* The explicit way: width tasks, then a join task, per phase.  The joins
 * are kept (destroy 0) until all has run: a dependency may only be
 * declared on a task that is not destroyed, and a join may end before the
 * next phase's tasks declare theirs. */
static int run_explicit(const struct shape *s, struct starpu_task **joins)
{
    struct starpu_task *join = NULL, **ts = calloc((size_t)s->width, sizeof *ts);
    if (ts == NULL)
        return -1;
    for (int p = 0; p < s->phases; p++) {
        for (int j = 0; j < s->width; j++) {
            struct starpu_task *t = starpu_task_create();
            t->cl = &cl;
            t->nbuffers = 0;
            if (join != NULL)
                starpu_task_declare_deps_array(t, 1, &join);
            ts[j] = t;
        }
        struct starpu_task *jn = starpu_task_create();
        jn->cl = NULL;
        jn->destroy = 0;
        starpu_task_declare_deps_array(jn, (unsigned)s->width, ts);
        for (int j = 0; j < s->width; j++)
            if (starpu_task_submit(ts[j]) != 0)
                return free(ts), -1;
        if (starpu_task_submit(jn) != 0)
            return free(ts), -1;
        joins[p] = join = jn;
    }
    free(ts);
    return 0;
}

/* The tags way: task (p, j) has tag p * (width + 1) + j + 1; the join of
 * phase p the tag p * (width + 1) + width + 1. */
static int run_tags(const struct shape *s, starpu_tag_t base)
{
    starpu_tag_t *deps = calloc((size_t)s->width, sizeof *deps);
    if (deps == NULL)
        return -1;
    for (int p = 0; p < s->phases; p++) {
        const starpu_tag_t t0 = base + (starpu_tag_t)p * (starpu_tag_t)(s->width + 1);
        for (int j = 0; j < s->width; j++) {
            struct starpu_task *t = starpu_task_create();
            t->cl = &cl;
            t->nbuffers = 0;
            t->use_tag = 1;
            t->tag_id = t0 + (starpu_tag_t)j;
            deps[j] = t->tag_id;
            if (p > 0)
                starpu_tag_declare_deps(t->tag_id, 1, t0 - 1);
            if (starpu_task_submit(t) != 0)
                return free(deps), -1;
        }
        /* the join: an empty task (a tag with no task never ends) */
        struct starpu_task *jn = starpu_task_create();
        jn->cl = NULL;
        jn->use_tag = 1;
        jn->tag_id = t0 + (starpu_tag_t)s->width;
        starpu_tag_declare_deps_array(jn->tag_id, (unsigned)s->width, deps);
        if (starpu_task_submit(jn) != 0)
            return free(deps), -1;
    }
    free(deps);
    return 0;
}

int main(int argc, char **argv)
{
    struct shape s = {.width = 16, .phases = 160, .extra = 0};
    int rounds = 5;
    bool paused = false;
    for (int i = 1; i + 1 < argc; i += 2) {
        const int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "-w") && v >= 2 && v <= 64)
            s.width = v;
        else if (!strcmp(argv[i], "-p") && v >= 1 && v <= 100000)
            s.phases = v;
        else if (!strcmp(argv[i], "-r") && v >= 1 && v <= 1000)
            rounds = v;
        else if (!strcmp(argv[i], "-x") && v >= 0 && v <= 6)
            s.extra = v;
        else if (!strcmp(argv[i], "--paused") && (v == 0 || v == 1))
            paused = v == 1;
        else {
            fprintf(stderr, "usage: bench-submit [-w WIDTH 2..64] [-p PHASES] [-r ROUNDS] "
                            "[-x EXTRA 0..6] [--paused 0|1]\n");
            return 2;
        }
    }
    if (starpu_init(NULL) != 0) {
        fprintf(stderr, "bench-submit: starpu_init failed\n");
        return 1;
    }
    struct data d;
    if (data_init(&d, &s) != 0) {
        fprintf(stderr, "bench-submit: out of memory\n");
        return 1;
    }
    printf("bench-submit: %u CPU workers, %s; %d phases of %d empty tasks (%d tasks, as a "
           "%d-layer token at 4 phases a layer), %d extra buffers, %d rounds%s\n",
           starpu_cpu_worker_get_count(), starpu_sched_get_sched_policy()->policy_name, s.phases,
           s.width, s.phases * s.width, s.phases / 4, s.extra, rounds,
           paused ? ", workers paused while submitting" : "");
    printf("%-9s %5s %12s %12s %12s\n", "way", "round", "cpu us/task", "wall us/task",
           "all run, ms");
    static const char *const ways[] = {"joins", "explicit", "tags"};
    starpu_tag_t base = 1;
    struct starpu_task **joins = calloc((size_t)s.phases, sizeof *joins);
    if (joins == NULL)
        return 1;
    int rc = 0;
    for (int r = 0; r < rounds && rc == 0; r++)
        for (int w = 0; w < 3 && rc == 0; w++) {
            if (paused)
                starpu_pause();
            const double c0 = now(CLOCK_THREAD_CPUTIME_ID), t0 = now(CLOCK_MONOTONIC);
            rc = w == 0 ? run_joins(&s, &d) : w == 1 ? run_explicit(&s, joins) : run_tags(&s, base);
            const double c1 = now(CLOCK_THREAD_CPUTIME_ID), t1 = now(CLOCK_MONOTONIC);
            if (paused)
                starpu_resume();
            starpu_task_wait_for_all();
            const double t2 = now(CLOCK_MONOTONIC);
            for (int p = 0; w == 1 && p < s.phases; p++)
                if (joins[p] != NULL)
                    starpu_task_destroy(joins[p]);
            memset(joins, 0, (size_t)s.phases * sizeof *joins);
            base += (starpu_tag_t)s.phases * (starpu_tag_t)(s.width + 1) + 1;
            const double n = (double)s.phases * s.width;
            printf("%-9s %5d %12.2f %12.2f %12.2f\n", ways[w], r, 1e6 * (c1 - c0) / n,
                   1e6 * (t1 - t0) / n, 1e3 * (t2 - t0));
            fflush(stdout);
        }
    if (rc != 0)
        fprintf(stderr, "bench-submit: a submission failed\n");
    free(joins);
    data_free(&d, &s);
    starpu_shutdown();
    return rc != 0;
}
