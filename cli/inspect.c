/* kvtransformer.cu §15, end: the pool seen from outside, included by
 * kvtransformer.cu at the end of §15. What --stats counts, what --trace
 * prints (and gdb calls), the pool's consistency check, one cached position
 * read back (tests, debugging), the launch count of each kernel, and the
 * hook --dump-attn looks through. Nothing here changes what the engine
 * computes. */

/* The engine's live sequences as an array (NULL when there are none): the
 * form kvt_pool_check and kvt_pool_print_seqs take. */
static const kvt_seq **live_array(kvt_engine *e, int *n) {
    *n = 0;
    for (const kvt_seq *s = e->live; s; s = s->live_next) (*n)++;
    const kvt_seq **a = *n ? (const kvt_seq **)kvt_malloc((size_t)*n * sizeof(*a)) : NULL;
    int i = 0;
    for (const kvt_seq *s = e->live; s; s = s->live_next) a[i++] = s;
    return a;
}
/* The markers kvt_pool_print shows are bookkeeping too: each is 0, 'c' or
 * '+', and a '+' entry (attached by prefix reuse) is a full chunk whose
 * prefix hash is still set (a hash is cleared only when the chunk is freed). */
static kvt_status seq_marks_check(const kvt_pool *p, const kvt_seq *s) {
    for (int j = 0; j < s->n_table; j++) {
        char h = s->how[j];
        int c = s->table[j];
        if (h != 0 && h != 'c' && h != '+')
            return kvt_fail(KVT_EPOOL, "pool check: sequence %d, table entry %d: unknown marker %d", s->id, j, h);
        if (h == '+' && c >= 0 && ((j + 1) * p->CH > s->len || p->prefix_hash[c] == 0))
            return kvt_fail(KVT_EPOOL, "pool check: sequence %d, table entry %d (chunk %d) was attached by prefix "
                            "reuse but is not a full chunk with a prefix hash", s->id, j, c);
    }
    return KVT_OK;
}

/* Consistency of the pool given all live sequences: every chunk's refcount is
 * the number of tables that hold it, and no chunk is both free and held; each
 * slot of the host swap area is held by one table entry or is free, and each
 * sequence's n_swapped counts its swapped entries. */
static kvt_status swap_check(const kvt_pool *p, const kvt_seq *const *seqs, int n_seqs) {
    int *held = (int *)calloc((size_t)p->n_swap + 1, sizeof(int));
    KVT_ASSERT(held);
    kvt_status st = KVT_OK;
    for (int i = 0; i < p->n_swap_free; i++) held[p->swap_free[i]]++;
    for (int i = 0; i < n_seqs && st == KVT_OK; i++) {
        int n = 0;
        for (int j = 0; j < seqs[i]->n_table; j++) {
            int slot = KVT_SWAP_SLOT(seqs[i]->table[j]);
            if (seqs[i]->table[j] > -2) continue;
            n++;
            if (slot >= p->n_swap) st = kvt_fail(KVT_EPOOL, "pool check: sequence %d, table entry %d: swap slot %d of "
                                                 "%d", seqs[i]->id, j, slot, p->n_swap);
            else held[slot]++;
        }
        if (st == KVT_OK && n != seqs[i]->n_swapped)
            st = kvt_fail(KVT_EPOOL, "pool check: sequence %d has %d swapped entries but n_swapped %d", seqs[i]->id, n,
                          seqs[i]->n_swapped);
    }
    for (int k = 0; k < p->n_swap && st == KVT_OK; k++)
        if (held[k] != 1) st = kvt_fail(KVT_EPOOL, "pool check: swap slot %d is %s", k, held[k] ? "free and held, "
                                        "or held twice" : "neither free nor held (lost)");
    free(held);
    return st;
}
kvt_status kvt_pool_check(kvt_engine *e, const kvt_seq *const *seqs, int n_seqs) {
    kvt_pool *p = &e->pool;
    const kvt_seq **all = NULL;
    if (!seqs) seqs = all = live_array(e, &n_seqs); /* the engine's own list (NULL when empty: no entries read) */
    int *refs = (int *)calloc((size_t)p->n_chunks, sizeof(int)), bad = -1;
    kvt_status st = refs ? KVT_OK : kvt_fail(KVT_ENOMEM, "host out of memory (pool check)");
    if (st == KVT_OK) {
        for (int i = 0; i < n_seqs; i++)
            for (int j = 0; j < seqs[i]->n_table; j++)
                if (seqs[i]->table[j] >= 0) refs[seqs[i]->table[j]]++; /* < 0: in the swap area, or none */
        for (int i = 0; i < p->n_free; i++) refs[p->free_list[i]] += 1 << 20; /* a free chunk held too shows up */
        for (int c = 0; c < p->n_chunks && bad < 0; c++)
            if (refs[c] != (p->refcount[c] == 0 ? 1 << 20 : p->refcount[c])) bad = c;
    }
    if (bad >= 0)
        st = kvt_fail(KVT_EPOOL, "pool check: chunk %d has refcount %d but %d table references%s", bad,
                      p->refcount[bad], refs[bad] % (1 << 20),
                      refs[bad] >= (1 << 20) ? " and is on the free list" : "");
    for (int i = 0; i < n_seqs && st == KVT_OK; i++) st = seq_marks_check(p, seqs[i]);
    if (st == KVT_OK) st = swap_check(p, seqs, n_seqs);
    free(refs);
    free(all);
    return st;
}

