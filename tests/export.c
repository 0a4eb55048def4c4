/* tests/export.c: the exporters (weights/export_hf.py, weights/export_gguf.py) against transformers' fixture and their refusals.
 * Included by test.c, in place: one compile, one binary (see test.c). */
/* weights/hf-tiny (made by weights/make_hf_fixture.py with transformers):
 * export it with weights/export_hf.py, run kvt on transformers' greedy
 * sequence with the cache on and off, and compare every position's logits
 * and every chosen token; encode a sample text and compare the ids with
 * transformers' tokenizer. Then the exporter must refuse what the format
 * cannot hold, naming the field. */
static void test_hf_export(void) {
    size_t jb = 0, lb = 0;
    char *json = read_all("weights/hf-tiny/expected.json", &jb);
    FILE *f = fopen(kvt_bin, "rb");
    if (f) fclose(f);
    if (!json || !f || system("python3 -c 'import json, struct' > /dev/null 2>&1") != 0) {
        free(json);
        skip("Hugging Face export (needs ./kvt, python3 and weights/hf-tiny)");
        return;
    }
    int prompt[64], greedy[128], sample[256];
    int np = json_ints(json, "prompt", prompt, 64), ng = json_ints(json, "greedy", greedy, 128);
    int ns = json_ints(json, "sample_ids", sample, 256);
    const char *vs = strstr(json, "\"vocab_size\": ");
    int V = vs ? atoi(vs + 14) : 0;
    char *sample_text = NULL, *st = strstr(json, "\"sample_text\": \"");
    if (st) {
        st += 16;
        sample_text = strndup(st, (size_t)(strchr(st, '"') - st));
    }
    float *want = (float *)read_all("weights/hf-tiny/logits.f32", &lb);
    KVT_ASSERT(np > 0 && ng > np && ns > 0 && V > 258 && sample_text && want &&
               lb == (size_t)(ng - 1) * V * 4);
    char dir[64], cmd[1024], args[2048], ids[512], out[4096]; /* test_dir + "/hf": under 64 */
    snprintf(dir, sizeof(dir), "%s", tmp_file("hf"));
    snprintf(cmd, sizeof(cmd), "mkdir -p %s && python3 weights/export_hf.py weights/hf-tiny %s/model.bin "
             "%s/tokenizer.bin > %s/export.log 2>&1", dir, dir, dir, dir);
    int ok = system(cmd) == 0;
    expect(ok, "weights/export_hf.py exports weights/hf-tiny (bf16, 2 shards, GQA, untied, byte-fallback BPE)");
    ids_arg(ids, sizeof(ids), prompt, np);
    for (int off = 0; off < 2 && ok; off++) {
        snprintf(args, sizeof(args), "-m %s/model.bin -z %s/tokenizer.bin --tokens %s -n %d -t 0 --kv-cache %s "
                 "--dump-logits %s/l.f32 --dump-tokens %s/t.txt", dir, dir, ids, ng - np, off ? "off" : "on", dir, dir);
        int rc = cli_run(args, out, sizeof(out));
        char path[128];
        snprintf(path, sizeof(path), "%s/l.f32", dir);
        size_t bytes = 0;
        float *got = (float *)read_all(path, &bytes);
        snprintf(path, sizeof(path), "%s/t.txt", dir);
        int fed[160], nf = read_ints(path, fed, 160), same = nf == ng;
        for (int i = 0; i < ng && same; i++) same = fed[i] == greedy[i];
        double worst = 0.0;
        int close = rc == 0 && got && bytes == lb && rows_close(got, want, ng - 1, V, 1e-4, &worst);
        expect(close && same, "HF model, cache %s: %d positions' logits within 1e-4 of each position's max |logit| "
               "of transformers' (worst %.2e); greedy tokens equal transformers' (%d)", off ? "off" : "on", ng - 1,
               worst, ng - np);
        free(got);
    }
    if (ok) { /* the tokenizer: kvt's encoding of the sample = transformers' */
        snprintf(args, sizeof(args), "-m %s/model.bin -z %s/tokenizer.bin -i '%s' -n 1 -t 0 --dump-tokens %s/s.txt",
                 dir, dir, sample_text, dir);
        int rc = cli_run(args, out, sizeof(out));
        char path[128];
        snprintf(path, sizeof(path), "%s/s.txt", dir);
        int got[300], n = read_ints(path, got, 300), same = rc == 0 && n == ns + 1;
        for (int i = 0; i < ns && same; i++) same = got[i] == sample[i];
        expect(same, "HF tokenizer: '%s' encodes to transformers' %d ids (byte fallback for the characters the "
               "vocabulary lacks)", sample_text, ns);
    }
    /* refusals: a copy of the fixture with one field changed */
    const char *bad[][3] = {
        {"config.json", "c['rope_theta'] = 0.5", "rope_theta"}, /* any other base > 1: the RoPE extension */
        {"config.json", "c['rms_norm_eps'] = 1e-6", "rms_norm_eps"},
        {"config.json", "c['rope_scaling'] = {'type': 'linear', 'factor': 2.0}", "rope_scaling"},
        {"config.json", "c['hidden_act'] = 'gelu'", "hidden_act"},
        {"config.json", "c['attention_bias'] = True", "attention_bias"},
        {"tokenizer.json", "c['model']['byte_fallback'] = False", "byte_fallback"},
    };
    for (int i = 0; i < 6 && ok; i++) {
        snprintf(cmd, sizeof(cmd), "rm -rf %s/bad && cp -r weights/hf-tiny %s/bad && python3 -c \"import json; "
                 "p = '%s/bad/%s'; c = json.load(open(p)); %s; json.dump(c, open(p, 'w'))\" && "
                 "python3 weights/export_hf.py %s/bad %s/bad.bin %s/bad_tok.bin > %s/bad.log 2>&1",
                 dir, dir, dir, bad[i][0], bad[i][1], dir, dir, dir, dir);
        int rc = system(cmd);
        snprintf(cmd, sizeof(cmd), "%s/bad.log", dir);
        size_t n = 0;
        char *log = read_all(cmd, &n);
        expect(rc != 0 && log && contains(log, bad[i][2]) && !contains(log, "Traceback"),
               "export_hf.py refuses %s (%s): '%.120s'", bad[i][0], bad[i][1], log ? strtok(log, "\n") : "");
        free(log);
    }
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) printf("    (could not remove %s)\n", dir);
    free(sample_text);
    free(want);
    free(json);
}

