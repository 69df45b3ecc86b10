/*
 * kv.h - per-layer key/value caches.
 *
 * A cache holds, for every layer, K and V rows of shape [capacity, kv_heads,
 * head_dim] in f16 (the default) or f32. kv_heads and head_dim may differ
 * from layer to layer (gemma4's sliding-window and full-attention layers). Row r is the token at position r:
 * keys are stored after the q/k norm and after RoPE at that position, values
 * as projected. The capacity is fixed at creation.
 *
 * `len` is the number of valid rows. The model's forward appends at len;
 * truncate rewinds. Rows can also be written from outside (cart_kv_write),
 * which is how a cartridge enters a cache: write its p rows at positions
 * 0..p-1 of every layer, set len to p, and decode on from position p.
 */
#ifndef CART_KV_H
#define CART_KV_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_kv cart_kv;

/* A new empty cache. dtype is CART_F16 or CART_F32; capacity >= 1 rows.
 * Memory: 2 * n_layer * capacity * kv_heads * head_dim * (2 or 4) bytes. */
int cart_kv_new(cart_kv **out, int32_t n_layer, int32_t kv_heads, int32_t head_dim,
                int64_t capacity, int32_t dtype);
void cart_kv_free(cart_kv *kv);

/* The same with each layer's own geometry: kv_heads[n_layer], head_dim[n_layer]. */
int cart_kv_new_layers(cart_kv **out, int32_t n_layer, const int32_t *kv_heads,
                       const int32_t *head_dim, int64_t capacity, int32_t dtype);

int64_t cart_kv_len(const cart_kv *kv);
int64_t cart_kv_capacity(const cart_kv *kv);
int32_t cart_kv_dtype(const cart_kv *kv);
int32_t cart_kv_n_layer(const cart_kv *kv);
/* Layer 0's heads and head_dim: every layer's in a cache made by
 * cart_kv_new; see the per-layer functions for one whose layers differ. */
int32_t cart_kv_heads(const cart_kv *kv);
int32_t cart_kv_head_dim(const cart_kv *kv);
/* One layer's heads and head_dim (0 for a layer out of range). */
int32_t cart_kv_layer_heads(const cart_kv *kv, int32_t layer);
int32_t cart_kv_layer_head_dim(const cart_kv *kv, int32_t layer);
/* 1 when a and b have the same layers with the same heads and head_dim. */
int cart_kv_same_geometry(const cart_kv *a, const cart_kv *b);
/* Bytes of every layer's K and V storage. */
uint64_t cart_kv_bytes(const cart_kv *kv);

/* Drops rows from len down to `len` (0 <= len <= current len). */
int cart_kv_truncate(cart_kv *kv, int64_t len);

/* Sets len directly (0 <= len <= capacity); rows below it must hold data
 * (written by the forward or by cart_kv_write). */
int cart_kv_set_len(cart_kv *kv, int64_t len);

/* Writes n rows of layer `layer` at positions pos..pos+n-1 from f32 arrays k
 * and v of shape [n, kv_heads, head_dim] (that layer's) (either may be NULL to leave that
 * side alone), converting to the cache dtype (f16: round to nearest even).
 * Does not change len. */
int cart_kv_write(cart_kv *kv, int32_t layer, int64_t pos, int64_t n, const float *k,
                  const float *v);

/* Reads n rows of layer `layer` from position pos into f32 arrays k / v of
 * shape [n, kv_heads, head_dim] (either may be NULL). Rows must lie below
 * the capacity. */
int cart_kv_read(const cart_kv *kv, int32_t layer, int64_t pos, int64_t n, float *k, float *v);

/* Copies the first n rows of every layer from src into dst (the same
 * geometry, layer by layer; dtypes may differ) and sets dst's len to n. */
int cart_kv_copy(cart_kv *dst, const cart_kv *src, int64_t n);

/* Raw row storage of one layer: K (which = 0) or V (which = 1), row r at
 * byte offset r * kv_heads * head_dim * elsize (that layer's). Borrowed;
 * lives with kv. */
void *cart_kv_rows(cart_kv *kv, int32_t layer, int32_t which);

#ifdef __cplusplus
}
#endif

#endif