/* Memory figures for --stats and the tests. A chunk held by several
 * sequences (fork, prefix reuse) counts once in bytes_used and once per
 * holder in bytes_unshared: the difference is what sharing saves. A chunk's
 * unused slots are CH minus the most positions any holder wrote into it. */
/* Bits the cache spends per value (int8: + one float scale per group of G),
 * and so bytes per chunk: what --stats and --trace both count. */
static double pool_bits_per_value(const kvt_pool *p) {
    return (double)kvt_dtype_bits(p->dtype) + (p->scales ? 32.0 / p->G : 0.0);
}
void kvt_cache_usage_of(kvt_engine *e, const kvt_seq *const *seqs, int n_seqs, kvt_cache_usage *u) {
    kvt_pool *p = &e->pool;
    /* 1 + the positions written into each chunk; 0: held by none of seqs */
    int *fill = (int *)calloc((size_t)p->n_chunks, sizeof(int));
    KVT_ASSERT(fill);
    long tables = 0;
    for (int i = 0; i < n_seqs; i++) {
        const kvt_seq *s = seqs[i];
        tables += s->n_table;
        for (int j = 0; j < s->n_table; j++) {
            if (s->table[j] < 0) { tables--; continue; } /* swapped out: holds no chunk of the pool */
            int f = s->len - j * p->CH < p->CH ? s->len - j * p->CH : p->CH;
            if (f < 0) f = 0; /* reserved, not yet written (--serve admits a whole prompt): held, empty */
            if (f + 1 > fill[s->table[j]]) fill[s->table[j]] = f + 1;
        }
    }
    memset(u, 0, sizeof(*u));
    for (int c = 0; c < p->n_chunks; c++)
        if (fill[c]) { u->chunks_used++; u->slots_unused += p->CH - (fill[c] - 1); }
    free(fill);
    u->bits_per_value = pool_bits_per_value(p);
    double chunk_bytes = (double)p->chunk_elems * u->bits_per_value / 8.0;
    u->slots_allocated = (long)u->chunks_used * p->CH;
    u->bytes_used = chunk_bytes * u->chunks_used;
    u->bytes_unshared = chunk_bytes * (double)tables;
}

/* The pool as text (the format is in kvtransformer.h): what --trace prints
 * after each forward call, and what `call kvt_pool_print(stdout, e)` shows in
 * gdb. It reads only the host's bookkeeping (refcounts, free list, tables,
 * markers), which stays on the host whichever device holds the chunks' data,
 * so it works in every build, mid-forward too. */
#define KVT_POOL_ROW 64    /* chunks per row of the pool's map */
#define KVT_POOL_DRAWN 512 /* chunks drawn; a larger pool's rest is counted, not drawn */

