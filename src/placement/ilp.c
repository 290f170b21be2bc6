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

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

/* Upper bound of the optimum: the fractional knapsack without (5) and the
 * CPU limit (dropping constraints only raises the optimum; batches enter
 * by impact per byte, the last one in part). */
static double bound_of(const struct si_ilp_problem *p, const struct batches *B, int64_t *idx)
{
    double *ratio = malloc((size_t)B->n * sizeof *ratio);
    if (ratio == NULL)
        return INFINITY;
    for (int64_t b = 0; b < B->n; b++)
        ratio[b] = p->c_min[B->layer[b]] > p->n_ff ? -1.0 : B->impact[b] / (double)B->bytes[b];
    int32_t *tmp = malloc((size_t)B->n * sizeof *tmp);
    double ub = 0;
    if (tmp == NULL) {
        free(ratio);
        return INFINITY;
    }
    for (int64_t b = 0; b < B->n; b++)
        tmp[b] = (int32_t)b;
    qsort_r(tmp, (size_t)B->n, sizeof *tmp, cmp_impact, ratio);
    double left = (double)p->capacity;
    for (int64_t k = 0; k < B->n; k++) {
        const int32_t b = tmp[k];
        idx[k] = b;
        if (ratio[b] < 0 || left <= 0)
            continue;
        const double take = (double)B->bytes[b] < left ? 1.0 : left / (double)B->bytes[b];
        ub += take * B->impact[b];
        left -= take * (double)B->bytes[b];
    }
    free(tmp);
    free(ratio);
    return ub;
}

/* The greedy choice into x (see ilp.h); idx: batches by impact per byte. */
static void greedy(const struct si_ilp_problem *p, const struct batches *B, const int64_t *idx,
                   uint8_t *x)
{
    int64_t *n_l = calloc((size_t)p->n_layer, sizeof *n_l);
    memset(x, 0, (size_t)B->n);
    if (n_l == NULL)
        return;
    int64_t left = p->capacity;
    /* Within a layer batches come in impact order here (equal sizes), so
     * each layer's choice is a prefix, as the chain cuts want. */
    for (int64_t k = 0; k < B->n; k++) {
        const int64_t b = idx[k];
        if (p->c_min[B->layer[b]] > p->n_ff || B->bytes[b] > left)
            continue;
        x[b] = 1;
        left -= B->bytes[b];
        n_l[B->layer[b]] += B->size[b];
    }
    bool freed = false;
    for (int32_t l = 0; l < p->n_layer; l++)
        if (n_l[l] > 0 && n_l[l] < p->c_min[l]) {
            for (int64_t b = B->begin[l]; b < B->begin[l + 1]; b++)
                if (x[b]) {
                    x[b] = 0;
                    left += B->bytes[b];
                }
            n_l[l] = -1; /* closed */
            freed = true;
        }
    for (int64_t k = 0; freed && k < B->n; k++) {
        const int64_t b = idx[k];
        const int32_t l = B->layer[b];
        if (x[b] || n_l[l] < p->c_min[l] || B->bytes[b] > left)
            continue;
        x[b] = 1;
        left -= B->bytes[b];
        n_l[l] += B->size[b];
    }
    free(n_l);
}

int si_ilp_greedy(const struct si_ilp_problem *p, struct si_ilp_result *r, char *err,
                  size_t err_size)
{
    memset(r, 0, sizeof *r);
    const double t0 = now();
    int rc = check_problem(p, err, err_size);
    if (rc != SI_OK)
        return rc;
    struct batches B;
    uint8_t *x = NULL;
    int64_t *idx = NULL;
    if ((rc = make_batches(p, &B)) != SI_OK || (x = malloc((size_t)B.n)) == NULL ||
        (idx = malloc((size_t)B.n * sizeof *idx)) == NULL) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "placement: out of memory");
        goto out;
    }
    r->bound = bound_of(p, &B, idx);
    greedy(p, &B, idx, x);
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
    r->seconds = now() - t0;
out:
    free(x);
    free(idx);
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
    set_add_rowmode(lp, FALSE);
    free(col);
    free(val);
    return ok ? SI_OK : SI_E_NOMEM;
}

int si_ilp_solve(const struct si_ilp_problem *p, struct si_ilp_result *r, char *err,
                 size_t err_size)
{
    memset(r, 0, sizeof *r);
    const double t0 = now();
    int rc = check_problem(p, err, err_size);
    if (rc != SI_OK)
        return rc;
    struct batches B;
    uint8_t *x = NULL, *xg = NULL;
    int64_t *idx = NULL;
    REAL *sol = NULL;
    lprec *lp = NULL;
    if ((rc = make_batches(p, &B)) != SI_OK || B.n > INT32_MAX / 2 ||
        (x = calloc((size_t)B.n, 1)) == NULL || (xg = calloc((size_t)B.n, 1)) == NULL ||
        (idx = malloc((size_t)B.n * sizeof *idx)) == NULL) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "placement: out of memory");
        goto out;
    }
    r->bound = bound_of(p, &B, idx);
    greedy(p, &B, idx, xg);
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
        set_timeout(lp, (long)ceil(p->time_limit));
        set_mip_gap(lp, FALSE, p->mip_gap);
        set_mip_gap(lp, TRUE, 1e-11);
        set_bb_floorfirst(lp, BRANCH_CEILING);
        set_bb_rule(lp, NODE_FIRSTSELECT);
        set_scaling(lp, SCALE_GEOMETRIC + SCALE_DYNUPDATE);
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
    r->seconds = now() - t0;
out:
    if (lp != NULL)
        delete_lp(lp);
    free(sol);
    free(x);
    free(xg);
    free(idx);
    batches_free(&B);
    return rc;
}
