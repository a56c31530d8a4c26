/* y = x W^T for a few rows of x, float32 inputs and sums, with AVX2 and FMA: a decoding or verification
 * forward's linears on CPUs without AVX512-BF16. Weights are float32, or float16 when built with -DWEIGHT_F16
 * (F16C's vcvtph2ps widens 8 of them per load): half the bytes to read, for a drafter whose weights were
 * trained and stored in float16, so that nothing is rounded that was not already.
 *
 * At a handful of rows a linear is a pass over its weights, and what it costs is reading them. The weights are
 * packed as [N/32][K][32]: for each k, the 32 outputs of a block lie in two cache lines, and a block is read
 * front to back. A pass takes 3 rows over one block with 12 accumulators (3 rows x 4 ymm of 8 outputs) in
 * registers; further rows pass over the same block again while it is still in L2 (32 x 1536 floats, 192 KB at
 * most for the embedded model), so memory is read once per block whatever the number of rows.
 *
 * Each output's sum runs over k in order with one fused multiply-add per k, in a register of its own, whatever
 * the number of rows or the pass a row falls in: a row gets the same bits alone or in any batch (plain decoding
 * and verification agree).
 *
 * post: 0 none, 1 silu(y), 2 y + other, 3 y * other (other: [M, N] float32), as oneDNN's fused post-ops.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#ifdef WEIGHT_F16
typedef uint16_t wtype;
#define LOADW(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define GEMM small_gemm_f16w
#define PACK small_gemm_f16w_pack
#else
typedef float wtype;
#define LOADW(p) _mm256_loadu_ps(p)
#define GEMM small_gemm_f32
#define PACK small_gemm_f32_pack
#endif

#define NB 32 /* outputs per block: four ymm of float32 */
#define MB 3  /* rows per pass over a block: 12 accumulators */

static inline float silu(float v) { return v / (1.0f + expf(-v)); }

static inline void finish(float *y, const float *other, int post, __m256 acc, int64_t at) {
    if (post == 0) {
        _mm256_storeu_ps(y + at, acc);
        return;
    }
    float v[8];
    _mm256_storeu_ps(v, acc);
    for (int j = 0; j < 8; j++) {
        if (post == 1) v[j] = silu(v[j]);
        else if (post == 2) v[j] += other[at + j];
        else v[j] *= other[at + j];
    }
    __builtin_memcpy(y + at, v, sizeof v);
}

/* rows m0 .. m0 + m (m <= MB) of x times one block wb [K][NB]; outputs n0 .. n0 + NB of y. The loop is written
 * out per row count: a generic one over accumulator arrays, inlined with m constant, spilled to the stack and
 * took 1.5x as long from 4 rows on. */
static void block(const float *x, int64_t m0, int m, int64_t k, const wtype *wb, float *y, const float *other,
                  int64_t n, int64_t n0, int post, const char *ahead, int64_t ahead_step) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    const float *x0 = x + m0 * k, *x1 = x0 + k, *x2 = x1 + k;
    if (m == 3) {
        for (int64_t p = 0; p < k; p++) {
            const wtype *w = wb + p * NB;
            _mm_prefetch(ahead + p * ahead_step, _MM_HINT_T1);
            __m256 w0 = LOADW(w), w1 = LOADW(w + 8), w2 = LOADW(w + 16), w3 = LOADW(w + 24);
            __m256 b = _mm256_broadcast_ss(x0 + p);
            a00 = _mm256_fmadd_ps(b, w0, a00); a01 = _mm256_fmadd_ps(b, w1, a01);
            a02 = _mm256_fmadd_ps(b, w2, a02); a03 = _mm256_fmadd_ps(b, w3, a03);
            b = _mm256_broadcast_ss(x1 + p);
            a10 = _mm256_fmadd_ps(b, w0, a10); a11 = _mm256_fmadd_ps(b, w1, a11);
            a12 = _mm256_fmadd_ps(b, w2, a12); a13 = _mm256_fmadd_ps(b, w3, a13);
            b = _mm256_broadcast_ss(x2 + p);
            a20 = _mm256_fmadd_ps(b, w0, a20); a21 = _mm256_fmadd_ps(b, w1, a21);
            a22 = _mm256_fmadd_ps(b, w2, a22); a23 = _mm256_fmadd_ps(b, w3, a23);
        }
    } else if (m == 2) {
        for (int64_t p = 0; p < k; p++) {
            const wtype *w = wb + p * NB;
            _mm_prefetch(ahead + p * ahead_step, _MM_HINT_T1);
            __m256 w0 = LOADW(w), w1 = LOADW(w + 8), w2 = LOADW(w + 16), w3 = LOADW(w + 24);
            __m256 b = _mm256_broadcast_ss(x0 + p);
            a00 = _mm256_fmadd_ps(b, w0, a00); a01 = _mm256_fmadd_ps(b, w1, a01);
            a02 = _mm256_fmadd_ps(b, w2, a02); a03 = _mm256_fmadd_ps(b, w3, a03);
            b = _mm256_broadcast_ss(x1 + p);
            a10 = _mm256_fmadd_ps(b, w0, a10); a11 = _mm256_fmadd_ps(b, w1, a11);
            a12 = _mm256_fmadd_ps(b, w2, a12); a13 = _mm256_fmadd_ps(b, w3, a13);
        }
    } else {
        for (int64_t p = 0; p < k; p++) {
            const wtype *w = wb + p * NB;
            _mm_prefetch(ahead + p * ahead_step, _MM_HINT_T1);
            __m256 b = _mm256_broadcast_ss(x0 + p);
            a00 = _mm256_fmadd_ps(b, LOADW(w), a00);
            a01 = _mm256_fmadd_ps(b, LOADW(w + 8), a01);
            a02 = _mm256_fmadd_ps(b, LOADW(w + 16), a02);
            a03 = _mm256_fmadd_ps(b, LOADW(w + 24), a03);
        }
    }
    __m256 acc[3][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}};
    for (int r = 0; r < m; r++)
        for (int j = 0; j < 4; j++) finish(y, other, post, acc[r][j], (m0 + r) * n + n0 + 8 * j);
}

/* x [M, K], wp packed [N/32][K][32] (N a multiple of 32), y [M, N]; other [M, N] for post 2 and 3 */
void GEMM(const float *x, const wtype *wp, float *y, const float *other, int64_t M, int64_t K, int64_t N,
                    int post) {
    int64_t nblocks = N / NB;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
        const wtype *wb = wp + b * K * NB;
        /* the passes over this block also bring the next one into L2, a share each, so the later passes'
         * arithmetic overlaps the reading of memory instead of following it */
        int64_t n_pass = (M + MB - 1) / MB;
        const char *next = (const char *)(wp + (b + 1 < nblocks ? b + 1 : b) * K * NB);
        int64_t step = n_pass > 1 ? (int64_t)(NB * sizeof(wtype)) / n_pass : 0; /* one pass: the hardware's own */
        for (int64_t m0 = 0, j = 0; m0 < M; m0 += MB, j++) {
            int m = (int)(M - m0 < MB ? M - m0 : MB);
            block(x, m0, m, K, wb, y, other, N, b * NB, post, next + j * K * step, step);
        }
    }
}

/* w [N, K] row-major -> wp [N/32][K][32], in the weights' own type */
void PACK(const wtype *w, wtype *wp, int64_t K, int64_t N) {
    for (int64_t b = 0; b < N / NB; b++)
        for (int64_t p = 0; p < K; p++)
            for (int j = 0; j < NB; j++) wp[(b * K + p) * NB + j] = w[(b * NB + j) * K + p];
}
