/* y = x W^T for weights stored as GGUF's Q4_1, Q4_0, Q5_0, Q8_0 or Q6_K blocks, in llama.cpp's CPU arithmetic: each row of x is
 * quantised to 8 bits per group of 32 inputs (Q8_1: a scale d and the group's sum), and each group's dot
 * product is summed in integers by VNNI's vpdpbusd (64 byte products a zmm instruction, four times the
 * multiply-adds of a float32 fused multiply-add), then scaled once in float32 (ggml_vec_dot_q4_1_q8_1 and
 * ggml_vec_dot_q8_0_q8_0 in ggml-cpu's quants.c compute the same sums).
 *
 * The float32-exact kernels (small_gemm_q.c) spend one fused multiply-add per weight and row: past a few rows a
 * pass is bound by them, and 16 rows took 3.4 times one row on the embedded model. Here a row's group of 32
 * products is 8 instructions per 16 outputs, so a verification forward of many rows costs little more than
 * reading the weights once.
 *
 * The result is not the float32 kernel's: the inputs are rounded to 8 bits. It is still each row's own
 * computation, the same whatever the batch: a row's quantisation reads only that row, its integer sums are
 * exact in any order, and each output's float32 steps run group by group in k order (per group g, with d_w,
 * m_w the block's scale and minimum, d_x the row's scale, s_x = d_x * sum of its quants, i the integer dot):
 *     Q4_1: acc = fma(float(i), d_w * d_x, acc); acc = fma(m_w, s_x, acc)
 *     Q8_0, Q4_0, Q5_0: acc = fma(float(i), d_w * d_x, acc)
 *     Q6_K: per half of 16 (its sub-blocks' own scales d_h = d * scale), the same step for the low half, then
 *           the high one
 * so plain decoding and verification agree, and the 16-wide and 8-wide builds give the same bits.
 *
 * vpdpbusd multiplies unsigned by signed bytes. Q4_1's quants are unsigned (0..15); Q8_0's are signed, so they
 * are stored plus 128 and 128 times the row's quant sum is taken off each group's integer dot. Q4_0 and Q5_0
 * store q + 8 and q + 16 (0..15, 0..31): 8 or 16 times the quant sum is taken off, so i is llama.cpp's
 * sum of (q - 8) x or (q - 16) x (ggml_vec_dot_q4_0_q8_0, ggml_vec_dot_q5_0_q8_0), exact in integers.
 *
 * Packed layout, per block of NB outputs, its K/32 groups in k order (d, m widened to float32 when packed):
 *   Q4_1 group: d [NB] f32, m [NB] f32, then 4 vectors of 4 NB bytes: vector p, byte 4 j + i holds q[4p + i][j]
 *               in its low nibble and q[16 + 4p + i][j] in its high one (24 NB bytes for 32 NB weights)
 *   Q8_0 group: d [NB] f32, then 8 vectors of 4 NB bytes: vector p, byte 4 j + i holds q[4p + i][j] + 128
 *   Q4_0 group: d [NB] f32, then Q4_1's 4 vectors of nibbles (20 NB bytes for 32 NB weights)
 *   Q5_0 group: d [NB] f32, one vector of 4 NB bytes of fifth bits (byte 4 j + i: bit 2p that of q[4p + i][j],
 *               bit 2p + 1 that of q[16 + 4p + i][j]), then Q4_1's 4 vectors of low nibbles (24 NB bytes)
 *   Q6_K group: d of inputs 0..15 [NB] f32, d of 16..31 [NB] f32, then Q8_0's 8 vectors of q - 32 + 128 (a byte
 *               a weight: 40 NB bytes for 32 NB weights, against Q6_K's 26.25 as stored; 6-bit packing is left)
 * Built where the CPU has AVX512-VNNI (16 outputs a vector), AVX-VNNI (8) or AVX2 alone (8, in byte pairs, see
 * QDOT_PAIRS); small_gemm_qdot_ok() says so.
 */
