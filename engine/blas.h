/*
 * blas.h - the engine's one door to OpenBLAS.
 *
 * Only blas.c includes <cblas.h>; every dense f32 product in the engine goes
 * through cart_gemm so that the BLAS can be swapped or bypassed in one place.
 */
#ifndef CART_BLAS_H
#define CART_BLAS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Row-major single-precision GEMM:
 *   c[m, n] = alpha * op(a)[m, k] @ op(b)[k, n] + beta * c[m, n]
 * op(x) is x when trans_x is 0, x transposed when it is 1. lda, ldb, ldc are
 * the row pitches (in elements) of the matrices as stored. beta == 0 means c
 * is written without being read. Returns CART_E_ARG for negative dims or a
 * pitch smaller than the stored row. */
int cart_gemm(float *c, int64_t ldc, const float *a, int64_t lda, int32_t trans_a, const float *b,
              int64_t ldb, int32_t trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              float beta);

/* Threads the BLAS may use for one call (n >= 1), and the current value. */
void cart_blas_set_threads(int32_t n);
int32_t cart_blas_threads(void);

/* The BLAS library's own description (OpenBLAS config string). Static. */
const char *cart_blas_info(void);

#ifdef __cplusplus
}
#endif

#endif
