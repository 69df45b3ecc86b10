/*
 * kv.c - per-layer K/V row storage in f16 or f32.
 */
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "internal.h"
#include "kv.h"

struct cart_kv {
    int32_t n_layer;
    int32_t dtype;      /* CART_F16 or CART_F32 */
    int64_t capacity;   /* rows */
    int64_t len;        /* valid rows */
    int32_t *kv_heads;  /* [n_layer] */
    int32_t *head_dim;  /* [n_layer] */
    size_t *row_bytes;  /* [n_layer] kv_heads * head_dim * element size */
    uint8_t **k;        /* [n_layer] -> capacity * row_bytes */
    uint8_t **v;
};

int cart_kv_new(cart_kv **out, int32_t n_layer, int32_t kv_heads, int32_t head_dim,
                int64_t capacity, int32_t dtype) {
    *out = NULL;
    if (n_layer < 1 || n_layer > (1 << 20))
        return cart_fail(CART_E_ARG, "cart_kv_new: %d layers: it must be between 1 and 2^20", n_layer);
    int32_t *heads = cart_malloc(sizeof(int32_t) * 2 * (size_t)n_layer, "KV cache geometry");
    if (!heads) return CART_E_NOMEM;
    for (int32_t l = 0; l < n_layer; l++) heads[l] = kv_heads, heads[n_layer + l] = head_dim;
    int rc = cart_kv_new_layers(out, n_layer, heads, heads + n_layer, capacity, dtype);
    free(heads);
    return rc;
}

int cart_kv_new_layers(cart_kv **out, int32_t n_layer, const int32_t *kv_heads,
                       const int32_t *head_dim, int64_t capacity, int32_t dtype) {
    *out = NULL;
    if (n_layer < 1 || n_layer > (1 << 20))
        return cart_fail(CART_E_ARG, "cart_kv_new: %d layers: it must be between 1 and 2^20", n_layer);
    size_t widest = 0;
    for (int32_t l = 0; l < n_layer; l++) {
        if (kv_heads[l] < 1 || head_dim[l] < 1 || kv_heads[l] > (1 << 16) || head_dim[l] > (1 << 16))
            return cart_fail(CART_E_ARG, "cart_kv_new: layer %d has %d heads of head_dim %d: each "
                             "must be between 1 and 65536", l, kv_heads[l], head_dim[l]);
        size_t w = (size_t)kv_heads[l] * (size_t)head_dim[l];
        if (w > widest) widest = w;
    }
    if (capacity < 1)
        return cart_fail(CART_E_ARG, "cart_kv_new: capacity %lld rows must be >= 1",
                         (long long)capacity);
    if (dtype != CART_F16 && dtype != CART_F32)
        return cart_fail(CART_E_ARG, "cart_kv_new: cache dtype must be f16 or f32, not %s",
                         cart_dtype_name(dtype) ? cart_dtype_name(dtype) : "an unknown id");
    size_t elsize = dtype == CART_F16 ? 2 : 4;
    if ((uint64_t)capacity > (UINT64_C(1) << 40) / (widest * elsize))
        return cart_fail(CART_E_ARG, "cart_kv_new: capacity %lld rows is too large",
                         (long long)capacity);
    cart_kv *kv = cart_calloc(1, sizeof *kv, "KV cache");
    if (!kv) return CART_E_NOMEM;
    kv->n_layer = n_layer;
    kv->dtype = dtype;
    kv->capacity = capacity;
    kv->kv_heads = cart_calloc((size_t)n_layer, sizeof *kv->kv_heads, "KV cache geometry");
    kv->head_dim = cart_calloc((size_t)n_layer, sizeof *kv->head_dim, "KV cache geometry");
    kv->row_bytes = cart_calloc((size_t)n_layer, sizeof *kv->row_bytes, "KV cache geometry");
    kv->k = cart_calloc((size_t)n_layer, sizeof *kv->k, "KV cache layers");
    kv->v = cart_calloc((size_t)n_layer, sizeof *kv->v, "KV cache layers");
    if (!kv->kv_heads || !kv->head_dim || !kv->row_bytes || !kv->k || !kv->v) {
        cart_kv_free(kv);
        return CART_E_NOMEM;
    }
    for (int32_t l = 0; l < n_layer; l++) {
        kv->kv_heads[l] = kv_heads[l];
        kv->head_dim[l] = head_dim[l];
        kv->row_bytes[l] = (size_t)kv_heads[l] * (size_t)head_dim[l] * elsize;
        size_t bytes = ((size_t)capacity * kv->row_bytes[l] + 63) & ~(size_t)63;
        kv->k[l] = aligned_alloc(64, bytes);
        kv->v[l] = aligned_alloc(64, bytes);
        if (!kv->k[l] || !kv->v[l]) {
            double mib = 0.0;
            for (int32_t i = 0; i < n_layer; i++)
                mib += 2.0 * (double)capacity * (double)kv_heads[i] * (double)head_dim[i] * (double)elsize / 1048576.0;
            cart_kv_free(kv);
            return cart_fail(CART_E_NOMEM, "out of memory for a KV cache of %lld rows x %d layers "
                             "(%.1f MiB)", (long long)capacity, n_layer, mib);
        }
    }
    *out = kv;
    return CART_OK;
}

