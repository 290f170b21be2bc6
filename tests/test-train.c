/*
 * test-train.c - predictor training (src/predict/train.h) and evaluation
 * (src/predict/eval.h): samples collected on a synthetic llama-relu model
 * against an independent count; training lowers the held-out loss and raises
 * recall, deterministically for a seed; the adaptive width picks a smaller
 * width for an easy (low-rank) layer than for a hard one and honours the
 * target; the written model round-trips through si_model_load with
 * PowerInfer's tensor names and shapes, and the reference's predictor mode
 * selects exactly the neurons the trained floats predict; the samples file
 * round-trips; eval's confusion counts and perplexity modes; bad inputs.
 */
#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/quants.h"
#include "model/synth.h"
#include "model/types.h"
#include "predict/eval.h"
#include "predict/profile.h"
#include "predict/train.h"
#include "starinfer.h"
#include "test.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void openblas_set_num_threads(int n);

#define N_TOK 1200
#define WINDOW 128

static char dir[] = "/tmp/si-test-train-XXXXXX";

/* The reference's runner with parameters rp (until the next call). */
static const struct si_ffn_runner *ref_runner(struct si_ref_params rp)
{
    static struct si_ffn_runner r;
    r = si_ffn_runner_ref(rp);
    return &r;
}

static void path_in(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", dir, name);
}

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005u + 1442695040888963407u;
    return *x >> 33;
}

