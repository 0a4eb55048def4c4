#!/usr/bin/env bash
# make gpu-check: everything a GPU machine should tell us, in one call.
#   1 versions   nvcc, the driver, and what the CUDA runtime itself sees (a
#                driver older than the toolkit: nvidia-smi sees the GPU, the
#                runtime none; the run stops there with the runtime's reason)
#   2 build      kvt and test_kvt with nvcc (sm_80 + sm_90)
#   3 decode     the first figure: the copy bandwidth, then one 7B-shape decode
#                step against that bound
#   4 tests      the whole suite on the device (KVT_SYNC=1: a fault is reported
#                at the launch that caused it); its first line must name the GPU
#   5 sanitizers compute-sanitizer memcheck and racecheck on small runs that
#                launch every attention kernel (naive, fused fp32/fp16/int8 and
#                the scalar one, split + merge) and the rows, batch and tiled
#                matmuls, each run under its own cap
#   6 figures    a decode step of the 110M shape (launch-bound), naive vs
#                fused vs split + merge attention (and the largest
#                difference between their outputs, which must stay within the
#                tolerance), split vs unsplit, the cache types at long context
#   7 peer       PyTorch's scaled_dot_product_attention and a device copy at
#                the same shapes, when torch imports (else one skip line)
# The first figure comes first, then what decides correctness; a short lease
# still brings back the figure, and the sanitizers cannot starve the suite.
#
# One line per step on stdout. RESULTS (default bench/out/gpu) receives two
# files: summary.txt (those lines) and gpu-check.tar.gz (each step's full log
# and the CSVs), because a device call brings back at most 8 files: the logs
# are written to a temporary folder and packed after each step. Every step
# runs under what is left of GPU_CHECK_BUDGET seconds (default 420: a 15-minute
# lease also pays for the machine's start, the transfers and a rerun); once it
# is spent
# the remaining steps are listed as skipped, so a short lease still brings back
# everything that ran. The last lines give each step's seconds.
#
# DRY=1 (make gpu-check-dry, in CI): the same steps in the same order with the
# C build, tiny shapes and the emulation, sanitizers and (unless DRY_TESTS=1)
# the suite skipped, so the script cannot rot on machines without a GPU. Run it
# through make, which passes BLAS_DIR on and sets OPENBLAS_CORETYPE where the
# CPU needs it (docs/GPU.md, "Running make gpu-check").
set -u
cd "$(dirname "$0")/.."
DRY=${DRY:-0}
BUDGET=${GPU_CHECK_BUDGET:-420}
RESULTS=${RESULTS:-bench/out/gpu}
mkdir -p "$RESULTS" || exit 1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 1
SUMMARY="$WORK/summary.txt"
: > "$SUMMARY"
# summary.txt and one archive of the rest (the probe binary left out) into
# RESULTS: after every step, so a call killed at its time limit still brings
# back what ran, and on any exit, which then removes the temporary folder.
pack() {
  cp "$SUMMARY" "$RESULTS/summary.txt" && tar czf "$RESULTS/.gpu-check.tar.gz.tmp" -C "$WORK" --exclude=./probe . &&
    mv "$RESULTS/.gpu-check.tar.gz.tmp" "$RESULTS/gpu-check.tar.gz" ||
    { echo "gpu-check: writing summary.txt or gpu-check.tar.gz in $RESULTS failed; the logs stay in $WORK" >&2; return 1; }
}
trap 'pack && rm -rf "$WORK"' EXIT
START=$(date +%s)
FAILED=0
TIMES=""

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }
# step NAME CMD...: run CMD with the budget left, its output to NAME.log, its
# seconds noted for the last lines; returns CMD's status (124: out of budget).
step() {
  local name=$1; shift
  local t=$(left)
  if [ "$t" -le 0 ]; then say "$name: skipped (budget of ${BUDGET}s spent)"; TIMES="$TIMES $name=skipped"; return 124; fi
  local t0=$(date +%s)
  timeout "$t" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  local dt=$(($(date +%s) - t0))
  TIMES="$TIMES $name=${dt}s"
  if [ $rc = 124 ]; then say "$name: stopped after ${dt}s (budget of ${BUDGET}s spent)"
  elif [ $rc != 0 ]; then say "$name: FAILED (exit $rc, ${dt}s): $(grep -m1 -E 'FAIL|rror|kvt:' "$WORK/$name.log")"; FAILED=1
  fi
  pack
  return $rc
}
# the line of a step's log that carries its figure, prefixed by the step's name
figure() { local line; line=$(grep -m1 -E "$2" "$WORK/$1.log"); say "$1: ${line:-no figure in $1.log}"; }
# --bench attention checks what it timed: fused and split against naive
attn_diff() {
  if grep -q 'largest difference from naive.*: within)' "$WORK/$1.log"; then figure "$1" 'largest difference'
  else say "$1: FAILED: $(grep -m1 'largest difference' "$WORK/$1.log" || echo 'no difference line in the log')"; FAILED=1
  fi
}