#include <omp.h>
#include <stdlib.h>

#include "small_gemm_f32.h"
#include "small_gemm_qdot.h"

#if NB == 16 && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define QDOT_OK 1
typedef __m512i bvec;
#define BLOAD(p) _mm512_loadu_si512((const void *)(p))
#define BSET1_I8 _mm512_set1_epi8
#define BSET1_I32 _mm512_set1_epi32
#define BZERO _mm512_setzero_si512()
#define BAND _mm512_and_si512
#define BSRL4(a) _mm512_srli_epi16(a, 4)
#define BSLL16 _mm512_slli_epi16
#define BSRL16 _mm512_srli_epi16
#define BOR _mm512_or_si512
#define BSUB _mm512_sub_epi32
#define DPBUSD _mm512_dpbusd_epi32
#define BTOF _mm512_cvtepi32_ps
#elif NB == 8 && defined(__AVX2__)
#define QDOT_OK 1
typedef __m256i bvec;
#define BLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define BSET1_I8 _mm256_set1_epi8
#define BSET1_I32 _mm256_set1_epi32
#define BZERO _mm256_setzero_si256()
#define BAND _mm256_and_si256
#define BSRL4(a) _mm256_srli_epi16(a, 4)
#define BSLL16 _mm256_slli_epi16
#define BSRL16 _mm256_srli_epi16
#define BOR _mm256_or_si256
#define BSUB _mm256_sub_epi32
#define BTOF _mm256_cvtepi32_ps
#if defined(__AVXVNNI__)
#define DPBUSD _mm256_dpbusd_avx_epi32
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD _mm256_dpbusd_epi32
#else
/* AVX2 without VNNI: vpmaddubsw multiplies unsigned by signed bytes and adds neighbours into saturating 16-bit
 * sums, so the products are kept small enough never to saturate, and the sums stay exact (llama.cpp's AVX2
 * mul_sum_us8_pairs does the same). Q4_1: a pair is at most 15 * 127 * 2 = 3810, so a group's 8 vectors add
 * up in 16 bits (at most 30480) before one vpmaddwd widens them. Q8_0: the stored bytes minus 128 are the
 * signed quants w; |w| times x with w's sign (vpsignb) is at most 128 * 127 * 2 = 32512 a pair, widened at once.
 * Q5_0's pairs reach 31 * 127 * 2 = 7874, so its 16-bit sums are widened every 4 products (31496).
 * The integer dot of a group is the VNNI build's, so the outputs keep their bits. */
#define QDOT_PAIRS 1
#define PAIRS16(acc, u, s) _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s))
#define WIDEN16(a) _mm256_madd_epi16(a, _mm256_set1_epi16(1))
#endif
#else
#define QDOT_OK 0
#endif
#ifndef QDOT_PAIRS
#define QDOT_PAIRS 0
#endif

int small_gemm_qdot_ok(void) { return QDOT_OK; }

/* the block types, as the kernel's compile-time switch */
#define QK_Q8_0 0
#define QK_Q4_1 1
#define QK_Q4_0 2
#define QK_Q5_0 3
#define QK_Q6_K 4
#define QD41_GROUP (2 * NB * 4 + 16 * NB)
#define QD80_GROUP (NB * 4 + 32 * NB)
#define QD40_GROUP (NB * 4 + 16 * NB)
#define QD50_GROUP (NB * 4 + 4 * NB + 16 * NB)
#define QD6K_GROUP (2 * NB * 4 + 32 * NB)

#if QDOT_OK
#if NB == 16
#define VMAX _mm512_max_ps
#define VABS(a) _mm512_abs_ps(a)
#define VROUND_I32 _mm512_cvtps_epi32
#define ISTORE(p, a) _mm512_storeu_si512((void *)(p), a)
#else
#define VMAX _mm256_max_ps
#define VABS(a) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a)
#define VROUND_I32 _mm256_cvtps_epi32
#define ISTORE(p, a) _mm256_storeu_si256((__m256i *)(p), a)
#endif

