/* y = x W^T for a few rows of x, float32 inputs and sums, with AVX2 and FMA (8 outputs a vector), or AVX512F
 * (16 outputs a vector): a decoding or verification forward's linears on CPUs without AVX512-BF16. Weights are
 * float32, or float16 when built with -DWEIGHT_F16 (F16C's vcvtph2ps widens a vector of them per load): half
 * the bytes to read, for a drafter whose weights were trained and stored in float16, so that nothing is rounded
 * that was not already.
 *
 * At a handful of rows a linear is a pass over its weights, and what it costs is reading them. The weights are
 * packed as [N/NB][K][NB]: for each k, the NB outputs of a block are one vector, and a block is read front to
 * back. One pass takes up to MB rows over a block, one accumulator per row, so that memory is read once for MB
 * rows and their multiplications run while the next lines arrive (a prefetch 16 KB ahead keeps the reads
 * going: without it 8 rows took 1.3x as long). Up to MB / 2 rows, a pass takes two adjacent blocks: a row then
 * has two sums in flight per k instead of one that waits on the latency of its last fused multiply-add. Beyond
 * MB rows the passes split the rows evenly and re-read the block from L2.
 *
 * From a few rows on, the loads bind: each row's input is a broadcast load per k, so a pass of m rows over one
 * block issues m + 1 loads for m multiply-adds. With AVX512F a vector holds 16 outputs, so the same loads feed
 * twice the sums, and 32 registers hold 24 rows' accumulators (12 with AVX2's 16). -DBLOCK8 builds the AVX2
 * layout on an AVX512 CPU, to compare the two.
 *
 * Each output's sum runs over k in order with one fused multiply-add per k, in a register lane of its own,
 * whatever the number of rows, the pass a row falls in or the vector width: a row gets the same bits alone or
 * in any batch (plain decoding and verification agree), and the same bits from either layout.
 *
 * post: 0 none, 1 silu(y), 2 y + other, 3 y * other (other: [M, N] float32), as oneDNN's fused post-ops.
 */
#include <stdlib.h>

#include "small_gemm_f32.h"

#if NB == 16
#define MB 24 /* rows per pass over a block: 24 accumulators */
#else
#define MB 12 /* rows per pass over a block: 12 accumulators */
#endif
#define PF_DIST (4096 / NB) /* inputs ahead of the one multiplied whose weights are asked for (16 KB in float32) */

#ifdef WEIGHT_F16
typedef uint16_t wtype;
#define LOADW LOADW16
#define GEMM small_gemm_f16w
#define PACK small_gemm_f16w_pack
#define BLOCK small_gemm_f16w_block
#else
typedef float wtype;
#define LOADW VLOAD
#define GEMM small_gemm_f32
#define PACK small_gemm_f32_pack
#define BLOCK small_gemm_f32_block
#endif

#define ROW(r) if (m > r) a##r = VFMA(VSET1(x[(r) * k + p]), w, a##r);
#define OUT(r) if (m > r) finish(y, other, post, a##r, (m0 + r) * n + n0);
#define ROW2(r)                                                                                              \
    if (m > r) {                                                                                             \
        vec b = VSET1(x[(r) * k + p]);                                                                       \
        a##r = VFMA(b, w, a##r);                                                                             \
        c##r = VFMA(b, v, c##r);                                                                             \
    }
