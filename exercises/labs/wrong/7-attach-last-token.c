/* prefix_attach: attaches every full chunk, so a prompt that is all cached has no token left to compute */
    int k = 0;
    KVT_ASSERT(s->len == 0 && s->n_table == 0);
    while ((k + 1) * p->CH <= n) {
        uint64_t h = prefix_hash_of(tokens, (k + 1) * p->CH);
        int hit = -1;
        for (int c = 0; c < p->n_chunks && hit < 0; c++)
            if (p->refcount[c] > 0 && p->prefix_hash[c] == h) {
                if (prefix_confirmed(p, live, c, k, tokens)) hit = c;
                else p->prefix_collisions++;
            }
        if (hit < 0) break;
        s->how[k] = '+';
        s->table[k++] = hit;
        p->refcount[hit]++;
    }
    p->prefix_hits += k;
    p->prefix_misses += kvt_cdiv(n, p->CH) - k;
    s->n_table = k;
    s->len = k * p->CH;
    memcpy(s->tokens, tokens, (size_t)s->len * sizeof(int));
    return s->len;
