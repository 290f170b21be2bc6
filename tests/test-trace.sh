#!/usr/bin/env bash
# test-trace.sh - tools/trace on the engine: an FxT trace of a few decode
# steps on a tiny synthetic model becomes paje.trace (with per-layer task
# names) and a PNG picture.
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
for name in '"attn_qkv_L1.1"' '"attn_core_L1"' '"attn_o_L0.0"' '"attn_out_L1"' '"pred_L1"' \
    '"ffn_cold_L1.0"' '"merge_L0"' '"embed"' '"lm_head.1"'; do
    grep -q "$name" "$tmp/tr/paje.trace" || { echo "FAIL: no task named $name in paje.trace"; exit 1; }
done
file "$tmp/tr/trace.png" 2>/dev/null | grep -q 'PNG image' || head -c 8 "$tmp/tr/trace.png" | grep -q PNG ||
    { echo "FAIL: trace.png is not a PNG"; exit 1; }
echo "trace, paje file and picture made; task names present"
