/*
 * test-powerinfer.c - PowerInfer's own files and answers as the oracle:
 * tests/data/powerinfer/ARCH.gguf, made by PowerInfer's converters from
 * checkpoints of tools/powerinfer-fixtures, and ARCH.expect, what
 * PowerInfer's binaries answered on them (docs/powerinfer.md).  For each
 * architecture PowerInfer runs (llama with ReLU, bamboo, falcon, opt):
 *
 * - predictor mode (PowerInfer's own inference) on the StarPU engine, the
 *   prompt token by token (below), gives
 *   PowerInfer's greedy ids from the recorded prompt ids, all of them or
 *   up to a step PowerInfer recorded as a near tie (its two best logits
 *   within NEAR_TIE) where the two part; the largest difference between
 *   its gaps and ours is printed;
 * - every neuron computed (PowerInfer with its threshold at -1e30): dense
 *   and gate modes on the engine and the reference give PowerInfer's
 *   all-neurons ids, all of them or up to a step where our own two best
 *   logits are within NEAR_TIE and the two part.
 *
 * - PowerInfer's GPU index (ARCH.gpuidx, made by its powerinfer-py: its
 *   ILP solver and exporter) read as a placement gives, per layer, the
 *   neurons its own gguf-py read from the file (ARCH.expect's
 *   gpuidx_hot_L) and the VRAM capacity it records; the engine with it
 *   (the hot slice on a CPU worker, as tests do without a GPU) holds
 *   exactly those neurons hot and, in predictor mode, decodes PowerInfer's
 *   greedy ids as above.
 *
 * The expectations are PowerInfer's, not ours.  Its perplexities are
 * checked by test-powerinfer.sh through `starinfer perplexity`.
 */
#include "graph/engine.h"
#include "graph/runtime.h"
#include "model/model.h"
#include "placement/placement.h"
#include "starinfer.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_IDS = 256, N_GEN = 32, MAX_LAYERS = 4 };

/* Two logits closer than this are a near tie (tools/powerinfer-fixtures's):
 * two arithmetics of the same model may take either token there. */
#define NEAR_TIE 0.01

struct expect {
    int32_t prompt[MAX_IDS], greedy[MAX_IDS], all[MAX_IDS];
    double gaps[MAX_IDS];
    int n_prompt, n_greedy, n_all, n_gaps;
    int32_t hot[MAX_LAYERS][MAX_IDS]; /* gpuidx_hot_L: PowerInfer's GPU neurons */
    int n_hot[MAX_LAYERS];            /* -1: no such line */
    double vram_capacity;             /* gpuidx_vram_capacity, -1 without */
};

/* The numbers after "key: " on the line of key, into v (at most MAX_IDS). */
static int numbers(const char *text, const char *key, double *v)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\n%s: ", key);
    const char *p = strstr(text, pat);
    if (p == NULL)
        return -1;
    p += strlen(pat);
    int n = 0;
    while (*p != '\n' && *p != '\0' && n < MAX_IDS) {
        char *end;
        const double x = strtod(p, &end);
        if (end == p)
            break;
        v[n++] = x;
        p = end;
    }
    return n;
}

static bool read_expect(const char *path, struct expect *x)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return false;
    static char text[1 << 16];
    text[0] = '\n';
    const size_t n = fread(text + 1, 1, sizeof text - 2, f);
    fclose(f);
    text[n + 1] = '\0';
    double v[MAX_IDS];
    x->n_prompt = numbers(text, "prompt_ids", v);
    for (int i = 0; i < x->n_prompt; i++)
        x->prompt[i] = (int32_t)v[i];
    x->n_greedy = numbers(text, "greedy_ids", v);
    for (int i = 0; i < x->n_greedy; i++)
        x->greedy[i] = (int32_t)v[i];
    x->n_all = numbers(text, "all_neurons_greedy_ids", v);
    for (int i = 0; i < x->n_all; i++)
        x->all[i] = (int32_t)v[i];
    x->n_gaps = numbers(text, "greedy_gaps", x->gaps);
    for (int l = 0; l < MAX_LAYERS; l++) {
        char key[32];
        snprintf(key, sizeof key, "gpuidx_hot_%d", l);
        x->n_hot[l] = numbers(text, key, v);
        for (int i = 0; i < x->n_hot[l]; i++)
            x->hot[l][i] = (int32_t)v[i];
    }
    x->vram_capacity = numbers(text, "gpuidx_vram_capacity", v) == 1 ? v[0] : -1;
    return x->n_prompt > 0 && x->n_greedy == N_GEN && x->n_all == N_GEN && x->n_gaps == N_GEN;
}

/* The best token of logits and its lead over the second. */
static int32_t best(const float *lg, int32_t n, double *gap)
{
    int32_t b = 0;
    for (int32_t t = 1; t < n; t++)
        if (lg[t] > lg[b])
            b = t;
    double second = -INFINITY;
    for (int32_t t = 0; t < n; t++)
        if (t != b && lg[t] > second)
            second = lg[t];
    *gap = (double)lg[b] - second;
    return b;
}

