/* engine.c - the engine's state: init, free and accessors (see engine.h). */
#include "graph/engine.h"

#include "codelets/ops.h"
#include "config.h"
#include "flash/tier.h"
#include "graph/graph.h"
#include "graph/runtime.h"
#include "internal.h"
#include "model/act.h"
#include "model/kernels.h"
#include "model/line_alloc.h"
#include "model/pack8.h"
#include "model/quants.h"
#include "model/types.h"
#include "placement/plan.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <inttypes.h>
#include <starpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
void openblas_set_num_threads(int n); /* OpenBLAS's cblas.h; not every CBLAS has it */
#endif

#define ATTN_SPLIT_MIN_BYTES (256 << 10) /* see attn_split */

const char *si_task_kind_name(enum si_task_kind k)
{
    static const char *const names[SI_TASK_KIND_COUNT] = {
        "embed",     "attn",         "attn_proj",  "pred",          "ffn_hot",     "ffn_cold",
        "merge",     "norm+lm_head", "load",       "ffn_down",      "embed_batch", "attn_batch",
        "ffn_batch", "merge_batch",  "head_batch", "ffn_down_batch"};
    return (unsigned)k < SI_TASK_KIND_COUNT ? names[k] : "?";
}

const char *si_sparsity_name(enum si_sparsity m)
{
    return m == SI_SPARSITY_GATE ? "gate" : m == SI_SPARSITY_PREDICTOR ? "predictor" : "dense";
}

struct si_engine_params si_engine_default_params(void)
{
    return (struct si_engine_params){.ref = si_ref_default_params(),
                                     .mode = SI_SPARSITY_DENSE,
                                     .gate_threshold = 0.0f,
                                     .n_slices = 0,
                                     .vram_budget = 0,
                                     .profile = NULL,
                                     .hot_on_cpu = false,
                                     .redux = false,
                                     .n_batch = 0,
                                     .attn_split = 0,
                                     .prefill = SI_PREFILL_AUTO,
                                     .flash_window = 5};
}

static double mib(int64_t b)
{
    return (double)b / 1048576.0;
}

static int alloc_layer(struct si_engine *e, struct si__layer_state *L, int l)
{
    const struct si_hparams *hp = &e->m->hp;
    const size_t ff = (size_t)hp->n_ff, slots = (size_t)e->lay.n_slices + 2;
    si__ffn_fmt_of(e, l, &L->f);
    L->s0 = calloc(slots, sizeof *L->s0);
    L->pre_pk = calloc(slots, sizeof *L->pre_pk);
    L->rows = calloc(slots, sizeof *L->rows);
    L->perm = calloc(ff, sizeof *L->perm);
    L->active = calloc(slots, sizeof *L->active);
    L->rd = calloc(slots, sizeof *L->rd);
    L->len_n = calloc(slots, sizeof *L->len_n);
    L->len_p = calloc(slots, sizeof *L->len_p);
    L->name_ffn = calloc(slots, sizeof *L->name_ffn);
    L->name_bffn = calloc(slots, sizeof *L->name_bffn);
    L->h_gate_c = calloc(slots, sizeof(starpu_data_handle_t));
    L->h_up_c = calloc(slots, sizeof(starpu_data_handle_t));
    L->h_down_c = calloc(slots, sizeof(starpu_data_handle_t));
    L->h_rec_c = calloc(slots, sizeof(starpu_data_handle_t));
    L->h_upb_c = calloc(slots, sizeof(starpu_data_handle_t));
    L->h_idx_c = calloc(slots, sizeof(starpu_data_handle_t));
    L->h_part_c = calloc(slots, sizeof(starpu_data_handle_t));
    L->part = calloc(e->lay.sparse ? slots * (size_t)hp->n_embd : ff, sizeof(float));
    L->y = calloc((size_t)hp->n_embd, sizeof(float));
    if (!L->s0 || !L->pre_pk || !L->rows || !L->perm || !L->active || !L->rd || !L->len_n || !L->len_p ||
        !L->name_ffn || !L->name_bffn || !L->h_gate_c || !L->h_up_c || !L->h_down_c ||
        !L->h_rec_c || !L->h_upb_c || !L->h_idx_c || !L->h_part_c || !L->part || !L->y)
        return SI_E_NOMEM;
    if (!e->lay.sparse) {
        L->name_down = calloc((size_t)e->down.nd, sizeof *L->name_down);
        L->name_bdown = calloc((size_t)e->down.nd, sizeof *L->name_bdown);
        if (!L->name_down || !L->name_bdown)
            return SI_E_NOMEM;
    }
    if (e->lay.sparse) {
        /* flash: only the hot records, allocated once the plan is known */
        L->rec = e->fl.on ? NULL : si__weights_alloc(ff * L->f.rec_bytes);
        L->up_b = malloc(ff * sizeof(float));
        if ((!e->fl.on && !L->rec) || !L->up_b)
            return SI_E_NOMEM;
        if (e->lay.pre_sep && (L->pre = si__weights_alloc(ff * L->f.gu_row)) == NULL)
            return SI_E_NOMEM;
    }
    if (e->p.mode == SI_SPARSITY_PREDICTOR) {
        L->fc2p = malloc(e->m->w.layers[l].fc2.nbytes);
        L->idx = malloc(ff * sizeof(int32_t));
        if (!L->fc2p || !L->idx)
            return SI_E_NOMEM;
    }
    if (e->fl.on) {
        if (e->p.mode == SI_SPARSITY_GATE) {
            L->idx = malloc(ff * sizeof(int32_t));
            L->gact = malloc(ff * sizeof(float));
            L->h_gact_c = calloc(slots, sizeof(starpu_data_handle_t));
            L->name_gmask = calloc(slots, sizeof *L->name_gmask);
            if (!L->idx || !L->gact || !L->h_gact_c || !L->name_gmask)
                return SI_E_NOMEM;
        }
    }
    return SI_OK;
}

/* Host bytes of layer l's per-layer arrays beside the flash cache. */
static int64_t flash_layer_bytes(const struct si_engine *e, int l)
{
    const struct si__layer_state *L = &e->L[l];
    const int64_t ff = e->m->hp.n_ff, d = e->m->hp.n_embd;
    int64_t b = L->n_hot * (int64_t)L->f.rec_bytes; /* hot records */
    b += si_flash_tier_layer_bytes(ff);           /* the tier's load arrays and cache bookkeeping */
    b += ff * (int64_t)(sizeof(float) + sizeof(int32_t)); /* up_b, perm */
    if (e->lay.pre_sep)
        b += ff * (int64_t)L->f.gu_row; /* gating rows */
    if (e->p.mode == SI_SPARSITY_PREDICTOR)
        b += (int64_t)e->m->w.layers[l].fc2.nbytes; /* fc2 by position */
    if (L->idx != NULL)
        b += ff * (int64_t)sizeof(int32_t);
    if (L->gact != NULL)
        b += ff * (int64_t)sizeof(float);
    b += (e->lay.n_slices + 2) * d * (int64_t)sizeof(float); /* partial outputs */
    return b;
}

static void free_layer(struct si__layer_state *L)
{
    free(L->s0);
    free(L->pre_pk);
    free(L->rows);
    free(L->perm);
    free(L->active);
    free(L->rd);
    free(L->len_n);
    free(L->len_p);
    free(L->name_down);
    free(L->name_bdown);
    free(L->name_ffn);
    free(L->name_bffn);
    free(L->name_agrp);
    free(L->name_bagrp);
    free(L->name_bakv);
    free(L->name_bacore);
    free(L->name_bao);
    free(L->h_k_c);
    free(L->h_v_c);
    free(L->kv_cols);
    free(L->name_ao);
    free(L->name_apos);
    free(L->h_gate_c);
    free(L->h_up_c);
    free(L->h_down_c);
    free(L->h_rec_c);
    free(L->h_upb_c);
    free(L->h_idx_c);
    free(L->h_part_c);
    free(L->part);
    free(L->y);
    free(L->rec);
    free(L->pre);
    free(L->up_b);
    free(L->fc2p);
    free(L->aux);
    free(L->idx);
    free(L->gact);
    free(L->h_gact_c);
    free(L->name_gmask);
}

/* What the checks stage learns before the engine exists: the workers, whether
 * dense mode runs on neuron records, and this rank's layers. */
struct init_env {
    unsigned ncpu, ncuda;
    bool dense_records;
    int32_t l0, l1;
    int rank, nranks;
};

/*
 * Stage checks: StarPU running with a CPU worker, the parameters against the
 * model (layout.c's si__check_params), the pipeline's MPI ranks.  It decides
 * the mode as run (dense mode on a file without a dense layout becomes gate
 * mode at threshold 0, in p) and this rank's layers, into c; the engine does
 * not exist yet, so a refusal leaves nothing to free.
 */
