#!/usr/bin/env bash
# The two figures of make bench, drawn from the tables bench/run.sh wrote in
# $OUT, sized for a slide (1600x900, large type): positions.png (ms per token
# against position, cache off and on per cache type, and the speedup) and
# context.png (decode tokens/s of 4 sequences against context per cache type,
# and fp16/int8 against fp32). Points are medians of the runs, bars min to max.
# Needs gnuplot; make bench installs it (gnuplot-nox) where it can.
#   MACHINE="..."  the caption's machine and date (default: this machine, today);
#                  set it when drawing the tracked CSVs of another machine again:
#   OUT=bench MACHINE="Intel(R) Xeon(R) Processor, 2 cores, 2026-12-01" bash bench/plots.sh
#   QUICK=1        (bench/run.sh's tiny models) writes "quick run: not a result" on both plots
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}
RUNS=${RUNS:-3}
if ! command -v gnuplot > /dev/null; then
  echo "[bench] no gnuplot, so no plots: install it (apt-get install gnuplot-nox) and run bash bench/plots.sh" >&2
  exit 1
fi
# "--random D,L,NH,NKV,HD,V,TMAX" -> "D 288, L 6, NH 6, NKV 6, HS 48, TMAX 1024"
shape() { echo "$1" | awk '{ split($2, a, ","); printf "D %d, L %d, NH %d, NKV %d, HS %d, TMAX %d", a[1], a[2], a[3], a[4], a[1] / a[3], a[7] }'; }
machine=${MACHINE:-"$(lscpu 2> /dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(date -u +%Y-%m-%d)"}
common="set terminal pngcairo size 1600,900 font 'sans,20' linewidth 2; set datafile separator ','
set grid; set key top left; set border linewidth 1.5; set offsets graph 0.03, graph 0.03, 0, 0
set style line 1 linecolor rgb '#000000' pointtype 5 pointsize 1.6 # cache off: black squares
set style line 2 linecolor rgb '#0072b2' pointtype 7 pointsize 1.6 # fp32: blue circles
set style line 3 linecolor rgb '#e69f00' pointtype 9 pointsize 1.8 # fp16: orange triangles
set style line 4 linecolor rgb '#009e73' pointtype 13 pointsize 1.8 # int8: green diamonds"
caption="median and min-max of $RUNS runs; $machine"
# a QUICK=1 run times tiny models for a few seconds: its plots must not pass for results
quick=""
if [ "${QUICK:-0}" = 1 ]; then
  caption="QUICK RUN, NOT A RESULT: tiny models; $caption"
  quick="set label 99 'quick run: not a result' at graph 0.5, 0.5 center front font ',40' textcolor rgb '#d00000'"
fi

gnuplot <<PLOT
$common
set output '$OUT/positions.png'
set multiplot layout 1,2 title "Random model, $(shape "${MODEL15:---random 288,6,6,6,768,32000,1024}"), chunk 16, on the CPU\n{/*0.8 $caption}"
set xlabel 'position of the generated token'; set xtics 200
$quick
# a log axis: the cache-on curves (a few ms) and cache off (hundreds) both readable
set ylabel 'ms per generated token (log scale)'; set logscale y; set format y '%g'
set ytics add (0.02, 0.05, 0.2, 0.5, 2, 5, 20, 50, 200, 500)
set title 'cost of one token: grows with T without the cache, flat with it'
plot '$OUT/positions_fp32.csv' using 1:5:6:7 skip 1 with yerrorlines linestyle 1 title 'cache off', \
     '$OUT/positions_fp32.csv' using 1:2:3:4 skip 1 with yerrorlines linestyle 2 title 'cache on, fp32', \
     '$OUT/positions_fp16.csv' using 1:2:3:4 skip 1 with yerrorlines linestyle 3 title 'cache on, fp16', \
     '$OUT/positions_int8.csv' using 1:2:3:4 skip 1 with yerrorlines linestyle 4 title 'cache on, int8'
unset logscale y; set yrange [0:*]; set ytics autofreq
set ylabel 'cache off / cache on (x faster)'; set title 'speedup of the cache'
plot '$OUT/positions_fp32.csv' using 1:8:9:10 skip 1 with yerrorlines linestyle 2 title 'fp32 cache', \
     '$OUT/positions_fp16.csv' using 1:8:9:10 skip 1 with yerrorlines linestyle 3 title 'fp16 cache', \
     '$OUT/positions_int8.csv' using 1:8:9:10 skip 1 with yerrorlines linestyle 4 title 'int8 cache'
unset multiplot
PLOT

gnuplot <<PLOT
$common
set output '$OUT/context.png'
set multiplot layout 1,2 title "Random model, $(shape "${MODEL110:---random 768,12,12,12,2048,32000,4096}"), chunk 16, 4 sequences, on the CPU\n{/*0.8 $caption}"
set xlabel 'context (positions cached per sequence)'; set ylabel 'decode tokens/s (4 sequences)'; set yrange [0:*]
set xtics 1000
$quick
set title "decode speed; dashed: its bound, tokens/s =\\nread bandwidth / bytes read per step"; set key top right
d = 'fp32 fp16 int8'
plot for [i=1:3] '$OUT/context_curve.csv' using 3:(strcol(1) eq word(d,i) ? \$7 : 1/0):8:9 skip 1 \
       with yerrorlines linestyle i+1 title word(d,i).' cache', \
     for [i=1:3] '$OUT/context_curve.csv' using 3:(strcol(1) eq word(d,i) ? \$13 : 1/0) skip 1 \
       with lines linestyle i+1 dashtype 2 notitle, \
     NaN with lines linecolor rgb '#000000' dashtype 2 title 'bound (tokens/s)'
set ylabel 'decode tokens/s over fp32 cache'; set title 'smaller cache types against fp32'; set key bottom right
plot '$OUT/context_ratio.csv' using 1:2:3:4 skip 1 with yerrorlines linestyle 3 title 'fp16 / fp32', \
     '$OUT/context_ratio.csv' using 1:5:6:7 skip 1 with yerrorlines linestyle 4 title 'int8 / fp32', \
     1 with lines linecolor rgb '#888888' dashtype 3 notitle
unset multiplot
PLOT
echo "[bench] wrote $OUT/positions.png and $OUT/context.png" >&2
