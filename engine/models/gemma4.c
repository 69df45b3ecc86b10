/*
 * gemma4.c - gemma4's hyperparameters, tensors and block, as llama.cpp's
 * src/models/gemma4.cpp reads and computes them (model.h says what the
 * layers compute).
 *
 * Every "gemma4.*" key is either honoured or refused by name: the keys below
 * are the ones this engine reads, and a key outside the list means the file
 * asks for something it does not implement. Every tensor the file holds must
 * be one the model uses (model.c checks that after loading).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../dtype.h"
#include "../internal.h"
#include "../ops.h"
#include "models.h"

/* The gemma4 keys this engine honours (after "gemma4."). */
static const char *const honoured_keys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.value_length", "attention.key_length_swa", "attention.value_length_swa",
    "attention.layer_norm_rms_epsilon", "attention.sliding_window",
    "attention.sliding_window_pattern", "attention.shared_kv_layers", "rope.dimension_count",
    "rope.dimension_count_swa", "rope.freq_base", "rope.freq_base_swa",
    "embedding_length_per_layer_input", "final_logit_softcapping", "expert_count",
    "expert_used_count", "expert_feed_forward_length", "expert_gating_func", "vocab_size",
    "causal_attention", "rope.scaling.type", "rope.scaling.factor",
};

static int refuse_unknown_keys(model_loader *ld) {
    const size_t prefix = strlen("gemma4.");
    for (int64_t i = 0; i < cart_gguf_kv_count(ld->g); i++) {
        const cart_gguf_kv *kv = cart_gguf_kv_at(ld->g, i);
        if (kv->key.len <= prefix || memcmp(kv->key.data, "gemma4.", prefix) != 0) continue;
        int known = 0;
        for (size_t j = 0; j < sizeof honoured_keys / sizeof honoured_keys[0] && !known; j++)
            known = kv->key.len - prefix == strlen(honoured_keys[j]) &&
                    memcmp(kv->key.data + prefix, honoured_keys[j], kv->key.len - prefix) == 0;
        if (!known)
            return cart_fail(CART_E_UNSUPPORTED,
                             "%s: '%.*s' is set, and this engine does not implement it for gemma4 "
                             "(it would silently compute something else)",
                             ld->path, (int)(kv->key.len > 128 ? 128 : kv->key.len), kv->key.data);
    }
    return CART_OK;
}

/* A per-layer integer hyperparameter: one number for every layer, or an
 * array of n_layer numbers. `def` fills it when the key is absent (def < 0:
 * the key is required). Values must lie in [lo, 2^30]. */
static int get_per_layer(model_loader *ld, const char *suffix, int32_t n_layer, int32_t def,
                         int32_t lo, int32_t *out) {
    const char *key = model_key(ld, suffix);
    const cart_gguf_value *v = cart_gguf_find(ld->g, key);
    if (!v) {
        if (def < 0) return cart_fail(CART_E_FORMAT, "%s: missing hyperparameter '%s'", ld->path, key);
        for (int32_t l = 0; l < n_layer; l++) out[l] = def;
        return CART_OK;
    }
    if (v->type != CART_GGUF_ARRAY) {
        int32_t x = 0;
        int rc = model_get_dim(ld, suffix, &x, lo);
        if (rc) return rc;
        for (int32_t l = 0; l < n_layer; l++) out[l] = x;
        return CART_OK;
    }
    if (v->count != (uint64_t)n_layer)
        return cart_fail(CART_E_FORMAT, "%s: '%s' holds %llu values, expected one per layer (%d)",
                         ld->path, key, (unsigned long long)v->count, n_layer);
    for (int32_t l = 0; l < n_layer; l++) {
        int64_t x;
        switch (v->elem_type) {
        case CART_GGUF_UINT32: x = ((const uint32_t *)v->as.array)[l]; break;
        case CART_GGUF_INT32: x = ((const int32_t *)v->as.array)[l]; break;
        case CART_GGUF_UINT16: x = ((const uint16_t *)v->as.array)[l]; break;
        case CART_GGUF_INT16: x = ((const int16_t *)v->as.array)[l]; break;
        case CART_GGUF_UINT8: x = ((const uint8_t *)v->as.array)[l]; break;
        case CART_GGUF_INT8: x = ((const int8_t *)v->as.array)[l]; break;
        default:
            return cart_fail(CART_E_FORMAT, "%s: '%s' is an array of %s, expected integers", ld->path,
                             key, cart_gguf_type_name(v->elem_type) ? cart_gguf_type_name(v->elem_type)
                                                                    : "an unknown type");
        }
        if (x < lo || x > (1 << 30))
            return cart_fail(CART_E_FORMAT, "%s: '%s'[%d] = %lld is out of range", ld->path, key, l,
                             (long long)x);
        out[l] = (int32_t)x;
    }
    return CART_OK;
}

