/* kv_index: the (layer, K/V) block index as which * 2 + l */
    int chunk = kv->tables[tab + pos / kv->CH], slot = pos % kv->CH;
    return (size_t)chunk * kv->chunk_elems +
           ((size_t)(which * 2 + l) * kv->CH + slot) * (size_t)(kv->NKV * kv->HS) + (size_t)h * kv->HS;
