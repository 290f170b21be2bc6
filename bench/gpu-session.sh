#!/usr/bin/env bash
# bench/gpu-session.sh: a device session's one call (issue 41; docs/gpu.md,
# "The next device session"): the CUDA tests, then on a 13B-shaped Q4_0 model
# with 30% of it in VRAM the hybrid in gate and predictor modes with and
# without the attention of the first layers on the
# GPU, llama.cpp's CUDA build at the same VRAM, and the CPU-only rows on the
# machine's cores. The predictors are trained here and carried as a
# predictor file (train-predictor --predictors-only, 27 MB at rank 64 Q4_0):
# synth makes the same weights there from the same seed, and the file's
# fingerprint refuses any other.
#
# Prepared here (the build machine), from the repository root, by
#   bench/gpu-prepare.sh   (the model, its profile and predictors, the
#                           binaries and peers, packed into device.tar.xz)
# There (the device tool, carry ["device.tar.xz"], timeout_s 600):
#   tar -xJf device.tar.xz && bench/gpu-session.sh
# Each step starts only while its usual time still fits; what ran comes back:
# $OUT/summary.txt, $OUT/logs.tar.gz, $OUT/test-logs.tar.gz and the raw FxT
# trace of one hybrid run in $OUT/fxt.tar.gz (drawn here with tools/trace).
set -u
root=$(pwd)
dev=$root/.device
R=${OUT:-/tmp/out}
mkdir -p "$R"
O=/tmp/w
mkdir -p "$O"
S=$R/summary.txt
T0=$(date +%s)
finish() {
    tar -C "$O" -czf "$R/logs.tar.gz" --exclude=fxt . 2>/dev/null
    [ -d "$O/fxt" ] && tar -C "$O" -czf "$R/fxt.tar.gz" fxt 2>/dev/null
}
trap finish EXIT
el() { echo $(($(date +%s) - T0)); }
stamp() { echo "=== [$(el) s] $*" | tee -a "$S"; }
late() { [ "$(el)" -gt "$1" ] && { echo "=== [$(el) s] skipped (late): $2" | tee -a "$S"; }; }
export LD_LIBRARY_PATH=$dev/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export STARPU_HOME=$dev/starpu-home
export STARINFER=$dev/bin/starinfer
export srcdir=$root
SI=$dev/bin/starinfer
M=/tmp/13b.gguf   # random rank-64 predictors (synth): gate mode, llama.cpp's copy
PRED=${SESSION_PRED:-$dev/13b.pred} # its trained predictors (carried), for predictor mode
P=${SESSION_PROFILE:-$dev/13b.prof}
NT=$(nproc)
# A dry run of this script on the build machine: SESSION_PRESET=tiny
# SESSION_TESTS=test-cuda-kernels SESSION_PROFILE=P SESSION_PRED=F
# bench/gpu-session.sh, P and F made for the tiny preset's model (the GPU
# rows then fail).
PRESET=${SESSION_PRESET:-13b}
TESTS=${SESSION_TESTS:-test-cuda-kernels test-cuda-decode test-codelet-cuda test-codelets test-api \
test-api-host test-api-threads test-engine test-cli.sh}
cp "$dev/gpl.txt" /tmp/gpl.txt # the corpus of the profile: Debian's GPL-3, carried

# The model (110-120 s on the H200 machine's 16 cores), then its llama.cpp
# copy, while the tests run. StarPU binds its workers to the first cores in
# each process: while two run at once, neither binds.
(
    timeout 220 "$SI" synth -o $M --preset $PRESET --arch llama-relu --type q4_0 --sparsity 0.9 \
        --measure 0 --predictor 64 >"$O/synth.txt" 2>&1 || exit 1
    timeout 120 "$SI" convert -m $M --llama-cpp -o /tmp/13b-peer.gguf >"$O/convert.txt" 2>&1
) &
models=$!
stamp "host"
{ nvidia-smi -L; lscpu | grep -E "Model name|^CPU\(s\)|^Flags" | cut -c1-200; free -g | head -2; } 2>&1 | tee -a "$S"