/* An optional float; *out keeps its default when absent. */
static int get_float_opt(model_loader *ld, const char *suffix, float *out) {
    int rc = cart_gguf_get_f32(out, ld->g, model_key(ld, suffix));
    return rc == CART_E_NOT_FOUND ? CART_OK : rc;
}

/* The bool (or 0/1 integer) array of sliding layers. */
static int get_pattern(model_loader *ld, int32_t n_layer, int32_t *swa) {
    const char *key = model_key(ld, "attention.sliding_window_pattern");
    const cart_gguf_value *v = cart_gguf_find(ld->g, key);
    if (!v)
        return cart_fail(CART_E_FORMAT, "%s: missing '%s' (which layers use the sliding window)",
                         ld->path, key);
    if (v->type != CART_GGUF_ARRAY || v->count != (uint64_t)n_layer ||
        (v->elem_type != CART_GGUF_BOOL && v->elem_type != CART_GGUF_UINT8 &&
         v->elem_type != CART_GGUF_INT8 && v->elem_type != CART_GGUF_UINT32 &&
         v->elem_type != CART_GGUF_INT32))
        return cart_fail(CART_E_FORMAT, "%s: '%s' must be an array of %d bools, one per layer",
                         ld->path, key, n_layer);
    for (int32_t l = 0; l < n_layer; l++) {
        if (v->elem_type == CART_GGUF_UINT32 || v->elem_type == CART_GGUF_INT32)
            swa[l] = ((const int32_t *)v->as.array)[l] != 0;
        else swa[l] = ((const uint8_t *)v->as.array)[l] != 0;
    }
    return CART_OK;
}

/* Keys whose only honoured values are the neutral ones. */
static int check_neutral_keys(model_loader *ld) {
    const cart_gguf_value *v;
    if ((v = cart_gguf_find(ld->g, model_key(ld, "rope.scaling.type"))) &&
        !(v->type == CART_GGUF_STRING && v->as.str.len == 4 && memcmp(v->as.str.data, "none", 4) == 0))
        return cart_fail(CART_E_UNSUPPORTED, "%s: '%s' is set, and this engine does not implement RoPE "
                         "scaling (only \"none\")", ld->path, ld->key);
    float factor = 0.0f;
    int rc = get_float_opt(ld, "rope.scaling.factor", &factor);
    if (rc) return rc;
    if (factor != 0.0f && factor != 1.0f)
        return cart_fail(CART_E_UNSUPPORTED, "%s: '%s' = %g, and this engine does not implement RoPE "
                         "scaling", ld->path, ld->key, factor);
    uint32_t u = 1;
    rc = cart_gguf_get_u32(&u, ld->g, model_key(ld, "expert_gating_func"));
    if (rc && rc != CART_E_NOT_FOUND) return rc;
    if (u != 1)
        return cart_fail(CART_E_UNSUPPORTED, "%s: '%s' = %u; gemma4 gates its experts with a softmax "
                         "(1), and this engine implements nothing else", ld->path, ld->key, u);
    int32_t causal = 1;
    rc = cart_gguf_get_bool(&causal, ld->g, model_key(ld, "causal_attention"));
    if (rc && rc != CART_E_NOT_FOUND) return rc;
    if (!causal)
        return cart_fail(CART_E_UNSUPPORTED, "%s: '%s' is false; this engine runs causal attention "
                         "only", ld->path, ld->key);
    return CART_OK;
}

/* The two layer kinds' shapes: head size, rotated dims and RoPE base of the
 * full and the sliding layers, and the window. */
