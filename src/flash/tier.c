/* tier.c - the flash tier's region, caches and per-token loads (see tier.h). */
#include "flash/tier.h"

#include "internal.h"
#include "starinfer.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t si_flash_tier_layer_bytes(int64_t n_ff)
{
    /* the load arrays (fresh_at among them), then the cache's slot_of and last */
    return n_ff *
               (int64_t)(sizeof(int32_t) * 7 + sizeof(char *) + 3 * sizeof(struct si_flash_req)) +
           n_ff * (int64_t)(sizeof(int32_t) + sizeof(int64_t));
}

/* The spill area's records: the most cold neurons of a layer (at least 1). */
static int64_t max_cold(int32_t n_layer, int64_t n_ff, const int64_t *n_hot)
{
    int64_t m = 1;
    for (int l = 0; l < n_layer; l++)
        m = n_ff - n_hot[l] > m ? n_ff - n_hot[l] : m;
    return m;
}

int64_t si_flash_tier_spill_bytes(int32_t n_layer, int64_t n_ff, const int64_t *n_hot,
                                  size_t rec_bytes)
{
    return max_cold(n_layer, n_ff, n_hot) *
               ((int64_t)rec_bytes + (int64_t)(sizeof(float) + sizeof(int32_t) + 1)) +
           n_ff * (int64_t)sizeof(int32_t);
}

int64_t si_flash_tier_record_bytes(size_t rec_bytes)
{
    return (int64_t)rec_bytes + (int64_t)(sizeof(float) + 2 * sizeof(int32_t) + 1);
}

static int alloc_layer(struct si_flash_layer *L, int64_t n_ff)
{
    const size_t ff = (size_t)n_ff;
    L->row = malloc(ff * sizeof(int32_t));
    L->act = malloc(ff * sizeof(int32_t));
    L->load = malloc(ff * sizeof(int32_t));
    L->slot = malloc(ff * sizeof(int32_t));
    L->fid = malloc(ff * sizeof(int32_t));
    L->dst = malloc(ff * sizeof(char *));
    L->req = malloc(3 * ff * sizeof(struct si_flash_req));
    L->fresh_at = malloc(ff * sizeof(int32_t));
    return L->row && L->act && L->load && L->slot && L->fid && L->dst && L->req && L->fresh_at
               ? SI_OK
               : SI_E_NOMEM;
}

/* Under t->mu: the job in hand is finished, with result rc. */
static void job_done(struct si_flash_tier *t, int rc)
{
    t->job.rc = rc;
    t->job.t_done = si__now();
    t->job.done = true;
}

