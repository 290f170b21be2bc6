/*
 * runtime.h - starting and describing the StarPU runtime.
 *
 * starinfer honours StarPU's own environment variables (STARPU_SCHED,
 * STARPU_NCPU, STARPU_NCUDA, STARPU_FXT_TRACE, ...).  When the embedding
 * application has already initialised StarPU, that instance is used and left
 * running at the end.
 */
#ifndef SI_GRAPH_RUNTIME_H
#define SI_GRAPH_RUNTIME_H

#include <stdbool.h>
#include <stdio.h>

struct si_runtime {
    bool owned; /* we called starpu_init() and will call starpu_shutdown() */
    bool started;
};

/* Start StarPU (or adopt a running instance).  SI_OK, SI_E_NO_DEVICE when
 * StarPU finds no worker, SI_E_RUNTIME otherwise; `err` gets one line. */
int si_runtime_start(struct si_runtime *rt, char *err, size_t err_size);

/* Stop StarPU if si_runtime_start() started it. */
void si_runtime_stop(struct si_runtime *rt);

/* Worker counts by kind. */
unsigned si_runtime_ncpu(void);
unsigned si_runtime_ncuda(void);

/* Print StarPU's version, scheduler and workers, one "label: value" line each. */
void si_runtime_describe(FILE *f);

#endif /* SI_GRAPH_RUNTIME_H */
