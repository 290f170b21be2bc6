/* placement.c - placing neurons and the gpuidx files (placement.h). */
#include "placement/placement.h"

#include "internal.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "model/types.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARCH "generic.gpu_index"
#define KEY_VRAM "split.vram_capacity"
#define KP "starinfer.placement."

const char *si_place_policy_name(enum si_place_policy p)
{
    static const char *const names[] = {"ilp", "hottest", "random"};
    return (unsigned)p < SI_PLACE_POLICY_COUNT ? names[p] : "?";
}

int si_place_policy_parse(const char *name)
{
    for (int p = 0; p < SI_PLACE_POLICY_COUNT; p++)
        if (!strcmp(name, si_place_policy_name((enum si_place_policy)p)))
            return p;
    return -1;
}

int si_placement_init(struct si_placement **out, int32_t n_layer, int32_t n_ff, char *err,
                      size_t err_size)
{
    *out = NULL;
    if (n_layer < 1 || n_ff < 1)
        return si__errf(err, err_size, SI_E_INVALID,
                        "placement of %" PRId32 " layers x %" PRId32 " neurons: both must be >= 1",
                        n_layer, n_ff);
    struct si_placement *p = calloc(1, sizeof *p);
    if (p != NULL) {
        p->gpu = calloc((size_t)n_layer * (size_t)n_ff, 1);
        p->n_gpu = calloc((size_t)n_layer, sizeof *p->n_gpu);
    }
    if (p == NULL || p->gpu == NULL || p->n_gpu == NULL) {
        si_placement_free(p);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for a placement");
    }
    p->n_layer = n_layer;
    p->n_ff = n_ff;
    *out = p;
    return SI_OK;
}

void si_placement_free(struct si_placement *p)
{
    if (p == NULL)
        return;
    free(p->gpu);
    free(p->n_gpu);
    free(p->c_min);
    free(p);
}

int64_t si_placement_gpu_neurons(const struct si_placement *p)
{
    int64_t n = 0;
    for (int32_t l = 0; l < p->n_layer; l++)
        n += p->n_gpu[l];
    return n;
}

struct si_place_params si_place_default_params(void)
{
    struct si_ilp_problem d = si_ilp_default_problem();
    struct si_place_params pp = {.policy = SI_PLACE_ILP,
                                 .sparsity = "",
                                 .batch = d.batch,
                                 .time_limit = d.time_limit,
                                 .mip_gap = d.mip_gap,
                                 .chain_cuts = d.chain_cuts,
                                 .cpu_capacity = -1,
                                 .seed = 1};
    si_hwmodel_defaults(&pp.hw, 0);
    return pp;
}

/* The neuron ids of all layers as (layer, id) pairs in the policy's order. */
struct lid {
    double key;
    int32_t l, i;
};

static int cmp_lid(const void *pa, const void *pb)
{
    const struct lid *a = pa, *b = pb;
    if (a->key != b->key)
        return a->key > b->key ? -1 : 1;
    if (a->l != b->l)
        return a->l < b->l ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* hottest / random: neurons in order while their bytes fit. */
static int place_simple(struct si_placement *P, const double *impact, int64_t capacity,
                        int64_t unit, enum si_place_policy policy, uint64_t seed)
{
    const size_t n = (size_t)P->n_layer * (size_t)P->n_ff;
    struct lid *v = malloc(n * sizeof *v);
    if (v == NULL)
        return SI_E_NOMEM;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t k = 0; k < n; k++) {
        double key = impact[k];
        if (policy == SI_PLACE_RANDOM) { /* xorshift64* */
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            key = (double)((s * 2685821657736338717ull) >> 11);
        }
        v[k] = (struct lid){key, (int32_t)(k / (size_t)P->n_ff), (int32_t)(k % (size_t)P->n_ff)};
    }
    qsort(v, n, sizeof *v, cmp_lid);
    int64_t left = capacity;
    P->objective = 0;
    for (size_t k = 0; k < n && left >= unit; k++, left -= unit) {
        P->gpu[(size_t)v[k].l * (size_t)P->n_ff + (size_t)v[k].i] = 1;
        P->n_gpu[v[k].l]++;
        P->objective += impact[(size_t)v[k].l * (size_t)P->n_ff + (size_t)v[k].i];
    }
    free(v);
    return SI_OK;
}

