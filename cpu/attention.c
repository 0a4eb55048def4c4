/* kvtransformer.cu §10 and §12: the CPU's vector loops over cached rows,
 * included by kvtransformer.cu in §10, right after the spec of reading the
 * cache (kv_load, kv_dot, kv_axpy). The fused attention's CPU path (§12)
 * runs on them: KVT_VEC stored values converted to floats in registers (fp16,
 * int8), four dot products at a time (kv_dots_cpu), a position's V rows asked
 * for ahead (kv_prefetch_row), V summed 32 channels at a time
 * (kv_rows_axpy_cpu), and e^x of the softmax weights as arithmetic that
 * vectorizes (exp_neg_cpu). The same values as §10's spec, read faster; make
 * test compares them with it and with float64. */

/* KVT_VEC stored values -> KVT_VEC floats, in registers. fp16: the values of
 * f16_to_f32 (the spec), by the hardware where the compiler offers it: one
 * instruction with AVX-512 or F16C (x86 since 2012), Arm's native half type.
 * One at a time in software, the conversion cost more than the bytes fp16
 * saves (the fp16 cache was 2x slower than fp32). make test checks all 65,536
 * halves. int8: widened and converted, two instructions with AVX-512 or AVX2
 * (GCC 12 turns the plain loop and __builtin_convertvector into a dozen). */
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
 * G, which the caller keeps up to date by additions: a 64-bit division per
 * key made int8 attention 1.05x slower, README); 0 for fp32 and fp16. */
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
 * changes no memory, so GCC (12, -O3) found this function free of effects
 * and deleted its calls; the V rows were never asked for (README: the fp16
 * and int8 caches were 1.4x and 1.33x slower at T 4000 without it).
 * (Not for an fp32 decode row: its pass 2 reads V in memory order, §12.)
 * fp32 reads one byte of each line instead (a volatile load, which the
 * compiler must keep): its row is 48 lines in the 110M shape, asked for
 * while the K row's 48 are read, more than a core keeps in flight (about
 * 22 lines, measured on Zen 1: README), and a hint that finds no room may
 * be dropped where a load waits. With hints the sums of V that follow took
 * 0.70 ms at T 4000, with loads 0.33, run again from cache 0.22. fp16 and
 * int8 rows are 24 and 12 lines, and loads were slower for them than hints
 * (they hold up the conversions behind them). */
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
 * once per tile. One vector at a time instead, walking the 32 rows (3 KiB
 * apart in the 110M shape) again for every 8 floats of each, took 1.15x as
 * long for fp32 in cache on the AMD machine (README). int8: the weight times
 * the row's scale of these channels, so a block must lie in one group
 * (KVT_AXPY divides G); otherwise row by row, by the spec. */
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