typedef struct gemma4_kinds {
    int32_t hd_full, hd_swa, n_rot_full, n_rot_swa, n_swa;
    float theta, theta_swa;
} gemma4_kinds;

static int read_kinds(model_loader *ld, const cart_model_config *c, int32_t n_head0, gemma4_kinds *k) {
    int32_t v_full, v_swa;
    int rc;
    k->hd_full = c->n_embd / n_head0;
    if ((rc = model_get_dim_opt(ld, "attention.key_length", &k->hd_full))) return rc;
    v_full = k->hd_full;
    if ((rc = model_get_dim_opt(ld, "attention.value_length", &v_full)) ||
        (rc = model_get_dim(ld, "attention.key_length_swa", &k->hd_swa, 1)) ||
        (rc = model_get_dim(ld, "attention.value_length_swa", &v_swa, 1)))
        return rc;
    if (k->hd_full < 1)
        return cart_fail(CART_E_FORMAT, "%s: the full layers' head size is %d (n_embd %d over %d heads, and no "
                         "attention.key_length)", ld->path, k->hd_full, c->n_embd, n_head0);
    if (v_full != k->hd_full || v_swa != k->hd_swa)
        return cart_fail(CART_E_FORMAT, "%s: gemma4 needs value_length = key_length on both layer kinds "
                         "(full %d vs %d, sliding %d vs %d)", ld->path, v_full, k->hd_full, v_swa, k->hd_swa);
    k->n_rot_full = k->hd_full;
    if ((rc = model_get_dim_opt(ld, "rope.dimension_count", &k->n_rot_full))) return rc;
    k->n_rot_swa = k->n_rot_full;
    if ((rc = model_get_dim_opt(ld, "rope.dimension_count_swa", &k->n_rot_swa)) ||
        (rc = model_get_dim(ld, "attention.sliding_window", &k->n_swa, 1)))
        return rc;
    k->theta = 10000.0f, k->theta_swa = 10000.0f;
    if ((rc = get_float_opt(ld, "rope.freq_base", &k->theta)) ||
        (rc = get_float_opt(ld, "rope.freq_base_swa", &k->theta_swa)))
        return rc;
    if (!(k->theta > 1.0f && k->theta_swa > 1.0f && isfinite(k->theta) && isfinite(k->theta_swa)))
        return cart_fail(CART_E_FORMAT, "%s: rope.freq_base %g / freq_base_swa %g are out of range", ld->path,
                         k->theta, k->theta_swa);
    return CART_OK;
}

/* The per-layer input width, the final logit softcap and the experts. */
static int read_extras(model_loader *ld, cart_model_config *c) {
    int rc;
    if ((rc = model_get_dim(ld, "embedding_length_per_layer_input", &c->n_embd_per_layer, 0))) return rc;
    if (c->n_embd_per_layer > c->n_embd)
        return cart_fail(CART_E_UNSUPPORTED, "%s: embedding_length_per_layer_input %d is wider than the model "
                         "(%d), which this engine does not support", ld->path, c->n_embd_per_layer, c->n_embd);
    float softcap = 0.0f;
    if ((rc = get_float_opt(ld, "final_logit_softcapping", &softcap))) return rc;
    if (!(softcap >= 0.0f && isfinite(softcap)))
        return cart_fail(CART_E_FORMAT, "%s: final_logit_softcapping %g is out of range", ld->path, softcap);
    c->final_softcap = softcap;
    if ((rc = model_get_dim_opt0(ld, "expert_count", &c->n_expert)) ||
        (rc = model_get_dim_opt0(ld, "expert_used_count", &c->n_expert_used)))
        return rc;
    if (c->n_expert <= 0) {
        if (c->n_expert_used != 0)
            return cart_fail(CART_E_FORMAT, "%s: expert_used_count %d without expert_count", ld->path,
                             c->n_expert_used);
        return CART_OK;
    }
    int32_t *ffe = cart_calloc((size_t)c->n_layer, sizeof(int32_t), "gemma4 expert sizes");
    if (!ffe) return CART_E_NOMEM;
    rc = get_per_layer(ld, "expert_feed_forward_length", c->n_layer, -1, 1, ffe);
    for (int32_t l = 1; !rc && l < c->n_layer; l++)
        if (ffe[l] != ffe[0])
            rc = cart_fail(CART_E_UNSUPPORTED, "%s: expert_feed_forward_length differs between "
                           "layers (%d at layer 0, %d at layer %d), which this engine does "
                           "not implement", ld->path, ffe[0], ffe[l], l);
    if (!rc) c->n_ff_exp = ffe[0];
    free(ffe);
    if (!rc && (c->n_expert_used < 1 || c->n_expert_used > c->n_expert || c->n_expert > 1024))
        rc = cart_fail(CART_E_FORMAT, "%s: expert_used_count %d must lie in 1..expert_count (%d, "
                       "at most 1024)", ld->path, c->n_expert_used, c->n_expert);
    return rc;
}

