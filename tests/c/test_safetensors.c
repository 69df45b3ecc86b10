/*
 * test_safetensors.c - the .safetensors reader and writer: round trips, the
 * exact bytes the writer produces, files other writers produce, and every
 * kind of malformed file failing cleanly with a message naming the field.
 */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"
#include "test_files.h"
#include "dtype.h"
#include "safetensors.h"

static int write_all(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = fwrite(data, 1, n, fp);
    return fclose(fp) == 0 && w == n ? 0 : -1;
}

/* Files in tmp_dir whose name contains `part`. */
static int count_files_containing(const char *part) {
    DIR *d = opendir(tmp_dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, part)) n++;
    closedir(d);
    return n;
}

/* A file as another implementation would write it: the 8-byte length of
 * `header`, the header as given, then blob_len bytes of blob (zeros when
 * blob is NULL). Exactly *size bytes, malloc'd. */
static uint8_t *make_file(const char *header, const void *blob, size_t blob_len, size_t *size) {
    size_t n = strlen(header);
    *size = 8 + n + blob_len;
    uint8_t *buf = calloc(1, *size);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, n);
    if (blob) memcpy(buf + 8 + n, blob, blob_len);
    return buf;
}

/* Opens header + blob from memory and closes it again; returns the status. */
static int open_hdr(const char *header, size_t blob_len) {
    size_t size;
    uint8_t *buf = make_file(header, NULL, blob_len, &size);
    cart_st_file *f = NULL;
    int rc = cart_st_open_memory(&f, buf, size, "bad.safetensors");
    cart_st_close(f);
    free(buf);
    return rc;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng_next(void) { /* xorshift64*, seeded per test */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * UINT64_C(2685821657736338717);
}

static void fill_random(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rng_next() >> 56);
}

/* ---- round trips -------------------------------------------------------- */

typedef struct spec {
    const char *name;
    int32_t dtype;
    int32_t ndim;
    int64_t shape[8];
    size_t nbytes;
} spec;

static const spec round_trip_specs[] = {
    {"f32.2d", CART_F32, 2, {2, 3}, 24},      {"f16.1d", CART_F16, 1, {5}, 10},
    {"bf16.3d", CART_BF16, 3, {2, 1, 3}, 12}, {"f64.scalar", CART_F64, 0, {0}, 8},
    {"i64.1d", CART_I64, 1, {3}, 24},         {"i32.4d", CART_I32, 4, {2, 1, 2, 2}, 32},
    {"i16.2d", CART_I16, 2, {3, 2}, 12},      {"i8.1d", CART_I8, 1, {7}, 7},
    {"u8.3d", CART_U8, 3, {1, 2, 3}, 6},      {"bool.1d", CART_BOOL, 1, {4}, 4},
    {"empty.f32", CART_F32, 2, {0, 5}, 0},
};
enum { N_SPECS = sizeof round_trip_specs / sizeof round_trip_specs[0] };

static void check_round_trip(const cart_st_file *f, uint8_t *const data[N_SPECS]) {
    CHECK(cart_st_tensor_count(f) == N_SPECS);
    for (int i = 0; i < N_SPECS; i++) {
        const spec *s = &round_trip_specs[i];
        const cart_st_tensor *t = cart_st_find(f, s->name);
        CHECK_MSG(t != NULL, "tensor %s missing", s->name);
        if (!t) continue;
        CHECK(t->name.len == strlen(s->name) && memcmp(t->name.data, s->name, t->name.len) == 0);
        CHECK(t->name.data[t->name.len] == '\0');
        CHECK_MSG(t->dtype == s->dtype, "%s: dtype %d", s->name, t->dtype);
        CHECK_MSG(t->ndim == s->ndim, "%s: ndim %d", s->name, t->ndim);
        for (int d = 0; d < 8; d++)
            CHECK_MSG(t->shape[d] == (d < s->ndim ? s->shape[d] : 1), "%s: shape[%d] = %lld",
                      s->name, d, (long long)t->shape[d]);
        CHECK_MSG(t->nbytes == s->nbytes, "%s: nbytes %llu", s->name,
                  (unsigned long long)t->nbytes);
        CHECK_MSG(s->nbytes == 0 || memcmp(t->data, data[i], s->nbytes) == 0, "%s: bytes differ",
                  s->name);
    }
    /* Blob order: contiguous from 0, each tensor aligned to its element size. */
    uint64_t at = 0;
    for (int64_t i = 0; i < cart_st_tensor_count(f); i++) {
        const cart_st_tensor *t = cart_st_tensor_at(f, i);
        cart_dtype_info info;
        CHECK_OK(cart_dtype_get_info(&info, t->dtype));
        CHECK_MSG(t->offset == at, "%s at %llu, expected %llu", t->name.data,
                  (unsigned long long)t->offset, (unsigned long long)at);
        CHECK_MSG(t->offset % (uint64_t)info.type_size == 0, "%s misaligned", t->name.data);
        at += t->nbytes;
    }
    CHECK((8 + cart_st_header_size(f)) % 8 == 0);
    CHECK(cart_st_meta_count(f) == 2);
    const cart_st_meta *m0 = cart_st_meta_at(f, 0), *m1 = cart_st_meta_at(f, 1);
    CHECK(m0 && strcmp(m0->key.data, "format") == 0 && strcmp(m0->value.data, "pt") == 0);
    const char *note = "quote \" backslash \\ newline \n tab \t bell \x07 caf\xc3\xa9 \xe2\x82\xac";
    CHECK(m1 && strcmp(m1->key.data, "note") == 0 && m1->value.len == strlen(note) &&
          strcmp(m1->value.data, note) == 0);
    const cart_str *v = cart_st_meta_get(f, "format");
    CHECK(v && v->len == 2 && memcmp(v->data, "pt", 2) == 0);
    CHECK(cart_st_meta_get(f, "absent") == NULL);
    CHECK(cart_st_find(f, "absent") == NULL);
    CHECK(cart_st_tensor_at(f, -1) == NULL);
    CHECK(cart_st_tensor_at(f, N_SPECS) == NULL);
    CHECK(cart_st_meta_at(f, 2) == NULL);
}

