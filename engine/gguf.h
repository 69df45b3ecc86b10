/*
 * gguf.h - reading and writing GGUF files (versions 2 and 3).
 *
 * Reader: cart_gguf_open maps the file read-only and parses the header, the
 * metadata and the tensor infos up front. Every count, length and offset read
 * from the file is checked against the bytes that exist; a truncated or
 * crafted file fails with CART_E_FORMAT and a message naming the field (for
 * example "model.gguf: tensor 3 ('blk.0.attn_q.weight') data [..) runs past
 * the end of the file (1185376 bytes)"), never a crash. Strings returned by
 * the reader point into the mapping and live until cart_gguf_close.
 *
 * Tensor dims are in GGML order: ne[0] is the number of elements in a row
 * (the fastest-varying dimension), ne[n_dims-1] the outermost. The row-major
 * shape of a tensor is ne reversed.
 *
 * Writer: collects metadata and tensor infos, then writes a version 3 file
 * that llama.cpp reads, aligned to general.alignment (default 32). The file is
 * written to a temporary name beside the target, fsync'ed, then renamed, so a
 * reader never sees a torn file.
 */
#ifndef CART_GGUF_H
#define CART_GGUF_H

#include <stdint.h>
#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cart_gguf_type {
    CART_GGUF_UINT8 = 0,
    CART_GGUF_INT8 = 1,
    CART_GGUF_UINT16 = 2,
    CART_GGUF_INT16 = 3,
    CART_GGUF_UINT32 = 4,
    CART_GGUF_INT32 = 5,
    CART_GGUF_FLOAT32 = 6,
    CART_GGUF_BOOL = 7,
    CART_GGUF_STRING = 8,
    CART_GGUF_ARRAY = 9,
    CART_GGUF_UINT64 = 10,
    CART_GGUF_INT64 = 11,
    CART_GGUF_FLOAT64 = 12
} cart_gguf_type;

/* A metadata value.
 * Scalars: unsigned integers and bool (0 or 1) in as.u64, signed integers in
 * as.i64, float32/float64 in as.f64, strings in as.str.
 * Arrays: type is CART_GGUF_ARRAY, elem_type the element type, count the
 * number of elements and as.array points to them, aligned and in native
 * layout: uint8_t[] ... double[] for numbers (bool as uint8_t, the file's
 * raw bytes), cart_str[] for strings, cart_gguf_value[] for nested arrays.
 * as.array is never NULL, even for an empty array. Nesting is limited to 8
 * levels of arrays. */
typedef struct cart_gguf_value {
    int32_t type;      /* cart_gguf_type */
    int32_t elem_type; /* arrays: cart_gguf_type of the elements; else -1 */
    uint64_t count;    /* arrays: number of elements; else 1 */
    union {
        uint64_t u64;
        int64_t i64;
        double f64;
        cart_str str;
        const void *array;
    } as;
} cart_gguf_value;

typedef struct cart_gguf_kv {
    cart_str key;
    cart_gguf_value value;
} cart_gguf_kv;

typedef struct cart_gguf_tensor_info {
    cart_str name;
    int32_t dtype;     /* cart_dtype (GGML type id) */
    int32_t n_dims;    /* 1..4 (a 0-dim tensor in the file reads as 1 dim of 1) */
    int64_t ne[4];     /* GGML order, ne[0] fastest; entries >= n_dims are 1 */
    uint64_t offset;   /* from the start of the data section */
    uint64_t nbytes;   /* bytes of tensor data */
    const void *data;  /* the data in the mapping (offset already applied) */
} cart_gguf_tensor_info;

typedef struct cart_gguf cart_gguf;

/* Opens and parses `path`. On success *out owns the mapping; close it with
 * cart_gguf_close. Errors: CART_E_IO (cannot open or map), CART_E_FORMAT
 * (bad magic, truncated, out-of-range field), CART_E_UNSUPPORTED (version 1,
 * big-endian file). */
int cart_gguf_open(cart_gguf **out, const char *path);

/* The same over `size` bytes at `data`, which the caller keeps alive and
 * unchanged until cart_gguf_close. `name` is used in messages. */
int cart_gguf_open_memory(cart_gguf **out, const void *data, uint64_t size, const char *name);

/* Releases the mapping and everything the reader returned. NULL is a no-op. */
void cart_gguf_close(cart_gguf *g);

/* Header facts. */
uint32_t cart_gguf_version(const cart_gguf *g);
uint64_t cart_gguf_alignment(const cart_gguf *g);   /* general.alignment or 32 */
uint64_t cart_gguf_data_offset(const cart_gguf *g); /* file offset of the data section */
uint64_t cart_gguf_file_size(const cart_gguf *g);
const char *cart_gguf_path(const cart_gguf *g);     /* as given to open; NUL-terminated */

/* Metadata in file order. kv_at returns NULL for an index out of range. */
int64_t cart_gguf_kv_count(const cart_gguf *g);
const cart_gguf_kv *cart_gguf_kv_at(const cart_gguf *g, int64_t i);

