/* ilp.c - the neuron placement ILP through lp_solve (ilp.h). */
#include "placement/ilp.h"

#include "internal.h"
#include "starinfer.h"

#include <lpsolve/lp_lib.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct si_ilp_problem si_ilp_default_problem(void)
{
    return (struct si_ilp_problem){.cpu_capacity = -1,
                                   .batch = 64,
                                   .time_limit = 10.0,
                                   .mip_gap = 1e-6,
                                   .chain_cuts = true};
}

const char *si_ilp_outcome_name(enum si_ilp_outcome o)
{
    static const char *const names[] = {"optimal", "time limit: best incumbent",
                                        "time limit: greedy"};
    return (unsigned)o < SI_ILP_OUTCOME_COUNT ? names[o] : "?";
}

void si_ilp_result_free(struct si_ilp_result *r)
{
    if (r == NULL)
        return;
    free(r->gpu);
    free(r->n_gpu);
    r->gpu = NULL;
    r->n_gpu = NULL;
}

/* The batches: layer by layer, each layer's most active first. */
struct batches {
    int64_t n;
    int32_t *order;  /* (n_layer, n_ff) neuron ids of each layer, most active first */
    int32_t *layer;  /* (n) */
    int32_t *first;  /* (n) rank of its first neuron in its layer's order */
    int32_t *size;   /* (n) neurons */
    double *impact;  /* (n) */
    int64_t *bytes;  /* (n) */
    int64_t *begin;  /* (n_layer + 1) batches of layer l: [begin[l], begin[l + 1]) */
};

static void batches_free(struct batches *B)
{
    free(B->order);
    free(B->layer);
    free(B->first);
    free(B->size);
    free(B->impact);
    free(B->bytes);
    free(B->begin);
}

