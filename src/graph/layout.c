/* layout.c - the FFN layout each sparsity mode gives, the fuse policy, the
 * engine's parameter checks, and the GPU reserve they imply
 * (si_engine_gpu_reserve). */
#include "graph/graph.h"

#include "codelets/codelets.h"

#include "flash/store.h"
#include "internal.h"
#include "model/act.h"
#include "model/colblock.h"
#include "model/pack8.h"
#include "model/quants.h"
#include "model/types.h"
#include "placement/placement.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/*
 * Neurons per unit of dense mode's slices: 256 where the FFN width is a
 * multiple of it (and of every layer's ffn_down blocks, of weights and of
 * activations), else
 * the largest such block, else the whole width.  Blocks are 32 or 256
 * values: the largest is a multiple of the others.
 */
static int64_t dense_unit(const struct si_model *m, int64_t t_unit)
{
    int64_t block = t_unit;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const uint32_t t = m->w.layers[l].ffn_down.type;
        const int64_t bw = si_type_get(t)->block, ba = si_type_get(si_act_type(t))->block;
        block = bw > block ? bw : block;
        block = ba > block ? ba : block;
    }
    int64_t unit = 256;
    if (unit % block != 0 || m->hp.n_ff % unit != 0)
        unit = block;
    if (m->hp.n_ff % unit != 0)
        unit = m->hp.n_ff;
    return unit;
}

/* The FFN layout of mode on m (graph.h). */
void si__layout_of(const struct si_model *m, enum si_sparsity mode, struct si_engine *e)
{
    e->lay.sparse = mode != SI_SPARSITY_DENSE;
    e->lay.has_gate = m->hp.ffn_kind != SI_FFN_PLAIN;
    /* Input sparsity: the tasks' column ranges of the transposed copies
     * fall on their blocks (si_k_matvec_t). */
    e->lay.t_unit = 1;
    if (e->p.ref.input_t && e->p.ref.input_thresholds != NULL)
        for (int l = 0; l < m->hp.n_layer; l++) {
            const struct si_layer *L = &m->w.layers[l];
            const struct si_tensor *t[] = {&L->wq_t,
                                           &L->wk_t,
                                           &L->wv_t,
                                           &L->wo_t,
                                           &L->ffn_gate_t,
                                           &L->ffn_up_t,
                                           si_ref_down_copy(m, L)};
            for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
                const int64_t u = t[i]->data == NULL       ? 1
                                  : t[i]->cb_scale != NULL ? SI_CB_GROUP
                                                           : si_type_get(t[i]->type)->block;
                e->lay.t_unit = u > e->lay.t_unit ? u : e->lay.t_unit;
            }
        }
    e->lay.chunk = dense_unit(m, e->lay.t_unit);
    /* Predictor mode reads a chosen neuron's rows together: all in its
     * record.  Gate mode reads every gating row: those apart, dense. */
    e->lay.pre_sep = mode == SI_SPARSITY_GATE;
}

/* Whether every kv-head group's query columns fall on the blocks of every
 * layer's Wo (si_ref_matvec_cols' condition). */
static bool wo_cols_on_blocks(const struct si_engine *e)
{
    const struct si_hparams *hp = &e->m->hp;
    const int64_t q = (int64_t)(hp->n_head / hp->n_head_kv) * hp->head_dim;
    for (int32_t l = e->pipe.l0; l < e->pipe.l1; l++) {
        const struct si_type_traits *tt = si_type_get(e->w->layers[l].wo.type);
        if (tt == NULL || tt->block <= 0)
            return false;
        for (int32_t j = 0; j <= e->dec.ng; j++)
            if (e->dec.a_g[j] * q % tt->block != 0)
                return false;
    }
    return true;
}

