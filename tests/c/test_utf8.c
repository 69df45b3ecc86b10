/*
 * test_utf8.c - UTF-8 validation and the safe cut points of streamed text.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "utf8.h"

static int64_t invalid_at(const char *s, int64_t n) {
    return cart_utf8_invalid_offset(s, n);
}

#define S(lit) (lit), (int64_t)(sizeof(lit) - 1)

static void test_accepts_well_formed_utf8(void) {
    CHECK(invalid_at(S("")) == -1);
    CHECK(invalid_at(NULL, 0) == -1);
    CHECK(invalid_at(S("hello, world")) == -1);
    CHECK(invalid_at(S("a\0b")) == -1);                     /* NUL is a character */
    CHECK(invalid_at(S("caf\xc3\xa9")) == -1);              /* U+00E9 */
    CHECK(invalid_at(S("\xe2\x82\xac")) == -1);             /* U+20AC */
    CHECK(invalid_at(S("\xef\xbf\xbf")) == -1);             /* U+FFFF */
    CHECK(invalid_at(S("\xf0\x9f\x98\x80")) == -1);         /* U+1F600 */
    CHECK(invalid_at(S("\xf4\x8f\xbf\xbf")) == -1);         /* U+10FFFF, the last one */
    CHECK(invalid_at(S("\xe0\xa0\x80\xed\x9f\xbf")) == -1); /* U+0800, U+D7FF */
}

static void test_reports_the_first_ill_formed_sequence(void) {
    CHECK(invalid_at(S("a\x80")) == 1);            /* stray continuation byte */
    CHECK(invalid_at(S("\xc0\xaf")) == 0);         /* overlong '/' */
    CHECK(invalid_at(S("\xc1\xbf")) == 0);         /* overlong */
    CHECK(invalid_at(S("\xe0\x80\xaf")) == 0);     /* overlong 3-byte */
    CHECK(invalid_at(S("\xf0\x80\x80\xaf")) == 0); /* overlong 4-byte */
    CHECK(invalid_at(S("ok\xed\xa0\x80")) == 2);   /* surrogate U+D800 */
    CHECK(invalid_at(S("\xf4\x90\x80\x80")) == 0); /* above U+10FFFF */
    CHECK(invalid_at(S("\xf5\x80\x80\x80")) == 0);
    CHECK(invalid_at(S("ab\xe2\x82")) == 2); /* truncated at the end */
    CHECK(invalid_at(S("\xc3(")) == 0);      /* lead byte, then ASCII */
    CHECK(invalid_at(S("x\xe2\x28\xa1")) == 1);
    CHECK(invalid_at(S("\xff")) == 0);
    CHECK(invalid_at(S("\xc3\xa9\xc3")) == 2);
}

static int64_t prefix(const char *s, int64_t n) {
    return cart_utf8_complete_prefix(s, n);
}

static void test_holds_back_only_incomplete_characters(void) {
    CHECK(prefix(S("")) == 0);
    CHECK(prefix(NULL, 0) == 0);
    CHECK(prefix(S("abc")) == 3);
    CHECK(prefix(S("a\xc3")) == 1);
    CHECK(prefix(S("a\xc3\xa9")) == 3);
    CHECK(prefix(S("\xe2\x82")) == 0);
    CHECK(prefix(S("x\xe2")) == 1);
    CHECK(prefix(S("\xf0\x9f\x98")) == 0);
    CHECK(prefix(S("\xf0\x9f\x98\x80")) == 4);
    CHECK(prefix(S("\xf0\x9f\x98\x80\xf0")) == 4);
    /* bytes that can never complete are let through */
    CHECK(prefix(S("a\xff")) == 2);
    CHECK(prefix(S("a\x80")) == 2);
    CHECK(prefix(S("\xc0")) == 1);
    CHECK(prefix(S("\xe0\x80")) == 2); /* E0 needs A0..BF next */
    CHECK(prefix(S("\xed\xa0")) == 2); /* would be a surrogate */
    CHECK(prefix(S("\xf4\x90")) == 2); /* would pass U+10FFFF */
    CHECK(prefix(S("\xc3\xa9\xa9")) == 3);
    CHECK(prefix(S("\x80\x80\x80\x80")) == 4);
}

static void test_streams_every_split_without_cutting_characters(void) {
    /* Feed a mixed text one byte at a time, printing what complete_prefix
     * allows: the output is the input and every chunk is well-formed. */
    static const char text[] = "Grüße, 世界! \xf0\x9f\x99\x82 ok \xf0\x9f\x87\xaf\xf0\x9f\x87\xb5.";
    int64_t n = (int64_t)sizeof text - 1;
    char pending[16], out[sizeof text];
    int64_t held = 0, written = 0, bad_chunks = 0;
    for (int64_t i = 0; i < n; i++) {
        pending[held++] = text[i];
        int64_t k = cart_utf8_complete_prefix(pending, held);
        if (cart_utf8_invalid_offset(pending, k) != -1) bad_chunks++;
        memcpy(out + written, pending, (size_t)k);
        written += k;
        memmove(pending, pending + k, (size_t)(held - k));
        held -= k;
    }
    CHECK(held == 0 && written == n && memcmp(out, text, (size_t)n) == 0);
    CHECK_MAXDIFF("ill-formed chunks", (double)bad_chunks, 0);
}

/* Ill-formed parts become one U+FFFD per maximal subpart (the Unicode 3.9
 * example and friends), and the result is always well-formed. */
static void test_replaces_ill_formed_parts_with_u_fffd(void) {
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"plain", "plain"},
        {"caf\xc3\xa9", "caf\xc3\xa9"},
        {"a\xff" "b", "a\xef\xbf\xbd" "b"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                 /* overlong lead: two subparts */
        {"\xe0\x80\xaf", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* E0 80: second byte out of range */
        {"\xe2\x82", "\xef\xbf\xbd"},                              /* truncated at the end: one */
        {"\xe2\x82x", "\xef\xbf\xbdx"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* a surrogate */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf0\x9f\x98\x80\x80", "\xf0\x9f\x98\x80\xef\xbf\xbd"},
    };
    char out[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t n = (int64_t)strlen(cases[i].in);
        int64_t k = cart_utf8_sanitize(cases[i].in, n, out);
        CHECK_MSG(k == (int64_t)strlen(cases[i].out) && memcmp(out, cases[i].out, (size_t)k) == 0,
                  "case %zu: %lld bytes", i, (long long)k);
        CHECK(cart_utf8_invalid_offset(out, k) == -1);
    }
    /* every byte string of length 3 comes out well-formed */
    int bad = 0;
    for (int a = 0; a < 256; a += 3)
        for (int b = 0; b < 256; b += 5)
            for (int c = 0; c < 256; c += 7) {
                char in[3] = {(char)a, (char)b, (char)c};
                int64_t k = cart_utf8_sanitize(in, 3, out);
                bad += cart_utf8_invalid_offset(out, k) != -1;
            }
    CHECK_MSG(bad == 0, "%d outputs ill-formed", bad);
    printf("  %zu cases and %d byte triples: every output well-formed\n", sizeof cases / sizeof cases[0],
           86 * 52 * 37);
}

int main(void) {
    RUN(test_accepts_well_formed_utf8);
    RUN(test_reports_the_first_ill_formed_sequence);
    RUN(test_holds_back_only_incomplete_characters);
    RUN(test_streams_every_split_without_cutting_characters);
    RUN(test_replaces_ill_formed_parts_with_u_fffd);
    return check_finish("utf8");
}
