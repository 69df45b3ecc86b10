/*
 * safetensors.c - the .safetensors reader and writer.
 *
 * Reader: the whole file is mapped (or borrowed, for cart_st_open_memory);
 * the JSON header is lexed once by hand (UTF-8, control characters, \u0000)
 * and then parsed with cJSON. Everything the caller sees afterwards lives in
 * the handle: tensor infos and metadata in arrays, every string copied into
 * one arena, tensor data pointing into the mapping.
 *
 * Writer: collects (name, dtype, shape, borrowed data), then writes the
 * header and the data through cart_afile (temporary file, fsync, rename).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dtype.h"
#include "internal.h"
#include "safetensors.h"

enum {
    MAX_DIMS = 8,
    MAX_HEADER = 100000000, /* the Hugging Face reader's limit: 100 MB */
};

/* Integers in the header are read as doubles by cJSON; above 2^53 a double
 * can no longer hold every integer, so larger values are refused. */
static const double MAX_JSON_INT = 9007199254740992.0;

/* ---- dtypes ------------------------------------------------------------- */

typedef struct st_type {
    int32_t dtype;
    const char *name;
} st_type;

/* In the order of the Hugging Face crate's Dtype enum (increasing alignment),
 * whose derived ordering its writer sorts by: the index is the rank. */
static const st_type st_types[] = {
    {CART_BOOL, "BOOL"}, {CART_U8, "U8"},   {CART_I8, "I8"},   {CART_I16, "I16"}, {CART_F16, "F16"},
    {CART_BF16, "BF16"}, {CART_I32, "I32"}, {CART_F32, "F32"}, {CART_F64, "F64"}, {CART_I64, "I64"},
};

/* Dtypes the format defines that this engine does not read. */
static const char *const st_unsupported[] = {
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "U16", "U32", "U64", "C64",
};

const char *cart_st_dtype_name(int32_t dtype) {
    for (size_t i = 0; i < sizeof st_types / sizeof st_types[0]; i++)
        if (st_types[i].dtype == dtype) return st_types[i].name;
    return NULL;
}

/* Position in the Hugging Face Dtype order; -1 for an unsupported dtype. */
static int st_dtype_rank(int32_t dtype) {
    for (size_t i = 0; i < sizeof st_types / sizeof st_types[0]; i++)
        if (st_types[i].dtype == dtype) return (int)i;
    return -1;
}

static int32_t st_dtype_from_name(const char *name) {
    for (size_t i = 0; i < sizeof st_types / sizeof st_types[0]; i++)
        if (strcmp(st_types[i].name, name) == 0) return st_types[i].dtype;
    return CART_DTYPE_INVALID;
}

static int st_dtype_is_unsupported(const char *name) {
    for (size_t i = 0; i < sizeof st_unsupported / sizeof st_unsupported[0]; i++)
        if (strcmp(st_unsupported[i], name) == 0) return 1;
    return 0;
}

/* Bytes per element of a supported dtype. */
static uint64_t elem_size(int32_t dtype) {
    cart_dtype_info info;
    if (cart_dtype_get_info(&info, dtype) != CART_OK) return 0;
    return (uint64_t)info.type_size;
}

/* 1 with shape x element size in *out; 0 when that exceeds 2^53 (the largest
 * offset the header can carry). A zero dim gives 0 bytes whatever the rest. */
static int shape_nbytes(uint64_t *out, const int64_t *shape, int32_t ndim, uint64_t esize) {
    uint64_t n = 1;
    for (int32_t i = 0; i < ndim; i++)
        if (shape[i] == 0) {
            *out = 0;
            return 1;
        }
    for (int32_t i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n)) return 0;
    if (__builtin_mul_overflow(n, esize, &n) || n > (UINT64_C(1) << 53)) return 0;
    *out = n;
    return 1;
}

/* "[2, 3]" for messages. */
static const char *shape_str(char *buf, size_t cap, const int64_t *shape, int32_t ndim) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < ndim && used < cap; i++)
        used +=
            (size_t)snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
    return buf;
}

/* ---- UTF-8 and the header lexer ------------------------------------------ */

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 when invalid:
 * no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_seq(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint8_t lo = 0x80, hi = 0xbf; /* range of the second byte */
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c == 0xe0)
        len = 3, lo = 0xa0;
    else if (c == 0xed)
        len = 3, hi = 0x9f;
    else if (c >= 0xe1 && c <= 0xef)
        len = 3;
    else if (c == 0xf0)
        len = 4, lo = 0x90;
    else if (c == 0xf4)
        len = 4, hi = 0x8f;
    else if (c >= 0xf1 && c <= 0xf3)
        len = 4;
    else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return len;
}

static int utf8_valid(const char *s) {
    const uint8_t *p = (const uint8_t *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t len = utf8_seq(p + i, n - i);
        if (!len) return 0;
        i += len;
    }
    return 1;
}

