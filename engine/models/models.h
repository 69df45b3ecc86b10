/*
 * models.h - one file per architecture family, shared by inference and
 * training. Not part of the public API.
 *
 * An architecture is a table (arch_ops): how its GGUF's keys become the
 * model's config and each layer's geometry, how each layer's tensors load,
 * and its transformer block. The block is written once and run by two
 * callers:
 *
 *   model.c (inference): a batch of streams, K/V rows written to their
 *     caches, the products on the path each stream's token count takes
 *     (matmul.h), buffers reused in place;
 *   train.c (training): one pass behind a cartridge, every product exact,
 *     each intermediate kept in its own buffer for the backward.
 *
 * The block names every intermediate in a layer_io; a caller points the
 * names at its buffers (inference points several at one buffer: x_in,
 * x_mid, x_post and x_out are all its residual stream). Each step writes
 * its output only after reading its inputs, element by element, so either
 * aliasing computes the same bits. The arithmetic that differs between the
 * two callers on purpose lives in layer_exec: the products (path or exact),
 * attention (a cache, or a cartridge and packed segments) and gemma4's GELU
 * (GGML's f16 table when serving, exact when training: a table has no
 * derivative).
 *
 * Adding an architecture: docs/adding-a-model.md.
 */
#ifndef CART_MODELS_H
#define CART_MODELS_H

#include "../model_internal.h"

#pragma GCC visibility push(hidden)

/* One layer's intermediates over T tokens, row-major with the widths of
 * the comments (E = n_embd, F = n_ff, HD = n_head * head_dim, KD =
 * n_head_kv * head_dim, Ep = n_embd_per_layer). A rstd (1 / rms of each
 * row a norm saw, rmsnorm_forward_keep) may be NULL: nothing keeps it. */
typedef struct layer_io {
    float *x_in;              /* [T, E] the layer's input */
    float *xn1, *rstd1;       /* [T, E] attn_norm(x_in) */
    float *q, *k, *v;         /* [T, HD], [T, KD], [T, KD] projections (+ biases), before attend */
    float *att;               /* [T, HD] what attend writes */
    float *o;                 /* [T, E] output projection of att */
    float *x_mid;             /* [T, E] after the attention residual */
    float *xn2, *rstd2;       /* [T, E] ffn_norm(x_mid) */
    float *gate, *up, *h;     /* [T, F] the FFN's two projections and their product */
    float *f;                 /* [T, E] down projection of h */
    float *x_out;             /* [T, E] the layer's output */
    /* gemma4 */
    float *on, *o_rstd;       /* [T, E] post_attention_norm(o) */
    float *xm, *xm_rstd;      /* [T, E] pre_ffw_norm_2(x_mid): the experts' input */
    float *msum;              /* [T, E] the experts' weighted sum (what moe writes) */
    float *mn, *m_rstd;       /* [T, E] post_ffw_norm_2(msum) */
    float *fs, *f_rstd;       /* [T, E] f, or post_ffw_norm_1(f) + mn on MoE layers */
    float *fn, *fs_rstd;      /* [T, E] post_ffw_norm(fs) */
    float *x_post;            /* [T, E] x_mid + fn */
    const float *pl_in;       /* [T, n_layer * Ep] per-layer inputs (every layer's) */
    float *pl_g;              /* [T, Ep] per-layer gate projection of x_post */
    float *pl_h;              /* [T, Ep] its GELU times the layer's per-layer input */
    float *pl_r;              /* [T, E] projection of pl_h */
    float *pn, *pl_rstd;      /* [T, E] per_layer_post_norm(pl_r) */
} layer_io;

/* What a caller runs the block with. */
typedef struct layer_exec {
    void *ctx;
    /* y[i] = x @ w[i]^T over the pass's T rows, for i < count (<= 3). */
    int (*linear)(void *ctx, int32_t count, float *const *y, const int64_t *ldy, const float *x, int64_t ldx,
                  const cart_weight *const *w);
    /* io->q, io->k, io->v -> io->att: q/k norms, RoPE (gemma4: the value
     * norm), the cache or the cartridge, and attention. */
    int (*attend)(void *ctx);
    /* gemma4 MoE layers: io->xm (and the residual io->x_mid, which the
     * router reads) -> io->msum. */
    int (*moe)(void *ctx);
    int exact_gelu; /* gemma4's GELU: exact (1) or GGML's f16 table (0) */
    cart_pool *pool; /* what the element and row steps run on */
} layer_exec;

/* An architecture (see the top of this file). */
typedef struct arch_ops {
    int32_t arch;      /* cart_arch */
    const char *name;  /* general.architecture */
    /* The config (ld->arch names the key prefix) and every layer's
     * geometry: allocates m->layers. */
    int (*read_config)(model_loader *ld, cart_model *m);
    /* Every layer's tensors (and the architecture's own model-wide ones). */
    int (*load_layers)(cart_model *m, model_loader *ld);
    /* Layer `layer` over T tokens. */
    int (*layer_forward)(const layer_exec *ex, const cart_model *m, int32_t layer, const layer_io *io,
                         int64_t T);
} arch_ops;

extern const arch_ops arch_llama, arch_qwen2, arch_qwen3, arch_gemma4;

/* The architecture of a cart_arch value, or NULL. */
const arch_ops *arch_of(int32_t arch);
/* The architecture general.architecture names (len bytes), or NULL. */
const arch_ops *arch_by_name(const char *name, size_t len);

/* The steps the blocks share (steps.c). */
/* y[t, :] += b over rows of n. */
void layer_add_bias(float *y, const float *b, int64_t rows, int64_t n);
/* The element and row steps below split their work over ex->pool, with
 * the same bits at any thread count. */
/* y = a + b, element by element (y may be a or b). */
void layer_add(const layer_exec *ex, float *y, const float *a, const float *b, int64_t n);
/* h = silu(h) * up (ops.h's swiglu_forward). */
void layer_swiglu(const layer_exec *ex, float *h, const float *up, int64_t n);
/* h = gelu(gate) * up through ex's GELU (h may be gate). */
void layer_geglu(const layer_exec *ex, float *h, const float *gate, const float *up, int64_t n);
/* y = RMSNorm(x) * w over rows of dim (ops.h's rmsnorm_forward_keep; rstd
 * may be NULL, y may be x). */
void layer_norm(const layer_exec *ex, float *y, float *rstd, const float *x, const float *w, int64_t rows,
                int64_t dim, float eps);
/* The training backward's steps, split over pool the same way: y = 0;
 * dgate, dup = the gradients of swiglu (geglu: exact GELU; dup may be
 * NULL) from dh, into zeroed buffers; dx += rmsnorm_backward over rows of
 * dim (ops.h). */
void step_zero(cart_pool *pool, float *y, int64_t n);
void step_glu_backward(cart_pool *pool, int geglu, float *dgate, float *dup, const float *dh, const float *gate,
                       const float *up, int64_t n);
void step_norm_backward(cart_pool *pool, float *dx, const float *dy, const float *x, const float *rstd,
                        const float *w, int64_t rows, int64_t dim);
/* One product through ex. */
int layer_linear1(const layer_exec *ex, float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w);
/* Every architecture's attention half up to its output projection:
 * xn1 = attn_norm(x_in); q, k, v = its projections (v = k without
 * attn_v), plus their biases where the layer has them; attend; o. */
int layer_attention(const layer_exec *ex, const cart_model *m, int32_t layer, const layer_io *io, int64_t T);
/* gate, up = the FFN's two projections of xn2. */
int layer_gate_up(const layer_exec *ex, const cart_model *m, int32_t layer, const layer_io *io);

#pragma GCC visibility pop

#endif
