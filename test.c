/* test.c - `make test`: every op against an independent float64 computation,
 * every GPU kernel against the CPU path (emulated in the C build, on the device
 * in the nvcc build), end-to-end equivalences (cache on/off, chunk sizes,
 * prefill vs one token at a time), number formats, and bad input.
 *
 * It includes kvtransformer.cu itself so it can call the static ops directly.
 * This file is the runner: the tolerances, the tally (expect, tally, skip),
 * the helpers the tests share, and main, which calls every test in order.
 * The tests live in tests/, one file per topic, included in place below (one
 * compile, one binary): ops, attention, engine, batches, cli, lint, export,
 * hardening, bench, serve, models, exercises, labs, chat, fuzz.
 * Usage: ./test_kvt [path to the kvt binary, for the command-line checks]
 * Ends with "N passed, N failed, N skipped"; exits 1 on any failure. */
#define KVT_NO_MAIN
#define KVT_CLI /* the command line (§20) too, without main: its parser, the --serve scheduler */
#pragma GCC diagnostic ignored "-Wunused-function" /* the runners that only main calls */
#include "kvtransformer.cu"
#include <unistd.h> /* getpid: the tests' temporary file names */
#include <fcntl.h>  /* open: files the exercise checks send a run's output to */
#include <sys/mman.h> /* KVT_TEST_JOBS: the counter the test processes share */
#include <sys/wait.h>

/* Tolerances, each relative to the largest |value| of the reference:
 * TOL_OP: one fp32 op (a dot product of <= 512 terms) against float64: fp32
 *   rounding is ~1e-7 per term, so 1e-5 is 10x above what correct code shows;
 *   a wrong index or a missing term is O(1).
 * TOL_ATTN: the bound for fused vs naive attention, also used against
 *   the float64 reference.
 * TOL_E2E: two fp32 forward passes that differ only in summation order
 *   (sgemm vs sgemv, cached vs recomputed, chunk sizes): ~1e-6 seen on logits.
 * KVT_TOL_GPU (§18, cli/check.c): GPU vs CPU logits. */
#define TOL_OP 1e-5
#define TOL_ATTN 1e-5
#define TOL_E2E 1e-5
/* TOL_TIE: two logits within 0.5% of the largest |logit| are a near tie, which
 * int8's per-step logit change (median 0.46% on the default model) may swap. */
#define TOL_TIE 5e-3

static int n_pass, n_fail, n_skip;
static const char *kvt_bin = "./kvt";

/* Every file a run writes lives in its own temporary folder (main makes it
 * with mkdtemp and removes it at the end), so two suites on one machine never
 * read each other's half-written files. tmp_file("ppl.txt") is that folder's
 * file (the same name gives the same buffer, valid for the whole run); in a
 * command line or an expected message, "@T" stands for the folder. */
static char test_dir[64];
static const char *tmp_file(const char *name) {
    static char names[64][48], paths[64][128];
    static int n;
    int i = 0;
    while (i < n && strcmp(names[i], name)) i++;
    if (i == n) {
        KVT_ASSERT(n < 64 && strlen(name) < sizeof(names[0]) && test_dir[0]);
        snprintf(names[n], sizeof(names[0]), "%s", name);
        snprintf(paths[n], sizeof(paths[0]), "%s/%s", test_dir, name);
        n++;
    }
    return paths[i];
}
static void remove_test_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", test_dir);
    if (test_dir[0] && system(cmd) != 0) printf("(could not remove %s)\n", test_dir);
}
/* test_dir: a new folder kvt_test.XXXXXX in $TMPDIR (when short enough) or /tmp. */
static int make_test_dir(void) {
    const char *t = getenv("TMPDIR");
    snprintf(test_dir, sizeof(test_dir), "%s/kvt_test.XXXXXX", t && t[0] && strlen(t) < 40 ? t : "/tmp");
    if (mkdtemp(test_dir)) return 1;
    printf("cannot make a temporary folder %s: %s\n", test_dir, strerror(errno));
    test_dir[0] = '\0';
    return 0;
}
static void with_test_dir(char *out, size_t cap, const char *s) { /* "@T" -> test_dir */
    size_t k = 0;
    for (; *s && k + 1 < cap; s++) {
        if (s[0] == '@' && s[1] == 'T') { k += (size_t)snprintf(out + k, cap - k, "%s", test_dir); s++; }
        else out[k++] = *s;
        if (k >= cap) k = cap - 1;
    }
    out[k] = '\0';
}

