/*
 * attn.c - attention as tasks: one per layer (on a CPU worker, or on the GPU for the layers the
 * plan puts there), or split by kv heads with the output projection in row slices.
 */
#include "codelets/codelets.h"

#include "model/forward.h"

#include <starpu.h>
#include <string.h>

#ifdef SI_USE_CUDA
#include "codelets/codelets_cuda.h"
#include <cuda_runtime_api.h>

/* attn_cuda adds in every slice of the layer before: the cold ones and the hot one. */
_Static_assert(SI_CUDA_MAX_PARTS >= SI__MAX_SLICES + 1, "si_cuda_residual takes too few parts");
#endif

/*
 * attn_L (attention in one task, when its products are not split): layer
 * l - 1's FFN added into x, then the reference's whole attention step on
 * it (x += attention; xb = the FFN's input).
 * Buffers: x (RW), the carried ones (R), xb (W), [xb3 (W)], K, V (RW),
 * Wq, Wk, Wv, Wo (R).
 */
static void attn_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si_ref *s = e->ref;
    double t0 = si__now();
    const double tm = si__residual_in(e, a->l, buffers, 1, s->x, s->x, si__scratch_of(e));
    si_ref_attn(s, a->l);
    si__charge(e, SI_TASK_MERGE, tm);
    si__charge(e, SI_TASK_ATTN, si__now() - t0 - tm);
}

#ifdef SI_USE_CUDA
/*
 * attn_L on the CUDA worker (a layer whose attention the plan put on the
 * GPU, graph/attn_gpu.c): attn_cpu's buffers, then aux (R: the layer's
 * norm weights and biases as floats, state.h) and a scratch of
 * si__attn_gpu_scratch_floats.  The same steps as the reference's, each a
 * kernel on the task's stream: the carried FFN output added into x, the
 * norm, q k v (dots on float inputs: the CPU converts them to Q8 for
 * quantized weights, so the results differ by that rounding), biases, RoPE,
 * the new k and v into the fp16 cache (each kv-head group's columns, a
 * child of the cache when the engine splits it), attention, the output
 * projection, the residual, the FFN's normalised input.
 */
