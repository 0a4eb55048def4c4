/* tests/hardening.c: hostile input and failing outputs: nothing is lost; size limits and memory estimates.
 * Included by test.c, in place: one compile, one binary (see test.c). */
/* An API user who leaves kv_group at its default (0) gets
 * an engine for any head size, with the group picked by hand-checked rule:
 * 32 if it divides HS, else 16, else HS's largest divisor below 32. The int8
 * logits of one step stay close to fp32's (so the group was really used). */
static void test_kv_group_default(void) {
    struct { int HS, G; } want[] = {{16, 16}, {40, 20}, {48, 16}, {64, 32}, {8, 8}};
    for (int i = 0; i < 5; i++) {
        kvt_model m;
        KVT_ASSERT(kvt_model_random(&m, cfg(2 * want[i].HS, 1, 2, 1, 64, 50, 32), 3) == KVT_OK);
        kvt_options o;
        kvt_options_default(&o);
        o.device = KVT_CPU;
        float lg[2][50];
        int toks[4] = {1, 7, 22, 9}, G = -1, ok = 1;
        for (int dt = 0; dt < 2 && ok; dt++) {
            o.kv_dtype = dt ? KVT_INT8 : KVT_FP32;
            kvt_engine *e;
            kvt_seq sq;
            ok = kvt_engine_create(&e, &m, &o) == KVT_OK;
            if (!ok) break;
            if (dt) G = e->pool.G;
            kvt_seq_init(e, &sq);
            ok = kvt_forward(e, &sq, toks, 4, lg[dt], 0) == KVT_OK;
            kvt_seq_free(e, &sq);
            kvt_engine_free(e);
        }
        double err = 0.0, top = 0.0;
        for (int v = 0; ok && v < 50; v++) {
            err = fmax(err, fabs(lg[1][v] - lg[0][v]));
            top = fmax(top, fabs(lg[0][v]));
        }
        expect(ok && G == want[i].G && err <= 0.05 * top,
               "engine with kv_group left at 0, HS %d: int8 group %d (want %d), logits within %.3g of fp32's (max %.3g)%s%s",
               want[i].HS, G, want[i].G, err, top, ok ? "" : ": ", ok ? "" : kvt_last_error());
        kvt_model_free(&m);
    }
}
/* Hostile inputs, one regression check per class: each of these crashed,
 * hung, leaked or printed garbage with exit 0 before. */
