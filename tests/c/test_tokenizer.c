/*
 * test_tokenizer.c - the tokenizer against llama.cpp: every string and raw
 * case of ../shared/reference/{stories260K,qwen3-tiny-realvocab-f16}.tokenize.json
 * and of tests/fixtures/gemma4/tiny-dense-gemma4vocab-f32.tokenize.json (gemma
 * 4's tokenizer kind, on the vocabulary the build writes into models/gemma4)
 * (ids, detokenized bytes, pieces), gemma 4's rules on a vocabulary built here, the synthetic 300-token vocabulary, the
 * BOS/EOS policy, special and end-of-generation tokens, the output buffer
 * protocol, small vocabularies built here for each pre-tokenizer, and
 * malformed tokenizer metadata.
 *
 * Without ../shared the tests that need its files are skipped (exit 77 when
 * everything else passed).
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "gguf.h"
#include "tokenizer.h"

#ifndef CART_SOURCE_DIR
#define CART_SOURCE_DIR "."
#endif
#ifndef CART_SHARED_DIR
#define CART_SHARED_DIR CART_SOURCE_DIR "/../shared"
#endif

static const char *STORIES = CART_SHARED_DIR "/models/stories260K.gguf";
static const char *QWEN_REAL = CART_SHARED_DIR "/reference/qwen3-tiny-realvocab-f16.gguf";
static const char *QWEN_TINY = CART_SHARED_DIR "/reference/qwen3-tiny-f32.gguf";

static char tmp_dir[256];

/* ---- helpers ------------------------------------------------------------- */

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The whole file, malloc'ed and NUL-terminated; NULL if it cannot be read. */
static char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)(n > 0 ? n : 0) + 1);
    if (p && n > 0 && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) p[n > 0 ? n : 0] = '\0';
    if (size) *size = (size_t)n;
    return p;
}

/* Opens `path` and loads its tokenizer (NULL and a failed check if not). */
static cart_tokenizer *open_tokenizer(const char *path) {
    cart_gguf *g = NULL;
    cart_tokenizer *t = NULL;
    CHECK_OK(cart_gguf_open(&g, path));
    if (!g) return NULL;
    CHECK_OK(cart_tokenizer_load(&t, g));
    cart_gguf_close(g); /* the tokenizer keeps its own copy */
    return t;
}

/* Encodes into a malloc'ed array (*n ids); NULL on failure. */
static int32_t *encode(const cart_tokenizer *t, const char *text, int64_t len, int32_t flags,
                       int64_t *n) {
    int64_t need = 0;
    *n = 0;
    if (cart_tokenizer_encode(t, text, len, flags, NULL, 0, &need) != CART_OK) return NULL;
    int32_t *ids = malloc((size_t)(need ? need : 1) * sizeof(int32_t));
    int64_t got = 0;
    if (cart_tokenizer_encode(t, text, len, flags, ids, need, &got) != CART_OK || got != need) {
        free(ids);
        return NULL;
    }
    *n = got;
    return ids;
}

/* Decodes into a malloc'ed, NUL-terminated string (*n bytes). */
static char *decode(const cart_tokenizer *t, const int32_t *ids, int64_t n_ids, int32_t flags,
                    int64_t *n) {
    int64_t need = 0;
    *n = 0;
    if (cart_tokenizer_decode(t, ids, n_ids, flags, NULL, 0, &need) != CART_OK) return NULL;
    char *s = malloc((size_t)need + 1);
    int64_t got = 0;
    if (cart_tokenizer_decode(t, ids, n_ids, flags, s, need, &got) != CART_OK || got != need) {
        free(s);
        return NULL;
    }
    s[need] = '\0';
    *n = need;
    return s;
}

static char *piece(const cart_tokenizer *t, int32_t id, int32_t flags, int64_t *n) {
    int64_t need = 0;
    *n = 0;
    if (cart_tokenizer_piece(t, id, flags, NULL, 0, &need) != CART_OK) return NULL;
    char *s = malloc((size_t)need + 1);
    int64_t got = 0;
    if (cart_tokenizer_piece(t, id, flags, s, need, &got) != CART_OK || got != need) {
        free(s);
        return NULL;
    }
    s[need] = '\0';
    *n = need;
    return s;
}

/* Hex text to bytes (malloc'ed); -1 on a malformed string. */
static int64_t from_hex(const char *hex, char **out) {
    size_t n = strlen(hex) / 2;
    char *p = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            free(p);
            return -1;
        }
        p[i] = (char)v;
    }
    p[n] = '\0';
    *out = p;
    return (int64_t)n;
}

static int bytes_equal(const char *a, int64_t an, const char *b, int64_t bn) {
    return a && an == bn && memcmp(a, b, (size_t)an) == 0;
}

