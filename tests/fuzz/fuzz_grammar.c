/*
 * fuzz_grammar.c - libFuzzer target for the structured-output grammar
 * (engine/grammar.h): the JSON Schema compiler and the matcher.
 *
 * An input is
 *   byte 0     bit 0: compile leniently; bit 1: use the json_object grammar
 *              (the schema text is ignored); bits 2-4: check the mask every
 *              1 + n bytes; bits 5-7: seed of the random walk at the end
 *   then       a JSON Schema text, up to the first NUL byte
 *   then       bytes fed to the matcher as a document
 *
 * Checked besides "no crash, no sanitizer report, no leak":
 *   - a schema is compiled or refused with CART_E_FORMAT, _UNSUPPORTED or
 *     _NOMEM, a message and no grammar;
 *   - the mask equals the brute force (each token's bytes tried with
 *     cart_matcher_try_bytes; the end token when the document can end), and
 *     its count is the number of bits;
 *   - no dead end: while the document is not done, some token is allowed
 *     (the vocabulary has every byte and an end token);
 *   - try_bytes agrees with accept_bytes, a refused byte leaves the matcher
 *     as it was, and cart_matcher_bytes counts what was accepted;
 *   - a bounded grammar never accepts more than cart_grammar_max_bytes;
 *   - a walk of allowed tokens from there is accepted token by token.
 */
#include <string.h>

#include "common.h"
#include "grammar.h"
#include "fuzz_common.h"

enum { MAX_DOC = 4096, MAX_BRUTE = 3, WALK = 16 };