/* qsort_r order of indices into key[]: largest key first, then smaller index. */
static int cmp_impact(const void *pa, const void *pb, void *ctx)
{
    const double *sort_key = ctx;
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    if (sort_key[a] != sort_key[b])
        return sort_key[a] > sort_key[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

static int check_problem(const struct si_ilp_problem *p, char *err, size_t err_size)
{
    if (p->n_layer < 1 || p->n_ff < 1)
        return si__errf(err, err_size, SI_E_INVALID, "placement of %" PRId32 " layers x %" PRId32
                        " neurons: both must be >= 1", p->n_layer, p->n_ff);
    if (p->impact == NULL || p->neuron_bytes == NULL || p->c_min == NULL)
        return si__errf(err, err_size, SI_E_INVALID, "placement: missing impacts, sizes or C_l");
    if (p->batch < 1)
        return si__errf(err, err_size, SI_E_INVALID, "placement: batch size %" PRId32 " < 1",
                        p->batch);
    if (p->capacity < 0)
        return si__errf(err, err_size, SI_E_INVALID, "placement: negative GPU capacity %" PRId64,
                        p->capacity);
    if (!(p->time_limit > 0) || !(p->mip_gap >= 0))
        return si__errf(err, err_size, SI_E_INVALID,
                        "placement: time limit must be > 0 and the MIP gap >= 0");
    for (int32_t l = 0; l < p->n_layer; l++) {
        if (p->neuron_bytes[l] < 1)
            return si__errf(err, err_size, SI_E_INVALID,
                            "placement: layer %" PRId32 ": neuron size %" PRId64 " < 1", l,
                            p->neuron_bytes[l]);
        if (p->c_min[l] < 1)
            return si__errf(err, err_size, SI_E_INVALID,
                            "placement: layer %" PRId32 ": C_l = %" PRId64 " < 1", l, p->c_min[l]);
    }
    const size_t n = (size_t)p->n_layer * (size_t)p->n_ff;
    for (size_t i = 0; i < n; i++)
        if (!(p->impact[i] >= 0 && isfinite(p->impact[i])))
            return si__errf(err, err_size, SI_E_INVALID,
                            "placement: impact of layer %zu neuron %zu is not finite and >= 0",
                            i / (size_t)p->n_ff, i % (size_t)p->n_ff);
    return SI_OK;
}

static int make_batches(const struct si_ilp_problem *p, struct batches *B)
{
    memset(B, 0, sizeof *B);
    const int64_t per_layer = (p->n_ff + p->batch - 1) / p->batch;
    const int64_t n = per_layer * p->n_layer;
    B->n = n;
    B->order = malloc((size_t)p->n_layer * (size_t)p->n_ff * sizeof *B->order);
    B->layer = malloc((size_t)n * sizeof *B->layer);
    B->first = malloc((size_t)n * sizeof *B->first);
    B->size = malloc((size_t)n * sizeof *B->size);
    B->impact = malloc((size_t)n * sizeof *B->impact);
    B->bytes = malloc((size_t)n * sizeof *B->bytes);
    B->begin = malloc(((size_t)p->n_layer + 1) * sizeof *B->begin);
    if (!B->order || !B->layer || !B->first || !B->size || !B->impact || !B->bytes || !B->begin)
        return SI_E_NOMEM;
    int64_t k = 0;
    for (int32_t l = 0; l < p->n_layer; l++) {
        int32_t *ord = B->order + (size_t)l * (size_t)p->n_ff;
        for (int32_t i = 0; i < p->n_ff; i++)
            ord[i] = i;
        const double *sort_key = p->impact + (size_t)l * (size_t)p->n_ff;
        qsort_r(ord, (size_t)p->n_ff, sizeof *ord, cmp_impact, (void *)sort_key);
        B->begin[l] = k;
        for (int32_t f = 0; f < p->n_ff; f += p->batch, k++) {
            const int32_t s = p->n_ff - f < p->batch ? p->n_ff - f : p->batch;
            double v = 0;
            for (int32_t i = f; i < f + s; i++)
                v += sort_key[ord[i]];
            B->layer[k] = l;
            B->first[k] = f;
            B->size[k] = s;
            B->impact[k] = v;
            B->bytes[k] = (int64_t)s * p->neuron_bytes[l];
        }
    }
    B->begin[p->n_layer] = k;
    return SI_OK;
}

/* Allocate r's arrays and fill them from the batch choice x (n of 0/1). */
static int fill_result(const struct si_ilp_problem *p, const struct batches *B, const uint8_t *x,
                       struct si_ilp_result *r)
{
    r->gpu = calloc((size_t)p->n_layer * (size_t)p->n_ff, 1);
    r->n_gpu = calloc((size_t)p->n_layer, sizeof *r->n_gpu);
    if (r->gpu == NULL || r->n_gpu == NULL) {
        si_ilp_result_free(r);
        return SI_E_NOMEM;
    }
    r->gpu_bytes = 0;
    r->objective = 0;
    for (int64_t b = 0; b < B->n; b++) {
        if (!x[b])
            continue;
        const int32_t l = B->layer[b];
        const int32_t *ord = B->order + (size_t)l * (size_t)p->n_ff;
        for (int32_t i = B->first[b]; i < B->first[b] + B->size[b]; i++)
            r->gpu[(size_t)l * (size_t)p->n_ff + (size_t)ord[i]] = 1;
        r->n_gpu[l] += B->size[b];
        r->gpu_bytes += B->bytes[b];
        r->objective += B->impact[b];
    }
    r->n_batches = B->n;
    return SI_OK;
}

static int64_t total_bytes(const struct batches *B)
{
    int64_t t = 0;
    for (int64_t b = 0; b < B->n; b++)
        t += B->bytes[b];
    return t;
}

/* Does x keep every constraint, in integer arithmetic? */
static bool feasible(const struct si_ilp_problem *p, const struct batches *B, const uint8_t *x)
{
    int64_t bytes = 0;
    for (int32_t l = 0; l < p->n_layer; l++) {
        int64_t n = 0;
        for (int64_t b = B->begin[l]; b < B->begin[l + 1]; b++)
            if (x[b]) {
                n += B->size[b];
                bytes += B->bytes[b];
            }
        if (n > 0 && n < p->c_min[l])
            return false;
    }
    return bytes <= p->capacity && (p->cpu_capacity < 0 || total_bytes(B) - bytes <= p->cpu_capacity);
}

/* Items of the two functions below: a run of neurons of one layer. */
struct item {
    double value, bytes;
};

static int cmp_item(const void *pa, const void *pb)
{
    const struct item *a = pa, *b = pb;
    const double ra = a->value / a->bytes, rb = b->value / b->bytes;
    return ra > rb ? -1 : ra < rb;
}

/*
 * An upper bound of the optimum: the best fractional choice over each
 * layer's concave envelope.  With its neurons sorted, a layer holding k GPU
 * neurons (k = 0 or k >= C_l) is worth at most P(k), the sum of its k most
 * active; the envelope of those points is the line from 0 to C_l, then P.
 * So each layer that may use the GPU offers an item "its C_l most active
 * neurons" and then its remaining neurons (to the next batch boundary, then
 * batch by batch), in decreasing value per byte; filling the capacity with
 * the items of most value per byte, the last one in part, bounds every
 * placement (the CPU limit dropped, which only raises the bound).  Tighter
 * than the LP relaxation of (5)-(6) with big K, which drops C_l altogether.
 */
static double hull_bound(const struct si_ilp_problem *p, const struct batches *B)
{
    struct item *it = malloc(((size_t)B->n + 2 * (size_t)p->n_layer) * sizeof *it);
    if (it == NULL)
        return INFINITY;
    size_t n = 0;
    for (int32_t l = 0; l < p->n_layer; l++) {
        if (p->c_min[l] > p->n_ff)
            continue;
        const int32_t *ord = B->order + (size_t)l * (size_t)p->n_ff;
        const double *v = p->impact + (size_t)l * (size_t)p->n_ff, M = (double)p->neuron_bytes[l];
        int64_t i = 0;
        double acc = 0;
        for (; i < p->c_min[l]; i++)
            acc += v[ord[i]];
        it[n++] = (struct item){acc, (double)p->c_min[l] * M};
        while (i < p->n_ff) {
            const int64_t end = (i / p->batch + 1) * p->batch < p->n_ff
                                    ? (i / p->batch + 1) * p->batch
                                    : p->n_ff;
            acc = 0;
            for (int64_t k = i; k < end; k++)
                acc += v[ord[k]];
            it[n++] = (struct item){acc, (double)(end - i) * M};
            i = end;
        }
    }
    qsort(it, n, sizeof *it, cmp_item);
    double left = (double)p->capacity, ub = 0;
    for (size_t k = 0; k < n && left > 0; k++) {
        const double take = it[k].bytes <= left ? 1.0 : left / it[k].bytes;
        ub += take * it[k].value;
        left -= take * it[k].bytes;
    }
    free(it);
    return ub;
}

/*
 * The greedy choice into x (see ilp.h): a layer without GPU batches offers
 * its first batches up to C_l neurons as one block, a layer with some its
 * next batch; the offer of most impact per byte that fits is taken, one that
 * does not fit closes its layer.  Each layer's choice is a prefix, as the
 * chain cuts want.  SI_OK or SI_E_NOMEM.
 */
static int greedy(const struct si_ilp_problem *p, const struct batches *B, uint8_t *x)
{
    int64_t *next = malloc((size_t)p->n_layer * sizeof *next); /* next batch to offer */
    int64_t *block = malloc((size_t)p->n_layer * sizeof *block); /* its end; -1: closed */
    memset(x, 0, (size_t)B->n);
    if (next == NULL || block == NULL) {
        free(next);
        free(block);
        return SI_E_NOMEM;
    }
    for (int32_t l = 0; l < p->n_layer; l++) {
        next[l] = B->begin[l];
        block[l] = -1;
        int64_t cum = 0;
        for (int64_t b = B->begin[l]; b < B->begin[l + 1] && p->c_min[l] <= p->n_ff; b++) {
            cum += B->size[b];
            if (cum >= p->c_min[l]) {
                block[l] = b + 1;
                break;
            }
        }
    }
    int64_t left = p->capacity;
    for (;;) {
        int32_t best = -1;
        double best_r = -1;
        int64_t best_bytes = 0, best_end = 0;
        for (int32_t l = 0; l < p->n_layer; l++) {
            if (block[l] < 0 || next[l] >= B->begin[l + 1])
                continue;
            const int64_t end = next[l] == B->begin[l] ? block[l] : next[l] + 1;
            double v = 0;
            int64_t by = 0;
            for (int64_t b = next[l]; b < end; b++) {
                v += B->impact[b];
                by += B->bytes[b];
            }
            if ((double)v / (double)by > best_r) {
                best = l;
                best_r = v / (double)by;
                best_bytes = by;
                best_end = end;
            }
        }
        if (best < 0)
            break;
        if (best_bytes > left) {
            block[best] = -1; /* nothing more for this layer */
            continue;
        }
        for (int64_t b = next[best]; b < best_end; b++)
            x[b] = 1;
        left -= best_bytes;
        next[best] = best_end;
    }
    free(next);
    free(block);
    return SI_OK;
}

int si_ilp_greedy(const struct si_ilp_problem *p, struct si_ilp_result *r, char *err,
                  size_t err_size)
{
    memset(r, 0, sizeof *r);
    const double t0 = si__now();
    int rc = check_problem(p, err, err_size);
    if (rc != SI_OK)
        return rc;
    struct batches B;
    uint8_t *x = NULL;
    if ((rc = make_batches(p, &B)) != SI_OK || (x = malloc((size_t)B.n)) == NULL ||
        greedy(p, &B, x) != SI_OK) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "placement: out of memory");
        goto out;
    }
    r->bound = hull_bound(p, &B);
    if (!feasible(p, &B, x)) {
        rc = si__errf(err, err_size, SI_E_BUDGET,
                      "placement: the CPU capacity (%" PRId64 " bytes) cannot hold the neurons "
                      "that the GPU's %" PRId64 " bytes leave to it",
                      p->cpu_capacity, p->capacity);
        goto out;
    }
    if ((rc = fill_result(p, &B, x, r)) != SI_OK) {
        rc = si__errf(err, err_size, rc, "placement: out of memory");
        goto out;
    }
    r->greedy_objective = r->objective;
    r->outcome = SI_ILP_GREEDY;
    r->gap = r->bound > 0 ? (r->bound - r->objective) / r->bound : 0;
    r->seconds = si__now() - t0;
out:
    free(x);
    batches_free(&B);
    return rc;
}

