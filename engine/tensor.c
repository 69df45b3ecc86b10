/*
 * tensor.c - f32 tensors over shared, reference-counted storage.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "blas.h"
#include "dtype.h"
#include "internal.h"
#include "tensor.h"

struct cart_storage {
    atomic_int refs;
    float *data; /* 64-byte aligned, owned */
    uint64_t numel;
};

static cart_storage *storage_new(uint64_t numel) {
    cart_storage *s = cart_calloc(1, sizeof *s, "tensor storage header");
    if (!s) return NULL;
    size_t bytes = (size_t)(numel ? numel : 1) * sizeof(float);
    bytes = (bytes + 63) & ~(size_t)63;
    s->data = aligned_alloc(64, bytes);
    if (!s->data) {
        free(s);
        cart_fail(CART_E_NOMEM, "out of memory allocating a tensor of %llu floats",
                  (unsigned long long)numel);
        return NULL;
    }
    memset(s->data, 0, bytes);
    atomic_init(&s->refs, 1);
    s->numel = numel;
    return s;
}

static void storage_retain(cart_storage *s) {
    if (s) atomic_fetch_add(&s->refs, 1);
}

static void storage_release(cart_storage *s) {
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) {
        free(s->data);
        free(s);
    }
}

static int check_shape(int32_t ndim, const int64_t *shape, uint64_t *numel) {
    if (ndim < 0 || ndim > 4) return cart_fail(CART_E_ARG, "tensor ndim %d is outside 0..4", ndim);
    uint64_t count = 1;
    for (int32_t i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return cart_fail(CART_E_ARG, "tensor dimension %d has negative size %lld", i,
                             (long long)shape[i]);
        if (shape[i] > 0 && count > (UINT64_C(1) << 60) / (uint64_t)shape[i])
            return cart_fail(CART_E_ARG, "tensor shape overflows the element count");
        count *= (uint64_t)shape[i];
    }
    *numel = count;
    return CART_OK;
}

static void set_contiguous_strides(cart_tensor *t) {
    int64_t step = 1;
    for (int32_t i = 3; i >= 0; i--) {
        if (i >= t->ndim) {
            t->shape[i] = 1;
            t->stride[i] = 1;
            continue;
        }
        t->stride[i] = step;
        step *= t->shape[i];
    }
}

static cart_tensor *header_new(void) {
    return cart_calloc(1, sizeof(cart_tensor), "tensor header");
}

int cart_tensor_new(cart_tensor **out, int32_t ndim, const int64_t *shape) {
    *out = NULL;
    uint64_t numel = 0;
    int rc = check_shape(ndim, shape, &numel);
    if (rc) return rc;
    cart_tensor *t = header_new();
    if (!t) return CART_E_NOMEM;
    t->storage = storage_new(numel);
    if (!t->storage) {
        free(t);
        return CART_E_NOMEM;
    }
    t->data = t->storage->data;
    t->ndim = ndim;
    for (int32_t i = 0; i < ndim; i++) t->shape[i] = shape[i];
    set_contiguous_strides(t);
    *out = t;
    return CART_OK;
}

int cart_tensor_wrap(cart_tensor **out, float *data, int32_t ndim, const int64_t *shape,
                     const int64_t *stride) {
    *out = NULL;
    uint64_t numel = 0;
    int rc = check_shape(ndim, shape, &numel);
    if (rc) return rc;
    if (!data && numel > 0) return cart_fail(CART_E_ARG, "cart_tensor_wrap: data is NULL");
    cart_tensor *t = header_new();
    if (!t) return CART_E_NOMEM;
    t->data = data;
    t->ndim = ndim;
    for (int32_t i = 0; i < ndim; i++) t->shape[i] = shape[i];
    set_contiguous_strides(t);
    if (stride)
        for (int32_t i = 0; i < ndim; i++) t->stride[i] = stride[i];
    *out = t;
    return CART_OK;
}

void cart_tensor_free(cart_tensor *t) {
    if (!t) return;
    storage_release(t->storage);
    free(t);
}

