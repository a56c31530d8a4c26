/* One row's attention over its cells in a fixed order of arithmetic (cell_attention.c): the scores, the
 * softmax and the weighted sum of values, each the same additions for any row in any batch.
 *
 * Per (row, key head): scores s_i = scale * q . k_i over the row's cells (the H / H_kv query heads sharing the
 * key head in one pass), m = max s, e_i = exp(s_i - m), out = (sum_i e_i v_i) / (sum_i e_i); dot products in
 * 16 fixed lanes reduced pairwise, sum_i e_i in 8 lanes (cell i in lane i mod 8) reduced pairwise, each
 * element of sum_i e_i v_i over the cells in list order. The loops below are shaped for speed (4 cells' dot
 * products interleaved, and for 64-wide heads their reduction done with AVX2 shuffles and the weighted sums
 * kept in registers), never at the cost of that order.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

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

/* VW floats, loaded from any address: GCC's vector extension, one zmm with AVX512F, else 8 (one ymm on AVX2, two
 * xmm elsewhere). -DBLOCK8 keeps 8 on an AVX512 CPU, to compare the two. */
#if defined(__AVX512F__) && !defined(BLOCK8)
#define VW 16
#define WIDE 1
#else
#define VW 8
#endif
typedef float vw __attribute__((vector_size(VW * 4), aligned(4)));

/* sum_i e_i v_i for head_dim 64 and G query heads, 32 dimensions at a time (16 for 4 heads; all 64 with 16-wide
 * vectors, whose 32 registers hold 4 heads' sums) so that the sums stay in registers (a 4 x 64 array of them
 * spilled to the stack at every cell): each element still adds e_i v_i over the cells in list order, one fused
 * multiply-add per cell, as the general loop does */
static inline __attribute__((always_inline)) void weigh64_g(const float *restrict vb, const int64_t *restrict cells,
                                                            int64_t n, const int G, const float *restrict s,
                                                            float *restrict o) {
    const int W = VW == 16 || G <= 3 ? 4 : 2;  /* vectors per head and pass: G x W sums in registers */
    for (int d0 = 0; d0 < 64; d0 += VW * W) {
        vw a[4][4] = {{0}};
        for (int64_t i = 0; i < n; i++) {
            const vw *vc = (const vw *)(vb + cells[i] * 64 + d0);
            vw x[4];
            for (int w = 0; w < W; w++) x[w] = vc[w];
            for (int g = 0; g < G; g++) {
                const float e = s[g * n + i];
                for (int w = 0; w < W; w++) a[g][w] += e * x[w];
            }
        }
        for (int g = 0; g < G; g++)
            for (int w = 0; w < W; w++) *(vw *)(o + g * 64 + d0 + VW * w) = a[g][w];
    }
}

