/* tests/ops.c: the ops (rmsnorm, matmul, rope, swiglu, embed, reductions) and the cache types (fp16, int8) against float64.
 * Included by test.c, in place: one compile, one binary (see test.c). */
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
