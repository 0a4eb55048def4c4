/* kvtransformer: §20 command line, the program around the engine.
 *
 * Not compiled on its own: kvtransformer.cu includes this file at §20, so
 * everything defined there is visible here, and `make` builds one program
 * (./kvt) as before. What is here: the flags (one table, cli_flags[]), the
 * generation loop with --fork and --prompts (run_single, read_prompts), a
 * conversation (--chat, run_chat), perplexity (--ppl), --stats, main, and
 * kvt_read_file (a whole file into memory: --ppl and the tests). The engine it drives is in
 * kvtransformer.cu §15; the benchmarks that --bench runs are in bench/bench.c. */

/* A whole file into memory (+ a NUL), read in pieces: no size is assumed, so
 * pipes and /proc files work too (their size is unknown until the end). */
static kvt_status kvt_read_file(const char *path, const char *what, char **text, size_t *len) {
    FILE *f;
    kvt_status st = kvt_open_read(&f, path, what);
    size_t cap = 1 << 16, n = 0;
    *text = NULL;
    *len = 0;
    if (st != KVT_OK) return st;
    char *buf = (char *)malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break; /* the end of the file, or an error (ferror below) */
        char *grown = cap <= SIZE_MAX / 4 ? (char *)realloc(buf, 2 * cap + 1) : NULL;
        if (!grown) { free(buf); buf = NULL; break; }
        buf = grown;
        cap *= 2;
    }
    if (!buf) st = kvt_fail(KVT_ENOMEM, "host out of memory reading %s '%s' (more than %zu bytes)", what, path, n);
    else if (ferror(f)) st = kvt_fail(KVT_EIO, "cannot read %s '%s': %s", what, path, strerror(errno));
    fclose(f);
    if (st != KVT_OK) { free(buf); return st; }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return KVT_OK;
}

#if !defined(KVT_NO_MAIN) || defined(KVT_CLI) /* KVT_CLI: test.c's command-line fuzz target */
/* The command line is a thin layer over the library above: parse and check
 * every flag (one line naming the flag and its range on error), load the
 * model and tokenizer, make one engine, then one of four runs:
 *   --bench ...        a measurement (§19), on a random or loaded model;
 *   --ppl FILE         teacher-forced perplexity (run_ppl);
 *   --prompts / --fork several sequences decoded as one batch (run_batch);
 *   --chat             a conversation: turns from stdin, one sequence (run_chat);
 *   otherwise          one sequence, printed as it is generated (run_single),
 *                      with --check running a CPU engine beside it. */
#define KVT_THREADS_PER_CORE 8 /* OMP_NUM_THREADS above this many a core is refused */
static void usage(FILE *f) {
    /* Which binary this is: make debug's -O0 build (./kvt-debug, for gdb) runs
     * 10-20x slower, so make test checks that it is testing an optimized one.
     * Said first, where a reader of a long help (or a test that reads its
     * first 4 KB) sees it. */
#ifdef __OPTIMIZE__
    const char *opt = "an optimized build";
#else
    const char *opt = "an unoptimized -O0 build, for gdb";
#endif
    fprintf(f, "usage: kvt [CHECKPOINT] [options]    (this kvt: %s, %s)\n",
            KVT_EMULATED ? "C (CUDA kernels emulated)" : "CUDA", opt);
    fprintf(f,
        "  CHECKPOINT, -m, --model PATH   llama2.c checkpoint (default weights/model.bin); first, as in llama2.c's\n"
        "                          ./run model.bin, or with -m: the one flag unlike llama2.c's, whose -m is\n"
        "                          the mode (-m chat is --mode chat here)\n"
        "  -z, --tokenizer PATH    llama2.c tokenizer.bin (default weights/tokenizer.bin)\n"
        "  --random D,L,NH,NKV,HD,V,TMAX  a deterministic random model instead (prints token ids)\n"
        "  --prompt-tokens N       --random: a prompt of N made-up token ids (default 8, at most TMAX / 2)\n"
        "  -i, --prompt TEXT       prompt (default \"ROMEO:\")\n"
        "  --prompts FILE          one prompt per line, all decoded as one batch\n"
        "  --tokens ID,ID,...      the prompt as token ids (any model), instead of -i: decimal digits only, each\n"
        "                          in [0, V), separated by commas; spaces around an id are allowed\n"
        "  --dump-logits FILE      write every forward position's logits: float32 little-endian, [positions][V]\n"
        "                          (with -n 0, the prompt's rows)\n"
        "  --dump-tokens FILE      write the token ids fed, then the last one chosen, one per line\n"
        "  --trace [FILE]          after each forward call: every sequence's chunk table, the pool, the totals\n"
        "                          (to stderr, or to FILE; the text on stdout is the same as without it)\n"
        "  --fork N                N continuations of the prompt (seeds seed, seed+1, ...), sharing its cache\n"
        "  --fork-share on|off     off: each --fork continuation computes and stores the prompt itself\n"
        "  --prefix-cache on|off   reuse cached chunks of a live sequence with the same prompt prefix (default on)\n"
        "  -n, --steps N           tokens to generate (default 256, at most TMAX - prompt; --chat: per reply)\n"
        "  -t, --temperature F     0 = greedy (default 0.8); below 1e-6 counts as 0 (greedy)\n"
        "  -p, --topp F            nucleus sampling threshold in (0, 1] (default 0.9)\n"
        "  -s, --seed N            sampling seed (default 42)\n"
        "  --chat, --mode chat     a conversation: a turn per line of stdin (the first may be -i) in one cached\n"
        "                          sequence (--mode generate: one prompt, the default); a full context ends it\n"
        "                          with exit 0, unless not even turn 1 fits (exit 1); a turn the vocabulary\n"
        "                          cannot encode is skipped with a line on stderr, and the exit is then 1\n"
        "  --template llama2|zephyr|plain|chatml   --chat: [INST] ... [/INST] (llama2.c's), <|user|> ... (TinyLlama),\n"
        "                          the text as is, <|im_start|>user ... (SmolLM2, Qwen) (default: chatml when the\n"
        "                          vocabulary has <|im_start|>, else llama2 with byte fallback, else plain)\n"
        "  -y, --system TEXT       --chat: the system prompt (chatml's default: SmolLM2's; -y '' for none)\n"
        "  --dump-attn FILE        attention weights as CSV lines query,layer,head,key,weight (key 0..query)\n"
        "  --dump-attn-layer L     --dump-attn: only layer L (default: all); with -n 0, the prompt's rows\n"
        "  --dump-attn-max MB      --dump-attn: refuse a run whose file could pass MB megabytes (default 1024)\n"
        "  --kv-cache on|off       off: every step recomputes the whole sequence (default on); its K/V\n"
        "                          still pass through the cache, so --kv-dtype rounds them either way\n"
        "  --chunk CH              positions per cache chunk, 1..TMAX (default 16, or TMAX if smaller;\n"
        "                          TMAX = contiguous)\n"
        "  --chunks N              chunks in the pool (default: enough for every sequence at TMAX)\n"
        "  --kv-dtype fp32|fp16|int8   cache element type (default fp32)\n"
        "  --kv-group G            int8: channels per scale, must divide HS (default 32, else 16, else the\n"
        "                          largest divisor of HS below 32)\n"
        "  --attn naive|fused      attention implementation (default fused)\n"
        "  --split N               fused attention: positions per split (0 auto, -1 never)\n"
        "  --device cpu|gpu        where to run (default gpu when a CUDA device exists)\n"
        "  --plain                 every op through kvtransformer.cu's own version (the specs, the plain\n"
        "                          kernels), none of the tuned loops in cpu/ and gpu/: what you read is\n"
        "                          what runs, for gdb. Decode is several times slower (one-core attention)\n"
        "  --stats                 print cache and timing figures at the end\n"
        "  --check                 run CPU and GPU side by side; print the logit difference per step (stderr)\n"
        "  --ppl FILE              perplexity of a text file (teacher forced, windows of TMAX)\n"
        "  --ppl-from F            start --ppl at this fraction of the file (e.g. 0.9)\n"
        "  --bench decode|positions|batch|attention|stages|context|matmul   speed vs the bandwidth bound;\n"
        "                          ms/token vs position; tokens/s vs batch size; naive vs fused vs split\n"
        "                          attention; the staged table (no cache -> cache -> fused -> int8 -> batch\n"
        "                          of 8); B sequences at context T per cache type vs the bound; matmul\n"
        "                          tiles vs sgemm GFLOP/s by row count\n"
        "  --bench-ctx T           --bench attention/stages/context: cached positions (default TMAX; TMAX/2,\n"
        "                          at most TMAX - 8; TMAX - 64, or TMAX - 32 when TMAX <= 64)\n"
        "  --bench-batch B         --bench context: sequences decoded together (default 1)\n"
        "  --bench-every N         --bench positions: step between positions (default 64, less for TMAX < 68)\n"
        "  --csv FILE              --bench: also write the table as CSV\n"
        "  --serve FILE            serve a trace of requests (arrival_ms<TAB>max_new<TAB>prompt per line;\n"
        "                          prompt escapes \\n \\t \\\\, or ids:1,2,3): continuous batching over one pool,\n"
        "                          a summary on stderr. max_new is capped at TMAX - prompt (finish: length)\n"
        "  --max-running N         --serve: most requests running at once (default 16)\n"
        "  --max-batch-tokens N    --serve: rows per step, decode + chunked prefill (default 256)\n"
        "  --preempt recompute|swap  --serve: what a preempted request gives up (default recompute)\n"
        "  --swap-mb F             --preempt swap: host swap area in MB (default 64; full: recompute)\n"
        "  --serve-watermark W     --serve: free chunks kept for growth when admitting (default 1)\n"
        "  --serve-policy continuous|reserve|static  --serve: admission reserves the prompt's chunks\n"
        "                          (default), or prompt + max_new (Orca), and static also waits for the\n"
        "                          whole batch to finish before it admits again. With --kv-cache off a\n"
        "                          request drops its cache after every token and prefills its history again\n"
        "  --serve-clock measured|steps  --serve: measured step times, or a stated cost per step\n"
        "                          (1 ms + 0.1 ms a row: the same schedule on every machine)\n"
        "  --serve-log FILE        --serve: a CSV row per request (times, tokens, finish, preemptions)\n"
        "  --serve-text FILE       --serve: id<TAB>generated text per request (\\n \\t \\\\ escaped)\n"
        "  --stop STR              --serve: a request ends when its text contains STR (\\n \\t \\\\ escapes)\n"
        "                          (--serve's pool, --chunks: default a quarter of --max-running full\n"
        "                          contexts, and room for the largest request)\n"
        "  -h, --help              this text\n"
        "environment: OMP_NUM_THREADS sets the CPU threads (default one a core); more than %d a core is\n"
        "refused (each thread takes a stack: a team of 100,000 overflows it)\n", KVT_THREADS_PER_CORE);
}

/* One number syntax for every numeric flag: an optional '-', decimal digits
 * and, for a float, an optional fraction and exponent ("-1.5e-3", ".5").
 * No leading or trailing space, no '+', no hex ("0x10"), no "inf"/"nan":
 * strtol/strtod alone accept " 5" and 0x10 and read 1e-400 as 0. */
static int number_syntax_ok(const char *s, int is_float) {
    const char *p = s;
    int digits = 0;
    if (*p == '-') p++;
    while (*p >= '0' && *p <= '9') { p++; digits++; }
    if (is_float && *p == '.') {
        p++;
        while (*p >= '0' && *p <= '9') { p++; digits++; }
    }
    if (!digits) return 0;
    if (is_float && (*p == 'e' || *p == 'E')) {
        p++;
        if (*p == '-' || *p == '+') p++;
        if (!(*p >= '0' && *p <= '9')) return 0;
        while (*p >= '0' && *p <= '9') p++;
    }
    return *p == '\0';
}
/* Parse an int/float flag value with its allowed range; 0 on error (message
 * set). The syntax is checked first, then the value: strtol/strtod's ERANGE
 * (an overflow, or a float that underflows to 0 or a denormal) is refused. */
static int arg_long(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    int ok = number_syntax_ok(s, 0);
    long v = ok ? strtol(s, &end, 10) : 0;
    if (!ok || errno || v < lo || v > hi) {
        kvt_fail(KVT_EARG, "%s '%s': expected an integer in [%ld, %ld]", flag, s, lo, hi);
        return 0;
    }
    *out = v;
    return 1;
}
static int arg_float(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    int ok = number_syntax_ok(s, 1);
    double v = ok ? strtod(s, &end) : 0;
    if (!ok || errno || !(v >= lo && v <= hi)) {
        kvt_fail(KVT_EARG, "%s '%s': expected a number in [%g, %g]%s", flag, s, lo, hi,
                 errno == ERANGE ? " (out of a double's range)" : "");
        return 0;
    }
    *out = v;
    return 1;
}
/* --random D,L,NH,NKV,HD,V,TMAX: exactly 7 integers, each in [1, INT_MAX]
 * (sscanf's %d accepted "64abc", an 8th field, and wrapped 4294967360 to 64).
 * The sizes are then checked together by kvt_config_check. */
