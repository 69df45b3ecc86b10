/*
 * utf8.c - UTF-8 validation and safe cut points (see utf8.h).
 *
 * Well-formed means RFC 3629 / Unicode Table 3-7: a lead byte C2..F4 and
 * continuation bytes 80..BF, with the second byte narrowed after E0 (A0..BF,
 * no overlong), ED (80..9F, no surrogates), F0 (90..BF, no overlong) and F4
 * (80..8F, nothing above U+10FFFF).
 */
#include "utf8.h"

/* The length a lead byte announces (0 for a byte that never starts a
 * well-formed sequence: a continuation byte, C0, C1, F5..FF). */
static int lead_length(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* Whether c may follow the lead byte `lead` as the sequence's second byte. */
static int second_ok(uint8_t lead, uint8_t c) {
    switch (lead) {
    case 0xE0:
        return c >= 0xA0 && c <= 0xBF;
    case 0xED:
        return c >= 0x80 && c <= 0x9F;
    case 0xF0:
        return c >= 0x90 && c <= 0xBF;
    case 0xF4:
        return c >= 0x80 && c <= 0x8F;
    default:
        return c >= 0x80 && c <= 0xBF;
    }
}

/* The number of bytes at s[0..avail) that continue a sequence led by s[0]
 * correctly, at most its length - 1. */
static int valid_tail(const uint8_t *s, int64_t avail, int len) {
    int k = 0;
    for (int i = 1; i < len && i < avail; i++) {
        int ok = i == 1 ? second_ok(s[0], s[1]) : (s[i] >= 0x80 && s[i] <= 0xBF);
        if (!ok) break;
        k++;
    }
    return k;
}

/* The offset reported for an ill-formed sequence is that of its first byte
 * (the lead byte of a truncated or broken sequence, or the stray byte), as
 * Python's UnicodeDecodeError.start gives it. */
int64_t cart_utf8_invalid_offset(const char *s, int64_t len) {
    const uint8_t *p = (const uint8_t *)s;
    int64_t i = 0;
    if (!s || len <= 0) return -1;
    while (i < len) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int n = lead_length(p[i]);
        if (n == 0 || valid_tail(p + i, len - i, n) != n - 1) return i;
        i += n;
    }
    return -1;
}

int64_t cart_utf8_complete_prefix(const char *s, int64_t len) {
    const uint8_t *p = (const uint8_t *)s;
    if (!s || len <= 0) return 0;
    /* Only the last sequence can be incomplete: find its lead byte among the
     * last four bytes (a lead followed by at most three continuation bytes). */
    int64_t start = len - 1;
    while (start > 0 && start > len - 4 && (p[start] & 0xC0) == 0x80) start--;
    int n = lead_length(p[start]);
    if (n <= 1) return len; /* ASCII, or a byte that never completes */
    int64_t have = len - start;
    if (have >= n) return len; /* complete (or broken: not held back) */
    if (valid_tail(p + start, have, n) != have - 1) return len; /* can never complete */
    return start;
}

int64_t cart_utf8_sanitize(const char *s, int64_t len, char *out) {
    const uint8_t *p = (const uint8_t *)s;
    int64_t i = 0, o = 0;
    if (!s || len <= 0) return 0;
    while (i < len) {
        int n = p[i] < 0x80 ? 1 : lead_length(p[i]);
        int ok = n > 0 ? valid_tail(p + i, len - i, n) : 0;
        if (n > 0 && ok == n - 1) {
            for (int k = 0; k < n; k++) out[o++] = (char)p[i + k];
            i += n;
            continue;
        }
        /* a maximal subpart: the lead byte and the continuation bytes that
         * fit it so far (at least one byte), replaced by one U+FFFD */
        i += n > 0 ? 1 + ok : 1;
        out[o++] = (char)0xEF;
        out[o++] = (char)0xBF;
        out[o++] = (char)0xBD;
    }
    return o;
}
