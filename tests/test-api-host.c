/*
 * test-api-host.c - a host program that starts StarPU itself (one CPU
 * worker, its own choice) and then uses the library: the library's contexts
 * run on that instance (the stats see the host's one worker), freeing them
 * leaves StarPU running, and the host's own tasks still run afterwards.
 */
#include "starinfer.h"

#include "model/synth.h"
#include "model/types.h"
#include "test.h"

#include <errno.h>
#include <starpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/si-test-api-host-XXXXXX";

static void add_one(void *buffers[], void *arg)
{
    (void)arg;
    int *x = (int *)STARPU_VARIABLE_GET_PTR(buffers[0]);
    (*x)++;
}

static struct starpu_codelet add_one_cl = {
    .cpu_funcs = {add_one},
    .nbuffers = 1,
    .modes = {STARPU_RW},
    .name = "host_add_one",
};

/* One task of the host's own, after the library is done. */
static int host_task(void)
{
    int x = 41;
    starpu_data_handle_t h;
    starpu_variable_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)&x, sizeof x);
    int rc = starpu_task_insert(&add_one_cl, STARPU_RW, h, 0);
    starpu_task_wait_for_all();
    starpu_data_unregister(h);
    return rc == 0 ? x : -1;
}

int main(void)
{
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    char model_path[256], err[512];
    snprintf(model_path, sizeof model_path, "%s/tiny.gguf", dir);
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    sp.type = SI_TYPE_Q4_0;
    int rc = si_synth_write(&sp, model_path, err, sizeof err);
    CHECK(rc == SI_OK, "synth: %s", err);

    /* The host's StarPU: one CPU worker, whatever STARPU_NCPU says (the
     * environment would override the configuration). */
    unsetenv("STARPU_NCPU");
    unsetenv("STARPU_NCUDA");
    struct starpu_conf conf;
    starpu_conf_init(&conf);
    conf.ncpus = 1;
    conf.ncuda = 0;
    int sr = starpu_init(&conf);
    if (sr == -ENODEV) {
        unlink(model_path);
        rmdir(dir);
        test_skip("StarPU found no worker");
    }
    CHECK(sr == 0, "starpu_init: %d", sr);

    struct si_llm *llm = NULL;
    struct si_context *ctx = NULL;
    struct si_context_params p = si_context_default_params();
    p.n_ctx = 64;
    p.sampling.temp = 0.0f;
    if (rc == SI_OK && sr == 0) {
        CHECK(si_llm_load(model_path, si_llm_default_params(), &llm) == SI_OK, "load: %s",
              si_last_error());
        if (llm != NULL)
            CHECK(si_context_init(llm, p, &ctx) == SI_OK, "context: %s", si_last_error());
    }
    if (ctx != NULL) {
        struct si_generate_params gp = si_generate_default_params();
        gp.n_predict = 6;
        gp.ignore_eos = true;
        struct si_generate_result res;
        CHECK(si_generate(ctx, "hello", gp, NULL, NULL, &res) == SI_OK && res.n_generated == 6,
              "generate: %s", si_last_error());
        struct si_stats st;
        si_context_get_stats(ctx, &st);
        CHECK(st.n_cpu_workers == 1 && st.n_cuda_workers == 0,
              "the library's workers are not the host's: %u CPU, %u CUDA", st.n_cpu_workers,
              st.n_cuda_workers);
        CHECK(st.step_tokens == 5 && st.n_task_kinds > 0, "engine stats: %lld tokens",
              (long long)st.step_tokens);
        si_context_free(ctx);
        CHECK(starpu_is_initialized(), "the library shut down the host's StarPU");
        CHECK(host_task() == 42, "the host's task after the library's contexts");
        /* A second context on the same instance, after the first went. */
        ctx = NULL;
        CHECK(si_context_init(llm, p, &ctx) == SI_OK, "second context: %s", si_last_error());
        si_context_free(ctx);
        CHECK(starpu_is_initialized(), "StarPU stopped after the second context");
    }
    si_llm_free(llm);
    if (sr == 0)
        starpu_shutdown();
    unlink(model_path);
    rmdir(dir);
    return test_result();
}