/* One row's inputs as Q8_1 groups: xq[k] int8, and per group d (scale), s = d * sum(q), and the sum itself.
 * d = max |x| / 127, q = x * (1 / d) rounded to nearest even (the vector conversion's rounding), from the row
 * alone: the same in any batch, and in either vector width (max and integer sums are exact in any order). */
static void quantize_row(const float *x, int64_t k, int8_t *xq, float *xd, float *xs, int32_t *xi, int32_t *xh) {
    for (int64_t g = 0; g < k / 32; g++) {
        const float *v = x + g * 32;
        vec mx = VZERO;
        for (int j = 0; j < 32; j += NB) mx = VMAX(mx, VABS(VLOAD(v + j)));
#if NB == 16
        const float amax = _mm512_reduce_max_ps(mx);
#else
        float lanes[NB], amax = 0.0f;
        VSTORE(lanes, mx);
        for (int j = 0; j < NB; j++) amax = lanes[j] > amax ? lanes[j] : amax;
#endif
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const vec vid = VSET1(id);
#if NB == 16
        const __m512i q0 = VROUND_I32(VMUL(VLOAD(v), vid)), q1 = VROUND_I32(VMUL(VLOAD(v + 16), vid));
        _mm_storeu_si128((__m128i *)(xq + g * 32), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(xq + g * 32 + 16), _mm512_cvtepi32_epi8(q1));
        const int32_t half = _mm512_reduce_add_epi32(q0);
        const int32_t sum = half + _mm512_reduce_add_epi32(q1);
#else
        int32_t q[32], sum = 0, half = 0;
        for (int j = 0; j < 32; j += NB) ISTORE(q + j, VROUND_I32(VMUL(VLOAD(v + j), vid)));
        for (int j = 0; j < 32; j++) {
            xq[g * 32 + j] = (int8_t)q[j];
            sum += q[j];
            half += j < 16 ? q[j] : 0;
        }
#endif
        xd[g] = d, xs[g] = d * (float)sum, xi[g] = sum, xh[g] = half;
    }
}

/* rows a dot pass takes at most, and the blocks it takes for m rows: B x m integer and float sums, and the
 * block's unpacked quants, in registers */
#if NB == 16
#define QD_BLOCKS(m) ((m) <= 2 ? 4 : (m) <= 6 ? 2 : 1)
#define QDMB 12
#else
#define QD_BLOCKS(m) ((m) <= 2 ? 2 : 1)
#define QDMB 6
#endif

/* groups ahead of the one multiplied whose weights are asked for (6 KB of Q4_1): the embedded model's 210
 * linears streamed from memory took 12.6 instead of 14.2 ms at 16 rows (medians of 9, interleaved, Intel Xeon),
 * and 1 row 5.5 to 6.5 either way */
#define QD_PF_GROUPS 16

static inline int32_t quad(const int8_t *p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}

typedef struct {
    const int8_t *q;  /* [M, K] */
    const float *d, *s; /* [M, K / 32] */
    const int32_t *sum;
    const int32_t *half; /* the sum of each group's first 16 quants (Q6_K's halves) */
    int64_t groups;
} qrows;

/* bit b of each byte of hb moved to bit 4 (the fifth bit of a Q5_0 quant); 16-bit shifts keep it in its byte */
static inline bvec fifth_bit(bvec hb, const int b) {
    const bvec at4 = b <= 4 ? BSLL16(hb, 4 - b) : BSRL16(hb, b - 4);
    return BAND(at4, BSET1_I8(0x10));
}

static inline int64_t group_bytes(const int kind) {
    return kind == QK_Q4_1 ? QD41_GROUP : kind == QK_Q4_0 ? QD40_GROUP : kind == QK_Q5_0 ? QD50_GROUP
         : kind == QK_Q6_K ? QD6K_GROUP : QD80_GROUP;
}

