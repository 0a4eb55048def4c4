/* tests/labs.c: the lab checks (make lab-check N=k), built only with -DKVT_LAB=k.
 * Included by test.c, in place: one compile, one binary (see test.c).
 *
 * A lab empties the bodies of a few functions (exercises/labs/labs.txt) and
 * the student writes them again. Each check below runs in a child process,
 * so a body that crashes, trips an assertion or hangs is one named failure
 * and the run still ends with "N passed, N failed". The unit checks call the
 * student's functions directly and say what was expected in the lab's terms;
 * the end-to-end check runs the engine with --plain (the file's own
 * functions, none of the tuned copies in cpu/ and gpu/) and compares its
 * greedy text with the reference kvt built from the lab's base commit
 * (main's second argument). */
#ifdef KVT_LAB
#include <signal.h>
#include <sys/wait.h>

static const char *lab_ref_bin; /* the reference kvt (make lab-check builds it from the lab's base commit) */
static int lab_gpu;             /* the device of the check being run: 0 CPU, 1 GPU (the emulation in the C build) */

/* Run fn in a child: its PASS/FAIL lines print as it goes, its counts come back
 * through a pipe. A crash or a hang (60 s) counts as one failure, named. */
static void lab_child(const char *what, void (*fn)(void)) {
    int fd[2];
    KVT_ASSERT(pipe(fd) == 0);
    fflush(stdout);
    pid_t pid = fork();
    KVT_ASSERT(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        alarm(60);
        n_pass = n_fail = n_skip = 0;
        fn();
        int c[3] = {n_pass, n_fail, n_skip};
        _exit(write(fd[1], c, sizeof(c)) == (ssize_t)sizeof(c) ? 0 : 3);
    }
    close(fd[1]);
    int c[3] = {0, 0, 0}, status = 0;
    ssize_t got = read(fd[0], c, sizeof(c));
    close(fd[0]);
    waitpid(pid, &status, 0);
    if (got == (ssize_t)sizeof(c) && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        n_pass += c[0];
        n_fail += c[1];
        n_skip += c[2];
        return;
    }
    n_fail++;
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
        printf("FAIL %s: still running after 60 s (a loop that never ends?)\n", what);
    else if (WIFSIGNALED(status))
        printf("FAIL %s: crashed with signal %d (%s) before it finished; gdb shows where: make debug, then\n"
               "     gdb --args ./test_kvt-debug, with a breakpoint in your function\n", what, WTERMSIG(status),
               strsignal(WTERMSIG(status)));
    else
        printf("FAIL %s: exited with status %d before it finished (an assertion? the line above this one is the\n"
               "     last check it finished)\n", what, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}
/* lab_child for the CPU, then for the GPU's kernels where they run. */
static void lab_both(const char *what, void (*fn)(void)) {
    for (lab_gpu = 0; lab_gpu < 1 + kvt_gpu_available(); lab_gpu++) {
        char w[160];
        snprintf(w, sizeof(w), "lab %d, %s: %s", KVT_LAB, lab_gpu ? "GPU" : "CPU", what);
        lab_child(w, fn);
    }
}

/* The end-to-end check: greedy generation on the default model, 120 tokens
 * after "ROMEO:", the student's engine (this binary, --plain) against the
 * reference kvt (--dump-tokens: the ids it fed and chose), for the flags given
 * (--attn naive, --chunk 4, --kv-cache off and --kv-dtype are the ones understood here). */
static void lab_end_to_end(const char *flags) {
    if (getenv("KVT_LAB_NO_E2E")) { /* the labs' selftest, for a wrong body: its unit checks must reject it */
        skip("end to end: KVT_LAB_NO_E2E is set");
        return;
    }
    char cmd[1200];
    const char *ids_path = tmp_file("lab_ref_ids.txt");
    snprintf(cmd, sizeof(cmd), "%.500s -m weights/model.bin -z weights/tokenizer.bin -i 'ROMEO:' -t 0 -n 120 --plain "
             "%.100s --dump-tokens %.200s > /dev/null 2>&1", lab_ref_bin, flags, ids_path);
    int ref[256], mine[256], rc = system(cmd), nref = read_ints(ids_path, ref, 256);
    if (!expect(rc == 0 && nref > 120, "lab %d, end to end: the reference kvt ran (%s)", KVT_LAB, cmd)) return;
    kvt_model m;
    kvt_tokenizer tk;
    KVT_ASSERT(kvt_model_load(&m, "weights/model.bin") == KVT_OK);
    KVT_ASSERT(kvt_tokenizer_load(&tk, "weights/tokenizer.bin", m.c.vocab_size) == KVT_OK);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.plain = 1;
    if (strstr(flags, "--attn naive")) o.attn = KVT_ATTN_NAIVE;
    if (strstr(flags, "--chunk 4")) o.CH = 4;
    if (strstr(flags, "--kv-cache off")) o.kv_cache = 0;
    if (strstr(flags, "--kv-dtype int8")) o.kv_dtype = KVT_INT8;
    if (strstr(flags, "--kv-dtype fp16")) o.kv_dtype = KVT_FP16;
    int np = nref - 120; /* the prompt as kvt encoded it */
    float *lg = (float *)kvt_malloc((size_t)120 * m.c.vocab_size * sizeof(float));
    kvt_status st = generate(&m, &o, ref, np, 120, mine, lg);
    int same = 0;
    while (same < nref && mine[same] == ref[same]) same++;
    char text[512];
    size_t k = 0;
    text[0] = '\0';
    for (int i = np; i < same && k < sizeof(text) - 32; i++) /* what the two agree on, as text */
        k += (size_t)snprintf(text + k, sizeof(text) - k, "%s", kvt_decode(&tk, ref[i - 1], ref[i]));
    for (char *c = text; *c; c++) if (*c == '\n') *c = '|';
    char why[700] = "";
    if (st != KVT_OK) snprintf(why, sizeof(why), "; the engine failed: %.600s", kvt_last_error());
    else if (same < nref)
        snprintf(why, sizeof(why), "; it parts at token %d, after '%s' (| is a newline)", same - np + 1, text);
    expect(st == KVT_OK && same == nref, "lab %d, end to end (--plain %s): greedy generation on the default model "
           "chooses the reference kvt's 120 tokens after 'ROMEO:'%s", KVT_LAB, flags, why);
    free(lg);
    kvt_tokenizer_free(&tk);
    kvt_model_free(&m);
}

#if KVT_LAB == 1 /* causal attention over the cache: attention_naive_cpu, its three GPU kernels */
#define LAB1_WHO (lab_gpu ? "the GPU kernels" : "attention_naive_cpu")
/* Run the naive attention (the student's) on a case and return the output
 * and the cached K, V read back (the reference code's reading, not theirs). */
static float *lab1_run(const acase *c, float **Vdq) {
    size_t no = (size_t)c->n * c->NH * c->HS, nkv = (size_t)c->T * c->NKV * c->HS;
    float *out = (float *)kvt_malloc(no * 4), *K = (float *)kvt_malloc(nkv * 4);
    *Vdq = (float *)kvt_malloc(nkv * 4);
    attn_run(c, lab_gpu, 0, 0, out, K, *Vdq);
    free(K);
    return out;
}
static void lab1_one_position(void) { /* one key: its softmax weight is 1, so out = V[0] */
    acase c = {2, 1, 8, 4, 16, 1, 1, KVT_FP32, 8};
    float *V, *out = lab1_run(&c, &V);
    double err = 0;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 8; i++) err = fmax(err, fabs((double)out[h * 8 + i] - V[i]));
    expect(err < 1e-6, "lab 1, %s, one cached position: a softmax over one score is 1, so each head's output is V[0] "
           "(largest difference %.3g; is out the weighted sum of V, and are the weights divided by their sum?)", LAB1_WHO, err);
    free(out);
    free(V);
}
static void lab1_causal(void) { /* every position a query: row 0 (position 0) may see only position 0 */
    acase c = {2, 1, 8, 4, 16, 6, 6, KVT_FP32, 8};
    float *V, *out = lab1_run(&c, &V);
    double err = 0;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 8; i++) err = fmax(err, fabs((double)out[h * 8 + i] - V[i]));
    expect(err < 1e-6, "lab 1, %s, the causal mask: 6 rows at positions 0..5; row 0 sees only position 0, so its output is V[0] "
           "(largest difference %.3g%s)", LAB1_WHO, err, err != err ? ": NaN, did row 0 mask its own position, t >= p?"
           : err > 1e-6 ? ": it saw later positions; give t > row_pos[r] the score -INFINITY" : "");
    free(out);
    free(V);
}
static void lab1_float64(void) { /* against float64 on shapes that exercise every index */
    acase cases[] = {{4, 2, 16, 3, 64, 40, 5, KVT_FP32, 16}, {4, 2, 32, 5, 64, 60, 3, KVT_INT8, 8},
                     {2, 1, 64, 16, 256, 200, 2, KVT_FP16, 64}};
    for (int i = 0; i < 3; i++) {
        acase *c = &cases[i];
        size_t no = (size_t)c->n * c->NH * c->HS, nkv = (size_t)c->T * c->NKV * c->HS;
        float *K = (float *)kvt_malloc(nkv * 4), *V = (float *)kvt_malloc(nkv * 4), *ref = (float *)kvt_malloc(no * 4);
        float *out = (float *)kvt_malloc(no * 4);
        attn_run(c, lab_gpu, 0, 0, out, K, V);
        attn_ref(c, K, V, ref);
        char what[200];
        snprintf(what, sizeof(what), "lab 1, %s, against float64: %d query heads on %d kv heads (GQA), head size %d, %d cached "
                 "positions in chunks of %d, the last %d rows, %s cache", LAB1_WHO, c->NH, c->NKV, c->HS, c->T, c->CH, c->n,
                 kvt_dtype_name(c->dt));
        int ok = kvt_check(what, out, ref, (long)no, "row=64,head=64,ch=1024", TOL_ATTN, "TOL_ATTN");
        tally(ok);
        if (!ok && i == 0)
            printf("     (the scale is 1/sqrt(HS); query head h reads kv head h / (NH / NKV); the keys are read "
                   "through kv_index and kv_dot, the values through kv_axpy)\n");
        free(K); free(V); free(ref); free(out);
    }
}
static void lab1_e2e(void) { lab_end_to_end("--attn naive"); }
static void lab_check(void) {
    lab_both("one cached position", lab1_one_position);
    lab_both("the causal mask", lab1_causal);
    lab_both("the general case", lab1_float64);
    lab_child("lab 1, end to end", lab1_e2e);
}
#elif KVT_LAB == 2 /* where a position lives: kv_index, kv_write_cpu */
/* kv_index against the layout's formula, worked out by hand: pool shape
 * L = 2, NKV = 2, HS = 8, CH = 16, so a chunk holds (L, 2, CH, NKV, HS) =
 * 2 * 2 * 16 * 16 = 1024 values; sequence table {5, 2, 7} starting at
 * tables[1] (tables[0] belongs to another sequence). */
