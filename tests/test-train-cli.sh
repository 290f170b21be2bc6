#!/usr/bin/env bash
# test-train-cli.sh - `starinfer train-predictor` and `starinfer eval` end to end
# on a tiny synthetic ReLU model (train, the file's predictor tensors through
# `info`, eval's per-layer table and three perplexity modes, the samples file
# reused), and one clear error line with a non-zero exit for each bad input.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# expect_error NEEDLE ARGS...: exit 1, one stderr line naming the problem.
expect_error() {
    local needle=$1
    shift
    "$si" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    [ "$rc" = 1 ] || fail "starinfer $*: exit $rc, expected 1"
    [ "$(wc -l <"$tmp/err")" = 1 ] || fail "starinfer $*: $(wc -l <"$tmp/err") lines on stderr: $(cat "$tmp/err")"
    grep -qF -- "$needle" "$tmp/err" || fail "starinfer $*: stderr lacks '$needle': $(cat "$tmp/err")"
    echo "ok: starinfer $* -> $(cat "$tmp/err")"
}

"$si" --help | grep -q 'train-predictor' || fail "--help does not list train-predictor"
"$si" --help | grep -q '^  eval' || fail "--help does not list eval"
"$si" train-predictor --help | grep -q -- '--target-recall' || fail "train-predictor --help lacks --target-recall"
"$si" eval --help | grep -q -- '--modes' || fail "eval --help lacks --modes"

"$si" synth -o "$tmp/relu.gguf" --arch llama-relu --preset tiny --type q8_0 --seed 5 >/dev/null 2>&1 ||
    fail "synth"
"$si" synth -o "$tmp/silu.gguf" --arch llama-silu --preset tiny --type f32 --seed 5 >/dev/null 2>&1 ||
    fail "synth silu"
for i in $(seq 1 60); do printf 'The quick brown fox %d jumps over the lazy dog. ' "$i"; done >"$tmp/train.txt"
for i in $(seq 1 30); do printf 'A lazy cat %d sleeps under the warm sun all day. ' "$i"; done >"$tmp/held.txt"

# Train: every layer gets a width, the file keeps PowerInfer's names and shapes.
"$si" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/pred.gguf" -n 1200 -c 128 \
    --epochs 6 --samples "$tmp/relu.samples" >"$tmp/out" 2>"$tmp/err" || fail "train-predictor: $(cat "$tmp/err")"
cat "$tmp/out"
grep -q '^train-predictor: .*1200 tokens of .* in windows of 128' "$tmp/out" || fail "train summary: $(cat "$tmp/out")"
grep -q '^ReLU model: active = activation != 0' "$tmp/out" || fail "train: rule line"
[ "$(grep -c '^ *[01]  0\.[0-9]*  *[0-9]*  ' "$tmp/out")" = 2 ] || fail "train: not two layer lines"
grep -q '^predictors: [0-9]* parameters, [0-9.]*% of the model' "$tmp/out" || fail "train: size line"
[ -s "$tmp/relu.samples" ] || fail "train: no samples file"
"$si" info --no-workers --tensors "$tmp/pred.gguf" >"$tmp/info" 2>&1 || fail "info on the output: $(cat "$tmp/info")"
w0=$(awk '$1 == "0" {print $3}' "$tmp/out")
grep -q "blk\.0\.fc1\.weight.*Q8_0.*\[64, $w0\]" "$tmp/info" || fail "fc1 of layer 0 is not Q8_0 [64, $w0]: $(grep fc1 "$tmp/info")"
grep -q "blk\.1\.fc2\.weight.*Q8_0.*\[[0-9]*, 256\]" "$tmp/info" || fail "fc2 of layer 1: $(grep fc2 "$tmp/info")"
"$si" info --no-workers --kv "$tmp/pred.gguf" | grep -q 'powerinfer.sparse_threshold' || fail "no powerinfer.sparse_threshold"
"$si" info --no-workers --kv "$tmp/pred.gguf" | grep -q 'starinfer.predictor.n_samples *UINT64 *1200$' ||
    fail "no starinfer.predictor.n_samples 1200 (trained predictors, not random ones)"