int si_ilp_exhaustive(const struct si_ilp_problem *p, struct si_ilp_result *r, char *err,
                      size_t err_size)
{
    memset(r, 0, sizeof *r);
    int rc = check_problem(p, err, err_size);
    if (rc != SI_OK)
        return rc;
    struct batches B;
    uint8_t *x = NULL, *best = NULL;
    if ((rc = make_batches(p, &B)) != SI_OK) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "placement: out of memory");
        goto out;
    }
    if (B.n > 24) {
        rc = si__errf(err, err_size, SI_E_INVALID,
                      "exhaustive search: %" PRId64 " batches (24 at most)", B.n);
        goto out;
    }
    x = calloc((size_t)B.n, 1);
    best = calloc((size_t)B.n, 1);
    if (x == NULL || best == NULL) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "placement: out of memory");
        goto out;
    }
    double best_v = -1;
    for (uint32_t mask = 0; mask < (1u << B.n); mask++) {
        double v = 0;
        for (int64_t b = 0; b < B.n; b++) {
            x[b] = (mask >> b) & 1u;
            v += x[b] ? B.impact[b] : 0;
        }
        if (v > best_v && feasible(p, &B, x)) {
            best_v = v;
            memcpy(best, x, (size_t)B.n);
        }
    }
    if (best_v < 0) {
        rc = si__errf(err, err_size, SI_E_BUDGET, "exhaustive search: no feasible placement");
        goto out;
    }
    if ((rc = fill_result(p, &B, best, r)) != SI_OK) {
        rc = si__errf(err, err_size, rc, "placement: out of memory");
        goto out;
    }
    r->bound = r->objective;
    r->outcome = SI_ILP_OPTIMAL;
