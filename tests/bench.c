/* tests/bench.c: the benchmarks: every --bench measures or refuses in one line; make bench.
 * Included by test.c, in place: one compile, one binary (see test.c). */
/* An inf, a nan or a negative number (a '-' after a space, before a digit) in
 * a bench's output: a rate that divided by a zero or negative time. */
static int bench_bad_number(const char *out) {
    if (contains(out, "inf") || contains(out, "nan")) return 1;
    for (const char *c = out; *c; c++)
        if (*c == '-' && (c == out || c[-1] == ' ') && c[1] >= '0' && c[1] <= '9') return 1;
    return 0;
}
/* Every bench either measures or refuses, in one line, a shape it cannot
 * measure: a model too short for its steps, a --bench-ctx or --bench-every
 * out of range, a --chunks pool too small. The smallest shapes that measure
 * run too (each well under a second; matmul times 0.3 s per row count, so it
 * is left out). No rate may come out inf, nan or negative. */
/* make bench (bench/run.sh), on tiny models (QUICK=1, seconds): it must leave
 * the checkout as it was (its default folder, bench/out, is ignored by git;
 * tracked results change only by make bench-save) and draw both plots when
 * gnuplot is there (make test installs it like make bench does). The run goes
 * to bench/out/selftest, so a student's own bench/out results stay. */
static int png_file(const char *path) {
    unsigned char sig[8] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(sig, 1, 8, f) : 0;
    if (f) fclose(f);
    return n == 8 && !memcmp(sig, "\x89PNG\r\n\x1a\n", 8);
}
static void test_bench_run(void) {
    if (!have_kvt("make bench checks")) return;
    if (system("git rev-parse --is-inside-work-tree > /dev/null 2>&1 && test -f bench/run.sh") != 0) {
        skip("make bench checks (not run from a git checkout)");
        return;
    }
    expect(system("git check-ignore -q bench/out/positions.png && git check-ignore -q bench/out/context_curve.csv") == 0,
           "make bench: its output folder bench/out is ignored by git");
    int plots = system("command -v gnuplot > /dev/null 2>&1") == 0;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "mkdir -p bench/out; git status --porcelain > bench/out/status.before 2>&1; rm -rf bench/out/selftest; "
             "QUICK=1 PLOTS=%d OUT=bench/out/selftest KVT=%s bash bench/run.sh > bench/out/selftest.log 2>&1; "
             "rc=$?; git status --porcelain | diff - bench/out/status.before > bench/out/selftest.diff; d=$?; "
             "rm -f bench/out/status.before; exit $((rc * 2 + (d != 0)))", plots, kvt_bin);
    int rc = system(cmd), code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 255;
    expect(code / 2 == 0, "make bench on tiny models (QUICK=1) runs to the end (log: bench/out/selftest.log)");
    expect(code % 2 == 0, "make bench leaves git status as it was (differences: bench/out/selftest.diff)");
    if (!plots) { skip("make bench plots (no gnuplot; make test installs it as root or with sudo)"); return; }
    expect(png_file("bench/out/selftest/positions.png") && png_file("bench/out/selftest/context.png"),
           "make bench draws bench/out/.../positions.png and context.png (gnuplot)");
    expect(system("grep -q 'cache_on_ms_min' bench/out/selftest/positions_fp32.csv && "
                  "grep -q 'decode_tokens_per_s_max' bench/out/selftest/context_curve.csv") == 0,
           "make bench's plotted tables hold medians with min and max over the runs");
}
/* make bench-serve (bench/serve.sh) on a tiny model and trace (QUICK=1): it runs
 * to the end, leaves git status as it was, writes a row per configuration and
 * rate, and its preallocated pool of 512 positions in contexts of TMAX = 128
 * holds exactly 512 / 128 = 4 requests at once, while the reservation policy
 * never preempts; the rows of 16 running requests carry numbers. */
