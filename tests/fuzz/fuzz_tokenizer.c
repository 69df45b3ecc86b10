/*
 * fuzz_tokenizer.c - libFuzzer target for tokenizer encode/decode
 * (engine/tokenizer.h) on three vocabularies:
 *
 *   SentencePiece  stories260K ($CART_FUZZ_SPM_MODEL, default
 *                  <source>/../shared/models/stories260K.gguf)
 *   byte-level BPE the real Qwen3 tokenizer ($CART_FUZZ_MODEL, default
 *                  <source>/../shared/reference/qwen3-tiny-realvocab-f16.gguf)
 *   gemma 4's BPE  tokenizer.ggml.model "gemma4" ($CART_FUZZ_GEMMA4_MODEL,
 *                  default <source>/models/gemma4/tiny-dense-gemma4vocab-f32.gguf,
 *                  which the main build writes)
 *
 * A vocabulary whose file is absent is left out with a message; when all
 * are absent the target says so and exits 0 (nothing to fuzz).
 *
 * Input: byte 0 picks the tokenizer (bit 0, plus 2 for bit 5, modulo the
 * vocabularies found) and the encode flags (bit 1 PARSE_SPECIAL, bit 2
 * ADD_SPECIAL); bit 7 asks for the short-buffer check; bit 6 for the
 * plain-range checks (check_plain); bits 3-4 are the
 * decode flags of the id sequence below. The rest is the text. Per input:
 *   - encode, and check every id is in the vocabulary (with bit 7: that a
 *     buffer of half the size gets the same count and a prefix of the ids);
 *   - the round trip decode(encode(s)) where the rules below say it must
 *     give s back (abort() otherwise: a finding);
 *   - decode and piece on ids made of the input bytes (any id sequence must
 *     decode without error).
 *
 * When the round trip must hold (decode with UNPARSE_SPECIAL, so control
 * tokens come back as their text):
 *   BPE  s is well-formed UTF-8. Byte-level BPE maps every byte to a token,
 *        and special texts matched with PARSE_SPECIAL render back as the same
 *        text, so nothing else is needed. Ill-formed UTF-8 is not kept:
 *        the pre-tokenizer reads code points and turns each broken sequence
 *        into U+FFFD, as llama.cpp does. BOS/EOS added by ADD_SPECIAL are
 *        taken off again with REMOVE_SPECIAL.
 *   SPM  s is well-formed UTF-8, holds no U+2581 (SentencePiece's space
 *        symbol, which decodes to ' '), the encode did not parse special
 *        texts and matched no USER_DEFINED text (each special fragment makes
 *        the next text fragment start with a space again), and the
 *        vocabulary has a "▁" token and a byte token for every byte. Then
 *        encode puts one space in front, and decode takes it off the first
 *        piece. With ADD_SPECIAL the leading BOS is removed by REMOVE_SPECIAL,
 *        and llama.cpp then keeps the space: the result is " " + s (or "" for
 *        an empty s), which is checked as such. Ill-formed UTF-8 is not
 *        kept: a broken lead byte swallows the start of a following "▁",
 *        whose bytes then come back raw.
 *   gemma4 s is well-formed UTF-8, holds no U+2581 (the escaped space, which
 *        decodes to ' ') and no ' ' before one of ?!.,' (the clean_spaces
 *        passes of detokenize would drop it), and the vocabulary has a byte
 *        token for every byte. Spaces become U+2581 and come back; BOS added
 *        by ADD_SPECIAL is taken off by REMOVE_SPECIAL; no space is put in
 *        front.
 */
#include <string.h>

#include "common.h"
#include "gguf.h"
#include "tokenizer.h"
#include "utf8.h"
#include "fuzz_common.h"

enum { MAX_IDS = 1 << 14, MAX_TEXT = 1 << 16 };

typedef struct vocab {
    const char *name;
    cart_tokenizer *t;
    int64_t n_vocab;
    int spm_round_trip_ok; /* SPM: "▁" and every byte token exist */
    int gemma4;            /* gemma 4's BPE */
    int bytes_ok;          /* gemma4: every <0xNN> token exists */
} vocab;