# The CUDA tools: nvcc on PATH, else CUDA's usual folders; compute-sanitizer
# on PATH, else beside nvcc or under CUDA_HOME (the toolkit's own folder).
NVCC=$(command -v nvcc || true)
for d in "${CUDA_HOME:-}/bin" /usr/local/cuda/bin; do
  [ -n "$NVCC" ] || { [ -x "$d/nvcc" ] && NVCC="$d/nvcc"; }
done
SAN=$(command -v compute-sanitizer || true)
if [ -n "$NVCC" ]; then NVDIR=$(dirname "$NVCC"); else NVDIR=/nonexistent; fi
for f in "$NVDIR/compute-sanitizer" "$NVDIR/../compute-sanitizer/compute-sanitizer" \
         "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" "${CUDA_HOME:-/nonexistent}/compute-sanitizer/compute-sanitizer"; do
  [ -n "$SAN" ] || { [ -x "$f" ] && SAN="$f"; }
done

if [ "$DRY" = 1 ]; then
  BUILD=c
  DEV="emulated (DRY=1: the C build, tiny shapes)"
  M7B="--random 64,2,4,4,176,100,256"            # stands in for the 7B shape
  M110="--random 32,2,2,2,64,64,64"              # stands in for the 110M shape
  MATT="--random 64,1,4,4,176,100,1024"; A4K=256; A16K=1024; ANH=4; AHS=16
  MCTX="--random 32,1,2,2,64,64,128"; CTX=96
else
  BUILD=nvcc
  DEV=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
  # Llama-2-7B's matrices with 8 of its 32 layers: a step reads the same bytes per
  # layer, and the bound below counts exactly the bytes of this model.
  M7B="--random 4096,8,32,32,11008,32000,4096"
  M110="--random 768,12,12,12,2048,32000,1024"   # TinyStories-110M: launch overhead dominates a step
  MATT="--random 4096,1,32,32,11008,32000,16384"; A4K=4096; A16K=16384; ANH=32; AHS=128
  MCTX="--random 4096,2,32,32,11008,32000,4096"; CTX=4000
fi
say "gpu-check $(date -u '+%Y-%m-%d %H:%M UTC'), budget ${BUDGET}s, device: ${DEV:-none found}"
# Host memory: the 7B-shape model's weights (7 GB) are checked against
# MemAvailable, which on a lent machine starts small and grows as memory is
# touched, so the check could refuse before any figure. On a device the limit
# is 0.8 of the machine's known size instead (GPU_CHECK_HOST_GB, default 128:
# the lent machines' size); a KVT_MEM_LIMIT given by the caller wins.
if [ "$DRY" = 0 ] && [ -z "${KVT_MEM_LIMIT:-}" ]; then
  HOST_GB=${GPU_CHECK_HOST_GB:-128}
  export KVT_MEM_LIMIT=$((HOST_GB * 1024 * 1024 * 1024 * 8 / 10))
  say "host memory: KVT_MEM_LIMIT=$KVT_MEM_LIMIT (0.8 of ${HOST_GB} GiB, GPU_CHECK_HOST_GB; MemAvailable may start small here)"
else
  say "host memory: ${KVT_MEM_LIMIT:+KVT_MEM_LIMIT=$KVT_MEM_LIMIT}${KVT_MEM_LIMIT:-MemAvailable of /proc/meminfo (DRY=1)}"
fi
[ "$DRY" = 1 ] || [ -n "$DEV" ] || { say "no GPU visible to nvidia-smi: run DRY=1 (make gpu-check-dry) instead"; exit 1; }

# 1 versions. The probe asks the CUDA runtime what it sees; nvidia-smi only
# asks the driver, so a toolkit newer than the driver shows a GPU there while
# every CUDA call fails: the suite would then skip its GPU checks and pass.
NVCC_VERSION="not found"
[ -z "$NVCC" ] || NVCC_VERSION="$("$NVCC" --version | grep -o -m1 'release [0-9.]*, V[0-9.]*') ($NVCC)"
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
say "versions: nvcc $NVCC_VERSION; driver ${DRIVER:-none (no nvidia-smi, or it sees no GPU)}; compute-sanitizer ${SAN:-not installed}"
if [ -n "$NVCC" ]; then
  cat > "$WORK/probe.cu" <<'EOF'
