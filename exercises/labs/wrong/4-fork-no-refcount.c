/* kvt_seq_fork: shares the chunk table without counting the new holder */
    if (src->n_swapped)
        return kvt_fail(KVT_EARG, "fork: sequence %d is swapped out (swap it in first)", src->id);
    kvt_status st = kvt_seq_init(e, dst);
    if (st != KVT_OK) return st;
    for (int i = 0; i < src->n_table; i++) dst->table[i] = src->table[i];
    dst->n_table = src->n_table;
    dst->len = src->len;
    memcpy(dst->tokens, src->tokens, (size_t)src->len * sizeof(int));
    e->pool.shared_hits += src->n_table;
    return KVT_OK;
