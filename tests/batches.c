/* tests/batches.c: batches, forks (copy-on-write), prefix reuse, the pool running out; the pool printer (--trace).
 * Included by test.c, in place: one compile, one binary (see test.c). */
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
