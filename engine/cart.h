/*
 * cart.h - the cartridge: trainable K/V prefix rows for every layer of a
 * model, and its artifact (a safetensors file).
 *
 * A cartridge holds, for every layer, K and V rows of shape [p, kv_heads,
 * head_dim] in f32, in exactly the KV cache's space: keys after the q/k norm
 * and after RoPE at positions 0..p-1 (never rotated again), values as
 * projected (gemma4: after their RMS norm). kv_heads and head_dim are each
 * layer's own (gemma4's sliding and full layers differ). The first `frozen`
 * rows (the attention sink) are constants; the other p - frozen rows of
 * every layer are the trainable parameters. train.h trains them.
 *
 * Behind a cartridge, real tokens sit at positions p, p+1, ...: query i sees
 * all p rows and real tokens 0..i -- except on a sliding-window layer, whose
 * query at position P sees only positions P - window + 1 .. P, prefix rows
 * included: exactly what a real prefill of the p corpus tokens would let it
 * see, so that a captured cartridge stays equivalent to that prefill.
 *
 * The artifact (docs/formats.md) is a safetensors file any reader opens:
 * per layer l, "layers.<l>.k" and "layers.<l>.v" F32 [p - frozen, kv_heads,
 * head_dim] (the trainable rows), "layers.<l>.k_sink" / ".v_sink" [frozen,
 * kv_heads, head_dim] when frozen > 0, and optionally "draft_reference" I64
 * [n] (corpus token ids for the drafter). Rows are in KV-cache order
 * (position, kv head, dim). Its metadata names the format, the
 * architecture, the geometry (n_layer, kv_heads, head_dim, p, frozen), the
 * model (name, fingerprint and content hash) and the training settings (a
 * JSON object's text), and a checksum covers every tensor's bytes.
 */
#ifndef CART_CART_H
#define CART_CART_H

#include <stdint.h>
#include "adam.h"
#include "kv.h"
#include "model.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif


typedef struct cart_cartridge cart_cartridge;

/* A zero cartridge of p rows per layer, the first `frozen` of them constant
 * (0 <= frozen < p). Free with cart_cartridge_free. */
int cart_cartridge_new(cart_cartridge **out, int32_t n_layer, int32_t kv_heads, int32_t head_dim,
                       int64_t p, int64_t frozen);
void cart_cartridge_free(cart_cartridge *c);

/* The same with each layer's own geometry: kv_heads[n_layer], head_dim[n_layer]. */
int cart_cartridge_new_layers(cart_cartridge **out, int32_t n_layer, const int32_t *kv_heads,
                              const int32_t *head_dim, int64_t p, int64_t frozen);

/* A cartridge shaped for m, layer by layer. */
int cart_cartridge_new_for(cart_cartridge **out, const cart_model *m, int64_t p, int64_t frozen);

int64_t cart_cartridge_p(const cart_cartridge *c);
int64_t cart_cartridge_frozen(const cart_cartridge *c);
int32_t cart_cartridge_n_layer(const cart_cartridge *c);
/* Layer 0's KV heads and head_dim (every layer's for a cartridge made by
 * cart_cartridge_new), and one layer's (0 for a layer out of range). */
int32_t cart_cartridge_kv_heads(const cart_cartridge *c);
int32_t cart_cartridge_head_dim(const cart_cartridge *c);
int32_t cart_cartridge_layer_heads(const cart_cartridge *c, int32_t layer);
int32_t cart_cartridge_layer_head_dim(const cart_cartridge *c, int32_t layer);

/* One layer's K (which = 0) or V (which = 1) rows, [p, kv_heads, head_dim]
 * f32, sink rows first. Borrowed and writable; NULL for a bad argument. */
float *cart_cartridge_rows(cart_cartridge *c, int32_t layer, int32_t which);

/* The gradient of the same rows, same layout; the backward adds into it and
 * leaves rows below `frozen` at zero. */
float *cart_cartridge_grad(cart_cartridge *c, int32_t layer, int32_t which);

/* Sets every gradient to zero. */
void cart_cartridge_zero_grad(cart_cartridge *c);

/* The largest magnitude a row value may have: the largest finite f16, what
 * an f16 KV cache can hold (a larger key or value overflows attention). */
#define CART_CARTRIDGE_MAX_ABS 65504.0f

