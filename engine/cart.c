/*
 * cart.c - the cartridge object: trainable K/V rows per layer, their
 * gradients, capture from a model, composition, and the optimizer step
 * (see cart.h; the artifact is in cart_file.c).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adam.h"
#include "cart.h"
#include "dtype.h"
#include "internal.h"
#include "model_internal.h"
#include "rng.h"

/* ---- the cartridge --------------------------------------------------------- */

struct cart_cartridge {
    int32_t n_layer;
    int64_t p;
    int64_t frozen;
    int32_t *kv_heads; /* [n_layer] */
    int32_t *head_dim; /* [n_layer] */
    int64_t *row;      /* [n_layer] floats per row: kv_heads * head_dim */
    int64_t *offset;   /* [n_layer] where layer l's K rows start; its V rows follow */
    int64_t total;     /* floats of all the rows */
    float *rows;       /* layer by layer: [p][row[l]] K, then [p][row[l]] V */
    float *grad;       /* the same layout */
};

int cart_cartridge_new(cart_cartridge **out, int32_t n_layer, int32_t kv_heads, int32_t head_dim,
                       int64_t p, int64_t frozen) {
    *out = NULL;
    if (n_layer < 1 || n_layer > (1 << 20) || kv_heads < 1 || head_dim < 1)
        return cart_fail(CART_E_ARG, "cartridge: %d layers, %d KV heads, head_dim %d: each must "
                         "be at least 1", n_layer, kv_heads, head_dim);
    int32_t *geom = cart_malloc(sizeof(int32_t) * 2 * (size_t)n_layer, "cartridge geometry");
    if (!geom) return CART_E_NOMEM;
    for (int32_t l = 0; l < n_layer; l++) geom[l] = kv_heads, geom[n_layer + l] = head_dim;
    int rc = cart_cartridge_new_layers(out, n_layer, geom, geom + n_layer, p, frozen);
    free(geom);
    return rc;
}

int cart_cartridge_new_layers(cart_cartridge **out, int32_t n_layer, const int32_t *kv_heads,
                              const int32_t *head_dim, int64_t p, int64_t frozen) {
    *out = NULL;
    if (n_layer < 1 || n_layer > (1 << 20))
        return cart_fail(CART_E_ARG, "cartridge: %d layers: it must be between 1 and 2^20", n_layer);
    for (int32_t l = 0; l < n_layer; l++)
        if (kv_heads[l] < 1 || head_dim[l] < 1 || kv_heads[l] > (1 << 16) || head_dim[l] > (1 << 16))
            return cart_fail(CART_E_ARG, "cartridge: layer %d has %d KV heads, head_dim %d: each must "
                             "be between 1 and 65536", l, kv_heads[l], head_dim[l]);
    if (p < 1) return cart_fail(CART_E_ARG, "cartridge: p = %lld rows; it needs at least one", (long long)p);
    if (frozen < 0 || frozen >= p)
        return cart_fail(CART_E_ARG, "cartridge: %lld frozen rows must be fewer than p = %lld",
                         (long long)frozen, (long long)p);
    int64_t per_row = 0; /* floats of one row over every layer, K and V */
    for (int32_t l = 0; l < n_layer; l++) per_row += 2 * (int64_t)kv_heads[l] * head_dim[l];
    if ((uint64_t)p > (UINT64_C(1) << 36) / (uint64_t)per_row)
        return cart_fail(CART_E_ARG, "cartridge: p = %lld rows is too large", (long long)p);
    cart_cartridge *c = cart_calloc(1, sizeof *c, "cartridge");
    if (!c) return CART_E_NOMEM;
    c->kv_heads = cart_calloc((size_t)n_layer, sizeof *c->kv_heads, "cartridge geometry");
    c->head_dim = cart_calloc((size_t)n_layer, sizeof *c->head_dim, "cartridge geometry");
    c->row = cart_calloc((size_t)n_layer, sizeof *c->row, "cartridge geometry");
    c->offset = cart_calloc((size_t)n_layer, sizeof *c->offset, "cartridge geometry");
    c->total = per_row * p;
    c->rows = cart_calloc((size_t)c->total, sizeof(float), "cartridge rows");
    c->grad = cart_calloc((size_t)c->total, sizeof(float), "cartridge gradients");
    if (!c->kv_heads || !c->head_dim || !c->row || !c->offset || !c->rows || !c->grad) {
        cart_cartridge_free(c);
        return CART_E_NOMEM;
    }
    c->n_layer = n_layer;
    c->p = p;
    c->frozen = frozen;
    for (int32_t l = 0, at = 0; l < n_layer; l++) {
        c->kv_heads[l] = kv_heads[l];
        c->head_dim[l] = head_dim[l];
        c->row[l] = (int64_t)kv_heads[l] * head_dim[l];
        c->offset[l] = at;
        at += 2 * p * c->row[l];
    }
    *out = c;
    return CART_OK;
}

