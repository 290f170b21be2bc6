#!/usr/bin/env bash
# test-cli.sh - the starinfer CLI: help, version, one clear error line with a
# non-zero exit for each kind of bad input, a synthetic model end to end (synth,
# info, generate, profile), and with STARINFER_TEST_MODEL `info` and `generate`
# on the real model, and Ctrl-C mid-answer in generate and chat.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# expect_error EXIT_CODE NEEDLE ARGS...: exit code, one stderr line naming the problem.
expect_error() {
    local want=$1 needle=$2
    shift 2
    "$si" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    [ "$rc" = "$want" ] || fail "starinfer $*: exit $rc, expected $want"
    [ "$(wc -l <"$tmp/err")" = 1 ] || fail "starinfer $*: $(wc -l <"$tmp/err") lines on stderr: $(cat "$tmp/err")"
    grep -qF -- "$needle" "$tmp/err" || fail "starinfer $*: stderr lacks '$needle': $(cat "$tmp/err")"
    echo "ok: starinfer $* -> $(cat "$tmp/err")"
}

"$si" --help >"$tmp/out" || fail "--help exits non-zero"
grep -q 'info' "$tmp/out" || fail "--help does not list 'info'"
"$si" info --help >"$tmp/out" || fail "info --help exits non-zero"
grep -q -- '--tensors' "$tmp/out" || fail "info --help does not list --tensors"
"$si" --version >"$tmp/out" || fail "--version exits non-zero"
grep -q '^starinfer [0-9].*, CPU kernels \(scalar\|avx2\|avx2+vnni\))$' "$tmp/out" ||
    fail "--version prints '$(cat "$tmp/out")'"
SI_NO_VNNI=1 "$si" --version | grep -q 'CPU kernels \(scalar\|avx2\))$' ||
    fail "SI_NO_VNNI=1 --version: $(SI_NO_VNNI=1 "$si" --version)"

"$si" >/dev/null 2>&1; [ $? = 2 ] || fail "no arguments should exit 2"
expect_error 1 "unknown command 'frobnicate'" frobnicate
expect_error 1 "no model given" info
expect_error 1 "unknown option '--bogus'" info --bogus
expect_error 1 "-m needs a file name" info -m
expect_error 1 "/nonexistent.gguf: No such file or directory" info /nonexistent.gguf
expect_error 1 "not a regular file" info "$tmp"
printf 'hello world, not a model' >"$tmp/text.gguf"
expect_error 1 "not a GGUF file (magic 'hell')" info "$tmp/text.gguf"
: >"$tmp/empty.gguf"
expect_error 1 "empty file" info "$tmp/empty.gguf"
printf 'GGUF\001\000\000\000' >"$tmp/v1.gguf"
expect_error 1 "GGUF version 1 is not supported" info "$tmp/v1.gguf"

# The other commands' argument errors.
expect_error 1 "generate: no prompt given" generate -m x.gguf
expect_error 1 "generate: no model given" generate -p hi
expect_error 1 "generate: give either -p or -f, not both" generate -m x.gguf -p a -f b
expect_error 1 "--temp: 'hot' is not a number" generate -m x.gguf -p a --temp hot
expect_error 1 "-n: -3 is out of range" generate -m x.gguf -p a -n -3
expect_error 1 "--top-p: 1.5 is out of range" generate -m x.gguf -p a --top-p 1.5
expect_error 1 "generate: unknown option '--frobnicate'" generate --frobnicate
expect_error 1 "/nonexistent.gguf: No such file or directory" generate -m /nonexistent.gguf -p a
expect_error 1 "not a GGUF file" generate -m "$tmp/text.gguf" -p a
expect_error 1 "perplexity: no text given" perplexity -m x.gguf
expect_error 1 "--ctx-size must be at least 16" perplexity -m x.gguf -f y -c 8
expect_error 1 "/nonexistent.txt: No such file or directory" perplexity -m x.gguf -f /nonexistent.txt
expect_error 1 "perplexity: --batch-size is the engine's: it needs --engine starpu" \
    perplexity -m x.gguf -f y --engine ref -b 8
