/*
 * llama.c - the llama family: llama, qwen2 and qwen3, as llama.cpp's
 * src/models/{llama,qwen2,qwen3}.cpp compute them.
 *
 *   x_mid = x_in + o(attend(q, k, v of attn_norm(x_in)))
 *   x_out = x_mid + down(silu(gate(xn2)) * up(xn2)),  xn2 = ffn_norm(x_mid)
 *
 * Where they differ:
 *   llama: rotates adjacent pairs (GGML's "normal" RoPE);
 *   qwen2: NEOX RoPE (the two halves of a head), biases on q, k and v;
 *   qwen3: NEOX RoPE, RMS norms on each head of q and k before RoPE.
 * One geometry for every layer; every "<arch>.*" key that asks for a
 * feature this engine lacks is refused by name.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../internal.h"
#include "../ops.h"
#include "models.h"

/* Keys whose presence means a feature this engine does not implement. */
static int reject_unsupported_keys(model_loader *ld) {
    static const char *const unsupported[] = {
        "rope.scaling.type",       "rope.scaling.factor",       "rope.scale_linear",
        "rope.scaling.original_context_length", "attention.sliding_window",
        "attention.clamp_kqv",     "expert_count",              "expert_used_count",
        "attention.max_alibi_bias", "logit_scale",              "rope.dimension_sections",
        "attention.layer_indices", "final_logit_softcapping",   "attn_logit_softcapping",
    };
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        const char *key = model_key(ld, unsupported[i]);
        const cart_gguf_value *v = cart_gguf_find(ld->g, key);
        if (!v) continue;
        /* neutral values are harmless: scaling "none", factor 1, zero experts */
        if (v->type == CART_GGUF_STRING && v->as.str.len == 4 &&
            memcmp(v->as.str.data, "none", 4) == 0)
            continue;
        if ((v->type == CART_GGUF_FLOAT32 || v->type == CART_GGUF_FLOAT64) &&
            (v->as.f64 == 1.0 || v->as.f64 == 0.0))
            continue;
        if (v->type != CART_GGUF_STRING && v->type != CART_GGUF_ARRAY &&
            v->type != CART_GGUF_FLOAT32 && v->type != CART_GGUF_FLOAT64 && v->as.u64 == 0)
            continue;
        return cart_fail(CART_E_UNSUPPORTED,
                         "%s: '%s' is set, and this engine does not implement that feature "
                         "(it would silently compute something else)",
                         ld->path, key);
    }
    return CART_OK;
}

/* The shape of the attention. */
static int read_heads(model_loader *ld, cart_model_config *c) {
    int rc;
    if ((rc = model_get_dim(ld, "attention.head_count", &c->n_head, 1))) return rc;
    c->n_head_kv = c->n_head;
    if ((rc = model_get_dim_opt(ld, "attention.head_count_kv", &c->n_head_kv))) return rc;
    c->head_dim = c->n_embd / c->n_head;
    if ((rc = model_get_dim_opt(ld, "attention.key_length", &c->head_dim))) return rc;
    int32_t value_length = c->head_dim;
    if ((rc = model_get_dim_opt(ld, "attention.value_length", &value_length))) return rc;
    if (value_length != c->head_dim)
        return cart_fail(CART_E_UNSUPPORTED, "%s: attention.value_length %d differs from "
                         "key_length %d, which this engine does not support", ld->path,
                         value_length, c->head_dim);
    c->n_rot = c->head_dim;
    if ((rc = model_get_dim_opt(ld, "rope.dimension_count", &c->n_rot))) return rc;
    if (c->n_head % c->n_head_kv != 0)
        return cart_fail(CART_E_FORMAT, "%s: %d attention heads are not a multiple of %d KV heads",
                         ld->path, c->n_head, c->n_head_kv);
    if (c->n_head / c->n_head_kv > 16 || c->head_dim > 256)
        return cart_fail(CART_E_UNSUPPORTED, "%s: %d query heads per KV head or head_dim %d is "
                         "beyond this engine's limits (16, 256)", ld->path,
                         c->n_head / c->n_head_kv, c->head_dim);
    if (c->n_rot > c->head_dim || c->n_rot % 2)
        return cart_fail(CART_E_FORMAT, "%s: rope.dimension_count %d must be even and at most "
                         "head_dim %d", ld->path, c->n_rot, c->head_dim);
    return CART_OK;
}

static int read_dims(model_loader *ld, cart_model_config *c) {
    int rc;
    if ((rc = model_get_dim(ld, "block_count", &c->n_layer, 1))) return rc;
    if ((rc = model_get_dim(ld, "embedding_length", &c->n_embd, 1))) return rc;
    if ((rc = model_get_dim(ld, "feed_forward_length", &c->n_ff, 1))) return rc;
    if ((rc = read_heads(ld, c))) return rc;
    if ((rc = model_get_dim(ld, "context_length", &c->n_ctx_train, 1))) return rc;
    if ((rc = model_get_eps(ld, &c->rms_eps))) return rc;
    c->rope_theta = 10000.0f;
    rc = cart_gguf_get_f32(&c->rope_theta, ld->g, model_key(ld, "rope.freq_base"));
    if (rc && rc != CART_E_NOT_FOUND) return rc;
    if (!(c->rope_theta > 1.0f))
        return cart_fail(CART_E_FORMAT, "%s: '%s' = %g is out of range", ld->path, ld->key,
                         c->rope_theta);
    c->embd_scale = 1.0f;
    c->rope_neox = c->arch != CART_ARCH_LLAMA;
    c->qk_norm = c->arch == CART_ARCH_QWEN3;
    return reject_unsupported_keys(ld);
}

