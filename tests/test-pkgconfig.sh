#!/usr/bin/env bash
# test-pkgconfig.sh - install into a temporary prefix, then build and run a
# program against the installed library through pkg-config, as an embedding
# application would: a small one, then examples/simple.c on a synthetic model.
set -eu
: "${MAKE:=make}" "${PKG_CONFIG:=pkg-config}" "${CC:=cc}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/dest

# A staged install (DESTDIR), as packagers do; the .pc file is then read with
# its prefix moved to the staging folder.
$MAKE install DESTDIR="$dest" >"$tmp/install.log" 2>&1 || { tail -n 20 "$tmp/install.log"; exit 1; }
pc=$(find "$dest" -name starinfer.pc)
[ -n "$pc" ] || { echo "starinfer.pc was not installed"; exit 1; }
prefix=$dest$($PKG_CONFIG --variable=prefix "$pc")
libdir=$prefix/lib
for f in bin/starinfer bin/starinfer-trace-plot include/starinfer.h lib/pkgconfig/starinfer.pc \
    lib/libstarinfer.so lib/libstarinfer.a \
    share/man/man1/starinfer.1; do
    [ -e "$prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done

# The shared library exports the API (si_*) and nothing else: not lp_solve's
# static library, not the internal si__ functions.
exported=$(nm -D --defined-only "$libdir/libstarinfer.so" | awk '{ print $3 }')
others=$(printf '%s\n' "$exported" | grep -v '^si_[a-z]' || true)
[ -z "$others" ] ||
    { echo "libstarinfer.so exports non-API symbols:"; printf '%s\n' "$others" | head; exit 1; }
printf '%s\n' "$exported" | grep -qx si_version ||
    { echo "libstarinfer.so does not export si_version"; exit 1; }
echo "libstarinfer.so exports $(printf '%s\n' "$exported" | wc -l) symbols, all si_*"

cat >"$tmp/embed.c" <<'C'
#include <starinfer.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    printf("%s %s\n", si_version(), si_status_str(SI_E_FORMAT));
    return strcmp(si_status_str(SI_OK), "success") != 0;
}
C
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
flags=$($PKG_CONFIG --define-variable=prefix="$prefix" --cflags --libs starinfer)
echo "pkg-config: $flags"
# shellcheck disable=SC2086
$CC -std=c11 -Wall -Wextra -Werror ${SI_SAN_FLAGS:-} "$tmp/embed.c" -o "$tmp/embed" $flags -Wl,-rpath,"$libdir"
out=$("$tmp/embed")
echo "embed: $out"
want="$($PKG_CONFIG --modversion starinfer) malformed or unsupported file"
[ "$out" = "$want" ] || { echo "expected '$want'"; exit 1; }
LD_LIBRARY_PATH=$libdir "$prefix/bin/starinfer" --version

# examples/simple.c, the API's example, built the same way and run on a tiny
# synthetic model: streamed text, then the statistics line; a missing model
# gives one error line and exit 1.
si=${STARINFER:?STARINFER must name the starinfer binary}
# shellcheck disable=SC2086
$CC -std=c11 -Wall -Wextra -Werror ${SI_SAN_FLAGS:-} "${srcdir:-.}/examples/simple.c" -o "$tmp/simple" \
    $flags -Wl,-rpath,"$libdir"
"$si" synth -o "$tmp/tiny.gguf" --preset tiny --type q4_0 --measure 0 >/dev/null
STARPU_NCPU=2 "$tmp/simple" "$tmp/tiny.gguf" "Once upon a time" >"$tmp/simple.out" 2>"$tmp/simple.err" ||
    { echo "simple failed: $(cat "$tmp/simple.err")"; exit 1; }
cat "$tmp/simple.out"
[ "$(head -c 1 "$tmp/simple.out" | wc -c)" = 1 ] || { echo "simple printed no text"; exit 1; }
grep -q '^prefill: [0-9.]* tokens/s, decode: [0-9.]* tokens/s, 2 CPU + 0 CUDA workers, active FFN neurons on the GPU: 0.0%$' \
    "$tmp/simple.out" || { echo "simple: no statistics line"; exit 1; }
grep -q '^  ffn_cold ' "$tmp/simple.out" || { echo "simple: no ffn_cold tasks"; exit 1; }
rc=0
"$tmp/simple" "$tmp/missing.gguf" hi >"$tmp/simple.out" 2>"$tmp/simple.err" || rc=$?
[ $rc = 1 ] && [ "$(wc -l <"$tmp/simple.err")" = 1 ] &&
    grep -q "missing.gguf: No such file or directory" "$tmp/simple.err" ||
    { echo "simple on a missing model: $(cat "$tmp/simple.err")"; exit 1; }
echo "examples/simple.c built through pkg-config and ran"