static float gauss(uint64_t *x)
{
    const double u = ((double)lcg(x) + 1.0) / 2147483649.0, v = (double)lcg(x) / 2147483648.0;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/*
 * Hand-made samples, d = 64, ff = 128: layer 0 is easy, every neuron's
 * activity a threshold of one of 4 directions of x (a rank-4 problem);
 * layer 1 is hard, each neuron its own random direction (rank 64).
 */
static struct si_train_samples *easy_and_hard(int64_t n)
{
    const int32_t d = 64, ff = 128;
    struct si_train_samples *s = NULL;
    char err[256];
    if (si_train_samples_init(&s, 2, d, ff, n, err, sizeof err) != SI_OK)
        return NULL;
    uint64_t r = 42;
    float *u = malloc((size_t)(ff + 4) * d * sizeof *u), *x = malloc((size_t)d * sizeof *x);
    float *c = malloc((size_t)ff * sizeof *c);
    uint8_t *act = malloc((size_t)ff);
    for (int32_t k = 0; k < (ff + 4) * d; k++)
        u[k] = gauss(&r) / sqrtf((float)d);
    for (int32_t i = 0; i < ff; i++)
        c[i] = 0.6f + 0.8f * (float)(lcg(&r) % 1000) / 1000.0f; /* about 10-25% active */
    for (int64_t k = 0; k < n; k++) {
        for (int32_t j = 0; j < d; j++)
            x[j] = gauss(&r);
        for (int32_t l = 0; l < 2; l++) {
            for (int32_t i = 0; i < ff; i++) {
                const float *dir = l == 0 ? u + (size_t)(ff + i % 4) * d : u + (size_t)i * d;
                float dot = 0;
                for (int32_t j = 0; j < d; j++)
                    dot += dir[j] * x[j];
                act[i] = dot > c[i] * (l == 0 ? 1.0f + 0.1f * (float)(i / 4 % 8) : 1.0f);
            }
            si_train_samples_set(s, l, x, act);
        }
        s->n++;
    }
    free(u);
    free(x);
    free(c);
    free(act);
    return s;
}

static void test_adaptive(void)
{
    struct si_train_samples *s = easy_and_hard(3000);
    CHECK(s != NULL, "hand-made samples");
    if (s == NULL)
        return;
    char err[256];
    struct si_train_params p = si_train_default_params();
    p.rank_step = 8;
    p.rank_min = 8;
    p.rank_max = 128;
    p.target_recall = 0.9;
    p.epochs = 12;
    p.batch = 128;
    p.lr = 5e-3f;
    struct si_train_layer easy = {0}, hard = {0};
    CHECK(si_train_adaptive(s, 0, &p, &easy, err, sizeof err) == SI_OK, "adaptive easy: %s", err);
    CHECK(si_train_adaptive(s, 1, &p, &hard, err, sizeof err) == SI_OK, "adaptive hard: %s", err);
    printf("adaptive width: easy layer r %d recall %.4f (%d trials), hard layer r %d recall %.4f "
           "(%d trials)\n",
           (int)easy.rank, easy.after.recall, (int)easy.n_trials, (int)hard.rank,
           hard.after.recall, (int)hard.n_trials);
    CHECK(easy.rank % 8 == 0 && hard.rank % 8 == 0, "widths %d, %d: not multiples of the step",
          (int)easy.rank, (int)hard.rank);
    CHECK(easy.rank < hard.rank, "the easy layer got width %d, the hard one %d", (int)easy.rank,
          (int)hard.rank);
    CHECK(easy.after.recall >= p.target_recall, "easy layer: recall %.4f below the target",
          easy.after.recall);
    CHECK(hard.after.recall >= p.target_recall || hard.rank == p.rank_max,
          "hard layer: recall %.4f below the target at width %d below the maximum",
          hard.after.recall, (int)hard.rank);
    /* The smallest passing width: one step narrower fails (trained alike). */
    if (easy.rank > p.rank_min) {
        struct si_train_layer nar = {0};
        CHECK(si_train_fit(s, 0, easy.rank - p.rank_step, &p, &nar, err, sizeof err) == SI_OK,
              "fit: %s", err);
        CHECK(nar.after.recall < p.target_recall, "width %d also reaches recall %.4f",
              (int)nar.rank, nar.after.recall);
        si_train_layer_clear(&nar);
    }
    si_train_layer_clear(&easy);
    si_train_layer_clear(&hard);

    /* Bad parameters. */
    struct si_train_layer t = {0};
    CHECK(si_train_fit(s, 0, 0, &p, &t, err, sizeof err) == SI_E_INVALID, "width 0 accepted");
    CHECK(si_train_fit(s, 2, 8, &p, &t, err, sizeof err) == SI_E_INVALID, "layer 2 accepted");
    struct si_train_params bad = p;
    bad.holdout = 1.0;
    CHECK(si_train_fit(s, 0, 8, &bad, &t, err, sizeof err) == SI_E_INVALID, "holdout 1 accepted");
    bad = p;
    bad.rank_min = 136;
    CHECK(si_train_adaptive(s, 0, &bad, &t, err, sizeof err) == SI_E_INVALID,
          "min width above max accepted");
    printf("refused as expected: %s\n", err);
    CHECK(t.fc1 == NULL && t.fc2 == NULL, "weights left after an error");
    si_train_samples_free(s);
}

/* The threshold for a predicted sparsity, on hand-made predictors whose
 * outputs are known: h = relu(x_0) = 1, z_i = i - 3.5 in layer 0 and
 * 2 (i - 3.5) in layer 1, the same for every sample. */
static void test_threshold(void)
{
    const int32_t nl = 2, d = 4, ff = 8, n = 10;
    char err[256];
    struct si_train_samples *s = NULL;
    CHECK(si_train_samples_init(&s, nl, d, ff, n, err, sizeof err) == SI_OK, "init: %s", err);
    if (s == NULL)
        return;
    const float x[4] = {1, 0.5f, -2, 3};
    uint8_t act[8] = {0};
    for (int32_t k = 0; k < n; k++) {
        for (int32_t l = 0; l < nl; l++)
            si_train_samples_set(s, l, x, act);
        s->n++;
    }
    struct si_train_layer L[2] = {{0}};
    for (int32_t l = 0; l < nl; l++) {
        L[l].rank = 1;
        L[l].fc1 = calloc((size_t)d, sizeof(float));
        L[l].fc2 = malloc((size_t)ff * sizeof(float));
        L[l].fc1[0] = 1;
        for (int32_t i = 0; i < ff; i++)
            L[l].fc2[i] = (float)(l + 1) * ((float)i - 3.5f);
    }
    /* Values -7 -5 -3.5 -3 -2.5 -1.5 -1 -0.5 0.5 1 1.5 2.5 3 3.5 5 7, each
     * n times: a quarter lies below -2.5, a half below 0. */
    float T = 0;
    double got = 0;
    CHECK(si_train_threshold_for_sparsity(s, L, 0.25, &T, &got, err, sizeof err) == SI_OK,
          "threshold: %s", err);
    CHECK(T == -2.5f && got == 0.25, "S 0.25: threshold %g skips %g (want -2.5, 0.25)", (double)T,
          got);
    CHECK(si_train_threshold_for_sparsity(s, L, 0.5, &T, &got, err, sizeof err) == SI_OK,
          "threshold: %s", err);
    CHECK(T > -0.5f && T <= 0.5f && got == 0.5, "S 0.5: threshold %g skips %g", (double)T, got);
    /* Not reachable exactly: the most that stays at or below S. */
    CHECK(si_train_threshold_for_sparsity(s, L, 0.3, &T, &got, err, sizeof err) == SI_OK,
          "threshold: %s", err);
    CHECK(T == -2.5f && got == 0.25, "S 0.3: threshold %g skips %g", (double)T, got);
    /* Outputs beyond the histogram's range: z_i = 100 (i - 3.5), 3 of 8
     * below -64. */
    for (int32_t l = 0; l < nl; l++)
        for (int32_t i = 0; i < ff; i++)
            L[l].fc2[i] = 100.0f * ((float)i - 3.5f);
    CHECK(si_train_threshold_for_sparsity(s, L, 0.25, &T, &got, err, sizeof err) == SI_OK,
          "threshold: %s", err);
    CHECK(T == -FLT_MAX && got == 0, "S 0.25, 37.5%% below the range: threshold %g skips %g",
          (double)T, got);
    CHECK(si_train_threshold_for_sparsity(s, L, 0.4, &T, &got, err, sizeof err) == SI_OK,
          "threshold: %s", err);
    CHECK(T == -50.0f && got == 0.375, "S 0.4: threshold %g skips %g (want -50, 0.375)",
          (double)T, got);
    CHECK(si_train_threshold_for_sparsity(s, L, 1.0, &T, &got, err, sizeof err) == SI_E_INVALID,
          "sparsity 1 accepted");
    free(L[1].fc1);
    L[1].fc1 = NULL;
    CHECK(si_train_threshold_for_sparsity(s, L, 0.5, &T, &got, err, sizeof err) == SI_E_INVALID,
          "a layer without predictor accepted");
    printf("predictor threshold for a sparsity: refused as expected: %s\n", err);
    for (int32_t l = 0; l < nl; l++)
        si_train_layer_clear(&L[l]);
    si_train_samples_free(s);
}

/* The predictor's outputs from the trained floats: y = fc2 . relu(fc1 . x). */
static void float_outputs(const struct si_train_layer *L, const float *x, int32_t d, int32_t ff,
                          float *y)
{
    float *h = malloc((size_t)L->rank * sizeof *h);
    for (int32_t j = 0; j < L->rank; j++) {
        float a = 0;
        for (int32_t k = 0; k < d; k++)
            a += L->fc1[(size_t)j * d + k] * x[k];
        h[j] = a > 0 ? a : 0;
    }
    for (int32_t i = 0; i < ff; i++) {
        float a = 0;
        for (int32_t j = 0; j < L->rank; j++)
            a += L->fc2[(size_t)i * L->rank + j] * h[j];
        y[i] = a;
    }
    free(h);
}

/* The predictor's choice from the trained floats: y >= 0. */
static void float_predict(const struct si_train_layer *L, const float *x, int32_t d, int32_t ff,
                          uint8_t *out)
{
    float *y = malloc((size_t)ff * sizeof *y);
    float_outputs(L, x, d, ff, y);
    for (int32_t i = 0; i < ff; i++)
        out[i] = y[i] >= 0;
    free(y);
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Layer l of a SiLU F32 model: the share of sum v^2, v = |silu(gate . x)|
 * over the samples' pairs, that falls in the pairs the predictor L skips
 * when it skips a share S of them (its lowest outputs). */
static double skipped_energy(const struct si_model *m, const struct si_train_samples *s, int32_t l,
                             const struct si_train_layer *L, double S)
{
    const int32_t d = s->n_embd, ff = s->n_ff;
    const size_t pairs = (size_t)s->n * (size_t)ff;
    float *y = malloc(pairs * sizeof *y), *v = malloc(pairs * sizeof *v);
    float *sorted = malloc(pairs * sizeof *sorted), *x = malloc((size_t)d * sizeof *x);
    const float *wg = m->w.layers[l].ffn_gate.data;
    for (int64_t k = 0; k < s->n; k++) {
        const uint16_t *xs = s->x + ((size_t)l * (size_t)s->cap + (size_t)k) * (size_t)d;
        for (int32_t j = 0; j < d; j++)
            x[j] = si_fp16_to_fp32(xs[j]);
        float_outputs(L, x, d, ff, y + (size_t)k * ff);
        for (int32_t i = 0; i < ff; i++) {
            float g = 0;
            for (int32_t q = 0; q < d; q++)
                g += wg[(size_t)i * d + q] * x[q];
            v[(size_t)k * ff + i] = fabsf(g / (1.0f + expf(-g)));
        }
    }
    memcpy(sorted, y, pairs * sizeof *y);
    qsort(sorted, pairs, sizeof *sorted, cmp_float);
    const float T = sorted[(size_t)(S * (double)pairs)];
    double all = 0, skipped = 0;
    for (size_t q = 0; q < pairs; q++) {
        all += (double)v[q] * v[q];
        if (y[q] < T)
            skipped += (double)v[q] * v[q];
    }
    free(y), free(v), free(sorted), free(x);
    return skipped / all;
}

/* The samples of toks collected on m in two calls, stopping at the room,
 * and their masks against the profiler's counts of the same tokens. */
static struct si_train_samples *collect_samples(const struct si_model *m, const int32_t *toks,
                                                struct si_ref_params rp)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, d = m->hp.n_embd, ff = m->hp.n_ff;
    /* Collect, in two calls, and stop at the room. */
    struct si_train_samples *s = NULL;
    CHECK(si_train_samples_init(&s, nl, d, ff, N_TOK - 100, err, sizeof err) == SI_OK, "init: %s",
          err);
    const enum si_active_rule G = SI_ACTIVE_GATE;
    CHECK(si_train_collect(s, m, ref_runner(rp), G, NULL, toks, 256, err, sizeof err) == SI_OK, "collect: %s",
          err);
    CHECK(si_train_collect(s, m, ref_runner(rp), G, NULL, toks + 256, N_TOK - 256, err, sizeof err) == SI_OK,
          "collect: %s", err);
    CHECK(s->n == N_TOK - 100, "%lld samples kept, room for %d", (long long)s->n, N_TOK - 100);
    /* The masks against the profiler's counts of the same tokens in the same windows. */
    struct si_profile *p = NULL;
    si_profile_init(&p, nl, ff, err, sizeof err);
    si_profile_collect(p, m, ref_runner(rp), toks, 256, err, sizeof err);
    si_profile_collect(p, m, ref_runner(rp), toks + 256, N_TOK - 356, err, sizeof err);
    int64_t diff = 0, pos = 0;
    for (int32_t l = 0; l < nl; l++)
        for (int32_t i = 0; i < ff; i++) {
            int64_t c = 0;
            for (int64_t k = 0; k < s->n; k++)
                c += si_train_sample_active(s, l, k, i);
            diff += c != p->counts[(size_t)l * ff + i];
            pos += c;
        }
    CHECK(diff == 0, "%lld neurons' sample masks disagree with the profile", (long long)diff);
    printf("collected %lld samples, active share %.4f\n", (long long)s->n,
           (double)pos / ((double)s->n * nl * ff));
    si_profile_free(p);
    return s;
}

/* The samples file (samp_path) round trip: the same samples back, the
 * attention's input kind, an unknown input kind refused. */
static void samples_round_trip(struct si_train_samples *s, const struct si_model *m,
                               const char *samp_path)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, d = m->hp.n_embd;
    const enum si_active_rule G = SI_ACTIVE_GATE;
    /* Samples file round trip. */
    CHECK(si_train_samples_write(s, G, NULL, 0, samp_path, err, sizeof err) == SI_OK, "write: %s",
          err);
    struct si_train_samples *s2 = NULL;
    float *thr = NULL;
    double tgt = -1;
    enum si_active_rule rule;
    CHECK(si_train_samples_read(&s2, &rule, &thr, &tgt, samp_path, m, err, sizeof err) == SI_OK,
          "read: %s", err);
    if (s2 != NULL) {
        CHECK(s2->n == s->n && thr == NULL, "samples read back: n %lld", (long long)s2->n);
        bool same = true;
        for (int32_t l = 0; l < nl; l++) {
            same &= !memcmp(s2->x + (size_t)l * s2->cap * d, s->x + (size_t)l * s->cap * d,
                            (size_t)s->n * d * 2);
            same &= !memcmp(s2->mask + (size_t)l * s2->cap * s->mask_bytes,
                            s->mask + (size_t)l * s->cap * s->mask_bytes,
                            (size_t)s->n * s->mask_bytes);
        }
        CHECK(same, "samples differ after the round trip");
    }
    si_train_samples_free(s2);
    s2 = NULL;
    free(thr);
    thr = NULL;
    /* Samples of the attention's input say so; an input kind of neither
     * name is refused (the file's "layer" turned into "later"). */
    s->input = SI_PRED_LAYER;
    CHECK(si_train_samples_write(s, G, NULL, 0, samp_path, err, sizeof err) == SI_OK, "write: %s",
          err);
    s->input = SI_PRED_FFN;
    CHECK(si_train_samples_read(&s2, &rule, &thr, &tgt, samp_path, m, err, sizeof err) == SI_OK &&
              s2 != NULL && s2->input == SI_PRED_LAYER,
          "lookahead samples read back: %s", err);
    si_train_samples_free(s2);
    s2 = NULL;
    FILE *sf = fopen(samp_path, "r+b");
    char head[4096];
    const size_t got = sf != NULL ? fread(head, 1, sizeof head, sf) : 0;
    const char *key = memmem(head, got, "starinfer.samples.input", 23);
    const char *val = key != NULL ? memmem(key, got - (size_t)(key - head), "layer", 5) : NULL;
    CHECK(val != NULL, "no samples input key in the file's first %zu bytes", got);
    if (val != NULL) {
        fseek(sf, (long)(val - head) + 2, SEEK_SET);
        fputc('t', sf);
    }
    if (sf != NULL)
        fclose(sf);
    err[0] = '\0';
    CHECK(si_train_samples_read(&s2, &rule, &thr, &tgt, samp_path, m, err, sizeof err) ==
                  SI_E_FORMAT &&
              s2 == NULL && strstr(err, "starinfer.samples.input not ffn, layer or residual") != NULL,
          "an unknown samples input: '%s'", err);
    si_train_samples_free(s2);
    free(thr);
}