int si_place(struct si_placement **out, const struct si_profile *prof,
             const struct si_place_params *pp, char *err, size_t err_size)
{
    *out = NULL;
    if ((unsigned)pp->policy >= SI_PLACE_POLICY_COUNT)
        return si__errf(err, err_size, SI_E_INVALID, "unknown placement policy %d",
                        (int)pp->policy);
    if (pp->vram_budget < 0)
        return si__errf(err, err_size, SI_E_INVALID, "negative VRAM budget %" PRId64,
                        pp->vram_budget);
    if (!pp->reserve.any_neurons || pp->reserve.unit_neurons != 1 || pp->reserve.unit_bytes < 1)
        return si__errf(err, err_size, SI_E_INVALID,
                        "a placement is made for the gate or predictor sparsity modes (dense "
                        "mode moves whole chunks of neurons)");
    if (pp->vram_budget > 0 && pp->vram_budget < pp->reserve.total)
        return si__errf(err, err_size, SI_E_BUDGET,
                        "VRAM budget of %" PRId64 " bytes is below the %" PRId64
                        " bytes the engine puts on the GPU besides FFN neurons",
                        pp->vram_budget, pp->reserve.total);
    struct si_placement *P = NULL;
    int rc = si_placement_init(&P, prof->n_layer, prof->n_ff, err, err_size);
    if (rc != SI_OK)
        return rc;
    const size_t n = (size_t)prof->n_layer * (size_t)prof->n_ff;
    double *impact = malloc(n * sizeof *impact);
    int64_t *bytes = malloc((size_t)prof->n_layer * sizeof *bytes);
    P->c_min = malloc((size_t)prof->n_layer * sizeof *P->c_min);
    if (impact == NULL || bytes == NULL || P->c_min == NULL) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "out of memory for the placement");
        goto out;
    }
    /* impact: activation frequency (a profile of no tokens: all 0) */
    for (size_t k = 0; k < n; k++)
        impact[k] = prof->n_tokens > 0 ? (double)prof->counts[k] / (double)prof->n_tokens : 0.0;
    const int64_t unit = pp->reserve.unit_bytes;
    for (int32_t l = 0; l < prof->n_layer; l++) {
        bytes[l] = unit;
        P->c_min[l] = si_hwmodel_c_min(&pp->hw, unit);
    }
    const int64_t capacity = pp->vram_budget > 0 ? pp->vram_budget - pp->reserve.total : 0;
    P->has_meta = true;
    P->vram_capacity = (uint64_t)pp->vram_budget;
    snprintf(P->policy, sizeof P->policy, "%s", si_place_policy_name(pp->policy));
    snprintf(P->sparsity, sizeof P->sparsity, "%s", pp->sparsity != NULL ? pp->sparsity : "");
    P->reserve_bytes = pp->reserve.total;
    P->neuron_bytes = unit;
    P->batch = pp->batch;
    P->hw = pp->hw;
    if (pp->policy == SI_PLACE_ILP) {
        struct si_ilp_problem ip = si_ilp_default_problem();
        ip.n_layer = prof->n_layer;
        ip.n_ff = prof->n_ff;
        ip.impact = impact;
        ip.neuron_bytes = bytes;
        ip.c_min = P->c_min;
        ip.capacity = capacity;
        ip.cpu_capacity = pp->cpu_capacity;
        ip.batch = pp->batch;
        ip.time_limit = pp->time_limit;
        ip.mip_gap = pp->mip_gap;
        ip.chain_cuts = pp->chain_cuts;
        struct si_ilp_result r;
        if ((rc = si_ilp_solve(&ip, &r, err, err_size)) != SI_OK)
            goto out;
        memcpy(P->gpu, r.gpu, n);
        memcpy(P->n_gpu, r.n_gpu, (size_t)prof->n_layer * sizeof *P->n_gpu);
        P->objective = r.objective;
        P->bound = r.bound;
        P->gap = r.gap;
        P->solve_seconds = r.seconds;
        snprintf(P->outcome, sizeof P->outcome, "%s", si_ilp_outcome_name(r.outcome));
        si_ilp_result_free(&r);
    } else {
        if ((rc = place_simple(P, impact, capacity, unit, pp->policy, pp->seed)) != SI_OK) {
            rc = si__errf(err, err_size, rc, "out of memory for the placement");
            goto out;
        }
        if (pp->cpu_capacity >= 0 &&
            ((int64_t)n - si_placement_gpu_neurons(P)) * unit > pp->cpu_capacity) {
            rc = si__errf(err, err_size, SI_E_BUDGET,
                          "the CPU capacity (%" PRId64 " bytes) cannot hold the neurons the GPU "
                          "leaves to it", pp->cpu_capacity);
            goto out;
        }
        P->bound = NAN;
        P->gap = NAN;
        snprintf(P->outcome, sizeof P->outcome, "%s order", si_place_policy_name(pp->policy));
    }