static void attn_cuda(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const int l = a->l;
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->w->layers[l];
    const struct si__layer_state *L = &e->L[l];
    cudaStream_t st = starpu_cuda_get_local_stream();
    const double t0 = si__now();
    const int64_t d = hp->n_embd, hd = hp->head_dim, qd = (int64_t)hp->n_head * hd,
                  kvd = (int64_t)hp->n_head_kv * hd;
    const int group = hp->n_head / hp->n_head_kv, pos = e->ref->n_past;
    int b = 0;
    float *x = (float *)STARPU_VECTOR_GET_PTR(buffers[b++]);
    const int nc = si__n_carried(e, l);
    const float *parts[SI_CUDA_MAX_PARTS];
    for (int j = 0; j < nc; j++)
        parts[j] = (const float *)STARPU_VECTOR_GET_PTR(buffers[b++]);
    float *xb = (float *)STARPU_VECTOR_GET_PTR(buffers[b++]);
    const int kv0 = b;
    b += 2 * e->ng;
    const void *w[4];
    for (int i = 0; i < 4; i++)
        w[i] = (const void *)STARPU_VECTOR_GET_PTR(buffers[b++]);
    const float *aux = (const float *)STARPU_VECTOR_GET_PTR(buffers[b++]);
    float *xn = (float *)STARPU_VECTOR_GET_PTR(buffers[b++]);
    float *q = xn + d, *k = q + qd, *v = k + kvd, *att = v + kvd, *o = att + qd;
#define AUX(i) (L->aux_off[i] >= 0 ? aux + L->aux_off[i] : NULL)
    const bool rms = hp->norm_kind == SI_NORM_RMS;
    cudaError_t rc = cudaSuccess;
    if (nc > 0 && e->sparse) { /* the slices' partial outputs, in order */
        rc = si_cuda_residual(x, parts, nc, AUX(SI__AUX_PREV_DOWN_B), d, st);
    } else if (nc > 0) { /* dense: the down projection's blocks side by side */
        const float *bias = AUX(SI__AUX_PREV_DOWN_B);
        for (int32_t j = 0; j < e->nd && rc == cudaSuccess; j++)
            rc = si_cuda_residual(x + e->dn[j], &parts[j], 1, bias ? bias + e->dn[j] : NULL,
                                  e->dn[j + 1] - e->dn[j], st);
    }
    if (rc == cudaSuccess)
        rc = rms ? si_cuda_rmsnorm(xn, x, AUX(SI__AUX_ATTN_NORM), d, hp->norm_eps, st)
                 : si_cuda_layernorm(xn, x, AUX(SI__AUX_ATTN_NORM), AUX(SI__AUX_ATTN_NORM_B), d,
                                     hp->norm_eps, st);
    const struct si_tensor *wt[3] = {&W->wq, &W->wk, &W->wv};
    float *out[3] = {q, k, v};
    const enum si__aux bias[3] = {SI__AUX_BQ, SI__AUX_BK, SI__AUX_BV};
    for (int i = 0; i < 3 && rc == cudaSuccess; i++) {
        rc = si_cuda_matvec(wt[i]->type, w[i], wt[i]->row_bytes, wt[i]->ne[1], d, xn, out[i], st);
        if (rc == cudaSuccess && AUX(bias[i]) != NULL)
            rc = si_cuda_add(out[i], out[i], AUX(bias[i]), wt[i]->ne[1], st);
    }
    const bool local = si_hparams_is_swa(hp, l);
    if (rc == cudaSuccess && hp->rope_kind != SI_ROPE_NONE) {
        const float base = local ? hp->rope_base_local : hp->rope_base;
        const float scale = local ? 1.0f : hp->rope_scale;
        rc = si_cuda_rope(q, 1, hp->n_head, (int)hd, hp->n_rot, (int)hp->rope_kind, pos, base,
                          scale, st);
        if (rc == cudaSuccess)
            rc = si_cuda_rope(k, 1, hp->n_head_kv, (int)hd, hp->n_rot, (int)hp->rope_kind, pos,
                              base, scale, st);
    }
    const int first = local && pos >= hp->sliding_window ? pos - hp->sliding_window + 1 : 0;
    for (int32_t g = 0; g < e->ng && rc == cudaSuccess; g++) {
        const int64_t g0 = e->ng > 1 ? e->a_g[g] : 0,
                      g1 = e->ng > 1 ? e->a_g[g + 1] : hp->n_head_kv;
        uint16_t *kc, *vc;
        if (e->ng > 1) { /* the group's columns, packed on the GPU */
            kc = (uint16_t *)STARPU_MATRIX_GET_PTR(buffers[kv0 + 2 * g]);
            vc = (uint16_t *)STARPU_MATRIX_GET_PTR(buffers[kv0 + 2 * g + 1]);
            if (STARPU_MATRIX_GET_LD(buffers[kv0 + 2 * g]) !=
                    STARPU_MATRIX_GET_NX(buffers[kv0 + 2 * g]) ||
                STARPU_MATRIX_GET_LD(buffers[kv0 + 2 * g + 1]) !=
                    STARPU_MATRIX_GET_NX(buffers[kv0 + 2 * g + 1])) {
                rc = cudaErrorInvalidValue; /* the kernel reads positions packed */
                break;
            }
        } else {
            kc = (uint16_t *)STARPU_VECTOR_GET_PTR(buffers[kv0]);
            vc = (uint16_t *)STARPU_VECTOR_GET_PTR(buffers[kv0 + 1]);
        }
        const int64_t row = (g1 - g0) * hd; /* halves per position */
        rc = si_cuda_to_f16(kc + (size_t)pos * (size_t)row, k + g0 * hd, row, st);
        if (rc == cudaSuccess)
            rc = si_cuda_to_f16(vc + (size_t)pos * (size_t)row, v + g0 * hd, row, st);
        if (rc == cudaSuccess)
            rc = si_cuda_attn_f16(att + g0 * group * hd, q + g0 * group * hd, kc, vc, first,
                                  pos + 1, (int)((g1 - g0) * group), (int)(g1 - g0), (int)hd,
                                  hp->attn_scale, st);
    }
    if (rc == cudaSuccess)
        rc = si_cuda_matvec(W->wo.type, w[3], W->wo.row_bytes, d, qd, att, o, st);
    if (rc == cudaSuccess && AUX(SI__AUX_BO) != NULL)
        rc = si_cuda_add(o, o, AUX(SI__AUX_BO), d, st);
    if (rc == cudaSuccess)
        rc = si_cuda_add(x, x, o, d, st);
    if (rc == cudaSuccess)
        rc = rms ? si_cuda_rmsnorm(xb, x, AUX(SI__AUX_FFN_NORM), d, hp->norm_eps, st)
                 : si_cuda_layernorm(xb, x, AUX(SI__AUX_FFN_NORM), AUX(SI__AUX_FFN_NORM_B), d,
                                     hp->norm_eps, st);
#undef AUX
    if (rc != cudaSuccess)
        STARPU_CUDA_REPORT_ERROR(rc);
    si__account(e, SI_TASK_ATTN, t0);
}
#endif

/*
 * attn_L.j (attention split by kv heads): layer l's input residual (layer
 * l - 1's FFN added into x, by every group alike; group 0 keeps it in x2
 * for attn_out), its normalised input, then for kv heads [a_g[j],
 * a_g[j+1]) and their query heads: their rows of q, k and v, biases, QK
 * norm, RoPE, the cache's columns, their attention (si_ref_attn_group).
 * Buffers: x (R), the carried ones (R), Wq, Wk, Wv (R), K_j, V_j (RW),
 * att_j (W: those query heads' outputs), [j = 0: x2 (W)].
 */