static void test_round_trips_every_dtype_and_rank_with_metadata(void) {
    rng_state = 1;
    uint8_t *data[N_SPECS];
    cart_st_writer *w = NULL;
    CHECK_OK(cart_st_writer_new(&w));
    CHECK_OK(cart_st_writer_set_meta(w, "format", "tf"));
    CHECK_OK(cart_st_writer_set_meta(
        w, "note", "quote \" backslash \\ newline \n tab \t bell \x07 caf\xc3\xa9 \xe2\x82\xac"));
    CHECK_OK(cart_st_writer_set_meta(w, "format", "pt")); /* replaces, keeps its place */
    for (int i = 0; i < N_SPECS; i++) {
        const spec *s = &round_trip_specs[i];
        data[i] = malloc(s->nbytes ? s->nbytes : 1);
        fill_random(data[i], s->nbytes);
        CHECK_OK(cart_st_writer_add(w, s->name, s->dtype, s->ndim, s->shape,
                                    s->nbytes ? data[i] : NULL));
    }
    char path[512];
    tmp_path(path, sizeof path, "round.safetensors");
    CHECK_OK(cart_st_writer_write(w, path));
    cart_st_writer_free(w);

    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open(&f, path));
    if (f) {
        CHECK(strcmp(cart_st_path(f), path) == 0);
        check_round_trip(f, data);
    }
    cart_st_close(f);

    size_t size;
    uint8_t *bytes = read_all(path, &size);
    CHECK(bytes != NULL);
    f = NULL;
    CHECK_OK(cart_st_open_memory(&f, bytes, size, "in-memory"));
    if (f) {
        CHECK(strcmp(cart_st_path(f), "in-memory") == 0);
        check_round_trip(f, data);
    }
    cart_st_close(f);
    free(bytes);
    for (int i = 0; i < N_SPECS; i++) free(data[i]);
}

static void test_sorts_by_dtype_as_hugging_face_does_then_by_name(void) {
    static const char *f32_names[] = {"layers.10.k", "layers.0.v", "layers.1.k", "layers.0.k_sink",
                                      "layers.0.k"};
    static const uint8_t zeros[64];
    int64_t one = 1;
    cart_st_writer *w = NULL;
    CHECK_OK(cart_st_writer_new(&w));
    CHECK_OK(cart_st_writer_add(w, "mask", CART_BOOL, 1, &one, zeros));
    for (int i = 0; i < 5; i++)
        CHECK_OK(cart_st_writer_add(w, f32_names[i], CART_F32, 1, &one, zeros));
    CHECK_OK(cart_st_writer_add(w, "b16", CART_BF16, 1, &one, zeros));
    CHECK_OK(cart_st_writer_add(w, "pos", CART_I64, 1, &one, zeros));
    CHECK_OK(cart_st_writer_add(w, "a.f64", CART_F64, 1, &one, zeros));
    CHECK_OK(cart_st_writer_add(w, "a.i32", CART_I32, 1, &one, zeros));
    CHECK_OK(cart_st_writer_add(w, "a.u8", CART_U8, 1, &one, zeros));
    CHECK_OK(cart_st_writer_add(w, "z.i8", CART_I8, 1, &one, zeros));
    CHECK_OK(cart_st_writer_add(w, "a.i16", CART_I16, 1, &one, zeros));
    CHECK_OK(cart_st_writer_add(w, "a.f16", CART_F16, 1, &one, zeros));
    char path[512];
    tmp_path(path, sizeof path, "sorted.safetensors");
    CHECK_OK(cart_st_writer_write(w, path));
    cart_st_writer_free(w);

    /* The crate's Dtype order, descending: I64 F64 F32 I32 BF16 F16 I16 I8 U8
     * BOOL; so same-size dtypes stay apart ("pos" before "a.f64", F32 before
     * "a.i32") and names sort bytewise only within one dtype. */
    static const char *expected[] = {"pos",        "a.f64",      "layers.0.k",  "layers.0.k_sink",
                                     "layers.0.v", "layers.1.k", "layers.10.k", "a.i32",
                                     "b16",        "a.f16",      "a.i16",       "z.i8",
                                     "a.u8",       "mask"};
    enum { N_EXPECTED = sizeof expected / sizeof expected[0] };
    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open(&f, path));
    CHECK(cart_st_tensor_count(f) == N_EXPECTED);
    for (int64_t i = 0; i < cart_st_tensor_count(f) && i < N_EXPECTED; i++) {
        const cart_st_tensor *t = cart_st_tensor_at(f, i);
        CHECK_MSG(strcmp(t->name.data, expected[i]) == 0, "position %lld: %s, expected %s",
                  (long long)i, t->name.data, expected[i]);
    }
    cart_st_close(f);
}