/*
 * The fuse policy: which small tasks the FFN slice tasks take over (decode.c's
 * submit_ffn, codelets/ffn.c).  fuse_out: with only CPU FFN tasks that take
 * the FFN input first hand, each computes it (attn_out's residual and norm:
 * n_embd values) instead of waiting for an attn_out task: one dependency less
 * per layer.  fuse_pred: predictor mode with CPU slices only, each slice task
 * runs the predictor for its own neurons (fc1 whole, its rows of fc2), so
 * neither a predictor task nor the wait for it sits between a layer's
 * attention and its FFN (docs/measurements.md); SI_NO_FUSE_PRED=1 keeps the
 * predictor task (same results, for comparisons).  Lookahead predictors
 * (model.h) read the layer's input instead: their task runs beside the
 * attention.  gpu_twin (the graph a GPU gets, its CPU worker standing in)
 * fuses nothing, as a CUDA hot slice does not; nor does the flash tier.
 * The FFN slices read the ffn_in of the layers whose attention runs on the
 * GPU, so this waits for the plan's choice of them (n_attn_gpu); redux is the
 * merge as asked: dense mode drops e->p.redux (nothing for it to add), yet a
 * redux asked for still keeps attn_out a task of its own.  fuse_wo: in
 * the sparse layouts with fuse_out and several cold slices, each attention
 * group task also multiplies its heads' columns of Wo into a partial
 * product and the FFN slices add the groups' products in group order, so a
 * layer has no attn_o tasks and one fork-join less (docs/measurements.md);
 * a step of shared contexts gives its decoding tokens the same sums
 * (prefill_attn.c's bao_products).  With one cold slice the sparse modes
 * keep the reference's order, and its bits.  Dense mode keeps Wo's row
 * slices (each row one dot as the reference computes it), and so does
 * input sparsity (its transposed copies).  SI_FUSE_WO=0 turns it off (the
 * graph of before, for comparisons).
 */
void si__fuse_of(struct si_engine *e, bool redux)
{
    const struct si_engine_params *p = &e->p;
    e->lay.fuse_pred = p->mode == SI_SPARSITY_PREDICTOR && !e->gpu.cuda_hot && !p->gpu_twin &&
                       !e->fl.on && e->m->pred_input != SI_PRED_LAYER &&
                       getenv("SI_NO_FUSE_PRED") == NULL;
    e->lay.fuse_out = e->dec.na > 1 && !e->gpu.cuda_hot && !p->gpu_twin && !e->fl.on && !redux &&
                      (p->mode != SI_SPARSITY_PREDICTOR || e->lay.fuse_pred) &&
                      e->gpu.n_attn_gpu == 0;
    const char *fw = getenv("SI_FUSE_WO");
    e->lay.fuse_wo = (fw == NULL || strcmp(fw, "0") != 0) && e->lay.fuse_out && e->lay.sparse &&
                     e->lay.n_slices > 1 && e->dec.ng > 1 && e->dec.opart != NULL &&
                     p->ref.input_thresholds == NULL && wo_cols_on_blocks(e);
    /* The in-place graph: CPU workers alone, no flash tier (its loads),
     * redux (StarPU's reductions), pipeline (StarPU-MPI's transfers) or
     * predictor task (it runs beside the attention); SI_INPLACE=0 keeps
     * the graph of buffers, for comparisons. */
    const char *ip = getenv("SI_INPLACE");
    e->lay.inplace = (ip == NULL || strcmp(ip, "0") != 0) && e->gpu.cuda_node < 0 &&
                     si__cpu_graph(e) && !p->gpu_twin && !e->fl.on && !redux &&
                     e->pipe.nranks <= 1 && (p->mode != SI_SPARSITY_PREDICTOR || e->lay.fuse_pred);
}

