/* prefill.c - a batch of prompt tokens as one task graph per batch (see
 * si_engine_eval_batch in engine.h). */
#include "graph/graph.h"

#include "codelets/codelets.h"
#include "graph/runtime.h"
#include "starinfer.h"

#include <starpu.h>
#include <string.h>

/* The batch's tokens in nr ranges of equal length (btp) and of about equal
 * attention work (btr: token t attends to bpos[t] + 1 positions). */
static void token_ranges(struct si_engine *e)
{
    const int64_t n = e->bat.bn, nr = e->bat.nr;
    double total = 0;
    for (int64_t t = 0; t < n; t++)
        total += (double)e->bat.bpos[t] + 1;
    int64_t t = 0;
    double done = 0;
    e->bat.btp[0] = e->bat.btr[0] = 0;
    for (int64_t r = 1; r < nr; r++) {
        const double want = total * (double)r / (double)nr;
        while (t < n && done + (double)(e->bat.bpos[t] + 1) <= want)
            done += (double)(e->bat.bpos[t++] + 1);
        e->bat.btr[r] = (int32_t)t;
        e->bat.btp[r] = (int32_t)(r * n / nr);
    }
    e->bat.btp[nr] = e->bat.btr[nr] = (int32_t)n;
}

/* Layer l of a batch. */
static int submit_batch_layer(struct si_engine *e, int l)
{
    int rc = si__submit_battn(e, l);
    return rc != 0 ? rc : si__submit_bffn(e, l);
}

/* The LM head over the batch's tokens bout0 .. bn - 1 into their logits rows
 * (h_blog_c): a task per slice of the vocabulary. */
static int submit_batch_logits(struct si_engine *e)
{
    int rc = 0;
    for (int32_t j = 0; j < e->bat.nlh && rc == 0; j++)
        rc = si__submit_bhead_rows(e, j);
    return rc;
}

/* The batch set up in e (btok, bn, bseq, bpos): its token ranges, the
 * embedding and every layer's tasks.  0 or StarPU's status. */
static int submit_batch_body(struct si_engine *e)
{
    token_ranges(e);
    int rc = si__submit_bembed(e);
    for (int l = 0; l < e->m->hp.n_layer && rc == 0; l++)
        rc = submit_batch_layer(e, l);
    return rc;
}

/* The batch set up in e, then the logits of its tokens bout0 .. bn - 1
 * into out (no LM head when bout0 == bn); waits for all of it. */
static int run_batch_rows(struct si_engine *e, float *out)
{
    int rc = submit_batch_body(e);
    if (e->bat.bout0 < e->bat.bn) {
        si__register_batch_logits(e, out, e->bat.bn - e->bat.bout0);
        if (rc == 0)
            rc = submit_batch_logits(e);
        si__unregister_batch_logits(e); /* waits for the head's tasks */
    }
    si_runtime_acquire(e->bat.h_bx, STARPU_R); /* and for the layers' */
    starpu_data_release(e->bat.h_bx);
    return rc;
}

/*
 * One batch of at most n_batch tokens (checked by the caller): embed, the
 * layers, then the last token's logits; or, with out, the logits of tokens
 * out_first .. n - 1 into out (none when out_first == n: no LM head).
 */
static int eval_batch(struct si_engine *e, const int32_t *tokens, int32_t n, int32_t out_first,
                      float *out)
{
    const struct si_hparams *hp = &e->m->hp;
    e->bat.btok = tokens;
    e->bat.bn = n;
    e->bat.bp0 = e->ref->n_past;
    e->bat.bout0 = out_first;
    e->bat.bstep = false;
    e->bat.bsplit = e->bat.bdec = n;
    for (int32_t t = 0; t < n; t++) {
        e->bat.bseq[t] = e->ref;
        e->bat.bpos[t] = e->bat.bp0 + t;
    }
    int rc;
    if (out != NULL) {
        rc = run_batch_rows(e, out);
        if (rc == 0) {
            e->ref->n_past = e->bat.bp0 + n;
            if (out_first < n) /* si_engine_logits: the last token's */
                memcpy(e->ref->logits, out + (size_t)(n - 1 - out_first) * (size_t)hp->n_vocab,
                       (size_t)hp->n_vocab * sizeof(float));
        }
    } else {
        rc = submit_batch_body(e);
        if (rc == 0)
            rc = si__submit_bhead(e); /* the last token's logits */
        si_runtime_acquire(e->dec.h_logits, STARPU_R);
        starpu_data_release(e->dec.h_logits);
    }
    if (rc != 0) {
        si_runtime_wait_all();
        return SI_E_RUNTIME;
    }
    if (e->obs.fn != NULL)
        si__observe_batch(e);
    return SI_OK;
}

