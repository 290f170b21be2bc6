/*
 * test-forward.c - the reference forward pass against llama.cpp on a real
 * model: greedy continuations of fixed prompts recorded from llama.cpp
 * (tests/data/<name>-greedy.txt; how they were made is written at the top of
 * each file).  The prompt goes in as llama.cpp's driver put it, one batch
 * (si_ref_eval_batch: llama.cpp's arithmetic for a batch), then llama.cpp's
 * tokens are fed back one at a time (teacher forcing).
 *
 * With the AVX2 kernels, at every step our argmax must be llama.cpp's
 * token: the reference computes as llama.cpp's AVX2 CPU build does, op for
 * op (activation conversion, dots and their summation order, SiLU's
 * vectorised exp, GELU's fp16 table, RoPE, flash attention, the batch
 * kernels of a prompt), so the logits are the same bits and the greedy
 * tokens the same even where llama.cpp's own top-2 margin is a few
 * hundredths (the data files list the margins).  The scalar kernels
 * (SI_NO_SIMD=1, or a CPU without AVX2) sum the dots in another order: with
 * them a differing step is accepted at a near-tie, where llama.cpp's own
 * top-2 margin is below NEAR_TIE.
 *
 * Usage: test-forward [DATA-FILE MODEL-ENV-VARIABLE]
 * (default: tests/data/smollm2-greedy.txt and STARINFER_TEST_MODEL)
 */
#include "model/forward.h"
#include "model/model.h"
#include "model/quants.h"
#include "starinfer.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IDS 512
#define NEAR_TIE 0.4f

/* Parse "key: v v v" (ids, or margins when `f` is set) after `key`;
 * returns the count or -1 when the line is not that key's. */
static int parse_list(const char *line, const char *key, int32_t *ids, float *f, int cap)
{
    size_t k = strlen(key);
    if (strncmp(line, key, k) != 0 || line[k] != ':')
        return -1;
    int n = 0;
    const char *p = line + k + 1;
    char *end;
    for (;;) {
        double v = strtod(p, &end);
        if (end == p)
            break;
        if (n < cap) {
            if (f != NULL)
                f[n] = (float)v;
            else
                ids[n] = (int32_t)v;
            n++;
        }
        p = end;
    }
    return n;
}

static int32_t argmax(const float *x, int32_t n, float *margin)
{
    int32_t best = 0, second = -1;
    for (int32_t i = 1; i < n; i++) {
        if (x[i] > x[best]) {
            second = best;
            best = i;
        } else if (second < 0 || x[i] > x[second]) {
            second = i;
        }
    }
    *margin = second >= 0 ? x[best] - x[second] : 0.0f;
    return best;
}

int main(int argc, char **argv)
{
    const char *srcdir = getenv("srcdir");
    char data_path[1024];
    snprintf(data_path, sizeof data_path, "%s/tests/data/smollm2-greedy.txt",
             srcdir != NULL ? srcdir : ".");
    const char *data = argc > 1 ? argv[1] : data_path;
    const char *model_path = getenv(argc > 2 ? argv[2] : "STARINFER_TEST_MODEL");
    if (model_path == NULL || model_path[0] == '\0')
        test_skip("the real model is not available (set STARINFER_TEST_MODEL; tools/install-deps fetches it)");

    FILE *f = fopen(data, "r");
    CHECK(f != NULL, "cannot open %s", data);
    if (f == NULL)
        return test_result();

    struct si_model *m = NULL;
    char err[600];
    int rc = si_model_load(&m, model_path, err, sizeof err);
    CHECK(rc == SI_OK, "%s", err);
    if (rc != SI_OK) {
        fclose(f);
        return test_result();
    }
    struct si_ref *ref = NULL;
    struct si_ref_params p = si_ref_default_params();
    p.n_ctx = MAX_IDS;
    rc = si_ref_init(&ref, m, p, err, sizeof err);
    CHECK(rc == SI_OK, "%s", err);
    const bool strict = strcmp(si_quants_impl(), "avx2") == 0;
    printf("kernels: %s (%s)\n", si_quants_impl(),
           strict ? "every step must be llama.cpp's" : "near-ties may differ");

    char line[16384];
    int32_t prompt[MAX_IDS], want[MAX_IDS];
    float margin_ref[MAX_IDS];
    int n_prompt = -1, n_margin = -1, prompts = 0, exact = 0, steps = 0;
    while (rc == SI_OK && fgets(line, sizeof line, f) != NULL) {
        int n;
        if ((n = parse_list(line, "prompt_ids", prompt, NULL, MAX_IDS)) >= 0) {
            n_prompt = n;
            n_margin = -1;
            continue;
        }
        if ((n = parse_list(line, "# top1-top2 logit margin per step", NULL, margin_ref, MAX_IDS)) >= 0) {
            n_margin = n;
            continue;
        }
        if ((n = parse_list(line, "greedy32", want, NULL, MAX_IDS)) < 0)
            continue;
        CHECK(n_prompt > 0 && n == 32, "malformed block in %s", data);
        if (n_prompt <= 0)
            continue;
        /* The margins follow the ids: read ahead to them. */
        while (n_margin < 0 && fgets(line, sizeof line, f) != NULL)
            n_margin = parse_list(line, "# top1-top2 logit margin per step", NULL, margin_ref, MAX_IDS);
        CHECK(n_margin == n, "prompt %d: no per-step margins in %s", prompts, data);
        si_ref_reset(ref);
        rc = si_ref_eval_batch(ref, prompt, n_prompt);
        CHECK(rc == SI_OK, "prompt %d: evaluation failed", prompts);
        int diffs = 0;
        printf("prompt %d:", prompts);
        for (int i = 0; i < n && rc == SI_OK; i++) {
            float margin;
            int32_t got = argmax(ref->logits, m->hp.n_vocab, &margin);
            printf(" %d", got);
            if (got != want[i]) {
                const float ref_m = i < n_margin ? margin_ref[i] : 0.0f;
                const float behind = ref->logits[got] - ref->logits[want[i]];
                printf("(llama.cpp %d: its margin %.3f, ours %.3f behind)", want[i], ref_m, behind);
                diffs++;
            }
            const float ref_m = i < n_margin ? margin_ref[i] : 0.0f;
            CHECK(got == want[i] || (!strict && ref_m < NEAR_TIE),
                  "prompt %d step %d: %d instead of llama.cpp's %d (llama.cpp's margin %.3f, "
                  "ours %.3f behind)",
                  prompts, i, got, want[i], ref_m, ref->logits[got] - ref->logits[want[i]]);
            rc = si_ref_eval(ref, want[i]);
        }
        printf("\n");
        exact += diffs == 0;
        steps += diffs;
        prompts++;
        n_prompt = -1;
    }
    fclose(f);
    CHECK(prompts >= 5, "only %d prompts in %s", prompts, data);
    printf("%d of %d prompts equal llama.cpp's greedy continuation for 32 tokens; %d steps "
           "differ\n",
           exact, prompts, steps);
    si_ref_free(ref);
    si_model_free(m);
    return test_result();
}
