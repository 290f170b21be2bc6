/*
 * sampler.h - choosing the next token from logits.
 *
 * The chain, in order: repetition penalty over the last repeat_last_n
 * accepted tokens, top-k, top-p (nucleus), min-p, temperature, then a draw
 * from the remaining distribution.  temp <= 0 is greedy: the highest logit
 * after the penalty (ties go to the lowest id).  Draws are reproducible from
 * the seed.
 */
#ifndef SI_MODEL_SAMPLER_H
#define SI_MODEL_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

struct si_sampler_params {
    float temp;           /* 0: greedy */
    int32_t top_k;        /* 0: off */
    float top_p;          /* 1: off */
    float min_p;          /* 0: off */
    float repeat_penalty; /* 1: off */
    int32_t repeat_last_n;
    uint64_t seed;
};

struct si_sampler_params si_sampler_default_params(void);

struct si_sampler;

/* NULL when out of memory or n_vocab <= 0. */
struct si_sampler *si_sampler_init(struct si_sampler_params p, int32_t n_vocab);
void si_sampler_free(struct si_sampler *s);

/* The next token for these logits (n_vocab of them; not modified). */
int32_t si_sampler_sample(struct si_sampler *s, const float *logits);

/* Record an accepted token (for the repetition penalty). */
void si_sampler_accept(struct si_sampler *s, int32_t token);

/* Forget the accepted tokens; the random stream goes on. */
void si_sampler_reset(struct si_sampler *s);

#endif /* SI_MODEL_SAMPLER_H */