static int init_checks(const struct si_model *m, struct si_engine_params *p, struct init_env *c,
                       char *err, size_t err_size)
{
    if (!starpu_is_initialized())
        return si__errf(err, err_size, SI_E_RUNTIME, "StarPU is not started");
    const struct si_hparams *hp = &m->hp;
    c->ncpu = starpu_worker_get_count_by_type(STARPU_CPU_WORKER);
    c->ncuda = starpu_worker_get_count_by_type(STARPU_CUDA_WORKER);
    if (c->ncpu == 0)
        return si__errf(err, err_size, SI_E_NO_DEVICE,
                        "the engine needs a CPU worker (STARPU_NCPU is 0)");
    /* A file whose down projection is ffn_down_t alone (PowerInfer's layout)
     * has no dense layout: dense mode runs on its neuron records as gate
     * mode does, each neuron whose activation is not 0 (no threshold), which
     * gives the dense values in the reference's down_t arithmetic (a neuron
     * at 0 adds nothing). */
    c->dense_records = p->mode == SI_SPARSITY_DENSE && si_model_down_t_only(m);
    if (c->dense_records) {
        p->mode = SI_SPARSITY_GATE;
        p->gate_threshold = 0.0f;
    }
    int rc = si__check_params(m, p, c->ncuda, err, err_size);
    if (rc != SI_OK)
        return rc;
    c->l0 = 0;
    c->l1 = hp->n_layer;
    c->rank = p->pipe ? si_runtime_mpi_rank() : 0;
    c->nranks = p->pipe ? si_runtime_mpi_size() : 1;
    if (p->pipe && !si_runtime_mpi())
        return si__errf(
            err, err_size, SI_E_INVALID,
            "a pipeline across MPI ranks needs StarPU-MPI running (si_runtime_set_mpi)");
    if (p->pipe && si_engine_pipe_range(m, c->rank, c->nranks, &c->l0, &c->l1) != SI_OK)
        return si__errf(err, err_size, SI_E_INVALID,
                        "%d MPI ranks for a model of %d layers: at most one rank a layer",
                        c->nranks, hp->n_layer);
    return SI_OK;
}

/* Attention's split (init_layout): na tasks for decoding's products, ng
 * kv-head groups for its core and a batch's (n_batch set). */
static void attn_split(struct si_engine *e, unsigned ncpu)
{
    const struct si_hparams *hp = &e->m->hp;
    /* Attention's products split over the workers when they weigh enough
     * to repay the extra tasks (docs/measurements.md). */
    const struct si_layer *W = &e->m->w.layers[0];
    const size_t bytes = W->wq.nbytes + W->wk.nbytes + W->wv.nbytes + W->wo.nbytes;
    int32_t na = e->p.attn_split > 0             ? e->p.attn_split
                 : bytes >= ATTN_SPLIT_MIN_BYTES ? (int32_t)ncpu
                                                 : 1;
    if (na > hp->n_embd / e->lay.t_unit) /* Wo's column ranges on the copies' blocks */
        na = (int32_t)(hp->n_embd / e->lay.t_unit);
    if (na > SI__MAX_SLICES)
        na = SI__MAX_SLICES;
    e->dec.na = na > 1 ? na : 1;
    /* attn_L.j tasks: whole kv heads each (their query heads with them);
     * a batch's attention goes by kv-head groups too (attn_batch_L.j),
     * one per CPU worker when decoding does not split it */
    const int32_t gw = e->dec.na > 1 ? e->dec.na : e->bat.n_batch > 1 ? (int32_t)ncpu : 1;
    e->dec.ng = gw < hp->n_head_kv ? gw : hp->n_head_kv;
    /* a batch's attn_o_batch_L.j tasks take every group's output for
     * every worker's token range as buffers: ng * ncpu of them at most */
    if ((int64_t)e->dec.ng * (int64_t)ncpu > SI__MAX_SLICES)
        e->dec.ng = (int32_t)(SI__MAX_SLICES / ncpu > 1 ? SI__MAX_SLICES / ncpu : 1);
    if (hp->head_dim % e->lay.t_unit != 0) /* kv heads' columns off the copies' blocks */
        e->dec.ng = 1;
}

/*
 * Stage layout: the engine's shape.  It copies the parameters and the checks'
 * findings into e, takes the mode's FFN layout (layout.c's si__layout_of), the
 * bytes a token reads besides its FFN neurons, the CUDA node, and splits the
 * work: n_slices FFN slices, dense mode's nd blocks of the down projection
 * (their bounds dn and the block arrays, the only memory this stage takes;
 * redux dropped there), n_batch tokens a batch, the attention's na tasks and
 * ng kv-head groups (attn_split); then OpenBLAS's threads.  The buffers those
 * sizes ask for are the next stage's; which neurons go where, the plan's; the
 * fuse policy waits for the plan too (si__fuse_of).
 */
static int init_layout(struct si_engine *e, const struct si_model *m,
                       const struct si_engine_params *p, const struct init_env *c, char *err,
                       size_t err_size)
{
    const struct si_hparams *hp = &m->hp;
    e->m = m;
    e->w = &m->w;
    e->p = *p;
    e->lay.dense_records = c->dense_records;
    e->pipe.l0 = c->l0;
    e->pipe.l1 = c->l1;
    e->pipe.rank = c->rank;
    e->pipe.nranks = c->nranks;
    e->fl.on = p->flash != NULL;
    si__layout_of(m, p->mode, e);
    int64_t ffn_bytes;
    /* this rank's layers (all in one process) */
    e->token_bytes_fixed = si_model_range_bytes(m, e->pipe.l0, e->pipe.l1, e->pipe.rank == 0,
                                                e->pipe.rank == e->pipe.nranks - 1, &ffn_bytes) -
                           ffn_bytes;
    for (int32_t l = e->pipe.l0; l < e->pipe.l1; l++) {
        const struct si_layer *W = &m->w.layers[l];
        if (p->mode == SI_SPARSITY_PREDICTOR)
            e->token_bytes_fixed += (int64_t)(W->fc1.nbytes + W->fc2.nbytes);
        else if (p->mode == SI_SPARSITY_DENSE) /* the ffn_down_L.k tasks read all of it */
            e->token_bytes_fixed += (int64_t)W->ffn_down.nbytes;
    }
    e->gpu.cuda_node = -1;
    e->gpu.gpu_base = -1;
#ifdef SI_USE_CUDA
    e->gpu.cuda_hot = c->ncuda > 0 && !p->hot_on_cpu;
    if (e->gpu.cuda_hot) {
        int wid = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
        e->gpu.cuda_node = (int)starpu_worker_get_memory_node((unsigned)wid);
        e->gpu.gpu_base = (int64_t)starpu_memory_get_used((unsigned)e->gpu.cuda_node);
    }
#endif
    int32_t ns = p->n_slices > 0 ? p->n_slices : (int32_t)c->ncpu; /* see docs/measurements.md */
    e->lay.n_slices = ns;
    if (!e->lay.sparse) {
        /* The down projection in as many blocks of output rows as there
         * are cold slices; nothing for redux to add. */
        e->p.redux = false;
        const int64_t nd_max = hp->n_embd / e->lay.t_unit > 0 ? hp->n_embd / e->lay.t_unit : 1;
        e->down.nd = ns < nd_max ? ns : (int32_t)nd_max;
        e->down.dn = malloc(((size_t)e->down.nd + 1) * sizeof *e->down.dn);
        e->down.dout = calloc((size_t)e->down.nd, sizeof *e->down.dout);
        e->down.bdout = calloc((size_t)e->down.nd, sizeof *e->down.bdout);
        e->down.h_dout = calloc((size_t)e->down.nd, sizeof *e->down.h_dout);
        e->down.h_bdout = calloc((size_t)e->down.nd, sizeof *e->down.h_bdout);
        if (!e->down.dn || !e->down.dout || !e->down.bdout || !e->down.h_dout || !e->down.h_bdout)
            return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
        for (int32_t k = 0; k <= e->down.nd; k++)
            e->down.dn[k] = si__split_u(hp->n_embd, k, e->down.nd, e->lay.t_unit);
    }
    e->bat.n_batch = p->n_batch > 0 ? p->n_batch : 128;
    if (e->fl.on)
        e->bat.n_batch = 1; /* prefill token by token: a dense batch reads every neuron */
    if (e->pipe.nranks > 1)
        e->bat.n_batch = 1; /* a pipeline passes one token's residual at a time */
    attn_split(e, c->ncpu);
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
    /* Every CPU worker runs its own sgemm: OpenBLAS's threads would only
     * fight the workers for the cores (measured: prefill 4x slower with
     * them on 2 cores).  OPENBLAS_NUM_THREADS, when set, wins. */
    if (getenv("OPENBLAS_NUM_THREADS") == NULL)
        openblas_set_num_threads(1);
#endif
    return SI_OK;
}

