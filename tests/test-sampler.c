/*
 * test-sampler.c - each stage of the sampling chain against its definition,
 * and the draw against the softmax distribution it should follow.
 */
#include "model/sampler.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NV 8

static struct si_sampler_params plain(float temp)
{
    struct si_sampler_params p = si_sampler_default_params();
    p.temp = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.seed = 42;
    return p;
}

/* Frequencies of each token over `draws` samples. */
static void histogram(struct si_sampler_params p, const float *logits, int draws, double *freq)
{
    struct si_sampler *s = si_sampler_init(p, NV);
    long count[NV] = {0};
    int bad = 0;
    for (int i = 0; i < draws; i++) {
        int32_t t = si_sampler_sample(s, logits);
        if (t >= 0 && t < NV)
            count[t]++;
        else
            bad++;
    }
    CHECK(bad == 0, "%d tokens out of range", bad);
    for (int i = 0; i < NV; i++)
        freq[i] = (double)count[i] / draws;
    si_sampler_free(s);
}

int main(void)
{
    const float logits[NV] = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f, 2.0f, -4.0f};
    struct si_sampler *s;

    /* Greedy: highest logit, ties to the lowest id. */
    s = si_sampler_init(plain(0.0f), NV);
    CHECK(si_sampler_sample(s, logits) == 1, "greedy picks id 1 (tie with 4)");
    si_sampler_free(s);
    CHECK(si_sampler_init(plain(0.0f), 0) == NULL, "empty vocabulary refused");

    /* Repetition penalty: accepting 1 and 4 demotes them (3.0 / 2 = 1.5). */
    struct si_sampler_params p = plain(0.0f);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 4;
    s = si_sampler_init(p, NV);
    si_sampler_accept(s, 1);
    si_sampler_accept(s, 4);
    si_sampler_accept(s, 4); /* repeated: penalised once */
    CHECK(si_sampler_sample(s, logits) == 2, "penalty moves greedy to id 2");
    /* Negative logits are multiplied: the window slides past 1 and 4. */
    si_sampler_accept(s, 3);
    si_sampler_accept(s, 5);
    si_sampler_accept(s, 6);
    si_sampler_accept(s, 0);
    CHECK(si_sampler_sample(s, logits) == 1, "window of 4 forgot ids 1 and 4");
    si_sampler_reset(s);
    CHECK(si_sampler_sample(s, logits) == 1, "reset forgets");
    si_sampler_free(s);

    /* Temperature 1 draws follow softmax(logits). */
    double freq[NV], z = 0, prob[NV];
    for (int i = 0; i < NV; i++)
        z += exp(logits[i]);
    for (int i = 0; i < NV; i++)
        prob[i] = exp(logits[i]) / z;
    const int draws = 200000;
    histogram(plain(1.0f), logits, draws, freq);
    for (int i = 0; i < NV; i++) {
        double sd = sqrt(prob[i] * (1 - prob[i]) / draws);
        CHECK(fabs(freq[i] - prob[i]) < 5 * sd + 1e-4, "token %d: %.4f vs softmax %.4f", i,
              freq[i], prob[i]);
    }
    /* Temperature 0.5 sharpens: softmax(logits / 0.5). */
    histogram(plain(0.5f), logits, draws, freq);
    z = 0;
    for (int i = 0; i < NV; i++)
        z += exp(logits[i] / 0.5);
    for (int i = 0; i < NV; i++) {
        double pi = exp(logits[i] / 0.5) / z, sd = sqrt(pi * (1 - pi) / draws);
        CHECK(fabs(freq[i] - pi) < 5 * sd + 1e-4, "T=0.5 token %d: %.4f vs %.4f", i, freq[i], pi);
    }

    /* Top-k 3 keeps ids 1, 4 (3.0) and 2 (2.5) only. */
    p = plain(1.0f);
    p.top_k = 3;
    histogram(p, logits, 20000, freq);
    CHECK(freq[1] > 0 && freq[4] > 0 && freq[2] > 0, "top-k keeps the best three");
    CHECK(freq[0] + freq[3] + freq[5] + freq[6] + freq[7] == 0, "top-k drops the rest");
    /* Top-k 1 is greedy. */
    p.top_k = 1;
    histogram(p, logits, 1000, freq);
    CHECK(freq[1] == 1.0, "top-k 1 is greedy");

    /* Top-p: the smallest prefix with mass >= p.  Sorted: 1, 4, 2, 6, 0, 5, 3, 7. */
    double mass = prob[1] + prob[4];
    p = plain(1.0f);
    p.top_p = (float)(mass - 0.001);
    histogram(p, logits, 20000, freq);
    CHECK(fabs(freq[1] + freq[4] - 1.0) < 1e-12, "top-p below two tokens' mass keeps two (%.3f)", freq[1] + freq[4]);
    p.top_p = (float)(mass + 0.001);
    histogram(p, logits, 20000, freq);
    CHECK(freq[2] > 0 && freq[6] == 0, "top-p just above keeps a third token");

    /* Min-p 0.5: keep prob >= 0.5 * max, i.e. logit >= 3 + ln 0.5 = 2.307: ids 1, 4, 2. */
    p = plain(1.0f);
    p.min_p = 0.5f;
    histogram(p, logits, 20000, freq);
    CHECK(freq[2] > 0 && freq[6] == 0 && freq[0] == 0, "min-p cut");

    /* Same seed, same stream; another seed, another stream. */
    int same = 1, differ = 0;
    struct si_sampler *a = si_sampler_init(plain(1.0f), NV), *b = si_sampler_init(plain(1.0f), NV);
    p = plain(1.0f);
    p.seed = 7;
    struct si_sampler *c = si_sampler_init(p, NV);
    for (int i = 0; i < 200; i++) {
        int32_t x = si_sampler_sample(a, logits), y = si_sampler_sample(b, logits),
                w = si_sampler_sample(c, logits);
        same &= x == y;
        differ |= x != w;
    }
    CHECK(same, "equal seeds give equal draws");
    CHECK(differ, "different seeds give different draws");
    si_sampler_free(a);
    si_sampler_free(b);
    si_sampler_free(c);
    si_sampler_free(NULL);
    return test_result();
}
