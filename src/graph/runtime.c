/* runtime.c - StarPU start-up shared by the library, the CLI and the tests. */
#include "graph/runtime.h"

#include "starinfer.h"

#include <errno.h>
#include <starpu.h>
#include <string.h>

int si_runtime_start(struct si_runtime *rt, char *err, size_t err_size)
{
    rt->owned = false;
    rt->started = false;
    if (starpu_is_initialized()) {
        rt->started = true;
        return SI_OK;
    }
    int ret = starpu_init(NULL);
    if (ret == -ENODEV) {
        snprintf(err, err_size, "StarPU found no worker (check STARPU_NCPU and STARPU_NCUDA)");
        return SI_E_NO_DEVICE;
    }
    if (ret != 0) {
        snprintf(err, err_size, "starpu_init failed: %s", strerror(-ret));
        return SI_E_RUNTIME;
    }
    rt->owned = true;
    rt->started = true;
    return SI_OK;
}

void si_runtime_stop(struct si_runtime *rt)
{
    if (rt->started && rt->owned)
        starpu_shutdown();
    rt->started = false;
    rt->owned = false;
}

unsigned si_runtime_ncpu(void)
{
    return starpu_worker_get_count_by_type(STARPU_CPU_WORKER);
}

unsigned si_runtime_ncuda(void)
{
    return starpu_worker_get_count_by_type(STARPU_CUDA_WORKER);
}

void si_runtime_describe(FILE *f)
{
    int major, minor, release;
    starpu_get_version(&major, &minor, &release);
    struct starpu_sched_policy *policy = starpu_sched_get_sched_policy();
    fprintf(f, "StarPU       : %d.%d.%d, scheduler %s\n", major, minor, release,
            policy != NULL && policy->policy_name != NULL ? policy->policy_name : "?");
    fprintf(f, "workers      : %u CPU, %u CUDA\n", si_runtime_ncpu(), si_runtime_ncuda());
    unsigned n = starpu_worker_get_count();
    for (unsigned w = 0; w < n; w++) {
        char name[128];
        starpu_worker_get_name((int)w, name, sizeof name);
        unsigned node = starpu_worker_get_memory_node(w);
        starpu_ssize_t mem = starpu_memory_get_total(node);
        fprintf(f, "  worker %-3u : %s, memory node %u", w, name, node);
        if (starpu_worker_get_type((int)w) == STARPU_CUDA_WORKER && mem > 0)
            fprintf(f, " (%.1f GiB)", (double)mem / (1024.0 * 1024.0 * 1024.0));
        fputc('\n', f);
    }
}