void cart_kv_free(cart_kv *kv) {
    if (!kv) return;
    for (int32_t l = 0; l < kv->n_layer; l++) {
        if (kv->k) free(kv->k[l]);
        if (kv->v) free(kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->kv_heads);
    free(kv->head_dim);
    free(kv->row_bytes);
    free(kv);
}

int64_t cart_kv_len(const cart_kv *kv) { return kv->len; }
int64_t cart_kv_capacity(const cart_kv *kv) { return kv->capacity; }
int32_t cart_kv_dtype(const cart_kv *kv) { return kv->dtype; }
int32_t cart_kv_n_layer(const cart_kv *kv) { return kv->n_layer; }
int32_t cart_kv_heads(const cart_kv *kv) { return kv->kv_heads[0]; }
int32_t cart_kv_head_dim(const cart_kv *kv) { return kv->head_dim[0]; }

int32_t cart_kv_layer_heads(const cart_kv *kv, int32_t layer) {
    return layer >= 0 && layer < kv->n_layer ? kv->kv_heads[layer] : 0;
}

int32_t cart_kv_layer_head_dim(const cart_kv *kv, int32_t layer) {
    return layer >= 0 && layer < kv->n_layer ? kv->head_dim[layer] : 0;
}

uint64_t cart_kv_bytes(const cart_kv *kv) {
    uint64_t total = 0;
    for (int32_t l = 0; l < kv->n_layer; l++) total += 2 * (uint64_t)kv->capacity * kv->row_bytes[l];
    return total;
}

int cart_kv_truncate(cart_kv *kv, int64_t len) {
    if (len < 0 || len > kv->len)
        return cart_fail(CART_E_ARG, "cart_kv_truncate: %lld is outside 0..%lld (the current length)",
                         (long long)len, (long long)kv->len);
    kv->len = len;
    return CART_OK;
}

int cart_kv_set_len(cart_kv *kv, int64_t len) {
    if (len < 0 || len > kv->capacity)
        return cart_fail(CART_E_ARG, "cart_kv_set_len: %lld is outside 0..%lld (the capacity)",
                         (long long)len, (long long)kv->capacity);
    kv->len = len;
    return CART_OK;
}

static int check_rows(const cart_kv *kv, int32_t layer, int64_t pos, int64_t n, const char *fn) {
    if (layer < 0 || layer >= kv->n_layer)
        return cart_fail(CART_E_ARG, "%s: layer %d is outside 0..%d", fn, layer, kv->n_layer - 1);
    if (pos < 0 || n < 0 || pos > kv->capacity - n)
        return cart_fail(CART_E_ARG, "%s: rows [%lld, %lld) are outside the capacity of %lld", fn,
                         (long long)pos, (long long)(pos + n), (long long)kv->capacity);
    return CART_OK;
}

static void store(uint8_t *dst, int32_t dtype, const float *src, size_t count) {
    if (dtype == CART_F32) memcpy(dst, src, count * sizeof(float));
    else cart_f32_to_f16_n((uint16_t *)dst, src, (int64_t)count);
}

static void load(float *dst, int32_t dtype, const uint8_t *src, size_t count) {
    if (dtype == CART_F32) memcpy(dst, src, count * sizeof(float));
    else cart_f16_to_f32_n(dst, (const uint16_t *)src, (int64_t)count);
}

int cart_kv_write(cart_kv *kv, int32_t layer, int64_t pos, int64_t n, const float *k,
                  const float *v) {
    int rc = check_rows(kv, layer, pos, n, "cart_kv_write");
    if (rc) return rc;
    size_t count = (size_t)n * (size_t)kv->kv_heads[layer] * (size_t)kv->head_dim[layer];
    size_t off = (size_t)pos * kv->row_bytes[layer];
    if (k) store(kv->k[layer] + off, kv->dtype, k, count);
    if (v) store(kv->v[layer] + off, kv->dtype, v, count);
    return CART_OK;
}

int cart_kv_read(const cart_kv *kv, int32_t layer, int64_t pos, int64_t n, float *k, float *v) {
    int rc = check_rows(kv, layer, pos, n, "cart_kv_read");
    if (rc) return rc;
    size_t count = (size_t)n * (size_t)kv->kv_heads[layer] * (size_t)kv->head_dim[layer];
    size_t off = (size_t)pos * kv->row_bytes[layer];
    if (k) load(k, kv->dtype, kv->k[layer] + off, count);
    if (v) load(v, kv->dtype, kv->v[layer] + off, count);
    return CART_OK;
}

int cart_kv_same_geometry(const cart_kv *a, const cart_kv *b) {
    if (a->n_layer != b->n_layer) return 0;
    for (int32_t l = 0; l < a->n_layer; l++)
        if (a->kv_heads[l] != b->kv_heads[l] || a->head_dim[l] != b->head_dim[l]) return 0;
    return 1;
}

int cart_kv_copy(cart_kv *dst, const cart_kv *src, int64_t n) {
    if (!cart_kv_same_geometry(dst, src))
        return cart_fail(CART_E_ARG, "cart_kv_copy: geometry %d layers x %d heads x %d (layer 0) "
                         "differs from %d x %d x %d, or a later layer's does",
                         src->n_layer, src->kv_heads[0], src->head_dim[0], dst->n_layer,
                         dst->kv_heads[0], dst->head_dim[0]);
    if (n < 0 || n > src->len || n > dst->capacity)
        return cart_fail(CART_E_ARG, "cart_kv_copy: %lld rows, but the source holds %lld and the "
                         "destination fits %lld", (long long)n, (long long)src->len,
                         (long long)dst->capacity);
    for (int32_t l = 0; l < src->n_layer; l++) {
        size_t count = (size_t)n * (size_t)src->kv_heads[l] * (size_t)src->head_dim[l];
        if (dst->dtype == src->dtype) {
            memcpy(dst->k[l], src->k[l], (size_t)n * src->row_bytes[l]);
            memcpy(dst->v[l], src->v[l], (size_t)n * src->row_bytes[l]);
            continue;
        }
        float *tmp = cart_malloc(count * sizeof(float), "KV copy buffer");
        if (!tmp) return CART_E_NOMEM;
        load(tmp, src->dtype, src->k[l], count);
        store(dst->k[l], dst->dtype, tmp, count);
        load(tmp, src->dtype, src->v[l], count);
        store(dst->v[l], dst->dtype, tmp, count);
        free(tmp);
    }
    dst->len = n;
    return CART_OK;
}

void *cart_kv_rows(cart_kv *kv, int32_t layer, int32_t which) {
    if (layer < 0 || layer >= kv->n_layer) return NULL;
    return which ? kv->v[layer] : kv->k[layer];
}
