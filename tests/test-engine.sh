#!/usr/bin/env bash
# test-engine.sh - the engine against the reference (tests/test-engine) under
# each StarPU scheduler the engine is tested with and one and two CPU workers.
# The sweep of every type on every synthetic architecture, gemma3 and the GPU
# forms' CPU twins run in three of the configurations (a scheduler of each
# kind, one and two workers, the CLI's caller worker) and without VNNI, the
# rest with SI_TEST_ENGINE_QUICK=1.
set -u
rc=0
for sched in eager lws dmda dmdas; do
    for ncpu in 1 2; do
        quick=1
        case "$sched $ncpu" in "eager 2" | "dmdas 1") quick=0 ;; esac
        echo "== STARPU_SCHED=$sched STARPU_NCPU=$ncpu SI_TEST_ENGINE_QUICK=$quick"
        SI_TEST_ENGINE_QUICK=$quick STARPU_SCHED=$sched STARPU_NCPU=$ncpu ./tests/test-engine || rc=1
    done
done
# The test's thread as CPU worker 0 (the CLI's default): alone (every task
# runs while it waits) and beside a StarPU worker, under a work-stealing and
# a model-driven scheduler (dmda queues tasks per worker: nothing steals
# them from worker 0).
for cfg in "lws 1 1" "lws 2 0" "dmda 2 1"; do
    set -- $cfg
    echo "== SI_TEST_CALLER_WORKER=1 STARPU_SCHED=$1 STARPU_NCPU=$2 SI_TEST_ENGINE_QUICK=$3"
    SI_TEST_ENGINE_QUICK=$3 SI_TEST_CALLER_WORKER=1 STARPU_SCHED=$1 STARPU_NCPU=$2 \
        ./tests/test-engine || rc=1
done
# Predictor mode's separate predictor task (what a CUDA hot slice or the
# flash tier gets), on CPU workers: SI_NO_FUSE_PRED=1.
echo "== SI_NO_FUSE_PRED=1 STARPU_SCHED=lws STARPU_NCPU=2 SI_TEST_ENGINE_QUICK=1"
SI_NO_FUSE_PRED=1 SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=lws STARPU_NCPU=2 ./tests/test-engine || rc=1
# Without AVX-512 VNNI (SI_NO_VNNI=1), as on CPUs that lack it: batched
# prefill on packed rows then dequantizes them for sgemm (si_k_gemm_tensor)
# instead of the integer GEMM; the packed matrix-vector kernels are the AVX2 ones.
echo "== SI_NO_VNNI=1 STARPU_SCHED=eager STARPU_NCPU=2 SI_TEST_ENGINE_QUICK=0"
SI_NO_VNNI=1 SI_TEST_ENGINE_QUICK=0 STARPU_SCHED=eager STARPU_NCPU=2 ./tests/test-engine || rc=1
exit $rc
