/* decode.c - one token's task graph: per layer, its tasks in the order of
 * the layer's maths, then the head (engine.h draws the graph, codelets.h
 * lists each task's buffers). */
#include "graph/graph.h"

#include "codelets/codelets.h"
#include "graph/runtime.h"
#include "starinfer.h"

#include <errno.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

/* See graph.h. */
int si__submit(struct si_engine *e, struct starpu_codelet *cl, const char *name, int l, int j,
               int32_t token, starpu_data_handle_t *h, enum starpu_data_access_mode *modes, int n,
               uint32_t where)
{
    struct si__task_arg *a = malloc(sizeof *a);
    if (a == NULL)
        return -ENOMEM;
    *a = (struct si__task_arg){.e = e, .l = l, .j = j, .token = token};
    struct starpu_task *t = starpu_task_create();
    t->cl = cl;
    t->cl_arg = a;
    t->cl_arg_size = sizeof *a;
    t->cl_arg_free = 1;
    t->name = name;
    t->nbuffers = n;
    if (where != 0)
        t->where = where;
    if (n > STARPU_NMAXBUFS) {
        t->dyn_handles = malloc((size_t)n * sizeof *t->dyn_handles);
        t->dyn_modes = malloc((size_t)n * sizeof *t->dyn_modes);
        if (t->dyn_handles == NULL || t->dyn_modes == NULL) {
            free(t->dyn_handles);
            free(t->dyn_modes);
            t->dyn_handles = NULL;
            t->dyn_modes = NULL;
            starpu_task_destroy(t);
            return -ENOMEM;
        }
        memcpy(t->dyn_handles, h, (size_t)n * sizeof *h);
        memcpy(t->dyn_modes, modes, (size_t)n * sizeof *modes);
    } else {
        for (int i = 0; i < n; i++) {
            t->handles[i] = h[i];
            t->modes[i] = modes[i];
        }
    }
    int rc = starpu_task_submit(t);
    if (rc != 0) {
        t->destroy = 0;
        starpu_task_destroy(t);
        return rc;
    }
    if (e->bn > 0)
        e->stats.batch_tasks++;
    else
        e->stats.tasks++;
    return 0;
}

/* The handles si__n_carried() counts for layer l (R): layer l - 1's FFN
 * output, which layer l's first tasks (or the head) add into x. */
static void add_carried(const struct si_engine *e, int l, struct si__args *a)
{
    if (si__n_carried(e, l) == 0)
        return;
    const struct si__layer_state *P = &e->L[l - 1];
    for (int32_t j = 0; j < (e->sparse ? P->nsl : e->nd); j++)
        si__add(a, e->sparse ? P->h_part_c[j] : e->h_dout[j], STARPU_R);
    if (e->m->hp.parallel_residual)
        si__add(a, e->h_xb3, STARPU_R);
}

/* x += FFN_{l-1} (carried); x += attention_l(norm(x)); ffn_in = norm(x):
 * one task, or split by kv heads (attn_L.j), Wo's row slices (attn_o_L.j)
 * and the residual (attn_out_L, unless each FFN slice does it: fuse_out). */