grep -q 'ffn_down_t' "$tmp/info" && fail "ffn_down_t written without --down-t or --powerinfer"
# --powerinfer: PowerInfer's layout, which its loader takes: the PWRI magic,
# ffn_down_t alone (F16: its kernel reads Q4_0 and F16 only; the model is
# Q8_0), none of starinfer's own tensors, predictors of the residual.
"$si" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/pwri.gguf" -n 300 -c 128 --rank 32 \
    --epochs 1 --powerinfer >/dev/null 2>"$tmp/err" || fail "train --powerinfer: $(cat "$tmp/err")"
[ "$(head -c 4 "$tmp/pwri.gguf")" = PWRI ] || fail "--powerinfer: magic $(head -c 4 "$tmp/pwri.gguf")"
"$si" info --no-workers --tensors "$tmp/pwri.gguf" >"$tmp/info" 2>&1
grep -q 'blk\.1\.ffn_down_t\.weight.*F16.*\[64, 256\]' "$tmp/info" ||
    fail "--powerinfer: no F16 [64, 256] ffn_down_t: $(grep ffn_down "$tmp/info")"
grep -q 'ffn_down\.weight\|ffn_planted_prob' "$tmp/info" &&
    fail "--powerinfer: tensors PowerInfer refuses: $(grep 'ffn_down\.weight\|planted' "$tmp/info" | head -2)"
"$si" info --no-workers --kv "$tmp/pwri.gguf" | grep -q 'starinfer.predictor.input *STRING *"residual"' ||
    fail "--powerinfer: the predictors' input is not the residual"
"$si" generate -m "$tmp/pwri.gguf" -p "The quick" -n 8 --temp 0 --sparsity predictor >/dev/null 2>"$tmp/err" ||
    fail "generate on train --powerinfer's file: $(cat "$tmp/err")"
expect_error "PowerInfer gives the predictors the residual the FFN's norm reads: --input ffn does not go in a PowerInfer file" \
    train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/x.gguf" --powerinfer --input ffn
# convert --powerinfer: the same layout from a model with predictors of the
# residual (the trained PWRI file itself: its tensors again, its bytes for
# every ffn_down_t), and refusals
"$si" convert -m "$tmp/pwri.gguf" --powerinfer -o "$tmp/pwri2.gguf" >"$tmp/out" 2>"$tmp/err" ||
    fail "convert --powerinfer: $(cat "$tmp/err")"
# (name, type, shape of every tensor)
tensors() { "$si" info --no-workers --tensors "$1" | awk '$1 ~ /^(blk\.|token_embd|output)/ {print $1, $2, $3, $4}' | sort; }
tensors "$tmp/pwri.gguf" >"$tmp/t1"
tensors "$tmp/pwri2.gguf" >"$tmp/t2"
[ -s "$tmp/t1" ] && cmp -s "$tmp/t1" "$tmp/t2" ||
    fail "convert --powerinfer of a PowerInfer file changed its tensors: $(diff "$tmp/t1" "$tmp/t2" | head -4)"
expect_error "the predictors read the FFN's input (starinfer.predictor.input 'ffn'), and PowerInfer gives them the residual" \
    convert -m "$tmp/pred.gguf" --powerinfer -o "$tmp/x.gguf"
expect_error "PowerInfer's layout needs predictors" convert -m "$tmp/relu.gguf" --powerinfer -o "$tmp/x.gguf"
expect_error "its down projection is ffn_down_t alone (PowerInfer's layout), which llama.cpp does not read" \
    convert -m "$tmp/pwri.gguf" --llama-cpp -o "$tmp/x.gguf"
[ -e "$tmp/x.gguf" ] && fail "a refused convert wrote $tmp/x.gguf"

# The samples file again: no forward pass, the same training, the same output.
"$si" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/pred2.gguf" -n 1200 -c 128 \
    --epochs 6 --samples "$tmp/relu.samples" --threads 1 >"$tmp/out2" 2>"$tmp/err" || fail "train again: $(cat "$tmp/err")"
grep -q 'samples per layer read from' "$tmp/out2" || fail "samples not reused: $(cat "$tmp/out2")"
"$si" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/pred3.gguf" -n 1200 -c 128 \
    --epochs 6 --samples "$tmp/relu.samples" --threads 1 >/dev/null 2>&1 || fail "train a third time"
cmp -s "$tmp/pred2.gguf" "$tmp/pred3.gguf" || fail "the same seed and samples gave different files"

