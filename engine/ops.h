/*
 * ops.h - the transformer's elementwise and attention kernels, shared by the
 * inference forward (model.c) and the training passes. Internal: not part of
 * the public API (hidden visibility, never read by the FFI).
 *
 * Kernels are <op>_forward / <op>_backward, outputs first, inputs const,
 * dims last; backward kernels accumulate into their gradient outputs (+=).
 */
#ifndef CART_OPS_H
#define CART_OPS_H

#include <stdint.h>

#pragma GCC visibility push(hidden)

/* y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w, for r in [0, rows).
 * The sum of squares is taken in double, as GGML does. y may equal x. w may
 * be NULL: a norm without weight (gemma4's value norm and router input). */
void rmsnorm_forward(float *y, const float *x, const float *w, int64_t rows, int64_t dim,
                     float eps);

/* The RoPE angle table for one position: cs[2i] = cos(theta_i), cs[2i+1] =
 * sin(theta_i) for pair i in [0, n_rot/2), theta_i built as GGML builds it:
 * theta_0 = pos, theta_{i+1} = theta_i * base^(-2/n_rot), all in f32. */
void rope_angles(float *cs, int64_t pos, int32_t n_rot, float base);

/* rope_angles with GGML's frequency factors: theta_i / ff[i] (ff NULL:
 * factors of 1, the same table as rope_angles). gemma4's full-attention
 * layers give their unrotated pairs a factor of 1e30 (angle ~0). */
void rope_angles_ff(float *cs, int64_t pos, int32_t n_rot, float base, const float *ff);

/* Rotates the first n_rot dims of each of n_heads heads of x ([n_heads,
 * head_dim], in place) by the angles in cs. neox: pairs (i, i + n_rot/2);
 * otherwise pairs (2i, 2i + 1). */
void rope_forward(float *x, const float *cs, int32_t n_heads, int32_t head_dim, int32_t n_rot,
                  int32_t neox);

/* The inverse rotation, for gradients: dx = R^T dy, in place on dy. */
void rope_backward(float *dy, const float *cs, int32_t n_heads, int32_t head_dim, int32_t n_rot,
                   int32_t neox);

/* One token's queries and keys made ready for attention: q = RoPE(qk-norm
 * (q_src)), k likewise, where q is [n_head, head_dim] and k [n_head_kv,
 * head_dim]. q_norm/k_norm NULL: no norm (llama). q may equal q_src (in
 * place); q_rstd/k_rstd receive 1/rms per head when not NULL (training). */
void qk_prepare_forward(float *q, float *k, float *q_rstd, float *k_rstd, const float *q_src,
                        const float *k_src, const float *q_norm, const float *k_norm,
                        const float *cs, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                        int32_t n_rot, int32_t neox, float eps);

/* y[i] = e^x[i] for i < n (y may be x): the active level's kernel, the bits
 * of glibc's expf (engine/kernels/expf.h) on every level and machine. Every
 * exponential of the float kernels below is this one. */
void cart_expf_n(float *y, const float *x, int64_t n);

/* y[i] = e^x[i] in double for i < n (y may be x): the active level's kernel,
 * the bits of the C library's exp on every level (engine/kernels/exp.h). */
void cart_exp_n(double *y, const double *x, int64_t n);

/* gate[i] = silu(gate[i]) * up[i] over n values; silu(x) = x / (1 + exp(-x)). */
void swiglu_forward(float *gate, const float *up, int64_t n);

/* GELU as GGML's CPU backend computes it for f32 (GGML_GELU_FP16): x <= -10
 * gives 0, x >= 10 gives x, and otherwise x is rounded to f16 and looked up
 * in a table of the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x +
 * 0.044715 x^3))) rounded to f16. The inference forward of gemma4 uses it,
 * so that it matches llama.cpp to the last bit of the activation.
 *   geglu_forward_table: gate[i] = gelu(gate[i]) * up[i] over n values
 *   gelu_mul_forward_table: x[i] = gelu(x[i]) * c[i] */