/* How layer l's FFN rows are stored under e's layout (graph.h). */
void si__ffn_fmt_of(const struct si_engine *e, int l, struct si__ffn_fmt *f)
{
    const struct si_layer *W = &e->m->w.layers[l];
    memset(f, 0, sizeof *f);
    f->gu_type = W->ffn_up.type;
    f->gu_row = W->ffn_up.row_bytes;
    f->gate_off = f->up_off = -1;
    if (!e->lay.sparse)
        return;
    /* down_t rows: the file's, or ffn_down transposed (F32, F16 exact;
     * other types rounded to F16) */
    if (W->ffn_down_t.data != NULL) {
        f->dt_type = W->ffn_down_t.type;
        f->dt_row = W->ffn_down_t.row_bytes;
    } else {
        uint32_t t = W->ffn_down.type;
        f->dt_type = t == SI_TYPE_F32 || t == SI_TYPE_F16 ? t : SI_TYPE_F16;
        si_type_row_size(f->dt_type, e->m->hp.n_embd, &f->dt_row);
    }
    size_t off = 0;
    if (e->lay.has_gate && !e->lay.pre_sep) {
        f->gate_off = (ptrdiff_t)off;
        off += f->gu_row;
    }
    if (e->lay.has_gate || !e->lay.pre_sep) {
        f->up_off = (ptrdiff_t)off;
        off += f->gu_row;
    }
    f->dt_off = off;
    f->rec_bytes = (f->dt_off + f->dt_row + 31) / 32 * 32;
    if (e->p.flash != NULL) {
        /* the store's records, which the cache holds as they are on disk
         * (one format for every layer: si__check_params) */
        const struct si_flash_format *s = &e->p.flash->f;
        f->gate_off = f->gate_off >= 0 ? (ptrdiff_t)s->gate_off : -1;
        f->up_off = f->up_off >= 0 ? (ptrdiff_t)s->up_off : -1;
        f->dt_off = s->dt_off;
        f->rec_bytes = s->rec_bytes;
    }
}

/* Bytes the GPU holds per hot neuron (sparse) or per hot unit of neurons
 * (dense): the handles' children of the hot slice (data.c's register_layer,
 * codelets/ffn.c's ffn_cuda), in dense mode its output (the activations)
 * too; with types mixed across layers, the widest layer's (an upper bound
 * for the others: the budget holds). */
static int64_t hot_unit_bytes(const struct si_engine *e)
{
    /* the widest layer's: the plan budgets one size of unit for all */
    int64_t most = 0;
    for (int l = 0; l < e->m->hp.n_layer; l++) {
        struct si__ffn_fmt f;
        si__ffn_fmt_of(e, l, &f);
        const int64_t b =
            e->lay.sparse ? (int64_t)f.rec_bytes + (e->lay.pre_sep ? (int64_t)f.gu_row : 0) +
                                (int64_t)sizeof(float) + /* record, gating row, bias, */
                                (e->p.mode == SI_SPARSITY_PREDICTOR ? (int64_t)sizeof(int32_t) : 0)
                          : e->lay.chunk * ((e->lay.has_gate ? 2 : 1) * (int64_t)f.gu_row +
                                            2 * (int64_t)sizeof(float));
        most = b > most ? b : most;
    }
    return most;
}

int64_t si__n_ctx_of(const struct si_engine *e)
{
    const struct si_hparams *hp = &e->m->hp;
    return e->p.ref.n_ctx > 0 ? e->p.ref.n_ctx : hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
}

/* Tokens per prefill batch (engine.c's rule in init_layout, before it has run). */
static int64_t batch_of(const struct si_engine *e)
{
    if (e->bat.n_batch > 0)
        return e->bat.n_batch;
    return e->p.flash != NULL || e->p.pipe ? 1 : e->p.n_batch > 0 ? e->p.n_batch : 128;
}

/*
 * The reserve, from what ffn_cuda (codelets/ffn.c) reads and writes (the only CUDA task):
 * the FFN input (ffn_in), the "every neuron" index list (iota, n_ff int32,
 * registered whole), each layer's hot partial output in sparse modes (one
 * row of n_embd floats, reserved for every layer, as any may get a hot
 * slice; dense mode's, the hot activations, count with the hot units), and
 * the task's scratch (2 n_ff floats), in the sparse layouts a prefill batch's
 * FFN input and hot output (bffn_cuda, codelets/prefill.c); then the attention of the first
 * n_attn_gpu layers (attn_gpu.c: weights, KV caches, x and the task's
 * scratch).  The other layers' attention, the predictor and the LM head stay
 * on the CPU in this engine: their bytes go to cpu_bytes.
 */
