#!/usr/bin/env bash
# test-pkgconfig.sh - install into a temporary prefix, then build and run a
# program against the installed library through pkg-config, as an embedding
# application would.
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
for f in bin/starinfer include/starinfer.h lib/pkgconfig/starinfer.pc lib/libstarinfer.so lib/libstarinfer.a; do
    [ -e "$prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done

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
