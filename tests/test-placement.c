/*
 * test-placement.c - neuron placement (src/placement/): the ILP against
 * exhaustive search on random small instances, with and without the chain
 * cuts, including instances where C_l binds; the greedy placement feasible
 * and never better; si_place with budget 0 (all CPU), a budget above the
 * model (all GPU), a budget below the engine's reserve and a negative one
 * (refused); C_l from the hardware model; the gpuidx round trip, a
 * PowerInfer-style file written independently, and corrupt files refused;
 * the engine (hot_on_cpu) putting exactly the placed neurons in the hot
 * slice, its accounting of GPU bytes equal to the reserve plus the hot
 * neurons and within the budget, and its refusals.
 */
#include "graph/engine.h"
#include "graph/runtime.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/types.h"
#include "placement/hwmodel.h"
#include "placement/ilp.h"
#include "placement/placement.h"
#include "predict/profile.h"
#include "starinfer.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/si-test-placement-XXXXXX";

static void path_in(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", dir, name);
}

static uint64_t rng = 12345;
static uint64_t next(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}
static int64_t below(int64_t n)
{
    return (int64_t)(next() % (uint64_t)n);
}

/* Does r keep every constraint of p? */
static bool result_feasible(const struct si_ilp_problem *p, const struct si_ilp_result *r)
{
    int64_t bytes = 0;
    for (int32_t l = 0; l < p->n_layer; l++) {
        int64_t n = 0;
        for (int32_t i = 0; i < p->n_ff; i++)
            n += r->gpu[(size_t)l * p->n_ff + i];
        if (n != r->n_gpu[l] || (n > 0 && n < p->c_min[l]))
            return false;
        bytes += n * p->neuron_bytes[l];
    }
    return bytes == r->gpu_bytes && bytes <= p->capacity &&
           (p->cpu_capacity < 0 ||
            (int64_t)p->n_layer * p->n_ff * p->neuron_bytes[0] - bytes <= p->cpu_capacity);
}

static void test_ilp_vs_exhaustive(void)
{
    int binding = 0, cpu_limited = 0, runs = 0;
    char err[256];
    for (int it = 0; it < 120; it++) {
        const int32_t n_layer = 1 + (int32_t)below(4);
        const int32_t batch = 2 + (int32_t)below(4);
        /* at most 18 batches: 2^18 assignments to try */
        const int32_t per_layer = 1 + (int32_t)below(18 / n_layer);
        const int32_t n_ff = per_layer * batch - (int32_t)below(batch); /* a smaller last batch */
        double *impact = malloc((size_t)n_layer * n_ff * sizeof *impact);
        int64_t bytes[4], cmin[4];
        for (int32_t k = 0; k < n_layer * n_ff; k++) /* ties on purpose: few distinct values */
            impact[k] = (double)below(it % 3 == 0 ? 4 : 1000) / 100.0;
        int64_t total = 0;
        const int64_t nb = 1 + below(5); /* one size for every layer, as the engine's */
        for (int32_t l = 0; l < n_layer; l++) {
            bytes[l] = nb;
            /* sometimes beyond one batch (binds), sometimes beyond n_ff (layer off) */
            cmin[l] = 1 + below(it % 4 == 0 ? n_ff + 2 : 2 * batch + 1);
            total += bytes[l] * n_ff;
        }
        struct si_ilp_problem p = si_ilp_default_problem();
        p.n_layer = n_layer;
        p.n_ff = n_ff;
        p.impact = impact;
        p.neuron_bytes = bytes;
        p.c_min = cmin;
        p.batch = batch;
        p.capacity = below(total + 2);
        p.mip_gap = 0; /* exact, to compare with the exhaustive optimum */
        p.time_limit = 5;
        if (it % 5 == 1) {
            p.cpu_capacity = total - p.capacity + below(total / 2 + 1);
            cpu_limited++;
        }
        struct si_ilp_result ex, ex1, r1, r2, g;
        int rce = si_ilp_exhaustive(&p, &ex, err, sizeof err);
        if (rce == SI_E_BUDGET) { /* the CPU limit made it infeasible: the solver agrees */
            int rc = si_ilp_solve(&p, &r1, err, sizeof err);
            CHECK(rc == SI_E_BUDGET, "instance %d: infeasible, the ILP says %d (%s)", it, rc, err);
            if (rc == SI_OK)
                si_ilp_result_free(&r1);
            free(impact);
            continue;
        }
        CHECK(rce == SI_OK, "instance %d: exhaustive: %s", it, err);
        int rc1 = si_ilp_solve(&p, &r1, err, sizeof err);
        CHECK(rc1 == SI_OK, "instance %d: ILP: %s", it, err);
        p.chain_cuts = false;
        int rc2 = si_ilp_solve(&p, &r2, err, sizeof err);
        CHECK(rc2 == SI_OK, "instance %d: ILP without cuts: %s", it, err);
        p.chain_cuts = true;
        int rcg = si_ilp_greedy(&p, &g, err, sizeof err);
        if (rce == SI_OK && rc1 == SI_OK && rc2 == SI_OK) {
            runs++;
            const double tol = 1e-9 * (1 + ex.objective);
            CHECK(fabs(r1.objective - ex.objective) <= tol,
                  "instance %d (%d x %d, batch %d, capacity %lld): ILP %.6f, exhaustive %.6f", it,
                  n_layer, n_ff, batch, (long long)p.capacity, r1.objective, ex.objective);
            CHECK(fabs(r2.objective - ex.objective) <= tol,
                  "instance %d: ILP without cuts %.6f, exhaustive %.6f", it, r2.objective,
                  ex.objective);
            CHECK(r1.outcome == SI_ILP_OPTIMAL, "instance %d: outcome %s", it,
                  si_ilp_outcome_name(r1.outcome));
            CHECK(result_feasible(&p, &r1), "instance %d: the ILP's placement breaks a constraint",
                  it);
            CHECK(r1.bound >= r1.objective - 1e-12 && r1.gap >= 0 && r1.gap <= 1e-6,
                  "instance %d: bound %g, gap %g", it, r1.bound, r1.gap);
            CHECK(rcg != SI_OK || g.bound >= ex.objective - tol,
                  "instance %d: the envelope bound %.6f is below the optimum %.6f", it, g.bound,
                  ex.objective);
            if (rcg == SI_OK) {
                CHECK(result_feasible(&p, &g), "instance %d: the greedy placement is infeasible",
                      it);
                CHECK(g.objective <= ex.objective + tol, "instance %d: greedy %.6f > optimum %.6f",
                      it, g.objective, ex.objective);
            }
            /* Does C_l bind?  The optimum with every C_l = 1 is higher. */
            int64_t ones[4] = {1, 1, 1, 1};
            struct si_ilp_problem q = p;
            q.c_min = ones;
            if (si_ilp_exhaustive(&q, &ex1, err, sizeof err) == SI_OK) {
                binding += ex1.objective > ex.objective + tol;
                si_ilp_result_free(&ex1);
            }
        }
        if (rce == SI_OK)
            si_ilp_result_free(&ex);
        if (rc1 == SI_OK)
            si_ilp_result_free(&r1);
        if (rc2 == SI_OK)
            si_ilp_result_free(&r2);
        if (rcg == SI_OK)
            si_ilp_result_free(&g);
        free(impact);
    }
    printf("ILP = exhaustive on %d instances (%d where C_l binds, %d with a CPU limit)\n", runs,
           binding, cpu_limited);
    CHECK(runs >= 80, "only %d instances compared", runs);
    CHECK(binding >= 10, "C_l bound in only %d instances", binding);
}