/* Each layer's config from the per-layer tables and its kind; the model's
 * own config from its first full layer. */
static int fill_layers(model_loader *ld, cart_model *m, const int32_t *n_ff, const int32_t *n_head,
                       const int32_t *n_head_kv, const int32_t *swa, const gemma4_kinds *k) {
    cart_model_config *c = &m->cfg;
    m->layers = cart_calloc((size_t)c->n_layer, sizeof *m->layers, "model layers");
    if (!m->layers) return CART_E_NOMEM;
    int32_t first_full = -1;
    for (int32_t l = 0; l < c->n_layer; l++) {
        layer_weights *L = &m->layers[l];
        cart_layer_config *g = &L->g;
        g->n_head = n_head[l];
        g->n_head_kv = n_head_kv[l];
        g->head_dim = swa[l] ? k->hd_swa : k->hd_full;
        g->n_rot = swa[l] ? k->n_rot_swa : k->n_rot_full;
        g->n_ff = n_ff[l];
        g->window = swa[l] ? k->n_swa : 0;
        g->rope_theta = swa[l] ? k->theta_swa : k->theta;
        g->attn_scale = 1.0f; /* gemma4 scales nothing (its q/k norms do) */
        L->rope_table = swa[l] ? 1 : 0;
        L->out_scale = 1.0f;
        if (!swa[l] && first_full < 0) first_full = l;
        if (g->n_head % g->n_head_kv != 0 || g->n_head / g->n_head_kv > 16 || g->head_dim > 512 ||
            g->n_rot > g->head_dim || g->n_rot % 2)
            return cart_fail(CART_E_UNSUPPORTED, "%s: layer %d has %d query heads over %d KV heads, "
                             "head_dim %d and %d rotated dims: this engine needs a whole number of "
                             "at most 16 query heads per KV head, head_dim <= 512, and an even "
                             "rotation no wider than the head", ld->path, l, g->n_head, g->n_head_kv,
                             g->head_dim, g->n_rot);
    }
    const layer_weights *R = &m->layers[first_full >= 0 ? first_full : 0];
    c->n_head = R->g.n_head;
    c->n_head_kv = R->g.n_head_kv;
    c->head_dim = k->hd_full;
    c->n_rot = k->n_rot_full;
    c->n_ff = R->g.n_ff;
    c->rope_theta = k->theta;
    c->rope_neox = 1;
    c->qk_norm = 1;
    c->n_swa = k->n_swa;
    c->embd_scale = sqrtf((float)c->n_embd);
    m->rope_n_rot[0] = k->n_rot_full, m->rope_base[0] = k->theta;
    m->rope_n_rot[1] = k->n_rot_swa, m->rope_base[1] = k->theta_swa;
    return CART_OK;
}

/* The per-layer tables (feed-forward width, heads, KV heads, sliding or
 * not), then the kinds, the extras and the layers. */