out:
    free(x);
    free(best);
    batches_free(&B);
    return rc;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b != 0) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* lp_solve's messages would go to stdout: keep them quiet (verbosity 1). */
static int build_lp(lprec *lp, const struct si_ilp_problem *p, const struct batches *B,
                    int64_t *n_rows)
{
    const int nb = (int)B->n, ncol = nb + p->n_layer;
    /* Bytes in units of g, the greatest common divisor of the batches'
     * bytes: the capacity rows then have whole coefficients and a whole
     * right-hand side, floor(capacity / g), a valid tightening (a sum of
     * whole numbers at most c / g is at most its floor).  With batches of
     * one size, the row is a cardinality limit and, with the chain cuts,
     * the LP relaxation without (5) has an integral optimum: branch and
     * bound then has little to do (measured: seconds instead of minutes on
     * the 70B-shaped instance). */
    int64_t g = 0;
    for (int64_t b = 0; b < B->n; b++)
        g = gcd64(g, B->bytes[b]);
    const double unit = (double)(g > 0 ? g : 1);
    int *col = malloc((size_t)(ncol + 1) * sizeof *col);
    REAL *val = malloc((size_t)(ncol + 1) * sizeof *val);
    if (col == NULL || val == NULL) {
        free(col);
        free(val);
        return SI_E_NOMEM;
    }
    int ok = 1;
    for (int c = 1; c <= ncol; c++) {
        col[c - 1] = c;
        val[c - 1] = c <= nb ? B->impact[c - 1] : 0.0;
    }
    ok &= set_obj_fnex(lp, ncol, val, col);
    set_maxim(lp);
    for (int c = 1; c <= ncol && ok; c++)
        ok &= set_binary(lp, c, TRUE);
    for (int32_t l = 0; l < p->n_layer && ok; l++)
        if (p->c_min[l] > p->n_ff)
            ok &= set_upbo(lp, nb + 1 + l, 0.0); /* y_l = 0: the GPU cannot pay off here */
    set_add_rowmode(lp, TRUE);
    /* (4) GPU capacity */
    for (int b = 0; b < nb; b++) {
        col[b] = b + 1;
        val[b] = (double)B->bytes[b] / unit;
    }
    ok &= add_constraintex(lp, nb, val, col, LE, (double)(p->capacity / (int64_t)unit));
    *n_rows = 1;
    /* (4) CPU capacity: what the GPU does not take must fit it */
    if (p->cpu_capacity >= 0 && ok) {
        const int64_t need = total_bytes(B) - p->cpu_capacity; /* ceil(need / g) */
        ok &= add_constraintex(lp, nb, val, col, GE,
                               need <= 0 ? 0.0 : (double)((need + (int64_t)unit - 1) / (int64_t)unit));
        ++*n_rows;
    }
    /* (5) and (6): at least C_l neurons of a layer with y_l = 1, none with y_l = 0 */
    for (int32_t l = 0; l < p->n_layer && ok; l++) {
        int n = 0;
        for (int64_t b = B->begin[l]; b < B->begin[l + 1]; b++, n++) {
            col[n] = (int)b + 1;
            val[n] = B->size[b];
        }
        col[n] = nb + 1 + l;
        val[n] = -(double)(p->c_min[l] > p->n_ff ? p->n_ff : p->c_min[l]);
        ok &= add_constraintex(lp, n + 1, val, col, GE, 0.0);
        val[n] = -(double)p->n_ff; /* K */
        ok &= add_constraintex(lp, n + 1, val, col, LE, 0.0);
        *n_rows += 2;
    }
    /* chain cuts: x_{b+1} <= x_b between the full batches of a layer */
    for (int32_t l = 0; l < p->n_layer && ok && p->chain_cuts; l++)
        for (int64_t b = B->begin[l]; b + 1 < B->begin[l + 1] && ok; b++) {
            if (B->size[b + 1] != B->size[b])
                continue;
            int c2[2] = {(int)b + 2, (int)b + 1};
            REAL v2[2] = {1.0, -1.0};
            ok &= add_constraintex(lp, 2, v2, c2, LE, 0.0);
            ++*n_rows;
        }
    /* linking cuts, with the chain cuts (which make each layer's full
     * batches a prefix in an optimal solution): no batch on the GPU without
     * y_l (x_first <= y_l, x_last <= y_l for the smaller last batch), and
     * with y_l the batch that completes C_l neurons (x_k >= y_l, k the
     * ceil(C_l / batch)-th), unless the smaller last batch could complete
     * them instead of it.  Together they make each layer's first k batches
     * one block in the LP relaxation, whose bound is then the layers'
     * concave envelope (hull_bound) instead of big K's much weaker one. */
    for (int32_t l = 0; l < p->n_layer && ok && p->chain_cuts; l++) {
        const int64_t b0 = B->begin[l], b1 = B->begin[l + 1];
        const int ycol = nb + 1 + l;
        int64_t nfull = 0;
        while (b0 + nfull < b1 && B->size[b0 + nfull] == p->batch)
            nfull++;
        const int64_t last = b1 - b0 > nfull ? B->size[b1 - 1] : 0;
        const int64_t off[2] = {b0, last > 0 && b1 - 1 != b0 ? b1 - 1 : -1};
        for (int j = 0; j < 2 && ok; j++) {
            if (off[j] < 0)
                continue;
            int c2[2] = {(int)off[j] + 1, ycol};
            REAL v2[2] = {1.0, -1.0};
            ok &= add_constraintex(lp, 2, v2, c2, LE, 0.0);
            ++*n_rows;
        }
        const int64_t k = (p->c_min[l] + p->batch - 1) / p->batch;
        if (p->c_min[l] <= p->n_ff && k >= 1 && k <= nfull &&
            (last == 0 || (k - 1) * p->batch + last < p->c_min[l]) && ok) {
            int c2[2] = {(int)(b0 + k - 1) + 1, ycol};
            REAL v2[2] = {1.0, -1.0};
            ok &= add_constraintex(lp, 2, v2, c2, GE, 0.0);
            ++*n_rows;
        }
    }
    set_add_rowmode(lp, FALSE);
    free(col);
    free(val);
    return ok ? SI_OK : SI_E_NOMEM;
}