/* The bytes of a worker's gemm scratch for batches (alloc_scratch). */
static size_t batch_gemm_bytes(const struct si_engine *e)
{
    const struct si_model *m = e->m;
    const struct si_hparams *hp = &m->hp;
    /* si_k_gemm's tile for any layer's rows, or n_batch inputs
     * converted for gemm_act */
    size_t gs = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        const struct si_layer *W = &m->w.layers[l];
        size_t xa = 0;
        si_type_row_size(si_act_type(W->ffn_up.type), hp->n_embd, &xa);
        size_t xd = 0;
        si_type_row_size(si_act_type(W->ffn_down.type), hp->n_ff, &xd);
        /* converted inputs, and their block sums for the batched
         * kernel of packed rows (codelets/prefill.c, qgemm) */
        const size_t nbt = (size_t)e->bat.n_batch;
        const size_t s[4] = {si_k_gemm_scratch_size(W->ffn_up.type, hp->n_embd),
                             si_k_gemm_scratch_size(W->ffn_down.type, hp->n_ff),
                             (xa + (size_t)hp->n_embd / 8) * nbt + 64,
                             (xd + (size_t)hp->n_ff / 8) * nbt + 64};
        for (int k = 0; k < 4; k++)
            gs = s[k] > gs ? s[k] : gs;
    }
    { /* and the LM head's (si_engine_eval_batch_logits), the attention's */
        const uint32_t ot = m->w.output.type;
        size_t xa = 0, g = si_k_gemm_scratch_size(ot, hp->n_embd);
        si_type_row_size(si_act_type(ot), hp->n_embd, &xa);
        xa = (xa + (size_t)hp->n_embd / 8) * (size_t)e->bat.n_batch + 64;
        gs = g > gs ? g : gs;
        gs = xa > gs ? xa : gs;
        for (int l = 0; l < hp->n_layer; l++) {
            const struct si_layer *W = &m->w.layers[l];
            const struct si_tensor *aw[4] = {&W->wq, &W->wk, &W->wv, &W->wo};
            for (int i = 0; i < 4; i++) {
                g = si_k_gemm_scratch_size(aw[i]->type, aw[i]->ne[0]);
                si_type_row_size(si_act_type(aw[i]->type), aw[i]->ne[0], &xa);
                xa = (xa + (size_t)aw[i]->ne[0] / 8) * (size_t)e->bat.n_batch + 64;
                gs = g > gs ? g : gs;
                gs = xa > gs ? xa : gs;
            }
        }
    }
    return gs;
}

/* The bytes of a worker's dt scratch for batches (alloc_scratch). */
static size_t batch_dt_bytes(const struct si_engine *e)
{
    const struct si_model *m = e->m;
    const struct si_hparams *hp = &m->hp;
    /* down_t rows as floats, or 8 rows of any matrix a batch
     * multiplies, packed on the way (codelets/prefill.c's qgemm) */
    size_t dt = (size_t)SI__DT_TILE * (size_t)hp->n_embd * sizeof(float);
    for (int l = 0; l < hp->n_layer; l++) {
        const struct si_layer *W = &m->w.layers[l];
        const struct si_tensor *t[7] = {&W->wq,       &W->wk,     &W->wv,      &W->wo,
                                        &W->ffn_gate, &W->ffn_up, &W->ffn_down};
        for (int i = 0; i < 7; i++)
            dt = 8 * t[i]->row_bytes > dt ? 8 * t[i]->row_bytes : dt;
    }
    dt = 8 * m->w.output.row_bytes > dt ? 8 * m->w.output.row_bytes : dt;
    return dt;
}

/* Worker w's scratch: the attention's, the FFN's, and with batches the
 * GEMMs'; SI_E_NOMEM when one is missing (init_buffers). */
static int alloc_scratch(struct si_engine *e, unsigned w)
{
    const struct si_model *m = e->m;
    const struct si_hparams *hp = &m->hp;
    const size_t widest = (size_t)(hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd) +
                          (m->has_predictor ? (size_t)m->w.layers[0].fc1.ne[1] : 0);
    const size_t qd = (size_t)hp->n_head * (size_t)hp->head_dim,
                 kvd = (size_t)hp->n_head_kv * (size_t)hp->head_dim, d = (size_t)hp->n_embd,
                 tmpn = 2 * (d > (size_t)hp->head_dim ? d : (size_t)hp->head_dim);
    const size_t ascr = si_ref_attn_scratch_floats(e->ref);
    struct si__scratch *sc = &e->scratch[w];
    /* aq, ak, av, aatt, ascr, xl, xf, xn, xo, tmp in one allocation */
    sc->aq = si_line_alloc((2 * qd + 2 * kvd + ascr + 4 * d + tmpn) * sizeof(float));
    if (sc->aq == NULL)
        return SI_E_NOMEM;
    sc->ak = sc->aq + qd;
    sc->av = sc->ak + kvd;
    sc->aatt = sc->av + kvd;
    sc->ascr = sc->aatt + qd;
    sc->xl = sc->ascr + ascr;
    sc->xf = sc->xl + d;
    sc->xn = sc->xf + d;
    sc->xo = sc->xn + d;
    sc->tmp = sc->xo + d;
    sc->h = si_line_alloc(widest * sizeof(float));
    sc->g = si_line_alloc((size_t)hp->n_ff * sizeof(float));
    sc->ix = malloc((size_t)hp->n_ff * sizeof(int32_t));
    {
        size_t wi = (size_t)hp->n_ff > qd ? (size_t)hp->n_ff : qd;
        wi = wi > d ? wi : d;
        sc->sx = malloc(wi * sizeof(int32_t));
        sc->sv = malloc(wi * sizeof(float));
    }
    sc->y =
        si_line_alloc(((size_t)(hp->n_ff / e->lay.chunk) + 1) * (size_t)hp->n_embd * sizeof(float) +
                      (size_t)hp->n_ff * sizeof(float));
    sc->xq = si_line_alloc(8 * widest + 1024); /* two conversions of the input */
    sc->hq = si_line_alloc(4 * widest + 512);
    if (!sc->h || !sc->g || !sc->ix || !sc->sx || !sc->sv || !sc->y || !sc->xq || !sc->hq)
        return SI_E_NOMEM;
    if (e->bat.n_batch > 1) {
        const size_t bff = (size_t)e->bat.n_batch * (size_t)hp->n_ff;
        sc->bg = si_line_alloc(bff * sizeof(float));
        sc->bu = si_line_alloc(bff * sizeof(float));
        sc->gemm = si_line_alloc(batch_gemm_bytes(e) + 64);
        sc->dt = si_line_alloc(batch_dt_bytes(e));
        sc->hx = si_line_alloc((size_t)e->bat.n_batch * (size_t)hp->n_embd * sizeof(float));
        sc->bqkv = si_line_alloc((size_t)e->bat.n_batch * qd * sizeof(float));
        if (!sc->bg || !sc->bu || !sc->gemm || !sc->dt || !sc->hx || !sc->bqkv)
            return SI_E_NOMEM;
    }
    return SI_OK;
}

