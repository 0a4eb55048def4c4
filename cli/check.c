/* kvtransformer.cu §18: comparing two arrays, included by kvtransformer.cu in
 * the place of its section. make test and --check decide with it whether a
 * GPU kernel (or a fast CPU path) agrees with its spec. */

/* The first non-finite value (NaN or +-Inf) of x, or -1. The command line
 * checks every step's logits with it (one pass over V: cheap next to the
 * step): a checkpoint with NaN weights otherwise decodes as "zzzz..." or <unk>
 * and exits 0. */
static long kvt_first_nonfinite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) if (!isfinite(x[i])) return (long)i;
    return -1;
}
/* Tolerance of GPU vs CPU logits (--check, make test): the kernels sum in other
 * orders than OpenBLAS and use the device's expf/powf; fp32 rounding then
 * differs by ~1e-7 relative per op, growing through the layers to ~1e-6 on
 * logits. 1e-4 leaves a wide margin while any indexing bug shows up as O(1). */
#define KVT_TOL_GPU 1e-4
/* One comparison used by `make test` and by --check. The error of element i is
 * |got - want| / max_j |want_j|: relative to the largest value, so that a tiny
 * element's harmless rounding is not blown up, while any real bug is. NaN or
 * Inf on either side fails (every comparison with NaN is false, so it is tested
 * explicitly). `shape` decodes a flat index for the messages, e.g.
 * "row=3,head=4,ch=16" (dims outermost first). Prints the first few mismatches
 * and one PASS/FAIL line naming the tolerance to `out` (the tests: stdout;
 * --check: stderr, away from the generated text); returns 1 on PASS. */
static int kvt_check_to(FILE *out, const char *what, const float *got, const float *want, long n, const char *shape,
                     double tol, const char *tol_name) {
    char names[8][16];
    long dims[8];
    int nd = 0;
    for (const char *p = shape; p && *p && nd < 8;) { /* parse "name=size,..." */
        int used = 0;
        if (sscanf(p, "%15[^=]=%ld%n", names[nd], &dims[nd], &used) != 2) break;
        nd++;
        p += used;
        if (*p == ',') p++;
    }
    double scale = 0.0;
    for (long i = 0; i < n; i++) if (isfinite(want[i])) scale = fmax(scale, fabs((double)want[i]));
    if (scale == 0.0) scale = 1.0;
    double worst = 0.0;
    long worst_i = -1, bad = 0;
    for (long i = 0; i < n; i++) {
        int finite = isfinite(got[i]) && isfinite(want[i]);
        double err = finite ? fabs((double)got[i] - (double)want[i]) / scale : INFINITY;
        if (err > worst || worst_i < 0) { worst = err; worst_i = i; }
        if (err <= tol) continue;
        if (bad++ < 5) {
            char where[256] = "";
            long idx[8], rem = i;
            int off = 0;
            for (int d = nd - 1; d >= 0; d--) { idx[d] = rem % dims[d]; rem /= dims[d]; } /* innermost fastest */
            for (int d = 0; d < nd && off < (int)sizeof(where); d++)
                off += snprintf(where + off, sizeof(where) - (size_t)off, "%s%s %ld", d ? ", " : "", names[d], idx[d]);
            if (nd == 0) snprintf(where, sizeof(where), "index %ld", i);
            fprintf(out, "    mismatch at %s: got %.9g, want %.9g (error %.3g)\n", where, got[i], want[i], err);
        }
    }
    int ok = bad == 0;
    fprintf(out, "%s %s: max error %.3g (relative to max |want| %.3g) %s %s = %.0e\n", ok ? "PASS" : "FAIL", what,
            worst, scale, ok ? "<=" : ">", tol_name, tol);
    if (bad) fprintf(out, "    %ld of %ld elements over the tolerance\n", bad, n);
    return ok;
}
/* The tests' spelling: the same check, its lines on stdout. */
#define kvt_check(...) kvt_check_to(stdout, __VA_ARGS__)
