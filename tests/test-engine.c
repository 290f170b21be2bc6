/*
 * test-engine.c - the StarPU task-graph engine against the reference forward
 * pass: logits (max relative error) and 64 greedy tokens, in `dense` and
 * `gate` modes, on synthetic ReLU models (llama-relu, bamboo, opt; F32, F16
 * and Q4_0) and, with STARINFER_TEST_MODEL, on SmolLM2 in dense mode.
 * tests/test-engine.sh runs it under several schedulers and CPU counts.
 */
#include "graph/engine.h"
#include "graph/runtime.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/types.h"
#include "starinfer.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_GREEDY 64

static int32_t argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Largest |a - b| / max|b| over the logits. */
static double rel_err(const float *a, const float *b, int32_t n)
{
    double worst = 0, scale = 0;
    for (int32_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return scale > 0 ? worst / scale : worst;
}

/*
 * Prompt, then greedy decoding for N_GREEDY tokens with the engine and the
 * reference side by side (each on its own tokens), comparing logits at every
 * step.
 */
static void compare(const char *what, const struct si_model *m, enum si_sparsity mode,
                    int32_t n_slices, double tol)
{
    char err[512];
    struct si_engine_params ep = si_engine_default_params();
    ep.ref.n_ctx = 96;
    ep.mode = mode;
    ep.n_slices = n_slices;
    struct si_engine *e = NULL;
    int rc = si_engine_init(&e, m, ep, err, sizeof err);
    CHECK(rc == SI_OK, "%s: engine: %s", what, err);
    struct si_ref *r = NULL;
    rc = si_ref_init(&r, m, ep.ref, err, sizeof err);
    CHECK(rc == SI_OK, "%s: reference: %s", what, err);
    if (e == NULL || r == NULL) {
        si_engine_free(e);
        si_ref_free(r);
        return;
    }
    const int32_t nv = m->hp.n_vocab;
    const int32_t prompt[] = {1, 17 % nv, 250 % nv, 3, 42 % nv};
    double worst = 0;
    int same = 0;
    int32_t te = 0, tr = 0;
    for (int i = 0; i < 5 + N_GREEDY; i++) {
        int32_t in_e = i < 5 ? prompt[i] : te, in_r = i < 5 ? prompt[i] : tr;
        CHECK(si_engine_eval(e, in_e) == SI_OK, "%s: engine eval at %d", what, i);
        CHECK(si_ref_eval(r, in_r) == SI_OK, "%s: reference eval at %d", what, i);
        if (in_e == in_r)
            worst = fmax(worst, rel_err(si_engine_logits(e), r->logits, nv));
        te = argmax(si_engine_logits(e), nv);
        tr = argmax(r->logits, nv);
        if (i >= 5)
            same += te == tr;
    }
    struct si_engine_stats st = si_engine_get_stats(e);
    printf("%-34s %s: %d slices, logits max rel err %.2e, %d/%d greedy tokens equal, "
           "%.1f%% of neurons computed, %lld tasks\n",
           what, mode == SI_SPARSITY_DENSE ? "dense" : "gate ", si_engine_n_slices(e), worst, same,
           N_GREEDY, 100.0 * (double)st.neurons_active / (double)st.neurons_total,
           (long long)st.tasks);
    CHECK(worst <= tol, "%s: logits differ by %.3g (tolerance %.1g)", what, worst, tol);
    CHECK(same == N_GREEDY, "%s: %d of %d greedy tokens equal", what, same, N_GREEDY);
    if (mode == SI_SPARSITY_GATE && m->hp.act == SI_ACT_RELU)
        CHECK(st.neurons_active < st.neurons_total / 2, "%s: gate mode computed %lld of %lld",
              what, (long long)st.neurons_active, (long long)st.neurons_total);
    /* A token outside the vocabulary is refused without running anything. */
    CHECK(si_engine_eval(e, nv) == SI_E_INVALID, "%s: bad token accepted", what);
    si_engine_reset(e);
    CHECK(si_engine_eval(e, 1) == SI_OK, "%s: eval after reset", what);
    si_engine_free(e);
    si_ref_free(r);
}

static void synthetic(const char *arch, uint32_t type, int64_t n_ff, int32_t n_slices, double tol)
{
    char path[] = "/tmp/si-test-engine-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0)
        return;
    close(fd);
    struct si_synth_params p = si_synth_default_params();
    si_synth_preset("tiny", &p);
    si_synth_arch_parse(arch, &p.arch);
    p.type = type;
    p.n_layer = 3;
    p.n_ff = n_ff; /* chunks of 256 neurons: several slices */
    p.seed = 11;
    if (p.arch == SI_SYNTH_OPT)
        p.n_head_kv = p.n_head; /* OPT has no grouped-query attention */
    char err[512];
    int rc = si_synth_write(&p, path, err, sizeof err);
    CHECK(rc == SI_OK, "synth %s: %s", arch, err);
    struct si_model *m = NULL;
    if (rc == SI_OK && si_model_load(&m, path, err, sizeof err) == SI_OK) {
        char what[96];
        snprintf(what, sizeof what, "synthetic %s %s", arch, si_type_name(type));
        compare(what, m, SI_SPARSITY_DENSE, n_slices, tol);
        compare(what, m, SI_SPARSITY_GATE, n_slices, tol);
    } else if (rc == SI_OK) {
        CHECK(false, "load %s: %s", arch, err);
    }
    si_model_free(m);
    unlink(path);
}

int main(void)
{
    struct si_runtime rt;
    char err[256];
    if (si_runtime_start(&rt, err, sizeof err) != SI_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("StarPU: %u CPU workers, scheduler %s\n", si_runtime_ncpu(),
           getenv("STARPU_SCHED") != NULL ? getenv("STARPU_SCHED") : "(default)");
    /* Float weights: the slices' partial sums only reorder additions. */
    synthetic("llama-relu", SI_TYPE_F32, 1024, 0, 1e-4);
    synthetic("bamboo", SI_TYPE_F16, 1024, 0, 1e-4);
    synthetic("opt", SI_TYPE_F32, 1024, 0, 1e-4);
    /* Quantized weights: the same blocks, so the same bound holds. */
    synthetic("llama-relu", SI_TYPE_Q4_0, 1024, 0, 1e-4);
    /* More slices than a task's fixed buffer slots: the merge task's
     * handles go through StarPU's dynamic buffer arrays. */
    synthetic("llama-relu", SI_TYPE_Q4_0, 4096, 12, 1e-4);

    const char *path = getenv("STARINFER_TEST_MODEL");
    if (path != NULL && *path != '\0' && access(path, R_OK) == 0) {
        struct si_model *m = NULL;
        if (si_model_load(&m, path, err, sizeof err) == SI_OK) {
            compare("SmolLM2-135M Q4_1", m, SI_SPARSITY_DENSE, 0, 1e-4);
            si_model_free(m);
        } else {
            CHECK(false, "%s", err);
        }
    } else {
        printf("note: STARINFER_TEST_MODEL not set; SmolLM2 not compared\n");
    }
    si_runtime_stop(&rt);
    return test_result();
}
