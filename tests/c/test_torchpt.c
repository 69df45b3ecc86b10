/*
 * test_torchpt.c - the stored-zip reader and writer (zip.h) and the torch.save
 * reader and writer (torchpt.h): files real PyTorch wrote
 * (tests/fixtures/torch, made by make_fixtures.py), round trips of our own,
 * hand-built pickles for every refused opcode and name, and damaged
 * archives failing cleanly with a message naming the problem.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "test_files.h"
#include "dtype.h"
#include "safetensors.h"
#include "torchpt.h"
#include "zip.h"

#define FIXTURES CART_SOURCE_DIR "/tests/fixtures/torch/"

/* ---- zip ---------------------------------------------------------------- */

static void test_crc32_matches_the_published_check_value(void) {
    CHECK(cart_crc32(0, "123456789", 9) == 0xCBF43926u);
    uint32_t parts = cart_crc32(cart_crc32(0, "1234", 4), "56789", 5);
    CHECK(parts == 0xCBF43926u);
    CHECK(cart_crc32(0, "", 0) == 0);
}

static void test_zip_round_trip_aligns_every_entry_to_64_bytes(void) {
    char path[300];
    tmp_path(path, sizeof path, "a.zip");
    cart_zip_writer *w = NULL;
    CHECK_OK(cart_zip_writer_open(&w, path));
    char big[1000];
    for (int i = 0; i < 1000; i++) big[i] = (char)(i * 7);
    CHECK_OK(cart_zip_writer_add(w, "a/one", "x", 1));
    CHECK_OK(cart_zip_writer_add(w, "a/empty", NULL, 0));
    CHECK_OK(cart_zip_writer_add(w, "a/data/0", big, sizeof big));
    CHECK_OK(cart_zip_writer_commit(w));
    size_t n;
    uint8_t *bytes = read_all(path, &n);
    cart_zip *z = NULL;
    CHECK_OK(cart_zip_open_memory(&z, bytes, n, path));
    CHECK(cart_zip_count(z) == 3);
    const cart_zip_entry *e = cart_zip_find(z, "a/data/0");
    CHECK(e && e->size == sizeof big && memcmp(e->data, big, sizeof big) == 0);
    for (int64_t i = 0; i < cart_zip_count(z); i++) CHECK((cart_zip_entry_at(z, i)->data - bytes) % 64 == 0);
    CHECK(cart_zip_find(z, "a/empty")->size == 0);
    CHECK(cart_zip_find(z, "missing") == NULL && cart_zip_entry_at(z, 3) == NULL);
    cart_zip_close(z);
    free(bytes);
}

/* Writes a small archive and returns its bytes (caller frees). */
static uint8_t *small_zip(size_t *n) {
    char path[300];
    tmp_path(path, sizeof path, "small.zip");
    cart_zip_writer *w = NULL;
    if (cart_zip_writer_open(&w, path) != CART_OK) return NULL;
    cart_zip_writer_add(w, "a/x", "hello, zip", 10);
    cart_zip_writer_add(w, "a/y", "second", 6);
    if (cart_zip_writer_commit(w) != CART_OK) return NULL;
    return read_all(path, n);
}