/* The ids of a JSON array (malloc'ed, *n of them). */
static int32_t *json_ids(const cJSON *arr, int64_t *n) {
    int count = cJSON_GetArraySize(arr);
    int32_t *ids = malloc((size_t)(count ? count : 1) * sizeof(int32_t));
    for (int i = 0; i < count; i++) ids[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
    *n = count;
    return ids;
}

static int ids_equal(const int32_t *a, int64_t an, const int32_t *b, int64_t bn) {
    return a && an == bn && (an == 0 || memcmp(a, b, (size_t)an * sizeof(int32_t)) == 0);
}

static void print_ids(const char *label, const int32_t *ids, int64_t n) {
    fprintf(stderr, "      %s (%lld):", label, (long long)n);
    for (int64_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* ---- the llama.cpp reference files -------------------------------------- */

typedef struct ref_counts {
    int cases, raw_cases, aborted_cases, mismatches;
} ref_counts;

/* One comparison; prints the first few mismatches in full. */
static void note(ref_counts *c, int ok, const char *what, const char *label) {
    if (ok) return;
    c->mismatches++;
    if (c->mismatches <= 12) fprintf(stderr, "    mismatch: %s of case '%s'\n", what, label);
}

static void check_string_case(const cart_tokenizer *t, const cJSON *item, ref_counts *c) {
    const char *text = cJSON_GetObjectItem(item, "text")->valuestring;
    int parse = cJSON_IsTrue(cJSON_GetObjectItem(item, "parse_special"));
    const char *detok = cJSON_GetObjectItem(item, "detok")->valuestring;
    const char *detok_special = cJSON_GetObjectItem(item, "detok_special")->valuestring;
    int64_t n_ref, n_ids, n1, n2;
    int32_t *ref = json_ids(cJSON_GetObjectItem(item, "ids"), &n_ref);
    int32_t *ids =
        encode(t, text, (int64_t)strlen(text), parse ? CART_TOKENIZE_PARSE_SPECIAL : 0, &n_ids);
    int ok = ids_equal(ids, n_ids, ref, n_ref);
    note(c, ok, parse ? "ids (parse_special)" : "ids", text);
    if (!ok && c->mismatches <= 12) {
        print_ids("got     ", ids, n_ids);
        print_ids("expected", ref, n_ref);
    }
    char *d1 = decode(t, ref, n_ref, 0, &n1);
    char *d2 = decode(t, ref, n_ref, CART_TOKENIZE_UNPARSE_SPECIAL, &n2);
    note(c, bytes_equal(d1, n1, detok, (int64_t)strlen(detok)), "detok", text);
    note(c, bytes_equal(d2, n2, detok_special, (int64_t)strlen(detok_special)), "detok_special",
         text);
    c->cases++;
    free(ref);
    free(ids);
    free(d1);
    free(d2);
}

static void check_raw_case(const cart_tokenizer *t, const cJSON *item, ref_counts *c) {
    const char *label = cJSON_GetObjectItem(item, "label")->valuestring;
    int parse = cJSON_IsTrue(cJSON_GetObjectItem(item, "parse_special"));
    char *text = NULL;
    int64_t len = from_hex(cJSON_GetObjectItem(item, "hex")->valuestring, &text);
    CHECK(len >= 0);
    int32_t flags = parse ? CART_TOKENIZE_PARSE_SPECIAL : 0;
    if (cJSON_GetObjectItem(item, "error")) {
        /* llama.cpp aborted here: only ask for no crash. */
        int64_t n_ids = 0;
        int32_t *ids = encode(t, text, len, flags, &n_ids);
        printf("    '%s' (llama.cpp aborted): %s, %lld ids\n", label, ids ? "encoded" : "refused",
               (long long)n_ids);
        free(ids);
        free(text);
        c->aborted_cases++;
        return;
    }
    int64_t n_ref, n_ids, n;
    int32_t *ref = json_ids(cJSON_GetObjectItem(item, "ids"), &n_ref);
    int32_t *ids = encode(t, text, len, flags, &n_ids);
    note(c, ids_equal(ids, n_ids, ref, n_ref), "ids", label);
    const cJSON *pieces = cJSON_GetObjectItem(item, "pieces_hex");
    for (int64_t i = 0; i < n_ref; i++) {
        char *want = NULL;
        int64_t wn = from_hex(cJSON_GetArrayItem(pieces, (int)i)->valuestring, &want);
        char *got = piece(t, ref[i], CART_TOKENIZE_UNPARSE_SPECIAL, &n);
        note(c, bytes_equal(got, n, want, wn), "pieces_hex", label);
        free(want);
        free(got);
    }
    const char *keys[2] = {"detok_hex", "detok_special_hex"};
    for (int k = 0; k < 2; k++) {
        char *want = NULL;
        int64_t wn = from_hex(cJSON_GetObjectItem(item, keys[k])->valuestring, &want);
        char *got = decode(t, ref, n_ref, k ? CART_TOKENIZE_UNPARSE_SPECIAL : 0, &n);
        note(c, bytes_equal(got, n, want, wn), keys[k], label);
        free(want);
        free(got);
    }
    c->raw_cases++;
    free(ref);
    free(ids);
    free(text);
}

/* Checks every case of the tokenize-v1 fixture at `path` against the
 * tokenizer of GGUF `model`; returns the tokenizer for more checks (NULL if
 * it did not load). */
static cart_tokenizer *check_reference_path(const char *path, const char *model) {
    const char *json_name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    char *text = slurp(path, NULL);
    CHECK_MSG(text != NULL, "cannot read %s", path);
    if (!text) return NULL;
    cJSON *root = cJSON_Parse(text);
    free(text);
    CHECK_MSG(root != NULL, "%s is not JSON", path);
    cart_tokenizer *t = open_tokenizer(model);
    if (!root || !t) {
        cJSON_Delete(root);
        cart_tokenizer_free(t);
        return NULL;
    }
    ref_counts c = {0};
    const cJSON *item;
    cJSON_ArrayForEach(item, cJSON_GetObjectItem(root, "cases")) check_string_case(t, item, &c);
    cJSON_ArrayForEach(item, cJSON_GetObjectItem(root, "raw_cases")) check_raw_case(t, item, &c);
    int n_cases = cJSON_GetArraySize(cJSON_GetObjectItem(root, "cases"));
    int n_raw = cJSON_GetArraySize(cJSON_GetObjectItem(root, "raw_cases"));
    printf("  %s: %d string cases and %d raw cases checked (+%d where llama.cpp aborted); "
           "%d mismatches (tolerance 0)\n",
           json_name, c.cases, c.raw_cases, c.aborted_cases, c.mismatches);
    CHECK(c.cases == n_cases && c.raw_cases + c.aborted_cases == n_raw);
    CHECK(c.mismatches == 0);
    const cJSON *m = cJSON_GetObjectItem(root, "model");
    const cJSON *bos = cJSON_GetObjectItem(m, "bos_id"), *eos = cJSON_GetObjectItem(m, "eos_id");
    if (cJSON_IsNumber(bos)) CHECK(cart_tokenizer_bos(t) == bos->valueint);
    if (cJSON_IsNumber(eos)) CHECK(cart_tokenizer_eos(t) == eos->valueint);
    cJSON_Delete(root);
    return t;
}

static void check_reference_file(const char *json_name, const char *model) {
    char path[512];
    snprintf(path, sizeof path, "%s/reference/%s", CART_SHARED_DIR, json_name);
    cart_tokenizer_free(check_reference_path(path, model));
}

static void test_matches_llama_cpp_on_every_stories260K_case(void) {
    check_reference_file("stories260K.tokenize.json", STORIES);
}

static void test_matches_llama_cpp_on_every_qwen3_case(void) {
    check_reference_file("qwen3-tiny-realvocab-f16.tokenize.json", QWEN_REAL);
}

/* ---- the shared vocabularies --------------------------------------------- */

static void test_stories260K_adds_bos_but_not_eos(void) {
    cart_tokenizer *t = open_tokenizer(STORIES);
    if (!t) return;
    CHECK(cart_tokenizer_kind_of(t) == CART_TOKENIZER_SPM);
    CHECK(cart_tokenizer_vocab_size(t) == 512);
    CHECK(cart_tokenizer_bos(t) == 1 && cart_tokenizer_eos(t) == 2);
    CHECK(cart_tokenizer_adds_bos(t) == 1 && cart_tokenizer_adds_eos(t) == 0);
    const char *text = "Once upon a time";
    int64_t n0, n1, n;
    int32_t *plain = encode(t, text, (int64_t)strlen(text), 0, &n0);
    int32_t *with = encode(t, text, (int64_t)strlen(text), CART_TOKENIZE_ADD_SPECIAL, &n1);
    CHECK(plain && with && n1 == n0 + 1 && with[0] == 1);
    CHECK(with && plain && memcmp(with + 1, plain, (size_t)n0 * sizeof(int32_t)) == 0);
    /* "" is [] without specials and [BOS] with them. */
    int32_t *empty = encode(t, "", 0, CART_TOKENIZE_ADD_SPECIAL, &n);
    CHECK(empty && n == 1 && empty[0] == 1);
    free(empty);
    empty = encode(t, "", 0, 0, &n);
    CHECK(empty && n == 0);
    free(empty);
    /* llama_detokenize: the leading-space strip goes to the first token, the
     * (empty) BOS; removing the BOS with REMOVE_SPECIAL turns it off. Both keep
     * the space of " Once". */
    char *d = decode(t, with, n1, 0, &n);
    CHECK(d && strcmp(d, " Once upon a time") == 0);
    free(d);
    d = decode(t, with, n1, CART_TOKENIZE_REMOVE_SPECIAL, &n);
    CHECK(d && strcmp(d, " Once upon a time") == 0);
    free(d);
    d = decode(t, with, n1, CART_TOKENIZE_UNPARSE_SPECIAL, &n);
    CHECK(d && strcmp(d, "<s> Once upon a time") == 0);
    free(d);
    d = decode(t, plain, n0, 0, &n);
    CHECK(d && strcmp(d, text) == 0);
    free(d);
    free(plain);
    free(with);
    /* Token types and end of generation. */
    CHECK(cart_tokenizer_token_type(t, 0) == CART_TOKEN_UNKNOWN);
    CHECK(cart_tokenizer_token_type(t, 1) == CART_TOKEN_CONTROL);
    CHECK(cart_tokenizer_token_type(t, 3) == CART_TOKEN_BYTE);
    CHECK(cart_tokenizer_token_type(t, 300) == CART_TOKEN_NORMAL);
    CHECK(cart_tokenizer_is_eog(t, 2) && !cart_tokenizer_is_eog(t, 1));
    CHECK(cart_tokenizer_find(t, "<0x0A>", 6) == 13);
    cart_tokenizer_free(t);
}

static void test_qwen3_special_and_end_of_generation_tokens(void) {
    cart_tokenizer *t = open_tokenizer(QWEN_REAL);
    if (!t) return;
    CHECK(cart_tokenizer_kind_of(t) == CART_TOKENIZER_BPE);
    CHECK(cart_tokenizer_vocab_size(t) == 151936);
    CHECK(cart_tokenizer_bos(t) == 151643 && cart_tokenizer_eos(t) == 151645);
    CHECK(cart_tokenizer_adds_bos(t) == 0 && cart_tokenizer_adds_eos(t) == 0);
    CHECK(cart_tokenizer_find(t, "<|im_end|>", 10) == 151645);
    CHECK(cart_tokenizer_find(t, "<|im_end|> trailing", 10) == 151645);
    CHECK(cart_tokenizer_find(t, "Hello", 5) == 9707);
    CHECK(cart_tokenizer_find(t, "no-such-token-here", 18) == -1);
    CHECK(cart_tokenizer_find(t, "", 0) == -1);
    CHECK(cart_tokenizer_is_eog(t, 151645));  /* <|im_end|> */
    CHECK(cart_tokenizer_is_eog(t, 151643));  /* <|endoftext|> */
    CHECK(cart_tokenizer_is_eog(t, 128247));  /* </s>, made control by its text */
    CHECK(cart_tokenizer_is_eog(t, 151662));  /* <|fim_pad|>, llama.cpp's FIM pad rule */
    CHECK(!cart_tokenizer_is_eog(t, 151644)); /* <|im_start|> */
    CHECK(!cart_tokenizer_is_eog(t, 151667)); /* <think> */
    CHECK(!cart_tokenizer_is_eog(t, 9707));
    CHECK(!cart_tokenizer_is_eog(t, -1) && !cart_tokenizer_is_eog(t, 151936));
    CHECK(cart_tokenizer_token_type(t, 9707) == CART_TOKEN_NORMAL);
    CHECK(cart_tokenizer_token_type(t, 151644) == CART_TOKEN_CONTROL);
    CHECK(cart_tokenizer_token_type(t, 128247) == CART_TOKEN_CONTROL);
    CHECK(cart_tokenizer_token_type(t, 151657) == CART_TOKEN_USER_DEFINED);
    CHECK(cart_tokenizer_token_type(t, 151669) == CART_TOKEN_UNUSED);
    CHECK(cart_tokenizer_token_type(t, 151936) == CART_TOKEN_UNDEFINED);
    cart_str s = cart_tokenizer_text(t, 151645);
    CHECK(s.len == 10 && memcmp(s.data, "<|im_end|>", 10) == 0);
    s = cart_tokenizer_text(t, -5);
    CHECK(s.len == 0 && s.data != NULL);
    /* The chat prompt of the README, special tokens parsed. */
    const char *chat =
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "What is a cartridge?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    static const int32_t want[] = {151644, 8948,  198,    2610,   525,    264,    10950,
                                   17847,  13,    151645, 198,    151644, 872,    198,
                                   3838,   374,   264,    50862,  30,     151645, 198,
                                   151644, 77091, 198,    151667, 271,    151668, 271};
    int64_t n;
    int32_t *ids = encode(t, chat, (int64_t)strlen(chat), CART_TOKENIZE_PARSE_SPECIAL, &n);
    CHECK(ids_equal(ids, n, want, (int64_t)(sizeof want / sizeof want[0])));
    free(ids);
    /* An unused token and a control one render as nothing without unparse. */
    char *p = piece(t, 151669, CART_TOKENIZE_UNPARSE_SPECIAL, &n);
    CHECK(p && n == 0);
    free(p);
    p = piece(t, 151645, 0, &n);
    CHECK(p && n == 0);
    free(p);
    p = piece(t, 151667, 0, &n); /* user-defined: always its text */
    CHECK(p && strcmp(p, "<think>") == 0);
    free(p);
    cart_tokenizer_free(t);
}

/* GPT-2's bytes_to_unicode, written out again for the check. */
static int byte_symbol_utf8(int b, char out[3]) {
    int cp;
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) {
        cp = b;
    } else {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static void test_synthetic_vocab_has_bytes_merges_and_specials(void) {
    cart_tokenizer *t = open_tokenizer(QWEN_TINY);
    if (!t) return;
    CHECK(cart_tokenizer_vocab_size(t) == 300);
    CHECK(cart_tokenizer_bos(t) == 297 && cart_tokenizer_eos(t) == 299);
    CHECK(cart_tokenizer_adds_bos(t) == 0);
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        char sym[3];
        int len = byte_symbol_utf8(b, sym);
        cart_str s = cart_tokenizer_text(t, b);
        if (s.len != (uint64_t)len || memcmp(s.data, sym, (size_t)len) != 0) bad++;
        int64_t n;
        char *p = piece(t, b, 0, &n);
        if (!p || n != 1 || (uint8_t)p[0] != b) bad++;
        free(p);
        if (b < 0x80) { /* one ASCII byte alone is its own id */
            char c = (char)b;
            int32_t *ids = encode(t, &c, 1, 0, &n);
            if (!ids || n != 1 || ids[0] != b) bad++;
            free(ids);
        }
    }
    CHECK_MSG(bad == 0, "%d byte tokens wrong", bad);
    for (int32_t id = 297; id <= 299; id++)
        CHECK(cart_tokenizer_token_type(t, id) == CART_TOKEN_CONTROL);
    CHECK(cart_tokenizer_is_eog(t, 299) && cart_tokenizer_is_eog(t, 297));
    /* Merges "Ġ t", "h e", "Ġt he" make " the" one token. */
    int32_t the = cart_tokenizer_find(t, "\xc4\xa0the", 5);
    CHECK(the >= 256 && the < 297);
    int64_t n;
    int32_t *ids = encode(t, " the", 4, 0, &n);
    CHECK(ids && n == 1 && ids[0] == the);
    free(ids);
    const char *chat = "<|im_start|>user\nhi<|im_end|>";
    ids = encode(t, chat, (int64_t)strlen(chat), CART_TOKENIZE_PARSE_SPECIAL, &n);
    CHECK(ids && n >= 3 && ids[0] == 298 && ids[n - 1] == 299);
    free(ids);
    ids = encode(t, chat, (int64_t)strlen(chat), 0, &n);
    int found = 0;
    for (int64_t i = 0; ids && i < n; i++) found |= ids[i] >= 297;
    CHECK(ids && !found);
    char *d = decode(t, ids, n, 0, &n);
    CHECK(d && strcmp(d, chat) == 0);
    free(d);
    free(ids);
    int32_t sp = 298;
    d = decode(t, &sp, 1, 0, &n);
    CHECK(d && n == 0);
    free(d);
    d = decode(t, &sp, 1, CART_TOKENIZE_UNPARSE_SPECIAL, &n);
    CHECK(d && strcmp(d, "<|im_start|>") == 0);
    free(d);
    cart_tokenizer_free(t);
}

static void test_reports_full_counts_when_buffers_are_too_small(void) {
    cart_tokenizer *t = open_tokenizer(QWEN_REAL);
    if (!t) return;
    const char *text = "The quick brown fox jumps over the lazy dog.";
    int64_t full = 0, n = -1;
    CHECK_OK(cart_tokenizer_encode(t, text, (int64_t)strlen(text), 0, NULL, 0, &full));
    CHECK(full == 10);
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = -7;
    CHECK_OK(cart_tokenizer_encode(t, text, (int64_t)strlen(text), 0, ids, 3, &n));
    CHECK(n == 10 && ids[0] == 785 && ids[1] == 3974 && ids[2] == 13876 && ids[3] == -7);
    char buf[8];
    memset(buf, '#', sizeof buf);
    CHECK_OK(cart_tokenizer_decode(t, ids, 3, 0, buf, 4, &n));
    CHECK(n == 15 && memcmp(buf, "The ", 4) == 0 && buf[4] == '#');
    memset(buf, '#', sizeof buf);
    CHECK_OK(cart_tokenizer_piece(t, 151645, CART_TOKENIZE_UNPARSE_SPECIAL, buf, 2, &n));
    CHECK(n == 10 && memcmp(buf, "<|", 2) == 0 && buf[2] == '#');
    CHECK_ERR(cart_tokenizer_piece(t, 151936, 0, buf, 8, &n), CART_E_ARG);
    int32_t bad = -3;
    CHECK_ERR(cart_tokenizer_decode(t, &bad, 1, 0, buf, 8, &n), CART_E_ARG);
    CHECK_ERR(cart_tokenizer_encode(t, NULL, 5, 0, ids, 12, &n), CART_E_ARG);
    CHECK_ERR(cart_tokenizer_encode(t, text, 4, 0, NULL, 3, &n), CART_E_ARG);
    cart_tokenizer_free(t);
}

/* Load time and encode speed, printed for the record; the bounds are loose
 * enough for sanitizer builds. */
static void test_loads_the_qwen3_vocabulary_and_encodes_quickly(void) {
    cart_gguf *g = NULL;
    CHECK_OK(cart_gguf_open(&g, QWEN_REAL));
    if (!g) return;
    cart_tokenizer *t = NULL;
    double t0 = now_ms();
    CHECK_OK(cart_tokenizer_load(&t, g));
    double load_ms = now_ms() - t0;
    cart_gguf_close(g);
    if (!t) return;
    printf("  loaded 151936 tokens and 151387 merges in %.1f ms\n", load_ms);
    CHECK(load_ms < 2000);
    const char *para =
        "Once upon a time, there was a little girl named Lily. She loved to play "
        "outside in the park with her dog, Max. One day, they found a shiny red ball "
        "under a big oak tree; it was 12 inches wide and cost $3.50!\n\n";
    size_t plen = strlen(para), total = 0, reps = (2u << 20) / plen;
    char *big = malloc(reps * plen + 1);
    for (size_t i = 0; i < reps; i++, total += plen) memcpy(big + total, para, plen);
    int64_t n = 0;
    t0 = now_ms();
    CHECK_OK(cart_tokenizer_encode(t, big, (int64_t)total, 0, NULL, 0, &n));
    double ms = now_ms() - t0;
    printf("  encoded %.2f MB of English into %lld tokens in %.1f ms: %.1f MB/s\n", total / 1e6,
           (long long)n, ms, total / 1e3 / ms);
    CHECK(n > 0 && total / 1e3 / ms > 0.1);
    free(big);
    cart_tokenizer_free(t);
}

/* ---- vocabularies built here --------------------------------------------- */

/* An empty merge list. */
static const char *const NO_MERGES[1] = {NULL};

/* Writes a GGUF with tokenizer metadata to the temp dir. `model` / `pre` may
 * be NULL (left out). The vocabulary: the 256 GPT-2 byte symbols, then
 * extra[], then "<|end|>" (CONTROL). */
static const char *write_vocab(const char *name, const char *model, const char *pre,
                               const char *const *extra, int n_extra, const char *const *merges,
                               int n_merges) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    int n = 256 + n_extra + 1;
    char **tokens = calloc((size_t)n, sizeof(char *));
    int32_t *types = calloc((size_t)n, sizeof(int32_t));
    for (int b = 0; b < 256; b++) {
        tokens[b] = calloc(3, 1);
        byte_symbol_utf8(b, tokens[b]);
        types[b] = CART_TOKEN_NORMAL;
    }
    for (int i = 0; i < n_extra; i++) {
        tokens[256 + i] = strdup(extra[i]);
        types[256 + i] = CART_TOKEN_NORMAL;
    }
    tokens[n - 1] = strdup("<|end|>");
    types[n - 1] = CART_TOKEN_CONTROL;
    cart_gguf_writer *w = NULL;
    CHECK_OK(cart_gguf_writer_new(&w));
    if (model) CHECK_OK(cart_gguf_writer_set_str(w, "tokenizer.ggml.model", model));
    if (pre) CHECK_OK(cart_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre));
    CHECK_OK(cart_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)tokens,
                                            (uint64_t)n));
    CHECK_OK(cart_gguf_writer_set_array(w, "tokenizer.ggml.token_type", CART_GGUF_INT32, types,
                                        (uint64_t)n));
    if (merges) /* NULL: no merges key at all */
        CHECK_OK(
            cart_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", merges, (uint64_t)n_merges));
    CHECK_OK(cart_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(n - 1)));
    CHECK_OK(cart_gguf_writer_write(w, path));
    cart_gguf_writer_free(w);
    for (int i = 0; i < n; i++) free(tokens[i]);
    free(tokens);
    free(types);
    return path;
}

