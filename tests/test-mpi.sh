#!/usr/bin/env bash
# test-mpi.sh - one model across MPI ranks (StarPU-MPI, issue 23): generate
# under mpirun with 2 (and 3) ranks of one CPU worker each decodes the
# single process's greedy tokens, in dense, gate and predictor modes, on a
# synthetic model and on SmolLM2 (dense, and gate with a profile's CATS
# thresholds) when it is there; perplexity on 2 ranks
# prints the single process's values (every position's logits scored: dense,
# gate and predictor modes on the synthetic model, dense on SmolLM2), chat
# answers as one process, bench prints one table; only rank 0 prints; the
# engine's options it does not run across ranks and the other commands are
# refused in one line; a rank that dies ends the run (mpirun's abort, naming
# it) instead of hanging it.  Skipped, with the reason, without a StarPU-MPI
# build or mpirun.
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
# Under the sanitizers the ranks record allocation stacks with the slow
# unwinder: OpenMPI's leaks (tests/lsan.supp) are matched by its libraries'
# names, which stacks from frame pointers (run-tests' default) lose.
lsan=${LSAN_OPTIONS:-}
[ -z "${SI_SAN_FLAGS:-}" ] || lsan=${lsan:+$lsan:}fast_unwind_on_malloc=0
# run_mpirun ARGS...: mpirun with the flags above, the sanitizers' unwinder
# and a limit; mpi N ARGS...: N ranks of one worker each running starinfer.
run_mpirun() { LSAN_OPTIONS=$lsan timeout 300 mpirun "${flags[@]}" "$@"; }
mpi() {
    local n=$1
    shift
    run_mpirun -np "$n" -x STARPU_NCPU=1 -x STARPU_SILENT=1 "$si" "$@"
}

# Ranks to compare with one process: 2 and 3 (a middle rank that both
# receives and sends); under the sanitizers 2 only, whose ranks run every
# receive and send (a third rank runs the same code again, at 3x the time).
ranks="2 3"
[ -n "${SI_SAN_FLAGS:-}" ] && ranks=2
# full: the whole set; under the sanitizers (their pass looks for memory
# errors) one model in dense and predictor mode runs every exchange the
# ranks make (the pipeline's, perplexity's, chat's, bench's), and the
# other modes and models, which exchange the same way, are left to the
# plain build's pass.
full() { [ -z "${SI_SAN_FLAGS:-}" ]; }

