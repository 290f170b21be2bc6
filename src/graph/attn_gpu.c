/*
 * attn_gpu.c - a layer's attention on the GPU: which models and parameters
 * the CUDA codelet takes (codelets/attn.c, attn_cuda), the GPU memory its
 * handles take, how many layers the VRAM budget gives it, and each such
 * layer's vectors (norm weights, biases) as one float buffer.
 *
 * The layers are the first n_attn_gpu ones.  Their attention task (attn_L,
 * the one-task form) runs on the CUDA worker; its weights and aux are
 * prefetched there once and stay, its KV cache moves there at the first
 * decoded token and stays (prefill's batch tasks run on CPU workers and take
 * it back for the prompt).  A decoded token then moves x, the carried FFN
 * outputs and the FFN input across the link: a few n_embd floats a layer.
 *
 * How many layers (si__attn_gpu_choose): a byte on the GPU saves the CPU
 * the reads it would make of it per token.  An attention layer's weights
 * are read every token; its KV cache takes GPU memory for n_ctx positions.
 * A hot neuron is read when it fires (predictor mode) or, in gate mode, its
 * gating row every token and the rest when it fires.  With a profile the
 * engine takes the number of attention layers that maximises the bytes
 * kept off the CPU with the hottest neurons in the rest of the budget;
 * without one (sparse modes) attention goes first; dense mode's hot units
 * are read whole every token, as much as attention per byte without the
 * cache, so it gets none unless asked (params.attn_gpu).
 */
#include "graph/graph.h"

#include "internal.h" /* si__errf */
#include "model/quants.h"
#include "model/types.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <stdlib.h>
#include <string.h>

const char *si__attn_gpu_unable(const struct si_model *m, const struct si_engine_params *p)
{
    const struct si_hparams *hp = &m->hp;
    if (hp->parallel_residual)
        return "its parallel residual (falcon) has no CUDA path";
    if (hp->q_scale != 1.0f)
        return "its query scaling (gemma3) has no CUDA path";
    if (!p->ref.kv_f16 || p->ref.type_k != SI_TYPE_F16 || p->ref.type_v != SI_TYPE_F16)
        return "the CUDA attention reads an fp16 KV cache";
    if (hp->head_dim > 1024)
        return "head_dim above 1024 has no CUDA attention";
    if (p->redux)
        return "redux merging runs on CPU workers";
    if (p->ref.input_thresholds != NULL)
        return "input sparsity runs on CPU workers";
    for (int l = 0; l < hp->n_layer; l++) {
        const struct si_layer *W = &m->w.layers[l];
        if (W->q_norm.data != NULL || W->k_norm.data != NULL || W->attn_post_norm.data != NULL ||
            W->ffn_post_norm.data != NULL || W->attn_norm2.data != NULL)
            return "its QK and post norms (gemma3) have no CUDA path";
        const struct si_tensor *w[4] = {&W->wq, &W->wk, &W->wv, &W->wo};
        for (int i = 0; i < 4; i++)
            if (!si__cuda_type(w[i]->type))
                return "its attention weights' type has no CUDA kernel";
    }
    return NULL;
}

int64_t si__attn_gpu_scratch_floats(const struct si_model *m)
{
    const struct si_hparams *hp = &m->hp;
    const int64_t qd = (int64_t)hp->n_head * hp->head_dim,
                  kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    return 2 * (int64_t)hp->n_embd + 2 * qd + 2 * kvd; /* xn, o; q, att; k, v */
}