void si__reserve_of(const struct si_engine *e, struct si_gpu_reserve *r)
{
    const struct si_model *m = e->m;
    const struct si_hparams *hp = &m->hp;
    memset(r, 0, sizeof *r);
    const int64_t d = hp->n_embd, ff = hp->n_ff, L = hp->n_layer;
    int64_t att = 0, att_gpu = 0, pred = 0;
    for (int l = 0; l < L; l++) {
        const struct si_layer *W = &m->w.layers[l];
        const int64_t b = (int64_t)(W->wq.nbytes + W->wk.nbytes + W->wv.nbytes + W->wo.nbytes);
        *(l < e->gpu.n_attn_gpu ? &att_gpu : &att) += b;
        if (e->p.mode == SI_SPARSITY_PREDICTOR)
            pred += (int64_t)(W->fc1.nbytes + W->fc2.nbytes);
    }
    const int64_t n_ctx = si__n_ctx_of(e);
    const int64_t kv_layer = n_ctx * (int64_t)(si_ref_kv_row_bytes(&e->p.ref, hp, false) +
                                               si_ref_kv_row_bytes(&e->p.ref, hp, true));
    r->cpu_bytes[SI_GPU_ATTENTION] = att;
    r->bytes[SI_GPU_ATTENTION] = att_gpu;
    r->cpu_bytes[SI_GPU_PREDICTOR] = pred;
    r->cpu_bytes[SI_GPU_KV_CACHE] = (L - e->gpu.n_attn_gpu) * kv_layer;
    r->bytes[SI_GPU_KV_CACHE] = e->gpu.n_attn_gpu * kv_layer;
    r->cpu_bytes[SI_GPU_LM_HEAD] = (int64_t)m->w.output.nbytes;
    const int64_t rows = e->lay.sparse ? 1 : 0;
    r->bytes[SI_GPU_BUFFERS] =
        (int64_t)sizeof(float) * (d + L * rows * d) + (int64_t)sizeof(int32_t) * ff;
    if (e->lay.sparse && batch_of(e) > 1) /* a batch's FFN input and the hot slice's output */
        r->bytes[SI_GPU_BUFFERS] += 2 * (int64_t)sizeof(float) * batch_of(e) * d;
    r->bytes[SI_GPU_WORKSPACE] = (int64_t)sizeof(float) * 2 * ff;
    if (e->gpu.n_attn_gpu > 0) /* x, and the attention task's scratch */
        r->bytes[SI_GPU_WORKSPACE] += (int64_t)sizeof(float) * (d + si__attn_gpu_scratch_floats(m));
    /* The buffers above and each hot layer's small ones (bias, index list,
     * partial output) are carved from one chunk of StarPU's allocator; the
     * plan adds to it when they need more (engine.c's plan_neurons). */
    r->bytes[SI_GPU_ALLOCATOR] = SI__GPU_CHUNK;
    for (int i = 0; i < SI_GPU_ITEM_COUNT; i++)
        r->total += r->bytes[i];
    r->unit_bytes = hot_unit_bytes(e);
    r->unit_neurons = e->lay.sparse ? 1 : e->lay.chunk;
    r->any_neurons = e->lay.sparse;
}

/*
 * StarPU's CUDA allocator (1.4, datawizard/malloc.c): a buffer of at most
 * 4 MiB is a run of 16 KiB blocks inside a 32 MiB chunk, and the node's used
 * memory (starpu_memory_get_used, which the engine holds to the budget)
 * counts whole chunks; bigger buffers are allocated alone.  A chunk's first
 * block is its list head, and a run may not fit the holes the others left:
 * counting 1,792 of its 2,048 blocks as usable leaves room for the largest
 * run (256 blocks) in any chunk.
 */
#define SI__GPU_CHUNK_MAX (SI__GPU_CHUNK / 8)
#define SI__GPU_BLOCK ((int64_t)16 << 10)
#define SI__GPU_CHUNK_BLOCKS ((SI__GPU_CHUNK - SI__GPU_CHUNK_MAX) / SI__GPU_BLOCK)

void si__gpu_bytes_add(struct si__gpu_bytes *g, int64_t bytes)
{
    if (bytes <= 0)
        return;
    if (bytes > SI__GPU_CHUNK_MAX)
        g->alone += bytes;
    else
        g->blocks += (bytes + SI__GPU_BLOCK - 1) / SI__GPU_BLOCK;
}

