/*
 * kvspill.c - the server's KV spill file (kvspill.h): written from a cache,
 * opened and checked against a model, verified, read into a cache.
 */
#include "kvspill.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "internal.h"
#include "safetensors.h"

#define KEY_FORMAT "kvspill.format"
#define KEY_VERSION "kvspill.version"
#define KEY_MODEL "kvspill.model"
#define KEY_MODEL_HASH "kvspill.model_hash"
#define KEY_CART "kvspill.cartridge"
#define KEY_CART_HASH "kvspill.cartridge_hash"
#define KEY_CART_P "kvspill.cartridge_p"
#define KEY_DTYPE "kvspill.dtype"
#define KEY_CHECKSUM "kvspill.checksum"

struct cart_kvspill {
    cart_st_file *st;
    char *path;
    int64_t n, p;
    const int32_t *tokens; /* into the mapping (the writer aligns I32 data) */
    int32_t *tokens_copy;  /* when the mapping's are unaligned */
    int32_t n_layer;
};

/* One tensor of a spill file, as the checksum sees it. */
typedef struct part {
    char name[40];
    int32_t dtype, ndim;
    int64_t shape[3];
    const void *data;
    uint64_t nbytes;
} part;

static int cmp_line(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* kvspill.checksum of the parts (kvspill.h) into out (22 bytes). */
static int content_sum(const part *parts, int64_t count, char *out) {
    char **lines = cart_calloc((size_t)count, sizeof *lines, "kv spill checksum");
    size_t total = 0;
    int rc = lines ? CART_OK : CART_E_NOMEM;
    for (int64_t i = 0; i < count && rc == CART_OK; i++) {
        char sum[22], dims[72] = "";
        cart_st_checksum(parts[i].data, parts[i].nbytes, sum);
        for (int32_t d = 0, at = 0; d < parts[i].ndim; d++)
            at += snprintf(dims + at, sizeof dims - (size_t)at, d ? ",%" PRId64 : "%" PRId64, parts[i].shape[d]);
        size_t len = strlen(parts[i].name) + strlen(dims) + 64;
        if (!(lines[i] = cart_malloc(len, "kv spill checksum"))) { rc = CART_E_NOMEM; break; }
        snprintf(lines[i], len, "%s %s [%s] %s", parts[i].name, cart_st_dtype_name(parts[i].dtype), dims, sum);
        total += strlen(lines[i]) + 1;
    }
    char *text = rc == CART_OK ? cart_malloc(total + 1, "kv spill checksum") : NULL;
    if (rc == CART_OK && !text) rc = CART_E_NOMEM;
    if (rc == CART_OK) {
        qsort(lines, (size_t)count, sizeof *lines, cmp_line);
        size_t at = 0;
        for (int64_t i = 0; i < count; i++) {
            if (i) text[at++] = '\n';
            size_t l = strlen(lines[i]);
            memcpy(text + at, lines[i], l);
            at += l;
        }
        cart_st_checksum(text, at, out);
    }
    for (int64_t i = 0; lines && i < count; i++) free(lines[i]);
    free(lines), free(text);
    return rc;
}

/* Bytes of one cache row of a layer. */
static uint64_t row_bytes(int32_t heads, int32_t dims, int32_t dtype) {
    return (uint64_t)heads * (uint64_t)dims * (dtype == CART_F32 ? 4u : 2u);
}

/* The parts of a file holding rows p .. p + n - 1 of kv. parts has room for
 * 1 + 2 * n_layer. */
static void cache_parts(part *parts, cart_kv *kv, const int32_t *tokens, int64_t n, int64_t p) {
    const int32_t dtype = cart_kv_dtype(kv);
    parts[0] = (part){.name = "tokens", .dtype = CART_I32, .ndim = 1, .shape = {n}, .data = tokens,
                      .nbytes = (uint64_t)n * 4};
    for (int32_t l = 0; l < cart_kv_n_layer(kv); l++)
        for (int32_t which = 0; which < 2; which++) {
            const int32_t heads = cart_kv_layer_heads(kv, l), dims = cart_kv_layer_head_dim(kv, l);
            const uint64_t rb = row_bytes(heads, dims, dtype);
            part *t = &parts[1 + 2 * l + which];
            snprintf(t->name, sizeof t->name, "layers.%d.%s", (int)l, which ? "v" : "k");
            t->dtype = dtype, t->ndim = 3;
            t->shape[0] = n, t->shape[1] = heads, t->shape[2] = dims;
            t->data = (const uint8_t *)cart_kv_rows(kv, l, which) + (uint64_t)p * rb;
            t->nbytes = (uint64_t)n * rb;
        }
}

static int set_owner(cart_st_writer *w, const cart_kvspill_owner *o, int32_t dtype, const char *sum) {
    char p[24];
    snprintf(p, sizeof p, "%" PRId64, o->p);
    const char *kv[][2] = {{KEY_FORMAT, CART_KVSPILL_FORMAT}, {KEY_VERSION, CART_KVSPILL_VERSION},
                           {KEY_MODEL, o->model}, {KEY_MODEL_HASH, o->model_hash}, {KEY_CART, o->cartridge},
                           {KEY_CART_HASH, o->cartridge_hash}, {KEY_CART_P, p},
                           {KEY_DTYPE, dtype == CART_F32 ? "f32" : "f16"}, {KEY_CHECKSUM, sum}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        int rc = cart_st_writer_set_meta(w, kv[i][0], kv[i][1]);
        if (rc) return rc;
    }
    return CART_OK;
}

int cart_kvspill_write(const char *path, cart_kv *kv, const int32_t *tokens, int64_t n,
                       const cart_kvspill_owner *owner) {
    if (!path || !kv || !tokens || !owner || !owner->model || !owner->model_hash || !owner->cartridge ||
        !owner->cartridge_hash)
        return cart_fail(CART_E_ARG, "cart_kvspill_write: NULL argument or owner field");
    if (n < 1 || owner->p < 0 || cart_kv_len(kv) < owner->p + n)
        return cart_fail(CART_E_ARG, "cart_kvspill_write: the cache holds %" PRId64 " rows, not the %" PRId64
                         " of its cartridge and %" PRId64 " tokens", cart_kv_len(kv), owner->p + n, n);
    const int64_t count = 1 + 2 * (int64_t)cart_kv_n_layer(kv);
    part *parts = cart_calloc((size_t)count, sizeof *parts, "kv spill");
    if (!parts) return CART_E_NOMEM;
    cache_parts(parts, kv, tokens, n, owner->p);
    char sum[22];
    cart_st_writer *w = NULL;
    int rc = content_sum(parts, count, sum);
    if (rc == CART_OK) rc = cart_st_writer_new(&w);
    for (int64_t i = 0; i < count && rc == CART_OK; i++)
        rc = cart_st_writer_add(w, parts[i].name, parts[i].dtype, parts[i].ndim, parts[i].shape, parts[i].data);
    if (rc == CART_OK) rc = set_owner(w, owner, cart_kv_dtype(kv), sum);
    if (rc == CART_OK) rc = cart_st_writer_write(w, path);
    cart_st_writer_free(w);
    free(parts);
    return rc;
}

void cart_kvspill_close(cart_kvspill *f) {
    if (!f) return;
    cart_st_close(f->st);
    free(f->path), free(f->tokens_copy);
    free(f);
}

const char *cart_kvspill_meta(const cart_kvspill *f, const char *key) {
    const cart_str *v = f && key ? cart_st_meta_get(f->st, key) : NULL;
    return v ? v->data : NULL; /* the reader's values are NUL-terminated copies */
}

/* Fails the open: status, "<path>: what". */
static int refuse(const cart_kvspill *f, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int refuse(const cart_kvspill *f, int status, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return cart_fail(status, "%s: %s", f->path, what);
}

/* A metadata value for a message: quoted, or "missing". */
static const char *shown(const cart_kvspill *f, const char *key, char *buf, size_t cap) {
    const char *v = cart_kvspill_meta(f, key);
    if (!v) return "missing";
    snprintf(buf, cap, "'%.200s'", v);
    return buf;
}

static int is_sum(const char *s) {
    if (!s || strncmp(s, "cs64:", 5) != 0 || !s[5]) return 0;
    for (s += 5; *s; s++)
        if (!strchr("0123456789abcdefABCDEF", *s)) return 0;
    return 1;
}

/* The metadata: whose file this is (foreign: CART_E_UNSUPPORTED) and
 * whether it is one at all (CART_E_FORMAT). */
static int check_meta(cart_kvspill *f, const char *model_hash, int32_t dtype) {
    char a[224], b[224];
    const char *format = cart_kvspill_meta(f, KEY_FORMAT), *version = cart_kvspill_meta(f, KEY_VERSION);
    if (!format || strcmp(format, CART_KVSPILL_FORMAT) != 0)
        return refuse(f, CART_E_FORMAT, KEY_FORMAT " is %s, not '" CART_KVSPILL_FORMAT "': not a KV spill file",
                      shown(f, KEY_FORMAT, a, sizeof a));
    if (!version || strcmp(version, CART_KVSPILL_VERSION) != 0)
        return refuse(f, CART_E_UNSUPPORTED, "format version %s; this engine reads version " CART_KVSPILL_VERSION,
                      shown(f, KEY_VERSION, a, sizeof a));
    const char *hash = cart_kvspill_meta(f, KEY_MODEL_HASH);
    if (!hash || strcmp(hash, model_hash) != 0)
        return refuse(f, CART_E_UNSUPPORTED, "written for another model (%s, hash %s); this model has hash %s",
                      shown(f, KEY_MODEL, a, sizeof a), shown(f, KEY_MODEL_HASH, b, sizeof b), model_hash);
    const char *want = dtype == CART_F32 ? "f32" : "f16", *got = cart_kvspill_meta(f, KEY_DTYPE);
    if (!got || strcmp(got, want) != 0)
        return refuse(f, CART_E_UNSUPPORTED, "its rows are %s and this cache is %s (--kv)",
                      shown(f, KEY_DTYPE, a, sizeof a), want);
    if (!cart_kvspill_meta(f, KEY_CART_HASH))
        return refuse(f, CART_E_FORMAT, "no " KEY_CART_HASH " in __metadata__");
    const char *p = cart_kvspill_meta(f, KEY_CART_P);
    char *end = NULL;
    f->p = p && *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : -1;
    if (f->p < 0 || !end || *end || f->p > (int64_t)1 << 40)
        return refuse(f, CART_E_FORMAT, KEY_CART_P " is %s, not a row count", shown(f, KEY_CART_P, a, sizeof a));
    if (!is_sum(cart_kvspill_meta(f, KEY_CHECKSUM)))
        return refuse(f, CART_E_FORMAT, "no " KEY_CHECKSUM " in __metadata__");
    return CART_OK;
}

/* The tensors: tokens, then K and V of every layer of m in the dtype. */
static int check_tensors(cart_kvspill *f, const cart_model *m, int32_t dtype) {
    const cart_st_tensor *tok = cart_st_find(f->st, "tokens");
    if (!tok || tok->dtype != CART_I32 || tok->ndim != 1 || tok->shape[0] < 1)
        return refuse(f, CART_E_FORMAT, "no 'tokens' tensor of shape [n >= 1] and dtype I32");
    const int32_t L = cart_model_get_config(m)->n_layer;
    f->n = tok->shape[0], f->n_layer = L;
    if (cart_st_tensor_count(f->st) != 1 + 2 * (int64_t)L)
        return refuse(f, CART_E_FORMAT, "%" PRId64 " tensors; a spill file for this model has %d (tokens and K, V "
                      "of %d layers)", cart_st_tensor_count(f->st), (int)(1 + 2 * L), (int)L);
    const char *dname = cart_st_dtype_name(dtype);
    for (int32_t l = 0; l < L; l++) {
        cart_layer_config g;
        int rc = cart_model_layer(m, l, &g);
        if (rc) return rc;
        for (int which = 0; which < 2; which++) {
            char name[40];
            snprintf(name, sizeof name, "layers.%d.%s", (int)l, which ? "v" : "k");
            const cart_st_tensor *t = cart_st_find(f->st, name);
            if (!t || t->dtype != dtype || t->ndim != 3 || t->shape[0] != f->n || t->shape[1] != g.n_head_kv ||
                t->shape[2] != g.head_dim)
                return refuse(f, CART_E_FORMAT, "'%s' is not %s [%" PRId64 ", %d, %d]", name, dname, f->n,
                              (int)g.n_head_kv, (int)g.head_dim);
        }
    }
    return CART_OK;
}

/* The token ids, within the vocabulary (copied when unaligned). */
static int check_tokens(cart_kvspill *f, const cart_model *m) {
    const cart_st_tensor *tok = cart_st_find(f->st, "tokens");
    f->tokens = tok->data;
    if ((uintptr_t)tok->data % 4) {
        if (!(f->tokens_copy = cart_malloc((size_t)tok->nbytes, "kv spill tokens"))) return CART_E_NOMEM;
        memcpy(f->tokens_copy, tok->data, (size_t)tok->nbytes);
        f->tokens = f->tokens_copy;
    }
    const int32_t n_vocab = cart_model_get_config(m)->n_vocab;
    for (int64_t i = 0; i < f->n; i++)
        if (f->tokens[i] < 0 || f->tokens[i] >= n_vocab)
            return refuse(f, CART_E_FORMAT, "tokens[%" PRId64 "] is %d, outside the vocabulary of %d", i,
                          (int)f->tokens[i], (int)n_vocab);
    return CART_OK;
}

int cart_kvspill_open(cart_kvspill **out, const char *path, const cart_model *m, const char *model_hash,
                      int32_t dtype) {
    if (!out || !path || !m || !model_hash) return cart_fail(CART_E_ARG, "cart_kvspill_open: NULL argument");
    *out = NULL;
    if (dtype != CART_F16 && dtype != CART_F32)
        return cart_fail(CART_E_ARG, "cart_kvspill_open: the cache dtype must be F16 or F32");
    cart_kvspill *f = cart_calloc(1, sizeof *f, "kv spill");
    if (!f) return CART_E_NOMEM;
    int rc = (f->path = cart_strdup(path, "kv spill")) ? cart_st_open(&f->st, path) : CART_E_NOMEM;
    if (rc == CART_OK) rc = check_meta(f, model_hash, dtype);
    if (rc == CART_OK) rc = check_tensors(f, m, dtype);
    if (rc == CART_OK) rc = check_tokens(f, m);
    if (rc) {
        cart_kvspill_close(f);
        return rc;
    }
    *out = f;
    return CART_OK;
}

int64_t cart_kvspill_n(const cart_kvspill *f) { return f ? f->n : 0; }
const int32_t *cart_kvspill_tokens(const cart_kvspill *f) { return f ? f->tokens : NULL; }
int64_t cart_kvspill_p(const cart_kvspill *f) { return f ? f->p : 0; }

int cart_kvspill_verify(const cart_kvspill *f) {
    if (!f) return cart_fail(CART_E_ARG, "cart_kvspill_verify: NULL file");
    const int64_t count = cart_st_tensor_count(f->st);
    part *parts = cart_calloc((size_t)count, sizeof *parts, "kv spill");
    if (!parts) return CART_E_NOMEM;
    for (int64_t i = 0; i < count; i++) {
        const cart_st_tensor *t = cart_st_tensor_at(f->st, i);
        snprintf(parts[i].name, sizeof parts[i].name, "%s", t->name.data);
        parts[i].dtype = t->dtype, parts[i].ndim = t->ndim;
        memcpy(parts[i].shape, t->shape, sizeof parts[i].shape);
        parts[i].data = t->data, parts[i].nbytes = t->nbytes;
    }
    char sum[22];
    int rc = content_sum(parts, count, sum);
    free(parts);
    if (rc) return rc;
    const char *stored = cart_kvspill_meta(f, KEY_CHECKSUM);
    if (strcmp(stored, sum) != 0)
        return refuse(f, CART_E_FORMAT, "its bytes do not match its checksum (stored %s, computed %s)", stored, sum);
    return CART_OK;
}

/* layers.<l>.k (which 0) or .v (1): present, checked at open. */
static const cart_st_tensor *layer_tensor(const cart_kvspill *f, int32_t l, int which) {
    char name[40];
    snprintf(name, sizeof name, "layers.%d.%s", (int)l, which ? "v" : "k");
    return cart_st_find(f->st, name);
}

int cart_kvspill_load(const cart_kvspill *f, cart_kv *kv, int64_t n) {
    if (!f || !kv) return cart_fail(CART_E_ARG, "cart_kvspill_load: NULL argument");
    const int32_t dtype = cart_kv_dtype(kv);
    if (n < 1 || n > f->n || cart_kv_len(kv) != f->p || f->p + n > cart_kv_capacity(kv) ||
        cart_kv_n_layer(kv) != f->n_layer)
        return cart_fail(CART_E_ARG, "cart_kvspill_load: the cache holds %" PRId64 " rows (not the cartridge's %"
                         PRId64 ") or fits fewer than %" PRId64 ", or %" PRId64 " is not 1 .. %" PRId64 " tokens",
                         cart_kv_len(kv), f->p, f->p + n, n, f->n);
    for (int32_t l = 0; l < f->n_layer; l++) {
        const cart_st_tensor *t = layer_tensor(f, l, 0);
        if (t->dtype != dtype || cart_kv_layer_heads(kv, l) != t->shape[1] || cart_kv_layer_head_dim(kv, l) != t->shape[2])
            return cart_fail(CART_E_ARG, "cart_kvspill_load: the cache's layer %d is not the file's", (int)l);
    }
    for (int32_t l = 0; l < f->n_layer; l++)
        for (int32_t which = 0; which < 2; which++) {
            const cart_st_tensor *t = layer_tensor(f, l, which);
            const uint64_t rb = row_bytes((int32_t)t->shape[1], (int32_t)t->shape[2], dtype);
            memcpy((uint8_t *)cart_kv_rows(kv, l, which) + (uint64_t)f->p * rb, t->data, (size_t)((uint64_t)n * rb));
        }
    return cart_kv_set_len(kv, f->p + n);
}
