/* kv_dot: int8 rows use the first group's scale for every group */
    float s = 0.0f;
    for (int c = 0; c < HS; c++) {
        if (kv->dtype == KVT_FP32) s += q[c] * ((const float *)kv->data)[i + c];
        else if (kv->dtype == KVT_FP16) s += q[c] * f16_to_f32(((const uint16_t *)kv->data)[i + c]);
        else s += q[c] * (float)((const int8_t *)kv->data)[i + c] * kv->scales[i / (size_t)kv->G];
    }
    return s;