/* Every check ends here. KVT_TEST_FIRST_FAIL=1 stops the run at the first
 * failed check (its FAIL line is printed already), with the usual last line:
 * the bug hunts (exercises/bugs/) need only one symptom, and fast. */
static void tally(int ok) {
    if (ok) { n_pass++; return; }
    n_fail++;
    const char *first = getenv("KVT_TEST_FIRST_FAIL");
    if (first && !strcmp(first, "1")) {
        remove_test_dir();
        printf("(KVT_TEST_FIRST_FAIL=1: stopped at the first failed check)\n");
        printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
        exit(1);
    }
}
static int expect(int ok, const char *fmt, ...) {
    va_list ap;
    printf("%s ", ok ? "PASS" : "FAIL");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    tally(ok);
    return ok;
}
static void skip(const char *what) { printf("SKIP %s\n", what); n_skip++; }
static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static float *frand(size_t n, float scale, uint64_t seed) {
    float *x = (float *)kvt_malloc(n * sizeof(float));
    uint64_t s = seed * 7919 + 13;
    kvt_fill_uniform(x, n, scale, 0.0f, &s);
    return x;
}
static void *dev_copy(int gpu, const void *h, size_t bytes) { /* a buffer on the test's device */
    void *d;
    KVT_ASSERT(buf_alloc(gpu, &d, bytes, "test buffer") == KVT_OK);
    buf_upload(gpu, d, h, bytes);
    return d;
}
static float *to_host(int gpu, const float *d, size_t n) {
    float *h = (float *)kvt_malloc(n * sizeof(float));
    buf_download(gpu, h, d, n * sizeof(float));
    return h;
}
/* float (n) -> float, so kvt_check can compare a float64 reference */
static float *narrow(const double *x, size_t n) {
    float *f = (float *)kvt_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}

/* A pool on its own (the engine checks memory between the two steps). */
static kvt_status pool_init(kvt_pool *p, int gpu, int L, int NKV, int HS, int CH, int n_chunks, kvt_dtype dt, int G) {
    size_t data_bytes, scale_bytes;
    kvt_status st = pool_shape(p, gpu, L, NKV, HS, CH, n_chunks, dt, G, &data_bytes, &scale_bytes);
    return st == KVT_OK ? pool_alloc(p, data_bytes, scale_bytes) : st;
}

/* Shared by the tests: a model config, a greedy generation, files and runs of ./kvt. */
static kvt_config cfg(int D, int L, int NH, int NKV, int HD, int V, int TMAX) {
    kvt_config c = {D, HD, L, NH, NKV, -V, TMAX};
    return c;
}
/* Greedy generation: np prompt tokens, then `steps` tokens; tokens (np+steps),
 * logits (steps, V) of every step. */
static kvt_status generate(kvt_model *m, const kvt_options *o, const int *prompt, int np, int steps, int *tokens,
                           float *logits) {
    kvt_engine *e;
    kvt_status st = kvt_engine_create(&e, m, o);
    if (st != KVT_OK) return st;
    kvt_seq s;
    kvt_seq_init(e, &s);
    int V = m->c.vocab_size;
    memcpy(tokens, prompt, (size_t)np * sizeof(int));
    for (int i = 0; i < steps && st == KVT_OK; i++) {
        st = kvt_step(e, &s, tokens, np + i, logits + (size_t)i * V);
        tokens[np + i] = kvt_argmax(logits + (size_t)i * V, V);
    }
    kvt_seq_free(e, &s);
    kvt_engine_free(e);
    return st;
}
/* m as a llama2.c checkpoint at path, its last `cut` floats left out and
 * `extra` zero bytes added (for files that are too short or too long). */
static int write_checkpoint(const char *path, const kvt_model *m, long cut, int extra) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    kvt_config c = m->c;
    if (!m->shared_classifier) c.vocab_size = -c.vocab_size;
    fwrite(&c, sizeof(c), 1, f);
    fwrite(m->data, sizeof(float), m->n_floats - (size_t)cut, f);
    for (int i = 0; i < extra; i++) fputc(0, f);
    fclose(f);
    return 1;
}
/* The command-line checks need the kvt binary (main's argument): 1 when it
 * is there, else 0 and one SKIP line naming the checks left out. */
static int have_kvt(const char *what) {
    FILE *f = fopen(kvt_bin, "rb");
    if (f) { fclose(f); return 1; }
    printf("SKIP %s (no kvt binary given)\n", what);
    n_skip++;
    return 0;
}
/* Run kvt with args (through the shell: redirections work) and keep the
 * first cap - 1 bytes of stdout + stderr (with stdout_only, of stdout alone:
 * stderr is dropped); returns the exit status (-1: not run). */
