/*
 * bench-flash.c - the flash tier's I/O, "LLM in a flash" Table 2's rows, on
 * a synthetic model's flash stores (`make bench-flash`, or by hand):
 *
 *   bench-flash -m MODEL --bundled STORE --split STORE --budget SIZE|half
 *               [-n TOKENS] [--window K] [--pin F] [--seed N]
 *
 * (half: half of the model's size counting its FFN once, as records, and its
 * other tensors, attention, embeddings, norms and predictors.)
 *
 * Masks: the model's planted activity (blk.N.ffn_planted_prob, written by
 * `starinfer synth`): each token, neuron i of layer l is active with its
 * planted probability, independently: what a perfect predictor would say on
 * the planted model.  (The synthetic predictor tensors are random, so the
 * engine's own predictor mode predicts far more neurons than fire; the
 * engine run is reported separately.)  Rows, each over the same tokens:
 *
 *   naive      every FFN record of every layer read for every token
 *   hybrid     the FFN weights the budget leaves room for stay resident
 *              (after attention, embeddings, norms, predictors), the rest
 *              read for every token
 *   predictor  the active neurons read, nothing kept (window 0), split
 *              store: a read per row (up, down_t; gate too when the model
 *              has one)
 *   +window    the engine's caches (flash/cache.h) under the budget, window
 *              K, split store
 *   +bundling  the same with the bundled store: one read per record
 *   +merging   bundled, adjacent records in one request (the engine's loader)
 *   +resident  the same, with a share F (--pin, default 0.9) of each layer's
 *              cache given to its hottest neurons by the profile (here the
 *              planted probabilities), resident and never read, the rest to
 *              the window: PowerInfer's hot/cold split over the flash tier
 *              (the engine's --flash-pin F)
 *
 * Reads go through the store's reader threads with O_DIRECT (the page cache
 * is bypassed; the tool refuses to run otherwise); naive and hybrid read
 * whole layers in 1 MiB requests.  Per token: MiB read, requests, the wall
 * time of the reads (I/O latency), the cache bookkeeping time; the first
 * token (empty caches) is left out of the means.
 */
#include "flash/cache.h"
#include "flash/store.h"
#include "internal.h" /* si__now */
#include "model/gguf.h"
#include "model/model.h"
#include "starinfer.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng;

static double uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static int64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    const char u = *end;
    const double k = u == 'K' ? 1024.0 : u == 'M' ? 1048576.0 : u == 'G' ? 1073741824.0 : 1.0;
    return (int64_t)(v * k);
}

struct row {
    const char *name;
    double mib, reqs, io_ms, manage_ms;
};

/* Whole layers in 1 MiB requests: bytes [0, bytes) of each layer's records. */
static int read_layers(struct si_flash_store *s, int64_t per_layer, char *buf, size_t buf_bytes,
                       struct si_flash_req *req, int64_t max_req, double *io, int64_t *nreq)
{
    const int32_t nl = s->f.n_layer;
    const uint64_t chunk = 1u << 20;
    for (int32_t l = 0; l < nl; l++) {
        int64_t n = 0;
        for (uint64_t o = 0; o < (uint64_t)per_layer && n < max_req; o += chunk, n++) {
            const uint64_t len = (uint64_t)per_layer - o < chunk ? (uint64_t)per_layer - o : chunk;
            req[n] =
                (struct si_flash_req){s->base[(size_t)l * 4] + o,
                                      (len + SI_FLASH_BLOCK - 1) / SI_FLASH_BLOCK * SI_FLASH_BLOCK,
                                      buf + (o % buf_bytes)};
        }
        const double t0 = si__now();
        if (si_flash_read(s, req, n) != SI_OK)
            return 1;
        *io += si__now() - t0;
        *nreq += n;
    }
    return 0;
}

/* The options. */
struct opts {
    const char *model, *bundled, *split;
    int64_t budget;
    bool half; /* --budget half */
    int n_tok, window;
    uint64_t seed;
    double pin; /* --pin: share of the cache the last row keeps for the hottest */
};