/* Checks that every row value (grads = 0) is finite and within
 * +-CART_CARTRIDGE_MAX_ABS, or every gradient value (grads = 1) finite.
 * CART_OK, or CART_E_FORMAT naming the first value that is not as the
 * artifact's tensor names it ("layers.3.v" or "layers.3.v_sink"), its row
 * and the value. */
int cart_cartridge_check_finite(const cart_cartridge *c, int32_t grads);

/* Runs m over tokens[0..p) at positions 0..p-1 (the inference forward,
 * through a cache of kv_dtype: CART_F32, or CART_F16 to reproduce exactly
 * what a serving cache of f16 would hold) and copies every layer's K/V rows
 * into c: the model's own KV cache of those tokens. n must equal p. */
int cart_cartridge_capture(cart_cartridge *c, cart_model *m, const int32_t *tokens, int64_t n,
                           int32_t kv_dtype);

/* Fills every row (sinks included) with N(0, std^2) from rng.h's generator
 * seeded with `seed`, layer by layer, K then V. */
void cart_cartridge_init_random(cart_cartridge *c, uint64_t seed, float std);

/* Writes the p rows of every layer into kv at positions len..len+p-1
 * (converted to the cache's dtype) and advances len by p: into an empty
 * cache to serve, or after another cartridge's rows to compose them. The
 * cache's geometry must match and have room. */
int cart_cartridge_append_to_kv(const cart_cartridge *c, cart_kv *kv);

/* Composition: several cartridges of one geometry side by side in a cache.
 * A composed cartridge holds, for every layer, parts[0]'s p_0 rows (its sinks
 * first), then parts[1]'s p_1 rows, and so on: P = sum of p_i rows, frozen =
 * parts[0]'s. Every part keeps the positions its rows were made at (keys
 * stay rotated for 0..p_i-1, or wherever they were captured); tokens behind
 * the composition sit at positions P, P+1, ... Writing a composed cartridge
 * into a cache is the same as appending its parts in order.
 *
 * cart_cartridge_compose makes a new composed cartridge (rows copied, zero
 * gradient); the parts must share n_layer, kv_heads and head_dim (else
 * CART_E_ARG naming part i's geometry and part 0's). Free with
 * cart_cartridge_free. */
int cart_cartridge_compose(cart_cartridge **out, const cart_cartridge *const *parts, int32_t n_parts);

/* Training through a composition: adds the composed cartridge's gradient of
 * part i's rows (rows P_i..P_i+p_i-1, P_i = p_0 + ... + p_{i-1}) into part
 * i's gradient, except each part's own frozen rows, whose gradient stays as
 * it was. The parts must be the ones composed (same geometries and p in
 * order, summing to the composed p). */
int cart_cartridge_compose_grad(const cart_cartridge *composed, cart_cartridge *const *parts,
                                int32_t n_parts);

/* Copies n rows of every layer (K and V) from src rows src_row.. into dst
 * rows dst_row..; the two must share the geometry and the ranges lie within
 * each. Gradients are untouched. (Splitting a captured cartridge into parts,
 * as the composed equivalence gate does.) */
int cart_cartridge_copy_rows(cart_cartridge *dst, int64_t dst_row, const cart_cartridge *src,
                             int64_t src_row, int64_t n);

/* Adam over the trainable rows: cart_adam_size(a) must equal
 * cart_cartridge_trainable_count(c). Runs one optimizer step with c's
 * gradients (layer by layer, K then V, rows frozen..p-1). */
int64_t cart_cartridge_trainable_count(const cart_cartridge *c);
int cart_cartridge_adam_step(cart_cartridge *c, cart_adam *a);

/* The gradient of the trainable rows as one vector of
 * cart_cartridge_trainable_count(c) floats, in the optimizer's order (layer
 * by layer, K then V, rows frozen..p-1): copied out into dst, or in from
 * src (the frozen rows' gradient stays zero). For summing the gradients of
 * several passes, or of several processes (dist.h). */
void cart_cartridge_grad_export(const cart_cartridge *c, float *dst);
void cart_cartridge_grad_import(cart_cartridge *c, const float *src);

/* ---- the artifact ---------------------------------------------------------- */

/* The format this version writes; it reads it and "cartridge-v1" (no
 * content hash: a v1 file is checked by the sampled fingerprint only, with
 * a warning). */
#define CART_CARTRIDGE_FORMAT "cartridge-v2"