static int submit_attention(struct si_engine *e, int l, int32_t token)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    a.n = 0;
    if (e->na <= 1 || L->attn_gpu) {
        si__add(&a, e->h_x, STARPU_RW);
        add_carried(e, l, &a);
        si__add(&a, e->h_xb, STARPU_W);
        if (e->h_xb3 != NULL)
            si__add(&a, e->h_xb3, STARPU_W);
        for (int32_t g = 0; g < e->ng; g++) { /* the caches, in the batches' groups */
            si__add(&a, e->ng > 1 ? L->h_k_c[g] : L->h_k, STARPU_RW);
            si__add(&a, e->ng > 1 ? L->h_v_c[g] : L->h_v, STARPU_RW);
        }
        for (int i = 0; i < 4; i++)
            si__add(&a, L->h_w[i], STARPU_R);
        if (!L->attn_gpu)
            return si__run(e, &si__cl_attn, L->name_attn, l, -1, token, &a, STARPU_CPU);
        /* on the GPU (a CPU worker with hot_on_cpu): its vectors, scratch */
        si__add(&a, L->h_aux, STARPU_R);
        si__add(&a, e->h_ascratch, STARPU_SCRATCH);
        return si__run(e, &si__cl_attn, L->name_attn, l, -1, token, &a,
                       e->cuda_hot ? STARPU_CUDA : STARPU_CPU);
    }
    int rc = 0;
    for (int32_t j = 0; j < e->ng && rc == 0; j++) {
        a.n = 0;
        si__add(&a, e->h_x, STARPU_R);
        add_carried(e, l, &a);
        for (int i = 0; i < 3; i++)
            si__add(&a, L->h_w[i], STARPU_R);
        si__add(&a, e->ng > 1 ? L->h_k_c[j] : L->h_k, STARPU_RW);
        si__add(&a, e->ng > 1 ? L->h_v_c[j] : L->h_v, STARPU_RW);
        si__add(&a, e->ng > 1 ? e->h_att_c[j] : e->h_att, STARPU_W);
        if (j == 0)
            si__add(&a, e->h_x2, STARPU_W);
        rc = si__run(e, &si__cl_agrp, L->name_agrp[j], l, j, token, &a, 0);
    }
    for (int32_t j = 0; j < e->na && rc == 0; j++) {
        a.n = 0;
        for (int32_t g = 0; g < e->ng; g++)
            si__add(&a, e->ng > 1 ? e->h_att_c[g] : e->h_att, STARPU_R);
        si__add(&a, L->h_w[3], STARPU_R);
        si__add(&a, e->h_o[j], STARPU_W);
        rc = si__run(e, &si__cl_ao, L->name_ao[j], l, j, token, &a, 0);
    }
    if (rc == 0 && !e->fuse_out) {
        a.n = 0;
        si__add(&a, e->h_x2, STARPU_R);
        for (int32_t j = 0; j < e->na; j++)
            si__add(&a, e->h_o[j], STARPU_R);
        si__add(&a, e->h_x, STARPU_W);
        si__add(&a, e->h_xb, STARPU_W);
        if (e->h_xb3 != NULL)
            si__add(&a, e->h_xb3, STARPU_W);
        rc = si__run(e, &si__cl_aout, L->name_aout, l, -1, token, &a, 0);
    }
    return rc;
}

/* idx_L.j = the positions of slice j that the predictor says fire, from
 * its input (model.h's si_pred_input): the FFN's, or x, the residual the
 * FFN's norm read (after the attention tasks).  A lookahead predictor
 * reads the layer's input, x and the carried FFN output, as the attention
 * tasks do: submitted before them, it runs beside them. */
static int submit_predictor(struct si_engine *e, int l, int32_t token)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    a.n = 0;
    if (e->m->pred_input == SI_PRED_LAYER) {
        si__add(&a, e->h_x, STARPU_R);
        add_carried(e, l, &a);
    } else {
        si__add(&a, e->m->pred_input == SI_PRED_RESIDUAL ? e->h_x : e->h_xb, STARPU_R);
    }
    si__add(&a, L->h_fc1, STARPU_R);
    si__add(&a, L->h_fc2, STARPU_R);
    for (int32_t j = 0; j < L->nsl; j++)
        si__add(&a, L->h_idx_c[j], STARPU_W);
    return si__run(e, &si__cl_pred, L->name_pred, l, -1, token, &a, 0);
}

/* The flash tier: the cold slices' masks (gate mode: from the resident
 * gating rows), then the layer's load of their records into its cache,
 * before any ffn_cold task reads it. */
