#!/usr/bin/env bash
# test-place-cli.sh - `starinfer place`: help, one clear error line with a
# non-zero exit for each bad input, a placement of a synthetic model written
# and shown (all three policies, budget 0, a budget above the model), the
# gpuidx file's tensors, and `generate --placement` on it (no GPU here: the
# hot slices are ignored, said once on stderr).
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

"$si" place --help >"$tmp/out" || fail "place --help exits non-zero"
grep -q -- '--vram-budget' "$tmp/out" || fail "place --help lacks --vram-budget"
"$si" --help | grep -q '^  place' || fail "--help does not list place"

"$si" synth -o "$tmp/m.gguf" --preset tiny --n-ff 512 --measure 0 >/dev/null 2>&1 || fail "synth"
head -c 4000 /usr/share/common-licenses/GPL-3 >"$tmp/text.txt" 2>/dev/null ||
    yes 'the quick brown fox jumps over the lazy dog' | head -c 4000 >"$tmp/text.txt"
"$si" profile -m "$tmp/m.gguf" -f "$tmp/text.txt" -o "$tmp/p.gguf" -c 128 -n 300 >/dev/null 2>&1 ||
    fail "profile"
"$si" synth -o "$tmp/other.gguf" --preset tiny --measure 0 >/dev/null 2>&1 || fail "synth other"

# Arguments.  Fixed hardware values keep the runs short and reproducible.
hw=(--cpu-bw 20 --gpu-bw 1000 --h2d-bw 25 --h2d-lat 10 --t-sync 0.5)
base=(place -m "$tmp/m.gguf" --profile "$tmp/p.gguf")
expect_error "place: no model given" place --profile "$tmp/p.gguf" --vram-budget 1M -o x
expect_error "place: no profile given" place -m "$tmp/m.gguf" --vram-budget 1M -o x
expect_error "place: no VRAM budget given" "${base[@]}" -o x
expect_error "place: no output given" "${base[@]}" --vram-budget 1M
expect_error "--vram-budget: '-1G' is not a size" "${base[@]}" --vram-budget -1G -o x
expect_error "--vram-budget: 'lots' is not a size" "${base[@]}" --vram-budget lots -o x
expect_error "--vram-budget: '3Q' has an unknown unit" "${base[@]}" --vram-budget 3Q -o x
expect_error "--policy: 'best' is not ilp, hottest or random" "${base[@]}" --vram-budget 1M -o x --policy best
expect_error "--sparsity: 'dense' is not gate or predictor" "${base[@]}" --vram-budget 1M -o x --sparsity dense
expect_error "--time-limit: 'soon' is not a number" "${base[@]}" --vram-budget 1M -o x --time-limit soon
expect_error "--cpu-bw: 0 is out of range" "${base[@]}" --vram-budget 1M -o x --cpu-bw 0
expect_error "place: unknown option '--bogus'" place --bogus
expect_error "--gpu-attention: 0 is out of range" "${base[@]}" --vram-budget 1M -o x --gpu-attention 0
expect_error "is below the" "${base[@]}" --vram-budget 100 -o "$tmp/x.gguf" "${hw[@]}"
[ -e "$tmp/x.gguf" ] && fail "a refused placement wrote its file"
expect_error "profile of 2 layers x 512 neurons, but the model has 2 x 256" \
    place -m "$tmp/other.gguf" --profile "$tmp/p.gguf" --vram-budget 1M -o x "${hw[@]}"
expect_error "/nonexistent.gguf: No such file or directory" \
    place -m "$tmp/m.gguf" --profile /nonexistent.gguf --vram-budget 1M -o x
expect_error "not a GPU index file" place --show "$tmp/p.gguf"
printf 'GGUF\003\000\000\000' >"$tmp/trunc.gguf"
expect_error "trunc.gguf" place --show "$tmp/trunc.gguf"

# A placement: the ILP's summary and file.
"$si" "${base[@]}" --vram-budget 33068K -o "$tmp/pl.gguf" "${hw[@]}" >"$tmp/out" 2>"$tmp/err" ||
    fail "place: $(cat "$tmp/err")"
cat "$tmp/out"
grep -q 'kv cache .*kept on the CPU' "$tmp/out" || fail "place: the reserve does not itemize the KV cache"
# --gpu-attention N: the reserve holds the attention of N layers and their
# KV caches, and the ILP gets what they leave.
"$si" "${base[@]}" --vram-budget 64M --gpu-attention 1 -c 64 -o "$tmp/pla.gguf" "${hw[@]}" \
    >"$tmp/outa" 2>"$tmp/err" || fail "place --gpu-attention: $(cat "$tmp/err")"
grep -Eq '^  attention +[1-9][0-9]* bytes' "$tmp/outa" && grep -Eq '^  kv cache +[1-9][0-9]* bytes' "$tmp/outa" ||
    fail "place --gpu-attention 1: the reserve lacks the layer's attention: $(cat "$tmp/outa")"
