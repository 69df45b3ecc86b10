/*
 * model.c - loading qwen3 / llama GGUFs and the batched forward pass.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "cpu.h"
#include "internal.h"
#include "model.h"
#include "model_internal.h"
#include "ops.h"
#include "pool.h"

static const char *arch_names[] = {NULL, "llama", "qwen3"};

/* ---- loading -------------------------------------------------------------- */

typedef struct loader {
    cart_gguf *g;
    const char *path;
    const char *arch;
    char key[256];
} loader;

static const char *arch_key(loader *ld, const char *suffix) {
    snprintf(ld->key, sizeof ld->key, "%s.%s", ld->arch, suffix);
    return ld->key;
}

/* A required positive integer hyperparameter. */
static int get_dim(loader *ld, const char *suffix, int32_t *out) {
    uint32_t v = 0;
    const char *key = arch_key(ld, suffix);
    int rc = cart_gguf_get_u32(&v, ld->g, key);
    if (rc == CART_E_NOT_FOUND)
        return cart_fail(CART_E_FORMAT, "%s: missing hyperparameter '%s'", ld->path, key);
    if (rc) return rc;
    if (v == 0 || v > (1u << 30))
        return cart_fail(CART_E_FORMAT, "%s: hyperparameter '%s' = %u is out of range", ld->path,
                         key, v);
    *out = (int32_t)v;
    return CART_OK;
}

/* An optional integer: *out keeps its default when absent. */
static int get_dim_opt(loader *ld, const char *suffix, int32_t *out) {
    if (!cart_gguf_find(ld->g, arch_key(ld, suffix))) return CART_OK;
    return get_dim(ld, suffix, out);
}

