/*
 * shared.h - contexts that share one engine (si_context_init_shared): their
 * evaluations, made on their own threads, gathered into steps of one batch
 * each (si_engine_eval_multi).  Not installed.
 */
#ifndef SI_SHARED_H
#define SI_SHARED_H

#include "graph/engine.h"
#include "model/forward.h"

#include <stdbool.h>
#include <stdint.h>

struct si__group;

/* A group on e, which it owns from now on (freed with the group), with one
 * reference; owned: a block the engine borrows, freed after it (or NULL).
 * NULL when out of memory. */
struct si__group *si__group_new(struct si_engine *e, void *owned);
void si__group_hold(struct si__group *g);
/* Drop a reference: the last frees the engine, then `owned`. */
void si__group_drop(struct si__group *g);

/*
 * n tokens onto seq (the engine's own sequence, or one of si_engine_seq_new's
 * on it) in the group's steps, seq's attention in the arithmetic attn_f32
 * asks.  Returns when all of them are in (their last one's logits in
 * seq->logits), or on the first failure; *done: how many went in.
 * `engaged`: the caller is a generation, which comes back for its next
 * token at once: a step waits for the engaged contexts (si__group_engage)
 * to have their tokens in, for at most a few milliseconds.  The caller
 * checked the tokens and that they fit seq's context.
 */
int si__group_eval(struct si__group *g, struct si_ref *seq, const int32_t *tokens, int32_t n,
                   bool attn_f32, bool engaged, int32_t *done);

/* A context of the group starts (+1) or ends (-1) a generation. */
void si__group_engage(struct si__group *g, int delta);

/* The engine between steps: hold it to change a sequence's position or
 * state, or to read the engine's statistics, while other contexts run. */
void si__group_lock(struct si__group *g);
void si__group_unlock(struct si__group *g);

#endif /* SI_SHARED_H */