expect_error 1 "--engine: 'gpu' is neither starpu nor ref" perplexity -m x.gguf -f y --engine gpu
"$si" generate --help | grep -q -- '--top-k' || fail "generate --help lacks --top-k"
"$si" generate --help | grep -q -- '--engine E' || fail "generate --help lacks --engine"
"$si" perplexity --help | grep -q -- '--chunks' || fail "perplexity --help lacks --chunks"
"$si" synth --help | grep -q -- '--sparsity' || fail "synth --help lacks --sparsity"

# A synthetic model end to end: write, summarise, generate.
"$si" synth -o "$tmp/tiny.gguf" --arch llama-relu --preset tiny --type q4_0 --seed 5 >"$tmp/out" 2>&1 ||
    fail "synth: $(cat "$tmp/out")"
grep -q 'measured: sparsity 0.8[89]\|measured: sparsity 0.9[01]' "$tmp/out" || fail "synth: measured sparsity: $(cat "$tmp/out")"
"$si" info --no-workers "$tmp/tiny.gguf" | grep -q '^architecture *: "llama"' || fail "info on a synth model"
"$si" generate -m "$tmp/tiny.gguf" -p "hello" -n 8 --temp 0 --ids --engine ref >"$tmp/out" 2>"$tmp/err" ||
    fail "generate on a synth model: $(cat "$tmp/err")"
grep -q '^ids:\( [0-9]*\)\{8\}$' "$tmp/out" || fail "generate --ids printed: $(cat "$tmp/out")"
"$si" generate -m "$tmp/tiny.gguf" -p "hello" -n 8 --temp 0 --ids --engine starpu --sparsity gate \
    >"$tmp/out2" 2>"$tmp/err" || fail "generate --engine starpu: $(cat "$tmp/err")"
cmp -s "$tmp/out" "$tmp/out2" || fail "the engine's tokens differ from the reference's: $(cat "$tmp/out2")"
grep -q 'gate mode' "$tmp/err" || fail "no engine statistics line: $(cat "$tmp/err")"
# StarPU's own notices (here dmda calibrating in a fresh STARPU_HOME) stay off
# unless STARPU_SILENT=0 asks for them.
for silent in unset 0; do
    rm -rf "$tmp/starpu-home"
    if [ $silent = unset ]; then
        env -u STARPU_SILENT STARPU_HOME="$tmp/starpu-home" STARPU_SCHED=dmda "$si" generate \
            -m "$tmp/tiny.gguf" -p a -n 2 --engine starpu >/dev/null 2>"$tmp/err"
    else
        STARPU_SILENT=0 STARPU_HOME=$tmp/starpu-home STARPU_SCHED=dmda "$si" generate \
            -m "$tmp/tiny.gguf" -p a -n 2 --engine starpu >/dev/null 2>"$tmp/err"
    fi
    n=$(grep -c '^\[starpu\]' "$tmp/err")
    { [ $silent = unset ] && [ "$n" = 0 ]; } || { [ $silent = 0 ] && [ "$n" -gt 0 ]; } ||
        fail "STARPU_SILENT $silent: $n StarPU notices: $(head -3 "$tmp/err")"
done
expect_error 1 "--engine: 'gpu' is neither starpu nor ref" generate -m x.gguf -p a --engine gpu
expect_error 1 "generate: --sparsity needs --engine starpu" \
    generate -m x.gguf -p a --engine ref --sparsity gate
expect_error 1 "generate: --vram-budget needs --engine starpu" \
    generate -m x.gguf -p a --engine ref --vram-budget 1G
expect_error 1 "generate: --merge redux needs --engine starpu" \
    generate -m x.gguf -p a --engine ref --merge redux
expect_error 1 "-n: 99999999999999999999 is out of range" \
    generate -m x.gguf -p a -n 99999999999999999999
