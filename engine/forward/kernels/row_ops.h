/* Per-row pieces the C layers share (lean_layers.c, head_step.c): each row alone, in a fixed order of
 * arithmetic, so a row gets the same bits in any batch. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* out = w * (x / sqrt(mean(x^2) + eps)), the sum of squares in 8 lanes in order, then pairwise */
static void rms_row(const float *x, const float *w, float *out, int64_t d, float eps) {
    float lanes[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
        for (int j = 0; j < 8; j++) lanes[j] += x[i + j] * x[i + j];
    for (int j = 0; i < d; i++, j++) lanes[j] += x[i] * x[i];
    const float ss = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    const float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (i = 0; i < d; i++) out[i] = w[i] * (x[i] * r);
}

/* rotary embedding of n_heads heads of width hd (<= 512) in place, transformers' rotate_half:
 * z[i] cos[i] - z[i + hd/2] sin[i] for i < hd/2, z[i] cos[i] + z[i - hd/2] sin[i] above */
static void rope_row(float *z, int n_heads, int hd, const float *cos, const float *sin) {
    const int half = hd / 2;
    float tmp[512];
    for (int h = 0; h < n_heads; h++) {
        float *zh = z + (int64_t)h * hd;
        memcpy(tmp, zh, sizeof(float) * hd);
        for (int i = 0; i < half; i++) zh[i] = tmp[i] * cos[i] - tmp[i + half] * sin[i];
        for (int i = half; i < hd; i++) zh[i] = tmp[i] * cos[i] + tmp[i - half] * sin[i];
    }
}
