/* tests/serve.c: --serve: many requests through the scheduler (cli/serve.c), checked against solo runs.
 * Included by test.c, in place: one compile, one binary (see test.c). */
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
    so.device = KVT_CPU; /* the solo runs on the CPU: for a GPU serve run, also GPU against CPU */
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
        int ni = v[i].dev == KVT_GPU ? 6 : 12; /* the emulated GPU is slow: fewer requests, preemptions still */
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