/* Each layer's predictor of width 32 trained into L[l] (the loss lowered,
 * recall raised); a second fit of layer 1 on 3 threads, the same weights. */
static void fit_layers(const struct si_train_samples *s, const struct si_model *m,
                       struct si_train_layer *L)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, d = m->hp.n_embd, ff = m->hp.n_ff;
    /* Training lowers the loss and raises recall; the same seed, the same
     * weights, whatever the number of threads of the elementwise steps (one
     * here, three for the second fit). */
    struct si_train_params tp = si_train_default_params();
    tp.threads = 1;
    tp.epochs = 20;
    tp.batch = 64;
    tp.lr = 5e-3f;
    struct si_train_layer again = {0};
    for (int32_t l = 0; l < nl; l++) {
        CHECK(si_train_fit(s, l, 32, &tp, &L[l], err, sizeof err) == SI_OK, "fit: %s", err);
        printf("layer %d, width 32: held-out loss %.4f -> %.4f, recall %.4f -> %.4f, precision "
               "%.4f, predicted sparsity %.4f\n",
               (int)l, L[l].before.loss, L[l].after.loss, L[l].before.recall, L[l].after.recall,
               L[l].after.precision, L[l].after.pred_sparsity);
        CHECK(L[l].after.loss < 0.5 * L[l].before.loss, "loss %.4f -> %.4f", L[l].before.loss,
              L[l].after.loss);
        CHECK(L[l].after.recall > L[l].before.recall && L[l].after.recall > 0.8,
              "recall %.4f -> %.4f", L[l].before.recall, L[l].after.recall);
        CHECK(L[l].after.pred_sparsity > 0.7, "predicted sparsity %.4f (planted 0.9)",
              L[l].after.pred_sparsity);
    }
    struct si_train_params tp3 = tp;
    tp3.threads = 3;
    CHECK((size_t)tp.batch * (size_t)ff > 2 * 4096, "the batch's pairs fit in one chunk: "
          "the threads would not be tested");
    CHECK(si_train_fit(s, 1, 32, &tp3, &again, err, sizeof err) == SI_OK, "fit: %s", err);
    CHECK(again.fc1 != NULL && L[1].fc1 != NULL &&
              !memcmp(again.fc1, L[1].fc1, (size_t)32 * d * sizeof(float)) &&
              !memcmp(again.fc2, L[1].fc2, (size_t)ff * 32 * sizeof(float)) &&
              again.train_loss == L[1].train_loss,
          "a second fit with the same seed (3 threads, not 1) gave other weights or loss");
    si_train_layer_clear(&again);
}

