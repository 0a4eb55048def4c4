#!/usr/bin/env bash
# Keeps README.md's captured --trace output true (section "See it"). Each capture
# is a "<!-- trace-capture -->" line followed by a ```text block: its first line
# is "$ COMMAND", the rest what COMMAND writes to stderr (the trace; stdout, the
# generated text, is dropped). The commands are run again with ./kvt and their
# output compared line for line: a difference fails, with the diff.
#   bash .ci/see-it.sh            check (make walkthrough runs it)
#   bash .ci/see-it.sh --update   write today's output into README.md instead
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# split README.md: capture k's command in $tmp/k.cmd, its text in $tmp/k.want
awk -v dir="$tmp" '
  /^<!-- trace-capture -->$/ { armed = 1; next }
  armed && /^```text$/ { armed = 0; inblock = 1; first = 1; k++; next }
  inblock && /^```$/ { inblock = 0; next }
  inblock && first { sub(/^\$ /, ""); print > (dir "/" k ".cmd"); printf "" > (dir "/" k ".want"); first = 0; next }
  inblock { print >> (dir "/" k ".want") }
' README.md
n=$(ls "$tmp"/*.cmd 2>/dev/null | wc -l)
[ "$n" -gt 0 ] || { echo "see-it: no <!-- trace-capture --> blocks found in README.md"; exit 1; }
fail=0
for k in $(seq 1 "$n"); do
  cmd=$(cat "$tmp/$k.cmd")
  OMP_WAIT_POLICY=passive timeout 120 bash -c "$cmd" 2> "$tmp/$k.got" > /dev/null || {
    echo "FAIL see-it capture $k: '$cmd' exited with status $?"; fail=1; continue; }
  if cmp -s "$tmp/$k.want" "$tmp/$k.got"; then
    echo "PASS see-it capture $k: README shows what '$cmd' prints today ($(wc -l < "$tmp/$k.got") lines)"
  elif [ "${1:-}" = "--update" ]; then
    echo "UPDATE see-it capture $k: README.md gets what '$cmd' prints today"
  else
    echo "FAIL see-it capture $k: README differs from what '$cmd' prints today (- README, + today;"
    echo "     bash .ci/see-it.sh --update writes it in, then reread the sentences around it):"
    diff -u "$tmp/$k.want" "$tmp/$k.got" | tail -n +3 | head -40
    fail=1
  fi
done
if [ "${1:-}" = "--update" ] && [ $fail = 0 ]; then # each block's text replaced by the fresh output of its command
  awk -v dir="$tmp" '
    /^<!-- trace-capture -->$/ { armed = 1; print; next }
    armed && /^```text$/ { armed = 0; inblock = 1; first = 1; k++; print; next }
    inblock && /^```$/ { inblock = 0; while ((getline l < (dir "/" k ".got")) > 0) print l; print; next }
    inblock && first { first = 0; print; next }
    inblock { next }
    { print }
  ' README.md > "$tmp/README.new" && cp "$tmp/README.new" README.md
  exit 0
fi
exit $fail