static void weigh64(const float *restrict vb, const int64_t *restrict cells, int64_t n, int group,
                    const float *restrict s, float *restrict o) {
    switch (group) {
    case 1: weigh64_g(vb, cells, n, 1, s, o); break;
    case 2: weigh64_g(vb, cells, n, 2, s, o); break;
    case 3: weigh64_g(vb, cells, n, 3, s, o); break;
    default: weigh64_g(vb, cells, n, 4, s, o); break;
    }
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

#ifdef __AVX2__
/* dot4's pairwise reduction for w = 4, 2, 1 of four cells whose lanes 0..7 already hold lane j + lane j + 8
 * (the w = 8 step), done for the four at once with shuffles instead of one lane at a time */
static inline void reduce4(const __m256 r0, const __m256 r1, const __m256 r2, const __m256 r3, float *out) {
    /* w = 4: [cell 0 lanes 0..3 | cell 1 lanes 0..3], and cells 2, 3 */
    const __m256 s01 = _mm256_add_ps(_mm256_permute2f128_ps(r0, r1, 0x20), _mm256_permute2f128_ps(r0, r1, 0x31));
    const __m256 s23 = _mm256_add_ps(_mm256_permute2f128_ps(r2, r3, 0x20), _mm256_permute2f128_ps(r2, r3, 0x31));
    /* w = 2: per 128-bit half [c lanes 0, 1 | c' lanes 0, 1] with c from s01, c' from s23 */
    const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
    /* w = 1: low half holds cells 0 and 2, high half cells 1 and 3 */
    const __m256 u = _mm256_add_ps(_mm256_shuffle_ps(t, t, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(t, t, _MM_SHUFFLE(3, 1, 3, 1)));
    float v[8];
    _mm256_storeu_ps(v, u);
    out[0] = v[0] + 0.0f;  /* + the tail dot4 adds (none at 64) */
    out[1] = v[4] + 0.0f;
    out[2] = v[1] + 0.0f;
    out[3] = v[5] + 0.0f;
}

/* dot4 for head_dim 64 with AVX2 and FMA: the same 16 lanes (two ymm per cell), each lane's products added in
 * the same k order, and the same pairwise reduction: every addition of dot4 in the same order, on the same
 * operands, so the same bits. */
static inline void dot4_64(const float *a, const float *k0, const float *k1, const float *k2, const float *k3,
                           float *out) {
    __m256 l0 = _mm256_setzero_ps(), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
    for (int i = 0; i < 64; i += 16) {
        const __m256 xl = _mm256_loadu_ps(a + i), xh = _mm256_loadu_ps(a + i + 8);
        l0 = _mm256_fmadd_ps(xl, _mm256_loadu_ps(k0 + i), l0);
        h0 = _mm256_fmadd_ps(xh, _mm256_loadu_ps(k0 + i + 8), h0);
        l1 = _mm256_fmadd_ps(xl, _mm256_loadu_ps(k1 + i), l1);
        h1 = _mm256_fmadd_ps(xh, _mm256_loadu_ps(k1 + i + 8), h1);
        l2 = _mm256_fmadd_ps(xl, _mm256_loadu_ps(k2 + i), l2);
        h2 = _mm256_fmadd_ps(xh, _mm256_loadu_ps(k2 + i + 8), h2);
        l3 = _mm256_fmadd_ps(xl, _mm256_loadu_ps(k3 + i), l3);
        h3 = _mm256_fmadd_ps(xh, _mm256_loadu_ps(k3 + i + 8), h3);
    }
    reduce4(_mm256_add_ps(l0, h0), _mm256_add_ps(l1, h1), _mm256_add_ps(l2, h2), _mm256_add_ps(l3, h3), out);
}
#endif

#ifdef WIDE
/* dot4_64 for G query heads at once with AVX512F: a cell's 16 lanes are one zmm, the same products added in the
 * same k order, and each key vector is loaded once for the G heads instead of once per head. The w = 8 step
 * adds the zmm's halves; the rest is dot4_64's. out[g * 4 + c]: head g, cell c. */
static inline __attribute__((always_inline)) void dot4_64_g(const float *a, const int G, const float *k0,
                                                            const float *k1, const float *k2, const float *k3,
                                                            float *out) {
    __m512 l[4][4];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < 4; c++) l[g][c] = _mm512_setzero_ps();
    for (int i = 0; i < 64; i += 16) {
        const __m512 y0 = _mm512_loadu_ps(k0 + i), y1 = _mm512_loadu_ps(k1 + i);
        const __m512 y2 = _mm512_loadu_ps(k2 + i), y3 = _mm512_loadu_ps(k3 + i);
        for (int g = 0; g < G; g++) {
            const __m512 x = _mm512_loadu_ps(a + g * 64 + i);
            l[g][0] = _mm512_fmadd_ps(x, y0, l[g][0]);
            l[g][1] = _mm512_fmadd_ps(x, y1, l[g][1]);
            l[g][2] = _mm512_fmadd_ps(x, y2, l[g][2]);
            l[g][3] = _mm512_fmadd_ps(x, y3, l[g][3]);
        }
    }
#define HALVES(z) _mm256_add_ps(_mm512_castps512_ps256(z), \
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1)))
    for (int g = 0; g < G; g++)
        reduce4(HALVES(l[g][0]), HALVES(l[g][1]), HALVES(l[g][2]), HALVES(l[g][3]), out + g * 4);
#undef HALVES
}

static void dot4_64_heads(const float *a, int group, const float *k0, const float *k1, const float *k2,
                          const float *k3, float *out) {
    switch (group) {
    case 1: dot4_64_g(a, 1, k0, k1, k2, k3, out); break;
    case 2: dot4_64_g(a, 2, k0, k1, k2, k3, out); break;
    case 3: dot4_64_g(a, 3, k0, k1, k2, k3, out); break;
    default: dot4_64_g(a, 4, k0, k1, k2, k3, out); break;
    }
}
#endif

/* scores s[g * stride + i] = scale * q_g . k_{cells[i]} for i in [i0, i1), the `group` query heads sharing a
 * key head in one pass over each cell */
