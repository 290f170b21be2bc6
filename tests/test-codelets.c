/*
 * test-codelets.c - every task kind of the engine (codelets/codelets.h) is a
 * complete codelet: a CPU function, a history-based perfmodel with its own
 * symbol, a name; the kinds the design runs on a GPU have their CUDA
 * function in a build with CUDA (a file that forgets config.h compiles its
 * CUDA function out without a word, and CPU-only tests cannot see it).
 * No StarPU start is needed: the structs are inspected.
 */
#include "codelets/codelets.h"
#include "config.h"
#include "test.h"

#include <string.h>

struct kind {
    const char *var;
    const struct starpu_codelet *cl;
    bool cuda; /* has a CUDA function in a CUDA build */
};

int main(void)
{
    const struct kind kinds[] = {
        {"embed", &si__cl_embed, false},
        {"head", &si__cl_head, false},
        {"head_rows", &si__cl_head_rows, false},
        {"attn", &si__cl_attn, true},
        {"agrp", &si__cl_agrp, false},
        {"ao", &si__cl_ao, false},
        {"aout", &si__cl_aout, false},
        {"pred", &si__cl_pred, false},
        {"gmask", &si__cl_gmask, false},
        {"hot", &si__cl_hot, true},
        {"cold", &si__cl_cold, false},
        {"down", &si__cl_down, false},
        {"merge", &si__cl_merge, false},
        {"zero", &si__cl_zero, false},
        {"sum", &si__cl_sum, false},
        {"load", &si__cl_load, false},
        {"flash", &si__cl_flash, false},
        {"pack", &si__cl_pack, false},
        {"bembed", &si__cl_bembed, false},
        {"battn", &si__cl_battn, false},
        {"bffn", &si__cl_bffn, true},
        {"bdown", &si__cl_bdown, false},
        {"bmerge", &si__cl_bmerge, false},
        {"bhead", &si__cl_bhead, false},
        {"bhead_rows", &si__cl_bhead_rows, false},
        {"bakv", &si__cl_bakv, false},
        {"bacore", &si__cl_bacore, false},
        {"bao", &si__cl_bao, false},
        {"baout", &si__cl_baout, false},
    };
    const int n = (int)(sizeof kinds / sizeof kinds[0]);
    for (int i = 0; i < n; i++) {
        const struct starpu_codelet *cl = kinds[i].cl;
        CHECK(cl->cpu_funcs[0] != NULL, "%s: no CPU function", kinds[i].var);
        CHECK(cl->name != NULL && cl->name[0] != '\0', "%s: no name", kinds[i].var);
        CHECK(cl->model != NULL && cl->model->type == STARPU_HISTORY_BASED &&
                  cl->model->symbol != NULL && strncmp(cl->model->symbol, "si_", 3) == 0,
              "%s: no si_ history-based perfmodel", kinds[i].var);
        for (int j = 0; j < i && cl->model != NULL; j++)
            CHECK(kinds[j].cl->model != cl->model &&
                      strcmp(kinds[j].cl->model->symbol, cl->model->symbol) != 0,
                  "%s and %s share a perfmodel", kinds[i].var, kinds[j].var);
        /* StarPU's statistics and traces name a task without its own name
         * by its codelet's: one name, one codelet */
        for (int j = 0; j < i && cl->name != NULL; j++)
            CHECK(kinds[j].cl->name == NULL || strcmp(kinds[j].cl->name, cl->name) != 0,
                  "%s and %s share the name \"%s\"", kinds[i].var, kinds[j].var, cl->name);
#ifdef SI_USE_CUDA
        CHECK((cl->cuda_funcs[0] != NULL) == kinds[i].cuda, "%s: CUDA function %s", kinds[i].var,
              kinds[i].cuda ? "missing" : "unexpected");
        if (kinds[i].cuda)
            CHECK(cl->cuda_flags[0] & STARPU_CUDA_ASYNC, "%s: not STARPU_CUDA_ASYNC", kinds[i].var);
#else
        CHECK(cl->cuda_funcs[0] == NULL, "%s: a CUDA function in a build without CUDA",
              kinds[i].var);
#endif
    }
    printf("%d codelets\n", n);
    return test_result();
}