/* The options into o; 0, or 1 after the message (the usage line when one
 * is missing or out of range). */
static int parse_options(struct opts *o, int argc, char **argv)
{
    *o = (struct opts){.n_tok = 6, .window = 5, .seed = 1, .pin = 0.9};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            fprintf(stderr, "bench-flash: %s needs a value\n", a);
            return 1;
        }
        if (!strcmp(a, "-m"))
            o->model = v;
        else if (!strcmp(a, "--bundled"))
            o->bundled = v;
        else if (!strcmp(a, "--split"))
            o->split = v;
        else if (!strcmp(a, "--budget") && !strcmp(v, "half"))
            o->half = true;
        else if (!strcmp(a, "--budget"))
            o->budget = parse_size(v);
        else if (!strcmp(a, "-n"))
            o->n_tok = atoi(v);
        else if (!strcmp(a, "--window"))
            o->window = atoi(v);
        else if (!strcmp(a, "--pin"))
            o->pin = atof(v);
        else if (!strcmp(a, "--seed"))
            o->seed = strtoull(v, NULL, 10);
        else {
            fprintf(stderr, "bench-flash: unknown option %s\n", a);
            return 1;
        }
        i++;
    }
    if (!o->model || !o->bundled || !o->split || (o->budget <= 0 && !o->half) || o->n_tok < 2 ||
        o->window < 0 || !(o->pin >= 0.0 && o->pin <= 1.0)) {
        fprintf(stderr, "usage: bench-flash -m MODEL --bundled STORE --split STORE --budget SIZE "
                        "[-n TOKENS >= 2] [--window K] [--pin F] [--seed N]\n");
        return 1;
    }
    return 0;
}

/* What the rows share: the model and its stores, the budget's split, the
 * masks, the caches and the buffers of the reads. */
struct bench {
    struct opts o;
    struct si_model *m;
    struct si_flash_store *sb, *ss; /* bundled, split */
    const struct si_flash_format *f;
    int32_t nl, ff;
    float *prob;           /* nl x ff: the planted activity */
    int64_t other, ffn;    /* bytes: the tensors besides the FFN; the FFN as records */
    int64_t hybrid_read;   /* FFN bytes hybrid reads per token */
    int32_t cap, pinned;   /* records per layer's cache; of them resident (last row) */
    int32_t **act, *n_act; /* n_tok x nl active lists */
    bool *hot;             /* nl x ff: resident in the last row */
    char *buf;             /* naive and hybrid's reads land here */
    struct si_flash_req *req;
    int64_t max_req;
    int32_t *load, *slot, *keep, *fid;
    char **dst, *spill_buf;   /* where the records go; the spilled ones */
    struct si_flash_cache *c; /* per layer */
};

static const size_t buf_bytes = 64u << 20;

/* The model, its two stores (read with O_DIRECT) and its planted activity;
 * 0, or 1 after the message. */
static int open_model(struct bench *b)
{
    char err[600];
    if (si_model_load(&b->m, b->o.model, err, sizeof err) != SI_OK) {
        fprintf(stderr, "bench-flash: %s\n", err);
        return 1;
    }
    if (si_flash_store_open(&b->sb, b->o.bundled, b->m, 0, err, sizeof err) != SI_OK ||
        si_flash_store_open(&b->ss, b->o.split, b->m, 0, err, sizeof err) != SI_OK) {
        fprintf(stderr, "bench-flash: %s\n", err);
        return 1;
    }
    if (b->sb->layout != SI_FLASH_BUNDLED || b->ss->layout != SI_FLASH_SPLIT || !b->sb->direct ||
        !b->ss->direct) {
        fprintf(stderr, "bench-flash: need a bundled and a split store read with O_DIRECT (%s%s)\n",
                b->sb->why, b->ss->why);
        return 1;
    }
    b->f = &b->sb->f;
    const int32_t nl = b->nl = b->f->n_layer, ff = b->ff = b->f->n_ff;
    b->prob = malloc((size_t)nl * (size_t)ff * sizeof *b->prob);
    for (int32_t l = 0; l < nl; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_planted_prob", l);
        int64_t k = si_gguf_find_tensor(b->m->gguf, name);
        if (k < 0 || b->m->gguf->tensors[k].nbytes != (size_t)ff * 4) {
            fprintf(stderr, "bench-flash: %s has no %s (not a synthetic model)\n", b->o.model,
                    name);
            return 1;
        }
        memcpy(b->prob + (size_t)l * ff, b->m->gguf->tensors[k].data, (size_t)ff * 4);
    }
    return 0;
}