/* one group's integer dots of B blocks by m rows for the nibble kinds (Q4_1, Q4_0, Q5_0): isum [B][m] */
static inline __attribute__((always_inline)) void nibble_dots(const int kind, const uint8_t *const *g, const int B,
                                                              const int8_t *xq, int64_t k, int64_t k0, const int m,
                                                              bvec isum[4][QDMB]) {
    const bvec low = BSET1_I8(0x0F);
    const int64_t quants = kind == QK_Q4_1 ? 2 * NB * 4 : kind == QK_Q4_0 ? NB * 4 : 2 * NB * 4;
    bvec hb[4];
    if (kind == QK_Q5_0)
        for (int bb = 0; bb < B; bb++) hb[bb] = BLOAD(g[bb] + NB * 4);
#if QDOT_PAIRS
    bvec s16[4][QDMB];
    for (int bb = 0; bb < B; bb++)
        for (int r = 0; r < m; r++) s16[bb][r] = BZERO;
#endif
    for (int p = 0; p < 4; p++) {
        bvec lo[4], hi[4];
        for (int bb = 0; bb < B; bb++) {
            const bvec both = BLOAD(g[bb] + quants + p * 4 * NB);
            lo[bb] = BAND(both, low);
            hi[bb] = BAND(BSRL4(both), low);
            if (kind == QK_Q5_0) {
                lo[bb] = BOR(lo[bb], fifth_bit(hb[bb], 2 * p));
                hi[bb] = BOR(hi[bb], fifth_bit(hb[bb], 2 * p + 1));
            }
        }
        for (int r = 0; r < m; r++) {
            const bvec xl = BSET1_I32(quad(xq + r * k + k0 + 4 * p));
            const bvec xh = BSET1_I32(quad(xq + r * k + k0 + 16 + 4 * p));
#if QDOT_PAIRS
            for (int bb = 0; bb < B; bb++) s16[bb][r] = PAIRS16(PAIRS16(s16[bb][r], lo[bb], xl), hi[bb], xh);
#else
            for (int bb = 0; bb < B; bb++) isum[bb][r] = DPBUSD(DPBUSD(isum[bb][r], lo[bb], xl), hi[bb], xh);
#endif
        }
#if QDOT_PAIRS
        if (p == 3 || (kind == QK_Q5_0 && p == 1))
            for (int bb = 0; bb < B; bb++)
                for (int r = 0; r < m; r++) {
                    isum[bb][r] = _mm256_add_epi32(isum[bb][r], WIDEN16(s16[bb][r]));
                    s16[bb][r] = BZERO;
                }
#endif
    }
}

/* one group's integer dots of B blocks by m rows for Q8_0 (vectors p0..p1 - 1 of quants after `head` bytes of
 * scales: Q6_K takes 0..3 and 4..7, one half each): isum [B][m] */
static inline __attribute__((always_inline)) void byte_dots(const uint8_t *const *g, const int B, const int8_t *xq,
                                                            int64_t k, int64_t k0, const int m, bvec isum[4][QDMB],
                                                            const int64_t head, const int p0, const int p1) {
    for (int p = p0; p < p1; p++) {
        bvec w[4];
#if QDOT_PAIRS
        bvec aw[4];
        for (int bb = 0; bb < B; bb++) {
            w[bb] = _mm256_xor_si256(BLOAD(g[bb] + head + p * 4 * NB), BSET1_I8((char)0x80));
            aw[bb] = _mm256_abs_epi8(w[bb]);
        }
        for (int r = 0; r < m; r++) {
            const bvec xp = BSET1_I32(quad(xq + r * k + k0 + 4 * p));
            for (int bb = 0; bb < B; bb++)
                isum[bb][r] = _mm256_add_epi32(
                    isum[bb][r], WIDEN16(_mm256_maddubs_epi16(aw[bb], _mm256_sign_epi8(xp, w[bb]))));
        }
#else
        for (int bb = 0; bb < B; bb++) w[bb] = BLOAD(g[bb] + head + p * 4 * NB);
        for (int r = 0; r < m; r++) {
            const bvec xp = BSET1_I32(quad(xq + r * k + k0 + 4 * p));
            for (int bb = 0; bb < B; bb++) isum[bb][r] = DPBUSD(isum[bb][r], w[bb], xp);
        }
#endif
    }
}

