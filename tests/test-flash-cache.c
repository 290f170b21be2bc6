/*
 * test-flash-cache.c - the flash cache's delete/append bookkeeping against a
 * simple model of what it should hold: per neuron a "cached" flag and the
 * token it was last active in, updated with sets, no slots.  Random token
 * sequences (a few neurons fire often, most rarely) over several windows
 * and capacities; after every step the cache's slots must hold exactly the
 * model's set, each slot the record of the neuron its table names (records
 * carry their neuron's id as a byte pattern, so a record moved to the wrong
 * slot shows), and the loads must be the model's missing neurons in order.
 * The same with pinned neurons (never deleted), and the bad calls.
 */
#include "flash/cache.h"
#include "starinfer.h"
#include "test.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define N 300
#define REC 512

static uint64_t rng = 88172645463325252ull;

static uint32_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* The record of neuron id: its id in every 4-byte word. */
static void fill_rec(char *r, int32_t id)
{
    for (size_t o = 0; o < REC; o += 4)
        memcpy(r + o, &id, 4);
}

static bool rec_is(const char *r, int32_t id)
{
    for (size_t o = 0; o < REC; o += 4) {
        int32_t v;
        memcpy(&v, r + o, 4);
        if (v != id)
            return false;
    }
    return true;
}

/* The simple model; neurons [pin_lo, pin_hi) are never dropped. */
static int32_t pin_lo, pin_hi;
static bool pinned(int32_t i)
{
    return i >= pin_lo && i < pin_hi;
}

struct model {
    bool cached[N];
    int64_t last[N];
    int64_t tick;
};

struct victim {
    int64_t last;
    int32_t id;
};

static int cmp_victim(const void *pa, const void *pb)
{
    const struct victim *a = pa, *b = pb;
    if (a->last != b->last)
        return a->last < b->last ? -1 : 1;
    return a->id - b->id;
}

/* The model's step: returns the loads in act order (count in *nl), or -1
 * when the active set exceeds cap. */
static int model_step(struct model *m, int32_t cap, int32_t window, const int32_t *act, int n,
                      int32_t *load, int *nl)
{
    const int64_t t = ++m->tick;
    bool now[N] = {0};
    for (int k = 0; k < n; k++) {
        now[act[k]] = true;
        m->last[act[k]] = t;
    }
    *nl = 0;
    int idle_pinned = 0;
    for (int i = 0; i < N; i++)
        idle_pinned += pinned(i) && m->cached[i] && !now[i];
    if (n + idle_pinned > cap)
        return -1;
    int kept = 0;
    for (int i = 0; i < N; i++) {
        if (m->cached[i] && !pinned(i) && (window == 0 || t - m->last[i] >= window))
            m->cached[i] = false;
        kept += m->cached[i];
    }
    int missing = 0;
    for (int k = 0; k < n; k++)
        missing += !m->cached[act[k]];
    if (kept + missing > cap) {
        struct victim v[N];
        int nv = 0;
        for (int i = 0; i < N; i++)
            if (m->cached[i] && !now[i] && !pinned(i))
                v[nv++] = (struct victim){m->last[i], i};
        qsort(v, (size_t)nv, sizeof *v, cmp_victim);
        for (int k = 0; k < nv && kept + missing > cap; k++, kept--)
            m->cached[v[k].id] = false;
    }
    for (int k = 0; k < n; k++)
        if (!m->cached[act[k]]) {
            m->cached[act[k]] = true;
            load[(*nl)++] = act[k];
        }
    return 0;
}

/* A token's active neurons: each neuron i fires with a probability falling
 * with i (power law), in a shuffled order. */
static int draw(int32_t *act)
{
    int n = 0;
    for (int i = 0; i < N; i++) {
        const double p = 0.9 / (1.0 + 0.15 * i);
        if ((double)next() / 4294967296.0 < p)
            act[n++] = i;
    }
    for (int k = n - 1; k > 0; k--) {
        int j = (int)(next() % (uint32_t)(k + 1));
        int32_t t = act[k];
        act[k] = act[j];
        act[j] = t;
    }
    return n;
}

