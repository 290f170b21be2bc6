/*
 * test-codelets.c - every task kind of the engine (codelets/codelets.h) is a
 * complete codelet: a CPU function, a history-based perfmodel with its own
 * symbol, a name; the kinds the design runs on a GPU have their CUDA
 * function in a build with CUDA (a file that forgets config.h compiles its
 * CUDA function out without a word, and CPU-only tests cannot see it).
 * The kinds of a decoded token's graph take their buffers' count from
 * each task (the in-place graph's tasks have none).  And the in-place
 * graph's check of its phases (codelets/task.h) finds the bytes two
 * accesses share, rows of matrices among them.
 * No StarPU start is needed: the structs are inspected.
 */
#include "codelets/codelets.h"
#include "config.h"
#include "test.h"

#include <string.h>

struct kind {
    const char *var;
    const struct starpu_codelet *cl;
    bool cuda;   /* has a CUDA function in a CUDA build */
    bool decode; /* a kind of the in-place decoding graph */
};

/* si__extents_overlap both ways round, against want. */
static void overlap(const char *what, struct si__extent a, struct si__extent b, bool want)
{
    CHECK(si__extents_overlap(&a, &b) == want, "%s: overlap %d, want %d", what, !want, want);
    CHECK(si__extents_overlap(&b, &a) == want, "%s (swapped): overlap %d, want %d", what, !want,
          want);
}

/* Vectors, and the column blocks of a row-major matrix (the KV cache's
 * groups: 8 rows of 64 bytes, blocks of 16, 16 and 32 bytes). */
static void check_extents(void)
{
    const uintptr_t m = 4096;
    const struct si__extent v0 = {m, 64, 64, 1, true}, v1 = {m + 64, 64, 64, 1, false},
                            v2 = {m + 63, 2, 2, 1, false};
    overlap("adjacent vectors", v0, v1, false);
    overlap("a vector across their boundary", v0, v2, true);
    overlap("a vector with itself", v0, v0, true);
    const struct si__extent c0 = {m, 16, 64, 8, true}, c1 = {m + 16, 16, 64, 8, true},
                            c2 = {m + 32, 32, 64, 8, true}, c01 = {m + 8, 16, 64, 8, false};
    overlap("column blocks 0 and 1", c0, c1, false);
    overlap("column blocks 1 and 2", c1, c2, false);
    overlap("column blocks 0 and 2", c0, c2, false);
    overlap("a block across blocks 0 and 1", c0, c01, true);
    overlap("the same", c01, c1, true);
    const struct si__extent last_row = {m + 7 * 64, 64, 64, 1, false},
                            gap = {m + 16 + 7 * 64, 16, 16, 1, false},
                            below = {m + 8 * 64, 64, 64, 1, false},
                            rows_apart = {m + 2 * 64 + 32, 4, 128, 3, false};
    overlap("block 0 and the last row", c0, last_row, true);
    overlap("block 0 and block 1's part of the last row", c0, gap, false);
    overlap("block 1 and its part of the last row", c1, gap, true);
    overlap("block 0 and the row after the matrix", c0, below, false);
    overlap("block 2 and rows of another stride", c2, rows_apart, true);
    const struct si__extent before = {m - 64, 64, 64, 1, false}, empty = {m, 0, 0, 1, true};
    overlap("block 0 and the row before the matrix", c0, before, false);
    overlap("an empty extent", c0, empty, false);
}

int main(void)
{
    const struct kind kinds[] = {
        {"embed", &si__cl_embed, false, true},
        {"head", &si__cl_head, false, true},
        {"head_rows", &si__cl_head_rows, false, true},
        {"attn", &si__cl_attn, true, true},
        {"agrp", &si__cl_agrp, false, true},
        {"apos", &si__cl_apos, false, true},
        {"ao", &si__cl_ao, false, true},
        {"aout", &si__cl_aout, false, true},
        {"pred", &si__cl_pred, false, false},
        {"gmask", &si__cl_gmask, false, false},
        {"hot", &si__cl_hot, true, true},
        {"cold", &si__cl_cold, false, true},
        {"down", &si__cl_down, false, true},
        {"merge", &si__cl_merge, false, false},
        {"zero", &si__cl_zero, false, false},
        {"sum", &si__cl_sum, false, false},
        {"load", &si__cl_load, false, false},
        {"flash", &si__cl_flash, false, false},
        {"pack", &si__cl_pack, false, false},
        {"bembed", &si__cl_bembed, false, false},
        {"battn", &si__cl_battn, false, false},
        {"bffn", &si__cl_bffn, true, false},
        {"bdown", &si__cl_bdown, false, false},
        {"bmerge", &si__cl_bmerge, false, false},
        {"bhead", &si__cl_bhead, false, false},
        {"bhead_rows", &si__cl_bhead_rows, false, false},
        {"bakv", &si__cl_bakv, false, false},
        {"bacore", &si__cl_bacore, false, false},
        {"bao", &si__cl_bao, false, false},
        {"baout", &si__cl_baout, false, false},
    };
    const int n = (int)(sizeof kinds / sizeof kinds[0]);
    for (int i = 0; i < n; i++) {
        const struct starpu_codelet *cl = kinds[i].cl;
        CHECK(cl->cpu_funcs[0] != NULL, "%s: no CPU function", kinds[i].var);
        CHECK(cl->name != NULL && cl->name[0] != '\0', "%s: no name", kinds[i].var);
        CHECK(!kinds[i].decode || cl->nbuffers == STARPU_VARIABLE_NBUFFERS,
              "%s: a fixed count of buffers in the in-place graph", kinds[i].var);
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
    check_extents();
    return test_result();
}
