/*
 * simple.c - generate text with starinfer, streamed, then the run's figures.
 *
 *     cc simple.c -o simple $(pkg-config --cflags --libs starinfer)
 *     ./simple MODEL.gguf "Once upon a time"
 */
#include <starinfer.h>
#include <stdio.h>

/* Called with each token's text as it is decoded; false would stop. */
static bool print_text(void *user, int32_t token, const char *text, size_t len)
{
    (void)user, (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT\n", argv[0]);
        return 2;
    }
    struct si_llm *llm = NULL;
    struct si_context *ctx = NULL; /* defaults: the StarPU engine, dense, sampling at 0.8 */
    if (si_llm_load(argv[1], si_llm_default_params(), &llm) != SI_OK ||
        si_context_init(llm, si_context_default_params(), &ctx) != SI_OK) {
        fprintf(stderr, "simple: %s\n", si_last_error());
        si_llm_free(llm);
        return 1;
    }
    struct si_generate_params gp = si_generate_default_params();
    gp.n_predict = 32;
    int rc = si_generate(ctx, argv[2], gp, print_text, NULL, NULL);
    if (rc != SI_OK)
        fprintf(stderr, "\nsimple: %s\n", si_last_error());

    struct si_stats st;
    si_context_get_stats(ctx, &st);
    printf("\nprefill: %.1f tokens/s, decode: %.1f tokens/s, %u CPU + %u CUDA workers, "
           "active FFN neurons on the GPU: %.1f%%\n",
           st.prefill_tokens_per_s, st.decode_tokens_per_s, st.n_cpu_workers, st.n_cuda_workers,
           100.0 * st.gpu_share);
    /* Time in each kind of StarPU task.  "merge" (adding up a layer's FFN
     * slices) is work done inside the next layer's attention tasks and the
     * head, so its count is theirs: no merge task of its own. */
    for (int k = 0; k < st.n_task_kinds; k++)
        if (st.tasks[k].count > 0)
            printf("  %-14s %6lld tasks %8.3f ms\n", st.tasks[k].name,
                   (long long)st.tasks[k].count, 1e3 * st.tasks[k].seconds);
    si_context_free(ctx);
    si_llm_free(llm);
    return rc != SI_OK;
}
