/* pool_release: the chunk goes back to the free list while another holder still uses it */
    KVT_ASSERT(id >= 0 && id < p->n_chunks && p->refcount[id] > 0);
    p->refcount[id] = 0;
    p->free_list[p->n_free++] = id;
    p->prefix_hash[id] = 0;