/*
 * Greedy decoding of N_GEN tokens after the prompt on model m with
 * (engine, sparsity), against want: equal, or parting only at a near tie
 * (PowerInfer's when pi_gaps, else ours), where the comparison ends.
 */
static void greedy(const char *what, struct si_llm *llm, enum si_engine_kind engine,
                   enum si_sparsity_mode mode, const struct expect *x, const int32_t *want,
                   const double *pi_gaps)
{
    struct si_context_params cp = si_context_default_params();
    cp.engine = engine;
    cp.sparsity = mode;
    cp.n_ctx = 128;
    /* PowerInfer predicts the neurons of a prompt's tokens too; the engine's
     * batched prompt computes every neuron the ReLU gate passes (a superset,
     * the exact FFN), and the predictor decides from the first decoded
     * token on: token by token, the prompt is predicted as PowerInfer's */
    if (mode == SI_SPARSE_PREDICTOR)
        cp.n_batch = 1;
    struct si_context *ctx = NULL;
    char label[160];
    snprintf(label, sizeof label, "%s %s %s", what, si_engine_kind_name(engine),
             si_sparsity_mode_name(mode));
    int rc = si_context_init(llm, cp, &ctx);
    CHECK(rc == SI_OK, "%s: %s", label, si_last_error());
    if (rc != SI_OK)
        return;
    CHECK(si_context_eval_batch(ctx, x->prompt, x->n_prompt) == SI_OK, "%s: the prompt: %s",
          label, si_last_error());
    const int32_t nv = si_llm_n_vocab(llm);
    int same = 0, parted = -1;
    double worst = 0, gap = 0;
    for (int i = 0; i < N_GEN; i++) {
        const int32_t tok = best(si_context_logits(ctx), nv, &gap);
        const bool tie = pi_gaps != NULL ? pi_gaps[i] < NEAR_TIE : gap < NEAR_TIE;
        if (tok != want[i]) { /* from here the two decode different texts */
            CHECK(tie, "%s: step %d: token %d, PowerInfer's %d (our gap %.4f%s)", label, i, tok,
                  want[i], gap, pi_gaps != NULL ? ", not a near tie in PowerInfer's" : "");
            parted = i;
            break;
        }
        if (pi_gaps != NULL)
            worst = fmax(worst, fabs(gap - pi_gaps[i]));
        same++;
        CHECK(si_context_eval(ctx, tok) == SI_OK, "%s: step %d: %s", label, i, si_last_error());
    }
    printf("%-40s %2d of %d greedy ids PowerInfer's", label, same, N_GEN);
    if (parted >= 0)
        printf(", then a near tie (gap %.4f)", pi_gaps != NULL ? pi_gaps[parted] : gap);
    if (pi_gaps != NULL)
        printf("; our gaps within %.4f of its", worst);
    printf("\n");
    si_context_free(ctx);
}

/*
 * PowerInfer's GPU index of the fixture as the engine's placement (see the
 * top): its neurons, then predictor mode's greedy ids with them hot.
 */
