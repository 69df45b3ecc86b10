/*
 * params.h - a model's weights as trainable tensors: gradient buffers, the
 * optimizer step over them, and writing the trained model back to a GGUF.
 *
 * A parameter set covers the tensors of a model whose GGUF names match a
 * list of patterns ('*' matches any run of characters, e.g. "blk.*.attn_q.weight",
 * "*norm*"); no patterns means every tensor. The model must have been loaded
 * with widen_f32 (cart_model_options), so that each matrix is an f32 copy in
 * memory that training may change in place; inference through the same model
 * then sees the trained values. A tied output head has no tensor of its own:
 * its gradient goes into token_embd.weight.
 *
 * Attach a set to a trainer (cart_trainer_set_params, train.h) and every
 * backward pass adds the gradients of the loss with respect to the set's
 * tensors into their buffers, next to the cartridge rows' gradients when a
 * cartridge is trained too.
 */
#ifndef CART_PARAMS_H
#define CART_PARAMS_H

#include <stdint.h>

#include "adam.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_params cart_params;

/* The tensors of m (loaded with widen_f32, borrowed: it must outlive the
 * set) that match one of n_patterns patterns (all when n_patterns == 0).
 * Gradients start at zero. CART_E_STATE when m was not widened; CART_E_ARG
 * when a pattern matches no tensor (naming it). */
int cart_params_new(cart_params **out, cart_model *m, const char *const *patterns, int32_t n_patterns);
void cart_params_free(cart_params *p);

/* The tensors, in the model's GGUF order. */
int32_t cart_params_count(const cart_params *p);
const char *cart_params_name(const cart_params *p, int32_t i);
/* Elements of tensor i, its rank (1 or 2) and its shape, row-major [rows, cols]. */
int64_t cart_params_numel(const cart_params *p, int32_t i);
int32_t cart_params_rank(const cart_params *p, int32_t i);
int64_t cart_params_dim(const cart_params *p, int32_t i, int32_t axis);
/* The values (the model's own f32 memory) and the gradient, numel floats each. */
float *cart_params_data(cart_params *p, int32_t i);
float *cart_params_grad(cart_params *p, int32_t i);
/* Elements over all tensors. */
int64_t cart_params_total(const cart_params *p);

void cart_params_zero_grad(cart_params *p);
/* The L2 norm of all gradients together (summed in double, in tensor order). */
double cart_params_grad_norm(const cart_params *p);
void cart_params_scale_grad(cart_params *p, float s);
/* CART_E_FORMAT naming the tensor and element when a value (grads = 0) or a
 * gradient (grads = 1) is NaN or infinite. */
int cart_params_check_finite(const cart_params *p, int32_t grads);

/* One optimizer step over every tensor: a holds cart_params_total elements;
 * its weight decay applies to the matrices (rank 2) and not to the norm
 * weights (rank 1), as GPT-style training does. */
int cart_params_adam_step(cart_params *p, cart_adam *a);

/* Writes m (loaded with widen_f32) as a GGUF at path: the metadata of the
 * file it was loaded from (general.name replaced when name is not NULL) and
 * every tensor with its current values, in the file's order; matrices as
 * dtype (CART_F32 or CART_F16), norm weights as f32. Atomic: a temporary
 * file beside path, fsynced, then renamed. */
int cart_model_write_gguf(const cart_model *m, const char *path, int32_t dtype, const char *name);

#ifdef __cplusplus
}
#endif

#endif