/* si_engine_eval_batch and si_engine_eval_batch_logits (out NULL: the former). */
static int eval_tokens(struct si_engine *e, const int32_t *tokens, int32_t n, int32_t first,
                       float *out)
{
    const struct si_hparams *hp = &e->m->hp;
    if (n < 1 || tokens == NULL || (out != NULL && (first < 0 || first > n)))
        return SI_E_INVALID;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return SI_E_INVALID;
    if (si_runtime_has_caller_worker() && !si_runtime_is_caller_worker())
        return SI_E_RUNTIME;
    if ((int64_t)e->ref->n_past + n > e->ref->p.n_ctx)
        return SI_E_BUDGET;
    if (e->bat.n_batch <= 1 || (n == 1 && out == NULL && e->obs.fn == NULL)) {
        for (int32_t i = 0; i < n; i++) {
            int rc = si_engine_eval(e, tokens[i]);
            if (rc != SI_OK)
                return rc;
            if (out != NULL && i >= first)
                memcpy(out + (size_t)(i - first) * (size_t)hp->n_vocab, e->ref->logits,
                       (size_t)hp->n_vocab * sizeof(float));
        }
        return SI_OK;
    }
    const double t0 = si__now();
    const int32_t bmax = e->obs.fn != NULL ? e->obs.nb : e->bat.n_batch;
    for (int32_t i = 0; i < n; i += bmax) {
        const int32_t nb = n - i < bmax ? n - i : bmax;
        /* this batch's tokens from `first` on, and where their rows go */
        const int32_t f = out == NULL ? nb : first <= i ? 0 : first - i < nb ? first - i : nb;
        float *o =
            out == NULL || f == nb ? out : out + (size_t)(i + f - first) * (size_t)hp->n_vocab;
        int rc = eval_batch(e, tokens + i, nb, f, o);
        if (rc != SI_OK) {
            e->bat.bn = 0;
            return rc;
        }
    }
    e->bat.bn = 0; /* tasks submitted from now on are single-token ones */
    e->stats.batch_tokens += n;
    e->stats.batch_seconds += si__now() - t0;
    return SI_OK;
}

int si_engine_eval_batch(struct si_engine *e, const int32_t *tokens, int32_t n)
{
    return eval_tokens(e, tokens, n, 0, NULL);
}

int si_engine_eval_batch_logits(struct si_engine *e, const int32_t *tokens, int32_t n,
                                int32_t first, float *logits)
{
    if (logits == NULL)
        return SI_E_INVALID;
    return eval_tokens(e, tokens, n, first, logits);
}

/* si_engine_eval_multi's checks: SI_OK, or why the step cannot run. */
static int check_multi(const struct si_engine *e, const struct si_engine_req *r, int32_t n_req,
                       int32_t *total)
{
    const struct si_hparams *hp = &e->m->hp;
    if (r == NULL || n_req < 1 || e->bat.n_batch <= 1 || e->obs.fn != NULL)
        return SI_E_INVALID;
    int64_t n = 0;
    for (int32_t i = 0; i < n_req; i++) {
        if (r[i].seq == NULL || r[i].tokens == NULL || r[i].n < 1)
            return SI_E_INVALID;
        for (int32_t k = 0; k < i; k++)
            if (r[k].seq == r[i].seq)
                return SI_E_INVALID;
        for (int32_t t = 0; t < r[i].n; t++)
            if (r[i].tokens[t] < 0 || r[i].tokens[t] >= hp->n_vocab)
                return SI_E_INVALID;
        n += r[i].n;
    }
    if (n > e->bat.n_batch)
        return SI_E_INVALID;
    for (int32_t i = 0; i < n_req; i++)
        if ((int64_t)r[i].seq->n_past + r[i].n > r[i].seq->p.n_ctx)
            return SI_E_BUDGET;
    *total = (int32_t)n;
    return SI_OK;
}

