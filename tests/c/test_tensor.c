/*
 * test_tensor.c - shapes, views, copies and the tensor matmul.
 */
#include "check.h"
#include "dtype.h"
#include "tensor.h"

static void fill_iota(cart_tensor *t) {
    int64_t n = cart_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) t->data[i] = (float)i;
}

static float get4(const cart_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t idx[4] = {a, b, c, d};
    float v = -1;
    CHECK_OK(cart_tensor_get(&v, t, idx));
    return v;
}

static void test_a_new_tensor_is_zeroed_contiguous_and_row_major(void) {
    cart_tensor *t = NULL;
    int64_t shape[3] = {2, 3, 4};
    CHECK_OK(cart_tensor_new(&t, 3, shape));
    CHECK(t->ndim == 3 && cart_tensor_numel(t) == 24);
    CHECK(t->stride[0] == 12 && t->stride[1] == 4 && t->stride[2] == 1);
    CHECK(t->shape[3] == 1);
    CHECK(cart_tensor_is_contiguous(t));
    CHECK(((uintptr_t)t->data % 64) == 0);
    double sum = 0;
    for (int i = 0; i < 24; i++) sum += fabs(t->data[i]);
    CHECK(sum == 0);
    cart_tensor_free(t);

    cart_tensor *s = NULL;
    CHECK_OK(cart_tensor_new(&s, 0, NULL));
    CHECK(cart_tensor_numel(s) == 1);
    cart_tensor_free(s);
    cart_tensor_free(NULL);
}

static void test_views_share_storage_and_outlive_their_source(void) {
    cart_tensor *t = NULL, *n = NULL, *sel = NULL, *tr = NULL, *rs = NULL;
    int64_t shape[3] = {2, 3, 4};
    CHECK_OK(cart_tensor_new(&t, 3, shape));
    fill_iota(t);
    CHECK_OK(cart_tensor_narrow(&n, t, 1, 1, 2));   /* [2, 2, 4] rows 1..2 */
    CHECK_OK(cart_tensor_select(&sel, t, 0, 1));    /* [3, 4] second block */
    CHECK_OK(cart_tensor_transpose(&tr, t, 1, 2));  /* [2, 4, 3] */
    CHECK_OK(cart_tensor_reshape(&rs, t, 2, (int64_t[]){6, 4}));
    cart_tensor_free(t); /* the views keep the storage alive */
    CHECK(n->shape[1] == 2 && get4(n, 1, 0, 2, 0) == 12 + 4 + 2);
    CHECK(!cart_tensor_is_contiguous(n));
    CHECK(sel->ndim == 2 && get4(sel, 2, 3, 0, 0) == 23);
    CHECK(tr->shape[1] == 4 && get4(tr, 0, 3, 2, 0) == 2 * 4 + 3);
    CHECK(get4(rs, 5, 1, 0, 0) == 21);
    /* a write through one view is seen by another */
    CHECK_OK(cart_tensor_set(sel, (int64_t[]){0, 0}, -5.0f));
    CHECK(get4(rs, 3, 0, 0, 0) == -5.0f);
    cart_tensor *c = NULL;
    CHECK_OK(cart_tensor_clone(&c, tr));
    CHECK(cart_tensor_is_contiguous(c));
    double d = -1;
    CHECK_OK(cart_tensor_max_abs_diff(&d, c, tr));
    CHECK_MAXDIFF("clone of a transposed view", d, 0.0);
    cart_tensor_free(n), cart_tensor_free(sel), cart_tensor_free(tr), cart_tensor_free(rs);
    cart_tensor_free(c);
}

static void test_views_reject_out_of_range_arguments(void) {
    cart_tensor *t = NULL, *v = NULL;
    CHECK_OK(cart_tensor_new(&t, 2, (int64_t[]){3, 4}));
    CHECK_ERR(cart_tensor_narrow(&v, t, 1, 2, 3), CART_E_ARG);
    CHECK_ERR(cart_tensor_narrow(&v, t, 2, 0, 1), CART_E_ARG);
    CHECK_ERR(cart_tensor_select(&v, t, 0, 3), CART_E_ARG);
    CHECK_ERR(cart_tensor_reshape(&v, t, 2, (int64_t[]){5, 2}), CART_E_ARG);
    CHECK_ERR(cart_tensor_new(&v, 5, (int64_t[]){1, 1, 1, 1, 1}), CART_E_ARG);
    CHECK_ERR(cart_tensor_new(&v, 1, (int64_t[]){-1}), CART_E_ARG);
    CHECK_ERR(cart_tensor_get(&(float){0}, t, (int64_t[]){3, 0}), CART_E_ARG);
    cart_tensor *tr = NULL;
    CHECK_OK(cart_tensor_transpose(&tr, t, 0, 1));
    CHECK_ERR(cart_tensor_reshape(&v, tr, 1, (int64_t[]){12}), CART_E_ARG);
    CHECK_ERROR_MENTIONS("not contiguous");
    cart_tensor_free(tr);
    cart_tensor_free(t);
}

