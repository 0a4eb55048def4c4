/* kvtransformer §20, serving: many requests, one pool (--serve). Included by
 * cli/cli.c; the engine calls it makes are all public (kvtransformer.h).
 *
 * A trace says when each request arrives, its prompt and how many tokens it
 * may generate. The scheduler runs the engine one step at a time (iteration-
 * level scheduling, as in Orca and vLLM): each step is ONE kvt_forward_batch
 * call with a decode row for every running request and, in the token budget
 * left, prefill rows of admitted ones (a long prompt takes several steps:
 * chunked prefill). Requests join and leave between steps; nobody waits for
 * the longest one to finish (continuous batching).
 *
 *   arrivals -> waiting --admit--> running --finish--> done
 *                  ^                  |  |
 *                  +-- recompute -----+  +-- swap out --> swapped --swap in--> running
 *
 * Memory is the pool's chunks. A request is admitted when its whole prompt
 * fits (reserved at admission) with `watermark` chunks left for the running
 * ones to grow into. When a running request needs a chunk and none is free,
 * the latest-arrived running request is preempted: by recompute (its chunks
 * are freed; later it prefills prompt + output again) or by swap (the chunks
 * it alone holds are copied to the host swap area; later they come back).
 * The oldest running request is never preempted, so it always progresses.
 *
 * Two clocks: "measured" adds up each step's measured time (scheduling,
 * forward, sampling, swap copies), skipping idle gaps; "steps" gives a step
 * a stated cost, SV_STEP_MS + SV_ROW_MS per row, the same on every machine. */

#define SV_STEP_MS 1.0  /* --serve-clock steps: a step's fixed cost (weights read once) */
#define SV_ROW_MS 0.1   /* ... and its cost per row */
#define SV_LINK_GBS 25.0 /* the modelled host link for swap copies: PCIe 4.0 x16 */

enum { SV_FUTURE, SV_WAITING, SV_RUNNING, SV_SWAPPED, SV_DONE };

typedef struct {
    int id;            /* its line's order in the trace: 0, 1, 2, ... */
    long line;         /* the trace line it came from (messages) */
    double arrival;    /* ms */
    int max_new;       /* tokens it may generate (capped so that prompt + max_new <= TMAX) */
    int capped;        /* 1: the trace asked for more than TMAX allows */
    int *hist;         /* (TMAX + 1) the prompt, then the generated tokens */
    int n_prompt, n_out;
    int state;         /* SV_* */
    kvt_seq seq;       /* live while running or swapped */
    int reserve;       /* chunks its rows will still take (reserved at admission) */
    int batch;         /* --serve-policy static: the batch it was admitted with (1, 2, ...) */
    int rows;          /* rows it gets in this step's call */
    double admitted, first, finish; /* ms; -1 until then */
    int preempts, swaps, reused;    /* preemptions (both kinds), swap-outs, prefix positions attached */
    const char *reason; /* "eos", "stop", "max_new", "length" */
    char *text;        /* the generated text (a tokenizer's model) */
    size_t text_len, text_cap;
    kvt_sampler smp;
} sv_req;

/* --serve-policy: what admission reserves, and when it may admit */
enum { SV_CONTINUOUS, SV_RESERVE, SV_STATIC };

typedef struct {
    int max_running, max_batch, watermark, swap, clock_steps;
    int policy;                  /* SV_CONTINUOUS: the prompt's chunks at admission, the rest as positions
                                  * arrive; SV_RESERVE: prompt + max_new at admission (Orca); SV_STATIC: as
                                  * SV_RESERVE, and a new batch only when the previous one has finished */
    int nocache;                 /* --kv-cache off: a request's cache is dropped after each token and its
                                  * whole history prefilled again (as a recompute preemption, FCFS) */
    int batches;                 /* SV_STATIC: batches started */
    const char *stop;            /* end a request when its text contains this */
    FILE *trace;                 /* --trace in serve mode, or NULL */
    int check_pool;              /* kvt_pool_check after every step (the tests) */
    /* the tests' look at every sampled position: the logits it sampled from */
    void (*on_logits)(void *ctx, const sv_req *r, const float *logits);
    void *ctx;
    /* figures, filled by serve_run */
    long steps, out_tokens, recomputed, fallbacks, collisions;
    int peak_running, peak_swapped, peak_chunks;
    double run_ms_sum, util_sum, unused_sum, clock_ms; /* time-weighted sums (ms) */
    double t_sched, t_forward;   /* seconds, measured */
    double swap_out_bytes, swap_in_bytes, t_swap;
} sv_cfg;

/* ---- the trace file --------------------------------------------------------- */

