#!/usr/bin/env bash
# test-man.sh - docs/starinfer.1 is what tools/gen-man makes from the current
# help texts (so the man page lists every command and option), it renders
# without groff warnings (test-pkgconfig.sh checks that `make install` puts
# it in share/man/man1).
set -u
si=${STARINFER:?STARINFER must name the starinfer binary}
src=${srcdir:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bash "$src/tools/gen-man" "$si" >"$tmp/starinfer.1" || { echo "FAIL: tools/gen-man failed"; exit 1; }
if ! diff -u "$src/docs/starinfer.1" "$tmp/starinfer.1" >"$tmp/diff"; then
    head -n 40 "$tmp/diff"
    echo "FAIL: docs/starinfer.1 is stale: run tools/gen-man build/starinfer > docs/starinfer.1"
    exit 1
fi
for c in $("$si" --help | sed -n '/^Commands:/,/^$/s/^  \([a-z][a-z-]*\) .*/\1/p'); do
    grep -q "^\\.SS \"$c\"" "$tmp/starinfer.1" || { echo "FAIL: no section for $c"; exit 1; }
done
if command -v groff >/dev/null; then
    groff -man -ww -z -Tutf8 "$tmp/starinfer.1" 2>"$tmp/warn"
    [ -s "$tmp/warn" ] && { cat "$tmp/warn"; echo "FAIL: groff warnings"; exit 1; }
    groff -man -Tascii -P-bcu "$tmp/starinfer.1" 2>/dev/null | grep -q '^EXIT STATUS' ||
        { echo "FAIL: the rendered page lacks EXIT STATUS"; exit 1; }
else
    echo "note: groff not installed; rendering not checked"
fi
echo "man page current: $(grep -c '^\.SS' "$tmp/starinfer.1") command sections"