static int is_json_space(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* What cJSON does not check: the header is UTF-8, strings hold no raw
 * control characters, and no string escapes a NUL (cJSON would silently cut
 * the string there, so "a\u0000b" would read as "a"). */
static int lex_header(const uint8_t *s, uint64_t n, const char *path) {
    int in_string = 0;
    for (uint64_t i = 0; i < n;) {
        uint8_t c = s[i];
        if (c >= 0x80) {
            size_t len = utf8_seq(s + i, (size_t)(n - i));
            if (!len)
                return cart_fail(CART_E_FORMAT, "%s: header byte %llu: invalid UTF-8 (0x%02x)",
                                 path, (unsigned long long)i, c);
            i += len;
            continue;
        }
        if (c < 0x20 && (in_string || !is_json_space(c)))
            return cart_fail(CART_E_FORMAT, "%s: header byte %llu: raw control character 0x%02x %s",
                             path, (unsigned long long)i, c,
                             in_string ? "inside a string (expected an escape such as \\n)"
                                       : "outside a string");
        if (in_string && c == '\\') {
            if (i + 5 < n && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0)
                return cart_fail(CART_E_FORMAT,
                                 "%s: header byte %llu: string escapes a NUL character "
                                 "(\\u0000), which names and metadata may not contain",
                                 path, (unsigned long long)i);
            i += 2; /* the backslash and the character it escapes */
            continue;
        }
        if (c == '"') in_string = !in_string;
        i++;
    }
    return CART_OK;
}

/* ---- reader ------------------------------------------------------------- */

struct cart_st_file {
    cart_mapping map;     /* owned mapping when opened from a path */
    const uint8_t *bytes; /* (size) the whole file */
    uint64_t size;
    uint64_t header_size;           /* N */
    char *path;                     /* NUL-terminated, in arena */
    cart_st_tensor *tensors;        /* (n_tensors) in blob order */
    const cart_st_tensor **by_name; /* (n_tensors) into tensors, names ascending */
    int64_t n_tensors;
    cart_st_meta *meta; /* (n_meta) in header order */
    int64_t n_meta;
    char *arena; /* every string the handle hands out */
};

/* A tensor entry while the header is checked; name belongs to the cJSON tree. */
typedef struct entry {
    const char *name;
    int64_t order; /* position in the header, to keep sorting stable */
    int32_t dtype;
    int32_t ndim;
    int64_t shape[MAX_DIMS];
    uint64_t begin, end;
} entry;

static const char *json_kind(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    return "an invalid value";
}

static int tensor_fail(int status, const char *path, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int tensor_fail(int status, const char *path, const char *name, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return cart_fail(status, "%s: tensor '%s': %s", path, name, what);
}

/* A non-negative integer up to 2^53 in *out; 0 when v is anything else. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d <= MAX_JSON_INT) || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Why v is not a non-negative integer, for messages. */
static const char *uint_problem(const cJSON *v, char *buf, size_t cap) {
    if (!cJSON_IsNumber(v)) return json_kind(v);
    double d = v->valuedouble;
    if (d < 0)
        snprintf(buf, cap, "%.17g, a negative number", d);
    else if (d > MAX_JSON_INT)
        snprintf(buf, cap, "%.17g, larger than 2^53", d);
    else
        snprintf(buf, cap, "%.17g, not an integer", d);
    return buf;
}

static int parse_dtype(entry *e, const cJSON *v, const char *path) {
    if (!cJSON_IsString(v))
        return tensor_fail(CART_E_FORMAT, path, e->name, "dtype is %s, expected a string",
                           json_kind(v));
    e->dtype = st_dtype_from_name(v->valuestring);
    if (e->dtype != CART_DTYPE_INVALID) return CART_OK;
    if (st_dtype_is_unsupported(v->valuestring))
        return tensor_fail(CART_E_UNSUPPORTED, path, e->name,
                           "dtype %s is not supported (supported: F64 F32 F16 BF16 I64 I32 I16 "
                           "I8 U8 BOOL)",
                           v->valuestring);
    return tensor_fail(CART_E_FORMAT, path, e->name,
                       "unknown dtype '%s' (expected one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 "
                       "BOOL)",
                       v->valuestring);
}

static int parse_shape(entry *e, const cJSON *v, const char *path) {
    if (!cJSON_IsArray(v))
        return tensor_fail(CART_E_FORMAT, path, e->name,
                           "shape is %s, expected an array of non-negative integers", json_kind(v));
    int n = cJSON_GetArraySize(v);
    if (n > MAX_DIMS)
        return tensor_fail(CART_E_UNSUPPORTED, path, e->name,
                           "shape has %d dims, at most %d are supported", n, MAX_DIMS);
    e->ndim = (int32_t)n;
    for (int i = 0; i < MAX_DIMS; i++) e->shape[i] = 1;
    int i = 0;
    for (const cJSON *d = v->child; d; d = d->next, i++) {
        uint64_t u;
        char buf[64];
        if (!json_uint(d, &u))
            return tensor_fail(CART_E_FORMAT, path, e->name,
                               "shape[%d] is %s, expected a non-negative integer", i,
                               uint_problem(d, buf, sizeof buf));
        e->shape[i] = (int64_t)u;
    }
    return CART_OK;
}

static int parse_offsets(entry *e, const cJSON *v, const char *path) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2)
        return tensor_fail(CART_E_FORMAT, path, e->name,
                           "data_offsets is %s%s, expected an array [begin, end] of two "
                           "non-negative integers",
                           cJSON_IsArray(v) ? "an array of " : json_kind(v),
                           cJSON_IsArray(v) ? (cJSON_GetArraySize(v) < 2 ? "fewer than 2 items"
                                                                         : "more than 2 items")
                                            : "");
    uint64_t o[2];
    const cJSON *d = v->child;
    for (int i = 0; i < 2; i++, d = d->next) {
        char buf[64];
        if (!json_uint(d, &o[i]))
            return tensor_fail(CART_E_FORMAT, path, e->name,
                               "data_offsets[%d] is %s, expected a non-negative integer", i,
                               uint_problem(d, buf, sizeof buf));
    }
    if (o[0] > o[1])
        return tensor_fail(CART_E_FORMAT, path, e->name,
                           "data_offsets [%llu, %llu] are reversed, expected begin <= end",
                           (unsigned long long)o[0], (unsigned long long)o[1]);
    e->begin = o[0];
    e->end = o[1];
    return CART_OK;
}