void kvt_pool_legend(FILE *f) {
    fprintf(f, "legend: seq N [ its chunk table, in order ] len T; an entry is a chunk id, then\n"
               "  * shared (refcount > 1), then c copied on write or + attached by prefix reuse;\n"
               "  (f/CH) the last chunk holds f of CH positions; pool: one character per chunk,\n"
               "  . free, # held by one table, * shared; saves: (table entries - chunks in use)\n");
    fflush(f);
}
/* seq 1 [ 0* 3c 7+ (2/4) ] len 14 */
static void pool_print_seq(FILE *f, const kvt_pool *p, const kvt_seq *s) {
    fprintf(f, "seq %d [", s->id);
    for (int j = 0; j < s->n_table; j++) {
        int c = s->table[j], h = s->how[j];
        if (c <= -2) { fprintf(f, " h%d", KVT_SWAP_SLOT(c)); continue; } /* in the host swap area */
        if (c < 0) { fprintf(f, " -"); continue; } /* an entry that holds no chunk */
        fprintf(f, " %d%s%s", c, p->refcount[c] > 1 ? "*" : "", h == 'c' ? "c" : h == '+' ? "+" : "");
    }
    /* Positions in the last chunk. Below 0 only in a debugger, mid-forward:
     * chunks are taken before the call and len grows after it (§15). */
    int fill = s->len - (s->n_table - 1) * p->CH;
    if (s->n_table > 0 && fill < p->CH) fprintf(f, " (%d/%d)", fill > 0 ? fill : 0, p->CH);
    fprintf(f, " ] len %d%s\n", s->len, s->n_swapped ? " (swapped out)" : "");
}
/* pool [*##.#...], one character per chunk from its refcount; rows of 64 */
static void pool_print_map(FILE *f, const kvt_pool *p) {
    int n = p->n_chunks, drawn = n < KVT_POOL_DRAWN ? n : KVT_POOL_DRAWN, used = 0, shared = 0;
    char row[KVT_POOL_ROW + 1];
    for (int r0 = 0; r0 < drawn; r0 += KVT_POOL_ROW) {
        int k = drawn - r0 < KVT_POOL_ROW ? drawn - r0 : KVT_POOL_ROW;
        for (int i = 0; i < k; i++) {
            int rc = p->refcount[r0 + i];
            row[i] = rc == 0 ? '.' : rc == 1 ? '#' : '*';
        }
        row[k] = '\0';
        fprintf(f, "%s[%s]", r0 ? "     " : "pool ", row);
        if (n > KVT_POOL_ROW) fprintf(f, " %d..%d", r0, r0 + k - 1); /* which chunks this row shows */
        fprintf(f, "\n");
    }
    if (drawn == n) return;
    for (int c = drawn; c < n; c++) {
        used += p->refcount[c] > 0;
        shared += p->refcount[c] > 1;
    }
    fprintf(f, "     + chunks %d..%d not drawn: in use %d, shared %d, free %d\n", drawn, n - 1, used, shared,
            n - drawn - used);
}
/* The totals, from the refcounts alone (not from the tables printed above), so
 * that a sequence missing from the list, or a refcount gone wrong, shows as a
 * difference: every table entry holds one reference, so the entries beyond
 * one per chunk in use are the chunks that sharing saves. "free" is the free
 * list's count: in use + free = the pool, when the bookkeeping is right. */
static void pool_print_totals(FILE *f, const kvt_pool *p) {
    int used = 0, shared = 0;
    long entries = 0;
    for (int c = 0; c < p->n_chunks; c++) {
        used += p->refcount[c] > 0;
        shared += p->refcount[c] > 1;
        entries += p->refcount[c];
    }
    double chunk_bytes = (double)p->chunk_elems * pool_bits_per_value(p) / 8.0;
    fprintf(f, "totals: in use %d, free %d, shared %d (of %d chunks); %ld table entries: sharing saves %ld x %.0f "
            "= %.0f bytes\n", used, p->n_free, shared, p->n_chunks, entries, entries - used, chunk_bytes,
            chunk_bytes * (double)(entries - used));
}

void kvt_pool_print_seqs(FILE *f, kvt_engine *e, const kvt_seq *const *seqs, int n_seqs) {
    const kvt_pool *p = &e->pool;
    if (!e->o.kv_cache) {
        fprintf(f, "kv cache off: every step recomputes the whole sequence, so there is no pool to show\n");
    } else {
        for (int i = 0; i < n_seqs; i++) pool_print_seq(f, p, seqs[i]);
        pool_print_map(f, p);
        pool_print_totals(f, p);
    }
    fflush(f); /* in gdb, the text appears at once */
}
void kvt_pool_print(FILE *f, kvt_engine *e) {
    int n;
    const kvt_seq **all = live_array(e, &n);
    kvt_pool_print_seqs(f, e, all, n);
    free(all);
}

