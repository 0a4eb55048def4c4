/* kvtransformer.cu §9: the CPU's own matmul loops, included by
 * kvtransformer.cu in §9 (one compile, as before). out = x @ w^T for decode
 * and batches below KVT_SGEMM_ROWS rows: each weight row is read from memory
 * once for all rows of x (one weight row at a time up to KVT_ROW_X rows of x,
 * tiles of 4 weight rows from there), and the cores share the rows of w.
 * They live beside the teaching file because they are tuned for CPUs (vector
 * width, registers, prefetch hints: choices that depend on the CPU), while
 * the op itself, its cost and its GPU kernels are in §9;
 * make test checks them against a float64 matmul. The vector type kvt_vec
 * defined here is used by the attention loops too (cpu/attention.c). At the
 * end, prefill's OpenBLAS call, split over the cores (matmul_sgemm_cpu), and
 * the check for an OpenBLAS too old for the CPU (kvt_blas_generic). */

/* KVT_VEC floats as one C value: one register, 16 with AVX-512, else 8 (one
 * AVX2 register, two NEON ones). GCC and Clang compile `acc += a * b` on this
 * type to vector multiply-adds. It is used where running sums must stay in
 * registers, the matmul tile here and attention's inner loops
 * (cpu/attention.c, §12): written with float arrays, the compiler keeps them
 * in memory, and the tile runs at about a third of its speed. One register,
 * not more: AVX2 has 16 registers, and a 16-float type takes two of them, so
 * the 4 x 4 running sums of the tile below would spill to memory. */
#if defined(__AVX512F__)
#define KVT_VEC 16
#else
#define KVT_VEC 8
#endif
typedef float kvt_vec __attribute__((vector_size(KVT_VEC * sizeof(float))));
#if defined(__GNUC__) && !defined(__clang__) /* "a 64-byte vector without AVX-512 changes the ABI": */
#pragma GCC diagnostic ignored "-Wpsabi"     /* these functions are all static, no ABI is crossed */
#endif
static inline kvt_vec vec_load(const float *p) { /* any alignment */
    kvt_vec v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* The lanes added up. With AVX-512 the instruction set has a helper for it
 * (halves added to halves; attention does one per score). Elsewhere a tree of
 * lane reads: v[i] reads a lane in place, while copying v to an array first
 * would send it through memory. */
static inline float vec_sum(kvt_vec v) {
#if KVT_VEC == 16
    return _mm512_reduce_add_ps(v);
#else
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
#endif
}
/* out[u * os] = scale * (the lanes of a_u added up), u = 0..3. With AVX
 * (8 lanes) one tree serves all four: a horizontal add adds neighbouring
 * lanes of two vectors at once, so three of them and one add of the two
 * halves leave the four sums side by side (five instructions, where four
 * vec_sum take about twenty). Elsewhere, vec_sum four times. */
static inline void vec_sum4(kvt_vec a0, kvt_vec a1, kvt_vec a2, kvt_vec a3, float scale, float *out, int os) {
#if KVT_VEC == 8 && defined(__AVX__)
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3)); /* lane i: part of a_(i % 4) */
    __m128 r = _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)), _mm_set1_ps(scale));
    float v[4];
    _mm_storeu_ps(v, r);
    out[0] = v[0];
    out[os] = v[1];
    out[2 * os] = v[2];
    out[3 * os] = v[3];
#else
    out[0] = scale * vec_sum(a0);
    out[os] = scale * vec_sum(a1);
    out[2 * os] = scale * vec_sum(a2);
    out[3 * os] = scale * vec_sum(a3);
#endif
}