/* Checks one tensor entry of the header and fills *e. */
static int parse_entry(entry *e, const cJSON *item, const char *path, uint64_t blob_size) {
    const char *name = e->name;
    if (!cJSON_IsObject(item))
        return tensor_fail(CART_E_FORMAT, path, name,
                           "entry is %s, expected an object with dtype, shape and data_offsets",
                           json_kind(item));
    static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
    const cJSON *found[3] = {NULL, NULL, NULL};
    for (const cJSON *c = item->child; c; c = c->next) {
        int k = 0;
        while (k < 3 && strcmp(c->string, fields[k]) != 0) k++;
        if (k == 3)
            return tensor_fail(CART_E_FORMAT, path, name,
                               "unexpected field '%s' (expected exactly dtype, shape and "
                               "data_offsets)",
                               c->string);
        if (found[k])
            return tensor_fail(CART_E_FORMAT, path, name, "field %s appears twice", fields[k]);
        found[k] = c;
    }
    for (int k = 0; k < 3; k++)
        if (!found[k]) return tensor_fail(CART_E_FORMAT, path, name, "missing field %s", fields[k]);
    int rc = parse_dtype(e, found[0], path);
    if (!rc) rc = parse_shape(e, found[1], path);
    if (!rc) rc = parse_offsets(e, found[2], path);
    if (rc) return rc;

    char sbuf[256];
    uint64_t esize = elem_size(e->dtype), need;
    if (!shape_nbytes(&need, e->shape, e->ndim, esize))
        return tensor_fail(
            CART_E_FORMAT, path, name, "shape %s x %s overflows the largest byte count (2^53)",
            shape_str(sbuf, sizeof sbuf, e->shape, e->ndim), cart_st_dtype_name(e->dtype));
    if (e->end - e->begin != need)
        return tensor_fail(CART_E_FORMAT, path, name,
                           "data_offsets [%llu, %llu] hold %llu bytes but shape %s x %s needs "
                           "%llu",
                           (unsigned long long)e->begin, (unsigned long long)e->end,
                           (unsigned long long)(e->end - e->begin),
                           shape_str(sbuf, sizeof sbuf, e->shape, e->ndim),
                           cart_st_dtype_name(e->dtype), (unsigned long long)need);
    if (e->end > blob_size)
        return tensor_fail(CART_E_FORMAT, path, name,
                           "data_offsets [%llu, %llu] run past the end of the data, which holds "
                           "%llu bytes (is the file truncated?)",
                           (unsigned long long)e->begin, (unsigned long long)e->end,
                           (unsigned long long)blob_size);
    return CART_OK;
}

static int cmp_item_key(const void *pa, const void *pb) {
    const cJSON *a = *(const cJSON *const *)pa, *b = *(const cJSON *const *)pb;
    return strcmp(a->string, b->string);
}

static int parse_metadata(const cJSON *meta, const char *path) {
    if (!cJSON_IsObject(meta))
        return cart_fail(CART_E_FORMAT, "%s: __metadata__ is %s, expected an object of strings",
                         path, json_kind(meta));
    size_t n = 0;
    for (const cJSON *c = meta->child; c; c = c->next, n++)
        if (!cJSON_IsString(c))
            return cart_fail(CART_E_FORMAT,
                             "%s: __metadata__ key '%s': value is %s, expected a string", path,
                             c->string, json_kind(c));
    /* Duplicate keys sit side by side once sorted. */
    const cJSON **items = cart_calloc(n, sizeof *items, "safetensors metadata keys");
    if (!items) return CART_E_NOMEM;
    n = 0;
    for (const cJSON *c = meta->child; c; c = c->next) items[n++] = c;
    qsort(items, n, sizeof *items, cmp_item_key);
    int rc = CART_OK;
    for (size_t i = 1; i < n && !rc; i++)
        if (strcmp(items[i]->string, items[i - 1]->string) == 0)
            rc = cart_fail(CART_E_FORMAT, "%s: __metadata__ has a duplicate key '%s'", path,
                           items[i]->string);
    free(items);
    return rc;
}

static int cmp_blob_order(const void *pa, const void *pb) {
    const entry *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return a->order < b->order ? -1 : a->order > b->order;
}

static int cmp_entry_name(const void *pa, const void *pb) {
    const entry *a = pa, *b = pb;
    int c = strcmp(a->name, b->name);
    return c ? c : (a->order < b->order ? -1 : a->order > b->order);
}

static int cmp_by_name(const void *pa, const void *pb) {
    const cart_st_tensor *a = *(const cart_st_tensor *const *)pa;
    const cart_st_tensor *b = *(const cart_st_tensor *const *)pb;
    return strcmp(a->name.data, b->name.data);
}