# --predictors-only: the same training (seed, samples, threads) written as a
# predictor file, which --predictors gives the model at run time: the same
# tokens, the same eval table and perplexities as the model written whole.
"$si" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/only.pred" -n 1200 -c 128 \
    --epochs 6 --samples "$tmp/relu.samples" --threads 1 --predictors-only >/dev/null 2>"$tmp/err" ||
    fail "train --predictors-only: $(cat "$tmp/err")"
"$si" info --no-workers --tensors "$tmp/only.pred" >"$tmp/info" 2>&1 || fail "info on the predictor file: $(cat "$tmp/info")"
grep -q 'architecture : "starinfer.predictors"' "$tmp/info" || fail "predictor file: $(grep architecture "$tmp/info")"
grep -q 'model_hash' "$tmp/info" || fail "predictor file: no model_hash"
[ "$(awk '$1 ~ /^blk\./' "$tmp/info" | grep -vc '\.fc[12]\.weight')" = 0 ] ||
    fail "predictor file holds other tensors: $(awk '$1 ~ /^blk\./' "$tmp/info" | grep -v fc | head -2)"
grep -q 'token_embd' "$tmp/info" && fail "predictor file holds token_embd"
cmp -s <(tensors "$tmp/pred2.gguf" | grep '\.fc[12]\.') <(tensors "$tmp/only.pred") ||
    fail "the predictor file's tensors differ from the whole file's: $(diff <(tensors "$tmp/pred2.gguf" | grep '\.fc[12]\.') <(tensors "$tmp/only.pred") | head -3)"
a=$("$si" generate -m "$tmp/pred2.gguf" -p "The quick" -n 16 --temp 0 --ignore-eos --sparsity predictor 2>"$tmp/err") ||
    fail "generate on the whole file: $(cat "$tmp/err")"
b=$("$si" generate -m "$tmp/relu.gguf" --predictors "$tmp/only.pred" -p "The quick" -n 16 --temp 0 --ignore-eos \
    --sparsity predictor 2>"$tmp/err") || fail "generate --predictors: $(cat "$tmp/err")"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "generate: --predictors gave '$b', the whole file '$a'"
# (eval's table: the engine's, and the reference's predictor mode)
for eng in starpu ref; do
    "$si" eval -m "$tmp/pred2.gguf" -f "$tmp/held.txt" -c 128 --modes predictor --engine $eng >"$tmp/e1" 2>"$tmp/err" ||
        fail "eval $eng whole: $(cat "$tmp/err")"
    "$si" eval -m "$tmp/relu.gguf" --predictors "$tmp/only.pred" -f "$tmp/held.txt" -c 128 --modes predictor \
        --engine $eng >"$tmp/e2" 2>"$tmp/err" || fail "eval $eng --predictors: $(cat "$tmp/err")"
    # (all but the first line, which names the model, and the seconds column)
    ev() { awk 'NR > 1 {NF--; print}' "$1"; }
    grep -q '^predictor ' "$tmp/e1" && diff <(ev "$tmp/e1") <(ev "$tmp/e2") >"$tmp/d" ||
        fail "eval $eng --predictors differs from the whole file's: $(head -6 "$tmp/d")"
done
"$si" bench -m "$tmp/relu.gguf" --predictors "$tmp/only.pred" --sparsity predictor --prompt-tokens 8 -n 4 -r 1 \
    >"$tmp/out" 2>"$tmp/err" || fail "bench --predictors: $(cat "$tmp/err")"
echo "ok: a predictor file ($(wc -c <"$tmp/only.pred") bytes) runs as the whole file ($(wc -c <"$tmp/pred2.gguf") bytes)"
"$si" synth -o "$tmp/relu-b.gguf" --arch llama-relu --preset tiny --type q8_0 --seed 6 >/dev/null 2>&1 || fail "synth seed 6"
expect_error "only.pred: predictors trained on another model's weights (its FFN fingerprint" \
    generate -m "$tmp/relu-b.gguf" --predictors "$tmp/only.pred" -p "The quick" -n 4
"$si" synth -o "$tmp/relu-3.gguf" --arch llama-relu --preset tiny --type q8_0 --n-layer 3 >/dev/null 2>&1 ||
    fail "synth 3 layers"
expect_error "only.pred: predictors for a model of 2 layers, 64 wide, 256 neurons, not this one's 3, 64, 256" \
    bench -m "$tmp/relu-3.gguf" --predictors "$tmp/only.pred" -n 4
