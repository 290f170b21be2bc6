#!/usr/bin/env bash
# test-bench-llm.sh - tools/bench-llm, the `make bench` driver, on a tiny
# synthetic model: the Markdown report (machine, command, a row per engine,
# mode and prompt length, the ratio table), the JSON beside it and the three
# PNG plots; the peer's side through a stand-in for llama-peer (which must be
# given the same thread count and a copy of the model without starinfer's
# extra tensors); one-line errors.  No real peer, no big model, no speed
# checked (that is `make bench`).
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
# A starinfer whose JSON lacks the figures: named, not a crash.
printf '#!/bin/sh\ncase "$*" in *--help*) echo "--json";; *) echo "{}";; esac\n' >"$tmp/bad-si"
chmod +x "$tmp/bad-si"
STARINFER=$tmp/bad-si expect_error "starinfer bench --json lacks runs" \
    --no-peer --model "$tmp/tiny.gguf" -n 2 -r 1

python3 "$driver" --help >"$tmp/o" || fail "--help exits non-zero"
for opt in --quick --workloads --prompts --threads --out --peer --no-peer --gpu; do
    grep -q -- "$opt" "$tmp/o" || fail "--help does not document $opt"
done

# starinfer alone, dense, two prompt lengths.
bl --no-peer --model "$tmp/tiny.gguf" --prompts 4,6 -n 4 -r 1 --threads 2 >"$tmp/o" 2>"$tmp/e" ||
    fail "bench-llm --no-peer: $(tail -n 3 "$tmp/e")"
md=$(grep '\.md$' "$tmp/o")
[ -s "$md" ] || fail "no report: $(cat "$tmp/o")"
cat "$md"
for p in 4 6; do
    grep -Eq "^\| tiny \| dense \| $p \| starinfer \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|" "$md" ||
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
grep -Eq '^\| tiny \| gate \| 4 \| starinfer \|' "$md" || fail "no starinfer gate row"
peer_row='^\| tiny \| dense \| 4 \| llama.cpp \| 400.0 \| 100.00 \| 10.00 \| 10.00 \| 10.00 \| 1 \|'
grep -Eq "$peer_row" "$md" || fail "the peer's row is not its figures"
grep -Eq '^\| tiny \| gate \| 4 \| [0-9.]+x \| [0-9.]+x \|' "$md" || fail "no ours/peer ratio row"
grep -q 'without starinfer' "$md" || fail "the report does not say the peer ran on a copy"

[ "$failures" = 0 ] || { echo "$failures failures"; exit 1; }
echo "all bench-llm checks passed"