static int read_layers(model_loader *ld, cart_model *m) {
    const int32_t n_layer = m->cfg.n_layer;
    int32_t *tmp = cart_calloc((size_t)n_layer * 4, sizeof(int32_t), "gemma4 layer table");
    if (!tmp) return CART_E_NOMEM;
    int32_t *n_ff = tmp, *n_head = tmp + n_layer, *n_head_kv = tmp + 2 * n_layer, *swa = tmp + 3 * n_layer;
    int rc;
    if ((rc = get_per_layer(ld, "feed_forward_length", n_layer, -1, 1, n_ff)) ||
        (rc = get_per_layer(ld, "attention.head_count", n_layer, -1, 1, n_head)) ||
        (rc = get_pattern(ld, n_layer, swa)))
        goto done;
    /* KV heads default to the query heads, layer by layer */
    if (cart_gguf_find(ld->g, model_key(ld, "attention.head_count_kv")))
        rc = get_per_layer(ld, "attention.head_count_kv", n_layer, -1, 1, n_head_kv);
    else memcpy(n_head_kv, n_head, sizeof(int32_t) * (size_t)n_layer);
    gemma4_kinds k;
    if (!rc) rc = read_kinds(ld, &m->cfg, n_head[0], &k);
    if (!rc) rc = read_extras(ld, &m->cfg);
    if (!rc) rc = fill_layers(ld, m, n_ff, n_head, n_head_kv, swa, &k);
done:
    free(tmp);
    return rc;
}

int gemma4_read_config(model_loader *ld, cart_model *m) {
    cart_model_config *c = &m->cfg;
    int rc;
    if ((rc = refuse_unknown_keys(ld)) || (rc = check_neutral_keys(ld))) return rc;
    if ((rc = model_get_dim(ld, "block_count", &c->n_layer, 1))) return rc;
    if ((rc = model_get_dim(ld, "embedding_length", &c->n_embd, 1))) return rc;
    if ((rc = model_get_dim(ld, "context_length", &c->n_ctx_train, 1))) return rc;
    if (c->n_layer > 4096)
        return cart_fail(CART_E_FORMAT, "%s: %d layers is beyond this engine's limit (4096)", ld->path,
                         c->n_layer);
    if ((rc = check_layer_count(ld, c->n_layer))) return rc;
    if ((rc = model_get_eps(ld, &c->rms_eps))) return rc;

    uint32_t shared = 0;
    rc = cart_gguf_get_u32(&shared, ld->g, model_key(ld, "attention.shared_kv_layers"));
    if (rc && rc != CART_E_NOT_FOUND) return rc;
    if (shared > 0)
        return cart_fail(CART_E_UNSUPPORTED,
                         "%s: '%s' = %u: the last %u layers reuse earlier layers' K/V (gemma4 "
                         "E2B/E4B), which this engine does not implement; use a gemma4 model "
                         "without KV-shared layers (26B-A4B, 31B)", ld->path, ld->key, shared, shared);
    return read_layers(ld, m);
}

/* A [n_expert, rows, cols] tensor (GGML dims {cols, rows, n_expert}) as
 * n_expert weight views. */
static int load_experts(model_loader *ld, const char *name, int64_t cols, int64_t rows, int32_t n_expert,
                        cart_weight **out, uint64_t *bytes) {
    const cart_gguf_tensor_info *t = model_find_tensor(ld, name);
    if (!t) return cart_fail(CART_E_FORMAT, "%s: missing tensor '%s'", ld->path, name);
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n_expert || t->ne[3] != 1)
        return cart_fail(CART_E_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld] (GGML "
                         "order), expected [%lld, %lld, %d]", ld->path, name, (long long)t->ne[0],
                         (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], (long long)cols,
                         (long long)rows, n_expert);
    cart_weight *w = cart_calloc((size_t)n_expert, sizeof *w, name);
    if (!w) return CART_E_NOMEM;
    *out = w;
    model_claim(ld, t);
    for (int32_t e = 0; e < n_expert; e++) {
        int rc = cart_weight_init(&w[e], t->dtype, NULL, 0, cols);
        if (!rc) {
            uint64_t slice = w[e].row_bytes * (uint64_t)rows;
            rc = cart_weight_init(&w[e], t->dtype, (const uint8_t *)t->data + slice * (uint64_t)e, rows, cols);
        }
        if (rc) return cart_fail_context(rc, "%s: tensor '%s'", ld->path, name);
    }
    *bytes += t->nbytes;
    return CART_OK;
}

/* A [1] tensor's value. */
static int load_scalar(model_loader *ld, const char *name, float *out, uint64_t *bytes) {
    float *v = NULL;
    int rc = model_load_vector(ld, name, 1, &v, bytes);
    if (rc) return rc;
    *out = v[0];
    free(v);
    return CART_OK;
}

