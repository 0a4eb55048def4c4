/* tests/chat.c: --chat, llama2.c's command line, --dump-attn, the RoPE base, SmolLM2's logits.
 * Included by test.c, in place: one compile, one binary (see test.c). */
// ---- --chat, llama2.c's command line, --dump-attn ----------------------------------------------

/* The "[stats] turn K: reused R cached positions, computed C (" figures of each
 * turn of a --chat --stats run, in order; returns the number of turns found. */
static int chat_stats(const char *out, int *reused, long *computed, int cap) {
    int n = 0;
    for (const char *p = out; n < cap && (p = strstr(p, "[stats] turn ")) != NULL; p++) {
        int k;
        if (sscanf(p, "[stats] turn %d: reused %d cached positions, computed %ld (", &k, &reused[n], &computed[n]) == 3 &&
            k == n + 1)
            n++;
    }
    return n;
}
/* A --chat run against one run over its whole transcript: the chat's
 * --dump-tokens (the transcript) go back in as --tokens with -n 0 and
 * --kv-cache off (every position computed in one pass, nothing kept from a
 * turn before), and every row of the two --dump-logits must agree within
 * TOL_E2E. flags: the chat's (the reference gets the same --kv-dtype, --attn and
 * --device); turns: the input file. Returns the transcript's length (0 on a
 * failure), its ids in ids (cap). */
static int chat_vs_whole(const char *what, const char *model, const char *flags, const char *turns, int V, int *ids,
                         int cap, char *out, size_t out_cap) {
    char args[4096], idarg[2048], ref[1024] = ""; /* cli_run takes 4 KB of arguments */
    const char *lp = tmp_file("chat.f32"), *tp = tmp_file("chat.txt"), *rp = tmp_file("whole.f32");
    snprintf(args, sizeof(args), "%s %s --chat --stats --dump-logits %s --dump-tokens %s < %s", model, flags, lp, tp,
             turns);
    int rc = cli_run(args, out, out_cap), n = read_ints(tp, ids, cap);
    /* the reference keeps the flags that change the arithmetic, and drops those of the chat */
    const char *keep[] = {"--kv-dtype", "--attn", "--device", "--kv-group"};
    char fl[512];
    snprintf(fl, sizeof(fl), "%s", flags);
    for (char *w = strtok(fl, " "); w; w = strtok(NULL, " ")) {
        int k = 0;
        for (size_t j = 0; j < sizeof(keep) / sizeof(keep[0]); j++) k |= !strcmp(w, keep[j]);
        char *val = k ? strtok(NULL, " ") : NULL;
        if (val) snprintf(ref + strlen(ref), sizeof(ref) - strlen(ref), " %s %s", w, val);
    }
    ids_arg(idarg, sizeof(idarg), ids, n);
    snprintf(args, sizeof(args), "%s --tokens %s -n 0 --kv-cache off%s --dump-logits %s", model, idarg, ref, rp);
    char out2[4096];
    int rc2 = n > 0 ? cli_run(args, out2, sizeof(out2)) : -1;
    size_t b1 = 0, b2 = 0;
    float *chat = (float *)read_all(lp, &b1), *whole = (float *)read_all(rp, &b2);
    double worst = 0.0;
    int ok = rc == 0 && rc2 == 0 && n > 0 && chat && whole && b1 == (size_t)n * V * 4 && b2 == b1 &&
             rows_close(chat, whole, n, V, TOL_E2E, &worst);
    expect(ok, "%s: every row of the chat's logits (%d positions, all turns) = one cache-off run over the whole "
           "transcript, within TOL_E2E = %.0e (worst %.2e)", what, n, TOL_E2E, worst);
    free(chat);
    free(whole);
    remove(lp);
    remove(tp);
    remove(rp);
    return ok ? n : 0;
}

/* --chat on the default model (plain template, greedy): three turns in one
 * sequence. Each turn computes exactly its own positions (the line, its
 * newline, BOS before the first, and -n reply tokens; counted here from the
 * text) and reuses all earlier ones; the logits of every turn equal one
 * cache-off run over the transcript; with --kv-cache off the same transcript
 * comes out, and its stats say each call recomputed it. */
