/*
 * fuzz_torchpt.c - libFuzzer target for the torch.save reader
 * (engine/torchpt.h) and, beneath it, the zip reader (engine/zip.h).
 *
 * Each input is a whole .pt file, opened with cart_pt_open_memory. When it
 * opens, the target walks every value reachable from the root (depth- and
 * count-bounded: lists may contain themselves), checks what the accessors
 * promise (kinds in range, strings NUL-terminated, dict keys and values
 * paired), and reads every tensor that torchpt.h says it checked against its
 * storage, converting float ones to f32, so that ASan sees any element read
 * outside the archive. It also walks the zip's entries and touches each one.
 *
 * An input whose first byte is odd is a pickle alone: the rest becomes
 * t/data.pkl of an archive built here around it, with storages t/data/0 (16
 * floats) and t/data/1 (8 bf16), and no CRCs (0: none recorded), so that
 * mutations reach the pickle machine rather than fail the zip's checks.
 */
#include <string.h>

#include "common.h"
#include "dtype.h"
#include "torchpt.h"
#include "zip.h"
#include "fuzz_common.h"

enum { MAX_VISITS = 4096, MAX_DEPTH = 32, MAX_FLOATS = 1 << 16 };

static int visits;

static void check_tensor(const cart_pk_value *v) {
    cart_pt_tensor t;
    FUZZ_CHECK(cart_pk_tensor(v, &t) == CART_OK, "a TENSOR value is not a tensor");
    FUZZ_CHECK(t.ndim >= 0 && t.ndim <= 8 && t.numel >= 0, "tensor ndim %d numel %lld", t.ndim, (long long)t.numel);
    FUZZ_CHECK(cart_dtype_name(t.dtype) != NULL, "tensor dtype %d", t.dtype);
    if (t.numel > MAX_FLOATS) return;
    static float buf[MAX_FLOATS];
    int rc = cart_pt_tensor_f32(v, buf, t.numel);
    int floating = t.dtype == CART_F32 || t.dtype == CART_F16 || t.dtype == CART_BF16 || t.dtype == CART_F64;
    FUZZ_CHECK(floating ? rc == CART_OK : rc == CART_E_UNSUPPORTED, "tensor_f32 of a %s gave %d",
               cart_dtype_name(t.dtype), rc);
    if (floating && t.numel) fuzz_touch(buf, (uint64_t)t.numel * sizeof(float));
}

static void walk(const cart_pk_value *v, int depth) {
    if (!v || ++visits > MAX_VISITS || depth > MAX_DEPTH) return;
    int32_t kind = cart_pk_kind_of(v);
    FUZZ_CHECK(kind >= CART_PK_NONE && kind <= CART_PK_STORAGE, "kind %d", kind);
    int64_t len = 0;
    const char *s = cart_pk_str(v, &len);
    if (s) {
        fuzz_touch(s, (uint64_t)len + 1);
        FUZZ_CHECK(s[len] == '\0', "a string is not NUL-terminated");
    }
    if (kind == CART_PK_TENSOR) check_tensor(v);
    if (kind == CART_PK_OBJECT || kind == CART_PK_GLOBAL) {
        const char *c = cart_pk_class(v);
        FUZZ_CHECK(c && strchr(c, '.'), "a class without a module");
        walk(cart_pk_state(v), depth + 1);
    }
    int64_t n = cart_pk_len(v);
    FUZZ_CHECK(n >= 0, "length %lld", (long long)n);
    for (int64_t i = 0; i < n && visits <= MAX_VISITS; i++) {
        const cart_pk_value *item = cart_pk_item(v, i);
        FUZZ_CHECK(item != NULL, "item %lld of %lld is NULL", (long long)i, (long long)n);
        if (kind == CART_PK_DICT) {
            const cart_pk_value *key = cart_pk_key(v, i);
            FUZZ_CHECK(key != NULL, "dict key %lld is NULL", (long long)i);
            int64_t klen = 0;
            const char *k = cart_pk_str(key, &klen);
            if (cart_pk_kind_of(key) == CART_PK_STR && strlen(k) == (size_t)klen)
                FUZZ_CHECK(cart_pk_get(v, k) != NULL, "str key '%s' not found by get", k);
            walk(key, depth + 1);
        }
        walk(item, depth + 1);
    }
    FUZZ_CHECK(cart_pk_item(v, n) == NULL && cart_pk_item(v, -1) == NULL, "item out of range is not NULL");
}

