/* kvtransformer.cu §10 and §12: the CPU's tuned attention loops, included by
 * kvtransformer.cu in §10, right after the spec of reading the cache
 * (kv_load, kv_dot, kv_axpy). Two parts:
 *  - vector loops over cached rows: KVT_VEC stored values converted to
 *    floats in registers (fp16, int8), four dot products at a time
 *    (kv_dots_cpu), a position's V rows asked for ahead (kv_prefetch_row), V
 *    summed 32 channels at a time (kv_rows_axpy_cpu), and e^x of the softmax
 *    weights as arithmetic that vectorizes (exp_neg_cpu): the same values as
 *    §10's spec, read faster;
 *  - the fused attention's tiled loop (attention_piece_cpu, at the end): the
 *    online softmax of §12's spec (attention_fused_spec_cpu) for a block of
 *    queries and a tile of keys at a time, run on those loops. The engine's
 *    CPU path (attention_fused_cpu, §12) calls it.
 * make test compares them with the specs and with float64. */

#define KVT_ATTN_TILE 32 /* most keys per tile of the fused attention's CPU loop */
/* The tiled loop reads the cache a tile at a time: up to KVT_ATTN_TILE
 * consecutive positions of one sequence, cut into runs where a chunk ends.
 * Inside a chunk, position t+1's row follows position t's, KVD = NKV * HS
 * elements further, so a run is one kv_index (its first row) and a stride:
 * no table look-up or division per key. (int8: row j's first scale is
 * (i + j * KVD) / G, since G divides HS and so KVD.) A tile does not stop at
 * the end of a chunk (16 positions by default): its fixed costs (its max,
 * exponentials and sums) are paid once per query and tile, so longer tiles
 * pay them less often. */

/* KVT_VEC stored values -> KVT_VEC floats, in registers. fp16: the values of
 * f16_to_f32 (the spec), by the hardware where the compiler offers it: one
 * instruction with AVX-512 or F16C (x86 since 2012), Arm's native half type.
 * One at a time in software, the conversion costs more than the bytes fp16
 * saves: such an fp16 cache is read slower than fp32. make test checks all
 * 65,536 halves. int8: widened and converted, two instructions with AVX-512
 * or AVX2 (GCC 12 turns the plain loop and __builtin_convertvector into a
 * dozen). */
static inline kvt_vec vec_load_f16(const uint16_t *p) {
    kvt_vec v;
#if KVT_VEC == 16
    v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__F16C__)
    v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#elif defined(__ARM_FP16_FORMAT_IEEE) && !defined(__CUDACC__)
    for (int i = 0; i < KVT_VEC; i++) v[i] = (float)((const __fp16 *)p)[i];
#else
    for (int i = 0; i < KVT_VEC; i++) v[i] = f16_to_f32(p[i]);
#endif
    return v;
}
static inline kvt_vec vec_load_i8(const int8_t *p) {
    kvt_vec v;
#if KVT_VEC == 16
    v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(__AVX2__)
    v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    for (int i = 0; i < KVT_VEC; i++) v[i] = (float)p[i];
#endif
    return v;
}

/* The CPU's kv_dot and kv_axpy, which the fused attention (§12) runs on: the
 * same sums, KVT_VEC values at a time, fp16 and int8 converted in registers as they
 * are read, so the cache is read once in its stored type (the bytes fp16 and
 * int8 save are bytes not read). ki: element index of a row's first value;
 * si: index of its first int8 scale. Leftovers (HS or G not a multiple of KVT_VEC)
 * go one value at a time. */