/* Keys whose presence means a feature this engine does not implement. */
static int reject_unsupported_keys(loader *ld) {
    static const char *const unsupported[] = {
        "rope.scaling.type",       "rope.scaling.factor",       "rope.scale_linear",
        "rope.scaling.original_context_length", "attention.sliding_window",
        "attention.clamp_kqv",     "expert_count",              "expert_used_count",
        "attention.max_alibi_bias", "logit_scale",              "rope.dimension_sections",
        "attention.layer_indices", "final_logit_softcapping",   "attn_logit_softcapping",
    };
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        const char *key = arch_key(ld, unsupported[i]);
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

static int read_config(loader *ld, cart_model_config *c) {
    memset(c, 0, sizeof *c);
    cart_str arch;
    int rc = cart_gguf_get_str(&arch, ld->g, "general.architecture");
    if (rc == CART_E_NOT_FOUND)
        return cart_fail(CART_E_FORMAT, "%s: no 'general.architecture' key", ld->path);
    if (rc) return rc;
    if (arch.len == 5 && memcmp(arch.data, "qwen3", 5) == 0) c->arch = CART_ARCH_QWEN3;
    else if (arch.len == 5 && memcmp(arch.data, "llama", 5) == 0) c->arch = CART_ARCH_LLAMA;
    else
        return cart_fail(CART_E_UNSUPPORTED,
                         "%s: architecture '%.*s' is not supported (supported: qwen3, llama)",
                         ld->path, (int)(arch.len > 64 ? 64 : arch.len), arch.data);
    ld->arch = arch_names[c->arch];

    if ((rc = get_dim(ld, "block_count", &c->n_layer))) return rc;
    if ((rc = get_dim(ld, "embedding_length", &c->n_embd))) return rc;
    if ((rc = get_dim(ld, "feed_forward_length", &c->n_ff))) return rc;
    if ((rc = get_dim(ld, "attention.head_count", &c->n_head))) return rc;
    c->n_head_kv = c->n_head;
    if ((rc = get_dim_opt(ld, "attention.head_count_kv", &c->n_head_kv))) return rc;
    c->head_dim = c->n_embd / c->n_head;
    if ((rc = get_dim_opt(ld, "attention.key_length", &c->head_dim))) return rc;
    int32_t value_length = c->head_dim;
    if ((rc = get_dim_opt(ld, "attention.value_length", &value_length))) return rc;
    if (value_length != c->head_dim)
        return cart_fail(CART_E_UNSUPPORTED, "%s: attention.value_length %d differs from "
                         "key_length %d, which this engine does not support", ld->path,
                         value_length, c->head_dim);
    c->n_rot = c->head_dim;
    if ((rc = get_dim_opt(ld, "rope.dimension_count", &c->n_rot))) return rc;
    if ((rc = get_dim(ld, "context_length", &c->n_ctx_train))) return rc;

    float eps = 0.0f;
    rc = cart_gguf_get_f32(&eps, ld->g, arch_key(ld, "attention.layer_norm_rms_epsilon"));
    if (rc == CART_E_NOT_FOUND)
        return cart_fail(CART_E_FORMAT, "%s: missing hyperparameter '%s'", ld->path, ld->key);
    if (rc) return rc;
    if (!(eps > 0.0f && eps < 1.0f))
        return cart_fail(CART_E_FORMAT, "%s: '%s' = %g is out of range", ld->path, ld->key, eps);
    c->rms_eps = eps;
    c->rope_theta = 10000.0f;
    rc = cart_gguf_get_f32(&c->rope_theta, ld->g, arch_key(ld, "rope.freq_base"));
    if (rc && rc != CART_E_NOT_FOUND) return rc;
    if (!(c->rope_theta > 1.0f))
        return cart_fail(CART_E_FORMAT, "%s: '%s' = %g is out of range", ld->path, ld->key,
                         c->rope_theta);
    c->rope_neox = c->arch == CART_ARCH_QWEN3;

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
    return reject_unsupported_keys(ld);
}

/* Looks up a tensor and checks its GGML dims (ne0 = row length). */
static int find_matrix(loader *ld, const char *name, int64_t ne0, int64_t ne1,
                       const cart_gguf_tensor_info **out) {
    const cart_gguf_tensor_info *t = cart_gguf_find_tensor(ld->g, name);
    *out = t;
    if (!t) return cart_fail(CART_E_FORMAT, "%s: missing tensor '%s'", ld->path, name);
    int64_t want_dims = ne1 > 0 ? 2 : 1;
    int ok = t->ne[0] == ne0 && (ne1 <= 0 || t->ne[1] == ne1) && t->ne[2] == 1 && t->ne[3] == 1 &&
             (t->n_dims == want_dims || (want_dims == 1 && t->ne[1] == 1));
    if (!ok) {
        if (ne1 > 0)
            return cart_fail(CART_E_FORMAT,
                             "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld] (GGML order), "
                             "expected [%lld, %lld]", ld->path, name, (long long)t->ne[0],
                             (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                             (long long)ne0, (long long)ne1);
        return cart_fail(CART_E_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], "
                         "expected [%lld]", ld->path, name, (long long)t->ne[0],
                         (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                         (long long)ne0);
    }
    cart_dtype_info info;
    if (cart_dtype_get_info(&info, t->dtype) != CART_OK || !info.can_dequantize ||
        t->dtype == CART_I8 || t->dtype == CART_I16 || t->dtype == CART_I32 ||
        t->dtype == CART_I64)
        return cart_fail(CART_E_UNSUPPORTED, "%s: tensor '%s' has type %s, which this engine "
                         "cannot compute with", ld->path, name,
                         cart_dtype_name(t->dtype) ? cart_dtype_name(t->dtype) : "(unknown)");
    return CART_OK;
}

static int load_weight(loader *ld, const char *name, int64_t cols, int64_t rows, cart_weight *w,
                       uint64_t *bytes) {
    const cart_gguf_tensor_info *t;
    int rc = find_matrix(ld, name, cols, rows, &t);
    if (rc) return rc;
    rc = cart_weight_init(w, t->dtype, t->data, rows, cols);
    if (rc) return cart_fail_context(rc, "%s: tensor '%s'", ld->path, name);
    *bytes += t->nbytes;
    return CART_OK;
}

static int load_vector(loader *ld, const char *name, int64_t n, float **out, uint64_t *bytes) {
    const cart_gguf_tensor_info *t;
    int rc = find_matrix(ld, name, n, 0, &t);
    if (rc) return rc;
    float *v = cart_malloc((size_t)n * sizeof(float), name);
    if (!v) return CART_E_NOMEM;
    rc = cart_to_f32(v, t->dtype, t->data, n);
    if (rc) {
        free(v);
        return cart_fail_context(rc, "%s: tensor '%s'", ld->path, name);
    }
    *out = v;
    *bytes += t->nbytes;
    return CART_OK;
}

/* Every tensor in the file must be one the model uses (llama.cpp refuses
 * extra tensors too: they mean a different architecture variant). */
static int check_no_extra_tensors(loader *ld, int64_t expected) {
    int64_t n = cart_gguf_tensor_count(ld->g);
    if (n == expected) return CART_OK;
    /* find one that is not ours to name it */
    for (int64_t i = 0; i < n; i++) {
        const cart_gguf_tensor_info *t = cart_gguf_tensor_at(ld->g, i);
        const char *known[] = {"token_embd.weight", "output_norm.weight", "output.weight"};
        int ok = 0;
        for (size_t j = 0; j < 3; j++)
            if (t->name.len == strlen(known[j]) && memcmp(t->name.data, known[j], t->name.len) == 0)
                ok = 1;
        int layer = -1, used = 0;
        char suffix[64];
        if (!ok && t->name.len < 96) {
            char name[128];
            memcpy(name, t->name.data, t->name.len);
            name[t->name.len] = '\0';
            if (sscanf(name, "blk.%d.%63s%n", &layer, suffix, &used) == 2 && used == (int)t->name.len) {
                static const char *const parts[] = {
                    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                    "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight",
                    "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
                for (size_t j = 0; j < sizeof parts / sizeof parts[0]; j++)
                    if (strcmp(suffix, parts[j]) == 0) ok = 1;
            }
        }
        if (!ok)
            return cart_fail(CART_E_UNSUPPORTED, "%s: tensor '%.*s' is not part of the %s "
                             "architecture this engine implements", ld->path, (int)t->name.len,
                             t->name.data, ld->arch);
    }
    return cart_fail(CART_E_FORMAT, "%s: %lld tensors, expected %lld", ld->path, (long long)n,
                     (long long)expected);
}

static void free_layers(cart_model *m) {
    if (!m->layers) return;
    for (int32_t l = 0; l < m->cfg.n_layer; l++) {
        layer_weights *L = &m->layers[l];
        free(L->attn_norm);
        free(L->ffn_norm);
        free(L->q_norm);
        free(L->k_norm);
        if (m->widened) {
            cart_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wgate, &L->wup, &L->wdown};
            for (size_t i = 0; i < 7; i++) cart_weight_free_data(ws[i]);
        }
    }
    free(m->layers);
    m->layers = NULL;
}

void cart_model_free(cart_model *m) {
    if (!m) return;
    free_layers(m);
    free(m->output_norm);
    if (m->widened) {
        if (!m->cfg.tied_output) cart_weight_free_data(&m->output);
        cart_weight_free_data(&m->tok_embd);
    }
    cart_gguf_close(m->gguf);
    free(m);
}

/* Replaces *w by an f32 copy, counting the bytes. */
static int widen(cart_weight *w, uint64_t *bytes) {
    cart_weight wide;
    int rc = cart_weight_widen(&wide, w, cart_default_pool());
    if (rc) return rc;
    *w = wide;
    *bytes += (uint64_t)wide.rows * (uint64_t)wide.cols * 4;
    return CART_OK;
}

static int load_weights(cart_model *m, loader *ld, const cart_model_options *opts) {
    const cart_model_config *c = &m->cfg;
    int64_t E = c->n_embd, F = c->n_ff, D = c->head_dim;
    int64_t HD = (int64_t)c->n_head * D, KD = (int64_t)c->n_head_kv * D;
    uint64_t *bytes = &m->weight_bytes;
    int rc;

    const cart_gguf_tensor_info *emb = cart_gguf_find_tensor(ld->g, "token_embd.weight");
    if (!emb) return cart_fail(CART_E_FORMAT, "%s: missing tensor 'token_embd.weight'", ld->path);
    if (emb->ne[1] < 1 || emb->ne[1] > INT32_MAX)
        return cart_fail(CART_E_FORMAT, "%s: token_embd.weight has %lld rows", ld->path,
                         (long long)emb->ne[1]);
    m->cfg.n_vocab = (int32_t)emb->ne[1];
    if ((rc = load_weight(ld, "token_embd.weight", E, c->n_vocab, &m->tok_embd, bytes))) return rc;
    if ((rc = load_vector(ld, "output_norm.weight", E, &m->output_norm, bytes))) return rc;
    int64_t expected = 2;
    if (cart_gguf_find_tensor(ld->g, "output.weight")) {
        if ((rc = load_weight(ld, "output.weight", E, c->n_vocab, &m->output, bytes))) return rc;
        expected++;
    } else {
        m->cfg.tied_output = 1;
        m->output = m->tok_embd;
    }

    m->layers = cart_calloc((size_t)c->n_layer, sizeof *m->layers, "model layers");
    if (!m->layers) return CART_E_NOMEM;
    m->cfg.qk_norm = c->arch == CART_ARCH_QWEN3;
    char name[96];
    for (int32_t l = 0; l < c->n_layer; l++) {
        layer_weights *L = &m->layers[l];
#define NAME(part) (snprintf(name, sizeof name, "blk.%d." part, (int)l), name)
        if ((rc = load_vector(ld, NAME("attn_norm.weight"), E, &L->attn_norm, bytes))) return rc;
        if ((rc = load_vector(ld, NAME("ffn_norm.weight"), E, &L->ffn_norm, bytes))) return rc;
        if ((rc = load_weight(ld, NAME("attn_q.weight"), E, HD, &L->wq, bytes))) return rc;
        if ((rc = load_weight(ld, NAME("attn_k.weight"), E, KD, &L->wk, bytes))) return rc;
        if ((rc = load_weight(ld, NAME("attn_v.weight"), E, KD, &L->wv, bytes))) return rc;
        if ((rc = load_weight(ld, NAME("attn_output.weight"), HD, E, &L->wo, bytes))) return rc;
        if ((rc = load_weight(ld, NAME("ffn_gate.weight"), E, F, &L->wgate, bytes))) return rc;
        if ((rc = load_weight(ld, NAME("ffn_up.weight"), E, F, &L->wup, bytes))) return rc;
        if ((rc = load_weight(ld, NAME("ffn_down.weight"), F, E, &L->wdown, bytes))) return rc;
        expected += 9;
        if (m->cfg.qk_norm) {
            if ((rc = load_vector(ld, NAME("attn_q_norm.weight"), D, &L->q_norm, bytes))) return rc;
            if ((rc = load_vector(ld, NAME("attn_k_norm.weight"), D, &L->k_norm, bytes))) return rc;
            expected += 2;
        }
#undef NAME
    }
    if ((rc = check_no_extra_tensors(ld, expected))) return rc;

    if (opts && opts->widen_f32) {
        m->widened = 1;
        uint64_t *wb = &m->widened_bytes;
        if ((rc = widen(&m->tok_embd, wb))) return rc;
        if (m->cfg.tied_output) m->output = m->tok_embd;
        else if ((rc = widen(&m->output, wb))) return rc;
        for (int32_t l = 0; l < c->n_layer; l++) {
            layer_weights *L = &m->layers[l];
            cart_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wgate, &L->wup, &L->wdown};
            for (size_t i = 0; i < 7; i++)
                if ((rc = widen(ws[i], wb))) return rc;
        }
    }
    return CART_OK;
}

int cart_model_load(cart_model **out, const char *path, const cart_model_options *opts) {
    *out = NULL;
    if (cart_isa_init() != CART_OK) return cart_fail_context(cart_last_status(), "%s", path);
    cart_model *m = cart_calloc(1, sizeof *m, "model");
    if (!m) return CART_E_NOMEM;
    int rc = cart_gguf_open(&m->gguf, path);
    if (rc) {
        free(m);
        return rc;
    }
    loader ld = {.g = m->gguf, .path = path};
    if ((rc = read_config(&ld, &m->cfg)) || (rc = load_weights(m, &ld, opts))) {
        cart_model_free(m);
        return rc;
    }
    *out = m;
    return CART_OK;
}

const cart_model_config *cart_model_get_config(const cart_model *m) {
    return &m->cfg;
}

const cart_gguf *cart_model_gguf(const cart_model *m) {
    return m->gguf;
}

uint64_t cart_model_weight_bytes(const cart_model *m) {
    return m->weight_bytes;
}

uint64_t cart_model_widened_bytes(const cart_model *m) {
    return m->widened_bytes;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t cart_model_fingerprint(const cart_model *m) {
    uint64_t h = 0xcbf29ce484222325ULL;
    const cart_model_config *c = &m->cfg;
    int32_t dims[] = {c->arch, c->n_layer, c->n_embd, c->n_ff, c->n_head, c->n_head_kv,
                      c->head_dim, c->n_rot, c->n_vocab, c->rope_neox, c->qk_norm, c->tied_output};
    h = fnv1a(h, dims, sizeof dims);
    h = fnv1a(h, &c->rms_eps, sizeof c->rms_eps);
    h = fnv1a(h, &c->rope_theta, sizeof c->rope_theta);
    for (int64_t i = 0; i < cart_gguf_tensor_count(m->gguf); i++) {
        const cart_gguf_tensor_info *t = cart_gguf_tensor_at(m->gguf, i);
        h = fnv1a(h, t->name.data, (size_t)t->name.len);
        h = fnv1a(h, &t->dtype, sizeof t->dtype);
        h = fnv1a(h, t->ne, sizeof t->ne);
        size_t n = (size_t)t->nbytes, edge = n < 4096 ? n : 4096;
        h = fnv1a(h, t->data, edge);
        if (n > edge) h = fnv1a(h, (const uint8_t *)t->data + n - edge, edge);
    }
    return h;
}

int cart_model_new_kv(cart_kv **out, const cart_model *m, int64_t capacity, int32_t dtype) {
    return cart_kv_new(out, m->cfg.n_layer, m->cfg.n_head_kv, m->cfg.head_dim, capacity, dtype);
}

/* ---- forward -------------------------------------------------------------- */

typedef struct forward_state {
    const cart_model *m;
    const cart_model_config *c;
    int64_t T;       /* tokens in the pass */
    float *x;        /* [T, E] residual stream */
    float *xn;       /* [T, E] normed input of a block */
    float *q;        /* [T, H*D] */
    float *k;        /* [T, KV*D] */
    float *v;        /* [T, KV*D] */
    float *att;      /* [T, H*D] attention output */
    float *gate;     /* [T, F] */
    float *up;       /* [T, F] */
    float *tmp;      /* [T, E] */
    float *angles;   /* [T, n_rot] cos/sin pairs per token */
    int64_t *pos;    /* [T] position of each token */
    int32_t *stream; /* [T] stream of each token */
    int64_t *block_start; /* attention blocks: up to 16 consecutive tokens of one stream */
    int32_t *block_len;
    int64_t n_blocks;
    /* matmul runs: consecutive streams whose token counts take the same
     * path on their own (matmul.h), so each stream gets its own bits */
    int64_t *run_start, *run_len; /* [n_runs] first token and tokens */
    int32_t *run_path;            /* [n_runs] cart_mm_path */
    int32_t n_runs;
    int64_t *stream_logits;       /* [n_streams] logit rows each stream asked for */
    cart_kv *const *kvs;
    int32_t layer;
    float *arena;    /* the allocation behind all of the above */
} forward_state;

/* q/k norm and RoPE for tokens [begin, end). */
static void qk_prepare_range(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    forward_state *s = ctx;
    const cart_model_config *c = s->c;
    const layer_weights *L = &s->m->layers[s->layer];
    int64_t D = c->head_dim;
    for (int64_t t = begin; t < end; t++) {
        float *qt = s->q + t * c->n_head * D, *kt = s->k + t * c->n_head_kv * D;
        qk_prepare_forward(qt, kt, NULL, NULL, qt, kt, c->qk_norm ? L->q_norm : NULL,
                           c->qk_norm ? L->k_norm : NULL, s->angles + t * c->n_rot, c->n_head,
                           c->n_head_kv, (int32_t)D, c->n_rot, c->rope_neox, c->rms_eps);
    }
}

/* Attention for work items [begin, end): item = block * n_head_kv + kv head,
 * where a block is up to 16 consecutive tokens of one stream. */
static void attention_range(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    forward_state *s = ctx;
    const cart_model_config *c = s->c;
    int64_t D = c->head_dim, KV = c->n_head_kv, rep = c->n_head / c->n_head_kv;
    int64_t HD = (int64_t)c->n_head * D;
    float scale = 1.0f / sqrtf((float)D);
    for (int64_t item = begin; item < end; item++) {
        int64_t b = item / KV, g = item % KV;
        int64_t t = s->block_start[b];
        cart_kv *kv = s->kvs[s->stream[t]];
        int32_t dtype = cart_kv_dtype(kv);
        size_t el = dtype == CART_F16 ? 2 : 4;
        const uint8_t *krows = cart_kv_rows(kv, s->layer, 0);
        const uint8_t *vrows = cart_kv_rows(kv, s->layer, 1);
        attention_forward(s->att + t * HD + g * rep * D, s->q + t * HD + g * rep * D, HD,
                          s->block_len[b], krows + (size_t)(g * D) * el,
                          vrows + (size_t)(g * D) * el, dtype, s->pos[t] + 1, KV * D, (int32_t)rep,
                          1, (int32_t)D, scale);
    }
}

/* Checks a pass's arguments before anything touches a cache; sets *T, the
 * tokens of the pass. */
static int forward_check(const cart_model *m, cart_kv *const *kvs, int32_t n_streams, const int32_t *tokens,
                         const int64_t *n_tokens, const int64_t *logit_rows, int64_t n_logit_rows,
                         int64_t *T_out) {
    const cart_model_config *c = &m->cfg;
    if (n_streams < 1)
        return cart_fail(CART_E_ARG, "cart_model_forward: %d streams", (int)n_streams);
    /* validate everything before touching a cache */
    int64_t T = 0;
    for (int32_t b = 0; b < n_streams; b++) {
        cart_kv *kv = kvs[b];
        if (!kv) return cart_fail(CART_E_ARG, "cart_model_forward: stream %d has no cache", b);
        if (cart_kv_n_layer(kv) != c->n_layer || cart_kv_heads(kv) != c->n_head_kv ||
            cart_kv_head_dim(kv) != c->head_dim)
            return cart_fail(CART_E_ARG, "cart_model_forward: stream %d's cache is shaped %d "
                             "layers x %d heads x %d, the model needs %d x %d x %d", b,
                             cart_kv_n_layer(kv), cart_kv_heads(kv), cart_kv_head_dim(kv),
                             c->n_layer, c->n_head_kv, c->head_dim);
        if (n_tokens[b] < 0)
            return cart_fail(CART_E_ARG, "cart_model_forward: stream %d has %lld tokens", b,
                             (long long)n_tokens[b]);
        if (n_tokens[b] > cart_kv_capacity(kv) - cart_kv_len(kv))
            return cart_fail(CART_E_ARG, "cart_model_forward: stream %d: %lld new tokens after "
                             "%lld cached do not fit its context of %lld", b,
                             (long long)n_tokens[b], (long long)cart_kv_len(kv),
                             (long long)cart_kv_capacity(kv));
        for (int32_t o = 0; o < b; o++)
            if (kvs[o] == kv && n_tokens[b] > 0 && n_tokens[o] > 0)
                return cart_fail(CART_E_ARG, "cart_model_forward: streams %d and %d share a cache",
                                 o, b);
        T += n_tokens[b];
    }
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->n_vocab)
            return cart_fail(CART_E_ARG, "cart_model_forward: token %lld is id %d, outside the "
                             "vocabulary of %d", (long long)t, tokens[t], c->n_vocab);
    for (int64_t j = 0; j < n_logit_rows; j++)
        if (logit_rows[j] < 0 || logit_rows[j] >= T)
            return cart_fail(CART_E_ARG, "cart_model_forward: logit row %lld asks for token %lld "
                             "of %lld", (long long)j, (long long)logit_rows[j], (long long)T);
    *T_out = T;
    return CART_OK;
}

/* Lays the pass's activations and index arrays out over one allocation
 * (s->arena, freed by the caller), assigns every token its stream, position
 * and attention block, and embeds the tokens into s->x. */
static int forward_setup(forward_state *s, const int32_t *tokens, const int64_t *n_tokens, int32_t n_streams) {
    const cart_model *m = s->m;
    const cart_model_config *c = s->c;
    const int64_t T = s->T, E = c->n_embd, F = c->n_ff, D = c->head_dim;
    const int64_t HD = (int64_t)c->n_head * D, KD = (int64_t)c->n_head_kv * D;
    size_t floats = (size_t)T * (size_t)(3 * E + HD * 2 + KD * 2 + 2 * F + c->n_rot);
    size_t bytes = floats * sizeof(float) + (size_t)T * (2 * sizeof(int64_t) + 2 * sizeof(int32_t)) +
                   (size_t)n_streams * (3 * sizeof(int64_t) + sizeof(int32_t)) + 64;
    s->arena = cart_malloc(bytes, "forward activations");
    if (!s->arena) return CART_E_NOMEM;
    float *p = s->arena; /* floats first, then the index arrays */
    s->x = cart_carve(&p, T * E);
    s->xn = cart_carve(&p, T * E);
    s->tmp = cart_carve(&p, T * E);
    s->q = cart_carve(&p, T * HD);
    s->att = cart_carve(&p, T * HD);
    s->k = cart_carve(&p, T * KD);
    s->v = cart_carve(&p, T * KD);
    s->gate = cart_carve(&p, T * F);
    s->up = cart_carve(&p, T * F);
    s->angles = cart_carve(&p, T * c->n_rot);
    s->pos = (int64_t *)p;
    s->block_start = s->pos + T;
    s->stream = (int32_t *)(s->block_start + T);
    s->block_len = s->stream + T;
    s->run_start = (int64_t *)(s->block_len + T);
    s->run_len = s->run_start + n_streams;
    s->stream_logits = s->run_len + n_streams;
    s->run_path = (int32_t *)(s->stream_logits + n_streams);
    s->n_runs = 0;
    for (int32_t b = 0, t = 0; b < n_streams; t += (int32_t)n_tokens[b], b++) {
        if (n_tokens[b] == 0) continue;
        int32_t path = cart_matmul_path_for(n_tokens[b]);
        if (s->n_runs > 0 && s->run_path[s->n_runs - 1] == path) {
            s->run_len[s->n_runs - 1] += n_tokens[b];
        } else {
            s->run_start[s->n_runs] = t;
            s->run_len[s->n_runs] = n_tokens[b];
            s->run_path[s->n_runs++] = path;
        }
    }
    for (int32_t b = 0, t = 0; b < n_streams; b++)
        for (int64_t i = 0; i < n_tokens[b]; i++, t++) {
            s->pos[t] = cart_kv_len(s->kvs[b]) + i;
            s->stream[t] = b;
            if (i % 16 == 0) {
                s->block_start[s->n_blocks] = t;
                s->block_len[s->n_blocks++] = 0;
            }
            s->block_len[s->n_blocks - 1]++;
        }
    for (int64_t t = 0; t < T; t++) {
        rope_angles(s->angles + t * c->n_rot, s->pos[t], c->n_rot, c->rope_theta);
        const uint8_t *row = (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes;
        cart_to_f32(s->x + t * E, m->tok_embd.dtype, row, E);
    }
    return CART_OK;
}

/* y = x @ W^T over the pass's tokens, run by run: each stream's tokens on
 * the path its own count takes, so its outputs do not depend on the other
 * streams of the batch. count weights share the input (matmul.h _many). */
static int linear_runs(const forward_state *s, int32_t count, float *const *y, const int64_t *ldy,
                       const float *x, int64_t ldx, const cart_weight *const *w, cart_pool *pool) {
    float *yr[3];
    for (int32_t r = 0; r < s->n_runs; r++) {
        for (int32_t k = 0; k < count; k++) yr[k] = y[k] + s->run_start[r] * ldy[k];
        int rc = cart_matmul_forward_many_path(count, yr, ldy, x + s->run_start[r] * ldx, ldx, w, s->run_len[r],
                                               s->run_path[r], pool);
        if (rc) return rc;
    }
    return CART_OK;
}

/* One transformer block over the pass, its new K/V rows written to the
 * streams' caches: attention, then the SwiGLU FFN, each with its residual. */
static int forward_layer(forward_state *s, const int64_t *n_tokens, int32_t n_streams, cart_pool *pool) {
    const cart_model_config *c = s->c;
    const layer_weights *L = &s->m->layers[s->layer];
    const int64_t T = s->T, E = c->n_embd, F = c->n_ff, D = c->head_dim;
    const int64_t HD = (int64_t)c->n_head * D, KD = (int64_t)c->n_head_kv * D;
    int rc;
    rmsnorm_forward(s->xn, s->x, L->attn_norm, T, E, c->rms_eps);
    float *qkv[3] = {s->q, s->k, s->v};
    int64_t qkv_ld[3] = {HD, KD, KD};
    const cart_weight *qkv_w[3] = {&L->wq, &L->wk, &L->wv};
    if ((rc = linear_runs(s, 3, qkv, qkv_ld, s->xn, E, qkv_w, pool))) return rc;
    cart_pool_for(pool, T, 16, qk_prepare_range, s);
    for (int32_t b = 0, t = 0; b < n_streams; t += (int32_t)n_tokens[b], b++)
        if (n_tokens[b] > 0)
            cart_kv_write(s->kvs[b], s->layer, cart_kv_len(s->kvs[b]), n_tokens[b], s->k + t * KD, s->v + t * KD);
    cart_pool_for(pool, s->n_blocks * c->n_head_kv, 1, attention_range, s);
    float *out[1] = {s->tmp};
    const int64_t out_ld[1] = {E};
    const cart_weight *wo[1] = {&L->wo}, *wdown[1] = {&L->wdown};
    if ((rc = linear_runs(s, 1, out, out_ld, s->att, HD, wo, pool))) return rc;
    for (int64_t i = 0; i < T * E; i++) s->x[i] += s->tmp[i];
    rmsnorm_forward(s->xn, s->x, L->ffn_norm, T, E, c->rms_eps);
    float *gu[2] = {s->gate, s->up};
    int64_t gu_ld[2] = {F, F};
    const cart_weight *gu_w[2] = {&L->wgate, &L->wup};
    if ((rc = linear_runs(s, 2, gu, gu_ld, s->xn, E, gu_w, pool))) return rc;
    swiglu_forward(s->gate, s->up, T * F);
    if ((rc = linear_runs(s, 1, out, out_ld, s->gate, F, wdown, pool))) return rc;
    for (int64_t i = 0; i < T * E; i++) s->x[i] += s->tmp[i];
    return CART_OK;
}

/* The logits of the wanted rows: gathered T at a time (xn has room for T),
 * normed, one head product per chunk of rows whose streams take the same
 * path on their own (by how many logit rows each stream asked for). */
static int forward_logits(forward_state *s, int32_t n_streams, const int64_t *logit_rows, int64_t n_logit_rows,
                          float *logits, cart_pool *pool) {
    const cart_model *m = s->m;
    const cart_model_config *c = s->c;
    const int64_t T = s->T, E = c->n_embd;
    for (int32_t b = 0; b < n_streams; b++) s->stream_logits[b] = 0;
    for (int64_t j = 0; j < n_logit_rows; j++) s->stream_logits[s->stream[logit_rows[j]]]++;
    int rc = CART_OK;
    for (int64_t done = 0; !rc && done < n_logit_rows;) {
        int32_t path = cart_matmul_path_for(s->stream_logits[s->stream[logit_rows[done]]]);
        int64_t chunk = 0;
        while (chunk < T && done + chunk < n_logit_rows &&
               cart_matmul_path_for(s->stream_logits[s->stream[logit_rows[done + chunk]]]) == path) {
            memcpy(s->xn + chunk * E, s->x + logit_rows[done + chunk] * E, (size_t)E * sizeof(float));
            chunk++;
        }
        rmsnorm_forward(s->xn, s->xn, m->output_norm, chunk, E, c->rms_eps);
        rc = cart_matmul_forward_path(logits + done * (int64_t)c->n_vocab, c->n_vocab, s->xn, E, &m->output, chunk,
                                      path, pool);
        done += chunk;
    }
    return rc;
}

/* The final hidden states of the wanted rows: each row copied out of the
 * residual stream and normed on its own. */
static void forward_hidden(const forward_state *s, const int64_t *rows, int64_t n_rows, float *hidden) {
    const int64_t E = s->c->n_embd;
    for (int64_t j = 0; j < n_rows; j++) {
        memcpy(hidden + j * E, s->x + rows[j] * E, (size_t)E * sizeof(float));
        rmsnorm_forward(hidden + j * E, hidden + j * E, s->m->output_norm, 1, E, s->c->rms_eps);
    }
}

/* The pass behind cart_model_forward (hidden = 0: logits of the rows) and
 * cart_model_forward_hidden (hidden = 1: final hidden states of the rows). */
static int forward_pass(cart_model *m, cart_kv *const *kvs, int32_t n_streams, const int32_t *tokens,
                        const int64_t *n_tokens, const int64_t *rows, int64_t n_rows, float *out, int hidden) {
    int64_t T = 0;
    int rc = forward_check(m, kvs, n_streams, tokens, n_tokens, rows, n_rows, &T);
    if (rc || T == 0) return rc;
    forward_state s = {.m = m, .c = &m->cfg, .T = T, .kvs = kvs};
    if ((rc = forward_setup(&s, tokens, n_tokens, n_streams))) return rc;
    cart_pool *pool = cart_default_pool();
    for (int32_t l = 0; l < m->cfg.n_layer && !rc; l++) {
        s.layer = l;
        rc = forward_layer(&s, n_tokens, n_streams, pool);
    }
    if (!rc && hidden) forward_hidden(&s, rows, n_rows, out);
    else if (!rc) rc = forward_logits(&s, n_streams, rows, n_rows, out, pool);
    if (!rc)
        for (int32_t b = 0; b < n_streams; b++)
            cart_kv_set_len(kvs[b], cart_kv_len(kvs[b]) + n_tokens[b]);
    free(s.arena);
    return rc;
}

int cart_model_forward(cart_model *m, cart_kv *const *kvs, int32_t n_streams,
                       const int32_t *tokens, const int64_t *n_tokens, const int64_t *logit_rows,
                       int64_t n_logit_rows, float *logits) {
    return forward_pass(m, kvs, n_streams, tokens, n_tokens, logit_rows, n_logit_rows, logits, 0);
}

int cart_model_forward_hidden(cart_model *m, cart_kv *const *kvs, int32_t n_streams,
                              const int32_t *tokens, const int64_t *n_tokens, const int64_t *rows,
                              int64_t n_rows, float *hidden) {
    return forward_pass(m, kvs, n_streams, tokens, n_tokens, rows, n_rows, hidden, 1);
}
