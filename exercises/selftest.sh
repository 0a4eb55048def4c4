#!/usr/bin/env bash
# Proves the exercise checks can tell done from not done: for each exercise
# with a reference solution, `make exercise N=n` must FAIL on a copy of the
# unmodified tree and PASS once exercises/n-*.patch (and the patches it builds
# on) are applied. Exercise 6 is a measurement (no patch) and is not run here.
set -u
cd "$(dirname "$0")/.."
needs() { case $1 in 2) echo "1 2" ;; *) echo "$1" ;; esac; }
fail=0
for n in 1 2 3 4 5; do
  tmp=$(mktemp -d)
  git ls-files -z | xargs -0 cp --parents -t "$tmp"
  if (cd "$tmp" && make -s exercise N=$n > before.log 2>&1); then
    echo "FAIL exercise $n: its check passes before the exercise is done"; fail=1
  fi
  for k in $(needs $n); do
    if ! (cd "$tmp" && patch -p1 -s < exercises/$k-*.patch); then echo "FAIL exercise $n: patch $k does not apply"; fail=1; fi
  done
  if (cd "$tmp" && make -s exercise N=$n > after.log 2>&1); then
    echo "PASS exercise $n: the check fails before ('$(grep -m1 -o 'not done yet.*' "$tmp/before.log")') and passes with the reference solution ($(tail -1 "$tmp/after.log"))"
  else
    echo "FAIL exercise $n: the check fails with the reference solution:"; tail -5 "$tmp/after.log"; fail=1
  fi
  rm -rf "$tmp"
done
exit $fail
