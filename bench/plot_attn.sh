#!/usr/bin/env bash
# make plot-attn: what the attention weights look like (--dump-attn), drawn for
# a slide (1600x900, large type) into $OUT (bench/out/attn/, ignored by git; a
# folder of its own, so that make bench-save never copies these CSV files):
#   attn_default_layerL.png  the default model continuing "ROMEO:" (greedy, 150
#                            characters): one heatmap per head of layer L, query
#                            position (down) against key position (across);
#   attn_chat_layerL.png     the same for a three-turn --chat with a system prompt,
#                            turn starts marked;
#   attn_chat_system.png     the share of each query's attention that lands on the
#                            system prompt, per layer (mean over heads), against
#                            the share a uniform spread would give it.
# Colours: white 0, dark blue 1, stretched at the low end so that weights of a
# few percent still show; the grey triangle is the causal mask (keys after the
# query). Needs gnuplot (make plot-attn installs it as make bench does) and ./kvt.
#   KVT=./kvt OUT=bench/out/attn bash bench/plot_attn.sh     (SAVE=1: also the tracked copies, below)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/attn}
KVT=${KVT:-./kvt}
if ! command -v gnuplot > /dev/null; then
  echo "[plot-attn] no gnuplot: install it (apt-get install gnuplot-nox) and run bash bench/plot_attn.sh" >&2
  exit 1
fi
mkdir -p "$OUT"

# The two runs. The system prompt of the chat, in the plain template, is BOS,
# its characters and a newline: 1 + length + 1 positions of the default model.
SYS="KING HENRY: Once more unto the breach, dear friends, once more."
$KVT -i "ROMEO:" -n 150 -t 0 --dump-attn "$OUT/attn_default.csv" > "$OUT/attn_default.txt"
printf 'ROMEO: What news from Verona?\nJULIET: None, my lord.\nROMEO: Then farewell.\n' |
  $KVT --chat -y "$SYS" -n 48 -t 0 --stats --dump-attn "$OUT/attn_chat.csv" > "$OUT/attn_chat.txt" 2> "$OUT/attn_chat.stats"