/* One tile: NX rows of x against 4 rows of w, 4*NX dot products of length k
 * computed together. Each KVT_VEC floats of a weight row are loaded once and used
 * for all NX rows of x; each KVT_VEC floats of x serve 4 weight rows.
 *
 *            w rows j..j+3 (streamed from memory, once)
 *   x row 0  [acc00 acc01 acc02 acc03]      acc = KVT_VEC partial sums each,
 *   x row 1  [acc10 ...              ]      added up at the end
 *   ...      (NX <= 4 rows, in cache)
 *
 * nw < 4 at the last tile of w: the missing rows repeat row 0 (so nothing is
 * read past w) and are not stored. pf: this is the first tile of x for
 * these weight rows (it asks for the next ones). NX is a constant at every
 * call site, so the compiler unrolls the loops over it and keeps acc in
 * registers. */
static inline __attribute__((always_inline)) void matmul_tile_cpu(float *out, const float *x, const float *w,
                                                                  int NX, int nw, int k, int d, int pf) {
    const float *wr[4];
    kvt_vec acc[4][4];
    for (int j = 0; j < 4; j++) wr[j] = w + (size_t)(j < nw ? j : 0) * k;
    for (int i = 0; i < NX; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = (kvt_vec){0};
    int c = 0;
    for (; c + KVT_VEC <= k; c += KVT_VEC) {
        kvt_vec wv[4];
        for (int j = 0; j < 4; j++) {
            wv[j] = vec_load(wr[j] + c);
            /* Ask now for the same columns of the next tile's rows (4 rows on):
             * the hardware prefetcher stops at every 4 KiB page, this does not.
             * A prefetch past the end of w is harmless: it never faults. Only
             * the first tile of x asks (pf): the others read the same weight
             * rows, so their prefetches would be repeats, which cost
             * instructions and find nothing new to fetch. */
            if (pf) __builtin_prefetch(wr[j] + c + 4 * (size_t)k);
        }
        for (int i = 0; i < NX; i++) {
            kvt_vec xv = vec_load(x + (size_t)i * k + c);
            for (int j = 0; j < 4; j++) acc[i][j] += xv * wv[j];
        }
    }
    for (int i = 0; i < NX; i++)
        for (int j = 0; j < nw; j++) {
            float s = vec_sum(acc[i][j]);
            for (int cc = c; cc < k; cc++) s += x[(size_t)i * k + cc] * wr[j][cc]; /* k % KVT_VEC leftovers */
            out[(size_t)i * d + j] = s;
        }
}
/* One weight row against all NX <= KVT_ROW_X rows of x: the row is read
 * front to back, two vectors at a time, each vector used for every row of x
 * (2 x NX running sums). This is decode's and a small batch's matmul: there
 * memory is the limit, and one weight row after the other is one plain
 * stream per core. The tile above reads 4 weight rows side by side (4
 * streams, plus its hints) to load each vector of x once for 4 weight rows,
 * which pays once there are enough rows of x for the arithmetic to be the
 * limit. So the row loop serves up to KVT_ROW_X rows of x, the tile more;
 * short weight rows (the 15M shape's 288 floats) gain the most from it.
 * hint: ask for the stream KVT_ROW_AHEAD floats (2 KB) ahead, one line per
 * step (with AVX2 every line, with AVX-512 every other), on into the next
 * rows (past the end of w a hint never faults). The same hint helps on some
 * CPUs and hurts on others, so row_hint_cpu below says where it is used. */
#define KVT_ROW_X 4
#define KVT_ROW_AHEAD 512
/* Whether the row loop asks ahead for NX rows of x, by CPU:
 *  - Intel: always, for decode and batches. (The tile's reason above,
 *    likely: the hardware prefetcher stops at every 4 KiB page, a hint
 *    does not.)
 *  - AMD with 8-float vectors (AVX2, Zen 1-3): for 2 to 4 rows of x, where
 *    it pays; not for one row (decode), where it costs;
 *  - AMD with 16-float vectors (Zen 4, AVX-512): never, it costs.
 * Other CPUs take the AMD rule for their vector width (8 floats: 2 to 4
 * rows; 16: never), untried on them. -DKVT_ROW_HINT=0 or 1 fixes it, to
 * try it again. */
static int row_hint_cpu(int NX) {
#if defined(KVT_ROW_HINT)
    (void)NX;
    return KVT_ROW_HINT;
#else
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_is("intel")) return 1; /* reads the CPU's vendor, found once at start-up */
#endif
    return KVT_VEC == 8 && NX > 1;
#endif
}
static inline __attribute__((always_inline)) void matmul_row_cpu(float *out, const float *x, const float *wr,
                                                                 int NX, int k, int d, int hint) {
    kvt_vec acc[KVT_ROW_X][2];
    for (int i = 0; i < NX; i++) acc[i][0] = acc[i][1] = (kvt_vec){0};
    int c = 0;
    for (; c + 2 * KVT_VEC <= k; c += 2 * KVT_VEC) {
        if (hint) __builtin_prefetch(wr + c + KVT_ROW_AHEAD);
        kvt_vec w0 = vec_load(wr + c), w1 = vec_load(wr + c + KVT_VEC);
        for (int i = 0; i < NX; i++) {
            acc[i][0] += vec_load(x + (size_t)i * k + c) * w0;
            acc[i][1] += vec_load(x + (size_t)i * k + c + KVT_VEC) * w1;
        }
    }
    for (int i = 0; i < NX; i++) {
        float s = vec_sum(acc[i][0] + acc[i][1]);
        for (int cc = c; cc < k; cc++) s += x[(size_t)i * k + cc] * wr[cc]; /* k % (2 KVT_VEC) leftovers */
        out[(size_t)i * d] = s;
    }
}
/* Rows j0..j1-1 of w against all n rows of x. Up to KVT_ROW_X rows of x: one
 * weight row at a time (matmul_row_cpu). More: for every 4 rows of w (read
 * from memory once), all rows of x, KVT_TILE_X at a time. KVT_TILE_X x 4
 * running sums must fit in the registers: 16 of AVX-512's 32, but with AVX2's
 * 16 registers 4 x 4 spill to memory, and 3 x 4 leave room for the 4 weight
 * vectors. A switch gives each copy of
 * the loops a constant row count, which the compiler unrolls. hint: the row
 * loop's (row_hint_cpu), the same for every row. */