/* The budget's split: resident besides the FFN, the model's other tensors
 * (attention, embeddings, norms, predictors); the FFN's bytes as the store
 * holds them (one record per neuron); the caches' records per layer after
 * the spill area.  0, or 1 after the message. */
static int split_budget(struct bench *b)
{
    const struct si_flash_format *f = b->f;
    const int32_t nl = b->nl, ff = b->ff;
    b->other = (int64_t)b->m->gguf->data_size;
    b->ffn = (int64_t)f->rec_bytes * ff * nl;
    for (int32_t l = 0; l < nl; l++) {
        const struct si_layer *W = &b->m->w.layers[l];
        b->other -= (int64_t)(W->ffn_gate.nbytes + W->ffn_up.nbytes + W->ffn_down.nbytes +
                              W->ffn_down_t.nbytes);
    }
    if (b->o.half) /* half of the model: its other tensors and its FFN once */
        b->o.budget = (b->other + b->ffn) / 2;
    const int64_t budget = b->o.budget;
    const int64_t per_rec = (int64_t)f->rec_bytes + 12, spill = (int64_t)ff * per_rec;
    const int64_t cache_bytes = budget - b->other - spill;
    if (cache_bytes < per_rec * nl) {
        fprintf(stderr, "bench-flash: the budget leaves no room for caches\n");
        return 1;
    }
    const int64_t share = cache_bytes / per_rec / nl;
    b->cap = (int32_t)(share < ff ? share : ff);
    const int64_t hybrid_resident = budget - b->other > 0 ? budget - b->other : 0;
    b->hybrid_read = b->ffn - hybrid_resident > 0 ? b->ffn - hybrid_resident : 0;
    printf("model %s: %d layers x %d neurons, records of %zu bytes, FFN %.2f GiB as records, "
           "other tensors %.2f GiB\n",
           b->o.model, nl, ff, f->rec_bytes, (double)b->ffn / 1073741824.0,
           (double)b->other / 1073741824.0);
    printf("budget %.2f GiB: caches %d records per layer (%.2f GiB) + spill %.0f MiB; hybrid "
           "keeps %.2f GiB of FFN resident; %d tokens (means over tokens 2..%d), window %d, "
           "seed %llu, O_DIRECT\n",
           (double)budget / 1073741824.0, b->cap, (double)b->cap * per_rec * nl / 1073741824.0,
           (double)spill / 1048576.0, (double)hybrid_resident / 1073741824.0, b->o.n_tok,
           b->o.n_tok, b->o.window, (unsigned long long)b->o.seed);
    return 0;
}

/* The masks: tokens x layers, each an active list drawn from the planted
 * probabilities. */
