/*
 * gguf_write.c - the GGUF writer: metadata set in order, tensors added by
 * name, the file written whole or streamed tensor by tensor (a temp file,
 * fsynced and renamed). The layout is gguf.c's.
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

/* ---- the writer ------------------------------------------------------------- */

typedef struct writer_kv {
    char *key;             /* owned, NUL-terminated */
    cart_gguf_value value; /* deep-owned: strings and arrays are malloc'ed */
} writer_kv;

typedef struct writer_tensor {
    char *name; /* owned */
    int32_t dtype;
    int32_t n_dims;
    int64_t ne[MAX_DIMS];
    uint64_t nbytes;
    uint64_t offset;  /* from the start of the data section; set at begin */
    const void *data; /* borrowed; NULL when streamed */
} writer_tensor;

struct cart_gguf_writer {
    writer_kv *kvs; /* (n_kv) in order of first set */
    int64_t n_kv, cap_kv;
    writer_tensor *tensors; /* (n_tensors) in order of add */
    int64_t n_tensors, cap_tensors;
    int streaming;       /* begin succeeded, finish not yet */
    cart_afile file;     /* the file in progress while streaming */
    int64_t next_tensor; /* streaming: index of the next tensor to write */
    uint64_t alignment;  /* streaming: the file's alignment */
};

static void free_value(cart_gguf_value *v) {
    if (v->type == CART_GGUF_STRING) {
        free((void *)v->as.str.data);
    } else if (v->type == CART_GGUF_ARRAY && v->count > 0) {
        if (v->elem_type == CART_GGUF_ARRAY) {
            cart_gguf_value *vals = (cart_gguf_value *)v->as.array;
            for (uint64_t i = 0; i < v->count; i++) free_value(&vals[i]);
        }
        free((void *)v->as.array);
    }
    memset(v, 0, sizeof *v);
}

/* A malloc'ed, NUL-terminated copy of s. */
static int copy_str(cart_str *dst, cart_str src, const char *key) {
    if (src.len > 0 && !src.data)
        return cart_fail(CART_E_ARG, "gguf writer: '%s': string data is NULL with length %" PRIu64,
                         key, src.len);
    if (src.len >= SIZE_MAX)
        return cart_fail(CART_E_ARG, "gguf writer: '%s': string length %" PRIu64 " is too large",
                         key, src.len);
    char *p = cart_malloc((size_t)src.len + 1, "GGUF string");
    if (!p) return CART_E_NOMEM;
    if (src.len) memcpy(p, src.data, (size_t)src.len);
    p[src.len] = '\0';
    dst->data = p;
    dst->len = src.len;
    return CART_OK;
}

/* Checks that a scalar's value fits its type. */
static int check_scalar(const cart_gguf_value *v, const char *key) {
    uint64_t umax = 0;
    int64_t lo = 0, hi = 0;
    switch (v->type) {
    case CART_GGUF_UINT8:
        umax = UINT8_MAX;
        break;
    case CART_GGUF_UINT16:
        umax = UINT16_MAX;
        break;
    case CART_GGUF_UINT32:
        umax = UINT32_MAX;
        break;
    case CART_GGUF_INT8:
        lo = INT8_MIN, hi = INT8_MAX;
        break;
    case CART_GGUF_INT16:
        lo = INT16_MIN, hi = INT16_MAX;
        break;
    case CART_GGUF_INT32:
        lo = INT32_MIN, hi = INT32_MAX;
        break;
    default:
        return CART_OK;
    }
    if (umax && v->as.u64 > umax)
        return cart_fail(CART_E_ARG, "gguf writer: '%s': value %" PRIu64 " does not fit %s", key,
                         v->as.u64, type_names[v->type]);
    if (!umax && (v->as.i64 < lo || v->as.i64 > hi))
        return cart_fail(CART_E_ARG, "gguf writer: '%s': value %" PRId64 " does not fit %s", key,
                         v->as.i64, type_names[v->type]);
    return CART_OK;
}

