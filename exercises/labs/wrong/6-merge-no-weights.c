/* attention_merge_cpu: averages the pieces' acc / l, ignoring how much of the softmax each piece holds */
    for (int rh = 0; rh < n * NH; rh++) {
        const float *pr = part + (size_t)rh * nsplit * (2 + HS);
        float *oh = out + (size_t)rh * HS;
        int used = 0;
        for (int c = 0; c < HS; c++) oh[c] = 0.0f;
        for (int sp = 0; sp < nsplit; sp++) {
            const float *pp = pr + sp * (2 + HS);
            if (pp[1] == 0.0f) continue;
            used++;
            for (int c = 0; c < HS; c++) oh[c] += pp[2 + c] / pp[1];
        }
        for (int c = 0; c < HS; c++) oh[c] /= (float)used;
    }