static void draw_masks(struct bench *b)
{
    const int32_t nl = b->nl, ff = b->ff, n_tok = b->o.n_tok;
    b->act = malloc((size_t)n_tok * (size_t)nl * sizeof *b->act);
    b->n_act = malloc((size_t)n_tok * (size_t)nl * sizeof *b->n_act);
    rng = b->o.seed * 2654435761u + 88172645463325252ull;
    double mean_act = 0;
    for (int t = 0; t < n_tok; t++)
        for (int32_t l = 0; l < nl; l++) {
            int32_t *a = malloc((size_t)ff * sizeof *a), n = 0;
            for (int32_t i = 0; i < ff; i++)
                if (uniform() < b->prob[(size_t)l * ff + i])
                    a[n++] = i;
            b->act[t * nl + l] = a;
            b->n_act[t * nl + l] = n;
            mean_act += n;
        }
    mean_act /= (double)n_tok * nl;
    printf("active neurons per layer and token: %.0f of %d (%.1f%%)\n", mean_act, ff,
           100.0 * mean_act / ff);
}

/* The reads' buffers and requests, and the layers' caches. */
static void alloc_buffers(struct bench *b)
{
    const int32_t ff = b->ff;
    b->buf = aligned_alloc(4096, buf_bytes);
    b->max_req = 3 * (int64_t)ff + (b->ffn / b->nl >> 20) + 2;
    b->req = malloc((size_t)b->max_req * sizeof *b->req);
    b->load = malloc((size_t)ff * sizeof *b->load);
    b->slot = malloc((size_t)ff * sizeof *b->slot);
    b->keep = malloc((size_t)ff * sizeof *b->keep);
    b->fid = malloc((size_t)ff * sizeof *b->fid);
    b->dst = malloc((size_t)ff * sizeof *b->dst);
    b->spill_buf = aligned_alloc(SI_FLASH_BLOCK, (size_t)ff * b->f->rec_bytes);
    b->c = calloc((size_t)b->nl, sizeof *b->c);
}

/* The last row's resident neurons: the hottest by the profile (here the
 * planted probabilities), each layer's share of the budget split between
 * them (a fraction --pin of its records) and the window's cache. */
static void pick_hot(struct bench *b)
{
    const int32_t nl = b->nl, ff = b->ff;
    const int32_t pinned = b->pinned = (int32_t)((double)b->cap * b->o.pin);
    const float *prob = b->prob;
    b->hot = calloc((size_t)nl * (size_t)ff, sizeof *b->hot);
    float *pv = malloc((size_t)ff * sizeof *pv);
    for (int32_t l = 0; l < nl; l++) {
        bool *hot = b->hot + (size_t)l * ff;
        /* the pinned-th largest probability of the layer, then those above it */
        memcpy(pv, prob + (size_t)l * ff, (size_t)ff * sizeof *pv);
        int32_t n = 0;
        for (int32_t k = 0; k < pinned; k++) { /* partial selection, pinned << ff */
            int32_t best = k;
            for (int32_t i = k + 1; i < ff; i++)
                if (pv[i] > pv[best])
                    best = i;
            const float t = pv[k];
            pv[k] = pv[best];
            pv[best] = t;
        }
        const float cut = pinned > 0 ? pv[pinned - 1] : 2.0f;
        for (int32_t i = 0; i < ff && n < pinned; i++)
            if (prob[(size_t)l * ff + i] > cut)
                hot[i] = true, n++;
        for (int32_t i = 0; i < ff && n < pinned; i++)
            if (prob[(size_t)l * ff + i] == cut && !hot[i])
                hot[i] = true, n++;
    }
    free(pv);
}

/* Layer l's requests for token t into b->req, as the engine's load task
 * makes them: the active neurons (less the resident ones in the pin row)
 * in store order, the excess over the cache to the spill area; their
 * count. */
