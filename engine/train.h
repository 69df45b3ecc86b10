/*
 * train.h - the distillation loss of packed segments behind a cartridge
 * (cart.h) and its backward pass through a frozen model into the
 * cartridge's rows.
 *
 * Several sequences can be packed into one pass as segments: each restarts
 * at position p and sees the prefix plus its own earlier tokens only.
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
#include "cart.h"
#include "model.h"
#include "params.h"
#include "targets.h"

#ifdef __cplusplus
extern "C" {
#endif


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