/* A batch's buffers (n_batch > 1) and its LM head's slices (init_buffers). */
static int alloc_batch(struct si_engine *e, unsigned ncpu)
{
    const struct si_hparams *hp = &e->m->hp;
    const int32_t ns = e->lay.n_slices;
    const size_t bd = (size_t)e->bat.n_batch * (size_t)hp->n_embd;
    e->bat.bx = calloc(bd, sizeof(float));
    e->bat.bffn_in = calloc(bd, sizeof(float));
    e->bat.bxb3 = calloc(bd, sizeof(float));
    e->bat.bseq = calloc((size_t)e->bat.n_batch, sizeof *e->bat.bseq);
    e->bat.bpos = calloc((size_t)e->bat.n_batch, sizeof *e->bat.bpos);
    e->bat.mtok = calloc((size_t)e->bat.n_batch, sizeof *e->bat.mtok);
    e->bat.bhrow = calloc((size_t)e->bat.n_batch, sizeof *e->bat.bhrow);
    e->bat.bpart = calloc((size_t)ns + 1, sizeof *e->bat.bpart);
    e->bat.h_bpart = calloc((size_t)ns + 1, sizeof *e->bat.h_bpart);
    e->bat.brows = calloc((size_t)ns + 1, sizeof *e->bat.brows);
    e->bat.bwidth = calloc((size_t)ns + 1, sizeof *e->bat.bwidth);
    if (!e->bat.bx || !e->bat.bffn_in || !e->bat.bxb3 || !e->bat.bseq || !e->bat.bpos ||
        !e->bat.mtok || !e->bat.bhrow || !e->bat.bpart || !e->bat.h_bpart || !e->bat.brows ||
        !e->bat.bwidth)
        return SI_E_NOMEM;
    /* The batch LM head: a task per CPU worker, rows of the vocabulary */
    int32_t nlh = (int32_t)ncpu;
    if (nlh > hp->n_vocab)
        nlh = hp->n_vocab;
    if (nlh > SI__MAX_SLICES)
        nlh = SI__MAX_SLICES;
    e->bat.nlh = nlh;
    e->bat.lh = calloc((size_t)nlh + 1, sizeof *e->bat.lh);
    e->bat.h_blog_c = calloc((size_t)nlh, sizeof *e->bat.h_blog_c);
    e->bat.name_lhb = calloc((size_t)nlh, sizeof *e->bat.name_lhb);
    if (!e->bat.lh || !e->bat.h_blog_c || !e->bat.name_lhb)
        return SI_E_NOMEM;
    for (int32_t j = 0; j <= nlh; j++)
        e->bat.lh[j] = (size_t)si__split8(hp->n_vocab, j, nlh);
    for (int32_t j = 0; j < nlh; j++)
        snprintf(e->bat.name_lhb[j], sizeof e->bat.name_lhb[j], "norm+lm_head_batch.%d", j);
    return SI_OK;
}

/* The batch attention's head chunks (state.h's nc): the kv-head groups when
 * they are all of one size, else a chunk per kv head (so long as nc * nr
 * buffers fit an attn_o_batch task); their outputs' buffers. */
static int alloc_batch_chunks(struct si_engine *e)
{
    const struct si_hparams *hp = &e->m->hp;
    const int32_t ng = e->dec.ng, nr = e->bat.nr;
    /* (a_g[j] = j * n_head_kv / ng: groups of one size where ng divides it) */
    const bool even = hp->n_head_kv % ng == 0;
    const int32_t nc =
        even || (int64_t)hp->n_head_kv * nr > SI__MAX_SLICES ? ng : (int32_t)hp->n_head_kv;
    e->bat.nc = nc;
    e->bat.c_h = calloc((size_t)nc + 1, sizeof *e->bat.c_h);
    e->bat.c_g = calloc((size_t)nc, sizeof *e->bat.c_g);
    e->bat.batt = calloc((size_t)(nc * nr), sizeof *e->bat.batt);
    e->bat.h_batt = calloc((size_t)(nc * nr), sizeof *e->bat.h_batt);
    if (!e->bat.c_h || !e->bat.c_g || !e->bat.batt || !e->bat.h_batt)
        return SI_E_NOMEM;
    for (int32_t c = 0, g = 0; c <= nc; c++) {
        e->bat.c_h[c] = nc == ng ? e->dec.a_g[c] : c;
        while (c < nc && e->bat.c_h[c] >= e->dec.a_g[g + 1])
            g++;
        if (c < nc)
            e->bat.c_g[c] = g;
    }
    for (int32_t j = 0; j < nc * nr && e->bat.n_batch > 1; j++)
        if ((e->bat.batt[j] = si_line_alloc((size_t)e->bat.n_batch *
                                            (size_t)si__chunk_len(e, j / nr) * sizeof(float))) ==
            NULL)
            return SI_E_NOMEM;
    return SI_OK;
}

/* The kv-head groups' bounds and buffers, the batch attention's row ranges
 * (nr, a task per CPU worker), and each layer's names and cache children for
 * them (init_buffers). */
static int alloc_attn_groups(struct si_engine *e, unsigned ncpu)
{
    const struct si_hparams *hp = &e->m->hp;
    /* The kv-head groups; with several, the caches' columns by group
     * (data.c) and, for batches, each group's attention output. */
    const int64_t ng = e->dec.ng, group = hp->n_head / hp->n_head_kv;
    e->dec.a_g = calloc((size_t)ng + 1, sizeof *e->dec.a_g);
    e->dec.att_len = calloc((size_t)ng, sizeof *e->dec.att_len);
    const int64_t nr = e->bat.nr = (int32_t)ncpu;
    const size_t row = (size_t)(hp->n_head + 2 * hp->n_head_kv) * (size_t)hp->head_dim;
    e->bat.btp = calloc((size_t)nr + 1, sizeof *e->bat.btp);
    e->bat.btr = calloc((size_t)nr + 1, sizeof *e->bat.btr);
    e->bat.bqkv = calloc((size_t)nr, sizeof *e->bat.bqkv);
    e->bat.h_bqkv = calloc((size_t)nr, sizeof *e->bat.h_bqkv);
    e->bat.bo_c = calloc((size_t)nr + 1, sizeof *e->bat.bo_c);
    e->bat.bo = calloc((size_t)nr, sizeof *e->bat.bo);
    e->bat.h_bo = calloc((size_t)nr, sizeof *e->bat.h_bo);
    if (!e->dec.a_g || !e->dec.att_len || !e->bat.btp || !e->bat.btr || !e->bat.bqkv ||
        !e->bat.h_bqkv || !e->bat.bo_c || !e->bat.bo || !e->bat.h_bo)
        return SI_E_NOMEM;
    for (int64_t j = 0; j <= nr; j++)
        e->bat.bo_c[j] = si__split8(hp->n_embd, j, nr);
    for (int64_t j = 0; j < nr && e->bat.n_batch > 1; j++)
        if ((e->bat.bo[j] = si_line_alloc((size_t)e->bat.n_batch *
                                          (size_t)(e->bat.bo_c[j + 1] > e->bat.bo_c[j]
                                                       ? e->bat.bo_c[j + 1] - e->bat.bo_c[j]
                                                       : 1) *
                                          sizeof(float))) == NULL)
            return SI_E_NOMEM;
    for (int64_t j = 0; j <= ng; j++)
        e->dec.a_g[j] = j * hp->n_head_kv / ng;
    for (int64_t j = 0; j < ng; j++)
        e->dec.att_len[j] = (uint32_t)((e->dec.a_g[j + 1] - e->dec.a_g[j]) * group * hp->head_dim);
    for (int64_t j = 0; j < nr && e->bat.n_batch > 1; j++)
        if ((e->bat.bqkv[j] = si_line_alloc((size_t)e->bat.n_batch * row * sizeof(float))) == NULL)
            return SI_E_NOMEM;
    if (alloc_batch_chunks(e) != SI_OK)
        return SI_E_NOMEM;
    for (int l = 0; l < hp->n_layer; l++) {
        struct si__layer_state *L = &e->L[l];
        L->name_agrp = calloc((size_t)ng, sizeof *L->name_agrp);
        L->name_bagrp = calloc((size_t)nr, sizeof *L->name_bagrp);
        L->name_bakv = calloc((size_t)ng, sizeof *L->name_bakv);
        L->name_bacore = calloc((size_t)(e->bat.nc * nr), sizeof *L->name_bacore);
        L->name_bao = calloc((size_t)nr, sizeof *L->name_bao);
        L->h_k_c = calloc((size_t)ng, sizeof *L->h_k_c);
        L->h_v_c = calloc((size_t)ng, sizeof *L->h_v_c);
        L->kv_cols = calloc(2 * ((size_t)ng + 1), sizeof *L->kv_cols);
        if (!L->name_agrp || !L->name_bagrp || !L->name_bakv || !L->name_bacore || !L->name_bao ||
            !L->h_k_c || !L->h_v_c || !L->kv_cols)
            return SI_E_NOMEM;
    }
    return SI_OK;
}

/* The attention split's buffers (na > 1): Wo's and the LM head's column
 * ranges, their outputs and names (init_buffers). */
