/*
 * params.c - a model's weights as trainable tensors (params.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "gguf.h"
#include "internal.h"
#include "model_internal.h"
#include "params.h"

typedef struct param {
    char name[64];
    float *data;  /* the model's own memory */
    float *grad;
    int64_t rows, cols; /* rank 1: rows = 1 */
    int32_t rank;
} param;

struct cart_params {
    cart_model *m;
    param *t;
    int32_t n;
    int64_t total;
    model_grads grads;
};

/* '*' matches any run of characters (none included); everything else itself. */
static int glob_match(const char *pat, const char *s) {
    if (*pat == '\0') return *s == '\0';
    if (*pat == '*') {
        for (const char *p = s;; p++) {
            if (glob_match(pat + 1, p)) return 1;
            if (*p == '\0') return 0;
        }
    }
    return *s == *pat && glob_match(pat + 1, s + 1);
}

/* Where tensor `name` lives in m: its f32 memory, shape, and the slot in the
 * gradient table that receives its buffer. 0 when m has no such tensor. */
static int locate(cart_model *m, model_grads *g, const char *name, float **data, int64_t *rows,
                  int64_t *cols, float ***slot) {
    const cart_model_config *c = &m->cfg;
    *rows = 1;
    if (strcmp(name, "token_embd.weight") == 0) {
        *data = (float *)m->tok_embd.data, *rows = m->tok_embd.rows, *cols = m->tok_embd.cols;
        *slot = &g->tok_embd;
        return 1;
    }
    if (strcmp(name, "output.weight") == 0 && !c->tied_output) {
        *data = (float *)m->output.data, *rows = m->output.rows, *cols = m->output.cols;
        *slot = &g->output;
        return 1;
    }
    if (strcmp(name, "output_norm.weight") == 0) {
        *data = m->output_norm, *cols = c->n_embd, *slot = &g->output_norm;
        return 1;
    }
    int layer = -1, used = 0;
    char part[48];
    if (sscanf(name, "blk.%d.%47s%n", &layer, part, &used) != 2 || name[used] != '\0' || layer < 0 ||
        layer >= c->n_layer)
        return 0;
    layer_weights *L = &m->layers[layer];
    layer_grads *lg = &g->layers[layer];
    struct { const char *part; float *vec; int64_t n; float **slot; } vectors[] = {
        {"attn_norm.weight", L->attn_norm, c->n_embd, &lg->attn_norm},
        {"ffn_norm.weight", L->ffn_norm, c->n_embd, &lg->ffn_norm},
        {"attn_q_norm.weight", L->q_norm, c->head_dim, &lg->q_norm},
        {"attn_k_norm.weight", L->k_norm, c->head_dim, &lg->k_norm},
    };
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++)
        if (vectors[i].vec && strcmp(part, vectors[i].part) == 0) {
            *data = vectors[i].vec, *cols = vectors[i].n, *slot = vectors[i].slot;
            return 1;
        }
    struct { const char *part; cart_weight *w; float **slot; } matrices[] = {
        {"attn_q.weight", &L->wq, &lg->wq},          {"attn_k.weight", &L->wk, &lg->wk},
        {"attn_v.weight", &L->wv, &lg->wv},          {"attn_output.weight", &L->wo, &lg->wo},
        {"ffn_gate.weight", &L->wgate, &lg->wgate},  {"ffn_up.weight", &L->wup, &lg->wup},
        {"ffn_down.weight", &L->wdown, &lg->wdown},
    };
    for (size_t i = 0; i < sizeof matrices / sizeof matrices[0]; i++)
        if (strcmp(part, matrices[i].part) == 0) {
            *data = (float *)matrices[i].w->data, *rows = matrices[i].w->rows, *cols = matrices[i].w->cols;
            *slot = matrices[i].slot;
            return 1;
        }
    return 0;
}

