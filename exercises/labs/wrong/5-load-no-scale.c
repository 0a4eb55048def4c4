/* kv_load_at: an int8 value is returned as q, without its scale */
    if (kv->dtype == KVT_FP32) return ((const float *)kv->data)[i];
    if (kv->dtype == KVT_FP16) return f16_to_f32(((const uint16_t *)kv->data)[i]);
    (void)si;
    return (float)((const int8_t *)kv->data)[i];
