/* tests/fuzz.c: the fuzzers' seeds and libFuzzer entry points (make fuzz).
 * Included by test.c, in place: one compile, one binary (see test.c). */
// ---- fuzzing (make fuzz) ---------------------------------------------------------------------
/* Seeds for the fuzzers, made here rather than downloaded: a small valid
 * checkpoint (and a truncated one), a valid tokenizer with byte fallback and
 * merges, and a few prompts. */
static void write_bpe_tokenizer(const char *path);
static void write_fuzz_seeds(const char *dir) {
    char path[512];
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(8, 1, 2, 1, 16, 11, 8), 1) == KVT_OK);
    snprintf(path, sizeof(path), "%s/model/valid.bin", dir);
    KVT_ASSERT(write_checkpoint(path, &m, 0, 0));
    snprintf(path, sizeof(path), "%s/model/truncated.bin", dir);
    KVT_ASSERT(write_checkpoint(path, &m, 7, 0));
    kvt_model_free(&m);
    char plain[512];
    snprintf(plain, sizeof(plain), "%s/seed_tok.bin", dir);
    snprintf(path, sizeof(path), "%s/tokenizer/bpe.bin", dir); /* the fuzz target reads V from 2 bytes first */
    write_bpe_tokenizer(plain);
    FILE *in = fopen(plain, "rb"), *out = fopen(path, "wb");
    KVT_ASSERT(in && out);
    fputc((3 + 256 + 5 - 1) & 255, out); /* 1 + (263 % 600) = 264 tokens */
    fputc((3 + 256 + 5 - 1) >> 8, out);
    for (int ch; (ch = fgetc(in)) != EOF;) fputc(ch, out);
    fclose(in);
    fclose(out);
    snprintf(path, sizeof(path), "%s/tokenizer/byte_level.bin", dir); /* and a byte-level one, V = BL_V */
    write_byte_level_tokenizer(plain, bl_default(KVT_PRE_SMOLLM));
    in = fopen(plain, "rb");
    out = fopen(path, "wb");
    KVT_ASSERT(in && out);
    fputc((BL_V - 1) & 255, out);
    fputc((BL_V - 1) >> 8, out);
    for (int ch; (ch = fgetc(in)) != EOF;) fputc(ch, out);
    fclose(in);
    fclose(out);
    const char *cli[] = {"--random\n32,1,4,2,64,50,32\n-n\n5", "--random\n64,2,4,2,128,-2147483648,64",
                         "--fork\n2\n--prompts\nx", "--kv-dtype\nint8\n--kv-group\n8\n--chunk\n4", "-t\n1e-40\n--topp\n0.5",
                         "--bench\ncontext\n--bench-ctx\n100\n--csv\nx.csv", "--prompt-tokens\n3\n--split\n-1\n--attn\nnaive"};
    for (int i = 0; i < (int)(sizeof(cli) / sizeof(cli[0])); i++) {
        snprintf(path, sizeof(path), "%s/cli/c%d.txt", dir, i);
        FILE *f = fopen(path, "wb");
        KVT_ASSERT(f);
        fputs(cli[i], f);
        fclose(f);
    }
    const char *prompts[] = {"abcz", "Hello, world", "\xc3\xa9t\xc3\xa9 \xe2\x82\xac", "ab ab abc", ""};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof(path), "%s/prompt/p%d.txt", dir, i);
        FILE *f = fopen(path, "wb");
        KVT_ASSERT(f);
        fputs(prompts[i], f);
        fclose(f);
    }
}

#ifdef KVT_FUZZ
#include <unistd.h>
/* libFuzzer entry points; KVT_FUZZ selects the target: 1 checkpoint loader,
 * 2 tokenizer loader, 3 prompt encoder, 4 command-line parser. Input bytes go
 * through a file, the way a user's file does; for 4 they are the arguments,
 * one per line. */
