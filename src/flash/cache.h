/*
 * cache.h - one layer's DRAM cache of flash neuron records ("LLM in a
 * flash", section 3.3): a preallocated matrix of `cap` records (Req_l), the
 * table of the neuron each slot holds, num_used, and the sliding window of
 * the neurons active in the last k tokens.
 *
 * Slots [0, n_used) are in use.  Deleting the neuron in slot s moves the
 * record in slot n_used - 1 into s (one record copied, no hole, no shifting
 * of the rest); new neurons are appended at n_used.  The matrix is never
 * reallocated.
 *
 * A token's step:
 *   1. stamp the token's active neurons;
 *   2. delete every cached neuron that was not active in the window: the
 *      last k tokens, this one included (k = 0: nothing is kept from one
 *      token to the next, every active neuron is read again);
 *   3. if the neurons still cached plus the missing ones exceed cap, delete
 *      more: those not active now, least recently active first;
 *   4. append the missing neurons in the order given, so that neurons
 *      listed next to each other get neighbouring slots (the caller lists
 *      them in file order: adjacent records become one read).
 * The caller then reads each appended neuron's record into its slot.
 *
 * Neurons are numbered [0, n) by the caller (the engine: positions in its
 * layer).  Pure bookkeeping: no I/O, no StarPU, no locks.
 *
 * Pinned neurons (ids in [pin_lo, pin_hi): the hottest by the profile) are
 * never deleted, by the window or for room: once read they stay, as the hot
 * neurons of PowerInfer stay in memory; the window has the rest of the cap.
 */
#ifndef SI_FLASH_CACHE_H
#define SI_FLASH_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct si_flash_cache {
    int32_t n;         /* neurons that may be cached: ids in [0, n) */
    int32_t cap;       /* Req_l: records the matrix holds */
    int32_t n_used;    /* num_used: slots [0, n_used) hold records */
    int32_t window;    /* k: tokens whose active neurons stay cached */
    size_t rec_bytes;  /* bytes of a record (a multiple of the matrix alignment) */
    char *mat;         /* (cap, rec_bytes) the records, aligned for direct I/O */
    float *bias;       /* (cap) each slot's up bias (read from its record) */
    int32_t *ids;      /* (cap) the neuron in each slot */
    int32_t *slot_of;  /* (n) the slot of each neuron, -1 when not cached */
    int64_t *last;     /* (n) last_k_active: the token each neuron was last active in */
    int64_t tick;      /* tokens stepped */
    int32_t *order;    /* (cap) scratch for step 3 */
    int32_t pin_lo, pin_hi; /* pinned ids: never deleted (none by default) */
    int32_t n_pinned;       /* of them, cached */
    bool own;          /* mat and bias allocated here */
};

/* A cache of cap records of rec_bytes (a multiple of align, a power of two)
 * for neurons [0, n), in mat (cap records, aligned) and bias (cap floats)
 * when given (both, kept by the caller), else allocated.  SI_OK,
 * SI_E_INVALID or SI_E_NOMEM. */
int si_flash_cache_init(struct si_flash_cache *c, int32_t n, int32_t cap, size_t rec_bytes,
                        size_t align, int32_t window, char *mat, float *bias);
void si_flash_cache_free(struct si_flash_cache *c);

/* Forget every record (a new sequence); the pinned ones too (they come back
 * as they are read again). */
void si_flash_cache_clear(struct si_flash_cache *c);

/* Pin ids [lo, hi) (at most cap of them, within [0, n)): SI_OK or
 * SI_E_INVALID.  On an empty cache. */
int si_flash_cache_pin(struct si_flash_cache *c, int32_t lo, int32_t hi);

/* Whether id is pinned. */
static inline bool si_flash_cache_pinned(const struct si_flash_cache *c, int32_t id)
{
    return id >= c->pin_lo && id < c->pin_hi;
}

/* The pinned neurons cached but not among act[0..n_act): slots a step
 * cannot free. */
int64_t si_flash_cache_idle_pinned(const struct si_flash_cache *c, const int32_t *act,
                                   int64_t n_act);

/* What a step did. */
struct si_flash_step {
    int64_t hits;    /* active neurons found cached */
    int64_t loads;   /* active neurons appended (to be read) */
    int64_t deletes; /* records deleted (window and capacity) */
    int64_t moves;   /* records moved into a deleted one's slot */
};

/*
 * One token's step for the active neurons act[0..n_act) (distinct, each in
 * [0, n)): the neurons to read go to load[0..*n_load), in the order of act,
 * each into slot load_slot[k] (load and load_slot: n_act entries of room).
 * SI_OK; SI_E_INVALID for an id out of range or listed twice; SI_E_BUDGET
 * when the active neurons alone exceed cap, or with the pinned ones cached
 * and not active (the cache is then unchanged but for the stamps).
 */
int si_flash_cache_step(struct si_flash_cache *c, const int32_t *act, int64_t n_act,
                        int32_t *load, int32_t *load_slot, int64_t *n_load,
                        struct si_flash_step *st);

/* The record in slot s. */
static inline char *si_flash_cache_rec(const struct si_flash_cache *c, int32_t s)
{
    return c->mat + (size_t)s * c->rec_bytes;
}

#endif /* SI_FLASH_CACHE_H */
