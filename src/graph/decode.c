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

/* x += FFN_{l-1} (carried); x += attention_l(norm(x)); ffn_in = norm(x):
 * one task, or split by kv heads (attn_L.j), Wo's row slices (attn_o_L.j,
 * unless each group multiplies its columns of Wo: fuse_wo) and the residual
 * (attn_out_L, unless each FFN slice does it: fuse_out). */
static int submit_attention(struct si_engine *e, int l, int32_t token)
{
    if (e->dec.na <= 1 || e->L[l].attn_gpu)
        return si__submit_attn(e, l, token);
    return si__submit_attn_split(e, l, token);
}

/* The flash tier: the cold slices' masks (gate mode: from the resident
 * gating rows), then the layer's load of their records into its cache,
 * before any ffn_cold task reads it. */
static int submit_loads(struct si_engine *e, int l, int32_t token)
{
    const struct si__layer_state *L = &e->L[l];
    int rc = 0;
    for (int32_t j = L->hot ? 1 : 0; j < L->nsl && rc == 0 && e->p.mode == SI_SPARSITY_GATE; j++)
        rc = si__submit_gmask(e, l, j, token);
    return rc != 0 ? rc : si__submit_load(e, l, token);
}

/* part_L.j = FFN slice j (ffn_in): the hot slice on the GPU (or a CPU
 * worker), the cold ones on CPU workers, from the flash cache with a
 * flash tier; dense mode, then the down projection's blocks. */
static int submit_ffn(struct si_engine *e, int l, int32_t token)
{
    const struct si__layer_state *L = &e->L[l];
    int rc = 0;
    for (int32_t j = 0; j < L->nsl && rc == 0; j++)
        rc = e->fl.on && !si__is_hot(e, l, j) ? si__submit_flash(e, l, j, token)
                                              : si__submit_ffn(e, l, j, token);
    if (e->lay.fuse_out) /* the slices read Wo's product whole */
        si__split_o(e);
    if (!e->lay.sparse) {
        /* every down block reads every slice's activations: joined
         * between them where it pays (si__down_joins) */
        const bool join = si__down_joins(e, l) && !e->ip.on;
        if (join)
            starpu_data_unpartition_submit(L->h_part, (unsigned)L->nsl, L->h_part_c,
                                           STARPU_MAIN_RAM);
        for (int32_t k = 0; k < e->down.nd && rc == 0; k++)
            rc = si__submit_down(e, l, k, token);
        if (join)
            starpu_data_partition_submit(L->h_part, (unsigned)L->nsl, L->h_part_c);
    }
    return rc;
}

/*
 * Layer l of one token.  Without redux its FFN output is not merged here:
 * the next layer's attention tasks (or the head) add it into x.
 */