/* The value stored under `key`, or NULL when there is none. */
const cart_gguf_value *cart_gguf_find(const cart_gguf *g, const char *key);

/* Typed getters. Each fails with CART_E_NOT_FOUND when the key is absent and
 * CART_E_FORMAT when its type does not fit, naming the key and the types.
 * get_u32/get_u64/get_i64 accept any integer type whose value fits;
 * get_f32/get_f64 accept float32, float64 and integer types (a float64 beyond
 * float range becomes +-inf in get_f32); get_bool accepts bool. */
int cart_gguf_get_u32(uint32_t *out, const cart_gguf *g, const char *key);
int cart_gguf_get_u64(uint64_t *out, const cart_gguf *g, const char *key);
int cart_gguf_get_i64(int64_t *out, const cart_gguf *g, const char *key);
int cart_gguf_get_f32(float *out, const cart_gguf *g, const char *key);
int cart_gguf_get_f64(double *out, const cart_gguf *g, const char *key);
int cart_gguf_get_bool(int32_t *out, const cart_gguf *g, const char *key);
int cart_gguf_get_str(cart_str *out, const cart_gguf *g, const char *key);

/* Tensor infos in file order; tensor_at returns NULL out of range,
 * find_tensor NULL when no tensor has that name. */
int64_t cart_gguf_tensor_count(const cart_gguf *g);
const cart_gguf_tensor_info *cart_gguf_tensor_at(const cart_gguf *g, int64_t i);
const cart_gguf_tensor_info *cart_gguf_find_tensor(const cart_gguf *g, const char *name);

/* A name for a metadata type: "uint32", "string", "array". NULL if unknown. */
const char *cart_gguf_type_name(int32_t type);

typedef struct cart_gguf_writer cart_gguf_writer;

/* An empty writer. Free with cart_gguf_writer_free (NULL is a no-op); freeing
 * a writer with a file in progress removes its temporary file. */
int cart_gguf_writer_new(cart_gguf_writer **out);
void cart_gguf_writer_free(cart_gguf_writer *w);

/* Sets metadata `key` to a deep copy of *value (any type, nested arrays
 * included). Setting a key again replaces its value in place; keys keep the
 * order of their first set. A value read from a cart_gguf can be passed as
 * is, which is how metadata is copied from one file to another. */
int cart_gguf_writer_set(cart_gguf_writer *w, const char *key, const cart_gguf_value *value);

/* Shorthands for cart_gguf_writer_set. */
int cart_gguf_writer_set_u32(cart_gguf_writer *w, const char *key, uint32_t v);
int cart_gguf_writer_set_i32(cart_gguf_writer *w, const char *key, int32_t v);
int cart_gguf_writer_set_u64(cart_gguf_writer *w, const char *key, uint64_t v);
int cart_gguf_writer_set_i64(cart_gguf_writer *w, const char *key, int64_t v);
int cart_gguf_writer_set_f32(cart_gguf_writer *w, const char *key, float v);
int cart_gguf_writer_set_f64(cart_gguf_writer *w, const char *key, double v);
int cart_gguf_writer_set_bool(cart_gguf_writer *w, const char *key, int32_t v);
int cart_gguf_writer_set_str(cart_gguf_writer *w, const char *key, const char *v);
/* A numeric array: n elements of elem_type (not STRING/ARRAY) in native layout. */
int cart_gguf_writer_set_array(cart_gguf_writer *w, const char *key, int32_t elem_type,
                               const void *data, uint64_t n);
/* An array of n NUL-terminated strings. */
int cart_gguf_writer_set_str_array(cart_gguf_writer *w, const char *key,
                                   const char *const *strs, uint64_t n);

/* Removes `key` if present. */
void cart_gguf_writer_remove(cart_gguf_writer *w, const char *key);

/* Declares a tensor: name unique and shorter than 64 bytes (llama.cpp's
 * limit), dtype a GGML type (not u8/bool), n_dims 1..4, ne in GGML order,
 * ne[0] a multiple of dtype's block size. `data` (nbytes as cart_dtype_nbytes gives)
 * is borrowed until the file is written; it may be NULL when the data will
 * be streamed with cart_gguf_writer_write_tensor. */
int cart_gguf_writer_add_tensor(cart_gguf_writer *w, const char *name, int32_t dtype,
                                int32_t n_dims, const int64_t *ne, const void *data);

/* Writes the whole file to `path` atomically; every tensor needs its data. */
int cart_gguf_writer_write(cart_gguf_writer *w, const char *path);

/* Streaming: begin writes the header and tensor infos to a temporary file
 * beside `path`; write_tensor then gives each tensor's data in the order the
 * tensors were added (the name is checked); finish pads, fsyncs and renames.
 * Between begin and finish no metadata or tensor may be added; after finish
 * the writer is idle again and may be extended and written anew. */
int cart_gguf_writer_begin(cart_gguf_writer *w, const char *path);
int cart_gguf_writer_write_tensor(cart_gguf_writer *w, const char *name, const void *data);
int cart_gguf_writer_finish(cart_gguf_writer *w);

#ifdef __cplusplus
}
#endif

#endif
