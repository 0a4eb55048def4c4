/* tests/cli.c: bad input and the command line: one clear line and a non-zero exit; --trace, --dump-logits, --tokens.
 * Included by test.c, in place: one compile, one binary (see test.c). */
// ---- bad input ---------------------------------------------------------------------------

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

/* --tokens, --dump-logits, --dump-tokens, and Hugging Face models. */

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