int gemma4_load_weights(cart_model *m, model_loader *ld) {
    const cart_model_config *c = &m->cfg;
    const int64_t E = c->n_embd, Ep = c->n_embd_per_layer, NL = c->n_layer;
    uint64_t *bytes = &m->weight_bytes;
    int rc;
    int any_full = 0;
    for (int32_t l = 0; l < c->n_layer; l++) any_full |= m->layers[l].g.window == 0;
    if (any_full) {
        if ((rc = model_load_vector(ld, "rope_freqs.weight", c->head_dim / 2, &m->rope_freqs, bytes)))
            return rc;
        for (int64_t i = 0; i < c->head_dim / 2; i++)
            if (!(m->rope_freqs[i] > 0.0f))
                return cart_fail(CART_E_FORMAT, "%s: rope_freqs.weight[%lld] = %g; RoPE divides by it, "
                                 "so it must be positive", ld->path, (long long)i, m->rope_freqs[i]);
    }
    if (Ep > 0) {
        if ((rc = model_load_weight(ld, "per_layer_token_embd.weight", Ep * NL, c->n_vocab, &m->pl_tok_embd, bytes)) ||
            (rc = model_load_weight(ld, "per_layer_model_proj.weight", E, Ep * NL, &m->pl_model_proj, bytes)) ||
            (rc = model_load_vector(ld, "per_layer_proj_norm.weight", Ep, &m->pl_proj_norm, bytes)))
            return rc;
    }
    char name[96];
    for (int32_t l = 0; l < c->n_layer; l++) {
        layer_weights *L = &m->layers[l];
        const int64_t D = L->g.head_dim, HD = (int64_t)L->g.n_head * D, KD = (int64_t)L->g.n_head_kv * D;
        const int64_t F = L->g.n_ff;
        L->rope_ff = L->g.window == 0 ? m->rope_freqs : NULL;
#define NAME(part) (snprintf(name, sizeof name, "blk.%d." part, (int)l), name)
        if ((rc = model_load_vector(ld, NAME("attn_norm.weight"), E, &L->attn_norm, bytes)) ||
            (rc = model_load_weight(ld, NAME("attn_q.weight"), E, HD, &L->wq, bytes)) ||
            (rc = model_load_weight(ld, NAME("attn_k.weight"), E, KD, &L->wk, bytes)) ||
            (rc = model_load_weight(ld, NAME("attn_output.weight"), HD, E, &L->wo, bytes)) ||
            (rc = model_load_vector(ld, NAME("attn_q_norm.weight"), D, &L->q_norm, bytes)) ||
            (rc = model_load_vector(ld, NAME("attn_k_norm.weight"), D, &L->k_norm, bytes)) ||
            (rc = model_load_vector(ld, NAME("post_attention_norm.weight"), E, &L->post_attn_norm, bytes)) ||
            (rc = model_load_vector(ld, NAME("ffn_norm.weight"), E, &L->ffn_norm, bytes)) ||
            (rc = model_load_weight(ld, NAME("ffn_gate.weight"), E, F, &L->wgate, bytes)) ||
            (rc = model_load_weight(ld, NAME("ffn_up.weight"), E, F, &L->wup, bytes)) ||
            (rc = model_load_weight(ld, NAME("ffn_down.weight"), F, E, &L->wdown, bytes)) ||
            (rc = model_load_vector(ld, NAME("post_ffw_norm.weight"), E, &L->post_ffn_norm, bytes)))
            return rc;
        /* without attn_v the values are the keys' projection (llama.cpp's
         * use_alternative_attention) */
        if (model_find_tensor(ld, NAME("attn_v.weight"))) {
            if ((rc = model_load_weight(ld, name, E, KD, &L->wv, bytes))) return rc;
        } else if ((rc = cart_weight_init(&L->wv, L->wk.dtype, NULL, 0, E))) {
            return rc;
        }
        if (model_find_tensor(ld, NAME("layer_output_scale.weight")) &&
            (rc = load_scalar(ld, name, &L->out_scale, bytes)))
            return rc;
        if (model_find_tensor(ld, NAME("ffn_gate_inp.weight"))) {
            if (c->n_expert < 1)
                return cart_fail(CART_E_FORMAT, "%s: '%s' is present but gemma4.expert_count is not set",
                                 ld->path, name);
            const int64_t FE = c->n_ff_exp;
            L->g.moe = 1;
            if ((rc = model_load_weight(ld, name, E, c->n_expert, &L->router, bytes)) ||
                (rc = model_load_vector(ld, NAME("ffn_gate_inp.scale"), E, &L->router_scale, bytes)) ||
                (rc = model_load_vector(ld, NAME("pre_ffw_norm_2.weight"), E, &L->pre_ffn_norm_2, bytes)) ||
                (rc = model_load_vector(ld, NAME("post_ffw_norm_1.weight"), E, &L->post_ffn_norm_1, bytes)) ||
                (rc = model_load_vector(ld, NAME("post_ffw_norm_2.weight"), E, &L->post_ffn_norm_2, bytes)) ||
                (rc = load_experts(ld, NAME("ffn_down_exps.weight"), FE, E, c->n_expert, &L->exp_down, bytes)))
                return rc;
            /* gate and up as two tensors, or merged (converters write
             * ffn_gate_up_exps: each expert's gate rows, then its up rows) */
            if (model_find_tensor(ld, NAME("ffn_gate_up_exps.weight"))) {
                cart_weight *both = NULL;
                if ((rc = load_experts(ld, name, E, 2 * FE, c->n_expert, &both, bytes))) {
                    free(both);
                    return rc;
                }
                L->exp_gate = both;
                L->exp_up = cart_calloc((size_t)c->n_expert, sizeof *L->exp_up, name);
                if (!L->exp_up) return CART_E_NOMEM;
                for (int32_t e = 0; e < c->n_expert; e++) {
                    const uint8_t *slice = both[e].data;
                    const uint64_t half = both[e].row_bytes * (uint64_t)FE;
                    if ((rc = cart_weight_init(&L->exp_gate[e], both[e].dtype, slice, FE, E)) ||
                        (rc = cart_weight_init(&L->exp_up[e], both[e].dtype, slice + half, FE, E)))
                        return rc;
                }
            } else if ((rc = load_experts(ld, NAME("ffn_gate_exps.weight"), E, FE, c->n_expert, &L->exp_gate, bytes)) ||
                       (rc = load_experts(ld, NAME("ffn_up_exps.weight"), E, FE, c->n_expert, &L->exp_up, bytes))) {
                return rc;
            }
            if (model_find_tensor(ld, NAME("ffn_down_exps.scale")) &&
                (rc = model_load_vector(ld, name, c->n_expert, &L->exp_scale, bytes)))
                return rc;
        }
        if (Ep > 0 &&
            ((rc = model_load_weight(ld, NAME("inp_gate.weight"), E, Ep, &L->pl_gate, bytes)) ||
             (rc = model_load_weight(ld, NAME("proj.weight"), Ep, E, &L->pl_proj, bytes)) ||
             (rc = model_load_vector(ld, NAME("post_norm.weight"), E, &L->pl_post_norm, bytes))))
            return rc;
#undef NAME
    }
    return CART_OK;
}