expect_error 1 "--temp: 1e999 is out of range" generate -m x.gguf -p a --temp 1e999
expect_error 1 "unknown option '--bogus' (see starinfer --help)" --bogus
expect_error 1 "synth: no output file" synth
expect_error 1 "--sparsity: 'half' is not dense, gate or predictor" generate -m x.gguf -p a --sparsity half
expect_error 1 "--vram-budget: '12Q' has an unknown unit" generate -m x.gguf -p a --vram-budget 12Q
expect_error 1 "--vram-budget: 'lots' is not a size" generate -m x.gguf -p a --vram-budget lots
expect_error 1 "--merge: 'sum' is neither task nor redux" generate -m x.gguf -p a --merge sum
expect_error 1 "--gpu-attention: 'many' is not a whole number" generate -m x.gguf -p a --gpu-attention many
expect_error 1 "--gpu-attention: 0 is out of range" generate -m x.gguf -p a --gpu-attention 0
expect_error 1 "generate: --gpu-attention needs --engine starpu" \
    generate -m x.gguf -p a --engine ref --gpu-attention 2
expect_error 1 "synth: unknown option '--bogus'" synth --bogus
# --prefill: the batches' arithmetic.  A bad value and the reference
# refused; int8 refused where the batched integer kernel cannot run
# (SI_NO_VNNI=1 stands in for a CPU without AVX-512 VNNI); each mode that
# runs names itself on the engine's prefill line (a prompt of 8 tokens or
# more goes in a batch), auto as int8 or blas.
expect_error 1 "--prefill: 'fast' is not auto, exact, int8 or blas" generate -m x.gguf -p a --prefill fast
expect_error 1 "generate: --prefill needs --engine starpu" \
    generate -m x.gguf -p a --engine ref --prefill blas
expect_error 1 "perplexity: --prefill is the engine's: it needs --engine starpu" \
    perplexity -m x.gguf -f y --engine ref --prefill exact
long="one two three four five six seven eight nine ten eleven twelve"
export SI_NO_VNNI=1
expect_error 1 "prefill int8 needs the batched integer kernel (AVX-512 VNNI), and SI_NO_VNNI is set" \
    generate -m "$tmp/tiny.gguf" -p "$long" -n 2 --prefill int8
"$si" generate -m "$tmp/tiny.gguf" -p "$long" -n 2 >/dev/null 2>"$tmp/err" || fail "SI_NO_VNNI: $(cat "$tmp/err")"
grep -q '^engine: prefill (blas arithmetic)' "$tmp/err" || fail "SI_NO_VNNI=1: auto is not blas: $(cat "$tmp/err")"
unset SI_NO_VNNI
# the kernels this CPU runs (--version names them): int8 with VNNI's
vnni=$("$si" --version | grep -q 'CPU kernels avx2+vnni' && echo int8)
for mode in exact blas auto $vnni; do
    "$si" generate -m "$tmp/tiny.gguf" -p "$long" -n 2 --prefill $mode >/dev/null 2>"$tmp/err" ||
        fail "--prefill $mode: $(cat "$tmp/err")"
    want=$mode
    [ $mode = auto ] && want=${vnni:-blas}
    grep -q "^engine: prefill ($want arithmetic)" "$tmp/err" ||
        fail "--prefill $mode: no prefill line of $want: $(cat "$tmp/err")"
done
head -c 3000 "$tmp/tiny.gguf" >"$tmp/cut.gguf"
expect_error 1 "truncated file" generate -m "$tmp/cut.gguf" -p a

# profile: count neuron activations over a text on the synthetic model.
for i in $(seq 1 40); do printf 'The quick brown fox %d jumps over the lazy dog. ' "$i"; done >"$tmp/text.txt"
"$si" profile -m "$tmp/tiny.gguf" -f "$tmp/text.txt" -o "$tmp/prof.gguf" -c 64 -n 300 >"$tmp/out" 2>"$tmp/err" ||
    fail "profile: $(cat "$tmp/err")"
