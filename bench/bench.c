/* kvtransformer: §19 benchmarks, the measurements behind `--bench`.
 *
 * Not compiled on its own: kvtransformer.cu includes this file at §19, so
 * everything defined there is visible here, and `make` builds one program as
 * before. It lives beside the teaching file because it is the harness around
 * the lesson (timers, random contents, bounds, tables, CSV), not the lesson:
 * each bench calls the engine's public functions and the ops of §7-§14 and
 * reports what they cost, on the machine it runs on. */

#if !defined(KVT_NO_MAIN) || defined(KVT_CLI) /* the benchmarks: for the command line only */
/* Seconds for one read-only pass over a[0 .. n), n a multiple of 4096, on all
 * cores; the sum goes to *sink, so the loop is not optimized away. */
static double kvt_read_pass(const float *a, long n, float *sink) {
    float total = 0.0f;
    double t0 = kvt_now();
#pragma omp parallel for reduction(+ : total)
    for (long blk = 0; blk < n / 4096; blk++) {
        float acc[16] = {0};
        for (long i = blk * 4096; i < (blk + 1) * 4096; i += 16)
            for (int j = 0; j < 16; j++) acc[j] += a[i + j];
        for (int j = 0; j < 16; j++) total += acc[j];
    }
    double dt = kvt_now() - t0;
    *sink += total;
    return dt;
}
/* Memory bandwidth of this machine, two ways, over 256 MiB arrays, best of 5:
 * a parallel copy loop (bytes read + bytes written, as STREAM counts it) and
 * kvt_read_pass's read-only loop (16 independent sums, so it vectorizes). Decode
 * only reads weights, so weight_bytes / read bandwidth is the tighter bound;
 * both are printed. */
static void kvt_bandwidth_gbs(double *copy_gbs, double *read_gbs) {
    size_t n = (size_t)64 << 20;
    float *a = (float *)host_alloc(n * sizeof(float)), *b = (float *)host_alloc(n * sizeof(float));
    KVT_ASSERT(a && b); /* the weights' kind of memory, so the bound is measured the way they are read */
    long nn = (long)n;
#pragma omp parallel for
    for (long i = 0; i < nn; i++) { a[i] = (float)(i & 1023); b[i] = 0.0f; }
    double best_copy = 1e30, best_read = 1e30;
    float total = 0.0f;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = kvt_now();
#pragma omp parallel for
        for (long i = 0; i < nn; i++) b[i] = a[i];
        best_copy = fmin(best_copy, kvt_now() - t0);
        best_read = fmin(best_read, kvt_read_pass(a, nn, &total));
    }
    volatile float sink = b[nn - 1] + total; /* keep both loops from being optimized away */
    (void)sink;
    free(a);
    free(b);
    *copy_gbs = 2.0 * (double)n * sizeof(float) / best_copy / 1e9;
    *read_gbs = (double)n * sizeof(float) / best_read / 1e9;
}
/* Memory latency: one chain of dependent loads through the 64-byte lines of
 * 256 MiB in a random order, so neither the caches nor the prefetchers can
 * help; ns per load. The order is one cycle through every line (Sattolo's
 * shuffle: swap line i with a line j < i, for i from the last down).
 * Latency x bandwidth is what must be in flight to read at that bandwidth:
 * a core that keeps M misses in flight reads at most M x 64 bytes / latency. */
static double kvt_latency_ns(void) {
    size_t lines = ((size_t)256 << 20) / 64, w = 64 / sizeof(size_t), p = 0;
    size_t *a = (size_t *)host_alloc(lines * 64);
    KVT_ASSERT(a);
    uint64_t rng = 42;
    for (size_t i = 0; i < lines; i++) a[i * w] = i; /* line i's first word: the next line */
    for (size_t i = lines - 1; i > 0; i--) {
        size_t j = (size_t)(kvt_rng_u64(&rng) % i), t = a[i * w];
        a[i * w] = a[j * w];
        a[j * w] = t;
    }
    long steps = 1L << 21;
    double t0 = kvt_now();
    for (long s = 0; s < steps; s++) p = a[p * w];
    double ns = (kvt_now() - t0) * 1e9 / (double)steps;
    volatile size_t keep = p; /* the chain's end: used, so walked */
    (void)keep;
    free(a);
    return ns;
}
/* The same on the GPU: device-to-device copies of 1 GiB, best of 5. */
static double kvt_device_bandwidth_gbs(void) {
#ifdef __CUDACC__
    size_t bytes = (size_t)1 << 30;
    void *a, *b;
    KVT_CUDA(cudaMalloc(&a, bytes));
    KVT_CUDA(cudaMalloc(&b, bytes));
    KVT_CUDA(cudaMemset(a, 1, bytes));
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        KVT_CUDA(cudaDeviceSynchronize());
        double t0 = kvt_now();
        KVT_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        KVT_CUDA(cudaDeviceSynchronize());
        best = fmin(best, kvt_now() - t0);
    }
    KVT_CUDA(cudaFree(a));
    KVT_CUDA(cudaFree(b));
    return 2.0 * (double)bytes / best / 1e9;
#else
    double copy, read;
    kvt_bandwidth_gbs(&copy, &read); /* the emulation's "device" memory is host memory */
    return copy;
#endif
}
/* Bytes of weights one decode step reads: every matrix once, the classifier once. */
static double kvt_weight_bytes(const kvt_model *m) {
    const kvt_config *c = &m->c;
    double D = c->dim, HD = c->hidden_dim, KVD = m->kv_dim;
    return 4.0 * (c->n_layers * (2 * D * D + 2 * KVD * D + 3 * HD * D + 2 * D) + D + (double)c->vocab_size * D);
}

