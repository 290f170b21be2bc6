/* runtime.c - StarPU start-up shared by the library, the CLI and the tests. */
#include "graph/runtime.h"

#include "config.h" /* SI_USE_MPI */
#include "starinfer.h"

#include <errno.h>
#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <starpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SI_USE_MPI
#include <starpu_mpi.h>
#endif

/* The caller's worker (caller_worker): the driver of CPU worker 0, run by
 * the thread that started StarPU, and that thread's CPU mask before
 * StarPU bound it to the worker's core (restored at the end, or a later
 * start would find only that core). */
static struct starpu_driver caller_driver = {.type = STARPU_CPU_WORKER, .id.cpu_id = 0};
static bool caller_active;
static pthread_t caller_thread;
static cpu_set_t caller_mask;
static bool caller_mask_saved;

bool si_runtime_sched_known(const char *name)
{
    struct starpu_sched_policy **pol = starpu_sched_get_predefined_policies();
    for (size_t i = 0; pol[i] != NULL; i++)
        if (pol[i]->policy_name != NULL && !strcmp(pol[i]->policy_name, name))
            return true;
    return false;
}

/*
 * The StarPU environment variables whose bad values StarPU answers with an
 * abort (worker counts: "cannot be negative", "must contain an integer") or
 * silently ignores (an unknown STARPU_SCHED runs the default scheduler after
 * a warning): refused here with one line instead.
 */
static int check_env(char *err, size_t err_size)
{
    static const char *const counts[] = {"STARPU_NCPU", "STARPU_NCPUS", "STARPU_NCUDA",
                                         "STARPU_NOPENCL"};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        const char *v = getenv(counts[i]);
        if (v == NULL)
            continue;
        char *end;
        errno = 0;
        const long n = strtol(v, &end, 10);
        if (*v == '\0' || *end != '\0' || errno != 0 || n < 0 || n > 1 << 20) {
            snprintf(err, err_size, "%s=%s: a worker count must be a whole number >= 0",
                     counts[i], v);
            return SI_E_INVALID;
        }
    }
    const char *sched = getenv("STARPU_SCHED");
    if (sched != NULL && strcmp(sched, "help") != 0 && !si_runtime_sched_known(sched)) {
        snprintf(err, err_size,
                 "STARPU_SCHED=%s: StarPU has no such scheduler (`starinfer bench --sched list` "
                 "lists them)",
                 sched);
        return SI_E_INVALID;
    }
    return SI_OK;
}

#ifdef SI_USE_MPI
/*
 * The physical cores of this process's CPU binding (mpirun's per-rank
 * binding), or -1 when hwloc cannot tell.  Under StarPU-MPI without
 * STARPU_NCPU, StarPU would take those cores minus one that it reserves for
 * MPI's progress thread: a rank bound to one core (mpirun -np 2 on two
 * cores) got no worker at all.  starinfer's ranks run one token at a time
 * and exchange a vector a layer range, so every core of the binding
 * becomes a worker and the progress thread shares them.
 */
static int bound_cores(void)
{
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0)
        return -1;
    int n = -1;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (set != NULL && hwloc_topology_load(topo) == 0 &&
        hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0)
        n = hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE);
    hwloc_bitmap_free(set);
    hwloc_topology_destroy(topo);
    return n;
}
#endif

/* StarPU-MPI: asked for (si_runtime_set_mpi), running, this rank, the ranks. */
#ifdef SI_USE_MPI
static bool mpi_wanted;
#endif
static bool mpi_on;
static int mpi_rank = 0, mpi_size = 1;

int si_runtime_start(struct si_runtime *rt, bool caller_worker, char *err, size_t err_size)
{
    rt->owned = false;
    rt->started = false;
    if (starpu_is_initialized()) {
        rt->started = true;
        return SI_OK;
    }
    int rc = check_env(err, err_size);
    if (rc != SI_OK)
        return rc;
    struct starpu_conf conf;
    starpu_conf_init(&conf);
    if (caller_worker) {
        conf.not_launched_drivers = &caller_driver;
        conf.n_not_launched_drivers = 1;
        caller_mask_saved =
            pthread_getaffinity_np(pthread_self(), sizeof caller_mask, &caller_mask) == 0;
    }
#ifdef SI_USE_MPI
    /* StarPU-MPI's own start: it may then run MPI's progress on the CPU
     * driver between tasks (STARPU_MPI_DRIVER_CALL_FREQUENCY) instead of a
     * thread that competes with the workers for the cores */
    if (mpi_wanted && getenv("STARPU_NCPU") == NULL && getenv("STARPU_NCPUS") == NULL) {
        const int n = bound_cores();
        if (n > 0)
            conf.ncpus = n;
    }
    int ret = mpi_wanted ? starpu_mpi_init_conf(NULL, NULL, 1, MPI_COMM_WORLD, &conf)
                         : starpu_init(&conf);
#else
    int ret = starpu_init(&conf);
#endif
    if (ret == -ENODEV) {
        snprintf(err, err_size, "StarPU found no worker (check STARPU_NCPU and STARPU_NCUDA)");
        return SI_E_NO_DEVICE;
    }
    if (ret != 0) {
        snprintf(err, err_size, "starpu_init failed: %s", strerror(-ret));
        return SI_E_RUNTIME;
    }
#ifdef SI_USE_MPI
    if (mpi_wanted) { /* MPI itself started by StarPU-MPI (MPI_Init_thread) */
        mpi_on = true;
        starpu_mpi_comm_rank(MPI_COMM_WORLD, &mpi_rank);
        starpu_mpi_comm_size(MPI_COMM_WORLD, &mpi_size);
    }
#endif
    rt->owned = true;
    rt->started = true;
    if (caller_worker && starpu_worker_get_count_by_type(STARPU_CPU_WORKER) > 0 &&
        starpu_driver_init(&caller_driver) == 0) {
        caller_active = true;
        caller_thread = pthread_self();
    }
    return SI_OK;
}

