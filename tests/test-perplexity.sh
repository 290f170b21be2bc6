#!/usr/bin/env bash
# test-perplexity.sh - `starinfer perplexity` on a real English text shipped by
# Debian (base-files' GPL-3), first two chunks of 512 tokens, against the
# running values llama.cpp's perplexity tool printed for the same chunks
# (tests/data/smollm2-perplexity.txt: [1]16.5546, [2]17.8938).  The whole
# text (14 chunks) is compared in the README; it takes minutes on this path.
set -u
si=${STARINFER:?STARINFER must name the starinfer binary}
text=/usr/share/common-licenses/GPL-3
if [ -z "${STARINFER_TEST_MODEL:-}" ] || [ ! -r "$STARINFER_TEST_MODEL" ]; then
    echo "SKIP: the real model is not available (STARINFER_TEST_MODEL; tools/install-deps fetches it)"
    exit 77
fi
if [ ! -r "$text" ]; then
    echo "SKIP: $text is missing (Debian's base-files ships it)"
    exit 77
fi
out=$("$si" perplexity -m "$STARINFER_TEST_MODEL" -f "$text" -c 512 --chunks 2) || exit 1
echo "$out"
# Each running value within 1% of llama.cpp's (its own flash-attention and
# plain attention paths differ by 1.7% on the first chunk).
echo "$out" | awk '
    /^\[1\]/ { a = $2 } /^\[2\]/ { b = $2 }
    END {
        ra = a / 16.5546 - 1; rb = b / 17.8938 - 1
        printf "chunk 1: %.4f vs llama.cpp 16.5546 (%+.2f%%); chunks 1-2: %.4f vs 17.8938 (%+.2f%%)\n", a, 100 * ra, b, 100 * rb
        if (a == "" || b == "" || ra > 0.01 || ra < -0.01 || rb > 0.01 || rb < -0.01) exit 1
    }'
