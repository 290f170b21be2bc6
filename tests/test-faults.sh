#!/usr/bin/env bash
# test-faults.sh - faults from outside (issue 22, item 4): every file writer
# (synth, convert --bundle/--split, profile and its --plot, place,
# train-predictor and its --samples) under a full disk and under a kill
# mid-write; a flash store cut or written over while a run reads it; StarPU
# without workers or with bad environment values; a VRAM budget below the
# engine's reserve.  Each ends with one line on stderr and a non-zero exit,
# and no file at the output's name that was not there before (a file that was
# stays byte for byte).
#
# A full disk is RLIMIT_FSIZE (`ulimit -f`) with SIGXFSZ ignored, so write()
# fails with EFBIG as it would with ENOSPC; a kill mid-write is the same limit
# with SIGXFSZ at its default, which kills the writer at that write.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export STARPU_NCPU=${STARPU_NCPU:-2}
export STARPU_HOME=$tmp/starpu-home # StarPU's own files never meet the limit below
mkdir -p "$STARPU_HOME" "$tmp/out"

dims=(--n-embd 256 --n-ff 1024 --n-head 4 --n-head-kv 4 --n-layer 2)
"$si" synth -o "$tmp/m.gguf" --arch llama-relu --type f16 "${dims[@]}" --predictor 64 --seed 3 \
    >/dev/null 2>&1 || fail "synth"
for i in $(seq 1 80); do printf 'The quick brown fox %d jumps over the lazy dog. ' "$i"; done >"$tmp/text.txt"
"$si" profile -m "$tmp/m.gguf" -f "$tmp/text.txt" -o "$tmp/p.gguf" -c 128 -n 300 >/dev/null 2>&1 ||
    fail "profile"