#include <cstdio>
#include <cuda_runtime.h>
int main() { /* what the CUDA runtime sees: its version, the driver's, the devices */
    int rt = 0, drv = 0, n = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    cudaError_t e = cudaGetDeviceCount(&n);
    printf("runtime %d.%d, driver API %d.%d: ", rt / 1000, rt % 1000 / 10, drv / 1000, drv % 1000 / 10);
    if (e != cudaSuccess || n == 0) {
        printf("no device (cudaGetDeviceCount: %s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 1;
    }
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    printf("%d device(s), the first %s (sm_%d%d)\n", n, p.name, p.major, p.minor);
    return 0;
}
EOF
  "$NVCC" -o "$WORK/probe" "$WORK/probe.cu" > "$WORK/probe.log" 2>&1 && "$WORK/probe" > "$WORK/probe.log" 2>&1
  PROBE_RC=$?
  say "versions: the CUDA runtime: $(head -1 "$WORK/probe.log")"
  if [ "$DRY" != 1 ] && [ $PROBE_RC != 0 ]; then
    say "versions: FAILED: nvidia-smi sees '$DEV', but the CUDA runtime sees no device: $(head -1 "$WORK/probe.log")"
    grep -q -i insufficient "$WORK/probe.log" &&
      say "  (a driver older than the toolkit: build with the toolkit that matches the driver, or install a newer driver)"
    exit 1
  fi
elif [ "$DRY" != 1 ]; then
  say "versions: FAILED: no nvcc (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin): nothing can be built"; exit 1
fi

# 2 build
step build make BUILD=$BUILD -B -j2 kvt test_kvt && say "build: BUILD=$BUILD, $(grep -c -E '^(cc|.*nvcc) ' "$WORK/build.log") compiles, ok" || {
  say "build failed: nothing else can run"; exit 1; }

# 3 the first figure: one decode step of the 7B shape (about 30 s), before
# anything of unknown length
step decode ./kvt $M7B --bench decode --device gpu --csv "$WORK/decode.csv" && {
  figure decode 'memory bandwidth'; figure decode '^decode'; }

# 4 tests: the suite's first line names where its GPU checks ran
if [ "$DRY" = 1 ] && [ "${DRY_TESTS:-0}" != 1 ]; then
  say "tests: skipped (DRY=1: make test runs the same suite; DRY_TESTS=1 runs it here)"
elif step tests env KVT_SYNC=1 ./test_kvt ./kvt || [ -s "$WORK/tests.log" ]; then
  figure tests 'passed, .* failed'
  ran=$(grep -m1 -o 'GPU kernels run on: .*' "$WORK/tests.log" | sed 's/GPU kernels run on: //')
  if [ "$DRY" != 1 ] && ! echo "$ran" | grep -q '(sm_[0-9]*)'; then
    say "tests: FAILED: the suite's GPU checks did not run on the device (GPU kernels run on: ${ran:-no such line})"; FAILED=1
  else say "tests: GPU kernels ran on: ${ran:-no such line}"
  fi
fi

# 5 sanitizers: tiny runs, together launching every attention kernel (and the
# rest); KVT_SYNC=1, so a fault names the launch that caused it. Each run has
# its own cap (SAN_CAP seconds, default 60); a sanitizer that refuses the
# device ("Device not supported") or is missing is a skip, not a failure.
SAN_RUNS=("--random 64,2,4,2,128,100,64 --prompt-tokens 20 -n 3 --attn naive --kv-dtype fp16"  # tiled matmul, naive fp16
          "--random 64,2,4,2,128,100,64 --prompt-tokens 12 -n 3 --split 4 --kv-dtype int8"     # batch matmul, fused int8 (16-byte), merge
          "--random 64,2,4,2,128,100,64 --prompt-tokens 12 -n 3 --split 4 --kv-dtype fp16"     # fused fp16 (16-byte), merge
          "--random 96,2,6,2,128,100,64 --prompt-tokens 12 -n 3 --split 4 --kv-dtype int8 --kv-group 8"  # scalar fused, group 3
          "--random 64,2,4,2,128,100,64 --prompt-tokens 12 -n 3 --split 4")                    # fused fp32, merge
SAN_CAP=${SAN_CAP:-60}
if [ "$DRY" = 1 ]; then
  say "sanitizers: skipped (DRY=1: no device); on a GPU memcheck and racecheck, ${#SAN_RUNS[@]} runs each"
elif [ -z "$SAN" ]; then
  say "sanitizers: skipped: not installed (no compute-sanitizer on PATH, beside nvcc or under CUDA_HOME)"
else
  for tool in memcheck racecheck; do
    for i in "${!SAN_RUNS[@]}"; do
      name="sanitizer-$tool-$((i + 1))"; cap=$(left); [ "$cap" -gt "$SAN_CAP" ] && cap=$SAN_CAP
      if [ "$cap" -le 0 ]; then say "$name: skipped (budget of ${BUDGET}s spent)"; TIMES="$TIMES $name=skipped"; continue; fi
      t0=$(date +%s)
      KVT_SYNC=1 timeout "$cap" "$SAN" --tool "$tool" --error-exitcode 9 ./kvt ${SAN_RUNS[$i]} -t 0 --device gpu \
        > "$WORK/$name.log" 2>&1
      rc=$?; TIMES="$TIMES $name=$(($(date +%s) - t0))s"
      refused=$(grep -m1 -i -E 'not supported|unable to|permission' "$WORK/$name.log")
      if [ $rc = 0 ]; then say "$name: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$WORK/$name.log")"
      elif [ -n "$refused" ]; then say "$name: skipped: the sanitizer refused: $refused"
      elif [ $rc = 124 ]; then say "$name: skipped: not done within its cap of ${cap}s (SAN_CAP)"
      else say "$name: FAILED (exit $rc): $(grep -m1 -E 'ERROR|Invalid|Race|kvt:' "$WORK/$name.log")"; FAILED=1
      fi
      pack
    done
  done