/* Loads `path` expecting `status` (CART_OK: returns the tokenizer). */
static cart_tokenizer *load_expect(const char *path, int status, const char *mention) {
    cart_gguf *g = NULL;
    cart_tokenizer *t = NULL;
    CHECK_OK(cart_gguf_open(&g, path));
    if (!g) return NULL;
    if (status == CART_OK) {
        CHECK_OK(cart_tokenizer_load(&t, g));
    } else {
        CHECK_ERR(cart_tokenizer_load(&t, g), status);
        CHECK(t == NULL);
        if (mention) CHECK_ERROR_MENTIONS(mention);
    }
    cart_gguf_close(g);
    return t;
}

static void expect_ids(cart_tokenizer *t, const char *text, const int32_t *want, int64_t n_want) {
    int64_t n;
    int32_t *ids = encode(t, text, (int64_t)strlen(text), 0, &n);
    int ok = ids_equal(ids, n, want, n_want);
    CHECK_MSG(ok, "encoding '%s'", text);
    if (!ok) {
        print_ids("got     ", ids, n);
        print_ids("expected", want, n_want);
    }
    free(ids);
}

static void test_splits_numbers_as_each_pre_tokenizer_does(void) {
    /* extra ids: 256 "34", 257 "12", 258 "123"; "3 4" ranks before "1 2". */
    static const char *const extra[] = {"34", "12", "123"};
    static const char *const merges[] = {"3 4", "1 2", "12 3"};
    struct {
        const char *pre;
        int32_t want[4];
        int n;
    } cases[] = {
        {NULL, {258, '4'}, 2}, /* default: [0-9]{3} groups, then merges */
        {"default", {258, '4'}, 2},
        {"gpt-2", {257, 256}, 2},           /* one word "1234": "34" merges first */
        {"llama-bpe", {258, '4'}, 2},       /* \p{N}{1,3} */
        {"qwen2", {'1', '2', '3', '4'}, 4}, /* one digit per word */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = write_vocab("digits.gguf", "gpt2", cases[i].pre, extra, 3, merges, 3);
        cart_tokenizer *t = load_expect(path, CART_OK, NULL);
        if (!t) continue;
        printf("  pre-tokenizer %s\n", cases[i].pre ? cases[i].pre : "(absent)");
        expect_ids(t, "1234", cases[i].want, cases[i].n);
        if (cases[i].pre && strcmp(cases[i].pre, "llama-bpe") == 0)
            CHECK(cart_tokenizer_adds_bos(t) == 1 && cart_tokenizer_bos(t) == 11);
        else
            CHECK(cart_tokenizer_adds_bos(t) == 0);
        cart_tokenizer_free(t);
    }
}

