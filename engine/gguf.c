/*
 * gguf.c - the GGUF reader (versions 2 and 3); the writer is gguf_write.c.
 *
 * File layout (all little-endian):
 *   "GGUF", u32 version, u64 tensor count, u64 metadata count,
 *   metadata: { string key, u32 type, value } ...
 *   tensor infos: { string name, u32 n_dims, i64 ne[n_dims], u32 dtype, u64 offset } ...
 *   padding to general.alignment, then the data section; each tensor's offset
 *   is relative to the data section and a multiple of the alignment.
 * A string is a u64 length and that many bytes (no NUL). An array is a u32
 * element type, a u64 count and the elements.
 *
 * Reader: the parse walks the mapping with a cursor that checks every read
 * against the bytes left; counts are checked against the smallest size their
 * entries can take before anything is allocated, so a crafted count fails at
 * once instead of allocating. Parsed arrays live in an arena freed at close.
 *
 * Decisions the format leaves open:
 *   - n_dims 0 (a scalar, which llama.cpp accepts) is reported as n_dims 1
 *     with ne[0] = 1, keeping the contract's 1..4; more than 4 is an error.
 *   - Arrays may nest at most MAX_NEST levels (the top-level array counts).
 *   - Tensor data ranges may come in any order and have gaps, but must not
 *     overlap; zero-byte tensors overlap nothing.
 *   - dtype ids from 200 up (cartridge's u8/bool) are not GGML types and are
 *     rejected in files and by the writer.
 *   - Lookups use sorted indexes (binary search); the sort also finds
 *     duplicate keys and tensor names in O(n log n).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "gguf.h"
#include "gguf_internal.h"
#include "internal.h"

const char *cart_gguf_type_name(int32_t type) {
    return type_is_known(type) ? type_names[type] : NULL;
}

/* ---- arena: the reader's array storage ---------------------------------- */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
} arena_chunk;

enum { ARENA_HEAD = 32, ARENA_CHUNK = 1 << 16 }; /* ARENA_HEAD >= sizeof(arena_chunk), aligned */

/* A 16-byte aligned block of n bytes that lives until arena_free. */
static void *arena_alloc(arena_chunk **arena, size_t n) {
    n = (n + 15) & ~(size_t)15;
    arena_chunk *c = *arena;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        c = cart_malloc(ARENA_HEAD + cap, "GGUF metadata arrays");
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        if (*arena && n > ARENA_CHUNK) { /* keep filling the current chunk */
            c->next = (*arena)->next;
            (*arena)->next = c;
        } else {
            c->next = *arena;
            *arena = c;
        }
    }
    void *p = (uint8_t *)c + ARENA_HEAD + c->used;
    c->used += n;
    return p;
}

static void arena_free(arena_chunk *c) {
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
}

/* ---- the reader ----------------------------------------------------------- */

struct cart_gguf {
    cart_mapping map; /* owned mapping (cart_gguf_open) or zeroed (open_memory) */
    const uint8_t *data;
    uint64_t size;
    char *path;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    cart_gguf_kv *kvs;              /* (n_kv) file order */
    const cart_gguf_kv **kv_sorted; /* (n_kv) by key */
    int64_t n_tensors;
    cart_gguf_tensor_info *tensors;              /* (n_tensors) file order */
    const cart_gguf_tensor_info **tensor_sorted; /* (n_tensors) by name */
    arena_chunk *arena;
};

/* The cursor and what it is reading, for messages. */
typedef struct parser {
    const uint8_t *data;
    uint64_t size;
    uint64_t pos;
    const char *name; /* file name for messages */
    arena_chunk **arena;
    const char *section;     /* "header", "metadata entry", "tensor" */
    int64_t index;           /* entry number within the section, or -1 */
    cart_str label;          /* its key or name once read; data NULL before */
    int depth;               /* how many of elem[] are in use */
    uint64_t elem[MAX_NEST]; /* element indices of the arrays being read */
} parser;

