#!/usr/bin/env bash
# test-many-workers.sh - the engine with more CPU workers than this machine
# has cores (STARPU_NCPU; counts and limits, not speed): a model with 32 kv
# heads gives a prompt batch's attn_o_batch tasks one buffer per kv-head
# group and worker's token range, which at 32 workers passed the 272 handles
# a task can carry (a segfault before the engine capped its groups at 256
# buffers).  Greedy tokens with 24 and 32 workers, dense and gate mode, equal
# those with one.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

m=$tmp/wide.gguf
"$si" synth -o "$m" --n-embd 1024 --n-ff 2048 --n-layer 2 --n-head 32 --n-head-kv 32 \
    --type q4_0 --measure 0 >"$tmp/synth.log" 2>&1 || fail "synth: $(tail -n 1 "$tmp/synth.log")"
gen() { # gen NCPU MODE: the greedy tokens' text of a 40-token prompt
    STARPU_NCPU=$1 STARPU_SILENT=1 "$si" generate -m "$m" --sparsity "$2" --temp 0 -n 8 \
        -p "$(printf 'one two three four five six seven eight nine ten %.0s' 1 2 3 4)" \
        2>"$tmp/err"
}
for mode in dense gate; do
    want=$(gen 1 $mode) || fail "$mode, 1 worker: $(tail -n 1 "$tmp/err")"
    for n in 24 32; do
        got=$(gen $n $mode) || { fail "$mode, $n workers: exit $?: $(tail -n 1 "$tmp/err")"; continue; }
        [ "$got" = "$want" ] || fail "$mode, $n workers: '$got', one worker: '$want'"
        echo "ok: $mode, $n workers: the tokens of one worker"
    done
done
[ "$failures" = 0 ]
