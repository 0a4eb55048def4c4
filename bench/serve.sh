#!/usr/bin/env bash
# make bench-serve: what the chunk pool is for, measured (docs/SERVING.md).
# One trace (bench/serve_synth.tsv: 60 requests, long-tailed lengths), its
# arrival times scaled to a range of rates given as fractions of the measured
# capacity, served by six configurations with the same pool bytes (4096 fp32
# positions; swap space not counted), the same token budget, running cap,
# threads and greedy decoding, prefix reuse off:
#   static_prealloc  one preallocated context per request (--chunk TMAX), a new
#                    batch only when the previous one has finished
#   cont_prealloc    continuous batching with preallocated contexts
#   reserve16        continuous, chunks of 16, prompt + max_new reserved at
#                    admission (Orca's reservation: never preempts)
#   cont16           continuous, chunks of 16 allocated as positions arrive
#                    (preempts by recompute when the pool runs short)
#   cont16_int8      the same with the int8 cache: the same bytes hold about
#                    3.6x the positions (a capacity label, not a speed claim)
#   nocache          --kv-cache off: every step a request re-prefills its whole
#                    history, admitted first come first served into the same
#                    token budget (so mostly one long history per step)
# The curves run every configuration but nocache, whose capacity is a few
# percent of the others' (it has its own rows, below). Runs are interleaved
# (each round: every rate, every configuration) and RUNS times (default 3);
# the tables hold medians with min and max. The measured clock skips idle
# gaps, so a run at a low rate costs only its busy time. About 8 minutes on 2
# cores; nothing else should run meanwhile (these are timings).
#
# Writes to $OUT (default bench/out; make bench-save copies into bench/):
#   serve.csv       config, rate fraction -> rate, tokens/s, requests/s, latency
#                   mean and p99 (nearest rank; of 60 requests that is the
#                   maximum), peak running, preemptions (medians, min, max)
#   serve_rows.txt  the capacity, the highest rate meeting the latency target,
#                   and the two seed rows: (a) requests resident at once when
#                   all arrive at t = 0, beside the prediction; (b) mean
#                   response time with and without the cache at half the
#                   no-cache capacity, and one request alone; (c) 16 running
#                   requests in decode-only steps against the engine's static
#                   batch of 16, and the scheduler's share of the step time
#   serve.png       the curves (gnuplot)
# QUICK=1: a tiny model and trace in seconds (make test checks the script); its
# numbers mean nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}
RUNS=${RUNS:-3}
KVT=${KVT:-./kvt}
TARGET_MS=${TARGET_MS:-1000} # the latency target: p99 end-to-end at most this
if [ "${QUICK:-0}" = 1 ]; then
  model="--random 64,2,4,2,128,512,128"; trace=bench/serve_random.tsv; tmax=128; pool=512; fracs="0.5 1.5"
  nb=4; ctx=64; RUNS=${RUNS_QUICK:-1}
else
  model="--random 288,6,6,6,768,512,1024"; trace=bench/serve_synth.tsv; tmax=1024; pool=4096
  fracs="0.25 0.5 0.75 1 1.25"; nb=8; ctx=224
fi
# int8 with the default group of 32 channels: 1 byte per element plus a 4-byte
# scale per 32, so the fp32 pool's bytes hold pool * 4 / 1.125 positions
c16=$((pool / 16)); c16i8=$((pool * 4 * 32 / 36 / 16)); cpre=$((pool / tmax))
common="$model -t 0 --max-running 32 --max-batch-tokens 256 --prefix-cache off"
declare -A cfg=(
  [static_prealloc]="--chunk $tmax --chunks $cpre --serve-watermark 0 --serve-policy static"
  [cont_prealloc]="--chunk $tmax --chunks $cpre --serve-watermark 0"
  [reserve16]="--chunk 16 --chunks $c16 --serve-policy reserve"
  [cont16]="--chunk 16 --chunks $c16"
  [cont16_int8]="--chunk 16 --chunks $c16i8 --kv-dtype int8"
  [nocache]="--chunk 16 --chunks $c16 --kv-cache off"
)
curves="static_prealloc cont_prealloc reserve16 cont16 cont16_int8"
mkdir -p "$OUT/serve_runs"
W=$OUT/serve_runs
say() { echo "[bench-serve] $*" >&2; }