static void lab2_index(void) {
    int tables[4] = {9, 5, 2, 7};
    kvt_kv kv;
    memset(&kv, 0, sizeof(kv));
    kv.CH = 16;
    kv.NKV = 2;
    kv.HS = 8;
    kv.chunk_elems = 1024;
    kv.tables = tables;
    struct { int l, which, pos, h; } at[] = {{0, 0, 0, 0}, {0, 0, 3, 0}, {0, 0, 0, 1}, {0, 1, 0, 0}, {1, 0, 0, 0},
                                             {0, 0, 17, 0}, {1, 1, 17, 1}, {1, 0, 47, 1}, {0, 1, 31, 0}};
    int bad = 0;
    for (int i = 0; i < 9 && bad < 3; i++) {
        int l = at[i].l, w = at[i].which, pos = at[i].pos, h = at[i].h, t = pos / 16, slot = pos % 16;
        size_t want = (size_t)tables[1 + t] * 1024 + ((size_t)(l * 2 + w) * 16 + slot) * 16 + (size_t)h * 8;
        size_t got = kv_index(&kv, l, w, 1, pos, h);
        if (got == want) continue;
        bad++;
        size_t gc = got / 1024, r = got % 1024; /* what the returned index points at */
        printf("FAIL lab 2: position %d with CH 16 lives in table[%d] = chunk %d, slot %d; layer %d, %s, kv head %d is "
               "element %d * 1024 + ((%d * 2 + %d) * 16 + %d) * 16 + %d * 8 = %zu; your kv_index returned %zu: chunk "
               "%zu, layer %zu, %s, slot %zu, kv head %zu, channel %zu\n", pos, t, tables[1 + t], slot, l, w ? "V" : "K",
               h, tables[1 + t], l, w, slot, h, want, got, gc, r / 512, (r / 256) % 2 ? "V" : "K", (r / 16) % 16,
               (r % 16) / 8, r % 8);
    }
    tally(bad == 0);
    if (bad == 0) printf("PASS lab 2: kv_index finds 9 positions (chunk boundaries, both layers, K and V, both kv heads)\n");
}
/* kv_write_cpu: three rows of one call, from two sequences (tables at
 * tables[0] and tables[2]), at positions 5, 6 and 17; each row's K and V must
 * land where the layout's formula says, and nowhere else. fp32 (exact) and
 * int8 (within scale / 2). */
