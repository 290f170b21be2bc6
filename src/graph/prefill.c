/* prefill.c - a batch of prompt tokens as one task graph per batch (see
 * si_engine_eval_batch in engine.h). */
#include "graph/graph.h"

#include "codelets/codelets.h"
#include "graph/runtime.h"
#include "starinfer.h"

#include <starpu.h>

/* x_b += attention_l(norm(x_b)) for the batch's tokens in order (K, V of
 * the new positions written); xb_b = the FFN's input. */
static int submit_batch_attention(struct si_engine *e, int l)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    a.n = 0;
    si__add(&a, e->h_bx, STARPU_RW);
    si__add(&a, e->h_bxb, STARPU_W);
    si__add(&a, e->h_bxb3, STARPU_W);
    for (int32_t g = 0; g < e->ng; g++) { /* the cache, in its groups' parts */
        si__add(&a, e->ng > 1 ? L->h_k_c[g] : L->h_k, STARPU_RW);
        si__add(&a, e->ng > 1 ? L->h_v_c[g] : L->h_v, STARPU_RW);
    }
    for (int i = 0; i < 4; i++)
        si__add(&a, L->h_w[i], STARPU_R);
    return si__run(e, &si__cl_battn, L->name_battn, l, -1, 0, &a, 0);
}

/* out_j = FFN slice j (xb_b) for every token: GEMM tasks, on CPU workers
 * (the hot slice too: its weights are read-only, so the main-memory copy
 * stays valid beside the GPU's). */
static int submit_batch_ffn(struct si_engine *e, int l)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    int rc = 0;
    for (int32_t j = 0; j < L->nsl && rc == 0; j++) {
        a.n = 0;
        si__add(&a, e->h_bxb, STARPU_R);
        si__add_slice_weights(e, L, j, &a);
        si__add(&a, e->h_bpart[j], STARPU_W);
        rc = si__run(e, &si__cl_bffn, L->name_bffn[j], l, j, 0, &a, STARPU_CPU);
    }
    return rc;
}

/* Dense mode: down_k = rows k of W_down . H, H the slices' activations. */
static int submit_batch_down(struct si_engine *e, int l)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    int rc = 0;
    for (int32_t b = 0; b < e->nd && rc == 0; b++) {
        a.n = 0;
        for (int32_t j = 0; j < L->nsl; j++)
            si__add(&a, e->h_bpart[j], STARPU_R);
        si__add(&a, L->h_down_c[b], STARPU_R);
        si__add(&a, e->h_bdout[b], STARPU_W);
        rc = si__run(e, &si__cl_bdown, L->name_bdown[b], l, b, 0, &a, STARPU_CPU);
    }
    return rc;
}

/* x_b += FFN_l: the slices' outputs (dense: the down blocks) merged. */
static int submit_batch_merge(struct si_engine *e, int l)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    a.n = 0;
    si__add(&a, e->h_bx, STARPU_RW);
    if (!e->sparse)
        for (int32_t b = 0; b < e->nd; b++)
            si__add(&a, e->h_bdout[b], STARPU_R);
    else
        for (int32_t j = 0; j < L->nsl; j++)
            si__add(&a, e->h_bpart[j], STARPU_R);
    si__add(&a, e->h_bxb3, STARPU_R);
    return si__run(e, &si__cl_bmerge, L->name_bmerge, l, -1, 0, &a, 0);
}

/* Layer l of a batch. */
static int submit_batch_layer(struct si_engine *e, int l)
{
    int rc = submit_batch_attention(e, l);
    if (rc == 0)
        rc = submit_batch_ffn(e, l);
    if (rc == 0 && !e->sparse)
        rc = submit_batch_down(e, l);
    if (rc == 0)
        rc = submit_batch_merge(e, l);
    return rc;
}

/* One batch of at most n_batch tokens (checked by the caller): embed, the
 * layers, then the last token's logits. */
static int eval_batch(struct si_engine *e, const int32_t *tokens, int32_t n)
{
    const struct si_hparams *hp = &e->m->hp;
    e->btok = tokens;
    e->bn = n;
    e->bp0 = e->ref->n_past;
    struct si__args a;
    a.n = 0;
    si__add(&a, e->h_bx, STARPU_W);
    int rc = si__run(e, &si__cl_bembed, "embed_batch", -1, -1, 0, &a, 0);
    for (int l = 0; l < hp->n_layer && rc == 0; l++)
        rc = submit_batch_layer(e, l);
    if (rc == 0) {
        a.n = 0;
        si__add(&a, e->h_bx, STARPU_R);
        si__add(&a, e->h_xb, STARPU_RW);
        si__add(&a, e->h_logits, STARPU_W);
        si__add(&a, e->h_out, STARPU_R);
        rc = si__run(e, &si__cl_bhead, "norm+lm_head", -1, -1, 0, &a, 0);
    }
    si_runtime_acquire(e->h_logits, STARPU_R);
    starpu_data_release(e->h_logits);
    if (rc != 0) {
        si_runtime_wait_all();
        return SI_E_RUNTIME;
    }
    return SI_OK;
}

int si_engine_eval_batch(struct si_engine *e, const int32_t *tokens, int32_t n)
{
    const struct si_hparams *hp = &e->m->hp;
    if (n < 1 || tokens == NULL)
        return SI_E_INVALID;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return SI_E_INVALID;
    if (si_runtime_has_caller_worker() && !si_runtime_is_caller_worker())
        return SI_E_RUNTIME;
    if ((int64_t)e->ref->n_past + n > e->ref->p.n_ctx)
        return SI_E_BUDGET;
    if (e->n_batch <= 1 || n == 1) {
        for (int32_t i = 0; i < n; i++) {
            int rc = si_engine_eval(e, tokens[i]);
            if (rc != SI_OK)
                return rc;
        }
        return SI_OK;
    }
    const double t0 = si__now();
    for (int32_t i = 0; i < n; i += e->n_batch) {
        int32_t nb = n - i < e->n_batch ? n - i : e->n_batch;
        int rc = eval_batch(e, tokens + i, nb);
        if (rc != SI_OK) {
            e->bn = 0;
            return rc;
        }
    }
    e->bn = 0; /* tasks submitted from now on are single-token ones */
    e->stats.batch_tokens += n;
    e->stats.batch_seconds += si__now() - t0;
    return SI_OK;
}
