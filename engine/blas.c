/*
 * blas.c - the only file that talks to OpenBLAS.
 */
#include <cblas.h>
#include <string.h>

#include "blas.h"
#include "internal.h"

int cart_gemm(float *c, int64_t ldc, const float *a, int64_t lda, int32_t trans_a, const float *b,
              int64_t ldb, int32_t trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              float beta) {
    if (m < 0 || n < 0 || k < 0)
        return cart_fail(CART_E_ARG, "cart_gemm: negative dimension (m %lld, n %lld, k %lld)",
                         (long long)m, (long long)n, (long long)k);
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
        ldc > INT32_MAX)
        return cart_fail(CART_E_ARG, "cart_gemm: dimension or pitch beyond the BLAS's 32-bit range");
    int64_t a_cols = trans_a ? m : k;
    int64_t b_cols = trans_b ? k : n;
    if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) ||
        ldc < (n > 1 ? n : 1))
        return cart_fail(CART_E_ARG,
                         "cart_gemm: pitch smaller than a stored row (lda %lld for %lld columns, "
                         "ldb %lld for %lld, ldc %lld for %lld)",
                         (long long)lda, (long long)a_cols, (long long)ldb, (long long)b_cols,
                         (long long)ldc, (long long)n);
    if (m == 0 || n == 0) return CART_OK;
    if (k == 0) { /* op(a) @ op(b) is all zeros: c = beta * c */
        for (int64_t i = 0; i < m; i++) {
            float *row = c + i * ldc;
            if (beta == 0.0f) memset(row, 0, (size_t)n * sizeof *row);
            else
                for (int64_t j = 0; j < n; j++) row[j] *= beta;
        }
        return CART_OK;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
    return CART_OK;
}

void cart_blas_set_threads(int32_t n) {
    openblas_set_num_threads(n >= 1 ? n : 1);
}

int32_t cart_blas_threads(void) {
    return (int32_t)openblas_get_num_threads();
}

const char *cart_blas_info(void) {
    return openblas_get_config();
}