static void test_pads_the_header_so_the_data_starts_at_a_multiple_of_8(void) {
    /* Names of 1..16 characters walk the header length through every residue. */
    char name[32];
    float x = 1.0f;
    for (int len = 1; len <= 16; len++) {
        memset(name, 'n', (size_t)len);
        name[len] = '\0';
        cart_st_writer *w = NULL;
        CHECK_OK(cart_st_writer_new(&w));
        CHECK_OK(cart_st_writer_add(w, name, CART_F32, 0, NULL, &x));
        char path[512];
        tmp_path(path, sizeof path, "pad.safetensors");
        CHECK_OK(cart_st_writer_write(w, path));
        cart_st_writer_free(w);
        size_t size;
        uint8_t *bytes = read_all(path, &size);
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = (n << 8) | bytes[i];
        CHECK_MSG((8 + n) % 8 == 0, "name length %d: header length %llu", len,
                  (unsigned long long)n);
        CHECK(size == 8 + n + 4);
        CHECK(bytes[8 + n - 1] == ' ' || bytes[8 + n - 1] == '}');
        free(bytes);
    }
    /* No tensors, no metadata: "{}" and six spaces. */
    cart_st_writer *w = NULL;
    CHECK_OK(cart_st_writer_new(&w));
    char path[512];
    tmp_path(path, sizeof path, "nothing.safetensors");
    CHECK_OK(cart_st_writer_write(w, path));
    cart_st_writer_free(w);
    size_t size;
    uint8_t *bytes = read_all(path, &size);
    CHECK(size == 16 && memcmp(bytes, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
    free(bytes);
    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open(&f, path));
    CHECK(cart_st_tensor_count(f) == 0 && cart_st_meta_count(f) == 0);
    CHECK(cart_st_header_size(f) == 8);
    cart_st_close(f);
}

/* Writes what w holds and compares with `expected` (size bytes). */
static void check_written_bytes(cart_st_writer *w, const char *expected, size_t size) {
    char path[512];
    tmp_path(path, sizeof path, "compare.safetensors");
    CHECK_OK(cart_st_writer_write(w, path));
    size_t got = 0;
    uint8_t *bytes = read_all(path, &got);
    CHECK_MSG(bytes && got == size, "size %zu, expected %zu", got, size);
    if (bytes && got == size) {
        size_t first = 0;
        while (first < size && bytes[first] == (uint8_t)expected[first]) first++;
        CHECK_MSG(first == size, "first difference at byte %zu", first);
    }
    free(bytes);
}

/* The checksum: every one-bit change of the bytes changes it, any split of
 * the blob into tensors gives the same sum, a written file verifies, a
 * changed byte is refused naming the file, and a file without one says so. */
static void test_checksums_the_data_and_detects_every_bit_flip(void) {
    uint8_t buf[100];
    for (int i = 0; i < 100; i++) buf[i] = (uint8_t)(i * 37 + 11);
    char base[22], sum[22];
    cart_st_checksum(buf, sizeof buf, base);
    CHECK(strncmp(base, "cs64:", 5) == 0 && strlen(base) == 21);
    int same = 0;
    for (int bitno = 0; bitno < 800; bitno++) {
        buf[bitno / 8] ^= (uint8_t)(1u << (bitno % 8));
        cart_st_checksum(buf, sizeof buf, sum);
        same += strcmp(sum, base) == 0;
        buf[bitno / 8] ^= (uint8_t)(1u << (bitno % 8));
    }
    CHECK_MSG(same == 0, "%d of 800 one-bit changes kept the sum", same);
    cart_st_checksum(buf, 99, sum);
    CHECK(strcmp(sum, base) != 0); /* the length counts */
    /* written in three tensors of odd sizes: the sum of the blob as one */
    float a[7], b[13];
    uint8_t c[3] = {1, 2, 3};
    for (int i = 0; i < 7; i++) a[i] = (float)i * 0.5f;
    for (int i = 0; i < 13; i++) b[i] = (float)i - 3.0f;
    cart_st_writer *w = NULL;
    CHECK_OK(cart_st_writer_new(&w));
    int64_t s7 = 7, s13 = 13, s3 = 3;
    CHECK_OK(cart_st_writer_add(w, "a", CART_F32, 1, &s7, a));
    CHECK_OK(cart_st_writer_add(w, "b", CART_F32, 1, &s13, b));
    CHECK_OK(cart_st_writer_add(w, "c", CART_U8, 1, &s3, c));
    cart_st_writer_add_checksum(w);
    char path[512];
    tmp_path(path, sizeof path, "sum.safetensors");
    CHECK_OK(cart_st_writer_write(w, path));
    cart_st_writer_free(w);
    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open(&f, path));
    CHECK_OK(cart_st_verify_checksum(f));
    uint64_t at = 8 + cart_st_header_size(f);
    const cart_str *stored = cart_st_meta_get(f, "cartridge.checksum");
    size_t size = 0;
    uint8_t *bytes = read_all(path, &size);
    cart_st_checksum(bytes + at, size - at, sum);
    CHECK(stored && stored->len == 21 && memcmp(stored->data, sum, 21) == 0);
    cart_st_close(f);
    bytes[size - 1] ^= 0x40;
    CHECK_OK(cart_st_open_memory(&f, bytes, size, "flipped.safetensors"));
    CHECK_ERR(cart_st_verify_checksum(f), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("flipped.safetensors: the tensor bytes do not match the file's checksum");
    printf("  %s\n", cart_last_error());
    cart_st_close(f);
    free(bytes);
    /* a file written without one */
    CHECK_OK(cart_st_writer_new(&w));
    CHECK_OK(cart_st_writer_add(w, "c", CART_U8, 1, &s3, c));
    CHECK_OK(cart_st_writer_write(w, path));
    cart_st_writer_free(w);
    CHECK_OK(cart_st_open(&f, path));
    CHECK_ERR(cart_st_verify_checksum(f), CART_E_NOT_FOUND);
    cart_st_close(f);
    printf("  800 one-bit changes of 100 bytes: %d kept the sum\n", same);
}

static void test_writes_exactly_the_expected_bytes_for_a_fixed_input(void) {
    /* Header: 227 bytes of JSON + 5 spaces = 232 (0xe8); 8 + 232 = 240. Data:
     * a = int64 7, b = float32 {1, 2}, c"d = uint8 {1, 2, 3}. */
    static const char expected[] =
        "\xe8\x00\x00\x00\x00\x00\x00\x00"
        "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"q\\\"b\\\\n\\u000at\\u0001\xc3\xa9\"},"
        "\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
        "\"c\\\"d\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]}}"
        "     "
        "\x07\x00\x00\x00\x00\x00\x00\x00"
        "\x00\x00\x80\x3f\x00\x00\x00\x40"
        "\x01\x02\x03";
    const size_t expected_size = sizeof expected - 1;
    CHECK(expected_size == 8 + 232 + 19);

    int64_t a = 7;
    float b[2] = {1.0f, 2.0f};
    uint8_t c[3] = {1, 2, 3};
    int64_t shape2 = 2, shape3 = 3;
    cart_st_writer *w = NULL;
    CHECK_OK(cart_st_writer_new(&w));
    CHECK_OK(cart_st_writer_set_meta(w, "format", "pt"));
    CHECK_OK(cart_st_writer_set_meta(w, "note", "q\"b\\n\nt\x01\xc3\xa9"));
    CHECK_OK(cart_st_writer_add(w, "c\"d", CART_U8, 1, &shape3, c));
    CHECK_OK(cart_st_writer_add(w, "b", CART_F32, 1, &shape2, b));
    CHECK_OK(cart_st_writer_add(w, "a", CART_I64, 0, NULL, &a));
    check_written_bytes(w, expected, expected_size);
    cart_st_writer_free(w);

    char path[512];
    tmp_path(path, sizeof path, "compare.safetensors");
    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open(&f, path));
    const cart_st_tensor *t = cart_st_find(f, "c\"d");
    CHECK(t && t->nbytes == 3 && memcmp(t->data, c, 3) == 0);
    const cart_str *note = cart_st_meta_get(f, "note");
    CHECK(note && strcmp(note->data, "q\"b\\n\nt\x01\xc3\xa9") == 0);
    cart_st_close(f);
}