static const char *const PIECES[] = {
    "{\"", "\"}", "\":", "\": ", "\",", " \"", "\n  ", "true", "false", "null", "12", "-1", "0.", ".5", "e+",
    "\\\"", "\\u", "00e9", "\xC3\xA9", "\xC3", "\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "abc", "[{\"", "}]",
    "\"]", "},{\"", ", ", "\"\"", "[]", "{}", "1,", "1]", "1}", "\"\n", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
};

static cart_vocab *vocab;
static int32_t n_tokens, eos;
static char *bytes;
static int64_t *offsets;

static void build_vocab(void) {
    int n_pieces = (int)(sizeof PIECES / sizeof PIECES[0]);
    n_tokens = 256 + n_pieces + 2; /* then the end token, then a control token with no bytes */
    eos = n_tokens - 2;
    offsets = calloc((size_t)n_tokens + 1, sizeof *offsets);
    uint8_t *eog = calloc((size_t)n_tokens, 1);
    bytes = malloc(4096);
    int64_t at = 0;
    for (int32_t i = 0; i < n_tokens; i++) {
        offsets[i] = at;
        if (i < 256) {
            bytes[at++] = (char)i;
        } else if (i < 256 + n_pieces) {
            size_t len = strlen(PIECES[i - 256]);
            memcpy(bytes + at, PIECES[i - 256], len);
            at += (int64_t)len;
        }
    }
    offsets[n_tokens] = at;
    eog[eos] = 1;
    FUZZ_CHECK(cart_vocab_from_pieces(&vocab, bytes, offsets, eog, n_tokens) == CART_OK, "vocab: %s",
               cart_last_error());
    free(eog);
}

static int bit(const uint32_t *mask, int32_t i) {
    return (mask[i / 32] >> (i % 32)) & 1u;
}

/* The mask against the brute force, and no dead end. */
static void check_mask(cart_matcher *m, uint32_t *mask, uint32_t *brute, int64_t words) {
    int64_t n = -1;
    FUZZ_CHECK(cart_matcher_mask(m, mask, words, &n) == CART_OK, "mask: %s", cart_last_error());
    memset(brute, 0, (size_t)words * sizeof *brute);
    int64_t count = 0;
    for (int32_t i = 0; i < n_tokens; i++) {
        int64_t len = offsets[i + 1] - offsets[i];
        int ok = i == eos ? cart_matcher_can_end(m) : len > 0 && cart_matcher_try_bytes(m, bytes + offsets[i], len);
        if (ok) brute[i / 32] |= 1u << (i % 32);
        count += bit(mask, i);
        FUZZ_CHECK(bit(mask, i) == ok, "token %d: mask %d, brute force %d, after %lld bytes", i, bit(mask, i), ok,
                   (long long)cart_matcher_bytes(m));
    }
    FUZZ_CHECK(n == count, "mask count %lld, bits %lld", (long long)n, (long long)count);
    if (!cart_matcher_is_done(m)) FUZZ_CHECK(n > 0, "a dead end after %lld bytes", (long long)cart_matcher_bytes(m));
    if (cart_matcher_is_done(m)) FUZZ_CHECK(n <= 1, "%lld tokens allowed after the end", (long long)n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vocab) build_vocab();
    if (size < 1) return 0;
    uint8_t ctl = data[0];
    const char *schema = (const char *)data + 1;
    size_t rest = size - 1, schema_len = 0;
    while (schema_len < rest && schema[schema_len] != 0) schema_len++;
    const char *doc = schema + schema_len + (schema_len < rest);
    size_t doc_len = rest - schema_len - (schema_len < rest);
    if (doc_len > MAX_DOC) doc_len = MAX_DOC;

    cart_grammar *g = NULL;
    if (ctl & 2) {
        FUZZ_CHECK(cart_grammar_any_object(&g) == CART_OK, "json_object: %s", cart_last_error());
    } else {
        cart_clear_error();
        int rc = cart_grammar_from_schema(&g, schema, (int64_t)schema_len, (ctl & 1) ? CART_GRAMMAR_LENIENT : 0);
        if (rc != CART_OK) {
            FUZZ_CHECK_REFUSAL(rc, g);
            return 0;
        }
    }
    int64_t bound = cart_grammar_max_bytes(g);
    FUZZ_CHECK(bound >= -1, "max_bytes %lld", (long long)bound);
    cart_matcher *m = NULL;
    FUZZ_CHECK(cart_matcher_new(&m, g, vocab) == CART_OK, "matcher: %s", cart_last_error());
    int64_t words = cart_vocab_mask_words(vocab);
    uint32_t *mask = calloc((size_t)words, sizeof *mask), *brute = calloc((size_t)words, sizeof *brute);
    int every = 1 + ((ctl >> 2) & 7), checks = 0;

    /* the document, byte by byte */
    int64_t accepted = 0;
    for (size_t i = 0; i < doc_len; i++) {
        if (i % (size_t)every == 0 && checks < MAX_BRUTE) {
            check_mask(m, mask, brute, words);
            checks++;
        }
        int ok = cart_matcher_try_bytes(m, doc + i, 1);
        int rc = cart_matcher_accept_bytes(m, doc + i, 1);
        FUZZ_CHECK(ok == (rc == CART_OK), "byte %zu: try_bytes %d, accept_bytes %d", i, ok, rc);
        if (rc != CART_OK) {
            FUZZ_CHECK(rc == CART_E_ARG && cart_last_error()[0], "refused byte %zu: %d", i, rc);
            FUZZ_CHECK(cart_matcher_bytes(m) == accepted, "a refused byte changed the count");
            break;
        }
        accepted++;
        FUZZ_CHECK(cart_matcher_bytes(m) == accepted, "bytes %lld, accepted %lld", (long long)cart_matcher_bytes(m),
                   (long long)accepted);
        FUZZ_CHECK(bound < 0 || accepted <= bound, "%lld bytes accepted past the bound %lld", (long long)accepted,
                   (long long)bound);
    }
    check_mask(m, mask, brute, words);

    /* then a walk of allowed tokens */
    uint32_t rng = 0x9E3779B9u ^ (uint32_t)(ctl >> 5) ^ (uint32_t)size;
    for (int step = 0; step < WALK && !cart_matcher_is_done(m); step++) {
        int64_t n = 0;
        FUZZ_CHECK(cart_matcher_mask(m, mask, words, &n) == CART_OK, "mask: %s", cart_last_error());
        FUZZ_CHECK(n > 0, "a dead end in the walk after %lld bytes", (long long)cart_matcher_bytes(m));
        rng = rng * 1664525u + 1013904223u;
        int64_t pick = (int64_t)((rng >> 8) % (uint32_t)n);
        int32_t id = -1;
        for (int32_t i = 0; i < n_tokens && id < 0; i++)
            if (bit(mask, i) && pick-- == 0) id = i;
        FUZZ_CHECK(id >= 0, "no token at the picked rank");
        FUZZ_CHECK(cart_matcher_accept(m, id) == CART_OK, "an allowed token %d was refused: %s", id, cart_last_error());
        FUZZ_CHECK(bound < 0 || cart_matcher_bytes(m) <= bound, "the walk went past the bound %lld", (long long)bound);
        if (id == eos) FUZZ_CHECK(cart_matcher_is_done(m), "the end token did not end the document");
    }
    free(mask);
    free(brute);
    cart_matcher_free(m);
    cart_grammar_free(g);
    return 0;
}