static void test_hardening(void) {
    if (!have_kvt("hardening checks of the command line")) return;
    const char *R = "--random 32,1,4,2,64,50,32";
    char args[512], out[4096], out2[4096];
    /* a checkpoint with the default tokenizer's V = 68, TMAX 1 (item 1) and one with a NaN weight (item 7) */
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(16, 1, 2, 2, 32, 68, 1), 3) == KVT_OK);
    KVT_ASSERT(write_checkpoint(tmp_file("t1.bin"), &m, 0, 0));
    kvt_model_free(&m);
    KVT_ASSERT(kvt_model_random(&m, cfg(16, 1, 2, 2, 32, 68, 32), 3) == KVT_OK);
    m.w.rms_final[0] = NAN; /* every logit is then NaN */
    KVT_ASSERT(write_checkpoint(tmp_file("nan.bin"), &m, 0, 0));
    kvt_model_free(&m);
    const char *ppl_text = "ROMEO:\nWhat light\nthrough yonder window\n";
    write_text(tmp_file("ppl.txt"), ppl_text, strlen(ppl_text));
    write_text(tmp_file("empty.txt"), "", 0);

    /* 1. --ppl on TMAX 1: a window of 0 tokens (memcpy of -4 bytes, an endless loop) */
    cli_expect("-m @T/t1.bin --chunk 1 --ppl @T/ppl.txt", 0, "--ppl needs TMAX >= 2");
    /* 4, 11. --random is parsed strictly: no wrap, no garbage, no 8th field */
    cli_expect("--random 64,2,4,2,128,-2147483648,64", 0, "field 6 (V) is out of range");
    cli_expect("--random 64,2,4,2,128,2147483648,64", 0, "field 6 (V) is out of range");
    cli_expect("--random 4294967360,2,4,2,128,50,64", 0, "field 1 (D) is out of range");
    cli_expect("--random 32,1,4,2,64,50,64abc", 0, "field 7 (TMAX) is not an integer");
    cli_expect("--random 32,1,4,2,64,50,64,99,1", 0, "more than 7 fields");
    cli_expect("--random 32,1,4,2,64,50", 0, "only 6 fields");
    cli_expect("--random ' 32,1,4,2,64,50,32'", 0, "field 1 (D) is not an integer");
    /* One number syntax for every numeric flag: decimal, no space, no hex, no underflow to 0 */
    cli_expect("--random 32,1,4,2,64,50,32 -n ' 5'", 0, "-n ' 5': expected an integer");
    cli_expect("--random 32,1,4,2,64,50,32 -n 0x10", 0, "-n '0x10': expected an integer");
    cli_expect("--random 32,1,4,2,64,50,32 -t 0x10", 0, "-t '0x10': expected a number");
    cli_expect("--random 32,1,4,2,64,50,32 -t 1e-400", 0, "-t '1e-400': expected a number in [0, 100] (out of a double");
    cli_expect("--random 32,1,4,2,64,50,32 -t ' 1'", 0, "-t ' 1': expected a number");
    cli_expect("--random 32,1,4,2,64,50,32 -n 2 -t 1.5e-1", 1, "");
    /* A message quotes a byte of the input escaped: no raw ESC or 0xff reaches the terminal */
    cli_expect("-n \"$(printf '\\033[2J')\"", 0, "-n '\\x1b[2J': expected an integer");
    cli_expect("-n 2 -i \"$(printf 'a\\377b')\"", 0, "character '\\xff' (byte 0xff at offset 1)");
    /* 7. NaN weights: an error naming the step, not "zzzz" and exit 0 */
    cli_expect("-m @T/nan.bin -n 5", 0, "step 0 (position 6): logit 0 is nan");
    cli_expect("-m @T/nan.bin -n 5 -t 0 --fork 2", 0, "step 0, sequence 0: logit 0 is nan");
    cli_expect("-m @T/nan.bin --ppl @T/ppl.txt", 0, "the logits at token 0 are not finite");
    /* 8. a tiny temperature is greedy: the same text as -t 0, not the last id */
    snprintf(args, sizeof(args), "%s -n 20 -t 1e-40", R);
    int rc1 = cli_run(args, out, sizeof(out));
    snprintf(args, sizeof(args), "%s -n 20 -t 0", R);
    int rc2 = cli_run(args, out2, sizeof(out2));
    expect(rc1 == 0 && rc2 == 0 && !strcmp(out, out2), "cli -t 1e-40 generates what -t 0 does: '%.40s...'", out);
    {   /* the sampler itself: (logit - max) / T cannot overflow, however small T is */
        kvt_sampler sm;
        float lg[3] = {3e34f, 0.0f, -1.0f};
        kvt_sampler_init(&sm, 3, 1e-5f, 1.0f, 7);
        int id = kvt_sample(&sm, lg, 3);
        kvt_sampler_free(&sm);
        expect(id == 0, "sampler: T = 1e-5 with logits up to 3e34 draws the largest (got %d; logits / T overflowed to "
               "inf - inf = NaN before)", id);
    }
    /* 9. --ppl input that holds no text, or cannot be read as a file */
    cli_expect("--ppl /dev/null", 0, "no text to score (0 tokens)");
    cli_expect("--ppl @T/empty.txt", 0, "no text to score (0 tokens)");
    cli_expect("--ppl @T/ppl.txt --ppl-from 1", 0, "from --ppl-from: no text to score");
    cli_expect("--ppl /tmp", 0, "it is a directory");
    rc1 = cli_run("--ppl @T/ppl.txt", out, sizeof(out));
    rc2 = cli_run("--ppl /dev/stdin < @T/ppl.txt", out2, sizeof(out2)); /* a pipe: no size known */
    const char *a1 = strstr(out, "tokens, mean NLL"), *a2 = strstr(out2, "tokens, mean NLL");
    expect(rc1 == 0 && rc2 == 0 && a1 && a2 && !strcmp(a1, a2), "--ppl from a pipe (/dev/stdin) = from the file: '%s'",
           a2 ? a2 : out2);
    write_text(tmp_file("ppl2.txt"), "ROMEO:\nWhat light \x01 here\n", 26);
    cli_expect("--ppl @T/ppl2.txt", 0, "--ppl '@T/ppl2.txt' line 2: text: character");
    /* 10. --prompts: file line numbers, whole lines of any length, NUL refused */
    {
        size_t big = 9000;
        char *text = (char *)kvt_malloc(big + 64);
        int k = sprintf(text, "\nROMEO:\n");
        memset(text + k, 'a', big);
        text[k + big] = '\n';
        write_text(tmp_file("prompts.txt"), text, (size_t)k + big + 1);
        cli_expect("--prompts @T/prompts.txt -n 1", 0, "--prompts '@T/prompts.txt' line 3: longer than 4160 bytes, "
                   "more than the context can hold"); /* 8 bytes a token at most, 512 tokens: refused unread */
        text[k + 600] = '\n';
        write_text(tmp_file("prompts.txt"), text, (size_t)k + 601);
        cli_expect("--prompts @T/prompts.txt -n 1", 0, "line 3: the text is");
        write_text(tmp_file("prompts.txt"), "ROMEO:\nJU\0LIET:\n", 15);
        cli_expect("--prompts @T/prompts.txt -n 1", 0, "line 2: a NUL byte");
        /* line ends: CRLF is one end of line; a lone CR is part of the line (no piece for
         * byte 0x0d in this vocabulary: refused, where cutting the line there ran "ROMEO: hi") */
        write_text(tmp_file("prompts.txt"), "ROMEO: hi\r\n", 11);
        write_text(tmp_file("prompts_lf.txt"), "ROMEO: hi\n", 10);
        char crlf[4096], lf[4096];
        int rc_crlf = cli_run("--prompts @T/prompts.txt -n 3 -t 0", crlf, sizeof(crlf));
        int rc_lf = cli_run("--prompts @T/prompts_lf.txt -n 3 -t 0", lf, sizeof(lf));
        expect(rc_crlf == 0 && rc_lf == 0 && !strcmp(crlf, lf) && contains(lf, "ROMEO: hi"),
               "--prompts: a CRLF line = the same line with LF");
        write_text(tmp_file("prompts.txt"), "ROMEO: hi\rthere\n", 16);
        cli_expect("--prompts @T/prompts.txt -n 1", 0, "line 1: text: character");
        cli_expect("--chat -n 1 < @T/prompts.txt", 0, "byte 0x0d at offset 9");
        cli_expect("--chat -n 2 -t 0 < @T/prompts_lf.txt", 1, "");
        write_text(tmp_file("prompts.txt"), "ROMEO:\n\nJULIET:\n", 16);
        cli_expect("--prompts @T/prompts.txt -n 2 -t 0", 1, "--- sequence 1 (seed 43) ---\nJULIET:");
        FILE *f = fopen(tmp_file("prompts.txt"), "wb");
        KVT_ASSERT(f);
        for (int i = 0; i < 4097; i++) fputs("a\n", f);
        fclose(f);
        cli_expect("--prompts @T/prompts.txt -n 1", 0, "line 4097: more than 4096 prompts");
        free(text);
    }
    /* 12. defaults fitted to small models: no complaint about flags never given */
    cli_expect("--random 32,1,2,2,64,50,4 -n 1 -t 0", 1, "1 ");
    cli_expect("--random 32,1,2,2,64,50,1 -n 0", 1, "1 ");
    /* 12b. a thread count no machine could run (a stack each: 100,000 overflowed in the
     * first parallel loop) is refused up front; a few more than the cores still run */
    {
        const char *old = getenv("OMP_NUM_THREADS");
        char keep[64];
        snprintf(keep, sizeof(keep), "%s", old ? old : "");
        setenv("OMP_NUM_THREADS", "100000", 1);
        cli_expect("-n 2", 0, "OMP_NUM_THREADS asks for 100000 threads: at most 8 a core");
        setenv("OMP_NUM_THREADS", "3", 1);
        cli_expect("--random 32,1,2,2,64,50,16 -n 2 -t 0", 1, "");
        if (old) setenv("OMP_NUM_THREADS", keep, 1);
        else unsetenv("OMP_NUM_THREADS");
    }
    /* 13. messages that say what is wrong */
    cli_expect("-m /tmp", 0, "cannot read checkpoint '/tmp': it is a directory");
    cli_expect("-m /nonexistent/x.bin", 0, "No such file or directory");
    cli_expect("-z /tmp", 0, "cannot read tokenizer '/tmp': it is a directory");
    cli_expect("--random 32,1,4,2,64,50,32 --bench attention --csv /nonexistent/x.csv", 0,
               "--csv: cannot write '/nonexistent/x.csv': No such file or directory");
    KVT_ASSERT(kvt_model_random(&m, cfg(16, 1, 2, 2, 32, 1, 8), 3) == KVT_OK);
    KVT_ASSERT(write_checkpoint(tmp_file("v1.bin"), &m, 0, 0));
    kvt_model_free(&m);
    cli_expect("-m @T/v1.bin", 0, "vocab_size 1; with a tokenizer the ids BOS = 1 and EOS = 2 need");
    /* 14. combinations that silently ignored a flag */
    cli_expect("--fork 2 --prompts @T/ppl.txt", 0, "--fork continues one prompt and --prompts");
    cli_expect("-i hello --prompts @T/ppl.txt", 0, "-i/--prompt and --prompts both");
    cli_expect("--ppl @T/ppl.txt --prompts @T/ppl.txt", 0, "--ppl scores a file");
    cli_expect("--ppl @T/ppl.txt --fork 2", 0, "--ppl scores a file");
    cli_expect("--prompt-tokens 5", 0, "--prompt-tokens is for --random models");
    const char *with_random[][2] = { /* flags after R, and what the refusal says */
        {"--csv @T/x.csv", "--csv writes the table of a --bench run"},
        {"--kv-group 8", "--kv-group sets the channels per scale of an int8 cache"},
        {"--attn naive --split 8", "--split divides the fused attention"},
        {"-i hello", "-i needs a tokenizer"},
        {"--bench decode --fork 2", "--bench is a run of its own"},
        {"--bench-every 4", "need --bench"},
        {"--fork-share off", "--fork-share needs --fork N"},
        /* 15. cache off needs the chunks too: refused before the run, not at step 17 */
        {"--kv-cache off --chunks 1 -n 20", "--chunks 1: too small for one sequence of 28 positions"},
    };
    for (size_t i = 0; i < sizeof(with_random) / sizeof(with_random[0]); i++) {
        snprintf(args, sizeof(args), "%s %s", R, with_random[i][0]);
        cli_expect(args, 0, with_random[i][1]);
    }
    /* the file helpers themselves */
    char *text;
    size_t len;
    kvt_status st = kvt_read_file(tmp_file("ppl.txt"), "test file", &text, &len);
    expect(st == KVT_OK && len == strlen(ppl_text) && !strcmp(text, ppl_text),
           "kvt_read_file: a whole file, NUL-terminated (%zu bytes)", len);
    if (st == KVT_OK) free(text);
    float bad[4] = {1.0f, 2.0f, INFINITY, NAN};
    expect(kvt_first_nonfinite(bad, 2) == -1 && kvt_first_nonfinite(bad, 4) == 2 && kvt_first_nonfinite(bad + 3, 1) == 0,
           "kvt_first_nonfinite finds Inf and NaN, and nothing in finite values");
}

