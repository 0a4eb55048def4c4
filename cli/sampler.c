/* kvtransformer.cu §17: sampling, included by kvtransformer.cu in the place
 * of its section. It turns a row of logits into the next token id: the text
 * around the model, not part of the lesson on the cache. */

/* temperature 0: argmax (greedy, what the tests use). Otherwise softmax(logits / T)
 * and draw; with top-p, draw only among the most likely tokens whose probabilities
 * add up to p (nucleus sampling, Holtzman et al. 2019). Deterministic per seed. */
struct kvt_prob { float p; int id; };
int kvt_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}
/* The seed is spread over the 64 bits (a zero state would stick at zero). */
void kvt_sampler_init(kvt_sampler *s, int V, float temperature, float topp, uint64_t seed) {
    s->temperature = temperature;
    s->topp = topp;
    s->state = seed * 0x9E3779B97F4A7C15ULL + 0x1234567ULL;
    s->cand = (struct kvt_prob *)kvt_malloc((size_t)V * sizeof(struct kvt_prob));
}
void kvt_sampler_free(kvt_sampler *s) { free(s->cand); s->cand = NULL; }

/* qsort order for top-p: most likely first; equal probabilities by id, so the
 * order (and the draw) is the same on every machine. */
static int prob_cmp(const void *a, const void *b) { /* descending probability, then id */
    const struct kvt_prob *x = (const struct kvt_prob *)a, *y = (const struct kvt_prob *)b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}
/* Softmax of (logit - max) / T: every exponent is <= 0, so expf never
 * overflows, however small T is (dividing first, logits / 1e-40 overflowed to
 * inf and inf - inf made NaN). Then one uniform draw u: walk the cumulative
 * distribution until it passes u. With top-p the walk is over the sorted
 * nucleus and u is scaled by the nucleus' mass. A temperature below
 * KVT_MIN_TEMPERATURE is taken as 0 (greedy): --help says so. */
#define KVT_MIN_TEMPERATURE 1e-6f
int kvt_sample(kvt_sampler *s, float *logits, int V) {
    if (s->temperature < KVT_MIN_TEMPERATURE) return kvt_argmax(logits, V);
    float mx = -INFINITY, sum = 0.0f;
    for (int i = 0; i < V; i++) mx = fmaxf(mx, logits[i]);
    for (int i = 0; i < V; i++) { logits[i] = expf((logits[i] - mx) / s->temperature); sum += logits[i]; }
    for (int i = 0; i < V; i++) logits[i] /= sum;
    float u = kvt_rng_f32(&s->state);
    if (s->topp <= 0.0f || s->topp >= 1.0f) { /* plain draw from the whole distribution */
        float cdf = 0.0f;
        for (int i = 0; i < V; i++) { cdf += logits[i]; if (u < cdf) return i; }
        return V - 1;
    }
    /* Only tokens with p >= (1 - topp) / (V - 1) can be in the nucleus: all the
     * others together weigh less than 1 - topp. Sorting just those (a few
     * dozen, not V = 32000: 5 ms per token, more than the whole decode step of
     * a small model) gives the same nucleus, in the same order. (The most
     * likely token is always kept: a nearly flat distribution may have none.) */
    int nc = 0, best = kvt_argmax(logits, V);
    float cutoff = (1.0f - s->topp) / (float)(V > 1 ? V - 1 : 1);
    for (int i = 0; i < V; i++)
        if (logits[i] >= cutoff || i == best) { s->cand[nc].p = logits[i]; s->cand[nc].id = i; nc++; }
    qsort(s->cand, (size_t)nc, sizeof(struct kvt_prob), prob_cmp);
    float mass = 0.0f;
    int last = nc - 1;
    for (int i = 0; i < nc; i++) { mass += s->cand[i].p; if (mass > s->topp) { last = i; break; } }
    float cdf = 0.0f;
    for (int i = 0; i <= last; i++) { cdf += s->cand[i].p; if (u * mass < cdf) return s->cand[i].id; }
    return s->cand[last].id;
}