static void test_chat_default_model(void) {
    if (!have_kvt("--chat on the default model")) return;
    const char *lines[3] = {"ROMEO: What news?", "JULIET: None.", "ROMEO: Farewell, then."};
    const char *turns = tmp_file("turns.txt");
    char text[256], out[16384];
    snprintf(text, sizeof(text), "%s\n%s\n\n%s\n", lines[0], lines[1], lines[2]); /* an empty line is no turn */
    write_text(turns, text, strlen(text));
    int V = 68, reply = 12, ids[2][512], n[2];
    for (int off = 0; off < 2; off++) {
        char flags[64], what[64];
        snprintf(flags, sizeof(flags), "-n %d -t 0%s", reply, off ? " --kv-cache off" : "");
        snprintf(what, sizeof(what), "--chat, default model, cache %s", off ? "off" : "on");
        n[off] = chat_vs_whole(what, "", flags, turns, V, ids[off], 512, out, sizeof(out));
        int reused[8], nt;
        long computed[8];
        nt = chat_stats(out, reused, computed, 8);
        if (!off) {
            int ok = nt == 3, before = 0;
            char got[256] = "";
            for (int k = 0; k < 3 && ok; k++) {
                int own = (int)strlen(lines[k]) + 1 + (k == 0) + reply; /* the line, "\n", BOS; the reply */
                ok = reused[k] == before && computed[k] == own;
                snprintf(got + strlen(got), sizeof(got) - strlen(got), " turn %d: reused %d computed %ld (want %d, %d);",
                         k + 1, reused[k], computed[k], before, own);
                before += own;
            }
            expect(ok && n[0] == before, "--chat --stats: each turn computes its own positions and reuses the cached "
                   "rest:%s transcript %d", got, n[0]);
            /* turn 3's price of recomputing the transcript: its positions at
             * the prefill rate the line states (checked as arithmetic: the
             * figures themselves are timings) */
            const char *est = strstr(out, "[stats] turn 3: ");
            est = est ? strstr(est, "instead: about ") : NULL;
            double ms_est = -1, rate = -1;
            int npos = -1;
            if (est) sscanf(est, "instead: about %lf ms (an estimate: %d positions at the prefill rate measured so far, "
                            "%lf positions/s)", &ms_est, &npos, &rate);
            expect(npos == before && rate > 0 && fabs(ms_est - 1e3 * npos / rate) <= 0.01 + 1e-3 * ms_est,
                   "--chat --stats: recomputing the transcript is priced at the measured prefill rate: %d positions at "
                   "%.1f positions/s, about %.2f ms", npos, rate, ms_est);
            /* the transcript: BOS, then turn 1's characters as the default tokenizer has them */
            kvt_tokenizer tk;
            int want[64], nw = 0;
            KVT_ASSERT(kvt_tokenizer_load(&tk, "weights/tokenizer.bin", V) == KVT_OK);
            snprintf(text, sizeof(text), "%s\n", lines[0]);
            KVT_ASSERT(kvt_encode(&tk, text, 1, want, 64, &nw) == KVT_OK);
            kvt_tokenizer_free(&tk);
            expect(n[0] > nw && !memcmp(ids[0], want, (size_t)nw * sizeof(int)), "--chat plain: the transcript starts "
                   "with BOS and turn 1's %d characters and its newline, as is", nw - 2);
        } else {
            expect(contains(out, "[stats] turn 3: --kv-cache off: reused 0") && contains(out, "(measured)"),
                   "--chat --kv-cache off --stats: each turn says it recomputed the transcript, measured");
        }
    }
    expect(n[0] == n[1] && n[0] > 0 && !memcmp(ids[0], ids[1], (size_t)n[0] * sizeof(int)),
           "--chat: the same transcript with the cache kept and with --kv-cache off (%d, %d positions)", n[0], n[1]);
    /* --trace: the chunk table grows turn by turn (turn 2 starts where turn 1's reply ended: 31 cached) */
    int rc = cli_run("--chat -n 12 -t 0 --chunk 8 --trace @T/chat_trace.txt < @T/turns.txt", out, sizeof(out));
    size_t len = 0;
    char *trace = read_all(tmp_file("chat_trace.txt"), &len);
    expect(rc == 0 && trace && contains(trace, "== after turn 2: seq 0, 14 new positions (the turn), 31 read from the "
                                               "cache\nseq 0 [ 0 1 2 3 4 5 (5/8) ] len 45\n") &&
           contains(trace, "== after turn 3, the reply's last token: seq 0, position 91\n"),
           "--chat --trace: the table after each call, growing by turns (45 positions after turn 2's prefill)");
    free(trace);
    remove(tmp_file("chat_trace.txt"));
    /* what the user sees: each turn echoed from the pipe, then its continuation */
    rc = cli_run_to("--chat -n 4 -t 0 < @T/turns.txt", 1, out, sizeof(out));
    expect(rc == 0 && !strncmp(out, "ROMEO: What news?\n", 18) && contains(out, "\nJULIET: None.\n"),
           "--chat from a pipe: stdout shows each turn, then the model's continuation");
    remove(turns);
}

/* --chat on a random model: each line of stdin is a turn of token ids. Every
 * cache type, both attention paths, the emulated GPU and --kv-cache off give
 * the logits of one run over the transcript; each turn computes its own ids
 * plus -n reply tokens. */
static void test_chat_random(void) {
    if (!have_kvt("--chat on a random model")) return;
    const char *model = "--random 64,2,4,2,128,100,64", *turns = tmp_file("idturns.txt");
    write_text(turns, "1,5,7,9\n12, 3\n40,41,42,43,44,45,46\n", 35);
    const int own[3] = {4, 2, 7}, reply = 5;
    const char *configs[] = {"", "--attn naive", "--kv-dtype fp16 --chunk 4", "--kv-dtype int8", "--device gpu",
                             "--device gpu --attn naive --kv-dtype int8", "--kv-cache off --chunk 3"};
    for (size_t i = 0; i < sizeof(configs) / sizeof(configs[0]); i++) {
        char flags[128], what[128], out[16384];
        if (strstr(configs[i], "gpu") && !kvt_gpu_available()) { skip("--chat --device gpu: no CUDA device"); continue; }
        int ids[128];
        snprintf(flags, sizeof(flags), "-n %d -t 0 %s", reply, configs[i]);
        snprintf(what, sizeof(what), "--chat --random, '%s'", configs[i]);
        int n = chat_vs_whole(what, model, flags, turns, 100, ids, 128, out, sizeof(out)), reused[8], before = 0, ok;
        long computed[8];
        int nt = chat_stats(out, reused, computed, 8);
        ok = n == 3 * reply + 13 && ids[0] == 1 && ids[4 + reply] == 12 && ids[4 + reply + 2 + reply] == 40;
        if (strstr(configs[i], "--kv-cache off")) {
            expect(ok, "%s: the transcript is turn 1's ids, 5 reply ids, turn 2's, 5, turn 3's, 5 (%d positions)",
                   what, n);
            continue;
        }
        ok &= nt == 3;
        for (int k = 0; k < nt && ok; k++) {
            ok = reused[k] == before && computed[k] == own[k] + reply;
            before += own[k] + reply;
        }
        expect(ok, "%s: transcript = the turns' ids with 5 reply ids after each; turn k computes its ids + 5, "
               "reuses the rest", what);
    }
    remove(turns);
}

/* The templates' token ids, by hand. The test's vocabulary: <unk> <s> </s>,
 * "\n" at id 3, then the printable ASCII characters ' '..'~' at ids 4..98 (so
 * character c is id c - 28), on a random model of that vocabulary. With -n 0
 * a chat is its turns alone, so the whole transcript is known in advance. */
static void chat_tok_file(const char *path, const char *bos, const char *eos) {
    FILE *f = fopen(path, "wb");
    KVT_ASSERT(f);
    int maxlen = 16;
    fwrite(&maxlen, 4, 1, f);
    put_piece(f, "<unk>", 0);
    put_piece(f, bos, 0);
    put_piece(f, eos, 0);
    put_piece(f, "\n", 0);
    for (int ch = ' '; ch <= '~'; ch++) {
        char piece[2] = {(char)ch, 0};
        put_piece(f, piece, 0);
    }
    fclose(f);
}
/* want: the expected transcript, "<s>" and "</s>" as the markers at ids 1
 * and 2 (whatever the file spells them) and every other character as itself;
 * -> ids. */