/* The model pm written from m with the F32 predictors L: PowerInfer's
 * tensor names and shapes, the trained floats, every other tensor as it was. */
static void check_written(const struct si_model *m, const struct si_model *pm,
                          const struct si_train_layer *L)
{
    const int32_t nl = m->hp.n_layer, d = m->hp.n_embd, ff = m->hp.n_ff;
    CHECK(pm->has_predictor && pm->predictor_threshold == 0.0f, "no predictor read back");
    CHECK(pm->gguf->n_tensors == m->gguf->n_tensors, "%llu tensors, the input had %llu",
          (unsigned long long)pm->gguf->n_tensors, (unsigned long long)m->gguf->n_tensors);
    CHECK(si_gguf_find_key(pm->gguf, "powerinfer.sparse_threshold") >= 0,
          "no powerinfer.sparse_threshold");
    CHECK(!pm->gguf->powerinfer, "GGUF in, PWRI out");
    for (int32_t l = 0; l < nl; l++) {
        char n1[64], n2[64];
        snprintf(n1, sizeof n1, "blk.%d.fc1.weight", (int)l);
        snprintf(n2, sizeof n2, "blk.%d.fc2.weight", (int)l);
        const int64_t i1 = si_gguf_find_tensor(pm->gguf, n1);
        const int64_t i2 = si_gguf_find_tensor(pm->gguf, n2);
        CHECK(i1 >= 0 && i2 >= 0, "%s / %s missing", n1, n2);
        if (i1 < 0 || i2 < 0)
            continue;
        const struct si_gguf_tensor *t1 = &pm->gguf->tensors[i1], *t2 = &pm->gguf->tensors[i2];
        CHECK(t1->n_dims == 2 && t1->ne[0] == d && t1->ne[1] == 32, "%s shape {%lld, %lld}", n1,
              (long long)t1->ne[0], (long long)t1->ne[1]);
        CHECK(t2->n_dims == 2 && t2->ne[0] == 32 && t2->ne[1] == ff, "%s shape {%lld, %lld}", n2,
              (long long)t2->ne[0], (long long)t2->ne[1]);
        CHECK(t1->type == SI_TYPE_F32 && !memcmp(t1->data, L[l].fc1, t1->nbytes),
              "%s: not the trained floats", n1);
        CHECK(t2->type == SI_TYPE_F32 && !memcmp(t2->data, L[l].fc2, t2->nbytes),
              "%s: not the trained floats", n2);
    }
    /* Every other tensor copied as it was. */
    int64_t changed = 0;
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
        const struct si_gguf_tensor *a = &m->gguf->tensors[i];
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)a->name.len, a->name.data);
        if (strstr(name, ".fc1.") || strstr(name, ".fc2."))
            continue;
        const int64_t j = si_gguf_find_tensor(pm->gguf, name);
        changed += j < 0 || pm->gguf->tensors[j].nbytes != a->nbytes ||
                   memcmp(pm->gguf->tensors[j].data, a->data, a->nbytes);
    }
    CHECK(changed == 0, "%lld tensors not copied as they were", (long long)changed);
}

