/* The float32 kernels' vector vocabulary (small_gemm_f32.c) and what the kernels built on it share
 * (small_gemm_q.c, small_gemm_qdot.c, head_step.c): the vector width NB and its operations, silu of a vector,
 * and the epilogue that stores a vector of sums. They are inline here, not called across files: each runs per
 * vector inside a pass's loop, and every file that uses them gets the same operations in the same order, so
 * the same bits.
 *
 * NB: 16 outputs a vector (zmm) where the CPU has AVX512F, else 8 (ymm, AVX2 and FMA); -DBLOCK8 takes the
 * 8-wide vectors on an AVX512 CPU, to compare the two.
 */
#ifndef SMALL_GEMM_F32_H
#define SMALL_GEMM_F32_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#if defined(__AVX512F__) && !defined(BLOCK8)
#define NB 16 /* outputs per block: one zmm of float32 */
typedef __m512 vec;
#define VZERO _mm512_setzero_ps()
#define VFMA _mm512_fmadd_ps
#define VSET1 _mm512_set1_ps
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define LOADW16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMULF _mm512_mul_ps
#define VMUL _mm512_mul_ps
#define VDIV _mm512_div_ps
#define VMIN _mm512_min_ps
#define VMAX _mm512_max_ps
#define VPOW2(n) /* 2^n for integral n in [-126, 127] */ \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#else
#define NB 8  /* outputs per block: one ymm of float32 */
typedef __m256 vec;
#define VZERO _mm256_setzero_ps()
#define VFMA _mm256_fmadd_ps
#define VSET1 _mm256_set1_ps
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define LOADW16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMULF _mm256_mul_ps
#define VMUL _mm256_mul_ps
#define VDIV _mm256_div_ps
#define VMIN _mm256_min_ps
#define VMAX _mm256_max_ps
#define VPOW2(n) /* 2^n for integral n in [-126, 127] */ \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#endif

static inline float silu(float v) { return v / (1.0f + expf(-v)); }

/* silu(v) = v / (1 + exp(-v)) for a vector of outputs. A call to expf per output took 5% of a 16-row forward
 * (perf, Intel Xeon, the embedded model in int8). exp(x) = 2^n p(r): n = round(x / ln 2), r = x - n ln 2 (ln 2
 * in two parts, so r is exact to a float), p the degree-7 Taylor polynomial, under 1e-7 relative error over
 * |r| <= ln2 / 2; x is clamped to [-87, 88] so that 2^n stays a normal float (outside, silu is v or -0 to
 * within its rounding). Within |v| < 76 it stays within 2.4 ulp of silu computed in double. The same
 * operations run in either vector width, so a row's bits do not depend on it (nor on its batch). */
static inline vec silu_vec(vec v) {
    const vec x = VMAX(VMIN(VSUB(VZERO, v), VSET1(88.0f)), VSET1(-87.0f));
    const vec n = VSUB(VFMA(x, VSET1(1.44269504f), VSET1(12582912.0f)), VSET1(12582912.0f));
    const vec r = VFMA(n, VSET1(2.12194440e-4f), VFMA(n, VSET1(-0.693359375f), x));
    vec p = VSET1(1.0f / 5040.0f);
    p = VFMA(p, r, VSET1(1.0f / 720.0f));
    p = VFMA(p, r, VSET1(1.0f / 120.0f));
    p = VFMA(p, r, VSET1(1.0f / 24.0f));
    p = VFMA(p, r, VSET1(1.0f / 6.0f));
    p = VFMA(p, r, VSET1(0.5f));
    p = VFMA(p, r, VSET1(1.0f));
    p = VFMA(p, r, VSET1(1.0f));
    return VDIV(v, VADD(VSET1(1.0f), VMULF(p, VPOW2(n))));
}

static inline void finish(float *y, const float *other, int post, vec acc, int64_t at) {
    if (post == 0) {
        VSTORE(y + at, acc);
        return;
    }
    if (post == 1) {
        VSTORE(y + at, silu_vec(acc));
        return;
    }
    float v[NB];
    VSTORE(v, acc);
    for (int j = 0; j < NB; j++) {
        if (post == 2) v[j] += other[at + j];
        else v[j] *= other[at + j];
    }
    __builtin_memcpy(y + at, v, sizeof v);
}

/* x [M, K], wp packed [N/NB][K][NB] (N a multiple of NB), y [M, N]; other [M, N] for post 2 and 3 */
void small_gemm_f32(const float *x, const float *wp, float *y, const float *other, int64_t M, int64_t K, int64_t N,
                    int post);
/* w [N, K] row-major -> wp [N/NB][K][NB] */
void small_gemm_f32_pack(const float *w, float *wp, int64_t K, int64_t N);
/* outputs per packed block: N must be a multiple */
int small_gemm_f32_block(void);

/* the same over float16 weights (small_gemm_f32.c built with -DWEIGHT_F16) */
void small_gemm_f16w(const float *x, const uint16_t *wp, float *y, const float *other, int64_t M, int64_t K,
                     int64_t N, int post);
void small_gemm_f16w_pack(const uint16_t *w, uint16_t *wp, int64_t K, int64_t N);
int small_gemm_f16w_block(void);

#endif