static inline float kv_row_dot_cpu(const kvt_kv *kv, size_t ki, size_t si, const float *q) {
    int HS = kv->HS, c = 0;
    kvt_vec acc = {0};
    float s = 0.0f;
    if (kv->dtype == KVT_FP32) {
        const float *k = (const float *)kv->data + ki;
        for (; c + KVT_VEC <= HS; c += KVT_VEC) acc += vec_load(q + c) * vec_load(k + c);
        for (; c < HS; c++) s += q[c] * k[c];
    } else if (kv->dtype == KVT_FP16) {
        const uint16_t *k = (const uint16_t *)kv->data + ki;
        for (; c + KVT_VEC <= HS; c += KVT_VEC) acc += vec_load(q + c) * vec_load_f16(k + c);
        for (; c < HS; c++) s += q[c] * f16_to_f32(k[c]);
    } else { /* per group, q . k in the integers' units, then one multiply by its scale */
        const int8_t *k = (const int8_t *)kv->data + ki;
        const float *sc = kv->scales + si;
        for (int g = 0; g < HS; g += kv->G, sc++) {
            kvt_vec part = {0};
            float tail = 0.0f;
            for (c = g; c + KVT_VEC <= g + kv->G; c += KVT_VEC) part += vec_load(q + c) * vec_load_i8(k + c);
            for (; c < g + kv->G; c++) tail += q[c] * (float)k[c];
            acc += *sc * part;
            s += *sc * tail;
        }
    }
    return vec_sum(acc) + s;
}
/* KVT_VEC stored values at element i of data as floats (int8 without its scale). */
static inline __attribute__((always_inline)) kvt_vec kv_load_vec_cpu(const void *data, int dtype, size_t i) {
    if (dtype == KVT_FP32) return vec_load((const float *)data + i);
    if (dtype == KVT_FP16) return vec_load_f16((const uint16_t *)data + i);
    return vec_load_i8((const int8_t *)data + i);
}
/* Four dot products: out[u * os] = scale * q[u] . (K row u), row u the HS
 * values at element ki + u * ks; int8: in G-value groups, each times its
 * scale, row u's from sc + u * ss (ss = ks / G). Four independent sums (one
 * sum would wait on its own previous add at every step). ks = 0: one row for four
 * queries (the rows of a prefill block, the query heads that share a kv
 * head), loaded and converted once; ks = HS: four kv heads side by side (a
 * decode row, one query per kv head). For fp32 and fp16 the caller passes
 * G = HS and sc = NULL. */
static inline __attribute__((always_inline)) void kv_dot4_cpu(const void *data, int dtype, const float *sc, int HS,
                                                             int G, size_t ki, size_t ks, size_t ss,
                                                             const float *const *q, float scale, float *out, int os) {
    kvt_vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (int g = 0, gi = 0; g < HS; g += G, gi++) { /* gi: the group's index in the row */
        kvt_vec p0 = {0}, p1 = {0}, p2 = {0}, p3 = {0};
        for (int c = g; c < g + G; c += KVT_VEC) {
            kvt_vec k0 = kv_load_vec_cpu(data, dtype, ki + c), k1 = k0, k2 = k0, k3 = k0;
            if (ks) {
                k1 = kv_load_vec_cpu(data, dtype, ki + ks + c);
                k2 = kv_load_vec_cpu(data, dtype, ki + 2 * ks + c);
                k3 = kv_load_vec_cpu(data, dtype, ki + 3 * ks + c);
            }
            p0 += vec_load(q[0] + c) * k0;
            p1 += vec_load(q[1] + c) * k1;
            p2 += vec_load(q[2] + c) * k2;
            p3 += vec_load(q[3] + c) * k3;
        }
        if (!sc) { a0 += p0; a1 += p1; a2 += p2; a3 += p3; continue; }
        a0 += sc[gi] * p0;
        a1 += sc[ss + gi] * p1;
        a2 += sc[2 * ss + gi] * p2;
        a3 += sc[3 * ss + gi] * p3;
    }
    vec_sum4(a0, a1, a2, a3, scale, out, os);
}
/* out[u * os] = scale * q[u] . (K row at element ki + u * ks) for the n
 * queries q[0..n-1]: four at a time where KVT_VEC divides HS (and G), the
 * rest with kv_row_dot_cpu. si: the int8 scale index of the row at ki (ki /
 * G, which the caller keeps up to date by additions: no 64-bit division per
 * key); 0 for fp32 and fp16. */
