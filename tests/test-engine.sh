#!/usr/bin/env bash
# test-engine.sh - the engine against the reference (tests/test-engine) under
# each StarPU scheduler the engine is tested with, one and two CPU workers,
# the CLI's caller worker, and the kernels this CPU can run.  The sweep of
# every type on every synthetic architecture, gemma3 and the GPU forms'
# CPU twins runs where the kernels differ: with two workers (whose sweep
# has one-slice configurations, the reference's order and bits, beside the
# two slices' reordered sums), and without AVX-512 VNNI where the CPU has
# it (the AVX2 kernels, and prefill's blas as the default); the other runs,
# one worker's among them, vary the scheduling with SI_TEST_ENGINE_QUICK=1.
# Each prefill arithmetic the CPU runs is forced in every run
# (test-engine's prefill-int8, prefill-blas and prefill configs).
set -u
rc=0
run() { # run ENV...: one run of tests/test-engine under ENV
    echo "== $*"
    env "$@" ./tests/test-engine || rc=1
}
# Two workers under each policy: the task placements and orders differ.
# (One worker gets the same ready tasks from every policy: one run of it.)
run SI_TEST_ENGINE_QUICK=0 STARPU_SCHED=eager STARPU_NCPU=2
run SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=lws STARPU_NCPU=2
run SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=dmda STARPU_NCPU=2
run SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=dmdas STARPU_NCPU=1
# Predictor mode's separate predictor task (what a CUDA hot slice or the
# flash tier gets), on CPU workers: SI_NO_FUSE_PRED=1, with the sorted
# model-driven policy.
run SI_NO_FUSE_PRED=1 SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=dmdas STARPU_NCPU=2
# Wo's row slices as tasks of their own (SI_FUSE_WO=0; by default the
# sparse modes' attention groups multiply Wo themselves).
run SI_FUSE_WO=0 SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=lws STARPU_NCPU=2
# Decoded tokens' tasks with buffers (SI_INPLACE=0; by default, on CPU
# workers alone, they read their data in place, ordered by phases:
# codelets/task.h).  The GPU's configurations take that graph too.
run SI_INPLACE=0 SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=lws STARPU_NCPU=2
# The test's thread as CPU worker 0 (the CLI's default): alone (every task
# runs while it waits) and beside a StarPU worker, under a work-stealing and
# a model-driven scheduler (dmda queues tasks per worker: nothing steals
# them from worker 0).
run SI_TEST_CALLER_WORKER=1 SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=lws STARPU_NCPU=1
run SI_TEST_CALLER_WORKER=1 SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=lws STARPU_NCPU=2
run SI_TEST_CALLER_WORKER=1 SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=dmda STARPU_NCPU=2
# Without AVX-512 VNNI (SI_NO_VNNI=1), as on CPUs that lack it: the packed
# matrix-vector kernels are the AVX2 ones, prefill's auto is blas and int8
# is skipped.  On a CPU without VNNI that is the first run again.
if "${STARINFER:-./starinfer}" --version | grep -q 'CPU kernels avx2+vnni'; then
    run SI_NO_VNNI=1 SI_TEST_ENGINE_QUICK=0 STARPU_SCHED=eager STARPU_NCPU=2
else
    echo "== SI_NO_VNNI=1: skipped, the kernels in use have no AVX-512 VNNI (the first run ran without it)"
fi
exit $rc