int64_t cart_tensor_numel(const cart_tensor *t) {
    int64_t n = 1;
    for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int32_t cart_tensor_is_contiguous(const cart_tensor *t) {
    int64_t step = 1;
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != step) return 0;
        step *= t->shape[i];
    }
    return 1;
}

/* A new header sharing t's storage, to be edited into a view. */
static int view_of(cart_tensor **out, const cart_tensor *t) {
    cart_tensor *v = header_new();
    if (!v) return CART_E_NOMEM;
    *v = *t;
    storage_retain(v->storage);
    *out = v;
    return CART_OK;
}

static int check_dim(const cart_tensor *t, int32_t dim, const char *fn) {
    if (dim < 0 || dim >= t->ndim)
        return cart_fail(CART_E_ARG, "%s: dimension %d is outside 0..%d", fn, dim, t->ndim - 1);
    return CART_OK;
}

int cart_tensor_narrow(cart_tensor **out, const cart_tensor *t, int32_t dim, int64_t start,
                       int64_t length) {
    *out = NULL;
    int rc = check_dim(t, dim, "cart_tensor_narrow");
    if (rc) return rc;
    if (start < 0 || length < 0 || start > t->shape[dim] - length)
        return cart_fail(CART_E_ARG,
                         "cart_tensor_narrow: range [%lld, %lld) is outside dimension %d of size "
                         "%lld",
                         (long long)start, (long long)(start + length), dim,
                         (long long)t->shape[dim]);
    rc = view_of(out, t);
    if (rc) return rc;
    (*out)->data = t->data + start * t->stride[dim];
    (*out)->shape[dim] = length;
    return CART_OK;
}

int cart_tensor_select(cart_tensor **out, const cart_tensor *t, int32_t dim, int64_t index) {
    *out = NULL;
    int rc = check_dim(t, dim, "cart_tensor_select");
    if (rc) return rc;
    if (index < 0 || index >= t->shape[dim])
        return cart_fail(CART_E_ARG, "cart_tensor_select: index %lld is outside dimension %d of "
                         "size %lld", (long long)index, dim, (long long)t->shape[dim]);
    rc = view_of(out, t);
    if (rc) return rc;
    cart_tensor *v = *out;
    v->data = t->data + index * t->stride[dim];
    for (int32_t i = dim; i < 3; i++) {
        v->shape[i] = v->shape[i + 1];
        v->stride[i] = v->stride[i + 1];
    }
    v->shape[3] = 1;
    v->stride[3] = 1;
    v->ndim--;
    return CART_OK;
}

int cart_tensor_transpose(cart_tensor **out, const cart_tensor *t, int32_t d0, int32_t d1) {
    *out = NULL;
    int rc = check_dim(t, d0, "cart_tensor_transpose");
    if (!rc) rc = check_dim(t, d1, "cart_tensor_transpose");
    if (rc) return rc;
    rc = view_of(out, t);
    if (rc) return rc;
    cart_tensor *v = *out;
    int64_t s = v->shape[d0], st = v->stride[d0];
    v->shape[d0] = v->shape[d1];
    v->stride[d0] = v->stride[d1];
    v->shape[d1] = s;
    v->stride[d1] = st;
    return CART_OK;
}

int cart_tensor_reshape(cart_tensor **out, const cart_tensor *t, int32_t ndim,
                        const int64_t *shape) {
    *out = NULL;
    uint64_t numel = 0;
    int rc = check_shape(ndim, shape, &numel);
    if (rc) return rc;
    if ((int64_t)numel != cart_tensor_numel(t))
        return cart_fail(CART_E_ARG, "cart_tensor_reshape: %llu elements cannot view %lld",
                         (unsigned long long)numel, (long long)cart_tensor_numel(t));
    if (!cart_tensor_is_contiguous(t))
        return cart_fail(CART_E_ARG, "cart_tensor_reshape: the tensor is not contiguous "
                                     "(clone it first)");
    rc = view_of(out, t);
    if (rc) return rc;
    cart_tensor *v = *out;
    v->ndim = ndim;
    for (int32_t i = 0; i < ndim; i++) v->shape[i] = shape[i];
    set_contiguous_strides(v);
    return CART_OK;
}

