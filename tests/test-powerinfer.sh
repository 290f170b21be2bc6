#!/usr/bin/env bash
# test-powerinfer.sh - `starinfer perplexity` on PowerInfer's own files
# (tests/data/powerinfer/ARCH.gguf, made by its converters) against what
# PowerInfer's perplexity tool printed on the same text (ARCH.expect; see
# docs/powerinfer.md): the same chunks (the text tokenized as PowerInfer
# does), every neuron computed within 0.1% of PowerInfer's all-neurons
# value, and predictor mode (PowerInfer's own inference) within the bound
# below of its value.  test-powerinfer.c checks the greedy tokens.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
data=${srcdir:-.}/tests/data/powerinfer
# value KEY FILE: the number after "PPL = " on KEY's line
value() { sed -n "s/^$1: Final estimate: PPL = \([0-9.]*\) .*/\1/p" "$2"; }
ppl() { # ppl MODEL ARGS...: our final estimate (and the tokens scored into $tmp/scored)
    "$si" perplexity -m "$1" -f "$data/text.txt" -c 128 "${@:2}" >"$tmp/out" 2>"$tmp/err" ||
        { fail "perplexity $*: $(cat "$tmp/err")"; echo 0; return; }
    sed -n 's/^Final estimate: PPL = \([0-9.]*\) .*(\([0-9]*\) tokens scored.*/\2/p' "$tmp/out" >"$tmp/scored"
    sed -n 's/^Final estimate: PPL = \([0-9.]*\) .*/\1/p' "$tmp/out"
}
# rel A B: |A - B| / B
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.6f", (b > 0 ? d / b : 1) }'; }
# le A B: A <= B, both numbers
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && b != "" && a + 0 <= b + 0) }'; }

for arch in llama bamboo falcon opt; do
    m=$data/$arch.gguf x=$data/$arch.expect
    chunks=$(sed -n 's/^perplexity_n_chunks: //p' "$x")
    want=$(value perplexity_final "$x") want_all=$(value all_neurons_perplexity_final "$x")
    [ -n "$chunks" ] && [ -n "$want" ] && [ -n "$want_all" ] || { fail "$x: incomplete"; continue; }

    # Every neuron: the same function in two arithmetics (PowerInfer's
    # fp16 attention and sums, the reference's llama.cpp arithmetic), which
    # move a perplexity by far less than 0.1% (SmolLM2: 0.2% between
    # llama.cpp's own builds, docs/model.md).
    dense=$(ppl "$m" --sparsity dense)
    [ "$(cat "$tmp/scored")" = $((chunks * 63)) ] ||
        fail "$arch: $(cat "$tmp/scored") tokens scored, PowerInfer $chunks chunks of 63"
    r=$(rel "$dense" "$want_all")
    le "$r" 0.001 || fail "$arch dense: perplexity $dense, PowerInfer's with every neuron $want_all (off by $r)"
    echo "ok: $arch every neuron: $dense, PowerInfer $want_all (off by $r)"

    # Predictor mode: the neurons a rough predictor picks by the sign of its
    # output, so a neuron near that threshold goes either way with the last
    # bits of the arithmetic before it, with its whole contribution.  How
    # much such bits move the perplexity on this model and text is measured
    # here: the KV cache in f32 instead of fp16 is a change of that kind.
    # PowerInfer's arithmetic differs from ours by changes of that kind too
    # (its fp16 attention before flash attention, its fp16 sums in the down
    # projection), so the bound is twice that measured effect, and not
    # under the 0.1% of every neuron's.
    pred=$(ppl "$m" --sparsity predictor)
    pred32=$(ppl "$m" --sparsity predictor --kv-f32)
    bound=$(awk -v s="$(rel "$pred32" "$pred")" 'BEGIN { b = 2 * s; printf "%.6f", (b > 0.001 ? b : 0.001) }')
    r=$(rel "$pred" "$want")
    le "$r" "$bound" || fail "$arch predictor: perplexity $pred, PowerInfer's $want (off by $r, bound $bound)"
    echo "ok: $arch predictor: $pred, PowerInfer $want (off by $r; bound $bound: twice the KV cache's fp16 rounding, $pred32 in f32)"
done
[ "$failures" = 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all PowerInfer checks passed"
