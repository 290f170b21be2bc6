/* pack.c - the engine's set-up task that packs weight rows 8 at a time (graph/weights.c). */
#include "codelets/codelets.h"

#include "model/pack8.h"

#include <string.h>

/* Groups [g0, g1) of a matrix's rows into the engine's copy, or in place
 * (src == dst); no buffers (the memory is the engine's own, before any
 * handle is registered). */
static void pack_cpu(void *buffers[], void *cl_arg)
{
    (void)buffers;
    const struct si__pack_job *j = cl_arg;
    const size_t gb = 8 * j->row_bytes;
    for (int64_t g = j->g0; g < j->g1; g++) {
        char *dst = j->dst + (size_t)g * gb;
        if (j->src != j->dst) {
            si_pack8(j->type, j->src + (size_t)g * gb, j->row_bytes, j->n, dst);
            continue;
        }
        si_pack8(j->type, dst, j->row_bytes, j->n, j->tmp); /* in place, through tmp */
        memcpy(dst, j->tmp, gb);
    }
    if (j->release) /* the source's pages, read: out of the process */
        si__drop_pages(j->src + (size_t)j->g0 * gb, (size_t)(j->g1 - j->g0) * gb);
}

static struct starpu_perfmodel pack_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_pack8"};

struct starpu_codelet si__cl_pack = {
    .cpu_funcs = {pack_cpu},
    .nbuffers = 0,
    .model = &pack_model,
    .name = "pack8",
};
