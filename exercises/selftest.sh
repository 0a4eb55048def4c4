#!/usr/bin/env bash
# Proves the exercise checks can tell done from not done: for each exercise
# with a reference solution, `make exercise N=n` must FAIL on the pristine
# tree and PASS once exercises/n-*.patch (and the patches it builds on) are
# applied. Then each deliberately wrong solution in exercises/wrong/ (the
# reference solution plus one typical mistake: an off-by-one, a path left
# out, a kernel never launched, a flag never added) must make the check FAIL,
# by a failed check and not by a compile error. One verdict line per
# exercise, then a total. Exercise 6 is a measurement (no patch) and is not
# run here.
#
# The pristine tree is a commit, never the working tree nor a student's own
# commits (a committed solution would make every "fails before" step pass):
#   1. BASE=<commit> when given (make exercises-selftest BASE=...);
#   2. else where HEAD left its upstream branch: git merge-base HEAD @{upstream};
#   3. else where HEAD left origin's default branch (origin/HEAD, origin/main,
#      origin/master);
#   4. else HEAD itself.
# Whichever it is, a commit whose tree already holds a reference solution
# (that solution's patch applies in reverse) is refused, with the way out.
# Everything used comes from that commit: test.c, the Makefile, the patches.
set -u
cd "$(dirname "$0")/.."
needs() { case $1 in 2) echo "1 2" ;; *) echo "$1" ;; esac; }

# The commit to test, and why that one.
base="" why=""
if [ -n "${BASE:-}" ]; then
  base=$(git rev-parse -q --verify "$BASE^{commit}") || { echo "exercises-selftest: BASE=$BASE is not a commit"; exit 2; }
  why="BASE=$BASE"
elif up=$(git rev-parse -q --abbrev-ref --symbolic-full-name '@{upstream}' 2>/dev/null) &&
     base=$(git merge-base HEAD '@{upstream}' 2>/dev/null); then
  why="where HEAD left its upstream $up"
else
  base=""
  for r in origin/HEAD origin/main origin/master; do
    if git rev-parse -q --verify "$r^{commit}" > /dev/null && base=$(git merge-base HEAD "$r" 2>/dev/null); then
      why="where HEAD left $r"
      break
    fi
    base=""
  done
  if [ -z "$base" ]; then base=$(git rev-parse HEAD) && why="HEAD (no upstream, no origin)" || exit 2; fi
fi
echo "exercises-selftest: testing commit $(git rev-parse --short "$base"), $why (not the working tree, nor commits made"
echo "  since): $(git log -1 --format=%s "$base" | cut -c1-100)"

# Refuse a tree that already holds a solution.
tmp=$(mktemp -d)
git archive "$base" | tar -x -C "$tmp"
solved=""
for n in 1 2 3 4 5; do
  p=$(ls "$tmp"/exercises/$n-*.patch 2>/dev/null | head -1)
  [ -n "$p" ] && (cd "$tmp" && patch -p1 -R -f -s --dry-run < "$p" > /dev/null 2>&1) && solved="$solved $n"
done
rm -rf "$tmp"
if [ -n "$solved" ]; then
  echo "exercises-selftest: that commit already holds the solution of exercise(s)$solved (its patch applies in"
  echo "  reverse there): name the commit your work started from, e.g. make exercises-selftest BASE=<commit>"
  exit 2
fi

# One exercise's whole check, its lines on stdout. Two run at a time: most of
# the time goes to single-threaded compiles and to emulated kernels, whose
# barriers leave a core idle.
one_exercise() {
  local n=$1 tmp verdict wrong w name missing
  tmp=$(mktemp -d)
  git archive "$base" | tar -x -C "$tmp"
  verdict=""
  if (cd "$tmp" && make -s exercise N=$n > before.log 2>&1); then
    verdict="FAIL exercise $n: its check passes on the pristine tree, before the exercise is done"
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
  for w in "$tmp"/exercises/wrong/$n-*.patch; do # each on a fresh copy of the solved tree
    [ -z "$verdict" ] && [ -e "$w" ] || continue
    name=exercises/wrong/${w##*/}
    cp -r "$tmp" "$tmp.w"
    if ! (cd "$tmp.w" && patch -p1 -s < "$w" > /dev/null 2>&1); then
      verdict="FAIL exercise $n: the wrong solution $name does not apply"
    elif (cd "$tmp.w" && make -s exercise N=$n > wrong.log 2>&1); then
      verdict="FAIL exercise $n: the check accepts the wrong solution $name"
    elif ! grep -q "[1-9][0-9]* failed" "$tmp.w/wrong.log"; then
      verdict="FAIL exercise $n: the wrong solution $name fails to build or crashes, not on a check: $(tail -1 "$tmp.w/wrong.log")"
    else
      wrong=$((wrong + 1))
      echo "  exercise $n rejects ${w##*/}: $(grep -m1 '^FAIL' "$tmp.w/wrong.log" | cut -c1-150)"
    fi
    rm -rf "$tmp.w"
  done
  if [ -z "$verdict" ] && [ "$wrong" -lt 2 ]; then verdict="FAIL exercise $n: fewer than 2 wrong solutions in exercises/wrong/"; fi
  if [ -z "$verdict" ]; then
    missing=$(sed -n '/not done yet/{n;p;q}' "$tmp/before.log" | sed 's/^[^ ]*: //')
    verdict="PASS exercise $n: the check fails before (not done yet: $missing), passes with the reference solution ($(tail -1 "$tmp/after.log")) and rejects $wrong wrong ones"
  fi
  echo "$verdict"
  rm -rf "$tmp"
}
out=$(mktemp -d)
for n in 1 2 3 4 5; do
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n; done
  one_exercise "$n" > "$out/$n" 2>&1 &
done
wait
cat "$out"/1 "$out"/2 "$out"/3 "$out"/4 "$out"/5
passed=$(cat "$out"/* | grep -c '^PASS exercise')
rm -rf "$out"
echo "exercises-selftest: $passed of 5 exercises PASS"
[ "$passed" = 5 ]
rc=$?; bash exercises/bugs/selftest.sh || rc=1; exit $rc # the bug hunts (README, Bug hunts): each fails a check of make test