static int copy_value(cart_gguf_value *dst, const cart_gguf_value *src, const char *key,
                      int depth) {
    memset(dst, 0, sizeof *dst);
    if (!type_is_known(src->type))
        return cart_fail(CART_E_ARG, "gguf writer: '%s': unknown value type %" PRId32, key,
                         src->type);
    if (src->type != CART_GGUF_ARRAY) {
        int rc = check_scalar(src, key);
        if (rc) return rc;
        dst->type = src->type;
        dst->elem_type = -1;
        dst->count = 1;
        if (src->type == CART_GGUF_STRING) return copy_str(&dst->as.str, src->as.str, key);
        dst->as = src->as;
        if (src->type == CART_GGUF_BOOL) dst->as.u64 = src->as.u64 != 0;
        return CART_OK;
    }
    if (depth >= MAX_NEST)
        return cart_fail(CART_E_ARG, "gguf writer: '%s': arrays nested more than %d levels deep",
                         key, MAX_NEST);
    int32_t et = src->elem_type;
    if (!type_is_known(et))
        return cart_fail(CART_E_ARG, "gguf writer: '%s': unknown array element type %" PRId32, key,
                         et);
    uint64_t n = src->count;
    if (n > 0 && !src->as.array)
        return cart_fail(CART_E_ARG, "gguf writer: '%s': array of %" PRIu64 " has NULL elements",
                         key, n);
    dst->type = CART_GGUF_ARRAY;
    dst->elem_type = et;
    dst->count = 0;
    dst->as.array = empty_array;
    if (n == 0) return CART_OK;

    size_t esize = et == CART_GGUF_STRING  ? sizeof(cart_str)
                   : et == CART_GGUF_ARRAY ? sizeof(cart_gguf_value)
                                           : scalar_size(et);
    if (n > SIZE_MAX / esize)
        return cart_fail(CART_E_ARG, "gguf writer: '%s': array of %" PRIu64 " is too large", key,
                         n);
    if (et != CART_GGUF_STRING && et != CART_GGUF_ARRAY) {
        void *p = cart_malloc((size_t)n * esize, "GGUF array");
        if (!p) return CART_E_NOMEM;
        memcpy(p, src->as.array, (size_t)n * esize);
        dst->as.array = p;
        dst->count = n;
        return CART_OK;
    }
    if (et == CART_GGUF_STRING) {
        /* One block: the cart_str[n], then each string's bytes and a NUL. */
        const cart_str *s = src->as.array;
        size_t total = (size_t)n * sizeof(cart_str);
        for (uint64_t i = 0; i < n; i++) {
            if (s[i].len > 0 && !s[i].data)
                return cart_fail(CART_E_ARG,
                                 "gguf writer: '%s': string %" PRIu64
                                 " is NULL with length %" PRIu64,
                                 key, i, s[i].len);
            if (s[i].len >= SIZE_MAX - total)
                return cart_fail(CART_E_ARG, "gguf writer: '%s': strings are too large", key);
            total += (size_t)s[i].len + 1;
        }
        cart_str *d = cart_malloc(total, "GGUF string array");
        if (!d) return CART_E_NOMEM;
        char *bytes = (char *)(d + n);
        for (uint64_t i = 0; i < n; i++) {
            if (s[i].len) memcpy(bytes, s[i].data, (size_t)s[i].len);
            bytes[s[i].len] = '\0';
            d[i].data = bytes;
            d[i].len = s[i].len;
            bytes += s[i].len + 1;
        }
        dst->as.array = d;
        dst->count = n;
        return CART_OK;
    }
    const cart_gguf_value *s = src->as.array;
    cart_gguf_value *d = cart_calloc((size_t)n, sizeof *d, "GGUF nested array");
    if (!d) return CART_E_NOMEM;
    for (uint64_t i = 0; i < n; i++) {
        int rc = CART_OK;
        if (s[i].type != CART_GGUF_ARRAY)
            rc = cart_fail(CART_E_ARG,
                           "gguf writer: '%s': element %" PRIu64 " of an array of arrays has "
                           "type %s",
                           key, i, type_name_or(s[i].type));
        if (!rc) rc = copy_value(&d[i], &s[i], key, depth + 1);
        if (rc) {
            for (uint64_t k = 0; k < i; k++) free_value(&d[k]);
            free(d);
            memset(dst, 0, sizeof *dst);
            return rc;
        }
    }
    dst->as.array = d;
    dst->count = n;
    return CART_OK;
}

