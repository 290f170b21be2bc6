/* sampler.c - repetition penalty, top-k, top-p, min-p, temperature, draw. */
#include "model/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand {
    int32_t id;
    float logit;
};

struct si_sampler {
    struct si_sampler_params p;
    int32_t n_vocab;
    struct cand *c;  /* (n_vocab) */
    int32_t *recent; /* ring of the last repeat_last_n accepted tokens */
    int32_t n_recent, head;
    uint64_t rng[4]; /* xoshiro256** state */
};

struct si_sampler_params si_sampler_default_params(void)
{
    return (struct si_sampler_params){.temp = 0.8f,
                                      .top_k = 40,
                                      .top_p = 0.95f,
                                      .min_p = 0.05f,
                                      .repeat_penalty = 1.0f,
                                      .repeat_last_n = 64,
                                      .seed = 0};
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t next_u64(uint64_t *s)
{
    const uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(uint64_t *s)
{
    return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0);
}

struct si_sampler *si_sampler_init(struct si_sampler_params p, int32_t n_vocab)
{
    if (n_vocab <= 0)
        return NULL;
    struct si_sampler *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    if (p.repeat_last_n < 0)
        p.repeat_last_n = 0;
    s->p = p;
    s->n_vocab = n_vocab;
    s->c = malloc((size_t)n_vocab * sizeof *s->c);
    s->recent = malloc(((size_t)p.repeat_last_n + 1) * sizeof *s->recent);
    if (s->c == NULL || s->recent == NULL) {
        si_sampler_free(s);
        return NULL;
    }
    uint64_t x = p.seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
    return s;
}

void si_sampler_free(struct si_sampler *s)
{
    if (s == NULL)
        return;
    free(s->c);
    free(s->recent);
    free(s);
}

void si_sampler_reset(struct si_sampler *s)
{
    s->n_recent = 0;
    s->head = 0;
}

void si_sampler_accept(struct si_sampler *s, int32_t token)
{
    const int32_t n = s->p.repeat_last_n;
    if (n == 0)
        return;
    s->recent[s->head] = token;
    s->head = (s->head + 1) % n;
    if (s->n_recent < n)
        s->n_recent++;
}

/* Descending logit, then ascending id (so that ties are deterministic). */
static int by_logit_desc(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int32_t si_sampler_sample(struct si_sampler *s, const float *logits)
{
    const struct si_sampler_params *p = &s->p;
    struct cand *c = s->c;
    int32_t n = s->n_vocab;
    for (int32_t i = 0; i < n; i++)
        c[i] = (struct cand){i, logits[i]};

    /* Repetition penalty, once per distinct recent token. */
    if (p->repeat_penalty != 1.0f) {
        for (int32_t r = 0; r < s->n_recent; r++) {
            int32_t id = s->recent[r];
            if (id < 0 || id >= n)
                continue;
            bool seen = false;
            for (int32_t q = 0; q < r && !seen; q++)
                seen = s->recent[q] == id;
            if (seen)
                continue;
            c[id].logit =
                c[id].logit > 0 ? c[id].logit / p->repeat_penalty : c[id].logit * p->repeat_penalty;
        }
    }

    if (p->temp <= 0.0f) {
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (c[i].logit > c[best].logit)
                best = i;
        return c[best].id;
    }

    qsort(c, (size_t)n, sizeof *c, by_logit_desc);
    if (p->top_k > 0 && p->top_k < n)
        n = p->top_k;

    /* Probabilities at temperature 1 for top-p and min-p (as filters). */
    double sum = 0.0;
    const float maxl = c[0].logit;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)(c[i].logit - maxl));
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double)(c[i].logit - maxl)) / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        /* prob_i >= min_p * prob_max  <=>  logit_i >= maxl + log(min_p) */
        const double cut = (double)maxl + log((double)p->min_p);
        int32_t keep = 1;
        while (keep < n && (double)c[keep].logit >= cut)
            keep++;
        n = keep;
    }

    /* Temperature, then draw. */
    sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)(c[i].logit - maxl) / p->temp);
    double u = next_unit(s->rng) * sum;
    for (int32_t i = 0; i < n; i++) {
        u -= exp((double)(c[i].logit - maxl) / p->temp);
        if (u < 0.0)
            return c[i].id;
    }
    return c[n - 1].id;
}