static int arg_random(const char *s, kvt_config *r) {
    static const char *const names[7] = {"D", "L", "NH", "NKV", "HD", "V", "TMAX"};
    int *field[7] = {&r->dim, &r->n_layers, &r->n_heads, &r->n_kv_heads, &r->hidden_dim, &r->vocab_size, &r->seq_len};
    const char *p = s;
    for (int i = 0; i < 7; i++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        const char *d = p + (*p == '-'); /* decimal: an optional '-' (then "out of range"), digits; no space or hex */
        if (*d < '0' || *d > '9') end = (char *)p;
        if (end == p || errno || v < 1 || v > INT_MAX || *end != (i < 6 ? ',' : '\0')) {
            char why[64];
            if (end == p || (*end != ',' && *end != '\0')) snprintf(why, sizeof(why), "field %d (%s) is not an integer", i + 1, names[i]);
            else if (errno || v < 1 || v > INT_MAX) snprintf(why, sizeof(why), "field %d (%s) is out of range", i + 1, names[i]);
            else if (*end == ',') snprintf(why, sizeof(why), "more than 7 fields");
            else snprintf(why, sizeof(why), "only %d fields", i + 1);
            kvt_fail(KVT_EARG, "--random '%s': expected D,L,NH,NKV,HD,V,TMAX (7 integers in [1, %d]): %s", s, INT_MAX, why);
            return 0;
        }
        *field[i] = (int)v;
        p = end + 1;
    }
    r->vocab_size = -r->vocab_size; /* an unshared classifier (spread-out logits) */
    if (kvt_config_check(r) != KVT_OK) {
        char msg[sizeof(kvt_errbuf)];
        snprintf(msg, sizeof(msg), "%s", kvt_errbuf);
        kvt_fail(KVT_EARG, "--random: %s", msg);
        return 0;
    }
    return 1;
}
static int arg_choice(const char *flag, const char *s, const char *const *names, int *out) {
    char list[128] = "";
    for (int i = 0; names[i]; i++) {
        if (!strcmp(s, names[i])) { *out = i; return 1; }
        strcat(list, i ? "|" : "");
        strcat(list, names[i]);
    }
    kvt_fail(KVT_EARG, "%s '%s': expected one of %s", flag, s, list);
    return 0;
}

typedef struct {
    int argc;      /* the command line, for cli_gave */
    char **argv;
    const char *model, *tokenizer, *prompt, *ppl, *bench, *csv, *prompts, *tokens, *dump_logits, *dump_tokens;
    int random, steps, stats, check, bench_every, bench_ctx, bench_batch, fork, prompt_tokens, fork_share;
    kvt_config rc;
    double temperature, topp, ppl_from;
    long seed;
    kvt_options o;
    const char *trace; /* --trace: NULL off, "" stderr, else the file's path */
    FILE *tracef;      /* where --trace writes (opened by main), or NULL */
    int model_pos;     /* 1: the checkpoint came as the first argument (llama2.c's ./run model.bin) */
    int chat, mode, tpl; /* --chat; --mode (0 generate, 1 chat); --template (enum chat_tpl, -1 automatic) */
    const char *system;  /* -y/--system: the chat's system prompt, or NULL */
    const char *dump_attn; /* --dump-attn FILE, or NULL */
    int dump_attn_layer;   /* --dump-attn-layer, -1: every layer */
    int dump_attn_max;     /* --dump-attn-max MB: a larger planned file is refused */
    FILE *attnf;           /* where --dump-attn writes (opened by the runner), or NULL */
    int attn_next;         /* --dump-attn writes rows at positions >= this (earlier ones are in the file) */
    int attn_errno;        /* --dump-attn: the first failed write's errno (nothing more is written), or 0 */
    /* --serve (cli/serve.c) */
    const char *serve, *serve_log, *serve_text, *stop;
    int max_running, max_batch, preempt, serve_clock, watermark, policy;
    double swap_mb;
} kvt_cli;

/* Every flag, once: its names, how its value is read, and the field of
 * kvt_cli it goes to (offsetof). parse_args and cli_gave both read this table,
 * so a new flag is one line here (and one in usage). */
enum { ARG_FLAG, ARG_STR, ARG_INT, ARG_LONG, ARG_FLOAT, ARG_CHOICE, ARG_NAME, ARG_RANDOM, ARG_OPT };
/* ARG_OPT: a string whose value may be left out ("" then), as in --trace [FILE] */
typedef struct {
    const char *name, *alt;   /* "-n", "--steps" (alt may be NULL) */
    int kind;                 /* FLAG: no value, sets 1; CHOICE: the index of the name; NAME: the name itself */
    size_t at;                /* offsetof(kvt_cli, the field) */
    double lo, hi;            /* INT, LONG, FLOAT: the allowed range */
    const char *const *names; /* CHOICE, NAME: the allowed values, NULL-terminated */
} cli_flag;
static const char *const arg_onoff[] = {"off", "on", NULL}, *const arg_dtypes[] = {"fp32", "fp16", "int8", NULL},
                         *const arg_attns[] = {"naive", "fused", NULL}, *const arg_devs[] = {"cpu", "gpu", NULL},
                         *const arg_benches[] = {"decode", "positions", "batch", "attention", "stages", "context",
                                                 "matmul", NULL},
                         *const arg_preempts[] = {"recompute", "swap", NULL},
                         *const arg_clocks[] = {"measured", "steps", NULL},
                         *const arg_policies[] = {"continuous", "reserve", "static", NULL}, /* SV_* order */
                         *const arg_modes[] = {"generate", "chat", NULL}, *const arg_templates[] = {"llama2", "zephyr",
                                                                                                  "plain", "chatml", NULL};
enum chat_tpl { TPL_LLAMA2, TPL_ZEPHYR, TPL_PLAIN, TPL_CHATML }; /* arg_templates' order */
#define AT(field) offsetof(kvt_cli, field)
static const cli_flag cli_flags[] = {
    {"-m", "--model", ARG_STR, AT(model), 0, 0, NULL},
    {"-z", "--tokenizer", ARG_STR, AT(tokenizer), 0, 0, NULL},
    {"--random", NULL, ARG_RANDOM, AT(rc), 0, 0, NULL},
    {"-i", "--prompt", ARG_STR, AT(prompt), 0, 0, NULL},
    {"--prompt-tokens", NULL, ARG_INT, AT(prompt_tokens), 1, KVT_LIMIT_SEQ, NULL},
    {"--prompts", NULL, ARG_STR, AT(prompts), 0, 0, NULL},
    {"--tokens", NULL, ARG_STR, AT(tokens), 0, 0, NULL},
    {"--dump-logits", NULL, ARG_STR, AT(dump_logits), 0, 0, NULL},
    {"--dump-tokens", NULL, ARG_STR, AT(dump_tokens), 0, 0, NULL},
    {"--chat", NULL, ARG_FLAG, AT(chat), 0, 0, NULL},
    {"--mode", NULL, ARG_CHOICE, AT(mode), 0, 0, arg_modes},
    {"--template", NULL, ARG_CHOICE, AT(tpl), 0, 0, arg_templates},
    {"-y", "--system", ARG_STR, AT(system), 0, 0, NULL},
    {"--dump-attn", NULL, ARG_STR, AT(dump_attn), 0, 0, NULL},
    {"--dump-attn-layer", NULL, ARG_INT, AT(dump_attn_layer), 0, KVT_LIMIT_LAYERS - 1, NULL},
    {"--dump-attn-max", NULL, ARG_INT, AT(dump_attn_max), 1, 1 << 30, NULL},
    {"--fork", NULL, ARG_INT, AT(fork), 1, KVT_MAX_SEQS, NULL},
    {"--fork-share", NULL, ARG_CHOICE, AT(fork_share), 0, 0, arg_onoff},
    {"--prefix-cache", NULL, ARG_CHOICE, AT(o.prefix_reuse), 0, 0, arg_onoff},
    {"-n", "--steps", ARG_INT, AT(steps), 0, KVT_LIMIT_SEQ, NULL},
    {"-t", "--temperature", ARG_FLOAT, AT(temperature), 0, 100, NULL},
    {"-p", "--topp", ARG_FLOAT, AT(topp), 1e-6, 1, NULL},
    {"-s", "--seed", ARG_LONG, AT(seed), 0, INT_MAX, NULL},
    {"--kv-cache", NULL, ARG_CHOICE, AT(o.kv_cache), 0, 0, arg_onoff},
    {"--chunk", NULL, ARG_INT, AT(o.CH), 1, KVT_LIMIT_SEQ, NULL},
    {"--chunks", NULL, ARG_INT, AT(o.n_chunks), 1, KVT_LIMIT_CHUNKS, NULL},
    {"--kv-dtype", NULL, ARG_CHOICE, AT(o.kv_dtype), 0, 0, arg_dtypes},
    {"--kv-group", NULL, ARG_INT, AT(o.kv_group), 1, KVT_MAX_HS, NULL},
    {"--attn", NULL, ARG_CHOICE, AT(o.attn), 0, 0, arg_attns},
    {"--split", NULL, ARG_INT, AT(o.split_len), -1, KVT_LIMIT_SEQ, NULL},
    {"--device", NULL, ARG_CHOICE, AT(o.device), 0, 0, arg_devs},
    {"--plain", NULL, ARG_FLAG, AT(o.plain), 0, 0, NULL},
    {"--stats", NULL, ARG_FLAG, AT(stats), 0, 0, NULL},
    {"--check", NULL, ARG_FLAG, AT(check), 0, 0, NULL},
    {"--trace", NULL, ARG_OPT, AT(trace), 0, 0, NULL},
    {"--ppl", NULL, ARG_STR, AT(ppl), 0, 0, NULL},
    {"--ppl-from", NULL, ARG_FLOAT, AT(ppl_from), 0, 1, NULL},
    {"--bench", NULL, ARG_NAME, AT(bench), 0, 0, arg_benches},
    {"--bench-ctx", NULL, ARG_INT, AT(bench_ctx), 1, KVT_LIMIT_SEQ, NULL},
    {"--bench-batch", NULL, ARG_INT, AT(bench_batch), 1, 256, NULL},
    {"--bench-every", NULL, ARG_INT, AT(bench_every), 1, KVT_LIMIT_SEQ, NULL},
    {"--csv", NULL, ARG_STR, AT(csv), 0, 0, NULL},
    {"--serve", NULL, ARG_STR, AT(serve), 0, 0, NULL},
    {"--serve-log", NULL, ARG_STR, AT(serve_log), 0, 0, NULL},
    {"--serve-text", NULL, ARG_STR, AT(serve_text), 0, 0, NULL},
    {"--stop", NULL, ARG_STR, AT(stop), 0, 0, NULL},
    {"--max-running", NULL, ARG_INT, AT(max_running), 1, KVT_MAX_SEQS, NULL},
    {"--max-batch-tokens", NULL, ARG_INT, AT(max_batch), 1, KVT_MAX_ROWS, NULL},
    {"--preempt", NULL, ARG_CHOICE, AT(preempt), 0, 0, arg_preempts},
    {"--serve-clock", NULL, ARG_CHOICE, AT(serve_clock), 0, 0, arg_clocks},
    {"--serve-policy", NULL, ARG_CHOICE, AT(policy), 0, 0, arg_policies},
    {"--serve-watermark", NULL, ARG_INT, AT(watermark), 0, KVT_LIMIT_CHUNKS, NULL},
    {"--swap-mb", NULL, ARG_FLOAT, AT(swap_mb), 0, 1e6, NULL},
};
#undef AT
static const cli_flag *cli_flag_of(const char *name) {
    for (size_t k = 0; k < sizeof(cli_flags) / sizeof(cli_flags[0]); k++)
        if (!strcmp(name, cli_flags[k].name) || (cli_flags[k].alt && !strcmp(name, cli_flags[k].alt))) return &cli_flags[k];
    return NULL;
}

/* Does the flag at argv[i] take argv[i + 1] as its value? Every kind but a
 * FLAG does, and an OPT unless nothing or another flag (a word starting with
 * '-') comes next: "--trace -n 5" traces to stderr. */
static int cli_has_value(const cli_flag *fl, int i, int argc, char **argv) {
    if (fl->kind == ARG_FLAG) return 0;
    if (fl->kind == ARG_OPT) return i + 1 < argc && argv[i + 1][0] != '-';
    return 1;
}

/* Returns 1 when all flags are good, 2 for --help, 0 on an error (message
 * set). A flag not in the table is reported as unknown wherever it stands.
 * Nothing is allocated and nothing exits here (the command-line fuzz target
 * calls it). Enum fields (kv_dtype, attn, device) are stored as int. */
static int parse_args(kvt_cli *a, int argc, char **argv) {
    a->argc = argc;
    a->argv = argv;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *s;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) return 2;
        if (i == 1 && f[0] != '-') { a->model = f; a->model_pos = 1; continue; } /* llama2.c: ./run model.bin ... */
        const cli_flag *fl = cli_flag_of(f);
        if (!fl) { kvt_fail(KVT_EARG, "unknown flag '%s' (see --help)", f); return 0; }
        char *field = (char *)a + fl->at;
        long v;
        int c;
        if (fl->kind == ARG_FLAG) { *(int *)field = 1; continue; }
        if (fl->kind == ARG_OPT) {
            *(const char **)field = cli_has_value(fl, i, argc, argv) ? argv[++i] : "";
            continue;
        }
        if (i + 1 >= argc) { kvt_fail(KVT_EARG, "%s needs a value", f); return 0; }
        s = argv[++i];
        switch (fl->kind) {
        case ARG_STR: *(const char **)field = s; break;
        case ARG_INT: if (!arg_long(f, s, (long)fl->lo, (long)fl->hi, &v)) return 0; *(int *)field = (int)v; break;
        case ARG_LONG: if (!arg_long(f, s, (long)fl->lo, (long)fl->hi, (long *)field)) return 0; break;
        case ARG_FLOAT: if (!arg_float(f, s, fl->lo, fl->hi, (double *)field)) return 0; break;
        case ARG_CHOICE: if (!arg_choice(f, s, fl->names, &c)) return 0; *(int *)field = c; break;
        case ARG_NAME: if (!arg_choice(f, s, fl->names, &c)) return 0; *(const char **)field = fl->names[c]; break;
        default: if (!arg_random(s, (kvt_config *)field)) return 0; a->random = 1; break; /* ARG_RANDOM */
        }
    }
    return 1;
}

/* Did the user give this flag (under either of its names)? Only flag
 * positions count, not values ("-i --chunk" is a prompt). */
static int cli_gave(const kvt_cli *a, const char *name) {
    const cli_flag *want = cli_flag_of(name);
    for (int i = 1; i < a->argc; i++) {
        const cli_flag *fl = cli_flag_of(a->argv[i]);
        if (fl && fl == want) return 1;
        if (fl && cli_has_value(fl, i, a->argc, a->argv)) i++; /* skip its value */
    }
    return 0;
}

/* The checks that need the model's shape (c: TMAX, HS) but nothing else: flag
 * combinations that would silently ignore a flag, and the defaults fitted to
 * a small model (a default that does not fit is changed, not reported under
 * the name of a flag the user never gave). No allocation, no exit: the
 * command-line fuzz target runs it. Returns 1 when the flags can run. */