/* "a\tb\\n" escapes in a prompt: \n, \t, \\ (anything else after \ is an error). */
static int sv_unescape(char *s) {
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p != '\\') { *o++ = *p; continue; }
        p++;
        if (*p == 'n') *o++ = '\n';
        else if (*p == 't') *o++ = '\t';
        else if (*p == '\\') *o++ = '\\';
        else return 0;
    }
    *o = '\0';
    return 1;
}
/* A number made of digits only (arrival_ms, max_new), at most lim. */
static int sv_number(const char *s, long lim, long *out) {
    long v = 0;
    if (!*s) return 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return 0;
        v = v * 10 + (*s - '0');
        if (v > lim) return 0;
    }
    *out = v;
    return 1;
}

/* Read the whole trace; every request is encoded here, so a bad line is
 * reported before anything runs. Returns the number of requests, or -1 with
 * the message set (and *reqs freed). */
static int sv_read_trace(const char *path, const kvt_tokenizer *tk, const kvt_model *m, sv_req **reqs) {
    int TMAX = m->c.seq_len, V = m->c.vocab_size, n = 0, cap = 0, bad = 0;
    FILE *f;
    *reqs = NULL;
    if (kvt_open_read(&f, path, "--serve trace") != KVT_OK) return -1;
    char *text = NULL, what[320];
    size_t text_cap = 0;
    long line = 0;
    double last = 0;
    int got;
    snprintf(what, sizeof(what), "--serve '%s'", path);
    /* a prompt's escapes take 2 bytes a character: twice a line of text, and the two numbers */
    while (!bad && (got = next_line(f, &text, &text_cap, 2 * line_max(tk, TMAX), &line, what)) != 0) {
        if (got < 0) { bad = 1; break; }
        if (!text[0] || text[0] == '#') continue;
        char *t1 = strchr(text, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        long arr, mx;
        if (!t2) {
            kvt_fail(KVT_EARG, "--serve '%s' line %ld: expected arrival_ms<TAB>max_new<TAB>prompt", path, line);
            bad = 1;
            break;
        }
        *t1 = *t2 = '\0';
        if (!sv_number(text, 1000000000L, &arr) || !sv_number(t1 + 1, KVT_LIMIT_SEQ, &mx) || mx < 1) {
            kvt_fail(KVT_EARG, "--serve '%s' line %ld: arrival_ms must be digits (at most 10^9) and max_new digits "
                     "in [1, %d]: got '%s' and '%s'", path, line, KVT_LIMIT_SEQ, text, t1 + 1);
            bad = 1;
            break;
        }
        if (n && (double)arr < last) { /* refused, not sorted: the file's order is the requests' numbering */
            kvt_fail(KVT_EARG, "--serve '%s' line %ld: arrival %ld ms is before the previous request's %.0f ms "
                     "(arrival times must not decrease)", path, line, arr, last);
            bad = 1;
            break;
        }
        char *prompt = t2 + 1;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            *reqs = (sv_req *)realloc(*reqs, (size_t)cap * sizeof(sv_req));
            KVT_ASSERT(*reqs);
        }
        sv_req *r = &(*reqs)[n];
        memset(r, 0, sizeof(*r));
        r->hist = (int *)kvt_malloc((size_t)(TMAX + 1) * sizeof(int));
        n++;
        r->id = n - 1;
        r->line = line;
        r->arrival = (double)arr;
        last = r->arrival;
        kvt_status st;
        if (!strncmp(prompt, "ids:", 4)) st = parse_tokens(prompt + 4, V, TMAX, r->hist, &r->n_prompt);
        else if (!tk) st = kvt_fail(KVT_EARG, "a --random model has no tokenizer: give the prompt as ids:1,2,3");
        else if (!sv_unescape(prompt)) st = kvt_fail(KVT_EARG, "a backslash escape other than \\n, \\t, \\\\");
        else st = kvt_encode(tk, prompt, 1, r->hist, TMAX, &r->n_prompt);
        if (st == KVT_OK && r->n_prompt == 0) st = kvt_fail(KVT_EARG, "the prompt is empty");
        if (st == KVT_OK && r->n_prompt >= TMAX)
            st = kvt_fail(KVT_ECONTEXT, "the prompt is %d tokens: at most TMAX - 1 = %d (one token to generate)",
                          r->n_prompt, TMAX - 1);
        if (st != KVT_OK) {
            char msg[sizeof(kvt_errbuf)];
            snprintf(msg, sizeof(msg), "%s", kvt_errbuf);
            kvt_fail(KVT_EARG, "--serve '%s' line %ld: %s", path, line, msg);
            bad = 1;
            break;
        }
        r->max_new = (int)mx;
        if (r->n_prompt + r->max_new > TMAX) { r->max_new = TMAX - r->n_prompt; r->capped = 1; }
    }
    free(text);
    fclose(f);
    if (!bad && n == 0) { kvt_fail(KVT_EARG, "--serve: '%s' has no request (only comments or empty lines)", path); bad = 1; }
    if (bad) {
        for (int i = 0; i < n; i++) free((*reqs)[i].hist);
        free(*reqs);
        *reqs = NULL;
        return -1;
    }
    return n;
}
static void sv_free(sv_req *reqs, int n) {
    for (int i = 0; i < n && reqs; i++) { free(reqs[i].hist); free(reqs[i].text); kvt_sampler_free(&reqs[i].smp); }
    free(reqs);
}

