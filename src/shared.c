/*
 * shared.c - the steps of contexts that share one engine.
 *
 * Each context evaluates on its own thread, as if alone: its call becomes a
 * request in the group's list and waits.  A waiting thread that finds no
 * step running and the group ready runs the next step for everyone: the
 * next token of every decoding context as one batch (si_engine_eval_multi:
 * the weights read once for all of them), or a prompt's next batch, and
 * wakes the others.  The group is ready when every
 * context inside a generation (engaged) has a request in, or when the
 * oldest request has waited STEP_WAIT_MS since it came or since the last
 * step ended, whichever is later: a generation comes back for its next
 * token within microseconds of its step, and a context evaluating outside
 * one is not waited for.  (Counted from the request's arrival alone, a
 * request that came during a step was past its wait when the step ended,
 * and the next step started before that step's contexts were back: 4
 * conversations on the 7B split into two cohorts of about 2 a step.)
 *
 * How prompts and decoding share the steps depends on the steps'
 * arithmetic (choose): with decoding's, a prompt goes in the batches it
 * would have alone, a step each, alternating with the others' steps; with
 * step_int8's, in chunks beside the others' tokens.  With decoding's
 * arithmetic a step of one token of the engine's own sequence takes the
 * decoding graph (si_engine_eval) instead.
 */
#include "shared.h"

#include "internal.h"
#include "starinfer.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

enum {
    STEP_WAIT_MS = 5,       /* the longest a request waits for engaged contexts */
    STEP_PROMPT_CHUNK = 32, /* step_int8: a prompt's tokens per step beside others */
};

struct request {
    struct si_ref *seq;
    const int32_t *tokens;
    int32_t n, done;
    int32_t take; /* tokens in the running step */
    bool f32, engaged, finished;
    int rc;
    double since;
    struct request *next;
};

struct si__group {
    pthread_mutex_t mu; /* the fields below */
    pthread_cond_t cv;  /* a request in or finished, a step over, an engagement changed */
    pthread_mutex_t eng_mu; /* the engine: held by a step, and by si__group_lock */
    struct si_engine *e;
    void *owned;
    int refs, engaged;
    struct request *head;
    int n_engaged_waiting; /* requests in the list from engaged contexts */
    bool running;
    double step_end;  /* when the last step ended (si__now) */
    bool last_prompt; /* the last step was a prompt's */
    struct si_engine_req *step; /* (n_batch) */
    struct request **in_step;   /* (n_batch) */
};

struct si__group *si__group_new(struct si_engine *e, void *owned)
{
    struct si__group *g = calloc(1, sizeof *g);
    if (g == NULL)
        return NULL;
    const int32_t nb = si_engine_n_batch(e);
    g->step = calloc((size_t)nb, sizeof *g->step);
    g->in_step = calloc((size_t)nb, sizeof *g->in_step);
    if (g->step == NULL || g->in_step == NULL) {
        free(g->step);
        free(g->in_step);
        free(g);
        return NULL;
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    pthread_mutex_init(&g->eng_mu, NULL);
    g->e = e;
    g->owned = owned;
    g->refs = 1;
    return g;
}

void si__group_hold(struct si__group *g)
{
    pthread_mutex_lock(&g->mu);
    g->refs++;
    pthread_mutex_unlock(&g->mu);
}

void si__group_drop(struct si__group *g)
{
    if (g == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    const int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left > 0)
        return;
    si_engine_free(g->e);
    free(g->owned);
    free(g->step);
    free(g->in_step);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->eng_mu);
    free(g);
}

