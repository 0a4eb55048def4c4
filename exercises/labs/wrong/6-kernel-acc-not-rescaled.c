/* attn_fused_plain_kernel: a tile that raises the max rescales l but not the channels' accumulators */
    __shared__ float s[KVT_THREADS];
    int h = (int)blockIdx.x / nsplit, sp = (int)blockIdx.x % nsplit, r = (int)blockIdx.y, HS = kv.HS;
    int kh = h / (NH / kv.NKV), p = kv.row_pos[r], t0 = sp * split_len, tid = (int)threadIdx.x;
    int t1 = p + 1 < t0 + split_len ? p + 1 : t0 + split_len;
    const float *qh = q + ((size_t)r * NH + h) * HS;
    float scale = 1.0f / sqrtf((float)HS), m = -INFINITY, sum = 0.0f, acc[KVT_MAX_HS / KVT_THREADS];
    for (int u = 0; u < KVT_MAX_HS / KVT_THREADS; u++) acc[u] = 0.0f;
    for (int tile = t0; tile < t1; tile += KVT_THREADS) {
        int nt = t1 - tile < KVT_THREADS ? t1 - tile : KVT_THREADS;
        if (tid < nt) s[tid] = kv_dot(&kv, kv_index(&kv, l, 0, kv.row_tab[r], tile + tid, kh), qh, HS) * scale;
        __syncthreads();
        float mt = m;
        for (int j = 0; j < nt; j++) mt = fmaxf(mt, s[j]);
        sum *= expf(m - mt);
        for (int j = 0; j < nt; j++) {
            float e = expf(s[j] - mt);
            size_t vi = kv_index(&kv, l, 1, kv.row_tab[r], tile + j, kh);
            sum += e;
            for (int c = tid, u = 0; c < HS; c += KVT_THREADS, u++) acc[u] += e * kv_load(&kv, vi + (size_t)c);
        }
        m = mt;
        __syncthreads();
    }
    float *pp = part + (((size_t)r * NH + h) * nsplit + sp) * (2 + HS);
    if (tid == 0) { pp[0] = m; pp[1] = sum; }
    for (int c = tid, u = 0; c < HS; c += KVT_THREADS, u++) pp[2 + c] = acc[u];
