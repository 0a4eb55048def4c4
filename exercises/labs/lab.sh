#!/usr/bin/env bash
# The labs (docs/LABS.md): rebuild the KV cache one function at a time.
#   lab.sh start N     empty lab N's function bodies in the working tree (make lab N=k)
#   lab.sh check N     build lab N's checks and run them (make lab-check N=k)
#   lab.sh save N      keep your bodies as a patch in labs-saved/ (make lab-save N=k)
#   lab.sh reset N     save, then put the reference bodies back (make lab-reset N=k)
#   lab.sh diff N      your bodies against the reference ones (make lab-diff N=k)
#   lab.sh selftest [N..]  each lab (or those named): stripped fails, reference passes, wrong ones fail (make labs-selftest)
# The functions of each lab are listed in exercises/labs/labs.txt; a function
# is found by exercises/labs/func.awk. The lab in progress and its base commit
# (where the reference bodies come from) are kept in .lab (ignored by git).
# COMPILE, LIBS and LINKX come from the Makefile.
set -u
cd "$(dirname "$0")/../.."
LABS=exercises/labs/labs.txt
AWK=exercises/labs/func.awk
STATE=.lab
die() { echo "lab: $*"; exit 2; }

funcs() { awk -v n="$1" '!/^#/ && $1 == n { print $2, $3 }' "$LABS"; }
files() { funcs "$1" | awk '{ print $1 }' | sort -u; }
valid() {
  [ -n "${1:-}" ] || die "say which lab: N=<1..$(awk '!/^#/ && NF >= 3 { n = $1 } END { print n }' "$LABS")> (docs/LABS.md)"
  [ -n "$(funcs "$1")" ] || die "there is no lab $1: the labs are $(awk '!/^#/ && NF >= 3 { print $1 }' "$LABS" | sort -un | paste -sd ' ')"
}
# The reference bodies' commit: the one `make lab` recorded, else where HEAD
# left its upstream or origin (as exercises/selftest.sh does), else HEAD.
base_of() {
  if [ -n "${LAB_BASE:-}" ]; then echo "$LAB_BASE"; return; fi
  if [ -f "$STATE" ] && [ "$(cut -d' ' -f1 "$STATE")" = "$1" ]; then cut -d' ' -f2 "$STATE"; return; fi
  git merge-base HEAD '@{upstream}' 2>/dev/null && return
  for r in origin/HEAD origin/main origin/master; do git merge-base HEAD "$r" 2>/dev/null && return; done
  git rev-parse HEAD
}
# Replace FILE in place with the awk output, checking every write.
rewrite() { # file awk-args...
  local f=$1 tmp; shift
  tmp=$(mktemp "$f.lab.XXXXXX") || die "cannot write next to $f"
  if awk "$@" -f "$AWK" "$f" > "$tmp" && [ -s "$tmp" ]; then mv "$tmp" "$f" || die "cannot replace $f"
  else rm -f "$tmp"; die "could not rewrite $f"; fi
}

strip_lab() { # N: empty the bodies in the current directory (a line's 4th field on: helpers the stub names)
  awk -v n="$1" '!/^#/ && $1 == n { k = ""; for (i = 4; i <= NF; i++) k = k " " $i; print $2, $3, k }' "$LABS" |
    while read -r f name keep; do
      rewrite "$f" -v name="$name" -v mode=stub -v lab="$1" -v keep="$keep" || exit 2
    done
}

cmd_start() {
  valid "$1"
  if [ -f "$STATE" ]; then
    die "lab $(cut -d' ' -f1 "$STATE") is in progress: finish it (make lab-check N=$(cut -d' ' -f1 "$STATE")) or put it back with make lab-reset N=$(cut -d' ' -f1 "$STATE") (your bodies are saved first)"
  fi
  for f in $(files "$1"); do
    git diff --quiet HEAD -- "$f" || die "$f has uncommitted changes: commit or stash them first (make lab N=$1 rewrites it)"
  done
  echo "$1 $(git rev-parse HEAD)" > "$STATE" || die "cannot write $STATE"
  strip_lab "$1" || { rm -f "$STATE"; exit 2; }
  echo "lab $1: emptied $(funcs "$1" | awk '{ print $2 }' | paste -sd ' ' | sed 's/ /, /g') in $(files "$1" | paste -sd ' ')."
  echo "  Each says /* lab $1: write this */; the comment above it says what it must do (docs/LABS.md#lab-$1)."
  echo "  make lab-check N=$1 checks them; make lab-reset N=$1 puts the reference back (saving yours first)."
}