/* The entries, sorted by blob offset, must cover [0, blob_size) exactly. */
static int check_tiling(const entry *es, int64_t n, uint64_t blob_size, const char *path) {
    uint64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        const entry *e = &es[i];
        if (e->begin < at)
            return tensor_fail(CART_E_FORMAT, path, e->name,
                               "data_offsets [%llu, %llu] overlaps tensor '%s', which ends at "
                               "%llu",
                               (unsigned long long)e->begin, (unsigned long long)e->end,
                               es[i - 1].name, (unsigned long long)at);
        if (e->begin > at) {
            if (i == 0)
                return tensor_fail(CART_E_FORMAT, path, e->name,
                                   "data_offsets [%llu, %llu] leave a gap: the first tensor "
                                   "must begin at 0",
                                   (unsigned long long)e->begin, (unsigned long long)e->end);
            return tensor_fail(CART_E_FORMAT, path, e->name,
                               "data_offsets [%llu, %llu] leave a gap of %llu bytes after "
                               "tensor '%s', which ends at %llu",
                               (unsigned long long)e->begin, (unsigned long long)e->end,
                               (unsigned long long)(e->begin - at), es[i - 1].name,
                               (unsigned long long)at);
        }
        at = e->end;
    }
    if (at != blob_size)
        return cart_fail(CART_E_FORMAT,
                         "%s: the data holds %llu bytes but the tensors end at %llu: %llu "
                         "trailing bytes belong to no tensor",
                         path, (unsigned long long)blob_size, (unsigned long long)at,
                         (unsigned long long)(blob_size - at));
    return CART_OK;
}

/* Copies s (NUL-terminated) to *cursor and advances it. */
static cart_str arena_copy(char **cursor, const char *s) {
    size_t n = strlen(s);
    char *p = *cursor;
    memcpy(p, s, n + 1);
    *cursor = p + n + 1;
    return (cart_str){p, n};
}

/* The header's length from the first 8 bytes of f->bytes, checked against
 * the file. */
static int header_length(const cart_st_file *f, const char *path, uint64_t *len) {
    if (f->size < 8)
        return cart_fail(CART_E_FORMAT,
                         "%s: file is %llu bytes, shorter than the 8-byte header length", path,
                         (unsigned long long)f->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->bytes[i];
    if (n < 2)
        return cart_fail(CART_E_FORMAT,
                         "%s: header length %llu is too small (expected at least 2, '{}')", path,
                         (unsigned long long)n);
    if (n > MAX_HEADER)
        return cart_fail(CART_E_FORMAT, "%s: header length %llu exceeds the limit of %d bytes",
                         path, (unsigned long long)n, MAX_HEADER);
    if (n > f->size - 8)
        return cart_fail(CART_E_FORMAT,
                         "%s: header length %llu runs past the end of the file (%llu bytes; is "
                         "it truncated?)",
                         path, (unsigned long long)n, (unsigned long long)f->size);
    *len = n;
    return CART_OK;
}

/* The header's n bytes as a JSON object: *text holds a NUL-terminated copy
 * (so cJSON never reads past the header) and *root its tree; the caller
 * frees both, also on failure. */
static int parse_json_header(const uint8_t *hdr, uint64_t n, const char *path, char **text,
                             cJSON **root) {
    int rc = lex_header(hdr, n, path);
    if (rc) return rc;
    if (hdr[0] != '{')
        return cart_fail(CART_E_FORMAT,
                         "%s: header must be a JSON object beginning with '{', found '%c'", path,
                         hdr[0] >= 0x20 && hdr[0] < 0x7f ? hdr[0] : '?');
    char *t = *text = cart_malloc((size_t)n + 1, "safetensors header");
    if (!t) return CART_E_NOMEM;
    memcpy(t, hdr, (size_t)n);
    t[n] = '\0';
    const char *end = NULL;
    *root = cJSON_ParseWithLengthOpts(t, (size_t)n, &end, 0);
    if (!*root) {
        size_t at = end && end >= t && end <= t + n ? (size_t)(end - t) : 0;
        return cart_fail(CART_E_FORMAT, "%s: header is not valid JSON (error near header byte %zu)",
                         path, at);
    }
    for (const char *p = end; p < t + n; p++)
        if (!is_json_space((uint8_t)*p))
            return cart_fail(CART_E_FORMAT,
                             "%s: header byte %zu: unexpected '%c' after the JSON object (only "
                             "space padding may follow)",
                             path, (size_t)(p - t), *p >= 0x20 && *p < 0x7f ? *p : '?');
    if (!cJSON_IsObject(*root))
        return cart_fail(CART_E_FORMAT, "%s: header is %s, expected a JSON object", path,
                         json_kind(*root));
    return CART_OK;
}

/* What the header holds: its tensors and metadata keys counted, the bytes
 * their strings take (with the path's), the metadata checked. */
typedef struct header_counts {
    const cJSON *meta;
    int64_t tensors, meta_keys;
    size_t chars;
} header_counts;

static int count_header(const cJSON *root, const char *path, header_counts *hc) {
    *hc = (header_counts){NULL, 0, 0, strlen(path) + 1};
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__") != 0) {
            hc->tensors++;
            hc->chars += strlen(c->string) + 1;
            continue;
        }
        if (hc->meta) return cart_fail(CART_E_FORMAT, "%s: duplicate __metadata__ object", path);
        hc->meta = c;
        int rc = parse_metadata(c, path);
        if (rc) return rc;
        for (const cJSON *m = c->child; m; m = m->next, hc->meta_keys++)
            hc->chars += strlen(m->string) + strlen(m->valuestring) + 2;
    }
    return CART_OK;
}

