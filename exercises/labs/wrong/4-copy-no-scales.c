/* pool_copy_chunk: copies the int8 values but not their scales */
    size_t eb = kvt_dtype_size(p->dtype, p->chunk_elems);
    char *d = (char *)p->data;
    buf_copy(p->on_device, d + (size_t)dst * eb, d + (size_t)src * eb, eb);