out:
    free(impact);
    free(bytes);
    if (rc != SI_OK)
        si_placement_free(P);
    else
        *out = P;
    return rc;
}

/* ------------------------------------------------------------ files */

static int w_f64(struct si_gguf_writer *w, const char *key, double v)
{
    return si_gguf_writer_set_f64(w, key, v);
}

int si_placement_write(const struct si_placement *p, const char *path, char *err,
                       size_t err_size)
{
    const size_t n = (size_t)p->n_layer * (size_t)p->n_ff;
    int32_t *idx = malloc(n * sizeof *idx), *bucket = malloc(n * sizeof *bucket);
    struct si_gguf_writer *w = si_gguf_writer_init(true); /* PWRI, as PowerInfer's */
    int rc = SI_OK;
    if (idx == NULL || bucket == NULL || w == NULL) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "%s: out of memory", path);
        goto out;
    }
    rc |= si_gguf_writer_set_str(w, "general.architecture", ARCH);
    rc |= si_gguf_writer_set_u64(w, KEY_VRAM, p->vram_capacity);
    if (p->has_meta) {
        char key[96];
        rc |= si_gguf_writer_set_str(w, KP "policy", p->policy);
        rc |= si_gguf_writer_set_str(w, KP "sparsity", p->sparsity);
        rc |= si_gguf_writer_set_str(w, KP "outcome", p->outcome);
        rc |= w_f64(w, KP "objective", p->objective);
        rc |= w_f64(w, KP "bound", p->bound);
        rc |= w_f64(w, KP "gap", p->gap);
        rc |= w_f64(w, KP "solve_seconds", p->solve_seconds);
        rc |= si_gguf_writer_set_u64(w, KP "reserve_bytes", (uint64_t)p->reserve_bytes);
        rc |= si_gguf_writer_set_u64(w, KP "neuron_bytes", (uint64_t)p->neuron_bytes);
        rc |= si_gguf_writer_set_u32(w, KP "batch", (uint32_t)p->batch);
        if (p->c_min != NULL)
            rc |= si_gguf_writer_set_arr(w, KP "c_min", SI_GGUF_INT64, p->c_min,
                                         (uint64_t)p->n_layer);
        for (int f = 0; f < SI_HW_FIELD_COUNT; f++) {
            snprintf(key, sizeof key, KP "hw.%s", si_hw_field_name((enum si_hw_field)f));
            rc |= w_f64(w, key, p->hw.value[f]);
            snprintf(key, sizeof key, KP "hw.%s.source", si_hw_field_name((enum si_hw_field)f));
            rc |= si_gguf_writer_set_str(w, key, si_hw_source_name(p->hw.source[f]));
        }
        rc |= si_gguf_writer_set_u32(w, KP "hw.threads", (uint32_t)p->hw.threads);
        rc |= si_gguf_writer_set_str(w, KP "hw.gpu", p->hw.gpu_name);
    }
    if (rc != SI_OK) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "%s: out of memory for the metadata", path);
        goto out;
    }
    int32_t *b = bucket;
    for (int32_t l = 0; l < p->n_layer && rc == SI_OK; l++) {
        char name[64];
        const uint8_t *g = p->gpu + (size_t)l * (size_t)p->n_ff;
        int32_t *row = idx + (size_t)l * (size_t)p->n_ff, *b0 = b;
        for (int32_t i = 0; i < p->n_ff; i++) {
            row[i] = g[i] ? 1 : 0;
            if (g[i])
                *b++ = i;
        }
        int64_t ne[1] = {p->n_ff};
        snprintf(name, sizeof name, "blk.%" PRId32 ".gpu_idx", l);
        rc = si_gguf_writer_add_tensor(w, name, SI_TYPE_I32, 1, ne, row);
        ne[0] = b - b0;
        snprintf(name, sizeof name, "blk.%" PRId32 ".gpu_bucket", l);
        if (rc == SI_OK)
            rc = si_gguf_writer_add_tensor(w, name, SI_TYPE_I32, 1, ne, b0);
        if (rc != SI_OK)
            rc = si__errf(err, err_size, rc, "%s: tensor %s: %s", path, name, si_status_str(rc));
    }
    if (rc == SI_OK)
        rc = si_gguf_writer_write(w, path, err, err_size);