static uint8_t wrapped[1 << 16];

static void put(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A stored zip of the three entries, CRCs 0; its size (0: too big). */
static size_t wrap_pickle(const uint8_t *pkl, size_t n) {
    static const uint8_t storage[64 + 16] = {0x3f, 0x80, 0, 0, 0, 0, 0x80, 0x3f};
    const char *names[3] = {"t/data.pkl", "t/data/0", "t/data/1"};
    const uint8_t *datas[3] = {pkl, storage, storage + 64};
    size_t sizes[3] = {n, 64, 16}, at = 0, offsets[3];
    if (n > sizeof wrapped - 1024) return 0;
    for (int i = 0; i < 3; i++) {
        size_t name_len = strlen(names[i]);
        offsets[i] = at;
        memset(wrapped + at, 0, 30);
        put(wrapped + at, 0x04034b50, 4), put(wrapped + at + 18, sizes[i], 4), put(wrapped + at + 22, sizes[i], 4);
        put(wrapped + at + 26, name_len, 2);
        memcpy(wrapped + at + 30, names[i], name_len);
        memcpy(wrapped + at + 30 + name_len, datas[i], sizes[i]);
        at += 30 + name_len + sizes[i];
    }
    size_t dir = at;
    for (int i = 0; i < 3; i++) {
        size_t name_len = strlen(names[i]);
        memset(wrapped + at, 0, 46);
        put(wrapped + at, 0x02014b50, 4), put(wrapped + at + 20, sizes[i], 4), put(wrapped + at + 24, sizes[i], 4);
        put(wrapped + at + 28, name_len, 2), put(wrapped + at + 42, offsets[i], 4);
        memcpy(wrapped + at + 46, names[i], name_len);
        at += 46 + name_len;
    }
    memset(wrapped + at, 0, 22);
    put(wrapped + at, 0x06054b50, 4), put(wrapped + at + 8, 3, 2), put(wrapped + at + 10, 3, 2);
    put(wrapped + at + 12, at - dir, 4), put(wrapped + at + 16, dir, 4);
    return at + 22;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && (data[0] & 1)) {
        size = wrap_pickle(data + 1, size - 1);
        if (!size) return 0;
        data = wrapped;
    }
    cart_pt *pt = NULL;
    FUZZ_OPEN_OR_RETURN(pt, cart_pt_open_memory(&pt, data, size, "fuzz.pt"));
    const char *archive = cart_pt_archive(pt);
    FUZZ_CHECK(archive && archive[0] && !strchr(archive, '/'), "archive name '%s'", archive ? archive : "(null)");
    visits = 0;
    walk(cart_pt_root(pt), 0);
    cart_pt_close(pt);
    cart_zip *z = NULL;
    FUZZ_CHECK(cart_zip_open_memory(&z, data, size, "fuzz.pt") == CART_OK, "the zip of an opened .pt fails");
    for (int64_t i = 0; i < cart_zip_count(z); i++) {
        const cart_zip_entry *e = cart_zip_entry_at(z, i);
        FUZZ_CHECK(e->data >= data && e->data + e->size <= data + size, "entry %s outside the input", e->name);
        fuzz_touch(e->data, e->size);
        FUZZ_CHECK(cart_zip_find(z, e->name) != NULL, "entry %s not found by name", e->name);
    }
    cart_zip_close(z);
    return 0;
}