/* what each group's integer dot carries beyond llama.cpp's sum of q x: the stored quants' offset times the row's
 * quant sum (Q8_0 on the AVX2 build takes its offset off before multiplying) */
static inline int32_t quant_offset(const int kind) {
    return kind == QK_Q4_0 ? 8 : kind == QK_Q5_0 ? 16 : (kind == QK_Q8_0 || kind == QK_Q6_K) && !QDOT_PAIRS ? 128 : 0;
}

/* Q6_K: one group's two halves of 16, each its integer dot and its own scale, low half first; g moves on */
static inline __attribute__((always_inline)) void six_bit_halves(const qrows *xr, const uint8_t **g, const int B,
                                                                 const int8_t *xq, int64_t k, int64_t k0, const int m,
                                                                 int64_t m0, int64_t gi, vec acc[4][QDMB]) {
    for (int h = 0; h < 2; h++) {
        bvec isum[4][QDMB];
        for (int bb = 0; bb < B; bb++)
            for (int r = 0; r < m; r++) isum[bb][r] = BZERO;
        byte_dots(g, B, xq, k, k0, m, isum, 2 * NB * 4, 4 * h, 4 * h + 4);
        for (int bb = 0; bb < B; bb++) {
            const vec dw = VLOAD((const float *)g[bb] + h * NB);
            for (int r = 0; r < m; r++) {
                const int64_t at = (m0 + r) * xr->groups + gi;
                bvec i = isum[bb][r];
                if (quant_offset(QK_Q6_K)) {
                    const int32_t s = h == 0 ? xr->half[at] : xr->sum[at] - xr->half[at];
                    i = BSUB(i, BSET1_I32(quant_offset(QK_Q6_K) * s));
                }
                acc[bb][r] = VFMA(BTOF(i), VMUL(dw, VSET1(xr->d[at])), acc[bb][r]);
            }
        }
    }
    for (int bb = 0; bb < B; bb++) g[bb] += QD6K_GROUP;
}

static inline __attribute__((always_inline)) void qd_pass(const int kind, const qrows *xr, int64_t m0, const int m,
                                                          int64_t k, const uint8_t *wq, int64_t b0, const int B,
                                                          float *y, const float *other, int64_t n, int post) {
    vec acc[4][QDMB];
    const int64_t group = group_bytes(kind), G = xr->groups;
    const uint8_t *g[4];
    for (int bb = 0; bb < B; bb++) {
        g[bb] = wq + (b0 + bb) * G * group;
        for (int r = 0; r < m; r++) acc[bb][r] = VZERO;
    }
    const int8_t *xq = xr->q + m0 * k;
    for (int64_t gi = 0; gi < G; gi++) {
        bvec isum[4][QDMB];
        for (int bb = 0; bb < B; bb++)
            for (int r = 0; r < m; r++) isum[bb][r] = BZERO;
        const int64_t k0 = gi * 32;
        for (int bb = 0; bb < B; bb++)
            for (int64_t line = 0; line < group; line += 64)
                _mm_prefetch((const char *)(g[bb] + QD_PF_GROUPS * group + line), _MM_HINT_T0);
        if (kind == QK_Q6_K) {
            six_bit_halves(xr, g, B, xq, k, k0, m, m0, gi, acc);
            continue;
        }
        if (kind == QK_Q8_0) byte_dots(g, B, xq, k, k0, m, isum, NB * 4, 0, 8);
        else nibble_dots(kind, g, B, xq, k, k0, m, isum);
        for (int bb = 0; bb < B; bb++) {
            const vec dw = VLOAD((const float *)g[bb]);
            const vec mw = kind == QK_Q4_1 ? VLOAD((const float *)g[bb] + NB) : VZERO;
            for (int r = 0; r < m; r++) {
                const int64_t at = (m0 + r) * G + gi;
                bvec i = isum[bb][r];
                if (quant_offset(kind)) i = BSUB(i, BSET1_I32(quant_offset(kind) * xr->sum[at]));
                acc[bb][r] = VFMA(BTOF(i), VMUL(dw, VSET1(xr->d[at])), acc[bb][r]);
                if (kind == QK_Q4_1) acc[bb][r] = VFMA(mw, VSET1(xr->s[at]), acc[bb][r]);
            }
            g[bb] += group;
        }
    }
    for (int bb = 0; bb < B; bb++)
        for (int r = 0; r < m; r++) finish(y, other, post, acc[bb][r], (m0 + r) * n + (b0 + bb) * NB);
}

