/* add.c - y = a + b on CPU workers, and the codelet that also has CUDA. */
#include "add.h"

#include "config.h"

void si_k_add_f32(float *y, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

static void add_f32_cpu(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const float *a = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    const float *b = (const float *)STARPU_VECTOR_GET_PTR(buffers[2]);
    int64_t n = (int64_t)STARPU_VECTOR_GET_NX(buffers[0]);
    si_k_add_f32(y, a, b, n);
}

static struct starpu_perfmodel add_f32_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "si_add_f32",
};

struct starpu_codelet si_cl_add_f32 = {
    .cpu_funcs = {add_f32_cpu},
    .cpu_funcs_name = {"add_f32_cpu"},
#ifdef SI_USE_CUDA
    .cuda_funcs = {si_add_f32_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = 3,
    .modes = {STARPU_W, STARPU_R, STARPU_R},
    .model = &add_f32_model,
    .name = "add",
};

int si_add_submit(starpu_data_handle_t y, starpu_data_handle_t a, starpu_data_handle_t b,
                  int worker)
{
    struct starpu_task *task = starpu_task_create();
    task->cl = &si_cl_add_f32;
    task->handles[0] = y;
    task->handles[1] = a;
    task->handles[2] = b;
    if (worker >= 0) {
        task->execute_on_a_specific_worker = 1;
        task->workerid = (unsigned)worker;
    }
    int ret = starpu_task_submit(task);
    if (ret != 0) {
        task->destroy = 0;
        starpu_task_destroy(task);
    }
    return ret;
}