void geglu_forward_table(float *gate, const float *up, int64_t n);

/* The exact tanh-approximation GELU in f32 and its derivative, for the
 * trainer (a lookup table has no useful derivative): gelu_exact(x) =
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
float gelu_exact(float x);
float gelu_exact_grad(float x);

/* h[i] = gelu_exact(gate[i]) * up[i] over n values (the trainer's GEGLU). */
void geglu_forward(float *h, const float *gate, const float *up, int64_t n);

/* The backward of geglu_forward: dgate += dh * up * gelu'(gate), dup += dh *
 * gelu(gate); dup may be NULL (a constant second factor). */
void geglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                    int64_t n);

/* An MoE router's choice for one token, as llama.cpp's build_moe_ffn makes
 * it with softmax gating: probs = softmax(logits) over n_expert (f32, the sum
 * in double), the k largest (ties to the lower id) into sel[k] best first,
 * their probabilities renormalized into w[k] (the sum clamped below at 2^-14
 * as GGML does). logits is overwritten with the probabilities. */
void moe_route(int32_t *sel, float *w, float *logits, int32_t n_expert, int32_t k);

/* Final-logit soft-capping, as GGML composes it: x = tanh(x * (1 / cap)) *
 * cap over n values (cap > 0). */
void softcap_forward(float *x, int64_t n, float cap);

/* Its backward given the capped values y: dx = dy * (1 - (y / cap)^2), in
 * place on dy. */
void softcap_backward(float *dy, const float *y, int64_t n, float cap);

/* The most query tokens one attention_forward call takes. */
enum { CART_ATTN_MAX_QUERIES = 32 };

/* Causal attention of nq (<= CART_ATTN_MAX_QUERIES) consecutive tokens of
 * one stream over its cache rows.
 *   out [nq][q_stride]  row j holds query token j's n_head heads of head_dim
 *   q   [nq][q_stride]  the queries (already normed and rotated), same layout
 *   k   cache rows of `dtype` (CART_F16 or CART_F32), `stride` elements
 *       apart; each row holds n_head_kv heads of head_dim values from the
 *       pointer on (pass a pointer offset by g * head_dim to start at kv
 *       head g)
 *   v   the same for values
 * Query j sees rows 0 .. n_ctx0 + j - 1, or with window > 0 only the last
 * `window` of them (rows n_ctx0 + j - window ..: a sliding-window layer,
 * whose query at position P sees the keys at P - window + 1 .. P). Tiles
 * stay aligned at multiples of 64 rows whatever the window, so a query's
 * result does not depend on the block it runs in. Query head h reads kv head
 * h / (n_head / n_head_kv); head_dim <= 512 and n_head / n_head_kv <= 16.
 * scale multiplies the scores. The rows are read in tiles of 64, converted
 * once per tile for all the queries (one query over an f16 cache reads them
 * where they are, each tile's rows whole for all the call's kv heads, so
 * pass a block's heads in one call), with a running maximum per query: no
 * buffer of size n_ctx, and a query's result is the same bits whatever nq
 * and its place in the block are. */
void attention_forward(float *out, const float *q, int64_t q_stride, int32_t nq, const void *k,
                       const void *v, int32_t dtype, int64_t n_ctx0, int64_t window, int64_t stride,
                       int32_t n_head, int32_t n_head_kv, int32_t head_dim, float scale);

/* rmsnorm_forward that also keeps 1/rms of each row in rstd[rows] (rstd may
 * be NULL). */
void rmsnorm_forward_keep(float *y, float *rstd, const float *x, const float *w, int64_t rows,
                          int64_t dim, float eps);

/* dx[r, :] += the gradient w.r.t. x of y = x * rstd * w, given dy; x and
 * rstd as the forward saw and kept them; w NULL for a norm without weight. */