/* dst = src element by element over a 4-D shape (unused dims are 1). */
static void copy_strided(float *dst, const int64_t *dstride, const float *src,
                         const int64_t *sstride, const int64_t *shape) {
    for (int64_t i0 = 0; i0 < shape[0]; i0++)
        for (int64_t i1 = 0; i1 < shape[1]; i1++)
            for (int64_t i2 = 0; i2 < shape[2]; i2++) {
                float *d = dst + i0 * dstride[0] + i1 * dstride[1] + i2 * dstride[2];
                const float *s = src + i0 * sstride[0] + i1 * sstride[1] + i2 * sstride[2];
                if (dstride[3] == 1 && sstride[3] == 1) memmove(d, s, (size_t)shape[3] * 4);
                else
                    for (int64_t i3 = 0; i3 < shape[3]; i3++) d[i3 * dstride[3]] = s[i3 * sstride[3]];
            }
}

int cart_tensor_copy(cart_tensor *dst, const cart_tensor *src) {
    if (dst->ndim != src->ndim)
        return cart_fail(CART_E_ARG, "cart_tensor_copy: ndim %d vs %d", dst->ndim, src->ndim);
    for (int32_t i = 0; i < dst->ndim; i++)
        if (dst->shape[i] != src->shape[i])
            return cart_fail(CART_E_ARG, "cart_tensor_copy: dimension %d has size %lld vs %lld", i,
                             (long long)dst->shape[i], (long long)src->shape[i]);
    copy_strided(dst->data, dst->stride, src->data, src->stride, dst->shape);
    return CART_OK;
}

int cart_tensor_clone(cart_tensor **out, const cart_tensor *t) {
    int rc = cart_tensor_new(out, t->ndim, t->shape);
    if (rc) return rc;
    return cart_tensor_copy(*out, t);
}

void cart_tensor_fill(cart_tensor *t, float value) {
    for (int64_t i0 = 0; i0 < t->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < t->shape[1]; i1++)
            for (int64_t i2 = 0; i2 < t->shape[2]; i2++) {
                float *d = t->data + i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2];
                for (int64_t i3 = 0; i3 < t->shape[3]; i3++) d[i3 * t->stride[3]] = value;
            }
}

static int element_offset(int64_t *off, const cart_tensor *t, const int64_t *index,
                          const char *fn) {
    int64_t o = 0;
    for (int32_t i = 0; i < t->ndim; i++) {
        if (index[i] < 0 || index[i] >= t->shape[i])
            return cart_fail(CART_E_ARG, "%s: index %lld is outside dimension %d of size %lld",
                             fn, (long long)index[i], i, (long long)t->shape[i]);
        o += index[i] * t->stride[i];
    }
    *off = o;
    return CART_OK;
}

int cart_tensor_get(float *out, const cart_tensor *t, const int64_t *index) {
    int64_t off = 0;
    int rc = element_offset(&off, t, index, "cart_tensor_get");
    if (rc) return rc;
    *out = t->data[off];
    return CART_OK;
}

int cart_tensor_set(cart_tensor *t, const int64_t *index, float value) {
    int64_t off = 0;
    int rc = element_offset(&off, t, index, "cart_tensor_set");
    if (rc) return rc;
    t->data[off] = value;
    return CART_OK;
}

int cart_tensor_load(cart_tensor *t, int32_t dtype, const void *src, int64_t n) {
    if (!cart_tensor_is_contiguous(t))
        return cart_fail(CART_E_ARG, "cart_tensor_load: the destination is not contiguous");
    if (cart_tensor_numel(t) != n)
        return cart_fail(CART_E_ARG, "cart_tensor_load: %lld source elements for a tensor of %lld",
                         (long long)n, (long long)cart_tensor_numel(t));
    return cart_to_f32(t->data, dtype, src, n);
}

/* How a 2-D operand maps onto the BLAS: a pointer, a transpose flag and a
 * pitch, or 0 when neither stride is a unit one. */