/* Layer l's tensors in aux, in enum si__aux's order (NULL: none). */
static void aux_tensors(const struct si_model *m, int l, const struct si_tensor *t[SI__AUX_COUNT])
{
    const struct si_layer *W = &m->w.layers[l];
    t[SI__AUX_ATTN_NORM] = &W->attn_norm;
    t[SI__AUX_ATTN_NORM_B] = &W->attn_norm_b;
    t[SI__AUX_BQ] = &W->bq;
    t[SI__AUX_BK] = &W->bk;
    t[SI__AUX_BV] = &W->bv;
    t[SI__AUX_BO] = &W->bo;
    t[SI__AUX_FFN_NORM] = &W->ffn_norm;
    t[SI__AUX_FFN_NORM_B] = &W->ffn_norm_b;
    t[SI__AUX_PREV_DOWN_B] = l > 0 ? &m->w.layers[l - 1].ffn_down_b : NULL;
}

/* Floats of layer l's aux (si__attn_gpu_aux's), into off[] when not NULL. */
static int64_t aux_floats(const struct si_model *m, int l, int64_t *off)
{
    const struct si_tensor *t[SI__AUX_COUNT];
    aux_tensors(m, l, t);
    int64_t n = 0;
    for (int i = 0; i < SI__AUX_COUNT; i++) {
        const bool has = t[i] != NULL && t[i]->data != NULL;
        if (off != NULL)
            off[i] = has ? n : -1;
        n += has ? t[i]->ne[0] : 0;
    }
    return n;
}

int si__attn_gpu_aux(struct si_engine *e, int l)
{
    struct si__layer_state *L = &e->L[l];
    const struct si_tensor *t[SI__AUX_COUNT];
    aux_tensors(e->m, l, t);
    const int64_t n = aux_floats(e->m, l, L->aux_off);
    L->aux_n = n > 0 ? n : 1; /* a handle is never empty */
    L->aux = malloc((size_t)L->aux_n * sizeof(float));
    if (L->aux == NULL)
        return SI_E_NOMEM;
    for (int i = 0; i < SI__AUX_COUNT; i++)
        if (L->aux_off[i] >= 0)
            si_dequantize_row(t[i]->type, t[i]->data, L->aux + L->aux_off[i], t[i]->ne[0]);
    return SI_OK;
}

/*
 * Layer l's own handles on the GPU: its four weights, its K and V caches
 * (whole, or the columns of each of the engine's ng kv-head groups), its
 * aux, and the n_parts partial outputs of the layer before that it adds in
 * (sparse modes; dense mode's blocks are shared: si__attn_gpu_shared).
 */
void si__attn_gpu_layer_bytes(const struct si_engine *e, int l, int32_t n_parts,
                              struct si__gpu_bytes *g)
{
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->m->w.layers[l];
    si__gpu_bytes_add(g, (int64_t)W->wq.nbytes);
    si__gpu_bytes_add(g, (int64_t)W->wk.nbytes);
    si__gpu_bytes_add(g, (int64_t)W->wv.nbytes);
    si__gpu_bytes_add(g, (int64_t)W->wo.nbytes);
    const int64_t n_ctx = si__n_ctx_of(e), hd = hp->head_dim;
    const int32_t ng = e->dec.ng > 1 && e->dec.a_g != NULL ? e->dec.ng : 1;
    for (int32_t j = 0; j < ng; j++) {
        const int64_t heads = ng > 1 ? e->dec.a_g[j + 1] - e->dec.a_g[j] : hp->n_head_kv;
        si__gpu_bytes_add(g, n_ctx * heads * hd * 2); /* K */
        si__gpu_bytes_add(g, n_ctx * heads * hd * 2); /* V */
    }
    si__gpu_bytes_add(g, aux_floats(e->m, l, NULL) * (int64_t)sizeof(float));
    for (int32_t j = 0; l > 0 && e->lay.sparse && j < n_parts; j++)
        si__gpu_bytes_add(g, (int64_t)sizeof(float) * hp->n_embd);
}

/* The handles every GPU layer shares: x, the FFN input, the scratch, and
 * dense mode's down-projection blocks. */