static void lab2_write(void) {
    for (int dt = 0; dt < 2; dt++) {
        kvt_pool p;
        int G = 4;
        KVT_ASSERT(pool_init(&p, 0, 2, 2, 8, 16, 6, dt ? KVT_INT8 : KVT_FP32, G) == KVT_OK);
        memset(p.data, 0, kvt_dtype_size(p.dtype, p.chunk_elems) * 6); /* so a stray write shows */
        if (p.scales) memset(p.scales, 0, p.chunk_scales * 6 * sizeof(float));
        int tables[4] = {4, 1, 0, 3}, row_tab[3] = {0, 2, 2}, row_pos[3] = {5, 6, 17}, row_len[3] = {6, 18, 18};
        kvt_kv kv = kv_view(&p, tables, row_tab, row_pos, row_len);
        float *k = frand(3 * 16, 1.0f, 41), *v = frand(3 * 16, 1.0f, 42);
        kv_write_cpu(kv, k, v, 1, 3);
        float *all = (float *)kvt_malloc(p.chunk_elems * 6 * sizeof(float));
        for (size_t i = 0; i < p.chunk_elems * 6; i++) { /* every stored value decoded, by hand */
            if (dt == 0) all[i] = ((float *)p.data)[i];
            else all[i] = ((int8_t *)p.data)[i] * p.scales[i / G];
        }
        int bad = 0, stray = 0;
        size_t nvals = p.chunk_elems * 6;
        char *hit = (char *)calloc(nvals, 1);
        for (int r = 0; r < 3 && bad < 3; r++)
            for (int w = 0; w < 2; w++)
                for (int h = 0; h < 2; h++) {
                    int pos = row_pos[r], chunk = tables[row_tab[r] + pos / 16], slot = pos % 16;
                    size_t at = (size_t)chunk * p.chunk_elems + ((size_t)(1 * 2 + w) * 16 + slot) * 16 + (size_t)h * 8;
                    double err = 0;
                    for (int c = 0; c < 8; c++) {
                        err = fmax(err, fabs((double)all[at + c] - (w ? v : k)[r * 16 + h * 8 + c]));
                        hit[at + c] = 1;
                    }
                    if (err > (dt ? 0.5 / 127 + 1e-6 : 0)) {
                        if (bad++ < 3)
                            printf("FAIL lab 2 (%s cache): row %d (position %d of the sequence whose table starts at "
                                   "tables[%d]) should have its %s of kv head %d in chunk %d, slot %d, layer 1: found "
                                   "values off by %.3g there\n", dt ? "int8" : "fp32", r, pos, row_tab[r], w ? "V" : "K",
                                   h, chunk, slot, err);
                    }
                }
        for (size_t i = 0; i < nvals; i++) stray += !hit[i] && all[i] != 0.0f;
        expect(bad == 0 && stray == 0, "lab 2 (%s cache): kv_write_cpu stores 3 rows of two sequences (positions 5, "
               "6, 17) where kv_index says, %d values written elsewhere", dt ? "int8" : "fp32", stray);
        free(hit); free(all); free(k); free(v);
        pool_free(&p);
    }
}
static void lab2_e2e(void) { lab_end_to_end("--chunk 4"); }
static void lab_check(void) {
    lab_child("lab 2: kv_index", lab2_index);
    lab_child("lab 2: kv_write_cpu", lab2_write);
    lab_child("lab 2, end to end", lab2_e2e);
}
#elif KVT_LAB == 3 /* a pool of chunks: pool_take, pool_release, seq_chunks_needed, kvt_step */
static void lab3_take_release(void) {
    kvt_pool p;
    KVT_ASSERT(pool_init(&p, 0, 1, 1, 8, 4, 5, KVT_FP32, 8) == KVT_OK);
    int got[5], ok = 1;
    for (int i = 0; i < 5; i++) {
        got[i] = pool_take(&p);
        ok &= got[i] == i && p.refcount[i] == 1;
    }
    if (!expect(ok && p.n_free == 0 && p.peak_used == 5, "lab 3: pool_take on a fresh pool of 5 chunks hands out chunks "
                "0, 1, 2, 3, 4 (the top of the free list first), each with refcount 1, leaving n_free 0 and peak_used 5; "
                "yours gave %d %d %d %d %d, n_free %d, peak_used %d", got[0], got[1], got[2], got[3], got[4], p.n_free,
                p.peak_used)) { pool_free(&p); return; }
    p.refcount[2] = 2; /* a second holder, as after a fork */
    p.prefix_hash[2] = 77;
    pool_release(&p, 2);
    expect(p.refcount[2] == 1 && p.n_free == 0 && p.prefix_hash[2] == 77, "lab 3: pool_release of chunk 2, held "
           "twice: one holder fewer (refcount 1), and the chunk stays in use (n_free stays 0, its prefix hash stays); "
           "yours left refcount %d, n_free %d, prefix_hash %llu", p.refcount[2], p.n_free,
           (unsigned long long)p.prefix_hash[2]);
    pool_release(&p, 2);
    pool_release(&p, 4);
    int ok2 = p.refcount[2] == 0 && p.n_free == 2 && p.prefix_hash[2] == 0;
    expect(ok2, "lab 3: the last holder of chunk 2 lets go, then chunk 4's: both are free (n_free 2, refcount 0) and "
           "chunk 2's prefix hash is forgotten (0: its contents will be overwritten); yours left n_free %d, refcount %d, "
           "prefix_hash %llu", p.n_free, p.refcount[2], (unsigned long long)p.prefix_hash[2]);
    if (ok2) {
        int a = pool_take(&p), b = pool_take(&p);
        expect(a == 4 && b == 2 && p.peak_used == 5, "lab 3: after releasing 2 then 4, pool_take gives 4, then 2 (the "
               "free list is a stack: the last chunk given back is the first taken) and peak_used stays 5; yours gave %d, "
               "%d, peak_used %d", a, b, p.peak_used);
    }
    pool_free(&p);
}
static void lab3_needed(void) {
    kvt_pool p;
    KVT_ASSERT(pool_init(&p, 0, 1, 1, 8, 4, 8, KVT_FP32, 8) == KVT_OK);
    int table[8] = {3, 5, 0, 0, 0, 0, 0, 0};
    p.refcount[3] = p.refcount[5] = 1;
    kvt_seq s;
    memset(&s, 0, sizeof(s));
    s.table = table;
    struct { int len, n_table, shared, new_len, want; const char *why; } c[] = {
        {0, 0, 0, 1, 1, "an empty sequence needs one chunk for its first position"},
        {0, 0, 0, 4, 1, "positions 0..3 fit one chunk of CH 4"},
        {0, 0, 0, 5, 2, "positions 0..4 need two chunks"},
        {6, 2, 0, 8, 0, "6 cached in 2 chunks: positions 6 and 7 fit the second chunk"},
        {6, 2, 0, 9, 1, "6 cached in 2 chunks: position 8 needs a third"},
        {6, 2, 1, 7, 1, "the partly filled second chunk is shared (refcount 2): writing position 6 needs a private copy"},
        {6, 2, 1, 9, 2, "a copy of the shared second chunk, and a third chunk"},
        {8, 2, 1, 9, 1, "the shared second chunk is full: position 8 goes to a new chunk, nothing is copied"},
        {6, 2, 1, 6, 0, "nothing new to write: no chunk, no copy"}};
    int bad = 0;
    for (int i = 0; i < 9; i++) {
        s.len = c[i].len;
        s.n_table = c[i].n_table;
        p.refcount[5] = 1 + c[i].shared;
        int got = seq_chunks_needed(&p, &s, c[i].new_len);
        if (got != c[i].want && bad++ < 4)
            printf("FAIL lab 3: seq_chunks_needed, CH 4, len %d in %d chunk(s), new_len %d: %s, so %d; yours said %d\n",
                   c[i].len, c[i].n_table, c[i].new_len, c[i].why, c[i].want, got);
    }
    tally(bad == 0);
    if (!bad) printf("PASS lab 3: seq_chunks_needed counts chunks for 9 cases (empty, chunk boundaries, copy on write)\n");
    pool_free(&p);
}
/* kvt_step against kvt_forward on a fresh sequence: with the cache only the new
 * tokens run, without it the whole history runs again; the logits are the same. */
static void lab3_step(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, 2, 4, 2, 128, 61, 64), 5) == KVT_OK);
    int hist[12], V = m.c.vocab_size;
    for (int i = 0; i < 12; i++) hist[i] = (i * 17 + 3) % V;
    float *lg = (float *)kvt_malloc((size_t)V * 4), *ref = (float *)kvt_malloc((size_t)V * 4);
    for (int cache = 1; cache >= 0; cache--) {
        kvt_options o;
        kvt_options_default(&o);
        o.device = KVT_CPU;
        o.plain = 1;
        o.CH = 4;
        o.kv_cache = cache;
        kvt_engine *e, *er;
        KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
        o.kv_cache = 1;
        KVT_ASSERT(kvt_engine_create(&er, &m, &o) == KVT_OK);
        kvt_seq s;
        kvt_seq_init(e, &s);
        int bad = 0;
        double worst = 0;
        for (int n = 6; n <= 12 && !bad; n++) {
            kvt_status st = kvt_step(e, &s, hist, n, lg);
            kvt_seq r;
            kvt_seq_init(er, &r);
            KVT_ASSERT(kvt_forward(er, &r, hist, n, ref, 0) == KVT_OK);
            kvt_seq_free(er, &r);
            double w;
            int same = rows_close(lg, ref, 1, V, TOL_E2E, &w);
            worst = fmax(worst, w);
            if (st != KVT_OK || s.len != n || !same) {
                bad = 1;
                printf("FAIL lab 3, kvt_step (cache %s): the step with %d tokens of history should return KVT_OK, leave "
                       "the sequence holding %d positions and give the logits of all %d tokens; yours returned %d (%s), "
                       "len %d, logits off by %.3g of their largest\n", cache ? "on" : "off", n, n, n, (int)st,
                       st != KVT_OK ? kvt_last_error() : "ok", s.len, w);
            }
        }
        long rows = e->n_prefill + e->n_decode, want = cache ? 12 : 6 + 7 + 8 + 9 + 10 + 11 + 12;
        if (!bad)
            expect(rows == want, "lab 3, kvt_step (cache %s): a prompt of 6 tokens, then 6 steps of one: %s, %ld rows "
                   "in all; yours ran %ld", cache ? "on" : "off", cache ? "with the cache only the new tokens run" :
                   "without it each step empties the sequence (kvt_seq_reset) and runs all of history again", want, rows);
        if (cache && !bad) {
            kvt_status st = kvt_step(e, &s, hist, 12, lg);
            expect(st == KVT_EARG && s.len == 12, "lab 3, kvt_step: a step whose history is no longer than what is "
                   "cached (12 of 12) is an error, KVT_EARG, and changes nothing; yours returned %d, len %d", (int)st, s.len);
        }
        tally(!bad);
        if (!bad) printf("PASS lab 3, kvt_step (cache %s): 7 steps give the logits of a fresh forward (worst %.2g)\n",
                         cache ? "on" : "off", worst);
        kvt_seq_free(e, &s);
        kvt_engine_free(e);
        kvt_engine_free(er);
    }
    free(lg);
    free(ref);
    kvt_model_free(&m);
}
static void lab3_e2e(void) { lab_end_to_end("--chunk 4"); }
static void lab3_e2e_nocache(void) { lab_end_to_end("--chunk 4 --kv-cache off"); }
static void lab_check(void) {
    lab_child("lab 3: pool_take, pool_release", lab3_take_release);
    lab_child("lab 3: seq_chunks_needed", lab3_needed);
    lab_child("lab 3: kvt_step", lab3_step);
    lab_child("lab 3, end to end", lab3_e2e);
    lab_child("lab 3, end to end without the cache", lab3_e2e_nocache);
}
#elif KVT_LAB == 4 /* sharing: seq_needs_cow, pool_copy_chunk, seq_reserve, kvt_seq_fork */
static void lab4_needs_cow(void) {
    kvt_pool p;
    KVT_ASSERT(pool_init(&p, 0, 1, 1, 8, 4, 4, KVT_FP32, 8) == KVT_OK);
    int table[4] = {2, 1, 0, 0};
    kvt_seq s;
    memset(&s, 0, sizeof(s));
    s.table = table;
    p.refcount[2] = 1;
    struct { int len, n_table, shared, new_len, want; const char *why; } c[] = {
        {6, 2, 1, 7, 1, "position 6 goes into the partly filled second chunk, which another sequence also holds"},
        {6, 2, 0, 7, 0, "the partly filled second chunk is this sequence's alone: write in place"},
        {8, 2, 1, 9, 0, "the shared second chunk is full: position 8 starts a new chunk"},
        {6, 2, 1, 6, 0, "nothing new is written"},
        {0, 0, 0, 1, 0, "an empty sequence has no chunk to share"}};
    int bad = 0;
    for (int i = 0; i < 5; i++) {
        s.len = c[i].len;
        s.n_table = c[i].n_table;
        p.refcount[1] = 1 + c[i].shared;
        int got = seq_needs_cow(&p, &s, c[i].new_len);
        if (!!got != c[i].want && bad++ < 4)
            printf("FAIL lab 4: seq_needs_cow, CH 4, len %d in chunks {2, 1}, chunk 1 held by %d, new_len %d: %s, so "
                   "%d; yours said %d\n", c[i].len, 1 + c[i].shared, c[i].new_len, c[i].why, c[i].want, got);
    }
    tally(bad == 0);
    if (!bad) printf("PASS lab 4: seq_needs_cow decides 5 cases (shared or not, partly filled or full, empty)\n");
    pool_free(&p);
}
/* Fill every chunk of an int8 pool with its own pattern (data and scales);
 * d and sc get a host copy. */