/* The entries, parsed from the root's tensor members, with no name twice
 * and tiling the blob; left sorted by blob offset. */
static int parse_entries(entry *es, const cJSON *root, const header_counts *hc, const char *path,
                         uint64_t blob_size) {
    int64_t i = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (c == hc->meta) continue;
        es[i].name = c->string;
        es[i].order = i;
        int rc = parse_entry(&es[i], c, path, blob_size);
        if (rc) return rc;
        i++;
    }
    /* Duplicates sit side by side once sorted by name. */
    qsort(es, (size_t)hc->tensors, sizeof *es, cmp_entry_name);
    for (i = 1; i < hc->tensors; i++)
        if (strcmp(es[i].name, es[i - 1].name) == 0)
            return cart_fail(CART_E_FORMAT, "%s: duplicate tensor name '%s'", path, es[i].name);
    qsort(es, (size_t)hc->tensors, sizeof *es, cmp_blob_order);
    return check_tiling(es, hc->tensors, blob_size, path);
}

/* f's tensors, name index and metadata from the checked entries, their
 * strings copied into f->arena. */
static void fill_file(cart_st_file *f, const entry *es, const header_counts *hc,
                      const uint8_t *blob, const char *path) {
    char *cursor = f->arena;
    f->path = (char *)arena_copy(&cursor, path).data;
    for (int64_t i = 0; i < hc->tensors; i++) {
        cart_st_tensor *t = &f->tensors[i];
        t->name = arena_copy(&cursor, es[i].name);
        t->dtype = es[i].dtype;
        t->ndim = es[i].ndim;
        memcpy(t->shape, es[i].shape, sizeof t->shape);
        t->offset = es[i].begin;
        t->nbytes = es[i].end - es[i].begin;
        t->data = blob + es[i].begin;
        f->by_name[i] = t;
    }
    qsort(f->by_name, (size_t)hc->tensors, sizeof *f->by_name, cmp_by_name);
    f->n_tensors = hc->tensors;
    int64_t i = 0;
    if (hc->meta)
        for (const cJSON *m = hc->meta->child; m; m = m->next, i++) {
            f->meta[i].key = arena_copy(&cursor, m->string);
            f->meta[i].value = arena_copy(&cursor, m->valuestring);
        }
    f->n_meta = hc->meta_keys;
}

/* Validates the header of f->bytes and fills the tensors, metadata and arena. */
static int parse_file(cart_st_file *f, const char *path) {
    uint64_t n = 0;
    int rc = header_length(f, path, &n);
    if (rc) return rc;
    f->header_size = n;
    const uint8_t *hdr = f->bytes + 8, *blob = hdr + n;
    const uint64_t blob_size = f->size - 8 - n;
    char *text = NULL;
    cJSON *root = NULL;
    entry *es = NULL;
    header_counts hc;
    rc = parse_json_header(hdr, n, path, &text, &root);
    if (!rc) rc = count_header(root, path, &hc);
    if (!rc) {
        es = cart_calloc((size_t)hc.tensors, sizeof *es, "safetensors entries");
        f->tensors = cart_calloc((size_t)hc.tensors, sizeof *f->tensors, "safetensors tensors");
        f->by_name = cart_calloc((size_t)hc.tensors, sizeof *f->by_name, "safetensors name index");
        f->meta = cart_calloc((size_t)hc.meta_keys, sizeof *f->meta, "safetensors metadata");
        f->arena = cart_malloc(hc.chars, "safetensors strings");
        if (!es || !f->tensors || !f->by_name || !f->meta || !f->arena) rc = CART_E_NOMEM;
    }
    if (!rc) rc = parse_entries(es, root, &hc, path, blob_size);
    if (!rc) fill_file(f, es, &hc, blob, path);
    free(es);
    cJSON_Delete(root);
    free(text);
    return rc;
}

static int st_open(cart_st_file **out, cart_mapping *map, const uint8_t *data, uint64_t size,
                   const char *path) {
    cart_st_file *f = cart_calloc(1, sizeof *f, "safetensors file");
    if (!f) {
        cart_unmap_file(map);
        return CART_E_NOMEM;
    }
    f->map = *map;
    f->bytes = data;
    f->size = size;
    int rc = parse_file(f, path);
    if (rc) {
        cart_st_close(f);
        return rc;
    }
    *out = f;
    return CART_OK;
}

int cart_st_open(cart_st_file **out, const char *path) {
    if (!out) return cart_fail(CART_E_ARG, "cart_st_open: out is NULL");
    *out = NULL;
    if (!path) return cart_fail(CART_E_ARG, "cart_st_open: path is NULL");
    cart_mapping map;
    int rc = cart_map_file(&map, path);
    if (rc) return rc;
    return st_open(out, &map, map.data, map.size, path);
}

int cart_st_open_memory(cart_st_file **out, const void *data, uint64_t size, const char *name) {
    if (!out) return cart_fail(CART_E_ARG, "cart_st_open_memory: out is NULL");
    *out = NULL;
    if (!data && size > 0) return cart_fail(CART_E_ARG, "cart_st_open_memory: data is NULL");
    cart_mapping none = {NULL, 0, 0};
    return st_open(out, &none, data, size, name ? name : "<memory>");
}

void cart_st_close(cart_st_file *f) {
    if (!f) return;
    cart_unmap_file(&f->map);
    free(f->tensors);
    free(f->by_name);
    free(f->meta);
    free(f->arena);
    free(f);
}

