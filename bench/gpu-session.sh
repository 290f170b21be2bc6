#!/usr/bin/env bash
# bench/gpu-session.sh: the next device session's one call (docs/gpu.md, "The
# next device session"): the tests, then the hybrid with the attention of the
# GPU's layers there, against the same hybrid without it and llama.cpp's CUDA
# build, on a 13B-shaped Q4_0 model with 30% of it in VRAM.
#
# Prepared here (the build machine), from the repository root:
#   tools/setup && tools/device-test prepare
#   mkdir -p .device/peer && cp "$(tools/build-peer --cuda --cuda-arch 90)" .device/peer/
#   strip --strip-unneeded .device/bin/* .device/tests/test-* .device/lib/*.so* .device/peer/*
#   tar cJf device.tar.xz .device     (carried; ignored by git)
# There (the device tool, carry ["device.tar.xz"], timeout_s 600; about 9 minutes):
#   tar xJf device.tar.xz && bench/gpu-session.sh
# Each step is skipped once the time since the start passes its limit, so that
# what ran comes back: $OUT/summary.txt, $OUT/logs.tar.gz and the raw FxT
# trace of the hybrid in $OUT/fxt (drawn here with `tools/trace DIR`).
set -u
root=$(pwd)
dev=$root/.device
R=${OUT:-/tmp/out}
mkdir -p "$R"
O=/tmp/w
mkdir -p "$O"
S=$R/summary.txt
T0=$(date +%s)
trap 'tar -C "$O" -czf "$R/logs.tar.gz" . 2>/dev/null' EXIT
el() { echo $(($(date +%s) - T0)); }
stamp() { echo "=== [$(el) s] $*" | tee -a "$S"; }
late() { [ "$(el)" -gt "$1" ] && { echo "=== [$(el) s] skipped (late): $2" | tee -a "$S"; }; }
export LD_LIBRARY_PATH=$dev/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export STARPU_HOME=$dev/starpu-home
export STARINFER=$dev/bin/starinfer
export srcdir=$root
SI=$dev/bin/starinfer
M=/tmp/13b.gguf
P=/tmp/13b.prof
NT=$(nproc)

# The model (110 s on the H200 machine's 16 cores) and its llama.cpp copy, in
# the background while the tests run; then its profile.
(timeout 200 "$SI" synth -o $M --preset 13b --arch llama-relu --type q4_0 --sparsity 0.9 \
    --measure 0 --predictor 64 &&
    timeout 90 "$SI" convert -m $M --llama-cpp -o /tmp/13b-peer.gguf) >"$O/synth.txt" 2>&1 &
synth=$!
stamp "host"
{ nvidia-smi -L; lscpu | grep -E "Model name|^CPU\(s\)"; } 2>&1 | tee -a "$S"

stamp "tests (tools/device-test run, 4 CPU workers)"
STARPU_NCPU=4 timeout 220 tools/device-test run >"$O/tests.txt" 2>&1
echo "rc=$?" >>"$O/tests.txt"
grep -E "^(PASS|FAIL|SKIP)|passed|rc=" "$O/tests.txt" | tee -a "$S"
grep -E "FAIL:|check failed" "$O/tests.txt" | head -20 | tee -a "$S"
grep -hE "attn-gpu|near tie" "$dev"/tests/logs/test-engine* 2>/dev/null | grep -E "gpu" |
    head -40 >>"$S"

stamp "the model, then its profile"
wait $synth
tail -2 "$O/synth.txt" | tee -a "$S"
head -c 400000 /usr/share/common-licenses/GPL-3 >/tmp/gpl.txt 2>/dev/null ||
    yes "the quick brown fox jumps over the lazy dog" | head -c 400000 >/tmp/gpl.txt
timeout 90 "$SI" profile -m $M -f /tmp/gpl.txt -o $P -n 256 -c 256 >"$O/profile.txt" 2>&1
echo "profile rc=$?" | tee -a "$S"

# A call may run 600 s: each step below starts only when its usual time
# still fits, the measurements first.
B=(-m "$M" --prompt-tokens 64 -n 32 -r 2 --profile "$P" --vram-budget 2100M -c 128)
row() { grep -E "^\||weights read|error|GPU" | tee -a "$S"; }
for a in auto none; do
    late 470 "hybrid gate, --gpu-attention $a" && continue
    stamp "starinfer hybrid, gate mode, 2100M, --gpu-attention $a (lws)"
    timeout 90 "$SI" bench "${B[@]}" --sparsity gate --gpu-attention $a 2>&1 | row
done
late 520 "llama.cpp" || {
    stamp "llama.cpp CUDA, -ngl 12 (30% of the layers)"
    timeout 60 "$dev/peer/llama-peer-cuda" -m /tmp/13b-peer.gguf -t "$NT" --prompt-tokens 64 -n 32 \
        -r 2 --ngl 12 >"$O/peer.txt" 2>"$O/peer.err"
    echo "rc=$?" >>"$O/peer.txt"
    awk '$1=="run"{printf "llama.cpp run %s: prefill %.1f tok/s, decode %.2f tok/s\n", $2, 64/$4, 32/$6} $1 ~ /^rc=/' \
        "$O/peer.txt" | tee -a "$S"
}
late 540 "generate's breakdown" || {
    stamp "where a token's time goes (generate, --gpu-attention auto)"
    timeout 45 "$SI" generate -m $M -p "The quick brown fox" -n 32 --temp 0 --ignore-eos -c 128 \
        --sparsity gate --profile $P --vram-budget 2100M 2>&1 >/dev/null |
        grep -E "engine:|tokens/s|error" | tee -a "$S"
}
late 550 "the hybrid's trace" || {
    # the raw FxT trace comes back in $OUT/fxt; here: tools/trace DIR (docs/cli.md, Traces)
    stamp "an FxT trace of the hybrid (6 tokens, --gpu-attention auto)"
    mkdir -p "$R/fxt"
    STARPU_FXT_TRACE=1 STARPU_FXT_PREFIX="$R/fxt/" timeout 30 "$SI" generate -m $M \
        -p "The quick brown fox" -n 6 --temp 0 --ignore-eos -c 64 --sparsity gate --profile $P \
        --vram-budget 2100M >/dev/null 2>"$O/trace.err"
    echo "trace rc=$? $(du -sh "$R/fxt" | cut -f1)" | tee -a "$S"
}
late 500 "test-engine under dmda" || {
    stamp "test-engine STARPU_SCHED=dmda (quick)"
    (cd "$dev" && SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=dmda timeout 60 ./tests/test-engine) \
        >"$O/engine-dmda.txt" 2>&1
    echo "rc=$?" >>"$O/engine-dmda.txt"
    grep -E "hot-gpu|near tie|check failed|rc=|checks" "$O/engine-dmda.txt" | tail -12 | tee -a "$S"
}
# Predictor mode with trained predictors (docs/gpu.md's estimate of 5x needs
# it) is a session of its own: training takes minutes on 16 cores.
stamp "done"