stamp "CUDA tests (tools/device-test run, 4 CPU workers)"
STARPU_NCPU=4 STARPU_WORKERS_NOBIND=1 timeout 200 tools/device-test run $TESTS >"$O/tests.txt" 2>&1
echo "rc=$?" >>"$O/tests.txt"
tar -C "$dev/tests" -czf "$R/test-logs.tar.gz" logs 2>/dev/null
grep -E "^(PASS|FAIL|SKIP)|passed|rc=" "$O/tests.txt" | tee -a "$S"
grep -hE "SKIP|skip" "$dev"/tests/logs/* 2>/dev/null | sort | uniq -c | sort -rn | head -15 >>"$S"
grep -hE "FAIL:|check failed|error" "$O/tests.txt" "$dev"/tests/logs/* 2>/dev/null | head -20 |
    tee -a "$S"

stamp "the models (synth, convert)"
while kill -0 $models 2>/dev/null && [ "$(el)" -lt 340 ]; do sleep 2; done
kill -0 $models 2>/dev/null && echo "models: still running at 340 s" | tee -a "$S"
wait $models
tail -n 2 "$O/synth.txt" | tee -a "$S"
[ -s "$PRED" ] || PRED=
GX=() GMODE=gate # the breakdown and the trace: predictor mode where trained
[ -n "$PRED" ] && GX=(--predictors "$PRED") GMODE=predictor

B=(--prompt-tokens 64 -n 32 -r 2 --profile "$P" --vram-budget 2100M -c 128)
row() { grep -E "^\||weights read|error|GPU|RSS" | tee -a "$S"; }
hybrid() { # hybrid MODE ATTN [ARGS...]: one bench row, lws
    local mode=$1 attn=$2
    shift 2
    stamp "starinfer hybrid, $mode mode, 2100M, --gpu-attention $attn (lws)"
    timeout 80 "$SI" bench -m $M "$@" "${B[@]}" --sparsity "$mode" --gpu-attention "$attn" 2>&1 | row
}
peer() { # peer LABEL BIN ARGS...: the llama.cpp driver, tok/s of each run
    local label=$1 bin=$2
    shift 2
    timeout 90 "$bin" -m /tmp/13b-peer.gguf -t "$NT" --prompt-tokens 64 -n 32 -r 2 "$@" \
        >"$O/peer-$label.txt" 2>"$O/peer-$label.err"
    echo "rc=$?" >>"$O/peer-$label.txt"
    awk -v l="$label" '$1=="run"{printf "%s run %s: prefill %.1f tok/s, decode %.2f tok/s\n", l, $2, 64/$4, 32/$6} $1 ~ /^rc=/{print l, $0}' \
        "$O/peer-$label.txt" | tee -a "$S"
    grep -iE "error|fail" "$O/peer-$label.err" | head -3 | tee -a "$S"
}
late 400 "hybrid gate auto" || hybrid gate auto
[ -n "$PRED" ] && { late 440 "hybrid predictor auto" || hybrid predictor auto "${GX[@]}"; }
late 480 "hybrid gate none" || hybrid gate none
[ -x "$dev/peer/llama-peer-cuda" ] && { late 490 "llama.cpp CUDA" || {
    stamp "llama.cpp CUDA, -ngl 12 (30% of the layers)"
    peer cuda-ngl12 "$dev/peer/llama-peer-cuda" --ngl 12
}; }
late 510 "CPU-only llama.cpp" || {
    stamp "llama.cpp CPU build, $NT threads"
    peer cpu "$dev/peer/llama-peer"
}
late 525 "generate's breakdown" || {
    stamp "where a token's time goes (generate, $GMODE, --gpu-attention auto)"
    timeout 40 "$SI" generate -m $M "${GX[@]}" -p "The quick brown fox" -n 32 --temp 0 --ignore-eos \
        -c 128 --sparsity $GMODE --profile $P --vram-budget 2100M 2>&1 >/dev/null |
        grep -E "engine:|tokens/s|error|GPU" | tee -a "$S"
}
late 540 "CPU-only starinfer" || {
    stamp "starinfer CPU only ($NT cores, STARPU_NCUDA=0): gate, --roofline"
    STARPU_NCUDA=0 timeout 45 "$SI" bench -m $M --prompt-tokens 64 -n 32 -r 2 -c 128 \
        --sparsity gate --profile $P --roofline 2>&1 | row
}
late 550 "CPU-only starinfer, graph of buffers" || {
    # the same with the decoding graph's buffers (SI_INPLACE=0, the graph
    # before the in-place one): what the in-place graph's cheaper tasks do
    # on 16 cores (docs/measurements.md, "The in-place decoding graph")
    stamp "starinfer CPU only ($NT cores): gate, SI_INPLACE=0"
    SI_INPLACE=0 STARPU_NCUDA=0 timeout 40 "$SI" bench -m $M --prompt-tokens 64 -n 32 -r 2 \
        -c 128 --sparsity gate --profile $P 2>&1 | row
}
[ -n "$PRED" ] && { late 565 "CPU-only starinfer, predictor" || {
    stamp "starinfer CPU only ($NT cores): predictor (carried predictors)"
    STARPU_NCUDA=0 timeout 30 "$SI" bench -m $M "${GX[@]}" --prompt-tokens 64 -n 32 -r 1 -c 128 \
        --sparsity predictor --profile $P 2>&1 | row
}; }
late 570 "CPU-only starinfer, dense" || {
    stamp "starinfer CPU only ($NT cores): dense"
    STARPU_NCUDA=0 timeout 25 "$SI" bench -m $M --prompt-tokens 64 -n 32 -r 1 -c 128 2>&1 | row
}
late 580 "the hybrid's trace" || {
    stamp "an FxT trace of the hybrid (4 tokens, $GMODE, --gpu-attention auto)"
    mkdir -p "$O/fxt"
    STARPU_FXT_TRACE=1 STARPU_FXT_PREFIX="$O/fxt/" timeout 15 "$SI" generate -m $M "${GX[@]}" \
        -p "The quick brown fox" -n 4 --temp 0 --ignore-eos -c 64 \
        --sparsity $GMODE --profile $P --vram-budget 2100M >/dev/null \
        2>"$O/fxt/gen.txt"
    echo "trace rc=$? $(du -sh "$O/fxt" | cut -f1)" | tee -a "$S"
}
stamp "done"
