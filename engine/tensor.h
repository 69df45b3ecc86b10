/*
 * tensor.h - f32 compute tensors: up to 4 dimensions, row-major, strided views.
 *
 * A cart_tensor is a small header (shape, strides, data pointer) over a
 * reference-counted storage block. Views (narrow, select, transpose,
 * reshape) share the storage of their source and keep it alive; freeing the
 * source first is fine. shape[0] is the outermost dimension; strides are in
 * elements. A 0-D tensor is a scalar with one element.
 *
 * Handles come from cart_tensor_new / cart_tensor_wrap / the view functions
 * and are released with cart_tensor_free (NULL is accepted).
 */
#ifndef CART_TENSOR_H
#define CART_TENSOR_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_storage cart_storage;

typedef struct cart_tensor {
    float *data;          /* element [0][0][0][0] of this view */
    int64_t shape[4];     /* sizes, outermost first; entries >= ndim are 1 */
    int64_t stride[4];    /* element steps per dimension; entries >= ndim are 1 */
    int32_t ndim;         /* 0..4 */
    int32_t reserved;     /* keeps the struct free of padding; always 0 */
    cart_storage *storage; /* shared owner; NULL when the tensor wraps borrowed memory */
} cart_tensor;

/* A new zero-filled contiguous tensor of the given shape (ndim in 0..4, every
 * size >= 0). 64-byte aligned. Free with cart_tensor_free. */
int cart_tensor_new(cart_tensor **out, int32_t ndim, const int64_t *shape);

/* A tensor over memory the caller owns and keeps alive as long as the tensor
 * and its views live. stride may be NULL for contiguous row-major. */
int cart_tensor_wrap(cart_tensor **out, float *data, int32_t ndim, const int64_t *shape,
                     const int64_t *stride);

/* Releases the handle and its reference to the storage. NULL is a no-op. */
void cart_tensor_free(cart_tensor *t);

/* Number of elements (product of the shape; 1 for 0-D). */
int64_t cart_tensor_numel(const cart_tensor *t);

/* 1 when the elements are laid out row-major without gaps, else 0. */
int32_t cart_tensor_is_contiguous(const cart_tensor *t);

/* Views. Each returns a new handle sharing t's storage.
 * narrow: elements start..start+length-1 of dimension dim.
 * select: index `index` of dimension dim, dropping that dimension.
 * transpose: dimensions d0 and d1 swapped.
 * reshape: a new shape with the same element count; t must be contiguous. */
int cart_tensor_narrow(cart_tensor **out, const cart_tensor *t, int32_t dim, int64_t start,
                       int64_t length);
int cart_tensor_select(cart_tensor **out, const cart_tensor *t, int32_t dim, int64_t index);
int cart_tensor_transpose(cart_tensor **out, const cart_tensor *t, int32_t d0, int32_t d1);
int cart_tensor_reshape(cart_tensor **out, const cart_tensor *t, int32_t ndim,
                        const int64_t *shape);

/* A contiguous copy of t (a new handle with its own storage). */
int cart_tensor_clone(cart_tensor **out, const cart_tensor *t);

/* Element-wise dst = src for tensors of equal shape, any strides. The two
 * must not overlap unless they are the same view. */
int cart_tensor_copy(cart_tensor *dst, const cart_tensor *src);

/* Sets every element of t to value. */
void cart_tensor_fill(cart_tensor *t, float value);

/* Reads element (i0, i1, i2, i3) of t; unused trailing indices are ignored.
 * Out-of-range indices give CART_E_ARG. */
int cart_tensor_get(float *out, const cart_tensor *t, const int64_t *index);
int cart_tensor_set(cart_tensor *t, const int64_t *index, float value);

/* Converts n elements of `dtype` from src into t (which must be contiguous
 * and hold exactly n elements): f16, bf16, integers, block types. */
int cart_tensor_load(cart_tensor *t, int32_t dtype, const void *src, int64_t n);

/* c = alpha * a @ b + beta * c for 2-D tensors: a [m, k], b [k, n], c [m, n].
 * a and b may be transposed views (either stride may be the unit one); c must
 * have unit column stride. Runs on the BLAS (blas.h). */
int cart_tensor_matmul(cart_tensor *c, const cart_tensor *a, const cart_tensor *b, float alpha,
                       float beta);

/* Largest |a - b| over two tensors of equal shape, written to *out. */
int cart_tensor_max_abs_diff(double *out, const cart_tensor *a, const cart_tensor *b);

#ifdef __cplusplus
}
#endif

#endif