# same MODEL ARGS...: the ids a single process decodes, then 2 and 3 ranks'.
same() {
    local m=$1
    shift
    STARPU_NCPU=1 "$si" generate -m "$m" -p "the cat sat on" -n 16 --temp 0 --ids "$@" \
        >"$tmp/one" 2>"$tmp/err" || { fail "one process $*: $(cat "$tmp/err")"; return; }
    for n in $ranks; do
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
full && same "$tmp/s.gguf"
same "$tmp/r.gguf"
full && same "$tmp/r.gguf" --sparsity gate
same "$tmp/r.gguf" --sparsity predictor
# Without STARPU_NCPU each rank's workers are the cores of its binding
# (StarPU-MPI alone keeps one of them for its progress thread: a rank bound
# to one core, as mpirun -np 2 binds them on two cores, had no worker).
STARPU_NCPU=1 "$si" generate -m "$tmp/r.gguf" -p "the cat sat on" -n 16 --temp 0 --ids \
    >"$tmp/one" 2>"$tmp/err" || fail "one process: $(cat "$tmp/err")"
if run_mpirun -np 2 -x STARPU_SILENT=1 "$si" generate -m "$tmp/r.gguf" -p "the cat sat on" -n 16 \
    --temp 0 --ids >"$tmp/many" 2>"$tmp/err"; then
    cmp -s "$tmp/one" "$tmp/many" && echo "ok: 2 ranks without STARPU_NCPU: $(grep '^ids' "$tmp/many")" ||
        fail "2 ranks without STARPU_NCPU: '$(cat "$tmp/many")', one process '$(cat "$tmp/one")'"
else
    fail "2 ranks without STARPU_NCPU: $(grep -v '^[-[]' "$tmp/err" | head -n 3)"
fi
if ! full; then
    echo "note: under the sanitizers SmolLM2's tokens across ranks are left to the plain build"
elif [ -n "${STARINFER_TEST_MODEL:-}" ] && [ -f "$STARINFER_TEST_MODEL" ]; then
    same "$STARINFER_TEST_MODEL"
    # gate mode on the SiLU model: CATS thresholds from a short profile
    "$si" profile -m "$STARINFER_TEST_MODEL" -f "${srcdir:-.}/README.md" -o "$tmp/smol.prof" -n 64 -c 64 \
        >/dev/null 2>&1 || fail "profile SmolLM2"
    same "$STARINFER_TEST_MODEL" --sparsity gate --profile "$tmp/smol.prof"
else
    echo "note: STARINFER_TEST_MODEL not set; SmolLM2 across ranks not run"
fi

# perplexity: every position's logits, scored on rank 0, as one process
# evaluating token by token (-b 1) scores them: the same values to the digit.
ppl_same() { # MODEL CTX [ARGS...]
    local m=$1 c=$2
    shift 2
    STARPU_NCPU=1 "$si" perplexity -m "$m" -f "$text" -c "$c" --chunks 2 -b 1 "$@" >"$tmp/one" 2>"$tmp/err" ||
        { fail "perplexity, one process: $(cat "$tmp/err")"; return; }
    mpi 2 perplexity -m "$m" -f "$text" -c "$c" --chunks 2 "$@" >"$tmp/many" 2>"$tmp/err" ||
        { fail "perplexity, 2 ranks: $(tail -3 "$tmp/err")"; return; }
    grep -q 'rank 0 of 2 MPI ranks' "$tmp/err" ||
        fail "perplexity, 2 ranks: $(cat "$tmp/err")"
    local a b
    a=$(sed 's/ tokens scored, .*//' "$tmp/one")
    b=$(sed 's/ tokens scored, .*//' "$tmp/many")
    [ "$(grep -c '^\[[12]\] [0-9]' "$tmp/many")" = 2 ] && [ "$a" = "$b" ] &&
        echo "ok: perplexity of $(basename "$m") $* on 2 ranks: $(echo "$b" | tr '\n' ' ')" ||
        fail "perplexity of $(basename "$m") $*: 2 ranks '$b', one process '$a'"
}
text=$tmp/text.txt
head -c 4000 "${srcdir:-.}/README.md" >"$text"
ppl_same "$tmp/r.gguf" 64
full && ppl_same "$tmp/r.gguf" 64 --sparsity gate
full && ppl_same "$tmp/r.gguf" 64 --sparsity predictor
if [ -n "${STARINFER_TEST_MODEL:-}" ] && [ -f "$STARINFER_TEST_MODEL" ]; then
    full && ppl_same "$STARINFER_TEST_MODEL" 128
    # chat: rank 0 reads the turns and shares them; the answers are the
    # single process's (-b 1: its prompts token by token, as the ranks do).
    printf 'What is the capital of France?\nAnd of Germany?\n' >"$tmp/turns"
    STARPU_NCPU=1 "$si" chat -m "$STARINFER_TEST_MODEL" -n 10 --temp 0 -b 1 <"$tmp/turns" \
        >"$tmp/one" 2>"$tmp/err" || fail "chat, one process: $(cat "$tmp/err")"
    mpi 2 chat -m "$STARINFER_TEST_MODEL" -n 10 --temp 0 <"$tmp/turns" >"$tmp/many" 2>"$tmp/err" ||
        fail "chat, 2 ranks: $(tail -3 "$tmp/err")"
    [ "$(grep -c '^chat: turn ' "$tmp/err")" = 2 ] || fail "chat, 2 ranks: not 2 turns: $(cat "$tmp/err")"
    [ -s "$tmp/one" ] && cmp -s "$tmp/one" "$tmp/many" &&
        echo "ok: chat on 2 ranks answers as one process: $(tr '\n' '|' <"$tmp/many")" ||
        fail "chat, 2 ranks: '$(cat "$tmp/many")', one process '$(cat "$tmp/one")'"
fi
# bench: one table (rank 0's), the same tokens in every run.
mpi 2 bench -m "$tmp/r.gguf" --prompt-tokens 8 -n 8 -r 2 >"$tmp/out" 2>"$tmp/err" ||
    fail "bench, 2 ranks: $(tail -3 "$tmp/err")"
[ "$(grep -c '^| (default) |.*| yes |$' "$tmp/out")" = 1 ] && grep -q 'across 2 MPI ranks' "$tmp/err" &&
    echo "ok: bench on 2 ranks: $(grep '^| (default)' "$tmp/out")" ||
    fail "bench, 2 ranks: $(cat "$tmp/out" "$tmp/err")"

# What does not run across ranks says so, once, and fails.
"$si" convert -m "$tmp/r.gguf" --bundle -o "$tmp/r.flash" >/dev/null || fail "convert --bundle"
mpi 2 generate -m "$tmp/r.gguf" -p hi -n 2 --sparsity gate --flash-store "$tmp/r.flash" >"$tmp/out" \
    2>"$tmp/err" && fail "the flash tier across ranks succeeded"
grep -q 'across MPI ranks the engine runs on CPU workers in memory so far' "$tmp/err" ||
    fail "flash across ranks: $(cat "$tmp/err")"
for bad in "convert -m $tmp/r.gguf --bundle -o $tmp/x.flash:convert runs in one process" \
    "perplexity -m $tmp/r.gguf -f $text --engine ref:--engine ref runs in one process" \
    "bench -m $tmp/r.gguf -n 2 --sched eager,dmda:StarPU starts once: one --sched policy"; do
    read -r -a args <<<"${bad%%:*}"
    mpi 2 "${args[@]}" >"$tmp/out" 2>"$tmp/err" && fail "${args[0]} across ranks succeeded"
    [ "$(grep -c "^starinfer: error: .*${bad#*:}" "$tmp/err")" = 1 ] &&
        echo "ok: ${args[0]} across ranks: $(grep '^starinfer: error' "$tmp/err")" ||
        fail "${args[0]} across ranks: $(cat "$tmp/err")"
done
[ ! -e "$tmp/x.flash" ] || fail "convert across ranks wrote $tmp/x.flash"
mpi 7 generate -m "$tmp/r.gguf" -p hi -n 2 >"$tmp/out" 2>"$tmp/err" && fail "7 ranks for 6 layers succeeded"
grep -q '7 MPI ranks for a model of 6 layers' "$tmp/err" || fail "7 ranks: $(cat "$tmp/err")"

# A rank that dies (rank 1 out of CPU time after 2 s): mpirun ends the
# others and says which one; nothing hangs.
gen=(generate -m "$tmp/r.gguf" -p "the cat" -n 100000 -c 100100 --ignore-eos)
run_mpirun -x STARPU_NCPU=1 -np 1 "$si" "${gen[@]}" : \
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