/* ---- the scheduler ----------------------------------------------------------- */

static int sv_hist(const sv_req *r) { return r->n_prompt + r->n_out; } /* tokens so far; the last is not cached */
/* Running and past its prefill: one row a step for the token it sampled last. */
static int sv_decoding(const sv_req *r) {
    return r->state == SV_RUNNING && r->n_out > 0 && sv_hist(r) - r->seq.len == 1;
}

/* What preempting r would free: the chunks it alone holds and its reservation. */
static int sv_frees(kvt_engine *e, const sv_req *r) { return kvt_seq_private_chunks(e, &r->seq) + r->reserve; }

/* Preempt r (running or swapped): swap it out if asked and there is room,
 * else recompute (free everything; it prefills prompt + output again). */
static void sv_preempt(kvt_engine *e, sv_cfg *c, sv_req *r, int *avail) {
    *avail += sv_frees(e, r);
    r->preempts++;
    if (c->swap && r->state == SV_RUNNING && kvt_seq_swap_out(e, &r->seq) == KVT_OK) {
        r->reserve = 0;
        r->state = SV_SWAPPED;
        r->swaps++;
        return;
    }
    if (c->swap) c->fallbacks++; /* a full swap area, or a swapped request dropped */
    c->recomputed += r->seq.len;
    kvt_seq_free(e, &r->seq);
    r->reserve = 0;
    r->state = SV_WAITING;
}

/* Give r its rows for this step: decode one, or up to *budget of its prefill. */
static void sv_give_rows(kvt_engine *e, sv_req *r, int *budget, int *avail) {
    int CH = kvt_engine_pool(e)->CH, left = sv_hist(r) - r->seq.len;
    r->rows = left < *budget ? left : *budget;
    *budget -= r->rows;
    int take = kvt_cdiv(r->seq.len + r->rows, CH) - r->seq.n_table; /* chunks this step's rows take */
    int from_reserve = take < r->reserve ? take : r->reserve;
    r->reserve -= from_reserve;
    *avail -= take - from_reserve;
}

/* One request's token: sample, append, see whether it ends. */
static void sv_sample(kvt_engine *e, const kvt_tokenizer *tk, sv_cfg *c, sv_req *r, float *logits, double t_end) {
    int V = e->m->c.vocab_size;
    if (c->on_logits) c->on_logits(c->ctx, r, logits);
    int t = kvt_sample(&r->smp, logits, V);
    int prev = r->hist[sv_hist(r) - 1];
    r->hist[sv_hist(r)] = t;
    r->n_out++;
    c->out_tokens++;
    if (r->n_out == 1) r->first = t_end;
    if (tk && (t == tk->eos_id || t == tk->bos_id)) r->reason = "eos";
    if (!r->reason && tk && c->stop) {
        const char *piece = kvt_decode(tk, prev, t);
        size_t k = strlen(piece);
        if (r->text_len + k + 1 > r->text_cap) {
            r->text_cap = 2 * (r->text_len + k + 1);
            r->text = (char *)realloc(r->text, r->text_cap);
            KVT_ASSERT(r->text);
        }
        memcpy(r->text + r->text_len, piece, k + 1);
        r->text_len += k;
        char *at = strstr(r->text, c->stop);
        if (at) { r->reason = "stop"; *at = '\0'; r->text_len = (size_t)(at - r->text); }
    }
    if (!r->reason && r->n_out == r->max_new) r->reason = r->capped ? "length" : "max_new";
    if (!r->reason) return;
    r->finish = t_end;
    r->state = SV_DONE;
    r->reserve = 0; /* reserve/static: what it did not use goes back with its chunks */
    kvt_seq_free(e, &r->seq);
}

