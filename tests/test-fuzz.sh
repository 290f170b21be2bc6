#!/usr/bin/env bash
# test-fuzz.sh - the short fuzz runs: each reader's fuzz target
# (tests/fuzz/fuzz-*.c: GGUF/PWRI, tokenizer and chat templates, profile,
# placement/.gpuidx, flash store) over its seed corpus (tests/fuzz/corpus/,
# written by the library's own writers) and a fixed number of deterministic
# mutations of it, under whatever sanitizers the build has.  Also: the seeds
# are still accepted (a stale corpus fails), an input can be made again with
# --only, and bad flags give one line.  The long coverage-guided runs are
# tools/fuzz (clang's libFuzzer).
set -u
src=${srcdir:-.}
corpus=$src/tests/fuzz/corpus
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The tokenizer target also reads the real vocabularies when they are here.
models=
for m in "${STARINFER_TEST_MODEL:-}" "${STARINFER_GEMMA_MODEL:-}"; do
    [ -n "$m" ] && [ -r "$m" ] && models=${models:+$models:}$m
done
export FUZZ_TOKENIZER_MODELS=$models
[ -n "$models" ] && echo "tokenizer vocabularies: the built ones and $models" ||
    echo "tokenizer vocabularies: the built ones only (STARINFER_TEST_MODEL / STARINFER_GEMMA_MODEL not set)"

# target, mutations, seeds that must be accepted (gguf: 5 of its 12 seeds
# are valid files, the others truncated or broken on purpose)
run() {
    local t=$1 n=$2 min=$3
    local out
    out=$(./tests/fuzz/fuzz-"$t" -n "$n" -s 1 --min-accepted "$min" "$corpus/$t" 2>&1)
    local rc=$?
    echo "$out" | tail -n 5
    [ "$rc" = 0 ] || fail "fuzz-$t: exit $rc"
}
run gguf 200000 5
run tokenizer 100000 7
run profile 40000 2
run gpuidx 40000 2
run flash 6000 2

# A corpus gone stale is caught: the profile target refuses flash stores.
./tests/fuzz/fuzz-profile -n 0 --min-accepted 1 "$corpus/flash" >/dev/null 2>"$(pwd)/tests/logs/fuzz-stale.err"
rc=$?
[ "$rc" = 1 ] && grep -q 'the corpus is stale' tests/logs/fuzz-stale.err ||
    fail "a stale corpus: exit $rc, $(cat tests/logs/fuzz-stale.err)"

# The same input again: --only I --save FILE twice gives the same bytes.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
./tests/fuzz/fuzz-gpuidx --only 1234 --save "$tmp/a" -s 5 "$corpus/gpuidx" >/dev/null &&
    ./tests/fuzz/fuzz-gpuidx --only 1234 --save "$tmp/b" -s 5 "$corpus/gpuidx" >/dev/null &&
    cmp -s "$tmp/a" "$tmp/b" || fail "--only 1234 --save did not make the same input twice"
./tests/fuzz/fuzz-gpuidx --only 1234 --save "$tmp/c" -s 6 "$corpus/gpuidx" >/dev/null
cmp -s "$tmp/a" "$tmp/c" && fail "-s 5 and -s 6 made the same input 1234"

# Bad flags: one line, exit 2.
for args in "-n x" "--bogus 1" "-n" "$tmp/none"; do
    # shellcheck disable=SC2086
    ./tests/fuzz/fuzz-gguf $args >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ "$rc" = 2 ] && [ "$(wc -l <"$tmp/err")" = 1 ] ||
        fail "fuzz-gguf $args: exit $rc, stderr: $(cat "$tmp/err")"
done

if [ "$failures" -gt 0 ]; then
    echo "$failures failure(s)"
    exit 1
fi
echo "all fuzz runs passed"
