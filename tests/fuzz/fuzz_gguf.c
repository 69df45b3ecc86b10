/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader (engine/gguf.h).
 *
 * Each input is a whole GGUF file, opened from memory (libFuzzer's copy of
 * the input is exactly its size, so ASan sees any read past the end). When it
 * opens, everything the reader hands out is walked and checked against the
 * contract in gguf.h: every metadata value (nested arrays included) and
 * every tensor's data is read byte by byte, the lookups agree with the
 * in-order accessors, the typed getters agree with the value types, tensor
 * sizes and offsets are what the dims, dtype and alignment say, and a bounded
 * prefix of each tensor is converted to f32. Then the file's tokenizer.*
 * metadata goes to cart_tokenizer_load, and a tokenizer that loads encodes
 * and decodes a few strings.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "common.h"
#include "dtype.h"
#include "gguf.h"
#include "tokenizer.h"
#include "fuzz_common.h"

enum { MAX_CONVERT = 512 }; /* elements of each tensor converted to f32 */

static uint64_t elem_size(int32_t type) {
    switch (type) {
    case CART_GGUF_UINT8: case CART_GGUF_INT8: case CART_GGUF_BOOL: return 1;
    case CART_GGUF_UINT16: case CART_GGUF_INT16: return 2;
    case CART_GGUF_UINT32: case CART_GGUF_INT32: case CART_GGUF_FLOAT32: return 4;
    case CART_GGUF_UINT64: case CART_GGUF_INT64: case CART_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static void check_str(cart_str s, const char *what) {
    FUZZ_CHECK(s.data != NULL || s.len == 0, "%s: NULL data with length %lld", what,
               (long long)s.len);
    fuzz_touch(s.data, (uint64_t)s.len);
}

static void walk_value(const cart_gguf_value *v, int depth) {
    FUZZ_CHECK(depth <= 8, "arrays nest %d levels; gguf.h promises at most 8", depth);
    FUZZ_CHECK(cart_gguf_type_name(v->type) != NULL, "value of unknown type %d", (int)v->type);
    if (v->type == CART_GGUF_STRING) {
        check_str(v->as.str, "string value");
        return;
    }
    if (v->type == CART_GGUF_BOOL) FUZZ_CHECK(v->as.u64 <= 1, "bool %llu", (unsigned long long)v->as.u64);
    if (v->type != CART_GGUF_ARRAY) {
        FUZZ_CHECK(v->count == 1 && v->elem_type == -1, "scalar with count %llu, elem_type %d",
                   (unsigned long long)v->count, (int)v->elem_type);
        return;
    }
    FUZZ_CHECK(v->as.array != NULL, "array value with a NULL element pointer");
    FUZZ_CHECK(cart_gguf_type_name(v->elem_type) != NULL, "array of unknown type %d",
               (int)v->elem_type);
    if (v->elem_type == CART_GGUF_STRING) {
        const cart_str *s = v->as.array;
        for (uint64_t i = 0; i < v->count; i++) check_str(s[i], "string array element");
    } else if (v->elem_type == CART_GGUF_ARRAY) {
        const cart_gguf_value *a = v->as.array;
        for (uint64_t i = 0; i < v->count; i++) {
            FUZZ_CHECK(a[i].type == CART_GGUF_ARRAY, "nested element of type %d", (int)a[i].type);
            walk_value(&a[i], depth + 1);
        }
    } else {
        uint64_t size = elem_size(v->elem_type);
        FUZZ_CHECK(((uintptr_t)v->as.array % size) == 0, "array of %s not aligned",
                   cart_gguf_type_name(v->elem_type));
        fuzz_touch(v->as.array, v->count * size);
    }
}

/* The typed getters must agree with the stored type. */
static void check_getters(const cart_gguf *g, const char *key, const cart_gguf_value *v) {
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    double f64;
    int32_t b;
    cart_str s;
    int is_int = v->type <= CART_GGUF_INT32 || v->type == CART_GGUF_UINT64 ||
                 v->type == CART_GGUF_INT64;
    int rc = cart_gguf_get_str(&s, g, key);
    FUZZ_CHECK((rc == CART_OK) == (v->type == CART_GGUF_STRING), "get_str gave %d for a %s", rc,
               cart_gguf_type_name(v->type));
    if (rc == CART_OK) FUZZ_CHECK(s.data == v->as.str.data && s.len == v->as.str.len, "get_str differs");
    rc = cart_gguf_get_bool(&b, g, key);
    FUZZ_CHECK((rc == CART_OK) == (v->type == CART_GGUF_BOOL), "get_bool gave %d for a %s", rc,
               cart_gguf_type_name(v->type));
    rc = cart_gguf_get_u64(&u64, g, key);
    if (rc == CART_OK) FUZZ_CHECK(is_int, "get_u64 accepted a %s", cart_gguf_type_name(v->type));
    rc = cart_gguf_get_u32(&u32, g, key);
    if (rc == CART_OK) FUZZ_CHECK(is_int, "get_u32 accepted a %s", cart_gguf_type_name(v->type));
    rc = cart_gguf_get_i64(&i64, g, key);
    if (rc == CART_OK) FUZZ_CHECK(is_int, "get_i64 accepted a %s", cart_gguf_type_name(v->type));
    int is_number = is_int || v->type == CART_GGUF_FLOAT32 || v->type == CART_GGUF_FLOAT64;
    rc = cart_gguf_get_f32(&f32, g, key);
    FUZZ_CHECK((rc == CART_OK) == is_number, "get_f32 gave %d for a %s", rc,
               cart_gguf_type_name(v->type));
    rc = cart_gguf_get_f64(&f64, g, key);
    FUZZ_CHECK((rc == CART_OK) == is_number, "get_f64 gave %d for a %s", rc,
               cart_gguf_type_name(v->type));
}

static void walk_metadata(const cart_gguf *g) {
    int64_t n = cart_gguf_kv_count(g);
    FUZZ_CHECK(n >= 0, "kv_count %lld", (long long)n);
    FUZZ_CHECK(cart_gguf_kv_at(g, n) == NULL && cart_gguf_kv_at(g, -1) == NULL,
               "kv_at out of range is not NULL");
    char key[256];
    for (int64_t i = 0; i < n; i++) {
        const cart_gguf_kv *kv = cart_gguf_kv_at(g, i);
        FUZZ_CHECK(kv != NULL, "kv_at(%lld) is NULL", (long long)i);
        check_str(kv->key, "key");
        walk_value(&kv->value, kv->value.type == CART_GGUF_ARRAY);
        /* keys with a NUL or longer than the buffer cannot go through the
         * NUL-terminated lookups */
        if (kv->key.len >= sizeof key || memchr(kv->key.data, 0, (size_t)kv->key.len))
            continue;
        memcpy(key, kv->key.data, (size_t)kv->key.len);
        key[kv->key.len] = '\0';
        FUZZ_CHECK(cart_gguf_find(g, key) == &kv->value, "find('%s') is not entry %lld", key,
                   (long long)i);
        check_getters(g, key, &kv->value);
    }
    FUZZ_CHECK(cart_gguf_find(g, "\x01no such key\x01") == NULL, "find of an absent key");
}

static void walk_tensors(const cart_gguf *g, const uint8_t *base, uint64_t size) {
    int64_t n = cart_gguf_tensor_count(g);
    uint64_t align = cart_gguf_alignment(g), data_offset = cart_gguf_data_offset(g);
    FUZZ_CHECK(align > 0 && (align & (align - 1)) == 0, "alignment %llu", (unsigned long long)align);
    FUZZ_CHECK(data_offset % align == 0, "data offset %llu, alignment %llu",
               (unsigned long long)data_offset, (unsigned long long)align);
    FUZZ_CHECK(cart_gguf_tensor_at(g, n) == NULL && cart_gguf_tensor_at(g, -1) == NULL,
               "tensor_at out of range is not NULL");
    static float scratch[MAX_CONVERT];
    char name[256];
    for (int64_t i = 0; i < n; i++) {
        const cart_gguf_tensor_info *t = cart_gguf_tensor_at(g, i);
        FUZZ_CHECK(t != NULL, "tensor_at(%lld) is NULL", (long long)i);
        check_str(t->name, "tensor name");
        FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= 4, "tensor %lld has n_dims %d", (long long)i,
                   (int)t->n_dims);
        int64_t numel = 1;
        for (int d = 0; d < 4; d++) {
            FUZZ_CHECK(t->ne[d] >= 0, "ne[%d] = %lld", d, (long long)t->ne[d]);
            if (d >= t->n_dims) FUZZ_CHECK(t->ne[d] == 1, "ne[%d] = %lld past n_dims", d, (long long)t->ne[d]);
            numel *= t->ne[d]; /* the reader refused counts that overflow */
        }
        uint64_t nbytes = 0;
        FUZZ_CHECK(cart_dtype_nbytes(&nbytes, t->dtype, numel) == CART_OK && nbytes == t->nbytes,
                   "tensor %lld: %llu bytes for %lld elements of dtype %d", (long long)i,
                   (unsigned long long)t->nbytes, (long long)numel, (int)t->dtype);
        FUZZ_CHECK(t->offset % align == 0, "tensor %lld offset %llu", (long long)i,
                   (unsigned long long)t->offset);
        FUZZ_CHECK(data_offset + t->offset + t->nbytes <= size || t->nbytes == 0,
                   "tensor %lld runs past the end", (long long)i);
        if (t->nbytes > 0)
            FUZZ_CHECK((const uint8_t *)t->data == base + data_offset + t->offset,
                       "tensor %lld data pointer", (long long)i);
        fuzz_touch(t->data, t->nbytes);
        cart_dtype_info info;
        if (cart_dtype_get_info(&info, t->dtype) == CART_OK && info.can_dequantize && numel > 0) {
            int64_t k = numel < MAX_CONVERT ? numel : MAX_CONVERT;
            k -= k % info.block_size;
            if (k > 0) {
                int rc = cart_to_f32(scratch, t->dtype, t->data, k);
                FUZZ_CHECK(rc == CART_OK, "cart_to_f32 of %lld %s elements: %s", (long long)k,
                           info.name, cart_last_error());
            }
        }
        if (t->name.len < sizeof name && !memchr(t->name.data, 0, (size_t)t->name.len)) {
            memcpy(name, t->name.data, (size_t)t->name.len);
            name[t->name.len] = '\0';
            FUZZ_CHECK(cart_gguf_find_tensor(g, name) == t, "find_tensor('%s') is not tensor %lld",
                       name, (long long)i);
        }
    }
}

/* Encodes and decodes a few texts, including a piece of the input itself. */
static void exercise_tokenizer(const cart_gguf *g, const uint8_t *data, size_t size) {
    cart_tokenizer *t = NULL;
    if (cart_tokenizer_load(&t, g) != CART_OK) {
        FUZZ_CHECK(t == NULL && cart_last_error()[0] != '\0', "tokenizer_load failed without a message");
        return;
    }
    int64_t vocab = cart_tokenizer_vocab_size(t);
    FUZZ_CHECK(vocab >= 1, "vocab size %lld", (long long)vocab);
    static const char *const texts[] = {"Hello world", " <|im_start|>user\n12345 it's", "\xe2\x96\x81\xff"};
    int32_t ids[256];
    char buf[2048];
    for (int k = 0; k < 4; k++) {
        const char *s = k < 3 ? texts[k] : (const char *)data;
        int64_t len = k < 3 ? (int64_t)strlen(s) : (int64_t)(size < 64 ? size : 64);
        int64_t n = 0, m = 0;
        int rc = cart_tokenizer_encode(t, s, len, k & 1 ? 3 : 0, ids, 256, &n);
        FUZZ_CHECK(rc == CART_OK, "encode: %s", cart_last_error());
        if (n > 256) n = 256;
        for (int64_t j = 0; j < n; j++)
            FUZZ_CHECK(ids[j] >= 0 && ids[j] < vocab, "encode gave id %d of %lld", (int)ids[j],
                       (long long)vocab);
        rc = cart_tokenizer_decode(t, ids, n, 4, buf, sizeof buf, &m);
        FUZZ_CHECK(rc == CART_OK, "decode: %s", cart_last_error());
    }
    for (int32_t id = 0; id < vocab && id < 16; id++) {
        int64_t m = 0;
        cart_str text = cart_tokenizer_text(t, id);
        fuzz_touch(text.data, (uint64_t)text.len);
        cart_tokenizer_token_type(t, id);
        cart_tokenizer_is_eog(t, id);
        FUZZ_CHECK(cart_tokenizer_piece(t, id, 4, buf, sizeof buf, &m) == CART_OK, "piece %d", (int)id);
    }
    cart_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cart_gguf *g = NULL;
    FUZZ_OPEN_OR_RETURN(g, cart_gguf_open_memory(&g, data, size, "fuzz.gguf"));
    uint32_t version = cart_gguf_version(g);
    FUZZ_CHECK(version == 2 || version == 3, "version %u", (unsigned)version);
    FUZZ_CHECK(cart_gguf_file_size(g) == size, "file size %llu of %zu",
               (unsigned long long)cart_gguf_file_size(g), size);
    walk_metadata(g);
    walk_tensors(g, data, size);
    exercise_tokenizer(g, data, size);
    cart_gguf_close(g);
    return 0;
}
