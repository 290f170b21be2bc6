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
data=$(cd "${srcdir:-.}/tests/data/powerinfer" && pwd)
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

# PowerInfer loads what starinfer writes: synth --powerinfer, train-predictor
# --powerinfer and convert --powerinfer write the tensors it makes, no more
# (its loader refuses any other).  Run where PowerInfer is built
# (tools/build-peer --powerinfer; STARINFER_POWERINFER: the folder of its
# main and perplexity, else the cache's), skipped with the reason otherwise.
pi=${STARINFER_POWERINFER:-}
if [ -z "$pi" ]; then
    for d in "${STARINFER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/starinfer}"/peer-powerinfer/*/build/bin; do
        [ -x "$d/perplexity" ] && pi=$d
    done
fi
if [ -n "$pi" ] && [ -x "$pi/perplexity" ]; then
    # synth --powerinfer (Q4_0, F16), and convert --powerinfer of a GGUF
    # synth file (Q8_0: ffn_down dropped, ffn_down_t re-encoded in F16)
    for t in q4_0 f16 q8_0; do
        f=$tmp/synth-$t.gguf
        if [ $t = q8_0 ]; then
            "$si" synth -o "$tmp/gguf-$t.gguf" --arch llama-relu --preset tiny --type $t --predictor 32 \
                >/dev/null 2>&1 && "$si" convert -m "$tmp/gguf-$t.gguf" --powerinfer -o "$f" >/dev/null 2>&1 ||
                { fail "convert --powerinfer of a $t synth file"; continue; }
        else
            "$si" synth -o "$f" --arch llama-relu --preset tiny --type $t --predictor 32 --powerinfer \
                >/dev/null 2>&1 || { fail "synth --powerinfer --type $t"; continue; }
        fi
        (cd "$tmp" && timeout 300 "$pi/perplexity" -m "$f" -f "$data/text.txt" -c 128 -t 1) \
            >"$tmp/pi.out" 2>&1
        v=$(sed -n 's/^Final estimate: PPL = \([0-9.]*\) .*/\1/p' "$tmp/pi.out")
        [ -n "$v" ] || { fail "PowerInfer on synth --powerinfer ($t): $(tail -3 "$tmp/pi.out")"; continue; }
        echo "ok: PowerInfer ($pi) runs starinfer's $t PowerInfer-layout file: perplexity $v (starinfer's predictor mode: $(ppl "$f" --sparsity predictor))"
    done
    # A GPU index from `starinfer place`, read by PowerInfer's own GGUF
    # reader as its loader takes it (pi-gpuidx, built beside its binaries
    # by tools/powerinfer-fixtures): the same neurons per layer and the
    # same VRAM capacity as starinfer reads.
    if [ -x "$pi/pi-gpuidx" ]; then
        m=$data/llama.gguf
        if "$si" profile -m "$m" --corpus "$data/text.txt" -o "$tmp/l.prof" >/dev/null 2>&1 &&
            "$si" place -m "$m" --profile "$tmp/l.prof" --vram-budget 32.15M --cpu-bw 20 --gpu-bw 1000 \
                --h2d-bw 25 --h2d-lat 10 --t-sync 0.5 -o "$tmp/l.gpuidx" >/dev/null 2>&1; then
            "$pi/pi-gpuidx" "$tmp/l.gpuidx" >"$tmp/pi-idx" 2>&1
            "$si" place --show "$tmp/l.gpuidx" --neurons >"$tmp/si-idx" 2>&1
            want=$(sed -n 's/^vram capacity: \([0-9]*\) bytes/vram_capacity: \1/p; /^layer /p' "$tmp/si-idx")
            n=$(grep -c '^layer ' "$tmp/si-idx")
            if [ "$n" = 2 ] && grep -q ': [1-9][0-9]*: ' "$tmp/si-idx" && [ "$(cat "$tmp/pi-idx")" = "$want" ]; then
                echo "ok: PowerInfer's GGUF reader reads starinfer's GPU index as starinfer does ($(grep '^layer ' "$tmp/si-idx" | cut -d: -f1,2 | tr '\n' ' '))"
            else
                fail "PowerInfer reads starinfer's GPU index otherwise: $(head -c 300 "$tmp/pi-idx")"
            fi
        else
            fail "profile or place on $m"
        fi
    else
        echo "note: $pi/pi-gpuidx not built (tools/powerinfer-fixtures builds it); PowerInfer's reading of starinfer's GPU index not checked"
    fi
else
    echo "note: PowerInfer not built (tools/build-peer --powerinfer SRC); that it loads starinfer's files not checked here"
fi
[ "$failures" = 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all PowerInfer checks passed"