static void kv_dots_cpu(const kvt_kv *kv, size_t ki, size_t si, size_t ks, const float *const *q, int n,
                        float scale, float *out, int os) {
    int u = 0, HS = kv->HS, G = kv->G, dt = kv->dtype;
    size_t ss = ks ? (size_t)kv->HG : 0; /* row u's scales: u * ss further (ks is HS or 0) */
    if (HS % KVT_VEC == 0 && (dt == KVT_FP32 || dt == KVT_FP16 || (dt == KVT_INT8 && G % KVT_VEC == 0)))
        for (; u + 4 <= n; u += 4) {
            size_t k = ki + u * ks;
            float *o = out + (size_t)u * os;
            if (dt == KVT_FP32) kv_dot4_cpu(kv->data, KVT_FP32, NULL, HS, HS, k, ks, 0, q + u, scale, o, os);
            else if (dt == KVT_FP16) kv_dot4_cpu(kv->data, KVT_FP16, NULL, HS, HS, k, ks, 0, q + u, scale, o, os);
            else kv_dot4_cpu(kv->data, KVT_INT8, kv->scales + si + u * ss, HS, G, k, ks, ss, q + u, scale, o, os);
        }
    for (; u < n; u++) out[(size_t)u * os] = scale * kv_row_dot_cpu(kv, ki + u * ks, si + u * ss, q[u]);
}
/* Ask the memory for one position's row of every kv head (K or V), starting
 * at element i (int8: its first scale si), before it is needed: the row's
 * cache lines and its int8 scales. A hint: the core does not wait for it,
 * and it never faults. always_inline, or the hint is lost: a prefetch
 * changes no memory, so GCC (12, -O3) finds a function of prefetches free of
 * effects and deletes its calls, and the V rows are never asked for.
 * (Not for an fp32 decode row: its pass 2 reads V in memory order,
 * tile_v_rows_cpu.) fp32 reads one byte of each line instead (a volatile
 * load, which the compiler must keep): its row is 48 lines in the 110M
 * shape, asked for while the K row's 48 are read, more than a core keeps in
 * flight (a few dozen lines), and a hint that finds no room may be dropped,
 * where a load waits for room; so the V rows are there when pass 2 sums
 * them. fp16 and int8 rows are 24 and 12 lines, few enough for hints, which
 * are better for them than loads (a load holds up the conversions behind it). */
static inline __attribute__((always_inline)) void kv_prefetch_row(const kvt_kv *kv, size_t i, size_t si) {
    kvt_dtype dt = (kvt_dtype)kv->dtype;
    size_t KVD = (size_t)kv->NKV * kv->HS, bytes = kvt_dtype_size(dt, KVD);
    size_t scale_bytes = kv->scales ? (size_t)kv->NKV * kv->HG * sizeof(float) : 0;
    const char *p = (const char *)kv->data + kvt_dtype_size(dt, i);
    const char *sp = kv->scales ? (const char *)(kv->scales + si) : NULL;
    if (dt == KVT_FP32)
        for (size_t b = 0; b < bytes; b += 64) (void)*(const volatile char *)(p + b);
    else
        for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
    for (size_t b = 0; b < scale_bytes; b += 64) __builtin_prefetch(sp + b);
}
/* acc[0 .. NB * KVT_VEC) += sum_j w[j] * (the same channels of row j), row j
 * at element i + j * KVD. The NB running sums stay in registers across all n
 * rows, and each row's NB vectors are read together: whole cache lines, in
 * the order they lie. NB and dtype are constants at each call site: the
 * compiler makes one copy of the loop per pair. */