/* The reference's predictor mode on pm (m with the predictors L) picks
 * what the trained floats pick, on inputs drawn from the generator *x. */
static void check_predictions(const struct si_model *m, const struct si_model *pm,
                              const struct si_train_layer *L, const int32_t *toks, uint64_t *x)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, d = m->hp.n_embd, ff = m->hp.n_ff;
    /* The reference's predictor mode picks what the floats pick. */
    struct si_ref_params pr = si_ref_default_params();
    pr.n_ctx = WINDOW;
    pr.act_quant = false;
    pr.predictor = true;
    struct si_ref *r = NULL;
    CHECK(si_ref_init(&r, pm, pr, err, sizeof err) == SI_OK, "ref init: %s", err);
    int64_t differ = 0;
    uint8_t *want = malloc((size_t)ff);
    for (int t = 0; r != NULL && t < 40; t++)
        CHECK(si_ref_eval(r, toks[t]) == SI_OK, "predictor-mode eval");
    /* Per layer on a fixed input: si_ref_predict against float_predict. */
    for (int32_t l = 0; r != NULL && l < nl; l++) {
        float *xin = malloc((size_t)d * sizeof *xin), *r1 = malloc(32 * sizeof *r1);
        float *y = malloc((size_t)ff * sizeof *y);
        uint8_t *got = malloc((size_t)ff);
        for (int k = 0; k < 50; k++) {
            for (int32_t j = 0; j < d; j++)
                xin[j] = gauss(x);
            si_ref_predict(&pm->w.layers[l].fc1, &pm->w.layers[l].fc2, 0.0f, false, NULL, xin, r1,
                           y, got);
            float_predict(&L[l], xin, d, ff, want);
            for (int32_t i = 0; i < ff; i++)
                differ += got[i] != want[i] && fabsf(y[i]) > 1e-4f;
        }
        free(xin);
        free(r1);
        free(y);
        free(got);
    }
    CHECK(differ == 0, "%lld predictions differ from the trained floats'", (long long)differ);
    free(want);
    si_ref_free(r);
}

/* eval on pm (m with predictors): confusion counts over every evaluated
 * token, perplexity in dense and predictor modes, parameter counts, and
 * the errors. */
static void check_eval(const struct si_model *m, const struct si_model *pm, const int32_t *toks)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, d = m->hp.n_embd, ff = m->hp.n_ff;
    /* eval: confusion counts over every evaluated token, modes. */
    struct si_eval_confusion conf[2] = {0};
    struct si_eval_ppl dense, pred;
    struct si_ref_params ep = si_ref_default_params();
    ep.n_ctx = 64;
    struct si_eval_params cp = {.bos = -1, .conf = conf}, np = {.bos = -1};
    CHECK(si_eval_perplexity(pm, ep, toks, 256, &cp, &dense, err, sizeof err) == SI_OK,
          "eval dense: %s", err);
    ep.predictor = true;
    CHECK(si_eval_perplexity(pm, ep, toks, 256, &np, &pred, err, sizeof err) == SI_OK,
          "eval predictor: %s", err);
    for (int32_t l = 0; l < nl; l++) {
        const struct si_eval_confusion *c = &conf[l];
        CHECK(c->tp + c->fp + c->fn + c->tn == 4 * 63 * ff, "layer %d: %lld pairs", (int)l,
              (long long)(c->tp + c->fp + c->fn + c->tn));
        printf("eval layer %d: recall %.4f precision %.4f predicted sparsity %.4f "
               "(true %.4f)\n",
               (int)l, si_eval_recall(c), si_eval_precision(c), si_eval_pred_sparsity(c),
               si_eval_true_sparsity(c));
        CHECK(si_eval_recall(c) > 0.8, "layer %d: eval recall %.4f", (int)l, si_eval_recall(c));
    }
    printf("perplexity: dense %.4f (%.4f of FFN neurons computed), predictor %.4f (%.4f)\n",
           dense.ppl, dense.ffn_computed, pred.ppl, pred.ffn_computed);
    CHECK(dense.n_scored == 4 * 31 && pred.n_scored == dense.n_scored, "scored %lld",
          (long long)dense.n_scored);
    CHECK(isfinite(dense.ppl) && isfinite(pred.ppl) && dense.ppl > 1, "perplexities");
    CHECK(pred.ffn_computed < dense.ffn_computed, "predictor mode computes %.4f, dense %.4f",
          pred.ffn_computed, dense.ffn_computed);
    const int64_t pp = si_eval_predictor_params(pm), mp = si_eval_model_params(pm);
    CHECK(pp == (int64_t)nl * 32 * (d + ff), "predictor params %lld", (long long)pp);
    CHECK(mp == si_eval_model_params(m), "model params %lld vs %lld", (long long)mp,
          (long long)si_eval_model_params(m));
    /* Errors: too few tokens, a bad token, a model without predictors. */
    struct si_eval_ppl junk;
    ep.predictor = false;
    CHECK(si_eval_perplexity(pm, ep, toks, 63, &np, &junk, err, sizeof err) == SI_E_INVALID,
          "fewer tokens than a chunk accepted");
    int32_t bad[64];
    memcpy(bad, toks, sizeof bad);
    bad[5] = m->hp.n_vocab;
    CHECK(si_eval_perplexity(pm, ep, bad, 64, &np, &junk, err, sizeof err) == SI_E_INVALID,
          "a token outside the vocabulary accepted");
}