int cart_cartridge_new_for(cart_cartridge **out, const cart_model *m, int64_t p, int64_t frozen) {
    *out = NULL;
    int32_t *geom = cart_model_kv_geometry(m);
    if (!geom) return CART_E_NOMEM;
    int rc = cart_cartridge_new_layers(out, m->cfg.n_layer, geom, geom + m->cfg.n_layer, p, frozen);
    free(geom);
    return rc;
}

void cart_cartridge_free(cart_cartridge *c) {
    if (!c) return;
    free(c->rows);
    free(c->grad);
    free(c->kv_heads);
    free(c->head_dim);
    free(c->row);
    free(c->offset);
    free(c);
}

int64_t cart_cartridge_p(const cart_cartridge *c) { return c->p; }
int64_t cart_cartridge_frozen(const cart_cartridge *c) { return c->frozen; }
int32_t cart_cartridge_n_layer(const cart_cartridge *c) { return c->n_layer; }
int32_t cart_cartridge_kv_heads(const cart_cartridge *c) { return c->kv_heads[0]; }
int32_t cart_cartridge_head_dim(const cart_cartridge *c) { return c->head_dim[0]; }

int32_t cart_cartridge_layer_heads(const cart_cartridge *c, int32_t layer) {
    return layer >= 0 && layer < c->n_layer ? c->kv_heads[layer] : 0;
}

int32_t cart_cartridge_layer_head_dim(const cart_cartridge *c, int32_t layer) {
    return layer >= 0 && layer < c->n_layer ? c->head_dim[layer] : 0;
}

static size_t block_offset(const cart_cartridge *c, int32_t layer, int32_t which) {
    return (size_t)(c->offset[layer] + (int64_t)which * c->p * c->row[layer]);
}

float *cart_cartridge_rows(cart_cartridge *c, int32_t layer, int32_t which) {
    if (layer < 0 || layer >= c->n_layer || (which != 0 && which != 1)) return NULL;
    return c->rows + block_offset(c, layer, which);
}

float *cart_cartridge_grad(cart_cartridge *c, int32_t layer, int32_t which) {
    if (layer < 0 || layer >= c->n_layer || (which != 0 && which != 1)) return NULL;
    return c->grad + block_offset(c, layer, which);
}

