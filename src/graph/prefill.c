/* prefill.c - a batch of prompt tokens as one task graph per batch (see
 * si_engine_eval_batch in engine.h). */
#include "graph/graph.h"

#include "codelets/codelets.h"
#include "graph/runtime.h"
#include "starinfer.h"

#include <starpu.h>

static int eval_batch(struct si_engine *e, const int32_t *tokens, int32_t n)
{
    const struct si_hparams *hp = &e->m->hp;
    starpu_data_handle_t h[SI__MAX_SLICES + 16];
    enum starpu_data_access_mode md[SI__MAX_SLICES + 16];
    int k = 0, rc;
    e->btok = tokens;
    e->bn = n;
    e->bp0 = e->ref->n_past;
#define ADD(handle, mode) (h[k] = (handle), md[k++] = (mode))
    ADD(e->h_bx, STARPU_W);
    rc = si__submit(e, &si__cl_bembed, "embed_batch", -1, -1, 0, h, md, k, 0);
    for (int l = 0; l < hp->n_layer && rc == 0; l++) {
        struct si__layer_state *L = &e->L[l];
        k = 0;
        ADD(e->h_bx, STARPU_RW);
        ADD(e->h_bxb, STARPU_W);
        ADD(e->h_bxb3, STARPU_W);
        for (int32_t g = 0; g < e->ng; g++) { /* the cache, in its groups' parts */
            ADD(e->ng > 1 ? L->h_k_c[g] : L->h_k, STARPU_RW);
            ADD(e->ng > 1 ? L->h_v_c[g] : L->h_v, STARPU_RW);
        }
        for (int i = 0; i < 4; i++)
            ADD(L->h_w[i], STARPU_R);
        rc = si__submit(e, &si__cl_battn, L->name_battn, l, -1, 0, h, md, k, 0);
        for (int32_t j = 0; j < L->nsl && rc == 0; j++) {
            k = 0;
            ADD(e->h_bxb, STARPU_R);
            if (!e->sparse) {
                if (e->has_gate)
                    ADD(L->h_gate_c[j], STARPU_R);
                ADD(L->h_up_c[j], STARPU_R);
            } else {
                if (e->pre_sep)
                    ADD(L->h_gate_c[j], STARPU_R);
                ADD(L->h_rec_c[j], STARPU_R);
            }
            ADD(L->h_upb_c[j], STARPU_R);
            ADD(e->h_bpart[j], STARPU_W);
            /* On CPU workers, the hot slice too: its weights are read-only, so
             * the main-memory copy stays valid beside the GPU's. */
            rc = si__submit(e, &si__cl_bffn, L->name_bffn[j], l, j, 0, h, md, k, STARPU_CPU);
        }
        for (int32_t b = 0; b < e->nd && rc == 0; b++) { /* dense: the down projection */
            k = 0;
            for (int32_t j = 0; j < L->nsl; j++)
                ADD(e->h_bpart[j], STARPU_R);
            ADD(L->h_down_c[b], STARPU_R);
            ADD(e->h_bdout[b], STARPU_W);
            rc = si__submit(e, &si__cl_bdown, L->name_bdown[b], l, b, 0, h, md, k, STARPU_CPU);
        }
        if (rc != 0)
            break;
        k = 0;
        ADD(e->h_bx, STARPU_RW);
        if (!e->sparse)
            for (int32_t b = 0; b < e->nd; b++)
                ADD(e->h_bdout[b], STARPU_R);
        else
            for (int32_t j = 0; j < L->nsl; j++)
                ADD(e->h_bpart[j], STARPU_R);
        ADD(e->h_bxb3, STARPU_R);
        rc = si__submit(e, &si__cl_bmerge, L->name_bmerge, l, -1, 0, h, md, k, 0);
    }
    if (rc == 0) {
        k = 0;
        ADD(e->h_bx, STARPU_R);
        ADD(e->h_xb, STARPU_RW);
        ADD(e->h_logits, STARPU_W);
        ADD(e->h_out, STARPU_R);
        rc = si__submit(e, &si__cl_bhead, "norm+lm_head", -1, -1, 0, h, md, k, 0);
    }
#undef ADD
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
