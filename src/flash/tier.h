/*
 * tier.h - the flash tier as the engine runs it: the cold neurons' records
 * in one DRAM region (a spill area, then each layer's cache, flash/cache.h),
 * and the per-token load of a layer's active neurons from the store
 * (flash/store.h).  Nothing here knows of StarPU or of the engine's tasks:
 * the engine's load task (codelets/load.c) hands the active positions over
 * and reads the records back by their index in the region.
 *
 * A load does the cache's bookkeeping on the caller's thread and hands the
 * reads to the tier's reader thread: the caller goes on (the engine
 * computes the neurons that were cached already) and waits for the reads
 * with si_flash_tier_wait before it touches a record marked fresh.
 * STARINFER_FLASH_OVERLAP=0 makes the load wait itself (for comparisons);
 * STARINFER_FLASH_READ_DELAY_US=N delays every job's reads (for the tests:
 * a task that used a fresh record before waiting would see it unread).
 *
 * Positions are the engine's (its neurons permuted by expected activity);
 * perm maps a layer's positions to the file's neuron ids.  A record's index
 * in the region (int32) is what the sparse kernels take: the cached records
 * and the spill area are parts of one array.
 */
#ifndef SI_FLASH_TIER_H
#define SI_FLASH_TIER_H

#include "flash/cache.h"
#include "flash/store.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One layer's cache and the arrays of its load (one load per layer at a time). */
struct si_flash_layer {
    struct si_flash_cache fc;
    int32_t *row;      /* (n_ff) each position's row in the store */
    int32_t *act;      /* (n_ff) this token's active cold positions (the caller fills them) */
    int32_t *load, *slot, *fid; /* (n_ff) the neurons to read, their slots and ids */
    char **dst;        /* (n_ff) where each goes */
    struct si_flash_req *req; /* (3 n_ff) */
    int64_t off;       /* the cache's first record in the region */
    int32_t *fresh_at; /* (n_ff) the cache records read by the last load */
    int64_t n_fresh;
    int64_t loads, hits, bytes, reads; /* totals: records read, found cached, bytes, requests */
    double io, manage; /* seconds the reads took (submitted to done), in bookkeeping */
};

/* The reads of one load, handed to the reader thread. */
struct si_flash_job {
    int layer; /* -1: none since the last wait */
    int64_t n_req;
    bool done; /* the reader has finished them */
    bool seen; /* a wait has taken the result (and the time): once */
    int rc;    /* SI_OK or SI_E_IO (store->read_err says why) */
    double t_submit, t_done;
};

struct si_flash_tier {
    struct si_flash_store *store;
    int32_t n_layer;
    int64_t n_ff;
    size_t rec_bytes;
    char *region;       /* (spill_cap + the caches' records, rec_bytes), aligned */
    float *region_bias; /* each record's up bias */
    int32_t spill_cap;  /* records: the most cold neurons of a layer */
    int32_t spill_n;    /* in use, by the layer loaded last */
    int32_t *spill_of;  /* (n_ff) a position's spill record, or -1 */
    int32_t *spill_pos; /* (spill_cap) the positions in the spill area */
    int64_t cache_bytes;   /* host bytes of the caches (records and their bookkeeping) */
    int32_t cache_records; /* records of the smallest cache */
    int64_t pinned;        /* records pinned, all layers */
    unsigned char *fresh;  /* (region records) 1: read by its layer's last load */
    struct si_flash_layer *L; /* (n_layer) */
    /* The reader thread and its one job (loads go one layer at a time). */
    bool overlap;  /* reads on the reader thread (else in the load) */
    long delay_us; /* STARINFER_FLASH_READ_DELAY_US (tests): the reader sleeps
                    * this long before each job's reads */
    bool reader_up, quit;
    pthread_t reader;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct si_flash_job job;
};

/* Host bytes of a layer's load arrays and cache bookkeeping besides its records. */
int64_t si_flash_tier_layer_bytes(int64_t n_ff);

/* Host bytes of the spill area of a tier whose layers have n_hot[l] hot
 * neurons of n_ff: room for the most cold neurons of a layer (records,
 * biases, fresh flags, positions) and each position's spill index. */
int64_t si_flash_tier_spill_bytes(int32_t n_layer, int64_t n_ff, const int64_t *n_hot,
                                  size_t rec_bytes);

/* Host bytes per cached record: the record, its bias, fresh flag, slot and id entries. */
int64_t si_flash_tier_record_bytes(size_t rec_bytes);

/*
 * A tier for n_layer layers of n_ff neurons on store s: layer l's cache
 * holds min(cap, n_ff - n_hot[l]) records (its cold neurons at most), a
 * share pin (0..1) of them for its first cold positions, pinned (the
 * hottest with a profile: never evicted once read), and perm[l] maps its
 * positions to the file's ids.  SI_OK or SI_E_NOMEM (with
 * a message); t is then freed with si_flash_tier_free whatever the result.
 */
int si_flash_tier_init(struct si_flash_tier *t, struct si_flash_store *s, int32_t n_layer,
                       int64_t n_ff, size_t rec_bytes, int32_t window, int64_t cap, double pin,
                       const int64_t *n_hot, const int32_t *const *perm, char *err,
                       size_t err_size);
void si_flash_tier_free(struct si_flash_tier *t);

/*
 * Layer l's load for one token: its na active cold positions in L[l].act,
 * in store order; the previous load's reads waited for, the previous
 * layer's spill released; the cache's step (deletes, moves, appends); the
 * records to read (into their slots, those beyond the cache into the spill
 * area, for this token only) marked fresh, their biases taken, and their
 * reads handed to the reader thread (or done here without overlap).
 * SI_OK, or SI_E_IO / SI_E_INVALID with *msg saying what failed (an earlier
 * load's read failure too).
 */
int si_flash_tier_load(struct si_flash_tier *t, int l, const int32_t *perm, int64_t na,
                       const char **msg);

/* Wait for layer l's reads (any number of callers, any thread): SI_OK, or
 * to the first caller only, SI_E_IO with *msg naming the store and what
 * failed. */
int si_flash_tier_wait(struct si_flash_tier *t, int l, const char **msg);

/* Whether the record at region index s was read by its layer's last load
 * (then si_flash_tier_wait must come before it is used). */
static inline bool si_flash_tier_fresh(const struct si_flash_tier *t, int32_t s)
{
    return t->fresh[s] != 0;
}

/* Read n hot neurons (ids) into dst (n records, aligned): SI_OK or SI_E_IO. */
int si_flash_tier_read(struct si_flash_tier *t, int l, const int32_t *ids, int64_t n, char *dst);

/* The region index of position p's record after layer l's load, or -1 (not loaded). */
static inline int32_t si_flash_tier_record(const struct si_flash_tier *t, int l, int64_t p)
{
    const int32_t s = t->L[l].fc.slot_of[p];
    return s >= 0 ? (int32_t)(t->L[l].off + s) : t->spill_of[p];
}

#endif /* SI_FLASH_TIER_H */