/* Seconds since t0, for the rates the benches print. A step of a tiny model
 * can be quicker than the clock can tell: 0 s would turn a rate into inf (and
 * 0 / 0 into NaN), so no time is taken as less than 1 ns, the clock's unit. */
static double kvt_since(double t0) {
    double dt = kvt_now() - t0;
    return dt > 1e-9 ? dt : 1e-9;
}

/* The pool a bench's engine gets holds every sequence at TMAX, unless --chunks
 * set its size (o->n_chunks > 0): then check, before anything is printed,
 * that it holds the `need` chunks the bench takes at its peak; `what` (a
 * printf format) says what fills them. */
static kvt_status bench_pool_check(const kvt_options *o, const char *bench, int need, const char *what, ...) {
    if (o->n_chunks <= 0 || o->n_chunks >= need) return KVT_OK;
    char held[128];
    va_list ap;
    va_start(ap, what);
    vsnprintf(held, sizeof(held), what, ap);
    va_end(ap);
    return kvt_fail(KVT_EARG, "--chunks %d: --bench %s needs %d chunks of %d positions (%s); raise --chunks or "
                    "leave it out", o->n_chunks, bench, need, o->CH, held);
}

/* qsort order for medians. */
static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* The median of v[0 .. n) (the upper one for even n; 0 when n is 0); sorts v. */
static double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), bench_cmp_double);
    return n ? v[n / 2] : 0.0;
}
/* Decode speed at short context against the bandwidth bound. */
/* Decode at short context is a sequence of matrix-vector products: each
 * weight is read once and used for one multiply-add. The time per token is
 * then bounded below by weight_bytes / bandwidth, whatever the flops; the
 * fraction of that bound reached says how well the matmul streams memory.
 * Positions: 0 .. np-1 the prompt, np one untimed step (threads and caches
 * warm up), np+1 .. np+steps-1 the timed steps. A model shorter than the
 * usual 16 + 32 positions gets a 1-token prompt and decodes to its end; the
 * shortest that leaves an average of two timed steps is TMAX = 4. */
static kvt_status bench_decode(kvt_model *m, const kvt_options *o, FILE *csv) {
    int V = m->c.vocab_size, TMAX = m->c.seq_len, np = 16, steps = 32;
    if (np + steps > TMAX) { np = 1; steps = TMAX - 1; }
    if (steps < 3)
        return kvt_fail(KVT_ECONTEXT, "--bench decode needs TMAX >= 4 (a prompt at position 0, an untimed step at "
                        "1, at least two timed steps from 2 on); this model has TMAX = %d", TMAX);
    kvt_engine *e;
    kvt_seq s;
    kvt_status st = bench_pool_check(o, "decode", kvt_cdiv(np + steps, o->CH), "%d positions", np + steps);
    if (st == KVT_OK) st = kvt_engine_create(&e, m, o);
    if (st != KVT_OK) return st;
    kvt_seq_init(e, &s);
    int *toks = (int *)kvt_malloc((size_t)(np + steps) * sizeof(int));
    float *logits = (float *)kvt_malloc((size_t)V * sizeof(float));
    kvt_fake_tokens(toks, np + steps, V);
    double bw = 0, rbw = 0, wb = kvt_weight_bytes(m);
    if (e->gpu) bw = rbw = kvt_device_bandwidth_gbs();
    else kvt_bandwidth_gbs(&bw, &rbw);
    double lat = e->gpu ? 0.0 : kvt_latency_ns();
    /* the prompt, the untimed step, then the timed single-token steps: the
     * decode regime, where reading the weights dominates */
    if (st == KVT_OK) st = kvt_forward(e, &s, toks, np, logits, 0);
    if (st == KVT_OK) st = kvt_forward(e, &s, toks + np, 1, logits, 0); /* warm-up */
    /* CPU: before each timed step, one read-only pass over the model's own
     * weights, as many bytes as the step reads: the bandwidth of that moment,
     * on the same memory, milliseconds before the step. (The loops above ran
     * seconds earlier on other arrays, and a shared machine's bandwidth
     * drifts from minute to minute.) frac[i]: the pass's time for the step's
     * bytes over the step's time. Only for weights of 32 MiB or more: smaller
     * ones would be read from the CPU's caches (several MB of L3), not memory. */
#define KVT_PAIRED_MIN_BYTES (32.0 * (1 << 20))
    long nr = e->gpu || wb < KVT_PAIRED_MIN_BYTES ? 0 : (long)(wb / sizeof(float)) / 4096 * 4096, nf = 0;
    double dt = 0, *frac = (double *)kvt_malloc((size_t)steps * sizeof(double));
    double *pass_gbs = (double *)kvt_malloc((size_t)steps * sizeof(double));
    float sink = 0.0f;
    for (int i = 1; i < steps && st == KVT_OK; i++) {
        double t_pass = nr ? kvt_read_pass(m->data, nr, &sink) : 0.0, t1 = kvt_now();
        st = kvt_forward(e, &s, toks + np + i, 1, logits, 0);
        double t_step = kvt_since(t1);
        dt += t_step;
        if (nr) {
            pass_gbs[nf] = 4.0 * (double)nr / fmax(t_pass, 1e-9) / 1e9;
            frac[nf++] = t_pass * (wb / (4.0 * (double)nr)) / t_step;
        }
    }
    dt /= steps - 1;
    double pf = bench_median(frac, (int)nf), pg = bench_median(pass_gbs, (int)nf);
    if (st == KVT_OK) {
        double bound = bw * 1e9 / wb, rbound = rbw * 1e9 / wb;
        printf("%s memory bandwidth: copy loop (read+write) %.2f GB/s%s", e->gpu ? "device" : "host", bw,
               e->gpu ? "\n" : "");
        if (!e->gpu) printf(", read-only loop %.2f GB/s, latency %.0f ns (dependent loads in random order)\n", rbw, lat);
        printf("weights read per token: %.1f MB -> bound %.2f tokens/s (copy bandwidth)", wb / 1e6, bound);
        if (!e->gpu) printf(", %.2f tokens/s (read bandwidth)", rbound);
        printf("\ndecode (%s, %s cache, positions %d..%d): %.2f ms/token = %.2f tokens/s = %.0f%% of the copy bound",
               e->gpu ? "gpu" : "cpu", kvt_dtype_name(o->kv_dtype), np + 1, np + steps - 1, 1e3 * dt, 1.0 / dt,
               100.0 / dt / bound);
        if (!e->gpu) printf(", %.0f%% of the read bound", 100.0 / dt / rbound);
        printf("\n");
        if (nf)
            printf("paired (a read-only pass over the weights just before each step, median of %ld pairs): the pass "
                   "%.2f GB/s, decode at %.0f%% of it\n", nf, pg, 100.0 * pf);
        if (csv) fprintf(csv, "copy_gbs,read_gbs,weight_mb,copy_bound_tok_s,read_bound_tok_s,decode_tok_s,"
                              "pass_gbs,pass_fraction,latency_ns\n%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.1f\n",
                         bw, rbw, wb / 1e6, bound, rbound, 1.0 / dt, pg, pf, lat);
    }
    volatile float keep = sink; /* the passes' sums: used, so computed */
    (void)keep;
    free(frac);
    free(pass_gbs);
    free(toks);
    free(logits);
    kvt_seq_free(e, &s);
    kvt_engine_free(e);
    return st;
}