cat "$tmp/out"
grep -q '^profile: 300 tokens in 5 windows of 64 .* 2 layers x 256 neurons' "$tmp/out" || fail "profile summary: $(cat "$tmp/out")"
grep -q '^layer   1: mean activation rate 0\.[01]' "$tmp/out" || fail "profile: layer 1 rate: $(cat "$tmp/out")"
grep -q 'of the neurons carry 80% of the activations' "$tmp/out" || fail "profile: no skew line: $(cat "$tmp/out")"
# No progress line when stderr is not a terminal; STARINFER_PROGRESS=1 forces it.
[ -s "$tmp/err" ] && fail "profile drew progress into a file: $(cat "$tmp/err")"
STARINFER_PROGRESS=1 "$si" profile -m "$tmp/tiny.gguf" -f "$tmp/text.txt" -o "$tmp/prof1.gguf" -c 64 \
    -n 300 >/dev/null 2>"$tmp/err" || fail "profile with progress: $(cat "$tmp/err")"
tr '\r' '\n' <"$tmp/err" | grep -q '^profile counting *\[#*\] 300/300 tokens' ||
    fail "STARINFER_PROGRESS=1: no finished progress line: $(cat -v "$tmp/err")"
"$si" info --no-workers --kv "$tmp/prof.gguf" >"$tmp/out" 2>&1 || fail "info on a profile: $(cat "$tmp/out")"
grep -q 'starinfer.profile.n_tokens *UINT64 *300$' "$tmp/out" || fail "profile file lacks n_tokens = 300: $(cat "$tmp/out")"
expect_error 1 "prof.gguf: a starinfer activation profile (starinfer profile), not a model" \
    generate -m "$tmp/prof.gguf" -p a
"$si" profile --help | grep -q -- '--n-tokens' || fail "profile --help lacks --n-tokens"
"$si" profile --help | grep -q -- '--target-sparsity' || fail "profile --help lacks --target-sparsity"
# A ReLU model: thresholds 0, --target-sparsity does not apply; the picture as SVG
# (one polyline per layer and one for the whole model).
"$si" profile -m "$tmp/tiny.gguf" --corpus "$tmp/text.txt" -o "$tmp/prof0.gguf" -c 64 -n 100 \
    --target-sparsity 0.7 --plot "$tmp/x.svg" >"$tmp/out" 2>"$tmp/err" || fail "profile --plot: $(cat "$tmp/err")"
grep -q '^ReLU model: active = activation != 0 (thresholds 0; --target-sparsity does not apply)' "$tmp/out" ||
    fail "profile on a ReLU model: $(cat "$tmp/out")"
[ -s "$tmp/x.svg" ] || fail "profile --plot x.svg wrote no SVG"
[ "$(grep -o '<polyline' "$tmp/x.svg" | wc -l)" = 3 ] || fail "x.svg: $(grep -o '<polyline' "$tmp/x.svg" | wc -l) polylines, expected 3 (2 layers + model)"
"$si" info --no-workers --kv "$tmp/prof0.gguf" >"$tmp/out" 2>&1 || fail "info on a profile: $(cat "$tmp/out")"
grep -q 'starinfer.profile.gate_threshold' "$tmp/out" || fail "profile lacks gate_threshold: $(cat "$tmp/out")"
# A SiLU model: CATS thresholds for the target sparsity, met per layer on the corpus.
"$si" synth -o "$tmp/silu.gguf" --arch llama-silu --preset tiny --type f32 --seed 3 >"$tmp/out" 2>&1 ||
    fail "synth llama-silu: $(cat "$tmp/out")"
"$si" profile -m "$tmp/silu.gguf" -f "$tmp/text.txt" -o "$tmp/prof-silu.gguf" -c 64 -n 200 \
    --target-sparsity 0.7 --plot "$tmp/silu.svg" >"$tmp/out" 2>"$tmp/err" || fail "profile on llama-silu: $(cat "$tmp/err")"
cat "$tmp/out"
grep -q '^SiLU model: active = |act(gate . x)| above' "$tmp/out" || fail "profile on llama-silu: $(cat "$tmp/out")"
grep -q '^layer   1: mean activation rate 0\.\(29\|30\|31\)[0-9]* (threshold [0-9.e-]*)$' "$tmp/out" ||
    fail "profile on llama-silu: layer 1 not near 0.3: $(cat "$tmp/out")"
