#!/usr/bin/env bash
# test-cli.sh - the starinfer CLI: help, version, and one clear error line with
# a non-zero exit for each kind of bad input.  With STARINFER_TEST_MODEL, also
# `starinfer info` on the real model.
set -u
si=${STARINFER:?STARINFER must name the starinfer binary}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

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
grep -q '^starinfer [0-9]' "$tmp/out" || fail "--version prints '$(cat "$tmp/out")'"

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
    "$si" info --no-workers --tensors --kv -m "$model" >"$tmp/out" 2>&1 || fail "info --tensors --kv"
    grep -q 'blk.29.ffn_down.weight' "$tmp/out" || fail "info --tensors lacks blk.29.ffn_down.weight"
    grep -q 'tokenizer.ggml.tokens .*ARRAY' "$tmp/out" || fail "info --kv lacks the vocabulary"
    grep -q '^workers' "$tmp/out" && fail "--no-workers still starts StarPU"
else
    echo "note: STARINFER_TEST_MODEL not set; real-model checks not run"
fi

[ "$failures" = 0 ] || { echo "$failures failures"; exit 1; }
echo "all CLI checks passed"
