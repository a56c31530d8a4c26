/* GGUF's Q4_1 and Q8_0 blocks read as the float32 weights the loader made of them (small_gemm_q.c).
 *
 * x [M, K] float32, wq packed as small_gemm_q.c lays it out (K a multiple of 32, N of small_gemm_f32_block()),
 * y [M, N]; other [M, N] for post 2 (y + other) and 3 (y * other), 1 is silu(y).
 */
#ifndef SMALL_GEMM_Q_H
#define SMALL_GEMM_Q_H

#include <stdint.h>

void small_gemm_q4_1(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                     int64_t N, int post);
void small_gemm_q8_0(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                     int64_t N, int post);

#endif
