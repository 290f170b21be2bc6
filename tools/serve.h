/*
 * serve.h - `starinfer serve`: an OpenAI-compatible HTTP server over the
 * public API (docs/server.md).
 *
 * Three rooms:
 *   serve_slots.c  the model's contexts ("slots"), the queue of jobs and the
 *                  threads that generate; knows nothing of HTTP or JSON;
 *   serve_api.c    OpenAI's request and response shapes (jansson): a request
 *                  body into a job, a finished job or its text so far into a
 *                  response or server-sent events;
 *   serve_http.c   libmicrohttpd: routes, the API key, body limits, errors,
 *                  streaming, the chat page;
 * and cmd_serve.c, the command (options, start, signals, stop).
 */
#ifndef SI_TOOLS_SERVE_H
#define SI_TOOLS_SERVE_H

#include "buf.h"
#include "starinfer.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SI_SERVE_MAX_STOP 4 /* OpenAI's limit on stop sequences */

enum si_job_kind { SI_JOB_CHAT, SI_JOB_COMPLETION };

enum si_job_state { SI_JOB_QUEUED, SI_JOB_RUNNING, SI_JOB_DONE };

enum si_finish { SI_FINISH_NONE, SI_FINISH_STOP, SI_FINISH_LENGTH, SI_FINISH_ERROR };

/* One request's generation.  The HTTP side fills the request part and
 * submits it; a slot's thread runs it; both hold a reference, and the last
 * to let go frees it. */
struct si_job {
    /* the request (read-only once submitted) */
    enum si_job_kind kind;
    bool stream, include_usage;
    int32_t *tokens; /* the prompt */
    int32_t n_tokens;
    int32_t max_tokens; /* most tokens to generate */
    bool ignore_eos;
    bool cache_prompt; /* start from the slot's cache where it holds the prompt's start */
    struct si_sampling_params sampling;
    char *stop[SI_SERVE_MAX_STOP];
    int n_stop;
    char id[48];    /* "chatcmpl-..." / "cmpl-..." */
    int64_t created; /* Unix time */

    /* the result, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    enum si_job_state state;
    bool cancelled;   /* the client went away: stop at the next token */
    struct si_buf text; /* generated so far (UTF-8, whole characters) */
    size_t safe;      /* text[0..safe) cannot become part of a stop sequence */
    enum si_finish finish;
    int32_t n_prompt, n_generated;
    int32_t n_cached; /* of n_prompt, the tokens the slot's cache already held */
    double prompt_seconds, generate_seconds;
    char error[256]; /* finish == SI_FINISH_ERROR */
};

/* A job with one reference, the request part zeroed; NULL when out of memory. */
struct si_job *si_job_new(enum si_job_kind kind);
void si_job_ref(struct si_job *j);
void si_job_unref(struct si_job *j);
/* Wait (j->mu held) until the job changes or ms milliseconds pass. */
void si_job_wait(struct si_job *j, long ms);
/* Mark a job whose client went away (it stops at its next token, or is
 * dropped if still queued). */
void si_job_cancel(struct si_job *j);

struct si_serve_counters {
    int64_t requests, requests_failed, prompt_tokens, generated_tokens;
    int64_t cached_tokens; /* prompt tokens not evaluated again: the slot had them */
    double prompt_seconds, generate_seconds;
    int running, queued;
    int64_t neurons_total, neurons_computed; /* FFN neurons over decoded tokens */
};

struct si_slots;

/* n slots on llm, each a context made with cp, sharing the first's engine
 * when `shared` (si_context_init_shared; where the engine cannot share, a
 * note on stderr and contexts of their own); at most queue_max jobs wait
 * for a slot.  SI_OK, or an error status with a line in err. */
int si_slots_start(struct si_slots **out, struct si_llm *llm, struct si_context_params cp,
                   int n, int queue_max, bool shared, char *err, size_t err_size);
/* Drain: no more jobs; queued ones end as errors, running ones at their
 * next token.  Stop: drain, then wait for the slots' threads to end (the
 * counters and si_slots_submit still answer).  Free: stop, then free the
 * contexts and s. */