static int submit_loads(struct si_engine *e, int l, int32_t token)
{
    struct si__layer_state *L = &e->L[l];
    const int32_t first_cold = L->hot ? 1 : 0;
    struct si__args a;
    a.n = 0;
    int rc = 0;
    for (int32_t j = first_cold; j < L->nsl && rc == 0 && e->p.mode == SI_SPARSITY_GATE; j++) {
        a.n = 0;
        si__add(&a, e->h_xb, STARPU_R);
        si__add(&a, L->h_gate_c[j], STARPU_R);
        si__add(&a, L->h_upb_c[j], STARPU_R);
        si__add(&a, L->h_idx_c[j], STARPU_W);
        rc = si__run(e, &si__cl_gmask, L->name_gmask[j], l, j, token, &a, STARPU_CPU);
    }
    if (rc != 0)
        return rc;
    a.n = 0;
    for (int32_t j = first_cold; j < L->nsl; j++)
        si__add(&a, L->h_idx_c[j], STARPU_R);
    si__add(&a, L->h_cache, STARPU_RW);
    si__add(&a, e->h_spill, STARPU_RW);
    return si__run(e, &si__cl_load, L->name_load, l, -1, token, &a, STARPU_CPU);
}

/* part_L.j = FFN slice j (ffn_in): the hot slice on the GPU (or a CPU
 * worker), the cold ones on CPU workers, from the flash cache with a
 * flash tier. */
static int submit_ffn(struct si_engine *e, int l, int32_t token)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    int rc = 0;
    for (int32_t j = 0; j < L->nsl && rc == 0; j++) {
        const bool hot = si__is_hot(e, l, j), gpu = hot && e->cuda_hot;
        a.n = 0;
        if (e->flash && !hot) {
            si__add(&a, e->h_xb, STARPU_R);
            si__add(&a, L->h_cache, STARPU_R);
            si__add(&a, L->h_idx_c[j], STARPU_R);
            si__add(&a, e->h_spill, STARPU_R);
            si__add(&a, L->h_part_c[j], STARPU_W);
            rc = si__run(e, &si__cl_flash, L->name_ffn[j], l, j, token, &a, STARPU_CPU);
            continue;
        }
        if (e->fuse_out) { /* the slice computes the FFN input itself */
            si__add(&a, e->h_x2, STARPU_R);
            for (int32_t k = 0; k < e->na; k++)
                si__add(&a, e->h_o[k], STARPU_R);
        } else {
            si__add(&a, e->h_xb, STARPU_R);
            if (si__ffn_reads_residual(e)) /* the fused predictor's input */
                si__add(&a, e->h_x, STARPU_R);
        }
        si__add_slice_weights(e, L, j, &a);
        if (e->p.mode == SI_SPARSITY_PREDICTOR && e->fuse_pred) {
            si__add(&a, L->h_fc1, STARPU_R);
            si__add(&a, L->h_fc2, STARPU_R);
        } else if (e->p.mode == SI_SPARSITY_PREDICTOR) {
            si__add(&a, L->h_idx_c[j], STARPU_R);
        }
        if (e->p.redux)
            si__add(&a, L->h_y, STARPU_REDUX);
        else
            si__add(&a, L->h_part_c[j], STARPU_W);
        if (gpu) {
            si__add(&a, e->h_iota, STARPU_R);
            si__add(&a, e->h_hscratch, STARPU_SCRATCH);
        }
        if (e->fuse_out && j == 0) { /* the residual for the next layer */
            si__add(&a, e->h_x, STARPU_W);
            if (e->h_xb3 != NULL)
                si__add(&a, e->h_xb3, STARPU_W);
        }
        rc = si__run(e, hot ? &si__cl_hot : &si__cl_cold, L->name_ffn[j], l, j, token, &a,
                     gpu ? STARPU_CUDA : STARPU_CPU);
    }
    return rc;
}

/* Dense mode: down_k = rows k of W_down . h, h the slices' activations. */
static int submit_down(struct si_engine *e, int l, int32_t token)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    int rc = 0;
    for (int32_t k = 0; k < e->nd && rc == 0; k++) {
        a.n = 0;
        for (int32_t j = 0; j < L->nsl; j++)
            si__add(&a, L->h_part_c[j], STARPU_R);
        si__add(&a, L->h_down_c[k], STARPU_R);
        si__add(&a, e->h_dout[k], STARPU_W);
        rc = si__run(e, &si__cl_down, L->name_down[k], l, k, token, &a, STARPU_CPU);
    }
    return rc;
}