/* The predictors L written quantized (Q8_0) in PowerInfer's format to
 * pwri_path and read back; a width that Q8_0's rows do not fit refused. */
static void check_pwri(const struct si_model *m, struct si_train_layer *L, const char *pwri_path)
{
    char err[512];
    /* Quantized and PWRI: q8_0 rows of width 32; a width that does not fit. */
    struct si_train_write_params wp = {
        .type = SI_TYPE_Q8_0, .powerinfer = true, .threshold = 0.25f};
    struct si_model *pm = NULL;
    CHECK(si_train_write(m, L, &wp, pwri_path, err, sizeof err) == SI_OK, "write q8_0: %s", err);
    CHECK(si_model_load(&pm, pwri_path, err, sizeof err) == SI_OK, "load PWRI: %s", err);
    if (pm != NULL) {
        CHECK(pm->gguf->powerinfer && pm->has_predictor, "PWRI with predictors");
        CHECK(pm->w.layers[0].fc1.type == SI_TYPE_Q8_0 && pm->w.layers[1].fc2.type == SI_TYPE_Q8_0,
              "types");
        CHECK(fabsf(pm->predictor_threshold - 0.25f) < 1e-7f, "threshold %g",
              (double)pm->predictor_threshold);
        CHECK(pm->hp.act == SI_ACT_RELU, "activation");
        si_model_free(pm);
    }
    L[0].rank = 16; /* not a multiple of Q8_0's 32 */
    CHECK(si_train_write(m, L, &wp, pwri_path, err, sizeof err) == SI_E_INVALID,
          "a width of 16 written as Q8_0");
    printf("refused as expected: %s\n", err);
    L[0].rank = 32;
}

/* A synthetic llama-relu model: samples collected and round-tripped,
 * predictors trained, written and read back, evaluated. */
static void test_model(void)
{
    char model_path[160], out_path[160], pwri_path[160], samp_path[160], err[512];
    path_in(model_path, sizeof model_path, "relu.gguf");
    path_in(out_path, sizeof out_path, "relu-pred.gguf");
    path_in(pwri_path, sizeof pwri_path, "relu-pwri.gguf");
    path_in(samp_path, sizeof samp_path, "relu.samples");
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    sp.arch = SI_SYNTH_LLAMA_RELU;
    sp.type = SI_TYPE_F32;
    sp.n_layer = 2;
    sp.n_ff = 256;
    sp.seed = 11;
    sp.predictor_rank = 16; /* random predictors, to be replaced */
    int rc = si_synth_write(&sp, model_path, err, sizeof err);
    CHECK(rc == SI_OK, "synth: %s", err);
    struct si_model *m = NULL;
    if (rc == SI_OK)
        CHECK(si_model_load(&m, model_path, err, sizeof err) == SI_OK, "load: %s", err);
    if (m == NULL)
        return;
    const int32_t nl = m->hp.n_layer;

    int32_t toks[N_TOK];
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (int32_t)(lcg(&x) % (uint64_t)m->hp.n_vocab);
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = WINDOW;

    struct si_train_samples *s = collect_samples(m, toks, rp);
    samples_round_trip(s, m, samp_path);
    struct si_train_layer L[2] = {0};
    fit_layers(s, m, L);

    /* Write (F32: the floats exactly), read back through the model loader. */
    struct si_train_write_params wp = {.type = SI_TYPE_F32};
    CHECK(si_train_write(m, L, &wp, out_path, err, sizeof err) == SI_OK, "write: %s", err);
    struct si_model *pm = NULL;
    CHECK(si_model_load(&pm, out_path, err, sizeof err) == SI_OK, "load: %s", err);
    if (pm != NULL) {
        check_written(m, pm, L);
        check_predictions(m, pm, L, toks, &x);
        check_eval(m, pm, toks);
        si_model_free(pm);
    }
    check_pwri(m, L, pwri_path);

    for (int32_t l = 0; l < nl; l++)
        si_train_layer_clear(&L[l]);
    si_train_samples_free(s);
    si_model_free(m);
    unlink(model_path);
    unlink(out_path);
    unlink(pwri_path);
    unlink(samp_path);
}

/* On a SiLU model: collection without thresholds refused; the CATS
 * thresholds of 0.5 (into *c and *p) leave about half of the samples'
 * pairs active in s. */
static void collect_cats(const struct si_model *m, struct si_train_samples *s, const int32_t *toks,
                         struct si_ref_params rp, struct si_profile_calib **c,
                         struct si_profile **p)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, ff = m->hp.n_ff;
    const enum si_active_rule G = SI_ACTIVE_GATE;
    CHECK(si_train_collect(s, m, ref_runner(rp), G, NULL, toks, 200, err, sizeof err) == SI_E_INVALID,
          "a SiLU model collected without thresholds");
    printf("refused as expected: %s\n", err);
    /* The CATS thresholds of 0.5: about half of the pairs active. */
    si_profile_calib_init(c, m, err, sizeof err);
    si_profile_calib_collect(*c, m, ref_runner(rp), toks, 200, err, sizeof err);
    si_profile_init(p, nl, ff, err, sizeof err);
    CHECK(si_profile_set_thresholds(*p, *c, 0.5, NULL, err, sizeof err) == SI_OK, "thresholds: %s",
          err);
    CHECK(si_train_collect(s, m, ref_runner(rp), G, (*p)->thresholds, toks, 200, err, sizeof err) ==
              SI_OK,
          "collect: %s", err);
    int64_t pos = 0;
    for (int64_t k = 0; k < s->n; k++)
        for (int32_t i = 0; i < ff; i++)
            pos += si_train_sample_active(s, 1, k, i);
    const double share = (double)pos / ((double)s->n * ff);
    printf("SiLU model, CATS 0.5: layer 1 active share %.4f\n", share);
    CHECK(share > 0.45 && share < 0.55, "active share %.4f at target sparsity 0.5", share);
}

/* si_active_calib on the SiLU model m: the gate rule's thresholds are the
 * profile p's; the output rule's leave the target share inactive, and the
 * oracle computes exactly the rest. */