static void test_applies_clean_spaces_except_for_qwen2(void) {
    int32_t ids[] = {'x', ' ', '.'}; /* in these vocabularies id b is byte b's symbol */
    const char *pres[] = {"default", "qwen2"};
    const char *want[] = {"x.", "x ."};
    for (int i = 0; i < 2; i++) {
        const char *path = write_vocab("clean.gguf", "gpt2", pres[i], NULL, 0, NO_MERGES, 0);
        cart_tokenizer *t = load_expect(path, CART_OK, NULL);
        if (!t) continue;
        int64_t n;
        char *d = decode(t, ids, 3, 0, &n);
        CHECK_MSG(d && strcmp(d, want[i]) == 0, "%s: got '%s'", pres[i], d ? d : "(null)");
        free(d);
        cart_tokenizer_free(t);
    }
}

static void test_rejects_malformed_tokenizer_metadata(void) {
    static const char *const merges[] = {"3 4"};
    const char *path;
    cart_tokenizer *t;

    path = write_vocab("nomodel.gguf", NULL, NULL, NULL, 0, merges, 1);
    load_expect(path, CART_E_NOT_FOUND, "tokenizer.ggml.model");

    path = write_vocab("unknown.gguf", "wordpiece", NULL, NULL, 0, merges, 1);
    load_expect(path, CART_E_UNSUPPORTED, "'wordpiece'");
    CHECK_ERROR_MENTIONS("'gpt2'");
    CHECK_ERROR_MENTIONS("'gemma4'");
    CHECK_ERROR_MENTIONS("'llama'");

    path = write_vocab("unknownpre.gguf", "gpt2", "klingon", NULL, 0, merges, 1);
    load_expect(path, CART_E_UNSUPPORTED, "'klingon'");
    CHECK_ERROR_MENTIONS("qwen2");

    path = write_vocab("nomerges.gguf", "gpt2", "qwen2", NULL, 0, NULL, 0);
    load_expect(path, CART_E_NOT_FOUND, "tokenizer.ggml.merges");

    /* merges that are not strings */
    cart_gguf_writer *w = NULL;
    char mpath[512];
    snprintf(mpath, sizeof mpath, "%s/intmerges.gguf", tmp_dir);
    static const char *const toks[] = {"a", "b", "ab"};
    int32_t nums[3] = {1, 2, 3};
    CHECK_OK(cart_gguf_writer_new(&w));
    CHECK_OK(cart_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"));
    CHECK_OK(cart_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", toks, 3));
    CHECK_OK(cart_gguf_writer_set_array(w, "tokenizer.ggml.merges", CART_GGUF_INT32, nums, 3));
    CHECK_OK(cart_gguf_writer_write(w, mpath));
    load_expect(mpath, CART_E_FORMAT, "tokenizer.ggml.merges");

    /* no tokens at all */
    cart_gguf_writer_remove(w, "tokenizer.ggml.tokens");
    CHECK_OK(cart_gguf_writer_write(w, mpath));
    load_expect(mpath, CART_E_NOT_FOUND, "tokenizer.ggml.tokens");

    /* tokens that are not strings */
    CHECK_OK(cart_gguf_writer_set_array(w, "tokenizer.ggml.tokens", CART_GGUF_INT32, nums, 3));
    CHECK_OK(cart_gguf_writer_write(w, mpath));
    load_expect(mpath, CART_E_FORMAT, "tokenizer.ggml.tokens");

    /* token types: too few, or not int32 */
    CHECK_OK(cart_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", toks, 3));
    static const char *const ab[] = {"a b"};
    CHECK_OK(cart_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", ab, 1));
    CHECK_OK(cart_gguf_writer_set_array(w, "tokenizer.ggml.token_type", CART_GGUF_INT32, nums, 2));
    CHECK_OK(cart_gguf_writer_write(w, mpath));
    load_expect(mpath, CART_E_FORMAT, "tokenizer.ggml.token_type");
    float fl[3] = {1, 1, 1};
    CHECK_OK(cart_gguf_writer_set_array(w, "tokenizer.ggml.token_type", CART_GGUF_FLOAT32, fl, 3));
    CHECK_OK(cart_gguf_writer_write(w, mpath));
    load_expect(mpath, CART_E_FORMAT, "tokenizer.ggml.token_type");
    cart_gguf_writer_remove(w, "tokenizer.ggml.token_type");

    /* a bos id of the wrong type; add_bos without a bos token */
    CHECK_OK(cart_gguf_writer_set_str(w, "tokenizer.ggml.bos_token_id", "zero"));
    CHECK_OK(cart_gguf_writer_write(w, mpath));
    load_expect(mpath, CART_E_FORMAT, "tokenizer.ggml.bos_token_id");
    cart_gguf_writer_remove(w, "tokenizer.ggml.bos_token_id");
    CHECK_OK(cart_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1));
    CHECK_OK(cart_gguf_writer_write(w, mpath)); /* gpt2's default bos 11 is outside 3 tokens */
    load_expect(mpath, CART_E_FORMAT, "add_bos_token");
    cart_gguf_writer_remove(w, "tokenizer.ggml.add_bos_token");

    /* this small vocabulary loads and merges "a b" */
    CHECK_OK(cart_gguf_writer_write(w, mpath));
    t = load_expect(mpath, CART_OK, NULL);
    if (t) {
        int32_t want[] = {2};
        expect_ids(t, "ab", want, 1);
        CHECK(cart_tokenizer_bos(t) == -1 && cart_tokenizer_eos(t) == -1);
        cart_tokenizer_free(t);
    }

    /* duplicate tokens */
    static const char *const dup[] = {"a", "b", "a"};
    CHECK_OK(cart_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", dup, 3));
    CHECK_OK(cart_gguf_writer_write(w, mpath));
    load_expect(mpath, CART_E_FORMAT, "duplicate");
    cart_gguf_writer_free(w);
}

/* A small SentencePiece vocabulary: <unk> <s> </s>, the 256 <0xNN> byte
 * tokens, then extra[] with their scores. */
static const char *write_spm_vocab(const char *name, const char *const *extra, const float *scores,
                                   int n_extra) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    int n = 3 + 256 + n_extra;
    char **tokens = calloc((size_t)n, sizeof(char *));
    float *sc = calloc((size_t)n, sizeof(float));
    int32_t *types = calloc((size_t)n, sizeof(int32_t));
    tokens[0] = strdup("<unk>");
    tokens[1] = strdup("<s>");
    tokens[2] = strdup("</s>");
    types[0] = CART_TOKEN_UNKNOWN;
    types[1] = types[2] = CART_TOKEN_CONTROL;
    for (int b = 0; b < 256; b++) {
        tokens[3 + b] = malloc(7);
        snprintf(tokens[3 + b], 7, "<0x%02X>", b);
        types[3 + b] = CART_TOKEN_BYTE;
    }
    for (int i = 0; i < n_extra; i++) {
        tokens[259 + i] = strdup(extra[i]);
        sc[259 + i] = scores[i];
        types[259 + i] = CART_TOKEN_NORMAL;
    }
    cart_gguf_writer *w = NULL;
    CHECK_OK(cart_gguf_writer_new(&w));
    CHECK_OK(cart_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    CHECK_OK(cart_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)tokens,
                                            (uint64_t)n));
    CHECK_OK(
        cart_gguf_writer_set_array(w, "tokenizer.ggml.scores", CART_GGUF_FLOAT32, sc, (uint64_t)n));
    CHECK_OK(cart_gguf_writer_set_array(w, "tokenizer.ggml.token_type", CART_GGUF_INT32, types,
                                        (uint64_t)n));
    CHECK_OK(cart_gguf_writer_write(w, path));
    cart_gguf_writer_free(w);
    for (int i = 0; i < n; i++) free(tokens[i]);
    free(tokens);
    free(sc);
    free(types);
    return path;
}

static void test_merges_sentencepiece_across_spaces_when_the_vocabulary_allows(void) {
    /* ids 259.. : "\u2581", "a", "b", "\u2581a", "\u2581b", "a\u2581b". With
     * "a\u2581b" in the vocabulary a token can span the start of a space,
     * so the text is merged as one (llama.cpp's way): "\u2581b" (score -1)
     * goes first, then "a\u2581b" (-1.5) beats "\u2581a" (-2). */
    static const char *const extra[] = {"\xe2\x96\x81",
                                        "a",
                                        "b",
                                        "\xe2\x96\x81"
                                        "a",
                                        "\xe2\x96\x81"
                                        "b",
                                        "a\xe2\x96\x81"
                                        "b"};
    static const float scores[] = {-5, -6, -6, -2, -1, -1.5f};
    const char *path = write_spm_vocab("spm_span.gguf", extra, scores, 6);
    cart_tokenizer *t = load_expect(path, CART_OK, NULL);
    if (t) {
        int32_t want[] = {259, 264};
        expect_ids(t, "a b", want, 2);
        int32_t want2[] = {259, 264, 262}; /* a word at a time would give 262 263 262 */
        expect_ids(t, "a b a", want2, 3);
        cart_tokenizer_free(t);
    }
    /* Without "a\u2581b", words merge one at a time: the same ids as the whole. */
    path = write_spm_vocab("spm_words.gguf", extra, scores, 5);
    t = load_expect(path, CART_OK, NULL);
    if (t) {
        int32_t want[] = {262, 263};
        expect_ids(t, "a b", want, 2);
        int32_t want2[] = {262, 259, 259, 263, 3 + '\n', 262}; /* "  " has no token */
        expect_ids(t, "a   b\n a", want2, 6);
        cart_tokenizer_free(t);
    }
}

static void test_survives_hostile_text(void) {
    /* Every byte value, long runs, nothing but specials: no crash, and the
     * decode of a valid text gives it back. */
    const char *path = write_vocab("hostile.gguf", "gpt2", "qwen2", NULL, 0, NO_MERGES, 0);
    cart_tokenizer *t = load_expect(path, CART_OK, NULL);
    if (!t) return;
    char all[512];
    for (int i = 0; i < 512; i++) all[i] = (char)(i * 7 + 3);
    int64_t n;
    int32_t *ids = encode(t, all, 512, CART_TOKENIZE_PARSE_SPECIAL, &n);
    CHECK(ids && n >= 512);
    free(ids);
    size_t big = 1 << 16;
    char *run = malloc(big);
    memset(run, ' ', big);
    ids = encode(t, run, (int64_t)big, 0, &n);
    CHECK(ids && n == (int64_t)big); /* no merges: one token per byte */
    free(ids);
    memset(run, '7', big);
    ids = encode(t, run, (int64_t)big, 0, &n);
    CHECK(ids && n == (int64_t)big);
    free(ids);
    free(run);
    const char *specials = "<|end|><|end|><|end|>";
    ids = encode(t, specials, (int64_t)strlen(specials), CART_TOKENIZE_PARSE_SPECIAL, &n);
    CHECK(ids && n == 3 && ids[0] == 256 && ids[2] == 256);
    free(ids);
    const char *text = "Grüße, 世界! 🙂 tab\there\r\n  end  ";
    ids = encode(t, text, (int64_t)strlen(text), 0, &n);
    char *d = decode(t, ids, n, 0, &n);
    CHECK(d && strcmp(d, text) == 0);
    free(d);
    free(ids);
    cart_tokenizer_free(t);
}

/* ---- gemma 4's tokenizer kind ------------------------------------------ */

/* A small gemma4 vocabulary: 0 <bos>, 1 <eos> (CONTROL), 2..257 the <0xNN>
 * byte tokens, then 258 "\u2581", 259 "a", 260 "b", 261 "\u2581a",
 * 262 "\n", 263 "\n\n", 264 "ab", 265 "\u2581ab"; merges (by rank) "\u2581 a",
 * "a b", "\u2581a b" and "\n \n". `model` "gemma4" or "gpt2" (then with pre
 * "gemma4"); has_bos: write bos_token_id 0. add_bos_token is written false. */
static const char *write_gemma4_vocab(const char *model, int has_bos) {
    static char path[512];
    snprintf(path, sizeof path, "%s/gemma4.gguf", tmp_dir);
    enum { N = 266 };
    char *tokens[N];
    int32_t types[N];
    tokens[0] = strdup("<bos>");
    tokens[1] = strdup("<eos>");
    types[0] = types[1] = CART_TOKEN_CONTROL;
    for (int b = 0; b < 256; b++) {
        tokens[2 + b] = malloc(7);
        snprintf(tokens[2 + b], 7, "<0x%02X>", b);
        types[2 + b] = CART_TOKEN_BYTE;
    }
    static const char *const extra[] = {"\xe2\x96\x81", "a",  "b", "\xe2\x96\x81"
                                                             "a",
                                        "\n",           "\n\n", "ab", "\xe2\x96\x81"
                                                                      "ab"};
    for (int i = 0; i < 8; i++) {
        tokens[258 + i] = strdup(extra[i]);
        types[258 + i] = CART_TOKEN_NORMAL;
    }
    static const char *const merges[] = {"\xe2\x96\x81 a", "a b",
                                         "\xe2\x96\x81"
                                         "a b",
                                         "\n \n"};
    cart_gguf_writer *w = NULL;
    CHECK_OK(cart_gguf_writer_new(&w));
    CHECK_OK(cart_gguf_writer_set_str(w, "tokenizer.ggml.model", model));
    if (strcmp(model, "gpt2") == 0)
        CHECK_OK(cart_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gemma4"));
    CHECK_OK(cart_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)tokens,
                                            N));
    CHECK_OK(cart_gguf_writer_set_array(w, "tokenizer.ggml.token_type", CART_GGUF_INT32, types, N));
    CHECK_OK(cart_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", merges, 4));
    if (has_bos) CHECK_OK(cart_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0));
    CHECK_OK(cart_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 1));
    CHECK_OK(cart_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 0));
    CHECK_OK(cart_gguf_writer_write(w, path));
    cart_gguf_writer_free(w);
    for (int i = 0; i < N; i++) free(tokens[i]);
    return path;
}

