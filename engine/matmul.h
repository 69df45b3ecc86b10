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
 * Numerics follow GGML's CPU backend, so that results match llama.cpp's:
 *   f32  weights: f32 products, f32 accumulation.
 *   f16  weights: each activation is rounded to f16 first (GGML's vec_dot_type
 *                 for F16), products and accumulation in f32.
 *   bf16 weights: activations rounded to bf16 first, f32 accumulation.
 *   q4_0 q4_1 q5_0 q5_1 q8_0 iq4_nl q2_K q3_K q4_K q5_K q6_K iq4_xs: each
 *                 activation row is quantized as GGML quantizes it for that
 *                 weight type (q8_1 for q4_1 and q5_1, q8_0 for the other
 *                 blocks of 32, q8_K for the blocks of 256), then every
 *                 output is a sum over the row's blocks of exact integer dot
 *                 products times the blocks' scales. Rounding is to nearest,
 *                 ties to even, on every level (GGML's x86 rule; its plain C
 *                 q8_0 rounds ties away). engine/kernels/qdot.h writes out
 *                 every step: it is the contract, and a row's output depends
 *                 on nothing but that row, whatever n, the path, the thread
 *                 count, the level or the layout (GGUF rows or repacked).
 *   other block types (q8_1, q8_K as weights): dequantized exactly
 *                 (cart_to_f32) and multiplied by the f32 activations.
 * cart_matmul_forward_exact is the forward without activation quantization:
 * every block type dequantized exactly and multiplied by f32 activations.
 * The training passes use it (train.c, params.c) with the backward, which
 * multiplies f32 dy by the exactly dequantized weights: a quantized
 * activation is a step function of the input, whose derivative is zero
 * almost everywhere, so the gradient is taken of the smooth product the
 * quantization approximates (what a straight-through estimator does), and
 * finite differences of cart_matmul_forward_exact check it. Inference
 * (cart_model_forward and what is built on it) uses cart_matmul_forward.
 *
 * Work is split over `pool` (NULL: the default pool). Results do not depend
 * on the thread count, nor on the ISA level (cpu.h): every level computes
 * the same arithmetic.
 *
 * Batch invariance (every level): for the integer block products every
 * path gives the same bits (each row's sums are exact, its scale steps
 * fixed). For f32, f16 and bf16 weights, with n <= 16 the memory-bound GEMV
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
    const void *packed; /* NULL, or the matrix repacked by cart_weight_repack (owned by its caller) */
} cart_weight;

/* Fills *w for `data` holding rows x cols elements of `dtype`. CART_E_ARG when
 * cols is not a whole number of blocks or a dimension is negative;
 * CART_E_UNSUPPORTED when the dtype cannot be dequantized. */
int cart_weight_init(cart_weight *w, int32_t dtype, const void *data, int64_t rows, int64_t cols);

/* The weight's rows repacked for the integer products (kernels/qdot.h: rows
 * in groups of 16, each group's blocks interleaved so that one 64-byte load
 * holds 4 elements of 16 rows, scales regrouped beside them); w->packed
 * points at the copy, which cart_weight_free_packed frees. Products give the
 * same bits with it as without; reading contiguous groups is what makes
 * them fast. The GGUF rows (w->data) stay what the exact forward, the
 * backward and writers read. For a dtype the integer products do not cover
 * it does nothing (packed stays NULL). *bytes (may be NULL) receives the
 * copy's size. CART_E_NOMEM when it cannot be allocated; CART_E_ARG for a
 * weight cart_weight_init would refuse. */
int cart_weight_repack(cart_weight *w, uint64_t *bytes, cart_pool *pool);
void cart_weight_free_packed(cart_weight *w);

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

/* 1 when a weight of this dtype gives every token the same bits on either
 * path (the integer block products), so callers need not keep a batch's
 * streams on their own paths. */
int32_t cart_matmul_path_invariant(int32_t dtype);

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

/* cart_matmul_forward with f32 activations for every dtype: block types
 * dequantized exactly (cart_to_f32) and multiplied in f32 on the GEMV (n <=
 * 16) or GEMM path, as the "Batch invariance" paragraph says of plain
 * types. The training forward (see the numerics above). */
int cart_matmul_forward_exact(float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w,
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