expect_error "relu.gguf: not a predictor file (general.architecture 'llama'" \
    eval -m "$tmp/relu.gguf" --predictors "$tmp/relu.gguf" -f "$tmp/held.txt"
expect_error "only.pred: a predictor file (train-predictor --predictors-only: give it with --predictors), not a model" \
    generate -m "$tmp/only.pred" -p "The quick" -n 4
expect_error "/nonexistent.pred: No such file or directory" \
    perplexity -m "$tmp/relu.gguf" --predictors /nonexistent.pred -f "$tmp/held.txt"
expect_error "--predictors-only writes no weights; --powerinfer needs the whole model" \
    train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/x.gguf" --predictors-only --powerinfer

# --lookahead: predictors of the attention's input, said by the file's key;
# eval's table through the engine and the reference agree on them; samples
# of one input are refused for the other.
"$si" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/la.gguf" -n 600 -c 128 \
    --epochs 3 --lookahead --samples "$tmp/la.samples" >/dev/null 2>"$tmp/err" ||
    fail "train --lookahead: $(cat "$tmp/err")"
"$si" info --no-workers --kv "$tmp/la.gguf" | grep -q 'starinfer.predictor.input *STRING *"layer"' ||
    fail "--lookahead: no starinfer.predictor.input \"layer\""
"$si" info --no-workers --kv "$tmp/pred.gguf" | grep -q 'starinfer.predictor.input *STRING *"ffn"' ||
    fail "no starinfer.predictor.input \"ffn\""
"$si" eval -m "$tmp/la.gguf" -f "$tmp/held.txt" -c 128 >"$tmp/la-eng" 2>"$tmp/err" || fail "eval lookahead: $(cat "$tmp/err")"
"$si" eval -m "$tmp/la.gguf" -f "$tmp/held.txt" -c 128 --engine ref >"$tmp/la-ref" 2>"$tmp/err" ||
    fail "eval lookahead --engine ref: $(cat "$tmp/err")"
ra=$(awk '$1 == "all" {print $2}' "$tmp/la-eng")
rb=$(awk '$1 == "all" {print $2}' "$tmp/la-ref")
awk -v a="$ra" -v b="$rb" 'BEGIN { d = a - b; exit (a == "" || b == "" || a < 0.5 || d > 0.01 || d < -0.01) }' ||
    fail "eval lookahead: the engine's recall $ra, the reference's $rb"
echo "ok: lookahead predictors, held-out recall $ra (engine) $rb (reference)"
expect_error "la.samples: samples of the attention's input, but this run trains on the FFN's (--input ffn)" \
    train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/x.gguf" --samples "$tmp/la.samples"
expect_error "relu.samples: samples of the FFN's input, but this run trains on the attention's (--input layer)" \
    train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/x.gguf" --samples "$tmp/relu.samples" --lookahead

# Eval: a table of two layers, the size share, three modes.
"$si" eval -m "$tmp/pred.gguf" -f "$tmp/held.txt" -c 128 >"$tmp/out" 2>"$tmp/err" || fail "eval: $(cat "$tmp/err")"
cat "$tmp/out"
grep -q '^eval: .* chunks of 128' "$tmp/out" || fail "eval summary"
grep -q '^  all  *0\.[0-9]*' "$tmp/out" || fail "eval: no 'all' line"
grep -q '^predictors: [0-9]* parameters, [0-9.]*% of the model' "$tmp/out" || fail "eval: size line"
grep -q '^dense  *[0-9.]* +/- .* +0\.00%  *1\.0000  ' "$tmp/out" ||
    fail "eval: dense line (every neuron computed): $(grep ^dense "$tmp/out")"
# (gate mode's batches add in another order than dense's: 0.0x%)
grep -q '^gate  *[0-9.]* +/- .* [-+]0\.0[0-9]%  *0\.[0-9]*  ' "$tmp/out" ||
    fail "eval: gate on ReLU is exact and computes the active neurons only: $(grep ^gate "$tmp/out")"
