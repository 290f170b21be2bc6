#!/usr/bin/env bash
# Device session for issue 21: the tests, then the hybrid on a 13B-shaped
# Q4_0 model with 30% of it in VRAM against llama.cpp's CUDA build.
set -u
root=$(pwd)
dev=$root/.device
R=${OUT:-/tmp/out}; mkdir -p "$R"     # back: summary.txt, logs.tar.gz, fxt.tar.gz
O=/tmp/w; mkdir -p "$O"
S=$R/summary.txt
T0=$(date +%s)
finish() { tar -C "$O" -czf "$R/logs.tar.gz" --exclude=fxt . 2>/dev/null; [ -d "$O/fxt" ] && tar -C "$O" -czf "$R/fxt.tar.gz" fxt 2>/dev/null; }
trap finish EXIT
el() { echo $(( $(date +%s) - T0 )); }
stamp() { echo "=== [$(el) s] $*" | tee -a "$S"; }
late() { [ "$(el)" -gt "$1" ] && { echo "=== [$(el) s] skipped (late): $2" | tee -a "$S"; return 0; }; return 1; }
export LD_LIBRARY_PATH=$dev/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export STARPU_HOME=$dev/starpu-home
export STARINFER=$dev/bin/starinfer
export srcdir=$root
SI=$dev/bin/starinfer
M=/tmp/13b.gguf; MP=/tmp/13b-peer.gguf
P=$dev/13b-q4_0.prof
NT=$(nproc)
( timeout 200 $SI synth -o $M --preset 13b --arch llama-relu --type q4_0 --sparsity 0.9 --measure 0 --predictor 64 &&
  timeout 90 $SI convert -m $M --llama-cpp -o $MP ) >"$O/synth.txt" 2>&1 &
synth=$!
stamp "host"; { nvidia-smi -L; lscpu | grep -E "Model name|^CPU\(s\)"; free -g | head -2; } 2>&1 | tee -a "$S"
stamp "tests (device-test run), synth in the background"
STARPU_NCPU=4 timeout 200 tools/device-test run >"$O/tests.txt" 2>&1; echo "rc=$?" >>"$O/tests.txt"
grep -E "^(PASS|FAIL|SKIP)|passed|rc=" "$O/tests.txt" | tee -a "$S"
grep -E "FAIL:|check failed" "$O/tests.txt" | head -20 | tee -a "$S"
cp -r "$dev/tests/logs" "$O/test-logs" 2>/dev/null
for s in dmda dmdas; do
  stamp "test-engine STARPU_SCHED=$s quick"
  (cd "$dev" && SI_TEST_ENGINE_QUICK=1 STARPU_SCHED=$s timeout 60 ./tests/test-engine) >"$O/engine-$s.txt" 2>&1
  echo "rc=$?" >>"$O/engine-$s.txt"; grep -E "gpu|near tie|check failed|rc=|checks" "$O/engine-$s.txt" | tail -20 | tee -a "$S"
done
stamp "wait synth"; wait $synth; tail -2 "$O/synth.txt" | tee -a "$S"
$SI info $M 2>&1 | grep -E "^workers|worker +[0-9]+ +: CUDA" | tee -a "$S"
peer() { # peer LABEL BIN ARGS...: the llama.cpp driver, tok/s of each run
  local label=$1 bin=$2; shift 2
  timeout 120 "$bin" -m $MP -t $NT --prompt-tokens 64 -n 32 -r 2 "$@" >"$O/peer-$label.txt" 2>"$O/peer-$label.err"
  echo "rc=$?" >>"$O/peer-$label.txt"
  awk -v l="$label" '$1=="run"{printf "%s run %s: prefill %.1f tok/s, decode %.2f tok/s\n", l, $2, 64/$4, 32/$6} $1=="peak_rss_kib"||$1 ~ /^rc=/{print l, $0}' "$O/peer-$label.txt" | tee -a "$S"
  grep -iE "error|fail" "$O/peer-$label.err" | head -3 | tee -a "$S"
}
sib() { grep -E "^\||weights read|error|GPU" | tee -a "$S"; }
B="-m $M --prompt-tokens 64 -n 32 -r 2"
stamp "llama.cpp CUDA, -ngl 12 (30% of the model's layers)"; peer cuda-ngl12 $dev/peer/llama-peer-cuda --ngl 12
stamp "starinfer hybrid gate, VRAM 2100M (30% of the model), lws,dmda,dmdas"
timeout 150 $SI bench $B --sparsity gate --profile $P --vram-budget 2100M --sched lws,dmda,dmdas 2>&1 | sib
late 330 "trace" || {
stamp "FxT trace of a hybrid decode (4 tokens, 2100M, lws)"
mkdir -p "$O/fxt"; STARPU_FXT_TRACE=1 STARPU_FXT_PREFIX="$O/fxt/" timeout 60 $SI generate -m $M -p "The quick brown fox" -n 4 --temp 0 --sparsity gate --profile $P --vram-budget 2100M >/dev/null 2>"$O/fxt/gen.txt"; echo "trace rc=$? $(ls -la $O/fxt | tail -2 | tr '\n' ' ')" | tee -a "$S"; }
late 360 "CPU peers" || { stamp "llama.cpp CPU only (CPU build)"; peer cpu $dev/peer/llama-peer; }
late 390 "CPU starinfer" || { stamp "starinfer CPU only (STARPU_NCUDA=0): dense, gate"
STARPU_NCUDA=0 timeout 80 $SI bench $B --sparsity dense --roofline 2>&1 | sib
STARPU_NCUDA=0 timeout 80 $SI bench $B --sparsity gate --profile $P 2>&1 | sib; }
stamp "ablation: generate with placements ilp, hottest, random (2100M)"
for pol in ilp hottest random; do
  late 470 "ablation $pol" && break
  timeout 40 $SI generate -m $M -p "The quick brown fox" -n 32 --temp 0 --ignore-eos --sparsity gate --profile $P --placement $dev/pl/13b-$pol.gpuidx >/dev/null 2>"$O/gen-$pol.txt"
  echo "$pol rc=$?: $(grep -E 'tokens/s|GPU|error' "$O/gen-$pol.txt" | tr '\n' ' ')" | tee -a "$S"
done
late 490 "all-GPU runs" || { stamp "llama.cpp CUDA, all layers (-ngl 99); starinfer hybrid with every FFN neuron on the GPU"
peer cuda-all $dev/peer/llama-peer-cuda --ngl 99
timeout 45 $SI bench $B --sparsity gate --profile $P --vram-budget 8000M --sched lws 2>&1 | sib; }
stamp "done"