static void lab4_fill(kvt_pool *p, int8_t *d, float *sc) {
    size_t ce = p->chunk_elems, cs = p->chunk_scales;
    for (int c = 0; c < p->n_chunks; c++) {
        for (size_t i = 0; i < ce; i++) d[c * ce + i] = (int8_t)((c * 31 + (int)(i * 7)) % 250 - 125);
        for (size_t i = 0; i < cs; i++) sc[c * cs + i] = (float)c + 0.001f * (float)i;
    }
    buf_upload(p->on_device, p->data, d, ce * (size_t)p->n_chunks);
    buf_upload(p->on_device, p->scales, sc, cs * (size_t)p->n_chunks * sizeof(float));
}
/* 1 when chunk c of p holds what chunk `want` held when lab4_fill ran (d, sc);
 * *data_same: its values alone. */
static int lab4_chunk_is(const kvt_pool *p, int c, const int8_t *d, const float *sc, int want, int *data_same) {
    size_t ce = p->chunk_elems, cs = p->chunk_scales;
    int8_t *g = (int8_t *)kvt_malloc(ce);
    float *gs = (float *)kvt_malloc(cs * 4);
    buf_download(p->on_device, g, (int8_t *)p->data + (size_t)c * ce, ce);
    buf_download(p->on_device, gs, p->scales + (size_t)c * cs, cs * 4);
    int dsame = !memcmp(g, d + (size_t)want * ce, ce), same = dsame && !memcmp(gs, sc + (size_t)want * cs, cs * 4);
    if (data_same) *data_same = dsame;
    free(g);
    free(gs);
    return same;
}
static void lab4_copy(void) {
    kvt_pool p;
    KVT_ASSERT(pool_init(&p, lab_gpu, 2, 2, 8, 4, 5, KVT_INT8, 4) == KVT_OK);
    size_t ce = p.chunk_elems, cs = p.chunk_scales, n = (size_t)p.n_chunks;
    int8_t *d = (int8_t *)kvt_malloc(ce * n);
    float *sc = (float *)kvt_malloc(cs * n * 4);
    lab4_fill(&p, d, sc);
    pool_copy_chunk(&p, 1, 3);
    int data_ok, whole = lab4_chunk_is(&p, 1, d, sc, 3, &data_ok), others = 1;
    for (int c = 0; c < 5; c++) if (c != 1) others &= lab4_chunk_is(&p, c, d, sc, c, NULL);
    expect(whole && others, "lab 4, %s: pool_copy_chunk(p, 1, 3) on an int8 pool makes chunk 1 a copy of chunk 3: its "
           "%zu int8 values %s, its %zu scales %s; the other chunks %s", lab_gpu ? "GPU pool" : "CPU pool", ce,
           data_ok ? "equal" : "DIFFER", cs, whole ? "equal" : data_ok ? "DIFFER (the scales are part of the chunk)" :
           "(not compared)", others ? "unchanged" : "CHANGED");
    free(d); free(sc);
    pool_free(&p);
}
/* seq_reserve on a pool of 6 chunks of CH 4 (int8, so a copy must take the
 * scales too): a new sequence, a request that does not fit, a copy on write
 * of a shared last chunk, and a copy on write that does not fit. */
static void lab4_reserve(void) {
    kvt_pool p;
    KVT_ASSERT(pool_init(&p, 0, 1, 1, 8, 4, 6, KVT_INT8, 8) == KVT_OK);
    int8_t *d = (int8_t *)kvt_malloc(p.chunk_elems * 6);
    float *sc = (float *)kvt_malloc(p.chunk_scales * 6 * 4);
    lab4_fill(&p, d, sc);
    int ta[8] = {0}, tb[8] = {0}, before[8], ok;
    char ha[8] = {0}, hb[8] = {0};
    kvt_seq a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    a.table = ta; a.how = ha; a.max_table = 8;
    b.table = tb; b.how = hb; b.max_table = 8; b.id = 1;
    kvt_status st = seq_reserve(&p, &a, 9, "lab 4's sequence");
    ok = st == KVT_OK && a.n_table == 3 && p.n_free == 3 && a.len == 0;
    for (int i = 0; i < 3 && ok; i++) ok &= ta[i] >= 0 && ta[i] < 6 && p.refcount[ta[i]] == 1 && ta[i] != ta[(i + 1) % 3];
    if (!expect(ok, "lab 4: seq_reserve(p, s, 9) on an empty sequence, CH 4, a pool of 6: three chunks taken with "
                "pool_take (n_table 3, refcount 1 each, n_free 3), len unchanged (kvt_forward sets it); yours returned "
                "%d, n_table %d, n_free %d, len %d", (int)st, a.n_table, p.n_free, a.len)) goto done;
    memcpy(before, ta, sizeof(before));
    st = seq_reserve(&p, &a, 30, "lab 4's sequence");
    ok = st == KVT_EPOOL && a.n_table == 3 && p.n_free == 3 && !memcmp(before, ta, sizeof(before));
    if (!expect(ok, "lab 4: seq_reserve to 30 positions needs 5 more chunks and 3 are free: KVT_EPOOL (%d), and nothing "
                "changes, so an exhausted pool loses nothing; yours returned %d, n_table %d, n_free %d", (int)KVT_EPOOL,
                (int)st, a.n_table, p.n_free)) goto done;
    /* b shares a's three chunks, as a fork of a would; 9 positions, the third chunk holds one */
    a.len = b.len = 9;
    b.n_table = 3;
    for (int i = 0; i < 3; i++) { tb[i] = ta[i]; p.refcount[ta[i]]++; }
    st = seq_reserve(&p, &b, 10, "lab 4's fork");
    int data_same = 0, copied = st == KVT_OK && tb[2] != ta[2] && tb[2] >= 0 && tb[2] < 6 &&
                                lab4_chunk_is(&p, tb[2], d, sc, ta[2], &data_same);
    ok = copied && tb[0] == ta[0] && tb[1] == ta[1] && p.refcount[ta[0]] == 2 && p.refcount[ta[2]] == 1 &&
         p.refcount[tb[2]] == 1 && p.n_free == 2 && b.n_table == 3 && hb[2] == 'c' && p.cow_copies == 1;
    if (!expect(ok, "lab 4: the fork b writes position 9 into the third chunk, which it shares with a: b gets a fresh "
                "chunk holding a copy of it (%s), a keeps its own (refcount 1 each), the two full chunks stay shared "
                "(refcount 2), n_free 2, b.how[2] = 'c' and cow_copies 1 (for kvt_pool_print and --stats); yours returned "
                "%d, b's table {%d %d %d} against a's {%d %d %d}, n_free %d, how '%c', cow_copies %ld",
                copied ? "equal, scales too" : data_same ? "the scales DIFFER" : "NOT a copy", (int)st, tb[0], tb[1],
                tb[2], ta[0], ta[1], ta[2], p.n_free, hb[2] ? hb[2] : '0', p.cow_copies)) goto done;
    /* one chunk free, b's last chunk shared again: growing b to 13 needs a copy and a new chunk */
    (void)pool_take(&p);
    p.refcount[tb[2]]++;
    b.len = 10;
    memcpy(before, tb, sizeof(before));
    int rc_before[6];
    memcpy(rc_before, p.refcount, sizeof(rc_before));
    st = seq_reserve(&p, &b, 13, "lab 4's fork");
    expect(st == KVT_EPOOL && !memcmp(before, tb, sizeof(before)) && !memcmp(rc_before, p.refcount, sizeof(rc_before)) &&
           p.n_free == 1 && b.n_table == 3 && p.cow_copies == 1, "lab 4: growing b to 13 positions needs a copy of its "
           "shared third chunk and a fourth chunk, 2 with 1 free: KVT_EPOOL and nothing changes, not even the copy; yours "
           "returned %d, n_free %d, n_table %d, cow_copies %ld", (int)st, p.n_free, b.n_table, p.cow_copies);
done:
    free(d); free(sc);
    pool_free(&p);
}
/* kvt_seq_fork in an engine: the fork shares every chunk; then the fork and
 * the original each take a different next token, and each must give the
 * logits of a sequence that never shared anything (computed in a second
 * engine). A fork that writes into the original's chunk changes its logits. */