void si__group_engage(struct si__group *g, int delta)
{
    pthread_mutex_lock(&g->mu);
    g->engaged += delta;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void si__group_lock(struct si__group *g)
{
    pthread_mutex_lock(&g->eng_mu);
}

void si__group_unlock(struct si__group *g)
{
    pthread_mutex_unlock(&g->eng_mu);
}

/* Under mu, a request in: when the oldest request's wait is over. */
static double wait_over(const struct si__group *g)
{
    const double from = g->head->since > g->step_end ? g->head->since : g->step_end;
    return from + STEP_WAIT_MS * 1e-3;
}

/* Under mu: whether the next step should run now. */
static bool ready(const struct si__group *g, double now)
{
    if (g->head == NULL || g->running)
        return false;
    return g->n_engaged_waiting >= g->engaged || now >= wait_over(g);
}

/* Whether r's tokens left make a prompt batch (si_engine_min_batch or more:
 * a prompt batch's arithmetic), which goes alone in its step. */
static bool is_prompt(const struct si__group *g, const struct request *r)
{
    return r->n - r->done >= si_engine_min_batch(g->e);
}

/*
 * Under mu: the next step's share of each request, into g->step (returns
 * how many requests take part).
 *
 * Decoding's arithmetic (not step_int8): a step is either a prompt's next
 * batch (up to n_batch tokens, as it would be alone: the same batches, so
 * the same results), or every other request's tokens (decoding's one,
 * short prompts': the reference's arithmetic, which no neighbour changes);
 * the two alternate while both wait, so that a long prompt delays each of
 * the others' tokens by one prompt batch at most.
 *
 * step_int8: every token's sums are its own whatever the step holds, so a
 * step takes every decoding token, then prompts in chunks of at most
 * STEP_PROMPT_CHUNK tokens beside them (whole, up to n_batch, alone).
 */
static int32_t choose(struct si__group *g)
{
    const int32_t nb = si_engine_n_batch(g->e);
    const bool mixed = si_engine_steps_int8(g->e);
    struct request *prompt = NULL;
    bool others = false;
    int32_t n_req = 0;
    for (struct request *r = g->head; r != NULL; r = r->next) {
        if (!is_prompt(g, r))
            others = true;
        else if (prompt == NULL)
            prompt = r;
    }
    if (!mixed && prompt != NULL && (!others || !g->last_prompt)) {
        const int32_t left = prompt->n - prompt->done;
        prompt->take = left < nb ? left : nb;
        g->in_step[n_req] = prompt;
        g->step[n_req++] = (struct si_engine_req){
            .seq = prompt->seq, .tokens = prompt->tokens + prompt->done, .n = prompt->take};
        g->last_prompt = true;
        return n_req;
    }
    int32_t budget = nb;
    const bool alone = g->head != NULL && g->head->next == NULL;
    for (int pass = 0; pass < (mixed ? 2 : 1); pass++)
        for (struct request *r = g->head; r != NULL && budget > 0; r = r->next) {
            const int32_t left = r->n - r->done;
            if (is_prompt(g, r) != (pass == 1))
                continue;
            int32_t k = left;
            if (pass == 1 && !alone && k > STEP_PROMPT_CHUNK)
                k = STEP_PROMPT_CHUNK;
            if (k > budget) {
                if (pass == 0 && n_req > 0)
                    continue; /* (a short prompt: the next step) */
                k = budget;   /* (or in pieces, when the batch is shorter still) */
            }
            r->take = k;
            budget -= k;
            g->in_step[n_req] = r;
            g->step[n_req++] = (struct si_engine_req){
                .seq = r->seq, .tokens = r->tokens + r->done, .n = k};
        }
    g->last_prompt = false;
    return n_req;
}

/* Under mu, not running, ready: one step, mu released while it runs. */
static void run_step(struct si__group *g)
{
    g->running = true;
    const int32_t n_req = choose(g);
    if (n_req == 0) { /* (cannot happen: the first request always gets tokens) */
        for (struct request *r = g->head; r != NULL; r = r->next)
            r->finished = true, r->rc = SI_E_RUNTIME;
        g->head = NULL;
        g->n_engaged_waiting = 0;
        g->running = false;
        pthread_cond_broadcast(&g->cv);
        return;
    }
    pthread_mutex_unlock(&g->mu);

    pthread_mutex_lock(&g->eng_mu);
    for (int32_t i = 0; i < n_req; i++)
        g->step[i].seq->attn_f32 = g->in_step[i]->f32;
    int rc;
    if (n_req == 1 && g->step[0].n == 1 && g->step[0].seq == si_engine_ref(g->e) &&
        !si_engine_steps_int8(g->e))
        rc = si_engine_eval(g->e, g->step[0].tokens[0]);
    else
        rc = si_engine_eval_multi(g->e, g->step, n_req);
    for (int32_t i = 0; i < n_req; i++)
        g->step[i].seq->attn_f32 = false;
    pthread_mutex_unlock(&g->eng_mu);

    pthread_mutex_lock(&g->mu);
    for (int32_t i = 0; i < n_req; i++) {
        struct request *r = g->in_step[i];
        if (rc == SI_OK)
            r->done += r->take;
        r->take = 0;
        if (rc != SI_OK || r->done == r->n) {
            r->rc = rc;
            r->finished = true;
        }
    }
    /* the finished ones out of the list */
    for (struct request **p = &g->head; *p != NULL;) {
        if ((*p)->finished) {
            if ((*p)->engaged)
                g->n_engaged_waiting--;
            *p = (*p)->next;
        } else {
            p = &(*p)->next;
        }
    }
    g->running = false;
    g->step_end = si__now();
    pthread_cond_broadcast(&g->cv);
}

int si__group_eval(struct si__group *g, struct si_ref *seq, const int32_t *tokens, int32_t n,
                   bool attn_f32, bool engaged, int32_t *done)
{
    struct request req = {.seq = seq, .tokens = tokens, .n = n, .f32 = attn_f32,
                          .engaged = engaged, .since = si__now()};
    pthread_mutex_lock(&g->mu);
    struct request **p = &g->head;
    while (*p != NULL)
        p = &(*p)->next;
    *p = &req;
    if (engaged)
        g->n_engaged_waiting++;
    pthread_cond_broadcast(&g->cv);
    while (!req.finished) {
        const double now = si__now();
        if (ready(g, now)) {
            run_step(g);
            continue;
        }
        /* until the oldest request's wait is over, or a change */
        double until = g->head != NULL && !g->running ? wait_over(g) : now + 0.05;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const double wait = until > now ? until - now : 0;
        const long ns = ts.tv_nsec + (long)(wait * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    *done = req.done;
    return req.rc;
}
