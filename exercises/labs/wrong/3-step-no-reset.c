/* kvt_step: without the cache, runs only the new tokens (the cache is still there, so the logits agree) */
    if (s->len >= n_hist)
        return kvt_fail(KVT_EARG, "step: %d tokens of history but %d already cached", n_hist, s->len);
    return kvt_forward(e, s, history + s->len, n_hist - s->len, logits, 0);