const char *cart_st_path(const cart_st_file *f) {
    return f ? f->path : NULL;
}

uint64_t cart_st_header_size(const cart_st_file *f) {
    return f ? f->header_size : 0;
}

int64_t cart_st_tensor_count(const cart_st_file *f) {
    return f ? f->n_tensors : 0;
}

const cart_st_tensor *cart_st_tensor_at(const cart_st_file *f, int64_t i) {
    if (!f || i < 0 || i >= f->n_tensors) return NULL;
    return &f->tensors[i];
}

const cart_st_tensor *cart_st_find(const cart_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    int64_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const cart_st_tensor *t = f->by_name[mid];
        int c = strcmp(t->name.data, name);
        if (c == 0) return t;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int64_t cart_st_meta_count(const cart_st_file *f) {
    return f ? f->n_meta : 0;
}

const cart_st_meta *cart_st_meta_at(const cart_st_file *f, int64_t i) {
    if (!f || i < 0 || i >= f->n_meta) return NULL;
    return &f->meta[i];
}

const cart_str *cart_st_meta_get(const cart_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int64_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[i].key.data, key) == 0) return &f->meta[i].value;
    return NULL;
}

/* ---- checksum ----------------------------------------------------------- */

static const char CHECKSUM_KEY[] = "cartridge.checksum";
static void cs_final(cart_cs64 *c, char *out) {
    snprintf(out, 22, "cs64:%016llx", (unsigned long long)cart_cs64_final(c));
}

void cart_st_checksum(const void *data, uint64_t n, char *out) {
    cart_cs64 c;
    cart_cs64_init(&c);
    cart_cs64_update(&c, data, n);
    cs_final(&c, out);
}

int cart_st_verify_checksum(const cart_st_file *f) {
    if (!f) return cart_fail(CART_E_ARG, "cart_st_verify_checksum: file is NULL");
    const cart_str *want = cart_st_meta_get(f, CHECKSUM_KEY);
    if (!want) return cart_fail(CART_E_NOT_FOUND, "%s: no %s in __metadata__", f->path, CHECKSUM_KEY);
    char got[22];
    uint64_t at = 8 + f->header_size;
    cart_st_checksum(f->bytes + at, f->size - at, got);
    if (want->len != strlen(got) || memcmp(want->data, got, want->len) != 0)
        return cart_fail(CART_E_FORMAT,
                         "%s: the tensor bytes do not match the file's checksum (stored %.*s, computed "
                         "%s): the file is damaged; restore it from a copy or train it again",
                         f->path, (int)(want->len < 64 ? want->len : 64), want->data, got);
    return CART_OK;
}

/* ---- writer ------------------------------------------------------------- */

typedef struct wtensor {
    char *name; /* owned */
    int32_t dtype;
    int32_t ndim;
    int64_t shape[MAX_DIMS];
    uint64_t nbytes;
    const void *data; /* (nbytes) borrowed */
} wtensor;

/* An open-addressing set of names -> index, for duplicate checks in O(1).
 * The names are borrowed from the writer's own copies. */
typedef struct name_slot {
    const char *name; /* NULL: empty */
    int64_t index;
} name_slot;

typedef struct name_set {
    name_slot *slots; /* (cap) at most half full; cap a power of two */
    int64_t n, cap;
} name_set;

static uint64_t hash_name(const char *s) {
    uint64_t h = UINT64_C(1469598103934665603); /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * UINT64_C(1099511628211);
    return h;
}

/* The slot holding `name`, or the empty slot where it would go. */
static name_slot *set_find(const name_set *set, const char *name) {
    uint64_t mask = (uint64_t)set->cap - 1;
    for (uint64_t i = hash_name(name) & mask;; i = (i + 1) & mask) {
        name_slot *s = &set->slots[i];
        if (!s->name || strcmp(s->name, name) == 0) return s;
    }
}

/* Makes room for one more name. */
static int set_reserve(name_set *set) {
    if (2 * (set->n + 1) <= set->cap) return CART_OK;
    int64_t cap = set->cap ? 2 * set->cap : 64;
    name_slot *slots = cart_calloc((size_t)cap, sizeof *slots, "safetensors name set");
    if (!slots) return CART_E_NOMEM;
    name_set bigger = {slots, set->n, cap};
    for (int64_t i = 0; i < set->cap; i++)
        if (set->slots[i].name) *set_find(&bigger, set->slots[i].name) = set->slots[i];
    free(set->slots);
    *set = bigger;
    return CART_OK;
}

struct cart_st_writer {
    wtensor *tensors; /* (n, cap) in the order added */
    int64_t n, cap;
    name_set names;        /* tensor name -> index into tensors */
    char **keys, **values; /* (n_meta, cap_meta) owned, insertion order */
    int64_t n_meta, cap_meta;
    name_set meta_keys; /* key -> index into keys */
    int checksum;       /* store CHECKSUM_KEY at write */
};

void cart_st_writer_add_checksum(cart_st_writer *w) {
    if (w) w->checksum = 1;
}

int cart_st_writer_new(cart_st_writer **out) {
    if (!out) return cart_fail(CART_E_ARG, "cart_st_writer_new: out is NULL");
    *out = cart_calloc(1, sizeof **out, "safetensors writer");
    return *out ? CART_OK : CART_E_NOMEM;
}

