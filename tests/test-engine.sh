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
exit $rc
