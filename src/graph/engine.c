/* engine.c - decode steps as StarPU tasks over FFN neuron slices (see engine.h). */
#include "graph/engine.h"

#include "codelets/ffn_sparse.h"
#include "codelets/ops.h"
#include "config.h"
#include "flash/cache.h"
#include "flash/store.h"
#include "graph/runtime.h"
#include "internal.h"
#include "model/act.h"
#include "model/quants.h"
#include "model/types.h"
#include "placement/placement.h"
#include "predict/profile.h"
#include "starinfer.h"

#ifdef SI_USE_CUDA
#include "codelets/codelets_cuda.h"
#include <cuda_runtime_api.h>
#endif

#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
void openblas_set_num_threads(int n); /* OpenBLAS's cblas.h; not every CBLAS has it */
#endif

#define MAX_SLICES 256
#define DT_TILE 64 /* down_t rows dequantized at a time in prefill */
#define ATTN_SPLIT_MIN_BYTES (256 << 10) /* see si_engine_init */
#define BLAS_MIN_BATCH 8 /* smaller batches: the reference's dots (see bffn_cpu) */

/* Scratch and counters of one worker. */
struct scratch {
    /* Attention tasks: q, k, v and att laid out whole (each task fills its
     * heads' parts), si_ref_attn_group's scratch, a residual, the FFN
     * output being merged, a normalised input, norm scratch. */
    float *aq, *ak, *av, *aatt, *ascr, *xl, *xf, *xn, *xo, *tmp;
    float *h;    /* (n_ff) the slice's neuron activations */
    float *g;    /* (n_ff) gate mode: the slice's gating dots */
    int32_t *ix; /* (n_ff) the slice's active positions */
    float *y;    /* (n_ff / chunk + 1, n_embd) partial rows (redux mode) */
    void *xq;    /* the FFN input converted for the up and gate dots */
    void *hq;    /* the activations converted for the down dots */
    float *bg, *bu; /* (n_batch, n_ff) prefill: gate and up products */
    void *gemm;     /* si_k_gemm's dequantization tile */
    float *dt;      /* (DT_TILE, n_embd) prefill: down_t rows as floats */
    double busy[SI_TASK_KIND_COUNT]; /* seconds inside task functions, by kind */
    int64_t count[SI_TASK_KIND_COUNT];
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *si_task_kind_name(enum si_task_kind k)
{
    static const char *const names[SI_TASK_KIND_COUNT] = {
        "embed",       "attn",        "attn_proj",  "pred",      "ffn_hot",     "ffn_cold",  "merge",
        "norm+lm_head", "load", "ffn_down", "embed_batch", "attn_batch", "ffn_batch",
        "merge_batch", "head_batch", "ffn_down_batch"};
    return (unsigned)k < SI_TASK_KIND_COUNT ? names[k] : "?";
}

const char *si_sparsity_name(enum si_sparsity m)
{
    return m == SI_SPARSITY_GATE ? "gate" : m == SI_SPARSITY_PREDICTOR ? "predictor" : "dense";
}

/*
 * One layer's FFN.  Its neurons are in slices: slots 0 .. nsl - 1 of the
 * arrays below are the non-empty slices in order, the hot one first when
 * hot is set.  Handles whose name ends in _c are the children of the
 * handle of the same name (one per slot).
 */
struct layer {
    int64_t n_hot;
    bool hot;         /* slot 0 is the hot slice */
    int32_t nsl;      /* non-empty slices */
    int64_t *s0;      /* (nsl + 1) slice boundaries, in neuron positions */
    int32_t *rows;    /* (nsl) partial-output rows of each slice (sparse) */
    int32_t *perm;    /* (n_ff) position -> file neuron id */
    int64_t *active;  /* (nsl) neurons each slice computed for the last token */
    int64_t *rd;      /* (nsl) bytes of weights each slice's task read for it */
    uint32_t *len_n;  /* (nsl) neurons per slice (filter lengths) */
    uint32_t *len_p;  /* (nsl) floats of partial output per slice (dense: its
                       * neurons' activations) */

    void *rec;        /* sparse layouts: (n_ff, rec_bytes) neuron records */
    void *pre;        /* gate mode: (n_ff, gu_row) the gating rows, position order */
    float *up_b;      /* (n_ff) up bias in position order (zeros without one) */
    void *fc2p;       /* predictor fc2 rows in position order */
    int32_t *idx;     /* (n_ff) predictor mode: each slice's active positions */
    float *part;      /* the slices' partial outputs: (sum of rows, n_embd), or
                       * dense, the n_ff activations */
    float *y;         /* (n_embd) redux mode: the layer's FFN output */

    starpu_data_handle_t h_w[4], h_k, h_v;           /* attention */
    starpu_data_handle_t *h_k_c, *h_v_c; /* (ng) the caches' columns of each kv-head group */
    size_t *kv_cols;                     /* (ng + 1) their byte boundaries in a cache row */
    starpu_data_handle_t h_gate, h_up, h_down, h_rec; /* FFN weights */
    starpu_data_handle_t h_upb, h_idx, h_part, h_fc1, h_fc2, h_y;
    starpu_data_handle_t *h_gate_c, *h_up_c, *h_rec_c, *h_upb_c, *h_idx_c, *h_part_c;
    starpu_data_handle_t *h_down_c; /* (nd) dense: ffn_down's row blocks */

    /* The flash tier: the cold neurons' cache and the load task's arrays
     * (one load per layer runs at a time: the cache handle orders them). */
    struct si_flash_cache fc;
    float *gact;       /* gate mode: (n_ff) act(gate) of each passing neuron
                        * (the plain kind: its activation), by position */
    int32_t *fl_row;   /* (n_ff) each position's row in the store */
    int32_t *fl_act;   /* (n_ff) this token's active cold positions */
    int32_t *fl_load, *fl_slot, *fl_fid; /* (n_ff) the neurons to read */
    char **fl_dst;     /* (n_ff) where each goes */
    struct si_flash_req *fl_req; /* (3 n_ff) */
    int64_t fc_off;    /* the cache's first record in the engine's region */
    int64_t fl_loads, fl_hits, fl_bytes, fl_reads; /* totals */
    double fl_io, fl_manage;
    starpu_data_handle_t h_cache;

    char name_attn[24], name_pred[24], name_merge[24], name_load[24];
    char (*name_gmask)[32]; /* (nsl) */
    char name_battn[24], name_bmerge[24], name_aout[24];
    char (*name_agrp)[32]; /* (ng) */
    char (*name_ao)[32];   /* (na) */
    char (*name_ffn)[32];  /* (nsl) */
    char (*name_bffn)[48]; /* (nsl) */
    char (*name_down)[32], (*name_bdown)[40]; /* (nd) dense */
};

struct si_engine {
    const struct si_model *m;
    struct si_engine_params p;
    struct si_ref *ref; /* attention, KV cache, embedding and head run on it */
    bool sparse;        /* neuron records (gate, predictor) vs file tensors (dense) */
    bool cuda_hot;      /* hot slices run on CUDA workers */
    int32_t n_slices;   /* cold slices per layer */
    int64_t chunk;      /* dense: slices are whole units of this many neurons */
    uint32_t gu_type;   /* type of the gate and up rows */
    uint32_t dt_type;   /* sparse: type of the down_t rows */
    size_t gu_row;      /* bytes of a gate or up row */
    size_t dt_row;      /* sparse: bytes of a down_t row */
    size_t rec_bytes;   /* sparse: bytes of a neuron record */
    bool pre_sep;       /* gate mode: the rows that gate a neuron (gate, or
                         * up for the plain kind) in their own array, read
                         * densely, instead of in the records */
    ptrdiff_t gate_off, up_off; /* sparse: offsets in a record, -1: not there */
    size_t dt_off;      /* sparse: offset of the down_t row in a record */
    bool has_gate;
    float *gthr;        /* (n_layer) gate mode's threshold of each layer */
    int64_t hot_bytes;
    struct si_gpu_reserve reserve; /* what the GPU holds besides hot neurons */
    int64_t gpu_base;   /* StarPU's bytes on the CUDA node before init, or -1 */
    float *zeros;       /* (n_ff) the up bias of files without one */
    int32_t *iota;      /* (n_ff) 0, 1, ...: the "every neuron" index list */
    struct layer *L;
    struct scratch *scratch; /* one per worker */
    unsigned n_workers;
    int cuda_node;           /* memory node of the first CUDA worker, or -1 */

    starpu_data_handle_t h_x, h_xb, h_logits, h_out, h_iota, h_hscratch;

    /* Attention split over the workers (na > 1): ng tasks attn_L.j, each
     * for the kv heads [a_g[j], a_g[j+1]) (ng <= n_head_kv), then na row
     * slices of Wo's output [a_o[j], a_o[j+1]) and of the LM head's
     * [a_h[j], a_h[j+1]). */
    int32_t na, ng;
    bool fuse_out;                   /* attn_out's work done by each FFN slice task */
    int64_t *a_g;                    /* (ng + 1) kv-head boundaries */
    int64_t *a_o, *a_h;              /* (na + 1) row boundaries */
    char (*name_head)[24];           /* (na) */
    uint32_t *head_len;              /* (na) rows of each head slice */
    uint32_t *att_len;               /* (ng) floats of each group's attention output */
    starpu_data_handle_t *h_logits_c; /* (na) children of h_logits */
    float **o;                       /* (na) slot outputs */
    float *x2;                       /* (n_embd) a layer's input residual (attn_L.0 -> attn_out) */
    starpu_data_handle_t *h_o, h_att, *h_att_c, h_x2, h_xb3;

    /* Dense mode's down projection in nd blocks of output rows, block k
     * [dn[k], dn[k+1]) into dout[k] (one token) or bdout[k] (n_batch tokens,
     * token-major), shared by the layers. */
    int32_t nd;
    int64_t *dn;
    float **dout, **bdout;
    starpu_data_handle_t *h_dout, *h_bdout;

    /* Prefill: a batch of bn tokens at positions bp0 .. bp0 + bn - 1. */
    int32_t n_batch;
    const int32_t *btok;
    int32_t bn, bp0;
    float *bx, *bxb, *bxb3; /* (n_batch, n_embd) residual, FFN input, falcon's attention */
    float **bpart;          /* (n_slices + 1) each (n_batch, brows[j], n_embd): slot outputs
                             * (dense: (n_batch, bwidth[j]) activations) */
    int32_t *brows;         /* (n_slices + 1) rows per token of each slot's output */
    int64_t *bwidth;        /* (n_slices + 1) dense: the widest slice of each slot */
    starpu_data_handle_t h_bx, h_bxb, h_bxb3, *h_bpart;

    bool flash;        /* cold neurons from p.flash */
    /* The flash records in one region: the spill area (records 0 ..
     * spill_cap - 1), then each layer's cache; a record's index in the
     * region (int32) is what the ffn_cold kernels take. */
    char *region;
    float *region_bias;
    int32_t spill_cap;  /* records: the most cold neurons of a layer */
    int32_t spill_n;    /* in use, by the layer loaded last */
    int32_t *spill_of;  /* (n_ff) a position's spill record, or -1 */
    int32_t *spill_pos; /* (spill_cap) the positions in the spill area */
    starpu_data_handle_t h_spill;
    int flash_err;     /* a load task's failure (SI_E_IO, SI_E_BUDGET), for eval */
    char flash_msg[256];

    struct si_engine_stats stats;
    int64_t token_bytes_fixed; /* weights every token reads besides the FFN slices'
                                * (dense mode: the down projection's tasks too) */
};

/* One task's arguments (freed by StarPU with the task). */
struct task_arg {
    struct si_engine *e;
    int l, j;
    int32_t token;
};

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
                                     .exact_prefill = false,
                                     .flash_window = 5};
}

static struct scratch *my_scratch(struct si_engine *e)
{
    return &e->scratch[starpu_worker_get_id_check()];
}

/* Charge the time since t0 to this worker's counter of kind k. */
static void account(struct si_engine *e, enum si_task_kind k, double t0)
{
    struct scratch *sc = my_scratch(e);
    sc->busy[k] += now() - t0;
    sc->count[k]++;
}

static bool is_hot(const struct si_engine *e, int l, int j)
{
    return j == 0 && e->L[l].hot;
}

/* ------------------------------------------------------------ FFN on CPU */

/* The FFN input converted for rows of type t (or NULL: dots in float). */
static const void *convert_input(const struct si_engine *e, uint32_t t, const float *xb, void *dst)
{
    if (!e->p.ref.act_quant)
        return NULL;
    si_quantize_act(si_act_type(t), xb, dst, e->m->hp.n_embd);
    return dst;
}

static float dot(uint32_t t, const void *row, const void *xa, const float *x, int64_t n)
{
    return xa != NULL ? si_vec_dot_act(t, row, xa, n) : si_vec_dot(t, row, x, n);
}

/* The activation of one neuron from its rows (gate may be NULL for the
 * plain kind, b NULL without an up bias), as the reference computes it. */
static float neuron(const struct si_engine *e, const void *gate, const void *up, const float *b,
                    const void *xa, const float *xb)
{
    const struct si_hparams *hp = &e->m->hp;
    const int64_t d = hp->n_embd;
    const uint32_t t = e->gu_type;
    if (hp->ffn_kind == SI_FFN_PLAIN)
        return si_act_apply(hp->act, b != NULL ? dot(t, up, xa, xb, d) + *b : dot(t, up, xa, xb, d));
    float a = si_act_apply(hp->act, dot(t, gate, xa, xb, d));
    float u = b != NULL ? dot(t, up, xa, xb, d) + *b : dot(t, up, xa, xb, d);
    return si_act_gated(hp->ffn_kind, a, u);
}

/*
 * Dense layout, neurons [n0, n0 + n) in file order: their activations into
 * h, as the reference computes them; the down projection runs afterwards
 * over all the neurons (down_cpu).  Returns n: dense mode computes every
 * neuron.
 */
static int64_t ffn_dense_slice(struct si_engine *e, const float *xb, const char *gate,
                               const char *up, const float *b, int64_t n, struct scratch *sc,
                               float *h)
{
    const void *xa = convert_input(e, e->gu_type, xb, sc->xq);
    for (int64_t i = 0; i < n; i++)
        h[i] = neuron(e, gate != NULL ? gate + (size_t)i * e->gu_row : NULL,
                      up + (size_t)i * e->gu_row, b != NULL ? b + i : NULL, xa, xb);
    return n; /* every neuron, zero or not */
}

/*
 * Sparse layouts, the slice's n neurons: their records at rec, and in gate
 * mode their gating rows at pre.  Predictor mode computes the positions in
 * idx (ending at the first -1) with si_k_ffn_act_sparse; gate mode takes
 * every gating dot and only then the up dots of the neurons it lets
 * through.  y = the sum of the activations times the down_t rows
 * (si_k_ffn_down_sparse).  Returns how many activations are not zero.
 */
static int64_t ffn_sparse_slice(struct si_engine *e, const float *xb, const char *pre,
                                const char *rec, const float *b, const int32_t *idx, int64_t n,
                                float thr, struct scratch *sc, float *y, int64_t *rd)
{
    const struct si_hparams *hp = &e->m->hp;
    const int64_t d = hp->n_embd;
    const size_t rb = e->rec_bytes;
    const uint32_t t = e->gu_type;
    const void *xa = convert_input(e, t, xb, sc->xq);
    const char *gate = e->gate_off >= 0 ? rec + e->gate_off : NULL;
    const char *up = e->up_off >= 0 ? rec + e->up_off : NULL;
    int64_t k = 0;
    if (idx != NULL) {
        while (k < n && idx[k] >= 0)
            k++;
        memcpy(sc->ix, idx, (size_t)k * sizeof *idx);
        if (xa != NULL) {
            si_k_ffn_act_sparse(hp->ffn_kind, hp->act, t, gate, up, b, rb, d, xa, sc->ix, k,
                                sc->h);
        } else {
            for (int64_t q = 0; q < k; q++) {
                const size_t o = (size_t)sc->ix[q] * rb;
                sc->h[q] = neuron(e, gate != NULL ? gate + o : NULL, up + o,
                                  b != NULL ? b + sc->ix[q] : NULL, xa, xb);
            }
        }
        *rd = k * (int64_t)e->gu_row * (gate != NULL ? 2 : 1);
    } else {
        const bool relu = hp->act == SI_ACT_RELU;
        *rd = n * (int64_t)e->gu_row; /* every gating row */
        /* Every gating dot first, row after row: the rows are dense, and
         * one sequential stream is what this machine reads fastest
         * (interleaving 2 or 4 rows read half as fast from DRAM:
         * docs/measurements.md). */
        float *g = sc->g;
        for (int64_t i = 0; i < n; i++)
            g[i] = dot(t, pre + (size_t)i * e->gu_row, xa, xb, d);
        if (hp->ffn_kind == SI_FFN_PLAIN) {
            for (int64_t i = 0; i < n; i++) {
                const float h = si_act_apply(hp->act, b != NULL ? g[i] + b[i] : g[i]);
                if (h != 0.0f) {
                    sc->h[k] = h;
                    sc->ix[k++] = (int32_t)i;
                }
            }
        } else {
            /* The neurons the gate lets through, in order, with act(gate)... */
            int64_t m = 0;
            for (int64_t i = 0; i < n; i++) {
                const float a = si_act_apply(hp->act, g[i]);
                if (relu ? a == 0.0f : !(fabsf(a) > thr))
                    continue;
                sc->h[m] = a;
                sc->ix[m++] = (int32_t)i;
            }
            *rd += m * (int64_t)e->gu_row;
            /* ...then their up dots two at a time, the next pair's rows
             * prefetched while these are read (they are scattered records). */
            float u[2];
            for (int64_t q = 0; q < m; q += 2) {
                const int two = q + 1 < m ? 2 : 1;
                const void *rows[2] = {up + (size_t)sc->ix[q] * rb,
                                       up + (size_t)sc->ix[q + two - 1] * rb};
                const void *ahead[2] = {q + 2 < m ? up + (size_t)sc->ix[q + 2] * rb : NULL,
                                        q + 3 < m ? up + (size_t)sc->ix[q + 3] * rb : NULL};
                if (xa != NULL && two == 2) {
                    si_vec_dot_act2(t, rows, xa, d, u, ahead);
                } else {
                    for (int r = 0; r < two; r++)
                        u[r] = dot(t, rows[r], xa, xb, d);
                }
                for (int r = 0; r < two; r++) {
                    const int32_t i = sc->ix[q + r];
                    const float v = b != NULL ? u[r] + b[i] : u[r];
                    sc->h[q + r] = si_act_gated(hp->ffn_kind, sc->h[q + r], v);
                }
            }
            /* The zeros out, the order kept (the down sums' order). */
            for (int64_t q = 0; q < m; q++)
                if (sc->h[q] != 0.0f) {
                    sc->h[k] = sc->h[q];
                    sc->ix[k++] = sc->ix[q];
                }
        }
    }
    si_k_ffn_down_sparse(e->dt_type, rec + e->dt_off, rb, d, sc->h, sc->ix, k, y);
    int64_t computed = 0;
    for (int64_t q = 0; q < k; q++)
        computed += sc->h[q] != 0.0f;
    *rd += computed * (int64_t)e->dt_row; /* the kernel skips zeros */
    return computed;
}