#define OUT2(r) if (m > r) { finish(y, other, post, a##r, (m0 + r) * n + n0); \
                             finish(y, other, post, c##r, (m0 + r) * n + n0 + NB); }
#define EACH12(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
#define EACH24(F) EACH12(F) F(12) F(13) F(14) F(15) F(16) F(17) F(18) F(19) F(20) F(21) F(22) F(23)
#define DECL(r) vec a##r = VZERO;
#define DECL2(r) vec a##r = VZERO, c##r = VZERO;

#if MB == 24
#define EACH_MB EACH24
#define EACH_HALF EACH12
#else
#define EACH_MB EACH12
#define EACH_HALF(F) F(0) F(1) F(2) F(3) F(4) F(5)
#endif
#define TM (MB / 2) /* rows of a tile over two blocks */

/* rows m0 .. m0 + m of x (m <= MB, a constant where it is inlined) times one block wb [K][NB]: outputs
 * n0 .. n0 + NB of y */
static inline __attribute__((always_inline)) void pass(const float *x, int64_t m0, const int m, int64_t k,
                                                       const wtype *wb, float *y, const float *other, int64_t n,
                                                       int64_t n0, int post) {
    EACH_MB(DECL)
    x += m0 * k;
    for (int64_t p = 0; p < k; p++) {
        _mm_prefetch((const char *)(wb + (p + PF_DIST) * NB), _MM_HINT_T0);
        vec w = LOADW(wb + p * NB);
        EACH_MB(ROW)
    }
    EACH_MB(OUT)
}

/* the same over two adjacent blocks (outputs n0 .. n0 + 2 NB) for m <= MB / 2 rows: each k then has two
 * independent sums per row in flight, where one would wait on the last one's latency */
static inline __attribute__((always_inline)) void pair_pass(const float *x, int64_t m0, const int m, int64_t k,
                                                            const wtype *wb, float *y, const float *other,
                                                            int64_t n, int64_t n0, int post) {
    EACH_HALF(DECL2)
    const wtype *wc = wb + k * NB;
    x += m0 * k;
    for (int64_t p = 0; p < k; p++) {
        _mm_prefetch((const char *)(wb + (p + PF_DIST) * NB), _MM_HINT_T0);
        _mm_prefetch((const char *)(wc + (p + PF_DIST) * NB), _MM_HINT_T0);
        vec w = LOADW(wb + p * NB), v = LOADW(wc + p * NB);
        EACH_HALF(ROW2)
    }
    EACH_HALF(OUT2)
}

/* The many-row path (a prompt's prefill): rows in tiles of up to TM over two adjacent blocks, the inputs in
 * blocks of KB so that the pair's weights for one input block (2 x KB x NB floats, 16 KB) stay in L1 while
 * every row tile passes over them. A tile's sums wait in `part` between input blocks, stored and loaded
 * exactly, so each output is still the one chain of fused multiply-adds over k in order: the bits of the
 * passes above. */
#define KB (2048 / NB)
#define LOAD2(r) if (m > r) { a##r = VLOAD(pt + (r) * 2 * NB); c##r = VLOAD(pt + (r) * 2 * NB + NB); }
#define STORE2(r) if (m > r) { VSTORE(pt + (r) * 2 * NB, a##r); VSTORE(pt + (r) * 2 * NB + NB, c##r); }
static inline __attribute__((always_inline)) void tile(const float *x, int64_t m0, const int m, int64_t k,
                                                       int64_t p0, int64_t p1, const wtype *wb, float *part,
                                                       float *y, const float *other, int64_t n, int64_t n0,
                                                       int post) {
    EACH_HALF(DECL2)
    float *pt = part + m0 * 2 * NB;
    if (p0 > 0) {
        EACH_HALF(LOAD2)
    }
    const wtype *wc = wb + k * NB;
    x += m0 * k;
    for (int64_t p = p0; p < p1; p++) {
        vec w = LOADW(wb + p * NB), v = LOADW(wc + p * NB);
        EACH_HALF(ROW2)
    }
    if (p1 == k) {
        EACH_HALF(OUT2)
    } else {
        EACH_HALF(STORE2)
    }
}

typedef void (*tile_fn)(const float *, int64_t, int64_t, int64_t, int64_t, const wtype *, float *, float *,
                        const float *, int64_t, int64_t, int);
typedef void (*pass_fn)(const float *, int64_t, int64_t, const wtype *, float *, const float *, int64_t, int64_t,
                        int);
/* one function per row count, so that each inlined body has its accumulators in registers */
#define FNS(c)                                                                                                \
    static __attribute__((unused)) void tile_##c(const float *x, int64_t m0, int64_t k, int64_t p0, int64_t p1, const wtype *wb,      \
                         float *part, float *y, const float *other, int64_t n, int64_t n0, int post) {         \
        if (c <= TM) tile(x, m0, c, k, p0, p1, wb, part, y, other, n, n0, post);                               \
    }                                                                                                         \
    static __attribute__((unused)) void pass_##c(const float *x, int64_t m0, int64_t k, const wtype *wb, float *y, const float *other,  \
                         int64_t n, int64_t n0, int post) {                                                     \
        pass(x, m0, c, k, wb, y, other, n, n0, post);                                                           \
    }                                                                                                         \
    static __attribute__((unused)) void pair_pass_##c(const float *x, int64_t m0, int64_t k, const wtype *wb, float *y,               \
                              const float *other, int64_t n, int64_t n0, int post) {                          \
        if (c <= TM) pair_pass(x, m0, c, k, wb, y, other, n, n0, post);                                       \
    }
#define FN_NAMES(c) tile_##c, pass_##c, pair_pass_##c
FNS(1) FNS(2) FNS(3) FNS(4) FNS(5) FNS(6) FNS(7) FNS(8) FNS(9) FNS(10) FNS(11) FNS(12)
#if MB == 24
FNS(13) FNS(14) FNS(15) FNS(16) FNS(17) FNS(18) FNS(19) FNS(20) FNS(21) FNS(22) FNS(23) FNS(24)
#endif
static const tile_fn tiles[] = {0, tile_1, tile_2, tile_3, tile_4, tile_5, tile_6, tile_7, tile_8, tile_9,
                                tile_10, tile_11, tile_12};
static const pass_fn pair_passes[] = {0, pair_pass_1, pair_pass_2, pair_pass_3, pair_pass_4, pair_pass_5,
                                      pair_pass_6, pair_pass_7, pair_pass_8, pair_pass_9, pair_pass_10,
                                      pair_pass_11, pair_pass_12};
static const pass_fn passes[] = {0, pass_1, pass_2, pass_3, pass_4, pass_5, pass_6, pass_7, pass_8, pass_9,
                                 pass_10, pass_11, pass_12,
#if MB == 24
                                 pass_13, pass_14, pass_15, pass_16, pass_17, pass_18, pass_19, pass_20, pass_21,
                                 pass_22, pass_23, pass_24
#endif
};

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
                for (int64_t m0 = 0; m0 < M; m0 += TM) {
                    const int m = (int)(M - m0 < TM ? M - m0 : TM);
                    tiles[m](x, m0, K, p0, p1, wb, part, y, other, N, 2 * q * NB, post);
                }
            }
        }
        free(part);
    }
    if (nblocks % 2) { /* the last block alone: the few-row passes, MB rows at a time */
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
        /* rows split evenly over the passes: 16 rows of the 8-wide layout as 8 + 8, not 12 + 4 */
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

/* outputs per packed block: N must be a multiple */
int BLOCK(void) { return NB; }

/* w [N, K] row-major -> wp [N/NB][K][NB], in the weights' own type */
void PACK(const wtype *w, wtype *wp, int64_t K, int64_t N) {
    for (int64_t b = 0; b < N / NB; b++)
        for (int64_t p = 0; p < K; p++)
            for (int j = 0; j < NB; j++) wp[(b * K + p) * NB + j] = w[(b * NB + j) * K + p];
}