out:
    si_gguf_writer_free(w);
    free(idx);
    free(bucket);
    return rc;
}

/* The I32 tensor `name` with one dimension, or NULL after a message. */
static const struct si_gguf_tensor *tensor_1d(const struct si_gguf *g, const char *path,
                                              const char *name, int *rc, char *err,
                                              size_t err_size)
{
    int64_t ti = si_gguf_find_tensor(g, name);
    if (ti < 0) {
        *rc = si__errf(err, err_size, SI_E_FORMAT, "%s: missing tensor %s", path, name);
        return NULL;
    }
    const struct si_gguf_tensor *t = &g->tensors[ti];
    if (t->type != SI_TYPE_I32 || t->n_dims != 1) {
        *rc = si__errf(err, err_size, SI_E_FORMAT,
                       "%s: tensor %s is %s with %" PRIu32 " dimensions, expected I32 with 1", path,
                       name, si_type_name(t->type), t->n_dims);
        return NULL;
    }
    return t;
}

static int32_t i32_at(const struct si_gguf_tensor *t, int64_t i)
{
    int32_t v;
    memcpy(&v, (const char *)t->data + 4 * (size_t)i, 4);
    return v;
}

/* Optional f64 / u64 / string keys of the metadata. */
static void get_f64(const struct si_gguf *g, const char *key, double *v)
{
    if (si_gguf_get_f64(g, key, v) != SI_OK)
        *v = NAN;
}

static void get_str(const struct si_gguf *g, const char *key, char *buf, size_t size)
{
    struct si_gguf_str s;
    buf[0] = '\0';
    if (si_gguf_get_str(g, key, &s) == SI_OK)
        snprintf(buf, size, "%.*s", (int)(s.len < size ? s.len : size - 1), s.data);
}

