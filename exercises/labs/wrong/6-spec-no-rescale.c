/* attention_fused_spec_cpu: a new max rescales the sum but not the accumulator */
    int HS = kv.HS, group = NH / kv.NKV;
    float scale = 1.0f / sqrtf((float)HS);
    for (int r = 0; r < n; r++)
        for (int h = 0; h < NH; h++)
            for (int sp = 0; sp < nsplit; sp++) {
                int p = kv.row_pos[r], kh = h / group, t0 = sp * split_len;
                int t1 = p + 1 < t0 + split_len ? p + 1 : t0 + split_len;
                const float *qh = q + ((size_t)r * NH + h) * HS;
                float *pp = part + (((size_t)r * NH + h) * nsplit + sp) * (2 + HS), *acc = pp + 2;
                float m = -INFINITY, sum = 0.0f;
                for (int c = 0; c < HS; c++) acc[c] = 0.0f;
                for (int t = t0; t < t1; t++) {
                    float s = kv_dot(&kv, kv_index(&kv, l, 0, kv.row_tab[r], t, kh), qh, HS) * scale;
                    if (s > m) { sum *= expf(m - s); m = s; }
                    float w = expf(s - m);
                    sum += w;
                    kv_axpy(&kv, kv_index(&kv, l, 1, kv.row_tab[r], t, kh), w, acc, HS);
                }
                pp[0] = m;
                pp[1] = sum;
            }
    attention_merge_cpu(out, part, n, NH, HS, nsplit);
