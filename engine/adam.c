/*
 * adam.c - Adam with torch.optim.Adam's single-tensor update order.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adam.h"
#include "internal.h"

struct cart_adam {
    cart_adam_params p;
    int64_t n;
    int64_t steps;
    float step_size;     /* lr / bc1 of the current step */
    float bc2_sqrt;      /* sqrt(bc2) of the current step */
    float *m;
    float *v;
};

void cart_adam_default_params(cart_adam_params *p) {
    memset(p, 0, sizeof *p);
    p->lr = 2e-3f;
    p->beta1 = 0.9f;
    p->beta2 = 0.999f;
    p->eps = 1e-8f;
    p->weight_decay = 0.0f;
}

int cart_adam_new(cart_adam **out, const cart_adam_params *p, int64_t n) {
    *out = NULL;
    if (n < 0) return cart_fail(CART_E_ARG, "cart_adam_new: %lld parameters", (long long)n);
    if (!(p->lr >= 0.0f) || !(p->beta1 >= 0.0f && p->beta1 < 1.0f) ||
        !(p->beta2 >= 0.0f && p->beta2 < 1.0f) || !(p->eps >= 0.0f) || !(p->weight_decay >= 0.0f))
        return cart_fail(CART_E_ARG, "cart_adam_new: lr %g, betas (%g, %g), eps %g, weight decay %g: "
                         "lr, eps and decay must be >= 0 and the betas in [0, 1)", p->lr, p->beta1,
                         p->beta2, p->eps, p->weight_decay);
    cart_adam *a = cart_calloc(1, sizeof *a, "Adam optimizer");
    if (!a) return CART_E_NOMEM;
    a->p = *p;
    a->n = n;
    a->m = cart_calloc((size_t)(n ? n : 1), sizeof(float), "Adam first moments");
    a->v = cart_calloc((size_t)(n ? n : 1), sizeof(float), "Adam second moments");
    if (!a->m || !a->v) {
        cart_adam_free(a);
        return CART_E_NOMEM;
    }
    *out = a;
    return CART_OK;
}

void cart_adam_free(cart_adam *a) {
    if (!a) return;
    free(a->m);
    free(a->v);
    free(a);
}

int64_t cart_adam_size(const cart_adam *a) { return a->n; }
int64_t cart_adam_steps(const cart_adam *a) { return a->steps; }
void cart_adam_set_lr(cart_adam *a, float lr) { a->p.lr = lr; }
float cart_adam_weight_decay(const cart_adam *a) { return a->p.weight_decay; }

/* As torch computes them: Python floats (double), turned into f32 scalars
 * where they meet the f32 tensors. */
static void corrections(cart_adam *a) {
    double t = (double)a->steps;
    double bc1 = 1.0 - pow((double)a->p.beta1, t);
    double bc2 = 1.0 - pow((double)a->p.beta2, t);
    a->step_size = (float)((double)a->p.lr / bc1);
    a->bc2_sqrt = (float)sqrt(bc2);
}

void cart_adam_begin_step(cart_adam *a) {
    a->steps++;
    corrections(a);
}

int cart_adam_update(cart_adam *a, float *param, const float *grad, int64_t offset, int64_t n) {
    return cart_adam_update_decay(a, param, grad, offset, n, a->p.weight_decay);
}

int cart_adam_update_decay(cart_adam *a, float *param, const float *grad, int64_t offset, int64_t n,
                           float weight_decay) {
    if (!(weight_decay >= 0.0f))
        return cart_fail(CART_E_ARG, "cart_adam_update: weight decay %g must be >= 0", weight_decay);
    if (offset < 0 || n < 0 || offset > a->n - n)
        return cart_fail(CART_E_ARG, "cart_adam_update: elements [%lld, %lld) outside the %lld the "
                         "optimizer holds", (long long)offset, (long long)(offset + n),
                         (long long)a->n);
    if (a->steps == 0) return cart_fail(CART_E_STATE, "cart_adam_update: call cart_adam_begin_step first");
    float *m = a->m + offset, *v = a->v + offset;
    const float b1 = a->p.beta1, b2 = a->p.beta2, eps = a->p.eps;
    const float wd = a->p.decoupled ? 0.0f : weight_decay;
    const float step_size = a->step_size, bc2_sqrt = a->bc2_sqrt;
    if (a->p.decoupled && weight_decay != 0.0f) {
        const float keep = (float)(1.0 - (double)a->p.lr * (double)weight_decay);
        for (int64_t i = 0; i < n; i++) param[i] *= keep;
    }
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i];
        if (wd != 0.0f) g += wd * param[i];
        m[i] += (1.0f - b1) * (g - m[i]);
        v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        param[i] -= step_size * (m[i] / denom);
    }
    return CART_OK;
}

float *cart_adam_moment(cart_adam *a, int32_t which) {
    return which == 0 ? a->m : which == 1 ? a->v : NULL;
}

int cart_adam_set_steps(cart_adam *a, int64_t steps) {
    if (steps < 0) return cart_fail(CART_E_ARG, "cart_adam_set_steps: %lld", (long long)steps);
    a->steps = steps;
    if (steps > 0) corrections(a);
    return CART_OK;
}
