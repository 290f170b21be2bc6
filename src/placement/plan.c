/* plan.c - the engine's neuron planning: hot slice and cold slices (see plan.h). */
#include "placement/plan.h"

#include "internal.h"
#include "placement/placement.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <inttypes.h>
#include <stdlib.h>

const char *si_gpu_item_name(enum si_gpu_item i)
{
    static const char *const names[] = {"attention", "predictor", "kv cache", "lm_head",
                                        "buffers",   "workspace", "allocator"};
    return (unsigned)i < SI_GPU_ITEM_COUNT ? names[i] : "?";
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
 * How many neurons of each layer go to the hot slice.  With a placement:
 * exactly its GPU neurons.  Without: hottest first while the budget lasts,
 * across layers by profile count when there is a profile (and neurons may
 * be permuted), else the same share per layer.  Either way the budget must
 * hold the reserve and the hot neurons must fit what it leaves.
 */
static int count_hot(const struct si_plan_params *p, bool placing, int64_t vram,
                     struct si_plan_layer *layers, char *err, size_t err_size)
{
    const struct si_gpu_reserve *rs = &p->reserve;
    const struct si_profile *pr = p->profile;
    const struct si_placement *pl = p->placement;
    const bool sparse = rs->any_neurons;
    const int64_t unit = rs->unit_bytes, chunk = rs->unit_neurons, ff = p->n_ff;
    if (placing && vram < rs->total)
        return si__errf(err, err_size, SI_E_BUDGET,
                        "VRAM budget of %" PRId64 " bytes is below the %" PRId64
                        " bytes the engine puts on the GPU besides FFN neurons",
                        vram, rs->total);
    int64_t budget = placing ? vram - rs->total : 0;
    if (placing && pl != NULL) {
        int64_t n = 0;
        for (int l = 0; l < p->n_layer; l++) {
            layers[l].n_hot = pl->n_gpu[l];
            n += pl->n_gpu[l];
        }
        if (n * unit > budget)
            return si__errf(err, err_size, SI_E_BUDGET,
                            "the placement's %" PRId64 " GPU neurons take %" PRId64
                            " bytes, the VRAM budget of %" PRId64 " leaves %" PRId64
                            " after the engine's %" PRId64,
                            n, n * unit, vram, budget, rs->total);
    } else if (placing && budget >= unit) {
        if (pr != NULL && sparse) {
            const size_t n = (size_t)p->n_layer * (size_t)ff;
            struct ranked *r = malloc(n * sizeof *r);
            if (r == NULL)
                return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the placement");
            for (int l = 0; l < p->n_layer; l++)
                for (int64_t i = 0; i < ff; i++)
                    r[(size_t)l * ff + i] =
                        (struct ranked){pr->counts[(size_t)l * ff + i], l, (int32_t)i};
            qsort(r, n, sizeof *r, cmp_ranked);
            for (size_t k = 0; k < n && budget >= unit; k++, budget -= unit)
                layers[r[k].l].n_hot++;
            free(r);
        } else {
            const int64_t per_layer = budget / unit / p->n_layer;
            const int64_t units = ff / (sparse ? 1 : chunk);
            for (int l = 0; l < p->n_layer; l++)
                layers[l].n_hot = (per_layer < units ? per_layer : units) * (sparse ? 1 : chunk);
        }
    }
    return SI_OK;
}

/* Layer l's permutation and slices, its hot count known; r is scratch (n_ff). */
static void deal(const struct si_plan_params *p, bool placing, int l, struct ranked *r,
                 struct si_plan_layer *L)
{
    const struct si_profile *pr = p->profile;
    const struct si_placement *pl = p->placement;
    const bool sparse = p->reserve.any_neurons;
    const int64_t ff = p->n_ff, chunk = p->reserve.unit_neurons;
    const int32_t ns = p->n_slices;
    const bool ranked = pr != NULL && sparse;
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
    for (int64_t q = 0; q < L->n_hot; q++)
        L->perm[q] = r[q].i;
    const int64_t cold = ff - L->n_hot;
    L->nsl = 0;
    L->s0[0] = 0;
    if (L->n_hot > 0) {
        L->s0[1] = L->n_hot;
        L->nsl = 1;
    }
    if (!sparse) {
        /* whole units, file order */
        const int64_t nch = cold / chunk, nsl = ns < nch ? ns : nch;
        for (int32_t j = 1; j <= nsl; j++)
            L->s0[L->nsl + j] = L->n_hot + (int64_t)j * nch / nsl * chunk;
        L->nsl += (int32_t)nsl;
        for (int64_t q = L->n_hot; q < ff; q++)
            L->perm[q] = r[q].i;
        return;
    }
    /* dealt in turn, hottest first (with a profile), else in runs */
    const int64_t nsl = ns < cold ? ns : cold;
    int64_t q = L->n_hot;
    for (int32_t j = 0; j < nsl; j++) {
        if (ranked)
            for (int64_t k = L->n_hot + j; k < ff; k += nsl)
                L->perm[q++] = r[k].i;
        else
            for (int64_t k = L->n_hot + j * cold / nsl; k < L->n_hot + (j + 1) * cold / nsl; k++)
                L->perm[q++] = r[k].i;
        L->s0[L->nsl + j + 1] = q;
    }
    L->nsl += (int32_t)nsl;
}

int si_plan_neurons(const struct si_plan_params *p, struct si_plan_layer *layers,
                    int64_t *gpu_budget, int64_t *hot_bytes, char *err, size_t err_size)
{
    const struct si_placement *pl = p->placement;
    const int64_t vram = p->vram_budget > 0                             ? p->vram_budget
                         : pl != NULL && pl->vram_capacity <= INT64_MAX ? (int64_t)pl->vram_capacity
                                                                        : 0;
    const bool placing = p->gpu && (vram > 0 || (pl != NULL && si_placement_gpu_neurons(pl) > 0));
    for (int l = 0; l < p->n_layer; l++)
        layers[l].n_hot = 0;
    *gpu_budget = placing ? vram : 0;
    *hot_bytes = 0;
    int rc = count_hot(p, placing, vram, layers, err, err_size);
    if (rc != SI_OK)
        return rc;
    const int64_t per = p->reserve.any_neurons ? 1 : p->reserve.unit_neurons;
    for (int l = 0; l < p->n_layer; l++)
        *hot_bytes += layers[l].n_hot / per * p->reserve.unit_bytes;
    struct ranked *r = malloc((size_t)p->n_ff * sizeof *r);
    if (r == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the placement");
    for (int l = 0; l < p->n_layer; l++)
        deal(p, placing, l, r, &layers[l]);
    free(r);
    return SI_OK;
}
