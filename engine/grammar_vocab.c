/*
 * grammar_vocab.c - the vocabulary's byte tries and the per-length masks of plain
 * tokens that answer inside a free string (grammar_internal.h).
 */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"
#include "internal.h"

/* ---- the vocabulary ------------------------------------------------------ */

static void trie_free(trie *t) {
    free(t->byte);
    free(t->depth);
    free(t->skip);
    free(t->tok_start);
    free(t->ids);
}

void cart_vocab_free(cart_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->offsets);
    trie_free(&v->all);
    trie_free(&v->special);
    free(v->eog);
    free(v->plain_le);
    free(v->plain_all);
    free(v->plain_long);
    free(v);
}

int64_t cart_vocab_size(const cart_vocab *v) {
    return v->n;
}

int64_t cart_vocab_mask_words(const cart_vocab *v) {
    return v->words;
}

static const cart_vocab *sort_vocab; /* qsort has no context argument */

static int compare_tokens(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    const cart_vocab *v = sort_vocab;
    int64_t la = v->offsets[a + 1] - v->offsets[a], lb = v->offsets[b + 1] - v->offsets[b];
    int c = memcmp(v->bytes + v->offsets[a], v->bytes + v->offsets[b], (size_t)(la < lb ? la : lb));
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Builds the preorder trie of ids[0..n) (sorted by bytes). */
static int trie_build(const cart_vocab *v, const int32_t *ids, int64_t n, trie *t) {
    int64_t total = 1;
    for (int64_t i = 0; i < n; i++) total += v->offsets[ids[i] + 1] - v->offsets[ids[i]];
    if (total > UINT32_MAX / 2) return cart_fail(CART_E_ARG, "vocab: the tokens hold too many bytes");
    t->byte = cart_malloc((size_t)total, "vocab");
    t->depth = cart_malloc((size_t)total * sizeof *t->depth, "vocab");
    t->skip = cart_malloc((size_t)total * sizeof *t->skip, "vocab");
    t->tok_start = cart_calloc((size_t)total + 1, sizeof *t->tok_start, "vocab");
    t->ids = cart_malloc((size_t)(n ? n : 1) * sizeof *t->ids, "vocab");
    uint32_t *path = cart_malloc(((size_t)MAX_TOKEN_BYTES + 2) * sizeof *path, "vocab");
    if (!t->byte || !t->depth || !t->skip || !t->tok_start || !t->ids || !path) {
        free(path);
        return CART_E_NOMEM;
    }
    /* path[d]: the node at depth d on the current branch */
    uint32_t nodes = 1;
    t->byte[0] = 0;
    t->depth[0] = 0;
    path[0] = 0;
    int64_t depth = 0;
    const char *prev = NULL;
    int64_t prev_len = 0;
    uint32_t *count = t->tok_start + 1; /* tokens per node, turned into starts below */
    for (int64_t i = 0; i < n; i++) {
        const char *s = v->bytes + v->offsets[ids[i]];
        int64_t len = v->offsets[ids[i] + 1] - v->offsets[ids[i]];
        int64_t common = 0;
        while (prev && common < len && common < prev_len && s[common] == prev[common]) common++;
        while (depth > common) t->skip[path[depth--]] = nodes;
        for (; depth < len;) {
            uint32_t k = nodes++;
            t->byte[k] = (uint8_t)s[depth];
            t->depth[k] = (uint16_t)(depth + 1);
            path[++depth] = k;
            if (depth > t->max_depth) t->max_depth = (uint16_t)depth;
        }
        count[path[len]]++;
        prev = s;
        prev_len = len;
    }
    while (depth > 0) t->skip[path[depth--]] = nodes;
    t->skip[0] = nodes;
    t->n = nodes;
    for (uint32_t k = 0; k < nodes; k++) t->tok_start[k + 1] += t->tok_start[k];
    /* the ids in node order: the sorted order already is node order */
    memcpy(t->ids, ids, (size_t)n * sizeof *ids);
    free(path);
    return CART_OK;
}

/* A token that a JSON string at a character boundary takes whole, adding
 * only characters: returns its code point count (an unfinished last
 * character counts), or 0 when it is not plain. */
static uint32_t plain_chars(const char *s, int64_t len) {
    uint32_t st = 0, chars = 0;
    for (int64_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        if (st == 0 && (c < 0x20 || c == '"' || c == '\\')) return 0;
        int started;
        if (!cart_gr_utf8_step(&st, c, &started)) return 0;
        chars += (uint32_t)started;
    }
    return chars;
}

static int vocab_build(cart_vocab *v, const uint8_t *eog) {
    int64_t n = v->n;
    v->words = (n + 31) / 32;
    int32_t *all = cart_malloc((size_t)(n ? n : 1) * sizeof *all, "vocab");
    int32_t *special = cart_malloc((size_t)(n ? n : 1) * sizeof *special, "vocab");
    uint32_t *chars = cart_calloc((size_t)(n ? n : 1), sizeof *chars, "vocab");
    v->eog = cart_malloc((size_t)(n ? n : 1) * sizeof *v->eog, "vocab");
    v->plain_le = cart_calloc((size_t)(PLAIN_R + 1) * (size_t)(v->words ? v->words : 1), sizeof *v->plain_le, "vocab");
    v->plain_all = cart_calloc((size_t)(v->words ? v->words : 1), sizeof *v->plain_all, "vocab");
    if (!all || !special || !chars || !v->eog || !v->plain_le || !v->plain_all) {
        free(all);
        free(special);
        free(chars);
        return CART_E_NOMEM;
    }
    int64_t n_all = 0, n_special = 0, n_long = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = v->offsets[i + 1] - v->offsets[i];
        if (eog && eog[i]) {
            v->eog[v->n_eog++] = (int32_t)i;
            continue;
        }
        if (len == 0) continue; /* control tokens: no bytes, never allowed */
        all[n_all++] = (int32_t)i;
        chars[i] = plain_chars(v->bytes + v->offsets[i], len);
        if (!chars[i]) {
            special[n_special++] = (int32_t)i;
            continue;
        }
        v->plain_all[i / 32] |= 1u << (i % 32);
        if (chars[i] > v->max_plain) v->max_plain = chars[i];
        if (chars[i] > PLAIN_R) n_long++;
        for (uint32_t r = chars[i]; r <= PLAIN_R; r++) v->plain_le[(size_t)r * v->words + i / 32] |= 1u << (i % 32);
    }
    v->plain_long = cart_malloc((size_t)(n_long ? n_long : 1) * sizeof *v->plain_long, "vocab");
    int rc = v->plain_long ? CART_OK : CART_E_NOMEM;
    for (int64_t i = 0; i < n && !rc; i++)
        if (chars[i] > PLAIN_R) v->plain_long[v->n_plain_long++] = (long_plain){(int32_t)i, chars[i]};
    /* fewest code points first (insertion order within a count) */
    for (int64_t i = 1; i < v->n_plain_long; i++) {
        long_plain x = v->plain_long[i];
        int64_t j = i;
        while (j > 0 && v->plain_long[j - 1].chars > x.chars) v->plain_long[j] = v->plain_long[j - 1], j--;
        v->plain_long[j] = x;
    }
    if (!rc) {
        sort_vocab = v;
        qsort(all, (size_t)n_all, sizeof *all, compare_tokens);
        qsort(special, (size_t)n_special, sizeof *special, compare_tokens);
        sort_vocab = NULL;
        rc = trie_build(v, all, n_all, &v->all);
        if (!rc) rc = trie_build(v, special, n_special, &v->special);
    }
    free(all);
    free(special);
    free(chars);
    return rc;
}