# Build lab N's checks and a reference kvt from the base commit, run them.
cmd_check() {
  valid "$1"
  local base ref
  base=$(base_of "$1")
  CHECK_DIR=$(mktemp -d) && trap 'rm -rf "$CHECK_DIR"' EXIT
  local d=$CHECK_DIR
  ref=${LAB_REF_DIR:-.lab-ref}/$base
  if [ ! -x "$ref/kvt" ]; then
    mkdir -p "$ref/src" && git archive "$base" | tar -x -C "$ref/src" || die "cannot unpack commit $base"
    (cd "$ref/src" && $COMPILE kvtransformer.cu -o ../kvt $LIBS $LINKX) > "$d/ref.log" 2>&1 ||
      { tail -5 "$d/ref.log"; die "the reference kvt (commit $base) does not build"; }
    rm -rf "$ref/src"
  fi
  if ! $COMPILE -DKVT_LAB="$1" test.c -o "$d/lab_$1" $LIBS $LINKX > "$d/build.log" 2>&1; then
    echo "lab $1: your code does not compile yet:"
    grep -E "error" "$d/build.log" | head -8
    exit 1
  fi
  "$d/lab_$1" ./kvt "$ref/kvt"
}

cmd_save() {
  valid "$1"
  local base out
  base=$(base_of "$1")
  mkdir -p labs-saved || die "cannot make labs-saved/"
  out=labs-saved/lab-$1-$(date +%Y%m%d-%H%M%S).patch
  git diff "$base" -- $(files "$1") > "$out" || die "cannot write $out"
  echo "lab $1: your version is in $out (git apply $out brings it back)"
}

cmd_reset() {
  valid "$1"
  local base
  base=$(base_of "$1")
  cmd_save "$1"
  local d
  d=$(mktemp -d)
  funcs "$1" | while read -r f name; do
    git show "$base:$f" > "$d/ref" || die "cannot read $f at $base"
    awk -v name="$name" -v mode=print -f "$AWK" "$d/ref" | awk 'f; /\{[ \t]*(\/\*.*\*\/)?[ \t]*$/ && !f { f = 1 }' |
      sed '$d' > "$d/body" || exit 2
    rewrite "$f" -v name="$name" -v mode=splice -v body="$d/body" || exit 2
  done
  rm -rf "$d"
  rm -f "$STATE"
  echo "lab $1: the reference bodies are back (from commit $(git rev-parse --short "$base"))"
}

cmd_diff() {
  valid "$1"
  local base d
  base=$(base_of "$1")
  d=$(mktemp -d)
  funcs "$1" | while read -r f name; do
    git show "$base:$f" > "$d/ref"
    awk -v name="$name" -v mode=print -f "$AWK" "$d/ref" > "$d/a"
    awk -v name="$name" -v mode=print -f "$AWK" "$f" > "$d/b"
    diff -u --label "reference $name" --label "yours $name" "$d/a" "$d/b"
  done
  rm -rf "$d"
  return 0
}