static void test_gemma4_escapes_spaces_merges_characters_and_falls_back_to_bytes(void) {
    const char *models[] = {"gemma4", "gpt2"};
    for (int k = 0; k < 2; k++) {
        cart_tokenizer *t = load_expect(write_gemma4_vocab(models[k], 1), CART_OK, NULL);
        if (!t) continue;
        printf("  tokenizer.ggml.model %s%s\n", models[k], k ? " with pre gemma4" : "");
        CHECK(cart_tokenizer_kind_of(t) == CART_TOKENIZER_BPE);
        CHECK(cart_tokenizer_adds_bos(t) == 1 && cart_tokenizer_bos(t) == 0); /* forced on */
        int32_t sp_ab[] = {265}, ab[] = {264}, a_b[] = {261, 258, 258, 260};
        int32_t nl2[] = {263}, nl3[] = {263, 262};
        expect_ids(t, " ab", sp_ab, 1);  /* "\u2581 a" ranks before "a b", then "\u2581a b" */
        expect_ids(t, "ab", ab, 1);
        expect_ids(t, " a  b", a_b, 4); /* no merge "\u2581 \u2581" nor "\u2581 b" */
        expect_ids(t, "\n\n", nl2, 1);  /* a newline word that is a token */
        expect_ids(t, "\n\n\n", nl3, 2); /* not a token: merged "\n \n" */
        int32_t c[] = {2 + 'c'}, e_acute[] = {2 + 0xC3, 2 + 0xA9}, bad[] = {2 + 0xEF, 2 + 0xBF, 2 + 0xBD};
        expect_ids(t, "c", c, 1);            /* no token: its <0xNN> */
        expect_ids(t, "\xc3\xa9", e_acute, 2); /* each byte of the character */
        expect_ids(t, "\xff", bad, 3);        /* invalid: U+FFFD's bytes */
        int32_t nl_word[] = {259, 263, 262, 259}; /* "\n\n\n" is a word of its own */
        expect_ids(t, "a\n\n\na", nl_word, 4);
        int32_t ids[] = {258, 264, 2 + 'c', 2 + 0xC3, 2 + 0xA9, 0};
        int64_t n;
        char *d = decode(t, ids, 6, 0, &n);
        CHECK_MSG(d && strcmp(d, " abc\xc3\xa9") == 0, "decode: got '%s'", d ? d : "(null)");
        free(d);
        d = decode(t, ids, 6, CART_TOKENIZE_UNPARSE_SPECIAL, &n);
        CHECK_MSG(d && strcmp(d, " abc\xc3\xa9<bos>") == 0, "decode: got '%s'", d ? d : "(null)");
        free(d);
        cart_tokenizer_free(t);
    }
    /* gemma4 always adds BOS: without a bos token the vocabulary is refused */
    load_expect(write_gemma4_vocab("gemma4", 0), CART_E_FORMAT, "bos_token_id");
    CHECK_ERROR_MENTIONS("always adds a BOS");
}

