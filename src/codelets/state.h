/*
 * state.h - the engine's state, as its tasks see it.
 *
 * The graph (src/graph/) builds this state at init, registers its arrays
 * as StarPU data handles and submits tasks on them; the codelets
 * (src/codelets/, listed in codelets.h) run on it: each task gets the
 * engine and its layer and slice (struct si__task_arg) and reaches its
 * data through its buffers, reading the layout (types, strides, slice
 * boundaries) from here.  Scratch memory is per worker.
 */
#ifndef SI_CODELETS_STATE_H
#define SI_CODELETS_STATE_H

#include "codelets/engine_types.h"
#include "config.h"   /* SI_USE_CUDA: the codelets' CUDA functions */
#include "internal.h" /* si__now */
#include "model/forward.h"
#include "model/model.h"

#include <starpu.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct si_flash_tier; /* flash/tier.h */

#define SI__MAX_SLICES 256
#define SI__DT_TILE 64 /* down_t rows dequantized at a time in prefill */
#define SI__BLAS_MIN_BATCH 8 /* smaller batches: the reference's dots (see codelets/prefill.c) */

/* The vectors of a layer's attention on the GPU (si__layer_state.aux). */
enum si__aux {
    SI__AUX_ATTN_NORM,
    SI__AUX_ATTN_NORM_B,
    SI__AUX_BQ,
    SI__AUX_BK,
    SI__AUX_BV,
    SI__AUX_BO,
    SI__AUX_FFN_NORM,
    SI__AUX_FFN_NORM_B,
    SI__AUX_PREV_DOWN_B, /* the layer before's down bias, for the carried residual */
    SI__AUX_COUNT
};

/* Scratch and counters of one worker. */
struct si__scratch {
    /* Attention tasks: q, k, v and att laid out whole (each task fills its
     * heads' parts), si_ref_attn_group's scratch, a residual, the FFN
     * output being merged, a normalised input, norm scratch. */
    float *aq, *ak, *av, *aatt, *ascr, *xl, *xf, *xn, *xo, *tmp;
    float *h;       /* (n_ff) the slice's neuron activations */
    float *g;       /* (n_ff) gate mode: the slice's gating dots */
    int32_t *ix;    /* (n_ff) the slice's active positions */
    int32_t *sx;    /* (widest input) input sparsity: a product's non-zero inputs */
    float *sv;      /* (widest input) and their values (si__input_in) */
    float *y;       /* (n_ff / chunk + 1, n_embd) partial rows (redux mode) */
    void *xq;       /* the FFN input converted for the up and gate dots */
    void *hq;       /* the activations converted for the down dots */
    float *bg, *bu; /* (n_batch, n_ff) prefill: gate and up products */
    void *gemm;     /* si_k_gemm's dequantization tile */
    float *hx;      /* (n_batch, n_embd) prefill: the attention's or the LM head's
                     * normalised inputs, the attention's projection */
    float *bqkv;    /* (n_batch, q + 2 kv widths) prefill: a group's q, k, v rows,
                     * or the whole attention output */
    float *dt;      /* (SI__DT_TILE, n_embd) prefill: down_t rows as floats, or
                     * 8 rows of a matrix packed for qgemm (at least 8 of the
                     * longest rows' bytes) */
    double busy[SI_TASK_KIND_COUNT]; /* seconds inside task functions, by kind */
    int64_t count[SI_TASK_KIND_COUNT];
};

/*
 * How one layer's FFN rows are stored (graph/layout.c's si__ffn_fmt_of):
 * each layer has its own, as files mix types across layers (Q4_K_M keeps
 * ffn_down in Q6_K in some layers, Q4_K in others).  Dense mode reads the
 * file's tensors (gu_type; ffn_down's own type); the sparse layouts read
 * neuron records: the neuron's gate and up rows, then its down_t row.
 */
struct si__ffn_fmt {
    uint32_t gu_type;   /* type of the gate and up rows (one type in a layer) */
    size_t gu_row;      /* bytes of a gate or up row */
    uint32_t dt_type;   /* sparse: type of the down_t rows */
    size_t dt_row;      /* sparse: bytes of a down_t row */
    size_t rec_bytes;   /* sparse: bytes of a neuron record */
    ptrdiff_t gate_off, up_off; /* sparse: offsets in a record, -1: not there */
    size_t dt_off;      /* sparse: offset of the down_t row in a record */
};

