#!/usr/bin/env bash
# Proves the exercise checks can tell done from not done: for each exercise
# with a reference solution, `make exercise N=n` must FAIL on the committed
# tree (git archive HEAD: a student's own solution in the working tree does
# not count) and PASS once exercises/n-*.patch (and the patches it builds on)
# are applied. One verdict line per exercise, then a total. Exercise 6 is a
# measurement (no patch) and is not run here.
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
  if [ -z "$verdict" ]; then
    if (cd "$tmp" && make -s exercise N=$n > after.log 2>&1); then
      verdict="PASS exercise $n: the check fails before ('$(grep -m1 -o 'not done yet.*' "$tmp/before.log")') and passes with the reference solution ($(tail -1 "$tmp/after.log"))"
      passed=$((passed + 1))
    else
      verdict="FAIL exercise $n: the check fails with the reference solution: $(tail -1 "$tmp/after.log")"
    fi
  fi
  echo "$verdict"
  rm -rf "$tmp"
done
echo "exercises-selftest: $passed of 5 exercises PASS"
[ "$passed" = 5 ]
