#!/usr/bin/env bash
# Runs the gdb sessions of README.md ("Stepping through it in gdb") exactly as
# written, in gdb's batch mode, against the -O0 -g build (make debug: ./kvt-debug). Each
# session is a "<!-- gdb-session: ARGS -->" line followed by a ```gdb block; its
# commands run one by one through .ci/gdb_session.py (which says why). Fails if
# gdb reports an error in any command, if a `call kvt_pool_print` prints no
# pool totals, or if the cache on / cache off sessions print different logits.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0 insess=0 inblock=0
while IFS= read -r line; do
  case "$line" in
    "<!-- gdb-session: "*)
      n=$((n + 1)); a=${line#<!-- gdb-session: }; echo "${a% -->}" > "$tmp/$n.args"
      printf 'set pagination off\nset confirm off\n' > "$tmp/$n.gdb"; insess=1 ;;
    '```gdb') if [ $insess = 1 ]; then inblock=1; fi ;;
    '```') if [ $inblock = 1 ]; then inblock=0; insess=0; fi ;;
    *) if [ $inblock = 1 ]; then echo "$line" >> "$tmp/$n.gdb"; fi ;;
  esac
done < README.md
[ $n -gt 0 ] || { echo "walkthrough: no gdb sessions found in README.md"; exit 1; }
fail=0
for i in $(seq 1 $n); do
  # shellcheck disable=SC2046
  KVT_GDB_CMDS="$tmp/$i.gdb" OMP_WAIT_POLICY=passive timeout 120 gdb -q -batch -x .ci/gdb_session.py \
    --args ./kvt-debug $(cat "$tmp/$i.args") > "$tmp/$i.out" 2>&1
  calls=$(grep -c '^call kvt_pool_print' "$tmp/$i.gdb") maps=$(grep -c '^totals: ' "$tmp/$i.out")
  if grep -q "Error in sourced command file" "$tmp/$i.out" || ! grep -q '^\$1 = ' "$tmp/$i.out" ||
     [ "$maps" != "$calls" ]; then
    echo "FAIL walkthrough session $i (./kvt-debug $(cat "$tmp/$i.args")):"; grep -v "New Thread\|exited\]" "$tmp/$i.out" | tail -15; fail=1
  else
    echo "PASS walkthrough session $i: $(grep -c '^\$[0-9]* = ' "$tmp/$i.out") values printed (./kvt-debug $(cat "$tmp/$i.args"))"
  fi
done
# sessions 1 and 2 end by printing the logits of the same step with and without the cache
l1=$(grep '^\$[0-9]* = {' "$tmp/1.out" | tail -1 | sed 's/^[^{]*//')
l2=$(grep '^\$[0-9]* = {' "$tmp/2.out" | tail -1 | sed 's/^[^{]*//')
r1=$(echo "$l1" | tr -d '{},' | awk '{for(i=1;i<=NF;i++) printf "%.4f ", $i}')
r2=$(echo "$l2" | tr -d '{},' | awk '{for(i=1;i<=NF;i++) printf "%.4f ", $i}')
if [ -n "$r1" ] && [ "$r1" = "$r2" ]; then echo "PASS walkthrough: cache on and off print the same logits ($r1)"
else echo "FAIL walkthrough: cache on printed $l1, cache off $l2"; fail=1; fi
exit $fail
