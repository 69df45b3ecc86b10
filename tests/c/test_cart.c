/*
 * test_cart.c - the cartridge's artifact from C alone (cart.h): a save and
 * an open give back the same rows, geometry, draft ids and metadata; every
 * check refuses what it should, naming the file, and a foreign cartridge
 * loads only when asked, with a warning.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cartridge.h"
#include "check.h"
#include "tiny_model.h"

static char QWEN_PATH[128], OTHER_PATH[128], LLAMA_PATH[128], DIR[64];

/* A cartridge of m with random rows (p 5, 2 sinks). */
static cart_cartridge *random_cartridge(const cart_model *m) {
    cart_cartridge *c = NULL;
    CHECK_OK(cart_cartridge_new_for(&c, m, 5, 2));
    if (c) cart_cartridge_init_random(c, 11, 0.5f);
    return c;
}

static int meta_is(const cart_st_file *st, const char *key, const char *want) {
    const cart_str *v = cart_st_meta_get(st, key);
    return v && v->len == strlen(want) && memcmp(v->data, want, v->len) == 0;
}

static void path_in_dir(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", DIR, name);
}

static void test_save_and_open_give_back_everything(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, QWEN_PATH, NULL));
    cart_cartridge *c = random_cartridge(m), *d = NULL;
    if (!m || !c) return;
    char path[160];
    path_in_dir(path, sizeof path, "a.safetensors");
    const int32_t draft[4] = {3, 1, 4, 1};
    const char *keys[2] = {"zz.note", "cartridge.training"}, *values[2] = {"kept", "{\"steps\":3}"};
    cart_cartridge_save_options o = {.draft_reference = draft, .n_draft = 4, .meta_keys = keys,
                                     .meta_values = values, .n_meta = 2};
    CHECK_OK(cart_cartridge_save(c, m, path, &o));
    cart_cartridge_file *f = NULL;
    CHECK_OK(cart_cartridge_open(&f, path, m, 0));
    if (!f) return;
    CHECK(strcmp(cart_cartridge_file_warnings(f), "") == 0);
    CHECK(cart_cartridge_file_n_layer(f) == 2 && cart_cartridge_file_p(f) == 5 && cart_cartridge_file_frozen(f) == 2);
    CHECK(cart_cartridge_file_layer_heads(f, 1) == 2 && cart_cartridge_file_layer_head_dim(f, 1) == 16);
    const int32_t *ids = NULL;
    CHECK(cart_cartridge_file_draft(f, &ids) == 4 && ids && memcmp(ids, draft, sizeof draft) == 0);
    const cart_st_file *st = cart_cartridge_file_st(f);
    CHECK(meta_is(st, "cartridge.format", CART_CARTRIDGE_FORMAT) && meta_is(st, "cartridge.architecture", "qwen3"));
    CHECK(meta_is(st, "cartridge.training", "{\"steps\":3}") && meta_is(st, "zz.note", "kept"));
    CHECK(meta_is(st, "cartridge.kv_heads", "2") && meta_is(st, "cartridge.p", "5"));
    CHECK(cart_st_verify_checksum(st) == CART_OK);
    CHECK_OK(cart_cartridge_file_load(&d, f));
    int64_t differ = 0;
    for (int32_t l = 0; d && l < 2; l++)
        for (int32_t which = 0; which < 2; which++) {
            const float *a = cart_cartridge_rows(c, l, which), *b = cart_cartridge_rows(d, l, which);
            const float *mapped = cart_cartridge_file_rows(f, l, which, 0), *sink = cart_cartridge_file_rows(f, l, which, 1);
            differ += memcmp(a, b, sizeof(float) * 5 * 32) != 0;
            differ += memcmp(a + 2 * 32, mapped, sizeof(float) * 3 * 32) != 0 || memcmp(a, sink, sizeof(float) * 2 * 32) != 0;
        }
    printf("    rows that differ after save and load: %lld (of 8 blocks)\n", (long long)differ);
    CHECK(differ == 0);
    cart_cartridge_file_close(f);
    cart_cartridge_free(d);
    cart_cartridge_free(c);
    cart_model_free(m);
}