static void read_meta(const struct si_gguf *g, struct si_placement *p)
{
    char key[96], src[16];
    get_str(g, KP "policy", p->policy, sizeof p->policy);
    get_str(g, KP "sparsity", p->sparsity, sizeof p->sparsity);
    get_str(g, KP "outcome", p->outcome, sizeof p->outcome);
    get_f64(g, KP "objective", &p->objective);
    get_f64(g, KP "bound", &p->bound);
    get_f64(g, KP "gap", &p->gap);
    get_f64(g, KP "solve_seconds", &p->solve_seconds);
    uint64_t u = 0;
    uint32_t u32 = 0;
    p->reserve_bytes = si_gguf_get_u64(g, KP "reserve_bytes", &u) == SI_OK && u <= INT64_MAX
                           ? (int64_t)u : -1;
    p->neuron_bytes = si_gguf_get_u64(g, KP "neuron_bytes", &u) == SI_OK && u <= INT64_MAX
                          ? (int64_t)u : -1;
    p->batch = si_gguf_get_u32(g, KP "batch", &u32) == SI_OK && u32 <= INT32_MAX ? (int32_t)u32
                                                                                 : 0;
    si_hwmodel_defaults(&p->hw, 0);
    for (int f = 0; f < SI_HW_FIELD_COUNT; f++) {
        snprintf(key, sizeof key, KP "hw.%s", si_hw_field_name((enum si_hw_field)f));
        get_f64(g, key, &p->hw.value[f]);
        snprintf(key, sizeof key, KP "hw.%s.source", si_hw_field_name((enum si_hw_field)f));
        get_str(g, key, src, sizeof src);
        for (int s = 0; s < SI_HW_SOURCE_COUNT; s++)
            if (!strcmp(src, si_hw_source_name((enum si_hw_source)s)))
                p->hw.source[f] = (enum si_hw_source)s;
    }
    if (si_gguf_get_u32(g, KP "hw.threads", &u32) == SI_OK && u32 <= INT32_MAX)
        p->hw.threads = (int32_t)u32;
    get_str(g, KP "hw.gpu", p->hw.gpu_name, sizeof p->hw.gpu_name);
    int64_t ki = si_gguf_find_key(g, KP "c_min");
    if (ki >= 0 && g->kv[ki].type == SI_GGUF_ARRAY && g->kv[ki].arr_n == (uint64_t)p->n_layer &&
        (p->c_min = malloc((size_t)p->n_layer * sizeof *p->c_min)) != NULL) {
        for (int32_t l = 0; l < p->n_layer; l++) {
            struct si_gguf_kv e;
            if (si_gguf_arr_elem(&g->kv[ki], (uint64_t)l, &e) != SI_OK ||
                si_gguf_kv_i64(&e, &p->c_min[l]) != SI_OK)
                p->c_min[l] = -1;
        }
    }
}