int cart_gguf_writer_new(cart_gguf_writer **out) {
    if (!out) return cart_fail(CART_E_ARG, "cart_gguf_writer_new: out is NULL");
    *out = cart_calloc(1, sizeof **out, "GGUF writer");
    return *out ? CART_OK : CART_E_NOMEM;
}

void cart_gguf_writer_free(cart_gguf_writer *w) {
    if (!w) return;
    if (w->streaming) cart_afile_abort(&w->file);
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free_value(&w->kvs[i].value);
    }
    for (int64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->kvs);
    free(w->tensors);
    free(w);
}

static int64_t writer_find_kv(const cart_gguf_writer *w, const char *key) {
    for (int64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kvs[i].key, key) == 0) return i;
    return -1;
}

static int writer_not_streaming(const cart_gguf_writer *w, const char *fn) {
    if (w->streaming)
        return cart_fail(CART_E_STATE, "%s: a file is being written (after begin, before finish)",
                         fn);
    return CART_OK;
}

int cart_gguf_writer_set(cart_gguf_writer *w, const char *key, const cart_gguf_value *value) {
    if (!w || !key || !value) return cart_fail(CART_E_ARG, "cart_gguf_writer_set: NULL argument");
    if (!key[0]) return cart_fail(CART_E_ARG, "cart_gguf_writer_set: empty key");
    int rc = writer_not_streaming(w, "cart_gguf_writer_set");
    if (rc) return rc;
    if (strcmp(key, "general.alignment") == 0 &&
        (value->type != CART_GGUF_UINT32 || !is_pow2(value->as.u64) || value->as.u64 > UINT32_MAX))
        return cart_fail(CART_E_ARG,
                         "gguf writer: general.alignment must be a uint32 power of two (got %s)",
                         type_name_or(value->type));
    cart_gguf_value copy;
    if ((rc = copy_value(&copy, value, key, 0))) return rc;
    int64_t i = writer_find_kv(w, key);
    if (i >= 0) {
        free_value(&w->kvs[i].value);
        w->kvs[i].value = copy;
        return CART_OK;
    }
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        writer_kv *p = cart_realloc(w->kvs, (size_t)cap * sizeof *p, "GGUF writer metadata");
        if (!p) {
            free_value(&copy);
            return CART_E_NOMEM;
        }
        w->kvs = p;
        w->cap_kv = cap;
    }
    char *k = cart_strdup(key, "GGUF key");
    if (!k) {
        free_value(&copy);
        return CART_E_NOMEM;
    }
    w->kvs[w->n_kv].key = k;
    w->kvs[w->n_kv].value = copy;
    w->n_kv++;
    return CART_OK;
}

static int set_scalar(cart_gguf_writer *w, const char *key, int32_t type, uint64_t u, int64_t i,
                      double f) {
    cart_gguf_value v = {.type = type, .elem_type = -1, .count = 1};
    if (type == CART_GGUF_FLOAT32 || type == CART_GGUF_FLOAT64)
        v.as.f64 = f;
    else if (type_is_signed(type))
        v.as.i64 = i;
    else
        v.as.u64 = u;
    return cart_gguf_writer_set(w, key, &v);
}

int cart_gguf_writer_set_u32(cart_gguf_writer *w, const char *key, uint32_t v) {
    return set_scalar(w, key, CART_GGUF_UINT32, v, 0, 0);
}

