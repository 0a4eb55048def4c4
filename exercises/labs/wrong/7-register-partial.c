/* prefix_register: names the partly filled last chunk too, by the tokens it holds so far */
    for (int i = old_len / p->CH; i * p->CH < s->len; i++) {
        int end = (i + 1) * p->CH < s->len ? (i + 1) * p->CH : s->len;
        if (p->prefix_hash[s->table[i]] == 0) p->prefix_hash[s->table[i]] = prefix_hash_of(s->tokens, end);
    }