static int as_blas_operand(const cart_tensor *t, int32_t *trans, int64_t *ld) {
    int64_t rows = t->shape[0], cols = t->shape[1];
    int64_t min_cols = cols > 1 ? cols : 1, min_rows = rows > 1 ? rows : 1;
    if (cols <= 1 || t->stride[1] == 1) {
        *trans = 0;
        *ld = rows <= 1 ? min_cols : t->stride[0];
        return *ld >= min_cols;
    }
    if (rows <= 1 || t->stride[0] == 1) {
        *trans = 1; /* stored as [cols, rows] with pitch stride[1] */
        *ld = t->stride[1];
        return *ld >= min_rows;
    }
    return 0;
}

int cart_tensor_matmul(cart_tensor *c, const cart_tensor *a, const cart_tensor *b, float alpha,
                       float beta) {
    if (a->ndim != 2 || b->ndim != 2 || c->ndim != 2)
        return cart_fail(CART_E_ARG, "cart_tensor_matmul: needs 2-D tensors (got %d, %d -> %d)",
                         a->ndim, b->ndim, c->ndim);
    int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
    if (b->shape[0] != k || c->shape[0] != m || c->shape[1] != n)
        return cart_fail(CART_E_ARG,
                         "cart_tensor_matmul: shapes [%lld, %lld] @ [%lld, %lld] -> [%lld, %lld] "
                         "do not fit",
                         (long long)m, (long long)k, (long long)b->shape[0], (long long)n,
                         (long long)c->shape[0], (long long)c->shape[1]);
    if (c->stride[1] != 1 && n > 1)
        return cart_fail(CART_E_ARG, "cart_tensor_matmul: the output needs unit column stride");
    int64_t ldc = m > 1 ? c->stride[0] : (n > 0 ? n : 1);
    if (ldc < n) ldc = n;

    cart_tensor *ac = NULL, *bc = NULL;
    int32_t ta = 0, tb = 0;
    int64_t lda = 0, ldb = 0;
    int rc = CART_OK;
    if (!as_blas_operand(a, &ta, &lda)) {
        rc = cart_tensor_clone(&ac, a);
        if (rc) return rc;
        a = ac;
        as_blas_operand(a, &ta, &lda);
    }
    if (!as_blas_operand(b, &tb, &ldb)) {
        rc = cart_tensor_clone(&bc, b);
        if (rc) {
            cart_tensor_free(ac);
            return rc;
        }
        b = bc;
        as_blas_operand(b, &tb, &ldb);
    }
    rc = cart_gemm(c->data, ldc, a->data, lda, ta, b->data, ldb, tb, m, n, k, alpha, beta);
    cart_tensor_free(ac);
    cart_tensor_free(bc);
    return rc;
}

int cart_tensor_max_abs_diff(double *out, const cart_tensor *a, const cart_tensor *b) {
    if (a->ndim != b->ndim)
        return cart_fail(CART_E_ARG, "cart_tensor_max_abs_diff: ndim %d vs %d", a->ndim, b->ndim);
    for (int32_t i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return cart_fail(CART_E_ARG, "cart_tensor_max_abs_diff: dimension %d: %lld vs %lld",
                             i, (long long)a->shape[i], (long long)b->shape[i]);
    double worst = 0.0;
    for (int64_t i0 = 0; i0 < a->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < a->shape[1]; i1++)
            for (int64_t i2 = 0; i2 < a->shape[2]; i2++)
                for (int64_t i3 = 0; i3 < a->shape[3]; i3++) {
                    double x = a->data[i0 * a->stride[0] + i1 * a->stride[1] +
                                       i2 * a->stride[2] + i3 * a->stride[3]];
                    double y = b->data[i0 * b->stride[0] + i1 * b->stride[1] +
                                       i2 * b->stride[2] + i3 * b->stride[3]];
                    double d = fabs(x - y);
                    if (d > worst || d != d) worst = d != d ? INFINITY : d;
                }
    *out = worst;
    return CART_OK;
}
