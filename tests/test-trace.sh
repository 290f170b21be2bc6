#!/usr/bin/env bash
# test-trace.sh - tools/trace and the commands' --trace on the engine: an
# FxT trace of a few decode steps on a tiny synthetic model becomes
# paje.trace (with per-layer task names), the panel picture and its summary
# (the legend lists every kind of task the window holds, the shares add up
# to 100%, the default window is two decoded tokens after the first);
# --trace's errors.
set -u
si=${STARINFER:?STARINFER must name the starinfer binary}
command -v starpu_fxt_tool >/dev/null ||
    { echo "SKIP: starpu_fxt_tool not found (tools/install-deps installs it)"; exit 77; }
plot=${srcdir:-.}/tools/trace-plot
why=$("$plot" --check 2>&1) || { echo "SKIP: $why"; exit 77; }
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
for f in paje.trace tasks.rec trace.png trace-summary.md; do
    [ -s "$tmp/tr/$f" ] || { echo "FAIL: $f missing or empty"; exit 1; }
done
for name in '"attn_L1.1"' '"ffn_cold_L1.0"' '"embed"' '"lm_head.1"'; do
    grep -q "$name" "$tmp/tr/paje.trace" || { echo "FAIL: no task named $name in paje.trace"; exit 1; }
done
# Predictor mode on CPU workers: each FFN slice task runs the predictor for
# its neurons and computes its input itself, and the attention groups
# multiply their heads' columns of Wo: no pred, attn_out or attn_o task.
! grep -q '"pred_L\|"attn_out_L\|"attn_o_L' "$tmp/tr/paje.trace" ||
    { echo "FAIL: a pred_L, attn_out_L or attn_o_L task in paje.trace"; exit 1; }
# With SI_FUSE_WO=0 Wo's row slices are tasks of their own, attn_o_L.j
# (the task names only: a trace of its own).
SI_FUSE_WO=0 STARPU_NCPU=2 bash "${srcdir:-.}/tools/trace" "$tmp/trw" -- "$si" generate -m "$tmp/m.gguf" \
    -p hi -n 2 --temp 0 --engine starpu --sparsity predictor --profile "$tmp/p.gguf" --attn-split 2 \
    -b 1 >/dev/null || exit 1
grep -q '"attn_L1.1"' "$tmp/trw/paje.trace" && grep -q '"attn_o_L0.0"' "$tmp/trw/paje.trace" ||
    { echo "FAIL: SI_FUSE_WO=0: no attn_o_L0.0 or attn_L1.1 task in paje.trace"; exit 1; }
# Each layer's FFN is merged by the next layer's attention tasks (and the
# head's): no merge task of its own.
! grep -q '"merge_L' "$tmp/tr/paje.trace" || { echo "FAIL: a merge task in paje.trace"; exit 1; }
file "$tmp/tr/trace.png" 2>/dev/null | grep -q 'PNG image' || head -c 8 "$tmp/tr/trace.png" | grep -q PNG ||
    { echo "FAIL: trace.png is not a PNG"; exit 1; }
echo "tools/trace: trace, paje file and picture made; task names present"

