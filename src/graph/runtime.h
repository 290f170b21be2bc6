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

#include <starpu.h>

struct si_runtime {
    bool owned; /* we called starpu_init() and will call starpu_shutdown() */
    bool started;
};

/*
 * Start StarPU (or adopt a running instance).  SI_OK, SI_E_NO_DEVICE when
 * StarPU finds no worker, SI_E_RUNTIME otherwise; `err` gets one line.
 *
 * caller_worker: when this call starts StarPU, the calling thread becomes
 * CPU worker 0 instead of a thread of StarPU's own (StarPU's "not launched"
 * driver): it runs tasks whenever it waits in si_runtime_acquire() and
 * si_runtime_wait_all(), so a process has as many busy threads as StarPU
 * has CPU workers, not one more that competes with them for the cores.
 * That thread must then do every evaluation and stop the runtime (the
 * waits of other threads fail with SI_E_RUNTIME).  Ignored when StarPU is
 * adopted or has no CPU worker.
 */
int si_runtime_start(struct si_runtime *rt, bool caller_worker, char *err, size_t err_size);

/*
 * StarPU-MPI: si_runtime_set_mpi(true) before si_runtime_start has it start
 * MPI and StarPU-MPI over MPI_COMM_WORLD too (and si_runtime_stop shut
 * them down); false when this build has no StarPU-MPI (SI_USE_MPI).  Then
 * whether it runs, this process's rank and the number of ranks (0 and 1
 * without it).
 */
bool si_runtime_set_mpi(bool on);
/* What to say when si_runtime_set_mpi(true) is refused. */
#define SI_RUNTIME_NO_MPI                                                                          \
    "this starinfer was built without StarPU-MPI: it runs in one process (tools/install-deps "     \
    "builds StarPU with MPI; then reconfigure)"
bool si_runtime_mpi(void);
int si_runtime_mpi_rank(void);
int si_runtime_mpi_size(void);
/* *v as rank 0 has it, on every rank (a no-op with one rank); every rank
 * calls it, in the same order. */
void si_runtime_mpi_share(int32_t *v);
/* The same for size bytes at buf (every rank passes the same size). */
void si_runtime_mpi_share_bytes(void *buf, size_t size);

/* Whether name is one of StarPU's scheduling policies (STARPU_SCHED's values;
 * si_runtime_start refuses an unknown one). */
bool si_runtime_sched_known(const char *name);

/* Stop StarPU if si_runtime_start() started it (running the caller's
 * worker until no task is left, when it has one). */
void si_runtime_stop(struct si_runtime *rt);

/* Whether a thread of the process runs a CPU worker (caller_worker), and
 * whether it is the calling one. */
bool si_runtime_has_caller_worker(void);
bool si_runtime_is_caller_worker(void);

/* starpu_data_acquire(h, mode), running the caller's worker while it waits
 * when it has one.  SI_OK, or SI_E_RUNTIME (nothing acquired) when another
 * thread runs the caller's worker: it could wait for tasks queued on a
 * worker that nobody runs. */
int si_runtime_acquire(starpu_data_handle_t h, enum starpu_data_access_mode mode);

/* starpu_task_wait_for_all() likewise: SI_OK or SI_E_RUNTIME. */
int si_runtime_wait_all(void);

/* starpu_task_wait(t) likewise, for a task t submitted with detach 0
 * whose callback sets *done to 1 (atomically, with release order): SI_OK
 * or SI_E_RUNTIME. */
int si_runtime_wait_task(struct starpu_task *t, const int *done);

/* Worker counts by kind. */
unsigned si_runtime_ncpu(void);
unsigned si_runtime_ncuda(void);

/* Print StarPU's version, scheduler and workers, one "label: value" line each. */
void si_runtime_describe(FILE *f);

#endif /* SI_GRAPH_RUNTIME_H */