/*
 * Buffers of an FFN slice task, in order:
 *   dense:  ffn_in, gate (absent for the plain kind), up, up_b, out
 *   sparse: ffn_in, [gating rows (gate mode)], records, up_b, [idx (predictor
 *           mode)], out
 * then, for the CUDA function only: iota, h scratch.  `out` is the slice's
 * partial output (rows x n_embd, W; dense: its n activations) or, in redux
 * mode, the layer output (n_embd, REDUX).
 */
static const float *ffn_input(struct si_engine *e, int l, int j, void *buffers[], int *i,
                              int owner_at, struct scratch *sc);

static void ffn_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct layer *L = &e->L[a->l];
    struct scratch *sc = my_scratch(e);
    const int64_t d = e->m->hp.n_embd;
    double t0 = now();
    int i = 0;
    const int nbuf = STARPU_TASK_GET_NBUFFERS(starpu_task_get_current());
    const float *xb = ffn_input(e, a->l, a->j, buffers, &i, nbuf, sc);
    const int64_t n = L->s0[a->j + 1] - L->s0[a->j];
    /* The up bias (zeros in the handle for files without one: not added) */
    const bool bias = e->m->w.layers[a->l].ffn_up_b.data != NULL;
    float *out;
    float *y;
    int64_t computed, rd = 0;
    if (!e->sparse) {
        const char *gate = e->has_gate ? (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]) : NULL;
        const char *up = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
        const float *b = bias ? (const float *)STARPU_VECTOR_GET_PTR(buffers[i]) : NULL;
        i++;
        out = y = (float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
        computed = ffn_dense_slice(e, xb, gate, up, b, n, sc, y);
        rd = n * (int64_t)e->gu_row * (gate != NULL ? 2 : 1);
    } else {
        const char *pre = e->pre_sep ? (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]) : NULL;
        const char *rec = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
        const float *b = bias ? (const float *)STARPU_VECTOR_GET_PTR(buffers[i]) : NULL;
        i++;
        const int32_t *idx = e->p.mode == SI_SPARSITY_PREDICTOR
                                 ? (const int32_t *)STARPU_VECTOR_GET_PTR(buffers[i++])
                                 : NULL;
        out = (float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
        y = e->p.redux ? sc->y : out;
        computed = ffn_sparse_slice(e, xb, pre, rec, b, idx, n, e->gthr[a->l], sc, y, &rd);
    }
    if (e->p.redux) /* add the rows into this worker's share of the output */
        for (int32_t r = 0; r < L->rows[a->j]; r++)
            for (int64_t o = 0; o < d; o++)
                out[o] += y[(size_t)r * d + o];
    L->active[a->j] = computed;
    L->rd[a->j] = rd;
    account(e, is_hot(e, a->l, a->j) ? SI_TASK_FFN_HOT : SI_TASK_FFN_COLD, t0);
}

#ifdef SI_USE_CUDA
/*
 * The hot slice on a CUDA worker: the same buffers as ffn_cpu, plus iota and
 * a scratch of 2 n_ff floats.  Dots take the input in float (no act_quant),
 * so results differ from the CPU's by that rounding.  Dense mode writes the
 * activations (the down projection runs on CPU workers).  Gate mode on the GPU
 * computes every hot neuron (they are the ones that fire most) and the down
 * kernel skips the zeros; its threshold applies on CPU workers only.
 */
static void ffn_cuda(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct layer *L = &e->L[a->l];
    const struct si_hparams *hp = &e->m->hp;
    const int64_t d = hp->n_embd;
    const int64_t n = L->s0[a->j + 1] - L->s0[a->j];
    const bool bias = e->m->w.layers[a->l].ffn_up_b.data != NULL;
    cudaStream_t st = starpu_cuda_get_local_stream();
    double t0 = now();
    int i = 0;
    const float *xb = (const float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    const char *gate = NULL, *up = NULL, *rec = NULL, *pre = NULL;
    const int32_t *idx = NULL;
    if (!e->sparse) {
        if (e->has_gate)
            gate = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
        up = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    } else {
        if (e->pre_sep)
            pre = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
        rec = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
        gate = e->gate_off >= 0 ? rec + e->gate_off : NULL;
        up = e->up_off >= 0 ? rec + e->up_off : NULL;
    }
    const float *b = bias ? (const float *)STARPU_VECTOR_GET_PTR(buffers[i]) : NULL;
    i++;
    if (e->sparse && e->p.mode == SI_SPARSITY_PREDICTOR)
        idx = (const int32_t *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    float *out = (float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    const int32_t *iota = (const int32_t *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    float *h = (float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    cudaError_t rc;
    if (e->pre_sep) {
        /* gating rows and up rows have different strides: two products */
        float *g = h + hp->n_ff;
        if (hp->ffn_kind == SI_FFN_PLAIN) {
            rc = si_cuda_matvec(e->gu_type, pre, e->gu_row, n, d, xb, h, st);
            if (rc == cudaSuccess)
                rc = si_cuda_ffn_combine(NULL, h, b, n, (int)hp->ffn_kind, (int)hp->act, h, st);
        } else {
            rc = si_cuda_matvec(e->gu_type, pre, e->gu_row, n, d, xb, g, st);
            if (rc == cudaSuccess)
                rc = si_cuda_matvec(e->gu_type, up, e->rec_bytes, n, d, xb, h, st);
            if (rc == cudaSuccess)
                rc = si_cuda_ffn_combine(g, h, b, n, (int)hp->ffn_kind, (int)hp->act, h, st);
        }
    } else {
        rc = si_cuda_ffn_gate_up(e->gu_type, gate, up, e->sparse ? e->rec_bytes : e->gu_row, n, d,
                                 b, xb, idx != NULL ? idx : iota, n, (int)hp->ffn_kind,
                                 (int)hp->act, e->sparse ? h : out, st);
    }
    if (rc == cudaSuccess && e->sparse) {
        rc = si_cuda_ffn_down(e->dt_type, rec + e->dt_off, e->rec_bytes, n, d, h,
                              idx != NULL ? idx : iota, n, out, st);
    }
    if (rc != cudaSuccess)
        STARPU_CUDA_REPORT_ERROR(rc);
    L->active[a->j] = -1; /* not counted on the GPU (the mask stays there) */
    /* Bytes: the whole slice (an upper bound in predictor mode, whose mask
     * stays on the GPU). */
    L->rd[a->j] = !e->sparse ? n * (int64_t)e->gu_row * (e->has_gate ? 2 : 1)
                             : n * (int64_t)(e->rec_bytes + (e->pre_sep ? e->gu_row : 0));
    account(e, SI_TASK_FFN_HOT, t0);
}
#endif

/* ------------------------------------------------------------ flash tier */

/*
 * Gate mode's mask of a cold slice (flash): the gating dots of every neuron
 * of the slice, as ffn_sparse_slice takes them, so that the load task knows
 * which records to read.  The neurons that pass go to idx (local positions,
 * then -1) and their act(gate) (the plain kind: the activation itself,
 * dropping zeros as ffn_sparse_slice does) to gact.
 * Buffers: ffn_in, gating rows, up_b (R), idx (W).
 */
static void gmask_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct layer *L = &e->L[a->l];
    const struct si_hparams *hp = &e->m->hp;
    struct scratch *sc = my_scratch(e);
    const int64_t d = hp->n_embd, p0 = L->s0[a->j], n = L->s0[a->j + 1] - p0;
    const uint32_t t = e->gu_type;
    const float thr = e->gthr[a->l];
    const bool relu = hp->act == SI_ACT_RELU;
    double t0 = now();
    const float *xb = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const char *pre = (const char *)STARPU_VECTOR_GET_PTR(buffers[1]);
    const bool bias = e->m->w.layers[a->l].ffn_up_b.data != NULL;
    const float *b = bias ? (const float *)STARPU_VECTOR_GET_PTR(buffers[2]) : NULL;
    int32_t *idx = (int32_t *)STARPU_VECTOR_GET_PTR(buffers[3]);
    const void *xa = convert_input(e, t, xb, sc->xq);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        const float g = dot(t, pre + (size_t)i * e->gu_row, xa, xb, d);
        float v;
        if (hp->ffn_kind == SI_FFN_PLAIN) {
            v = si_act_apply(hp->act, b != NULL ? g + b[i] : g);
            if (v == 0.0f)
                continue;
        } else {
            v = si_act_apply(hp->act, g);
            if (relu ? v == 0.0f : !(fabsf(v) > thr))
                continue;
        }
        L->gact[p0 + i] = v;
        idx[k++] = (int32_t)i;
    }
    for (int64_t q = k; q < n; q++)
        idx[q] = -1;
    L->rd[a->j] = n * (int64_t)e->gu_row; /* ffn_cold adds the records' rows */
    account(e, SI_TASK_PRED, t0);
}

static int cmp_row(const void *pa, const void *pb, void *user)
{
    const int32_t *row = user;
    const int32_t a = row[*(const int32_t *)pa], b = row[*(const int32_t *)pb];
    return (a > b) - (a < b);
}

static void flash_fail(struct si_engine *e, int rc, const char *msg)
{
    if (e->flash_err == SI_OK) {
        e->flash_err = rc;
        snprintf(e->flash_msg, sizeof e->flash_msg, "%s", msg);
    }
}

/*
 * A layer's load: its cold slices' active positions (idx children, R), in
 * store order; the cache's step (deletes, moves, appends); then the missing
 * records read into their slots in parallel, and their biases taken.
 * Buffers: idx of each cold slice (R), the cache, the spill area (RW).
 */
static void load_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct layer *L = &e->L[a->l];
    struct si_flash_cache *c = &L->fc;
    const struct si_flash_format *f = &e->p.flash->f;
    double t0 = now();
    const int32_t first = L->hot ? 1 : 0;
    int64_t na = 0;
    for (int32_t j = first; j < L->nsl; j++) {
        const int32_t *idx = (const int32_t *)STARPU_VECTOR_GET_PTR(buffers[j - first]);
        const int64_t n = L->s0[j + 1] - L->s0[j];
        for (int64_t q = 0; q < n && idx[q] >= 0; q++)
            L->fl_act[na++] = (int32_t)(L->s0[j] + idx[q]);
    }
    /* Neighbours in the store get neighbouring slots: one read for a run. */
    qsort_r(L->fl_act, (size_t)na, sizeof *L->fl_act, cmp_row, L->fl_row);
    /* The previous layer's spilled neurons are done with (spill is RW here). */
    for (int32_t k = 0; k < e->spill_n; k++)
        e->spill_of[e->spill_pos[k]] = -1;
    e->spill_n = 0;
    /* More active neurons than the cache holds: the cached ones and the
     * first missing ones (store order: hottest first with a profile) go
     * through the cache, the others are read into the spill area for this
     * token only. */
    int64_t nk = na;
    if (na > c->cap) {
        int64_t cached = 0, room, w = 0;
        for (int64_t k = 0; k < na; k++)
            cached += c->slot_of[L->fl_act[k]] >= 0;
        room = c->cap - cached;
        for (int64_t k = 0; k < na; k++) {
            const int32_t p = L->fl_act[k];
            if (c->slot_of[p] >= 0 || room-- > 0) {
                L->fl_act[w++] = p;
            } else {
                e->spill_of[p] = e->spill_n;
                e->spill_pos[e->spill_n++] = p;
            }
        }
        nk = w;
    }
    int64_t nl = 0;
    struct si_flash_step st;
    int rc = si_flash_cache_step(c, L->fl_act, nk, L->fl_load, L->fl_slot, &nl, &st);
    if (rc != SI_OK) { /* cannot happen: nk <= cap, the ids distinct */
        flash_fail(e, rc, "flash cache bookkeeping failed");
        account(e, SI_TASK_LOAD, t0);
        return;
    }
    for (int64_t k = 0; k < nl; k++) {
        L->fl_fid[k] = L->perm[L->fl_load[k]];
        L->fl_dst[k] = si_flash_cache_rec(c, L->fl_slot[k]);
    }
    for (int32_t k = 0; k < e->spill_n; k++) {
        L->fl_fid[nl + k] = L->perm[e->spill_pos[k]];
        L->fl_dst[nl + k] = e->region + (size_t)k * e->rec_bytes;
    }
    const int64_t nc = si_flash_plan(e->p.flash, a->l, L->fl_fid, nl, L->fl_dst, L->fl_req);
    const int64_t nr = nc + si_flash_plan(e->p.flash, a->l, L->fl_fid + nl, e->spill_n,
                                          L->fl_dst + nl, L->fl_req + nc);
    double t1 = now();
    rc = si_flash_read(e->p.flash, L->fl_req, nr);
    double t2 = now();
    if (rc != SI_OK)
        flash_fail(e, rc, "reading the flash store failed");
    for (int64_t k = 0; k < nl; k++)
        memcpy(&c->bias[L->fl_slot[k]], L->fl_dst[k] + f->bias_off, sizeof(float));
    for (int32_t k = 0; k < e->spill_n; k++)
        memcpy(&e->region_bias[k], L->fl_dst[nl + k] + f->bias_off, sizeof(float));
    nl += e->spill_n;
    for (int64_t r = 0; r < nr; r++)
        L->fl_bytes += (int64_t)L->fl_req[r].len;
    L->fl_reads += nr;
    L->fl_loads += nl;
    L->fl_hits += st.hits;
    L->fl_io += t2 - t1;
    L->fl_manage += (t1 - t0) + (now() - t2);
    account(e, SI_TASK_LOAD, t0);
}

/*
 * A cold slice from the flash cache: the active positions (idx) mapped to
 * their slots, then ffn_sparse_slice's arithmetic in the same order (the
 * partial output equals the all-in-DRAM one bit for bit).
 * Buffers: ffn_in, the cache, idx, the spill area (R), out (W).
 */
static int32_t record_of(const struct si_engine *e, const struct layer *L, int64_t p)
{
    const int32_t s = L->fc.slot_of[p];
    return s >= 0 ? (int32_t)(L->fc_off + s) : e->spill_of[p];
}

static void ffn_flash_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct layer *L = &e->L[a->l];
    const struct si_hparams *hp = &e->m->hp;
    struct scratch *sc = my_scratch(e);
    const int64_t d = hp->n_embd, p0 = L->s0[a->j], n = L->s0[a->j + 1] - p0;
    const size_t rb = e->rec_bytes;
    const uint32_t t = e->gu_type;
    double t0 = now();
    const float *xb = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    /* Records by their index in the region (the cache's and the spill
     * area's buffers are parts of it, on the CPU: the same addresses). */
    const char *mat = e->region;
    const int32_t *idx = (const int32_t *)STARPU_VECTOR_GET_PTR(buffers[2]);
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[4]);
    const bool bias = e->m->w.layers[a->l].ffn_up_b.data != NULL;
    const float *b = bias ? e->region_bias : NULL;
    const void *xa = convert_input(e, t, xb, sc->xq);
    const char *gate = e->gate_off >= 0 ? mat + e->gate_off : NULL;
    const char *up = e->up_off >= 0 ? mat + e->up_off : NULL;
    int64_t k = 0;
    if (e->p.mode == SI_SPARSITY_PREDICTOR) {
        for (int64_t q = 0; q < n && idx[q] >= 0; q++) {
            const int32_t s = record_of(e, L, p0 + idx[q]);
            if (s >= 0) /* < 0 only after a failed load (reported by eval) */
                sc->ix[k++] = s;
        }
        if (xa != NULL) {
            si_k_ffn_act_sparse(hp->ffn_kind, hp->act, t, gate, up, b, rb, d, xa, sc->ix, k,
                                sc->h);
        } else {
            for (int64_t q = 0; q < k; q++) {
                const size_t o = (size_t)sc->ix[q] * rb;
                sc->h[q] = neuron(e, gate != NULL ? gate + o : NULL, up + o,
                                  b != NULL ? b + sc->ix[q] : NULL, xa, xb);
            }
        }
        L->rd[a->j] = k * (int64_t)e->gu_row * (gate != NULL ? 2 : 1);
    } else {
        for (int64_t q = 0; q < n && idx[q] >= 0; q++) {
            const int32_t s = record_of(e, L, p0 + idx[q]);
            if (s < 0)
                continue;
            float h = L->gact[p0 + idx[q]];
            if (hp->ffn_kind != SI_FFN_PLAIN) {
                float u = dot(t, up + (size_t)s * rb, xa, xb, d);
                L->rd[a->j] += (int64_t)e->gu_row; /* after gmask's gating rows */
                if (b != NULL)
                    u += b[s];
                h = si_act_gated(hp->ffn_kind, h, u);
            }
            if (h == 0.0f)
                continue;
            sc->h[k] = h;
            sc->ix[k++] = s;
        }
    }
    si_k_ffn_down_sparse(e->dt_type, mat + e->dt_off, rb, d, sc->h, sc->ix, k, y);
    int64_t computed = 0;
    for (int64_t q = 0; q < k; q++)
        computed += sc->h[q] != 0.0f;
    L->active[a->j] = computed;
    L->rd[a->j] += computed * (int64_t)e->dt_row;
    account(e, SI_TASK_FFN_COLD, t0);
}

/* ------------------------------------------------------------ other tasks */

static void embed_cpu(void *buffers[], void *cl_arg)
{
    (void)buffers;
    struct task_arg *a = cl_arg;
    double t0 = now();
    si_ref_begin(a->e->ref, a->token); /* checked before submission */
    account(a->e, SI_TASK_EMBED, t0);
}

/*
 * The merge of layer l's FFN (l >= 0) into the residual: xb2 = the slices'
 * partial outputs added in slice order (dense layout: the down projection's
 * blocks side by side) plus the down bias, then x_out =
 * si_ref_ffn_finish_into(x, xb2, xb3).  The partial outputs (blocks) are
 * buffers[b0 ..]; the same bits wherever it runs.
 */
static void merge_into(struct si_engine *e, int l, void *buffers[], int b0, const float *x,
                       const float *xb3, float *xb2, float *x_out, float *tmp)
{
    const struct layer *L = &e->L[l];
    const struct si_layer *W = &e->m->w.layers[l];
    const int64_t d = e->m->hp.n_embd;
    bool first = true;
    for (int32_t k = 0; !e->sparse && k < e->nd; k++)
        memcpy(xb2 + e->dn[k], (const float *)STARPU_VECTOR_GET_PTR(buffers[b0 + k]),
               (size_t)(e->dn[k + 1] - e->dn[k]) * sizeof(float));
    for (int32_t j = 0; e->sparse && j < L->nsl; j++) {
        const float *p = (const float *)STARPU_VECTOR_GET_PTR(buffers[b0 + j]);
        for (int32_t r = 0; r < L->rows[j]; r++, p += d, first = false)
            for (int64_t i = 0; i < d; i++)
                xb2[i] = first ? p[i] : xb2[i] + p[i];
    }
    if (W->ffn_down_b.data != NULL) {
        const float *b = W->ffn_down_b.data;
        for (int64_t i = 0; i < d; i++)
            xb2[i] += b[i];
    }
    si_ref_ffn_finish_into(e->ref, l, x, xb2, xb3, x_out, tmp);
}

/* Buffers that carry layer l - 1's FFN output to layer l's first tasks
 * (attn, or the LM head for l = n_layer): its slices' partial outputs (dense
 * mode: the down projection's blocks), then its attention output xb3 with a
 * parallel residual.  None at l = 0 and in redux mode, where a merge task
 * adds them into x. */
