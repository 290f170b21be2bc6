/* add_cuda.cu - y = a + b on a CUDA worker. */
#include "add.h"

#include <starpu.h>

static __global__ void add_f32_kernel(float *y, const float *a, const float *b, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

extern "C" void si_add_f32_cuda(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const float *a = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    const float *b = (const float *)STARPU_VECTOR_GET_PTR(buffers[2]);
    int64_t n = (int64_t)STARPU_VECTOR_GET_NX(buffers[0]);
    if (n == 0)
        return;
    const int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > 65535)
        blocks = 65535;
    add_f32_kernel<<<(unsigned)blocks, threads, 0, starpu_cuda_get_local_stream()>>>(y, a, b, n);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess)
        STARPU_CUDA_REPORT_ERROR(status);
}
