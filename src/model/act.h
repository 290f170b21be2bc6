/*
 * act.h - the FFN activation functions, shared by the reference forward pass,
 * the CPU FFN kernels and the CUDA ones so that all round alike.
 */
#ifndef SI_MODEL_ACT_H
#define SI_MODEL_ACT_H

#include "model/model.h"

#include <math.h>

/* Host code, and CUDA device code too when nvcc compiles the includer. */
#ifdef __CUDACC__
#define SI_ACT_FN static inline __host__ __device__
#else
#define SI_ACT_FN static inline
#endif

/* act(x): SiLU x / (1 + e^-x), ReLU max(x, 0), or GELU's tanh approximation. */
SI_ACT_FN float si_act_apply(enum si_act a, float x)
{
    switch (a) {
    case SI_ACT_RELU:
        return x > 0.0f ? x : 0.0f;
    case SI_ACT_GELU: /* tanh approximation */
        return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
    case SI_ACT_SILU:
    default:
        return x / (1.0f + expf(-x));
    }
}

#endif /* SI_MODEL_ACT_H */
