/*
 * cmd_serve.c - `starinfer serve`: the model behind an OpenAI-compatible
 * HTTP API and a chat page (docs/server.md); a user of the public API only.
 */
#include "cli.h"
#include "run_opts.h"
#include "serve.h"
#include "starinfer.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void serve_usage(FILE *f)
{
    fprintf(f,
            "Usage: " SI_PROG " serve -m MODEL [--host ADDR] [--port N] [--parallel N] [OPTIONS]\n"
            "\n"
            "Serve the model over HTTP with OpenAI's API (POST /v1/chat/completions,\n"
            "/v1/completions; GET /v1/models), /tokenize, /detokenize, /health, /metrics\n"
            "(Prometheus) and a chat page at /.  Each of the N slots is a conversation (KV\n"
            "cache, sampler) on the one loaded model; the slots that generate at once are\n"
            "decoded together, a token each per step, reading the weights once.  Requests\n"
            "beyond them wait in a queue.  Stops on Ctrl-C or SIGTERM.\n"
            "\n"
            "Options:\n"
            "  -m, --model FILE        the model (GGUF)\n"
            "      --host ADDR         address to listen on (default 127.0.0.1; 0.0.0.0 or ::\n"
            "                          for every interface)\n"
            "      --port N            port (default 8080; 0: any free one, printed)\n"
            "      --parallel N        slots: conversations generated at once (default 1)\n"
            "      --queue N           requests that may wait for a slot (default 64; more:\n"
            "                          503)\n"
            "      --batch-arith MODE  the arithmetic of the slots' steps: exact (decoding's:\n"
            "                          each answer generate's, bit for bit), int8 (AVX-512\n"
            "                          VNNI's batched kernels: more tokens/s at several\n"
            "                          conversations, each answer its own whatever the\n"
            "                          others, but not generate's bit for bit) or auto\n"
            "                          (default: int8 where the CPU has the kernels)\n"
            "      --separate-slots    each slot a context of its own (engine, weights),\n"
            "                          decoded on its own: for comparison (default: the slots\n"
            "                          share one engine; docs/server.md)\n"
            "      --api-key KEY       require 'Authorization: Bearer KEY' (default: the\n"
            "                          STARINFER_API_KEY variable, else none); / and /health\n"
            "                          stay open\n"
            "      --max-body SIZE     largest request body (default 8M; more: 413)\n"
            "      --alias NAME        the model's name in the API (default: the file's)\n"
            "      --no-cache-prompt   evaluate every prompt from an empty cache (default: a\n"
            "                          slot keeps its cache, and a prompt that starts as its\n"
            "                          last conversation did evaluates only the rest; a\n"
            "                          request's \"cache_prompt\": false does so for itself)\n"
            "  -n, --n-predict N       tokens a request generates when it gives no\n"
            "                          max_tokens (default: up to the context's end)\n"
            "The sampling options and --ignore-eos set a request's defaults; its own\n"
            "fields win (a request without \"seed\" draws one).  -c is each slot's context.\n");
    si_run_usage(f, true);
    fprintf(f, "  -h, --help              show this help\n");
}

/* The model's name in the API: --alias, else the file name without .gguf. */
static char *model_id(const char *alias, const char *path)
{
    if (alias != NULL)
        return strdup(alias);
    const char *b = strrchr(path, '/');
    b = b != NULL ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf"))
        n -= 5;
    return strndup(b, n);
}

/* serve's options: the shared ones and the server's own. */
struct serve_opts {
    struct si_run_opts o;
    const char *host, *api_key, *alias;
    long long port, parallel, queue;
    bool separate, cache_prompt;
    size_t max_body;
};

/* The server's own option argv[*i] into s: 1 consumed, 0 not one of them,
 * -1 after an error message. */
static int server_option(struct serve_opts *s, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--host"))
        return si_cli_opt_str(argc, argv, i, &s->host);
    if (!strcmp(a, "--api-key"))
        return si_cli_opt_str(argc, argv, i, &s->api_key);
    if (!strcmp(a, "--alias"))
        return si_cli_opt_str(argc, argv, i, &s->alias);
    if (!strcmp(a, "--port"))
        return si_cli_opt_int(argc, argv, i, 0, 65535, &s->port);
    if (!strcmp(a, "--queue"))
        return si_cli_opt_int(argc, argv, i, 1, 1 << 20, &s->queue);
    if (!strcmp(a, "--parallel") || !strcmp(a, "-np"))
        return (v = si_cli_value(argc, argv, i)) != NULL &&
                       si_cli_int("--parallel", v, 1, 256, &s->parallel)
                   ? 1
                   : -1;
    if (!strcmp(a, "--max-body")) {
        int64_t mb;
        if (si_cli_opt_size(argc, argv, i, &mb) < 0)
            return -1;
        if (mb < 1)
            return si_cli_error("--max-body: must be at least 1 byte"), -1;
        s->max_body = (size_t)mb;
    } else if (!strcmp(a, "--no-cache-prompt")) {
        s->cache_prompt = false;
    } else if (!strcmp(a, "--separate-slots")) {
        s->separate = true;
    } else if (!strcmp(a, "--batch-arith")) {
        if ((v = si_cli_value(argc, argv, i)) == NULL)
            return -1;
        if (strcmp(v, "auto") && strcmp(v, "exact") && strcmp(v, "int8"))
            return si_cli_error("--batch-arith: '%s' is not auto, exact or int8", v), -1;
        si_cli_prefill(v, &s->o.cp.shared_arith);
    } else {
        return 0;
    }
    return 1;
}