/* Redux mode: x += y_L, the slices' outputs that StarPU reduced. */
static int submit_merge(struct si_engine *e, int l, int32_t token)
{
    struct si__layer_state *L = &e->L[l];
    struct si__args a;
    a.n = 0;
    si__add(&a, e->h_x, STARPU_RW);
    si__add(&a, L->h_y, STARPU_RW);
    return si__run(e, &si__cl_merge, L->name_merge, l, -1, token, &a, 0);
}

/*
 * Layer l of one token.  Without redux its FFN output is not merged here:
 * the next layer's attention tasks (or the head) add it into x.
 */
static int submit_layer(struct si_engine *e, int l, int32_t token)
{
    const struct si__layer_state *L = &e->L[l];
    const bool pred = e->p.mode == SI_SPARSITY_PREDICTOR && !e->fuse_pred,
               ahead = pred && e->m->pred_input == SI_PRED_LAYER,
               loads = e->flash && L->nsl > (L->hot ? 1 : 0);
    int rc = 0;
    if (ahead) { /* the predictor and the flash tier's reads beside the attention */
        rc = submit_predictor(e, l, token);
        if (rc == 0 && loads)
            rc = submit_loads(e, l, token);
    }
    if (rc == 0)
        rc = submit_attention(e, l, token);
    if (rc == 0 && pred && !ahead)
        rc = submit_predictor(e, l, token);
    if (rc == 0 && loads && !ahead)
        rc = submit_loads(e, l, token);
    if (rc == 0)
        rc = submit_ffn(e, l, token);
    if (rc == 0 && !e->sparse)
        rc = submit_down(e, l, token);
    if (rc == 0 && e->p.redux)
        rc = submit_merge(e, l, token);
    return rc;
}

/* logits = lm_head(norm(x + FFN_last)): one task, or row slices writing
 * children of the logits (n_past moves on in eval, as si_ref_end would). */
static int submit_head(struct si_engine *e, int32_t token)
{
    const int nl = e->m->hp.n_layer;
    struct si__args a;
    a.n = 0;
    if (e->na <= 1) {
        si__add(&a, e->h_x, STARPU_RW);
        add_carried(e, nl, &a);
        si__add(&a, e->h_xb, STARPU_RW);
        si__add(&a, e->h_logits, STARPU_W);
        si__add(&a, e->h_out, STARPU_R);
        return si__run(e, &si__cl_head, "norm+lm_head", -1, -1, token, &a, 0);
    }
    int rc = 0;
    starpu_data_partition_submit(e->h_logits, (unsigned)e->na, e->h_logits_c);
    for (int32_t j = 0; j < e->na && rc == 0; j++) {
        a.n = 0;
        si__add(&a, e->h_x, STARPU_R);
        add_carried(e, nl, &a);
        si__add(&a, e->h_out, STARPU_R);
        si__add(&a, e->h_logits_c[j], STARPU_W);
        rc = si__run(e, &si__cl_head_rows, e->name_head[j], -1, j, token, &a, 0);
    }
    starpu_data_unpartition_submit(e->h_logits, (unsigned)e->na, e->h_logits_c, STARPU_MAIN_RAM);
    return rc;
}