static void test_ilp_refusals(void)
{
    char err[256] = "";
    double v[4] = {1, 2, 3, 4};
    int64_t b[1] = {10}, c[1] = {1};
    struct si_ilp_problem p = si_ilp_default_problem();
    p.n_layer = 1;
    p.n_ff = 4;
    p.impact = v;
    p.neuron_bytes = b;
    p.c_min = c;
    p.capacity = -1;
    struct si_ilp_result r;
    CHECK(si_ilp_solve(&p, &r, err, sizeof err) == SI_E_INVALID && strstr(err, "negative"),
          "negative capacity: %s", err);
    p.capacity = 20;
    v[2] = NAN;
    CHECK(si_ilp_solve(&p, &r, err, sizeof err) == SI_E_INVALID && strstr(err, "impact"),
          "NaN impact: %s", err);
    v[2] = 3;
    p.time_limit = 0;
    CHECK(si_ilp_solve(&p, &r, err, sizeof err) == SI_E_INVALID, "zero time limit: %s", err);
    p.time_limit = 1;
    p.batch = 1;
    CHECK(si_ilp_solve(&p, &r, err, sizeof err) == SI_OK, "tiny: %s", err);
    CHECK(r.n_gpu[0] == 2 && r.gpu[3] && r.gpu[2] && fabs(r.objective - 7) < 1e-9,
          "tiny: %lld on the GPU, objective %g", (long long)r.n_gpu[0], r.objective);
    si_ilp_result_free(&r);
}

static void test_hwmodel(void)
{
    struct si_hwmodel hw;
    si_hwmodel_defaults(&hw, 4096);
    hw.value[SI_HW_CPU_BW] = 50e9;
    hw.value[SI_HW_GPU_BW] = 1000e9;
    hw.value[SI_HW_T_SYNC] = 30e-6;
    /* 13824-byte neurons: T_CPU 276.48 ns, T_GPU 13.824 ns, 30 us / 262.656 ns = 114.2 */
    CHECK(si_hwmodel_c_min(&hw, 13824) == 115, "C_l %lld, expected 115",
          (long long)si_hwmodel_c_min(&hw, 13824));
    hw.value[SI_HW_T_SYNC] = 1e-12;
    CHECK(si_hwmodel_c_min(&hw, 13824) == 1, "C_l with no sync cost");
    hw.value[SI_HW_GPU_BW] = 40e9; /* the GPU slower than the CPU: never worth it */
    CHECK(si_hwmodel_c_min(&hw, 13824) == INT64_MAX, "C_l with a slow GPU");
    const double bw = si_hwmodel_probe_cpu(2, (size_t)8 << 20, 0.02);
    CHECK(bw > 1e8 && bw < 1e13, "CPU probe: %g bytes/s", bw);
    char note[128], err[128];
    si_hwmodel_defaults(&hw, 64);
    hw.value[SI_HW_CPU_BW] = 7e9;
    hw.source[SI_HW_CPU_BW] = SI_HW_GIVEN;
    CHECK(si_hwmodel_measure(&hw, 1, 64, note, sizeof note, err, sizeof err) == SI_OK, "%s", err);
    CHECK(hw.value[SI_HW_CPU_BW] == 7e9 && hw.source[SI_HW_CPU_BW] == SI_HW_GIVEN,
          "a given value is kept");
    CHECK(hw.value[SI_HW_T_SYNC] > 0 && hw.source[SI_HW_T_SYNC] != SI_HW_GIVEN, "T_sync %g",
          hw.value[SI_HW_T_SYNC]);
    CHECK(si_hwmodel_measure(&hw, 0, 64, note, sizeof note, err, sizeof err) == SI_E_INVALID,
          "0 threads");
}

