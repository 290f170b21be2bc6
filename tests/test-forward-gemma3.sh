#!/usr/bin/env bash
# test-forward-gemma3.sh - the reference forward pass on gemma3-270m (sliding
# windows, QK norm, GeGLU, K-quants) against llama.cpp's greedy continuations
# in tests/data/gemma3-greedy.txt, through the test-forward program.
set -u
if [ -z "${STARINFER_GEMMA_MODEL:-}" ] || [ ! -r "$STARINFER_GEMMA_MODEL" ]; then
    echo "SKIP: gemma3-270m is not available (STARINFER_GEMMA_MODEL; tools/install-deps fetches it)"
    exit 77
fi
exec ./tests/test-forward "${srcdir:-.}/tests/data/gemma3-greedy.txt" STARINFER_GEMMA_MODEL
