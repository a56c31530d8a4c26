/* y = x W^T for weights stored as GGUF's Q4_1 or Q8_0 blocks: float32 inputs, sums and outputs, each weight
 * read as the float32 value the loader dequantised it to.
 *
 * A decoding forward of a few rows is a pass over the weights, and reading them is what it costs. The embedded
 * model's linears come from a Q4_1 GGUF (0.625 bytes a weight) and its LM head from Q8_0 (1.06): as float32
 * they are 4 bytes each, 540 MB a forward. Here a weight stays in its block until a pass reaches it and is
 * widened in a register: a pass of m rows over B blocks of NB outputs (B x m sums in registers, as the float32
 * kernel's passes, with its helpers from small_gemm_f32.h) turns each input's quants into one vector of
 * float32 weights per block and adds x[r][k] w[k] into each row's sums, one fused multiply-add per k, in k
 * order: the float32 kernel's arithmetic over the same weights, so a row gets its bits, alone or in any batch.
 * Rows beyond a pass's 16 (10 with AVX2) go in further passes that widen the blocks again: past a few rows
 * the multiplications cost more than the widening.
 *
 * The widening is exact, so the weights are the loader's: Q4_1's w = d q + m (d, m float16, q in 0..15) has an
 * exact product of at most 15 significant bits, and one fused multiply-add rounds the sum once, as float32's
 * d * q + m does; Q8_0's w = d q (q in -128..127) is an exact product. engine/forward/quant.py checks every weight
 * against the loaded model before it takes a linear.
 *
 * Packed layout, per block of NB outputs, its K/32 groups in k order (d, m widened to float32 when packed):
 *   Q4_1 group: d [NB] f32, m [NB] f32, then 16 rows of NB bytes: byte j of row p holds q[2p][j] in its low
 *               nibble and q[2p + 1][j] in its high one (24 NB bytes for 32 NB weights)
 *   Q8_0 group: d [NB] f32, then 32 rows of NB int8 (q[k][j]) (36 NB bytes)
 */
#include "small_gemm_f32.h"
#include "small_gemm_q.h"

#define Q41_GROUP (2 * NB * 4 + 16 * NB) /* bytes of one 32-input group of a block */
#define Q80_GROUP (NB * 4 + 32 * NB)

#if NB == 16
#define U8_TO_I32(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define I8_TO_I32(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define IAND(a, b) _mm512_and_si512(a, b)
#define ISRL4(a) _mm512_srli_epi32(a, 4)
#define ISET1 _mm512_set1_epi32
#define ITOF _mm512_cvtepi32_ps
typedef __m512i ivec;
#else
#define U8_TO_I32(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define I8_TO_I32(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define IAND(a, b) _mm256_and_si256(a, b)
#define ISRL4(a) _mm256_srli_epi32(a, 4)
#define ISET1 _mm256_set1_epi32
#define ITOF _mm256_cvtepi32_ps
typedef __m256i ivec;
#endif

/* blocks a pass takes for m rows: the sums and the widened weights fit the registers */
#if NB == 16
#define Q_BLOCKS(m) ((m) <= 2 ? 4 : (m) <= 8 ? 2 : 1)
/* rows a pass takes at most: beyond 16 the sums, the widened weights and their scales spill (24 rows took 2.4x
 * the time of 16) */
#define QMB 16
#else /* AVX2's 16 registers */
#define Q_BLOCKS(m) ((m) <= 3 ? 2 : 1)
#define QMB 10
#endif

/* One pass of m rows (m <= QMB) over B adjacent blocks, the weights widened in registers as the k loop reaches
 * them: no scratch, and B x m independent sums per k, so that even one row keeps several multiply-adds in
 * flight (one block alone would wait on each one's latency). M and B are constants where it is inlined. */
static inline __attribute__((always_inline)) void q_pass(const int q4, const float *x, int64_t m0, const int m,
                                                         int64_t k, const uint8_t *wq, int64_t b0, const int B,
                                                         float *y, const float *other, int64_t n, int post) {
    vec acc[4][QMB];
    const int64_t group = q4 ? Q41_GROUP : Q80_GROUP;
    const uint8_t *g[4];
    for (int bb = 0; bb < B; bb++) {
        g[bb] = wq + (b0 + bb) * (k / 32) * group;
        for (int r = 0; r < m; r++) acc[bb][r] = VZERO;
    }
    x += m0 * k;
    const ivec low = ISET1(15);
    for (int64_t p0 = 0; p0 < k; p0 += 32) {
        vec d[4], mn[4];
        for (int bb = 0; bb < B; bb++) {
            d[bb] = VLOAD((const float *)g[bb]);
            mn[bb] = q4 ? VLOAD((const float *)g[bb] + NB) : VZERO;
        }
        if (q4) {
            for (int p = 0; p < 16; p++) {
                ivec both[4];
                for (int bb = 0; bb < B; bb++) both[bb] = U8_TO_I32(g[bb] + 2 * NB * 4 + p * NB);
                for (int t = 0; t < 2; t++) {
                    const int64_t kk = p0 + 2 * p + t;
                    vec w[4];
                    for (int bb = 0; bb < B; bb++)
                        w[bb] = VFMA(ITOF(t ? ISRL4(both[bb]) : IAND(both[bb], low)), d[bb], mn[bb]);
                    for (int r = 0; r < m; r++) {
                        const vec xr = VSET1(x[r * k + kk]);
                        for (int bb = 0; bb < B; bb++) acc[bb][r] = VFMA(xr, w[bb], acc[bb][r]);
                    }
                }
            }
        } else {
            for (int p = 0; p < 32; p++) {
                vec w[4];
                for (int bb = 0; bb < B; bb++) w[bb] = VMUL(d[bb], ITOF(I8_TO_I32(g[bb] + NB * 4 + p * NB)));
                for (int r = 0; r < m; r++) {
                    const vec xr = VSET1(x[r * k + p0 + p]);
                    for (int bb = 0; bb < B; bb++) acc[bb][r] = VFMA(xr, w[bb], acc[bb][r]);
                }
            }
        }
        for (int bb = 0; bb < B; bb++) g[bb] += group;
    }
    for (int bb = 0; bb < B; bb++)
        for (int r = 0; r < m; r++) finish(y, other, post, acc[bb][r], (m0 + r) * n + (b0 + bb) * NB);
}

