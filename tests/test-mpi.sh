#!/usr/bin/env bash
# test-mpi.sh - one model across MPI ranks (StarPU-MPI, issue 23): generate
# under mpirun with 2 (and 3) ranks of one CPU worker each decodes the
# single process's greedy tokens, in dense, gate and predictor modes, on a
# synthetic model and on SmolLM2 when it is there; only rank 0 prints; the
# engine's options it does not run across ranks and the commands other than
# generate are refused in one line; a rank that dies ends the run (mpirun's
# abort, naming it) instead of hanging it.  Skipped, with the reason, without a
# StarPU-MPI build or mpirun.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! "$si" --version | grep -q ', StarPU-MPI'; then
    echo "SKIP: starinfer was built without StarPU-MPI (tools/install-deps builds StarPU with it)"
    exit 77
fi
if ! command -v mpirun >/dev/null; then
    echo "SKIP: no mpirun (Debian: openmpi-bin)"
    exit 77
fi
# OpenMPI refuses root unless told; more ranks than cores are fine here.
flags=(--oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
mpi() {
    local n=$1
    shift
    timeout 300 mpirun "${flags[@]}" -np "$n" -x STARPU_NCPU=1 -x STARPU_SILENT=1 "$si" "$@"
}

# same MODEL ARGS...: the ids a single process decodes, then 2 and 3 ranks'.
same() {
    local m=$1
    shift
    STARPU_NCPU=1 "$si" generate -m "$m" -p "the cat sat on" -n 16 --temp 0 --ids "$@" \
        >"$tmp/one" 2>"$tmp/err" || { fail "one process $*: $(cat "$tmp/err")"; return; }
    for n in 2 3; do
        mpi "$n" generate -m "$m" -p "the cat sat on" -n 16 --temp 0 --ids "$@" >"$tmp/many" \
            2>"$tmp/err" || { fail "$n ranks $*: $(tail -3 "$tmp/err")"; continue; }
        if cmp -s "$tmp/one" "$tmp/many"; then
            echo "ok: $(basename "$m") $* on $n ranks: $(grep '^ids' "$tmp/many")"
        else
            fail "$(basename "$m") $* on $n ranks: '$(cat "$tmp/many")', one process '$(cat "$tmp/one")'"
        fi
        # rank 0 alone reports (once)
        [ "$(grep -c '^prompt: ' "$tmp/err")" = 1 ] || fail "$n ranks: not one report: $(cat "$tmp/err")"
    done
}

"$si" synth -o "$tmp/r.gguf" --arch llama-relu --preset tiny --n-layer 6 --type q4_0 --seed 4 \
    --predictor 32 >/dev/null 2>&1 || fail "synth relu"
"$si" synth -o "$tmp/s.gguf" --arch llama-silu --preset tiny --n-layer 6 --type f32 --seed 3 \
    >/dev/null 2>&1 || fail "synth silu"
same "$tmp/s.gguf"
same "$tmp/r.gguf"
same "$tmp/r.gguf" --sparsity gate
same "$tmp/r.gguf" --sparsity predictor
if [ -n "${STARINFER_TEST_MODEL:-}" ] && [ -f "$STARINFER_TEST_MODEL" ]; then
    same "$STARINFER_TEST_MODEL"
else
    echo "note: STARINFER_TEST_MODEL not set; SmolLM2 across ranks not run"
fi

# What does not run across ranks says so, once, and fails.
"$si" convert -m "$tmp/r.gguf" --bundle -o "$tmp/r.flash" >/dev/null || fail "convert --bundle"
mpi 2 generate -m "$tmp/r.gguf" -p hi -n 2 --sparsity gate --flash-store "$tmp/r.flash" >"$tmp/out" \
    2>"$tmp/err" && fail "the flash tier across ranks succeeded"
grep -q 'across MPI ranks the engine runs on CPU workers in memory so far' "$tmp/err" ||
    fail "flash across ranks: $(cat "$tmp/err")"
mpi 2 perplexity -m "$tmp/r.gguf" -f "$tmp/r.gguf" >"$tmp/out" 2>"$tmp/err" &&
    fail "perplexity across ranks succeeded"
[ "$(grep -c 'perplexity runs in one process; across MPI ranks (mpirun) so far: generate' "$tmp/err")" = 1 ] ||
    fail "perplexity across ranks: $(cat "$tmp/err")"
mpi 7 generate -m "$tmp/r.gguf" -p hi -n 2 >"$tmp/out" 2>"$tmp/err" && fail "7 ranks for 6 layers succeeded"
grep -q '7 MPI ranks for a model of 6 layers' "$tmp/err" || fail "7 ranks: $(cat "$tmp/err")"

# A rank that dies (rank 1 out of CPU time after 2 s): mpirun ends the
# others and says which one; nothing hangs.
gen=(generate -m "$tmp/r.gguf" -p "the cat" -n 100000 -c 100100 --ignore-eos)
timeout 300 mpirun "${flags[@]}" -x STARPU_NCPU=1 -np 1 "$si" "${gen[@]}" : \
    -np 1 bash -c 'ulimit -t 2; exec "$0" "$@"' "$si" "${gen[@]}" >/dev/null 2>"$tmp/err"
rc=$?
[ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "a dying rank: mpirun exited $rc"
# (killed by the limit's signal, or ending on it with a status: mpirun
# reports either, naming the rank)
grep -Eq 'exited on signal|exited with non-zero status' "$tmp/err" &&
    echo "ok: a dying rank ends the run: $(grep -Em1 'exited on signal|exited with non-zero' "$tmp/err")" ||
    fail "a dying rank: $(tail -5 "$tmp/err")"

[ "$failures" = 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all MPI checks passed"
