/*
 * serve_http.c - the server's HTTP side on libmicrohttpd: a thread per
 * connection (a request waits for its job, or streams it, in its own
 * thread), the routes, the API key, the body limit, and the streaming
 * responses as server-sent events.
 */
#include "serve.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct si_http {
    struct MHD_Daemon *d;
    struct si_serve *sv;
    int active; /* requests begun and not yet answered (atomic) */
    MHD_socket listen_fd; /* after si_http_quiesce, closed by si_http_stop */
};

/* One request's state across the handler's calls. */
struct request {
    struct si_buf body;
    bool too_big;
};

static enum MHD_Result send_reply(struct MHD_Connection *c, struct si_api_reply *r)
{
    const char *body = r->body != NULL ? r->body : "";
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        strlen(body), (void *)body, r->body != NULL ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (resp == NULL) {
        free(r->body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            r->content_type != NULL ? r->content_type : "application/json");
    if (r->status == 401)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (r->status == 503)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result send_error(struct MHD_Connection *c, int status, const char *type,
                                  const char *msg)
{
    struct si_api_reply r = {0};
    si_api_error(&r, status, type, NULL, "%s", msg);
    return send_reply(c, &r);
}

/* The client closed its side: poll the socket without waiting. */
static bool client_gone(void *arg)
{
    struct MHD_Connection *c = arg;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL)
        return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

/* ------------------------------------------------------------- streaming */

struct stream {
    struct si_serve *sv;
    struct si_job *j;
    struct MHD_Connection *c;
    struct si_stream_state st;
    char *buf;
    size_t len, off;
};

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    struct stream *s = cls;
    while (s->off == s->len) {
        free(s->buf);
        s->buf = NULL;
        s->len = s->off = 0;
        if (s->st.over)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (!si_api_stream_next(s->sv, s->j, &s->st, &s->buf, &s->len, client_gone, s->c))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = s->len - s->off < max ? s->len - s->off : max;
    memcpy(out, s->buf + s->off, n);
    s->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    struct stream *s = cls;
    si_job_cancel(s->j); /* a client gone mid-stream frees its slot at the next token */
    si_job_unref(s->j);
    free(s->buf);
    free(s);
}

/* -------------------------------------------------------------- generation */

static enum MHD_Result generate(struct si_http *h, struct MHD_Connection *c,
                                enum si_job_kind kind, struct request *rq)
{
    struct si_serve *sv = h->sv;
    struct si_api_reply r = {0};
    struct si_job *j = si_api_job(sv, kind, rq->body.p != NULL ? rq->body.p : "", rq->body.n, &r);
    if (j == NULL)
        return send_reply(c, &r);
    int rc = si_slots_submit(sv->slots, j);
    if (rc != SI_OK) {
        si_job_unref(j);
        return send_error(c, 503, "server_error",
                          rc == SI_E_BUDGET
                              ? "every slot is busy and the queue is full (--queue): try again later"
                              : "the server is stopping");
    }
    if (j->stream) {
        struct stream *s = calloc(1, sizeof *s);
        struct MHD_Response *resp =
            s != NULL ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s,
                                                          stream_free)
                      : NULL;
        if (resp == NULL) {
            free(s);
            si_job_cancel(j);
            si_job_unref(j);
            return MHD_NO;
        }
        *s = (struct stream){.sv = sv, .j = j, .c = c};
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return ok;
    }
    /* Wait for the whole answer; a client that leaves frees the slot. */
    pthread_mutex_lock(&j->mu);
    bool gone = false;
    while (j->state != SI_JOB_DONE && !gone) {
        si_job_wait(j, 200);
        if (j->state != SI_JOB_DONE && client_gone(c)) {
            j->cancelled = true;
            gone = true;
        }
    }
    pthread_mutex_unlock(&j->mu);
    if (gone) {
        si_job_unref(j);
        return MHD_NO; /* close the connection */
    }
    si_api_result(sv, j, &r);
    si_job_unref(j);
    return send_reply(c, &r);
}

/* ----------------------------------------------------------------- routes */

enum route {
    R_NONE,
    R_PAGE,
    R_HEALTH,
    R_METRICS,
    R_MODELS,
    R_CHAT,
    R_COMPLETIONS,
    R_TOKENIZE,
    R_DETOKENIZE
};

static const struct {
    const char *path, *method;
    enum route route;
    bool open; /* reachable without the API key */
} routes[] = {
    {"/", "GET", R_PAGE, true},
    {"/index.html", "GET", R_PAGE, true},
    {"/health", "GET", R_HEALTH, true},
    {"/metrics", "GET", R_METRICS, false},
    {"/v1/models", "GET", R_MODELS, false},
    {"/v1/chat/completions", "POST", R_CHAT, false},
    {"/v1/completions", "POST", R_COMPLETIONS, false},
    {"/tokenize", "POST", R_TOKENIZE, false},
    {"/detokenize", "POST", R_DETOKENIZE, false},
};

/* Compare without stopping at the first difference (no timing hint). */
static bool same_key(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    for (size_t i = 0; i < la; i++)
        d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
    return d == 0;
}

static bool authorized(struct si_serve *sv, struct MHD_Connection *c)
{
    if (sv->api_key == NULL)
        return true;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    return a != NULL && strncmp(a, "Bearer ", 7) == 0 && same_key(a + 7, sv->api_key);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    (void)version;
    struct si_http *h = cls;
    struct si_serve *sv = h->sv;
    struct request *rq = *con_cls;
    int ri = -1;
    bool path_known = false;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) {
            path_known = true;
            if (!strcmp(method, routes[i].method))
                ri = (int)i;
        }
    if (rq == NULL) { /* the headers are in: refuse early what will be refused */
        if ((rq = calloc(1, sizeof *rq)) == NULL)
            return MHD_NO;
        *con_cls = rq;
        __atomic_add_fetch(&h->active, 1, __ATOMIC_SEQ_CST);
        if (ri >= 0 && !routes[ri].open && !authorized(sv, c))
            return send_error(c, 401, "invalid_request_error",
                              "a valid API key is needed: 'Authorization: Bearer KEY' (--api-key)");
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl != NULL && strtoull(cl, NULL, 10) > sv->max_body) {
            char msg[128];
            snprintf(msg, sizeof msg, "the request body is over the limit of %zu bytes (--max-body)",
                     sv->max_body);
            return send_error(c, 413, "invalid_request_error", msg);
        }
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (!rq->too_big && rq->body.n + *upload_size > sv->max_body) {
            rq->too_big = true;
            free(rq->body.p);
            rq->body = (struct si_buf){0};
        }
        if (!rq->too_big && !si_buf_add(&rq->body, upload, *upload_size))
            return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (rq->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is over the limit of %zu bytes (--max-body)",
                 sv->max_body);
        return send_error(c, 413, "invalid_request_error", msg);
    }
    if (ri < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, path_known ? "%s %s: method not allowed" : "%s %s: no such route",
                 method, url);
        return send_error(c, path_known ? 405 : 404, "invalid_request_error", msg);
    }
    struct si_api_reply r = {0};
    const char *body = rq->body.p != NULL ? rq->body.p : "";
    switch (routes[ri].route) {
    case R_PAGE:
        r = (struct si_api_reply){200, NULL, "text/html; charset=utf-8"};
        if ((r.body = strdup(si_serve_page)) == NULL)
            return MHD_NO;
        return send_reply(c, &r);
    case R_HEALTH:
        si_api_health(sv, &r);
        break;
    case R_METRICS:
        si_api_metrics(sv, &r);
        break;
    case R_MODELS:
        si_api_models(sv, &r);
        break;
    case R_CHAT:
        return generate(h, c, SI_JOB_CHAT, rq);
    case R_COMPLETIONS:
        return generate(h, c, SI_JOB_COMPLETION, rq);
    case R_TOKENIZE:
        si_api_tokenize(sv, body, rq->body.n, &r);
        break;
    case R_DETOKENIZE:
        si_api_detokenize(sv, body, rq->body.n, &r);
        break;
    case R_NONE:
        break;
    }
    return send_reply(c, &r);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)c;
    (void)toe;
    struct si_http *h = cls;
    struct request *rq = *con_cls;
    if (rq != NULL) {
        __atomic_sub_fetch(&h->active, 1, __ATOMIC_SEQ_CST);
        free(rq->body.p);
        free(rq);
        *con_cls = NULL;
    }
}

