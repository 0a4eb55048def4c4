/* pool_take: takes the bottom of the free list, so the list is read as a queue */
    KVT_ASSERT(p->n_free > 0);
    int id = p->free_list[0];
    memmove(p->free_list, p->free_list + 1, (size_t)(p->n_free - 1) * sizeof(int));
    p->n_free--;
    KVT_ASSERT(p->refcount[id] == 0);
    p->refcount[id] = 1;
    int used = p->n_chunks - p->n_free;
    if (used > p->peak_used) p->peak_used = used;
    return id;