bool si_runtime_has_caller_worker(void)
{
    return caller_active;
}

bool si_runtime_is_caller_worker(void)
{
    return caller_active && pthread_equal(pthread_self(), caller_thread);
}

/* A callback: *arg = 1. */
static void flag_set(void *arg)
{
    __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
}

int si_runtime_acquire(starpu_data_handle_t h, enum starpu_data_access_mode mode)
{
    if (!caller_active) {
        starpu_data_acquire(h, mode);
        return SI_OK;
    }
    if (!si_runtime_is_caller_worker())
        return SI_E_RUNTIME;
    int done = 0;
    if (starpu_data_acquire_cb(h, mode, flag_set, &done) != 0)
        return SI_E_RUNTIME;
    while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE))
        starpu_driver_run_once(&caller_driver);
    return SI_OK;
}

int si_runtime_wait_task(struct starpu_task *t, const int *done)
{
    if (caller_active) {
        if (!si_runtime_is_caller_worker())
            return SI_E_RUNTIME;
        while (!__atomic_load_n(done, __ATOMIC_ACQUIRE))
            starpu_driver_run_once(&caller_driver);
    }
    return starpu_task_wait(t) == 0 ? SI_OK : SI_E_RUNTIME;
}

int si_runtime_wait_all(void)
{
    if (caller_active) {
        if (!si_runtime_is_caller_worker())
            return SI_E_RUNTIME;
        while (starpu_task_nsubmitted() > 0)
            starpu_driver_run_once(&caller_driver);
    }
    starpu_task_wait_for_all();
    return SI_OK;
}

void si_runtime_stop(struct si_runtime *rt)
{
    if (rt->started && rt->owned) {
        if (caller_active) {
            si_runtime_wait_all();
            starpu_driver_deinit(&caller_driver);
            caller_active = false;
            if (caller_mask_saved)
                pthread_setaffinity_np(caller_thread, sizeof caller_mask, &caller_mask);
        }
#ifdef SI_USE_MPI
        if (mpi_on) {
            /* started by starpu_mpi_init_conf: StarPU, then MPI, stop here */
            starpu_mpi_shutdown();
            mpi_on = false;
            mpi_rank = 0;
            mpi_size = 1;
        } else {
            starpu_shutdown();
        }
#else
        starpu_shutdown();
#endif
    }
    rt->started = false;
    rt->owned = false;
}

void si_runtime_mpi_share_bytes(void *buf, size_t size)
{
#ifdef SI_USE_MPI
    if (!mpi_on || mpi_size < 2 || size == 0)
        return;
    /* through StarPU-MPI, whose thread makes the MPI calls */
    starpu_data_handle_t h;
    starpu_variable_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)buf, size);
    for (int r = 1; r < mpi_size; r++)
        if (mpi_rank == 0)
            starpu_mpi_isend_detached(h, r, 3, MPI_COMM_WORLD, NULL, NULL);
    if (mpi_rank != 0)
        starpu_mpi_irecv_detached(h, 0, 3, MPI_COMM_WORLD, NULL, NULL);
    si_runtime_acquire(h, STARPU_RW); /* after the sends and the receive */
    starpu_data_release(h);
    starpu_data_unregister(h);
#else
    (void)buf;
    (void)size;
#endif
}

void si_runtime_mpi_share(int32_t *v)
{
    si_runtime_mpi_share_bytes(v, sizeof *v);
}

bool si_runtime_set_mpi(bool on)
{
#ifdef SI_USE_MPI
    mpi_wanted = on;
    return true;
#else
    return !on;
#endif
}

bool si_runtime_mpi(void)
{
    return mpi_on;
}

int si_runtime_mpi_rank(void)
{
    return mpi_rank;
}

int si_runtime_mpi_size(void)
{
    return mpi_size;
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