static void lab4_fork(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, 2, 4, 2, 128, 61, 64), 6) == KVT_OK);
    int V = m.c.vocab_size, hist[12];
    for (int i = 0; i < 10; i++) hist[i] = (i * 13 + 5) % V;
    kvt_options o;
    kvt_options_default(&o);
    o.device = lab_gpu ? KVT_GPU : KVT_CPU;
    o.plain = 1;
    o.CH = 4;
    o.max_seqs = 3;
    o.swap_chunks = 4;
    kvt_engine *e, *er;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    KVT_ASSERT(kvt_engine_create(&er, &m, &o) == KVT_OK);
    float *la = (float *)kvt_malloc((size_t)V * 4), *lb = (float *)kvt_malloc((size_t)V * 4);
    float *ra = (float *)kvt_malloc((size_t)V * 4), *rb = (float *)kvt_malloc((size_t)V * 4);
    kvt_seq a, b, c, r;
    memset(&b, 0, sizeof(b));
    memset(&c, 0, sizeof(c));
    kvt_seq_init(e, &a);
    KVT_ASSERT(kvt_forward(e, &a, hist, 10, la, 0) == KVT_OK);
    kvt_pool *p = &e->pool;
    kvt_status st = kvt_seq_fork(e, &b, &a);
    int ok = st == KVT_OK && b.n_table == 3 && b.len == 10 && b.table && b.tokens &&
             !memcmp(b.tokens, a.tokens, 10 * sizeof(int)) && p->shared_hits == 3;
    for (int i = 0; i < 3 && ok; i++) ok &= b.table[i] == a.table[i] && p->refcount[a.table[i]] == 2;
    if (!expect(ok, "lab 4, %s: kvt_seq_fork of a sequence of 10 positions (CH 4, 3 chunks): the fork is a new sequence "
                "(kvt_seq_init) with the same 3 chunks, each now held twice, the same len and tokens, and shared_hits 3 "
                "(--stats); yours returned %d, n_table %d, len %d, shared_hits %ld", lab_gpu ? "GPU" : "CPU", (int)st,
                b.n_table, b.len, p->shared_hits)) goto done;
    int x = 7, y = 9;
    KVT_ASSERT(kvt_forward(e, &b, &x, 1, lb, 0) == KVT_OK);
    KVT_ASSERT(kvt_forward(e, &a, &y, 1, la, 0) == KVT_OK);
    for (int k = 0; k < 2; k++) { /* the same histories in the second engine, nothing shared */
        hist[10] = k ? y : x;
        kvt_seq_init(er, &r);
        KVT_ASSERT(kvt_forward(er, &r, hist, 11, k ? ra : rb, 0) == KVT_OK);
        kvt_seq_free(er, &r);
    }
    double wa, wb;
    int oka = rows_close(la, ra, 1, V, TOL_E2E, &wa), okb = rows_close(lb, rb, 1, V, TOL_E2E, &wb);
    expect(oka && okb && a.table[2] != b.table[2] && a.table[1] == b.table[1], "lab 4, %s: after the fork, b takes "
           "token %d and a token %d at position 10: each gives the logits of its own history computed without sharing "
           "(a off by %.2g, b by %.2g of the largest%s), the third chunk is now private to each, the first two shared",
           lab_gpu ? "GPU" : "CPU", x, y, wa, wb, oka ? "" : "; a changed: did b write into a's chunk?");
    KVT_ASSERT(kvt_seq_swap_out(e, &a) == KVT_OK);
    int rc0 = p->refcount[a.table[0]];
    st = kvt_seq_fork(e, &c, &a);
    expect(st != KVT_OK && p->refcount[a.table[0]] == rc0, "lab 4, %s: a swapped-out sequence cannot be forked (its "
           "chunks are in host memory): an error, refcounts unchanged; yours returned %d", lab_gpu ? "GPU" : "CPU",
           (int)st);
    if (st == KVT_OK) kvt_seq_free(e, &c);
    KVT_ASSERT(kvt_seq_swap_in(e, &a) == KVT_OK);
done:
    kvt_seq_free(e, &b);
    kvt_seq_free(e, &a);
    free(la); free(lb); free(ra); free(rb);
    kvt_engine_free(e);
    kvt_engine_free(er);
    kvt_model_free(&m);
}
static void lab4_e2e(void) { lab_end_to_end("--chunk 4"); }
static void lab_check(void) {
    lab_child("lab 4: seq_needs_cow", lab4_needs_cow);
    lab_both("pool_copy_chunk", lab4_copy);
    lab_child("lab 4: seq_reserve", lab4_reserve);
    lab_both("kvt_seq_fork", lab4_fork);
    lab_child("lab 4, end to end", lab4_e2e);
}
#elif KVT_LAB == 5 /* the cache in fewer bits: quantize_group, kv_store, kv_load_at, kv_dot, kv_axpy */
/* The int8 rule by hand, in float64: scale = max|x| / 127, q = round(x / scale). */
static double lab5_q(double x, double scale) { return scale > 0 ? fmin(127, fmax(-127, round(x / scale))) : 0; }
static void lab5_quantize(void) {
    const float x[8] = {1.0f, -2.0f, 12.7f, 0.0f, -12.7f, 6.3f, 3.1f, -0.04f};
    const int want[8] = {10, -20, 127, 0, -127, 63, 31, 0};
    int8_t q[32] = {0};
    float s = quantize_group(x, q, 8);
    int same = 1;
    for (int i = 0; i < 8; i++) same &= q[i] == want[i];
    expect(same && fabsf(s - 12.7f / 127.0f) <= 1e-7f, "lab 5: quantize_group of {1, -2, 12.7, 0, -12.7, 6.3, 3.1, "
           "-0.04}: max |x| is 12.7, so scale 0.1 and q = {10 -20 127 0 -127 63 31 0}; yours: scale %.7g, q = {%d %d %d %d "
           "%d %d %d %d}", s, q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]);
    const float z[8] = {0};
    memset(q, 5, sizeof(q));
    s = quantize_group(z, q, 8);
    same = 1;
    for (int i = 0; i < 8; i++) same &= q[i] == 0;
    expect(s == 0.0f && same, "lab 5: quantize_group of 8 zeros: scale 0 and every q 0 (no division by zero); yours: scale "
           "%g, q[0] %d", s, q[0]);
    int bad = 0;
    double worst = 0;
    for (int gi = 0; gi < 64; gi++) { /* groups of 32 at scales from 1e-3 to 1e3 */
        float *v = frand(32, (float)pow(10.0, (gi % 7) - 3), 500 + (uint64_t)gi);
        double amax = 0;
        for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(v[i]));
        s = quantize_group(v, q, 32);
        int top = 0, ok = fabs(s - amax / 127) <= 1e-6 * amax / 127;
        for (int i = 0; i < 32 && ok; i++) {
            double err = fabs(v[i] - (double)s * q[i]);
            worst = fmax(worst, err / s);
            ok &= q[i] >= -127 && err <= s * (0.5 + 1e-5); /* (an int8 is <= 127 anyway) */
            top |= q[i] == 127 || q[i] == -127;
        }
        if ((!ok || !top) && bad++ < 3)
            printf("FAIL lab 5: quantize_group, random group %d of 32 (max |x| %.4g): scale = max|x| / 127 = %.6g, each "
                   "|x - scale * q| <= scale / 2, the largest |x| gets q = +-127; yours: scale %.6g%s\n", gi, amax,
                   amax / 127, s, top ? "" : ", no q reached +-127");
        free(v);
    }
    expect(!bad, "lab 5: quantize_group on 64 random groups of 32 (values from 1e-3 to 1e3): every value within scale / 2 "
           "(worst %.3g scale)", worst);
}
/* A pool of one layer, one kv head of 16 channels, CH 2, 2 chunks, in dtype dt
 * (int8 groups of 8): the kv_view the checks store into and read back. */