typedef void (*qd_pass_fn)(const qrows *, int64_t, int64_t, const uint8_t *, int64_t, float *, const float *,
                           int64_t, int);
/* the pass of c rows over bb blocks (at most QD_BLOCKS(c): beyond, the sums spill) */
#define QDP(kind, c, bb)                                                                                         \
    static void qd_pass_##kind##_##c##_##bb(const qrows *x, int64_t m0, int64_t k, const uint8_t *wq, int64_t b0, \
                                          float *y, const float *other, int64_t n, int post) {                \
        qd_pass(kind, x, m0, c <= QDMB ? c : QDMB, k, wq, b0, bb < QD_BLOCKS(c) ? bb : QD_BLOCKS(c), y, other, n, \
                post);                                                                                        \
    }
#define QDP3(kind, c) QDP(kind, c, 1) QDP(kind, c, 2) QDP(kind, c, 4)
#define QDPS(kind)                                                                                    \
    QDP3(kind, 1) QDP3(kind, 2) QDP3(kind, 3) QDP3(kind, 4) QDP3(kind, 5) QDP3(kind, 6) QDP3(kind, 7) \
    QDP3(kind, 8) QDP3(kind, 9) QDP3(kind, 10) QDP3(kind, 11) QDP3(kind, 12)
QDPS(0) QDPS(1) QDPS(2) QDPS(3) QDPS(4)
#define QDROW(kind, bb)                                                                                          \
    {0, qd_pass_##kind##_1_##bb, qd_pass_##kind##_2_##bb, qd_pass_##kind##_3_##bb, qd_pass_##kind##_4_##bb,             \
     qd_pass_##kind##_5_##bb, qd_pass_##kind##_6_##bb, qd_pass_##kind##_7_##bb, qd_pass_##kind##_8_##bb,                \
     qd_pass_##kind##_9_##bb, qd_pass_##kind##_10_##bb, qd_pass_##kind##_11_##bb, qd_pass_##kind##_12_##bb}
/* [kind][log2 of the blocks][rows] */
static const qd_pass_fn qd_passes[5][3][13] = {{QDROW(0, 1), QDROW(0, 2), QDROW(0, 4)},
                                               {QDROW(1, 1), QDROW(1, 2), QDROW(1, 4)},
                                               {QDROW(2, 1), QDROW(2, 2), QDROW(2, 4)},
                                               {QDROW(3, 1), QDROW(3, 2), QDROW(3, 4)},
                                               {QDROW(4, 1), QDROW(4, 2), QDROW(4, 4)}};

static inline int log2_blocks(int64_t b) { return b >= 4 ? 2 : b >= 2 ? 1 : 0; }

/* Blocks a task takes: as many as the largest pass has sums for, fewer where that would leave the threads
 * uneven work (3 tasks over 2 threads: one waits a third of the time). Which blocks a pass takes does not
 * change any output's arithmetic. */
static int64_t task_blocks(int64_t nblocks, int64_t first_rows) {
    const int64_t nth = omp_get_max_threads();
    int64_t B = QD_BLOCKS(first_rows);
    while (B > 1 && (nblocks / B) % nth && nblocks / B < 16 * nth) B /= 2;
    return B;
}

/* x [M, K] float32, wq packed as above (K a multiple of 32, N of NB), y [M, N]; other [M, N] for post 2 and 3.
 * Returns 0, or -1 where memory for the quantised rows could not be had. */
static int gemm_qdot(const int kind, const float *x, const uint8_t *wq, float *y, const float *other, int64_t M,
                     int64_t K, int64_t N, int post) {
    const int64_t G = K / 32;
    int8_t *xq = malloc((size_t)(M * K));
    float *xd = malloc(sizeof(float) * M * G), *xs = malloc(sizeof(float) * M * G);
    int32_t *xi = malloc(sizeof(int32_t) * M * G), *xh = malloc(sizeof(int32_t) * M * G);
    if (!(xq && xd && xs && xi && xh)) {
        free(xq), free(xd), free(xs), free(xi), free(xh);
        return -1;
    }
    const qrows xr = {xq, xd, xs, xi, xh, G};
    const int64_t nblocks = N / NB, n_pass = (M + QDMB - 1) / QDMB;
    const int64_t first = M / n_pass + (M % n_pass > 0);
    const int64_t B = task_blocks(nblocks, first), ntasks = (nblocks + B - 1) / B;
#pragma omp parallel
    {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < M; r++)
        quantize_row(x + r * K, K, xq + r * K, xd + r * G, xs + r * G, xi + r * G, xh + r * G);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < ntasks; task++) {
        const int64_t b0 = task * B, end = b0 + B < nblocks ? b0 + B : nblocks;
        for (int64_t i = 0, m0 = 0; i < n_pass; i++) {
            const int m = (int)(M / n_pass + (i < M % n_pass));
            const int64_t bm = B < QD_BLOCKS(m) ? B : QD_BLOCKS(m);
            int64_t b = b0;
            for (; b + bm <= end; b += bm) qd_passes[kind][log2_blocks(bm)][m](&xr, m0, K, wq, b, y, other, N, post);
            for (; b < end; b++) qd_passes[kind][0][m](&xr, m0, K, wq, b, y, other, N, post);
            m0 += m;
        }
    }
    }
    free(xq), free(xd), free(xs), free(xi), free(xh);
    return 0;
}
#else
static int gemm_qdot(const int kind, const float *x, const uint8_t *wq, float *y, const float *other, int64_t M,
                     int64_t K, int64_t N, int post) {
    (void)kind, (void)x, (void)wq, (void)y, (void)other, (void)M, (void)K, (void)N, (void)post;
    return -2;
}
#endif

int small_gemm_q4_1_dot(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                        int64_t N, int post) {
    return gemm_qdot(QK_Q4_1, x, wq, y, other, M, K, N, post);
}

int small_gemm_q8_0_dot(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                        int64_t N, int post) {
    return gemm_qdot(QK_Q8_0, x, wq, y, other, M, K, N, post);
}

int small_gemm_q4_0_dot(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                        int64_t N, int post) {
    return gemm_qdot(QK_Q4_0, x, wq, y, other, M, K, N, post);
}

int small_gemm_q5_0_dot(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                        int64_t N, int post) {
    return gemm_qdot(QK_Q5_0, x, wq, y, other, M, K, N, post);
}

int small_gemm_q6_k_dot(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                        int64_t N, int post) {
    return gemm_qdot(QK_Q6_K, x, wq, y, other, M, K, N, post);
}
