/* test.c - `make test`: every op against an independent float64 computation,
 * every GPU kernel against the CPU path (emulated in the C build, on the device
 * in the nvcc build), end-to-end equivalences (cache on/off, chunk sizes,
 * prefill vs one token at a time), number formats, and bad input.
 *
 * It includes kvtransformer.cu itself so it can call the static ops directly.
 * Usage: ./test_kvt [path to the kvt binary, for the command-line checks]
 * Ends with "N passed, N failed, N skipped"; exits 1 on any failure. */
#define KVT_NO_MAIN
#define KVT_CLI /* the command line (§20) too, without main: its parser, the --serve scheduler */
#pragma GCC diagnostic ignored "-Wunused-function" /* the runners that only main calls */
#include "kvtransformer.cu"
#include <unistd.h> /* getpid: the tests' temporary file names */
#include <fcntl.h>  /* open: files the exercise checks send a run's output to */

/* Tolerances, each relative to the largest |value| of the reference:
 * TOL_OP: one fp32 op (a dot product of <= 512 terms) against float64: fp32
 *   rounding is ~1e-7 per term, so 1e-5 is 10x above what correct code shows;
 *   a wrong index or a missing term is O(1).
 * TOL_ATTN: the issue's bound for fused vs naive attention, also used against
 *   the float64 reference.
 * TOL_E2E: two fp32 forward passes that differ only in summation order
 *   (sgemm vs sgemv, cached vs recomputed, chunk sizes): ~1e-6 seen on logits.
 * KVT_TOL_GPU (§18, cli/check.c): GPU vs CPU logits. */
#define TOL_OP 1e-5
#define TOL_ATTN 1e-5
#define TOL_E2E 1e-5
/* TOL_TIE: two logits within 0.5% of the largest |logit| are a near tie, which
 * int8's per-step logit change (median 0.46% on the default model) may swap. */
#define TOL_TIE 5e-3

static int n_pass, n_fail, n_skip;
static const char *kvt_bin = "./kvt";

/* Every file a run writes lives in its own temporary folder (main makes it
 * with mkdtemp and removes it at the end), so two suites on one machine never
 * read each other's half-written files. tmp_file("ppl.txt") is that folder's
 * file (the same name gives the same buffer, valid for the whole run); in a
 * command line or an expected message, "@T" stands for the folder. */
static char test_dir[64];
static const char *tmp_file(const char *name) {
    static char names[64][48], paths[64][128];
    static int n;
    int i = 0;
    while (i < n && strcmp(names[i], name)) i++;
    if (i == n) {
        KVT_ASSERT(n < 64 && strlen(name) < sizeof(names[0]) && test_dir[0]);
        snprintf(names[n], sizeof(names[0]), "%s", name);
        snprintf(paths[n], sizeof(paths[0]), "%s/%s", test_dir, name);
        n++;
    }
    return paths[i];
}
static void remove_test_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", test_dir);
    if (test_dir[0] && system(cmd) != 0) printf("(could not remove %s)\n", test_dir);
}
/* test_dir: a new folder kvt_test.XXXXXX in $TMPDIR (when short enough) or /tmp. */
static int make_test_dir(void) {
    const char *t = getenv("TMPDIR");
    snprintf(test_dir, sizeof(test_dir), "%s/kvt_test.XXXXXX", t && t[0] && strlen(t) < 40 ? t : "/tmp");
    if (mkdtemp(test_dir)) return 1;
    printf("cannot make a temporary folder %s: %s\n", test_dir, strerror(errno));
    test_dir[0] = '\0';
    return 0;
}
static void with_test_dir(char *out, size_t cap, const char *s) { /* "@T" -> test_dir */
    size_t k = 0;
    for (; *s && k + 1 < cap; s++) {
        if (s[0] == '@' && s[1] == 'T') { k += (size_t)snprintf(out + k, cap - k, "%s", test_dir); s++; }
        else out[k++] = *s;
        if (k >= cap) k = cap - 1;
    }
    out[k] = '\0';
}

/* Every check ends here. KVT_TEST_FIRST_FAIL=1 stops the run at the first
 * failed check (its FAIL line is printed already), with the usual last line:
 * the bug hunts (exercises/bugs/) need only one symptom, and fast. */
static void tally(int ok) {
    if (ok) { n_pass++; return; }
    n_fail++;
    const char *first = getenv("KVT_TEST_FIRST_FAIL");
    if (first && !strcmp(first, "1")) {
        remove_test_dir();
        printf("(KVT_TEST_FIRST_FAIL=1: stopped at the first failed check)\n");
        printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
        exit(1);
    }
}
static int expect(int ok, const char *fmt, ...) {
    va_list ap;
    printf("%s ", ok ? "PASS" : "FAIL");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    tally(ok);
    return ok;
}
static void skip(const char *what) { printf("SKIP %s\n", what); n_skip++; }
static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static float *frand(size_t n, float scale, uint64_t seed) {
    float *x = (float *)kvt_malloc(n * sizeof(float));
    uint64_t s = seed * 7919 + 13;
    kvt_fill_uniform(x, n, scale, 0.0f, &s);
    return x;
}
static void *dev_copy(int gpu, const void *h, size_t bytes) { /* a buffer on the test's device */
    void *d;
    KVT_ASSERT(buf_alloc(gpu, &d, bytes, "test buffer") == KVT_OK);
    buf_upload(gpu, d, h, bytes);
    return d;
}
static float *to_host(int gpu, const float *d, size_t n) {
    float *h = (float *)kvt_malloc(n * sizeof(float));
    buf_download(gpu, h, d, n * sizeof(float));
    return h;
}
/* float (n) -> float, so kvt_check can compare a float64 reference */
static float *narrow(const double *x, size_t n) {
    float *f = (float *)kvt_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}

/* A pool on its own (the engine checks memory between the two steps). */
static kvt_status pool_init(kvt_pool *p, int gpu, int L, int NKV, int HS, int CH, int n_chunks, kvt_dtype dt, int G) {
    size_t data_bytes, scale_bytes;
    kvt_status st = pool_shape(p, gpu, L, NKV, HS, CH, n_chunks, dt, G, &data_bytes, &scale_bytes);
    return st == KVT_OK ? pool_alloc(p, data_bytes, scale_bytes) : st;
}

// ---- ops against float64 -------------------------------------------------------

static void test_rmsnorm(int gpu) {
    int n = 3, D = 45;
    float *x = frand((size_t)n * D, 2.0f, 1), *w = frand(D, 1.0f, 2);
    double *ref = (double *)kvt_malloc((size_t)n * D * sizeof(double));
    for (int r = 0; r < n; r++) {
        double ss = 0;
        for (int c = 0; c < D; c++) ss += (double)x[r * D + c] * x[r * D + c];
        for (int c = 0; c < D; c++) ref[r * D + c] = w[c] * x[r * D + c] / sqrt(ss / D + 1e-5);
    }
    float *dx = (float *)dev_copy(gpu, x, (size_t)n * D * 4), *dw = (float *)dev_copy(gpu, w, (size_t)D * 4);
    float *dout = (float *)dev_copy(gpu, x, (size_t)n * D * 4);
    if (gpu) rmsnorm_gpu(dout, dx, dw, n, D);
    else rmsnorm_cpu(dout, dx, dw, n, D);
    float *got = to_host(gpu, dout, (size_t)n * D), *want = narrow(ref, (size_t)n * D);
    tally(kvt_check(gpu ? "rmsnorm gpu vs float64" : "rmsnorm cpu vs float64", got, want, (long)n * D,
                    "row=3,ch=45", TOL_OP, "TOL_OP"));
    buf_free(gpu, dx); buf_free(gpu, dw); buf_free(gpu, dout);
    free(x); free(w); free(ref); free(got); free(want);
}

/* matmul through `fn` (cpu, the rows kernel, the tiled kernel) for one shape. */
static void test_matmul_one(int gpu, const char *name, void (*fn)(float *, const float *, const float *, int, int, int),
                            int n, int k, int d) {
    float *x = frand((size_t)n * k, 1.0f, 3), *w = frand((size_t)d * k, 1.0f, 4);
    double *ref = (double *)kvt_malloc((size_t)n * d * sizeof(double));
    for (int r = 0; r < n; r++)
        for (int o = 0; o < d; o++) {
            double s = 0;
            for (int c = 0; c < k; c++) s += (double)x[(size_t)r * k + c] * w[(size_t)o * k + c];
            ref[(size_t)r * d + o] = s;
        }
    float *dx = (float *)dev_copy(gpu, x, (size_t)n * k * 4), *dw = (float *)dev_copy(gpu, w, (size_t)d * k * 4);
    float *dout = (float *)dev_copy(gpu, ref, 4); /* contents irrelevant */
    buf_free(gpu, dout);
    KVT_ASSERT(buf_alloc(gpu, (void **)&dout, (size_t)n * d * 4, "test") == KVT_OK);
    fn(dout, dx, dw, n, k, d);
    float *got = to_host(gpu, dout, (size_t)n * d), *want = narrow(ref, (size_t)n * d);
    char what[96], shape[64];
    snprintf(what, sizeof(what), "matmul %s n=%d k=%d d=%d vs float64", name, n, k, d);
    snprintf(shape, sizeof(shape), "row=%d,out=%d", n, d);
    tally(kvt_check(what, got, want, (long)n * d, shape, TOL_OP, "TOL_OP"));
    buf_free(gpu, dx); buf_free(gpu, dw); buf_free(gpu, dout);
    free(x); free(w); free(ref); free(got); free(want);
}
/* The row loop with its hint fixed on or off, whichever this CPU's
 * row_hint_cpu would pick: a hint changes no value, and both ways run on
 * some machine, so both must give the right sums. */
static int test_row_hint;
static void row_loop_fixed_hint(float *out, const float *x, const float *w, int n, int k, int d) {
    matmul_rows_part_cpu(out, x, w, n, k, d, 0, d, test_row_hint);
}
static void test_matmul(int gpu) {
    int shapes[][3] = {{1, 45, 70}, {5, 45, 70}, {17, 64, 33}, {1, 128, 97}, {40, 300, 130}, {12, 45, 70}, {16, 300, 130}};
    if (!gpu) { /* the CPU's own loops for every row count they serve: 1..4 rows one
                 * weight row at a time (matmul_row_cpu), 5..17 the tile (KVT_TILE_X
                 * rows of x at a time, then the rest); k not a multiple of 16, d not
                 * a multiple of 4 */
        for (int n = 1; n <= 17; n++)
            test_matmul_one(0, n <= KVT_ROW_X ? "cpu row loop" : "cpu tile loop", matmul_rows_cpu, n, 19 + 14 * n,
                            3 + 5 * n);
        for (test_row_hint = 0; test_row_hint < 2; test_row_hint++) /* rows longer than the hint's 512 floats */
            for (int n = 1; n <= KVT_ROW_X; n++)
                test_matmul_one(0, test_row_hint ? "cpu row loop, hint on" : "cpu row loop, hint off",
                                row_loop_fixed_hint, n, 1001 + 32 * n, 9);
        test_matmul_one(0, "cpu row loop", matmul_rows_cpu, 3, 7, 5); /* k < 16: leftovers only */
        test_matmul_one(0, "cpu tile loop", matmul_rows_cpu, 7, 7, 5);
        /* 42 chunks of 24 rows (the last one 19), a part of 21 chunks per core
         * with 2 cores: a chunk no core claims leaves its outputs unwritten */
        test_matmul_one(0, "cpu row loop, shared in chunks", matmul_rows_cpu, 1, 1001, 1003);
        test_matmul_one(0, "cpu row loop, shared in chunks", matmul_rows_cpu, 4, 1001, 1003);
        test_matmul_one(0, "cpu tile loop, shared in chunks", matmul_rows_cpu, 6, 1001, 1003);
        test_matmul_one(0, "cpu sgemm split over the cores", matmul_sgemm_cpu, 40, 300, 130);
        test_matmul_one(0, "cpu sgemm split over the cores", matmul_sgemm_cpu, 3, 45, 1); /* d < threads */
    }
    for (int i = 0; i < 7; i++) {
        int n = shapes[i][0], k = shapes[i][1], d = shapes[i][2];
        if (!gpu) {
            test_matmul_one(0, "cpu (tiles or sgemm)", matmul_cpu, n, k, d);
            test_matmul_one(0, "cpu spec loop", matmul_spec_cpu, n, k, d);
            test_matmul_one(0, "cpu --plain (spec loop or sgemm)", matmul_plain_cpu, n, k, d);
        } else {
            test_matmul_one(1, "gpu rows kernel", matmul_rows_gpu, n, k, d);
            test_matmul_one(1, "gpu batch kernel", matmul_batch_gpu, n, k, d);
            test_matmul_one(1, "gpu tiled kernel", matmul_tiled_gpu, n, k, d);
            test_matmul_one(1, "gpu --plain (dot kernel or tiled)", matmul_plain_gpu, n, k, d);
        }
    }
}

static void test_rope(int gpu, double theta) { /* theta: the RoPE base */
    enum { HS = 8 };
    int n = 4, NH = 4, NKV = 2, pos[4] = {0, 1, 37, 511};
    float *q = frand((size_t)n * NH * HS, 1.0f, 5), *k = frand((size_t)n * NKV * HS, 1.0f, 6);
    double *rq = (double *)kvt_malloc((size_t)n * NH * HS * sizeof(double));
    double *rk = (double *)kvt_malloc((size_t)n * NKV * HS * sizeof(double));
    for (int pass = 0; pass < 2; pass++) { /* independent: angle = pos * theta^(-i/HS), float64 */
        const float *src = pass ? k : q;
        double *dst = pass ? rk : rq;
        int heads = pass ? NKV : NH;
        for (int r = 0; r < n; r++)
            for (int h = 0; h < heads; h++)
                for (int i = 0; i < HS; i += 2) {
                    double a = pos[r] * pow(theta, -(double)i / HS);
                    const float *v = src + ((size_t)r * heads + h) * HS + i;
                    dst[((size_t)r * heads + h) * HS + i] = v[0] * cos(a) - v[1] * sin(a);
                    dst[((size_t)r * heads + h) * HS + i + 1] = v[0] * sin(a) + v[1] * cos(a);
                }
    }
    float *dq = (float *)dev_copy(gpu, q, (size_t)n * NH * HS * 4), *dk = (float *)dev_copy(gpu, k, (size_t)n * NKV * HS * 4);
    int *dpos = (int *)dev_copy(gpu, pos, sizeof(pos));
    float freq[HS / 2];
    rope_freqs(freq, HS, theta);
    float *dfreq = (float *)dev_copy(gpu, freq, sizeof(freq));
    if (gpu) rope_gpu(dq, dk, dfreq, dpos, n, NH, NKV, HS);
    else rope_cpu(dq, dk, dfreq, dpos, n, NH, NKV, HS);
    float *gq = to_host(gpu, dq, (size_t)n * NH * HS), *gk = to_host(gpu, dk, (size_t)n * NKV * HS);
    float *wq = narrow(rq, (size_t)n * NH * HS), *wk = narrow(rk, (size_t)n * NKV * HS);
    /* fp32 angles at position 511 carry ~3e-5 rad of rounding (511 * 2^-24 * 4) */
    char what[2][64];
    snprintf(what[0], sizeof(what[0]), "rope q %s vs float64, base %g", gpu ? "gpu" : "cpu", theta);
    snprintf(what[1], sizeof(what[1]), "rope k %s vs float64, base %g", gpu ? "gpu" : "cpu", theta);
    tally(kvt_check(what[0], gq, wq, (long)n * NH * HS, "row=4,head=4,ch=8", 1e-4, "TOL_ROPE_ANGLE"));
    tally(kvt_check(what[1], gk, wk, (long)n * NKV * HS, "row=4,head=2,ch=8", 1e-4, "TOL_ROPE_ANGLE"));
    buf_free(gpu, dq); buf_free(gpu, dk); buf_free(gpu, dpos); buf_free(gpu, dfreq);
    free(q); free(k); free(rq); free(rk); free(gq); free(gk); free(wq); free(wk);
}

static void test_swiglu_residual_embed(int gpu) {
    int n = 3, HD = 50, D = 20, V = 7, toks[3] = {6, 0, 3};
    float *a = frand((size_t)n * HD, 4.0f, 7), *b = frand((size_t)n * HD, 1.0f, 8);
    double *ref = (double *)kvt_malloc((size_t)n * HD * sizeof(double));
    for (int i = 0; i < n * HD; i++) ref[i] = a[i] / (1.0 + exp(-(double)a[i])) * b[i];
    float *da = (float *)dev_copy(gpu, a, (size_t)n * HD * 4), *db = (float *)dev_copy(gpu, b, (size_t)n * HD * 4);
    if (gpu) swiglu_gpu(da, db, n, HD);
    else swiglu_cpu(da, db, n, HD);
    float *got = to_host(gpu, da, (size_t)n * HD), *want = narrow(ref, (size_t)n * HD);
    tally(kvt_check(gpu ? "swiglu gpu vs float64" : "swiglu cpu vs float64", got, want, (long)n * HD, "row=3,ch=50",
                    TOL_OP, "TOL_OP"));
    /* residual: x + y is exact in both */
    float *x = frand((size_t)n * D, 1.0f, 9), *y = frand((size_t)n * D, 1.0f, 10), sum[60];
    for (int i = 0; i < n * D; i++) sum[i] = x[i] + y[i];
    float *dx = (float *)dev_copy(gpu, x, (size_t)n * D * 4), *dy = (float *)dev_copy(gpu, y, (size_t)n * D * 4);
    if (gpu) residual_gpu(dx, dy, n, D);
    else residual_cpu(dx, dy, n, D);
    float *gx = to_host(gpu, dx, (size_t)n * D);
    tally(kvt_check(gpu ? "residual gpu" : "residual cpu", gx, sum, (long)n * D, "row=3,ch=20", 0.0, "exact"));
    /* embedding: a gather, exact */
    float *table = frand((size_t)V * D, 1.0f, 11), want_e[60];
    for (int r = 0; r < n; r++) memcpy(want_e + r * D, table + toks[r] * D, (size_t)D * 4);
    float *dt = (float *)dev_copy(gpu, table, (size_t)V * D * 4), *de = (float *)dev_copy(gpu, want_e, sizeof(want_e));
    int *dtok = (int *)dev_copy(gpu, toks, sizeof(toks));
    if (gpu) embed_gpu(de, dt, dtok, n, D);
    else embed_cpu(de, dt, dtok, n, D);
    float *ge = to_host(gpu, de, (size_t)n * D);
    tally(kvt_check(gpu ? "embedding gpu" : "embedding cpu", ge, want_e, (long)n * D, "row=3,ch=20", 0.0, "exact"));
    buf_free(gpu, da); buf_free(gpu, db); buf_free(gpu, dx); buf_free(gpu, dy);
    buf_free(gpu, dt); buf_free(gpu, de); buf_free(gpu, dtok);
    free(a); free(b); free(ref); free(got); free(want); free(x); free(y); free(gx); free(table); free(ge);
}

/* block_reduce (warp shuffles + shared memory) for sums and maxes, on the row
 * kernels' block of KVT_THREADS: 1 warp in the C build, 4 in the GPU build and
 * in make test-gpu-sizes (which is where the step across warps is checked). */
__global__ void test_reduce_kernel(float *out, const float *x, int n) {
    float s = 0.0f, m = -INFINITY;
    for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) { s += x[i]; m = fmaxf(m, x[i]); }
    s = block_reduce(s, KVT_SUM);
    m = block_reduce(m, KVT_MAX);
    if (threadIdx.x == 0) { out[0] = s; out[1] = m; }
}
static void test_block_reduce(void) {
    int n = 1000;
    float *x = frand((size_t)n, 3.0f, 12), want[2] = {0.0f, -INFINITY};
    double s = 0;
    for (int i = 0; i < n; i++) { s += x[i]; want[1] = fmaxf(want[1], x[i]); }
    want[0] = (float)s;
    float *dx = (float *)dev_copy(1, x, (size_t)n * 4), *dout = (float *)dev_copy(1, want, 8);
    KVT_LAUNCH(test_reduce_kernel, 1, 1, KVT_THREADS, dout, dx, n);
    float *got = to_host(1, dout, 2);
    char what[80];
    snprintf(what, sizeof(what), "block_reduce sum and max (%d warps, shuffles) vs float64", KVT_WARPS);
    tally(kvt_check(what, got, want, 2, "what=2", TOL_OP, "TOL_OP"));
    buf_free(1, dx); buf_free(1, dout);
    free(x); free(got);
}

// ---- fp16 and int8 ----------------------------------------------------------------

static void test_fp16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) { /* every half survives half -> float -> half */
        float f = kvt_f16_to_f32((uint16_t)h);
        if (f != f) continue; /* NaNs need not keep their payload */
        if (kvt_f32_to_f16(f) != h) bad++;
    }
    expect(bad == 0, "fp16: all 63488 non-NaN halves round-trip exactly (%d bad)", bad);
    /* float -> half is the nearest half, ties to even: checked against the two
     * neighbouring halves in float64 (an independent definition of "nearest") */
    uint64_t s = 99;
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        kvt_bits b;
        b.u = (uint32_t)kvt_rng_u64(&s);
        float f = b.f;
        if (!isfinite(f) || fabsf(f) >= 65504.0f) continue;
        uint16_t h = kvt_f32_to_f16(f);
        double err = fabs((double)kvt_f16_to_f32(h) - f);
        for (int d = -1; d <= 1; d += 2) {
            uint16_t o = (uint16_t)(h + d);
            float of = kvt_f16_to_f32(o);
            if ((o & 0x7c00) == 0x7c00 || ((o ^ h) & 0x8000)) continue; /* inf/nan or sign flip */
            double oe = fabs((double)of - f);
            if (oe < err || (oe == err && (o & 1) == 0 && (h & 1))) bad++;
        }
    }
    expect(bad == 0, "fp16: 200000 random floats round to the nearest half, ties to even (%d bad)", bad);
    expect(kvt_f32_to_f16(65520.0f) == 0x7c00 && kvt_f32_to_f16(65519.0f) == 0x7bff &&
           kvt_f32_to_f16(1e-8f) == 0 && kvt_f32_to_f16(-0.0f) == 0x8000,
           "fp16: overflow to inf at 65520, 65519 -> 65504, underflow to 0, -0 kept");
}

/* The CPU's fast paths for number formats, against their specs. */
static void test_fast_formats(void) {
    uint16_t *h = (uint16_t *)kvt_malloc(65536 * sizeof(uint16_t));
    float *f = (float *)kvt_malloc(65536 * sizeof(float));
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    for (uint32_t i = 0; i < 65536; i += KVT_VEC) {
        kvt_vec v = vec_load_f16(h + i);
        memcpy(f + i, &v, sizeof(v));
    }
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        float want = f16_to_f32(h[i]);
        if (want != want ? f[i] == f[i] : memcmp(&want, &f[i], 4) != 0) bad++; /* NaN: any NaN; else same bits */
    }
    expect(bad == 0, "fp16 conversion of the CPU attention (%s) == f16_to_f32 on all 65536 halves (%d differ)",
#if defined(__AVX512F__)
           "AVX-512",
#elif defined(__F16C__)
           "F16C",
#else
           "software",
#endif
           bad);
    /* int8: the vector conversion against a plain cast, all 256 values in every lane */
    int8_t q8[256 + 16];
    for (int i = 0; i < 256 + 16; i++) q8[i] = (int8_t)(i - 128);
    bad = 0;
    for (int i = 0; i < 256; i++) {
        kvt_vec v = vec_load_i8(q8 + i);
        for (int j = 0; j < KVT_VEC; j++) bad += v[j] != (float)q8[i + j];
    }
    expect(bad == 0, "int8 %d-wide conversion == plain cast for all 256 values in every lane (%d differ)", KVT_VEC, bad);
    free(h);
    free(f);
    /* e^x for softmax weights: x in [-90, 0] against float64, relative error in
     * units of float epsilon (2^-23); below -87 the result must be 0 */
    double worst = 0;
    int zero_bad = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -90.0f * (float)i / 2000000.0f;
        double want = exp((double)x), got = exp_neg_cpu(x);
        if (x < -87.0f) { zero_bad += got != 0.0; continue; }
        worst = fmax(worst, fabs(got - want) / want / 1.1920928955078125e-7);
    }
    expect(worst <= 4.0 && zero_bad == 0 && exp_neg_cpu(0.0f) == 1.0f,
           "exp_neg_cpu vs exp in float64 on 2e6 points of [-87, 0]: max error %.2f float eps (<= 4), 0 below -87 "
           "(%d not), exp(0) = 1", worst, zero_bad);
}

static void test_int8_group(void) {
    int G = 32;
    float x[32];
    int8_t q[32];
    uint64_t s = 5;
    int bad = 0, clamp_bad = 0;
    for (int trial = 0; trial < 2000; trial++) {
        kvt_fill_uniform(x, 32, 3.0f, 0.0f, &s);
        if (trial % 3 == 0) x[trial % 32] = 400.0f * (trial % 2 ? 1 : -1); /* an outlier */
        float scale = kvt_quantize_group(x, q, G), amax = 0;
        for (int i = 0; i < G; i++) amax = fmaxf(amax, fabsf(x[i]));
        for (int i = 0; i < G; i++) {
            double err = fabs((double)x[i] - (double)scale * q[i]);
            if (err > scale * 0.5 * (1 + 1e-5) + 1e-12) bad++; /* float slack: rounding of x/scale */
            if (q[i] == -128) clamp_bad++; /* int8_t holds -128: the clamp must avoid it */
        }
        if (fabsf(scale - amax / 127.0f) > 1e-7f * amax) bad++;
    }
    expect(bad == 0 && clamp_bad == 0, "int8: |x - scale*q| <= scale/2 and q in [-127,127] (2000 groups, outliers) (%d bad)",
           bad + clamp_bad);
    for (int i = 0; i < G; i++) x[i] = 0.0f;
    float scale = kvt_quantize_group(x, q, G);
    int zero = scale == 0.0f;
    for (int i = 0; i < G; i++) zero &= q[i] == 0;
    expect(zero, "int8: an all-zero group has scale 0 and decodes to exact zeros");
}

// ---- attention on a chunked cache ----------------------------------------------------

typedef struct { int NH, NKV, HS, CH, TMAX, T, n; kvt_dtype dt; int G; } acase;

/* Exercises 1 and 2 (README, "Exercises") add an attention window: the
 * reference below follows it when this file is built for those checks. */
#if defined(KVT_EXERCISE) && (KVT_EXERCISE == 1 || KVT_EXERCISE == 2)
static int ex_window, ex_sinks;
#endif
static int ref_visible(int t, int p) {
#if defined(KVT_EXERCISE) && (KVT_EXERCISE == 1 || KVT_EXERCISE == 2)
    if (ex_window > 0 && !(t < ex_sinks || t > p - ex_window)) return 0;
#endif
    return t <= p;
}

/* The CPU tiled attention's scratch for a kv_view made by a test (an
 * engine's views carry the engine's): one per thread; the caller frees it. */
static char *kv_test_work(kvt_kv *kv, int NH) {
    kv->work_threads = omp_get_max_threads();
    kv->work_bytes = attn_work_bytes(NH, kv->HS);
    kv->work = (char *)kvt_malloc((size_t)kv->work_threads * kv->work_bytes);
    return kv->work;
}

/* Build a cache of T positions for layer 1 of a 2-layer pool (layer 0 holds
 * other values, to catch layer mix-ups), with chunks taken in a scrambled
 * order, then run one attention implementation for the last n positions.
 * impl: 0 naive, 1 fused (the tuned path), 2 fused plain (the spec on the
 * CPU, the plain kernel on the GPU). out (n, NH*HS). Kdq/Vdq (optional): the cached
 * values of layer 1 read back and decoded, (T, KVD). */
static void attn_run(const acase *c, int gpu, int impl, int split_len, float *out, float *Kdq, float *Vdq) {
    int KVD = c->NKV * c->HS, nchunks = kvt_cdiv(c->TMAX, c->CH) + 3;
    kvt_pool p;
    KVT_ASSERT(pool_init(&p, gpu, 2, c->NKV, c->HS, c->CH, nchunks, c->dt, c->G) == KVT_OK);
    int *all = (int *)kvt_malloc((size_t)nchunks * sizeof(int));
    for (int i = 0; i < nchunks; i++) all[i] = pool_take(&p);
    for (int i = nchunks - 1; i >= 0; i--) if (i % 2) pool_release(&p, all[i]); /* scramble: odd ids, */
    for (int i = 0; i < nchunks; i++) if (i % 2 == 0) pool_release(&p, all[i]);  /* then even ones */
    kvt_seq s;
    memset(&s, 0, sizeof(s));
    s.table = (int *)kvt_malloc((size_t)kvt_cdiv(c->TMAX, c->CH) * sizeof(int));
    s.how = (char *)kvt_malloc((size_t)kvt_cdiv(c->TMAX, c->CH));
    KVT_ASSERT(seq_reserve(&p, &s, c->T, "test") == KVT_OK);
    s.len = c->T;
    float *K = frand((size_t)c->T * KVD, 1.0f, 21), *V = frand((size_t)c->T * KVD, 1.0f, 22);
    float *K0 = frand((size_t)c->T * KVD, 5.0f, 23);
    float *q = frand((size_t)c->n * c->NH * c->HS, 1.5f, 24);
    int *pos = (int *)kvt_malloc((size_t)c->T * sizeof(int)), *len = (int *)kvt_malloc((size_t)c->T * sizeof(int));
    int *tab = (int *)calloc((size_t)c->T, sizeof(int));
    for (int t = 0; t < c->T; t++) { pos[t] = t; len[t] = c->T; }
    int *d_tables = (int *)dev_copy(gpu, s.table, (size_t)s.n_table * sizeof(int));
    int *d_pos = (int *)dev_copy(gpu, pos, (size_t)c->T * sizeof(int));
    int *d_len = (int *)dev_copy(gpu, len, (size_t)c->T * sizeof(int));
    int *d_tab = (int *)dev_copy(gpu, tab, (size_t)c->T * sizeof(int));
    float *dK = (float *)dev_copy(gpu, K, (size_t)c->T * KVD * 4), *dV = (float *)dev_copy(gpu, V, (size_t)c->T * KVD * 4);
    float *dK0 = (float *)dev_copy(gpu, K0, (size_t)c->T * KVD * 4);
    kvt_kv kv = kv_view(&p, d_tables, d_tab, d_pos, d_len);
    char *work = kv_test_work(&kv, c->NH);
#if defined(KVT_EXERCISE) && (KVT_EXERCISE == 1 || KVT_EXERCISE == 2)
    kv.window = ex_window;
    kv.sinks = ex_sinks;
#endif
    if (gpu) { kv_write_gpu(kv, dK0, dK0, 0, c->T); kv_write_gpu(kv, dK, dV, 1, c->T); }
    else { kv_write_cpu(kv, dK0, dK0, 0, c->T); kv_write_cpu(kv, dK, dV, 1, c->T); }
    /* queries: the last n positions */
    kv.row_pos = d_pos + (c->T - c->n);
    float *dq = (float *)dev_copy(gpu, q, (size_t)c->n * c->NH * c->HS * 4), *dout;
    KVT_ASSERT(buf_alloc(gpu, (void **)&dout, (size_t)c->n * c->NH * c->HS * 4, "test") == KVT_OK);
    if (impl == 0) {
        float *scores;
        KVT_ASSERT(buf_alloc(gpu, (void **)&scores, (size_t)c->n * c->NH * c->TMAX * 4, "test") == KVT_OK);
        if (gpu) attention_naive_gpu(dout, dq, kv, 1, c->n, c->NH, scores, c->TMAX);
        else attention_naive_cpu(dout, dq, kv, 1, c->n, c->NH, scores, c->TMAX);
        buf_free(gpu, scores);
    } else {
        int sl = split_len > 0 ? split_len : c->T, ns = kvt_cdiv(c->T, sl);
        float *part;
        KVT_ASSERT(buf_alloc(gpu, (void **)&part, (size_t)c->n * c->NH * ns * (2 + c->HS) * 4, "test") == KVT_OK);
        if (impl == 2) (gpu ? attention_fused_plain_gpu : attention_fused_spec_cpu)(dout, dq, kv, 1, c->n, c->NH, part, sl, ns);
        else if (gpu) attention_fused_gpu(dout, dq, kv, 1, c->n, c->NH, part, sl, ns);
        else attention_fused_cpu(dout, dq, kv, 1, c->n, c->NH, part, sl, ns);
        buf_free(gpu, part);
    }
    buf_download(gpu, out, dout, (size_t)c->n * c->NH * c->HS * 4);
    if (Kdq) { /* decode the stored values on the host (kvt_cache_read's path) */
        kvt_engine fake;
        memset(&fake, 0, sizeof(fake));
        fake.gpu = gpu;
        fake.pool = p;
        for (int t = 0; t < c->T; t++) {
            kvt_cache_read(&fake, &s, 1, 0, t, Kdq + (size_t)t * KVD);
            kvt_cache_read(&fake, &s, 1, 1, t, Vdq + (size_t)t * KVD);
        }
    }
    buf_free(gpu, d_tables); buf_free(gpu, d_pos); buf_free(gpu, d_len); buf_free(gpu, d_tab);
    buf_free(gpu, dK); buf_free(gpu, dV); buf_free(gpu, dK0); buf_free(gpu, dq); buf_free(gpu, dout);
    free(s.table); free(s.how); free(all); free(K); free(V); free(K0); free(q); free(pos); free(len); free(tab);
    free(work);
    pool_free(&p);
}

/* float64 causal attention of the last n positions over K, V (T, KVD). */
static void attn_ref(const acase *c, const float *K, const float *V, float *out) {
    float *q = frand((size_t)c->n * c->NH * c->HS, 1.5f, 24); /* the same queries as attn_run */
    double *s = (double *)kvt_malloc((size_t)c->T * sizeof(double));
    int KVD = c->NKV * c->HS;
    for (int r = 0; r < c->n; r++) {
        int p = c->T - c->n + r;
        for (int h = 0; h < c->NH; h++) {
            int kh = h / (c->NH / c->NKV);
            double mx = -INFINITY, z = 0;
            for (int t = 0; t <= p; t++) {
                double d = 0;
                if (!ref_visible(t, p)) { s[t] = -INFINITY; continue; }
                for (int ch = 0; ch < c->HS; ch++) d += (double)q[((size_t)r * c->NH + h) * c->HS + ch] * K[(size_t)t * KVD + kh * c->HS + ch];
                s[t] = d / sqrt((double)c->HS);
                mx = fmax(mx, s[t]);
            }
            for (int t = 0; t <= p; t++) { s[t] = exp(s[t] - mx); z += s[t]; }
            for (int ch = 0; ch < c->HS; ch++) {
                double o = 0;
                for (int t = 0; t <= p; t++) o += s[t] / z * V[(size_t)t * KVD + kh * c->HS + ch];
                out[((size_t)r * c->NH + h) * c->HS + ch] = (float)o;
            }
        }
    }
    free(q);
    free(s);
}

static void test_attention(int gpu) {
    /* NH NKV HS CH TMAX T n: awkward shapes */
    acase cases[] = {
        {4, 2, 16, 16, 64, 1, 1, KVT_FP32, 16},   /* T = 1 */
        {4, 2, 16, 3, 64, 29, 5, KVT_FP32, 16},   /* T not a multiple of CH, prefill rows, GQA */
        {4, 1, 16, 1, 64, 20, 2, KVT_FP32, 16},   /* CH = 1, one kv head for all */
        {2, 2, 32, 64, 64, 64, 3, KVT_FP32, 32},  /* CH = TMAX, T = TMAX: the last position */
        {4, 2, 16, 16, 64, 17, 1, KVT_FP32, 16},  /* one position into a new chunk */
        {4, 2, 64, 16, 64, 40, 2, KVT_FP32, 64},  /* HS 64 > one warp of channels */
        {4, 2, 16, 3, 64, 29, 5, KVT_FP16, 16},
        {4, 2, 32, 5, 64, 33, 3, KVT_INT8, 8},
        {4, 2, 32, 16, 64, 47, 2, KVT_INT8, 32},
        /* a long prefill: 40 rows in blocks of 16, 100 positions in tiles of one
         * chunk (5), then of 32 (CH 64: two full tiles per chunk, the last partly masked) */
        {4, 2, 16, 5, 128, 100, 40, KVT_FP32, 16},
        {4, 2, 16, 64, 128, 100, 40, KVT_FP32, 16},
        {4, 2, 16, 5, 128, 100, 40, KVT_FP16, 16},
        {4, 2, 48, 7, 128, 77, 21, KVT_INT8, 16},  /* HS 48: 16-lane loops with no leftover, G 16 */
        {2, 1, 40, 4, 128, 70, 3, KVT_INT8, 8},    /* HS 40, G 8: leftovers in every loop */
        /* decode rows, one query per kv head: the CPU scores 4 kv heads side by side, then the rest one by one */
        {6, 6, 16, 5, 64, 40, 1, KVT_FP32, 16},
        {5, 5, 32, 7, 64, 30, 1, KVT_FP16, 32},
        {8, 8, 32, 16, 64, 45, 1, KVT_INT8, 16},   /* two groups per head: each head's own scales */
        /* an fp32 decode row sums V key by key (tile_v_rows_cpu): GQA, tiles of 32 over chunks of 16 */
        {8, 2, 64, 16, 128, 100, 1, KVT_FP32, 64},
        /* the GPU's shapes: head size 128, an unsplit piece of 300+ keys (3 tiles of 128 on
         * a GPU), 4 query heads per kv head (one block serves them all), each cache type
         * read in 16-byte units (int8: G 32, two units per scale) */
        {4, 1, 128, 16, 512, 300, 1, KVT_FP32, 128},
        {8, 2, 128, 32, 512, 333, 2, KVT_FP16, 128},
        {4, 1, 128, 16, 512, 301, 1, KVT_INT8, 32},
        /* groups of 8 and 6 query heads: one pass of a block serves them all, over 300+ keys
         * (10 tiles of 32, 3 of 128); a group of 12: two passes, of 8 and 4 heads */
        {8, 1, 32, 8, 64, 40, 2, KVT_FP32, 32},
        {6, 1, 32, 8, 64, 45, 2, KVT_FP16, 16},
        {8, 1, 128, 16, 512, 320, 1, KVT_FP32, 128},
        {12, 2, 128, 32, 512, 310, 2, KVT_INT8, 32},
        {12, 1, 64, 16, 512, 300, 1, KVT_FP16, 64},
        /* head size 256 (more 16-byte units than a 32-thread block has threads); head size
         * 6 (no whole 16-byte unit: one value at a time) */
        {2, 2, 256, 8, 64, 20, 1, KVT_FP32, 256},
        {2, 1, 6, 3, 64, 20, 2, KVT_FP32, 6},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        acase *c = &cases[i];
        size_t no = (size_t)c->n * c->NH * c->HS, nkv = (size_t)c->T * c->NKV * c->HS;
        float *K = (float *)kvt_malloc(nkv * 4), *V = (float *)kvt_malloc(nkv * 4), *ref = (float *)kvt_malloc(no * 4);
        float *naive_cpu = (float *)kvt_malloc(no * 4), *got = (float *)kvt_malloc(no * 4);
        attn_run(c, 0, 0, 0, naive_cpu, K, V); /* K, V: what the cache holds (dequantized) */
        attn_ref(c, K, V, ref);
        char shape[64], what[200], cfg[96];
        snprintf(shape, sizeof(shape), "row=%d,head=%d,ch=%d", c->n, c->NH, c->HS);
        snprintf(cfg, sizeof(cfg), "NH=%d NKV=%d HS=%d CH=%d T=%d rows=%d %s", c->NH, c->NKV, c->HS, c->CH, c->T, c->n,
                 kvt_dtype_name(c->dt));
        if (!gpu) {
            snprintf(what, sizeof(what), "attention naive cpu vs float64 (%s)", cfg);
            tally(kvt_check(what, naive_cpu, ref, (long)no, shape, TOL_ATTN, "TOL_ATTN"));
        }
        int splits[] = {0, 4, 7};
        for (int impl = 0; impl < 2; impl++)
            for (int si = 0; si < (impl ? 3 : 1); si++) {
                if (!gpu && impl == 0) continue;
#ifdef KVT_GPU_SIZES /* emulated at the GPU's sizes, each of the K pass's shuffles is a barrier of 128 threads (§2): */
                if (gpu && si == 1 && c->n >= 16) continue; /* a long prefill's pieces are checked by split 7 */
#endif
                attn_run(c, gpu, impl, splits[si], got, NULL, NULL);
                snprintf(what, sizeof(what), "attention %s%s %s vs float64 (%s)", impl ? "fused" : "naive",
                         impl ? (splits[si] ? " split" : " unsplit") : "", gpu ? "gpu" : "cpu", cfg);
                if (impl && splits[si]) snprintf(what + strlen(what) - 1, 40, ", split_len %d)", splits[si]);
                tally(kvt_check(what, got, ref, (long)no, shape, TOL_ATTN, "TOL_ATTN"));
                if (!gpu && impl) {
                    snprintf(what, sizeof(what), "attention fused vs naive cpu, split_len %d (%s)", splits[si], cfg);
                    tally(kvt_check(what, got, naive_cpu, (long)no, shape, TOL_ATTN, "TOL_ATTN"));
                }
            }
        if (c->dt != KVT_FP32 && !gpu) { /* the quantization error itself, against the fp32 inputs */
            float *K32 = frand(nkv, 1.0f, 21);
            double worst = 0, bound = c->dt == KVT_FP16 ? 1.0 / 2048 : 0.5 / 127 * 1.0001; /* half ulp at |x|<=1 */
            for (size_t j = 0; j < nkv; j++) worst = fmax(worst, fabs((double)K[j] - K32[j]));
            expect(worst <= bound, "%s cache: stored K within %.3g of the input (max %.3g) (%s)", kvt_dtype_name(c->dt),
                   bound, worst, cfg);
            free(K32);
        }
        free(K); free(V); free(ref); free(naive_cpu); free(got);
    }
}

/* The launch count (§2, kvt_launch_count) against launches counted by hand:
 * attn_run writes the cache twice (layer 0, then layer 1: kv_write_kernel
 * twice), then one naive GPU attention call launches its scores and values
 * kernels once each and the fused kernel not at all; a name never launched
 * counts 0. (The naive softmax kernel is left out: exercise 4 replaces it.) */
static void test_launch_count(void) {
    acase c = {4, 2, 16, 3, 64, 29, 5, KVT_FP32, 16};
    const char *names[] = {"kv_write_kernel", "attn_scores_kernel", "attn_values_kernel", "attn_fused_kernel"};
    long want[] = {2, 1, 1, 0}, got[4];
    float *out = (float *)kvt_malloc((size_t)c.n * c.NH * c.HS * 4);
    for (int i = 0; i < 4; i++) got[i] = -kvt_launch_count(names[i]);
    attn_run(&c, 1, 0, 0, out, NULL, NULL);
    for (int i = 0; i < 4; i++) got[i] += kvt_launch_count(names[i]);
    expect(got[0] == want[0] && got[1] == want[1] && got[2] == want[2] && got[3] == want[3] &&
           kvt_launch_count("no_such_kernel") == 0, "launch count: a naive gpu attention run launches %s %ld (want 2), "
           "%s %ld (want 1), %s %ld (want 1), %s %ld (want 0); a kernel never launched counts %ld (want 0)",
           names[0], got[0], names[1], got[1], names[2], got[2], names[3], got[3], kvt_launch_count("no_such_kernel"));
    free(out);
}

/* A ragged batch in one call: rows of three sequences, each with its own chunk
 * table, length and positions (one decode row, a prefill of 19 rows, 3 rows of
 * a short sequence), through every attention path, against float64 attention
 * over each sequence's cached (decoded) values. */
static void test_attention_ragged(int gpu) {
    enum { NSEQ = 3, NH = 4, NKV = 2, HS = 32, CH = 5, TMAX = 128, KVD = NKV * HS };
    int len[NSEQ] = {71, 39, 8}, nrow[NSEQ] = {1, 19, 3}, rows = 23;
    kvt_dtype dts[] = {KVT_FP32, KVT_FP16, KVT_INT8};
    for (int di = 0; di < 3; di++) {
        kvt_pool p;
        int nchunks = 0;
        for (int i = 0; i < NSEQ; i++) nchunks += kvt_cdiv(len[i], CH);
        KVT_ASSERT(pool_init(&p, gpu, 2, NKV, HS, CH, nchunks + 2, dts[di], 16) == KVT_OK);
        pool_release(&p, pool_take(&p)); /* so that no table is simply 0, 1, 2, ... */
        kvt_seq s[NSEQ];
        int tables[64], tab[NSEQ], ntab = 0;
        int *rpos = (int *)kvt_malloc((size_t)rows * sizeof(int)), *rlen = (int *)kvt_malloc((size_t)rows * sizeof(int));
        int *rtab = (int *)kvt_malloc((size_t)rows * sizeof(int)), r = 0;
        for (int i = 0; i < NSEQ; i++) {
            memset(&s[i], 0, sizeof(s[i]));
            s[i].table = (int *)kvt_malloc((size_t)kvt_cdiv(TMAX, CH) * sizeof(int));
            s[i].how = (char *)kvt_malloc((size_t)kvt_cdiv(TMAX, CH));
            KVT_ASSERT(seq_reserve(&p, &s[i], len[i], "test") == KVT_OK);
            s[i].len = len[i];
            tab[i] = ntab;
            memcpy(tables + ntab, s[i].table, (size_t)s[i].n_table * sizeof(int));
            ntab += s[i].n_table;
            for (int j = 0; j < nrow[i]; j++, r++) { rpos[r] = len[i] - nrow[i] + j; rlen[r] = len[i]; rtab[r] = tab[i]; }
        }
        int *d_tables = (int *)dev_copy(gpu, tables, (size_t)ntab * sizeof(int));
        /* fill every position of every sequence: layer 0 junk, layer 1 the values attended to */
        for (int i = 0; i < NSEQ; i++) {
            int *wpos = (int *)kvt_malloc((size_t)len[i] * sizeof(int)), *wtab = (int *)kvt_malloc((size_t)len[i] * sizeof(int));
            for (int t = 0; t < len[i]; t++) { wpos[t] = t; wtab[t] = tab[i]; }
            float *K = frand((size_t)len[i] * KVD, 1.0f, 31 + i), *V = frand((size_t)len[i] * KVD, 1.0f, 41 + i);
            float *J = frand((size_t)len[i] * KVD, 4.0f, 51 + i);
            int *dwpos = (int *)dev_copy(gpu, wpos, (size_t)len[i] * sizeof(int));
            int *dwtab = (int *)dev_copy(gpu, wtab, (size_t)len[i] * sizeof(int));
            float *dK = (float *)dev_copy(gpu, K, (size_t)len[i] * KVD * 4), *dV = (float *)dev_copy(gpu, V, (size_t)len[i] * KVD * 4);
            float *dJ = (float *)dev_copy(gpu, J, (size_t)len[i] * KVD * 4);
            kvt_kv w = kv_view(&p, d_tables, dwtab, dwpos, dwpos);
            if (gpu) { kv_write_gpu(w, dJ, dJ, 0, len[i]); kv_write_gpu(w, dK, dV, 1, len[i]); }
            else { kv_write_cpu(w, dJ, dJ, 0, len[i]); kv_write_cpu(w, dK, dV, 1, len[i]); }
            buf_free(gpu, dwpos); buf_free(gpu, dwtab); buf_free(gpu, dK); buf_free(gpu, dV); buf_free(gpu, dJ);
            free(wpos); free(wtab); free(K); free(V); free(J);
        }
        /* the float64 reference, from the values the cache holds */
        float *q = frand((size_t)rows * NH * HS, 1.5f, 61), *ref = (float *)kvt_malloc((size_t)rows * NH * HS * 4);
        kvt_engine fake;
        memset(&fake, 0, sizeof(fake));
        fake.gpu = gpu;
        fake.pool = p;
        float *Kd = (float *)kvt_malloc((size_t)TMAX * KVD * 4), *Vd = (float *)kvt_malloc((size_t)TMAX * KVD * 4);
        double sc[TMAX];
        r = 0;
        for (int i = 0; i < NSEQ; i++) {
            for (int t = 0; t < len[i]; t++) {
                kvt_cache_read(&fake, &s[i], 1, 0, t, Kd + (size_t)t * KVD);
                kvt_cache_read(&fake, &s[i], 1, 1, t, Vd + (size_t)t * KVD);
            }
            for (int j = 0; j < nrow[i]; j++, r++)
                for (int h = 0; h < NH; h++) {
                    int kh = h / (NH / NKV), pos = rpos[r];
                    double mx = -INFINITY, z = 0;
                    for (int t = 0; t <= pos; t++) {
                        double d = 0;
                        for (int c = 0; c < HS; c++) d += (double)q[((size_t)r * NH + h) * HS + c] * Kd[(size_t)t * KVD + kh * HS + c];
                        sc[t] = d / sqrt((double)HS);
                        mx = fmax(mx, sc[t]);
                    }
                    for (int t = 0; t <= pos; t++) { sc[t] = exp(sc[t] - mx); z += sc[t]; }
                    for (int c = 0; c < HS; c++) {
                        double o = 0;
                        for (int t = 0; t <= pos; t++) o += sc[t] / z * Vd[(size_t)t * KVD + kh * HS + c];
                        ref[((size_t)r * NH + h) * HS + c] = (float)o;
                    }
                }
        }
        int *d_pos = (int *)dev_copy(gpu, rpos, (size_t)rows * sizeof(int)), *d_len = (int *)dev_copy(gpu, rlen, (size_t)rows * sizeof(int));
        int *d_tab = (int *)dev_copy(gpu, rtab, (size_t)rows * sizeof(int));
        kvt_kv kv = kv_view(&p, d_tables, d_tab, d_pos, d_len);
        char *work = kv_test_work(&kv, NH);
        float *dq = (float *)dev_copy(gpu, q, (size_t)rows * NH * HS * 4), *dout, *scratch;
        KVT_ASSERT(buf_alloc(gpu, (void **)&dout, (size_t)rows * NH * HS * 4, "test") == KVT_OK);
        KVT_ASSERT(buf_alloc(gpu, (void **)&scratch, (size_t)rows * NH * TMAX * 4 + (size_t)rows * NH * 8 * (2 + HS) * 4,
                             "test") == KVT_OK);
        const char *names[3] = {"naive", "fused unsplit", "fused split 16"};
        for (int v = 0; v < 3; v++) {
            if (v == 0) (gpu ? attention_naive_gpu : attention_naive_cpu)(dout, dq, kv, 1, rows, NH, scratch, TMAX);
            else if (v == 1) (gpu ? attention_fused_gpu : attention_fused_cpu)(dout, dq, kv, 1, rows, NH, scratch, 71, 1);
            else (gpu ? attention_fused_gpu : attention_fused_cpu)(dout, dq, kv, 1, rows, NH, scratch, 16, 5);
            float *got = to_host(gpu, dout, (size_t)rows * NH * HS);
            char what[160];
            snprintf(what, sizeof(what), "attention %s %s, ragged batch (3 sequences: 1 + 19 + 3 rows, CH 5, %s) vs float64",
                     names[v], gpu ? "gpu" : "cpu", kvt_dtype_name(dts[di]));
            tally(kvt_check(what, got, ref, (long)rows * NH * HS, "row=23,head=4,ch=32", TOL_ATTN, "TOL_ATTN"));
            free(got);
        }
        buf_free(gpu, d_tables); buf_free(gpu, d_pos); buf_free(gpu, d_len); buf_free(gpu, d_tab);
        buf_free(gpu, dq); buf_free(gpu, dout); buf_free(gpu, scratch);
        for (int i = 0; i < NSEQ; i++) { free(s[i].table); free(s[i].how); }
        free(rpos); free(rlen); free(rtab); free(q); free(ref); free(Kd); free(Vd);
        free(work);
        pool_free(&p);
    }
}

/* §12's spec, attention_fused_spec_cpu (one query at a time, key by key),
 * against float64 attention; then the two paths the engine runs, the CPU's
 * tiled loop (cpu/attention.c) and the GPU kernel, against the spec. The spec
 * reads a cache of its own: the queries, K and V of attn_run (seeds 24, 21,
 * 22), layer 0 filled with other values, chunks in reverse order of the pool.
 * The float64 side does not read the cache at all: it takes the inputs
 * rounded the way the cache stores them (fp16: f32_to_f16; int8: one
 * quantize_group per G channels of a head), so a wrong chunk, layer, head,
 * channel or scale in the spec's reads shows. */
static void test_attention_spec(void) {
    /* NH NKV HS CH TMAX T n dtype G */
    acase cases[] = {
        {4, 2, 16, 16, 64, 1, 1, KVT_FP32, 16},    /* T = 1: one key */
        {4, 2, 16, 3, 64, 29, 5, KVT_FP32, 16},    /* GQA, chunks of 3, 5 prefill rows */
        {8, 2, 64, 16, 128, 100, 1, KVT_FP32, 64}, /* one decode row over 4 tiles of 32 (fp32: V key by key) */
        {4, 2, 16, 5, 128, 100, 40, KVT_FP16, 16}, /* fp16, 40 rows: blocks of 16, tiles across chunks */
        {5, 5, 32, 7, 64, 30, 1, KVT_FP16, 32},    /* fp16 decode, one query head per kv head */
        {4, 2, 32, 5, 64, 33, 3, KVT_INT8, 8},     /* int8, 4 scales per head row */
        {2, 1, 40, 4, 128, 70, 3, KVT_INT8, 8},    /* int8, HS 40: leftovers in the vector loops */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const acase *c = &cases[i];
        int KVD = c->NKV * c->HS, nch = kvt_cdiv(c->T, c->CH), ids[64], table[64];
        size_t no = (size_t)c->n * c->NH * c->HS, nkv = (size_t)c->T * KVD;
        kvt_pool p;
        KVT_ASSERT(nch + 2 <= 64 && c->G <= 64); /* ids[], table[], and qg[] below */
        KVT_ASSERT(pool_init(&p, 0, 2, c->NKV, c->HS, c->CH, nch + 2, c->dt, c->G) == KVT_OK);
        for (int j = 0; j < nch + 2; j++) ids[j] = pool_take(&p);
        for (int j = 0; j < nch; j++) table[j] = ids[nch + 1 - j]; /* logical chunk j: the (nch+1-j)-th taken */
        float *K = frand(nkv, 1.0f, 21), *V = frand(nkv, 1.0f, 22), *J = frand(nkv, 5.0f, 29);
        float *q = frand(no, 1.5f, 24);
        int *pos = (int *)kvt_malloc((size_t)c->T * sizeof(int)), *len = (int *)kvt_malloc((size_t)c->T * sizeof(int));
        int *tab = (int *)kvt_malloc((size_t)c->T * sizeof(int));
        for (int t = 0; t < c->T; t++) { pos[t] = t; len[t] = c->T; tab[t] = 0; }
        kvt_kv kv = kv_view(&p, table, tab, pos, len);
        kv_write_cpu(kv, J, J, 0, c->T); /* layer 0: other values */
        kv_write_cpu(kv, K, V, 1, c->T);
        kv.row_pos = pos + (c->T - c->n); /* the queries: the last n positions */
        float *spec = (float *)kvt_malloc(no * 4), *ref = (float *)kvt_malloc(no * 4), *got = (float *)kvt_malloc(no * 4);
        float *part = (float *)kvt_malloc((size_t)c->n * c->NH * (2 + c->HS) * 4); /* one piece per (row, head) */
        attention_fused_spec_cpu(spec, q, kv, 1, c->n, c->NH, part, c->T, 1);
        free(part);
        /* the stored values, rounded on the host as kv_store rounds them */
        float *Kr = (float *)kvt_malloc(nkv * 4), *Vr = (float *)kvt_malloc(nkv * 4);
        for (int w = 0; w < 2; w++) {
            const float *in = w ? V : K;
            float *outv = w ? Vr : Kr;
            if (c->dt == KVT_FP32) memcpy(outv, in, nkv * 4);
            else if (c->dt == KVT_FP16)
                for (size_t e = 0; e < nkv; e++) outv[e] = kvt_f16_to_f32(kvt_f32_to_f16(in[e]));
            else
                for (size_t g = 0; g < nkv; g += (size_t)c->G) { /* G divides HS: a group is inside one head */
                    int8_t qg[64];
                    float sc = kvt_quantize_group(in + g, qg, c->G);
                    for (int e = 0; e < c->G; e++) outv[g + (size_t)e] = sc * (float)qg[e];
                }
        }
        attn_ref(c, Kr, Vr, ref);
        char shape[64], what[200], cfg[96];
        snprintf(shape, sizeof(shape), "row=%d,head=%d,ch=%d", c->n, c->NH, c->HS);
        snprintf(cfg, sizeof(cfg), "NH=%d NKV=%d HS=%d CH=%d T=%d rows=%d %s", c->NH, c->NKV, c->HS, c->CH, c->T,
                 c->n, kvt_dtype_name(c->dt));
        snprintf(what, sizeof(what), "attention fused spec (key by key) vs float64 (%s)", cfg);
        tally(kvt_check(what, spec, ref, (long)no, shape, TOL_ATTN, "TOL_ATTN"));
        attn_run(c, 0, 2, 7, got, NULL, NULL); /* the spec in pieces of 7 keys, then the merge */
        snprintf(what, sizeof(what), "attention fused spec, split_len 7, vs float64 (%s)", cfg);
        tally(kvt_check(what, got, ref, (long)no, shape, TOL_ATTN, "TOL_ATTN"));
        int splits[] = {0, 7};
        for (int gpu = 0; gpu < 1 + kvt_gpu_available(); gpu++)
            for (int impl = 1; impl <= 1 + gpu; impl++) /* the tuned path; on the GPU also the plain kernel */
                for (int si = 0; si < 2; si++) {
                    attn_run(c, gpu, impl, splits[si], got, NULL, NULL);
                    snprintf(what, sizeof(what), "attention fused %s, split_len %d, vs the spec (%s)",
                             impl == 2 ? "gpu plain kernel" : gpu ? "gpu kernel" : "cpu tiled loop", splits[si], cfg);
                    tally(kvt_check(what, got, spec, (long)no, shape, TOL_ATTN, "TOL_ATTN"));
                }
        free(K); free(V); free(J); free(q); free(pos); free(len); free(tab);
        free(spec); free(ref); free(got); free(Kr); free(Vr);
        pool_free(&p);
    }
}

/* kv write on the GPU stores the same bytes as on the CPU. */
static void test_kv_write_bytes(void) {
    kvt_dtype dts[] = {KVT_FP32, KVT_FP16, KVT_INT8};
    for (int i = 0; i < 3; i++) {
        acase c = {4, 2, 32, 5, 32, 13, 1, dts[i], 8};
        size_t nkv = (size_t)c.T * c.NKV * c.HS;
        float *k0 = (float *)kvt_malloc(nkv * 4), *v0 = (float *)kvt_malloc(nkv * 4), *k1 = (float *)kvt_malloc(nkv * 4),
              *v1 = (float *)kvt_malloc(nkv * 4), o[4 * 32];
        attn_run(&c, 0, 1, 0, o, k0, v0);
        attn_run(&c, 1, 1, 0, o, k1, v1);
        expect(!memcmp(k0, k1, nkv * 4) && !memcmp(v0, v1, nkv * 4),
               "kv write %s: gpu stores exactly the cpu's values (quantization included)", kvt_dtype_name(dts[i]));
        free(k0); free(v0); free(k1); free(v1);
    }
}

// ---- end to end ------------------------------------------------------------------------

/* Greedy generation: np prompt tokens, then `steps` tokens; tokens (np+steps),
 * logits (steps, V) of every step. */
static kvt_status generate(kvt_model *m, const kvt_options *o, const int *prompt, int np, int steps, int *tokens,
                           float *logits) {
    kvt_engine *e;
    kvt_status st = kvt_engine_create(&e, m, o);
    if (st != KVT_OK) return st;
    kvt_seq s;
    kvt_seq_init(e, &s);
    int V = m->c.vocab_size;
    memcpy(tokens, prompt, (size_t)np * sizeof(int));
    for (int i = 0; i < steps && st == KVT_OK; i++) {
        st = kvt_step(e, &s, tokens, np + i, logits + (size_t)i * V);
        tokens[np + i] = kvt_argmax(logits + (size_t)i * V, V);
    }
    kvt_seq_free(e, &s);
    kvt_engine_free(e);
    return st;
}

static kvt_config cfg(int D, int L, int NH, int NKV, int HD, int V, int TMAX) {
    kvt_config c = {D, HD, L, NH, NKV, -V, TMAX};
    return c;
}

/* The same logits whatever the number of threads: every parallel loop gives
 * each output to one thread, which computes it in a fixed order. A prefill of
 * 40 rows (sgemm, blocks of rows), then decode steps (tile loop, split pieces),
 * on 1 and on 2 threads. */
/* The GPU's automatic split (attn_split): enough blocks (NKV x rows x pieces:
 * a block serves all query heads of its kv head) for 2 per SM, pieces no
 * shorter than a tile, and never more (row, piece) pairs than the engine's
 * part buffer holds. The cases are worked by hand for an H200 (132 SMs: 264
 * blocks wanted), a 7B model (32 heads, 32 kv heads) and a Llama 3 8B (32
 * heads, 8 kv heads): pieces = min(ceil(264 / (NKV rows)), ceil(T / tile)),
 * split_len = ceil(T / pieces), then ceil(T / split_len) pieces. */
static void test_gpu_split_rule(void) {
    kvt_model m;
    kvt_engine e;
    memset(&m, 0, sizeof(m));
    memset(&e, 0, sizeof(e));
    m.c.n_heads = 32;
    e.m = &m;
    e.gpu = 1;
    e.sms = 132;
    struct { int NKV, T, rows, len, nsplit; const char *why; } cases[] = {
        /* 264 blocks wanted: ceil(264 / 32) = 9 pieces of ceil(4096 / 9) = 456 (8 x 456 = 3648 < 4096) */
        {32, 4096, 1, 456, 9, "one 7B sequence at 4096: 9 pieces, 288 blocks >= 2 x 132"},
        {32, 4096, 4, 1366, 3, "7B, 4 rows: ceil(264 / 128) = 3 pieces of ceil(4096 / 3) = 1366"},
        {32, 4096, 16, 4096, 1, "7B, 16 rows: ceil(264 / 512) = 1, 512 blocks unsplit"},
        {32, 1, 1, 1, 1, "one position: nothing to split"},
        /* GQA: blocks per kv head (counted per query head, one 8B sequence would get 9 pieces, 72 blocks) */
        {8, 8192, 1, 249, 33, "one Llama 3 8B sequence at 8192: ceil(264 / 8) = 33 pieces of ceil(8192 / 33) = 249 "
                              "(32 x 249 = 7968 < 8192), 264 blocks"},
        {8, 4096, 4, 456, 9, "Llama 3 8B, 4 rows at 4096: ceil(264 / 32) = 9 pieces of 456, 288 blocks"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int len, ns;
        m.c.n_kv_heads = cases[i].NKV;
        attn_split(&e, cases[i].T - 1, cases[i].rows, &len, &ns);
        expect(len == cases[i].len && ns == cases[i].nsplit, "GPU split rule, %s: split_len %d (want %d), %d pieces "
               "(want %d)", cases[i].why, len, cases[i].len, ns, cases[i].nsplit);
    }
    /* short contexts: no piece shorter than a tile of KVT_THREADS keys */
    int len, ns, T = 3 * KVT_THREADS;
    m.c.n_kv_heads = 32; /* 9 pieces wanted, 3 tiles */
    attn_split(&e, T - 1, 1, &len, &ns);
    expect(ns == 3 && len == KVT_THREADS, "GPU split rule, 1 row at 3 tiles (%d positions): 3 pieces of a tile "
           "(got %d of %d)", T, ns, len);
    /* a real (emulated) engine, 4 heads sharing 1 kv head (the most pieces): every call fits its part buffer */
    if (!kvt_gpu_available()) { skip("GPU split rule on an engine: no GPU"); return; }
    kvt_model rm;
    kvt_engine *re;
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_GPU;
    o.max_rows = 8;
    KVT_ASSERT(kvt_model_random(&rm, cfg(64, 1, 4, 1, 64, 50, 300), 1) == KVT_OK);
    KVT_ASSERT(kvt_engine_create(&re, &rm, &o) == KVT_OK);
    int worst = 0, bad = 0;
    for (int n = 1; n <= o.max_rows; n++)
        for (int t = 1; t <= 300; t++) {
            attn_split(re, t - 1, n, &len, &ns);
            worst = n * ns > worst ? n * ns : worst;
            bad += (size_t)n * ns > re->part_cap || len * ns < t || len < 1;
        }
    expect(bad == 0, "GPU split rule: every (rows, T) up to (8, 300) covers T and fits the part buffer (most %d "
           "pairs, room for %zu; %d SMs)", worst, re->part_cap, re->sms);
    kvt_engine_free(re);
    kvt_model_free(&rm);
}
static void test_threads(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, 2, 4, 2, 128, 300, 512), 9) == KVT_OK);
    int max_threads = omp_get_max_threads(), np = 300, steps = 4, V = 300;
    int *toks = (int *)kvt_malloc((size_t)(np + steps) * sizeof(int));
    kvt_fake_tokens(toks, np + steps, V);
    float *logits[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        kvt_options o;
        kvt_options_default(&o);
        o.device = KVT_CPU;
        o.CH = 7;
        o.kv_dtype = KVT_INT8;
        o.kv_group = 16;
        kvt_engine *e;
        kvt_seq s;
        KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
        KVT_ASSERT(kvt_seq_init(e, &s) == KVT_OK);
        logits[t] = (float *)kvt_malloc((size_t)(steps + 1) * V * sizeof(float));
        KVT_ASSERT(kvt_forward(e, &s, toks, np, logits[t], 0) == KVT_OK);
        for (int i = 0; i < steps; i++)
            KVT_ASSERT(kvt_forward(e, &s, toks + np + i, 1, logits[t] + (size_t)(i + 1) * V, 0) == KVT_OK);
        kvt_seq_free(e, &s);
        kvt_engine_free(e);
    }
    omp_set_num_threads(max_threads);
    tally(kvt_check("logits on 1 thread vs 2 threads (prefill 300, 4 decode steps, int8 cache)", logits[1], logits[0],
                    (long)(steps + 1) * V, "step=5,vocab=300", TOL_E2E, "TOL_E2E"));
    free(logits[0]); free(logits[1]); free(toks);
    kvt_model_free(&m);
}

/* Cache on vs off, for several chunk sizes: same greedy tokens, same logits. */
static void test_cache_on_off(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, 2, 8, 2, 160, 97, 256), 7) == KVT_OK);
    int V = 97, np = 7, steps = 200, prompt[7];
    kvt_fake_tokens(prompt, np, V);
    int *t_ref = (int *)kvt_malloc((np + steps) * sizeof(int)), *t = (int *)kvt_malloc((np + steps) * sizeof(int));
    float *l_ref = (float *)kvt_malloc((size_t)steps * V * 4), *l = (float *)kvt_malloc((size_t)steps * V * 4);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.kv_cache = 0;
    o.CH = 16;
    KVT_ASSERT(generate(&m, &o, prompt, np, steps, t_ref, l_ref) == KVT_OK); /* no cache: the reference */
    int chs[] = {1, 3, 16, 256};
    for (int i = 0; i < 4; i++) {
        o.kv_cache = 1;
        o.CH = chs[i];
        for (int attn = 0; attn < 2; attn++) {
            o.attn = (kvt_attn)attn;
            kvt_status st = generate(&m, &o, prompt, np, steps, t, l);
            int same = st == KVT_OK && !memcmp(t, t_ref, (np + steps) * sizeof(int));
            expect(same, "cache on (CH=%d, %s) vs off: same %d greedy tokens (GQA 8/2)", chs[i], attn ? "fused" : "naive", steps);
            char what[96];
            snprintf(what, sizeof(what), "cache on (CH=%d, %s) vs off: logits of %d steps", chs[i], attn ? "fused" : "naive", steps);
            tally(kvt_check(what, l, l_ref, (long)steps * V, "step=200,vocab=97", TOL_E2E, "TOL_E2E"));
        }
    }
    o.attn = KVT_ATTN_FUSED;
    free(t_ref); free(t); free(l_ref); free(l);
    kvt_model_free(&m);
}


/* fp16 and int8 caches against the fp32 cache, end to end. The budget, to
 * first order: every cached value carries a relative error of at most d
 * (fp16: 2^-11 of the value; int8: scale/2 = 1/254 of its group's largest
 * value). K errors move scores by ~d of their size, V errors move the
 * attention output by ~d of its size; each layer adds one K and one V term
 * to the residual stream, so the logits move by at most about 2*L*d relative
 * to their largest value. The run teacher-forces the fp32 run's tokens, so a
 * single flipped greedy choice cannot derail the comparison. */
static void test_quantized_e2e(void) {
    kvt_model m;
    int L = 2;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, L, 8, 2, 160, 97, 256), 17) == KVT_OK);
    int V = 97, np = 7, steps = 60, prompt[7];
    kvt_fake_tokens(prompt, np, V);
    int *t32 = (int *)kvt_malloc((np + steps) * sizeof(int));
    float *l32 = (float *)kvt_malloc((size_t)steps * V * 4), *lq = (float *)kvt_malloc((size_t)steps * V * 4);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    KVT_ASSERT(generate(&m, &o, prompt, np, steps, t32, l32) == KVT_OK);
    struct { kvt_dtype dt; int G; double d; const char *name; } q[] = {
        {KVT_FP16, 8, 1.0 / 2048, "fp16"}, {KVT_INT8, 4, 1.0 / 254, "int8 G=4"}, {KVT_INT8, 8, 1.0 / 254, "int8 G=HS=8"}};
    for (int i = 0; i < 3; i++) {
        o.kv_dtype = q[i].dt;
        o.kv_group = q[i].G;
        kvt_engine *e;
        kvt_seq s;
        KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
        kvt_seq_init(e, &s);
        int agree = 0;
        for (int k = 0; k < steps; k++) { /* feed the fp32 run's tokens */
            KVT_ASSERT(kvt_step(e, &s, t32, np + k, lq + (size_t)k * V) == KVT_OK);
            agree += kvt_argmax(lq + (size_t)k * V, V) == t32[np + k];
        }
        char what[128], tol[64];
        double budget = 2.0 * L * q[i].d;
        snprintf(what, sizeof(what), "%s cache vs fp32 cache, %d steps (%d/%d greedy choices agree)", q[i].name, steps, agree, steps);
        snprintf(tol, sizeof(tol), "2*L*d (d = %.3g)", q[i].d);
        tally(kvt_check(what, lq, l32, (long)steps * V, "step=60,vocab=97", budget, tol));
        kvt_seq_free(e, &s);
        kvt_engine_free(e);
    }
    free(t32); free(l32); free(lq);
    kvt_model_free(&m);
}

/* A prompt in one forward call vs one token at a time: the same logits for
 * every position (kvt_forward with all_logits), also across max_rows pieces. */
static void test_prefill(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(48, 2, 6, 3, 96, 61, 128), 8) == KVT_OK);
    int V = 61, n = 70, toks[70];
    kvt_fake_tokens(toks, n, V);
    float *a = (float *)kvt_malloc((size_t)n * V * 4), *b = (float *)kvt_malloc((size_t)n * V * 4);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 5;
    o.max_rows = 32; /* 70 rows = pieces of 32, 32, 6 */
    kvt_engine *e;
    kvt_seq s;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq_init(e, &s);
    KVT_ASSERT(kvt_forward(e, &s, toks, n, a, 1) == KVT_OK);
    kvt_seq_reset(e, &s);
    for (int i = 0; i < n; i++) KVT_ASSERT(kvt_forward(e, &s, toks + i, 1, b + (size_t)i * V, 0) == KVT_OK);
    tally(kvt_check("prefill of 70 tokens in one call vs one at a time: logits", a, b, (long)n * V, "pos=70,vocab=61",
                    TOL_E2E, "TOL_E2E"));
    kvt_seq_free(e, &s);
    kvt_engine_free(e);
    free(a); free(b);
    kvt_model_free(&m);
}

/* The GPU path (emulated or real) against the CPU path, for the option matrix. */
static void test_gpu_matrix(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 2, 4, 2, 64, 53, 40), 9) == KVT_OK);
    int V = 53, np = 5, steps = 5, prompt[5];
    kvt_fake_tokens(prompt, np, V);
    int tc[10], tg[10];
    float *lc = (float *)kvt_malloc((size_t)steps * V * 4), *lg = (float *)kvt_malloc((size_t)steps * V * 4);
    int chs[] = {1, 3, 16, 40}, total = 0, ok_all = 1;
    for (int cache = 0; cache < 2; cache++)
        for (int ci = 0; ci < 4; ci++)
            for (int mode = 0; mode < 3; mode++) /* naive, fused unsplit, fused split in pieces of 4 */
                for (int dt = 0; dt < 3; dt++) {
                    kvt_options o;
                    kvt_options_default(&o);
                    o.kv_cache = cache;
                    o.CH = chs[ci];
                    o.attn = mode ? KVT_ATTN_FUSED : KVT_ATTN_NAIVE;
                    o.split_len = mode == 2 ? 4 : -1;
                    o.kv_dtype = (kvt_dtype)dt;
                    o.kv_group = 8;
                    o.device = KVT_CPU;
                    KVT_ASSERT(generate(&m, &o, prompt, np, steps, tc, lc) == KVT_OK);
                    o.device = KVT_GPU;
                    KVT_ASSERT(generate(&m, &o, prompt, np, steps, tg, lg) == KVT_OK);
                    char what[160];
                    snprintf(what, sizeof(what), "gpu vs cpu: cache %s, CH=%d, %s, %s cache", cache ? "on" : "off", chs[ci],
                             mode == 0 ? "naive" : mode == 1 ? "fused" : "fused split 4", kvt_dtype_name((kvt_dtype)dt));
                    int ok = kvt_check(what, lg, lc, (long)steps * V, "step=5,vocab=53", KVT_TOL_GPU, "KVT_TOL_GPU");
                    int same = !memcmp(tc, tg, sizeof(int) * (size_t)(np + steps));
                    if (!same) printf("FAIL %s: the greedy tokens differ\n", what);
                    tally(ok && same);
                    ok_all &= ok && same;
                    total++;
                }
    printf("     (gpu vs cpu option matrix: %d combinations, %s)\n", total, ok_all ? "all passed" : "SOME FAILED");
    /* the last position of the context: fill TMAX exactly on the GPU */
    kvt_options o;
    kvt_options_default(&o);
    o.CH = 3;
    int tt[40], tt2[40];
    float *a = (float *)kvt_malloc((size_t)35 * V * 4), *b = (float *)kvt_malloc((size_t)35 * V * 4);
    o.device = KVT_CPU;
    KVT_ASSERT(generate(&m, &o, prompt, np, 35, tt, a) == KVT_OK);
    o.device = KVT_GPU;
    KVT_ASSERT(generate(&m, &o, prompt, np, 35, tt2, b) == KVT_OK);
    tally(kvt_check("gpu vs cpu up to the last position of the context (TMAX=40, CH=3)", b, a, 35L * V,
                    "step=35,vocab=53", KVT_TOL_GPU, "KVT_TOL_GPU"));
    free(a); free(b); free(lc); free(lg);
    kvt_model_free(&m);
}

/* "A forward never allocates": after a sequence's first forward call, decode
 * steps, a batch with forks that copy on write and a longer prefill make no
 * allocation through kvt_malloc or host_alloc (the CPU's tiled attention
 * works in the engine's scratch). Plain malloc elsewhere (kvt_seq_init's
 * chunk table, the caller's buffers) is outside the count, and so is the
 * engine's creation. On the CPU, threads as the machine has, every cache type. */
static void test_no_alloc(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, 2, 4, 2, 96, 67, 300), 33) == KVT_OK);
    int V = 67, toks[300];
    kvt_fake_tokens(toks, 300, V);
    float *lg = (float *)kvt_malloc(3L * V * 4);
    for (int dt = 0; dt < 3; dt++) {
        kvt_options o;
        kvt_options_default(&o);
        o.device = KVT_CPU;
        o.kv_dtype = (kvt_dtype)dt;
        o.CH = 8;
        o.max_seqs = 3;
        kvt_engine *e;
        kvt_seq a, f1, f2;
        KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
        KVT_ASSERT(kvt_seq_init(e, &a) == KVT_OK); /* f1, f2: made by kvt_seq_fork */
        KVT_ASSERT(kvt_forward(e, &a, toks, 5, lg, 0) == KVT_OK); /* the first call */
        long before = kvt_alloc_count;
        kvt_status st = kvt_forward(e, &a, toks + 5, 200, lg, 0); /* a prefill cut into calls, past the split length */
        for (int i = 0; i < 4 && st == KVT_OK; i++) st = kvt_forward(e, &a, toks + 205 + i, 1, lg, 0); /* decode, split */
        if (st == KVT_OK) st = kvt_seq_fork(e, &f1, &a);
        if (st == KVT_OK) st = kvt_seq_fork(e, &f2, &a);
        kvt_seq *three[3] = {&a, &f1, &f2};
        int next[3] = {7, 8, 9}, ones[3] = {1, 1, 1};
        if (st == KVT_OK) st = kvt_forward_batch(e, three, 3, next, ones, lg); /* two forks copy the shared chunk */
        long made = kvt_alloc_count - before;
        expect(st == KVT_OK && made == 0 && e->pool.cow_copies == 2,
               "no allocation in forward calls after the first (%s cache: a 200-token prefill, 4 decode steps, a batch "
               "of 3 with 2 copy-on-write copies): %ld allocation(s), %ld copies", kvt_dtype_name((kvt_dtype)dt), made,
               e->pool.cow_copies);
        kvt_seq_free(e, &a); kvt_seq_free(e, &f1); kvt_seq_free(e, &f2);
        kvt_engine_free(e);
    }
    free(lg);
    kvt_model_free(&m);
}

/* --plain (kvt_options.plain) against the tuned path, on a covering set
 * rather than every combination: each cache type, chunks of 5 with prefills
 * cut into calls of 16 rows, the CPU's automatic split and a fixed one, a
 * ragged decode batch (fp32); on the CPU and the GPU (emulated or real: fp16
 * and int8 alone, fp32 in the batch, few steps; the tuned fp16 kernel
 * rounds differently, so the GPU side has the GPU's tolerance). The engine
 * must have picked the plain table: the two paths agree, so agreement alone
 * would not show that --plain ran anything different. */
static void batch_greedy(kvt_model *m, const kvt_options *o, int steps, float *logits, int *toks) {
    enum { NS = 3 };
    int np[NS] = {9, 2, 23}, V = m->c.vocab_size, next[NS], ones[NS] = {1, 1, 1};
    kvt_engine *e;
    kvt_seq seqs[NS], *ptr[NS];
    float *lg = (float *)kvt_malloc((size_t)NS * V * 4);
    KVT_ASSERT(kvt_engine_create(&e, m, o) == KVT_OK);
    for (int i = 0; i < NS; i++) {
        int prompt[23];
        kvt_fake_tokens(prompt, np[i], V);
        prompt[0] = 3 + i;
        ptr[i] = &seqs[i];
        kvt_seq_init(e, &seqs[i]);
        KVT_ASSERT(kvt_forward(e, &seqs[i], prompt, np[i], lg + (size_t)i * V, 0) == KVT_OK);
    }
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < NS; i++) next[i] = toks[step * NS + i] = kvt_argmax(lg + (size_t)i * V, V);
        KVT_ASSERT(kvt_forward_batch(e, ptr, NS, next, ones, lg) == KVT_OK);
        memcpy(logits + (size_t)step * NS * V, lg, (size_t)NS * V * 4);
    }
    for (int i = 0; i < NS; i++) kvt_seq_free(e, &seqs[i]);
    kvt_engine_free(e);
    free(lg);
}
static void test_plain(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, 2, 4, 2, 96, 67, 200), 31) == KVT_OK);
    int V = 67, np = 40, steps = 150, prompt[40], ta[190], tb[190];
    kvt_fake_tokens(prompt, np, V);
    float *la = (float *)kvt_malloc((size_t)steps * V * 4), *lb = (float *)kvt_malloc((size_t)steps * V * 4);
    struct { kvt_dtype dt; int split; const char *what; } cases[] = {
        {KVT_FP32, 0, "fp32, automatic split"}, {KVT_FP16, 64, "fp16, split 64"}, {KVT_INT8, -1, "int8, no split"}};
    for (int gpu = 0; gpu < 1 + kvt_gpu_available(); gpu++) {
        for (int i = 0; i < 3; i++) {
            kvt_options o;
            kvt_options_default(&o);
            o.device = gpu ? KVT_GPU : KVT_CPU;
            o.CH = 5;
            o.max_rows = 16; /* the 40-token prompt: calls of 16, 16, 8 rows */
            o.kv_dtype = cases[i].dt;
            o.kv_group = 8;
            o.split_len = cases[i].split;
            if (gpu && cases[i].dt == KVT_FP32) continue; /* the emulation is slow: fp32 in the batch below */
            if (gpu && cases[i].split > 0) o.split_len = 8; /* and few steps there, so pieces of 8 */
            int ns = gpu ? 3 : steps, npr = gpu ? 20 : np; /* the CPU: past 128 positions, where its split begins */
            KVT_ASSERT(generate(&m, &o, prompt, npr, ns, ta, la) == KVT_OK);
            o.plain = 1;
            KVT_ASSERT(generate(&m, &o, prompt, npr, ns, tb, lb) == KVT_OK);
            char what[160];
            snprintf(what, sizeof(what), "--plain vs tuned (%s): %s, CH 5, a %d-token prefill in calls of 16 rows, %d steps",
                     gpu ? "gpu" : "cpu", gpu && cases[i].split > 0 ? "fp16, split 8" : cases[i].what, npr, ns);
            int ok = gpu ? kvt_check(what, lb, la, (long)ns * V, "step=3,vocab=67", KVT_TOL_GPU, "KVT_TOL_GPU")
                         : kvt_check(what, lb, la, (long)ns * V, "step=150,vocab=67", TOL_E2E, "TOL_E2E");
            int same = !memcmp(ta, tb, sizeof(int) * (size_t)(npr + ns));
            if (!same) printf("FAIL %s: the greedy tokens differ\n", what);
            tally(ok && same);
        }
        kvt_options o;
        kvt_options_default(&o);
        o.device = gpu ? KVT_GPU : KVT_CPU;
        o.CH = 4;
        o.max_seqs = 3;
        int bs = gpu ? 2 : 4; /* batch steps */
        float *ba = (float *)kvt_malloc(12L * V * 4), *bb = (float *)kvt_malloc(12L * V * 4);
        batch_greedy(&m, &o, bs, ba, ta);
        o.plain = 1;
        batch_greedy(&m, &o, bs, bb, tb);
        char what[120];
        snprintf(what, sizeof(what), "--plain vs tuned (%s): a batch of 3 sequences (prompts 9, 2, 23), %d steps",
                 gpu ? "gpu" : "cpu", bs);
        tally(kvt_check(what, bb, ba, (long)bs * 3 * V, "step=4,seq=3,vocab=67", gpu ? KVT_TOL_GPU : TOL_E2E,
                        gpu ? "KVT_TOL_GPU" : "TOL_E2E") &&
              !memcmp(ta, tb, (size_t)bs * 3 * sizeof(int)));
        kvt_engine *e;
        KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
        expect(e->op == (gpu ? &kvt_gpu_plain_ops : &kvt_cpu_plain_ops) && e->op->matmul != (gpu ? matmul_gpu : matmul_cpu),
               "--plain (%s): the engine runs the plain table (spec matmul and attention)", gpu ? "gpu" : "cpu");
        kvt_engine_free(e);
        free(ba); free(bb);
    }
    free(la); free(lb);
    kvt_model_free(&m);
}

/* Fork + copy-on-write: the parent's cached bytes never change; results equal
 * an independent run; after freeing, the pool is whole again. */
static void test_fork_cow(int gpu) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 2, 4, 2, 64, 53, 64), 10) == KVT_OK);
    int V = 53, toks[20];
    kvt_fake_tokens(toks, 20, V);
    kvt_options o;
    kvt_options_default(&o);
    o.device = gpu ? KVT_GPU : KVT_CPU;
    o.CH = 4;
    o.max_seqs = 3;
    kvt_engine *e;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq a, b, c;
    kvt_seq_init(e, &a);
    float *la = (float *)kvt_malloc((size_t)V * 4), *lb = (float *)kvt_malloc((size_t)V * 4);
    KVT_ASSERT(kvt_forward(e, &a, toks, 10, la, 0) == KVT_OK); /* 10 positions: chunks 4+4+2 */
    float before[2][10][64], after[64];
    for (int t = 0; t < 10; t++) for (int w = 0; w < 2; w++) kvt_cache_read(e, &a, 1, w, t, before[w][t]);
    KVT_ASSERT(kvt_seq_fork(e, &b, &a) == KVT_OK);
    const kvt_seq *live[3] = {&a, &b, &c};
    expect(kvt_pool_check(e, live, 2) == KVT_OK && e->pool.refcount[a.table[0]] == 2,
           "fork (%s): chunks shared, refcounts consistent", gpu ? "gpu" : "cpu");
    KVT_ASSERT(kvt_forward(e, &b, toks + 10, 5, lb, 0) == KVT_OK); /* writes into the shared partial chunk */
    int same = 1;
    for (int t = 0; t < 10; t++) for (int w = 0; w < 2; w++) {
        kvt_cache_read(e, &a, 1, w, t, after);
        same &= !memcmp(after, before[w][t], (size_t)m.kv_dim * 4);
    }
    expect(same && e->pool.cow_copies == 1 && b.table[2] != a.table[2] && b.table[0] == a.table[0],
           "copy-on-write (%s): parent's cached bytes unchanged, 1 copy, full chunks still shared", gpu ? "gpu" : "cpu");
    KVT_ASSERT(kvt_seq_init(e, &c) == KVT_OK);
    float *lc = (float *)kvt_malloc((size_t)V * 4);
    KVT_ASSERT(kvt_forward(e, &c, toks, 15, lc, 0) == KVT_OK);
    tally(kvt_check(gpu ? "forked sequence vs independent run (gpu)" : "forked sequence vs independent run (cpu)", lb, lc,
                    V, "vocab=53", TOL_E2E, "TOL_E2E"));
    expect(kvt_pool_check(e, live, 3) == KVT_OK, "pool consistent with 3 live sequences (%s)", gpu ? "gpu" : "cpu");
    kvt_seq_free(e, &a);
    kvt_seq_free(e, &b);
    kvt_seq_free(e, &c);
    expect(e->pool.n_free == e->pool.n_chunks && kvt_pool_check(e, live, 0) == KVT_OK,
           "all sequences freed: pool back to full capacity %d (%s)", e->pool.n_chunks, gpu ? "gpu" : "cpu");
    kvt_engine_free(e);
    free(la); free(lb); free(lc);
    kvt_model_free(&m);
}


// ---- batches, forks, prefix reuse ------------------------------------------------------------

/* Sequences of different lengths decoded together give what each gives alone. */
static void test_batch(int gpu) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 2, 4, 2, 64, 53, 64), 12) == KVT_OK);
    int V = 53, nseq = 4, np[4] = {3, 17, 30, 1}, steps = 6, all[4][40], toks_alone[40];
    float *alone = (float *)kvt_malloc((size_t)steps * V * 4), *logits = (float *)kvt_malloc((size_t)nseq * V * 4);
    float *batched = (float *)kvt_malloc((size_t)nseq * steps * V * 4);
    for (int i = 0; i < nseq; i++) { kvt_fake_tokens(all[i], 40, V); all[i][0] = i + 5; } /* distinct prompts */
    kvt_options o;
    kvt_options_default(&o);
    o.device = gpu ? KVT_GPU : KVT_CPU;
    o.CH = 4;
    o.max_seqs = nseq;
    kvt_engine *e;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq seqs[4], *ptr[4];
    int next[4], ones[4] = {1, 1, 1, 1}, len[4];
    for (int i = 0; i < nseq; i++) {
        ptr[i] = &seqs[i];
        kvt_seq_init(e, &seqs[i]);
        KVT_ASSERT(kvt_forward(e, &seqs[i], all[i], np[i], logits + i * V, 0) == KVT_OK);
        len[i] = np[i];
    }
    kvt_status st = KVT_OK;
    for (int step = 0; step < steps && st == KVT_OK; step++) {
        for (int i = 0; i < nseq; i++) {
            memcpy(batched + ((size_t)i * steps + step) * V, logits + i * V, (size_t)V * 4);
            next[i] = all[i][len[i]++] = kvt_argmax(logits + i * V, V);
        }
        st = kvt_forward_batch(e, ptr, nseq, next, ones, logits);
    }
    expect(st == KVT_OK, "batched decode of 4 sequences (lengths 3, 17, 30, 1) runs (%s)", gpu ? "gpu" : "cpu");
    for (int i = 0; i < nseq; i++) { /* the same sequence alone */
        o.max_seqs = 1;
        KVT_ASSERT(generate(&m, &o, all[i], np[i], steps, toks_alone, alone) == KVT_OK);
        char what[96];
        snprintf(what, sizeof(what), "batch vs alone (%s): sequence %d, prompt %d, %d steps", gpu ? "gpu" : "cpu", i, np[i], steps);
        int ok = kvt_check(what, batched + (size_t)i * steps * V, alone, (long)steps * V, "step=6,vocab=53", TOL_E2E, "TOL_E2E");
        int same = !memcmp(toks_alone, all[i], (size_t)(np[i] + steps) * sizeof(int));
        if (!same) printf("FAIL %s: greedy tokens differ\n", what);
        tally(ok && same);
    }
    /* a ragged prefill in one call: 5, 1 and 9 new tokens for three fresh sequences */
    int nt[3] = {5, 1, 9}, cat[15];
    for (int i = 0; i < 3; i++) kvt_seq_reset(e, &seqs[i]);
    for (int i = 0, r = 0; i < 3; i++) for (int j = 0; j < nt[i]; j++) cat[r++] = all[i][j];
    st = kvt_forward_batch(e, ptr, 3, cat, nt, logits);
    float want[3 * 53];
    kvt_seq solo;
    for (int i = 0; i < 3; i++) {
        kvt_seq_init(e, &solo);
        KVT_ASSERT(st == KVT_OK && kvt_forward(e, &solo, all[i], nt[i], want + i * V, 0) == KVT_OK);
        kvt_seq_free(e, &solo);
    }
    tally(kvt_check(gpu ? "ragged batched prefill (5, 1, 9 rows) vs one by one (gpu)" : "ragged batched prefill (5, 1, 9 rows) vs one by one (cpu)",
                    logits, want, 3L * V, "seq=3,vocab=53", TOL_E2E, "TOL_E2E"));
    for (int i = 0; i < nseq; i++) kvt_seq_free(e, &seqs[i]);
    kvt_engine_free(e);
    free(alone); free(logits); free(batched);
    kvt_model_free(&m);
}

/* Forked continuations sample exactly what independent runs with the same
 * prompt and seeds sample. */
static void test_fork_sampling(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 2, 4, 2, 64, 53, 64), 13) == KVT_OK);
    int V = 53, np = 10, steps = 12, prompt[10], nf = 4, ok = 1;
    kvt_fake_tokens(prompt, np, V);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 4;
    o.max_seqs = nf;
    kvt_engine *e;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq seqs[4], *ptr[4];
    kvt_sampler sm[4];
    int out[4][30], next[4], ones[4] = {1, 1, 1, 1};
    float *logits = (float *)kvt_malloc((size_t)nf * V * 4);
    kvt_seq_init(e, &seqs[0]);
    KVT_ASSERT(kvt_forward(e, &seqs[0], prompt, np, logits, 0) == KVT_OK);
    for (int i = 0; i < nf; i++) {
        if (i) { KVT_ASSERT(kvt_seq_fork(e, &seqs[i], &seqs[0]) == KVT_OK); memcpy(logits + i * V, logits, (size_t)V * 4); }
        ptr[i] = &seqs[i];
        kvt_sampler_init(&sm[i], V, 1.0f, 0.95f, (uint64_t)(100 + i));
    }
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < nf; i++) next[i] = out[i][step] = kvt_sample(&sm[i], logits + i * V, V);
        KVT_ASSERT(kvt_forward_batch(e, ptr, nf, next, ones, logits) == KVT_OK);
    }
    for (int i = 0; i < nf; i++) { /* independent: its own engine, its own sampler with the same seed */
        kvt_options so = o;
        so.max_seqs = 1;
        kvt_engine *e2;
        kvt_seq s2;
        kvt_sampler sm2;
        float lg[53];
        int hist[40];
        memcpy(hist, prompt, sizeof(prompt));
        KVT_ASSERT(kvt_engine_create(&e2, &m, &so) == KVT_OK);
        kvt_seq_init(e2, &s2);
        kvt_sampler_init(&sm2, V, 1.0f, 0.95f, (uint64_t)(100 + i));
        for (int step = 0; step < steps; step++) {
            KVT_ASSERT(kvt_step(e2, &s2, hist, np + step, lg) == KVT_OK);
            hist[np + step] = kvt_sample(&sm2, lg, V);
            ok &= hist[np + step] == out[i][step];
        }
        kvt_sampler_free(&sm2);
        kvt_seq_free(e2, &s2);
        kvt_engine_free(e2);
    }
    expect(ok, "4 forked continuations (seeds 100..103, temperature 1, top-p 0.95) = 4 independent runs, 12 tokens each");
    int distinct = 0;
    for (int i = 1; i < nf; i++) distinct += memcmp(out[i], out[0], (size_t)steps * sizeof(int)) != 0;
    expect(distinct == nf - 1, "the 4 continuations differ from each other (different seeds)");
    for (int i = 0; i < nf; i++) { kvt_seq_free(e, &seqs[i]); kvt_sampler_free(&sm[i]); }
    kvt_engine_free(e);
    free(logits);
    kvt_model_free(&m);
}

/* A second request with the same prompt computes only the last, partial chunk. */
static void test_prefix_reuse(int gpu) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 2, 4, 2, 64, 53, 64), 14) == KVT_OK);
    int V = 53, np = 37, prompt[37];
    kvt_fake_tokens(prompt, np, V);
    kvt_options o;
    kvt_options_default(&o);
    o.device = gpu ? KVT_GPU : KVT_CPU;
    o.CH = 8;
    o.max_seqs = 2;
    kvt_engine *e;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq a, b;
    float la[53], lb[53];
    kvt_seq_init(e, &a);
    kvt_seq_init(e, &b);
    KVT_ASSERT(kvt_forward(e, &a, prompt, np, la, 0) == KVT_OK);
    long rows_before = e->n_prefill + e->n_decode, hits = e->pool.prefix_hits, misses = e->pool.prefix_misses;
    KVT_ASSERT(kvt_forward(e, &b, prompt, np, lb, 0) == KVT_OK);
    long rows = e->n_prefill + e->n_decode - rows_before;
    expect(e->pool.prefix_hits - hits == 4 && e->pool.prefix_misses - misses == 1 && rows == 5 && b.table[0] == a.table[0],
           "prefix reuse (%s): 2nd request of 37 tokens, CH 8: 4 chunks reused, 1 computed, %ld rows run", gpu ? "gpu" : "cpu", rows);
    tally(kvt_check(gpu ? "prefix-reused request vs cold run: logits (gpu)" : "prefix-reused request vs cold run: logits (cpu)",
                    lb, la, V, "vocab=53", TOL_E2E, "TOL_E2E"));
    const kvt_seq *live[2] = {&a, &b};
    expect(kvt_pool_check(e, live, 2) == KVT_OK, "pool consistent after prefix reuse (%s)", gpu ? "gpu" : "cpu");
    kvt_seq_free(e, &a);
    kvt_seq_free(e, &b);
    kvt_engine_free(e);
    kvt_model_free(&m);
}

/* Pool exhaustion in the middle of a batch: the error names the sequence, and
 * every sequence is left intact and usable. */
static void test_batch_exhaustion(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 2, 4, 2, 64, 53, 64), 15) == KVT_OK);
    int V = 53, toks[3][20];
    for (int i = 0; i < 3; i++) { kvt_fake_tokens(toks[i], 20, V); toks[i][0] = i; }
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 4;
    o.max_seqs = 3;
    o.n_chunks = 7;
    o.prefix_reuse = 0;
    kvt_engine *e;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq s[3], *ptr[3] = {&s[0], &s[1], &s[2]};
    float lg[3 * 53], la[53];
    int lens[3] = {4, 6, 8}; /* chunks: 1, 2, 2 -> 5 of 7 used; the next token needs 1 for s0, 0, 1 for s2 */
    for (int i = 0; i < 3; i++) { kvt_seq_init(e, &s[i]); KVT_ASSERT(kvt_forward(e, &s[i], toks[i], lens[i], lg, 0) == KVT_OK); }
    KVT_ASSERT(kvt_forward(e, &s[0], toks[0] + 4, 4, lg, 0) == KVT_OK); /* s0 now 8: 2 chunks, 6 used, 1 free */
    int next[3] = {toks[0][8], toks[1][6], toks[2][8]}, ones[3] = {1, 1, 1};
    kvt_status st = kvt_forward_batch(e, ptr, 3, next, ones, lg);
    expect(st == KVT_EPOOL && contains(kvt_last_error(), "sequence 2") && s[0].len == 8 && s[1].len == 6 && s[2].len == 8 &&
           e->pool.n_free == 1, "pool exhausted mid-batch: names sequence 2, no sequence changed: %s", kvt_last_error());
    /* the others go on, and give what they would have given */
    st = kvt_forward_batch(e, ptr, 2, next, ones, lg);
    kvt_seq ref;
    kvt_seq_free(e, &s[2]);
    kvt_seq_init(e, &ref);
    KVT_ASSERT(st == KVT_OK && kvt_forward(e, &ref, toks[1], 7, la, 0) == KVT_OK);
    tally(kvt_check("after the failed batch, sequence 1 continues as if nothing happened", lg + V, la, V, "vocab=53", TOL_E2E,
                    "TOL_E2E"));
    kvt_seq_free(e, &ref);
    for (int i = 0; i < 2; i++) kvt_seq_free(e, &s[i]);
    expect(e->pool.n_free == 7, "pool full again after freeing");
    kvt_engine_free(e);
    kvt_model_free(&m);
}

/* Memory: 8 continuations of a 400-token prompt, 100 tokens each, CH 16. */
static void test_fork_memory(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 1, 4, 2, 64, 53, 512), 16) == KVT_OK);
    int V = 53, prompt[400];
    kvt_fake_tokens(prompt, 400, V);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 16;
    o.max_seqs = 8;
    kvt_engine *e;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq s[8], *ptr[8];
    float *lg = (float *)kvt_malloc(8 * 53 * 4);
    kvt_seq_init(e, &s[0]);
    KVT_ASSERT(kvt_forward(e, &s[0], prompt, 400, lg, 0) == KVT_OK);
    for (int i = 0; i < 8; i++) { if (i) KVT_ASSERT(kvt_seq_fork(e, &s[i], &s[0]) == KVT_OK); ptr[i] = &s[i]; }
    int next[8], ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (int step = 0; step < 100; step++) {
        for (int i = 0; i < 8; i++) next[i] = (step * 7 + i * 13) % V;
        KVT_ASSERT(kvt_forward_batch(e, ptr, 8, next, ones, lg) == KVT_OK);
    }
    kvt_cache_usage u;
    kvt_cache_usage_of(e, (const kvt_seq *const *)ptr, 8, &u);
    /* by hand: 25 shared prompt chunks + 8 x ceil(100/16) = 7 private ones = 81 of 8 x 32 = 256 */
    expect(u.chunks_used == 81 && u.bytes_unshared == 256.0 * u.bytes_used / 81,
           "fork memory: 8 x (400 + 100) positions hold %d chunks (81 by hand), %.1f%% saved", u.chunks_used,
           100.0 * (1 - u.bytes_used / u.bytes_unshared));
    for (int i = 0; i < 8; i++) kvt_seq_free(e, &s[i]);
    kvt_engine_free(e);
    free(lg);
    kvt_model_free(&m);
}

// ---- the pool printer (--trace, kvt_pool_print) ------------------------------------------

/* What the printer writes, as a string: every live sequence (all) or the given ones. */
static char *pool_text(kvt_engine *e, const kvt_seq *const *seqs, int n, int all) {
    FILE *f = tmpfile();
    KVT_ASSERT(f);
    if (all) kvt_pool_print(f, e);
    else kvt_pool_print_seqs(f, e, seqs, n);
    long len = ftell(f);
    KVT_ASSERT(len >= 0);
    rewind(f);
    char *text = (char *)kvt_malloc((size_t)len + 1);
    text[fread(text, 1, (size_t)len, f)] = '\0';
    fclose(f);
    return text;
}
/* An exact comparison of two texts; on a mismatch the first differing line of
 * each, then both texts whole, line by line (want| and got |). */
static void expect_text(const char *what, const char *got, const char *want) {
    if (!strcmp(got, want)) { expect(1, "%s", what); return; }
    int line = 1;
    const char *g = got, *w = want;
    while (*g && *g == *w) { if (*g == '\n') line++; g++; w++; }
    while (g > got && g[-1] != '\n') { g--; w--; } /* back to the start of that line */
    expect(0, "%s: line %d differs:\n  want| %.*s\n  got | %.*s", what, line, (int)strcspn(w, "\n"), w,
           (int)strcspn(g, "\n"), g);
    printf("  want (whole):\n");
    for (const char *p = want; *p; p += strcspn(p, "\n") + (p[strcspn(p, "\n")] != '\0'))
        printf("  want| %.*s\n", (int)strcspn(p, "\n"), p);
    printf("  got (whole):\n");
    for (const char *p = got; *p; p += strcspn(p, "\n") + (p[strcspn(p, "\n")] != '\0'))
        printf("  got | %.*s\n", (int)strcspn(p, "\n"), p);
}

/* The totals line of a trace (its last one, when there are several steps). */
typedef struct { int used, free, shared, n; long entries, saves; double chunk_bytes, bytes; } trace_totals;
static int trace_totals_of(const char *text, trace_totals *t) {
    const char *p = NULL;
    for (const char *q = strstr(text, "totals: "); q; q = strstr(q + 1, "totals: ")) p = q;
    return p && sscanf(p, "totals: in use %d, free %d, shared %d (of %d chunks); %ld table entries: sharing saves "
                       "%ld x %lf = %lf bytes", &t->used, &t->free, &t->shared, &t->n, &t->entries, &t->saves,
                       &t->chunk_bytes, &t->bytes) == 8;
}
/* The totals kvt_pool_print shows equal what kvt_cache_usage_of (--stats)
 * computes for the live sequences, what the tables themselves say (chunks in
 * two tables or more are the shared ones), and kvt_pool_check passes, both
 * with the caller's list and with the engine's own. */
static void check_trace_totals(kvt_engine *e, const kvt_seq *const *live, int n, const char *step) {
    char *text = pool_text(e, NULL, 0, 1);
    trace_totals t;
    memset(&t, 0, sizeof(t));
    kvt_cache_usage u;
    kvt_cache_usage_of(e, live, n, &u);
    int *holders = (int *)calloc((size_t)e->pool.n_chunks, sizeof(int)), shared = 0;
    long entries = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < live[i]->n_table; j++) { holders[live[i]->table[j]]++; entries++; }
    for (int c = 0; c < e->pool.n_chunks; c++) shared += holders[c] > 1;
    free(holders);
    int parsed = trace_totals_of(text, &t);
    int check = kvt_pool_check(e, live, n) == KVT_OK, check_own = kvt_pool_check(e, NULL, 0) == KVT_OK;
    expect(parsed && t.used == u.chunks_used && t.free == e->pool.n_free && t.used + t.free == t.n &&
           t.entries == entries && t.shared == shared && t.saves == t.entries - t.used &&
           fabs(t.bytes - (u.bytes_unshared - u.bytes_used)) < 0.5 && check && check_own,
           "trace totals %s: in use %d (--stats %d), shared %d (tables %d), %ld entries (tables %ld), saves %.0f "
           "bytes (--stats %.0f); kvt_pool_check %s, on the engine's list %s", step, t.used, u.chunks_used, t.shared,
           shared, t.entries, entries, t.bytes, u.bytes_unshared - u.bytes_used, check ? "ok" : "FAILS",
           check_own ? "ok" : "FAILS");
    free(text);
}

/* The trace of a small scenario against text written by hand from
 * the rules (kvtransformer.h): a prefill of 6 tokens with CH 4 (chunks 0, 1;
 * the second 2/4 full), a fork, a decode into the fork (copy-on-write of the
 * shared partial chunk into the next free chunk, 2), the parent freed (chunk
 * 1 back on top of the free stack), the same prompt again (chunk 0 attached by
 * prefix reuse, chunk 1 taken for positions 4-5), a batch step, all freed.
 * Chunk bytes: L 2 x (K, V) x CH 4 x NKV 2 x HS 8 = 256 floats = 1024 bytes. */
static void test_trace_scenario(int gpu) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 2, 4, 2, 64, 53, 64), 17) == KVT_OK);
    int V = 53, toks[8];
    kvt_fake_tokens(toks, 8, V);
    kvt_options o;
    kvt_options_default(&o);
    o.device = gpu ? KVT_GPU : KVT_CPU;
    o.CH = 4;
    o.max_seqs = 2;
    o.n_chunks = 8;
    kvt_engine *e;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq a, b, c;
    float lg[2 * 53];
    const char *dev = gpu ? "gpu" : "cpu";
    char what[96];
    struct { const char *step, *want; } step[] = {
        {"prefill of 6",
         "seq 0 [ 0 1 (2/4) ] len 6\n"
         "pool [##......]\n"
         "totals: in use 2, free 6, shared 0 (of 8 chunks); 2 table entries: sharing saves 0 x 1024 = 0 bytes\n"},
        {"fork",
         "seq 0 [ 0* 1* (2/4) ] len 6\n"
         "seq 1 [ 0* 1* (2/4) ] len 6\n"
         "pool [**......]\n"
         "totals: in use 2, free 6, shared 2 (of 8 chunks); 4 table entries: sharing saves 2 x 1024 = 2048 bytes\n"},
        {"copy-on-write",
         "seq 0 [ 0* 1 (2/4) ] len 6\n"
         "seq 1 [ 0* 2c (3/4) ] len 7\n"
         "pool [*##.....]\n"
         "totals: in use 3, free 5, shared 1 (of 8 chunks); 4 table entries: sharing saves 1 x 1024 = 1024 bytes\n"},
        {"parent freed",
         "seq 1 [ 0 2c (3/4) ] len 7\n"
         "pool [#.#.....]\n"
         "totals: in use 2, free 6, shared 0 (of 8 chunks); 2 table entries: sharing saves 0 x 1024 = 0 bytes\n"},
        {"prefix hit",
         "seq 1 [ 0* 2c (3/4) ] len 7\n"
         "seq 2 [ 0*+ 1 (2/4) ] len 6\n"
         "pool [*##.....]\n"
         "totals: in use 3, free 5, shared 1 (of 8 chunks); 4 table entries: sharing saves 1 x 1024 = 1024 bytes\n"},
        {"batch step",
         "seq 1 [ 0* 2c ] len 8\n"
         "seq 2 [ 0*+ 1 (3/4) ] len 7\n"
         "pool [*##.....]\n"
         "totals: in use 3, free 5, shared 1 (of 8 chunks); 4 table entries: sharing saves 1 x 1024 = 1024 bytes\n"},
        {"all freed",
         "pool [........]\n"
         "totals: in use 0, free 8, shared 0 (of 8 chunks); 0 table entries: sharing saves 0 x 1024 = 0 bytes\n"},
    };
    const kvt_seq *live[2];
    for (int k = 0; k < 7; k++) {
        int n = 0;
        if (k == 0) { kvt_seq_init(e, &a); KVT_ASSERT(kvt_forward(e, &a, toks, 6, lg, 0) == KVT_OK); }
        if (k == 1) KVT_ASSERT(kvt_seq_fork(e, &b, &a) == KVT_OK);
        if (k == 2) KVT_ASSERT(kvt_forward(e, &b, toks + 6, 1, lg, 0) == KVT_OK);
        if (k == 3) kvt_seq_free(e, &a);
        if (k == 4) { kvt_seq_init(e, &c); KVT_ASSERT(kvt_forward(e, &c, toks, 6, lg, 0) == KVT_OK); }
        if (k == 5) {
            kvt_seq *batch[2] = {&b, &c};
            int next[2] = {toks[7], toks[6]}, ones[2] = {1, 1};
            KVT_ASSERT(kvt_forward_batch(e, batch, 2, next, ones, lg) == KVT_OK);
        }
        if (k == 6) { kvt_seq_free(e, &b); kvt_seq_free(e, &c); }
        if (k < 3) live[n++] = &a;
        if (k >= 1 && k < 6) live[n++] = &b;
        if (k >= 4 && k < 6) live[n++] = &c;
        char *got = pool_text(e, NULL, 0, 1);
        snprintf(what, sizeof(what), "trace by hand (%s), step %d: %s", dev, k + 1, step[k].step);
        expect_text(what, got, step[k].want);
        free(got);
        snprintf(what, sizeof(what), "(%s) after step %d, %s", dev, k + 1, step[k].step);
        check_trace_totals(e, live, n, what);
        if (k == 2) { /* the markers are bookkeeping kvt_pool_check reads too */
            b.how[1] = '+'; /* chunk 2 is partly filled: prefix reuse never attaches such a chunk */
            kvt_status st1 = kvt_pool_check(e, live, n);
            b.how[1] = 'x';
            kvt_status st2 = kvt_pool_check(e, NULL, 0);
            b.how[1] = 'c';
            expect(st1 == KVT_EPOOL && st2 == KVT_EPOOL && kvt_pool_check(e, live, n) == KVT_OK,
                   "kvt_pool_check (%s) refuses a '+' on a partly filled chunk and an unknown marker: %s", dev,
                   kvt_last_error());
        }
    }
    kvt_engine_free(e);
    kvt_model_free(&m);
}

/* The contiguous layout (CH = TMAX: one chunk per sequence), a pool too large
 * to draw (rows of 64 with their chunk ids, 512 drawn, the rest counted), and
 * the cache off, each against text written from the rules. */
static void test_trace_shapes(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 1, 4, 2, 64, 53, 600), 18) == KVT_OK);
    int toks[600];
    kvt_fake_tokens(toks, 600, 53);
    float lg[53];
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 600; /* = TMAX: the classic preallocated buffer; chunk = 1 x 2 x 600 x 2 x 8 floats = 76800 bytes */
    o.max_seqs = 2;
    kvt_engine *e;
    kvt_seq a, b;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq_init(e, &a);
    KVT_ASSERT(kvt_forward(e, &a, toks, 6, lg, 0) == KVT_OK);
    KVT_ASSERT(kvt_seq_fork(e, &b, &a) == KVT_OK);
    KVT_ASSERT(kvt_forward(e, &b, toks + 6, 1, lg, 0) == KVT_OK);
    char *got = pool_text(e, NULL, 0, 1);
    expect_text("trace by hand: CH = TMAX 600, a sequence of 6 and its fork with 1 more (copied on write)", got,
                "seq 0 [ 0 (6/600) ] len 6\n"
                "seq 1 [ 1c (7/600) ] len 7\n"
                "pool [##]\n"
                "totals: in use 2, free 0, shared 0 (of 2 chunks); 2 table entries: sharing saves 0 x 76800 = "
                "0 bytes\n");
    free(got);
    kvt_seq_free(e, &a);
    kvt_seq_free(e, &b);
    kvt_engine_free(e);
    /* CH 1, 600 chunks; a sequence of 520 positions (chunks 0..519) and its fork: all 520 shared */
    o.CH = 1;
    o.max_seqs = 1;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq_init(e, &a);
    KVT_ASSERT(kvt_forward(e, &a, toks, 520, lg, 0) == KVT_OK);
    KVT_ASSERT(kvt_seq_fork(e, &b, &a) == KVT_OK);
    char want[2048], row[65];
    memset(row, '*', 64);
    row[64] = '\0';
    int k = 0;
    for (int r = 0; r < 8; r++)
        k += sprintf(want + k, "%s[%s] %d..%d\n", r ? "     " : "pool ", row, 64 * r, 64 * r + 63);
    sprintf(want + k, "     + chunks 512..599 not drawn: in use 8, shared 8, free 80\n"
            "totals: in use 520, free 80, shared 520 (of 600 chunks); 1040 table entries: sharing saves 520 x 128 = "
            "66560 bytes\n");
    got = pool_text(e, NULL, 0, 0); /* no sequence lines: the map and the totals */
    expect_text("trace by hand: a pool of 600 chunks, 520 shared: 8 rows of 64, the rest counted", got, want);
    free(got);
    kvt_seq_free(e, &a);
    kvt_seq_free(e, &b);
    kvt_engine_free(e);
    o.kv_cache = 0;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    got = pool_text(e, NULL, 0, 1);
    expect_text("trace by hand: the cache off", got,
                "kv cache off: every step recomputes the whole sequence, so there is no pool to show\n");
    free(got);
    kvt_engine_free(e);
    kvt_model_free(&m);
}

// ---- bad input ---------------------------------------------------------------------------

static int write_checkpoint(const char *path, const kvt_model *m, long cut, int extra) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    kvt_config c = m->c;
    if (!m->shared_classifier) c.vocab_size = -c.vocab_size;
    fwrite(&c, sizeof(c), 1, f);
    fwrite(m->data, sizeof(float), m->n_floats - (size_t)cut, f);
    for (int i = 0; i < extra; i++) fputc(0, f);
    fclose(f);
    return 1;
}
static void patch_header(const char *path, int field, int value) {
    FILE *f = fopen(path, "r+b");
    KVT_ASSERT(f);
    fseek(f, 4L * field, SEEK_SET);
    fwrite(&value, 4, 1, f);
    fclose(f);
}

static void test_bad_input(void) {
    kvt_model m, m2;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 2, 4, 2, 64, 53, 32), 11) == KVT_OK);
    const char *p = tmp_file("model.bin");
    KVT_ASSERT(write_checkpoint(p, &m, 0, 0));
    kvt_status st = kvt_model_load(&m2, p);
    int ok = st == KVT_OK && m2.n_floats == m.n_floats && !memcmp(m2.data, m.data, m.n_floats * 4);
    expect(ok, "checkpoint: write + load round trip (unshared classifier)");
    if (st == KVT_OK) kvt_model_free(&m2);
    st = kvt_model_load(&m2, "/nonexistent/model.bin");
    expect(st == KVT_EIO && contains(kvt_last_error(), "/nonexistent/model.bin"), "missing checkpoint: %s", kvt_last_error());
    write_checkpoint(p, &m, 100, 0);
    st = kvt_model_load(&m2, p);
    expect(st == KVT_EFORMAT && contains(kvt_last_error(), "truncated"), "truncated checkpoint: %s", kvt_last_error());
    write_checkpoint(p, &m, 0, 12);
    st = kvt_model_load(&m2, p);
    expect(st == KVT_EFORMAT && contains(kvt_last_error(), "extra bytes"), "oversized checkpoint: %s", kvt_last_error());
    write_checkpoint(p, &m, 0, 0);
    patch_header(p, 1, 65); /* hidden_dim 64 -> 65: sizes disagree with the file */
    st = kvt_model_load(&m2, p);
    expect(st == KVT_EFORMAT && contains(kvt_last_error(), "needs"), "header disagrees with file size: %s", kvt_last_error());
    patch_header(p, 1, 64);
    patch_header(p, 4, 3); /* n_kv_heads 3 does not divide n_heads 4 */
    st = kvt_model_load(&m2, p);
    expect(st == KVT_EFORMAT && contains(kvt_last_error(), "n_kv_heads"), "inconsistent header: %s", kvt_last_error());
    patch_header(p, 4, 2);
    patch_header(p, 0, -32);
    st = kvt_model_load(&m2, p);
    expect(st == KVT_EFORMAT && contains(kvt_last_error(), "dim"), "negative dimension: %s", kvt_last_error());
    FILE *f = fopen(p, "wb");
    fwrite("hi", 1, 2, f);
    fclose(f);
    st = kvt_model_load(&m2, p);
    expect(st == KVT_EFORMAT, "2-byte checkpoint: %s", kvt_last_error());

    /* tokenizers: garbage, and one for another vocabulary size */
    const char *tp = tmp_file("tok.bin");
    f = fopen(tp, "wb");
    uint64_t s = 3;
    for (int i = 0; i < 500; i++) fputc((int)(kvt_rng_u64(&s) & 255), f);
    fclose(f);
    kvt_tokenizer tk;
    st = kvt_tokenizer_load(&tk, tp, 53);
    expect(st == KVT_EFORMAT, "garbage tokenizer: %s", kvt_last_error());
    st = kvt_tokenizer_load(&tk, "/nonexistent/tok.bin", 53);
    expect(st == KVT_EIO, "missing tokenizer: %s", kvt_last_error());

    /* context and pool limits */
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 4;
    o.n_chunks = 2;
    kvt_engine *e;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq sq;
    kvt_seq_init(e, &sq);
    int toks[40];
    kvt_fake_tokens(toks, 40, 53);
    float *lg = (float *)kvt_malloc(53 * 4);
    st = kvt_forward(e, &sq, toks, 8, lg, 0);
    KVT_ASSERT(st == KVT_OK);
    st = kvt_forward(e, &sq, toks + 8, 1, lg, 0);
    expect(st == KVT_EPOOL && contains(kvt_last_error(), "--chunks") && sq.len == 8 && e->pool.n_free == 0,
           "exhausted pool: error, sequence intact: %s", kvt_last_error());
    kvt_seq_free(e, &sq);
    kvt_engine_free(e);
    o.n_chunks = 0;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq_init(e, &sq);
    st = kvt_forward(e, &sq, toks, 33, lg, 0);
    expect(st == KVT_ECONTEXT && sq.len == 0, "33 positions into a context of 32: %s", kvt_last_error());
    toks[0] = 53;
    st = kvt_forward(e, &sq, toks, 1, lg, 0);
    expect(st == KVT_EARG, "token id out of range: %s", kvt_last_error());
    kvt_seq_free(e, &sq);
    kvt_engine_free(e);
    o.kv_dtype = KVT_INT8;
    o.kv_group = 5;
    st = kvt_engine_create(&e, &m, &o);
    expect(st == KVT_EARG && contains(kvt_last_error(), "--kv-group"), "int8 group not dividing HS: %s", kvt_last_error());
    o.kv_dtype = KVT_FP32;
    o.CH = 0;
    st = kvt_engine_create(&e, &m, &o);
    expect(st == KVT_EARG && contains(kvt_last_error(), "--chunk"), "chunk size 0: %s", kvt_last_error());
    o.CH = 4;
    o.n_chunks = 1 << 28; /* 2^28 chunks of 4 positions: 256 GiB, more than this machine has */
    for (int dev = 0; dev < 1 + kvt_gpu_available(); dev++) { /* (an nvcc build without a GPU: the host only) */
        o.device = dev ? KVT_GPU : KVT_CPU;
        st = kvt_engine_create(&e, &m, &o);
        /* host memory (the CPU, or the emulated GPU) is checked before the pool is
         * allocated; a real GPU's cudaMalloc fails by itself */
        int on_device = dev && !KVT_EMULATED && kvt_gpu_available();
        expect(st == KVT_ENOMEM && contains(kvt_last_error(), on_device ? "device out of memory: the KV cache pool needs"
                                                                        : "not enough host memory"),
               "a pool too large for the %s: %s", dev ? "device" : "host", kvt_last_error());
        if (st == KVT_OK) kvt_engine_free(e);
    }
    free(lg);
    kvt_model_free(&m);
}

/* The command-line checks need the kvt binary (main's argument): 1 when it
 * is there, else 0 and one SKIP line naming the checks left out. */
static int have_kvt(const char *what) {
    FILE *f = fopen(kvt_bin, "rb");
    if (f) { fclose(f); return 1; }
    printf("SKIP %s (no kvt binary given)\n", what);
    n_skip++;
    return 0;
}
/* Run kvt with args (through the shell: redirections work) and keep the
 * first cap - 1 bytes of stdout + stderr (with stdout_only, of stdout alone:
 * stderr is dropped); returns the exit status (-1: not run). */
static int cli_run_to(const char *args, int stdout_only, char *out, size_t cap) {
    char full[4096], cmd[sizeof(full) + 1024];
    with_test_dir(full, sizeof(full), args);
    snprintf(cmd, sizeof(cmd), "%s %s %s", kvt_bin, full, stdout_only ? "2>/dev/null" : "2>&1");
    out[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    while (fgetc(p) != EOF) {} /* the rest, unread: kvt must not die of a closed pipe */
    return pclose(p);
}
static int cli_run(const char *args, char *out, size_t cap) { return cli_run_to(args, 0, out, cap); }
/* The command line: bad flags give one clear line and a non-zero exit. */
/* (The command runs through the shell with this process's environment, so a
 * setenv before the call reaches kvt.) */
static void cli_expect(const char *args, int want_ok, const char *want_text) {
    char out[4096], want[1024];
    int rc = cli_run(args, out, sizeof(out));
    with_test_dir(want, sizeof(want), want_text);
    int ok = rc != -1 && (rc == 0) == want_ok && contains(out, want);
    char first[200];
    snprintf(first, sizeof(first), "%.199s", out);
    char *nl = strchr(first, '\n');
    if (nl) *nl = '\0';
    expect(ok, "cli '%s': exit %s, says '%s'", args, rc == 0 ? "0" : "non-zero", first);
}
/* An nvcc build on a machine without a GPU: the default falls back to the CPU
 * and says so once; an explicit --device gpu is refused. */
static void test_cli_no_device(void) {
    if (KVT_EMULATED || kvt_gpu_available()) {
        skip(KVT_EMULATED ? "--device gpu without a device: this build emulates the GPU"
                          : "--device gpu without a device: this machine has one");
        return;
    }
    char out[4096];
    int rc = cli_run("--random 64,1,4,4,64,100,64 -n 2 -t 0", out, sizeof(out));
    const char *say = "no CUDA device found: running on the CPU", *again = strstr(out, say);
    expect(rc == 0 && again && !strstr(again + 1, say), "default device without a GPU: falls back, says so once");
    cli_expect("--random 64,1,4,4,64,100,64 -n 2 --device gpu", 0, "--device gpu: no CUDA device found");
}
static void test_cli(void) {
    if (!have_kvt("command-line checks")) return;
    /* make debug writes ./kvt-debug: the kvt that make test (and make bench) run is never the -O0 one */
    cli_expect("--help", 1, "an optimized build");
    cli_expect("--bogus", 0, "unknown flag '--bogus'");
    cli_expect("--random 32,1,4,2,64,50,32 -n 100", 0, "-n 100");
    cli_expect("--random 32,1,4,2,64,50,32 --chunk 0", 0, "--chunk '0'");
    cli_expect("--random 32,1,4,2,64,50,32 --kv-dtype int8 --kv-group 3", 0, "--kv-group 3 must divide");
    cli_expect("--random 32,1,4,2,64,50,32 --temperature -1", 0, "--temperature");
    cli_expect("--random 32,1,4,2,64,50,32 --kv-cache maybe", 0, "expected one of off|on");
    cli_expect("--random 32,1,4,3,64,50,32", 0, "n_kv_heads");
    cli_expect("--model /nonexistent.bin", 0, "cannot open checkpoint");
    cli_expect("--random 32,1,4,2,64,50,32 --chunk 4 --chunks 2 -n 20", 0, "--chunks 2: too small for one sequence");
    cli_expect("--random 32,1,4,2,64,50,32 --prompt-tokens 40", 0, "--prompt-tokens 40: more than TMAX = 32");
    cli_expect("--random 32,1,4,2,64,50,32 --topp 0", 0, "--topp '0': expected a number in [1e-06, 1]");
    cli_expect("--random 32,1,4,2,64,50,32 -n 5 -t 0 --stats", 1, "[stats] chunks in use");
    cli_expect("--random 32,1,4,2,64,50,32 -n 5 -t 0 --plain --stats", 1, "| plain (the file's own ops: no tuned loops; slower)");
    cli_expect("--help", 1, "--plain                 every op through kvtransformer.cu's own version");
    cli_expect("--random 32,1,4,2,64,50,32 --fork 3 -n 5 --stats", 1, "--- sequence 2 (seed 44) ---");
    cli_expect("--random 32,1,4,2,64,50,32 --fork 3 -n 5 --stats --fork-share off", 1, "(0.0% saved)");
    cli_expect("--random 32,1,4,2,64,50,32 --fork 3 -n 5 --chunk 4 --chunks 4", 0, "of the batch cannot grow");
    cli_expect("--random 32,1,4,2,64,50,32 --fork 2 --kv-cache off", 0, "drop --kv-cache off");
}

/* Hostile inputs, one regression check per class: each of these crashed,
 * hung, leaked or printed garbage with exit 0 before. */
static void write_text(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    KVT_ASSERT(f);
    fwrite(text, 1, len, f);
    fclose(f);
}
/* An API user who leaves kv_group at its default (0) gets
 * an engine for any head size, with the group picked by hand-checked rule:
 * 32 if it divides HS, else 16, else HS's largest divisor below 32. The int8
 * logits of one step stay close to fp32's (so the group was really used). */
/* --tokens, --dump-logits, --dump-tokens, and Hugging Face models. */

/* A whole binary file (NULL if it cannot be read); *bytes its size. */
static char *read_all(const char *path, size_t *bytes) {
    char *data = NULL;
    return kvt_read_file(path, "test file", &data, bytes) == KVT_OK ? data : NULL;
}
/* The integers of a text file, one per line or space-separated; returns the count. */
static int read_ints(const char *path, int *out, int cap) {
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && n < cap && fscanf(f, "%d", &out[n]) == 1) n++;
    if (f) fclose(f);
    return n;
}
/* The integer array after "key": [ in a JSON text (a flat list; enough for expected.json). */
static int json_ints(const char *json, const char *key, int *out, int cap) {
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\": [", key);
    const char *p = strstr(json, pat);
    int n = 0;
    if (!p) return 0;
    p += strlen(pat);
    while (n < cap) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        out[n++] = (int)v;
        p = end;
        while (*p == ',' || *p == ' ' || *p == '\n') p++;
    }
    return n;
}
/* "1,22,56": ids as a --tokens value */
static void ids_arg(char *buf, size_t cap, const int *ids, int n) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%d" : "%d", ids[i]);
}
/* Rows of logits, each within tol * (that row's largest |want|) of want. */
static int rows_close(const float *got, const float *want, int rows, int V, double tol, double *worst) {
    int ok = 1;
    *worst = 0.0;
    for (int r = 0; r < rows; r++) {
        double mx = 0.0, err = 0.0;
        for (int v = 0; v < V; v++) {
            mx = fmax(mx, fabs(want[(size_t)r * V + v]));
            err = fmax(err, fabs((double)got[(size_t)r * V + v] - want[(size_t)r * V + v]));
        }
        if (!(err <= tol * mx)) ok = 0; /* NaN fails */
        *worst = fmax(*worst, mx > 0 ? err / mx : err);
    }
    return ok;
}

static int count_of(const char *text, const char *sub) {
    int n = 0;
    size_t k = strlen(sub);
    for (const char *p = text; *p; p++) n += !strncmp(p, sub, k);
    return n;
}
/* --trace on the command line: stdout as without it, the trace on stderr or in
 * a file, one step per forward call (and one for the forks), the totals equal
 * to --stats', every layout; a file that cannot be written is refused. */
static void test_cli_trace(void) {
    if (!have_kvt("--trace on the command line")) return;
    const char *R = "--random 32,1,4,2,64,50,32", *tf = tmp_file("trace.txt");
    const char *runs[] = {"-n 8 -t 0 --chunk 4", "--fork 3 -n 5 --chunk 4 --prompt-tokens 6 -t 0",
                          "--fork 3 -n 5 --chunk 4 --prompt-tokens 6 -t 0 --fork-share off", "-n 5 -t 0 --chunk 32",
                          "-n 5 -t 0 --kv-cache off"};
    /* forward calls each run makes: prefill + 7 steps; prefill, forks, 4 batches; 3 prefills, 4; 1 + 4; none traced */
    int steps[] = {8, 6, 7, 5, 0};
    char args[512], *plain = (char *)kvt_malloc(8192), *traced = (char *)kvt_malloc(8192);
    for (int i = 0; i < 5; i++) {
        snprintf(args, sizeof(args), "%s %s", R, runs[i]);
        int rc1 = cli_run_to(args, 1, plain, 8192);
        snprintf(args, sizeof(args), "%s %s --trace", R, runs[i]);
        int rc2 = cli_run_to(args, 1, traced, 4096); /* its second half holds the run with --trace FILE */
        snprintf(args, sizeof(args), "%s %s --trace %s", R, runs[i], tf);
        int rc3 = cli_run_to(args, 1, traced + 4096, 4096);
        size_t len = 0;
        char *trace = read_all(tf, &len);
        int n_steps = trace ? count_of(trace, "\n== after ") + !strncmp(trace, "== after ", 9) : -1;
        int off = i == 4 && trace && count_of(trace, "kv cache off") == 1 && !strstr(trace, "totals:");
        expect(rc1 == 0 && rc2 == 0 && rc3 == 0 && !strcmp(plain, traced) && !strcmp(plain, traced + 4096) && trace &&
               (i < 4 ? strstr(trace, "legend: ") == trace && n_steps == steps[i] &&
                count_of(trace, "totals: ") == steps[i] : off),
               "cli %s: stdout the same with --trace and --trace FILE; FILE holds %s (%d steps, want %d)", runs[i],
               i < 4 ? "the legend, then one step per forward call" : "one line: the cache is off", n_steps, steps[i]);
        free(trace);
    }
    /* the last trace's totals = --stats' figures */
    char out[4096];
    snprintf(args, sizeof(args), "%s --fork 3 -n 5 --chunk 4 --prompt-tokens 6 -t 0 --stats --trace %s", R, tf);
    int rc = cli_run(args, out, sizeof(out));
    size_t len;
    char *trace = read_all(tf, &len);
    trace_totals t;
    memset(&t, 0, sizeof(t));
    int used = -1;
    double bytes = -1, unshared = -1;
    const char *su = strstr(out, "[stats] chunks in use "), *ss = strstr(out, "% saved)");
    if (su) sscanf(su, "[stats] chunks in use %d", &used);
    while (ss && ss > out && strncmp(ss, "; ", 2)) ss--; /* "; X bytes vs Y without sharing (Z% saved)" */
    if (ss) sscanf(ss, "; %lf bytes vs %lf without sharing", &bytes, &unshared);
    int ok = rc == 0 && trace && trace_totals_of(trace, &t);
    expect(ok && t.used == used && fabs(t.bytes - (unshared - bytes)) < 0.5,
           "cli --fork 3 --stats --trace: the last trace's totals (in use %d, saves %.0f bytes) = --stats' (%d, %.0f)",
           ok ? t.used : -1, ok ? t.bytes : -1, used, unshared - bytes);
    free(trace);
    /* a file that cannot be written; --trace with no value before another flag; runs that are not generation */
    cli_expect("--random 32,1,4,2,64,50,32 -n 2 --trace /nonexistent/dir/trace.txt", 0,
               "--trace: cannot write '/nonexistent/dir/trace.txt': No such file or directory");
    cli_expect("--random 32,1,4,2,64,50,32 --trace -n 2 -t 0 --chunk 4", 1,
               "== after decode step 1: seq 0, position 8");
    cli_expect("--random 32,1,4,2,64,50,32 --bench attention --trace", 0,
               "--trace shows the cache of a generation run");
    /* prefix reuse through --prompts (the default model): the second prompt attaches the first's full chunks */
    write_text(tmp_file("prompts.txt"), "ROMEO: Good morrow\nROMEO: Good night\n", 37);
    snprintf(args, sizeof(args), "--prompts @T/prompts.txt --chunk 4 --chunks 16 -n 1 -t 0 --trace %s", tf);
    rc = cli_run(args, out, sizeof(out));
    trace = read_all(tf, &len);
    expect(rc == 0 && trace && strstr(trace, "seq 1 [ 0*+ 1*+ 2*+ 5 6 (2/4) ] len 18\n") &&
           strstr(trace, "the first 12 found cached (prefix reuse)"),
           "cli --prompts --trace: the second prompt attaches chunks 0-2 by prefix reuse ('+')");
    free(trace);
    remove(tf);
    free(plain);
    free(traced);
}

/* --tokens and the dumps on a llama2.c checkpoint (the default model), against
 * PyTorch's logits for the same ids (weights/testvec.txt, computed by
 * weights/train.py: independent of this program), cache on and off. */
static void test_dump_logits(void) {
    FILE *f = fopen(kvt_bin, "rb"), *tv = fopen("weights/testvec.txt", "r");
    if (!f || !tv) {
        if (f) fclose(f);
        if (tv) fclose(tv);
        skip("--dump-logits vs PyTorch (needs ./kvt and weights/testvec.txt)");
        return;
    }
    fclose(f);
    kvt_model m;
    KVT_ASSERT(kvt_model_load(&m, "weights/model.bin") == KVT_OK);
    int V = m.c.vocab_size, nt = 0, toks[64], steps = 3;
    kvt_model_free(&m);
    KVT_ASSERT(fscanf(tv, "%d", &nt) == 1 && nt > 0 && nt <= 64);
    for (int i = 0; i < nt; i++) KVT_ASSERT(fscanf(tv, "%d", &toks[i]) == 1);
    float *want = (float *)kvt_malloc((size_t)nt * V * 4);
    for (int i = 0; i < nt * V; i++) KVT_ASSERT(fscanf(tv, "%f", &want[i]) == 1);
    fclose(tv);
    char ids[512], args[1024], out[4096], lpath[128], tpath[128];
    snprintf(lpath, sizeof(lpath), "%s", tmp_file("dump.f32"));
    snprintf(tpath, sizeof(tpath), "%s", tmp_file("dump.txt"));
    ids_arg(ids, sizeof(ids), toks, nt);
    float *rows[2] = {NULL, NULL};
    for (int off = 0; off < 2; off++) {
        snprintf(args, sizeof(args), "--tokens %s -n %d -t 0 --kv-cache %s --dump-logits %s --dump-tokens %s", ids,
                 steps, off ? "off" : "on", lpath, tpath);
        int rc = cli_run(args, out, sizeof(out));
        size_t bytes = 0;
        rows[off] = (float *)read_all(lpath, &bytes);
        int fed[80], nf = read_ints(tpath, fed, 80), same = nf == nt + steps;
        for (int i = 0; i < nt && same; i++) same = fed[i] == toks[i];
        double worst = 0.0;
        int ok = rc == 0 && rows[off] && bytes == (size_t)(nt + steps - 1) * V * 4 &&
                 rows_close(rows[off], want, nt, V, KVT_TOL_GPU, &worst);
        expect(ok && same, "--dump-logits, cache %s: %zu bytes = (%d prompt + %d decode rows) x V %d floats; prompt rows "
               "vs PyTorch within %.1e of each row's max |logit| (worst %.2e); --dump-tokens: %d ids fed + 1 chosen",
               off ? "off" : "on", bytes, nt, steps - 1, V, KVT_TOL_GPU, worst, nt + steps - 1);
    }
    if (rows[0] && rows[1]) { /* the decode rows: cache on (one new row) vs off (all recomputed) */
        double worst = 0.0;
        expect(rows_close(rows[0] + (size_t)nt * V, rows[1] + (size_t)nt * V, steps - 1, V, TOL_E2E, &worst),
               "--dump-logits decode rows, cache on vs off: within TOL_E2E = %.0e (worst %.2e)", TOL_E2E, worst);
    }
    free(rows[0]);
    free(rows[1]);
    free(want);
    cli_expect("--tokens 1,22,x -n 1", 0, "--tokens '1,22,x': item 3 is not a token id");
    cli_expect("--tokens 1,22,9999 -n 1", 0, "--tokens: id 9999 (item 3) is out of range [0, 67]");
    cli_expect("--tokens 1,-2 -n 1", 0, "item 2 is not a token id"); /* digits only: no sign */
    cli_expect("--tokens 1,2 -i ROMEO", 0, "--tokens gives the prompt as token ids: drop -i");
    cli_expect("--tokens 1,2 -n 1 --dump-logits /nonexistent-dir/x.f32", 0, "--dump-logits: cannot write "
               "'/nonexistent-dir/x.f32'");
    cli_expect("--fork 2 -n 1 --dump-tokens @T/x.txt", 0, "--dump-logits and --dump-tokens record one sequence");
    remove(lpath);
    remove(tpath);
}

/* The teaching file's size (an aim of the project): kvtransformer.cu under 2,400
 * lines, at least a quarter of them comment lines. A comment line is one
 * inside a block comment, or one whose first non-blank characters open a
 * comment; a line of code with a comment after it counts as code. The tuned
 * CPU and GPU loops and the harness live in cpu/, gpu/, cli/ and bench/ (README, Reading
 * order), so growth here is a choice to look at, not an accident. It is the
 * repository's style check (`make lint`, run by CI), not a test: a student's
 * correct exercise solution may grow the file past the line, and make test
 * must still pass. make test checks only the counter itself. */
static void count_comment_lines(const char *text, int *lines, int *comments) {
    int in_block = 0;
    *lines = *comments = 0;
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '\n'), *s = p;
        if (!end) end = p + strlen(p);
        while (s < end && (*s == ' ' || *s == '\t')) s++;
        int opens = !in_block && end - s >= 2 && s[0] == '/' && s[1] == '*';
        int is_comment = in_block || opens || (end - s >= 2 && s[0] == '/' && s[1] == '/');
        if (opens || in_block) { /* a block comment from s (past its opening): does it close here? */
            const char *c = opens ? s + 2 : s;
            while (c + 1 < end && !(c[0] == '*' && c[1] == '/')) c++;
            in_block = !(c + 1 < end);
        }
        (*lines)++;
        *comments += is_comment;
        p = *end ? end + 1 : end;
    }
}
static void test_comment_counter(void) { /* on a hand-counted text: 5 lines, 3 of them comment lines */
    int tl, tc;
    count_comment_lines("int a; /* code */\n/* one\n * two */\n  // three\nint b;\n", &tl, &tc);
    expect(tl == 5 && tc == 3, "comment-line counter on a 5-line text with 3 comment lines: %d lines, %d comment", tl, tc);
}
static void lint_teaching_file_size(void) {
    size_t n = 0;
    char *cu = read_all("kvtransformer.cu", &n);
    if (!cu) { expect(0, "teaching file: kvtransformer.cu readable from the current directory"); return; }
    int lines, comments;
    count_comment_lines(cu, &lines, &comments);
    expect(lines < 2400 && 4 * comments >= lines, "teaching file: kvtransformer.cu has %d lines (< 2400), %d comment "
           "lines (%.1f%%, >= 25%%)", lines, comments, 100.0 * comments / lines);
    free(cu);
}

/* The map a reader finds the ops by: `grep -n "// §" kvtransformer.cu` lists
 * §1 .. §20 once each, in order (a section whose body moved to cli/ or bench/
 * keeps its banner line in the .cu), the file's opening comment names each
 * one, and README.md's reading order has a row for each. */
#define KVT_SECTIONS 20
static void test_section_map(void) {
    size_t n_cu = 0, n_md = 0;
    char *cu = read_all("kvtransformer.cu", &n_cu), *md = read_all("README.md", &n_md);
    if (!cu || !md) {
        expect(0, "section map: kvtransformer.cu and README.md readable from the current directory");
        free(cu);
        free(md);
        return;
    }
    int order[64], n = 0, banner_ok = 1, readme_ok = 1, missing = 0;
    for (const char *p = cu; (p = strstr(p, "\n// §")) != NULL; p++) /* section banners, at line starts */
        if (n < 64) order[n++] = atoi(p + strlen("\n// §"));
    int in_order = n == KVT_SECTIONS;
    for (int i = 0; i < n && in_order; i++) in_order = order[i] == i + 1;
    const char *banner_end = strstr(cu, "*/"); /* the opening comment */
    const char *rd = strstr(md, "## Reading order"), *rd_end = rd ? strstr(rd + 1, "\n## ") : NULL;
    for (int s = 1; s <= KVT_SECTIONS; s++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "§%d ", s); /* "§1 " is not a prefix of "§12 " */
        const char *b = strstr(cu, tag);
        if (!b || !banner_end || b > banner_end) { banner_ok = 0; missing = s; }
        /* a row of the reading order: "| 15 |", or s in a list "| 8, 13, 14, 7 |" */
        int row = 0;
        for (const char *q = rd; q && q < rd_end && (q = strstr(q, "\n| ")) != NULL && q < rd_end; q++) {
            const char *c = q + 3, *cell_end = strchr(c, '|');
            while (cell_end && c < cell_end) {
                char *next;
                long v = strtol(c, &next, 10);
                if (next == c) break;
                row |= v == s;
                c = next;
                while (c < cell_end && (*c == ',' || *c == ' ')) c++;
            }
        }
        if (!row) { readme_ok = 0; missing = s; }
    }
    expect(in_order, "section map: kvtransformer.cu has the banner lines §1 .. §%d once each, in order (found %d)",
           KVT_SECTIONS, n);
    char miss[32] = "none";
    if (missing) snprintf(miss, sizeof(miss), "§%d", missing);
    expect(banner_ok && readme_ok, "section map: the file's opening comment and README.md's reading order name "
           "every section (missing: %s)", miss);
    free(cu);
    free(md);
}

/* weights/hf-tiny (made by weights/make_hf_fixture.py with transformers):
 * export it with weights/export_hf.py, run kvt on transformers' greedy
 * sequence with the cache on and off, and compare every position's logits
 * and every chosen token; encode a sample text and compare the ids with
 * transformers' tokenizer. Then the exporter must refuse what the format
 * cannot hold, naming the field. */
static void test_hf_export(void) {
    size_t jb = 0, lb = 0;
    char *json = read_all("weights/hf-tiny/expected.json", &jb);
    FILE *f = fopen(kvt_bin, "rb");
    if (f) fclose(f);
    if (!json || !f || system("python3 -c 'import json, struct' > /dev/null 2>&1") != 0) {
        free(json);
        skip("Hugging Face export (needs ./kvt, python3 and weights/hf-tiny)");
        return;
    }
    int prompt[64], greedy[128], sample[256];
    int np = json_ints(json, "prompt", prompt, 64), ng = json_ints(json, "greedy", greedy, 128);
    int ns = json_ints(json, "sample_ids", sample, 256);
    const char *vs = strstr(json, "\"vocab_size\": ");
    int V = vs ? atoi(vs + 14) : 0;
    char *sample_text = NULL, *st = strstr(json, "\"sample_text\": \"");
    if (st) {
        st += 16;
        sample_text = strndup(st, (size_t)(strchr(st, '"') - st));
    }
    float *want = (float *)read_all("weights/hf-tiny/logits.f32", &lb);
    KVT_ASSERT(np > 0 && ng > np && ns > 0 && V > 258 && sample_text && want &&
               lb == (size_t)(ng - 1) * V * 4);
    char dir[64], cmd[1024], args[2048], ids[512], out[4096]; /* test_dir + "/hf": under 64 */
    snprintf(dir, sizeof(dir), "%s", tmp_file("hf"));
    snprintf(cmd, sizeof(cmd), "mkdir -p %s && python3 weights/export_hf.py weights/hf-tiny %s/model.bin "
             "%s/tokenizer.bin > %s/export.log 2>&1", dir, dir, dir, dir);
    int ok = system(cmd) == 0;
    expect(ok, "weights/export_hf.py exports weights/hf-tiny (bf16, 2 shards, GQA, untied, byte-fallback BPE)");
    ids_arg(ids, sizeof(ids), prompt, np);
    for (int off = 0; off < 2 && ok; off++) {
        snprintf(args, sizeof(args), "-m %s/model.bin -z %s/tokenizer.bin --tokens %s -n %d -t 0 --kv-cache %s "
                 "--dump-logits %s/l.f32 --dump-tokens %s/t.txt", dir, dir, ids, ng - np, off ? "off" : "on", dir, dir);
        int rc = cli_run(args, out, sizeof(out));
        char path[128];
        snprintf(path, sizeof(path), "%s/l.f32", dir);
        size_t bytes = 0;
        float *got = (float *)read_all(path, &bytes);
        snprintf(path, sizeof(path), "%s/t.txt", dir);
        int fed[160], nf = read_ints(path, fed, 160), same = nf == ng;
        for (int i = 0; i < ng && same; i++) same = fed[i] == greedy[i];
        double worst = 0.0;
        int close = rc == 0 && got && bytes == lb && rows_close(got, want, ng - 1, V, 1e-4, &worst);
        expect(close && same, "HF model, cache %s: %d positions' logits within 1e-4 of each position's max |logit| "
               "of transformers' (worst %.2e); greedy tokens equal transformers' (%d)", off ? "off" : "on", ng - 1,
               worst, ng - np);
        free(got);
    }
    if (ok) { /* the tokenizer: kvt's encoding of the sample = transformers' */
        snprintf(args, sizeof(args), "-m %s/model.bin -z %s/tokenizer.bin -i '%s' -n 1 -t 0 --dump-tokens %s/s.txt",
                 dir, dir, sample_text, dir);
        int rc = cli_run(args, out, sizeof(out));
        char path[128];
        snprintf(path, sizeof(path), "%s/s.txt", dir);
        int got[300], n = read_ints(path, got, 300), same = rc == 0 && n == ns + 1;
        for (int i = 0; i < ns && same; i++) same = got[i] == sample[i];
        expect(same, "HF tokenizer: '%s' encodes to transformers' %d ids (byte fallback for the characters the "
               "vocabulary lacks)", sample_text, ns);
    }
    /* refusals: a copy of the fixture with one field changed */
    const char *bad[][3] = {
        {"config.json", "c['rope_theta'] = 0.5", "rope_theta"}, /* any other base > 1: the RoPE extension */
        {"config.json", "c['rms_norm_eps'] = 1e-6", "rms_norm_eps"},
        {"config.json", "c['rope_scaling'] = {'type': 'linear', 'factor': 2.0}", "rope_scaling"},
        {"config.json", "c['hidden_act'] = 'gelu'", "hidden_act"},
        {"config.json", "c['attention_bias'] = True", "attention_bias"},
        {"tokenizer.json", "c['model']['byte_fallback'] = False", "byte_fallback"},
    };
    for (int i = 0; i < 6 && ok; i++) {
        snprintf(cmd, sizeof(cmd), "rm -rf %s/bad && cp -r weights/hf-tiny %s/bad && python3 -c \"import json; "
                 "p = '%s/bad/%s'; c = json.load(open(p)); %s; json.dump(c, open(p, 'w'))\" && "
                 "python3 weights/export_hf.py %s/bad %s/bad.bin %s/bad_tok.bin > %s/bad.log 2>&1",
                 dir, dir, dir, bad[i][0], bad[i][1], dir, dir, dir, dir);
        int rc = system(cmd);
        snprintf(cmd, sizeof(cmd), "%s/bad.log", dir);
        size_t n = 0;
        char *log = read_all(cmd, &n);
        expect(rc != 0 && log && contains(log, bad[i][2]) && !contains(log, "Traceback"),
               "export_hf.py refuses %s (%s): '%.120s'", bad[i][0], bad[i][1], log ? strtok(log, "\n") : "");
        free(log);
    }
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) printf("    (could not remove %s)\n", dir);
    free(sample_text);
    free(want);
    free(json);
}

/* Run a Python checker: its FAIL lines and tracebacks are shown, its last
 * other line is kept in last (the summary); the exit status is returned. */
static int run_py_check(const char *cmd, char *last, size_t cap) {
    char line[1024];
    snprintf(last, cap, "(no output)");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    while (fgets(line, sizeof(line), p)) {
        if (!strncmp(line, "PASS ", 5)) continue;
        line[strcspn(line, "\n")] = '\0';
        if (line[0]) snprintf(last, cap, "%s", line);
        if (strncmp(line, "FAIL ", 5) == 0 || contains(line, "Traceback")) printf("    %s\n", line);
    }
    return pclose(p);
}
/* weights/check_export_hf.py: the exporter's refusals (bad outputs, kvt's
 * limits, malformed or self-contradicting folders) are one line each and
 * leave nothing behind; it builds its own folder, exports it and runs kvt on
 * the result. Passed only when the script exits 0; its FAIL lines are shown. */
static void test_hf_export_refusals(void) {
    if (system("command -v python3 > /dev/null 2>&1") != 0) {
        skip("weights/check_export_hf.py (needs python3)");
        return;
    }
    FILE *k = fopen(kvt_bin, "rb");
    if (k) fclose(k);
    char cmd[1024], last[1024];
    snprintf(cmd, sizeof(cmd), "python3 weights/check_export_hf.py %s%s%s 2>&1", k ? "'" : "", k ? kvt_bin : "",
             k ? "'" : "");
    int rc = run_py_check(cmd, last, sizeof(last));
    expect(rc == 0, "weights/check_export_hf.py %s: the exporter refuses bad input with one line, all or nothing "
           "(%s)", k ? kvt_bin : "(no kvt binary: export checks only)", last);
}

/* weights/check_export_gguf.py: the GGUF exporter's dequantization (blocks
 * computed by hand), its outputs read back field by field (the RoPE extension,
 * the BBPE trailer) and its refusals (one line each, nothing left behind), on
 * small GGUF files it writes itself. Passed only when the script exits 0; its
 * FAIL lines are shown. */
static void test_gguf_export(void) {
    if (system("command -v python3 > /dev/null 2>&1") != 0) {
        skip("weights/check_export_gguf.py (needs python3)");
        return;
    }
    char last[1024];
    int rc = run_py_check("python3 weights/check_export_gguf.py 2>&1", last, sizeof(last));
    expect(rc == 0, "weights/check_export_gguf.py: GGUF dequantization, the checkpoint and tokenizer bytes, refusals "
           "with one line, all or nothing (%s)", last);
}

static void test_kv_group_default(void) {
    struct { int HS, G; } want[] = {{16, 16}, {40, 20}, {48, 16}, {64, 32}, {8, 8}};
    for (int i = 0; i < 5; i++) {
        kvt_model m;
        KVT_ASSERT(kvt_model_random(&m, cfg(2 * want[i].HS, 1, 2, 1, 64, 50, 32), 3) == KVT_OK);
        kvt_options o;
        kvt_options_default(&o);
        o.device = KVT_CPU;
        float lg[2][50];
        int toks[4] = {1, 7, 22, 9}, G = -1, ok = 1;
        for (int dt = 0; dt < 2 && ok; dt++) {
            o.kv_dtype = dt ? KVT_INT8 : KVT_FP32;
            kvt_engine *e;
            kvt_seq sq;
            ok = kvt_engine_create(&e, &m, &o) == KVT_OK;
            if (!ok) break;
            if (dt) G = e->pool.G;
            kvt_seq_init(e, &sq);
            ok = kvt_forward(e, &sq, toks, 4, lg[dt], 0) == KVT_OK;
            kvt_seq_free(e, &sq);
            kvt_engine_free(e);
        }
        double err = 0.0, top = 0.0;
        for (int v = 0; ok && v < 50; v++) {
            err = fmax(err, fabs(lg[1][v] - lg[0][v]));
            top = fmax(top, fabs(lg[0][v]));
        }
        expect(ok && G == want[i].G && err <= 0.05 * top,
               "engine with kv_group left at 0, HS %d: int8 group %d (want %d), logits within %.3g of fp32's (max %.3g)%s%s",
               want[i].HS, G, want[i].G, err, top, ok ? "" : ": ", ok ? "" : kvt_last_error());
        kvt_model_free(&m);
    }
}
static void test_hardening(void) {
    if (!have_kvt("hardening checks of the command line")) return;
    const char *R = "--random 32,1,4,2,64,50,32";
    char args[512], out[4096], out2[4096];
    /* a checkpoint with the default tokenizer's V = 68, TMAX 1 (item 1) and one with a NaN weight (item 7) */
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(16, 1, 2, 2, 32, 68, 1), 3) == KVT_OK);
    KVT_ASSERT(write_checkpoint(tmp_file("t1.bin"), &m, 0, 0));
    kvt_model_free(&m);
    KVT_ASSERT(kvt_model_random(&m, cfg(16, 1, 2, 2, 32, 68, 32), 3) == KVT_OK);
    m.w.rms_final[0] = NAN; /* every logit is then NaN */
    KVT_ASSERT(write_checkpoint(tmp_file("nan.bin"), &m, 0, 0));
    kvt_model_free(&m);
    const char *ppl_text = "ROMEO:\nWhat light\nthrough yonder window\n";
    write_text(tmp_file("ppl.txt"), ppl_text, strlen(ppl_text));
    write_text(tmp_file("empty.txt"), "", 0);

    /* 1. --ppl on TMAX 1: a window of 0 tokens (memcpy of -4 bytes, an endless loop) */
    cli_expect("-m @T/t1.bin --chunk 1 --ppl @T/ppl.txt", 0, "--ppl needs TMAX >= 2");
    /* 4, 11. --random is parsed strictly: no wrap, no garbage, no 8th field */
    cli_expect("--random 64,2,4,2,128,-2147483648,64", 0, "field 6 (V) is out of range");
    cli_expect("--random 64,2,4,2,128,2147483648,64", 0, "field 6 (V) is out of range");
    cli_expect("--random 4294967360,2,4,2,128,50,64", 0, "field 1 (D) is out of range");
    cli_expect("--random 32,1,4,2,64,50,64abc", 0, "field 7 (TMAX) is not an integer");
    cli_expect("--random 32,1,4,2,64,50,64,99,1", 0, "more than 7 fields");
    cli_expect("--random 32,1,4,2,64,50", 0, "only 6 fields");
    cli_expect("--random ' 32,1,4,2,64,50,32'", 0, "field 1 (D) is not an integer");
    /* One number syntax for every numeric flag: decimal, no space, no hex, no underflow to 0 */
    cli_expect("--random 32,1,4,2,64,50,32 -n ' 5'", 0, "-n ' 5': expected an integer");
    cli_expect("--random 32,1,4,2,64,50,32 -n 0x10", 0, "-n '0x10': expected an integer");
    cli_expect("--random 32,1,4,2,64,50,32 -t 0x10", 0, "-t '0x10': expected a number");
    cli_expect("--random 32,1,4,2,64,50,32 -t 1e-400", 0, "-t '1e-400': expected a number in [0, 100] (out of a double");
    cli_expect("--random 32,1,4,2,64,50,32 -t ' 1'", 0, "-t ' 1': expected a number");
    cli_expect("--random 32,1,4,2,64,50,32 -n 2 -t 1.5e-1", 1, "");
    /* A message quotes a byte of the input escaped: no raw ESC or 0xff reaches the terminal */
    cli_expect("-n \"$(printf '\\033[2J')\"", 0, "-n '\\x1b[2J': expected an integer");
    cli_expect("-n 2 -i \"$(printf 'a\\377b')\"", 0, "character '\\xff' (byte 0xff at offset 1)");
    /* 7. NaN weights: an error naming the step, not "zzzz" and exit 0 */
    cli_expect("-m @T/nan.bin -n 5", 0, "step 0 (position 6): logit 0 is nan");
    cli_expect("-m @T/nan.bin -n 5 -t 0 --fork 2", 0, "step 0, sequence 0: logit 0 is nan");
    cli_expect("-m @T/nan.bin --ppl @T/ppl.txt", 0, "the logits at token 0 are not finite");
    /* 8. a tiny temperature is greedy: the same text as -t 0, not the last id */
    snprintf(args, sizeof(args), "%s -n 20 -t 1e-40", R);
    int rc1 = cli_run(args, out, sizeof(out));
    snprintf(args, sizeof(args), "%s -n 20 -t 0", R);
    int rc2 = cli_run(args, out2, sizeof(out2));
    expect(rc1 == 0 && rc2 == 0 && !strcmp(out, out2), "cli -t 1e-40 generates what -t 0 does: '%.40s...'", out);
    {   /* the sampler itself: (logit - max) / T cannot overflow, however small T is */
        kvt_sampler sm;
        float lg[3] = {3e34f, 0.0f, -1.0f};
        kvt_sampler_init(&sm, 3, 1e-5f, 1.0f, 7);
        int id = kvt_sample(&sm, lg, 3);
        kvt_sampler_free(&sm);
        expect(id == 0, "sampler: T = 1e-5 with logits up to 3e34 draws the largest (got %d; logits / T overflowed to "
               "inf - inf = NaN before)", id);
    }
    /* 9. --ppl input that holds no text, or cannot be read as a file */
    cli_expect("--ppl /dev/null", 0, "no text to score (0 tokens)");
    cli_expect("--ppl @T/empty.txt", 0, "no text to score (0 tokens)");
    cli_expect("--ppl @T/ppl.txt --ppl-from 1", 0, "from --ppl-from: no text to score");
    cli_expect("--ppl /tmp", 0, "it is a directory");
    rc1 = cli_run("--ppl @T/ppl.txt", out, sizeof(out));
    rc2 = cli_run("--ppl /dev/stdin < @T/ppl.txt", out2, sizeof(out2)); /* a pipe: no size known */
    const char *a1 = strstr(out, "tokens, mean NLL"), *a2 = strstr(out2, "tokens, mean NLL");
    expect(rc1 == 0 && rc2 == 0 && a1 && a2 && !strcmp(a1, a2), "--ppl from a pipe (/dev/stdin) = from the file: '%s'",
           a2 ? a2 : out2);
    write_text(tmp_file("ppl2.txt"), "ROMEO:\nWhat light \x01 here\n", 26);
    cli_expect("--ppl @T/ppl2.txt", 0, "--ppl '@T/ppl2.txt' line 2: text: character");
    /* 10. --prompts: file line numbers, whole lines of any length, NUL refused */
    {
        size_t big = 9000;
        char *text = (char *)kvt_malloc(big + 64);
        int k = sprintf(text, "\nROMEO:\n");
        memset(text + k, 'a', big);
        text[k + big] = '\n';
        write_text(tmp_file("prompts.txt"), text, (size_t)k + big + 1);
        cli_expect("--prompts @T/prompts.txt -n 1", 0, "--prompts '@T/prompts.txt' line 3: longer than 4160 bytes, "
                   "more than the context can hold"); /* 8 bytes a token at most, 512 tokens: refused unread */
        text[k + 600] = '\n';
        write_text(tmp_file("prompts.txt"), text, (size_t)k + 601);
        cli_expect("--prompts @T/prompts.txt -n 1", 0, "line 3: the text is");
        write_text(tmp_file("prompts.txt"), "ROMEO:\nJU\0LIET:\n", 15);
        cli_expect("--prompts @T/prompts.txt -n 1", 0, "line 2: a NUL byte");
        /* line ends: CRLF is one end of line; a lone CR is part of the line (no piece for
         * byte 0x0d in this vocabulary: refused, where cutting the line there ran "ROMEO: hi") */
        write_text(tmp_file("prompts.txt"), "ROMEO: hi\r\n", 11);
        write_text(tmp_file("prompts_lf.txt"), "ROMEO: hi\n", 10);
        char crlf[4096], lf[4096];
        int rc_crlf = cli_run("--prompts @T/prompts.txt -n 3 -t 0", crlf, sizeof(crlf));
        int rc_lf = cli_run("--prompts @T/prompts_lf.txt -n 3 -t 0", lf, sizeof(lf));
        expect(rc_crlf == 0 && rc_lf == 0 && !strcmp(crlf, lf) && contains(lf, "ROMEO: hi"),
               "--prompts: a CRLF line = the same line with LF");
        write_text(tmp_file("prompts.txt"), "ROMEO: hi\rthere\n", 16);
        cli_expect("--prompts @T/prompts.txt -n 1", 0, "line 1: text: character");
        cli_expect("--chat -n 1 < @T/prompts.txt", 0, "byte 0x0d at offset 9");
        cli_expect("--chat -n 2 -t 0 < @T/prompts_lf.txt", 1, "");
        write_text(tmp_file("prompts.txt"), "ROMEO:\n\nJULIET:\n", 16);
        cli_expect("--prompts @T/prompts.txt -n 2 -t 0", 1, "--- sequence 1 (seed 43) ---\nJULIET:");
        FILE *f = fopen(tmp_file("prompts.txt"), "wb");
        KVT_ASSERT(f);
        for (int i = 0; i < 4097; i++) fputs("a\n", f);
        fclose(f);
        cli_expect("--prompts @T/prompts.txt -n 1", 0, "line 4097: more than 4096 prompts");
        free(text);
    }
    /* 12. defaults fitted to small models: no complaint about flags never given */
    cli_expect("--random 32,1,2,2,64,50,4 -n 1 -t 0", 1, "1 ");
    cli_expect("--random 32,1,2,2,64,50,1 -n 0", 1, "1 ");
    /* 12b. a thread count no machine could run (a stack each: 100,000 overflowed in the
     * first parallel loop) is refused up front; a few more than the cores still run */
    {
        const char *old = getenv("OMP_NUM_THREADS");
        char keep[64];
        snprintf(keep, sizeof(keep), "%s", old ? old : "");
        setenv("OMP_NUM_THREADS", "100000", 1);
        cli_expect("-n 2", 0, "OMP_NUM_THREADS asks for 100000 threads: at most 8 a core");
        setenv("OMP_NUM_THREADS", "3", 1);
        cli_expect("--random 32,1,2,2,64,50,16 -n 2 -t 0", 1, "");
        if (old) setenv("OMP_NUM_THREADS", keep, 1);
        else unsetenv("OMP_NUM_THREADS");
    }
    /* 13. messages that say what is wrong */
    cli_expect("-m /tmp", 0, "cannot read checkpoint '/tmp': it is a directory");
    cli_expect("-m /nonexistent/x.bin", 0, "No such file or directory");
    cli_expect("-z /tmp", 0, "cannot read tokenizer '/tmp': it is a directory");
    cli_expect("--random 32,1,4,2,64,50,32 --bench attention --csv /nonexistent/x.csv", 0,
               "--csv: cannot write '/nonexistent/x.csv': No such file or directory");
    KVT_ASSERT(kvt_model_random(&m, cfg(16, 1, 2, 2, 32, 1, 8), 3) == KVT_OK);
    KVT_ASSERT(write_checkpoint(tmp_file("v1.bin"), &m, 0, 0));
    kvt_model_free(&m);
    cli_expect("-m @T/v1.bin", 0, "vocab_size 1; with a tokenizer the ids BOS = 1 and EOS = 2 need");
    /* 14. combinations that silently ignored a flag */
    cli_expect("--fork 2 --prompts @T/ppl.txt", 0, "--fork continues one prompt and --prompts");
    cli_expect("-i hello --prompts @T/ppl.txt", 0, "-i/--prompt and --prompts both");
    cli_expect("--ppl @T/ppl.txt --prompts @T/ppl.txt", 0, "--ppl scores a file");
    cli_expect("--ppl @T/ppl.txt --fork 2", 0, "--ppl scores a file");
    cli_expect("--prompt-tokens 5", 0, "--prompt-tokens is for --random models");
    const char *with_random[][2] = { /* flags after R, and what the refusal says */
        {"--csv @T/x.csv", "--csv writes the table of a --bench run"},
        {"--kv-group 8", "--kv-group sets the channels per scale of an int8 cache"},
        {"--attn naive --split 8", "--split divides the fused attention"},
        {"-i hello", "-i needs a tokenizer"},
        {"--bench decode --fork 2", "--bench is a run of its own"},
        {"--bench-every 4", "need --bench"},
        {"--fork-share off", "--fork-share needs --fork N"},
        /* 15. cache off needs the chunks too: refused before the run, not at step 17 */
        {"--kv-cache off --chunks 1 -n 20", "--chunks 1: too small for one sequence of 28 positions"},
    };
    for (size_t i = 0; i < sizeof(with_random) / sizeof(with_random[0]); i++) {
        snprintf(args, sizeof(args), "%s %s", R, with_random[i][0]);
        cli_expect(args, 0, with_random[i][1]);
    }
    /* the file helpers themselves */
    char *text;
    size_t len;
    kvt_status st = kvt_read_file(tmp_file("ppl.txt"), "test file", &text, &len);
    expect(st == KVT_OK && len == strlen(ppl_text) && !strcmp(text, ppl_text),
           "kvt_read_file: a whole file, NUL-terminated (%zu bytes)", len);
    if (st == KVT_OK) free(text);
    float bad[4] = {1.0f, 2.0f, INFINITY, NAN};
    expect(kvt_first_nonfinite(bad, 2) == -1 && kvt_first_nonfinite(bad, 4) == 2 && kvt_first_nonfinite(bad + 3, 1) == 0,
           "kvt_first_nonfinite finds Inf and NaN, and nothing in finite values");
}

/* Outputs and inputs: no output may overwrite an input or share a file with
 * another output, every failed write is an error that names the file, and a
 * few input rules (KVT_MEM_LIMIT, --tokens, UTF-8 text, the default pool
 * under --fork, -n 0 with --dump-logits, where --check writes, an error seen by
 * several threads). Each check here failed before the rule was put in. */
static void write_bpe_tokenizer(const char *p); /* (below, with the tokenizer's tests) */
static int file_is(const char *path, const char *want_path) { /* the same bytes in both files */
    size_t n1 = 0, n2 = 0;
    char *a = read_all(path, &n1), *b = read_all(want_path, &n2);
    int same = a && b && n1 == n2 && !memcmp(a, b, n1);
    free(a);
    free(b);
    return same;
}
static void test_outputs(void) {
    if (!have_kvt("output checks of the command line")) return;
    char args[1024], out[4096], out2[4096];
    /* copies of the default model and tokenizer, and a hard link to the model */
    size_t nm = 0, nt = 0;
    char *mb = read_all("weights/model.bin", &nm), *tb = read_all("weights/tokenizer.bin", &nt);
    KVT_ASSERT(mb && tb);
    write_text(tmp_file("m.bin"), mb, nm);
    write_text(tmp_file("tok.bin"), tb, nt);
    free(mb);
    free(tb);
    unlink(tmp_file("link.bin"));
    KVT_ASSERT(link(tmp_file("m.bin"), tmp_file("link.bin")) == 0);
    write_text(tmp_file("prompts.txt"), "ROMEO:\nJULIET:\n", 15);
    write_text(tmp_file("corpus.txt"), "ROMEO:\nWhat light\n", 18);
    /* 1. an output that is an input: refused, the input unchanged (the paths differ as strings) */
    const char *same_in[][2] = {
        {"-m @T/m.bin --dump-logits @T/./m.bin -n 3", "--dump-logits '@T/./m.bin' is the same file as the input -m"},
        {"-m @T/m.bin --dump-tokens @T/link.bin -n 3", "--dump-tokens '@T/link.bin' is the same file as the input -m"},
        {"-z @T/tok.bin --trace @T/../$(basename @T)/tok.bin -n 3", "is the same file as the input -z '@T/tok.bin'"},
        {"--prompts @T/prompts.txt --trace @T/prompts.txt -n 2", "--trace '@T/prompts.txt' is the same file as the "
         "input --prompts"},
        {"--ppl @T/corpus.txt --dump-logits @T/corpus.txt", "is the same file as the input --ppl"},
        {"--bench decode --csv @T/m.bin -m @T/m.bin", "--csv '@T/m.bin' is the same file as the input -m"},
    };
    for (size_t i = 0; i < sizeof(same_in) / sizeof(same_in[0]); i++) cli_expect(same_in[i][0], 0, same_in[i][1]);
    expect(file_is(tmp_file("m.bin"), "weights/model.bin") && file_is(tmp_file("tok.bin"), "weights/tokenizer.bin") &&
           file_is(tmp_file("link.bin"), "weights/model.bin"), "an output named like an input left the inputs as they were");
    /* 2. two outputs on one file, existing or not */
    unlink(tmp_file("x"));
    cli_expect("--dump-logits @T/x --dump-tokens @T/./x -n 3", 0, "--dump-logits '@T/x' and --dump-tokens '@T/./x' "
               "are the same file");
    cli_expect("--trace @T/y --dump-logits @T/y -n 3", 0, "--dump-logits '@T/y' and --trace '@T/y' are the same file");
    expect(access(tmp_file("x"), F_OK) != 0 && access(tmp_file("y"), F_OK) != 0, "refused outputs were not created");
    cli_expect("--dump-logits /dev/null --dump-tokens /dev/null -n 2", 1, ""); /* a device: nothing to clobber */
    /* 3. stdin and stdout are files too: `< t` is an input, `> t` and `>> t` an output, the input unchanged */
    write_text(tmp_file("t"), "ROMEO:\nJULIET:\n", 15);
    write_text(tmp_file("t.orig"), "ROMEO:\nJULIET:\n", 15);
    const char *std_same[][2] = {
        {"--chat -n 4 --dump-tokens @T/t < @T/t", "--dump-tokens '@T/t' is the same file as the input stdin"},
        {"--chat -n 4 --dump-logits @T/./t < @T/t", "--dump-logits '@T/./t' is the same file as the input stdin"},
        {"--chat -n 4 --dump-attn @T/t < @T/t", "--dump-attn '@T/t' is the same file as the input stdin"},
        {"--chat -n 4 --trace @T/t < @T/t", "--trace '@T/t' is the same file as the input stdin"},
        {"--prompts /dev/stdin --dump-tokens @T/t < @T/t", "is the same file as the input stdin"},
        {"--chat -n 4 2>&1 >> @T/t < @T/t; exit $?", "stdout (redirected with > or >>) is the same file as the input stdin"},
        {"-n 2 -m @T/m.bin 2>&1 >> @T/m.bin; exit $?", "stdout (redirected with > or >>) is the same file as the input -m"},
    };
    for (size_t i = 0; i < sizeof(std_same) / sizeof(std_same[0]); i++) cli_expect(std_same[i][0], 0, std_same[i][1]);
    expect(file_is(tmp_file("m.bin"), "weights/model.bin") && file_is(tmp_file("t"), tmp_file("t.orig")),
           "an output on stdin's or stdout's file left the input as it was");
    cli_expect("-n 30 --dump-tokens @T/o.txt 2>&1 > @T/o.txt; exit $?", 0,
               "--dump-tokens '@T/o.txt' and stdout (redirected with > or >>) are the same file");
    cli_expect("-n 3 --dump-tokens @T/o2.txt < @T/t > @T/o3.txt", 1, ""); /* different files: fine */
    cli_expect("-n 3 --dump-tokens @T/o2.txt < /dev/null | cat", 1, "");   /* a device, a pipe: exempt */
    /* 4. a write that fails is an error naming the file and the reason */
    cli_expect("--trace /dev/full -n 3", 0, "--trace: writing '/dev/full' failed: No space left on device");
    cli_expect("--trace /dev/full -n 3 --fork 2", 0, "--trace: writing '/dev/full' failed: No space left on device");
    cli_expect("--dump-logits /dev/full -n 3", 0, "--dump-logits: writing '/dev/full' failed: No space left");
    cli_expect("--dump-tokens /dev/full -n 3", 0, "--dump-tokens: writing '/dev/full' failed: No space left");
    cli_expect("--random 32,1,4,2,64,50,32 --bench matmul --csv /dev/full", 0, "--csv: writing '/dev/full' failed");
    /* (stderr first to the pipe cli_run reads, then stdout elsewhere) */
    cli_expect("-n 3 2>&1 > /dev/full; exit $?", 0, "writing standard output failed: No space left on device");
    cli_expect("--help 2>&1 > /dev/full; exit $?", 0, "writing standard output failed");
    cli_expect("-n 3 2>&1 >&-; exit $?", 0, "standard output is closed");
    /* the runs stop at the first failed write (the dump of token ids, written
     * on the way out, shows how far they got: the prompt's 7 ids and a few) */
    cli_expect("-n 400 -t 0 --dump-attn /dev/full --dump-tokens @T/stop1.txt 2>&1 > /dev/null; exit $?", 0,
               "--dump-attn: writing '/dev/full' failed: No space left on device");
    cli_expect("-n 400 -t 0 --dump-tokens @T/stop2.txt 2>&1 > /dev/full; exit $?", 0,
               "writing standard output failed: No space left on device");
    const char *turns = "ROMEO: Good morrow\nJULIET: Good night\nROMEO: Farewell\n";
    write_text(tmp_file("turns.txt"), turns, strlen(turns));
    cli_expect("--chat -n 400 -t 0 --dump-tokens @T/stop3.txt 2>&1 > /dev/full < @T/turns.txt; exit $?", 0,
               "writing standard output failed: No space left on device");
    /* a reader that leaves (| head): a write error with its reason, and the dumps are kept */
    cli_expect("-n 400 -t 0 --dump-tokens @T/stop4.txt --dump-logits @T/stop4.bin 2> @T/stop4.err | head -c 6", 1, "");
    const char *stops[] = {"stop1", "stop2", "stop3", "stop4"};
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof(args), "n=$(wc -l < '%s/%s.txt') && test $n -ge 7 && test $n -lt 100", test_dir, stops[i]);
        expect(system(args) == 0, "%s: the run stopped within a few tokens of 400, and --dump-tokens, written on the "
               "way out, holds them (%s/%s.txt)", stops[i], test_dir, stops[i]);
    }
    snprintf(args, sizeof(args), "test $(stat -c %%s '%s/stop4.bin') -gt 0 && "
             "grep -q 'writing standard output failed: Broken pipe' '%s/stop4.err'", test_dir, test_dir);
    expect(system(args) == 0, "a reader that left: the reason on stderr, and --dump-logits kept");
    /* -n 0 --dump-attn runs the prompt, as -n 0 --dump-logits does: 1 layer x 4 heads x (1 + 2 + ... + 5) = 60
     * weights under the header */
    cli_expect("--random 32,1,4,2,64,50,32 --prompt-tokens 5 -n 0 --dump-attn @T/attn0.csv", 1, "");
    snprintf(args, sizeof(args), "test $(wc -l < '%s/attn0.csv') = 61", test_dir);
    expect(system(args) == 0, "-n 0 --dump-attn writes the prompt's 60 weights");
    /* its size is planned before anything is opened: 4 layers x 4 heads x 3008 x 3009 / 2 = 7.24e7 lines of about
     * 2 x 4 + 18 bytes */
    cli_expect("--random 64,4,4,4,128,100,4096 -n 3000 --dump-attn @T/big.csv --trace @T/big.trace", 0,
               "--dump-attn: up to 7.24e+07 lines, about 1883 MB (4 layers x 4 heads x N (N + 1) / 2 weights, "
               "N = 3008 positions), more than --dump-attn-max 1024 MB: raise it");
    snprintf(args, sizeof(args), "test ! -e '%s/big.csv' && test ! -e '%s/big.trace'", test_dir, test_dir);
    expect(system(args) == 0, "a --dump-attn refused for its size opened no file");
    cli_expect("--random 32,1,4,2,64,50,512 -n 400 --dump-attn @T/mid.csv --dump-attn-max 7", 0,
               "about 8 MB (1 layer x 4 heads x N (N + 1) / 2 weights, N = 408 positions)");
    cli_expect("--random 32,1,4,2,64,50,512 -n 400 -t 0 --dump-attn @T/mid.csv --dump-attn-max 9 --dump-attn-layer 0",
               1, "");
    cli_expect("-n 2 --dump-attn-max 5", 0, "--dump-attn-layer and --dump-attn-max shape --dump-attn");
    /* 5. KVT_MEM_LIMIT must be a whole number of bytes */
    const char *limits[] = {"1e3", "abc", "-1000", "0", "18446744073709551616", " 5"};
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        setenv("KVT_MEM_LIMIT", limits[i], 1);
        snprintf(out2, sizeof(out2), "KVT_MEM_LIMIT '%s': expected a whole number of bytes", limits[i]);
        cli_expect("-n 2", 0, out2);
    }
    setenv("KVT_MEM_LIMIT", "1000", 1);
    cli_expect("-n 2", 0, "not enough host memory"); /* a good value still limits */
    unsetenv("KVT_MEM_LIMIT");
    /* 7. UTF-8 text is printed: byte-fallback pieces of "é" (C3 A9); a lone control byte (07) is not */
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(16, 1, 2, 2, 32, 3 + 256 + 5, 16), 5) == KVT_OK);
    KVT_ASSERT(write_checkpoint(tmp_file("bytes.bin"), &m, 0, 0));
    kvt_model_free(&m);
    write_bpe_tokenizer(tmp_file("bytes_tok.bin"));
    snprintf(args, sizeof(args), "-m @T/bytes.bin -z @T/bytes_tok.bin --tokens 1,%d,%d,%d,%d -n 0", 3 + 'x',
             3 + 0xC3, 3 + 0xA9, 3 + 0x07);
    int rc = cli_run_to(args, 1, out, sizeof(out));
    expect(rc == 0 && !strcmp(out, "x\xc3\xa9\n"), "cli prints UTF-8 bytes of byte-fallback pieces and skips a lone "
           "control byte: '%s' (want 'x\xc3\xa9')", out);
    /* 8. the default pool holds what --fork needs when the sequence fits in one chunk */
    cli_expect("--chunk 512 --fork 3 -n 5 -t 0", 1, "--- sequence 2 (seed 44) ---");
    cli_expect("--random 64,2,4,2,128,100,64 --chunk 64 --fork 4 -n 5", 1, "--- sequence 3 (seed 45) ---");
    cli_expect("--random 64,2,4,2,128,100,64 --chunk 16 --fork 4 -n 5 --prompt-tokens 20", 1, "--- sequence 3");
    cli_expect("--random 64,2,4,2,128,100,64 --chunk 64 --fork 4 -n 5 --chunks 3", 0, "3 of them copies of a shared "
               "chunk a fork writes into; 2 of 3 are free): raise --chunks");
    /* 9. -n 0 with --dump-logits dumps the prompt's rows: the rows -n 1 dumps first */
    cli_expect("--tokens 1,22,56,40 -n 0 -t 0 --dump-logits @T/d0.f32", 1, "");
    cli_expect("--tokens 1,22,56,40 -n 1 -t 0 --dump-logits @T/d1.f32", 1, "");
    size_t n0 = 0, n1 = 0;
    char *d0 = read_all(tmp_file("d0.f32"), &n0), *d1 = read_all(tmp_file("d1.f32"), &n1);
    expect(d0 && d1 && n0 == 4 * 68 * sizeof(float) && n1 == n0 && !memcmp(d0, d1, n0),
           "--dump-logits -n 0: the prompt's 4 rows of 68 logits (%zu bytes), as -n 1 writes them", n0);
    free(d0);
    free(d1);
    /* 10. --check's lines go to stderr, not into the generated text */
    if (KVT_EMULATED || kvt_gpu_available()) {
        rc = cli_run_to("--device gpu --check -n 3 -t 0", 1, out, sizeof(out));
        int rc2 = cli_run("--device gpu --check -n 3 -t 0", out2, sizeof(out2));
        expect(rc == 0 && rc2 == 0 && !contains(out, "PASS") && !contains(out, "max error") &&
               contains(out2, "PASS --check step 2"), "--check: its lines on stderr, stdout only the text ('%.30s')", out);
    } else {
        skip("--check's lines on stderr: --check needs a GPU (an nvcc build without one)");
    }
    /* 11. an error that several OpenMP threads reach is printed once */
    if (KVT_EMULATED) {
        setenv("OMP_THREAD_LIMIT", "4", 1);
        rc = cli_run("--device gpu -n 3", out, sizeof(out));
        unsetenv("OMP_THREAD_LIMIT");
        expect(rc != 0 && count_of(out, "[KVT ERROR]") == 1, "an error reached by 4 threads: printed %d time(s), "
               "exit %s", count_of(out, "[KVT ERROR]"), rc ? "non-zero" : "0");
    } else {
        skip("an error reached by several threads: the emulation's threads (this build runs kernels on a GPU)");
    }
    /* 12. --tokens: one rule (digits, commas, spaces around ids) */
    const char *good[][2] = {{"1, 22", "1 22"}, {" 1, 22 ,56 ", "1 22 56"}, {"1,22", "1 22"}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        snprintf(args, sizeof(args), "--tokens '%s' -n 0 --dump-tokens @T/ids.txt", good[i][0]);
        rc = cli_run(args, out, sizeof(out));
        int ids[8], n = read_ints(tmp_file("ids.txt"), ids, 8);
        char got[64] = "";
        for (int k = 0; k < n; k++) snprintf(got + strlen(got), sizeof(got) - strlen(got), k ? " %d" : "%d", ids[k]);
        expect(rc == 0 && !strcmp(got, good[i][1]), "--tokens '%s' is [%s] (got [%s])", good[i][0], good[i][1], got);
    }
    const char *bad[][2] = {{"+5", "item 1 is not a token id"}, {"-0", "item 1 is not a token id"},
                            {"1,,2", "item 2 is not a token id"}, {"", "item 1 is not a token id"},
                            {"1 2", "item 1 is not a token id"}, {"1,", "item 2 is not a token id"},
                            {"1,99999999999999999999", "id 99999999999999999999 (item 2) is out of range"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(args, sizeof(args), "--tokens '%s' -n 1", bad[i][0]);
        cli_expect(args, 0, bad[i][1]);
    }
    cli_expect("--fork 1 -n 2 --dump-tokens @T/f1.txt", 1, ""); /* --fork 1 is one sequence */
    cli_expect("--help", 1, "decimal digits only");
    /* --stats gives the time per generated token with the cache on and off: off
     * recomputes every position at each step (7 to 70 here, about 40x the
     * work of one position), so it must cost more per token */
    double ms[2] = {0, 0};
    for (int off = 0; off < 2; off++) {
        rc = cli_run(off ? "-n 64 -t 0 --stats --kv-cache off" : "-n 64 -t 0 --stats", out, sizeof(out));
        const char *at = strstr(out, "[stats] per generated token: ");
        if (rc != 0 || !at || sscanf(at, "[stats] per generated token: %lf ms", &ms[off]) != 1) ms[off] = -1;
        /* the rows of the calls name what they are: the 7 prompt rows once
         * with the cache; without it the prompt, then 63 calls over the whole
         * history of 8 .. 70 positions: 7 + (8 + 70) * 63 / 2 = 2,464 rows */
        long rows = -1;
        const char *r = strstr(out, off ? "[stats] recomputed rows " : "[stats] prefill ");
        if (r) sscanf(r + strlen(off ? "[stats] recomputed rows " : "[stats] prefill "), "%ld", &rows);
        expect(rc == 0 && (off ? !strstr(out, "[stats] prefill ") : 1) && rows == (off ? 2464 : 7),
               "--stats with the cache %s: %s %ld rows", off ? "off names its rows recomputed, not prefill" : "on",
               off ? "recomputed" : "prefill", rows);
    }
    expect(ms[0] > 0 && ms[1] > ms[0], "--stats per generated token: cache on %.3f ms, off %.3f ms (off costs more)",
           ms[0], ms[1]);
}

/* A device allocation that fails and is handled (the engine reports "device
 * out of memory" and the program goes on) must not stay behind as the CUDA
 * runtime's last error: the next launch's check would read it and stop the
 * program. The emulation keeps a last error as CUDA does, so this fails in
 * every build if buf_alloc forgets to clear it. */
static void test_gpu_alloc_error(void) {
    void *p = &p;
    kvt_status st = buf_alloc(1, &p, (size_t)1 << 62, "a test buffer of 4 EiB");
    cudaError_t left = cudaGetLastError();
    expect(st == KVT_ENOMEM && p == NULL && left == cudaSuccess, "a failed device allocation is reported (%s) and "
           "leaves no last error behind (%s)", st == KVT_ENOMEM ? "ENOMEM" : "not ENOMEM", cudaGetErrorString(left));
    if (left != cudaSuccess) return; /* the launch below would stop the suite */
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 1, 4, 2, 64, 50, 32), 7) == KVT_OK);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_GPU;
    int prompt[3] = {1, 4, 9}, toks[8];
    float *lg = (float *)kvt_malloc(4 * 50 * sizeof(float));
    st = generate(&m, &o, prompt, 3, 4, toks, lg);
    expect(st == KVT_OK && kvt_first_nonfinite(lg, 4 * 50) < 0, "after the failed allocation, a GPU run launches "
           "its kernels and decodes 4 tokens");
    free(lg);
    kvt_model_free(&m);
}

/* Sizes past int or size_t, and models or caches larger than memory:
 * each is one error line, and nothing stays allocated (make test-asan checks
 * for leaks). KVT_MEM_LIMIT stands in for the machine's available memory. */
static void test_sizes(void) {
    /* TMAX 2^20, 1024 layers of dim 16: 44 MB of weights, three quarters of
     * them the unused RoPE tables (TMAX x HS floats) */
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(16, 1024, 2, 2, 32, 100, 1 << 20), 21) == KVT_OK);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 1;
    kvt_engine *e = NULL;
    /* 2048 and 4096 sequences x 2^20 one-position chunks: 2^31 and 2^32 table
     * entries, which an int product made negative and 0 */
    for (int seqs = 2048; seqs <= 4096; seqs *= 2) {
        o.max_seqs = seqs;
        kvt_status st = kvt_engine_create(&e, &m, &o);
        expect(st == KVT_EARG && !e && contains(kvt_last_error(), "chunk-table entries"),
               "%d sequences x 2^20 chunks: %s", seqs, kvt_last_error());
    }
    /* 2^28 chunks of 2^20 positions x 1024 layers x 2 x 16 floats: 2^65 bytes */
    o.max_seqs = 1;
    o.CH = 1 << 20;
    o.n_chunks = KVT_LIMIT_CHUNKS;
    kvt_status st = kvt_engine_create(&e, &m, &o);
    expect(st == KVT_ENOMEM && !e && contains(kvt_last_error(), "the KV cache pool would need"),
           "a pool of more than 2^64 bytes: %s", kvt_last_error());
    kvt_model_free(&m);
    cli_expect("--random 16,1,2,2,32,100,1048576 --chunk 1 --fork 2048 -n 1 --prompt-tokens 1", 0,
               "= 2147483648 chunk-table entries");
    cli_expect("--random 16,1,2,2,32,100,1048576 --chunk 1 --fork 4096 -n 1 --prompt-tokens 1", 0,
               "= 4294967296 chunk-table entries");

    /* Memory. This model's weights and its default engine's pool, counted here
     * from the shapes: weights 2.3 MB, pool 0.13 MB, and about 3.6 MB of scratch
     * (mostly two copies of 256 rows of 1000 logits). */
    int D = 128, L = 2, NH = 4, NKV = 4, HD = 256, V = 1000, TMAX = 64, HS = D / NH, CH = 16;
    kvt_config c = cfg(D, L, NH, NKV, HD, V, TMAX);
    double w_bytes = 4.0 * (2.0 * V * D + L * (2.0 * D + 2.0 * D * D + 2.0 * NKV * HS * D + 3.0 * HD * D) + D +
                            (double)TMAX * HS);
    double pool_bytes = 4.0 * (TMAX / CH) * L * 2 * CH * NKV * HS;
    char want_w[64], want_pool[64];
    snprintf(want_w, sizeof(want_w), "weights %.3g GB", w_bytes / 1e9);
    snprintf(want_pool, sizeof(want_pool), "(loaded), cache %.3g GB, scratch", pool_bytes / 1e9);
    setenv("KVT_MEM_LIMIT", "1000000", 1);
    st = kvt_model_random(&m, c, 22);
    expect(st == KVT_ENOMEM && !m.data && contains(kvt_last_error(), "not enough host memory") &&
           contains(kvt_last_error(), want_w) && contains(kvt_last_error(), "available 0.001 GB (KVT_MEM_LIMIT)"),
           "random model over KVT_MEM_LIMIT: %s", kvt_last_error());
    unsetenv("KVT_MEM_LIMIT");
    KVT_ASSERT(kvt_model_random(&m, c, 22) == KVT_OK);
    const char *p = tmp_file("sizes.bin");
    KVT_ASSERT(write_checkpoint(p, &m, 0, 0));
    setenv("KVT_MEM_LIMIT", "1000000", 1);
    kvt_model m2;
    st = kvt_model_load(&m2, p);
    expect(st == KVT_ENOMEM && !m2.data && contains(kvt_last_error(), want_w),
           "checkpoint over KVT_MEM_LIMIT: %s", kvt_last_error());
    if (st == KVT_OK) kvt_model_free(&m2);
    setenv("KVT_MEM_LIMIT", "2000000", 1); /* the weights are loaded; the engine's 2.7 MB do not fit */
    kvt_options_default(&o);
    o.device = KVT_CPU;
    st = kvt_engine_create(&e, &m, &o);
    expect(st == KVT_ENOMEM && !e && contains(kvt_last_error(), want_w) && contains(kvt_last_error(), want_pool) &&
           contains(kvt_last_error(), "available 0.002 GB"), "engine over KVT_MEM_LIMIT: %s", kvt_last_error());
    if (st == KVT_OK) kvt_engine_free(e);
    o.device = KVT_GPU; /* the emulated GPU's buffers are host memory too */
    st = kvt_engine_create(&e, &m, &o);
    if (KVT_EMULATED)
        expect(st == KVT_ENOMEM && !e, "engine on the emulated GPU over KVT_MEM_LIMIT: %s", kvt_last_error());
    else if (!kvt_gpu_available()) /* an nvcc build with no device: asking for the GPU is an error, not a fallback */
        expect(st == KVT_EARG && !e && contains(kvt_last_error(), "no CUDA device found"),
               "engine asked for the GPU with no device: %s", kvt_last_error());
    if (st == KVT_OK) kvt_engine_free(e);
    setenv("KVT_MEM_LIMIT", "8000000", 1);
    o.device = KVT_CPU;
    st = kvt_engine_create(&e, &m, &o);
    expect(st == KVT_OK, "engine under KVT_MEM_LIMIT = 8 MB: %s", st == KVT_OK ? "made" : kvt_last_error());
    if (st == KVT_OK) kvt_engine_free(e);
    setenv("KVT_MEM_LIMIT", "1000000", 1);
    cli_expect("--random 128,2,4,4,256,1000,64 -n 1", 0, want_w);
    setenv("KVT_MEM_LIMIT", "2500000", 1); /* the weights fit, the engine does not */
    cli_expect("--random 128,2,4,4,256,1000,64 -n 1", 0, want_pool);
    unsetenv("KVT_MEM_LIMIT");
    cli_expect("--random 128,2,4,4,256,1000,64 -n 1", 1, "");
    kvt_model_free(&m);

    /* The random fill: blocks of KVT_FILL_BLOCK floats, each with its own
     * generator, so 1 and 2 threads give the same bits. Tensors of 128000
     * (embedding) and 65536 x 2 + ... floats span several blocks. */
    int max_threads = omp_get_max_threads();
    kvt_model r[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        KVT_ASSERT(kvt_model_random(&r[t], c, 23) == KVT_OK);
    }
    omp_set_num_threads(max_threads);
    expect(r[0].n_floats == r[1].n_floats && !memcmp(r[0].data, r[1].data, r[0].n_floats * sizeof(float)),
           "random model: the same %zu floats on 1 and 2 threads", r[0].n_floats);
    /* and the values look like what kvt_model_random promises: the embedding
     * uniform in [-1, 1) (mean within 6 standard errors of 0), block 1 not a
     * copy of block 0 */
    const float *emb = r[0].w.token_embedding;
    size_t n = (size_t)1000 * 128;
    double sum = 0.0;
    int in_range = 1;
    for (size_t i = 0; i < n; i++) { sum += emb[i]; in_range &= emb[i] >= -1.0f && emb[i] < 1.0f; }
    expect(in_range && fabs(sum / (double)n) < 6.0 * 0.577 / sqrt((double)n) &&
           memcmp(emb, emb + KVT_FILL_BLOCK, 64 * sizeof(float)) != 0,
           "random embedding: in [-1, 1), mean %.5f, blocks differ", sum / (double)n);
    kvt_model_free(&r[0]);
    kvt_model_free(&r[1]);
}

/* An inf, a nan or a negative number (a '-' after a space, before a digit) in
 * a bench's output: a rate that divided by a zero or negative time. */
static int bench_bad_number(const char *out) {
    if (contains(out, "inf") || contains(out, "nan")) return 1;
    for (const char *c = out; *c; c++)
        if (*c == '-' && (c == out || c[-1] == ' ') && c[1] >= '0' && c[1] <= '9') return 1;
    return 0;
}
/* Every bench either measures or refuses, in one line, a shape it cannot
 * measure: a model too short for its steps, a --bench-ctx or --bench-every
 * out of range, a --chunks pool too small. The smallest shapes that measure
 * run too (each well under a second; matmul times 0.3 s per row count, so it
 * is left out). No rate may come out inf, nan or negative. */
/* make bench (bench/run.sh), on tiny models (QUICK=1, seconds): it must leave
 * the checkout as it was (its default folder, bench/out, is ignored by git;
 * tracked results change only by make bench-save) and draw both plots when
 * gnuplot is there (make test installs it like make bench does). The run goes
 * to bench/out/selftest, so a student's own bench/out results stay. */
static int png_file(const char *path) {
    unsigned char sig[8] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(sig, 1, 8, f) : 0;
    if (f) fclose(f);
    return n == 8 && !memcmp(sig, "\x89PNG\r\n\x1a\n", 8);
}
static void test_bench_run(void) {
    if (!have_kvt("make bench checks")) return;
    if (system("git rev-parse --is-inside-work-tree > /dev/null 2>&1 && test -f bench/run.sh") != 0) {
        skip("make bench checks (not run from a git checkout)");
        return;
    }
    expect(system("git check-ignore -q bench/out/positions.png && git check-ignore -q bench/out/context_curve.csv") == 0,
           "make bench: its output folder bench/out is ignored by git");
    int plots = system("command -v gnuplot > /dev/null 2>&1") == 0;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "mkdir -p bench/out; git status --porcelain > bench/out/status.before 2>&1; rm -rf bench/out/selftest; "
             "QUICK=1 PLOTS=%d OUT=bench/out/selftest KVT=%s bash bench/run.sh > bench/out/selftest.log 2>&1; "
             "rc=$?; git status --porcelain | diff - bench/out/status.before > bench/out/selftest.diff; d=$?; "
             "rm -f bench/out/status.before; exit $((rc * 2 + (d != 0)))", plots, kvt_bin);
    int rc = system(cmd), code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 255;
    expect(code / 2 == 0, "make bench on tiny models (QUICK=1) runs to the end (log: bench/out/selftest.log)");
    expect(code % 2 == 0, "make bench leaves git status as it was (differences: bench/out/selftest.diff)");
    if (!plots) { skip("make bench plots (no gnuplot; make test installs it as root or with sudo)"); return; }
    expect(png_file("bench/out/selftest/positions.png") && png_file("bench/out/selftest/context.png"),
           "make bench draws bench/out/.../positions.png and context.png (gnuplot)");
    expect(system("grep -q 'cache_on_ms_min' bench/out/selftest/positions_fp32.csv && "
                  "grep -q 'decode_tokens_per_s_max' bench/out/selftest/context_curve.csv") == 0,
           "make bench's plotted tables hold medians with min and max over the runs");
}
/* make bench-serve (bench/serve.sh) on a tiny model and trace (QUICK=1): it runs
 * to the end, leaves git status as it was, writes a row per configuration and
 * rate, and its preallocated pool of 512 positions in contexts of TMAX = 128
 * holds exactly 512 / 128 = 4 requests at once, while the reservation policy
 * never preempts; the rows of 16 running requests carry numbers. */
static void test_bench_serve(void) {
    if (!have_kvt("make bench-serve checks")) return;
    if (system("git rev-parse --is-inside-work-tree > /dev/null 2>&1 && test -f bench/serve.sh") != 0) {
        skip("make bench-serve checks (not run from a git checkout)");
        return;
    }
    int plots = system("command -v gnuplot > /dev/null 2>&1") == 0;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "mkdir -p bench/out; git status --porcelain > bench/out/status.serve 2>&1; "
             "rm -rf bench/out/selftest_serve; QUICK=1 PLOTS=%d OUT=bench/out/selftest_serve KVT=%s bash bench/serve.sh "
             "> bench/out/selftest_serve.log 2>&1; rc=$?; git status --porcelain | diff - bench/out/status.serve "
             "> bench/out/selftest_serve.diff; d=$?; rm -f bench/out/status.serve; exit $((rc * 2 + (d != 0)))",
             plots, kvt_bin);
    int rc = system(cmd), code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 255;
    expect(code / 2 == 0, "make bench-serve on a tiny model (QUICK=1) runs to the end (log: bench/out/selftest_serve.log)");
    expect(code % 2 == 0, "make bench-serve leaves git status as it was (differences: bench/out/selftest_serve.diff)");
    const char *d = "bench/out/selftest_serve";
    snprintf(cmd, sizeof(cmd), "test $(awk -F, 'NR > 1 && ($2 == 0.5 || $2 == 1.5)' %s/serve.csv | cut -d, -f1 | sort -u "
             "| wc -l) = 5 && test $(wc -l < %s/serve.csv) = 11", d, d);
    expect(system(cmd) == 0, "make bench-serve: serve.csv has a row for each of 5 configurations at each of 2 rates");
    snprintf(cmd, sizeof(cmd), "grep -q '^  cont_prealloc    peak 4, 0 preemptions$' %s/serve_rows.txt && "
             "grep -q '^  reserve16        peak [0-9]*, 0 preemptions$' %s/serve_rows.txt && "
             "grep -q '^  nocache          mean [0-9.]* ms' %s/serve_rows.txt && "
             "grep -q '^  serve [0-9.]*, static batch of 16 (--bench context --bench-ctx 64 --bench-batch 16) "
             "[0-9.]*: ratio [0-9]\\.[0-9][0-9]$' %s/serve_rows.txt && "
             "grep -q '^  scheduler: [0-9.]*%% of the serve' %s/serve_rows.txt", d, d, d, d, d);
    expect(system(cmd) == 0, "make bench-serve, all at t = 0: preallocated contexts hold 512 / 128 = 4 requests, "
           "the reservation never preempts; the no-cache row, the 16-running ratio and the scheduler's share are "
           "there (%s/serve_rows.txt)", d);
    if (!plots) { skip("make bench-serve plot (no gnuplot)"); return; }
    snprintf(cmd, sizeof(cmd), "%s/serve.png", d);
    expect(png_file(cmd), "make bench-serve draws %s (gnuplot)", cmd);
}
static void test_bench_shapes(void) {
    if (!have_kvt("bench shape checks")) return;
    /* too short: the reason, and what the bench needs */
    cli_expect("--random 32,1,2,2,64,50,2 --chunk 1 --bench decode", 0, "--bench decode needs TMAX >= 4 (a prompt at");
    cli_expect("--random 32,1,2,2,64,50,3 --chunk 1 --bench decode", 0, "needs TMAX >= 4 (a prompt at position 0, an "
               "untimed step at 1, at least two timed steps from 2 on); this model has TMAX = 3");
    cli_expect("--random 32,1,2,2,64,50,4 --chunk 1 --bench positions", 0, "--bench positions needs TMAX >= 5");
    cli_expect("--random 32,1,2,2,64,50,16 --chunk 4 --bench positions --bench-every 17", 0,
               "this model has TMAX = 16: give --bench-every 12 or less");
    cli_expect("--random 32,1,2,2,64,50,16 --chunk 4 --bench positions --bench-every 13", 0, "needs TMAX >= 17");
    /* without --bench-every on a short model: the default step fits it ((16 - 4) / 8 = 1: rows at 1, 2, ..., 12) */
    cli_expect("--random 32,1,2,2,64,50,16 --chunk 4 --bench positions", 1, "\n      12 ");
    cli_expect("--random 32,1,2,2,64,50,31 --bench batch", 0, "--bench batch needs TMAX >= 32");
    cli_expect("--random 32,1,2,2,64,50,8 --chunk 1 --bench stages", 0, "--bench stages needs TMAX >= 9");
    cli_expect("--random 32,1,2,2,64,50,32 --bench context", 0, "--bench context needs TMAX >= 33");
    /* --split longer than the automatic pieces, context no longer than it: the
     * bench's extra split (to compare) must stay within the engine's part buffer
     * (it once wrote past it; make test-asan runs this too) */
    cli_expect("--random 64,1,4,4,64,100,1024 --bench attention --bench-ctx 1000 --split 1000", 1, "(split: ");
    if (kvt_gpu_available()) { /* (an nvcc build without a GPU refuses --device gpu) */
        cli_expect("--random 64,1,4,4,64,100,1024 --bench attention --bench-ctx 300 --split 1000 --device gpu", 1,
                   "(split: ");
        /* what the bench timed is checked: fused and split against naive (make gpu-check fails on ABOVE) */
        cli_expect("--random 64,1,4,4,64,100,1024 --bench attention --bench-ctx 300 --device gpu", 1,
                   "(tolerance KVT_TOL_GPU = 1e-04: within)");
    }
    /* a --bench-ctx out of range names the flag; a default one never does */
    cli_expect("--random 32,1,2,2,64,50,8 --chunk 2 --bench attention --bench-ctx 9", 0,
               "--bench-ctx 9: --bench attention needs 1 <= T <= TMAX = 8");
    cli_expect("--random 32,1,2,2,64,50,16 --chunk 4 --bench stages --bench-ctx 9", 0,
               "--bench-ctx 9: --bench stages needs 1 <= T <= TMAX - 8 = 8");
    cli_expect("--random 32,1,2,2,64,50,40 --chunk 4 --bench context --bench-ctx 9", 0,
               "--bench-ctx 9: --bench context needs 1 <= T <= TMAX - 32 = 8");
    const char *quiet[] = {"--random 32,1,2,2,64,50,1 --bench stages", "--random 32,1,2,2,64,50,1 --bench context"};
    for (int i = 0; i < 2; i++) {
        char out[4096];
        int rc = cli_run(quiet[i], out, sizeof(out));
        expect(rc != 0 && contains(out, "needs TMAX >=") && !contains(out, "--bench-ctx"),
               "cli '%s': refused without naming --bench-ctx, which was not given", quiet[i]);
    }
    cli_expect("--random 32,1,2,2,64,50,32 --bench batch --chunks 31", 0,
               "--chunks 31: --bench batch needs 32 chunks of 16 positions");
    cli_expect("--random 32,1,2,2,64,50,12 --chunk 4 --chunks 3 --bench stages", 0,
               "--chunks 3: --bench stages needs 17 chunks of 4 positions (8 sequences sharing a prompt of 4");
    /* the smallest shapes that measure; the default context fitted to the model */
    const char *runs[][3] = { /* flags, a line the output must have, what that line is */
        {"--random 32,1,2,2,64,50,4 --chunk 1 --bench decode", "decode (cpu, fp32 cache, positions 2..3)",
         "positions 2..3 timed"},
        {"--random 16,1,2,1,32,20,16 --chunk 4 --bench positions --bench-every 1", "off/on\n       1 ",
         "a row for position 1"},
        {"--random 32,1,2,2,64,50,5 --chunk 1 --bench positions --bench-every 1", "off/on\n       1 ",
         "a row for position 1"},
        {"--random 32,1,2,2,64,50,32 --bench batch", "\n    16 ", "a row for batch 16"},
        {"--random 32,1,2,2,64,50,1 --chunk 1 --bench attention", "over T = 1 cached positions", "T = TMAX = 1"},
        {"--random 32,1,2,2,64,50,12 --chunk 4 --bench stages", "decode at position 4", "T = TMAX - 8 = 4"},
        {"--random 32,1,2,2,64,50,33 --chunk 1 --bench context", "\nint8      1      1 ", "T = TMAX - 32 = 1"},
    };
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        char out[4096];
        int rc = cli_run(runs[i][0], out, sizeof(out));
        expect(rc == 0 && contains(out, runs[i][1]) && !bench_bad_number(out),
               "cli '%s': exit %d, %s, no inf, nan or negative number", runs[i][0], rc, runs[i][2]);
        if (i == 0) { /* --bench decode */
            expect(!contains(out, "paired"), "cli '%s': no paired read pass for weights in cache", runs[i][0]);
            /* a chain of dependent loads from memory: tens to hundreds of ns, never ~0 (a chain not walked) */
            const char *lat_at = strstr(out, "latency ");
            double lat = 0;
            int got_lat = lat_at ? sscanf(lat_at, "latency %lf ns", &lat) : 0;
            expect(got_lat == 1 && lat > 5 && lat < 1e5,
                   "cli '%s': memory latency %.1f ns, in (5, 100000)", runs[i][0], lat);
        }
    }
    /* weights past KVT_PAIRED_MIN_BYTES (37 MB): each timed step paired with a read pass */
    const char *big = "--random 512,2,8,8,1024,8000,64 --bench decode";
    char out[4096];
    int rc = cli_run(big, out, sizeof(out));
    const char *at = strstr(out, "median of 31 pairs): the pass ");
    double gbs = 0, pct = 0;
    int got = at ? sscanf(at, "median of 31 pairs): the pass %lf GB/s, decode at %lf%% of it", &gbs, &pct) : 0;
    expect(rc == 0 && got == 2 && gbs > 0.1 && pct > 0 && pct < 1000 && !bench_bad_number(out),
           "cli '%s': exit %d, each of the 31 steps paired with a read pass (%.1f GB/s, decode at %.0f%% of it)", big, rc,
           gbs, pct);
}

// ---- the default model (weights/) -----------------------------------------------------------

/* ---- --serve: many requests through the scheduler (cli/serve.c) ---------------
 * Each sampled position of a serve run is checked against a solo run of that
 * request in a second engine (no sharing, one sequence per request), fed the
 * tokens the serve run produced (teacher forcing): the logits agree within the
 * end-to-end tolerance (a quantized cache: TOL_SERVE_Q), and greedy tokens are
 * equal wherever the solo run's top two logits are further apart than a tie.
 * Bits cannot be equal in general: a row's sum order depends on its batch. */
/* fp16/int8: one K/V value that rounds the other way in the batch than alone
 * moves the logits by about one quantization step times a weight; 100x the
 * fp32 tolerance, 5x below a near tie. */
#define TOL_SERVE_Q 1e-3
typedef struct {
    kvt_engine *solo;
    kvt_seq *seqs;   /* (n) one solo sequence per request */
    float *buf;      /* (V) */
    double tol, worst;
    long checked, tie_skips, token_bad;
} sv_solo;
static void sv_solo_check(void *ctx, const sv_req *r, const float *logits) {
    sv_solo *k = (sv_solo *)ctx;
    kvt_seq *s = &k->seqs[r->id];
    int nh = sv_hist(r), V = k->solo->m->c.vocab_size;
    if (s->len > nh - 1) kvt_seq_reset(k->solo, s); /* never: the history only grows */
    KVT_ASSERT(kvt_forward(k->solo, s, r->hist + s->len, nh - s->len, k->buf, 0) == KVT_OK);
    double mx = 0, d = 0;
    for (int v = 0; v < V; v++) {
        mx = fabs(k->buf[v]) > mx ? fabs(k->buf[v]) : mx;
        d = fabs(k->buf[v] - logits[v]) > d ? fabs(k->buf[v] - logits[v]) : d;
    }
    d /= mx > 0 ? mx : 1;
    k->worst = d > k->worst ? d : k->worst;
    int a = kvt_argmax(k->buf, V), b = -1;
    for (int v = 0; v < V; v++) if (v != a && (b < 0 || k->buf[v] > k->buf[b])) b = v;
    if (k->buf[a] - k->buf[b] > TOL_TIE * mx) k->token_bad += kvt_argmax(logits, V) != a;
    else k->tie_skips++;
    k->checked++;
}
/* A reproducible trace in memory: n requests, Poisson-like gaps (mean 3 ms),
 * prompt lengths long-tailed (most short, a few past the token budget, so they
 * prefill in several steps), outputs 4..30. With a tokenizer, the prompts are
 * text: one of a few openings, some sharing a long first part. */
static sv_req *sv_make_trace(int n, const kvt_model *m, const kvt_tokenizer *tk, uint64_t seed) {
    static const char *lines[] = {"ROMEO:", "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?", "KING HENRY:",
                                  "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.",
                                  "HAMLET:\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the mind"};
    static const int lens[] = {3, 5, 8, 12, 20, 40, 70};
    sv_req *q = (sv_req *)calloc((size_t)n, sizeof(sv_req));
    int TMAX = m->c.seq_len, V = m->c.vocab_size;
    uint64_t x = seed * 2654435761u + 1;
    double t = 0;
    for (int i = 0; i < n; i++) {
        sv_req *r = &q[i];
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        t += (double)(x % 7);
        r->id = i;
        r->arrival = t;
        r->hist = (int *)kvt_malloc((size_t)(TMAX + 1) * sizeof(int));
        r->max_new = 4 + (int)((x >> 8) % 27);
        if (tk) KVT_ASSERT(kvt_encode(tk, lines[(x >> 20) % 5], 1, r->hist, TMAX, &r->n_prompt) == KVT_OK);
        else {
            r->n_prompt = lens[(x >> 20) % 7];
            r->hist[0] = 1;
            for (int j = 1; j < r->n_prompt; j++) r->hist[j] = (int)((x >> 3) * (uint64_t)(j + 7) % (uint64_t)V);
        }
        if (r->n_prompt + r->max_new > TMAX) r->max_new = TMAX - r->n_prompt;
    }
    return q;
}
/* Run a trace through serve_run with every position checked by a solo run on
 * the same options; returns the figures in *c. */
static int sv_run_checked(kvt_model *m, const kvt_tokenizer *tk, const kvt_options *o, sv_req *q, int n, sv_cfg *c,
                          double tol, const char *what) {
    kvt_engine *e, *solo;
    kvt_options so = *o;
    so.prefix_reuse = 0;
    so.n_chunks = n * kvt_cdiv(m->c.seq_len, o->CH);
    so.swap_chunks = 0;
    KVT_ASSERT(kvt_engine_create(&e, m, o) == KVT_OK && kvt_engine_create(&solo, m, &so) == KVT_OK);
    sv_solo k = {solo, (kvt_seq *)calloc((size_t)n, sizeof(kvt_seq)), (float *)kvt_malloc(m->c.vocab_size * sizeof(float)),
                 tol, 0, 0, 0, 0};
    for (int i = 0; i < n; i++) KVT_ASSERT(kvt_seq_init(solo, &k.seqs[i]) == KVT_OK);
    c->on_logits = sv_solo_check;
    c->ctx = &k;
    c->check_pool = 1;
    kvt_status st = serve_run(e, tk, q, n, c, 0.0, 1.0, 7);
    long tokens = 0, preempts = 0, swaps = 0;
    int done = 1;
    for (int i = 0; i < n; i++) {
        tokens += q[i].n_out;
        preempts += q[i].preempts;
        swaps += q[i].swaps;
        done &= q[i].state == SV_DONE && q[i].reason && q[i].first >= q[i].admitted && q[i].finish >= q[i].first;
    }
    kvt_pool *p = kvt_engine_pool(e);
    int ok = expect(st == KVT_OK && done && k.checked == tokens && k.worst <= tol && k.token_bad == 0,
                    "serve %s: %d requests, %ld positions checked against solo runs, worst logit diff %.2g (tol %.0e), "
                    "%ld greedy tokens differ (%ld near ties skipped); preemptions %ld (swaps %ld, fallbacks %ld), "
                    "%ld steps%s%s", what, n, k.checked, k.worst, tol, k.token_bad, k.tie_skips, preempts, swaps,
                    c->fallbacks, c->steps, st == KVT_OK ? "" : ": ", st == KVT_OK ? "" : kvt_last_error());
    expect(st == KVT_OK && p->n_free == p->n_chunks && p->n_swap_free == p->n_swap && c->out_tokens == tokens &&
           kvt_pool_check(e, NULL, 0) == KVT_OK,
           "serve %s: at the end the pool is empty (%d of %d free), the swap area too (%d of %d), the summary's "
           "tokens %ld = the requests' %ld; kvt_pool_check held after every step", what, p->n_free, p->n_chunks,
           p->n_swap_free, p->n_swap, c->out_tokens, tokens);
    for (int i = 0; i < n; i++) kvt_seq_free(solo, &k.seqs[i]);
    free(k.seqs);
    free(k.buf);
    kvt_engine_free(solo);
    kvt_engine_free(e);
    return ok;
}
static void sv_cfg_init(sv_cfg *c, int max_running, int max_batch, int swap) {
    memset(c, 0, sizeof(*c));
    c->max_running = max_running;
    c->max_batch = max_batch;
    c->watermark = 1;
    c->swap = swap;
    c->clock_steps = 1;
}
static long sv_sum(const sv_req *q, int n, int what) { /* 0 preemptions, 1 swaps, 2 reused */
    long s = 0;
    for (int i = 0; i < n; i++) s += what == 0 ? q[i].preempts - q[i].swaps : what == 1 ? q[i].swaps : q[i].reused;
    return s;
}

static void test_serve(void) {
    kvt_config rc = {64, 128, 2, 4, 2, 512, 128};
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, rc, 5) == KVT_OK);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 8;
    o.n_chunks = 24; /* 192 positions for up to 8 requests of up to 100: preemptions */
    o.max_seqs = 8;
    o.max_rows = 32; /* prompts of 40 and 70 prefill over several steps */
    int n = 32;
    sv_cfg c;
    /* recompute */
    sv_req *q = sv_make_trace(n, &m, NULL, 1);
    sv_cfg_init(&c, 8, 32, 0);
    sv_run_checked(&m, NULL, &o, q, n, &c, TOL_E2E, "random model, fp32, --preempt recompute");
    expect(sv_sum(q, n, 0) >= 5 && c.recomputed > 0, "serve recompute: %ld preemptions by recompute (>= 5), %ld "
           "positions recomputed", sv_sum(q, n, 0), c.recomputed);
    sv_free(q, n);
    /* --serve-policy reserve: prompt + max_new reserved at admission, so a
     * running request never lacks a chunk: no preemption on the same trace */
    q = sv_make_trace(n, &m, NULL, 1);
    sv_cfg_init(&c, 8, 32, 0);
    c.policy = SV_RESERVE;
    sv_run_checked(&m, NULL, &o, q, n, &c, TOL_E2E, "random model, --serve-policy reserve");
    expect(sv_sum(q, n, 0) == 0 && c.recomputed == 0, "serve reserve: %ld preemptions (0), %ld positions recomputed",
           sv_sum(q, n, 0), c.recomputed);
    sv_free(q, n);
    /* static: a batch is admitted only when the previous one has finished */
    q = sv_make_trace(n, &m, NULL, 1);
    sv_cfg_init(&c, 8, 32, 0);
    c.policy = SV_STATIC;
    sv_run_checked(&m, NULL, &o, q, n, &c, TOL_E2E, "random model, --serve-policy static");
    int order = 1, big = 0;
    for (int i = 0; i < n; i++) {
        int size = 0;
        for (int j = 0; j < n; j++) {
            size += q[j].batch == q[i].batch;
            if (q[i].batch < q[j].batch) order &= q[j].admitted >= q[i].finish;
        }
        big = size > big ? size : big;
        order &= q[i].batch >= 1 && q[i].preempts == 0;
    }
    expect(order && big >= 2 && c.batches >= 2, "serve static: %d batches, the largest %d requests; each batch admitted "
           "after every request of the earlier ones finished, none preempted", c.batches, big);
    sv_free(q, n);
    /* --kv-cache off: after each token a request drops its cache and prefills
     * its whole history again, so after its k-th token (k < n_out) it
     * recomputes n_prompt + k - 1 positions; the logits still match solo runs */
    int nn = 10;
    q = sv_make_trace(nn, &m, NULL, 2);
    sv_cfg_init(&c, 8, 32, 0);
    c.nocache = 1;
    kvt_options on = o;
    on.prefix_reuse = 0;
    sv_run_checked(&m, NULL, &on, q, nn, &c, TOL_E2E, "random model, --kv-cache off");
    long want = 0;
    for (int i = 0; i < nn; i++)
        for (int k = 1; k < q[i].n_out; k++) want += q[i].n_prompt + k - 1;
    expect(c.recomputed == want && sv_sum(q, nn, 0) == 0, "serve --kv-cache off: %ld positions recomputed (by hand: "
           "%ld), %ld preemptions (0)", c.recomputed, want, sv_sum(q, nn, 0));
    sv_free(q, nn);
    /* swap, with room for everything swapped */
    o.swap_chunks = 64;
    q = sv_make_trace(n, &m, NULL, 1);
    sv_cfg_init(&c, 8, 32, 1);
    sv_run_checked(&m, NULL, &o, q, n, &c, TOL_E2E, "random model, fp32, --preempt swap");
    expect(sv_sum(q, n, 1) >= 5 && c.fallbacks == 0 && c.swap_out_bytes == c.swap_in_bytes && c.swap_in_bytes > 0,
           "serve swap: %ld swap-outs (>= 5), no fallback, %.0f bytes out = %.0f in", sv_sum(q, n, 1),
           c.swap_out_bytes, c.swap_in_bytes);
    sv_free(q, n);
    /* swap with a swap area too small for some: those fall back to recompute */
    o.swap_chunks = 3;
    q = sv_make_trace(n, &m, NULL, 1);
    sv_cfg_init(&c, 8, 32, 1);
    sv_run_checked(&m, NULL, &o, q, n, &c, TOL_E2E, "random model, a 3-chunk swap area");
    expect(c.fallbacks > 0 && sv_sum(q, n, 1) > 0, "serve swap, small area: %ld swaps, %ld fallbacks to recompute",
           sv_sum(q, n, 1), c.fallbacks);
    sv_free(q, n);
    /* the same trace twice under the step clock: the same schedule, the same tokens */
    sv_req *q2[2];
    for (int k = 0; k < 2; k++) {
        kvt_engine *e;
        KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
        q2[k] = sv_make_trace(n, &m, NULL, 3);
        sv_cfg_init(&c, 8, 32, 1);
        KVT_ASSERT(serve_run(e, NULL, q2[k], n, &c, 0.9, 0.9, 11) == KVT_OK); /* sampled: each request its own seed */
        kvt_engine_free(e);
    }
    int same = 1;
    for (int i = 0; i < n; i++)
        same &= q2[0][i].n_out == q2[1][i].n_out && q2[0][i].finish == q2[1][i].finish &&
                q2[0][i].first == q2[1][i].first && q2[0][i].preempts == q2[1][i].preempts &&
                !memcmp(q2[0][i].hist, q2[1][i].hist, (size_t)sv_hist(&q2[0][i]) * sizeof(int));
    expect(same, "serve: two runs of one trace (sampled, swap) under the step clock give the same tokens, times and "
           "preemptions");
    sv_free(q2[0], n);
    sv_free(q2[1], n);
    /* the smaller matrix: fp16, int8, naive attention, the emulated GPU */
    struct { kvt_dtype dt; kvt_attn at; kvt_device dev; const char *what; double tol; } v[] = {
        {KVT_FP16, KVT_ATTN_FUSED, KVT_CPU, "fp16 cache", TOL_SERVE_Q},
        {KVT_INT8, KVT_ATTN_FUSED, KVT_CPU, "int8 cache", TOL_SERVE_Q},
        {KVT_FP32, KVT_ATTN_NAIVE, KVT_CPU, "naive attention", TOL_E2E},
        {KVT_INT8, KVT_ATTN_FUSED, KVT_GPU, "int8 cache on the GPU", TOL_SERVE_Q},
    };
    for (int i = 0; i < 4; i++) {
        if (v[i].dev == KVT_GPU && !kvt_gpu_available()) { skip("serve on the GPU: no device"); continue; }
        kvt_options oi = o;
        oi.kv_dtype = v[i].dt;
        oi.attn = v[i].at;
        oi.device = v[i].dev;
        oi.swap_chunks = 16;
        oi.n_chunks = 16;
        int ni = 12;
        q = sv_make_trace(ni, &m, NULL, 4 + i);
        sv_cfg_init(&c, 6, 24, i % 2);
        sv_run_checked(&m, NULL, &oi, q, ni, &c, v[i].tol, v[i].what);
        sv_free(q, ni);
    }
    kvt_model_free(&m);

    /* the default model, text prompts that share their first chunks (prefix reuse under traffic) */
    kvt_tokenizer tk;
    if (kvt_model_load(&m, "weights/model.bin") != KVT_OK) { skip("serve on the default model: no weights/model.bin"); return; }
    KVT_ASSERT(kvt_tokenizer_load(&tk, "weights/tokenizer.bin", m.c.vocab_size) == KVT_OK);
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 4;
    o.n_chunks = 40;
    o.max_seqs = 8;
    o.max_rows = 16;
    o.swap_chunks = 64;
    for (int swap = 0; swap < 2; swap++) {
        q = sv_make_trace(30, &m, &tk, 9);
        sv_cfg_init(&c, 8, 16, swap);
        sv_run_checked(&m, &tk, &o, q, 30, &c, TOL_E2E, swap ? "default model, --preempt swap" :
                       "default model, --preempt recompute");
        expect(sv_sum(q, 30, swap) >= 5 && sv_sum(q, 30, 2) > 0, "serve default model: %ld %s (>= 5); %ld prompt "
               "positions attached from live requests", sv_sum(q, 30, swap), swap ? "swaps" : "recomputes",
               sv_sum(q, 30, 2));
        sv_free(q, 30);
    }
    kvt_tokenizer_free(&tk);
    kvt_model_free(&m);
}

/* Swap to host and back is a copy: the cache after swap-in equals the cache
 * before swap-out bit for bit (data and int8 scales), in other chunk ids; a
 * chunk shared with another sequence stays where it was. */
static void test_swap_roundtrip(void) {
    kvt_config rc = {64, 128, 2, 4, 2, 256, 64};
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, rc, 8) == KVT_OK);
    for (int dt = 0; dt < 3; dt++) {
        kvt_options o;
        kvt_options_default(&o);
        o.device = KVT_CPU;
        o.kv_dtype = (kvt_dtype)dt;
        o.CH = 4;
        o.n_chunks = 12;
        o.swap_chunks = 4;
        kvt_engine *e;
        KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
        kvt_pool *p = kvt_engine_pool(e);
        int toks[14], KVD = m.kv_dim;
        for (int i = 0; i < 14; i++) toks[i] = (i * 37 + 5) % 256;
        float *lg = (float *)kvt_malloc(256 * sizeof(float));
        kvt_seq a, b, filler;
        KVT_ASSERT(kvt_seq_init(e, &a) == KVT_OK && kvt_seq_init(e, &b) == KVT_OK && kvt_seq_init(e, &filler) == KVT_OK);
        KVT_ASSERT(kvt_forward(e, &a, toks, 14, lg, 0) == KVT_OK);  /* chunks 0..3 */
        KVT_ASSERT(kvt_forward(e, &b, toks, 9, lg, 0) == KVT_OK);   /* attaches a's first 2 chunks, takes 1 */
        int T = a.len, n_pos = T * 2 * m.c.n_layers;
        float *before = (float *)kvt_malloc((size_t)n_pos * KVD * sizeof(float)), *after = (float *)kvt_malloc((size_t)n_pos * KVD * sizeof(float));
        for (int l = 0, k = 0; l < m.c.n_layers; l++)
            for (int w = 0; w < 2; w++)
                for (int t = 0; t < T; t++, k++) kvt_cache_read(e, &a, l, w, t, before + (size_t)k * KVD);
        int old[8], shared = b.table[0] == a.table[0] && b.table[1] == a.table[1];
        memcpy(old, a.table, (size_t)a.n_table * sizeof(int));
        kvt_status st = kvt_seq_swap_out(e, &a);
        int out_ok = st == KVT_OK && a.n_swapped == 2 && a.table[0] == old[0] && a.table[1] == old[1] &&
                     a.table[2] <= -2 && a.table[3] <= -2 && kvt_pool_check(e, NULL, 0) == KVT_OK;
        kvt_status fst = kvt_forward(e, &a, toks, 1, lg, 0);
        /* the freed chunks go to another sequence, so swap-in must use other ids */
        KVT_ASSERT(kvt_forward(e, &filler, toks + 1, 8, lg, 0) == KVT_OK);
        st = kvt_seq_swap_in(e, &a);
        int moved = st == KVT_OK && a.n_swapped == 0 && a.table[2] != old[2] && a.table[3] != old[3];
        for (int l = 0, k = 0; l < m.c.n_layers && st == KVT_OK; l++)
            for (int w = 0; w < 2; w++)
                for (int t = 0; t < T; t++, k++) kvt_cache_read(e, &a, l, w, t, after + (size_t)k * KVD);
        expect(shared && out_ok && fst == KVT_EARG && moved && !memcmp(before, after, (size_t)n_pos * KVD * sizeof(float)) &&
               kvt_pool_check(e, NULL, 0) == KVT_OK && p->prefix_hash[a.table[2]] != 0,
               "swap %s: out frees the 2 chunks only it holds (the 2 shared stay), a swapped sequence cannot run, in "
               "puts them into chunks %d %d (were %d %d) and the cache reads back bit-exact, prefix hashes restored",
               kvt_dtype_name((kvt_dtype)dt), a.table[2], a.table[3], old[2], old[3]);
        /* a swapped sequence that is dropped gives its slots back */
        KVT_ASSERT(kvt_seq_swap_out(e, &a) == KVT_OK);
        kvt_seq_free(e, &a);
        kvt_seq_free(e, &b);
        kvt_seq_free(e, &filler);
        expect(p->n_swap_free == p->n_swap && p->n_free == p->n_chunks, "swap %s: freeing a swapped-out sequence "
               "frees its swap slots (%d of %d) and chunks (%d of %d)", kvt_dtype_name((kvt_dtype)dt), p->n_swap_free,
               p->n_swap, p->n_free, p->n_chunks);
        free(before); free(after); free(lg);
        kvt_engine_free(e);
    }
    kvt_model_free(&m);
}

/* A prefix hash hit is confirmed against the holder's tokens: with the hash cut
 * to 1 bit every full chunk collides, and nothing is shared unless the tokens
 * match. A prompt equal to a live one, a multiple of CH long, still computes
 * its last position (fresh logits); equal second chunks after different first
 * chunks are never shared. */
static void test_prefix_confirm(void) {
    kvt_config rc = {64, 128, 2, 4, 2, 256, 64};
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, rc, 9) == KVT_OK);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 4;
    o.max_seqs = 4;
    kvt_engine *e, *fresh;
    kvt_options fo = o;
    fo.prefix_reuse = 0;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK && kvt_engine_create(&fresh, &m, &fo) == KVT_OK);
    int A[8] = {1, 10, 11, 12, 20, 21, 22, 23}, B[8] = {1, 50, 51, 52, 20, 21, 22, 23};
    float *l1 = (float *)kvt_malloc(256 * sizeof(float)), *l2 = (float *)kvt_malloc(256 * sizeof(float));
    kvt_seq a, b, c, f;
    int old_bits = kvt_prefix_hash_bits;
    kvt_prefix_hash_bits = 1;
    KVT_ASSERT(kvt_seq_init(e, &a) == KVT_OK && kvt_seq_init(e, &b) == KVT_OK && kvt_seq_init(e, &c) == KVT_OK);
    KVT_ASSERT(kvt_forward(e, &a, A, 8, l1, 0) == KVT_OK);
    long col = kvt_engine_pool(e)->prefix_collisions;
    int got_b = kvt_seq_attach(e, &b, B, 8);
    KVT_ASSERT(kvt_forward(e, &b, B + got_b, 8 - got_b, l1, 0) == KVT_OK);
    KVT_ASSERT(kvt_seq_init(fresh, &f) == KVT_OK && kvt_forward(fresh, &f, B, 8, l2, 0) == KVT_OK);
    int same = !memcmp(l1, l2, 256 * sizeof(float));
    expect(got_b == 0 && kvt_engine_pool(e)->prefix_collisions > col && same && b.table[1] != a.table[1],
           "prefix reuse with a 1-bit hash: a colliding chunk with other tokens is refused (%ld collisions seen), "
           "B's second chunk (equal to A's, after a different first) is its own, its logits equal a fresh run's",
           kvt_engine_pool(e)->prefix_collisions - col);
    int got_c = kvt_seq_attach(e, &c, A, 8);
    KVT_ASSERT(kvt_forward(e, &c, A + got_c, 8 - got_c, l1, 0) == KVT_OK);
    kvt_seq_reset(fresh, &f);
    KVT_ASSERT(kvt_forward(fresh, &f, A, 8, l2, 0) == KVT_OK);
    double d = 0, mx = 0;
    for (int v = 0; v < 256; v++) { d = fmax(d, fabs(l1[v] - l2[v])); mx = fmax(mx, fabs(l2[v])); }
    expect(got_c == 4 && c.table[0] == a.table[0] && c.table[1] != a.table[1] && d <= TOL_E2E * mx,
           "prefix reuse: a prompt equal to a live one (8 = 2 chunks of 4) attaches %d positions, computes its "
           "last chunk itself, logits within %.1e of a fresh run's", got_c, d / mx);
    kvt_prefix_hash_bits = old_bits;
    kvt_seq_free(e, &a); kvt_seq_free(e, &b); kvt_seq_free(e, &c); kvt_seq_free(fresh, &f);
    free(l1); free(l2);
    kvt_engine_free(e); kvt_engine_free(fresh);
    kvt_model_free(&m);
}

/* --serve from the command line: a run, its log and summary, and bad input. */
static void test_serve_cli(void) {
    const char *R = "--random 64,2,4,2,128,512,128 --serve-clock steps -t 0";
    char cmd[1024];
    const char *tr = "# a comment\n0\t5\tids:1,2,3\n0\t6\tids:1,2,3,4,5,6,7,8,9,10\n\n3\t4\tids:7,8\n";
    write_text(tmp_file("tr.tsv"), tr, strlen(tr));
    snprintf(cmd, sizeof(cmd), "%s --serve @T/tr.tsv --serve-log @T/log.csv --serve-text @T/t.txt --chunk 4", R);
    cli_expect(cmd, 1, "[serve] 3 requests, 15 output tokens");
    size_t nb;
    char *log = read_all(tmp_file("log.csv"), &nb), *txt = read_all(tmp_file("t.txt"), &nb);
    int rows = 0, toks = 0;
    for (char *l = log ? strchr(log, '\n') : NULL; l && l[1]; l = strchr(l + 1, '\n')) {
        int id, pt, nt;
        double a1, a2, a3, a4;
        if (sscanf(l + 1, "%d,%lf,%lf,%lf,%lf,%d,%d", &id, &a1, &a2, &a3, &a4, &pt, &nt) == 7) { rows++; toks += nt; }
    }
    expect(log && txt && rows == 3 && toks == 15 && contains(log, "0,0.000,0.000,") && contains(log, ",3,5,max_new,") &&
           contains(txt, "2\tids:"), "--serve-log: 3 rows, new tokens summing to the summary's 15; --serve-text: a line a "
           "request");
    free(log);
    free(txt);
    struct { const char *trace, *extra, *want; } bad[] = {
        {"0\t5\n", "", "line 1: expected arrival_ms<TAB>max_new<TAB>prompt"},
        {"# c\n0\tx\tids:1\n", "", "line 2: arrival_ms must be digits"},
        {"5\t3\tids:1\n2\t3\tids:1\n", "", "line 2: arrival 2 ms is before the previous request's 5 ms"},
        {"# nothing\n\n", "", "has no request"},
        {"0\t0\tids:1\n", "", "line 1: arrival_ms must be digits (at most 10^9) and max_new digits in [1,"},
        {"0\t3\thello\n", "", "a --random model has no tokenizer: give the prompt as ids:1,2,3"},
        {"0\t3\tids:1,999\n", "", "line 1: --tokens: id 999 (item 2) is out of range"},
        {"0\t30\tids:1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16\n", "--chunk 4 --chunks 5", "--chunks 5: too small for request 0"},
        {"0\t3\tids:1\n", "--max-running 8 --max-batch-tokens 4", "--max-batch-tokens must be at least --max-running"},
        {"0\t3\tids:1\n", "--fork 2", "--serve takes its prompts and lengths from the trace"},
        {"0\t3\tids:1\n", "--serve-log @T/bad.tsv", "is the same file as the input --serve"},
        {"0\t3\tids:1\n", "--kv-cache off --serve-policy reserve", "--serve --kv-cache off recomputes every history"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_text(tmp_file("bad.tsv"), bad[i].trace, strlen(bad[i].trace));
        snprintf(cmd, sizeof(cmd), "%s --serve @T/bad.tsv %s", R, bad[i].extra);
        cli_expect(cmd, 0, bad[i].want);
    }
    cli_expect("--random 64,2,4,2,128,512,128 --serve-log @T/x.csv", 0, "shape a --serve run: add --serve FILE");
    write_text(tmp_file("long.tsv"), "0\t500\tids:1,2,3\n", 16);
    snprintf(cmd, sizeof(cmd), "%s --serve @T/long.tsv --serve-log @T/long.csv", R);
    cli_expect(cmd, 1, "[serve] 1 requests, 125 output tokens");
    char *ll = read_all(tmp_file("long.csv"), &nb);
    expect(ll && contains(ll, ",3,125,length,"), "--serve: max_new 500 on TMAX 128 is capped at 125 (finish: length)");
    free(ll);

    /* The summary's time-weighted figures, recomputed from the --trace file:
     * under the steps clock a step of r rows lasts 1 + 0.1 r ms; after it, the
     * pool holds each resident sequence's len positions (no chunk is shared
     * with prefix reuse off), a swapped-out one none. */
    snprintf(cmd, sizeof(cmd), "%s --serve bench/serve_random.tsv --chunk 8 --chunks 24 --preempt swap --prefix-cache "
             "off --trace @T/serve.trace", R);
    char sumout[4096];
    int src = cli_run(cmd, sumout, sizeof(sumout));
    char *tr2 = read_all(tmp_file("serve.trace"), &nb);
    double w_used = 0, w_run = 0, clock = 0, dt = 0, got_util = -1, got_run = -1;
    long used = 0;
    int run = 0, steps = 0, swapped_seen = 0, in_step = 0;
    for (char *l = tr2; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        double at;
        int pr, de, len;
        if (sscanf(l, "== step %*d at %lf ms: %*[^;]; rows: prefill %d, decode %d", &at, &pr, &de) == 3) {
            dt = 1.0 + 0.1 * (pr + de);
            clock = at + dt;
            used = 0, run = 0, in_step = 1, steps++;
        } else if (in_step && !strncmp(l, "seq ", 4) && sscanf(strstr(l, "] len "), "] len %d", &len) == 1) {
            int out = !strncmp(l + strcspn(l, "\n") - 13, "(swapped out)", 13);
            swapped_seen += out;
            if (!out) { used += len; run++; }
        } else if (in_step && !strncmp(l, "totals:", 7)) {
            w_used += dt * (double)used / (24.0 * 8);
            w_run += dt * run;
            in_step = 0;
        }
    }
    const char *u = strstr(sumout, "mean utilization "), *rm = strstr(sumout, "running: peak ");
    if (u) sscanf(u, "mean utilization %lf%%", &got_util);
    if (rm) sscanf(rm, "running: peak %*d, mean %lf", &got_run);
    double want_util = clock > 0 ? 100.0 * w_used / clock : 0, want_run = clock > 0 ? w_run / clock : 0;
    expect(src == 0 && steps > 10 && swapped_seen > 0 && fabs(got_util - want_util) <= 0.051 &&
           fabs(got_run - want_run) <= 0.0051, "--serve summary vs its --trace (%d steps, swaps seen %d): mean "
           "utilization %.1f%% (recomputed %.3f%%), mean running %.2f (recomputed %.4f)", steps, swapped_seen, got_util,
           want_util, got_run, want_run);
    free(tr2);

    /* --stop on the default model: each request run alone (--max-running 1, so
     * its rows are the same in both runs) must write the text of a run without
     * --stop, cut before the first blank line, and end with reason stop. */
    FILE *mf = fopen("weights/model.bin", "rb");
    if (!mf) { skip("--serve --stop: weights/model.bin missing"); return; }
    fclose(mf);
    const char *st = "0\t150\tROMEO:\\n\n0\t150\tJULIET:\\n\n1\t150\tKING RICHARD II:\\n\n";
    write_text(tmp_file("stop.tsv"), st, strlen(st));
    cli_expect("--serve @T/stop.tsv -t 0 --serve-clock steps --max-running 1 --serve-text @T/full.txt", 1,
               "[serve] 3 requests, 450 output tokens");
    cli_expect("--serve @T/stop.tsv -t 0 --serve-clock steps --max-running 1 --stop '\\n\\n' --serve-text "
               "@T/cut.txt --serve-log @T/cut.csv", 1, "[serve] 3 requests");
    char *full = read_all(tmp_file("full.txt"), &nb), *cut = read_all(tmp_file("cut.txt"), &nb);
    char *clog = read_all(tmp_file("cut.csv"), &nb);
    int same = full && cut && clog, stops = 0;
    for (char *f = full, *c = cut; same && *f && *c;) { /* line by line: id<TAB>escaped text */
        size_t fl = strcspn(f, "\n"), cl = strcspn(c, "\n");
        char *blank = strstr(f, "\\n\\n"); /* escaped: a backslash-n twice */
        size_t want = blank && (size_t)(blank - f) < fl ? (size_t)(blank - f) : fl;
        same = cl == want && !strncmp(f, c, cl);
        stops += want < fl;
        f += fl + (f[fl] == '\n');
        c += cl + (c[cl] == '\n');
    }
    int nstop = 0;
    for (char *l = clog; l && (l = strstr(l, ",stop,")); l++) nstop++;
    expect(same && stops == 3 && nstop == 3, "--serve --stop '\\n\\n', default model: each text is the text without "
           "--stop cut before its first blank line (%d of 3 cut, %d of 3 logged as stop)", stops, nstop);
    free(full);
    free(cut);
    free(clog);
}

static void test_default_model(void) {
    kvt_model m;
    if (kvt_model_load(&m, "weights/model.bin") != KVT_OK) { skip("default model: weights/model.bin missing"); return; }
    kvt_tokenizer tk;
    int V = m.c.vocab_size;
    expect(kvt_tokenizer_load(&tk, "weights/tokenizer.bin", V) == KVT_OK, "default tokenizer loads (V = %d)", V);
    int toks[64], n = 0;
    const char *text = "ROMEO:\nWhat light";
    kvt_status st = kvt_encode(&tk, text, 1, toks, 64, &n);
    char back[128] = "";
    for (int i = 1; i < n && st == KVT_OK; i++) strcat(back, kvt_decode(&tk, toks[i - 1], toks[i]));
    expect(st == KVT_OK && toks[0] == KVT_BOS && n == (int)strlen(text) + 1 && !strcmp(back, text),
           "character tokenizer: encode/decode round trip, one token per character");
    st = kvt_encode(&tk, "ROMEO:", 1, toks, 3, &n);
    expect(st == KVT_ECONTEXT, "prompt longer than the room given: %s", kvt_last_error());
    /* PyTorch's logits for a fixed prompt (weights/testvec.txt, written by train.py) */
    FILE *f = fopen("weights/testvec.txt", "r");
    if (!f) { skip("default model vs PyTorch: weights/testvec.txt missing"); }
    else {
        int nt = 0;
        KVT_ASSERT(fscanf(f, "%d", &nt) == 1 && nt > 0 && nt <= 64);
        for (int i = 0; i < nt; i++) KVT_ASSERT(fscanf(f, "%d", &toks[i]) == 1);
        float *want = (float *)kvt_malloc((size_t)nt * V * 4), *got = (float *)kvt_malloc((size_t)nt * V * 4);
        for (int i = 0; i < nt * V; i++) KVT_ASSERT(fscanf(f, "%f", &want[i]) == 1);
        fclose(f);
        for (int dev = 0; dev < 1 + kvt_gpu_available(); dev++) {
            kvt_options o;
            kvt_options_default(&o);
            o.device = dev ? KVT_GPU : KVT_CPU;
            kvt_engine *e;
            kvt_seq s;
            KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
            kvt_seq_init(e, &s);
            KVT_ASSERT(kvt_forward(e, &s, toks, nt, got, 1) == KVT_OK);
            /* PyTorch's own kernels sum in yet other orders; 1e-4 as for GPU vs CPU */
            tally(kvt_check(dev ? "default model logits (gpu path) vs PyTorch" : "default model logits (cpu) vs PyTorch",
                            got, want, (long)nt * V, "pos=64,vocab=1000", KVT_TOL_GPU, "KVT_TOL_GPU"));
            kvt_seq_free(e, &s);
            kvt_engine_free(e);
        }
        free(want);
        free(got);
    }
    /* fp16 and int8 caches against fp32 on the trained model, greedy, 100 steps from 8 prompts.
     * fp16 must pick the same 100 tokens. int8 moves this model's logits more
     * than a random model's (measured over these 800 steps, teacher-forced:
     * median 0.46%, 90th percentile 1.1%, max 4.2% of the largest |logit|:
     * sharp attention amplifies the K error), while 5% of fp32's steps have
     * their two best logits within 0.5%. So greedy decoding may take the other
     * branch at such a near tie; the check is that every divergence happens at
     * a step whose top-two gap is below TOL_TIE (a wrong int8 path, e.g. a bad
     * scale, diverges at ordinary steps, where the median gap is 12%). */
    const char *prompts[8] = {"ROMEO:", "JULIET:", "First Citizen:", "KING RICHARD III:", "To be, or not to be",
                              "MENENIUS:", "The king", "O, what a"};
    int np = 0, *t32 = (int *)kvt_malloc(128 * sizeof(int)), *tq = (int *)kvt_malloc(128 * sizeof(int));
    float *l32 = (float *)kvt_malloc((size_t)100 * V * 4), *lq = (float *)kvt_malloc((size_t)100 * V * 4);
    for (int dt = 1; dt <= 2; dt++) {
        int full = 0, ok = 1;
        for (int pi = 0; pi < 8; pi++) {
            KVT_ASSERT(kvt_encode(&tk, prompts[pi], 1, toks, 64, &np) == KVT_OK);
            kvt_options o;
            kvt_options_default(&o);
            o.device = KVT_CPU;
            KVT_ASSERT(generate(&m, &o, toks, np, 100, t32, l32) == KVT_OK);
            o.kv_dtype = (kvt_dtype)dt;
            o.kv_group = m.head_size < 32 ? m.head_size : 32;
            KVT_ASSERT(generate(&m, &o, toks, np, 100, tq, lq) == KVT_OK);
            int k = 0;
            while (k < 100 && tq[np + k] == t32[np + k]) k++;
            if (k == 100) { full++; continue; }
            const float *lk = l32 + (size_t)k * V; /* fp32's logits where the runs part */
            float mx = 0.0f, gap = lk[t32[np + k]] - lk[tq[np + k]];
            for (int v = 0; v < V; v++) mx = fmaxf(mx, fabsf(lk[v]));
            int tie = gap <= TOL_TIE * mx;
            ok &= dt == 2 && tie;
            printf("    %s: '%s' diverges from fp32 at step %d, where fp32's top two logits differ by %.4f (%.2f%% of "
                   "max |logit|): %s\n", kvt_dtype_name((kvt_dtype)dt), prompts[pi], k, gap, 100.0 * gap / mx,
                   tie ? "a near tie" : "NOT a near tie");
        }
        expect(ok, "default model, %s cache: greedy tokens equal fp32's for 100 steps from %d of 8 prompts%s", dt == 1 ? "fp16" : "int8",
               full, dt == 2 ? "; the others part only at near ties (TOL_TIE)" : "");
    }
    free(t32); free(tq); free(l32); free(lq);
    kvt_tokenizer_free(&tk);
    kvt_model_free(&m);
}

/* One tokenizer.bin entry: float32 score, int32 length, the bytes. */
static void put_piece(FILE *f, const char *piece, float score) {
    int len = (int)strlen(piece);
    fwrite(&score, 4, 1, f);
    fwrite(&len, 4, 1, f);
    fwrite(piece, 1, (size_t)len, f);
}

/* A synthetic sentencepiece-style vocabulary: byte fallback and BPE merges. */
static void write_bpe_tokenizer(const char *p) {
    FILE *f = fopen(p, "wb");
    KVT_ASSERT(f);
    int maxlen = 6, V = 3 + 256 + 5;
    fwrite(&maxlen, 4, 1, f);
    char piece[16];
    for (int i = 0; i < V; i++) {
        float score = 0;
        if (i == 0) strcpy(piece, "<unk>");
        else if (i == 1) strcpy(piece, "<s>");
        else if (i == 2) strcpy(piece, "</s>");
        else if (i < 259) snprintf(piece, sizeof(piece), "<0x%02X>", i - 3);
        else {
            const char *extra[5] = {"a", "b", "c", "ab", "abc"};
            float sc[5] = {0, 0, 0, 1, 2};
            strcpy(piece, extra[i - 259]);
            score = sc[i - 259];
        }
        put_piece(f, piece, score);
    }
    fclose(f);
}
static void test_bpe(void) {
    const char *p = tmp_file("bpe.bin");
    int V = 3 + 256 + 5;
    write_bpe_tokenizer(p);
    kvt_tokenizer tk;
    KVT_ASSERT(kvt_tokenizer_load(&tk, p, V) == KVT_OK);
    int toks[16], n;
    kvt_status st = kvt_encode(&tk, "abcz", 1, toks, 16, &n);
    /* by hand: a b c z -> merge a+b (score 1) -> ab c z -> merge ab+c (score 2) -> abc z;
     * z is not a piece: byte fallback 'z' = 0x7a -> id 0x7a + 3 = 125; no " " piece, so no prefix */
    expect(st == KVT_OK && n == 3 && toks[0] == 1 && toks[1] == 263 && toks[2] == 125,
           "BPE: 'abcz' -> [BOS, abc, <0x7A>] (got n=%d: %d %d %d)", n, toks[0], n > 1 ? toks[1] : -1, n > 2 ? toks[2] : -1);
    expect(!strcmp(kvt_decode(&tk, 263, 125), "z"), "decode: a byte token <0x7A> prints as 'z'");
    kvt_tokenizer_free(&tk);
    st = kvt_tokenizer_load(&tk, p, V + 1);
    expect(st == KVT_EFORMAT && contains(kvt_last_error(), "ends at token"), "tokenizer for another vocabulary: %s",
           kvt_last_error());
}

/* A vocabulary of Llama 2's size, rich in merges: <unk> <s> </s>, the 256 byte
 * pieces at ids 3..258, single characters, "aa" "aaaa" "aaaaaaaa" (the issue's
 * case), "hh" scored below BPE_NO_MERGE (so it never merges), then about half
 * of the strings of 2..5 characters over "abcdefgh " in order of length, until
 * V pieces. Scores come from a range of 24 values, so many tie. */
#define MERGE_V 32000
static void write_merge_tokenizer(const char *p) {
    static const char alpha[] = "abcdefgh ";
    const char *fixed[] = {"a", "b", "c", "d", "e", "f", "g", "h", " ", "\xc3\xa9", "\xc3\xa9" "a", "a\xc3\xa9",
                           "aa", "aaaa", "aaaaaaaa", "hh"};
    int n_fixed = (int)(sizeof(fixed) / sizeof(fixed[0])), maxlen = 8, count = 0;
    uint64_t s = 12;
    FILE *f = fopen(p, "wb");
    KVT_ASSERT(f);
    fwrite(&maxlen, 4, 1, f);
    char piece[16];
    put_piece(f, "<unk>", 0);
    put_piece(f, "<s>", 0);
    put_piece(f, "</s>", 0);
    for (int b = 0; b < 256; b++) {
        snprintf(piece, sizeof(piece), "<0x%02X>", b);
        put_piece(f, piece, 0);
    }
    count = 259;
    for (int i = 0; i < n_fixed; i++, count++)
        put_piece(f, fixed[i], !strcmp(fixed[i], "hh") ? -1e31f : -(float)(kvt_rng_u64(&s) % 24));
    for (int len = 2; len <= 5 && count < MERGE_V; len++) {
        long total = 1;
        for (int j = 0; j < len; j++) total *= 9;
        for (long k = 0; k < total && count < MERGE_V; k++) {
            long rest = k;
            int all_a = 1, known = 0;
            for (int j = len - 1; j >= 0; j--, rest /= 9) {
                piece[j] = alpha[rest % 9];
                all_a &= piece[j] == 'a';
            }
            piece[len] = '\0';
            for (int i = 0; i < n_fixed; i++) known |= !strcmp(piece, fixed[i]);
            /* all-'a' strings other than the fixed ones would blur the issue's case */
            if (all_a || known || kvt_rng_u64(&s) % 2) continue;
            put_piece(f, piece, -(float)(kvt_rng_u64(&s) % 24));
            count++;
        }
    }
    fclose(f);
    KVT_ASSERT(count == MERGE_V);
}

/* The spec of bpe_merge (kvtransformer.cu §16), the quadratic loop the encoder
 * had before: rescan every adjacent pair, merge the best-scoring one (the first
 * of equal scores), repeat. Returns the new count. */
static int bpe_merge_ref(const kvt_tokenizer *t, int *tokens, int n) {
    size_t cap = 2 * (size_t)t->max_token_length + 8;
    char *buf = (char *)kvt_malloc(cap);
    for (;;) {
        float best = BPE_NO_MERGE;
        int best_id = -1, best_i = -1;
        for (int i = 0; i + 1 < n; i++) {
            snprintf(buf, cap, "%s%s", t->vocab[tokens[i]], t->vocab[tokens[i + 1]]);
            int id = tok_lookup(t, buf);
            if (id >= 0 && t->scores[id] > best) { best = t->scores[id]; best_id = id; best_i = i; }
        }
        if (best_i < 0) break;
        tokens[best_i] = best_id;
        memmove(tokens + best_i + 1, tokens + best_i + 2, (size_t)(n - best_i - 2) * sizeof(int));
        n--;
    }
    free(buf);
    return n;
}

/* Random text that merges a lot: letters of "abcdefgh " (or of "ab" alone in a
 * third of the strings, long runs of ties), with now and then a character in
 * the vocabulary but two bytes long (é), ones that are not (€, 'z', 0x01: byte
 * fallback), and a stray continuation byte. */
static void random_text(char *text, int len, uint64_t *s) {
    int only_ab = kvt_rng_u64(s) % 3 == 0, n = 0;
    while (n < len) {
        int r = (int)(kvt_rng_u64(s) % 100);
        if (r < 4 && n + 2 <= len) { memcpy(text + n, "\xc3\xa9", 2); n += 2; }
        else if (r < 7 && n + 3 <= len) { memcpy(text + n, "\xe2\x82\xac", 3); n += 3; }
        else if (r < 9) text[n++] = "z\x01\x80"[kvt_rng_u64(s) % 3];
        else text[n++] = only_ab ? "ab"[kvt_rng_u64(s) % 2] : "abcdefgh "[kvt_rng_u64(s) % 9];
    }
    text[len] = '\0';
}

/* Encode a long single line; returns the seconds it took, -1 on an error. */
static double encode_timed(const kvt_tokenizer *tk, const char *text, int *toks, int *n) {
    double t0 = kvt_now();
    kvt_status st = kvt_encode(tk, text, 1, toks, (int)strlen(text) + 3, n);
    return st == KVT_OK ? kvt_now() - t0 : -1.0;
}

static void test_bpe_fast(void) {
    const char *p = tmp_file("bpe_fast.bin");
    write_merge_tokenizer(p);
    kvt_tokenizer tk;
    KVT_ASSERT(kvt_tokenizer_load(&tk, p, MERGE_V) == KVT_OK && tk.byte_fallback);

    /* the heap version against the spec's loop: kvt_encode vs BOS + encode_chars + bpe_merge_ref */
    char text[320];
    int ref[330], got[330], n_ref, n_got, bad = -1, merges = 0;
    uint64_t s = 7;
    for (int k = 0; k < 400 && bad < 0; k++) {
        random_text(text, (int)(kvt_rng_u64(&s) % 301), &s);
        n_ref = 1;
        ref[0] = KVT_BOS;
        KVT_ASSERT(encode_chars(&tk, text, strlen(text), tk.dummy_prefix, ref, &n_ref) == KVT_OK);
        int n_chars = n_ref;
        n_ref = 1 + bpe_merge_ref(&tk, ref + 1, n_ref - 1);
        merges += n_chars - n_ref;
        kvt_status st = kvt_encode(&tk, text, 1, got, (int)sizeof(got) / (int)sizeof(got[0]), &n_got);
        if (st != KVT_OK || n_got != n_ref || memcmp(ref, got, (size_t)n_ref * sizeof(int))) {
            bad = k;
            int i = 0;
            while (i < n_ref && i < n_got && ref[i] == got[i]) i++;
            printf("  string %d ('%.40s...', %zu bytes): %d tokens, spec %d; first difference at token %d: %d vs %d\n",
                   k, text, strlen(text), n_got, n_ref, i, i < n_got ? got[i] : -1, i < n_ref ? ref[i] : -1);
        }
    }
    expect(bad < 0 && merges > 10000, "BPE: heap merging = the spec's greedy loop on 400 random strings "
           "(V = %d, %d merges, ties and byte fallback)", MERGE_V, merges);

    /* 1 MB on one line: the issue's case (only 'a', pieces "aa" "aaaa" "aaaaaaaa") and random letters */
    int len = 1 << 20, n_a = 0, n_r = 0;
    char *big = (char *)kvt_malloc((size_t)len + 1);
    int *toks = (int *)kvt_malloc(((size_t)len + 3) * sizeof(int));
    memset(big, 'a', (size_t)len);
    big[len] = '\0';
    double t_a = encode_timed(&tk, big, toks, &n_a);
    int id8 = tok_lookup(&tk, "aaaaaaaa"), n8 = 0;
    for (int i = 0; i < n_a; i++) n8 += toks[i] == id8; /* all but the edges of the run */
    for (int i = 0; i < len; i++) big[i] = "abcdefgh "[kvt_rng_u64(&s) % 9];
    double t_r = encode_timed(&tk, big, toks, &n_r);
    /* 20 s is a hang guard, not a benchmark: the quadratic loop took 57 s for 20 KB */
    expect(t_a >= 0 && t_a < 20 && n_a <= len / 8 + 8 && n8 >= len / 8 - 2 && t_r >= 0 && t_r < 20 && n_r < len / 2,
           "BPE: 1 MB of 'a' on one line -> %d tokens in %.2f s; 1 MB of random letters -> %d tokens in %.2f s",
           n_a, t_a, n_r, t_r);

    /* The length check before encoding: at most max_token_length (8) bytes a
     * token, so 81 bytes after BOS are at least 1 + 11 tokens. 80 bytes (at
     * least 11) are encoded and then counted. */
    int n = -1;
    kvt_status st = kvt_encode(&tk, big, 1, toks, 11, &n);
    expect(st == KVT_ECONTEXT && n == 0 && contains(kvt_last_error(), "at least 131073 tokens"),
           "1 MB text, room for 11 tokens: rejected before encoding: %s", kvt_last_error());
    memset(big, 'a', 81);
    big[81] = '\0';
    st = kvt_encode(&tk, big, 1, toks, 11, &n);
    expect(st == KVT_ECONTEXT && contains(kvt_last_error(), "at least 12 tokens"),
           "81 bytes, room for 11 tokens: rejected before encoding: %s", kvt_last_error());
    big[80] = '\0';
    st = kvt_encode(&tk, big, 1, toks, 11, &n);
    expect(st == KVT_ECONTEXT && contains(kvt_last_error(), "the text is 1") && !contains(kvt_last_error(), "at least"),
           "80 bytes, room for 11 tokens: encoded, then counted: %s", kvt_last_error());
    free(big);
    free(toks);
    kvt_tokenizer_free(&tk);
}

/* ---- byte-level BPE (the "BBPE" trailer) ---------------------------------- */

/* GPT-2's bytes_to_unicode() (encoder.py), written out again here so the test
 * does not borrow the program's table: bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF
 * are their own code point; the other 68, in order, are 256, 257, ...
 * chars[b] = that code point in UTF-8. */
static void gpt2_byte_chars(char chars[256][3]) {
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int own = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE, cp = own ? b : next++;
        memset(chars[b], 0, 3);
        if (cp < 0x80) chars[b][0] = (char)cp;
        else { chars[b][0] = (char)(0xC0 | (cp >> 6)); chars[b][1] = (char)(0x80 | (cp & 0x3F)); }
    }
}

/* A small byte-level vocabulary, V = BL_V:
 *   0 "<|endoftext|>", 1 "<|im_start|>", 2 "<|im_end|>"   (special tokens, plain text)
 *   3 + b: byte b's character (3 "Ā" = 0x00, 3 + 0x20 = 35 "Ġ", 3 + '\n' = 13 "Ċ", 'a' = 100)
 *   then the merged pieces, one per merge, ids 259.. in rank order:
 *     rank 0  b c    -> bc    259        rank 7  Ċ Ċ     -> ĊĊ    266
 *     rank 1  a b    -> ab    260        rank 8  d o     -> do    267
 *     rank 2  ab c   -> abc   261        rank 9  n '     -> n'    268
 *     rank 3  a a    -> aa    262        rank 10 ' t     -> 't    269
 *     rank 4  aa aa  -> aaaa  263        rank 11 Ã ©     -> Ã©    270   (é = bytes C3 A9)
 *     rank 5  Ġ a    -> Ġa    264        rank 12 1 2     -> 12    271
 *     rank 6  Ġa bc  -> Ġabc  265
 * The merges are written as (left id, right id) after "BBPE", the
 * pre-tokenizer, bos_id and eos_id. */
#define BL_V 272
#define BL_MERGES 13
static const char *const bl_merge_text[BL_MERGES][2] = {
    {"b", "c"}, {"a", "b"}, {"ab", "c"}, {"a", "a"}, {"aa", "aa"}, {"\xc4\xa0", "a"}, {"\xc4\xa0" "a", "bc"},
    {"\xc4\x8a", "\xc4\x8a"}, {"d", "o"}, {"n", "'"}, {"'", "t"}, {"\xc3\x83", "\xc2\xa9"}, {"1", "2"}};

/* What to write: the fields of the trailer, and one defect at a time. */
typedef struct {
    const char *magic;       /* "BBPE" */
    int pre, bos, eos;
    int n_merges;            /* the count written (BL_MERGES, or a lie) */
    int bad_left;            /* >= 0: merge 0's left id is this */
    int extra;               /* bytes after the last merge */
    int header_ints;         /* how many of the 4 header ints are written */
    int repeat_first;        /* 1: merge 0 again at the end, rank BL_MERGES (n_merges must count it) */
} bl_opts;
static bl_opts bl_default(int pre) {
    bl_opts o = {"BBPE", pre, -1, 2, BL_MERGES, -1, 0, 4, 0};
    return o;
}
static void write_byte_level_tokenizer(const char *p, bl_opts o) {
    char chars[256][3];
    gpt2_byte_chars(chars);
    const char *vocab[BL_V];
    static char merged[BL_MERGES][16];
    vocab[0] = "<|endoftext|>";
    vocab[1] = "<|im_start|>";
    vocab[2] = "<|im_end|>";
    for (int b = 0; b < 256; b++) vocab[3 + b] = chars[b];
    for (int m = 0; m < BL_MERGES; m++) {
        snprintf(merged[m], sizeof(merged[m]), "%s%s", bl_merge_text[m][0], bl_merge_text[m][1]);
        vocab[259 + m] = merged[m];
    }
    FILE *f = fopen(p, "wb");
    KVT_ASSERT(f);
    int maxlen = 13; /* "<|endoftext|>" */
    fwrite(&maxlen, 4, 1, f);
    for (int i = 0; i < BL_V; i++) put_piece(f, vocab[i], 0.0f);
    fwrite(o.magic, 1, strlen(o.magic), f);
    int head[4] = {o.pre, o.bos, o.eos, o.n_merges};
    fwrite(head, 4, (size_t)o.header_ints, f);
    int n_pairs = o.n_merges == 0 ? 0 : BL_MERGES + o.repeat_first; /* n_merges 0: an empty table */
    for (int k = 0; k < n_pairs && o.header_ints == 4; k++) {
        int pair[2] = {-1, -1}, m = k % BL_MERGES;
        for (int i = 0; i < BL_V; i++) {
            if (!strcmp(vocab[i], bl_merge_text[m][0]) && pair[0] < 0) pair[0] = i;
            if (!strcmp(vocab[i], bl_merge_text[m][1]) && pair[1] < 0) pair[1] = i;
        }
        if (k == 0 && o.bad_left >= 0) pair[0] = o.bad_left;
        fwrite(pair, 4, 2, f);
    }
    for (int i = 0; i < o.extra; i++) fputc(0, f);
    fclose(f);
}

/* The pre-tokenizer's chunks of s joined by '|' ("don|'t"), into out. */
static void chunks_of(kvt_pre_tokenizer kind, const char *s, char *out, size_t cap) {
    size_t len = strlen(s), ends[256], start = 0, k = 0;
    KVT_ASSERT(len < 256);
    int n = pre_tokenize(kind, s, len, ends);
    out[0] = '\0';
    for (int c = 0; c < n; start = ends[c++]) {
        k += (size_t)snprintf(out + k, cap - k, "%s%.*s", c ? "|" : "", (int)(ends[c] - start), s + start);
        KVT_ASSERT(k < cap);
    }
}

/* Encode s and compare with the ids written by hand (n_want of them); on a
 * mismatch the line names the first differing position. */
static void expect_ids(const kvt_tokenizer *tk, const char *what, const char *s, int bos, const int *want, int n_want) {
    int got[64], n = -1, i = 0;
    kvt_status st = kvt_encode(tk, s, bos, got, 64, &n);
    while (st == KVT_OK && i < n && i < n_want && got[i] == want[i]) i++;
    int ok = st == KVT_OK && n == n_want && i == n;
    expect(ok, "byte-level BPE: %s (ids: %d%s)", what, n,
           ok ? "" : st != KVT_OK ? ", encode failed" : ", first difference at position shown below");
    if (!ok && st == KVT_OK)
        printf("  position %d: got %d, want %d (got %d ids, want %d)\n", i, i < n ? got[i] : -1,
               i < n_want ? want[i] : -1, n, n_want);
}

/* The spec of byte-level merging on one chunk, independent of the heap and of
 * the loader's sorted table: rescan every adjacent pair, look it up in the
 * written list (bl_merge_text), merge the lowest rank (the leftmost of equal
 * ranks), repeat. tokens are ids of the BL vocabulary. */
static int rank_merge_ref(const kvt_tokenizer *tk, int *tokens, int n) {
    for (;;) {
        int best = BL_MERGES, at = -1;
        for (int i = 0; i + 1 < n; i++)
            for (int m = 0; m < best; m++)
                if (!strcmp(tk->vocab[tokens[i]], bl_merge_text[m][0]) &&
                    !strcmp(tk->vocab[tokens[i + 1]], bl_merge_text[m][1])) { best = m; at = i; break; }
        if (at < 0) return n;
        tokens[at] = 259 + best;
        memmove(tokens + at + 1, tokens + at + 2, (size_t)(n - at - 2) * sizeof(int));
        n--;
    }
}

static void test_byte_level(void) {
    const char *p = tmp_file("bl.bin");
    char out[512];
    kvt_tokenizer tk;

    /* the pre-tokenizer on hand-written cases (expected splits from the regex's rules, by hand) */
    struct { kvt_pre_tokenizer kind; const char *s, *want; } split[] = {
        {KVT_PRE_GPT2, "don't", "don|'t"},
        {KVT_PRE_GPT2, "I'LL", "I|'|LL"},                 /* contractions are lowercase only */
        {KVT_PRE_GPT2, "we're they've", "we|'re| they|'ve"},
        {KVT_PRE_GPT2, " 123", " 123"},                   /* gpt2: a space joins the number */
        {KVT_PRE_SMOLLM, " 123", " |1|2|3"},              /* smollm: each digit alone */
        {KVT_PRE_SMOLLM, "a  1", "a|  |1"},               /* the stretch before the digit ends the lookahead */
        {KVT_PRE_GPT2, "a  1", "a| | 1"},
        {KVT_PRE_GPT2, "a  b", "a| | b"},                 /* the run gives its last space to the word */
        {KVT_PRE_GPT2, "x\n\n y", "x|\n\n| y"},
        {KVT_PRE_GPT2, "x\ny", "x|\n|y"},                 /* a run of one: plain \s+ */
        {KVT_PRE_GPT2, "end  ", "end|  "},                /* whitespace at the end: all of it */
        {KVT_PRE_GPT2, "Hello, world!", "Hello|,| world|!"},
        {KVT_PRE_GPT2, "a...b ?!", "a|...|b| ?!"},
        {KVT_PRE_GPT2, "\xce\x9a\xce\xb1\xce\xbb\xce\xae \xce\xbc\xce\xad\xcf\x81\xce\xb1", /* Greek: letters */
         "\xce\x9a\xce\xb1\xce\xbb\xce\xae| \xce\xbc\xce\xad\xcf\x81\xce\xb1"},
        {KVT_PRE_GPT2, "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c", "\xe4\xbd\xa0\xe5\xa5\xbd|\xef\xbc\x8c"}, /* 你好，*/
        {KVT_PRE_GPT2, "a\xc2\xa0" "b", "a|\xc2\xa0|b"},   /* U+00A0 is \s, but not the optional ' ' */
        {KVT_PRE_SMOLLM, "x\xd9\xa3y", "x|\xd9\xa3|y"},   /* Arabic-Indic three: \p{N} */
        {KVT_PRE_GPT2, "\xff\xfe" "ab", "\xff\xfe|ab"},   /* invalid UTF-8: symbols */
    };
    int bad_split = 0;
    for (size_t i = 0; i < sizeof(split) / sizeof(split[0]); i++) {
        chunks_of(split[i].kind, split[i].s, out, sizeof(out));
        if (strcmp(out, split[i].want)) {
            bad_split++;
            printf("  pre-tokenizer %d on '%s': got '%s', want '%s'\n", split[i].kind, split[i].s, out, split[i].want);
        }
    }
    expect(!bad_split, "byte-level pre-tokenizer: %zu hand-written splits (contractions, digits, the lookahead, "
           "Greek, CJK, U+00A0, invalid bytes)", sizeof(split) / sizeof(split[0]));

    /* encoding, by hand from the table above write_byte_level_tokenizer */
    write_byte_level_tokenizer(p, bl_default(KVT_PRE_SMOLLM));
    kvt_status st = kvt_tokenizer_load(&tk, p, BL_V);
    expect(st == KVT_OK && tk.pre_tokenizer == KVT_PRE_SMOLLM && tk.bos_id == -1 && tk.eos_id == 2 &&
           tk.n_merges == BL_MERGES, "byte-level tokenizer loads: smollm, bos_id -1, eos_id 2, %d merges (%s)",
           BL_MERGES, st == KVT_OK ? "ok" : kvt_last_error());
    if (st != KVT_OK) return;
    /* "abc": pairs (a,b) rank 1 and (b,c) rank 0: bc first, then (a, bc) is no merge: [a, bc].
     * Leftmost first (what the legacy greedy does with this file's equal scores) gives ab, then abc. */
    int abc[] = {100, 259};
    expect_ids(&tk, "'abc' -> a bc: the lowest rank merges first, not the leftmost pair", "abc", 1, abc, 2);
    /* "aaa": (a,a) twice at rank 3: the leftmost merges, [aa, a] */
    int aaa[] = {262, 100};
    expect_ids(&tk, "'aaa' -> aa a: of equal ranks the leftmost", "aaa", 1, aaa, 2);
    /* "aaaaa": aa a a a -> aa aa a -> (aa,aa) rank 4 -> aaaa a */
    int a5[] = {263, 100};
    expect_ids(&tk, "'aaaaa' -> aaaa a", "aaaaa", 1, a5, 2);
    /* " abc": one chunk Ġ a b c: bc (0), then Ġa (5), then Ġa+bc (6) = Ġabc */
    int sabc[] = {265};
    expect_ids(&tk, "' abc' -> Ġabc (the space is part of the word's chunk)", " abc", 1, sabc, 1);
    /* "don't": chunks "don" "'t": do n, 't. One chunk would give do n' t (n' is rank 9, 't rank 10) */
    int dont[] = {267, 113, 269};
    expect_ids(&tk, "'don't' -> do n 't (no merge crosses a chunk)", "don't", 1, dont, 3);
    /* "x\n\n" -> x ĊĊ; "x\n\ny" -> chunks x \n \n y (the lookahead) -> x Ċ Ċ y */
    int xnn[] = {123, 266}, xnny[] = {123, 13, 13, 124};
    expect_ids(&tk, "'x\\n\\n' -> x ĊĊ", "x\n\n", 1, xnn, 2);
    expect_ids(&tk, "'x\\n\\ny' -> x Ċ Ċ y", "x\n\ny", 1, xnny, 4);
    /* "12": smollm, each digit a chunk: 1 2; é = C3 A9 -> Ã © -> Ã© */
    int twelve[] = {52, 53}, e_acute[] = {270};
    expect_ids(&tk, "'12' with smollm -> 1 2", "12", 1, twelve, 2);
    expect_ids(&tk, "'\xc3\xa9' -> one piece 'Ã©'", "\xc3\xa9", 1, e_acute, 1);
    /* "<|im_start|>" is text: 12 byte tokens, the first '<' = 3 + 60 */
    int n = 0, toks[64];
    st = kvt_encode(&tk, "<|im_start|>", 1, toks, 64, &n);
    expect(st == KVT_OK && n == 12 && toks[0] == 63 && toks[11] == 65,
           "byte-level: '<|im_start|>' in text is 12 byte tokens, not the special id 1 (got %d)", n);
    /* decoding: pieces back to bytes */
    char joined[64] = "";
    st = kvt_encode(&tk, "\xe2\x82\xac", 1, toks, 64, &n); /* € = E2 82 AC: three byte tokens */
    for (int i = 0; i < n && st == KVT_OK; i++) strcat(joined, kvt_decode(&tk, i ? toks[i - 1] : -1, toks[i]));
    expect(st == KVT_OK && n == 3 && !strcmp(kvt_decode(&tk, -1, toks[0]), "\xe2") && !strcmp(joined, "\xe2\x82\xac"),
           "byte-level decode: '\xe2\x82\xac' is 3 tokens, each one byte of it, together the character");
    expect(!strcmp(kvt_decode(&tk, -1, 35), " ") && !strcmp(kvt_decode(&tk, -1, 3 + 0xAD), "\xad") &&
           !strcmp(kvt_decode(&tk, -1, 3 + 0x7F), "\x7f") && !strcmp(kvt_decode(&tk, -1, 3), "") &&
           !strcmp(kvt_decode(&tk, -1, 265), " abc") && !strcmp(kvt_decode(&tk, -1, 1), "<|im_start|>") &&
           !strcmp(kvt_decode(&tk, -1, 270), "\xc3\xa9"),
           "byte-level decode: Ġ -> ' ', Ń -> 0xAD, ġ -> 0x7F, Ā (0x00) -> '' (no NUL printed), Ġabc -> ' abc', "
           "<|im_start|> as its text, Ã© -> é");
    /* every string round-trips, invalid UTF-8 too; the heap = the spec's rescanning loop on random 'a'/'b'/'c' runs */
    const char *rt[] = {"", "a  b\tc\r\n", "\xff\xfe\x80 x", "caf\xc3\xa9 \xe2\x82\xac 42", "  \n\n  ", "'''s'll"};
    int rt_bad = 0;
    for (size_t k = 0; k < sizeof(rt) / sizeof(rt[0]); k++) {
        joined[0] = '\0';
        st = kvt_encode(&tk, rt[k], 1, toks, 64, &n);
        for (int i = 0; i < n && st == KVT_OK; i++) strcat(joined, kvt_decode(&tk, i ? toks[i - 1] : -1, toks[i]));
        rt_bad += st != KVT_OK || strcmp(joined, rt[k]);
    }
    expect(!rt_bad, "byte-level: decode(encode(s)) == s on %zu strings (empty, tabs, CRLF, invalid UTF-8)",
           sizeof(rt) / sizeof(rt[0]));
    uint64_t s = 41;
    int heap_bad = 0, merges = 0;
    for (int k = 0; k < 300 && !heap_bad; k++) {
        char text[48];
        int len = 1 + (int)(kvt_rng_u64(&s) % 40), ref[48];
        for (int i = 0; i < len; i++) text[i] = "abc"[kvt_rng_u64(&s) % (k % 3 ? 3 : 1)]; /* a third: only 'a' */
        text[len] = '\0';
        for (int i = 0; i < len; i++) ref[i] = 3 + text[i];
        int n_ref = rank_merge_ref(&tk, ref, len);
        merges += len - n_ref;
        st = kvt_encode(&tk, text, 1, toks, 64, &n);
        heap_bad = st != KVT_OK || n != n_ref || memcmp(toks, ref, (size_t)n * sizeof(int));
        if (heap_bad) printf("  '%s': %d tokens, the spec's loop %d\n", text, n, n_ref);
    }
    expect(!heap_bad && merges > 1000, "byte-level: heap merging by rank = the spec's rescanning loop on 300 random "
           "strings (%d merges)", merges);
    kvt_tokenizer_free(&tk);

    /* gpt2 kind, bos_id 0: BOS first, and "12" merges (no digit split) */
    bl_opts g = bl_default(KVT_PRE_GPT2);
    g.bos = 0;
    write_byte_level_tokenizer(p, g);
    KVT_ASSERT(kvt_tokenizer_load(&tk, p, BL_V) == KVT_OK);
    int g12[] = {0, 35, 271};
    expect_ids(&tk, "gpt2 kind, bos_id 0: ' 12' -> BOS Ġ 12 (the digits merge)", " 12", 1, g12, 3);
    kvt_tokenizer_free(&tk);

    /* (b, c) listed again as the last merge, rank 13: the later rank counts (as in Hugging
     * Face's and GPT-2's merge maps), so in "abc" (a,b) rank 1 goes first: ab c -> abc */
    bl_opts r = bl_default(KVT_PRE_SMOLLM);
    r.repeat_first = 1;
    r.n_merges = BL_MERGES + 1;
    write_byte_level_tokenizer(p, r);
    KVT_ASSERT(kvt_tokenizer_load(&tk, p, BL_V) == KVT_OK);
    int abc_r[] = {261};
    expect_ids(&tk, "a pair listed twice merges at its later rank: 'abc' -> abc", "abc", 1, abc_r, 1);
    kvt_tokenizer_free(&tk);

    /* no merges at all (an exporter may write an empty table): bytes only */
    bl_opts z = bl_default(KVT_PRE_SMOLLM);
    z.n_merges = 0;
    write_byte_level_tokenizer(p, z);
    st = kvt_tokenizer_load(&tk, p, BL_V);
    expect(st == KVT_OK && tk.n_merges == 0, "byte-level tokenizer with 0 merges loads (%s)",
           st == KVT_OK ? "ok" : kvt_last_error());
    if (st == KVT_OK) {
        int bytes_abc[] = {100, 101, 102, 35, 100}; /* a b c Ġ a: the pieces of the bytes, 3 + byte */
        expect_ids(&tk, "0 merges: 'abc a' -> a b c Ġ a (bytes only)", "abc a", 1, bytes_abc, 5);
        kvt_tokenizer_free(&tk);
    }

    /* a 1 MB one-chunk word and 1 MB of words: O(n log n), a hang guard and not a benchmark */
    write_byte_level_tokenizer(p, bl_default(KVT_PRE_SMOLLM));
    KVT_ASSERT(kvt_tokenizer_load(&tk, p, BL_V) == KVT_OK);
    int len = 1 << 20, n_a = 0, n_w = 0;
    char *big = (char *)kvt_malloc((size_t)len + 1);
    int *ids = (int *)kvt_malloc(((size_t)len + 3) * sizeof(int));
    memset(big, 'a', (size_t)len);
    big[len] = '\0';
    double t0 = kvt_now();
    st = kvt_encode(&tk, big, 1, ids, len + 3, &n_a);
    double t_a = kvt_now() - t0;
    int ok_a = st == KVT_OK && n_a == len / 4; /* aaaa pieces only: 2^20 is a multiple of 4 */
    for (int i = 0; i < len; i++) big[i] = " ab\n1"[kvt_rng_u64(&s) % 5];
    t0 = kvt_now();
    st = kvt_encode(&tk, big, 1, ids, len + 3, &n_w);
    double t_w = kvt_now() - t0;
    expect(ok_a && st == KVT_OK && t_a < 20 && t_w < 20, "byte-level: 1 MB of 'a' -> %d tokens in %.2f s; 1 MB of "
           "short words, digits and newlines -> %d tokens in %.2f s", n_a, t_a, n_w, t_w);
    free(big);
    free(ids);
    kvt_tokenizer_free(&tk);

    /* malformed trailers: each refused with one line naming what is wrong */
    struct { const char *what, *msg; bl_opts o; } bad[9];
    for (int i = 0; i < 9; i++) bad[i].o = bl_default(KVT_PRE_SMOLLM);
    bad[0].what = "bad magic"; bad[0].msg = "not a byte-level trailer"; bad[0].o.magic = "BBPX";
    bad[1].what = "a merge id out of range"; bad[1].msg = "merge 0 (272, 102): an id is out of range";
    bad[1].o.bad_left = BL_V;
    bad[2].what = "a merged piece missing"; bad[2].msg = "merge 0 (102 'c', 102 'c'): the merged piece is not in";
    bad[2].o.bad_left = 102; /* merge 0, (b, c), becomes (c, c): "cc" is no piece */
    bad[3].what = "an unknown pre-tokenizer"; bad[3].msg = "unknown pre_tokenizer 3"; bad[3].o.pre = 3;
    bad[4].what = "extra bytes"; bad[4].msg = "bytes left after its 13 merges"; bad[4].o.extra = 3;
    bad[5].what = "fewer merges than n_merges"; bad[5].msg = "ends at merge 13 of n_merges = 14";
    bad[5].o.n_merges = BL_MERGES + 1;
    bad[6].what = "a short header"; bad[6].msg = "ends inside its header"; bad[6].o.header_ints = 3;
    bad[7].what = "bos_id out of range"; bad[7].msg = "bos_id 272 or eos_id 2 is out of range"; bad[7].o.bos = BL_V;
    /* cut just before "BBPE": no longer a legacy file in disguise (ids 1 and 2 would be <|im_start|>, <|im_end|>) */
    bad[8].what = "the file cut before it"; bad[8].msg = "ends without the \"BBPE\" trailer: truncated?";
    bad[8].o.magic = ""; bad[8].o.header_ints = 0;
    for (int i = 0; i < 9; i++) {
        write_byte_level_tokenizer(p, bad[i].o);
        st = kvt_tokenizer_load(&tk, p, BL_V);
        expect(st == KVT_EFORMAT && contains(kvt_last_error(), bad[i].msg), "byte-level trailer with %s refused: %s",
               bad[i].what, kvt_last_error());
        if (st == KVT_OK) kvt_tokenizer_free(&tk);
    }
    /* a legacy file is still legacy: bos 1, eos 2, no pre-tokenizer */
    write_bpe_tokenizer(p);
    st = kvt_tokenizer_load(&tk, p, 3 + 256 + 5);
    expect(st == KVT_OK && tk.pre_tokenizer == KVT_PRE_NONE && tk.bos_id == KVT_BOS && tk.eos_id == KVT_EOS &&
           tk.n_merges == 0 && tk.byte_fallback, "a legacy tokenizer.bin: no trailer, bos_id 1, eos_id 2, "
           "greedy merges by score");
    if (st == KVT_OK) kvt_tokenizer_free(&tk);
}

/* The SmolLM2 vocabulary against Hugging Face: weights/smollm2_tokens.txt
 * (weights/make_tokenizer_fixture.py) holds strings and tokenizers' ids.
 * Needs the exported tokenizer, KVT_SMOLLM2_DIR/tokenizer.bin (default
 * weights/smollm2). A fixture line: the escaped string (\\ \t \n \r \xHH),
 * a TAB, the number of ids, the ids. */
static size_t unescape(const char *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) { out[k++] = s[i]; continue; }
        char c = s[++i];
        if (c == 'x' && i + 2 < n) {
            char hex[3] = {s[i + 1], s[i + 2], 0};
            out[k++] = (char)strtol(hex, NULL, 16);
            i += 2;
        } else out[k++] = c == 't' ? '\t' : c == 'n' ? '\n' : c == 'r' ? '\r' : c;
    }
    out[k] = '\0';
    return k;
}

static void test_smollm2_fixture(void) {
    const char *dir = getenv("KVT_SMOLLM2_DIR") && getenv("KVT_SMOLLM2_DIR")[0] ? getenv("KVT_SMOLLM2_DIR")
                                                                                 : "weights/smollm2";
    char path[512];
    snprintf(path, sizeof(path), "%s/tokenizer.bin", dir);
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        char why[768];
        snprintf(why, sizeof(why), "SmolLM2 tokenizer vs Hugging Face's ids (weights/smollm2_tokens.txt): no %s; "
                 "make smollm2 makes weights/smollm2/ (KVT_SMOLLM2_DIR names another folder)", path);
        skip(why);
        return;
    }
    fclose(probe);
    size_t bytes = 0;
    char *fx = read_all("weights/smollm2_tokens.txt", &bytes);
    kvt_tokenizer tk;
    kvt_status st = kvt_tokenizer_load(&tk, path, 49152);
    if (!expect(fx && st == KVT_OK && tk.pre_tokenizer == KVT_PRE_SMOLLM && tk.bos_id == -1 && tk.eos_id == 2,
                "SmolLM2 tokenizer %s loads (smollm pre-tokenizer, bos_id -1, eos_id 2) and the fixture is there: %s",
                path, st == KVT_OK ? "ok" : kvt_last_error())) {
        if (st == KVT_OK) kvt_tokenizer_free(&tk);
        free(fx);
        return;
    }
    int cases = 0, enc_bad = 0, rt_bad = 0, total_ids = 0;
    size_t cap = bytes + 1;
    char *s = (char *)kvt_malloc(cap), *back = (char *)kvt_malloc(4 * cap), *all = (char *)kvt_malloc(cap);
    int *want = (int *)kvt_malloc(cap * sizeof(int)), *got = (int *)kvt_malloc((cap + 3) * sizeof(int));
    size_t all_len = 0;
    for (char *line = fx; line && *line;) {
        char *eol = strchr(line, '\n'), *tab = (char *)memchr(line, '\t', eol ? (size_t)(eol - line) : strlen(line));
        if (eol) *eol = '\0';
        if (line[0] == '#' || !tab) { line = eol ? eol + 1 : NULL; continue; }
        size_t len = unescape(line, (size_t)(tab - line), s);
        char *q = tab + 1, *e;
        int n_want = (int)strtol(q, &e, 10);
        q = e;
        for (int i = 0; i < n_want; i++, q = e) want[i] = (int)strtol(q, &e, 10);
        memcpy(all + all_len, s, len);
        all_len += len;
        int n = 0, i = 0;
        st = kvt_encode(&tk, s, 1, got, (int)cap, &n);
        while (st == KVT_OK && i < n && i < n_want && got[i] == want[i]) i++;
        if (st != KVT_OK || n != n_want || i != n) {
            if (enc_bad++ < 5)
                printf("  case %d '%.*s': first difference at id %d: got %d, Hugging Face %d (%d ids, want %d)%s%s\n",
                       cases + 1, (int)(tab - line), line, i, i < n ? got[i] : -1, i < n_want ? want[i] : -1, n, n_want,
                       st != KVT_OK ? ": " : "", st != KVT_OK ? kvt_last_error() : "");
        }
        back[0] = '\0';
        for (int k = 0, bl = 0; k < n && st == KVT_OK; k++) { /* decode(encode(s)) */
            const char *piece = kvt_decode(&tk, k ? got[k - 1] : -1, got[k]);
            size_t pl = strlen(piece);
            memcpy(back + bl, piece, pl + 1);
            bl += (int)pl;
        }
        if (st != KVT_OK || strcmp(back, s)) {
            size_t d = 0;
            while (back[d] && back[d] == s[d]) d++;
            if (rt_bad++ < 5) printf("  case %d '%.*s': decode(encode(s)) differs from byte %zu\n", cases + 1,
                                     (int)(tab - line), line, d);
        }
        total_ids += n_want;
        cases++;
        line = eol ? eol + 1 : NULL;
    }
    expect(cases >= 200 && !enc_bad, "SmolLM2 tokenizer: %d of %d fixture strings encode to Hugging Face's ids "
           "(%d ids)", cases - enc_bad, cases, total_ids);
    expect(cases >= 200 && !rt_bad, "SmolLM2 tokenizer: decode(encode(s)) == s for %d of %d strings", cases - rt_bad,
           cases);
    /* speed: all the fixture's text as one string, 8 times over (a hang guard, not a benchmark) */
    char *many = (char *)kvt_malloc(8 * all_len + 1);
    for (int r = 0; r < 8; r++) memcpy(many + r * all_len, all, all_len);
    many[8 * all_len] = '\0';
    int *ids = (int *)kvt_malloc((8 * all_len + 3) * sizeof(int)), n_many = 0;
    double t0 = kvt_now();
    st = kvt_encode(&tk, many, 1, ids, (int)(8 * all_len + 3), &n_many);
    double secs = kvt_now() - t0;
    expect(st == KVT_OK && secs < 10, "SmolLM2 tokenizer: %zu KB of mixed text -> %d tokens in %.3f s",
           8 * all_len / 1024, n_many, secs);
    free(many);
    free(ids);
    free(s);
    free(back);
    free(all);
    free(want);
    free(got);
    free(fx);
    kvt_tokenizer_free(&tk);
}

static void test_sampler(void) {
    float lg[6] = {1, 5, 2, 4.9f, 0, -1}, tmp[6];
    kvt_sampler s;
    kvt_sampler_init(&s, 6, 0.0f, 0.9f, 1);
    memcpy(tmp, lg, sizeof(lg));
    expect(kvt_sample(&s, tmp, 6) == 1, "sampler: temperature 0 is argmax");
    kvt_sampler_free(&s);
    int a[50], b[50], counts[6] = {0};
    for (int rep = 0; rep < 2; rep++) {
        kvt_sampler_init(&s, 6, 1.0f, 1.0f, 1234);
        for (int i = 0; i < 50; i++) { memcpy(tmp, lg, sizeof(lg)); (rep ? b : a)[i] = kvt_sample(&s, tmp, 6); }
        kvt_sampler_free(&s);
    }
    expect(!memcmp(a, b, sizeof(a)), "sampler: the same seed gives the same draws");
    kvt_sampler_init(&s, 6, 1.0f, 0.7f, 7); /* p(1) = 0.504, p(3) = 0.456: top-p 0.7 keeps exactly those two */
    for (int i = 0; i < 2000; i++) { memcpy(tmp, lg, sizeof(lg)); counts[kvt_sample(&s, tmp, 6)]++; }
    kvt_sampler_free(&s);
    expect(counts[0] + counts[2] + counts[4] + counts[5] == 0 && counts[1] > 800 && counts[3] > 800,
           "sampler: top-p 0.7 draws only the two most likely tokens (%d, %d)", counts[1], counts[3]);
    /* top-p sorts only the tokens that can be in the nucleus: the draws must be
     * those of the plain definition (sort all V, walk the prefix), computed here
     * with the same uniform numbers, on a 32000-token distribution and a flat one */
    enum { V = 32000 };
    float *big = frand(V, 4.0f, 77), *t2 = (float *)kvt_malloc(V * sizeof(float));
    struct kvt_prob *all = (struct kvt_prob *)kvt_malloc(V * sizeof(struct kvt_prob));
    int bad = 0;
    for (int flat = 0; flat < 2; flat++) {
        float topp = flat ? 1e-6f : 0.9f;
        kvt_sampler_init(&s, V, 1.0f, topp, 99);
        for (int i = 0; i < 300; i++) {
            uint64_t state = s.state; /* the u the sampler is about to draw */
            float u = kvt_rng_f32(&state);
            for (int v = 0; v < V; v++) t2[v] = flat ? 0.0f : big[v] + 0.01f * (float)i;
            float mx = -INFINITY, z = 0.0f; /* the sampler's own float softmax (temperature 1) */
            for (int v = 0; v < V; v++) mx = fmaxf(mx, t2[v]);
            for (int v = 0; v < V; v++) { all[v].p = expf(t2[v] - mx); z += all[v].p; all[v].id = v; }
            for (int v = 0; v < V; v++) all[v].p /= z;
            qsort(all, V, sizeof(all[0]), prob_cmp);
            float mass = 0.0f, cdf = 0.0f;
            int last = V - 1, want = -1;
            for (int v = 0; v < V; v++) { mass += all[v].p; if (mass > topp) { last = v; break; } }
            for (int v = 0; v <= last && want < 0; v++) { cdf += all[v].p; if (u * mass < cdf) want = all[v].id; }
            if (want < 0) want = all[last].id;
            bad += kvt_sample(&s, t2, V) != want;
        }
        kvt_sampler_free(&s);
    }
    expect(bad == 0, "sampler: top-p over 32000 tokens (p 0.9, and a flat distribution with p 1e-6) draws what "
           "sorting all of them draws, 600 draws (%d differ)", bad);
    free(big); free(t2); free(all);
}



// ---- exercise checks (make exercise N=k) --------------------------------------------------------
/* Each check uses what the exercise adds (an option, a dtype, a kernel), so
 * before the exercise is done it does not compile, and after it must pass.
 * Reference solutions: exercises/N-*.patch (make exercises-selftest). */
#ifdef KVT_EXERCISE
#if KVT_EXERCISE == 1 /* sliding window + attention sinks */
static void exercise_check(void) {
    int ws[][2] = {{8, 0}, {5, 3}, {1, 1}, {300, 2}};
    /* the last case is one fp32 decode row: the CPU's fused path sums its V
     * rows in a loop of its own (tile_v_rows_cpu, cpu/attention.c), and with
     * window 8 its first tile of 32 keys lies wholly outside the window */
    acase cases[] = {{4, 2, 16, 3, 64, 40, 5, KVT_FP32, 16}, {4, 2, 32, 5, 64, 60, 3, KVT_INT8, 8},
                     {2, 1, 64, 16, 256, 200, 2, KVT_FP16, 64}, {8, 2, 16, 5, 64, 50, 1, KVT_FP32, 16}};
    for (int w = 0; w < 4; w++)
        for (int i = 0; i < 4; i++) {
            acase *c = &cases[i];
            ex_window = ws[w][0];
            ex_sinks = ws[w][1];
            size_t no = (size_t)c->n * c->NH * c->HS, nkv = (size_t)c->T * c->NKV * c->HS;
            float *K = (float *)kvt_malloc(nkv * 4), *V = (float *)kvt_malloc(nkv * 4), *ref = (float *)kvt_malloc(no * 4);
            float *got = (float *)kvt_malloc(no * 4);
            attn_run(c, 0, 0, 0, got, K, V);
            attn_ref(c, K, V, ref);
            for (int gpu = 0; gpu < 1 + kvt_gpu_available(); gpu++)
                for (int mode = 0; mode < 5; mode++) { /* naive; fused, whole and split 16; plain, whole and split */
                    int impl = mode == 0 ? 0 : mode < 3 ? 1 : 2;
                    attn_run(c, gpu, impl, mode == 2 || mode == 4 ? 16 : 0, got, NULL, NULL);
                    char what[200];
                    int one_row = !gpu && impl == 1 && c->n == 1 && c->dt == KVT_FP32;
                    snprintf(what, sizeof(what), "exercise 1: %s %s%s%s, window %d, sinks %d, T %d, rows %d, %s",
                             gpu ? "GPU" : "CPU",
                             impl == 0 ? "naive" : impl == 1 ? "fused" : gpu ? "--plain's attn_fused_plain_kernel" : "--plain's attention_fused_spec_cpu",
                             mode == 2 || mode == 4 ? " split 16" : "", one_row ? ", one fp32 decode row (tile_v_rows_cpu)" : "",
                             ex_window, ex_sinks, c->T, c->n, kvt_dtype_name(c->dt));
                    tally(kvt_check(what, got, ref, (long)no, "row=64,head=64,ch=1024", TOL_ATTN, "TOL_ATTN"));
                }
            free(K); free(V); free(ref); free(got);
        }
    /* End to end: the options reach the engine, and the flags the options. A
     * random model, a prompt of 8 and 40 greedy steps, chunks of 4. */
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 2, 4, 2, 64, 53, 64), 21) == KVT_OK);
    int V = 53, np = 8, steps = 40, prompt[8], tok[5][48];
    float *lg[5];
    kvt_fake_tokens(prompt, np, V);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 4;
    for (int run = 0; run < 5; run++) { /* 0: no window; 1: window 6, sinks 2; the same 2: naive, 3: no cache, 4: --plain */
        o.window = run ? 6 : 0;
        o.sinks = run ? 2 : 0;
        o.attn = run == 2 ? KVT_ATTN_NAIVE : KVT_ATTN_FUSED;
        o.kv_cache = run != 3;
        o.plain = run == 4;
        lg[run] = (float *)kvt_malloc((size_t)steps * V * sizeof(float));
        KVT_ASSERT(generate(&m, &o, prompt, np, steps, tok[run], lg[run]) == KVT_OK);
    }
    float diff = 0.0f, mx = 0.0f;
    for (int i = 0; i < steps * V; i++) { diff = fmaxf(diff, fabsf(lg[1][i] - lg[0][i])); mx = fmaxf(mx, fabsf(lg[0][i])); }
    expect(diff > 1e-3f * mx, "exercise 1, engine: window 6 + sinks 2 change the logits of a 48-token run (max change "
           "%.3g of max |logit| %.3g; unchanged means the options never reach the attention)", diff, mx);
    tally(kvt_check("exercise 1, engine: window 6 + sinks 2, naive vs fused attention, logits", lg[2], lg[1],
                    (long)steps * V, "step=40,vocab=53", TOL_E2E, "TOL_E2E"));
    tally(kvt_check("exercise 1, engine: window 6 + sinks 2, cache off vs on, logits", lg[3], lg[1], (long)steps * V,
                    "step=40,vocab=53", TOL_E2E, "TOL_E2E"));
    tally(kvt_check("exercise 1, engine: window 6 + sinks 2, --plain vs tuned, logits", lg[4], lg[1], (long)steps * V,
                    "step=40,vocab=53", TOL_E2E, "TOL_E2E"));
    for (int run = 0; run < 5; run++) free(lg[run]);
    kvt_model_free(&m);
    char *argv[] = {(char *)"kvt", (char *)"--window", (char *)"6", (char *)"--sinks", (char *)"2", NULL};
    kvt_cli a;
    memset(&a, 0, sizeof(a));
    kvt_options_default(&a.o);
    int parsed = parse_args(&a, 5, argv);
    expect(parsed == 1 && a.o.window == 6 && a.o.sinks == 2, "exercise 1, command line: --window 6 --sinks 2 set the "
           "options (window %d, sinks %d)", a.o.window, a.o.sinks);
}
#elif KVT_EXERCISE == 2 /* evict chunks that left the window */
static void exercise_check(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 2, 4, 2, 64, 53, 128), 18) == KVT_OK);
    int V = 53, np = 8, steps = 100, prompt[8], t_big[108], t_small[108];
    kvt_fake_tokens(prompt, np, V);
    float *big = (float *)kvt_malloc((size_t)steps * V * 4), *small = (float *)kvt_malloc((size_t)steps * V * 4);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 4;
    o.window = 24;
    o.sinks = 4;
    o.prefix_reuse = 0;
    KVT_ASSERT(generate(&m, &o, prompt, np, steps, t_big, big) == KVT_OK); /* pool of 32 chunks */
    for (int run = 0; run < 2 * (1 + kvt_gpu_available()); run++) { /* cpu, cpu --plain, gpu, gpu --plain */
        int gpu = run / 2;
        o.device = gpu ? KVT_GPU : KVT_CPU;
        o.plain = run % 2;
        o.n_chunks = 9; /* 36 positions for a sequence of 108: 1 sink chunk + 6 window + 2 in flight */
        kvt_status st = generate(&m, &o, prompt, np, steps, t_small, small);
        char what[120];
        snprintf(what, sizeof(what), "exercise 2: small pool (%s%s) vs large pool (cpu), logits", gpu ? "gpu" : "cpu",
                 o.plain ? ", --plain" : "");
        expect(st == KVT_OK, "%s: 108 positions run in a pool of 9 chunks of 4: %s", what, st == KVT_OK ? "ok" : kvt_last_error());
        if (st != KVT_OK) continue;
        int ok = kvt_check(what, small, big, (long)steps * V, "step=100,vocab=53", gpu ? KVT_TOL_GPU : TOL_E2E,
                           gpu ? "KVT_TOL_GPU" : "TOL_E2E");
        tally(ok && !memcmp(t_small, t_big, sizeof(t_big)));
    }
    free(big); free(small);
    kvt_model_free(&m);
}
#elif KVT_EXERCISE == 3 /* a 4-bit cache */
/* The stored bytes against hand-computed ones: one position of one head,
 * HS = G = 8, K = x and V = -x with max |x| = 7, so scale = 7/7 = 1 and q = x.
 * Stored as q + 8, value 2i in the low 4 bits of byte i, 2i + 1 in the high:
 *   K 1,-2 -> 9,6 -> 0x69; 3,-4 -> 11,4 -> 0x4b; 5,-6 -> 13,2 -> 0x2d; 7,0 -> 15,8 -> 0x8f
 *   V -1,2 -> 7,10 -> 0xa7; -3,4 -> 0xc5; -5,6 -> 0xe3; -7,0 -> 1,8 -> 0x81 */
static void ex3_bytes(int gpu) {
    float x[8] = {1, -2, 3, -4, 5, -6, 7, 0}, nx[8], sc[2] = {0, 0};
    for (int i = 0; i < 8; i++) nx[i] = -x[i];
    const uint8_t want[2][4] = {{0x69, 0x4b, 0x2d, 0x8f}, {0xa7, 0xc5, 0xe3, 0x81}};
    kvt_pool p;
    KVT_ASSERT(pool_init(&p, gpu, 1, 1, 8, 1, 1, KVT_INT4, 8) == KVT_OK);
    kvt_seq s;
    memset(&s, 0, sizeof(s));
    s.table = (int *)kvt_malloc(sizeof(int));
    s.how = (char *)kvt_malloc(1);
    KVT_ASSERT(seq_reserve(&p, &s, 1, "test") == KVT_OK);
    int zero = 0, one = 1;
    int *d_tables = (int *)dev_copy(gpu, s.table, sizeof(int)), *d_pos = (int *)dev_copy(gpu, &zero, sizeof(int));
    int *d_len = (int *)dev_copy(gpu, &one, sizeof(int)), *d_tab = (int *)dev_copy(gpu, &zero, sizeof(int));
    float *dk = (float *)dev_copy(gpu, x, sizeof(x)), *dv = (float *)dev_copy(gpu, nx, sizeof(nx));
    kvt_kv kv = kv_view(&p, d_tables, d_tab, d_pos, d_len), hk = kv;
    (gpu ? kv_write_gpu : kv_write_cpu)(kv, dk, dv, 0, 1);
    uint8_t got[8];
    buf_download(gpu, got, p.data, 8); /* the pool's one chunk: 16 values of 4 bits */
    buf_download(gpu, sc, p.scales, sizeof(sc));
    hk.tables = s.table; /* kv_index on the host reads the host's copy of the table */
    for (int which = 0; which < 2; which++) {
        const uint8_t *b = got + kv_index(&hk, 0, which, 0, 0, 0) / 2;
        expect(!memcmp(b, want[which], 4) && sc[which] == 1.0f, "exercise 3 (%s): %s = %s stores the bytes "
               "%02x %02x %02x %02x with scale 1 (got %02x %02x %02x %02x, scale %g): q + 8, value 2i in the low 4 bits",
               gpu ? "gpu" : "cpu", which ? "V" : "K", which ? "-1,2,-3,4,-5,6,-7,0" : "1,-2,3,-4,5,-6,7,0",
               want[which][0], want[which][1], want[which][2], want[which][3], b[0], b[1], b[2], b[3], sc[which]);
    }
    buf_free(gpu, d_tables); buf_free(gpu, d_pos); buf_free(gpu, d_len); buf_free(gpu, d_tab);
    buf_free(gpu, dk); buf_free(gpu, dv);
    free(s.table); free(s.how);
    pool_free(&p);
}
/* The flag end to end: kvt --random ... --kv-dtype int4 --kv-group 16 --stats
 * (and --check --device gpu where GPU kernels run), through the parser and
 * run_single, stdout and stderr to a file: --stats must count 4 + 32/16 = 6
 * bits per value, --check must pass. */
static void ex3_flag(void) {
    int gpu = kvt_gpu_available();
    char *argv[] = {(char *)"kvt", (char *)"-n", (char *)"12", (char *)"--kv-dtype", (char *)"int4", (char *)"--kv-group",
                    (char *)"16", (char *)"--stats", (char *)"--check", (char *)"--device", (char *)"gpu", NULL};
    int argc = gpu ? 11 : 8;
    kvt_cli cli;
    memset(&cli, 0, sizeof(cli));
    kvt_options_default(&cli.o);
    int parsed = parse_args(&cli, argc, argv);
    if (!expect(parsed == 1 && cli.o.kv_dtype == KVT_INT4, "exercise 3, command line: --kv-dtype int4 --kv-group 16 "
                "sets an int4 cache%s%s", parsed == 1 ? "" : ": ", parsed == 1 ? "" : kvt_errbuf))
        return;
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, 2, 4, 2, 160, 97, 128), 19) == KVT_OK);
    kvt_engine *e;
    KVT_ASSERT(kvt_engine_create(&e, &m, &cli.o) == KVT_OK);
    int prompt[6];
    kvt_fake_tokens(prompt, 6, 97);
    const char *path = tmp_file("ex3_run.txt");
    fflush(stdout);
    fflush(stderr);
    int out = dup(1), err = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    KVT_ASSERT(out >= 0 && err >= 0 && fd >= 0 && dup2(fd, 1) == 1 && dup2(fd, 2) == 2);
    int rc = run_single(e, &m, NULL, &cli, prompt, 6);
    fflush(stdout);
    fflush(stderr);
    KVT_ASSERT(dup2(out, 1) == 1 && dup2(err, 2) == 2);
    close(out); close(err); close(fd);
    size_t bytes = 0;
    char *log = read_all(path, &bytes);
    expect(rc == 0 && log && strstr(log, "[stats] bits per cached value 6.00"), "exercise 3, command line: --kv-dtype int4 "
           "--kv-group 16 --stats prints \"bits per cached value 6.00\" (4 + 32/16) and exits 0 (exit %d)", rc);
    int passed = log && strstr(log, "PASS --check");
    if (gpu)
        expect(passed, "exercise 3, command line: --kv-dtype int4 --check: the GPU's logits match the CPU's at every "
               "step%s", passed ? "" : log && strstr(log, "FAIL") ? " (a step differs)" : " (no PASS line)");
    else
        skip("exercise 3, command line: --check needs GPU kernels (a CUDA device, or the C build's emulation)");
    free(log);
    kvt_engine_free(e);
    kvt_model_free(&m);
}
static void exercise_check(void) {
    for (int gpu = 0; gpu < 1 + kvt_gpu_available(); gpu++) ex3_bytes(gpu);
    ex3_flag();
    acase cases[] = {{4, 2, 16, 3, 64, 29, 5, KVT_INT4, 8}, {4, 2, 32, 16, 64, 47, 2, KVT_INT4, 32}};
    for (int i = 0; i < 2; i++) {
        acase *c = &cases[i];
        size_t no = (size_t)c->n * c->NH * c->HS, nkv = (size_t)c->T * c->NKV * c->HS;
        float *K = (float *)kvt_malloc(nkv * 4), *V = (float *)kvt_malloc(nkv * 4), *ref = (float *)kvt_malloc(no * 4);
        float *got = (float *)kvt_malloc(no * 4), *Kg = (float *)kvt_malloc(nkv * 4), *Vg = (float *)kvt_malloc(nkv * 4);
        float *K32 = frand(nkv, 1.0f, 21);
        attn_run(c, 0, 0, 0, got, K, V);
        double worst = 0; /* inputs are in [-1, 1): |x - scale*q| <= scale/2 <= 1/14 */
        for (size_t j = 0; j < nkv; j++) worst = fmax(worst, fabs((double)K[j] - K32[j]));
        expect(worst <= 1.0 / 14 * 1.0001, "exercise 3: int4 K within scale/2 <= 1/14 of the input (max %.4f), G=%d", worst, c->G);
        attn_ref(c, K, V, ref);
        for (int gpu = 0; gpu < 1 + kvt_gpu_available(); gpu++)
            for (int impl = 0; impl < 2; impl++) {
                attn_run(c, gpu, impl, 0, got, gpu ? Kg : NULL, gpu ? Vg : NULL);
                char what[128];
                snprintf(what, sizeof(what), "exercise 3: int4 attention %s %s vs float64 on the stored values, G=%d",
                         gpu ? "gpu" : "cpu", impl ? "fused" : "naive", c->G);
                tally(kvt_check(what, got, ref, (long)no, "row=8,head=4,ch=32", TOL_ATTN, "TOL_ATTN"));
            }
        if (kvt_gpu_available()) expect(!memcmp(K, Kg, nkv * 4) && !memcmp(V, Vg, nkv * 4), "exercise 3: gpu stores the cpu's int4 values");
        free(K); free(V); free(ref); free(got); free(Kg); free(Vg); free(K32);
    }
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, 2, 4, 2, 160, 97, 128), 17) == KVT_OK);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.kv_dtype = KVT_INT4;
    o.kv_group = 16;
    kvt_engine *e;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    kvt_seq s;
    kvt_seq_init(e, &s);
    int toks[20];
    float lg[97];
    kvt_fake_tokens(toks, 20, 97);
    KVT_ASSERT(kvt_forward(e, &s, toks, 20, lg, 0) == KVT_OK);
    const kvt_seq *live = &s;
    kvt_cache_usage u;
    kvt_cache_usage_of(e, &live, 1, &u);
    expect(u.bits_per_value == 4.0 + 32.0 / 16, "exercise 3: --stats counts %.2f bits per value (4 + 32/G = 6)", u.bits_per_value);
    kvt_seq_free(e, &s);
    kvt_engine_free(e);
    kvt_model_free(&m);
}
#elif KVT_EXERCISE == 4 /* the naive softmax as one warp with shuffles */
static void exercise_check(void) {
    if (!kvt_gpu_available()) { skip("exercise 4: its kernels need a CUDA device (or the C build's emulation)"); return; }
    int n = 3, NH = 2, TMAX = 70, lens[3] = {1, 33, 70};
    float *sc = frand((size_t)n * NH * TMAX, 6.0f, 31), *want = (float *)kvt_malloc((size_t)n * NH * TMAX * 4);
    for (int r = 0; r < n; r++)
        for (int h = 0; h < NH; h++) {
            float *row = sc + ((size_t)r * NH + h) * TMAX, *w = want + ((size_t)r * NH + h) * TMAX;
            if (lens[r] > 2) row[lens[r] - 2] = -INFINITY; /* a masked position */
            double mx = -INFINITY, z = 0;
            for (int t = 0; t < lens[r]; t++) mx = fmax(mx, row[t]);
            for (int t = 0; t < lens[r]; t++) z += exp(row[t] - mx);
            for (int t = 0; t < TMAX; t++) w[t] = t < lens[r] ? (float)(exp(row[t] - mx) / z) : row[t];
        }
    int gpu = 1;
    float *d = (float *)dev_copy(gpu, sc, (size_t)n * NH * TMAX * 4);
    int *dlen = (int *)dev_copy(gpu, lens, sizeof(lens));
    kvt_kv kv;
    memset(&kv, 0, sizeof(kv));
    kv.row_len = dlen;
    KVT_LAUNCH(attn_softmax_warp_kernel, NH, n, 32, d, kv, NH, TMAX);
    float *got = to_host(gpu, d, (size_t)n * NH * TMAX);
    tally(kvt_check("exercise 4: attn_softmax_warp_kernel vs float64 softmax", got, want, (long)n * NH * TMAX,
                    "row=3,head=2,pos=70", TOL_OP, "TOL_OP"));
    buf_free(gpu, d); buf_free(gpu, dlen);
    free(sc); free(want); free(got);
    /* The naive GPU path (attention_naive_gpu, §11) must launch it in place of
     * attn_softmax_kernel: a kernel written but never launched passes the
     * check above and every attention check below. One call, counted (§2). */
    acase c = {4, 2, 16, 3, 64, 29, 5, KVT_FP32, 16};
    float *out = (float *)kvt_malloc((size_t)c.n * c.NH * c.HS * 4);
    long warp = -kvt_launch_count("attn_softmax_warp_kernel"), old = -kvt_launch_count("attn_softmax_kernel");
    attn_run(&c, gpu, 0, 0, out, NULL, NULL);
    warp += kvt_launch_count("attn_softmax_warp_kernel");
    old += kvt_launch_count("attn_softmax_kernel");
    expect(warp == 1, "exercise 4: one naive GPU attention call (attention_naive_gpu) launches attn_softmax_warp_kernel "
           "once (launched: %ld)%s", warp, warp ? "" : " - attn_softmax_warp_kernel was NOT launched by the naive path");
    expect(old == 0, "exercise 4: the naive GPU attention no longer launches the old attn_softmax_kernel (launched: "
           "%ld)%s", old, old ? " - the warp kernel was to replace it" : "");
    free(out);
    test_attention(1); /* and the naive attention that now uses it */
}
#elif KVT_EXERCISE == 5 /* top-k sampling */
/* Top-k, then top-p, on 6 tokens of known probabilities: draws from the
 * sampler's own code, counted per token, against shares worked out by hand. */
static void ex5_topk_topp(int k, float topp, const int *allowed, const double *share, int n_allowed) {
    /* token:       0     1     2     3     4     5     (sorted: 1, 3, 4, 0, 5, 2) */
    double p[6] = {0.10, 0.40, 0.04, 0.25, 0.15, 0.06};
    float lg[6], tmp[6];
    int counts[6] = {0}, draws = 4000, bad = -1;
    for (int i = 0; i < 6; i++) lg[i] = (float)log(p[i]); /* softmax at temperature 1 gives p back */
    kvt_sampler s;
    kvt_sampler_init(&s, 6, 1.0f, topp, 11);
    s.topk = k;
    for (int i = 0; i < draws; i++) { memcpy(tmp, lg, sizeof(lg)); counts[kvt_sample(&s, tmp, 6)]++; }
    kvt_sampler_free(&s);
    char may[32] = "";
    for (int a = 0; a < n_allowed; a++) snprintf(may + strlen(may), sizeof(may) - strlen(may), "%s%d", a ? ", " : "", allowed[a]);
    for (int t = 0; t < 6; t++) {
        int ok = 0;
        for (int a = 0; a < n_allowed; a++) ok |= allowed[a] == t;
        if (!ok && counts[t] && bad < 0) bad = t;
    }
    if (bad >= 0) {
        expect(0, "exercise 5: top-k %d then top-p %.2f drew token %d (probability %.2f) %d times in %d draws: it "
               "should not have been drawn (only tokens %s may be)", k, topp, bad, p[bad], counts[bad], draws, may);
        return;
    }
    /* 4000 draws: a share's standard deviation is at most 0.008, so 0.04 is 5 of them */
    int near = 1;
    char got[128] = "";
    for (int a = 0; a < n_allowed; a++) {
        double f = (double)counts[allowed[a]] / draws;
        near &= fabs(f - share[a]) < 0.04;
        snprintf(got + strlen(got), sizeof(got) - strlen(got), "%stoken %d %.3f (want %.3f)", a ? ", " : "",
                 allowed[a], f, share[a]);
    }
    expect(near, "exercise 5: top-k %d then top-p %.2f draws only the allowed tokens, in proportion: %s", k, topp, got);
}
static void exercise_check(void) {
    float lg[6] = {1, 5, 2, 4.9f, 0, -1}, tmp[6];
    int counts[6] = {0}, a[200], b[200];
    kvt_sampler s;
    kvt_sampler_init(&s, 6, 1.0f, 1.0f, 3);
    s.topk = 2;
    for (int i = 0; i < 3000; i++) { memcpy(tmp, lg, sizeof(lg)); counts[kvt_sample(&s, tmp, 6)]++; }
    kvt_sampler_free(&s);
    expect(counts[0] + counts[2] + counts[4] + counts[5] == 0 && counts[1] > 1200 && counts[3] > 1200,
           "exercise 5: top-k 2 draws only the 2 most likely tokens, about evenly (%d, %d)", counts[1], counts[3]);
    kvt_sampler_init(&s, 6, 1.0f, 1.0f, 3);
    s.topk = 1;
    int all_top = 1;
    for (int i = 0; i < 200; i++) { memcpy(tmp, lg, sizeof(lg)); all_top &= kvt_sample(&s, tmp, 6) == 1; }
    kvt_sampler_free(&s);
    expect(all_top, "exercise 5: top-k 1 is greedy");
    for (int rep = 0; rep < 2; rep++) { /* top-k 0 (off) keeps the old behaviour exactly */
        kvt_sampler_init(&s, 6, 1.0f, 0.9f, 5);
        s.topk = rep ? 0 : s.topk;
        for (int i = 0; i < 200; i++) { memcpy(tmp, lg, sizeof(lg)); (rep ? b : a)[i] = kvt_sample(&s, tmp, 6); }
        kvt_sampler_free(&s);
    }
    expect(!memcmp(a, b, sizeof(a)), "exercise 5: top-k 0 changes nothing");
    /* Top-k then top-p, probabilities sorted 0.40 (token 1), 0.25 (3), 0.15 (4),
     * 0.10 (0), 0.06 (5), 0.04 (2). k 3 keeps 0.40 + 0.25 + 0.15 = 0.80; then
     * p 0.85 keeps all three (top-p alone would keep token 0 too: 0.90 > 0.85
     * is first reached with it), drawn as 0.40/0.80, 0.25/0.80, 0.15/0.80;
     * p 0.6 keeps two (0.40 + 0.25 = 0.65 > 0.6), drawn as 0.40/0.65, 0.25/0.65.
     * (Top-p on the renormalized top 3, 0.50, 0.8125, 1, keeps the same.) */
    int keep[3] = {1, 3, 4};
    double share3[3] = {0.40 / 0.80, 0.25 / 0.80, 0.15 / 0.80}, share2[2] = {0.40 / 0.65, 0.25 / 0.65};
    ex5_topk_topp(3, 0.85f, keep, share3, 3);
    ex5_topk_topp(3, 0.6f, keep, share2, 2);
    /* The flag: --topk 5 through the command-line parser, then a generation
     * (run_single, §20) at temperature 5 (nearly flat: without top-k any of
     * the 53 tokens comes up) whose every drawn token must be among the 5
     * highest logits of the step that drew it, and the 5th must come up. */
    const char *lpath = tmp_file("ex5_logits.f32"), *tpath = tmp_file("ex5_ids.txt");
    char *argv[] = {(char *)"kvt", (char *)"-n", (char *)"40", (char *)"-t", (char *)"5", (char *)"-p", (char *)"1",
                    (char *)"--topk", (char *)"5", (char *)"-s", (char *)"7", (char *)"--dump-logits", (char *)lpath,
                    (char *)"--dump-tokens", (char *)tpath, NULL};
    kvt_cli cli;
    memset(&cli, 0, sizeof(cli));
    kvt_options_default(&cli.o);
    int parsed = parse_args(&cli, 15, argv);
    if (!expect(parsed == 1, "exercise 5, command line: kvt -n 40 -t 5 -p 1 --topk 5 is accepted%s%s", parsed == 1 ? "" :
                ": ", parsed == 1 ? "" : kvt_errbuf))
        return;
    cli.o.device = KVT_CPU;
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 2, 4, 2, 64, 53, 64), 23) == KVT_OK);
    kvt_engine *e;
    KVT_ASSERT(kvt_engine_create(&e, &m, &cli.o) == KVT_OK);
    int np = 4, V = 53, steps = 40, prompt[4], ids[64];
    kvt_fake_tokens(prompt, np, V);
    fflush(stdout); /* run_single prints the ids it generates: not here */
    int out = dup(1), null = open("/dev/null", O_WRONLY);
    KVT_ASSERT(out >= 0 && null >= 0 && dup2(null, 1) == 1);
    int rc = run_single(e, &m, NULL, &cli, prompt, np);
    fflush(stdout);
    KVT_ASSERT(dup2(out, 1) == 1);
    close(out);
    close(null);
    size_t bytes = 0;
    float *rows = (float *)read_all(lpath, &bytes);
    int n_ids = read_ints(tpath, ids, 64), worst = -1, outside = -1, outside_rank = 0;
    /* the files: a row of logits per position but the last (whose token was drawn, not fed), and every id */
    if (expect(rc == 0 && rows && bytes == (size_t)(np + steps - 1) * V * 4 && n_ids == np + steps, "exercise 5, "
               "command line: the run wrote %d rows of logits and %d ids (want %d and %d)", rows ? (int)(bytes / (V * 4))
               : 0, n_ids, np + steps - 1, np + steps)) {
        for (int j = np; j < np + steps; j++) { /* token j was drawn from the logits of row j - 1 */
            const float *row = rows + (size_t)(j - 1) * V;
            int rank = 0; /* how many tokens had a higher logit */
            for (int v = 0; v < V; v++) rank += row[v] > row[ids[j]];
            worst = rank > worst ? rank : worst;
            if (rank >= 5 && outside < 0) { outside = j; outside_rank = rank + 1; }
        }
        if (outside >= 0)
            expect(0, "exercise 5, command line: --topk 5, yet step %d drew token %d, number %d by logit: it should not "
                   "have been drawn (does the flag reach the sampler?)", outside - np + 1, ids[outside], outside_rank);
        else
            expect(worst == 4, "exercise 5, command line: with --topk 5 all %d drawn tokens are among the 5 most likely "
                   "and the 5th comes up (the least likely drawn: number %d by logit)", steps, worst + 1);
    }
    free(rows);
    kvt_engine_free(e);
    kvt_model_free(&m);
}
#elif KVT_EXERCISE == 6 /* measure where the cache wins by 10x */
/* Timing that gives the same verdict on a quiet and on a busy machine:
 *  - one thread (omp_set_num_threads(1)): with two, the recompute's row loops
 *    (rope, kv write, §10) start an OpenMP team from 9 rows on, whose start
 *    costs more than this tiny model's rows (the cache-off column more than
 *    doubled from 8 to 12 positions; the sgemm of 32 rows and more, §9, too),
 *    and a busy machine delays the team's second thread by whole time slices;
 *  - every position from 1 to 128 (then every 8th), and each one timed
 *    EX6_REPS times, all positions in each round, in a new order each
 *    round: a burst of load, even a periodic one, lands on a few positions
 *    of one round, and the median of each position's rounds drops it;
 *  - the crossover and the accepted range are read off the whole measured
 *    curve (ex6_first_from), not off one position. */
#define EX6_REPS 15
static int ex6_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* The position from which the cached step is at least `times` faster: the
 * split of the measured positions into "below" and "from it on" that the
 * fewest medians contradict (a stray slow or fast position does not move it).
 * -1: the cache never wins that much up to the last position measured. */
static int ex6_first_from(const int *pos, const double *ratio, int np, double times) {
    int best = 0, wrong = 0; /* split k: positions 0 .. k-1 below, k .. np-1 from it on */
    for (int i = 0; i < np; i++) wrong += ratio[i] < times; /* k = 0: every one should be >= times */
    for (int k = 1, w = wrong; k <= np; k++) {
        w += ratio[k - 1] < times ? -1 : 1; /* position k - 1 moves to "below" */
        if (w < wrong) { wrong = w; best = k; } /* the first of equally good splits */
    }
    return best < np ? pos[best] : -1;
}
static void exercise_check(void) {
    const char *ans = getenv("KVT_ANSWER");
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(16, 1, 2, 1, 32, 20, 256), 19) == KVT_OK);
    kvt_options on, off;
    kvt_options_default(&on);
    on.device = KVT_CPU;
    on.prefix_reuse = 0;
    off = on;
    off.kv_cache = 0;
    int threads = omp_get_max_threads(), toks[256], pos[160], np = 0;
    for (int T = 1; T <= 250; T += T < 128 ? 1 : 8) pos[np++] = T;
    double *t_on = (double *)kvt_malloc((size_t)EX6_REPS * np * sizeof(double));
    double *t_off = (double *)kvt_malloc((size_t)EX6_REPS * np * sizeof(double)), med[2][160], ratio[160];
    float lg[20];
    kvt_fake_tokens(toks, 256, 20);
    kvt_engine *e_on, *e_off;
    kvt_seq s_on, s_off;
    KVT_ASSERT(kvt_engine_create(&e_on, &m, &on) == KVT_OK && kvt_engine_create(&e_off, &m, &off) == KVT_OK);
    kvt_seq_init(e_on, &s_on);
    kvt_seq_init(e_off, &s_off);
    omp_set_num_threads(1);
    int order[160];
    uint64_t shuffle = 6;
    for (int i = 0; i < np; i++) order[i] = i;
    for (int rep = 0; rep < EX6_REPS; rep++)
        for (int n = np; n > 0; n--) { /* this round's positions, in a new order (Fisher-Yates) */
            int j = (int)(kvt_rng_f32(&shuffle) * (float)n), i = order[j < n ? j : n - 1];
            order[j < n ? j : n - 1] = order[n - 1];
            order[n - 1] = i;
            int T = pos[i];
            kvt_seq_reset(e_on, &s_on); /* cache on: positions 0 .. T-2 cached, then the step at T-1 */
            if (T > 1) KVT_ASSERT(kvt_forward(e_on, &s_on, toks, T - 1, lg, 0) == KVT_OK);
            else { /* nothing to prefill: an untimed step warms the same code, as a prefill does */
                KVT_ASSERT(kvt_step(e_on, &s_on, toks, 1, lg) == KVT_OK);
                kvt_seq_reset(e_on, &s_on);
            }
            double t0 = kvt_now();
            KVT_ASSERT(kvt_step(e_on, &s_on, toks, T, lg) == KVT_OK);
            t_on[(size_t)i * EX6_REPS + rep] = kvt_now() - t0;
            t0 = kvt_now(); /* cache off: the same step recomputes all T positions */
            KVT_ASSERT(kvt_step(e_off, &s_off, toks, T, lg) == KVT_OK);
            t_off[(size_t)i * EX6_REPS + rep] = kvt_now() - t0;
        }
    omp_set_num_threads(threads);
    for (int i = 0; i < np; i++) {
        qsort(t_on + (size_t)i * EX6_REPS, EX6_REPS, sizeof(double), ex6_cmp);
        qsort(t_off + (size_t)i * EX6_REPS, EX6_REPS, sizeof(double), ex6_cmp);
        med[0][i] = t_on[(size_t)i * EX6_REPS + EX6_REPS / 2];
        med[1][i] = t_off[(size_t)i * EX6_REPS + EX6_REPS / 2];
        ratio[i] = med[1][i] / med[0][i];
    }
    printf("exercise 6: microseconds per step on one CPU thread (median of %d), model --random 16,1,2,1,32,20,256\n"
           "%8s %10s %10s %8s\n", EX6_REPS, "position", "cache on", "cache off", "off/on");
    int shown[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 248}; /* of the np measured */
    for (int i = 0, k = 0; i < np && k < 16; i++)
        if (pos[i] == shown[k]) {
            printf("%8d %10.1f %10.1f %8.1f\n", pos[i], 1e6 * med[0][i], 1e6 * med[1][i], ratio[i]);
            k++;
        }
    /* The verdict: a factor 2 either side of 10x, read off this machine's
     * curve: the answer is accepted where the cache wins by 5x to 20x. */
    int cross = ex6_first_from(pos, ratio, np, 10.0), lo = ex6_first_from(pos, ratio, np, 5.0);
    int hi = ex6_first_from(pos, ratio, np, 20.0), guess = ans ? atoi(ans) : -1;
    if (hi < 0) hi = pos[np - 1];
    printf("measured: from position %d on, the cached step is more than 10x faster than recomputing\n"
           "(5x from position %d, 20x from %d: the answers accepted, a factor 2 either side of 10x)\n", cross, lo, hi);
    int ok = ans && cross > 0 && lo > 0 && guess >= lo && guess <= hi;
    expect(ok, "exercise 6: your answer KVT_ANSWER=%s %s between %d and %d, where the cache wins by 5x to 20x (measured "
           "10x crossover: %d)", ans ? ans : "(unset)", ok ? "is" : "is NOT", lo, hi, cross);
    kvt_seq_free(e_on, &s_on);
    kvt_seq_free(e_off, &s_off);
    kvt_engine_free(e_on);
    kvt_engine_free(e_off);
    free(t_on);
    free(t_off);
    kvt_model_free(&m);
}
#endif
#endif

// ---- --chat, llama2.c's command line, --dump-attn ----------------------------------------------

/* The "[stats] turn K: reused R cached positions, computed C (" figures of each
 * turn of a --chat --stats run, in order; returns the number of turns found. */
static int chat_stats(const char *out, int *reused, long *computed, int cap) {
    int n = 0;
    for (const char *p = out; n < cap && (p = strstr(p, "[stats] turn ")) != NULL; p++) {
        int k;
        if (sscanf(p, "[stats] turn %d: reused %d cached positions, computed %ld (", &k, &reused[n], &computed[n]) == 3 &&
            k == n + 1)
            n++;
    }
    return n;
}
/* A --chat run against one run over its whole transcript: the chat's
 * --dump-tokens (the transcript) go back in as --tokens with -n 0 and
 * --kv-cache off (every position computed in one pass, nothing kept from a
 * turn before), and every row of the two --dump-logits must agree within
 * TOL_E2E. flags: the chat's (the reference gets the same --kv-dtype, --attn and
 * --device); turns: the input file. Returns the transcript's length (0 on a
 * failure), its ids in ids (cap). */
static int chat_vs_whole(const char *what, const char *model, const char *flags, const char *turns, int V, int *ids,
                         int cap, char *out, size_t out_cap) {
    char args[4096], idarg[2048], ref[1024] = ""; /* cli_run takes 4 KB of arguments */
    const char *lp = tmp_file("chat.f32"), *tp = tmp_file("chat.txt"), *rp = tmp_file("whole.f32");
    snprintf(args, sizeof(args), "%s %s --chat --stats --dump-logits %s --dump-tokens %s < %s", model, flags, lp, tp,
             turns);
    int rc = cli_run(args, out, out_cap), n = read_ints(tp, ids, cap);
    /* the reference keeps the flags that change the arithmetic, and drops those of the chat */
    const char *keep[] = {"--kv-dtype", "--attn", "--device", "--kv-group"};
    char fl[512];
    snprintf(fl, sizeof(fl), "%s", flags);
    for (char *w = strtok(fl, " "); w; w = strtok(NULL, " ")) {
        int k = 0;
        for (size_t j = 0; j < sizeof(keep) / sizeof(keep[0]); j++) k |= !strcmp(w, keep[j]);
        char *val = k ? strtok(NULL, " ") : NULL;
        if (val) snprintf(ref + strlen(ref), sizeof(ref) - strlen(ref), " %s %s", w, val);
    }
    ids_arg(idarg, sizeof(idarg), ids, n);
    snprintf(args, sizeof(args), "%s --tokens %s -n 0 --kv-cache off%s --dump-logits %s", model, idarg, ref, rp);
    char out2[4096];
    int rc2 = n > 0 ? cli_run(args, out2, sizeof(out2)) : -1;
    size_t b1 = 0, b2 = 0;
    float *chat = (float *)read_all(lp, &b1), *whole = (float *)read_all(rp, &b2);
    double worst = 0.0;
    int ok = rc == 0 && rc2 == 0 && n > 0 && chat && whole && b1 == (size_t)n * V * 4 && b2 == b1 &&
             rows_close(chat, whole, n, V, TOL_E2E, &worst);
    expect(ok, "%s: every row of the chat's logits (%d positions, all turns) = one cache-off run over the whole "
           "transcript, within TOL_E2E = %.0e (worst %.2e)", what, n, TOL_E2E, worst);
    free(chat);
    free(whole);
    remove(lp);
    remove(tp);
    remove(rp);
    return ok ? n : 0;
}

/* --chat on the default model (plain template, greedy): three turns in one
 * sequence. Each turn computes exactly its own positions (the line, its
 * newline, BOS before the first, and -n reply tokens; counted here from the
 * text) and reuses all earlier ones; the logits of every turn equal one
 * cache-off run over the transcript; with --kv-cache off the same transcript
 * comes out, and its stats say each call recomputed it. */
static void test_chat_default_model(void) {
    if (!have_kvt("--chat on the default model")) return;
    const char *lines[3] = {"ROMEO: What news?", "JULIET: None.", "ROMEO: Farewell, then."};
    const char *turns = tmp_file("turns.txt");
    char text[256], out[16384];
    snprintf(text, sizeof(text), "%s\n%s\n\n%s\n", lines[0], lines[1], lines[2]); /* an empty line is no turn */
    write_text(turns, text, strlen(text));
    int V = 68, reply = 12, ids[2][512], n[2];
    for (int off = 0; off < 2; off++) {
        char flags[64], what[64];
        snprintf(flags, sizeof(flags), "-n %d -t 0%s", reply, off ? " --kv-cache off" : "");
        snprintf(what, sizeof(what), "--chat, default model, cache %s", off ? "off" : "on");
        n[off] = chat_vs_whole(what, "", flags, turns, V, ids[off], 512, out, sizeof(out));
        int reused[8], nt;
        long computed[8];
        nt = chat_stats(out, reused, computed, 8);
        if (!off) {
            int ok = nt == 3, before = 0;
            char got[256] = "";
            for (int k = 0; k < 3 && ok; k++) {
                int own = (int)strlen(lines[k]) + 1 + (k == 0) + reply; /* the line, "\n", BOS; the reply */
                ok = reused[k] == before && computed[k] == own;
                snprintf(got + strlen(got), sizeof(got) - strlen(got), " turn %d: reused %d computed %ld (want %d, %d);",
                         k + 1, reused[k], computed[k], before, own);
                before += own;
            }
            expect(ok && n[0] == before, "--chat --stats: each turn computes its own positions and reuses the cached "
                   "rest:%s transcript %d", got, n[0]);
            /* turn 3's price of recomputing the transcript: its positions at
             * the prefill rate the line states (checked as arithmetic: the
             * figures themselves are timings) */
            const char *est = strstr(out, "[stats] turn 3: ");
            est = est ? strstr(est, "instead: about ") : NULL;
            double ms_est = -1, rate = -1;
            int npos = -1;
            if (est) sscanf(est, "instead: about %lf ms (an estimate: %d positions at the prefill rate measured so far, "
                            "%lf positions/s)", &ms_est, &npos, &rate);
            expect(npos == before && rate > 0 && fabs(ms_est - 1e3 * npos / rate) <= 0.01 + 1e-3 * ms_est,
                   "--chat --stats: recomputing the transcript is priced at the measured prefill rate: %d positions at "
                   "%.1f positions/s, about %.2f ms", npos, rate, ms_est);
            /* the transcript: BOS, then turn 1's characters as the default tokenizer has them */
            kvt_tokenizer tk;
            int want[64], nw = 0;
            KVT_ASSERT(kvt_tokenizer_load(&tk, "weights/tokenizer.bin", V) == KVT_OK);
            snprintf(text, sizeof(text), "%s\n", lines[0]);
            KVT_ASSERT(kvt_encode(&tk, text, 1, want, 64, &nw) == KVT_OK);
            kvt_tokenizer_free(&tk);
            expect(n[0] > nw && !memcmp(ids[0], want, (size_t)nw * sizeof(int)), "--chat plain: the transcript starts "
                   "with BOS and turn 1's %d characters and its newline, as is", nw - 2);
        } else {
            expect(contains(out, "[stats] turn 3: --kv-cache off: reused 0") && contains(out, "(measured)"),
                   "--chat --kv-cache off --stats: each turn says it recomputed the transcript, measured");
        }
    }
    expect(n[0] == n[1] && n[0] > 0 && !memcmp(ids[0], ids[1], (size_t)n[0] * sizeof(int)),
           "--chat: the same transcript with the cache kept and with --kv-cache off (%d, %d positions)", n[0], n[1]);
    /* --trace: the chunk table grows turn by turn (turn 2 starts where turn 1's reply ended: 31 cached) */
    int rc = cli_run("--chat -n 12 -t 0 --chunk 8 --trace @T/chat_trace.txt < @T/turns.txt", out, sizeof(out));
    size_t len = 0;
    char *trace = read_all(tmp_file("chat_trace.txt"), &len);
    expect(rc == 0 && trace && contains(trace, "== after turn 2: seq 0, 14 new positions (the turn), 31 read from the "
                                               "cache\nseq 0 [ 0 1 2 3 4 5 (5/8) ] len 45\n") &&
           contains(trace, "== after turn 3, the reply's last token: seq 0, position 91\n"),
           "--chat --trace: the table after each call, growing by turns (45 positions after turn 2's prefill)");
    free(trace);
    remove(tmp_file("chat_trace.txt"));
    /* what the user sees: each turn echoed from the pipe, then its continuation */
    rc = cli_run_to("--chat -n 4 -t 0 < @T/turns.txt", 1, out, sizeof(out));
    expect(rc == 0 && !strncmp(out, "ROMEO: What news?\n", 18) && contains(out, "\nJULIET: None.\n"),
           "--chat from a pipe: stdout shows each turn, then the model's continuation");
    remove(turns);
}

/* --chat on a random model: each line of stdin is a turn of token ids. Every
 * cache type, both attention paths, the emulated GPU and --kv-cache off give
 * the logits of one run over the transcript; each turn computes its own ids
 * plus -n reply tokens. */
static void test_chat_random(void) {
    if (!have_kvt("--chat on a random model")) return;
    const char *model = "--random 64,2,4,2,128,100,64", *turns = tmp_file("idturns.txt");
    write_text(turns, "1,5,7,9\n12, 3\n40,41,42,43,44,45,46\n", 35);
    const int own[3] = {4, 2, 7}, reply = 5;
    const char *configs[] = {"", "--attn naive", "--kv-dtype fp16 --chunk 4", "--kv-dtype int8", "--device gpu",
                             "--device gpu --attn naive --kv-dtype int8", "--kv-cache off --chunk 3"};
    for (size_t i = 0; i < sizeof(configs) / sizeof(configs[0]); i++) {
        char flags[128], what[128], out[16384];
        if (strstr(configs[i], "gpu") && !kvt_gpu_available()) { skip("--chat --device gpu: no CUDA device"); continue; }
        int ids[128];
        snprintf(flags, sizeof(flags), "-n %d -t 0 %s", reply, configs[i]);
        snprintf(what, sizeof(what), "--chat --random, '%s'", configs[i]);
        int n = chat_vs_whole(what, model, flags, turns, 100, ids, 128, out, sizeof(out)), reused[8], before = 0, ok;
        long computed[8];
        int nt = chat_stats(out, reused, computed, 8);
        ok = n == 3 * reply + 13 && ids[0] == 1 && ids[4 + reply] == 12 && ids[4 + reply + 2 + reply] == 40;
        if (strstr(configs[i], "--kv-cache off")) {
            expect(ok, "%s: the transcript is turn 1's ids, 5 reply ids, turn 2's, 5, turn 3's, 5 (%d positions)",
                   what, n);
            continue;
        }
        ok &= nt == 3;
        for (int k = 0; k < nt && ok; k++) {
            ok = reused[k] == before && computed[k] == own[k] + reply;
            before += own[k] + reply;
        }
        expect(ok, "%s: transcript = the turns' ids with 5 reply ids after each; turn k computes its ids + 5, "
               "reuses the rest", what);
    }
    remove(turns);
}

/* The templates' token ids, by hand. The test's vocabulary: <unk> <s> </s>,
 * "\n" at id 3, then the printable ASCII characters ' '..'~' at ids 4..98 (so
 * character c is id c - 28), on a random model of that vocabulary. With -n 0
 * a chat is its turns alone, so the whole transcript is known in advance. */
static void chat_tok_file(const char *path, const char *bos, const char *eos) {
    FILE *f = fopen(path, "wb");
    KVT_ASSERT(f);
    int maxlen = 16;
    fwrite(&maxlen, 4, 1, f);
    put_piece(f, "<unk>", 0);
    put_piece(f, bos, 0);
    put_piece(f, eos, 0);
    put_piece(f, "\n", 0);
    for (int ch = ' '; ch <= '~'; ch++) {
        char piece[2] = {(char)ch, 0};
        put_piece(f, piece, 0);
    }
    fclose(f);
}
/* want: the expected transcript, "<s>" and "</s>" as the markers at ids 1
 * and 2 (whatever the file spells them) and every other character as itself;
 * -> ids. */
static int chat_ids(const char *want, int *ids) {
    int n = 0;
    for (const char *p = want; *p;) {
        if (!strncmp(p, "<s>", 3)) { ids[n++] = 1; p += 3; }
        else if (!strncmp(p, "</s>", 4)) { ids[n++] = 2; p += 4; }
        else { ids[n++] = *p == '\n' ? 3 : *p - 28; p++; }
    }
    return n;
}
static void chat_expect_ids(const char *what, const char *flags, const char *want) {
    char args[1024], out[8192];
    int got[1024], exp_ids[1024];
    snprintf(args, sizeof(args), "-m @T/chat.bin -z @T/chat_tok.bin --chat -n 0 %s --dump-tokens @T/chat_ids.txt "
             "< @T/chat_turns.txt", flags);
    int rc = cli_run(args, out, sizeof(out)), n = read_ints(tmp_file("chat_ids.txt"), got, 1024);
    int ne = chat_ids(want, exp_ids), first = 0;
    while (first < n && first < ne && got[first] == exp_ids[first]) first++;
    expect(rc == 0 && n == ne && first == n, "--chat %s: the transcript's %d ids are the hand-written %d (first "
           "difference at %d)", what, n, ne, first);
}
static void test_chat_templates(void) {
    if (!have_kvt("--chat templates")) return;
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 1, 4, 2, 64, 99, 256), 5) == KVT_OK);
    KVT_ASSERT(write_checkpoint(tmp_file("chat.bin"), &m, 0, 0));
    kvt_model_free(&m);
    chat_tok_file(tmp_file("chat_tok.bin"), "<s>", "</s>");
    write_text(tmp_file("chat_turns.txt"), "hi\nyo\n", 6);
    chat_expect_ids("--template llama2 -y 'Be brief.'", "--template llama2 -y 'Be brief.'",
                    "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nhi [/INST]<s>[INST] yo [/INST]");
    chat_expect_ids("--template llama2", "--template llama2", "<s>[INST] hi [/INST]<s>[INST] yo [/INST]");
    chat_expect_ids("--template zephyr -y 'Be brief.'", "--template zephyr -y 'Be brief.'",
                    "<s><|system|>\nBe brief.</s>\n<|user|>\nhi</s>\n<|assistant|>\n\n<|user|>\nyo</s>\n<|assistant|>\n");
    chat_expect_ids("--template zephyr", "--template zephyr",
                    "<s><|user|>\nhi</s>\n<|assistant|>\n\n<|user|>\nyo</s>\n<|assistant|>\n");
    chat_expect_ids("--template plain -y 'Be brief.'", "--template plain -y 'Be brief.'", "<s>Be brief.\nhi\nyo\n");
    chat_expect_ids("(no --template: plain for a vocabulary without byte fallback), -i", "-i hey",
                    "<s>hey\nhi\nyo\n");
    /* a reply: llama2's turns follow whatever the model said, the end marker included */
    char out[8192];
    int got[256], first[64], n1 = chat_ids("<s>[INST] hi [/INST]", first), n2;
    int rc = cli_run("-m @T/chat.bin -z @T/chat_tok.bin --chat --template llama2 -n 3 -t 0 --dump-tokens "
                     "@T/chat_ids.txt < @T/chat_turns.txt", out, sizeof(out));
    n2 = read_ints(tmp_file("chat_ids.txt"), got, 256);
    int r = n1; /* the reply: 3 ids, or fewer ending with </s> (id 2), which stays in the transcript */
    while (r < n2 && r < n1 + 3) if (got[r++] == 2) break;
    int second[64], ns = chat_ids("<s>[INST] yo [/INST]", second), tail = n2 - r - ns; /* turn 2's reply */
    expect(rc == 0 && n2 > n1 && !memcmp(got, first, (size_t)n1 * sizeof(int)) && (r == n1 + 3 || got[r - 1] == 2) &&
           tail >= 1 && tail <= 3 && !memcmp(got + r, second, (size_t)ns * sizeof(int)),
           "--chat llama2 -n 3: turn 1, its reply (%d ids), then turn 2 from <s>, its reply (%d ids)", r - n1, tail);
    /* llama2.c's tokenizer.bin spells the markers "\n<s>\n" and "\n</s>\n": found too */
    chat_tok_file(tmp_file("chat_tok.bin"), "\n<s>\n", "\n</s>\n");
    chat_expect_ids("llama2, markers spelled as llama2.c's tokenizer.bin", "--template llama2",
                    "<s>[INST] hi [/INST]<s>[INST] yo [/INST]");
    /* ChatML, as SmolLM2's template writes it: <|im_start|> (id 1) role "\n" text <|im_end|> (id 2) "\n"; no
     * BOS; without -y the template's own system prompt; the default template once the vocabulary has <|im_start|> */
    chat_tok_file(tmp_file("chat_tok.bin"), "<|im_start|>", "<|im_end|>");
    chat_expect_ids("--template chatml -y 'Be brief.'", "--template chatml -y 'Be brief.'",
                    "<s>system\nBe brief.</s>\n<s>user\nhi</s>\n<s>assistant\n\n<s>user\nyo</s>\n<s>assistant\n");
    chat_expect_ids("--template chatml -y ''", "--template chatml -y ''",
                    "<s>user\nhi</s>\n<s>assistant\n\n<s>user\nyo</s>\n<s>assistant\n");
    chat_expect_ids("(no --template: chatml for a vocabulary with <|im_start|>; SmolLM2's system prompt)", "",
                    "<s>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face</s>\n<s>user\nhi"
                    "</s>\n<s>assistant\n\n<s>user\nyo</s>\n<s>assistant\n");
    /* a vocabulary without the marker: the template is refused, naming it */
    chat_tok_file(tmp_file("chat_tok.bin"), "<s>", "<eos>");
    cli_expect("-m @T/chat.bin -z @T/chat_tok.bin --chat --template zephyr < /dev/null", 0,
               "--template zephyr: the tokenizer has no piece '</s>' (the template's end-of-turn marker)");
    /* the default model's characters have no '[': llama2's text cannot be encoded */
    cli_expect("--chat --template llama2 < /dev/null", 0, "--template llama2: text: character '['");
    remove(tmp_file("chat.bin"));
    remove(tmp_file("chat_tok.bin"));
    remove(tmp_file("chat_ids.txt"));
    remove(tmp_file("chat_turns.txt"));
}

/* A full context ends the conversation with one line and exit status 0, after
 * what fit: a turn that does not fit, and a reply that reaches the end. Bad
 * input and flags that do not go together: one line, exit status 1. */
static void test_chat_limits(void) {
    if (!have_kvt("--chat limits")) return;
    char out[8192];
    int ids[64];
    write_text(tmp_file("full.txt"), "1,5,7\n9,3\n4,4,4,4,4,4,4,4\n", 26);
    int rc = cli_run("--random 64,2,4,2,128,100,16 --chat -n 4 -t 0 --dump-tokens @T/full_ids.txt < @T/full.txt", out,
                     sizeof(out));
    int n = read_ints(tmp_file("full_ids.txt"), ids, 64);
    expect(rc == 0 && n == 13 && contains(out, "the context is full: turn 3 is 8 positions and 3 of the 16 are left"),
           "--chat: a turn that does not fit ends the conversation, exit 0, after the %d positions that fit", n);
    rc = cli_run("--random 64,2,4,2,128,100,12 --chat -n 4 -t 0 --dump-tokens @T/full_ids.txt < @T/full.txt", out,
                 sizeof(out));
    n = read_ints(tmp_file("full_ids.txt"), ids, 64);
    expect(rc == 0 && n == 12 && contains(out, "the context is full (12 positions): the reply stops here"),
           "--chat: a reply that fills the context stops there, exit 0 (%d positions)", n);
    rc = cli_run("--random 64,2,4,2,128,100,64 --chat -n 4 -t 0 --chunk 4 --chunks 3 --dump-tokens @T/full_ids.txt "
                 "< @T/full.txt", out, sizeof(out));
    n = read_ints(tmp_file("full_ids.txt"), ids, 64);
    expect(rc == 0 && n == 12 && contains(out, "the context is full (12 positions, --chunks)"),
           "--chat: a pool of 3 chunks of 4 is a context of 12, ended the same way (%d positions)", n);
    write_text(tmp_file("bad.txt"), "1,2\nx,1\n", 8);
    cli_expect("--random 64,2,4,2,128,100,64 --chat -n 2 < @T/bad.txt", 0,
               "--chat: turn skipped (a line of token ids): --tokens 'x,1': item 1 is not a token id");
    write_text(tmp_file("bad.txt"), "ROMEO\xc3\xa9\n", 8);
    cli_expect("--chat -n 2 < @T/bad.txt", 0, "--chat: turn skipped: text: character");
    /* a turn the vocabulary cannot encode (a tab) is skipped: the next is answered, and the exit is 1 */
    write_text(tmp_file("bad.txt"), "hi\na\tb\nbye\n", 11);
    rc = cli_run("--chat -n 2 -t 0 --dump-tokens @T/skip_ids.txt < @T/bad.txt", out, sizeof(out));
    expect(rc != 0 && contains(out, "turn skipped: text: character '\\x09'") && contains(out, "\nbye\n") &&
           contains(out, "1 turn(s) skipped"), "--chat: an unencodable turn 2 is skipped, turn 3 answered, exit 1: %.300s", out);
    /* a first turn that cannot fit is an error: nothing was answered */
    char *long_turn = (char *)kvt_malloc(5000);
    memset(long_turn, 'a', 5000);
    long_turn[599] = '\n';
    write_text(tmp_file("bad.txt"), long_turn, 600);
    cli_expect("--chat -n 2 < @T/bad.txt", 0, "--chat: turn 1 is 601 positions and the context holds 512: nothing can "
               "be answered");
    long_turn[599] = 'a';
    write_text(tmp_file("bad.txt"), long_turn, 5000); /* no newline, longer than any turn that fits */
    cli_expect("--chat -n 2 < @T/bad.txt", 0, "--chat: standard input line 1: longer than 4160 bytes");
    memset(long_turn, 0, 5000); /* /dev/zero's kind of input: refused at its first byte */
    write_text(tmp_file("bad.txt"), long_turn, 5000);
    cli_expect("--chat -n 2 < @T/bad.txt", 0, "--chat: standard input line 1: a NUL byte");
    free(long_turn);
    cli_expect("--chat --fork 2", 0, "--chat is a conversation in one sequence: drop --prompts, --fork");
    cli_expect("--chat --tokens 1,2", 0, "--chat reads its turns from standard input");
    cli_expect("--template zephyr", 0, "--template and -y/--system shape a conversation: add --chat");
    cli_expect("-y hello", 0, "--template and -y/--system shape a conversation: add --chat");
    cli_expect("--random 64,2,4,2,128,100,64 --chat --template llama2", 0, "a --random model chats with --template plain");
    cli_expect("--random 64,2,4,2,128,100,64 --chat -y hi", 0, "a --random model has no tokenizer");
    cli_expect("--chat --mode generate", 0, "--chat and --mode generate contradict each other");
    cli_expect("--mode talk", 0, "--mode 'talk': expected one of generate|chat");
    cli_expect("-m chat", 0, "-m chat: -m names the checkpoint here; llama2.c's -m chat is --mode chat (or --chat)");
    cli_expect("weights/model.bin -m weights/model.bin", 0, "the checkpoint is given twice");
    remove(tmp_file("full.txt"));
    remove(tmp_file("full_ids.txt"));
    remove(tmp_file("bad.txt"));
}

/* llama2.c's README commands, with this binary and the default model in place
 * of ./run and theirs: the checkpoint as the first argument, -t -n -i -z -y,
 * and its chat mode spelled --mode chat. Each runs and exits 0. */
static void test_llama2c_commands(void) {
    if (!have_kvt("llama2.c's commands")) return;
    write_text(tmp_file("say.txt"), "ROMEO: Good morrow.\n", 20);
    const char *cmds[] = {
        "weights/model.bin",                                              /* ./run stories15M.bin */
        "weights/model.bin -t 0.8 -n 256 -i \"One day, Lily met a Shoggoth\"", /* ./run stories42M.bin -t 0.8 ... */
        "weights/model.bin -z weights/tokenizer.bin -t 0.0",              /* ./run model.bin -z tok.bin ... */
        "weights/model.bin --mode chat < @T/say.txt",                     /* ./run llama2_7b_chat.bin -m chat */
        "weights/model.bin --mode chat -y \"KING HENRY:\" -i \"Once more\" < /dev/null", /* ... -m chat -y -i */
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        char out[16384];
        int rc = cli_run_to(cmds[i], 1, out, sizeof(out));
        expect(rc == 0 && strlen(out) > 20, "llama2.c's command line: kvt %s: exit 0, %zu bytes of text", cmds[i],
               strlen(out));
    }
    remove(tmp_file("say.txt"));
}

/* --dump-attn's CSV into [query][layer][head][key] (NAN where absent): the
 * number of lines read, or -1 for a malformed line or an index out of range. */
#define ATT_Q 16
#define ATT_L 4
#define ATT_H 8
static int attn_read(const char *path, float *w) {
    for (int i = 0; i < ATT_Q * ATT_L * ATT_H * ATT_Q; i++) w[i] = NAN;
    FILE *f = fopen(path, "r");
    char head[64];
    if (!f || !fgets(head, sizeof(head), f) || strcmp(head, "query,layer,head,key,weight\n")) { if (f) fclose(f); return -1; }
    int q, l, h, k, n = 0;
    float v;
    while (fscanf(f, "%d,%d,%d,%d,%f", &q, &l, &h, &k, &v) == 5) {
        if (q < 0 || q >= ATT_Q || l < 0 || l >= ATT_L || h < 0 || h >= ATT_H || k < 0 || k > q) { n = -1; break; }
        w[((q * ATT_L + l) * ATT_H + h) * ATT_Q + k] = v;
        n++;
    }
    fclose(f);
    return n;
}
/* The weights of the layer-0 attention of the default model in float64,
 * computed here from the checkpoint alone: embedding, rmsnorm, wq and wk,
 * RoPE (adjacent pairs, theta^(-2i/HS) with the model's base theta), q.k /
 * sqrt(HS), softmax over the keys 0..p. out [p][h][t] for p < n. */
static void attn_layer0_ref(const kvt_model *m, const int *tok, int n, double *out) {
    int D = m->c.dim, NH = m->c.n_heads, NKV = m->c.n_kv_heads, HS = m->head_size, KVD = m->kv_dim;
    double *q = (double *)kvt_malloc((size_t)n * D * sizeof(double)), *k = (double *)kvt_malloc((size_t)n * KVD * sizeof(double));
    double *xb = (double *)kvt_malloc((size_t)D * sizeof(double));
    for (int p = 0; p < n; p++) {
        const float *x = m->w.token_embedding + (size_t)tok[p] * D;
        double ss = 0;
        for (int c = 0; c < D; c++) ss += (double)x[c] * x[c];
        for (int c = 0; c < D; c++) xb[c] = m->w.rms_att[c] * (x[c] / sqrt(ss / D + 1e-5));
        for (int o = 0; o < D; o++) {
            double acc = 0;
            for (int c = 0; c < D; c++) acc += m->w.wq[(size_t)o * D + c] * xb[c];
            q[(size_t)p * D + o] = acc;
        }
        for (int o = 0; o < KVD; o++) {
            double acc = 0;
            for (int c = 0; c < D; c++) acc += m->w.wk[(size_t)o * D + c] * xb[c];
            k[(size_t)p * KVD + o] = acc;
        }
        for (int o = 0; o < D + KVD; o += 2) { /* rotate each adjacent pair by p * theta^(-2i/HS) */
            double *v = o < D ? q + (size_t)p * D + o : k + (size_t)p * KVD + (o - D);
            double a = p * pow((double)m->rope_theta, -(double)(o % HS) / HS), x0 = v[0], x1 = v[1];
            v[0] = x0 * cos(a) - x1 * sin(a);
            v[1] = x0 * sin(a) + x1 * cos(a);
        }
    }
    for (int p = 0; p < n; p++)
        for (int h = 0; h < NH; h++) {
            double *o = out + ((size_t)p * NH + h) * n, mx = -INFINITY, z = 0;
            for (int t = 0; t <= p; t++) {
                double s = 0;
                for (int c = 0; c < HS; c++) s += q[(size_t)p * D + h * HS + c] * k[(size_t)t * KVD + (h / (NH / NKV)) * HS + c];
                o[t] = s / sqrt((double)HS);
                mx = fmax(mx, o[t]);
            }
            for (int t = 0; t <= p; t++) z += (o[t] = exp(o[t] - mx));
            for (int t = 0; t <= p; t++) o[t] /= z;
        }
    free(q);
    free(k);
    free(xb);
}
/* The probe of the API test: layer 0's rows, kept by position. */
typedef struct { double *w; int n, NH, rows; } attn_capture;
static void attn_capture_rows(void *ctx, int layer, int n, const int *pos, const float *w, int NH, int TMAX) {
    attn_capture *c = (attn_capture *)ctx;
    KVT_ASSERT(layer == 0 && NH == c->NH);
    for (int r = 0; r < n; r++) {
        KVT_ASSERT(pos[r] < c->n);
        for (int h = 0; h < NH; h++)
            for (int t = 0; t <= pos[r]; t++) c->w[((size_t)pos[r] * NH + h) * c->n + t] = w[((size_t)r * NH + h) * TMAX + t];
        c->rows++;
    }
}
/* The engine's layer-0 weights against ref (attn_layer0_ref's layout) on one
 * path (0 cpu naive, 1 cpu fused, 2 gpu naive, 3 gpu fused): a prefill of
 * `prefill` rows, then one token a step up to n. The largest difference (NaN
 * for a row never handed over); *rows: the rows the probe saw. */
static double probe_vs_ref(kvt_model *m, const int *tok, int n, int prefill, int path, const double *ref, int *rows) {
    int NH = m->c.n_heads;
    kvt_options o;
    kvt_options_default(&o);
    o.device = path >= 2 ? KVT_GPU : KVT_CPU;
    o.attn = path % 2 ? KVT_ATTN_FUSED : KVT_ATTN_NAIVE;
    attn_capture c = {(double *)kvt_malloc((size_t)n * NH * n * sizeof(double)), n, NH, 0};
    for (size_t i = 0; i < (size_t)n * NH * n; i++) c.w[i] = NAN;
    o.attn_probe = attn_capture_rows;
    o.attn_ctx = &c;
    o.attn_layer = 0;
    float *logits = (float *)kvt_malloc((size_t)m->c.vocab_size * sizeof(float));
    kvt_engine *e;
    kvt_seq s;
    KVT_ASSERT(kvt_engine_create(&e, m, &o) == KVT_OK && kvt_seq_init(e, &s) == KVT_OK);
    KVT_ASSERT(kvt_forward(e, &s, tok, prefill, logits, 0) == KVT_OK);
    for (int p = prefill; p < n; p++) KVT_ASSERT(kvt_forward(e, &s, tok + p, 1, logits, 0) == KVT_OK);
    double worst = 0;
    for (int p = 0; p < n; p++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t <= p; t++) {
                double d = fabs(c.w[((size_t)p * NH + h) * n + t] - ref[((size_t)p * NH + h) * n + t]);
                worst = d > worst || d != d ? d : worst; /* a NaN (a row never handed over) stays */
            }
    *rows = c.rows;
    kvt_seq_free(e, &s);
    kvt_engine_free(e);
    free(c.w);
    free(logits);
    return worst;
}
static void test_dump_attn(void) {
    /* the engine's probe against the float64 layer 0, on every path: a prefill of 6 rows, then 4 decode steps */
    kvt_model m;
    KVT_ASSERT(kvt_model_load(&m, "weights/model.bin") == KVT_OK);
    int tok[10] = {1, 30, 27, 25, 27, 26, 17, 3, 34, 53}, n = 10, NH = m.c.n_heads;
    double *ref = (double *)kvt_malloc((size_t)n * NH * n * sizeof(double));
    attn_layer0_ref(&m, tok, n, ref);
    for (int path = 0; path < 4; path++) {
        if (path >= 2 && !kvt_gpu_available()) { skip("attention probe on the GPU: no CUDA device"); continue; }
        int rows;
        double worst = probe_vs_ref(&m, tok, n, 6, path, ref, &rows);
        expect(rows == n && worst <= TOL_ATTN, "attention probe, %s %s, default model: layer 0's weights of %d rows "
               "(6 prefill + 4 decode) = float64 from the checkpoint within TOL_ATTN = %.0e (worst %.2e)",
               path >= 2 ? "gpu" : "cpu", path % 2 ? "fused" : "naive", rows, TOL_ATTN, worst);
    }
    free(ref);
    kvt_model_free(&m);
    if (!have_kvt("--dump-attn on the command line")) return;
    /* the command line: 7 prompt positions + 5 generated = 12 rows, every layer and head */
    size_t cells = (size_t)ATT_Q * ATT_L * ATT_H * ATT_Q;
    float *w[4];
    const char *runs[4] = {"--attn naive", "--attn fused", kvt_gpu_available() ? "--device gpu --kv-cache off" :
                           "--kv-cache off", "--dump-attn-layer 2"};
    int lines[4], rows = 12, want_lines = 0;
    for (int q = 0; q < rows; q++) want_lines += ATT_L * ATT_H * (q + 1);
    for (int i = 0; i < 4; i++) {
        char args[256], out[4096];
        snprintf(args, sizeof(args), "-n 6 -t 0 %s --dump-attn @T/attn.csv", runs[i]);
        int rc = cli_run(args, out, sizeof(out));
        w[i] = (float *)kvt_malloc(cells * sizeof(float));
        lines[i] = rc == 0 ? attn_read(tmp_file("attn.csv"), w[i]) : -1;
    }
    double worst_sum = 0;
    int complete = 1;
    for (int q = 0; q < ATT_Q; q++)
        for (int l = 0; l < ATT_L; l++)
            for (int h = 0; h < ATT_H; h++) {
                double sum = 0;
                int have = 0;
                for (int k = 0; k <= q; k++) {
                    float v = w[0][((q * ATT_L + l) * ATT_H + h) * ATT_Q + k];
                    if (v == v) { sum += v; have++; }
                }
                complete &= have == (q < rows ? q + 1 : 0);
                if (have) worst_sum = fmax(worst_sum, fabs(sum - 1.0));
            }
    expect(lines[0] == want_lines && complete && worst_sum <= TOL_OP, "--dump-attn naive: %d lines, every layer and head "
           "of the %d rows, keys 0..query; each row sums to 1 within TOL_OP = %.0e (worst %.2e)", lines[0], rows, TOL_OP,
           worst_sum);
    /* TOL_ATTN: the naive and fused runs differ only in rounding, which reaches later layers' q and K */
    for (int i = 1; i < 4; i++) {
        double worst = 0;
        int same = 1;
        for (size_t c = 0; c < cells; c++) {
            int layer = (int)(c / ATT_Q / ATT_H % ATT_L);
            float a = w[0][c], b = w[i][c];
            if (i == 3 && layer != 2) { same &= b != b; continue; } /* only layer 2 was asked for */
            if ((a == a) != (b == b)) same = 0;
            else if (a == a) worst = fmax(worst, fabs((double)a - b));
        }
        expect(lines[i] == (i == 3 ? want_lines / ATT_L : want_lines) && same && worst <= TOL_ATTN,
               "--dump-attn %s: the same rows as --attn naive, weights within TOL_ATTN = %.0e (worst %.2e)", runs[i],
               TOL_ATTN, worst);
    }
    for (int i = 0; i < 4; i++) free(w[i]);
    cli_expect("--dump-attn-layer 4 --dump-attn @T/attn.csv", 0, "--dump-attn-layer 4: this model's layers are 0..3");
    cli_expect("--dump-attn-layer 1", 0, "--dump-attn-layer and --dump-attn-max shape --dump-attn: add --dump-attn FILE");
    cli_expect("--fork 2 --dump-attn @T/attn.csv", 0, "--dump-attn records one sequence's run");
    cli_expect("--dump-attn /nonexistent-dir/a.csv", 0, "--dump-attn: cannot write '/nonexistent-dir/a.csv'");
    remove(tmp_file("attn.csv"));
}

/* The RoPE base a checkpoint carries (§4's "rope" extension): a random model
 * written with base 500000 loads with that base and unchanged weights, and the
 * engine's layer-0 attention, on every path, equals float64 with base 500000
 * (and is far from base 10000's, so a base that was ignored fails here). A
 * damaged extension is refused; a llama2.c file loads as base 10000, its
 * weights byte for byte the file's. */
static void test_rope_base(void) {
    kvt_model m, m2;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, 2, 4, 2, 96, 97, 64), 41) == KVT_OK);
    expect(m.rope_theta == 10000.0f, "random model: RoPE base 10000 (%g)", m.rope_theta);
    const char *p = tmp_file("rope.bin");
    struct { char magic[4]; float theta; } ext = {{'r', 'o', 'p', 'e'}, 500000.0f};
    kvt_config hdr = m.c; /* as write_checkpoint writes it: a negative V for the unshared classifier */
    hdr.vocab_size = m.shared_classifier ? hdr.vocab_size : -hdr.vocab_size;
    FILE *f = fopen(p, "wb");
    KVT_ASSERT(f && fwrite(&hdr, sizeof(hdr), 1, f) == 1 && fwrite(&ext, 8, 1, f) == 1 &&
               fwrite(m.data, 4, m.n_floats, f) == m.n_floats && fclose(f) == 0);
    kvt_status st = kvt_model_load(&m2, p);
    expect(st == KVT_OK && m2.rope_theta == 500000.0f && m2.n_floats == m.n_floats &&
           !memcmp(m2.data, m.data, m.n_floats * 4), "checkpoint with the RoPE extension: base %g, weights unchanged (%s)",
           st == KVT_OK ? m2.rope_theta : 0.0, st == KVT_OK ? "loaded" : kvt_last_error());
    if (st != KVT_OK) { kvt_model_free(&m); return; }
    int tok[12] = {1, 30, 27, 25, 27, 26, 17, 3, 34, 53, 96, 60}, n = 12, NH = m2.c.n_heads;
    double *ref = (double *)kvt_malloc((size_t)n * NH * n * sizeof(double));
    double *ref10k = (double *)kvt_malloc((size_t)n * NH * n * sizeof(double));
    attn_layer0_ref(&m2, tok, n, ref);
    m.rope_theta = 10000.0f;
    attn_layer0_ref(&m, tok, n, ref10k);
    double apart = 0; /* the weights of keys t <= q (the rest of each row is not written) */
    for (int q = 0; q < n; q++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t <= q; t++)
                apart = fmax(apart, fabs(ref[((size_t)q * NH + h) * n + t] - ref10k[((size_t)q * NH + h) * n + t]));
    expect(apart > 100 * TOL_ATTN, "RoPE base 500000 vs 10000 in float64: layer 0's weights differ by %.2e (> 100 x "
           "TOL_ATTN), so the check below can tell the bases apart", apart);
    for (int path = 0; path < 4; path++) {
        if (path >= 2 && !kvt_gpu_available()) { skip("RoPE base on the GPU: no CUDA device"); continue; }
        int rows;
        double worst = probe_vs_ref(&m2, tok, n, 7, path, ref, &rows);
        expect(rows == n && worst <= TOL_ATTN, "RoPE base 500000, %s %s: layer 0's weights of %d rows (7 prefill + "
               "5 decode) = float64 with base 500000 within TOL_ATTN = %.0e (worst %.2e)", path >= 2 ? "gpu" : "cpu",
               path % 2 ? "fused" : "naive", rows, TOL_ATTN, worst);
    }
    kvt_model_free(&m2);
    /* a damaged extension: wrong magic, a base <= 1, a NaN base, 1e30 and above (weights/kvt_files.py's
     * theta_problem refuses the same bases); the message names what failed, the magic or the base */
    struct { char magic[4]; float theta; const char *say; } bad[5] = {
        {{'r', 'o', 'p', 'f'}, 500000.0f, "are not \"rope\""}, {{'r', 'o', 'p', 'e'}, 1.0f, "base 1 is outside (1, 1e30)"},
        {{'r', 'o', 'p', 'e'}, NAN, "base nan is outside"}, {{'r', 'o', 'p', 'e'}, 1e30f, "base 1e+30 is outside"},
        {{'r', 'o', 'p', 'e'}, 1e31f, "base 1e+31 is outside"}};
    for (int b = 0; b < 5; b++) {
        f = fopen(p, "wb");
        KVT_ASSERT(f && fwrite(&hdr, sizeof(hdr), 1, f) == 1 && fwrite(&bad[b], 8, 1, f) == 1 &&
                   fwrite(m.data, 4, m.n_floats, f) == m.n_floats && fclose(f) == 0);
        st = kvt_model_load(&m2, p);
        expect(st == KVT_EFORMAT && contains(kvt_last_error(), bad[b].say), "checkpoint with a damaged RoPE extension "
               "(%.4s, %g) refused: %s", bad[b].magic, bad[b].theta, st == KVT_OK ? "loaded" : kvt_last_error());
        if (st == KVT_OK) kvt_model_free(&m2);
    }
    /* llama2.c's file: base 10000, the weights exactly the bytes after the 28-byte header */
    size_t bytes = 0;
    char *raw = read_all("weights/model.bin", &bytes);
    st = kvt_model_load(&m2, "weights/model.bin");
    expect(raw && st == KVT_OK && m2.rope_theta == 10000.0f && bytes == 28 + m2.n_floats * 4 &&
           !memcmp(raw + 28, m2.data, m2.n_floats * 4), "llama2.c checkpoint (weights/model.bin): base 10000, weights "
           "byte for byte the file's");
    if (st == KVT_OK) kvt_model_free(&m2);
    free(raw);
    free(ref);
    free(ref10k);
    kvt_model_free(&m);
}

/* SmolLM2-135M-Instruct (`make smollm2`: the GGUF converted by
 * weights/export_gguf.py) against transformers loading the same GGUF in
 * float32 (weights/smollm2_logits.txt, written once by
 * weights/make_smollm2_reference.py: per prompt its ids, per position the
 * row's largest |logit| and ~112 of its logits). Every row must agree within
 * 1e-4 of the row's largest |logit|, on paths that differ in what they reuse:
 * cache on (half prefilled, then one token a step; fused, naive, and on a
 * GPU the first prompt), cache off (one call; the first prompt one token a
 * step, every step recomputing the sequence). Without the model: one skip
 * line. KVT_SMOLLM2_DIR points at another folder. */
typedef struct { int n, *ids, *cells; double *maxabs; int *cell_id; float *cell_val; } smol_prompt;
static int smol_read_ref(const char *path, smol_prompt *pr, int max_prompts) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    static char line[16384];
    int np = 0, row = 0;
    while (fgets(line, sizeof(line), f)) {
        char *p = line, *end;
        if (!strncmp(line, "prompt ", 7) && np < max_prompts) {
            smol_prompt *q = &pr[np++];
            q->n = (int)strtol(p + 7, &end, 10);
            q->ids = (int *)kvt_malloc((size_t)q->n * sizeof(int));
            q->cells = (int *)kvt_malloc((size_t)q->n * sizeof(int));
            q->maxabs = (double *)kvt_malloc((size_t)q->n * sizeof(double));
            q->cell_id = (int *)kvt_malloc((size_t)q->n * 256 * sizeof(int));
            q->cell_val = (float *)kvt_malloc((size_t)q->n * 256 * sizeof(float));
            for (int i = 0; i < q->n; i++) q->ids[i] = (int)strtol(end, &end, 10);
            row = 0;
        } else if (!strncmp(line, "row ", 4) && np > 0 && row < pr[np - 1].n) {
            smol_prompt *q = &pr[np - 1];
            KVT_ASSERT(strtol(p + 4, &end, 10) == row);
            q->maxabs[row] = strtod(end, &end);
            int c = 0;
            while (c < 256) {
                long id = strtol(end, &p, 10);
                if (p == end || *p != ':') break;
                q->cell_id[row * 256 + c] = (int)id;
                q->cell_val[row * 256 + c++] = strtof(p + 1, &end);
            }
            q->cells[row++] = c;
        }
    }
    fclose(f);
    return np;
}
static void test_smollm2_logits(void) {
    const char *dir = getenv("KVT_SMOLLM2_DIR");
    char path[512], msg[640];
    snprintf(path, sizeof(path), "%s/model.bin", dir ? dir : "weights/smollm2");
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        snprintf(msg, sizeof(msg), "SmolLM2 logits vs transformers: no %s (get it with `make smollm2`)", path);
        skip(msg);
        return;
    }
    fclose(probe);
    smol_prompt pr[4];
    int np = smol_read_ref("weights/smollm2_logits.txt", pr, 4);
    expect(np == 3, "weights/smollm2_logits.txt: 3 prompts (%d)", np);
    kvt_model m;
    kvt_status st = kvt_model_load(&m, path);
    expect(st == KVT_OK && m.rope_theta == 100000.0f && m.c.dim == 576 && m.c.n_layers == 30 && m.c.vocab_size == 49152,
           "SmolLM2: %s loads (D 576, L 30, V 49152, RoPE base 100000): %s", path, st == KVT_OK ? "yes" : kvt_last_error());
    if (st != KVT_OK || np != 3) return;
    int V = m.c.vocab_size, maxn = 0;
    for (int i = 0; i < np; i++) maxn = pr[i].n > maxn ? pr[i].n : maxn;
    float *logits = (float *)kvt_malloc((size_t)maxn * V * sizeof(float));
    const char *names[5] = {"cache on, fused", "cache on, naive", "cache off, fused", "cache off, naive",
                            "gpu, cache on, fused"};
    for (int c = 0; c < 5; c++) {
        if (c == 4 && (KVT_EMULATED || !kvt_gpu_available())) { /* random models test the emulated kernels */
            skip("SmolLM2 on the GPU: a device only (emulated, its 135M weights take half a minute)");
            continue;
        }
        kvt_options o;
        kvt_options_default(&o);
        o.device = c == 4 ? KVT_GPU : KVT_CPU;
        o.attn = c % 2 ? KVT_ATTN_NAIVE : KVT_ATTN_FUSED;
        o.kv_cache = c == 2 || c == 3 ? 0 : 1;
        o.CH = 16;
        o.n_chunks = 4; /* 64 positions: the longest prompt is 43 */
        kvt_engine *e;
        KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
        for (int i = 0; i < np && (c < 4 || i == 0); i++) {
            kvt_seq s;
            KVT_ASSERT(kvt_seq_init(e, &s) == KVT_OK);
            /* one call for the whole prompt (cache off), a prefill of half then one token a step (cache on); the
             * first prompt with the cache off: one token a step, each step recomputing the sequence */
            int first = o.kv_cache ? pr[i].n / 2 : i == 0 ? 1 : pr[i].n;
            st = kvt_forward(e, &s, pr[i].ids, first, logits, 1);
            for (int t = first; t < pr[i].n && st == KVT_OK; t++)
                st = kvt_forward(e, &s, pr[i].ids + t, 1, logits + (size_t)t * V, 0);
            double worst = 0;
            int at = -1;
            for (int r = 0; r < pr[i].n && st == KVT_OK; r++)
                for (int k = 0; k < pr[i].cells[r]; k++) {
                    double d = fabs(logits[(size_t)r * V + pr[i].cell_id[r * 256 + k]] - pr[i].cell_val[r * 256 + k]) /
                               pr[i].maxabs[r];
                    if (!(d <= worst)) worst = d, at = r;
                }
            expect(st == KVT_OK && worst <= 1e-4, "SmolLM2 prompt %d (%d tokens), %s: every row's logits = "
                   "transformers' within 1e-4 of its largest |logit| (worst %.2e, row %d)", i + 1, pr[i].n, names[c],
                   worst, at);
            kvt_seq_free(e, &s);
        }
        kvt_engine_free(e);
    }
    for (int i = 0; i < np; i++) {
        free(pr[i].ids); free(pr[i].cells); free(pr[i].maxabs); free(pr[i].cell_id); free(pr[i].cell_val);
    }
    free(logits);
    kvt_model_free(&m);
}

// ---- fuzzing (make fuzz) ---------------------------------------------------------------------
/* Seeds for the fuzzers, made here rather than downloaded: a small valid
 * checkpoint (and a truncated one), a valid tokenizer with byte fallback and
 * merges, and a few prompts. */
static void write_bpe_tokenizer(const char *path);
static void write_fuzz_seeds(const char *dir) {
    char path[512];
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(8, 1, 2, 1, 16, 11, 8), 1) == KVT_OK);
    snprintf(path, sizeof(path), "%s/model/valid.bin", dir);
    KVT_ASSERT(write_checkpoint(path, &m, 0, 0));
    snprintf(path, sizeof(path), "%s/model/truncated.bin", dir);
    KVT_ASSERT(write_checkpoint(path, &m, 7, 0));
    kvt_model_free(&m);
    char plain[512];
    snprintf(plain, sizeof(plain), "%s/seed_tok.bin", dir);
    snprintf(path, sizeof(path), "%s/tokenizer/bpe.bin", dir); /* the fuzz target reads V from 2 bytes first */
    write_bpe_tokenizer(plain);
    FILE *in = fopen(plain, "rb"), *out = fopen(path, "wb");
    KVT_ASSERT(in && out);
    fputc((3 + 256 + 5 - 1) & 255, out); /* 1 + (263 % 600) = 264 tokens */
    fputc((3 + 256 + 5 - 1) >> 8, out);
    for (int ch; (ch = fgetc(in)) != EOF;) fputc(ch, out);
    fclose(in);
    fclose(out);
    snprintf(path, sizeof(path), "%s/tokenizer/byte_level.bin", dir); /* and a byte-level one, V = BL_V */
    write_byte_level_tokenizer(plain, bl_default(KVT_PRE_SMOLLM));
    in = fopen(plain, "rb");
    out = fopen(path, "wb");
    KVT_ASSERT(in && out);
    fputc((BL_V - 1) & 255, out);
    fputc((BL_V - 1) >> 8, out);
    for (int ch; (ch = fgetc(in)) != EOF;) fputc(ch, out);
    fclose(in);
    fclose(out);
    const char *cli[] = {"--random\n32,1,4,2,64,50,32\n-n\n5", "--random\n64,2,4,2,128,-2147483648,64",
                         "--fork\n2\n--prompts\nx", "--kv-dtype\nint8\n--kv-group\n8\n--chunk\n4", "-t\n1e-40\n--topp\n0.5",
                         "--bench\ncontext\n--bench-ctx\n100\n--csv\nx.csv", "--prompt-tokens\n3\n--split\n-1\n--attn\nnaive"};
    for (int i = 0; i < (int)(sizeof(cli) / sizeof(cli[0])); i++) {
        snprintf(path, sizeof(path), "%s/cli/c%d.txt", dir, i);
        FILE *f = fopen(path, "wb");
        KVT_ASSERT(f);
        fputs(cli[i], f);
        fclose(f);
    }
    const char *prompts[] = {"abcz", "Hello, world", "\xc3\xa9t\xc3\xa9 \xe2\x82\xac", "ab ab abc", ""};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof(path), "%s/prompt/p%d.txt", dir, i);
        FILE *f = fopen(path, "wb");
        KVT_ASSERT(f);
        fputs(prompts[i], f);
        fclose(f);
    }
}

#ifdef KVT_FUZZ
#include <unistd.h>
/* libFuzzer entry points; KVT_FUZZ selects the target: 1 checkpoint loader,
 * 2 tokenizer loader, 3 prompt encoder, 4 command-line parser. Input bytes go
 * through a file, the way a user's file does; for 4 they are the arguments,
 * one per line. */
#if KVT_FUZZ == 4
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* argv from the input: lines are arguments (a NUL ends one too) */
    char *buf = (char *)kvt_malloc(size + 1), *argv[66] = {(char *)"kvt"};
    int argc = 1;
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (char *p = buf; argc < 65 && p < buf + size;) {
        argv[argc++] = p;
        size_t n = strcspn(p, "\n");
        p[n] = '\0';
        p += n + 1;
    }
    argv[argc] = NULL;
    kvt_cli a;
    memset(&a, 0, sizeof(a));
    kvt_options_default(&a.o);
    a.prompt_tokens = 8;
    kvt_config c = {64, 128, 2, 4, 2, 100, 64}; /* the model the flags are checked against */
    if (parse_args(&a, argc, argv) == 1 && cli_check(&a, &c) == 1) {
        KVT_ASSERT(a.o.CH >= 1 && a.prompt_tokens >= 1 && a.prompt_tokens <= KVT_LIMIT_SEQ);
        KVT_ASSERT(a.o.kv_group >= 1 && (cli_gave(&a, "--kv-group") || (c.dim / c.n_heads) % a.o.kv_group == 0)); /* a given G
                                                                  is checked against HS by kvt_engine_create */
        if (a.random) KVT_ASSERT(kvt_config_check(&a.rc) == KVT_OK);
    }
    free(buf);
    return 0;
}
#else
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *path; /* a file in the run's own folder, as in make test */
    if (!path) {
        KVT_ASSERT(make_test_dir());
        atexit(remove_test_dir);
        path = tmp_file("fuzz.bin");
    }
#if KVT_FUZZ == 3
    static kvt_tokenizer tk, bl; /* the sentencepiece-style one and a byte-level one */
    static int ready = 0;
    if (!ready) {
        write_bpe_tokenizer(path);
        KVT_ASSERT(kvt_tokenizer_load(&tk, path, 3 + 256 + 5) == KVT_OK);
        write_byte_level_tokenizer(path, bl_default(KVT_PRE_SMOLLM));
        KVT_ASSERT(kvt_tokenizer_load(&bl, path, BL_V) == KVT_OK);
        ready = 1;
    }
    char *text = (char *)kvt_malloc(size + 1), *back = (char *)kvt_malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    int *toks = (int *)kvt_malloc((size + 3) * sizeof(int)), n = 0;
    if (kvt_encode(&tk, text, 1, toks, (int)size + 3, &n) == KVT_OK)
        for (int i = 1; i < n; i++) KVT_ASSERT(toks[i] >= 0 && toks[i] < tk.vocab_size && kvt_decode(&tk, toks[i - 1], toks[i]));
    KVT_ASSERT(kvt_encode(&bl, text, 1, toks, (int)size + 3, &n) == KVT_OK); /* any bytes encode */
    back[0] = '\0';
    for (int i = 0; i < n; i++) strcat(back, kvt_decode(&bl, i ? toks[i - 1] : -1, toks[i]));
    KVT_ASSERT(!strcmp(back, text)); /* and decode back to themselves */
    free(text);
    free(back);
    free(toks);
#else
    FILE *f = fopen(path, "wb");
    KVT_ASSERT(f);
    size_t skip = KVT_FUZZ == 2 && size >= 2 ? 2 : 0; /* tokenizer: the first 2 bytes pick V */
    fwrite(data + skip, 1, size - skip, f);
    fclose(f);
#if KVT_FUZZ == 1
    kvt_model m;
    if (kvt_model_load(&m, path) == KVT_OK) kvt_model_free(&m);
#else
    kvt_tokenizer tk;
    int V = skip ? 1 + (data[0] | data[1] << 8) % 600 : 1;
    if (kvt_tokenizer_load(&tk, path, V) == KVT_OK) {
        int toks[64], n;
        kvt_encode(&tk, "To be, or not to be", 1, toks, 64, &n);
        kvt_tokenizer_free(&tk);
    }
#endif
#endif
    return 0;
}
#endif
#endif

#ifndef KVT_FUZZ
/* KVT_TEST_ONLY=cli ./test_kvt ./kvt: run only the checks whose call contains
 * the text ("cli" runs test_cli, test_cli_trace, ...), for a quick loop while
 * working on one part; make test always runs them all. */
static int run_this(const char *call) {
    const char *only = getenv("KVT_TEST_ONLY");
    return !only || !*only || strstr(call, only) != NULL;
}
#define RUN(call) do { if (run_this(#call)) call; } while (0)

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--write-fuzz-seeds")) { write_fuzz_seeds(argv[2]); return 0; }
    if (argc > 1 && !strcmp(argv[1], "--lint")) { /* make lint: the style check, apart from the suite */
        test_comment_counter();
        lint_teaching_file_size();
        printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
        return n_fail != 0;
    }
    if (argc > 1) kvt_bin = argv[1];
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!make_test_dir()) return 1;
#ifdef KVT_EXERCISE
    printf("exercise %d check; GPU kernels run on: %s\n", KVT_EXERCISE, kvt_gpu_available() ? kvt_gpu_name() : "nothing");
    exercise_check();
    remove_test_dir();
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail || !n_pass ? 1 : 0;
#endif
    int gpu = kvt_gpu_available();
    printf("kvtransformer tests; GPU kernels run on: %s\n", gpu ? kvt_gpu_name() : "nothing (no CUDA device)");
    RUN(test_rmsnorm(0));
    RUN(test_matmul(0));
    RUN(test_rope(0, 10000.0));
    RUN(test_rope(0, 500000.0));
    RUN(test_swiglu_residual_embed(0));
    RUN(test_fp16());
    RUN(test_fast_formats());
    RUN(test_int8_group());
    RUN(test_attention(0));
    RUN(test_attention_ragged(0));
    RUN(test_attention_spec());
    RUN(test_threads());
    RUN(test_gpu_split_rule());
    RUN(test_cache_on_off());
    RUN(test_prefill());
    RUN(test_plain());
    RUN(test_no_alloc());
    RUN(test_quantized_e2e());
    RUN(test_fork_cow(0));
    RUN(test_batch(0));
    RUN(test_fork_sampling());
    RUN(test_prefix_reuse(0));
    RUN(test_batch_exhaustion());
    RUN(test_fork_memory());
    RUN(test_trace_scenario(0));
    RUN(test_trace_shapes());
    RUN(test_bad_input());
    RUN(test_sizes());
    RUN(test_bpe());
    RUN(test_bpe_fast());
    RUN(test_byte_level());
    RUN(test_smollm2_fixture());
    RUN(test_sampler());
    RUN(test_default_model());
    RUN(test_serve());
    RUN(test_swap_roundtrip());
    RUN(test_prefix_confirm());
    RUN(test_hardening());
    RUN(test_outputs());
    RUN(test_kv_group_default());
    RUN(test_cli());
    RUN(test_cli_no_device());
    RUN(test_cli_trace());
    RUN(test_serve_cli());
    RUN(test_dump_logits());
    RUN(test_chat_default_model());
    RUN(test_chat_random());
    RUN(test_chat_templates());
    RUN(test_chat_limits());
    RUN(test_llama2c_commands());
    RUN(test_dump_attn());
    RUN(test_rope_base());
    RUN(test_smollm2_logits());
    RUN(test_hf_export());
    RUN(test_hf_export_refusals());
    RUN(test_gguf_export());
    RUN(test_section_map());
    RUN(test_comment_counter());
    RUN(test_bench_shapes());
    RUN(test_bench_run());
    RUN(test_bench_serve());
    if (gpu) {
        RUN(test_gpu_alloc_error());
        RUN(test_rmsnorm(1));
        RUN(test_matmul(1));
        RUN(test_rope(1, 10000.0));
        RUN(test_rope(1, 500000.0));
        RUN(test_swiglu_residual_embed(1));
        RUN(test_block_reduce());
        RUN(test_attention(1));
        RUN(test_launch_count());
        RUN(test_attention_ragged(1));
        RUN(test_kv_write_bytes());
        RUN(test_gpu_matrix());
        RUN(test_fork_cow(1));
        RUN(test_batch(1));
        RUN(test_prefix_reuse(1));
        RUN(test_trace_scenario(1));
    } else {
        skip("GPU kernel checks: an nvcc build without a CUDA device (the C build emulates them)");
    }
    remove_test_dir();
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail ? 1 : 0;
}
#endif
