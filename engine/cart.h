/*
 * cart.h - the cartridge: trainable K/V prefix rows for every layer of a
 * model, and its artifact (a safetensors file).
 *
 * A cartridge holds, for every layer, K and V rows of shape [p, kv_heads,
 * head_dim] in f32, in exactly the KV cache's space: keys after the q/k norm
 * and after RoPE at positions 0..p-1 (never rotated again), values as
 * projected (gemma4: after their RMS norm). kv_heads and head_dim are each
 * layer's own (gemma4's sliding and full layers differ). The first `frozen`
 * rows (the attention sink) are constants; the other p - frozen rows of
 * every layer are the trainable parameters. train.h trains them.
 *
 * Behind a cartridge, real tokens sit at positions p, p+1, ...: query i sees
 * all p rows and real tokens 0..i -- except on a sliding-window layer, whose
 * query at position P sees only positions P - window + 1 .. P, prefix rows
 * included: exactly what a real prefill of the p corpus tokens would let it
 * see, so that a captured cartridge stays equivalent to that prefill.
 */
#ifndef CART_CART_H
#define CART_CART_H

#include <stdint.h>
#include "adam.h"
#include "kv.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif


typedef struct cart_cartridge cart_cartridge;

/* A zero cartridge of p rows per layer, the first `frozen` of them constant
 * (0 <= frozen < p). Free with cart_cartridge_free. */
int cart_cartridge_new(cart_cartridge **out, int32_t n_layer, int32_t kv_heads, int32_t head_dim,
                       int64_t p, int64_t frozen);
void cart_cartridge_free(cart_cartridge *c);

/* The same with each layer's own geometry: kv_heads[n_layer], head_dim[n_layer]. */
int cart_cartridge_new_layers(cart_cartridge **out, int32_t n_layer, const int32_t *kv_heads,
                              const int32_t *head_dim, int64_t p, int64_t frozen);

/* A cartridge shaped for m, layer by layer. */
int cart_cartridge_new_for(cart_cartridge **out, const cart_model *m, int64_t p, int64_t frozen);

int64_t cart_cartridge_p(const cart_cartridge *c);
int64_t cart_cartridge_frozen(const cart_cartridge *c);
int32_t cart_cartridge_n_layer(const cart_cartridge *c);
/* Layer 0's KV heads and head_dim (every layer's for a cartridge made by
 * cart_cartridge_new), and one layer's (0 for a layer out of range). */
int32_t cart_cartridge_kv_heads(const cart_cartridge *c);
int32_t cart_cartridge_head_dim(const cart_cartridge *c);
int32_t cart_cartridge_layer_heads(const cart_cartridge *c, int32_t layer);
int32_t cart_cartridge_layer_head_dim(const cart_cartridge *c, int32_t layer);

/* One layer's K (which = 0) or V (which = 1) rows, [p, kv_heads, head_dim]
 * f32, sink rows first. Borrowed and writable; NULL for a bad argument. */
float *cart_cartridge_rows(cart_cartridge *c, int32_t layer, int32_t which);

/* The gradient of the same rows, same layout; the backward adds into it and
 * leaves rows below `frozen` at zero. */
float *cart_cartridge_grad(cart_cartridge *c, int32_t layer, int32_t which);

/* Sets every gradient to zero. */
void cart_cartridge_zero_grad(cart_cartridge *c);

/* The largest magnitude a row value may have: the largest finite f16, what
 * an f16 KV cache can hold (a larger key or value overflows attention). */
#define CART_CARTRIDGE_MAX_ABS 65504.0f

/* Checks that every row value (grads = 0) is finite and within
 * +-CART_CARTRIDGE_MAX_ABS, or every gradient value (grads = 1) finite.
 * CART_OK, or CART_E_FORMAT naming the first value that is not as the
 * artifact's tensor names it ("layers.3.v" or "layers.3.v_sink"), its row
 * and the value. */
int cart_cartridge_check_finite(const cart_cartridge *c, int32_t grads);

/* Runs m over tokens[0..p) at positions 0..p-1 (the inference forward,
 * through a cache of kv_dtype: CART_F32, or CART_F16 to reproduce exactly
 * what a serving cache of f16 would hold) and copies every layer's K/V rows
 * into c: the model's own KV cache of those tokens. n must equal p. */
int cart_cartridge_capture(cart_cartridge *c, cart_model *m, const int32_t *tokens, int64_t n,
                           int32_t kv_dtype);

/* Fills every row (sinks included) with N(0, std^2) from rng.h's generator
 * seeded with `seed`, layer by layer, K then V. */
void cart_cartridge_init_random(cart_cartridge *c, uint64_t seed, float std);

/* Writes the p rows of every layer into kv at positions len..len+p-1
 * (converted to the cache's dtype) and advances len by p: into an empty
 * cache to serve, or after another cartridge's rows to compose them. The
 * cache's geometry must match and have room. */
int cart_cartridge_append_to_kv(const cart_cartridge *c, cart_kv *kv);

/* Composition: several cartridges of one geometry side by side in a cache.
 * A composed cartridge holds, for every layer, parts[0]'s p_0 rows (its sinks
 * first), then parts[1]'s p_1 rows, and so on: P = sum of p_i rows, frozen =
 * parts[0]'s. Every part keeps the positions its rows were made at (keys
 * stay rotated for 0..p_i-1, or wherever they were captured); tokens behind
 * the composition sit at positions P, P+1, ... Writing a composed cartridge
 * into a cache is the same as appending its parts in order.
 *
 * cart_cartridge_compose makes a new composed cartridge (rows copied, zero
 * gradient); the parts must share n_layer, kv_heads and head_dim (else
 * CART_E_ARG naming part i's geometry and part 0's). Free with
 * cart_cartridge_free. */
int cart_cartridge_compose(cart_cartridge **out, const cart_cartridge *const *parts, int32_t n_parts);

/* Training through a composition: adds the composed cartridge's gradient of
 * part i's rows (rows P_i..P_i+p_i-1, P_i = p_0 + ... + p_{i-1}) into part
 * i's gradient, except each part's own frozen rows, whose gradient stays as
 * it was. The parts must be the ones composed (same geometries and p in
 * order, summing to the composed p). */
int cart_cartridge_compose_grad(const cart_cartridge *composed, cart_cartridge *const *parts,
                                int32_t n_parts);

/* Copies n rows of every layer (K and V) from src rows src_row.. into dst
 * rows dst_row..; the two must share the geometry and the ranges lie within
 * each. Gradients are untouched. (Splitting a captured cartridge into parts,
 * as the composed equivalence gate does.) */
int cart_cartridge_copy_rows(cart_cartridge *dst, int64_t dst_row, const cart_cartridge *src,
                             int64_t src_row, int64_t n);

/* Adam over the trainable rows: cart_adam_size(a) must equal
 * cart_cartridge_trainable_count(c). Runs one optimizer step with c's
 * gradients (layer by layer, K then V, rows frozen..p-1). */
int64_t cart_cartridge_trainable_count(const cart_cartridge *c);
int cart_cartridge_adam_step(cart_cartridge *c, cart_adam *a);

/* The gradient of the trainable rows as one vector of
 * cart_cartridge_trainable_count(c) floats, in the optimizer's order (layer
 * by layer, K then V, rows frozen..p-1): copied out into dst, or in from
 * src (the frozen rows' gradient stays zero). For summing the gradients of
 * several passes, or of several processes (dist.h). */
void cart_cartridge_grad_export(const cart_cartridge *c, float *dst);
void cart_cartridge_grad_import(cart_cartridge *c, const float *src);

#ifdef __cplusplus
}
#endif

#endif