static int n_carried(const struct si_engine *e, int l)
{
    if (l == 0 || e->p.redux)
        return 0;
    return (e->sparse ? e->L[l - 1].nsl : e->nd) + (e->m->hp.parallel_residual ? 1 : 0);
}

/* x_out = layer l's input residual: x, plus layer l - 1's FFN when carried
 * in buffers[b0 ..] (see n_carried).  Returns the time spent merging. */
static double residual_in(struct si_engine *e, int l, void *buffers[], int b0, const float *x,
                          float *x_out, struct scratch *sc)
{
    const int64_t d = e->m->hp.n_embd;
    if (n_carried(e, l) == 0) {
        if (x_out != x)
            memcpy(x_out, x, (size_t)d * sizeof(float));
        return 0.0;
    }
    const double t0 = now();
    const int np = e->sparse ? e->L[l - 1].nsl : e->nd;
    const float *xb3 =
        e->m->hp.parallel_residual ? (const float *)STARPU_VECTOR_GET_PTR(buffers[b0 + np]) : NULL;
    merge_into(e, l - 1, buffers, b0, x, xb3, sc->xf, x_out, sc->tmp);
    return now() - t0;
}

/* Charge `seconds` to this worker's counter of kind k (one task). */
static void charge(struct si_engine *e, enum si_task_kind k, double seconds)
{
    struct scratch *sc = my_scratch(e);
    sc->busy[k] += seconds;
    sc->count[k]++;
}

/*
 * attn_L (attention in one task, when its products are not split): layer
 * l - 1's FFN added into x, then the reference's whole attention step on
 * it (x += attention; xb = the FFN's input).
 * Buffers: x (RW), the carried ones (R), xb (W), [xb3 (W)], K, V (RW),
 * Wq, Wk, Wv, Wo (R).
 */
static void attn_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si_ref *s = e->ref;
    double t0 = now();
    const double tm = residual_in(e, a->l, buffers, 1, s->x, s->x, my_scratch(e));
    si_ref_attn(s, a->l);
    charge(e, SI_TASK_MERGE, tm);
    charge(e, SI_TASK_ATTN, now() - t0 - tm);
}

/* Rows [r0, r1) of w as a tensor of their own (si_ref_matvec on a slice). */
static struct si_tensor rows_of(const struct si_tensor *w, int64_t r0, int64_t r1)
{
    struct si_tensor v = *w;
    v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    v.ne[1] = r1 - r0;
    v.nbytes = (size_t)(r1 - r0) * w->row_bytes;
    return v;
}

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
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->m->w.layers[a->l];
    struct scratch *sc = my_scratch(e);
    double t0 = now();
    const int j = a->j, hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const int nc = n_carried(e, a->l);
    const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    float *att = (float *)STARPU_VECTOR_GET_PTR(buffers[1 + nc + 5]);
    float *xl = j == 0 ? (float *)STARPU_VECTOR_GET_PTR(buffers[1 + nc + 6]) : sc->xl;
    const double tm = residual_in(e, a->l, buffers, 1, x, xl, sc);
    si_ref_attn_input(e->ref, a->l, xl, sc->xn, sc->tmp);
    const int64_t g0 = e->a_g[j], g1 = e->a_g[j + 1];
    const int64_t q0 = g0 * group * hd, q1 = g1 * group * hd, k0 = g0 * hd, k1 = g1 * hd;
    struct si_tensor wq = rows_of(&W->wq, q0, q1), wk = rows_of(&W->wk, k0, k1),
                     wv = rows_of(&W->wv, k0, k1);
    si_ref_matvec(e->p.ref.act_quant, sc->xq, sc->aq + q0, &wq, sc->xn);
    si_ref_matvec(e->p.ref.act_quant, sc->xq, sc->ak + k0, &wk, sc->xn);
    si_ref_matvec(e->p.ref.act_quant, sc->xq, sc->av + k0, &wv, sc->xn);
    si_ref_attn_group(e->ref, a->l, (int)g0, (int)g1, sc->aq, sc->ak, sc->av, sc->aatt,
                      sc->ascr);
    memcpy(att, sc->aatt + q0, (size_t)(q1 - q0) * sizeof(float));
    charge(e, SI_TASK_MERGE, tm);
    charge(e, SI_TASK_ATTN, now() - t0 - tm);
}

/* Buffers: att_* (R: the whole attention output, the groups' children in
 * order), Wo (R), o_j (W). */
static void ao_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct scratch *sc = my_scratch(e);
    double t0 = now();
    /* The children are consecutive parts of one array in main memory. */
    const float *att = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[e->ng + 1]);
    struct si_tensor wo = rows_of(&e->m->w.layers[a->l].wo, e->a_o[a->j], e->a_o[a->j + 1]);
    si_ref_matvec(e->p.ref.act_quant, sc->xq, y, &wo, att);
    account(e, SI_TASK_ATTN_PROJ, t0);
}

/* Buffers: x2 (R: the layer's input residual), o_* (R), x (W: the residual
 * after attention), xb (W: the FFN's input), [xb3 (W)]. */
static void aout_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si_ref *s = e->ref;
    struct scratch *sc = my_scratch(e);
    double t0 = now();
    const float *x2 = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    for (int32_t j = 0; j < e->na; j++)
        memcpy(sc->xf + e->a_o[j], (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + j]),
               (size_t)(e->a_o[j + 1] - e->a_o[j]) * sizeof(float));
    si_ref_attn_finish_into(s, a->l, x2, sc->xf, s->x, s->xb, s->xb3, sc->tmp);
    account(e, SI_TASK_ATTN, t0);
}

/*
 * The FFN's input of slice j in buffers[*i ..] (advancing *i past it): the
 * ffn_in handle, or, with fuse_out, attn_out's work done by each slice
 * alike: x2 and o_* (R) give the residual after attention and its
 * normalised input, in scratch; slice 0 also writes the residual into x
 * and, with a parallel residual, the attention output into xb3, its last
 * buffers (from owner_at - 1 or - 2 on: the task's buffer count).
 */
static const float *ffn_input(struct si_engine *e, int l, int j, void *buffers[], int *i,
                              int owner_at, struct scratch *sc)
{
    if (!e->fuse_out)
        return (const float *)STARPU_VECTOR_GET_PTR(buffers[(*i)++]);
    const float *x2 = (const float *)STARPU_VECTOR_GET_PTR(buffers[(*i)++]);
    for (int32_t k = 0; k < e->na; k++)
        memcpy(sc->xf + e->a_o[k], (const float *)STARPU_VECTOR_GET_PTR(buffers[(*i)++]),
               (size_t)(e->a_o[k + 1] - e->a_o[k]) * sizeof(float));
    float *x_out = sc->xl, *xb3 = sc->xo;
    if (j == 0) {
        const int par = e->h_xb3 != NULL;
        x_out = (float *)STARPU_VECTOR_GET_PTR(buffers[owner_at - 1 - par]);
        if (par)
            xb3 = (float *)STARPU_VECTOR_GET_PTR(buffers[owner_at - 1]);
    }
    si_ref_attn_finish_into(e->ref, l, x2, sc->xf, x_out, sc->xn, xb3, sc->tmp);
    return sc->xn;
}

/* lm_head.j: the last layer's FFN added into x (every slice alike), the
 * output norm, then rows [a_h[j], a_h[j+1]) of the LM head.
 * Buffers: x (R), the carried ones (R), output (R), logits child j (W). */
static void head_rows_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct scratch *sc = my_scratch(e);
    double t0 = now();
    const int nc = n_carried(e, e->m->hp.n_layer);
    const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[nc + 2]);
    const double tm = residual_in(e, e->m->hp.n_layer, buffers, 1, x, sc->xl, sc);
    si_ref_head_input(e->ref, sc->xl, sc->xn, sc->tmp);
    struct si_tensor w = rows_of(&e->m->w.output, e->a_h[a->j], e->a_h[a->j + 1]);
    si_ref_matvec(e->p.ref.act_quant, sc->xq, y, &w, sc->xn);
    charge(e, SI_TASK_MERGE, tm);
    charge(e, SI_TASK_HEAD, now() - t0 - tm);
}

/* Buffers: ffn_in, fc1, fc2 (position order), idx of each slice (W). */
static void pred_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct layer *L = &e->L[a->l];
    const struct si_layer *W = &e->m->w.layers[a->l];
    struct scratch *sc = my_scratch(e);
    double t0 = now();
    const float *xb = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    struct si_tensor fc2 = W->fc2;
    fc2.data = (const void *)STARPU_VECTOR_GET_PTR(buffers[2]);
    /* The reference's predictor on fc2's rows in position order: the
     * selection comes out in position order, then as each slice's list. */
    uint8_t *sel = (uint8_t *)sc->ix; /* n_ff bytes of the n_ff int32 */
    si_ref_predict(&W->fc1, &fc2, e->m->predictor_threshold, e->p.ref.act_quant, sc->xq, xb,
                   sc->h, sc->y, sel);
    for (int32_t j = 0; j < L->nsl; j++) {
        int32_t *idx = (int32_t *)STARPU_VECTOR_GET_PTR(buffers[3 + j]);
        const int64_t p0 = L->s0[j], n = L->s0[j + 1] - p0;
        int64_t k = 0;
        for (int64_t p = 0; p < n; p++)
            if (sel[p0 + p])
                idx[k++] = (int32_t)p;
        for (; k < n; k++)
            idx[k] = -1;
    }
    account(e, SI_TASK_PRED, t0);
}

/*
 * Dense mode: the activations of layer l's slices, in order, gathered from
 * their outputs (buffers[0 .. nsl)) into h (n_ff floats), for token t of a
 * batch (each slice's output token-major, as many floats per token as the
 * slice has neurons; t = 0 for one token).
 */
static void gather(const struct layer *L, void *buffers[], int64_t t, float *h)
{
    for (int32_t j = 0; j < L->nsl; j++) {
        const int64_t n = L->s0[j + 1] - L->s0[j];
        memcpy(h + L->s0[j], (const float *)STARPU_VECTOR_GET_PTR(buffers[j]) + t * n,
               (size_t)n * sizeof(float));
    }
}

/*
 * Dense mode: block k = a->j of layer l's down projection, outputs [dn[k],
 * dn[k+1]): each one dot over all the layer's neurons, the reference's own
 * matrix-vector product on those rows (si_ref_matvec), so the same bits.
 * Buffers: the slices' outputs (R), the block's rows of ffn_down (R), the
 * block's output (W).
 */
static void down_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct layer *L = &e->L[a->l];
    struct scratch *sc = my_scratch(e);
    double t0 = now();
    gather(L, buffers, 0, sc->h);
    struct si_tensor rows = e->m->w.layers[a->l].ffn_down;
    rows.ne[1] = e->dn[a->j + 1] - e->dn[a->j];
    rows.data = (const void *)STARPU_MATRIX_GET_PTR(buffers[L->nsl]);
    si_ref_matvec(e->p.ref.act_quant, sc->hq, (float *)STARPU_VECTOR_GET_PTR(buffers[L->nsl + 1]),
                  &rows, sc->h);
    account(e, SI_TASK_FFN_DOWN, t0);
}

/* Redux mode: x += the layer's FFN output, the sum StarPU reduced into
 * y, which is left at zero for the next token.  Buffers: x (RW), y (RW). */
static void merge_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si_ref *s = e->ref;
    const struct si_layer *W = &e->m->w.layers[a->l];
    const int64_t d = e->m->hp.n_embd;
    double t0 = now();
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    memcpy(s->xb2, y, (size_t)d * sizeof(float));
    memset(y, 0, (size_t)d * sizeof(float));
    if (W->ffn_down_b.data != NULL) {
        const float *b = W->ffn_down_b.data;
        for (int64_t i = 0; i < d; i++)
            s->xb2[i] += b[i];
    }
    si_ref_ffn_finish(s, a->l);
    account(e, SI_TASK_MERGE, t0);
}

/* norm+lm_head (one task): the last layer's FFN added into x, then the
 * reference's head.  Buffers: x (RW), the carried ones (R), xb (RW),
 * logits (W), output (R). */
static void head_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si_ref *s = e->ref;
    double t0 = now();
    const double tm = residual_in(e, e->m->hp.n_layer, buffers, 1, s->x, s->x, my_scratch(e));
    si_ref_end(s);
    charge(e, SI_TASK_MERGE, tm);
    charge(e, SI_TASK_HEAD, now() - t0 - tm);
}

/* Redux mode: the layer output starts at zero and workers' shares add up. */
static void zero_cpu(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    memset((void *)STARPU_VECTOR_GET_PTR(buffers[0]), 0,
           STARPU_VECTOR_GET_NX(buffers[0]) * sizeof(float));
}

static void sum_cpu(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    float *dst = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const float *src = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    for (uint32_t i = 0; i < STARPU_VECTOR_GET_NX(buffers[0]); i++)
        dst[i] += src[i];
}

/* ------------------------------------------------------------ prefill */

/*
 * The batch tasks run the reference's per-token steps on rows of the batch
 * arrays by pointing the reference state's x, xb and xb3 at them; the tasks
 * that touch that state are ordered by the batch residual (RW), and each
 * restores the pointers before it returns.
 */
struct saved {
    float *x, *xb, *xb3;
};

static struct saved point_at(struct si_engine *e, int32_t t)
{
    struct si_ref *s = e->ref;
    const size_t d = (size_t)e->m->hp.n_embd;
    struct saved sv = {s->x, s->xb, s->xb3};
    s->x = e->bx + (size_t)t * d;
    s->xb = e->bxb + (size_t)t * d;
    s->xb3 = e->bxb3 + (size_t)t * d;
    s->n_past = e->bp0 + t;
    return sv;
}

static void restore(struct si_engine *e, struct saved sv)
{
    e->ref->x = sv.x;
    e->ref->xb = sv.xb;
    e->ref->xb3 = sv.xb3;
}

static void bembed_cpu(void *buffers[], void *cl_arg)
{
    (void)buffers;
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    double t0 = now();
    for (int32_t t = 0; t < e->bn; t++) {
        struct saved sv = point_at(e, t);
        si_ref_begin(e->ref, e->btok[t]); /* checked before submission */
        restore(e, sv);
    }
    account(e, SI_TASK_PREFILL_EMBED, t0);
}

static void battn_cpu(void *buffers[], void *cl_arg)
{
    (void)buffers;
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    double t0 = now();
    for (int32_t t = 0; t < e->bn; t++) {
        struct saved sv = point_at(e, t);
        si_ref_attn(e->ref, a->l);
        restore(e, sv);
    }
    account(e, SI_TASK_PREFILL_ATTN, t0);
}

/* h = act(g) * u (or act(u) for the plain kind) over a batch of rows, with
 * gate mode's threshold; the up bias already added to u. */
static void batch_act(const struct si_engine *e, int l, float *g, float *u, int64_t count)
{
    const struct si_hparams *hp = &e->m->hp;
    const float t = e->gthr[l];
    const bool thr = e->p.mode == SI_SPARSITY_GATE && hp->act != SI_ACT_RELU &&
                     hp->ffn_kind != SI_FFN_PLAIN && t > 0.0f;
    for (int64_t k = 0; k < count; k++) {
        if (hp->ffn_kind == SI_FFN_PLAIN) {
            u[k] = si_act_apply(hp->act, u[k]);
            continue;
        }
        float a = si_act_apply(hp->act, g[k]);
        u[k] = thr && !(fabsf(a) > t) ? 0.0f : si_act_gated(hp->ffn_kind, a, u[k]);
    }
}

/*
 * y[t][r] = row r . xa[t] for a tile of rows at a time (the rows stay in
 * cache while every token of the batch uses them): the reference's own dot
 * on activations converted by si_quantize_act, so each value equals the
 * token-by-token one bit for bit.  xa[t] at xa + t * xa_stride bytes.
 */
static void gemm_act(uint32_t type, const char *w, size_t row_bytes, int64_t n_rows, int64_t n_cols,
                     const char *xa, size_t xa_stride, int64_t n_tok, float *y, int64_t ldy)
{
    enum { TILE = 8 };
    for (int64_t r0 = 0; r0 < n_rows; r0 += TILE) {
        const int64_t r1 = r0 + TILE < n_rows ? r0 + TILE : n_rows;
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = r0; r < r1; r++)
                y[t * ldy + r] = si_vec_dot_act(type, w + (size_t)r * row_bytes,
                                                xa + (size_t)t * xa_stride, n_cols);
    }
}

/*
 * A slice for the whole batch, every neuron: G = gate X and U = up X, H,
 * then (sparse layouts) Y = down H.  With converted activations (act_quant)
 * the products are the reference's own dots over row tiles (gemm_act) and,
 * for neuron records, each token's non-zero activations go through the
 * sparse down kernel, as in decoding; with float activations, OpenBLAS:
 * si_k_gemm, and for records the down_t rows dequantized DT_TILE at a time
 * for sgemm.  Buffers as ffn_cpu's without idx; the output last: (n_batch,
 * rows, n_embd), or dense, H (n_batch, n) for bdown_cpu.
 */
static void bffn_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct layer *L = &e->L[a->l];
    struct scratch *sc = my_scratch(e);
    const struct si_hparams *hp = &e->m->hp;
    const int64_t d = hp->n_embd, n = L->s0[a->j + 1] - L->s0[a->j], bn = e->bn;
    const bool bias = e->m->w.layers[a->l].ffn_up_b.data != NULL;
    double t0 = now();
    int i = 0;
    const float *xb = (const float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    const char *gate = NULL, *up = NULL, *rec = NULL;
    size_t gs = e->gu_row, us = e->gu_row;
    if (!e->sparse) {
        if (e->has_gate)
            gate = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
        up = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    } else {
        const char *pre = e->pre_sep ? (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]) : NULL;
        rec = (const char *)STARPU_VECTOR_GET_PTR(buffers[i++]);
        if (e->has_gate) {
            gate = pre != NULL ? pre : rec + e->gate_off;
            gs = pre != NULL ? e->gu_row : e->rec_bytes;
        }
        up = e->up_off >= 0 ? rec + e->up_off : pre;
        us = e->up_off >= 0 ? e->rec_bytes : e->gu_row;
    }
    const float *b = bias ? (const float *)STARPU_VECTOR_GET_PTR(buffers[i]) : NULL;
    i++;
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    /* The reference's dots where exactness is asked for, or the batch is too
     * small for sgemm to repay the dequantization; else OpenBLAS. */
    const bool q = e->p.ref.act_quant && (e->p.exact_prefill || bn < BLAS_MIN_BATCH);
    if (q) {
        size_t xa_row = 0;
        const uint32_t at = si_act_type(e->gu_type);
        si_type_row_size(at, d, &xa_row);
        char *xa = sc->gemm;
        for (int64_t t = 0; t < bn; t++)
            si_quantize_act(at, xb + t * d, xa + (size_t)t * xa_row, d);
        if (gate != NULL)
            gemm_act(e->gu_type, gate, gs, n, d, xa, xa_row, bn, sc->bg, n);
        gemm_act(e->gu_type, up, us, n, d, xa, xa_row, bn, sc->bu, n);
    } else {
        int rc = SI_OK;
        if (gate != NULL)
            rc = si_k_gemm(e->gu_type, gate, gs, n, d, xb, d, bn, sc->bg, n, sc->gemm);
        if (rc == SI_OK)
            rc = si_k_gemm(e->gu_type, up, us, n, d, xb, d, bn, sc->bu, n, sc->gemm);
        STARPU_ASSERT_MSG(rc == SI_OK, "prefill GEMM refused its shapes");
    }
    if (b != NULL)
        for (int64_t t = 0; t < bn; t++)
            for (int64_t k = 0; k < n; k++)
                sc->bu[t * n + k] += b[k];
    batch_act(e, a->l, sc->bg, sc->bu, bn * n);
    if (!e->sparse) {
        memcpy(y, sc->bu, (size_t)(bn * n) * sizeof(float));
    } else if (q) {
        for (int64_t t = 0; t < bn; t++) {
            const float *h = sc->bu + t * n;
            int64_t k = 0;
            for (int64_t c = 0; c < n; c++)
                if (h[c] != 0.0f) {
                    sc->h[k] = h[c];
                    sc->ix[k++] = (int32_t)c;
                }
            si_k_ffn_down_sparse(e->dt_type, rec + e->dt_off, e->rec_bytes, d, sc->h, sc->ix, k,
                                 y + t * d);
        }
    } else {
        const char *dt = rec + e->dt_off;
        for (int64_t k0 = 0; k0 < n; k0 += DT_TILE) {
            const int64_t kb = n - k0 < DT_TILE ? n - k0 : DT_TILE;
            for (int64_t k = 0; k < kb; k++)
                si_dequantize_row(e->dt_type, dt + (size_t)(k0 + k) * e->rec_bytes,
                                  sc->dt + (size_t)k * d, d);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)bn, (int)d, (int)kb, 1.0f,
                        sc->bu + k0, (int)n, sc->dt, (int)d, k0 == 0 ? 0.0f : 1.0f, y, (int)d);
        }
        if (n == 0)
            memset(y, 0, (size_t)(bn * d) * sizeof(float));
    }
    account(e, SI_TASK_PREFILL_FFN, t0);
}