grep -q '^thresholds: .* (target sparsity 0.7)$' "$tmp/out" || fail "profile: no thresholds line: $(cat "$tmp/out")"
[ "$(grep -o '<polyline' "$tmp/silu.svg" | wc -l)" = 3 ] || fail "silu.svg: wrong polyline count"
# Input sparsity (TEAL): thresholds calibrated on the reference and kept in
# the profile; perplexity with them on the reference: S = 0 gives the dense
# value exactly, S = 0.5 another; the engine and bad values refused in one line.
"$si" profile -m "$tmp/silu.gguf" -f "$tmp/text.txt" -o "$tmp/prof-in.gguf" -c 64 -n 200 \
    --input-sparsity >"$tmp/out" 2>"$tmp/err" || fail "profile --input-sparsity: $(cat "$tmp/err")"
cat "$tmp/out"
grep -q '^input sparsity: 200 tokens on the reference' "$tmp/out" || fail "profile --input-sparsity: $(cat "$tmp/out")"
grep -q '^  gate/up  .*(0\.2[45][0-9]*-0\.2[56][0-9]* below)' "$tmp/out" ||
    fail "profile --input-sparsity: S = 0.25 not met on gate/up: $(cat "$tmp/out")"
"$si" info --no-workers --kv "$tmp/prof-in.gguf" >"$tmp/out" 2>&1 || fail "info on prof-in: $(cat "$tmp/out")"
grep -q 'starinfer.profile.input_thresholds *ARRAY' "$tmp/out" || fail "profile lacks input_thresholds: $(cat "$tmp/out")"
ppl() { "$si" perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --chunks 2 --engine ref "$@" 2>/dev/null |
    sed -n 's/^Final estimate: PPL = \([0-9.]*\) .*/\1/p'; }
dense=$(ppl)
s0=$(ppl --sparsity input=0 --profile "$tmp/prof-in.gguf")
s5=$(ppl --sparsity input=0.5 --profile "$tmp/prof-in.gguf")
echo "perplexity on the tiny SiLU model: dense $dense, input sparsity 0: $s0, 0.5: $s5"
[ -n "$dense" ] && [ "$dense" = "$s0" ] || fail "input sparsity 0 gave $s0, dense $dense"
[ -n "$s5" ] && [ "$s5" != "$dense" ] || fail "input sparsity 0.5 gave the dense value $s5"
# The engine: token by token (its batches are dense), within 1% of the
# reference's value (which scores a chunk as llama.cpp's batches do); on the
# copy with transposed matrices (F32 here: exact copies) both read them.
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 0.01 * b) }'; }
e5=$("$si" perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --chunks 2 --sparsity input=0.5 \
    --profile "$tmp/prof-in.gguf" 2>/dev/null | sed -n 's/^Final estimate: PPL = \([0-9.]*\) .*/\1/p')
near "$e5" "$s5" || fail "input sparsity 0.5 on the engine gave $e5, the reference $s5"
"$si" convert -m "$tmp/silu.gguf" --transpose -o "$tmp/silu-t.gguf" >"$tmp/out" 2>&1 ||
    fail "convert --transpose: $(cat "$tmp/out")"
grep -q "wrote $tmp/silu-t.gguf: the model and its transposed copies" "$tmp/out" || fail "convert --transpose: $(cat "$tmp/out")"
t5=$(ppl -m "$tmp/silu-t.gguf" --sparsity input=0.5 --profile "$tmp/prof-in.gguf")
e5=$("$si" perplexity -m "$tmp/silu-t.gguf" -f "$tmp/text.txt" -c 64 --chunks 2 --sparsity input=0.5 \
    --profile "$tmp/prof-in.gguf" 2>/dev/null | sed -n 's/^Final estimate: PPL = \([0-9.]*\) .*/\1/p')
t0=$(ppl -m "$tmp/silu-t.gguf")
echo "with the transposed copies: dense $t0, input sparsity 0.5: reference $t5, engine $e5"
[ "$t0" = "$dense" ] || fail "the copy's dense perplexity $t0, the model's $dense"
near "$e5" "$t5" || fail "transposed, 0.5: engine $e5, reference $t5"
expect_error 1 "evaluates token by token on the engine" \
    perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 -b 8 --sparsity input=0.5 --profile "$tmp/prof-in.gguf"