void rmsnorm_backward(float *dx, const float *dy, const float *x, const float *rstd,
                      const float *w, int64_t rows, int64_t dim);

/* The backward of swiglu_forward (h = silu(gate) * up): dgate += dh *
 * d h/d gate, dup += dh * silu(gate), over n values. */
void swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                     int64_t n);

/* One query head attending over two blocks of f32 rows: block a (the
 * cartridge prefix, na rows) then block b (the token's own segment up to and
 * including itself, nb rows); rows of a block are `stride` floats apart from
 * its pointer (pass pointers already offset to the head's kv head). Writes
 * out[head_dim] and the log-sum-exp of the scaled scores to *lse. Either
 * block may be empty (n = 0, pointers unused). */
void attention_head_forward(float *out, float *lse, const float *q, const float *ka,
                            const float *va, int64_t na, int64_t stride_a, const float *kb,
                            const float *vb, int64_t nb, int64_t stride_b, int32_t head_dim,
                            float scale);

/* Its backward, given dout and the forward's out and lse: dq += ..., and for
 * the rows: dkb/dvb += ... for every row of block b, dka/dva += ... for the
 * rows of block a from skip_a on (the frozen rows get nothing; dka/dva may
 * be NULL to skip block a's gradients altogether). Gradient rows use the
 * same strides as the rows. */
void attention_head_backward(float *dq, float *dka, float *dva, int64_t skip_a, float *dkb,
                             float *dvb, const float *dout, const float *out, float lse,
                             const float *q, const float *ka, const float *va, int64_t na,
                             int64_t stride_a, const float *kb, const float *vb, int64_t nb,
                             int64_t stride_b, int32_t head_dim, float scale);

/* One query head against nt (<= 64) rows of a tile (k, v: rows `stride`
 * apart), given the forward's log-sum-exp and delta = dout . out:
 * p_j = exp(q.k_j * scale - lse), ds_j = p_j (dout.v_j - delta) scale;
 * dq += sum_j ds_j k_j; for rows j >= skip, dkt[j] += ds_j q and
 * dvt[j] += p_j dout, with dkt/dvt contiguous [nt][head_dim] tile buffers
 * (NULL: no row gradients). The scores use the same kernels as the forward. */
void attention_tile_backward(float *dq, float *dkt, float *dvt, int64_t skip, const float *dout,
                             float delta, float lse, const float *q, const float *k,
                             const float *v, int64_t stride, int64_t nt, int32_t head_dim,
                             float scale);

enum { CART_ATTN_MAX_MQ = 8 }; /* most query heads of one multi-query call */

/* attention_head_forward for nq query heads over the same rows (the same
 * bits for each): the same prefix block, and segment rows from the same
 * first row, query a seeing nb[a] of them; the rows are read once for all
 * of them, tile by tile. */
void attention_heads_forward(float *const *out, float *const *lse, const float *const *q, int32_t nq,
                             const float *ka, const float *va, int64_t na, int64_t stride_a,
                             const float *kb, const float *vb, const int64_t *nb, int64_t stride_b,
                             int32_t head_dim, float scale);

/* Up to CART_ATTN_MAX_MQ query heads against the same tile, in order: for
 * each a < nq what attention_tile_backward does with dq[a], dout[a],
 * delta[a], lse[a], q[a] over the tile's first nt[a] rows (the same bits,
 * the rows added to in query order), the tile's rows read once for all of
 * them: a causal segment's diagonal tile, whose queries each see one row
 * more than the one before, goes as one call. */
void attention_tiles_backward(float *const *dq, float *dkt, float *dvt, int64_t skip,
                              const float *const *dout, const float *delta, const float *lse,
                              const float *const *q, const float *k, const float *v, int64_t stride,
                              const int64_t *nt, int32_t nq, int32_t head_dim, float scale);

/* dout . out, as attention_head_backward computes it. */
float attention_delta(const float *dout, const float *out, int32_t head_dim);

#pragma GCC visibility pop

#endif