/*
 * down_cpu for a batch: each token's activations gathered from the slices'
 * outputs; with converted activations (act_quant) the reference's product
 * per token, as in decoding; with float activations (act_quant off, or a
 * batch of BLAS_MIN_BATCH tokens or more without exact_prefill, as bffn_cpu
 * decides), OpenBLAS on H.  Output: (n_batch, block rows), token-major.
 */
static void bdown_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const struct layer *L = &e->L[a->l];
    struct scratch *sc = my_scratch(e);
    const int64_t ff = e->m->hp.n_ff, bn = e->bn, no = e->dn[a->j + 1] - e->dn[a->j];
    double t0 = now();
    struct si_tensor rows = e->m->w.layers[a->l].ffn_down;
    rows.ne[1] = no;
    rows.data = (const void *)STARPU_MATRIX_GET_PTR(buffers[L->nsl]);
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[L->nsl + 1]);
    const bool q = e->p.ref.act_quant && (e->p.exact_prefill || bn < BLAS_MIN_BATCH);
    for (int64_t t = 0; t < bn; t++)
        gather(L, buffers, t, sc->bu + t * ff);
    if (q) {
        for (int64_t t = 0; t < bn; t++)
            si_ref_matvec(true, sc->hq, y + t * no, &rows, sc->bu + t * ff);
    } else {
        int rc = si_k_gemm(rows.type, rows.data, rows.row_bytes, no, ff, sc->bu, ff, bn, y, no,
                           sc->gemm);
        STARPU_ASSERT_MSG(rc == SI_OK, "prefill GEMM refused its shapes");
    }
    account(e, SI_TASK_PREFILL_FFN_DOWN, t0);
}

static void bmerge_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct layer *L = &e->L[a->l];
    struct si_ref *s = e->ref;
    const struct si_layer *W = &e->m->w.layers[a->l];
    const int64_t d = e->m->hp.n_embd;
    double t0 = now();
    for (int32_t t = 0; t < e->bn; t++) {
        for (int32_t k = 0; !e->sparse && k < e->nd; k++) {
            const int64_t no = e->dn[k + 1] - e->dn[k];
            memcpy(s->xb2 + e->dn[k],
                   (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + k]) + (size_t)t * (size_t)no,
                   (size_t)no * sizeof(float));
        }
        bool first = true;
        for (int32_t j = 0; e->sparse && j < L->nsl; j++) {
            const float *p = (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + j]) +
                             (size_t)t * (size_t)L->rows[j] * (size_t)d;
            for (int32_t r = 0; r < L->rows[j]; r++, p += d, first = false)
                for (int64_t o = 0; o < d; o++)
                    s->xb2[o] = first ? p[o] : s->xb2[o] + p[o];
        }
        if (W->ffn_down_b.data != NULL)
            for (int64_t o = 0; o < d; o++)
                s->xb2[o] += ((const float *)W->ffn_down_b.data)[o];
        struct saved sv = point_at(e, t);
        si_ref_ffn_finish(s, a->l);
        restore(e, sv);
    }
    account(e, SI_TASK_PREFILL_MERGE, t0);
}

static void bhead_cpu(void *buffers[], void *cl_arg)
{
    (void)buffers;
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    double t0 = now();
    /* the last token's logits; xb is the state's own (the logits' input) */
    struct si_ref *s = e->ref;
    float *x = s->x;
    s->x = e->bx + (size_t)(e->bn - 1) * (size_t)e->m->hp.n_embd;
    s->n_past = e->bp0 + e->bn - 1;
    si_ref_end(s);
    s->x = x;
    account(e, SI_TASK_PREFILL_HEAD, t0);
}

static struct starpu_perfmodel battn_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_batch"};
static struct starpu_perfmodel bffn_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_ffn_gemm"};
static struct starpu_perfmodel bmerge_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_merge_batch"};
static struct starpu_perfmodel bembed_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_embed_batch"};
static struct starpu_perfmodel bhead_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_head_batch"};

