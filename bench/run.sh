#!/usr/bin/env bash
# make bench: every measurement of docs/RESULTS.md, written to
# $OUT (default bench/out, ignored by git: a run never changes tracked files;
# `make bench-save` copies a run into bench/ deliberately). The two plotted
# measurements (cache on/off by position, decode speed by context) run RUNS
# times (default 3) and are plotted as median and min-max. About 25 minutes on
# 2 cores; nothing else should run meanwhile (these are timings).
#
# QUICK=1 runs the same steps on tiny models in seconds: make test uses it to
# check that a run leaves the checkout clean and draws both plots. Its numbers
# mean nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}
RUNS=${RUNS:-3}
KVT=${KVT:-./kvt}
if [ "${QUICK:-0}" = 1 ]; then
  m110="--random 64,2,4,4,128,100,256"; m110l=$m110; m15=$m110; attn="--random 64,1,4,2,128,100,256"
  c1=200; c16=200; curve="50 100 150 200"; every=64; stages=200; fork=40; RUNS=${RUNS_QUICK:-2}
else
  m110="--random 768,12,12,12,2048,32000,1024"   # stories110M shape, TMAX 1024
  m110l="--random 768,12,12,12,2048,32000,4096"  # the same with TMAX 4096
  m15="--random 288,6,6,6,768,32000,1024"        # stories15M shape
  attn="--random 512,1,8,2,1024,100,4096"
  c1=960; c16=960; curve="250 1000 2000 4000"; every=64; stages=1000; fork=400
fi
mkdir -p "$OUT/runs"
say() { echo "[bench] $*" >&2; }
run() { say "$KVT $*"; "$KVT" "$@" > /dev/null; }

run $m110 --bench decode --csv "$OUT/decode_110m.csv"
run $m110 --bench matmul --csv "$OUT/matmul_110m.csv"
run $m110 --bench context --bench-ctx $c1 --bench-batch 1 --csv "$OUT/context_b1_960.csv"
run $m110 --bench context --bench-ctx $c16 --bench-batch 16 --csv "$OUT/context_b16_960.csv"
run $m15 --bench stages --bench-ctx $stages --csv "$OUT/stages.csv"
run $m15 --bench batch --csv "$OUT/batch.csv"
run $attn --bench attention --csv "$OUT/attention_4096.csv"
for share in on off; do
  name=fork8; [ $share = off ] && name=fork8_independent
  say "$KVT $m15 --prompt-tokens $fork --fork 8 -n 100 --chunk 16 --stats -t 0.8 --fork-share $share"
  "$KVT" $m15 --prompt-tokens $fork --fork 8 -n 100 --chunk 16 --stats -t 0.8 --fork-share $share 2>&1 > /dev/null |
    grep stats > "$OUT/$name.txt"
done

# the plotted ones, RUNS times: per cache type, ms per token by position (cache
# on and off), and 4 sequences' decode tokens/s by context
for r in $(seq "$RUNS"); do
  for dt in fp32 fp16 int8; do
    run $m15 --bench positions --bench-every $every --kv-dtype $dt --csv "$OUT/runs/positions_${dt}_$r.csv"
  done
  for t in $curve; do
    run $m110l --bench context --bench-ctx "$t" --bench-batch 4 --csv "$OUT/runs/context_b4_${t}_$r.csv"
  done
  (head -1 "$OUT/runs/context_b4_${t}_$r.csv"
   for dt in fp32 fp16 int8; do for t in $curve; do grep "^$dt," "$OUT/runs/context_b4_${t}_$r.csv"; done; done
  ) > "$OUT/runs/context_curve_$r.csv"
  # decode tokens/s of fp16 and int8 over fp32's, per context, in this run
  awk -F, 'NR > 1 { v[$1, $3] = $5; if (!($3 in seen)) { seen[$3]; ctx[++n] = $3 } }
    END { print "ctx,fp16_over_fp32,int8_over_fp32"
          for (i = 1; i <= n; i++) printf "%s,%.4f,%.4f\n", ctx[i], v["fp16", ctx[i]] / v["fp32", ctx[i]],
                                          v["int8", ctx[i]] / v["fp32", ctx[i]] }' \
    "$OUT/runs/context_curve_$r.csv" > "$OUT/runs/context_ratio_$r.csv"
done
last=$(echo $curve | awk '{ print $NF }')
cp "$OUT/runs/context_b4_${last}_1.csv" "$OUT/context_b4_4000.csv"
runs() { for r in $(seq "$RUNS"); do echo "$OUT/runs/$1_$r.csv"; done; }
for dt in fp32 fp16 int8; do awk -F, -v keys=1 -f bench/median.awk $(runs positions_$dt) > "$OUT/positions_$dt.csv"; done
awk -F, -v keys=3 -f bench/median.awk $(runs context_curve) > "$OUT/context_curve.csv"
awk -F, -v keys=1 -f bench/median.awk $(runs context_ratio) > "$OUT/context_ratio.csv"
say "tables in $OUT (medians of $RUNS runs for positions and context)"
[ "${PLOTS:-1}" = 1 ] || exit 0 # PLOTS=0: tables only (make test, where gnuplot is missing)
OUT=$OUT RUNS=$RUNS MODEL15="$m15" MODEL110="$m110l" bash bench/plots.sh
