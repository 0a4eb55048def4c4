#!/usr/bin/env bash
# make gpu-check: everything a GPU machine should tell us, in one call.
# Build with nvcc, run the test suite on the device (KVT_SYNC=1: a fault is
# reported at the launch that caused it), the sanitizers, then the figures:
# copy bandwidth, decode against the HBM bound, naive vs fused attention, split
# vs unsplit, the cache types at long context.
#
# One line per figure on stdout, and the same lines plus each step's full
# output under RESULTS (default bench/out/gpu): summary.txt, <step>.log, CSVs.
# Every step runs under what is left of GPU_CHECK_BUDGET seconds (default 220):
# once it is spent the remaining steps are listed as skipped, so a short lease
# still brings back everything that ran.
#
# DRY=1 (make gpu-check-dry, in CI): the same steps with the C build, tiny
# shapes and the emulation, sanitizers and (unless DRY_TESTS=1) the suite
# skipped, so the script cannot rot on machines without a GPU. Run it through make, which passes BLAS_DIR on and
# sets OPENBLAS_CORETYPE where the CPU needs it (docs/GPU.md, "On a GPU machine").
set -u
cd "$(dirname "$0")/.."
DRY=${DRY:-0}
BUDGET=${GPU_CHECK_BUDGET:-220}
RESULTS=${RESULTS:-bench/out/gpu}
mkdir -p "$RESULTS"
SUMMARY="$RESULTS/summary.txt"
: > "$SUMMARY"
START=$(date +%s)
FAILED=0

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }
# step NAME CMD...: run CMD with the budget left, its output to NAME.log;
# returns CMD's status (124: it ran out of budget).
step() {
  local name=$1; shift
  local t=$(left)
  if [ "$t" -le 0 ]; then say "$name: skipped (budget of ${BUDGET}s spent)"; return 124; fi
  local t0=$(date +%s)
  timeout "$t" "$@" > "$RESULTS/$name.log" 2>&1
  local rc=$?
  local dt=$(($(date +%s) - t0))
  if [ $rc = 124 ]; then say "$name: stopped after ${dt}s (budget of ${BUDGET}s spent)"
  elif [ $rc != 0 ]; then say "$name: FAILED (exit $rc, ${dt}s): $(grep -m1 -E 'FAIL|rror|kvt:' "$RESULTS/$name.log")"; FAILED=1
  fi
  return $rc
}
# the line of a step's log that carries its figure, prefixed by the step's name
figure() { local line; line=$(grep -m1 -E "$2" "$RESULTS/$1.log"); say "$1: ${line:-no figure in $1.log}"; }

if [ "$DRY" = 1 ]; then
  BUILD=c
  DEV="emulated (DRY=1: the C build, tiny shapes)"
  M7B="--random 64,2,4,4,176,100,256"            # stands in for the 7B shape
  MATT="--random 64,1,4,4,176,100,1024"; A4K=256; A16K=1024
  MCTX="--random 32,1,2,2,64,64,128"; CTX=96
else
  BUILD=nvcc
  DEV=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
  # Llama-2-7B's matrices with 8 of its 32 layers: a step reads the same bytes per
  # layer, and the bound below counts exactly the bytes of this model.
  M7B="--random 4096,8,32,32,11008,32000,4096"
  MATT="--random 4096,1,32,32,11008,32000,16384"; A4K=4096; A16K=16384
  MCTX="--random 4096,2,32,32,11008,32000,4096"; CTX=4000
fi
say "gpu-check $(date -u '+%Y-%m-%d %H:%M UTC'), budget ${BUDGET}s, device: ${DEV:-none found}"
[ "$DRY" = 1 ] || [ -n "$DEV" ] || { say "no GPU visible to nvidia-smi: run DRY=1 (make gpu-check-dry) instead"; exit 1; }

step build make BUILD=$BUILD -B kvt test_kvt && say "build: BUILD=$BUILD, $(grep -c -E '^(cc|.*nvcc) ' "$RESULTS/build.log") compiles, ok" || {
  say "build failed: nothing else can run"; exit 1; }
if [ "$DRY" = 1 ] && [ "${DRY_TESTS:-0}" != 1 ]; then
  say "tests: skipped (DRY=1: make test runs the same suite; DRY_TESTS=1 runs it here)"
else
  step tests env KVT_SYNC=1 ./test_kvt ./kvt; figure tests 'passed, .* failed'
fi

if [ "$DRY" = 1 ]; then
  say "sanitizers: skipped (DRY=1: no device)"
else
  for tool in memcheck racecheck; do
    if step "sanitizer-$tool" compute-sanitizer --tool $tool --error-exitcode 9 \
        ./kvt --random 64,2,4,2,128,100,64 -n 4 -t 0 --device gpu; then
      figure "sanitizer-$tool" 'ERROR SUMMARY|RACECHECK SUMMARY'
    elif grep -q -i -E "not supported|unable|permission" "$RESULTS/sanitizer-$tool.log"; then
      say "sanitizer-$tool: the runtime refused it: $(grep -m1 -i -E 'not supported|unable|permission' "$RESULTS/sanitizer-$tool.log")"
    fi
  done
fi

step decode ./kvt $M7B --bench decode --device gpu --csv "$RESULTS/decode.csv" && {
  figure decode 'memory bandwidth'; figure decode '^decode'; }
step attention-4k ./kvt $MATT --bench attention --bench-ctx $A4K --device gpu --csv "$RESULTS/attention_4k.csv" && {
  figure attention-4k 'naive'; figure attention-4k 'fused \(one pass\)'; }
step attention-16k ./kvt $MATT --bench attention --bench-ctx $A16K --device gpu --csv "$RESULTS/attention_16k.csv" && {
  figure attention-16k 'fused \(one pass\)'; figure attention-16k 'split \+ merge'; figure attention-16k 'pieces'; }
step context ./kvt $MCTX --bench context --bench-ctx $CTX --bench-batch 4 --device gpu --csv "$RESULTS/context.csv" && {
  for dt in fp32 fp16 int8; do figure context "^$dt "; done; }

say "gpu-check: $([ $FAILED = 0 ] && echo 'every step that ran passed' || echo 'FAILED steps above'), $(( $(date +%s) - START ))s; results in $RESULTS"
exit $FAILED
