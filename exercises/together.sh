#!/usr/bin/env bash
# The exercises are meant to compose: a student who has done all five has one
# tree. This applies every reference solution, 1 to 5 in order (2 needs 1), to
# a copy of the tracked files of the working tree, each with `git apply` (no
# fuzz: a patch that no longer fits fails here, not in a student's hands), and
# runs `make test` once on the result. Its exercise checks are not built: the
# point is that the solved engine still passes the whole suite.
#   make exercises-together
set -u
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git ls-files -z | tar --null -T - -c | tar -x -C "$work" || exit 2
for p in exercises/[1-5]-*.patch; do
  if ! (cd "$work" && git apply --check "$p" 2> "$work/apply.log" && git apply "$p"); then
    echo "exercises-together: FAIL: $p does not apply on top of the solutions before it: $(head -1 "$work/apply.log")"
    exit 1
  fi
done
echo "exercises-together: solutions $(ls exercises/[1-5]-*.patch | sed 's|exercises/||; s|\.patch||' | tr '\n' ' ')applied; make test:"
if (cd "$work" && make -s test > test.log 2>&1); then
  echo "exercises-together: PASS: all solutions together: $(tail -1 "$work/test.log")"
else
  grep -E "^FAIL" "$work/test.log" | head -20
  echo "exercises-together: FAIL: make test on the tree with every solution: $(tail -1 "$work/test.log")"
  exit 1
fi