int cart_params_new(cart_params **out, cart_model *m, const char *const *patterns, int32_t n_patterns) {
    *out = NULL;
    if (!m) return cart_fail(CART_E_ARG, "cart_params_new: no model");
    if (m->cfg.arch == CART_ARCH_GEMMA4 || m->cfg.arch == CART_ARCH_QWEN2)
        return cart_fail(CART_E_UNSUPPORTED, "cart_params_new: training a %s model's weights is not "
                         "implemented (%s; its cartridges train: train.h)", cart_arch_name(m->cfg.arch),
                         m->cfg.arch == CART_ARCH_QWEN2 ? "the backward has no gradient for its q/k/v biases"
                                                        : "the backward covers its cartridge rows only");
    if (!m->widened)
        return cart_fail(CART_E_STATE, "cart_params_new: the model's matrices are read-only views of its "
                         "file; load it with widen_f32 to train its weights");
    if (n_patterns < 0 || (n_patterns > 0 && !patterns))
        return cart_fail(CART_E_ARG, "cart_params_new: %d patterns", n_patterns);
    cart_params *p = cart_calloc(1, sizeof *p, "parameter set");
    if (!p) return CART_E_NOMEM;
    p->m = m;
    int64_t n_tensors = cart_gguf_tensor_count(m->gguf);
    p->t = cart_calloc((size_t)(n_tensors ? n_tensors : 1), sizeof(param), "parameter list");
    p->grads.layers = cart_calloc((size_t)m->cfg.n_layer, sizeof(layer_grads), "parameter gradients");
    int *hits = cart_calloc((size_t)(n_patterns ? n_patterns : 1), sizeof(int), "pattern hits");
    int rc = (!p->t || !p->grads.layers || !hits) ? CART_E_NOMEM : CART_OK;
    for (int64_t i = 0; !rc && i < n_tensors; i++) {
        cart_str raw = cart_gguf_tensor_at(m->gguf, i)->name;
        char name[64];
        if (raw.len >= sizeof name) continue; /* longer than llama.cpp allows: not a tensor the model reads */
        memcpy(name, raw.data, raw.len);
        name[raw.len] = '\0';
        int take = n_patterns == 0;
        for (int32_t k = 0; k < n_patterns; k++)
            if (glob_match(patterns[k], name)) take = 1, hits[k]++;
        float *data = NULL, **slot = NULL;
        int64_t rows = 0, cols = 0;
        if (!take || !locate(m, &p->grads, name, &data, &rows, &cols, &slot)) continue;
        param *t = &p->t[p->n];
        snprintf(t->name, sizeof t->name, "%s", name);
        t->data = data, t->rows = rows, t->cols = cols;
        t->rank = strstr(name, "norm") || rows == 1 ? 1 : 2;
        t->grad = cart_calloc((size_t)(rows * cols), sizeof(float), "parameter gradient");
        if (!t->grad) {
            rc = CART_E_NOMEM;
            break;
        }
        *slot = t->grad;
        p->total += rows * cols;
        p->n++;
    }
    for (int32_t k = 0; !rc && k < n_patterns; k++)
        if (hits[k] == 0)
            rc = cart_fail(CART_E_ARG, "cart_params_new: the pattern '%s' matches no tensor of the model "
                           "(names look like blk.0.attn_q.weight; '*' matches any run of characters)",
                           patterns[k]);
    free(hits);
    if (rc) {
        cart_params_free(p);
        return rc;
    }
    *out = p;
    return CART_OK;
}

void cart_params_free(cart_params *p) {
    if (!p) return;
    for (int32_t i = 0; i < p->n; i++) free(p->t[i].grad);
    free(p->t);
    free(p->grads.layers);
    free(p);
}

const model_grads *cart_params_grads(const cart_params *p) { return p ? &p->grads : NULL; }
const cart_model *cart_params_model(const cart_params *p) { return p ? p->m : NULL; }

int32_t cart_params_count(const cart_params *p) { return p->n; }

static const param *at(const cart_params *p, int32_t i) {
    return i >= 0 && i < p->n ? &p->t[i] : NULL;
}

const char *cart_params_name(const cart_params *p, int32_t i) {
    const param *t = at(p, i);
    return t ? t->name : NULL;
}

int64_t cart_params_numel(const cart_params *p, int32_t i) {
    const param *t = at(p, i);
    return t ? t->rows * t->cols : 0;
}

int32_t cart_params_rank(const cart_params *p, int32_t i) {
    const param *t = at(p, i);
    return t ? t->rank : 0;
}

int64_t cart_params_dim(const cart_params *p, int32_t i, int32_t axis) {
    const param *t = at(p, i);
    if (!t) return 0;
    if (t->rank == 1) return axis == 0 ? t->rows * t->cols : 0;
    return axis == 0 ? t->rows : axis == 1 ? t->cols : 0;
}

float *cart_params_data(cart_params *p, int32_t i) {
    const param *t = at(p, i);
    return t ? t->data : NULL;
}

float *cart_params_grad(cart_params *p, int32_t i) {
    const param *t = at(p, i);
    return t ? t->grad : NULL;
}

int64_t cart_params_total(const cart_params *p) { return p->total; }

void cart_params_zero_grad(cart_params *p) {
    for (int32_t i = 0; i < p->n; i++)
        memset(p->t[i].grad, 0, sizeof(float) * (size_t)(p->t[i].rows * p->t[i].cols));
}

double cart_params_grad_norm(const cart_params *p) {
    double sum = 0.0;
    for (int32_t i = 0; i < p->n; i++) {
        const float *g = p->t[i].grad;
        for (int64_t j = 0; j < p->t[i].rows * p->t[i].cols; j++) sum += (double)g[j] * (double)g[j];
    }
    return sqrt(sum);
}

void cart_params_scale_grad(cart_params *p, float s) {
    for (int32_t i = 0; i < p->n; i++) {
        float *g = p->t[i].grad;
        for (int64_t j = 0; j < p->t[i].rows * p->t[i].cols; j++) g[j] *= s;
    }
}

int cart_params_check_finite(const cart_params *p, int32_t grads) {
    for (int32_t i = 0; i < p->n; i++) {
        const float *x = grads ? p->t[i].grad : p->t[i].data;
        for (int64_t j = 0; j < p->t[i].rows * p->t[i].cols; j++)
            if (!isfinite(x[j]))
                return cart_fail(CART_E_FORMAT, "%s of '%s' element %lld is %s: every value must be finite",
                                 grads ? "the gradient" : "the value", p->t[i].name, (long long)j,
                                 isnan(x[j]) ? "nan" : "infinite");
    }
    return CART_OK;
}