static int chat_ids(const char *want, int *ids) {
    int n = 0;
    for (const char *p = want; *p;) {
        if (!strncmp(p, "<s>", 3)) { ids[n++] = 1; p += 3; }
        else if (!strncmp(p, "</s>", 4)) { ids[n++] = 2; p += 4; }
        else { ids[n++] = *p == '\n' ? 3 : *p - 28; p++; }
    }
    return n;
}
static void chat_expect_ids(const char *what, const char *flags, const char *want) {
    char args[1024], out[8192];
    int got[1024], exp_ids[1024];
    snprintf(args, sizeof(args), "-m @T/chat.bin -z @T/chat_tok.bin --chat -n 0 %s --dump-tokens @T/chat_ids.txt "
             "< @T/chat_turns.txt", flags);
    int rc = cli_run(args, out, sizeof(out)), n = read_ints(tmp_file("chat_ids.txt"), got, 1024);
    int ne = chat_ids(want, exp_ids), first = 0;
    while (first < n && first < ne && got[first] == exp_ids[first]) first++;
    expect(rc == 0 && n == ne && first == n, "--chat %s: the transcript's %d ids are the hand-written %d (first "
           "difference at %d)", what, n, ne, first);
}
static void test_chat_templates(void) {
    if (!have_kvt("--chat templates")) return;
    kvt_model m;
    KVT_ASSERT(kvt_model_random(&m, cfg(32, 1, 4, 2, 64, 99, 256), 5) == KVT_OK);
    KVT_ASSERT(write_checkpoint(tmp_file("chat.bin"), &m, 0, 0));
    kvt_model_free(&m);
    chat_tok_file(tmp_file("chat_tok.bin"), "<s>", "</s>");
    write_text(tmp_file("chat_turns.txt"), "hi\nyo\n", 6);
    chat_expect_ids("--template llama2 -y 'Be brief.'", "--template llama2 -y 'Be brief.'",
                    "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nhi [/INST]<s>[INST] yo [/INST]");
    chat_expect_ids("--template llama2", "--template llama2", "<s>[INST] hi [/INST]<s>[INST] yo [/INST]");
    chat_expect_ids("--template zephyr -y 'Be brief.'", "--template zephyr -y 'Be brief.'",
                    "<s><|system|>\nBe brief.</s>\n<|user|>\nhi</s>\n<|assistant|>\n\n<|user|>\nyo</s>\n<|assistant|>\n");
    chat_expect_ids("--template zephyr", "--template zephyr",
                    "<s><|user|>\nhi</s>\n<|assistant|>\n\n<|user|>\nyo</s>\n<|assistant|>\n");
    chat_expect_ids("--template plain -y 'Be brief.'", "--template plain -y 'Be brief.'", "<s>Be brief.\nhi\nyo\n");
    chat_expect_ids("(no --template: plain for a vocabulary without byte fallback), -i", "-i hey",
                    "<s>hey\nhi\nyo\n");
    /* a reply: llama2's turns follow whatever the model said, the end marker included */
    char out[8192];
    int got[256], first[64], n1 = chat_ids("<s>[INST] hi [/INST]", first), n2;
    int rc = cli_run("-m @T/chat.bin -z @T/chat_tok.bin --chat --template llama2 -n 3 -t 0 --dump-tokens "
                     "@T/chat_ids.txt < @T/chat_turns.txt", out, sizeof(out));
    n2 = read_ints(tmp_file("chat_ids.txt"), got, 256);
    int r = n1; /* the reply: 3 ids, or fewer ending with </s> (id 2), which stays in the transcript */
    while (r < n2 && r < n1 + 3) if (got[r++] == 2) break;
    int second[64], ns = chat_ids("<s>[INST] yo [/INST]", second), tail = n2 - r - ns; /* turn 2's reply */
    expect(rc == 0 && n2 > n1 && !memcmp(got, first, (size_t)n1 * sizeof(int)) && (r == n1 + 3 || got[r - 1] == 2) &&
           tail >= 1 && tail <= 3 && !memcmp(got + r, second, (size_t)ns * sizeof(int)),
           "--chat llama2 -n 3: turn 1, its reply (%d ids), then turn 2 from <s>, its reply (%d ids)", r - n1, tail);
    /* llama2.c's tokenizer.bin spells the markers "\n<s>\n" and "\n</s>\n": found too */
    chat_tok_file(tmp_file("chat_tok.bin"), "\n<s>\n", "\n</s>\n");
    chat_expect_ids("llama2, markers spelled as llama2.c's tokenizer.bin", "--template llama2",
                    "<s>[INST] hi [/INST]<s>[INST] yo [/INST]");
    /* ChatML, as SmolLM2's template writes it: <|im_start|> (id 1) role "\n" text <|im_end|> (id 2) "\n"; no
     * BOS; without -y the template's own system prompt; the default template once the vocabulary has <|im_start|> */
    chat_tok_file(tmp_file("chat_tok.bin"), "<|im_start|>", "<|im_end|>");
    chat_expect_ids("--template chatml -y 'Be brief.'", "--template chatml -y 'Be brief.'",
                    "<s>system\nBe brief.</s>\n<s>user\nhi</s>\n<s>assistant\n\n<s>user\nyo</s>\n<s>assistant\n");
    chat_expect_ids("--template chatml -y ''", "--template chatml -y ''",
                    "<s>user\nhi</s>\n<s>assistant\n\n<s>user\nyo</s>\n<s>assistant\n");
    chat_expect_ids("(no --template: chatml for a vocabulary with <|im_start|>; SmolLM2's system prompt)", "",
                    "<s>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face</s>\n<s>user\nhi"
                    "</s>\n<s>assistant\n\n<s>user\nyo</s>\n<s>assistant\n");
    /* a vocabulary without the marker: the template is refused, naming it */
    chat_tok_file(tmp_file("chat_tok.bin"), "<s>", "<eos>");
    cli_expect("-m @T/chat.bin -z @T/chat_tok.bin --chat --template zephyr < /dev/null", 0,
               "--template zephyr: the tokenizer has no piece '</s>' (the template's end-of-turn marker)");
    /* the default model's characters have no '[': llama2's text cannot be encoded */
    cli_expect("--chat --template llama2 < /dev/null", 0, "--template llama2: text: character '['");
    remove(tmp_file("chat.bin"));
    remove(tmp_file("chat_tok.bin"));
    remove(tmp_file("chat_ids.txt"));
    remove(tmp_file("chat_turns.txt"));
}