# The summary: the kinds of the tasks that ran in the window (their names
# less _L<layer>.<slice> or .<slice>, computed here from tasks.rec) each in
# the legend as drawn, and the shares, idle included, adding up to 100%.
check_summary() { # DIR WHAT
    local sum=$1/trace-summary.md what=$2 window kinds legend
    window=$(sed -n 's/^window: \([0-9.]*\) to \([0-9.]*\) ms.*/\1 \2/p' "$sum")
    [ -n "$window" ] || { echo "FAIL: $what: no window line in $sum"; exit 1; }
    kinds=$(awk -v w="$window" 'BEGIN { split(w, a, " ") }
        function kind() { # a record that ran in the window: its name less layer and slice
            if (n != "" && s != "" && e + 0 > a[1] + 0 && s + 0 < a[2] + 0) {
                sub(/_L[0-9]+(\.[0-9]+)*$/, "", n); sub(/\.[0-9]+$/, "", n); print n }
            n = s = e = "" }
        /^Name:/ { n = $2 } /^StartTime:/ { s = $2 } /^EndTime:/ { e = $2 }
        /^$/ { kind() } END { kind() }' "$1/tasks.rec" | sort -u)
    [ -n "$kinds" ] || { echo "FAIL: $what: no task in the window $window"; exit 1; }
    legend=" $(sed -n 's/^legend: //p' "$sum") "
    for k in $kinds; do
        case "$legend" in *" $k "*) ;; *) echo "FAIL: $what: kind $k not in the legend:$legend"; exit 1 ;; esac
    done
    awk -F'|' '/^\| / && $3 ~ /%/ { gsub(/[ %]/, "", $3); t += $3; n++ }
        END { if (n < 2 || t < 100 - 0.005 * n || t > 100 + 0.005 * n) {
                  printf "FAIL: '"$what"': the shares add up to %.2f%% over %d rows\n", t, n; exit 1 } }' \
        "$sum" || exit 1
    echo "ok: $what: the legend lists $(echo $kinds | wc -w) kinds ($(echo $kinds)); shares add up to 100%"
}
check_summary "$tmp/tr" "default window"
grep -q '^window: .*decoded tokens 2 and 3' "$tmp/tr/trace-summary.md" ||
    { echo "FAIL: the default window is not decoded tokens 2 and 3: $(grep '^window' "$tmp/tr/trace-summary.md")"; exit 1; }
"$plot" "$tmp/tr" --window all -o "$tmp/tr/all.png" >/dev/null || { echo "FAIL: trace-plot --window all"; exit 1; }
check_summary "$tmp/tr" "--window all"
"$plot" "$tmp/tr" --token 2 -o "$tmp/tr/t2.png" >/dev/null || { echo "FAIL: trace-plot --token 2"; exit 1; }
check_summary "$tmp/tr" "--token 2"
"$plot" "$tmp/tr" --token 99 >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q -- '--token 99: the trace has [0-9]* decoded token' "$tmp/err" ||
    { echo "FAIL: --token 99: $(cat "$tmp/err")"; exit 1; }

# 16 CPU workers: a prompt batch's tasks with over 66 buffers, which made
# StarPU 1.4.10's starpu_fxt_tool write past its stack buffers and crash
# (tools/starpu-fxt-overflow.patch, applied by tools/install-deps).
"$si" synth -o "$tmp/w.gguf" --preset tiny --n-embd 512 --n-ff 2048 --n-layer 2 --n-head 8 \
    --n-head-kv 8 --type q4_0 --measure 0 >/dev/null || exit 1
STARPU_NCPU=16 bash "${srcdir:-.}/tools/trace" "$tmp/t16" -- "$si" generate -m "$tmp/w.gguf" \
    -p "one two three four five six seven eight nine ten eleven twelve" -n 3 --temp 0 \
    --engine starpu --ids >"$tmp/t16.out" 2>&1 ||
    { echo "FAIL: tools/trace with 16 workers: $(tail -n 2 "$tmp/t16.out")"; exit 1; }
most=$(awk '/^Handles:/ { if (NF - 1 > m) m = NF - 1 } END { print m + 0 }' "$tmp/t16/tasks.rec")
[ "$most" -gt 66 ] || { echo "FAIL: 16 workers: at most $most buffers in a task, the case needs over 66"; exit 1; }
check_summary "$tmp/t16" "16 workers (a task with $most buffers)"

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
    check_summary "$tmp/$d" "$d --trace"
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
if command -v starinfer-trace-plot >/dev/null; then
    echo "skipped the missing-picture-program check: starinfer-trace-plot is installed in PATH"
else
    mkdir "$tmp/bin" && cp "$si" "$tmp/bin/starinfer"
    one_error "--trace: starinfer-trace-plot not found beside starinfer or in PATH" \
        "$tmp/bin/starinfer" generate -m "$tmp/m.gguf" -p hi --engine starpu --trace "$tmp/w"
    [ -e "$tmp/w" ] && { echo "FAIL: a refused --trace made its folder"; exit 1; }
fi
one_error "--trace: STARPU_FXT_TRACE=0 in the environment turns tracing off" \
    env STARPU_FXT_TRACE=0 "$si" chat -m "$tmp/m.gguf" --engine starpu --trace "$tmp/z"
echo "generate and chat --trace: pictures made, errors refused"