S=$((${#SYS} + 2))
# where each turn starts: the positions it found cached ("reused R cached positions")
TURNS=$(sed -n 's/^\[stats\] turn [0-9]*: reused \([0-9]*\) cached.*/\1/p' "$OUT/attn_chat.stats" | tr '\n' ' ')

# One matrix per head of one layer, for gnuplot's "matrix with image": row q
# (the query), column k (the key); -0.05 where k > q, the masked future (grey).
matrices() { # csv layer prefix
  awk -F, -v L="$2" -v P="$3" 'NR > 1 && $2 == L { w[$3, $1, $4] = $5; if ($1 + 1 > n) n = $1 + 1; if ($3 + 1 > nh) nh = $3 + 1 }
    END { for (h = 0; h < nh; h++) { f = P "_h" h ".txt"
            for (q = 0; q < n; q++) { line = ""
              for (k = 0; k < n; k++) line = line (k ? " " : "") (k <= q ? w[h, q, k] : -0.05)
              print line > f }
            close(f) }
          print n, nh }' "$1"
}
common="set terminal pngcairo size 1600,900 font 'sans,18' linewidth 2
set palette defined (-0.05 '#d9d9d9', -0.001 '#d9d9d9', 0 '#ffffff', 0.05 '#c6dbef', 0.2 '#6baed6', 0.5 '#2171b5', 1 '#08306b')
set cbrange [-0.05:1]"
heatmaps() { # name title marks-command
  local name=$1 title=$2 marks=$3
  for L in 0 1 2 3; do
    read -r n nh < <(matrices "$OUT/$name.csv" "$L" "$OUT/m_${name}_$L")
    gnuplot <<PLOT
$common
set output '$OUT/${name}_layer$L.png'
set multiplot layout 2,$((nh / 2)) margins 0.04,0.93,0.04,0.9 spacing 0.045,0.08 title "$title, layer $L:\\nattention weight of each query (row, a position) on each key (column, a cached position)"
set xrange [-0.5:$n - 0.5]; set yrange [$n - 0.5:-0.5]; set size ratio -1; unset colorbox
set xtics 50 font ',13'; set ytics 50 font ',13'; set cbtics 0.2 font ',13'
$marks
do for [h=0:$nh - 1] {
  set title sprintf('head %d', h) offset 0,-0.6
  if (h == $nh - 1) { set colorbox user origin 0.95, 0.2 size 0.015, 0.6 }
  plot sprintf('$OUT/m_${name}_${L}_h%d.txt', h) matrix with image notitle
}
unset multiplot
PLOT
    rm -f "$OUT"/m_"${name}"_"$L"_h*.txt
  done
}
heatmaps attn_default "The default model continuing \\\"ROMEO:\\\" (greedy)" ""
marks="set arrow from first $S - 0.5, first $S - 0.5 to first $S - 0.5, graph 0 nohead front linecolor rgb '#e69f00' linewidth 1.2"
for t in $TURNS; do marks="$marks
set arrow from -0.5, $t - 0.5 to $t - 0.5, $t - 0.5 nohead front linecolor rgb '#d00000' linewidth 1.2"; done
heatmaps attn_chat "A 3-turn --chat, system prompt = keys left of the orange line, turns start at the red lines" "$marks"

# The system prompt's share of each later query's attention, per layer.
awk -F, -v S="$S" 'NR > 1 && $1 >= S && $4 < S { m[$1, $2] += $5 } NR > 1 { if ($1 + 1 > n) n = $1 + 1; if ($2 + 1 > nl) nl = $2 + 1; if ($3 + 1 > nh) nh = $3 + 1 }
  END { for (q = S; q < n; q++) { line = q; for (l = 0; l < nl; l++) line = line " " m[q, l] / nh; print line, S / (q + 1) } }' \
  "$OUT/attn_chat.csv" > "$OUT/attn_chat_system.txt"
gnuplot <<PLOT
$common
set output '$OUT/attn_chat_system.png'
set title "How much attention the system prompt keeps: a 3-turn --chat of the default model ($S system positions)"
set xlabel 'query position (a later token of the conversation)'; set ylabel 'attention on the system prompt (mean over heads)'
set grid; set key top right; set yrange [0:1]
$(k=1; for t in $TURNS; do [ "$t" -gt "$S" ] && echo "set arrow from $t, graph 0 to $t, graph 1 nohead linecolor rgb '#999999' dashtype 2
set label 'turn $k starts' at $t, graph 0.68 offset 0.5, 0"; k=$((k + 1)); done)
plot '$OUT/attn_chat_system.txt' using 1:6 with lines linecolor rgb '#000000' dashtype 2 linewidth 3 title 'its share if spread evenly', \
     '' using 1:2 with lines linewidth 3 linecolor rgb '#e69f00' title 'layer 0', \
     '' using 1:3 with lines linewidth 3 linecolor rgb '#0072b2' title 'layer 1', \
     '' using 1:4 with lines linewidth 3 linecolor rgb '#009e73' title 'layer 2', \
     '' using 1:5 with lines linewidth 3 linecolor rgb '#cc79a7' title 'layer 3'
PLOT
# SAVE=1: these three become the tracked copies that README.md and docs/USAGE.md show
if [ "${SAVE:-0}" = 1 ]; then
  cp "$OUT/attn_default_layer1.png" bench/attn_default.png
  cp "$OUT/attn_chat_layer1.png" bench/attn_chat.png
  cp "$OUT/attn_chat_system.png" bench/attn_chat_system.png
  echo "[plot-attn] copied layer 1's heatmaps and the system prompt's share to bench/*.png"
fi
echo "[plot-attn] wrote $OUT/attn_default_layer{0..3}.png, $OUT/attn_chat_layer{0..3}.png, $OUT/attn_chat_system.png"
