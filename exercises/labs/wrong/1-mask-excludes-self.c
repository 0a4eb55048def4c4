/* attention_naive_cpu: the mask also hides the query's own position (t >= p) */
    int HS = kv.HS, group = NH / kv.NKV;
    float scale = 1.0f / sqrtf((float)HS);
    /* every (row, head) is independent, with its own score row: one per core at a time */
#pragma omp parallel for collapse(2) schedule(dynamic) if (n * NH > 1)
    for (int r = 0; r < n; r++) {
        for (int h = 0; h < NH; h++) {
            int p = kv.row_pos[r], T = kv.row_len[r];
            const float *qh = q + ((size_t)r * NH + h) * HS;
            float *s = scores + ((size_t)r * NH + h) * TMAX;
            for (int t = 0; t < T; t++) {
                if (t >= p) { s[t] = -INFINITY; continue; } /* the causal mask */
                size_t ki = kv_index(&kv, l, 0, kv.row_tab[r], t, h / group);
                s[t] = kv_dot(&kv, ki, qh, HS) * scale;
            }
            float mx = -INFINITY, sum = 0.0f; /* softmax, shifted by the max so exp never overflows */
            for (int t = 0; t < T; t++) mx = fmaxf(mx, s[t]);
            for (int t = 0; t < T; t++) { s[t] = expf(s[t] - mx); sum += s[t]; }
            for (int t = 0; t < T; t++) s[t] /= sum;
            float *oh = out + ((size_t)r * NH + h) * HS;
            for (int c = 0; c < HS; c++) oh[c] = 0.0f;
            for (int t = 0; t <= p; t++) kv_axpy(&kv, kv_index(&kv, l, 1, kv.row_tab[r], t, h / group), s[t], oh, HS);
        }
    }