static int64_t plan_layer(struct bench *b, const struct si_flash_store *s, int32_t l, int t,
                          bool pin_row)
{
    const int32_t ff = b->ff;
    struct si_flash_cache *c = &b->c[l];
    const int32_t *a = b->act[t * b->nl + l];
    int64_t na = b->n_act[t * b->nl + l], nk = 0, ns = 0, nld = 0;
    if (pin_row) { /* the resident ones need no read */
        int64_t o = 0;
        for (int64_t i = 0; i < na; i++)
            if (!b->hot[(size_t)l * ff + a[i]])
                b->load[o++] = a[i];
        a = b->load;
        na = o;
    }
    const int32_t *row = s->row_of + (size_t)l * ff;
    int32_t *sorted = b->keep;
    memmove(sorted, a, (size_t)na * sizeof *a);
    for (int64_t i = 1; i < na; i++) { /* insertion sort by row */
        int32_t v = sorted[i];
        int64_t j = i;
        for (; j > 0 && row[sorted[j - 1]] > row[v]; j--)
            sorted[j] = sorted[j - 1];
        sorted[j] = v;
    }
    int64_t cached = 0;
    for (int64_t i = 0; i < na; i++)
        cached += c->slot_of[sorted[i]] >= 0;
    int64_t room = c->cap - cached;
    for (int64_t i = 0; i < na; i++) {
        if (c->slot_of[sorted[i]] >= 0 || room-- > 0)
            sorted[nk++] = sorted[i];
        else
            b->fid[ns++] = sorted[i]; /* spilled: ids are file ids here */
    }
    struct si_flash_step st;
    si_flash_cache_step(c, sorted, nk, b->load, b->slot, &nld, &st);
    for (int64_t k = 0; k < ns; k++)
        b->dst[k] = b->spill_buf + (size_t)k * b->f->rec_bytes;
    int64_t n_req = si_flash_plan(s, l, b->fid, ns, b->dst, b->req);
    for (int64_t k = 0; k < nld; k++) {
        b->fid[k] = b->load[k];
        b->dst[k] = si_flash_cache_rec(c, b->slot[k]);
    }
    return n_req + si_flash_plan(s, l, b->fid, nld, b->dst, b->req + n_req);
}

/* Requests req[0..n) split into one per record (of rec bytes): the new
 * count. */
static int64_t one_per_record(struct si_flash_req *req, int64_t n, size_t rec)
{
    int64_t q = 0;
    for (int64_t k = 0; k < n; k++)
        q += (int64_t)(req[k].len / rec);
    int64_t o = q;
    for (int64_t k = n - 1; k >= 0; k--)
        for (int64_t p = (int64_t)(req[k].len / rec) - 1; p >= 0; p--)
            req[--o] = (struct si_flash_req){req[k].off + (uint64_t)p * rec, rec,
                                             (char *)req[k].dst + (size_t)p * rec};
    return q;
}

/* One token's reads, or their sum over the tokens after the first. */
struct tally {
    double io, manage, bytes;
    int64_t reqs;
};

/* Token t's reads of row r: naive and hybrid whole layers, the others the
 * active neurons through the caches; 0, or 1 after the message. */
static int read_token(struct bench *b, int r, int t, struct tally *x)
{
    struct si_flash_store *s = r <= 1 || r >= 4 ? b->sb : b->ss;
    const bool merge = r >= 5, pin_row = r == 6;
    const int32_t nl = b->nl;
    if (r <= 1) {
        const int64_t per_layer = r == 0 ? b->ffn / nl : b->hybrid_read / nl;
        if (read_layers(s, per_layer, b->buf, buf_bytes, b->req, b->max_req, &x->io, &x->reqs)) {
            fprintf(stderr, "bench-flash: read failed\n");
            return 1;
        }
        x->bytes = (double)per_layer * nl;
        return 0;
    }
    for (int32_t l = 0; l < nl; l++) {
        const double t0 = si__now();
        int64_t n_req = plan_layer(b, s, l, t, pin_row);
        if (!merge && s == b->sb) /* one request per record */
            n_req = one_per_record(b->req, n_req, b->f->rec_bytes);
        const double t1 = si__now();
        if (si_flash_read(s, b->req, n_req) != SI_OK) {
            fprintf(stderr, "bench-flash: read failed\n");
            return 1;
        }
        x->io += si__now() - t1;
        x->manage += t1 - t0;
        for (int64_t k = 0; k < n_req; k++)
            x->bytes += (double)b->req[k].len;
        x->reqs += n_req;
    }
    return 0;
}