static void lab5_pool(kvt_pool *p, kvt_dtype dt, int gpu) {
    KVT_ASSERT(pool_init(p, gpu, 1, 1, 16, 2, 2, dt, 8) == KVT_OK);
    size_t bytes = kvt_dtype_size(dt, p->chunk_elems * 2);
    char *z = (char *)calloc(bytes, 1);
    buf_upload(gpu, p->data, z, bytes);
    free(z);
}
/* What element i of a cache of type dt stores for the value x, and decodes to,
 * by hand: fp32 as is, fp16 through f32_to_f16 (given), int8 from the group
 * g (values x0[0..8)) that x belongs to. */
static double lab5_decoded(kvt_dtype dt, float x, const float *g) {
    if (dt == KVT_FP32) return x;
    if (dt == KVT_FP16) return f16_to_f32(f32_to_f16(x));
    double amax = 0;
    for (int i = 0; i < 8; i++) amax = fmax(amax, fabs(g[i]));
    float scale = (float)amax / 127.0f;
    return (double)scale * lab5_q(x, scale);
}
static void lab5_store_load(void) {
    for (int d = 0; d < 3; d++) {
        kvt_dtype dt = d == 0 ? KVT_FP32 : d == 1 ? KVT_FP16 : KVT_INT8;
        kvt_pool p;
        lab5_pool(&p, dt, 0);
        kvt_kv kv = kv_view(&p, NULL, NULL, NULL, NULL);
        float *x = frand(16, 2.0f, 61 + (uint64_t)d);
        size_t at = 48; /* chunk 0, slot 1: the fourth row of 16 */
        if (dt == KVT_INT8) { kv_store(&kv, at, x, 8); kv_store(&kv, at + 8, x + 8, 8); }
        else kv_store(&kv, at, x, 16);
        int bad_store = 0, bad_load = 0, stray = 0;
        for (int c = 0; c < 16; c++) {
            const float *g = x + (c / 8) * 8;
            double want = lab5_decoded(dt, x[c], g);
            size_t i = at + (size_t)c;
            double stored = dt == KVT_FP32 ? ((float *)p.data)[i] : dt == KVT_FP16 ? f16_to_f32(((uint16_t *)p.data)[i])
                            : ((int8_t *)p.data)[i] * (double)p.scales[i / 8];
            bad_store += fabs(stored - want) > 1e-6 * fmax(1.0, fabs(want));
            bad_load += fabs(kv_load_at(&kv, i, i / 8) - want) > 1e-6 * fmax(1.0, fabs(want));
        }
        for (size_t i = 0; i < p.chunk_elems * 2; i++) {
            if (i >= at && i < at + 16) continue;
            stray += dt == KVT_FP32 ? ((float *)p.data)[i] != 0 : dt == KVT_FP16 ? ((uint16_t *)p.data)[i] != 0
                     : ((int8_t *)p.data)[i] != 0;
        }
        expect(!bad_store && !stray, "lab 5 (%s cache): kv_store of 16 values at element 48 stores %s; %d of 16 differ, "
               "%d values written elsewhere", kvt_dtype_name(dt), dt == KVT_FP32 ? "them as they are" : dt == KVT_FP16 ?
               "f32_to_f16 of each" : "two groups of 8, each as q and one scale at scales[i / G] (quantize_group)",
               bad_store, stray);
        expect(!bad_load, "lab 5 (%s cache): kv_load_at(kv, i, i / G) decodes the 16 stored values to %s; %d of 16 differ",
               kvt_dtype_name(dt), dt == KVT_FP32 ? "themselves" : dt == KVT_FP16 ? "f16_to_f32 of the bits" :
               "q * scales[si]", bad_load);
        free(x);
        pool_free(&p);
    }
}
/* kv_dot and kv_axpy over rows of 16 (int8 groups of 8) against float64 sums
 * of the values decoded by hand. */
static void lab5_dot_axpy(void) {
    for (int d = 0; d < 3; d++) {
        kvt_dtype dt = d == 0 ? KVT_FP32 : d == 1 ? KVT_FP16 : KVT_INT8;
        kvt_pool p;
        lab5_pool(&p, dt, 0);
        kvt_kv kv = kv_view(&p, NULL, NULL, NULL, NULL);
        float *x = frand(64, 1.0f, 71 + (uint64_t)d), *q = frand(16, 1.0f, 81), *acc = frand(16, 1.0f, 82);
        for (int g = 0; g < 64; g += 8) kv_store(&kv, (size_t)g, x + g, 8);
        double worst_dot = 0, worst_axpy = 0;
        for (int r = 0; r < 4; r++) {
            double want = 0, mag = 0;
            for (int c = 0; c < 16; c++) {
                double v = lab5_decoded(dt, x[r * 16 + c], x + r * 16 + (c / 8) * 8);
                want += q[c] * v;
                mag += fabs(q[c] * v);
            }
            worst_dot = fmax(worst_dot, fabs(kv_dot(&kv, (size_t)r * 16, q, 16) - want) / mag);
            float a[16];
            memcpy(a, acc, sizeof(a));
            kv_axpy(&kv, (size_t)r * 16, 0.75f, a, 16);
            for (int c = 0; c < 16; c++) {
                double v = lab5_decoded(dt, x[r * 16 + c], x + r * 16 + (c / 8) * 8), w = acc[c] + 0.75 * v;
                worst_axpy = fmax(worst_axpy, fabs(a[c] - w) / fmax(1.0, fabs(w)));
            }
        }
        expect(worst_dot <= TOL_OP, "lab 5 (%s cache): kv_dot of q with 4 stored rows of 16 = the sum of q[c] times each "
               "decoded value (worst error %.3g of the sum of |terms|, TOL_OP %g)", kvt_dtype_name(dt), worst_dot, TOL_OP);
        expect(worst_axpy <= TOL_OP, "lab 5 (%s cache): kv_axpy(kv, i, 0.75, acc, 16) adds 0.75 times each decoded value "
               "of the row at i to acc (worst error %.3g, TOL_OP %g)", kvt_dtype_name(dt), worst_axpy, TOL_OP);
        free(x); free(q); free(acc);
        pool_free(&p);
    }
}
/* The GPU's kv_write_kernel stores through kv_store too: three rows written on
 * the device under test, read back and decoded by hand. */