static void test_copy_and_fill_work_on_strided_views(void) {
    cart_tensor *a = NULL, *b = NULL, *at = NULL;
    CHECK_OK(cart_tensor_new(&a, 2, (int64_t[]){3, 5}));
    CHECK_OK(cart_tensor_new(&b, 2, (int64_t[]){5, 3}));
    fill_iota(a);
    CHECK_OK(cart_tensor_transpose(&at, a, 0, 1));
    CHECK_OK(cart_tensor_copy(b, at));
    CHECK(get4(b, 4, 2, 0, 0) == 2 * 5 + 4);
    cart_tensor_fill(at, 7.0f);
    CHECK(a->data[14] == 7.0f && a->data[0] == 7.0f);
    CHECK_ERR(cart_tensor_copy(a, b), CART_E_ARG);
    cart_tensor_free(a), cart_tensor_free(b), cart_tensor_free(at);
}

static void test_matmul_accepts_transposed_views(void) {
    const int64_t m = 7, k = 5, n = 6;
    cart_tensor *a = NULL, *bt = NULL, *b = NULL, *c = NULL;
    CHECK_OK(cart_tensor_new(&a, 2, (int64_t[]){m, k}));
    CHECK_OK(cart_tensor_new(&bt, 2, (int64_t[]){n, k}));
    CHECK_OK(cart_tensor_new(&c, 2, (int64_t[]){m, n}));
    for (int64_t i = 0; i < m * k; i++) a->data[i] = (float)((i * 7) % 11) - 5.0f;
    for (int64_t i = 0; i < n * k; i++) bt->data[i] = (float)((i * 5) % 13) - 6.0f;
    CHECK_OK(cart_tensor_transpose(&b, bt, 0, 1)); /* [k, n], unit stride along dim 0 */
    CHECK_OK(cart_tensor_matmul(c, a, b, 1.0f, 0.0f));
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double want = 0;
            for (int64_t p = 0; p < k; p++) want += a->data[i * k + p] * bt->data[j * k + p];
            worst = fmax(worst, fabs(want - c->data[i * n + j]));
        }
    CHECK_MAXDIFF("matmul with a transposed operand", worst, 1e-5);
    /* a view with no unit stride is copied first */
    cart_tensor *big = NULL, *strided = NULL, *inner = NULL;
    CHECK_OK(cart_tensor_new(&big, 3, (int64_t[]){m, k, 2}));
    CHECK_OK(cart_tensor_select(&strided, big, 2, 1)); /* [m, k], strides (2k, 2) */
    CHECK_OK(cart_tensor_copy(strided, a));
    CHECK_OK(cart_tensor_matmul(c, strided, b, 1.0f, 0.0f));
    worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double want = 0;
            for (int64_t p = 0; p < k; p++) want += a->data[i * k + p] * bt->data[j * k + p];
            worst = fmax(worst, fabs(want - c->data[i * n + j]));
        }
    CHECK_MAXDIFF("matmul with a non-unit-stride operand", worst, 1e-5);
    CHECK_ERR(cart_tensor_matmul(c, b, a, 1.0f, 0.0f), CART_E_ARG);
    cart_tensor_free(inner);
    cart_tensor_free(a), cart_tensor_free(bt), cart_tensor_free(b), cart_tensor_free(c);
    cart_tensor_free(big), cart_tensor_free(strided);
}

static void test_load_converts_16_bit_sources(void) {
    cart_tensor *t = NULL;
    CHECK_OK(cart_tensor_new(&t, 1, (int64_t[]){4}));
    uint16_t h[4] = {0x3c00, 0xc000, 0x3800, 0x0000}; /* 1, -2, 0.5, 0 */
    CHECK_OK(cart_tensor_load(t, CART_F16, h, 4));
    CHECK(t->data[0] == 1.0f && t->data[1] == -2.0f && t->data[2] == 0.5f && t->data[3] == 0);
    CHECK_ERR(cart_tensor_load(t, CART_F16, h, 3), CART_E_ARG);
    cart_tensor_free(t);
}

int main(void) {
    RUN(test_a_new_tensor_is_zeroed_contiguous_and_row_major);
    RUN(test_views_share_storage_and_outlive_their_source);
    RUN(test_views_reject_out_of_range_arguments);
    RUN(test_copy_and_fill_work_on_strided_views);
    RUN(test_matmul_accepts_transposed_views);
    RUN(test_load_converts_16_bit_sources);
    return check_finish("tensor");
}