static const char *const row_names[] = {"naive (all FFN records)",
                                        "hybrid (half resident)",
                                        "predictor",
                                        "predictor + window",
                                        "predictor + window + bundling",
                                        "... + adjacent records merged",
                                        "... + hottest neurons resident"};

/* Row r over every token, its caches made afresh (the predictor row keeps
 * nothing: window 0), its line printed; 0, or 1 after the message. */
static int run_row(struct bench *b, int r, struct row *out)
{
    const int32_t w = r == 2 ? 0 : b->o.window;
    for (int32_t l = 0; l < b->nl && r >= 2; l++) {
        si_flash_cache_free(&b->c[l]);
        si_flash_cache_init(&b->c[l], b->ff,
                            r == 2   ? b->ff
                            : r == 6 ? b->cap - b->pinned
                                     : b->cap,
                            b->f->rec_bytes, SI_FLASH_BLOCK, w, NULL, NULL);
    }
    struct tally sum = {0};
    for (int t = 0; t < b->o.n_tok; t++) {
        struct tally x = {0};
        if (read_token(b, r, t, &x) != 0)
            return 1;
        if (t > 0) {
            sum.io += x.io;
            sum.manage += x.manage;
            sum.bytes += x.bytes;
            sum.reqs += x.reqs;
        }
    }
    const double n = b->o.n_tok - 1;
    *out = (struct row){row_names[r], sum.bytes / 1048576.0 / n, (double)sum.reqs / n,
                        1e3 * sum.io / n, 1e3 * sum.manage / n};
    printf("  %-32s %10.1f MiB %9.0f requests %10.1f ms I/O %8.2f ms cache\n", row_names[r],
           out->mib, out->reqs, out->io_ms, out->manage_ms);
    fflush(stdout);
    return 0;
}

/* The rows side by side, a Markdown table. */
static void print_table(const struct row *rows, int nrows)
{
    printf("\n| configuration | MiB read per token | requests per token | I/O ms per token | "
           "MiB/s | cache bookkeeping ms | I/O time vs naive |\n|---|---|---|---|---|---|---|\n");
    for (int r = 0; r < nrows; r++)
        printf("| %s | %.1f | %.0f | %.1f | %.0f | %.2f | %.1fx less |\n", rows[r].name,
               rows[r].mib, rows[r].reqs, rows[r].io_ms,
               rows[r].io_ms > 0 ? rows[r].mib / (rows[r].io_ms / 1e3) : 0.0, rows[r].manage_ms,
               rows[r].io_ms > 0 ? rows[0].io_ms / rows[r].io_ms : 0.0);
}

/* Everything the bench holds. */
static void free_bench(struct bench *b)
{
    for (int32_t l = 0; l < b->nl; l++)
        si_flash_cache_free(&b->c[l]);
    for (int t = 0; t < b->o.n_tok * b->nl; t++)
        free(b->act[t]);
    free(b->act);
    free(b->n_act);
    free(b->c);
    free(b->prob);
    free(b->hot);
    free(b->buf);
    free(b->req);
    free(b->load);
    free(b->slot);
    free(b->keep);
    free(b->fid);
    free(b->dst);
    free(b->spill_buf);
    si_flash_store_free(b->sb);
    si_flash_store_free(b->ss);
    si_model_free(b->m);
}

int main(int argc, char **argv)
{
    struct bench b = {0};
    if (parse_options(&b.o, argc, argv) != 0 || open_model(&b) != 0 || split_budget(&b) != 0)
        return 1;
    draw_masks(&b);
    alloc_buffers(&b);
    pick_hot(&b);
    struct row rows[7];
    int nrows = 0;
    for (int r = 0; r < 7; r++)
        if (run_row(&b, r, &rows[nrows++]) != 0)
            return 1;
    print_table(rows, nrows);
    free_bench(&b);
    return 0;
}
