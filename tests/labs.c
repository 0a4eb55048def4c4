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
        printf("FAIL %s: exited with status %d before it finished\n", what, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
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
 * (--attn naive and --chunk 4 are the ones understood here). */
static void lab_end_to_end(const char *flags) {
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
#endif
#endif