/* A full context ends the conversation with one line and exit status 0, after
 * what fit: a turn that does not fit, and a reply that reaches the end. Bad
 * input and flags that do not go together: one line, exit status 1. */
static void test_chat_limits(void) {
    if (!have_kvt("--chat limits")) return;
    char out[8192];
    int ids[64];
    write_text(tmp_file("full.txt"), "1,5,7\n9,3\n4,4,4,4,4,4,4,4\n", 26);
    int rc = cli_run("--random 64,2,4,2,128,100,16 --chat -n 4 -t 0 --dump-tokens @T/full_ids.txt < @T/full.txt", out,
                     sizeof(out));
    int n = read_ints(tmp_file("full_ids.txt"), ids, 64);
    expect(rc == 0 && n == 13 && contains(out, "the context is full: turn 3 is 8 positions and 3 of the 16 are left"),
           "--chat: a turn that does not fit ends the conversation, exit 0, after the %d positions that fit", n);
    rc = cli_run("--random 64,2,4,2,128,100,12 --chat -n 4 -t 0 --dump-tokens @T/full_ids.txt < @T/full.txt", out,
                 sizeof(out));
    n = read_ints(tmp_file("full_ids.txt"), ids, 64);
    expect(rc == 0 && n == 12 && contains(out, "the context is full (12 positions): the reply stops here"),
           "--chat: a reply that fills the context stops there, exit 0 (%d positions)", n);
    rc = cli_run("--random 64,2,4,2,128,100,64 --chat -n 4 -t 0 --chunk 4 --chunks 3 --dump-tokens @T/full_ids.txt "
                 "< @T/full.txt", out, sizeof(out));
    n = read_ints(tmp_file("full_ids.txt"), ids, 64);
    expect(rc == 0 && n == 12 && contains(out, "the context is full (12 positions, --chunks)"),
           "--chat: a pool of 3 chunks of 4 is a context of 12, ended the same way (%d positions)", n);
    write_text(tmp_file("bad.txt"), "1,2\nx,1\n", 8);
    cli_expect("--random 64,2,4,2,128,100,64 --chat -n 2 < @T/bad.txt", 0,
               "--chat: turn skipped (a line of token ids): --tokens 'x,1': item 1 is not a token id");
    write_text(tmp_file("bad.txt"), "ROMEO\xc3\xa9\n", 8);
    cli_expect("--chat -n 2 < @T/bad.txt", 0, "--chat: turn skipped: text: character");
    /* a turn the vocabulary cannot encode (a tab) is skipped: the next is answered, and the exit is 1 */
    write_text(tmp_file("bad.txt"), "hi\na\tb\nbye\n", 11);
    rc = cli_run("--chat -n 2 -t 0 --dump-tokens @T/skip_ids.txt < @T/bad.txt", out, sizeof(out));
    expect(rc != 0 && contains(out, "turn skipped: text: character '\\x09'") && contains(out, "\nbye\n") &&
           contains(out, "1 turn(s) skipped"), "--chat: an unencodable turn 2 is skipped, turn 3 answered, exit 1: %.300s", out);
    /* a first turn that cannot fit is an error: nothing was answered */
    char *long_turn = (char *)kvt_malloc(5000);
    memset(long_turn, 'a', 5000);
    long_turn[599] = '\n';
    write_text(tmp_file("bad.txt"), long_turn, 600);
    cli_expect("--chat -n 2 < @T/bad.txt", 0, "--chat: turn 1 is 601 positions and the context holds 512: nothing can "
               "be answered");
    long_turn[599] = 'a';
    write_text(tmp_file("bad.txt"), long_turn, 5000); /* no newline, longer than any turn that fits */
    cli_expect("--chat -n 2 < @T/bad.txt", 0, "--chat: standard input line 1: longer than 4160 bytes");
    memset(long_turn, 0, 5000); /* /dev/zero's kind of input: refused at its first byte */
    write_text(tmp_file("bad.txt"), long_turn, 5000);
    cli_expect("--chat -n 2 < @T/bad.txt", 0, "--chat: standard input line 1: a NUL byte");
    free(long_turn);
    cli_expect("--chat --fork 2", 0, "--chat is a conversation in one sequence: drop --prompts, --fork");
    cli_expect("--chat --tokens 1,2", 0, "--chat reads its turns from standard input");
    cli_expect("--template zephyr", 0, "--template and -y/--system shape a conversation: add --chat");
    cli_expect("-y hello", 0, "--template and -y/--system shape a conversation: add --chat");
    cli_expect("--random 64,2,4,2,128,100,64 --chat --template llama2", 0, "a --random model chats with --template plain");
    cli_expect("--random 64,2,4,2,128,100,64 --chat -y hi", 0, "a --random model has no tokenizer");
    cli_expect("--chat --mode generate", 0, "--chat and --mode generate contradict each other");
    cli_expect("--mode talk", 0, "--mode 'talk': expected one of generate|chat");
    cli_expect("-m chat", 0, "-m chat: -m names the checkpoint here; llama2.c's -m chat is --mode chat (or --chat)");
    cli_expect("weights/model.bin -m weights/model.bin", 0, "the checkpoint is given twice");
    remove(tmp_file("full.txt"));
    remove(tmp_file("full_ids.txt"));
    remove(tmp_file("bad.txt"));
}

/* llama2.c's README commands, with this binary and the default model in place
 * of ./run and theirs: the checkpoint as the first argument, -t -n -i -z -y,
 * and its chat mode spelled --mode chat. Each runs and exits 0. */
