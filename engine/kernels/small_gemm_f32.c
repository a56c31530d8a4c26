/* y = x W^T for a few rows of x, float32 inputs and sums, with AVX2 and FMA: a decoding or verification
 * forward's linears on CPUs without AVX512-BF16. Weights are float32, or float16 when built with -DWEIGHT_F16
 * (F16C's vcvtph2ps widens 8 of them per load): half the bytes to read, for a drafter whose weights were
 * trained and stored in float16, so that nothing is rounded that was not already.
 *
 * At a handful of rows a linear is a pass over its weights, and what it costs is reading them. The weights are
 * packed as [N/8][K][8]: for each k, the 8 outputs of a block are one ymm, and a block is read front to back.
 * One pass takes up to 12 rows over a block, one accumulator per row, so that memory is read once for 12 rows
 * and their multiplications run while the next lines arrive (a prefetch PF_DIST inputs ahead keeps the reads
 * going: without it 8 rows took 1.3x as long). Up to 6 rows, a pass takes two adjacent blocks: a row then has
 * two sums in flight per k instead of one that waits on the latency of its last fused multiply-add. Beyond 12
 * rows the passes split the rows evenly and re-read the block from L2 (8 x 1536 floats, 48 KB at most for the
 * embedded model).
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

#define NB 8  /* outputs per block: one ymm of float32 */
#define MB 12 /* rows per pass over a block: 12 accumulators */
#define PF_DIST 512 /* inputs ahead of the one multiplied whose weights are asked for (16 KB in float32) */

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

#define ROW(r) if (m > r) a##r = _mm256_fmadd_ps(_mm256_broadcast_ss(x + (r) * k + p), w, a##r);
#define OUT(r) if (m > r) finish(y, other, post, a##r, (m0 + r) * n + n0);
#define ROW2(r)                                                                                              \
    if (m > r) {                                                                                             \
        __m256 b = _mm256_broadcast_ss(x + (r) * k + p);                                                     \
        a##r = _mm256_fmadd_ps(b, w, a##r);                                                                  \
        c##r = _mm256_fmadd_ps(b, v, c##r);                                                                  \
    }
#define OUT2(r) if (m > r) { finish(y, other, post, a##r, (m0 + r) * n + n0); \
                             finish(y, other, post, c##r, (m0 + r) * n + n0 + NB); }

/* rows m0 .. m0 + m of x (m <= MB, a constant where it is inlined) times one block wb [K][NB]: outputs
 * n0 .. n0 + NB of y */
static inline __attribute__((always_inline)) void pass(const float *x, int64_t m0, const int m, int64_t k,
                                                       const wtype *wb, float *y, const float *other, int64_t n,
                                                       int64_t n0, int post) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
           a9 = a0, a10 = a0, a11 = a0;
    x += m0 * k;
    for (int64_t p = 0; p < k; p++) {
        _mm_prefetch((const char *)(wb + (p + PF_DIST) * NB), _MM_HINT_T0);
        __m256 w = LOADW(wb + p * NB);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11)
    }
    OUT(0) OUT(1) OUT(2) OUT(3) OUT(4) OUT(5) OUT(6) OUT(7) OUT(8) OUT(9) OUT(10) OUT(11)
}

/* the same over two adjacent blocks (outputs n0 .. n0 + 2 NB) for m <= MB / 2 rows: each k then has two
 * independent sums per row in flight, where one would wait on the last one's latency */
static inline __attribute__((always_inline)) void pair_pass(const float *x, int64_t m0, const int m, int64_t k,
                                                            const wtype *wb, float *y, const float *other,
                                                            int64_t n, int64_t n0, int post) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0, c4 = a0, c5 = a0;
    const wtype *wc = wb + k * NB;
    x += m0 * k;
    for (int64_t p = 0; p < k; p++) {
        _mm_prefetch((const char *)(wb + (p + PF_DIST) * NB), _MM_HINT_T0);
        _mm_prefetch((const char *)(wc + (p + PF_DIST) * NB), _MM_HINT_T0);
        __m256 w = LOADW(wb + p * NB), v = LOADW(wc + p * NB);
        ROW2(0) ROW2(1) ROW2(2) ROW2(3) ROW2(4) ROW2(5)
    }
    OUT2(0) OUT2(1) OUT2(2) OUT2(3) OUT2(4) OUT2(5)
}