static void check_active_calib(const struct si_model *m, const int32_t *toks,
                               struct si_ref_params rp, const struct si_profile *p)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, d = m->hp.n_embd, ff = m->hp.n_ff;
    /* si_active_calib: for the gate rule the profile's thresholds; for the
     * output rule, thresholds that leave the target share inactive, and the
     * oracle computing exactly the rest. */
    struct si_active_calib *ac = NULL, *oc = NULL;
    float tg[2], to[2];
    CHECK(si_active_calib_init(&ac, m, SI_ACTIVE_GATE, err, sizeof err) == SI_OK &&
              si_active_calib_init(&oc, m, SI_ACTIVE_OUTPUT, err, sizeof err) == SI_OK,
          "calib init: %s", err);
    CHECK(si_active_calib_collect(ac, m, ref_runner(rp), toks, 200, err, sizeof err) == SI_OK &&
              si_active_calib_collect(oc, m, ref_runner(rp), toks, 200, err, sizeof err) == SI_OK,
          "calib collect: %s", err);
    CHECK(si_active_calib_thresholds(ac, 0.5, tg, err, sizeof err) == SI_OK &&
              si_active_calib_thresholds(oc, 0.4, to, err, sizeof err) == SI_OK,
          "calib thresholds: %s", err);
    CHECK(!memcmp(tg, p->thresholds, sizeof tg), "gate-rule thresholds %g %g, the profile's %g %g",
          (double)tg[0], (double)tg[1], (double)p->thresholds[0], (double)p->thresholds[1]);
    CHECK(si_active_calib_thresholds(oc, 1.0, to, err, sizeof err) == SI_E_INVALID,
          "target sparsity 1 accepted");
    si_active_calib_thresholds(oc, 0.4, to, err, sizeof err);
    struct si_train_samples *so = NULL;
    si_train_samples_init(&so, nl, d, ff, 200, err, sizeof err);
    CHECK(si_train_collect(so, m, ref_runner(rp), SI_ACTIVE_OUTPUT, to, toks, 200, err, sizeof err) == SI_OK,
          "collect output rule: %s", err);
    int64_t pos = 0;
    for (int64_t k = 0; k < so->n; k++)
        for (int32_t i = 0; i < ff; i++)
            pos += si_train_sample_active(so, 0, k, i);
    const double oshare = (double)pos / ((double)so->n * ff);
    struct si_eval_ppl orc;
    struct si_ref_params ep = si_ref_default_params();
    ep.n_ctx = 64;
    struct si_eval_params op = {.bos = -1, .rule = SI_ACTIVE_OUTPUT, .thresholds = to,
                                .oracle = true};
    CHECK(si_eval_perplexity(m, ep, toks, 192, &op, &orc, err, sizeof err) == SI_OK,
          "oracle: %s", err);
    printf("output rule, target 0.4: layer 0 active share %.4f, oracle computes %.4f\n", oshare,
           orc.ffn_computed);
    CHECK(oshare > 0.55 && oshare < 0.65, "output rule: active share %.4f at target 0.4", oshare);
    CHECK(orc.ffn_computed > 0.55 && orc.ffn_computed < 0.65, "oracle computes %.4f",
          orc.ffn_computed);
    si_train_samples_free(so);
    si_active_calib_free(ac);
    si_active_calib_free(oc);
}

/* The cost-weighted loss on the SiLU model m's samples s (tp: the balanced
 * fit's parameters, p: the gate thresholds): refused without the model,
 * with cost_power 0, without thresholds, for the adaptive width; then its
 * predictors skip less of the energy than the balanced ones. */
static void check_cost_loss(const struct si_model *m, const struct si_train_samples *s,
                            struct si_train_params tp, const struct si_profile *p)
{
    char err[512];
    const int32_t nl = m->hp.n_layer;
    const enum si_active_rule G = SI_ACTIVE_GATE;
    /* The cost-weighted loss: it needs the model; trained at the same width
     * and epochs, its predictors skip less of the rule's energy (sum v^2)
     * than the balanced ones at the same sparsity, which is what it is for. */
    struct si_train_params bp = tp, cp = tp;
    bp.epochs = cp.epochs = 100;
    cp.loss = SI_TRAIN_LOSS_COST;
    struct si_train_layer B = {0}, C = {0};
    CHECK(si_train_fit(s, 1, 32, &cp, &C, err, sizeof err) == SI_E_INVALID,
          "cost-weighted loss trained without the model");
    printf("cost-weighted loss without the model: refused as expected: %s\n", err);
    cp.cost_power = 0.0;
    CHECK(si_train_fit(s, 1, 32, &cp, &C, err, sizeof err) == SI_E_INVALID,
          "cost_power 0 accepted");
    cp.cost_power = 1.0;
    cp.model = m;
    cp.rule = G;
    CHECK(si_train_fit(s, 1, 32, &cp, &C, err, sizeof err) == SI_E_INVALID,
          "cost-weighted loss trained without thresholds");
    printf("cost-weighted loss without thresholds: refused as expected: %s\n", err);
    cp.thresholds = p->thresholds;
    CHECK(si_train_adaptive(s, 1, &cp, &C, err, sizeof err) == SI_E_INVALID,
          "adaptive width under the cost-weighted loss");
    printf("adaptive width under the cost-weighted loss: refused as expected: %s\n", err);
    cp.model = m;
    cp.rule = G;
    cp.thresholds = p->thresholds;
    for (int32_t l = 0; l < nl; l++) {
        CHECK(si_train_fit(s, l, 32, &cp, &C, err, sizeof err) == SI_OK &&
                  si_train_fit(s, l, 32, &bp, &B, err, sizeof err) == SI_OK,
              "fit: %s", err);
        const double eb = skipped_energy(m, s, l, &B, 0.4);
        const double ec = skipped_energy(m, s, l, &C, 0.4);
        printf("layer %d, 40%% skipped: balanced loss skips %.4f of the energy, cost-weighted "
               "%.4f (loss %.4f -> %.4f)\n",
               (int)l, eb, ec, C.before.loss, C.after.loss);
        CHECK(C.after.loss < C.before.loss, "cost-weighted loss %.4f -> %.4f", C.before.loss,
              C.after.loss);
        CHECK(ec < eb, "layer %d: cost-weighted predictor skips %.4f of the energy, balanced %.4f",
              (int)l, ec, eb);
        si_train_layer_clear(&B);
        si_train_layer_clear(&C);
    }
}