grep -q '^predictor  *[0-9.]* +/- ' "$tmp/out" || fail "eval: predictor line"
# Dense perplexity is `starinfer perplexity`'s: both on the engine (the
# default), and both on the reference with --engine ref.
ppl=$("$si" perplexity -m "$tmp/pred.gguf" -f "$tmp/held.txt" -c 128 2>/dev/null | sed -n 's/^Final estimate: PPL = \([0-9.]*\) .*/\1/p')
dense=$(awk '$1 == "dense" {print $2}' "$tmp/out")
[ -n "$ppl" ] && [ "$ppl" = "$dense" ] || fail "eval's dense perplexity $dense, starinfer perplexity's $ppl"
"$si" eval -m "$tmp/pred.gguf" -f "$tmp/held.txt" -c 128 --engine ref >"$tmp/out-ref" 2>"$tmp/err" ||
    fail "eval --engine ref: $(cat "$tmp/err")"
ppl_ref=$("$si" perplexity -m "$tmp/pred.gguf" -f "$tmp/held.txt" -c 128 --engine ref 2>/dev/null | sed -n 's/^Final estimate: PPL = \([0-9.]*\) .*/\1/p')
dense_ref=$(awk '$1 == "dense" {print $2}' "$tmp/out-ref")
[ -n "$ppl_ref" ] && [ "$ppl_ref" = "$dense_ref" ] ||
    fail "eval --engine ref's dense perplexity $dense_ref, starinfer perplexity --engine ref's $ppl_ref"
# the engine's batches' arithmetic within 1% of the reference's, in every mode
for mode in dense gate predictor; do
    a=$(awk -v m=$mode '$1 == m {print $2}' "$tmp/out")
    b=$(awk -v m=$mode '$1 == m {print $2}' "$tmp/out-ref")
    awk -v a="$a" -v b="$b" 'BEGIN { r = a / b - 1; exit (a == "" || b == "" || r > 0.01 || r < -0.01) }' ||
        fail "eval $mode: the engine's perplexity $a is not within 1% of the reference's $b"
done
# the predictors' table: the engine's dense pass against the reference's
ra=$(awk '$1 == "all" {print $2}' "$tmp/out")
rb=$(awk '$1 == "all" {print $2}' "$tmp/out-ref")
awk -v a="$ra" -v b="$rb" 'BEGIN { d = a - b; exit (a == "" || b == "" || d > 0.01 || d < -0.01) }' ||
    fail "eval: the engine's recall $ra, the reference's $rb"
"$si" eval -m "$tmp/pred.gguf" -f "$tmp/held.txt" -c 128 --modes predictor >"$tmp/out" 2>"$tmp/err" ||
    fail "eval --modes predictor: $(cat "$tmp/err")"
grep -q '^dense' "$tmp/out" && fail "eval --modes predictor ran dense"
grep -q '^predictor  *[0-9.]* +/- .*  *-  ' "$tmp/out" || fail "eval --modes predictor: $(cat "$tmp/out")"

# SiLU: thresholds from a first pass, stored in the output for eval.
"$si" train-predictor -m "$tmp/silu.gguf" -f "$tmp/train.txt" -o "$tmp/silu-pred.gguf" -n 400 -c 128 \
    --epochs 2 --rank 32 -s 0.6 -t f16 >"$tmp/out" 2>"$tmp/err" || fail "train silu: $(cat "$tmp/err")"
grep -qF "SiLU model: active = |act(gate . x)| (CATS) above the layer's threshold (target sparsity 0.6)" "$tmp/out" ||
    fail "train silu: rule line: $(cat "$tmp/out")"
"$si" eval -m "$tmp/silu-pred.gguf" -f "$tmp/held.txt" -c 128 --modes dense >"$tmp/out" 2>"$tmp/err" ||
    fail "eval silu: $(cat "$tmp/err")"
grep -q 'target sparsity 0.6, stored in the model' "$tmp/out" || fail "eval silu: $(cat "$tmp/out")"
# The output rule: its own thresholds; eval adds the oracle and leaves gate mode out.
"$si" train-predictor -m "$tmp/silu.gguf" -f "$tmp/train.txt" -o "$tmp/silu-out.gguf" -n 400 -c 128 \
    --epochs 2 --rank 32 -s 0.4 --active output -t f16 >"$tmp/out" 2>"$tmp/err" || fail "train --active output: $(cat "$tmp/err")"
grep -qF "SiLU model: active = |act(gate . x) * up . x| above the layer's threshold (target sparsity 0.4)" "$tmp/out" ||
    fail "train --active output: rule line: $(cat "$tmp/out")"
"$si" info --no-workers --kv "$tmp/silu-out.gguf" | grep -q 'starinfer.predictor.active_rule *STRING *"output"' ||
    fail "no active_rule output in the file"