void si_slots_drain(struct si_slots *s);
void si_slots_stop(struct si_slots *s);
void si_slots_free(struct si_slots *s);

/* Queue a job (takes a reference).  An idle slot takes it at once: the one
 * whose cache holds the longest start of its prompt.  SI_OK, or SI_E_BUDGET
 * when every slot is busy and the queue is full, SI_E_RUNTIME when stopping. */
int si_slots_submit(struct si_slots *s, struct si_job *j);

int32_t si_slots_n_ctx(const struct si_slots *s); /* each slot's KV cache length */
int si_slots_count(const struct si_slots *s);
/* Counters, and each slot's cache use (tokens in it) into used[0..count). */
void si_slots_counters(struct si_slots *s, struct si_serve_counters *c, int32_t *used);

/* ------------------------------------------------------------ the API side */

struct si_serve {
    struct si_llm *llm;
    struct si_slots *slots;
    const char *model_id;  /* the name /v1/models shows */
    const char *api_key;   /* NULL: none */
    size_t max_body;       /* bytes */
    int32_t default_max_tokens; /* -n; <= 0: up to the context's end */
    struct si_sampling_params sampling; /* defaults of a request */
    bool ignore_eos;                    /* likewise */
    bool cache_prompt;                  /* likewise (--no-cache-prompt: false) */
    int64_t started;       /* Unix time */
    volatile int stopping;
};

/* An API response: HTTP status and body (JSON unless content_type says). */
struct si_api_reply {
    int status;
    char *body; /* malloc'd */
    const char *content_type;
};

/* Parse a chat or completion request body into a job (tokenized, checked
 * against the context).  NULL with *r set to the error response. */
struct si_job *si_api_job(struct si_serve *sv, enum si_job_kind kind, const char *body,
                          size_t len, struct si_api_reply *r);
/* The response of a finished (non-streaming) job. */
void si_api_result(struct si_serve *sv, struct si_job *j, struct si_api_reply *r);
/* A stream's progress, the caller's: zeroed at the start. */
struct si_stream_state {
    size_t sent;  /* bytes of the job's text sent */
    bool started; /* the first event (the role) went out */
    bool over;    /* [DONE] went out */
};
/* Streaming: the next server-sent events of j into *buf (malloc'd, *len
 * bytes; the caller frees it).  Waits for text or the job's end, asking
 * gone(gone_arg) every 200 ms whether the client went away (it then cancels
 * the job and ends the stream).  Returns false when out of memory. */
bool si_api_stream_next(struct si_serve *sv, struct si_job *j, struct si_stream_state *st,
                        char **buf, size_t *len, bool (*gone)(void *), void *gone_arg);

/* The other routes: bodies of /v1/models, /health, /metrics, /tokenize,
 * /detokenize. */
void si_api_models(struct si_serve *sv, struct si_api_reply *r);
void si_api_health(struct si_serve *sv, struct si_api_reply *r);
void si_api_metrics(struct si_serve *sv, struct si_api_reply *r);
void si_api_tokenize(struct si_serve *sv, const char *body, size_t len, struct si_api_reply *r);
void si_api_detokenize(struct si_serve *sv, const char *body, size_t len,
                       struct si_api_reply *r);
/* An OpenAI error object with status. */
void si_api_error(struct si_api_reply *r, int status, const char *type, const char *param,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* ------------------------------------------------------------ the HTTP side */

struct si_http;
/* Listen on host:port (port 0: any; the port is written back).  SI_OK, or
 * an error with a line in err. */
int si_http_start(struct si_http **out, struct si_serve *sv, const char *host, int *port,
                  char *err, size_t err_size);
/* Stop taking connections (the requests under way go on). */
void si_http_quiesce(struct si_http *h);
/* Wait up to `seconds` for the requests under way to be answered; false
 * when some were still open. */
bool si_http_wait(struct si_http *h, double seconds);
void si_http_stop(struct si_http *h);

/* The chat page (serve_page.html, built into the binary). */
extern const char si_serve_page[];

#endif /* SI_TOOLS_SERVE_H */