/*
 * One layer's FFN.  Its neurons are in slices: slots 0 .. nsl - 1 of the
 * arrays below are the non-empty slices in order, the hot one first when
 * hot is set.  Handles whose name ends in _c are the children of the
 * handle of the same name (one per slot).
 */
struct si__layer_state {
    struct si__ffn_fmt f; /* how its rows are stored */
    int64_t n_hot;
    bool hot;         /* slot 0 is the hot slice */
    int32_t nsl;      /* non-empty slices */
    int64_t *s0;      /* (nsl + 1) slice boundaries, in neuron positions */
    int64_t *pre_pk;  /* (nsl) gate mode: the slice's first pre_pk gating rows are
                       * packed 8 at a time from its start (graph/weights.c) */
    int32_t *rows;    /* (nsl) partial-output rows of each slice (sparse) */
    int32_t *perm;    /* (n_ff) position -> file neuron id */
    int64_t *active;  /* (nsl) neurons each slice computed for the last token */
    int64_t *rd;      /* (nsl) bytes of weights each slice's task read for it */
    uint32_t *len_n;  /* (nsl) neurons per slice (filter lengths) */
    uint32_t *len_p;  /* (nsl) floats of partial output per slice (dense: its
                       * neurons' activations) */

    void *rec;        /* sparse layouts: (n_ff, f.rec_bytes) neuron records */
    void *pre;        /* gate mode: (n_ff, f.gu_row) the gating rows, position order */
    float *up_b;      /* (n_ff) up bias in position order (zeros without one) */
    void *fc2p;       /* predictor fc2 rows in position order */
    int64_t fc2_pk;   /* its first rows packed 8 at a time (graph/weights.c) */
    int32_t *idx;     /* (n_ff) predictor mode: each slice's active positions */
    float *part;      /* the slices' partial outputs: (sum of rows, n_embd), or
                       * dense, the n_ff activations */
    float *y;         /* (n_embd) redux mode: the layer's FFN output */

    starpu_data_handle_t h_w[4], h_k, h_v;           /* attention */
    /* Its attention runs on the GPU (graph/attn_gpu.c): the weights, the
     * caches and aux stay there.  aux: the layer's norm weights and
     * biases as floats, SI__AUX_* at aux_off (-1: the model has none). */
    bool attn_gpu;
    float *aux;
    int64_t aux_off[SI__AUX_COUNT];
    int64_t aux_n; /* floats in aux (at least 1) */
    starpu_data_handle_t h_aux;
    starpu_data_handle_t *h_k_c, *h_v_c; /* (ng) the caches' columns of each kv-head group */
    size_t *kv_cols;                     /* (ng + 1) their byte boundaries in a cache row */
    starpu_data_handle_t h_gate, h_up, h_down, h_rec; /* FFN weights */
    starpu_data_handle_t h_upb, h_idx, h_part, h_fc1, h_fc2, h_y;
    starpu_data_handle_t *h_gate_c, *h_up_c, *h_rec_c, *h_upb_c, *h_idx_c, *h_part_c;
    starpu_data_handle_t *h_down_c; /* (nd) dense: ffn_down's row blocks */

    /* The flash tier (its cache and load arrays are the tier's, flash/tier.h). */
    float *gact;       /* gate mode: (n_ff) act(gate) of each passing neuron
                        * (the plain kind: its activation), by position */
    starpu_data_handle_t h_cache;
    starpu_data_handle_t h_gact, *h_gact_c; /* gact, and its parts by slice */

    char name_attn[24], name_pred[24], name_merge[24], name_load[24];
    char (*name_gmask)[32]; /* (nsl) */
    char name_battn[32], name_bmerge[24], name_aout[24];
    char (*name_agrp)[32]; /* (ng) */
    char (*name_bagrp)[40]; /* (nr) attn_batch_L.r */
    char (*name_bakv)[40];  /* (ng) */
    char (*name_bacore)[64]; /* (nc * nr) */
    char (*name_bao)[40];    /* (nr) */
    char (*name_ao)[32];   /* (na) */
    char (*name_apos)[32]; /* (na) */
    char (*name_ffn)[32];  /* (nsl) */
    char (*name_bffn)[48]; /* (nsl) */
    char (*name_down)[32], (*name_bdown)[40]; /* (nd) dense */
};