int cart_cartridge_value_error(const char *what, int32_t layer, int32_t which, int sink, int64_t row, float x) {
    if (isfinite(x))
        return cart_fail(CART_E_FORMAT, "%s of 'layers.%d.%s%s' row %lld holds %g: every value must lie within +-%g, "
                         "the largest an f16 KV cache holds (attention over larger keys or values overflows)", what,
                         (int)layer, which ? "v" : "k", sink ? "_sink" : "", (long long)row, (double)x,
                         (double)CART_CARTRIDGE_MAX_ABS);
    return cart_fail(CART_E_FORMAT, "%s of 'layers.%d.%s%s' row %lld holds %s: every value must be finite", what,
                     (int)layer, which ? "v" : "k", sink ? "_sink" : "", (long long)row,
                     isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
}

int cart_cartridge_check_finite(const cart_cartridge *c, int32_t grads) {
    if (!c) return cart_fail(CART_E_ARG, "cartridge check_finite: cartridge is NULL");
    const float *base = grads ? c->grad : c->rows;
    for (int32_t l = 0; l < c->n_layer; l++)
        for (int32_t which = 0; which < 2; which++) {
            const float *x = base + block_offset(c, l, which);
            const int64_t i = cart_f32_first_outside(x, c->p * c->row[l], grads ? FLT_MAX : CART_CARTRIDGE_MAX_ABS);
            if (i < 0) continue;
            const int64_t r = i / c->row[l];
            const int sink = r < c->frozen;
            return cart_cartridge_value_error(grads ? "the gradient" : "the data", l, which, sink,
                                              sink ? r : r - c->frozen, x[i]);
        }
    return CART_OK;
}

const float *cart_cartridge_rows_of(const cart_cartridge *c, int32_t layer, int32_t which) {
    return c->rows + block_offset(c, layer, which);
}

void cart_cartridge_zero_grad(cart_cartridge *c) {
    memset(c->grad, 0, (size_t)c->total * sizeof(float));
}

int cart_cartridge_check_model(const cart_cartridge *c, const cart_model *m, const char *fn) {
    const cart_model_config *cfg = &m->cfg;
    if (c->n_layer != cfg->n_layer)
        return cart_fail(CART_E_ARG, "%s: the cartridge has %d layers, the model %d", fn, c->n_layer,
                         cfg->n_layer);
    for (int32_t l = 0; l < c->n_layer; l++) {
        const cart_layer_config *g = &m->layers[l].g;
        if (c->kv_heads[l] != g->n_head_kv || c->head_dim[l] != g->head_dim)
            return cart_fail(CART_E_ARG, "%s: the cartridge is %d layers x %d KV heads x %d (layer %d), "
                             "the model %d x %d x %d", fn, c->n_layer, c->kv_heads[l], c->head_dim[l], l,
                             cfg->n_layer, g->n_head_kv, g->head_dim);
    }
    return CART_OK;
}

int cart_cartridge_capture(cart_cartridge *c, cart_model *m, const int32_t *tokens, int64_t n,
                           int32_t kv_dtype) {
    int rc = cart_cartridge_check_model(c, m, "cart_cartridge_capture");
    if (rc) return rc;
    if (n != c->p)
        return cart_fail(CART_E_ARG, "cart_cartridge_capture: %lld tokens for a cartridge of p = %lld",
                         (long long)n, (long long)c->p);
    cart_kv *kv = NULL;
    rc = cart_kv_new_layers(&kv, c->n_layer, c->kv_heads, c->head_dim, n, kv_dtype);
    if (rc) return rc;
    rc = cart_model_forward(m, &kv, 1, tokens, &n, NULL, 0, NULL);
    for (int32_t l = 0; l < c->n_layer && !rc; l++)
        rc = cart_kv_read(kv, l, 0, n, cart_cartridge_rows(c, l, 0), cart_cartridge_rows(c, l, 1));
    cart_kv_free(kv);
    return rc;
}

void cart_cartridge_init_random(cart_cartridge *c, uint64_t seed, float std) {
    cart_rng rng;
    cart_rng_seed(&rng, seed);
    cart_rng_fill_normal(&rng, c->rows, c->total, 0.0f, std);
}

int cart_cartridge_append_to_kv(const cart_cartridge *c, cart_kv *kv) {
    if (cart_kv_n_layer(kv) != c->n_layer)
        return cart_fail(CART_E_ARG, "cart_cartridge_append_to_kv: the cartridge has %d layers, the cache "
                         "%d", c->n_layer, cart_kv_n_layer(kv));
    for (int32_t l = 0; l < c->n_layer; l++)
        if (cart_kv_layer_heads(kv, l) != c->kv_heads[l] || cart_kv_layer_head_dim(kv, l) != c->head_dim[l])
            return cart_fail(CART_E_ARG, "cart_cartridge_append_to_kv: the cartridge is %d layers x %d "
                             "KV heads x %d (layer %d), the cache %d x %d x %d", c->n_layer, c->kv_heads[l],
                             c->head_dim[l], l, cart_kv_n_layer(kv), cart_kv_layer_heads(kv, l),
                             cart_kv_layer_head_dim(kv, l));
    int64_t len = cart_kv_len(kv);
    if (c->p > cart_kv_capacity(kv) - len)
        return cart_fail(CART_E_ARG, "cart_cartridge_append_to_kv: %lld rows after %lld do not fit "
                         "a cache of %lld", (long long)c->p, (long long)len,
                         (long long)cart_kv_capacity(kv));
    for (int32_t l = 0; l < c->n_layer; l++) {
        int rc = cart_kv_write(kv, l, len, c->p, cart_cartridge_rows_of(c, l, 0), cart_cartridge_rows_of(c, l, 1));
        if (rc) return rc;
    }
    return cart_kv_set_len(kv, len + c->p);
}

int64_t cart_cartridge_trainable_count(const cart_cartridge *c) {
    int64_t n = 0;
    for (int32_t l = 0; l < c->n_layer; l++) n += 2 * (c->p - c->frozen) * c->row[l];
    return n;
}

int cart_cartridge_adam_step(cart_cartridge *c, cart_adam *a) {
    if (cart_adam_size(a) != cart_cartridge_trainable_count(c))
        return cart_fail(CART_E_ARG, "cart_cartridge_adam_step: the optimizer holds %lld values, "
                         "the cartridge has %lld trainable", (long long)cart_adam_size(a),
                         (long long)cart_cartridge_trainable_count(c));
    cart_adam_begin_step(a);
    int64_t offset = 0;
    for (int32_t l = 0; l < c->n_layer; l++)
        for (int32_t which = 0; which < 2; which++) {
            int64_t per_block = (c->p - c->frozen) * c->row[l];
            size_t skip = (size_t)c->frozen * (size_t)c->row[l];
            int rc = cart_adam_update(a, cart_cartridge_rows(c, l, which) + skip,
                                      cart_cartridge_grad(c, l, which) + skip, offset, per_block);
            if (rc) return rc;
            offset += per_block;
        }
    return CART_OK;
}

void cart_cartridge_grad_export(const cart_cartridge *c, float *dst) {
    for (int32_t l = 0; l < c->n_layer; l++) {
        size_t skip = (size_t)c->frozen * (size_t)c->row[l], per_block = (size_t)(c->p - c->frozen) * (size_t)c->row[l];
        for (int32_t which = 0; which < 2; which++, dst += per_block)
            memcpy(dst, c->grad + block_offset(c, l, which) + skip, per_block * sizeof(float));
    }
}

void cart_cartridge_grad_import(cart_cartridge *c, const float *src) {
    for (int32_t l = 0; l < c->n_layer; l++) {
        size_t skip = (size_t)c->frozen * (size_t)c->row[l], per_block = (size_t)(c->p - c->frozen) * (size_t)c->row[l];
        for (int32_t which = 0; which < 2; which++, src += per_block)
            memcpy(c->grad + block_offset(c, l, which) + skip, src, per_block * sizeof(float));
    }
}

/* ---- composition ------------------------------------------------------------ */

static int same_geometry(const cart_cartridge *a, const cart_cartridge *b) {
    if (a->n_layer != b->n_layer) return 0;
    for (int32_t l = 0; l < a->n_layer; l++)
        if (a->kv_heads[l] != b->kv_heads[l] || a->head_dim[l] != b->head_dim[l]) return 0;
    return 1;
}

/* The first layer where a and b differ (0 when only their layer counts do). */
static int32_t first_difference(const cart_cartridge *a, const cart_cartridge *b) {
    int32_t n = a->n_layer < b->n_layer ? a->n_layer : b->n_layer;
    for (int32_t l = 0; l < n; l++)
        if (a->kv_heads[l] != b->kv_heads[l] || a->head_dim[l] != b->head_dim[l]) return l;
    return 0;
}

int cart_cartridge_copy_rows(cart_cartridge *dst, int64_t dst_row, const cart_cartridge *src,
                             int64_t src_row, int64_t n) {
    if (!dst || !src) return cart_fail(CART_E_ARG, "cart_cartridge_copy_rows: a cartridge is NULL");
    if (!same_geometry(dst, src)) {
        int32_t l = first_difference(dst, src);
        return cart_fail(CART_E_ARG, "cart_cartridge_copy_rows: the source is %d layers (layer %d: %d KV heads x "
                         "%d), the destination %d layers (layer %d: %d x %d)", src->n_layer, l,
                         src->kv_heads[l], src->head_dim[l], dst->n_layer, l, dst->kv_heads[l], dst->head_dim[l]);
    }
    if (n < 0 || src_row < 0 || dst_row < 0 || src_row > src->p - n || dst_row > dst->p - n)
        return cart_fail(CART_E_ARG, "cart_cartridge_copy_rows: %lld rows from row %lld of %lld into row "
                         "%lld of %lld", (long long)n, (long long)src_row, (long long)src->p,
                         (long long)dst_row, (long long)dst->p);
    for (int32_t l = 0; l < dst->n_layer; l++)
        for (int32_t which = 0; which < 2; which++)
            memcpy(dst->rows + block_offset(dst, l, which) + dst_row * dst->row[l],
                   src->rows + block_offset(src, l, which) + src_row * src->row[l],
                   (size_t)n * (size_t)dst->row[l] * sizeof(float));
    return CART_OK;
}

int cart_cartridge_compose(cart_cartridge **out, const cart_cartridge *const *parts, int32_t n_parts) {
    *out = NULL;
    if (n_parts < 1 || !parts) return cart_fail(CART_E_ARG, "cart_cartridge_compose: %d parts", (int)n_parts);
    int64_t total = 0;
    for (int32_t i = 0; i < n_parts; i++) {
        if (!parts[i]) return cart_fail(CART_E_ARG, "cart_cartridge_compose: part %d is NULL", (int)i);
        if (!same_geometry(parts[i], parts[0])) {
            int32_t l = first_difference(parts[i], parts[0]);
            return cart_fail(CART_E_ARG, "cart_cartridge_compose: part %d is %d layers (layer %d: %d KV heads x %d), "
                             "part 0 is %d layers (layer %d: %d x %d): only cartridges of one model compose", (int)i,
                             parts[i]->n_layer, l, parts[i]->kv_heads[l], parts[i]->head_dim[l], parts[0]->n_layer,
                             l, parts[0]->kv_heads[l], parts[0]->head_dim[l]);
        }
        total += parts[i]->p;
    }
    cart_cartridge *c = NULL;
    int rc = cart_cartridge_new_layers(&c, parts[0]->n_layer, parts[0]->kv_heads, parts[0]->head_dim, total,
                                       parts[0]->frozen);
    for (int64_t at = 0, i = 0; !rc && i < n_parts; at += parts[i]->p, i++)
        rc = cart_cartridge_copy_rows(c, at, parts[i], 0, parts[i]->p);
    if (rc) {
        cart_cartridge_free(c);
        return rc;
    }
    *out = c;
    return CART_OK;
}

int cart_cartridge_compose_grad(const cart_cartridge *composed, cart_cartridge *const *parts,
                                int32_t n_parts) {
    if (!composed || !parts || n_parts < 1)
        return cart_fail(CART_E_ARG, "cart_cartridge_compose_grad: no composition or no parts");
    int64_t total = 0;
    for (int32_t i = 0; i < n_parts; i++) {
        if (!parts[i] || !same_geometry(parts[i], composed))
            return cart_fail(CART_E_ARG, "cart_cartridge_compose_grad: part %d is not shaped like the "
                             "composition", (int)i);
        total += parts[i]->p;
    }
    if (total != composed->p)
        return cart_fail(CART_E_ARG, "cart_cartridge_compose_grad: the parts hold %lld rows, the "
                         "composition %lld", (long long)total, (long long)composed->p);
    for (int64_t at = 0, i = 0; i < n_parts; at += parts[i]->p, i++) {
        cart_cartridge *part = parts[i];
        int64_t skip = part->frozen;
        for (int32_t l = 0; l < part->n_layer; l++) {
            int64_t row = part->row[l], n = (part->p - skip) * row;
            for (int32_t which = 0; which < 2; which++) {
                float *g = part->grad + block_offset(part, l, which) + skip * row;
                const float *src = composed->grad + block_offset(composed, l, which) + (at + skip) * row;
                for (int64_t k = 0; k < n; k++) g[k] += src[k];
            }
        }
    }
    return CART_OK;
}
