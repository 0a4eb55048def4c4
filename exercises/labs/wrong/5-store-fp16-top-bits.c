/* kv_store: fp16 stored as the top 16 bits of the float (that is bf16, not IEEE half) */
    if (kv->dtype == KVT_FP32) {
        for (int c = 0; c < count; c++) ((float *)kv->data)[i + c] = src[c];
    } else if (kv->dtype == KVT_FP16) {
        for (int c = 0; c < count; c++) {
            kvt_bits b;
            b.f = src[c];
            ((uint16_t *)kv->data)[i + c] = (uint16_t)(b.u >> 16);
        }
    } else {
        kv->scales[i / (size_t)kv->G] = quantize_group(src, (int8_t *)kv->data + i, count);
    }