# For each lab, on a copy of HEAD's tree: the reference passes its check, each
# wrong body (exercises/labs/wrong/N-*.c: its first line names the function it
# replaces) fails its unit checks (the end-to-end runs are left out for them:
# KVT_LAB_NO_E2E), and the stripped tree builds without warnings and fails its
# check by failed checks, not by a crash of the runner. The checks themselves
# are built with -Werror here.
cmd_selftest() {
  local pass=0 total=0 tmp refs
  refs=$(mktemp -d)
  export LAB_BASE LAB_REF_DIR=$refs COMPILE="$COMPILE -Werror"
  LAB_BASE=$(git rev-parse HEAD)
  mkdir -p "$refs/$LAB_BASE/src" && git archive HEAD | tar -x -C "$refs/$LAB_BASE/src" &&
    (cd "$refs/$LAB_BASE/src" && $COMPILE kvtransformer.cu -o ../kvt $LIBS $LINKX) > /dev/null 2>&1 ||
    die "the reference kvt (HEAD) does not build"
  for n in ${*:-$(awk '!/^#/ && NF >= 3 { print $1 }' "$LABS" | sort -un)}; do
    total=$((total + 1))
    tmp=$(mktemp -d)
    git archive HEAD | tar -x -C "$tmp"
    local verdict="" log
    if [ -z "$verdict" ]; then
      log=$(cd "$tmp" && bash exercises/labs/lab.sh check "$n" 2>&1)
      [ $? -eq 0 ] || verdict="FAIL lab $n: the reference fails its check: $(echo "$log" | grep -m1 '^FAIL')"
    fi
    if [ -z "$verdict" ]; then
      for w in "$tmp"/exercises/labs/wrong/$n-*.c; do
        [ -f "$w" ] || continue
        rm -rf "$tmp.w" && cp -r "$tmp" "$tmp.w"
        local name f
        name=$(head -1 "$w" | sed -n 's|^/\* *\([A-Za-z_0-9]*\):.*|\1|p')
        f=$(funcs "$n" | awk -v x="$name" '$2 == x { print $1 }')
        [ -n "$f" ] || { verdict="FAIL lab $n: ${w##*/} names no function of lab $n ($name)"; break; }
        tail -n +2 "$w" > "$tmp.w/body"
        (cd "$tmp.w" && awk -v name="$name" -v mode=splice -v body=body -f "$AWK" "$f" > "$f.new" && mv "$f.new" "$f")
        log=$(cd "$tmp.w" && KVT_LAB_NO_E2E=1 bash exercises/labs/lab.sh check "$n" 2>&1)
        if [ $? -eq 0 ]; then verdict="FAIL lab $n: the check accepts the wrong body ${w##*/}"; break; fi
        echo "$log" | grep -q "^[1-9][0-9]* passed\|^0 passed" || { verdict="FAIL lab $n: ${w##*/} does not build: $(echo "$log" | tail -2)"; break; }
        echo "  lab $n rejects ${w##*/}: $(echo "$log" | grep -m1 '^FAIL' | cut -c1-150)"
      done
    fi
    if [ -z "$verdict" ]; then
      (cd "$tmp" && strip_lab "$n" && $COMPILE -c kvtransformer.cu -o /dev/null > "$tmp/strip.log" 2>&1) ||
        verdict="FAIL lab $n: the stripped tree does not build without warnings: $(grep -m1 -E 'error|warning' "$tmp/strip.log")"
    fi
    if [ -z "$verdict" ]; then
      log=$(cd "$tmp" && bash exercises/labs/lab.sh check "$n" 2>&1)
      if [ $? -eq 0 ]; then verdict="FAIL lab $n: its check passes on the stripped tree"
      elif ! echo "$log" | grep -q "^[0-9]* passed, [1-9][0-9]* failed"; then verdict="FAIL lab $n: the stripped tree's check did not finish: $(echo "$log" | tail -1)"
      fi
    fi
    [ -z "$verdict" ] && { verdict="PASS lab $n: the stripped tree builds and fails ($(echo "$log" | tail -1)), the reference passes, wrong bodies rejected"; pass=$((pass + 1)); }
    echo "$verdict"
    rm -rf "$tmp" "$tmp.w"
  done
  rm -rf "$refs"
  echo "$pass of $total labs PASS"
  [ "$pass" -eq "$total" ]
}

case "${1:-}" in
  start) cmd_start "${2:-}" ;;
  check) cmd_check "${2:-}" ;;
  save) cmd_save "${2:-}" ;;
  reset) cmd_reset "${2:-}" ;;
  diff) cmd_diff "${2:-}" ;;
  selftest) shift; cmd_selftest "$@" ;;
  *) die "usage: make lab N=k | lab-check N=k | lab-save N=k | lab-reset N=k | lab-diff N=k | labs-selftest" ;;
esac
