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
    int32_t kv_heads;
    int32_t head_dim;
    int32_t dtype;    /* CART_F16 or CART_F32 */
    int64_t capacity; /* rows */
    int64_t len;      /* valid rows */
    size_t row_bytes; /* kv_heads * head_dim * element size */
    uint8_t **k;      /* [n_layer] -> capacity * row_bytes */
    uint8_t **v;
};

int cart_kv_new(cart_kv **out, int32_t n_layer, int32_t kv_heads, int32_t head_dim,
                int64_t capacity, int32_t dtype) {
    *out = NULL;
    if (n_layer < 1 || kv_heads < 1 || head_dim < 1)
        return cart_fail(CART_E_ARG, "cart_kv_new: %d layers, %d heads, head_dim %d: each must be >= 1",
                         n_layer, kv_heads, head_dim);
    if (capacity < 1)
        return cart_fail(CART_E_ARG, "cart_kv_new: capacity %lld rows must be >= 1",
                         (long long)capacity);
    if (dtype != CART_F16 && dtype != CART_F32)
        return cart_fail(CART_E_ARG, "cart_kv_new: cache dtype must be f16 or f32, not %s",
                         cart_dtype_name(dtype) ? cart_dtype_name(dtype) : "an unknown id");
    size_t elsize = dtype == CART_F16 ? 2 : 4;
    size_t row_bytes = (size_t)kv_heads * (size_t)head_dim * elsize;
    if ((uint64_t)capacity > (UINT64_C(1) << 40) / row_bytes)
        return cart_fail(CART_E_ARG, "cart_kv_new: capacity %lld rows is too large",
                         (long long)capacity);
    cart_kv *kv = cart_calloc(1, sizeof *kv, "KV cache");
    if (!kv) return CART_E_NOMEM;
    kv->n_layer = n_layer;
    kv->kv_heads = kv_heads;
    kv->head_dim = head_dim;
    kv->dtype = dtype;
    kv->capacity = capacity;
    kv->row_bytes = row_bytes;
    kv->k = cart_calloc((size_t)n_layer, sizeof *kv->k, "KV cache layers");
    kv->v = cart_calloc((size_t)n_layer, sizeof *kv->v, "KV cache layers");
    if (!kv->k || !kv->v) {
        cart_kv_free(kv);
        return CART_E_NOMEM;
    }
    size_t bytes = ((size_t)capacity * row_bytes + 63) & ~(size_t)63;
    for (int32_t l = 0; l < n_layer; l++) {
        kv->k[l] = aligned_alloc(64, bytes);
        kv->v[l] = aligned_alloc(64, bytes);
        if (!kv->k[l] || !kv->v[l]) {
            cart_kv_free(kv);
            return cart_fail(CART_E_NOMEM, "out of memory for a KV cache of %lld rows x %d layers "
                             "(%.1f MiB)", (long long)capacity, n_layer,
                             2.0 * n_layer * (double)bytes / 1048576.0);
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
    free(kv);
}

int64_t cart_kv_len(const cart_kv *kv) { return kv->len; }
int64_t cart_kv_capacity(const cart_kv *kv) { return kv->capacity; }
int32_t cart_kv_dtype(const cart_kv *kv) { return kv->dtype; }
int32_t cart_kv_n_layer(const cart_kv *kv) { return kv->n_layer; }
int32_t cart_kv_heads(const cart_kv *kv) { return kv->kv_heads; }
int32_t cart_kv_head_dim(const cart_kv *kv) { return kv->head_dim; }

uint64_t cart_kv_bytes(const cart_kv *kv) {
    return 2 * (uint64_t)kv->n_layer * (uint64_t)kv->capacity * kv->row_bytes;
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
    size_t count = (size_t)n * (size_t)kv->kv_heads * (size_t)kv->head_dim;
    size_t off = (size_t)pos * kv->row_bytes;
    if (k) store(kv->k[layer] + off, kv->dtype, k, count);
    if (v) store(kv->v[layer] + off, kv->dtype, v, count);
    return CART_OK;
}

int cart_kv_read(const cart_kv *kv, int32_t layer, int64_t pos, int64_t n, float *k, float *v) {
    int rc = check_rows(kv, layer, pos, n, "cart_kv_read");
    if (rc) return rc;
    size_t count = (size_t)n * (size_t)kv->kv_heads * (size_t)kv->head_dim;
    size_t off = (size_t)pos * kv->row_bytes;
    if (k) load(k, kv->dtype, kv->k[layer] + off, count);
    if (v) load(v, kv->dtype, kv->v[layer] + off, count);
    return CART_OK;
}

int cart_kv_copy(cart_kv *dst, const cart_kv *src, int64_t n) {
    if (dst->n_layer != src->n_layer || dst->kv_heads != src->kv_heads ||
        dst->head_dim != src->head_dim)
        return cart_fail(CART_E_ARG, "cart_kv_copy: geometry %d layers x %d heads x %d differs "
                         "from %d x %d x %d", src->n_layer, src->kv_heads, src->head_dim,
                         dst->n_layer, dst->kv_heads, dst->head_dim);
    if (n < 0 || n > src->len || n > dst->capacity)
        return cart_fail(CART_E_ARG, "cart_kv_copy: %lld rows, but the source holds %lld and the "
                         "destination fits %lld", (long long)n, (long long)src->len,
                         (long long)dst->capacity);
    size_t count = (size_t)n * (size_t)src->kv_heads * (size_t)src->head_dim;
    for (int32_t l = 0; l < src->n_layer; l++) {
        if (dst->dtype == src->dtype) {
            memcpy(dst->k[l], src->k[l], (size_t)n * src->row_bytes);
            memcpy(dst->v[l], src->v[l], (size_t)n * src->row_bytes);
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
