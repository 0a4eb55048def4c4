/* kv_write_cpu: every row written through the first sequence's table */
    int unit = kv.dtype == KVT_INT8 ? kv.G : kv.HS, KVD = kv.NKV * kv.HS; /* the CPU stores a head's row at once */
#pragma omp parallel for if (n > 8) /* every row writes its own slot */
    for (int r = 0; r < n; r++)
        for (int which = 0; which < 2; which++)
            for (int h = 0; h < kv.NKV; h++) {
                size_t i = kv_index(&kv, l, which, 0, kv.row_pos[r], h);
                for (int c = 0; c < kv.HS; c += unit)
                    kv_store(&kv, i + c, (which ? v : k) + (size_t)r * KVD + h * kv.HS + c, unit);
            }