/* The config, then every layer with the one geometry. */
static int read_config(model_loader *ld, cart_model *m) {
    cart_model_config *c = &m->cfg;
    int rc = read_dims(ld, c);
    if (!rc) rc = check_layer_count(ld, c->n_layer);
    if (rc) return rc;
    m->layers = cart_calloc((size_t)c->n_layer, sizeof *m->layers, "model layers");
    if (!m->layers) return CART_E_NOMEM;
    for (int32_t l = 0; l < c->n_layer; l++) {
        layer_weights *L = &m->layers[l];
        L->g = (cart_layer_config){.n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
                                   .n_rot = c->n_rot, .n_ff = c->n_ff, .rope_theta = c->rope_theta,
                                   .attn_scale = 1.0f / sqrtf((float)c->head_dim)};
        L->out_scale = 1.0f;
    }
    m->rope_n_rot[0] = m->rope_n_rot[1] = c->n_rot;
    m->rope_base[0] = m->rope_base[1] = c->rope_theta;
    return CART_OK;
}

static int load_layer(cart_model *m, model_loader *ld, int32_t l) {
    const cart_model_config *c = &m->cfg;
    layer_weights *L = &m->layers[l];
    const int64_t E = c->n_embd, F = c->n_ff, D = c->head_dim;
    const int64_t HD = (int64_t)c->n_head * D, KD = (int64_t)c->n_head_kv * D;
    uint64_t *bytes = &m->weight_bytes;
    char name[96];
    int rc;
#define NAME(part) (snprintf(name, sizeof name, "blk.%d." part, (int)l), name)
    if ((rc = model_load_vector(ld, NAME("attn_norm.weight"), E, &L->attn_norm, bytes)) ||
        (rc = model_load_vector(ld, NAME("ffn_norm.weight"), E, &L->ffn_norm, bytes)) ||
        (rc = model_load_weight(ld, NAME("attn_q.weight"), E, HD, &L->wq, bytes)) ||
        (rc = model_load_weight(ld, NAME("attn_k.weight"), E, KD, &L->wk, bytes)) ||
        (rc = model_load_weight(ld, NAME("attn_v.weight"), E, KD, &L->wv, bytes)) ||
        (rc = model_load_weight(ld, NAME("attn_output.weight"), HD, E, &L->wo, bytes)) ||
        (rc = model_load_weight(ld, NAME("ffn_gate.weight"), E, F, &L->wgate, bytes)) ||
        (rc = model_load_weight(ld, NAME("ffn_up.weight"), E, F, &L->wup, bytes)) ||
        (rc = model_load_weight(ld, NAME("ffn_down.weight"), F, E, &L->wdown, bytes)))
        return rc;
    if (c->qk_norm &&
        ((rc = model_load_vector(ld, NAME("attn_q_norm.weight"), D, &L->q_norm, bytes)) ||
         (rc = model_load_vector(ld, NAME("attn_k_norm.weight"), D, &L->k_norm, bytes))))
        return rc;
    if (c->arch == CART_ARCH_QWEN2 &&
        ((rc = model_load_vector(ld, NAME("attn_q.bias"), HD, &L->bq, bytes)) ||
         (rc = model_load_vector(ld, NAME("attn_k.bias"), KD, &L->bk, bytes)) ||
         (rc = model_load_vector(ld, NAME("attn_v.bias"), KD, &L->bv, bytes))))
        return rc;
#undef NAME
    return CART_OK;
}

static int load_layers(cart_model *m, model_loader *ld) {
    for (int32_t l = 0; l < m->cfg.n_layer; l++) {
        int rc = load_layer(m, ld, l);
        if (rc) return rc;
    }
    return CART_OK;
}

static int layer_forward(const layer_exec *ex, const cart_model *m, int32_t layer, const layer_io *io,
                         int64_t T) {
    const cart_model_config *c = &m->cfg;
    const layer_weights *L = &m->layers[layer];
    const int64_t E = c->n_embd, F = L->g.n_ff;
    int rc;
    if ((rc = layer_attention(ex, m, layer, io, T))) return rc;
    layer_add(ex, io->x_mid, io->x_in, io->o, T * E);
    layer_norm(ex, io->xn2, io->rstd2, io->x_mid, L->ffn_norm, T, E, c->rms_eps);
    if ((rc = layer_gate_up(ex, m, layer, io))) return rc;
    if (io->h != io->gate) memcpy(io->h, io->gate, sizeof(float) * (size_t)(T * F));
    layer_swiglu(ex, io->h, io->up, T * F);
    if ((rc = layer_linear1(ex, io->f, E, io->h, F, &L->wdown))) return rc;
    layer_add(ex, io->x_out, io->x_mid, io->f, T * E);
    return CART_OK;
}

const arch_ops arch_llama = {CART_ARCH_LLAMA, "llama", read_config, load_layers, layer_forward};
const arch_ops arch_qwen2 = {CART_ARCH_QWEN2, "qwen2", read_config, load_layers, layer_forward};
const arch_ops arch_qwen3 = {CART_ARCH_QWEN3, "qwen3", read_config, load_layers, layer_forward};
