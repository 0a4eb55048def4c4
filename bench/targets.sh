#!/usr/bin/env bash
# The CPU speed table of docs/RESULTS.md ("CPU speed against its targets"): every
# measurement RUNS times (default 3), printed as a markdown table of medians
# with all runs beside them. Run it through `make bench-targets`, which builds
# ./kvt and sets OPENBLAS_CORETYPE where OpenBLAS needs it. About 20 minutes on
# 2 cores; nothing else should run meanwhile (these are timings).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
m110="--random 768,12,12,12,2048,32000,1024"   # stories110M shape, TMAX 1024
m110l="--random 768,12,12,12,2048,32000,4096"  # the same with TMAX 4096
m15="--random 288,6,6,6,768,32000,1024"        # stories15M shape
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "$(date -u) $(nproc) cores, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, $runs runs" >&2
for i in $(seq "$runs"); do
  echo "run $i of $runs" >&2
  ./kvt $m110 --bench decode --csv "$dir/decode_$i.csv" > /dev/null
  ./kvt $m110 --bench context --bench-ctx 960 --bench-batch 1 --csv "$dir/b1_$i.csv" > /dev/null
  ./kvt $m110 --bench context --bench-ctx 960 --bench-batch 16 --csv "$dir/b16_$i.csv" > /dev/null
  ./kvt $m110l --bench context --bench-ctx 4000 --bench-batch 4 --csv "$dir/b4_$i.csv" > /dev/null
  ./kvt $m15 --bench batch --csv "$dir/batch_$i.csv" > /dev/null
done

# col FILE DTYPE N: column N of the row of cache type DTYPE in a context CSV
col() { awk -F, -v d="$2" -v n="$3" '$1 == d { print $n }' "$1"; }
# row VALUES...: "median (run1, run2, ...)"
row() { printf '%s\n' "$@" | sort -g | awk -v all="$*" '{ a[NR] = $1 } END {
  m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; gsub(/ /, ", ", all)
  printf (m >= 100 ? "**%.0f** (%s)" : "**%.2f** (%s)"), m, all }'; }
collect() { # collect KIND: one value per run, computed by the awk/shell below
  local v=() i
  for i in $(seq "$runs"); do
    case $1 in
      bw) v+=("$(awk -F, 'NR == 2 { print $2 }' "$dir/decode_$i.csv")") ;;
      decode) v+=("$(awk -F, 'NR == 2 { printf "%.3f", $6 / $5 }' "$dir/decode_$i.csv")") ;;
      paired) v+=("$(awk -F, 'NR == 2 { printf "%.3f", $8 }' "$dir/decode_$i.csv")") ;;
      prefill) v+=("$(col "$dir/b1_$i.csv" fp32 4 | cut -d. -f1)") ;;
      b1) v+=("$(col "$dir/b1_$i.csv" fp32 5 | cut -d. -f1)") ;;
      b1bound) v+=("$(col "$dir/b1_$i.csv" fp32 7 | cut -d. -f1)") ;;
      b16) v+=("$(col "$dir/b16_$i.csv" fp32 5 | cut -d. -f1)") ;;
      b16bound) v+=("$(col "$dir/b16_$i.csv" fp32 7 | cut -d. -f1)") ;;
      b16int8) v+=("$(awk -F, '$1 == "fp32" { f = $5 } $1 == "int8" { printf "%.3f", $5 / f }' "$dir/b16_$i.csv")") ;;
      b16fp16) v+=("$(awk -F, '$1 == "fp32" { f = $5 } $1 == "fp16" { printf "%.3f", $5 / f }' "$dir/b16_$i.csv")") ;;
      b4int8) v+=("$(awk -F, '$1 == "fp32" { f = $5 } $1 == "int8" { printf "%.3f", $5 / f }' "$dir/b4_$i.csv")") ;;
      b4fp16) v+=("$(awk -F, '$1 == "fp32" { f = $5 } $1 == "fp16" { printf "%.3f", $5 / f }' "$dir/b4_$i.csv")") ;;
      b4bound8) v+=("$(awk -F, '$1 == "fp32" { f = $7 } $1 == "int8" { printf "%.3f", $7 / f }' "$dir/b4_$i.csv")") ;;
      b4bound16) v+=("$(awk -F, '$1 == "fp32" { f = $7 } $1 == "fp16" { printf "%.3f", $7 / f }' "$dir/b4_$i.csv")") ;;
      batch) v+=("$(awk -F, '$1 == 1 { b = $3 } $1 == 2 { printf "%.3f", $3 / b }' "$dir/batch_$i.csv")") ;;
    esac
  done
  row "${v[@]}"
}
echo "| measurement, 110M shape | target | median (every run) |"
echo "|---|---|---|"
echo "| \`--bench decode\` (1 sequence, positions 17..47): fraction of the read bound | >= 0.9 | $(collect decode) |"
echo "| (read bandwidth measured by that bench, GB/s) | | $(collect bw) |"
echo "| (the same steps, each against a read-only pass over the weights just before it: median fraction) | | $(collect paired) |"
echo "| prefill of 960 tokens, tokens/s | >= 400 | $(collect prefill) |"
echo "| 1 sequence at context 960, fp32 cache, decode tokens/s | >= 50 | $(collect b1) |"
echo "| (its bound: bytes per step / read bandwidth) | | $(collect b1bound) |"
echo "| 16 sequences at context 960, fp32 cache, aggregate tokens/s | >= 150 | $(collect b16) |"
echo "| (its bound) | | $(collect b16bound) |"
echo "| same, int8 cache, vs fp32 | >= 1.25 | $(collect b16int8) |"
echo "| same, fp16 cache, vs fp32 | | $(collect b16fp16) |"
echo "| 4 sequences at context 4000 (TMAX 4096): int8 vs fp32 | >= 1.5 | $(collect b4int8) |"
echo "| (the ratio of their bounds) | | $(collect b4bound8) |"
echo "| same, fp16 vs fp32 | >= 1.3 | $(collect b4fp16) |"
echo "| (the ratio of their bounds) | | $(collect b4bound16) |"
echo "| \`--bench batch\` (stories15M shape): batch 2 vs batch 1 tokens/s | >= 1.8 | $(collect batch) |"
