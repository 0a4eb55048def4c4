/* kvtransformer.cu §4, second half: a random model of any shape, included by
 * kvtransformer.cu at the end of §4. --random, the tests and the benchmarks
 * build their models here: it is the harness around the lesson, not the
 * lesson (the checkpoint format it fills is in §4 itself). */

/* xorshift64*: a tiny, fixed random generator (same numbers on every machine). */
/* (Not rand(): its sequence differs between C libraries, and the tests' random
 * models must be the same everywhere.) */
static uint64_t kvt_rng_u64(uint64_t *s) {
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}
static float kvt_rng_f32(uint64_t *s) { /* uniform in [0, 1) */
    return (float)(kvt_rng_u64(s) >> 40) / 16777216.0f;
}
/* x[i] = offset + scale * u, u uniform in [-1, 1), one stream in order. */
static void kvt_fill_uniform(float *x, size_t n, float scale, float offset, uint64_t *s) {
    for (size_t i = 0; i < n; i++) x[i] = offset + scale * (2.0f * kvt_rng_f32(s) - 1.0f);
}

/* splitmix64's output function: any 64-bit input, a well-mixed output. Neighbour
 * inputs (block 7, block 8) give unrelated generator states. */
static uint64_t kvt_mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
/* Fill tensor number `tensor` of a random model, in parallel. One xorshift
 * stream over 6 billion floats (a 7B shape) takes minutes on one core, and a
 * stream cannot be split. So the tensor is cut into blocks of KVT_FILL_BLOCK
 * floats, each with its own generator seeded from (seed, tensor, block): the
 * blocks fill on all cores, and the values do not depend on how many there are. */
#define KVT_FILL_BLOCK 65536
static void kvt_fill_tensor(float *x, size_t n, float scale, float offset, uint64_t seed, int tensor) {
    long n_blocks = (long)((n + KVT_FILL_BLOCK - 1) / KVT_FILL_BLOCK);
    uint64_t base = kvt_mix64(kvt_mix64(seed) + (uint64_t)tensor);
#pragma omp parallel for schedule(static)
    for (long b = 0; b < n_blocks; b++) {
        size_t i0 = (size_t)b * KVT_FILL_BLOCK, len = n - i0 < KVT_FILL_BLOCK ? n - i0 : KVT_FILL_BLOCK;
        uint64_t s = kvt_mix64(base + (uint64_t)b);
        if (s == 0) s = 1; /* xorshift's one stuck state */
        kvt_fill_uniform(x + i0, len, scale, offset, &s);
    }
}

/* A prompt of n deterministic token ids (for random models and benchmarks). */
static void kvt_fake_tokens(int *t, int n, int V) {
    uint64_t s = 12345;
    for (int i = 0; i < n; i++) t[i] = (int)(kvt_rng_u64(&s) % (uint64_t)V);
}

/* A random model: weights uniform in +-1/sqrt(fan_in) (activations keep their
 * size through the layers), norm weights near 1, and a classifier scaled up so
 * that logits are spread out (std ~5): greedy decoding then has clear winners,
 * which the cache on/off equality tests rely on. */
kvt_status kvt_model_random(kvt_model *m, kvt_config c, uint64_t seed) {
    memset(m, 0, sizeof(*m));
    kvt_status st = kvt_config_check(&c);
    if (st != KVT_OK) return st;
    int shared = c.vocab_size > 0;
    c.vocab_size = abs(c.vocab_size);
    st = kvt_model_setup(m, c, shared);
    if (st != KVT_OK) return st;
    size_t D = (size_t)c.dim, HD = (size_t)c.hidden_dim, L = (size_t)c.n_layers, V = (size_t)c.vocab_size;
    size_t KVD = (size_t)m->kv_dim, HS = (size_t)m->head_size;
    float sd = 1.0f / sqrtf((float)D), sh = 1.0f / sqrtf((float)HD);
    kvt_weights *w = &m->w;
    /* each tensor has a fixed number (its place in the checkpoint), so a seed
     * always gives the same model */
    kvt_fill_tensor(w->token_embedding, V * D, 1.0f, 0.0f, seed, 0);
    kvt_fill_tensor(w->rms_att, L * D, 0.1f, 1.0f, seed, 1);
    kvt_fill_tensor(w->wq, L * D * D, sd, 0.0f, seed, 2);
    kvt_fill_tensor(w->wk, L * KVD * D, sd, 0.0f, seed, 3);
    kvt_fill_tensor(w->wv, L * KVD * D, sd, 0.0f, seed, 4);
    kvt_fill_tensor(w->wo, L * D * D, sd, 0.0f, seed, 5);
    kvt_fill_tensor(w->rms_ffn, L * D, 0.1f, 1.0f, seed, 6);
    kvt_fill_tensor(w->w1, L * HD * D, sd, 0.0f, seed, 7);
    kvt_fill_tensor(w->w2, L * D * HD, sh, 0.0f, seed, 8);
    kvt_fill_tensor(w->w3, L * HD * D, sd, 0.0f, seed, 9);
    kvt_fill_tensor(w->rms_final, D, 0.1f, 1.0f, seed, 10);
    memset(w->rms_final + D, 0, (size_t)c.seq_len * HS * sizeof(float)); /* the unused RoPE tables */
    if (!shared) kvt_fill_tensor(w->wcls, V * D, 8.0f * sd, 0.0f, seed, 11);
    return KVT_OK;
}