/*
 * The engine's state, grouped by concern.  The codelets read the layout
 * (lay, dec, down, bat) and write their outputs through their buffers;
 * graph/ builds it all at init (engine.c's stages) and owns the groups the
 * tasks never touch (own, pipe, most of gpu).
 */

/* How the model's layers are cut for the tasks (graph/layout.c). */
struct si__layout {
    bool sparse;        /* neuron records (gate, predictor) vs file tensors (dense) */
    bool dense_records; /* dense mode on a file without ffn_down: p.mode is gate,
                         * without thresholds (si_engine_init) */
    int32_t n_slices;   /* cold slices per layer */
    int64_t chunk;      /* dense: slices are whole units of this many neurons */
    bool pre_sep;       /* gate mode: the rows that gate a neuron (gate, or
                         * up for the plain kind) in their own array, read
                         * densely, instead of in the records */
    bool has_gate;
    int64_t t_unit;     /* input sparsity: the block of the transposed copies
                         * the products read (1: none); the tasks' column
                         * ranges fall on it */
    float *gthr;        /* (n_layer) gate mode's threshold of each layer */
    float *zeros;       /* (n_ff) the up bias of files without one */
    int32_t *iota;      /* (n_ff) 0, 1, ...: the "every neuron" index list */
    bool fuse_out;      /* attn_out's work done by each FFN slice task */
    bool fuse_wo;       /* sparse layouts with fuse_out and several cold
                         * slices (not SI_FUSE_WO=0): each attention group
                         * task multiplies its heads' columns of Wo (a
                         * partial product, dec.opart), which the FFN slices
                         * add up: no attn_o tasks (unless split over
                         * positions; graph/layout.c) */
    bool fuse_pred;     /* predictor mode: each CPU slice task predicts its own
                         * neurons (no predictor task) */
    bool inplace;       /* decoded tokens take the in-place graph (codelets/task.h;
                         * graph/layout.c's si__fuse_of says where) */
};

/* The weights the engine holds itself: own_w, a copy of the model's whose
 * matrices read whole are packed 8 rows at a time (graph/weights.c) into
 * the n_packed buffers of packed (graph/ only). */
struct si__own_weights {
    struct si_weights *own_w;
    void **packed;
    int32_t n_packed;
};

/* A handle whose parts are joined (StarPU's unpartition) for tasks that
 * read them all (si__joins): h and its n children c; NULL h, none. */
struct si__joined {
    starpu_data_handle_t h;
    unsigned n;
    starpu_data_handle_t *c;
};

/* Join h's n children c into h (unpartition), recorded in j. */
static inline void si__join(struct si__joined *j, starpu_data_handle_t h, unsigned n,
                            starpu_data_handle_t *c)
{
    starpu_data_unpartition_submit(h, n, c, STARPU_MAIN_RAM);
    *j = (struct si__joined){h, n, c};
}

/* Split what j joined again (partition), if anything. */
static inline void si__unjoin(struct si__joined *j)
{
    if (j->h == NULL)
        return;
    starpu_data_partition_submit(j->h, j->n, j->c);
    j->h = NULL;
}

/* One token's graph (graph/decode.c): its activations and the splits of
 * attention and the LM head. */
struct si__decode_state {
    starpu_data_handle_t h_x, h_ffn_in, h_logits, h_out, h_iota, h_hscratch;
    /* Attention split over the workers (na > 1): ng tasks attn_L.j, each
     * for the kv heads [a_g[j], a_g[j+1]) (ng <= n_head_kv), then na row
     * slices of Wo's output [a_o[j], a_o[j+1]) and of the LM head's
     * [a_h[j], a_h[j+1]). */
    int32_t na, ng;
    int64_t *a_g;                     /* (ng + 1) kv-head boundaries */
    int64_t *a_o, *a_h;               /* (na + 1) row boundaries */
    char (*name_head)[24];            /* (na) */
    uint32_t *head_len;               /* (na) rows of each head slice */
    uint32_t *att_len;                /* (ng) floats of each group's attention output */
    starpu_data_handle_t *h_logits_c; /* (na) children of h_logits */
    float **o;                        /* (na) slot outputs: parts of o_all */
    float *o_all;                     /* Wo's product, n_embd floats */
    uint32_t *o_len;                  /* (na) the parts' lengths */
    float *x2;                        /* (n_embd) a layer's input residual (attn_L.0 -> attn_out) */
    starpu_data_handle_t *h_o, h_o_all, h_att, *h_att_c, h_x2, h_xb3;
    struct si__joined o_join; /* h_o_all (or h_opart) whole (attn.c's join_o) */
    /* fuse_wo: group j's partial product with Wo's columns of its heads,
     * row j of opart (ng, n_embd), child j of h_opart. */
    float *opart;
    uint32_t *opart_len; /* (ng) n_embd each */
    starpu_data_handle_t h_opart, *h_opart_c;
    struct si__joined carry;  /* the carried FFN output's parts, joined (merge.c) */
    /* Attention over SI_ATTN_SPLIT_MIN positions or more, split over
     * positions too (attn.c): up to na tasks attn_pos_L.p, each writing the
     * partial results of its chunks into part[p] (part_cap floats). */
    float **part;
    size_t part_cap;
    starpu_data_handle_t *h_part;
};

