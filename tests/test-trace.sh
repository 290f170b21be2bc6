#!/usr/bin/env bash
# test-trace.sh - tools/trace and the commands' --trace on the engine: an
# FxT trace of a few decode steps on a tiny synthetic model becomes
# paje.trace (with per-layer task names) and a PNG picture; --trace's errors.
set -u
si=${STARINFER:?STARINFER must name the starinfer binary}
for tool in starpu_fxt_tool vite rsvg-convert; do
    command -v "$tool" >/dev/null || { echo "SKIP: $tool not found (tools/install-deps installs it)"; exit 77; }
done
"$si" --version | grep -q ', FxT traces' || { echo "SKIP: StarPU was built without FxT"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$si" synth -o "$tmp/m.gguf" --preset tiny --n-ff 1024 --n-layer 2 --type q4_0 --predictor 32 \
    --measure 0 >/dev/null || exit 1
printf 'one two three four five six seven eight nine ten\n' >"$tmp/text.txt"
"$si" profile -m "$tmp/m.gguf" -f "$tmp/text.txt" -o "$tmp/p.gguf" >/dev/null || exit 1
STARPU_NCPU=2 bash "${srcdir:-.}/tools/trace" "$tmp/tr" -- "$si" generate -m "$tmp/m.gguf" -p hi -n 4 \
    --temp 0 --engine starpu --sparsity predictor --profile "$tmp/p.gguf" --attn-split 2 -b 1 \
    --ids || exit 1
for f in paje.trace tasks.rec trace.svg trace.png; do
    [ -s "$tmp/tr/$f" ] || { echo "FAIL: $f missing or empty"; exit 1; }
done
for name in '"attn_L1.1"' '"attn_o_L0.0"' '"ffn_cold_L1.0"' '"embed"' '"lm_head.1"'; do
    grep -q "$name" "$tmp/tr/paje.trace" || { echo "FAIL: no task named $name in paje.trace"; exit 1; }
done
# Predictor mode on CPU workers: each FFN slice task runs the predictor for
# its neurons and computes its input itself: no pred or attn_out task.
! grep -q '"pred_L\|"attn_out_L' "$tmp/tr/paje.trace" ||
    { echo "FAIL: a pred_L or attn_out_L task in paje.trace"; exit 1; }
# Each layer's FFN is merged by the next layer's attention tasks (and the
# head's): no merge task of its own.
! grep -q '"merge_L' "$tmp/tr/paje.trace" || { echo "FAIL: a merge task in paje.trace"; exit 1; }
file "$tmp/tr/trace.png" 2>/dev/null | grep -q 'PNG image' || head -c 8 "$tmp/tr/trace.png" | grep -q PNG ||
    { echo "FAIL: trace.png is not a PNG"; exit 1; }
echo "tools/trace: trace, paje file and picture made; task names present"

# The commands' own --trace: generate, and chat with piped turns.
"$si" generate -m "$tmp/m.gguf" -p hi -n 4 --temp 0 --engine starpu --sparsity gate \
    --trace "$tmp/gen" >"$tmp/out" 2>"$tmp/err" || { echo "FAIL: generate --trace: $(tail -n 3 "$tmp/err")"; exit 1; }
printf 'hello\n/exit\n' | "$si" chat -m "$tmp/m.gguf" -n 3 --temp 0 --engine starpu --trace "$tmp/chat" \
    >"$tmp/out" 2>"$tmp/err2" || { echo "FAIL: chat --trace: $(tail -n 3 "$tmp/err2")"; exit 1; }
for d in gen chat; do
    for f in paje.trace tasks.rec trace.png; do
        [ -s "$tmp/$d/$f" ] || { echo "FAIL: $d --trace: $f missing or empty"; exit 1; }
    done
    grep -q '"ffn_cold_L1.0"' "$tmp/$d/paje.trace" || { echo "FAIL: $d --trace: no ffn_cold_L1.0 task"; exit 1; }
done
grep -q "trace: ViTE: vite $tmp/gen/paje.trace" "$tmp/err" && grep -q 'starvz_phase1' "$tmp/err" ||
    { echo "FAIL: generate --trace does not say how to open the trace: $(cat "$tmp/err")"; exit 1; }
grep -q "trace: $tmp/chat/trace.png" "$tmp/err2" || { echo "FAIL: chat --trace names no picture"; exit 1; }

# Its errors: one line, exit 1, nothing loaded or run.
one_error() {
    local needle=$1
    shift
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    [ "$rc" = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -qF -- "$needle" "$tmp/err" ||
        { echo "FAIL: $* -> exit $rc: $(cat "$tmp/err")"; exit 1; }
    echo "ok: $(cat "$tmp/err")"
}
one_error "generate: --trace records StarPU's tasks: it needs --engine starpu" \
    "$si" generate -m "$tmp/m.gguf" -p hi --engine ref --trace "$tmp/x"
one_error "--trace: starpu_fxt_tool not found in PATH" \
    env PATH=/usr/bin:/bin "$si" generate -m "$tmp/m.gguf" -p hi --engine starpu --trace "$tmp/y"
[ -e "$tmp/y" ] && { echo "FAIL: a refused --trace made its folder"; exit 1; }
one_error "--trace: STARPU_FXT_TRACE=0 in the environment turns tracing off" \
    env STARPU_FXT_TRACE=0 "$si" chat -m "$tmp/m.gguf" --engine starpu --trace "$tmp/z"
echo "generate and chat --trace: pictures made, errors refused"