/* Read one cached position back as fp32 (tests and debugging): copy its KVD
 * stored values (and their scales) to the host and decode them with the same
 * kv_load the attention uses. */
void kvt_cache_read(kvt_engine *e, const kvt_seq *s, int l, int which, int pos, float *out) {
    kvt_pool *p = &e->pool;
    KVT_ASSERT(pos >= 0 && pos < s->len && l >= 0 && l < p->L);
    int KVD = p->NKV * p->HS;
    kvt_kv kv = kv_view(p, s->table, NULL, NULL, NULL);
    size_t i = kv_index(&kv, l, which, 0, pos, 0);
    char raw[KVT_MAX_HS * 4 * 64];
    float sc[KVT_MAX_HS * 64];
    KVT_ASSERT(kvt_dtype_size(p->dtype, (size_t)KVD) <= sizeof(raw));
    buf_download(e->gpu, raw, (char *)p->data + kvt_dtype_size(p->dtype, i), kvt_dtype_size(p->dtype, (size_t)KVD));
    if (p->scales) buf_download(e->gpu, sc, p->scales + i / p->G, (size_t)(KVD / p->G) * sizeof(float));
    kvt_kv host = kv; /* the downloaded slot as a tiny cache of its own (i is a multiple of G) */
    host.data = raw;
    host.scales = sc;
    for (int c = 0; c < KVD; c++) out[c] = kv_load(&host, (size_t)c);
}

/* Launches per kernel, counted by name in both builds (KVT_LAUNCH calls
 * kvt_launch_counted), so a test can ask whether a path really ran a kernel:
 * kvt_launch_count("attn_softmax_warp_kernel") (exercise 4). A small table in
 * first-launch order; a launch costs a scan of at most a few names, nothing
 * next to the launch itself. Launches come from one host thread: no locking. */
#define KVT_MAX_KERNELS 32 /* room for every kernel of the file, twice over */
static struct { const char *name; long count; } kvt_launches[KVT_MAX_KERNELS];
static void kvt_launch_counted(const char *name) { /* name: #kernel, a literal that outlives the table */
    for (int i = 0; i < KVT_MAX_KERNELS; i++)
        if (!kvt_launches[i].name || kvt_launches[i].name == name || !strcmp(kvt_launches[i].name, name)) {
            kvt_launches[i].name = name;
            kvt_launches[i].count++;
            return;
        }
    kvt_fatal(__FILE__, __LINE__, "kernel %s: more than KVT_MAX_KERNELS kernel names launched", name);
}
/* How many times the kernel of that name was launched so far (0: never). */
static __attribute__((unused)) long kvt_launch_count(const char *name) {
    for (int i = 0; i < KVT_MAX_KERNELS && kvt_launches[i].name; i++)
        if (!strcmp(kvt_launches[i].name, name)) return kvt_launches[i].count;
    return 0;
}

/* The hook of --dump-attn (kvt_options.attn_probe): layer l's softmax weights
 * of the call's n rows, (n, NH, TMAX) in e->scores, handed to the probe on the
 * host. The naive path has just left them there. The fused path never forms
 * them (that is its point), so the naive path's own ops compute them once more
 * from the same rotated q and the same cached K: the weights the fused pass
 * used, up to rounding. Their output goes to xb2, which the wo matmul
 * overwrites next. A look, not a hot path: one more naive attention a layer. */
static void attn_probe_rows(kvt_engine *e, kvt_kv kv, int l, int n) {
    int NH = e->m->c.n_heads, TMAX = e->m->c.seq_len;
    if (e->o.attn != KVT_ATTN_NAIVE) e->op->attention_naive(e->xb2, e->q, kv, l, n, NH, e->scores, TMAX);
    buf_download(e->gpu, e->h_scores, e->scores, (size_t)n * NH * TMAX * sizeof(float));
    e->o.attn_probe(e->o.attn_ctx, l, n, e->h_pos, e->h_scores, NH, TMAX);
}