static int alloc_attn_split(struct si_engine *e)
{
    const struct si_hparams *hp = &e->m->hp;
    const int64_t na = e->dec.na, ng = e->dec.ng;
    e->dec.a_o = calloc((size_t)na + 1, sizeof *e->dec.a_o);
    e->dec.a_h = calloc((size_t)na + 1, sizeof *e->dec.a_h);
    e->dec.name_head = calloc((size_t)na, sizeof *e->dec.name_head);
    e->dec.h_logits_c = calloc((size_t)na, sizeof *e->dec.h_logits_c);
    e->dec.o = calloc((size_t)na, sizeof *e->dec.o);
    e->dec.h_o = calloc((size_t)na, sizeof *e->dec.h_o);
    e->dec.o_len = calloc((size_t)na, sizeof *e->dec.o_len);
    e->dec.h_att_c = calloc((size_t)ng, sizeof *e->dec.h_att_c);
    e->dec.x2 = calloc((size_t)hp->n_embd, sizeof(float));
    e->dec.head_len = calloc((size_t)na, sizeof *e->dec.head_len);
    e->dec.part = calloc((size_t)na, sizeof *e->dec.part);
    e->dec.h_part = calloc((size_t)na, sizeof *e->dec.h_part);
    if (!e->dec.a_o || !e->dec.a_h || !e->dec.name_head || !e->dec.h_logits_c || !e->dec.o ||
        !e->dec.h_o || !e->dec.o_len || !e->dec.h_att_c || !e->dec.x2 || !e->dec.head_len ||
        !e->dec.part || !e->dec.h_part)
        return SI_E_NOMEM;
    /* the position tasks' partial results: the most chunks a task takes */
    const int64_t max_chunks = (int64_t)e->ref->p.n_ctx / SI_ATTN_CHUNK + 1;
    e->dec.part_cap =
        (size_t)((max_chunks + na - 1) / na) * si_k_attn_part_floats(hp->n_head, hp->head_dim);
    for (int64_t j = 0; j < na; j++)
        if ((e->dec.part[j] = si_line_alloc(e->dec.part_cap * sizeof(float))) == NULL)
            return SI_E_NOMEM;
    for (int64_t j = 0; j <= na; j++) {
        e->dec.a_o[j] = si__split_u(hp->n_embd, j, na, e->lay.t_unit);
        e->dec.a_h[j] = si__split8(hp->n_vocab, j, na);
    }
    for (int64_t j = 0; j < na; j++)
        snprintf(e->dec.name_head[j], sizeof e->dec.name_head[j], "lm_head.%d", (int)j);
    /* Wo's row slices write parts of one array: its readers read it whole
     * (graph/data.c) */
    if ((e->dec.o_all = si_line_alloc((size_t)hp->n_embd * sizeof(float))) == NULL)
        return SI_E_NOMEM;
    for (int64_t j = 0; j < na; j++) {
        e->dec.o[j] = e->dec.o_all + e->dec.a_o[j];
        e->dec.o_len[j] = (uint32_t)(e->dec.a_o[j + 1] - e->dec.a_o[j]);
    }
    if (e->lay.sparse && ng > 1) { /* the groups' partial products with Wo (fuse_wo) */
        e->dec.opart = si_line_alloc((size_t)ng * (size_t)hp->n_embd * sizeof(float));
        e->dec.opart_len = calloc((size_t)ng, sizeof *e->dec.opart_len);
        e->dec.h_opart_c = calloc((size_t)ng, sizeof *e->dec.h_opart_c);
        if (!e->dec.opart || !e->dec.opart_len || !e->dec.h_opart_c)
            return SI_E_NOMEM;
        for (int64_t j = 0; j < ng; j++)
            e->dec.opart_len[j] = (uint32_t)hp->n_embd;
    }
    for (int l = 0; l < hp->n_layer; l++) {
        struct si__layer_state *L = &e->L[l];
        L->name_ao = calloc((size_t)na, sizeof *L->name_ao);
        L->name_apos = calloc((size_t)na, sizeof *L->name_apos);
        if (!L->name_ao || !L->name_apos)
            return SI_E_NOMEM;
    }
    return SI_OK;
}

/*
 * Stage buffers: what the layout's sizes ask for, before any neuron has its
 * place: the reference's state (activations, KV caches: si_ref_init), each
 * worker's scratch, each layer's arrays at the most the plan may use (n_slices
 * + 2 slots: alloc_layer; the sparse layouts' records in memory), gate mode's
 * thresholds, the index list, a batch's buffers and the attention tasks'.  The
 * buffers whose size the plan's slices decide are the plan stage's.
 */
static int init_buffers(struct si_engine *e, unsigned ncpu, char *err, size_t err_size)
{
    const struct si_model *m = e->m;
    const struct si_hparams *hp = &m->hp;
    const struct si_engine_params *p = &e->p;
    int rc = si_ref_init(&e->ref, m, p->ref, err, err_size);
    if (rc != SI_OK)
        return rc;
    e->n_workers = starpu_worker_get_count();
    e->scratch = calloc(e->n_workers, sizeof *e->scratch);
    e->L = calloc((size_t)hp->n_layer, sizeof *e->L);
    e->lay.zeros = calloc((size_t)hp->n_ff, sizeof(float));
    e->lay.gthr = calloc((size_t)hp->n_layer, sizeof(float));
    e->lay.iota = malloc((size_t)hp->n_ff * sizeof(int32_t));
    if (!e->scratch || !e->L || !e->lay.zeros || !e->lay.gthr || !e->lay.iota)
        goto oom;
    /* Gate mode's thresholds: the one given, else the profile's per-layer
     * CATS thresholds (SiLU/GELU models), else 0 (only exact zeros). */
    for (int l = 0; l < hp->n_layer; l++)
        e->lay.gthr[l] = p->gate_threshold > 0.0f ? p->gate_threshold
                         : p->profile != NULL && p->profile->thresholds != NULL &&
                                 hp->act != SI_ACT_RELU && !e->lay.dense_records
                             ? p->profile->thresholds[l]
                             : 0.0f;
    for (int64_t i = 0; i < hp->n_ff; i++)
        e->lay.iota[i] = (int32_t)i;
    for (int l = 0; l < hp->n_layer; l++)
        if (alloc_layer(e, &e->L[l], l) != SI_OK)
            goto oom;
    for (unsigned w = 0; w < e->n_workers; w++)
        if (alloc_scratch(e, w) != SI_OK)
            goto oom;
    if (e->bat.n_batch > 1 && alloc_batch(e, ncpu) != SI_OK)
        goto oom;
    if (alloc_attn_groups(e, ncpu) != SI_OK || (e->dec.na > 1 && alloc_attn_split(e) != SI_OK))
        goto oom;
    return SI_OK;
oom:
    return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the engine");
}

/*
 * The neurons' plan (placement/plan.h): the hot slice of each layer, the
 * permutation and the cold slices, then each slice's lengths.  The plan
 * fills the budget less the reserve with hot neurons, counted by their
 * bytes; StarPU's allocator rounds small buffers up to its chunks
 * (si__gpu_planned), so while the plan's handles would take more than the
 * budget, the reserve's allocator item grows by the excess and the plan is
 * made again (a placement's neurons are fixed: then it does not fit).
 */