static void test_matches_the_hugging_face_writer_on_its_published_examples(void) {
    /* The byte vectors of the reference crate's serialization tests. */
    static const float data[6] = {0, 1, 2, 3, 4, 5};
    static const char attn_dot_0[] = /* header exactly 64 bytes: no padding */
        "\x40\x00\x00\x00\x00\x00\x00\x00"
        "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}"
        "\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40"
        "\x00\x00\x40\x40\x00\x00\x80\x40\x00\x00\xa0\x40";
    static const char attn0[] = /* 65 bytes + 7 spaces */
        "\x48\x00\x00\x00\x00\x00\x00\x00"
        "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       "
        "\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40"
        "\x00\x00\x40\x40\x00\x00\x80\x40\x00\x00\xa0\x40";
    static const char framework[] = /* metadata only: 35 bytes + 5 spaces */
        "\x28\x00\x00\x00\x00\x00\x00\x00"
        "{\"__metadata__\":{\"framework\":\"pt\"}}     ";
    int64_t s123[3] = {1, 2, 3}, s1123[4] = {1, 1, 2, 3};
    cart_st_writer *w = NULL;
    CHECK_OK(cart_st_writer_new(&w));
    CHECK_OK(cart_st_writer_add(w, "attn.0", CART_F32, 3, s123, data));
    check_written_bytes(w, attn_dot_0, sizeof attn_dot_0 - 1);
    cart_st_writer_free(w);
    CHECK_OK(cart_st_writer_new(&w));
    CHECK_OK(cart_st_writer_add(w, "attn0", CART_F32, 4, s1123, data));
    check_written_bytes(w, attn0, sizeof attn0 - 1);
    cart_st_writer_free(w);
    CHECK_OK(cart_st_writer_new(&w));
    CHECK_OK(cart_st_writer_set_meta(w, "framework", "pt"));
    check_written_bytes(w, framework, sizeof framework - 1);
    cart_st_writer_free(w);
}

static void test_reads_a_file_written_by_another_implementation(void) {
    /* No padding, keys in another order, metadata in the middle, JSON
     * whitespace, an escaped name, and offsets listed out of blob order. */
    const char *header =
        "{ \"w\" : {\"shape\": [2], \"data_offsets\": [4, 12], \"dtype\": \"F32\"},\n"
        "  \"__metadata__\": {\"k\": \"v\", \"empty\": \"\"},\n"
        "  \"s\\u00e9\\n\": {\"data_offsets\": [0, 4], \"dtype\": \"I32\", "
        "\"shape\": []}}";
    uint8_t blob[12];
    int32_t s = 42;
    float wv[2] = {1.5f, -2.0f};
    memcpy(blob, &s, 4);
    memcpy(blob + 4, wv, 8);
    size_t size;
    uint8_t *bytes = make_file(header, blob, sizeof blob, &size);
    CHECK((8 + strlen(header)) % 8 != 0); /* really unpadded */
    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open_memory(&f, bytes, size, "other.safetensors"));
    CHECK(cart_st_header_size(f) == strlen(header));
    CHECK(cart_st_tensor_count(f) == 2);
    const cart_st_tensor *t0 = cart_st_tensor_at(f, 0), *t1 = cart_st_tensor_at(f, 1);
    CHECK(t0 && strcmp(t0->name.data, "s\xc3\xa9\n") == 0 && t0->name.len == 4);
    CHECK(t0 && t0->dtype == CART_I32 && t0->ndim == 0 && t0->offset == 0 && t0->nbytes == 4);
    CHECK(t1 && strcmp(t1->name.data, "w") == 0 && t1->dtype == CART_F32 && t1->ndim == 1 &&
          t1->shape[0] == 2 && t1->shape[1] == 1 && t1->offset == 4 && t1->nbytes == 8);
    if (t0 && t1) {
        int32_t s2;
        float w2[2];
        memcpy(&s2, t0->data, 4);
        memcpy(w2, t1->data, 8);
        CHECK(s2 == 42 && w2[0] == 1.5f && w2[1] == -2.0f);
        CHECK((const uint8_t *)t0->data == bytes + 8 + strlen(header));
    }
    CHECK(cart_st_find(f, "w") == t1 && cart_st_find(f, "s\xc3\xa9\n") == t0);
    CHECK(cart_st_meta_count(f) == 2);
    const cart_str *e = cart_st_meta_get(f, "empty");
    CHECK(e && e->len == 0 && e->data[0] == '\0');
    cart_st_close(f);
    free(bytes);

    /* Hugging Face style: space padding after the object. */
    CHECK_OK(
        open_hdr("{\"x\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}        ", 3));
}

