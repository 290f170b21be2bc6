#!/usr/bin/env bash
# bench/gpu-prepare.sh: everything bench/gpu-session.sh needs, made here (the
# build machine, no GPU) and packed into device.tar.xz for the device tool.
#
#   bench/gpu-prepare.sh          (from the repository root, after tools/setup)
#
# Then the device tool, with carry ["device.tar.xz"] and timeout_s 600:
#   tar -xJf device.tar.xz && bench/gpu-session.sh
#
# The 13B-shaped model is made here from synth's seed as gpu-session.sh
# makes it there (the same bytes: synth is reproducible), then its
# activation profile and its predictors (rank 64, Q4_0, trained on 4,096
# tokens of GPL-3: 27 MB, held-out recall 0.80), which travel as a predictor
# file whose fingerprint refuses any other weights. The model and what is
# made from it stay in $GPU_PREP_DIR (default ~/.cache/starinfer/gpu-prep,
# 9 GB): a second run only packs. Times on the 2-core VM: synth 2.5 min,
# profile 2-3 min, train-predictor 24 min (18 of them running the model
# over the corpus), device-test prepare 1 min, packing 1-2 min.
#
# llama.cpp's builds go along when tools/build-peer has made them (its cache):
# the CPU one is built here if missing (about 10 min); the CUDA one
# (`tools/build-peer --cuda --cuda-arch 90`, over an hour on 2 cores) only
# if already built. Without it gpu-session.sh skips the llama.cpp CUDA row.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cache=${STARINFER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/starinfer}
W=${GPU_PREP_DIR:-$cache/gpu-prep}
SI=$root/build/starinfer
[ -x "$SI" ] || { echo "gpu-prepare: build/starinfer is missing (run tools/setup)" >&2; exit 1; }
mkdir -p "$W"
corpus=/usr/share/common-licenses/GPL-3
[ -r $corpus ] || { echo "gpu-prepare: $corpus is missing (Debian's base-files)" >&2; exit 1; }
step() { echo "gpu-prepare: [$(date +%H:%M:%S)] $*"; }

# The model: the line gpu-session.sh runs there.
if [ ! -s "$W/13b.gguf" ]; then
    step "synth, the 13B shape (9 GB)"
    "$SI" synth -o "$W/13b.gguf.tmp" --preset 13b --arch llama-relu --type q4_0 --sparsity 0.9 \
        --measure 0 --predictor 64
    mv "$W/13b.gguf.tmp" "$W/13b.gguf"
fi
if [ ! -s "$W/13b.prof" ]; then
    step "profile (256 tokens of GPL-3)"
    "$SI" profile -m "$W/13b.gguf" -f $corpus -n 256 -c 256 -o "$W/13b.prof.tmp"
    mv "$W/13b.prof.tmp" "$W/13b.prof"
fi
if [ ! -s "$W/13b.pred" ]; then
    step "train-predictor (rank 64, Q4_0, 4096 tokens; about 24 min)"
    "$SI" train-predictor -m "$W/13b.gguf" -f $corpus -o "$W/13b.pred.tmp" -n 4096 -c 512 \
        --rank 64 --epochs 4 -t q4_0 --predictors-only | tee "$W/13b.pred.txt"
    mv "$W/13b.pred.tmp" "$W/13b.pred"
fi

step "tools/device-test prepare"
tools/device-test prepare
cp $corpus .device/gpl.txt
cp "$W/13b.prof" .device/13b.prof
cp "$W/13b.pred" .device/13b.pred
mkdir -p .device/peer
cpu_peer=$(tools/build-peer)
cp "$cpu_peer" .device/peer/
cuda_peer=$(dirname "$cpu_peer")/llama-peer-cuda
if [ -x "$cuda_peer" ]; then
    cp "$cuda_peer" .device/peer/
else
    step "no CUDA peer built ($cuda_peer): gpu-session.sh skips llama.cpp's CUDA row"
fi
strip --strip-unneeded .device/bin/* .device/tests/test-* .device/lib/*.so* .device/peer/* \
    2>/dev/null || true
step "packing .device ($(du -sh .device | cut -f1))"
tar -cJf device.tar.xz .device
size=$(stat -c %s device.tar.xz)
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
echo "gpu-prepare: device.tar.xz $((size / 1048576)) MiB, the tracked tree $((tree / 1048576)) MiB" \
    "(the device tool carries 64 MiB in all)"
[ $((size + tree)) -le $((64 * 1048576)) ] || {
    echo "gpu-prepare: over the device tool's 64 MiB" >&2
    exit 1
}
