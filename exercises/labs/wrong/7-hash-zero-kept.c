/* prefix_hash_of: a hash of 0 is returned as is, though 0 means "no hash" */
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) { h ^= (uint32_t)tokens[i]; h *= 1099511628211ULL; }
    if (kvt_prefix_hash_bits < 64) h &= (1ULL << kvt_prefix_hash_bits) - 1;
    return h;