static void test_accepts_zero_size_tensors_anywhere_in_the_blob(void) {
    CHECK_OK(open_hdr("{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                      "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                      "\"m\":{\"dtype\":\"I64\",\"shape\":[3,0,2],\"data_offsets\":[2,2]},"
                      "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]},"
                      "\"e\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[3,3]}}",
                      3));
    CHECK_OK(open_hdr("{}", 0));
    CHECK_OK(open_hdr("{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0));
    /* A zero dim makes any other dims harmless, however large. */
    CHECK_OK(open_hdr("{\"z\":{\"dtype\":\"F64\",\"shape\":[9007199254740992,9007199254740992,0],"
                      "\"data_offsets\":[0,0]}}",
                      0));
}

/* ---- bad input ----------------------------------------------------------- */

static void test_rejects_files_shorter_than_the_length_prefix(void) {
    uint8_t bytes[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    for (size_t n = 0; n < 8; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, bytes, n);
        cart_st_file *f = NULL;
        CHECK_ERR(cart_st_open_memory(&f, n ? copy : NULL, n, "short.safetensors"), CART_E_FORMAT);
        CHECK_ERROR_MENTIONS("short.safetensors");
        CHECK_ERROR_MENTIONS("shorter than the 8-byte header length");
        CHECK(f == NULL);
        free(copy);
    }
    char path[512];
    tmp_path(path, sizeof path, "empty.safetensors");
    CHECK(write_all(path, "", 0) == 0);
    cart_st_file *f = NULL;
    CHECK_ERR(cart_st_open(&f, path), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("empty.safetensors");
}

static void test_rejects_header_lengths_out_of_range(void) {
    uint8_t buf[64];
    memset(buf, ' ', sizeof buf);
    memcpy(buf + 8, "{}", 2);
    const struct {
        uint64_t n;
        const char *mention;
    } cases[] = {
        {0, "header length 0"},
        {1, "header length 1"},
        {UINT64_C(1) << 63, "header length 9223372036854775808"},
        {UINT64_MAX, "exceeds the limit"},
        {100000001, "exceeds the limit"},
        {57, "runs past the end of the file"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(cases[c].n >> (8 * i));
        cart_st_file *f = NULL;
        CHECK_ERR(cart_st_open_memory(&f, buf, sizeof buf, "len.safetensors"), CART_E_FORMAT);
        CHECK_ERROR_MENTIONS(cases[c].mention);
        CHECK_ERROR_MENTIONS("len.safetensors");
    }
    /* 56 is the whole rest of the file: "{}" and 54 spaces, valid. */
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(UINT64_C(56) >> (8 * i));
    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open_memory(&f, buf, sizeof buf, "len.safetensors"));
    cart_st_close(f);
}

/* A small valid file from the writer, as bytes. */
static uint8_t *small_valid_file(size_t *size) {
    static const float a[6] = {1, 2, 3, 4, 5, 6};
    static const uint16_t h[3] = {0x3c00, 0x4000, 0x4200};
    static const int64_t k[2] = {-1, 1};
    static const uint8_t m[3] = {1, 0, 1};
    int64_t s23[2] = {2, 3}, s3 = 3, s2 = 2, s0 = 0;
    cart_st_writer *w = NULL;
    cart_st_writer_new(&w);
    cart_st_writer_set_meta(w, "format", "pt");
    cart_st_writer_add(w, "layers.0.w", CART_F32, 2, s23, a);
    cart_st_writer_add(w, "layers.0.h", CART_F16, 1, &s3, h);
    cart_st_writer_add(w, "pos", CART_I64, 1, &s2, k);
    cart_st_writer_add(w, "mask", CART_BOOL, 1, &s3, m);
    cart_st_writer_add(w, "nothing", CART_F32, 1, &s0, NULL);
    char path[512];
    tmp_path(path, sizeof path, "small.safetensors");
    int rc = cart_st_writer_write(w, path);
    cart_st_writer_free(w);
    return rc ? NULL : read_all(path, size);
}

static void test_fails_cleanly_on_every_truncation_of_a_valid_file(void) {
    size_t size = 0;
    uint8_t *full = small_valid_file(&size);
    CHECK(full != NULL && size > 16);
    if (!full) return;
    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open_memory(&f, full, size, "full"));
    uint64_t n = cart_st_header_size(f);
    cart_st_close(f);
    int past_end = 0;
    for (size_t len = 0; len < size; len++) {
        uint8_t *copy = malloc(len ? len : 1); /* exact size: ASan sees any over-read */
        memcpy(copy, full, len);
        f = NULL;
        CHECK_ERR(cart_st_open_memory(&f, len ? copy : NULL, len, "cut.safetensors"),
                  CART_E_FORMAT);
        CHECK(f == NULL);
        CHECK_ERROR_MENTIONS("cut.safetensors");
        if (len >= 8 + n) {
            CHECK_ERROR_MENTIONS("run past the end of the data");
            past_end += strstr(cart_last_error(), "tensor '") != NULL;
        } else if (len >= 8) {
            CHECK_ERROR_MENTIONS("runs past the end of the file");
        }
        free(copy);
    }
    CHECK(past_end == (int)(size - 8 - n));
    /* The same through a real file and mmap, for a few lengths. */
    char path[512];
    tmp_path(path, sizeof path, "cut.safetensors");
    size_t lens[] = {0, 7, 8, 9, (size_t)(8 + n - 1), (size_t)(8 + n), size - 1};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        CHECK(write_all(path, full, lens[i]) == 0);
        f = NULL;
        CHECK_ERR(cart_st_open(&f, path), CART_E_FORMAT);
        CHECK_ERROR_MENTIONS(path);
    }
    free(full);
}

static void test_rejects_a_header_that_is_not_json(void) {
    CHECK_ERR(open_hdr("{not json}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("not valid JSON");
    CHECK_ERR(open_hdr("{\"a\":{\"dtype\":\"U8\",", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("not valid JSON");
    CHECK_ERR(open_hdr("{} x", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("after the JSON object");
    CHECK_ERR(open_hdr("{}{}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("after the JSON object");
    CHECK_ERR(open_hdr("  {}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("beginning with '{'");
    CHECK_ERR(open_hdr("{\"\xff\":1}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("UTF-8");
    CHECK_ERR(open_hdr("{\"\xc0\xaf\":1}", 0), CART_E_FORMAT); /* overlong '/' */
    CHECK_ERROR_MENTIONS("UTF-8");
    CHECK_ERR(open_hdr("{\"\xed\xa0\x80\":1}", 0), CART_E_FORMAT); /* a surrogate */
    CHECK_ERROR_MENTIONS("UTF-8");
    CHECK_ERR(open_hdr("{\"a\nb\":1}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("control character");
    CHECK_ERR(open_hdr("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1),
              CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("\\u0000");
    CHECK_ERR(open_hdr("{\"a\\ud800\":1}", 0), CART_E_FORMAT); /* a lone surrogate escape */
    CHECK_ERROR_MENTIONS("not valid JSON");
    /* An escaped backslash before "u0000" is not a NUL escape. */
    CHECK_OK(
        open_hdr("{\"a\\\\u0000\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1));
    /* NUL padding is not whitespace. */
    static const char nul_padded[] = "{}\0\0\0\0\0\0";
    uint8_t buf[16] = {8};
    memcpy(buf + 8, nul_padded, 8);
    cart_st_file *f = NULL;
    CHECK_ERR(cart_st_open_memory(&f, buf, sizeof buf, "nul.safetensors"), CART_E_FORMAT);
}

static void test_rejects_a_top_level_that_is_not_an_object(void) {
    CHECK_ERR(open_hdr("[]", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("JSON object");
    CHECK_ERR(open_hdr("\"a string\"", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("JSON object");
    CHECK_ERR(open_hdr("12", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("JSON object");
}

static void test_rejects_entries_with_missing_or_extra_fields(void) {
    CHECK_ERR(open_hdr("{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("tensor 't': missing field dtype");
    CHECK_ERR(open_hdr("{\"t\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("tensor 't': missing field shape");
    CHECK_ERR(open_hdr("{\"t\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("tensor 't': missing field data_offsets");
    CHECK_ERR(
        open_hdr("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1),
        CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("unexpected field 'x'");
    CHECK_ERR(open_hdr("{\"t\":[1,2,3]}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("tensor 't': entry is an array, expected an object");
    CHECK_ERR(open_hdr("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],"
                       "\"dtype\":\"U8\"}}",
                       1),
              CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("field dtype appears twice");
}

static void test_rejects_unknown_and_unsupported_dtypes(void) {
    CHECK_ERR(open_hdr("{\"t\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
              CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("tensor 't': unknown dtype 'F33'");
    CHECK_ERR(open_hdr("{\"t\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
              CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("unknown dtype 'f32'");
    CHECK_ERR(open_hdr("{\"t\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
              CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("dtype is a number, expected a string");
    CHECK_ERR(open_hdr("{\"fp8\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4),
              CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("tensor 'fp8': dtype F8_E4M3 is not supported");
    CHECK_ERR(open_hdr("{\"u\":{\"dtype\":\"U32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
              CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("U32");
}

static void test_rejects_bad_shapes(void) {
    const struct {
        const char *shape;
        int status;
        const char *mention;
    } cases[] = {
        {"[-1]", CART_E_FORMAT, "shape[0] is -1, a negative number"},
        {"[2,1.5]", CART_E_FORMAT, "shape[1] is 1.5, not an integer"},
        {"[\"2\"]", CART_E_FORMAT, "shape[0] is a string"},
        {"[null]", CART_E_FORMAT, "shape[0] is null"},
        {"[[1]]", CART_E_FORMAT, "shape[0] is an array"},
        {"[1e300]", CART_E_FORMAT, "larger than 2^53"},
        {"[9007199254740994]", CART_E_FORMAT, "larger than 2^53"},
        {"4", CART_E_FORMAT, "shape is a number, expected an array"},
        {"{}", CART_E_FORMAT, "shape is an object"},
        {"[1,1,1,1,1,1,1,1,1]", CART_E_UNSUPPORTED, "shape has 9 dims, at most 8"},
        {"[9007199254740992,9007199254740992]", CART_E_FORMAT, "overflows"},
        {"[4294967296,2097152]", CART_E_FORMAT, "overflows"}, /* 2^53 elements x 4 bytes */
    };
    char header[256];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        snprintf(header, sizeof header,
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[0,4]}}", cases[c].shape);
        CHECK_ERR(open_hdr(header, 4), cases[c].status);
        CHECK_ERROR_MENTIONS(cases[c].mention);
        CHECK_ERROR_MENTIONS("tensor 't'");
    }
    /* Eight dims are fine; integral floats are integers. */
    CHECK_OK(open_hdr(
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4));
    CHECK_OK(open_hdr("{\"t\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8));
}

static void test_rejects_bad_data_offsets(void) {
    const struct {
        const char *header;
        size_t blob;
        const char *mention;
    } cases[] = {
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,0]}}", 4,
         "tensor 't': data_offsets [4, 0] are reversed"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0]}}", 4,
         "data_offsets is an array of fewer"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4,8]}}", 4,
         "data_offsets is an array of more"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":\"0,4\"}}", 4,
         "data_offsets is a string"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[-1,3]}}", 4,
         "data_offsets[0] is -1"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4.5]}}", 4,
         "data_offsets[1] is 4.5"},
        {"{\"layers.0.k\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,1000]}}", 1000,
         "bad.safetensors: tensor 'layers.0.k': data_offsets [0, 1000] hold 1000 bytes but shape "
         "[2, 3] x F32 needs 24"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
         6, "tensor 'b': data_offsets [2, 6] overlaps tensor 'a'"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
         4, "overlaps"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]}}",
         10, "tensor 'b': data_offsets [6, 10] leave a gap of 2 bytes after tensor 'a'"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6,
         "gap: the first tensor must begin at 0"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 9,
         "holds 9 bytes but the tensors end at 4: 5 trailing bytes"},
        {"{}", 1, "1 trailing bytes"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}",
         7, "tensor 'b': data_offsets [4, 8] run past the end of the data, which holds 7 bytes"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4503599627370496,2],"
         "\"data_offsets\":[0,9007199254740992]}}",
         4, "tensor 'a': data_offsets [0, 9007199254740992] run past the end"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CHECK_ERR(open_hdr(cases[c].header, cases[c].blob), CART_E_FORMAT);
        CHECK_ERROR_MENTIONS(cases[c].mention);
    }
}

static void test_rejects_duplicate_names(void) {
    /* The two 'a' would tile the blob perfectly; only the name is wrong. */
    CHECK_ERR(open_hdr("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                       "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]},"
                       "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}",
                       12),
              CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("duplicate tensor name 'a'");
    CHECK_ERR(open_hdr("{\"__metadata__\":{},\"__metadata__\":{}}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("duplicate __metadata__");
    CHECK_ERR(open_hdr("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("__metadata__ has a duplicate key 'k'");
}

static void test_rejects_metadata_that_is_not_an_object_of_strings(void) {
    CHECK_ERR(open_hdr("{\"__metadata__\":[\"a\"]}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("__metadata__ is an array, expected an object of strings");
    CHECK_ERR(open_hdr("{\"__metadata__\":\"x\"}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("__metadata__ is a string");
    CHECK_ERR(open_hdr("{\"__metadata__\":{\"ok\":\"s\",\"n\":3}}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("__metadata__ key 'n': value is a number, expected a string");
    CHECK_ERR(open_hdr("{\"__metadata__\":{\"o\":{}}}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("key 'o': value is an object");
    CHECK_ERR(open_hdr("{\"__metadata__\":{\"b\":true}}", 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("key 'b': value is a boolean");
}

static void test_reports_missing_files_as_io_errors(void) {
    char path[512];
    tmp_path(path, sizeof path, "does-not-exist.safetensors");
    cart_st_file *f = NULL;
    CHECK_ERR(cart_st_open(&f, path), CART_E_IO);
    CHECK_ERROR_MENTIONS("does-not-exist.safetensors");
    CHECK(f == NULL);
    CHECK_ERR(cart_st_open(&f, tmp_dir), CART_E_IO);
    CHECK_ERR(cart_st_open(&f, NULL), CART_E_ARG);
    CHECK_ERR(cart_st_open(NULL, path), CART_E_ARG);
    cart_st_close(NULL);
    CHECK(cart_st_tensor_count(NULL) == 0 && cart_st_find(NULL, "x") == NULL);
}

static void test_survives_seeded_mutation_fuzz(void) {
    size_t size = 0;
    uint8_t *full = small_valid_file(&size);
    CHECK(full != NULL);
    if (!full) return;
    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open_memory(&f, full, size, "full"));
    size_t header_end = 8 + (size_t)cart_st_header_size(f);
    cart_st_close(f);

    rng_state = 20240601;
    const char *interesting = "{}[]\",:0123456789-.e \\u";
    int opened = 0, failed = 0;
    enum { ITERATIONS = 20000 };
    for (int iter = 0; iter < ITERATIONS; iter++) {
        size_t len = size;
        if (rng_next() % 8 == 0) len = (size_t)(rng_next() % (size + 16)); /* cut or extend */
        uint8_t *buf = malloc(len ? len : 1);
        memcpy(buf, full, len < size ? len : size);
        for (size_t i = size; i < len; i++) buf[i] = (uint8_t)rng_next();
        int flips = 1 + (int)(rng_next() % 4);
        for (int k = 0; k < flips && len > 0; k++) {
            /* Mostly in the header, where the parsing happens. */
            size_t at =
                rng_next() % 4 ? (size_t)(rng_next() % header_end) : (size_t)(rng_next() % len);
            if (at >= len) continue;
            uint64_t r = rng_next();
            if (r % 3 == 0)
                buf[at] = (uint8_t)interesting[(r >> 8) % strlen(interesting)];
            else if (r % 3 == 1)
                buf[at] ^= (uint8_t)(1u << ((r >> 8) % 8));
            else
                buf[at] = (uint8_t)(r >> 8);
        }
        f = NULL;
        cart_clear_error();
        int rc = cart_st_open_memory(&f, len ? buf : NULL, len, "fuzz");
        if (rc == CART_OK) {
            opened++;
            /* Whatever was accepted must tile the blob inside the buffer. */
            uint64_t at = 0, sum = 0;
            for (int64_t i = 0; i < cart_st_tensor_count(f); i++) {
                const cart_st_tensor *t = cart_st_tensor_at(f, i);
                CHECK(t->offset == at);
                CHECK((const uint8_t *)t->data + t->nbytes <= buf + len);
                for (uint64_t b = 0; b < t->nbytes; b++) sum += ((const uint8_t *)t->data)[b];
                CHECK(cart_st_find(f, t->name.data) == t);
                at += t->nbytes;
            }
            CHECK(8 + cart_st_header_size(f) + at == len);
            (void)sum;
            cart_st_close(f);
        } else {
            failed++;
            CHECK_MSG(rc == CART_E_FORMAT || rc == CART_E_UNSUPPORTED, "status %d", rc);
            CHECK(cart_last_error()[0] != '\0');
            CHECK(f == NULL);
        }
        free(buf);
    }
    printf("  fuzz: %d mutations, %d opened, %d rejected\n", ITERATIONS, opened, failed);
    free(full);
}

/* ---- writer errors ------------------------------------------------------ */

static void test_writer_rejects_bad_tensors(void) {
    float x[4] = {0};
    int64_t s4 = 4, neg = -1, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    cart_st_writer *w = NULL;
    CHECK_OK(cart_st_writer_new(&w));
    CHECK_OK(cart_st_writer_add(w, "x", CART_F32, 1, &s4, x));
    CHECK_ERR(cart_st_writer_add(w, "x", CART_F16, 1, &s4, x), CART_E_ARG);
    CHECK_ERROR_MENTIONS("duplicate tensor name 'x'");
    CHECK_ERR(cart_st_writer_add(w, "", CART_F32, 1, &s4, x), CART_E_ARG);
    CHECK_ERROR_MENTIONS("empty");
    CHECK_ERR(cart_st_writer_add(w, NULL, CART_F32, 1, &s4, x), CART_E_ARG);
    CHECK_ERR(cart_st_writer_add(w, "__metadata__", CART_F32, 1, &s4, x), CART_E_ARG);
    CHECK_ERROR_MENTIONS("__metadata__");
    CHECK_ERR(cart_st_writer_add(w, "bad\xff", CART_F32, 1, &s4, x), CART_E_ARG);
    CHECK_ERROR_MENTIONS("UTF-8");
    CHECK_ERR(cart_st_writer_add(w, "d", 999, 1, &s4, x), CART_E_ARG);
    CHECK_ERROR_MENTIONS("unknown dtype id 999");
    CHECK_ERR(cart_st_writer_add(w, "q", CART_Q4_K, 1, &s4, x), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("q4_K");
    CHECK_ERR(cart_st_writer_add(w, "n", CART_F32, 9, nine, x), CART_E_ARG);
    CHECK_ERROR_MENTIONS("ndim 9");
    CHECK_ERR(cart_st_writer_add(w, "n", CART_F32, -1, nine, x), CART_E_ARG);
    CHECK_ERR(cart_st_writer_add(w, "s", CART_F32, 1, &neg, x), CART_E_ARG);
    CHECK_ERROR_MENTIONS("shape[0] is -1");
    CHECK_ERR(cart_st_writer_add(w, "s", CART_F32, 1, NULL, x), CART_E_ARG);
    CHECK_ERR(cart_st_writer_add(w, "nul", CART_F32, 1, &s4, NULL), CART_E_ARG);
    CHECK_ERROR_MENTIONS("data is NULL");
    int64_t zero = 0;
    CHECK_OK(cart_st_writer_add(w, "nul", CART_F32, 1, &zero, NULL));
    CHECK_ERR(cart_st_writer_set_meta(w, "k", NULL), CART_E_ARG);
    CHECK_ERR(cart_st_writer_set_meta(w, "k", "\xc3"), CART_E_ARG);
    CHECK_ERROR_MENTIONS("UTF-8");
    /* The rejected adds left nothing behind. */
    char path[512];
    tmp_path(path, sizeof path, "after-errors.safetensors");
    CHECK_OK(cart_st_writer_write(w, path));
    cart_st_writer_free(w);
    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open(&f, path));
    CHECK(cart_st_tensor_count(f) == 2 && cart_st_meta_count(f) == 0);
    cart_st_close(f);
    cart_st_writer_free(NULL);
}

static void test_writer_keeps_many_names_unique(void) {
    uint8_t byte = 0;
    char name[32];
    cart_st_writer *w = NULL;
    CHECK_OK(cart_st_writer_new(&w));
    for (int i = 0; i < 3000; i++) {
        snprintf(name, sizeof name, "layers.%d.w", i);
        CHECK_OK(cart_st_writer_add(w, name, CART_U8, 0, NULL, &byte));
    }
    int dups = 0;
    for (int i = 0; i < 3000; i += 7) {
        snprintf(name, sizeof name, "layers.%d.w", i);
        dups += cart_st_writer_add(w, name, CART_U8, 0, NULL, &byte) == CART_E_ARG;
    }
    CHECK(dups == (3000 + 6) / 7);
    char path[512];
    tmp_path(path, sizeof path, "many.safetensors");
    CHECK_OK(cart_st_writer_write(w, path));
    cart_st_writer_free(w);
    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open(&f, path));
    CHECK(cart_st_tensor_count(f) == 3000);
    CHECK(f && cart_st_find(f, "layers.2999.w") && cart_st_find(f, "layers.0.w") &&
          !cart_st_find(f, "layers.3000.w"));
    cart_st_close(f);
}

static void test_writing_into_a_missing_directory_fails_without_a_temp_file(void) {
    uint8_t byte = 1;
    cart_st_writer *w = NULL;
    CHECK_OK(cart_st_writer_new(&w));
    CHECK_OK(cart_st_writer_add(w, "b", CART_U8, 0, NULL, &byte));
    char path[512];
    tmp_path(path, sizeof path, "missing-dir/out.safetensors");
    int before = count_files_containing("");
    CHECK_ERR(cart_st_writer_write(w, path), CART_E_IO);
    CHECK_ERROR_MENTIONS("missing-dir/out.safetensors");
    CHECK(count_files_containing("") == before);
    CHECK(count_files_containing(".tmp.") == 0);
    CHECK(access(path, F_OK) != 0);
    CHECK_ERR(cart_st_writer_write(w, NULL), CART_E_ARG);
    cart_st_writer_free(w);
}

static void test_a_failed_write_leaves_the_existing_file_untouched(void) {
    char path[512];
    tmp_path(path, sizeof path, "keep.safetensors");
    uint8_t small = 7;
    cart_st_writer *w = NULL;
    CHECK_OK(cart_st_writer_new(&w));
    CHECK_OK(cart_st_writer_add(w, "small", CART_U8, 0, NULL, &small));
    CHECK_OK(cart_st_writer_write(w, path));
    cart_st_writer_free(w);
    size_t size0 = 0;
    uint8_t *before = read_all(path, &size0);

    /* A file-size limit below the new file makes its writes fail (EFBIG). */
    enum { BIG = 1 << 16 };
    uint8_t *big = calloc(1, BIG);
    int64_t shape = BIG;
    CHECK_OK(cart_st_writer_new(&w));
    CHECK_OK(cart_st_writer_add(w, "big", CART_U8, 1, &shape, big));
    struct rlimit old;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    struct rlimit lim = old;
    lim.rlim_cur = 4096;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
        CHECK_ERR(cart_st_writer_write(w, path), CART_E_IO);
        CHECK_ERROR_MENTIONS("keep.safetensors");
        setrlimit(RLIMIT_FSIZE, &old);
        size_t size1 = 0;
        uint8_t *after = read_all(path, &size1);
        CHECK(after && size1 == size0 && memcmp(after, before, size0) == 0);
        free(after);
        CHECK(count_files_containing(".tmp.") == 0);
    } else {
        printf("  (cannot lower RLIMIT_FSIZE here; skipped the failed-write check)\n");
    }
    signal(SIGXFSZ, old_handler);
    /* And a successful rewrite replaces it. */
    CHECK_OK(cart_st_writer_write(w, path));
    cart_st_file *f = NULL;
    CHECK_OK(cart_st_open(&f, path));
    CHECK(f && cart_st_find(f, "big") && !cart_st_find(f, "small"));
    cart_st_close(f);
    cart_st_writer_free(w);
    free(big);
    free(before);
}

static void test_names_dtypes_as_safetensors_does(void) {
    CHECK(strcmp(cart_st_dtype_name(CART_F32), "F32") == 0);
    CHECK(strcmp(cart_st_dtype_name(CART_BF16), "BF16") == 0);
    CHECK(strcmp(cart_st_dtype_name(CART_BOOL), "BOOL") == 0);
    CHECK(strcmp(cart_st_dtype_name(CART_U8), "U8") == 0);
    CHECK(cart_st_dtype_name(CART_Q4_0) == NULL);
    CHECK(cart_st_dtype_name(-1) == NULL);
}

static void remove_tmp_dir(void) {
    DIR *d = opendir(tmp_dir);
    if (!d) return;
    char path[512];
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlink(tmp_path(path, sizeof path, e->d_name));
    closedir(d);
    rmdir(tmp_dir);
}

int main(void) {
    if (make_tmp_dir("cart_st_XXXXXX") != 0) return 1;
    RUN(test_round_trips_every_dtype_and_rank_with_metadata);
    RUN(test_sorts_by_dtype_as_hugging_face_does_then_by_name);
    RUN(test_pads_the_header_so_the_data_starts_at_a_multiple_of_8);
    RUN(test_writes_exactly_the_expected_bytes_for_a_fixed_input);
    RUN(test_matches_the_hugging_face_writer_on_its_published_examples);
    RUN(test_reads_a_file_written_by_another_implementation);
    RUN(test_accepts_zero_size_tensors_anywhere_in_the_blob);
    RUN(test_rejects_files_shorter_than_the_length_prefix);
    RUN(test_rejects_header_lengths_out_of_range);
    RUN(test_fails_cleanly_on_every_truncation_of_a_valid_file);
    RUN(test_rejects_a_header_that_is_not_json);
    RUN(test_rejects_a_top_level_that_is_not_an_object);
    RUN(test_rejects_entries_with_missing_or_extra_fields);
    RUN(test_rejects_unknown_and_unsupported_dtypes);
    RUN(test_rejects_bad_shapes);
    RUN(test_rejects_bad_data_offsets);
    RUN(test_rejects_duplicate_names);
    RUN(test_rejects_metadata_that_is_not_an_object_of_strings);
    RUN(test_reports_missing_files_as_io_errors);
    RUN(test_survives_seeded_mutation_fuzz);
    RUN(test_checksums_the_data_and_detects_every_bit_flip);
    RUN(test_writer_rejects_bad_tensors);
    RUN(test_writer_keeps_many_names_unique);
    RUN(test_writing_into_a_missing_directory_fails_without_a_temp_file);
    RUN(test_a_failed_write_leaves_the_existing_file_untouched);
    RUN(test_names_dtypes_as_safetensors_does);
    remove_tmp_dir();
    return check_finish("safetensors");
}