/* The options into s, checked together: 0 to go on, else the exit status
 * (help: 0 printed, -1 for "exit 0"). */
static int serve_options(struct serve_opts *s, int argc, char **argv)
{
    *s = (struct serve_opts){.host = "127.0.0.1",
                             .api_key = getenv("STARINFER_API_KEY"),
                             .port = 8080,
                             .parallel = 1,
                             .queue = 64,
                             .cache_prompt = true,
                             .max_body = 8u << 20};
    si_run_opts_init(&s->o, "serve", -1, -1);
    const struct si_run_opts *o = &s->o;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = si_run_option(&s->o, argc, argv, &i);
        if (r == 0 && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            serve_usage(stdout);
            return -1;
        }
        if (r == 0)
            r = server_option(s, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r == 0)
            return si_cli_error("serve: unknown option '%s' (see starinfer serve --help)", a);
    }
    if (o->model == NULL)
        return si_cli_error("serve: no model given (-m MODEL.gguf)");
    if (o->prompt != NULL || o->file != NULL)
        return si_cli_error("serve: prompts come in requests, not from -p or -f");
    if (o->trace_dir != NULL)
        return si_cli_error(
            "serve: --trace is for generate and chat (a server runs until stopped)");
    if (o->context_shift || o->n_keep > 0)
        return si_cli_error("serve: %s is for generate and chat (a request's prompt and answer "
                            "fit the context, or it is refused)",
                            o->context_shift ? "--context-shift" : "--keep");
    if (o->cp.mpi)
        return si_cli_error("serve: not under mpirun (one process serves; docs/mpi.md)");
    if (s->api_key != NULL && *s->api_key == '\0')
        s->api_key = NULL;
    if (si_run_check(o) != 0)
        return 1;
    s->o.cp.caller_worker = false; /* the slots' threads evaluate, not this one */
    return 0;
}

/* A server: the model, its slots and the HTTP listener. */
struct server {
    const struct serve_opts *s;
    char *id; /* the model's name in the API */
    struct si_llm *llm;
    struct si_http *http;
    struct si_serve sv;
};

/* The model loaded, its slots started and the listener opened (its address
 * said on stderr); 0, or 1 after an error message. */
static int server_start(struct server *srv)
{
    const struct serve_opts *s = srv->s;
    char err[512];
    struct si_llm_params lp = si_llm_default_params();
    lp.use_mmap = s->o.use_mmap;
    lp.predictors = s->o.predictors;
    if ((srv->id = model_id(s->alias, s->o.model)) == NULL)
        return si_cli_error("out of memory");
    if (si_llm_load(s->o.model, lp, &srv->llm) != SI_OK)
        return si_cli_error("%s", si_last_error());
    struct si_serve *sv = &srv->sv;
    if (si_slots_start(&sv->slots, srv->llm, s->o.cp, (int)s->parallel, (int)s->queue, !s->separate,
                       err, sizeof err) != SI_OK)
        return si_cli_error("serve: %s", err);
    sv->llm = srv->llm;
    sv->model_id = srv->id;
    sv->api_key = s->api_key;
    sv->max_body = s->max_body;
    sv->default_max_tokens = s->o.n_predict > 0 ? (int32_t)s->o.n_predict : 0;
    sv->sampling = s->o.cp.sampling;
    sv->ignore_eos = s->o.ignore_eos;
    sv->cache_prompt = s->cache_prompt;
    sv->started = (int64_t)time(NULL);
    si_run_note_ctx(srv->llm, si_slots_n_ctx(sv->slots));
    int p = (int)s->port;
    if (si_http_start(&srv->http, sv, s->host, &p, err, sizeof err) != SI_OK)
        return si_cli_error("serve: %s", err);
    si_run_note_kv(srv->llm, &s->o.cp, si_slots_n_ctx(sv->slots));
    const bool v6 = strchr(s->host, ':') != NULL;
    fprintf(stderr,
            "serve: listening on http://%s%s%s:%d (model %s, %lld slot%s of %d tokens%s); the "
            "chat page is at /; Ctrl-C stops\n",
            v6 ? "[" : "", s->host, v6 ? "]" : "", p, srv->id, s->parallel, si_cli_s(s->parallel),
            si_slots_n_ctx(sv->slots), s->api_key != NULL ? ", API key required" : "");
    fflush(stderr);
    return 0;
}

/* No new connections; the requests under way end at their next token and
 * are answered (what they generated so far), within a grace time; then
 * everything freed. */
static void server_stop(struct server *srv)
{
    srv->sv.stopping = 1;
    si_http_quiesce(srv->http);
    si_slots_stop(srv->sv.slots);
    if (!si_http_wait(srv->http, 10.0))
        fprintf(stderr, "serve: some requests were still open after 10 s; closing them\n");
    si_http_stop(srv->http);
    si_slots_free(srv->sv.slots);
    si_llm_free(srv->llm);
    free(srv->id);
}

int si_cmd_serve(int argc, char **argv)
{
    struct serve_opts s;
    int rc = serve_options(&s, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    /* Ctrl-C and SIGTERM wait for sigwait below; every thread made from
     * here on inherits the mask.  A client gone mid-write is no signal. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct server srv = {.s = &s};
    rc = 1;
    if (server_start(&srv) == 0) {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        fprintf(stderr, "serve: %s: stopping\n", sig == SIGINT ? "interrupted" : "terminated");
        rc = 0;
    }
    server_stop(&srv);
    return rc;
}