#define KVT_TILE_X (KVT_VEC == 16 ? 4 : 3)
static void matmul_rows_part_cpu(float *out, const float *x, const float *w, int n, int k, int d, int j0, int j1,
                                 int hint) {
    if (n <= KVT_ROW_X) {
        for (int j = j0; j < j1; j++) {
            const float *wj = w + (size_t)j * k;
            switch (n) {
            case 1: matmul_row_cpu(out + j, x, wj, 1, k, d, hint); break;
            case 2: matmul_row_cpu(out + j, x, wj, 2, k, d, hint); break;
            case 3: matmul_row_cpu(out + j, x, wj, 3, k, d, hint); break;
            default: matmul_row_cpu(out + j, x, wj, 4, k, d, hint); break;
            }
        }
        return;
    }
    for (int j = j0; j < j1; j += 4) {
        int nw = d - j < 4 ? d - j : 4;
        for (int i = 0; i < n; i += KVT_TILE_X) {
            float *o = out + (size_t)i * d + j;
            const float *xi = x + (size_t)i * k, *wj = w + (size_t)j * k;
            switch (n - i < KVT_TILE_X ? n - i : KVT_TILE_X) {
            case 1: matmul_tile_cpu(o, xi, wj, 1, nw, k, d, i == 0); break;
            case 2: matmul_tile_cpu(o, xi, wj, 2, nw, k, d, i == 0); break;
            case 3: matmul_tile_cpu(o, xi, wj, 3, nw, k, d, i == 0); break;
            default: matmul_tile_cpu(o, xi, wj, 4, nw, k, d, i == 0); break;
            }
        }
    }
}
/* All rows of w, on all cores. They are cut into chunks of about
 * KVT_CHUNK_BYTES (whole tiles), and the chunks into one part of consecutive
 * chunks per core. Each core streams its own part front to back, then takes
 * the untaken chunks of the other parts. A chunk is claimed by adding 1 to
 * its part's counter (a core that gets a number past the part's end knows the
 * part is done), so each chunk runs once.
 *
 * Why not `omp for schedule(static)`, an equal part each and no more: the
 * cores' speed varies from call to call (on a shared machine, neither is
 * always the slower), so one core would wait for the other at the end of
 * every matmul, a large share of a decode call's time. Nor
 * schedule(dynamic): it deals the chunks out in turn, so each core's stream
 * of rows breaks at every chunk (and its prefetch of the next rows asks for
 * the other core's), which is slower than static. */