static int cli_run_to(const char *args, int stdout_only, char *out, size_t cap) {
    char full[4096], cmd[sizeof(full) + 1024];
    with_test_dir(full, sizeof(full), args);
    snprintf(cmd, sizeof(cmd), "%s %s %s", kvt_bin, full, stdout_only ? "2>/dev/null" : "2>&1");
    out[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    while (fgetc(p) != EOF) {} /* the rest, unread: kvt must not die of a closed pipe */
    return pclose(p);
}
static int cli_run(const char *args, char *out, size_t cap) { return cli_run_to(args, 0, out, cap); }
/* One check of a kvt run: it exits 0 or not as want_ok says and its output
 * contains want_text ("@T": the test folder). The command runs through the
 * shell with this process's environment, so a setenv before the call reaches
 * kvt. */
static void cli_expect(const char *args, int want_ok, const char *want_text) {
    char out[16384], want[1024]; /* --help alone is over 7 KB */
    int rc = cli_run(args, out, sizeof(out));
    with_test_dir(want, sizeof(want), want_text);
    int ok = rc != -1 && (rc == 0) == want_ok && contains(out, want);
    char first[200];
    snprintf(first, sizeof(first), "%.199s", out);
    char *nl = strchr(first, '\n');
    if (nl) *nl = '\0';
    expect(ok, "cli '%s': exit %s, says '%s'", args, rc == 0 ? "0" : "non-zero", first);
}
/* A test's input file: len bytes of text (NULs and all). */
static void write_text(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    KVT_ASSERT(f);
    fwrite(text, 1, len, f);
    fclose(f);
}
/* A whole binary file (NULL if it cannot be read); *bytes its size. */
static char *read_all(const char *path, size_t *bytes) {
    char *data = NULL;
    return kvt_read_file(path, "test file", &data, bytes) == KVT_OK ? data : NULL;
}
/* The integers of a text file, one per line or space-separated; returns the count. */
static int read_ints(const char *path, int *out, int cap) {
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && n < cap && fscanf(f, "%d", &out[n]) == 1) n++;
    if (f) fclose(f);
    return n;
}
/* "1,22,56": ids as a --tokens value */
static void ids_arg(char *buf, size_t cap, const int *ids, int n) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%d" : "%d", ids[i]);
}
/* Rows of logits, each within tol * (that row's largest |want|) of want. */
static int rows_close(const float *got, const float *want, int rows, int V, double tol, double *worst) {
    int ok = 1;
    *worst = 0.0;
    for (int r = 0; r < rows; r++) {
        double mx = 0.0, err = 0.0;
        for (int v = 0; v < V; v++) {
            mx = fmax(mx, fabs(want[(size_t)r * V + v]));
            err = fmax(err, fabs((double)got[(size_t)r * V + v] - want[(size_t)r * V + v]));
        }
        if (!(err <= tol * mx)) ok = 0; /* NaN fails */
        *worst = fmax(*worst, mx > 0 ? err / mx : err);
    }
    return ok;
}

#include "tests/ops.c"
#include "tests/attention.c"
#include "tests/engine.c"
#include "tests/batches.c"
#include "tests/cli.c"
#include "tests/lint.c"
#include "tests/export.c"
#include "tests/hardening.c"
#include "tests/bench.c"
#include "tests/serve.c"
#include "tests/models.c"
#include "tests/exercises.c"
#include "tests/labs.c"
#include "tests/chat.c"
#include "tests/fuzz.c"

#ifndef KVT_FUZZ
/* KVT_TEST_ONLY=cli ./test_kvt ./kvt: run only the checks whose call contains
 * the text ("cli" runs test_cli, test_cli_trace, ...), for a quick loop while
 * working on one part; make test always runs them all.
 * KVT_TEST_KERNELS=1: run only the checks that launch GPU kernels (RUN_GPU
 * below), for make test-gpu-sizes: the other checks test host code, which is
 * the same at every block size. */
static int kernels_only(void) { return getenv("KVT_TEST_KERNELS") != NULL; }
static void run_suite(void);
static int run_jobs(int jobs);
/* KVT_TEST_JOBS=2 (make test): the checks run in two processes. Both walk the
 * RUN lines in order and each takes the next one nobody has taken (a counter
 * in shared memory), so a process that finishes a long check goes on with the
 * next one free. Why: an emulated kernel's threads wait at barriers (§2),
 * which leaves a core idle much of the time. Each process has its own
 * temporary folder; their output is printed when they are done, then one
 * summary. */