static inline __attribute__((always_inline)) void kv_axpy_cols_cpu(float *acc, const void *data, int dtype,
                                                                  const float *w, size_t i, size_t KVD, int n, int NB) {
    kvt_vec a[4];
    for (int b = 0; b < NB; b++) a[b] = vec_load(acc + b * KVT_VEC);
    for (int j = 0; j < n; j++, i += KVD)
        for (int b = 0; b < NB; b++) a[b] += w[j] * kv_load_vec_cpu(data, dtype, i + b * KVT_VEC);
    for (int b = 0; b < NB; b++) memcpy(acc + b * KVT_VEC, &a[b], sizeof(a[b]));
}
/* The same for the cache's type: one copy of the loop per type (and per NB,
 * a constant at each call site). */
static inline __attribute__((always_inline)) void kv_axpy_cols_kv_cpu(const kvt_kv *kv, float *acc, const float *w,
                                                                     size_t i, int n, int NB) {
    size_t KVD = (size_t)kv->NKV * kv->HS;
    if (kv->dtype == KVT_FP32) kv_axpy_cols_cpu(acc, kv->data, KVT_FP32, w, i, KVD, n, NB);
    else if (kv->dtype == KVT_FP16) kv_axpy_cols_cpu(acc, kv->data, KVT_FP16, w, i, KVD, n, NB);
    else kv_axpy_cols_cpu(acc, kv->data, KVT_INT8, w, i, KVD, n, NB);
}
/* acc (HS) += sum_j wgt[j] * V row j, for the n rows of a tile (row j at
 * element i + j * KVD; int8: its scales from si + j * KVD / G), KVT_AXPY
 * channels at a time where HS allows (else KVT_VEC): acc is read and written
 * once per tile, and the tile's rows (3 KiB apart in the 110M shape) are
 * walked once per KVT_AXPY channels, not again for every vector. int8: the
 * weight times the row's scale of these channels, so a block must lie in one
 * group: KVT_AXPY channels where KVT_AXPY divides G, else KVT_VEC; where
 * KVT_VEC does not divide HS (or G), row by row, by the spec. */
#define KVT_AXPY 32 /* channels per block: 4 vectors with AVX2, 2 with AVX-512 */
static inline void kv_rows_axpy_cpu(const kvt_kv *kv, float *acc, const float *wgt, size_t i, size_t si, int n) {
    int HS = kv->HS, int8 = kv->dtype == KVT_INT8, G = int8 ? kv->G : HS; /* fp32, fp16: one "group", unscaled */
    size_t KVD = (size_t)kv->NKV * HS, row_scales = (size_t)kv->NKV * kv->HG;
    const float *sc = int8 ? kv->scales + si : NULL; /* row j's scales: j * row_scales further */
    float w[KVT_ATTN_TILE];
    if (HS % KVT_VEC || (int8 && G % KVT_VEC)) { /* leftovers, or a vector spanning two groups: the spec */
        for (int j = 0; j < n; j++) kv_axpy(kv, i + j * KVD, wgt[j], acc, HS);
        return;
    }
    int step = HS % KVT_AXPY == 0 && (!int8 || G % KVT_AXPY == 0) ? KVT_AXPY : KVT_VEC;
    for (int g = 0, gi = 0; g < HS; g += G, gi++) { /* gi: the group's index in the row */
        const float *wc = wgt;
        if (int8) { /* the weights times this group's scales */
            for (int j = 0; j < n; j++) w[j] = wgt[j] * sc[j * row_scales + gi];
            wc = w;
        }
        for (int c = g; c < g + G; c += step) {
            if (step == KVT_AXPY) kv_axpy_cols_kv_cpu(kv, acc + c, wc, i + c, n, KVT_AXPY / KVT_VEC);
            else kv_axpy_cols_kv_cpu(kv, acc + c, wc, i + c, n, 1);
        }
    }
}
KVT_STATIC_ASSERT(KVT_AXPY % KVT_VEC == 0 && KVT_AXPY / KVT_VEC <= 4, "an axpy block is 1 to 4 whole vectors");