"$si" generate -m "$tmp/silu-t.gguf" -p "hello world" -n 8 --temp 0 --sparsity input=0.4 \
    --profile "$tmp/prof-in.gguf" >"$tmp/out" 2>"$tmp/err" || fail "generate --sparsity input: $(cat "$tmp/err")"
grep -q "input sparsity 0.40 on every product" "$tmp/err" || fail "generate --sparsity input: $(cat "$tmp/err")"
"$si" generate -m "$tmp/silu-t.gguf" -p "hello world" -n 8 --temp 0 --sparsity gate+input=0.4 \
    --profile "$tmp/prof-in.gguf" >"$tmp/out" 2>"$tmp/err" || fail "generate gate+input: $(cat "$tmp/err")"
grep -q "input sparsity 0.40 on the attention's products" "$tmp/err" || fail "generate gate+input: $(cat "$tmp/err")"
expect_error 1 "--sparsity input needs --profile FILE" generate -m "$tmp/silu-t.gguf" -p hi -n 2 --sparsity input
expect_error 1 "is not dense, gate or predictor" generate -m "$tmp/silu-t.gguf" -p hi -n 2 --sparsity fast+input
expect_error 1 "--sparsity input=S" generate -m "$tmp/silu-t.gguf" -p hi -n 2 --sparsity input=0.95 \
    --profile "$tmp/prof-in.gguf"
expect_error 1 "convert: --transpose needs -o FILE" convert -m "$tmp/silu.gguf" --transpose
expect_error 1 "--sparsity input needs --profile FILE" \
    perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --engine ref --sparsity input
expect_error 1 "the profile has no input thresholds" \
    perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --engine ref --sparsity input=0.3 --profile "$tmp/prof-silu.gguf"
expect_error 1 "--sparsity" \
    perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --engine ref --sparsity input=0.95 --profile "$tmp/prof-in.gguf"
expect_error 1 "is not dense, gate, predictor or input[=S]" perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" --sparsity fast
expect_error 1 "--sparsity gate is the engine's" \
    perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" --sparsity gate --engine ref
expect_error 1 "--sparsity predictor evaluates token by token" \
    perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" --sparsity predictor -b 8
if command -v rsvg-convert >/dev/null; then
    "$si" profile -m "$tmp/silu.gguf" -f "$tmp/text.txt" -o "$tmp/prof-silu.gguf" -c 64 -n 64 \
        --plot "$tmp/silu.png" >"$tmp/out" 2>"$tmp/err" || fail "profile --plot png: $(cat "$tmp/err")"
    [ "$(head -c 4 "$tmp/silu.png" | tail -c 3)" = PNG ] || fail "profile --plot silu.png is no PNG"
    [ ! -e "$tmp/silu.png.tmp.svg" ] || fail "profile --plot png left its SVG behind"
fi
expect_error 1 "--target-sparsity: 1.5 is out of range [0, 1)" profile -m "$tmp/tiny.gguf" -f "$tmp/text.txt" -o "$tmp/p.gguf" --target-sparsity 1.5
expect_error 1 "--target-sparsity: 1 is out of range [0, 1)" profile -m "$tmp/tiny.gguf" -f "$tmp/text.txt" -o "$tmp/p.gguf" --target-sparsity 1
expect_error 1 "--target-sparsity: 'lots' is not a number" profile -m "$tmp/tiny.gguf" -f "$tmp/text.txt" -o "$tmp/p.gguf" --target-sparsity lots
expect_error 1 "--plot: 'x.pdf' names neither an .svg nor a .png file" profile -m "$tmp/tiny.gguf" -f "$tmp/text.txt" -o "$tmp/p.gguf" --plot x.pdf
PATH=/nonexistent "$si" profile -m "$tmp/tiny.gguf" -f "$tmp/text.txt" -o "$tmp/p.gguf" --plot x.png >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -qF -- "--plot: rsvg-convert (librsvg) is not on PATH" "$tmp/err" ||
    fail "profile --plot x.png without rsvg-convert: $(cat "$tmp/err")"
