/* attn_softmax_kernel: each thread divides by its own partial sum (no block reduction) */
    int h = (int)blockIdx.x, r = (int)blockIdx.y, T = kv.row_len[r];
    float *s = scores + ((size_t)r * NH + h) * TMAX;
    float mx = -INFINITY, sum = 0.0f;
    for (int t = (int)threadIdx.x; t < T; t += (int)blockDim.x) mx = fmaxf(mx, s[t]);
    mx = block_reduce(mx, KVT_MAX);
    for (int t = (int)threadIdx.x; t < T; t += (int)blockDim.x) { s[t] = expf(s[t] - mx); sum += s[t]; }
    for (int t = (int)threadIdx.x; t < T; t += (int)blockDim.x) s[t] /= sum;