"$si" eval -m "$tmp/silu-out.gguf" -f "$tmp/held.txt" -c 128 --chunks 2 >"$tmp/out" 2>"$tmp/err" ||
    fail "eval output rule: $(cat "$tmp/err")"
grep -q '^oracle  *[0-9.]* +/- ' "$tmp/out" || fail "eval output rule: no oracle line: $(cat "$tmp/out")"
grep -q '^gate ' "$tmp/out" && fail "eval output rule ran gate mode"
# The oracle computes about 60% of the neurons (target sparsity 0.4).
awk '$1 == "oracle" {exit !($(NF-1) > 0.5 && $(NF-1) < 0.7)}' "$tmp/out" || fail "oracle share: $(grep ^oracle "$tmp/out")"
expect_error "--modes gate: the predictors were trained on the output rule" eval -m "$tmp/silu-out.gguf" -f "$tmp/held.txt" --modes gate
# --predict-sparsity: trained on the top 30%, the stored threshold skips 40%
# of the samples' neurons, and about that on other text.
"$si" train-predictor -m "$tmp/silu.gguf" -f "$tmp/train.txt" -o "$tmp/silu-ps.gguf" -n 400 -c 128 \
    --epochs 2 --rank 32 -s 0.7 --active output -t f16 --predict-sparsity 0.4 >"$tmp/out" 2>"$tmp/err" ||
    fail "train --predict-sparsity: $(cat "$tmp/err")"
thr=$(sed -n 's/^threshold \([-0-9.e]*\): the predictors skip \(0\.[0-9]*\) of the samples.*/\1 \2/p' "$tmp/out")
[ -n "$thr" ] || fail "train --predict-sparsity: no threshold line: $(cat "$tmp/out")"
set -- $thr
awk -v g="${2:-0}" 'BEGIN {exit !(g > 0.35 && g <= 0.4)}' || fail "--predict-sparsity 0.4 skips ${2:-nothing}"
"$si" info --no-workers --kv "$tmp/silu-ps.gguf" | grep 'powerinfer.sparse_threshold' |
    awk -v t="${1:-x}" '{exit !($NF + 0 == t + 0)}' || fail "stored threshold is not ${1:-x}"
"$si" eval -m "$tmp/silu-ps.gguf" -f "$tmp/held.txt" -c 128 --chunks 2 --modes predictor >"$tmp/out" 2>"$tmp/err" ||
    fail "eval --predict-sparsity: $(cat "$tmp/err")"
awk '$1 == "predictor" {exit !($(NF-1) > 0.4 && $(NF-1) < 0.8)}' "$tmp/out" ||
    fail "predictor share on held-out text: $(grep ^predictor "$tmp/out")"
# --loss cost: the pairs weighted by |v^P - t^P| (the model's FFN recomputes
# v); it says so, trains, and the file runs in predictor mode.
"$si" train-predictor -m "$tmp/silu.gguf" -f "$tmp/train.txt" -o "$tmp/silu-cost.gguf" -n 400 -c 128 \
    --epochs 2 --rank 32 -s 0.4 --active output -t f16 --loss cost --cost-power 2 \
    --predict-sparsity 0.4 >"$tmp/out" 2>"$tmp/err" || fail "train --loss cost: $(cat "$tmp/err")"
grep -qF "loss: cross-entropy, each pair weighted by |v^2 - t^2|" "$tmp/out" ||
    fail "train --loss cost: no loss line: $(cat "$tmp/out")"
"$si" eval -m "$tmp/silu-cost.gguf" -f "$tmp/held.txt" -c 128 --chunks 2 --modes predictor >"$tmp/out" 2>"$tmp/err" ||
    fail "eval --loss cost: $(cat "$tmp/err")"
awk '$1 == "predictor" {exit !($(NF-1) > 0.4 && $(NF-1) < 0.8)}' "$tmp/out" ||
    fail "cost predictor share on held-out text: $(grep ^predictor "$tmp/out")"