static void lab5_write(void) {
    for (int d = 1; d < 3; d++) {
        kvt_dtype dt = d == 1 ? KVT_FP16 : KVT_INT8;
        kvt_pool p;
        KVT_ASSERT(pool_init(&p, lab_gpu, 1, 2, 16, 4, 2, dt, 8) == KVT_OK);
        int tables[2] = {1, 0}, row_tab[3] = {0, 0, 0}, row_pos[3] = {0, 1, 5}, row_len[3] = {6, 6, 6};
        int *dt_tables = (int *)dev_copy(lab_gpu, tables, sizeof(tables)), *d_tab = (int *)dev_copy(lab_gpu, row_tab, 12);
        int *d_pos = (int *)dev_copy(lab_gpu, row_pos, 12), *d_len = (int *)dev_copy(lab_gpu, row_len, 12);
        kvt_kv kv = kv_view(&p, dt_tables, d_tab, d_pos, d_len);
        float *k = frand(3 * 32, 1.0f, 91), *v = frand(3 * 32, 3.0f, 92);
        float *dk = (float *)dev_copy(lab_gpu, k, 3 * 32 * 4), *dv = (float *)dev_copy(lab_gpu, v, 3 * 32 * 4);
        if (lab_gpu) kv_write_gpu(kv, dk, dv, 0, 3);
        else kv_write_cpu(kv, dk, dv, 0, 3);
        size_t n = p.chunk_elems * 2;
        char *data = (char *)kvt_malloc(kvt_dtype_size(dt, n));
        float *sc = (float *)kvt_malloc((p.chunk_scales ? p.chunk_scales : 1) * 2 * 4);
        buf_download(lab_gpu, data, p.data, kvt_dtype_size(dt, n));
        if (p.scales) buf_download(lab_gpu, sc, p.scales, p.chunk_scales * 2 * 4);
        kvt_kv host = kv;
        host.data = data;
        host.scales = sc;
        host.tables = tables;
        int bad = 0;
        for (int r = 0; r < 3; r++)
            for (int w = 0; w < 2; w++)
                for (int c = 0; c < 32; c++) {
                    const float *src = (w ? v : k) + r * 32;
                    size_t i = kv_index(&host, 0, w, 0, row_pos[r], c / 16) + (size_t)(c % 16);
                    double got = dt == KVT_FP16 ? f16_to_f32(((uint16_t *)data)[i]) : ((int8_t *)data)[i] * (double)sc[i / 8];
                    bad += fabs(got - lab5_decoded(dt, src[c], src + (c / 8) * 8)) > 1e-6 * fmax(1.0, fabs(src[c]));
                }
        expect(!bad, "lab 5, %s, %s cache: kv_write_%s stores 3 rows (positions 0, 1, 5; 2 kv heads of 16) through "
               "kv_store; read back by hand, %d of %d values differ", lab_gpu ? "GPU" : "CPU", kvt_dtype_name(dt),
               lab_gpu ? "gpu (one int8 group or one value per thread)" : "cpu", bad, 3 * 2 * 32);
        buf_free(lab_gpu, dt_tables); buf_free(lab_gpu, d_tab); buf_free(lab_gpu, d_pos); buf_free(lab_gpu, d_len);
        buf_free(lab_gpu, dk); buf_free(lab_gpu, dv);
        free(k); free(v); free(data); free(sc);
        pool_free(&p);
    }
}
static void lab5_e2e_int8(void) { lab_end_to_end("--kv-dtype int8"); }
static void lab5_e2e_fp16(void) { lab_end_to_end("--kv-dtype fp16 --attn naive"); }
static void lab_check(void) {
    lab_child("lab 5: quantize_group", lab5_quantize);
    lab_child("lab 5: kv_store, kv_load_at", lab5_store_load);
    lab_child("lab 5: kv_dot, kv_axpy", lab5_dot_axpy);
    lab_both("kv_store in kv_write", lab5_write);
    lab_child("lab 5, end to end (int8)", lab5_e2e_int8);
    lab_child("lab 5, end to end (fp16)", lab5_e2e_fp16);
}
#elif KVT_LAB == 6 /* fused attention: attention_merge_cpu, attention_fused_spec_cpu, attn_fused_plain_kernel, attn_merge_kernel */
/* Three pieces of one (row, head), HS 2, worked out by hand: (m, l, acc) =
 * (1, 2, {2, 4}), (3, 1, {5, 1}) and an empty piece (l = 0). The global max
 * M = 3: weights e^(1-3) and 1, l = 2e^-2 + 1, out = (e^-2 {2, 4} + {5, 1}) / l. */
static void lab6_merge(void) {
    float part[3 * 4] = {1, 2, 2, 4, 3, 1, 5, 1, -INFINITY, 0, 0, 0}, out[2] = {0, 0};
    double w = exp(-2.0), l = 2 * w + 1, want[2] = {(2 * w + 5) / l, (4 * w + 1) / l};
    if (lab_gpu) {
        float *dp = (float *)dev_copy(1, part, sizeof(part)), *dout;
        KVT_ASSERT(buf_alloc(1, (void **)&dout, sizeof(out), "lab 6") == KVT_OK);
        KVT_LAUNCH(attn_merge_kernel, 1, 1, KVT_THREADS, dout, dp, 1, 2, 3);
        buf_download(1, out, dout, sizeof(out));
        buf_free(1, dp);
        buf_free(1, dout);
    } else {
        attention_merge_cpu(out, part, 1, 1, 2, 3);
    }
    double err = fmax(fabs(out[0] - want[0]), fabs(out[1] - want[1]));
    expect(err < 1e-6, "lab 6, %s: three pieces (m, l, acc) = (1, 2, {2, 4}), (3, 1, {5, 1}) and an empty one (l = 0): "
           "M = 3, l = 2e^-2 + 1, out = {%.6f, %.6f}; yours {%.6f, %.6f}%s", lab_gpu ? "attn_merge_kernel" :
           "attention_merge_cpu", want[0], want[1], out[0], out[1], out[0] != out[0] ? " (NaN: the empty piece has m = "
           "-inf and must be skipped)" : "");
    float one[4] = {0.5f, 4, 2, -8};
    if (!lab_gpu) {
        attention_merge_cpu(out, one, 1, 1, 2, 1);
        expect(out[0] == 0.5f && out[1] == -2.0f, "lab 6, attention_merge_cpu: one piece (m 0.5, l 4, acc {2, -8}) "
               "gives acc / l = {0.5, -2}; yours {%g, %g}", out[0], out[1]);
    }
}
/* The fused spec (CPU) or the plain kernel and its merge (GPU) against
 * float64 attention, whole and split into pieces. */