/* The queues in one line, for --trace: "waiting 4 5 | running 0 1 2 | swapped 3". */
static void sv_trace_queues(FILE *f, const sv_req *q, int n, int lo) {
    const char *names[] = {"waiting", "running", "swapped"};
    for (int k = 0; k < 3; k++) {
        fprintf(f, "%s%s", k ? " | " : "", names[k]);
        int shown = 0;
        for (int i = lo; i < n; i++)
            if (q[i].state == SV_WAITING + k) {
                if (shown++ < 24) fprintf(f, " %d", q[i].id);
            }
        if (shown > 24) fprintf(f, " ... (%d)", shown);
        if (!shown) fprintf(f, " -");
    }
}

/* Run the whole trace. Returns KVT_OK when every request finished. */
static kvt_status serve_run(kvt_engine *e, const kvt_tokenizer *tk, sv_req *q, int n, sv_cfg *c, double temperature,
                            double topp, long seed) {
    kvt_pool *p = kvt_engine_pool(e);
    int V = e->m->c.vocab_size, CH = p->CH, next = 0, lo = 0;
    kvt_status st = KVT_OK;
    kvt_seq **batch = (kvt_seq **)kvt_malloc((size_t)c->max_running * sizeof(kvt_seq *));
    sv_req **who = (sv_req **)kvt_malloc((size_t)c->max_running * sizeof(sv_req *));
    int *ntok = (int *)kvt_malloc((size_t)c->max_running * sizeof(int));
    int *tokens = (int *)kvt_malloc((size_t)c->max_batch * sizeof(int));
    float *logits = (float *)kvt_malloc((size_t)c->max_running * (size_t)V * sizeof(float));
    const kvt_seq **live = (const kvt_seq **)kvt_malloc((size_t)n * sizeof(kvt_seq *));
    for (int i = 0; i < n; i++) {
        kvt_sampler_init(&q[i].smp, V, (float)temperature, (float)topp, (uint64_t)(seed + q[i].id));
        q[i].admitted = q[i].first = q[i].finish = -1;
    }
    long col0 = p->prefix_collisions;
    double now = 0, swap0 = p->t_swap_out + p->t_swap_in;
    long out0 = p->swap_out_chunks, in0 = p->swap_in_chunks;
    if (c->trace) {
        kvt_pool_legend(c->trace);
        fprintf(c->trace, "serve: hK = swapped out to slot K of the host swap area; rows: prefill p, decode d\n");
    }
    while (st == KVT_OK && lo < n) {
        double t0 = kvt_now();
        int active = 0, nrun = 0, nswap = 0, preempted = 0, budget = c->max_batch, nb = 0;
        for (int i = lo; i < n; i++) active += q[i].state == SV_WAITING || q[i].state == SV_RUNNING || q[i].state == SV_SWAPPED;
        if (!active && next < n && q[next].arrival > now) now = q[next].arrival; /* idle: skip ahead */
        for (; next < n && q[next].arrival <= now; next++) q[next].state = SV_WAITING;
        int avail = p->n_free;
        for (int i = lo; i < n; i++) {
            q[i].rows = 0;
            if (q[i].state == SV_RUNNING) { nrun++; avail -= q[i].reserve; }
            nswap += q[i].state == SV_SWAPPED;
        }
        /* 1. Running requests that decode, oldest first: each needs a chunk when
         * its next position starts one. None free: preempt the latest-arrived
         * running request that frees something (it may be r itself; never the
         * oldest). Then swapped ones, latest first, are dropped to recompute. */
        int oldest = -1;
        for (int i = lo; i < n && oldest < 0; i++) if (q[i].state == SV_RUNNING) oldest = i;
        for (int i = lo; i < n; i++) {
            sv_req *r = &q[i];
            if (!sv_decoding(r)) continue;
            int need = kvt_cdiv(r->seq.len + 1, CH) - r->seq.n_table;
            need -= need < r->reserve ? need : r->reserve; /* reserve/static: it grows into its reservation */
            while (need > avail) {
                int v = -1;
                for (int j = n - 1; j > oldest && v < 0; j--)
                    if (q[j].state == SV_RUNNING && q[j].rows == 0 && sv_frees(e, &q[j]) > 0) v = j;
                for (int j = n - 1; j >= lo && v < 0; j--)
                    if (q[j].state == SV_SWAPPED && sv_frees(e, &q[j]) > 0) v = j;
                if (v < 0) break;
                if (q[v].state == SV_RUNNING) nrun--; else nswap--;
                sv_preempt(e, c, &q[v], &avail);
                preempted = 1;
                if (v == i) break;
            }
            if (r->state != SV_RUNNING || need > avail) continue; /* preempted itself, or waits a step */
            sv_give_rows(e, r, &budget, &avail);
        }
        /* 2. Running requests in prefill (or recompute), oldest first, in what is
         * left of the token budget: their chunks were reserved at admission. */
        for (int i = lo; i < n && budget > 0; i++)
            if (q[i].state == SV_RUNNING && q[i].rows == 0 && !sv_decoding(&q[i])) sv_give_rows(e, &q[i], &budget, &avail);
        /* 3. Swapped requests come back before new ones, oldest first, when the
         * pool has their chunks and the watermark (waived when nothing runs). */
        for (int i = lo; i < n && !preempted && nswap && budget > 0 && nrun < c->max_running; i++) {
            sv_req *r = &q[i];
            if (r->state != SV_SWAPPED) continue;
            int left = sv_hist(r) - r->seq.len;
            int grow = kvt_cdiv(r->seq.len + left, CH) - r->seq.n_table;
            if (r->seq.n_swapped + grow > avail - (nrun ? c->watermark : 0)) break;
            avail -= r->seq.n_swapped; /* the chunks it takes back */
            st = kvt_seq_swap_in(e, &r->seq);
            KVT_ASSERT(st == KVT_OK); /* counted above */
            r->state = SV_RUNNING;
            r->reserve = left > 1 ? grow : 0;
            avail -= r->reserve;
            nrun++;
            nswap--;
            sv_give_rows(e, r, &budget, &avail);
        }
        /* 4. Admission, first come first served, never past a head that does not
         * fit: its whole prompt (prefix reuse first) and the watermark. */
        int opened = 0, may_admit = c->policy != SV_STATIC || nrun == 0; /* static: a new batch */
        for (int i = lo; i < n && may_admit && !preempted && !nswap && budget > 0 && nrun < c->max_running; i++) {
            sv_req *r = &q[i];
            if (r->state == SV_FUTURE) break;
            if (r->state != SV_WAITING) continue;
            long h = p->prefix_hits, m = p->prefix_misses, k = p->prefix_collisions;
            st = kvt_seq_init(e, &r->seq);
            if (st != KVT_OK) break;
            r->seq.id = r->id;
            int got = kvt_seq_attach(e, &r->seq, r->hist, sv_hist(r));
            /* continuous: the positions it has; reserve/static: all it may ever cache */
            int upto = c->policy == SV_CONTINUOUS ? sv_hist(r) : r->n_prompt + r->max_new - 1;
            int need = kvt_cdiv(upto > sv_hist(r) ? upto : sv_hist(r), CH) - r->seq.n_table;
            if (need > avail - (nrun ? c->watermark : 0)) {
                kvt_seq_free(e, &r->seq); /* not yet: the counters as if it never looked */
                p->prefix_hits = h; p->prefix_misses = m; p->prefix_collisions = k;
                break;
            }
            r->reused += got;
            r->reserve = need;
            if (c->policy == SV_STATIC) { if (!opened++) c->batches++; r->batch = c->batches; }
            avail -= need;
            r->state = SV_RUNNING;
            nrun++;
            sv_give_rows(e, r, &budget, &avail);
        }
        /* 5. One forward call for every row of this step. */
        int rows = 0, prefill = 0;
        for (int i = lo; i < n; i++) {
            sv_req *r = &q[i];
            if (r->state != SV_RUNNING || r->rows == 0) continue;
            if (r->admitted < 0) r->admitted = now;
            memcpy(tokens + rows, r->hist + r->seq.len, (size_t)r->rows * sizeof(int));
            prefill += r->rows > 1 || sv_hist(r) - r->seq.len > 1 ? r->rows : 0;
            rows += r->rows;
            batch[nb] = &r->seq;
            who[nb] = r;
            ntok[nb++] = r->rows;
        }
        if (st != KVT_OK) break;
        if (nb == 0) { /* nothing can run now: wait for the next arrival (the pool fits every request alone) */
            if (next < n) { now = q[next].arrival; continue; }
            st = kvt_fail(KVT_EPOOL, "serve: no request can make progress at %.1f ms (pool %d chunks, %d free)", now,
                          p->n_chunks, p->n_free);
            break;
        }
        double t1 = kvt_now();
        st = kvt_forward_batch(e, batch, nb, tokens, ntok, logits);
        double t2 = kvt_now();
        if (st != KVT_OK) break;
        double dt = c->clock_steps ? SV_STEP_MS + SV_ROW_MS * rows : 0;
        /* the step's end, for first_token and finish: measured so far, or the stated cost */
        double t_end = now + (c->clock_steps ? dt : 1e3 * (kvt_now() - t0));
        for (int j = 0; j < nb; j++) {
            sv_req *r = who[j];
            if (r->seq.len != sv_hist(r)) continue; /* a prefill not yet at its last row */
            sv_sample(e, tk, c, r, logits + (size_t)j * V, t_end);
            /* --kv-cache off: a request that sampled and goes on drops its cache
             * and waits, at its place by arrival, to prefill its history again */
            if (c->nocache && r->state == SV_RUNNING) {
                c->recomputed += r->seq.len;
                kvt_seq_free(e, &r->seq);
                r->reserve = 0;
                r->state = SV_WAITING;
            }
        }
        if (!c->clock_steps) { dt = 1e3 * (kvt_now() - t0); t_end = now + dt; }
        /* figures of this step, weighted by its time */
        int nl = 0, running = 0, swapped = 0;
        for (int i = lo; i < n; i++) {
            if (q[i].state == SV_RUNNING || q[i].state == SV_SWAPPED) live[nl++] = &q[i].seq;
            running += q[i].state == SV_RUNNING;
            swapped += q[i].state == SV_SWAPPED;
        }
        kvt_cache_usage u;
        kvt_cache_usage_of(e, live, nl, &u);
        c->util_sum += dt * (double)(u.slots_allocated - u.slots_unused) / ((double)p->n_chunks * CH);
        c->unused_sum += dt * (double)u.slots_unused;
        c->run_ms_sum += dt * running;
        if (running > c->peak_running) c->peak_running = running;
        if (swapped > c->peak_swapped) c->peak_swapped = swapped;
        if (p->n_chunks - p->n_free > c->peak_chunks) c->peak_chunks = p->n_chunks - p->n_free;
        c->steps++;
        c->t_forward += t2 - t1;
        c->t_sched += kvt_now() - t0 - (t2 - t1);
        if (c->trace) {
            fprintf(c->trace, "== step %ld at %.1f ms: ", c->steps, now);
            sv_trace_queues(c->trace, q, n, lo);
            fprintf(c->trace, "; rows: prefill %d, decode %d\n", prefill, rows - prefill);
            kvt_pool_print(c->trace, e);
            if (ferror(c->trace)) st = kvt_fail(KVT_EIO, "--trace: a write failed: %s", strerror(errno));
        }
        if (st == KVT_OK && c->check_pool) st = kvt_pool_check(e, NULL, 0);
        now = t_end;
        while (lo < n && q[lo].state == SV_DONE) lo++;
    }
    c->clock_ms = now;
    c->collisions = p->prefix_collisions - col0;
    double cb = (double)kvt_dtype_size(p->dtype, p->chunk_elems) + (double)p->chunk_scales * sizeof(float);
    c->swap_out_bytes = cb * (double)(p->swap_out_chunks - out0);
    c->swap_in_bytes = cb * (double)(p->swap_in_chunks - in0);
    c->t_swap = p->t_swap_out + p->t_swap_in - swap0;
    free(batch); free(who); free(ntok); free(tokens); free(logits); free(live);
    return st;
}

