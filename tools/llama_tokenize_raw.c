/*
 * llama_tokenize_raw.c - tokenizes one byte string (given as hex, invalid
 * UTF-8 allowed) with a prebuilt libllama, for the raw cases of
 * tools/gemma4_tokenize_fixtures.mjs, which compiles and runs it. The
 * JavaScript API of node-llama-cpp only takes valid strings; this goes
 * through llama.cpp's C API instead, vocabulary only:
 *
 *   llama_tokenize_raw MODEL.gguf PARSE_SPECIAL(0|1) HEX
 *
 * prints one JSON object: ids (llama_tokenize, add_special false),
 * pieces_hex (llama_token_to_piece, lstrip 0, special true, per id) and
 * detok_hex / detok_special_hex (llama_detokenize, remove_special false,
 * unparse_special false / true). If llama.cpp throws, the process dies and
 * the caller records the case as an error.
 *
 * Not part of the engine or its build: a peer tool, like node-llama-cpp.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level;
    (void)text;
    (void)user;
}

static void print_hex(const char *s, int n) {
    putchar('"');
    for (int i = 0; i < n; i++) printf("%02x", (unsigned char)s[i]);
    putchar('"');
}

static int from_hex(const char *hex, char *out) {
    int n = 0;
    for (; hex[0] && hex[1]; hex += 2) {
        unsigned v;
        if (sscanf(hex, "%2x", &v) != 1) return -1;
        out[n++] = (char)v;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf PARSE_SPECIAL(0|1) HEX\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    size_t hl = strlen(argv[3]);
    char *text = malloc(hl / 2 + 1);
    int n = from_hex(argv[3], text);
    if (n < 0) {
        fprintf(stderr, "bad hex\n");
        return 2;
    }
    int cap = n + 16;
    llama_token *ids = malloc(sizeof(llama_token) * (size_t)cap);
    int k = llama_tokenize(vocab, text, n, ids, cap, false, argv[2][0] == '1');
    if (k < 0) {
        cap = -k;
        ids = realloc(ids, sizeof(llama_token) * (size_t)cap);
        k = llama_tokenize(vocab, text, n, ids, cap, false, argv[2][0] == '1');
    }
    printf("{\"ids\":[");
    for (int i = 0; i < k; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("],\"pieces_hex\":[");
    char buf[1 << 16];
    for (int i = 0; i < k; i++) {
        int m = llama_token_to_piece(vocab, ids[i], buf, sizeof buf, 0, true);
        if (i) putchar(',');
        print_hex(buf, m < 0 ? 0 : m);
    }
    for (int special = 0; special < 2; special++) {
        int m = llama_detokenize(vocab, ids, k, buf, sizeof buf, false, special);
        printf(special ? ",\"detok_special_hex\":" : "],\"detok_hex\":");
        print_hex(buf, m < 0 ? 0 : m);
    }
    printf("}\n");
    free(ids);
    free(text);
    llama_model_free(model);
    return 0;
}
