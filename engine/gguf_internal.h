/*
 * gguf_internal.h - what the GGUF reader (gguf.c) and writer
 * (gguf_write.c) share: limits, the metadata type table, byte-order
 * helpers. Not installed; not part of the API.
 */
#ifndef CART_GGUF_INTERNAL_H
#define CART_GGUF_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "gguf.h"

enum {
    MAX_NEST = 8,           /* array nesting levels, the outermost array included */
    MAX_DIMS = 4,           /* GGML_MAX_DIMS */
    DEFAULT_ALIGNMENT = 32, /* GGUF_DEFAULT_ALIGNMENT */
    MAX_WRITE_NAME = 63,    /* llama.cpp rejects tensor names of GGML_MAX_NAME (64) bytes or more */
    FIRST_NON_GGML_DTYPE = 200,
    MIN_KV_BYTES = 13,     /* key length (8), type (4), a one-byte value */
    MIN_INFO_BYTES = 24,   /* name length (8), n_dims (4), dtype (4), offset (8) */
    MIN_NESTED_BYTES = 12, /* element type (4), count (8) */
    LABEL_CAP = 80,        /* bytes of a key or name quoted in a message */
};

/* An empty array's elements: a valid, aligned, never-freed address. */
static const uint64_t empty_array[1];

/* ---- type table --------------------------------------------------------- */

static const char *const type_names[] = {
    "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
    "bool",  "string", "array",  "uint64", "int64",  "float64",
};

static inline int type_is_known(int64_t t) {
    return t >= 0 && t <= CART_GGUF_FLOAT64;
}

/* Bytes of one scalar of type t in a file (and in a native array); 0 for
 * string, array and unknown types. */
static inline size_t scalar_size(int64_t t) {
    switch (t) {
    case CART_GGUF_UINT8:
    case CART_GGUF_INT8:
    case CART_GGUF_BOOL:
        return 1;
    case CART_GGUF_UINT16:
    case CART_GGUF_INT16:
        return 2;
    case CART_GGUF_UINT32:
    case CART_GGUF_INT32:
    case CART_GGUF_FLOAT32:
        return 4;
    case CART_GGUF_UINT64:
    case CART_GGUF_INT64:
    case CART_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

/* The fewest bytes one element of type t takes in a file. */
static inline uint64_t min_elem_bytes(int64_t t) {
    if (t == CART_GGUF_STRING) return 8;
    if (t == CART_GGUF_ARRAY) return MIN_NESTED_BYTES;
    return scalar_size(t);
}

static inline int type_is_integer(int32_t t) {
    switch (t) {
    case CART_GGUF_UINT8:
    case CART_GGUF_INT8:
    case CART_GGUF_UINT16:
    case CART_GGUF_INT16:
    case CART_GGUF_UINT32:
    case CART_GGUF_INT32:
    case CART_GGUF_UINT64:
    case CART_GGUF_INT64:
        return 1;
    default:
        return 0;
    }
}

static inline int type_is_signed(int32_t t) {
    return t == CART_GGUF_INT8 || t == CART_GGUF_INT16 || t == CART_GGUF_INT32 ||
           t == CART_GGUF_INT64;
}

static inline const char *type_name_or(int64_t t) {
    return type_is_known(t) ? type_names[t] : "unknown";
}

/* ---- little-endian helpers ---------------------------------------------- */

static inline uint16_t le16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t le64(const uint8_t *p) {
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static inline int host_is_little_endian(void) {
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* Reverses the bytes of each of n elements of `size` bytes, in place. */
static inline void swap_elements(void *buf, uint64_t n, size_t size) {
    uint8_t *p = buf;
    for (uint64_t i = 0; i < n; i++, p += size)
        for (size_t a = 0, b = size - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

static inline uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

static inline int is_pow2(uint64_t x) {
    return x != 0 && (x & (x - 1)) == 0;
}

/* Copies up to LABEL_CAP bytes of s into buf (LABEL_CAP + 4 bytes) for a
 * message: control bytes become '?', a longer string ends in "...". */
static inline const char *label(char *buf, const char *s, uint64_t len) {
    size_t n = len < LABEL_CAP ? (size_t)len : LABEL_CAP;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (len > LABEL_CAP) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
    return buf;
}

/* Compares two byte strings: bytes first, then the shorter one first. */
static inline int str_cmp(cart_str a, cart_str b) {
    uint64_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.data, b.data, (size_t)n) : 0;
    if (c) return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

#endif