static void test_llama2c_commands(void) {
    if (!have_kvt("llama2.c's commands")) return;
    write_text(tmp_file("say.txt"), "ROMEO: Good morrow.\n", 20);
    const char *cmds[] = {
        "weights/model.bin",                                              /* ./run stories15M.bin */
        "weights/model.bin -t 0.8 -n 256 -i \"One day, Lily met a Shoggoth\"", /* ./run stories42M.bin -t 0.8 ... */
        "weights/model.bin -z weights/tokenizer.bin -t 0.0",              /* ./run model.bin -z tok.bin ... */
        "weights/model.bin --mode chat < @T/say.txt",                     /* ./run llama2_7b_chat.bin -m chat */
        "weights/model.bin --mode chat -y \"KING HENRY:\" -i \"Once more\" < /dev/null", /* ... -m chat -y -i */
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        char out[16384];
        int rc = cli_run_to(cmds[i], 1, out, sizeof(out));
        expect(rc == 0 && strlen(out) > 20, "llama2.c's command line: kvt %s: exit 0, %zu bytes of text", cmds[i],
               strlen(out));
    }
    remove(tmp_file("say.txt"));
}

/* --dump-attn's CSV into [query][layer][head][key] (NAN where absent): the
 * number of lines read, or -1 for a malformed line or an index out of range. */
#define ATT_Q 16
#define ATT_L 4
#define ATT_H 8
static int attn_read(const char *path, float *w) {
    for (int i = 0; i < ATT_Q * ATT_L * ATT_H * ATT_Q; i++) w[i] = NAN;
    FILE *f = fopen(path, "r");
    char head[64];
    if (!f || !fgets(head, sizeof(head), f) || strcmp(head, "query,layer,head,key,weight\n")) { if (f) fclose(f); return -1; }
    int q, l, h, k, n = 0;
    float v;
    while (fscanf(f, "%d,%d,%d,%d,%f", &q, &l, &h, &k, &v) == 5) {
        if (q < 0 || q >= ATT_Q || l < 0 || l >= ATT_L || h < 0 || h >= ATT_H || k < 0 || k > q) { n = -1; break; }
        w[((q * ATT_L + l) * ATT_H + h) * ATT_Q + k] = v;
        n++;
    }
    fclose(f);
    return n;
}
/* The weights of the layer-0 attention of the default model in float64,
 * computed here from the checkpoint alone: embedding, rmsnorm, wq and wk,
 * RoPE (adjacent pairs, theta^(-2i/HS) with the model's base theta), q.k /
 * sqrt(HS), softmax over the keys 0..p. out [p][h][t] for p < n. */
static void attn_layer0_ref(const kvt_model *m, const int *tok, int n, double *out) {
    int D = m->c.dim, NH = m->c.n_heads, NKV = m->c.n_kv_heads, HS = m->head_size, KVD = m->kv_dim;
    double *q = (double *)kvt_malloc((size_t)n * D * sizeof(double)), *k = (double *)kvt_malloc((size_t)n * KVD * sizeof(double));
    double *xb = (double *)kvt_malloc((size_t)D * sizeof(double));
    for (int p = 0; p < n; p++) {
        const float *x = m->w.token_embedding + (size_t)tok[p] * D;
        double ss = 0;
        for (int c = 0; c < D; c++) ss += (double)x[c] * x[c];
        for (int c = 0; c < D; c++) xb[c] = m->w.rms_att[c] * (x[c] / sqrt(ss / D + 1e-5));
        for (int o = 0; o < D; o++) {
            double acc = 0;
            for (int c = 0; c < D; c++) acc += m->w.wq[(size_t)o * D + c] * xb[c];
            q[(size_t)p * D + o] = acc;
        }
        for (int o = 0; o < KVD; o++) {
            double acc = 0;
            for (int c = 0; c < D; c++) acc += m->w.wk[(size_t)o * D + c] * xb[c];
            k[(size_t)p * KVD + o] = acc;
        }
        for (int o = 0; o < D + KVD; o += 2) { /* rotate each adjacent pair by p * theta^(-2i/HS) */
            double *v = o < D ? q + (size_t)p * D + o : k + (size_t)p * KVD + (o - D);
            double a = p * pow((double)m->rope_theta, -(double)(o % HS) / HS), x0 = v[0], x1 = v[1];
            v[0] = x0 * cos(a) - x1 * sin(a);
            v[1] = x0 * sin(a) + x1 * cos(a);
        }
    }
    for (int p = 0; p < n; p++)
        for (int h = 0; h < NH; h++) {
            double *o = out + ((size_t)p * NH + h) * n, mx = -INFINITY, z = 0;
            for (int t = 0; t <= p; t++) {
                double s = 0;
                for (int c = 0; c < HS; c++) s += q[(size_t)p * D + h * HS + c] * k[(size_t)t * KVD + (h / (NH / NKV)) * HS + c];
                o[t] = s / sqrt((double)HS);
                mx = fmax(mx, o[t]);
            }
            for (int t = 0; t <= p; t++) z += (o[t] = exp(o[t] - mx));
            for (int t = 0; t <= p; t++) o[t] /= z;
        }
    free(q);
    free(k);
    free(xb);
}
/* The probe of the API test: layer 0's rows, kept by position. */
typedef struct { double *w; int n, NH, rows; } attn_capture;
static void attn_capture_rows(void *ctx, int layer, int n, const int *pos, const float *w, int NH, int TMAX) {
    attn_capture *c = (attn_capture *)ctx;
    KVT_ASSERT(layer == 0 && NH == c->NH);
    for (int r = 0; r < n; r++) {
        KVT_ASSERT(pos[r] < c->n);
        for (int h = 0; h < NH; h++)
            for (int t = 0; t <= pos[r]; t++) c->w[((size_t)pos[r] * NH + h) * c->n + t] = w[((size_t)r * NH + h) * TMAX + t];
        c->rows++;
    }
}
/* The engine's layer-0 weights against ref (attn_layer0_ref's layout) on one
 * path (0 cpu naive, 1 cpu fused, 2 gpu naive, 3 gpu fused): a prefill of
 * `prefill` rows, then one token a step up to n. The largest difference (NaN
 * for a row never handed over); *rows: the rows the probe saw. */
