/*
 * model_internal.h - the layout of a loaded model, shared by model.c (loading,
 * inference) and train.c (the training passes). Not part of the public API.
 */
#ifndef CART_MODEL_INTERNAL_H
#define CART_MODEL_INTERNAL_H

#include <stdatomic.h>

#include "gguf.h"
#include "matmul.h"
#include "model.h"
#include "params.h"

#pragma GCC visibility push(hidden)

/* Shapes below use the layer's own geometry (g): head_dim and n_head_kv
 * differ between gemma4's sliding and full layers. */
typedef struct layer_weights {
    cart_layer_config g; /* the layer's geometry and attention (model.h) */
    int32_t rope_table;  /* which RoPE angle table the layer reads: 0 full, 1 sliding */
    int32_t reserved;
    const float *rope_ff; /* [head_dim / 2] RoPE frequency factors, or NULL */
    float *attn_norm; /* [n_embd], owned f32 */
    float *ffn_norm;  /* [n_embd] */
    float *q_norm;    /* [head_dim] or NULL */
    float *k_norm;    /* [head_dim] or NULL */
    float *bq, *bk, *bv; /* qwen2: [n_head * head_dim], [n_head_kv * head_dim] x 2 biases, or NULL */
    cart_weight wq;   /* [n_head * head_dim, n_embd] */
    cart_weight wk;   /* [n_head_kv * head_dim, n_embd] */
    cart_weight wv;   /* [n_head_kv * head_dim, n_embd]; gemma4 without attn_v: rows 0 (v = k) */
    cart_weight wo;   /* [n_embd, n_head * head_dim] */
    cart_weight wgate; /* [n_ff, n_embd] */
    cart_weight wup;   /* [n_ff, n_embd] */
    cart_weight wdown; /* [n_embd, n_ff] */
    /* gemma4 (NULL / empty otherwise) */
    float *post_attn_norm; /* [n_embd] after attention, before the residual */
    float *post_ffn_norm;  /* [n_embd] after the FFN (both branches summed on MoE layers) */
    float out_scale;       /* the layer output scale (1 when absent) */
    cart_weight pl_gate;   /* [n_embd_per_layer, n_embd] per-layer input gate */
    cart_weight pl_proj;   /* [n_embd, n_embd_per_layer] */
    float *pl_post_norm;   /* [n_embd] */
    /* gemma4 MoE layers */
    cart_weight router;    /* [n_expert, n_embd] ffn_gate_inp */
    float *router_scale;   /* [n_embd] ffn_gate_inp.scale */
    float *pre_ffn_norm_2, *post_ffn_norm_1, *post_ffn_norm_2; /* [n_embd] */
    cart_weight *exp_gate; /* [n_expert] views of [n_ff_exp, n_embd] */
    cart_weight *exp_up;   /* [n_expert] */
    cart_weight *exp_down; /* [n_expert] views of [n_embd, n_ff_exp] */
    float *exp_scale;      /* [n_expert] ffn_down_exps.scale, or NULL */
} layer_weights;

struct cart_model {
    cart_gguf *gguf;
    _Atomic int content_hash_known; /* cart_model_content_hash_once's cache */
    uint64_t content_hash;
    cart_model_config cfg;
    cart_weight tok_embd;  /* [n_vocab, n_embd], rows looked up by id */
    cart_weight output;    /* [n_vocab, n_embd]; a copy of tok_embd's view when tied */
    float *output_norm;    /* [n_embd] */
    layer_weights *layers; /* [n_layer] */
    /* gemma4 */
    float *rope_freqs;     /* [full head_dim / 2] the full layers' RoPE factors, or NULL */
    int32_t rope_n_rot[2]; /* rotated dims of RoPE tables 0 (full) and 1 (sliding) */
    float rope_base[2];
    cart_weight pl_tok_embd; /* [n_vocab, n_layer * n_embd_per_layer] per-layer token embeddings */
    cart_weight pl_model_proj; /* [n_layer * n_embd_per_layer, n_embd] */
    float *pl_proj_norm;   /* [n_embd_per_layer] */
    uint64_t weight_bytes;
    uint64_t widened_bytes;
    uint64_t packed_bytes; /* repacked copies (cart_weight_repack) */
    double repack_seconds;
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

/* cart_model_content_hash, computed once per model and kept (the weights
 * of a loaded model do not change; cartridges check it on every save and
 * open). Two threads may both compute it the first time: the same value. */
int cart_model_content_hash_once(const cart_model *m, uint64_t *out);

/* Reading a model's GGUF (model.c; models/ reads each architecture's part). */
typedef struct model_loader {
    cart_gguf *g;
    const char *path;
    const char *arch;
    uint8_t *claimed; /* [tensor count] 1 once a tensor is loaded: every tensor must be */
    char key[256];
} model_loader;

/* "<arch>.<suffix>" in ld->key. */
const char *model_key(model_loader *ld, const char *suffix);
/* A required integer hyperparameter in [lo, 2^30]; an optional one keeps
 * *out when absent (_opt: at least 1; _opt0: at least 0). */
int model_get_dim(model_loader *ld, const char *suffix, int32_t *out, int32_t lo);
int model_get_dim_opt(model_loader *ld, const char *suffix, int32_t *out);
int model_get_dim_opt0(model_loader *ld, const char *suffix, int32_t *out);
/* attention.layer_norm_rms_epsilon (required, in (0, 1)). */
int model_get_eps(model_loader *ld, float *out);
/* CART_E_FORMAT when block_count exceeds the file's tensor count. */
int check_layer_count(model_loader *ld, int32_t n_layer);
/* A tensor by name (NULL when absent), without claiming it. */
const cart_gguf_tensor_info *model_find_tensor(model_loader *ld, const char *name);
/* A matrix [rows, cols] as a weight view, or a vector of n as owned f32;
 * each checks the shape and claims the tensor. */
int model_load_weight(model_loader *ld, const char *name, int64_t cols, int64_t rows, cart_weight *w,
                      uint64_t *bytes);
int model_load_vector(model_loader *ld, const char *name, int64_t n, float **out, uint64_t *bytes);
/* Claims a tensor loaded by other means. */
void model_claim(model_loader *ld, const cart_gguf_tensor_info *t);

/* gemma4: the config and each layer's geometry (allocates m->layers), then
 * the tensors; the layer's gemma4 buffers are freed by gemma4_free_layer. */
int gemma4_read_config(model_loader *ld, cart_model *m);
int gemma4_load_weights(cart_model *m, model_loader *ld);
void gemma4_free_layer(layer_weights *L);

/* The widest per-token sizes over the model's layers, for sizing buffers. */
typedef struct model_widths {
    int64_t hd;   /* n_head * head_dim */
    int64_t kd;   /* n_head_kv * head_dim */
    int64_t ff;   /* n_ff, or n_ff_exp when larger */
    int32_t head_dim, n_head, n_head_kv, n_rot;
} model_widths;

model_widths cart_model_widths(const cart_model *m);

/* Each layer's KV heads, then each layer's head_dim: a new array of
 * 2 * n_layer (free it), NULL when out of memory (the error is set). */
int32_t *cart_model_kv_geometry(const cart_model *m);
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
