/* gpu/attention.cu - the tuned GPU fused attention (§12 of kvtransformer.cu,
 * included in its place, as cpu/attention.c is for the CPU): the kernels
 * attention_fused_gpu launches, one per way of reading the cache. The spec is
 * attention_fused_spec_cpu in the file; the suite checks these kernels
 * against it and against the naive path, in the C emulation and on a GPU. */

/* grid (NKV * nsplit, n), block (KVT_THREADS): one block per (row, kv head,
 * piece), serving all query heads of the kv head (group = NH / NKV) in passes
 * of up to KVT_GQA heads, whose accumulators are registers: a pass reads each
 * K and V row of the piece once for all its heads (Llama 3 8B's groups of 4,
 * 70B's of 8: one pass; a group of 12 reads the rows twice). A cached row is
 * read in units of W values, one 16-byte load each: 4 fp32, 8 fp16 or 16 int8
 * values (int8: G a multiple of 16, one scale per unit); other types and
 * shapes go one value at a time (W = 1, kv_load). The positions of the piece
 * are walked in tiles of blockDim keys:
 *
 *   tile:  t0 ........................ t0+blockDim
 *   step 0 thread j: where key t0+j's K and V rows start (one key per thread)
 *   step 1 lane u of group g (KVT_KL lanes of a warp): q.K over units u, u+KL,
 *          .. of keys j = g, g + groups, ..: a group reads 16 * KL contiguous
 *          bytes per load; shuffles add up the lanes' partial sums into s_j
 *   step 2 every thread: m' = max(m, max_j s_j); thread j: e_j = exp(s_j - m')
 *   step 3 thread (slot, unit): acc = acc*exp(m-m') + sum of e_j V[t0+j][unit]
 *          over keys j = slot, slot + slots, ..: KVT_VK loads, then their FMAs
 *
 * A barrier between two steps: each reads what the step before wrote to
 * shared memory. At the end, the slots' accumulators of a unit are added up.
 * No score row is written to global memory: a block reads its queries, its
 * piece's K and V rows once a pass, and writes its output. attn_fused_block
 * is the kernel's body, always inlined: nvcc compiles one copy for each W,
 * with the loops over units and heads unrolled and the accumulators in
 * registers. A loop over heads stops at nq, a branch per head: in the SASS
 * (docs/GPU.md), step 3's FMAs then all follow its 16-byte loads. */
#if defined(__CUDACC__) || defined(KVT_GPU_SIZES)
#define KVT_KL 8 /* lanes per key in step 1: 3 shuffles per key and head */
#else
#define KVT_KL 2 /* the C build: 1 shuffle (a barrier there, §2) per key and head */
#endif
#define KVT_GQA 8 /* most query heads per pass */
#define KVT_VK 4  /* V rows a thread loads at once in step 3 */
#define KVT_VU (KVT_MAX_HS / KVT_THREADS) /* most units per thread in step 3 (W = 1) */
KVT_STATIC_ASSERT(32 % KVT_KL == 0, "fused attention: the lanes of a key in one warp (step 1's shuffles)");
/* nvcc: unroll the loop that follows (its trip count is a constant once W
 * is), so that the arrays it indexes stay in registers. C ignores it. */
#ifdef __CUDACC__
#define KVT_UNROLL _Pragma("unroll")
#else
#define KVT_UNROLL
#endif
/* A unit of W values from element i, as stored: one 16-byte load (W > 1), or
 * one value decoded by kv_load (W = 1). kv_unit_at: its value e as fp32 (int8
 * without its scale, which the caller applies once per unit). */