static const char *GEMMA4_MODEL = CART_SOURCE_DIR "/models/gemma4/tiny-dense-gemma4vocab-f32.gguf";
static const char *GEMMA4_FIXTURE =
    CART_SOURCE_DIR "/tests/fixtures/gemma4/tiny-dense-gemma4vocab-f32.tokenize.json";

static void test_matches_llama_cpp_on_the_gemma4_vocabulary(void) {
    cart_tokenizer *t = check_reference_path(GEMMA4_FIXTURE, GEMMA4_MODEL);
    if (!t) return;
    CHECK(cart_tokenizer_adds_bos(t) == 1 && cart_tokenizer_adds_eos(t) == 0);
    const char *eog[] = {"<eos>", "<turn|>", "<|tool_response>"};
    for (int i = 0; i < 3; i++) {
        int32_t id = cart_tokenizer_find(t, eog[i], (int64_t)strlen(eog[i]));
        CHECK_MSG(id >= 0 && cart_tokenizer_is_eog(t, id), "%s ends generation", eog[i]);
    }
    cart_tokenizer_free(t);
}

static void remove_tmp_dir(void) {
    const char *names[] = {"digits.gguf",     "clean.gguf",    "nomodel.gguf",   "unknown.gguf",
                           "unknownpre.gguf", "nomerges.gguf", "intmerges.gguf", "hostile.gguf",
                           "spm_span.gguf",   "spm_words.gguf", "gemma4.gguf"};
    char path[512];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", tmp_dir, names[i]);
        unlink(path);
    }
    rmdir(tmp_dir);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/cart_test_tokenizer.XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_splits_numbers_as_each_pre_tokenizer_does);
    RUN(test_applies_clean_spaces_except_for_qwen2);
    RUN(test_rejects_malformed_tokenizer_metadata);
    RUN(test_merges_sentencepiece_across_spaces_when_the_vocabulary_allows);
    RUN(test_survives_hostile_text);
    RUN(test_gemma4_escapes_spaces_merges_characters_and_falls_back_to_bytes);
    remove_tmp_dir();
    if (file_exists(GEMMA4_MODEL))
        RUN(test_matches_llama_cpp_on_the_gemma4_vocabulary);
    else
        printf("skipped: %s is absent (the build writes it)\n", GEMMA4_MODEL);

    int shared = file_exists(STORIES) && file_exists(QWEN_REAL) && file_exists(QWEN_TINY);
    if (!shared) {
        printf("skipped: the llama.cpp reference tests need %s/reference and %s/models "
               "(../shared is absent)\n",
               CART_SHARED_DIR, CART_SHARED_DIR);
        int rc = check_finish("tokenizer");
        return rc ? rc : CHECK_SKIP;
    }
    RUN(test_matches_llama_cpp_on_every_stories260K_case);
    RUN(test_matches_llama_cpp_on_every_qwen3_case);
    RUN(test_stories260K_adds_bos_but_not_eos);
    RUN(test_qwen3_special_and_end_of_generation_tokens);
    RUN(test_synthetic_vocab_has_bytes_merges_and_specials);
    RUN(test_reports_full_counts_when_buffers_are_too_small);
    RUN(test_loads_the_qwen3_vocabulary_and_encodes_quickly);
    return check_finish("tokenizer");
}
