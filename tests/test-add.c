/*
 * test-add.c - the add codelet through StarPU, checked against plain C.
 *
 * Built twice: tests/test-codelet-cpu runs a task pinned to every CPU worker
 * (StarPU's profiling confirms where each ran) and then a vector partitioned
 * into child handles, one task per slice; tests/test-codelet-cuda (TEST_CUDA)
 * does the same on every CUDA worker and exits 77 without one.
 */
#include "add/add.h"
#include "graph/runtime.h"
#include "starinfer.h"
#include "test.h"

#include <math.h>
#include <starpu.h>
#include <stdlib.h>

#ifdef TEST_CUDA
#define ARCH STARPU_CUDA_WORKER
#define ARCH_NAME "CUDA"
#else
#define ARCH STARPU_CPU_WORKER
#define ARCH_NAME "CPU"
#endif

static void fill(float *x, int64_t n, unsigned seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
}

/* Largest |y - (a + b)| with the reference sum in double. */
static double max_error(const float *y, const float *a, const float *b, int64_t n)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)y[i] - ((double)a[i] + (double)b[i]));
        if (e > worst || isnan(e))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

/* One pinned task per worker of the architecture, each on its own vectors. */
static void test_each_worker(int *workers, unsigned nworkers)
{
    const int64_t n = 100003; /* not a multiple of any block size */
    for (unsigned k = 0; k < nworkers; k++) {
        int w = workers[k];
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *y = malloc(n * sizeof *y);
        fill(a, n, 1 + k);
        fill(b, n, 100 + k);
        for (int64_t i = 0; i < n; i++)
            y[i] = NAN;
        starpu_data_handle_t hy, ha, hb;
        starpu_vector_data_register(&hy, STARPU_MAIN_RAM, (uintptr_t)y, n, sizeof *y);
        starpu_vector_data_register(&ha, STARPU_MAIN_RAM, (uintptr_t)a, n, sizeof *a);
        starpu_vector_data_register(&hb, STARPU_MAIN_RAM, (uintptr_t)b, n, sizeof *b);

        struct starpu_task *task = starpu_task_create();
        task->cl = &si_cl_add_f32;
        task->handles[0] = hy;
        task->handles[1] = ha;
        task->handles[2] = hb;
        task->execute_on_a_specific_worker = 1;
        task->workerid = (unsigned)w;
        task->synchronous = 1;
        task->destroy = 0;
        int ret = starpu_task_submit(task);
        CHECK(ret == 0, "submit on worker %d: %d", w, ret);
        if (ret == 0 && task->profiling_info != NULL)
            CHECK(task->profiling_info->workerid == w, "task ran on worker %d, not %d",
                  task->profiling_info->workerid, w);
        CHECK(ret != 0 || task->profiling_info != NULL, "no profiling info for worker %d", w);
        starpu_task_destroy(task);

        starpu_data_unregister(hy);
        starpu_data_unregister(ha);
        starpu_data_unregister(hb);
        double err = max_error(y, a, b, n);
        CHECK(err == 0.0, "worker %d: max error %g (float addition is exact to round)", w, err);
        char name[64];
        starpu_worker_get_name(w, name, sizeof name);
        printf("worker %d (%s): %lld elements, max error %g\n", w, name, (long long)n, err);
        free(a);
        free(b);
        free(y);
    }
}

/* A vector split into child handles; one task per slice, round-robin over
 * the workers, through si_add_submit. */
static void test_partitioned(int *workers, unsigned nworkers)
{
    const int64_t n = 1 << 18;
    const unsigned parts = 2 * nworkers + 1 < 64 ? 2 * nworkers + 1 : 63;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *y = malloc(n * sizeof *y);
    fill(a, n, 7);
    fill(b, n, 8);
    starpu_data_handle_t h[3];
    float *ptr[3] = {y, a, b};
    for (int i = 0; i < 3; i++)
        starpu_vector_data_register(&h[i], STARPU_MAIN_RAM, (uintptr_t)ptr[i], n, sizeof(float));
    struct starpu_data_filter f = {.filter_func = starpu_vector_filter_block, .nchildren = parts};
    starpu_data_handle_t child[3][64];
    for (int i = 0; i < 3; i++) {
        starpu_data_partition_plan(h[i], &f, child[i]);
        starpu_data_partition_submit(h[i], parts, child[i]);
    }
    for (unsigned p = 0; p < parts; p++) {
        int ret = si_add_submit(child[0][p], child[1][p], child[2][p], workers[p % nworkers]);
        CHECK(ret == 0, "submit slice %u: %d", p, ret);
    }
    for (int i = 0; i < 3; i++) {
        starpu_data_unpartition_submit(h[i], parts, child[i], STARPU_MAIN_RAM);
        starpu_data_partition_clean(h[i], parts, child[i]);
    }
    starpu_task_wait_for_all();
    for (int i = 0; i < 3; i++)
        starpu_data_unregister(h[i]);
    double err = max_error(y, a, b, n);
    CHECK(err == 0.0, "partitioned: max error %g", err);
    printf("%u slices over %u %s workers: max error %g\n", parts, nworkers, ARCH_NAME, err);
    free(a);
    free(b);
    free(y);
}

int main(void)
{
    /* Ask StarPU to record where each task ran. */
    setenv("STARPU_PROFILING", "1", 1);
    struct si_runtime rt;
    char err[256];
    if (si_runtime_start(&rt, false, err, sizeof err) != SI_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int workers[STARPU_NMAXWORKERS];
    unsigned nworkers = starpu_worker_get_count_by_type(ARCH);
    if (nworkers == 0) {
        si_runtime_stop(&rt);
        test_skip("no " ARCH_NAME " worker (StarPU found none on this machine)");
    }
    starpu_worker_get_ids_by_type(ARCH, workers, STARPU_NMAXWORKERS);
    printf("%u %s workers\n", nworkers, ARCH_NAME);
    test_each_worker(workers, nworkers);
    test_partitioned(workers, nworkers);
    si_runtime_stop(&rt);
    return test_result();
}
