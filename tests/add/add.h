/*
 * add.h - element-wise sum y = a + b of float32 vectors.
 *
 * The merge step of a layer adds partial FFN outputs; this is its smallest
 * form.  Pure kernel, StarPU codelet (CPU and CUDA) and a submit helper.
 */
#ifndef SI_CODELETS_ADD_H
#define SI_CODELETS_ADD_H

#include <stdint.h>
#include <starpu.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y[i] = a[i] + b[i] for i in [0, n). y may alias a or b. */
void si_k_add_f32(float *y, const float *a, const float *b, int64_t n);

/* Buffers: y (W), a (R), b (R), all STARPU vector interfaces of float of equal
 * length.  Perfmodel symbol: si_add_f32. */
extern struct starpu_codelet si_cl_add_f32;

/* Submit y = a + b; `worker` >= 0 pins the task to that worker, -1 lets the
 * scheduler choose.  Returns 0 or StarPU's negative errno. */
int si_add_submit(starpu_data_handle_t y, starpu_data_handle_t a, starpu_data_handle_t b,
                  int worker);

#ifdef STARPU_USE_CUDA
/* The CUDA implementation (add_cuda.cu), run on the worker's local stream. */
void si_add_f32_cuda(void *buffers[], void *cl_arg);
#endif

#ifdef __cplusplus
}
#endif

#endif /* SI_CODELETS_ADD_H */
