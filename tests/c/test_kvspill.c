/*
 * test_kvspill.c - the server's KV spill file from C alone (kvspill.h): a
 * write and a load give back the same rows, tokens and metadata; the open
 * refuses a damaged file (CART_E_FORMAT) and another's (CART_E_UNSUPPORTED),
 * naming the problem; the checksum catches a changed byte.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cartridge.h"
#include "check.h"
#include "tiny_model.h"

static char QWEN_PATH[128], LLAMA_PATH[128], DIR[64];
static const char *HASH = "cs64:0123456789abcdef";

static void path_in_dir(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", DIR, name); }

/* A cache of m (dtype) holding the rows of 12 tokens; tokens gets them. */
static cart_kv *filled_cache(cart_model *m, int32_t dtype, int32_t *tokens) {
    cart_kv *kv = NULL;
    CHECK_OK(cart_model_new_kv(&kv, m, 32, dtype));
    for (int i = 0; i < 12; i++) tokens[i] = (i * 7 + 3) % 40;
    float *logits = malloc(sizeof(float) * 40);
    int64_t n = 12;
    const int64_t last = 11;
    if (kv) CHECK_OK(cart_model_forward(m, &kv, 1, tokens, &n, &last, 1, logits));
    free(logits);
    return kv;
}

static int open_status(const char *path, cart_model *m, const char *hash, int32_t dtype, const char *want) {
    cart_kvspill *f = NULL;
    int rc = cart_kvspill_open(&f, path, m, hash, dtype);
    CHECK_MSG(rc == CART_OK || strstr(cart_last_error(), want), "message '%s' lacks '%s'", cart_last_error(), want);
    CHECK(rc == CART_OK || (f == NULL && strstr(cart_last_error(), path)));
    cart_kvspill_close(f);
    return rc;
}

static void test_write_then_load_gives_back_the_rows(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, QWEN_PATH, NULL));
    int32_t tokens[12];
    cart_kv *kv = m ? filled_cache(m, CART_F16, tokens) : NULL, *back = NULL;
    if (!kv) return;
    char path[160];
    path_in_dir(path, sizeof path, "kv-a.safetensors");
    /* the first 3 rows stand for a cartridge's; the file holds the 9 after */
    cart_kvspill_owner o = {.model = "tiny", .model_hash = HASH, .cartridge = "docs", .cartridge_hash = "cs64:77",
                            .p = 3};
    CHECK_OK(cart_kvspill_write(path, kv, tokens + 3, 9, &o));
    cart_kvspill *f = NULL;
    CHECK_OK(cart_kvspill_open(&f, path, m, HASH, CART_F16));
    if (!f) return;
    CHECK(cart_kvspill_n(f) == 9 && cart_kvspill_p(f) == 3);
    CHECK(memcmp(cart_kvspill_tokens(f), tokens + 3, 9 * sizeof(int32_t)) == 0);
    CHECK(strcmp(cart_kvspill_meta(f, "kvspill.cartridge"), "docs") == 0);
    CHECK(strcmp(cart_kvspill_meta(f, "kvspill.cartridge_hash"), "cs64:77") == 0);
    CHECK(strcmp(cart_kvspill_meta(f, "kvspill.format"), CART_KVSPILL_FORMAT) == 0);
    CHECK(cart_kvspill_meta(f, "kvspill.none") == NULL);
    CHECK_OK(cart_kvspill_verify(f));
    CHECK_OK(cart_model_new_kv(&back, m, 32, CART_F16));
    CHECK(cart_kvspill_load(f, back, 5) == CART_E_ARG); /* the cartridge's 3 rows are not there yet */
    CHECK_OK(cart_kv_copy(back, kv, 3));
    CHECK(cart_kvspill_load(f, back, 10) == CART_E_ARG); /* more tokens than the file has */
    CHECK_OK(cart_kvspill_load(f, back, 7));
    CHECK(cart_kv_len(back) == 10);
    const int64_t row = 2 * 16 * 2; /* kv_heads x head_dim x f16 */
    for (int32_t l = 0; l < 2; l++)
        for (int32_t w = 0; w < 2; w++)
            CHECK_MSG(memcmp(cart_kv_rows(back, l, w), cart_kv_rows(kv, l, w), (size_t)(10 * row)) == 0,
                      "layer %d %s: the loaded rows differ from the cache's", (int)l, w ? "v" : "k");
    cart_kvspill_close(f);
    cart_kv_free(back);
    cart_kv_free(kv);
    cart_model_free(m);
}