/* Dense mode's down projection in nd blocks of output rows, block k
 * [dn[k], dn[k+1]) into dout[k] (one token) or bdout[k] (n_batch tokens,
 * token-major), shared by the layers. */
struct si__down_state {
    int32_t nd;
    int64_t *dn;
    float **dout, **bdout; /* dout[k]: parts of dout_all */
    float *dout_all;       /* n_embd floats */
    uint32_t *dout_len;    /* (nd) the blocks' lengths */
    starpu_data_handle_t *h_dout, *h_bdout;
    starpu_data_handle_t h_dout_all; /* the parent of h_dout */
};

/* A batch of bn tokens (graph/prefill.c, codelets/prefill*.c). */
struct si__batch_state {
    /* Token t (btok) at position bpos[t] of the sequence bseq[t]: the
     * reference state whose KV cache it writes and reads (ref, or a
     * sequence of si_engine_seq_new).  A prompt's batch
     * (si_engine_eval_batch) is ref's at bp0 .. bp0 + bn - 1; a step of
     * several sequences (si_engine_eval_multi) has bp0 0.  The two arrays
     * and mtok (btok of a step) have n_batch entries. */
    int32_t n_batch;
    const int32_t *btok;
    int32_t bn, bp0;
    const struct si_ref **bseq;
    int32_t *bpos, *mtok;
    /* A step (bstep): its tokens [0, bsplit) are prompts' of 8 tokens or
     * more, in a prompt batch's arithmetic; [bsplit, bn) short prompts'
     * and then, from bdec, decoding tokens (requests of one token, which
     * alone take the decoding graph), in the reference's, as alone; the LM
     * head's rows are tokens bhrow[0 .. bn - bout0), in the reference's
     * arithmetic.  Outside steps bsplit and bdec are bn. */
    bool bstep;
    int32_t bsplit, bdec;
    int32_t *bhrow;
    /* The batch's q, k, v split over the attn_batch_L.r tasks by kv-head
     * groups (task r: group r's heads, every token, into bqkv[r]) instead
     * of by tokens: a step's few tokens, each task unpacking its share of
     * Wq, Wk, Wv once for all of them.  Only where each token's sums are
     * its own whatever the split (not sgemm's: solo prompts, exact steps'
     * prompts), with one group per task (ng == nr). */
    bool bheads;
    /* A step's decoding tokens' FFN neurons computed, in hot slices and in
     * the others (atomic; si_engine_eval_multi adds them to the stats). */
    int64_t step_hot, step_cold;
    float *mlogits; /* (mlogits_rows, n_vocab) a step's logits rows */
    int32_t mlogits_rows;
    float *bx, *bffn_in, *bxb3; /* (n_batch, n_embd) residual, FFN input, falcon's attention */
    /* A batch's attention, its tokens in nr ranges twice over: of equal
     * length (btp: attn_batch_L.r, its products and RoPE into bqkv[r],
     * a row of q | k | v per token), and of equal attention work (btr:
     * attn_core_batch_L.c.r, head chunk c's attention for those tokens
     * into batt[c * nr + r], a row of the chunk's query heads per token),
     * with attn_kv_batch_L.g caching group g's k and v between;
     * attn_out_batch_L gathers them.  The nc chunks are the kv-head groups,
     * or single kv heads where the groups differ in size (the core tasks
     * then of equal work: SmolLM2's 3 kv heads in groups of 2 and 1 had
     * left a worker idle a third of the attention). */
    int32_t nr, nc;
    int32_t *btp, *btr; /* (nr + 1) token ranges of the batch being run */
    int64_t *c_h;       /* (nc + 1) kv-head bounds of the chunks */
    int32_t *c_g;       /* (nc) the group holding chunk c */
    float **bqkv, **batt;
    starpu_data_handle_t *h_bqkv, *h_batt;
    /* ... attn_o_batch_L.j: Wo's rows [bo_c[j], bo_c[j+1]) for every token
     * into bo[j] (n_batch, that many), which attn_out_batch_L gathers. */
    int64_t *bo_c; /* (nr + 1) */
    float **bo;
    starpu_data_handle_t *h_bo;
    float **bpart;   /* (n_slices + 1) each (n_batch, brows[j], n_embd): slot outputs
                      * (dense: (n_batch, bwidth[j]) activations) */
    int32_t *brows;  /* (n_slices + 1) rows per token of each slot's output */
    int64_t *bwidth; /* (n_slices + 1) dense: the widest slice of each slot */
    starpu_data_handle_t h_bx, h_bffn_in, h_bxb3, *h_bpart;
    /* The batch's logits (si_engine_eval_batch_logits): tokens bout0 ..
     * bn - 1 of the batch, a row each, in nlh tasks of vocabulary rows
     * [lh[j], lh[j+1]), each writing its columns of the rows (h_blog_c[j]). */
    int32_t bout0;
    int32_t nlh;
    size_t *lh; /* (nlh + 1) */
    starpu_data_handle_t *h_blog_c;
    char (*name_lhb)[32]; /* (nlh) */
};

