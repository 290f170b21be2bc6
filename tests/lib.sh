# tests/lib.sh - the opening the shell tests share (sourced, not run):
# $si the starinfer binary under test, $tmp a folder removed on exit, and
# fail(), which counts what the test's last lines turn into its status.
si=${STARINFER:?STARINFER must name the starinfer binary}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
