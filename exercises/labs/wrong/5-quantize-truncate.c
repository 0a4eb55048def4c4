/* quantize_group: q = x / scale truncated toward zero instead of rounded */
    float amax = 0.0f;
    for (int i = 0; i < g; i++) amax = fmaxf(amax, fabsf(x[i]));
    float scale = amax / 127.0f;
    for (int i = 0; i < g; i++) q[i] = (int8_t)(scale > 0.0f ? x[i] / scale : 0.0f);
    return scale;