int si_http_start(struct si_http **out, struct si_serve *sv, const char *host, int *port,
                  char *err, size_t err_size)
{
    *out = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", *port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0) {
        snprintf(err, err_size, "--host %s: %s", host, gai_strerror(g));
        return SI_E_INVALID;
    }
    struct si_http *h = calloc(1, sizeof *h);
    if (h == NULL) {
        freeaddrinfo(ai);
        snprintf(err, err_size, "out of memory");
        return SI_E_NOMEM;
    }
    h->sv = sv;
    h->listen_fd = MHD_INVALID_SOCKET;
    unsigned flags =
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)*port, NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR,
                            ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned)256,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, h, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (h->d == NULL) {
        free(h);
        snprintf(err, err_size, "cannot listen on %s port %d (in use, or not an address here?)",
                 host, *port);
        return SI_E_RUNTIME;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    if (di != NULL)
        *port = di->port;
    *out = h;
    return SI_OK;
}

void si_http_quiesce(struct si_http *h)
{
    if (h != NULL && h->listen_fd == MHD_INVALID_SOCKET)
        h->listen_fd = MHD_quiesce_daemon(h->d);
}

bool si_http_wait(struct si_http *h, double seconds)
{
    if (h == NULL)
        return true;
    for (double t = 0; t < seconds; t += 0.02) {
        if (__atomic_load_n(&h->active, __ATOMIC_SEQ_CST) == 0)
            return true;
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
    return __atomic_load_n(&h->active, __ATOMIC_SEQ_CST) == 0;
}

void si_http_stop(struct si_http *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->d);
    if (h->listen_fd != MHD_INVALID_SOCKET)
        close(h->listen_fd);
    free(h);
}