static struct starpu_codelet cl_bembed = {
    .cpu_funcs = {bembed_cpu},
    .nbuffers = 1,
    .modes = {STARPU_W},
    .model = &bembed_model,
    .name = "embed_batch",
};
static struct starpu_codelet cl_battn = {
    .cpu_funcs = {battn_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &battn_model,
    .name = "attn_batch",
};
static struct starpu_codelet cl_bffn = {
    .cpu_funcs = {bffn_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &bffn_model,
    .name = "ffn_batch",
};
static struct starpu_codelet cl_bmerge = {
    .cpu_funcs = {bmerge_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &bmerge_model,
    .name = "merge_batch",
};
static struct starpu_perfmodel bdown_model = {.type = STARPU_HISTORY_BASED,
                                             .symbol = "si_ffn_down_batch"};
static struct starpu_codelet cl_bdown = {
    .cpu_funcs = {bdown_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &bdown_model,
    .name = "ffn_down_batch",
};
static struct starpu_codelet cl_bhead = {
    .cpu_funcs = {bhead_cpu},
    .nbuffers = 4,
    .modes = {STARPU_R, STARPU_RW, STARPU_W, STARPU_R},
    .model = &bhead_model,
    .name = "norm+lm_head",
};

static struct starpu_perfmodel embed_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_embed_f32"};
static struct starpu_perfmodel attn_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_f32"};
static struct starpu_perfmodel agrp_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_group"};
static struct starpu_perfmodel ao_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_o"};
static struct starpu_perfmodel aout_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_out"};
static struct starpu_codelet cl_agrp = {
    .cpu_funcs = {attn_grp_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &agrp_model,
    .name = "attn",
};
static struct starpu_codelet cl_ao = {
    .cpu_funcs = {ao_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &ao_model,
    .name = "attn_o",
};
static struct starpu_codelet cl_aout = {
    .cpu_funcs = {aout_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &aout_model,
    .name = "attn_out",
};
static struct starpu_perfmodel head_rows_model = {.type = STARPU_HISTORY_BASED,
                                                  .symbol = "si_lm_head_rows"};
static struct starpu_codelet cl_head_rows = {
    .cpu_funcs = {head_rows_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &head_rows_model,
    .name = "lm_head",
};
static struct starpu_perfmodel pred_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_pred_f32"};
static struct starpu_perfmodel hot_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_ffn_hot"};
static struct starpu_perfmodel cold_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_ffn_cold"};
static struct starpu_perfmodel merge_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_merge_f32"};
static struct starpu_perfmodel head_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_head_f32"};

static struct starpu_codelet cl_embed = {
    .cpu_funcs = {embed_cpu},
    .nbuffers = 1,
    .modes = {STARPU_W},
    .model = &embed_model,
    .name = "embed",
};
static struct starpu_codelet cl_attn = {
    .cpu_funcs = {attn_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &attn_model,
    .name = "attn",
};
static struct starpu_codelet cl_pred = {
    .cpu_funcs = {pred_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &pred_model,
    .name = "pred",
};
static struct starpu_codelet cl_hot = {
    .cpu_funcs = {ffn_cpu},
#ifdef SI_USE_CUDA
    .cuda_funcs = {ffn_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &hot_model,
    .name = "ffn_hot",
};
static struct starpu_codelet cl_cold = {
    .cpu_funcs = {ffn_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &cold_model,
    .name = "ffn_cold",
};
static struct starpu_perfmodel gmask_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_gmask"};
static struct starpu_perfmodel load_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_flash_load"};
static struct starpu_perfmodel flash_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_ffn_flash"};
static struct starpu_codelet cl_gmask = {
    .cpu_funcs = {gmask_cpu},
    .nbuffers = 4,
    .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_W},
    .model = &gmask_model,
    .name = "gmask",
};
static struct starpu_codelet cl_load = {
    .cpu_funcs = {load_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &load_model,
    .name = "load",
};
static struct starpu_codelet cl_flash = {
    .cpu_funcs = {ffn_flash_cpu},
    .nbuffers = 5,
    .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W},
    .model = &flash_model,
    .name = "ffn_cold",
};
static struct starpu_perfmodel down_model = {.type = STARPU_HISTORY_BASED,
                                            .symbol = "si_ffn_down"};
static struct starpu_codelet cl_down = {
    .cpu_funcs = {down_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &down_model,
    .name = "ffn_down",
};
static struct starpu_codelet cl_merge = {
    .cpu_funcs = {merge_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &merge_model,
    .name = "merge",
};
static struct starpu_codelet cl_head = {
    .cpu_funcs = {head_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &head_model,
    .name = "norm+lm_head",
};
static struct starpu_perfmodel zero_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_zero_f32"};
static struct starpu_perfmodel sum_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_sum_f32"};
static struct starpu_codelet cl_zero = {
    .cpu_funcs = {zero_cpu},
    .nbuffers = 1,
    .modes = {STARPU_W},
    .model = &zero_model,
    .name = "zero",
};
static struct starpu_codelet cl_sum = {
    .cpu_funcs = {sum_cpu},
    .nbuffers = 2,
    .modes = {STARPU_RW | STARPU_COMMUTE, STARPU_R},
    .model = &sum_model,
    .name = "sum",
};

/* Create and submit a task on codelet cl with handles h[0..n); `where`
 * restricts its workers (0: the codelet's).  -errno or 0. */
static int submit(struct si_engine *e, struct starpu_codelet *cl, const char *name, int l, int j,
                  int32_t token, starpu_data_handle_t *h, enum starpu_data_access_mode *modes,
                  int n, uint32_t where)
{
    struct task_arg *a = malloc(sizeof *a);
    if (a == NULL)
        return -ENOMEM;
    *a = (struct task_arg){.e = e, .l = l, .j = j, .token = token};
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

/* ------------------------------------------------------------ placement */


/* Child C of matrix F: nx x ny elements from byte offset off, F's ld. */
static void matrix_part(const struct starpu_matrix_interface *F, struct starpu_matrix_interface *C,
                        uint32_t nx, uint32_t ny, size_t off)
{
    C->id = F->id;
    C->nx = nx;
    C->ny = ny;
    C->elemsize = F->elemsize;
    if (F->dev_handle) {
        if (F->ptr)
            C->ptr = F->ptr + off;
        C->ld = F->ld;
        C->dev_handle = F->dev_handle;
        C->offset = F->offset + off;
        C->allocsize = (size_t)C->ld * C->ny * C->elemsize;
    } else {
        C->allocsize = (size_t)C->nx * C->ny * C->elemsize;
    }
}

/* Column byte ranges of a matrix's rows: a child per range (the KV cache's kv-head groups). */
static void filter_cols(void *father, void *child, struct starpu_data_filter *f, unsigned id,
                        unsigned nparts)
{
    (void)nparts;
    const struct starpu_matrix_interface *F = father;
    struct starpu_matrix_interface *C = child;
    const size_t *cols = f->filter_arg_ptr;
    matrix_part(F, C, (uint32_t)(cols[id + 1] - cols[id]), F->ny, cols[id] * F->elemsize);
}

/* Row blocks of ffn_down (dense layout): child k holds rows [dn[k], dn[k+1]). */
static void filter_rows(void *father, void *child, struct starpu_data_filter *f, unsigned id,
                        unsigned nparts)
{
    (void)nparts;
    const struct starpu_matrix_interface *F = father;
    struct starpu_matrix_interface *C = child;
    const int64_t *dn = f->filter_arg_ptr;
    matrix_part(F, C, F->nx, (uint32_t)(dn[id + 1] - dn[id]),
                (size_t)dn[id] * F->ld * F->elemsize);
}

/*
 * Neurons per unit of dense mode's slices: 256 where the FFN width is a
 * multiple of it (and of the weights' and activations' blocks), else a
 * block, else the whole width.
 */
static int64_t dense_unit(const struct si_model *m)
{
    const struct si_tensor *w = &m->w.layers[0].ffn_down;
    const struct si_type_traits *tw = si_type_get(w->type);
    const struct si_type_traits *ta = si_type_get(si_act_type(w->type));
    int64_t unit = 256;
    if (unit % tw->block != 0 || unit % ta->block != 0 || m->hp.n_ff % unit != 0)
        unit = tw->block > ta->block ? tw->block : ta->block;
    if (m->hp.n_ff % unit != 0)
        unit = m->hp.n_ff;
    return unit;
}

/* The FFN layout of mode on m: the fields of e from sparse to rec_bytes. */
static void layout_of(const struct si_model *m, enum si_sparsity mode, struct si_engine *e)
{
    const struct si_hparams *hp = &m->hp;
    const struct si_layer *W0 = &m->w.layers[0];
    e->sparse = mode != SI_SPARSITY_DENSE;
    e->has_gate = hp->ffn_kind != SI_FFN_PLAIN;
    e->gu_type = W0->ffn_up.type;
    e->gu_row = W0->ffn_up.row_bytes;
    e->chunk = dense_unit(m);
    if (!e->sparse)
        return;
    /* down_t rows: the file's, or ffn_down transposed (F32, F16 exact;
     * other types rounded to F16) */
    if (W0->ffn_down_t.data != NULL) {
        e->dt_type = W0->ffn_down_t.type;
        e->dt_row = W0->ffn_down_t.row_bytes;
    } else {
        uint32_t t = W0->ffn_down.type;
        e->dt_type = t == SI_TYPE_F32 || t == SI_TYPE_F16 ? t : SI_TYPE_F16;
        si_type_row_size(e->dt_type, hp->n_embd, &e->dt_row);
    }
    /* Predictor mode reads a chosen neuron's rows together: all in its
     * record.  Gate mode reads every gating row: those apart, dense. */
    e->pre_sep = mode == SI_SPARSITY_GATE;
    size_t off = 0;
    e->gate_off = e->up_off = -1;
    if (e->has_gate && !e->pre_sep) {
        e->gate_off = (ptrdiff_t)off;
        off += e->gu_row;
    }
    if (e->has_gate || !e->pre_sep) {
        e->up_off = (ptrdiff_t)off;
        off += e->gu_row;
    }
    e->dt_off = off;
    e->rec_bytes = (e->dt_off + e->dt_row + 31) / 32 * 32;
    if (e->p.flash != NULL) {
        /* the store's records, which the cache holds as they are on disk */
        const struct si_flash_format *f = &e->p.flash->f;
        e->gate_off = e->gate_off >= 0 ? (ptrdiff_t)f->gate_off : -1;
        e->up_off = e->up_off >= 0 ? (ptrdiff_t)f->up_off : -1;
        e->dt_off = f->dt_off;
        e->rec_bytes = f->rec_bytes;
    }
}

const char *si_gpu_item_name(enum si_gpu_item i)
{
    static const char *const names[] = {"attention", "predictor", "kv cache",
                                        "lm_head",   "buffers",   "workspace"};
    return (unsigned)i < SI_GPU_ITEM_COUNT ? names[i] : "?";
}

/* Bytes the GPU holds per hot neuron (sparse) or per hot unit of neurons
 * (dense): the handles' children of the hot slice (register_layer,
 * ffn_cuda), in dense mode its output (the activations) too. */
static int64_t hot_unit_bytes(const struct si_engine *e)
{
    const struct si_hparams *hp = &e->m->hp;
    if (e->sparse)
        return (int64_t)e->rec_bytes + (e->pre_sep ? (int64_t)e->gu_row : 0) +
               (int64_t)sizeof(float) + /* record, gating row, bias, */
               (e->p.mode == SI_SPARSITY_PREDICTOR ? (int64_t)sizeof(int32_t) : 0); /* index */
    (void)hp;
    return e->chunk * ((e->has_gate ? 2 : 1) * (int64_t)e->gu_row + 2 * (int64_t)sizeof(float));
}

/*
 * The reserve, from what ffn_cuda reads and writes (the only CUDA task):
 * the FFN input (ffn_in), the "every neuron" index list (iota, n_ff int32,
 * registered whole), each layer's hot partial output in sparse modes (one
 * row of n_embd floats, reserved for every layer, as any may get a hot
 * slice; dense mode's, the hot activations, count with the hot units), and
 * the task's scratch (2 n_ff floats).  Attention, the predictor, the KV cache and the LM head
 * stay on the CPU in this engine: their bytes go to cpu_bytes.
 */
static void reserve_of(const struct si_engine *e, struct si_gpu_reserve *r)
{
    const struct si_model *m = e->m;
    const struct si_hparams *hp = &m->hp;
    memset(r, 0, sizeof *r);
    const int64_t d = hp->n_embd, ff = hp->n_ff, L = hp->n_layer;
    int64_t att = 0, pred = 0;
    for (int l = 0; l < L; l++) {
        const struct si_layer *W = &m->w.layers[l];
        att += (int64_t)(W->wq.nbytes + W->wk.nbytes + W->wv.nbytes + W->wo.nbytes);
        if (e->p.mode == SI_SPARSITY_PREDICTOR)
            pred += (int64_t)(W->fc1.nbytes + W->fc2.nbytes);
    }
    const int64_t n_ctx = e->p.ref.n_ctx > 0 ? e->p.ref.n_ctx
                          : hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096; /* si_ref_init's */
    r->cpu_bytes[SI_GPU_ATTENTION] = att;
    r->cpu_bytes[SI_GPU_PREDICTOR] = pred;
    r->cpu_bytes[SI_GPU_KV_CACHE] = 2 * L * n_ctx * hp->n_head_kv * hp->head_dim *
                                    (e->p.ref.kv_f16 ? 2 : 4);
    r->cpu_bytes[SI_GPU_LM_HEAD] = (int64_t)m->w.output.nbytes;
    const int64_t rows = e->sparse ? 1 : 0;
    r->bytes[SI_GPU_BUFFERS] = (int64_t)sizeof(float) * (d + L * rows * d) +
                               (int64_t)sizeof(int32_t) * ff;
    r->bytes[SI_GPU_WORKSPACE] = (int64_t)sizeof(float) * 2 * ff;
    for (int i = 0; i < SI_GPU_ITEM_COUNT; i++)
        r->total += r->bytes[i];
    r->unit_bytes = hot_unit_bytes(e);
    r->unit_neurons = e->sparse ? 1 : e->chunk;
    r->any_neurons = e->sparse;
}

static int check(const struct si_model *m, const struct si_engine_params *p, unsigned ncuda,
                 char *err, size_t err_size);

int si_engine_gpu_reserve(const struct si_model *m, const struct si_engine_params *p,
                          struct si_gpu_reserve *r, char *err, size_t err_size)
{
    memset(r, 0, sizeof *r);
    int rc = check(m, p, 0, err, err_size);
    if (rc != SI_OK)
        return rc;
    struct si_engine e = {.m = m, .p = *p};
    layout_of(m, p->mode, &e);
    reserve_of(&e, r);
    return SI_OK;
}

struct ranked {
    int64_t count;
    int32_t l, i;
};

static int cmp_ranked(const void *pa, const void *pb)
{
    const struct ranked *a = pa, *b = pb;
    if (a->count != b->count)
        return a->count > b->count ? -1 : 1;
    if (a->l != b->l)
        return a->l < b->l ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* Placed neurons (l = 0) before the others, then as cmp_ranked. */
static int cmp_placed(const void *pa, const void *pb)
{
    const struct ranked *a = pa, *b = pb;
    if (a->l != b->l)
        return a->l < b->l ? -1 : 1;
    if (a->count != b->count)
        return a->count > b->count ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/*
 * How many neurons of each layer go to the hot slice, and the permutation
 * (sparse layouts).  With a placement: exactly its GPU neurons.  Without:
 * hottest first while the budget lasts, across layers by profile count when
 * there is a profile, else the same share per layer.  Either way the budget
 * must hold the reserve (SI_E_BUDGET otherwise) and the hot neurons must fit
 * what it leaves.
 */
static int plan(struct si_engine *e, char *err, size_t err_size)
{
    const struct si_hparams *hp = &e->m->hp;
    const int64_t ff = hp->n_ff;
    const struct si_profile *pr = e->p.profile;
    const struct si_placement *pl = e->p.placement;
    const bool gpu = e->cuda_hot || e->p.hot_on_cpu;
    const int64_t vram = e->p.vram_budget > 0 ? e->p.vram_budget
                         : pl != NULL && pl->vram_capacity <= INT64_MAX ? (int64_t)pl->vram_capacity
                                                                        : 0;
    const bool placing = gpu && (vram > 0 || (pl != NULL && si_placement_gpu_neurons(pl) > 0));
    struct si_gpu_reserve rs;
    reserve_of(e, &rs);
    e->reserve = rs;
    const int64_t unit = rs.unit_bytes;
    for (int l = 0; l < hp->n_layer; l++)
        e->L[l].n_hot = 0;
    e->stats.gpu_budget = placing ? vram : 0;
    if (placing && vram < rs.total)
        return si__errf(err, err_size, SI_E_BUDGET,
                        "VRAM budget of %" PRId64 " bytes is below the %" PRId64
                        " bytes the engine puts on the GPU besides FFN neurons",
                        vram, rs.total);
    int64_t budget = placing ? vram - rs.total : 0;
    if (placing && pl != NULL) {
        int64_t n = 0;
        for (int l = 0; l < hp->n_layer; l++) {
            e->L[l].n_hot = pl->n_gpu[l];
            n += pl->n_gpu[l];
        }
        if (n * unit > budget)
            return si__errf(err, err_size, SI_E_BUDGET,
                            "the placement's %" PRId64 " GPU neurons take %" PRId64
                            " bytes, the VRAM budget of %" PRId64 " leaves %" PRId64
                            " after the engine's %" PRId64,
                            n, n * unit, vram, budget, rs.total);
    } else if (placing && budget >= unit) {
        if (pr != NULL && e->sparse) {
            const size_t n = (size_t)hp->n_layer * (size_t)ff;
            struct ranked *r = malloc(n * sizeof *r);
            if (r == NULL)
                return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the placement");
            for (int l = 0; l < hp->n_layer; l++)
                for (int64_t i = 0; i < ff; i++)
                    r[(size_t)l * ff + i] = (struct ranked){pr->counts[(size_t)l * ff + i], l,
                                                            (int32_t)i};
            qsort(r, n, sizeof *r, cmp_ranked);
            for (size_t k = 0; k < n && budget >= unit; k++, budget -= unit)
                e->L[r[k].l].n_hot++;
            free(r);
        } else {
            const int64_t per_layer = budget / unit / hp->n_layer;
            const int64_t units = ff / (e->sparse ? 1 : e->chunk);
            for (int l = 0; l < hp->n_layer; l++)
                e->L[l].n_hot = (per_layer < units ? per_layer : units) * (e->sparse ? 1 : e->chunk);
        }
    }
    e->hot_bytes = 0;
    for (int l = 0; l < hp->n_layer; l++)
        e->hot_bytes += e->L[l].n_hot / (e->sparse ? 1 : e->chunk) * unit;

    /* The permutation: hot neurons first, the rest dealt to the cold slices
     * in turn, hottest first, so that every cold slice gets the same number
     * of neurons and about the same expected activity. */
    const int32_t ns = e->n_slices;
    struct ranked *r = malloc((size_t)ff * sizeof *r);
    if (r == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the placement");
    for (int l = 0; l < hp->n_layer; l++) {
        struct layer *L = &e->L[l];
        const bool ranked = pr != NULL && e->sparse;
        for (int64_t i = 0; i < ff; i++)
            r[i] = (struct ranked){ranked ? pr->counts[(size_t)l * ff + i] : 0, 0, (int32_t)i};
        if (placing && pl != NULL) {
            /* the placed neurons first (l = 0 sorts them ahead), each group
             * hottest first when there is a profile, else in id order */
            for (int64_t i = 0; i < ff; i++)
                r[i].l = pl->gpu[(size_t)l * (size_t)ff + (size_t)i] ? 0 : 1;
            qsort(r, (size_t)ff, sizeof *r, cmp_placed);
        } else if (ranked) {
            qsort(r, (size_t)ff, sizeof *r, cmp_ranked);
        }
        for (int64_t p = 0; p < L->n_hot; p++)
            L->perm[p] = r[p].i;
        const int64_t cold = ff - L->n_hot;
        L->hot = L->n_hot > 0;
        L->nsl = 0;
        L->s0[0] = 0;
        if (L->hot) {
            L->s0[1] = L->n_hot;
            L->nsl = 1;
        }
        if (!e->sparse) {
            const int64_t nch = cold / e->chunk, nsl = ns < nch ? ns : nch;
            for (int32_t j = 1; j <= nsl; j++)
                L->s0[L->nsl + j] = L->n_hot + (int64_t)j * nch / nsl * e->chunk;
            L->nsl += (int32_t)nsl;
            for (int64_t p = L->n_hot; p < ff; p++)
                L->perm[p] = r[p].i;
        } else {
            const int64_t nsl = ns < cold ? ns : cold;
            int64_t p = L->n_hot;
            for (int32_t j = 0; j < nsl; j++) {
                if (ranked)
                    for (int64_t k = L->n_hot + j; k < ff; k += nsl)
                        L->perm[p++] = r[k].i;
                else
                    for (int64_t k = L->n_hot + j * cold / nsl; k < L->n_hot + (j + 1) * cold / nsl; k++)
                        L->perm[p++] = r[k].i;
                L->s0[L->nsl + j + 1] = p;
            }
            L->nsl += (int32_t)nsl;
        }
        for (int32_t j = 0; j < L->nsl; j++) {
            L->rows[j] = 1;
            L->len_n[j] = (uint32_t)(L->s0[j + 1] - L->s0[j]);
            L->len_p[j] = e->sparse ? (uint32_t)hp->n_embd : L->len_n[j];
        }
    }
    free(r);
    return SI_OK;
}

/* ------------------------------------------------------------ weights */

/* Row i of tensor t (F32 in every supported file for 1-D vectors). */
static const char *row_of(const struct si_tensor *t, int64_t i)
{
    return (const char *)t->data + (size_t)i * t->row_bytes;
}

/*
 * Sparse layout of layer l: the records in position order.  down_t comes
 * from the file, or from ffn_down transposed: dequantized to float, stored
 * in the type chosen at init (exact for F32 and F16 files).
 */
static int build_records(struct si_engine *e, int l, float *col, char *err, size_t err_size)
{
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->m->w.layers[l];
    struct layer *L = &e->L[l];
    const int64_t ff = hp->n_ff, d = hp->n_embd;
    const size_t rb = e->rec_bytes;
    char *rec = L->rec;
    for (int64_t p = 0; p < ff; p++) {
        const int32_t i = L->perm[p];
        char *r = rec + (size_t)p * rb;
        if (e->gate_off >= 0)
            memcpy(r + e->gate_off, row_of(&W->ffn_gate, i), e->gu_row);
        if (e->up_off >= 0)
            memcpy(r + e->up_off, row_of(&W->ffn_up, i), e->gu_row);
        if (e->pre_sep)
            memcpy((char *)L->pre + (size_t)p * e->gu_row,
                   row_of(e->has_gate ? &W->ffn_gate : &W->ffn_up, i), e->gu_row);
        L->up_b[p] = W->ffn_up_b.data != NULL ? ((const float *)W->ffn_up_b.data)[i] : 0.0f;
        if (W->ffn_down_t.data != NULL)
            memcpy(rec + (size_t)p * rb + e->dt_off, row_of(&W->ffn_down_t, i), e->dt_row);
    }
    if (W->ffn_down_t.data == NULL) {
        /* col holds ffn_down as (n_embd, n_ff) floats, one output per row */
        for (int64_t o = 0; o < d; o++)
            si_dequantize_row(W->ffn_down.type, row_of(&W->ffn_down, o), col + (size_t)o * ff, ff);
        float *t = malloc((size_t)d * sizeof(float));
        if (t == NULL)
            return si__errf(err, err_size, SI_E_NOMEM, "out of memory for down_t");
        for (int64_t p = 0; p < ff; p++) {
            for (int64_t o = 0; o < d; o++)
                t[o] = col[(size_t)o * ff + L->perm[p]];
            si_quantize_row(e->dt_type, t, rec + (size_t)p * rb + e->dt_off, d);
        }
        free(t);
    }
    if (e->p.mode == SI_SPARSITY_PREDICTOR) {
        const struct si_tensor *fc2 = &W->fc2;
        for (int64_t p = 0; p < ff; p++)
            memcpy((char *)L->fc2p + (size_t)p * fc2->row_bytes, row_of(fc2, L->perm[p]),
                   fc2->row_bytes);
    }
    return SI_OK;
}

static int64_t flash_layer_bytes(const struct si_engine *e, int l);

static double mib(int64_t b)
{
    return (double)b / 1048576.0;
}

/*
 * The flash tier's DRAM: what stays resident (the model's tensors but the
 * FFN's, unless the file was read whole; the KV cache; the per-layer arrays
 * with the hot records), then the caches in what the budget leaves, the same
 * number of records for every layer (at most its cold neurons).
 */
static int flash_setup(struct si_engine *e, char *err, size_t err_size)
{
    const struct si_hparams *hp = &e->m->hp;
    const struct si_flash_store *fs = e->p.flash;
    const int64_t ff = hp->n_ff, nl = hp->n_layer;
    int64_t model = (int64_t)e->m->gguf->data_size;
    if (!e->p.model_in_memory)
        for (int l = 0; l < nl; l++) {
            const struct si_layer *W = &e->m->w.layers[l];
            model -= (int64_t)(W->ffn_gate.nbytes + W->ffn_up.nbytes + W->ffn_down.nbytes +
                               W->ffn_down_t.nbytes);
        }
    const struct si_ref *s = e->ref;
    const int64_t kv = 2 * nl * (int64_t)s->p.n_ctx * hp->n_head_kv * hp->head_dim *
                       (s->p.kv_f16 ? 2 : 4);
    int64_t layers = 0;
    for (int l = 0; l < nl; l++)
        layers += flash_layer_bytes(e, l);
    /* The spill area: a layer's cold neurons that are active beyond its
     * cache, read for one token (layers load one after another). */
    int64_t max_cold = 1;
    for (int l = 0; l < nl; l++)
        max_cold = ff - e->L[l].n_hot > max_cold ? ff - e->L[l].n_hot : max_cold;
    const int64_t spill = max_cold * ((int64_t)e->rec_bytes + (int64_t)(sizeof(float) +
                                                                       sizeof(int32_t))) +
                          ff * (int64_t)sizeof(int32_t);
    const int64_t resident = model + kv + layers + spill;
    const int64_t per_rec = (int64_t)e->rec_bytes + (int64_t)(sizeof(float) + 2 * sizeof(int32_t));
    int64_t cap = ff;
    if (e->p.flash_cache > 0) {
        cap = e->p.flash_cache;
    } else if (e->p.dram_budget > 0) {
        const int64_t avail = e->p.dram_budget - resident;
        if (avail < per_rec * nl)
            return si__errf(err, err_size, SI_E_BUDGET,
                            "DRAM budget of %.1f MiB is below what the flash tier keeps "
                            "resident: %.1f MiB (model tensors besides the FFN %.1f MiB, KV "
                            "cache %.1f MiB, hot neurons, gating rows, predictors and buffers "
                            "%.1f MiB, a layer's worth of records for reading %.1f MiB) and "
                            "one cached neuron per layer (%.2f MiB)",
                            mib(e->p.dram_budget), mib(resident), mib(model), mib(kv),
                            mib(layers), mib(spill), mib(per_rec * nl));
        cap = avail / per_rec / nl;
    }
    e->stats.dram_resident = resident;
    e->stats.flash_cache_records = -1;
    int64_t total = max_cold;
    for (int l = 0; l < nl; l++) {
        const int64_t cold = ff - e->L[l].n_hot;
        total += cap < cold ? cap : cold;
    }
    e->spill_cap = (int32_t)max_cold;
    e->region = aligned_alloc(SI_FLASH_BLOCK, (size_t)total * e->rec_bytes);
    e->region_bias = malloc((size_t)total * sizeof(float));
    e->spill_of = malloc((size_t)ff * sizeof(int32_t));
    e->spill_pos = malloc((size_t)max_cold * sizeof(int32_t));
    if (!e->region || !e->region_bias || !e->spill_of || !e->spill_pos)
        return si__errf(err, err_size, SI_E_NOMEM,
                        "out of memory for the flash caches (%.1f MiB)",
                        mib(total * (int64_t)e->rec_bytes));
    for (int64_t p = 0; p < ff; p++)
        e->spill_of[p] = -1;
    int64_t off = max_cold;
    for (int l = 0; l < nl; l++) {
        struct layer *L = &e->L[l];
        const int64_t cold = ff - L->n_hot;
        const int32_t c = (int32_t)(cap < cold ? cap : cold);
        if (L->n_hot > 0 &&
            (L->rec = aligned_alloc(SI_FLASH_BLOCK, (size_t)L->n_hot * e->rec_bytes)) == NULL)
            return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the hot neurons");
        L->fc_off = off;
        if (si_flash_cache_init(&L->fc, (int32_t)ff, c, e->rec_bytes, SI_FLASH_BLOCK,
                                e->p.flash_window, e->region + (size_t)off * e->rec_bytes,
                                e->region_bias + off) != SI_OK)
            return si__errf(err, err_size, SI_E_NOMEM,
                            "out of memory for the flash cache of layer %d (%d records)", l, c);
        for (int64_t p = 0; p < ff; p++)
            L->fl_row[p] = fs->row_of[(size_t)l * (size_t)ff + (size_t)L->perm[p]];
        e->stats.flash_cache_bytes += (int64_t)c * per_rec;
        off += c;
        if (e->stats.flash_cache_records < 0 || c < e->stats.flash_cache_records)
            e->stats.flash_cache_records = c;
    }
    return SI_OK;
}

/* Let the kernel drop the mapped pages of [p, p + n) (whole pages inside). */
static void drop_pages(const void *p, size_t n)
{
    const uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + ps - 1) / ps * ps, b = ((uintptr_t)p + n) / ps * ps;
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

/*
 * Flash layout of layer l: the gating rows (gate mode) and biases from the
 * model, the hot records from the store (the model's FFN matrices are not
 * read otherwise), the predictor's fc2 in position order.
 */
static int build_flash(struct si_engine *e, int l, char *err, size_t err_size)
{
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->m->w.layers[l];
    struct layer *L = &e->L[l];
    const int64_t ff = hp->n_ff;
    const struct si_tensor *g = e->has_gate ? &W->ffn_gate : &W->ffn_up;
    for (int64_t p = 0; p < ff; p++) {
        const int32_t i = L->perm[p];
        if (e->pre_sep)
            memcpy((char *)L->pre + (size_t)p * e->gu_row, row_of(g, i), e->gu_row);
        L->up_b[p] = W->ffn_up_b.data != NULL ? ((const float *)W->ffn_up_b.data)[i] : 0.0f;
    }
    if (e->pre_sep && e->m->gguf->map != NULL)
        drop_pages(g->data, g->nbytes); /* copied: the mapping need not keep them */
    for (int64_t p = 0; p < L->n_hot; p++) {
        L->fl_fid[p] = L->perm[p];
        L->fl_dst[p] = (char *)L->rec + (size_t)p * e->rec_bytes;
    }
    const int64_t nr = si_flash_plan(e->p.flash, l, L->fl_fid, L->n_hot, L->fl_dst, L->fl_req);
    if (si_flash_read(e->p.flash, L->fl_req, nr) != SI_OK)
        return si__errf(err, err_size, SI_E_IO, "layer %d: reading the hot neurons from the "
                        "flash store failed", l);
    if (e->p.mode == SI_SPARSITY_PREDICTOR) {
        const struct si_tensor *fc2 = &W->fc2;
        for (int64_t p = 0; p < ff; p++)
            memcpy((char *)L->fc2p + (size_t)p * fc2->row_bytes, row_of(fc2, L->perm[p]),
                   fc2->row_bytes);
    }
    return SI_OK;
}

static void vec(starpu_data_handle_t *h, const void *p, size_t n, size_t elem)
{
    starpu_vector_data_register(h, STARPU_MAIN_RAM, (uintptr_t)p, (uint32_t)n, elem);
}

/* Partition h into the layer's slices along a vector of lengths. */
static void split(starpu_data_handle_t h, struct layer *L, uint32_t *lengths,
                  starpu_data_handle_t *children)
{
    struct starpu_data_filter f = {.filter_func = starpu_vector_filter_list,
                                   .nchildren = (unsigned)L->nsl,
                                   .filter_arg_ptr = lengths};
    starpu_data_partition_plan(h, &f, children);
    starpu_data_partition_submit(h, (unsigned)L->nsl, children);
}

/* Undo a partition of h into n children (if any), then unregister h. */
static void unsplit_n(starpu_data_handle_t h, unsigned n, starpu_data_handle_t *children)
{
    if (h == NULL)
        return;
    if (children != NULL && children[0] != NULL) {
        starpu_data_unpartition_submit(h, n, children, STARPU_MAIN_RAM);
        starpu_data_partition_clean(h, n, children);
    }
    starpu_data_unregister(h);
}

static void unsplit(starpu_data_handle_t h, struct layer *L, starpu_data_handle_t *children)
{
    unsplit_n(h, (unsigned)L->nsl, children);
}

/* Register layer l's handles and partition them into its slices. */
static void register_layer(struct si_engine *e, int l)
{
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->m->w.layers[l];
    struct layer *L = &e->L[l];
    struct si_ref *s = e->ref;
    const size_t kvd = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t esz = s->p.kv_f16 ? 2 : 4, kv_bytes = (size_t)s->p.n_ctx * kvd * esz;
    const struct si_tensor *aw[4] = {&W->wq, &W->wk, &W->wv, &W->wo};
    for (int i = 0; i < 4; i++)
        vec(&L->h_w[i], aw[i]->data, aw[i]->nbytes, 1);
    if (e->na > 1 && e->ng > 1) {
        /* Each attention task writes its kv heads' columns of the cache: the
         * layer's cache as a matrix (a row per position, in bytes), a child
         * per group of columns. */
        const size_t row = kvd * esz;
        for (int32_t g = 0; g <= e->ng; g++)
            L->kv_cols[g] = (size_t)e->a_g[g] * (size_t)hp->head_dim * esz;
        struct starpu_data_filter f = {.filter_func = filter_cols,
                                       .nchildren = (unsigned)e->ng,
                                       .filter_arg_ptr = L->kv_cols};
        starpu_data_handle_t *hc[2] = {&L->h_k, &L->h_v}, *cc[2] = {L->h_k_c, L->h_v_c};
        const char *base[2] = {s->kcache, s->vcache};
        for (int i = 0; i < 2; i++) {
            starpu_matrix_data_register(hc[i], STARPU_MAIN_RAM,
                                        (uintptr_t)(base[i] + (size_t)l * kv_bytes),
                                        (uint32_t)row, (uint32_t)row, (uint32_t)s->p.n_ctx, 1);
            starpu_data_partition_plan(*hc[i], &f, cc[i]);
            starpu_data_partition_submit(*hc[i], (unsigned)e->ng, cc[i]);
        }
    } else {
        vec(&L->h_k, (char *)s->kcache + (size_t)l * kv_bytes, kv_bytes, 1);
        vec(&L->h_v, (char *)s->vcache + (size_t)l * kv_bytes, kv_bytes, 1);
    }

    const int64_t ff = hp->n_ff;
    if (!e->sparse) {
        if (e->has_gate) {
            vec(&L->h_gate, W->ffn_gate.data, (size_t)ff, e->gu_row);
            split(L->h_gate, L, L->len_n, L->h_gate_c);
        }
        vec(&L->h_up, W->ffn_up.data, (size_t)ff, e->gu_row);
        split(L->h_up, L, L->len_n, L->h_up_c);
        const struct si_tensor *dn = &W->ffn_down;
        starpu_matrix_data_register(&L->h_down, STARPU_MAIN_RAM, (uintptr_t)dn->data,
                                    (uint32_t)dn->row_bytes, (uint32_t)dn->row_bytes,
                                    (uint32_t)hp->n_embd, 1);
        struct starpu_data_filter f = {.filter_func = filter_rows,
                                       .nchildren = (unsigned)e->nd,
                                       .filter_arg_ptr = e->dn};
        starpu_data_partition_plan(L->h_down, &f, L->h_down_c);
        starpu_data_partition_submit(L->h_down, (unsigned)e->nd, L->h_down_c);
        vec(&L->h_upb, W->ffn_up_b.data != NULL ? W->ffn_up_b.data : e->zeros, (size_t)ff,
            sizeof(float));
    } else {
        if (e->pre_sep) {
            vec(&L->h_gate, L->pre, (size_t)ff, e->gu_row);
            split(L->h_gate, L, L->len_n, L->h_gate_c);
        }
        if (e->flash) {
            /* the hot records alone (slot 0), the cold ones in the cache */
            if (L->hot)
                vec(&L->h_rec_c[0], L->rec, (size_t)L->n_hot, e->rec_bytes);
            vec(&L->h_cache, L->fc.mat, L->fc.cap > 0 ? (size_t)L->fc.cap : 1, e->rec_bytes);
        } else {
            vec(&L->h_rec, L->rec, (size_t)ff, e->rec_bytes);
            split(L->h_rec, L, L->len_n, L->h_rec_c);
        }
        vec(&L->h_upb, L->up_b, (size_t)ff, sizeof(float));
    }
    split(L->h_upb, L, L->len_n, L->h_upb_c);
    if (e->p.mode == SI_SPARSITY_PREDICTOR) {
        vec(&L->h_fc1, W->fc1.data, W->fc1.nbytes, 1);
        vec(&L->h_fc2, L->fc2p, W->fc2.nbytes, 1);
    }
    if (L->idx != NULL) { /* predictor mode, and gate mode's flash masks */
        vec(&L->h_idx, L->idx, (size_t)ff, sizeof(int32_t));
        split(L->h_idx, L, L->len_n, L->h_idx_c);
    }
    size_t part = 0;
    for (int32_t j = 0; j < L->nsl; j++)
        part += L->len_p[j];
    vec(&L->h_part, L->part, part, sizeof(float));
    split(L->h_part, L, L->len_p, L->h_part_c);
    if (e->p.redux) {
        vec(&L->h_y, L->y, (size_t)hp->n_embd, sizeof(float));
        starpu_data_set_reduction_methods(L->h_y, &cl_sum, &cl_zero);
    }

    /* The hot slice's weights go to the GPU once and stay there. */
    if (L->hot && e->cuda_hot && e->cuda_node >= 0) {
        starpu_data_handle_t hot[3] = {e->sparse ? L->h_rec_c[0] : L->h_up_c[0], L->h_upb_c[0],
                                       L->h_gate != NULL ? L->h_gate_c[0] : NULL};
        for (int i = 0; i < 3; i++)
            if (hot[i] != NULL)
                starpu_data_prefetch_on_node(hot[i], (unsigned)e->cuda_node, 1);
    }
}

/*
 * The bytes of every handle the engine lets onto the CUDA node: what
 * ffn_cuda's task reads and writes (see submit_layer), for the layers with a
 * hot slice; with hot_on_cpu the same handles as if there were a GPU.
 */
static int64_t gpu_accounted(const struct si_engine *e)
{
    int64_t bytes = 0;
    bool any = false;
    for (int l = 0; l < e->m->hp.n_layer; l++) {
        const struct layer *L = &e->L[l];
        if (!L->hot)
            continue;
        any = true;
        const starpu_data_handle_t h[] = {
            L->h_gate_c[0] != NULL && L->h_gate != NULL ? L->h_gate_c[0] : NULL,
            !e->sparse ? L->h_up_c[0] : NULL,
            e->sparse ? L->h_rec_c[0] : NULL,
            L->h_upb_c[0],
            e->p.mode == SI_SPARSITY_PREDICTOR ? L->h_idx_c[0] : NULL,
            L->h_part_c[0]};
        for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
            if (h[i] != NULL)
                bytes += (int64_t)starpu_data_get_size(h[i]);
    }
    if (any)
        bytes += (int64_t)(starpu_data_get_size(e->h_xb) + starpu_data_get_size(e->h_iota) +
                           starpu_data_get_size(e->h_hscratch));
    return bytes;
}

static void unregister_layer(struct si_engine *e, int l)
{
    struct layer *L = &e->L[l];
    for (int i = 0; i < 4; i++)
        if (L->h_w[i] != NULL)
            starpu_data_unregister(L->h_w[i]);
    starpu_data_handle_t *kv[2] = {&L->h_k, &L->h_v}, *kv_c[2] = {L->h_k_c, L->h_v_c};
    for (int i = 0; i < 2; i++) {
        if (*kv[i] == NULL)
            continue;
        if (kv_c[i] != NULL && kv_c[i][0] != NULL) {
            starpu_data_unpartition_submit(*kv[i], (unsigned)e->ng, kv_c[i], STARPU_MAIN_RAM);
            starpu_data_partition_clean(*kv[i], (unsigned)e->ng, kv_c[i]);
        }
        starpu_data_unregister(*kv[i]);
    }
    unsplit(L->h_gate, L, L->h_gate_c);
    unsplit(L->h_up, L, L->h_up_c);
    unsplit_n(L->h_down, (unsigned)e->nd, L->h_down_c);
    if (e->flash && L->h_rec_c != NULL && L->h_rec_c[0] != NULL) {
        starpu_data_unregister(L->h_rec_c[0]); /* registered alone, not a child */
        L->h_rec_c[0] = NULL;
    }
    if (L->h_cache != NULL)
        starpu_data_unregister(L->h_cache);
    unsplit(L->h_rec, L, L->h_rec_c);
    unsplit(L->h_upb, L, L->h_upb_c);
    unsplit(L->h_idx, L, L->h_idx_c);
    unsplit(L->h_part, L, L->h_part_c);
    unsplit(L->h_fc1, L, NULL);
    unsplit(L->h_fc2, L, NULL);
    unsplit(L->h_y, L, NULL);
}

/* ------------------------------------------------------------ engine */

static bool cuda_type(uint32_t t)
{
    return t == SI_TYPE_F32 || t == SI_TYPE_F16 || t == SI_TYPE_Q8_0 || t == SI_TYPE_Q4_0 ||
           t == SI_TYPE_Q4_1;
}

/* Check the parameters against the model and the workers. */
static int check(const struct si_model *m, const struct si_engine_params *p, unsigned ncuda,
                 char *err, size_t err_size)
{
    const struct si_hparams *hp = &m->hp;
    const struct si_layer *W = &m->w.layers[0];
    if ((unsigned)p->mode > SI_SPARSITY_PREDICTOR)
        return si__errf(err, err_size, SI_E_INVALID, "unknown sparsity mode %d", (int)p->mode);
    if (p->mode == SI_SPARSITY_PREDICTOR && !m->has_predictor)
        return si__errf(err, err_size, SI_E_INVALID,
                        "predictor mode: the model has no predictor tensors (blk.N.fc1/fc2)");
    if (p->n_slices < 0 || p->n_slices > MAX_SLICES)
        return si__errf(err, err_size, SI_E_INVALID, "slices: %d is outside 0..%d", p->n_slices,
                        MAX_SLICES);
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
    if (p->profile != NULL &&
        (p->profile->n_layer != hp->n_layer || p->profile->n_ff != hp->n_ff))
        return si__errf(err, err_size, SI_E_INVALID,
                        "profile is for %d layers of %d neurons, the model has %d of %d",
                        p->profile->n_layer, p->profile->n_ff, hp->n_layer, hp->n_ff);
    if (hp->ffn_kind != SI_FFN_PLAIN && W->ffn_gate.type != W->ffn_up.type)
        return si__errf(err, err_size, SI_E_UNSUPPORTED,
                        "the engine needs ffn_gate and ffn_up of one type (%s, %s)",
                        si_type_name(W->ffn_gate.type), si_type_name(W->ffn_up.type));
    for (int l = 1; l < hp->n_layer; l++) {
        const struct si_layer *V = &m->w.layers[l];
        if (V->ffn_up.type != W->ffn_up.type || V->ffn_down.type != W->ffn_down.type ||
            (hp->ffn_kind != SI_FFN_PLAIN && V->ffn_gate.type != W->ffn_gate.type) ||
            (V->ffn_down_t.data != NULL) != (W->ffn_down_t.data != NULL) ||
            (V->ffn_down_t.data != NULL && V->ffn_down_t.type != W->ffn_down_t.type))
            return si__errf(err, err_size, SI_E_UNSUPPORTED,
                            "the engine needs every layer's FFN tensors of the same types "
                            "(layer %d differs from layer 0)",
                            l);
    }
    if (p->redux && ncuda > 0 && (p->vram_budget > 0 || p->placement != NULL))
        return si__errf(err, err_size, SI_E_UNSUPPORTED,
                        "redux merging runs on CPU workers only (no --vram-budget with it)");
    if (ncuda > 0 && (p->vram_budget > 0 || p->placement != NULL) && !p->hot_on_cpu) {
        uint32_t dt = p->mode == SI_SPARSITY_DENSE ? W->ffn_down.type
                      : W->ffn_down_t.data != NULL ? W->ffn_down_t.type
                                                   : SI_TYPE_F16;
        if (!cuda_type(W->ffn_up.type) || !cuda_type(dt))
            return si__errf(err, err_size, SI_E_UNSUPPORTED,
                            "no CUDA FFN kernels for %s/%s weights (F32, F16, Q8_0, Q4_0, Q4_1 "
                            "have them): run without --vram-budget",
                            si_type_name(W->ffn_up.type), si_type_name(dt));
    }
    if (p->flash != NULL) {
        if (p->mode == SI_SPARSITY_DENSE)
            return si__errf(err, err_size, SI_E_INVALID,
                            "the flash tier needs the gate or predictor sparsity mode (dense "
                            "mode computes every neuron of every layer)");
        if (p->redux)
            return si__errf(err, err_size, SI_E_UNSUPPORTED,
                            "redux merging is not available with the flash tier");
        if (p->flash_window < 0 || p->flash_cache < 0 || p->dram_budget < 0)
            return si__errf(err, err_size, SI_E_INVALID,
                            "negative flash window, cache size or DRAM budget");
        if (p->flash->f.n_layer != hp->n_layer || p->flash->f.n_ff != hp->n_ff ||
            p->flash->f.n_embd != hp->n_embd)
            return si__errf(err, err_size, SI_E_INVALID, "the flash store is for another model");
    }
    return SI_OK;
}

static int alloc_layer(struct si_engine *e, struct layer *L, int l)
{
    const struct si_hparams *hp = &e->m->hp;
    const size_t ff = (size_t)hp->n_ff, slots = (size_t)e->n_slices + 2;
    L->s0 = calloc(slots, sizeof *L->s0);
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
    L->part = calloc(e->sparse ? slots * (size_t)hp->n_embd : ff, sizeof(float));
    L->y = calloc((size_t)hp->n_embd, sizeof(float));
    if (!L->s0 || !L->rows || !L->perm || !L->active || !L->rd || !L->len_n || !L->len_p ||
        !L->name_ffn || !L->name_bffn || !L->h_gate_c || !L->h_up_c || !L->h_down_c || !L->h_rec_c ||
        !L->h_upb_c || !L->h_idx_c || !L->h_part_c || !L->part || !L->y)
        return SI_E_NOMEM;
    if (!e->sparse) {
        L->name_down = calloc((size_t)e->nd, sizeof *L->name_down);
        L->name_bdown = calloc((size_t)e->nd, sizeof *L->name_bdown);
        if (!L->name_down || !L->name_bdown)
            return SI_E_NOMEM;
    }
    if (e->sparse) {
        /* flash: only the hot records, allocated once the plan is known */
        L->rec = e->flash ? NULL : malloc(ff * e->rec_bytes);
        L->up_b = malloc(ff * sizeof(float));
        if ((!e->flash && !L->rec) || !L->up_b)
            return SI_E_NOMEM;
        if (e->pre_sep && (L->pre = malloc(ff * e->gu_row)) == NULL)
            return SI_E_NOMEM;
    }
    if (e->p.mode == SI_SPARSITY_PREDICTOR) {
        L->fc2p = malloc(e->m->w.layers[l].fc2.nbytes);
        L->idx = malloc(ff * sizeof(int32_t));
        if (!L->fc2p || !L->idx)
            return SI_E_NOMEM;
    }
    if (e->flash) {
        if (e->p.mode == SI_SPARSITY_GATE) {
            L->idx = malloc(ff * sizeof(int32_t));
            L->gact = malloc(ff * sizeof(float));
            L->name_gmask = calloc(slots, sizeof *L->name_gmask);
            if (!L->idx || !L->gact || !L->name_gmask)
                return SI_E_NOMEM;
        }
        L->fl_row = malloc(ff * sizeof(int32_t));
        L->fl_act = malloc(ff * sizeof(int32_t));
        L->fl_load = malloc(ff * sizeof(int32_t));
        L->fl_slot = malloc(ff * sizeof(int32_t));
        L->fl_fid = malloc(ff * sizeof(int32_t));
        L->fl_dst = malloc(ff * sizeof(char *));
        L->fl_req = malloc(3 * ff * sizeof(struct si_flash_req));
        if (!L->fl_row || !L->fl_act || !L->fl_load || !L->fl_slot || !L->fl_fid || !L->fl_dst ||
            !L->fl_req)
            return SI_E_NOMEM;
    }
    return SI_OK;
}

/* Host bytes of layer l's per-layer arrays beside the flash cache. */
static int64_t flash_layer_bytes(const struct si_engine *e, int l)
{
    const struct layer *L = &e->L[l];
    const int64_t ff = e->m->hp.n_ff, d = e->m->hp.n_embd;
    int64_t b = L->n_hot * (int64_t)e->rec_bytes;                 /* hot records */
    b += ff * (int64_t)(sizeof(int32_t) * 6 + sizeof(char *) + 3 * sizeof(struct si_flash_req));
    b += ff * (int64_t)(sizeof(float) + sizeof(int32_t));        /* up_b, perm */
    b += ff * (int64_t)(sizeof(int32_t) + sizeof(int64_t));      /* slot_of, last */
    if (e->pre_sep)
        b += ff * (int64_t)e->gu_row;                               /* gating rows */
    if (e->p.mode == SI_SPARSITY_PREDICTOR)
        b += (int64_t)e->m->w.layers[l].fc2.nbytes;                 /* fc2 by position */
    if (L->idx != NULL)
        b += ff * (int64_t)sizeof(int32_t);
    if (L->gact != NULL)
        b += ff * (int64_t)sizeof(float);
    b += (e->n_slices + 2) * d * (int64_t)sizeof(float); /* partial outputs */
    return b;
}

static void free_layer(struct layer *L)
{
    free(L->s0);
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
    free(L->h_k_c);
    free(L->h_v_c);
    free(L->kv_cols);
    free(L->name_ao);
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
    free(L->idx);
    free(L->gact);
    free(L->name_gmask);
    free(L->fl_row);
    free(L->fl_act);
    free(L->fl_load);
    free(L->fl_slot);
    free(L->fl_fid);
    free(L->fl_dst);
    free(L->fl_req);
    si_flash_cache_free(&L->fc);
}

int si_engine_init(struct si_engine **out, const struct si_model *m, struct si_engine_params p,
                   char *err, size_t err_size)
{
    *out = NULL;
    if (!starpu_is_initialized())
        return si__errf(err, err_size, SI_E_RUNTIME, "StarPU is not started");
    const struct si_hparams *hp = &m->hp;
    const unsigned ncpu = starpu_worker_get_count_by_type(STARPU_CPU_WORKER);
    const unsigned ncuda = starpu_worker_get_count_by_type(STARPU_CUDA_WORKER);
    if (ncpu == 0)
        return si__errf(err, err_size, SI_E_NO_DEVICE,
                        "the engine needs a CPU worker (STARPU_NCPU is 0)");
    int rc = check(m, &p, ncuda, err, err_size);
    if (rc != SI_OK)
        return rc;
    const struct si_layer *W0 = &m->w.layers[0];

    struct si_engine *e = calloc(1, sizeof *e);
    if (e == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    e->m = m;
    e->p = p;
    e->flash = p.flash != NULL;
    layout_of(m, p.mode, e);
    int64_t ffn_bytes;
    e->token_bytes_fixed = si_model_token_bytes(m, &ffn_bytes) - ffn_bytes;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const struct si_layer *W = &m->w.layers[l];
        if (p.mode == SI_SPARSITY_PREDICTOR)
            e->token_bytes_fixed += (int64_t)(W->fc1.nbytes + W->fc2.nbytes);
        else if (p.mode == SI_SPARSITY_DENSE) /* the ffn_down_L.k tasks read all of it */
            e->token_bytes_fixed += (int64_t)W->ffn_down.nbytes;
    }
    e->cuda_node = -1;
    e->gpu_base = -1;
#ifdef SI_USE_CUDA
    e->cuda_hot = ncuda > 0 && !p.hot_on_cpu;
    if (e->cuda_hot) {
        int wid = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
        e->cuda_node = (int)starpu_worker_get_memory_node((unsigned)wid);
        e->gpu_base = (int64_t)starpu_memory_get_used((unsigned)e->cuda_node);
    }
#endif
    int32_t ns = p.n_slices > 0 ? p.n_slices : (int32_t)ncpu; /* see docs/measurements.md */
    e->n_slices = ns;
    if (!e->sparse) {
        /* The down projection in as many blocks of output rows as there
         * are cold slices; nothing for redux to add. */
        e->p.redux = false;
        e->nd = ns < hp->n_embd ? ns : hp->n_embd;
        e->dn = malloc(((size_t)e->nd + 1) * sizeof *e->dn);
        e->dout = calloc((size_t)e->nd, sizeof *e->dout);
        e->bdout = calloc((size_t)e->nd, sizeof *e->bdout);
        e->h_dout = calloc((size_t)e->nd, sizeof *e->h_dout);
        e->h_bdout = calloc((size_t)e->nd, sizeof *e->h_bdout);
        if (!e->dn || !e->dout || !e->bdout || !e->h_dout || !e->h_bdout) {
            free(e->dn);
            free(e->dout);
            free(e->bdout);
            free(e->h_dout);
            free(e->h_bdout);
            free(e);
            return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
        }
        for (int32_t k = 0; k <= e->nd; k++)
            e->dn[k] = (int64_t)k * hp->n_embd / e->nd;
    }
    e->n_batch = p.n_batch > 0 ? p.n_batch : 32;
    if (e->flash)
        e->n_batch = 1; /* prefill token by token: a dense batch reads every neuron */
    {
        /* Attention's products split over the workers when they weigh enough
         * to repay the extra tasks (docs/measurements.md). */
        const struct si_layer *W = &m->w.layers[0];
        const size_t bytes = W->wq.nbytes + W->wk.nbytes + W->wv.nbytes + W->wo.nbytes;
        int32_t na = p.attn_split > 0 ? p.attn_split
                     : bytes >= ATTN_SPLIT_MIN_BYTES ? (int32_t)ncpu
                                                     : 1;
        if (na > hp->n_embd)
            na = hp->n_embd;
        if (na > MAX_SLICES)
            na = MAX_SLICES;
        e->na = na > 1 ? na : 1;
        /* attn_L.j tasks: whole kv heads each (their query heads with them) */
        e->ng = e->na < hp->n_head_kv ? e->na : hp->n_head_kv;
        /* With only CPU FFN tasks that take the FFN input first hand, each
         * computes it (attn_out's residual and norm: n_embd values) instead
         * of waiting for an attn_out task: one dependency less per layer. */
        e->fuse_out = e->na > 1 && !e->cuda_hot && !e->flash && !p.redux &&
                      p.mode != SI_SPARSITY_PREDICTOR;
    }
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
    /* Every CPU worker runs its own sgemm: OpenBLAS's threads would only
     * fight the workers for the cores (measured: prefill 4x slower with
     * them on 2 cores).  OPENBLAS_NUM_THREADS, when set, wins. */
    if (getenv("OPENBLAS_NUM_THREADS") == NULL)
        openblas_set_num_threads(1);
#endif
    rc = si_ref_init(&e->ref, m, p.ref, err, err_size);
    if (rc != SI_OK) {
        free(e);
        return rc;
    }
    e->n_workers = starpu_worker_get_count();
    e->scratch = calloc(e->n_workers, sizeof *e->scratch);
    e->L = calloc((size_t)hp->n_layer, sizeof *e->L);
    e->zeros = calloc((size_t)hp->n_ff, sizeof(float));
    e->gthr = calloc((size_t)hp->n_layer, sizeof(float));
    e->iota = malloc((size_t)hp->n_ff * sizeof(int32_t));
    if (!e->scratch || !e->L || !e->zeros || !e->gthr || !e->iota)
        goto oom;
    /* Gate mode's thresholds: the one given, else the profile's per-layer
     * CATS thresholds (SiLU/GELU models), else 0 (only exact zeros). */
    for (int l = 0; l < hp->n_layer; l++)
        e->gthr[l] = p.gate_threshold > 0.0f ? p.gate_threshold
                     : p.profile != NULL && p.profile->thresholds != NULL && hp->act != SI_ACT_RELU
                         ? p.profile->thresholds[l]
                         : 0.0f;
    for (int64_t i = 0; i < hp->n_ff; i++)
        e->iota[i] = (int32_t)i;
    for (int l = 0; l < hp->n_layer; l++)
        if (alloc_layer(e, &e->L[l], l) != SI_OK)
            goto oom;
    const size_t widest = (size_t)(hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd) +
                          (m->has_predictor ? (size_t)W0->fc1.ne[1] : 0);
    const size_t qd = (size_t)hp->n_head * (size_t)hp->head_dim,
                 kvd = (size_t)hp->n_head_kv * (size_t)hp->head_dim, d = (size_t)hp->n_embd,
                 tmpn = 2 * (d > (size_t)hp->head_dim ? d : (size_t)hp->head_dim);
    const size_t ascr = si_ref_attn_scratch_floats(e->ref);
    for (unsigned w = 0; w < e->n_workers; w++) {
        struct scratch *sc = &e->scratch[w];
        /* aq, ak, av, aatt, ascr, xl, xf, xn, xo, tmp in one allocation */
        sc->aq = malloc((2 * qd + 2 * kvd + ascr + 4 * d + tmpn) * sizeof(float));
        if (sc->aq == NULL)
            goto oom;
        sc->ak = sc->aq + qd;
        sc->av = sc->ak + kvd;
        sc->aatt = sc->av + kvd;
        sc->ascr = sc->aatt + qd;
        sc->xl = sc->ascr + ascr;
        sc->xf = sc->xl + d;
        sc->xn = sc->xf + d;
        sc->xo = sc->xn + d;
        sc->tmp = sc->xo + d;
        sc->h = malloc(widest * sizeof(float));
        sc->g = malloc((size_t)hp->n_ff * sizeof(float));
        sc->ix = malloc((size_t)hp->n_ff * sizeof(int32_t));
        sc->y = malloc(((size_t)(hp->n_ff / e->chunk) + 1) * (size_t)hp->n_embd * sizeof(float) +
                       (size_t)hp->n_ff * sizeof(float));
        sc->xq = malloc(8 * widest + 1024); /* two conversions of the input */
        sc->hq = malloc(4 * widest + 512);
        if (!sc->h || !sc->g || !sc->ix || !sc->y || !sc->xq || !sc->hq)
            goto oom;
        if (e->n_batch > 1) {
            const size_t bff = (size_t)e->n_batch * (size_t)hp->n_ff;
            size_t gs = si_k_gemm_scratch_size(e->gu_type, hp->n_embd),
                   gd = si_k_gemm_scratch_size(W0->ffn_down.type, hp->n_ff);
            sc->bg = malloc(bff * sizeof(float));
            sc->bu = malloc(bff * sizeof(float));
            size_t xa = 0; /* or n_batch inputs converted for gemm_act */
            si_type_row_size(si_act_type(e->gu_type), hp->n_embd, &xa);
            xa *= (size_t)e->n_batch;
            gs = gs > gd ? gs : gd;
            sc->gemm = malloc((gs > xa ? gs : xa) + 64);
            sc->dt = malloc((size_t)DT_TILE * (size_t)hp->n_embd * sizeof(float));
            if (!sc->bg || !sc->bu || !sc->gemm || !sc->dt)
                goto oom;
        }
    }
    if (e->n_batch > 1) {
        const size_t bd = (size_t)e->n_batch * (size_t)hp->n_embd;
        e->bx = calloc(bd, sizeof(float));
        e->bxb = calloc(bd, sizeof(float));
        e->bxb3 = calloc(bd, sizeof(float));
        e->bpart = calloc((size_t)ns + 1, sizeof *e->bpart);
        e->h_bpart = calloc((size_t)ns + 1, sizeof *e->h_bpart);
        e->brows = calloc((size_t)ns + 1, sizeof *e->brows);
        e->bwidth = calloc((size_t)ns + 1, sizeof *e->bwidth);
        if (!e->bx || !e->bxb || !e->bxb3 || !e->bpart || !e->h_bpart || !e->brows || !e->bwidth)
            goto oom;
    }
    if (e->na > 1) {
        const int64_t na = e->na, ng = e->ng, group = hp->n_head / hp->n_head_kv;
        e->a_g = calloc((size_t)ng + 1, sizeof *e->a_g);
        e->att_len = calloc((size_t)ng, sizeof *e->att_len);
        e->a_o = calloc((size_t)na + 1, sizeof *e->a_o);
        e->a_h = calloc((size_t)na + 1, sizeof *e->a_h);
        e->name_head = calloc((size_t)na, sizeof *e->name_head);
        e->h_logits_c = calloc((size_t)na, sizeof *e->h_logits_c);
        e->o = calloc((size_t)na, sizeof *e->o);
        e->h_o = calloc((size_t)na, sizeof *e->h_o);
        e->h_att_c = calloc((size_t)ng, sizeof *e->h_att_c);
        e->x2 = calloc((size_t)hp->n_embd, sizeof(float));
        if (!e->a_g || !e->att_len || !e->a_o || !e->a_h || !e->name_head || !e->h_logits_c ||
            !e->o || !e->h_o || !e->h_att_c || !e->x2)
            goto oom;
        for (int64_t j = 0; j <= ng; j++)
            e->a_g[j] = j * hp->n_head_kv / ng;
        for (int64_t j = 0; j < ng; j++)
            e->att_len[j] = (uint32_t)((e->a_g[j + 1] - e->a_g[j]) * group * hp->head_dim);
        for (int64_t j = 0; j <= na; j++) {
            e->a_o[j] = j * hp->n_embd / na;
            e->a_h[j] = j * hp->n_vocab / na;
        }
        for (int64_t j = 0; j < na; j++)
            snprintf(e->name_head[j], sizeof e->name_head[j], "lm_head.%d", (int)j);
        for (int64_t j = 0; j < na; j++)
            if ((e->o[j] = malloc((size_t)(e->a_o[j + 1] - e->a_o[j]) * sizeof(float))) == NULL)
                goto oom;
        for (int l = 0; l < hp->n_layer; l++) {
            struct layer *L = &e->L[l];
            L->name_agrp = calloc((size_t)ng, sizeof *L->name_agrp);
            L->name_ao = calloc((size_t)na, sizeof *L->name_ao);
            L->h_k_c = calloc((size_t)ng, sizeof *L->h_k_c);
            L->h_v_c = calloc((size_t)ng, sizeof *L->h_v_c);
            L->kv_cols = calloc((size_t)ng + 1, sizeof *L->kv_cols);
            if (!L->name_agrp || !L->name_ao || !L->h_k_c || !L->h_v_c || !L->kv_cols)
                goto oom;
        }
    }
    rc = plan(e, err, err_size);
    if (rc == SI_OK && e->flash)
        rc = flash_setup(e, err, err_size);
    if (rc != SI_OK) {
        si_engine_free(e);
        return rc;
    }
    if (e->n_batch > 1) {
        /* Each slot's batch output: a row per token (dense: the activations
         * of the widest slice the slot has in any layer). */
        for (int l = 0; l < hp->n_layer; l++)
            for (int32_t j = 0; j < e->L[l].nsl; j++) {
                e->brows[j] = e->L[l].rows[j] > e->brows[j] ? e->L[l].rows[j] : e->brows[j];
                e->bwidth[j] = e->L[l].len_n[j] > e->bwidth[j] ? e->L[l].len_n[j] : e->bwidth[j];
            }
        for (int32_t j = 0; j <= ns; j++) {
            e->brows[j] = e->brows[j] > 0 ? e->brows[j] : 1;
            const size_t per = e->sparse ? (size_t)e->brows[j] * (size_t)hp->n_embd
                                         : (size_t)(e->bwidth[j] > 0 ? e->bwidth[j] : 1);
            if ((e->bpart[j] = calloc((size_t)e->n_batch * per, sizeof(float))) == NULL)
                goto oom;
        }
    }
    for (int32_t k = 0; k < e->nd; k++) {
        const size_t no = (size_t)(e->dn[k + 1] - e->dn[k]);
        if ((e->dout[k] = calloc(no, sizeof(float))) == NULL ||
            (e->n_batch > 1 &&
             (e->bdout[k] = calloc((size_t)e->n_batch * no, sizeof(float))) == NULL))
            goto oom;
    }
    if (e->flash) {
        for (int l = 0; l < hp->n_layer && rc == SI_OK; l++)
            rc = build_flash(e, l, err, err_size);
        if (rc != SI_OK) {
            si_engine_free(e);
            return rc;
        }
    } else if (e->sparse) {
        float *col = NULL;
        if (W0->ffn_down_t.data == NULL &&
            (col = malloc((size_t)hp->n_ff * (size_t)hp->n_embd * sizeof(float))) == NULL)
            goto oom;
        for (int l = 0; l < hp->n_layer && rc == SI_OK; l++)
            rc = build_records(e, l, col, err, err_size);
        free(col);
        if (rc != SI_OK) {
            si_engine_free(e);
            return rc;
        }
    }
    e->p.profile = NULL; /* used during init only */
    e->p.placement = NULL;
    for (int l = 0; l < hp->n_layer; l++) {
        struct layer *L = &e->L[l];
        snprintf(L->name_attn, sizeof L->name_attn, "attn_L%d", l);
        snprintf(L->name_pred, sizeof L->name_pred, "pred_L%d", l);
        snprintf(L->name_merge, sizeof L->name_merge, "merge_L%d", l);
        snprintf(L->name_load, sizeof L->name_load, "load_L%d", l);
        for (int32_t j = 0; L->name_gmask != NULL && j < L->nsl; j++)
            snprintf(L->name_gmask[j], sizeof L->name_gmask[j], "gmask_L%d.%d", l,
                     j - (L->hot ? 1 : 0));
        snprintf(L->name_battn, sizeof L->name_battn, "attn_batch_L%d", l);
        snprintf(L->name_aout, sizeof L->name_aout, "attn_out_L%d", l);
        for (int32_t j = 0; j < e->ng && e->na > 1; j++)
            snprintf(L->name_agrp[j], sizeof L->name_agrp[j], "attn_L%d.%d", l, j);
        for (int32_t j = 0; j < e->na && e->na > 1; j++)
            snprintf(L->name_ao[j], sizeof L->name_ao[j], "attn_o_L%d.%d", l, j);
        snprintf(L->name_bmerge, sizeof L->name_bmerge, "merge_batch_L%d", l);
        for (int32_t k = 0; L->name_down != NULL && k < e->nd; k++) {
            snprintf(L->name_down[k], sizeof L->name_down[k], "ffn_down_L%d.%d", l, k);
            snprintf(L->name_bdown[k], sizeof L->name_bdown[k], "ffn_down_batch_L%d.%d", l, k);
        }
        for (int32_t j = 0; j < L->nsl; j++) {
            if (is_hot(e, l, j)) {
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

    struct si_ref *s = e->ref;
    /* d: n_embd (above) */
    vec(&e->h_x, s->x, d, sizeof(float));
    vec(&e->h_xb, s->xb, d, sizeof(float));
    if (hp->parallel_residual) { /* the attention output beside the FFN's */
        vec(&e->h_xb3, s->xb3, d, sizeof(float));
        starpu_data_set_name(e->h_xb3, "attn_out");
    }
    vec(&e->h_logits, s->logits, (size_t)hp->n_vocab, sizeof(float));
    vec(&e->h_out, m->w.output.data, m->w.output.nbytes, 1);
    vec(&e->h_iota, e->iota, (size_t)hp->n_ff, sizeof(int32_t));
    starpu_vector_data_register(&e->h_hscratch, -1, 0, 2 * (uint32_t)hp->n_ff, sizeof(float));
    starpu_data_set_name(e->h_x, "x");
    starpu_data_set_name(e->h_xb, "ffn_in");
    starpu_data_set_name(e->h_logits, "logits");
    for (int l = 0; l < hp->n_layer; l++)
        register_layer(e, l);
    if (e->flash)
        vec(&e->h_spill, e->region, (size_t)e->spill_cap, e->rec_bytes);
    e->stats.gpu_accounted = gpu_accounted(e);
    e->stats.gpu_allocated_peak = e->cuda_hot ? 0 : -1;
    if (e->stats.gpu_accounted > e->stats.gpu_budget) {
        /* the reserve missed something the engine lets onto the GPU */
        const int64_t a = e->stats.gpu_accounted, b = e->stats.gpu_budget;
        si_engine_free(e);
        return si__errf(err, err_size, SI_E_BUDGET,
                        "the engine's GPU handles take %" PRId64 " bytes, over the VRAM budget "
                        "of %" PRId64, a, b);
    }
    if (e->na > 1) {
        for (int32_t j = 0; j < e->na; j++)
            vec(&e->h_o[j], e->o[j], (size_t)(e->a_o[j + 1] - e->a_o[j]), sizeof(float));
        vec(&e->h_x2, e->x2, d, sizeof(float));
        vec(&e->h_att, s->att, (size_t)hp->n_head * (size_t)hp->head_dim, sizeof(float));
        if (e->ng > 1) {
            struct starpu_data_filter f = {.filter_func = starpu_vector_filter_list,
                                           .nchildren = (unsigned)e->ng,
                                           .filter_arg_ptr = e->att_len};
            starpu_data_partition_plan(e->h_att, &f, e->h_att_c);
            starpu_data_partition_submit(e->h_att, (unsigned)e->ng, e->h_att_c);
        }
        /* The LM head's row slices write children of the logits; the
         * partition is undone before anyone reads them (see eval). */
        e->head_len = calloc((size_t)e->na, sizeof *e->head_len);
        if (e->head_len == NULL)
            goto oom;
        for (int32_t j = 0; j < e->na; j++)
            e->head_len[j] = (uint32_t)(e->a_h[j + 1] - e->a_h[j]);
        struct starpu_data_filter f = {.filter_func = starpu_vector_filter_list,
                                       .nchildren = (unsigned)e->na,
                                       .filter_arg_ptr = e->head_len};
        starpu_data_partition_plan(e->h_logits, &f, e->h_logits_c);
    }
    for (int32_t k = 0; k < e->nd; k++) {
        const size_t no = (size_t)(e->dn[k + 1] - e->dn[k]);
        vec(&e->h_dout[k], e->dout[k], no, sizeof(float));
        if (e->n_batch > 1)
            vec(&e->h_bdout[k], e->bdout[k], (size_t)e->n_batch * no, sizeof(float));
    }
    if (e->n_batch > 1) {
        const size_t bd = (size_t)e->n_batch * d;
        vec(&e->h_bx, e->bx, bd, sizeof(float));
        vec(&e->h_bxb, e->bxb, bd, sizeof(float));
        vec(&e->h_bxb3, e->bxb3, bd, sizeof(float));
        for (int32_t j = 0; j <= ns; j++)
            vec(&e->h_bpart[j], e->bpart[j],
                e->sparse ? bd * (size_t)e->brows[j]
                          : (size_t)e->n_batch * (size_t)(e->bwidth[j] > 0 ? e->bwidth[j] : 1),
                sizeof(float));
        starpu_data_set_name(e->h_bx, "x_batch");
        starpu_data_set_name(e->h_bxb, "ffn_in_batch");
    }
    *out = e;
    return SI_OK;
oom:
    si_engine_free(e);
    return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the engine");
}

void si_engine_free(struct si_engine *e)
{
    if (e == NULL)
        return;
    if (e->h_x != NULL) {
        si_runtime_wait_all();
        for (int l = 0; l < e->m->hp.n_layer; l++)
            unregister_layer(e, l);
        starpu_data_unregister(e->h_x);
        starpu_data_unregister(e->h_xb);
        if (e->head_len != NULL) /* the plan exists from init on */
            starpu_data_partition_clean(e->h_logits, (unsigned)e->na, e->h_logits_c);
        starpu_data_unregister(e->h_logits);
        starpu_data_unregister(e->h_out);
        starpu_data_unregister(e->h_iota);
        starpu_data_unregister(e->h_hscratch);
        if (e->h_spill != NULL)
            starpu_data_unregister(e->h_spill);
        if (e->h_xb3 != NULL)
            starpu_data_unregister(e->h_xb3);
        if (e->h_att != NULL) {
            for (int32_t j = 0; j < e->na; j++)
                starpu_data_unregister(e->h_o[j]);
            if (e->ng > 1) {
                starpu_data_unpartition_submit(e->h_att, (unsigned)e->ng, e->h_att_c,
                                               STARPU_MAIN_RAM);
                starpu_data_partition_clean(e->h_att, (unsigned)e->ng, e->h_att_c);
            }
            starpu_data_unregister(e->h_att);
            starpu_data_unregister(e->h_x2);
        }
        if (e->h_bx != NULL) {
            starpu_data_unregister(e->h_bx);
            starpu_data_unregister(e->h_bxb);
            starpu_data_unregister(e->h_bxb3);
            for (int32_t j = 0; j <= e->n_slices; j++)
                starpu_data_unregister(e->h_bpart[j]);
        }
        for (int32_t k = 0; k < e->nd; k++) {
            if (e->h_dout[k] != NULL)
                starpu_data_unregister(e->h_dout[k]);
            if (e->h_bdout[k] != NULL)
                starpu_data_unregister(e->h_bdout[k]);
        }
    }
    for (int32_t k = 0; k < e->nd; k++) {
        if (e->dout != NULL)
            free(e->dout[k]);
        if (e->bdout != NULL)
            free(e->bdout[k]);
    }
    free(e->dn);
    free(e->dout);
    free(e->bdout);
    free(e->h_dout);
    free(e->h_bdout);
    for (int32_t j = 0; e->o != NULL && j < e->na; j++)
        free(e->o[j]);
    free(e->o);
    free(e->h_o);
    free(e->h_att_c);
    free(e->x2);
    free(e->a_g);
    free(e->att_len);
    free(e->a_o);
    free(e->a_h);
    free(e->name_head);
    free(e->h_logits_c);
    free(e->head_len);
    if (e->bpart != NULL)
        for (int32_t j = 0; j <= e->n_slices; j++)
            free(e->bpart[j]);
    free(e->bpart);
    free(e->h_bpart);
    free(e->brows);
    free(e->bwidth);
    free(e->bx);
    free(e->bxb);
    free(e->bxb3);
    if (e->scratch != NULL)
        for (unsigned w = 0; w < e->n_workers; w++) {
            free(e->scratch[w].aq); /* one allocation for the attention buffers */
            free(e->scratch[w].h);
            free(e->scratch[w].g);
            free(e->scratch[w].ix);
            free(e->scratch[w].y);
            free(e->scratch[w].xq);
            free(e->scratch[w].hq);
            free(e->scratch[w].bg);
            free(e->scratch[w].bu);
            free(e->scratch[w].gemm);
            free(e->scratch[w].dt);
        }
    if (e->L != NULL)
        for (int l = 0; l < e->m->hp.n_layer; l++)
            free_layer(&e->L[l]);
    free(e->L);
    free(e->scratch);
    free(e->zeros);
    free(e->gthr);
    free(e->iota);
    free(e->region);
    free(e->region_bias);
    free(e->spill_of);
    free(e->spill_pos);
    si_ref_free(e->ref);
    free(e);
}

/* Submit layer l's tasks. */
/* Append the handles n_carried() counts for layer l (R) to h/md at n;
 * returns the new count. */
static int add_carried(const struct si_engine *e, int l, starpu_data_handle_t *h,
                       enum starpu_data_access_mode *md, int n)
{
    if (n_carried(e, l) == 0)
        return n;
    const struct layer *P = &e->L[l - 1];
    for (int32_t j = 0; j < (e->sparse ? P->nsl : e->nd); j++, n++) {
        h[n] = e->sparse ? P->h_part_c[j] : e->h_dout[j];
        md[n] = STARPU_R;
    }
    if (e->m->hp.parallel_residual) {
        h[n] = e->h_xb3;
        md[n++] = STARPU_R;
    }
    return n;
}

static int submit_layer(struct si_engine *e, int l, int32_t token)
{
    struct layer *L = &e->L[l];
    starpu_data_handle_t h[MAX_SLICES + 16];
    enum starpu_data_access_mode md[MAX_SLICES + 16];
    int n = 0, rc;
#define ADD(handle, mode) (h[n] = (handle), md[n++] = (mode))
    if (e->na <= 1) {
        ADD(e->h_x, STARPU_RW);
        n = add_carried(e, l, h, md, n);
        ADD(e->h_xb, STARPU_W);
        if (e->h_xb3 != NULL)
            ADD(e->h_xb3, STARPU_W);
        ADD(L->h_k, STARPU_RW);
        ADD(L->h_v, STARPU_RW);
        for (int i = 0; i < 4; i++)
            ADD(L->h_w[i], STARPU_R);
        rc = submit(e, &cl_attn, L->name_attn, l, -1, token, h, md, n, 0);
    } else {
        rc = 0;
        for (int32_t j = 0; j < e->ng && rc == 0; j++) {
            n = 0;
            ADD(e->h_x, STARPU_R);
            n = add_carried(e, l, h, md, n);
            for (int i = 0; i < 3; i++)
                ADD(L->h_w[i], STARPU_R);
            ADD(e->ng > 1 ? L->h_k_c[j] : L->h_k, STARPU_RW);
            ADD(e->ng > 1 ? L->h_v_c[j] : L->h_v, STARPU_RW);
            ADD(e->ng > 1 ? e->h_att_c[j] : e->h_att, STARPU_W);
            if (j == 0)
                ADD(e->h_x2, STARPU_W);
            rc = submit(e, &cl_agrp, L->name_agrp[j], l, j, token, h, md, n, 0);
        }
        for (int32_t j = 0; j < e->na && rc == 0; j++) {
            n = 0;
            for (int32_t g = 0; g < e->ng; g++)
                ADD(e->ng > 1 ? e->h_att_c[g] : e->h_att, STARPU_R);
            ADD(L->h_w[3], STARPU_R);
            ADD(e->h_o[j], STARPU_W);
            rc = submit(e, &cl_ao, L->name_ao[j], l, j, token, h, md, n, 0);
        }
        if (rc == 0 && !e->fuse_out) {
            n = 0;
            ADD(e->h_x2, STARPU_R);
            for (int32_t j = 0; j < e->na; j++)
                ADD(e->h_o[j], STARPU_R);
            ADD(e->h_x, STARPU_W);
            ADD(e->h_xb, STARPU_W);
            if (e->h_xb3 != NULL)
                ADD(e->h_xb3, STARPU_W);
            rc = submit(e, &cl_aout, L->name_aout, l, -1, token, h, md, n, 0);
        }
    }
    if (rc == 0 && e->p.mode == SI_SPARSITY_PREDICTOR) {
        n = 0;
        ADD(e->h_xb, STARPU_R);
        ADD(L->h_fc1, STARPU_R);
        ADD(L->h_fc2, STARPU_R);
        for (int32_t j = 0; j < L->nsl; j++)
            ADD(L->h_idx_c[j], STARPU_W);
        rc = submit(e, &cl_pred, L->name_pred, l, -1, token, h, md, n, 0);
    }
    const int32_t first_cold = L->hot ? 1 : 0;
    if (rc == 0 && e->flash && L->nsl > first_cold) {
        /* The cold neurons' mask (gate mode: the resident gating rows), then
         * the layer's load: cache update and reads, before any ffn_cold. */
        for (int32_t j = first_cold; j < L->nsl && rc == 0 && e->p.mode == SI_SPARSITY_GATE;
             j++) {
            n = 0;
            ADD(e->h_xb, STARPU_R);
            ADD(L->h_gate_c[j], STARPU_R);
            ADD(L->h_upb_c[j], STARPU_R);
            ADD(L->h_idx_c[j], STARPU_W);
            rc = submit(e, &cl_gmask, L->name_gmask[j], l, j, token, h, md, n, STARPU_CPU);
        }
        n = 0;
        for (int32_t j = first_cold; j < L->nsl; j++)
            ADD(L->h_idx_c[j], STARPU_R);
        ADD(L->h_cache, STARPU_RW);
        ADD(e->h_spill, STARPU_RW);
        if (rc == 0)
            rc = submit(e, &cl_load, L->name_load, l, -1, token, h, md, n, STARPU_CPU);
    }
    for (int32_t j = 0; j < L->nsl && rc == 0; j++) {
        const bool hot = is_hot(e, l, j), gpu = hot && e->cuda_hot;
        n = 0;
        if (e->flash && !hot) {
            ADD(e->h_xb, STARPU_R);
            ADD(L->h_cache, STARPU_R);
            ADD(L->h_idx_c[j], STARPU_R);
            ADD(e->h_spill, STARPU_R);
            ADD(L->h_part_c[j], STARPU_W);
            rc = submit(e, &cl_flash, L->name_ffn[j], l, j, token, h, md, n, STARPU_CPU);
            continue;
        }
        if (e->fuse_out) { /* see ffn_input */
            ADD(e->h_x2, STARPU_R);
            for (int32_t k = 0; k < e->na; k++)
                ADD(e->h_o[k], STARPU_R);
        } else {
            ADD(e->h_xb, STARPU_R);
        }
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
        if (e->p.mode == SI_SPARSITY_PREDICTOR)
            ADD(L->h_idx_c[j], STARPU_R);
        if (e->p.redux)
            ADD(L->h_y, STARPU_REDUX);
        else
            ADD(L->h_part_c[j], STARPU_W);
        if (gpu) {
            ADD(e->h_iota, STARPU_R);
            ADD(e->h_hscratch, STARPU_SCRATCH);
        }
        if (e->fuse_out && j == 0) { /* the residual for the next layer */
            ADD(e->h_x, STARPU_W);
            if (e->h_xb3 != NULL)
                ADD(e->h_xb3, STARPU_W);
        }
        rc = submit(e, hot ? &cl_hot : &cl_cold, L->name_ffn[j], l, j, token, h, md, n,
                    gpu ? STARPU_CUDA : STARPU_CPU);
    }
    for (int32_t k = 0; k < e->nd && rc == 0; k++) { /* dense: the down projection */
        n = 0;
        for (int32_t j = 0; j < L->nsl; j++)
            ADD(L->h_part_c[j], STARPU_R);
        ADD(L->h_down_c[k], STARPU_R);
        ADD(e->h_dout[k], STARPU_W);
        rc = submit(e, &cl_down, L->name_down[k], l, k, token, h, md, n, STARPU_CPU);
    }
    if (rc != 0 || !e->p.redux)
        return rc; /* the next layer's attention (or the head) merges */
    n = 0;
    ADD(e->h_x, STARPU_RW);
    ADD(L->h_y, STARPU_RW);
    return submit(e, &cl_merge, L->name_merge, l, -1, token, h, md, n, 0);
#undef ADD
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
    const double t0 = now();
    e->flash_msg[0] = '\0';

    starpu_data_handle_t h[MAX_SLICES + 16];
    enum starpu_data_access_mode md[MAX_SLICES + 16];
    h[0] = e->h_x;
    md[0] = STARPU_W;
    int rc = submit(e, &cl_embed, "embed", -1, -1, token, h, md, 1, 0);
    for (int l = 0; l < hp->n_layer && rc == 0; l++)
        rc = submit_layer(e, l, token);
    if (rc == 0 && e->na > 1) {
        /* The head in row slices, into children of the logits; n_past
         * moves on here, as si_ref_end would. */
        starpu_data_partition_submit(e->h_logits, (unsigned)e->na, e->h_logits_c);
        for (int32_t j = 0; j < e->na && rc == 0; j++) {
            int n = 0;
            h[n] = e->h_x;
            md[n++] = STARPU_R;
            n = add_carried(e, hp->n_layer, h, md, n);
            h[n] = e->h_out;
            md[n++] = STARPU_R;
            h[n] = e->h_logits_c[j];
            md[n++] = STARPU_W;
            rc = submit(e, &cl_head_rows, e->name_head[j], -1, j, token, h, md, n, 0);
        }
        starpu_data_unpartition_submit(e->h_logits, (unsigned)e->na, e->h_logits_c,
                                       STARPU_MAIN_RAM);
    } else if (rc == 0) {
        int n = 0;
        h[n] = e->h_x;
        md[n++] = STARPU_RW;
        n = add_carried(e, hp->n_layer, h, md, n);
        h[n] = e->h_xb;
        md[n++] = STARPU_RW;
        h[n] = e->h_logits;
        md[n++] = STARPU_W;
        h[n] = e->h_out;
        md[n++] = STARPU_R;
        rc = submit(e, &cl_head, "norm+lm_head", -1, -1, token, h, md, n, 0);
    }
    /* Wait for this token's tasks: the logits are ready when readable (the
     * caller's worker, if it has one, runs tasks meanwhile). */
    si_runtime_acquire(e->h_logits, STARPU_R);
    starpu_data_release(e->h_logits);
    if (rc == 0 && e->na > 1)
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
    e->stats.seconds += now() - t0;
    for (int l = 0; l < hp->n_layer; l++) {
        const struct layer *L = &e->L[l];
        for (int32_t j = 0; j < L->nsl; j++) {
            int64_t a = L->active[j];
            if (a < 0) /* the GPU does not count: charge the whole slice */
                a = L->s0[j + 1] - L->s0[j];
            if (is_hot(e, l, j))
                e->stats.neurons_hot += a;
            else
                e->stats.neurons_cold += a;
            if (is_hot(e, l, j) && e->cuda_hot)
                e->stats.weight_bytes_gpu += L->rd[j];
            else
                e->stats.weight_bytes_cpu += L->rd[j];
        }
    }
    e->stats.neurons_total += (int64_t)hp->n_layer * hp->n_ff;
    e->stats.weight_bytes_cpu += e->token_bytes_fixed;
    if (e->cuda_hot && e->cuda_node >= 0) {
        /* What StarPU really allocated on the GPU (its hot slices stay; the
         * activations it moved may stay cached): never above the budget. */
        const int64_t used =
            (int64_t)starpu_memory_get_used((unsigned)e->cuda_node) - e->gpu_base;
        if (used > e->stats.gpu_allocated_peak)
            e->stats.gpu_allocated_peak = used;
        if (used > e->stats.gpu_budget)
            return SI_E_BUDGET;
    }
    return SI_OK;
}

/* One batch of at most n_batch tokens (checked by the caller). */
static int eval_batch(struct si_engine *e, const int32_t *tokens, int32_t n)
{
    const struct si_hparams *hp = &e->m->hp;
    starpu_data_handle_t h[MAX_SLICES + 16];
    enum starpu_data_access_mode md[MAX_SLICES + 16];
    int k = 0, rc;
    e->btok = tokens;
    e->bn = n;
    e->bp0 = e->ref->n_past;
#define ADD(handle, mode) (h[k] = (handle), md[k++] = (mode))
    ADD(e->h_bx, STARPU_W);
    rc = submit(e, &cl_bembed, "embed_batch", -1, -1, 0, h, md, k, 0);
    for (int l = 0; l < hp->n_layer && rc == 0; l++) {
        struct layer *L = &e->L[l];
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
        rc = submit(e, &cl_battn, L->name_battn, l, -1, 0, h, md, k, 0);
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
            rc = submit(e, &cl_bffn, L->name_bffn[j], l, j, 0, h, md, k, STARPU_CPU);
        }
        for (int32_t b = 0; b < e->nd && rc == 0; b++) { /* dense: the down projection */
            k = 0;
            for (int32_t j = 0; j < L->nsl; j++)
                ADD(e->h_bpart[j], STARPU_R);
            ADD(L->h_down_c[b], STARPU_R);
            ADD(e->h_bdout[b], STARPU_W);
            rc = submit(e, &cl_bdown, L->name_bdown[b], l, b, 0, h, md, k, STARPU_CPU);
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
        rc = submit(e, &cl_bmerge, L->name_bmerge, l, -1, 0, h, md, k, 0);
    }
    if (rc == 0) {
        k = 0;
        ADD(e->h_bx, STARPU_R);
        ADD(e->h_xb, STARPU_RW);
        ADD(e->h_logits, STARPU_W);
        ADD(e->h_out, STARPU_R);
        rc = submit(e, &cl_bhead, "norm+lm_head", -1, -1, 0, h, md, k, 0);
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
    const double t0 = now();
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
    e->stats.batch_seconds += now() - t0;
    return SI_OK;
}

const float *si_engine_logits(const struct si_engine *e)
{
    return e->ref->logits;
}

void si_engine_reset(struct si_engine *e)
{
    si_ref_reset(e->ref);
}

struct si_ref *si_engine_ref(struct si_engine *e)
{
    return e->ref;
}

const char *si_engine_flash_error(const struct si_engine *e)
{
    return e->flash_msg;
}

struct si_engine_stats si_engine_get_stats(const struct si_engine *e)
{
    struct si_engine_stats st = e->stats;
    for (int l = 0; e->flash && l < e->m->hp.n_layer; l++) {
        const struct layer *L = &e->L[l];
        st.flash_loads += L->fl_loads;
        st.flash_hits += L->fl_hits;
        st.flash_bytes += L->fl_bytes;
        st.flash_reads += L->fl_reads;
        st.flash_io_seconds += L->fl_io;
        st.flash_manage_seconds += L->fl_manage;
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
    return e->n_slices;
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
    const struct layer *L = &e->L[l];
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
    return e->gthr[l];
}

int64_t si_engine_hot_bytes(const struct si_engine *e)
{
    return e->hot_bytes;
}