static void appendf(char *buf, size_t cap, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void appendf(char *buf, size_t cap, size_t *n, const char *fmt, ...) {
    if (*n >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *n, cap - *n, fmt, ap);
    va_end(ap);
    if (k > 0) *n = *n + (size_t)k < cap ? *n + (size_t)k : cap;
}

/* Fails with CART_E_FORMAT: "<file>: <section> <index> ('<label>') array
 * element i, element j: <message>". */
static int perr(const parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int perr(const parser *ps, const char *fmt, ...) {
    char where[512];
    size_t n = 0;
    char lab[LABEL_CAP + 4];
    appendf(where, sizeof where, &n, "%s: %s", ps->name, ps->section);
    if (ps->index >= 0) appendf(where, sizeof where, &n, " %" PRId64, ps->index);
    if (ps->label.data)
        appendf(where, sizeof where, &n, " ('%s')", label(lab, ps->label.data, ps->label.len));
    for (int d = 0; d < ps->depth; d++)
        appendf(where, sizeof where, &n, d == 0 ? " array element %" PRIu64 : ", element %" PRIu64,
                ps->elem[d]);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cart_fail(CART_E_FORMAT, "%s: %s", where, msg);
}

static uint64_t left(const parser *ps) {
    return ps->size - ps->pos;
}

/* Checks that n more bytes exist for `what`. */
static int need(parser *ps, uint64_t n, const char *what) {
    if (n <= left(ps)) return CART_OK;
    return perr(ps,
                "%s runs past the end of the file: needs %" PRIu64 " bytes at offset %" PRIu64
                " (file is %" PRIu64 " bytes)",
                what, n, ps->pos, ps->size);
}

static int read_u32(parser *ps, uint32_t *out, const char *what) {
    int rc = need(ps, 4, what);
    if (rc) return rc;
    *out = le32(ps->data + ps->pos);
    ps->pos += 4;
    return CART_OK;
}

static int read_u64(parser *ps, uint64_t *out, const char *what) {
    int rc = need(ps, 8, what);
    if (rc) return rc;
    *out = le64(ps->data + ps->pos);
    ps->pos += 8;
    return CART_OK;
}

/* A string: u64 length, bytes. `what` names it ("key", "string"). */
static int read_str(parser *ps, cart_str *out, const char *what) {
    char field[64];
    snprintf(field, sizeof field, "%s length", what);
    uint64_t len;
    int rc = read_u64(ps, &len, field);
    if (rc) return rc;
    if (len > left(ps))
        return perr(ps,
                    "%s length %" PRIu64 " runs past the end of the file at offset %" PRIu64
                    " (file is %" PRIu64 " bytes)",
                    what, len, ps->pos, ps->size);
    out->data = (const char *)ps->data + ps->pos;
    out->len = len;
    ps->pos += len;
    return CART_OK;
}

static int read_value(parser *ps, cart_gguf_value *v, int32_t type, int depth);

/* An array value at nesting level `depth` (0 for a metadata value itself). */
static int read_array(parser *ps, cart_gguf_value *v, int depth) {
    if (depth >= MAX_NEST)
        return perr(ps, "arrays nested more than %d levels deep are not supported", MAX_NEST);
    uint32_t et;
    uint64_t count;
    int rc = read_u32(ps, &et, "array element type");
    if (rc) return rc;
    if (!type_is_known(et))
        return perr(ps,
                    "unknown array element type %" PRIu32 " at offset %" PRIu64 " (expected 0..12)",
                    et, ps->pos - 4);
    if ((rc = read_u64(ps, &count, "array count"))) return rc;
    uint64_t min = min_elem_bytes(et);
    if (count > left(ps) / min)
        return perr(ps,
                    "array count %" PRIu64 " of %s needs at least %" PRIu64
                    " bytes each, but only %" PRIu64 " bytes remain at offset %" PRIu64
                    " (file is %" PRIu64 " bytes)",
                    count, type_names[et], min, left(ps), ps->pos, ps->size);
    v->type = CART_GGUF_ARRAY;
    v->elem_type = (int32_t)et;
    v->count = count;
    v->as.array = empty_array;
    if (count == 0) return CART_OK;

    /* count * 16 <= 2 * left(ps) here, so these sizes cannot overflow. */
    if (et != CART_GGUF_STRING && et != CART_GGUF_ARRAY) {
        size_t nb = (size_t)(count * min);
        void *buf = arena_alloc(ps->arena, nb);
        if (!buf) return CART_E_NOMEM;
        memcpy(buf, ps->data + ps->pos, nb);
        if (min > 1 && !host_is_little_endian()) swap_elements(buf, count, (size_t)min);
        ps->pos += nb;
        v->as.array = buf;
        return CART_OK;
    }
    if (et == CART_GGUF_STRING) {
        cart_str *strs = arena_alloc(ps->arena, (size_t)count * sizeof *strs);
        if (!strs) return CART_E_NOMEM;
        ps->depth = depth + 1;
        for (uint64_t i = 0; i < count; i++) {
            ps->elem[depth] = i;
            if ((rc = read_str(ps, &strs[i], "string"))) return rc;
        }
        ps->depth = depth;
        v->as.array = strs;
        return CART_OK;
    }
    cart_gguf_value *vals = arena_alloc(ps->arena, (size_t)count * sizeof *vals);
    if (!vals) return CART_E_NOMEM;
    ps->depth = depth + 1;
    for (uint64_t i = 0; i < count; i++) {
        ps->elem[depth] = i;
        if ((rc = read_value(ps, &vals[i], CART_GGUF_ARRAY, depth + 1))) return rc;
    }
    ps->depth = depth;
    v->as.array = vals;
    return CART_OK;
}

/* A value of a known `type`. */
static int read_value(parser *ps, cart_gguf_value *v, int32_t type, int depth) {
    memset(v, 0, sizeof *v);
    v->type = type;
    v->elem_type = -1;
    v->count = 1;
    if (type == CART_GGUF_STRING) return read_str(ps, &v->as.str, "string");
    if (type == CART_GGUF_ARRAY) return read_array(ps, v, depth);
    size_t size = scalar_size(type);
    char what[32];
    snprintf(what, sizeof what, "%s value", type_name_or(type));
    int rc = need(ps, size, what);
    if (rc) return rc;
    const uint8_t *p = ps->data + ps->pos;
    ps->pos += size;
    switch (type) {
    case CART_GGUF_UINT8:
        v->as.u64 = p[0];
        break;
    case CART_GGUF_INT8:
        v->as.i64 = (int8_t)p[0];
        break;
    case CART_GGUF_BOOL:
        v->as.u64 = p[0] != 0;
        break;
    case CART_GGUF_UINT16:
        v->as.u64 = le16(p);
        break;
    case CART_GGUF_INT16:
        v->as.i64 = (int16_t)le16(p);
        break;
    case CART_GGUF_UINT32:
        v->as.u64 = le32(p);
        break;
    case CART_GGUF_INT32:
        v->as.i64 = (int32_t)le32(p);
        break;
    case CART_GGUF_UINT64:
        v->as.u64 = le64(p);
        break;
    case CART_GGUF_INT64:
        v->as.i64 = (int64_t)le64(p);
        break;
    case CART_GGUF_FLOAT32: {
        uint32_t bits = le32(p);
        float f;
        memcpy(&f, &bits, 4);
        v->as.f64 = f;
        break;
    }
    case CART_GGUF_FLOAT64: {
        uint64_t bits = le64(p);
        memcpy(&v->as.f64, &bits, 8);
        break;
    }
    default:
        return perr(ps, "unknown value type %" PRId32, type);
    }
    return CART_OK;
}

static int read_kv(parser *ps, cart_gguf_kv *kv) {
    int rc = read_str(ps, &kv->key, "key");
    if (rc) return rc;
    ps->label = kv->key;
    uint32_t type;
    if ((rc = read_u32(ps, &type, "value type"))) return rc;
    if (!type_is_known(type))
        return perr(ps, "unknown value type %" PRIu32 " at offset %" PRIu64 " (expected 0..12)",
                    type, ps->pos - 4);
    return read_value(ps, &kv->value, (int32_t)type, 0);
}

/* Reads one tensor info; the checks that need the alignment come later. */
static int read_tensor_info(parser *ps, cart_gguf_tensor_info *t) {
    int rc = read_str(ps, &t->name, "name");
    if (rc) return rc;
    ps->label = t->name;
    uint32_t n_dims;
    if ((rc = read_u32(ps, &n_dims, "n_dims"))) return rc;
    if (n_dims > MAX_DIMS)
        return perr(ps, "n_dims %" PRIu32 " at offset %" PRIu64 " is out of range (expected 0..%d)",
                    n_dims, ps->pos - 4, MAX_DIMS);
    for (int j = 0; j < MAX_DIMS; j++) t->ne[j] = 1;
    for (uint32_t j = 0; j < n_dims; j++) {
        uint64_t u;
        char what[16];
        snprintf(what, sizeof what, "ne[%" PRIu32 "]", j);
        if ((rc = read_u64(ps, &u, what))) return rc;
        t->ne[j] = (int64_t)u;
        if (t->ne[j] < 0) return perr(ps, "ne[%" PRIu32 "] = %" PRId64 " is negative", j, t->ne[j]);
    }
    t->n_dims = n_dims ? (int32_t)n_dims : 1; /* a scalar is a 1-element vector */
    uint32_t dtype;
    if ((rc = read_u32(ps, &dtype, "dtype"))) return rc;
    t->dtype = (int32_t)dtype;
    if ((rc = read_u64(ps, &t->offset, "data offset"))) return rc;
    return CART_OK;
}

/* Size, alignment and bounds of tensor t, with the data section known. */
static int check_tensor(parser *ps, cart_gguf_tensor_info *t, const cart_gguf *g) {
    cart_dtype_info info;
    if (t->dtype < 0 || t->dtype >= FIRST_NON_GGML_DTYPE ||
        cart_dtype_get_info(&info, t->dtype) != CART_OK)
        return perr(ps, "unknown dtype id %" PRIu32, (uint32_t)t->dtype);
    int64_t n = 1;
    for (int j = 0; j < t->n_dims; j++) {
        if (t->ne[j] != 0 && n > INT64_MAX / t->ne[j])
            return perr(ps,
                        "element count overflows: ne = [%" PRId64 ", %" PRId64 ", %" PRId64
                        ", %" PRId64 "]",
                        t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        n *= t->ne[j];
    }
    if (t->ne[0] % info.block_size != 0)
        return perr(ps, "ne[0] = %" PRId64 " is not a multiple of the %s block size %d", t->ne[0],
                    info.name, (int)info.block_size);
    if (cart_dtype_nbytes(&t->nbytes, t->dtype, n) != CART_OK)
        return perr(ps, "%" PRId64 " elements of %s overflow the byte count", n, info.name);
    if (t->offset % g->alignment != 0)
        return perr(ps, "data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                    t->offset, g->alignment);
    uint64_t data_size = g->size > g->data_offset ? g->size - g->data_offset : 0;
    if (t->offset > data_size || t->nbytes > data_size - t->offset)
        return perr(ps,
                    "data [%" PRIu64 ", +%" PRIu64 " bytes) runs past the end of the file (%" PRIu64
                    " bytes; the data section starts at %" PRIu64 " and holds %" PRIu64 " bytes)",
                    t->offset, t->nbytes, g->size, g->data_offset, data_size);
    uint64_t at = g->data_offset + t->offset;
    t->data = g->data + (at < g->size ? at : g->size);
    return CART_OK;
}

static int cmp_kv(const void *a, const void *b) {
    const cart_gguf_kv *x = *(const cart_gguf_kv *const *)a, *y = *(const cart_gguf_kv *const *)b;
    int c = str_cmp(x->key, y->key);
    return c ? c : (x > y) - (x < y);
}

static int cmp_tensor_name(const void *a, const void *b) {
    const cart_gguf_tensor_info *x = *(const cart_gguf_tensor_info *const *)a;
    const cart_gguf_tensor_info *y = *(const cart_gguf_tensor_info *const *)b;
    int c = str_cmp(x->name, y->name);
    return c ? c : (x > y) - (x < y);
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const cart_gguf_tensor_info *x = *(const cart_gguf_tensor_info *const *)a;
    const cart_gguf_tensor_info *y = *(const cart_gguf_tensor_info *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return (x > y) - (x < y);
}

static void set_where(parser *ps, const char *section, int64_t index, cart_str lab) {
    ps->section = section;
    ps->index = index;
    ps->label = lab;
    ps->depth = 0;
}

static int parse_header(cart_gguf *g, parser *ps, uint64_t *n_tensors, uint64_t *n_kv) {
    if (g->size < 4)
        return cart_fail(CART_E_FORMAT,
                         "%s: not a GGUF file: it is %" PRIu64
                         " bytes, too short for the 4-byte magic \"GGUF\"",
                         g->path, g->size);
    if (memcmp(g->data, "GGUF", 4) != 0) {
        char shown[8];
        label(shown, (const char *)g->data, 4);
        return cart_fail(CART_E_FORMAT,
                         "%s: not a GGUF file: the first 4 bytes are %02x %02x %02x %02x ('%s'), "
                         "expected \"GGUF\"",
                         g->path, g->data[0], g->data[1], g->data[2], g->data[3], shown);
    }
    ps->pos = 4;
    int rc = read_u32(ps, &g->version, "version");
    if (rc) return rc;
    uint32_t v = g->version;
    if (v == 1)
        return cart_fail(CART_E_UNSUPPORTED,
                         "%s: GGUF version 1 is not supported (it predates 64-bit counts); "
                         "re-convert the model with a current llama.cpp",
                         g->path);
    if (v != 2 && v != 3) {
        uint32_t swapped = __builtin_bswap32(v);
        if (swapped >= 1 && swapped <= 0xffff)
            return cart_fail(CART_E_UNSUPPORTED,
                             "%s: big-endian GGUF is not supported (version field reads %" PRIu32
                             " byte-swapped)",
                             g->path, swapped);
        if (v == 0) return cart_fail(CART_E_FORMAT, "%s: GGUF version 0 is invalid", g->path);
        return cart_fail(CART_E_UNSUPPORTED,
                         "%s: GGUF version %" PRIu32
                         " is not supported (this engine reads 2 and 3)",
                         g->path, v);
    }
    if ((rc = read_u64(ps, n_tensors, "tensor count"))) return rc;
    if ((rc = read_u64(ps, n_kv, "metadata count"))) return rc;
    if (*n_kv > left(ps) / MIN_KV_BYTES)
        return perr(ps,
                    "metadata count %" PRIu64 " is impossible: each entry takes at least %d bytes "
                    "and only %" PRIu64 " bytes follow the header (file is %" PRIu64 " bytes)",
                    *n_kv, MIN_KV_BYTES, left(ps), ps->size);
    if (*n_tensors > left(ps) / MIN_INFO_BYTES)
        return perr(ps,
                    "tensor count %" PRIu64 " is impossible: each tensor info takes at least %d "
                    "bytes and only %" PRIu64 " bytes follow the header (file is %" PRIu64
                    " bytes)",
                    *n_tensors, MIN_INFO_BYTES, left(ps), ps->size);
    return CART_OK;
}

/* general.alignment: absent (32) or a u32 power of two. */
static int find_alignment(cart_gguf *g, parser *ps) {
    g->alignment = DEFAULT_ALIGNMENT;
    const cart_gguf_value *v = cart_gguf_find(g, "general.alignment");
    if (!v) return CART_OK;
    for (int64_t i = 0; i < g->n_kv; i++)
        if (&g->kvs[i].value == v) set_where(ps, "metadata entry", i, g->kvs[i].key);
    if (v->type != CART_GGUF_UINT32)
        return perr(ps, "general.alignment has type %s, expected uint32", type_name_or(v->type));
    if (!is_pow2(v->as.u64))
        return perr(ps, "general.alignment %" PRIu64 " is not a power of two", v->as.u64);
    g->alignment = v->as.u64;
    return CART_OK;
}

static int parse(cart_gguf *g) {
    parser ps = {.data = g->data, .size = g->size, .name = g->path, .arena = &g->arena};
    set_where(&ps, "header", -1, (cart_str){0});
    uint64_t n_tensors, n_kv;
    int rc = parse_header(g, &ps, &n_tensors, &n_kv);
    if (rc) return rc;

    g->kvs = cart_calloc((size_t)n_kv, sizeof *g->kvs, "GGUF metadata");
    g->kv_sorted = cart_calloc((size_t)n_kv, sizeof *g->kv_sorted, "GGUF metadata index");
    if (!g->kvs || !g->kv_sorted) return CART_E_NOMEM;
    for (uint64_t i = 0; i < n_kv; i++) {
        set_where(&ps, "metadata entry", (int64_t)i, (cart_str){0});
        if ((rc = read_kv(&ps, &g->kvs[i]))) return rc;
        g->n_kv++;
    }

    set_where(&ps, "header", -1, (cart_str){0});
    if (n_tensors > left(&ps) / MIN_INFO_BYTES)
        return perr(&ps,
                    "tensor count %" PRIu64 " is impossible: each tensor info takes at least %d "
                    "bytes and only %" PRIu64 " bytes follow the metadata (file is %" PRIu64
                    " bytes)",
                    n_tensors, MIN_INFO_BYTES, left(&ps), ps.size);
    g->tensors = cart_calloc((size_t)n_tensors, sizeof *g->tensors, "GGUF tensor infos");
    g->tensor_sorted =
        cart_calloc((size_t)n_tensors, sizeof *g->tensor_sorted, "GGUF tensor index");
    if (!g->tensors || !g->tensor_sorted) return CART_E_NOMEM;
    for (uint64_t i = 0; i < n_tensors; i++) {
        set_where(&ps, "tensor", (int64_t)i, (cart_str){0});
        if ((rc = read_tensor_info(&ps, &g->tensors[i]))) return rc;
        g->n_tensors++;
    }
    uint64_t header_end = ps.pos;

    /* Duplicate keys, then the index find() uses. */
    for (int64_t i = 0; i < g->n_kv; i++) g->kv_sorted[i] = &g->kvs[i];
    if (g->n_kv > 1) qsort(g->kv_sorted, (size_t)g->n_kv, sizeof *g->kv_sorted, cmp_kv);
    for (int64_t i = 1; i < g->n_kv; i++) {
        const cart_gguf_kv *a = g->kv_sorted[i - 1], *b = g->kv_sorted[i];
        if (str_cmp(a->key, b->key) == 0) {
            set_where(&ps, "metadata entry", b - g->kvs, b->key);
            return perr(&ps, "duplicate key, already set by metadata entry %td", a - g->kvs);
        }
    }

    if ((rc = find_alignment(g, &ps))) return rc;
    g->data_offset = align_up(header_end, g->alignment);

    for (int64_t i = 0; i < g->n_tensors; i++) {
        set_where(&ps, "tensor", i, g->tensors[i].name);
        if ((rc = check_tensor(&ps, &g->tensors[i], g))) return rc;
    }

    for (int64_t i = 0; i < g->n_tensors; i++) g->tensor_sorted[i] = &g->tensors[i];
    if (g->n_tensors > 1)
        qsort(g->tensor_sorted, (size_t)g->n_tensors, sizeof *g->tensor_sorted, cmp_tensor_name);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const cart_gguf_tensor_info *a = g->tensor_sorted[i - 1], *b = g->tensor_sorted[i];
        if (str_cmp(a->name, b->name) == 0) {
            set_where(&ps, "tensor", b - g->tensors, b->name);
            return perr(&ps, "duplicate tensor name, already used by tensor %td", a - g->tensors);
        }
    }

    /* Overlaps: walk the tensors by offset, remembering the one that reaches
     * furthest. The by-offset order is scratch; the name index is rebuilt. */
    if (g->n_tensors > 1) {
        const cart_gguf_tensor_info **by_off =
            cart_malloc((size_t)g->n_tensors * sizeof *by_off, "GGUF tensor offsets");
        if (!by_off) return CART_E_NOMEM;
        memcpy(by_off, g->tensor_sorted, (size_t)g->n_tensors * sizeof *by_off);
        qsort(by_off, (size_t)g->n_tensors, sizeof *by_off, cmp_tensor_offset);
        const cart_gguf_tensor_info *reach = NULL;
        for (int64_t i = 0; i < g->n_tensors && !rc; i++) {
            const cart_gguf_tensor_info *t = by_off[i];
            if (t->nbytes == 0) continue;
            if (reach && t->offset < reach->offset + reach->nbytes) {
                set_where(&ps, "tensor", t - g->tensors, t->name);
                char lab[LABEL_CAP + 4];
                rc = perr(&ps,
                          "data [%" PRIu64 ", %" PRIu64 ") overlaps tensor %td ('%s') at [%" PRIu64
                          ", %" PRIu64 ")",
                          t->offset, t->offset + t->nbytes, reach - g->tensors,
                          label(lab, reach->name.data, reach->name.len), reach->offset,
                          reach->offset + reach->nbytes);
            }
            if (!reach || t->offset + t->nbytes > reach->offset + reach->nbytes) reach = t;
        }
        free(by_off);
    }
    return rc;
}

static int open_common(cart_gguf **out, cart_gguf *g) {
    int rc = parse(g);
    if (rc) {
        cart_gguf_close(g);
        return rc;
    }
    *out = g;
    return CART_OK;
}

int cart_gguf_open(cart_gguf **out, const char *path) {
    if (!out) return cart_fail(CART_E_ARG, "cart_gguf_open: out is NULL");
    *out = NULL;
    if (!path) return cart_fail(CART_E_ARG, "cart_gguf_open: path is NULL");
    cart_gguf *g = cart_calloc(1, sizeof *g, "GGUF reader");
    if (!g) return CART_E_NOMEM;
    g->path = cart_strdup(path, "GGUF path");
    if (!g->path) {
        free(g);
        return CART_E_NOMEM;
    }
    int rc = cart_map_file(&g->map, path);
    if (rc) {
        cart_gguf_close(g);
        return rc;
    }
    g->data = g->map.data;
    g->size = g->map.size;
    return open_common(out, g);
}

int cart_gguf_open_memory(cart_gguf **out, const void *data, uint64_t size, const char *name) {
    if (!out) return cart_fail(CART_E_ARG, "cart_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!data && size > 0) return cart_fail(CART_E_ARG, "cart_gguf_open_memory: data is NULL");
    cart_gguf *g = cart_calloc(1, sizeof *g, "GGUF reader");
    if (!g) return CART_E_NOMEM;
    g->path = cart_strdup(name ? name : "<memory>", "GGUF name");
    if (!g->path) {
        free(g);
        return CART_E_NOMEM;
    }
    g->data = data;
    g->size = size;
    return open_common(out, g);
}

void cart_gguf_close(cart_gguf *g) {
    if (!g) return;
    cart_unmap_file(&g->map);
    arena_free(g->arena);
    free(g->kvs);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->tensor_sorted);
    free(g->path);
    free(g);
}

uint32_t cart_gguf_version(const cart_gguf *g) {
    return g ? g->version : 0;
}

uint64_t cart_gguf_alignment(const cart_gguf *g) {
    return g ? g->alignment : 0;
}

uint64_t cart_gguf_data_offset(const cart_gguf *g) {
    return g ? g->data_offset : 0;
}

uint64_t cart_gguf_file_size(const cart_gguf *g) {
    return g ? g->size : 0;
}

const char *cart_gguf_path(const cart_gguf *g) {
    return g ? g->path : NULL;
}

int64_t cart_gguf_kv_count(const cart_gguf *g) {
    return g ? g->n_kv : 0;
}

const cart_gguf_kv *cart_gguf_kv_at(const cart_gguf *g, int64_t i) {
    if (!g || i < 0 || i >= g->n_kv) return NULL;
    return &g->kvs[i];
}

const cart_gguf_value *cart_gguf_find(const cart_gguf *g, const char *key) {
    if (!g || !key) return NULL;
    cart_str k = {key, strlen(key)};
    int64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(g->kv_sorted[mid]->key, k);
        if (c == 0) return &g->kv_sorted[mid]->value;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int64_t cart_gguf_tensor_count(const cart_gguf *g) {
    return g ? g->n_tensors : 0;
}

const cart_gguf_tensor_info *cart_gguf_tensor_at(const cart_gguf *g, int64_t i) {
    if (!g || i < 0 || i >= g->n_tensors) return NULL;
    return &g->tensors[i];
}

const cart_gguf_tensor_info *cart_gguf_find_tensor(const cart_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    cart_str k = {name, strlen(name)};
    int64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(g->tensor_sorted[mid]->name, k);
        if (c == 0) return g->tensor_sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ---- typed getters ---------------------------------------------------------- */

static int getter_value(const cart_gguf_value **v, const void *out, const cart_gguf *g,
                        const char *key, const char *fn) {
    if (!out || !g || !key) return cart_fail(CART_E_ARG, "%s: NULL argument", fn);
    *v = cart_gguf_find(g, key);
    if (!*v) return cart_fail(CART_E_NOT_FOUND, "%s: no metadata key '%s'", g->path, key);
    return CART_OK;
}

static int wrong_type(const cart_gguf *g, const char *key, const cart_gguf_value *v,
                      const char *expected) {
    return cart_fail(CART_E_FORMAT, "%s: metadata '%s' has type %s, expected %s", g->path, key,
                     v->type == CART_GGUF_ARRAY ? "array" : type_name_or(v->type), expected);
}

/* An integer value as (negative, magnitude-or-value): *neg set for values < 0. */
static int get_integer(const cart_gguf *g, const char *key, const cart_gguf_value *v, int *neg,
                       uint64_t *u, int64_t *i) {
    if (!type_is_integer(v->type)) return wrong_type(g, key, v, "an integer");
    *neg = type_is_signed(v->type) && v->as.i64 < 0;
    *u = v->as.u64;
    *i = v->as.i64;
    return CART_OK;
}

static int does_not_fit(const cart_gguf *g, const char *key, const cart_gguf_value *v,
                        const char *target) {
    if (type_is_signed(v->type))
        return cart_fail(CART_E_FORMAT, "%s: metadata '%s' = %" PRId64 " (%s) does not fit %s",
                         g->path, key, v->as.i64, type_names[v->type], target);
    return cart_fail(CART_E_FORMAT, "%s: metadata '%s' = %" PRIu64 " (%s) does not fit %s", g->path,
                     key, v->as.u64, type_names[v->type], target);
}

int cart_gguf_get_u32(uint32_t *out, const cart_gguf *g, const char *key) {
    const cart_gguf_value *v = NULL;
    int neg = 0, rc = getter_value(&v, out, g, key, "cart_gguf_get_u32");
    uint64_t u = 0;
    int64_t i = 0;
    if (rc || (rc = get_integer(g, key, v, &neg, &u, &i))) return rc;
    if (neg || u > UINT32_MAX) return does_not_fit(g, key, v, "uint32");
    *out = (uint32_t)u;
    return CART_OK;
}

int cart_gguf_get_u64(uint64_t *out, const cart_gguf *g, const char *key) {
    const cart_gguf_value *v = NULL;
    int neg = 0, rc = getter_value(&v, out, g, key, "cart_gguf_get_u64");
    uint64_t u = 0;
    int64_t i = 0;
    if (rc || (rc = get_integer(g, key, v, &neg, &u, &i))) return rc;
    if (neg) return does_not_fit(g, key, v, "uint64");
    *out = u;
    return CART_OK;
}

int cart_gguf_get_i64(int64_t *out, const cart_gguf *g, const char *key) {
    const cart_gguf_value *v = NULL;
    int neg = 0, rc = getter_value(&v, out, g, key, "cart_gguf_get_i64");
    uint64_t u = 0;
    int64_t i = 0;
    if (rc || (rc = get_integer(g, key, v, &neg, &u, &i))) return rc;
    if (!type_is_signed(v->type) && u > INT64_MAX) return does_not_fit(g, key, v, "int64");
    *out = i;
    return CART_OK;
}

int cart_gguf_get_f64(double *out, const cart_gguf *g, const char *key) {
    const cart_gguf_value *v;
    int rc = getter_value(&v, out, g, key, "cart_gguf_get_f64");
    if (rc) return rc;
    if (v->type == CART_GGUF_FLOAT32 || v->type == CART_GGUF_FLOAT64)
        *out = v->as.f64;
    else if (type_is_signed(v->type))
        *out = (double)v->as.i64;
    else if (type_is_integer(v->type))
        *out = (double)v->as.u64;
    else
        return wrong_type(g, key, v, "a number");
    return CART_OK;
}

int cart_gguf_get_f32(float *out, const cart_gguf *g, const char *key) {
    double d = 0.0;
    if (!out) return cart_fail(CART_E_ARG, "cart_gguf_get_f32: NULL argument");
    int rc = cart_gguf_get_f64(&d, g, key);
    if (rc) return rc;
    *out = (float)d;
    return CART_OK;
}

int cart_gguf_get_bool(int32_t *out, const cart_gguf *g, const char *key) {
    const cart_gguf_value *v;
    int rc = getter_value(&v, out, g, key, "cart_gguf_get_bool");
    if (rc) return rc;
    if (v->type != CART_GGUF_BOOL) return wrong_type(g, key, v, "bool");
    *out = v->as.u64 != 0;
    return CART_OK;
}

int cart_gguf_get_str(cart_str *out, const cart_gguf *g, const char *key) {
    const cart_gguf_value *v;
    int rc = getter_value(&v, out, g, key, "cart_gguf_get_str");
    if (rc) return rc;
    if (v->type != CART_GGUF_STRING) return wrong_type(g, key, v, "string");
    *out = v->as.str;
    return CART_OK;
}