/* Outputs and inputs: no output may overwrite an input or share a file with
 * another output, every failed write is an error that names the file, and a
 * few input rules (KVT_MEM_LIMIT, --tokens, UTF-8 text, the default pool
 * under --fork, -n 0 with --dump-logits, where --check writes, an error seen by
 * several threads). Each check here failed before the rule was put in. */
static void write_bpe_tokenizer(const char *p); /* (below, with the tokenizer's tests) */
static int file_is(const char *path, const char *want_path) { /* the same bytes in both files */
    size_t n1 = 0, n2 = 0;
    char *a = read_all(path, &n1), *b = read_all(want_path, &n2);
    int same = a && b && n1 == n2 && !memcmp(a, b, n1);
    free(a);
    free(b);
    return same;
}
static void test_outputs(void) {
    if (!have_kvt("output checks of the command line")) return;
    char args[1024], out[4096], out2[4096];
    /* copies of the default model and tokenizer, and a hard link to the model */
    size_t nm = 0, nt = 0;
    char *mb = read_all("weights/model.bin", &nm), *tb = read_all("weights/tokenizer.bin", &nt);
    KVT_ASSERT(mb && tb);
    write_text(tmp_file("m.bin"), mb, nm);
    write_text(tmp_file("tok.bin"), tb, nt);
    free(mb);
    free(tb);
    unlink(tmp_file("link.bin"));
    KVT_ASSERT(link(tmp_file("m.bin"), tmp_file("link.bin")) == 0);
    write_text(tmp_file("prompts.txt"), "ROMEO:\nJULIET:\n", 15);
    write_text(tmp_file("corpus.txt"), "ROMEO:\nWhat light\n", 18);
    /* 1. an output that is an input: refused, the input unchanged (the paths differ as strings) */
    const char *same_in[][2] = {
        {"-m @T/m.bin --dump-logits @T/./m.bin -n 3", "--dump-logits '@T/./m.bin' is the same file as the input -m"},
        {"-m @T/m.bin --dump-tokens @T/link.bin -n 3", "--dump-tokens '@T/link.bin' is the same file as the input -m"},
        {"-z @T/tok.bin --trace @T/../$(basename @T)/tok.bin -n 3", "is the same file as the input -z '@T/tok.bin'"},
        {"--prompts @T/prompts.txt --trace @T/prompts.txt -n 2", "--trace '@T/prompts.txt' is the same file as the "
         "input --prompts"},
        {"--ppl @T/corpus.txt --dump-logits @T/corpus.txt", "is the same file as the input --ppl"},
        {"--bench decode --csv @T/m.bin -m @T/m.bin", "--csv '@T/m.bin' is the same file as the input -m"},
    };
    for (size_t i = 0; i < sizeof(same_in) / sizeof(same_in[0]); i++) cli_expect(same_in[i][0], 0, same_in[i][1]);
    expect(file_is(tmp_file("m.bin"), "weights/model.bin") && file_is(tmp_file("tok.bin"), "weights/tokenizer.bin") &&
           file_is(tmp_file("link.bin"), "weights/model.bin"), "an output named like an input left the inputs as they were");
    /* 2. two outputs on one file, existing or not */
    unlink(tmp_file("x"));
    cli_expect("--dump-logits @T/x --dump-tokens @T/./x -n 3", 0, "--dump-logits '@T/x' and --dump-tokens '@T/./x' "
               "are the same file");
    cli_expect("--trace @T/y --dump-logits @T/y -n 3", 0, "--dump-logits '@T/y' and --trace '@T/y' are the same file");
    expect(access(tmp_file("x"), F_OK) != 0 && access(tmp_file("y"), F_OK) != 0, "refused outputs were not created");
    cli_expect("--dump-logits /dev/null --dump-tokens /dev/null -n 2", 1, ""); /* a device: nothing to clobber */
    /* 3. stdin and stdout are files too: `< t` is an input, `> t` and `>> t` an output, the input unchanged */
    write_text(tmp_file("t"), "ROMEO:\nJULIET:\n", 15);
    write_text(tmp_file("t.orig"), "ROMEO:\nJULIET:\n", 15);
    const char *std_same[][2] = {
        {"--chat -n 4 --dump-tokens @T/t < @T/t", "--dump-tokens '@T/t' is the same file as the input stdin"},
        {"--chat -n 4 --dump-logits @T/./t < @T/t", "--dump-logits '@T/./t' is the same file as the input stdin"},
        {"--chat -n 4 --dump-attn @T/t < @T/t", "--dump-attn '@T/t' is the same file as the input stdin"},
        {"--chat -n 4 --trace @T/t < @T/t", "--trace '@T/t' is the same file as the input stdin"},
        {"--prompts /dev/stdin --dump-tokens @T/t < @T/t", "is the same file as the input stdin"},
        {"--chat -n 4 2>&1 >> @T/t < @T/t; exit $?", "stdout (redirected with > or >>) is the same file as the input stdin"},
        {"-n 2 -m @T/m.bin 2>&1 >> @T/m.bin; exit $?", "stdout (redirected with > or >>) is the same file as the input -m"},
    };
    for (size_t i = 0; i < sizeof(std_same) / sizeof(std_same[0]); i++) cli_expect(std_same[i][0], 0, std_same[i][1]);
    expect(file_is(tmp_file("m.bin"), "weights/model.bin") && file_is(tmp_file("t"), tmp_file("t.orig")),
           "an output on stdin's or stdout's file left the input as it was");
    cli_expect("-n 30 --dump-tokens @T/o.txt 2>&1 > @T/o.txt; exit $?", 0,
               "--dump-tokens '@T/o.txt' and stdout (redirected with > or >>) are the same file");
    cli_expect("-n 3 --dump-tokens @T/o2.txt < @T/t > @T/o3.txt", 1, ""); /* different files: fine */
    cli_expect("-n 3 --dump-tokens @T/o2.txt < /dev/null | cat", 1, "");   /* a device, a pipe: exempt */
    /* 4. a write that fails is an error naming the file and the reason */
    cli_expect("--trace /dev/full -n 3", 0, "--trace: writing '/dev/full' failed: No space left on device");
    cli_expect("--trace /dev/full -n 3 --fork 2", 0, "--trace: writing '/dev/full' failed: No space left on device");
    cli_expect("--dump-logits /dev/full -n 3", 0, "--dump-logits: writing '/dev/full' failed: No space left");
    cli_expect("--dump-tokens /dev/full -n 3", 0, "--dump-tokens: writing '/dev/full' failed: No space left");
    cli_expect("--random 32,1,4,2,64,50,32 --bench matmul --csv /dev/full", 0, "--csv: writing '/dev/full' failed");
    /* (stderr first to the pipe cli_run reads, then stdout elsewhere) */
    cli_expect("-n 3 2>&1 > /dev/full; exit $?", 0, "writing standard output failed: No space left on device");
    cli_expect("--help 2>&1 > /dev/full; exit $?", 0, "writing standard output failed");
    cli_expect("-n 3 2>&1 >&-; exit $?", 0, "standard output is closed");
    /* the runs stop at the first failed write (the dump of token ids, written
     * on the way out, shows how far they got: the prompt's 7 ids and a few) */
    cli_expect("-n 400 -t 0 --dump-attn /dev/full --dump-tokens @T/stop1.txt 2>&1 > /dev/null; exit $?", 0,
               "--dump-attn: writing '/dev/full' failed: No space left on device");
    cli_expect("-n 400 -t 0 --dump-tokens @T/stop2.txt 2>&1 > /dev/full; exit $?", 0,
               "writing standard output failed: No space left on device");
    const char *turns = "ROMEO: Good morrow\nJULIET: Good night\nROMEO: Farewell\n";
    write_text(tmp_file("turns.txt"), turns, strlen(turns));
    cli_expect("--chat -n 400 -t 0 --dump-tokens @T/stop3.txt 2>&1 > /dev/full < @T/turns.txt; exit $?", 0,
               "writing standard output failed: No space left on device");
    /* a reader that leaves (| head): a write error with its reason, and the dumps are kept */
    cli_expect("-n 400 -t 0 --dump-tokens @T/stop4.txt --dump-logits @T/stop4.bin 2> @T/stop4.err | head -c 6", 1, "");
    const char *stops[] = {"stop1", "stop2", "stop3", "stop4"};
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof(args), "n=$(wc -l < '%s/%s.txt') && test $n -ge 7 && test $n -lt 100", test_dir, stops[i]);
        expect(system(args) == 0, "%s: the run stopped within a few tokens of 400, and --dump-tokens, written on the "
               "way out, holds them (%s/%s.txt)", stops[i], test_dir, stops[i]);
    }
    snprintf(args, sizeof(args), "test $(stat -c %%s '%s/stop4.bin') -gt 0 && "
             "grep -q 'writing standard output failed: Broken pipe' '%s/stop4.err'", test_dir, test_dir);
    expect(system(args) == 0, "a reader that left: the reason on stderr, and --dump-logits kept");
    /* -n 0 --dump-attn runs the prompt, as -n 0 --dump-logits does: 1 layer x 4 heads x (1 + 2 + ... + 5) = 60
     * weights under the header */
    cli_expect("--random 32,1,4,2,64,50,32 --prompt-tokens 5 -n 0 --dump-attn @T/attn0.csv", 1, "");
    snprintf(args, sizeof(args), "test $(wc -l < '%s/attn0.csv') = 61", test_dir);
    expect(system(args) == 0, "-n 0 --dump-attn writes the prompt's 60 weights");
    /* its size is planned before anything is opened: 4 layers x 4 heads x 3008 x 3009 / 2 = 7.24e7 lines of about
     * 2 x 4 + 18 bytes */
    cli_expect("--random 64,4,4,4,128,100,4096 -n 3000 --dump-attn @T/big.csv --trace @T/big.trace", 0,
               "--dump-attn: up to 7.24e+07 lines, about 1883 MB (4 layers x 4 heads x N (N + 1) / 2 weights, "
               "N = 3008 positions), more than --dump-attn-max 1024 MB: raise it");
    snprintf(args, sizeof(args), "test ! -e '%s/big.csv' && test ! -e '%s/big.trace'", test_dir, test_dir);
    expect(system(args) == 0, "a --dump-attn refused for its size opened no file");
    cli_expect("--random 32,1,4,2,64,50,512 -n 400 --dump-attn @T/mid.csv --dump-attn-max 7", 0,
               "about 8 MB (1 layer x 4 heads x N (N + 1) / 2 weights, N = 408 positions)");
    cli_expect("--random 32,1,4,2,64,50,512 -n 400 -t 0 --dump-attn @T/mid.csv --dump-attn-max 9 --dump-attn-layer 0",
               1, "");
    cli_expect("-n 2 --dump-attn-max 5", 0, "--dump-attn-layer and --dump-attn-max shape --dump-attn");
    /* 5. KVT_MEM_LIMIT must be a whole number of bytes */
    const char *limits[] = {"1e3", "abc", "-1000", "0", "18446744073709551616", " 5"};
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        setenv("KVT_MEM_LIMIT", limits[i], 1);
        snprintf(out2, sizeof(out2), "KVT_MEM_LIMIT '%s': expected a whole number of bytes", limits[i]);
        cli_expect("-n 2", 0, out2);
    }
    setenv("KVT_MEM_LIMIT", "1000", 1);
    cli_expect("-n 2", 0, "not enough host memory"); /* a good value still limits */
    unsetenv("KVT_MEM_LIMIT");
    /* 7. UTF-8 text is printed: byte-fallback pieces of "é" (C3 A9); a lone control byte (07) is not */
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(16, 1, 2, 2, 32, 3 + 256 + 5, 16), 5) == KVT_OK);
    KVT_ASSERT(write_checkpoint(tmp_file("bytes.bin"), &m, 0, 0));
    kvt_model_free(&m);
    write_bpe_tokenizer(tmp_file("bytes_tok.bin"));
    snprintf(args, sizeof(args), "-m @T/bytes.bin -z @T/bytes_tok.bin --tokens 1,%d,%d,%d,%d -n 0", 3 + 'x',
             3 + 0xC3, 3 + 0xA9, 3 + 0x07);
    int rc = cli_run_to(args, 1, out, sizeof(out));
    expect(rc == 0 && !strcmp(out, "x\xc3\xa9\n"), "cli prints UTF-8 bytes of byte-fallback pieces and skips a lone "
           "control byte: '%s' (want 'x\xc3\xa9')", out);
    /* 8. the default pool holds what --fork needs when the sequence fits in one chunk */
    cli_expect("--chunk 512 --fork 3 -n 5 -t 0", 1, "--- sequence 2 (seed 44) ---");
    cli_expect("--random 64,2,4,2,128,100,64 --chunk 64 --fork 4 -n 5", 1, "--- sequence 3 (seed 45) ---");
    cli_expect("--random 64,2,4,2,128,100,64 --chunk 16 --fork 4 -n 5 --prompt-tokens 20", 1, "--- sequence 3");
    cli_expect("--random 64,2,4,2,128,100,64 --chunk 64 --fork 4 -n 5 --chunks 3", 0, "3 of them copies of a shared "
               "chunk a fork writes into; 2 of 3 are free): raise --chunks");
    /* 9. -n 0 with --dump-logits dumps the prompt's rows: the rows -n 1 dumps first */
    cli_expect("--tokens 1,22,56,40 -n 0 -t 0 --dump-logits @T/d0.f32", 1, "");
    cli_expect("--tokens 1,22,56,40 -n 1 -t 0 --dump-logits @T/d1.f32", 1, "");
    size_t n0 = 0, n1 = 0;
    char *d0 = read_all(tmp_file("d0.f32"), &n0), *d1 = read_all(tmp_file("d1.f32"), &n1);
    expect(d0 && d1 && n0 == 4 * 68 * sizeof(float) && n1 == n0 && !memcmp(d0, d1, n0),
           "--dump-logits -n 0: the prompt's 4 rows of 68 logits (%zu bytes), as -n 1 writes them", n0);
    free(d0);
    free(d1);
    /* 10. --check's lines go to stderr, not into the generated text */
    if (KVT_EMULATED || kvt_gpu_available()) {
        rc = cli_run_to("--device gpu --check -n 3 -t 0", 1, out, sizeof(out));
        int rc2 = cli_run("--device gpu --check -n 3 -t 0", out2, sizeof(out2));
        expect(rc == 0 && rc2 == 0 && !contains(out, "PASS") && !contains(out, "max error") &&
               contains(out2, "PASS --check step 2"), "--check: its lines on stderr, stdout only the text ('%.30s')", out);
    } else {
        skip("--check's lines on stderr: --check needs a GPU (an nvcc build without one)");
    }
    /* 11. an error that several OpenMP threads reach is printed once */
    if (KVT_EMULATED) {
        setenv("OMP_THREAD_LIMIT", "4", 1);
        rc = cli_run("--device gpu -n 3", out, sizeof(out));
        unsetenv("OMP_THREAD_LIMIT");
        expect(rc != 0 && count_of(out, "[KVT ERROR]") == 1, "an error reached by 4 threads: printed %d time(s), "
               "exit %s", count_of(out, "[KVT ERROR]"), rc ? "non-zero" : "0");
    } else {
        skip("an error reached by several threads: the emulation's threads (this build runs kernels on a GPU)");
    }
    /* 12. --tokens: one rule (digits, commas, spaces around ids) */
    const char *good[][2] = {{"1, 22", "1 22"}, {" 1, 22 ,56 ", "1 22 56"}, {"1,22", "1 22"}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        snprintf(args, sizeof(args), "--tokens '%s' -n 0 --dump-tokens @T/ids.txt", good[i][0]);
        rc = cli_run(args, out, sizeof(out));
        int ids[8], n = read_ints(tmp_file("ids.txt"), ids, 8);
        char got[64] = "";
        for (int k = 0; k < n; k++) snprintf(got + strlen(got), sizeof(got) - strlen(got), k ? " %d" : "%d", ids[k]);
        expect(rc == 0 && !strcmp(got, good[i][1]), "--tokens '%s' is [%s] (got [%s])", good[i][0], good[i][1], got);
    }
    const char *bad[][2] = {{"+5", "item 1 is not a token id"}, {"-0", "item 1 is not a token id"},
                            {"1,,2", "item 2 is not a token id"}, {"", "item 1 is not a token id"},
                            {"1 2", "item 1 is not a token id"}, {"1,", "item 2 is not a token id"},
                            {"1,99999999999999999999", "id 99999999999999999999 (item 2) is out of range"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(args, sizeof(args), "--tokens '%s' -n 1", bad[i][0]);
        cli_expect(args, 0, bad[i][1]);
    }
    cli_expect("--fork 1 -n 2 --dump-tokens @T/f1.txt", 1, ""); /* --fork 1 is one sequence */
    cli_expect("--help", 1, "decimal digits only");
    /* --stats gives the time per generated token with the cache on and off: off
     * recomputes every position at each step (7 to 70 here, about 40x the
     * work of one position), so it must cost more per token */
    double ms[2] = {0, 0};
    for (int off = 0; off < 2; off++) {
        rc = cli_run(off ? "-n 64 -t 0 --stats --kv-cache off" : "-n 64 -t 0 --stats", out, sizeof(out));
        const char *at = strstr(out, "[stats] per generated token: ");
        if (rc != 0 || !at || sscanf(at, "[stats] per generated token: %lf ms", &ms[off]) != 1) ms[off] = -1;
        /* the rows of the calls name what they are: the 7 prompt rows once
         * with the cache; without it the prompt, then 63 calls over the whole
         * history of 8 .. 70 positions: 7 + (8 + 70) * 63 / 2 = 2,464 rows */
        long rows = -1;
        const char *r = strstr(out, off ? "[stats] recomputed rows " : "[stats] prefill ");
        if (r) sscanf(r + strlen(off ? "[stats] recomputed rows " : "[stats] prefill "), "%ld", &rows);
        expect(rc == 0 && (off ? !strstr(out, "[stats] prefill ") : 1) && rows == (off ? 2464 : 7),
               "--stats with the cache %s: %s %ld rows", off ? "off names its rows recomputed, not prefill" : "on",
               off ? "recomputed" : "prefill", rows);
    }
    expect(ms[0] > 0 && ms[1] > ms[0], "--stats per generated token: cache on %.3f ms, off %.3f ms (off costs more)",
           ms[0], ms[1]);
}