/*
 * Start the simplex from the greedy placement: every row's slack basic,
 * every column at the bound the greedy placement gives it (x_b, and y_l = 1
 * for a layer with GPU batches).  That basis is valid (the slacks' columns
 * are the identity) and primal feasible (the greedy placement keeps every
 * row).  On the instances measured the LP relaxation's optimum is integral
 * and close to the greedy placement: from lp_solve's own start the dual
 * simplex made one bound flip per batch to get there (31,507 iterations,
 * 10 s of the 70B-shaped solve); from this one, a handful.  lp_solve's
 * IMPROVE_DUALFEAS (initial bound flips for dual feasibility) must be off
 * or it undoes the start.  Only a start: the optimum is lp_solve's.
 */
static void warm_start(lprec *lp, const struct si_ilp_problem *p, const struct batches *B,
                       const uint8_t *xg)
{
    const int ncol = get_Ncolumns(lp), nrow = get_Nrows(lp);
    int *basis = malloc(((size_t)ncol + (size_t)nrow + 1) * sizeof *basis);
    uint8_t *y = calloc((size_t)p->n_layer, 1);
    if (basis != NULL && y != NULL) {
        for (int64_t b = 0; b < B->n; b++)
            if (xg[b])
                y[B->layer[b]] = 1;
        basis[0] = 0;
        for (int i = 1; i <= nrow; i++)
            basis[i] = i; /* slack i basic */
        for (int j = 1; j <= ncol; j++) {
            const bool up = j <= B->n ? xg[j - 1] != 0 : y[j - 1 - B->n] != 0;
            basis[nrow + j] = up ? nrow + j : -(nrow + j); /* at upper / lower bound */
        }
        set_basis(lp, basis, TRUE);
    }
    free(basis);
    free(y);
}