/* e^x for x <= 0 (softmax weights), as plain arithmetic so that a loop over a
 * tile's scores vectorizes; expf is a library call, one value at a time, and
 * it was the largest cost of CPU attention. e^x = 2^k * e^r with
 * k = round(x / ln 2) and r = x - k ln 2 in [-0.35, 0.35], where the Taylor
 * series of e^r to r^7 is exact to 6e-9 (below float rounding). ln 2 is split
 * into a part with few bits (k * LN2_HI is exact) and the rest (Cody & Waite
 * 1980). 2^k is built from its exponent bits. Below -87, e^x would be a
 * subnormal float: 0 there. make test compares it with exp() in float64.
 * GCC vectorizes the loop only when it may evaluate both sides of the `? :`
 * (-fno-trapping-math, in the Makefile); without it, one value at a time. */
static inline float exp_neg_cpu(float x) {
    const float LOG2E = 1.44269504f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f, ROUND = 12582912.0f;
    float xc = x < -87.0f ? -87.0f : x;
    float k = (xc * LOG2E + ROUND) - ROUND; /* round to nearest: 1.5 * 2^23 drops the fraction bits */
    float r = (xc - k * LN2_HI) - k * LN2_LO;
    float p = 1.0f + r * (1.0f + r * (1.0f / 2 + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
              r * (1.0f / 720 + r * (1.0f / 5040)))))));
    uint32_t bits = (uint32_t)((int32_t)k + 127) << 23; /* 2^k: k in [-126, 0] */
    float two_k;
    memcpy(&two_k, &bits, sizeof(two_k));
    return x < -87.0f ? 0.0f : p * two_k;
}

// ---- §12's fused attention on the CPU: the tiled loop -----------------------------
/* The online softmax of §12, for a block of queries at a time. The keys are
 * walked in tiles of up to KVT_ATTN_TILE positions (in runs of a fixed
 * stride, one per chunk they touch), and each tile serves a block of
 * queries: up to KVT_ATTN_QROWS consecutive rows of one sequence (a
 * prefill) times the NH/NKV query heads that share a kv head. A K/V row is
 * then read from memory (and decoded) once per block instead of once per
 * query: FlashAttention's loop order.
 *
 *              keys: tile 0        tile 1        ...   (one piece of the split)
 *   query r0, h   [s s s s ...] [s s s s ...]    per query: m, l, acc (HS)
 *   query r0, h'  [s s s s ...] [s s s s ...]    live in part[], updated
 *   query r1, h   [s s s ...  ] ...               once per tile
 *
 * (An fp32 decode row keeps its acc in an array of its own until the end,
 * see tile_v_rows_cpu.) The causal mask is a count: row r sees the first
 * row_pos[r] - t0 + 1 keys of the tile (all of them, except in the last tile
 * of a prefill block). */
#define KVT_ATTN_QROWS 16 /* rows of one sequence that share each tile */

/* s[0] + ... + s[n-1] for a tile (s has room for KVT_ATTN_TILE values): zero
 * the rest, add KVT_VEC at a time, then one horizontal sum. (An `omp simd
 * reduction(+)` ends in 16 dependent scalar adds with GCC 12.) */
static inline float tile_sum_cpu(float *s, int n) {
    for (int j = n; j < KVT_ATTN_TILE; j++) s[j] = 0.0f;
    kvt_vec v = vec_load(s);
    for (int j = KVT_VEC; j < KVT_ATTN_TILE; j += KVT_VEC) v += vec_load(s + j);
    return vec_sum(v);
}
KVT_STATIC_ASSERT(KVT_ATTN_TILE % KVT_VEC == 0, "the CPU attention tile is whole vectors");

/* A tile: nt consecutive positions from t0, cut into runs where a chunk
 * ends. Run i is keys at[i] .. at[i+1] - 1 of the tile; inside it, key j + 1's
 * row is KVD elements after key j's, and its first K row (head 0) is at
 * element kr[i]. int8: that row's first scale is sr[i]. Returns the runs. */
