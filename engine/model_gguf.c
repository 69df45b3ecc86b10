/*
 * model_gguf.c - reading a model's hyperparameters and tensors out of its
 * GGUF, for every architecture's loader (model_internal.h): keys under the
 * architecture's prefix, range-checked dimensions, tensors found by name,
 * checked against their expected shape and claimed (model.c refuses a file
 * holding a tensor no loader claimed).
 */
#include <stdio.h>
#include <stdlib.h>

#include "dtype.h"
#include "internal.h"
#include "model_internal.h"

const char *model_key(model_loader *ld, const char *suffix) {
    snprintf(ld->key, sizeof ld->key, "%s.%s", ld->arch, suffix);
    return ld->key;
}

int model_get_dim(model_loader *ld, const char *suffix, int32_t *out, int32_t lo) {
    uint32_t v = 0;
    const char *key = model_key(ld, suffix);
    int rc = cart_gguf_get_u32(&v, ld->g, key);
    if (rc == CART_E_NOT_FOUND)
        return cart_fail(CART_E_FORMAT, "%s: missing hyperparameter '%s'", ld->path, key);
    if (rc) return rc;
    if (v < (uint32_t)lo || v > (1u << 30))
        return cart_fail(CART_E_FORMAT, "%s: hyperparameter '%s' = %u is out of range", ld->path,
                         key, v);
    *out = (int32_t)v;
    return CART_OK;
}

int model_get_dim_opt(model_loader *ld, const char *suffix, int32_t *out) {
    if (!cart_gguf_find(ld->g, model_key(ld, suffix))) return CART_OK;
    return model_get_dim(ld, suffix, out, 1);
}

int model_get_dim_opt0(model_loader *ld, const char *suffix, int32_t *out) {
    if (!cart_gguf_find(ld->g, model_key(ld, suffix))) return CART_OK;
    return model_get_dim(ld, suffix, out, 0);
}

int model_get_eps(model_loader *ld, float *out) {
    float eps = 0.0f;
    int rc = cart_gguf_get_f32(&eps, ld->g, model_key(ld, "attention.layer_norm_rms_epsilon"));
    if (rc == CART_E_NOT_FOUND)
        return cart_fail(CART_E_FORMAT, "%s: missing hyperparameter '%s'", ld->path, ld->key);
    if (rc) return rc;
    if (!(eps > 0.0f && eps < 1.0f))
        return cart_fail(CART_E_FORMAT, "%s: '%s' = %g is out of range", ld->path, ld->key, eps);
    *out = eps;
    return CART_OK;
}

/* Every layer holds at least its attention's tensors, so a block_count
 * beyond the file's tensor count is a corrupt header, refused before any
 * per-layer table is allocated from it. */
int check_layer_count(model_loader *ld, int32_t n_layer) {
    const int64_t n_tensors = cart_gguf_tensor_count(ld->g);
    if (n_layer <= n_tensors) return CART_OK;
    return cart_fail(CART_E_FORMAT, "%s: '%s.block_count' = %d layers, but the file holds only %lld "
                     "tensors (each layer needs several); the header is corrupt", ld->path, ld->arch,
                     n_layer, (long long)n_tensors);
}

const cart_gguf_tensor_info *model_find_tensor(model_loader *ld, const char *name) {
    return cart_gguf_find_tensor(ld->g, name);
}

void model_claim(model_loader *ld, const cart_gguf_tensor_info *t) {
    ld->claimed[t - cart_gguf_tensor_at(ld->g, 0)] = 1;
}

/* Looks up a tensor, checks its GGML dims (ne0 = row length) and claims it. */
static int find_matrix(model_loader *ld, const char *name, int64_t ne0, int64_t ne1,
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
    model_claim(ld, t);
    return CART_OK;
}

int model_load_weight(model_loader *ld, const char *name, int64_t cols, int64_t rows, cart_weight *w,
                      uint64_t *bytes) {
    const cart_gguf_tensor_info *t;
    int rc = find_matrix(ld, name, cols, rows, &t);
    if (rc) return rc;
    rc = cart_weight_init(w, t->dtype, t->data, rows, cols);
    if (rc) return cart_fail_context(rc, "%s: tensor '%s'", ld->path, name);
    *bytes += t->nbytes;
    return CART_OK;
}

int model_load_vector(model_loader *ld, const char *name, int64_t n, float **out, uint64_t *bytes) {
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