/* ms per generated token against position, cache on vs off. Cost model: with
 * the cache, step T costs the weights once plus attention over T cached
 * positions (O(T), small next to the weights until T is large);
 * without it, step T re-runs T tokens through every layer (O(T) matmul rows
 * plus O(T^2) attention). Summed over a whole generation: O(T) vs O(T^2).
 * The row of position p: with the cache, positions 0 .. p-1 are filled and
 * the steps at p .. p+reps-1 timed; without it, the step at p (all p + 1
 * tokens again). Rows at every, 2 * every, ... while p + reps <= TMAX. */
static kvt_status bench_positions(kvt_model *m, const kvt_options *o, int every, FILE *csv) {
    int V = m->c.vocab_size, TMAX = m->c.seq_len, reps = 4;
    if (TMAX < 1 + reps)
        return kvt_fail(KVT_ECONTEXT, "--bench positions needs TMAX >= %d (its first row fills position 0 and times "
                        "positions 1..%d); this model has TMAX = %d", 1 + reps, reps, TMAX);
    if (every < 1 || every + reps > TMAX)
        return kvt_fail(KVT_EARG, "--bench positions with a row every %d positions needs TMAX >= %d (the first row "
                        "times positions %d..%d); this model has TMAX = %d: give --bench-every %d or less", every,
                        every + reps, every, every + reps - 1, TMAX, TMAX - reps);
    kvt_options on = *o, off = *o;
    on.kv_cache = 1;
    off.kv_cache = 0;
    kvt_engine *e_on = NULL, *e_off = NULL;
    kvt_seq s_on, s_off;
    int last = (TMAX - reps) / every * every; /* the position of the last row */
    kvt_status st = bench_pool_check(o, "positions", kvt_cdiv(last + reps, o->CH), "%d positions in its last row",
                                     last + reps);
    if (st == KVT_OK) st = kvt_engine_create(&e_on, m, &on);
    if (st == KVT_OK) st = kvt_engine_create(&e_off, m, &off);
    if (st != KVT_OK) { kvt_engine_free(e_on); return st; }
    kvt_seq_init(e_on, &s_on);
    kvt_seq_init(e_off, &s_off);
    int *toks = (int *)kvt_malloc((size_t)TMAX * sizeof(int));
    float *logits = (float *)kvt_malloc((size_t)V * sizeof(float));
    kvt_fake_tokens(toks, TMAX, V);
    printf("%8s %16s %16s %8s\n", "position", "cache on us/tok", "cache off us/tok", "off/on");
    if (csv) fprintf(csv, "position,cache_on_ms,cache_off_ms,off_over_on\n");
    for (int pos = every; pos + reps <= TMAX && st == KVT_OK; pos += every) {
        /* cache on: fill positions 0..pos-1, time `reps` single-token steps */
        kvt_seq_reset(e_on, &s_on);
        st = kvt_forward(e_on, &s_on, toks, pos, logits, 0);
        double t0 = kvt_now();
        for (int i = 1; i <= reps && st == KVT_OK; i++) st = kvt_step(e_on, &s_on, toks, pos + i, logits);
        double ms_on = 1e3 * kvt_since(t0) / reps;
        /* cache off: the step at position pos re-runs all pos + 1 tokens */
        t0 = kvt_now();
        if (st == KVT_OK) st = kvt_step(e_off, &s_off, toks, pos + 1, logits);
        double ms_off = 1e3 * kvt_since(t0);
        if (st != KVT_OK) break;
        printf("%8d %16.1f %16.1f %8.1f\n", pos, 1e3 * ms_on, 1e3 * ms_off, ms_off / ms_on);
        if (csv) fprintf(csv, "%d,%.6f,%.6f,%.2f\n", pos, ms_on, ms_off, ms_off / ms_on);
    }
    free(toks);
    free(logits);
    kvt_seq_free(e_on, &s_on);
    kvt_seq_free(e_off, &s_off);
    kvt_engine_free(e_on);
    kvt_engine_free(e_off);
    return st;
}

/* One line when OpenBLAS fell back to its generic kernels on a CPU that has
 * better ones (§9, kvt_blas_generic): the numbers below depend on it. */