/* A device allocation that fails and is handled (the engine reports "device
 * out of memory" and the program goes on) must not stay behind as the CUDA
 * runtime's last error: the next launch's check would read it and stop the
 * program. The emulation keeps a last error as CUDA does, so this fails in
 * every build if buf_alloc forgets to clear it. */
static void test_gpu_alloc_error(void) {
    void *p = &p;
    kvt_status st = buf_alloc(1, &p, (size_t)1 << 62, "a test buffer of 4 EiB");
    cudaError_t left = cudaGetLastError();
    expect(st == KVT_ENOMEM && p == NULL && left == cudaSuccess, "a failed device allocation is reported (%s) and "
           "leaves no last error behind (%s)", st == KVT_ENOMEM ? "ENOMEM" : "not ENOMEM", cudaGetErrorString(left));
    if (left != cudaSuccess) return; /* the launch below would stop the suite */
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 1, 4, 2, 64, 50, 32), 7) == KVT_OK);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_GPU;
    int prompt[3] = {1, 4, 9}, toks[8];
    float *lg = (float *)kvt_malloc(4 * 50 * sizeof(float));
    st = generate(&m, &o, prompt, 3, 4, toks, lg);
    expect(st == KVT_OK && kvt_first_nonfinite(lg, 4 * 50) < 0, "after the failed allocation, a GPU run launches "
           "its kernels and decodes 4 tokens");
    free(lg);
    kvt_model_free(&m);
}

