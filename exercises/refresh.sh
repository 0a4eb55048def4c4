#!/usr/bin/env bash
# Carries the exercise patches (solutions, wrong solutions, bug hunts) across a
# change to the files they touch. OLD is a commit where every patch applied;
# the working tree is where they must apply now. For each patch, each file it
# touches is merged three ways (git merge-file): the file at OLD, the file at
# OLD with the patch, and the file now. A clean merge becomes the new patch; a
# conflict is merged by keeping both sides and reported with the patch and the
# file, to be read by a person. Patches are rewritten in place; review them with
# git diff, then run make exercises-selftest.
#   make refresh-patches OLD=<commit>
set -u
cd "$(dirname "$0")/.."
OLD=${OLD:-}
[ -n "$OLD" ] && git rev-parse -q --verify "$OLD^{commit}" > /dev/null ||
  { echo "refresh-patches: name a commit where every patch applied: make refresh-patches OLD=<commit>"; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/old" && git archive "$OLD" | tar -x -C "$work/old" || exit 2

# The patches a patch is written on top of: exercise 2 on exercise 1; a wrong
# solution on its reference solution; a bug hunt on the committed tree.
prereq() {
  case $1 in
    exercises/2-*.patch) ls exercises/1-*.patch ;;
    exercises/wrong/*) n=${1##*/}; n=${n%%-*}; ls exercises/$n-*.patch; prereq "$(ls exercises/$n-*.patch)" ;;
  esac
}
apply_all() { # tree patch...: applies each, in order; fails on the first that does not apply
  local t=$1; shift
  for q in "$@"; do (cd "$t" && patch -p1 -s -f < "$OLDDIR/$q" > /dev/null 2>&1) || return 1; done
}
touched() { sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$1"; }

failed=0 changed=0
mkdir -p "$work/orig"
for p in exercises/[1-5]-*.patch exercises/wrong/*.patch exercises/bugs/[0-9]*.patch; do
  mkdir -p "$work/orig/$(dirname "$p")"; cp "$p" "$work/orig/$p"
done
OLDDIR=$work/orig
# Order: solutions first (so wrong solutions and exercise 2 find theirs refreshed).
for p in exercises/1-*.patch exercises/[2-5]-*.patch exercises/wrong/*.patch exercises/bugs/[0-9]*.patch; do
  pre=$(prereq "$p" | tac | tr '\n' ' ')
  rm -rf "$work/a" "$work/b" "$work/n"
  cp -r "$work/old" "$work/a"
  # shellcheck disable=SC2086
  apply_all "$work/a" $pre || { echo "refresh-patches: $p: its prerequisites ($pre) do not apply at $OLD"; failed=1; continue; }
  cp -r "$work/a" "$work/b"
  apply_all "$work/b" "$p" || { echo "refresh-patches: $p does not apply at $OLD"; failed=1; continue; }
  mkdir -p "$work/n"
  git ls-files -z | tar --null -T - -c | tar -x -C "$work/n"
  OLDDIR=$PWD apply_all "$work/n" $pre || { echo "refresh-patches: $p: its refreshed prerequisites do not apply now"; failed=1; continue; }
  cp -r "$work/n" "$work/m"
  ok=1
  for f in $(touched "$p"); do
    cp "$work/m/$f" "$work/ours"
    if ! git merge-file -q "$work/m/$f" "$work/a/$f" "$work/b/$f"; then
      # Most conflicts here are two insertions at one place (a flag added
      # where the patch adds one): --union keeps both, today's lines first.
      # Anything else comes out wrong (a line the patch deletes survives, a
      # line the tree changed appears twice) and needs a person.
      cp "$work/ours" "$work/m/$f"
      git merge-file -q --union "$work/m/$f" "$work/a/$f" "$work/b/$f"
      echo "refresh-patches: $p: $f: a conflict, merged by keeping both sides: right for two insertions, wrong for anything else; read the new patch, then make exercises-selftest"
    fi
  done
  if [ $ok = 1 ]; then
    out=$work/new.patch; : > "$out"
    for f in $(touched "$p"); do
      (cd "$work" && diff -u --label "a/$f" --label "b/$f" "n/$f" "m/$f") >> "$out"
      [ $? -le 1 ] || { echo "refresh-patches: diff failed on $f"; exit 2; }
    done
    if ! cmp -s "$out" "$p"; then cp "$out" "$p" || exit 2; echo "refresh-patches: $p rewritten"; changed=$((changed + 1)); fi
  else
    failed=1
  fi
  rm -rf "$work/m"
done
echo "refresh-patches: $changed patch(es) rewritten$([ $failed = 1 ] && echo ', some need a hand (above)')"
exit $failed
