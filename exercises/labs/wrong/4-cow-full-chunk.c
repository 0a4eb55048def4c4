/* seq_needs_cow: copies a shared chunk even when it is full (the next position starts a new one) */
    return new_len > s->len && s->n_table > 0 && p->refcount[s->table[(s->len - 1) / p->CH]] > 1;