grep -q 'placement (ilp): optimal' "$tmp/out" || fail "place: not solved to optimality"
grep -q 'gap' "$tmp/out" || fail "place: no gap reported"
"$si" place --show "$tmp/pl.gguf" -m "$tmp/m.gguf" >"$tmp/show" 2>&1 || fail "--show: $(cat "$tmp/show")"
cat "$tmp/show"
grep -q 'vram capacity: 33861632 bytes' "$tmp/show" || fail "--show: vram capacity"
grep -q 'policy: ilp (optimal), sparsity gate' "$tmp/show" || fail "--show: policy"
grep -q 'hw t_sync        0.500 us   (given)' "$tmp/show" || fail "--show: the given T_sync"
grep -Eq 'hw cpu_bw +[0-9]+\.[0-9]{3} GB/s \(' "$tmp/show" || fail "--show: cpu_bw in GB/s"
n=$(sed -n 's/^gpu neurons: \([0-9]*\) .*/\1/p' "$tmp/show")
[ -n "$n" ] && [ "$n" -gt 0 ] && [ "$n" -lt 1024 ] || fail "--show: $n GPU neurons (some, not all, expected)"
expect_error "placement of 2 layers x 512 neurons, but the model has 2 x 256" \
    place --show "$tmp/pl.gguf" -m "$tmp/other.gguf"
"$si" info --tensors "$tmp/pl.gguf" >"$tmp/info" 2>&1 || fail "info on the placement: $(cat "$tmp/info")"
grep -q 'blk.1.gpu_idx' "$tmp/info" && grep -q 'blk.1.gpu_bucket' "$tmp/info" ||
    fail "the placement lacks gpu_idx / gpu_bucket tensors: $(cat "$tmp/info")"

# info MODEL --placement FILE: the summary, the same count as --show; errors
# before anything is printed.
"$si" info "$tmp/m.gguf" --placement "$tmp/pl.gguf" --no-workers >"$tmp/info" 2>&1 ||
    fail "info --placement: $(cat "$tmp/info")"
grep -q "^placement    : $tmp/pl.gguf: $n of 1024 FFN neurons on the GPU" "$tmp/info" ||
    fail "info --placement: no summary with $n GPU neurons: $(cat "$tmp/info")"
grep -q 'ilp placement (optimal), gate mode' "$tmp/info" || fail "info --placement: policy"
expect_error "placement of 2 layers x 512 neurons, but the model has 2 x 256" \
    info "$tmp/other.gguf" --placement "$tmp/pl.gguf" --no-workers
[ -s "$tmp/out" ] && fail "info --placement printed before refusing the placement"
expect_error "not a GPU index file" info "$tmp/m.gguf" --placement "$tmp/p.gguf" --no-workers

# Budget 0: every neuron on the CPU; above the model: every neuron on the GPU.
"$si" "${base[@]}" --vram-budget 0 -o "$tmp/zero.gguf" "${hw[@]}" >/dev/null 2>"$tmp/err" ||
    fail "budget 0: $(cat "$tmp/err")"
"$si" place --show "$tmp/zero.gguf" | grep -q '^gpu neurons: 0 ' || fail "budget 0 placed neurons on the GPU"
"$si" "${base[@]}" --vram-budget 1G -o "$tmp/all.gguf" "${hw[@]}" >/dev/null 2>"$tmp/err" ||
    fail "budget 1G: $(cat "$tmp/err")"
"$si" place --show "$tmp/all.gguf" | grep -q '^gpu neurons: 1024 (100.00%)' || fail "budget 1G left neurons on the CPU"
# The other policies, and the measured hardware model (no --cpu-bw: the probe runs).
for pol in hottest random; do
    "$si" "${base[@]}" --vram-budget 33068K -o "$tmp/$pol.gguf" --policy $pol --t-sync 0.5 \
        >"$tmp/out" 2>"$tmp/err" || fail "--policy $pol: $(cat "$tmp/err")"
    grep -q "placement ($pol)" "$tmp/out" || fail "--policy $pol: $(cat "$tmp/out")"
    grep -q 'cpu_bw .*(measured)' "$tmp/out" || fail "--policy $pol: the CPU bandwidth was not measured"
done

# generate with the placement: it needs a CUDA worker (one line, exit 1
# without); the engine holding exactly the placed neurons is test-placement's.
if STARPU_NCUDA=0 "$si" generate -m "$tmp/m.gguf" -p "one two" -n 3 --temp 0 --engine starpu \
    --sparsity gate --placement "$tmp/pl.gguf" >"$tmp/out" 2>"$tmp/err"; then
    fail "generate --placement ran without a CUDA worker"
fi
[ "$(wc -l <"$tmp/err")" = 1 ] && grep -qF 'a placement needs a GPU, and StarPU has no CUDA worker' "$tmp/err" ||
    fail "generate --placement without a CUDA worker: $(cat "$tmp/err")"
expect_error "VRAM budget of 100 bytes (0.00 MiB) is below the" \
    generate -m "$tmp/m.gguf" -p a -n 1 --engine starpu --sparsity gate --placement "$tmp/pl.gguf" \
    --vram-budget 100
expect_error "generate: --placement needs --engine starpu" \
    generate -m "$tmp/m.gguf" -p a --engine ref --placement "$tmp/pl.gguf"
expect_error "a placement needs the gate or predictor sparsity mode" \
    generate -m "$tmp/m.gguf" -p a --placement "$tmp/pl.gguf"
expect_error "placement of 2 layers x 512 neurons, but the model has 2 x 256" \
    generate -m "$tmp/other.gguf" -p a -n 1 --engine starpu --sparsity gate --placement "$tmp/pl.gguf"
expect_error "not a GPU index file" \
    generate -m "$tmp/m.gguf" -p a -n 1 --engine starpu --sparsity gate --placement "$tmp/p.gguf"

echo "$failures failures"
[ "$failures" = 0 ]