static double probe_vs_ref(kvt_model *m, const int *tok, int n, int prefill, int path, const double *ref, int *rows) {
    int NH = m->c.n_heads;
    kvt_options o;
    kvt_options_default(&o);
    o.device = path >= 2 ? KVT_GPU : KVT_CPU;
    o.attn = path % 2 ? KVT_ATTN_FUSED : KVT_ATTN_NAIVE;
    attn_capture c = {(double *)kvt_malloc((size_t)n * NH * n * sizeof(double)), n, NH, 0};
    for (size_t i = 0; i < (size_t)n * NH * n; i++) c.w[i] = NAN;
    o.attn_probe = attn_capture_rows;
    o.attn_ctx = &c;
    o.attn_layer = 0;
    float *logits = (float *)kvt_malloc((size_t)m->c.vocab_size * sizeof(float));
    kvt_engine *e;
    kvt_seq s;
    KVT_ASSERT(kvt_engine_create(&e, m, &o) == KVT_OK && kvt_seq_init(e, &s) == KVT_OK);
    KVT_ASSERT(kvt_forward(e, &s, tok, prefill, logits, 0) == KVT_OK);
    for (int p = prefill; p < n; p++) KVT_ASSERT(kvt_forward(e, &s, tok + p, 1, logits, 0) == KVT_OK);
    double worst = 0;
    for (int p = 0; p < n; p++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t <= p; t++) {
                double d = fabs(c.w[((size_t)p * NH + h) * n + t] - ref[((size_t)p * NH + h) * n + t]);
                worst = d > worst || d != d ? d : worst; /* a NaN (a row never handed over) stays */
            }
    *rows = c.rows;
    kvt_seq_free(e, &s);
    kvt_engine_free(e);
    free(c.w);
    free(logits);
    return worst;
}
static void test_dump_attn(void) {
    /* the engine's probe against the float64 layer 0, on every path: a prefill of 6 rows, then 4 decode steps */
    kvt_model m;
    KVT_ASSERT(kvt_model_load(&m, "weights/model.bin") == KVT_OK);
    int tok[10] = {1, 30, 27, 25, 27, 26, 17, 3, 34, 53}, n = 10, NH = m.c.n_heads;
    double *ref = (double *)kvt_malloc((size_t)n * NH * n * sizeof(double));
    attn_layer0_ref(&m, tok, n, ref);
    for (int path = 0; path < 4; path++) {
        if (path >= 2 && !kvt_gpu_available()) { skip("attention probe on the GPU: no CUDA device"); continue; }
        int rows;
        double worst = probe_vs_ref(&m, tok, n, 6, path, ref, &rows);
        expect(rows == n && worst <= TOL_ATTN, "attention probe, %s %s, default model: layer 0's weights of %d rows "
               "(6 prefill + 4 decode) = float64 from the checkpoint within TOL_ATTN = %.0e (worst %.2e)",
               path >= 2 ? "gpu" : "cpu", path % 2 ? "fused" : "naive", rows, TOL_ATTN, worst);
    }
    free(ref);
    kvt_model_free(&m);
    if (!have_kvt("--dump-attn on the command line")) return;
    /* the command line: 7 prompt positions + 5 generated = 12 rows, every layer and head */
    size_t cells = (size_t)ATT_Q * ATT_L * ATT_H * ATT_Q;
    float *w[4];
    const char *runs[4] = {"--attn naive", "--attn fused", kvt_gpu_available() ? "--device gpu --kv-cache off" :
                           "--kv-cache off", "--dump-attn-layer 2"};
    int lines[4], rows = 12, want_lines = 0;
    for (int q = 0; q < rows; q++) want_lines += ATT_L * ATT_H * (q + 1);
    for (int i = 0; i < 4; i++) {
        char args[256], out[4096];
        snprintf(args, sizeof(args), "-n 6 -t 0 %s --dump-attn @T/attn.csv", runs[i]);
        int rc = cli_run(args, out, sizeof(out));
        w[i] = (float *)kvt_malloc(cells * sizeof(float));
        lines[i] = rc == 0 ? attn_read(tmp_file("attn.csv"), w[i]) : -1;
    }
    double worst_sum = 0;
    int complete = 1;
    for (int q = 0; q < ATT_Q; q++)
        for (int l = 0; l < ATT_L; l++)
            for (int h = 0; h < ATT_H; h++) {
                double sum = 0;
                int have = 0;
                for (int k = 0; k <= q; k++) {
                    float v = w[0][((q * ATT_L + l) * ATT_H + h) * ATT_Q + k];
                    if (v == v) { sum += v; have++; }
                }
                complete &= have == (q < rows ? q + 1 : 0);
                if (have) worst_sum = fmax(worst_sum, fabs(sum - 1.0));
            }
    expect(lines[0] == want_lines && complete && worst_sum <= TOL_OP, "--dump-attn naive: %d lines, every layer and head "
           "of the %d rows, keys 0..query; each row sums to 1 within TOL_OP = %.0e (worst %.2e)", lines[0], rows, TOL_OP,
           worst_sum);
    /* TOL_ATTN: the naive and fused runs differ only in rounding, which reaches later layers' q and K */
    for (int i = 1; i < 4; i++) {
        double worst = 0;
        int same = 1;
        for (size_t c = 0; c < cells; c++) {
            int layer = (int)(c / ATT_Q / ATT_H % ATT_L);
            float a = w[0][c], b = w[i][c];
            if (i == 3 && layer != 2) { same &= b != b; continue; } /* only layer 2 was asked for */
            if ((a == a) != (b == b)) same = 0;
            else if (a == a) worst = fmax(worst, fabs((double)a - b));
        }
        expect(lines[i] == (i == 3 ? want_lines / ATT_L : want_lines) && same && worst <= TOL_ATTN,
               "--dump-attn %s: the same rows as --attn naive, weights within TOL_ATTN = %.0e (worst %.2e)", runs[i],
               TOL_ATTN, worst);
    }
    for (int i = 0; i < 4; i++) free(w[i]);
    cli_expect("--dump-attn-layer 4 --dump-attn @T/attn.csv", 0, "--dump-attn-layer 4: this model's layers are 0..3");
    cli_expect("--dump-attn-layer 1", 0, "--dump-attn-layer and --dump-attn-max shape --dump-attn: add --dump-attn FILE");
    cli_expect("--fork 2 --dump-attn @T/attn.csv", 0, "--dump-attn records one sequence's run");
    cli_expect("--dump-attn /nonexistent-dir/a.csv", 0, "--dump-attn: cannot write '/nonexistent-dir/a.csv'");
    remove(tmp_file("attn.csv"));
}