void gemma4_free_layer(layer_weights *L) {
    free(L->post_attn_norm);
    free(L->post_ffn_norm);
    free(L->pl_post_norm);
    free(L->router_scale);
    free(L->pre_ffn_norm_2);
    free(L->post_ffn_norm_1);
    free(L->post_ffn_norm_2);
    free(L->exp_gate);
    free(L->exp_up);
    free(L->exp_down);
    free(L->exp_scale);
}

static int load_layers(cart_model *m, model_loader *ld) {
    uint32_t vocab = 0;
    int rc = cart_gguf_get_u32(&vocab, ld->g, "gemma4.vocab_size");
    if (rc && rc != CART_E_NOT_FOUND) return rc;
    if (!rc && vocab != (uint32_t)m->cfg.n_vocab)
        return cart_fail(CART_E_FORMAT, "%s: gemma4.vocab_size %u differs from token_embd's %d rows",
                         ld->path, vocab, m->cfg.n_vocab);
    return gemma4_load_weights(m, ld);
}

/* The FFN's output on its way into the residual: the dense branch f (on
 * MoE layers post_ffw_norm_1(f) + post_ffw_norm_2(msum)) through
 * post_ffw_norm, added to x_mid into x_post. */
static void ffn_residual(const layer_exec *ex, const cart_model *m, const layer_weights *L, const layer_io *io,
                         int64_t T) {
    const int64_t E = m->cfg.n_embd;
    const float eps = m->cfg.rms_eps;
    if (L->g.moe) {
        layer_norm(ex, io->fs, io->f_rstd, io->f, L->post_ffn_norm_1, T, E, eps);
        layer_norm(ex, io->mn, io->m_rstd, io->msum, L->post_ffn_norm_2, T, E, eps);
        layer_add(ex, io->fs, io->fs, io->mn, T * E);
    } else if (io->fs != io->f) {
        memcpy(io->fs, io->f, sizeof(float) * (size_t)(T * E));
    }
    layer_norm(ex, io->fn, io->fs_rstd, io->fs, L->post_ffn_norm, T, E, eps);
    layer_add(ex, io->x_post, io->fn, io->x_mid, T * E);
}