/* The GPU's share (graph/layout.c's plan, graph/attn_gpu.c). */
struct si__gpu_state {
    bool cuda_hot; /* hot slices run on CUDA workers */
    int64_t hot_bytes;
    int64_t gpu_base; /* StarPU's bytes on the CUDA node before init, or -1 */
    int cuda_node;    /* memory node of the first CUDA worker, or -1 */
    /* Attention on the GPU: the layers that have it (the first
     * n_attn_gpu), and their task's scratch on the GPU: xn, q, k, v, att,
     * o (si__attn_gpu_scratch_floats). */
    int32_t n_attn_gpu;
    int64_t attn_gpu_bytes; /* their weights, read on the GPU each token (0 with hot_on_cpu) */
    starpu_data_handle_t h_ascratch;
};

/* FFN observation (si_engine_observe, graph/observe.c): the dense batch
 * FFN tasks keep, per layer and batch token, the FFN's input (slice 0's
 * task), gate products and activations (each task its columns) for fn,
 * called after the batch; batches of at most nb tokens while it is set.
 * The batch attention tasks keep the attention's normalised inputs (a:
 * si_ffn_view's xa) and the residual after them (r: its xr). */
struct si__obs_state {
    si_ffn_hook fn;
    void *user;
    int32_t nb;
    float *x, *g, *h, *a, *r; /* (n_layer, nb, n_embd | n_ff | n_ff | n_embd | n_embd) */
};

/* The flash tier: cold neurons from p.flash (its region, caches and loads
 * in ft, flash/tier.h). */
struct si__flash_state {
    bool on;
    struct si_flash_tier *ft;
    starpu_data_handle_t h_spill; /* the tier's spill area */
    int err;                      /* a load task's failure (SI_E_IO, SI_E_BUDGET), for eval */
};

/* This process's layers [l0, l1): all, or its share of a pipeline across
 * MPI ranks (p.pipe, graph/pipe.c); the pipeline's ranks: this one, how
 * many (0 and 1 without one). */
struct si__pipe_state {
    int32_t l0, l1;
    int rank, nranks;
};

/* The in-place graph of the token being submitted (codelets/task.h): the
 * phase being gathered (its tasks, not yet submitted, of codelet key in
 * layer l), the join of the phase before (not yet submitted), the token's
 * last join once submitted, the first error.  With check, each task's
 * handles and modes too (ck: nck accesses, of the phase's task ck[i].task). */
struct si__access {
    starpu_data_handle_t h;
    enum starpu_data_access_mode md;
    int32_t task;
};
struct si__inplace_state {
    bool on, check;
    const struct starpu_codelet *key;
    int l;
    int32_t n, cap;
    struct starpu_task **pend;
    struct starpu_task *prev, *last;
    int done; /* set when last is done (its callback) */
    int rc;
    int32_t nck, ck_cap;
    struct si__access *ck;
};