static void kvt_blas_note(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
    if (kvt_blas_generic() && !getenv("OPENBLAS_CORETYPE") && __builtin_cpu_supports("avx2"))
        fprintf(stderr, "[kvt] note: OpenBLAS runs its generic Prescott kernels on this CPU (it is older than the CPU), "
                "so every matmul uses our own loops; prefill is ~1.5x faster with OPENBLAS_CORETYPE=%s set before "
                "starting kvt (make run, test and bench set it)\n", __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell");
#endif
}

/* Wait for the GPU to finish everything launched (for timing). The emulated
 * launches return when their work is done, so there is nothing to wait for. */
static void kvt_sync(int gpu) {
#ifdef __CUDACC__
    if (gpu) KVT_CUDA(cudaDeviceSynchronize());
#else
    (void)gpu;
#endif
}

/* Seconds on the device's clock: on a GPU, a CUDA event recorded after
 * everything launched so far and waited for, measured from the first one (the
 * GPU's own timestamps, free of the host's launch and wake-up jitter); on the
 * CPU and in the emulation, the host clock once the work is done. */
static double kvt_device_now(int gpu) {
#ifdef __CUDACC__
    static cudaEvent_t first = NULL;
    if (gpu) {
        cudaEvent_t ev;
        float ms = 0.0f;
        if (!first) { KVT_CUDA(cudaEventCreate(&first)); KVT_CUDA(cudaEventRecord(first, 0)); }
        KVT_CUDA(cudaEventCreate(&ev));
        KVT_CUDA(cudaEventRecord(ev, 0));
        KVT_CUDA(cudaEventSynchronize(ev));
        KVT_CUDA(cudaEventElapsedTime(&ms, first, ev));
        KVT_CUDA(cudaEventDestroy(ev));
        return ms / 1e3;
    }
#endif
    kvt_sync(gpu);
    return kvt_now();
}

/* Attention alone, one query row at position T-1 of a cache filled with random
 * values (no model run needed to fill it): naive (3 kernels, score row in
 * memory), fused in one pass, and fused split across blocks + merge. T = 0
 * (no --bench-ctx): the whole context, T = TMAX; any model can be measured. */
static kvt_status bench_attention(kvt_model *m, const kvt_options *o, int T, FILE *csv) {
    kvt_options bo = *o;
    bo.max_rows = 1;
    bo.prefix_reuse = 0;
    if (T == 0) T = m->c.seq_len;
    if (T < 1 || T > m->c.seq_len)
        return kvt_fail(KVT_EARG, "--bench-ctx %d: --bench attention needs 1 <= T <= TMAX = %d (one query over T "
                        "cached positions)", T, m->c.seq_len);
    kvt_engine *e;
    kvt_status st = bench_pool_check(o, "attention", kvt_cdiv(T, o->CH), "%d positions", T);
    if (st == KVT_OK) st = kvt_engine_create(&e, m, &bo);
    if (st != KVT_OK) return st;
    kvt_pool *p = &e->pool;
    kvt_seq s;
    kvt_seq_init(e, &s);
    if ((st = seq_reserve(p, &s, T, "the benchmark sequence")) != KVT_OK) { kvt_seq_free(e, &s); kvt_engine_free(e); return st; }
    s.len = T;
    /* random contents, one chunk at a time: fp32 in [-1, 1), fp16 bits of such floats, int8 in [-127, 127] */
    size_t cb = kvt_dtype_size(p->dtype, p->chunk_elems);
    char *buf = (char *)kvt_malloc(cb);
    float *sc = (float *)kvt_malloc(p->chunk_scales * sizeof(float) + 4);
    uint64_t rs = 7;
    for (int c = 0; c < p->n_chunks; c++) {
        for (size_t i = 0; i < p->chunk_elems; i++) {
            float v = 2.0f * kvt_rng_f32(&rs) - 1.0f;
            if (p->dtype == KVT_FP32) memcpy(buf + 4 * i, &v, 4);
            else if (p->dtype == KVT_FP16) { uint16_t h = f32_to_f16(v); memcpy(buf + 2 * i, &h, 2); }
            else if (i < cb) buf[i] = (char)(int)(v * 127.0f); /* int8 (or any byte-packed type) */
        }
        buf_upload(e->gpu, (char *)p->data + (size_t)c * cb, buf, cb);
        for (size_t i = 0; i < p->chunk_scales; i++) sc[i] = 1.0f / 127.0f;
        if (p->scales) buf_upload(e->gpu, p->scales + (size_t)c * p->chunk_scales, sc, p->chunk_scales * sizeof(float));
    }
    int NH = m->c.n_heads, D = m->c.dim, tok = 0;
    float *q = (float *)kvt_malloc((size_t)D * sizeof(float));
    kvt_fill_uniform(q, (size_t)D, 1.0f, 0.0f, &rs);
    buf_upload(e->gpu, e->q, q, (size_t)D * sizeof(float));
    stage_seq(e, 0, &s, 1, T - 1, 0);
    stage_upload(e, &tok, 1, s.n_table);
    kvt_kv kv = engine_kv(e);
    int auto_len, auto_n;
    attn_split(e, T - 1, 1, &auto_len, &auto_n);
    if (auto_n == 1 && (size_t)kvt_cdiv(T, 256) <= e->part_cap) { /* split anyway (pieces of 256), to compare */
        auto_len = 256 < T ? 256 : T;
        auto_n = kvt_cdiv(T, auto_len);
    }
    const char *names[3] = {"naive (score row)", "fused (one pass)", "fused, split + merge"};
    double ms[3], diff[3] = {0.0, 0.0, 0.0}, big = 0.0;
    size_t no = (size_t)NH * p->HS;
    float *outs = (float *)kvt_malloc(3 * no * sizeof(float));
    /* What is timed: N calls launched back to back between two device-clock
     * readings, so on a GPU each call costs its kernels' time and not a host
     * round trip (no wait between calls; the GPU idles only before the first).
     * One warm-up call first (its output kept for the check below), then N = 3,
     * 6, 12, ... until one batch takes at least 0.2 s; ms is that batch / N. */
    for (int v = 0; v < 3; v++) {
        int reps = 3;
        double t0 = 0.0, t1 = 0.0;
        for (int r = -1; r < reps; r++) {
            if (r == 0) t0 = kvt_device_now(e->gpu);
            int l = (r + 1) % m->c.n_layers; /* each call the next layer: as in decode, the cache comes from memory */
            if (v == 0) e->op->attention_naive(e->att, e->q, kv, l, 1, NH, e->scores, m->c.seq_len);
            else if (v == 1) e->op->attention_fused(e->att, e->q, kv, l, 1, NH, e->part, T, 1);
            else e->op->attention_fused(e->att, e->q, kv, l, 1, NH, e->part, auto_len, auto_n);
            if (r == -1) buf_download(e->gpu, outs + v * no, e->att, no * sizeof(float)); /* layer 0, for the check */
            if (r == reps - 1 && (t1 = kvt_device_now(e->gpu)) - t0 < 0.2 && reps < (1 << 20)) {
                reps *= 2; /* too short to time well: a batch twice as long, from the start */
                r = -1;
            }
        }
        ms[v] = 1e3 * (t1 > t0 ? t1 - t0 : 1e-9) / reps;
    }
    /* What was timed must also be right: the fused and split outputs against
     * the naive one (the same sums in other orders), relative to its largest
     * value, as the tests compare; NaN anywhere counts as above. */
    for (size_t i = 0; i < no; i++) big = fmax(big, fabs((double)outs[i]));
    for (int v = 1; v < 3; v++)
        for (size_t i = 0; i < no; i++) {
            double d = fabs((double)outs[v * no + i] - outs[i]) / (big > 0.0 ? big : 1.0);
            diff[v] = d > diff[v] || d != d ? d : diff[v];
        }
    printf("attention of one query over T = %d cached positions (%s cache, NH %d, NKV %d, HS %d; each call the next "
           "of %d layers) on %s%s\n", T, kvt_dtype_name(p->dtype), NH, p->NKV, p->HS, m->c.n_layers,
           e->gpu ? kvt_gpu_name() : "the CPU",
           e->gpu && KVT_EMULATED ? " (emulated: not GPU timing)" : "");
    if (csv) fprintf(csv, "variant,T,ms,speedup_vs_naive\n");
    for (int v = 0; v < 3; v++) {
        printf("  %-28s %10.4f ms  %6.2fx vs naive%s\n", names[v], ms[v], ms[0] / ms[v], v == 2 ? "" : "");
        if (csv) fprintf(csv, "%s,%d,%.5f,%.3f\n", names[v], T, ms[v], ms[0] / ms[v]);
    }
    printf("  (split: %d pieces of %d positions)\n", auto_n, auto_len);
    printf("  largest difference from naive: fused %.3g, split + merge %.3g, relative to max |naive| %.3g "
           "(tolerance KVT_TOL_GPU = %.0e: %s)\n", diff[1], diff[2], big, KVT_TOL_GPU,
           diff[1] <= KVT_TOL_GPU && diff[2] <= KVT_TOL_GPU ? "within" : "ABOVE");
    free(buf); free(sc); free(q); free(outs);
    kvt_seq_free(e, &s);
    kvt_engine_free(e);
    return KVT_OK;
}

/* The staged table: each row adds one idea to the previous one and reports
 * decode tokens/s at position T and the cache bytes a sequence of T holds.
 *   1 no cache (every step recomputes T positions)  2 + KV cache (fp32, naive)
 *   3 + fused attention   4 + int8 cache   5 + batch of 8 sharing a T-token prompt
 * A prompt fills positions 0 .. T-1, then the steps at T .. T+7 are timed, so
 * T + 8 <= TMAX. T = 0 (no --bench-ctx): TMAX/2, at most TMAX - 8. The
 * shortest model it can measure has TMAX = 9 (T = 1). */
static kvt_status bench_stages(kvt_model *m, const kvt_options *o, int T, FILE *csv) {
    int V = m->c.vocab_size, TMAX = m->c.seq_len, steps = 8, B = 8;
    if (TMAX < 1 + steps)
        return kvt_fail(KVT_ECONTEXT, "--bench stages needs TMAX >= %d (a prompt at position 0, then %d timed steps "
                        "at positions 1..%d); this model has TMAX = %d", 1 + steps, steps, steps, TMAX);
    if (T == 0) T = TMAX / 2 + steps <= TMAX ? TMAX / 2 : TMAX - steps;
    if (T < 1 || T + steps > TMAX)
        return kvt_fail(KVT_EARG, "--bench-ctx %d: --bench stages needs 1 <= T <= TMAX - %d = %d (a prompt of T "
                        "positions, then %d timed steps)", T, steps, TMAX - steps, steps);
    /* The peak is stage 5: the shared prompt's chunks, and for each of the B
     * sequences a copy of the prompt's partly filled last chunk plus new ones.
     * That can be more than B sequences at TMAX hold (B = 8, TMAX = CH = 16:
     * 1 + 8 > 8), so without --chunks every stage gets a pool of this size. */
    int need = kvt_cdiv(T, o->CH) + B * (kvt_cdiv(T + steps, o->CH) - T / o->CH);
    kvt_status st = bench_pool_check(o, "stages", need, "%d sequences sharing a prompt of %d positions", B, T);
    if (st != KVT_OK) return st;
    int *toks = (int *)kvt_malloc((size_t)(T + steps) * sizeof(int));
    float *logits = (float *)kvt_malloc((size_t)B * V * sizeof(float));
    kvt_fake_tokens(toks, T + steps, V);
    const char *names[5] = {"no cache (recompute)", "+ KV cache (fp32, naive)", "+ fused attention", "+ int8 cache",
                            "+ batch of 8, shared prompt"};
    printf("staged table: decode at position %d (%s)\n%-30s %12s %14s\n", T, o->device == KVT_GPU ? "gpu" : "cpu", "stage",
           "tokens/s", "cache bytes");
    if (csv) fprintf(csv, "stage,tokens_per_s,cache_bytes\n");
    for (int stage = 0; stage < 5 && st == KVT_OK; stage++) {
        kvt_options so = *o;
        so.kv_cache = stage > 0;
        so.attn = stage >= 2 ? KVT_ATTN_FUSED : KVT_ATTN_NAIVE;
        so.kv_dtype = stage >= 3 ? KVT_INT8 : KVT_FP32;
        so.max_seqs = stage == 4 ? B : 1;
        so.n_chunks = o->n_chunks > 0 ? o->n_chunks : need;
        so.max_rows = so.max_rows < B ? B : so.max_rows;
        int nb = stage == 4 ? B : 1, *ones = (int *)kvt_malloc((size_t)B * sizeof(int));
        kvt_engine *e;
        if ((st = kvt_engine_create(&e, m, &so)) != KVT_OK) { free(ones); break; }
        kvt_seq *seqs = (kvt_seq *)calloc((size_t)B, sizeof(kvt_seq));
        kvt_seq **ptr = (kvt_seq **)kvt_malloc((size_t)B * sizeof(kvt_seq *));
        KVT_ASSERT(seqs);
        kvt_seq_init(e, &seqs[0]);
        st = kvt_forward(e, &seqs[0], toks, T, logits, 0); /* positions 0 .. T-1 */
        for (int b = 0; b < nb; b++) {
            if (b) kvt_seq_fork(e, &seqs[b], &seqs[0]);
            ptr[b] = &seqs[b];
            ones[b] = 1;
        }
        int n_steps = stage == 0 ? 2 : steps; /* a recompute step is slow: two are enough */
        double t0 = kvt_now();
        for (int i = 0; i < n_steps && st == KVT_OK; i++) { /* the step at position T + i */
            int tk[8];
            for (int b = 0; b < nb; b++) tk[b] = toks[T + i];
            if (stage == 4) st = kvt_forward_batch(e, ptr, nb, tk, ones, logits);
            else st = kvt_step(e, &seqs[0], toks, T + i + 1, logits);
        }
        double dt = kvt_since(t0);
        if (st == KVT_OK) {
            kvt_cache_usage u;
            kvt_cache_usage_of(e, (const kvt_seq *const *)ptr, nb, &u);
            double tps = nb * n_steps / dt;
            printf("%-30s %12.1f %14.0f\n", names[stage], tps, u.bytes_used);
            if (csv) fprintf(csv, "%s,%.2f,%.0f\n", names[stage], tps, u.bytes_used);
        }
        for (int b = 0; b < B; b++) if (seqs[b].table) kvt_seq_free(e, &seqs[b]);
        kvt_engine_free(e);
        free(seqs); free(ptr); free(ones);
    }
    free(toks);
    free(logits);
    return st;
}

/* Decode throughput against batch size: B sequences at the same position,
 * one kvt_forward_batch per step. Weights are read once per step for all B
 * rows, so tokens/s grows with B until compute, not bandwidth, is the limit.
 * The sizes take turns: each of 5 rounds prefills every size's sequences
 * again (untimed) and times its steps, and each size reports its median
 * round. A shared machine's bandwidth drifts over seconds; measured in turn,
 * every size sees the same drift, so the ratios between sizes hold. */
#define BENCH_BATCH_SIZES 5
#define BENCH_BATCH_ROUNDS 5
static kvt_status bench_batch(kvt_model *m, const kvt_options *o, FILE *csv) {
    int sizes[BENCH_BATCH_SIZES] = {1, 2, 4, 8, 16}, V = m->c.vocab_size, np = 16, steps = 16, Bmax = 16;
    if (np + steps > m->c.seq_len)
        return kvt_fail(KVT_ECONTEXT, "--bench batch needs TMAX >= %d (each sequence fills positions 0..%d, then %d "
                        "batched steps are timed at positions %d..%d); this model has TMAX = %d", np + steps, np - 1,
                        steps, np, np + steps - 1, m->c.seq_len);
    kvt_status st = bench_pool_check(o, "batch", Bmax * kvt_cdiv(np + steps, o->CH), "%d sequences of %d positions",
                                     Bmax, np + steps);
    if (st != KVT_OK) return st;
    kvt_options bo = *o;
    bo.max_seqs = Bmax;
    bo.max_rows = Bmax > o->max_rows ? Bmax : o->max_rows;
    bo.prefix_reuse = 0; /* each sequence computes its own prompt */
    kvt_engine *e;
    if ((st = kvt_engine_create(&e, m, &bo)) != KVT_OK) return st;
    kvt_seq *seqs = (kvt_seq *)calloc((size_t)Bmax, sizeof(kvt_seq));
    kvt_seq **ptr = (kvt_seq **)kvt_malloc((size_t)Bmax * sizeof(kvt_seq *));
    int *toks = (int *)kvt_malloc((size_t)(np + steps) * Bmax * sizeof(int));
    int *step_toks = (int *)kvt_malloc((size_t)Bmax * sizeof(int)), *ones = (int *)kvt_malloc((size_t)Bmax * sizeof(int));
    float *logits = (float *)kvt_malloc((size_t)Bmax * V * sizeof(float));
    double dt[BENCH_BATCH_SIZES][BENCH_BATCH_ROUNDS];
    KVT_ASSERT(seqs);
    kvt_fake_tokens(toks, (np + steps) * Bmax, V);
    for (int b = 0; b < Bmax; b++) {
        ptr[b] = &seqs[b];
        ones[b] = 1;
        kvt_seq_init(e, &seqs[b]);
    }
    for (int r = 0; r < BENCH_BATCH_ROUNDS && st == KVT_OK; r++)
        for (int si = 0; si < BENCH_BATCH_SIZES && st == KVT_OK; si++) {
            int B = sizes[si];
            for (int b = 0; b < B && st == KVT_OK; b++) { /* the prompt again, untimed */
                kvt_seq_reset(e, &seqs[b]);
                st = kvt_forward(e, &seqs[b], toks + b * (np + steps), np, logits, 0);
            }
            double t0 = kvt_now();
            for (int i = 0; i < steps && st == KVT_OK; i++) {
                for (int b = 0; b < B; b++) step_toks[b] = toks[b * (np + steps) + np + i];
                st = kvt_forward_batch(e, ptr, B, step_toks, ones, logits);
            }
            dt[si][r] = kvt_since(t0) / steps;
        }
    if (st == KVT_OK) {
        printf("%6s %14s %14s   (median of %d rounds, the sizes in turn)\n", "batch", "ms/step", "tokens/s",
               BENCH_BATCH_ROUNDS);
        if (csv) fprintf(csv, "batch,ms_per_step,tokens_per_s\n");
        for (int si = 0; si < BENCH_BATCH_SIZES; si++) {
            double med = bench_median(dt[si], BENCH_BATCH_ROUNDS);
            printf("%6d %14.3f %14.1f\n", sizes[si], 1e3 * med, sizes[si] / med);
            if (csv) fprintf(csv, "%d,%.4f,%.2f\n", sizes[si], 1e3 * med, sizes[si] / med);
        }
    }
    for (int b = 0; b < Bmax; b++) kvt_seq_free(e, &seqs[b]);
    kvt_engine_free(e);
    free(seqs); free(ptr); free(toks); free(ones); free(logits); free(step_toks);
    return st;
}
/* The regime the cache is for: B sequences, each with its own prompt of T
 * tokens (nothing shared), then 32 decode steps of all B together, for each
 * cache type. A decode step reads every weight once and, per sequence, every
 * cached K and V of every layer:
 *   bytes per step = weights + sum over sequences of (positions read) * L * 2 * KVD * (bytes per value
 *                    + 4 / G for int8's scales)
 * so no step can be faster than bytes per step / read bandwidth, and the bound
 * on tokens/s is B / that time. fp16 and int8 shrink the second term: once it
 * dominates (long contexts, many sequences) they should be faster than fp32.
 * T = 0 (no --bench-ctx): TMAX - 64, or TMAX - 32 on a model of 64 positions
 * or fewer; the shortest model it can measure has TMAX = 33 (T = 1). */
static kvt_status bench_context(kvt_model *m, const kvt_options *o, int T, int B, FILE *csv) {
    int V = m->c.vocab_size, TMAX = m->c.seq_len, steps = 32, L = m->c.n_layers, KVD = m->kv_dim;
    if (TMAX < 1 + steps)
        return kvt_fail(KVT_ECONTEXT, "--bench context needs TMAX >= %d (a prompt at position 0, then %d timed "
                        "steps at positions 1..%d); this model has TMAX = %d", 1 + steps, steps, steps, TMAX);
    if (T == 0) T = TMAX > 2 * steps ? TMAX - 2 * steps : TMAX - steps;
    if (T < 1 || T + steps > TMAX)
        return kvt_fail(KVT_EARG, "--bench-ctx %d: --bench context needs 1 <= T <= TMAX - %d = %d (a prompt of T "
                        "positions, then %d timed steps)", T, steps, TMAX - steps, steps);
    if (B < 1 || B > 256) return kvt_fail(KVT_EARG, "--bench-batch %d: expected 1..256 sequences", B);
    kvt_status st = bench_pool_check(o, "context", B * kvt_cdiv(T + steps, o->CH), "%d sequence(s) of %d positions",
                                     B, T + steps);
    if (st != KVT_OK) return st;
    double bw, rbw, wb = kvt_weight_bytes(m);
    int gpu = o->device == KVT_GPU && kvt_gpu_available();
    if (gpu) bw = rbw = kvt_device_bandwidth_gbs();
    else kvt_bandwidth_gbs(&bw, &rbw);
    printf("context bench: %d sequence(s), prompts of %d tokens, %d decode steps, on %s; read bandwidth %.2f GB/s, "
           "weights %.1f MB\n", B, T, steps, gpu ? kvt_gpu_name() : "the CPU", rbw, wb / 1e6);
    printf("%-5s %5s %6s %12s %12s %14s %12s %9s\n", "dtype", "batch", "ctx", "prefill t/s", "decode t/s",
           "bytes/step", "bound t/s", "of bound");
    if (csv) fprintf(csv, "dtype,batch,ctx,prefill_tokens_per_s,decode_tokens_per_s,bytes_per_step,"
                          "bound_tokens_per_s,fraction_of_bound\n");
    int *toks = (int *)kvt_malloc((size_t)B * (T + steps) * sizeof(int)), *ones = (int *)kvt_malloc((size_t)B * sizeof(int));
    int *step_toks = (int *)kvt_malloc((size_t)B * sizeof(int));
    float *logits = (float *)kvt_malloc((size_t)B * V * sizeof(float));
    kvt_seq *seqs = (kvt_seq *)calloc((size_t)B, sizeof(kvt_seq));
    kvt_seq **ptr = (kvt_seq **)kvt_malloc((size_t)B * sizeof(kvt_seq *));
    KVT_ASSERT(seqs);
    kvt_fake_tokens(toks, B * (T + steps), V); /* a different prompt for every sequence */
    for (int dt = KVT_FP32; dt <= KVT_INT8 && st == KVT_OK; dt++) {
        kvt_options bo = *o;
        bo.kv_dtype = (kvt_dtype)dt;
        bo.max_seqs = B;
        bo.max_rows = B > o->max_rows ? B : o->max_rows;
        bo.prefix_reuse = 0; /* each sequence computes and stores its own prompt */
        kvt_engine *e;
        if ((st = kvt_engine_create(&e, m, &bo)) != KVT_OK) break;
        double t0 = kvt_now();
        for (int b = 0; b < B && st == KVT_OK; b++) {
            ptr[b] = &seqs[b];
            ones[b] = 1;
            if ((st = kvt_seq_init(e, &seqs[b])) == KVT_OK)
                st = kvt_forward(e, &seqs[b], toks + (size_t)b * (T + steps), T, logits, 0);
        }
        double t_prefill = kvt_since(t0), cache_bytes = 0;
        t0 = kvt_now();
        for (int i = 0; i < steps && st == KVT_OK; i++) {
            for (int b = 0; b < B; b++) step_toks[b] = toks[(size_t)b * (T + steps) + T + i];
            st = kvt_forward_batch(e, ptr, B, step_toks, ones, logits);
            cache_bytes += (double)B * (T + i + 1) * L * 2 * KVD * ((double)kvt_dtype_bits(bo.kv_dtype) / 8 +
                                                                  (bo.kv_dtype == KVT_INT8 ? 4.0 / bo.kv_group : 0));
        }
        double t_decode = kvt_since(t0) / steps, bytes = wb + cache_bytes / steps, bound = B * rbw * 1e9 / bytes;
        if (st == KVT_OK) {
            printf("%-5s %5d %6d %12.1f %12.1f %14.0f %12.1f %8.0f%%\n", kvt_dtype_name(bo.kv_dtype), B, T,
                   B * T / t_prefill, B / t_decode, bytes, bound, 100.0 * B / t_decode / bound);
            if (csv) fprintf(csv, "%s,%d,%d,%.2f,%.2f,%.0f,%.2f,%.4f\n", kvt_dtype_name(bo.kv_dtype), B, T,
                             B * T / t_prefill, B / t_decode, bytes, bound, B / t_decode / bound);
        }
        for (int b = 0; b < B; b++) if (seqs[b].table) kvt_seq_free(e, &seqs[b]);
        kvt_engine_free(e);
    }
    free(toks); free(ones); free(step_toks); free(logits); free(seqs); free(ptr);
    return st;
}
/* Where sgemm overtakes our own loops (§9: one weight row at a time up to
 * KVT_ROW_X rows of x, the tile from there), measured: GFLOP/s of both on every
 * layer's w1 (HD x D, the FFN's first matrix) in turn, as a forward pass
 * meets them, for n = 1 .. 256 rows. KVT_SGEMM_ROWS is set from this table.
 * OpenBLAS picks its kernels for the CPU when it loads; the name it chose is
 * printed, since an old OpenBLAS on a new CPU falls back to slow generic ones. */
static kvt_status bench_matmul(kvt_model *m, FILE *csv) {
    int D = m->c.dim, HD = m->c.hidden_dim, L = m->c.n_layers, ns[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256};
    float *x = (float *)kvt_malloc((size_t)256 * D * sizeof(float)), *out = (float *)kvt_malloc((size_t)256 * HD * sizeof(float));
    uint64_t rs = 5;
    kvt_fill_uniform(x, (size_t)256 * D, 1.0f, 0.0f, &rs);
    openblas_set_num_threads(1); /* as the engine runs it: one single-threaded sgemm per core */
    printf("matmul (n x %d) @ (%d x %d)^T per layer, %d layers in turn; OpenBLAS core: %s; %d threads\n", D, HD, D, L,
           openblas_get_corename(), omp_get_max_threads());
    printf("%6s %16s %16s  %s\n", "rows", "loops GFLOP/s", "sgemm GFLOP/s", "faster");
    if (csv) fprintf(csv, "rows,loops_gflops,sgemm_gflops\n");
    for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
        double g[2];
        for (int v = 0; v < 2; v++) {
            int reps = 0;
            double t0 = kvt_now(), t;
            do {
                const float *w = m->w.w1 + (size_t)(reps % L) * HD * D;
                if (v == 0) matmul_rows_cpu(out, x, w, ns[i], D, HD);
                else matmul_sgemm_cpu(out, x, w, ns[i], D, HD);
                reps++;
                t = kvt_now() - t0;
            } while (t < 0.3 || reps < 2 * L);
            g[v] = 2.0 * ns[i] * D * HD * reps / t / 1e9;
        }
        printf("%6d %16.1f %16.1f  %s\n", ns[i], g[0], g[1], g[0] >= g[1] ? "loops" : "sgemm");
        if (csv) fprintf(csv, "%d,%.2f,%.2f\n", ns[i], g[0], g[1]);
    }
    printf("(the engine uses its loops below KVT_SGEMM_ROWS = %d rows: one weight row at a time up to %d rows, tiles "
           "from there; sgemm from %d rows on)\n", KVT_SGEMM_ROWS, KVT_ROW_X, KVT_SGEMM_ROWS);
    free(x);
    free(out);
    return KVT_OK;
}
#endif