# writer NAME KIB OUTPUT ARGS...: starinfer ARGS under a KIB limit, both ways.
writer() {
    local name=$1 kib=$2 out=$3 rc
    shift 3
    for pre in none old; do
        rm -f "$out" "$out".tmp.* "$tmp"/out/*
        [ "$pre" = old ] && printf 'the file that was there\n' >"$out"
        # Full disk: a clean error.
        (trap '' XFSZ; ulimit -f "$kib"; exec "$si" "$@") >"$tmp/stdout" 2>"$tmp/err"
        rc=$?
        [ "$rc" != 0 ] || fail "$name, full disk: exit 0"
        [ "$(wc -l <"$tmp/err")" = 1 ] || fail "$name, full disk: $(wc -l <"$tmp/err") lines: $(cat "$tmp/err")"
        grep -qi 'too large\|write' "$tmp/err" || fail "$name, full disk: the line does not say: $(cat "$tmp/err")"
        if [ "$pre" = old ]; then
            [ "$(cat "$out")" = 'the file that was there' ] || fail "$name, full disk: the old file changed"
        else
            [ ! -e "$out" ] || fail "$name, full disk: $out left behind"
        fi
        ls "$out".tmp.* >/dev/null 2>&1 && fail "$name, full disk: a temporary file left: $(ls "$out".tmp.*)"
        [ "$pre" = none ] && echo "ok: $name, full disk -> exit $rc: $(cat "$tmp/err")"
        # Killed mid-write (SIGXFSZ): nothing under the output's name.
        (ulimit -f "$kib"; exec "$si" "$@") >"$tmp/stdout" 2>"$tmp/err"
        rc=$?
        [ "$rc" = 153 ] || fail "$name, killed: exit $rc, expected 153 (SIGXFSZ): $(cat "$tmp/err")"
        if [ "$pre" = old ]; then
            [ "$(cat "$out")" = 'the file that was there' ] || fail "$name, killed: the old file changed"
        else
            [ ! -e "$out" ] || fail "$name, killed: $out left behind"
        fi
        # What the kill left is a temporary name that no reader takes for valid.
        for t in "$out".tmp.*; do
            [ -e "$t" ] || continue
            "$si" info --no-workers "$t" >/dev/null 2>&1 && fail "$name, killed: $t loads as valid"
        done
        [ "$pre" = none ] && echo "ok: $name, killed mid-write -> exit $rc, no $out"
    done
}

writer synth 256 "$tmp/out/s.gguf" synth -o "$tmp/out/s.gguf" --arch llama-relu --type f16 "${dims[@]}" --seed 4
writer "convert --bundle" 256 "$tmp/out/m.flash" convert -m "$tmp/m.gguf" --bundle -o "$tmp/out/m.flash"
writer "convert --split" 256 "$tmp/out/m.split" convert -m "$tmp/m.gguf" --split -o "$tmp/out/m.split"
writer profile 4 "$tmp/out/p.gguf" profile -m "$tmp/m.gguf" -f "$tmp/text.txt" -o "$tmp/out/p.gguf" -c 128 -n 200
writer "profile --plot" 12 "$tmp/out/p.svg" profile -m "$tmp/m.gguf" -f "$tmp/text.txt" -o "$tmp/out/p2.gguf" \
    --plot "$tmp/out/p.svg" -c 128 -n 200
writer place 4 "$tmp/out/m.gpuidx" place -m "$tmp/m.gguf" --profile "$tmp/p.gguf" --vram-budget 34M \
    --cpu-bw 20 --gpu-bw 1000 --h2d-bw 25 --h2d-lat 10 --t-sync 0.5 -o "$tmp/out/m.gpuidx"
writer train-predictor 64 "$tmp/out/t.gguf" train-predictor -m "$tmp/m.gguf" -f "$tmp/text.txt" \
    -o "$tmp/out/t.gguf" -n 300 -c 128 --epochs 1

# The flash store cut, or written over, while a run reads it: one line, and
# the answer printed so far stays.  A store replaced by a rename is not an
# error: the run goes on reading the file it opened.
"$si" convert -m "$tmp/m.gguf" --bundle -o "$tmp/m.flash" >/dev/null 2>&1 || fail "convert"
flash_fault() { # MODE NAME COMMAND-ON-THE-STORE...
    local mode=$1 name="$1: $2" pid rc i
    shift 2
    cp "$tmp/m.flash" "$tmp/run.flash"
    rm -f "$tmp/gen" # the last run's answer must not count as this one's
    "$si" generate -m "$tmp/m.gguf" --sparsity "$mode" --flash-store "$tmp/run.flash" --flash-window 0 \
        -n 4000 --ignore-eos -p hi >"$tmp/gen" 2>"$tmp/err" &
    pid=$!
    for ((i = 0; i < 300; i++)); do
        [ "$(wc -c <"$tmp/gen" 2>/dev/null || echo 0)" -gt 20 ] && break
        sleep 0.1
    done
    "$@"
    wait "$pid"
    rc=$?
    [ "$rc" = 1 ] || fail "flash store $name: exit $rc, expected 1: $(tail -n 2 "$tmp/err")"
    [ "$(grep -c 'starinfer: error' "$tmp/err")" = 1 ] && grep -q 'changed while the run read it' "$tmp/err" ||
        fail "flash store $name: $(cat "$tmp/err")"
    [ "$(wc -c <"$tmp/gen")" -gt 20 ] || fail "flash store $name: the answer so far is gone"
    echo "ok: flash store $name mid-run -> $(grep 'starinfer: error' "$tmp/err")"
}
flash_fault gate cut truncate -s 100000 "$tmp/run.flash"
flash_fault gate "written over" dd if=/dev/zero of="$tmp/run.flash" bs=4096 seek=8 count=4 conv=notrunc status=none
# predictor mode: two ffn_cold tasks wait for the failed reads, one line
flash_fault predictor cut truncate -s 100000 "$tmp/run.flash"
cp "$tmp/m.flash" "$tmp/run.flash"
"$si" generate -m "$tmp/m.gguf" --sparsity gate --flash-store "$tmp/run.flash" --flash-window 0 -n 24 \
    --ignore-eos --temp 0 -p hi >"$tmp/want" 2>/dev/null || fail "flash run"
"$si" generate -m "$tmp/m.gguf" --sparsity gate --flash-store "$tmp/run.flash" --flash-window 0 -n 24 \
    --ignore-eos --temp 0 -p hi >"$tmp/gen" 2>"$tmp/err" &
pid=$!
cp "$tmp/m.flash" "$tmp/new.flash" && mv "$tmp/new.flash" "$tmp/run.flash"
wait "$pid" || fail "flash store replaced by a rename: $(cat "$tmp/err")"
cmp -s "$tmp/want" "$tmp/gen" || fail "flash store replaced by a rename: other tokens"
# A store cut before the run: refused when opened.
head -c 1000000 "$tmp/m.flash" >"$tmp/cut.flash"
"$si" generate -m "$tmp/m.gguf" --sparsity gate --flash-store "$tmp/cut.flash" -n 4 -p hi >/dev/null 2>"$tmp/err"
rc=$?
[ "$rc" = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q 'cut.flash: truncated' "$tmp/err" ||
    fail "a cut store: exit $rc: $(cat "$tmp/err")"
echo "ok: a cut store -> $(cat "$tmp/err")"

# StarPU: no worker, bad values.
expect_env() { # NEEDLE VAR=VALUE...
    local needle=$1 rc
    shift
    env "$@" "$si" generate -m "$tmp/m.gguf" -n 2 -p hi >/dev/null 2>"$tmp/err"
    rc=$?
    [ "$rc" = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -qF -- "$needle" "$tmp/err" ||
        fail "$*: exit $rc: $(cat "$tmp/err")"
    echo "ok: $* -> $(cat "$tmp/err")"
}
expect_env "StarPU found no worker" STARPU_NCPU=0 STARPU_NCUDA=0
expect_env "STARPU_NCPU=-1: a worker count must be a whole number" STARPU_NCPU=-1
expect_env "STARPU_NCPU=two: a worker count" STARPU_NCPU=two
expect_env "STARPU_NCUDA=: a worker count" STARPU_NCUDA=
expect_env "STARPU_SCHED=fastest: StarPU has no such scheduler" STARPU_SCHED=fastest

# A VRAM budget below what the engine puts on the GPU besides FFN neurons.
"$si" generate -m "$tmp/m.gguf" --sparsity gate --vram-budget 1K -n 2 -p hi >/dev/null 2>"$tmp/err"
rc=$?
[ "$rc" = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q 'below' "$tmp/err" ||
    fail "--vram-budget 1K: exit $rc: $(cat "$tmp/err")"
echo "ok: --vram-budget 1K -> $(cat "$tmp/err")"

if [ "$failures" -gt 0 ]; then
    echo "$failures failure(s)"
    exit 1
fi
echo "all fault checks passed"
