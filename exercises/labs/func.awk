# Finds function NAME in a C file written in this repository's style: its
# definition starts on a line that names it at the start of a declaration
# (after static / KVT_HD / __global__ / a return type, before its "(") and does
# not end in ";"; its body starts after the first line ending in "{" and the
# function ends at the next line that is exactly "}".
#   awk -v name=NAME -v mode=range -f func.awk FILE   -> "first open last" (line numbers)
#   awk -v name=NAME -v mode=stub -v lab=K [-v keep="f g"] -f func.awk FILE  -> FILE with the body
#       replaced (keep: helpers the stub names with (void), as only the emptied bodies called them)
#   awk -v name=NAME -v mode=print -f func.awk FILE   -> the function's lines
#   awk -v name=NAME -v mode=splice -v body=F -f func.awk FILE -> FILE, the body from file F
function is_def(line,   re) {
    re = "^([A-Za-z_][A-Za-z0-9_]*[ \\t*]+)+" name "[ \\t]*\\("
    return line ~ re && line !~ /;[ \t]*$/ && line !~ /^[ \t]/
}
{ lines[NR] = $0 }
END {
    first = 0
    for (i = 1; i <= NR; i++) if (is_def(lines[i])) { first = i; break }
    if (!first) { print "func.awk: no definition of " name > "/dev/stderr"; exit 2 }
    open = 0
    for (i = first; i <= NR; i++) if (lines[i] ~ /\{[ \t]*(\/\*.*\*\/)?[ \t]*$/) { open = i; break }
    last = 0
    for (i = open + 1; i <= NR; i++) if (lines[i] == "}") { last = i; break }
    if (!open || !last) { print "func.awk: " name ": no body ending in a line \"}\"" > "/dev/stderr"; exit 2 }
    if (mode == "range") { print first, open, last; exit 0 }
    if (mode == "print") { for (i = first; i <= last; i++) print lines[i]; exit 0 }
    if (mode == "stub") {
        sig = ""
        for (i = first; i <= open; i++) sig = sig " " lines[i]
        ret = substr(sig, 1, index(sig, name "(") - 1)
        gsub(/static|KVT_HD|__global__|inline|KVT_INLINE/, "", ret)
        gsub(/^[ \t]+|[ \t]+$/, "", ret)
        args = substr(sig, index(sig, name "(") + length(name) + 1)
        sub(/\)[^)]*\{.*$/, "", args)
        n = split(args, a, ",")
        voids = ""
        for (j = 1; j <= n; j++) {
            p = a[j]
            gsub(/\[[^]]*\]/, "", p)
            gsub(/[ \t]+$/, "", p)
            if (p ~ /^[ \t]*void[ \t]*$/ || p ~ /^[ \t]*$/) continue
            m = match(p, /[A-Za-z_][A-Za-z0-9_]*$/)
            if (m) voids = voids "(void)" substr(p, RSTART, RLENGTH) "; "
        }
        for (i = 1; i <= open; i++) print lines[i]
        print "    /* lab " lab ": write this (docs/LABS.md) */"
        if (voids != "") { sub(/ $/, "", voids); print "    " voids }
        nk = split(keep, kk, " ") # helpers only the emptied bodies call: named, so the build does not warn
        for (j = 1; j <= nk; j++) print "    (void)" kk[j] "; /* a helper for you */"
        if (ret != "void") print "    return (" ret ")0;" # a neutral value: 0, NULL, KVT_OK
        for (i = last; i <= NR; i++) print lines[i]
        exit 0
    }
    if (mode == "splice") {
        for (i = 1; i <= open; i++) print lines[i]
        while ((getline l < body) > 0) print l
        for (i = last; i <= NR; i++) print lines[i]
        exit 0
    }
}
