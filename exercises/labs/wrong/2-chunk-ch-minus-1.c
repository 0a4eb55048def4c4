/* kv_index: the chunk table entry found with CH - 1 */
    int chunk = kv->tables[tab + pos / (kv->CH - 1)], slot = pos % kv->CH;
    return (size_t)chunk * kv->chunk_elems +
           ((size_t)(l * 2 + which) * kv->CH + slot) * (size_t)(kv->NKV * kv->HS) + (size_t)h * kv->HS;
