/*
 * act.h - the FFN activation functions, shared by the reference forward pass
 * and the FFN kernels so that both round alike.
 */
#ifndef SI_MODEL_ACT_H
#define SI_MODEL_ACT_H

#include "model/model.h"

#include <math.h>

/* act(x): SiLU x / (1 + e^-x), ReLU max(x, 0), or GELU's tanh approximation. */
static inline float si_act_apply(enum si_act a, float x)
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