struct si_engine {
    const struct si_model *m;
    const struct si_weights *w; /* the weights the tasks read: the model's, or own.own_w */
    struct si_engine_params p;
    struct si_ref *ref; /* attention, KV cache, embedding and head run on it */
    struct si__layer_state *L;
    struct si__scratch *scratch; /* one per worker */
    unsigned n_workers;

    struct si__layout lay;
    struct si__own_weights own;
    struct si__decode_state dec;
    struct si__down_state down;
    struct si__batch_state bat;
    struct si__gpu_state gpu;
    struct si__obs_state obs;
    struct si__flash_state fl;
    struct si__pipe_state pipe;
    struct si__inplace_state ip;

    struct si_engine_stats stats;
    int64_t token_bytes_fixed; /* weights every token reads besides the FFN slices'
                                * (dense mode: the down projection's tasks too) */
    int64_t in_saved;          /* input sparsity: bytes of the weights a token's
                                * products left unread (atomic; si__matvec_t) */
    char err_msg[256];         /* the last evaluation's failure (si_engine_error) */
};

/* One task's arguments (freed by StarPU with the task). */
struct si__task_arg {
    struct si_engine *e;
    int l, j;
    int32_t token;
    bool inplace; /* a task of the in-place graph: no buffers (codelets/task.h) */
};

/* The calling worker's scratch. */
static inline struct si__scratch *si__scratch_of(struct si_engine *e)
{
    return &e->scratch[starpu_worker_get_id_check()];
}

/* Charge `seconds` to this worker's counter of kind k (one task). */
static inline void si__charge(struct si_engine *e, enum si_task_kind k, double seconds)
{
    struct si__scratch *sc = si__scratch_of(e);
    sc->busy[k] += seconds;
    sc->count[k]++;
}

/* Charge the time since t0 to this worker's counter of kind k. */
static inline void si__account(struct si_engine *e, enum si_task_kind k, double t0)
{
    si__charge(e, k, si__now() - t0);
}

/* The batch attention's head chunk c: its query heads' floats per token. */
static inline int64_t si__chunk_len(const struct si_engine *e, int32_t c)
{
    const struct si_hparams *hp = &e->m->hp;
    return (e->bat.c_h[c + 1] - e->bat.c_h[c]) * (hp->n_head / hp->n_head_kv) * hp->head_dim;
}

/* Slot j of layer l is its hot slice. */
static inline bool si__is_hot(const struct si_engine *e, int l, int j)
{
    return j == 0 && e->L[l].hot;
}

/* Rows [r0, r1) of w as a tensor of their own (si_ref_matvec on a slice). */
static inline struct si_tensor si__rows_of(const struct si_tensor *w, int64_t r0, int64_t r1)
{
    struct si_tensor v = *w;
    /* Packed rows are split at groups of 8 (si__split8). */
    STARPU_ASSERT_MSG(r0 >= w->pk || r0 % 8 == 0, "a packed matrix split inside a group");
    v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    v.ne[1] = r1 - r0;
    v.nbytes = (size_t)(r1 - r0) * w->row_bytes;
    v.pk = w->pk > r0 ? (w->pk < r1 ? w->pk : r1) - r0 : 0;
    return v;
}

/* Boundary k of `parts` row ranges over n rows: k * n / parts, rounded down
 * to a multiple of 8 (the groups of packed matrices) where n has 8 rows
 * for each part (si__split8_ok), n for the last. */
static inline bool si__split8_ok(int64_t n, int64_t parts)
{
    return n >= 8 * parts;
}
static inline int64_t si__split8(int64_t n, int64_t k, int64_t parts)
{
    if (k >= parts)
        return n;
    return si__split8_ok(n, parts) ? k * n / parts / 8 * 8 : k * n / parts;
}

/* Part k's start of n in parts, at multiples of u where u > 8 (input
 * sparsity's blocks: parts <= n / u), else si__split8's. */
static inline int64_t si__split_u(int64_t n, int64_t k, int64_t parts, int64_t u)
{
    if (u <= 8)
        return si__split8(n, k, parts);
    return k >= parts ? n : k * n / parts / u * u;
}

#endif /* SI_CODELETS_STATE_H */
