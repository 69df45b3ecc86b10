/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors reader
 * (engine/safetensors.h).
 *
 * Each input is a whole .safetensors file, opened with cart_st_open_memory.
 * When it opens, the target checks what safetensors.h promises after its
 * strict validation: the tensors tile the data blob contiguously from 0 in
 * the order the reader lists them, each holds shape x element size bytes of a
 * known dtype, names and metadata are NUL-terminated copies that the lookups
 * find again, and every byte of every tensor can be read (and a bounded
 * prefix converted to f32).
 */
#include <string.h>

#include "common.h"
#include "dtype.h"
#include "safetensors.h"
#include "fuzz_common.h"

enum { MAX_CONVERT = 512 };

static void check_cstr(cart_str s, const char *what) {
    FUZZ_CHECK(s.data != NULL, "%s: NULL data, length %llu", what, (unsigned long long)s.len);
    fuzz_touch(s.data, (uint64_t)s.len + 1);
    FUZZ_CHECK(s.data[s.len] == '\0', "%s is not NUL-terminated", what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cart_st_file *f = NULL;
    FUZZ_OPEN_OR_RETURN(f, cart_st_open_memory(&f, data, size, "fuzz.safetensors"));
    uint64_t header = cart_st_header_size(f);
    FUZZ_CHECK(header <= size - 8, "header of %llu bytes in a %zu-byte file",
               (unsigned long long)header, size);
    const uint8_t *blob = data + 8 + header;
    uint64_t blob_size = size - 8 - header, next = 0;
    int64_t n = cart_st_tensor_count(f);
    FUZZ_CHECK(n >= 0, "tensor count %lld", (long long)n);
    FUZZ_CHECK(cart_st_tensor_at(f, n) == NULL && cart_st_tensor_at(f, -1) == NULL,
               "tensor_at out of range is not NULL");
    static float scratch[MAX_CONVERT];
    for (int64_t i = 0; i < n; i++) {
        const cart_st_tensor *t = cart_st_tensor_at(f, i);
        FUZZ_CHECK(t != NULL, "tensor_at(%lld) is NULL", (long long)i);
        check_cstr(t->name, "tensor name");
        FUZZ_CHECK(cart_st_dtype_name(t->dtype) != NULL, "tensor %lld has dtype %d", (long long)i,
                   (int)t->dtype);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= 8, "tensor %lld has ndim %d", (long long)i,
                   (int)t->ndim);
        int64_t numel = 1;
        for (int d = 0; d < 8; d++) {
            FUZZ_CHECK(t->shape[d] >= 0, "shape[%d] = %lld", d, (long long)t->shape[d]);
            if (d >= t->ndim) FUZZ_CHECK(t->shape[d] == 1, "shape[%d] past ndim", d);
        }
        uint64_t want = 0;
        int zero = 0;
        for (int d = 0; d < t->ndim; d++) zero |= t->shape[d] == 0;
        if (!zero)
            for (int d = 0; d < t->ndim; d++) numel *= t->shape[d]; /* bytes exist for all of them */
        else
            numel = 0;
        FUZZ_CHECK(cart_dtype_nbytes(&want, t->dtype, numel) == CART_OK && want == t->nbytes,
                   "tensor %lld: %llu bytes for %lld elements", (long long)i,
                   (unsigned long long)t->nbytes, (long long)numel);
        FUZZ_CHECK(t->offset == next, "tensor %lld starts at %llu, the one before ends at %llu",
                   (long long)i, (unsigned long long)t->offset, (unsigned long long)next);
        next = t->offset + t->nbytes;
        FUZZ_CHECK(next <= blob_size, "tensor %lld ends at %llu of a %llu-byte blob", (long long)i,
                   (unsigned long long)next, (unsigned long long)blob_size);
        if (t->nbytes > 0) {
            FUZZ_CHECK((const uint8_t *)t->data == blob + t->offset, "tensor %lld data pointer",
                       (long long)i);
            fuzz_touch(t->data, t->nbytes);
            int64_t k = numel < MAX_CONVERT ? numel : MAX_CONVERT;
            int rc = cart_to_f32(scratch, t->dtype, t->data, k);
            FUZZ_CHECK(rc == CART_OK || rc == CART_E_UNSUPPORTED, "cart_to_f32: %s", cart_last_error());
        }
        if ((size_t)t->name.len == strlen(t->name.data))
            FUZZ_CHECK(cart_st_find(f, t->name.data) == t, "find('%s') is not tensor %lld",
                       t->name.data, (long long)i);
    }
    FUZZ_CHECK(next == blob_size, "the tensors cover %llu of the blob's %llu bytes",
               (unsigned long long)next, (unsigned long long)blob_size);
    FUZZ_CHECK(cart_st_find(f, "\x01no such tensor") == NULL, "find of an absent name");

    int64_t m = cart_st_meta_count(f);
    FUZZ_CHECK(m >= 0 && cart_st_meta_at(f, m) == NULL && cart_st_meta_at(f, -1) == NULL,
               "meta_count %lld / meta_at out of range", (long long)m);
    for (int64_t i = 0; i < m; i++) {
        const cart_st_meta *e = cart_st_meta_at(f, i);
        FUZZ_CHECK(e != NULL, "meta_at(%lld) is NULL", (long long)i);
        check_cstr(e->key, "metadata key");
        check_cstr(e->value, "metadata value");
        if ((size_t)e->key.len == strlen(e->key.data)) {
            const cart_str *v = cart_st_meta_get(f, e->key.data);
            FUZZ_CHECK(v && v->data == e->value.data, "meta_get('%s') is not entry %lld",
                       e->key.data, (long long)i);
        }
    }
    FUZZ_CHECK(cart_st_path(f) != NULL, "path is NULL");
    cart_st_close(f);
    return 0;
}
