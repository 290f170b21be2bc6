/*
 * llama-peer.c - the benchmark's driver for the peer, llama.cpp.
 *
 * Built by tools/bench-llm against a llama.cpp build outside this tree
 * (tools/build-peer puts one in ~/.cache/starinfer/peer); never linked into
 * starinfer.  It runs the workload `starinfer bench --workload` runs, the
 * same way, so that the two are measured alike:
 *
 *   llama-peer -m MODEL -t THREADS --prompt-tokens N -n N [-r RUNS] [--ngl N] [-p TEXT]
 *
 * The prompt is TEXT tokenized (BOS added as the model says), repeated until
 * it has N tokens and cut there.  Each run: a fresh KV cache, the prompt in
 * one llama_decode (batches of up to 512 tokens), then N tokens decoded
 * greedily one llama_decode each (argmax of the logits, end-of-generation
 * tokens ignored), each timed.  Prints one line per run:
 *
 *   run R prefill_s S decode_s S lat_ms L1,L2,... tokens T1,T2,...
 *
 * and a last line `peak_rss_kib K`.  Errors: one line on stderr, exit 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <llama.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *msg, const char *what)
{
    fprintf(stderr, "llama-peer: %s%s%s\n", msg, what ? ": " : "", what ? what : "");
    return 1;
}

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL;
    const char *text = "The GNU General Public License is a free, copyleft license for software "
                       "and other kinds of works.";
    int threads = 1, n_prompt = 8, n_predict = 128, runs = 1, ngl = 0;
    enum ggml_type kv_type = GGML_TYPE_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            return fail("option without a value", a);
        if (!strcmp(a, "-m"))
            model_path = v;
        else if (!strcmp(a, "-t"))
            threads = atoi(v);
        else if (!strcmp(a, "--prompt-tokens"))
            n_prompt = atoi(v);
        else if (!strcmp(a, "-n"))
            n_predict = atoi(v);
        else if (!strcmp(a, "-r"))
            runs = atoi(v);
        else if (!strcmp(a, "--ngl"))
            ngl = atoi(v);
        else if (!strcmp(a, "-p"))
            text = v;
        else if (!strcmp(a, "--cache-type") && !strcmp(v, "f16"))
            kv_type = GGML_TYPE_F16;
        else if (!strcmp(a, "--cache-type") && !strcmp(v, "q8_0"))
            kv_type = GGML_TYPE_Q8_0;
        else if (!strcmp(a, "--cache-type") && !strcmp(v, "q4_0"))
            kv_type = GGML_TYPE_Q4_0;
        else
            return fail("unknown option", a);
        i++;
    }
    if (model_path == NULL || threads < 1 || n_prompt < 1 || n_predict < 1 || runs < 1 ||
        ngl < 0)
        return fail("usage: llama-peer -m MODEL -t THREADS --prompt-tokens N -n N [-r RUNS] "
                    "[--ngl N] [-p TEXT] [--cache-type f16|q8_0|q4_0]",
                    NULL);

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = ngl;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (model == NULL)
        return fail("cannot load the model", model_path);
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    /* The prompt: the text's tokens repeated to n_prompt (BOS once).  The text
       is tokenized twice into `once` (with BOS, then without), each time at
       most a token per byte (a small vocabulary's byte-level BPE) plus BOS. */
    int cap = 2 * ((int)strlen(text) + 16);
    llama_token *once = malloc((size_t)cap * sizeof *once);
    llama_token *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    llama_token *out = malloc((size_t)n_predict * sizeof *out);
    double *lat = malloc((size_t)n_predict * sizeof *lat);
    if (!once || !prompt || !out || !lat)
        return fail("out of memory", NULL);
    int n_once = llama_tokenize(vocab, text, (int)strlen(text), once, cap, true, false);
    int n_body = llama_tokenize(vocab, text, (int)strlen(text), once + n_once, cap - n_once,
                                false, false);
    if (n_once <= 0 || n_body <= 0)
        return fail("cannot tokenize the prompt text", NULL);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = i < n_once ? once[i] : once[n_once + (i - n_once) % n_body];

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_prompt + n_predict);
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.type_k = cp.type_v = kv_type; /* K and V alike (a quantized V needs flash attention,
                                        which llama.cpp's default turns on for the CPU) */
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (ctx == NULL)
        return fail("cannot create a context", NULL);

    for (int r = 0; r < runs; r++) {
        llama_memory_clear(llama_get_memory(ctx), true);
        double t0 = now();
        for (int i = 0; i < n_prompt; i += 512) {
            int n = n_prompt - i < 512 ? n_prompt - i : 512;
            if (llama_decode(ctx, llama_batch_get_one(prompt + i, n)) != 0)
                return fail("llama_decode failed on the prompt", NULL);
        }
        double t1 = now();
        for (int i = 0; i < n_predict; i++) {
            const float *logits = llama_get_logits_ith(ctx, -1);
            llama_token best = 0;
            for (llama_token t = 1; t < n_vocab; t++)
                if (logits[t] > logits[best])
                    best = t;
            out[i] = best;
            double s = now();
            if (llama_decode(ctx, llama_batch_get_one(&out[i], 1)) != 0)
                return fail("llama_decode failed while decoding", NULL);
            lat[i] = 1e3 * (now() - s);
        }
        double t2 = now();
        printf("run %d prefill_s %.6f decode_s %.6f lat_ms ", r, t1 - t0, t2 - t1);
        for (int i = 0; i < n_predict; i++)
            printf("%s%.4f", i ? "," : "", lat[i]);
        printf(" tokens ");
        for (int i = 0; i < n_predict; i++)
            printf("%s%d", i ? "," : "", out[i]);
        printf("\n");
        fflush(stdout);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak_rss_kib %ld\n", ru.ru_maxrss);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(once);
    free(prompt);
    free(out);
    free(lat);
    return 0;
}