expect_error 1 "profile: unknown option '--bogus'" profile -m "$tmp/tiny.gguf" --bogus
expect_error 1 "profile: no output given" profile -m "$tmp/tiny.gguf" -f "$tmp/text.txt"
expect_error 1 "-c: 0 is out of range" profile -m x.gguf -f y -o z -c 0
expect_error 1 "/nonexistent.txt: No such file or directory" profile -m "$tmp/tiny.gguf" -f /nonexistent.txt -o "$tmp/p.gguf"

# The engine with the profile: hottest neurons first; a VRAM budget below
# what the engine keeps on the GPU besides FFN neurons is refused (before any
# device is looked for), and so is a VRAM budget without a CUDA worker;
# predictor mode needs predictor tensors, and a profile of another shape is
# refused.
"$si" generate -m "$tmp/tiny.gguf" -p "one two" -n 4 --temp 0 --engine starpu --sparsity gate \
    --profile "$tmp/prof.gguf" >"$tmp/out" 2>"$tmp/err" ||
    fail "generate with a profile: $(cat "$tmp/err")"
grep -q 'gate mode' "$tmp/err" || fail "generate with a profile: no engine summary: $(cat "$tmp/err")"
expect_error 1 "VRAM budget of 100 bytes (0.00 MiB) is below the" \
    generate -m "$tmp/tiny.gguf" -p a -n 1 --engine starpu --sparsity gate --vram-budget 100
expect_error 1 "VRAM budget of 100 bytes (0.00 MiB) is below the" \
    chat -m "$tmp/tiny.gguf" --engine starpu --vram-budget 100
STARPU_NCUDA=0 "$si" generate -m "$tmp/tiny.gguf" -p a -n 1 --engine starpu --sparsity gate \
    --profile "$tmp/prof.gguf" --vram-budget 64M >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] &&
    grep -qF "a VRAM budget needs a GPU, and StarPU has no CUDA worker" "$tmp/err" ||
    fail "generate --vram-budget without a CUDA worker: $(cat "$tmp/err")"
expect_error 1 "gpu_attention: the GPU's layers need a VRAM budget" \
    generate -m "$tmp/tiny.gguf" -p a -n 1 --sparsity gate --gpu-attention 2
"$si" generate --help | grep -q -- '--gpu-attention N' || fail "generate --help lacks --gpu-attention"
STARPU_NCUDA=0 "$si" bench -m "$tmp/tiny.gguf" -p a -n 1 -r 1 --vram-budget 64M >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] && grep -qF "bench: --vram-budget needs a GPU" "$tmp/err" ||
    fail "bench --vram-budget without a CUDA worker: $(cat "$tmp/err")"
expect_error 1 "predictor mode: the model has no predictor tensors" \
    generate -m "$tmp/tiny.gguf" -p a -n 1 --engine starpu --sparsity predictor
"$si" synth -o "$tmp/other.gguf" --preset tiny --n-ff 512 --measure 0 >/dev/null 2>&1 || fail "synth other"
expect_error 1 "profile of 2 layers x 256 neurons, but the model has 2 x 512" \
    generate -m "$tmp/other.gguf" -p a -n 1 --engine starpu --sparsity gate --profile "$tmp/prof.gguf"
expect_error 1 "nonexistent.gguf" \
    generate -m "$tmp/tiny.gguf" -p a -n 1 --engine starpu --profile /nonexistent.gguf

