/* y = x W^T for a few rows of x (any number, 16 at a time), bfloat16 weights and inputs, float32 sums: a decoding or
 * verification forward's linears.
 *
 * At a handful of rows a linear is a pass over its weights, and what it costs is reading them. This kernel
 * reads each weight once per 16 rows: the weights are packed as [N/16][K/2][16][2] so that one 64-byte load
 * holds two k values of 16 outputs, and AVX512-BF16's vdpbf16ps adds x[m][k] w[k][n] + x[m][k+1] w[k+1][n]
 * into a float32 accumulator per (row, output) in registers. Each output's sum runs over k in the same order
 * whatever the number of rows, so a row gets the same bits alone or in any batch (plain decoding and
 * verification agree).
 *
 * post: 0 none, 1 silu(y), 2 y + other, 3 y * other (other: [M, N] bfloat16), applied in float32 before the
 * result is rounded to bfloat16 (round to nearest even), as oneDNN's fused post-ops do.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define NB 16 /* outputs per block: one zmm of float32 */
#define MB 16 /* rows per pass over the weights: accumulators in registers */

static inline float silu(float v) { return v / (1.0f + expf(-v)); }

static void block(const uint16_t *x, int64_t m0, int m, int64_t k, const uint16_t *wb, float *out) {
    /* out[m][NB] = x[m0 .. m0+m) . block; wb: [k/2][NB][2] */
    __m512 acc[MB];
    for (int r = 0; r < m; r++) acc[r] = _mm512_setzero_ps();
    const int32_t *xr[MB];
    for (int r = 0; r < m; r++) xr[r] = (const int32_t *)(x + (m0 + r) * k);
    for (int64_t p = 0; p < k / 2; p++) {
        __m512bh w = (__m512bh)_mm512_loadu_si512((const void *)(wb + p * 2 * NB));
        for (int r = 0; r < m; r++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32(xr[r][p]);
            acc[r] = _mm512_dpbf16_ps(acc[r], xv, w);
        }
    }
    for (int r = 0; r < m; r++) _mm512_storeu_ps(out + r * NB, acc[r]);
}

static inline uint16_t to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

/* x [M, K] bf16 (K even), wp packed [N/16][K/2][16][2] bf16 (N a multiple of 16), y [M, N] bf16 */
void small_gemm(const uint16_t *x, const uint16_t *wp, uint16_t *y, const uint16_t *other, int64_t M, int64_t K,
                int64_t N, int post) {
    int64_t nblocks = N / NB;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
        float out[MB * NB];
        const uint16_t *wb = wp + b * K * NB;
        for (int64_t m0 = 0; m0 < M; m0 += MB) {
            int m = (int)(M - m0 < MB ? M - m0 : MB);
            block(x, m0, m, K, wb, out);
            for (int r = 0; r < m; r++) {
                for (int j = 0; j < NB; j++) {
                    int64_t at = (m0 + r) * N + b * NB + j;
                    float v = out[r * NB + j];
                    if (post == 1) v = silu(v);
                    else if (post == 2) v += from_bf16(other[at]);
                    else if (post == 3) v *= from_bf16(other[at]);
                    y[at] = to_bf16(v);
                }
            }
        }
    }
}

/* w [N, K] bf16 row-major -> wp [N/16][K/2][16][2] */
void small_gemm_pack(const uint16_t *w, uint16_t *wp, int64_t K, int64_t N) {
    for (int64_t b = 0; b < N / NB; b++)
        for (int64_t p = 0; p < K / 2; p++)
            for (int j = 0; j < NB; j++)
                for (int t = 0; t < 2; t++)
                    wp[((b * (K / 2) + p) * NB + j) * 2 + t] = w[(b * NB + j) * K + 2 * p + t];
}
