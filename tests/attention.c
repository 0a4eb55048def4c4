/* tests/attention.c: attention on a chunked cache: naive, fused, split, the spec and the plain kernels against float64; the cache writes.
 * Included by test.c, in place: one compile, one binary (see test.c). */
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