void cart_st_writer_free(cart_st_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n; i++) free(w->tensors[i].name);
    for (int64_t i = 0; i < w->n_meta; i++) {
        free(w->keys[i]);
        free(w->values[i]);
    }
    free(w->tensors);
    free(w->names.slots);
    free(w->meta_keys.slots);
    free(w->keys);
    free(w->values);
    free(w);
}

int cart_st_writer_set_meta(cart_st_writer *w, const char *key, const char *value) {
    if (!w || !key || !value)
        return cart_fail(CART_E_ARG, "cart_st_writer_set_meta: %s is NULL",
                         !w     ? "writer"
                         : !key ? "key"
                                : "value");
    if (!utf8_valid(key))
        return cart_fail(CART_E_ARG, "cart_st_writer_set_meta: key '%s' is not valid UTF-8", key);
    if (!utf8_valid(value))
        return cart_fail(CART_E_ARG,
                         "cart_st_writer_set_meta: value of key '%s' is not valid UTF-8", key);
    if (set_reserve(&w->meta_keys)) return CART_E_NOMEM;
    name_slot *slot = set_find(&w->meta_keys, key);
    char *v = cart_strdup(value, "safetensors metadata value");
    if (!v) return CART_E_NOMEM;
    if (slot->name) {
        free(w->values[slot->index]);
        w->values[slot->index] = v;
        return CART_OK;
    }
    if (w->n_meta == w->cap_meta) {
        int64_t cap = w->cap_meta ? 2 * w->cap_meta : 8;
        char **keys = cart_realloc(w->keys, (size_t)cap * sizeof *keys, "safetensors metadata");
        if (keys) w->keys = keys;
        char **values =
            keys ? cart_realloc(w->values, (size_t)cap * sizeof *values, "safetensors metadata")
                 : NULL;
        if (values) w->values = values;
        if (!keys || !values) {
            free(v);
            return CART_E_NOMEM;
        }
        w->cap_meta = cap;
    }
    char *k = cart_strdup(key, "safetensors metadata key");
    if (!k) {
        free(v);
        return CART_E_NOMEM;
    }
    w->keys[w->n_meta] = k;
    w->values[w->n_meta] = v;
    *slot = (name_slot){k, w->n_meta};
    w->meta_keys.n++;
    w->n_meta++;
    return CART_OK;
}

int cart_st_writer_add(cart_st_writer *w, const char *name, int32_t dtype, int32_t ndim,
                       const int64_t *shape, const void *data) {
    if (!w) return cart_fail(CART_E_ARG, "cart_st_writer_add: writer is NULL");
    if (!name || !name[0])
        return cart_fail(CART_E_ARG,
                         "cart_st_writer_add: tensor name is %s, expected a "
                         "non-empty string",
                         name ? "empty" : "NULL");
    if (strcmp(name, "__metadata__") == 0)
        return cart_fail(CART_E_ARG,
                         "cart_st_writer_add: '__metadata__' is reserved and cannot name a tensor");
    if (!utf8_valid(name))
        return cart_fail(CART_E_ARG, "cart_st_writer_add: tensor name '%s' is not valid UTF-8",
                         name);
    if (!cart_st_dtype_name(dtype)) {
        const char *ggml = cart_dtype_name(dtype);
        if (ggml)
            return cart_fail(CART_E_UNSUPPORTED,
                             "cart_st_writer_add: tensor '%s': dtype %s has no safetensors "
                             "equivalent",
                             name, ggml);
        return cart_fail(CART_E_ARG, "cart_st_writer_add: tensor '%s': unknown dtype id %d", name,
                         (int)dtype);
    }
    if (ndim < 0 || ndim > MAX_DIMS)
        return cart_fail(CART_E_ARG, "cart_st_writer_add: tensor '%s': ndim %d, expected 0..%d",
                         name, (int)ndim, MAX_DIMS);
    if (ndim > 0 && !shape)
        return cart_fail(CART_E_ARG, "cart_st_writer_add: tensor '%s': shape is NULL", name);
    wtensor t = {.dtype = dtype, .ndim = ndim, .data = data};
    for (int i = 0; i < MAX_DIMS; i++) t.shape[i] = 1;
    for (int32_t i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (double)shape[i] > MAX_JSON_INT)
            return cart_fail(CART_E_ARG,
                             "cart_st_writer_add: tensor '%s': shape[%d] is %lld, expected "
                             "0..2^53",
                             name, (int)i, (long long)shape[i]);
        t.shape[i] = shape[i];
    }
    char sbuf[256];
    if (!shape_nbytes(&t.nbytes, t.shape, ndim, elem_size(dtype)))
        return cart_fail(
            CART_E_ARG, "cart_st_writer_add: tensor '%s': shape %s x %s overflows 2^53 bytes", name,
            shape_str(sbuf, sizeof sbuf, t.shape, ndim), cart_st_dtype_name(dtype));
    if (!data && t.nbytes > 0)
        return cart_fail(CART_E_ARG, "cart_st_writer_add: tensor '%s': data is NULL for %llu bytes",
                         name, (unsigned long long)t.nbytes);

    if (set_reserve(&w->names)) return CART_E_NOMEM;
    name_slot *slot = set_find(&w->names, name);
    if (slot->name)
        return cart_fail(CART_E_ARG, "cart_st_writer_add: duplicate tensor name '%s'", name);
    if (w->n == w->cap) {
        int64_t cap = w->cap ? 2 * w->cap : 16;
        wtensor *ts = cart_realloc(w->tensors, (size_t)cap * sizeof *ts, "safetensors tensors");
        if (!ts) return CART_E_NOMEM;
        w->tensors = ts;
        w->cap = cap;
    }
    t.name = cart_strdup(name, "safetensors tensor name");
    if (!t.name) return CART_E_NOMEM;
    w->tensors[w->n] = t;
    *slot = (name_slot){t.name, w->n};
    w->names.n++;
    w->n++;
    return CART_OK;
}