static void test_bench_serve(void) {
    if (!have_kvt("make bench-serve checks")) return;
    if (system("git rev-parse --is-inside-work-tree > /dev/null 2>&1 && test -f bench/serve.sh") != 0) {
        skip("make bench-serve checks (not run from a git checkout)");
        return;
    }
    int plots = system("command -v gnuplot > /dev/null 2>&1") == 0;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "mkdir -p bench/out; git status --porcelain > bench/out/status.serve 2>&1; "
             "rm -rf bench/out/selftest_serve; QUICK=1 PLOTS=%d OUT=bench/out/selftest_serve KVT=%s bash bench/serve.sh "
             "> bench/out/selftest_serve.log 2>&1; rc=$?; git status --porcelain | diff - bench/out/status.serve "
             "> bench/out/selftest_serve.diff; d=$?; rm -f bench/out/status.serve; exit $((rc * 2 + (d != 0)))",
             plots, kvt_bin);
    int rc = system(cmd), code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 255;
    expect(code / 2 == 0, "make bench-serve on a tiny model (QUICK=1) runs to the end (log: bench/out/selftest_serve.log)");
    expect(code % 2 == 0, "make bench-serve leaves git status as it was (differences: bench/out/selftest_serve.diff)");
    const char *d = "bench/out/selftest_serve";
    snprintf(cmd, sizeof(cmd), "test $(awk -F, 'NR > 1 && ($2 == 0.5 || $2 == 1.5)' %s/serve.csv | cut -d, -f1 | sort -u "
             "| wc -l) = 5 && test $(wc -l < %s/serve.csv) = 11", d, d);
    expect(system(cmd) == 0, "make bench-serve: serve.csv has a row for each of 5 configurations at each of 2 rates");
    snprintf(cmd, sizeof(cmd), "grep -q '^  cont_prealloc    peak 4, 0 preemptions$' %s/serve_rows.txt && "
             "grep -q '^  reserve16        peak [0-9]*, 0 preemptions$' %s/serve_rows.txt && "
             "grep -q '^  nocache          mean [0-9.]* ms' %s/serve_rows.txt && "
             "grep -q '^  serve [0-9.]*, static batch of 16 (--bench context --bench-ctx 64 --bench-batch 16) "
             "[0-9.]*: ratio [0-9]\\.[0-9][0-9]$' %s/serve_rows.txt && "
             "grep -q '^  scheduler: [0-9.]*%% of the serve' %s/serve_rows.txt", d, d, d, d, d);
    expect(system(cmd) == 0, "make bench-serve, all at t = 0: preallocated contexts hold 512 / 128 = 4 requests, "
           "the reservation never preempts; the no-cache row, the 16-running ratio and the scheduler's share are "
           "there (%s/serve_rows.txt)", d);
    if (!plots) { skip("make bench-serve plot (no gnuplot)"); return; }
    snprintf(cmd, sizeof(cmd), "%s/serve.png", d);
    expect(png_file(cmd), "make bench-serve draws %s (gnuplot)", cmd);
}
static void test_bench_shapes(void) {
    if (!have_kvt("bench shape checks")) return;
    /* too short: the reason, and what the bench needs */
    cli_expect("--random 32,1,2,2,64,50,2 --chunk 1 --bench decode", 0, "--bench decode needs TMAX >= 4 (a prompt at");
    cli_expect("--random 32,1,2,2,64,50,3 --chunk 1 --bench decode", 0, "needs TMAX >= 4 (a prompt at position 0, an "
               "untimed step at 1, at least two timed steps from 2 on); this model has TMAX = 3");
    cli_expect("--random 32,1,2,2,64,50,4 --chunk 1 --bench positions", 0, "--bench positions needs TMAX >= 5");
    cli_expect("--random 32,1,2,2,64,50,16 --chunk 4 --bench positions --bench-every 17", 0,
               "this model has TMAX = 16: give --bench-every 12 or less");
    cli_expect("--random 32,1,2,2,64,50,16 --chunk 4 --bench positions --bench-every 13", 0, "needs TMAX >= 17");
    /* without --bench-every on a short model: the default step fits it ((16 - 4) / 8 = 1: rows at 1, 2, ..., 12) */
    cli_expect("--random 32,1,2,2,64,50,16 --chunk 4 --bench positions", 1, "\n      12 ");
    cli_expect("--random 32,1,2,2,64,50,31 --bench batch", 0, "--bench batch needs TMAX >= 32");
    cli_expect("--random 32,1,2,2,64,50,8 --chunk 1 --bench stages", 0, "--bench stages needs TMAX >= 9");
    cli_expect("--random 32,1,2,2,64,50,32 --bench context", 0, "--bench context needs TMAX >= 33");
    /* --split longer than the automatic pieces, context no longer than it: the
     * bench's extra split (to compare) must stay within the engine's part buffer
     * (it once wrote past it; make test-asan runs this too) */
    cli_expect("--random 64,1,4,4,64,100,1024 --bench attention --bench-ctx 1000 --split 1000", 1, "(split: ");
    if (kvt_gpu_available()) { /* (an nvcc build without a GPU refuses --device gpu) */
        cli_expect("--random 64,1,4,4,64,100,1024 --bench attention --bench-ctx 300 --split 1000 --device gpu", 1,
                   "(split: ");
        /* what the bench timed is checked: fused and split against naive (make gpu-check fails on ABOVE) */
        cli_expect("--random 64,1,4,4,64,100,1024 --bench attention --bench-ctx 300 --device gpu", 1,
                   "(tolerance KVT_TOL_GPU = 1e-04: within)");
    }
    /* a --bench-ctx out of range names the flag; a default one never does */
    cli_expect("--random 32,1,2,2,64,50,8 --chunk 2 --bench attention --bench-ctx 9", 0,
               "--bench-ctx 9: --bench attention needs 1 <= T <= TMAX = 8");
    cli_expect("--random 32,1,2,2,64,50,16 --chunk 4 --bench stages --bench-ctx 9", 0,
               "--bench-ctx 9: --bench stages needs 1 <= T <= TMAX - 8 = 8");
    cli_expect("--random 32,1,2,2,64,50,40 --chunk 4 --bench context --bench-ctx 9", 0,
               "--bench-ctx 9: --bench context needs 1 <= T <= TMAX - 32 = 8");
    const char *quiet[] = {"--random 32,1,2,2,64,50,1 --bench stages", "--random 32,1,2,2,64,50,1 --bench context"};
    for (int i = 0; i < 2; i++) {
        char out[4096];
        int rc = cli_run(quiet[i], out, sizeof(out));
        expect(rc != 0 && contains(out, "needs TMAX >=") && !contains(out, "--bench-ctx"),
               "cli '%s': refused without naming --bench-ctx, which was not given", quiet[i]);
    }
    cli_expect("--random 32,1,2,2,64,50,32 --bench batch --chunks 31", 0,
               "--chunks 31: --bench batch needs 32 chunks of 16 positions");
    cli_expect("--random 32,1,2,2,64,50,12 --chunk 4 --chunks 3 --bench stages", 0,
               "--chunks 3: --bench stages needs 17 chunks of 4 positions (8 sequences sharing a prompt of 4");
    /* the smallest shapes that measure; the default context fitted to the model */
    const char *runs[][3] = { /* flags, a line the output must have, what that line is */
        {"--random 32,1,2,2,64,50,4 --chunk 1 --bench decode", "decode (cpu, fp32 cache, positions 2..3)",
         "positions 2..3 timed"},
        {"--random 16,1,2,1,32,20,16 --chunk 4 --bench positions --bench-every 1", "off/on\n       1 ",
         "a row for position 1"},
        {"--random 32,1,2,2,64,50,5 --chunk 1 --bench positions --bench-every 1", "off/on\n       1 ",
         "a row for position 1"},
        {"--random 32,1,2,2,64,50,32 --bench batch", "\n    16 ", "a row for batch 16"},
        {"--random 32,1,2,2,64,50,1 --chunk 1 --bench attention", "over T = 1 cached positions", "T = TMAX = 1"},
        {"--random 32,1,2,2,64,50,12 --chunk 4 --bench stages", "decode at position 4", "T = TMAX - 8 = 4"},
        {"--random 32,1,2,2,64,50,33 --chunk 1 --bench context", "\nint8      1      1 ", "T = TMAX - 32 = 1"},
    };
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        char out[4096];
        int rc = cli_run(runs[i][0], out, sizeof(out));
        expect(rc == 0 && contains(out, runs[i][1]) && !bench_bad_number(out),
               "cli '%s': exit %d, %s, no inf, nan or negative number", runs[i][0], rc, runs[i][2]);
        if (i == 0) { /* --bench decode */
            expect(!contains(out, "paired"), "cli '%s': no paired read pass for weights in cache", runs[i][0]);
            /* a chain of dependent loads from memory: tens to hundreds of ns, never ~0 (a chain not walked) */
            const char *lat_at = strstr(out, "latency ");
            double lat = 0;
            int got_lat = lat_at ? sscanf(lat_at, "latency %lf ns", &lat) : 0;
            expect(got_lat == 1 && lat > 5 && lat < 1e5,
                   "cli '%s': memory latency %.1f ns, in (5, 100000)", runs[i][0], lat);
        }
    }
    /* weights past KVT_PAIRED_MIN_BYTES (37 MB): each timed step paired with a read pass */
    const char *big = "--random 512,2,8,8,1024,8000,64 --bench decode";
    char out[4096];
    int rc = cli_run(big, out, sizeof(out));
    const char *at = strstr(out, "median of 31 pairs): the pass ");
    double gbs = 0, pct = 0;
    int got = at ? sscanf(at, "median of 31 pairs): the pass %lf GB/s, decode at %lf%% of it", &gbs, &pct) : 0;
    expect(rc == 0 && got == 2 && gbs > 0.1 && pct > 0 && pct < 1000 && !bench_bad_number(out),
           "cli '%s': exit %d, each of the 31 steps paired with a read pass (%.1f GB/s, decode at %.0f%% of it)", big, rc,
           gbs, pct);
}