int cart_params_adam_step(cart_params *p, cart_adam *a) {
    if (cart_adam_size(a) != p->total)
        return cart_fail(CART_E_ARG, "cart_params_adam_step: the optimizer holds %lld elements, the "
                         "parameters %lld", (long long)cart_adam_size(a), (long long)p->total);
    cart_adam_begin_step(a);
    int64_t offset = 0;
    for (int32_t i = 0; i < p->n; i++) {
        const param *t = &p->t[i];
        int64_t n = t->rows * t->cols;
        float decay = t->rank == 2 ? cart_adam_weight_decay(a) : 0.0f;
        int rc = cart_adam_update_decay(a, t->data, t->grad, offset, n, decay);
        if (rc) return rc;
        offset += n;
    }
    return CART_OK;
}

/* ---- writing the model ----------------------------------------------------- */

int cart_model_write_gguf(const cart_model *m, const char *path, int32_t dtype, const char *name) {
    static const char fn[] = "cart_model_write_gguf";
    if (!m || !path) return cart_fail(CART_E_ARG, "%s: NULL argument", fn);
    if (dtype != CART_F32 && dtype != CART_F16)
        return cart_fail(CART_E_ARG, "%s: matrices can be written as f32 or f16, not dtype %d", fn, dtype);
    if (!m->widened)
        return cart_fail(CART_E_STATE, "%s: the model was not loaded with widen_f32: its weights are the "
                         "file's own; copy the file instead", fn);
    cart_gguf_writer *w = NULL;
    int rc = cart_gguf_writer_new(&w);
    if (rc) return rc;
    char key[256];
    for (int64_t i = 0; !rc && i < cart_gguf_kv_count(m->gguf); i++) {
        const cart_gguf_kv *kv = cart_gguf_kv_at(m->gguf, i);
        if (kv->key.len >= sizeof key) continue;
        memcpy(key, kv->key.data, kv->key.len);
        key[kv->key.len] = '\0';
        rc = cart_gguf_writer_set(w, key, &kv->value);
    }
    if (!rc && name) rc = cart_gguf_writer_set_str(w, "general.name", name);
    if (!rc) rc = cart_gguf_writer_set_u32(w, "general.file_type", dtype == CART_F16 ? 1 : 0);
    model_grads unused;
    layer_grads *lg = cart_calloc((size_t)m->cfg.n_layer, sizeof *lg, "tensor table");
    if (!lg) rc = rc ? rc : CART_E_NOMEM;
    unused.layers = lg;
    int64_t n = cart_gguf_tensor_count(m->gguf), widest = 0;
    typedef struct { char name[64]; float *data; int64_t rows, cols; int32_t dtype; } out_tensor;
    out_tensor *ts = cart_calloc((size_t)(n ? n : 1), sizeof *ts, "tensor table");
    if (!ts) rc = rc ? rc : CART_E_NOMEM;
    for (int64_t i = 0; !rc && i < n; i++) {
        cart_str raw = cart_gguf_tensor_at(m->gguf, i)->name;
        out_tensor *t = &ts[i];
        float **slot = NULL;
        if (raw.len >= sizeof t->name) {
            rc = cart_fail(CART_E_FORMAT, "%s: a tensor name of %llu bytes", fn, (unsigned long long)raw.len);
            break;
        }
        memcpy(t->name, raw.data, raw.len);
        t->name[raw.len] = '\0';
        if (!locate((cart_model *)m, &unused, t->name, &t->data, &t->rows, &t->cols, &slot)) {
            rc = cart_fail(CART_E_STATE, "%s: tensor '%s' is not one the model holds", fn, t->name);
            break;
        }
        int is_vector = t->rows == 1 || strstr(t->name, "norm");
        t->dtype = is_vector ? CART_F32 : dtype;
        int64_t ne[2] = {t->cols, t->rows};
        rc = cart_gguf_writer_add_tensor(w, t->name, t->dtype, is_vector ? 1 : 2, ne, NULL);
        if (t->dtype == CART_F16 && t->rows * t->cols > widest) widest = t->rows * t->cols;
    }
    uint16_t *half = NULL;
    if (!rc && widest > 0 && !(half = cart_malloc(sizeof(uint16_t) * (size_t)widest, "f16 tensor")))
        rc = CART_E_NOMEM;
    if (!rc) rc = cart_gguf_writer_begin(w, path);
    for (int64_t i = 0; !rc && i < n; i++) {
        const out_tensor *t = &ts[i];
        const void *data = t->data;
        if (t->dtype == CART_F16) {
            cart_f32_to_f16_n(half, t->data, t->rows * t->cols);
            data = half;
        }
        rc = cart_gguf_writer_write_tensor(w, t->name, data);
    }
    if (!rc) rc = cart_gguf_writer_finish(w);
    free(half);
    free(ts);
    free(lg);
    cart_gguf_writer_free(w);
    return rc;
}