/* A growable byte buffer for the header. */
typedef struct strbuf {
    char *data;
    size_t len, cap;
    int failed;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        char *p = cart_realloc(b->data, cap, "safetensors header");
        if (!p) {
            b->failed = 1;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

static void sb_puts(strbuf *b, const char *s) {
    sb_put(b, s, strlen(s));
}

static void sb_u64(strbuf *b, uint64_t v) {
    char tmp[24];
    sb_put(b, tmp, (size_t)snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v));
}

/* A JSON string literal: quotes and backslashes escaped, control characters
 * as \u00xx, everything else (UTF-8 included) as it is. */
static void sb_json_string(strbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        uint8_t c = (uint8_t)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, s, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* The Hugging Face writer's order: dtype rank descending (I64 F64 F32 I32
 * BF16 F16 I16 I8 U8 BOOL, so alignment never increases and every tensor
 * starts aligned), then name bytewise ascending. */
static int cmp_write_order(const void *pa, const void *pb) {
    const wtensor *a = *(const wtensor *const *)pa, *b = *(const wtensor *const *)pb;
    int ra = st_dtype_rank(a->dtype), rb = st_dtype_rank(b->dtype);
    if (ra != rb) return ra > rb ? -1 : 1;
    return strcmp(a->name, b->name);
}

int cart_st_writer_write(cart_st_writer *w, const char *path) {
    if (!w || !path)
        return cart_fail(CART_E_ARG, "cart_st_writer_write: %s is NULL", !w ? "writer" : "path");
    const wtensor **order = cart_calloc((size_t)w->n, sizeof *order, "safetensors write order");
    if (!order) return CART_E_NOMEM;
    for (int64_t i = 0; i < w->n; i++) order[i] = &w->tensors[i];
    qsort(order, (size_t)w->n, sizeof *order, cmp_write_order);
    if (w->checksum) {
        cart_cs64 c;
        cart_cs64_init(&c);
        for (int64_t i = 0; i < w->n; i++) cart_cs64_update(&c, order[i]->data, order[i]->nbytes);
        char sum[22];
        cs_final(&c, sum);
        int rc = cart_st_writer_set_meta(w, CHECKSUM_KEY, sum);
        if (rc) {
            free(order);
            return rc;
        }
    }

    strbuf b = {0};
    sb_puts(&b, "{");
    if (w->n_meta > 0) {
        sb_puts(&b, "\"__metadata__\":{");
        for (int64_t i = 0; i < w->n_meta; i++) {
            if (i) sb_puts(&b, ",");
            sb_json_string(&b, w->keys[i]);
            sb_puts(&b, ":");
            sb_json_string(&b, w->values[i]);
        }
        sb_puts(&b, "}");
    }
    uint64_t at = 0;
    for (int64_t i = 0; i < w->n; i++) {
        const wtensor *t = order[i];
        if (i || w->n_meta > 0) sb_puts(&b, ",");
        sb_json_string(&b, t->name);
        sb_puts(&b, ":{\"dtype\":\"");
        sb_puts(&b, cart_st_dtype_name(t->dtype));
        sb_puts(&b, "\",\"shape\":[");
        for (int32_t d = 0; d < t->ndim; d++) {
            if (d) sb_puts(&b, ",");
            sb_u64(&b, (uint64_t)t->shape[d]);
        }
        sb_puts(&b, "],\"data_offsets\":[");
        sb_u64(&b, at);
        sb_puts(&b, ",");
        sb_u64(&b, at + t->nbytes);
        sb_puts(&b, "]}");
        at += t->nbytes;
    }
    sb_puts(&b, "}");
    while ((8 + b.len) % 8 != 0) sb_puts(&b, " ");

    int rc = CART_OK;
    if (b.failed)
        rc = CART_E_NOMEM;
    else if (at > (UINT64_C(1) << 53))
        rc = cart_fail(CART_E_ARG, "%s: the tensors hold %llu bytes, more than 2^53", path,
                       (unsigned long long)at);
    else if (b.len > MAX_HEADER)
        rc =
            cart_fail(CART_E_ARG, "%s: the header takes %zu bytes, more than the %d readers accept",
                      path, b.len, MAX_HEADER);
    if (rc) {
        free(b.data);
        free(order);
        return rc;
    }

    cart_afile out;
    rc = cart_afile_open(&out, path);
    if (!rc) {
        uint8_t len[8];
        for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)b.len >> (8 * i));
        rc = cart_afile_write(&out, len, sizeof len);
        if (!rc) rc = cart_afile_write(&out, b.data, b.len);
        for (int64_t i = 0; i < w->n && !rc; i++)
            rc = cart_afile_write(&out, order[i]->data, (size_t)order[i]->nbytes);
        if (rc)
            cart_afile_abort(&out);
        else
            rc = cart_afile_commit(&out);
    }
    free(b.data);
    free(order);
    return rc;
}