static int *run_next; /* the shared counter: the next RUN line to be taken (GCC's atomics: C and nvcc's C++) */
static int run_mine = -1, run_index, job_id;
static int run_this(const char *call) {
    const char *only = getenv("KVT_TEST_ONLY");
    if (only && *only && !strstr(call, only)) return 0;
    if (!run_next) return 1;
    int k = run_index++;
    if (run_mine < 0) run_mine = __atomic_fetch_add(run_next, 1, __ATOMIC_SEQ_CST);
    if (k != run_mine) return 0; /* another process has it */
    run_mine = __atomic_fetch_add(run_next, 1, __ATOMIC_SEQ_CST);
    return 1;
}
/* KVT_TEST_TIMES=1: each check's seconds on stderr, to find the slow ones. */
static void run_timed(const char *call, double t0) {
    if (getenv("KVT_TEST_TIMES")) fprintf(stderr, "[time] %7.2f s  %s\n", kvt_now() - t0, call);
}
#define RUN_GPU(call) do { if (run_this(#call)) { double t0_ = kvt_now(); call; run_timed(#call, t0_); } } while (0)
#define RUN(call) do { if (!kernels_only()) RUN_GPU(call); } while (0)

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--write-fuzz-seeds")) { write_fuzz_seeds(argv[2]); return 0; }
    if (argc > 1 && !strcmp(argv[1], "--lint")) { /* make lint: the style check, apart from the suite */
        test_comment_counter();
        lint_teaching_file_size();
        printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
        return n_fail != 0;
    }
    if (argc > 1) kvt_bin = argv[1];
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!make_test_dir()) return 1;
#ifdef KVT_LAB
    lab_ref_bin = argc > 2 ? argv[2] : "./kvt";
    printf("lab %d check; GPU path: %s\n", KVT_LAB, kvt_gpu_available() ? kvt_gpu_name() : "none");
    lab_check();
    remove_test_dir();
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail || !n_pass ? 1 : 0;
#endif
#ifdef KVT_EXERCISE
    printf("exercise %d check; GPU path: %s\n", KVT_EXERCISE, kvt_gpu_available() ? kvt_gpu_name() : "none");
    exercise_check();
    remove_test_dir();
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail || !n_pass ? 1 : 0;
#endif
    int gpu = kvt_gpu_available();
    printf("kvtransformer tests; GPU kernels run on: %s\n", gpu ? kvt_gpu_name() : "nothing (no CUDA device)");
    int jobs = getenv("KVT_TEST_JOBS") ? atoi(getenv("KVT_TEST_JOBS")) : 1;
    if (jobs > 1 && !getenv("KVT_TEST_FIRST_FAIL")) { /* each process makes its own folder */
        remove_test_dir();
        return run_jobs(jobs < 8 ? jobs : 8);
    }
    run_suite();
    remove_test_dir();
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail ? 1 : 0;
}
/* Every check of make test, in order (RUN: see run_this). */
static void run_suite(void) {
    int gpu = kvt_gpu_available();
    if (kernels_only() && job_id == 0) skip("host-only checks: KVT_TEST_KERNELS runs the checks that launch kernels");
    RUN(test_rmsnorm(0));
    RUN(test_matmul(0));
    RUN(test_rope(0, 10000.0));
    RUN(test_rope(0, 500000.0));
    RUN(test_swiglu_residual_embed(0));
    RUN(test_fp16());
    RUN(test_fast_formats());
    RUN(test_int8_group());
    RUN(test_attention(0));
    RUN(test_attention_ragged(0));
    RUN_GPU(test_attention_spec());
    RUN(test_threads());
    RUN_GPU(test_gpu_split_rule());
    RUN(test_cache_on_off());
    RUN(test_prefill());
    RUN_GPU(test_plain());
    RUN(test_no_alloc());
    RUN(test_quantized_e2e());
    RUN(test_fork_cow(0));
    RUN(test_batch(0));
    RUN(test_fork_sampling());
    RUN(test_prefix_reuse(0));
    RUN(test_batch_exhaustion());
    RUN(test_fork_memory());
    RUN(test_trace_scenario(0));
    RUN(test_trace_shapes());
    RUN(test_bad_input());
    RUN(test_sizes());
    RUN(test_bpe());
    RUN(test_bpe_fast());
    RUN(test_byte_level());
    RUN(test_smollm2_fixture());
    RUN(test_sampler());
    RUN(test_default_model());
    RUN_GPU(test_serve());
    RUN(test_swap_roundtrip());
    RUN(test_prefix_confirm());
    RUN(test_hardening());
    RUN(test_outputs());
    RUN(test_kv_group_default());
    RUN(test_cli());
    RUN(test_cli_no_device());
    RUN(test_cli_trace());
    RUN(test_serve_cli());
    RUN(test_dump_logits());
    RUN(test_chat_default_model());
    RUN(test_chat_random());
    RUN(test_chat_templates());
    RUN(test_chat_limits());
    RUN(test_llama2c_commands());
    RUN_GPU(test_dump_attn());
    RUN(test_rope_base());
    RUN(test_smollm2_logits());
    RUN(test_hf_export());
    RUN(test_hf_export_refusals());
    RUN(test_gguf_export());
    RUN(test_section_map());
    RUN(test_comment_counter());
    RUN(test_bench_shapes());
    RUN(test_bench_run());
    RUN(test_bench_serve());
    if (gpu) {
        RUN_GPU(test_gpu_alloc_error());
        RUN_GPU(test_rmsnorm(1));
        RUN_GPU(test_matmul(1));
        RUN_GPU(test_rope(1, 10000.0));
        RUN_GPU(test_rope(1, 500000.0));
        RUN_GPU(test_swiglu_residual_embed(1));
        RUN_GPU(test_block_reduce());
        RUN_GPU(test_attention(1));
        RUN_GPU(test_launch_count());
        RUN_GPU(test_attention_ragged(1));
        RUN_GPU(test_kv_write_bytes());
        RUN_GPU(test_gpu_matrix());
        RUN_GPU(test_fork_cow(1));
        RUN_GPU(test_batch(1));
        RUN_GPU(test_prefix_reuse(1));
        RUN_GPU(test_trace_scenario(1));
    } else if (job_id == 0) {
        skip("GPU kernel checks: an nvcc build without a CUDA device (the C build emulates them)");
    }
}
/* KVT_TEST_JOBS: n children run the suite, taking checks in turn (run_this);
 * each writes its lines to a file and its counts to a pipe. A child that dies
 * is one failure, with the last line it wrote. The forks come before any
 * OpenMP region: a child of a process with a running thread pool could hang
 * in its first one. */
