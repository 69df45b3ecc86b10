/*
 * safetensors.h - reading and writing .safetensors files.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON, then one
 * data blob. The JSON maps tensor names to {"dtype", "shape", "data_offsets"}
 * and may hold a "__metadata__" object of string values.
 *
 * The reader maps the file and validates the header strictly before handing
 * anything out: N within the file and at most 100 MB, the JSON an object,
 * every entry with a known dtype, a shape of non-negative integers (at most 8
 * dims), offsets [begin, end] inside the blob with end - begin equal to
 * shape x element size, entries tiling the blob contiguously from 0 with no
 * gap or overlap, no duplicate names, metadata values strings. A violation is
 * CART_E_FORMAT with a message naming the file, the tensor and the field.
 *
 * The writer sorts tensors as the Hugging Face implementation does: by dtype
 * in the order I64 F64 F32 I32 BF16 F16 I16 I8 U8 BOOL (its Dtype enum,
 * largest first; element alignment never increases along the blob), then by
 * name bytewise. It pads the header with spaces so that 8 + N is a multiple of
 * 8 and writes atomically: temporary file beside the target, fsync, rename.
 *
 * Names and metadata strings returned by the reader are NUL-terminated copies
 * owned by the handle (unlike GGUF's cart_str, which point into the file);
 * they live until cart_st_close.
 *
 * Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL, as cart_dtype
 * CART_F64 ... CART_BOOL.
 */
#ifndef CART_SAFETENSORS_H
#define CART_SAFETENSORS_H

#include <stdint.h>
#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_st_tensor {
    cart_str name;
    int32_t dtype;      /* cart_dtype */
    int32_t ndim;       /* 0..8 */
    int64_t shape[8];   /* row-major, outermost first; entries >= ndim are 1 */
    uint64_t offset;    /* from the start of the data blob */
    uint64_t nbytes;
    const void *data;   /* into the mapping; may be unaligned for files we did not write;
                           do not dereference when nbytes is 0 */
} cart_st_tensor;

typedef struct cart_st_meta {
    cart_str key;
    cart_str value;
} cart_st_meta;

typedef struct cart_st_file cart_st_file;

/* Opens, maps and validates `path`. Close with cart_st_close. Errors:
 * CART_E_IO (cannot open or map), CART_E_FORMAT (malformed header or data
 * layout), CART_E_UNSUPPORTED (a valid dtype this engine lacks, more than 8
 * dims), CART_E_NOMEM, CART_E_ARG (NULL arguments). */
int cart_st_open(cart_st_file **out, const char *path);

/* The same over caller-owned memory that outlives the handle; `name` (may be
 * NULL: "<memory>") is used in messages. */
int cart_st_open_memory(cart_st_file **out, const void *data, uint64_t size, const char *name);

void cart_st_close(cart_st_file *f);

const char *cart_st_path(const cart_st_file *f);
uint64_t cart_st_header_size(const cart_st_file *f); /* N, the JSON byte count */

/* Tensors in blob order; NULL out of range / when absent. */
int64_t cart_st_tensor_count(const cart_st_file *f);
const cart_st_tensor *cart_st_tensor_at(const cart_st_file *f, int64_t i);
const cart_st_tensor *cart_st_find(const cart_st_file *f, const char *name);

/* __metadata__ entries in header order; meta_get returns NULL when absent. */
int64_t cart_st_meta_count(const cart_st_file *f);
const cart_st_meta *cart_st_meta_at(const cart_st_file *f, int64_t i);
const cart_str *cart_st_meta_get(const cart_st_file *f, const char *key);

/* The safetensors spelling of a dtype ("F32", "BF16"), NULL if it has none. */
const char *cart_st_dtype_name(int32_t dtype);

/* The checksum of `n` bytes, as written under the metadata key
 * "cartridge.checksum": "cs64:" and 16 lowercase hex digits. cs64 reads the
 * bytes as little-endian 64-bit words in four interleaved lanes; lane j
 * starts at 0x9e3779b97f4a7c15 * (j + 1) and takes each word w as
 * h = rotl(h ^ w, 29) * 0x100000001b3; the last n mod 32 bytes, zero-padded
 * to a whole block, go through the same lanes; the lanes are folded in order
 * with the same step, then n is xored in and the splitmix64 finalizer applied.
 * Every step is a bijection, so a change to any one word always changes the
 * sum; it detects corruption, not tampering. out must hold 22 bytes. */
void cart_st_checksum(const void *data, uint64_t n, char *out);

/* Verifies the checksum a file carries: CART_OK when it matches,
 * CART_E_NOT_FOUND when the file has none (written without one, or by an
 * older version), CART_E_FORMAT naming the file, the stored and the computed
 * sums when the bytes changed. */
int cart_st_verify_checksum(const cart_st_file *f);

typedef struct cart_st_writer cart_st_writer;

int cart_st_writer_new(cart_st_writer **out);
void cart_st_writer_free(cart_st_writer *w);

/* Adds or replaces a __metadata__ entry (both strings copied; UTF-8). */
int cart_st_writer_set_meta(cart_st_writer *w, const char *key, const char *value);

/* Declares a tensor with its data (borrowed until write). ndim 0..8; the data
 * is shape x element-size bytes of `dtype`. Names must be unique, non-empty,
 * valid UTF-8 and not "__metadata__". Errors: CART_E_ARG (bad name, shape or
 * NULL data), CART_E_UNSUPPORTED (a dtype safetensors cannot hold, such as
 * q4_K), CART_E_NOMEM. */
int cart_st_writer_add(cart_st_writer *w, const char *name, int32_t dtype, int32_t ndim,
                       const int64_t *shape, const void *data);

/* Asks write to store a checksum of the data blob in __metadata__ under
 * CART_ST_CHECKSUM_KEY (see cart_st_checksum for the value). Off by
 * default, so that plain files stay byte-identical to other writers'. */
void cart_st_writer_add_checksum(cart_st_writer *w);

/* Writes the file atomically; parent directories must exist. CART_E_IO when
 * the file cannot be written (no temporary file is left behind and an
 * existing target is untouched). */
int cart_st_writer_write(cart_st_writer *w, const char *path);

#ifdef __cplusplus
}
#endif

#endif
