/*
 * load.c - the flash tier's tasks: a layer's load (cache update and reads, flash/tier.h) and its
 * cold slices computed from the cache.
 */
#include "codelets/codelets.h"

#include "codelets/ffn_sparse.h"
#include "flash/tier.h"
#include "model/act.h"
#include "starinfer.h"

#include <starpu.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static void flash_fail(struct si_engine *e, int rc, const char *msg)
{
    if (e->fl.err == SI_OK) {
        e->fl.err = rc;
        snprintf(e->err_msg, sizeof e->err_msg, "%s", msg);
    }
}

/*
 * A layer's load: its cold slices' active positions (idx children, R),
 * handed to the tier, which updates the layer's cache and has its reader
 * thread read the missing records into their slots (si_flash_tier_load):
 * the task ends without waiting for them, the ffn_cold tasks do.
 * Buffers: idx of each cold slice (R), the cache, the spill area (RW).
 */
struct load_io {
    const int32_t *idx[SI__MAX_SLICES + 1]; /* by slot (the hot one's unused) */
};

static void load_bufs(struct si__bufs *b, struct si_engine *e, int l, struct load_io *io)
{
    struct si__layer_state *L = &e->L[l];
    for (int32_t j = L->hot ? 1 : 0; j < L->nsl; j++)
        io->idx[j] = si__vec(b, L->h_idx_c[j], STARPU_R);
    si__buf(b, L->h_cache, STARPU_RW);
    si__buf(b, e->fl.h_spill, STARPU_RW);
}

static void load_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__layer_state *L = &e->L[a->l];
    int32_t *act = e->fl.ft->L[a->l].act;
    struct load_io io;
    struct si__bufs bw = si__bufs_task(buffers, cl_arg);
    load_bufs(&bw, e, a->l, &io);
    double t0 = si__now();
    const int32_t first = L->hot ? 1 : 0;
    int64_t na = 0;
    for (int32_t j = first; j < L->nsl; j++) {
        const int32_t *idx = io.idx[j];
        const int64_t n = L->s0[j + 1] - L->s0[j];
        for (int64_t q = 0; q < n && idx[q] >= 0; q++)
            act[na++] = (int32_t)(L->s0[j] + idx[q]);
    }
    const char *msg;
    const int rc = si_flash_tier_load(e->fl.ft, a->l, L->perm, na, &msg);
    if (rc != SI_OK)
        flash_fail(e, rc, msg);
    si__account(e, SI_TASK_LOAD, t0);
}

/* Wait for layer l's reads; the time waited counts as the load's. */
static void wait_reads(struct si_engine *e, int l, double *t0)
{
    const double w0 = si__now();
    const char *msg;
    const int rc = si_flash_tier_wait(e->fl.ft, l, &msg);
    if (rc != SI_OK)
        flash_fail(e, rc, msg);
    const double waited = si__now() - w0;
    struct si__scratch *sc = si__scratch_of(e);
    sc->busy[SI_TASK_LOAD] += waited;
    *t0 += waited;
}

/*
 * A cold slice from the flash cache: the active positions (idx) mapped to
 * their records, then ffn_sparse_slice's arithmetic in the same order (the
 * partial output equals the all-in-DRAM one bit for bit).  The records that
 * were cached already go first, while the layer's reads are in flight;
 * then the task waits for the reads and does the fresh ones.  Each neuron's
 * activation is the same whenever it is computed, and the down projection
 * runs after the wait, in order.
 * Buffers: ffn_in, the cache, idx j, the spill area (R), partial output j
 * (W), [gate mode: gact j (R), the gmask task's act(gate)].
 */
struct flash_io {
    const float *xb, *gact;
    const int32_t *idx;
    float *y;
};

static void flash_bufs(struct si__bufs *b, struct si_engine *e, int l, int j, struct flash_io *io)
{
    struct si__layer_state *L = &e->L[l];
    io->xb = si__vec(b, e->dec.h_ffn_in, STARPU_R);
    si__buf(b, L->h_cache, STARPU_R);
    io->idx = si__vec(b, L->h_idx_c[j], STARPU_R);
    si__buf(b, e->fl.h_spill, STARPU_R);
    io->y = si__vec(b, L->h_part_c[j], STARPU_W);
    io->gact = L->gact != NULL ? si__vec(b, L->h_gact_c[j], STARPU_R) : NULL;
}

