/* seq_reserve: takes chunks one by one until the pool runs out, so a refused request still holds some */
    int want = kvt_cdiv(new_len, p->CH);
    if (seq_needs_cow(p, s, new_len)) {
        if (p->n_free == 0) return kvt_fail(KVT_EPOOL, "KV cache pool exhausted: %s", who);
        int i = s->len / p->CH, fresh = pool_take(p);
        pool_copy_chunk(p, fresh, s->table[i]);
        pool_release(p, s->table[i]);
        s->table[i] = fresh;
        s->how[i] = 'c';
        p->cow_copies++;
    }
    for (; s->n_table < want; s->n_table++) {
        if (p->n_free == 0) return kvt_fail(KVT_EPOOL, "KV cache pool exhausted: %s", who);
        s->table[s->n_table] = pool_take(p);
        s->how[s->n_table] = 0;
    }
    return KVT_OK;
