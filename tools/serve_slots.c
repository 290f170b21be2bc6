/*
 * serve_slots.c - the server's slots: one context (KV cache, sampler,
 * engine) each on the one loaded model, a thread each, and a bounded queue
 * of jobs that the first free slot takes.  A job's text grows under its
 * mutex as tokens come; the HTTP side waits on its condition variable.
 */
#include "serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct slot {
    struct si_slots *s;
    struct si_context *ctx;
    pthread_t th;
    bool started;
    int32_t used;           /* tokens in the cache after the last job (under s->mu) */
    int32_t *cached;        /* those tokens, a copy (under s->mu) */
    struct si_job *current; /* the job running (under s->mu) */
    struct si_job *next;    /* a job handed to this idle slot (under s->mu) */
    bool idle;              /* waiting for a job (under s->mu) */
};

struct si_slots {
    int n;
    struct slot *slot;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct si_job **queue; /* ring of queue_max */
    int queue_max, qhead, qlen;
    bool stopping;
    struct si_serve_counters c;
    int32_t n_ctx;
};

/* ------------------------------------------------------------------- jobs */

struct si_job *si_job_new(enum si_job_kind kind)
{
    struct si_job *j = calloc(1, sizeof *j);
    if (j == NULL)
        return NULL;
    j->kind = kind;
    j->refs = 1;
    j->state = SI_JOB_QUEUED;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    return j;
}

void si_job_ref(struct si_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void si_job_unref(struct si_job *j)
{
    if (j == NULL)
        return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0)
        return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    for (int i = 0; i < j->n_stop; i++)
        free(j->stop[i]);
    free(j->tokens);
    free(j->text.p);
    free(j);
}

void si_job_wait(struct si_job *j, long ms)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000;
    if (t.tv_nsec >= 1000000000) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&j->cv, &j->mu, &t);
}