static void ffn_flash_cpu(void *buffers[], void *cl_arg)
{
    struct si__task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si__layer_state *L = &e->L[a->l];
    const struct si_hparams *hp = &e->m->hp;
    struct si__scratch *sc = si__scratch_of(e);
    const int64_t d = hp->n_embd, p0 = L->s0[a->j], n = L->s0[a->j + 1] - p0;
    const struct si__ffn_fmt *f = &L->f;
    const size_t rb = f->rec_bytes;
    const uint32_t t = f->gu_type;
    struct flash_io io;
    struct si__bufs bw = si__bufs_task(buffers, cl_arg);
    flash_bufs(&bw, e, a->l, a->j, &io);
    double t0 = si__now();
    const float *xb = io.xb;
    /* Records by their index in the region (the cache's and the spill
     * area's buffers are parts of it, on the CPU: the same addresses). */
    const char *mat = e->fl.ft->region;
    const int32_t *idx = io.idx;
    float *y = io.y;
    const bool bias = e->w->layers[a->l].ffn_up_b.data != NULL;
    const float *b = bias ? e->fl.ft->region_bias : NULL;
    const void *xa = si__ffn_convert_input(e, t, xb, sc->xq);
    const char *gate = f->gate_off >= 0 ? mat + f->gate_off : NULL;
    const char *up = f->up_off >= 0 ? mat + f->up_off : NULL;
    const struct si_flash_tier *ft = e->fl.ft;
    int64_t k = 0;
    if (e->p.mode == SI_SPARSITY_PREDICTOR) {
        /* ix: the records in order; sx: the cached ones (kc), then the
         * fresh ones; g: their activations in sx's order. */
        int32_t *sx = sc->sx;
        float *hs = sc->g;
        int64_t kc = 0;
        for (int64_t q = 0; q < n && idx[q] >= 0; q++) {
            const int32_t s = si_flash_tier_record(ft, a->l, p0 + idx[q]);
            if (s < 0) /* only after a failed load (reported by eval) */
                continue;
            sc->ix[k++] = s;
            if (!si_flash_tier_fresh(ft, s))
                sx[kc++] = s;
        }
        int64_t kf = kc;
        for (int64_t q = 0; q < k; q++)
            if (si_flash_tier_fresh(ft, sc->ix[q]))
                sx[kf++] = sc->ix[q];
        si__ffn_act_records(e, f, gate, up, b, xa, xb, sx, kc, hs);
        wait_reads(e, a->l, &t0);
        si__ffn_act_records(e, f, gate, up, b, xa, xb, sx + kc, k - kc, hs + kc);
        for (int64_t q = 0, c = 0, r = kc; q < k; q++)
            sc->h[q] = si_flash_tier_fresh(ft, sc->ix[q]) ? hs[r++] : hs[c++];
        L->rd[a->j] = k * (int64_t)f->gu_row * (gate != NULL ? 2 : 1);
    } else {
        /* rx[q]: position q's record (< 0: none); hq[q]: its activation,
         * gmask's act(gate) times the up dot for the gated kinds, whose
         * cached records go in pass 0 while the reads are in flight and
         * fresh ones in pass 1 (the plain kind has no dot: it waits, then
         * takes them all in pass 1); then the non-zero ones' records and
         * activations into ix and h, in order. */
        int32_t *rx = sc->sx;
        float *hq = sc->g;
        int64_t nq = 0;
        for (; nq < n && idx[nq] >= 0; nq++)
            rx[nq] = si_flash_tier_record(ft, a->l, p0 + idx[nq]);
        const bool early = hp->ffn_kind != SI_FFN_PLAIN;
        for (int pass = early ? 0 : 1; pass < 2; pass++) {
            if (pass == 1)
                wait_reads(e, a->l, &t0);
            for (int64_t q = 0; q < nq; q++) {
                const int32_t s = rx[q];
                if (s < 0 || (early && si_flash_tier_fresh(ft, s) != (pass == 1)))
                    continue;
                float h = io.gact[idx[q]];
                if (early) {
                    float u = si__ffn_dot(t, up + (size_t)s * rb, xa, xb, d);
                    L->rd[a->j] += (int64_t)f->gu_row; /* after gmask's gating rows */
                    if (b != NULL)
                        u += b[s];
                    h = si_act_gated(hp->ffn_kind, h, u);
                }
                hq[q] = h;
            }
        }
        for (int64_t q = 0; q < nq; q++) {
            if (rx[q] < 0 || hq[q] == 0.0f)
                continue;
            sc->h[k] = hq[q];
            sc->ix[k++] = rx[q];
        }
    }
    si_k_ffn_down_sparse(f->dt_type, mat + f->dt_off, rb, d, sc->h, sc->ix, k, y);
    int64_t computed = 0;
    for (int64_t q = 0; q < k; q++)
        computed += sc->h[q] != 0.0f;
    L->active[a->j] = computed;
    L->rd[a->j] += computed * (int64_t)f->dt_row;
    si__account(e, SI_TASK_FFN_COLD, t0);
}

int si__submit_load(struct si_engine *e, int l, int32_t token)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    load_bufs(&b, e, l, &(struct load_io){0});
    return si__submit(e, &si__cl_load, e->L[l].name_load, l, -1, token, &a, STARPU_CPU);
}

int si__submit_flash(struct si_engine *e, int l, int j, int32_t token)
{
    struct si__args a;
    struct si__bufs b = si__bufs_collect(&a);
    flash_bufs(&b, e, l, j, &(struct flash_io){0});
    return si__submit(e, &si__cl_flash, e->L[l].name_ffn[j], l, j, token, &a, STARPU_CPU);
}

static struct starpu_perfmodel load_model = {.type = STARPU_HISTORY_BASED,
                                             .symbol = "si_flash_load"};
static struct starpu_perfmodel flash_model = {.type = STARPU_HISTORY_BASED,
                                              .symbol = "si_ffn_flash"};

struct starpu_codelet si__cl_load = {
    .cpu_funcs = {load_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &load_model,
    .name = "load",
};
struct starpu_codelet si__cl_flash = {
    .cpu_funcs = {ffn_flash_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &flash_model,
    .name = "ffn_flash",
};