/* x_out += per_layer_post_norm(proj(gelu(inp_gate(x_post)) * the layer's
 * per-layer input)). */
static int per_layer_input(const layer_exec *ex, const cart_model *m, int32_t layer, const layer_io *io,
                           int64_t T) {
    const layer_weights *L = &m->layers[layer];
    const int64_t E = m->cfg.n_embd, Ep = m->cfg.n_embd_per_layer, PL = (int64_t)m->cfg.n_layer * Ep;
    int rc;
    if ((rc = layer_linear1(ex, io->pl_g, Ep, io->x_post, E, &L->pl_gate))) return rc;
    for (int64_t t = 0; t < T; t++)
        layer_geglu(ex, io->pl_h + t * Ep, io->pl_g + t * Ep, io->pl_in + t * PL + (int64_t)layer * Ep, Ep);
    if ((rc = layer_linear1(ex, io->pl_r, E, io->pl_h, Ep, &L->pl_proj))) return rc;
    layer_norm(ex, io->pn, io->pl_rstd, io->pl_r, L->pl_post_norm, T, E, m->cfg.rms_eps);
    layer_add(ex, io->x_out, io->x_out, io->pn, T * E);
    return CART_OK;
}

/* The block: attention with the norms after it, the MoE branch (MoE
 * layers) before the dense GEGLU FFN, the per-layer input, the output
 * scale. */
static int layer_forward(const layer_exec *ex, const cart_model *m, int32_t layer, const layer_io *io,
                         int64_t T) {
    const cart_model_config *c = &m->cfg;
    const layer_weights *L = &m->layers[layer];
    const int64_t E = c->n_embd, F = L->g.n_ff;
    int rc;
    if ((rc = layer_attention(ex, m, layer, io, T))) return rc;
    layer_norm(ex, io->on, io->o_rstd, io->o, L->post_attn_norm, T, E, c->rms_eps);
    layer_add(ex, io->x_mid, io->on, io->x_in, T * E);
    if (L->g.moe) {
        layer_norm(ex, io->xm, io->xm_rstd, io->x_mid, L->pre_ffn_norm_2, T, E, c->rms_eps);
        if ((rc = ex->moe(ex->ctx))) return rc;
    }
    layer_norm(ex, io->xn2, io->rstd2, io->x_mid, L->ffn_norm, T, E, c->rms_eps);
    if ((rc = layer_gate_up(ex, m, layer, io))) return rc;
    layer_geglu(ex, io->h, io->gate, io->up, T * F);
    if ((rc = layer_linear1(ex, io->f, E, io->h, F, &L->wdown))) return rc;
    ffn_residual(ex, m, L, io, T);
    if (io->x_out != io->x_post) memcpy(io->x_out, io->x_post, sizeof(float) * (size_t)(T * E));
    if (c->n_embd_per_layer > 0 && (rc = per_layer_input(ex, m, layer, io, T))) return rc;
    if (L->out_scale != 1.0f)
        for (int64_t i = 0; i < T * E; i++) io->x_out[i] *= L->out_scale;
    return CART_OK;
}

const arch_ops arch_gemma4 = {CART_ARCH_GEMMA4, "gemma4", gemma4_read_config, load_layers, layer_forward};