static void attn_grp_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->w->layers[a->l];
    struct si__scratch *sc = si__scratch_of(e);
    double t0 = si__now();
    const int j = a->j, hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const int nc = si__n_carried(e, a->l);
    const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    float *att = (float *)STARPU_VECTOR_GET_PTR(buffers[1 + nc + 5]);
    float *xl = j == 0 ? (float *)STARPU_VECTOR_GET_PTR(buffers[1 + nc + 6]) : sc->xl;
    const double tm = si__residual_in(e, a->l, buffers, 1, x, xl, sc);
    si_ref_attn_input(e->ref, a->l, xl, sc->xn, sc->tmp);
    const int64_t g0 = e->a_g[j], g1 = e->a_g[j + 1];
    const int64_t q0 = g0 * group * hd, q1 = g1 * group * hd, k0 = g0 * hd, k1 = g1 * hd;
    struct si_tensor wq = si__rows_of(&W->wq, q0, q1), wk = si__rows_of(&W->wk, k0, k1),
                     wv = si__rows_of(&W->wv, k0, k1);
    int64_t nz;
    if (si__input_in(e, sc, a->l, SI_INPUT_QKV, sc->xn, hp->n_embd, &nz)) {
        si__matvec_t(e, &W->wq, &W->wq_t, q0, q1, sc, nz, sc->xn, sc->aq + q0);
        si__matvec_t(e, &W->wk, &W->wk_t, k0, k1, sc, nz, sc->xn, sc->ak + k0);
        si__matvec_t(e, &W->wv, &W->wv_t, k0, k1, sc, nz, sc->xn, sc->av + k0);
    } else {
        si_ref_matvec(e->p.ref.act_quant, sc->xq, sc->aq + q0, &wq, sc->xn);
        si_ref_matvec(e->p.ref.act_quant, sc->xq, sc->ak + k0, &wk, sc->xn);
        si_ref_matvec(e->p.ref.act_quant, sc->xq, sc->av + k0, &wv, sc->xn);
    }
    si_ref_attn_group(e->ref, a->l, (int)g0, (int)g1, sc->aq, sc->ak, sc->av, sc->aatt, sc->ascr);
    memcpy(att, sc->aatt + q0, (size_t)(q1 - q0) * sizeof(float));
    si__charge(e, SI_TASK_MERGE, tm);
    si__charge(e, SI_TASK_ATTN, si__now() - t0 - tm);
}

/* Buffers: att_* (R: the whole attention output, the groups' children in
 * order), Wo (R), o_j (W). */
static void ao_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__scratch *sc = si__scratch_of(e);
    double t0 = si__now();
    /* The children are consecutive parts of one array in main memory. */
    const float *att = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[e->ng + 1]);
    const struct si_layer *W = &e->w->layers[a->l];
    const int64_t o0 = e->a_o[a->j], o1 = e->a_o[a->j + 1];
    if (e->p.ref.input_thresholds != NULL) {
        /* input sparsity zeroes entries: this task's own copy */
        const int64_t qd = (int64_t)e->m->hp.n_head * e->m->hp.head_dim;
        memcpy(sc->aatt, att, (size_t)qd * sizeof *att);
        att = sc->aatt;
        int64_t nz;
        if (si__input_in(e, sc, a->l, SI_INPUT_O, sc->aatt, qd, &nz)) {
            si__matvec_t(e, &W->wo, &W->wo_t, o0, o1, sc, nz, sc->aatt, y);
            si__account(e, SI_TASK_ATTN_PROJ, t0);
            return;
        }
    }
    struct si_tensor wo = si__rows_of(&W->wo, o0, o1);
    si_ref_matvec(e->p.ref.act_quant, sc->xq, y, &wo, att);
    si__account(e, SI_TASK_ATTN_PROJ, t0);
}

/* Buffers: x2 (R: the layer's input residual), o_* (R), x (W: the residual
 * after attention), xb (W: the FFN's input), [xb3 (W)]. */
static void aout_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si_ref *s = e->ref;
    struct si__scratch *sc = si__scratch_of(e);
    double t0 = si__now();
    const float *x2 = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    for (int32_t j = 0; j < e->na; j++)
        memcpy(sc->xf + e->a_o[j], (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + j]),
               (size_t)(e->a_o[j + 1] - e->a_o[j]) * sizeof(float));
    si_ref_attn_finish_into(s, a->l, x2, sc->xf, s->x, s->xb, s->xb3, sc->tmp);
    si__account(e, SI_TASK_ATTN, t0);
}

static struct starpu_perfmodel attn_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_f32"};
static struct starpu_perfmodel agrp_model = {.type = STARPU_HISTORY_BASED,
                                             .symbol = "si_attn_group"};
static struct starpu_perfmodel ao_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_o"};
static struct starpu_perfmodel aout_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_out"};

struct starpu_codelet si__cl_attn = {
    .cpu_funcs = {attn_cpu},
#ifdef SI_USE_CUDA
    .cuda_funcs = {attn_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &attn_model,
    .name = "attn",
};
struct starpu_codelet si__cl_agrp = {
    .cpu_funcs = {attn_grp_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &agrp_model,
    .name = "attn",
};
struct starpu_codelet si__cl_ao = {
    .cpu_funcs = {ao_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &ao_model,
    .name = "attn_o",
};
struct starpu_codelet si__cl_aout = {
    .cpu_funcs = {aout_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &aout_model,
    .name = "attn_out",
};