int si_engine_eval(struct si_engine *e, int32_t token)
{
    const struct si_hparams *hp = &e->m->hp;
    if (token < 0 || token >= hp->n_vocab)
        return SI_E_INVALID;
    if (e->ref->n_past >= e->ref->p.n_ctx)
        return SI_E_BUDGET;
    if (si_runtime_has_caller_worker() && !si_runtime_is_caller_worker())
        return SI_E_RUNTIME; /* its worker would not run: see si_runtime_start */
    const double t0 = si__now();
    e->err_msg[0] = '\0';

    struct si__args a;
    a.n = 0;
    int rc;
    if (e->l0 == 0) {
        si__add(&a, e->h_x, STARPU_W);
        rc = si__run(e, &si__cl_embed, "embed", -1, -1, token, &a, 0);
    } else { /* a pipeline's later rank: x from the rank before (graph/pipe.c) */
        rc = si__pipe_recv_x(e) == SI_OK ? 0 : -1;
    }
    for (int l = e->l0; l < e->l1 && rc == 0; l++)
        rc = submit_layer(e, l, token);
    const bool last = e->l1 == hp->n_layer;
    if (rc == 0 && last) {
        rc = submit_head(e, token);
    } else if (rc == 0) { /* x whole for the next rank */
        a.n = 0;
        si__add(&a, e->h_x, STARPU_RW);
        add_carried(e, e->l1, &a);
        rc = si__run(e, &si__cl_residual, "residual", e->l1, -1, token, &a, 0);
        if (rc == 0)
            rc = si__pipe_send_x(e) == SI_OK ? 0 : -1;
    }
    if (rc == 0)
        rc = si__pipe_logits(e) == SI_OK ? 0 : -1;
    /* Wait for this token's tasks: the logits are ready when readable (the
     * caller's worker, if it has one, runs tasks meanwhile); on a middle
     * rank of a pipeline, x once its last layer is added in. */
    starpu_data_handle_t done = last || e->rank == 0 ? e->h_logits : e->h_x;
    si_runtime_acquire(done, STARPU_R);
    starpu_data_release(done);
    if (rc == 0 && (e->na > 1 || !last)) /* else the head's si_ref_end moved it */
        e->ref->n_past++;
    if (rc != 0) {
        si_runtime_wait_all();
        return SI_E_RUNTIME;
    }
    if (e->flash_err != SI_OK) { /* a load failed: this token's output is wrong */
        rc = e->flash_err;
        e->flash_err = SI_OK;
        return rc;
    }
    /* Activation counts are read after the merge, which read the slices'
     * outputs: every slice task of this token has finished. */
    e->stats.tokens++;
    e->stats.seconds += si__now() - t0;
    for (int l = 0; l < hp->n_layer; l++) {
        const struct si__layer_state *L = &e->L[l];
        for (int32_t j = 0; j < L->nsl; j++) {
            int64_t a = L->active[j];
            if (a < 0) /* the GPU does not count: charge the whole slice */
                a = L->s0[j + 1] - L->s0[j];
            if (si__is_hot(e, l, j))
                e->stats.neurons_hot += a;
            else
                e->stats.neurons_cold += a;
            if (si__is_hot(e, l, j) && e->cuda_hot)
                e->stats.weight_bytes_gpu += L->rd[j];
            else
                e->stats.weight_bytes_cpu += L->rd[j];
        }
    }
    e->stats.neurons_total += (int64_t)(e->l1 - e->l0) * hp->n_ff; /* this rank's layers */
    e->stats.weight_bytes_cpu += e->token_bytes_fixed - e->attn_gpu_bytes -
                                 __atomic_exchange_n(&e->in_saved, 0, __ATOMIC_RELAXED);
    e->stats.weight_bytes_gpu += e->attn_gpu_bytes;
    if (e->cuda_hot && e->cuda_node >= 0) {
        /* What StarPU really allocated on the GPU (its hot slices stay; the
         * activations it moved may stay cached): never above the budget. */
        const int64_t used = (int64_t)starpu_memory_get_used((unsigned)e->cuda_node) - e->gpu_base;
        if (used > e->stats.gpu_allocated_peak)
            e->stats.gpu_allocated_peak = used;
        if (used > e->stats.gpu_budget) {
            snprintf(e->err_msg, sizeof e->err_msg,
                     "StarPU holds %.1f MiB on the GPU, over the VRAM budget of %.1f MiB (the "
                     "engine planned %.1f MiB)",
                     (double)used / 1048576.0, (double)e->stats.gpu_budget / 1048576.0,
                     (double)e->stats.gpu_accounted / 1048576.0);
            return SI_E_BUDGET;
        }
    }
    return SI_OK;
}