static int cli_check(kvt_cli *a, const kvt_config *c) {
    int TMAX = c->seq_len, HS = c->dim / c->n_heads;
    int gave_prompt = cli_gave(a, "-i"), fork = a->fork > 0, chat = a->chat || a->mode == 1;
    struct { int bad; const char *why; } rules[] = {
        {fork && a->prompts, "--fork continues one prompt and --prompts gives several: use one of them"},
        {gave_prompt && a->prompts, "-i/--prompt and --prompts both give the prompt: use one of them"},
        {a->ppl && (a->prompts || fork), "--ppl scores a file: it decodes no --prompts or --fork"},
        {a->bench && (a->ppl || a->prompts || fork || a->check),
         "--bench is a run of its own: drop --ppl, --prompts, --fork and --check"},
        {a->ppl && a->check, "--check compares a decoding run: drop --ppl"},
        {gave_prompt && a->random, "-i needs a tokenizer: a --random model takes --prompt-tokens N"},
        {cli_gave(a, "--prompt-tokens") && !a->random, "--prompt-tokens is for --random models: give text with -i"},
        {a->csv && !a->bench, "--csv writes the table of a --bench run: add --bench"},
        {cli_gave(a, "--kv-group") && a->o.kv_dtype != KVT_INT8 && !a->bench,
         "--kv-group sets the channels per scale of an int8 cache: add --kv-dtype int8"},
        {cli_gave(a, "--split") && a->o.attn == KVT_ATTN_NAIVE, "--split divides the fused attention: drop it "
         "or use --attn fused"},
        {cli_gave(a, "--ppl-from") && !a->ppl, "--ppl-from needs --ppl"},
        {(cli_gave(a, "--bench-ctx") || cli_gave(a, "--bench-batch") || cli_gave(a, "--bench-every"))
         && !a->bench, "--bench-ctx, --bench-batch and --bench-every need --bench"},
        {cli_gave(a, "--fork-share") && a->fork < 2, "--fork-share needs --fork N with N >= 2"},
        {a->tokens && (gave_prompt || a->prompts || cli_gave(a, "--prompt-tokens")),
         "--tokens gives the prompt as token ids: drop -i, --prompts and --prompt-tokens"},
        {(a->dump_logits || a->dump_tokens) && (a->prompts || a->fork > 1 || a->ppl || a->bench),
         "--dump-logits and --dump-tokens record one sequence's run: drop --prompts, --fork, --ppl and --bench"},
        {a->trace && (a->ppl || a->bench), "--trace shows the cache of a generation run: drop --ppl and --bench"},
        {a->model_pos && (cli_gave(a, "-m") || a->random), "the checkpoint is given twice: as the first argument "
         "and with -m/--model or --random"},
        {a->chat && cli_gave(a, "--mode") && a->mode == 0, "--chat and --mode generate contradict each other"},
        {chat && (a->prompts || fork || a->ppl || a->bench || a->check),
         "--chat is a conversation in one sequence: drop --prompts, --fork, --ppl, --bench and --check"},
        {chat && a->tokens, "--chat reads its turns from standard input (the first may be -i): drop --tokens"},
        {chat && a->random && cli_gave(a, "--prompt-tokens"), "--chat with --random reads lines of token ids from "
         "standard input: drop --prompt-tokens"},
        {!chat && (cli_gave(a, "--template") || a->system), "--template and -y/--system shape a conversation: add "
         "--chat (or --mode chat)"},
        {chat && a->random && cli_gave(a, "--template") && a->tpl != TPL_PLAIN, "--template llama2, zephyr and chatml "
         "take their markers from a tokenizer: a --random model chats with --template plain (lines of token ids)"},
        {chat && a->random && a->system, "-y/--system is text, and a --random model has no tokenizer: drop it"},
        {a->dump_attn && (a->prompts || a->fork > 1 || a->ppl || a->bench),
         "--dump-attn records one sequence's run: drop --prompts, --fork, --ppl and --bench"},
        {(cli_gave(a, "--dump-attn-layer") || cli_gave(a, "--dump-attn-max")) && !a->dump_attn,
         "--dump-attn-layer and --dump-attn-max shape --dump-attn: add --dump-attn FILE"},
        {a->serve && (a->prompts || fork || chat || a->bench || a->ppl || a->check || gave_prompt || a->tokens ||
                      a->dump_logits || a->dump_tokens || a->dump_attn || cli_gave(a, "-n")),
         "--serve takes its prompts and lengths from the trace: drop --prompts, --fork, --chat, --bench, --ppl, "
         "--check, -i, --tokens, -n and the --dump flags"},
        {!a->serve && (a->serve_log || a->serve_text || a->stop || cli_gave(a, "--max-running") ||
                       cli_gave(a, "--max-batch-tokens") || cli_gave(a, "--preempt") || cli_gave(a, "--serve-clock") ||
                       cli_gave(a, "--serve-policy") || cli_gave(a, "--serve-watermark") || cli_gave(a, "--swap-mb")),
         "--serve-log, --serve-text, --stop, --max-running, --max-batch-tokens, --preempt, --serve-clock, "
         "--serve-policy, --serve-watermark and --swap-mb shape a --serve run: add --serve FILE"},
        {a->serve && a->max_batch < a->max_running, "--max-batch-tokens must be at least --max-running (every "
         "running request decodes one row a step)"},
        {a->serve && cli_gave(a, "--swap-mb") && a->preempt == 0, "--swap-mb sizes the swap area of --preempt swap"},
        {a->serve && a->stop && !a->stop[0], "--stop needs a non-empty string"},
        {a->serve && a->stop && a->random, "--stop matches text, and a --random model has no tokenizer: end "
         "requests by max_new"},
        {a->serve && !a->o.kv_cache && (a->policy || a->preempt),
         "--serve --kv-cache off recomputes every history each step: drop --serve-policy and --preempt"},
    };
    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++)
        if (rules[i].bad) { kvt_fail(KVT_EARG, "%s", rules[i].why); return 0; }
    if (!cli_gave(a, "--chunk") && a->o.CH > TMAX) a->o.CH = TMAX; /* the default 16, for TMAX < 16 */
    if (!cli_gave(a, "--prompt-tokens")) a->prompt_tokens = TMAX / 2 < 8 ? (TMAX / 2 > 1 ? TMAX / 2 : 1) : 8;
    if (!cli_gave(a, "--bench-every") && a->bench_every + 4 > TMAX) /* the default 64: about 8 rows on a short */
        a->bench_every = (TMAX - 4) / 8 > 1 ? (TMAX - 4) / 8 : 1;  /* model (a row times 4 positions from it) */
    if (!cli_gave(a, "--kv-group")) a->o.kv_group = kvt_kv_group_auto(HS); /* the engine's default, made explicit */
    if (!cli_gave(a, "--dump-attn-layer")) a->dump_attn_layer = -1; /* every layer */
    else if (a->dump_attn_layer >= c->n_layers) {
        kvt_fail(KVT_EARG, "--dump-attn-layer %d: this model's layers are 0..%d", a->dump_attn_layer, c->n_layers - 1);
        return 0;
    }
    if (!cli_gave(a, "--template")) a->tpl = -1; /* chosen by run_chat from the vocabulary */
    a->chat = chat;
    return 1;
}

/* Which file a path names, so that paths are compared as files, not as
 * strings: "m.bin", "./m.bin", "../dir/m.bin" and a hard link are one file
 * (device and inode). A path that does not exist yet is named by its
 * directory's device and inode and its last component. Returns 0 when even
 * the directory cannot be looked at (opening the file reports why), 2 for an
 * existing file that is not a regular file (a device, a pipe: /dev/null
 * twice is no conflict, and there is nothing to clobber), else 1. */
typedef struct { dev_t dev; ino_t ino; char name[256]; } cli_file_id;
static int cli_file_id_of(const char *path, cli_file_id *id) {
    struct stat sb;
    memset(id, 0, sizeof(*id));
    if (stat(path, &sb) == 0) {
        id->dev = sb.st_dev;
        id->ino = sb.st_ino;
        return S_ISREG(sb.st_mode) ? 1 : 2;
    }
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (slash) snprintf(dir, sizeof(dir), "%.*s/", (int)(slash - path), path);
    else snprintf(dir, sizeof(dir), ".");
    if (stat(dir, &sb) != 0) return 0;
    id->dev = sb.st_dev;
    id->ino = sb.st_ino;
    snprintf(id->name, sizeof(id->name), "%s", slash ? slash + 1 : path);
    return 1;
}
/* The same for stdin and stdout: a redirect to a regular file is that file
 * (`< t`, `>> t`); a terminal or a pipe is nothing to clobber (2), a closed
 * descriptor nothing at all (0). */
static int cli_file_id_of_fd(int fd, cli_file_id *id) {
    struct stat sb;
    memset(id, 0, sizeof(*id));
    if (fstat(fd, &sb) != 0) return 0;
    id->dev = sb.st_dev;
    id->ino = sb.st_ino;
    return S_ISREG(sb.st_mode) ? 1 : 2;
}

/* No output may overwrite an input, and no two outputs may share a file (the
 * run would garble both, or destroy the checkpoint it reads). stdin counts as
 * an input and stdout as an output whenever they are regular files, read or
 * not: `--dump-tokens t < t` would empty t before a chat could read it, and
 * `--dump-tokens o > o` interleaves two streams in one file. Checked before
 * anything is opened for writing. Returns 1 when the paths are fine. */
/* (A named type: nvcc's C++ front end rejects the size of an array of an
 * unnamed local struct in a constant expression, as NF below.) */
typedef struct { const char *flag, *path; int output; } cli_path;
static int cli_check_files(const kvt_cli *a) {
    cli_path f[] = {
        {"stdin", "(redirected with <)", 0},     {"-m", a->random ? NULL : a->model, 0},  {"-z", a->random ? NULL : a->tokenizer, 0},
        {"--prompts", a->prompts, 0},            {"--ppl", a->ppl, 0},
        {"--dump-logits", a->dump_logits, 1},    {"--dump-tokens", a->dump_tokens, 1},
        {"--trace", a->trace && a->trace[0] ? a->trace : NULL, 1}, {"--csv", a->csv, 1},
        {"--dump-attn", a->dump_attn, 1},        {"--serve", a->serve, 0},
        {"--serve-log", a->serve_log, 1},        {"--serve-text", a->serve_text, 1},
        {"stdout", "(redirected with > or >>)", 1},
    };
    enum { NF = sizeof(f) / sizeof(f[0]) };
    cli_file_id id[NF];
    int kind[NF];
    for (int i = 0; i < NF; i++) {
        int fd = !strcmp(f[i].flag, "stdin") ? 0 : !strcmp(f[i].flag, "stdout") ? 1 : -1;
        kind[i] = fd >= 0 ? cli_file_id_of_fd(fd, &id[i]) : f[i].path ? cli_file_id_of(f[i].path, &id[i]) : 0;
    }
    for (int j = 0; j < NF; j++) { /* each output against every file before it */
        if (!f[j].output || kind[j] != 1) continue;
        for (int i = 0; i < j; i++) {
            if (kind[i] != 1 || id[i].dev != id[j].dev || id[i].ino != id[j].ino || strcmp(id[i].name, id[j].name))
                continue;
            char ni[4200], nj[4200]; /* "-m 'x.bin'", or "stdin (redirected with <)" */
            snprintf(ni, sizeof(ni), f[i].flag[0] != '-' ? "%s %s" : "%s '%s'", f[i].flag, f[i].path);
            snprintf(nj, sizeof(nj), f[j].flag[0] != '-' ? "%s %s" : "%s '%s'", f[j].flag, f[j].path);
            if (f[i].output)
                kvt_fail(KVT_EARG, "%s and %s are the same file: give each output a file of its own", ni, nj);
            else
                kvt_fail(KVT_EARG, "%s is the same file as the input %s: refusing to overwrite an input", nj, ni);
            return 0;
        }
    }
    return 1;
}

/* Close an output and say whether all that was written reached it: an error
 * of an earlier write (ferror) or of the last one (fclose writes what is still
 * buffered: a full disk, /dev/full) is one line naming the flag and the file.
 * Returns st, or the write error when st was KVT_OK. */
static kvt_status cli_close(FILE *f, const char *flag, const char *path, kvt_status st) {
    if (!f) return st;
    int bad = ferror(f);
    errno = 0;
    bad |= fclose(f) != 0;
    if (bad && st == KVT_OK)
        st = kvt_fail(KVT_EIO, "%s: writing '%s' failed: %s", flag, path, errno ? strerror(errno) : "a write error");
    return st;
}

/* --stats: what the cache holds (kvt_cache_usage_of), what sharing saved,
 * and the time split between prefill (many rows per call) and decode. */