int64_t si__gpu_bytes_total(const struct si__gpu_bytes *g)
{
    const int64_t chunks = (g->blocks + SI__GPU_CHUNK_BLOCKS - 1) / SI__GPU_CHUNK_BLOCKS;
    return g->alone + chunks * SI__GPU_CHUNK;
}

/* The buffers every hot layer shares (see si__gpu_accounted). */
static void gpu_shared(const struct si_engine *e, struct si__gpu_bytes *g)
{
    const struct si_hparams *hp = &e->m->hp;
    si__gpu_bytes_add(g, (int64_t)sizeof(float) * hp->n_embd);     /* ffn_in */
    si__gpu_bytes_add(g, (int64_t)sizeof(int32_t) * hp->n_ff);     /* iota */
    si__gpu_bytes_add(g, (int64_t)sizeof(float) * 2 * hp->n_ff);   /* scratch */
    if (e->lay.sparse && batch_of(e) > 1) { /* a batch's FFN input, the hot slice's output */
        si__gpu_bytes_add(g, (int64_t)sizeof(float) * batch_of(e) * hp->n_embd);
        si__gpu_bytes_add(g, (int64_t)sizeof(float) * batch_of(e) * hp->n_embd);
    }
}

int64_t si__gpu_planned(const struct si_engine *e, const int64_t *n_hot)
{
    const struct si_hparams *hp = &e->m->hp;
    struct si__gpu_bytes g = {0, 0};
    bool any = false;
    for (int l = 0; l < hp->n_layer; l++) {
        const int64_t n = n_hot[l];
        if (n <= 0)
            continue;
        any = true;
        struct si__ffn_fmt f;
        si__ffn_fmt_of(e, l, &f);
        if (e->lay.sparse) {
            if (e->lay.pre_sep)
                si__gpu_bytes_add(&g, n * (int64_t)f.gu_row);
            si__gpu_bytes_add(&g, n * (int64_t)f.rec_bytes);
            if (e->p.mode == SI_SPARSITY_PREDICTOR)
                si__gpu_bytes_add(&g, n * (int64_t)sizeof(int32_t));
            si__gpu_bytes_add(&g, (int64_t)sizeof(float) * hp->n_embd); /* its output */
        } else {
            if (e->lay.has_gate)
                si__gpu_bytes_add(&g, n * (int64_t)f.gu_row);
            si__gpu_bytes_add(&g, n * (int64_t)f.gu_row);
            si__gpu_bytes_add(&g, n * (int64_t)sizeof(float)); /* its activations */
        }
        si__gpu_bytes_add(&g, n * (int64_t)sizeof(float)); /* up_b */
    }
    if (any)
        gpu_shared(e, &g);
    /* The GPU layers' attention (attn_gpu.c), each adding in the partial
     * outputs of the layer before: at most a slice per worker and the hot
     * one (data.c counts the real ones). */
    for (int l = 0; l < e->gpu.n_attn_gpu; l++)
        si__attn_gpu_layer_bytes(e, l, e->lay.n_slices + 1, &g);
    if (e->gpu.n_attn_gpu > 0)
        si__attn_gpu_shared(e, &g);
    return si__gpu_bytes_total(&g);
}

bool si__cuda_type(uint32_t t)
{
    return t == SI_TYPE_F32 || t == SI_TYPE_F16 || t == SI_TYPE_Q8_0 || t == SI_TYPE_Q4_0 ||
           t == SI_TYPE_Q4_1 || t == SI_TYPE_Q4_K || t == SI_TYPE_Q5_K || t == SI_TYPE_Q6_K;
}

