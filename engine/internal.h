/*
 * internal.h - helpers shared by the engine's .c files; not part of the API.
 *
 * Everything declared here has hidden visibility: it is not exported from
 * libcartridge and the FFI never sees it.
 */
#ifndef CART_INTERNAL_H
#define CART_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"

#pragma GCC visibility push(hidden)

/* Records `status` and a printf-style message as this thread's last error and
 * returns status, so callers can write `return cart_fail(CART_E_ARG, ...)`. */
int cart_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Like cart_fail but appends ": <strerror(errno)>" for the current errno. */
int cart_fail_errno(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the current last error with "<prefix>: " (for adding context such
 * as a file name to an error raised deeper down) and returns status. */
int cart_fail_context(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* malloc/calloc/realloc that record CART_E_NOMEM with `what` on failure. */
void *cart_malloc(size_t n, const char *what);
void *cart_calloc(size_t count, size_t size, const char *what);
void *cart_realloc(void *p, size_t n, const char *what);
char *cart_strdup(const char *s, const char *what);

/* A read-only view of a whole file. `owned` is 1 when the bytes are an mmap
 * this struct must unmap. */
typedef struct cart_mapping {
    const uint8_t *data;
    uint64_t size;
    int owned;
} cart_mapping;

/* Maps `path` read-only (an empty file gives size 0 and data NULL). */
int cart_map_file(cart_mapping *m, const char *path);
void cart_unmap_file(cart_mapping *m);

/* An output file written atomically: bytes go to "<path>.tmp.<pid>.<n>" in the
 * target's directory; commit flushes, fsyncs, renames over path and fsyncs
 * the directory; abort (or a failed commit) removes the temporary file. */
typedef struct cart_afile {
    FILE *fp;
    char *path;
    char *tmp_path;
    uint64_t written;
    int failed; /* a write failed; commit will refuse */
} cart_afile;

int cart_afile_open(cart_afile *f, const char *path);
int cart_afile_write(cart_afile *f, const void *data, size_t n);
int cart_afile_pad(cart_afile *f, uint64_t alignment); /* zero bytes up to a multiple */
int cart_afile_commit(cart_afile *f);
void cart_afile_abort(cart_afile *f);

/* The cs64 checksum (its definition: cart_st_checksum in safetensors.h) as a
 * stream: init, update with any number of pieces (the result depends only on
 * the bytes, not on how they are split), final for the 64-bit value. */
typedef struct cart_cs64 {
    uint64_t lane[4];
    uint8_t block[32]; /* a partial block */
    size_t fill;
    uint64_t n;
} cart_cs64;

void cart_cs64_init(cart_cs64 *c);
void cart_cs64_update(cart_cs64 *c, const void *data, uint64_t n);
/* One 64-bit value as its 8 little-endian bytes. */
void cart_cs64_update_u64(cart_cs64 *c, uint64_t v);
uint64_t cart_cs64_final(cart_cs64 *c);

/* The cartridge's rows for the trainer (cart.c): layer's K (which = 0) or V
 * rows, read-only; and the check that c's geometry is m's, CART_E_ARG
 * naming fn and both geometries when not. */
struct cart_cartridge;
struct cart_model;
const float *cart_cartridge_rows_of(const struct cart_cartridge *c, int32_t layer, int32_t which);
int cart_cartridge_check_model(const struct cart_cartridge *c, const struct cart_model *m, const char *fn);
/* CART_E_FORMAT naming value x of row `row` of tensor "layers.<layer>.<k|v>"
 * (+ "_sink" when sink) as not finite, or as beyond
 * CART_CARTRIDGE_MAX_ABS; `what` is "the data" or "the gradient". */
int cart_cartridge_value_error(const char *what, int32_t layer, int32_t which, int sink, int64_t row, float x);

#pragma GCC visibility pop

#endif