static bool same_placement(const struct si_placement *a, const struct si_placement *b)
{
    return a->n_layer == b->n_layer && a->n_ff == b->n_ff &&
           !memcmp(a->gpu, b->gpu, (size_t)a->n_layer * a->n_ff) &&
           !memcmp(a->n_gpu, b->n_gpu, (size_t)a->n_layer * sizeof *a->n_gpu) &&
           a->vram_capacity == b->vram_capacity;
}

/* Read `path`, expecting `want` and `needle` in a one-line message. */
static void expect_read(const char *path, const struct si_model *m, int want, const char *needle)
{
    char err[512] = "";
    struct si_placement *p = NULL;
    int rc = si_placement_read(&p, path, m, err, sizeof err);
    CHECK(rc == want, "read %s: status %d (%s), expected %d", path, rc, err, want);
    CHECK(p == NULL, "read %s: a placement despite the error", path);
    CHECK(strstr(err, needle) != NULL, "read %s: message '%s' lacks '%s'", path, err, needle);
    CHECK(strchr(err, '\n') == NULL, "read %s: message on more than one line", path);
    printf("refused as expected: %s\n", err);
    si_placement_free(p);
}

/* C_GGUF: not corrupt, starinfer's files before 2026-11-28 (magic GGUF, I32
 * numbered 26); the others are PWRI, I32 numbered 18, as PowerInfer writes. */
enum corrupt {
    C_NONE, C_VALUE, C_UNSORTED, C_COUNT, C_NO_VRAM, C_ARCH, C_F32, C_GAP, C_NO_BUCKET, C_GGUF
};

/* A PowerInfer-style GPU index written here with the GGUF writer only. */
static void write_gpuidx(const char *path, int32_t n_layer, int32_t n_ff, const uint8_t *gpu,
                         uint64_t vram, enum corrupt c)
{
    struct si_gguf_writer *w = si_gguf_writer_init(c != C_GGUF);
    si_gguf_writer_set_str(w, "general.architecture", c == C_ARCH ? "llama" : "generic.gpu_index");
    if (c != C_NO_VRAM)
        si_gguf_writer_set_u64(w, "split.vram_capacity", vram);
    int32_t *idx = malloc((size_t)n_layer * n_ff * 4), *bk = malloc((size_t)n_layer * n_ff * 4);
    float *fidx = malloc((size_t)n_ff * 4);
    int32_t *b = bk;
    for (int32_t l = 0; l < n_layer; l++) {
        int32_t *row = idx + (size_t)l * n_ff, *b0 = b;
        for (int32_t i = 0; i < n_ff; i++) {
            row[i] = gpu[(size_t)l * n_ff + i];
            if (row[i])
                *b++ = i;
        }
        if (l == 0 && c == C_VALUE)
            row[1] = 2;
        if (l == 0 && c == C_UNSORTED && b - b0 >= 2) {
            int32_t t = b0[0];
            b0[0] = b0[1];
            b0[1] = t;
        }
        char name[64];
        int64_t ne[1] = {n_ff};
        const int32_t L = c == C_GAP && l == n_layer - 1 ? l + 1 : l;
        snprintf(name, sizeof name, "blk.%d.gpu_idx", (int)L);
        if (l == 0 && c == C_F32) {
            for (int32_t i = 0; i < n_ff; i++)
                fidx[i] = (float)row[i];
            si_gguf_writer_add_tensor(w, name, SI_TYPE_F32, 1, ne, fidx);
        } else {
            si_gguf_writer_add_tensor(w, name, SI_TYPE_I32, 1, ne, row);
        }
        ne[0] = b - b0 - (l == 0 && c == C_COUNT ? 1 : 0);
        snprintf(name, sizeof name, "blk.%d.gpu_bucket", (int)L);
        if (c != C_NO_BUCKET)
            si_gguf_writer_add_tensor(w, name, SI_TYPE_I32, 1, ne, b0);
    }
    char err[256];
    CHECK(si_gguf_writer_write(w, path, err, sizeof err) == SI_OK, "write %s: %s", path, err);
    si_gguf_writer_free(w);
    free(idx);
    free(bk);
    free(fidx);
}

/* Other files that are not corrupt (the GGUF magic with I32 as 26,
 * gpu_idx without gpu_bucket), read with the same neurons gpu. */
