/* tests/engine.c: the engine end to end: cache on = off, quantized caches, prefill, threads, the GPU path, no allocation in a forward, --plain.
 * Included by test.c, in place: one compile, one binary (see test.c). */
// ---- end to end ------------------------------------------------------------------------



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
    /* A covering set, not the product (72 runs of the emulated GPU): every chunk
     * size with every attention mode (naive, fused unsplit, fused split in
     * pieces of 4), and with s = ci + mode the cache type s % 3 and cache on or
     * off s % 2, which meet every pair of values of any two options (s = 0..5
     * gives all six pairs of s % 2 and s % 3). 12 runs. */
    for (int ci = 0; ci < 4; ci++)
        for (int mode = 0; mode < 3; mode++) {
            int dt = (ci + mode) % 3, cache = (ci + mode) % 2;
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