/* The reader thread: each job's reads, then done. */
static void *reader_main(void *arg)
{
    struct si_flash_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->quit && (t->job.layer < 0 || t->job.done))
            pthread_cond_wait(&t->cv, &t->mu);
        if (t->quit)
            break;
        const int l = t->job.layer;
        const int64_t n = t->job.n_req;
        pthread_mutex_unlock(&t->mu);
        if (t->delay_us > 0) /* tests: reads that land late */
            nanosleep(&(struct timespec){t->delay_us / 1000000, t->delay_us % 1000000 * 1000},
                      NULL);
        const int rc = si_flash_read(t->store, t->L[l].req, n);
        pthread_mutex_lock(&t->mu);
        job_done(t, rc);
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int si_flash_tier_init(struct si_flash_tier *t, struct si_flash_store *s, int32_t n_layer,
                       int64_t n_ff, size_t rec_bytes, int32_t window, int64_t cap, double pin,
                       const int64_t *n_hot, const int32_t *const *perm, char *err, size_t err_size)
{
    memset(t, 0, sizeof *t);
    t->job.layer = -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    const char *ov = getenv("STARINFER_FLASH_OVERLAP");
    t->overlap = ov == NULL || strcmp(ov, "0") != 0;
    const char *dl = getenv("STARINFER_FLASH_READ_DELAY_US");
    t->delay_us = dl != NULL ? atol(dl) : 0;
    t->store = s;
    t->n_layer = n_layer;
    t->n_ff = n_ff;
    t->rec_bytes = rec_bytes;
    t->cache_records = -1;
    const int64_t ff = n_ff;
    t->L = calloc((size_t)n_layer, sizeof *t->L);
    if (t->L == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the flash tier");
    for (int l = 0; l < n_layer; l++)
        if (alloc_layer(&t->L[l], ff) != SI_OK)
            return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the flash tier");
    /* The spill area: a layer's cold neurons that are active beyond its
     * cache, read for one token (layers load one after another). */
    const int64_t spill_cap = max_cold(n_layer, ff, n_hot);
    int64_t total = spill_cap;
    for (int l = 0; l < n_layer; l++) {
        const int64_t cold = ff - n_hot[l];
        total += cap < cold ? cap : cold;
    }
    t->spill_cap = (int32_t)spill_cap;
    t->region = aligned_alloc(SI_FLASH_BLOCK, (size_t)total * rec_bytes);
    t->region_bias = malloc((size_t)total * sizeof(float));
    t->spill_of = malloc((size_t)ff * sizeof(int32_t));
    t->spill_pos = malloc((size_t)spill_cap * sizeof(int32_t));
    t->fresh = calloc((size_t)total, 1);
    if (!t->region || !t->region_bias || !t->spill_of || !t->spill_pos || !t->fresh)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the flash caches (%.1f MiB)",
                        (double)total * (double)rec_bytes / 1048576.0);
    for (int64_t p = 0; p < ff; p++)
        t->spill_of[p] = -1;
    int64_t off = spill_cap;
    for (int l = 0; l < n_layer; l++) {
        struct si_flash_layer *L = &t->L[l];
        const int64_t cold = ff - n_hot[l];
        const int32_t c = (int32_t)(cap < cold ? cap : cold);
        L->off = off;
        if (si_flash_cache_init(&L->fc, (int32_t)ff, c, rec_bytes, SI_FLASH_BLOCK, window,
                                t->region + (size_t)off * rec_bytes, t->region_bias + off) != SI_OK)
            return si__errf(err, err_size, SI_E_NOMEM,
                            "out of memory for the flash cache of layer %d (%d records)", l, c);
        /* the first cold positions (the hottest, with a profile) pinned */
        const int32_t np = (int32_t)(pin * (double)c);
        si_flash_cache_pin(&L->fc, (int32_t)n_hot[l], (int32_t)n_hot[l] + np);
        t->pinned += np;
        for (int64_t p = 0; p < ff; p++)
            L->row[p] = s->row_of[(size_t)l * (size_t)ff + (size_t)perm[l][p]];
        t->cache_bytes += (int64_t)c * si_flash_tier_record_bytes(rec_bytes);
        off += c;
        if (t->cache_records < 0 || c < t->cache_records)
            t->cache_records = c;
    }
    if (t->overlap) {
        if (pthread_create(&t->reader, NULL, reader_main, t) != 0)
            return si__errf(err, err_size, SI_E_NOMEM, "cannot start the flash reader thread");
        t->reader_up = true;
    }
    return SI_OK;
}

void si_flash_tier_free(struct si_flash_tier *t)
{
    if (t->reader_up) { /* after the job in hand, if any */
        pthread_mutex_lock(&t->mu);
        while (t->job.layer >= 0 && !t->job.done)
            pthread_cond_wait(&t->cv, &t->mu);
        t->quit = true;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->reader, NULL);
    }
    if (t->store != NULL) { /* made by si_flash_tier_init */
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->cv);
    }
    for (int l = 0; t->L != NULL && l < t->n_layer; l++) {
        struct si_flash_layer *L = &t->L[l];
        free(L->row);
        free(L->act);
        free(L->load);
        free(L->slot);
        free(L->fid);
        free(L->dst);
        free(L->req);
        free(L->fresh_at);
        si_flash_cache_free(&L->fc);
    }
    free(t->L);
    free(t->region);
    free(t->region_bias);
    free(t->spill_of);
    free(t->spill_pos);
    free(t->fresh);
    memset(t, 0, sizeof *t);
}

static int cmp_row(const void *pa, const void *pb, void *user)
{
    const int32_t *row = user;
    const int32_t a = row[*(const int32_t *)pa], b = row[*(const int32_t *)pb];
    return (a > b) - (a < b);
}

/* Under t->mu: the job in hand finished; its time counted and its result
 * returned once, to the first taker (the others get SI_OK: one report of a
 * failure, from one thread). */
static int take_job(struct si_flash_tier *t, const char **msg)
{
    while (t->job.layer >= 0 && !t->job.done)
        pthread_cond_wait(&t->cv, &t->mu);
    if (t->job.layer < 0 || t->job.seen)
        return SI_OK;
    t->job.seen = true;
    t->L[t->job.layer].io += t->job.t_done - t->job.t_submit;
    if (t->job.rc != SI_OK)
        *msg = t->store->read_err;
    return t->job.rc;
}