/* The RoPE base a checkpoint carries (§4's "rope" extension): a random model
 * written with base 500000 loads with that base and unchanged weights, and the
 * engine's layer-0 attention, on every path, equals float64 with base 500000
 * (and is far from base 10000's, so a base that was ignored fails here). A
 * damaged extension is refused; a llama2.c file loads as base 10000, its
 * weights byte for byte the file's. */
static void test_rope_base(void) {
    kvt_model m, m2;
    KVT_ASSERT(kvt_model_random(&m, cfg(64, 2, 4, 2, 96, 97, 64), 41) == KVT_OK);
    expect(m.rope_theta == 10000.0f, "random model: RoPE base 10000 (%g)", m.rope_theta);
    const char *p = tmp_file("rope.bin");
    struct { char magic[4]; float theta; } ext = {{'r', 'o', 'p', 'e'}, 500000.0f};
    kvt_config hdr = m.c; /* as write_checkpoint writes it: a negative V for the unshared classifier */
    hdr.vocab_size = m.shared_classifier ? hdr.vocab_size : -hdr.vocab_size;
    FILE *f = fopen(p, "wb");
    KVT_ASSERT(f && fwrite(&hdr, sizeof(hdr), 1, f) == 1 && fwrite(&ext, 8, 1, f) == 1 &&
               fwrite(m.data, 4, m.n_floats, f) == m.n_floats && fclose(f) == 0);
    kvt_status st = kvt_model_load(&m2, p);
    expect(st == KVT_OK && m2.rope_theta == 500000.0f && m2.n_floats == m.n_floats &&
           !memcmp(m2.data, m.data, m.n_floats * 4), "checkpoint with the RoPE extension: base %g, weights unchanged (%s)",
           st == KVT_OK ? m2.rope_theta : 0.0, st == KVT_OK ? "loaded" : kvt_last_error());
    if (st != KVT_OK) { kvt_model_free(&m); return; }
    int tok[12] = {1, 30, 27, 25, 27, 26, 17, 3, 34, 53, 96, 60}, n = 12, NH = m2.c.n_heads;
    double *ref = (double *)kvt_malloc((size_t)n * NH * n * sizeof(double));
    double *ref10k = (double *)kvt_malloc((size_t)n * NH * n * sizeof(double));
    attn_layer0_ref(&m2, tok, n, ref);
    m.rope_theta = 10000.0f;
    attn_layer0_ref(&m, tok, n, ref10k);
    double apart = 0; /* the weights of keys t <= q (the rest of each row is not written) */
    for (int q = 0; q < n; q++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t <= q; t++)
                apart = fmax(apart, fabs(ref[((size_t)q * NH + h) * n + t] - ref10k[((size_t)q * NH + h) * n + t]));
    expect(apart > 100 * TOL_ATTN, "RoPE base 500000 vs 10000 in float64: layer 0's weights differ by %.2e (> 100 x "
           "TOL_ATTN), so the check below can tell the bases apart", apart);
    for (int path = 0; path < 4; path++) {
        if (path >= 2 && !kvt_gpu_available()) { skip("RoPE base on the GPU: no CUDA device"); continue; }
        int rows;
        double worst = probe_vs_ref(&m2, tok, n, 7, path, ref, &rows);
        expect(rows == n && worst <= TOL_ATTN, "RoPE base 500000, %s %s: layer 0's weights of %d rows (7 prefill + "
               "5 decode) = float64 with base 500000 within TOL_ATTN = %.0e (worst %.2e)", path >= 2 ? "gpu" : "cpu",
               path % 2 ? "fused" : "naive", rows, TOL_ATTN, worst);
    }
    kvt_model_free(&m2);
    /* a damaged extension: wrong magic, a base <= 1, a NaN base, 1e30 and above (weights/kvt_files.py's
     * theta_problem refuses the same bases); the message names what failed, the magic or the base */
    struct { char magic[4]; float theta; const char *say; } bad[5] = {
        {{'r', 'o', 'p', 'f'}, 500000.0f, "are not \"rope\""}, {{'r', 'o', 'p', 'e'}, 1.0f, "base 1 is outside (1, 1e30)"},
        {{'r', 'o', 'p', 'e'}, NAN, "base nan is outside"}, {{'r', 'o', 'p', 'e'}, 1e30f, "base 1e+30 is outside"},
        {{'r', 'o', 'p', 'e'}, 1e31f, "base 1e+31 is outside"}};
    for (int b = 0; b < 5; b++) {
        f = fopen(p, "wb");
        KVT_ASSERT(f && fwrite(&hdr, sizeof(hdr), 1, f) == 1 && fwrite(&bad[b], 8, 1, f) == 1 &&
                   fwrite(m.data, 4, m.n_floats, f) == m.n_floats && fclose(f) == 0);
        st = kvt_model_load(&m2, p);
        expect(st == KVT_EFORMAT && contains(kvt_last_error(), bad[b].say), "checkpoint with a damaged RoPE extension "
               "(%.4s, %g) refused: %s", bad[b].magic, bad[b].theta, st == KVT_OK ? "loaded" : kvt_last_error());
        if (st == KVT_OK) kvt_model_free(&m2);
    }
    /* llama2.c's file: base 10000, the weights exactly the bytes after the 28-byte header */
    size_t bytes = 0;
    char *raw = read_all("weights/model.bin", &bytes);
    st = kvt_model_load(&m2, "weights/model.bin");
    expect(raw && st == KVT_OK && m2.rope_theta == 10000.0f && bytes == 28 + m2.n_floats * 4 &&
           !memcmp(raw + 28, m2.data, m2.n_floats * 4), "llama2.c checkpoint (weights/model.bin): base 10000, weights "
           "byte for byte the file's");
    if (st == KVT_OK) kvt_model_free(&m2);
    free(raw);
    free(ref);
    free(ref10k);
    kvt_model_free(&m);
}