static int tile_runs_cpu(const kvt_kv *kv, int l, int tab, int t0, int nt, int *at, size_t *kr, size_t *sr) {
    int nrun = 0;
    for (at[0] = 0; at[nrun] < nt; nrun++) {
        int t = t0 + at[nrun], chunk_end = at[nrun] + kv->CH - t % kv->CH;
        kr[nrun] = kv_index(kv, l, 0, tab, t, 0);
        sr[nrun] = kv->scales ? kr[nrun] / (size_t)kv->G : 0;
        at[nrun + 1] = chunk_end < nt ? chunk_end : nt;
    }
    return nrun;
}
/* The online softmax's step for one query and one tile: its nk scores s
 * become weights exp(s - m) against the running max m = pp[0], and the
 * running sum pp[1] grows by theirs; when the tile raised the max, what was
 * summed so far (pp[1] and acc, HS values) is rescaled first. */
static inline void tile_softmax_cpu(float *pp, float *acc, float *s, int nk, int HS) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < nk; j++) mx = s[j] > mx ? s[j] : mx;
    if (mx > pp[0]) { /* a new max: rescale what we have (once per tile at most) */
        float corr = expf(pp[0] - mx);
        pp[1] *= corr;
        for (int c = 0; c < HS; c++) acc[c] *= corr;
        pp[0] = mx;
    }
    float m = pp[0];
#pragma omp simd /* a vector of weights per instruction */
    for (int j = 0; j < nk; j++) s[j] = exp_neg_cpu(s[j] - m);
    pp[1] += tile_sum_cpu(s, nk);
}
/* Pass 2 for an fp32 decode row (one query per head): acc (NH, HS) +=
 * w[h][j] * V row j of head h's kv head, for the tile's first nk keys, in
 * the order V lies in memory: key by key, and inside a key its kv heads'
 * rows side by side, so each run is read front to back like K in pass 1 and
 * the hardware prefetcher keeps ahead. Per kv head instead (the loop of
 * attention_piece_cpu for other rows), a tile's V rows lie KVD elements
 * apart: they must be asked for during pass 1 (kv_prefetch_row), and for
 * fp32 rows the sums still wait for them. acc is the work item's own, (NH,
 * HS) in one piece: in part[] each head's sums lie among other pieces'
 * values, and writing them there key by key is several times slower, even
 * in cache. */
static void tile_v_rows_cpu(float *acc, float (*w)[KVT_ATTN_TILE], const kvt_kv *kv, int NH, int nk, int nrun,
                            const int *at, const size_t *kr, size_t voff) {
    int HS = kv->HS, group = NH / kv->NKV;
    size_t KVD = (size_t)kv->NKV * HS;
    for (int i = 0; i < nrun && at[i] < nk; i++) {
        const float *v = (const float *)kv->data + kr[i] + voff; /* key at[i]'s V row of kv head 0 */
        for (int j = at[i]; j < (at[i + 1] < nk ? at[i + 1] : nk); j++, v += KVD)
            for (int h = 0; h < NH; h++) {
                const float *vh = v + (size_t)(h / group) * HS;
                float wj = w[h][j], *a = acc + (size_t)h * HS;
#pragma omp simd
                for (int c = 0; c < HS; c++) a[c] += wj * vh[c];
            }
    }
}
/* One work item: the queries of rows [r0, r1) (one sequence), all heads, over
 * the positions of piece sp. A tile is read in two passes:
 *  1. the scores of every query (row, head), position by position: a
 *     position's K rows for all kv heads lie side by side in its chunk, so
 *     this pass reads K in the order it lies in memory, which the hardware
 *     prefetcher follows; meanwhile it asks for the position's V rows
 *     (except an fp32 decode row, see 2). Four dot products at a time
 *     (kv_dots_cpu): four queries of one K row, or in decode (one query per
 *     kv head) four kv heads side by side;
 *  2. each query's softmax update (tile_softmax_cpu), then the weighted sum
 *     of V: per kv head for all the block's queries, the V rows read from
 *     cache by now; an fp32 decode row instead reads V key by key, in memory
 *     order (tile_v_rows_cpu).
 * Reading K one kv head at a time instead (32 rows of HS values, KVD apart)
 * does not stream memory in order, and then the bytes fp16 and int8 save buy
 * no time: their caches are read no faster than fp32's. */