# the trace's requests (comments dropped), the first $2 of them, arrivals
# scaled from the trace's rate to $1 requests/s ($1 = 0: all at t = 0)
base_rate=$(sed -n 's/^# [0-9]* requests, \([0-9.]*\)\/s.*/\1/p' "$trace" | head -1)
base_rate=${base_rate:-50}
scaled() {
  awk -F'\t' -v OFS='\t' -v r="$1" -v b="$base_rate" -v n="${2:-1000000}" \
    '/^#/ { next } { if (++k > n) exit; $1 = r > 0 ? int($1 * b / r) : 0; print }' "$trace"
}
# one serve run: $1 config, $2 trace, $3 log; prints "tokens/s requests/s
# latency_mean peak_running preemptions latency_p99" (the log gives the last two)
serve() {
  local err=$W/stderr.txt
  # shellcheck disable=SC2086
  "$KVT" $common ${cfg[$1]} --serve "$2" --serve-log "$3" > /dev/null 2> "$err" || { cat "$err" >&2; exit 1; }
  awk '/ output tokens in / { for (i = 1; i <= NF; i++) { if ($(i + 1) == "tokens/s,") t = $i; if ($(i + 1) == "requests/s") r = $i } }
       / latency mean / { for (i = 1; i <= NF; i++) if ($i == "mean" && $(i - 1) == "latency") m = $(i + 1) }
       /\[serve\] running: peak / { p = $4; sub(",", "", p) }
       END { printf "%s %s %s %s", t, r, m, p }' "$err"
  awk -F, 'NR > 1 { pre += $9; lat[++n] = $5 - $2 }
           END { for (i = 2; i <= n; i++) for (j = i; j > 1 && lat[j - 1] > lat[j]; j--) { t = lat[j]; lat[j] = lat[j - 1]; lat[j - 1] = t }
                 k = int(0.99 * n); if (k < 0.99 * n) k++; printf " %d %.1f\n", pre, lat[k < 1 ? 1 : k] }' "$3"
}
median() { sort -g | awk '{ a[NR] = $1 } END { print NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# capacity: cont16 with every request at t = 0, requests/s, median of RUNS
scaled 0 > "$W/t0.tsv"
cap=$(for r in $(seq "$RUNS"); do say "capacity, run $r"; serve cont16 "$W/t0.tsv" "$W/log.csv" | awk '{ print $2 }'; done | median)
say "capacity (cont16, all at t = 0): $cap requests/s"

# the curves: each round every rate and every configuration in turn
for r in $(seq "$RUNS"); do
  echo "config,rate_frac,rate_rps,tokens_per_s,requests_per_s,latency_mean_ms,peak_running,preemptions,latency_p99_ms" > "$W/curves.$r.csv"
  for f in $fracs; do
    rate=$(awk -v f="$f" -v c="$cap" 'BEGIN { printf "%.3f", f * c }')
    scaled "$rate" > "$W/trace.tsv"
    for c in $curves; do
      say "round $r, rate $f x capacity ($rate/s), $c"
      echo "$c,$f,$rate,$(serve "$c" "$W/trace.tsv" "$W/log.csv" | tr ' ' ,)" >> "$W/curves.$r.csv"
    done
  done
done
awk -F, -v keys=2 -f bench/median.awk "$W"/curves.*.csv > "$OUT/serve.csv"

{
  echo "# make bench-serve: $(echo "$model" | cut -d' ' -f2) on $(lscpu 2> /dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(date -u +%Y-%m-%d); trace $trace; pool $pool fp32 positions; medians of $RUNS"
  echo "capacity (cont16, all $(grep -vc '^#' "$trace") requests at t = 0): $cap requests/s"
  echo "latency target: p99 end-to-end <= $TARGET_MS ms; the highest rate (fraction of capacity) meeting it:"
  for c in $curves; do
    awk -F, -v c="$c" -v t="$TARGET_MS" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
      $1 == c && $(col["latency_p99_ms"]) <= t && $2 > best { best = $2 }
      END { printf "  %-16s %s\n", c, best ? best : "none of the rates" }' "$OUT/serve.csv"
  done

  # (a) every request at t = 0, a running cap that does not bind, the step clock
  # (the schedule alone decides the peak): how many are resident at once
  echo "(a) requests resident at once, all at t = 0, --max-running 64 (peak running; preemptions):"
  for c in cont_prealloc reserve16 cont16; do
    # shellcheck disable=SC2086
    "$KVT" $model -t 0 --max-running 64 --max-batch-tokens 256 --prefix-cache off ${cfg[$c]} --serve-clock steps \
      --serve "$W/t0.tsv" --serve-log "$W/log.csv" > /dev/null 2> "$W/stderr.txt" || { cat "$W/stderr.txt" >&2; exit 1; }
    awk -v c="$c" '/\[serve\] running: peak / { p = $4; sub(",", "", p) } END { printf "  %-16s peak %s", c, p }' "$W/stderr.txt"
    awk -F, 'NR > 1 { s += $9 } END { printf ", %d preemptions\n", s }' "$W/log.csv"
  done
  # a request caches prompt + new - 1 positions (the last token is never fed back)
  grep -v '^#' "$trace" | awk -F'\t' -v pool="$pool" -v tmax="$tmax" \
    '{ n = split($3, a, ","); len = n + $2 - 1; s += int((len + 15) / 16) * 16; k++ }
     END { printf "  predicted: pool / TMAX = %d preallocated; pool / E[ceil(len / 16) * 16] = %d / %.1f = %.1f in chunks of 16\n", pool / tmax, pool, s / k, pool * k / s }'

  # (b) the first $nb requests: the no-cache capacity (all at t = 0), then both
  # at half of it, and the first request alone
  scaled 0 "$nb" > "$W/b0.tsv"
  capn=$(for r in $(seq "$RUNS"); do say "no-cache capacity, run $r"; serve nocache "$W/b0.tsv" "$W/log.csv" | awk '{ print $2 }'; done | median)
  half=$(awk -v c="$capn" 'BEGIN { printf "%.4f", c / 2 }')
  scaled "$half" "$nb" > "$W/bh.tsv"
  scaled 0 1 > "$W/b1.tsv"
  echo "(b) the first $nb requests; no-cache capacity $capn requests/s; at half of it ($half/s), mean latency ms (median of $RUNS):"
  for c in cont16 nocache; do
    m=$(for r in $(seq "$RUNS"); do say "(b) $c at $half/s, run $r"; serve "$c" "$W/bh.tsv" "$W/log.csv" | awk '{ print $3 }'; done | median)
    one=$(for r in $(seq "$RUNS"); do serve "$c" "$W/b1.tsv" "$W/log.csv" | awk '{ print $3 }'; done | median)
    printf "  %-16s mean %s ms; request 0 alone (%s) %s ms\n" "$c" "$m" \
      "$(awk -F'\t' '{ n = split($3, a, ","); printf "%d prompt + %d new", n, $2 }' "$W/b1.tsv")" "$one"
  done

  # (c) 16 running requests of equal length, decode-only steps: the serve loop
  # (scheduling, row building, sampling included) against the engine's own
  # static batch of 16 at the same contexts (--bench context: prompts of $ctx,
  # then 32 decode steps). The pool holds all 16 exactly; a decode step's time
  # is the gap to the next step's start in --trace.
  n16=$((16 * (ctx + 32) / 16))
  for i in $(seq 16); do printf '0\t33\tids:%s\n' "$(seq -s, 5 $((ctx + 4)))"; done > "$W/c16.tsv"
  for r in $(seq "$RUNS"); do
    say "(c) 16 running, run $r"
    # shellcheck disable=SC2086
    "$KVT" $common --chunk 16 --chunks "$n16" --serve "$W/c16.tsv" --trace "$W/c16_trace.txt" > /dev/null \
      2> "$W/stderr.txt" || { cat "$W/stderr.txt" >&2; exit 1; }
    s=$(awk '/^== step / { t = $5; if (d) { sum += t - prev; k++ } d = ($0 ~ / prefill 0, decode 16$/); prev = t }
             END { printf "%.1f", (k && sum > 0) ? 16e3 * k / sum : 0 }' "$W/c16_trace.txt")
    sh=$(sed -n 's/.*(scheduler \([0-9.]*\)% of the steps).*/\1/p' "$W/stderr.txt")
    # shellcheck disable=SC2086
    b=$("$KVT" $model -t 0 --chunk 16 --bench context --bench-ctx "$ctx" --bench-batch 16 2> /dev/null | awk '$1 == "fp32" { print $5 }')
    echo "$s $b $sh"
  done > "$W/c16.txt"
  s=$(awk '{ print $1 }' "$W/c16.txt" | median); b=$(awk '{ print $2 }' "$W/c16.txt" | median)
  sh=$(awk '{ print $3 }' "$W/c16.txt" | median)
  echo "(c) 16 requests of $ctx prompt + 33 new, all at t = 0, pool $n16 chunks of 16; decode-only steps, tokens/s (median of $RUNS):"
  awk -v s="$s" -v b="$b" -v c="$ctx" 'BEGIN { printf "  serve %s, static batch of 16 (--bench context --bench-ctx %d --bench-batch 16) %s: ratio %.2f\n", s, c, b, (b > 0) ? s / b : 0 }'
  echo "  scheduler: $sh% of the serve run's step time"
} > "$OUT/serve_rows.txt"
cat "$OUT/serve_rows.txt" >&2

if [ "${PLOTS:-1}" = 0 ]; then exit 0; fi
if ! command -v gnuplot > /dev/null; then
  say "no gnuplot, so no plot: install it (apt-get install gnuplot-nox) and run make bench-serve again"
  exit 1
fi
quick=""
[ "${QUICK:-0}" = 1 ] && quick="set label 99 'quick run: not a result' at graph 0.5, 0.5 center front font ',40' textcolor rgb '#d00000'"
for c in $curves; do awk -F, -v c="$c" '$1 == c' "$OUT/serve.csv" > "$W/plot_$c.csv"; done # one curve each
col() { head -1 "$OUT/serve.csv" | tr , '\n' | grep -nx "$1" | cut -d: -f1; }
plot() { # $1 the column; every curve, median with min-max bars
  local s="" i=1 y ylo yhi
  y=$(col "$1"); ylo=$(col "$1_min"); yhi=$(col "$1_max")
  for c in $curves; do
    s="$s${s:+, }'$W/plot_$c.csv' using 2:$y:$ylo:$yhi with yerrorlines linestyle $i title '${c//_/ }'"
    i=$((i + 1))
  done
  echo "plot $s"
}
gnuplot <<PLOT
set terminal pngcairo size 1600,1000 font 'sans,16' linewidth 2; set datafile separator ','
set grid; set key top left; set border linewidth 1.5; set offsets graph 0.03, graph 0.03, 0, 0
set style line 1 linecolor rgb '#000000' pointtype 5 pointsize 1.4
set style line 2 linecolor rgb '#888888' pointtype 4 pointsize 1.4
set style line 3 linecolor rgb '#e69f00' pointtype 9 pointsize 1.4
set style line 4 linecolor rgb '#0072b2' pointtype 7 pointsize 1.4
set style line 5 linecolor rgb '#009e73' pointtype 13 pointsize 1.4
set output '$OUT/serve.png'
set multiplot layout 2,2 title "Serving $(grep -vc '^#' "$trace") requests, $(echo "$model" | cut -d' ' -f2), one pool of $pool fp32 positions, capacity $cap requests/s\n{/*0.8 median and min-max of $RUNS runs; $(lscpu 2> /dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(date -u +%Y-%m-%d)}"
set xlabel 'arrival rate (fraction of capacity)'
$quick
set ylabel 'output tokens/s'
$(plot tokens_per_s)
set ylabel 'mean latency (ms)'; set key off
$(plot latency_mean_ms)
set ylabel 'p99 latency (ms)'
$(plot latency_p99_ms)
set ylabel 'peak requests running'
$(plot peak_running)
unset multiplot
PLOT
say "wrote $OUT/serve.csv, $OUT/serve_rows.txt, $OUT/serve.png"
