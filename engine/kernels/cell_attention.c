/* Attention of each row over its own cells, one row at a time, in a fixed order of arithmetic.
 *
 * A row's output is a function of its query and of the K/V of the cells it sees, listed in position order,
 * and of nothing else: not of the other rows of the batch, not of how many cells the cache holds, not of where
 * they are stored, not of the number of threads. So a verification forward (k+1 rows), a tree of drafts, a
 * prompt prefilled at once and plain decoding one row at a time all give the same bits for the same position.
 * BLAS and torch's SDPA choose kernels and blockings by shape, which breaks that (engine/attention.py).
 *
 * Per (row, key head): scores s_i = scale * q . k_i over the row's cells (the H / H_kv query heads sharing the
 * key head in one pass), m = max s, e_i = exp(s_i - m), out = (sum_i e_i v_i) / (sum_i e_i), every sum taken
 * in cell-list order; dot products in 16 fixed lanes reduced pairwise. The loops below are shaped for speed
 * (4 cells' dot products interleaved, the weighted sum kept in registers for 64-wide heads), never at the
 * cost of that order: each element's sums are the ones the plain loop over cells would take.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* exp(x) for x <= 0 (scores minus their max): 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p the degree-6
 * Taylor polynomial (relative error under 2e-7); written without calls so the loop vectorizes, and the same
 * code for every element so a score's exp never depends on where it sits in the loop. */
static inline float exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  /* round to nearest */
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { float f; int32_t i; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

static float dot(const float *a, const float *b, int d) {
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= d; i += 16)
        for (int j = 0; j < 16; j++) lane[j] += a[i + j] * b[i + j];
    float tail = 0.0f;
    for (; i < d; i++) tail += a[i] * b[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) lane[j] += lane[j + w];
    return lane[0] + tail;
}

/* sum_i e_i v_i for head_dim 64 and up to 4 query heads, the sums kept in registers: the same additions in
 * the same cell order as the general loop */
static void weigh64(const float *restrict vb, const int64_t *restrict cells, int64_t n, int group,
                    const float *restrict s, float *restrict o) {
    float acc[4][64] = {{0}};
    for (int64_t i = 0; i < n; i++) {
        const float *restrict vc = vb + cells[i] * 64;
        for (int g = 0; g < group; g++) {
            const float e = s[g * n + i];
            for (int d = 0; d < 64; d++) acc[g][d] += e * vc[d];
        }
    }
    for (int g = 0; g < group; g++)
        for (int d = 0; d < 64; d++) o[g * 64 + d] = acc[g][d];
}

/* q . k for 4 cells at once: each is the arithmetic of dot(), interleaved so the four run side by side */
static void dot4(const float *a, const float *k0, const float *k1, const float *k2, const float *k3, int d,
                 float *out) {
    float l0[16] = {0}, l1[16] = {0}, l2[16] = {0}, l3[16] = {0};
    int i = 0;
    for (; i + 16 <= d; i += 16)
        for (int j = 0; j < 16; j++) {
            const float x = a[i + j];
            l0[j] += x * k0[i + j];
            l1[j] += x * k1[i + j];
            l2[j] += x * k2[i + j];
            l3[j] += x * k3[i + j];
        }
    float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
    for (; i < d; i++) {
        t0 += a[i] * k0[i];
        t1 += a[i] * k1[i];
        t2 += a[i] * k2[i];
        t3 += a[i] * k3[i];
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) {
            l0[j] += l0[j + w];
            l1[j] += l1[j + w];
            l2[j] += l2[j + w];
            l3[j] += l3[j + w];
        }
    out[0] = l0[0] + t0;
    out[1] = l1[0] + t1;
    out[2] = l2[0] + t2;
    out[3] = l3[0] + t3;
}

/* One row, one key head: its `group` query heads qr over the n cells listed in `cells`; s: scratch of
 * group * (n + 1) floats; o: group * head_dim outputs. */
static void one_task(const float *qr, const float *kb, const float *vb, const int64_t *cells, int64_t n,
                     int group, int head_dim, float scale, float *s, float *o) {
    int64_t i = 0;
    float four[4];
    for (; i + 4 <= n; i += 4) {
        const float *c0 = kb + cells[i] * head_dim, *c1 = kb + cells[i + 1] * head_dim;
        const float *c2 = kb + cells[i + 2] * head_dim, *c3 = kb + cells[i + 3] * head_dim;
        for (int g = 0; g < group; g++) {
            dot4(qr + g * head_dim, c0, c1, c2, c3, head_dim, four);
            for (int j = 0; j < 4; j++) s[g * n + i + j] = four[j] * scale;
        }
    }
    for (; i < n; i++) {
        const float *kc = kb + cells[i] * head_dim;
        for (int g = 0; g < group; g++) s[g * n + i] = dot(qr + g * head_dim, kc, head_dim) * scale;
    }
    float *total = s + (int64_t)group * n;  /* per query head: the sum of its e_i */
    for (int g = 0; g < group; g++) {
        float *sg = s + g * n, m = sg[0], sum = 0.0f;
        for (int64_t i = 1; i < n; i++) m = sg[i] > m ? sg[i] : m;
        for (int64_t i = 0; i < n; i++) sg[i] = exp_neg(sg[i] - m);
        for (int64_t i = 0; i < n; i++) sum += sg[i];
        total[g] = sum;
    }
    if (head_dim == 64 && group <= 4) {
        weigh64(vb, cells, n, group, s, o);
    } else {
        for (int64_t i = 0; i < (int64_t)group * head_dim; i++) o[i] = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            const float *vc = vb + cells[i] * head_dim;
            for (int g = 0; g < group; g++) {
                const float e = s[g * n + i];
                float *og = o + (int64_t)g * head_dim;
                for (int d = 0; d < head_dim; d++) og[d] += e * vc[d];
            }
        }
    }
    for (int g = 0; g < group; g++)
        for (int d = 0; d < head_dim; d++) o[(int64_t)g * head_dim + d] /= total[g];
}

/* q [n_rows, n_heads, head_dim]; k, v: key head h at k + h * head_stride, cell c at + c * head_dim;
 * row r sees cells[row_ptr[r] .. row_ptr[r + 1]) in position order; out [n_rows, n_heads, head_dim].
 * Returns 0, or -1 if scratch memory could not be had. */
int cell_attention(const float *q, const float *k, const float *v, int64_t head_stride, const int64_t *row_ptr,
                   const int64_t *cells, float *out, int64_t n_rows, int n_heads, int n_kv_heads, int head_dim,
                   float scale) {
    const int group = n_heads / n_kv_heads;
    int failed = 0;
#pragma omp parallel
    {
        float *s = NULL;
        int64_t cap = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_rows * n_kv_heads; task++) {
            const int64_t r = task / n_kv_heads, c0 = row_ptr[r], n = row_ptr[r + 1] - c0;
            const int kh = (int)(task % n_kv_heads);
            const int64_t at = (r * n_heads + (int64_t)kh * group) * head_dim;
            if (n <= 0) {  /* a row that sees nothing: zeros (nothing to average) */
                for (int64_t i = 0; i < (int64_t)group * head_dim; i++) out[at + i] = 0.0f;
                continue;
            }
            if (cap < group * (n + 1)) {
                free(s);
                cap = group * (n + 1);
                s = malloc(sizeof(float) * cap);
            }
            if (!s) {
                cap = 0;
#pragma omp atomic write
                failed = 1;
                continue;
            }
            one_task(q + at, k + kh * head_stride, v + kh * head_stride, cells + c0, n, group, head_dim, scale, s,
                     out + at);
        }
        free(s);
    }
    return failed ? -1 : 0;
}
