#!/usr/bin/env bash
# test-bench-llm.sh - tools/bench-llm, the `make bench` driver, on a tiny
# synthetic model: the Markdown report (machine, command, a row per engine,
# mode and prompt length, the ratio table), the JSON beside it and the three
# PNG plots; the peer's side through a stand-in for llama-peer (which must be
# given the same thread count and a copy of the model without starinfer's
# extra tensors); one-line errors; `--peer powerinfer` through a stand-in for
# PowerInfer's main (its options, its timing lines and main.log) and, where
# PowerInfer is built (tools/build-peer --powerinfer), through the real one on
# a tiny PowerInfer file.  No big model, no speed checked (that is `make
# bench`).
set -u
si=${STARINFER:?STARINFER must name the starinfer binary}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
driver=${srcdir:+$srcdir/tools/bench-llm}
[ -n "$driver" ] && [ -f "$driver" ] || driver=$here/../tools/bench-llm
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
command -v rsvg-convert >/dev/null ||
    { echo "SKIP: rsvg-convert not found (librsvg2-bin)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# PowerInfer's build, if any, before the cache moves into $tmp.
pi_main=${POWERINFER_MAIN:-}
if [ -z "$pi_main" ]; then
    cache=${STARINFER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/starinfer}
    for f in "$cache"/peer-powerinfer/*/build/bin/main; do
        [ -x "$f" ] && pi_main=$f
    done
fi
export STARINFER_CACHE=$tmp/cache STARPU_SILENT=1
bl() { python3 "$driver" --out "$tmp/out" "$@"; }

"$si" synth -o "$tmp/tiny.gguf" --arch llama-relu --preset tiny --type q4_0 --seed 3 --measure 0 \
    >/dev/null 2>&1 || { echo "FAIL: synth"; exit 1; }

# One-line errors, before anything runs.
expect_error() {
    local needle=$1
    shift
    bl "$@" >"$tmp/o" 2>"$tmp/e"
    local rc=$?
    [ "$rc" != 0 ] || fail "bench-llm $*: exit 0"
    # Progress lines may come first; the error is one line, the last.
    local err
    err=$(tail -n 1 "$tmp/e")
    [ "$(grep -c '^bench-llm: error: ' "$tmp/e")" = 1 ] && [[ $err == "bench-llm: error: "* ]] ||
        fail "bench-llm $*: not one error line, last: $(cat "$tmp/e")"
    grep -qF -- "$needle" <<<"$err" || fail "bench-llm $*: the error lacks '$needle': $err"
    echo "ok: bench-llm $* -> $err"
}
expect_error "unknown workload 'bogus'" --workloads bogus
expect_error "-r: 0 is out of range" -r 0
expect_error "--prompts: '8,x'" --prompts 8,x
expect_error "unrecognized arguments: --bogus" --bogus
expect_error "/nonexistent.gguf: no such file" --no-peer --model /nonexistent.gguf
expect_error "--peer: $tmp/none is not an executable" --peer "$tmp/none" --model "$tmp/tiny.gguf"
expect_error "the PowerInfer peer runs an f16 cache only" --peer powerinfer --cache-type q8_0 \
    --model "$tmp/tiny.gguf"
expect_error "--peer: $tmp/none is not an executable" --peer "powerinfer=$tmp/none"
expect_error "--powerinfer-src goes with --peer powerinfer" --powerinfer-src "$tmp"
expect_error "needs at least 2 prompt tokens" --peer powerinfer --prompts 1,8
expect_error "--threads: '1,x'" --threads 1,x
expect_error "is not in PowerInfer's layout" --peer "powerinfer=$(type -P true)" \
    --model "$tmp/tiny.gguf"
# A starinfer whose JSON lacks the figures: named, not a crash.
printf '#!/bin/sh\ncase "$*" in *--help*) echo "--json";; *) echo "{}";; esac\n' >"$tmp/bad-si"
chmod +x "$tmp/bad-si"
STARINFER=$tmp/bad-si expect_error "starinfer bench --json lacks runs" \
    --no-peer --model "$tmp/tiny.gguf" -n 2 -r 1

python3 "$driver" --help >"$tmp/o" || fail "--help exits non-zero"
for opt in --quick --workloads --prompts --threads --out --peer --powerinfer-src --no-peer \
    --gpu; do
    grep -q -- "$opt" "$tmp/o" || fail "--help does not document $opt"
done

# starinfer alone, dense, two prompt lengths.
bl --no-peer --model "$tmp/tiny.gguf" --prompts 4,6 -n 4 -r 1 --threads 2 >"$tmp/o" 2>"$tmp/e" ||
    fail "bench-llm --no-peer: $(tail -n 3 "$tmp/e")"
md=$(grep '\.md$' "$tmp/o")
[ -s "$md" ] || fail "no report: $(cat "$tmp/o")"
cat "$md"
for p in 4 6; do
    grep -Eq "^\| tiny \| dense, KV f16 \| $p \| starinfer \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|" "$md" ||
        fail "no starinfer row for prompt $p"
done
grep -q 'llama.cpp |' "$md" && fail "a llama.cpp row with --no-peer"
grep -q -- "--no-peer --model $tmp/tiny.gguf --prompts 4,6" "$md" ||
    fail "the command is not in the report"
grep -q '^- CPU: ' "$md" || fail "no machine description"
grep -Eq '^- memory bandwidth \(the roofline\): [0-9.]+ GB/s' "$md" || fail "no measured bandwidth"
for kind in decode prefill bandwidth; do
    png=${md%.md}-$kind.png
    magic=$(head -c 4 "$png" 2>/dev/null | od -An -c | tr -d ' ')
    [ "$magic" = '211PNG' ] || fail "$png is not a PNG"
    grep -qF "]($(basename "$png"))" "$md" || fail "the report does not show $png"
done
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert len(d["rows"]) == 2' \
    "${md%.md}.json" || fail "the JSON results are not two rows"

# With a peer: a stand-in printing llama-peer's lines (it checks its arguments).
cat >"$tmp/peer" <<EOF
#!/usr/bin/env bash
args="\$*"
case "\$args" in *"-t 2 "*) ;; *) echo "peer: wrong thread count: \$args" >&2; exit 1 ;; esac
m=\$2
case "\$m" in *.peer.gguf) ;; *) echo "peer: not the stripped copy: \$m" >&2; exit 1 ;; esac
grep -q ffn_planted_prob "\$m" && { echo "peer: \$m has starinfer's tensors" >&2; exit 1; }
echo "run 0 prefill_s 0.010000 decode_s 0.040000 lat_ms 10,10,10,10 tokens 1,2,3,4"
echo "peak_rss_kib 1000"
EOF
chmod +x "$tmp/peer"
bl --peer "$tmp/peer" --model "$tmp/tiny.gguf" --engine-opts "--sparsity gate" \
    --prompts 4 -n 4 -r 2 --threads 2 >"$tmp/o" 2>"$tmp/e" ||
    fail "bench-llm --peer: $(tail -n 3 "$tmp/e")"
md=$(grep '\.md$' "$tmp/o")
cat "$md"
grep -Eq '^\| tiny \| gate, KV f16 \| 4 \| starinfer \|' "$md" || fail "no starinfer gate row"
peer_row='^\| tiny \| dense, KV f16 \| 4 \| llama.cpp \| 400.0 \| 100.00 \| 10.00 \| 10.00 \| 10.00 \| 1 \|'
grep -Eq "$peer_row" "$md" || fail "the peer's row is not its figures"
grep -Eq '^\| tiny \| gate, KV f16 \| 4 \| [0-9.]+x \| [0-9.]+x \|' "$md" || fail "no ours/peer ratio row"
grep -q 'without starinfer' "$md" || fail "the report does not say the peer ran on a copy"

# --peer powerinfer: a tiny model in PowerInfer's layout whose vocabulary has
# the two-letter words (synth's merges), and a stand-in for main that checks
# what bench-llm must give it and answers as main does.
"$si" synth -o "$tmp/tiny-pi.gguf" --arch llama-relu --preset tiny --n-vocab 2000 --type q4_0 \
    --predictor 16 --powerinfer --seed 3 --measure 0 >/dev/null 2>&1 ||
    { echo "FAIL: synth --powerinfer"; exit 1; }
cat >"$tmp/pi-main" <<'EOF'
#!/usr/bin/env bash
m='' p='' n=0 t='' temp='' rp='' eos=0
while [ $# -gt 0 ]; do
    case $1 in
    -m) m=$2 ;;
    -p) p=$2 ;;
    -n) n=$2 ;;
    -t) t=$2 ;;
    --temp) temp=$2 ;;
    --repeat-penalty) rp=$2 ;;
    -c | -s) ;;
    --ignore-eos) eos=1; shift; continue ;;
    *) echo "pi-main: unexpected option $1" >&2; exit 1 ;;
    esac
    shift 2
done
[ "$temp" = 0 ] && [ "$rp" = 1.0 ] && [ "$eos" = 1 ] ||
    { echo "pi-main: not greedy without penalty: $temp $rp $eos" >&2; exit 1; }
case $t in 1 | 2) ;; *) echo "pi-main: wrong thread count: $t" >&2; exit 1 ;; esac
case $m in /*) ;; *) echo "pi-main: the model's path is not absolute: $m" >&2; exit 1 ;; esac
[ "$(head -c 4 "$m")" = PWRI ] || { echo "pi-main: $m is not a PWRI file" >&2; exit 1; }
case $p in '<s>'*) ;; *) echo "pi-main: no BOS in front of the prompt: $p" >&2; exit 1 ;; esac
words=$(wc -w <<<"${p#<s>}")
for ((i = 1; i <= n; i++)); do echo "[1] last: [ '':0, 'ab':$((300 + i)) ]"; done >main.log
printf '%s\353\n' "${p#<s>}" # the text, with a byte of a token that is not UTF-8
echo "llama_print_timings: prompt eval time =      10.00 ms / $((words + 1)) tokens" >&2
echo "llama_print_timings:        eval time =      40.00 ms / $((n - 1)) runs" >&2
EOF
chmod +x "$tmp/pi-main"
bl --peer "powerinfer=$tmp/pi-main" --model "$tmp/tiny-pi.gguf" --prompts 4 -n 4 -r 2 \
    --threads 1,2 >"$tmp/o" 2>"$tmp/e" || fail "bench-llm --peer powerinfer: $(tail -n 3 "$tmp/e")"
md=$(grep '\.md$' "$tmp/o")
cat "$md"
case $md in *-powerinfer.md) ;; *) fail "the report is not named *-powerinfer.md: $md" ;; esac
grep -q '^# starinfer vs PowerInfer' "$md" || fail "the report's title does not name PowerInfer"
for t in 1 2; do
    grep -Eq "^\| tiny-pi \| predictor, KV f16 \| 4 \| $t \| starinfer \| [0-9.]+ \|" "$md" ||
        fail "no starinfer predictor row at $t threads"
    grep -Eq "^\| tiny-pi \| predictor, KV f16 \| 4 \| $t \| PowerInfer \| 400.0 \| 100.00 \| - \|" "$md" ||
        fail "PowerInfer's row at $t threads is not its figures"
    grep -Eq "^\| tiny-pi \| predictor, KV f16 \| 4 \| $t \| [0-9.]+x \| [0-9.]+x \|" "$md" ||
        fail "no starinfer/PowerInfer ratio row at $t threads"
done
grep -q 'repeat-penalty 1.0' "$md" || fail "the report does not give PowerInfer's command"
grep -q 'memory bandwidth (the roofline) with 1 thread: ' "$md" ||
    fail "no roofline per thread count"

# The real PowerInfer, where it is built.
if [ -n "$pi_main" ]; then
    bl --peer "powerinfer=$pi_main" --model "$tmp/tiny-pi.gguf" --prompts 8 -n 4 -r 1 \
        --threads 1 >"$tmp/o" 2>"$tmp/e" ||
        fail "bench-llm with PowerInfer's main: $(tail -n 3 "$tmp/e")"
    md=$(grep '\.md$' "$tmp/o")
    grep -Eq '^\| tiny-pi \| predictor, KV f16 \| 8 \| PowerInfer \| [0-9.]+ \| [0-9.]+ \|' "$md" ||
        fail "no row of PowerInfer's own figures"
    grep -E '^\| tiny-pi \| predictor, KV f16 \| 8 \| [0-9.]+x' "$md" ||
        fail "no ratio row with PowerInfer's main"
    echo "ok: --peer powerinfer with PowerInfer's main ($pi_main)"
else
    echo "SKIP (this part): PowerInfer is not built (tools/build-peer --powerinfer SRC, or" \
        "set POWERINFER_MAIN): --peer powerinfer checked with a stand-in only"
fi

[ "$failures" = 0 ] || { echo "$failures failures"; exit 1; }
echo "all bench-llm checks passed"