static void print_stats(kvt_engine *e, const kvt_seq *const *seqs, int n_seqs) {
    kvt_pool *p = &e->pool;
    if (!e->gpu) kvt_blas_note();
    kvt_cache_usage u;
    kvt_cache_usage_of(e, seqs, n_seqs, &u);
    fprintf(stderr, "[stats] device %s | attention %s%s | kv cache %s, %s, CH %d\n", e->gpu ? kvt_gpu_name() : "cpu",
            e->o.attn == KVT_ATTN_NAIVE ? "naive" : "fused",
            e->o.plain ? " | plain (the file's own ops: no tuned loops; slower)" : "",
            e->o.kv_cache ? "on" : "off (recomputed every step)",
            kvt_dtype_name(p->dtype), p->CH);
    fprintf(stderr, "[stats] bits per cached value %.2f%s; chunk %.0f bytes; pool %.0f bytes\n", u.bits_per_value,
            p->dtype == KVT_INT8 ? " (8 + 32/G for the fp32 scale)" : "", (double)p->chunk_elems * u.bits_per_value / 8,
            (double)p->chunk_elems * u.bits_per_value / 8 * p->n_chunks);
    fprintf(stderr, "[stats] chunks in use %d, peak %d, capacity %d; cache bytes in use %.0f\n", u.chunks_used,
            p->peak_used, p->n_chunks, u.bytes_used);
    fprintf(stderr, "[stats] %d sequence(s); slots allocated %ld, unused %ld (%.1f%% waste)\n", n_seqs,
            u.slots_allocated, u.slots_unused, u.slots_allocated ? 100.0 * u.slots_unused / u.slots_allocated : 0.0);
    if (n_seqs > 1 || p->shared_hits || p->prefix_hits)
        fprintf(stderr, "[stats] sharing: %ld chunk(s) shared by fork, %ld copy-on-write copies, prefix hits %ld / "
                "misses %ld; %.0f bytes vs %.0f without sharing (%.1f%% saved)\n", p->shared_hits, p->cow_copies,
                p->prefix_hits, p->prefix_misses, u.bytes_used, u.bytes_unshared,
                u.bytes_unshared > 0 ? 100.0 * (1.0 - u.bytes_used / u.bytes_unshared) : 0.0);
    /* with the cache off every call after the first runs the whole history
     * again as one many-row call: those rows are recomputation, not prompt */
    if (e->n_prefill && !e->o.kv_cache)
        fprintf(stderr, "[stats] recomputed rows %ld in %.2f ms (%.1f rows/s): with the cache off each step runs "
                "the whole history again\n", e->n_prefill, 1e3 * e->t_prefill, (double)e->n_prefill / e->t_prefill);
    else if (e->n_prefill)
        fprintf(stderr, "[stats] prefill %ld tokens in %.2f ms (%.1f tokens/s)\n", e->n_prefill, 1e3 * e->t_prefill,
                (double)e->n_prefill / e->t_prefill);
    if (e->n_decode)
        fprintf(stderr, "[stats] decode %ld tokens in %.2f ms (%.1f tokens/s)\n", e->n_decode, 1e3 * e->t_decode,
                (double)e->n_decode / e->t_decode);
}

/* --trace: the cache after each change a run makes to it (a forward call, the
 * forks): a header line naming the change, then every live sequence's chunk
 * table, the pool and the totals (kvt_pool_print, §15). It writes to its own
 * stream (stderr or a file), so the generated text on stdout is the same with
 * or without it. First the legend, or, with the cache off, the one line that
 * says there is no pool to show (and then nothing per step). */
static void trace_start(FILE *f, kvt_engine *e) {
    if (!f) return;
    if (e->o.kv_cache) kvt_pool_legend(f);
    else kvt_pool_print(f, e);
}
/* A trace that cannot be written (a full disk) stops the run at once, with
 * the reason of the write that failed. */
static kvt_status trace_step(const kvt_cli *a, kvt_engine *e, const char *fmt, ...) {
    FILE *f = a->tracef;
    if (!f || !e->o.kv_cache) return KVT_OK;
    va_list ap;
    fprintf(f, "== ");
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fprintf(f, "\n");
    kvt_pool_print(f, e);
    if (!ferror(f)) return KVT_OK;
    return kvt_fail(KVT_EIO, "--trace: writing '%s' failed: %s", a->trace[0] ? a->trace : "(stderr)", strerror(errno));
}
/* The ids of a batch's sequences, for a trace header: "0, 1, 2" (or a count). */
static void trace_ids(char *buf, size_t cap, kvt_seq *const *batch, int nb) {
    size_t k = 0;
    buf[0] = '\0';
    if (nb > 16) { snprintf(buf, cap, "%d sequences", nb); return; }
    for (int j = 0; j < nb && k < cap; j++)
        k += (size_t)snprintf(buf + k, cap - k, j ? ", %d" : "seq %d", batch[j]->id);
}

/* Teacher-forced mean negative log-likelihood of a text, in windows of TMAX
 * positions: [BOS, c0 .. c(W-2)] predicts c0 .. c(W-1), W = TMAX - 1 chars.
 * A tokenizer that puts no BOS first (SmolLM2's) starts each window with its
 * document separator <|endoftext|>, as GPT-2-style models are evaluated. */
/* The NLL of token j is logsumexp(logits_j) - logits_j[target], computed in
 * double from the fp32 logits. The windows match weights/train.py's held-out
 * evaluation exactly, so the two numbers can be compared to 1e-3 nats. The
 * prefill runs with the cache (pieces of max_rows rows attend to the cached
 * earlier pieces), so a quantized cache changes the result: that is what
 * --ppl measures for --kv-dtype. */
static kvt_status run_ppl(kvt_engine *e, kvt_tokenizer *tk, const char *path, double from) {
    int V = e->m->c.vocab_size, W = e->m->c.seq_len - 1;
    if (W < 1)
        return kvt_fail(KVT_ECONTEXT, "--ppl needs TMAX >= 2 (a window is BOS, then the tokens it predicts); this model "
                        "has TMAX = %d", W + 1);
    char *text;
    size_t size;
    kvt_status st = kvt_read_file(path, "--ppl file", &text, &size);
    if (st != KVT_OK) return st;
    size_t start = (size_t)(from * (double)size), len = size - start;
    if (len > (size_t)INT_MAX - 3) { free(text); return kvt_fail(KVT_EARG, "--ppl '%s': %zu bytes, more than this "
                                                                   "program scores at once (2^31)", path, len); }
    int first = tk->bos_id >= 0 ? tk->bos_id : kvt_piece_id(tk, "<|endoftext|>"), bl = tk->pre_tokenizer != KVT_PRE_NONE;
    if (first < 0) {
        free(text);
        return kvt_fail(KVT_EARG, "--ppl: the tokenizer puts no BOS first and has no <|endoftext|> to start a window");
    }
    long line = 1; /* the file's line number of text[i], for error messages */
    for (size_t i = 0; i < start; i++) line += text[i] == '\n';
    int *ids = (int *)kvt_malloc((len + 3) * sizeof(int)), n = 0;
    /* Line by line, so no merge spans a newline; not for speed: merging is
     * O(n log n) (§16), and a file that is one long line encodes as fast. A
     * byte-level tokenizer takes the whole text at once, as Hugging Face's
     * does: its pre-tokenizer keeps a run of spaces and newlines together. */
    for (size_t i = start; i < size && st == KVT_OK; line++) {
        size_t j = i;
        while (j < size && (bl || text[j] != '\n')) j++;
        if (j < size) j++;
        st = encode_piece(tk, text + i, j - i, i == start && tk->dummy_prefix, ids, &n);
        if (st != KVT_OK) {
            char msg[sizeof(kvt_errbuf)];
            snprintf(msg, sizeof(msg), "%s", kvt_errbuf);
            if (bl) kvt_fail(st, "--ppl '%s': %s", path, msg);
            else kvt_fail(st, "--ppl '%s' line %ld: %s", path, line, msg);
        }
        i = j;
    }
    free(text);
    if (st == KVT_OK && n == 0)
        st = kvt_fail(KVT_EARG, "--ppl '%s'%s: no text to score (0 tokens)", path, from > 0 ? " from --ppl-from" : "");
    if (st != KVT_OK) { free(ids); return st; }
    float *logits = NULL; /* (TMAX, V): every position's logits of one window */
    size_t logit_bytes;
    st = kvt_bytes(&logit_bytes, "--ppl's logits (TMAX x V)", (size_t)W + 1, (size_t)V, sizeof(float), 1);
    if (st == KVT_OK) st = buf_alloc(0, (void **)&logits, logit_bytes, "--ppl's logits (TMAX x V)");
    int *win = (int *)kvt_malloc((size_t)(W + 1) * sizeof(int));
    kvt_seq s;
    memset(&s, 0, sizeof(s)); /* freeing a zeroed sequence is a no-op */
    if (st == KVT_OK) st = kvt_seq_init(e, &s);
    double nll = 0.0;
    long count = 0;
    for (int w0 = 0; w0 < n && st == KVT_OK; w0 += W) {
        int wl = n - w0 < W ? n - w0 : W;
        win[0] = first;
        memcpy(win + 1, ids + w0, (size_t)(wl - 1) * sizeof(int));
        kvt_seq_reset(e, &s);
        st = kvt_forward(e, &s, win, wl, logits, 1);
        long bad = st == KVT_OK ? kvt_first_nonfinite(logits, (size_t)wl * V) : -1;
        if (bad >= 0)
            st = kvt_fail(KVT_EFORMAT, "--ppl: the logits at token %ld are not finite (%g): NaN or Inf in the weights?",
                          w0 + bad / V, logits[bad]);
        for (int j = 0; j < wl && st == KVT_OK; j++) {
            const float *lj = logits + (size_t)j * V;
            double mx = -INFINITY, z = 0.0;
            for (int v = 0; v < V; v++) mx = fmax(mx, (double)lj[v]);
            for (int v = 0; v < V; v++) z += exp((double)lj[v] - mx);
            nll += mx + log(z) - (double)lj[ids[w0 + j]];
            count++;
        }
    }
    kvt_seq_free(e, &s);
    if (st == KVT_OK) {
        printf("ppl: %s from %.3f: %ld tokens, mean NLL %.6f nats/token, perplexity %.4f\n", path, from, count,
               nll / (double)count, exp(nll / (double)count));
    }
    free(ids);
    free(logits);
    free(win);
    return st;
}

/* Print a token: as text when there is a tokenizer, else as its id. A lone
 * control byte (below 32, other than newline and tab) is skipped so the
 * terminal is not confused. Bytes 0x80-0xFF are printed: they are the parts of
 * a UTF-8 character (byte-fallback pieces <0xC3><0xA9> give "é" together). */
static void print_token(const kvt_tokenizer *tk, int prev, int tok) {
    if (!tk) { printf("%d ", tok); return; }
    if (tok == tk->bos_id || tok == tk->eos_id) return; /* markers, not text */
    const char *piece = kvt_decode(tk, prev, tok);
    unsigned char b = (unsigned char)piece[0];
    if (b && !piece[1] && b < 32 && b != '\n' && b != '\t') return;
    printf("%s", piece);
}

/* Write s for a terminal: a control byte (below 32, or 127) or a byte that is
 * not part of a well-formed UTF-8 character is written as \xNN, so a message
 * that quotes a file's bytes ("character '\xff'", a name holding ESC [2J)
 * cannot clear or recolour the screen. Well-formed UTF-8 ("é") is kept. */
static void put_escaped(FILE *f, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int len = *p < 0x80 ? 1 : (*p & 0xE0) == 0xC0 && *p >= 0xC2 ? 2 : (*p & 0xF0) == 0xE0 ? 3
                : (*p & 0xF8) == 0xF0 && *p <= 0xF4 ? 4 : 0;
        for (int i = 1; i < len; i++)
            if ((p[i] & 0xC0) != 0x80) len = 0; /* a cut or malformed sequence (a NUL stops here too) */
        if (len == 1 && (*p < 32 || *p == 127)) len = 0;
        if (len == 0) { fprintf(f, "\\x%02x", *p++); continue; }
        fwrite(p, 1, (size_t)len, f);
        p += len;
    }
}
/* The one way the CLI reports a failure: the library's message on stderr. */
static int cli_fail(const char *what) {
    fputs("kvt: ", stderr);
    put_escaped(stderr, what ? what : "");
    put_escaped(stderr, kvt_errbuf);
    fputc('\n', stderr);
    return 1;
}

/* --tokens 1,403,407: the prompt as token ids, for any model (a checkpoint's
 * own tokenizer is not needed), each checked against the vocabulary. One
 * rule: ids are decimal digits (no sign), separated by commas, with any
 * spaces around an id; "1, 22 ,56" is [1, 22, 56], and "", "1,,2", "+5", "-0"
 * are errors. An id too large for any vocabulary is out of range, like 70000
 * for a vocabulary of 32000. */
static kvt_status parse_tokens(const char *s, int V, int TMAX, int *out, int *n) {
    *n = 0;
    for (const char *p = s;; p++) {
        while (*p == ' ') p++;
        const char *digits = p;
        long id = 0;
        for (; *p >= '0' && *p <= '9'; p++) id = id > INT_MAX ? id : id * 10 + (*p - '0'); /* saturates */
        int len = (int)(p - digits);
        while (*p == ' ') p++;
        if (len == 0 || (*p && *p != ','))
            return kvt_fail(KVT_EARG, "--tokens '%s': item %d is not a token id (give ids of decimal digits, "
                            "separated by commas)", s, *n + 1);
        if (id >= V)
            return kvt_fail(KVT_EARG, "--tokens: id %.*s (item %d) is out of range [0, %d]: this model's vocab_size "
                            "is %d", len, digits, *n + 1, V - 1, V);
        if (*n == TMAX) return kvt_fail(KVT_ECONTEXT, "--tokens: more than TMAX = %d ids", TMAX);
        out[(*n)++] = (int)id;
        if (!*p) return KVT_OK;
    }
}

/* --dump-attn, the engine's probe (kvt_options.attn_probe, §15): one CSV line
 * per weight, for each row at a position not written yet (with --kv-cache off
 * every step recomputes the earlier rows, whose weights are in the file
 * already). w (n, NH, TMAX): row r, head h attends to keys 0..pos[r]. After
 * a failed write nothing more is written; the runner stops at its next check
 * (cli_outputs_ok). */
static void attn_dump_rows(void *ctx, int layer, int n, const int *pos, const float *w, int NH, int TMAX) {
    kvt_cli *a = (kvt_cli *)ctx;
    for (int r = 0; r < n && !a->attn_errno; r++) {
        if (pos[r] < a->attn_next) continue;
        for (int h = 0; h < NH; h++) {
            const float *wr = w + ((size_t)r * NH + h) * TMAX;
            for (int t = 0; t <= pos[r]; t++)
                if (fprintf(a->attnf, "%d,%d,%d,%d,%.9g\n", pos[r], layer, h, t, wr[t]) < 0) {
                    a->attn_errno = errno ? errno : EIO;
                    return;
                }
        }
    }
}
/* --dump-attn's size, refused before anything is opened: N positions (0: a
 * chat, which may fill the context) write layers x heads x N (N + 1) / 2
 * lines, each about 2 x digits(N) + 18 bytes (query and key, layer, head,
 * commas, a weight printed with %.9g, its line end). */
