/*
 * train.h - the cartridge: trainable KV prefix rows, and the distillation
 * loss with its backward pass through a frozen model into those rows.
 *
 * A cartridge holds, for every layer, K and V rows of shape [p, kv_heads,
 * head_dim] in f32, in exactly the KV cache's space: keys after the q/k norm
 * and after RoPE at positions 0..p-1 (never rotated again), values as
 * projected (gemma4: after their RMS norm). kv_heads and head_dim are each
 * layer's own (gemma4's sliding and full layers differ). The first `frozen` rows (the attention sink) are constants; the
 * other p - frozen rows of every layer are the trainable parameters.
 *
 * Behind a cartridge, real tokens sit at positions p, p+1, ...: query i sees
 * all p rows and real tokens 0..i -- except on a sliding-window layer, whose
 * query at position P sees only positions P - window + 1 .. P, prefix rows
 * included: exactly what a real prefill of the p corpus tokens would let it
 * see, so that a captured cartridge stays equivalent to that prefill. Several sequences can be packed into one
 * pass as segments: each restarts at position p and sees the prefix plus its
 * own earlier tokens only.
 *
 * The trainer runs the frozen model (any weight dtype, quantized included)
 * forward over packed segments behind a cartridge, keeps what the backward
 * needs (or, with recompute, only each layer's input), and back-propagates
 * the loss to the cartridge rows: gradients flow through the weights (dX),
 * never into them (no dW).
 */
#ifndef CART_TRAIN_H
#define CART_TRAIN_H

#include <stdint.h>
#include "adam.h"
#include "kv.h"
#include "model.h"
#include "params.h"

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

/* Distillation targets: n sparse entries (position, token, teacher
 * log-probability). `position` is the index in the packed token sequence of
 * the token being predicted; the student's prediction is read from the row
 * before it, which must lie in the same segment. */
typedef struct cart_distill_targets {
    const int64_t *position;
    const int32_t *token;
    const float *logprob;
    int64_t n;
} cart_distill_targets;

/* From one row of teacher logits: the top-k entries of the untempered
 * log-softmax in descending order (ties to the lower id), kept up to and
 * including the entry at which the cumulative probability first reaches
 * `mass`; not renormalized. Writes ids[] and logprobs[] (room for k each)
 * and their count to *n_out. */
int cart_topk_targets(int32_t *ids, float *logprobs, int32_t *n_out, const float *logits,
                      int64_t n_vocab, int32_t k, float mass);

/* A growable list of distillation targets held in C: a decode appends each
 * scored row's entries as it goes, a packed step appends whole lists at an
 * offset, and the trainer reads it as cart_distill_targets without a copy. */
typedef struct cart_target_list cart_target_list;

int cart_target_list_new(cart_target_list **out);
void cart_target_list_free(cart_target_list *l);
int64_t cart_target_list_count(const cart_target_list *l);
/* Keeps the first n entries (n <= count). */
int cart_target_list_truncate(cart_target_list *l, int64_t n);
/* Appends the top-k entries of one row of logits (as cart_topk_targets), each
 * at `position`. Writes the number appended to *n_out when n_out is not NULL. */
int cart_target_list_append_topk(cart_target_list *l, int64_t position, const float *logits,
                                 int64_t n_vocab, int32_t k, float mass, int32_t *n_out);
/* Language-model targets: for i in [from, to) of tokens[0..n), the entry
 * (offset + i, tokens[i], logprob 0), the next token as a hard label. from
 * must be at least 1 (token 0 has no row before it). */
int cart_target_list_append_labels(cart_target_list *l, const int32_t *tokens, int64_t n, int64_t from,
                                   int64_t to, int64_t offset);
/* Appends one entry. */
int cart_target_list_push(cart_target_list *l, int64_t position, int32_t token, float logprob);
/* Appends every entry of src (which may be l itself) with its position
 * shifted by `offset`. */
int cart_target_list_append(cart_target_list *l, const cart_target_list *src, int64_t offset);
/* Entry i (0-based, below count): any output pointer may be NULL. */
int cart_target_list_get(const cart_target_list *l, int64_t i, int64_t *position, int32_t *token,
                         float *logprob);
/* The list as the trainer reads it; valid until the list next changes. */
void cart_target_list_view(const cart_target_list *l, cart_distill_targets *out);

typedef struct cart_trainer_options {
    int32_t recompute; /* 1: keep only each layer's input; recompute the layer in the backward */
    int32_t reserved;  /* 0 */
} cart_trainer_options;

typedef struct cart_trainer cart_trainer;

/* A trainer for m (borrowed; must outlive the trainer). opts may be NULL. */
int cart_trainer_new(cart_trainer **out, cart_model *m, const cart_trainer_options *opts);
void cart_trainer_free(cart_trainer *t);

/* Peak bytes of activations the last pass held (for the memory comparison of
 * the recompute option). */
uint64_t cart_trainer_peak_bytes(const cart_trainer *t);

/* Attaches a parameter set of t's model (params.h), or detaches with NULL.
 * While one is attached, every backward pass of cart_trainer_distill also
 * adds the loss's gradient with respect to the set's tensors into the set's
 * buffers, and the cartridge may be NULL (the weights alone train). */
int cart_trainer_set_params(cart_trainer *t, cart_params *p);

/* The distillation loss of packed segments behind cartridge c and,
 * when backward != 0, its gradient added into c's gradient buffers (and into
 * the attached parameter set's). c may be NULL while a parameter set is
 * attached: the segments then start at position 0. Targets with logprob 0
 * (one per position, the next token) make the loss the language-model
 * cross-entropy.
 *   tokens[0..n)  n_seg segments of seg_len[] tokens (sum = n), each at
 *                 positions p, p+1, ...
 *   targets       entries as above
 *   loss = loss_scale * R over entries e of
 *          -exp(logprob_e) * log_softmax(student logits at position_e - 1)[token_e]
 *   where R is the mean (mean != 0) or the sum.
 * The final norm, the output head and the log-softmax run only on the rows
 * the targets read, a few at a time: [tokens x vocab] logits are never
 * materialized. The loss goes to *loss_out (may be NULL). */
int cart_trainer_distill(cart_trainer *t, cart_cartridge *c, const int32_t *tokens, int64_t n,
                         const int64_t *seg_len, int32_t n_seg, const cart_distill_targets *targets,
                         int32_t mean, float loss_scale, int32_t backward, double *loss_out);

/* The same forward returning logits instead: row j of logits ([n_rows,
 * n_vocab]) is the output at packed token rows[j]. c may be NULL (no prefix:
 * segments start at position 0), which is the packed teacher pass. */
int cart_trainer_logits(cart_trainer *t, const cart_cartridge *c, const int32_t *tokens, int64_t n,
                        const int64_t *seg_len, int32_t n_seg, const int64_t *rows,
                        int64_t n_rows, float *logits);

#ifdef __cplusplus
}
#endif

#endif