/* Sizes past int or size_t, and models or caches larger than memory:
 * each is one error line, and nothing stays allocated (make test-asan checks
 * for leaks). KVT_MEM_LIMIT stands in for the machine's available memory. */
static void test_sizes(void) {
    /* TMAX 2^20, 1024 layers of dim 16: 44 MB of weights, three quarters of
     * them the unused RoPE tables (TMAX x HS floats) */
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(16, 1024, 2, 2, 32, 100, 1 << 20), 21) == KVT_OK);
    kvt_options o;
    kvt_options_default(&o);
    o.device = KVT_CPU;
    o.CH = 1;
    kvt_engine *e = NULL;
    /* 2048 and 4096 sequences x 2^20 one-position chunks: 2^31 and 2^32 table
     * entries, which an int product made negative and 0 */
    for (int seqs = 2048; seqs <= 4096; seqs *= 2) {
        o.max_seqs = seqs;
        kvt_status st = kvt_engine_create(&e, &m, &o);
        expect(st == KVT_EARG && !e && contains(kvt_last_error(), "chunk-table entries"),
               "%d sequences x 2^20 chunks: %s", seqs, kvt_last_error());
    }
    /* 2^28 chunks of 2^20 positions x 1024 layers x 2 x 16 floats: 2^65 bytes */
    o.max_seqs = 1;
    o.CH = 1 << 20;
    o.n_chunks = KVT_LIMIT_CHUNKS;
    kvt_status st = kvt_engine_create(&e, &m, &o);
    expect(st == KVT_ENOMEM && !e && contains(kvt_last_error(), "the KV cache pool would need"),
           "a pool of more than 2^64 bytes: %s", kvt_last_error());
    kvt_model_free(&m);
    cli_expect("--random 16,1,2,2,32,100,1048576 --chunk 1 --fork 2048 -n 1 --prompt-tokens 1", 0,
               "= 2147483648 chunk-table entries");
    cli_expect("--random 16,1,2,2,32,100,1048576 --chunk 1 --fork 4096 -n 1 --prompt-tokens 1", 0,
               "= 4294967296 chunk-table entries");

    /* Memory. This model's weights and its default engine's pool, counted here
     * from the shapes: weights 2.3 MB, pool 0.13 MB, and about 3.6 MB of scratch
     * (mostly two copies of 256 rows of 1000 logits). */
    int D = 128, L = 2, NH = 4, NKV = 4, HD = 256, V = 1000, TMAX = 64, HS = D / NH, CH = 16;
    kvt_config c = cfg(D, L, NH, NKV, HD, V, TMAX);
    double w_bytes = 4.0 * (2.0 * V * D + L * (2.0 * D + 2.0 * D * D + 2.0 * NKV * HS * D + 3.0 * HD * D) + D +
                            (double)TMAX * HS);
    double pool_bytes = 4.0 * (TMAX / CH) * L * 2 * CH * NKV * HS;
    char want_w[64], want_pool[64];
    snprintf(want_w, sizeof(want_w), "weights %.3g GB", w_bytes / 1e9);
    snprintf(want_pool, sizeof(want_pool), "(loaded), cache %.3g GB, scratch", pool_bytes / 1e9);
    setenv("KVT_MEM_LIMIT", "1000000", 1);
    st = kvt_model_random(&m, c, 22);
    expect(st == KVT_ENOMEM && !m.data && contains(kvt_last_error(), "not enough host memory") &&
           contains(kvt_last_error(), want_w) && contains(kvt_last_error(), "available 0.001 GB (KVT_MEM_LIMIT)"),
           "random model over KVT_MEM_LIMIT: %s", kvt_last_error());
    unsetenv("KVT_MEM_LIMIT");
    KVT_ASSERT(kvt_model_random(&m, c, 22) == KVT_OK);
    const char *p = tmp_file("sizes.bin");
    KVT_ASSERT(write_checkpoint(p, &m, 0, 0));
    setenv("KVT_MEM_LIMIT", "1000000", 1);
    kvt_model m2;
    st = kvt_model_load(&m2, p);
    expect(st == KVT_ENOMEM && !m2.data && contains(kvt_last_error(), want_w),
           "checkpoint over KVT_MEM_LIMIT: %s", kvt_last_error());
    if (st == KVT_OK) kvt_model_free(&m2);
    setenv("KVT_MEM_LIMIT", "2000000", 1); /* the weights are loaded; the engine's 2.7 MB do not fit */
    kvt_options_default(&o);
    o.device = KVT_CPU;
    st = kvt_engine_create(&e, &m, &o);
    expect(st == KVT_ENOMEM && !e && contains(kvt_last_error(), want_w) && contains(kvt_last_error(), want_pool) &&
           contains(kvt_last_error(), "available 0.002 GB"), "engine over KVT_MEM_LIMIT: %s", kvt_last_error());
    if (st == KVT_OK) kvt_engine_free(e);
    o.device = KVT_GPU; /* the emulated GPU's buffers are host memory too */
    st = kvt_engine_create(&e, &m, &o);
    if (KVT_EMULATED)
        expect(st == KVT_ENOMEM && !e, "engine on the emulated GPU over KVT_MEM_LIMIT: %s", kvt_last_error());
    else if (!kvt_gpu_available()) /* an nvcc build with no device: asking for the GPU is an error, not a fallback */
        expect(st == KVT_EARG && !e && contains(kvt_last_error(), "no CUDA device found"),
               "engine asked for the GPU with no device: %s", kvt_last_error());
    if (st == KVT_OK) kvt_engine_free(e);
    setenv("KVT_MEM_LIMIT", "8000000", 1);
    o.device = KVT_CPU;
    st = kvt_engine_create(&e, &m, &o);
    expect(st == KVT_OK, "engine under KVT_MEM_LIMIT = 8 MB: %s", st == KVT_OK ? "made" : kvt_last_error());
    if (st == KVT_OK) kvt_engine_free(e);
    setenv("KVT_MEM_LIMIT", "1000000", 1);
    cli_expect("--random 128,2,4,4,256,1000,64 -n 1", 0, want_w);
    setenv("KVT_MEM_LIMIT", "2500000", 1); /* the weights fit, the engine does not */
    cli_expect("--random 128,2,4,4,256,1000,64 -n 1", 0, want_pool);
    unsetenv("KVT_MEM_LIMIT");
    cli_expect("--random 128,2,4,4,256,1000,64 -n 1", 1, "");
    kvt_model_free(&m);

    /* The random fill: blocks of KVT_FILL_BLOCK floats, each with its own
     * generator, so 1 and 2 threads give the same bits. Tensors of 128000
     * (embedding) and 65536 x 2 + ... floats span several blocks. */
    int max_threads = omp_get_max_threads();
    kvt_model r[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        KVT_ASSERT(kvt_model_random(&r[t], c, 23) == KVT_OK);
    }
    omp_set_num_threads(max_threads);
    expect(r[0].n_floats == r[1].n_floats && !memcmp(r[0].data, r[1].data, r[0].n_floats * sizeof(float)),
           "random model: the same %zu floats on 1 and 2 threads", r[0].n_floats);
    /* and the values look like what kvt_model_random promises: the embedding
     * uniform in [-1, 1) (mean within 6 standard errors of 0), block 1 not a
     * copy of block 0 */
    const float *emb = r[0].w.token_embedding;
    size_t n = (size_t)1000 * 128;
    double sum = 0.0;
    int in_range = 1;
    for (size_t i = 0; i < n; i++) { sum += emb[i]; in_range &= emb[i] >= -1.0f && emb[i] < 1.0f; }
    expect(in_range && fabs(sum / (double)n) < 6.0 * 0.577 / sqrt((double)n) &&
           memcmp(emb, emb + KVT_FILL_BLOCK, 64 * sizeof(float)) != 0,
           "random embedding: in [-1, 1), mean %.5f, blocks differ", sum / (double)n);
    kvt_model_free(&r[0]);
    kvt_model_free(&r[1]);
}
