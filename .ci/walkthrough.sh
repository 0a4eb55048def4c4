#!/usr/bin/env bash
# Runs the gdb sessions of docs/GDB.md exactly as written, in gdb's batch mode,
# against the -O0 -g build (make debug: ./kvt-debug), and checks what the page
# says gdb prints. Each session is a "<!-- gdb-session: ARGS -->" line followed
# by a ```gdb block, a transcript: "(gdb) COMMAND" lines, and under each
# command the output the page claims for it. Its `## ` section (one session
# per section) is its prose: a code span there that shows a value (one with
# " = " or "{" in it, or a line of the pool map: `seq N [ ...`, `pool [...`,
# `totals: ...`) is a claim about the session's output too, and must name the
# value it quotes as gdb does (`$8 = {0, 1, 2}`), so that it is compared with
# that value and not with whatever else the session printed.
# .ci/gdb_session.py runs the commands (run mode) and then compares every
# claim with gdb's output (check mode; the matching rules are written there).
# Fails if gdb reports an error in any command, if any claim is wrong, or if
# the cache on / cache off sessions (1 and 2) print different logits.
# "<!-- gdb-session bug K: ARGS -->" runs its session against bug hunt K's
# debug binary instead (exercises/bugs/hunt.sh builds it in the scratch folder).
#   bash .ci/walkthrough.sh [FILE]    (default docs/GDB.md)
set -u
cd "$(dirname "$0")/.."
doc=${1:-docs/GDB.md}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# split the page: session n's arguments in n.args, its transcript in n.txt,
# the claims of its section's prose in n.prose
awk -v dir="$tmp" '
  function spans(   s) { # the code spans of a paragraph of prose that show a value
    while (match(para, /`[^`]+`/)) {
      s = substr(para, RSTART + 1, RLENGTH - 2); para = substr(para, RSTART + RLENGTH)
      if (s ~ / = |\{|^seq [0-9]+ \[|^pool \[|^totals: /) print s > (dir "/sec" sec ".prose")
    }
    para = ""
  }
  /^## / { spans(); sec++; next }
  /^<!-- gdb-session( bug [0-9]+)?: / { spans(); n++; a = $0
                          if (match(a, /^<!-- gdb-session bug [0-9]+/)) print substr(a, 22, RLENGTH - 21) > (dir "/" n ".bug")
                          sub(/^<!-- gdb-session( bug [0-9]+)?: /, "", a); sub(/ -->$/, "", a)
                          print a > (dir "/" n ".args"); print n, sec > (dir "/map"); armed = 1; next }
  armed && /^```gdb$/ { armed = 0; inblock = 1; printf "" > (dir "/" n ".txt"); next }
  inblock && /^```$/ { inblock = 0; next }
  inblock { print > (dir "/" n ".txt"); next }
  /^```/ { spans(); fence = !fence; next }
  fence { next }
  /^[ \t]*$/ || /^[-*] / || /^[0-9]+\. / { spans() } # a paragraph or list item ends
  { line = $0; sub(/^[ \t]+/, "", line); para = para (para == "" ? "" : " ") line }
  END { spans() }
' "$doc"
n=$(ls "$tmp"/*.args 2>/dev/null | wc -l)
[ "$n" -gt 0 ] || { echo "walkthrough: no gdb sessions found in $doc"; exit 1; }
fail=0
for i in $(seq 1 "$n"); do
  sec=$(awk -v i="$i" '$1 == i { print $2 }' "$tmp/map")
  [ -f "$tmp/sec$sec.prose" ] && cp "$tmp/sec$sec.prose" "$tmp/$i.prose"
  args=$(cat "$tmp/$i.args") bin=./kvt-debug name=./kvt-debug
  if [ -f "$tmp/$i.bug" ]; then # bug hunt K's debug binary, built once
    k=$(cat "$tmp/$i.bug") && bin=$tmp/bug$k/kvt-debug name="bug $k's kvt-debug"
    [ -x "$bin" ] || bash exercises/bugs/hunt.sh build "$k" "$tmp/bug$k" || { echo "FAIL walkthrough session $i: bug $k"; fail=1; continue; }
  fi
  # shellcheck disable=SC2086
  KVT_GDB_TRANSCRIPT="$tmp/$i.txt" OMP_WAIT_POLICY=passive timeout 120 gdb -q -nx -batch -x .ci/gdb_session.py \
    --args $bin $args > "$tmp/$i.out" 2>&1
  KVT_GDB_CHECK=1 KVT_GDB_TRANSCRIPT="$tmp/$i.txt" KVT_GDB_OUT="$tmp/$i.out" KVT_GDB_PROSE="$tmp/$i.prose" \
    gdb -q -nx -batch -x .ci/gdb_session.py > "$tmp/$i.check" 2>&1
  verdict=$(grep '^\[walkthrough\] claims: ' "$tmp/$i.check")
  if grep -q "Error in sourced command file" "$tmp/$i.out" || ! grep -q '^\[walkthrough\] claims: [0-9]* checked, 0 wrong$' "$tmp/$i.check"; then
    echo "FAIL walkthrough session $i ($name $args): ${verdict#\[walkthrough\] }"
    grep -A3 "Error in sourced command file" "$tmp/$i.out"
    grep -v '^\[walkthrough\] claims: ' "$tmp/$i.check" | head -60
    fail=1
  else
    echo "PASS walkthrough session $i: ${verdict#\[walkthrough\] } ($name $args)"
  fi
done
# sessions 1 and 2 end by printing the logits of the same step with and without the cache
l1=$(grep '^\$[0-9]* = {' "$tmp/1.out" | tail -1 | sed 's/^[^{]*//')
l2=$(grep '^\$[0-9]* = {' "$tmp/2.out" | tail -1 | sed 's/^[^{]*//')
r1=$(echo "$l1" | tr -d '{},' | awk '{for(i=1;i<=NF;i++) printf "%.4f ", $i}')
r2=$(echo "$l2" | tr -d '{},' | awk '{for(i=1;i<=NF;i++) printf "%.4f ", $i}')
if [ -n "$r1" ] && [ "$r1" = "$r2" ]; then echo "PASS walkthrough: cache on and off print the same logits ($r1)"
else echo "FAIL walkthrough: cache on printed $l1, cache off $l2"; fail=1; fi
# README's "The debugger": every function its list of one token's calls names is reached under --plain
# (a name in backticks with no space; the gdb command `run` is not one)
names=$(awk '/^## The debugger/ { f = 1; next } f && /^#/ { f = 0 } f && /^[0-9]+\. /' README.md | grep -o '`[a-z_0-9]*`' | tr -d '`' |
  awk '$0 != "run" && !seen[$0]++')
: > "$tmp/step.gdb"
for n in $names; do # a name gdb does not know would end the script: those are reported below instead
  grep -qE "\<$n\(" kvtransformer.cu cli/*.c cpu/*.c gpu/*.cu || continue
  printf 'tbreak %s\ncommands\nsilent\nprintf "[reached] %s\\n"\ncontinue\nend\n' "$n" "$n" >> "$tmp/step.gdb"
done
printf 'run\n' >> "$tmp/step.gdb"
OMP_WAIT_POLICY=passive timeout 120 gdb -q -nx -batch -x "$tmp/step.gdb" --args ./kvt-debug --plain -n 3 > "$tmp/step.out" 2>&1
missed=""
for n in $names; do grep -q "\[reached\] $n$" "$tmp/step.out" || missed="$missed $n"; done
if [ -z "$names" ]; then echo "FAIL walkthrough: README.md has no function names in the list under \"The debugger\""; fail=1
elif [ -n "$missed" ]; then echo "FAIL walkthrough: README's list of one token's calls names functions gdb never reached with --plain:$missed"; fail=1
else echo "PASS walkthrough: README's list of one token's calls: all $(echo $names | wc -w) functions it names reached with --plain, in gdb"; fi
exit $fail