static vocab vocabs[3];
static int n_vocabs;
static int32_t ids[MAX_IDS], ids2[MAX_IDS];
static char text[MAX_TEXT];

/* Whether t has the <0xNN> token of every byte. */
static int has_byte_tokens(const cart_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        if (cart_tokenizer_find(t, name, 6) < 0) return 0;
    }
    return 1;
}

static void load_vocab(const char *env, const char *fallback, const char *what, int gemma4) {
    const char *path = fuzz_env_or(env, fallback);
    cart_gguf *g = NULL;
    if (cart_gguf_open(&g, path) != CART_OK) {
        fprintf(stderr, "fuzz_tokenizer: skipping the %s vocabulary: %s (set %s to its GGUF)\n", what,
                cart_last_error(), env);
        return;
    }
    vocab *v = &vocabs[n_vocabs];
    int rc = cart_tokenizer_load(&v->t, g);
    cart_gguf_close(g);
    FUZZ_CHECK(rc == CART_OK, "%s: %s", path, cart_last_error());
    v->name = what;
    v->n_vocab = cart_tokenizer_vocab_size(v->t);
    v->gemma4 = gemma4;
    if (gemma4) {
        v->bytes_ok = has_byte_tokens(v->t);
        if (!v->bytes_ok)
            fprintf(stderr, "fuzz_tokenizer: %s lacks a byte token; its round trip is not checked\n",
                    path);
    } else if (cart_tokenizer_kind_of(v->t) == CART_TOKENIZER_SPM) {
        int ok = cart_tokenizer_find(v->t, "\xe2\x96\x81", 3) >= 0 && has_byte_tokens(v->t);
        v->spm_round_trip_ok = ok;
        if (!ok)
            fprintf(stderr, "fuzz_tokenizer: %s lacks '\xe2\x96\x81' or a byte token; its round "
                            "trip is not checked\n", path);
    }
    fprintf(stderr, "fuzz_tokenizer: %s vocabulary: %s (%lld tokens)\n", what, path,
            (long long)v->n_vocab);
    n_vocabs++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    load_vocab("CART_FUZZ_SPM_MODEL", CART_SOURCE_DIR "/../shared/models/stories260K.gguf",
               "SentencePiece (stories260K)", 0);
    load_vocab("CART_FUZZ_MODEL",
               CART_SOURCE_DIR "/../shared/reference/qwen3-tiny-realvocab-f16.gguf",
               "byte-level BPE (Qwen3)", 0);
    load_vocab("CART_FUZZ_GEMMA4_MODEL",
               CART_SOURCE_DIR "/models/gemma4/tiny-dense-gemma4vocab-f32.gguf",
               "gemma 4's BPE (tiny-dense-gemma4vocab)", 1);
    if (n_vocabs == 0) {
        fprintf(stderr, "fuzz_tokenizer: SKIP: no vocabulary file found (set CART_FUZZ_MODEL, "
                        "CART_FUZZ_SPM_MODEL and/or CART_FUZZ_GEMMA4_MODEL); nothing to fuzz\n");
        exit(0);
    }
    return 0;
}

static int has_user_defined(const cart_tokenizer *t, const int32_t *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (cart_tokenizer_token_type(t, p[i]) == CART_TOKEN_USER_DEFINED) return 1;
    return 0;
}

/* What decode(encode(s)) must give, into *want / *want_len; 0 when the rules
 * above promise nothing for this input. */
static int expected_round_trip(const vocab *v, const char *s, int64_t len, int32_t flags,
                               const int32_t *p, int64_t n, const char **want, int64_t *want_len) {
    const cart_tokenizer *t = v->t;
    if (cart_utf8_invalid_offset(s, len) >= 0) return 0;
    *want = s;
    *want_len = len;
    if (v->gemma4) {
        if (!v->bytes_ok || memmem(s, (size_t)len, "\xe2\x96\x81", 3)) return 0;
        for (int64_t i = 0; i + 1 < len; i++)
            if (s[i] == ' ' && strchr("?!.,'", s[i + 1]) && s[i + 1] != '\0') return 0;
        return 1;
    }
    if (cart_tokenizer_kind_of(t) == CART_TOKENIZER_BPE) return 1;
    if (!v->spm_round_trip_ok || (flags & CART_TOKENIZE_PARSE_SPECIAL)) return 0;
    if (memmem(s, (size_t)len, "\xe2\x96\x81", 3) || has_user_defined(t, p, n)) return 0;
    if ((flags & CART_TOKENIZE_ADD_SPECIAL) && cart_tokenizer_adds_bos(t) && len > 0) {
        static char spaced[MAX_TEXT + 1];
        spaced[0] = ' ';
        memcpy(spaced + 1, s, (size_t)len);
        *want = spaced;
        *want_len = len + 1;
    }
    return 1;
}