static int attn_dump_too_big(const kvt_cli *a, const kvt_config *c, int N) {
    int room = a->o.n_chunks > 0 && (long)a->o.n_chunks * a->o.CH < c->seq_len ? a->o.n_chunks * a->o.CH : c->seq_len;
    if (N <= 0 || N > room) N = room;
    int digits = 1;
    for (int x = N; x >= 10; x /= 10) digits++;
    int layers = a->dump_attn_layer >= 0 ? 1 : c->n_layers;
    double lines = (double)layers * c->n_heads * (double)N * (N + 1) / 2;
    double mb = lines * (2 * digits + 18) / 1e6;
    if (mb <= a->dump_attn_max) return 0;
    kvt_fail(KVT_EARG, "--dump-attn: up to %.3g lines, about %.0f MB (%d layer%s x %d heads x N (N + 1) / 2 weights, "
             "N = %d positions%s), more than --dump-attn-max %d MB: raise it, or give --dump-attn-layer L or fewer "
             "positions", lines, mb, layers, layers > 1 ? "s" : "", c->n_heads, N,
             a->chat ? ": a chat may fill the context" : "", a->dump_attn_max);
    return 1;
}
/* The runners check their outputs after every token and stop at the first
 * failed write, with its reason: standard output (a full disk, /dev/full, or
 * a reader that left: main ignores SIGPIPE, so `| head` is a write error like
 * any other, and the dump files are still written and closed) and
 * --dump-attn. */
static kvt_status cli_outputs_ok(kvt_cli *a) {
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout))
        return kvt_fail(KVT_EIO, "writing standard output failed: %s", errno ? strerror(errno) : "a write error");
    if (a->attn_errno)
        return kvt_fail(KVT_EIO, "--dump-attn: writing '%s' failed: %s", a->dump_attn, strerror(a->attn_errno));
    return KVT_OK;
}

/* One sequence: prefill the prompt, then sample -n tokens, printing as we go.
 * With --check a CPU engine runs the same steps and every step's logits are
 * compared. */
static int run_single(kvt_engine *e, kvt_model *m, const kvt_tokenizer *tk, kvt_cli *a, const int *prompt, int np) {
    /* hist holds the whole sequence so far: kvt_step feeds what the cache lacks
     * (everything after a reset when the cache is off, else the newest token). */
    int V = m->c.vocab_size, TMAX = m->c.seq_len, ok = 1, stop = -1; /* stop: a BOS/EOS that ended the run */
    kvt_engine *ref = NULL;
    kvt_status st = KVT_OK;
    if (a->check) { /* the reference: the same options on the CPU */
        kvt_options ro = e->o;
        ro.device = KVT_CPU;
        ro.attn_probe = NULL; /* --dump-attn records the run itself, not its reference */
        if (!e->gpu) {
            kvt_fail(KVT_EARG, "--check compares the GPU path with the CPU: add --device gpu (needs a CUDA device, "
                     "or the C build, which emulates the kernels)");
            return cli_fail("");
        }
        if ((st = kvt_engine_create(&ref, m, &ro)) != KVT_OK) return cli_fail("");
        fprintf(stderr, "[check] %s against the CPU reference, tolerance KVT_TOL_GPU = %.0e\n", kvt_gpu_name(), KVT_TOL_GPU);
    }
    /* --dump-logits / --dump-tokens: opened before anything runs, so a path
     * that cannot be written is reported first */
    FILE *dl = NULL, *dt = NULL;
    if (a->dump_logits && !(dl = fopen(a->dump_logits, "wb")))
        st = kvt_fail(KVT_EIO, "--dump-logits: cannot write '%s': %s", a->dump_logits, strerror(errno));
    if (st == KVT_OK && a->dump_tokens && !(dt = fopen(a->dump_tokens, "w")))
        st = kvt_fail(KVT_EIO, "--dump-tokens: cannot write '%s': %s", a->dump_tokens, strerror(errno));
    if (st != KVT_OK) {
        if (dl) fclose(dl);
        kvt_engine_free(ref);
        return cli_fail("");
    }
    int *hist = (int *)kvt_malloc((size_t)TMAX * sizeof(int));
    float *logits = (float *)kvt_malloc((size_t)V * sizeof(float)), *ref_logits = (float *)kvt_malloc((size_t)V * sizeof(float));
    memcpy(hist, prompt, (size_t)np * sizeof(int));
    kvt_sampler sm;
    kvt_sampler_init(&sm, V, (float)a->temperature, (float)a->topp, (uint64_t)a->seed);
    kvt_seq s, rs;
    kvt_seq_init(e, &s);
    if (ref) kvt_seq_init(ref, &rs);
    for (int i = 0; i < np; i++) print_token(tk, i ? hist[i - 1] : -1, hist[i]);
    st = cli_outputs_ok(a);
    int n = np, fed = 0, n_gen = 0; /* fed: the prompt's forward ran; n_gen: steps after it */
    double t_gen = 0.0;              /* their time: what one more generated token costs */
    /* -n 0 with --dump-logits or --dump-attn still runs the prompt: its rows are the dump */
    while (st == KVT_OK && (n < np + a->steps || ((dl || a->attnf) && !fed))) {
        fed = 1;
        a->attn_next = n == np ? 0 : n - 1; /* --dump-attn: the rows this forward adds (cache off recomputes the rest) */
        if (dl && n == np) { /* the prompt's forward keeps every position's logits for the dump */
            float *all = NULL;
            size_t bytes;
            st = kvt_bytes(&bytes, "--dump-logits' prompt rows (prompt x V)", (size_t)np, (size_t)V, sizeof(float), 1);
            if (st == KVT_OK) st = buf_alloc(0, (void **)&all, bytes, "--dump-logits' prompt rows (prompt x V)");
            if (st == KVT_OK) st = kvt_forward(e, &s, hist, np, all, 1);
            if (st == KVT_OK && fwrite(all, sizeof(float), (size_t)np * V, dl) != (size_t)np * V)
                st = kvt_fail(KVT_EIO, "--dump-logits: writing '%s' failed: %s", a->dump_logits, strerror(errno));
            if (st == KVT_OK) memcpy(logits, all + (size_t)(np - 1) * V, (size_t)V * sizeof(float));
            free(all);
        } else {
            double t0 = kvt_now();
            st = kvt_step(e, &s, hist, n, logits);
            if (n > np) { t_gen += kvt_now() - t0; n_gen++; }
            if (st == KVT_OK && dl && fwrite(logits, sizeof(float), (size_t)V, dl) != (size_t)V)
                st = kvt_fail(KVT_EIO, "--dump-logits: writing '%s' failed: %s", a->dump_logits, strerror(errno));
        }
        if (st == KVT_OK && n == np) st = trace_step(a, e, "after prefill: seq %d, %d tokens", s.id, np);
        else if (st == KVT_OK)
            st = trace_step(a, e, "after decode step %d: seq %d, position %d", n - np, s.id, n - 1);
        if (st == KVT_OK && ref) {
            if ((st = kvt_step(ref, &rs, hist, n, ref_logits)) != KVT_OK) break;
            char what[64];
            snprintf(what, sizeof(what), "--check step %d logits, gpu vs cpu", n - np);
            ok &= kvt_check_to(stderr, what, logits, ref_logits, V, "vocab=1000000000", KVT_TOL_GPU, "KVT_TOL_GPU");
        }
        if (st != KVT_OK) break;
        long bad = kvt_first_nonfinite(logits, (size_t)V);
        if (bad >= 0) {
            st = kvt_fail(KVT_EFORMAT, "step %d (position %d): logit %ld is %g, not a finite number: NaN or Inf in the "
                          "weights?", n - np, n - 1, bad, logits[bad]);
            break;
        }
        if (n == np + a->steps) break; /* -n 0: the prompt's logits were all that was asked */
        int next = kvt_sample(&sm, logits, V);
        if (tk && (next == tk->bos_id || next == tk->eos_id)) { stop = next; break; }
        print_token(tk, hist[n - 1], next);
        hist[n++] = next;
        if ((st = cli_outputs_ok(a)) != KVT_OK) break;
    }
    printf("\n");
    if (stop >= 0 && n == np) { /* nothing printed: say why */
        fputs("kvt: the model's first token was its end marker '", stderr);
        put_escaped(stderr, tk->vocab[stop]);
        fprintf(stderr, "' (id %d), so there is no text; an instruct model answers in --chat\n", stop);
    }
    if (dt) { /* the ids fed, then the last chosen (which was not fed) */
        for (int i = 0; i < n; i++) fprintf(dt, "%d\n", hist[i]);
        if (stop >= 0) fprintf(dt, "%d\n", stop);
    }
    st = cli_close(dl, "--dump-logits", a->dump_logits, st);
    st = cli_close(dt, "--dump-tokens", a->dump_tokens, st);
    if (st != KVT_OK) ok = !cli_fail("");
    const kvt_seq *live = &s;
    if (st == KVT_OK && a->stats) print_stats(e, &live, 1);
    if (st == KVT_OK && a->stats && n_gen) /* the line to compare with --kv-cache off */
        fprintf(stderr, "[stats] per generated token: %.3f ms (%.1f tokens/s) over %d steps after the prompt; %s\n",
                1e3 * t_gen / n_gen, n_gen / t_gen, n_gen, e->o.kv_cache ? "each step computes 1 position, the rest "
                "is read from the cache" : "cache off: each step recomputes every position so far");
    if (ref && st == KVT_OK)
        fprintf(stderr, "%s --check: %d steps, GPU logits %s the CPU reference within KVT_TOL_GPU = %.0e\n",
                ok ? "PASS" : "FAIL", n - np, ok ? "match" : "do NOT match", KVT_TOL_GPU);
    kvt_seq_free(e, &s);
    if (ref) { kvt_seq_free(ref, &rs); kvt_engine_free(ref); }
    kvt_sampler_free(&sm);
    free(hist);
    free(logits);
    free(ref_logits);
    return ok ? 0 : 1;
}

/* Several sequences decoded as one batch: --prompts (one prompt per line) or
 * --fork N (N continuations of one prompt, seeds seed, seed+1, ...). Each
 * prompt is prefilled on its own (reusing cached prefixes), then every step
 * samples one token per sequence and one kvt_forward_batch call runs them all. */
static int run_batch(kvt_engine *e, kvt_model *m, const kvt_tokenizer *tk, kvt_cli *a, int **prompts, const int *np,
                     int n_seqs) {
    int V = m->c.vocab_size, TMAX = m->c.seq_len, fork = a->fork > 1;
    /* The large buffers first, sized with overflow checks (n_seqs x TMAX tokens,
     * twice n_seqs x V logits): one that cannot be had is reported before
     * anything else is taken. */
    int *hist = NULL;
    float *logits = NULL, *blog = NULL;
    size_t hist_bytes, logit_bytes;
    kvt_status st = kvt_bytes(&hist_bytes, "the sequences' tokens (n_seqs x TMAX)", (size_t)n_seqs, (size_t)TMAX,
                              sizeof(int), 1);
    if (st == KVT_OK) st = kvt_bytes(&logit_bytes, "the batch's logits (n_seqs x V)", (size_t)n_seqs, (size_t)V, sizeof(float), 1);
    if (st == KVT_OK) st = buf_alloc(0, (void **)&hist, hist_bytes, "the sequences' tokens (n_seqs x TMAX)");
    if (st == KVT_OK) st = buf_alloc(0, (void **)&logits, logit_bytes, "the batch's logits (n_seqs x V)");
    if (st == KVT_OK) st = buf_alloc(0, (void **)&blog, logit_bytes, "the batch's logits (n_seqs x V)");
    if (st != KVT_OK) { free(hist); free(logits); free(blog); return cli_fail(""); }
    kvt_seq *seqs = (kvt_seq *)calloc((size_t)n_seqs, sizeof(kvt_seq));
    kvt_seq **batch = (kvt_seq **)kvt_malloc((size_t)n_seqs * sizeof(kvt_seq *));
    kvt_sampler *sm = (kvt_sampler *)calloc((size_t)n_seqs, sizeof(kvt_sampler)); /* zeroed: safe to free early */
    int *len = (int *)kvt_malloc((size_t)n_seqs * sizeof(int));
    int *next = (int *)kvt_malloc((size_t)n_seqs * sizeof(int)), *ones = (int *)kvt_malloc((size_t)n_seqs * sizeof(int));
    int *active = (int *)kvt_malloc((size_t)n_seqs * sizeof(int));
    KVT_ASSERT(seqs && sm);
    double t0 = kvt_now();
    /* Prefill. With --fork only sequence 0 computes the prompt; the others are
     * forks of it, so they share its chunks and start from its logits. */
    for (int i = 0; i < n_seqs && st == KVT_OK; i++) {
        kvt_sampler_init(&sm[i], V, (float)a->temperature, (float)a->topp, (uint64_t)(a->seed + i));
        memcpy(hist + (size_t)i * TMAX, prompts[fork ? 0 : i], (size_t)np[fork ? 0 : i] * sizeof(int));
        len[i] = np[fork ? 0 : i];
        active[i] = 1;
        ones[i] = 1;
        if (fork && i > 0 && a->fork_share) { /* share the prompt's chunks; same first logits */
            st = kvt_seq_fork(e, &seqs[i], &seqs[0]);
            memcpy(logits + (size_t)i * V, logits, (size_t)V * sizeof(float));
        } else {
            st = kvt_seq_init(e, &seqs[i]);
            if (st == KVT_OK) /* its own prompt, or (--fork-share off) its own copy of the prompt */
                st = kvt_forward(e, &seqs[i], hist + (size_t)i * TMAX, len[i], logits + (size_t)i * V, 0);
            int found = 0; /* positions attached by prefix reuse, not computed */
            for (int j = 0; st == KVT_OK && j < seqs[i].n_table; j++) found += seqs[i].how[j] == '+' ? e->pool.CH : 0;
            if (st == KVT_OK && found)
                st = trace_step(a, e, "after prefill: seq %d, %d tokens, the first %d found cached (prefix reuse)",
                                seqs[i].id, len[i], found);
            else if (st == KVT_OK) st = trace_step(a, e, "after prefill: seq %d, %d tokens", seqs[i].id, len[i]);
        }
    }
    if (st == KVT_OK && fork && a->fork_share)
        st = trace_step(a, e, "after fork: %d more sequences share seq %d's %d chunks", n_seqs - 1, seqs[0].id,
                        seqs[0].n_table);
    /* Decode. Each step samples one token per live sequence (each with its own
     * sampler and seed), then runs all of them as one batch. A sequence that
     * samples BOS/EOS stops; the batch just gets smaller. After the last
     * sample there is nothing left to run. */
    for (int step = 0; step < a->steps && st == KVT_OK; step++) {
        int nb = 0;
        for (int i = 0; i < n_seqs && st == KVT_OK; i++) {
            long bad = active[i] ? kvt_first_nonfinite(logits + (size_t)i * V, (size_t)V) : -1;
            if (bad >= 0)
                st = kvt_fail(KVT_EFORMAT, "step %d, sequence %d: logit %ld is %g, not a finite number: NaN or Inf in "
                              "the weights?", step, i, bad, logits[(size_t)i * V + bad]);
        }
        if (st != KVT_OK) break;
        for (int i = 0; i < n_seqs; i++) {
            if (!active[i]) continue;
            int t = kvt_sample(&sm[i], logits + (size_t)i * V, V);
            if (tk && (t == tk->bos_id || t == tk->eos_id)) { active[i] = 0; continue; }
            hist[(size_t)i * TMAX + len[i]++] = t;
            if (step + 1 < a->steps) { batch[nb] = &seqs[i]; next[nb++] = t; }
        }
        if (nb == 0) continue;
        st = kvt_forward_batch(e, batch, nb, next, ones, blog);
        if (st == KVT_OK && a->tracef) {
            char ids[160];
            trace_ids(ids, sizeof(ids), batch, nb);
            st = trace_step(a, e, "after decode step %d: one token each for %s", step + 1, ids);
        }
        for (int i = 0, j = 0; i < n_seqs && st == KVT_OK; i++) /* scatter the batch's logits back */
            if (j < nb && batch[j] == &seqs[i]) memcpy(logits + (size_t)i * V, blog + (size_t)j++ * V, (size_t)V * sizeof(float));
    }
    double dt = kvt_now() - t0;
    for (int i = 0; i < n_seqs; i++) {
        printf("--- sequence %d (seed %ld) ---\n", i, a->seed + i);
        for (int j = 0; j < len[i]; j++) print_token(tk, j ? hist[(size_t)i * TMAX + j - 1] : -1, hist[(size_t)i * TMAX + j]);
        printf("\n");
    }
    int rc = st == KVT_OK ? 0 : cli_fail("");
    if (a->stats) {
        for (int i = 0; i < n_seqs; i++) batch[i] = &seqs[i]; /* all of them, for the figures */
        print_stats(e, (const kvt_seq *const *)batch, n_seqs);
        fprintf(stderr, "[stats] %d sequences, wall time %.1f ms (prefill, decode and sampling)\n", n_seqs, 1e3 * dt);
    }
    for (int i = 0; i < n_seqs; i++) { kvt_seq_free(e, &seqs[i]); kvt_sampler_free(&sm[i]); }
    free(seqs); free(batch); free(sm); free(hist); free(len); free(next); free(ones); free(active); free(logits); free(blog);
    return rc;
}

