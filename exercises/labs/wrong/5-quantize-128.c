/* quantize_group: scale = max|x| / 128, so the largest value does not fit and is clamped */
    float amax = 0.0f;
    for (int i = 0; i < g; i++) amax = fmaxf(amax, fabsf(x[i]));
    float scale = amax / 128.0f;
    for (int i = 0; i < g; i++) {
        float v = scale > 0.0f ? roundf(x[i] / scale) : 0.0f;
        q[i] = (int8_t)fminf(127.0f, fmaxf(-127.0f, v));
    }
    return scale;