int cart_gguf_writer_set_i32(cart_gguf_writer *w, const char *key, int32_t v) {
    return set_scalar(w, key, CART_GGUF_INT32, 0, v, 0);
}

int cart_gguf_writer_set_u64(cart_gguf_writer *w, const char *key, uint64_t v) {
    return set_scalar(w, key, CART_GGUF_UINT64, v, 0, 0);
}

int cart_gguf_writer_set_i64(cart_gguf_writer *w, const char *key, int64_t v) {
    return set_scalar(w, key, CART_GGUF_INT64, 0, v, 0);
}

int cart_gguf_writer_set_f32(cart_gguf_writer *w, const char *key, float v) {
    return set_scalar(w, key, CART_GGUF_FLOAT32, 0, 0, v);
}

int cart_gguf_writer_set_f64(cart_gguf_writer *w, const char *key, double v) {
    return set_scalar(w, key, CART_GGUF_FLOAT64, 0, 0, v);
}

int cart_gguf_writer_set_bool(cart_gguf_writer *w, const char *key, int32_t v) {
    return set_scalar(w, key, CART_GGUF_BOOL, v != 0, 0, 0);
}

int cart_gguf_writer_set_str(cart_gguf_writer *w, const char *key, const char *v) {
    if (!v)
        return cart_fail(CART_E_ARG, "cart_gguf_writer_set_str: '%s': value is NULL",
                         key ? key : "(null)");
    cart_gguf_value val = {.type = CART_GGUF_STRING, .elem_type = -1, .count = 1};
    val.as.str.data = v;
    val.as.str.len = strlen(v);
    return cart_gguf_writer_set(w, key, &val);
}

int cart_gguf_writer_set_array(cart_gguf_writer *w, const char *key, int32_t elem_type,
                               const void *data, uint64_t n) {
    if (scalar_size(elem_type) == 0)
        return cart_fail(CART_E_ARG,
                         "cart_gguf_writer_set_array: '%s': element type %" PRId32
                         " (%s) is not numeric",
                         key ? key : "(null)", elem_type, type_name_or(elem_type));
    cart_gguf_value val = {.type = CART_GGUF_ARRAY, .elem_type = elem_type, .count = n};
    val.as.array = data;
    return cart_gguf_writer_set(w, key, &val);
}

int cart_gguf_writer_set_str_array(cart_gguf_writer *w, const char *key, const char *const *strs,
                                   uint64_t n) {
    if (n > 0 && !strs)
        return cart_fail(CART_E_ARG, "cart_gguf_writer_set_str_array: '%s': strs is NULL",
                         key ? key : "(null)");
    if (n > SIZE_MAX / sizeof(cart_str))
        return cart_fail(CART_E_ARG, "cart_gguf_writer_set_str_array: too many strings");
    cart_str *tmp = cart_malloc((size_t)n * sizeof *tmp, "GGUF string array");
    if (!tmp) return CART_E_NOMEM;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) {
            free(tmp);
            return cart_fail(CART_E_ARG,
                             "cart_gguf_writer_set_str_array: '%s': string %" PRIu64 " is NULL",
                             key ? key : "(null)", i);
        }
        tmp[i].data = strs[i];
        tmp[i].len = strlen(strs[i]);
    }
    cart_gguf_value val = {.type = CART_GGUF_ARRAY, .elem_type = CART_GGUF_STRING, .count = n};
    val.as.array = tmp;
    int rc = cart_gguf_writer_set(w, key, &val);
    free(tmp);
    return rc;
}

void cart_gguf_writer_remove(cart_gguf_writer *w, const char *key) {
    if (!w || !key || w->streaming) return;
    int64_t i = writer_find_kv(w, key);
    if (i < 0) return;
    free(w->kvs[i].key);
    free_value(&w->kvs[i].value);
    memmove(&w->kvs[i], &w->kvs[i + 1], (size_t)(w->n_kv - i - 1) * sizeof *w->kvs);
    w->n_kv--;
}