# Errors.
expect_error "train-predictor: no model given" train-predictor -f "$tmp/train.txt" -o x.gguf
expect_error "train-predictor: no corpus given" train-predictor -m "$tmp/relu.gguf" -o x.gguf
expect_error "train-predictor: no output given" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt"
expect_error "/nonexistent.gguf: No such file or directory" train-predictor -m /nonexistent.gguf -f "$tmp/train.txt" -o "$tmp/x.gguf"
expect_error "--target-recall: 1.5 is out of range (0, 1]" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o x.gguf --target-recall 1.5
expect_error "--target-recall: 'high' is not a number" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o x.gguf --target-recall high
expect_error "--target-sparsity: 1 is out of range [0, 1)" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o x.gguf --target-sparsity 1
expect_error "--predictor-type: unknown type 'q3_k'" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o x.gguf --predictor-type q3_k
expect_error "--rank-step 16 is not a multiple" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o x.gguf -t q4_0 --rank-step 16
expect_error "give --profile or --target-sparsity, not both" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o x.gguf --profile p -s 0.5
expect_error "train-predictor: unknown option '--bogus'" train-predictor --bogus
expect_error "give --threshold or --predict-sparsity, not both" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o x.gguf --threshold 0.5 --predict-sparsity 0.5
expect_error "--predict-sparsity: 0 is not in (0, 1)" train-predictor --predict-sparsity 0
expect_error "--loss: 'mse' is neither balanced nor cost" train-predictor --loss mse
expect_error "--cost-power: 5 is out of range (0, 4]" train-predictor --loss cost --cost-power 5
expect_error "--loss cost needs --rank R" train-predictor -m "$tmp/silu.gguf" -f "$tmp/train.txt" -o x.gguf --loss cost
expect_error "a ReLU-family model's rule (activation != 0) has none: use --loss balanced" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/x.gguf" --loss cost --rank 32
expect_error "--cost-power weights --loss cost only" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o x.gguf --cost-power 2
expect_error "--predict-sparsity: 1.5 is not in (0, 1)" train-predictor --predict-sparsity 1.5
printf 'Two words' >"$tmp/short.txt"
expect_error "short.txt: 9 tokens, too few to train predictors on (at least 64)" \
    train-predictor -m "$tmp/relu.gguf" -f "$tmp/short.txt" -o "$tmp/x.gguf"
expect_error "-n: 10 is out of range [64, " \
    train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/x.gguf" -n 10
expect_error "--active: 'all' is neither gate nor output" train-predictor --active all
expect_error "--profile holds gate thresholds" train-predictor -m "$tmp/silu.gguf" -f "$tmp/train.txt" -o x.gguf --profile p --active output
expect_error "not a samples file" train-predictor -m "$tmp/relu.gguf" -f "$tmp/train.txt" -o "$tmp/x.gguf" --samples "$tmp/pred.gguf"
expect_error "samples of a SiLU/GELU model without their thresholds" train-predictor -m "$tmp/silu.gguf" -f "$tmp/train.txt" -o "$tmp/x.gguf" --samples "$tmp/relu.samples" -n 100
expect_error "(not a profile?)" train-predictor -m "$tmp/silu.gguf" -f "$tmp/train.txt" -o "$tmp/x.gguf" --profile "$tmp/relu.gguf"
expect_error "eval: no model given" eval -f "$tmp/held.txt"
expect_error "eval: no held-out text given" eval -m "$tmp/pred.gguf"
expect_error "the model has no predictors" eval -m "$tmp/relu.gguf" -f "$tmp/held.txt"
"$si" synth -o "$tmp/silu-p.gguf" --arch llama-silu --preset tiny --type f32 --predictor 32 >/dev/null 2>&1 ||
    fail "synth silu with predictors"
expect_error "without stored activity thresholds: give --profile" eval -m "$tmp/silu-p.gguf" -f "$tmp/held.txt"
expect_error "--modes: unknown mode 'sparse'" eval -m "$tmp/pred.gguf" -f "$tmp/held.txt" --modes dense,sparse
expect_error "--modes: no mode given" eval -m "$tmp/pred.gguf" -f "$tmp/held.txt" --modes ""
expect_error "fewer than one chunk of 4096" eval -m "$tmp/pred.gguf" -f "$tmp/held.txt" -c 4096
expect_error "/nonexistent.txt: No such file or directory" eval -m "$tmp/pred.gguf" -f /nonexistent.txt
expect_error "eval: unknown option '--bogus'" eval --bogus

if [ "$failures" -gt 0 ]; then
    echo "$failures failure(s)"
    exit 1
fi
echo "all train-predictor/eval CLI checks passed"
