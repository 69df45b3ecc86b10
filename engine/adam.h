/*
 * adam.h - the Adam optimizer, with PyTorch's single-tensor semantics.
 *
 * State: the first and second moments m and v (f32, one per parameter) and
 * the step count t. One step, for every parameter p with gradient g:
 *     g  = g + weight_decay * p          (only when weight_decay != 0)
 *     m  = m + (1 - beta1) * (g - m)
 *     v  = beta2 * v + (1 - beta2) * g^2
 *     p  = p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
 * with t incremented first; bc1 = 1 - beta1^t, bc2 = 1 - beta2^t, lr / bc1
 * and sqrt(bc2) computed in double and rounded to float, as torch.optim.Adam
 * does with its Python-float scalars. With `decoupled` set the decay is
 * torch.optim.AdamW's instead: p = p * (1 - lr * weight_decay) first (the
 * factor computed in double, rounded to float), and g is left alone.
 *
 * An optimizer covers n parameters that the caller may keep in several
 * arrays: begin_step starts a step, then update is called once per array
 * with that array's offset in the optimizer's state.
 */
#ifndef CART_ADAM_H
#define CART_ADAM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_adam_params {
    float lr;           /* default 2e-3, the self-study CLI's */
    float beta1;        /* 0.9 */
    float beta2;        /* 0.999 */
    float eps;          /* 1e-8 */
    float weight_decay; /* 0 */
    int32_t decoupled;  /* 0: Adam's L2 term in the gradient; 1: AdamW's decay of the weights */
} cart_adam_params;

typedef struct cart_adam cart_adam;

void cart_adam_default_params(cart_adam_params *p);

/* An optimizer over n parameters, moments zero, t = 0. */
int cart_adam_new(cart_adam **out, const cart_adam_params *p, int64_t n);
void cart_adam_free(cart_adam *a);

int64_t cart_adam_size(const cart_adam *a);
int64_t cart_adam_steps(const cart_adam *a);
void cart_adam_set_lr(cart_adam *a, float lr);
float cart_adam_weight_decay(const cart_adam *a);

/* Starts a step: t += 1 and the bias corrections for it. */
void cart_adam_begin_step(cart_adam *a);

/* Updates param[0..n) from grad[0..n) with state elements offset..offset+n. */
int cart_adam_update(cart_adam *a, float *param, const float *grad, int64_t offset, int64_t n);
/* The same with this array's own weight decay (e.g. 0 for norm weights). */
int cart_adam_update_decay(cart_adam *a, float *param, const float *grad, int64_t offset, int64_t n,
                           float weight_decay);

/* The moments (which 0: m, 1: v), n floats each, writable: for saving and
 * restoring the state together with cart_adam_set_steps. */
float *cart_adam_moment(cart_adam *a, int32_t which);
int cart_adam_set_steps(cart_adam *a, int64_t steps);

#ifdef __cplusplus
}
#endif

#endif