/* SmolLM2-135M-Instruct (`make smollm2`: the GGUF converted by
 * weights/export_gguf.py) against transformers loading the same GGUF in
 * float32 (weights/smollm2_logits.txt, written once by
 * weights/make_smollm2_reference.py: per prompt its ids, per position the
 * row's largest |logit| and ~112 of its logits). Every row must agree within
 * 1e-4 of the row's largest |logit|, on paths that differ in what they reuse:
 * cache on (half prefilled, then one token a step; fused, naive, and on a
 * GPU the first prompt), cache off (one call; the first prompt one token a
 * step, every step recomputing the sequence). Without the model: one skip
 * line. KVT_SMOLLM2_DIR points at another folder. */
typedef struct { int n, *ids, *cells; double *maxabs; int *cell_id; float *cell_val; } smol_prompt;
static int smol_read_ref(const char *path, smol_prompt *pr, int max_prompts) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    static char line[16384];
    int np = 0, row = 0;
    while (fgets(line, sizeof(line), f)) {
        char *p = line, *end;
        if (!strncmp(line, "prompt ", 7) && np < max_prompts) {
            smol_prompt *q = &pr[np++];
            q->n = (int)strtol(p + 7, &end, 10);
            q->ids = (int *)kvt_malloc((size_t)q->n * sizeof(int));
            q->cells = (int *)kvt_malloc((size_t)q->n * sizeof(int));
            q->maxabs = (double *)kvt_malloc((size_t)q->n * sizeof(double));
            q->cell_id = (int *)kvt_malloc((size_t)q->n * 256 * sizeof(int));
            q->cell_val = (float *)kvt_malloc((size_t)q->n * 256 * sizeof(float));
            for (int i = 0; i < q->n; i++) q->ids[i] = (int)strtol(end, &end, 10);
            row = 0;
        } else if (!strncmp(line, "row ", 4) && np > 0 && row < pr[np - 1].n) {
            smol_prompt *q = &pr[np - 1];
            KVT_ASSERT(strtol(p + 4, &end, 10) == row);
            q->maxabs[row] = strtod(end, &end);
            int c = 0;
            while (c < 256) {
                long id = strtol(end, &p, 10);
                if (p == end || *p != ':') break;
                q->cell_id[row * 256 + c] = (int)id;
                q->cell_val[row * 256 + c++] = strtof(p + 1, &end);
            }
            q->cells[row++] = c;
        }
    }
    fclose(f);
    return np;
}
static void test_smollm2_logits(void) {
    const char *dir = getenv("KVT_SMOLLM2_DIR");
    char path[512], msg[640];
    snprintf(path, sizeof(path), "%s/model.bin", dir ? dir : "weights/smollm2");
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        snprintf(msg, sizeof(msg), "SmolLM2 logits vs transformers: no %s (get it with `make smollm2`)", path);
        skip(msg);
        return;
    }
    fclose(probe);
    smol_prompt pr[4];
    int np = smol_read_ref("weights/smollm2_logits.txt", pr, 4);
    expect(np == 3, "weights/smollm2_logits.txt: 3 prompts (%d)", np);
    kvt_model m;
    kvt_status st = kvt_model_load(&m, path);
    expect(st == KVT_OK && m.rope_theta == 100000.0f && m.c.dim == 576 && m.c.n_layers == 30 && m.c.vocab_size == 49152,
           "SmolLM2: %s loads (D 576, L 30, V 49152, RoPE base 100000): %s", path, st == KVT_OK ? "yes" : kvt_last_error());
    if (st != KVT_OK || np != 3) return;
    int V = m.c.vocab_size, maxn = 0;
    for (int i = 0; i < np; i++) maxn = pr[i].n > maxn ? pr[i].n : maxn;
    float *logits = (float *)kvt_malloc((size_t)maxn * V * sizeof(float));
    const char *names[5] = {"cache on, fused", "cache on, naive", "cache off, fused", "cache off, naive",
                            "gpu, cache on, fused"};
    for (int c = 0; c < 5; c++) {
        if (c == 4 && (KVT_EMULATED || !kvt_gpu_available())) { /* random models test the emulated kernels */
            skip("SmolLM2 on the GPU: a device only (emulated, its 135M weights take half a minute)");
            continue;
        }
        kvt_options o;
        kvt_options_default(&o);
        o.device = c == 4 ? KVT_GPU : KVT_CPU;
        o.attn = c % 2 ? KVT_ATTN_NAIVE : KVT_ATTN_FUSED;
        o.kv_cache = c == 2 || c == 3 ? 0 : 1;
        o.CH = 16;
        o.n_chunks = 4; /* 64 positions: the longest prompt is 43 */
        kvt_engine *e;
        KVT_ASSERT(kvt_engine_create(&e, &m, &o) == KVT_OK);
        for (int i = 0; i < np && (c < 4 || i == 0); i++) {
            kvt_seq s;
            KVT_ASSERT(kvt_seq_init(e, &s) == KVT_OK);
            /* one call for the whole prompt (cache off), a prefill of half then one token a step (cache on); the
             * first prompt with the cache off: one token a step, each step recomputing the sequence */
            int first = o.kv_cache ? pr[i].n / 2 : i == 0 ? 1 : pr[i].n;
            st = kvt_forward(e, &s, pr[i].ids, first, logits, 1);
            for (int t = first; t < pr[i].n && st == KVT_OK; t++)
                st = kvt_forward(e, &s, pr[i].ids + t, 1, logits + (size_t)t * V, 0);
            double worst = 0;
            int at = -1;
            for (int r = 0; r < pr[i].n && st == KVT_OK; r++)
                for (int k = 0; k < pr[i].cells[r]; k++) {
                    double d = fabs(logits[(size_t)r * V + pr[i].cell_id[r * 256 + k]] - pr[i].cell_val[r * 256 + k]) /
                               pr[i].maxabs[r];
                    if (!(d <= worst)) worst = d, at = r;
                }
            expect(st == KVT_OK && worst <= 1e-4, "SmolLM2 prompt %d (%d tokens), %s: every row's logits = "
                   "transformers' within 1e-4 of its largest |logit| (worst %.2e, row %d)", i + 1, pr[i].n, names[c],
                   worst, at);
            kvt_seq_free(e, &s);
        }
        kvt_engine_free(e);
    }
    for (int i = 0; i < np; i++) {
        free(pr[i].ids); free(pr[i].cells); free(pr[i].maxabs); free(pr[i].cell_id); free(pr[i].cell_val);
    }
    free(logits);
    kvt_model_free(&m);
}