static void check_fine_files(const struct si_model *m, const uint8_t *gpu)
{
    char path[256], err[512];
    const int32_t L = m->hp.n_layer, F = m->hp.n_ff;
    struct si_placement *q = NULL;
    /* Other files that are not corrupt, read with the same neurons. */
    const struct {
        const char *file, *what;
        enum corrupt c;
        bool with_model;
    } fine[] = {
        {"gguf26.gguf", "GGUF magic, I32 as 26 (starinfer's earlier files)", C_GGUF, true},
        {"nobucket.gguf", "gpu_idx without gpu_bucket", C_NO_BUCKET, false},
    };
    for (size_t k = 0; k < sizeof fine / sizeof fine[0]; k++) {
        path_in(path, sizeof path, fine[k].file);
        write_gpuidx(path, L, F, gpu, 1, fine[k].c);
        CHECK(si_placement_read(&q, path, fine[k].with_model ? m : NULL, err, sizeof err) ==
                      SI_OK &&
                  q != NULL && !memcmp(q->gpu, gpu, (size_t)L * F),
              "%s: %s", fine[k].what, err);
        si_placement_free(q);
        q = NULL;
    }
}

/* The placement p given starinfer's keys, written by our writer
 * (ours.gguf, the magic PWRI) and read back: the same placement, keys
 * and hardware model; its tensors a valid PowerInfer index. */
static void check_our_file(const struct si_model *m, struct si_placement *p)
{
    char path[256], err[512];
    const int32_t L = m->hp.n_layer;
    struct si_placement *q = NULL;
    p->has_meta = true;
    snprintf(p->policy, sizeof p->policy, "ilp");
    snprintf(p->sparsity, sizeof p->sparsity, "gate");
    snprintf(p->outcome, sizeof p->outcome, "optimal");
    p->objective = 12.5;
    p->bound = 12.75;
    p->gap = 0.25 / 12.75;
    p->solve_seconds = 0.5;
    p->reserve_bytes = 4096;
    p->neuron_bytes = 772;
    p->batch = 64;
    p->c_min = malloc((size_t)L * sizeof *p->c_min);
    for (int32_t l = 0; l < L; l++)
        p->c_min[l] = l == 0 ? INT64_MAX : 17 + l;
    si_hwmodel_defaults(&p->hw, 64);
    p->hw.value[SI_HW_CPU_BW] = 21.5e9;
    p->hw.source[SI_HW_CPU_BW] = SI_HW_MEASURED;
    p->hw.source[SI_HW_T_SYNC] = SI_HW_GIVEN;
    p->hw.threads = 3;
    path_in(path, sizeof path, "ours.gguf");
    CHECK(si_placement_write(p, path, err, sizeof err) == SI_OK, "write: %s", err);
    /* as PowerInfer's exporter writes it: the magic PWRI (its type
     * numbers; test-gguf-write checks that I32 is stored as 18) */
    FILE *f = fopen(path, "rb");
    char magic[4] = "";
    CHECK(f != NULL && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "PWRI", 4),
          "our placement file's magic is not PWRI");
    if (f != NULL)
        fclose(f);
    CHECK(si_placement_read(&q, path, m, err, sizeof err) == SI_OK, "read back: %s", err);
    if (q != NULL) {
        CHECK(same_placement(p, q), "round trip: the placements differ");
        CHECK(q->has_meta && !strcmp(q->policy, "ilp") && !strcmp(q->sparsity, "gate") &&
                  !strcmp(q->outcome, "optimal") && q->objective == 12.5 && q->bound == 12.75 &&
                  q->gap == p->gap && q->solve_seconds == 0.5 && q->reserve_bytes == 4096 &&
                  q->neuron_bytes == 772 && q->batch == 64,
              "round trip: the starinfer keys differ");
        CHECK(q->c_min != NULL && q->c_min[0] == INT64_MAX && (L < 2 || q->c_min[1] == 18),
              "round trip: C_l");
        CHECK(q->hw.value[SI_HW_CPU_BW] == 21.5e9 && q->hw.source[SI_HW_CPU_BW] == SI_HW_MEASURED &&
                  q->hw.source[SI_HW_T_SYNC] == SI_HW_GIVEN &&
                  q->hw.source[SI_HW_GPU_BW] == SI_HW_ASSUMED && q->hw.threads == 3,
              "round trip: the hardware model");
        /* our file is a valid PowerInfer index: its tensors by hand */
        struct si_gguf *g = NULL;
        CHECK(si_gguf_open(&g, path, err, sizeof err) == SI_OK, "open: %s", err);
        if (g != NULL) {
            int64_t ti = si_gguf_find_tensor(g, "blk.0.gpu_bucket");
            CHECK(ti >= 0 && g->tensors[ti].type == SI_TYPE_I32 &&
                      g->tensors[ti].ne[0] == q->n_gpu[0] &&
                      ((const int32_t *)g->tensors[ti].data)[0] == 0 &&
                      ((const int32_t *)g->tensors[ti].data)[1] == 1,
                  "blk.0.gpu_bucket");
            si_gguf_free(g);
        }
    }
    si_placement_free(q);
}

/* Corrupt or foreign files refused: each corruption of a file of the
 * neurons gpu, pi.gguf cut short, another model's shape, a missing file. */