/* A work item's scratch, in kv->work (the engine's, one per thread, sized at
 * create so that a forward call allocates nothing): at part 0 the block's
 * query pointers qs, at part 1 their tiles of scores, at part 2 an fp32
 * decode row's sums acc; part 3 is the size. Each part starts on 64 bytes. */
static size_t attn_work_at(int NH, int HS, int part) {
    size_t nq = (size_t)KVT_ATTN_QROWS * NH, at[4];
    at[0] = 0;
    at[1] = at[0] + (nq * sizeof(float *) + 63) / 64 * 64;
    at[2] = at[1] + (nq * KVT_ATTN_TILE * sizeof(float) + 63) / 64 * 64;
    at[3] = at[2] + ((size_t)NH * HS * sizeof(float) + 63) / 64 * 64;
    return at[part];
}
static size_t attn_work_bytes(int NH, int HS) { return attn_work_at(NH, HS, 3); }
static void attention_piece_cpu(float *part, const float *q, const kvt_kv *kv, int l, int NH, int r0, int r1,
                                int sp, int split_len, int nsplit) {
    int HS = kv->HS, group = NH / kv->NKV, tab = kv->row_tab[r0], t_begin = sp * split_len, p_max = 0;
    float scale = 1.0f / sqrtf((float)HS);
    size_t KVD = (size_t)kv->NKV * HS;
    for (int r = r0; r < r1; r++) {
        p_max = kv->row_pos[r] > p_max ? kv->row_pos[r] : p_max;
        for (int h = 0; h < NH; h++) {
            float *pp = part + (((size_t)r * NH + h) * nsplit + sp) * (2 + HS);
            pp[0] = -INFINITY; /* m: no score seen yet */
            pp[1] = 0.0f;      /* l */
            for (int c = 0; c < HS; c++) pp[2 + c] = 0.0f;
        }
    }
    int t_end = p_max + 1 < t_begin + split_len ? p_max + 1 : t_begin + split_len;
    /* The block's queries, kv head by kv head: query u = (kv head kh, row r,
     * head h of kh's group); the n = rows x group of them from u = kh * n on
     * read kv head kh's K rows. qs[u] is its q, scores[u] its tile of scores. */
    int nq = (r1 - r0) * NH, n = (r1 - r0) * group;
    char *work = kv->work + (size_t)omp_get_thread_num() * kv->work_bytes;
    const float **qs = (const float **)(void *)(work + attn_work_at(NH, HS, 0));
    float (*scores)[KVT_ATTN_TILE] = (float (*)[KVT_ATTN_TILE])(void *)(work + attn_work_at(NH, HS, 1));
    KVT_ASSERT(omp_get_thread_num() < kv->work_threads && attn_work_bytes(NH, HS) <= kv->work_bytes &&
               nq <= KVT_ATTN_QROWS * NH); /* the scratch holds a block's queries */
    for (int kh = 0, u = 0; kh < kv->NKV; kh++)
        for (int r = r0; r < r1; r++)
            for (int h = kh * group; h < (kh + 1) * group; h++) qs[u++] = q + ((size_t)r * NH + h) * HS;
    /* A tile's runs (tile_runs_cpu). V rows follow the chunk's K rows, voff
     * further; int8: a row's scales rsc apart, V's vsoff after K's (no
     * division per key, see kv_dots_cpu). */
    int at[KVT_ATTN_TILE + 1], nrun;
    size_t kr[KVT_ATTN_TILE], sr[KVT_ATTN_TILE], voff = (size_t)kv->CH * KVD;
    size_t rsc = (size_t)kv->NKV * kv->HG, vsoff = (size_t)kv->CH * rsc;
    /* an fp32 decode row sums V in memory order, into acc (NH, HS), copied to part[] at the end */
    int vrows = r1 - r0 == 1 && kv->dtype == KVT_FP32;
    float *acc = vrows ? (float *)(void *)(work + attn_work_at(NH, HS, 2)) : NULL;
    for (int c = 0; vrows && c < NH * HS; c++) acc[c] = 0.0f;
    for (int t0 = t_begin, nt; t0 < t_end; t0 += nt) {
        nt = t_end - t0 < KVT_ATTN_TILE ? t_end - t0 : KVT_ATTN_TILE;
        nrun = tile_runs_cpu(kv, l, tab, t0, nt, at, kr, sr);
        /* pass 1: key j's scores, already scaled, for every query of the
         * block (also a row's future keys in its last tile, cached by this
         * forward and skipped by pass 2: simpler than a mask here) */
        for (int i = 0; i < nrun; i++)
            for (int j = at[i]; j < at[i + 1]; j++) {
                size_t ki = kr[i] + (size_t)(j - at[i]) * KVD; /* key j's K row of kv head 0 */
                size_t si = sr[i] + (size_t)(j - at[i]) * rsc; /* and its first int8 scale */
                if (!vrows) kv_prefetch_row(kv, ki + voff, si + vsoff);
                if (n == 1) /* one query per kv head: the kv heads' rows side by side, four at a time */
                    kv_dots_cpu(kv, ki, si, HS, qs, kv->NKV, scale, &scores[0][j], KVT_ATTN_TILE);
                else /* each kv head's row for its n queries */
                    for (int kh = 0; kh < kv->NKV; kh++)
                        kv_dots_cpu(kv, ki + (size_t)kh * HS, si + (size_t)kh * kv->HG, 0, qs + kh * n, n, scale,
                                    &scores[kh * n][j], KVT_ATTN_TILE);
            }
        /* pass 2: the softmax updates and sums of V */
        if (vrows) { /* one row: query u is head u (qs above); its position p_max is at or past the
                      * piece's last key t_end - 1, so it sees every key of the tile */
            for (int h = 0; h < NH; h++)
                tile_softmax_cpu(part + (((size_t)r0 * NH + h) * nsplit + sp) * (2 + HS), acc + (size_t)h * HS,
                                 scores[h], nt, HS);
            tile_v_rows_cpu(acc, scores, kv, NH, nt, nrun, at, kr, voff);
            continue;
        }
        for (int kh = 0, u = 0; kh < kv->NKV; kh++) {
            size_t off = (size_t)kh * HS; /* kv head kh's rows */
            for (int r = r0; r < r1; r++) {
                int nk = kv->row_pos[r] - t0 + 1; /* the causal mask: row r sees keys t0 .. row_pos[r] */
                nk = nk < nt ? nk : nt;
                for (int h = kh * group; h < (kh + 1) * group; h++) {
                    float *s = scores[u++];
                    if (nk <= 0) continue; /* all of this tile is in the row's future */
                    float *pp = part + (((size_t)r * NH + h) * nsplit + sp) * (2 + HS);
                    tile_softmax_cpu(pp, pp + 2, s, nk, HS);
                    for (int i = 0; i < nrun && at[i] < nk; i++)
                        kv_rows_axpy_cpu(kv, pp + 2, s + at[i], kr[i] + voff + off, sr[i] + vsoff + (size_t)kh * kv->HG,
                                         (at[i + 1] < nk ? at[i + 1] : nk) - at[i]);
                }
            }
        }
    }
    for (int h = 0; vrows && h < NH; h++)
        memcpy(part + (((size_t)r0 * NH + h) * nsplit + sp) * (2 + HS) + 2, acc + (size_t)h * HS, HS * sizeof(float));
}
