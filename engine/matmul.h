/*
 * matmul.h - products with weight matrices in any storage dtype.
 *
 * A cart_weight is a borrowed view of a [rows, cols] matrix stored row-major
 * in one dtype (f32, f16, bf16 or a GGML block type), as GGUF stores linear
 * weights: ne[0] = cols (input features), ne[1] = rows (output features).
 *
 * Forward:  y[n, rows]  = x[n, cols] @ W^T
 * Backward: dx[n, cols] += dy[n, rows] @ W      (gradient w.r.t. the input;
 *           the weights are frozen, so there is no dW)
 *
 * Numerics follow GGML's CPU backend where it matters for matching llama.cpp:
 *   f32  weights: f32 products, f32 accumulation.
 *   f16  weights: each activation is rounded to f16 first (GGML's vec_dot_type
 *                 for F16), products and accumulation in f32.
 *   bf16 weights: activations rounded to bf16 first, f32 accumulation.
 *   block types:  weights dequantized exactly (cart_to_f32) and multiplied by
 *                 the f32 activations; GGML instead quantizes the activations
 *                 to q8_0 / q8_K, so results differ from llama.cpp by that
 *                 rounding, and agree with dequantize-then-f32 matmul.
 * The backward pass uses f32 activations (dy) for every dtype: training
 * gradients are not meant to mimic an inference engine's rounding.
 *
 * Work is split over `pool` (NULL: the default pool). Results do not depend
 * on the thread count, nor on the ISA level (cpu.h): every level computes
 * the same arithmetic.
 *
 * Batch invariance (every level): with n <= 16 the memory-bound GEMV
 * kernels run and each row's output is bitwise what it would be computed
 * alone; with n > 16 the GEMM kernels run and a row's output again does not
 * depend on n or on its place in the batch. Between the two regimes results
 * differ by f32 rounding (about 1e-6 relative). Speculative verification of
 * up to 8 drafted tokens (9 rows) therefore gives exactly the bits of
 * one-token decoding, and two prefills of more than 16 tokens agree bit for
 * bit, which the equivalence gate relies on. cart_matmul_forward_path fixes
 * the path whatever n is, so that a batch of independent streams can give
 * every stream exactly the bits it gets alone (cart_model_forward does).
 *
 * A CART_ISA this machine cannot run makes every call fail with its message
 * (cpu.h).
 */
#ifndef CART_MATMUL_H
#define CART_MATMUL_H

#include <stdint.h>
#include "pool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_weight {
    const void *data;   /* rows * row_bytes bytes, borrowed */
    int32_t dtype;      /* cart_dtype */
    int32_t reserved;   /* 0 */
    int64_t rows;       /* output features */
    int64_t cols;       /* input features; a multiple of the dtype's block size */
    uint64_t row_bytes; /* bytes per stored row */
} cart_weight;

/* Fills *w for `data` holding rows x cols elements of `dtype`. CART_E_ARG when
 * cols is not a whole number of blocks or a dimension is negative;
 * CART_E_UNSUPPORTED when the dtype cannot be dequantized. */
int cart_weight_init(cart_weight *w, int32_t dtype, const void *data, int64_t rows, int64_t cols);

/* y[i, :] = W @ x[i, :] for i in [0, n). ldx >= cols and ldy >= rows are the
 * row pitches of x and y in floats. y must not overlap x. */
int cart_matmul_forward(float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w,
                        int64_t n, cart_pool *pool);

/* Several products with one input: y[k][i, :] = W[k] @ x[i, :] for each of
 * `count` weights of the same cols (and the same dtype family), in one pass
 * over the thread pool when n is small enough for the GEMV kernels -- what a
 * decode step does for Q, K and V, or for the gate and up projections. The
 * results are bitwise those of cart_matmul_forward called once per weight. */
int cart_matmul_forward_many(int32_t count, float *const *y, const int64_t *ldy, const float *x,
                             int64_t ldx, const cart_weight *const *w, int64_t n,
                             cart_pool *pool);

/* The two forward paths (see "Batch invariance" above). */
typedef enum cart_mm_path {
    CART_MM_AUTO = 0, /* GEMV for n <= 16 tokens, else GEMM: what cart_matmul_forward does */
    CART_MM_GEMV = 1, /* GEMV kernels, in passes of at most 16 tokens */
    CART_MM_GEMM = 2  /* GEMM kernels for any n */
} cart_mm_path;

/* The path CART_MM_AUTO takes for n tokens. */
int32_t cart_matmul_path_for(int64_t n);

/* cart_matmul_forward and cart_matmul_forward_many on a fixed path. Every
 * token's output is then bitwise what the same path gives it alone, so a
 * batch of independent streams can run each stream's tokens on the path the
 * stream would take by itself (cart_model_forward does). CART_E_ARG for an
 * unknown path. */
int cart_matmul_forward_path(float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w,
                             int64_t n, int32_t path, cart_pool *pool);
int cart_matmul_forward_many_path(int32_t count, float *const *y, const int64_t *ldy, const float *x,
                                  int64_t ldx, const cart_weight *const *w, int64_t n, int32_t path,
                                  cart_pool *pool);

/* y[i, :] = W @ x[i, :] for a q8_0 weight the way GGML's CPU backend
 * computes it: each activation row is first quantized to q8_0 (per block of
 * 32: d = max|x| / 127 kept as f16, q = x * (127 / max|x|) rounded to
 * nearest even, as GGML's x86 quantizer does), then every output is the sum
 * over blocks, in block order in f32, of the block's integer dot product
 * times d_weight * d_x. It matches llama.cpp on q8_0 models to the rounding
 * of that sum. Every row's output depends on that row alone (the same bits
 * whatever n, the batch or the path). The gemma4 forward uses it for its
 * q8_0 weights; CART_E_ARG for a weight of another dtype. */
int cart_matmul_forward_q8(float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w,
                           int64_t n, cart_pool *pool);

/* dx[i, :] += W^T @ dy[i, :] for i in [0, n). ldx >= cols, ldy >= rows. */
int cart_matmul_backward(float *dx, int64_t ldx, const float *dy, int64_t ldy,
                         const cart_weight *w, int64_t n, cart_pool *pool);

/* A new f32 copy of w's matrix (rows x cols floats, 64-byte aligned) for
 * callers that trade memory for speed; free it with cart_weight_free_data.
 * *out then describes the copy. */
int cart_weight_widen(cart_weight *out, const cart_weight *w, cart_pool *pool);
void cart_weight_free_data(cart_weight *w);

#ifdef __cplusplus
}
#endif

#endif