#if KVT_FUZZ == 4
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* argv from the input: lines are arguments (a NUL ends one too) */
    char *buf = (char *)kvt_malloc(size + 1), *argv[66] = {(char *)"kvt"};
    int argc = 1;
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (char *p = buf; argc < 65 && p < buf + size;) {
        argv[argc++] = p;
        size_t n = strcspn(p, "\n");
        p[n] = '\0';
        p += n + 1;
    }
    argv[argc] = NULL;
    kvt_cli a;
    memset(&a, 0, sizeof(a));
    kvt_options_default(&a.o);
    a.prompt_tokens = 8;
    kvt_config c = {64, 128, 2, 4, 2, 100, 64}; /* the model the flags are checked against */
    if (parse_args(&a, argc, argv) == 1 && cli_check(&a, &c) == 1) {
        KVT_ASSERT(a.o.CH >= 1 && a.prompt_tokens >= 1 && a.prompt_tokens <= KVT_LIMIT_SEQ);
        KVT_ASSERT(a.o.kv_group >= 1 && (cli_gave(&a, "--kv-group") || (c.dim / c.n_heads) % a.o.kv_group == 0)); /* a given G
                                                                  is checked against HS by kvt_engine_create */
        if (a.random) KVT_ASSERT(kvt_config_check(&a.rc) == KVT_OK);
    }
    free(buf);
    return 0;
}
#else
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *path; /* a file in the run's own folder, as in make test */
    if (!path) {
        KVT_ASSERT(make_test_dir());
        atexit(remove_test_dir);
        path = tmp_file("fuzz.bin");
    }
#if KVT_FUZZ == 3
    static kvt_tokenizer tk, bl; /* the sentencepiece-style one and a byte-level one */
    static int ready = 0;
    if (!ready) {
        write_bpe_tokenizer(path);
        KVT_ASSERT(kvt_tokenizer_load(&tk, path, 3 + 256 + 5) == KVT_OK);
        write_byte_level_tokenizer(path, bl_default(KVT_PRE_SMOLLM));
        KVT_ASSERT(kvt_tokenizer_load(&bl, path, BL_V) == KVT_OK);
        ready = 1;
    }
    char *text = (char *)kvt_malloc(size + 1), *back = (char *)kvt_malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    int *toks = (int *)kvt_malloc((size + 3) * sizeof(int)), n = 0;
    if (kvt_encode(&tk, text, 1, toks, (int)size + 3, &n) == KVT_OK)
        for (int i = 1; i < n; i++) KVT_ASSERT(toks[i] >= 0 && toks[i] < tk.vocab_size && kvt_decode(&tk, toks[i - 1], toks[i]));
    KVT_ASSERT(kvt_encode(&bl, text, 1, toks, (int)size + 3, &n) == KVT_OK); /* any bytes encode */
    back[0] = '\0';
    for (int i = 0; i < n; i++) strcat(back, kvt_decode(&bl, i ? toks[i - 1] : -1, toks[i]));
    KVT_ASSERT(!strcmp(back, text)); /* and decode back to themselves */
    free(text);
    free(back);
    free(toks);
#else
    FILE *f = fopen(path, "wb");
    KVT_ASSERT(f);
    size_t skip = KVT_FUZZ == 2 && size >= 2 ? 2 : 0; /* tokenizer: the first 2 bytes pick V */
    fwrite(data + skip, 1, size - skip, f);
    fclose(f);
#if KVT_FUZZ == 1
    kvt_model m;
    if (kvt_model_load(&m, path) == KVT_OK) kvt_model_free(&m);
#else
    kvt_tokenizer tk;
    int V = skip ? 1 + (data[0] | data[1] << 8) % 600 : 1;
    if (kvt_tokenizer_load(&tk, path, V) == KVT_OK) {
        int toks[64], n;
        kvt_encode(&tk, "To be, or not to be", 1, toks, 64, &n);
        kvt_tokenizer_free(&tk);
    }
#endif
#endif
    return 0;
}
#endif
#endif