/* What an artifact records besides the rows; every field may be 0/NULL. */
typedef struct cart_cartridge_save_options {
    const char *training_json;      /* cartridge.training: a JSON object's text (NULL: "{}") */
    const int32_t *draft_reference; /* corpus token ids, stored as "draft_reference" I64 */
    int64_t n_draft;
    const char *const *meta_keys;   /* more metadata entries, n_meta of each */
    const char *const *meta_values;
    int32_t n_meta;
    int32_t reserved;               /* 0 */
} cart_cartridge_save_options;

/* Writes c, trained on m, to `path` atomically (a temporary file beside it,
 * fsynced, renamed; a target that exists and is not a regular file is
 * refused). Every row must be finite and within +-CART_CARTRIDGE_MAX_ABS
 * (CART_E_FORMAT naming the first that is not). opts may be NULL. */
int cart_cartridge_save(const cart_cartridge *c, const cart_model *m, const char *path,
                        const cart_cartridge_save_options *opts);

/* An artifact opened and checked, its rows read in place from the file's
 * mapping. */
typedef struct cart_cartridge_file cart_cartridge_file;

enum {
    /* load a cartridge whose metadata names another model (fingerprint,
     * content hash, architecture) or lacks its identity or geometry, with a
     * warning; its tensors must still fit the model */
    CART_CARTRIDGE_FOREIGN = 1
};

/* Opens `path` after sweeping the temporary files dead writers left beside
 * it, and checks it as a cartridge: the checksum (a file without one opens,
 * with a warning), exactly the expected tensors (names, F32, shapes; the
 * same rows in every layer), every row finite and within
 * +-CART_CARTRIDGE_MAX_ABS, draft_reference a non-empty I64 vector of token
 * ids, and the metadata: a format this version reads and the geometry its
 * tensors have. With a model m (may be NULL) also: the model's layers and
 * KV geometry, the draft ids within its vocabulary, and the identity (the
 * architecture, the fingerprint, a v2 file's content hash of every weight
 * byte), which without CART_CARTRIDGE_FOREIGN in flags refuses another
 * model's cartridge. Errors (CART_E_FORMAT, or the reader's) say
 * "<path>: what", and what to do. Close with cart_cartridge_file_close. */
int cart_cartridge_open(cart_cartridge_file **out, const char *path, const cart_model *m, int32_t flags);
void cart_cartridge_file_close(cart_cartridge_file *f);

/* What the open noticed and let pass, one "<path>: ..." line each ending in
 * a newline: the temporary files it removed, a file without a checksum, a
 * foreign cartridge loaded anyway, a v1 file. "" when nothing. */
const char *cart_cartridge_file_warnings(const cart_cartridge_file *f);

/* The file's safetensors view (its metadata: cart_st_meta_get). Borrowed. */
const cart_st_file *cart_cartridge_file_st(const cart_cartridge_file *f);

int32_t cart_cartridge_file_n_layer(const cart_cartridge_file *f);
int64_t cart_cartridge_file_p(const cart_cartridge_file *f);
int64_t cart_cartridge_file_frozen(const cart_cartridge_file *f);
/* Layer l's KV heads and head_dim (0 out of range). */
int32_t cart_cartridge_file_layer_heads(const cart_cartridge_file *f, int32_t layer);
int32_t cart_cartridge_file_layer_head_dim(const cart_cartridge_file *f, int32_t layer);

/* Layer l's rows in the file, [n, kv_heads, head_dim] f32 (which: 0 = K, 1
 * = V): the trainable rows (sink = 0, n = p - frozen) or the sink rows
 * (sink = 1, n = frozen; NULL when frozen is 0). Valid until close. */
const float *cart_cartridge_file_rows(const cart_cartridge_file *f, int32_t layer, int32_t which, int32_t sink);

/* The draft reference's token ids (*ids borrowed until close; NULL and 0
 * when the file has none). */
int64_t cart_cartridge_file_draft(const cart_cartridge_file *f, const int32_t **ids);

/* A cartridge of the file's geometry holding its rows (a copy; the file may
 * be closed after). */
int cart_cartridge_file_load(cart_cartridge **out, const cart_cartridge_file *f);

/* Open, load and close in one call; warnings go nowhere (open the file to
 * read them). */
int cart_cartridge_load(cart_cartridge **out, const char *path, const cart_model *m, int32_t flags);

#ifdef __cplusplus
}
#endif

#endif
