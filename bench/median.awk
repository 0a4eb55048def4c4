# median.awk: several runs of one measurement -> one table of medians with the
# spread. The input files are CSV tables of the same shape (the same rows in the
# same order, from repeated runs of one command); the first `keys` columns name
# a row (default 1). For every other column c the output has c (the median over
# the runs), c_min and c_max. Usage:
#   awk -F, -v keys=1 -f bench/median.awk run1.csv run2.csv run3.csv > table.csv
BEGIN { OFS = ","; if (keys == "") keys = 1 }
FNR == 1 { runs++; if (runs == 1) { header = $0; nf = NF; split($0, name, ",") } next }
{
  row = FNR - 1; if (row > rows) rows = row
  for (c = 1; c <= keys; c++) key[row, c] = $c
  for (c = keys + 1; c <= NF; c++) val[row, c, runs] = $c
}
function median(row, c,    i, j, t, a) {
  for (i = 1; i <= runs; i++) a[i] = val[row, c, i] + 0
  for (i = 2; i <= runs; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
  lo = a[1]; hi = a[runs]
  return runs % 2 ? a[(runs + 1) / 2] : (a[runs / 2] + a[runs / 2 + 1]) / 2
}
END {
  out = name[1]; for (c = 2; c <= keys; c++) out = out OFS name[c]
  for (c = keys + 1; c <= nf; c++) out = out OFS name[c] OFS name[c] "_min" OFS name[c] "_max"
  print out
  for (row = 1; row <= rows; row++) {
    out = key[row, 1]; for (c = 2; c <= keys; c++) out = out OFS key[row, c]
    for (c = keys + 1; c <= nf; c++) { m = median(row, c); out = out OFS m OFS lo OFS hi }
    print out
  }
}