static void lab6_float64(void) {
    acase cases[] = {{4, 2, 16, 3, 64, 40, 5, KVT_FP32, 16}, {4, 2, 32, 5, 64, 60, 3, KVT_INT8, 8},
                     {2, 1, 64, 16, 256, 200, 2, KVT_FP16, 64}};
    int splits[3] = {0, 7, 64};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            acase *c = &cases[i];
            size_t no = (size_t)c->n * c->NH * c->HS, nkv = (size_t)c->T * c->NKV * c->HS;
            float *K = (float *)kvt_malloc(nkv * 4), *V = (float *)kvt_malloc(nkv * 4), *ref = (float *)kvt_malloc(no * 4);
            float *out = (float *)kvt_malloc(no * 4);
            attn_run(c, lab_gpu, 2, splits[j], out, K, V);
            attn_ref(c, K, V, ref);
            char what[240];
            snprintf(what, sizeof(what), "lab 6, %s, against float64: %d query heads on %d kv heads, head size %d, %d "
                     "cached positions in chunks of %d, the last %d rows, %s cache, %s", lab_gpu ?
                     "attn_fused_plain_kernel + attn_merge_kernel" : "attention_fused_spec_cpu", c->NH, c->NKV, c->HS,
                     c->T, c->CH, c->n, kvt_dtype_name(c->dt), splits[j] ? (j == 1 ? "pieces of 7 keys" :
                     "pieces of 64 keys") : "one piece");
            int ok = kvt_check(what, out, ref, (long)no, "row=64,head=64,ch=1024", TOL_ATTN, "TOL_ATTN");
            tally(ok);
            free(K); free(V); free(ref); free(out);
        }
}
static void lab6_e2e(void) { lab_end_to_end("--chunk 4"); }
static void lab_check(void) {
    lab_both("the merge", lab6_merge);
    lab_both("fused attention", lab6_float64);
    lab_child("lab 6, end to end", lab6_e2e);
}
#elif KVT_LAB == 7 /* prefix reuse: prefix_hash_of, prefix_register, prefix_attach */
/* FNV-1a as the comment above prefix_hash_of says, written again here. */
static uint64_t lab7_fnv(const int *t, int n, int bits) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) { h ^= (uint32_t)t[i]; h *= 1099511628211ULL; }
    if (bits < 64) h &= (1ULL << bits) - 1;
    return h ? h : 1;
}
static void lab7_hash(void) {
    int t[40], bad = 0;
    for (int i = 0; i < 40; i++) t[i] = (i * 7919 + 11) % 32000;
    t[3] = -5; /* an id is hashed as 32 bits */
    const int widths[3] = {64, 8, 3};
    for (int b = 0; b < 3 && bad < 3; b++) {
        int bits = widths[b];
        kvt_prefix_hash_bits = bits;
        for (int n = 1; n <= 40 && bad < 3; n += 3) {
            uint64_t want = lab7_fnv(t, n, bits), got = prefix_hash_of(t, n);
            if (got != want && bad++ < 3)
                printf("FAIL lab 7: prefix_hash_of(tokens, %d) with kvt_prefix_hash_bits %d should be %llu; yours %llu\n", n,
                       bits, (unsigned long long)want, (unsigned long long)got);
        }
    }
    int z[1] = {0}, found = -1; /* an id whose 3-bit hash is 0: it must come out as 1 */
    kvt_prefix_hash_bits = 3;
    for (int id = 0; id < 100 && found < 0; id++) {
        z[0] = id;
        uint64_t h = 1469598103934665603ULL;
        h = (h ^ (uint32_t)id) * 1099511628211ULL;
        if ((h & 7) == 0) found = id;
    }
    KVT_ASSERT(found >= 0);
    z[0] = found;
    uint64_t g = prefix_hash_of(z, 1);
    if (g != 1 && bad++ < 4) printf("FAIL lab 7: the 3-bit hash of {%d} is 0, which means \"no hash\": it must be 1; yours %llu\n",
                                    found, (unsigned long long)g);
    kvt_prefix_hash_bits = 64;
    tally(!bad);
    if (!bad) printf("PASS lab 7: prefix_hash_of gives the FNV-1a of 14 prefixes at 64, 8 and 3 bits, and 1 for a hash of 0\n");
}
static void lab7_register(void) {
    kvt_pool p;
    KVT_ASSERT(pool_init(&p, 0, 1, 1, 8, 4, 6, KVT_FP32, 8) == KVT_OK);
    int table[4] = {2, 0, 4, 5}, tokens[16];
    for (int i = 0; i < 16; i++) tokens[i] = 100 + i * 3;
    kvt_seq s;
    memset(&s, 0, sizeof(s));
    s.table = table;
    s.tokens = tokens;
    s.n_table = 3;
    s.len = 10;
    prefix_register(&p, &s, 0);
    uint64_t h4 = lab7_fnv(tokens, 4, 64), h8 = lab7_fnv(tokens, 8, 64), h12 = lab7_fnv(tokens, 12, 64);
    expect(p.prefix_hash[2] == h4 && p.prefix_hash[0] == h8 && p.prefix_hash[4] == 0, "lab 7: prefix_register of a "
           "sequence of 10 positions in chunks {2, 0, 4} (CH 4), all new: chunk 2 is named by the hash of tokens[0..4), "
           "chunk 0 by tokens[0..8), the partly filled chunk 4 stays 0; yours: %s, %s, %s",
           p.prefix_hash[2] == h4 ? "right" : "chunk 2 WRONG", p.prefix_hash[0] == h8 ? "right" : "chunk 0 WRONG",
           p.prefix_hash[4] == 0 ? "0" : "chunk 4 NAMED");
    memset(p.prefix_hash, 0, 6 * sizeof(uint64_t));
    s.len = 12;
    prefix_register(&p, &s, 9);
    expect(p.prefix_hash[4] == h12 && p.prefix_hash[2] == 0 && p.prefix_hash[0] == 0, "lab 7: the sequence grows from 9 "
           "to 12 positions: only chunk 4 became full, named by the hash of tokens[0..12); the first two were full "
           "before and are left alone; yours: chunk 4 %s, chunks 2 and 0 %s", p.prefix_hash[4] == h12 ? "right" : "WRONG",
           p.prefix_hash[2] || p.prefix_hash[0] ? "CHANGED" : "unchanged");
    p.prefix_hash[4] = 77;
    s.len = 13;
    s.n_table = 4;
    prefix_register(&p, &s, 12);
    expect(p.prefix_hash[4] == 77 && p.prefix_hash[5] == 0, "lab 7: growing from 12 to 13 positions fills no chunk: "
           "nothing is named (chunk 4 keeps its name, chunk 5 is partly filled)");
    pool_free(&p);
}
/* prefix_attach in an engine with prefix reuse (CH 4): a live sequence a of
 * 13 tokens; b shares its first 10 tokens, c its first 12, d none but the
 * hash is cut to 1 bit, so every chunk's hash collides. */
static void lab7_attach(void) {
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, 2, 4, 2, 128, 61, 64), 7) == KVT_OK);
    int V = m.c.vocab_size, ta[13], tb[13], td[13];
    for (int i = 0; i < 13; i++) { ta[i] = (i * 11 + 2) % V; tb[i] = i < 10 ? ta[i] : (ta[i] + 1) % V; td[i] = (ta[i] + 5) % V; }
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.plain = 1;
    o.CH = 4;
    o.max_seqs = 4;
    o.prefix_reuse = 1;
    kvt_engine *e, *er;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    o.prefix_reuse = 0;
    KVT_ASSERT(kvt_engine_create(&er, &m, &o) == KVT_OK);
    float *lg = (float *)kvt_malloc((size_t)V * 4), *ref = (float *)kvt_malloc((size_t)V * 4);
    kvt_seq a, b, c, r;
    kvt_seq_init(e, &a);
    kvt_seq_init(e, &b);
    kvt_seq_init(e, &c);
    kvt_pool *p = &e->pool;
    KVT_ASSERT(kvt_forward(e, &a, ta, 13, lg, 0) == KVT_OK);
    long hits = p->prefix_hits, misses = p->prefix_misses;
    int got = prefix_attach(p, e->live, &b, tb, 13);
    int ok = got == 8 && b.len == 8 && b.n_table == 2 && b.table[0] == a.table[0] && b.table[1] == a.table[1] &&
             p->refcount[a.table[0]] == 2 && p->refcount[a.table[1]] == 2 && b.how[0] == '+' && b.how[1] == '+' &&
             !memcmp(b.tokens, ta, 8 * sizeof(int)) && p->prefix_hits == hits + 2 && p->prefix_misses == misses + 2;
    expect(ok, "lab 7: b's 13 tokens start with a's first 10, so a's first two chunks (positions 0..7) are b's: "
           "prefix_attach returns 8, b holds a's chunks %d and %d (refcount 2, how '+'), its len is 8 and its tokens "
           "a's, prefix_hits +2, prefix_misses +2 (chunks 2 and 3 are computed); yours returned %d, len %d, n_table %d, "
           "hits +%ld, misses +%ld", a.table[0], a.table[1], got, b.len, b.n_table, p->prefix_hits - hits,
           p->prefix_misses - misses);
    if (ok) { /* b computes the rest: the logits of its 13 tokens, as if nothing had been shared */
        KVT_ASSERT(kvt_forward(e, &b, tb + 8, 5, lg, 0) == KVT_OK);
        kvt_seq_init(er, &r);
        KVT_ASSERT(kvt_forward(er, &r, tb, 13, ref, 0) == KVT_OK);
        kvt_seq_free(er, &r);
        double w;
        int same = rows_close(lg, ref, 1, V, TOL_E2E, &w);
        expect(same, "lab 7: b, its first 8 positions attached, gives the logits of its 13 tokens computed without "
               "sharing (off by %.2g of the largest)", w);
    }
    got = prefix_attach(p, e->live, &c, ta, 12);
    expect(got == 8 && c.n_table == 2, "lab 7: c's 12 tokens are a's first 12, three full chunks, but the last token "
           "is always computed (its logits are wanted): prefix_attach returns 8, not 12; yours %d (n_table %d)", got,
           c.n_table);
    kvt_seq_free(e, &c);
    kvt_seq_free(e, &b);
    kvt_seq_free(e, &a);
    kvt_engine_free(e);
    kvt_prefix_hash_bits = 1; /* every hash is 1: every lookup finds a chunk, none holds our tokens */
    o.prefix_reuse = 1;
    KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
    p = &e->pool;
    kvt_seq_init(e, &a);
    kvt_seq_init(e, &b);
    KVT_ASSERT(kvt_forward(e, &a, ta, 13, lg, 0) == KVT_OK);
    long coll = p->prefix_collisions;
    got = prefix_attach(p, e->live, &b, td, 13);
    expect(got == 0 && b.n_table == 0 && p->prefix_collisions > coll, "lab 7: with the hash cut to 1 bit every chunk "
           "of a has d's hash, but none holds d's tokens: prefix_attach attaches nothing (0) and counts the "
           "collisions (prefix_confirmed says no); yours returned %d, collisions +%ld", got, p->prefix_collisions - coll);
    kvt_prefix_hash_bits = 64;
    kvt_seq_free(e, &b);
    kvt_seq_free(e, &a);
    kvt_engine_free(e);
    kvt_engine_free(er);
    free(lg);
    free(ref);
    kvt_model_free(&m);
}
static void lab7_e2e(void) { lab_end_to_end("--chunk 4"); }
static void lab_check(void) {
    lab_child("lab 7: prefix_hash_of", lab7_hash);
    lab_child("lab 7: prefix_register", lab7_register);
    lab_child("lab 7: prefix_attach", lab7_attach);
    lab_child("lab 7, end to end", lab7_e2e);
}
#endif
#endif