/* ---- --chat: a conversation whose cache is kept --------------------------------
 * Every turn (a line of standard input; the first may be -i) is wrapped by the
 * template and appended to one transcript, which one sequence holds. Only
 * what the cache lacks runs: the turn's own tokens (one prefill), then the
 * reply, one token a step. Earlier turns and replies are read from the cache,
 * never computed again:
 *
 *   transcript  [ turn 1 . reply 1 | turn 2 . reply 2 | turn 3 . reply 3 | ...
 *   computed    [ in turn 1        ] [ in turn 2      ] [ in turn 3      ]
 *
 * With --kv-cache off each forward call recomputes the whole transcript, so a
 * turn costs more the longer the conversation; --stats prints both sides. */
#include <unistd.h> /* isatty: a terminal gets a "User: " prompt, a pipe an echo of each turn; STDOUT_FILENO */

/* The transcript, and how far each output has got in it. */
typedef struct {
    int tpl;       /* enum chat_tpl */
    int bos, eos;  /* the template's markers, looked up: "<s>" and "</s>" (llama2, zephyr), "<|im_start|>" and
                      "<|im_end|>" (chatml); plain: the tokenizer's BOS and EOS ids */
    int room;      /* positions the conversation may fill: TMAX, or less when --chunks makes the pool smaller */
    int *hist, n;  /* (room) the transcript's token ids, and its length */
    int done;      /* positions computed at least once: their rows are in --dump-logits and --dump-attn */
    long computed; /* positions computed by all forward calls (--kv-cache off computes some many times) */
    int calls;     /* forward calls */
    FILE *dl;      /* --dump-logits, or NULL */
    const char *dl_path;
    float *rows;   /* (room, V) --dump-logits: every row of one forward call, or NULL */
} kvt_chat;

/* A marker's id: the piece spelled exactly so, or as llama2.c's tokenizer.bin
 * spells BOS and EOS ("\n<s>\n", "\n</s>\n"); -1 when the vocabulary has neither. */
static int chat_marker(const kvt_tokenizer *tk, const char *piece) {
    char alt[32];
    snprintf(alt, sizeof(alt), "\n%s\n", piece);
    int id = kvt_piece_id(tk, piece);
    return id >= 0 ? id : kvt_piece_id(tk, alt);
}

/* parts[0] + parts[1] + ... up to a NULL, in a new string. */
static char *chat_cat(const char *const *parts) {
    size_t len = 0, k = 0;
    for (int i = 0; parts[i]; i++) len += strlen(parts[i]);
    char *s = (char *)kvt_malloc(len + 1);
    for (int i = 0; parts[i]; i++) { memcpy(s + k, parts[i], strlen(parts[i])); k += strlen(parts[i]); }
    s[k] = '\0';
    return s;
}

/* Turn `turn`'s tokens (0 = the first): the user's text wrapped by the template,
 * in a new array *out of *n_out ids. sys is the system prompt (NULL or "": none).
 *   llama2, as llama2.c's chat mode builds it: each turn is encoded as a prompt,
 *     BOS then "[INST] <<SYS>>\n" sys "\n<</SYS>>\n\n" user " [/INST]" for the
 *     first turn with a system prompt, else BOS then "[INST] " user " [/INST]";
 *   zephyr (TinyLlama chat): BOS "<|system|>\n" sys EOS "\n<|user|>\n" user EOS
 *     "\n<|assistant|>\n" for the first turn (without sys: BOS "<|user|>\n" user
 *     EOS ...), then "\n<|user|>\n" user EOS "\n<|assistant|>\n";
 *   plain: BOS, sys "\n" (if any), user "\n" for the first turn, then user "\n";
 *   chatml (SmolLM2's template, BOS = <|im_start|>, EOS = <|im_end|>): BOS
 *     "system\n" sys EOS "\n" (first turn, if any), BOS "user\n" user EOS "\n"
 *     BOS "assistant\n"; later turns start with the "\n" that follows the
 *     reply's EOS.
 * BOS and EOS are the looked-up marker ids, never text. A reply ends where the
 * model samples EOS, which stays in the transcript (llama2.c feeds it too), or
 * where -n cuts it, left open as llama2.c leaves it. Sentencepiece's leading
 * space (a vocabulary with byte fallback, §16) goes where the text is
 * encoded as a prompt: every llama2 turn, the transcript's first text for the
 * others (text after a marker gets none). */
static kvt_status chat_render(const kvt_chat *c, const kvt_tokenizer *tk, int turn, const char *sys, const char *user,
                              int **out, int *n_out) {
    struct { int id; char *text; int lead; } seg[10]; /* a marker id, or text (id -1) */
    int ns = 0, first = turn == 0, lead = tk->dummy_prefix, has_sys = first && sys && sys[0];
    if (c->tpl == TPL_LLAMA2) {
        const char *with_sys[] = {"[INST] <<SYS>>\n", sys, "\n<</SYS>>\n\n", user, " [/INST]", NULL},
                   *plain[] = {"[INST] ", user, " [/INST]", NULL};
        seg[ns].id = c->bos, seg[ns++].text = NULL;
        seg[ns].id = -1, seg[ns].lead = lead, seg[ns++].text = chat_cat(has_sys ? with_sys : plain);
    } else if (c->tpl == TPL_ZEPHYR) {
        const char *system[] = {"<|system|>\n", sys, NULL}, *u[] = {first && !has_sys ? "<|user|>\n" : "\n<|user|>\n",
                                                                    user, NULL}, *asst[] = {"\n<|assistant|>\n", NULL};
        if (first) seg[ns].id = c->bos, seg[ns++].text = NULL;
        if (has_sys) {
            seg[ns].id = -1, seg[ns].lead = lead, seg[ns++].text = chat_cat(system);
            seg[ns].id = c->eos, seg[ns++].text = NULL;
        }
        seg[ns].id = -1, seg[ns].lead = first && !has_sys ? lead : 0, seg[ns++].text = chat_cat(u);
        seg[ns].id = c->eos, seg[ns++].text = NULL;
        seg[ns].id = -1, seg[ns].lead = 0, seg[ns++].text = chat_cat(asst);
    } else if (c->tpl == TPL_CHATML) { /* a byte-level vocabulary: no leading space anywhere */
        const char *system[] = {"system\n", sys, NULL}, *u[] = {"user\n", user, NULL}, *nl[] = {"\n", NULL},
                   *asst[] = {"assistant\n", NULL};
        if (!first) seg[ns].id = -1, seg[ns].lead = 0, seg[ns++].text = chat_cat(nl);
        if (has_sys) {
            seg[ns].id = c->bos, seg[ns++].text = NULL;
            seg[ns].id = -1, seg[ns].lead = 0, seg[ns++].text = chat_cat(system);
            seg[ns].id = c->eos, seg[ns++].text = NULL;
            seg[ns].id = -1, seg[ns].lead = 0, seg[ns++].text = chat_cat(nl);
        }
        seg[ns].id = c->bos, seg[ns++].text = NULL;
        seg[ns].id = -1, seg[ns].lead = 0, seg[ns++].text = chat_cat(u);
        seg[ns].id = c->eos, seg[ns++].text = NULL;
        seg[ns].id = -1, seg[ns].lead = 0, seg[ns++].text = chat_cat(nl);
        seg[ns].id = c->bos, seg[ns++].text = NULL;
        seg[ns].id = -1, seg[ns].lead = 0, seg[ns++].text = chat_cat(asst);
    } else {
        const char *system[] = {sys, "\n", NULL}, *u[] = {user, "\n", NULL};
        if (first && c->bos >= 0) seg[ns].id = c->bos, seg[ns++].text = NULL;
        if (has_sys) seg[ns].id = -1, seg[ns].lead = lead, seg[ns++].text = chat_cat(system);
        seg[ns].id = -1, seg[ns].lead = first && !has_sys ? lead : 0, seg[ns++].text = chat_cat(u);
    }
    size_t cap = 1; /* encode_piece needs room for one token per byte, plus the leading space */
    for (int i = 0; i < ns; i++) cap += seg[i].text ? strlen(seg[i].text) + 1 : 1;
    int *ids = (int *)kvt_malloc(cap * sizeof(int)), n = 0;
    kvt_status st = KVT_OK;
    for (int i = 0; i < ns; i++) {
        if (!seg[i].text) ids[n++] = seg[i].id;
        else if (st == KVT_OK) st = encode_piece(tk, seg[i].text, strlen(seg[i].text), seg[i].lead, ids, &n);
        free(seg[i].text);
    }
    if (st != KVT_OK) { free(ids); ids = NULL; n = 0; }
    *out = ids;
    *n_out = n;
    return st;
}

/* Run the transcript's positions the cache lacks (all of them with --kv-cache
 * off, which forgets everything first); the last one's logits go to logits.
 * --dump-logits gets the rows of positions not written yet, --dump-attn (its
 * probe, attn_dump_rows) the same rows' weights. */
static kvt_status chat_feed(kvt_engine *e, kvt_seq *s, kvt_cli *a, kvt_chat *c, float *logits) {
    int V = e->m->c.vocab_size;
    if (!e->o.kv_cache) kvt_seq_reset(e, s);
    int from = s->len, rows = c->n - from;
    a->attn_next = c->done;
    kvt_status st = kvt_forward(e, s, c->hist + from, rows, c->dl ? c->rows : logits, c->dl != NULL);
    if (st != KVT_OK) return st;
    c->computed += rows;
    c->calls++;
    if (c->dl) {
        size_t skip = (size_t)(c->done - from), k = (size_t)(c->n - c->done);
        if (fwrite(c->rows + skip * V, sizeof(float), k * V, c->dl) != k * V)
            return kvt_fail(KVT_EIO, "--dump-logits: writing '%s' failed: %s", c->dl_path, strerror(errno));
        memcpy(logits, c->rows + (size_t)(rows - 1) * V, (size_t)V * sizeof(float));
    }
    c->done = c->n;
    return KVT_OK;
}

/* --stats, after each turn: what the kept cache saved. With the cache, the
 * turn computed only its own positions; recomputing the transcript instead is
 * estimated at this turn's measured cost per position. (An estimate: a prefill
 * row is cheaper than a decode step, and attention grows with the length.)
 * With --kv-cache off the recomputation really ran, so the time is measured. */
static void chat_turn_stats(const kvt_engine *e, const kvt_chat *c, int turn, int reused, long computed, int calls,
                            int n_turn, int n_reply, double dt) {
    if (e->o.kv_cache) {
        /* recomputing the transcript would be one prefill of c->n rows: priced
         * at the prefill rate measured so far (every many-row call of this run,
         * the first turn's prompt included), not at this turn's time a
         * position, which is mostly decode steps and about 10x dearer */
        double per = dt / (double)(computed > 0 ? computed : 1);
        double rate = e->t_prefill > 0 ? (double)e->n_prefill / e->t_prefill : 0;
        fprintf(stderr, "[stats] turn %d: reused %d cached positions, computed %ld (%d of the turn + %d of the reply) "
                "in %.2f ms, %.3f ms a position; recomputing the whole transcript of %d positions instead: about "
                "%.2f ms (an estimate: %d positions at the prefill rate measured so far, %.1f positions/s)\n", turn,
                reused, computed, n_turn, n_reply, 1e3 * dt, 1e3 * per, c->n, rate > 0 ? 1e3 * c->n / rate : 0.0, c->n,
                rate);
    } else {
        fprintf(stderr, "[stats] turn %d: --kv-cache off: reused 0, computed %ld positions in %d forward calls, each "
                "over the whole transcript so far (%d new: %d of the turn + %d of the reply), in %.2f ms (measured)\n",
                turn, computed, calls, n_turn + n_reply, n_turn, n_reply, 1e3 * dt);
    }
}