static void gpu_index(const char *arch, const char *gguf, const char *gpuidx,
                      const struct expect *x)
{
    char err[512];
    struct si_model *m = NULL;
    CHECK(si_model_load(&m, gguf, err, sizeof err) == SI_OK, "%s: %s", gguf, err);
    if (m == NULL)
        return;
    const int32_t L = m->hp.n_layer, F = m->hp.n_ff;
    struct si_placement *pl = NULL;
    CHECK(si_placement_read(&pl, gpuidx, m, err, sizeof err) == SI_OK, "%s: %s", gpuidx, err);
    CHECK(L <= MAX_LAYERS, "%s: %d layers, the test reads %d", arch, (int)L, MAX_LAYERS);
    if (pl == NULL || L > MAX_LAYERS) {
        si_placement_free(pl);
        si_model_free(m);
        return;
    }
    int64_t n_gpu = 0;
    for (int32_t l = 0; l < L; l++) {
        CHECK(x->n_hot[l] >= 0, "%s: no gpuidx_hot_%d in the expectations", arch, (int)l);
        int bad = 0, k = 0;
        for (int32_t i = 0; i < F; i++) {
            const bool want = k < x->n_hot[l] && x->hot[l][k] == i;
            k += want;
            bad += want != (pl->gpu[(size_t)l * F + i] != 0);
        }
        CHECK(bad == 0 && k == x->n_hot[l] && pl->n_gpu[l] == x->n_hot[l],
              "%s: layer %d: %d neurons on the other side than in PowerInfer's reading (%lld "
              "placed, %d in its)",
              arch, (int)l, bad, (long long)pl->n_gpu[l], x->n_hot[l]);
        n_gpu += pl->n_gpu[l];
    }
    CHECK((double)pl->vram_capacity == x->vram_capacity, "%s: VRAM capacity %llu, PowerInfer's %g",
          arch, (unsigned long long)pl->vram_capacity, x->vram_capacity);

    struct si_engine_params ep = si_engine_default_params();
    ep.mode = SI_SPARSITY_PREDICTOR;
    ep.hot_on_cpu = true;
    ep.placement = pl;
    ep.ref.n_ctx = 128;
    struct si_gpu_reserve rs;
    CHECK(si_engine_gpu_reserve(m, &ep, &rs, err, sizeof err) == SI_OK, "%s: %s", arch, err);
    ep.vram_budget = rs.total + n_gpu * rs.unit_bytes;
    struct si_engine *e = NULL;
    CHECK(si_engine_init(&e, m, ep, err, sizeof err) == SI_OK, "%s: engine: %s", arch, err);
    if (e != NULL) {
        int bad = 0;
        for (int32_t l = 0; l < L; l++) {
            bad += si_engine_n_hot(e, l) != pl->n_gpu[l];
            for (int64_t pos = 0; pos < F; pos++)
                bad += (pos < si_engine_n_hot(e, l)) !=
                       (pl->gpu[(size_t)l * F + si_engine_neuron_id(e, l, pos)] != 0);
        }
        CHECK(bad == 0, "%s: the engine's hot slices are not PowerInfer's GPU neurons (%d off)",
              arch, bad);
        /* the prompt token by token, as PowerInfer predicts it (greedy()) */
        for (int i = 0; i < x->n_prompt; i++)
            CHECK(si_engine_eval(e, x->prompt[i]) == SI_OK, "%s: prompt %d", arch, i);
        int same = 0, parted = -1;
        for (int i = 0; i < N_GEN; i++) {
            double gap;
            const int32_t tok = best(si_engine_logits(e), m->hp.n_vocab, &gap);
            if (tok != x->greedy[i]) {
                CHECK(x->gaps[i] < NEAR_TIE, "%s gpuidx: step %d: token %d, PowerInfer's %d (its "
                      "gap %.4f, not a near tie)", arch, i, tok, x->greedy[i], x->gaps[i]);
                parted = i;
                break;
            }
            same++;
            CHECK(si_engine_eval(e, tok) == SI_OK, "%s: step %d", arch, i);
        }
        printf("PowerInfer's %-7s GPU index: %lld of %lld neurons as its gguf-py reads them, "
               "hot in the engine; predictor: %2d of %d greedy ids PowerInfer's",
               arch, (long long)n_gpu, (long long)L * F, same, N_GEN);
        if (parted >= 0)
            printf(", then a near tie (gap %.4f)", x->gaps[parted]);
        printf("\n");
        si_engine_free(e);
    }
    si_placement_free(pl);
    si_model_free(m);
}

int main(void)
{
    const char *srcdir = getenv("srcdir");
    static const char *const archs[] = {"llama", "bamboo", "falcon", "opt"};
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        char gguf[512], expect[512];
        snprintf(gguf, sizeof gguf, "%s/tests/data/powerinfer/%s.gguf",
                 srcdir != NULL ? srcdir : ".", archs[a]);
        snprintf(expect, sizeof expect, "%s/tests/data/powerinfer/%s.expect",
                 srcdir != NULL ? srcdir : ".", archs[a]);
        struct expect x;
        CHECK(read_expect(expect, &x), "%s: unreadable or incomplete", expect);
        struct si_llm *llm = NULL;
        CHECK(si_llm_load(gguf, si_llm_default_params(), &llm) == SI_OK, "%s: %s", gguf,
              si_last_error());
        if (llm == NULL)
            continue;
        char what[64];
        snprintf(what, sizeof what, "PowerInfer's %s", archs[a]);
        greedy(what, llm, SI_ENGINE_STARPU, SI_SPARSE_PREDICTOR, &x, x.greedy, x.gaps);
        greedy(what, llm, SI_ENGINE_STARPU, SI_SPARSE_DENSE, &x, x.all, NULL);
        greedy(what, llm, SI_ENGINE_STARPU, SI_SPARSE_GATE, &x, x.all, NULL);
        greedy(what, llm, SI_ENGINE_REF, SI_SPARSE_DENSE, &x, x.all, NULL);
        si_llm_free(llm);
    }
    /* PowerInfer's GPU index files, through the engine (after the contexts
     * above have stopped their StarPU) */
    char err[256];
    struct si_runtime rt;
    const int rc = si_runtime_start(&rt, false, err, sizeof err);
    CHECK(rc == SI_OK, "StarPU: %s", err);
    for (size_t a = 0; a < sizeof archs / sizeof archs[0] && rc == SI_OK; a++) {
        char gguf[512], expect[512], gpuidx[512];
        const char *d = srcdir != NULL ? srcdir : ".";
        snprintf(gguf, sizeof gguf, "%s/tests/data/powerinfer/%s.gguf", d, archs[a]);
        snprintf(expect, sizeof expect, "%s/tests/data/powerinfer/%s.expect", d, archs[a]);
        snprintf(gpuidx, sizeof gpuidx, "%s/tests/data/powerinfer/%s.gpuidx", d, archs[a]);
        struct expect x;
        if (read_expect(expect, &x))
            gpu_index(archs[a], gguf, gpuidx, &x);
    }
    if (rc == SI_OK)
        si_runtime_stop(&rt);
    return test_result();
}
