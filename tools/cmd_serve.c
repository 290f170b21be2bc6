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

int si_cmd_serve(int argc, char **argv)
{
    struct si_run_opts o;
    si_run_opts_init(&o, "serve", -1, -1);
    const char *host = "127.0.0.1", *api_key = getenv("STARINFER_API_KEY"), *alias = NULL;
    long long port = 8080, parallel = 1, queue = 64;
    bool separate = false;
    bool cache_prompt = true;
    size_t max_body = 8u << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = si_run_option(&o, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r > 0)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--host")) {
            if ((host = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "--port")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int("--port", v, 0, 65535, &port))
                return 1;
        } else if (!strcmp(a, "--parallel") || !strcmp(a, "-np")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int("--parallel", v, 1, 256, &parallel))
                return 1;
        } else if (!strcmp(a, "--queue")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int("--queue", v, 1, 1 << 20, &queue))
                return 1;
        } else if (!strcmp(a, "--api-key")) {
            if ((api_key = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "--max-body")) {
            int64_t mb;
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_size("--max-body", v, &mb))
                return 1;
            if (mb < 1)
                return si_cli_error("--max-body: must be at least 1 byte");
            max_body = (size_t)mb;
        } else if (!strcmp(a, "--no-cache-prompt")) {
            cache_prompt = false;
        } else if (!strcmp(a, "--separate-slots")) {
            separate = true;
        } else if (!strcmp(a, "--batch-arith")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
            if (!strcmp(v, "auto") || !strcmp(v, "exact") || !strcmp(v, "int8"))
                si_cli_prefill(v, &o.cp.shared_arith);
            else
                return si_cli_error("--batch-arith: '%s' is not auto, exact or int8", v);
        } else if (!strcmp(a, "--alias")) {
            if ((alias = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else {
            return si_cli_error("serve: unknown option '%s' (see starinfer serve --help)", a);
        }
    }
    if (o.model == NULL)
        return si_cli_error("serve: no model given (-m MODEL.gguf)");
    if (o.prompt != NULL || o.file != NULL)
        return si_cli_error("serve: prompts come in requests, not from -p or -f");
    if (o.trace_dir != NULL)
        return si_cli_error("serve: --trace is for generate and chat (a server runs until stopped)");
    if (o.context_shift || o.n_keep > 0)
        return si_cli_error("serve: %s is for generate and chat (a request's prompt and answer "
                            "fit the context, or it is refused)",
                            o.context_shift ? "--context-shift" : "--keep");
    if (o.cp.mpi)
        return si_cli_error("serve: not under mpirun (one process serves; docs/mpi.md)");
    if (api_key != NULL && *api_key == '\0')
        api_key = NULL;
    if (si_run_check(&o) != 0)
        return 1;
    o.cp.caller_worker = false; /* the slots' threads evaluate, not this one */

    /* Ctrl-C and SIGTERM wait for sigwait below; every thread made from
     * here on inherits the mask.  A client gone mid-write is no signal. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    char err[512];
    struct si_llm *llm = NULL;
    struct si_http *http = NULL;
    struct si_serve sv = {0};
    char *id = model_id(alias, o.model);
    struct si_llm_params lp = si_llm_default_params();
    lp.use_mmap = o.use_mmap;
    if (id == NULL) {
        si_cli_error("out of memory");
        goto out;
    }
    if (si_llm_load(o.model, lp, &llm) != SI_OK) {
        si_cli_error("%s", si_last_error());
        goto out;
    }
    if (si_slots_start(&sv.slots, llm, o.cp, (int)parallel, (int)queue, !separate, err,
                       sizeof err) != SI_OK) {
        si_cli_error("serve: %s", err);
        goto out;
    }
    sv.llm = llm;
    sv.model_id = id;
    sv.api_key = api_key;
    sv.max_body = max_body;
    sv.default_max_tokens = o.n_predict > 0 ? (int32_t)o.n_predict : 0;
    sv.sampling = o.cp.sampling;
    sv.ignore_eos = o.ignore_eos;
    sv.cache_prompt = cache_prompt;
    sv.started = (int64_t)time(NULL);
    si_run_note_ctx(llm, si_slots_n_ctx(sv.slots));
    int p = (int)port;
    if (si_http_start(&http, &sv, host, &p, err, sizeof err) != SI_OK) {
        si_cli_error("serve: %s", err);
        goto out;
    }
    const bool v6 = strchr(host, ':') != NULL;
    fprintf(stderr,
            "serve: listening on http://%s%s%s:%d (model %s, %lld slot%s of %d tokens%s); the "
            "chat page is at /; Ctrl-C stops\n",
            v6 ? "[" : "", host, v6 ? "]" : "", p, id, parallel, si_cli_s(parallel),
            si_slots_n_ctx(sv.slots), api_key != NULL ? ", API key required" : "");
    fflush(stderr);
    int sig = 0;
    sigwait(&stop_signals, &sig);
    fprintf(stderr, "serve: %s: stopping\n", sig == SIGINT ? "interrupted" : "terminated");
    rc = 0;
out:
    /* No new connections; the requests under way end at their next token
     * and are answered (what they generated so far), within a grace time. */
    sv.stopping = 1;
    si_http_quiesce(http);
    si_slots_stop(sv.slots);
    if (!si_http_wait(http, 10.0))
        fprintf(stderr, "serve: some requests were still open after 10 s; closing them\n");
    si_http_stop(http);
    si_slots_free(sv.slots);
    si_llm_free(llm);
    free(id);
    return rc;
}