static void test_another_model_is_refused_unless_asked(void) {
    cart_model *m = NULL, *other = NULL, *llama = NULL;
    CHECK_OK(cart_model_load(&m, QWEN_PATH, NULL));
    CHECK_OK(cart_model_load(&other, OTHER_PATH, NULL));
    CHECK_OK(cart_model_load(&llama, LLAMA_PATH, NULL));
    cart_cartridge *c = random_cartridge(m), *d = NULL;
    if (!m || !other || !llama || !c) return;
    char path[160];
    path_in_dir(path, sizeof path, "b.safetensors");
    CHECK_OK(cart_cartridge_save(c, m, path, NULL));
    /* the same geometry, other weights: the fingerprint says so */
    CHECK_ERR(cart_cartridge_load(&d, path, other, 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("fingerprint");
    CHECK_ERROR_MENTIONS("--foreign-cartridge");
    CHECK_ERROR_MENTIONS(path);
    CHECK(d == NULL);
    cart_cartridge_file *f = NULL;
    CHECK_OK(cart_cartridge_open(&f, path, other, CART_CARTRIDGE_FOREIGN));
    CHECK(f && strstr(cart_cartridge_file_warnings(f), "loading it anyway") != NULL);
    cart_cartridge_file_close(f);
    /* another geometry is refused even when asked: the tensors cannot fit */
    CHECK_ERR(cart_cartridge_load(&d, path, llama, CART_CARTRIDGE_FOREIGN), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("use the model it was trained with");
    /* and a cartridge of another geometry is never saved for m */
    CHECK_ERR(cart_cartridge_save(c, llama, path, NULL), CART_E_ARG);
    cart_cartridge_free(c);
    cart_model_free(llama);
    cart_model_free(other);
    cart_model_free(m);
}

static int64_t file_size(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return -1;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fclose(fp);
    return n;
}

/* Rewrites byte `at` of path (xor 0x40), or cuts the file to `at` bytes. */
static void damage(const char *path, int64_t at, int cut) {
    if (cut) {
        CHECK(truncate(path, at) == 0);
        return;
    }
    FILE *fp = fopen(path, "r+b");
    if (!fp) return;
    fseek(fp, at, SEEK_SET);
    int b = fgetc(fp);
    fseek(fp, at, SEEK_SET);
    fputc(b ^ 0x40, fp);
    fclose(fp);
}

static void test_damaged_files_and_bad_rows_are_refused(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, QWEN_PATH, NULL));
    cart_cartridge *c = random_cartridge(m), *d = NULL;
    if (!m || !c) return;
    char path[160], missing[160];
    path_in_dir(path, sizeof path, "c.safetensors");
    path_in_dir(missing, sizeof missing, "missing.safetensors");
    CHECK_OK(cart_cartridge_save(c, m, path, NULL));
    const int64_t size = file_size(path);
    damage(path, size - 7, 0); /* a row byte: the checksum differs */
    CHECK_ERR(cart_cartridge_load(&d, path, m, 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("checksum");
    CHECK_OK(cart_cartridge_save(c, m, path, NULL));
    damage(path, size - 100, 1);
    CHECK(cart_cartridge_load(&d, path, m, 0) != CART_OK && d == NULL);
    CHECK_ERROR_MENTIONS(path);
    CHECK(cart_cartridge_load(&d, missing, m, 0) != CART_OK);
    CHECK_ERROR_MENTIONS("missing.safetensors");
    /* a NaN or a value beyond the f16 range is never saved, and the old file stays */
    CHECK_OK(cart_cartridge_save(c, m, path, NULL));
    cart_cartridge_rows(c, 1, 1)[3 * 32 + 5] = NAN;
    CHECK_ERR(cart_cartridge_save(c, m, path, NULL), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("'layers.1.v' row 1 holds nan");
    cart_cartridge_rows(c, 1, 1)[3 * 32 + 5] = 1e30f;
    CHECK_ERR(cart_cartridge_save(c, m, path, NULL), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("must lie within +-65504");
    CHECK(file_size(path) == size);
    CHECK_OK(cart_cartridge_load(&d, path, m, 0));
    cart_cartridge_free(d);
    cart_cartridge_free(c);
    cart_model_free(m);
}

/* A file of cartridge tensors written by hand: layer 0's K and V of `rows`
 * rows, heads x dims, zero. */
static void write_rows(const char *path, int64_t rows, int64_t heads, int64_t dims) {
    static float zeros[4096];
    cart_st_writer *w = NULL;
    CHECK_OK(cart_st_writer_new(&w));
    const int64_t shape[3] = {rows, heads, dims};
    CHECK_OK(cart_st_writer_add(w, "layers.0.k", CART_F32, 3, shape, zeros));
    CHECK_OK(cart_st_writer_add(w, "layers.0.v", CART_F32, 3, shape, zeros));
    CHECK_OK(cart_st_writer_write(w, path));
    cart_st_writer_free(w);
}

static void test_geometry_no_cartridge_has_is_refused(void) {
    char path[160];
    path_in_dir(path, sizeof path, "d.safetensors");
    cart_cartridge_file *f = NULL;
    write_rows(path, 0, 2, 16);
    CHECK_ERR(cart_cartridge_open(&f, path, NULL, CART_CARTRIDGE_FOREIGN), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("has no rows");
    write_rows(path, 2, 0, 16);
    CHECK_ERR(cart_cartridge_open(&f, path, NULL, CART_CARTRIDGE_FOREIGN), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("0 KV heads x 16 dims");
    /* the right shapes without a cartridge's metadata: refused, or opened as foreign with a warning */
    write_rows(path, 2, 2, 16);
    CHECK_ERR(cart_cartridge_open(&f, path, NULL, 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("no cartridge.format");
    CHECK_OK(cart_cartridge_open(&f, path, NULL, CART_CARTRIDGE_FOREIGN));
    CHECK(f && strstr(cart_cartridge_file_warnings(f), "carries no checksum") != NULL);
    cart_cartridge_file_close(f);
    remove(path);
}

int main(void) {
    tiny_shape q = {.qwen3 = 1, .layers = 2, .embd = 32, .heads = 4, .kv_heads = 2, .head_dim = 16,
                    .ff = 48, .vocab = 40, .dtype = CART_F32, .tied = 1, .seed = 5};
    tiny_shape o = q, l = q;
    o.seed = 6;
    l.qwen3 = 0, l.layers = 3, l.seed = 7;
    snprintf(DIR, sizeof DIR, "/tmp/cart_test_cart.%d", (int)getpid());
    snprintf(QWEN_PATH, sizeof QWEN_PATH, "%s/qwen3.gguf", DIR);
    snprintf(OTHER_PATH, sizeof OTHER_PATH, "%s/other.gguf", DIR);
    snprintf(LLAMA_PATH, sizeof LLAMA_PATH, "%s/llama.gguf", DIR);
    if (cart_fs_mkdirs(DIR) || write_tiny_model(QWEN_PATH, &q) || write_tiny_model(OTHER_PATH, &o) ||
        write_tiny_model(LLAMA_PATH, &l)) {
        printf("cannot write the test models: %s\n", cart_last_error());
        return 1;
    }
    RUN(test_save_and_open_give_back_everything);
    RUN(test_another_model_is_refused_unless_asked);
    RUN(test_damaged_files_and_bad_rows_are_refused);
    RUN(test_geometry_no_cartridge_has_is_refused);
    const char *names[] = {"qwen3.gguf", "other.gguf", "llama.gguf", "a.safetensors", "b.safetensors",
                           "c.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char p[160];
        path_in_dir(p, sizeof p, names[i]);
        remove(p);
    }
    rmdir(DIR);
    return check_finish("cart");
}