/* ---- what it reports ---------------------------------------------------------- */

static int sv_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* Nearest rank: the smallest value with at least p% of the values at or below it. */
static double sv_rank(const double *v, int n, double pct) {
    int k = (int)ceil(pct / 100.0 * n);
    return n ? v[(k < 1 ? 1 : k) - 1] : 0;
}
static void sv_quantiles(FILE *f, const char *name, double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), sv_cmp_double);
    if (!n) { fprintf(f, "%s -", name); return; }
    fprintf(f, "%s p50 %.1f p90 %.1f %s %.1f", name, sv_rank(v, n, 50), sv_rank(v, n, 90), n < 100 ? "max" : "p99",
            n < 100 ? v[n - 1] : sv_rank(v, n, 99));
}
static void sv_summary(FILE *f, kvt_engine *e, const sv_req *q, int n, const sv_cfg *c) {
    kvt_pool *p = kvt_engine_pool(e);
    double *a = (double *)kvt_malloc((size_t)n * sizeof(double)), last = 0, mean = 0;
    int most = 0, k = 0;
    long reused = 0;
    for (int i = 0; i < n; i++) {
        last = q[i].finish > last ? q[i].finish : last;
        most = q[i].preempts > most ? q[i].preempts : most;
        reused += q[i].reused;
    }
    double span = last - q[0].arrival;
    fprintf(f, "[serve] %d requests, %ld output tokens in %.1f ms (%s clock, %ld steps): %.1f tokens/s, %.2f "
            "requests/s\n", n, c->out_tokens, span, c->clock_steps ? "steps" : "measured", c->steps,
            span > 0 ? 1e3 * c->out_tokens / span : 0, span > 0 ? 1e3 * n / span : 0);
    fprintf(f, "[serve] ms: ");
    for (int i = 0; i < n; i++) a[i] = q[i].first - q[i].arrival;
    sv_quantiles(f, "TTFT", a, n);
    k = 0;
    for (int i = 0; i < n; i++) if (q[i].n_out > 1) a[k++] = (q[i].finish - q[i].first) / (q[i].n_out - 1);
    sv_quantiles(f, "; TPOT", a, k);
    for (int i = 0; i < n; i++) { a[i] = q[i].finish - q[i].arrival; mean += a[i] / n; }
    qsort(a, (size_t)n, sizeof(double), sv_cmp_double);
    fprintf(f, "; latency mean %.1f %s %.1f\n", mean, n < 100 ? "max" : "p99", n < 100 ? a[n - 1] : sv_rank(a, n, 99));
    fprintf(f, "[serve] running: peak %d, mean %.2f; swapped: peak %d; most preemptions of one request %d; "
            "positions recomputed %ld; swap fallbacks to recompute %ld\n", c->peak_running,
            c->clock_ms > 0 ? c->run_ms_sum / c->clock_ms : 0, c->peak_swapped, most, c->recomputed, c->fallbacks);
    fprintf(f, "[serve] pool: %d chunks of %d, peak %d in use; mean utilization %.1f%% (slots holding a position); "
            "mean unused slots in allocated chunks %.1f\n", p->n_chunks, p->CH, c->peak_chunks,
            c->clock_ms > 0 ? 100.0 * c->util_sum / c->clock_ms : 0, c->clock_ms > 0 ? c->unused_sum / c->clock_ms : 0);
    fprintf(f, "[serve] swap: out %.0f bytes, in %.0f bytes: %.1f us over a %.0f GB/s host link (PCIe 4.0 x16)\n",
            c->swap_out_bytes, c->swap_in_bytes, 1e6 * (c->swap_out_bytes + c->swap_in_bytes) / (SV_LINK_GBS * 1e9),
            SV_LINK_GBS);
    fprintf(f, "[serve] prefix reuse: %ld positions attached, %ld hash collisions refused\n", reused, c->collisions);
    /* last, as the one line that differs between runs of the steps clock */
    fprintf(f, "[serve] measured: scheduler %.2f ms (swap copies %.3f ms of it), forward calls %.2f ms (scheduler "
            "%.2f%% of the steps)\n", 1e3 * c->t_sched, 1e3 * c->t_swap, 1e3 * c->t_forward,
            c->t_sched + c->t_forward > 0 ? 100.0 * c->t_sched / (c->t_sched + c->t_forward) : 0);
    free(a);
}
/* --serve-log: one CSV row per request. */
static void sv_write_log(FILE *f, const sv_req *q, int n) {
    fprintf(f, "id,arrival_ms,admitted_ms,first_token_ms,finish_ms,prompt_tokens,new_tokens,finish,preemptions,swaps,"
            "prefix_reused\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "%d,%.3f,%.3f,%.3f,%.3f,%d,%d,%s,%d,%d,%d\n", q[i].id, q[i].arrival, q[i].admitted, q[i].first,
                q[i].finish, q[i].n_prompt, q[i].n_out, q[i].reason ? q[i].reason : "-", q[i].preempts, q[i].swaps,
                q[i].reused);
}
static void sv_put_escaped(FILE *f, const char *s) {
    for (; *s; s++)
        if (*s == '\n') fputs("\\n", f);
        else if (*s == '\t') fputs("\\t", f);
        else if (*s == '\\') fputs("\\\\", f);
        else fputc(*s, f);
}
/* --serve-text: id<TAB>text, the text escaped (\n, \t, \\); ids for a --random model. */
static void sv_write_text(FILE *f, const kvt_tokenizer *tk, const sv_req *q, int n, const char *stop) {
    for (int i = 0; i < n; i++) {
        fprintf(f, "%d\t", q[i].id);
        for (int j = 0; j < q[i].n_out; j++) {
            int t = q[i].hist[q[i].n_prompt + j];
            if (!tk) { fprintf(f, j ? ",%d" : "ids:%d", t); continue; }
            if (stop) break; /* the text kept by the stop check (it ends before the stop string) */
            if (t == tk->eos_id || t == tk->bos_id) continue;
            sv_put_escaped(f, kvt_decode(tk, q[i].hist[q[i].n_prompt + j - 1], t));
        }
        if (tk && stop && q[i].text) sv_put_escaped(f, q[i].text);
        fputc('\n', f);
    }
}

