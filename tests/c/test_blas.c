/*
 * test_blas.c - cart_gemm against a naive triple loop in double precision.
 */
#include "blas.h"
#include "check.h"

static float lcg_uniform(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*s >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}

/* element (i, j) of op(x) for a stored matrix with pitch ld */
static float at(const float *x, int64_t ld, int trans, int64_t i, int64_t j) {
    return trans ? x[j * ld + i] : x[i * ld + j];
}

static void test_gemm_matches_a_naive_product_for_all_transposes(void) {
    uint64_t seed = 1;
    const int64_t m = 37, n = 29, k = 53, pad = 3;
    double worst = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
            int64_t arows = ta ? k : m, brows = tb ? n : k;
            float *a = malloc(sizeof(float) * arows * lda), *b = malloc(sizeof(float) * brows * ldb);
            float *c = malloc(sizeof(float) * m * ldc);
            for (int64_t i = 0; i < arows * lda; i++) a[i] = lcg_uniform(&seed);
            for (int64_t i = 0; i < brows * ldb; i++) b[i] = lcg_uniform(&seed);
            for (int64_t i = 0; i < m * ldc; i++) c[i] = lcg_uniform(&seed);
            float *c0 = malloc(sizeof(float) * m * ldc);
            memcpy(c0, c, sizeof(float) * m * ldc);
            CHECK_OK(cart_gemm(c, ldc, a, lda, ta, b, ldb, tb, m, n, k, 0.5f, 2.0f));
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double acc = 0;
                    for (int64_t p = 0; p < k; p++)
                        acc += (double)at(a, lda, ta, i, p) * at(b, ldb, tb, p, j);
                    double want = 0.5 * acc + 2.0 * c0[i * ldc + j];
                    double d = fabs(want - c[i * ldc + j]);
                    if (d > worst) worst = d;
                }
            free(a), free(b), free(c), free(c0);
        }
    CHECK_MAXDIFF("gemm vs naive (all 4 transposes)", worst, 1e-4);
}

static void test_gemm_handles_empty_and_rejects_bad_pitches(void) {
    float c[4] = {1, 2, 3, 4}, a[4] = {0}, b[4] = {0};
    CHECK_OK(cart_gemm(c, 2, a, 1, 0, b, 2, 0, 2, 2, 0, 1.0f, 0.5f)); /* k = 0: c *= beta */
    CHECK(c[0] == 0.5f && c[3] == 2.0f);
    CHECK_OK(cart_gemm(c, 2, a, 1, 0, b, 2, 0, 2, 2, 0, 1.0f, 0.0f));
    CHECK(c[0] == 0.0f && c[3] == 0.0f);
    CHECK_OK(cart_gemm(c, 2, a, 2, 0, b, 2, 0, 0, 2, 2, 1.0f, 0.0f));
    CHECK_ERR(cart_gemm(c, 2, a, 1, 0, b, 2, 0, 2, 2, 2, 1.0f, 0.0f), CART_E_ARG);
    CHECK_ERR(cart_gemm(c, 2, a, 2, 0, b, 2, 0, -1, 2, 2, 1.0f, 0.0f), CART_E_ARG);
    CHECK(cart_blas_info() != NULL);
    cart_blas_set_threads(1);
    CHECK(cart_blas_threads() == 1);
}

int main(void) {
    RUN(test_gemm_matches_a_naive_product_for_all_transposes);
    RUN(test_gemm_handles_empty_and_rejects_bad_pitches);
    return check_finish("blas");
}