/* The many-row path (a prompt's prefill): rows in tiles of up to 6 over two adjacent blocks, the inputs in
 * blocks of KB so that the pair's weights for one input block (2 x KB x 8 floats, 16 KB) stay in L1 while every
 * row tile passes over them. A tile's sums wait in `part` between input blocks, stored and loaded exactly, so
 * each output is still the one chain of fused multiply-adds over k in order: the bits of the passes above. */
#define KB 256
static inline __attribute__((always_inline)) void tile(const float *x, int64_t m0, const int m, int64_t k,
                                                       int64_t p0, int64_t p1, const wtype *wb, float *part,
                                                       float *y, const float *other, int64_t n, int64_t n0,
                                                       int post) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0, c4 = a0, c5 = a0;
    float *pt = part + m0 * 2 * NB;
    if (p0 > 0) {
#define LOAD2(r) if (m > r) { a##r = _mm256_loadu_ps(pt + (r) * 2 * NB); c##r = _mm256_loadu_ps(pt + (r) * 2 * NB + NB); }
        LOAD2(0) LOAD2(1) LOAD2(2) LOAD2(3) LOAD2(4) LOAD2(5)
    }
    const wtype *wc = wb + k * NB;
    x += m0 * k;
    for (int64_t p = p0; p < p1; p++) {
        __m256 w = LOADW(wb + p * NB), v = LOADW(wc + p * NB);
        ROW2(0) ROW2(1) ROW2(2) ROW2(3) ROW2(4) ROW2(5)
    }
    if (p1 == k) {
        OUT2(0) OUT2(1) OUT2(2) OUT2(3) OUT2(4) OUT2(5)
    } else {
#define STORE2(r) if (m > r) { _mm256_storeu_ps(pt + (r) * 2 * NB, a##r); _mm256_storeu_ps(pt + (r) * 2 * NB + NB, c##r); }
        STORE2(0) STORE2(1) STORE2(2) STORE2(3) STORE2(4) STORE2(5)
    }
}

typedef void (*tile_fn)(const float *, int64_t, int64_t, int64_t, int64_t, const wtype *, float *, float *,
                        const float *, int64_t, int64_t, int);
#define TILE(c)                                                                                               \
    static void tile_##c(const float *x, int64_t m0, int64_t k, int64_t p0, int64_t p1, const wtype *wb,      \
                         float *part, float *y, const float *other, int64_t n, int64_t n0, int post) {         \
        tile(x, m0, c, k, p0, p1, wb, part, y, other, n, n0, post);                                            \
    }
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)
static const tile_fn tiles[7] = {0, tile_1, tile_2, tile_3, tile_4, tile_5, tile_6};

typedef void (*pass_fn)(const float *, int64_t, int64_t, const wtype *, float *, const float *, int64_t, int64_t,
                        int);
#define PASS(c)                                                                                               \
    static void pass_##c(const float *x, int64_t m0, int64_t k, const wtype *wb, float *y, const float *other,  \
                         int64_t n, int64_t n0, int post) {                                                     \
        pass(x, m0, c, k, wb, y, other, n, n0, post);                                                           \
    }
#define PASS2(c)                                                                                              \
    static void pair_pass_##c(const float *x, int64_t m0, int64_t k, const wtype *wb, float *y,               \
                              const float *other, int64_t n, int64_t n0, int post) {                          \
        pair_pass(x, m0, c, k, wb, y, other, n, n0, post);                                                    \
    }