/* ---- --serve from the command line ------------------------------------------- */

/* Read the trace, size the pool and the swap area, run it, write the reports.
 * Every check comes before the engine is made; the outputs are opened before
 * the run (an unwritable path fails at once) and written after it. */
static int run_serve(kvt_model *m, const kvt_tokenizer *tk, kvt_cli *a) {
    char *stop = a->stop ? strdup(a->stop) : NULL; /* --stop '\n\n': the trace's escapes */
    if (a->stop && !stop) return (kvt_fail(KVT_ENOMEM, "host out of memory (--stop)"), cli_fail(""));
    if (stop && !sv_unescape(stop)) {
        free(stop);
        return (kvt_fail(KVT_EARG, "--stop: a backslash escape other than \\n, \\t, \\\\"), cli_fail(""));
    }
    sv_req *q = NULL;
    int n = sv_read_trace(a->serve, tk, m, &q), TMAX = m->c.seq_len, CH = a->o.CH, rc = 1, most = 0, worst = 0;
    if (n < 0) { free(stop); return cli_fail(""); }
    for (int i = 0; i < n; i++) { /* positions cached at most: the prompt and all but the last token */
        int need = kvt_cdiv(q[i].n_prompt + q[i].max_new - 1, CH);
        if (need > most) { most = need; worst = i; }
    }
    kvt_options o = a->o;
    o.kv_cache = 1;                          /* --kv-cache off: the scheduler drops each cache itself */
    if (!a->o.kv_cache) o.prefix_reuse = 0;  /* nothing is kept to be reused */
    o.max_seqs = a->max_running;
    o.max_rows = a->max_batch;
    if (!cli_gave(a, "--chunks")) {
        long quarter = (long)a->max_running * kvt_cdiv(TMAX, CH) / 4;
        o.n_chunks = (int)(quarter > most ? quarter : most);
    }
    kvt_engine *e = NULL;
    FILE *log = NULL, *txt = NULL;
    kvt_status st = KVT_OK;
    if (o.n_chunks < most)
        st = kvt_fail(KVT_EPOOL, "--chunks %d: too small for request %d (line %ld: prompt %d + max_new %d), which needs "
                      "%d chunks of %d positions", o.n_chunks, q[worst].id, q[worst].line, q[worst].n_prompt,
                      q[worst].max_new, most, CH);
    if (st == KVT_OK && a->preempt == 1) { /* the swap area in whole chunks */
        double cb = (double)kvt_dtype_size((kvt_dtype)o.kv_dtype, (size_t)m->c.n_layers * 2 * CH * m->kv_dim) *
                    (o.kv_dtype == KVT_INT8 ? 1.0 + 4.0 / o.kv_group : 1.0);
        double slots = a->swap_mb * 1e6 / cb;
        o.swap_chunks = slots > KVT_LIMIT_CHUNKS ? KVT_LIMIT_CHUNKS : (int)slots;
    }
    if (st == KVT_OK) st = kvt_engine_create(&e, m, &o);
    if (st == KVT_OK && a->serve_log && !(log = fopen(a->serve_log, "w")))
        st = kvt_fail(KVT_EIO, "--serve-log: cannot write '%s': %s", a->serve_log, strerror(errno));
    if (st == KVT_OK && a->serve_text && !(txt = fopen(a->serve_text, "w")))
        st = kvt_fail(KVT_EIO, "--serve-text: cannot write '%s': %s", a->serve_text, strerror(errno));
    if (st == KVT_OK && a->trace && !(a->tracef = a->trace[0] ? fopen(a->trace, "w") : stderr))
        st = kvt_fail(KVT_EIO, "--trace: cannot write '%s': %s", a->trace, strerror(errno));
    sv_cfg c;
    memset(&c, 0, sizeof(c));
    c.max_running = a->max_running;
    c.max_batch = a->max_batch;
    c.watermark = a->watermark;
    c.swap = a->preempt == 1;
    c.clock_steps = a->serve_clock == 1;
    c.policy = a->policy;
    c.nocache = !a->o.kv_cache;
    c.stop = stop;
    c.trace = a->tracef;
    if (st == KVT_OK) st = serve_run(e, tk, q, n, &c, a->temperature, a->topp, a->seed);
    if (st == KVT_OK) {
        if (log) sv_write_log(log, q, n);
        if (txt) sv_write_text(txt, tk, q, n, stop);
        sv_summary(stderr, e, q, n, &c);
        if (a->stats) print_stats(e, NULL, 0);
        rc = 0;
    }
    if (st != KVT_OK) cli_fail("");
    if (cli_close(log, "--serve-log", a->serve_log, KVT_OK) != KVT_OK) rc = cli_fail("");
    if (cli_close(txt, "--serve-text", a->serve_text, KVT_OK) != KVT_OK) rc = cli_fail("");
    kvt_engine_free(e);
    sv_free(q, n);
    free(stop);
    return rc;
}
