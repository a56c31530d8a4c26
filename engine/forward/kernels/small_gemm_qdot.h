/* GGUF's Q4_1, Q4_0, Q5_0, Q8_0 and Q6_K blocks times 8-bit inputs, summed in integers (small_gemm_qdot.c): llama.cpp's CPU
 * arithmetic.
 *
 * x [M, K] float32, wq packed as small_gemm_qdot.c lays it out (K a multiple of 32, N of small_gemm_f32_block()),
 * y [M, N]; other [M, N] for post 2 and 3. They return 0, -1 where memory for the quantised rows could not be
 * had, and -2 where this build has no integer dot products (small_gemm_qdot_ok() is 0).
 */
#ifndef SMALL_GEMM_QDOT_H
#define SMALL_GEMM_QDOT_H

#include <stdint.h>

/* 1 where the CPU this was built for has the byte dot products (VNNI, or AVX2's byte pairs) */
int small_gemm_qdot_ok(void);
int small_gemm_q4_1_dot(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                        int64_t N, int post);
int small_gemm_q8_0_dot(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                        int64_t N, int post);
int small_gemm_q4_0_dot(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                        int64_t N, int post);
int small_gemm_q5_0_dot(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                        int64_t N, int post);
int small_gemm_q6_k_dot(const float *x, const uint8_t *wq, float *y, const float *other, int64_t M, int64_t K,
                        int64_t N, int post);

#endif