static int plan_neurons(struct si_engine *e, char *err, size_t err_size)
{
    const struct si_hparams *hp = &e->m->hp;
    struct si_gpu_reserve rs;
    /* Attention on the GPU first (graph/attn_gpu.c): its layers join the
     * reserve, the hot neurons get what they leave. */
    e->gpu.n_attn_gpu = 0;
    if ((e->gpu.cuda_hot || e->p.hot_on_cpu) && (e->p.vram_budget > 0 || e->p.placement != NULL)) {
        const char *why = si__attn_gpu_unable(e->m, &e->p);
        if (e->p.attn_gpu > 0 && why != NULL)
            return si__errf(err, err_size, SI_E_UNSUPPORTED,
                            "attention on the GPU: %s (run without --gpu-attention)", why);
        si__reserve_of(e, &rs);
        e->gpu.n_attn_gpu = si__attn_gpu_choose(e, &rs, e->p.vram_budget);
    }
    e->stats.attn_gpu_layers = e->gpu.n_attn_gpu;
    si__reserve_of(e, &rs);
    struct si_plan_params pp = {.n_layer = hp->n_layer,
                                .n_ff = hp->n_ff,
                                .n_slices = e->lay.n_slices,
                                .reserve = rs,
                                .gpu = e->gpu.cuda_hot || e->p.hot_on_cpu,
                                .vram_budget = e->p.vram_budget,
                                .profile = e->p.profile,
                                .placement = e->p.placement};
    struct si_plan_layer *pl = calloc((size_t)hp->n_layer, sizeof *pl);
    if (pl == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the placement");
    for (int l = 0; l < hp->n_layer; l++)
        pl[l] = (struct si_plan_layer){.s0 = e->L[l].s0, .perm = e->L[l].perm};
    int64_t *n_hot = calloc((size_t)hp->n_layer, sizeof *n_hot);
    if (n_hot == NULL) {
        free(pl);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the placement");
    }
    int rc;
    for (int round = 0;; round++) {
        pp.reserve = rs;
        rc = si_plan_neurons(&pp, pl, &e->stats.gpu_budget, &e->gpu.hot_bytes, err, err_size);
        if (rc != SI_OK || e->stats.gpu_budget <= 0)
            break;
        for (int l = 0; l < hp->n_layer; l++)
            n_hot[l] = pl[l].n_hot;
        const int64_t need = si__gpu_planned(e, n_hot), over = need - e->stats.gpu_budget;
        if (over <= 0)
            break;
        if (e->p.placement != NULL || round == 16) {
            rc = si__errf(err, err_size, SI_E_BUDGET,
                          "the hot neurons and the engine's buffers take %.1f MiB on the GPU "
                          "with StarPU's allocation granularity (32 MiB chunks for buffers "
                          "under 4 MiB), over the VRAM budget of %.1f MiB",
                          (double)need / 1048576.0, (double)e->stats.gpu_budget / 1048576.0);
            break;
        }
        rs.bytes[SI_GPU_ALLOCATOR] += over;
        rs.total += over;
    }
    free(n_hot);
    for (int l = 0; rc == SI_OK && l < hp->n_layer; l++) {
        struct si__layer_state *L = &e->L[l];
        L->n_hot = pl[l].n_hot;
        L->hot = L->n_hot > 0;
        L->attn_gpu = l < e->gpu.n_attn_gpu;
        L->nsl = pl[l].nsl;
        for (int32_t j = 0; j < L->nsl; j++) {
            L->rows[j] = 1;
            L->len_n[j] = (uint32_t)(L->s0[j + 1] - L->s0[j]);
            L->len_p[j] = e->lay.sparse ? (uint32_t)hp->n_embd : L->len_n[j];
        }
    }
    free(pl);
    return rc;
}

/*
 * Stage plan: each neuron's place (plan_neurons: the layers whose attention
 * runs on the GPU, the hot slice, the permutation, the cold slices' bounds),
 * then the fuse policy, which waits for the GPU's layers (layout.c's
 * si__fuse_of; redux as asked), those layers' aux arrays, and the buffers
 * the slices size: each slot's batch output and dense mode's down blocks'.
 * With the flash tier those buffers are none (one token a batch, no down
 * blocks), so they come before its region.  The neurons' data (records,
 * packed copies, handles) is left to the stages after.
 */
static int init_plan(struct si_engine *e, bool redux, char *err, size_t err_size)
{
    const struct si_model *m = e->m;
    const struct si_hparams *hp = &m->hp;
    const int32_t ns = e->lay.n_slices;
    int rc = plan_neurons(e, err, err_size);
    if (rc == SI_OK) /* with the GPU's attention layers chosen */
        si__fuse_of(e, redux);
    for (int l = 0; rc == SI_OK && l < e->gpu.n_attn_gpu; l++) {
        const struct si_layer *W = &m->w.layers[l];
        if (si__attn_gpu_aux(e, l) != SI_OK)
            rc = si__errf(err, err_size, SI_E_NOMEM, "out of memory");
        if (e->gpu.cuda_hot)
            e->gpu.attn_gpu_bytes +=
                (int64_t)(W->wq.nbytes + W->wk.nbytes + W->wv.nbytes + W->wo.nbytes);
    }
    if (rc != SI_OK)
        return rc;
    if (e->bat.n_batch > 1) {
        /* Each slot's batch output: a row per token (dense: the activations
         * of the widest slice the slot has in any layer). */
        for (int l = 0; l < hp->n_layer; l++)
            for (int32_t j = 0; j < e->L[l].nsl; j++) {
                e->bat.brows[j] =
                    e->L[l].rows[j] > e->bat.brows[j] ? e->L[l].rows[j] : e->bat.brows[j];
                e->bat.bwidth[j] =
                    e->L[l].len_n[j] > e->bat.bwidth[j] ? e->L[l].len_n[j] : e->bat.bwidth[j];
            }
        for (int32_t j = 0; j <= ns; j++) {
            e->bat.brows[j] = e->bat.brows[j] > 0 ? e->bat.brows[j] : 1;
            const size_t per = e->lay.sparse
                                   ? (size_t)e->bat.brows[j] * (size_t)hp->n_embd
                                   : (size_t)(e->bat.bwidth[j] > 0 ? e->bat.bwidth[j] : 1);
            if ((e->bat.bpart[j] = calloc((size_t)e->bat.n_batch * per, sizeof(float))) == NULL)
                goto oom;
        }
    }
    /* the blocks' outputs are parts of one array, which the next layer's
     * tasks may read whole (merge.c's si__join_carried) */
    if (e->down.nd > 0 &&
        ((e->down.dout_all = calloc((size_t)hp->n_embd, sizeof(float))) == NULL ||
         (e->down.dout_len = calloc((size_t)e->down.nd, sizeof(uint32_t))) == NULL))
        goto oom;
    for (int32_t k = 0; k < e->down.nd; k++) {
        const size_t no = (size_t)(e->down.dn[k + 1] - e->down.dn[k]);
        e->down.dout[k] = e->down.dout_all + e->down.dn[k];
        e->down.dout_len[k] = (uint32_t)no;
        if (e->bat.n_batch > 1 &&
            (e->down.bdout[k] = calloc((size_t)e->bat.n_batch * no, sizeof(float))) == NULL)
            goto oom;
    }
    return SI_OK;
oom:
    return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the engine");
}

/*
 * Stage flash, with the flash tier only: its DRAM.  What stays resident (the
 * model's tensors but the FFN's, unless the file was read whole; the KV cache;
 * the per-layer arrays with the hot records), then the caches in what the
 * budget leaves, the same number of records for every layer (at most its cold
 * neurons); the tier's region (flash/tier.c) and the hot records' memory,
 * which the records stage fills from the store.
 */
static int init_flash(struct si_engine *e, char *err, size_t err_size)
{
    if (!e->fl.on)
        return SI_OK;
    const struct si_hparams *hp = &e->m->hp;
    const int64_t ff = hp->n_ff, nl = hp->n_layer;
    int64_t *n_hot = malloc((size_t)nl * sizeof *n_hot);
    const int32_t **perm = malloc((size_t)nl * sizeof *perm);
    if (n_hot == NULL || perm == NULL) {
        free(n_hot);
        free(perm);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the flash tier");
    }
    for (int l = 0; l < nl; l++) {
        n_hot[l] = e->L[l].n_hot;
        perm[l] = e->L[l].perm;
    }
    int64_t model = (int64_t)e->m->gguf->data_size;
    if (!e->p.model_in_memory)
        for (int l = 0; l < nl; l++) {
            const struct si_layer *W = &e->m->w.layers[l];
            model -= (int64_t)(W->ffn_gate.nbytes + W->ffn_up.nbytes + W->ffn_down.nbytes +
                               W->ffn_down_t.nbytes);
        }
    const struct si_ref *s = e->ref;
    const int64_t kv =
        nl * (int64_t)s->p.n_ctx *
        (int64_t)(si_ref_kv_row_bytes(&s->p, hp, false) + si_ref_kv_row_bytes(&s->p, hp, true));
    int64_t layers = 0;
    for (int l = 0; l < nl; l++)
        layers += flash_layer_bytes(e, l);
    const size_t rb = e->L[0].f.rec_bytes; /* the store's, for every layer */
    const int64_t spill = si_flash_tier_spill_bytes((int32_t)nl, ff, n_hot, rb);
    const int64_t resident = model + kv + layers + spill;
    const int64_t per_rec = si_flash_tier_record_bytes(rb);
    int64_t cap = ff;
    int rc = SI_OK;
    if (e->p.flash_cache > 0) {
        cap = e->p.flash_cache;
    } else if (e->p.dram_budget > 0) {
        const int64_t avail = e->p.dram_budget - resident;
        if (avail < per_rec * nl)
            rc = si__errf(err, err_size, SI_E_BUDGET,
                          "DRAM budget of %.1f MiB is below what the flash tier keeps "
                          "resident: %.1f MiB (model tensors besides the FFN %.1f MiB, KV "
                          "cache %.1f MiB, hot neurons, gating rows, predictors and buffers "
                          "%.1f MiB, a layer's worth of records for reading %.1f MiB) and "
                          "one cached neuron per layer (%.2f MiB)",
                          mib(e->p.dram_budget), mib(resident), mib(model), mib(kv), mib(layers),
                          mib(spill), mib(per_rec * nl));
        else
            cap = avail / per_rec / nl;
    }
    e->stats.dram_resident = resident;
    if (rc == SI_OK)
        rc = si_flash_tier_init(e->fl.ft, e->p.flash, (int32_t)nl, ff, rb, e->p.flash_window, cap,
                                e->p.flash_pin, n_hot, perm, err, err_size);
    free(n_hot);
    free(perm);
    if (rc != SI_OK)
        return rc;
    e->stats.flash_cache_bytes = e->fl.ft->cache_bytes;
    e->stats.flash_cache_records = e->fl.ft->cache_records;
    e->stats.flash_pinned = e->fl.ft->pinned;
    e->stats.flash_overlap = e->fl.ft->overlap;
    /* the hot records, read from the store by si__build_flash */
    for (int l = 0; l < nl; l++) {
        struct si__layer_state *L = &e->L[l];
        if (L->n_hot > 0 && (L->rec = aligned_alloc(SI_FLASH_BLOCK, (size_t)L->n_hot * rb)) == NULL)
            return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the hot neurons");
    }
    return SI_OK;
}

/*
 * Stage records: each layer's neurons in the plan's order.  With the flash
 * tier, every layer's resident part (data.c's si__build_flash: gating rows,
 * biases, the hot records read from the store, fc2 by position); in memory,
 * the sparse layouts' records of this rank's layers (si__build_records), with
 * ffn_down transposed through col for the layers whose file has no
 * ffn_down_t.  Dense mode reads the file's rows as they are: nothing to build.
 */
static int init_records(struct si_engine *e, char *err, size_t err_size)
{
    const struct si_model *m = e->m;
    const struct si_hparams *hp = &m->hp;
    int rc = SI_OK;
    if (e->fl.on) {
        for (int l = 0; l < hp->n_layer && rc == SI_OK; l++)
            rc = si__build_flash(e, l, err, err_size);
        return rc;
    }
    if (!e->lay.sparse)
        return SI_OK;
    float *col = NULL; /* for the layers without ffn_down_t in the file */
    bool transpose = false;
    for (int l = 0; l < hp->n_layer; l++)
        transpose |= m->w.layers[l].ffn_down_t.data == NULL;
    if (transpose && (col = malloc((size_t)hp->n_ff * (size_t)hp->n_embd * sizeof(float))) == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the engine");
    for (int l = e->pipe.l0; l < e->pipe.l1 && rc == SI_OK; l++) /* this rank's layers */
        rc = si__build_records(e, l, col, err, err_size);
    free(col);
    return rc;
}

/* The tasks' names, which StarPU's traces show (init_handles). */
static void name_tasks(struct si_engine *e)
{
    const struct si_hparams *hp = &e->m->hp;
    for (int l = 0; l < hp->n_layer; l++) {
        struct si__layer_state *L = &e->L[l];
        snprintf(L->name_attn, sizeof L->name_attn, "attn_L%d", l);
        snprintf(L->name_pred, sizeof L->name_pred, "pred_L%d", l);
        snprintf(L->name_merge, sizeof L->name_merge, "merge_L%d", l);
        snprintf(L->name_load, sizeof L->name_load, "load_L%d", l);
        for (int32_t j = 0; L->name_gmask != NULL && j < L->nsl; j++)
            snprintf(L->name_gmask[j], sizeof L->name_gmask[j], "gmask_L%d.%d", l,
                     j - (L->hot ? 1 : 0));
        snprintf(L->name_battn, sizeof L->name_battn, "attn_out_batch_L%d", l);
        snprintf(L->name_aout, sizeof L->name_aout, "attn_out_L%d", l);
        for (int32_t j = 0; j < e->dec.ng && e->dec.na > 1; j++)
            snprintf(L->name_agrp[j], sizeof L->name_agrp[j], "attn_L%d.%d", l, j);
        for (int32_t j = 0; j < e->bat.nr; j++)
            snprintf(L->name_bagrp[j], sizeof L->name_bagrp[j], "attn_batch_L%d.%d", l, j);
        for (int32_t j = 0; j < e->dec.ng; j++)
            snprintf(L->name_bakv[j], sizeof L->name_bakv[j], "attn_kv_batch_L%d.%d", l, j);
        for (int32_t j = 0; j < e->bat.nc * e->bat.nr; j++)
            snprintf(L->name_bacore[j], sizeof L->name_bacore[j], "attn_core_batch_L%d.%d.%d", l,
                     j / e->bat.nr, j % e->bat.nr);
        for (int32_t j = 0; j < e->bat.nr; j++)
            snprintf(L->name_bao[j], sizeof L->name_bao[j], "attn_o_batch_L%d.%d", l, j);
        for (int32_t j = 0; j < e->dec.na && e->dec.na > 1; j++) {
            snprintf(L->name_ao[j], sizeof L->name_ao[j], "attn_o_L%d.%d", l, j);
            snprintf(L->name_apos[j], sizeof L->name_apos[j], "attn_pos_L%d.%d", l, j);
        }
        snprintf(L->name_bmerge, sizeof L->name_bmerge, "merge_batch_L%d", l);
        for (int32_t k = 0; L->name_down != NULL && k < e->down.nd; k++) {
            snprintf(L->name_down[k], sizeof L->name_down[k], "ffn_down_L%d.%d", l, k);
            snprintf(L->name_bdown[k], sizeof L->name_bdown[k], "ffn_down_batch_L%d.%d", l, k);
        }
        for (int32_t j = 0; j < L->nsl; j++) {
            if (si__is_hot(e, l, j)) {
                snprintf(L->name_ffn[j], sizeof L->name_ffn[j], "ffn_hot_L%d", l);
                snprintf(L->name_bffn[j], sizeof L->name_bffn[j], "ffn_batch_hot_L%d", l);
            } else {
                snprintf(L->name_ffn[j], sizeof L->name_ffn[j], "ffn_cold_L%d.%d", l,
                         j - (L->hot ? 1 : 0));
                snprintf(L->name_bffn[j], sizeof L->name_bffn[j], "ffn_batch_cold_L%d.%d", l,
                         j - (L->hot ? 1 : 0));
            }
        }
    }
}

/*
 * Stage handles: the tasks' names, every StarPU handle (data.c's
 * si__register_engine: activations, weights, the slices as children of their
 * layer's, KV caches) and the check that what the engine lets onto the GPU
 * fits the budget the plan had.  The profile and the placement, read by init
 * only, are dropped first: the engine keeps no pointer into them.
 */
static int init_handles(struct si_engine *e, char *err, size_t err_size)
{
    e->p.profile = NULL; /* used during init only */
    e->p.placement = NULL;
    name_tasks(e);
    si__register_engine(e);
    e->stats.gpu_accounted = si__gpu_accounted(e);
    e->stats.gpu_allocated_peak = e->gpu.cuda_hot ? 0 : -1;
    if (e->stats.gpu_accounted > e->stats.gpu_budget)
        /* the reserve missed something the engine lets onto the GPU */
        return si__errf(err, err_size, SI_E_BUDGET,
                        "the engine's GPU handles take %" PRId64 " bytes, over the VRAM budget "
                        "of %" PRId64,
                        e->stats.gpu_accounted, e->stats.gpu_budget);
    return SI_OK;
}

/*
 * Init is a run of stages (docs/ARCHITECTURE.md), each deciding what the
 * next ones read: checks, layout, buffers, plan, flash, records, pack
 * (weights.c's si__weights_pack), handles.  The first to fail ends it;
 * si_engine_free undoes what the stages before it built, the one cleanup
 * of every failure once the engine exists.
 */
int si_engine_init(struct si_engine **out, const struct si_model *m, struct si_engine_params p,
                   char *err, size_t err_size)
{
    *out = NULL;
    struct init_env c;
    int rc = init_checks(m, &p, &c, err, err_size);
    if (rc != SI_OK)
        return rc;
    struct si_engine *e = calloc(1, sizeof *e);
    if (e != NULL && (e->fl.ft = calloc(1, sizeof *e->fl.ft)) == NULL) {
        free(e);
        e = NULL;
    }
    if (e == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    if ((rc = init_layout(e, m, &p, &c, err, err_size)) != SI_OK ||
        (rc = init_buffers(e, c.ncpu, err, err_size)) != SI_OK ||
        (rc = init_plan(e, p.redux, err, err_size)) != SI_OK ||
        (rc = init_flash(e, err, err_size)) != SI_OK ||
        (rc = init_records(e, err, err_size)) != SI_OK ||
        (rc = si__weights_pack(e, err, err_size)) != SI_OK ||
        (rc = init_handles(e, err, err_size)) != SI_OK) {
        si_engine_free(e);
        return rc;
    }
    *out = e;
    return SI_OK;
}

void si_engine_free(struct si_engine *e)
{
    if (e == NULL)
        return;
    if (e->dec.h_x != NULL) {
        si_runtime_wait_all();
        si__unregister_engine(e);
    }
    si__weights_free(e);
    si_engine_observe(e, NULL, NULL);
    free(e->ip.pend);
    free(e->ip.ck);
    for (int32_t k = 0; k < e->down.nd; k++)
        if (e->down.bdout != NULL)
            free(e->down.bdout[k]);
    free(e->down.dout_all);
    free(e->down.dout_len);
    free(e->down.dn);
    free(e->down.dout);
    free(e->down.bdout);
    free(e->down.h_dout);
    free(e->down.h_bdout);
    free(e->dec.o_all);
    free(e->dec.opart);
    free(e->dec.opart_len);
    free(e->dec.h_opart_c);
    free(e->dec.o);
    free(e->dec.o_len);
    free(e->dec.h_o);
    for (int32_t j = 0; e->dec.part != NULL && j < e->dec.na; j++)
        free(e->dec.part[j]);
    free(e->dec.part);
    free(e->dec.h_part);
    free(e->dec.h_att_c);
    free(e->dec.x2);
    free(e->dec.a_g);
    free(e->dec.att_len);
    for (int32_t j = 0; e->bat.batt != NULL && j < e->bat.nc * e->bat.nr; j++)
        free(e->bat.batt[j]);
    free(e->bat.c_h);
    free(e->bat.c_g);
    for (int32_t j = 0; e->bat.bqkv != NULL && j < e->bat.nr; j++)
        free(e->bat.bqkv[j]);
    free(e->bat.batt);
    free(e->bat.h_batt);
    free(e->bat.bqkv);
    free(e->bat.h_bqkv);
    free(e->bat.btp);
    free(e->bat.btr);
    for (int32_t j = 0; e->bat.bo != NULL && j < e->bat.nr; j++)
        free(e->bat.bo[j]);
    free(e->bat.bo);
    free(e->bat.h_bo);
    free(e->bat.bo_c);
    free(e->dec.a_o);
    free(e->dec.a_h);
    free(e->dec.name_head);
    free(e->dec.h_logits_c);
    free(e->dec.head_len);
    if (e->bat.bpart != NULL)
        for (int32_t j = 0; j <= e->lay.n_slices; j++)
            free(e->bat.bpart[j]);
    free(e->bat.bpart);
    free(e->bat.h_bpart);
    free(e->bat.brows);
    free(e->bat.bwidth);
    free(e->bat.bx);
    free(e->bat.bffn_in);
    free(e->bat.bxb3);
    free(e->bat.bseq);
    free(e->bat.bpos);
    free(e->bat.mtok);
    free(e->bat.bhrow);
    free(e->bat.mlogits);
    free(e->bat.lh);
    free(e->bat.h_blog_c);
    free(e->bat.name_lhb);
    if (e->scratch != NULL)
        for (unsigned w = 0; w < e->n_workers; w++) {
            free(e->scratch[w].aq); /* one allocation for the attention buffers */
            free(e->scratch[w].h);
            free(e->scratch[w].g);
            free(e->scratch[w].ix);
            free(e->scratch[w].sx);
            free(e->scratch[w].sv);
            free(e->scratch[w].y);
            free(e->scratch[w].xq);
            free(e->scratch[w].hq);
            free(e->scratch[w].bg);
            free(e->scratch[w].bu);
            free(e->scratch[w].gemm);
            free(e->scratch[w].dt);
            free(e->scratch[w].hx);
            free(e->scratch[w].bqkv);
        }
    if (e->L != NULL)
        for (int l = 0; l < e->m->hp.n_layer; l++)
            free_layer(&e->L[l]);
    free(e->L);
    free(e->scratch);
    free(e->lay.zeros);
    free(e->lay.gthr);
    free(e->lay.iota);
    si_flash_tier_free(e->fl.ft);
    free(e->fl.ft);
    si_ref_free(e->ref);
    free(e);
}

const float *si_engine_logits(const struct si_engine *e)
{
    return e->ref->logits;
}

void si_engine_reset(struct si_engine *e)
{
    si_ref_reset(e->ref);
}

struct si_ref *si_engine_seq_new(struct si_engine *e)
{
    if (e->bat.n_batch <= 1 || e->obs.fn != NULL)
        return NULL;
    const struct si_hparams *hp = &e->m->hp;
    struct si_ref *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    /* The fields the attention's cache and attend steps read, no more:
     * a batch's other steps run on ref (codelets/prefill.c). */
    s->m = e->m;
    s->p = e->ref->p;
    const size_t cache = (size_t)hp->n_layer * (size_t)s->p.n_ctx;
    s->kcache = calloc(cache, si_ref_kv_row_bytes(&s->p, hp, false));
    s->vcache = calloc(cache, si_ref_kv_row_bytes(&s->p, hp, true));
    s->logits = calloc((size_t)hp->n_vocab, sizeof(float));
    if (s->kcache == NULL || s->vcache == NULL || s->logits == NULL) {
        si_engine_seq_free(e, s);
        return NULL;
    }
    return s;
}

void si_engine_seq_free(struct si_engine *e, struct si_ref *s)
{
    if (s == NULL || s == e->ref)
        return;
    free(s->kcache);
    free(s->vcache);
    free(s->logits);
    free(s);
}

int32_t si_engine_n_batch(const struct si_engine *e)
{
    return e->bat.n_batch;
}

bool si_engine_steps_int8(const struct si_engine *e)
{
    return e->p.step_int8;
}

int32_t si_engine_min_batch(const struct si_engine *e)
{
    (void)e;
    return SI__BLAS_MIN_BATCH;
}

int64_t si_engine_seq_bytes(const struct si_engine *e)
{
    const struct si_hparams *hp = &e->m->hp;
    return (int64_t)hp->n_layer * e->ref->p.n_ctx *
               (int64_t)(si_ref_kv_row_bytes(&e->ref->p, hp, false) +
                         si_ref_kv_row_bytes(&e->ref->p, hp, true)) +
           (int64_t)hp->n_vocab * (int64_t)sizeof(float);
}

enum si_prefill_mode si_engine_prefill(const struct si_engine *e)
{
    if (e->p.prefill != SI_PREFILL_AUTO)
        return e->p.prefill;
    /* (the FFN's type: where it has a kernel, most of a batch's bytes do) */
    return e->p.ref.act_quant && si_gemm8_available(e->m->w.layers[0].ffn_up.type)
               ? SI_PREFILL_INT8
               : SI_PREFILL_BLAS;
}

struct si_ref *si_engine_ref(struct si_engine *e)
{
    return e->ref;
}

const char *si_engine_error(const struct si_engine *e)
{
    return e->err_msg;
}

struct si_engine_stats si_engine_get_stats(const struct si_engine *e)
{
    struct si_engine_stats st = e->stats;
    for (int l = 0; e->fl.on && l < e->m->hp.n_layer; l++) {
        const struct si_flash_layer *F = &e->fl.ft->L[l];
        st.flash_loads += F->loads;
        st.flash_hits += F->hits;
        st.flash_bytes += F->bytes;
        st.flash_reads += F->reads;
        st.flash_io_seconds += F->io;
        st.flash_manage_seconds += F->manage;
    }
    for (unsigned w = 0; w < e->n_workers; w++)
        for (int k = 0; k < SI_TASK_KIND_COUNT; k++) {
            st.task_seconds[k] += e->scratch[w].busy[k];
            st.task_count[k] += e->scratch[w].count[k];
        }
    return st;
}

int32_t si_engine_n_slices(const struct si_engine *e)
{
    return e->lay.n_slices;
}

bool si_engine_wo_fused(const struct si_engine *e)
{
    return e->lay.fuse_wo;
}

int64_t si_engine_n_hot(const struct si_engine *e, int l)
{
    return e->L[l].n_hot;
}

int32_t si_engine_neuron_id(const struct si_engine *e, int l, int64_t pos)
{
    return e->L[l].perm[pos];
}

void si_engine_slice_range(const struct si_engine *e, int l, int32_t j, int64_t *begin,
                           int64_t *end)
{
    const struct si__layer_state *L = &e->L[l];
    /* slot of slice j: the hot one is slot 0 when present */
    int32_t slot = L->hot ? j : j - 1;
    if (j == 0 && !L->hot) {
        *begin = *end = 0;
        return;
    }
    if (slot < 0 || slot >= L->nsl) {
        *begin = *end = L->s0[L->nsl];
        return;
    }
    *begin = L->s0[slot];
    *end = L->s0[slot + 1];
}

float si_engine_gate_threshold(const struct si_engine *e, int l)
{
    return e->lay.gthr[l];
}

int64_t si_engine_hot_bytes(const struct si_engine *e)
{
    return e->gpu.hot_bytes;
}