typedef void (*q_pass_fn)(const float *, int64_t, int64_t, const uint8_t *, int64_t, float *, const float *,
                          int64_t, int);
#define QP(q4, c)                                                                                              \
    static void q_pass_##q4##_##c(const float *x, int64_t m0, int64_t k, const uint8_t *wq, int64_t b0,       \
                                  float *y, const float *other, int64_t n, int post) {                        \
        q_pass(q4, x, m0, c <= QMB ? c : QMB, k, wq, b0, Q_BLOCKS(c), y, other, n, post);                        \
    }                                                                                                         \
    static void q_pass_##q4##_##c##_one(const float *x, int64_t m0, int64_t k, const uint8_t *wq, int64_t b0,  \
                                        float *y, const float *other, int64_t n, int post) {                  \
        q_pass(q4, x, m0, c <= QMB ? c : QMB, k, wq, b0, 1, y, other, n, post);                                  \
    }
#define QPS(q4) QP(q4, 1) QP(q4, 2) QP(q4, 3) QP(q4, 4) QP(q4, 5) QP(q4, 6) QP(q4, 7) QP(q4, 8) QP(q4, 9) \
    QP(q4, 10) QP(q4, 11) QP(q4, 12) QP(q4, 13) QP(q4, 14) QP(q4, 15) QP(q4, 16)
QPS(0) QPS(1)
#define QTABLE(q4, suffix)                                                                                     \
    {0, q_pass_##q4##_1##suffix, q_pass_##q4##_2##suffix, q_pass_##q4##_3##suffix, q_pass_##q4##_4##suffix,    \
     q_pass_##q4##_5##suffix, q_pass_##q4##_6##suffix, q_pass_##q4##_7##suffix, q_pass_##q4##_8##suffix,       \
     q_pass_##q4##_9##suffix, q_pass_##q4##_10##suffix, q_pass_##q4##_11##suffix, q_pass_##q4##_12##suffix,    \
     q_pass_##q4##_13##suffix, q_pass_##q4##_14##suffix, q_pass_##q4##_15##suffix, q_pass_##q4##_16##suffix}
static const q_pass_fn q_passes[2][2][17] = {{QTABLE(0, ), QTABLE(0, _one)}, {QTABLE(1, ), QTABLE(1, _one)}};

static void gemm_q(const int q4, const float *x, const uint8_t *wq, float *y, const float *other, int64_t M,
                  int64_t K, int64_t N, int post) {
    const int64_t nblocks = N / NB, n_pass = (M + QMB - 1) / QMB;
    const int64_t first = M / n_pass + (M % n_pass > 0); /* rows of the largest pass: it sets the blocks a task takes */
    const int64_t B = Q_BLOCKS(first), ntasks = (nblocks + B - 1) / B;
#pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < ntasks; task++) {
        const int64_t b0 = task * B;
        const int whole = b0 + B <= nblocks;
        for (int64_t i = 0, m0 = 0; i < n_pass; i++) {
            const int m = (int)(M / n_pass + (i < M % n_pass));
            if (whole && Q_BLOCKS(m) == B) {
                q_passes[q4][0][m](x, m0, K, wq, b0, y, other, N, post);
            } else { /* the last blocks, or a smaller pass than the first: one block at a time */
                for (int64_t b = b0; b < b0 + B && b < nblocks; b++) q_passes[q4][1][m](x, m0, K, wq, b, y, other, N, post);
            }
            m0 += m;
        }
    }
}

/* x [M, K], wq packed as above (K a multiple of 32, N of NB), y [M, N]; other [M, N] for post 2 and 3 */
void small_gemm_q4_1(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                     int64_t N, int post) {
    gemm_q(1, x, wq, y, other, M, K, N, post);
}

void small_gemm_q8_0(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                     int64_t N, int post) {
    gemm_q(0, x, wq, y, other, M, K, N, post);
}