int cart_gguf_writer_add_tensor(cart_gguf_writer *w, const char *name, int32_t dtype,
                                int32_t n_dims, const int64_t *ne, const void *data) {
    if (!w || !name || !ne)
        return cart_fail(CART_E_ARG, "cart_gguf_writer_add_tensor: NULL argument");
    int rc = writer_not_streaming(w, "cart_gguf_writer_add_tensor");
    if (rc) return rc;
    size_t len = strlen(name);
    if (len == 0 || len > MAX_WRITE_NAME)
        return cart_fail(CART_E_ARG,
                         "gguf writer: tensor name '%s' is %zu bytes; llama.cpp reads 1..%d", name,
                         len, MAX_WRITE_NAME);
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return cart_fail(CART_E_ARG,
                             "gguf writer: duplicate tensor name '%s' (tensor %" PRId64 ")", name,
                             i);
    cart_dtype_info info;
    if (dtype < 0 || dtype >= FIRST_NON_GGML_DTYPE || cart_dtype_get_info(&info, dtype) != CART_OK)
        return cart_fail(CART_E_ARG,
                         "gguf writer: tensor '%s': dtype %" PRId32 " is not a GGML type", name,
                         dtype);
    if (n_dims < 1 || n_dims > MAX_DIMS)
        return cart_fail(CART_E_ARG,
                         "gguf writer: tensor '%s': n_dims %" PRId32
                         " is out of range (expected 1..%d)",
                         name, n_dims, MAX_DIMS);
    writer_tensor t = {.dtype = dtype, .n_dims = n_dims, .data = data};
    int64_t n = 1;
    for (int j = 0; j < MAX_DIMS; j++) t.ne[j] = 1;
    for (int j = 0; j < n_dims; j++) {
        if (ne[j] < 0)
            return cart_fail(CART_E_ARG,
                             "gguf writer: tensor '%s': ne[%d] = %" PRId64 " is negative", name, j,
                             ne[j]);
        if (ne[j] != 0 && n > INT64_MAX / ne[j])
            return cart_fail(CART_E_ARG, "gguf writer: tensor '%s': element count overflows", name);
        t.ne[j] = ne[j];
        n *= ne[j];
    }
    if (ne[0] % info.block_size != 0)
        return cart_fail(CART_E_ARG,
                         "gguf writer: tensor '%s': ne[0] = %" PRId64
                         " is not a multiple of the %s block size %d",
                         name, ne[0], info.name, (int)info.block_size);
    if (cart_dtype_nbytes(&t.nbytes, dtype, n) != CART_OK)
        return cart_fail_context(CART_E_ARG, "gguf writer: tensor '%s'", name);
    if (w->n_tensors == w->cap_tensors) {
        int64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        writer_tensor *p = cart_realloc(w->tensors, (size_t)cap * sizeof *p, "GGUF writer tensors");
        if (!p) return CART_E_NOMEM;
        w->tensors = p;
        w->cap_tensors = cap;
    }
    if (!(t.name = cart_strdup(name, "GGUF tensor name"))) return CART_E_NOMEM;
    w->tensors[w->n_tensors++] = t;
    return CART_OK;
}

/* ---- serialization ---------------------------------------------------------- */

typedef struct dynbuf {
    uint8_t *p;
    size_t len, cap;
    int failed;
} dynbuf;