int si_placement_read(struct si_placement **out, const char *path, const struct si_model *m,
                      char *err, size_t err_size)
{
    *out = NULL;
    struct si_gguf *g = NULL;
    struct si_placement *p = NULL;
    int rc = si_gguf_open(&g, path, err, err_size);
    if (rc != SI_OK)
        return rc;
    struct si_gguf_str arch;
    if (si_gguf_get_str(g, "general.architecture", &arch) != SI_OK ||
        !si_gguf_str_eq(arch, ARCH)) {
        rc = si__errf(err, err_size, SI_E_FORMAT,
                      "%s: not a GPU index file (general.architecture is not \"" ARCH "\")", path);
        goto out;
    }
    uint64_t vram = 0;
    rc = si_gguf_get_u64(g, KEY_VRAM, &vram);
    if (rc != SI_OK) {
        rc = si__errf(err, err_size, SI_E_FORMAT, "%s: %s " KEY_VRAM " (an unsigned integer)",
                      path, rc == SI_E_NOT_FOUND ? "missing key" : "malformed key");
        goto out;
    }
    /* layers: blk.0.gpu_idx, blk.1.gpu_idx, ... until one is missing */
    int32_t n_layer = 0;
    int64_t n_ff = -1;
    char name[64];
    for (;; n_layer++) {
        snprintf(name, sizeof name, "blk.%" PRId32 ".gpu_idx", n_layer);
        int64_t ti = si_gguf_find_tensor(g, name);
        if (ti < 0)
            break;
        if (n_ff < 0)
            n_ff = g->tensors[ti].ne[0];
        if (n_layer == INT32_MAX - 1)
            break;
    }
    if (n_layer == 0) {
        rc = si__errf(err, err_size, SI_E_FORMAT, "%s: missing tensor blk.0.gpu_idx", path);
        goto out;
    }
    for (uint64_t t = 0; t < g->n_tensors; t++) {
        /* a gpu_idx past the first gap would be silently dropped: refuse */
        const struct si_gguf_str nm = g->tensors[t].name;
        long long l = -1;
        char tail[16] = "";
        char buf[80];
        snprintf(buf, sizeof buf, "%.*s", (int)(nm.len < 79 ? nm.len : 79), nm.data);
        if (sscanf(buf, "blk.%lld.%15s", &l, tail) == 2 &&
            (!strcmp(tail, "gpu_idx") || !strcmp(tail, "gpu_bucket")) && (l < 0 || l >= n_layer)) {
            rc = si__errf(err, err_size, SI_E_FORMAT,
                          "%s: tensor %s, but the layers' gpu_idx stop at %" PRId32, path, buf,
                          n_layer);
            goto out;
        }
    }
    if (n_ff < 1 || n_ff > INT32_MAX) {
        rc = si__errf(err, err_size, SI_E_FORMAT, "%s: blk.0.gpu_idx has %" PRId64 " elements",
                      path, n_ff);
        goto out;
    }
    if (m != NULL && (n_layer != m->hp.n_layer || n_ff != m->hp.n_ff)) {
        rc = si__errf(err, err_size, SI_E_INVALID,
                      "%s: placement of %" PRId32 " layers x %" PRId64
                      " neurons, but the model has %" PRId32 " x %" PRId32,
                      path, n_layer, n_ff, m->hp.n_layer, m->hp.n_ff);
        goto out;
    }
    if ((rc = si_placement_init(&p, n_layer, (int32_t)n_ff, err, err_size)) != SI_OK)
        goto out;
    p->vram_capacity = vram;
    for (int32_t l = 0; l < n_layer; l++) {
        snprintf(name, sizeof name, "blk.%" PRId32 ".gpu_idx", l);
        const struct si_gguf_tensor *t = tensor_1d(g, path, name, &rc, err, err_size);
        if (t == NULL)
            goto out;
        if (t->ne[0] != n_ff) {
            rc = si__errf(err, err_size, SI_E_FORMAT,
                          "%s: tensor %s has %" PRId64 " elements, blk.0.gpu_idx %" PRId64, path,
                          name, t->ne[0], n_ff);
            goto out;
        }
        uint8_t *gl = p->gpu + (size_t)l * (size_t)n_ff;
        for (int64_t i = 0; i < n_ff; i++) {
            const int32_t v = i32_at(t, i);
            if (v != 0 && v != 1) {
                rc = si__errf(err, err_size, SI_E_FORMAT,
                              "%s: tensor %s: value %" PRId32 " at %" PRId64 " is not 0 or 1",
                              path, name, v, i);
                goto out;
            }
            gl[i] = (uint8_t)v;
            p->n_gpu[l] += v;
        }
        snprintf(name, sizeof name, "blk.%" PRId32 ".gpu_bucket", l);
        if (si_gguf_find_tensor(g, name) < 0)
            continue; /* optional: gpu_idx says it all */
        if ((t = tensor_1d(g, path, name, &rc, err, err_size)) == NULL)
            goto out;
        if (t->ne[0] != p->n_gpu[l]) {
            rc = si__errf(err, err_size, SI_E_FORMAT,
                          "%s: tensor %s lists %" PRId64 " neurons, gpu_idx marks %" PRId64, path,
                          name, t->ne[0], p->n_gpu[l]);
            goto out;
        }
        for (int64_t k = 0; k < t->ne[0]; k++) {
            const int32_t id = i32_at(t, k);
            if (id < 0 || id >= n_ff || !gl[id] || (k > 0 && id <= i32_at(t, k - 1))) {
                rc = si__errf(err, err_size, SI_E_FORMAT,
                              "%s: tensor %s: entry %" PRId64 " (%" PRId32
                              ") is not an increasing id that gpu_idx marks",
                              path, name, k, id);
                goto out;
            }
        }
    }
    p->has_meta = si_gguf_find_key(g, KP "policy") >= 0;
    if (p->has_meta)
        read_meta(g, p);
    rc = SI_OK;
out:
    si_gguf_free(g);
    if (rc != SI_OK)
        si_placement_free(p);
    else
        *out = p;
    return rc;
}