void si_job_cancel(struct si_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->cancelled = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* End a job (under j->mu): its last state, and everyone waiting woken. */
static void finish_locked(struct si_job *j, enum si_finish f)
{
    if (j->finish == SI_FINISH_NONE)
        j->finish = f;
    j->safe = j->text.n;
    j->state = SI_JOB_DONE;
    pthread_cond_broadcast(&j->cv);
}

static void fail(struct si_job *j, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    snprintf(j->error, sizeof j->error, "%s", msg);
    finish_locked(j, SI_FINISH_ERROR);
    pthread_mutex_unlock(&j->mu);
}

/* The longest suffix of text[0..len) that is a proper prefix of a stop
 * sequence: it may still become one, so it is held back from the stream. */
static size_t held_back(const struct si_job *j)
{
    size_t best = 0;
    for (int i = 0; i < j->n_stop; i++) {
        size_t sl = strlen(j->stop[i]);
        if (sl == 0)
            continue;
        for (size_t k = sl - 1; k > best; k--)
            if (k <= j->text.n && memcmp(j->text.p + j->text.n - k, j->stop[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* The generation's callback: append the text, look for a stop sequence in
 * what it may have completed, wake the reader. */
static bool on_token(void *user, int32_t token, const char *text, size_t len)
{
    struct si_job *j = user;
    pthread_mutex_lock(&j->mu);
    size_t old = j->text.n;
    if (!si_buf_add(&j->text, text, len)) {
        snprintf(j->error, sizeof j->error, "out of memory");
        finish_locked(j, SI_FINISH_ERROR);
        pthread_mutex_unlock(&j->mu);
        return false;
    }
    if (token >= 0)
        j->n_generated++;
    bool go = !j->cancelled;
    for (int i = 0; i < j->n_stop; i++) {
        size_t sl = strlen(j->stop[i]);
        size_t from = old + 1 >= sl ? old + 1 - sl : 0;
        /* (memmem: the model's text may hold NUL bytes) */
        char *hit = j->text.n >= sl ? memmem(j->text.p + from, j->text.n - from, j->stop[i], sl)
                                    : NULL;
        if (hit != NULL) {
            j->text.n = (size_t)(hit - j->text.p);
            j->text.p[j->text.n] = '\0';
            j->finish = SI_FINISH_STOP;
            go = false;
            break;
        }
    }
    j->safe = go ? j->text.n - held_back(j) : j->text.n;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return go;
}

/* The slot is free again (under s->mu): done before its job is finished,
 * so that a client that sends its next request as soon as it has the answer
 * finds the slot idle, its cache published. */
static void release_locked(struct slot *sl)
{
    sl->current = NULL;
    sl->s->c.running--;
    sl->idle = true;
}

static void release(struct slot *sl)
{
    pthread_mutex_lock(&sl->s->mu);
    release_locked(sl);
    pthread_mutex_unlock(&sl->s->mu);
}

static void run_job(struct slot *sl, struct si_job *j)
{
    struct si_context *ctx = sl->ctx;
    /* The prompt's start the cache already holds is not evaluated again
     * (a conversation's next turn resends the turns before it). */
    int32_t k = 0;
    if (j->cache_prompt)
        k = si_context_reuse_prefix(ctx, j->tokens, j->n_tokens);
    if (k <= 0) {
        k = 0;
        si_context_reset(ctx);
    }
    si_context_reset_stats(ctx);
    if (si_context_set_sampling(ctx, j->sampling) != SI_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", si_last_error());
        release(sl);
        fail(j, msg);
        return;
    }
    struct si_generate_params gp = si_generate_default_params();
    gp.n_predict = j->max_tokens;
    gp.ignore_eos = j->ignore_eos;
    struct si_generate_result res = {0};
    int rc = si_generate_tokens(ctx, j->tokens + k, j->n_tokens - k, gp, on_token, j, &res);
    struct si_stats st;
    si_context_get_stats(ctx, &st);

    struct si_slots *s = sl->s;
    pthread_mutex_lock(&s->mu);
    s->c.prompt_tokens += res.n_prompt;
    s->c.cached_tokens += k;
    s->c.generated_tokens += res.n_generated;
    s->c.prompt_seconds += res.prompt_seconds;
    s->c.generate_seconds += res.generate_seconds;
    s->c.neurons_total += st.neurons_total;
    s->c.neurons_computed += st.neurons_gpu + st.neurons_cpu;
    s->c.requests_failed += rc != SI_OK;
    sl->used = si_context_n_past(ctx);
    int32_t *copy = realloc(sl->cached, ((size_t)sl->used + 1) * sizeof *copy);
    if (copy != NULL) {
        memcpy(copy, si_context_tokens(ctx), (size_t)sl->used * sizeof *copy);
        sl->cached = copy;
    } else {
        sl->used = 0; /* no copy: no affinity */
    }
    release_locked(sl);
    pthread_mutex_unlock(&s->mu);

    pthread_mutex_lock(&j->mu);
    j->n_prompt = res.n_prompt + k;
    j->n_cached = k;
    j->n_generated = res.n_generated;
    j->prompt_seconds = res.prompt_seconds;
    j->generate_seconds = res.generate_seconds;
    if (rc != SI_OK && j->finish == SI_FINISH_NONE) {
        snprintf(j->error, sizeof j->error, "%s", si_last_error());
        finish_locked(j, SI_FINISH_ERROR);
    } else {
        finish_locked(j, res.stop == SI_STOP_EOG || res.stop == SI_STOP_CALLBACK
                             ? SI_FINISH_STOP
                             : SI_FINISH_LENGTH);
    }
    pthread_mutex_unlock(&j->mu);
}

static void *slot_main(void *arg)
{
    struct slot *sl = arg;
    struct si_slots *s = sl->s;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        sl->idle = true;
        while (!s->stopping && sl->next == NULL && s->qlen == 0)
            pthread_cond_wait(&s->cv, &s->mu);
        sl->idle = false;
        if (s->stopping && sl->next == NULL) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        struct si_job *j = sl->next;
        if (j != NULL) {
            sl->next = NULL;
        } else {
            j = s->queue[s->qhead];
            s->qhead = (s->qhead + 1) % s->queue_max;
            s->qlen--;
            s->c.queued--;
        }
        s->c.running++;
        sl->current = j;
        pthread_mutex_unlock(&s->mu);

        pthread_mutex_lock(&j->mu);
        bool gone = j->cancelled;
        if (!gone)
            j->state = SI_JOB_RUNNING;
        pthread_mutex_unlock(&j->mu);
        if (gone) {
            release(sl);
            fail(j, "the client went away");
        } else {
            run_job(sl, j); /* it releases the slot, then finishes the job */
        }
        si_job_unref(j);
    }
}

int si_slots_start(struct si_slots **out, struct si_llm *llm, struct si_context_params cp, int n,
                   int queue_max, bool shared, char *err, size_t err_size)
{
    *out = NULL;
    struct si_slots *s = calloc(1, sizeof *s);
    if (s == NULL || n < 1 || queue_max < 1) {
        free(s);
        snprintf(err, err_size, n < 1 ? "--parallel must be at least 1" : "out of memory");
        return n < 1 ? SI_E_INVALID : SI_E_NOMEM;
    }
    s->n = n;
    s->queue_max = queue_max;
    s->slot = calloc((size_t)n, sizeof *s->slot);
    s->queue = calloc((size_t)queue_max, sizeof *s->queue);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (s->slot == NULL || s->queue == NULL) {
        snprintf(err, err_size, "out of memory");
        si_slots_free(s);
        return SI_E_NOMEM;
    }
    for (int i = 0; i < n; i++) {
        struct slot *sl = &s->slot[i];
        sl->s = s;
        int rc = SI_E_UNSUPPORTED;
        if (i > 0 && shared) {
            rc = si_context_init_shared(s->slot[0].ctx, &sl->ctx);
            if (rc == SI_E_UNSUPPORTED) {
                fprintf(stderr, "serve: each slot on an engine of its own: %s\n",
                        si_last_error());
                shared = false;
            }
        }
        if (rc == SI_E_UNSUPPORTED)
            rc = si_context_init(llm, cp, &sl->ctx);
        if (rc != SI_OK) {
            snprintf(err, err_size, "slot %d: %s", i, si_last_error());
            si_slots_free(s);
            return rc;
        }
        s->n_ctx = si_context_n_ctx(sl->ctx);
    }
    for (int i = 0; i < n; i++) {
        if (pthread_create(&s->slot[i].th, NULL, slot_main, &s->slot[i]) != 0) {
            snprintf(err, err_size, "cannot start the slots' threads");
            si_slots_free(s);
            return SI_E_RUNTIME;
        }
        s->slot[i].started = true;
    }
    *out = s;
    return SI_OK;
}

void si_slots_drain(struct si_slots *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    while (s->qlen > 0) {
        struct si_job *j = s->queue[s->qhead];
        s->qhead = (s->qhead + 1) % s->queue_max;
        s->qlen--;
        fail(j, "the server is stopping");
        si_job_unref(j);
    }
    for (int i = 0; s->slot != NULL && i < s->n; i++) {
        if (s->slot[i].current != NULL)
            si_job_cancel(s->slot[i].current); /* it stops at its next token */
        if (s->slot[i].next != NULL)
            si_job_cancel(s->slot[i].next); /* its slot ends it unstarted */
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void si_slots_stop(struct si_slots *s)
{
    if (s == NULL)
        return;
    si_slots_drain(s);
    for (int i = 0; s->slot != NULL && i < s->n; i++)
        if (s->slot[i].started) {
            pthread_join(s->slot[i].th, NULL);
            s->slot[i].started = false;
        }
}

void si_slots_free(struct si_slots *s)
{
    if (s == NULL)
        return;
    si_slots_stop(s);
    for (int i = 0; s->slot != NULL && i < s->n; i++) {
        si_context_free(s->slot[i].ctx);
        free(s->slot[i].cached);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->slot);
    free(s->queue);
    free(s);
}

int si_slots_submit(struct si_slots *s, struct si_job *j)
{
    pthread_mutex_lock(&s->mu);
    int rc = SI_OK;
    /* an idle slot, the one whose cache holds most of the prompt's start */
    int best = -1;
    int32_t best_k = -1;
    for (int i = 0; !s->stopping && i < s->n; i++) {
        const struct slot *sl = &s->slot[i];
        if (!sl->idle || sl->next != NULL)
            continue;
        int32_t k = 0;
        while (j->cache_prompt && k < sl->used && k < j->n_tokens - 1 && sl->cached[k] == j->tokens[k])
            k++;
        if (k > best_k) {
            best = i;
            best_k = k;
        }
    }
    if (s->stopping)
        rc = SI_E_RUNTIME;
    else if (best >= 0) {
        si_job_ref(j);
        s->slot[best].next = j;
        s->c.requests++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        return SI_OK;
    } else if (s->qlen >= s->queue_max)
        rc = SI_E_BUDGET;
    if (rc == SI_OK) {
        si_job_ref(j);
        s->queue[(s->qhead + s->qlen) % s->queue_max] = j;
        s->qlen++;
        s->c.queued++;
        s->c.requests++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int32_t si_slots_n_ctx(const struct si_slots *s)
{
    return s->n_ctx;
}

int si_slots_count(const struct si_slots *s)
{
    return s->n;
}

void si_slots_counters(struct si_slots *s, struct si_serve_counters *c, int32_t *used)
{
    pthread_mutex_lock(&s->mu);
    *c = s->c;
    for (int i = 0; i < s->n; i++)
        used[i] = s->slot[i].used;
    pthread_mutex_unlock(&s->mu);
}