static int run_jobs(int jobs) {
    run_next = (int *)mmap(NULL, sizeof(*run_next), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    KVT_ASSERT(run_next != MAP_FAILED);
    *run_next = 0; /* before any child exists */
    printf("(the checks run in %d processes, KVT_TEST_JOBS; their lines follow when they are done)\n", jobs);
    FILE *out[8];
    int fd[8][2];
    pid_t pid[8];
    for (int j = 0; j < jobs; j++) {
        out[j] = tmpfile();
        KVT_ASSERT(out[j] && pipe(fd[j]) == 0);
        fflush(stdout);
        pid[j] = fork();
        KVT_ASSERT(pid[j] >= 0);
        if (pid[j] == 0) {
            job_id = j;
            KVT_ASSERT(dup2(fileno(out[j]), 1) >= 0);
            close(fd[j][0]);
            int c[3] = {0, 1, 0};
            if (make_test_dir()) {
                run_suite();
                remove_test_dir();
                c[0] = n_pass, c[1] = n_fail, c[2] = n_skip;
            }
            int sent = write(fd[j][1], c, sizeof(c)) == (ssize_t)sizeof(c);
            exit(sent ? 0 : 3); /* exit, not _exit: a sanitizer's leak check runs at exit */
        }
        close(fd[j][1]);
    }
    for (int j = 0; j < jobs; j++) {
        int c[3] = {0, 0, 0}, status = 0;
        ssize_t got = read(fd[j][0], c, sizeof(c));
        close(fd[j][0]);
        waitpid(pid[j], &status, 0);
        char line[4096], last[4096] = "(nothing)\n";
        rewind(out[j]);
        while (fgets(line, sizeof(line), out[j])) {
            fputs(line, stdout);
            snprintf(last, sizeof(last), "%s", line);
        }
        fclose(out[j]);
        if (got == (ssize_t)sizeof(c) && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            n_pass += c[0], n_fail += c[1], n_skip += c[2];
        } else {
            n_fail++;
            printf("FAIL test process %d of %d ended with %s %d (a crash, or a sanitizer's report on stderr); its "
                   "last line: %s", j + 1, jobs, WIFSIGNALED(status) ? "signal" : "exit status",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), last);
        }
    }
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail ? 1 : 0;
}
#endif
