#!/usr/bin/env bash
# Bug hunts (README "Bug hunts", docs/BUGHUNTS.md): bug N is a one-line
# change, kept as the patch exercises/bugs/N.patch (look only after trying).
#   bash exercises/bugs/hunt.sh N           (make bughunt N=N) apply bug N to a
#       copy of the committed tree (git archive HEAD: your own files are never
#       touched), build it there, run the suite and show the failed checks, then
#       the next step of the route
#   bash exercises/bugs/hunt.sh N FUNCTION  (make bughunt N=N ANSWER=FUNCTION)
#       your answer: the function at fault; when right, what the bug was and how
#       the tests caught it
#   bash exercises/bugs/hunt.sh build N DIR only the copy and the three binaries,
#       in DIR (the walkthrough and exercises/bugs/selftest.sh use it)
# The copy goes to $KVT_BUGHUNT_DIR/N (default ${TMPDIR:-/tmp}/kvt-bughunt-UID/N)
# and stays there for gdb: kvt-debug (-O0 -g, for gdb), kvt and test_kvt (-O1 -g:
# the suite checks that it runs an optimized kvt). It always builds the C build
# (the GPU kernels emulated), so --check compares the CPU with the emulation.
# KVT_TEST_FIRST_FAIL=1 stops the suite at its first failed check.
# The answers and their explanations are in exercises/bugs/answers, base64
# encoded so that a glance does not give them away (base64 -d reads them).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
CC=${CC:-cc}
BLAS_CFLAGS=${BLAS_CFLAGS:-$(pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu/openblas-pthread)}
LIBS=${LIBS:-"$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas) -lm"}
HUNTS=6

# What a user saw, the two runs that should agree and do not, where to stop first.
story() {
  case $1 in
  1) echo "Greedy text (-t 0) of a random model: the first token after the prompt is right, every later one differs from --kv-cache off." ;;
  2) echo "The default model (8 query heads, 2 kv heads) writes other text with --attn naive than with the default fused attention." ;;
  3) echo "--fork 3 -t 0: three greedy continuations of one prompt must be the same text, yet sequences 0 and 1 part from sequence 2 (and from --fork-share off)." ;;
  4) echo "An int8 cache with --kv-group 8: --attn naive writes other text than --attn fused; with --kv-group 16 (one group per head) they agree." ;;
  5) echo "--split 8 turns the default model's greedy text into gibberish; --split -1 (never split) and --kv-cache off agree." ;;
  6) echo "The default model's greedy text is right for about 130 positions, then turns to gibberish; --kv-cache off stays right." ;;
  esac
}
runs() { # the two runs, each on one line
  local m="--random 64,2,4,2,128,100,64"
  case $1 in
  1) echo "$m -n 12 -t 0 --device cpu"; echo "$m -n 12 -t 0 --device cpu --kv-cache off" ;;
  2) echo "-n 24 -t 0 --attn naive --device cpu"; echo "-n 24 -t 0 --attn naive --device gpu --check" ;;
  3) echo "$m --prompt-tokens 6 --chunk 4 --fork 3 -n 6 -t 0 --device cpu"
     echo "$m --prompt-tokens 6 --chunk 4 --fork 3 -n 6 -t 0 --device cpu --fork-share off" ;;
  4) echo "-n 24 -t 0 --kv-dtype int8 --kv-group 8 --attn naive --device cpu"
     echo "-n 24 -t 0 --kv-dtype int8 --kv-group 8 --attn naive --device gpu --check" ;;
  5) echo "-n 40 -t 0 --split 8 --device cpu"; echo "-n 40 -t 0 --split 8 --device gpu --check" ;;
  6) echo "-n 160 -t 0 --device cpu --dump-tokens on.txt"; echo "-n 160 -t 0 --device cpu --kv-cache off --dump-tokens off.txt" ;;
  esac
}
first_break() { # also docs/BUGHUNTS.md's table, column "first breakpoint"
  case $1 in
  1) echo "kvt_sample's 2nd call (ignore 1 1) in both runs; then the one thing a decode row does with its position (docs/GDB.md, session 5)" ;;
  2) echo "forward_rows in the prompt's call, layer 0: print e->att[0]@16 after the attention in both runs" ;;
  3) echo "forward_rows if n == 3 (the first decode step), then up: call kvt_pool_print(stdout, e), and position 4's K in each sequence's chunk c: print ((float *)e->pool.data)[c * e->pool.chunk_elems]@4" ;;
  4) echo "attention_naive_cpu, layer 0 of the prompt: one head's output oh against the fused run's e->att; kv.G and kv.HS say how many scales a row has" ;;
  5) echo "attention_fused_cpu in a decode step: each piece's (m, l) in part, and the output, against --split -1" ;;
  6) echo "attention_fused_cpu in the decode step at position 128 (forward_rows if n == 1 && e->h_pos[0] == 128): which positions do its pieces cover?" ;;
  esac
}