/* Run a Python checker: its FAIL lines and tracebacks are shown, its last
 * other line is kept in last (the summary); the exit status is returned. */
static int run_py_check(const char *cmd, char *last, size_t cap) {
    char line[1024];
    snprintf(last, cap, "(no output)");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    while (fgets(line, sizeof(line), p)) {
        if (!strncmp(line, "PASS ", 5)) continue;
        line[strcspn(line, "\n")] = '\0';
        if (line[0]) snprintf(last, cap, "%s", line);
        if (strncmp(line, "FAIL ", 5) == 0 || contains(line, "Traceback")) printf("    %s\n", line);
    }
    return pclose(p);
}
/* weights/check_export_hf.py: the exporter's refusals (bad outputs, kvt's
 * limits, malformed or self-contradicting folders) are one line each and
 * leave nothing behind; it builds its own folder, exports it and runs kvt on
 * the result. Passed only when the script exits 0; its FAIL lines are shown. */
static void test_hf_export_refusals(void) {
    if (system("command -v python3 > /dev/null 2>&1") != 0) {
        skip("weights/check_export_hf.py (needs python3)");
        return;
    }
    FILE *k = fopen(kvt_bin, "rb");
    if (k) fclose(k);
    char cmd[1024], last[1024];
    snprintf(cmd, sizeof(cmd), "python3 weights/check_export_hf.py %s%s%s 2>&1", k ? "'" : "", k ? kvt_bin : "",
             k ? "'" : "");
    int rc = run_py_check(cmd, last, sizeof(last));
    expect(rc == 0, "weights/check_export_hf.py %s: the exporter refuses bad input with one line, all or nothing "
           "(%s)", k ? kvt_bin : "(no kvt binary: export checks only)", last);
}

/* weights/check_export_gguf.py: the GGUF exporter's dequantization (blocks
 * computed by hand), its outputs read back field by field (the RoPE extension,
 * the BBPE trailer) and its refusals (one line each, nothing left behind), on
 * small GGUF files it writes itself. Passed only when the script exits 0; its
 * FAIL lines are shown. */
static void test_gguf_export(void) {
    if (system("command -v python3 > /dev/null 2>&1") != 0) {
        skip("weights/check_export_gguf.py (needs python3)");
        return;
    }
    char last[1024];
    int rc = run_py_check("python3 weights/check_export_gguf.py 2>&1", last, sizeof(last));
    expect(rc == 0, "weights/check_export_gguf.py: GGUF dequantization, the checkpoint and tokenizer bytes, refusals "
           "with one line, all or nothing (%s)", last);
}