static void scores_from(const float *qr, const float *kb, const int64_t *cells, int64_t i0, int64_t i1,
                        int64_t stride, int group, int head_dim, float scale, float *s) {
    int64_t i = i0;
    float four[4];
    for (; i + 4 <= i1; i += 4) {
        const float *c0 = kb + cells[i] * head_dim, *c1 = kb + cells[i + 1] * head_dim;
        const float *c2 = kb + cells[i + 2] * head_dim, *c3 = kb + cells[i + 3] * head_dim;
#ifdef WIDE
        if (head_dim == 64 && group <= 4) {
            float by_head[16];
            dot4_64_heads(qr, group, c0, c1, c2, c3, by_head);
            for (int g = 0; g < group; g++)
                for (int j = 0; j < 4; j++) s[g * stride + i + j] = by_head[g * 4 + j] * scale;
            continue;
        }
#endif
        for (int g = 0; g < group; g++) {
#ifdef __AVX2__
            if (head_dim == 64) dot4_64(qr + g * head_dim, c0, c1, c2, c3, four);
            else
#endif
            dot4(qr + g * head_dim, c0, c1, c2, c3, head_dim, four);
            for (int j = 0; j < 4; j++) s[g * stride + i + j] = four[j] * scale;
        }
    }
    for (; i < i1; i++) {
        const float *kc = kb + cells[i] * head_dim;
        for (int g = 0; g < group; g++) s[g * stride + i] = dot(qr + g * head_dim, kc, head_dim) * scale;
    }
}

#ifdef __AVX2__
/* exp_neg on 8 lanes: its operations in its order, a fused multiply-add wherever the compiler fuses exp_neg's
 * (-ffp-contract=fast, GCC's default), so each lane's bits are exp_neg's */
static inline __m256 exp_neg8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 round = _mm256_set1_ps(12582912.0f);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504f), round), round);
    const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f),
                                     _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}
#endif

/* per query head g: s[g * n + i] <- exp(s - max), total[g] <- their sum. The max is the same whatever the order
 * of comparison (a tie of -0 and +0 gives the same exps): 8 lanes; the sum's order is fixed: lane i mod 8 over
 * the cells in order, then pairwise, then the tail. With AVX2 the 8 lanes are one register, written out
 * (the compiler's own vectorizing of the lane loops spent a quarter of the attention on shuffles). */
static void softmax_heads(float *s, int64_t n, int group, float *total) {
    for (int g = 0; g < group; g++) {
        float *sg = s + g * n;
        float mx[8], lane[8] = {0}, m = sg[0], tail = 0.0f;
        int64_t i = 0;
#ifdef __AVX2__
        __m256 mv = _mm256_set1_ps(sg[0]);
        for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(_mm256_loadu_ps(sg + i), mv);
        _mm256_storeu_ps(mx, mv);
#else
        for (int j = 0; j < 8; j++) mx[j] = sg[0];
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) mx[j] = sg[i + j] > mx[j] ? sg[i + j] : mx[j];
#endif
        for (int j = 0; j < 8; j++) m = mx[j] > m ? mx[j] : m;
        for (; i < n; i++) m = sg[i] > m ? sg[i] : m;
        i = 0;
#ifdef __AVX2__
        const __m256 mb = _mm256_set1_ps(m);
        __m256 sum = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            const __m256 e = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(sg + i), mb));
            _mm256_storeu_ps(sg + i, e);
            sum = _mm256_add_ps(sum, e);
        }
        _mm256_storeu_ps(lane, sum);
#else
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) {
                const float e = exp_neg(sg[i + j] - m);
                sg[i + j] = e;
                lane[j] += e;
            }
#endif
        for (; i < n; i++) {
            sg[i] = exp_neg(sg[i] - m);
            tail += sg[i];
        }
        for (int w = 4; w >= 1; w /= 2)
            for (int j = 0; j < w; j++) lane[j] += lane[j + w];
        total[g] = lane[0] + tail;
    }
}

/* One row, one key head: its `group` query heads qr over the n cells listed in `cells`; s: scratch of
 * group * (n + 1) floats; o: group * head_dim outputs. */
static void one_task(const float *qr, const float *kb, const float *vb, const int64_t *cells, int64_t n,
                     int group, int head_dim, float scale, float *s, float *o) {
    scores_from(qr, kb, cells, 0, n, n, group, head_dim, scale, s);
    float *total = s + (int64_t)group * n;  /* per query head: the sum of its e_i */
    softmax_heads(s, n, group, total);
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