static void test_zip_refuses_damage_naming_it(void) {
    size_t n;
    uint8_t *b = small_zip(&n);
    CHECK(b != NULL);
    if (!b) return;
    cart_zip *z = NULL;
    uint8_t *d = cart_zip_open_memory(&z, b, n, "s") == CART_OK ? (uint8_t *)cart_zip_find(z, "a/x")->data : NULL;
    cart_zip_close(z);
    CHECK(d != NULL);
    d[3] ^= 1; /* one data bit */
    CHECK_ERR(cart_zip_open_memory(&z, b, n, "s"), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("CRC-32");
    d[3] ^= 1;
    for (size_t cut = 0; cut < n; cut += 7) { /* every truncation fails cleanly */
        uint8_t *part = malloc(cut ? cut : 1);
        memcpy(part, b, cut);
        int rc = cart_zip_open_memory(&z, part, cut, "cut");
        CHECK_MSG(rc == CART_E_FORMAT, "cut at %zu gave %d", cut, rc);
        free(part);
    }
    uint8_t *central = NULL;
    for (size_t i = 0; i + 4 < n; i++)
        if (!central && memcmp(b + i, "PK\1\2", 4) == 0) central = b + i;
    central[10] = 8; /* method: deflate */
    CHECK_ERR(cart_zip_open_memory(&z, b, n, "s"), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("deflate");
    central[10] = 0;
    central[8] |= 1; /* encrypted */
    CHECK_ERR(cart_zip_open_memory(&z, b, n, "s"), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("encrypted");
    free(b);
}

static void test_zip_reads_what_pytorch_wrote(void) {
    size_t n;
    uint8_t *b = read_all(FIXTURES "ref-frozen-f32.pt", &n);
    CHECK(b != NULL);
    if (!b) return;
    cart_zip *z = NULL;
    CHECK_OK(cart_zip_open_memory(&z, b, n, "ref-frozen-f32.pt")); /* zip64 end records, data descriptors */
    CHECK(cart_zip_find(z, "ref-frozen-f32/data.pkl") != NULL);
    CHECK(cart_zip_find(z, "ref-frozen-f32/version") != NULL);
    cart_zip_close(z);
    free(b);
}

/* ---- torch.save files ------------------------------------------------------ */

/* Every value of lists[key] equals expected.safetensors' "<name>.<key>.<layer>". */
static void check_against_expected(const char *file, const char *name) {
    cart_pt *pt = NULL;
    cart_st_file *ex = NULL;
    CHECK_OK(cart_pt_open(&pt, file));
    CHECK_OK(cart_st_open(&ex, FIXTURES "expected.safetensors"));
    if (!pt || !ex) return;
    int checked = 0;
    double maxdiff = 0;
    for (int64_t i = 0; i < cart_st_tensor_count(ex); i++) {
        const cart_st_tensor *t = cart_st_tensor_at(ex, i);
        char key[128];
        int layer;
        if (sscanf(t->name.data, "%*[^.].%127[^.].%d", key, &layer) != 2 || strncmp(t->name.data, name, strlen(name)) ||
            t->name.data[strlen(name)] != '.')
            continue;
        const cart_pk_value *list = cart_pk_get(cart_pt_root(pt), key);
        const cart_pk_value *v = list && cart_pk_kind_of(list) == CART_PK_LIST ? cart_pk_item(list, layer) : NULL;
        if (list && cart_pk_kind_of(list) == CART_PK_OBJECT) { /* nn.ParameterList */
            char idx[16];
            snprintf(idx, sizeof idx, "%d", layer);
            v = cart_pk_get(cart_pk_get(cart_pk_state(list), "_parameters"), idx);
        }
        cart_pt_tensor info;
        CHECK_OK(cart_pk_tensor(v, &info));
        int64_t numel = (int64_t)(t->nbytes / 4);
        CHECK(info.numel == numel && info.ndim == 4);
        float *got = malloc((size_t)numel * sizeof *got);
        CHECK_OK(cart_pt_tensor_f32(v, got, numel));
        for (int64_t j = 0; j < numel; j++) {
            float want;
            memcpy(&want, (const uint8_t *)t->data + 4 * j, 4);
            maxdiff = fmax(maxdiff, fabs((double)got[j] - want));
        }
        free(got);
        checked++;
    }
    printf("  %s: %d tensors against what PyTorch saved\n", name, checked);
    CHECK(checked >= 4);
    CHECK_MAXDIFF(name, maxdiff, 0.0);
    cart_st_close(ex);
    cart_pt_close(pt);
}

static void test_reads_the_reference_trainers_files_exactly(void) {
    check_against_expected(FIXTURES "ref-fixed-bf16.pt", "fixed");
    check_against_expected(FIXTURES "ref-frozen-f32.pt", "frozen");
    check_against_expected(FIXTURES "strided-f32.pt", "strided"); /* transposed views with an offset */
    cart_pt *pt = NULL;
    CHECK_OK(cart_pt_open(&pt, FIXTURES "ref-fixed-bf16.pt"));
    const cart_pk_value *list = cart_pk_get(cart_pt_root(pt), "trainable_keys");
    CHECK(cart_pk_class(list) && strcmp(cart_pk_class(list), "torch.nn.modules.container.ParameterList") == 0);
    CHECK(strcmp(cart_pt_archive(pt), "ref-fixed-bf16") == 0);
    cart_pt_close(pt);
}

static void test_refuses_legacy_and_code_running_files(void) {
    cart_pt *pt = NULL;
    CHECK_ERR(cart_pt_open(&pt, FIXTURES "legacy.pt"), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("legacy format");
    CHECK_ERR(cart_pt_open(&pt, FIXTURES "runs-a-command.pt"), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("posix.system");
    CHECK_ERR(cart_pt_open(&pt, FIXTURES "missing.pt"), CART_E_IO);
}

/* A .pt of one data.pkl (and optional storage entry "data/0"). */
static int open_pickle(const uint8_t *pkl, size_t n, const void *storage, size_t storage_n) {
    char path[300];
    tmp_path(path, sizeof path, "p.pt");
    cart_zip_writer *w = NULL;
    int rc = cart_zip_writer_open(&w, path);
    if (rc != CART_OK) return rc;
    cart_zip_writer_add(w, "t/data.pkl", pkl, n);
    if (storage) cart_zip_writer_add(w, "t/data/0", storage, storage_n);
    if ((rc = cart_zip_writer_commit(w)) != CART_OK) return rc;
    cart_pt *pt = NULL;
    rc = cart_pt_open(&pt, path);
    cart_pt_close(pt);
    return rc;
}

#define PICKLE(s) (const uint8_t *)(s), sizeof(s) - 1

static void test_refuses_every_code_running_opcode_and_name(void) {
    CHECK_ERR(open_pickle(PICKLE("\x80\x02" "cos\nsystem\n" "X\x02\0\0\0ls" "\x85R."), NULL, 0), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("os.system");
    CHECK_ERR(open_pickle(PICKLE("\x80\x02" "cbuiltins\neval\n."), NULL, 0), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("builtins.eval");
    CHECK_ERR(open_pickle(PICKLE("\x80\x02(ios\nsystem\n."), NULL, 0), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("INST");
    CHECK_ERR(open_pickle(PICKLE("\x80\x02(N" "o."), NULL, 0), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("OBJ");
    CHECK_ERR(open_pickle(PICKLE("\x80\x02\x82\x01."), NULL, 0), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("extension registry");
    CHECK_ERR(open_pickle(PICKLE("\x80\x02Pabc\n."), NULL, 0), CART_E_UNSUPPORTED);
    CHECK_ERR(open_pickle(PICKLE("\x80\x02I1\n."), NULL, 0), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("protocol 0");
    /* an allowed name may still not be called: a storage type */
    CHECK_ERR(open_pickle(PICKLE("\x80\x02" "ctorch\nFloatStorage\n)R."), NULL, 0), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("torch.FloatStorage");
    /* a class read as data only through NEWOBJ of the two containers */
    CHECK_ERR(open_pickle(PICKLE("\x80\x02" "ccollections\nOrderedDict\n)\x81."), NULL, 0), CART_E_UNSUPPORTED);
}

static void test_refuses_malformed_pickles_naming_the_byte(void) {
    CHECK_ERR(open_pickle(PICKLE("\x80\x02N"), NULL, 0), CART_E_FORMAT); /* no STOP */
    CHECK_ERROR_MENTIONS("without STOP");
    CHECK_ERR(open_pickle(PICKLE("\x80\x02NN."), NULL, 0), CART_E_FORMAT);
    CHECK_ERR(open_pickle(PICKLE("\x80\x02" "0."), NULL, 0), CART_E_FORMAT);
    CHECK_ERR(open_pickle(PICKLE("\x80\x02(0."), NULL, 0), CART_E_FORMAT);
    CHECK_ERR(open_pickle(PICKLE("\x80\x02h\x05."), NULL, 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("unset memo");
    CHECK_ERR(open_pickle(PICKLE("\x80\x02X\x09\0\0\0short."), NULL, 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("cut short");
    CHECK_ERR(open_pickle(PICKLE("\x80\x02X\x02\0\0\0\xff\xfe."), NULL, 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("UTF-8");
    CHECK_ERR(open_pickle(PICKLE("\x80\x02)K\x01" "a."), NULL, 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("adds to a tuple");
    CHECK_ERR(open_pickle(PICKLE("\x80\x02\xff."), NULL, 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("unknown opcode");
    CHECK_ERR(open_pickle(PICKLE("\x80\x02\x8a\x09" "123456789."), NULL, 0), CART_E_UNSUPPORTED);
    uint8_t deep[70000 + 3];
    deep[0] = 0x80, deep[1] = 2;
    memset(deep + 2, ']', 70000);
    deep[70002] = '.';
    CHECK_ERR(open_pickle(deep, sizeof deep, NULL, 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("2^16");
}

/* A pickled tensor over storage 0 of 4 floats, with size/stride/offset given. */
static int open_tensor_n(const char *size_stride_offset, size_t sso_len) {
    uint8_t buf[400];
    size_t k = 0;
    const char *head = "\x80\x02" "ctorch._utils\n_rebuild_tensor_v2\n" "((X\x07";
    memcpy(buf + k, head, strlen(head)), k += strlen(head);
    memcpy(buf + k, "\0\0\0storage", 10), k += 10;
    const char *mid = "ctorch\nFloatStorage\nX\x01";
    memcpy(buf + k, mid, strlen(mid)), k += strlen(mid);
    memcpy(buf + k, "\0\0\0" "0X\x03\0\0\0cpuK\x04tQ", 16), k += 16;
    memcpy(buf + k, size_stride_offset, sso_len), k += sso_len;
    const char *tail = "\x89" "ccollections\nOrderedDict\n)RtR.";
    memcpy(buf + k, tail, strlen(tail)), k += strlen(tail);
    float storage[4] = {1, 2, 3, 4};
    return open_pickle(buf, k, storage, sizeof storage);
}

#define open_tensor(s) open_tensor_n((s), sizeof(s) - 1)

static void test_checks_tensors_against_their_storage(void) {
    /* offset, (size), (stride) */
    CHECK_OK(open_tensor("K\x00(K\x02K\x02t(K\x02K\x01t"));
    CHECK_ERR(open_tensor("K\x01(K\x02K\x02t(K\x02K\x01t"), CART_E_FORMAT); /* offset 1 reaches element 4 */
    CHECK_ERROR_MENTIONS("past the end of its storage");
    CHECK_ERR(open_tensor("K\x00(K\x05t(K\x01t"), CART_E_FORMAT);
    CHECK_OK(open_tensor("K\x03(K\x00K\x09t(K\x01K\x01t")); /* empty: no element read */
    CHECK_ERR(open_tensor("K\x00(K\x02t(K\x01K\x01t"), CART_E_FORMAT); /* size and stride lengths differ */
}

static void test_writes_what_it_reads_back(void) {
    float a[2 * 3] = {1, 2, 3, 4, 5, 6};
    uint16_t b[4];
    CHECK_OK(cart_from_f32(b, CART_BF16, (const float[]){0.5f, -2, 3.25f, 1e-3f}, 4));
    cart_pt_out_tensor ta = {CART_F32, 2, {2, 3}, a}, tb = {CART_BF16, 3, {1, 2, 2}, b}, tz = {CART_F32, 2, {0, 3}, NULL};
    cart_pt_out_tensor first[2] = {ta, tb};
    cart_pt_out_list lists[2] = {{"first", "alias", first, 2}, {"empty", NULL, &tz, 1}};
    char path[300];
    tmp_path(path, sizeof path, "w.pt");
    CHECK_OK(cart_pt_write_lists(path, "w", lists, 2));
    cart_pt *pt = NULL;
    CHECK_OK(cart_pt_open(&pt, path));
    if (!pt) return;
    const cart_pk_value *root = cart_pt_root(pt);
    CHECK(cart_pk_len(root) == 3 && cart_pk_get(root, "alias") == cart_pk_get(root, "first"));
    float got[6];
    CHECK_OK(cart_pt_tensor_f32(cart_pk_item(cart_pk_get(root, "first"), 0), got, 6));
    CHECK(memcmp(got, a, sizeof a) == 0);
    CHECK_OK(cart_pt_tensor_f32(cart_pk_item(cart_pk_get(root, "first"), 1), got, 4));
    CHECK(got[0] == 0.5f && got[1] == -2 && got[2] == 3.25f);
    cart_pt_tensor info;
    CHECK_OK(cart_pk_tensor(cart_pk_item(cart_pk_get(root, "empty"), 0), &info));
    CHECK(info.numel == 0 && info.shape[1] == 3);
    cart_pt_close(pt);
    cart_pt_out_tensor bad = {CART_I32, 1, {1}, a};
    cart_pt_out_list bad_list = {"x", NULL, &bad, 1};
    CHECK_ERR(cart_pt_write_lists(path, "w", &bad_list, 1), CART_E_ARG);
    CHECK_ERR(cart_pt_write_lists(path, "a/b", lists, 1), CART_E_ARG);
}

/* Flipping bytes of a real file either still opens or fails with a message. */
static void test_survives_seeded_mutations_of_a_real_file(void) {
    size_t n;
    uint8_t *orig = read_all(FIXTURES "ref-fixed-bf16.pt", &n);
    if (!orig) return;
    uint8_t *b = malloc(n);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    int opened = 0, refused = 0;
    for (int round = 0; round < 3000; round++) {
        memcpy(b, orig, n);
        for (int k = 0; k < 1 + round % 4; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            b[(s >> 33) % n] ^= (uint8_t)(1u << ((s >> 20) % 8));
        }
        cart_pt *pt = NULL;
        cart_clear_error();
        int rc = cart_pt_open_memory(&pt, b, n, "mutant");
        if (rc == CART_OK) {
            opened++;
            cart_pt_close(pt);
        } else {
            refused++;
            CHECK(cart_last_error()[0] != 0);
        }
    }
    printf("  3000 mutants: %d opened, %d refused with a message\n", opened, refused);
    free(b);
    free(orig);
}

int main(void) {
    if (make_tmp_dir("cart_pt_XXXXXX") != 0) return 1;
    RUN(test_crc32_matches_the_published_check_value);
    RUN(test_zip_round_trip_aligns_every_entry_to_64_bytes);
    RUN(test_zip_refuses_damage_naming_it);
    RUN(test_zip_reads_what_pytorch_wrote);
    RUN(test_reads_the_reference_trainers_files_exactly);
    RUN(test_refuses_legacy_and_code_running_files);
    RUN(test_refuses_every_code_running_opcode_and_name);
    RUN(test_refuses_malformed_pickles_naming_the_byte);
    RUN(test_checks_tensors_against_their_storage);
    RUN(test_writes_what_it_reads_back);
    RUN(test_survives_seeded_mutations_of_a_real_file);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    return check_finish("torchpt");
}