static void test_another_model_dtype_or_geometry_is_refused(void) {
    cart_model *m = NULL, *llama = NULL;
    CHECK_OK(cart_model_load(&m, QWEN_PATH, NULL));
    CHECK_OK(cart_model_load(&llama, LLAMA_PATH, NULL));
    char path[160];
    path_in_dir(path, sizeof path, "kv-a.safetensors");
    if (!m || !llama) return;
    CHECK(open_status(path, m, "cs64:1111111111111111", CART_F16, "written for another model") ==
          CART_E_UNSUPPORTED);
    CHECK(open_status(path, m, HASH, CART_F32, "its rows are 'f16' and this cache is f32") == CART_E_UNSUPPORTED);
    CHECK(open_status(path, llama, HASH, CART_F16, "a spill file for this model has 7") == CART_E_FORMAT);
    cart_model_free(llama);
    cart_model_free(m);
}

/* Xors one byte of path: the one `back` bytes before its end. */
static void flip_byte(const char *path, long back) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, -back, SEEK_END);
    const long at = ftell(f);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x20, f);
    fclose(f);
}

static void test_damaged_files_are_refused(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, QWEN_PATH, NULL));
    int32_t tokens[12];
    cart_kv *kv = m ? filled_cache(m, CART_F32, tokens) : NULL;
    if (!kv) return;
    char path[160];
    path_in_dir(path, sizeof path, "kv-b.safetensors");
    cart_kvspill_owner o = {.model = "tiny", .model_hash = HASH, .cartridge = "?", .cartridge_hash = "none", .p = 0};
    CHECK(cart_kvspill_write(path, kv, tokens, 13, &o) == CART_E_ARG); /* the cache holds 12 rows */
    CHECK(cart_kvspill_write(path, kv, tokens, 0, &o) == CART_E_ARG);
    /* a changed byte in the rows: the file opens, its checksum fails */
    CHECK_OK(cart_kvspill_write(path, kv, tokens, 12, &o));
    flip_byte(path, 200); /* F32 rows come before I32 tokens in the blob */
    cart_kvspill *f = NULL;
    CHECK_OK(cart_kvspill_open(&f, path, m, HASH, CART_F32));
    CHECK(f && cart_kvspill_verify(f) == CART_E_FORMAT && strstr(cart_last_error(), "do not match its checksum"));
    cart_kvspill_close(f);
    /* a token outside the vocabulary of 40 */
    int32_t bad[12];
    memcpy(bad, tokens, sizeof bad);
    bad[4] = 40;
    CHECK_OK(cart_kvspill_write(path, kv, bad, 12, &o));
    CHECK(open_status(path, m, HASH, CART_F32, "tokens[4] is 40, outside the vocabulary of 40") == CART_E_FORMAT);
    /* truncated; and not a spill file at all (a model) */
    CHECK_OK(cart_kvspill_write(path, kv, tokens, 12, &o));
    CHECK(truncate(path, 200) == 0);
    CHECK(open_status(path, m, HASH, CART_F32, "") == CART_E_FORMAT);
    CHECK(open_status(QWEN_PATH, m, HASH, CART_F32, "") != CART_OK);
    remove(path);
    cart_kv_free(kv);
    cart_model_free(m);
}

int main(void) {
    tiny_shape q = {.qwen3 = 1, .layers = 2, .embd = 32, .heads = 4, .kv_heads = 2, .head_dim = 16,
                    .ff = 48, .vocab = 40, .dtype = CART_F32, .tied = 1, .seed = 5};
    tiny_shape l = q;
    l.qwen3 = 0, l.layers = 3, l.seed = 7;
    snprintf(DIR, sizeof DIR, "/tmp/cart_test_kvspill.%d", (int)getpid());
    snprintf(QWEN_PATH, sizeof QWEN_PATH, "%s/qwen3.gguf", DIR);
    snprintf(LLAMA_PATH, sizeof LLAMA_PATH, "%s/llama.gguf", DIR);
    if (cart_fs_mkdirs(DIR) || write_tiny_model(QWEN_PATH, &q) || write_tiny_model(LLAMA_PATH, &l)) {
        printf("cannot write the test models: %s\n", cart_last_error());
        return 1;
    }
    RUN(test_write_then_load_gives_back_the_rows);
    RUN(test_another_model_dtype_or_geometry_is_refused);
    RUN(test_damaged_files_are_refused);
    const char *names[] = {"qwen3.gguf", "llama.gguf", "kv-a.safetensors", "kv-b.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char p[160];
        path_in_dir(p, sizeof p, names[i]);
        remove(p);
    }
    rmdir(DIR);
    return check_finish("kvspill");
}