static void check_encode(const vocab *v, const char *s, int64_t len, int32_t flags, int short_buffer) {
    const cart_tokenizer *t = v->t;
    int64_t n = 0, n2 = 0, m = 0;
    int rc = cart_tokenizer_encode(t, s, len, flags, ids, MAX_IDS, &n);
    FUZZ_CHECK(rc == CART_OK, "%s: encode of %lld bytes: %s", v->name, (long long)len,
               cart_last_error());
    if (n > MAX_IDS) return; /* cannot happen at this max_len; nothing to compare */
    for (int64_t i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < v->n_vocab, "%s: id %d at %lld", v->name, (int)ids[i],
                   (long long)i);
    if (short_buffer) { /* the full count, the first ids */
        int64_t cap = n / 2;
        rc = cart_tokenizer_encode(t, s, len, flags, ids2, cap, &n2);
        FUZZ_CHECK(rc == CART_OK && n2 == n, "%s: encode with cap %lld counted %lld, not %lld",
                   v->name, (long long)cap, (long long)n2, (long long)n);
        FUZZ_CHECK(memcmp(ids, ids2, (size_t)cap * sizeof ids[0]) == 0, "%s: capped encode differs",
                   v->name);
    }

    int32_t dflags = CART_TOKENIZE_UNPARSE_SPECIAL;
    if (flags & CART_TOKENIZE_ADD_SPECIAL) dflags |= CART_TOKENIZE_REMOVE_SPECIAL;
    rc = cart_tokenizer_decode(t, ids, n, dflags, text, MAX_TEXT, &m);
    FUZZ_CHECK(rc == CART_OK, "%s: decode: %s", v->name, cart_last_error());
    const char *want = NULL;
    int64_t want_len = 0;
    if (!expected_round_trip(v, s, len, flags, ids, n, &want, &want_len)) return;
    if (m != want_len || memcmp(text, want, (size_t)m) != 0) {
        fprintf(stderr, "\nfuzz_tokenizer: %s round trip broken (encode flags %d): %lld bytes in, "
                        "%lld ids, %lld bytes back (expected %lld)\n  ids:",
                v->name, (int)flags, (long long)len, (long long)n, (long long)m, (long long)want_len);
        for (int64_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", (int)ids[i]);
        fprintf(stderr, "\n  back: '%.*s'\n", (int)(m < 400 ? m : 400), text);
        abort();
    }
}

/* cart_tokenizer_encode_plain: with the whole text one plain range it gives
 * the ids of an encode without PARSE_SPECIAL; with ranges cut from the text
 * (every other run of 1-8 bytes, lengths from the text's bytes) every id is
 * in the vocabulary; ranges out of order or past the end are refused with
 * CART_E_ARG. */
static void check_plain(const vocab *v, const char *s, int64_t len, int32_t flags) {
    const cart_tokenizer *t = v->t;
    int64_t n = 0, n2 = 0;
    int64_t whole[2] = {0, len};
    int rc = cart_tokenizer_encode_plain(t, s, len, flags | CART_TOKENIZE_PARSE_SPECIAL, whole, 1, ids, MAX_IDS, &n);
    FUZZ_CHECK(rc == CART_OK, "%s: encode_plain of %lld bytes: %s", v->name, (long long)len, cart_last_error());
    rc = cart_tokenizer_encode(t, s, len, flags & ~CART_TOKENIZE_PARSE_SPECIAL, ids2, MAX_IDS, &n2);
    FUZZ_CHECK(rc == CART_OK && n == n2 && (n > MAX_IDS || memcmp(ids, ids2, (size_t)n * sizeof ids[0]) == 0),
               "%s: one plain range over all %lld bytes is not an encode without special parsing", v->name,
               (long long)len);
    int64_t ranges[2 * 64], nr = 0, at = 0;
    for (int k = 0; at < len && nr < 64; k++) {
        const int64_t step = 1 + ((const uint8_t *)s)[at] % 8;
        const int64_t end = at + step < len ? at + step : len;
        if (k % 2) {
            ranges[2 * nr] = at;
            ranges[2 * nr + 1] = end;
            nr++;
        }
        at = end;
    }
    rc = cart_tokenizer_encode_plain(t, s, len, flags | CART_TOKENIZE_PARSE_SPECIAL, ranges, nr, ids, MAX_IDS, &n);
    FUZZ_CHECK(rc == CART_OK, "%s: encode_plain with %lld ranges: %s", v->name, (long long)nr, cart_last_error());
    for (int64_t i = 0; i < n && i < MAX_IDS; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < v->n_vocab, "%s: plain id %d at %lld", v->name, (int)ids[i], (long long)i);
    int64_t bad[4] = {0, len + 1, 0, 0};
    FUZZ_CHECK(cart_tokenizer_encode_plain(t, s, len, flags, bad, 1, ids, MAX_IDS, &n) == CART_E_ARG,
               "%s: a range past the end was taken", v->name);
    if (nr >= 2) {
        bad[0] = ranges[2], bad[1] = ranges[3], bad[2] = ranges[0], bad[3] = ranges[1];
        FUZZ_CHECK(cart_tokenizer_encode_plain(t, s, len, flags, bad, 2, ids, MAX_IDS, &n) == CART_E_ARG,
                   "%s: ranges out of order were taken", v->name);
    }
}

/* Any ids decode, and each piece is what decode gives for it alone (up to
 * the SentencePiece leading-space strip, so pieces are only run). */
static void check_decode_ids(const vocab *v, const uint8_t *p, size_t len, int32_t flags) {
    int64_t n = 0, m = 0;
    for (size_t i = 0; i + 3 <= len && n < 256; i += 3)
        ids[n++] = (int32_t)(((uint32_t)p[i] | (uint32_t)p[i + 1] << 8 | (uint32_t)p[i + 2] << 16) %
                             (uint32_t)v->n_vocab);
    int32_t dflags = (flags & 1 ? CART_TOKENIZE_UNPARSE_SPECIAL : 0) |
                     (flags & 2 ? CART_TOKENIZE_REMOVE_SPECIAL : 0);
    int rc = cart_tokenizer_decode(v->t, ids, n, dflags, text, MAX_TEXT, &m);
    FUZZ_CHECK(rc == CART_OK, "%s: decode of %lld ids: %s", v->name, (long long)n, cart_last_error());
    for (int64_t i = 0; i < n && i < 16; i++) {
        rc = cart_tokenizer_piece(v->t, ids[i], dflags, text, MAX_TEXT, &m);
        FUZZ_CHECK(rc == CART_OK, "%s: piece %d: %s", v->name, (int)ids[i], cart_last_error());
    }
    FUZZ_CHECK(cart_tokenizer_piece(v->t, (int32_t)v->n_vocab, 0, text, MAX_TEXT, &m) == CART_E_ARG,
               "%s: piece of an id outside the vocabulary", v->name);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const vocab *v = &vocabs[((data[0] & 1) | ((data[0] >> 4) & 2)) % n_vocabs];
    int32_t flags = (data[0] >> 1) & (CART_TOKENIZE_PARSE_SPECIAL | CART_TOKENIZE_ADD_SPECIAL);
    const char *s = (const char *)data + 1;
    int64_t len = (int64_t)size - 1;
    if (len > MAX_TEXT - 1) return 0;
    check_encode(v, s, len, flags, data[0] & 0x80);
    if (data[0] & 0x40) check_plain(v, s, len, flags);
    check_decode_ids(v, data + 1, size - 1, (data[0] >> 3) & 3);
    return 0;
}
