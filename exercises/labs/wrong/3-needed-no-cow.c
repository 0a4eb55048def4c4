/* seq_chunks_needed: forgets the private copy of a shared, partly filled last chunk */
    return kvt_cdiv(new_len, p->CH) - s->n_table;
