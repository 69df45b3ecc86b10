/*
 * model_internal.h - the layout of a loaded model, shared by model.c (loading,
 * inference) and train.c (the training passes). Not part of the public API.
 */
#ifndef CART_MODEL_INTERNAL_H
#define CART_MODEL_INTERNAL_H

#include "gguf.h"
#include "matmul.h"
#include "model.h"
#include "params.h"

#pragma GCC visibility push(hidden)

typedef struct layer_weights {
    float *attn_norm; /* [n_embd], owned f32 */
    float *ffn_norm;  /* [n_embd] */
    float *q_norm;    /* [head_dim] or NULL */
    float *k_norm;    /* [head_dim] or NULL */
    cart_weight wq;   /* [n_head * head_dim, n_embd] */
    cart_weight wk;   /* [n_head_kv * head_dim, n_embd] */
    cart_weight wv;   /* [n_head_kv * head_dim, n_embd] */
    cart_weight wo;   /* [n_embd, n_head * head_dim] */
    cart_weight wgate; /* [n_ff, n_embd] */
    cart_weight wup;   /* [n_ff, n_embd] */
    cart_weight wdown; /* [n_embd, n_ff] */
} layer_weights;

struct cart_model {
    cart_gguf *gguf;
    cart_model_config cfg;
    cart_weight tok_embd;  /* [n_vocab, n_embd], rows looked up by id */
    cart_weight output;    /* [n_vocab, n_embd]; a copy of tok_embd's view when tied */
    float *output_norm;    /* [n_embd] */
    layer_weights *layers; /* [n_layer] */
    uint64_t weight_bytes;
    uint64_t widened_bytes;
    int widened;           /* matrices point at malloc'ed f32 copies */
};

/* The gradient buffers a parameter set (params.h) gives the trainer: NULL
 * for a tensor that does not train. */
typedef struct layer_grads {
    float *attn_norm, *ffn_norm, *q_norm, *k_norm;
    float *wq, *wk, *wv, *wo, *wgate, *wup, *wdown;
} layer_grads;

typedef struct model_grads {
    float *tok_embd;    /* also the tied head's */
    float *output;      /* NULL when tied */
    float *output_norm;
    layer_grads *layers; /* [n_layer] */
} model_grads;

const model_grads *cart_params_grads(const cart_params *p);
const cart_model *cart_params_model(const cart_params *p);

/* Takes the next n floats of an arena being laid out: the forward pass and
 * the trainer carve their activations out of one allocation each. */
static inline float *cart_carve(float **p, int64_t n) {
    float *r = *p;
    *p += n;
    return r;
}

#pragma GCC visibility pop

#endif