static void db_put(dynbuf *b, const void *src, size_t n) {
    if (b->failed || n == 0) return;
    if (n > SIZE_MAX / 2 - b->len) {
        b->failed = cart_fail(CART_E_NOMEM, "GGUF header too large");
        return;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = cart_realloc(b->p, cap, "GGUF header");
        if (!p) {
            b->failed = CART_E_NOMEM;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void db_u32(dynbuf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    db_put(b, x, 4);
}

static void db_u64(dynbuf *b, uint64_t v) {
    db_u32(b, (uint32_t)v);
    db_u32(b, (uint32_t)(v >> 32));
}

static void db_str(dynbuf *b, const char *s, uint64_t len) {
    db_u64(b, len);
    db_put(b, s, (size_t)len);
}

/* n elements of `size` bytes in native layout, written little-endian. */
static void db_numbers(dynbuf *b, const void *src, uint64_t n, size_t size) {
    if (host_is_little_endian() || size == 1) {
        db_put(b, src, (size_t)(n * size));
        return;
    }
    const uint8_t *p = src;
    for (uint64_t i = 0; i < n; i++, p += size)
        for (size_t k = size; k-- > 0;) db_put(b, p + k, 1);
}

static void db_value(dynbuf *b, const cart_gguf_value *v) {
    const uint64_t u = v->as.u64;
    switch (v->type) {
    case CART_GGUF_UINT8:
    case CART_GGUF_INT8:
    case CART_GGUF_BOOL: {
        uint8_t x = (uint8_t)u;
        db_put(b, &x, 1);
        break;
    }
    case CART_GGUF_UINT16:
    case CART_GGUF_INT16: {
        uint8_t x[2] = {(uint8_t)u, (uint8_t)(u >> 8)};
        db_put(b, x, 2);
        break;
    }
    case CART_GGUF_UINT32:
    case CART_GGUF_INT32:
        db_u32(b, (uint32_t)u);
        break;
    case CART_GGUF_UINT64:
    case CART_GGUF_INT64:
        db_u64(b, u);
        break;
    case CART_GGUF_FLOAT32: {
        float f = (float)v->as.f64;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        db_u32(b, bits);
        break;
    }
    case CART_GGUF_FLOAT64: {
        uint64_t bits;
        memcpy(&bits, &v->as.f64, 8);
        db_u64(b, bits);
        break;
    }
    case CART_GGUF_STRING:
        db_str(b, v->as.str.data, v->as.str.len);
        break;
    case CART_GGUF_ARRAY:
        db_u32(b, (uint32_t)v->elem_type);
        db_u64(b, v->count);
        if (v->elem_type == CART_GGUF_STRING) {
            const cart_str *s = v->as.array;
            for (uint64_t i = 0; i < v->count; i++) db_str(b, s[i].data, s[i].len);
        } else if (v->elem_type == CART_GGUF_ARRAY) {
            const cart_gguf_value *a = v->as.array;
            for (uint64_t i = 0; i < v->count; i++) db_value(b, &a[i]);
        } else {
            db_numbers(b, v->as.array, v->count, scalar_size(v->elem_type));
        }
        break;
    }
}

/* Lays out the data section (tensor offsets) and serializes everything before it. */
static int build_header(cart_gguf_writer *w, dynbuf *b) {
    w->alignment = DEFAULT_ALIGNMENT;
    int64_t ai = writer_find_kv(w, "general.alignment");
    if (ai >= 0) w->alignment = w->kvs[ai].value.as.u64; /* checked by set */
    uint64_t offset = 0;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        w->tensors[i].offset = offset;
        offset = align_up(offset + w->tensors[i].nbytes, w->alignment);
    }
    db_put(b, "GGUF", 4);
    db_u32(b, 3);
    db_u64(b, (uint64_t)w->n_tensors);
    db_u64(b, (uint64_t)w->n_kv);
    for (int64_t i = 0; i < w->n_kv; i++) {
        db_str(b, w->kvs[i].key, strlen(w->kvs[i].key));
        db_u32(b, (uint32_t)w->kvs[i].value.type);
        db_value(b, &w->kvs[i].value);
    }
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        db_str(b, t->name, strlen(t->name));
        db_u32(b, (uint32_t)t->n_dims);
        for (int j = 0; j < t->n_dims; j++) db_u64(b, (uint64_t)t->ne[j]);
        db_u32(b, (uint32_t)t->dtype);
        db_u64(b, t->offset);
    }
    return b->failed;
}

int cart_gguf_writer_begin(cart_gguf_writer *w, const char *path) {
    if (!w || !path) return cart_fail(CART_E_ARG, "cart_gguf_writer_begin: NULL argument");
    int rc = writer_not_streaming(w, "cart_gguf_writer_begin");
    if (rc) return rc;
    dynbuf b = {0};
    if ((rc = build_header(w, &b))) {
        free(b.p);
        return rc;
    }
    if ((rc = cart_afile_open(&w->file, path))) {
        free(b.p);
        return rc;
    }
    rc = cart_afile_write(&w->file, b.p, b.len);
    free(b.p);
    if (!rc) rc = cart_afile_pad(&w->file, w->alignment);
    if (rc) {
        cart_afile_abort(&w->file);
        return rc;
    }
    w->streaming = 1;
    w->next_tensor = 0;
    return CART_OK;
}

int cart_gguf_writer_write_tensor(cart_gguf_writer *w, const char *name, const void *data) {
    if (!w || !name) return cart_fail(CART_E_ARG, "cart_gguf_writer_write_tensor: NULL argument");
    if (!w->streaming)
        return cart_fail(CART_E_STATE, "cart_gguf_writer_write_tensor: no file in progress "
                                       "(call cart_gguf_writer_begin first)");
    if (w->next_tensor >= w->n_tensors)
        return cart_fail(CART_E_STATE,
                         "cart_gguf_writer_write_tensor: '%s': all %" PRId64
                         " tensors are already written",
                         name, w->n_tensors);
    const writer_tensor *t = &w->tensors[w->next_tensor];
    if (strcmp(t->name, name) != 0)
        return cart_fail(CART_E_ARG,
                         "cart_gguf_writer_write_tensor: got '%s', expected tensor %" PRId64
                         " '%s' (tensors are written in the order they were added)",
                         name, w->next_tensor, t->name);
    if (!data && t->nbytes > 0)
        return cart_fail(CART_E_ARG, "cart_gguf_writer_write_tensor: '%s': data is NULL", name);
    int rc = cart_afile_write(&w->file, data, (size_t)t->nbytes);
    if (!rc) rc = cart_afile_pad(&w->file, w->alignment);
    if (rc) {
        cart_afile_abort(&w->file);
        w->streaming = 0;
        return rc;
    }
    w->next_tensor++;
    return CART_OK;
}

int cart_gguf_writer_finish(cart_gguf_writer *w) {
    if (!w) return cart_fail(CART_E_ARG, "cart_gguf_writer_finish: NULL argument");
    if (!w->streaming)
        return cart_fail(CART_E_STATE, "cart_gguf_writer_finish: no file in progress");
    if (w->next_tensor < w->n_tensors)
        return cart_fail(CART_E_STATE,
                         "cart_gguf_writer_finish: only %" PRId64 " of %" PRId64
                         " tensors written; next is '%s'",
                         w->next_tensor, w->n_tensors, w->tensors[w->next_tensor].name);
    w->streaming = 0;
    return cart_afile_commit(&w->file);
}

int cart_gguf_writer_write(cart_gguf_writer *w, const char *path) {
    if (!w || !path) return cart_fail(CART_E_ARG, "cart_gguf_writer_write: NULL argument");
    int rc = writer_not_streaming(w, "cart_gguf_writer_write");
    if (rc) return rc;
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (!w->tensors[i].data && w->tensors[i].nbytes > 0)
            return cart_fail(CART_E_ARG,
                             "cart_gguf_writer_write: %s: tensor %" PRId64 " '%s' has no data "
                             "(stream it with cart_gguf_writer_begin/write_tensor/finish)",
                             path, i, w->tensors[i].name);
    if ((rc = cart_gguf_writer_begin(w, path))) return rc;
    for (int64_t i = 0; i < w->n_tensors && !rc; i++)
        rc = cart_gguf_writer_write_tensor(w, w->tensors[i].name, w->tensors[i].data);
    if (rc) {
        if (w->streaming) cart_afile_abort(&w->file);
        w->streaming = 0;
        return rc;
    }
    return cart_gguf_writer_finish(w);
}
