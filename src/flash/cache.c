/* cache.c - a layer's DRAM cache of flash neuron records (see cache.h). */
#include "flash/cache.h"

#include "starinfer.h"

#include <stdlib.h>
#include <string.h>

#define NEVER (INT64_MIN / 2) /* last_k_active of a neuron never active */

int si_flash_cache_init(struct si_flash_cache *c, int32_t n, int32_t cap, size_t rec_bytes,
                        size_t align, int32_t window, char *mat, float *bias)
{
    memset(c, 0, sizeof *c);
    if (n < 0 || cap < 0 || window < 0 || align == 0 || (align & (align - 1)) != 0 ||
        rec_bytes == 0 || rec_bytes % align != 0)
        return SI_E_INVALID;
    c->n = n;
    c->cap = cap;
    c->window = window;
    c->rec_bytes = rec_bytes;
    const size_t cells = cap > 0 ? (size_t)cap : 1;
    c->own = mat == NULL || bias == NULL;
    c->mat = c->own ? aligned_alloc(align, cells * rec_bytes) : mat;
    c->bias = c->own ? malloc(cells * sizeof *c->bias) : bias;
    c->ids = malloc(cells * sizeof *c->ids);
    c->order = malloc(cells * sizeof *c->order);
    c->slot_of = malloc((n > 0 ? (size_t)n : 1) * sizeof *c->slot_of);
    c->last = malloc((n > 0 ? (size_t)n : 1) * sizeof *c->last);
    if (!c->mat || !c->bias || !c->ids || !c->order || !c->slot_of || !c->last) {
        si_flash_cache_free(c);
        return SI_E_NOMEM;
    }
    si_flash_cache_clear(c);
    return SI_OK;
}

void si_flash_cache_free(struct si_flash_cache *c)
{
    if (c == NULL)
        return;
    if (c->own) {
        free(c->mat);
        free(c->bias);
    }
    free(c->ids);
    free(c->order);
    free(c->slot_of);
    free(c->last);
    memset(c, 0, sizeof *c);
}

void si_flash_cache_clear(struct si_flash_cache *c)
{
    c->n_used = 0;
    c->n_pinned = 0;
    c->tick = 0;
    for (int32_t i = 0; i < c->n; i++) {
        c->slot_of[i] = -1;
        c->last[i] = NEVER;
    }
}

int si_flash_cache_pin(struct si_flash_cache *c, int32_t lo, int32_t hi)
{
    if (lo < 0 || hi < lo || hi > c->n || hi - lo > c->cap || c->n_used > 0)
        return SI_E_INVALID;
    c->pin_lo = lo;
    c->pin_hi = hi;
    return SI_OK;
}

int64_t si_flash_cache_idle_pinned(const struct si_flash_cache *c, const int32_t *act,
                                   int64_t n_act)
{
    int64_t idle = c->n_pinned;
    for (int64_t k = 0; k < n_act && idle > 0; k++)
        idle -= si_flash_cache_pinned(c, act[k]) && c->slot_of[act[k]] >= 0;
    return idle;
}

/* Delete the record in slot s: the last record moves into its place. */
static void delete_slot(struct si_flash_cache *c, int32_t s, struct si_flash_step *st)
{
    const int32_t end = c->n_used - 1;
    c->slot_of[c->ids[s]] = -1;
    if (s != end) {
        memcpy(si_flash_cache_rec(c, s), si_flash_cache_rec(c, end), c->rec_bytes);
        c->bias[s] = c->bias[end];
        c->ids[s] = c->ids[end];
        c->slot_of[c->ids[s]] = s;
        st->moves++;
    }
    c->n_used = end;
    st->deletes++;
}

static int cmp_last(const void *pa, const void *pb, void *user)
{
    const struct si_flash_cache *c = user;
    const int64_t a = c->last[*(const int32_t *)pa];
    const int64_t b = c->last[*(const int32_t *)pb];
    if (a != b)
        return a < b ? -1 : 1;
    return *(const int32_t *)pa - *(const int32_t *)pb;
}

int si_flash_cache_step(struct si_flash_cache *c, const int32_t *act, int64_t n_act,
                        int32_t *load, int32_t *load_slot, int64_t *n_load,
                        struct si_flash_step *st)
{
    *n_load = 0;
    memset(st, 0, sizeof *st);
    for (int64_t k = 0; k < n_act; k++)
        if (act[k] < 0 || act[k] >= c->n)
            return SI_E_INVALID;
    const int64_t t = ++c->tick;
    for (int64_t k = 0; k < n_act; k++) {
        if (c->last[act[k]] == t)
            return SI_E_INVALID; /* listed twice */
        c->last[act[k]] = t;
    }
    if (n_act > c->cap)
        return SI_E_BUDGET;

    /* Room: the pinned ones that stay without being active take theirs. */
    if (n_act + si_flash_cache_idle_pinned(c, act, n_act) > c->cap)
        return SI_E_BUDGET;

    /* 2. The window: keep what was active in the last k tokens (and the pinned). */
    for (int32_t s = 0; s < c->n_used;) {
        const int64_t age = t - c->last[c->ids[s]];
        if (!si_flash_cache_pinned(c, c->ids[s]) && (c->window == 0 || age >= c->window))
            delete_slot(c, s, st); /* slot s now holds the former last record */
        else
            s++;
    }

    /* 3. Room for the missing neurons: the least recently active go first. */
    int64_t missing = 0;
    for (int64_t k = 0; k < n_act; k++)
        missing += c->slot_of[act[k]] < 0;
    if (c->n_used + missing > c->cap) {
        int32_t nv = 0;
        for (int32_t s = 0; s < c->n_used; s++)
            if (c->last[c->ids[s]] != t && !si_flash_cache_pinned(c, c->ids[s]))
                c->order[nv++] = c->ids[s];
        qsort_r(c->order, (size_t)nv, sizeof *c->order, cmp_last, c);
        for (int32_t v = 0; v < nv && c->n_used + missing > c->cap; v++)
            delete_slot(c, c->slot_of[c->order[v]], st);
    }

    /* 4. Append. */
    for (int64_t k = 0; k < n_act; k++) {
        const int32_t id = act[k];
        if (c->slot_of[id] >= 0) {
            st->hits++;
            continue;
        }
        const int32_t s = c->n_used++;
        c->ids[s] = id;
        c->slot_of[id] = s;
        c->n_pinned += si_flash_cache_pinned(c, id);
        load[*n_load] = id;
        load_slot[(*n_load)++] = s;
    }
    st->loads = *n_load;
    return SI_OK;
}