/* The SiLU model m with the predictors L written in PowerInfer's format
 * (F16, ffn_down_t added, the gate rule's thresholds p) to out_path and
 * read back: SiLU kept, ffn_down_t ffn_down's, the thresholds stored. */
static void check_silu_written(const struct si_model *m, const struct si_train_layer *L,
                               const struct si_profile *p, const char *out_path)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, d = m->hp.n_embd, ff = m->hp.n_ff;
    struct si_train_write_params wp = {.type = SI_TYPE_F16, .powerinfer = true, .down_t = true,
                                       .rule = SI_ACTIVE_GATE, .thresholds = p->thresholds,
                                       .target_sparsity = 0.5};
    CHECK(si_train_write(m, L, &wp, out_path, err, sizeof err) == SI_OK, "write: %s", err);
    struct si_model *pm = NULL;
    CHECK(si_model_load(&pm, out_path, err, sizeof err) == SI_OK, "load: %s", err);
    if (pm == NULL)
        return;
    CHECK(pm->gguf->powerinfer && pm->hp.act == SI_ACT_SILU,
          "a PWRI SiLU model read back as activation %d", (int)pm->hp.act);
    /* ffn_down_t added: row i is neuron i's column of ffn_down, in F16
     * (PowerInfer's kernel reads ffn_down_t in Q4_0 or F16 only), so each
     * element is ffn_down's rounded to F16 exactly once. */
    int64_t bad_dt = 0;
    for (int32_t l = 0; l < nl; l++) {
        const struct si_tensor *dt = &pm->w.layers[l].ffn_down_t;
        const struct si_tensor *dn = &m->w.layers[l].ffn_down;
        CHECK(dt->data != NULL && dt->type == SI_TYPE_F16 && dt->ne[0] == d && dt->ne[1] == ff,
              "layer %d: ffn_down_t missing or not F16 {%d, %d}", (int)l, (int)d, (int)ff);
        if (dt->data == NULL || dt->type != SI_TYPE_F16)
            continue;
        const uint16_t *a = dt->data;
        const float *b = dn->data;
        for (int32_t i = 0; i < ff; i++)
            for (int32_t o = 0; o < d; o++)
                bad_dt += a[(size_t)i * d + o] != si_fp32_to_fp16(b[(size_t)o * ff + i]);
    }
    CHECK(bad_dt == 0, "%lld ffn_down_t elements are not ffn_down's", (long long)bad_dt);
    float *t = NULL;
    double target = 0;
    enum si_active_rule rule = SI_ACTIVE_OUTPUT;
    CHECK(si_eval_stored_thresholds(pm, &rule, &t, &target, err, sizeof err) == SI_OK &&
              rule == SI_ACTIVE_GATE,
          "stored thresholds: %s", err);
    CHECK(t != NULL && !memcmp(t, p->thresholds, (size_t)nl * sizeof *t) &&
              fabs(target - 0.5) < 1e-6,
          "thresholds read back differ");
    free(t);
    si_model_free(pm);
}

/* A SiLU model: thresholds are required; PWRI keeps SiLU. */
static void test_silu(void)
{
    char model_path[160], out_path[160], err[512];
    path_in(model_path, sizeof model_path, "silu.gguf");
    path_in(out_path, sizeof out_path, "silu-pwri.gguf");
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    sp.arch = SI_SYNTH_LLAMA_SILU;
    sp.type = SI_TYPE_F32;
    sp.n_layer = 2;
    sp.seed = 3;
    struct si_model *m = NULL;
    CHECK(si_synth_write(&sp, model_path, err, sizeof err) == SI_OK, "synth: %s", err);
    CHECK(si_model_load(&m, model_path, err, sizeof err) == SI_OK, "load: %s", err);
    if (m == NULL)
        return;
    const int32_t nl = m->hp.n_layer, d = m->hp.n_embd, ff = m->hp.n_ff;
    int32_t toks[200];
    uint64_t x = 5;
    for (int i = 0; i < 200; i++)
        toks[i] = (int32_t)(lcg(&x) % (uint64_t)m->hp.n_vocab);
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = 64;
    struct si_train_samples *s = NULL;
    si_train_samples_init(&s, nl, d, ff, 200, err, sizeof err);
    struct si_profile_calib *c = NULL;
    struct si_profile *p = NULL;
    collect_cats(m, s, toks, rp, &c, &p);
    check_active_calib(m, toks, rp, p);

    struct si_train_layer L[2] = {0};
    struct si_train_params tp = si_train_default_params();
    tp.epochs = 2;
    for (int32_t l = 0; l < nl; l++)
        CHECK(si_train_fit(s, l, 32, &tp, &L[l], err, sizeof err) == SI_OK, "fit: %s", err);
    check_cost_loss(m, s, tp, p);
    check_silu_written(m, L, p, out_path);
    float *t = NULL;
    double target;
    enum si_active_rule rule;
    CHECK(si_eval_stored_thresholds(m, &rule, &t, &target, err, sizeof err) == SI_E_NOT_FOUND &&
              t == NULL,
          "thresholds found in a model without them");
    for (int32_t l = 0; l < nl; l++)
        si_train_layer_clear(&L[l]);
    si_profile_free(p);
    si_profile_calib_free(c);
    si_train_samples_free(s);
    si_model_free(m);
    unlink(model_path);
    unlink(out_path);
}

int main(void)
{
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    /* One BLAS thread: the same sums in the same order every run. */
    openblas_set_num_threads(1);
    test_adaptive();
    test_threshold();
    test_model();
    test_silu();
    rmdir(dir);
    return test_result();
}
