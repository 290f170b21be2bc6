/*
 * test-long-context.c - attention past SI_ATTN_SPLIT_MIN positions on the
 * engine, against the reference bit for bit.
 *
 * Decoding over 512 positions or more splits the attention over chunks of
 * positions (attn_pos_L.p tasks, merged by attn_o_L.j); a prompt's
 * attention reads each tile of the cache once for up to SI_REF_ROWS tokens
 * (si_ref_attn_group_attend_rows).  Both must give the reference's bits:
 * on a synthetic Q4_0 model (dense mode: llama.cpp's dots, which the
 * engine's decoding and exact prefill reproduce), a prompt crossing 512
 * positions, then greedy decoding across chunk boundaries (768, 1024),
 * the logits compared at every step; and the same decoding after a prompt
 * of 500 tokens, so that the split starts mid-decoding; then with q8_0 and
 * q4_0 caches (written quantized by both, read by the same kernels).
 * Gate mode across 512 positions too: below them its attention groups
 * multiply Wo themselves (fuse_wo), from there attn_o_L.j does; its sums
 * are in another order than the reference's, so its logits are held to
 * test-engine's bound for that (two reordered sums a layer ahead of Q8
 * conversions: 2e-2 of the largest logit), token by token on the
 * reference's greedy path.
 */
#include "graph/engine.h"
#include "graph/runtime.h"
#include "model/forward.h"
#include "model/kernels.h"
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

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* n_prompt tokens, then greedy decoding to position n_end, engine and
 * reference side by side; the number of logits that differ. */
/* Whether the engine's logits pass: the reference's bits in dense mode,
 * within tol in the sparse ones (*worst: the largest error seen). */
static bool logits_ok(const float *a, const float *b, int n, enum si_sparsity mode, double tol,
                      double *worst)
{
    if (mode == SI_SPARSITY_DENSE)
        return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
    const double err = test_rel_err(a, b, n);
    *worst = fmax(*worst, err);
    return err <= tol;
}

static int run(const struct si_model *m, int n_prompt, int n_end, int attn_split, uint32_t kv_type,
               enum si_sparsity mode)
{
    char err[256];
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = 1100;
    rp.type_k = rp.type_v = kv_type;
    struct si_engine_params ep = si_engine_default_params();
    ep.ref = rp;
    ep.prefill = SI_PREFILL_EXACT;
    ep.attn_split = attn_split;
    ep.mode = mode;
    struct si_engine *e = NULL;
    struct si_ref *r = NULL;
    CHECK(si_engine_init(&e, m, ep, err, sizeof err) == SI_OK, "engine: %s", err);
    CHECK(si_ref_init(&r, m, rp, err, sizeof err) == SI_OK, "reference: %s", err);
    if (e == NULL || r == NULL) {
        si_engine_free(e);
        si_ref_free(r);
        return 1;
    }
    const int nv = m->hp.n_vocab;
    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    uint64_t x = 12345;
    for (int i = 0; i < n_prompt; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((x >> 33) % (uint64_t)nv);
    }
    /* The prompt: llama.cpp's tiled attention on both sides (the engine's
     * tokens SI_REF_ROWS at a time, the reference's one by one). */
    si_engine_ref(e)->attn_f32 = true;
    r->attn_f32 = true;
    CHECK(si_engine_eval_batch(e, prompt, n_prompt) == SI_OK, "engine prefill");
    for (int i = 0; i < n_prompt; i++)
        CHECK(si_ref_eval(r, prompt[i]) == SI_OK, "reference at %d", i);
    si_engine_ref(e)->attn_f32 = false;
    r->attn_f32 = false;
    const bool fused = si_engine_wo_fused(e);
    const double tol = fused ? 2e-2 : 1e-2; /* sparse modes (test-engine's decode_tolerance) */
    double worst = 0;
    int bad = !logits_ok(si_engine_logits(e), r->logits, nv, mode, tol, &worst);
    CHECK(!bad, "%d prompt tokens: the engine's logits are not the reference's", n_prompt);
    for (int pos = n_prompt; pos < n_end; pos++) {
        const int32_t t = argmax(r->logits, nv);
        CHECK(si_engine_eval(e, t) == SI_OK, "engine eval at %d", pos);
        CHECK(si_ref_eval(r, t) == SI_OK, "reference eval at %d", pos);
        if (!logits_ok(si_engine_logits(e), r->logits, nv, mode, tol, &worst) && bad++ < 3)
            fprintf(stderr, "position %d: the engine's logits are not the reference's\n", pos);
    }
    const struct si_engine_stats st = si_engine_get_stats(e);
    printf("prompt %d, decoded to %d, %s, %s cache, %d worker(s), attention split %d%s: %lld "
           "tasks, %d step(s) differ",
           n_prompt, n_end, mode == SI_SPARSITY_DENSE ? "dense" : "gate", si_type_name(kv_type),
           (int)si_runtime_ncpu(), attn_split, fused ? " (groups multiply Wo)" : "",
           (long long)st.tasks, bad);
    if (mode != SI_SPARSITY_DENSE)
        printf(", logits within %.2e (tolerance %.0e)", worst, tol);
    printf("\n");
    CHECK(mode == SI_SPARSITY_DENSE || fused, "gate mode with the attention split: Wo not fused");
    free(prompt);
    si_engine_free(e);
    si_ref_free(r);
    return bad;
}

int main(void)
{
    struct si_runtime rt;
    char err[256], path[] = "/tmp/si-test-long-XXXXXX";
    if (si_runtime_start(&rt, false, err, sizeof err) != SI_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct si_synth_params p = si_synth_default_params(); /* tiny: 4 heads, 2 kv heads */
    p.n_ctx = 2048;
    p.n_embd = 128;        /* heads of 32: whole blocks of a quantized cache */
    p.type = SI_TYPE_Q4_0; /* llama.cpp's dots, which dense decoding reproduces */
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    struct si_model *m = NULL;
    CHECK(si_synth_write(&p, path, err, sizeof err) == SI_OK, "synth: %s", err);
    CHECK(si_model_load(&m, path, err, sizeof err) == SI_OK, "load: %s", err);
    unlink(path);
    if (m != NULL) {
        const int nw = (int)si_runtime_ncpu();
        /* the split over positions takes the attention's split tasks: as
         * many as the workers (at least 2, so that chunks are shared) */
        const int split = nw > 1 ? nw : 2;
        const enum si_sparsity D = SI_SPARSITY_DENSE;
        CHECK(run(m, 600, 1040, split, SI_TYPE_F16, D) == 0, "prompt 600: logits differ");
        CHECK(run(m, 500, 530, split, SI_TYPE_F16, D) == 0, "prompt 500: logits differ");
        CHECK(run(m, 700, 720, 1, SI_TYPE_F16, D) == 0, "one attention task: logits differ");
        /* quantized caches: the tiled attention from the first position */
        CHECK(run(m, 100, 600, split, SI_TYPE_Q8_0, D) == 0, "q8_0 cache: logits differ");
        CHECK(run(m, 530, 560, split, SI_TYPE_Q4_0, D) == 0, "q4_0 cache: logits differ");
        /* gate mode: Wo in the groups below 512 positions, in attn_o above */
        CHECK(run(m, 490, 540, split, SI_TYPE_F16, SI_SPARSITY_GATE) == 0,
              "gate mode across 512: logits differ");
        si_model_free(m);
    }
    si_runtime_stop(&rt);
    return test_result();
}