static void run(int32_t cap, int32_t window, int steps, int32_t lo, int32_t hi)
{
    struct si_flash_cache c;
    pin_lo = lo;
    pin_hi = hi;
    /* the caller's matrix for one case, the cache's own for the others */
    char *mat = cap == 40 ? aligned_alloc(512, (size_t)cap * REC) : NULL;
    float *bias = cap == 40 ? malloc((size_t)cap * sizeof *bias) : NULL;
    int rc = si_flash_cache_init(&c, N, cap, REC, 512, window, mat, bias);
    CHECK(rc == SI_OK, "init cap %d window %d: %d", cap, window, rc);
    if (rc == SI_OK && hi > lo)
        CHECK((rc = si_flash_cache_pin(&c, lo, hi)) == SI_OK, "pin [%d, %d): %d", lo, hi, rc);
    if (rc != SI_OK) {
        free(mat);
        free(bias);
        return;
    }
    struct model m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < N; i++)
        m.last[i] = INT64_MIN / 2;
    int32_t act[N], load[N], slot[N], mload[N];
    int64_t total_loads = 0, total_hits = 0, budget_fails = 0;
    for (int s = 0; s < steps; s++) {
        const int n = draw(act);
        int64_t nl = 0;
        struct si_flash_step st;
        rc = si_flash_cache_step(&c, act, n, load, slot, &nl, &st);
        int mnl = 0;
        const int mrc = model_step(&m, cap, window, act, n, mload, &mnl);
        if (mrc < 0) {
            CHECK(rc == SI_E_BUDGET, "step %d: %d active, cap %d: rc %d", s, n, cap, rc);
            budget_fails++;
            /* the model and the cache disagree from here on (the model has
             * dropped nothing, nor has the cache): start both again */
            si_flash_cache_clear(&c);
            memset(&m, 0, sizeof m);
            for (int i = 0; i < N; i++)
                m.last[i] = INT64_MIN / 2;
            continue;
        }
        CHECK(rc == SI_OK, "step %d (cap %d window %d): rc %d", s, cap, window, rc);
        CHECK(nl == mnl, "step %d: %lld loads, the model %d", s, (long long)nl, mnl);
        for (int k = 0; k < nl && k < mnl; k++)
            CHECK(load[k] == mload[k], "step %d load %d: %d, the model %d", s, k, load[k],
                  mload[k]);
        CHECK(st.loads == nl && st.hits == n - nl, "step %d: stats %lld loads %lld hits", s,
              (long long)st.loads, (long long)st.hits);
        /* appended at the end, in order */
        for (int k = 0; k < nl; k++) {
            CHECK(slot[k] == c.n_used - nl + k, "step %d: load %d in slot %d of %d", s, k,
                  slot[k], c.n_used);
            fill_rec(si_flash_cache_rec(&c, slot[k]), load[k]);
            c.bias[slot[k]] = (float)load[k];
        }
        total_loads += nl;
        total_hits += st.hits;
        /* the slots hold exactly the model's set, tables consistent */
        int cached = 0;
        for (int i = 0; i < N; i++) {
            cached += m.cached[i];
            const int32_t sl = c.slot_of[i];
            CHECK((sl >= 0) == m.cached[i], "step %d: neuron %d cached %d, the model %d", s, i,
                  sl >= 0, m.cached[i]);
            if (sl >= 0)
                CHECK(sl < c.n_used && c.ids[sl] == i, "step %d: slot_of[%d] = %d", s, i, sl);
        }
        CHECK(c.n_used == cached && c.n_used <= cap, "step %d: num_used %d, the model %d", s,
              c.n_used, cached);
        int np = 0;
        for (int32_t i = lo; i < hi; i++)
            np += c.slot_of[i] >= 0;
        CHECK(c.n_pinned == np, "step %d: %d pinned cached, counted %d", s, np, c.n_pinned);
        for (int32_t sl = 0; sl < c.n_used; sl++)
            CHECK(rec_is(si_flash_cache_rec(&c, sl), c.ids[sl]) && c.bias[sl] == (float)c.ids[sl],
                  "step %d: slot %d does not hold neuron %d's record", s, sl, c.ids[sl]);
    }
    printf("cap %3d window %d pinned [%d, %d): %d steps, %lld loads, %lld hits, %lld over "
           "capacity\n",
           cap, window, lo, hi, steps, (long long)total_loads, (long long)total_hits,
           (long long)budget_fails);
    si_flash_cache_free(&c);
    free(mat);
    free(bias);
}

int main(void)
{
    /* Plenty of room: the window alone decides; then tighter caps that
     * force the least-recently-active deletions, and one below some
     * tokens' active sets (SI_E_BUDGET). */
    const int32_t windows[] = {0, 1, 2, 5, 8};
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
        run(N, windows[w], 200, 0, 0);
        run(40, windows[w], 200, 0, 0);
        run(28, windows[w], 200, 0, 0);
        /* pinned: the hottest (low ids), and a range of rarely active ones */
        run(40, windows[w], 200, 0, 20);
        run(40, windows[w], 200, 100, 130);
    }
    run(16, 5, 200, 0, 0);
    run(28, 2, 200, 0, 28); /* every slot pinned: budget failures when others fire */

    /* Bad input. */
    struct si_flash_cache c;
    CHECK(si_flash_cache_init(&c, N, 8, 100, 512, 1, NULL, NULL) == SI_E_INVALID,
          "rec_bytes not aligned");
    CHECK(si_flash_cache_init(&c, N, 8, REC, 512, 1, NULL, NULL) == SI_OK, "init");
    int32_t act[3] = {1, 2, 1}, load[3], slot[3];
    int64_t nl;
    struct si_flash_step st;
    CHECK(si_flash_cache_step(&c, act, 3, load, slot, &nl, &st) == SI_E_INVALID, "duplicate");
    act[2] = N;
    CHECK(si_flash_cache_step(&c, act, 3, load, slot, &nl, &st) == SI_E_INVALID, "out of range");
    act[2] = 3;
    CHECK(si_flash_cache_step(&c, act, 3, load, slot, &nl, &st) == SI_OK && nl == 3, "valid");
    CHECK(si_flash_cache_pin(&c, 0, 4) == SI_E_INVALID, "pin on a cache in use");
    si_flash_cache_clear(&c);
    CHECK(si_flash_cache_pin(&c, 0, 9) == SI_E_INVALID, "pin more than cap");
    CHECK(si_flash_cache_pin(&c, 5, 4) == SI_E_INVALID &&
              si_flash_cache_pin(&c, -1, 2) == SI_E_INVALID &&
              si_flash_cache_pin(&c, N - 2, N + 1) == SI_E_INVALID,
          "pin out of range");
    CHECK(si_flash_cache_pin(&c, 0, 8) == SI_OK, "pin the whole cap");
    si_flash_cache_free(&c);
    si_flash_cache_free(NULL);
    return test_result();
}