KVT_INLINE float4 kv_unit_load(const kvt_kv *kv, int W, size_t i) {
    float4 u = {0.0f, 0.0f, 0.0f, 0.0f};
    if (W > 1) return KVT_LOAD4((const float *)((const char *)kv->data + i * (size_t)(16 / W)));
    u.x = kv_load(kv, i);
    return u;
}
KVT_INLINE float kv_unit_at(float4 u, int W, int e) {
    float f[4] = {u.x, u.y, u.z, u.w};
    kvt_bits b;
    b.f = f[e * 4 / W]; /* the 32-bit word that holds value e */
    if (W <= 4) return b.f;
    if (W == 8) return f16_to_f32((uint16_t)(b.u >> 16 * (e % 2)));
    return (float)(int8_t)(b.u >> 8 * (e % 4));
}
KVT_INLINE void attn_fused_block(float *out, float *part, const float *q, kvt_kv kv, int l, int NH, int split_len,
                                 int nsplit, int W) {
    __shared__ float q_s[KVT_GQA][KVT_MAX_HS]; /* the pass's queries, pre-scaled by 1/sqrt(HS) */
    __shared__ float sc_s[KVT_GQA][KVT_THREADS], e_s[KVT_GQA][KVT_THREADS]; /* a tile's scores, weights */
    __shared__ float red_s[16 * KVT_THREADS + KVT_MAX_HS]; /* the slots' sums of a head: NS * HS of them */
    __shared__ size_t k_s[KVT_THREADS], g_s[KVT_THREADS]; /* where key j's K row and its scales start */
    int group = NH / kv.NKV, kh = (int)blockIdx.x / nsplit, sp = (int)blockIdx.x % nsplit;
    int r = (int)blockIdx.y, tid = (int)threadIdx.x, HS = kv.HS, NU = HS / W;
    int p = kv.row_pos[r], t_begin = sp * split_len, t_end = p + 1 < t_begin + split_len ? p + 1 : t_begin + split_len;
    size_t vo = (size_t)kv.CH * kv.NKV * HS, gV = (size_t)kv.CH * kv.NKV * kv.HG; /* V row: K row + vo, scales + gV */
    /* Fixed per thread: step 1's units (lane u: channels (u + v * KL) * W; kg:
     * int8 scale offsets), step 3's slot and units (channels cv, scales gv). */
    const int UK = (KVT_MAX_HS / W + KVT_KL - 1) / KVT_KL, UV = (KVT_MAX_HS / W + KVT_THREADS - 1) / KVT_THREADS;
    int u = tid % KVT_KL, kg[KVT_MAX_HS / KVT_KL], cv[KVT_VU], gv[KVT_VU];
    KVT_UNROLL for (int v = 0; v < UK; v++) kg[v] = W == 16 ? (u + v * KVT_KL) * W / kv.G : 0;
    int NS = NU < KVT_THREADS ? KVT_THREADS / NU : 1, slot = tid / NU < NS ? tid / NU : KVT_THREADS;
    KVT_UNROLL for (int v = 0; v < UV; v++) { /* a unit past the row (W = 1): unit 0 again, never stored */
        cv[v] = tid % NU + v * KVT_THREADS < NU ? (tid % NU + v * KVT_THREADS) * W : 0;
        gv[v] = W == 16 ? cv[v] / kv.G : 0;
    }
    for (int h0 = kh * group; h0 < (kh + 1) * group; h0 += KVT_GQA) { /* a pass: heads h0 .. h0 + nq - 1 */
        int nq = (kh + 1) * group - h0 < KVT_GQA ? (kh + 1) * group - h0 : KVT_GQA;
        for (int i = tid; i < nq * HS; i += KVT_THREADS) /* (the pass before is past its last barrier) */
            q_s[i / HS][i % HS] = q[((size_t)r * NH + h0) * HS + i] * (1.0f / sqrtf((float)HS));
        float m[KVT_GQA], sum[KVT_GQA], acc[KVT_GQA][KVT_VU][16] = {{{0.0f}}};
        KVT_UNROLL for (int h = 0; h < KVT_GQA; h++) m[h] = -INFINITY, sum[h] = 0.0f; /* running max m, sum l */
        for (int t0 = t_begin; t0 < t_end; t0 += KVT_THREADS) { /* same trip count in every thread */
            int tile = t_end - t0 < KVT_THREADS ? t_end - t0 : KVT_THREADS;
            if (tid < tile) { /* step 0 (V follows the chunk's K rows, CH * KVD further) */
                k_s[tid] = kv_index(&kv, l, 0, kv.row_tab[r], t0 + tid, kh);
                g_s[tid] = kv.scales ? k_s[tid] / (size_t)kv.G : 0;
            }
            __syncthreads(); /* the rows of the tile are in k_s, g_s (and q_s is complete) */
            for (int k = 0; k < KVT_KL; k++) { /* step 1: key j = g + k * groups */
                int j = tid / KVT_KL + k * (KVT_THREADS / KVT_KL);
                float d[KVT_GQA] = {0.0f}, x[16], sc[KVT_MAX_HS / KVT_KL];
                float4 xu[KVT_MAX_HS / KVT_KL];
                KVT_UNROLL for (int v = 0; v < UK; v++) /* the loads first, back to back */
                    if (j < tile && (u + v * KVT_KL) * W < HS) {
                        xu[v] = kv_unit_load(&kv, W, k_s[j] + (u + v * KVT_KL) * W);
                        sc[v] = W == 16 ? kv.scales[g_s[j] + kg[v]] : 1.0f;
                    }
                KVT_UNROLL for (int v = 0; v < UK; v++) {
                    int c = (u + v * KVT_KL) * W;
                    if (j >= tile || c >= HS) continue;
                    KVT_UNROLL for (int e = 0; e < W; e++) x[e] = kv_unit_at(xu[v], W, e);
                    KVT_UNROLL for (int h = 0; h < KVT_GQA && h < nq; h++) {
                        float dh = 0.0f;
                        KVT_UNROLL for (int e = 0; e < W; e++) dh += q_s[h][c + e] * x[e];
                        d[h] += dh * sc[v];
                    }
                }
                KVT_UNROLL for (int h = 0; h < KVT_GQA && h < nq; h++) { /* a butterfly: the key's sum in every lane */
                    for (int o = KVT_KL / 2; o > 0; o /= 2) d[h] += __shfl_xor_sync(0xffffffffu, d[h], o);
                    if (u == 0) sc_s[h][j] = j < tile ? d[h] : -INFINITY; /* past the tile: no weight */
                }
            }
            __syncthreads(); /* all scores of the tile are in sc_s */
            KVT_UNROLL for (int h = 0; h < KVT_GQA && h < nq; h++) { /* step 2: every thread finds the same new max */
                float m_new = m[h];
                for (int j = 0; j < tile; j++) m_new = fmaxf(m_new, sc_s[h][j]);
                float corr = expf(m[h] - m_new); /* moves what was summed so far onto the new max */
                e_s[h][tid] = tid < tile ? expf(sc_s[h][tid] - m_new) : 0.0f;
                m[h] = m_new;
                sum[h] *= corr;
                KVT_UNROLL for (int v = 0; v < UV; v++)
                    KVT_UNROLL for (int e = 0; e < W; e++) acc[h][v][e] *= corr;
            }
            __syncthreads(); /* all weights of the tile are in e_s */
            KVT_UNROLL for (int h = 0; h < KVT_GQA && h < nq; h++) { /* step 3: add this tile's weights ... */
                float tile_sum = 0.0f;
                for (int j = 0; j < tile; j++) tile_sum += e_s[h][j];
                sum[h] += tile_sum;
            }
            for (int i0 = slot; i0 < tile; i0 += KVT_VK * NS) { /* ... and values; past the tile: key i0, weight 0 */
                float4 xu[KVT_VK][KVT_VU];
                float sc[KVT_VK][KVT_VU], x[16];
                KVT_UNROLL for (int k = 0; k < KVT_VK; k++) /* the loads, back to back */
                    KVT_UNROLL for (int v = 0; v < UV; v++) {
                        int j = i0 + k * NS < tile ? i0 + k * NS : i0;
                        xu[k][v] = kv_unit_load(&kv, W, k_s[j] + vo + cv[v]);
                        sc[k][v] = W == 16 ? kv.scales[g_s[j] + gV + gv[v]] : 1.0f;
                    }
                KVT_UNROLL for (int k = 0; k < KVT_VK; k++) /* then their FMAs */
                    KVT_UNROLL for (int v = 0; v < UV; v++) {
                        KVT_UNROLL for (int e = 0; e < W; e++) x[e] = kv_unit_at(xu[k][v], W, e) * sc[k][v];
                        KVT_UNROLL for (int h = 0; h < KVT_GQA && h < nq; h++) {
                            float wk = i0 + k * NS < tile ? e_s[h][i0 + k * NS] : 0.0f;
                            KVT_UNROLL for (int e = 0; e < W; e++) acc[h][v][e] += wk * x[e];
                        }
                    }
            }
            __syncthreads(); /* the shared arrays are rewritten by the next tile */
        }
        /* One head at a time: every slot stores its units' sums in red_s,
         * thread c adds channel c over the slots (in a fixed order, no
         * atomics). One piece: out = acc / l (the softmax's division,
         * postponed to the end); several: leave (m, l, acc) for the merge. */
        KVT_UNROLL for (int h = 0; h < KVT_GQA && h < nq; h++) { /* nq is block-wide: no thread skips a barrier */
            KVT_UNROLL for (int v = 0; v < UV; v++)
                KVT_UNROLL for (int e = 0; e < W; e++)
                    if (slot < NS && tid % NU + v * KVT_THREADS < NU) red_s[slot * HS + cv[v] + e] = acc[h][v][e];
            __syncthreads(); /* every slot's sums are in red_s */
            float *pp = part + (((size_t)r * NH + h0 + h) * nsplit + sp) * (2 + HS);
            if (nsplit > 1 && tid == 0) { pp[0] = m[h]; pp[1] = sum[h]; }
            for (int c = tid; c < HS; c += KVT_THREADS) {
                float a = 0.0f;
                for (int i = 0; i < NS; i++) a += red_s[i * HS + c];
                if (nsplit == 1) out[((size_t)r * NH + h0 + h) * HS + c] = a / sum[h];
                else pp[2 + c] = a;
            }
            __syncthreads(); /* red_s is rewritten for the next head, q_s by the next pass */
        }
    }
}
/* One kernel per way of reading the cache: 16-byte units of fp32, fp16,
 * int8, or one value at a time (any type, any shape). */
#define KVT_FUSED(name, W) \
    __global__ void name(float *out, float *part, const float *q, kvt_kv kv, int l, int NH, int sl, int ns) { \
        attn_fused_block(out, part, q, kv, l, NH, sl, ns, W); }
KVT_FUSED(attn_fused_fp32_kernel, 4) KVT_FUSED(attn_fused_fp16_kernel, 8) KVT_FUSED(attn_fused_int8_kernel, 16)
KVT_FUSED(attn_fused_kernel, 1)
