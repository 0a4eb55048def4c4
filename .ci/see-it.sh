#!/usr/bin/env bash
# Keeps the captured --trace output of README.md ("See it"), docs/USAGE.md
# ("Prefix reuse, step by step") and docs/SERVING.md ("Watch it") true. Each capture is a "<!-- trace-capture -->"
# line followed by a ```text block: its first line is "$ COMMAND", the rest
# what COMMAND writes to stderr (the trace; stdout, the generated text, is
# dropped). The commands are run again with ./kvt and their output compared
# line for line: a difference fails, with the diff. A block whose last line is
# "..." shows only the start of the output (what follows is measured time,
# which differs between runs): that many lines are compared, the rest not.
#   bash .ci/see-it.sh            check (make walkthrough runs it)
#   bash .ci/see-it.sh --update   write today's output into the pages instead
set -u
cd "$(dirname "$0")/.."
docs="README.md docs/USAGE.md docs/SERVING.md"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for doc in $docs; do
  d="$tmp/$(echo "$doc" | tr / _)"
  mkdir -p "$d"
  # split the page: capture k's command in $d/k.cmd, its text in $d/k.want
  awk -v dir="$d" '
    /^<!-- trace-capture -->$/ { armed = 1; next }
    armed && /^```text$/ { armed = 0; inblock = 1; first = 1; k++; next }
    inblock && /^```$/ { inblock = 0; next }
    inblock && first { sub(/^\$ /, ""); print > (dir "/" k ".cmd"); printf "" > (dir "/" k ".want"); first = 0; next }
    inblock { print >> (dir "/" k ".want") }
  ' "$doc"
  n=$(ls "$d"/*.cmd 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] || { echo "FAIL see-it: no <!-- trace-capture --> blocks found in $doc"; fail=1; continue; }
  docfail=0
  for k in $(seq 1 "$n"); do
    cmd=$(cat "$d/$k.cmd")
    OMP_WAIT_POLICY=passive timeout 120 bash -c "$cmd" 2> "$d/$k.got" > /dev/null || {
      echo "FAIL see-it $doc capture $k: '$cmd' exited with status $?"; fail=1; docfail=1; continue; }
    if [ "$(tail -n 1 "$d/$k.want")" = "..." ]; then # compare the shown start only
      m=$(($(wc -l < "$d/$k.want") - 1))
      head -n "$m" "$d/$k.got" > "$d/$k.head" && echo "..." >> "$d/$k.head" && mv "$d/$k.head" "$d/$k.got"
    fi
    if cmp -s "$d/$k.want" "$d/$k.got"; then
      echo "PASS see-it $doc capture $k: the page shows what '$cmd' prints today ($(wc -l < "$d/$k.got") lines)"
    elif [ "${1:-}" = "--update" ]; then
      echo "UPDATE see-it $doc capture $k: the page gets what '$cmd' prints today"
    else
      echo "FAIL see-it $doc capture $k: the page differs from what '$cmd' prints today (- page, + today;"
      echo "     bash .ci/see-it.sh --update writes it in, then reread the sentences around it):"
      diff -u "$d/$k.want" "$d/$k.got" | tail -n +3 | head -40
      fail=1
    fi
  done
  if [ "${1:-}" = "--update" ] && [ $docfail = 0 ]; then # each block's text replaced by the fresh output of its command
    awk -v dir="$d" '
      /^<!-- trace-capture -->$/ { armed = 1; print; next }
      armed && /^```text$/ { armed = 0; inblock = 1; first = 1; k++; print; next }
      inblock && /^```$/ { inblock = 0; while ((getline l < (dir "/" k ".got")) > 0) print l; print; next }
      inblock && first { first = 0; print; next }
      inblock { next }
      { print }
    ' "$doc" > "$d/page.new" && cp "$d/page.new" "$doc"
  fi
done
exit $fail
