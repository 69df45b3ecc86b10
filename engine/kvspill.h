/*
 * kvspill.h - the server's KV spill file: the cache rows of one
 * conversation (after a cartridge's rows) in a safetensors file, so that a
 * later request sharing its tokens adopts them instead of prefilling
 * (docs/formats.md). cartridge.kvstore keeps the directory: which files it
 * holds, its bound, the least recently used first; each file is written,
 * checked and read here.
 *
 * Layout: "tokens" I32 [n] (n >= 1), and for each layer l "layers.<l>.k"
 * and "layers.<l>.v" [n, kv_heads, head_dim] in the cache's dtype (F16 or
 * F32: the rows' bytes as the cache holds them). __metadata__:
 *   kvspill.format          "cartridge-kv-spill"
 *   kvspill.version         "1"
 *   kvspill.model           the model's name (shown in messages)
 *   kvspill.model_hash      a hash of the model's weights (the caller's)
 *   kvspill.cartridge       the cartridge's name (shown in messages)
 *   kvspill.cartridge_hash  a hash of its rows (the caller's); "none" for the bare model
 *   kvspill.cartridge_p     its row count, in decimal
 *   kvspill.dtype           "f16" or "f32"
 *   kvspill.checksum        "cs64:" and 16 hex digits: cs64 (safetensors.h)
 *                           of the lines "<name> <dtype> [<dims joined by
 *                           ,>] <cs64 of the tensor's bytes>", one per
 *                           tensor, sorted bytewise, joined by "\n"; every
 *                           byte is bound to its tensor, so offsets swapped
 *                           in the header are caught as well as a changed byte.
 */
#ifndef CART_KVSPILL_H
#define CART_KVSPILL_H

#include <stdint.h>

#include "kv.h"
#include "model.h"

#define CART_KVSPILL_FORMAT "cartridge-kv-spill"
#define CART_KVSPILL_VERSION "1"

/* Whose rows a file holds: the model and the cartridge before them. */
typedef struct cart_kvspill_owner {
    const char *model;          /* name */
    const char *model_hash;     /* the caller's hash of the weights */
    const char *cartridge;      /* name ("?" when unknown) */
    const char *cartridge_hash; /* the caller's hash of its rows; "none": the bare model */
    int64_t p;                  /* the cartridge's rows at the start of the cache */
} cart_kvspill_owner;

/* Writes rows p .. p + n - 1 of kv (tokens: the n ids they hold) to path,
 * atomically (temporary file, fsync, rename). Errors: CART_E_ARG (n < 1, kv
 * holding fewer than p + n rows, a missing owner field), CART_E_IO,
 * CART_E_NOMEM. */
int cart_kvspill_write(const char *path, cart_kv *kv, const int32_t *tokens, int64_t n,
                       const cart_kvspill_owner *owner);

typedef struct cart_kvspill cart_kvspill;

/* Opens path as a spill file for model m, its weights' hash and a cache
 * dtype (CART_F16 or CART_F32), checking everything but the checksum of the
 * bytes (cart_kvspill_verify): the format, the tensors' names, dtypes and
 * shapes for m's layers, the tokens within m's vocabulary, the metadata.
 * Errors: CART_E_FORMAT for a damaged file (not a spill file, a tensor of
 * the wrong shape, a token outside the vocabulary, no checksum); 
 * CART_E_UNSUPPORTED for a sound file that is another's (another format
 * version, model hash or dtype); CART_E_IO, CART_E_NOMEM. The message names
 * the file and the problem. */
int cart_kvspill_open(cart_kvspill **out, const char *path, const cart_model *m, const char *model_hash,
                      int32_t dtype);
void cart_kvspill_close(cart_kvspill *f);

int64_t cart_kvspill_n(const cart_kvspill *f);               /* tokens */
const int32_t *cart_kvspill_tokens(const cart_kvspill *f);   /* n ids */
int64_t cart_kvspill_p(const cart_kvspill *f);               /* kvspill.cartridge_p */
/* A metadata value ("kvspill.cartridge_hash", ...); NULL when absent. */
const char *cart_kvspill_meta(const cart_kvspill *f, const char *key);

/* The checksum of every byte against kvspill.checksum: CART_OK, or
 * CART_E_FORMAT naming the stored and the computed sums. */
int cart_kvspill_verify(const cart_kvspill *f);

/* Copies the rows of the file's first n tokens into kv after its p rows
 * (kv's length must be p, its geometry and dtype the file's) and sets its
 * length to p + n. Errors: CART_E_ARG (n outside 1 .. the file's, kv not
 * holding p rows or too small). */
int cart_kvspill_load(const cart_kvspill *f, cart_kv *kv, int64_t n);

#endif