/*
 * The step's tokens in batch order: first the tokens of requests of
 * SI__BLAS_MIN_BATCH tokens or more, in a prompt batch's arithmetic as they
 * would be alone, then the others in the reference's (bsplit between):
 * short prompts', then decoding tokens (bdec between: alone they take the
 * decoding graph, whose attention groups may multiply Wo); with step_int8
 * every token in step_int8's (arith_of).
 * The LM head's rows are each request's last token (bhrow), request i's
 * logits row i.  Attention reads each token's own sequence at its own
 * position, so the order changes no result.
 */
static void lay_out_step(struct si_engine *e, const struct si_engine_req *r, int32_t n_req,
                         int32_t total)
{
    int32_t t = 0;
    for (int pass = 0; pass < 3; pass++) {
        for (int32_t i = 0; i < n_req; i++) {
            const int kind = e->p.step_int8 || r[i].n >= SI__BLAS_MIN_BATCH ? 0
                             : r[i].n > 1                                   ? 1
                                                                            : 2;
            if (kind != pass)
                continue;
            for (int32_t k = 0; k < r[i].n; k++, t++) {
                e->bat.mtok[t] = r[i].tokens[k];
                e->bat.bseq[t] = r[i].seq;
                e->bat.bpos[t] = r[i].seq->n_past + k;
            }
            e->bat.bhrow[i] = t - 1;
        }
        if (pass == 0)
            e->bat.bsplit = t;
        if (pass == 1)
            e->bat.bdec = t;
    }
    e->bat.btok = e->bat.mtok;
    e->bat.bn = total;
    e->bat.bp0 = 0;
    e->bat.bout0 = total - n_req; /* the head's rows: n_req of them */
    e->bat.bstep = true;
    /* q, k, v split by heads where each token's sums are its own anyway
     * (not an exact step's prompt, which would meet sgemm) */
    e->bat.bheads = e->dec.ng == e->bat.nr && (e->p.step_int8 || e->bat.bsplit == 0);
}

int si_engine_eval_multi(struct si_engine *e, const struct si_engine_req *r, int32_t n_req)
{
    const struct si_hparams *hp = &e->m->hp;
    int32_t total = 0;
    int rc = check_multi(e, r, n_req, &total);
    if (rc != SI_OK)
        return rc;
    if (si_runtime_has_caller_worker() && !si_runtime_is_caller_worker())
        return SI_E_RUNTIME;
    if (n_req > e->bat.mlogits_rows) {
        float *p = realloc(e->bat.mlogits, (size_t)n_req * (size_t)hp->n_vocab * sizeof(float));
        if (p == NULL)
            return SI_E_NOMEM;
        e->bat.mlogits = p;
        e->bat.mlogits_rows = n_req;
    }
    const double t0 = si__now();
    lay_out_step(e, r, n_req, total);
    e->bat.step_hot = e->bat.step_cold = 0;
    rc = run_batch_rows(e, e->bat.mlogits);
    e->bat.bn = 0; /* tasks submitted from now on are single-token ones */
    e->bat.bstep = false;
    e->bat.bheads = false;
    if (rc != 0) {
        si_runtime_wait_all();
        return SI_E_RUNTIME;
    }
    for (int32_t i = 0; i < n_req; i++) {
        r[i].seq->n_past += r[i].n;
        memcpy(r[i].seq->logits, e->bat.mlogits + (size_t)i * (size_t)hp->n_vocab,
               (size_t)hp->n_vocab * sizeof(float));
    }
    /* the decoding tokens' neurons, as decoding counts them */
    e->stats.neurons_total +=
        (int64_t)(total - e->bat.bsplit) * (e->pipe.l1 - e->pipe.l0) * hp->n_ff;
    e->stats.neurons_hot += __atomic_exchange_n(&e->bat.step_hot, 0, __ATOMIC_RELAXED);
    e->stats.neurons_cold += __atomic_exchange_n(&e->bat.step_cold, 0, __ATOMIC_RELAXED);
    e->stats.steps++;
    e->stats.step_tokens += total;
    e->stats.step_seqs += n_req;
    e->stats.step_seconds += si__now() - t0;
    return SI_OK;
}