/* A line as read (len bytes): its "\n" and then one "\r" before it (a CRLF
 * file) come off; a CR anywhere else is part of the line. */
static void line_end(char *s, size_t len) {
    if (len > 0 && s[len - 1] == '\n') s[--len] = '\0';
    if (len > 0 && s[len - 1] == '\r') s[--len] = '\0';
}
/* The next line of f into *buf (grown as needed, *cap bytes), its end taken
 * off, *line counting lines. Returns 1 with a line, 0 at the end of the file,
 * -1 with the message set: a NUL byte (it would cut the line short unseen), a
 * line longer than max bytes (more than the context can hold: refused before
 * it fills memory), or a read error (ferror: told apart from the end). */
static int next_line(FILE *f, char **buf, size_t *cap, size_t max, long *line, const char *what) {
    size_t len = 0;
    int ch = EOF;
    ++*line;
    while ((ch = getc(f)) != EOF) {
        if (ch == '\0') return (kvt_fail(KVT_EARG, "%s line %ld: a NUL byte", what, *line), -1);
        if (len + 2 > *cap) {
            size_t nc = *cap ? 2 * *cap : 256;
            char *nb = (char *)realloc(*buf, nc);
            if (!nb) return (kvt_fail(KVT_ENOMEM, "%s line %ld: host out of memory", what, *line), -1);
            *buf = nb;
            *cap = nc;
        }
        (*buf)[len++] = (char)ch;
        if (ch == '\n') break;
        if (len > max + 1) /* + 1: a CR before the newline */
            return (kvt_fail(KVT_EARG, "%s line %ld: longer than %zu bytes, more than the context can hold", what,
                             *line, max), -1);
    }
    if (ch == EOF && ferror(f)) return (kvt_fail(KVT_EIO, "%s: a read failed: %s", what, strerror(errno)), -1);
    if (ch == EOF && len == 0) return (--*line, 0);
    (*buf)[len] = '\0';
    line_end(*buf, len);
    return 1;
}
/* The most bytes a line of text can take and still fit TMAX tokens: each
 * token is at most max_token_length bytes, an id of ids:1,2,3 at most 8. */
static size_t line_max(const kvt_tokenizer *tk, int TMAX) {
    size_t per = tk && tk->max_token_length > 8 ? (size_t)tk->max_token_length : 8;
    return per * (size_t)TMAX + 64;
}

/* The conversation: read a turn, append it, prefill it, sample the reply into
 * the transcript until the end marker, -n tokens or the context, feed the
 * reply's last token (so the cache holds the whole transcript when the next
 * turn comes), repeat until the input ends. A context that is full ends the
 * conversation with one line, exit status 0: what fit was answered; a first
 * turn that does not fit is an error (exit 1: nothing was). */
static int run_chat(kvt_engine *e, kvt_model *m, const kvt_tokenizer *tk, kvt_cli *a) {
    int V = m->c.vocab_size, TMAX = m->c.seq_len, tty = isatty(STDIN_FILENO), first_given = cli_gave(a, "-i");
    kvt_chat c;
    memset(&c, 0, sizeof(c));
    c.tpl = a->tpl >= 0 ? a->tpl : tk && kvt_piece_id(tk, "<|im_start|>") >= 0 ? (int)TPL_CHATML
          : tk && tk->byte_fallback ? (int)TPL_LLAMA2 : (int)TPL_PLAIN;
    /* ChatML's system prompt when -y is not given: SmolLM2-Instruct's, from its template */
    const char *sys = c.tpl == TPL_CHATML && !a->system ? "You are a helpful AI assistant named SmolLM, trained by "
                      "Hugging Face" : a->system;
    c.bos = tk ? tk->bos_id : KVT_BOS; /* plain's: -1 when the tokenizer puts no BOS first */
    c.eos = tk ? tk->eos_id : KVT_EOS;
    c.room = TMAX;
    if (e->o.n_chunks > 0 && (long)e->o.n_chunks * e->pool.CH < TMAX) c.room = e->o.n_chunks * e->pool.CH;
    const char *name = arg_templates[c.tpl];
    if (c.tpl != TPL_PLAIN) {
        const char *b = c.tpl == TPL_CHATML ? "<|im_start|>" : "<s>", *en = c.tpl == TPL_CHATML ? "<|im_end|>" : "</s>";
        c.bos = chat_marker(tk, b);
        c.eos = chat_marker(tk, en);
        if (c.bos < 0 || c.eos < 0) {
            kvt_fail(KVT_EARG, "--template %s: the tokenizer has no piece '%s' (the template's %s marker)", name,
                     c.bos < 0 ? b : en, c.bos < 0 ? "begin-of-sequence" : "end-of-turn");
            return cli_fail("");
        }
    }
    for (int k = 0; tk && k < 3; k++) { /* the template's own text, then the system prompt, must encode */
        int *ids, ni;
        if (chat_render(&c, tk, k == 1, k == 2 ? sys : NULL, "", &ids, &ni) != KVT_OK) {
            char msg[sizeof(kvt_errbuf)];
            snprintf(msg, sizeof(msg), "%s", kvt_errbuf);
            kvt_fail(KVT_EARG, "%s%s: %s", k == 2 ? "-y/--system" : "--template ", k == 2 ? "" : name, msg);
            return cli_fail("");
        }
        free(ids);
    }
    kvt_status st = KVT_OK;
    FILE *dt = NULL;
    c.dl_path = a->dump_logits;
    if (a->dump_logits && !(c.dl = fopen(a->dump_logits, "wb")))
        st = kvt_fail(KVT_EIO, "--dump-logits: cannot write '%s': %s", a->dump_logits, strerror(errno));
    if (st == KVT_OK && a->dump_tokens && !(dt = fopen(a->dump_tokens, "w")))
        st = kvt_fail(KVT_EIO, "--dump-tokens: cannot write '%s': %s", a->dump_tokens, strerror(errno));
    size_t bytes;
    if (st == KVT_OK && c.dl) st = kvt_bytes(&bytes, "--dump-logits' rows (TMAX x V)", (size_t)c.room, (size_t)V, 4, 1);
    if (st == KVT_OK && c.dl) st = buf_alloc(0, (void **)&c.rows, bytes, "--dump-logits' rows (TMAX x V)");
    if (st != KVT_OK) {
        if (c.dl) fclose(c.dl);
        if (dt) fclose(dt);
        return cli_fail("");
    }
    c.hist = (int *)kvt_malloc((size_t)TMAX * sizeof(int));
    int *ids = (int *)kvt_malloc((size_t)TMAX * sizeof(int)); /* a --random model's turn: its ids */
    float *logits = (float *)kvt_malloc((size_t)V * sizeof(float));
    kvt_sampler sm;
    kvt_sampler_init(&sm, V, (float)a->temperature, (float)a->topp, (uint64_t)a->seed);
    kvt_seq s;
    kvt_seq_init(e, &s);
    char *line = NULL;
    size_t line_cap = 0;
    long line_no = 0;
    int turn = 0, full = 0, skipped = 0;
    long all_computed = 0;
    while (st == KVT_OK && !full) {
        const char *text = a->prompt;
        if (turn > 0 || !first_given) {
            if (tty) { printf("User: "); fflush(stdout); }
            int got = next_line(stdin, &line, &line_cap, line_max(tk, TMAX), &line_no, "--chat: standard input");
            if (got < 0) { st = KVT_EARG; break; }
            if (got == 0) {
                if (tty) printf("\n"); /* after the prompt */
                break; /* the end of the input: the conversation is over */
            }
            if (!line[0]) continue; /* an empty line is no turn */
            text = line;
        }
        /* the turn's tokens: wrapped by the template, or (--random) a line of ids taken as they are */
        int *tt = ids, nt = 0;
        st = tk ? chat_render(&c, tk, turn, sys, text, &tt, &nt) : parse_tokens(text, V, TMAX, ids, &nt);
        if (st != KVT_OK) { /* a turn the vocabulary cannot encode: say so, read the next; exit 1 at the end */
            fflush(stdout);
            fprintf(stderr, "kvt: --chat: turn skipped%s: ", tk ? "" : " (a line of token ids)");
            put_escaped(stderr, kvt_errbuf);
            fputc('\n', stderr);
            kvt_errbuf[0] = '\0';
            st = KVT_OK;
            skipped++;
            if (turn == 0) first_given = 0; /* -i's turn is used up: the next turn comes from stdin */
            if (tt != ids) free(tt);
            continue;
        }
        if (c.n + nt > c.room && turn == 0) { /* nothing was answered: an error, not an end */
            st = kvt_fail(KVT_ECONTEXT, "--chat: turn 1 is %d positions and the context holds %d%s: nothing can be "
                          "answered", nt, c.room, c.room < TMAX ? " (--chunks)" : "");
            break;
        }
        if (c.n + nt > c.room) {
            fflush(stdout);
            fprintf(stderr, "kvt: the context is full: turn %d is %d positions and %d of the %d are left%s; the "
                    "conversation ends here\n", turn + 1, nt, c.room - c.n, c.room, c.room < TMAX ? " (--chunks)" : "");
            full = 1;
        } else { /* what the user sees: the turn as the model reads it (plain), or labelled */
            if (!tty || (turn == 0 && first_given)) {
                if (c.tpl == TPL_PLAIN && turn == 0 && a->system && a->system[0]) printf("%s\n", a->system);
                printf(c.tpl == TPL_PLAIN ? "%s\n" : "User: %s\n", text);
            }
            memcpy(c.hist + c.n, tt, (size_t)nt * sizeof(int));
        }
        if (tt != ids) free(tt);
        if (full) break;
        int reused = e->o.kv_cache ? c.n : 0, calls0 = c.calls, n_reply = 0, at_line_start = 1;
        long computed0 = c.computed;
        double t0 = kvt_now();
        c.n += nt;
        turn++;
        st = chat_feed(e, &s, a, &c, logits);
        if (st == KVT_OK)
            st = trace_step(a, e, "after turn %d: seq %d, %d new positions (the turn), %d read from the cache", turn,
                            s.id, nt, reused);
        if (c.tpl != TPL_PLAIN) printf("Assistant: ");
        for (int g = 0; g < a->steps && st == KVT_OK; g++) {
            long bad = kvt_first_nonfinite(logits, (size_t)V);
            if (bad >= 0) {
                st = kvt_fail(KVT_EFORMAT, "turn %d, reply token %d: logit %ld is %g, not a finite number: NaN or Inf in "
                              "the weights?", turn, g + 1, bad, logits[bad]);
                break;
            }
            int next = kvt_sample(&sm, logits, V);
            int end = tk && (c.tpl == TPL_PLAIN ? next == tk->bos_id || next == tk->eos_id : next == c.eos);
            if (end && c.tpl == TPL_PLAIN) break; /* as without --chat: a marker the text does not show */
            if (c.n == c.room) { full = 2; break; }
            c.hist[c.n++] = next;
            n_reply++;
            if (end) break; /* the template's end marker: in the transcript (fed below), not printed */
            print_token(tk, c.hist[c.n - 2], next);
            const char *piece = tk ? kvt_decode(tk, c.hist[c.n - 2], next) : "";
            at_line_start = tk && piece[0] && piece[strlen(piece) - 1] == '\n'; /* ids ("1 5 ") end no line */
            if ((st = cli_outputs_ok(a)) != KVT_OK) break;
            if (g + 1 < a->steps) {
                st = chat_feed(e, &s, a, &c, logits);
                if (st == KVT_OK)
                    st = trace_step(a, e, "after turn %d, reply token %d: seq %d, position %d", turn, g + 1, s.id,
                                    c.n - 1);
            }
        }
        if (st == KVT_OK && c.n > c.done) { /* the reply's last token, not fed yet */
            st = chat_feed(e, &s, a, &c, logits);
            if (st == KVT_OK)
                st = trace_step(a, e, "after turn %d, the reply's last token: seq %d, position %d", turn, s.id, c.n - 1);
        }
        if (c.tpl != TPL_PLAIN || !at_line_start) printf("\n"); /* the next turn starts on a line of its own */
        if (st == KVT_OK) st = cli_outputs_ok(a);
        all_computed += c.computed - computed0;
        if (st == KVT_OK && a->stats)
            chat_turn_stats(e, &c, turn, reused, c.computed - computed0, c.calls - calls0, nt, n_reply, kvt_now() - t0);
        if (full)
            fprintf(stderr, "kvt: the context is full (%d positions%s): the reply stops here and the conversation "
                    "ends\n", c.room, c.room < TMAX ? ", --chunks" : "");
    }
    free(line);
    for (int i = 0; dt && i < c.n; i++) fprintf(dt, "%d\n", c.hist[i]);
    st = cli_close(c.dl, "--dump-logits", a->dump_logits, st);
    st = cli_close(dt, "--dump-tokens", a->dump_tokens, st);
    if (st == KVT_OK && skipped)
        st = kvt_fail(KVT_EARG, "--chat: %d turn(s) skipped, each with its reason above", skipped);
    int rc = st == KVT_OK ? 0 : cli_fail("");
    if ((st == KVT_OK || skipped) && a->stats) {
        const kvt_seq *live = &s;
        print_stats(e, &live, 1);
        fprintf(stderr, "[stats] chat: %d turns, a transcript of %d positions; %ld positions computed in %d forward "
                "calls (%s)\n", turn, c.n, all_computed, c.calls, e->o.kv_cache ? "the cache kept across turns"
                : "--kv-cache off: every call recomputed the transcript");
    }
    kvt_seq_free(e, &s);
    kvt_sampler_free(&sm);
    free(c.hist);
    free(c.rows);
    free(ids);
    free(logits);
    return rc;
}

