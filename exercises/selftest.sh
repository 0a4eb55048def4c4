#!/usr/bin/env bash
# Proves the exercise checks can tell done from not done: for each exercise
# with a reference solution, `make exercise N=n` must FAIL on the committed
# tree (git archive HEAD: a student's own solution in the working tree does
# not count) and PASS once exercises/n-*.patch (and the patches it builds on)
# are applied. Then each deliberately wrong solution in exercises/wrong/
# (the reference solution plus one typical mistake: an off-by-one, a path
# left out) must make the check FAIL, by a failed comparison and not by a
# compile error. One verdict line per exercise, then a total. Exercise 6 is
# a measurement (no patch) and is not run here.
set -u
cd "$(dirname "$0")/.."
needs() { case $1 in 2) echo "1 2" ;; *) echo "$1" ;; esac; }
passed=0
for n in 1 2 3 4 5; do
  tmp=$(mktemp -d)
  git archive HEAD | tar -x -C "$tmp"
  verdict=""
  if (cd "$tmp" && make -s exercise N=$n > before.log 2>&1); then
    verdict="FAIL exercise $n: its check passes on the committed tree, before the exercise is done"
  fi
  for k in $(needs $n); do
    if [ -z "$verdict" ] && ! (cd "$tmp" && patch -p1 -s < exercises/$k-*.patch > patch.log 2>&1); then
      verdict="FAIL exercise $n: patch $k does not apply: $(head -1 "$tmp/patch.log")"
    fi
  done
  if [ -z "$verdict" ] && ! (cd "$tmp" && make -s exercise N=$n > after.log 2>&1); then
    verdict="FAIL exercise $n: the check fails with the reference solution: $(tail -1 "$tmp/after.log")"
  fi
  wrong=0
  for w in exercises/wrong/$n-*.patch; do # each on a fresh copy of the solved tree
    [ -z "$verdict" ] && [ -e "$w" ] || continue
    cp -r "$tmp" "$tmp.w"
    if ! (cd "$tmp.w" && patch -p1 -s < "$w" > /dev/null 2>&1); then
      verdict="FAIL exercise $n: the wrong solution $w does not apply"
    elif (cd "$tmp.w" && make -s exercise N=$n > wrong.log 2>&1); then
      verdict="FAIL exercise $n: the check accepts the wrong solution $w"
    elif ! grep -q "[1-9][0-9]* failed" "$tmp.w/wrong.log"; then
      verdict="FAIL exercise $n: the wrong solution $w fails to build or crashes, not on a check: $(tail -1 "$tmp.w/wrong.log")"
    else
      wrong=$((wrong + 1))
    fi
    rm -rf "$tmp.w"
  done
  if [ -z "$verdict" ] && [ "$wrong" -lt 2 ]; then verdict="FAIL exercise $n: fewer than 2 wrong solutions in exercises/wrong/"; fi
  if [ -z "$verdict" ]; then
    verdict="PASS exercise $n: the check fails before ('$(grep -m1 -o 'not done yet.*' "$tmp/before.log")'), passes with the reference solution ($(tail -1 "$tmp/after.log")) and rejects $wrong wrong ones"
    passed=$((passed + 1))
  fi
  echo "$verdict"
  rm -rf "$tmp"
done
echo "exercises-selftest: $passed of 5 exercises PASS"
[ "$passed" = 5 ]
rc=$?; bash exercises/bugs/selftest.sh || rc=1; exit $rc # the bug hunts (README, Bug hunts): each fails a check of make test