static int submit_layer(struct si_engine *e, int l, int32_t token)
{
    const struct si__layer_state *L = &e->L[l];
    const bool pred = e->p.mode == SI_SPARSITY_PREDICTOR && !e->lay.fuse_pred,
               ahead = pred && e->m->pred_input == SI_PRED_LAYER,
               loads = e->fl.on && L->nsl > (L->hot ? 1 : 0);
    int rc = 0;
    if (ahead) { /* the predictor and the flash tier's reads beside the attention */
        rc = si__submit_pred(e, l, token);
        if (rc == 0 && loads)
            rc = submit_loads(e, l, token);
    }
    if (rc == 0)
        rc = submit_attention(e, l, token);
    si__split_carried(e); /* layer l - 1's output: its readers are in */
    if (rc == 0 && pred && !ahead)
        rc = si__submit_pred(e, l, token);
    if (rc == 0 && loads && !ahead)
        rc = submit_loads(e, l, token);
    if (rc == 0)
        rc = submit_ffn(e, l, token);
    if (rc == 0 && e->p.redux)
        rc = si__submit_merge(e, l, token);
    if (rc == 0)
        si__join_carried(e, l); /* for layer l + 1's first tasks, or the head */
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
    const double t0 = si__now(), c0 = si__thread_cpu();
    e->err_msg[0] = '\0';
    if (e->lay.inplace) {
        /* (a graph of buffers before it has ended with its logits: what
         * else it left running, the in-place tasks would not wait for) */
        if (starpu_task_nsubmitted() > 0)
            si_runtime_wait_all();
        si__inplace_begin(e);
    }

    int rc;
    if (e->pipe.l0 == 0) {
        rc = si__submit_embed(e, token);
    } else { /* a pipeline's later rank: x from the rank before (graph/pipe.c) */
        rc = si__pipe_recv_x(e) == SI_OK ? 0 : -1;
    }
    for (int l = e->pipe.l0; l < e->pipe.l1 && rc == 0; l++)
        rc = submit_layer(e, l, token);
    const bool last = e->pipe.l1 == hp->n_layer;
    if (rc == 0 && last) {
        rc = si__submit_head(e, token); /* logits = lm_head(norm(x + FFN_last)) */
    } else if (rc == 0) {               /* x whole for the next rank */
        rc = si__submit_residual(e, e->pipe.l1, token);
        si__split_carried(e);
        if (rc == 0)
            rc = si__pipe_send_x(e) == SI_OK ? 0 : -1;
    }
    si__split_carried(e); /* (after the head; or left joined by a failure) */
    if (e->ip.on) {
        const int rs = si__inplace_submit(e);
        rc = rc != 0 ? rc : rs;
    }
    const double c1 = si__thread_cpu(); /* (inside the wall interval) */
    e->stats.submit_seconds += si__now() - t0;
    e->stats.submit_cpu_seconds += c1 - c0;
    if (rc == 0)
        rc = si__pipe_logits(e) == SI_OK ? 0 : -1;
    if (e->ip.on) { /* its last join: every task of the token */
        if (e->ip.last != NULL) {
            const int rw = si_runtime_wait_task(e->ip.last, &e->ip.done) == SI_OK ? 0 : -1;
            rc = rc != 0 ? rc : rw;
            starpu_task_destroy(e->ip.last);
            e->ip.last = NULL;
        }
        e->ip.on = false;
    } else {
        /* Wait for this token's tasks: the logits are ready when readable
         * (the caller's worker, if it has one, runs tasks meanwhile); on a
         * middle rank of a pipeline, x once its last layer is added in. */
        starpu_data_handle_t done = last || e->pipe.rank == 0 ? e->dec.h_logits : e->dec.h_x;
        si_runtime_acquire(done, STARPU_R);
        starpu_data_release(done);
    }
    if (rc == 0 && (e->dec.na > 1 || !last)) /* else the head's si_ref_end moved it */
        e->ref->n_past++;
    if (rc != 0) {
        si_runtime_wait_all();
        return SI_E_RUNTIME;
    }
    if (e->fl.err != SI_OK) { /* a load failed: this token's output is wrong */
        rc = e->fl.err;
        e->fl.err = SI_OK;
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
            if (si__is_hot(e, l, j) && e->gpu.cuda_hot)
                e->stats.weight_bytes_gpu += L->rd[j];
            else
                e->stats.weight_bytes_cpu += L->rd[j];
        }
    }
    e->stats.neurons_total +=
        (int64_t)(e->pipe.l1 - e->pipe.l0) * hp->n_ff; /* this rank's layers */
    e->stats.weight_bytes_cpu += e->token_bytes_fixed - e->gpu.attn_gpu_bytes -
                                 __atomic_exchange_n(&e->in_saved, 0, __ATOMIC_RELAXED);
    e->stats.weight_bytes_gpu += e->gpu.attn_gpu_bytes;
    if (e->gpu.cuda_hot && e->gpu.cuda_node >= 0) {
        /* What StarPU really allocated on the GPU (its hot slices stay; the
         * activations it moved may stay cached): never above the budget. */
        const int64_t used =
            (int64_t)starpu_memory_get_used((unsigned)e->gpu.cuda_node) - e->gpu.gpu_base;
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
