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
            req[n] = (struct si_flash_req){s->base[(size_t)l * 4] + o,
                                           (len + SI_FLASH_BLOCK - 1) / SI_FLASH_BLOCK *
                                               SI_FLASH_BLOCK,
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

int main(int argc, char **argv)
{
    const char *model = NULL, *bundled = NULL, *split = NULL;
    int64_t budget = 0;
    bool half = false;
    int n_tok = 6, window = 5;
    uint64_t seed = 1;
    double pin = 0.9; /* --pin: share of the cache the last row keeps for the hottest */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            fprintf(stderr, "bench-flash: %s needs a value\n", a);
            return 1;
        }
        if (!strcmp(a, "-m"))
            model = v;
        else if (!strcmp(a, "--bundled"))
            bundled = v;
        else if (!strcmp(a, "--split"))
            split = v;
        else if (!strcmp(a, "--budget") && !strcmp(v, "half"))
            half = true;
        else if (!strcmp(a, "--budget"))
            budget = parse_size(v);
        else if (!strcmp(a, "-n"))
            n_tok = atoi(v);
        else if (!strcmp(a, "--window"))
            window = atoi(v);
        else if (!strcmp(a, "--pin"))
            pin = atof(v);
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, NULL, 10);
        else {
            fprintf(stderr, "bench-flash: unknown option %s\n", a);
            return 1;
        }
        i++;
    }
    if (!model || !bundled || !split || (budget <= 0 && !half) || n_tok < 2 || window < 0 ||
        !(pin >= 0.0 && pin <= 1.0)) {
        fprintf(stderr, "usage: bench-flash -m MODEL --bundled STORE --split STORE --budget SIZE "
                        "[-n TOKENS >= 2] [--window K] [--pin F] [--seed N]\n");
        return 1;
    }
    char err[600];
    struct si_model *m = NULL;
    if (si_model_load(&m, model, err, sizeof err) != SI_OK) {
        fprintf(stderr, "bench-flash: %s\n", err);
        return 1;
    }
    struct si_flash_store *sb = NULL, *ss = NULL;
    if (si_flash_store_open(&sb, bundled, m, 0, err, sizeof err) != SI_OK ||
        si_flash_store_open(&ss, split, m, 0, err, sizeof err) != SI_OK) {
        fprintf(stderr, "bench-flash: %s\n", err);
        return 1;
    }
    if (sb->layout != SI_FLASH_BUNDLED || ss->layout != SI_FLASH_SPLIT || !sb->direct ||
        !ss->direct) {
        fprintf(stderr, "bench-flash: need a bundled and a split store read with O_DIRECT (%s%s)\n",
                sb->why, ss->why);
        return 1;
    }
    const struct si_flash_format *f = &sb->f;
    const int32_t nl = f->n_layer, ff = f->n_ff;
    float *prob = malloc((size_t)nl * (size_t)ff * sizeof *prob);
    for (int32_t l = 0; l < nl; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_planted_prob", l);
        int64_t k = si_gguf_find_tensor(m->gguf, name);
        if (k < 0 || m->gguf->tensors[k].nbytes != (size_t)ff * 4) {
            fprintf(stderr, "bench-flash: %s has no %s (not a synthetic model)\n", model, name);
            return 1;
        }
        memcpy(prob + (size_t)l * ff, m->gguf->tensors[k].data, (size_t)ff * 4);
    }
    /* Resident besides the FFN: the model's other tensors (attention,
     * embeddings, norms, predictors); the FFN's bytes as the store holds
     * them (one record per neuron). */
    int64_t other = (int64_t)m->gguf->data_size, ffn = (int64_t)f->rec_bytes * ff * nl;
    for (int32_t l = 0; l < nl; l++) {
        const struct si_layer *W = &m->w.layers[l];
        other -= (int64_t)(W->ffn_gate.nbytes + W->ffn_up.nbytes + W->ffn_down.nbytes +
                           W->ffn_down_t.nbytes);
    }
    if (half) /* half of the model: its other tensors and its FFN once */
        budget = (other + ffn) / 2;
    const int64_t per_rec = (int64_t)f->rec_bytes + 12, spill = (int64_t)ff * per_rec;
    const int64_t cache_bytes = budget - other - spill;
    if (cache_bytes < per_rec * nl) {
        fprintf(stderr, "bench-flash: the budget leaves no room for caches\n");
        return 1;
    }
    const int64_t share = cache_bytes / per_rec / nl;
    const int32_t cap = (int32_t)(share < ff ? share : ff);
    const int64_t hybrid_resident = budget - other > 0 ? budget - other : 0;
    const int64_t hybrid_read = ffn - hybrid_resident > 0 ? ffn - hybrid_resident : 0;
    printf("model %s: %d layers x %d neurons, records of %zu bytes, FFN %.2f GiB as records, "
           "other tensors %.2f GiB\n",
           model, nl, ff, f->rec_bytes, (double)ffn / 1073741824.0, (double)other / 1073741824.0);
    printf("budget %.2f GiB: caches %d records per layer (%.2f GiB) + spill %.0f MiB; hybrid "
           "keeps %.2f GiB of FFN resident; %d tokens (means over tokens 2..%d), window %d, "
           "seed %llu, O_DIRECT\n",
           (double)budget / 1073741824.0, cap, (double)cap * per_rec * nl / 1073741824.0,
           (double)spill / 1048576.0, (double)hybrid_resident / 1073741824.0, n_tok, n_tok,
           window, (unsigned long long)seed);

    /* The masks: tokens x layers, each an active list. */
    int32_t **act = malloc((size_t)n_tok * (size_t)nl * sizeof *act);
    int32_t *n_act = malloc((size_t)n_tok * (size_t)nl * sizeof *n_act);
    rng = seed * 2654435761u + 88172645463325252ull;
    double mean_act = 0;
    for (int t = 0; t < n_tok; t++)
        for (int32_t l = 0; l < nl; l++) {
            int32_t *a = malloc((size_t)ff * sizeof *a), n = 0;
            for (int32_t i = 0; i < ff; i++)
                if (uniform() < prob[(size_t)l * ff + i])
                    a[n++] = i;
            act[t * nl + l] = a;
            n_act[t * nl + l] = n;
            mean_act += n;
        }
    mean_act /= (double)n_tok * nl;
    printf("active neurons per layer and token: %.0f of %d (%.1f%%)\n", mean_act, ff,
           100.0 * mean_act / ff);

    const size_t buf_bytes = 64u << 20;
    char *buf = aligned_alloc(4096, buf_bytes);
    const int64_t max_req = 3 * (int64_t)ff + (ffn / nl >> 20) + 2;
    struct si_flash_req *req = malloc((size_t)max_req * sizeof *req);
    int32_t *load = malloc((size_t)ff * sizeof *load), *slot = malloc((size_t)ff * sizeof *slot);
    int32_t *keep = malloc((size_t)ff * sizeof *keep), *fid = malloc((size_t)ff * sizeof *fid);
    char **dst = malloc((size_t)ff * sizeof *dst);
    char *spill_buf = aligned_alloc(SI_FLASH_BLOCK, (size_t)ff * f->rec_bytes);
    struct si_flash_cache *c = calloc((size_t)nl, sizeof *c);
    /* The last row: the hottest neurons by the profile (here the planted
     * probabilities) resident, each layer's share of the budget split
     * between them (a fraction `pin` of its records) and the window's cache. */
    const int32_t pinned = (int32_t)((double)cap * pin);
    bool *hot = calloc((size_t)nl * (size_t)ff, sizeof *hot);
    {
        float *pv = malloc((size_t)ff * sizeof *pv);
        for (int32_t l = 0; l < nl; l++) {
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
                    hot[(size_t)l * ff + i] = true, n++;
            for (int32_t i = 0; i < ff && n < pinned; i++)
                if (prob[(size_t)l * ff + i] == cut && !hot[(size_t)l * ff + i])
                    hot[(size_t)l * ff + i] = true, n++;
        }
        free(pv);
    }
    struct row rows[7];
    int nrows = 0;
    for (int r = 0; r < 7; r++) {
        static const char *const names[] = {"naive (all FFN records)",
                                            "hybrid (half resident)",
                                            "predictor",
                                            "predictor + window",
                                            "predictor + window + bundling",
                                            "... + adjacent records merged",
                                            "... + hottest neurons resident"};
        struct si_flash_store *s = r <= 1 || r >= 4 ? sb : ss;
        const bool merge = r >= 5, pin_row = r == 6;
        const int32_t w = r == 2 ? 0 : window;
        for (int32_t l = 0; l < nl && r >= 2; l++) {
            si_flash_cache_free(&c[l]);
            si_flash_cache_init(&c[l], ff,
                                r == 2    ? ff
                                : pin_row ? cap - pinned
                                          : cap,
                                f->rec_bytes, SI_FLASH_BLOCK, w, NULL, NULL);
        }
        double io = 0, manage = 0, bytes = 0;
        int64_t nreq = 0;
        for (int t = 0; t < n_tok; t++) {
            double io_t = 0, man_t = 0, bytes_t = 0;
            int64_t req_t = 0;
            if (r <= 1) {
                const int64_t per_layer = r == 0 ? ffn / nl : hybrid_read / nl;
                if (read_layers(s, per_layer, buf, buf_bytes, req, max_req, &io_t, &req_t)) {
                    fprintf(stderr, "bench-flash: read failed\n");
                    return 1;
                }
                bytes_t = (double)per_layer * nl;
            } else {
                for (int32_t l = 0; l < nl; l++) {
                    const double t0 = si__now();
                    const int32_t *a = act[t * nl + l];
                    int64_t na = n_act[t * nl + l], nk = 0, ns = 0, nld = 0;
                    if (pin_row) { /* the resident ones need no read */
                        int64_t o = 0;
                        for (int64_t i = 0; i < na; i++)
                            if (!hot[(size_t)l * ff + a[i]])
                                load[o++] = a[i];
                        a = load;
                        na = o;
                    }
                    /* as the engine's load task: in store order, the excess
                     * over the cache to the spill area */
                    const int32_t *row = s->row_of + (size_t)l * ff;
                    int32_t *sorted = keep;
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
                        cached += c[l].slot_of[sorted[i]] >= 0;
                    int64_t room = c[l].cap - cached;
                    for (int64_t i = 0; i < na; i++) {
                        if (c[l].slot_of[sorted[i]] >= 0 || room-- > 0)
                            sorted[nk++] = sorted[i];
                        else
                            fid[ns++] = sorted[i]; /* spilled: ids are file ids here */
                    }
                    struct si_flash_step st;
                    si_flash_cache_step(&c[l], sorted, nk, load, slot, &nld, &st);
                    for (int64_t k = 0; k < ns; k++)
                        dst[k] = spill_buf + (size_t)k * f->rec_bytes;
                    int64_t n_req = si_flash_plan(s, l, fid, ns, dst, req);
                    for (int64_t k = 0; k < nld; k++) {
                        fid[k] = load[k];
                        dst[k] = si_flash_cache_rec(&c[l], slot[k]);
                    }
                    n_req += si_flash_plan(s, l, fid, nld, dst, req + n_req);
                    if (!merge && s == sb) { /* one request per record */
                        int64_t q = 0;
                        for (int64_t k = 0; k < n_req; k++)
                            q += (int64_t)(req[k].len / f->rec_bytes);
                        int64_t o = q;
                        for (int64_t k = n_req - 1; k >= 0; k--)
                            for (int64_t p = (int64_t)(req[k].len / f->rec_bytes) - 1; p >= 0;
                                 p--)
                                req[--o] = (struct si_flash_req){
                                    req[k].off + (uint64_t)p * f->rec_bytes, f->rec_bytes,
                                    (char *)req[k].dst + (size_t)p * f->rec_bytes};
                        n_req = q;
                    }
                    const double t1 = si__now();
                    if (si_flash_read(s, req, n_req) != SI_OK) {
                        fprintf(stderr, "bench-flash: read failed\n");
                        return 1;
                    }
                    io_t += si__now() - t1;
                    man_t += t1 - t0;
                    for (int64_t k = 0; k < n_req; k++)
                        bytes_t += (double)req[k].len;
                    req_t += n_req;
                }
            }
            if (t > 0) {
                io += io_t;
                manage += man_t;
                bytes += bytes_t;
                nreq += req_t;
            }
        }
        const double n = n_tok - 1;
        rows[nrows++] = (struct row){names[r], bytes / 1048576.0 / n, (double)nreq / n,
                                     1e3 * io / n, 1e3 * manage / n};
        printf("  %-32s %10.1f MiB %9.0f requests %10.1f ms I/O %8.2f ms cache\n", names[r],
               rows[nrows - 1].mib, rows[nrows - 1].reqs, rows[nrows - 1].io_ms,
               rows[nrows - 1].manage_ms);
        fflush(stdout);
    }
    printf("\n| configuration | MiB read per token | requests per token | I/O ms per token | "
           "MiB/s | cache bookkeeping ms | I/O time vs naive |\n|---|---|---|---|---|---|---|\n");
    for (int r = 0; r < nrows; r++)
        printf("| %s | %.1f | %.0f | %.1f | %.0f | %.2f | %.1fx less |\n", rows[r].name,
               rows[r].mib, rows[r].reqs, rows[r].io_ms,
               rows[r].io_ms > 0 ? rows[r].mib / (rows[r].io_ms / 1e3) : 0.0, rows[r].manage_ms,
               rows[r].io_ms > 0 ? rows[0].io_ms / rows[r].io_ms : 0.0);
    for (int32_t l = 0; l < nl; l++)
        si_flash_cache_free(&c[l]);
    for (int t = 0; t < n_tok * nl; t++)
        free(act[t]);
    free(act);
    free(n_act);
    free(c);
    free(prob);
    free(hot);
    free(buf);
    free(req);
    free(load);
    free(slot);
    free(keep);
    free(fid);
    free(dst);
    free(spill_buf);
    si_flash_store_free(sb);
    si_flash_store_free(ss);
    si_model_free(m);
    return 0;
}