#define KVT_CHUNK_BYTES 98304
#define KVT_CPU_THREADS 64 /* most cores that share a matmul's chunks (one counter each) */
static void matmul_rows_cpu(float *out, const float *x, const float *w, int n, int k, int d) {
    int hint = row_hint_cpu(n);
    if ((long)n * d * k <= 100000) { /* too small to share */
        matmul_rows_part_cpu(out, x, w, n, k, d, 0, d, hint);
        return;
    }
    int rows = 4 * (int)(KVT_CHUNK_BYTES / (16L * k)); /* whole tiles of 4 rows, at most the chunk's bytes */
    if (rows < 4) rows = 4;
    int nch = kvt_cdiv(d, rows), taken[KVT_CPU_THREADS] = {0}; /* chunks taken from each part */
#pragma omp parallel
    {
        int nt = omp_get_num_threads() < KVT_CPU_THREADS ? omp_get_num_threads() : KVT_CPU_THREADS;
        int id = omp_get_thread_num();
        for (int r = 0; id < nt && r < nt; r++) { /* its own part first, then the others' */
            int part = (id + r) % nt, c0 = (int)((long)nch * part / nt), c1 = (int)((long)nch * (part + 1) / nt);
            for (;;) {
                int c;
#pragma omp atomic capture
                c = taken[part]++;
                if (c0 + c >= c1) break;
                int j0 = (c0 + c) * rows;
                matmul_rows_part_cpu(out, x, w, n, k, d, j0, j0 + rows < d ? j0 + rows : d, hint);
            }
        }
    }
}

/* Prefill: OpenBLAS's sgemm, which blocks for every cache level and beats the
 * tile loop once there are enough rows to reuse each weight many times. Each
 * core calls a single-threaded sgemm on its own columns of out: one thread
 * pool (OpenMP's) serves the whole program, instead of OpenBLAS's threads and
 * ours spinning against each other on the same cores. With equal parts one
 * core may wait for the other at the end, but sharing chunks of columns as
 * matmul_rows_cpu does would cost more: one narrow sgemm call runs at about
 * half the speed of a wide one. */
#define KVT_SGEMM_ROWS 32 /* from this many rows on, sgemm (where `--bench matmul` sees it overtake) */
static void matmul_sgemm_cpu(float *out, const float *x, const float *w, int n, int k, int d) {
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int d0 = (int)((long)d * id / nt), d1 = (int)((long)d * (id + 1) / nt);
        if (d1 > d0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, d1 - d0, k, 1.0f, x, k, w + (size_t)d0 * k, k,
                        0.0f, out + d0, d);
    }
}
/* OpenBLAS picks its kernels for the CPU when it loads. One older than the
 * CPU (Debian 12's 0.3.21 on a 2023 Xeon) does not know it and falls back to
 * its generic "Prescott" kernels (SSE3, no FMA), which the tile loop beats at
 * every size. Setting OPENBLAS_CORETYPE before the program starts names the
 * right ones; the Makefile does so when it sees this. */
static int kvt_blas_generic(void) {
    static int generic = -1;
    if (generic < 0) generic = !strcmp(openblas_get_corename(), "Prescott");
    return generic;
}
