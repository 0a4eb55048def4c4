#!/usr/bin/env bash
# Proves the bug hunts work (README "Bug hunts"): for each exercises/bugs/N.patch,
# on a copy of the committed tree (exercises/bugs/hunt.sh build: git archive HEAD),
#   - the patch applies and the bugged tree builds;
#   - `make test` on it fails at least one check, by a failed comparison (a
#     FAIL line and "N failed" with N >= 1; not a crash): the suite runs with
#     KVT_TEST_FIRST_FAIL=1, so it stops at the first failed check;
#   - `make bughunt N=n ANSWER=...` accepts the right function (read from the
#     encoded answers) and rejects a wrong one (the next hunt's answer: a real
#     function of the tree; no answer is written here or printed in clear).
# One PASS or FAIL line per hunt, then the total and the time it took.
set -u
cd "$(dirname "$0")/../.."
start=$SECONDS
hunts=$(ls exercises/bugs/[0-9]*.patch | sed 's|.*/||; s|\.patch$||' | sort -n)
count=$(echo "$hunts" | wc -w)
right_of() { grep "^$1 " exercises/bugs/answers | cut -d' ' -f2 | base64 -d | head -1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
for n in $hunts; do
  t0=$SECONDS d=$tmp/$n verdict=""
  next=$((n % count + 1)) right=$(right_of "$n")
  wrong=$(right_of "$next")
  if [ -z "$right" ] || [ "$right" = "$wrong" ]; then
    verdict="FAIL bug $n: no answer in exercises/bugs/answers (or the same as bug $next's)"
  elif ! bash exercises/bugs/hunt.sh build "$n" "$d" > "$tmp/build$n.log" 2>&1; then
    verdict="FAIL bug $n: $(head -2 "$tmp/build$n.log" | tr '\n' ' ')"
  else
    (cd "$d" && KVT_TEST_FIRST_FAIL=1 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} ./test_kvt ./kvt > suite.log 2>&1)
    rc=$? last=$(tail -1 "$d/suite.log") first=$(grep -m1 '^FAIL ' "$d/suite.log" | cut -c1-110)
    if [ $rc = 0 ]; then verdict="FAIL bug $n: make test passes with the bug ($last)"
    elif [ -z "$first" ] || ! echo "$last" | grep -q " [1-9][0-9]* failed"; then
      verdict="FAIL bug $n: the suite stops without a failed check (exit $rc): $last"
    elif ! bash exercises/bugs/hunt.sh "$n" "$right" | head -1 | grep -q '^RIGHT'; then
      verdict="FAIL bug $n: ANSWER=<the right function> is not accepted"
    elif bash exercises/bugs/hunt.sh "$n" "$wrong" > "$tmp/wrong$n.log" || ! grep -q '^WRONG' "$tmp/wrong$n.log"; then
      verdict="FAIL bug $n: a wrong ANSWER (bug $next's function) is accepted"
    else
      verdict="PASS bug $n: the suite fails ($last; first: ${first%%: max error*}), ANSWER takes the right function and not bug $next's ($((SECONDS - t0))s)"
      passed=$((passed + 1))
    fi
  fi
  echo "$verdict"
  rm -rf "$d"
done
echo "bug hunts selftest: $passed of $count hunts PASS in $((SECONDS - start))s"
[ "$passed" = "$count" ]