static void check_bad_files(const struct si_model *m, const uint8_t *gpu)
{
    char path[256];
    const int32_t L = m->hp.n_layer, F = m->hp.n_ff;
    /* Corrupt or foreign files */
    const struct {
        enum corrupt c;
        int want;
        const char *needle;
    } bad[] = {
        {C_VALUE, SI_E_FORMAT, "is not 0 or 1"},
        {C_UNSORTED, SI_E_FORMAT, "not an increasing id"},
        {C_COUNT, SI_E_FORMAT, "lists"},
        {C_NO_VRAM, SI_E_FORMAT, "missing key split.vram_capacity"},
        {C_ARCH, SI_E_FORMAT, "not a GPU index file"},
        {C_F32, SI_E_FORMAT, "expected I32"},
        {C_GAP, SI_E_FORMAT, "stop at"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(path, sizeof path, "%s/bad%zu.gguf", dir, k);
        write_gpuidx(path, L, F, gpu, 1, bad[k].c);
        expect_read(path, NULL, bad[k].want, bad[k].needle);
        unlink(path);
    }
    /* truncated */
    path_in(path, sizeof path, "pi.gguf");
    FILE *f = fopen(path, "rb");
    char buf[4096];
    size_t n = f != NULL ? fread(buf, 1, sizeof buf, f) : 0;
    if (f != NULL)
        fclose(f);
    char cut[256];
    path_in(cut, sizeof cut, "cut.gguf");
    f = fopen(cut, "wb");
    if (f != NULL) {
        fwrite(buf, 1, n / 2, f);
        fclose(f);
    }
    expect_read(cut, NULL, SI_E_FORMAT, "cut.gguf");
    unlink(cut);
    /* another model's shape */
    uint8_t *other = calloc((size_t)L * (F + 8), 1);
    path_in(path, sizeof path, "other.gguf");
    write_gpuidx(path, L, F + 8, other, 1, C_NONE);
    snprintf(buf, sizeof buf, "but the model has %d x %d", (int)L, (int)F);
    expect_read(path, m, SI_E_INVALID, buf);
    path_in(cut, sizeof cut, "missing.gguf");
    expect_read(cut, NULL, SI_E_NOT_FOUND, "missing.gguf");
    free(other);
}

/* Placement files: PowerInfer's read, others that are not corrupt, ours
 * written and read back, corrupt or foreign ones refused. */
static void test_files(const struct si_model *m)
{
    char path[256], err[512];
    const int32_t L = m->hp.n_layer, F = m->hp.n_ff;
    uint8_t *gpu = calloc((size_t)L * F, 1);
    for (int32_t k = 0; k < L * F; k++)
        gpu[k] = (k % 7) < 3;
    gpu[0] = gpu[1] = gpu[2] = 1; /* layer 0 has at least two GPU neurons */

    /* PowerInfer-style: read, no starinfer keys */
    path_in(path, sizeof path, "pi.gguf");
    write_gpuidx(path, L, F, gpu, 123456789, C_NONE);
    struct si_placement *p = NULL;
    CHECK(si_placement_read(&p, path, m, err, sizeof err) == SI_OK, "PowerInfer file: %s", err);
    if (p != NULL) {
        CHECK(!p->has_meta && p->vram_capacity == 123456789, "PowerInfer file: meta %d, vram %llu",
              p->has_meta, (unsigned long long)p->vram_capacity);
        CHECK(!memcmp(p->gpu, gpu, (size_t)L * F), "PowerInfer file: gpu_idx differs");
        int64_t n = 0;
        for (int32_t k = 0; k < L * F; k++)
            n += gpu[k];
        CHECK(si_placement_gpu_neurons(p) == n, "PowerInfer file: %lld GPU neurons, %lld marked",
              (long long)si_placement_gpu_neurons(p), (long long)n);
    }
    check_fine_files(m, gpu);

    /* Our writer, our keys, read back */
    if (p != NULL)
        check_our_file(m, p);
    si_placement_free(p);

    check_bad_files(m, gpu);
    const char *names[] = {"pi.gguf", "nobucket.gguf", "gguf26.gguf", "ours.gguf", "other.gguf"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        path_in(path, sizeof path, names[k]);
        unlink(path);
    }
    free(gpu);
}

/* A profile of the model's shape with distinct counts. */
static struct si_profile *make_profile(const struct si_model *m)
{
    struct si_profile *pr = NULL;
    char err[128];
    if (si_profile_init(&pr, m->hp.n_layer, m->hp.n_ff, err, sizeof err) != SI_OK)
        return NULL;
    pr->n_tokens = 1000;
    for (int64_t k = 0; k < (int64_t)m->hp.n_layer * m->hp.n_ff; k++)
        pr->counts[k] = (k * 7919) % 1001;
    return pr;
}

static void test_place(const struct si_model *m)
{
    char err[512];
    struct si_profile *pr = make_profile(m);
    struct si_engine_params ep = si_engine_default_params();
    ep.mode = SI_SPARSITY_GATE;
    struct si_place_params pp = si_place_default_params();
    CHECK(si_engine_gpu_reserve(m, &ep, &pp.reserve, err, sizeof err) == SI_OK, "reserve: %s",
          err);
    CHECK(pp.reserve.total > 0 && pp.reserve.unit_neurons == 1 && pp.reserve.unit_bytes > 0,
          "reserve %lld, unit %lld", (long long)pp.reserve.total,
          (long long)pp.reserve.unit_bytes);
    CHECK(pp.reserve.bytes[SI_GPU_ATTENTION] == 0 && pp.reserve.cpu_bytes[SI_GPU_ATTENTION] > 0 &&
              pp.reserve.bytes[SI_GPU_KV_CACHE] == 0 && pp.reserve.cpu_bytes[SI_GPU_KV_CACHE] > 0,
          "attention and the KV cache stay on the CPU");
    pp.hw.value[SI_HW_CPU_BW] = 20e9;
    pp.hw.value[SI_HW_GPU_BW] = 1000e9;
    pp.hw.value[SI_HW_T_SYNC] = 0.2e-6; /* C_l of a few neurons for these tiny ones */
    const int64_t N = (int64_t)m->hp.n_layer * m->hp.n_ff;
    struct si_placement *P = NULL;
    for (int pol = 0; pol < SI_PLACE_POLICY_COUNT; pol++) {
        pp.policy = (enum si_place_policy)pol;
        /* budget 0: every neuron on the CPU */
        pp.vram_budget = 0;
        CHECK(si_place(&P, pr, &pp, err, sizeof err) == SI_OK, "budget 0: %s", err);
        CHECK(P != NULL && si_placement_gpu_neurons(P) == 0, "%s, budget 0: %lld GPU neurons",
              si_place_policy_name(pp.policy), P ? (long long)si_placement_gpu_neurons(P) : -1LL);
        si_placement_free(P);
        P = NULL;
        /* a budget above the model: every neuron on the GPU */
        pp.vram_budget = pp.reserve.total + N * pp.reserve.unit_bytes + 12345;
        CHECK(si_place(&P, pr, &pp, err, sizeof err) == SI_OK, "big budget: %s", err);
        CHECK(P != NULL && si_placement_gpu_neurons(P) == N, "%s, big budget: %lld of %lld",
              si_place_policy_name(pp.policy), P ? (long long)si_placement_gpu_neurons(P) : -1LL,
              (long long)N);
        si_placement_free(P);
        P = NULL;
        /* exactly the reserve plus 10 neurons: at most 10 */
        pp.vram_budget = pp.reserve.total + 10 * pp.reserve.unit_bytes;
        CHECK(si_place(&P, pr, &pp, err, sizeof err) == SI_OK, "10 neurons: %s", err);
        CHECK(P != NULL && si_placement_gpu_neurons(P) <= 10 &&
                  (pol == SI_PLACE_ILP || si_placement_gpu_neurons(P) == 10),
              "%s, room for 10 neurons: %lld", si_place_policy_name(pp.policy),
              P ? (long long)si_placement_gpu_neurons(P) : -1LL);
        si_placement_free(P);
        P = NULL;
    }
    /* the three policies at one budget */
    double obj[SI_PLACE_POLICY_COUNT] = {0};
    pp.vram_budget = pp.reserve.total + N / 3 * pp.reserve.unit_bytes;
    for (int pol = 0; pol < SI_PLACE_POLICY_COUNT; pol++) {
        pp.policy = (enum si_place_policy)pol;
        CHECK(si_place(&P, pr, &pp, err, sizeof err) == SI_OK, "a third: %s", err);
        obj[pol] = P != NULL ? P->objective : -1;
        si_placement_free(P);
        P = NULL;
    }
    printf("objective at a third of the neurons: ilp %.3f, hottest %.3f, random %.3f\n",
           obj[SI_PLACE_ILP], obj[SI_PLACE_HOTTEST], obj[SI_PLACE_RANDOM]);
    /* The ILP places whole batches of 64 (it may leave up to a batch of the
     * capacity unused where hottest fills it neuron by neuron), and it keeps
     * C_l, which hottest ignores: close to hottest, far above random. */
    CHECK(obj[SI_PLACE_ILP] >= 0.95 * obj[SI_PLACE_HOTTEST] &&
              obj[SI_PLACE_ILP] > 1.3 * obj[SI_PLACE_RANDOM],
          "objectives ilp %g, hottest %g, random %g", obj[SI_PLACE_ILP], obj[SI_PLACE_HOTTEST],
          obj[SI_PLACE_RANDOM]);
    /* refused */
    pp.policy = SI_PLACE_ILP;
    pp.vram_budget = pp.reserve.total - 1;
    char want[160];
    snprintf(want, sizeof want, "VRAM budget of %lld bytes is below the %lld bytes",
             (long long)pp.vram_budget, (long long)pp.reserve.total);
    CHECK(si_place(&P, pr, &pp, err, sizeof err) == SI_E_BUDGET && P == NULL &&
              strstr(err, want) != NULL,
          "budget below the reserve: %s", err);
    pp.vram_budget = -5;
    CHECK(si_place(&P, pr, &pp, err, sizeof err) == SI_E_INVALID && strstr(err, "negative"),
          "negative budget: %s", err);
    struct si_gpu_reserve dense;
    ep.mode = SI_SPARSITY_DENSE;
    CHECK(si_engine_gpu_reserve(m, &ep, &dense, err, sizeof err) == SI_OK, "dense: %s", err);
    pp.reserve = dense;
    pp.vram_budget = 1 << 30;
    CHECK(si_place(&P, pr, &pp, err, sizeof err) == SI_E_INVALID && strstr(err, "dense"),
          "dense mode: %s", err);
    si_profile_free(pr);
}

/* The engine with a placement, hot slices on CPU workers. */
static void test_engine(const struct si_model *m)
{
    char err[512];
    const int32_t L = m->hp.n_layer, F = m->hp.n_ff;
    struct si_placement *pl = NULL;
    CHECK(si_placement_init(&pl, L, F, err, sizeof err) == SI_OK, "%s", err);
    if (pl == NULL)
        return;
    for (int32_t l = 0; l < L; l++) /* a scattered set per layer, of different sizes */
        for (int32_t i = 0; i < F; i++)
            if ((i * 37 + l * 11) % 5 == 0 || (l == 1 && i % 3 == 0)) {
                pl->gpu[(size_t)l * F + i] = 1;
                pl->n_gpu[l]++;
            }
    struct si_profile *pr = make_profile(m);
    struct si_engine_params ep = si_engine_default_params();
    ep.mode = SI_SPARSITY_GATE;
    ep.hot_on_cpu = true;
    ep.placement = pl;
    ep.profile = pr;
    ep.ref.n_ctx = 16;
    struct si_gpu_reserve rs;
    CHECK(si_engine_gpu_reserve(m, &ep, &rs, err, sizeof err) == SI_OK, "%s", err);
    const int64_t hot = si_placement_gpu_neurons(pl) * rs.unit_bytes;
    ep.vram_budget = rs.total + hot + 100;
    struct si_engine *e = NULL;
    CHECK(si_engine_init(&e, m, ep, err, sizeof err) == SI_OK, "engine: %s", err);
    if (e != NULL) {
        for (int32_t l = 0; l < L; l++) {
            CHECK(si_engine_n_hot(e, l) == pl->n_gpu[l], "layer %d: %lld hot, %lld placed", l,
                  (long long)si_engine_n_hot(e, l), (long long)pl->n_gpu[l]);
            int bad = 0;
            for (int64_t pos = 0; pos < F; pos++) {
                const int32_t id = si_engine_neuron_id(e, l, pos);
                bad += (pos < si_engine_n_hot(e, l)) != (pl->gpu[(size_t)l * F + id] != 0);
            }
            CHECK(bad == 0, "layer %d: %d neurons on the wrong side of the hot slice", l, bad);
        }
        struct si_engine_stats st = si_engine_get_stats(e);
        /* Every GPU buffer of this tiny model is under 4 MiB: one 32 MiB
         * chunk of StarPU's allocator holds them all, which the reserve
         * counts. */
        CHECK(st.gpu_budget == ep.vram_budget && st.gpu_accounted == ((int64_t)32 << 20) &&
                  st.gpu_accounted <= rs.total + hot && st.gpu_allocated_peak == -1,
              "GPU bytes: budget %lld, accounted %lld (reserve %lld + hot %lld), peak %lld",
              (long long)st.gpu_budget, (long long)st.gpu_accounted, (long long)rs.total,
              (long long)hot, (long long)st.gpu_allocated_peak);
        CHECK(si_engine_hot_bytes(e) == hot, "hot bytes %lld, expected %lld",
              (long long)si_engine_hot_bytes(e), (long long)hot);
        /* it computes: a few tokens, logits against the engine without placement */
        struct si_engine_params e2p = ep;
        e2p.placement = NULL;
        e2p.vram_budget = 0;
        e2p.hot_on_cpu = false;
        struct si_engine *e2 = NULL;
        CHECK(si_engine_init(&e2, m, e2p, err, sizeof err) == SI_OK, "engine 2: %s", err);
        double worst = 0;
        for (int t = 0; t < 4 && e2 != NULL; t++) {
            CHECK(si_engine_eval(e, 3 + t) == SI_OK && si_engine_eval(e2, 3 + t) == SI_OK,
                  "eval %d", t);
            const float *a = si_engine_logits(e), *b = si_engine_logits(e2);
            for (int32_t k = 0; k < m->hp.n_vocab; k++)
                worst = fmax(worst, fabs((double)a[k] - (double)b[k]) / (1e-3 + fabs(b[k])));
        }
        printf("engine with the placement vs without: worst relative logit difference %.2e\n",
               worst);
        CHECK(worst < 1e-3, "logits differ by %g", worst);
        si_engine_free(e2);
        si_engine_free(e);
        e = NULL;
    }
    /* a budget below the reserve, one too small for the placement */
    ep.vram_budget = rs.total - 1;
    char want[160];
    snprintf(want, sizeof want, "VRAM budget of %lld bytes is below the %lld bytes",
             (long long)ep.vram_budget, (long long)rs.total);
    CHECK(si_engine_init(&e, m, ep, err, sizeof err) == SI_E_BUDGET && e == NULL &&
              strstr(err, want),
          "budget below the reserve: %s", err);
    ep.vram_budget = rs.total + hot - 1;
    CHECK(si_engine_init(&e, m, ep, err, sizeof err) == SI_E_BUDGET && e == NULL &&
              strstr(err, "GPU neurons take"),
          "placement over the budget: %s", err);
    /* no --vram-budget: the file's vram_capacity */
    ep.vram_budget = 0;
    pl->vram_capacity = (uint64_t)(rs.total + hot);
    CHECK(si_engine_init(&e, m, ep, err, sizeof err) == SI_OK, "the placement's capacity: %s",
          err);
    if (e != NULL)
        CHECK(si_engine_get_stats(e).gpu_budget == rs.total + hot, "budget from the file");
    si_engine_free(e);
    e = NULL;
    /* greedy rule without a placement: the budget below the reserve is refused too */
    ep.placement = NULL;
    ep.vram_budget = rs.total / 2;
    CHECK(si_engine_init(&e, m, ep, err, sizeof err) == SI_E_BUDGET && e == NULL,
          "greedy, budget below the reserve: %s", err);
    ep.placement = pl;
    ep.mode = SI_SPARSITY_DENSE;
    CHECK(si_engine_init(&e, m, ep, err, sizeof err) == SI_E_INVALID && strstr(err, "dense"),
          "dense mode with a placement: %s", err);
    ep.mode = SI_SPARSITY_GATE;
    struct si_placement *small = NULL;
    si_placement_init(&small, L, F / 2, err, sizeof err);
    ep.placement = small;
    CHECK(si_engine_init(&e, m, ep, err, sizeof err) == SI_E_INVALID && strstr(err, "placement is for"),
          "placement of another shape: %s", err);
    si_placement_free(small);
    si_placement_free(pl);
    si_profile_free(pr);
}

/*
 * StarPU's allocator on the GPU: buffers under 4 MiB share 32 MiB chunks.
 * A model whose hot slices are each under 4 MiB, some 60 MiB of them in a
 * budget of the reserve + 60 MiB, would take three chunks (96 MiB) where the
 * plan counted one chunk and the bytes (92 MiB): the engine plans again with
 * fewer hot neurons until what StarPU would allocate fits the budget.
 */
static void test_engine_chunks(void)
{
    char path[256], err[512];
    path_in(path, sizeof path, "chunks.gguf");
    struct si_synth_params sp = si_synth_default_params();
    sp.n_layer = 20;
    sp.n_embd = 64;
    sp.n_ff = 5504; /* about 4 MiB of FFN rows per layer */
    int rc = si_synth_write(&sp, path, err, sizeof err);
    CHECK(rc == SI_OK, "synth: %s", err);
    struct si_model *m = NULL;
    if (rc == SI_OK)
        CHECK(si_model_load(&m, path, err, sizeof err) == SI_OK, "load: %s", err);
    unlink(path);
    if (m == NULL)
        return;
    struct si_engine_params ep = si_engine_default_params();
    ep.mode = SI_SPARSITY_GATE;
    ep.hot_on_cpu = true;
    ep.ref.n_ctx = 16;
    struct si_gpu_reserve rs;
    CHECK(si_engine_gpu_reserve(m, &ep, &rs, err, sizeof err) == SI_OK, "%s", err);
    CHECK(rs.bytes[SI_GPU_ALLOCATOR] == ((int64_t)32 << 20), "allocator reserve %lld",
          (long long)rs.bytes[SI_GPU_ALLOCATOR]);
    const int64_t want = (int64_t)60 << 20;
    ep.vram_budget = rs.total + want;
    struct si_engine *e = NULL;
    CHECK(si_engine_init(&e, m, ep, err, sizeof err) == SI_OK, "engine: %s", err);
    if (e != NULL) {
        struct si_engine_stats st = si_engine_get_stats(e);
        const int64_t hot = si_engine_hot_bytes(e);
        printf("chunks: budget %.1f MiB, hot neurons %.1f MiB, StarPU would allocate %.1f MiB\n",
               (double)st.gpu_budget / 1048576.0, (double)hot / 1048576.0,
               (double)st.gpu_accounted / 1048576.0);
        CHECK(st.gpu_accounted <= st.gpu_budget, "allocated %lld over the budget %lld",
              (long long)st.gpu_accounted, (long long)st.gpu_budget);
        CHECK(hot < want && hot > want / 2, "hot bytes %lld for a budget leaving %lld",
              (long long)hot, (long long)want);
        for (int l = 0; l < m->hp.n_layer; l++)
            CHECK(si_engine_n_hot(e, l) > 0 && si_engine_n_hot(e, l) < m->hp.n_ff,
                  "layer %d: %lld hot", l, (long long)si_engine_n_hot(e, l));
        CHECK(si_engine_eval(e, 1) == SI_OK, "eval");
        si_engine_free(e);
    }
    si_model_free(m);
}

int main(void)
{
    test_ilp_refusals();
    test_ilp_vs_exhaustive();
    test_hwmodel();
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    char model_path[256], err[256];
    path_in(model_path, sizeof model_path, "tiny.gguf");
    struct si_synth_params sp = si_synth_default_params();
    sp.n_ff = 192;
    int rc = si_synth_write(&sp, model_path, err, sizeof err);
    CHECK(rc == SI_OK, "synth: %s", err);
    struct si_model *m = NULL;
    if (rc == SI_OK)
        CHECK(si_model_load(&m, model_path, err, sizeof err) == SI_OK, "load: %s", err);
    if (m != NULL) {
        test_files(m);
        test_place(m);
        struct si_runtime rt;
        if (si_runtime_start(&rt, false, err, sizeof err) == SI_OK) {
            test_engine(m);
            test_engine_chunks();
            si_runtime_stop(&rt);
        } else {
            CHECK(false, "StarPU: %s", err);
        }
        si_model_free(m);
    }
    unlink(model_path);
    rmdir(dir);
    return test_result();
}
