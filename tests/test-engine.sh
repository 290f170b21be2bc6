#!/usr/bin/env bash
# test-engine.sh - the engine against the reference (tests/test-engine) under
# each StarPU scheduler the engine is tested with and one and two CPU workers.
set -u
rc=0
for sched in eager lws dmda dmdas; do
    for ncpu in 1 2; do
        echo "== STARPU_SCHED=$sched STARPU_NCPU=$ncpu"
        STARPU_SCHED=$sched STARPU_NCPU=$ncpu ./tests/test-engine || rc=1
    done
done
# The test's thread as CPU worker 0 (the CLI's default): alone (every task
# runs while it waits) and beside a StarPU worker, under a work-stealing and
# a model-driven scheduler (dmda queues tasks per worker: nothing steals
# them from worker 0).
for cfg in "lws 1" "lws 2" "dmda 2"; do
    set -- $cfg
    echo "== SI_TEST_CALLER_WORKER=1 STARPU_SCHED=$1 STARPU_NCPU=$2"
    SI_TEST_CALLER_WORKER=1 STARPU_SCHED=$1 STARPU_NCPU=$2 ./tests/test-engine || rc=1
done
exit $rc