/* Read --prompts: one prompt per non-empty line, each encoded with BOS. A line
 * too long for the context, or with a NUL byte, is refused (next_line);
 * errors name the file's line number.
 * Returns the count; on an error -(prompts read + 2), so the caller can free
 * what was read (-1: nothing was). */
static int read_prompts(const char *path, const kvt_tokenizer *tk, int TMAX, int ***prompts, int **np) {
    FILE *f;
    *prompts = NULL;
    *np = NULL;
    if (kvt_open_read(&f, path, "--prompts file") != KVT_OK) return -1;
    char *text = NULL, what[320];
    size_t text_cap = 0;
    long line = 0;
    int n = 0, cap = 0, bad = 0, got;
    snprintf(what, sizeof(what), "--prompts '%s'", path);
    while (!bad && (got = next_line(f, &text, &text_cap, line_max(tk, TMAX), &line, what)) != 0) {
        if (got < 0) { bad = 1; break; }
        if (!text[0]) continue;
        if (n == KVT_MAX_SEQS) {
            kvt_fail(KVT_EARG, "--prompts '%s' line %ld: more than %d prompts (one batch holds at most %d sequences)",
                     path, line, KVT_MAX_SEQS, KVT_MAX_SEQS);
            bad = 1;
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            *prompts = (int **)realloc(*prompts, (size_t)cap * sizeof(int *));
            *np = (int *)realloc(*np, (size_t)cap * sizeof(int));
            KVT_ASSERT(*prompts && *np);
        }
        (*prompts)[n] = (int *)kvt_malloc((size_t)TMAX * sizeof(int));
        (*np)[n] = 0;
        n++; /* counted now: the caller frees it, also when encoding fails */
        if (kvt_encode(tk, text, 1, (*prompts)[n - 1], TMAX, &(*np)[n - 1]) != KVT_OK) {
            char msg[sizeof(kvt_errbuf)];
            snprintf(msg, sizeof(msg), "%s", kvt_errbuf);
            kvt_fail(KVT_EARG, "--prompts '%s' line %ld: %s", path, line, msg);
            bad = 1;
        }
    }
    free(text);
    fclose(f);
    if (!bad && n == 0) { kvt_fail(KVT_EARG, "--prompts: '%s' has no non-empty line", path); bad = 1; }
    return bad ? -(n + 2) : n;
}

/* --serve: the scheduler, the trace and the reports (§20's serving part). */
#include "serve.c" /* cli/serve.c (beside this file) */
#endif
#ifndef KVT_NO_MAIN
/* main: defaults, flags, model, then one of the runs; every exit after the
 * model is loaded goes through `done`, which frees everything (valgrind
 * checks that nothing is lost on any of these paths). */
#include <fcntl.h>  /* fcntl: is standard output open? */
#include <signal.h> /* signal: SIGPIPE ignored */
static int cli_main(int argc, char **argv);
/* Standard output is checked like every other output: a closed one is refused
 * before anything runs (a file opened later would otherwise get its number and
 * the generated text), and a write that failed (a full disk, /dev/full, a
 * closed pipe's reader) makes the exit status 1 with the reason. */
int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN); /* a closed pipe: a failed write with its reason (cli_outputs_ok), not a silent death */
    if (fcntl(STDOUT_FILENO, F_GETFD) == -1) {
        fprintf(stderr, "kvt: standard output is closed: %s\n", strerror(errno));
        return 1;
    }
    /* A thread team is made once, at the first parallel loop, and each
     * thread needs a stack: refuse a count no machine could run. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    if ((long)omp_get_max_threads() > KVT_THREADS_PER_CORE * cores) {
        fprintf(stderr, "kvt: OMP_NUM_THREADS asks for %d threads: at most %d a core (%ld cores here: %ld)\n",
                omp_get_max_threads(), KVT_THREADS_PER_CORE, cores, KVT_THREADS_PER_CORE * cores);
        return 1;
    }
    int rc = cli_main(argc, argv), bad = ferror(stdout);
    errno = 0;
    bad |= fflush(stdout) != 0;
    if (bad) { /* (a runner that stopped at the failed write has said so) */
        if (rc == 0) fprintf(stderr, "kvt: writing standard output failed: %s\n", errno ? strerror(errno) : "a write error");
        return 1;
    }
    return rc;
}
static int cli_main(int argc, char **argv) {
    kvt_cli a;
    memset(&a, 0, sizeof(a));
    a.model = "weights/model.bin";
    a.tokenizer = "weights/tokenizer.bin";
    a.prompt = "ROMEO:";
    a.steps = -1;
    a.temperature = 0.8;
    a.topp = 0.9;
    a.seed = 42;
    a.bench_every = 64;
    a.prompt_tokens = 8;
    a.fork_share = 1;
    a.tpl = -1;
    a.dump_attn_layer = -1;
    a.dump_attn_max = 1024;
    a.max_running = 16;
    a.max_batch = 256;
    a.watermark = 1;
    a.swap_mb = 64;
    kvt_options_default(&a.o);
    int parsed = parse_args(&a, argc, argv);
    if (parsed == 2) { usage(stdout); return 0; }
    if (!parsed) { cli_fail(""); fprintf(stderr, "run 'kvt --help' for the flags\n"); return 1; }
    if (!cli_check_files(&a)) return cli_fail("");
    struct stat sb; /* llama2.c's "-m chat" names a file here: say so, unless there is such a file */
    if (!a.random && !a.model_pos && (!strcmp(a.model, "chat") || !strcmp(a.model, "generate")) && stat(a.model, &sb))
        return kvt_fail(KVT_EARG, "-m %s: -m names the checkpoint here; llama2.c's -m %s is --mode %s (or --chat)",
                        a.model, a.model, a.model), cli_fail("");
    if (!a.fork_share) a.o.prefix_reuse = 0; /* the independent baseline shares nothing at all */

    kvt_model m;
    kvt_status st = a.random ? kvt_model_random(&m, a.rc, 1) : kvt_model_load(&m, a.model);
    if (st != KVT_OK) return cli_fail("");
    int V = m.c.vocab_size, TMAX = m.c.seq_len, rc = 1;
    if (!cli_check(&a, &m.c)) { kvt_model_free(&m); return cli_fail(""); }
    if (a.bench) {
        FILE *csv = NULL;
        kvt_blas_note();
        if (a.csv && !(csv = fopen(a.csv, "w"))) kvt_fail(KVT_EIO, "--csv: cannot write '%s': %s", a.csv, strerror(errno));
        else if (!strcmp(a.bench, "decode")) st = bench_decode(&m, &a.o, csv);
        else if (!strcmp(a.bench, "positions")) st = bench_positions(&m, &a.o, a.bench_every, csv);
        else if (!strcmp(a.bench, "attention")) st = bench_attention(&m, &a.o, a.bench_ctx, csv); /* 0: fitted */
        else if (!strcmp(a.bench, "stages")) st = bench_stages(&m, &a.o, a.bench_ctx, csv);
        else if (!strcmp(a.bench, "matmul")) st = bench_matmul(&m, csv);
        else if (!strcmp(a.bench, "context"))
            st = bench_context(&m, &a.o, a.bench_ctx, a.bench_batch ? a.bench_batch : 1, csv);
        else st = bench_batch(&m, &a.o, csv);
        if (csv) st = cli_close(csv, "--csv", a.csv, st);
        kvt_model_free(&m);
        return a.csv && !csv ? cli_fail("") : st == KVT_OK ? 0 : cli_fail("");
    }
    kvt_tokenizer tk, *tkp = NULL;
    int **prompts = NULL, *np = NULL, n_prompts = 1, longest = 0, n_seqs = 1;
    kvt_engine *e = NULL;
    if (!a.random) {
        if (V < 3) { /* token ids 1 and 2 are BOS and EOS (llama2.c's convention) */
            kvt_model_free(&m);
            kvt_fail(KVT_EFORMAT, "checkpoint '%s': vocab_size %d; with a tokenizer the ids BOS = 1 and EOS = 2 need "
                     "vocab_size >= 3", a.model, V);
            return cli_fail("");
        }
        if ((st = kvt_tokenizer_load(&tk, a.tokenizer, V)) != KVT_OK) { kvt_model_free(&m); return cli_fail(""); }
        tkp = &tk;
    }
    if (a.serve) {
        rc = run_serve(&m, tkp, &a);
        kvt_errbuf[0] = '\0';
        goto done;
    }
    if (a.ppl) {
        if (!tkp) kvt_fail(KVT_EARG, "--ppl needs a tokenizer (not --random)");
        else if ((st = kvt_engine_create(&e, &m, &a.o)) == KVT_OK && (st = run_ppl(e, tkp, a.ppl, a.ppl_from)) == KVT_OK)
            rc = 0;
        goto done;
    }
    if (a.chat) { /* the turns come later, from stdin: -n is per turn, the context is checked turn by turn */
        n_prompts = 0;
        if (a.steps < 0) a.steps = 256;
    } else if (a.prompts) { /* several prompts, one batch */
        if (!tkp) { kvt_fail(KVT_EARG, "--prompts needs a tokenizer (not --random)"); goto done; }
        if ((n_prompts = read_prompts(a.prompts, tkp, TMAX, &prompts, &np)) < 1) {
            n_prompts = n_prompts < -1 ? -n_prompts - 2 : 0;
            goto done;
        }
    } else { /* one prompt */
        prompts = (int **)kvt_malloc(sizeof(int *));
        np = (int *)kvt_malloc(sizeof(int));
        prompts[0] = (int *)kvt_malloc((size_t)TMAX * sizeof(int));
        if (a.tokens) st = parse_tokens(a.tokens, V, TMAX, prompts[0], &np[0]);
        else if (tkp) st = kvt_encode(tkp, a.prompt, 1, prompts[0], TMAX, &np[0]);
        else if (a.prompt_tokens > TMAX) st = kvt_fail(KVT_ECONTEXT, "--prompt-tokens %d: more than TMAX = %d", a.prompt_tokens, TMAX);
        else { np[0] = a.prompt_tokens; prompts[0][0] = KVT_BOS % V; kvt_fake_tokens(prompts[0] + 1, np[0] - 1, V); }
        if (st == KVT_OK && np[0] == 0) /* only an empty -i with a tokenizer that puts no BOS first */
            st = kvt_fail(KVT_EARG, "-i: the prompt is empty and this tokenizer puts no BOS first: give some text");
        if (st != KVT_OK) { cli_fail("prompt: "); kvt_errbuf[0] = '\0'; goto done; }
    }
    for (int i = 0; i < n_prompts; i++) longest = np[i] > longest ? np[i] : longest;
    if (a.steps < 0) a.steps = TMAX - longest < 256 ? TMAX - longest : 256;
    if (!a.chat && longest + a.steps > TMAX) {
        kvt_fail(KVT_ECONTEXT, "-n %d: the %sprompt is %d tokens, so -n must be in [0, %d] (context TMAX = %d)", a.steps,
                 n_prompts > 1 ? "longest " : "", longest, TMAX - longest, TMAX);
        goto done;
    }
    if (!a.chat && a.o.n_chunks > 0 && a.o.n_chunks < kvt_cdiv(longest + a.steps, a.o.CH)) { /* cache off: every step too */
        kvt_fail(KVT_EPOOL, "--chunks %d: too small for one sequence of %d positions (prompt %d + -n %d), which needs "
                 "at least %d chunks of %d positions", a.o.n_chunks, longest + a.steps, longest, a.steps,
                 kvt_cdiv(longest + a.steps, a.o.CH), a.o.CH);
        goto done;
    }
    n_seqs = a.fork > 1 ? a.fork : n_prompts > 1 ? n_prompts : 1;
    if (n_seqs > 1) {
        if (!a.o.kv_cache) { kvt_fail(KVT_EARG, "--prompts and --fork decode with the cache: drop --kv-cache off"); goto done; }
        if (a.check) { kvt_fail(KVT_EARG, "--check runs one sequence: drop --prompts/--fork"); goto done; }
        a.o.max_seqs = n_seqs;
        if (a.o.max_rows < n_seqs) a.o.max_rows = n_seqs;
    }
    if (a.dump_attn && attn_dump_too_big(&a, &m.c, a.chat ? 0 : longest + a.steps)) goto done;
    if (a.trace && !(a.tracef = a.trace[0] ? fopen(a.trace, "w") : stderr)) {
        kvt_fail(KVT_EIO, "--trace: cannot write '%s': %s", a.trace, strerror(errno));
        goto done;
    }
    if (a.dump_attn) { /* the engine hands each forward's weights to attn_dump_rows */
        if (!(a.attnf = fopen(a.dump_attn, "w"))) {
            kvt_fail(KVT_EIO, "--dump-attn: cannot write '%s': %s", a.dump_attn, strerror(errno));
            goto done;
        }
        fprintf(a.attnf, "query,layer,head,key,weight\n");
        a.o.attn_probe = attn_dump_rows;
        a.o.attn_ctx = &a;
        a.o.attn_layer = a.dump_attn_layer;
    }
    if ((st = kvt_engine_create(&e, &m, &a.o)) != KVT_OK) goto done;
    trace_start(a.tracef, e);
    if (a.chat) rc = run_chat(e, &m, tkp, &a);
    else if (n_seqs > 1) rc = run_batch(e, &m, tkp, &a, prompts, np, n_seqs);
    else rc = run_single(e, &m, tkp, &a, prompts[0], np[0]);
    kvt_errbuf[0] = '\0'; /* the runners reported their own errors */
done:
    if (a.tracef && a.tracef != stderr && cli_close(a.tracef, "--trace", a.trace, rc ? KVT_EIO : KVT_OK) != KVT_OK &&
        rc == 0)
        rc = 1;
    if (a.attnf && cli_close(a.attnf, "--dump-attn", a.dump_attn, rc ? KVT_EIO : KVT_OK) != KVT_OK && rc == 0) rc = 1;
    if (rc && kvt_errbuf[0]) cli_fail("");
    for (int i = 0; i < n_prompts && prompts; i++) free(prompts[i]);
    free(prompts);
    free(np);
    kvt_engine_free(e);
    if (tkp) kvt_tokenizer_free(tkp);
    kvt_model_free(&m);
    return rc;
}
#endif
