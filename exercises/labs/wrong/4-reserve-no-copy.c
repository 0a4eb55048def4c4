/* seq_reserve: swaps in a fresh chunk for a shared one without copying what it held */
    int want = kvt_cdiv(new_len, p->CH), cow = seq_needs_cow(p, s, new_len);
    int need = seq_chunks_needed(p, s, new_len);
    if (need > p->n_free)
        return kvt_fail(KVT_EPOOL, "KV cache pool exhausted: %s needs %d more chunk(s)", who, need);
    if (cow) {
        int i = s->len / p->CH, fresh = pool_take(p);
        pool_release(p, s->table[i]);
        s->table[i] = fresh;
        s->how[i] = 'c';
        p->cow_copies++;
    }
    for (; s->n_table < want; s->n_table++) {
        s->table[s->n_table] = pool_take(p);
        s->how[s->n_table] = 0;
    }
    return KVT_OK;