PASS(1) PASS(2) PASS(3) PASS(4) PASS(5) PASS(6) PASS(7) PASS(8) PASS(9) PASS(10) PASS(11) PASS(12)
PASS2(1) PASS2(2) PASS2(3) PASS2(4) PASS2(5) PASS2(6)
static const pass_fn passes[MB + 1] = {0, pass_1, pass_2, pass_3, pass_4, pass_5, pass_6, pass_7, pass_8, pass_9,
                                       pass_10, pass_11, pass_12};
static const pass_fn pair_passes[MB / 2 + 1] = {0, pair_pass_1, pair_pass_2, pair_pass_3, pair_pass_4, pair_pass_5,
                                                pair_pass_6};

#define MANY 32 /* rows from which the many-row path runs: below it, the passes are as fast */

static void many_rows(const float *x, const wtype *wp, float *y, const float *other, int64_t M, int64_t K,
                      int64_t N, int post) {
    int64_t nblocks = N / NB, npairs = nblocks / 2;
#pragma omp parallel
    {
        float *part = K > KB ? malloc(sizeof(float) * M * 2 * NB) : NULL;
        const int64_t kb = part ? KB : K; /* no memory for the partial sums: each tile takes every input */
#pragma omp for schedule(static)
        for (int64_t q = 0; q < npairs; q++) {
            const wtype *wb = wp + 2 * q * K * NB;
            for (int64_t p0 = 0; p0 < K; p0 += kb) {
                const int64_t p1 = p0 + kb < K ? p0 + kb : K;
                for (int64_t m0 = 0; m0 < M; m0 += 6) {
                    const int m = (int)(M - m0 < 6 ? M - m0 : 6);
                    tiles[m](x, m0, K, p0, p1, wb, part, y, other, N, 2 * q * NB, post);
                }
            }
        }
        free(part);
    }
    if (nblocks % 2) { /* the last block alone: the few-row passes, 12 rows at a time */
        const wtype *wb = wp + (nblocks - 1) * K * NB;
        for (int64_t m0 = 0; m0 < M; m0 += MB) {
            const int m = (int)(M - m0 < MB ? M - m0 : MB);
            passes[m](x, m0, K, wb, y, other, N, (nblocks - 1) * NB, post);
        }
    }
}

/* x [M, K], wp packed [N/NB][K][NB] (N a multiple of NB), y [M, N]; other [M, N] for post 2 and 3 */
void GEMM(const float *x, const wtype *wp, float *y, const float *other, int64_t M, int64_t K, int64_t N,
                    int post) {
    int64_t nblocks = N / NB, npairs = (nblocks + 1) / 2;
    int64_t n_pass = (M + MB - 1) / MB;
    if (M >= MANY && nblocks >= 2) {
        many_rows(x, wp, y, other, M, K, N, post);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t q = 0; q < npairs; q++) {
        int64_t b = 2 * q;
        const wtype *wb = wp + b * K * NB;
        int both = b + 1 < nblocks;
        /* rows split evenly over the passes: 16 rows as 8 + 8, not 12 + 4 */
        for (int64_t i = 0, m0 = 0; i < n_pass; i++) {
            int m = (int)(M / n_pass + (i < M % n_pass));
            if (both && 2 * m <= MB) {
                pair_passes[m](x, m0, K, wb, y, other, N, b * NB, post);
            } else {
                passes[m](x, m0, K, wb, y, other, N, b * NB, post);
                if (both) passes[m](x, m0, K, wb + K * NB, y, other, N, (b + 1) * NB, post);
            }
            m0 += m;
        }
    }
}

/* w [N, K] row-major -> wp [N/NB][K][NB], in the weights' own type */
void PACK(const wtype *w, wtype *wp, int64_t K, int64_t N) {
    for (int64_t b = 0; b < N / NB; b++)
        for (int64_t p = 0; p < K; p++)
            for (int j = 0; j < NB; j++) wp[(b * K + p) * NB + j] = w[(b * NB + j) * K + p];
}