int si_ilp_solve(const struct si_ilp_problem *p, struct si_ilp_result *r, char *err,
                 size_t err_size)
{
    memset(r, 0, sizeof *r);
    const double t0 = si__now();
    int rc = check_problem(p, err, err_size);
    if (rc != SI_OK)
        return rc;
    struct batches B;
    uint8_t *x = NULL, *xg = NULL;
    REAL *sol = NULL;
    lprec *lp = NULL;
    if ((rc = make_batches(p, &B)) != SI_OK || B.n > INT32_MAX / 2 ||
        (x = calloc((size_t)B.n, 1)) == NULL || (xg = calloc((size_t)B.n, 1)) == NULL ||
        greedy(p, &B, xg) != SI_OK) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "placement: out of memory");
        goto out;
    }
    r->bound = hull_bound(p, &B);
    if (!feasible(p, &B, xg)) {
        /* The greedy fills the GPU as far as it can: if the CPU still
         * cannot hold the rest, nothing can (up to C_l: the solver decides). */
        memset(xg, 0, (size_t)B.n);
    }
    double g = 0;
    for (int64_t b = 0; b < B.n; b++)
        g += xg[b] ? B.impact[b] : 0;
    r->greedy_objective = g;

    /* Trivial instances need no solver: nothing fits, or everything does. */
    int64_t smallest = INT64_MAX;
    bool all_ok = true;
    for (int64_t b = 0; b < B.n; b++)
        smallest = B.bytes[b] < smallest ? B.bytes[b] : smallest;
    for (int32_t l = 0; l < p->n_layer; l++)
        all_ok &= p->c_min[l] <= p->n_ff;
    if (p->capacity < smallest && p->cpu_capacity < 0) {
        r->outcome = SI_ILP_OPTIMAL; /* x all 0 */
    } else if (all_ok && total_bytes(&B) <= p->capacity) {
        memset(x, 1, (size_t)B.n);
        r->outcome = SI_ILP_OPTIMAL;
    } else {
        lp = make_lp(0, (int)B.n + p->n_layer);
        if (lp == NULL || build_lp(lp, p, &B, &r->n_rows) != SI_OK) {
            rc = si__errf(err, err_size, SI_E_NOMEM, "placement: out of memory for lp_solve");
            goto out;
        }
        set_verbose(lp, NEUTRAL);
        warm_start(lp, p, &B, xg);
        /* The limit covers the whole solve: lp_solve gets what the set-up
         * left of it, in whole seconds (its unit), at least one. */
        const double left = p->time_limit - (si__now() - t0);
        set_timeout(lp, left >= 1.0 ? (long)floor(left) : 1);
        set_mip_gap(lp, FALSE, p->mip_gap);
        set_mip_gap(lp, TRUE, 1e-11);
        set_bb_floorfirst(lp, BRANCH_CEILING);
        set_bb_rule(lp, NODE_FIRSTSELECT);
        set_scaling(lp, SCALE_GEOMETRIC + SCALE_DYNUPDATE);
        set_improve(lp, IMPROVE_THETAGAP); /* not IMPROVE_DUALFEAS: see warm_start */
        const int st = solve(lp);
        r->nodes = (int64_t)get_total_nodes(lp);
        sol = malloc(((size_t)B.n + (size_t)p->n_layer) * sizeof *sol);
        if (sol == NULL) {
            rc = si__errf(err, err_size, SI_E_NOMEM, "placement: out of memory");
            goto out;
        }
        bool have = false;
        if (st == OPTIMAL || st == PRESOLVED || st == SUBOPTIMAL) {
            if (get_variables(lp, sol)) {
                for (int64_t b = 0; b < B.n; b++)
                    x[b] = sol[b] > 0.5;
                have = feasible(p, &B, x);
            }
        }
        if (st == INFEASIBLE) {
            rc = si__errf(err, err_size, SI_E_BUDGET,
                          "placement: no placement keeps every constraint (the CPU capacity of "
                          "%" PRId64 " bytes cannot hold what the GPU's %" PRId64 " leave)",
                          p->cpu_capacity, p->capacity);
            goto out;
        }
        if (have && st == OPTIMAL) {
            r->outcome = SI_ILP_OPTIMAL;
        } else if (have) {
            r->outcome = SI_ILP_INCUMBENT;
        } else if (feasible(p, &B, xg)) {
            memcpy(x, xg, (size_t)B.n);
            r->outcome = SI_ILP_GREEDY;
        } else {
            rc = si__errf(err, err_size, SI_E_RUNTIME,
                          "placement: lp_solve stopped (status %d: %s) without a solution", st,
                          get_statustext(lp, st));
            goto out;
        }
        /* lp_solve's incumbent may be beaten by the greedy one when it is
         * stopped early: keep the better. */
        double v = 0;
        for (int64_t b = 0; b < B.n; b++)
            v += x[b] ? B.impact[b] : 0;
        if (r->outcome == SI_ILP_INCUMBENT && g > v && feasible(p, &B, xg)) {
            memcpy(x, xg, (size_t)B.n);
            r->outcome = SI_ILP_GREEDY;
        }
    }
    if ((rc = fill_result(p, &B, x, r)) != SI_OK) {
        rc = si__errf(err, err_size, rc, "placement: out of memory");
        goto out;
    }
    if (r->outcome == SI_ILP_OPTIMAL && r->n_rows > 0) {
        /* lp_solve proved the optimum within its gaps (relative mip_gap,
         * absolute 1e-11). */
        const double proven = r->objective * (1.0 + p->mip_gap) + 1e-11;
        r->bound = fmin(r->bound, proven);
    } else if (r->outcome == SI_ILP_OPTIMAL) {
        r->bound = r->objective;
    }
    r->bound = fmax(r->bound, r->objective);
    /* below 1e-9 the bound is lp_solve's absolute tolerance, not a gap */
    r->gap = r->bound > 1e-9 ? (r->bound - r->objective) / r->bound : 0;
    r->seconds = si__now() - t0;
out:
    if (lp != NULL)
        delete_lp(lp);
    free(sol);
    free(x);
    free(xg);
    batches_free(&B);
    return rc;
}