int cart_vocab_from_pieces(cart_vocab **out, const char *bytes, const int64_t *offsets, const uint8_t *eog,
                           int64_t n) {
    *out = NULL;
    if (n < 0 || n > INT32_MAX || !offsets || (n > 0 && offsets[0] != 0))
        return cart_fail(CART_E_ARG, "vocab: %lld tokens, or offsets that do not start at 0", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t len = offsets[i + 1] - offsets[i];
        if (len < 0 || len > MAX_TOKEN_BYTES)
            return cart_fail(CART_E_ARG, "vocab: token %lld has %lld bytes (0 to %d allowed)", (long long)i,
                             (long long)len, MAX_TOKEN_BYTES);
    }
    if (n > 0 && offsets[n] > 0 && !bytes) return cart_fail(CART_E_ARG, "vocab: no bytes");
    cart_vocab *v = cart_calloc(1, sizeof *v, "vocab");
    if (!v) return CART_E_NOMEM;
    v->n = n;
    int64_t total = n > 0 ? offsets[n] : 0;
    v->bytes = cart_malloc((size_t)(total ? total : 1), "vocab");
    v->offsets = cart_malloc(((size_t)n + 1) * sizeof *v->offsets, "vocab");
    if (!v->bytes || !v->offsets) {
        cart_vocab_free(v);
        return CART_E_NOMEM;
    }
    if (total) memcpy(v->bytes, bytes, (size_t)total);
    if (n > 0) memcpy(v->offsets, offsets, ((size_t)n + 1) * sizeof *offsets);
    else v->offsets[0] = 0;
    int rc = vocab_build(v, eog);
    if (rc) {
        cart_vocab_free(v);
        return rc;
    }
    *out = v;
    return CART_OK;
}

int cart_vocab_new(cart_vocab **out, const cart_tokenizer *tok, int64_t n_vocab) {
    *out = NULL;
    if (!tok || n_vocab < 0 || n_vocab > INT32_MAX)
        return cart_fail(CART_E_ARG, "cart_vocab_new: no tokenizer, or n_vocab %lld out of range", (long long)n_vocab);
    int64_t have = cart_tokenizer_vocab_size(tok);
    int64_t cap = 1 << 20, used = 0;
    char *bytes = cart_malloc((size_t)cap, "vocab");
    int64_t *offsets = cart_malloc(((size_t)n_vocab + 1) * sizeof *offsets, "vocab");
    uint8_t *eog = cart_calloc((size_t)(n_vocab ? n_vocab : 1), 1, "vocab");
    int rc = bytes && offsets && eog ? CART_OK : CART_E_NOMEM;
    for (int64_t i = 0; i < n_vocab && !rc; i++) {
        offsets[i] = used;
        if (i >= have) continue;
        eog[i] = cart_tokenizer_is_eog(tok, (int32_t)i) != 0;
        int64_t len = 0;
        for (;;) {
            rc = cart_tokenizer_piece(tok, (int32_t)i, 0, bytes + used, cap - used, &len);
            if (rc || len <= cap - used) break;
            while (cap - used < len) cap *= 2;
            char *b = cart_realloc(bytes, (size_t)cap, "vocab");
            if (!b) {
                rc = CART_E_NOMEM;
                break;
            }
            bytes = b;
        }
        used += len;
    }
    if (!rc) offsets[n_vocab] = used;
    if (!rc) rc = cart_vocab_from_pieces(out, bytes, offsets, eog, n_vocab);
    free(bytes);
    free(offsets);
    free(eog);
    return rc;
}