void si__attn_gpu_shared(const struct si_engine *e, struct si__gpu_bytes *g)
{
    const struct si_hparams *hp = &e->m->hp;
    si__gpu_bytes_add(g, (int64_t)sizeof(float) * hp->n_embd); /* x */
    si__gpu_bytes_add(g, (int64_t)sizeof(float) * hp->n_embd); /* ffn_in */
    si__gpu_bytes_add(g, si__attn_gpu_scratch_floats(e->m) * (int64_t)sizeof(float));
    for (int32_t k = 0; !e->lay.sparse && k < e->down.nd; k++)
        si__gpu_bytes_add(g, (int64_t)sizeof(float) * (e->down.dn[k + 1] - e->down.dn[k]));
}

/* The GPU bytes of layer l's attention alone, as StarPU allocates it. */
static int64_t layer_cost(const struct si_engine *e, int l)
{
    struct si__gpu_bytes g = {0, 0};
    si__attn_gpu_layer_bytes(e, l, e->lay.n_slices + 1, &g);
    return g.alone + g.blocks * ((int64_t)16 << 10);
}

static int cmp_desc(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/*
 * The number of layers whose attention goes to the GPU under a budget
 * whose reserve (without attention) is rs: params.attn_gpu when given (-1:
 * none), else the rule at the top of this file.  0 when the model or the
 * parameters have no CUDA attention (si__attn_gpu_unable).
 */
int32_t si__attn_gpu_choose(const struct si_engine *e, const struct si_gpu_reserve *rs,
                            int64_t budget)
{
    const struct si_model *m = e->m;
    const int nl = m->hp.n_layer;
    if (e->p.attn_gpu < 0 || si__attn_gpu_unable(m, &e->p) != NULL)
        return 0;
    if (e->p.attn_gpu > 0)
        return e->p.attn_gpu < nl ? e->p.attn_gpu : nl;
    if (budget <= 0 || e->p.placement != NULL || !e->lay.sparse)
        return 0;
    struct si__gpu_bytes sh = {0, 0};
    si__attn_gpu_shared(e, &sh);
    const int64_t avail = budget - rs->total - sh.alone - sh.blocks * ((int64_t)16 << 10);
    int32_t kmax = 0;
    int64_t used = 0;
    while (kmax < nl && used + layer_cost(e, kmax) <= avail)
        used += layer_cost(e, kmax++);
    const struct si_profile *pf = e->p.profile;
    if (kmax == 0 || pf == NULL || pf->n_tokens <= 0 || rs->unit_bytes <= 0)
        return kmax;
    /* The neurons' worth per token, hottest first, summed. */
    const int64_t ff = m->hp.n_ff, n = (int64_t)nl * ff;
    double *v = malloc((size_t)(n + 1) * sizeof *v);
    if (v == NULL)
        return kmax; /* attention first */
    struct si__ffn_fmt f;
    si__ffn_fmt_of(e, 0, &f);
    for (int64_t i = 0; i < n; i++) {
        const double pr = (double)pf->counts[i] / (double)pf->n_tokens;
        v[i] = (e->lay.pre_sep ? (double)f.gu_row : 0.0) + pr * (double)f.rec_bytes;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_desc);
    for (int64_t i = 1; i < n; i++) /* prefix sums: v[i] = worth of the i + 1 hottest */
        v[i] += v[i - 1];
    int32_t best = 0;
    double best_worth = -1.0, attn = 0.0;
    used = 0;
    for (int32_t k = 0; k <= kmax; k++) {
        if (k > 0) {
            used += layer_cost(e, k - 1);
            attn += (double)(m->w.layers[k - 1].wq.nbytes + m->w.layers[k - 1].wk.nbytes +
                             m->w.layers[k - 1].wv.nbytes + m->w.layers[k - 1].wo.nbytes);
        }
        int64_t hot = (avail - used) / rs->unit_bytes;
        hot = hot < n ? hot : n;
        const double worth = attn + (hot > 0 ? v[hot - 1] : 0.0);
        if (worth > best_worth) {
            best_worth = worth;
            best = k;
        }
    }
    free(v);
    return best;
}