int si_flash_tier_wait(struct si_flash_tier *t, int l, const char **msg)
{
    *msg = "";
    pthread_mutex_lock(&t->mu);
    const int rc = t->job.layer == l ? take_job(t, msg) : SI_OK;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int si_flash_tier_load(struct si_flash_tier *t, int l, const int32_t *perm, int64_t na,
                       const char **msg)
{
    struct si_flash_layer *L = &t->L[l];
    struct si_flash_cache *c = &L->fc;
    const double t0 = si__now();
    *msg = "";
    /* The previous load's reads are in (its layer's tasks waited for them;
     * a failure nobody took is reported here). */
    pthread_mutex_lock(&t->mu);
    int rc = take_job(t, msg);
    t->job.layer = -1;
    pthread_mutex_unlock(&t->mu);
    if (rc != SI_OK)
        return rc;
    /* The records this layer read last time, and the spill area's, are
     * old news now. */
    for (int64_t k = 0; k < L->n_fresh; k++)
        t->fresh[L->fresh_at[k]] = 0;
    memset(t->fresh, 0, (size_t)t->spill_cap);
    L->n_fresh = 0;
    /* Neighbours in the store get neighbouring slots: one read for a run. */
    qsort_r(L->act, (size_t)na, sizeof *L->act, cmp_row, L->row);
    /* The previous layer's spilled neurons are done with. */
    for (int32_t k = 0; k < t->spill_n; k++)
        t->spill_of[t->spill_pos[k]] = -1;
    t->spill_n = 0;
    /* More active neurons than the cache holds: the cached ones and the
     * first missing ones (store order: hottest first with a profile) go
     * through the cache, the others are read into the spill area for this
     * token only. */
    int64_t nk = na;
    /* the pinned neurons cached and not active keep their slots */
    const int64_t idle_pinned = si_flash_cache_idle_pinned(c, L->act, na);
    if (na + idle_pinned > c->cap) {
        int64_t cached = 0, room, w = 0;
        for (int64_t k = 0; k < na; k++)
            cached += c->slot_of[L->act[k]] >= 0;
        room = c->cap - cached - idle_pinned;
        for (int64_t k = 0; k < na; k++) {
            const int32_t p = L->act[k];
            if (c->slot_of[p] >= 0 || room-- > 0) {
                L->act[w++] = p;
            } else {
                t->spill_of[p] = t->spill_n;
                t->spill_pos[t->spill_n++] = p;
            }
        }
        nk = w;
    }
    int64_t nl = 0;
    struct si_flash_step st;
    rc = si_flash_cache_step(c, L->act, nk, L->load, L->slot, &nl, &st);
    if (rc != SI_OK) { /* cannot happen: nk <= cap, the ids distinct */
        *msg = "flash cache bookkeeping failed";
        return rc;
    }
    for (int64_t k = 0; k < nl; k++) {
        L->fid[k] = perm[L->load[k]];
        L->dst[k] = si_flash_cache_rec(c, L->slot[k]);
    }
    for (int32_t k = 0; k < t->spill_n; k++) {
        L->fid[nl + k] = perm[t->spill_pos[k]];
        L->dst[nl + k] = t->region + (size_t)k * t->rec_bytes;
    }
    const int64_t nc = si_flash_plan(t->store, l, L->fid, nl, L->dst, L->req);
    const int64_t nr =
        nc + si_flash_plan(t->store, l, L->fid + nl, t->spill_n, L->dst + nl, L->req + nc);
    for (int64_t k = 0; k < nl; k++) {
        c->bias[L->slot[k]] = si_flash_bias(t->store, l, L->fid[k]);
        L->fresh_at[k] = (int32_t)(L->off + L->slot[k]);
        t->fresh[L->fresh_at[k]] = 1;
    }
    L->n_fresh = nl;
    for (int32_t k = 0; k < t->spill_n; k++) {
        t->region_bias[k] = si_flash_bias(t->store, l, L->fid[nl + k]);
        t->fresh[k] = 1;
    }
    nl += t->spill_n;
    for (int64_t r = 0; r < nr; r++)
        L->bytes += (int64_t)L->req[r].len;
    L->reads += nr;
    L->loads += nl;
    L->hits += st.hits;
    /* The reads: to the reader thread, or here. */
    const double t1 = si__now();
    L->manage += t1 - t0;
    pthread_mutex_lock(&t->mu);
    t->job = (struct si_flash_job){.layer = l, .n_req = nr, .t_submit = t1};
    if (!t->overlap || nr == 0) {
        pthread_mutex_unlock(&t->mu);
        rc = si_flash_read(t->store, L->req, nr);
        pthread_mutex_lock(&t->mu);
        job_done(t, rc);
        rc = take_job(t, msg);
    } else {
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int si_flash_tier_read(struct si_flash_tier *t, int l, const int32_t *ids, int64_t n, char *dst)
{
    struct si_flash_layer *L = &t->L[l];
    for (int64_t p = 0; p < n; p++) {
        L->fid[p] = ids[p];
        L->dst[p] = dst + (size_t)p * t->rec_bytes;
    }
    const int64_t nr = si_flash_plan(t->store, l, L->fid, n, L->dst, L->req);
    return si_flash_read(t->store, L->req, nr);
}