usage() { echo "usage: make bughunt N=<1..$HUNTS> [ANSWER=function]   (README, Bug hunts)"; exit 2; }
valid() { case $1 in [1-9]) [ "$1" -le "$HUNTS" ] ;; *) false ;; esac; }

# build N DIR: the committed tree with bug N applied, and its three binaries
build() {
  local n=$1 d=$2 f="-x c -std=c11 -Wall -Wextra -fopenmp -g"
  rm -rf "$d" && mkdir -p "$d" || return 1
  if git -C "$root" rev-parse -q --verify HEAD > /dev/null 2>&1; then git -C "$root" archive HEAD | tar -x -C "$d"
  else (cd "$root" && tar --exclude=./.git -cf - .) | tar -x -C "$d"; fi || return 1
  rm -f "$d/exercises/bugs/answers" # not next to the bugged source
  if ! patch -d "$d" -p1 -s < "$here/$n.patch" > "$d/patch.log" 2>&1; then
    echo "[bughunt] bug $n does not apply to this tree: $(head -1 "$d/patch.log")"; return 1
  fi
  # shellcheck disable=SC2086
  (cd "$d" && $CC $f -O0 $BLAS_CFLAGS kvtransformer.cu -o kvt-debug $LIBS && \
    $CC $f -O1 $BLAS_CFLAGS kvtransformer.cu -o kvt $LIBS && \
    $CC $f -O1 $BLAS_CFLAGS test.c -o test_kvt $LIBS) > "$d/build.log" 2>&1 || {
    echo "[bughunt] bug $n does not build:"; grep -m 6 -E "error|undefined" "$d/build.log"; return 1; }
}

hunt() {
  local n=$1 d=${KVT_BUGHUNT_DIR:-${TMPDIR:-/tmp}/kvt-bughunt-$(id -u)}/$1
  echo "bug hunt $n: $(story "$n")"
  build "$n" "$d" || exit 1
  echo "[bughunt] bug $n is applied to a copy of the committed tree in $d, built there: kvt-debug (-O0 -g),"
  echo "          kvt and test_kvt (-O1 -g). (That copy holds the bugged source, for gdb: diffing it is reading the answer.)"
  echo "[bughunt] make test on it, showing only the failed checks as they come (a few minutes; KVT_TEST_FIRST_FAIL=1 stops at the first):"
  : > "$d/suite.log" # there before tail looks for it
  (cd "$d" && OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} ./test_kvt ./kvt > suite.log 2>&1) &
  local pid=$!
  # the FAIL lines with the mismatches printed just before them, while the suite runs
  tail -n +1 -f --pid=$pid "$d/suite.log" 2>/dev/null | awk -v max=12 '
    /^    mismatch at / { held[nh++] = $0; next }
    /^FAIL / { if (++nf <= max) { for (i = 0; i < nh && i < 2; i++) print held[i]; print } else if (nf == max + 1) print "(more FAIL lines: see suite.log)"; fflush() }
    { nh = 0 }'
  wait $pid
  local last; last=$(tail -1 "$d/suite.log")
  echo "[bughunt] the suite on bug $n: $last (whole output: $d/suite.log)"
  case $last in *" 0 failed"*) echo "[bughunt] no check failed: the bug did not apply as meant"; exit 1 ;; esac
  echo "next: two runs that should agree, and do not (docs/BUGHUNTS.md, the route):"
  echo "    cd $d"
  runs "$n" | while read -r args; do echo "    ./kvt-debug $args"; done
  echo "  find the first step whose logits differ, then stop there in gdb (gdb --args ./kvt-debug ...);"
  echo "  first breakpoint: $(first_break "$n")"
  echo "  when you know the function at fault: make bughunt N=$n ANSWER=<function>"
}

answer() {
  local n=$1 want text a=${2// /}
  a=${a%()}; a=${a##*:} # "kvtransformer.cu:foo()" -> foo
  case $a in "" | *[!A-Za-z0-9_]*) echo "WRONG: '$2' is not the name of a function"; return 1 ;; esac
  text=$(grep "^$n " "$here/answers" | cut -d' ' -f2 | base64 -d) || { echo "[bughunt] no answer stored for bug $n"; exit 2; }
  want=$(echo "$text" | head -1)
  if [ "$a" = "$want" ]; then
    echo "RIGHT: bug $n is in $want."
    echo "$text" | tail -n +2
    return 0
  fi
  if ! grep -qE "(^|[^A-Za-z0-9_])$a *\(" "$root/kvtransformer.cu" "$root"/cli/*.c "$root"/cpu/*.c 2> /dev/null; then
    echo "WRONG: no function named '$a' in kvtransformer.cu, cli/ or cpu/."
  else
    echo "WRONG: '$a' is not the function at fault for bug $n. $(story "$n")"
    echo "  Where to stop first: $(first_break "$n")"
  fi
  return 1
}

case ${1:-} in
build) [ $# = 3 ] && valid "$2" || usage; build "$2" "$3" ;;
*) valid "${1:-}" || usage
   if [ -n "${2:-}" ]; then answer "$1" "$2"; else hunt "$1"; fi ;;
esac
