/* observe.c - FFN observation on the engine's batches (si_engine_observe)
 * and the corpus runner built on it (si_engine_ffn_runner). */
#include "graph/graph.h"

#include "internal.h" /* si__errf */
#include "starinfer.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* What the kept values of one batch token may take, all layers together. */
#define OBS_BYTES ((size_t)256 << 20)

int si_engine_observe(struct si_engine *e, si_ffn_hook fn, void *user)
{
    free(e->obs.x);
    free(e->obs.g);
    free(e->obs.h);
    free(e->obs.a);
    free(e->obs.r);
    e->obs.x = e->obs.g = e->obs.h = e->obs.a = e->obs.r = NULL;
    e->obs.fn = NULL;
    e->obs.user = NULL;
    e->obs.nb = 0;
    if (fn == NULL)
        return SI_OK;
    if ((e->lay.sparse && !e->lay.dense_records) || e->bat.n_batch <= 1)
        return SI_E_INVALID;
    const struct si_hparams *hp = &e->m->hp;
    const size_t per_tok =
        (size_t)hp->n_layer * (3 * (size_t)hp->n_embd + 2 * (size_t)hp->n_ff) * sizeof(float);
    size_t nb = OBS_BYTES / per_tok;
    nb = nb < 1 ? 1 : nb > (size_t)e->bat.n_batch ? (size_t)e->bat.n_batch : nb;
    const size_t rows = (size_t)hp->n_layer * nb;
    e->obs.x = malloc(rows * (size_t)hp->n_embd * sizeof(float));
    e->obs.g = malloc(rows * (size_t)hp->n_ff * sizeof(float));
    e->obs.h = malloc(rows * (size_t)hp->n_ff * sizeof(float));
    e->obs.a = malloc(rows * (size_t)hp->n_embd * sizeof(float));
    e->obs.r = malloc(rows * (size_t)hp->n_embd * sizeof(float));
    if (e->obs.x == NULL || e->obs.g == NULL || e->obs.h == NULL || e->obs.a == NULL ||
        e->obs.r == NULL) {
        si_engine_observe(e, NULL, NULL);
        return SI_E_NOMEM;
    }
    e->obs.fn = fn;
    e->obs.user = user;
    e->obs.nb = (int32_t)nb;
    return SI_OK;
}

void si__observe_batch(struct si_engine *e)
{
    const struct si_hparams *hp = &e->m->hp;
    const size_t d = (size_t)hp->n_embd, ff = (size_t)hp->n_ff, nb = (size_t)e->obs.nb;
    for (int32_t t = 0; t < e->bat.bn; t++)
        for (int32_t l = 0; l < hp->n_layer; l++) {
            const size_t row = (size_t)l * nb + (size_t)t;
            const struct si_ffn_view v = {e->m,
                                          e->obs.x + row * d,
                                          hp->ffn_kind == SI_FFN_PLAIN ? NULL : e->obs.g + row * ff,
                                          e->obs.h + row * ff,
                                          e->obs.a + row * d,
                                          e->obs.r + row * d};
            e->obs.fn(e->obs.user, &v, l);
        }
}

/* The runner: each window from a reset engine, BOS first when the model
 * adds one, its tokens as one batched evaluation under observation. */
static int engine_run(const struct si_ffn_runner *r, const struct si_model *m,
                      const int32_t *tokens, int64_t n, si_ffn_hook hook, void *user, char *err,
                      size_t err_size)
{
    struct si_engine *e = r->self;
    if (e == NULL || m != e->m)
        return si__errf(err, err_size, SI_E_INVALID, "engine runner: another model's engine");
    if (e->lay.sparse && !e->lay.dense_records)
        return si__errf(err, err_size, SI_E_INVALID,
                        "watching every FFN neuron needs the engine in dense mode");
    int rc = si_engine_observe(e, hook, user);
    if (rc != SI_OK)
        return si__errf(err, err_size, rc,
                        rc == SI_E_NOMEM ? "out of memory for the FFN values of a batch"
                                         : "watching the FFNs needs batches (a batch size of 2 "
                                           "or more)");
    const int64_t window = e->ref->p.n_ctx;
    const int32_t bos = si_profile_window_bos(m);
    int32_t *w = malloc((size_t)(n < window ? n : window) * sizeof *w + 1);
    if (w == NULL) {
        si_engine_observe(e, NULL, NULL);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n && rc == SI_OK; i += window) {
        const int64_t len = n - i < window ? n - i : window;
        memcpy(w, tokens + i, (size_t)len * sizeof *w);
        if (bos >= 0)
            w[0] = bos;
        si_engine_reset(e);
        rc = si_engine_eval_batch(e, w, (int32_t)len);
        if (rc != SI_OK)
            rc = si__errf(err, err_size, rc,
                          "engine evaluation of the window at token %" PRId64 " failed: %s", i,
                          si_status_str(rc));
    }
    free(w);
    si_engine_observe(e, NULL, NULL);
    return rc;
}

struct si_ffn_runner si_engine_ffn_runner(struct si_engine *e)
{
    return (struct si_ffn_runner){.run = engine_run, .self = e};
}