fi

# 6 the remaining figures
step decode-110m ./kvt $M110 --bench decode --device gpu --csv "$WORK/decode_110m.csv" && figure decode-110m '^decode'
step attention-4k ./kvt $MATT --bench attention --bench-ctx $A4K --device gpu --csv "$WORK/attention_4k.csv" && {
  figure attention-4k 'naive'; figure attention-4k 'fused \(one pass\)'; figure attention-4k 'split \+ merge'
  attn_diff attention-4k; }
step attention-16k ./kvt $MATT --bench attention --bench-ctx $A16K --device gpu --csv "$WORK/attention_16k.csv" && {
  figure attention-16k 'fused \(one pass\)'; figure attention-16k 'split \+ merge'; figure attention-16k 'pieces'
  attn_diff attention-16k; }
step context ./kvt $MCTX --bench context --bench-ctx $CTX --bench-batch 4 --device gpu --csv "$WORK/context.csv" && {
  for dt in fp32 fp16 int8; do figure context "^$dt "; done; }

# 7 a peer: PyTorch's attention and a device copy at the same shapes, when the
# machine has it (a measurement, never a dependency); kvt's ratio to each
csvcol() { awk -F, -v row="$2" -v col="$3" 'NR > 1 && (row == "" || $1 == row) { print $col; exit }' "$WORK/$1" 2>/dev/null; }
if python3 -c 'import torch' > /dev/null 2>&1; then
  wmb=$(csvcol decode.csv "" 3); wmb=${wmb:-1000}
  step peer python3 bench/peer_torch.py $ANH $AHS $A4K $A16K --copy-mb "$wmb" && {
    grep '^peer: ' "$WORK/peer.log" | while read -r line; do say "$line"; done
    for t in "$A4K:attention_4k.csv" "$A16K:attention_16k.csv"; do
      T=${t%%:*}; ours=$(csvcol "${t#*:}" "fused (one pass)" 3)
      theirs=$(awk -v T="$T" '$2 == "sdpa" && $3 == T { print $4 }' "$WORK/peer.log")
      say "peer: attention at T = $T: kvt fused ${ours:-?} ms, sdpa ${theirs:-?} ms$(awk -v a="$ours" -v b="$theirs" \
        'BEGIN { if (a > 0 && b > 0) printf ": kvt takes %.2fx its time", a / b }')"
    done
    tok=$(csvcol decode.csv "" 6); copy=$(awk '$2 == "copy" { print $3 }' "$WORK/peer.log")
    say "peer: decode streams $(awk -v w="$wmb" -v t="$tok" -v c="$copy" 'BEGIN { if (t > 0 && c > 0)
      printf "%.1f GB/s of weights, %.2f of a device copy (%.1f GB/s, read + write)", w * t / 1e3, w * t / 1e3 / c, c;
      else printf "(no figure: decode or the copy did not run)" }')"
  }
else
  say "peer: skipped (python3 cannot import torch here)"
fi

say "seconds per step:$TIMES"
say "gpu-check: $([ $FAILED = 0 ] && echo 'every step that ran passed' || echo 'FAILED steps above'), $(( $(date +%s) - START ))s; results in $RESULTS (summary.txt, gpu-check.tar.gz)"
exit $FAILED
