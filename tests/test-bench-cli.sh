#!/usr/bin/env bash
# test-bench-cli.sh - `starinfer bench`: one workload under several StarPU
# scheduling policies in one process (StarPU restarted with each), a table with
# one row per policy whose decoded tokens agree, and clear errors for bad
# policies and options.  Speed is not checked here (see make bench).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
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
export STARPU_NCPU=2 STARPU_SILENT=1
echo text >"$tmp/text.txt"

"$si" bench --help >"$tmp/out" || fail "bench --help exits non-zero"
grep -q -- '--sched LIST' "$tmp/out" || fail "bench --help does not document --sched"
"$si" bench --sched list >"$tmp/out" || fail "bench --sched list exits non-zero"
for p in eager lws dmda dmdas prio ws; do
    grep -q "^  $p " "$tmp/out" || fail "--sched list lacks $p"
done

expect_error 1 "no model given" bench --sched eager
expect_error 1 "StarPU has no scheduling policy 'fastest'" bench -m x.gguf --sched eager,fastest
expect_error 1 "unknown option '--bogus'" bench --bogus
expect_error 1 "-r: 0 is out of range" bench -m x.gguf -r 0
expect_error 1 "bench: --gpu-attention N needs --vram-budget" bench -m x.gguf --gpu-attention 4
expect_error 1 "--gpu-attention: 'most' is not a whole number" bench -m x.gguf --gpu-attention most
expect_error 1 "/nonexistent.gguf: No such file or directory" bench -m /nonexistent.gguf --sched eager

"$si" synth -o "$tmp/tiny.gguf" --arch llama-relu --preset tiny --type q4_0 --seed 3 --measure 0 \
    >/dev/null 2>&1 || fail "synth"
for mode in dense gate; do
    "$si" bench -m "$tmp/tiny.gguf" --sched eager,lws,dmda -r 2 -n 6 --sparsity $mode \
        >"$tmp/out" 2>"$tmp/err" || fail "bench $mode: $(tail -n 3 "$tmp/err")"
    cat "$tmp/out"
    grep -q "; $mode mode;" "$tmp/out" || fail "bench $mode: no header line"
    for p in eager lws dmda; do
        grep -Eq "^\| $p \| [0-9.]+ \| [0-9.]+ \| .* \| yes \|$" "$tmp/out" || fail "bench $mode: no row for $p"
    done
    [ "$(grep -c '^| ' "$tmp/out")" = 4 ] || fail "bench $mode: expected a header and 3 rows"
    [ "$(grep -c '^bench: run' "$tmp/err")" = 6 ] || fail "bench $mode: expected 6 runs on stderr"
done
# Without --sched: STARPU_SCHED, one row.
STARPU_SCHED=prio "$si" bench -m "$tmp/tiny.gguf" -r 1 -n 2 >"$tmp/out" 2>"$tmp/err" ||
    fail "bench with STARPU_SCHED: $(tail -n 3 "$tmp/err")"
grep -q '^| prio |' "$tmp/out" || fail "bench did not take STARPU_SCHED: $(cat "$tmp/out")"
grep -q '; 1 run; ' "$tmp/out" || fail "bench -r 1: no '1 run' in $(head -n 1 "$tmp/out")"

# --trace: one FxT trace per policy, each kept (FxT moves its file when StarPU
# restarts), each converted and drawn.
if "$si" --version | grep -q ', FxT traces' && command -v starpu_fxt_tool >/dev/null &&
    "${srcdir:-.}/tools/trace-plot" --check >/dev/null 2>&1; then
    "$si" bench -m "$tmp/tiny.gguf" --sched eager,lws -r 2 -n 2 --trace "$tmp/tr" >"$tmp/out" 2>"$tmp/err" ||
        fail "bench --trace: $(tail -n 3 "$tmp/err")"
    grep -qi 'could not rename' "$tmp/err" && fail "bench --trace: FxT complained: $(cat "$tmp/err")"
    for p in eager lws; do
        for f in paje.trace tasks.rec trace.png trace-summary.md prof_file_*.run; do
            # shellcheck disable=SC2086
            [ -s "$(echo "$tmp"/tr/$p/$f)" ] || fail "bench --trace: $p/$f missing or empty"
        done
        grep -q '"embed"' "$tmp/tr/$p/paje.trace" || fail "bench --trace: no embed task in $p's trace"
    done
    grep -q "vite $tmp/tr/lws/paje.trace" "$tmp/err" || fail "bench --trace does not say how to open it"
    # The converters missing: one line, before anything runs.
    PATH=/usr/bin:/bin expect_error 1 "--trace: starpu_fxt_tool not found in PATH" \
        bench -m "$tmp/tiny.gguf" --trace "$tmp/tr2"
    [ -e "$tmp/tr2" ] && fail "bench --trace made its folder before failing"
    expect_error 1 "--trace: cannot create $tmp/text.txt/x: Not a directory" \
        bench -m "$tmp/tiny.gguf" --trace "$tmp/text.txt/x"
else
    echo "note: --trace checks skipped: StarPU without FxT, or starpu_fxt_tool or matplotlib (tools/trace-plot --check) missing"
fi

[ "$failures" = 0 ] || { echo "$failures failures"; exit 1; }
echo "all bench CLI checks passed"