model=${STARINFER_TEST_MODEL:-}
if [ -n "$model" ] && [ -r "$model" ]; then
    head -c 100000 "$model" >"$tmp/truncated.gguf"
    expect_error 1 "truncated file" info "$tmp/truncated.gguf"
    STARPU_NCPU=1 "$si" info "$model" >"$tmp/out" 2>"$tmp/err" || fail "info on the real model: $(cat "$tmp/err")"
    cat "$tmp/out"
    grep -q '^architecture *: "llama"' "$tmp/out" || fail "info: architecture"
    grep -q 'block_count *= 30' "$tmp/out" || fail "info: block_count"
    grep -q '^tokenizer *: gpt2, 49152 tokens' "$tmp/out" || fail "info: tokenizer"
    grep -q '^tensor types :.*Q4_1' "$tmp/out" || fail "info: tensor types"
    grep -q '^workers *: 1 CPU' "$tmp/out" || fail "info: STARPU_NCPU=1 not honoured"
    "$si" generate -m "$model" -p "The capital of France is" -n 4 --temp 0 >"$tmp/out" 2>"$tmp/err" ||
        fail "generate on the real model: $(cat "$tmp/err")"
    grep -q '^The capital of France is Paris' "$tmp/out" || fail "generate printed: $(cat "$tmp/out")"
    grep -q 'tokens/s' "$tmp/err" || fail "generate printed no timing line"
    "$si" generate -m "$model" -p "What is the capital of France?" --chat -n 8 --temp 0 >"$tmp/out" 2>&1 ||
        fail "generate --chat"
    grep -q '<|im_start|>assistant' "$tmp/out" || fail "--chat did not apply the template: $(cat "$tmp/out")"
    "$si" info --no-workers --tensors --kv -m "$model" >"$tmp/out" 2>&1 || fail "info --tensors --kv"
    grep -q 'blk.29.ffn_down.weight' "$tmp/out" || fail "info --tensors lacks blk.29.ffn_down.weight"
    grep -q 'tokenizer.ggml.tokens .*ARRAY' "$tmp/out" || fail "info --kv lacks the vocabulary"
    grep -q '^workers' "$tmp/out" && fail "--no-workers still starts StarPU"

    # Ctrl-C (SIGINT) once the answer streams: the text so far stays
    # printed, one line on stderr, exit 130.  The reference on one thread
    # is slow enough that the signal lands mid-answer.
    interrupt() { # interrupt NAME INPUT COMMAND...: run, SIGINT after the first answer bytes
        local name=$1 input=$2 pid rc i before=$failures
        shift 2
        # The last run's answer must not count as this one's: SIGINT before
        # the child has even opened its files kills the forked shell, whose
        # EXIT trap (this script's, inherited) removed $tmp under load.
        rm -f "$tmp/int.out" "$tmp/int.err"
        "$@" <"$input" >"$tmp/int.out" 2>"$tmp/int.err" &
        pid=$!
        for ((i = 0; i < 600; i++)); do
            [ "$(wc -c <"$tmp/int.out" 2>/dev/null || echo 0)" -gt 60 ] && break
            sleep 0.1
        done
        kill -INT "$pid"
        for ((i = 0; i < 300; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid"
            fail "$name: still running 30 s after SIGINT"
        fi
        wait "$pid"
        rc=$?
        [ "$rc" = 130 ] || fail "$name interrupted: exit $rc, expected 130: $(cat "$tmp/int.err")"
        # the error, after the KV cache's line at the start
        [ "$(grep -vc '^KV cache: ' "$tmp/int.err")" = 1 ] && grep -q "interrupted" "$tmp/int.err" ||
            fail "$name interrupted: stderr: $(cat "$tmp/int.err")"
        [ "$(wc -c <"$tmp/int.out")" -gt 60 ] || fail "$name interrupted: the answer so far is gone"
        [ "$failures" = "$before" ] && echo "ok: $name, SIGINT mid-answer -> exit $rc, $(cat "$tmp/int.err")"
    }
    interrupt generate /dev/null "$si" generate -m "$model" -p "Once upon a time" -n 4000 \
        --ignore-eos --engine ref
    printf 'Tell me a long story about a cat.\n' >"$tmp/turn.txt"
    interrupt chat "$tmp/turn.txt" "$si" chat -m "$model" -n 4000 --ignore-eos --engine ref
else
    echo "note: STARINFER_TEST_MODEL not set; real-model checks not run"
fi

[ "$failures" = 0 ] || { echo "$failures failures"; exit 1; }
echo "all CLI checks passed"