/* Check the parameters against the model and the workers. */
int si__check_params(const struct si_model *m, const struct si_engine_params *p, unsigned ncuda,
                     char *err, size_t err_size)
{
    const struct si_hparams *hp = &m->hp;
    if ((unsigned)p->mode > SI_SPARSITY_PREDICTOR)
        return si__errf(err, err_size, SI_E_INVALID, "unknown sparsity mode %d", (int)p->mode);
    if (p->pipe && (p->vram_budget > 0 || p->placement != NULL || p->flash != NULL || p->redux ||
                    p->ref.input_thresholds != NULL))
        return si__errf(err, err_size, SI_E_UNSUPPORTED,
                        "across MPI ranks the engine runs on CPU workers in memory so far (no "
                        "VRAM budget, placement, flash tier, redux or input sparsity)");
    if (p->ref.input_thresholds != NULL) {
        /* The sparse modes' FFN reads neuron records: its input and its
         * activations keep the gate's or the predictor's sparsity. */
        for (int l = 0; p->mode != SI_SPARSITY_DENSE && l < hp->n_layer; l++)
            if (si_ref_input_threshold(&p->ref, l, SI_INPUT_FFN) > 0.0f ||
                si_ref_input_threshold(&p->ref, l, SI_INPUT_DOWN) > 0.0f)
                return si__errf(err, err_size, SI_E_INVALID,
                                "input sparsity on the FFN's inputs needs dense mode (in %s mode "
                                "it applies to the attention's products)",
                                si_sparsity_name(p->mode));
        if (p->mode == SI_SPARSITY_DENSE && ncuda > 0 && p->vram_budget > 0)
            return si__errf(err, err_size, SI_E_UNSUPPORTED,
                            "input sparsity runs the FFN on CPU workers (no --vram-budget with "
                            "it in dense mode)");
    }
    if ((unsigned)p->prefill >= SI_PREFILL_COUNT)
        return si__errf(err, err_size, SI_E_INVALID, "unknown prefill mode %d", (int)p->prefill);
    if (p->prefill == SI_PREFILL_INT8 && si_gemm8_missing() != NULL)
        return si__errf(err, err_size, SI_E_UNSUPPORTED,
                        "prefill int8 needs the batched integer kernel (AVX-512 VNNI), and %s "
                        "(auto, exact and blas run on every CPU)",
                        si_gemm8_missing());
    if (p->mode == SI_SPARSITY_PREDICTOR && !m->has_predictor)
        return si__errf(err, err_size, SI_E_INVALID,
                        "predictor mode: the model has no predictor tensors (blk.N.fc1/fc2)");
    if (p->n_slices < 0 || p->n_slices > SI__MAX_SLICES)
        return si__errf(err, err_size, SI_E_INVALID, "slices: %d is outside 0..%d", p->n_slices,
                        SI__MAX_SLICES);
    if (p->vram_budget < 0)
        return si__errf(err, err_size, SI_E_INVALID, "negative VRAM budget");
    if (p->placement != NULL && p->mode == SI_SPARSITY_DENSE)
        return si__errf(err, err_size, SI_E_INVALID,
                        "a placement needs the gate or predictor sparsity mode (dense mode keeps "
                        "the file's neuron order)");
    if (p->placement != NULL &&
        (p->placement->n_layer != hp->n_layer || p->placement->n_ff != hp->n_ff))
        return si__errf(err, err_size, SI_E_INVALID,
                        "placement is for %d layers of %d neurons, the model has %d of %d",
                        p->placement->n_layer, p->placement->n_ff, hp->n_layer, hp->n_ff);
    if (p->gate_threshold < 0.0f || !isfinite(p->gate_threshold))
        return si__errf(err, err_size, SI_E_INVALID, "gate threshold must be finite and >= 0");
    if (p->profile != NULL && (p->profile->n_layer != hp->n_layer || p->profile->n_ff != hp->n_ff))
        return si__errf(err, err_size, SI_E_INVALID,
                        "profile is for %d layers of %d neurons, the model has %d of %d",
                        p->profile->n_layer, p->profile->n_ff, hp->n_layer, hp->n_ff);
    /* Each layer may have its own types (si__ffn_fmt); within a layer a
     * neuron's gate and up rows are dotted with one converted input. */
    for (int l = 0; l < hp->n_layer; l++) {
        const struct si_layer *V = &m->w.layers[l];
        if (hp->ffn_kind != SI_FFN_PLAIN && V->ffn_gate.type != V->ffn_up.type)
            return si__errf(err, err_size, SI_E_UNSUPPORTED,
                            "the engine needs ffn_gate and ffn_up of one type in a layer (layer "
                            "%d: %s, %s); --engine ref runs this model",
                            l, si_type_name(V->ffn_gate.type), si_type_name(V->ffn_up.type));
    }
    if (p->redux && ncuda > 0 && (p->vram_budget > 0 || p->placement != NULL))
        return si__errf(err, err_size, SI_E_UNSUPPORTED,
                        "redux merging runs on CPU workers only (no --vram-budget with it)");
    if (ncuda > 0 && (p->vram_budget > 0 || p->placement != NULL) && !p->hot_on_cpu) {
        for (int l = 0; l < hp->n_layer; l++) {
            const struct si_layer *V = &m->w.layers[l];
            uint32_t dt = p->mode == SI_SPARSITY_DENSE ? V->ffn_down.type
                          : V->ffn_down_t.data != NULL ? V->ffn_down_t.type
                                                       : SI_TYPE_F16;
            if (!si__cuda_type(V->ffn_up.type) || !si__cuda_type(dt))
                return si__errf(err, err_size, SI_E_UNSUPPORTED,
                                "no CUDA FFN kernels for %s/%s weights (layer %d; F32, F16, Q8_0, "
                                "Q4_0, Q4_1, Q4_K, Q5_K, Q6_K have them): run without "
                                "--vram-budget",
                                si_type_name(V->ffn_up.type), si_type_name(dt), l);
        }
    }
    if (p->flash != NULL) {
        if (p->mode == SI_SPARSITY_DENSE)
            return si__errf(err, err_size, SI_E_INVALID,
                            "the flash tier needs the gate or predictor sparsity mode (dense "
                            "mode computes every neuron of every layer)");
        if (p->redux)
            return si__errf(err, err_size, SI_E_UNSUPPORTED,
                            "redux merging is not available with the flash tier");
        if (!(p->flash_pin >= 0.0f && p->flash_pin <= 1.0f))
            return si__errf(err, err_size, SI_E_INVALID, "flash pin share %g is outside [0, 1]",
                            (double)p->flash_pin);
        if (p->flash_window < 0 || p->flash_cache < 0 || p->dram_budget < 0)
            return si__errf(err, err_size, SI_E_INVALID,
                            "negative flash window, cache size or DRAM budget");
        if (p->flash->f.n_layer != hp->n_layer || p->flash->f.n_ff != hp->n_ff ||
            p->flash->f.n_embd != hp->n_embd)
            return si__errf(err, err_size, SI_E_INVALID, "the flash store is for another model");
        /* the store's one record format for every layer (si__ffn_fmt_of) */
        for (int l = 0; l < hp->n_layer; l++)
            if (m->w.layers[l].ffn_up.type != p->flash->f.gu_type)
                return si__errf(err, err_size, SI_E_INVALID,
                                "the flash store holds %s rows, layer %d's ffn_up is %s: the "
                                "store is for another model",
                                si_type_name(p->flash->f.gu_type), l,
                                si_type_name(m->w.layers[l].ffn_up.type));
    }
    return SI_OK;
}

int si_engine_gpu_reserve(const struct si_model *m, const struct si_engine_params *p,
                          struct si_gpu_reserve *r, char *err, size_t err_size)
{
    memset(r, 0, sizeof *r);
    int rc = si__check_params(m, p, 0, err, err_size);
    if (rc != SI_OK)
        return rc;
    struct si_engine e = {.m = m, .p = *p};
    si__layout_of(m, p->mode, &e);
    /* attention on the GPU when asked for by number (the engine's automatic
     * choice depends on the budget: `place` leaves it the neurons') */
    const char *why = p->attn_gpu > 0 ? si__attn_gpu_unable(m, p) : NULL;
    if (why != NULL)
        return si__errf(err, err_size, SI_E_UNSUPPORTED, "attention on the GPU: %s", why);
    if (p->attn_gpu > 0)
        e.gpu.n_attn_gpu = p->attn_gpu < m->hp.n_layer ? p->attn_gpu : m->hp.n_layer;
    si__reserve_of(&e, r);
    return SI_OK;
}
